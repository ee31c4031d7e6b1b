// What the adversarial C-ABI tests share: tensor handles that destroy themselves, made from a
// buffer the test owns (any address: the tests place buffers where an adversary would).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "moe_routing/moe_routing.h"

namespace moe_routing::testing {

struct HandleDeleter {
  void operator()(mrTensor* t) const { EXPECT_EQ(mrDestroyTensor(t), MR_SUCCESS); }
};
using TensorHandle = std::unique_ptr<mrTensor, HandleDeleter>;

/// A handle for `data` with `dtype` and `shape` on the CPU.
inline TensorHandle tensor_handle(const void* data, mrDataType dtype,
                                  const std::vector<int64_t>& shape) {
  mrTensor* t = nullptr;
  EXPECT_EQ(
      mrCreateTensor(shape.data(), shape.size(), dtype, MR_DEVICE_CPU, const_cast<void*>(data), &t),
      MR_SUCCESS)
      << mrGetLastErrorMessage();
  return TensorHandle(t);
}

}  // namespace moe_routing::testing
