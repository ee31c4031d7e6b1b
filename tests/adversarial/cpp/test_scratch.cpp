// Memory and time proportional to what a call uses (issue 17, items 7 and 8): the forward's
// workspace and the scratch both backends allocate do not grow with expert_num (the counts and the
// drop-pad slots come from the sorted pairs; it was 8 bytes per expert, 16 GiB for a 4 x 8 input
// with expert_num 2^31 - 1); a call whose outputs are empty costs nothing however many drop-pad
// slots it has (hidden 0 with 2^31 - 1 slots took seconds, and the reference backend allocated 8
// bytes per slot); an allocation that fails is a runtime error, never an exception out of the
// C++ API. The CPU kernels are also checked against the reference with their work cut into many
// pieces run in reverse order, so that the per-piece cursors over the sorted pairs start inside
// an expert's run. Its own executable: it replaces the global operator new to measure the peak
// of the bytes allocated during a call and to refuse any allocation above a limit (so that a
// regression fails its test, not the machine). docs/reliability.md cites these tests.
#include <malloc.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "moe_routing/moe_routing.hpp"
#include "routing_cases.h"

namespace {
std::atomic<int64_t> live_bytes{0}, peak_bytes{0};
std::atomic<size_t> allocation_limit{~size_t(0)};

void* counted_allocation(std::size_t size) {
  if (size > allocation_limit.load()) throw std::bad_alloc();
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  const int64_t now =
      live_bytes.fetch_add(int64_t(malloc_usable_size(p))) + int64_t(malloc_usable_size(p));
  int64_t peak = peak_bytes.load();
  while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
  }
  return p;
}

void counted_free(void* p) {
  if (p == nullptr) return;
  live_bytes.fetch_sub(int64_t(malloc_usable_size(p)));
  std::free(p);
}
}  // namespace

void* operator new(std::size_t size) { return counted_allocation(size); }
void* operator new[](std::size_t size) { return counted_allocation(size); }
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }
// The nothrow forms too (std::stable_sort's buffer uses them): each allocation must be freed by
// the allocator that made it.
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return counted_allocation(size);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, const std::nothrow_t& tag) noexcept {
  return operator new(size, tag);
}
void operator delete(void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { counted_free(p); }

namespace moe_routing::testing {
namespace {

constexpr int64_t kMiB = int64_t(1) << 20;
constexpr int64_t kInt32Max = 2147483647;

/// While it exists, no single allocation may exceed `limit` bytes (std::bad_alloc instead), and
/// peak() is the most bytes allocated at once beyond those live when it was made.
class AllocationScope {
 public:
  explicit AllocationScope(size_t limit = size_t(256) << 20) : base_(live_bytes.load()) {
    peak_bytes.store(base_);
    allocation_limit.store(limit);
  }
  ~AllocationScope() { allocation_limit.store(~size_t(0)); }
  int64_t peak() const { return peak_bytes.load() - base_; }

 private:
  int64_t base_;
};

/// The wall time of fn() in seconds.
template <class Fn>
double seconds(Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

const Runner kReference{Backend::reference, CpuIsa::automatic, 1};
const Runner kCpu{Backend::cpu, CpuIsa::automatic, 1};

// --- item 7: the workspace and the scratch -----------------------------------------------------

TEST(AdversarialScratch, TheWorkspaceDoesNotGrowWithExpertNum) {
  Tensor x(DType::float32, {4, 8});
  Tensor idx(DType::int32, {4, 8});
  auto v2_workspace = [&](MoeInitRoutingV2Attrs attrs) {
    MoeInitRoutingV2Plan plan;
    const Status s = infer_moe_init_routing_v2(x.view(), idx.view(), attrs, &plan);
    EXPECT_TRUE(s.is_ok()) << s.message();
    return std::max(moe_init_routing_v2_workspace_size(plan, 1),
                    moe_init_routing_v2_workspace_size(plan, 8));
  };
  auto routing_workspace = [&](MoeInitRoutingAttrs attrs) {
    MoeInitRoutingPlan plan;
    const Status s = infer_moe_init_routing(x.view(), idx.view(), TensorView(), TensorView(),
                                            TensorView(), attrs, &plan);
    EXPECT_TRUE(s.is_ok()) << s.message();
    return std::max(moe_init_routing_workspace_size(plan, 1),
                    moe_init_routing_workspace_size(plan, 8));
  };
  for (int64_t flag : {1, 2}) {  // the case: counts of 2^31 - 1 experts
    MoeInitRoutingV2Attrs attrs;
    attrs.expert_num = kInt32Max;
    attrs.expert_tokens_count_or_cumsum_flag = flag;
    EXPECT_LT(v2_workspace(attrs), uint64_t(kMiB)) << "flag " << flag;
  }
  MoeInitRoutingV2Attrs drop_pad;
  drop_pad.drop_pad_mode = 1;
  drop_pad.expert_num = kInt32Max;
  drop_pad.expert_capacity = 1;
  drop_pad.expert_tokens_before_capacity_flag = true;
  EXPECT_LT(v2_workspace(drop_pad), uint64_t(kMiB));
  for (int64_t type : {0, 1, 2}) {
    MoeInitRoutingAttrs attrs;
    attrs.expert_num = kInt32Max;
    attrs.expert_tokens_num_flag = true;
    attrs.expert_tokens_num_type = type;
    EXPECT_LT(routing_workspace(attrs), uint64_t(kMiB)) << "type " << type;
  }
  MoeInitRoutingAttrs routing_drop_pad;
  routing_drop_pad.drop_pad_mode = 1;
  routing_drop_pad.expert_num = kInt32Max;
  routing_drop_pad.expert_capacity = 1;
  EXPECT_LT(routing_workspace(routing_drop_pad), uint64_t(kMiB));
}

// Both backends, without a caller workspace: the peak of what they allocate during the call.
TEST(AdversarialScratch, ScratchDoesNotGrowWithExpertNum) {
  // Drop-pad with 2^26 experts of 8 slots and hidden 0: every output but expanded_row_idx [16]
  // is empty (the reference kept 8 bytes per slot: 4 GiB).
  V2Case drop_pad;
  drop_pad.x = Tensor(DType::float32, {16, 0});
  std::vector<int32_t> ids(16);
  for (int32_t i = 0; i < 16; ++i) ids[size_t(i)] = int32_t((i % 3) * 20000000 + (i % 2));
  drop_pad.expert_idx = Tensor::int32s({16, 1}, ids);
  drop_pad.attrs.drop_pad_mode = 1;
  drop_pad.attrs.expert_num = int64_t(1) << 26;
  drop_pad.attrs.expert_capacity = 3;
  // Counts of 2^24 experts: a 64 MiB output, and no scratch per expert.
  V2Case counts;
  counts.x = Tensor(DType::float32, {16, 4});
  std::vector<int32_t> count_ids(16);
  for (int32_t i = 0; i < 16; ++i) count_ids[size_t(i)] = int32_t((i % 3) * 2000000 + (i % 2));
  counts.expert_idx = Tensor::int32s({16, 1}, count_ids);
  counts.attrs.expert_num = int64_t(1) << 24;
  counts.attrs.expert_tokens_count_or_cumsum_flag = 1;
  for (V2Case* c : {&drop_pad, &counts})
    for (const Runner& runner : {kReference, kCpu}) {
      V2Result r;
      ASSERT_TRUE(plan_outputs(*c, &r)) << r.status.message();
      int64_t peak;
      {
        AllocationScope scope;
        r.status = moe_init_routing_v2(c->x.view(), c->expert_idx.view(), c->attrs,
                                       r.expanded_x.view(), r.expanded_row_idx.view(),
                                       r.counts.view(), r.before_capacity.view(), runner.config());
        peak = scope.peak();
      }
      ASSERT_TRUE(r.status.is_ok()) << runner.name() << ": " << r.status.message();
      EXPECT_LT(peak, kMiB) << runner.name() << " allocated " << peak << " bytes at once";
      if (c == &drop_pad) {
        // Expert e takes slots e*3 ...: ids 20000000k + (i % 2), each expert's pairs in order.
        std::vector<int32_t> slot_count(6, 0), expected(16);
        for (size_t i = 0; i < 16; ++i) {
          const int64_t e = ids[i];
          int32_t& c_of_e = slot_count[size_t((i % 3) * 2 + (i % 2))];
          expected[i] = c_of_e < 3 ? int32_t(e * 3 + c_of_e) : -1;
          ++c_of_e;
        }
        EXPECT_EQ(r.expanded_row_idx.values<int32_t>(), expected) << runner.name();
      } else {
        const std::vector<int32_t> cumsum = r.counts.values<int32_t>();
        // Ids 0 and 1 (i % 3 == 0) have 3 pairs each, 2000000 and 2000001 have 2 and 3,
        // 4000000 and 4000001 have 3 and 2.
        EXPECT_EQ(cumsum[0], 3);
        EXPECT_EQ(cumsum[1], 6);
        EXPECT_EQ(cumsum[1999999], 6);
        EXPECT_EQ(cumsum[2000000], 8);
        EXPECT_EQ(cumsum[2000001], 11);
        EXPECT_EQ(cumsum[4000000], 14);
        EXPECT_EQ(cumsum[4000001], 16);
        EXPECT_EQ(cumsum.back(), 16);
      }
    }
}

// --- item 8: empty outputs cost nothing --------------------------------------------------------

TEST(AdversarialEmptyOutputs, DropPadSlotsOfHiddenZeroCostNothing) {
  struct Case {
    const char* name;
    int64_t rows, experts, capacity;
  };
  const Case cases[] = {
      {"no rows, one expert of 2^31 - 1 slots", 0, 1, kInt32Max},
      {"no rows, 3 experts of 715827882 slots", 0, 3, 715827882},
      {"5 rows, 429496729 experts of 5 slots", 5, 429496729, 5},
  };
  for (const Case& c : cases)
    for (const Runner& runner : {kReference, kCpu}) {
      SCOPED_TRACE(std::string(c.name) + ", " + runner.name());
      Tensor x(DType::float32, {c.rows, 0});
      Tensor idx = Tensor::int32s({c.rows, 2}, std::vector<int32_t>(size_t(c.rows * 2), 1));
      Tensor expanded_x(DType::float32, {c.experts, c.capacity, 0});
      Tensor row_idx(DType::int32, {c.rows * 2});
      MoeInitRoutingV2Attrs v2;
      v2.drop_pad_mode = 1;
      v2.expert_num = c.experts;
      v2.expert_capacity = c.capacity;
      MoeInitRoutingAttrs routing;
      routing.drop_pad_mode = 1;
      routing.expert_num = c.experts;
      routing.expert_capacity = c.capacity;
      Status s;
      int64_t peak;
      double v2_seconds, routing_seconds;
      {
        AllocationScope scope;
        v2_seconds = seconds([&] {
          s = moe_init_routing_v2(x.view(), idx.view(), v2, expanded_x.view(), row_idx.view(),
                                  TensorView(), TensorView(), runner.config());
        });
        ASSERT_TRUE(s.is_ok()) << s.message();
        routing_seconds = seconds([&] {
          s = moe_init_routing(x.view(), idx.view(), TensorView(), TensorView(), TensorView(),
                               routing, expanded_x.view(), row_idx.view(), TensorView(),
                               TensorView(), TensorView(), runner.config());
        });
        ASSERT_TRUE(s.is_ok()) << s.message();
        peak = scope.peak();
      }
      // Microseconds of work; a second leaves room for any machine's hiccups, while visiting
      // the slots took seconds even in an optimised build.
      EXPECT_LT(v2_seconds, 1.0);
      EXPECT_LT(routing_seconds, 1.0);
      EXPECT_LT(peak, kMiB);
      if (c.rows > 0) {
        const std::vector<int32_t> expected = {5, 6, 7, 8, 9, -1, -1, -1, -1, -1};
        EXPECT_EQ(row_idx.values<int32_t>(), expected);  // expert 1's 5 slots, then full
      }
    }
}

TEST(AdversarialEmptyOutputs, CombineBackwardOfHiddenZeroCostsNothingInAnyLayout) {
  // moe_finalize_routing_grad with H = 0: grad_expanded_x and grad_bias hold no element and
  // every grad_scales is +0, however many rows a drop-pad layout (expert_num * expert_capacity)
  // gives. Both backends built their pair lists over every row first (16 GiB of workspace and
  // 12 s at 2^31 - 1 rows), and the C workspace size grew with the rows.
  struct Case {
    const char* name;
    int64_t experts, capacity;
    bool bias;
  };
  const Case cases[] = {
      {"2^31 - 1 experts of 1 slot", kInt32Max, 1, false},
      {"3 experts of 715827882 slots", 3, 715827882, false},
      {"2^31 - 1 experts of 1 slot, grad_bias", kInt32Max, 1, true},
  };
  const int64_t N = 3, K = 2;
  for (const Case& c : cases)
    for (const Runner& runner : {kReference, kCpu}) {
      SCOPED_TRACE(std::string(c.name) + ", " + runner.name());
      Tensor grad_y(DType::float32, {N, 0});
      // Two pairs in the last slot and the first, the others dropped (-1).
      Tensor row_idx =
          Tensor::int32s({N * K}, {int32_t(c.experts * c.capacity - 1), -1, 0, -1, -1, -1});
      Tensor expanded_x(DType::float32, {c.experts, c.capacity, 0});
      Tensor scales = Tensor::floats(DType::float32, {N, K}, {1, 2, 3, 4, 5, 6});
      Tensor expert_idx = Tensor::int32s({N, K}, {int32_t(c.experts - 1), 0, 0, 0, 0, 0});
      Tensor bias(DType::float32, {c.experts, 0});
      Tensor grad_expanded_x(DType::float32, {c.experts, c.capacity, 0});
      Tensor grad_scales(DType::float32, {N, K});
      Tensor grad_bias(DType::float32, {c.experts, 0});
      grad_scales.poison();
      MoeFinalizeRoutingGradInputs in;
      in.grad_y = grad_y.view();
      in.expanded_row_idx = row_idx.view();
      in.expanded_x = expanded_x.view();
      in.scales = scales.view();
      if (c.bias) in.expert_idx = expert_idx.view(), in.bias = bias.view();
      MoeFinalizeRoutingGradAttrs attrs;
      attrs.drop_pad_mode = 1;
      attrs.expert_num = c.experts;
      attrs.expert_capacity = c.capacity;
      MoeFinalizeRoutingGradOutputs out;
      out.grad_expanded_x = grad_expanded_x.view();
      out.grad_scales = grad_scales.view();
      if (c.bias) out.grad_bias = grad_bias.view();
      MoeFinalizeRoutingGradPlan plan;
      ASSERT_TRUE(infer_moe_finalize_routing_grad(in, attrs, &plan).is_ok());
      EXPECT_EQ(moe_finalize_routing_grad_workspace_size(plan, 1), 0u);
      Status s;
      int64_t peak;
      double elapsed;
      {
        AllocationScope scope;
        elapsed = seconds([&] { s = moe_finalize_routing_grad(in, attrs, out, runner.config()); });
        peak = scope.peak();
      }
      ASSERT_TRUE(s.is_ok()) << s.message();
      EXPECT_LT(elapsed, 1.0);  // microseconds of work, as the dispatch's case above
      EXPECT_LT(peak, kMiB);
      EXPECT_EQ(grad_scales.values<float>(), std::vector<float>(size_t(N * K), 0.0f));
      for (float v : grad_scales.values<float>()) EXPECT_FALSE(std::signbit(v));  // +0
    }
}

// --- allocation failures -----------------------------------------------------------------------

TEST(AdversarialScratch, AnAllocationFailureIsARuntimeErrorAndWritesNothing) {
  // 2^19 pairs: the CPU kernels' scratch (about 12 bytes per pair, 6 MiB) exceeds both the
  // per-thread cache of small scratch and the 1 MiB limit below; so do the reference's arrays.
  const int64_t pairs = int64_t(1) << 19;
  V2Case c;
  c.x = Tensor(DType::float32, {pairs, 1});
  c.expert_idx = Tensor::int32s({pairs, 1}, std::vector<int32_t>(size_t(pairs), 0));
  for (const Runner& runner : {kReference, kCpu}) {
    V2Result r;
    ASSERT_TRUE(plan_outputs(c, &r));
    {
      AllocationScope scope(size_t(1) << 20);
      r.status = moe_init_routing_v2(c.x.view(), c.expert_idx.view(), c.attrs, r.expanded_x.view(),
                                     r.expanded_row_idx.view(), TensorView(), TensorView(),
                                     runner.config());
    }
    EXPECT_EQ(r.status.code(), StatusCode::runtime) << runner.name();
    EXPECT_EQ(r.status.message(),
              "moe_init_routing_v2: memory must be allocatable, got an allocation failure")
        << runner.name();
    for (uint8_t b : r.expanded_row_idx.bytes) ASSERT_EQ(b, 0x5A) << runner.name();
  }
  // The backward's reference keeps top_k addends per output element.
  const int64_t top_k = int64_t(1) << 19;
  Tensor g(DType::float32, {top_k, 1});
  std::vector<int32_t> order(static_cast<size_t>(top_k));
  for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
  Tensor idx = Tensor::int32s({top_k}, order);
  Tensor grad_x(DType::float32, {1, 1});
  grad_x.poison();
  MoeInitRoutingGradAttrs attrs;
  attrs.top_k = top_k;
  Status s;
  {
    AllocationScope scope(size_t(1) << 20);
    s = moe_init_routing_grad(g.view(), idx.view(), attrs, grad_x.view(), kReference.config());
  }
  EXPECT_EQ(s.code(), StatusCode::runtime);
  EXPECT_EQ(s.message(),
            "moe_init_routing_grad: memory must be allocatable, got an allocation "
            "failure");
  for (uint8_t b : grad_x.bytes) EXPECT_EQ(b, 0x5A);
}

// --- the cursors of the CPU kernels, cut into many pieces --------------------------------------

/// A host loop that cuts [0, n) into max_pieces pieces and runs them last to first.
void reversed_pieces(int64_t n, int max_pieces, void (*task)(void*, int64_t, int64_t),
                     void* context) {
  for (int64_t piece = max_pieces - 1; piece >= 0; --piece) {
    const int64_t begin = n * piece / max_pieces, end = n * (piece + 1) / max_pieces;
    if (begin < end) task(context, begin, end);
  }
}

class ManyPieces {
 public:
  ManyPieces() { set_parallel_backend(&reversed_pieces, 1); }
  ~ManyPieces() { set_parallel_backend(nullptr); }
};

TEST(AdversarialScratch, TheKernelsMatchTheReferenceInManyPieces) {
  Random rng(17);
  const int64_t N = 300, K = 4;
  std::vector<int32_t> skewed(size_t(N * K));  // experts 0..16, some empty, some overflowing
  for (int32_t& id : skewed) {
    const int64_t r = rng.integer(0, 99);
    id = int32_t(r < 40 ? 3 : r < 60 ? 11 : r < 70 ? 16 : 2 * rng.integer(0, 8));
  }
  ManyPieces pieces;
  for (int64_t hidden : {0, 3}) {
    // V2: drop-pad with the counts before capacity; dropless with each count format.
    for (int64_t mode : {-1, 1, 2}) {
      V2Case c;
      c.x = Tensor::floats(DType::float32, {N, hidden}, random_values(rng, N * hidden, false));
      c.expert_idx = Tensor::int32s({N, K}, skewed);
      c.attrs.expert_num = 17;
      if (mode < 0) {
        c.attrs.drop_pad_mode = 1;
        c.attrs.expert_capacity = 25;
        c.attrs.expert_tokens_before_capacity_flag = true;
      } else {
        c.attrs.expert_tokens_count_or_cumsum_flag = mode;
      }
      const V2Result expected = run_v2(c, kReference);
      ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();
      for (int threads : {2, 7, 64})
        EXPECT_TRUE(same_result(expected, run_v2(c, {Backend::cpu, CpuIsa::automatic, threads})))
            << "V2 mode " << mode << ", hidden " << hidden << ", " << threads << " pieces";
    }
    // moe_init_routing: drop-pad with per-slot outputs; a partial range with each count format.
    for (int64_t type : {-1, 0, 1, 2}) {
      ForwardCase c;
      c.x = Tensor::floats(DType::float32, {N, hidden}, random_values(rng, N * hidden, false));
      c.expert_idx = Tensor::int32s({N, K}, skewed);
      c.scale = Tensor::floats(DType::float32, {N}, random_values(rng, N, false));
      c.topk_weight = Tensor::floats(DType::float32, {N, K}, random_values(rng, N * K, false));
      c.attrs.expert_num = 17;
      if (type < 0) {
        c.attrs.drop_pad_mode = 1;
        c.attrs.expert_capacity = 30;
      } else {
        c.attrs.has_active_expert_range = true;
        c.attrs.active_expert_range = {2, 15};
        c.attrs.expert_tokens_num_flag = true;
        c.attrs.expert_tokens_num_type = type;
      }
      const ForwardResult expected = run_forward(c, kReference);
      ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();
      for (int threads : {2, 7, 64})
        EXPECT_TRUE(
            same_result(expected, run_forward(c, {Backend::cpu, CpuIsa::automatic, threads})))
            << "type " << type << ", hidden " << hidden << ", " << threads << " pieces";
    }
  }
}

}  // namespace
}  // namespace moe_routing::testing
