"""An expert-parallel MoE layer: router -> top-k -> dispatch -> this rank's expert MLPs -> combine."""
from __future__ import annotations

from typing import List, Optional

import torch
from torch import nn

from ._comm import Comm
from ._ep import combine, dispatch
from ._replicate import local_rows, replicate_rows


class Router(nn.Module):
    """softmax(x @ weight) and its top-k: (scales [N, K] float32, expert ids [N, K] int32)."""

    def __init__(self, weight: torch.Tensor, top_k: int):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.top_k = top_k

    def forward(self, x: torch.Tensor):
        probs = torch.softmax((x @ self.weight).float(), dim=-1)
        scales, ids = probs.topk(self.top_k, dim=-1)
        return scales, ids.to(torch.int32)


class ExpertParallelMoE(nn.Module):
    """y = combine(experts(dispatch(x)), scales = top-k router weights, bias = per-expert bias),
    each rank holding the experts [r*E/W, (r+1)*E/W) of its group.

    Expert e is relu(rows @ w1[e]) @ w2[e] (then + bias[e], weighted by the router, in the
    combine). Parameters: `router.weight` [H, E] and `bias` [E, H] on every rank; `w1`
    [E/W, H, F] and `w2` [E/W, F, H] this rank's experts only. All are initialised from `seed`
    as the single-process layer's (world of one) and sliced, so a W-rank layer and a
    single-process layer start identical.

    deterministic=True (default): the router runs on the replicated global batch
    (replicate_rows / local_rows): every gradient, on every rank, equals the single-process
    gradient of the global batch bit for bit; nothing needs DDP. The router's gradient is complete
    on every rank; do not all-reduce it again.
    deterministic=False: the router runs on this rank's tokens; its gradient is this rank's part,
    to be summed over ranks, e.g. by wrapping `router` in DDP (ep.allreduce_sum_hook) or FSDP.
    The experts' and bias's gradients are complete either way (keep them out of DDP / FSDP).

    forward(x [N, H]) -> y [N, H], dtype of the parameters; N may differ by rank (and be 0).
    """

    def __init__(self, hidden: int, ffn: int, num_experts: int, top_k: int, *, group=None,
                 expert_capacity: Optional[int] = None, deterministic: bool = True, numerics: str = "atlas_a2",
                 dtype: torch.dtype = torch.float32, seed: int = 0):
        super().__init__()
        comm = Comm(group, "ExpertParallelMoE")
        if num_experts % comm.world:
            raise ValueError(f"moe_routing.distributed.ExpertParallelMoE: num_experts must be divisible by the "
                             f"world size ({comm.world}), got {num_experts}")
        self.group = group
        self.num_experts = num_experts
        self.top_k = top_k
        self.expert_capacity = expert_capacity
        self.deterministic = deterministic
        self.numerics = numerics
        local = num_experts // comm.world
        self.first_expert = comm.rank * local
        g = torch.Generator().manual_seed(seed)
        router = torch.randn(hidden, num_experts, generator=g) / hidden ** 0.5
        w1 = torch.randn(num_experts, hidden, ffn, generator=g) / hidden ** 0.5
        w2 = torch.randn(num_experts, ffn, hidden, generator=g) / ffn ** 0.5
        bias = torch.randn(num_experts, hidden, generator=g) * 0.1
        mine = slice(self.first_expert, self.first_expert + local)
        self.router = Router(router.to(dtype), top_k)
        self.w1 = nn.Parameter(w1[mine].to(dtype).contiguous())
        self.w2 = nn.Parameter(w2[mine].to(dtype).contiguous())
        self.bias = nn.Parameter(bias.to(dtype))

    def route(self, x: torch.Tensor):
        """(scales [N, K] in the combine's dtype, expert ids [N, K] int32) for this rank's tokens."""
        if self.deterministic:
            x_all, layout = replicate_rows(x, group=self.group)
            scales_all, ids_all = self.router(x_all)
            scales, ids = local_rows(scales_all, layout), ids_all[layout.start:layout.stop]
        else:
            scales, ids = self.router(x)
        # float32 scales go with bfloat16 rows (the combine's mixed precision); else x's dtype.
        return (scales if x.dtype == torch.bfloat16 else scales.to(x.dtype)), ids

    def experts(self, rows: torch.Tensor, tokens_per_expert: List[int]) -> torch.Tensor:
        """This rank's experts, one at a time on their own rows (the same shapes as in a single
        process, hence the same bits): rows [M, H] (counts per expert) or [E/W, C, H]."""
        def mlp(j: int, block: torch.Tensor) -> torch.Tensor:
            return torch.relu(block @ self.w1[j]) @ self.w2[j]

        if rows.dim() == 3:
            return torch.stack([mlp(j, rows[j]) for j in range(rows.shape[0])])
        pieces, start = [], 0
        for j, count in enumerate(tokens_per_expert):
            pieces.append(mlp(j, rows[start:start + count]))
            start += count
        return torch.cat(pieces)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scales, ids = self.route(x)
        recv_x, tokens_per_expert, handle = dispatch(x, ids, self.num_experts, group=self.group,
                                                     expert_capacity=self.expert_capacity, numerics=self.numerics)
        expert_out = self.experts(recv_x, tokens_per_expert.tolist())
        return combine(expert_out, handle, scales=scales, bias=self.bias, numerics=self.numerics)

    def expert_parameters(self) -> List[nn.Parameter]:
        """Parameters whose gradients dispatch / combine already complete (keep them out of DDP)."""
        return [self.w1, self.w2, self.bias]
