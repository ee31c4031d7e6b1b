#include "ops/validation.h"

namespace moe_routing::detail {
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
  return check_execution(op, anchor.view.device, config);
}

}  // namespace moe_routing::detail
