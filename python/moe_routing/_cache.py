"""The output cache: where the operators' large new CPU outputs come from.

A functional call (``moe_init_routing(x, ...)``, autograd's backward) returns new tensors, and a
training or serving loop frees them a step later. New memory costs the OS faulting in and zeroing
every page on its first touch, which for a training-size ``expanded_x`` took longer than the
kernel. CPU outputs of 1 MiB or more therefore come from a cache of buffers that freed outputs
left in place (as PyTorch's CUDA caching allocator does on the GPU): the first call of a size pays
for new pages (asked to be huge pages), later calls reuse them. Buffers nobody uses are kept up to
a limit per process — ``MOE_ROUTING_OUTPUT_CACHE_MB`` (MiB; ``0`` turns the cache off) or by default
1/8 of the memory the process may use (physical memory, or the cgroup's limit) — and given back to the
OS oldest first beyond it. Values are never
affected: every output element is written by the operator. See docs/python.md.
"""
from __future__ import annotations

import torch

from . import _library  # noqa: F401  (registers torch.ops.moe_routing.*)
from ._port import INT64_MAX, check_int


def output_cache_stats() -> dict:
    """What the cache holds and has done: ``limit_bytes``, ``idle_bytes`` (kept for reuse),
    ``in_use_bytes`` (held by live tensors), ``hits``, ``misses`` (new memory mapped) and ``min_bytes``
    (outputs smaller than this come from PyTorch's allocator)."""
    limit, idle, in_use, hits, misses, min_bytes = torch.ops.moe_routing._output_cache_stats()
    return {"limit_bytes": limit, "idle_bytes": idle, "in_use_bytes": in_use, "hits": hits, "misses": misses,
            "min_bytes": min_bytes}


def set_output_cache_limit(limit_bytes: int) -> None:
    """Keep at most ``limit_bytes`` idle (0: none — every output's memory goes back to the OS when
    freed, and new outputs come from PyTorch's allocator); what exceeds it is given back now. An int
    >= 0 (a float, bool or string is refused rather than truncated); one above int64 keeps
    everything, as int64's largest does."""
    limit = check_int("set_output_cache_limit", "bytes", limit_bytes, minimum=0)
    torch.ops.moe_routing._set_output_cache_limit(min(limit, INT64_MAX))


def set_huge_pages(enabled: bool) -> None:
    """Ask (``True``) or stop asking (``False``) for transparent huge pages for the new memory of large CPU
    outputs, from now on, for the process. Replaces ``MOE_ROUTING_HUGE_PAGES``, which is read once, when
    moe_routing is imported: the library does not read the environment while operators run (a ``getenv`` racing another
    thread's ``os.environ[...] = ...`` is undefined behaviour in C). A bool (anything else is refused)."""
    if not isinstance(enabled, bool):
        raise ValueError(f"set_huge_pages: enabled must be a bool, got {enabled!r}")
    torch.ops.moe_routing._set_huge_pages(enabled)


def empty_cache() -> None:
    """Give every idle buffer back to the OS (tensors in use keep theirs), like
    ``torch.cuda.empty_cache()``."""
    torch.ops.moe_routing._empty_output_cache()


def empty(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """A new uninitialised tensor for the package's own large buffers: on the CPU from the output cache, as
    the operators' outputs (below 1 MiB, or with the cache off, from PyTorch's allocator); elsewhere
    ``torch.empty``."""
    if torch.device(device).type == "cpu":
        return torch.ops.moe_routing._empty_from_output_cache([int(d) for d in shape], dtype)
    return torch.empty(tuple(shape), dtype=dtype, device=device)
