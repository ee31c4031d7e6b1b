"""The collectives expert parallelism needs, on torch.distributed, with three properties the plain
calls lack:

* every row tensor travels as its bytes (a uint8 view): no backend needs to know float16 or
  bfloat16, arithmetic never touches the payload, and every bit (signed zeros, NaN payloads)
  arrives as it left;
* outputs are allocated on the input's device, so the same code runs on CPU tensors with gloo and
  CUDA tensors with NCCL;
* a collective that fails or times out raises a RuntimeError naming the operation, the step and
  the rank, instead of the backend's bare message.

Without an initialised process group (and no group given) a `Comm` is a world of one that moves
nothing over a network: the single-process case runs the same code.
"""
from __future__ import annotations

import math
import threading
from typing import Optional, Sequence

import torch
import torch.distributed as dist


class Comm:
    """A process group as expert parallelism uses it: its rank, its size, and the collectives.

    `op` names the public operation being run ("dispatch", "combine", ...) in error messages."""

    def __init__(self, group=None, op: str = "distributed"):
        self.op = op
        self.group = group
        self.local = group is None and not (dist.is_available() and dist.is_initialized())
        if self.local:
            self.rank, self.world = 0, 1
        else:
            self.rank = dist.get_rank(group)
            self.world = dist.get_world_size(group)
            if self.rank < 0:
                raise ValueError(f"moe_routing.distributed.{op}: this process must belong to group, got a group "
                                 f"it is not a member of")

    def renamed(self, op: str) -> "Comm":
        """The same group, naming `op` in its errors."""
        other = Comm.__new__(Comm)
        other.__dict__.update(self.__dict__)
        other.op = op
        return other

    def name(self) -> str:
        """The group's name, the same on every rank of it ("" for a world of one)."""
        if self.local:
            return ""
        return (self.group if self.group is not None else dist.group.WORLD).group_name

    def meta_device(self) -> torch.device:
        """Where small integer tensors for collectives live: CUDA for NCCL-only groups, else CPU."""
        if self.local:
            return torch.device("cpu")
        backend = str(dist.get_backend(self.group))
        if "nccl" in backend and "gloo" not in backend:
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def fail(self, step: str, error: BaseException) -> RuntimeError:
        who = f"rank {self.rank} of {self.world}"
        if not self.local and dist.get_rank() != self.rank:  # a subgroup: its rank alone names no process
            who += f" (global rank {dist.get_rank()})"
        return RuntimeError(f"moe_routing.distributed.{self.op}: {who}: the {step} failed (a peer that does not take "
                            f"part times out): {error}")

    def wait(self, step: str, work) -> None:
        if work is None:
            return
        try:
            work.wait()
        except RuntimeError as error:  # gloo/NCCL timeouts and lost peers (DistError is one)
            raise self.fail(step, error) from error

    def all_gather_fixed(self, message: torch.Tensor, step: str) -> torch.Tensor:
        """[world, len] from every rank's 1-D message of the same length (a fixed length, so that
        ranks that disagree about everything else still exchange it safely)."""
        if self.local:
            return message.unsqueeze(0).clone()
        out = [torch.empty_like(message) for _ in range(self.world)]
        try:
            work = dist.all_gather(out, message, group=self.group, async_op=True)
        except RuntimeError as error:
            raise self.fail(step, error) from error
        self.wait(step, work)
        return torch.stack(out)

    def all_to_all_rows(self, rows: torch.Tensor, output_splits: Sequence[int], input_splits: Sequence[int],
                        step: str, *, async_op: bool = False, out: Optional[torch.Tensor] = None):
        """rows [sum(input_splits), ...] -> [sum(output_splits), ...], rows input_splits[d] to rank d,
        output_splits[s] from rank s, source-rank-major (into `out` when given: contiguous, the
        right shape, not overlapping rows). With async_op=True returns (out, work): call
        wait(step, work) before reading out."""
        rows = rows.contiguous()
        if out is None:
            out = torch.empty((int(sum(output_splits)),) + tuple(rows.shape[1:]), dtype=rows.dtype,
                              device=rows.device)
        work = None
        if self.local:
            out.copy_(rows)
        else:
            try:
                work = dist.all_to_all_single(_wire(out), _wire(rows), list(output_splits), list(input_splits),
                                              group=self.group, async_op=True)
            except RuntimeError as error:
                raise self.fail(step, error) from error
        if async_op:
            return out, work
        self.wait(step, work)
        return out

    def all_gather_rows(self, rows: torch.Tensor, counts: Sequence[int], step: str) -> torch.Tensor:
        """The ranks' row blocks (rank r has counts[r] rows) concatenated rank-major, on every rank."""
        if self.local:
            return rows.contiguous().clone()
        # all_to_all with the same block to every rank is an all-gather of uneven blocks.
        n = rows.shape[0]
        send = rows.contiguous().repeat((self.world,) + (1,) * (rows.dim() - 1)) if n else rows.contiguous()
        return self.all_to_all_rows(send, list(counts), [n] * self.world, step)


class _StagingBuffers(threading.local):
    def __init__(self):
        self.buffers: dict = {}


_STAGING = _StagingBuffers()


def staging(slot: int, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A scratch tensor of `shape` for rows on their way (a send buffer, a received block before
    its re-layout): on the CPU one of a few byte buffers per thread, reused from call to call, so
    that a step does not pay the page faults of fresh memory for each of them (PyTorch's CPU
    allocator returns large blocks to the system). Its contents are dead once the step that asked
    for it is over: never returned to a caller or saved for backward. Elsewhere (CUDA: the caching
    allocator already reuses memory) a plain new tensor."""
    if device.type != "cpu":
        return torch.empty(tuple(shape), dtype=dtype, device=device)
    nbytes = math.prod(shape) * dtype.itemsize
    key = slot
    buffer = _STAGING.buffers.get(key)
    if buffer is None or buffer.numel() < nbytes:
        buffer = torch.empty(nbytes + nbytes // 4, dtype=torch.uint8)  # room to grow a little
        _STAGING.buffers[key] = buffer
    return buffer[:nbytes].view(dtype).view(tuple(shape))


def release_staging_buffers() -> None:
    """Frees this thread's staging buffers (they are as large as the largest exchange so far)."""
    _STAGING.buffers.clear()


def _wire(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor as uint8 (rows stay rows: the last dimension widens)."""
    if t.dim() == 0:
        t = t.reshape(1)
    if t.dim() == 1:
        t = t.unsqueeze(1)
    return t.view(torch.uint8)


class _AllToAll(torch.autograd.Function):
    """all_to_all_single as an autograd function: the backward sends the gradient rows back the
    way they came (rows move, nothing is summed, so gradients keep every bit)."""

    @staticmethod
    def forward(ctx, rows, output_splits, input_splits, comm, step="all_to_all"):
        ctx.splits = (list(output_splits), list(input_splits))
        ctx.comm = comm
        return comm.all_to_all_rows(rows, output_splits, input_splits, step)

    @staticmethod
    def backward(ctx, grad):
        # The reverse exchange, itself differentiable (create_graph=True, second derivatives).
        output_splits, input_splits = ctx.splits
        return _AllToAll.apply(grad, input_splits, output_splits, ctx.comm, "all_to_all backward"), \
            None, None, None, None
