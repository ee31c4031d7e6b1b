"""Expert parallelism on moe_routing's operators and torch.distributed (docs/distributed.md).

    import moe_routing.distributed as ep
    recv_x, tokens_per_expert, handle = ep.dispatch(x, expert_idx, num_experts)   # rows to experts' ranks
    expert_out = ...                                    # this rank's experts on recv_x (expert-major)
    y = ep.combine(expert_out, handle, scales=topk_weight, x1=shared_out)       # back and combined

Forward and every gradient equal, bit for bit, the single-device computation of the global batch
(docs/decisions.md §17). ExpertParallelMoE is a whole layer on them.
"""
from __future__ import annotations

from ._comm import release_staging_buffers
from ._ep import DispatchHandle, all_to_all, combine, dispatch
from ._launch import run_local
from ._module import ExpertParallelMoE, Router
from ._replicate import RowLayout, allreduce_sum_hook, local_rows, replicate_rows

__all__ = ["dispatch", "combine", "DispatchHandle", "all_to_all", "replicate_rows", "local_rows", "RowLayout",
           "allreduce_sum_hook", "ExpertParallelMoE", "Router", "run_local", "release_staging_buffers"]
