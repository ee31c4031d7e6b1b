// The grad kernel, written once over a small vector-operations interface (Ops) and instantiated
// per instruction set. Each output element's addends are summed in float32 in exactly the order
// of the reference (spec §1.6 / §1.7); vectors run across columns only, so no addition is ever
// reassociated, and the scalar tails use the same float32 adds.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cpu/float_env.h"
#include "cpu/grad_kernel.h"
#include "moe_routing/dtype.h"

namespace moe_routing::cpu {

struct Fp32Tag {
  using storage = float;
  static float widen(const float* p) { return *p; }
  static void narrow(float* p, float v) { *p = canonicalize_nan(v); }
};
struct Fp16Tag {
  using storage = uint16_t;
  static float widen(const uint16_t* p) { return fp16_to_float(*p); }
  static void narrow(uint16_t* p, float v) { *p = float_to_fp16(v); }
};
struct Bf16Tag {
  using storage = uint16_t;
  static float widen(const uint16_t* p) { return bf16_to_float(*p); }
  static void narrow(uint16_t* p, float v) { *p = float_to_bf16(v); }
};

/// Fallback vector interface: one float per "vector".
struct ScalarOps {
  static constexpr int W = 1;
  template <class Tag>
  static void assign_widen(float* dst, const typename Tag::storage* src) { *dst = Tag::widen(src); }
  template <class Tag>
  static void add_widen(float* dst, const typename Tag::storage* src) {
    *dst = *dst + Tag::widen(src);
  }
  static void add(float* dst, const float* src) { *dst = *dst + *src; }
  static void zero(float* dst) { *dst = 0.0f; }
  template <class Tag>
  static void narrow(typename Tag::storage* dst, const float* src) { Tag::narrow(dst, *src); }
};

// Column loops: the vector body, then the scalar tail (identical float32 semantics).
template <class Ops, class Tag>
inline void row_assign_widen(float* dst, const typename Tag::storage* src, int64_t n) {
  int64_t j = 0;
  for (; j + Ops::W <= n; j += Ops::W) Ops::template assign_widen<Tag>(dst + j, src + j);
  for (; j < n; ++j) ScalarOps::assign_widen<Tag>(dst + j, src + j);
}
template <class Ops, class Tag>
inline void row_add_widen(float* dst, const typename Tag::storage* src, int64_t n) {
  int64_t j = 0;
  for (; j + Ops::W <= n; j += Ops::W) Ops::template add_widen<Tag>(dst + j, src + j);
  for (; j < n; ++j) ScalarOps::add_widen<Tag>(dst + j, src + j);
}
template <class Ops>
inline void row_add(float* dst, const float* src, int64_t n) {
  int64_t j = 0;
  for (; j + Ops::W <= n; j += Ops::W) Ops::add(dst + j, src + j);
  for (; j < n; ++j) ScalarOps::add(dst + j, src + j);
}
template <class Ops>
inline void row_zero(float* dst, int64_t n) {
  int64_t j = 0;
  for (; j + Ops::W <= n; j += Ops::W) Ops::zero(dst + j);
  for (; j < n; ++j) ScalarOps::zero(dst + j);
}
template <class Ops, class Tag>
inline void row_narrow(typename Tag::storage* dst, const float* src, int64_t n) {
  int64_t j = 0;
  for (; j + Ops::W <= n; j += Ops::W) Ops::template narrow<Tag>(dst + j, src + j);
  for (; j < n; ++j) ScalarOps::narrow<Tag>(dst + j, src + j);
}

template <class Ops, class Tag>
void grad_units(const GradKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  using S = typename Tag::storage;
  DefaultFloatEnvironment float_environment;
  alignas(64) float bins[kGradBinFloats];
  const MoeInitRoutingGradPlan& plan = args.plan;
  const int64_t K = plan.top_k, H = plan.hidden, skip_from = plan.skip_from;
  const S* source = static_cast<const S*>(args.grad_expanded_x);
  S* output = static_cast<S*>(args.grad_x);
  const TreeShape tree = tree_shape(K);
  const int64_t B = tree.bins;

  for (int64_t unit = unit_begin; unit < unit_end; ++unit) {
    const int64_t i = unit / args.tiles_per_row;
    const int64_t c0 = (unit % args.tiles_per_row) * args.tile_width;
    const int64_t width = (H - c0) < args.tile_width ? (H - c0) : args.tile_width;
    const int32_t* rows = args.expanded_row_idx + i * K;
    auto present = [&](int64_t t) {
      const int64_t r = rows[t];
      return !(r == -1 || r >= skip_from);
    };
    auto addend = [&](int64_t t) { return source + int64_t(rows[t]) * H + c0; };
    const int64_t stride = args.tile_width;  // bin b occupies bins[b*stride, b*stride + width)

    if (plan.order == AccumulationOrder::sequential) {
      row_zero<Ops>(bins, width);
      for (int64_t t = 0; t < K; ++t)
        if (present(t)) row_add_widen<Ops, Tag>(bins, addend(t), width);
    } else {
      for (int64_t b = 0; b < B; ++b) {
        if (present(2 * b))
          row_assign_widen<Ops, Tag>(bins + b * stride, addend(2 * b), width);
        else
          row_zero<Ops>(bins + b * stride, width);
      }
      for (int64_t m = B; 2 * m < K; ++m)
        if (present(2 * m)) row_add_widen<Ops, Tag>(bins + (m % B) * stride, addend(2 * m), width);
      for (int64_t m = 0; 2 * m + 1 < K; ++m)
        if (present(2 * m + 1))
          row_add_widen<Ops, Tag>(bins + (m % B) * stride, addend(2 * m + 1), width);
      for (int64_t s = 1; s < B; s *= 2)
        for (int64_t q = s; q < B; q += 2 * s)
          row_add<Ops>(bins + (q - s) * stride, bins + q * stride, width);
    }
    row_narrow<Ops, Tag>(output + i * H + c0, bins, width);
  }
}

template <class Ops>
void grad_dispatch_dtype(const GradKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  switch (args.plan.dtype) {
    case DType::float32: grad_units<Ops, Fp32Tag>(args, unit_begin, unit_end); break;
    case DType::float16: grad_units<Ops, Fp16Tag>(args, unit_begin, unit_end); break;
    case DType::bfloat16: grad_units<Ops, Bf16Tag>(args, unit_begin, unit_end); break;
    default: break;  // unreachable: infer_moe_init_routing_grad admits floating dtypes only
  }
}

}  // namespace moe_routing::cpu
