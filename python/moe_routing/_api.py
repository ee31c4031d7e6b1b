"""The public functions, with CANN's (cann_ops_transformer) names, argument names and defaults."""
from __future__ import annotations

import torch


def moe_init_routing_grad(grad_expanded_x: torch.Tensor, expanded_row_idx: torch.Tensor, top_k: int,
                          drop_pad_mode: int = 0, active_num: int = 0, *,
                          order: str = "tree") -> torch.Tensor:
    """Backward of moe_init_routing: grad_x[i] = sum_t grad_expanded_x[expanded_row_idx[i*top_k + t]].

    Args:
        grad_expanded_x: gradient of expanded_x; float32/float16/bfloat16. [N*K, H] (dropless),
            [active_num, H] (active: drop_pad_mode=0, active_num>0) or [E, C, H] (drop_pad_mode=1).
        expanded_row_idx: int32 [N*K], the forward's output. -1 marks a dropped pair (skipped);
            in the active scenario values >= active_num are skipped too.
        top_k: K > 0.
        drop_pad_mode: 0 (dropless/active) or 1 (drop-pad).
        active_num: >= 0; with drop_pad_mode=0, > 0 selects the active scenario.
        order: "tree" (Atlas A2/A3 float32 order, default) or "sequential" (Ascend 950).

    Returns:
        grad_x [N, H], dtype of grad_expanded_x.

    Raises:
        ValueError: invalid arguments; IndexError: an expanded_row_idx value out of range.
    """
    return torch.ops.moe_routing.moe_init_routing_grad(grad_expanded_x, expanded_row_idx, top_k,
                                                       drop_pad_mode, active_num, order)
