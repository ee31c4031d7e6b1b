"""Expert parallelism on moe_routing's operators and torch.distributed (docs/distributed.md).

    import moe_routing.distributed as ep
    recv_x, tokens_per_expert, handle = ep.dispatch(x, expert_idx, num_experts)   # rows to experts' ranks
    expert_out = ...                                    # this rank's experts on recv_x (expert-major)
    y = ep.combine(expert_out, handle, scales=topk_weight, x1=shared_out)       # back and combined

Forward and every gradient equal, bit for bit, the single-device computation of the global batch
(docs/decisions.md §17).
"""
from __future__ import annotations

from ._comm import all_to_all
from ._ep import DispatchHandle, combine, dispatch
from ._launch import run_local

__all__ = ["dispatch", "combine", "DispatchHandle", "all_to_all", "run_local"]
