"""Autograd for the operators: the dispatch's backward runs our moe_init_routing_grad operator, the
combine's (moe_finalize_routing, at the end) our moe_finalize_routing_grad.

Beyond CANN (docs/decisions.md §13) every non-quantised forward is differentiable: dropless,
active_num truncation, drop-pad, partial active_expert_range, row_idx_type 0 and 1; topk_weight
and the quant_mode -1 scale get gradients through expanded_topk_weight / expanded_scale (the same
operator with top_k 1 and K respectively). The index conversions below are a few integer tensor
ops (no host synchronisation), so the backward traces under torch.compile.
"""
from __future__ import annotations

import functools
from typing import Iterable, Tuple

import torch
from torch._subclasses.fake_tensor import is_fake as _is_fake
from torch.autograd import forward_ad as _forward_ad

_grad = torch.ops.moe_routing.moe_init_routing_grad


# ---- forward-mode AD ---------------------------------------------------------------------------
#
# The operators have no forward derivative: PyTorch's autograd kernel of custom operators ran them
# on the primal alone, so a tangent was silently dropped (jvp returned zeros, a dual output had
# none). The operators' ADInplaceOrView kernel (csrc/torch_ops.cpp, functional_refuse_forward_ad)
# refuses an input with a tangent on every path but one: when autograd records the call (grad
# mode on, an input requiring grad), register_autograd's autograd.Function runs the operator with
# forward grad mode off, which hides the tangents from that kernel, and PyTorch then raised its
# own "You must implement the jvp function for custom autograd.Function". That path alone is
# refused here, in setup_context, with the kernel's message.

def refuse_forward_ad(function: str, tensors: Iterable[Tuple[str, object]]) -> None:
    """A NotImplementedError naming `function` and the first of `tensors` ((name, value) pairs;
    non-tensors are passed over) that carries a forward-mode tangent, also where forward grad mode
    is off (in an autograd.Function's forward or setup_context). Inference mode is passed over, as the
    operators' C++ check and PyTorch's forward AD for its own operators pass over it, and so are fake tensors
    (torch.compile's tracing, FakeTensorMode): unpack_dual of one failed an internal assert inside a dual level,
    with no tangent anywhere."""
    if _forward_ad._current_level < 0 or torch.is_inference_mode_enabled():  # nothing to check
        return
    with _forward_ad._set_fwd_grad_enabled(True):
        for name, value in tensors:
            if isinstance(value, torch.Tensor) and _is_fake(value):
                continue
            # Under torch.func.vmap the tensor is a batched wrapper, whose unpack_dual has no batching rule
            # (jvp of vmap raised "Batching rule not implemented for aten::_unpack_dual"): the tangent is on the
            # tensor it wraps.
            while isinstance(value, torch.Tensor) and torch._C._functorch.is_batchedtensor(value):
                value = torch._C._functorch.get_unwrapped(value)
            if isinstance(value, torch.Tensor) and _forward_ad.unpack_dual(value).tangent is not None:
                raise NotImplementedError(
                    f"{function}: forward-mode AD (torch.func.jvp, jacfwd, torch.autograd.forward_ad) is not "
                    f"supported, got {name} with a tangent; differentiate in reverse mode with torch.autograd "
                    "(backward, torch.autograd.grad)")


def _refusing_forward_ad(op_name: str, setup_context):
    """setup_context of torch.ops.moe_routing.<op_name>, refusing an input with a tangent first."""
    names = [a.name for a in getattr(torch.ops.moe_routing, op_name).default._schema.arguments]

    @functools.wraps(setup_context)
    def wrapped(ctx, inputs, keyword_only_inputs, output):
        refuse_forward_ad(op_name, zip(names, inputs))
        setup_context(ctx, inputs, keyword_only_inputs, output)

    return wrapped


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
                                setup_context=_refusing_forward_ad("moe_init_routing_v2", _v2_setup_context))


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
    ctx.pairs_shape = expert_idx.shape
    # expert_idx is read only by the scatter convention's dropless index (_gather_index): saved only
    # there, as PyTorch's operators save an input only where a gradient reads it (a tensor saved and
    # never read made the backward refuse it changed in place, or made under inference mode).
    reads_expert_idx = drop_pad_mode != 1 and row_idx_type == 1
    ctx.save_for_backward(expert_idx if reads_expert_idx else None, output[1])


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
                            numerics=numerics).view(ctx.pairs_shape)
    return (grad_x, None, grad_scale, None, grad_weight) + (None,) * 10


torch.library.register_autograd("moe_routing::moe_init_routing", _v4_backward,
                                setup_context=_refusing_forward_ad("moe_init_routing", _v4_setup_context))


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
                                setup_context=_refusing_forward_ad("moe_init_routing_grad", _grad_setup_context))


# ---- moe_finalize_routing (the combine) -------------------------------------------------------
#
# Every drop_pad_mode is differentiable (CANN's autograd: modes 0/1, expanded_x and scales only).
# The backward is one moe_finalize_routing_grad call in the forward's numerics: the index goes to
# its row layout (modes 0/1 transpose [K, N] -> [N, K]), pairs of the V3/V4 special experts read
# no expanded_x row and are marked dropped (-1), and the core computes grad_expanded_x,
# grad_scales and grad_bias (docs/moe_finalize_routing.md gives their formulas and orders); x1 and
# x2 get grad_y itself.

_finalize_grad = torch.ops.moe_routing.moe_finalize_routing_grad
_FINALIZE_INPUTS = 16  # the forward's positional inputs
# Inputs whose gradient needs a special expert's term (its x row or constant), which no operator
# computes: with a copy or constant expert range their backward is not implemented.
_SPECIAL_TERM_INPUTS = {4: "bias", 5: "scales", 7: "x", 8: "alpha1", 9: "alpha2", 10: "v"}


def _range_enabled(expert_range):
    return expert_range is not None and tuple(expert_range) != (-1, -1)


def _finalize_setup_context(ctx, inputs, keyword_only_inputs, output):
    (expanded_x, expanded_row_idx, x1, x2, bias, scales, expert_idx, x, alpha1, alpha2, v, drop_pad_mode,
     zero_expert_range, copy_expert_range, constant_expert_range, k) = inputs
    ctx.drop_pad_mode = 0 if drop_pad_mode is None else drop_pad_mode
    ctx.top_k = scales.shape[1] if scales is not None else (1 if k is None else k)
    ranges = (zero_expert_range, copy_expert_range, constant_expert_range)
    ctx.special_ranges = [tuple(r) for r in ranges if _range_enabled(r)]
    ctx.has_term_experts = _range_enabled(copy_expert_range) or _range_enabled(constant_expert_range)
    ctx.numerics = keyword_only_inputs["numerics"]
    ctx.expanded_x_shape = expanded_x.shape
    # Saved is what the gradients wanted read, as PyTorch's operators save an input only where a
    # gradient reads it: a tensor saved and never read made the backward refuse it changed in place
    # (or made under inference mode), and kept it alive until then - expanded_x, the largest
    # activation, is read only by grad_scales. x1 and x2 get grad_y itself and read nothing.
    needs = _finalize_needs(ctx)
    want_x, want_bias, want_scales = needs[0], needs[4] and bias is not None, needs[5] and scales is not None
    combine_grad = want_x or want_bias or want_scales  # the backward runs moe_finalize_routing_grad
    # bias enters grad_scales (scale * (row + bias) . grad_y) and gives grad_bias its experts; expert_idx
    # names each pair's bias row and the special experts' pairs.
    keep_bias = want_bias or want_scales
    keep_expert_idx = combine_grad and (keep_bias and bias is not None or bool(ctx.special_ranges))
    ctx.save_for_backward(expanded_x if want_scales else None, expanded_row_idx if combine_grad else None,
                          scales if combine_grad else None, expert_idx if keep_expert_idx else None,
                          bias if keep_bias else None)


def _finalize_needs(ctx):
    """needs_input_grad of all the forward's inputs: it covers the arguments of the call up to its
    last non-default one."""
    return tuple(ctx.needs_input_grad) + (False,) * (_FINALIZE_INPUTS - len(ctx.needs_input_grad))


def _finalize_backward(ctx, grad_y):
    expanded_x, expanded_row_idx, scales, expert_idx, bias = ctx.saved_tensors
    needs = _finalize_needs(ctx)
    grads = [None] * _FINALIZE_INPUTS
    if grad_y is None:
        return tuple(grads)
    if ctx.has_term_experts:
        refused = [name for i, name in _SPECIAL_TERM_INPUTS.items() if needs[i]]
        if refused:
            raise NotImplementedError(
                f"moe_finalize_routing: backward is not implemented for {', '.join(refused)} with a copy or "
                "constant expert range (their gradients need the special experts' terms); expanded_x, x1 and "
                "x2 get gradients")
    grad_y = grad_y.contiguous()
    if needs[2]:
        grads[2] = grad_y
    if needs[3]:
        grads[3] = grad_y
    want_x, want_bias, want_scales = needs[0], needs[4], needs[5] and scales is not None
    if not (want_x or want_bias or want_scales):
        return tuple(grads)
    k = ctx.top_k
    n = grad_y.shape[0]
    index = expanded_row_idx if ctx.drop_pad_mode >= 2 else expanded_row_idx.view(k, n).t().reshape(-1)
    if ctx.special_ranges:
        special = torch.zeros_like(expert_idx, dtype=torch.bool)
        for start, end in ctx.special_ranges:
            special |= (expert_idx >= start) & (expert_idx < end)
        # reshape, not view: special has expert_idx's strides, which need not be row-major (a
        # transposed expert_idx is a valid input); the pairs are its elements in logical order.
        index = torch.where(special.reshape(-1), -1, index).to(torch.int32)
    shape = ctx.expanded_x_shape
    if ctx.drop_pad_mode in (1, 3):
        mode, active_num, experts, capacity = 1, 0, shape[0], shape[1]
    else:
        mode, active_num, experts, capacity = 0, shape[0], 0, 0
        if active_num == 0:
            # No rows (every pair dropped or cut; the grad's active_num 0 would mean "all N*K
            # rows"): nothing was read, so the gradients are an empty one and zeros (grad_y has
            # expanded_x's dtype and device).
            grads[0] = grad_y.new_zeros(shape) if want_x else None
            grads[4] = bias.new_zeros(bias.shape) if want_bias else None
            grads[5] = scales.new_zeros(scales.shape) if want_scales else None
            return tuple(grads)
    grad_expanded_x, grad_scales, grad_bias = _finalize_grad(
        grad_y, index, expanded_x if want_scales else None, scales, expert_idx if bias is not None else None, bias,
        mode, active_num, experts, capacity, numerics=ctx.numerics, compute_grad_scales=want_scales,
        compute_grad_bias=want_bias)
    if want_x:
        grads[0] = grad_expanded_x
    if want_bias:
        grads[4] = grad_bias
    if want_scales:
        grads[5] = grad_scales
    return tuple(grads)


torch.library.register_autograd("moe_routing::moe_finalize_routing", _finalize_backward,
                                setup_context=_refusing_forward_ad("moe_finalize_routing", _finalize_setup_context))


def _finalize_grad_setup_context(ctx, inputs, keyword_only_inputs, output):
    pass


def _finalize_grad_backward(ctx, *grads):
    raise NotImplementedError(
        "moe_finalize_routing_grad: backward is not implemented (a second derivative of "
        "moe_finalize_routing); differentiate the forward once, or detach its gradients")


# Registered so that a double backward through the combine fails clearly instead of PyTorch's
# fallback, which only warns and leaves the gradient out.
torch.library.register_autograd(
    "moe_routing::moe_finalize_routing_grad", _finalize_grad_backward,
    setup_context=_refusing_forward_ad("moe_finalize_routing_grad", _finalize_grad_setup_context))
