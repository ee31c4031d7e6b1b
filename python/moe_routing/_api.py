"""The public functions, with CANN's (cann_ops_transformer) names, argument order and defaults."""
from __future__ import annotations

import operator
from typing import List, Optional, Union

import torch


def moe_init_routing_grad(grad_expanded_x: torch.Tensor, expanded_row_idx: torch.Tensor, top_k: int,
                          drop_pad_mode: int = 0, active_num: int = 0, *, numerics: str = "atlas_a2",
                          order: Optional[str] = None, out=None) -> torch.Tensor:
    """Backward of moe_init_routing: grad_x[i] = sum_t grad_expanded_x[expanded_row_idx[i*top_k + t]].

    Args:
        grad_expanded_x: gradient of expanded_x; float32/float16/bfloat16. [N*K, H] (dropless),
            [active_num, H] (active: drop_pad_mode=0, active_num>0) or [E, C, H] (drop_pad_mode=1).
        expanded_row_idx: int32 [N*K], the forward's output. -1 marks a dropped pair (skipped);
            in the active scenario values >= active_num are skipped too.
        top_k: K > 0.
        drop_pad_mode: 0 (dropless/active) or 1 (drop-pad).
        active_num: >= 0; with drop_pad_mode=0, > 0 selects the active scenario.
        numerics: "atlas_a2" (default; Atlas A2/A3: the tree float32 order) or "ascend_950"
            (Ascend 950: the sequential order).
        order: None (the order numerics implies), or "tree" / "sequential" to override it.
        out: optional contiguous tensor of exactly grad_x's shape and dtype, on the inputs' device,
            to write into (no allocation; not differentiable; must not overlap an input).

    Returns:
        grad_x [N, H], dtype of grad_expanded_x (``out`` when given).

    Raises:
        ValueError: invalid arguments; IndexError: an expanded_row_idx value out of range.
    """
    if out is not None:
        torch.ops.moe_routing.moe_init_routing_grad.out(
            grad_expanded_x, expanded_row_idx, top_k, drop_pad_mode, active_num, numerics=numerics,
            order=order, out=out)
        return out
    return torch.ops.moe_routing.moe_init_routing_grad(grad_expanded_x, expanded_row_idx, top_k, drop_pad_mode,
                                                       active_num, numerics=numerics, order=order)


def moe_init_routing_v2(x: torch.Tensor, expert_idx: torch.Tensor, active_num: int = 0,
                        expert_capacity: int = 0, expert_num: int = 0, drop_pad_mode: int = 0,
                        expert_tokens_count_or_cumsum_flag: int = 0,
                        expert_tokens_before_capacity_flag: bool = False, *, numerics: str = "atlas_a2"):
    """aclnnMoeInitRoutingV2 (torch_npu.npu_moe_init_routing_v2 semantics).

    Args:
        x: [N, H] float32/float16/bfloat16.
        expert_idx: [N, K] int32; ids >= 0 (and < expert_num when counts or drop-pad use it).
        active_num: 0 keeps all N*K sorted rows; A > 0 keeps the first min(A, N*K) (dropless).
        expert_capacity: C, slots per expert (drop_pad_mode=1; 1 <= C <= N).
        expert_num: E (drop_pad_mode=1, or when counts are requested).
        drop_pad_mode: 0 dropless, 1 drop-pad.
        expert_tokens_count_or_cumsum_flag: 0 none, 1 inclusive cumsum, 2 count (dropless only).
        expert_tokens_before_capacity_flag: per-expert counts before capacity (drop-pad only).
        numerics: "atlas_a2" or "ascend_950": the forward is the same in both; autograd's backward
            sums in that device's order (see moe_init_routing_grad).

    Returns:
        (expanded_x, expanded_row_idx, expert_tokens_count_or_cumsum, expert_tokens_before_capacity):
        expanded_x [min(A, N*K) or N*K, H] (dropless) or [E, C, H] (drop-pad, unfilled slots 0);
        expanded_row_idx [N*K] int32 (pair p -> its row or slot; -1 when dropped for capacity);
        the two int32 [E] count tensors (zeros when not requested).
    """
    return torch.ops.moe_routing.moe_init_routing_v2(
        x, expert_idx, active_num, expert_capacity, expert_num, drop_pad_mode,
        expert_tokens_count_or_cumsum_flag, expert_tokens_before_capacity_flag, numerics=numerics)


def moe_init_routing(x: torch.Tensor, expert_idx: torch.Tensor, scale: Optional[torch.Tensor] = None,
                     offset: Optional[torch.Tensor] = None, topk_weight: Optional[torch.Tensor] = None,
                     active_num: Union[int, torch.SymInt] = -1, expert_capacity: int = -1, expert_num: int = -1,
                     drop_pad_mode: int = 0, expert_tokens_num_type: int = 0, expert_tokens_num_flag: bool = False,
                     quant_mode: int = -1, active_expert_range: Optional[List[int]] = None, row_idx_type: int = 0,
                     x_dtype: Optional[int] = None, *, numerics: str = "atlas_a2", out=None):
    """cann_ops_transformer.moe_init_routing (aclnnMoeInitRoutingV4 semantics), differentiable.

    The arguments up to x_dtype are CANN's, in CANN's order (positional or keyword).

    Args:
        x: [N, H] float32/float16/bfloat16 (int8 allowed with quant_mode=-1).
        expert_idx: [N, K] int32. Ids outside active_expert_range (e.g. -1) are not routed.
        scale: optional float32. quant_mode -1: [N] per-token scale gathered into expanded_scale;
            0: [1] static scale (required); 1: [end-start, H] or [1, H] smooth scale.
        offset: optional float32 [1], static quant only.
        topk_weight: optional float32 [N, K], gathered into expanded_topk_weight.
        active_num: -1/0 keep every routed pair; > 0 keep the first min(active_num, routed). An int
            or a SymInt (torch.compile keeps it symbolic, e.g. x.shape[0] * K).
        expert_capacity: C for drop_pad_mode=1.
        expert_num: E (required, >= 1).
        drop_pad_mode: 0 dropless ([N*K, H]), 1 drop-pad ([E, C, H]).
        expert_tokens_num_type: 0 cumsum, 1 count, 2 key_value ([E, 2]).
        expert_tokens_num_flag: produce expert_tokens_count_or_cumsum (zeros otherwise).
        quant_mode: -1 none, 0 static int8, 1 dynamic int8 (CANN's 2..17: NotImplementedError).
        active_expert_range: [start, end) of experts handled here, two ints (default
            [0, expert_num)).
        row_idx_type: 0 gather (pair -> row, -1 if not routed), 1 scatter (row -> pair).
        x_dtype: CANN's code for the real type of uint8-stored data (float4/hifloat8/int4, its
            quant modes 2..17); must be None here (NotImplementedError otherwise).
        numerics: "atlas_a2" (default; Atlas A2/A3) or "ascend_950" (Ascend 950): the
            quantisation arithmetic, and the accumulation order of autograd's backward.
        out: optional tuple of the five output tensors (contiguous, on the inputs' device,
            exactly the shapes and dtypes the call returns, overlapping no input) to write into;
            no allocation, not differentiable.

    Returns:
        (expanded_x, expanded_row_idx, expert_tokens_count_or_cumsum, expanded_scale,
        expanded_topk_weight). See docs/moe_init_routing.md for shapes.

    Autograd: x, scale (quant_mode -1) and topk_weight get gradients for every non-quantised
    configuration; a quantised forward raises NotImplementedError in backward.
    """
    if active_expert_range is not None:
        active_expert_range = _two_ints("moe_init_routing", "active_expert_range", active_expert_range)
    args = (x, expert_idx, scale, offset, topk_weight, active_num, expert_capacity, expert_num, drop_pad_mode,
            expert_tokens_num_type, expert_tokens_num_flag, quant_mode, active_expert_range, row_idx_type, x_dtype)
    if out is not None:
        if len(out) != 5:
            raise ValueError(f"moe_init_routing: out must be a tuple of 5 tensors, got {len(out)}")
        names = ("expanded_x", "expanded_row_idx", "expert_tokens_count_or_cumsum", "expanded_scale",
                 "expanded_topk_weight")
        torch.ops.moe_routing.moe_init_routing.out(*args, numerics=numerics, **dict(zip(names, out)))
        return tuple(out)
    return torch.ops.moe_routing.moe_init_routing(*args, numerics=numerics)


def _two_ints(op: str, name: str, values) -> list:
    """A list of two ints from any sequence of two integer values; floats are refused rather than
    truncated ([0.9, 2.9] is not [0, 2])."""
    try:
        result = [operator.index(v) for v in values]
    except TypeError:
        result = None
    if result is None or len(result) != 2:
        raise ValueError(f"{op}: {name} must be a list of two ints [start, end], got {values!r}")
    return result
