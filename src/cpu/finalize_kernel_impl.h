// The kernels of moe_finalize_routing and its grad, written once over a small register-level
// vector interface (Ops) and compiled once per instruction set: the including translation unit
// defines MOE_ROUTING_CPU_ISA (baseline, avx2 or avx512), and everything here lands in
// moe_routing::cpu::<isa>, so no function compiled with -mavx2 or -mavx512f can be linked into
// another ISA's path.
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
#error \
    "define MOE_ROUTING_CPU_ISA (baseline, avx2, avx512) before including cpu/finalize_kernel_impl.h"
#endif

#include <cstdint>
#include <type_traits>

#include "core/float_env.h"
#include "cpu/finalize_kernel.h"
#include "cpu/scalar_ops.h"
#include "moe_routing/dtype.h"

namespace moe_routing::cpu::MOE_ROUTING_CPU_ISA {

using detail::FinalizeRoutingGradProblem;
using detail::FinalizeRoutingProblem;
using detail::FinalizeTerm;

/// dtype.h's load_as_float / store_from_float for the scales and grad_scales: flatten inlines
/// them, and the conversions they call, into these per-ISA wrappers, so that no copy compiled for
/// this ISA is emitted under their shared names (the linker could hand it to the baseline path;
/// docs/ARCHITECTURE.md, "Per-ISA code").
[[gnu::flatten]] inline float load_scale(const void* data, DType dtype, int64_t i) {
  return load_as_float(data, dtype, i);
}
[[gnu::flatten]] inline void store_scale(void* data, DType dtype, int64_t i, float v) {
  store_from_float(data, dtype, i, v);
}

/// The products grad_scales sums: p[j] = f32(f32(x[j] + bias[j]) * gy[j]) (bias may be null:
/// f32(x[j] * gy[j])). Ops::product_tree<Tag>(products, n, count, fold, folded) is the
/// adjacent-pair tree over `count` lanes (64 or 512) of lanes(n, count, fold, folded).
template <class S>
struct Products {
  const S* x;
  const S* bias;
  const S* gy;

  Products at(int64_t j) const { return {x + j, bias != nullptr ? bias + j : nullptr, gy + j}; }
  template <class Tag>
  float product(int64_t j) const {
    float v = Tag::widen(x + j);
    if (bias != nullptr) v = v + Tag::widen(bias + j);
    return v * Tag::widen(gy + j);
  }
  /// lanes[k] = p[k] (+ p[k + fold] for k < folded) for k < n, and +0 for n <= k < count.
  template <class Tag>
  void lanes(int64_t n, int64_t count, int64_t fold, int64_t folded, float* lanes) const {
    for (int64_t k = 0; k < n; ++k)
      lanes[k] = k < folded ? product<Tag>(k) + product<Tag>(k + fold) : product<Tag>(k);
    for (int64_t k = n; k < count; ++k) lanes[k] = 0.0f;
  }
};

// ---- the scalar Ops of these kernels ---------------------------------------------------------

/// The shared scalar Ops (cpu/scalar_ops.h) and what only these kernels need: V1's bfloat16
/// narrowing with ties away from zero, and grad_scales' trees.
struct FinalizeScalarOps : ScalarOps {
  template <bool Stream>
  static void store_bf16_half_away(uint16_t* p, float v) {
    *p = detail::bf16_half_away_from_bits(float_bits(v));
  }

  /// The adjacent-pair tree over `count` lanes (a power of two).
  static float tree(const float* lanes, int64_t count) {
    float level[detail::kGradScalesGroup];
    for (int64_t k = 0; k < count; ++k) level[k] = lanes[k];
    for (int64_t width = count; width > 1; width /= 2)
      for (int64_t k = 0; k < width / 2; ++k) level[k] = level[2 * k] + level[2 * k + 1];
    return level[0];
  }
  /// The adjacent-pair tree of Products::lanes.
  template <class Tag>
  static float product_tree(const Products<typename Tag::storage>& products, int64_t n,
                            int64_t count, int64_t fold, int64_t folded) {
    alignas(64) float lanes[detail::kGradScalesGroup];
    products.template lanes<Tag>(n, count, fold, folded, lanes);
    return tree(lanes, count);
  }
  /// out[j] = narrow(gy[j] * scale) for j < n, and the 512-lane product tree of columns [0, n)
  /// (the vector Ops do both in one pass).
  ///
  /// The vector Ops load each vector's expanded_x columns before they store its out columns
  /// (4 KiB aliasing). The two rows have the same index, so where the tensors start at the same
  /// offset in a page (PyTorch's and the bench's start 64 bytes past one) the load would follow a
  /// store to the same low 12 address bits, which the core may take for a dependence and hold the
  /// load until the store is done. Measured on AMD Zen 4 (paired in one process, bf16, K = 8, two
  /// threads, out= outputs at the inputs' page offset): 7-11 % less time at H = 2048-7168 and
  /// 1024-4096 tokens, the same time as outputs placed at another offset. The bits are those of
  /// any order (no output may overlap an input).
  template <class Tag, bool Stream>
  static float scaled_row_and_tree(const Products<typename Tag::storage>& products, float scale,
                                   typename Tag::storage* out, int64_t n, int64_t,
                                   const typename Tag::storage*) {
    for (int64_t j = 0; j < n; ++j) store<Tag>(out + j, Tag::widen(products.gy + j) * scale);
    return product_tree<Tag>(products, n, detail::kGradScalesGroup, 0, 0);
  }
};

/// The one narrowing store of an output: round-to-nearest-even, or (HalfAway, bfloat16 only)
/// ties away from zero.
template <class Ops, class Tag, bool HalfAway, bool Stream>
inline void store_out(typename Tag::storage* p, typename Ops::V v) {
  if constexpr (HalfAway)
    Ops::template store_bf16_half_away<Stream>(p, v);
  else
    Ops::template store<Tag, Stream>(p, v);
}

/// Whether output at p may take Ops' aligned streaming stores (a boundary of Ops::kStreamAlign
/// bytes: 32 with AVX2, 64 with AVX-512).
template <class Ops, class S>
inline bool stream_aligned(const S* p) {
  return (reinterpret_cast<uintptr_t>(p) % Ops::kStreamAlign) == 0;
}

/// Vectors per full step of the column loops: with AVX2, 64 16-bit columns (two cache lines of
/// each source) per source row looked up; measured against 2 vectors: 5-30 % less time for the
/// forward, most where its rows are in the caches. With AVX-512, 128 columns.
constexpr int kColumnStepVectors = 4;

/// One step of a column loop: U vectors of `O::W` columns with the Ops O, stored with
/// non-temporal stores where Stream.
template <class O, int U, bool Stream>
struct ColumnStep {
  using Ops = O;
  static constexpr int kVectors = U;
  static constexpr bool kStream = Stream;
};

/// Visits columns [c0, c1) of an output row: `columns(ColumnStep<...>{}, j)` computes and stores
/// the step's columns at j. Steps of kColumnStepVectors vectors (each source row is looked up
/// once per step), then one vector, then single columns. Where `stream`, the columns before the
/// row's first Ops::kStreamAlign boundary go through the cache one at a time, so that the rows
/// of a buffer that is not so aligned stream too, and where also `last` (the pass that stores to
/// out) the full steps from there on are non-temporal. Every pass over the same columns must
/// pass the same `stream`: the earlier ones keep their sums in a float buffer, where a vector's
/// lanes are in the Ops' own order (bfloat16: the even columns, then the odd ones), so each pass
/// has to cut the columns into the same steps.
template <class Ops, class S, class Columns>
inline void visit_columns(S* out, int64_t c0, int64_t c1, bool stream, bool last,
                          const Columns& columns) {
  constexpr int64_t W = Ops::W, U = kColumnStepVectors;
  int64_t j = c0;
  if (stream) {
    int64_t head = c0;
    while (head < c1 && head - c0 < 32 && !stream_aligned<Ops>(out + head)) ++head;
    if (stream_aligned<Ops>(out + head)) {  // else the row never reaches a boundary: cached stores
      for (; j < head; ++j) columns(ColumnStep<FinalizeScalarOps, 1, false>{}, j);
      if (last)
        for (; j + U * W <= c1; j += U * W) columns(ColumnStep<Ops, U, true>{}, j);
    }
  }
  for (; j + U * W <= c1; j += U * W) columns(ColumnStep<Ops, U, false>{}, j);
  for (; j + W <= c1; j += W) columns(ColumnStep<Ops, 1, false>{}, j);
  for (; j < c1; ++j) columns(ColumnStep<FinalizeScalarOps, 1, false>{}, j);
}

// ---- the forward --------------------------------------------------------------------------------

/// Each output row starts up to K short streams at scattered rows, which the hardware
/// prefetchers only pick up after their first misses (and lose at every 4 KiB page): while row i
/// is summed, the first lines of row i + 1's sources are requested (4 lines, as the grad kernel
/// of moe_init_routing measured best, or where the sources are far larger than the caches,
/// FinalizeKernelArgs::prefetch bytes), and there the full column steps request each source's
/// lines that far ahead (512 B - 1 KiB by the row length; on AMD Zen 4 the whole next rows at
/// their start and nothing inside: finalize_prefetch_bytes, finalize_kernel.h). Measured (bf16,
/// H = 2048-7168, K = 8, one thread): 25-45 % less time where the sources exceed the last-level
/// cache, 10-20 % more where they sit in it (the requests are then pure overhead). The grad's
/// grad_y rows, one stream each, are requested kFinalizePrefetchBytes ahead.
constexpr int kFinalizePrefetchLines = 4;
constexpr int64_t kFinalizePrefetchBytes = 1024;
/// The grad's rows named by one pair request, column step by column step, the line of the
/// expanded_x row at their place in the next step of the visit order (kFinalizeRowsInterleaved
/// rows a step) at the same column into the L2 cache (prefetcht1): a step ahead, so where the
/// rows named by one pair follow each other their expanded_x lines come from L2. (A run after a
/// row of another kind gets only its first row's first 1 KiB requested, at that row's start, and
/// the hardware prefetchers for the rest.) This replaced requesting expanded_x's own lines 1 KiB
/// ahead into L1 inside the row; grad_y's still are. Measured on an Intel VM when rows were taken
/// one at a time (bf16, K = 8, two threads, 1024-4096 tokens, alternating rounds of `moe-routing
/// bench`, AVX-512): 3-16 % less time in five of the six training rows at H = 2048-7168
/// (DeepSeek-V3 at 1024 tokens within the rounds' spread); the next row into L1 instead, or the
/// row after next, gained nothing; nor, with four rows a step, the next step's expanded_x row
/// starts into L1 as well, or its rows into L1 instead of L2.
constexpr int kFinalizeNextRowHint = 2;

/// One non-skipped pair of a row, as its columns need it.
template <class S>
struct Term {
  const S* source;  // the expanded_x row, or x[i] (copy and constant experts)
  const S* bias;    // the expert's bias row, or null
  float scale;      // widened scales[i, t]; 1 without scales (see term_value)
  const S* alpha1;  // constant experts: their rows of alpha1, alpha2, v; else null
  const S* alpha2;
  const S* v;
};

/// A term's bias step, the same for every term of a problem (docs/spec/moe_finalize_routing.md
/// §3): none (bfloat16 under atlas_a2, or ascend_950, without bias), + 0 (atlas_a2 float32 and
/// float16 without bias: -0 becomes +0), or + the expert's bias row. Decided once per call, so
/// the column loops test nothing per term.
enum class BiasStep { none, zero, row };

/// The arithmetic of one step: float16 accumulation rounds every step to float16.
template <class Ops, bool Fp16Acc>
inline typename Ops::V step(typename Ops::V v) {
  if constexpr (Fp16Acc)
    return Ops::round_fp16(v);
  else
    return v;
}

/// The term's value at the `Ops::W` columns at offset j: its source (with Constant, a constant
/// expert's alpha1 * x + alpha2 * v, each operation rounded to the dtype), + bias or + 0,
/// * scale. Without scales the scale is 1, which changes nothing: e * 1 == e for every e (a NaN
/// stays a NaN, and every NaN is stored as the canonical one), and with float16 accumulation e is
/// a float16 value already, so the rounding step keeps it.
template <class Ops, class Tag, bool Fp16Acc, BiasStep Bias, bool Constant>
inline typename Ops::V term_value(const Term<typename Tag::storage>& u, int64_t j,
                                  typename Ops::V scale) {
  using V = typename Ops::V;
  V e;
  if (Constant && u.alpha1 != nullptr) {
    const V xa = Ops::template round_to<Tag>(
        Ops::mul(Ops::template load<Tag>(u.source + j), Ops::template load<Tag>(u.alpha1 + j)));
    const V va = Ops::template round_to<Tag>(
        Ops::mul(Ops::template load<Tag>(u.v + j), Ops::template load<Tag>(u.alpha2 + j)));
    e = Ops::template round_to<Tag>(Ops::add(xa, va));
  } else {
    e = Ops::template load<Tag>(u.source + j);
  }
  if constexpr (Bias == BiasStep::row)
    e = step<Ops, Fp16Acc>(Ops::add(e, Ops::template load<Tag>(u.bias + j)));
  else if constexpr (Bias == BiasStep::zero)
    e = step<Ops, Fp16Acc>(Ops::add(e, Ops::zero()));
  return step<Ops, Fp16Acc>(Ops::mul(e, scale));
}

/// Where a pass's running sums start and end.
struct PassShape {
  bool first;  // the pass starts the sums (x1 / x2, the first term, or +0)
  bool last;   // the pass stores them to out (else to the row tile's buffer)
};

/// What the forward's column loops are compiled for: the element type, float16 accumulation,
/// V1's bfloat16 ties away from zero, the bias step, and whether any term may be a constant
/// expert's.
template <class Tag_, bool Fp16Acc_, bool HalfAway_, BiasStep Bias_, bool Constant_>
struct ForwardKind {
  using Tag = Tag_;
  static constexpr bool kFp16Acc = Fp16Acc_, kHalfAway = HalfAway_, kConstant = Constant_;
  static constexpr BiasStep kBias = Bias_;
};

/// One pass over the U vectors of columns at offset j of a row tile: the running sums start from
/// x1 (+ x2, or + 0), the first term (assigned), +0, or the buffer, take the pass's terms in
/// order, and end in out or the buffer.
template <class Ops, class Kind, int U, bool Stream>
inline void pass_columns(const FinalizeRoutingProblem& p,
                         const Term<typename Kind::Tag::storage>* terms, int64_t n, int64_t i,
                         int64_t j, PassShape shape, int64_t prefetch, float* buffer,
                         int64_t buffer_offset, typename Kind::Tag::storage* out) {
  using Tag = typename Kind::Tag;
  using S = typename Tag::storage;
  using V = typename Ops::V;
  constexpr bool A = Kind::kFp16Acc;
  constexpr int64_t W = Ops::W;
  auto value = [&](const Term<S>& t, int64_t at, V scale) {
    return term_value<Ops, Tag, A, Kind::kBias, Kind::kConstant>(t, at, scale);
  };
  V acc[U];
  int64_t u = 0;
  if (!shape.first) {
    for (int v = 0; v < U; ++v) acc[v] = Ops::load_float(buffer + buffer_offset + v * W);
  } else if (p.x1 != nullptr) {
    const S* x1 = static_cast<const S*>(p.x1) + i * p.hidden + j;
    const S* x2 = p.x2 != nullptr ? static_cast<const S*>(p.x2) + i * p.hidden + j : nullptr;
    for (int v = 0; v < U; ++v) {
      const V a = Ops::template load<Tag>(x1 + v * W);
      if (x2 != nullptr)
        acc[v] = step<Ops, A>(Ops::add(a, Ops::template load<Tag>(x2 + v * W)));
      else
        acc[v] = p.x1_plus_zero ? step<Ops, A>(Ops::add(a, Ops::zero())) : a;
    }
  } else if (p.first_term_assigned && n > 0) {
    const V scale = Ops::broadcast(terms[0].scale);
    for (int v = 0; v < U; ++v) acc[v] = value(terms[0], j + v * W, scale);  // not added to +0
    u = 1;
  } else {
    for (int v = 0; v < U; ++v) acc[v] = Ops::zero();
  }
  // Full steps request the sources' lines `prefetch` bytes ahead, inside the row.
  const bool ahead = U > 1 && prefetch > 0 && j + prefetch / int64_t(sizeof(S)) < p.hidden;
  for (; u < n; ++u) {
    const V scale = Ops::broadcast(terms[u].scale);
    if (ahead)
      for (int64_t b = 0; b < U * W * int64_t(sizeof(S)); b += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(terms[u].source + j) + prefetch + b, 0, 3);
    for (int v = 0; v < U; ++v)
      acc[v] = step<Ops, A>(Ops::add(acc[v], value(terms[u], j + v * W, scale)));
  }
  for (int v = 0; v < U; ++v) {
    if (shape.last)
      store_out<Ops, Tag, Kind::kHalfAway, Stream>(out + j + v * W, acc[v]);
    else
      Ops::store_float(buffer + buffer_offset + v * W, acc[v]);
  }
}

/// Columns [c0, c1) of row i for one pass (streamed where the output is large).
template <class Ops, class Kind>
void pass_tile(const FinalizeRoutingProblem& p, const Term<typename Kind::Tag::storage>* terms,
               int64_t n, int64_t i, int64_t c0, int64_t c1, PassShape shape, float* buffer,
               const FinalizeKernelArgs& args) {
  using S = typename Kind::Tag::storage;
  S* out = static_cast<S*>(p.out) + i * p.hidden;
  visit_columns<Ops>(out, c0, c1, args.stream_output, shape.last, [&](auto step, int64_t j) {
    using Step = decltype(step);
    pass_columns<typename Step::Ops, Kind, Step::kVectors, Step::kStream>(
        p, terms, n, i, j, shape, args.prefetch, buffer, j - c0, out);
  });
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
    u.scale = p.scales != nullptr ? load_scale(p.scales, p.scales_dtype, i * p.top_k + *t) : 1.0f;
  }
  return n;
}

template <class S>
void prefetch_row_sources(const FinalizeRoutingProblem& p, int64_t i, int64_t prefetch) {
  const int64_t lines_in_row = (p.hidden * int64_t(sizeof(S)) + 63) / 64;
  const int64_t wanted = prefetch > 0 ? prefetch / 64 : kFinalizePrefetchLines;
  const int lines = int(lines_in_row < wanted ? lines_in_row : wanted);
  for (int64_t t = 0; t < p.top_k && t < kFinalizeTermsPerPass; ++t) {
    int64_t row = 0, expert = 0;
    if (p.term(i, t, &row, &expert) != FinalizeTerm::row) continue;
    const char* start =
        reinterpret_cast<const char*>(static_cast<const S*>(p.expanded_x) + row * p.hidden);
    for (int l = 0; l < lines; ++l) __builtin_prefetch(start + 64 * l, 0, 3);
  }
}

template <class Ops, class Kind>
void finalize_units(const FinalizeKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  using S = typename Kind::Tag::storage;
  detail::DefaultFloatEnvironment float_environment;
  const FinalizeRoutingProblem& p = args.problem;
  Term<S> terms[kFinalizeTermsPerPass];
  alignas(64) float buffer[kFinalizeAccColumns];
  for (int64_t unit = unit_begin; unit < unit_end; ++unit) {
    const int64_t i = unit / args.tiles_per_row;
    const int64_t c0 = (unit % args.tiles_per_row) * args.tile_width;
    const int64_t c1 = p.hidden - c0 < args.tile_width ? p.hidden : c0 + args.tile_width;
    if (c0 == 0 && i + 1 < p.num_rows) prefetch_row_sources<S>(p, i + 1, args.prefetch);
    int64_t t = 0;
    PassShape shape{true, false};
    do {
      const int64_t n = gather_terms<typename Kind::Tag>(p, i, &t, terms);
      shape.last = t >= p.top_k;
      pass_tile<Ops, Kind>(p, terms, n, i, c0, c1, shape, buffer, args);
      shape.first = false;
    } while (!shape.last);
  }
  Ops::stream_fence();  // order the non-temporal stores before the pool reports completion
}

/// The problem's bias step and special experts, as template arguments.
template <class Ops, class Tag, bool Fp16Acc, bool HalfAway>
void finalize_units_for(const FinalizeKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  const FinalizeRoutingProblem& p = args.problem;
  const bool constant = p.alpha1 != nullptr;
  auto run = [&](auto bias) {
    constexpr BiasStep B = decltype(bias)::value;
    if (constant)
      finalize_units<Ops, ForwardKind<Tag, Fp16Acc, HalfAway, B, true>>(args, unit_begin, unit_end);
    else
      finalize_units<Ops, ForwardKind<Tag, Fp16Acc, HalfAway, B, false>>(args, unit_begin,
                                                                         unit_end);
  };
  if (p.bias != nullptr)
    run(std::integral_constant<BiasStep, BiasStep::row>{});
  else if (p.zero_bias)
    run(std::integral_constant<BiasStep, BiasStep::zero>{});
  else
    run(std::integral_constant<BiasStep, BiasStep::none>{});
}

template <class Ops>
void finalize_dispatch(const FinalizeKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  const FinalizeRoutingProblem& p = args.problem;
  switch (p.dtype) {
    case DType::float32:
      return finalize_units_for<Ops, Fp32Tag, false, false>(args, unit_begin, unit_end);
    case DType::float16:
      if (p.fp16_accumulate)
        return finalize_units_for<Ops, Fp16Tag, true, false>(args, unit_begin, unit_end);
      return finalize_units_for<Ops, Fp16Tag, false, false>(args, unit_begin, unit_end);
    case DType::bfloat16:
      if (p.bf16_half_away)
        return finalize_units_for<Ops, Bf16Tag, false, true>(args, unit_begin, unit_end);
      return finalize_units_for<Ops, Bf16Tag, false, false>(args, unit_begin, unit_end);
    default: return;  // unreachable: infer_moe_finalize_routing admits floating dtypes only
  }
}

// ---- the grad -----------------------------------------------------------------------------------

/// One pass of a sum over pairs at the U vectors of columns at offset j: rows[k] is the pass's
/// k-th pair's grad_y row and scales[k] its widened scale (1 without scales: g * 1 == g for every
/// g, a NaN staying a NaN); the first pass starts with its first pair's term (assigned), a later
/// one with the running sum in `buffer`; the last pass narrows once and stores to out, an
/// earlier one keeps the sum in `buffer`. A term is f32(grad_y[i]) * f32(scales[q]).
template <class Ops, class Tag, int U, bool Stream>
inline void pairs_columns(const typename Tag::storage* const* rows, const float* scales, int64_t n,
                          int64_t j, PassShape shape, float* buffer, int64_t buffer_offset,
                          typename Tag::storage* out) {
  using V = typename Ops::V;
  constexpr int64_t W = Ops::W;
  V acc[U];
  int64_t k = 0;
  if (shape.first) {
    const V scale = Ops::broadcast(scales[0]);
    for (int v = 0; v < U; ++v)
      acc[v] = Ops::mul(Ops::template load<Tag>(rows[0] + j + v * W), scale);
    k = 1;
  } else {
    for (int v = 0; v < U; ++v) acc[v] = Ops::load_float(buffer + buffer_offset + v * W);
  }
  for (; k < n; ++k) {
    const V scale = Ops::broadcast(scales[k]);
    for (int v = 0; v < U; ++v)
      acc[v] = Ops::add(acc[v], Ops::mul(Ops::template load<Tag>(rows[k] + j + v * W), scale));
  }
  for (int v = 0; v < U; ++v) {
    if (shape.last)
      Ops::template store<Tag, Stream>(out + j + v * W, acc[v]);
    else
      Ops::store_float(buffer + buffer_offset + v * W, acc[v]);
  }
}

/// Columns [c0, c1) of one output row: the sum over `pairs` in list order (first term assigned,
/// +0 for no pairs), narrowed once. Lists longer than one pass of kFinalizeTermsPerPass pairs run
/// pass by pass over tiles of kFinalizeAccColumns columns, each grad_y row streamed once per tile.
template <class Ops, class Tag>
void sum_pairs_row(const FinalizeRoutingGradProblem& p, const int32_t* pairs, int64_t n, int64_t c0,
                   int64_t c1, typename Tag::storage* out, bool stream_output) {
  using S = typename Tag::storage;
  if (n == 0) {
    visit_columns<Ops>(out, c0, c1, stream_output, true, [&](auto step, int64_t j) {
      using Step = decltype(step);
      using O = typename Step::Ops;
      for (int v = 0; v < Step::kVectors; ++v)
        O::template store<Tag, Step::kStream>(out + j + v * O::W, O::zero());
    });
    return;
  }
  const S* gy = static_cast<const S*>(p.grad_y);
  const S* rows[kFinalizeTermsPerPass];
  float scales[kFinalizeTermsPerPass];
  alignas(64) float buffer[kFinalizeAccColumns];
  const int64_t tile = n <= kFinalizeTermsPerPass ? c1 - c0 : kFinalizeAccColumns;
  for (int64_t t0 = c0; t0 < c1; t0 += tile) {
    const int64_t t1 = c1 - t0 < tile ? c1 : t0 + tile;
    for (int64_t k0 = 0; k0 < n; k0 += kFinalizeTermsPerPass) {
      const int64_t m = n - k0 < kFinalizeTermsPerPass ? n - k0 : kFinalizeTermsPerPass;
      for (int64_t k = 0; k < m; ++k) {
        const int64_t q = pairs[k0 + k];
        rows[k] = gy + (q / p.top_k) * p.hidden;
        scales[k] = p.scales != nullptr ? load_scale(p.scales, p.scales_dtype, q) : 1.0f;
      }
      const PassShape shape{k0 == 0, k0 + m == n};
      visit_columns<Ops>(out, t0, t1, stream_output, shape.last, [&](auto step, int64_t j) {
        using Step = decltype(step);
        pairs_columns<typename Step::Ops, Tag, Step::kVectors, Step::kStream>(
            rows, scales, m, j, shape, buffer, j - t0, out);
      });
    }
  }
}

/// How many rows named by one pair the backward takes together, their columns interleaved group
/// by group (512 columns of each row in turn; each row's own operations in its own order, so the
/// bits are those of one row at a time). After a dispatch they are mostly one token's rows: its
/// grad_y group is read once into the cache and from L1 for the others, and the rows'
/// expanded_x lines arrive as several short streams instead of one. Measured on an Intel VM (bf16,
/// K = 8, two threads, 1024-4096 tokens, alternating rounds of `moe-routing bench`, AVX-512): 1-12
/// % less time than one row at a time in all six training rows (four rounds; DeepSeek-V3 at 4096
/// tokens 40.6 -> 39.1 ms, Qwen3-235B 21.3 -> 19.7, Qwen3-30B 11.2 -> 10.3), and 2-5 % in most
/// rows of 13 earlier rounds of a prototype; 2 and 6 rows measured alike, 8 worse at H = 2048;
/// with AVX2 a tie.
constexpr int64_t kFinalizeRowsInterleaved = 4;

/// With FinalizeGradKernelArgs::request_pages (AMD Zen 4), the row loop requests one line of
/// every 4 KiB page of the rows kFinalizePagesAheadRuns runs of kFinalizeRowsInterleaved rows
/// ahead in the visit order: of their expanded_x rows into L2, of their grad_expanded_x rows with
/// the non-temporal hint. The rows lie scattered over hundreds of MB of 4 KiB pages (a row of
/// H = 2048 bf16 that starts 64 bytes past a page, as PyTorch's and the bench's do, spans two), and
/// the line requests of the run ahead (kFinalizeNextRowHint) met missing page translations: a
/// request that has to wait for a page walk is worth little. With the walks started a run
/// earlier, those requests find the translations, and the output's first stores too. Measured on
/// a Zen 4 VM (bf16 with float32 scales, K = 8, two threads, out= outputs on 4 KiB pages, five
/// alternating rounds of `moe-routing bench` against the kernels before): 0.81-0.94 of the time
/// by the median of the per-round ratios in all six training rows (H = 2048-7168, 1024 and 4096
/// tokens). Every page rather than each row's first and last line only: 3-7 % less time at
/// H = 4096-7168 and 4096 tokens, within 2.5 % elsewhere; three runs ahead (first and last lines
/// only): -5 % to +3 % against two; expanded_x's rows alone: no gain (-7 % to +10 %). On an Intel
/// VM the output's pages alone, requested with prefetcht1 or prefetchw, had cost 4-10 %; this form
/// is not measured there, so only Zen 4 takes it (docs/PERFORMANCE.md, "Page translations two runs
/// ahead").
constexpr int64_t kFinalizePagesAheadRuns = 2;
constexpr int64_t kFinalizePageBytes = 4096;

/// Requests one line of every page that the `bytes` (> 0) from `row` touch, with the hint Hint.
template <int Hint>
inline void request_row_pages(const void* row, int64_t bytes) {
  const char* p = static_cast<const char*>(row);
  for (int64_t b = 0; b < bytes; b += kFinalizePageBytes) __builtin_prefetch(p + b, 0, Hint);
  __builtin_prefetch(p + bytes - 1, 0, Hint);  // the last page, where the row starts past one
}

/// The atlas_a2 order of grad_scales, for `rows` (1..kFinalizeRowsInterleaved) pairs at once:
/// chunks of p.chunk products; in each, a 512-lane adjacent-pair tree per group of 512 (missing
/// lanes +0; `group(k, g0, n)` is pair k's tree of the n columns from g0), the group sums added in
/// order; the chunk sums added in order from +0, into sums[k]. The pairs' groups are taken in turn
/// at each g0; no pair's sums depend on another's.
template <class Group>
void atlas_a2_order(const FinalizeRoutingGradProblem& p, int64_t rows, const Group& group,
                    float* sums) {
  constexpr int64_t G = detail::kGradScalesGroup;
  for (int64_t k = 0; k < rows; ++k) sums[k] = 0.0f;
  for (int64_t c0 = 0; c0 < p.hidden; c0 += p.chunk) {
    const int64_t c1 = p.hidden - c0 < p.chunk ? p.hidden : c0 + p.chunk;
    float chunk_sums[kFinalizeRowsInterleaved];
    for (int64_t k = 0; k < rows; ++k) chunk_sums[k] = 0.0f;
    for (int64_t g0 = c0; g0 < c1; g0 += G)
      for (int64_t k = 0; k < rows; ++k)
        chunk_sums[k] = chunk_sums[k] + group(k, g0, c1 - g0 < G ? c1 - g0 : G);
    for (int64_t k = 0; k < rows; ++k) sums[k] = sums[k] + chunk_sums[k];
  }
}

/// grad_scales of one pair in the atlas_a2 order.
template <class Ops, class Tag>
float reduce_atlas_a2(const FinalizeRoutingGradProblem& p, Products<typename Tag::storage> pr) {
  float sum;
  atlas_a2_order(
      p, 1,
      [&](int64_t, int64_t g0, int64_t n) {
        return Ops::template product_tree<Tag>(pr.at(g0), n, detail::kGradScalesGroup, 0, 0);
      },
      &sum);
  return sum;
}

/// A row of grad_expanded_x named by one pair, as the one-pass path takes it.
template <class S>
struct OnePassRow {
  Products<S> products;  // its expanded_x row, its expert's bias row or null, its grad_y row
  float scale;           // its pair's scale (1 without scales)
  S* out;                // its grad_expanded_x row
  const S* next_x;       // the expanded_x row requested into L2 as its columns go, or null
  bool prefetch;         // grad_y's lines requested ahead inside the row
};

/// Rows named by one pair each (`count`, 1..kFinalizeRowsInterleaved): row k's columns (its
/// grad_y row times its scale) and its pair's grad_scales in the atlas_a2 order into sums[k], in
/// one pass over the columns, the rows interleaved group by group (with `stream`, a group's stores
/// stream where its first column is Ops::kStreamAlign-aligned; with a row's `prefetch`, its grad_y
/// lines are requested ahead inside the row; its `next_x` is requested into L2 as the columns go:
/// see kFinalizeNextRowHint).
/// A group streams where its first column is on a boundary: a chunk need not end on one
/// (12264 float32 products are 49056 bytes, an odd multiple of 32), and the groups after such a
/// chunk go through the cache.
template <class Ops, class Tag>
void scaled_rows_and_atlas_a2(const FinalizeRoutingGradProblem& p,
                              const OnePassRow<typename Tag::storage>* rows, int64_t count,
                              bool stream, float* sums) {
  atlas_a2_order(
      p, count,
      [&](int64_t k, int64_t g0, int64_t n) {
        const OnePassRow<typename Tag::storage>& row = rows[k];
        const int64_t prefetch_left = row.prefetch ? p.hidden - g0 : 0;
        const typename Tag::storage* next = row.next_x != nullptr ? row.next_x + g0 : nullptr;
        if (stream && stream_aligned<Ops>(row.out + g0))
          return Ops::template scaled_row_and_tree<Tag, true>(row.products.at(g0), row.scale,
                                                              row.out + g0, n, prefetch_left, next);
        return Ops::template scaled_row_and_tree<Tag, false>(row.products.at(g0), row.scale,
                                                             row.out + g0, n, prefetch_left, next);
      },
      sums);
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
float reduce_ascend_950(const FinalizeRoutingGradProblem& p, Products<typename Tag::storage> pr) {
  constexpr int64_t B = detail::kGradScalesBlock;
  const int64_t H = p.hidden;
  if (H <= B) return Ops::template product_tree<Tag>(pr, H, B, 0, 0);
  const int64_t Q = detail::grad_scales_fold(H);
  const int64_t blocks = Q / B;
  const int64_t sums = blocks < B ? blocks : B;  // u[m], m < sums
  const int64_t leaves = blocks / sums;          // block sums per u[m]
  int leaf_bits = 0;
  while ((int64_t(1) << leaf_bits) < leaves) ++leaf_bits;
  auto block_sum = [&](int64_t b) {  // y[j] = p[j] + p[j + Q] for j < H - Q
    const int64_t j0 = b * B, folded = H - Q - j0;
    return Ops::template product_tree<Tag>(pr.at(j0), B, B, Q,
                                           folded < 0   ? 0
                                           : folded < B ? folded
                                                        : B);
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
  detail::DefaultFloatEnvironment float_environment;
  const FinalizeRoutingGradProblem& p = args.problem;
  const int64_t H = p.hidden;
  const S* gy = static_cast<const S*>(p.grad_y);
  const S* expanded_x = static_cast<const S*>(p.expanded_x);  // may be null without grad_scales
  S* grad_expanded_x = static_cast<S*>(p.grad_expanded_x);
  auto pairs_of = [&](int64_t r) { return p.row_offsets[r + 1] - p.row_offsets[r]; };
  auto grad_y_row = [&](int64_t q) { return gy + (q / p.top_k) * H; };
  // Pair q's products over the expanded_x row x (its expert's bias row where there is bias).
  auto products = [&](const S* x, int64_t q) {
    const S* bias =
        p.bias != nullptr ? static_cast<const S*>(p.bias) + p.expert_idx[q] * H : nullptr;
    return Products<S>{x, bias, grad_y_row(q)};
  };
  // The usual row (one pair) under atlas_a2 takes the one-pass path: its columns and its pair's
  // sum together, where its stores may stream from the row's start (else the general path's head
  // is needed).
  auto one_pass = [&](int64_t i) {
    const int64_t r = args.row_order[i];
    return pairs_of(r) == 1 && p.grad_scales != nullptr && p.tree_order &&
           (!args.stream_output || stream_aligned<Ops>(grad_expanded_x + r * H));
  };
  const int64_t row_bytes = H * int64_t(sizeof(S));
  int64_t pages_requested = row_begin;  // the visit order's rows whose pages were requested
  for (int64_t i = row_begin; i < row_end;) {
    if (args.request_pages) {
      const int64_t ahead = i + (kFinalizePagesAheadRuns + 1) * kFinalizeRowsInterleaved;
      for (const int64_t until = ahead < row_end ? ahead : row_end; pages_requested < until;
           ++pages_requested) {
        const int64_t r = args.row_order[pages_requested];
        if (expanded_x != nullptr)
          request_row_pages<kFinalizeNextRowHint>(expanded_x + r * H, row_bytes);
        request_row_pages<0>(grad_expanded_x + r * H, row_bytes);
      }
    }
    // This step: a run of up to kFinalizeRowsInterleaved one-pass rows, or one other row.
    int64_t run = 0;
    while (run < kFinalizeRowsInterleaved && i + run < row_end && one_pass(i + run)) ++run;
    const int64_t step_end = i + (run > 0 ? run : 1);
    if (step_end < row_end) {  // the next step's first lines (the prefetchers' blind spot)
      const int64_t rn = args.row_order[step_end];
      const int lines = args.prefetch ? int(kFinalizePrefetchBytes / 64) : kFinalizePrefetchLines;
      // A run's rows request the next run's expanded_x rows into L2 as their columns go.
      const bool x_lines = args.prefetch && expanded_x != nullptr && run == 0;
      for (int l = 0; l < lines && 64 * l < row_bytes; ++l) {
        if (pairs_of(rn) > 0)
          __builtin_prefetch(
              reinterpret_cast<const char*>(grad_y_row(p.row_pairs[p.row_offsets[rn]])) + 64 * l, 0,
              3);
        if (x_lines)
          __builtin_prefetch(reinterpret_cast<const char*>(expanded_x + rn * H) + 64 * l, 0, 3);
      }
    }
    if (run > 0) {
      OnePassRow<S> rows[kFinalizeRowsInterleaved];
      int64_t pair[kFinalizeRowsInterleaved];
      for (int64_t k = 0; k < run; ++k) {
        const int64_t r = args.row_order[i + k];
        const int64_t q = p.row_pairs[p.row_offsets[r]];
        pair[k] = q;
        rows[k].products = products(expanded_x + r * H, q);
        rows[k].scale = p.scales != nullptr ? load_scale(p.scales, p.scales_dtype, q) : 1.0f;
        rows[k].out = grad_expanded_x + r * H;
        // Row k of the next run (its expanded_x row: one run ahead, into L2).
        rows[k].next_x = args.prefetch && i + run + k < row_end
                             ? expanded_x + args.row_order[i + run + k] * H
                             : nullptr;
        // A token's later rows find its grad_y lines in L1.
        rows[k].prefetch =
            args.prefetch && (k == 0 || rows[k].products.gy != rows[k - 1].products.gy);
      }
      float sums[kFinalizeRowsInterleaved];
      scaled_rows_and_atlas_a2<Ops, Tag>(p, rows, run, args.stream_output, sums);
      for (int64_t k = 0; k < run; ++k)
        store_scale(p.grad_scales, p.scales_dtype, pair[k], sums[k]);
      i = step_end;
      continue;
    }
    const int64_t r = args.row_order[i];
    const int32_t* pairs = p.row_pairs + p.row_offsets[r];
    const int64_t n = pairs_of(r);
    S* out = grad_expanded_x + r * H;
    sum_pairs_row<Ops, Tag>(p, pairs, n, 0, H, out, args.stream_output);
    if (p.grad_scales != nullptr) {
      // expanded_x is absent when grad_scales is not computed (no pointer arithmetic on null).
      const S* x = expanded_x + r * H;
      for (int64_t k = 0; k < n; ++k) {
        const int64_t q = pairs[k];
        const float sum = p.tree_order ? reduce_atlas_a2<Ops, Tag>(p, products(x, q))
                                       : reduce_ascend_950<Ops, Tag>(p, products(x, q));
        store_scale(p.grad_scales, p.scales_dtype, q, sum);
      }
    }
    i = step_end;
  }
  Ops::stream_fence();
}

template <class Ops, class Tag>
void grad_bias_units(const FinalizeGradKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  using S = typename Tag::storage;
  detail::DefaultFloatEnvironment float_environment;
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
