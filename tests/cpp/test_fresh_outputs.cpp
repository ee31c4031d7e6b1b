// Outputs whose pages are not in memory yet - fresh from the OS, as the new tensors of a
// functional front end are, with huge pages asked for (core/memory_hints.h) as the torch binding
// asks, and without: the kernels' first stores fault the pages in, and the results must be the
// bits of the reference. Also the huge-page advice itself. Linux only (mmap, mincore, madvise,
// /proc/self/smaps).
#if defined(__linux__)

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MOE_ROUTING_TEST_SANITIZED_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MOE_ROUTING_TEST_SANITIZED_ALLOCATOR 1
#endif
#endif
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cases/finalize_cases.h"
#include "cases/grad_cases.h"
#include "cases/mappings.h"
#include "environment_variable.h"
#include "routing_cases.h"
#include "test_util.h"

namespace moe_routing {
namespace {

using testing::FloatBuffer;
using testing::ForwardCase;
using testing::ForwardResult;
using testing::Random;
using testing::Tensor;

/// An anonymous mapping nobody has written: every page of it is unfaulted. `offset` bytes into a
/// 2 MiB-aligned mapping, so that a test can place a buffer across huge-page boundaries.
class FreshMapping {
 public:
  explicit FreshMapping(size_t bytes, size_t offset = 0) : size_(bytes + offset + kAlign) {
    raw_ = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(raw_, MAP_FAILED);
    const uintptr_t aligned =
        (reinterpret_cast<uintptr_t>(raw_) + kAlign - 1) & ~uintptr_t(kAlign - 1);
    data_ = reinterpret_cast<char*>(aligned) + offset;
  }
  ~FreshMapping() { ::munmap(raw_, size_); }
  FreshMapping(const FreshMapping&) = delete;
  FreshMapping& operator=(const FreshMapping&) = delete;
  char* data() { return data_; }

 private:
  static constexpr size_t kAlign = size_t(2) << 20;
  size_t size_;
  void* raw_;
  char* data_;
};

/// Whether no page of [data, data + bytes) is in memory (mincore).
bool unfaulted(const void* data, size_t bytes) {
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(data) & ~(page - 1);
  const size_t pages = (reinterpret_cast<uintptr_t>(data) + bytes - first + page - 1) / page;
  std::vector<unsigned char> resident(pages);
  if (::mincore(reinterpret_cast<void*>(first), pages * page, resident.data()) != 0) return false;
  for (unsigned char r : resident)
    if (r & 1) return false;
  return true;
}

/// A fresh output of `bytes` at `offset` bytes past a 2 MiB boundary, unfaulted, with huge pages
/// asked for when `huge` (the buffer must be large enough for the advice to apply).
class FreshOutput {
 public:
  FreshOutput(size_t bytes, size_t offset, bool huge) : mapping_(bytes, offset) {
    EXPECT_GE(int64_t(bytes), detail::kHugePageAdviceMinBytes);
    if (huge) detail::advise_huge_pages(mapping_.data(), int64_t(bytes));
    EXPECT_TRUE(unfaulted(mapping_.data(), bytes));
  }
  char* data() { return mapping_.data(); }

 private:
  FreshMapping mapping_;
};

/// The bytes of `count` elements of `dtype` at `data`, for the bitwise comparisons.
FloatBuffer copy_of(const void* data, DType dtype, int64_t count) {
  FloatBuffer b(dtype, count);
  std::memcpy(b.data(), data, b.bytes.size());
  return b;
}

/// The VmFlags of the mapping that holds `address`, and whether they hold "hg" (MADV_HUGEPAGE).
std::string vm_flags(const void* address) { return testing::smaps_field(address, "VmFlags"); }
bool advised_huge(const void* address) {
  std::istringstream flags(vm_flags(address));
  std::string flag;
  while (flags >> flag)
    if (flag == "hg") return true;
  return false;
}

/// Turns the huge-page advice on or off for a scope (detail::set_huge_pages_enabled), restoring
/// the setting after.
class HugePagesSetting {
 public:
  explicit HugePagesSetting(bool enabled) : old_(detail::huge_pages_enabled()) {
    detail::set_huge_pages_enabled(enabled);
  }
  ~HugePagesSetting() { detail::set_huge_pages_enabled(old_); }

 private:
  bool old_;
};

TEST(MemoryHints, HugePageAdviceCoversTheAlignedInteriorOfLargeBuffersOnly) {
  const bool thp = std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good();
  const size_t huge = size_t(2) << 20;
  {
    const HugePagesSetting setting(true);
    ASSERT_TRUE(detail::huge_pages_enabled());
    // 4096 bytes past a 2 MiB boundary, 9 MiB long: the interior is [2 MiB, 8 MiB) from the
    // boundary, three huge pages; the head and the tail keep their pages.
    FreshMapping buffer(size_t(9) << 20, 4096);
    char* data = buffer.data();
    ASSERT_EQ(detail::advise_huge_pages(data, int64_t(9) << 20), thp);
    char* interior = data - 4096 + huge;
    EXPECT_EQ(advised_huge(interior), thp) << vm_flags(interior);
    EXPECT_EQ(advised_huge(interior + 2 * huge + huge - 1), thp) << vm_flags(interior + 2 * huge);
    EXPECT_FALSE(advised_huge(data)) << vm_flags(data);
    EXPECT_FALSE(advised_huge(interior - 1)) << vm_flags(interior - 1);
    EXPECT_FALSE(advised_huge(interior + 3 * huge)) << vm_flags(interior + 3 * huge);
    EXPECT_TRUE(unfaulted(data, size_t(9) << 20));  // the advice touches nothing
    // Memory already written (an allocator's reused heap) gets none: it faults no more.
    FreshMapping written(size_t(9) << 20);
    std::memset(written.data(), 1, size_t(9) << 20);
    EXPECT_FALSE(detail::advise_huge_pages(written.data(), int64_t(9) << 20));
    EXPECT_FALSE(advised_huge(written.data() + huge)) << vm_flags(written.data() + huge);
    // The allocator's main heap gets none, even where its pages are not in memory yet (glibc
    // serves a 9 MiB request there once the mmap threshold is above it).
    // (Sanitizers bring allocators of their own, which mallopt does not steer.)
#if defined(__GLIBC__) && !defined(MOE_ROUTING_TEST_SANITIZED_ALLOCATOR)
    ::mallopt(M_MMAP_THRESHOLD, 64 << 20);
    void* heap = std::malloc(size_t(9) << 20);
    ::mallopt(M_MMAP_THRESHOLD, 128 << 10);
    ASSERT_NE(heap, nullptr);
    EXPECT_FALSE(detail::advise_huge_pages(heap, int64_t(9) << 20));
    EXPECT_FALSE(advised_huge(static_cast<char*>(heap) + huge)) << vm_flags(heap);
    std::free(heap);
#endif
    // Below kHugePageAdviceMinBytes: no advice.
    FreshMapping small(size_t(detail::kHugePageAdviceMinBytes) - 1);
    EXPECT_FALSE(detail::advise_huge_pages(small.data(), detail::kHugePageAdviceMinBytes - 1));
    EXPECT_FALSE(advised_huge(small.data()));
    EXPECT_FALSE(detail::advise_huge_pages(nullptr, int64_t(9) << 20));
  }
  {
    const HugePagesSetting setting(false);
    EXPECT_FALSE(detail::huge_pages_enabled());
    FreshMapping buffer(size_t(9) << 20);
    EXPECT_FALSE(detail::advise_huge_pages(buffer.data(), int64_t(9) << 20));
    EXPECT_FALSE(advised_huge(buffer.data())) << vm_flags(buffer.data());
  }
}

TEST(MemoryHints, TheEnvironmentTurnsHugePagesOffWithZeroOnly) {
  EXPECT_TRUE(detail::huge_pages_from_env(nullptr));  // unset: the default, on
  EXPECT_FALSE(detail::huge_pages_from_env("0"));
  EXPECT_TRUE(detail::huge_pages_from_env("1"));
}

// MOE_ROUTING_HUGE_PAGES reads as the library's other variables do (a whole number, surrounding
// blanks allowed): 0 off, 1 on. Before, anything but exactly "0" silently left the advice on:
// "false", "off", "no", " 0" and "0 " all did, with nothing said.
TEST(MemoryHints, TheHugePagesVariableIsZeroOrOneAndAnythingElseWarns) {
  for (const char* off : {"0", " 0", "0 ", "\t0\t", "00", "+0", "-0"}) {
    ::testing::internal::CaptureStderr();
    EXPECT_FALSE(detail::huge_pages_from_env(off)) << "'" << off << "'";
    EXPECT_EQ(::testing::internal::GetCapturedStderr(), "") << "'" << off << "'";
  }
  for (const char* on : {"1", " 1 ", "01"}) {
    ::testing::internal::CaptureStderr();
    EXPECT_TRUE(detail::huge_pages_from_env(on)) << "'" << on << "'";
    EXPECT_EQ(::testing::internal::GetCapturedStderr(), "") << "'" << on << "'";
  }
  for (const char* other : {"", " ", "false", "off", "no", "true", "2", "-1", "0x0", "0x", "1.0",
                            "99999999999999999999"}) {
    ::testing::internal::CaptureStderr();
    EXPECT_TRUE(detail::huge_pages_from_env(other)) << "'" << other << "'";  // the default
    EXPECT_EQ(::testing::internal::GetCapturedStderr(),
              std::string("moe_routing: MOE_ROUTING_HUGE_PAGES must be 0 or 1, got \"") + other +
                  "\"; using the default (1: huge pages asked for)\n")
        << "'" << other << "'";
  }
}

// MOE_ROUTING_HUGE_PAGES is read once: a getenv on every allocation raced other threads' setenv
// (undefined behaviour; the torch binding's calls run without the GIL while Python threads may set
// os.environ). After the first use only set_huge_pages_enabled changes the setting.
TEST(MemoryHints, HugePagesFollowTheSetterNotTheEnvironmentAfterTheFirstUse) {
  const HugePagesSetting restore(detail::huge_pages_enabled());  // the first use, at the latest
  for (const bool enabled : {true, false}) {
    detail::set_huge_pages_enabled(enabled);
    for (const char* value : {"0", "1", static_cast<const char*>(nullptr)}) {
      const EnvironmentVariable variable("MOE_ROUTING_HUGE_PAGES", value);
      EXPECT_EQ(detail::huge_pages_enabled(), enabled) << (value ? value : "(unset)");
    }
  }
}

// The kernels into fresh outputs of a few MiB, each written both ways: with the streaming
// threshold forced below the output (non-temporal stores) and far above it (cached stores), into
// pages with huge pages asked for and without, on every ISA; each result is compared with the
// reference bit for bit.
struct WriteVariant {
  CpuIsa isa;
  bool stream, huge;
  std::string name() const {
    return std::string(cpu_isa_name(isa)) + (stream ? " streaming" : " cached") +
           (huge ? " huge pages" : " 4 KiB pages");
  }
};

std::vector<WriteVariant> write_variants() {
  std::vector<WriteVariant> variants;
  for (CpuIsa isa : kCpuIsas)
    if (cpu_isa_available(isa))
      for (bool stream : {false, true})
        for (bool huge : {false, true}) variants.push_back({isa, stream, huge});
  return variants;
}

ExecConfig config_of(const WriteVariant& v) {
  ExecConfig config;
  config.isa = v.isa;
  config.num_threads = 2;
  return config;
}

/// The streaming threshold a variant runs under: 1 MiB (every output here streams) or 1 TiB.
int64_t threshold_of(const WriteVariant& v) {
  return v.stream ? int64_t(1) << 20 : int64_t(1) << 40;
}

TEST(FreshOutputs, BackwardIntoUnfaultedPagesEqualsTheReference) {
  testing::Random rng(71);
  for (DType dtype : {DType::bfloat16, DType::float16, DType::float32}) {
    const int64_t h = dtype == DType::float32 ? 1029 : 2053;  // odd: unaligned rows too
    const int64_t n = (int64_t(5) << 20) / (h * int64_t(dtype_size(dtype)));  // ~5 MiB out
    testing::GradCase c = testing::make_grad_case(rng, GradScenario::dropless, dtype, n, 2, h);
    FloatBuffer expected;
    ASSERT_TRUE(
        testing::run_grad(c, {Backend::reference, CpuIsa::automatic, 1}, &expected).is_ok());
    for (const WriteVariant& v : write_variants()) {
      const testing::StreamingThresholdOverride threshold(threshold_of(v));
      FreshOutput out(expected.bytes.size(), 64, v.huge);
      const Status s = moe_init_routing_grad(c.grad_view(), c.idx_view(), c.attrs,
                                             TensorView(out.data(), dtype, {n, h}), config_of(v));
      ASSERT_TRUE(s.is_ok()) << s.message();
      EXPECT_TRUE(testing::bitwise_equal(expected, copy_of(out.data(), dtype, n * h)))
          << dtype_name(dtype) << ' ' << v.name();
    }
  }
}

TEST(FreshOutputs, ForwardIntoUnfaultedPagesEqualsTheReference) {
  Random rng(72);
  const int64_t N = 640, K = 4, H = 1031, E = 12;  // bf16 rows at every 16-byte alignment
  struct Layout {
    int64_t row_idx_type, drop_pad;
  };
  for (const Layout layout : {Layout{0, 0}, Layout{1, 0}, Layout{0, 1}}) {
    ForwardCase c;
    c.x = Tensor::floats(DType::bfloat16, {N, H}, testing::random_values(rng, N * H, false));
    std::vector<int32_t> ids(size_t(N * K));
    for (int32_t& id : ids) id = int32_t(rng.integer(layout.drop_pad ? 0 : -1, E - 1));
    c.expert_idx = Tensor::int32s({N, K}, ids);
    c.attrs.expert_num = E;
    c.attrs.row_idx_type = layout.row_idx_type;
    c.attrs.drop_pad_mode = layout.drop_pad;
    c.attrs.expert_capacity = layout.drop_pad ? 200 : -1;  // some slots empty, some pairs dropped
    const ForwardResult expected =
        testing::run_forward(c, {Backend::reference, CpuIsa::automatic, 1});
    ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();
    for (const WriteVariant& v : write_variants()) {
      const testing::StreamingThresholdOverride threshold(threshold_of(v));
      ForwardResult got;
      ASSERT_TRUE(testing::plan_outputs(c, &got)) << got.status.message();
      const size_t bytes = got.expanded_x.bytes.size();
      FreshOutput fresh(bytes, 16, v.huge);
      TensorView ex = got.expanded_x.view();
      ex.data = fresh.data();
      got.status = moe_init_routing(
          c.x.view(), c.expert_idx.view(), c.scale.view(), c.offset.view(), c.topk_weight.view(),
          c.attrs, ex, got.expanded_row_idx.view(), got.counts.view(), got.expanded_scale.view(),
          got.expanded_topk_weight.view(), config_of(v));
      ASSERT_TRUE(got.status.is_ok()) << got.status.message();
      std::memcpy(got.expanded_x.bytes.data(), fresh.data(), bytes);
      EXPECT_TRUE(testing::same_result(expected, got))
          << v.name() << ", row_idx_type " << layout.row_idx_type << ", drop_pad "
          << layout.drop_pad;
    }
  }
}

TEST(FreshOutputs, CombineIntoUnfaultedPagesEqualsTheReference) {
  testing::Random rng(73);
  for (const testing::DtypeVariant& d : testing::kFinalizeDtypes) {
    testing::FinalizeOptions o;
    o.scales = true, o.x1 = true, o.mixed_scales = d.mixed_scales;
    const int64_t h = 1031, n = (int64_t(5) << 20) / (h * int64_t(dtype_size(d.dtype)));
    testing::FinalizeCase c =
        testing::make_finalize_case(rng, d.dtype, 2, Numerics::atlas_a2, o, n, 2, h);
    FloatBuffer expected;
    ASSERT_TRUE(
        testing::run_finalize(c, {Backend::reference, CpuIsa::automatic, 1}, &expected).is_ok());
    for (const WriteVariant& v : write_variants()) {
      const testing::StreamingThresholdOverride threshold(threshold_of(v));
      FreshOutput out(expected.bytes.size(), 32, v.huge);
      const Status s = moe_finalize_routing(c.inputs(), c.attrs,
                                            TensorView(out.data(), c.dtype, {n, h}), config_of(v));
      ASSERT_TRUE(s.is_ok()) << s.message();
      EXPECT_TRUE(testing::bitwise_equal(expected, copy_of(out.data(), c.dtype, n * h)))
          << dtype_name(d.dtype) << (d.mixed_scales ? " (float32 scales) " : " ") << v.name();
    }
  }
}

TEST(FreshOutputs, CombineGradIntoUnfaultedPagesEqualsTheReference) {
  testing::Random rng(74);
  for (const testing::DtypeVariant& d : testing::kFinalizeDtypes) {
    testing::GradOptions o;
    o.mixed_scales = d.mixed_scales;
    const int64_t h = 1031, pairs = (int64_t(6) << 20) / (h * int64_t(dtype_size(d.dtype)));
    testing::FinalizeGradCase c;
    do {  // a case whose grad_expanded_x gets the advice (active_num may cut rows)
      c = testing::make_finalize_grad_case(rng, d.dtype, 0, Numerics::atlas_a2, o, pairs / 2, 2, h);
    } while (c.rows * c.H * int64_t(dtype_size(c.dtype)) < detail::kHugePageAdviceMinBytes);
    testing::GradResult expected;
    ASSERT_TRUE(testing::run_finalize_grad(c, {Backend::reference, CpuIsa::automatic, 1}, &expected)
                    .is_ok());
    for (const WriteVariant& v : write_variants()) {
      const testing::StreamingThresholdOverride threshold(threshold_of(v));
      testing::GradResult got = testing::poisoned_grad_result(c);
      MoeFinalizeRoutingGradOutputs outputs = testing::grad_outputs(c, got);
      const size_t bytes = got.grad_expanded_x.bytes.size();
      FreshOutput fresh(bytes, 48, v.huge);
      outputs.grad_expanded_x.data = fresh.data();
      const Status s = moe_finalize_routing_grad(c.inputs(), c.attrs, outputs, config_of(v));
      ASSERT_TRUE(s.is_ok()) << s.message();
      std::memcpy(got.grad_expanded_x.data(), fresh.data(), bytes);
      EXPECT_TRUE(testing::as_assertion(testing::difference(expected, got)))
          << dtype_name(d.dtype) << (d.mixed_scales ? " (float32 scales) " : " ") << v.name();
    }
  }
}

}  // namespace
}  // namespace moe_routing

#endif  // defined(__linux__)
