// Helpers of the forward operators' error tables (test_routing_errors*.cpp): tensor descriptions,
// outputs from the plan with overrides, and the check that a call fails on every runner with
// nothing written.
#pragma once

#include <string>
#include <vector>

#include "routing_cases.h"

namespace moe_routing::testing {

// Short names for the tables.
using D = DType;
using C = StatusCode;

/// A tensor description for the tables: dtype + shape (data allocated to fit), or absent.
struct Desc {
  bool present = false;
  DType dtype = DType::float32;
  std::vector<int64_t> shape;
  Desc() = default;
  Desc(DType dtype_, std::vector<int64_t> shape_)
      : present(true), dtype(dtype_), shape(std::move(shape_)) {}
  Tensor make() const {
    if (!present) return Tensor();
    int64_t n = 1;
    for (int64_t d : shape) n *= d < 0 ? 0 : d;
    // Tensors too large to allocate are only ever rejected by shape inference, before any read.
    if (n > (int64_t(1) << 24)) {
      Tensor t(dtype, {0});
      t.shape = shape;
      return t;
    }
    return Tensor(dtype, shape);
  }
};

inline const Desc kNone;
using D = DType;
using C = StatusCode;

/// Outputs: the planned shapes when inference succeeds, with overrides by name.
struct Override {
  const char* name;
  Desc desc;
};

/// Poisons every output, runs `call` on every runner, checks the status and that no output byte
/// changed.
template <class Call>
void expect_error(std::vector<Tensor*> outputs, const Call& call, StatusCode code,
                  const char* message) {
  for (Tensor* t : outputs) t->poison(0xAB);
  for (const testing::Runner& runner : testing::all_runners()) {
    Status s = call(runner.config());
    EXPECT_EQ(s.code(), code) << runner.name() << ": " << s.message();
    EXPECT_NE(s.message().find(message), std::string::npos)
        << runner.name() << ": message was: " << s.message();
    for (Tensor* t : outputs)
      for (uint8_t byte : t->bytes) ASSERT_EQ(byte, 0xAB) << "an output was written on error";
  }
}

inline Tensor output_for(const char* name, const OutputSpec* spec,
                         const std::vector<Override>& overrides) {
  for (const Override& o : overrides)
    if (std::string(o.name) == name) return o.desc.make();
  if (spec != nullptr && spec->produced) return Tensor::from_spec(*spec);
  if (spec != nullptr) return Tensor();
  return Tensor(DType::float32, {4});
}

}  // namespace moe_routing::testing
