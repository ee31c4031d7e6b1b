// Owning host tensors for test cases and benchmarks, and their byte-exact comparison with a
// report of the first difference (an empty string when equal; the tests turn it into a
// GoogleTest assertion, tools/gpu_check.cpp prints it).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "moe_routing/dtype.h"
#include "moe_routing/tensor.h"

namespace moe_routing::cases {

/// Raw bytes of a floating tensor plus its dtype.
struct FloatBuffer {
  DType dtype = DType::float32;
  std::vector<uint8_t> bytes;

  FloatBuffer() = default;
  FloatBuffer(DType dtype_, int64_t count)
      : dtype(dtype_), bytes(size_t(count) * dtype_size(dtype_)) {}
  static FloatBuffer from_floats(DType dtype, const std::vector<float>& values) {
    FloatBuffer b(dtype, int64_t(values.size()));
    for (size_t i = 0; i < values.size(); ++i)
      store_from_float(b.data(), dtype, int64_t(i), values[i]);
    return b;
  }
  int64_t count() const { return int64_t(bytes.size() / dtype_size(dtype)); }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  float at(int64_t i) const { return load_as_float(bytes.data(), dtype, i); }
  /// The stored bit pattern of element i (16 or 32 bits).
  uint32_t bits(int64_t i) const {
    if (dtype == DType::float32) return float_bits(static_cast<const float*>(data())[i]);
    return static_cast<const uint16_t*>(data())[i];
  }
  /// Fills with a recognisable NaN pattern so unwritten elements show.
  void poison() {
    if (!bytes.empty()) std::memset(bytes.data(), 0x7f, bytes.size());
  }
};

/// "" when the bit patterns are equal; otherwise the first differing element and the count.
std::string difference(const FloatBuffer& expected, const FloatBuffer& got);

/// An owning, contiguous tensor; `present == false` stands for an absent optional input.
struct Tensor {
  bool present = false;
  DType dtype = DType::float32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  Tensor() = default;
  Tensor(DType dtype_, std::vector<int64_t> shape_)
      : present(true), dtype(dtype_), shape(std::move(shape_)) {
    bytes.assign(size_t(numel()) * dtype_size(dtype), 0);
  }
  /// Allocated for an output spec (its dtype and shape).
  static Tensor from_spec(const OutputSpec& spec) {
    return Tensor(spec.dtype, std::vector<int64_t>(spec.shape, spec.shape + spec.ndim));
  }
  /// Floating tensor from float values (narrowed with RNE).
  static Tensor floats(DType dtype, std::vector<int64_t> shape, const std::vector<float>& values) {
    Tensor t(dtype, std::move(shape));
    for (size_t i = 0; i < values.size(); ++i)
      store_from_float(t.bytes.data(), dtype, int64_t(i), values[i]);
    return t;
  }
  static Tensor int32s(std::vector<int64_t> shape, const std::vector<int32_t>& values) {
    Tensor t(DType::int32, std::move(shape));
    if (!values.empty())
      std::memcpy(t.bytes.data(), values.data(), values.size() * sizeof(int32_t));
    return t;
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d < 0 ? 0 : d;
    return n;
  }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(bytes.data());
  }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(bytes.data());
  }
  template <typename T>
  std::vector<T> values() const {
    return std::vector<T>(as<T>(), as<T>() + numel());
  }
  /// Element i of a floating tensor widened to float32.
  float at(int64_t i) const { return load_as_float(bytes.data(), dtype, i); }
  std::vector<float> float_values() const {
    std::vector<float> v;
    for (int64_t i = 0; i < numel(); ++i) v.push_back(at(i));
    return v;
  }
  void poison(uint8_t byte = 0x5A) {
    if (!bytes.empty()) std::memset(bytes.data(), byte, bytes.size());
  }
  TensorView view() {
    if (!present) return TensorView();
    // A non-null pointer even for empty tensors (std::vector::data() may be null then).
    void* data = bytes.empty() ? static_cast<void*>(&empty_storage) : bytes.data();
    return TensorView(data, dtype, int(shape.size()), shape.data());
  }

 private:
  uint64_t empty_storage = 0;
};

/// "" when presence, dtype, shape and every byte agree; otherwise the first difference.
std::string difference(const Tensor& expected, const Tensor& got);

}  // namespace moe_routing::cases
