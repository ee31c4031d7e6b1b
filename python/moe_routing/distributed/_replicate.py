"""Replicated computation of the global batch: the deterministic path for non-expert parameters.

A parameter used on each rank's own tokens (a router, a shared expert) gets a per-rank partial
gradient; DDP's all-reduce adds the partials, in an order and grouping that differ from the
single-process gradient's, and CPU matmuls even round a row differently with a different number
of rows. `replicate_rows` gives every rank the global batch, so that every rank computes the
non-expert part on exactly the tensors (and shapes) a single process would, and `local_rows` takes
this rank's rows back out. The gradients then equal the single-process ones bit for bit on every
rank, at the price of the non-expert computation repeated on every rank.
"""
from __future__ import annotations

import math
from typing import List

import torch

from .._port import dtype_name
from ._comm import Comm
from ._ep import _by_rank

# Every dtype, numbered the same way in every process (of one PyTorch version) for the exchange.
_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
_SHOWN_DIMS = 8


class RowLayout:
    """How many rows each rank holds (rank-major) and where this rank's rows start."""

    def __init__(self, comm: Comm, counts: List[int]):
        self.comm = comm
        self.counts = counts
        self.start = sum(counts[:comm.rank])
        self.stop = self.start + counts[comm.rank]
        self.total = sum(counts)


class _Replicate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, layout: RowLayout, step: str = "rows all-gather"):
        ctx.layout = layout
        return layout.comm.all_gather_rows(rows, layout.counts, step)

    @staticmethod
    def backward(ctx, grad):
        # Every rank computed the same function of the same replicated tensor, so every rank holds
        # the whole (identical) gradient: this rank's rows of it are its input's gradient. Taken
        # with _Local, whose backward all-gathers, so that a second derivative (create_graph=True)
        # is also that of the replicated computation.
        return _Local.apply(grad, ctx.layout), None, None


class _Local(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, layout: RowLayout):
        ctx.layout = layout
        return rows[layout.start:layout.stop]

    @staticmethod
    def backward(ctx, grad):
        # Each rank has the gradient of its own rows: all-gathered, every rank holds the gradient
        # of the replicated tensor, as a single process would (differentiable, as above).
        return _Replicate.apply(grad, ctx.layout, "gradient rows all-gather"), None


def replicate_rows(rows: torch.Tensor, *, group=None):
    """Every rank's rows, concatenated rank-major, on every rank (differentiable).

    Args:
        rows: [N_r, ...] this rank's rows (N_r may differ by rank, may be 0).
        group: the process group (None: the default; a world of one without torch.distributed).

    Returns:
        (all_rows [sum N_r, ...], layout): layout (a RowLayout) is what `local_rows` needs.
        The backward assumes replicated use: every rank computes the same function of all_rows
        (so that its gradient is identical on every rank) and returns this rank's rows of it.
    """
    comm = Comm(group, "replicate_rows")
    if comm.local:
        layout = RowLayout(comm, [rows.shape[0]])
    else:
        # With the count, the rows' dtype and sizes after the first dimension: ranks whose rows
        # differ there would exchange rows of different byte widths (gloo aborts the process), so
        # every rank checks them and raises the same ValueError.
        message = torch.tensor([rows.shape[0]] + _row_kind(rows), dtype=torch.int64, device=comm.meta_device())
        table = comm.all_gather_fixed(message, "row counts all-gather").cpu()
        kinds = [tuple(row) for row in table[:, 1:].tolist()]
        distinct = list(dict.fromkeys(kinds))
        if len(distinct) > 1:
            raise ValueError(f"moe_routing.distributed.replicate_rows: rows must have the same dtype and sizes "
                             f"after the first dimension on every rank, got "
                             f"{_by_rank([distinct.index(k) for k in kinds], lambda i: _show_kind(distinct[i]))}")
        layout = RowLayout(comm, table[:, 0].tolist())
    return _Replicate.apply(rows, layout), layout


def _row_kind(rows: torch.Tensor) -> List[int]:
    """[dtype number, dimensions, elements per row, the first sizes after the first dimension (-1
    padded)]: equal on two ranks when their rows have the same dtype and shape (the product
    covers sizes past the shown ones up to their order)."""
    trailing = list(rows.shape[1:])
    return [_DTYPES.index(rows.dtype), rows.dim(), math.prod(trailing)] + (trailing + [-1] * _SHOWN_DIMS)[:_SHOWN_DIMS]


def _show_kind(kind) -> str:
    dtype, dims, per_row, *sizes = kind
    shown = ", ".join(["*"] + [str(size) for size in sizes[:max(dims - 1, 0)]])
    if dims - 1 > _SHOWN_DIMS:
        shown += f", ... ({dims}-D, {per_row} elements a row)"
    return f"{dtype_name(_DTYPES[dtype])} [{shown}]"


def local_rows(all_rows: torch.Tensor, layout: RowLayout) -> torch.Tensor:
    """This rank's rows of a replicated [sum N_r, ...] tensor (differentiable: the backward
    all-gathers every rank's gradient rows, so that the replicated computation before it gets the
    whole gradient on every rank)."""
    if all_rows.shape[0] != layout.total:
        raise ValueError(f"moe_routing.distributed.local_rows: all_rows must have {layout.total} rows (every "
                         f"rank's), got {all_rows.shape[0]}")
    return _Local.apply(all_rows, layout)


def allreduce_sum_hook(process_group, bucket):
    """A DDP communication hook that sums gradients over ranks instead of averaging them: with
    expert parallelism every rank's loss is a part of the global loss, and dispatch / combine
    already give the expert parameters the sum of the ranks' contributions; summing the
    non-expert ones too keeps every gradient that of the same (global) loss.
    Use: ddp_module.register_comm_hook(None, allreduce_sum_hook)."""
    import torch.distributed as dist
    group = process_group if process_group is not None else dist.group.WORLD
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda future: future.value()[0])
