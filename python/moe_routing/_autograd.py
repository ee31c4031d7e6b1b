"""Autograd for the forward operators: the backward of x runs our moe_init_routing_grad operator.

Beyond CANN (docs/decisions.md §13) every non-quantised forward is differentiable: dropless,
active_num truncation, drop-pad, partial active_expert_range, row_idx_type 0 and 1; topk_weight
and the quant_mode -1 scale get gradients through expanded_topk_weight / expanded_scale (the same
operator with top_k 1 and K respectively). The index conversions below are a few integer tensor
ops (no host synchronisation), so the backward traces under torch.compile.
"""
from __future__ import annotations

import torch

_grad = torch.ops.moe_routing.moe_init_routing_grad


# The backward runs in the numerics of its forward (the keyword-only `numerics`): Atlas A2/A3's
# tree order for "atlas_a2", Ascend 950's sequential order for "ascend_950".

# ---- moe_init_routing_v2 -------------------------------------------------------------------

def _v2_setup_context(ctx, inputs, keyword_only_inputs, output):
    x, expert_idx, active_num, expert_capacity, expert_num, drop_pad_mode = inputs[:6]
    ctx.top_k = expert_idx.shape[1]
    ctx.drop_pad_mode = drop_pad_mode
    ctx.active_num = active_num
    ctx.numerics = keyword_only_inputs["numerics"]
    ctx.save_for_backward(output[1])


def _v2_backward(ctx, grad_expanded_x, *_unused):
    (expanded_row_idx,) = ctx.saved_tensors
    grad_x = None
    if ctx.needs_input_grad[0] and grad_expanded_x is not None:
        active_num = 0 if ctx.drop_pad_mode == 1 else ctx.active_num
        grad_x = _grad(grad_expanded_x.contiguous(), expanded_row_idx, ctx.top_k, ctx.drop_pad_mode,
                       active_num, numerics=ctx.numerics)
    return (grad_x,) + (None,) * 7


torch.library.register_autograd("moe_routing::moe_init_routing_v2", _v2_backward,
                                setup_context=_v2_setup_context)


# ---- moe_init_routing (torch API / V4) -----------------------------------------------------

def _v4_setup_context(ctx, inputs, keyword_only_inputs, output):
    (x, expert_idx, scale, offset, topk_weight, active_num, expert_capacity, expert_num, drop_pad_mode,
     expert_tokens_num_type, expert_tokens_num_flag, quant_mode, active_expert_range, row_idx_type,
     x_dtype) = inputs
    ctx.top_k = expert_idx.shape[1]
    ctx.quant_mode = quant_mode
    ctx.drop_pad_mode = drop_pad_mode
    ctx.active_num = active_num
    ctx.row_idx_type = row_idx_type
    ctx.expert_range = (0, expert_num) if active_expert_range is None else tuple(active_expert_range)
    ctx.expert_capacity = expert_capacity
    ctx.expert_num = expert_num
    ctx.numerics = keyword_only_inputs["numerics"]
    ctx.save_for_backward(expert_idx, output[1])


def _gather_index(ctx, expert_idx, expanded_row_idx):
    """For dropless routing: pair p -> the expanded row holding it, or -1 if no row does."""
    limit = ctx.active_num if ctx.active_num > 0 else None
    if ctx.row_idx_type == 0:
        # Gather convention already; rows >= active_num were cut (dropped) by truncation.
        if limit is None:
            return expanded_row_idx
        return torch.where(expanded_row_idx < limit, expanded_row_idx, -1).to(torch.int32)
    # Scatter convention: entry d holds the flat position of expanded row d. Rows >= R hold no
    # pair, where R = min(active_num, routed pairs) and routed pairs = ids inside the range.
    start, end = ctx.expert_range
    routed = ((expert_idx >= start) & (expert_idx < end)).sum()
    rows_written = routed if limit is None else torch.clamp(routed, max=limit)
    pairs = expanded_row_idx.numel()
    d = torch.arange(pairs, device=expanded_row_idx.device, dtype=torch.int64)
    value = torch.where(d < rows_written, d, -1).to(torch.int32)
    out = torch.empty(pairs, device=expanded_row_idx.device, dtype=torch.int32)
    return out.scatter(0, expanded_row_idx.long(), value)


def _v4_backward(ctx, grad_expanded_x, _g_row_idx, _g_counts, grad_expanded_scale, grad_expanded_topk_weight):
    expert_idx, expanded_row_idx = ctx.saved_tensors
    needs_x, needs_scale, needs_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[2], ctx.needs_input_grad[4]
    if ctx.quant_mode != -1 and (needs_x or needs_scale):
        raise NotImplementedError(
            f"moe_init_routing: backward is not implemented for quant_mode={ctx.quant_mode} "
            "(a quantised expanded_x has no gradient); call the forward with quant_mode=-1 to differentiate")
    k = ctx.top_k
    drop_pad = ctx.drop_pad_mode == 1
    index = expanded_row_idx if drop_pad else _gather_index(ctx, expert_idx, expanded_row_idx)
    mode = 1 if drop_pad else 0

    def rows_view(g):  # a per-row quantity [rows] / [rows, 1] as the grad operator's input
        g = g.contiguous().view(-1, 1)
        return g.view(ctx.expert_num, ctx.expert_capacity, 1) if drop_pad else g

    numerics = ctx.numerics
    grad_x = grad_scale = grad_weight = None
    if needs_x and grad_expanded_x is not None:
        grad_x = _grad(grad_expanded_x.contiguous(), index, k, mode, 0, numerics=numerics)
    if needs_scale and grad_expanded_scale is not None:
        grad_scale = _grad(rows_view(grad_expanded_scale), index, k, mode, 0, numerics=numerics).view(-1)
    if needs_weight and grad_expanded_topk_weight is not None:
        grad_weight = _grad(rows_view(grad_expanded_topk_weight), index, 1, mode, 0,
                            numerics=numerics).view(expert_idx.shape)
    return (grad_x, None, grad_scale, None, grad_weight) + (None,) * 10


torch.library.register_autograd("moe_routing::moe_init_routing", _v4_backward,
                                setup_context=_v4_setup_context)


# ---- moe_init_routing_grad used as a combine (unpermute) -------------------------------------

def _grad_setup_context(ctx, inputs, keyword_only_inputs, output):
    grad_expanded_x, expanded_row_idx, top_k, drop_pad_mode, active_num = inputs
    ctx.top_k = top_k
    ctx.source_shape = grad_expanded_x.shape
    ctx.skip_from = active_num if (drop_pad_mode == 0 and active_num > 0) else None
    ctx.save_for_backward(expanded_row_idx)


def _grad_backward(ctx, grad_output):
    """Adjoint of the sum: row r of the input receives grad_output[p // K] for every pair p that
    reads it. Skipped pairs are sent to a scratch row that is dropped. index_add_ on the CPU adds
    in index order, so the result is deterministic."""
    (expanded_row_idx,) = ctx.saved_tensors
    if grad_output is None or not ctx.needs_input_grad[0]:
        return (None,) * 5
    hidden = ctx.source_shape[-1]
    rows = 1
    for extent in ctx.source_shape[:-1]:
        rows *= extent
    idx = expanded_row_idx.long()
    present = idx != -1
    if ctx.skip_from is not None:
        present &= idx < ctx.skip_from
    target = torch.where(present, idx, rows)
    per_pair = grad_output.repeat_interleave(ctx.top_k, dim=0)
    buffer = grad_output.new_zeros((rows + 1, hidden))
    buffer.index_add_(0, target, per_pair)
    return (buffer[:rows].view(ctx.source_shape),) + (None,) * 4


torch.library.register_autograd("moe_routing::moe_init_routing_grad", _grad_backward,
                                setup_context=_grad_setup_context)
