#include "cases/tensor.h"

#include <sstream>

namespace moe_routing::cases {

std::string difference(const FloatBuffer& expected, const FloatBuffer& got) {
  std::ostringstream out;
  if (expected.dtype != got.dtype || expected.bytes.size() != got.bytes.size()) {
    out << "dtype/size differ: " << dtype_name(expected.dtype) << " x " << expected.count()
        << " vs " << dtype_name(got.dtype) << " x " << got.count();
    return out.str();
  }
  int64_t differing = 0, first = -1;
  for (int64_t i = 0; i < expected.count(); ++i) {
    if (expected.bits(i) != got.bits(i)) {
      if (first < 0) first = i;
      ++differing;
    }
  }
  if (differing == 0) return "";
  out << differing << " of " << expected.count() << " elements differ; first at flat index "
      << first << ": expected " << expected.at(first) << " (0x" << std::hex << expected.bits(first)
      << "), got " << std::dec << got.at(first) << " (0x" << std::hex << got.bits(first) << ")";
  return out.str();
}

std::string difference(const Tensor& expected, const Tensor& got) {
  if (expected.present != got.present || expected.dtype != got.dtype || expected.shape != got.shape)
    return "presence/dtype/shape differ";
  for (size_t i = 0; i < expected.bytes.size(); ++i)
    if (expected.bytes[i] != got.bytes[i]) {
      size_t differing = 0;
      for (size_t j = i; j < expected.bytes.size(); ++j)
        differing += expected.bytes[j] != got.bytes[j];
      const size_t element = i / dtype_size(expected.dtype);
      std::ostringstream out;
      out << differing << " bytes differ; first in element " << element << " (byte " << i
          << "): expected 0x" << std::hex << int(expected.bytes[i]) << ", got 0x"
          << int(got.bytes[i]);
      return out.str();
    }
  return "";
}

}  // namespace moe_routing::cases
