#include "moe_routing/dtype.h"

namespace moe_routing {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::float32: return "float32";
    case DType::float16: return "float16";
    case DType::bfloat16: return "bfloat16";
    case DType::int8: return "int8";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
  }
  return "unknown";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::float32: return 4;
    case DType::float16: return 2;
    case DType::bfloat16: return 2;
    case DType::int8: return 1;
    case DType::int32: return 4;
    case DType::int64: return 8;
  }
  return 0;
}

bool is_floating(DType dtype) {
  return dtype == DType::float32 || dtype == DType::float16 || dtype == DType::bfloat16;
}

bool is_valid_dtype(int32_t value) { return value >= 0 && value <= 5; }

}  // namespace moe_routing
