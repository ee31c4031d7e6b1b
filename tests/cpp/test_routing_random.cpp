// Random forward cases: the CPU kernels equal the reference byte for byte for every dtype x
// scenario x flags at several thread counts; the adjoint identity <fwd(x), g> == <x, grad(g)>
// for every non-quantised configuration; the counting sort on its own; empty inputs; huge ids
// (the radix path); not-produced outputs passed with data are zero-filled.
#include <algorithm>
#include <fstream>
#include <limits>
#include <numeric>

#include "cpu/routing_sort.h"
#include "routing_cases.h"

namespace moe_routing {
namespace {

using testing::ForwardCase;
using testing::ForwardResult;
using testing::Random;
using testing::Tensor;
using testing::V2Case;
using testing::V2Result;

const DType kDtypes[] = {DType::float32, DType::float16, DType::bfloat16};

using testing::kScenarios;
using testing::make_forward_case;
using testing::make_v2_case;
using testing::random_values;
using testing::Scenario;
using testing::scenario_name;

// --- CPU == reference -------------------------------------------------------------------------

TEST(RoutingRandom, TorchApiMatchesTheReferenceForEveryConfiguration) {
  Random rng(20261201);
  const auto runners = testing::all_runners();
  int checked = 0;
  for (DType dtype : kDtypes)
    for (Scenario scenario : kScenarios)
      for (int64_t quant : {-1, 0, 1})
        for (int64_t row_idx_type : {0, 1})
          for (int repeat = 0; repeat < 2; ++repeat) {
            if (scenario == Scenario::drop_pad && (quant != -1 || row_idx_type != 0)) continue;
            ForwardCase c = make_forward_case(rng, dtype, scenario, quant, row_idx_type, false);
            SCOPED_TRACE(::testing::Message()
                         << dtype_name(dtype) << ' ' << scenario_name(scenario) << " quant "
                         << quant << " row_idx_type " << row_idx_type << " N=" << c.x.shape[0]
                         << " K=" << c.expert_idx.shape[1] << " H=" << c.x.shape[1]
                         << " E=" << c.attrs.expert_num);
            ForwardResult expected = testing::run_forward(c, runners[0]);
            ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();
            for (size_t r = 1; r < runners.size(); ++r)
              EXPECT_TRUE(testing::same_result(expected, testing::run_forward(c, runners[r])))
                  << runners[r].name();
            ++checked;
          }
  EXPECT_GT(checked, 100);
}

TEST(RoutingRandom, V2MatchesTheReferenceForEveryConfiguration) {
  Random rng(7);
  const auto runners = testing::all_runners();
  for (DType dtype : kDtypes)
    for (int mode : {0, 1, 2})
      for (int repeat = 0; repeat < 4; ++repeat) {
        V2Case c = make_v2_case(rng, dtype, mode, false);
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dtype) << " mode " << mode << " repeat " << repeat);
        V2Result expected = testing::run_v2(c, runners[0]);
        ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();
        for (size_t r = 1; r < runners.size(); ++r)
          EXPECT_TRUE(testing::same_result(expected, testing::run_v2(c, runners[r])))
              << runners[r].name();
      }
}

TEST(RoutingRandom, LargeInputsAreIndependentOfTheThreadCount) {
  // Enough pairs for several sort blocks and key blocks; fp16 rows, partial range, both
  // row_idx_types.
  Random rng(11);
  const int64_t N = 4099, K = 8, H = 5, E = 37;
  std::vector<int32_t> ids(size_t(N * K));
  for (int32_t& id : ids) id = int32_t(rng.integer(-1, E));
  for (int64_t row_idx_type : {0, 1})
    for (int64_t quant : {-1, 1}) {
      ForwardCase c;
      c.x = Tensor::floats(DType::float16, {N, H}, random_values(rng, N * H, false));
      c.expert_idx = Tensor::int32s({N, K}, ids);
      c.topk_weight = Tensor::floats(DType::float32, {N, K}, random_values(rng, N * K, false));
      c.attrs.expert_num = E;
      c.attrs.has_active_expert_range = true;
      c.attrs.active_expert_range = {3, 30};
      c.attrs.row_idx_type = row_idx_type;
      c.attrs.quant_mode = quant;
      c.attrs.expert_tokens_num_flag = true;
      c.attrs.active_num = 20000;
      ForwardResult expected = testing::run_forward(c, {Backend::reference, CpuIsa::automatic, 1});
      ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();
      // With the built-in pool (which gives rows this short fewer threads than asked), then
      // split into pieces; odd counts with a caller workspace.
      testing::for_each_split({1, 2, 3, 8, 16}, [&](int threads, const std::string& what) {
        EXPECT_TRUE(testing::same_result(
            expected,
            testing::run_forward(c, {Backend::cpu, CpuIsa::automatic, threads, threads % 2 == 1})))
            << what << ", row_idx_type " << row_idx_type << " quant " << quant;
      });
    }
  V2Case v2;
  v2.x = Tensor::floats(DType::bfloat16, {N, H}, random_values(rng, N * H, false));
  std::vector<int32_t> v2_ids(size_t(N * K));
  for (int32_t& id : v2_ids) id = int32_t(rng.integer(0, E - 1));
  v2.expert_idx = Tensor::int32s({N, K}, v2_ids);
  v2.attrs.drop_pad_mode = 1;
  v2.attrs.expert_num = E;
  v2.attrs.expert_capacity = 700;
  v2.attrs.expert_tokens_before_capacity_flag = true;
  V2Result expected = testing::run_v2(v2, {Backend::reference, CpuIsa::automatic, 1});
  ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();
  testing::for_each_split({1, 2, 3, 8, 16}, [&](int threads, const std::string& what) {
    EXPECT_TRUE(testing::same_result(expected, testing::run_v2(v2, {Backend::cpu, CpuIsa::automatic,
                                                                    threads, threads % 2 == 1})))
        << what << " (V2 drop-pad)";
  });
}

TEST(RoutingRandom, StreamingThresholdIsAtLeast8MiB) {
  EXPECT_GE(detail::streaming_store_threshold(), int64_t(8) << 20);
  {
    const testing::StreamingThresholdOverride forced(12345);
    EXPECT_EQ(detail::streaming_store_threshold(), 12345);
  }
  EXPECT_GE(detail::streaming_store_threshold(), int64_t(8) << 20);
}

// The threshold for a reported cache size: within [8 MiB, 32 MiB], 32 MiB where unknown. A VM on
// a large Intel server reports the socket's whole 480 MiB L3 as its own; the threshold was that,
// and outputs of 30-470 MB went through the cache, 1.2-2x slower than streamed.
TEST(RoutingRandom, StreamingThresholdIsTheCacheWithin8And32MiB) {
  constexpr int64_t MiB = int64_t(1) << 20;
  EXPECT_EQ(detail::streaming_store_threshold_for_cache(0), 32 * MiB);
  EXPECT_EQ(detail::streaming_store_threshold_for_cache(-1), 32 * MiB);
  EXPECT_EQ(detail::streaming_store_threshold_for_cache(1), 8 * MiB);
  EXPECT_EQ(detail::streaming_store_threshold_for_cache(4 * MiB), 8 * MiB);
  EXPECT_EQ(detail::streaming_store_threshold_for_cache(8 * MiB), 8 * MiB);
  EXPECT_EQ(detail::streaming_store_threshold_for_cache(20 * MiB), 20 * MiB);
  EXPECT_EQ(detail::streaming_store_threshold_for_cache(32 * MiB), 32 * MiB);
  EXPECT_EQ(detail::streaming_store_threshold_for_cache(32 * MiB + 1), 32 * MiB);
  EXPECT_EQ(detail::streaming_store_threshold_for_cache(256 * MiB), 32 * MiB);
  EXPECT_EQ(detail::streaming_store_threshold_for_cache(480 * MiB), 32 * MiB);
  EXPECT_EQ(detail::streaming_store_threshold_for_cache(INT64_MAX), 32 * MiB);
  EXPECT_LE(detail::streaming_store_threshold(), 32 * MiB);
}

// A call streams its output where the output or its reads reach the threshold: reads that large
// evict a cached output during the call itself (a combine reading 32-128 MiB of rows into a 4-16
// MiB output took 4-9 % less time streamed on a Zen 4 VM). Before, only the output counted.
TEST(RoutingRandom, StreamsOutputWhereTheOutputOrTheReadsReachTheThreshold) {
  const testing::StreamingThresholdOverride forced(1000);
  EXPECT_FALSE(detail::streams_output(999, 999));
  EXPECT_FALSE(detail::streams_output(0, 0));
  EXPECT_FALSE(detail::streams_output(-1, -1));
  EXPECT_TRUE(detail::streams_output(1000, 0));
  EXPECT_TRUE(detail::streams_output(0, 1000));
  EXPECT_TRUE(
      detail::streams_output(16, 8000));  // the combine's forward: K rows read per row written
  EXPECT_TRUE(detail::streams_output(INT64_MAX, 0));
  EXPECT_TRUE(detail::streams_output(0, INT64_MAX));
}

// Where Linux describes CPU 0's caches in sysfs and the highest level is an L3 or beyond, the
// threshold is that cache instance's size (not sysconf's, which on AMD EPYC is the whole
// package's: 256 MiB against 32 MiB per core), within [8 MiB, 32 MiB].
TEST(RoutingRandom, StreamingThresholdIsTheLastLevelCacheInstanceFromSysfs) {
  int best_level = 0;
  int64_t best_bytes = 0;
  for (int index = 0; index < 16; ++index) {
    const std::string dir =
        "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream type_file(dir + "type"), level_file(dir + "level"), size_file(dir + "size");
    std::string type, size_text;
    int level = 0;
    if (!(type_file >> type)) break;
    if (type == "Instruction" || !(level_file >> level) || !(size_file >> size_text)) continue;
    const int64_t value = std::stoll(size_text);
    const char unit = size_text.back();
    const int64_t bytes = unit == 'K'   ? value << 10
                          : unit == 'M' ? value << 20
                          : unit == 'G' ? value << 30
                                        : value;
    if (level > best_level) {
      best_level = level;
      best_bytes = bytes;
    }
  }
  if (best_level >= 3) {
    EXPECT_EQ(detail::last_level_cache_bytes(), best_bytes);
    EXPECT_EQ(detail::streaming_store_threshold(),
              std::min<int64_t>(std::max<int64_t>(best_bytes, int64_t(8) << 20), int64_t(32) << 20))
        << "sysfs L" << best_level << " size " << best_bytes;
  } else {  // no L3 described: sysconf or the 32 MiB default, never below 8 MiB
    EXPECT_GE(detail::streaming_store_threshold(), int64_t(8) << 20);
  }
}

// ExecConfig::workspace: the size depends on the plan and thread count only; a smaller one is
// refused before anything is written; the reference backend ignores it.

TEST(RoutingRandom, CallerWorkspaceSizeIsCheckedBeforeAnyWrite) {
  ForwardCase c;
  const int64_t N = 3000, K = 4, H = 16;
  Random rng(5);
  std::vector<int32_t> ids(size_t(N * K));
  for (int32_t& id : ids) id = int32_t(rng.integer(-1, 9));
  c.x = Tensor::floats(DType::float32, {N, H}, random_values(rng, N * H, false));
  c.expert_idx = Tensor::int32s({N, K}, ids);
  c.attrs.expert_num = 8;
  c.attrs.expert_tokens_num_flag = true;
  c.attrs.row_idx_type = 1;
  MoeInitRoutingPlan plan;
  ASSERT_TRUE(infer_moe_init_routing(c.x.view(), c.expert_idx.view(), c.scale.view(),
                                     c.offset.view(), c.topk_weight.view(), c.attrs, &plan)
                  .is_ok());
  const uint64_t size = moe_init_routing_workspace_size(plan, 2);
  // The ids do not matter: the same plan with other ids has the same size.
  EXPECT_GT(size, uint64_t(N * K * 8));
  Tensor out = Tensor::from_spec(plan.expanded_x),
         row_idx = Tensor::from_spec(plan.expanded_row_idx),
         counts = Tensor::from_spec(plan.expert_tokens_count_or_cumsum);
  for (Tensor* t : {&out, &row_idx, &counts}) t->poison();
  std::vector<unsigned char> workspace(static_cast<size_t>(size));
  ExecConfig config;
  config.num_threads = 2;
  config.workspace = workspace.data();
  config.workspace_bytes = size - 1;
  const Status refused = moe_init_routing(
      c.x.view(), c.expert_idx.view(), c.scale.view(), c.offset.view(), c.topk_weight.view(),
      c.attrs, out.view(), row_idx.view(), counts.view(), TensorView(), TensorView(), config);
  EXPECT_EQ(refused.code(), StatusCode::invalid_argument);
  EXPECT_EQ(refused.message(),
            "moe_init_routing: workspace_bytes must be at least " + std::to_string(size) +
                " for this call with num_threads 2 (moe_init_routing_workspace_size "
                "with the same num_threads gives it), got " +
                std::to_string(size - 1));
  for (const Tensor* t : {&out, &row_idx, &counts})
    for (uint8_t b : t->bytes) ASSERT_EQ(b, 0x5A) << "an output was written";
  config.backend = Backend::reference;  // ignores the workspace
  EXPECT_TRUE(moe_init_routing(c.x.view(), c.expert_idx.view(), c.scale.view(), c.offset.view(),
                               c.topk_weight.view(), c.attrs, out.view(), row_idx.view(),
                               counts.view(), TensorView(), TensorView(), config)
                  .is_ok());
}

// A workspace that shares bytes with an input or an output is refused before anything is written
// (found by an adversarial review: only its size was checked, and the kernels' scratch would have
// overwritten the tensors they read or write).
TEST(RoutingRandom, CallerWorkspaceOverlappingATensorIsRefused) {
  ForwardCase c;
  const int64_t N = 300, K = 4, H = 16;
  Random rng(6);
  std::vector<int32_t> ids(size_t(N * K));
  for (int32_t& id : ids) id = int32_t(rng.integer(0, 7));
  c.x = Tensor::floats(DType::float32, {N, H}, random_values(rng, N * H, false));
  c.expert_idx = Tensor::int32s({N, K}, ids);
  c.attrs.expert_num = 8;
  MoeInitRoutingPlan plan;
  ASSERT_TRUE(infer_moe_init_routing(c.x.view(), c.expert_idx.view(), c.scale.view(),
                                     c.offset.view(), c.topk_weight.view(), c.attrs, &plan)
                  .is_ok());
  Tensor out = Tensor::from_spec(plan.expanded_x),
         row_idx = Tensor::from_spec(plan.expanded_row_idx);
  const uint64_t size = moe_init_routing_workspace_size(plan, 1);
  ASSERT_LT(size, uint64_t(out.bytes.size()));  // the scratch fits inside expanded_x's buffer
  const Tensor x_before = c.x;
  for (const bool in_output : {true, false}) {
    out.poison();
    row_idx.poison();
    ExecConfig config;
    config.num_threads = 1;
    // In expanded_x (an output), or in x (an input) from its second byte on.
    config.workspace = in_output ? static_cast<void*>(out.bytes.data() + 64)
                                 : static_cast<void*>(c.x.bytes.data() + 1);
    config.workspace_bytes = size;
    const Status refused = moe_init_routing(
        c.x.view(), c.expert_idx.view(), c.scale.view(), c.offset.view(), c.topk_weight.view(),
        c.attrs, out.view(), row_idx.view(), TensorView(), TensorView(), TensorView(), config);
    EXPECT_EQ(refused.code(), StatusCode::invalid_argument);
    EXPECT_EQ(
        refused.message(),
        std::string("moe_init_routing: workspace must not overlap ") +
            (in_output ? "expanded_x" : "x") +
            " (the call writes its scratch there while it reads the inputs and writes the "
            "outputs), got " +
            std::to_string(in_output ? size : std::min<uint64_t>(size, c.x.bytes.size() - 1)) +
            " shared bytes");
    for (const Tensor* t : {&out, &row_idx})
      for (uint8_t b : t->bytes) ASSERT_EQ(b, 0x5A) << "an output was written";
    EXPECT_EQ(c.x.bytes, x_before.bytes) << "an input was written";
  }
}

TEST(RoutingRandom, EveryWriteOrderOfExpandedXIsBitExact) {
  // expanded_x of >= the threshold is written with non-temporal stores, token by token; below
  // it, token by token while x exceeds 1/16 of the threshold, else in destination order. With
  // x 1.06 MB and expanded_x 6.2-9.9 MB: 8 MiB streams (or scatters), 16 MiB scatters through
  // the cache, 32 MiB writes in destination order. H = 1031 bf16 makes rows start at every
  // 16-byte alignment, so the aligned, unaligned-head and tail paths all run, for both ISAs.
  for (const int64_t mib : {8, 16, 32}) {
    const testing::StreamingThresholdOverride threshold(mib << 20);
    Random rng(12);
    const int64_t N = 512, K = 8, H = 1031, E = 16;
    std::vector<int32_t> ids(size_t(N * K));
    for (int32_t& id : ids) id = int32_t(rng.integer(-1, E));
    std::vector<float> x = random_values(rng, N * H, false);
    struct Variant {
      int64_t row_idx_type, drop_pad, active_num;
    };
    for (const Variant v : {Variant{0, 0, -1}, Variant{1, 0, 3000}, Variant{0, 1, -1}}) {
      ForwardCase c;
      c.x = Tensor::floats(DType::bfloat16, {N, H}, x);
      std::vector<int32_t> case_ids = ids;
      if (v.drop_pad)
        for (int32_t& id : case_ids) id = id < 0 ? 0 : (id >= E ? E - 1 : id);
      c.expert_idx = Tensor::int32s({N, K}, case_ids);
      c.topk_weight = Tensor::floats(DType::float32, {N, K}, random_values(rng, N * K, false));
      c.scale = Tensor::floats(DType::float32, {N}, random_values(rng, N, false));
      c.attrs.expert_num = E;
      c.attrs.row_idx_type = v.row_idx_type;
      c.attrs.drop_pad_mode = v.drop_pad;
      c.attrs.expert_capacity = v.drop_pad ? 300 : -1;
      c.attrs.active_num = v.active_num;
      ForwardResult expected = testing::run_forward(c, {Backend::reference, CpuIsa::automatic, 1});
      ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();
      for (CpuIsa isa : kCpuIsas) {
        if (!cpu_isa_available(isa)) continue;
        for (int threads : {1, 2, 5})
          EXPECT_TRUE(
              testing::same_result(expected, testing::run_forward(c, {Backend::cpu, isa, threads})))
              << cpu_isa_name(isa) << ", " << threads << " threads, row_idx_type " << v.row_idx_type
              << " drop_pad " << v.drop_pad << ", threshold " << mib << " MiB";
      }
    }
  }
}

// --- huge ids: the two-pass radix path --------------------------------------------------------

TEST(RoutingRandom, HugeIdsTakeTheRadixPathAndMatchTheReference) {
  Random rng(5);
  const auto runners = testing::all_runners();
  const int32_t int_max = std::numeric_limits<int32_t>::max(),
                int_min = std::numeric_limits<int32_t>::min();
  const int64_t N = 2500, K = 4, H = 2;
  // V2 without counts: ids need only be >= 0, so the key range is max id + 1 (> 2^16).
  {
    const int32_t choices[] = {0, 5, 70000, int_max, 123456789, 65535, 65536};
    std::vector<int32_t> ids(size_t(N * K));
    for (int32_t& id : ids) id = choices[rng.integer(0, 6)];
    V2Case c;
    c.x = Tensor::floats(DType::float32, {N, H}, random_values(rng, N * H, false));
    c.expert_idx = Tensor::int32s({N, K}, ids);
    c.attrs.active_num = 9000;
    V2Result expected = testing::run_v2(c, runners[0]);
    ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();
    for (size_t r = 1; r < runners.size(); ++r)
      EXPECT_TRUE(testing::same_result(expected, testing::run_v2(c, runners[r])))
          << runners[r].name();
  }
  // V2 with counts over 100000 experts (range > 2^16, totals from the sorted keys).
  {
    std::vector<int32_t> ids(size_t(N * K));
    for (int32_t& id : ids) id = int32_t(rng.integer(0, 99999));
    V2Case c;
    c.x = Tensor::floats(DType::float32, {N, H}, random_values(rng, N * H, false));
    c.expert_idx = Tensor::int32s({N, K}, ids);
    c.attrs.expert_num = 100000;
    c.attrs.expert_tokens_count_or_cumsum_flag = 1;
    V2Result expected = testing::run_v2(c, runners[0]);
    ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();
    for (size_t r = 1; r < runners.size(); ++r)
      EXPECT_TRUE(testing::same_result(expected, testing::run_v2(c, runners[r])))
          << runners[r].name();
  }
  // Torch API, row_idx_type 1: the tail sorts huge ids above the range; with an id of INT32_MAX the
  // ids below the range tie with it (the golden maps them to INT32_MAX) and keep position order.
  for (bool with_int_max : {true, false})
    for (int64_t count_type : {0, 2}) {
      const int32_t choices[] = {
          int_min, -1, 0, 3, 7, 99999, 80000, 1 << 20, with_int_max ? int_max : 1 << 24};
      std::vector<int32_t> ids(size_t(N * K));
      for (int32_t& id : ids) id = choices[rng.integer(0, 8)];
      ForwardCase c;
      c.x = Tensor::floats(DType::float32, {N, H}, random_values(rng, N * H, false));
      c.expert_idx = Tensor::int32s({N, K}, ids);
      c.attrs.expert_num = 100000;
      c.attrs.has_active_expert_range = true;
      c.attrs.active_expert_range = {3, 99999};
      c.attrs.row_idx_type = 1;
      c.attrs.expert_tokens_num_flag = true;
      c.attrs.expert_tokens_num_type = count_type;
      ForwardResult expected = testing::run_forward(c, runners[0]);
      ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();
      for (size_t r = 1; r < runners.size(); ++r)
        EXPECT_TRUE(testing::same_result(expected, testing::run_forward(c, runners[r])))
            << runners[r].name() << (with_int_max ? " with INT32_MAX" : "");
    }
}

TEST(RoutingRandom, CountingSortIsStableAndThreadIndependent) {
  Random rng(3);
  // The offsets buffer is exactly sort_offsets_entries long: under AddressSanitizer this also
  // checks that bound (ranges around the 4096-item block size and the 2^16 radix threshold).
  for (uint64_t range : {uint64_t(1), uint64_t(7), uint64_t(4096), uint64_t(5000), uint64_t(20000),
                         uint64_t(65536), uint64_t(65537), uint64_t(1) << 31}) {
    const int64_t n = range == 20000 ? 170000 : 50000;
    std::vector<uint32_t> keys(static_cast<size_t>(n));
    for (uint32_t& k : keys)
      k = rng.integer(0, 9) == 0
              ? cpu::kNotRouted
              : uint32_t(rng.integer(0, int64_t(std::min<uint64_t>(range, 40)) - 1) *
                         (range / std::min<uint64_t>(range, 40)));
    std::vector<int32_t> expected;
    for (int64_t p = 0; p < n; ++p)
      if (keys[size_t(p)] != cpu::kNotRouted) expected.push_back(int32_t(p));
    std::stable_sort(expected.begin(), expected.end(),
                     [&](int32_t a, int32_t b) { return keys[a] < keys[b]; });
    std::vector<int64_t> expected_totals(size_t(std::min<uint64_t>(range, 1 << 20)), 0);
    const bool with_totals = range <= (uint64_t(1) << 20);
    if (with_totals)
      for (int32_t p : expected) ++expected_totals[keys[size_t(p)]];
    for (int threads : {1, 2, 3, 8}) {
      std::vector<int32_t> order(size_t(n), -7), scratch(static_cast<size_t>(n));
      std::vector<int64_t> totals(expected_totals.size(), -7);
      std::vector<int32_t> rank(size_t(n), -7), expected_rank(size_t(n), -1);
      for (size_t d = 0; d < expected.size(); ++d) expected_rank[size_t(expected[d])] = int32_t(d);
      std::vector<int64_t> offsets(size_t(cpu::sort_offsets_entries(n, range, threads)));
      const int64_t m = cpu::stable_counting_sort(
          keys.data(), n, range, threads, order.data(), scratch.data(),
          with_totals ? totals.data() : nullptr, rank.data(), offsets.data());
      ASSERT_EQ(m, int64_t(expected.size())) << "range " << range << ", " << threads << " threads";
      EXPECT_EQ(rank, expected_rank) << "range " << range << ", " << threads << " threads";
      order.resize(size_t(m));
      EXPECT_EQ(order, expected) << "range " << range << ", " << threads << " threads";
      if (with_totals) {
        EXPECT_EQ(totals, expected_totals) << "range " << range << ", " << threads << " threads";
      }
    }
  }
}

// --- the adjoint identity ---------------------------------------------------------------------

double dot(const Tensor& a, const Tensor& b, int64_t count) {
  double sum = 0;
  for (int64_t i = 0; i < count; ++i) sum += double(a.at(i)) * double(b.at(i));
  return sum;
}

/// Runs moe_init_routing_grad(g) in the scenario that matches the forward and returns <x, grad_x>.
double backward_dot(const Tensor& x, Tensor& g, const std::vector<int32_t>& gather_row_idx,
                    int64_t top_k, int64_t drop_pad_mode, int64_t active_num,
                    std::vector<int64_t> grad_shape) {
  const int64_t N = x.shape[0], H = x.shape[1];
  Tensor grad_x(x.dtype, {N, H});
  grad_x.poison();
  std::vector<int32_t> idx = gather_row_idx;
  MoeInitRoutingGradAttrs attrs{top_k, drop_pad_mode, active_num};
  Status s = moe_init_routing_grad(
      TensorView(g.bytes.data(), g.dtype, int(grad_shape.size()), grad_shape.data()),
      TensorView(idx.data(), DType::int32, {int64_t(idx.size())}), attrs, grad_x.view());
  EXPECT_TRUE(s.is_ok()) << s.message();
  return dot(x, grad_x, N * H);
}

TEST(RoutingRandom, AdjointIdentityHoldsForEveryNonQuantisedTorchApiConfiguration) {
  Random rng(17);
  int nonzero = 0, total = 0;
  for (DType dtype : kDtypes)
    for (Scenario scenario : kScenarios)
      for (int64_t row_idx_type : {0, 1})
        for (int repeat = 0; repeat < 3; ++repeat) {
          if (scenario == Scenario::drop_pad && row_idx_type != 0) continue;
          ForwardCase c = make_forward_case(rng, dtype, scenario, -1, row_idx_type, true);
          if (repeat == 2 && scenario != Scenario::drop_pad) {
            // Partial range together with active_num truncation.
            c.attrs.has_active_expert_range = true;
            c.attrs.active_expert_range = {0, std::max<int64_t>(1, c.attrs.expert_num / 2)};
            c.attrs.active_num = rng.integer(1, 4);
            c.scale = Tensor();
          }
          SCOPED_TRACE(::testing::Message()
                       << dtype_name(dtype) << ' ' << scenario_name(scenario) << " row_idx_type "
                       << row_idx_type << " repeat " << repeat);
          for (const testing::Runner& runner :
               {testing::all_runners()[0], testing::all_runners().back()}) {
            ForwardResult r = testing::run_forward(c, runner);
            ASSERT_TRUE(r.status.is_ok()) << r.status.message();
            const int64_t N = c.x.shape[0], K = c.expert_idx.shape[1], H = c.x.shape[1];
            Tensor g = Tensor::floats(dtype, r.expanded_x.shape,
                                      random_values(rng, r.expanded_x.numel(), true));
            const double forward = dot(r.expanded_x, g, g.numel());

            // Routed pairs and the rows that hold data.
            const std::vector<int32_t> ids = c.expert_idx.values<int32_t>();
            const int64_t s = r.plan.range_start, e = r.plan.range_end;
            const int64_t routed = std::count_if(ids.begin(), ids.end(),
                                                 [&](int32_t id) { return id >= s && id < e; });
            std::vector<int32_t> gather = r.expanded_row_idx.values<int32_t>();
            if (row_idx_type == 1) {  // scatter -> gather: entry d < routed holds the flat position
              std::vector<int32_t> converted(gather.size(), -1);
              for (int64_t d = 0; d < routed; ++d)
                converted[size_t(gather[size_t(d)])] = int32_t(d);
              gather = converted;
            }
            double backward;
            if (c.attrs.drop_pad_mode == 1) {
              backward = backward_dot(c.x, g, gather, K, 1, 0,
                                      {c.attrs.expert_num, c.attrs.expert_capacity, H});
            } else {
              const int64_t rows = std::min(r.plan.row_limit, routed);
              if (rows < routed)  // cut by active_num: the active scenario skips indices >= rows
                backward = backward_dot(c.x, g, gather, K, 0, rows, {rows, H});
              else
                backward = backward_dot(c.x, g, gather, K, 0, 0, {N * K, H});
            }
            EXPECT_EQ(forward, backward) << runner.name();
            nonzero += forward != 0;
            ++total;
          }
        }
  EXPECT_GT(nonzero, total / 2);
}

TEST(RoutingRandom, AdjointIdentityHoldsForEveryV2Configuration) {
  Random rng(23);
  int nonzero = 0, total = 0;
  for (DType dtype : kDtypes)
    for (int mode : {0, 1, 2})
      for (int repeat = 0; repeat < 4; ++repeat) {
        V2Case c = make_v2_case(rng, dtype, mode, true);
        for (const testing::Runner& runner :
             {testing::all_runners()[0], testing::all_runners().back()}) {
          V2Result r = testing::run_v2(c, runner);
          ASSERT_TRUE(r.status.is_ok()) << r.status.message();
          const int64_t K = c.expert_idx.shape[1], H = c.x.shape[1];
          Tensor g = Tensor::floats(dtype, r.expanded_x.shape,
                                    random_values(rng, r.expanded_x.numel(), true));
          const double forward = dot(r.expanded_x, g, g.numel());
          const std::vector<int32_t> row_idx = r.expanded_row_idx.values<int32_t>();
          double backward;
          if (mode == 2)
            backward = backward_dot(c.x, g, row_idx, K, 1, 0,
                                    {c.attrs.expert_num, c.attrs.expert_capacity, H});
          else
            backward =
                backward_dot(c.x, g, row_idx, K, 0, c.attrs.active_num, {r.expanded_x.shape[0], H});
          EXPECT_EQ(forward, backward)
              << dtype_name(dtype) << " mode " << mode << " on " << runner.name();
          nonzero += forward != 0;
          ++total;
        }
      }
  EXPECT_GT(nonzero, total / 2);
}

// --- empty inputs and not-produced outputs ------------------------------------------------------

TEST(RoutingRandom, EmptyInputsGiveShapedOutputsAndZeroCounts) {
  for (const testing::Runner& runner : testing::all_runners()) {
    SCOPED_TRACE(runner.name());
    // V2, N = 0, dropless with counts.
    V2Case a;
    a.x = Tensor(DType::float16, {0, 4});
    a.expert_idx = Tensor(DType::int32, {0, 2});
    a.attrs.expert_num = 3;
    a.attrs.expert_tokens_count_or_cumsum_flag = 2;
    V2Result ra = testing::run_v2(a, runner);
    ASSERT_TRUE(ra.status.is_ok()) << ra.status.message();
    EXPECT_EQ(ra.expanded_x.shape, (std::vector<int64_t>{0, 4}));
    EXPECT_EQ(ra.expanded_row_idx.shape, (std::vector<int64_t>{0}));
    EXPECT_EQ(ra.counts.values<int32_t>(), (std::vector<int32_t>{0, 0, 0}));
    // V2, N = 0, drop-pad (valid: expert_capacity <= N is only checked for N > 0).
    V2Case b = a;
    b.attrs.drop_pad_mode = 1;
    b.attrs.expert_capacity = 2;
    b.attrs.expert_tokens_before_capacity_flag = true;
    V2Result rb = testing::run_v2(b, runner);
    ASSERT_TRUE(rb.status.is_ok()) << rb.status.message();
    EXPECT_EQ(rb.expanded_x.shape, (std::vector<int64_t>{3, 2, 4}));
    EXPECT_EQ(rb.expanded_x.float_values(), std::vector<float>(24, 0.0f));
    EXPECT_EQ(rb.before_capacity.values<int32_t>(), (std::vector<int32_t>{0, 0, 0}));
    // V2, K = 0.
    V2Case k0;
    k0.x = Tensor::floats(DType::float32, {3, 2}, {1, 2, 3, 4, 5, 6});
    k0.expert_idx = Tensor(DType::int32, {3, 0});
    k0.attrs.expert_num = 2;
    k0.attrs.expert_tokens_count_or_cumsum_flag = 1;
    V2Result rk = testing::run_v2(k0, runner);
    ASSERT_TRUE(rk.status.is_ok()) << rk.status.message();
    EXPECT_EQ(rk.expanded_x.shape, (std::vector<int64_t>{0, 2}));
    EXPECT_EQ(rk.counts.values<int32_t>(), (std::vector<int32_t>{0, 0}));
    // Torch API, N = 0, every count type, dynamic quant.
    for (int64_t type : {0, 1, 2}) {
      ForwardCase c;
      c.x = Tensor(DType::bfloat16, {0, 3});
      c.expert_idx = Tensor(DType::int32, {0, 4});
      c.topk_weight = Tensor(DType::float32, {0, 4});
      c.attrs.expert_num = 5;
      c.attrs.quant_mode = 1;
      c.attrs.expert_tokens_num_flag = true;
      c.attrs.expert_tokens_num_type = type;
      ForwardResult r = testing::run_forward(c, runner);
      ASSERT_TRUE(r.status.is_ok()) << r.status.message();
      EXPECT_EQ(r.expanded_x.shape, (std::vector<int64_t>{0, 3}));
      EXPECT_EQ(r.expanded_scale.shape, (std::vector<int64_t>{0}));
      EXPECT_EQ(r.expanded_topk_weight.shape, (std::vector<int64_t>{0, 1}));
      EXPECT_EQ(r.counts.values<int64_t>(), std::vector<int64_t>(type == 2 ? 10 : 5, 0))
          << "type " << type;
    }
    // Torch API, N = 0, drop-pad: every slot zero.
    ForwardCase d;
    d.x = Tensor(DType::float32, {0, 2});
    d.expert_idx = Tensor(DType::int32, {0, 1});
    d.attrs.expert_num = 2;
    d.attrs.drop_pad_mode = 1;
    d.attrs.expert_capacity = 3;
    ForwardResult rd = testing::run_forward(d, runner);
    ASSERT_TRUE(rd.status.is_ok()) << rd.status.message();
    EXPECT_EQ(rd.expanded_x.float_values(), std::vector<float>(12, 0.0f));
    // H = 0: rows are empty, the index map is still complete.
    ForwardCase h0;
    h0.x = Tensor(DType::float32, {2, 0});
    h0.expert_idx = Tensor::int32s({2, 2}, {1, 0, 1, 1});
    h0.attrs.expert_num = 2;
    h0.attrs.quant_mode = 1;
    ForwardResult rh = testing::run_forward(h0, runner);
    ASSERT_TRUE(rh.status.is_ok()) << rh.status.message();
    EXPECT_EQ(rh.expanded_x.shape, (std::vector<int64_t>{4, 0}));
    EXPECT_EQ(rh.expanded_row_idx.values<int32_t>(), (std::vector<int32_t>{1, 0, 2, 3}));
    EXPECT_EQ(rh.expanded_scale.values<float>(), (std::vector<float>{0, 0, 0, 0}));
  }
}

TEST(RoutingRandom, NotProducedOutputsPassedWithDataAreZeroFilled) {
  for (const testing::Runner& runner : testing::all_runners()) {
    SCOPED_TRACE(runner.name());
    Tensor x = Tensor::floats(DType::float32, {2, 2}, {1, 2, 3, 4});
    Tensor ids = Tensor::int32s({2, 1}, {1, 0});
    Tensor scale = Tensor::floats(DType::float32, {1}, {1.0f});
    MoeInitRoutingAttrs attrs;
    attrs.expert_num = 3;
    attrs.quant_mode = 0;  // no expanded_scale; flag off: no counts
    Tensor expanded_x(DType::int8, {2, 2}), row_idx(DType::int32, {2}), counts(DType::int64, {3}),
        expanded_scale(DType::float32, {2}), topk(DType::float32, {0});
    for (Tensor* t : {&expanded_x, &row_idx, &counts, &expanded_scale}) t->poison();
    Status s = moe_init_routing(x.view(), ids.view(), scale.view(), TensorView(), TensorView(),
                                attrs, expanded_x.view(), row_idx.view(), counts.view(),
                                expanded_scale.view(), topk.view(), runner.config());
    ASSERT_TRUE(s.is_ok()) << s.message();
    EXPECT_EQ(expanded_x.values<int8_t>(), (std::vector<int8_t>{3, 4, 1, 2}));
    EXPECT_EQ(counts.values<int64_t>(), (std::vector<int64_t>{0, 0, 0}));
    EXPECT_EQ(expanded_scale.values<float>(), (std::vector<float>{0, 0}));

    MoeInitRoutingV2Attrs v2;
    v2.expert_num = 3;  // flag 0: counts not produced; mode 0: before-capacity not produced
    Tensor v2_x(DType::float32, {2, 2}), v2_counts(DType::int32, {3}), v2_before(DType::int32, {3});
    v2_counts.poison();
    v2_before.poison();
    s = moe_init_routing_v2(x.view(), ids.view(), v2, v2_x.view(), row_idx.view(), v2_counts.view(),
                            v2_before.view(), runner.config());
    ASSERT_TRUE(s.is_ok()) << s.message();
    EXPECT_EQ(v2_x.float_values(), (std::vector<float>{3, 4, 1, 2}));
    EXPECT_EQ(v2_counts.values<int32_t>(), (std::vector<int32_t>{0, 0, 0}));
    EXPECT_EQ(v2_before.values<int32_t>(), (std::vector<int32_t>{0, 0, 0}));
  }
}

TEST(RoutingRandom, V2AcceptsIdsAboveExpertNumWhenItIsUnused) {
  // Dropless without counts: ids need only be >= 0 (docs/decisions.md §6).
  V2Case c;
  c.x = Tensor::floats(DType::float32, {3, 1}, {1, 2, 3});
  c.expert_idx = Tensor::int32s({3, 1}, {1000000, 4, 0});
  c.attrs.expert_num = 2;
  for (const testing::Runner& runner : testing::all_runners()) {
    V2Result r = testing::run_v2(c, runner);
    ASSERT_TRUE(r.status.is_ok()) << r.status.message();
    EXPECT_EQ(r.expanded_row_idx.values<int32_t>(), (std::vector<int32_t>{2, 1, 0}))
        << runner.name();
    EXPECT_EQ(r.expanded_x.float_values(), (std::vector<float>{3, 2, 1})) << runner.name();
  }
}

}  // namespace
}  // namespace moe_routing
