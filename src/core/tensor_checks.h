// Checks on TensorViews that every operator's validation words the same way: presence, negative
// extents, null data, and outputs sharing bytes with inputs (DECISIONS.md §15).
#pragma once

#include <cstddef>
#include <initializer_list>

#include "moe_routing/status.h"
#include "moe_routing/tensor.h"

namespace moe_routing::detail {

/// An absent optional tensor: a default TensorView (data null, no dimensions).
inline bool is_absent(const TensorView& t) { return t.data == nullptr && t.ndim == 0; }

/// "<op><name> dimensions must be >= 0, got [..]" for a negative extent.
Status check_dims_non_negative(const char* op, const char* name, const TensorView& t);

/// "<op><name> data must not be null for a non-empty tensor, got null".
Status check_data_not_null(const char* op, const char* name, const TensorView& t);

/// "<op><name> has too many elements (more than 2^63 - 1), got [..]" when its element count or
/// byte size does not fit int64.
Status check_element_count(const char* op, const char* name, const TensorView& t);

/// Whether two non-empty tensors on the same device share at least one byte.
bool bytes_overlap(const TensorView& a, const TensorView& b);

struct NamedTensor {
  const char* name;
  const TensorView* tensor;
};

/// "<op><output> must not share memory with <input>, got overlapping bytes" for the first output
/// that overlaps an input or an earlier output.
Status check_no_overlap(const char* op, std::initializer_list<NamedTensor> outputs,
                        const NamedTensor* inputs, size_t input_count);

/// Whether a call on tensors of `device` can run as `config` asks: cuda tensors need a build with
/// the CUDA backend and the automatic backend; cpu tensors an ISA this CPU and build have. The
/// error is not_supported: "<op>device must be cpu in this build, got cuda", ...
Status check_execution(const char* op, Device device, const ExecConfig& config);

}  // namespace moe_routing::detail
