// Random cases of the forward operators (moe_init_routing, the torch API / V4, and
// moe_init_routing_v2): the inputs with their attributes, and running them with outputs allocated
// from the inferred plan (poisoned first, so unwritten elements show). Shared by the C++ tests,
// the CUDA backend's host and GPU tests, the CLI tests and tools/gpu_check.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cases/random.h"
#include "cases/runner.h"
#include "cases/tensor.h"
#include "moe_routing/moe_init_routing.h"
#include "moe_routing/status.h"

namespace moe_routing::cases {

// ---------------------------------------------------------------------------------------------
// Cases and running them
// ---------------------------------------------------------------------------------------------

struct ForwardCase {
  Tensor x, expert_idx, scale, offset, topk_weight;
  MoeInitRoutingAttrs attrs;
};

struct ForwardResult {
  Status status;
  MoeInitRoutingPlan plan;
  Tensor expanded_x, expanded_row_idx, counts, expanded_scale, expanded_topk_weight;
};

struct V2Case {
  Tensor x, expert_idx;
  MoeInitRoutingV2Attrs attrs;
};

struct V2Result {
  Status status;
  MoeInitRoutingV2Plan plan;
  Tensor expanded_x, expanded_row_idx, counts, before_capacity;
};

/// The runner's settings; with a caller workspace, `buffer` holds it: exactly `size` bytes
/// starting one byte into the allocation (misaligned), so that any access past the reported size
/// is a heap overflow under AddressSanitizer.
ExecConfig forward_config(const Runner& runner, uint64_t size, std::vector<unsigned char>* buffer);

/// Infers the case's plan and allocates the produced outputs from it (poisoned); the others stay
/// absent. False (with r->status) when shape inference fails.
bool plan_outputs(ForwardCase& c, ForwardResult* r);
bool plan_outputs(V2Case& c, V2Result* r);

/// Runs the case on one runner: the produced outputs allocated from the plan (poisoned), absent
/// views for the others.
ForwardResult run_forward(ForwardCase& c, const Runner& runner);
V2Result run_v2(V2Case& c, const Runner& runner);

/// "" when both have the same status code and every output agrees byte for byte; otherwise the
/// first difference, naming the output.
std::string difference(const ForwardResult& expected, const ForwardResult& got);
std::string difference(const V2Result& expected, const V2Result& got);

// ---------------------------------------------------------------------------------------------
// Random cases
// ---------------------------------------------------------------------------------------------

/// The scenarios of the torch API's random cases (moe_init_routing_v2's: the `mode` below).
enum class Scenario { dropless, partial_range, active, drop_pad };
inline const Scenario kScenarios[] = {Scenario::dropless, Scenario::partial_range, Scenario::active,
                                      Scenario::drop_pad};
const char* scenario_name(Scenario s);

/// An inclusive range to draw a size from.
struct SizeRange {
  int64_t lo, hi;
};

/// What the sizes of a random case are drawn from, in this order: N tokens, K experts per
/// token, H hidden (`hidden_step` times a draw from `hidden`, or one of `hidden_choices` when
/// there are any), E experts.
struct CaseSizes {
  SizeRange tokens{1, 24}, top_k{1, 6}, hidden{1, 19}, experts{1, 12};
  int64_t hidden_step = 1;
  std::vector<int64_t> hidden_choices;
};

/// The sizes of the GPU comparisons (tests/cpp/test_cuda_gpu.cpp, tools/gpu_check.cpp). Torch
/// API: small cases over hidden sizes with and without a vector tail, large ones with many sort
/// blocks. V2, repeat r: wide rows (multiples of 64) for even r, narrow ones for odd r; large N
/// and E from r = 3 on.
CaseSizes gpu_forward_sizes(bool large);
CaseSizes gpu_v2_sizes(int repeat);

/// Values spread over binades (integer_values: small integers, for exact dot products).
std::vector<float> random_values(Random& rng, int64_t n, bool integer_values = false);
/// A tensor of that shape: random_values for a floating dtype, random bytes for any other.
Tensor random_tensor(Random& rng, DType dtype, std::vector<int64_t> shape,
                     bool integer_values = false);
/// `count` ids drawn uniformly from [lo, hi].
std::vector<int32_t> random_ids(Random& rng, int64_t count, int64_t lo, int64_t hi);

/// A random moe_init_routing case.
struct ForwardCaseSpec {
  DType dtype = DType::float32;  // int8: x holds random bytes (quant_mode -1 only)
  Scenario scenario = Scenario::dropless;
  int64_t quant_mode = -1;
  int64_t row_idx_type = 0;
  CaseSizes sizes;
  bool integer_values = false;
  /// Drop-pad ids inside [0, E); otherwise ids are drawn from [-1, E] in every scenario (-1 and E
  /// are never routed).
  bool drop_pad_ids_in_range = false;
};
/// Every attribute the scenario leaves free is drawn too: the numerics, the count flag and type,
/// the range, active_num, the capacity, and the optional inputs (topk_weight, scale, offset).
ForwardCase make_forward_case(Random& rng, const ForwardCaseSpec& spec);
inline ForwardCase make_forward_case(Random& rng, DType dtype, Scenario scenario, int64_t quant,
                                     int64_t row_idx_type, bool integer_values) {
  ForwardCaseSpec spec;
  spec.dtype = dtype;
  spec.scenario = scenario;
  spec.quant_mode = quant;
  spec.row_idx_type = row_idx_type;
  spec.integer_values = integer_values;
  return make_forward_case(rng, spec);
}

/// A random moe_init_routing_v2 case; mode 0 dropless, 1 active_num, 2 drop-pad. The count flags
/// are drawn.
struct V2CaseSpec {
  DType dtype = DType::float32;
  int mode = 0;
  CaseSizes sizes;
  bool integer_values = false;
};
V2Case make_v2_case(Random& rng, const V2CaseSpec& spec);
inline V2Case make_v2_case(Random& rng, DType dtype, int mode, bool integer_values) {
  V2CaseSpec spec;
  spec.dtype = dtype;
  spec.mode = mode;
  spec.integer_values = integer_values;
  return make_v2_case(rng, spec);
}

}  // namespace moe_routing::cases
