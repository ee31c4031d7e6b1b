// Buffers placed where an adversary would place them (issue 17, items 2 and 11): an output that
// shares bytes with an input or with another output (the output buffer equal to x, grad_x inside
// grad_expanded_x, a one-element overlap), and buffers at addresses that are not a multiple of
// their element size. Both are refused before any data is read, by the one validation every
// operator runs (ops/validation.h), so the C++ API and C-ABI phase one give the same message and
// nothing is written; adjacent buffers, inputs sharing bytes with each other, and byte-sized or
// empty tensors at odd addresses are accepted. docs/reliability.md cites these tests.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "c_api_handles.h"
#include "moe_routing/moe_routing.hpp"

namespace moe_routing::testing {
namespace {

constexpr const char* kOverlapRule =
    " (an output may share no byte with an input or another output), got ";

/// Storage for the buffers of one test, 8-byte aligned, with every byte 0x5A until written.
struct Arena {
  std::vector<uint64_t> words;
  explicit Arena(size_t bytes) : words((bytes + 7) / 8, 0x5A5A5A5A5A5A5A5Aull) {}
  unsigned char* at(size_t offset) {
    return reinterpret_cast<unsigned char*>(words.data()) + offset;
  }
  std::vector<unsigned char> bytes() const {
    const auto* p = reinterpret_cast<const unsigned char*>(words.data());
    return std::vector<unsigned char>(p, p + words.size() * 8);
  }
};

/// moe_init_routing_v2, dropless, 4 tokens of hidden 2, top_k 1, no counts: x, expert_idx,
/// expanded_x and expanded_row_idx at the given byte offsets of one arena (the ids written
/// there; x's values too unless x is placed where an output is).
struct V2Placement {
  size_t x = 0, expert_idx = 64, expanded_x = 128, expanded_row_idx = 192;
};

struct V2Outcome {
  mrStatus phase_one = MR_SUCCESS, phase_two = MR_SUCCESS;
  std::string message;
  std::vector<unsigned char> before, after;  // the arena around the call
  std::vector<float> expanded_x;
  std::vector<int32_t> expanded_row_idx;
};

V2Outcome run_v2(const V2Placement& at) {
  Arena arena(256);
  const float x_values[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const int32_t ids[4] = {1, 0, 1, 0};
  std::memcpy(arena.at(at.x), x_values, sizeof x_values);
  std::memcpy(arena.at(at.expert_idx), ids, sizeof ids);
  TensorHandle x = tensor_handle(arena.at(at.x), MR_FLOAT32, {4, 2});
  TensorHandle idx = tensor_handle(arena.at(at.expert_idx), MR_INT32, {4, 1});
  TensorHandle out = tensor_handle(arena.at(at.expanded_x), MR_FLOAT32, {4, 2});
  TensorHandle row_idx = tensor_handle(arena.at(at.expanded_row_idx), MR_INT32, {4});
  V2Outcome o;
  o.before = arena.bytes();
  uint64_t workspace_size = 0;
  mrExecutor* executor = nullptr;
  o.phase_one = mrMoeInitRoutingV2GetWorkspaceSize(x.get(), idx.get(), 0, 0, 0, 0, 0, false,
                                                   out.get(), row_idx.get(), nullptr, nullptr,
                                                   &workspace_size, &executor);
  if (o.phase_one == MR_SUCCESS) {
    std::vector<unsigned char> workspace(static_cast<size_t>(workspace_size));
    o.phase_two = mrMoeInitRoutingV2(workspace.data(), workspace_size, executor, nullptr);
    if (o.phase_two != MR_SUCCESS) o.message = mrGetLastErrorMessage();
  } else {
    o.message = mrGetLastErrorMessage();
    EXPECT_EQ(executor, nullptr);
  }
  o.after = arena.bytes();
  o.expanded_x.resize(8);
  std::memcpy(o.expanded_x.data(), arena.at(at.expanded_x), 32);
  o.expanded_row_idx.resize(4);
  std::memcpy(o.expanded_row_idx.data(), arena.at(at.expanded_row_idx), 16);
  return o;
}

/// Expects phase one to refuse the placement with `message` and nothing to be written.
void expect_refused(const V2Placement& at, const std::string& message) {
  const V2Outcome o = run_v2(at);
  EXPECT_EQ(o.phase_one, MR_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(o.message, message);
  EXPECT_EQ(o.before, o.after) << "a refused call wrote into a buffer";
}

TEST(AdversarialOverlap, AnOutputEqualToAnInputIsRefused) {
  V2Placement at;
  at.expanded_x = at.x;  // the C ABI with the output buffer equal to x
  expect_refused(at, std::string("moe_init_routing_v2: expanded_x must not overlap x") +
                         kOverlapRule + "32 shared bytes");
  at = V2Placement();
  at.expanded_row_idx = at.expert_idx;  // same size, another dtype's view of the same bytes
  expect_refused(at, std::string("moe_init_routing_v2: expanded_row_idx must not overlap "
                                 "expert_idx") +
                         kOverlapRule + "16 shared bytes");
}

TEST(AdversarialOverlap, OneSharedElementIsRefused) {
  V2Placement at;
  at.expanded_x = at.x + 28;  // expanded_x's first element is x's last
  expect_refused(at, std::string("moe_init_routing_v2: expanded_x must not overlap x") +
                         kOverlapRule + "4 shared bytes");
}

TEST(AdversarialOverlap, OutputsMustNotOverlapEachOther) {
  V2Placement at;
  at.expanded_row_idx = at.expanded_x + 16;
  expect_refused(at, std::string("moe_init_routing_v2: expanded_row_idx must not overlap "
                                 "expanded_x") +
                         kOverlapRule + "16 shared bytes");
}

TEST(AdversarialOverlap, AdjacentBuffersAreAccepted) {
  V2Placement packed;  // every buffer right after the previous one
  packed.x = 0;
  packed.expert_idx = 32;
  packed.expanded_x = 48;
  packed.expanded_row_idx = 80;
  const V2Outcome o = run_v2(packed);
  ASSERT_EQ(o.phase_one, MR_SUCCESS) << o.message;
  ASSERT_EQ(o.phase_two, MR_SUCCESS) << o.message;
  EXPECT_EQ(o.expanded_x, (std::vector<float>{3, 4, 7, 8, 1, 2, 5, 6}));
  EXPECT_EQ(o.expanded_row_idx, (std::vector<int32_t>{2, 0, 3, 1}));
}

// The backward with out = g[:N] (issue 17's `moe_init_routing_grad(g, idx, 3, out=g[:6])`, here
// through the C++ API): grad_x inside grad_expanded_x, or over expanded_row_idx.
TEST(AdversarialOverlap, GradXInsideItsInputsIsRefused) {
  std::vector<float> g = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // [6, 2]
  std::vector<int32_t> idx = {0, 1, 2, 3, 4, 5};
  const std::vector<float> g_before = g;
  MoeInitRoutingGradAttrs attrs;
  attrs.top_k = 3;
  const TensorView g_view(g.data(), DType::float32, {6, 2});
  const TensorView idx_view(idx.data(), DType::int32, {6});
  Status s = moe_init_routing_grad(g_view, idx_view, attrs,
                                   TensorView(g.data() + 4, DType::float32, {2, 2}), ExecConfig());
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_EQ(s.message(), std::string("moe_init_routing_grad: grad_x must not overlap "
                                     "grad_expanded_x") +
                             kOverlapRule + "16 shared bytes");
  EXPECT_EQ(g, g_before);
  s = moe_init_routing_grad(g_view, idx_view, attrs,
                            TensorView(idx.data() + 2, DType::float32, {2, 2}), ExecConfig());
  EXPECT_EQ(s.message(), std::string("moe_init_routing_grad: grad_x must not overlap "
                                     "expanded_row_idx") +
                             kOverlapRule + "16 shared bytes");
  EXPECT_EQ(idx, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
}

// An output the configuration does not produce but that is given a buffer is filled with zeros,
// so it may not overlap either.
TEST(AdversarialOverlap, AZeroFilledOutputMustNotOverlapAnInput) {
  std::vector<float> x = {1, 2, 3, 4};
  std::vector<int32_t> ids = {0, 1};
  std::vector<float> expanded_x(4);
  std::vector<int32_t> row_idx(2);
  MoeInitRoutingV2Attrs attrs;  // no count flag: expert_tokens_count_or_cumsum is not produced
  attrs.expert_num = 1;
  const Status s = moe_init_routing_v2(
      TensorView(x.data(), DType::float32, {2, 2}), TensorView(ids.data(), DType::int32, {2, 1}),
      attrs, TensorView(expanded_x.data(), DType::float32, {2, 2}),
      TensorView(row_idx.data(), DType::int32, {2}), TensorView(ids.data(), DType::int32, {1}),
      TensorView(), ExecConfig());
  EXPECT_EQ(s.message(), std::string("moe_init_routing_v2: expert_tokens_count_or_cumsum must not "
                                     "overlap expert_idx") +
                             kOverlapRule + "4 shared bytes");
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1}));
}

// Inputs are only read, so they may share bytes: a per-token scale that is a column of x.
TEST(AdversarialOverlap, InputsMayShareBytes) {
  std::vector<float> x = {1, 2, 3, 4, 5, 6};  // [3, 2]; the scale is x's first three floats
  std::vector<float> scale_copy(x.begin(), x.begin() + 3);
  std::vector<int32_t> ids = {2, 0, 1};
  MoeInitRoutingAttrs attrs;
  attrs.expert_num = 3;
  auto run = [&](const float* scale, std::vector<float>* expanded_scale) {
    std::vector<float> expanded_x(6);
    std::vector<int32_t> row_idx(3);
    expanded_scale->assign(3, -1.0f);
    const Status s = moe_init_routing(
        TensorView(x.data(), DType::float32, {3, 2}), TensorView(ids.data(), DType::int32, {3, 1}),
        TensorView(scale, DType::float32, {3}), TensorView(), TensorView(), attrs,
        TensorView(expanded_x.data(), DType::float32, {3, 2}),
        TensorView(row_idx.data(), DType::int32, {3}), TensorView(),
        TensorView(expanded_scale->data(), DType::float32, {3}), TensorView(), ExecConfig());
    EXPECT_TRUE(s.is_ok()) << s.message();
  };
  std::vector<float> shared, separate;
  run(x.data(), &shared);
  run(scale_copy.data(), &separate);
  EXPECT_EQ(shared, separate);
  EXPECT_EQ(shared, (std::vector<float>{2, 3, 1}));
}

// --- item 11: alignment -----------------------------------------------------------------------

TEST(AdversarialAlignment, BuffersAtOddAddressesAreRefusedInPhaseOne) {
  V2Placement at;
  at.x = 1;
  expect_refused(at,
                 "moe_init_routing_v2: x data must be aligned to 4 bytes (the size of its float32 "
                 "elements), got an address 1 byte past a multiple of 4");
  at = V2Placement();
  at.expert_idx = 66;
  expect_refused(at,
                 "moe_init_routing_v2: expert_idx data must be aligned to 4 bytes (the size of its "
                 "int32 elements), got an address 2 bytes past a multiple of 4");
  at = V2Placement();
  at.expanded_row_idx = 195;
  expect_refused(at,
                 "moe_init_routing_v2: expanded_row_idx data must be aligned to 4 bytes (the size "
                 "of its int32 elements), got an address 3 bytes past a multiple of 4");
}

TEST(AdversarialAlignment, TheBackwardRefusesAnOddFloat16Buffer) {
  Arena arena(64);
  TensorHandle g = tensor_handle(arena.at(1), MR_FLOAT16, {2, 2});
  TensorHandle idx = tensor_handle(arena.at(16), MR_INT32, {2});
  TensorHandle out = tensor_handle(arena.at(32), MR_FLOAT16, {2, 2});
  const std::vector<unsigned char> before = arena.bytes();
  uint64_t workspace_size = 0;
  mrExecutor* executor = nullptr;
  EXPECT_EQ(mrMoeInitRoutingV2GradGetWorkspaceSize(g.get(), idx.get(), 1, 0, 0, out.get(),
                                                   &workspace_size, &executor),
            MR_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(mrGetLastErrorMessage(),
               "moe_init_routing_grad: grad_expanded_x data must be aligned to 2 bytes (the size "
               "of its float16 elements), got an address 1 byte past a multiple of 2");
  EXPECT_EQ(executor, nullptr);
  EXPECT_EQ(arena.bytes(), before);
}

// Byte-sized elements have no alignment to keep, and an empty tensor's buffer is never touched.
TEST(AdversarialAlignment, Int8AndEmptyTensorsMaySitAnywhere) {
  Arena arena(128);
  const int8_t x_values[4] = {1, 2, 3, 4};  // [2, 2] int8 at an odd address
  std::memcpy(arena.at(1), x_values, 4);
  const int32_t ids[2] = {1, 0};
  std::memcpy(arena.at(8), ids, 8);
  MoeInitRoutingAttrs attrs;
  attrs.expert_num = 2;
  const Status s = moe_init_routing(
      TensorView(arena.at(1), DType::int8, {2, 2}), TensorView(arena.at(8), DType::int32, {2, 1}),
      TensorView(), TensorView(), TensorView(), attrs,
      TensorView(arena.at(17), DType::int8, {2, 2}), TensorView(arena.at(24), DType::int32, {2}),
      TensorView(), TensorView(), TensorView(), ExecConfig());
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ(std::memcmp(arena.at(17), "\x03\x04\x01\x02", 4), 0);

  const Status empty =
      moe_init_routing(TensorView(arena.at(41), DType::float32, {0, 4}),
                       TensorView(arena.at(43), DType::int32, {0, 1}), TensorView(), TensorView(),
                       TensorView(), attrs, TensorView(arena.at(45), DType::float32, {0, 4}),
                       TensorView(arena.at(47), DType::int32, {0}), TensorView(), TensorView(),
                       TensorView(), ExecConfig());
  EXPECT_TRUE(empty.is_ok()) << empty.message();
}

}  // namespace
}  // namespace moe_routing::testing
