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

from typing import List

import torch

from ._comm import Comm
from ._ep import _F_TOKENS, _exchange, row_fields


class RowLayout:
    """How many rows each rank holds (rank-major) and where this rank's rows start."""

    def __init__(self, comm: Comm, counts: List[int]):
        self.comm = comm
        self.counts = counts
        self.start = sum(counts[:comm.rank])
        self.stop = self.start + counts[comm.rank]
        self.total = sum(counts)

    def renamed(self, op: str) -> "RowLayout":
        """The same layout, its collectives naming `op` in their errors."""
        other = RowLayout.__new__(RowLayout)
        other.__dict__.update(self.__dict__)
        other.comm = self.comm.renamed(op)
        return other


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
        # of the replicated tensor, as a single process would (differentiable, as above). The ranks
        # agree on its sizes, dtype and device type first, as replicate_rows' ranks on its rows: a
        # rank whose computation after replicate_rows took another dtype or width would send rows
        # of another byte width (gloo aborts the process) or of the same width reinterpreted.
        layout = ctx.layout.renamed("local_rows")  # its collectives' errors name local_rows
        fields, error = row_fields("local_rows", grad)
        _exchange("local_rows", layout.comm, fields, error, grad.shape[0] if error is None else 0, None)
        return _Replicate.apply(grad, layout, "gradient rows all-gather"), None


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
    # The agreement exchange of dispatch and combine, with the rows' count, dimensions, sizes, dtype
    # and device type: ranks whose rows differ would exchange rows of different byte widths (or on
    # a device type the backend refuses on one rank only), and a rank calling dispatch or combine
    # meanwhile a message of another length (gloo aborts the process on either); so every rank
    # raises the same ValueError instead.
    fields, error = row_fields("replicate_rows", rows)
    table = _exchange("replicate_rows", comm, fields, error, rows.shape[0] if error is None else 0, None)
    layout = RowLayout(comm, table[:, _F_TOKENS].tolist())
    return _Replicate.apply(rows, layout), layout


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
