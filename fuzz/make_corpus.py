#!/usr/bin/env python3
"""Writes the seed inputs of fuzz/corpus/ for fuzz_c_api.

fuzz_c_api reads its input as a stream of decisions (see fuzz/fuzz_c_api.cpp); a 0 past the end,
or a byte in the "natural" range, picks the valid choice. Each seed below therefore lists only
the leading decisions: the operator, the thread count, 8 bytes of seed for the bulk data, the
sizes and the scenario. Every seed reaches a successful phase two; check with
    FUZZ_C_API_TRACE=1 build-fuzz/fuzz_c_api fuzz/corpus/*.bin
Run from the repository root: python3 fuzz/make_corpus.py
"""
import pathlib

SEED = [0x5E, 0xED, 0x01, 0x23, 0x45, 0x67, 0x89, 0xAB]  # bulk data generator seed


def head(op, threads=1):
    """Operator (0 grad, 1 v2, 2 routing; 128 finalize V1, 129 V2, 130 V2Grad), thread count - 1,
    generator seed."""
    return [op, threads] + SEED


ATTRS = [0, 0, 0, 0, 0]  # five attributes left at their natural values

SEEDS = {
    # moe_init_routing_grad: N, K rare?, K-1, H, scenario (0 dropless, 1 active, 2 drop-pad), E-1, C-1, A-1
    "grad_dropless": head(0) + [7, 0, 2, 5, 0, 0, 0, 0],
    "grad_active": head(0, 2) + [9, 0, 1, 3, 1, 0, 0, 11],
    "grad_drop_pad": head(0) + [6, 0, 1, 4, 2, 2, 1, 0],
    "grad_top_k_128": head(0) + [3, 255, 127, 4, 0, 0, 0, 0],
    # moe_init_routing_v2: N, K-1, H, E-1, drop-pad? (0 = yes), C-1, active? (0 = yes),
    # then attributes (0 = natural), the count flag, the before-capacity flag
    "v2_dropless_cumsum": head(1) + [9, 1, 6, 3, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0],
    "v2_active_count": head(1, 2) + [5, 2, 3, 2, 1, 0, 0, 7, 0, 0, 0, 0, 2, 0, 0],
    "v2_drop_pad": head(1) + [8, 1, 4, 2, 0, 2, 1, 0, 0, 0, 0, 0, 0, 1],
    # moe_init_routing: N, K-1, H, E-1, quant (0: -1, 1: static, 2: dynamic), [drop-pad? if quant
    # -1], C-1, [range start, range end - start - 1 unless drop-pad], with range?, count type,
    # active? (1 = no), five natural attributes, the count flag (0 = off), the quant mode attribute,
    # [row_idx_type unless drop-pad]
    "routing_no_quant_range": head(2) + [8, 1, 5, 4, 0, 1, 0, 1, 2, 1, 1, 1] + ATTRS + [1, 0, 1],
    "routing_static_quant": head(2) + [6, 1, 7, 3, 1, 0, 0, 3, 0, 0, 1] + ATTRS + [1, 0, 0],
    "routing_dynamic_quant": head(2, 2) + [7, 2, 9, 2, 2, 0, 0, 2, 1, 2, 1] + ATTRS + [1, 0, 0],
    "routing_drop_pad": head(2) + [9, 1, 3, 2, 0, 0, 2, 0, 1, 1] + ATTRS + [3, 0],
    # The combine (operators from 128 on). moe_finalize_routing V1 (128): N, K-1, H, E-1, C, rows
    # (3: cut, then the count), x2? (bit 1), float32 scales?, numerics (2 bytes: value, 0 =
    # natural), dtype (0 fp32, 1 fp16, 2 bf16)
    "finalize_v1_bf16": head(128) + [5, 1, 7, 3, 0, 0, 2, 1, 0, 0, 2],
    "finalize_v1_fp16_ascend_950": head(128, 2) + [4, 2, 9, 2, 0, 0, 0, 0, 1, 0, 1],
    # V2 (129): N, K-1, H, E-1, mode, C, [rows unless drop-pad], inputs (bits: x1 x2 bias scales
    # expert_idx), float32 scales?, drop_pad_mode attribute, numerics (2 bytes), dtype
    "finalize_v2_row_every_input": head(129) + [6, 1, 5, 2, 2, 0, 0, 31, 0, 0, 0, 0, 0],
    "finalize_v2_drop_pad_row_bf16": head(129) + [7, 2, 9, 3, 3, 3, 29, 1, 0, 1, 0, 2],
    "finalize_v2_column_cut_rows": head(129, 2) + [5, 3, 6, 1, 0, 0, 3, 13, 9, 0, 0, 0, 0, 1],
    "finalize_v2_drop_pad_column": head(129) + [8, 1, 4, 2, 1, 2, 9, 0, 0, 0, 0, 0],
    # V2Grad (130): N, K-1, H, E-1, mode, C, [active? (2 = yes), A-1 when mode 0], inputs xor 3
    # (bits: expanded_x scales expert_idx bias), float32 scales?, four attributes (0 = natural),
    # numerics (2 bytes), dtype
    "finalize_grad_bias": head(130) + [6, 1, 5, 2, 0, 0, 0, 12],
    "finalize_grad_active_bf16": head(130, 2) + [7, 2, 6, 3, 0, 0, 2, 9, 12, 1, 0, 0, 0, 0, 1, 0, 2],
    "finalize_grad_drop_pad": head(130) + [5, 1, 8, 3, 1, 3, 12, 0, 0, 0, 0, 0, 0, 0, 1],
    "finalize_grad_no_scales": head(130) + [5, 1, 7, 2, 0, 0, 0, 2],
}


def main():
    corpus = pathlib.Path(__file__).resolve().parent / "corpus"
    corpus.mkdir(exist_ok=True)
    for name, decisions in SEEDS.items():
        (corpus / f"{name}.bin").write_bytes(bytes(decisions))
    print(f"wrote {len(SEEDS)} seeds to {corpus}")


if __name__ == "__main__":
    main()
