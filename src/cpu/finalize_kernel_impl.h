// The kernels of moe_finalize_routing and its grad, written once over a small register-level
// vector interface (Ops) and compiled once per instruction set: the including translation unit
// defines MOE_ROUTING_CPU_ISA (baseline or avx2), and everything here lands in
// moe_routing::cpu::<isa>, so no function compiled with -mavx2 can be linked into the baseline
// path.
//
// Exactness: vectors run across columns only, so every output element sees exactly the
// reference's operations in the reference's order (docs/moe_finalize_routing.md); tails use the
// scalar Ops with the same operations. The only cross-lane arithmetic is grad_scales' adjacent-pair
// trees, which Ops::tree computes lane-exactly. Float16 accumulation (atlas_a2) rounds every step
// to float16 in registers: an fp16 addition or multiplication done in float32 and rounded once to
// fp16 is the correctly rounded fp16 operation (float32's 24 bits >= 2*11 + 2 make the double
// rounding innocuous); rounding to bfloat16 likewise (24 >= 2*8 + 2).
#pragma once

#if !defined(MOE_ROUTING_CPU_ISA)
#error "define MOE_ROUTING_CPU_ISA (baseline or avx2) before including cpu/finalize_kernel_impl.h"
#endif

#include <cstdint>
#include <type_traits>

#include "cpu/finalize_kernel.h"
#include "cpu/float_env.h"
#include "moe_routing/dtype.h"

namespace moe_routing::cpu::MOE_ROUTING_CPU_ISA {

using detail::FinalizeRoutingGradProblem;
using detail::FinalizeRoutingProblem;
using detail::FinalizeTerm;

// ---- element types and the scalar Ops ---------------------------------------------------------

struct Fp32Tag {
  using storage = float;
  static float widen(const float* p) { return *p; }
  static float round(float v) { return v; }
  static void narrow(float* p, float v) { *p = canonicalize_nan(v); }
};
struct Fp16Tag {
  using storage = uint16_t;
  static float widen(const uint16_t* p) { return fp16_to_float(*p); }
  static float round(float v) { return fp16_to_float(float_to_fp16(v)); }
  static void narrow(uint16_t* p, float v) { *p = float_to_fp16(v); }
};
struct Bf16Tag {
  using storage = uint16_t;
  static float widen(const uint16_t* p) { return bf16_to_float(*p); }
  static float round(float v) { return bf16_to_float(float_to_bf16(v)); }
  static void narrow(uint16_t* p, float v) { *p = float_to_bf16(v); }
};

/// One float per "vector"; the definition every vector Ops reproduces lane by lane.
struct ScalarOps {
  using V = float;
  static constexpr int W = 1;
  static V zero() { return 0.0f; }
  static V add(V a, V b) { return a + b; }
  static V mul(V a, V b) { return a * b; }
  static V broadcast(float s) { return s; }
  static V round_fp16(V v) { return Fp16Tag::round(v); }
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
  /// Narrows once and stores: round-to-nearest-even, or (HalfAway, bfloat16 only) ties away from
  /// zero; NaN becomes the canonical NaN.
  template <class Tag, bool HalfAway, bool Stream = false>
  static void store(typename Tag::storage* p, V v) {
    if constexpr (HalfAway)
      *p = detail::bf16_half_away_from_bits(float_bits(v));
    else
      Tag::narrow(p, v);
  }
  static void stream_fence() {}

  /// The adjacent-pair tree over `count` lanes (a power of two).
  static float tree(const float* lanes, int64_t count) {
    float level[detail::kGradScalesGroup];
    for (int64_t k = 0; k < count; ++k) level[k] = lanes[k];
    for (int64_t width = count; width > 1; width /= 2)
      for (int64_t k = 0; k < width / 2; ++k) level[k] = level[2 * k] + level[2 * k + 1];
    return level[0];
  }
  /// dst[j] = f32(f32(x[j] + bias[j]) * gy[j]) (bias may be null: f32(x[j] * gy[j])), j < n.
  template <class Tag>
  static void products(const typename Tag::storage* x, const typename Tag::storage* bias,
                       const typename Tag::storage* gy, int64_t n, float* dst) {
    for (int64_t j = 0; j < n; ++j) {
      float v = Tag::widen(x + j);
      if (bias != nullptr) v = v + Tag::widen(bias + j);
      dst[j] = v * Tag::widen(gy + j);
    }
  }
};

/// Whether a tile of output starting at p may take the aligned streaming stores (a 32-byte
/// boundary); other tiles are written through the cache.
template <class S>
inline bool stream_aligned(const S* p) {
  return (reinterpret_cast<uintptr_t>(p) % 32) == 0;
}

// ---- the forward --------------------------------------------------------------------------------

/// One non-skipped pair of a row, as its columns need it.
template <class S>
struct Term {
  const S* source;  // the expanded_x row, or x[i] (copy and constant experts)
  const S* bias;    // the expert's bias row, or null
  float scale;      // widened scales[i, t] (unused without scales)
  const S* alpha1;  // constant experts: their rows of alpha1, alpha2, v; else null
  const S* alpha2;
  const S* v;
};

/// Row-level facts every column of a row shares.
struct RowFlags {
  bool zero_bias, has_scales;
};

/// The arithmetic of one step: float16 accumulation rounds every step to float16.
template <class Ops, bool Fp16Acc>
inline typename Ops::V step(typename Ops::V v) {
  if constexpr (Fp16Acc)
    return Ops::round_fp16(v);
  else
    return v;
}

/// The term's value at the `Ops::W` columns at offset j: its source (a constant expert's
/// alpha1 * x + alpha2 * v, each operation rounded to the dtype), + bias or + 0, * scale.
template <class Ops, class Tag, bool Fp16Acc>
inline typename Ops::V term_value(const Term<typename Tag::storage>& u, int64_t j, RowFlags f) {
  using V = typename Ops::V;
  V e;
  if (u.alpha1 != nullptr) {
    const V xa = Ops::template round_to<Tag>(
        Ops::mul(Ops::template load<Tag>(u.source + j), Ops::template load<Tag>(u.alpha1 + j)));
    const V va = Ops::template round_to<Tag>(
        Ops::mul(Ops::template load<Tag>(u.v + j), Ops::template load<Tag>(u.alpha2 + j)));
    e = Ops::template round_to<Tag>(Ops::add(xa, va));
  } else {
    e = Ops::template load<Tag>(u.source + j);
  }
  if (u.bias != nullptr)
    e = step<Ops, Fp16Acc>(Ops::add(e, Ops::template load<Tag>(u.bias + j)));
  else if (f.zero_bias)
    e = step<Ops, Fp16Acc>(Ops::add(e, Ops::zero()));
  if (f.has_scales) e = step<Ops, Fp16Acc>(Ops::mul(e, Ops::broadcast(u.scale)));
  return e;
}

/// Where a pass's running sums start and end.
struct PassShape {
  bool first;  // the pass starts the sums (x1 / x2, the first term, or +0)
  bool last;   // the pass stores them to out (else to the row tile's buffer)
};

/// One pass over the `Ops::W` columns at offset j of a row tile.
template <class Ops, class Tag, bool Fp16Acc, bool HalfAway, bool Stream>
inline void pass_columns(const FinalizeRoutingProblem& p, const Term<typename Tag::storage>* terms,
                         int64_t n, int64_t i, int64_t j, PassShape shape, RowFlags f,
                         float* buffer, int64_t buffer_offset, typename Tag::storage* out) {
  using S = typename Tag::storage;
  using V = typename Ops::V;
  V acc = Ops::zero();
  int64_t u = 0;
  if (!shape.first) {
    acc = Ops::load_float(buffer + buffer_offset);
  } else if (p.x1 != nullptr) {
    const int64_t at = i * p.hidden + j;
    const V a = Ops::template load<Tag>(static_cast<const S*>(p.x1) + at);
    if (p.x2 != nullptr)
      acc = step<Ops, Fp16Acc>(
          Ops::add(a, Ops::template load<Tag>(static_cast<const S*>(p.x2) + at)));
    else
      acc = p.x1_plus_zero ? step<Ops, Fp16Acc>(Ops::add(a, Ops::zero())) : a;
  } else if (p.first_term_assigned && n > 0) {
    acc = term_value<Ops, Tag, Fp16Acc>(terms[0], j, f);  // assigned, not added to +0
    u = 1;
  }
  for (; u < n; ++u)
    acc = step<Ops, Fp16Acc>(Ops::add(acc, term_value<Ops, Tag, Fp16Acc>(terms[u], j, f)));
  if (shape.last)
    Ops::template store<Tag, HalfAway, Stream>(out + j, acc);
  else
    Ops::store_float(buffer + buffer_offset, acc);
}

/// Columns [c0, c1) of row i for one pass: a cache line of output per step (streamed where the
/// output is large and the tile aligned), then vector and scalar tails.
template <class Ops, class Tag, bool Fp16Acc, bool HalfAway>
void pass_tile(const FinalizeRoutingProblem& p, const Term<typename Tag::storage>* terms, int64_t n,
               int64_t i, int64_t c0, int64_t c1, PassShape shape, RowFlags f, float* buffer,
               bool stream_output) {
  using S = typename Tag::storage;
  S* out = static_cast<S*>(p.out) + i * p.hidden;
  constexpr int64_t kStep = 64 / int64_t(sizeof(S));
  int64_t j = c0;
  if (shape.last && stream_output && stream_aligned(out + c0)) {
    for (; j + kStep <= c1; j += kStep)
      for (int64_t w = 0; w < kStep; w += Ops::W)
        pass_columns<Ops, Tag, Fp16Acc, HalfAway, true>(p, terms, n, i, j + w, shape, f, buffer,
                                                        j + w - c0, out);
  }
  for (; j + Ops::W <= c1; j += Ops::W)
    pass_columns<Ops, Tag, Fp16Acc, HalfAway, false>(p, terms, n, i, j, shape, f, buffer, j - c0,
                                                     out);
  for (; j < c1; ++j)
    pass_columns<ScalarOps, Tag, Fp16Acc, HalfAway, false>(p, terms, n, i, j, shape, f, buffer,
                                                           j - c0, out);
}

/// Gathers the next (at most kFinalizeTermsPerPass) non-skipped terms of row i from slot *t on;
/// returns how many, and leaves *t after the last slot it looked at.
template <class Tag>
int64_t gather_terms(const FinalizeRoutingProblem& p, int64_t i, int64_t* t,
                     Term<typename Tag::storage>* terms) {
  using S = typename Tag::storage;
  const int64_t H = p.hidden;
  int64_t n = 0;
  for (; *t < p.top_k && n < kFinalizeTermsPerPass; ++*t) {
    int64_t row = 0, expert = 0;
    const FinalizeTerm kind = p.term(i, *t, &row, &expert);
    if (kind == FinalizeTerm::skip) continue;
    Term<S>& u = terms[n++];
    u = Term<S>{};
    if (kind == FinalizeTerm::row)
      u.source = static_cast<const S*>(p.expanded_x) + row * H;
    else
      u.source = static_cast<const S*>(p.x) + i * H;
    if (kind == FinalizeTerm::constant) {
      const int64_t c = (expert - p.constant_start) * H;
      u.alpha1 = static_cast<const S*>(p.alpha1) + c;
      u.alpha2 = static_cast<const S*>(p.alpha2) + c;
      u.v = static_cast<const S*>(p.v) + c;
    }
    if (p.bias != nullptr) u.bias = static_cast<const S*>(p.bias) + expert * H;
    if (p.scales != nullptr) u.scale = load_as_float(p.scales, p.scales_dtype, i * p.top_k + *t);
  }
  return n;
}

/// Each output row starts up to K short streams at scattered rows, which the hardware
/// prefetchers only pick up after their first misses: while row i is summed, the first lines of
/// row i + 1's sources are requested (the grad kernel of moe_init_routing measured 4 lines best).
constexpr int kFinalizePrefetchLines = 4;

template <class S>
void prefetch_row_sources(const FinalizeRoutingProblem& p, int64_t i) {
  const int64_t lines_in_row = (p.hidden * int64_t(sizeof(S)) + 63) / 64;
  const int lines =
      lines_in_row < kFinalizePrefetchLines ? int(lines_in_row) : kFinalizePrefetchLines;
  for (int64_t t = 0; t < p.top_k && t < kFinalizeTermsPerPass; ++t) {
    int64_t row = 0, expert = 0;
    if (p.term(i, t, &row, &expert) != FinalizeTerm::row) continue;
    const char* start =
        reinterpret_cast<const char*>(static_cast<const S*>(p.expanded_x) + row * p.hidden);
    for (int l = 0; l < lines; ++l) __builtin_prefetch(start + 64 * l, 0, 3);
  }
}

template <class Ops, class Tag, bool Fp16Acc, bool HalfAway>
void finalize_units(const FinalizeKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  using S = typename Tag::storage;
  DefaultFloatEnvironment float_environment;
  const FinalizeRoutingProblem& p = args.problem;
  const RowFlags flags{p.zero_bias, p.scales != nullptr};
  Term<S> terms[kFinalizeTermsPerPass];
  alignas(64) float buffer[kFinalizeAccColumns];
  for (int64_t unit = unit_begin; unit < unit_end; ++unit) {
    const int64_t i = unit / args.tiles_per_row;
    const int64_t c0 = (unit % args.tiles_per_row) * args.tile_width;
    const int64_t c1 = p.hidden - c0 < args.tile_width ? p.hidden : c0 + args.tile_width;
    if (c0 == 0 && i + 1 < p.num_rows) prefetch_row_sources<S>(p, i + 1);
    int64_t t = 0;
    PassShape shape{true, false};
    do {
      const int64_t n = gather_terms<Tag>(p, i, &t, terms);
      shape.last = t >= p.top_k;
      pass_tile<Ops, Tag, Fp16Acc, HalfAway>(p, terms, n, i, c0, c1, shape, flags, buffer,
                                             args.stream_output);
      shape.first = false;
    } while (!shape.last);
  }
  Ops::stream_fence();  // order the non-temporal stores before the pool reports completion
}

template <class Ops>
void finalize_dispatch(const FinalizeKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  const FinalizeRoutingProblem& p = args.problem;
  switch (p.dtype) {
    case DType::float32:
      return finalize_units<Ops, Fp32Tag, false, false>(args, unit_begin, unit_end);
    case DType::float16:
      if (p.fp16_accumulate)
        return finalize_units<Ops, Fp16Tag, true, false>(args, unit_begin, unit_end);
      return finalize_units<Ops, Fp16Tag, false, false>(args, unit_begin, unit_end);
    case DType::bfloat16:
      if (p.bf16_half_away)
        return finalize_units<Ops, Bf16Tag, false, true>(args, unit_begin, unit_end);
      return finalize_units<Ops, Bf16Tag, false, false>(args, unit_begin, unit_end);
    default: return;  // unreachable: infer_moe_finalize_routing admits floating dtypes only
  }
}

// ---- the grad -----------------------------------------------------------------------------------

/// One pass of a sum over pairs at the `Ops::W` columns at offset j: `pairs`/`scales` are the
/// pass's pairs (scales widened; unused without scales); the first pass starts with its first
/// pair's term (assigned), a later one with the running sum in `buffer`; the last pass narrows
/// once and stores to out, an earlier one keeps the sum in `buffer`. A term is
/// f32(grad_y[i]) * f32(scales[q]), or grad_y[i] alone.
template <class Ops, class Tag, bool Stream>
inline void pairs_columns(const FinalizeRoutingGradProblem& p, const int32_t* pairs,
                          const float* scales, int64_t n, int64_t j, PassShape shape, float* buffer,
                          int64_t buffer_offset, typename Tag::storage* out) {
  using S = typename Tag::storage;
  const S* gy = static_cast<const S*>(p.grad_y);
  auto term = [&](int64_t k) {
    const typename Ops::V g = Ops::template load<Tag>(gy + (pairs[k] / p.top_k) * p.hidden + j);
    return p.scales != nullptr ? Ops::mul(g, Ops::broadcast(scales[k])) : g;
  };
  typename Ops::V acc = shape.first ? term(0) : Ops::load_float(buffer + buffer_offset);
  for (int64_t k = shape.first ? 1 : 0; k < n; ++k) acc = Ops::add(acc, term(k));
  if (shape.last)
    Ops::template store<Tag, false, Stream>(out + j, acc);
  else
    Ops::store_float(buffer + buffer_offset, acc);
}

/// Columns [c0, c1) of one output row: the sum over `pairs` in list order (first term assigned,
/// +0 for no pairs), narrowed once. Lists longer than one pass of kFinalizeTermsPerPass pairs run
/// pass by pass over tiles of kFinalizeAccColumns columns, each grad_y row streamed once per tile.
template <class Ops, class Tag>
void sum_pairs_row(const FinalizeRoutingGradProblem& p, const int32_t* pairs, int64_t n, int64_t c0,
                   int64_t c1, typename Tag::storage* out, bool stream_output) {
  using S = typename Tag::storage;
  constexpr int64_t kStep = 64 / int64_t(sizeof(S));
  if (n == 0) {
    int64_t j = c0;
    for (; j + Ops::W <= c1; j += Ops::W) Ops::template store<Tag, false>(out + j, Ops::zero());
    for (; j < c1; ++j) ScalarOps::store<Tag, false>(out + j, 0.0f);
    return;
  }
  float scales[kFinalizeTermsPerPass];
  alignas(64) float buffer[kFinalizeAccColumns];
  const int64_t tile = n <= kFinalizeTermsPerPass ? c1 - c0 : kFinalizeAccColumns;
  for (int64_t t0 = c0; t0 < c1; t0 += tile) {
    const int64_t t1 = c1 - t0 < tile ? c1 : t0 + tile;
    for (int64_t k0 = 0; k0 < n; k0 += kFinalizeTermsPerPass) {
      const int64_t m = n - k0 < kFinalizeTermsPerPass ? n - k0 : kFinalizeTermsPerPass;
      for (int64_t k = 0; p.scales != nullptr && k < m; ++k)
        scales[k] = load_as_float(p.scales, p.scales_dtype, pairs[k0 + k]);
      const PassShape shape{k0 == 0, k0 + m == n};
      int64_t j = t0;
      if (shape.last && stream_output && stream_aligned(out + t0))
        for (; j + kStep <= t1; j += kStep)
          for (int64_t w = 0; w < kStep; w += Ops::W)
            pairs_columns<Ops, Tag, true>(p, pairs + k0, scales, m, j + w, shape, buffer,
                                          j + w - t0, out);
      for (; j + Ops::W <= t1; j += Ops::W)
        pairs_columns<Ops, Tag, false>(p, pairs + k0, scales, m, j, shape, buffer, j - t0, out);
      for (; j < t1; ++j)
        pairs_columns<ScalarOps, Tag, false>(p, pairs + k0, scales, m, j, shape, buffer, j - t0,
                                             out);
    }
  }
}

/// grad_scales of one pair in the atlas_a2 order: chunks of p.chunk products; in each, a 512-lane
/// adjacent-pair tree per group of 512 (missing lanes +0), the group sums added in order; the
/// chunk sums added in order from +0.
template <class Ops, class Tag>
float reduce_atlas_a2(const FinalizeRoutingGradProblem& p, const typename Tag::storage* x,
                      const typename Tag::storage* bias, const typename Tag::storage* gy) {
  constexpr int64_t G = detail::kGradScalesGroup;
  alignas(64) float lanes[G];
  float total = 0.0f;
  for (int64_t c0 = 0; c0 < p.hidden; c0 += p.chunk) {
    const int64_t c1 = p.hidden - c0 < p.chunk ? p.hidden : c0 + p.chunk;
    float chunk_sum = 0.0f;
    for (int64_t g0 = c0; g0 < c1; g0 += G) {
      const int64_t n = c1 - g0 < G ? c1 - g0 : G;
      Ops::template products<Tag>(x + g0, bias != nullptr ? bias + g0 : nullptr, gy + g0, n, lanes);
      for (int64_t k = n; k < G; ++k) lanes[k] = 0.0f;
      chunk_sum = chunk_sum + Ops::tree(lanes, G);
    }
    total = total + chunk_sum;
  }
  return total;
}

/// Bits of k reversed over `bits` bits.
inline int64_t bit_reverse(int64_t k, int bits) {
  int64_t r = 0;
  for (int b = 0; b < bits; ++b) r |= ((k >> b) & 1) << (bits - 1 - b);
  return r;
}

/// grad_scales of one pair in the ascend_950 order. H <= 64: one 64-lane tree. Else, with Q the
/// largest power of two <= H: y[j] = p[j] + p[j + Q] for j < H - Q (else p[j]); block sums
/// t[b] = 64-lane tree of y[64b ..); while more than 64 remain, t[m] = t[m] + t[m + half]; a final
/// 64-lane tree. The halvings leave u[m] = the adjacent-pair tree over t[m + 64 * bitrev(s)],
/// s = 0, 1, ...: computed here leaf by leaf with a binary-counter stack, so no block sum is stored
/// and every block tree is computed once.
template <class Ops, class Tag>
float reduce_ascend_950(const FinalizeRoutingGradProblem& p, const typename Tag::storage* x,
                        const typename Tag::storage* bias, const typename Tag::storage* gy) {
  constexpr int64_t B = detail::kGradScalesBlock;
  const int64_t H = p.hidden;
  alignas(64) float lanes[B], folded[B];
  auto products = [&](int64_t j, int64_t n, float* dst) {
    Ops::template products<Tag>(x + j, bias != nullptr ? bias + j : nullptr, gy + j, n, dst);
  };
  if (H <= B) {
    products(0, H, lanes);
    for (int64_t k = H; k < B; ++k) lanes[k] = 0.0f;
    return Ops::tree(lanes, B);
  }
  const int64_t Q = detail::grad_scales_fold(H);
  const int64_t blocks = Q / B;
  const int64_t sums = blocks < B ? blocks : B;  // u[m], m < sums
  const int64_t leaves = blocks / sums;          // block sums per u[m]
  int leaf_bits = 0;
  while ((int64_t(1) << leaf_bits) < leaves) ++leaf_bits;
  auto block_sum = [&](int64_t b) {
    const int64_t j0 = b * B;
    products(j0, B, lanes);
    const int64_t folded_end = H - Q;  // y[j] = p[j] + p[j + Q] for j < H - Q
    if (j0 < folded_end) {
      const int64_t n = folded_end - j0 < B ? folded_end - j0 : B;
      products(j0 + Q, n, folded);
      for (int64_t k = 0; k < n; ++k) lanes[k] = lanes[k] + folded[k];
    }
    return Ops::tree(lanes, B);
  };
  alignas(64) float u[B];
  for (int64_t m = 0; m < B; ++m) u[m] = 0.0f;
  for (int64_t m = 0; m < sums; ++m) {
    float stack[32];
    float carry = 0.0f;
    for (int64_t s = 0; s < leaves; ++s) {
      carry = block_sum(m + sums * bit_reverse(s, leaf_bits));
      for (int level = 0; level < leaf_bits; ++level) {
        if (((s >> level) & 1) == 0) {
          stack[level] = carry;
          break;
        }
        carry = stack[level] + carry;
      }
    }
    u[m] = carry;
  }
  return Ops::tree(u, B);
}

template <class Ops, class Tag>
void grad_rows(const FinalizeGradKernelArgs& args, int64_t row_begin, int64_t row_end) {
  using S = typename Tag::storage;
  DefaultFloatEnvironment float_environment;
  const FinalizeRoutingGradProblem& p = args.problem;
  const int64_t H = p.hidden;
  const S* gy = static_cast<const S*>(p.grad_y);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int32_t* pairs = p.row_pairs + p.row_offsets[r];
    const int64_t n = p.row_offsets[r + 1] - p.row_offsets[r];
    if (r + 1 < row_end) {  // the next row's first grad_y lines (the prefetchers' blind spot)
      const int64_t next = p.row_offsets[r + 1];
      if (p.row_offsets[r + 2] > next)
        for (int l = 0; l < kFinalizePrefetchLines && 64 * l < H * int64_t(sizeof(S)); ++l)
          __builtin_prefetch(
              reinterpret_cast<const char*>(gy + (p.row_pairs[next] / p.top_k) * H) + 64 * l, 0, 3);
    }
    sum_pairs_row<Ops, Tag>(p, pairs, n, 0, H, static_cast<S*>(p.grad_expanded_x) + r * H,
                            args.stream_output);
    if (p.grad_scales == nullptr) continue;
    const S* x = static_cast<const S*>(p.expanded_x) + r * H;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t q = pairs[k];
      const S* bias =
          p.bias != nullptr ? static_cast<const S*>(p.bias) + p.expert_idx[q] * H : nullptr;
      const S* g = gy + (q / p.top_k) * H;
      const float sum = p.tree_order ? reduce_atlas_a2<Ops, Tag>(p, x, bias, g)
                                     : reduce_ascend_950<Ops, Tag>(p, x, bias, g);
      store_from_float(p.grad_scales, p.scales_dtype, q, sum);
    }
  }
  Ops::stream_fence();
}

template <class Ops, class Tag>
void grad_bias_units(const FinalizeGradKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  using S = typename Tag::storage;
  DefaultFloatEnvironment float_environment;
  const FinalizeRoutingGradProblem& p = args.problem;
  for (int64_t unit = unit_begin; unit < unit_end; ++unit) {
    const int64_t e = unit / args.bias_tiles_per_row;
    const int64_t c0 = (unit % args.bias_tiles_per_row) * args.bias_tile_width;
    const int64_t c1 = p.hidden - c0 < args.bias_tile_width ? p.hidden : c0 + args.bias_tile_width;
    const int64_t k0 = p.expert_offsets[e], n = p.expert_offsets[e + 1] - k0;
    sum_pairs_row<Ops, Tag>(p, p.expert_pairs + k0, n, c0, c1,
                            static_cast<S*>(p.grad_bias) + e * p.hidden, false);
  }
}

template <class Ops>
void grad_rows_dispatch(const FinalizeGradKernelArgs& args, int64_t begin, int64_t end) {
  switch (args.problem.dtype) {
    case DType::float32: return grad_rows<Ops, Fp32Tag>(args, begin, end);
    case DType::float16: return grad_rows<Ops, Fp16Tag>(args, begin, end);
    case DType::bfloat16: return grad_rows<Ops, Bf16Tag>(args, begin, end);
    default: return;  // unreachable: floating dtypes only
  }
}

template <class Ops>
void grad_bias_dispatch(const FinalizeGradKernelArgs& args, int64_t begin, int64_t end) {
  switch (args.problem.dtype) {
    case DType::float32: return grad_bias_units<Ops, Fp32Tag>(args, begin, end);
    case DType::float16: return grad_bias_units<Ops, Fp16Tag>(args, begin, end);
    case DType::bfloat16: return grad_bias_units<Ops, Bf16Tag>(args, begin, end);
    default: return;
  }
}

}  // namespace moe_routing::cpu::MOE_ROUTING_CPU_ISA
