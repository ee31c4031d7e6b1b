// What every per-ISA CPU kernel (grad_kernel_impl.h, finalize_kernel_impl.h, avx2_vector.h,
// avx512_vector.h) shares: the element types as tags (how a stored element widens to float32,
// rounds and narrows) and the scalar Ops, the one-float "vector" every vector Ops reproduces
// lane by lane and the kernels' column tails use.
//
// Per ISA: the including translation unit defines MOE_ROUTING_CPU_ISA (baseline, avx2, avx512)
// first and everything here lands in moe_routing::cpu::<isa>, so an out-of-line copy compiled
// with -mavx2 is a symbol of its own that the linker can never hand to the baseline path
// (docs/ARCHITECTURE.md, "Per-ISA code"). Beyond moe_routing/dtype.h's element conversions,
// which the tags inline (flatten), it calls nothing that baseline code shares.
#pragma once

#if !defined(MOE_ROUTING_CPU_ISA)
#error "define MOE_ROUTING_CPU_ISA (baseline, avx2, avx512) before including cpu/scalar_ops.h"
#endif

#include <cstdint>

#include "moe_routing/dtype.h"

namespace moe_routing::cpu::MOE_ROUTING_CPU_ISA {

/// The element types. widen: exact; round: to the type and back (round-to-nearest-even); narrow:
/// round-to-nearest-even with the canonical NaN (docs/decisions.md §4). flatten inlines
/// dtype.h's conversions into these per-ISA members wherever they are called from: a kernel
/// with many column tails may make the compiler emit a conversion out of line, and a copy
/// compiled for AVX2 under its shared name could be linked into the baseline path (the members
/// themselves are per-ISA symbols).
struct Fp32Tag {
  using storage = float;
  static float widen(const float* p) { return *p; }
  static float round(float v) { return v; }
  [[gnu::flatten]] static void narrow(float* p, float v) { *p = canonicalize_nan(v); }
};
struct Fp16Tag {
  using storage = uint16_t;
  [[gnu::flatten]] static float widen(const uint16_t* p) { return fp16_to_float(*p); }
  [[gnu::flatten]] static float round(float v) { return fp16_to_float(float_to_fp16(v)); }
  [[gnu::flatten]] static void narrow(uint16_t* p, float v) { *p = float_to_fp16(v); }
};
struct Bf16Tag {
  using storage = uint16_t;
  [[gnu::flatten]] static float widen(const uint16_t* p) { return bf16_to_float(*p); }
  [[gnu::flatten]] static float round(float v) { return bf16_to_float(float_to_bf16(v)); }
  [[gnu::flatten]] static void narrow(uint16_t* p, float v) { *p = float_to_bf16(v); }
};

/// One float per "vector": the definition every vector Ops has the same members as and reproduces
/// lane by lane.
struct ScalarOps {
  using V = float;
  static constexpr int W = 1;
  /// Scalar stores never stream: any address will do.
  static constexpr int kStreamAlign = 1;
  static V zero() { return 0.0f; }
  static V add(V a, V b) { return a + b; }
  static V mul(V a, V b) { return a * b; }
  static V broadcast(float s) { return s; }
  static V round_fp16(V v) { return Fp16Tag::round(v); }
  /// v rounded to Tag's type and widened back.
  template <class Tag>
  static V round_to(V v) {
    return Tag::round(v);
  }
  template <class Tag>
  static V load(const typename Tag::storage* p) {
    return Tag::widen(p);
  }
  static V load_float(const float* p) { return *p; }
  static void store_float(float* p, V v) { *p = v; }
  /// Narrows once (round-to-nearest-even) and stores; NaN becomes the canonical NaN.
  template <class Tag, bool Stream = false>
  static void store(typename Tag::storage* p, V v) {
    Tag::narrow(p, v);
  }
  static void stream_fence() {}
};

}  // namespace moe_routing::cpu::MOE_ROUTING_CPU_ISA
