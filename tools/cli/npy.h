// NumPy .npy files for the moe-routing tool: read format versions 1.0, 2.0 and 3.0, write 1.0.
//
// Element types follow the project's convention (uint16 arrays carry bf16 bit patterns, because
// NumPy has no bfloat16):
//
//   descr  | DType    || descr  | DType
//   '<f4'  | float32  || '|i1'  | int8
//   '<f2'  | float16  || '<i4'  | int32
//   '<u2'  | bfloat16 || '<i8'  | int64
//
// Anything else (big-endian, Fortran order, other descrs, structured types, more than kMaxDims
// dimensions, short or over-long data) is an invalid_argument Status whose message reads
// `moe-routing: <file>: <what> <constraint>, got <actual>`. 0-d and empty arrays are supported.
// Writes are atomic: the bytes go to `<path>.tmp`, which is renamed onto `<path>` only once
// complete, so a failed write never leaves a partial output behind.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe_routing/status.h"
#include "moe_routing/tensor.h"

namespace moe_routing::npy {

/// An owning, C-contiguous, little-endian array: what an .npy file holds.
struct Array {
  DType dtype = DType::float32;
  std::vector<int64_t> shape;  // empty = 0-d (one element)
  std::vector<uint8_t> bytes;  // numel() * dtype_size(dtype) bytes, row-major

  Array() = default;
  /// A zero-filled array of the given dtype and shape.
  Array(DType dtype_, std::vector<int64_t> shape_);

  /// Product of the shape (1 for 0-d, 0 when a dimension is 0).
  int64_t numel() const;
  /// A view of the array for the library's operators (valid while the Array lives unchanged).
  TensorView view();
  TensorView view() const;
};

/// The .npy descr written for a dtype ('<f4', '<f2', '<u2', '|i1', '<i4', '<i8').
const char* descr_for(DType dtype);

/// Parses the contents of an .npy file. `name` (usually the path) prefixes every error message.
Status parse(const std::vector<uint8_t>& file_bytes, const std::string& name, Array* out);
/// Reads and parses an .npy file.
Status read(const std::string& path, Array* out);

/// Encodes an array as an .npy file: format 1.0, data starting at a multiple of 64 bytes, the
/// same bytes NumPy's np.save writes for the array. `name` prefixes error messages.
Status encode(const Array& array, const std::string& name, std::vector<uint8_t>* file_bytes);
/// Encodes and writes atomically (`<path>.tmp`, then rename). On error `path` is untouched.
Status write(const std::string& path, const Array& array);

/// One file of a write_all() set.
struct OutputFile {
  std::string path;
  const Array* array = nullptr;
};

/// Writes several arrays as one unit: every file is encoded and written completely to
/// `<path>.tmp` first, and only then are the temporaries renamed onto their paths. On error no
/// temporary remains; if the failure came before the renames (encoding, a full disk, an
/// unwritable directory) every file previously at the paths is untouched, and if a rename fails
/// (rare: each temporary sits beside its path) the files already renamed are removed, so a
/// partial set never remains.
Status write_all(const std::vector<OutputFile>& files);

}  // namespace moe_routing::npy
