"""Fake (meta) functions: output shapes from input shapes and attributes, without reading data.

They mirror the C++ core's shape inference (src/ops/*/meta.cpp) with symbolic sizes so that
torch.compile and dynamic shapes work; tests/python/test_fake.py checks them against the real
kernels' outputs on every scenario.
"""
from __future__ import annotations

import torch


@torch.library.register_fake("moe_routing::moe_init_routing_grad")
def _moe_init_routing_grad_fake(grad_expanded_x, expanded_row_idx, top_k, drop_pad_mode=0,
                                active_num=0, order="tree"):
    op = "moe_init_routing_grad"
    if top_k <= 0:
        raise ValueError(f"{op}: top_k must be > 0, got {top_k}")
    if drop_pad_mode not in (0, 1):
        raise ValueError(f"{op}: drop_pad_mode must be 0 (dropless/active) or 1 (drop-pad), got {drop_pad_mode}")
    expected_dim = 3 if drop_pad_mode == 1 else 2
    if grad_expanded_x.dim() != expected_dim:
        raise ValueError(f"{op}: grad_expanded_x must be {expected_dim}-D when drop_pad_mode={drop_pad_mode}, "
                         f"got {grad_expanded_x.dim()}-D")
    if expanded_row_idx.dim() != 1 or expanded_row_idx.dtype != torch.int32:
        raise ValueError(f"{op}: expanded_row_idx must be 1-D int32, got {expanded_row_idx.dim()}-D "
                         f"{expanded_row_idx.dtype}")
    hidden = grad_expanded_x.shape[-1]
    num_rows = expanded_row_idx.shape[0] // top_k
    return grad_expanded_x.new_empty((num_rows, hidden))


def _check_routing_inputs(op, x, expert_idx):
    if x.dim() != 2:
        raise ValueError(f"{op}: x must be 2-D [N, H], got {x.dim()}-D")
    if expert_idx.dim() != 2:
        raise ValueError(f"{op}: expert_idx must be 2-D [N, K], got {expert_idx.dim()}-D")
    if expert_idx.dtype != torch.int32:
        raise ValueError(f"{op}: expert_idx must be int32, got {expert_idx.dtype}")


@torch.library.register_fake("moe_routing::moe_init_routing_v2")
def _moe_init_routing_v2_fake(x, expert_idx, active_num=0, expert_capacity=0, expert_num=0,
                              drop_pad_mode=0, expert_tokens_count_or_cumsum_flag=0,
                              expert_tokens_before_capacity_flag=False):
    op = "moe_init_routing_v2"
    _check_routing_inputs(op, x, expert_idx)
    if drop_pad_mode not in (0, 1):
        raise ValueError(f"{op}: drop_pad_mode must be 0 (dropless) or 1 (drop-pad), got {drop_pad_mode}")
    if active_num < 0:
        raise ValueError(f"{op}: active_num must be >= 0, got {active_num}")
    n, hidden = x.shape
    pairs = n * expert_idx.shape[1]
    if drop_pad_mode == 1:
        expanded_x = x.new_empty((expert_num, expert_capacity, hidden))
    else:
        rows = pairs if active_num == 0 else torch.sym_min(active_num, pairs)
        expanded_x = x.new_empty((rows, hidden))
    expanded_row_idx = x.new_empty((pairs,), dtype=torch.int32)
    counts = x.new_empty((max(expert_num, 0),), dtype=torch.int32)
    before_capacity = x.new_empty((max(expert_num, 0),), dtype=torch.int32)
    return expanded_x, expanded_row_idx, counts, before_capacity


@torch.library.register_fake("moe_routing::moe_init_routing")
def _moe_init_routing_fake(x, expert_idx, scale=None, offset=None, topk_weight=None, active_num=-1,
                           expert_capacity=-1, expert_num=-1, drop_pad_mode=0, expert_tokens_num_type=0,
                           expert_tokens_num_flag=False, quant_mode=-1, active_expert_range=None,
                           row_idx_type=0, numerics="atlas_a2"):
    op = "moe_init_routing"
    _check_routing_inputs(op, x, expert_idx)
    if quant_mode > 1:
        raise NotImplementedError(f"{op}: quant_mode must be one of the supported modes -1, 0 or 1, got {quant_mode}")
    if expert_num < 1:
        raise ValueError(f"{op}: expert_num must be >= 1, got {expert_num}")
    if drop_pad_mode not in (0, 1):
        raise ValueError(f"{op}: drop_pad_mode must be 0 (dropless) or 1 (drop-pad), got {drop_pad_mode}")
    start, end = (0, expert_num) if active_expert_range is None else tuple(active_expert_range)
    n, hidden = x.shape
    pairs = n * expert_idx.shape[1]
    out_dtype = torch.int8 if quant_mode in (0, 1) else x.dtype
    if drop_pad_mode == 1:
        rows = expert_num * expert_capacity
        expanded_x = x.new_empty((expert_num, expert_capacity, hidden), dtype=out_dtype)
    else:
        rows = pairs
        expanded_x = x.new_empty((pairs, hidden), dtype=out_dtype)
    expanded_row_idx = x.new_empty((pairs,), dtype=torch.int32)
    if expert_tokens_num_flag and expert_tokens_num_type == 2:
        counts = x.new_empty((expert_num, 2), dtype=torch.int64)
    else:
        counts = x.new_empty((end - start,), dtype=torch.int64)
    expanded_scale = x.new_empty((rows,), dtype=torch.float32)
    if topk_weight is not None:
        expanded_topk_weight = x.new_empty((rows, 1), dtype=torch.float32)
    else:
        expanded_topk_weight = x.new_empty((0,), dtype=torch.float32)
    return expanded_x, expanded_row_idx, counts, expanded_scale, expanded_topk_weight


@torch.library.register_fake("moe_routing::moe_init_routing_grad.out")
def _moe_init_routing_grad_out_fake(grad_expanded_x, expanded_row_idx, top_k, drop_pad_mode=0,
                                    active_num=0, order="tree", *, out):
    return None


@torch.library.register_fake("moe_routing::moe_init_routing.out")
def _moe_init_routing_out_fake(x, expert_idx, scale=None, offset=None, topk_weight=None, active_num=-1,
                               expert_capacity=-1, expert_num=-1, drop_pad_mode=0, expert_tokens_num_type=0,
                               expert_tokens_num_flag=False, quant_mode=-1, active_expert_range=None,
                               row_idx_type=0, numerics="atlas_a2", *, expanded_x, expanded_row_idx,
                               expert_tokens_count_or_cumsum, expanded_scale, expanded_topk_weight):
    return None
