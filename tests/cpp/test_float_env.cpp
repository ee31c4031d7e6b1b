// The float environment is part of the contract: the reference implementations and the CPU
// kernels run in the IEEE default one (core/float_env.h) whatever the caller set. With
// flush-to-zero and denormals-are-zero set in MXCSR first, as torch.set_flush_denormal(True)
// does, every operator (the dispatch, its backward, the combine and its backward) still gives, from
// every backend, ISA and thread count, exactly the bits the reference gives without them, on inputs
// whose results hang on subnormals; and the caller's setting is back when the call returns.
#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>

#include <cmath>

#include "finalize_cases.h"
#include "grad_cases.h"
#include "routing_cases.h"

namespace moe_routing::testing {
namespace {

constexpr unsigned kFlushToZero = 0x8000u;       // MXCSR.FTZ
constexpr unsigned kDenormalsAreZero = 0x0040u;  // MXCSR.DAZ

/// Sets FTZ and DAZ on this thread for its lifetime (what torch.set_flush_denormal(True) does).
class FlushDenormals {
 public:
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFlushToZero | kDenormalsAreZero); }
  ~FlushDenormals() { _mm_setcsr(saved_); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned saved_;
};

bool flushing() {
  return (_mm_getcsr() & (kFlushToZero | kDenormalsAreZero)) == (kFlushToZero | kDenormalsAreZero);
}

bool is_subnormal(float v) { return v != 0.0f && std::fabs(v) < 0x1p-126f; }

/// Subnormal float32 values: k * 2^-149 with |k| < 2^20, sums of a few of them stay subnormal.
std::vector<float> subnormals(Random& rng, int64_t n) {
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) v = std::ldexp(float(rng.integer(-(1 << 20), 1 << 20)), -149);
  return values;
}

TEST(FloatEnvironment, GradGivesTheSameBitsUnderFlushToZero) {
  Random rng(20240611);
  const Runner reference{Backend::reference, CpuIsa::automatic, 1};
  for (DType dtype : {DType::float32, DType::bfloat16, DType::float16})
    for (AccumulationOrder order : {AccumulationOrder::tree, AccumulationOrder::sequential}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + accumulation_order_name(order));
      GradCase c = make_grad_case(rng, GradScenario::dropless, dtype, 9, 6, 37, 0.1);
      c.attrs.order = order;
      // float16 has no float32 subnormals: its own subnormals (k * 2^-24) sum to float16
      // subnormals, which the narrowing must keep.
      std::vector<float> values = subnormals(rng, c.grad.count());
      if (dtype == DType::float16)
        for (float& v : values) v = std::ldexp(float(rng.integer(-300, 300)), -24);
      c.grad = FloatBuffer::from_floats(dtype, values);
      const FloatBuffer expected = run_grad_case(c, reference);
      int64_t subnormal_results = 0;
      for (int64_t i = 0; i < expected.count(); ++i) {
        const float v = expected.at(i);
        subnormal_results +=
            dtype == DType::float16 ? (v != 0.0f && std::fabs(v) < 0x1p-14f) : is_subnormal(v);
      }
      ASSERT_GT(subnormal_results, expected.count() / 2) << "the case must hang on subnormals";
      FlushDenormals flush;
      for (const Runner& runner : all_runners()) {
        EXPECT_TRUE(bitwise_equal(expected, run_grad_case(c, runner))) << runner.name();
        EXPECT_TRUE(flushing()) << "the caller's setting must be back: " << runner.name();
      }
    }
}

/// quant_mode 0 or 1 on x of subnormals (and a scale that makes them count).
ForwardCase subnormal_forward_case(Random& rng, DType dtype, int64_t quant_mode,
                                   Numerics numerics) {
  const int64_t N = 7, K = 3, H = 21, E = 4;
  ForwardCase c;
  c.x = Tensor::floats(dtype, {N, H}, subnormals(rng, N * H));
  std::vector<int32_t> ids(size_t(N * K));
  for (int32_t& id : ids) id = int32_t(rng.integer(0, E - 1));
  c.expert_idx = Tensor::int32s({N, K}, ids);
  c.attrs.expert_num = E;
  c.attrs.quant_mode = quant_mode;
  c.attrs.numerics = numerics;
  if (quant_mode == 0) {
    // Subnormal x = k * 2^-149 (|k| < 2^23) times 2^127 is k * 2^-22, in (-2, 2).
    c.scale = Tensor::floats(DType::float32, {1}, {0x1p127f});
    c.x = Tensor::floats(dtype, {N, H}, [&] {
      std::vector<float> v(size_t(N * H));
      for (float& f : v) f = std::ldexp(float(rng.integer(-(1 << 23) + 1, (1 << 23) - 1)), -149);
      return v;
    }());
  } else {
    // A smooth scale of subnormals too, so that f = x * smooth is flushed under FTZ.
    c.scale = Tensor::floats(DType::float32, {1, H}, [&] {
      std::vector<float> v(static_cast<size_t>(H));
      for (float& f : v) f = float(rng.integer(1, 4));
      return v;
    }());
  }
  return c;
}

TEST(FloatEnvironment, ForwardQuantisationGivesTheSameBitsUnderFlushToZero) {
  Random rng(7);
  const Runner reference{Backend::reference, CpuIsa::automatic, 1};
  for (DType dtype : {DType::float32, DType::bfloat16})
    for (int64_t quant_mode : {0, 1})
      for (Numerics numerics : {Numerics::atlas_a2, Numerics::ascend_950}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " quant_mode " + std::to_string(quant_mode) +
                     " " + numerics_name(numerics));
        ForwardCase c = subnormal_forward_case(rng, dtype, quant_mode, numerics);
        const ForwardResult expected = run_forward(c, reference);
        ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();
        // The case must hang on subnormals: non-zero int8 values (the float16 path of
        // ascend_950 static quantisation flushes them itself: zeros there, by definition), and
        // subnormal dynamic scales.
        int64_t nonzero = 0;
        for (int8_t q : expected.expanded_x.values<int8_t>()) nonzero += q != 0;
        if (!(quant_mode == 0 && numerics == Numerics::ascend_950)) {
          EXPECT_GT(nonzero, expected.expanded_x.numel() / 2);
        }
        if (quant_mode == 1) {
          for (float sc : expected.expanded_scale.values<float>()) EXPECT_TRUE(is_subnormal(sc));
        }
        FlushDenormals flush;
        for (const Runner& runner : all_runners()) {
          EXPECT_TRUE(same_result(expected, run_forward(c, runner))) << runner.name();
          EXPECT_TRUE(flushing()) << "the caller's setting must be back: " << runner.name();
        }
      }
}

TEST(FloatEnvironment, CombineGivesTheSameBitsUnderFlushToZero) {
  Random rng(611);
  const Runner reference{Backend::reference, CpuIsa::automatic, 1};
  for (Numerics numerics : kFinalizeNumerics) {
    SCOPED_TRACE(numerics_name(numerics));
    // float32 subnormal rows, x1 and bias, scales in [1, 4]: every step's result is subnormal.
    FinalizeOptions o;
    o.x1 = o.bias = o.scales = true;
    FinalizeCase c = make_finalize_case(rng, DType::float32, 2, numerics, o, 7, 3, 37);
    c.expanded_x = FloatBuffer::from_floats(DType::float32, subnormals(rng, c.expanded_x.count()));
    c.x1 = FloatBuffer::from_floats(DType::float32, subnormals(rng, c.x1.count()));
    c.bias = FloatBuffer::from_floats(DType::float32, subnormals(rng, c.bias.count()));
    std::vector<float> scales(static_cast<size_t>(c.scales.count()));
    for (float& v : scales) v = float(rng.integer(1, 4));
    c.scales = FloatBuffer::from_floats(DType::float32, scales);
    const FloatBuffer expected = run_finalize_case(c, reference);
    int64_t subnormal_results = 0;
    for (int64_t i = 0; i < expected.count(); ++i)
      subnormal_results += is_subnormal(expected.at(i));
    ASSERT_GT(subnormal_results, expected.count() / 2) << "the case must hang on subnormals";

    // The backward on subnormal grad_y: grad_expanded_x rows and the grad_scales products.
    GradOptions g;
    g.bias = g.grad_bias = true;
    FinalizeGradCase gc = make_finalize_grad_case(rng, DType::float32, 0, numerics, g, 7, 3, 37);
    gc.grad_y = FloatBuffer::from_floats(DType::float32, subnormals(rng, gc.grad_y.count()));
    // expanded_x and bias small enough that (x + bias) * grad_y and the sums stay subnormal.
    auto small = [&rng](int64_t count) {
      std::vector<float> v(static_cast<size_t>(count));
      for (float& f : v) f = float(rng.integer(-4, 4)) * 0x1p-10f;
      return FloatBuffer::from_floats(DType::float32, v);
    };
    gc.expanded_x = small(gc.expanded_x.count());
    gc.bias = small(gc.bias.count());
    gc.scales = FloatBuffer::from_floats(DType::float32, scales);
    const GradResult grad_expected = run_finalize_grad_case(gc, reference);
    int64_t subnormal_grads = 0;
    for (int64_t i = 0; i < grad_expected.grad_scales.count(); ++i)
      subnormal_grads += is_subnormal(grad_expected.grad_scales.at(i));
    ASSERT_GT(subnormal_grads, 0) << "grad_scales must hang on subnormals";

    FlushDenormals flush;
    for (const Runner& runner : all_runners()) {
      EXPECT_TRUE(bitwise_equal(expected, run_finalize_case(c, runner))) << runner.name();
      EXPECT_TRUE(grad_results_equal(grad_expected, run_finalize_grad_case(gc, runner)))
          << runner.name();
      EXPECT_TRUE(flushing()) << "the caller's setting must be back: " << runner.name();
    }
  }
}

}  // namespace
}  // namespace moe_routing::testing
#endif
