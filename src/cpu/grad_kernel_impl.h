// The grad kernel, written once over a small register-level vector interface (Ops) and
// instantiated per instruction set. Each output element's addends are summed in float32 in exactly
// the order of the reference (docs/spec/moe_init_routing.md §1.6 / §1.7); vectors run across
// columns only, so no addition is ever reassociated, and scalar tails use the same float32 adds.
//
// Two paths:
//  * registers (K <= 32 sequential, or the tree order with at most 8 bins, i.e. K < 32): for each
//    vector of columns the K addends are loaded straight from their rows and summed in registers;
//    nothing but the output is written. This is the common MoE case and runs at memory speed.
//  * bins in L1 (larger K): a tile of columns per bin in a 16 KiB stack buffer.
//
// Per-ISA code: each translation unit that includes this defines MOE_ROUTING_CPU_ISA to its
// instruction set (baseline, avx2) first, and everything here lands in
// moe_routing::cpu::<isa>. A template instance the compiler emits out of line is then a distinct
// symbol per ISA, so the linker can never keep an AVX2-compiled copy for the baseline path
// (tools/checks/check_isa.sh proves it on the built objects). For the same reason this code
// calls no inline function that baseline code also compiles, beyond the element conversions of
// moe_routing/dtype.h, which the check covers as well.
#pragma once

#if !defined(MOE_ROUTING_CPU_ISA)
#error "define MOE_ROUTING_CPU_ISA (baseline, avx2) before including cpu/grad_kernel_impl.h"
#endif

#include <cstdint>
#include <type_traits>

#include "core/float_env.h"
#include "cpu/grad_kernel.h"
#include "cpu/scalar_ops.h"
#include "moe_routing/dtype.h"

namespace moe_routing::cpu::MOE_ROUTING_CPU_ISA {

// ---- registers path -------------------------------------------------------------------------

/// The addends of one output row: K source pointers (already offset to the row's first column).
template <class S>
struct RowAddends {
  const S* source[32];
  bool present[32];
};

/// Rows with absent addends (active, drop-pad) read each absent addend from a neutral row instead
/// of branching per addend: +0.0 where the order seeds a sum with it (the reference starts from
/// +0.0 there), -0.0 where it is added (x + -0.0 == x for every x, signed zeros included, so
/// skipping an addend and adding -0.0 give the same bits; NaN payloads are canonicalised at the
/// store either way). The columns of such a row are processed in chunks of kNeutralColumns, the
/// present sources rebased to each chunk, so the neutral rows are two small stack arrays that stay
/// in L1 (reading them costs no memory bandwidth).
constexpr int64_t kNeutralColumns = 512;

template <class S>
constexpr S negative_zero() {
  if constexpr (std::is_same_v<S, float>)
    return -0.0f;
  else
    return S(0x8000);  // float16 and bfloat16
}

template <class S>
struct NeutralRows {
  alignas(64) S plus_zero[kNeutralColumns];
  alignas(64) S minus_zero[kNeutralColumns];
  bool filled = false;
  void fill() {
    if (filled) return;
    for (int64_t j = 0; j < kNeutralColumns; ++j) {
      plus_zero[j] = S(0);
      minus_zero[j] = negative_zero<S>();
    }
    filled = true;
  }
};

/// Tree order with B (<= 8) bins for the `O::W` columns at offset j. KC > 0: K is the constant KC
/// and every addend is present (a dense row, or absent ones pointing at neutral rows: no branch
/// in the column loop); KC = 0: run time K.
template <class O, class Tag, int B, bool Stream, int KC = 0>
inline void tree_columns(const RowAddends<typename Tag::storage>& row, int64_t K_, int64_t j,
                         typename Tag::storage* out) {
  const int64_t K = KC > 0 ? KC : K_;
  auto present = [&row](int64_t t) { return KC > 0 || row.present[t]; };
  auto load = [&row, j](int64_t t) { return O::template load<Tag>(row.source[t] + j); };
  typename O::V bin[B];
#pragma GCC unroll 8
  for (int b = 0; b < B; ++b)  // step 1: seed with addend 2b, +0.0 if skipped
    bin[b] = present(2 * b) ? load(2 * b) : O::zero();
  for (int64_t m0 = B; 2 * m0 < K; m0 += B) {  // step 2: even addends 2m, m >= B, into bin m % B
#pragma GCC unroll 8
    for (int b = 0; b < B; ++b) {
      const int64_t t = 2 * (m0 + b);
      if (t < K && present(t)) bin[b] = O::add(bin[b], load(t));
    }
  }
  for (int64_t m0 = 0; 2 * m0 + 1 < K; m0 += B) {  // step 3: odd addends 2m+1 into bin m % B
#pragma GCC unroll 8
    for (int b = 0; b < B; ++b) {
      const int64_t t = 2 * (m0 + b) + 1;
      if (t < K && present(t)) bin[b] = O::add(bin[b], load(t));
    }
  }
#pragma GCC unroll 4
  for (int s = 1; s < B; s *= 2)  // step 4: pairwise tree
#pragma GCC unroll 4
    for (int q = s; q < B; q += 2 * s) bin[q - s] = O::add(bin[q - s], bin[q]);
  O::template store<Tag, Stream>(out + j, bin[0]);
}

/// Sequential order for the `O::W` columns at offset j: acc = +0.0; acc += each present addend.
template <class O, class Tag, bool Stream, int KC = 0>
inline void sequential_columns(const RowAddends<typename Tag::storage>& row, int64_t K_, int64_t j,
                               typename Tag::storage* out) {
  const int64_t K = KC > 0 ? KC : K_;
  typename O::V acc = O::zero();
#pragma GCC unroll 8
  for (int64_t t = 0; t < K; ++t)
    if (KC > 0 || row.present[t]) acc = O::add(acc, O::template load<Tag>(row.source[t] + j));
  O::template store<Tag, Stream>(out + j, acc);
}

template <class O, class Tag, int B, bool Stream = false, int KC = 0>
inline void columns(const RowAddends<typename Tag::storage>& row, int64_t K, int64_t j,
                    typename Tag::storage* out, bool sequential) {
  if (sequential)
    sequential_columns<O, Tag, Stream, KC>(row, K, j, out);
  else
    tree_columns<O, Tag, B, Stream, KC>(row, K, j, out);
}

/// Columns [c0, c1) of one output row: a cache line of columns per step, then vector and scalar
/// tails. Large outputs bypass the caches (non-temporal stores): no read-for-ownership of lines
/// that are overwritten whole; that needs the vector stores aligned.
template <class Ops, class Tag, int B, int KC>
inline void row_columns(const RowAddends<typename Tag::storage>& addends, int64_t K, int64_t c0,
                        int64_t c1, typename Tag::storage* out, bool sequential,
                        bool stream_output) {
  using S = typename Tag::storage;
  // A local copy: vector stores may alias anything (the intrinsics' types do), so with the
  // caller's struct the compiler reloads every source pointer after every store; a local whose
  // address never escapes keeps them in registers (measured: 3-8% at H = 4096-7168).
  const RowAddends<S> row = addends;
  constexpr int64_t kStep = 64 / int64_t(sizeof(S));  // columns per cache line
  int64_t j = c0;
  if (stream_output && (reinterpret_cast<uintptr_t>(out + c0) % 32) == 0) {
    for (; j + kStep <= c1; j += kStep)
      for (int64_t v = 0; v < kStep; v += Ops::W)
        columns<Ops, Tag, B, true, KC>(row, K, j + v, out, sequential);
  } else {
    for (; j + kStep <= c1; j += kStep)
      for (int64_t v = 0; v < kStep; v += Ops::W)
        columns<Ops, Tag, B, false, KC>(row, K, j + v, out, sequential);
  }
  for (; j + Ops::W <= c1; j += Ops::W) columns<Ops, Tag, B, false, KC>(row, K, j, out, sequential);
  for (; j < c1; ++j) columns<ScalarOps, Tag, B, false, KC>(row, K, j, out, sequential);
}

/// Fills `row` with the addends of output row i (sources offset to column 0).
template <class S>
inline void gather_row_addends(const GradKernelArgs& args, const S* source, int64_t i,
                               RowAddends<S>* row) {
  const int64_t K = args.plan.top_k, H = args.plan.hidden, skip_from = args.plan.skip_from;
  const int32_t* rows = args.expanded_row_idx + i * K;
  for (int64_t t = 0; t < K; ++t) {
    const int64_t r = rows[t];
    row->present[t] = !(r == -1 || r >= skip_from);
    row->source[t] = row->present[t] ? source + r * H : nullptr;  // never read when absent
  }
}

/// The tree order's bin count for a K known at compile time (never a run-time call).
template <int64_t K>
constexpr int64_t kTreeBins = tree_shape(K).bins;

/// Each output row starts K new short streams at random rows, and the hardware prefetchers only
/// pick a stream up after its first misses. So while row i is summed, the first lines of row
/// i + 1's addends are requested. Measured (paired, cold caches, 2 threads, bf16): 4 lines
/// (256 bytes) per addend took 3-14% off the dropless backward at H = 2048 and 4096 and ~3% at
/// 7168; 2 or 8 lines did less.
constexpr int kPrefetchLines = 4;

template <class Ops, class Tag, int B>
void grad_units_registers(const GradKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  using S = typename Tag::storage;
  const MoeInitRoutingGradPlan& plan = args.plan;
  const int64_t K = plan.top_k, H = plan.hidden;
  const bool sequential = plan.order == AccumulationOrder::sequential;
  const S* source = static_cast<const S*>(args.grad_expanded_x);
  S* output = static_cast<S*>(args.grad_x);
  RowAddends<S>
      row{};  // value-initialised: row_columns copies all of it, K entries are set per row
  NeutralRows<S> neutral;  // filled on the first row that needs it
  for (int64_t unit = unit_begin; unit < unit_end; ++unit) {
    const int64_t i = unit / args.tiles_per_row;
    const int64_t c0 = (unit % args.tiles_per_row) * args.tile_width;
    const int64_t c1 = (H - c0) < args.tile_width ? H : c0 + args.tile_width;
    gather_row_addends(args, source, i, &row);
    if (c0 == 0 && i + 1 < plan.num_rows) {
      const int64_t row_lines = (H * int64_t(sizeof(S)) + 63) / 64;  // stay inside the row
      const int lines = row_lines < kPrefetchLines ? int(row_lines) : kPrefetchLines;
      const int32_t* next = args.expanded_row_idx + (i + 1) * K;
      for (int64_t t = 0; t < K; ++t) {
        const int64_t r = next[t];
        if (r == -1 || r >= plan.skip_from) continue;
        const char* start = reinterpret_cast<const char*>(source + r * H);
        for (int l = 0; l < lines; ++l) __builtin_prefetch(start + 64 * l, 0, 3);
      }
    }
    S* out = output + i * H;
    bool dense = true;
    for (int64_t t = 0; t < K; ++t) dense = dense && row.present[t];
    // The common top_k values take loops with K fixed at compile time (the same additions in the
    // same order, without a branch per addend): dense rows read their addends directly, rows
    // with absent addends read those from neutral rows (NeutralRows), chunk by chunk. KC is only
    // used with the bin count of its tree order (or with the sequential order, B = 1).
    auto run = [&](auto kc) {
      constexpr int KC = decltype(kc)::value;
      if (KC == 0 || dense) {
        row_columns<Ops, Tag, B, KC>(row, K, c0, c1, out, sequential, args.stream_output);
        return;
      }
      neutral.fill();
      const S* base[32];
      for (int64_t t = 0; t < K; ++t) {
        base[t] = row.source[t];
        if (!row.present[t])  // the tree order seeds bin b with addend 2b (b < B)
          base[t] = !sequential && t % 2 == 0 && t < 2 * B ? neutral.plus_zero : neutral.minus_zero;
      }
      for (int64_t cc = c0; cc < c1; cc += kNeutralColumns) {
        const int64_t width = (c1 - cc) < kNeutralColumns ? (c1 - cc) : kNeutralColumns;
        for (int64_t t = 0; t < K; ++t) row.source[t] = row.present[t] ? base[t] + cc : base[t];
        row_columns<Ops, Tag, B, KC>(row, K, 0, width, out + cc, sequential, args.stream_output);
      }
    };
    using std::integral_constant;
    if (K == 8 && (B == 1 || B == kTreeBins<8>)) {
      run(integral_constant<int, 8>());
    } else if (K == 6 && (B == 1 || B == kTreeBins<6>)) {
      run(integral_constant<int, 6>());
    } else if (K == 4 && (B == 1 || B == kTreeBins<4>)) {
      run(integral_constant<int, 4>());
    } else if (K == 2 && (B == 1 || B == kTreeBins<2>)) {
      run(integral_constant<int, 2>());
    } else {
      run(integral_constant<int, 0>());
    }
  }
  Ops::stream_fence();  // order the non-temporal stores before the pool reports completion
}

// ---- bins-in-L1 path ------------------------------------------------------------------------

template <class Ops, class Tag>
inline void row_assign(float* dst, const typename Tag::storage* src, int64_t n) {
  int64_t j = 0;
  for (; j + Ops::W <= n; j += Ops::W) Ops::store_float(dst + j, Ops::template load<Tag>(src + j));
  for (; j < n; ++j) ScalarOps::store_float(dst + j, ScalarOps::load<Tag>(src + j));
}
template <class Ops, class Tag>
inline void row_accumulate(float* dst, const typename Tag::storage* src, int64_t n) {
  int64_t j = 0;
  for (; j + Ops::W <= n; j += Ops::W)
    Ops::store_float(dst + j, Ops::add(Ops::load_float(dst + j), Ops::template load<Tag>(src + j)));
  for (; j < n; ++j)
    ScalarOps::store_float(dst + j, ScalarOps::add(dst[j], ScalarOps::load<Tag>(src + j)));
}
template <class Ops>
inline void row_zero(float* dst, int64_t n) {
  int64_t j = 0;
  for (; j + Ops::W <= n; j += Ops::W) Ops::store_float(dst + j, Ops::zero());
  for (; j < n; ++j) dst[j] = 0.0f;
}
template <class Ops, class Tag>
inline void row_narrow(typename Tag::storage* dst, const float* src, int64_t n) {
  int64_t j = 0;
  for (; j + Ops::W <= n; j += Ops::W) Ops::template store<Tag>(dst + j, Ops::load_float(src + j));
  for (; j < n; ++j) ScalarOps::store<Tag>(dst + j, src[j]);
}

template <class Ops, class Tag>
void grad_units_bins(const GradKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  using S = typename Tag::storage;
  alignas(64) float bins[kGradBinFloats];
  const MoeInitRoutingGradPlan& plan = args.plan;
  const int64_t K = plan.top_k, H = plan.hidden, skip_from = plan.skip_from;
  const S* source = static_cast<const S*>(args.grad_expanded_x);
  S* output = static_cast<S*>(args.grad_x);
  const bool sequential = plan.order == AccumulationOrder::sequential;
  const int64_t B = args.bins;
  const int64_t stride = args.tile_width;  // bin b occupies bins[b*stride, b*stride + width)

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
    if (sequential) {  // acc = +0.0, then each present addend in order
      row_zero<Ops>(bins, width);
      for (int64_t t = 0; t < K; ++t)
        if (present(t)) row_accumulate<Ops, Tag>(bins, addend(t), width);
      row_narrow<Ops, Tag>(output + i * H + c0, bins, width);
      continue;
    }
    for (int64_t b = 0; b < B; ++b) {
      if (present(2 * b))
        row_assign<Ops, Tag>(bins + b * stride, addend(2 * b), width);
      else
        row_zero<Ops>(bins + b * stride, width);
    }
    for (int64_t m = B; 2 * m < K; ++m)
      if (present(2 * m)) row_accumulate<Ops, Tag>(bins + (m % B) * stride, addend(2 * m), width);
    for (int64_t m = 0; 2 * m + 1 < K; ++m)
      if (present(2 * m + 1))
        row_accumulate<Ops, Tag>(bins + (m % B) * stride, addend(2 * m + 1), width);
    for (int64_t s = 1; s < B; s *= 2)
      for (int64_t q = s; q < B; q += 2 * s) {
        float* dst = bins + (q - s) * stride;
        const float* src = bins + q * stride;
        int64_t j = 0;
        for (; j + Ops::W <= width; j += Ops::W)
          Ops::store_float(dst + j, Ops::add(Ops::load_float(dst + j), Ops::load_float(src + j)));
        for (; j < width; ++j) dst[j] = dst[j] + src[j];
      }
    row_narrow<Ops, Tag>(output + i * H + c0, bins, width);
  }
}

template <class Ops, class Tag>
void grad_units(const GradKernelArgs& args, int64_t unit_begin, int64_t unit_end) {
  detail::DefaultFloatEnvironment float_environment;
  switch (args.register_bins) {
    case 1: return grad_units_registers<Ops, Tag, 1>(args, unit_begin, unit_end);
    case 2: return grad_units_registers<Ops, Tag, 2>(args, unit_begin, unit_end);
    case 4: return grad_units_registers<Ops, Tag, 4>(args, unit_begin, unit_end);
    case 8: return grad_units_registers<Ops, Tag, 8>(args, unit_begin, unit_end);
    default: return grad_units_bins<Ops, Tag>(args, unit_begin, unit_end);
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

}  // namespace moe_routing::cpu::MOE_ROUTING_CPU_ISA
