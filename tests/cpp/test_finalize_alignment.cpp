// moe_finalize_routing and its grad into outputs whose first row starts 0, 16, 32 or 48 bytes past
// a 64-byte boundary, on every ISA against the reference, bit for bit: the streamed column loops
// begin each row with a cached head up to the ISA's stream alignment (32 bytes with AVX2, 64 with
// AVX-512), which moves the vector steps against the columns of earlier passes (rows of more than
// kFinalizeTermsPerPass terms or pairs), and the one-pass atlas_a2 grad rows stream from every
// chunk's start. Then every hidden size up to 70 and some around the vectors (32 columns with
// AVX-512), the ascend_950 fold and the 512-column groups, with random optional inputs and raw
// special values (NaN payloads, signalling NaNs, subnormals, -0, infinities) at every offset.
#include <cstring>
#include <iterator>
#include <memory>

#include "finalize_cases.h"

namespace moe_routing {
namespace {

using testing::FinalizeCase;
using testing::FinalizeGradCase;
using testing::FinalizeOptions;
using testing::FloatBuffer;
using testing::GradOptions;
using testing::GradResult;
using testing::OffsetStorage;

/// The forward on one runner into an output at `offset` bytes past a 64-byte boundary.
FloatBuffer run_finalize_at(FinalizeCase& c, const testing::Runner& runner, int offset) {
  FloatBuffer out(c.dtype, c.N * c.H);
  OffsetStorage storage(out.bytes.size(), offset);
  const Status s = moe_finalize_routing(
      c.inputs(), c.attrs, TensorView(storage.data(), c.dtype, {c.N, c.H}), runner.config());
  EXPECT_TRUE(s.is_ok()) << runner.name() << ": " << s.message();
  EXPECT_TRUE(storage.margins_untouched()) << runner.name() << ": a write outside out";
  if (!out.bytes.empty()) std::memcpy(out.data(), storage.data(), out.bytes.size());
  return out;
}

/// The grad on one runner with grad_expanded_x at `offset` bytes past a 64-byte boundary.
GradResult run_finalize_grad_at(FinalizeGradCase& c, const testing::Runner& runner, int offset) {
  GradResult r = testing::poisoned_grad_result(c);
  MoeFinalizeRoutingGradOutputs outputs = testing::grad_outputs(c, r);
  OffsetStorage storage(r.grad_expanded_x.bytes.size(), offset);
  outputs.grad_expanded_x.data = storage.data();
  const Status s = moe_finalize_routing_grad(c.inputs(), c.attrs, outputs, runner.config());
  EXPECT_TRUE(s.is_ok()) << runner.name() << ": " << s.message();
  EXPECT_TRUE(storage.margins_untouched()) << runner.name() << ": a write outside grad_expanded_x";
  if (!r.grad_expanded_x.bytes.empty())
    std::memcpy(r.grad_expanded_x.data(), storage.data(), r.grad_expanded_x.bytes.size());
  return r;
}

void expect_forward_matches_at_every_offset(FinalizeCase& c, const std::string& what) {
  const auto runners = testing::all_runners();
  const FloatBuffer expected = testing::run_finalize_case(c, runners[0]);
  for (int offset : {0, 16, 32, 48})
    for (size_t r = 1; r < runners.size(); ++r)
      EXPECT_TRUE(testing::bitwise_equal(expected, run_finalize_at(c, runners[r], offset)))
          << runners[r].name() << ' ' << what << " offset " << offset;
}

void expect_grad_matches_at_every_offset(FinalizeGradCase& c, const std::string& what) {
  const auto runners = testing::all_runners();
  const GradResult expected = testing::run_finalize_grad_case(c, runners[0]);
  for (int offset : {0, 16, 32, 48})
    for (size_t r = 1; r < runners.size(); ++r)
      EXPECT_TRUE(
          testing::grad_results_equal(expected, run_finalize_grad_at(c, runners[r], offset)))
          << runners[r].name() << ' ' << what << " offset " << offset;
}

std::string describe(DType dtype, Numerics numerics, int64_t h) {
  return std::string(dtype_name(dtype)) + ' ' + numerics_name(numerics) + " H=" + std::to_string(h);
}

/// Overwrites about `percent` % of the elements of each buffer with raw special bit patterns of
/// its dtype: NaNs with payloads, of either sign, signalling ones, infinities, -0, subnormals, the
/// largest finite values and rounding ties.
void fill_raw_specials(testing::Random& rng, std::initializer_list<FloatBuffer*> buffers,
                       int percent) {
  static const uint32_t kFloat32[] = {0x7fc00000u, 0x7fc12345u, 0xffc00001u, 0x7f800001u,
                                      0xff812345u, 0x7f800000u, 0xff800000u, 0x80000000u,
                                      0x00000001u, 0x807fffffu, 0x7f7fffffu, 0xff7fffffu,
                                      0x00800000u, 0x477fe000u, 0x3f808000u, 0x3f818000u};
  static const uint16_t kFloat16[] = {0x7e00, 0x7e01, 0xfe55, 0x7c01, 0xfd00, 0x7c00, 0xfc00,
                                      0x8000, 0x0001, 0x83ff, 0x7bff, 0xfbff, 0x0400, 0x3c01};
  static const uint16_t kBfloat16[] = {0x7fc0, 0x7fc1, 0xffa0, 0x7f81, 0xff81, 0x7f80, 0xff80,
                                       0x8000, 0x0001, 0x807f, 0x7f7f, 0xff7f, 0x0080, 0x3f81};
  for (FloatBuffer* b : buffers)
    for (int64_t e = 0; e < b->count(); ++e) {
      if (rng.integer(0, 99) >= percent) continue;
      uint8_t* at = b->bytes.data() + e * int64_t(dtype_size(b->dtype));
      if (b->dtype == DType::float32) {
        const uint32_t bits = kFloat32[rng.integer(0, std::size(kFloat32) - 1)];
        std::memcpy(at, &bits, sizeof bits);
      } else {
        const uint16_t bits = b->dtype == DType::float16
                                  ? kFloat16[rng.integer(0, std::size(kFloat16) - 1)]
                                  : kBfloat16[rng.integer(0, std::size(kBfloat16) - 1)];
        std::memcpy(at, &bits, sizeof bits);
      }
    }
}

/// Every hidden size up to 70, and `wide` ones.
std::vector<int64_t> hidden_sizes(std::initializer_list<int64_t> wide) {
  std::vector<int64_t> sizes;
  for (int64_t h = 1; h <= 70; ++h) sizes.push_back(h);
  sizes.insert(sizes.end(), wide);
  return sizes;
}

/// `fn(h, dtype_variant, numerics)` for every size of `sizes`, dtype and numerics, first with the
/// outputs written through the cache, then streamed.
template <class Fn>
void for_each_size_streamed_or_not(const std::vector<int64_t>& sizes, Fn fn) {
  for (bool streamed : {false, true}) {
    std::unique_ptr<testing::StreamingThresholdOverride> small;
    if (streamed) small = std::make_unique<testing::StreamingThresholdOverride>(1);
    for (int64_t h : sizes)
      for (const testing::DtypeVariant& d : testing::kFinalizeDtypes)
        for (Numerics numerics : testing::kFinalizeNumerics) fn(h, d, numerics);
  }
}

TEST(FinalizeAlignment, StreamedRowsOfManyTermsMatchTheReference) {
  // K beyond one pass: the running sums wait in a float buffer between passes, and the last
  // pass's streamed row starts with a cached head of single columns.
  testing::StreamingThresholdOverride small(1);
  testing::Random rng(4096);
  for (const testing::DtypeVariant& d : testing::kFinalizeDtypes)
    for (Numerics numerics : testing::kFinalizeNumerics)
      for (int64_t h : {200, 1000}) {
        FinalizeOptions o;
        o.scales = true, o.mixed_scales = d.mixed_scales, o.x1 = true, o.drop_fraction = 0.05;
        FinalizeCase c = testing::make_finalize_case(rng, d.dtype, 2, numerics, o, 3, 40, h);
        expect_forward_matches_at_every_offset(c, describe(d.dtype, numerics, h));
      }
}

TEST(FinalizeAlignment, StreamedRowsOfManyPairsMatchTheReference) {
  // Grad rows named by more pairs than one pass takes, streamed.
  testing::StreamingThresholdOverride small(1);
  testing::Random rng(4097);
  for (const testing::DtypeVariant& d : testing::kFinalizeDtypes)
    for (int64_t h : {200, 1000}) {
      GradOptions o;
      o.bias = true, o.grad_bias = true, o.mixed_scales = d.mixed_scales, o.drop_fraction = 0.0;
      FinalizeGradCase c =
          testing::make_finalize_grad_case(rng, d.dtype, 0, Numerics::atlas_a2, o, 30, 4, h);
      for (size_t p = 0; p < c.idx.size(); ++p)
        if (p % 4 != 3) c.idx[p] = 1;  // row 1 named by 90 pairs
      expect_grad_matches_at_every_offset(c, describe(d.dtype, Numerics::atlas_a2, h));
    }
}

TEST(FinalizeAlignment, StreamedOnePairRowsAcrossChunksMatchTheReference) {
  // atlas_a2 grad_scales of rows longer than one chunk (12264 float32 products with bias, 19616
  // 16-bit without): the one-pass rows stream from each chunk's start.
  testing::StreamingThresholdOverride small(1);
  testing::Random rng(12264);
  for (const testing::DtypeVariant& d : testing::kFinalizeDtypes)
    for (bool bias : {false, true}) {
      const int64_t h = d.dtype == DType::float32 ? 16400 : 19700;
      GradOptions o;
      o.bias = bias, o.mixed_scales = d.mixed_scales, o.drop_fraction = 0.0;
      FinalizeGradCase c =
          testing::make_finalize_grad_case(rng, d.dtype, 0, Numerics::atlas_a2, o, 2, 2, h);
      expect_grad_matches_at_every_offset(
          c, describe(d.dtype, Numerics::atlas_a2, h) + (bias ? " bias" : ""));
    }
}

TEST(FinalizeAlignment, EveryHiddenSizeWithRawSpecialValuesMatchesTheReference) {
  testing::Random rng(70);
  for_each_size_streamed_or_not(
      hidden_sizes({96, 127, 129, 160, 511, 513, 1000, 7184}),
      [&](int64_t h, const testing::DtypeVariant& d, Numerics numerics) {
        FinalizeOptions o;
        const int64_t x12 = rng.integer(0, 2), mode = rng.integer(0, 3);
        const bool v1 = mode == 0 && rng.integer(0, 3) == 0;
        o.x1 = v1 || x12 >= 1, o.x2 = x12 == 2, o.bias = v1 || rng.integer(0, 1) == 1;
        o.scales = v1 || d.mixed_scales || rng.integer(0, 3) > 0, o.mixed_scales = d.mixed_scales;
        o.special = !v1 && rng.integer(0, 1) == 1, o.duplicates = rng.integer(0, 2) == 0;
        const int64_t k = rng.integer(0, 5) == 0 ? rng.integer(33, 45) : rng.integer(1, 6);
        FinalizeCase c =
            testing::make_finalize_case(rng, d.dtype, mode, numerics, o, h > 1000 ? 2 : 3, k, h,
                                        v1 ? FinalizeRoutingApi::v1 : FinalizeRoutingApi::v2);
        if (rng.integer(0, 1) == 1)
          fill_raw_specials(
              rng,
              {&c.expanded_x, &c.x1, &c.x2, &c.bias, &c.scales, &c.x, &c.alpha1, &c.alpha2, &c.v},
              20);
        expect_forward_matches_at_every_offset(c, describe(d.dtype, numerics, h) +
                                                      " K=" + std::to_string(k) + " mode " +
                                                      std::to_string(mode) + (v1 ? " v1" : ""));
      });
}

TEST(FinalizeGradAlignment, EveryHiddenSizeWithRawSpecialValuesMatchesTheReference) {
  // Wide sizes around the ascend_950 fold (powers of two and one or a vector past them) and the
  // atlas_a2 groups; some rows named by many pairs.
  testing::Random rng(71);
  for_each_size_streamed_or_not(
      hidden_sizes({96,  127, 128, 129, 144,  255,  256,  257,  272,  300,  496,
                    511, 512, 513, 528, 1000, 1023, 1024, 1025, 1040, 1100, 7184}),
      [&](int64_t h, const testing::DtypeVariant& d, Numerics numerics) {
        GradOptions o;
        o.scales = d.mixed_scales || rng.integer(0, 3) > 0, o.bias = rng.integer(0, 1) == 1;
        o.expanded_x = rng.integer(0, 4) > 0;
        o.grad_scales = o.scales && o.expanded_x && rng.integer(0, 4) > 0;
        o.grad_bias = o.bias && rng.integer(0, 1) == 1;
        o.mixed_scales = d.mixed_scales, o.duplicates = rng.integer(0, 2) == 0;
        const int64_t n = h > 1000 ? 3 : rng.integer(0, 3) == 0 ? 24 : 6;
        FinalizeGradCase c = testing::make_finalize_grad_case(rng, d.dtype, rng.integer(0, 1),
                                                              numerics, o, n, rng.integer(1, 4), h);
        if (rng.integer(0, 4) == 0)
          for (int32_t& r : c.idx)
            if (r >= 0 && rng.integer(0, 1) == 1) r = 0;  // row 0 crowded
        if (rng.integer(0, 1) == 1)
          fill_raw_specials(rng, {&c.grad_y, &c.expanded_x, &c.scales, &c.bias}, 15);
        expect_grad_matches_at_every_offset(c, describe(d.dtype, numerics, h));
      });
}

}  // namespace
}  // namespace moe_routing
