// The C ABI's promise that phase two allocates nothing (include/moe_routing/moe_routing.h), and
// the C++ API's with ExecConfig::workspace: every operator new of the process is counted while
// phase two runs, on the calling thread and on the pool's workers. Its own executable, because it
// replaces the global operator new / delete.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "cases/random.h"
#include "moe_routing/moe_finalize_routing.h"
#include "moe_routing/moe_init_routing.h"
#include "moe_routing/moe_routing.h"

namespace {
std::atomic<bool> counting{false};
std::atomic<int64_t> allocations{0};

/// Outputs being watched: an allocation made once any of their bytes differs from the fill byte
/// is counted in `allocations_after_write` (the reference backends must allocate before they
/// write, so that an allocation failure leaves every output untouched).
constexpr unsigned char kFill = 0x5a;
struct Watched {
  const unsigned char* bytes;
  std::size_t size;
};
std::atomic<const std::vector<Watched>*> watched{nullptr};
std::atomic<int64_t> allocations_after_write{0};

bool any_written(const std::vector<Watched>& outputs) {
  for (const Watched& w : outputs)
    for (std::size_t i = 0; i < w.size; ++i)
      if (w.bytes[i] != kFill) return true;
  return false;
}

void* counted_allocation(std::size_t size) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1);
  if (const std::vector<Watched>* outputs = watched.load(std::memory_order_relaxed))
    if (any_written(*outputs)) allocations_after_write.fetch_add(1);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t size) { return counted_allocation(size); }
void* operator new[](std::size_t size) { return counted_allocation(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace {

/// Counts the allocations made while `fn` runs (every thread).
template <class Fn>
int64_t allocations_during(Fn&& fn) {
  allocations.store(0);
  counting.store(true);
  fn();
  counting.store(false);
  return allocations.load();
}

/// A host buffer and its C ABI handle.
struct Buffer {
  std::vector<unsigned char> bytes;
  mrTensor* handle = nullptr;

  Buffer() = default;
  Buffer(mrDataType dtype, std::vector<int64_t> shape) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    const size_t element = dtype == MR_INT8                              ? 1
                           : dtype == MR_FLOAT16 || dtype == MR_BFLOAT16 ? 2
                           : dtype == MR_INT64                           ? 8
                                                                         : 4;
    bytes.assign(size_t(count) * element, 0x5a);
    EXPECT_EQ(
        mrCreateTensor(shape.data(), shape.size(), dtype, MR_DEVICE_CPU, bytes.data(), &handle),
        MR_SUCCESS)
        << mrGetLastErrorMessage();
  }
  explicit Buffer(const mrTensorDesc& desc)
      : Buffer(desc.dtype, std::vector<int64_t>(desc.shape, desc.shape + desc.ndim)) {}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { mrDestroyTensor(handle); }
};
using Optional = std::unique_ptr<Buffer>;
mrTensor* handle_of(const Optional& b) { return b ? b->handle : nullptr; }

/// Fills with random expert ids in [lo, hi], or random float32 values.
void fill_ids(Buffer& b, int32_t lo, int32_t hi, uint64_t seed) {
  moe_routing::cases::Random rng(seed);
  int32_t* ids = reinterpret_cast<int32_t*>(b.bytes.data());
  for (size_t i = 0; i < b.bytes.size() / 4; ++i) ids[i] = int32_t(rng.integer(lo, hi));
}
void fill_floats(Buffer& b, uint64_t seed) {
  moe_routing::cases::Random rng(seed);
  float* values = reinterpret_cast<float*>(b.bytes.data());
  for (size_t i = 0; i < b.bytes.size() / 4; ++i)
    values[i] = float(rng.integer(-1000, 1000)) / 256.0f;
}

/// Runs a phase two with a workspace of the reported size (> 0), counting allocations.
void expect_forward_phase_two_allocates_nothing(mrStatus (*phase_two)(void*, uint64_t, mrExecutor*,
                                                                      mrStream),
                                                uint64_t ws, mrExecutor* executor,
                                                const char* name) {
  EXPECT_GT(ws, 0u) << name;
  std::vector<unsigned char> workspace(static_cast<size_t>(ws));
  mrStatus status = MR_ERROR_INTERNAL;
  EXPECT_EQ(
      allocations_during([&] { status = phase_two(workspace.data(), ws, executor, nullptr); }), 0)
      << name;
  EXPECT_EQ(status, MR_SUCCESS) << name << ": " << mrGetLastErrorMessage();
}

// Sizes large enough that the kernels use every thread of the pool (4 threads on any machine).
constexpr int64_t kTokens = 4096, kHidden = 512, kTopK = 4, kExperts = 32;

class NoAllocation : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(mrSetNumThreads(4), MR_SUCCESS); }
  void TearDown() override { mrSetNumThreads(0); }
};

TEST_F(NoAllocation, BackwardPhaseTwo) {
  for (int order : {MR_ACCUMULATION_TREE, MR_ACCUMULATION_SEQUENTIAL}) {
    Buffer grad(MR_FLOAT32, {kTokens * kTopK, kHidden}), idx(MR_INT32, {kTokens * kTopK}),
        out(MR_FLOAT32, {kTokens, kHidden});
    fill_floats(grad, 1);
    // A permutation: row p of the gather layout goes to destination (p * 7919) mod (N*K).
    int32_t* rows = reinterpret_cast<int32_t*>(idx.bytes.data());
    for (int64_t p = 0; p < kTokens * kTopK; ++p) rows[p] = int32_t(p * 7919 % (kTokens * kTopK));
    uint64_t ws = 1;
    mrExecutor* executor = nullptr;
    ASSERT_EQ(mrMoeInitRoutingV2GradGetWorkspaceSize(grad.handle, idx.handle, kTopK, 0, 0,
                                                     out.handle, &ws, &executor),
              MR_SUCCESS)
        << mrGetLastErrorMessage();
    EXPECT_EQ(ws, 0u);
    ASSERT_EQ(mrSetAccumulationOrder(executor, order), MR_SUCCESS);
    mrStatus status = MR_ERROR_INTERNAL;
    EXPECT_EQ(
        allocations_during([&] { status = mrMoeInitRoutingV2Grad(nullptr, 0, executor, nullptr); }),
        0)
        << "order " << order;
    EXPECT_EQ(status, MR_SUCCESS) << mrGetLastErrorMessage();
  }
}

struct V2Config {
  const char* name;
  int64_t active_num, expert_capacity, expert_num, drop_pad_mode, count_flag;
  bool before_capacity;
  int32_t max_id;  // ids in [0, max_id]
};

TEST_F(NoAllocation, MoeInitRoutingV2PhaseTwo) {
  const V2Config configs[] = {
      {"dropless with cumsum", 0, 0, kExperts, 0, 1, false, kExperts - 1},
      {"active_num, count", 5000, 0, kExperts, 0, 2, false, kExperts - 1},
      {"drop-pad with counts", 0, 300, kExperts, 1, 0, true, kExperts - 1},
      // No count output: ids only need to be >= 0; ids beyond 2^16 take the radix passes.
      {"dropless, ids up to 2^31 - 1", 0, 0, 0, 0, 0, false, 2147483647},
  };
  for (const V2Config& c : configs) {
    Buffer x(MR_BFLOAT16, {kTokens, kHidden}), ids(MR_INT32, {kTokens, kTopK});
    fill_ids(ids, 0, c.max_id, 2);
    mrTensorDesc d[4];
    ASSERT_EQ(mrMoeInitRoutingV2InferShape(x.handle, ids.handle, c.active_num, c.expert_capacity,
                                           c.expert_num, c.drop_pad_mode, c.count_flag,
                                           c.before_capacity, &d[0], &d[1], &d[2], &d[3]),
              MR_SUCCESS)
        << c.name << ": " << mrGetLastErrorMessage();
    Buffer ex(d[0]), eri(d[1]);
    Optional counts, before;
    if (d[2].produced) counts = std::make_unique<Buffer>(d[2]);
    if (d[3].produced) before = std::make_unique<Buffer>(d[3]);
    uint64_t ws = 0;
    mrExecutor* executor = nullptr;
    ASSERT_EQ(mrMoeInitRoutingV2GetWorkspaceSize(
                  x.handle, ids.handle, c.active_num, c.expert_capacity, c.expert_num,
                  c.drop_pad_mode, c.count_flag, c.before_capacity, ex.handle, eri.handle,
                  handle_of(counts), handle_of(before), &ws, &executor),
              MR_SUCCESS)
        << c.name << ": " << mrGetLastErrorMessage();
    expect_forward_phase_two_allocates_nothing(&mrMoeInitRoutingV2, ws, executor, c.name);
  }
}

struct RoutingConfig {
  const char* name;
  int64_t drop_pad_mode, expert_capacity, count_type, quant_mode, row_idx_type;
  int64_t range[2];  // {0, 0}: the full range
  bool scale, topk_weight;
};

TEST_F(NoAllocation, MoeInitRoutingPhaseTwo) {
  const RoutingConfig configs[] = {
      {"gather, cumsum, topk weights", 0, 0, 0, -1, 0, {0, 0}, false, true},
      {"scatter layout with an active range (the tail sort)",
       0,
       0,
       1,
       -1,
       1,
       {4, 20},
       false,
       false},
      {"key_value counts, per-token scale", 0, 0, 2, -1, 0, {0, 0}, true, true},
      {"dynamic quantisation with smooth scales", 0, 0, 1, 1, 0, {8, 24}, true, false},
      {"drop-pad", 1, 300, 1, -1, 0, {0, 0}, false, true},
  };
  for (const RoutingConfig& c : configs) {
    Buffer x(MR_FLOAT16, {kTokens, kHidden}), ids(MR_INT32, {kTokens, kTopK});
    // -1 and ids past E are allowed here: they are simply not routed.
    fill_ids(ids, -1, kExperts + 3, 3);
    const bool ranged = c.range[1] > 0;
    const int64_t start = ranged ? c.range[0] : 0, end = ranged ? c.range[1] : kExperts;
    Optional scale, weight;
    if (c.scale && c.quant_mode == 1)
      scale = std::make_unique<Buffer>(MR_FLOAT32, std::vector<int64_t>{end - start, kHidden});
    if (c.scale && c.quant_mode == -1)
      scale = std::make_unique<Buffer>(MR_FLOAT32, std::vector<int64_t>{kTokens});
    if (c.topk_weight)
      weight = std::make_unique<Buffer>(MR_FLOAT32, std::vector<int64_t>{kTokens, kTopK});
    if (scale) fill_floats(*scale, 4);
    if (weight) fill_floats(*weight, 5);
    mrTensorDesc d[5];
    ASSERT_EQ(mrMoeInitRoutingInferShape(x.handle, ids.handle, handle_of(scale), nullptr,
                                         handle_of(weight), 0, c.expert_capacity, kExperts,
                                         c.drop_pad_mode, c.count_type, true, c.quant_mode,
                                         ranged ? c.range : nullptr, ranged ? 2 : 0, c.row_idx_type,
                                         &d[0], &d[1], &d[2], &d[3], &d[4]),
              MR_SUCCESS)
        << c.name << ": " << mrGetLastErrorMessage();
    Buffer ex(d[0]), eri(d[1]), counts(d[2]);
    Optional es, ew;
    if (d[3].produced) es = std::make_unique<Buffer>(d[3]);
    if (d[4].produced) ew = std::make_unique<Buffer>(d[4]);
    uint64_t ws = 0;
    mrExecutor* executor = nullptr;
    ASSERT_EQ(mrMoeInitRoutingGetWorkspaceSize(
                  x.handle, ids.handle, handle_of(scale), nullptr, handle_of(weight), 0,
                  c.expert_capacity, kExperts, c.drop_pad_mode, c.count_type, true, c.quant_mode,
                  ranged ? c.range : nullptr, ranged ? 2 : 0, c.row_idx_type, ex.handle, eri.handle,
                  counts.handle, handle_of(es), handle_of(ew), &ws, &executor),
              MR_SUCCESS)
        << c.name << ": " << mrGetLastErrorMessage();
    expect_forward_phase_two_allocates_nothing(&mrMoeInitRouting, ws, executor, c.name);
  }
}

/// A permutation of [0, n): p -> p * 7919 mod n (n a multiple of 8, so coprime to 7919).
void fill_permutation(Buffer& b, int64_t n) {
  int32_t* rows = reinterpret_cast<int32_t*>(b.bytes.data());
  for (int64_t p = 0; p < n; ++p) rows[p] = int32_t(p * 7919 % n);
}

// The combine's forward needs no workspace at all (size 0): every layout, V1 and V2, both
// numerics, bfloat16 with float32 scales and every optional input.
TEST_F(NoAllocation, MoeFinalizeRoutingPhaseTwo) {
  const int64_t pairs = kTokens * kTopK, capacity = pairs / kExperts;
  for (int v1 = 0; v1 < 2; ++v1)
    for (int64_t mode = 0; mode < (v1 ? 1 : 4); ++mode)
      for (mrNumerics numerics : {MR_NUMERICS_ATLAS_A2, MR_NUMERICS_ASCEND_950}) {
        const std::string name = std::string(v1 ? "V1" : "V2") + " mode " + std::to_string(mode) +
                                 " numerics " + std::to_string(numerics);
        const bool drop_pad = mode == 1 || mode == 3;
        Buffer ex(MR_BFLOAT16, drop_pad ? std::vector<int64_t>{kExperts, capacity, kHidden}
                                        : std::vector<int64_t>{pairs, kHidden});
        Buffer idx(MR_INT32, {pairs}), experts(MR_INT32, {kTokens, kTopK});
        Buffer x1(MR_BFLOAT16, {kTokens, kHidden}), x2(MR_BFLOAT16, {kTokens, kHidden});
        Buffer bias(MR_BFLOAT16, {kExperts, kHidden}), scales(MR_FLOAT32, {kTokens, kTopK});
        Buffer out(MR_BFLOAT16, {kTokens, kHidden});
        fill_permutation(idx, pairs);
        fill_ids(experts, 0, kExperts - 1, 6);
        fill_floats(scales, 7);
        uint64_t ws = 1;
        mrExecutor* executor = nullptr;
        const mrStatus planned =
            v1 ? mrMoeFinalizeRoutingGetWorkspaceSize(ex.handle, x1.handle, x2.handle, bias.handle,
                                                      scales.handle, idx.handle, experts.handle,
                                                      out.handle, &ws, &executor)
               : mrMoeFinalizeRoutingV2GetWorkspaceSize(ex.handle, idx.handle, x1.handle, x2.handle,
                                                        bias.handle, scales.handle, experts.handle,
                                                        mode, out.handle, &ws, &executor);
        ASSERT_EQ(planned, MR_SUCCESS) << name << ": " << mrGetLastErrorMessage();
        EXPECT_EQ(ws, 0u) << name;
        ASSERT_EQ(mrSetNumerics(executor, numerics), MR_SUCCESS);
        mrStatus status = MR_ERROR_INTERNAL;
        EXPECT_EQ(allocations_during([&] {
                    status = v1 ? mrMoeFinalizeRouting(nullptr, 0, executor, nullptr)
                                : mrMoeFinalizeRoutingV2(nullptr, 0, executor, nullptr);
                  }),
                  0)
            << name;
        EXPECT_EQ(status, MR_SUCCESS) << name << ": " << mrGetLastErrorMessage();
      }
}

// The combine's backward keeps its pair lists (by row, and by expert for gradBias) and the rows'
// visiting order in the caller's workspace.
TEST_F(NoAllocation, MoeFinalizeRoutingV2GradPhaseTwo) {
  const int64_t pairs = kTokens * kTopK, capacity = pairs / kExperts;
  for (int64_t mode : {0, 1})
    for (mrNumerics numerics : {MR_NUMERICS_ATLAS_A2, MR_NUMERICS_ASCEND_950}) {
      const std::string name =
          "mode " + std::to_string(mode) + " numerics " + std::to_string(numerics);
      const std::vector<int64_t> rows_shape =
          mode == 1 ? std::vector<int64_t>{kExperts, capacity, kHidden}
                    : std::vector<int64_t>{pairs, kHidden};
      Buffer gy(MR_BFLOAT16, {kTokens, kHidden}), idx(MR_INT32, {pairs});
      Buffer ex(MR_BFLOAT16, rows_shape), scales(MR_FLOAT32, {kTokens, kTopK});
      Buffer experts(MR_INT32, {kTokens, kTopK}), bias(MR_BFLOAT16, {kExperts, kHidden});
      Buffer gex(MR_BFLOAT16, rows_shape), gs(MR_FLOAT32, {kTokens, kTopK});
      Buffer gb(MR_BFLOAT16, {kExperts, kHidden});
      fill_permutation(idx, pairs);
      fill_ids(experts, 0, kExperts - 1, 8);
      fill_floats(scales, 9);
      uint64_t ws = 0;
      mrExecutor* executor = nullptr;
      ASSERT_EQ(mrMoeFinalizeRoutingV2GradGetWorkspaceSize(
                    gy.handle, idx.handle, ex.handle, scales.handle, experts.handle, bias.handle,
                    mode, 0, mode == 1 ? kExperts : 0, mode == 1 ? capacity : 0, gex.handle,
                    gs.handle, gb.handle, &ws, &executor),
                MR_SUCCESS)
          << name << ": " << mrGetLastErrorMessage();
      ASSERT_EQ(mrSetNumerics(executor, numerics), MR_SUCCESS);
      expect_forward_phase_two_allocates_nothing(&mrMoeFinalizeRoutingV2Grad, ws, executor,
                                                 name.c_str());
    }
}

// The C++ API with ExecConfig::workspace: the same promise (the C ABI is built on it).
TEST_F(NoAllocation, CppApiWithWorkspace) {
  using namespace moe_routing;
  std::vector<uint16_t> x(size_t(kTokens * kHidden), 0x3c00);
  std::vector<int32_t> ids(size_t(kTokens * kTopK));
  for (size_t p = 0; p < ids.size(); ++p) ids[p] = int32_t(p * 13 % kExperts);
  const TensorView xv(x.data(), DType::float16, {kTokens, kHidden});
  const TensorView iv(ids.data(), DType::int32, {kTokens, kTopK});
  MoeInitRoutingV2Attrs attrs;
  attrs.expert_num = kExperts;
  attrs.expert_tokens_count_or_cumsum_flag = 2;
  MoeInitRoutingV2Plan plan;
  ASSERT_TRUE(infer_moe_init_routing_v2(xv, iv, attrs, &plan).is_ok());
  std::vector<uint16_t> out(size_t(plan.expanded_x.numel()));
  std::vector<int32_t> row_idx(size_t(plan.expanded_row_idx.numel())),
      counts(static_cast<size_t>(kExperts));
  ExecConfig config;
  config.num_threads = 3;
  std::vector<unsigned char> workspace(size_t(moe_init_routing_v2_workspace_size(plan, 3)));
  config.workspace = workspace.data();
  config.workspace_bytes = workspace.size();
  Status status;
  auto call = [&] {
    status = moe_init_routing_v2(
        xv, iv, attrs, TensorView(out.data(), DType::float16, {kTokens * kTopK, kHidden}),
        TensorView(row_idx.data(), DType::int32, {kTokens * kTopK}),
        TensorView(counts.data(), DType::int32, {kExperts}), TensorView(), config);
  };
  call();  // warm up: the pool starts its threads on first need
  ASSERT_TRUE(status.is_ok()) << status.message();
  EXPECT_EQ(allocations_during(call), 0);
  EXPECT_TRUE(status.is_ok()) << status.message();
  for (int32_t c : counts) EXPECT_EQ(c, kTokens * kTopK / kExperts);
}

// Without a caller workspace the forward keeps its (small) scratch per calling thread: after the
// first call, repeated calls of the same size allocate nothing either (docs/python.md relies on
// it for out= calls at decode sizes).
TEST_F(NoAllocation, CppApiWithoutWorkspaceReusesItsScratch) {
  using namespace moe_routing;
  std::vector<float> x(size_t(kTokens * kHidden), 1.0f);
  std::vector<int32_t> ids(size_t(kTokens * kTopK));
  for (size_t p = 0; p < ids.size(); ++p) ids[p] = int32_t(p * 7 % kExperts);
  const TensorView xv(x.data(), DType::float32, {kTokens, kHidden});
  const TensorView iv(ids.data(), DType::int32, {kTokens, kTopK});
  MoeInitRoutingAttrs attrs;
  attrs.expert_num = kExperts;
  attrs.expert_tokens_num_flag = true;
  std::vector<float> out(size_t(kTokens * kTopK * kHidden));
  std::vector<int32_t> row_idx(size_t(kTokens * kTopK));
  std::vector<int64_t> counts(static_cast<size_t>(kExperts));
  ExecConfig config;
  config.num_threads = 2;
  auto call = [&] {
    return moe_init_routing(xv, iv, TensorView(), TensorView(), TensorView(), attrs,
                            TensorView(out.data(), DType::float32, {kTokens * kTopK, kHidden}),
                            TensorView(row_idx.data(), DType::int32, {kTokens * kTopK}),
                            TensorView(counts.data(), DType::int64, {kExperts}), TensorView(),
                            TensorView(), config);
  };
  Status status = call();  // first call: the scratch is allocated (and the pool started)
  ASSERT_TRUE(status.is_ok()) << status.message();
  EXPECT_EQ(allocations_during([&] { status = call(); }), 0);
  EXPECT_TRUE(status.is_ok()) << status.message();
  EXPECT_EQ(counts[0], kTokens * kTopK / kExperts);
}

// The reference backend of the combine's backward computed grad_scales (whose trees allocate)
// after writing grad_expanded_x and grad_bias: a failed allocation there left those outputs
// written under an error. It now allocates before it writes.
TEST_F(NoAllocation, ReferenceBackendAllocatesBeforeWriting) {
  using namespace moe_routing;
  constexpr int64_t N = 8, K = 2, H = 96, E = 4;
  std::vector<float> gy(size_t(N * H)), ex(size_t(N * K * H)), bias(size_t(E * H));
  std::vector<float> scales(size_t(N * K));
  std::vector<int32_t> idx(size_t(N * K)), experts(size_t(N * K));
  for (size_t i = 0; i < gy.size(); ++i) gy[i] = float(int(i % 7) - 3) / 4.0f;
  for (size_t i = 0; i < ex.size(); ++i) ex[i] = float(int(i % 5) - 2) / 8.0f;
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = float(int(i % 3)) / 2.0f;
  for (size_t q = 0; q < idx.size(); ++q) {
    idx[q] = int32_t((q * 5) % size_t(N * K));  // 5 is coprime to 16: a permutation
    experts[q] = int32_t(q % size_t(E));
    scales[q] = float(q + 1) / 16.0f;
  }
  MoeFinalizeRoutingGradInputs in;
  in.grad_y = TensorView(gy.data(), DType::float32, {N, H});
  in.expanded_row_idx = TensorView(idx.data(), DType::int32, {N * K});
  in.expanded_x = TensorView(ex.data(), DType::float32, {N * K, H});
  in.scales = TensorView(scales.data(), DType::float32, {N, K});
  in.expert_idx = TensorView(experts.data(), DType::int32, {N, K});
  in.bias = TensorView(bias.data(), DType::float32, {E, H});
  for (Numerics numerics : {Numerics::atlas_a2, Numerics::ascend_950}) {
    MoeFinalizeRoutingGradAttrs attrs;
    attrs.numerics = numerics;
    std::vector<float> gex(ex.size()), gs(scales.size()), gb(bias.size());
    for (auto* v : {&gex, &gs, &gb}) std::memset(v->data(), kFill, v->size() * sizeof(float));
    MoeFinalizeRoutingGradOutputs out;
    out.grad_expanded_x = TensorView(gex.data(), DType::float32, {N * K, H});
    out.grad_scales = TensorView(gs.data(), DType::float32, {N, K});
    out.grad_bias = TensorView(gb.data(), DType::float32, {E, H});
    ExecConfig config;
    config.backend = Backend::reference;
    const std::vector<Watched> outputs{
        {reinterpret_cast<const unsigned char*>(gex.data()), gex.size() * sizeof(float)},
        {reinterpret_cast<const unsigned char*>(gs.data()), gs.size() * sizeof(float)},
        {reinterpret_cast<const unsigned char*>(gb.data()), gb.size() * sizeof(float)}};
    allocations_after_write.store(0);
    watched.store(&outputs);
    const Status status = moe_finalize_routing_grad(in, attrs, out, config);
    watched.store(nullptr);
    ASSERT_TRUE(status.is_ok()) << status.message();
    EXPECT_TRUE(any_written(outputs));
    EXPECT_EQ(allocations_after_write.load(), 0) << "numerics " << int(numerics);
  }
}

// The counter itself works, also on the pool's threads: a parallel loop whose body allocates.
TEST_F(NoAllocation, CounterSeesAllocations) {
  EXPECT_GE(allocations_during([] {
              std::vector<int> v(100);
              (void)v;
            }),
            1);
}

}  // namespace
