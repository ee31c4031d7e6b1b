// The reference of moe_finalize_routing, kept plain on purpose (finalize_routing_spec §3).
#include "reference/moe_finalize_routing.h"

namespace moe_routing::reference {
namespace {

/// v rounded to float16 and widened back. An fp16 addition or multiplication done in float32 and
/// rounded once to fp16 is the correctly rounded fp16 operation: float32 has 24 bits >= 2*11 + 2,
/// so the double rounding is innocuous (and fp16 products and sums stay far inside float32's
/// normal range). This is how the atlas_a2 kernels' fp16 arithmetic is reproduced exactly.
float round_fp16(float v) { return fp16_to_float(float_to_fp16(v)); }

/// v rounded to `dtype` (round-to-nearest-even) and widened back (exact for bfloat16 too:
/// 24 >= 2*8 + 2).
float round_to(DType dtype, float v) {
  switch (dtype) {
    case DType::float16: return round_fp16(v);
    case DType::bfloat16: return bf16_to_float(float_to_bf16(v));
    default: return v;
  }
}

}  // namespace

void moe_finalize_routing(const detail::FinalizeRoutingProblem& p) {
  const int64_t N = p.num_rows, K = p.top_k, H = p.hidden;
  const DType dt = p.dtype;
  // One step of the accumulation type: float16 under atlas_a2 for float16, else float32.
  auto step = [&p](float v) { return p.fp16_accumulate ? round_fp16(v) : v; };
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = 0; j < H; ++j) {
      float acc = 0.0f;
      bool taken = false;  // whether acc holds a value the next term is added to
      if (p.x1 != nullptr) {
        const float a = load_as_float(p.x1, dt, i * H + j);
        if (p.x2 != nullptr)
          acc = step(a + load_as_float(p.x2, dt, i * H + j));
        else
          acc = p.x1_plus_zero ? step(a + 0.0f) : a;
        taken = true;
      } else if (!p.first_term_assigned) {
        taken = true;  // ascend_950: acc starts at +0 and every term is added
      }
      for (int64_t t = 0; t < K; ++t) {
        int64_t row = 0, expert = 0;
        const detail::FinalizeTerm kind = p.term(i, t, &row, &expert);
        if (kind == detail::FinalizeTerm::skip) continue;
        float e = 0.0f;
        if (kind == detail::FinalizeTerm::row) {
          e = load_as_float(p.expanded_x, dt, row * H + j);
        } else if (kind == detail::FinalizeTerm::copy) {
          e = load_as_float(p.x, dt, i * H + j);
        } else {  // constant expert: computed in the dtype, each operation rounded to it
          const int64_t c = (expert - p.constant_start) * H + j;
          const float xv = load_as_float(p.x, dt, i * H + j);
          const float a1 = round_to(dt, xv * load_as_float(p.alpha1, dt, c));
          const float a2 = round_to(dt, load_as_float(p.v, dt, c) * load_as_float(p.alpha2, dt, c));
          e = round_to(dt, a1 + a2);
        }
        if (p.bias != nullptr)
          e = step(e + load_as_float(p.bias, dt, expert * H + j));
        else if (p.zero_bias)
          e = step(e + 0.0f);
        if (p.scales != nullptr) e = step(e * load_as_float(p.scales, p.scales_dtype, i * K + t));
        acc = taken ? step(acc + e) : e;
        taken = true;
      }
      if (p.bf16_half_away)
        static_cast<uint16_t*>(p.out)[i * H + j] =
            detail::bf16_half_away_from_bits(float_bits(acc));
      else
        store_from_float(p.out, dt, i * H + j, acc);
    }
  }
}

}  // namespace moe_routing::reference
