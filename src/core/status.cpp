#include "moe_routing/status.h"

namespace moe_routing {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::ok: return "ok";
    case StatusCode::invalid_argument: return "invalid argument";
    case StatusCode::index_out_of_range: return "index out of range";
    case StatusCode::not_supported: return "not supported";
    case StatusCode::internal: return "internal error";
    case StatusCode::runtime: return "runtime error";
  }
  return "unknown status";
}

}  // namespace moe_routing
