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
// `moe-routing: <flag> <file>: <what> <constraint>, got <actual>`. 0-d and empty arrays are
// supported. A header is checked whole, and the size it promises against the file's size and the
// memory available, before any data is read. Writes go through file_io::write_all(): all or
// nothing, regular files replaced atomically, FIFOs, devices and symbolic links written through.
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
/// Reads and parses an .npy file: a regular file, or a stream (FIFO, device) read up to its end.
/// Messages name the file as `<flag> <path>` (the path alone when `flag` is empty).
Status read(const std::string& path, Array* out, const std::string& flag = "");

/// A zero-filled array, allocated only after checking that it fits in the memory available (an
/// overcommitted allocation would succeed and the process be killed when the zeros are written).
/// Errors read `moe-routing: <label>: <name> <dtype> <shape> (...) must fit in the memory
/// available, got ...`.
Status allocate(DType dtype, std::vector<int64_t> shape, const std::string& label,
                const std::string& name, Array* out);

/// The preamble and header of the .npy file of an array of `dtype` and `shape`: format 1.0, data
/// starting at a multiple of 64 bytes, as NumPy's np.save writes them. `name` prefixes error
/// messages.
Status encode_header(DType dtype, const std::vector<int64_t>& shape, const std::string& name,
                     std::string* header);
/// The whole .npy file of an array: encode_header() then the data.
Status encode(const Array& array, const std::string& name, std::vector<uint8_t>* file_bytes);
/// Writes one array (write_all() of one file). On error `path` is untouched.
Status write(const std::string& path, const Array& array, const std::string& flag = "");

/// One file of a write_all() set.
struct OutputFile {
  std::string path;
  const Array* array = nullptr;
  std::string flag;  // the flag that named the file, for messages ("--out"; may be empty)
};

/// Writes several arrays as one set with file_io::write_all() (see there: all of them appear or
/// none of the previous files changes, no temporary remains). The data goes from each array to
/// its file directly, never through a second copy in memory.
Status write_all(const std::vector<OutputFile>& files);

}  // namespace moe_routing::npy
