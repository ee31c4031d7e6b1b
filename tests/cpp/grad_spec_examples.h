// The worked examples of the backward (docs/spec/moe_init_routing.md §1.10, G1-G5): one table
// for the C++ API tests (test_grad_examples.cpp) and the CLI tests (test_cli_golden_grad.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "moe_routing/dtype.h"

namespace moe_routing::testing {

struct GradSpecExample {
  const char* name;
  DType dtype;
  std::vector<int64_t> grad_shape;
  std::vector<float> grad_values;  // exactly representable in dtype
  std::vector<int32_t> expanded_row_idx;
  int64_t top_k, drop_pad_mode, active_num;
  std::vector<float> expected_tree, expected_sequential;  // grad_x, row-major
};

inline std::vector<GradSpecExample> grad_spec_examples() {
  const float tiny30 = std::ldexp(1.0f, -30), tiny24 = std::ldexp(1.0f, -24);
  return {
      // G1: dropless, K=3, fp32; the two orders differ in row 0, column 0.
      {"G1",
       DType::float32,
       {6, 2},
       {-1, 0.5f, 0.5f, 0.5f, tiny30, 0.25f, 0.125f, 2, 1, 3, 0.25f, -1},
       {4, 0, 2, 1, 5, 3},
       3,
       0,
       0,
       {0.0f, 3.75f, 0.875f, 1.5f},
       {tiny30, 3.75f, 0.875f, 1.5f}},
      // G2: active, bf16, skipped pairs and a tie in the final rounding.
      {"G2",
       DType::bfloat16,
       {3, 2},
       {1.0f, 0.00390625f, -2.5f, 3.0f, 0.5f, 1.0f},
       {2, 0, 4, 3, 1, 5},
       2,
       0,
       3,
       {1.5f, 1.0f, 0, 0, -2.5f, 3.0f},
       {1.5f, 1.0f, 0, 0, -2.5f, 3.0f}},
      // G3: drop-pad, fp16.
      {"G3",
       DType::float16,
       {3, 2, 1},
       {1, 2, 4, 8, 16, 32},
       {0, 2, 1, 4, -1, 3, -1, -1},
       2,
       1,
       0,
       {5, 18, 8, 0},
       {5, 18, 8, 0}},
      // G4: fp16, K=3, the platforms disagree.
      {"G4", DType::float16, {3, 1}, {1.0f, -1.0f, tiny24}, {0, 1, 2}, 3, 0, 0, {0.0f}, {tiny24}},
      // G5: K=5, fp32.
      {"G5",
       DType::float32,
       {5, 1},
       {1, tiny24, -1, tiny24, tiny24},
       {0, 1, 2, 3, 4},
       5,
       0,
       0,
       {tiny24},
       {std::ldexp(1.0f, -23)}},
  };
}

}  // namespace moe_routing::testing
