// Numerics: which Ascend device's arithmetic the operators reproduce. One switch for the whole
// library (docs/decisions.md): it selects the int8 quantisation arithmetic of every forward and
// the float32 accumulation order of every backward, and autograd carries it from a forward to its
// backward. The C ABI spells it mrNumerics, Python and the CLI `numerics="atlas_a2"|"ascend_950"`.
#pragma once

#include <cstdint>

namespace moe_routing {

enum class Numerics : int32_t {
  /// Atlas A2/A3 kernels (the default): float32 static quantisation, dynamic scale m / 127, the
  /// backward's tree accumulation order, the combine accumulating float16 in float16.
  atlas_a2 = 0,
  /// Ascend 950 kernels: float16 static quantisation, dynamic scale m * float32(1/127), the
  /// backward's sequential accumulation order, the combine accumulating in float32 for every dtype.
  ascend_950 = 1,
};

/// "atlas_a2" or "ascend_950" ("unknown" for a value outside the enum).
const char* numerics_name(Numerics numerics);
/// Parses "atlas_a2" / "ascend_950"; returns false (and leaves *numerics unchanged) otherwise.
bool parse_numerics(const char* text, Numerics* numerics);
/// Whether an int32 (a C ABI or serialised value) names a Numerics.
inline bool is_valid_numerics(int32_t value) { return value == 0 || value == 1; }

}  // namespace moe_routing
