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
