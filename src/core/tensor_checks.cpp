#include "core/tensor_checks.h"

#include <cstdint>
#include <limits>

namespace moe_routing::detail {

Status check_dims_non_negative(const char* op, const char* name, const TensorView& t) {
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] < 0)
      return invalid_argument(op, name, " dimensions must be >= 0, got ", shape_string(t));
  return Status::ok();
}

Status check_data_not_null(const char* op, const char* name, const TensorView& t) {
  if (t.data == nullptr && t.ndim > 0 && t.numel() > 0)
    return invalid_argument(op, name, " data must not be null for a non-empty tensor, got null");
  return Status::ok();
}

Status check_element_count(const char* op, const char* name, const TensorView& t) {
  const int64_t count = t.numel();
  const int64_t element = int64_t(dtype_size(t.dtype));
  if (count == std::numeric_limits<int64_t>::max() ||
      (element > 0 && count > std::numeric_limits<int64_t>::max() / element))
    return invalid_argument(op, name, " has too many elements (more than 2^63 - 1 bytes), got ",
                            shape_string(t));
  return Status::ok();
}

bool bytes_overlap(const TensorView& a, const TensorView& b) {
  if (a.data == nullptr || b.data == nullptr || a.device != b.device) return false;
  const uintptr_t a0 = reinterpret_cast<uintptr_t>(a.data),
                  b0 = reinterpret_cast<uintptr_t>(b.data);
  const uintptr_t a1 = a0 + a.nbytes(), b1 = b0 + b.nbytes();
  return a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1;
}

Status check_no_overlap(const char* op, std::initializer_list<NamedTensor> outputs,
                        const NamedTensor* inputs, size_t input_count) {
  for (auto out = outputs.begin(); out != outputs.end(); ++out) {
    for (size_t k = 0; k < input_count; ++k)
      if (bytes_overlap(*out->tensor, *inputs[k].tensor))
        return invalid_argument(op, out->name, " must not share memory with ", inputs[k].name,
                                ", got overlapping bytes");
    for (auto earlier = outputs.begin(); earlier != out; ++earlier)
      if (bytes_overlap(*out->tensor, *earlier->tensor))
        return invalid_argument(op, out->name, " must not share memory with ", earlier->name,
                                ", got overlapping bytes");
  }
  return Status::ok();
}

Status check_execution(const char* op, Device device, const ExecConfig& config) {
#if defined(MOE_ROUTING_HAVE_CUDA)
  if (device == Device::cuda) {
    if (config.backend != Backend::automatic)
      return not_supported(op,
                           "backend must be automatic for cuda tensors (reference and cpu run "
                           "on host memory), got ",
                           config.backend == Backend::cpu ? "cpu" : "reference");
    return Status::ok();
  }
#endif
  if (device != Device::cpu)
    return not_supported(op, "device must be cpu in this build, got ", device_name(device));
  if (config.isa != CpuIsa::automatic && !cpu_isa_available(config.isa))
    return not_supported(op, "isa ", cpu_isa_name(config.isa),
                         " is not available on this CPU or build, got a request for it");
  return Status::ok();
}

}  // namespace moe_routing::detail
