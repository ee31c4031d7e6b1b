#include "moe_routing/numerics.h"

#include <cstring>

namespace moe_routing {

const char* numerics_name(Numerics numerics) {
  switch (numerics) {
    case Numerics::atlas_a2: return "atlas_a2";
    case Numerics::ascend_950: return "ascend_950";
  }
  return "unknown";
}

bool parse_numerics(const char* text, Numerics* numerics) {
  if (text == nullptr) return false;
  if (std::strcmp(text, "atlas_a2") == 0) {
    *numerics = Numerics::atlas_a2;
    return true;
  }
  if (std::strcmp(text, "ascend_950") == 0) {
    *numerics = Numerics::ascend_950;
    return true;
  }
  return false;
}

}  // namespace moe_routing
