// The checks every operator makes on a call before it reads any data, written once. Each
// operator's one validation function (ops/<operator>/meta.h: validate_<operator>) runs its shape
// inference and then validate_call on its inputs and outputs; the C++ entry point and phase one of
// the C ABI both call that function, so both accept and reject exactly the same calls with the
// same words.
#pragma once

#include <initializer_list>

#include "moe_routing/status.h"
#include "moe_routing/tensor.h"

namespace moe_routing::detail {

// ---- shape-level helpers of the operators' shape inference ----------------------------------

/// An absent optional tensor: the default view (data null, no dimensions).
inline bool is_absent(const TensorView& t) { return t.data == nullptr && t.ndim == 0; }

/// "<op><name> dimensions must be >= 0, got [..]" for a negative extent.
Status check_dims_non_negative(const char* op, const char* name, const TensorView& t);

/// "<op><name> has too many elements (more than 2^63 - 1 bytes), got [..]" when its element
/// count or byte size does not fit int64.
Status check_element_count(const char* op, const char* name, const TensorView& t);

/// "<op><name> would have more than 2^63 - 1 bytes, got <n>-D <dtype> [..]" unless an output
/// of `dtype` and `shape` (extents >= 0) has a size in bytes that fits int64. Shape inference
/// checks every output it plans whose extents it computes, so that no front end is handed a shape
/// no tensor can have (mrCreateTensor, TensorView::nbytes and PyTorch's allocator all need the
/// bytes to fit); an empty shape always fits.
Status check_output_bytes(const char* op, const char* name, DType dtype,
                          std::initializer_list<int64_t> shape);

// ---- the call --------------------------------------------------------------------------------

/// An input tensor of a call. An absent optional input is the default view (data null, ndim 0).
struct CallInput {
  const char* name;
  const TensorView& view;
};

/// An output tensor of a call and what shape inference planned for it.
struct CallOutput {
  const char* name;
  const TensorView& view;
  const OutputSpec& spec;
};

/// What a call writes into a caller's workspace (ExecConfig::workspace) on the CPU backend:
/// `needed` bytes, as `size_function` reports them (with the same num_threads where
/// `depends_on_threads`). The default (no size function): the call uses no caller workspace.
/// `needed` is read only where checks_caller_workspace() holds, so callers compute it only then
/// (the ordinary call, the torch binding's included, passes no workspace).
struct CallWorkspace {
  uint64_t needed = 0;
  const char* size_function = nullptr;
  bool depends_on_threads = false;
};

/// Whether validate_call checks a caller's workspace (its step 5): the call passes one and runs on
/// the CPU backend (`device`, the anchor's, is the CPU and the backend is not the reference).
inline bool checks_caller_workspace(const ExecConfig& config, Device device) {
  return config.workspace != nullptr && device == Device::cpu &&
         config.backend != Backend::reference;
}

/// Every check of a call that needs no data, after shape inference, in this order (so that every
/// front end reports the same first mistake):
///  1. each output: a produced one has exactly its planned shape and dtype, the device of the
///     first input (the anchor) and a buffer unless empty; one not produced may have null data
///     (then it is ignored), else it is checked alike (it will be zero-filled); a non-empty
///     buffer is aligned to its element size;
///  2. each present input: a buffer unless empty, aligned to its element size unless empty;
///  3. check_no_overlap;
///  4. where the call runs: config.num_threads in [0, kMaxNumThreads]; the anchor's device must
///     be one this build supports (device_supported), cuda tensors only with Backend::automatic,
///     and a requested CPU ISA must be available;
///  5. a caller's workspace, where the call runs on the CPU backend with one: at least
///     workspace.needed bytes, and those bytes share none with an input or an output (the
///     kernels write their scratch there while they read the inputs and write the outputs).
/// The first input is the anchor; every input's device was already checked against it by shape
/// inference. A check that every operator needs (about buffers, their overlap or alignment)
/// belongs here, once.
Status validate_call(const char* op, std::initializer_list<CallInput> inputs,
                     std::initializer_list<CallOutput> outputs, const ExecConfig& config,
                     const CallWorkspace& workspace = CallWorkspace());

/// No output may share a byte with an input or with another output: the kernels read inputs
/// while they write outputs (in any order, on several threads), so an overlap gave wrong results
/// (issue 17, item 2). Inputs may share bytes with each other (they are only read). An empty
/// tensor, or an output with null data, has no bytes. Byte ranges are [data, data + numel *
/// element size); the shapes were checked before (validate_call step 1, shape inference).
Status check_no_overlap(const char* op, std::initializer_list<CallInput> inputs,
                        std::initializer_list<CallOutput> outputs);

}  // namespace moe_routing::detail
