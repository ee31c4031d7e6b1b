#include "ops/validation.h"

#include <cstdint>
#include <limits>

namespace moe_routing::detail {

Status check_dims_non_negative(const char* op, const char* name, const TensorView& t) {
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] < 0)
      return invalid_argument(op, name, " dimensions must be >= 0, got ", shape_string(t));
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

namespace {

Status check_output(const char* op, const CallOutput& output, const CallInput& anchor) {
  const TensorView& t = output.view;
  const OutputSpec& spec = output.spec;
  if (!spec.produced && t.data == nullptr) return Status::ok();
  bool same = t.ndim == spec.ndim && t.dtype == spec.dtype;
  for (int d = 0; same && d < spec.ndim; ++d) same = t.shape[d] == spec.shape[d];
  if (!same)
    return invalid_argument(op, output.name, " must be ", spec.ndim, "-D ", dtype_name(spec.dtype),
                            ' ', shape_string(spec),
                            spec.produced ? "" : " or have null data (it is not produced here)",
                            ", got ", describe(t));
  if (t.device != anchor.view.device)
    return invalid_argument(op, output.name, " must be on the device of ", anchor.name, " (",
                            device_name(anchor.view.device), "), got ", device_name(t.device));
  if (t.data == nullptr && spec.numel() > 0)
    return invalid_argument(op, output.name,
                            " data must not be null for a non-empty tensor, got null");
  return Status::ok();
}

Status check_input(const char* op, const CallInput& input) {
  const TensorView& t = input.view;
  if (t.data == nullptr && t.ndim > 0 && t.numel() > 0)
    return invalid_argument(op, input.name,
                            " data must not be null for a non-empty tensor, got null");
  return Status::ok();
}

/// Whether two tensors on the same device share at least one byte (empty ones share none).
bool bytes_overlap(const TensorView& a, const TensorView& b) {
  if (a.data == nullptr || b.data == nullptr || a.device != b.device) return false;
  const uintptr_t a0 = reinterpret_cast<uintptr_t>(a.data);
  const uintptr_t b0 = reinterpret_cast<uintptr_t>(b.data);
  const uintptr_t a1 = a0 + a.nbytes(), b1 = b0 + b.nbytes();
  return a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1;
}

Status check_execution(const char* op, Device device, const ExecConfig& config) {
  if (!device_supported(device))
    return not_supported(op, "device must be cpu in this build, got ", device_name(device));
  if (device == Device::cuda) {
    if (config.backend != Backend::automatic)
      return not_supported(op,
                           "backend must be automatic for cuda tensors (reference and cpu run "
                           "on host memory), got ",
                           config.backend == Backend::cpu ? "cpu" : "reference");
    return Status::ok();
  }
  if (config.isa != CpuIsa::automatic && !cpu_isa_available(config.isa))
    return not_supported(op, "isa ", cpu_isa_name(config.isa),
                         " is not available on this CPU or build, got a request for it");
  return Status::ok();
}

}  // namespace

Status validate_call(const char* op, std::initializer_list<CallInput> inputs,
                     std::initializer_list<CallOutput> outputs, const ExecConfig& config) {
  const CallInput& anchor = *inputs.begin();
  for (const CallOutput& output : outputs)
    MOE_ROUTING_RETURN_IF_ERROR(check_output(op, output, anchor));
  for (const CallInput& input : inputs) MOE_ROUTING_RETURN_IF_ERROR(check_input(op, input));
  for (auto out = outputs.begin(); out != outputs.end(); ++out) {
    for (const CallInput& input : inputs)
      if (bytes_overlap(out->view, input.view))
        return invalid_argument(op, out->name, " must not share memory with ", input.name,
                                ", got overlapping bytes");
    for (auto earlier = outputs.begin(); earlier != out; ++earlier)
      if (bytes_overlap(out->view, earlier->view))
        return invalid_argument(op, out->name, " must not share memory with ", earlier->name,
                                ", got overlapping bytes");
  }
  return check_execution(op, anchor.view.device, config);
}

}  // namespace moe_routing::detail
