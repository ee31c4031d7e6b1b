// moe_finalize_routing and its grad into outputs whose first row starts 0, 16, 32 or 48 bytes past
// a 64-byte boundary, on every ISA against the reference, bit for bit: the streamed column loops
// begin each row with a cached head up to the ISA's stream alignment (32 bytes with AVX2, 64 with
// AVX-512), which moves the vector steps against the columns of earlier passes (rows of more than
// kFinalizeTermsPerPass terms or pairs), and the one-pass atlas_a2 grad rows stream from every
// chunk's start.
#include <cstring>

#include "finalize_cases.h"

namespace moe_routing {
namespace {

using testing::FinalizeCase;
using testing::FinalizeGradCase;
using testing::FinalizeOptions;
using testing::FloatBuffer;
using testing::GradOptions;
using testing::GradResult;

/// Storage for `bytes` bytes starting `offset` bytes past a 64-byte boundary, poisoned.
class OffsetStorage {
 public:
  OffsetStorage(size_t bytes, int offset) : storage_(bytes + 128, 0x7f) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(storage_.data());
    data_ = storage_.data() + ((base + 63) / 64 * 64 - base) + size_t(offset);
  }
  uint8_t* data() { return data_; }

 private:
  std::vector<uint8_t> storage_;
  uint8_t* data_ = nullptr;
};

/// The forward on one runner into an output at `offset` bytes past a 64-byte boundary.
FloatBuffer run_finalize_at(FinalizeCase& c, const testing::Runner& runner, int offset) {
  FloatBuffer out(c.dtype, c.N * c.H);
  OffsetStorage storage(out.bytes.size(), offset);
  const Status s = moe_finalize_routing(
      c.inputs(), c.attrs, TensorView(storage.data(), c.dtype, {c.N, c.H}), runner.config());
  EXPECT_TRUE(s.is_ok()) << runner.name() << ": " << s.message();
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

}  // namespace
}  // namespace moe_routing
