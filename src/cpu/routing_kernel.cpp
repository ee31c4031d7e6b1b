// The CPU kernels of the forward routing (both moe_init_routing_v2 and moe_init_routing).
#include "cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "core/float_env.h"
#include "core/memory_hints.h"
#include "core/thread_pool.h"
#include "cpu/routing_sort.h"
#include "cpu/stream_copy.h"
#include "params/quantize.h"

namespace moe_routing::cpu {
namespace {

using detail::CountFormat;
using detail::DefaultFloatEnvironment;
using detail::RoutingProblem;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

/// Runs fn(block, begin, end) over `blocks` contiguous blocks of [0, n).
template <class Fn>
void for_blocks(int64_t n, int64_t blocks, int num_threads, const Fn& fn) {
  detail::parallel_for(blocks, num_threads, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) fn(b, n * b / blocks, n * (b + 1) / blocks);
  });
}

/// Parallel loop over [0, n) in contiguous pieces.
template <class Fn>
void parallel_range(int64_t n, int num_threads, const Fn& fn) {
  detail::parallel_for(n, num_threads, [&](int64_t begin, int64_t end) { fn(begin, end); });
}

/// Copies a row; `stream`: with non-temporal stores where the destination is aligned
/// (cpu/stream_copy.h). Vector loops rather than memcpy (see avx2::copy). Callers issue
/// stream_fence() before the data is published to another thread.
inline void copy_row(char* dst, const char* src, size_t bytes, bool stream, bool avx2) {
#if defined(MOE_ROUTING_HAVE_AVX2)
  if (avx2) {
    if (stream)
      avx2::stream_copy(dst, src, bytes);
    else
      avx2::copy(dst, src, bytes);
    return;
  }
#endif
  (void)avx2;
#if defined(__SSE2__)
  size_t i = 0;
  if (stream) {
    const size_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
    if (head >= bytes) {
      std::memcpy(dst, src, bytes);
      return;
    }
    std::memcpy(dst, src, head);
    i = head;
  }
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    if (stream) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
  }
  std::memcpy(dst + i, src + i, bytes - i);
#else
  (void)stream;
  std::memcpy(dst, src, bytes);
#endif
}

/// Zeroes a row; `stream`: with non-temporal stores where the destination is aligned (as
/// copy_row: a large output's empty rows then cost no read-for-ownership and evict nothing).
inline void zero_row(char* dst, size_t bytes, bool stream) {
#if defined(__SSE2__)
  if (stream) {
    const size_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
    if (head < bytes) {
      std::memset(dst, 0, head);
      size_t i = head;
      const __m128i zero = _mm_setzero_si128();
      for (; i + 64 <= bytes; i += 64) {
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), zero);
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), zero);
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), zero);
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), zero);
      }
      for (; i + 16 <= bytes; i += 16) _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), zero);
      std::memset(dst + i, 0, bytes - i);
      return;
    }
  }
#endif
  (void)stream;
  std::memset(dst, 0, bytes);
}

inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

/// Element j of a row of x widened to float32 (typed loads, so the loops below vectorise).
template <DType kDtype>
inline float widen(const void* row, int64_t j) {
  if constexpr (kDtype == DType::float16) {
    return fp16_to_float(static_cast<const uint16_t*>(row)[j]);
  } else if constexpr (kDtype == DType::bfloat16) {
    return bf16_to_float(static_cast<const uint16_t*>(row)[j]);
  } else {
    return static_cast<const float*>(row)[j];
  }
}

/// quant_mode 1 for one row, in two sweeps over the source (f is recomputed with the same
/// float32 operations instead of being stored: no allocation per row or per thread). Returns the
/// scale. Same results as the reference's f -> abs_max_step -> dynamic_quantize sequence: the
/// maximum of the non-NaN |f| does not depend on the order, so it is reduced in lanes, and a NaN
/// anywhere makes it NaN, as abs_max_step does.
template <DType kDtype, bool kSmooth>
float dynamic_quantize_row(const void* row, const float* smooth, int64_t H, Numerics numerics,
                           int8_t* out) {
  auto f = [row, smooth](int64_t j) {
    const float v = widen<kDtype>(row, j);
    if constexpr (kSmooth) return v * smooth[j];
    return v;
  };
  constexpr int kLanes = 8;
  float lane_max[kLanes] = {};
  int32_t nan_seen = 0;
  int64_t j = 0;
  for (; j + kLanes <= H; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float a = std::fabs(f(j + l));
      lane_max[l] = a > lane_max[l] ? a : lane_max[l];
      nan_seen |= int32_t(quantize::is_nan_bits(a));
    }
  float abs_max = 0.0f;
  for (; j < H; ++j) abs_max = quantize::abs_max_step(abs_max, f(j));
  for (int l = 0; l < kLanes; ++l) abs_max = quantize::abs_max_step(abs_max, lane_max[l]);
  if (nan_seen != 0) abs_max = std::numeric_limits<float>::quiet_NaN();
  const float sc = quantize::dynamic_scale(abs_max, numerics);
  for (int64_t i = 0; i < H; ++i) out[i] = quantize::dynamic_quantize(f(i), sc);
  return sc;
}

/// Whether expanded_x is written with non-temporal stores (core/memory_hints.h): its bytes (int8
/// when quantised) against x's, which the call reads. Saturated: an empty x may come with any
/// hidden size, whose byte count overflows int64.
bool streams_expanded_x(const RoutingProblem& pr) {
  const int64_t x_element = int64_t(dtype_size(pr.x_dtype));
  const int64_t element = pr.quant_mode == -1 ? x_element : 1;
  const int64_t expanded_values = detail::saturating_mul(pr.expanded_rows, pr.hidden);
  return detail::streams_output(
      detail::saturating_mul(expanded_values, element),
      detail::saturating_mul(detail::saturating_mul(pr.num_rows, pr.hidden), x_element));
}

/// Plain routing: whether rows go token by token to their destinations (x read once, in order;
/// each destination row written whole) rather than destination by destination (every row of
/// expanded_x written in order, its source row looked up). Scattering wins where expanded_x
/// streams to memory (training sizes; writing in destination order measured slower there) and
/// where x is larger than a core's caches; with a small x and an expanded_x that stays in the
/// caches (decode sizes), the destination order's sequential writes win. Measured in
/// bench/torch_compare.py against PyTorch's index_select, paired per run, bf16, two threads:
/// 128 tokens of Qwen3-235B (x 1 MiB, expanded_x 8 MiB) 0.72-0.76x of PyTorch's time scattered,
/// 1.05-1.26x in destination order; DeepSeek-V3 (x 1.8 MiB, 14 MiB) 0.66-0.91x -> 0.89-1.07x;
/// Qwen3-30B at 1024 tokens (x 4 MiB, 16 MiB) 6 % slower in destination order.
bool scatters_rows(const RoutingProblem& pr) {
  const double x_bytes = double(pr.num_rows) * double(pr.hidden) * double(dtype_size(pr.x_dtype));
  return streams_expanded_x(pr) || x_bytes * 16 > double(detail::streaming_store_threshold());
}

/// Writes destination rows of every row-shaped output; kDtype is x's dtype (quantised paths).
template <DType kDtype>
class RowWriter {
 public:
  RowWriter(const RoutingProblem& pr, const quantize::StaticParams& static_params, bool avx2,
            bool stream)
      : pr_(pr), static_params_(static_params), avx2_(avx2), stream_(stream) {}

  /// Row `dest` from pair p, zeros when p == -1, untouched when p == -2 (written elsewhere).
  void write(int64_t dest, int64_t p) const {
    const int64_t H = pr_.hidden;
    if (p == -2) return;
    if (p < 0) {
      const size_t out_size = pr_.quant_mode == -1 ? dtype_size(pr_.x_dtype) : 1;
      if (H > 0)
        zero_row(static_cast<char*>(pr_.expanded_x) + size_t(dest * H) * out_size,
                 size_t(H) * out_size, stream_);
      if (pr_.expanded_scale != nullptr) pr_.expanded_scale[dest] = 0.0f;
      if (pr_.expanded_topk_weight != nullptr) pr_.expanded_topk_weight[dest] = 0.0f;
      return;
    }
    const int64_t token = p / pr_.top_k;
    if (pr_.quant_mode == -1) {
      const size_t size = dtype_size(pr_.x_dtype);
      if (H > 0)
        copy_row(static_cast<char*>(pr_.expanded_x) + size_t(dest * H) * size,
                 static_cast<const char*>(pr_.x) + size_t(token * H) * size, size_t(H) * size,
                 stream_, avx2_);
      if (pr_.expanded_scale != nullptr) pr_.expanded_scale[dest] = pr_.scale[token];
    } else if (pr_.quant_mode == 0) {
      int8_t* out = static_cast<int8_t*>(pr_.expanded_x) + dest * H;
      const int64_t base = token * H;
      for (int64_t j = 0; j < H; ++j)
        out[j] = quantize::static_quantize(load_as_float(pr_.x, kDtype, base + j), static_params_);
    } else {
      write_dynamic(dest, token, pr_.expert_idx[p]);
    }
    if (pr_.expanded_topk_weight != nullptr) pr_.expanded_topk_weight[dest] = pr_.topk_weight[p];
  }

 private:
  /// Dynamic quantisation of one row (see dynamic_quantize_row).
  void write_dynamic(int64_t dest, int64_t token, int64_t expert) const {
    const int64_t H = pr_.hidden;
    const char* row = static_cast<const char*>(pr_.x) + size_t(token * H) * dtype_size(kDtype);
    int8_t* out = static_cast<int8_t*>(pr_.expanded_x) + dest * H;
    float sc;
    if (pr_.scale != nullptr) {
      const float* smooth = pr_.scale + (pr_.scale_rows == 1 ? 0 : (expert - pr_.range_start)) * H;
      sc = dynamic_quantize_row<kDtype, true>(row, smooth, H, pr_.numerics, out);
    } else {
      sc = dynamic_quantize_row<kDtype, false>(row, nullptr, H, pr_.numerics, out);
    }
    pr_.expanded_scale[dest] = canonicalize_nan(sc);
  }

  const RoutingProblem& pr_;
  quantize::StaticParams static_params_;
  bool avx2_;
  bool stream_;  // non-temporal stores for plain copies and zero rows
};

/// make_source(d0) gives a callable source(d): the pair of destination row d (or -1), asked for
/// ascending d from d0 (each parallel piece makes its own, so a source may keep a cursor); rows
/// [first, rows) are written in parallel.
template <DType kDtype, class MakeSource>
void write_rows_as(const RoutingProblem& pr, const quantize::StaticParams& static_params,
                   int64_t first, int64_t rows, int num_threads, bool avx2,
                   const MakeSource& make_source) {
  const RowWriter<kDtype> writer(pr, static_params, avx2, streams_expanded_x(pr));
  parallel_range(rows - first, num_threads, [&](int64_t begin, int64_t end) {
    DefaultFloatEnvironment float_environment;
    auto source = make_source(first + begin);
    for (int64_t d = first + begin; d < first + end; ++d) writer.write(d, source(d));
    stream_fence();
  });
}

/// Writes rows [first, rows) (see RowWriter::write), in parallel; nothing when a row holds
/// nothing (RoutingProblem::writes_rows), however many rows there are.
template <class MakeSource>
void write_rows(const RoutingProblem& pr, const quantize::StaticParams& static_params,
                int64_t first, int64_t rows, int num_threads, bool avx2,
                const MakeSource& make_source) {
  if (first >= rows || !pr.writes_rows()) return;
  switch (pr.x_dtype) {
    case DType::float16:
      write_rows_as<DType::float16>(pr, static_params, first, rows, num_threads, avx2, make_source);
      break;
    case DType::bfloat16:
      write_rows_as<DType::bfloat16>(pr, static_params, first, rows, num_threads, avx2,
                                     make_source);
      break;
    default:  // float32, and int8 (quant_mode -1 only: a byte copy)
      write_rows_as<DType::float32>(pr, static_params, first, rows, num_threads, avx2, make_source);
      break;
  }
}

/// A source for write_rows that is the same function for every piece.
template <class Source>
auto same_source(const Source& source) {
  return [&source](int64_t) { return source; };
}

/// The key (id - range start) of the d-th routed pair in sorted order.
inline int64_t sorted_key(const RoutingProblem& pr, const int32_t* sorted, int64_t d) {
  return int64_t(pr.expert_idx[sorted[d]]) - pr.range_start;
}

/// The first position of sorted[lo, hi) whose key is >= `key` (hi if none), searched from lo by
/// galloping: O(log distance), so a cursor moving forward through the runs pays for the distance
/// it moves, not for the whole array.
int64_t first_at_least(const RoutingProblem& pr, const int32_t* sorted, int64_t lo, int64_t hi,
                       int64_t key) {
  if (lo >= hi || sorted_key(pr, sorted, lo) >= key) return lo;
  int64_t step = 1;  // invariant: the key at lo is < key
  while (lo + step < hi && sorted_key(pr, sorted, lo + step) < key) {
    lo += step;
    step *= 2;
  }
  const int64_t end = std::min(lo + step, hi);
  return std::lower_bound(
             sorted + lo + 1, sorted + end, key,
             [&](int32_t p, int64_t k) { return int64_t(pr.expert_idx[p]) - pr.range_start < k; }) -
         sorted;
}

/// The pair in each drop-pad slot, for slots asked in ascending order: the c-th pair of expert e
/// in the sorted order fills slot e*C + c when c < C; -1 for an empty slot. It keeps no table per
/// expert (expert_num may be 2^31 - 1 with few experts routed): an expert's run is found when its
/// first slot is asked for, and at most C of its pairs are looked at.
class SlotPairs {
 public:
  SlotPairs(const RoutingProblem& pr, const int32_t* sorted, int64_t routed)
      : pr_(pr), sorted_(sorted), routed_(routed) {}
  int64_t operator()(int64_t slot) {
    const int64_t C = pr_.expert_capacity, e = slot / C, c = slot - e * C;
    if (e != expert_) {
      expert_ = e;
      run_ = first_at_least(pr_, sorted_, run_, routed_, e);
      kept_ = 0;
      while (kept_ < C && run_ + kept_ < routed_ && sorted_key(pr_, sorted_, run_ + kept_) == e)
        ++kept_;
    }
    return c < kept_ ? sorted_[run_ + c] : -1;
  }

 private:
  const RoutingProblem& pr_;
  const int32_t* sorted_;
  int64_t routed_;
  int64_t expert_ = -1, run_ = 0, kept_ = 0;  // the expert asked last, its run and kept pairs
};

/// quant_mode -1: copies x[i] to expanded_x[dest[p]] for each pair p = i*K + t with a row
/// (dropless: dest < rows_with_data; drop-pad: dest >= 0), with its scale and topk_weight. Each
/// destination has exactly one pair, so tokens are split among threads freely.
void scatter_rows(const RoutingProblem& pr, const int32_t* dest, int64_t rows_with_data,
                  int num_threads, bool avx2) {
  const int64_t K = pr.top_k, H = pr.hidden;
  const size_t row_bytes = size_t(H) * dtype_size(pr.x_dtype);
  const bool stream = streams_expanded_x(pr);
  const int64_t limit = pr.drop_pad ? pr.expanded_rows : rows_with_data;
  if (!pr.writes_rows()) return;
  parallel_range(pr.num_rows, num_threads, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const char* source = static_cast<const char*>(pr.x) + size_t(i) * row_bytes;
      for (int64_t t = 0; t < K; ++t) {
        const int64_t p = i * K + t, d = dest[p];
        if (d < 0 || d >= limit) continue;
        if (row_bytes > 0)
          copy_row(static_cast<char*>(pr.expanded_x) + size_t(d) * row_bytes, source, row_bytes,
                   stream, avx2);
        if (pr.expanded_scale != nullptr) pr.expanded_scale[d] = pr.scale[i];
        if (pr.expanded_topk_weight != nullptr) pr.expanded_topk_weight[d] = pr.topk_weight[p];
      }
    }
    stream_fence();
  });
}

void write_count(const RoutingProblem& pr, int64_t index, int64_t value) {
  if (pr.count_dtype == DType::int32)
    static_cast<int32_t*>(pr.counts)[index] = int32_t(value);
  else
    static_cast<int64_t*>(pr.counts)[index] = value;
}

/// Calls fn(key, begin, end) for each run of equal keys in sorted[0, routed), in ascending key.
template <class Fn>
void for_each_run(const RoutingProblem& pr, const int32_t* sorted, int64_t routed, const Fn& fn) {
  for (int64_t begin = 0, end; begin < routed; begin = end) {
    const int64_t key = sorted_key(pr, sorted, begin);
    for (end = begin + 1; end < routed && sorted_key(pr, sorted, end) == key; ++end) {
    }
    fn(key, begin, end);
  }
}

/// The counts, from the runs of the sorted order straight into the output: no scratch per
/// expert, so a call with 2^31 - 1 experts and a few pairs needs none (issue 17, item 7).
void write_counts(const RoutingProblem& pr, const int32_t* sorted, int64_t routed) {
  const int64_t range = pr.range_end - pr.range_start;
  switch (pr.count_format) {
    case CountFormat::none: return;
    case CountFormat::cumsum: {
      int64_t next = 0;  // the first key not written yet
      for_each_run(pr, sorted, routed, [&](int64_t key, int64_t begin, int64_t end) {
        for (; next < key; ++next) write_count(pr, next, begin);  // `begin` pairs have lower keys
        write_count(pr, key, end);
        next = key + 1;
      });
      for (; next < range; ++next) write_count(pr, next, routed);
      return;
    }
    case CountFormat::count:
      std::memset(pr.counts, 0, size_t(range) * dtype_size(pr.count_dtype));
      for_each_run(pr, sorted, routed, [&](int64_t key, int64_t begin, int64_t end) {
        write_count(pr, key, end - begin);
      });
      return;
    case CountFormat::key_value: {
      int64_t row = 0;
      for_each_run(pr, sorted, routed, [&](int64_t key, int64_t begin, int64_t end) {
        write_count(pr, 2 * row, pr.range_start + key);
        write_count(pr, 2 * row + 1, end - begin);
        ++row;
      });
      if (row < pr.expert_num)
        std::memset(static_cast<int64_t*>(pr.counts) + 2 * row, 0,
                    size_t(pr.expert_num - row) * 2 * sizeof(int64_t));
      return;
    }
  }
}

/// Where each scratch array lives in the workspace (byte offsets from a 64-byte aligned base).
/// Sizes depend on the problem's sizes and attributes and the thread count, never on the data:
/// whatever the expert ids turn out to be, the kernel fits. Nothing is sized by expert_num or the
/// expert range (the counts and the drop-pad slots come from the runs of the sorted order), so
/// the scratch is O(pairs + threads * 2^16) whatever expert_num is.
struct ScratchLayout {
  int64_t blocks = 1;           // blocks of the key pass
  bool radix_possible = false;  // a sort may need the radix passes (then `scratch` is needed)
  uint64_t keys = 0, order = 0, scratch = 0, block_max = 0, offsets = 0;
  uint64_t bytes = 0;  // including the slack to align an arbitrary base
};

constexpr uint64_t kScratchAlign = 64;

ScratchLayout scratch_layout(const RoutingProblem& pr, int num_threads) {
  ScratchLayout layout;
  const int64_t P = pr.pairs();
  layout.blocks = std::max<int64_t>(1, std::min<int64_t>(num_threads, P / 16384));
  // The key range of the main sort: up to the largest routed key + 1, at most the expert range
  // (ids are int32, so at most 2^32 keys).
  const uint64_t range =
      uint64_t(std::min<int64_t>(pr.range_end - pr.range_start, int64_t(1) << 32));
  const bool scatter_tail = !pr.drop_pad && pr.row_idx_type == 1;  // may sort any int32 ids
  const uint64_t max_range = scatter_tail ? std::max<uint64_t>(range, uint64_t(1) << 32) : range;
  layout.radix_possible = max_range > kDirectBuckets;
  uint64_t at = 0;
  auto region = [&at](uint64_t bytes) {
    const uint64_t offset = at;
    at += (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
    return offset;
  };
  layout.keys = region(uint64_t(P) * sizeof(uint32_t));
  layout.order = region(uint64_t(P) * sizeof(int32_t));
  layout.scratch = region(layout.radix_possible ? uint64_t(P) * sizeof(int32_t) : 0);
  layout.block_max = region(uint64_t(layout.blocks) * 2 * sizeof(int64_t));
  layout.offsets =
      region(uint64_t(sort_offsets_entries(P, max_range, num_threads)) * sizeof(int64_t));
  layout.bytes = at + kScratchAlign;
  return layout;
}

/// Scratch for calls without a caller workspace. Up to kCachedScratchBytes stay allocated per
/// calling thread, so that repeated small calls (decode sizes) allocate nothing; larger scratch
/// is allocated for the call and freed after it.
constexpr uint64_t kCachedScratchBytes = uint64_t(4) << 20;

class OwnedScratch {
 public:
  /// `bytes` of scratch, valid until this object is destroyed (or the thread's next call).
  unsigned char* acquire(uint64_t bytes) {
    if (bytes > kCachedScratchBytes) {
      owned_.reset(new unsigned char[bytes]);
      return owned_.get();
    }
    thread_local std::unique_ptr<unsigned char[]> cached;
    thread_local uint64_t cached_bytes = 0;
    if (cached_bytes < bytes) {  // grows at most a few times per thread
      cached.reset();
      cached_bytes = 0;  // stays consistent if the allocation below throws
      const uint64_t grown = std::max<uint64_t>(bytes, uint64_t(64) << 10);
      cached.reset(new unsigned char[grown]);
      cached_bytes = grown;
    }
    return cached.get();
  }

 private:
  std::unique_ptr<unsigned char[]> owned_;
};

/// Bytes a call moves: the rows written (each a copy of an x row) plus the index arrays.
/// Saturates instead of overflowing: with no rows, H may be anything (x [0, H] is valid).
int64_t routing_bytes(const RoutingProblem& problem) {
  const int64_t element =
      std::max<int64_t>(1, problem.quant_mode == -1 ? int64_t(dtype_size(problem.x_dtype)) : 1);
  return detail::saturating_add(
      detail::saturating_mul(detail::saturating_mul(problem.expanded_rows, problem.hidden),
                             element),
      detail::saturating_mul(problem.pairs(), 12));
}

/// The threads a problem runs on: the requested count (0 = the library default), fewer for
/// small work. The workspace size depends on it, so both entry points below resolve it alike.
int threads_for(const RoutingProblem& problem, int requested) {
  return detail::threads_for_bytes(detail::resolve_num_threads(requested), routing_bytes(problem));
}

}  // namespace

uint64_t workspace_bytes(const RoutingProblem& problem, int num_threads) {
  return scratch_layout(problem, threads_for(problem, num_threads)).bytes;
}

int moe_init_routing_threads(const RoutingProblem& problem, int num_threads) {
  return threads_for(problem, num_threads);
}

void moe_init_routing(const RoutingProblem& pr, int requested_threads, CpuIsa isa,
                      void* workspace) {
  const int num_threads = threads_for(pr, requested_threads);
  detail::reserve_threads(num_threads);
  if (isa == CpuIsa::automatic) isa = best_cpu_isa();
  const ScratchLayout layout = scratch_layout(pr, num_threads);
  OwnedScratch owned;
  if (workspace == nullptr) workspace = owned.acquire(layout.bytes);
  const uintptr_t raw = reinterpret_cast<uintptr_t>(workspace);
  unsigned char* base = static_cast<unsigned char*>(workspace) +
                        ((kScratchAlign - raw % kScratchAlign) % kScratchAlign);
  auto at = [base](uint64_t offset) { return static_cast<void*>(base + offset); };

  const int64_t P = pr.pairs();
  const int64_t start = pr.range_start, end = pr.range_end;
  uint32_t* keys = static_cast<uint32_t*>(at(layout.keys));
  int32_t* order = static_cast<int32_t*>(at(layout.order));
  int32_t* scratch = static_cast<int32_t*>(at(layout.scratch));
  int64_t* sort_offsets = static_cast<int64_t*>(at(layout.offsets));

  // 1. Keys, and the largest routed key / largest id above the range (per block, then reduced).
  const int64_t blocks = layout.blocks;
  int64_t* block_max_key = static_cast<int64_t*>(at(layout.block_max));
  int64_t* block_max_high = block_max_key + blocks;
  for_blocks(P, blocks, num_threads, [&](int64_t b, int64_t begin, int64_t stop) {
    int64_t max_key = -1, max_high = -1;
    for (int64_t p = begin; p < stop; ++p) {
      const int64_t id = pr.expert_idx[p];
      if (id >= start && id < end) {
        keys[p] = uint32_t(id - start);
        max_key = std::max(max_key, id - start);
      } else {
        keys[p] = kNotRouted;
        if (id >= end) max_high = std::max(max_high, id);
      }
    }
    block_max_key[b] = max_key;
    block_max_high[b] = max_high;
  });
  const int64_t max_key = *std::max_element(block_max_key, block_max_key + blocks);
  const int64_t max_high = *std::max_element(block_max_high, block_max_high + blocks);

  // 2. The routed pairs, sorted stably by expert id: every routed key is <= max_key.
  const uint64_t range = uint64_t(max_key + 1);
  // row_idx_type 1: the pairs not routed follow in the CANN golden's order, ids >= end by (id, p),
  // then ids < start by p. The golden gives ids < start the key INT32_MAX, which ties them with an
  // id of INT32_MAX itself; the compressed key low_id - end keeps exactly that order.
  const bool scatter_tail = !pr.drop_pad && pr.row_idx_type == 1;
  const int64_t low_id = max_high == kInt32Max ? kInt32Max : std::max(max_high + 1, end);
  const uint64_t tail_range = uint64_t(low_id - end + 1);
  quantize::StaticParams static_params;
  if (pr.quant_mode == 0) static_params = quantize::static_params(pr.numerics, pr.scale, pr.offset);

  // In the dropless gather layout the sort writes expanded_row_idx itself (the rank of each
  // position).
  const bool gather = !pr.drop_pad && pr.row_idx_type == 0;
  const int64_t routed = stable_counting_sort(keys, P, range, num_threads, order, scratch, nullptr,
                                              gather ? pr.expanded_row_idx : nullptr, sort_offsets);

  // 3. The row_idx_type 1 tail.
  if (scatter_tail && routed < P) {
    parallel_range(P, num_threads, [&](int64_t begin, int64_t stop) {
      for (int64_t p = begin; p < stop; ++p) {
        const int64_t id = pr.expert_idx[p];
        if (id >= start && id < end)
          keys[p] = kNotRouted;
        else
          keys[p] = uint32_t((id >= end ? id : low_id) - end);
      }
    });
    stable_counting_sort(keys, P, tail_range, num_threads, order + routed, scratch, nullptr,
                         nullptr, sort_offsets);
  }

  // The remaining outputs.
  int32_t* row_idx = pr.expanded_row_idx;
  const int32_t* sorted = order;
  const int64_t rows_with_data = pr.drop_pad ? 0 : std::min(pr.row_limit, routed);
  if (pr.drop_pad) {
    const int64_t C = pr.expert_capacity;
    parallel_range(P, num_threads, [&](int64_t begin, int64_t stop) {
      std::fill(row_idx + begin, row_idx + stop, -1);
    });
    // Slot e*C + c holds the c-th pair of expert e (c < C); later pairs keep -1. c is the
    // distance from the start of the pair's run in the sorted order (a piece finds the run it
    // starts in by a search), so nothing is kept per expert.
    parallel_range(routed, num_threads, [&](int64_t begin, int64_t stop) {
      int64_t run = first_at_least(pr, sorted, 0, begin, sorted_key(pr, sorted, begin));
      for (int64_t d = begin; d < stop; ++d) {
        const int64_t e = sorted_key(pr, sorted, d);
        if (d > begin && e != sorted_key(pr, sorted, d - 1)) run = d;
        if (d - run < C) row_idx[sorted[d]] = int32_t(e * C + (d - run));
      }
    });
  } else if (!gather) {  // row_idx_type 1: the sorted positions, then the tail
    parallel_range(P, num_threads, [&](int64_t begin, int64_t stop) {
      std::copy(sorted + begin, sorted + stop, row_idx + begin);
    });
  }

  const bool avx2 = runs_avx2_code(isa);
  if (pr.quant_mode == -1 && scatters_rows(pr)) {
    // Plain routing copies each token's row to its (up to K) destinations: x is read once, in
    // order, and every destination row is written whole. dest[p] is pair p's row or -1.
    const int32_t* dest = row_idx;  // gather layout and drop-pad: expanded_row_idx itself
    if (!pr.drop_pad && !gather) {  // row_idx_type 1: invert the sorted order into `keys`
      int32_t* inverse = reinterpret_cast<int32_t*>(keys);
      parallel_range(P, num_threads, [&](int64_t begin, int64_t stop) {
        std::fill(inverse + begin, inverse + stop, -1);
      });
      parallel_range(routed, num_threads, [&](int64_t begin, int64_t stop) {
        for (int64_t d = begin; d < stop; ++d) inverse[sorted[d]] = int32_t(d);
      });
      dest = inverse;
    }
    scatter_rows(pr, dest, rows_with_data, num_threads, avx2);
    // Rows without a pair are zero: the tail of a dropless layout, empty drop-pad slots.
    if (pr.drop_pad) {
      write_rows(pr, static_params, 0, pr.expanded_rows, num_threads, avx2, [&](int64_t) {
        return [pairs = SlotPairs(pr, sorted, routed)](int64_t slot) mutable -> int64_t {
          return pairs(slot) >= 0 ? -2 : -1;  // -2: written by the scatter
        };
      });
    } else {  // only the tail past the routed rows (often empty: no second parallel pass)
      const auto zero = [](int64_t) -> int64_t { return -1; };
      write_rows(pr, static_params, rows_with_data, pr.expanded_rows, num_threads, avx2,
                 same_source(zero));
    }
  } else if (pr.drop_pad) {
    write_rows(pr, static_params, 0, pr.expanded_rows, num_threads, avx2,
               [&](int64_t) { return SlotPairs(pr, sorted, routed); });
  } else {
    const auto pair = [&](int64_t d) -> int64_t { return d < rows_with_data ? sorted[d] : -1; };
    write_rows(pr, static_params, 0, pr.expanded_rows, num_threads, avx2, same_source(pair));
  }
  write_counts(pr, sorted, routed);
}

}  // namespace moe_routing::cpu
