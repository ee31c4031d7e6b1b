#include "ops/validation.h"

#include "core/thread_pool.h"

#include <cstdint>
#include <limits>
#include <string>

namespace moe_routing::detail {

Status check_dims_non_negative(const char* op, const char* name, const TensorView& t) {
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] < 0)
      return invalid_argument(op, name, " dimensions must be >= 0, got ", shape_string(t));
  return Status::ok();
}

namespace {

/// Whether `element` bytes times every extent fits int64; true where an extent is 0 (no bytes,
/// whatever the other extents). Extents are >= 0.
bool bytes_fit_int64(int64_t element, std::initializer_list<int64_t> extents) {
  for (int64_t extent : extents)
    if (extent == 0) return true;
  constexpr auto kMax = static_cast<unsigned __int128>(std::numeric_limits<int64_t>::max());
  unsigned __int128 bytes = static_cast<uint64_t>(element);
  for (int64_t extent : extents)
    if ((bytes *= static_cast<uint64_t>(extent)) > kMax) return false;  // both factors < 2^64
  return true;
}

}  // namespace

Status check_element_count(const char* op, const char* name, const TensorView& t) {
  const int64_t count = t.numel();  // saturates at INT64_MAX
  if (count == std::numeric_limits<int64_t>::max() ||
      !bytes_fit_int64(int64_t(dtype_size(t.dtype)), {count}))
    return invalid_argument(op, name, " has too many elements (more than 2^63 - 1 bytes), got ",
                            shape_string(t));
  return Status::ok();
}

Status check_output_bytes(const char* op, const char* name, DType dtype,
                          std::initializer_list<int64_t> shape) {
  if (bytes_fit_int64(int64_t(dtype_size(dtype)), shape)) return Status::ok();
  std::string extents;
  for (int64_t extent : shape) extents += (extents.empty() ? "" : ", ") + std::to_string(extent);
  return invalid_argument(op, name, " would have more than 2^63 - 1 bytes, got ", shape.size(),
                          "-D ", dtype_name(dtype), " [", extents, "]");
}

namespace {

/// The bytes a view covers, [begin, end) as addresses; empty for null data or no elements. The
/// end saturates at the top of the address space (a view's numel saturates too).
struct ByteRange {
  uintptr_t begin = 0, end = 0;
  bool empty() const { return begin == end; }
};

/// [begin, begin + bytes), the end saturating at the top of the address space.
ByteRange span(const void* begin, unsigned __int128 bytes) {
  ByteRange range;
  range.begin = reinterpret_cast<uintptr_t>(begin);
  const unsigned __int128 end = static_cast<unsigned __int128>(range.begin) + bytes;
  range.end = end > UINTPTR_MAX ? UINTPTR_MAX : uintptr_t(end);
  return range;
}

ByteRange byte_range(const TensorView& t) {
  if (t.data == nullptr || t.numel() == 0) return ByteRange();
  return span(t.data, static_cast<unsigned __int128>(uint64_t(t.numel())) * dtype_size(t.dtype));
}

/// The bytes ranges a and b share (0 when disjoint).
uint64_t shared_bytes(ByteRange a, ByteRange b) {
  const uintptr_t begin = a.begin > b.begin ? a.begin : b.begin;
  const uintptr_t end = a.end < b.end ? a.end : b.end;
  return begin < end ? uint64_t(end - begin) : 0;
}

const char* bytes_word(uint64_t n) { return n == 1 ? " shared byte" : " shared bytes"; }

/// A non-empty buffer must be aligned to its element size: the kernels load and store whole
/// elements (an int32 at an odd address is undefined behaviour, and UBSan caught one; issue 17,
/// item 11).
Status check_alignment(const char* op, const char* name, const TensorView& t) {
  const size_t element = dtype_size(t.dtype);
  const size_t misalignment = reinterpret_cast<uintptr_t>(t.data) % element;
  if (misalignment == 0 || byte_range(t).empty()) return Status::ok();
  return invalid_argument(op, name, " data must be aligned to ", element,
                          " bytes (the size of its ", dtype_name(t.dtype),
                          " elements), got an address ", misalignment,
                          misalignment == 1 ? " byte" : " bytes", " past a multiple of ", element);
}

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
  return check_alignment(op, output.name, t);
}

Status check_input(const char* op, const CallInput& input) {
  const TensorView& t = input.view;
  if (t.data == nullptr && t.ndim > 0 && t.numel() > 0)
    return invalid_argument(op, input.name,
                            " data must not be null for a non-empty tensor, got null");
  return check_alignment(op, input.name, t);
}

Status check_execution(const char* op, Device device, const ExecConfig& config) {
  MOE_ROUTING_RETURN_IF_ERROR(
      check_num_threads(op, config.num_threads, "uses the library default"));
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

/// validate_call's step 5: a caller's workspace on the CPU backend holds workspace.needed bytes
/// and those share no byte with an input or an output ([workspace, workspace + needed): a larger
/// buffer may hold other data past what the call writes).
Status check_workspace(const char* op, const CallWorkspace& workspace, const ExecConfig& config,
                       const CallInput& anchor, std::initializer_list<CallInput> inputs,
                       std::initializer_list<CallOutput> outputs) {
  if (workspace.size_function == nullptr || !checks_caller_workspace(config, anchor.view.device))
    return Status::ok();
  if (config.workspace_bytes < workspace.needed) {
    if (workspace.depends_on_threads)
      return invalid_argument(op, "workspace_bytes must be at least ", workspace.needed,
                              " for this call with num_threads ", config.num_threads, " (",
                              workspace.size_function, " with the same num_threads gives it), got ",
                              config.workspace_bytes);
    return invalid_argument(op, "workspace_bytes must be at least ", workspace.needed,
                            " for this call (", workspace.size_function, " gives it), got ",
                            config.workspace_bytes);
  }
  const ByteRange scratch = span(config.workspace, workspace.needed);
  auto overlap_error = [&](const char* name, const TensorView& view) -> Status {
    const uint64_t shared = shared_bytes(scratch, byte_range(view));
    if (shared == 0) return Status::ok();
    return invalid_argument(op, "workspace must not overlap ", name,
                            " (the call writes its scratch there while it reads the inputs and "
                            "writes the outputs), got ",
                            shared, bytes_word(shared));
  };
  for (const CallInput& input : inputs)
    MOE_ROUTING_RETURN_IF_ERROR(overlap_error(input.name, input.view));
  for (const CallOutput& output : outputs)
    MOE_ROUTING_RETURN_IF_ERROR(overlap_error(output.name, output.view));
  return Status::ok();
}

}  // namespace

Status validate_call(const char* op, std::initializer_list<CallInput> inputs,
                     std::initializer_list<CallOutput> outputs, const ExecConfig& config,
                     const CallWorkspace& workspace) {
  const CallInput& anchor = *inputs.begin();
  for (const CallOutput& output : outputs)
    MOE_ROUTING_RETURN_IF_ERROR(check_output(op, output, anchor));
  for (const CallInput& input : inputs) MOE_ROUTING_RETURN_IF_ERROR(check_input(op, input));
  MOE_ROUTING_RETURN_IF_ERROR(check_no_overlap(op, inputs, outputs));
  MOE_ROUTING_RETURN_IF_ERROR(check_execution(op, anchor.view.device, config));
  return check_workspace(op, workspace, config, anchor, inputs, outputs);
}

Status check_no_overlap(const char* op, std::initializer_list<CallInput> inputs,
                        std::initializer_list<CallOutput> outputs) {
  auto overlap_error = [op](const char* output, const char* other, ByteRange a,
                            ByteRange b) -> Status {
    const uint64_t shared = shared_bytes(a, b);
    if (shared == 0) return Status::ok();
    return invalid_argument(op, output, " must not overlap ", other,
                            " (an output may share no byte with an input or another output), got ",
                            shared, bytes_word(shared));
  };
  for (auto output = outputs.begin(); output != outputs.end(); ++output) {
    const ByteRange range = byte_range(output->view);
    if (range.empty()) continue;
    for (const CallInput& input : inputs)
      MOE_ROUTING_RETURN_IF_ERROR(
          overlap_error(output->name, input.name, range, byte_range(input.view)));
    for (auto earlier = outputs.begin(); earlier != output; ++earlier)
      MOE_ROUTING_RETURN_IF_ERROR(
          overlap_error(output->name, earlier->name, range, byte_range(earlier->view)));
  }
  return Status::ok();
}

}  // namespace moe_routing::detail
