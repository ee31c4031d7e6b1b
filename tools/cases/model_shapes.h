// The MoE layers of real models that the benchmarks (`moe-routing bench`, tools/gpu_check.cpp)
// and the model-size tests run at: hidden size, routed experts, experts per token.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace moe_routing::cases {

struct ModelShape {
  const char* name;  // as `moe-routing bench --shape` spells it
  int64_t hidden, experts, top_k;
};

inline constexpr ModelShape kModelShapes[] = {
    {"deepseek-v3", 7168, 256, 8},
    {"qwen3-235b", 4096, 128, 8},
    {"qwen3-30b", 2048, 128, 8},
    {"mixtral", 4096, 8, 2},
};

/// The shape of that name; std::out_of_range for a name not in kModelShapes.
inline const ModelShape& model_shape(const char* name) {
  for (const ModelShape& m : kModelShapes)
    if (std::strcmp(m.name, name) == 0) return m;
  throw std::out_of_range(std::string("no model shape is named ") + name);
}

}  // namespace moe_routing::cases
