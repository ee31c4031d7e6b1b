"""What the processes of tests/python/test_distributed*.py run (moe_routing.distributed.run_local
spawns them and imports this module by name): expert-parallel dispatch -> experts -> combine on
each rank, compared bit for bit with the single-device computation of the global batch, which
every rank also computes (the global inputs come from one seed)."""
from __future__ import annotations

import contextlib
import datetime
import os
import sys
import time
from typing import Dict, List, Optional
from unittest import mock

import torch
import torch.distributed as dist

import moe_routing
import moe_routing.distributed as ep
from moe_routing.distributed import _ep as ep_module

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python"))
import ep_moe  # noqa: E402

bitwise_equal = ep_moe.bitwise_equal


def case(name: str, tokens: List[int], *, dtype=torch.float32, capacity: Optional[int] = None, hidden: int = 16,
         top_k: int = 2, experts: Optional[int] = None, scales: Optional[str] = "same", bias: bool = True,
         x1: bool = True, x2: bool = False, numerics: str = "atlas_a2", unused_experts=(), repeats: bool = False,
         seed: int = 0, create_graph: bool = False) -> dict:
    """A scenario: `tokens` per rank (so the world size is len(tokens)); scales "same" (dtype of x),
    "float32" (with bfloat16) or None; `unused_experts` receive no pair; `repeats`: a token may
    choose the same expert more than once; `create_graph`: the expert-parallel gradients taken
    with create_graph=True (the same values; a second derivative must then raise)."""
    world = len(tokens)
    return dict(name=name, tokens=list(tokens), dtype=dtype, capacity=capacity, hidden=hidden, top_k=top_k,
                experts=experts if experts is not None else 2 * world + 2 * (world == 1), scales=scales, bias=bias,
                x1=x1, x2=x2, numerics=numerics, unused_experts=tuple(unused_experts), repeats=repeats, seed=seed,
                create_graph=create_graph)


def global_inputs(spec: dict) -> Dict[str, torch.Tensor]:
    """The global batch (tokens numbered rank-major) and the experts' parameters, from the seed."""
    g = torch.Generator().manual_seed(spec["seed"])
    n, h, k, e, dtype = sum(spec["tokens"]), spec["hidden"], spec["top_k"], spec["experts"], spec["dtype"]
    allowed = [i for i in range(e) if i not in spec["unused_experts"]]
    assert len(allowed) >= k
    if spec["repeats"]:
        choice = torch.randint(0, len(allowed), (n, k), generator=g)
    else:
        choice = torch.stack([torch.randperm(len(allowed), generator=g)[:k] for _ in range(n)]) if n else \
            torch.empty(0, k, dtype=torch.int64)
    inputs = {
        "x": torch.randn(n, h, generator=g).to(dtype),
        "expert_idx": torch.tensor(allowed, dtype=torch.int32)[choice].reshape(n, k),
        "expert_scale": (torch.rand(e, h, generator=g) + 0.5).to(dtype),  # the experts: rows * a[e]
        "grad_y": torch.randn(n, h, generator=g).to(dtype),
    }
    if spec["scales"] is not None:
        scales_dtype = torch.float32 if spec["scales"] == "float32" else dtype
        inputs["scales"] = torch.rand(n, k, generator=g).to(scales_dtype)
    if spec["bias"]:
        inputs["bias"] = (torch.randn(e, h, generator=g) * 0.1).to(dtype)
    if spec["x1"]:
        inputs["x1"] = torch.randn(n, h, generator=g).to(dtype)
    if spec["x2"]:
        inputs["x2"] = torch.randn(n, h, generator=g).to(dtype)
    return inputs


def run_experts(rows: torch.Tensor, expert_scale: torch.Tensor, counts: List[int]) -> torch.Tensor:
    """Expert j scales its rows by expert_scale[j], one expert at a time (the same shapes, hence
    the same bits, whatever the world size): rows [M, H] with counts[j] rows per expert, or
    [E', C, H] (drop-pad: C rows per expert)."""
    if rows.dim() == 3:
        return torch.stack([rows[j] * expert_scale[j] for j in range(rows.shape[0])])
    pieces, start = [], 0
    for j, count in enumerate(counts):
        pieces.append(rows[start:start + count] * expert_scale[j])
        start += count
    return torch.cat(pieces) if pieces else rows * 1


_DIFFERENTIABLE = ("x", "scales", "x1", "x2", "bias", "expert_scale")


def _leaves(inputs: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    return {name: (t.clone().requires_grad_() if name in _DIFFERENTIABLE else t) for name, t in inputs.items()}


def single_device(spec: dict, inputs: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The global batch on one device with the plain operators."""
    t = _leaves(inputs)
    e, capacity, numerics = spec["experts"], spec["capacity"], spec["numerics"]
    if capacity is None:
        expanded, row_idx, counts, _, _ = moe_routing.moe_init_routing(
            t["x"], t["expert_idx"], expert_num=e, expert_tokens_num_type=1, expert_tokens_num_flag=True,
            numerics=numerics)
        per_expert = counts.tolist()
        mode = 2
    else:
        expanded, row_idx, counts, _, _ = moe_routing.moe_init_routing(
            t["x"], t["expert_idx"], expert_num=e, drop_pad_mode=1, expert_capacity=capacity,
            expert_tokens_num_type=1, expert_tokens_num_flag=True, numerics=numerics)
        per_expert = counts.clamp(max=capacity).tolist()
        mode = 3
    out = run_experts(expanded, t["expert_scale"], per_expert)
    y = moe_routing.moe_finalize_routing(out, row_idx, x1=t.get("x1"), x2=t.get("x2"), bias=t.get("bias"),
                                         scales=t.get("scales"), expert_idx=t["expert_idx"], drop_pad_mode=mode,
                                         k=spec["top_k"], numerics=numerics)
    result = {"recv_x": expanded.detach(), "tokens_per_expert": torch.tensor(per_expert), "y": y.detach()}
    names = [name for name in _DIFFERENTIABLE if name in t]
    grads = torch.autograd.grad(y, [t[name] for name in names], t["grad_y"])
    result.update({"grad_" + name: grad for name, grad in zip(names, grads)})
    return result


def expert_parallel(spec: dict, inputs: Dict[str, torch.Tensor], rank: int, world: int, group=None,
                    device: str = "cpu"):
    """This rank's part of the same computation with dispatch / combine (on `device`; results on
    the CPU)."""
    tokens = spec["tokens"]
    lo, hi = sum(tokens[:rank]), sum(tokens[:rank + 1])
    e = spec["experts"]
    local = e // world
    mine = {name: (t[lo:hi] if name not in ("bias", "expert_scale") else t) for name, t in inputs.items()}
    mine["expert_scale"] = inputs["expert_scale"][rank * local:(rank + 1) * local]
    t = _leaves({name: value.to(device) for name, value in mine.items()})
    recv_x, per_expert, handle = ep.dispatch(t["x"], t["expert_idx"], e, group=group,
                                             expert_capacity=spec["capacity"], numerics=spec["numerics"])
    out = run_experts(recv_x, t["expert_scale"], per_expert.tolist())
    y = ep.combine(out, handle, scales=t.get("scales"), x1=t.get("x1"), x2=t.get("x2"), bias=t.get("bias"),
                   numerics=spec["numerics"])
    result = {"recv_x": recv_x.detach(), "tokens_per_expert": per_expert, "y": y.detach(),
              "tokens_per_rank": torch.tensor(handle.tokens_per_rank), "counts": handle.counts}
    names = [name for name in _DIFFERENTIABLE if name in t]
    grads = torch.autograd.grad(y, [t[name] for name in names], t["grad_y"], create_graph=spec["create_graph"])
    result.update({"grad_" + name: grad.detach() for name, grad in zip(names, grads)})
    if spec["create_graph"]:
        try:  # combine is differentiable once, as moe_finalize_routing: every rank raises
            torch.autograd.grad(sum(grad.sum() for grad in grads), [t[name] for name in names], allow_unused=True)
            raise AssertionError("a second derivative through combine did not raise")
        except NotImplementedError as error:
            assert "a second derivative of combine" in str(error), error
    return {name: value.cpu() for name, value in result.items()}


def _expanded(spec: dict, x: torch.Tensor, expert_idx: torch.Tensor) -> torch.Tensor:
    """The single-device moe_init_routing's expanded_x (dropless or drop-pad)."""
    capacity = {} if spec["capacity"] is None else dict(drop_pad_mode=1, expert_capacity=spec["capacity"])
    return moe_routing.moe_init_routing(x, expert_idx, expert_num=spec["experts"], numerics=spec["numerics"],
                                        **capacity)[0]


def dispatch_second_derivatives(spec: dict, inputs: Dict[str, torch.Tensor], rank: int, world: int, group=None):
    """(first, second) derivatives with respect to this rank's x of sum(rows^3) over the
    dispatched rows of every rank, the second that of sum(first * grad_y): expert parallel, and the
    single-device moe_init_routing's on the global batch (rows of this rank)."""
    tokens = spec["tokens"]
    lo, hi = sum(tokens[:rank]), sum(tokens[:rank + 1])
    found = []
    for parallel in (True, False):
        x = (inputs["x"][lo:hi] if parallel else inputs["x"]).clone().requires_grad_()
        ids = inputs["expert_idx"][lo:hi] if parallel else inputs["expert_idx"]
        rows = ep.dispatch(x, ids, spec["experts"], group=group, expert_capacity=spec["capacity"],
                           numerics=spec["numerics"])[0] if parallel else _expanded(spec, x, ids)
        (first,) = torch.autograd.grad((rows ** 3).sum(), x, create_graph=True)
        grad_y = inputs["grad_y"][lo:hi] if parallel else inputs["grad_y"]
        (second,) = torch.autograd.grad((first * grad_y).sum(), x)
        found.append((first.detach(), second) if parallel else (first.detach()[lo:hi], second[lo:hi]))
    return found


def compare(spec: dict, rank: int, world: int, group=None, device: str = "cpu") -> str:
    """"ok", or what differs on this rank (dispatch / combine on `device`, the single-device
    operators on the CPU)."""
    inputs = global_inputs(spec)
    want = single_device(spec, inputs)
    got = expert_parallel(spec, inputs, rank, world, group, device)
    tokens = spec["tokens"]
    lo, hi = sum(tokens[:rank]), sum(tokens[:rank + 1])
    local = spec["experts"] // world
    first, last = rank * local, (rank + 1) * local
    if spec["capacity"] is None:
        counts = want["tokens_per_expert"]
        start, stop = int(counts[:first].sum()), int(counts[:last].sum())
        want["recv_x"] = want["recv_x"][start:stop]
    else:
        want["recv_x"] = want["recv_x"][first:last]
    want["tokens_per_expert"] = want["tokens_per_expert"][first:last].to(torch.int64)
    for name in ("y", "grad_x", "grad_scales", "grad_x1", "grad_x2"):
        if name in want:
            want[name] = want[name][lo:hi]
    want["grad_expert_scale"] = want["grad_expert_scale"][first:last]
    want["tokens_per_rank"] = torch.tensor(tokens)
    ids, starts = inputs["expert_idx"].long(), [sum(tokens[:r]) for r in range(world + 1)]
    want["counts"] = torch.stack([torch.bincount(ids[starts[r]:starts[r + 1]].reshape(-1), minlength=spec["experts"])
                                  for r in range(world)])
    if spec["create_graph"]:
        (got["grad_x_create_graph"], got["second_x"]), (want["grad_x_create_graph"], want["second_x"]) = \
            dispatch_second_derivatives(spec, inputs, rank, world, group)
    differing = [name for name in want if name not in got or not bitwise_equal(got[name], want[name])]
    return "ok" if not differing else f"differ on rank {rank}: {', '.join(differing)}"


def run_cases(rank: int, world: int, specs: List[dict]) -> Dict[str, str]:
    """Every scenario of `specs` (each with len(tokens) == world): name -> "ok" or the difference."""
    results = {}
    for spec in specs:
        try:
            results[spec["name"]] = compare(spec, rank, world)
        except Exception as error:  # noqa: BLE001 - reported per scenario
            results[spec["name"]] = f"{type(error).__name__}: {error}"
    return results


# ---- the same errors on every rank ------------------------------------------------------------------

def _raised(fn, expected=ValueError) -> str:
    """"<expected type>: <message> (after <s> s)" for the error fn raised, or what happened instead."""
    started = time.monotonic()
    try:
        fn()
    except expected as error:
        return f"{expected.__name__}: {error} (after {time.monotonic() - started:.1f} s)"
    except Exception as error:  # noqa: BLE001
        return f"unexpected {type(error).__name__}: {error}"
    return "no error"


def _expect_error(fn) -> str:
    """The ValueError fn raised (without the time, which differs by rank)."""
    return _raised(fn).rsplit(" (after ", 1)[0]


def run_mismatches(rank: int, world: int) -> Dict[str, str]:
    """Calls whose arguments differ between ranks (or are wrong on one rank): name -> the error
    this rank raised. Every case makes exactly one exchange on every rank, so the next case starts
    in step; the last one checks that the group still works."""
    last = world - 1
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 8, generator=g)
    e = 2 * world
    idx = torch.randint(0, e, (5, 2), generator=g, dtype=torch.int32)
    out: Dict[str, str] = {}
    out["num_experts"] = _expect_error(lambda: ep.dispatch(x, idx % world, world if rank == 0 else e))
    out["hidden"] = _expect_error(lambda: ep.dispatch(x if rank != last else torch.randn(5, 4), idx, e))
    out["top_k"] = _expect_error(lambda: ep.dispatch(x, idx if rank != last else idx[:, :1].contiguous(), e))
    out["dtype"] = _expect_error(lambda: ep.dispatch(x if rank != last else x.to(torch.bfloat16), idx, e))
    out["capacity"] = _expect_error(lambda: ep.dispatch(x, idx, e, expert_capacity=None if rank else 2))
    out["numerics"] = _expect_error(lambda: ep.dispatch(x, idx, e, numerics="atlas_a2" if rank else "ascend_950"))
    bad = idx.clone()
    bad[3, 1] = e
    out["expert_id"] = _expect_error(lambda: ep.dispatch(x, bad if rank == last else idx, e))
    out["x_dtype"] = _expect_error(lambda: ep.dispatch(x.double() if rank == last else x, idx, e))
    # Every rank wrong: the first rank's error, and the others named after it (once in nested parentheses).
    out["x_dtype_everywhere"] = _expect_error(lambda: ep.dispatch(x.double(), idx, e))
    out["divisible"] = _expect_error(lambda: ep.dispatch(x, idx % (world + 1), world + 1)) if world > 1 else \
        "skipped"
    out["requires_grad"] = _expect_error(lambda: ep.dispatch(x.clone().requires_grad_(rank == 0), idx, e))
    recv_x, _, handle = ep.dispatch(x, idx, e)
    out["expert_out_shape"] = _expect_error(
        lambda: ep.combine(recv_x if rank != last else recv_x[1:], handle))
    scales = torch.rand(5, 2, generator=g)
    out["scales_presence"] = _expect_error(lambda: ep.combine(recv_x, handle, scales=scales if rank == 0 else None))
    out["scales_shape"] = _expect_error(lambda: ep.combine(recv_x, handle, scales=scales if rank else scales[:, :1]))
    # Rank 0 dispatches while the others combine: both exchanges are the same fixed message.
    out["operation"] = _expect_error(lambda: ep.dispatch(x, idx, e) if rank == 0 else ep.combine(recv_x, handle))
    # Two dispatches of the same shapes, the last rank combining the other one: the split sizes
    # disagree (gloo once aborted the process) or, with equal counts, rows go to the wrong tokens.
    other_x, _, other = ep.dispatch(x, idx.flip(0), e)
    out["handle"] = _expect_error(lambda: ep.combine(*((other_x, other) if rank == last else (recv_x, handle))))
    # A rank with no tokens passing a 1-D empty tensor, rows of another dtype, or a rank calling
    # dispatch meanwhile: rows of another width, messages of another length (gloo once aborted).
    out["replicate_rows"] = _expect_error(lambda: ep.replicate_rows(x if rank != last else torch.empty(0)))
    out["replicate_rows_dtype"] = _expect_error(lambda: ep.replicate_rows(x if rank != last else x.half()))
    # local_rows' backward all-gathers: rows needing a gradient on some ranks only once left the
    # others waiting in it (found by an adversarial review).
    out["replicate_rows_requires_grad"] = _expect_error(
        lambda: ep.replicate_rows(x.clone().requires_grad_(rank == 0)))
    # local_rows' backward all-gathers the gradient of its output: a rank whose computation after
    # replicate_rows ran in another dtype (same byte width: reinterpreted, a wrong gradient) or
    # width (gloo aborted the process) must raise the same error as its peers.
    all_rows, layout = ep.replicate_rows(x.clone().requires_grad_(True))
    mine = ep.local_rows(all_rows.to(torch.bfloat16) if rank == last else all_rows.half(), layout)
    out["local_rows_backward_dtype"] = _expect_error(lambda: mine.float().sum().backward())
    all_rows, layout = ep.replicate_rows(x.clone().requires_grad_(True))
    mine = ep.local_rows(all_rows[:, :4] if rank == last else all_rows, layout)
    out["local_rows_backward_width"] = _expect_error(lambda: mine.sum().backward())
    out["replicate_rows_operation"] = _expect_error(
        lambda: ep.replicate_rows(x) if rank == 0 else ep.dispatch(x, idx, e))
    # all_to_all: rank 1 expecting one row more from rank 0 than rank 0 sends it (gloo left it
    # uninitialised); a rank's own bad splits (it alone raised, its peers timed out).
    rows = torch.arange(world * 3.0).view(world, 3)
    expected = [1] * world if rank != 1 else [2] + [1] * (world - 1)
    out["all_to_all_splits"] = _expect_error(lambda: ep.all_to_all(rows, expected, [1] * world))
    out["all_to_all_arguments"] = _expect_error(lambda: ep.all_to_all(rows, [1] * world, [1] * (world + (rank == 0))))
    # Rows needing a gradient on rank 0 only: its backward (the reverse exchange) would wait for
    # the other ranks, which run none.
    out["all_to_all_requires_grad"] = _expect_error(
        lambda: ep.all_to_all(rows.clone().requires_grad_(rank == 0), [1] * world, [1] * world))
    # Each of the next cases on a group of its own with a short timeout: without their fix, a rank
    # went on alone while its peers waited (on the default group, for its whole timeout).
    def short_group():
        return dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=5))

    # The device type is agreed: NCCL refuses the CPU tensors of a rank among CUDA ones, in the rows'
    # exchange, on that rank alone (gloo took meta rows on the last rank without an error, leaving
    # rank 0 waiting). Meta tensors are a device type this machine has.
    meta_x = torch.empty(x.shape, device="meta") if rank == last else x
    out["replicate_rows_device"] = _expect_error(lambda: ep.replicate_rows(meta_x, group=short_group()))
    meta_rows = torch.empty(rows.shape, device="meta") if rank == last else rows
    out["all_to_all_device"] = _expect_error(lambda: ep.all_to_all(meta_rows, [1] * world, [1] * world,
                                                                   group=short_group()))
    # Meta tensors cannot pass dispatch's own checks (they read expert_idx), and combine's
    # expert_out must be on its handle's device: the last rank records its CPU tensors' device
    # type as meta's, as a rank on another device type would record its own.
    real_code = getattr(ep_module, "_device_code", None)
    forged = mock.patch.object(ep_module, "_device_code", create=True,
                               new=lambda t: real_code(torch.empty(0, device="meta")))
    with forged if rank == last else contextlib.nullcontext():
        out["dispatch_device"] = _expect_error(lambda: ep.dispatch(x, idx, e))
        out["combine_device"] = _expect_error(lambda: ep.combine(recv_x, handle))
    # A split size beyond int64 failed to enter the agreement message on its own rank (a
    # ValueError there, before the exchange its peers waited in).
    huge = [2**63 if rank == 0 else 1] + [1] * (world - 1)
    out["all_to_all_split_int64"] = _expect_error(lambda: ep.all_to_all(rows, huge, [1] * world,
                                                                        group=short_group()))
    # A sparse (or nested) tensor on the last rank, of the right shape and dtype: it passed every
    # local check and failed after the agreement on that rank alone (its peers timed out in the rows'
    # exchange or, for combine's scales, x1 and bias, returned y while it raised; found by an
    # adversarial review). Each on a short group of its own, as above.
    def on_last(t, convert=lambda t: t.to_sparse()):
        return convert(t) if rank == last else t

    out["dispatch_sparse_x"] = _expect_error(lambda: ep.dispatch(on_last(x), idx, e, group=short_group()))
    out["dispatch_sparse_expert_idx"] = _expect_error(lambda: ep.dispatch(x, on_last(idx), e, group=short_group()))
    for name in ("expert_out", "scales", "x1", "bias"):
        group = short_group()
        sparse_x, _, sparse_handle = ep.dispatch(x, idx, e, group=group)
        arguments = {"expert_out": sparse_x, "scales": scales, "x1": x, "bias": torch.ones(e, 8)}
        arguments[name] = on_last(arguments[name])
        out[f"combine_sparse_{name}"] = _expect_error(lambda: ep.combine(arguments.pop("expert_out"), sparse_handle,
                                                                         **arguments))
    out["replicate_rows_sparse"] = _expect_error(lambda: ep.replicate_rows(on_last(x), group=short_group()))
    out["all_to_all_sparse"] = _expect_error(lambda: ep.all_to_all(on_last(rows), [1] * world, [1] * world,
                                                                   group=short_group()))
    nested = lambda t: torch.nested.nested_tensor([t[:2], t[2:]])  # noqa: E731 - no sizes: its shape raises
    out["replicate_rows_nested"] = _expect_error(lambda: ep.replicate_rows(on_last(x, nested), group=short_group()))
    y = ep.combine(recv_x, handle, scales=scales)
    out["still_works"] = "ok" if y.shape == x.shape else f"wrong shape {list(y.shape)}"
    return out


def run_autograd_flags(rank: int, world: int) -> Dict[str, str]:
    """combine with x1 needing a gradient on rank 0 only: x1's gradient is grad_y on its own rank,
    no collective, so the call is valid (it once raised "whether the output requires grad must be
    the same on every rank" everywhere). name -> "ok" or what went wrong on this rank."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 8, generator=g)
    e = 2 * world
    idx = torch.randint(0, e, (5, 2), generator=g, dtype=torch.int32)
    scales = torch.rand(5, 2, generator=g)
    grad_y = torch.randn(5, 8, generator=g)
    recv_x, _, handle = ep.dispatch(x, idx, e)
    out: Dict[str, str] = {}

    def check(experts_train: bool):
        try:
            grads = []
            for x1_needs_grad in (rank == 0, True):  # the flag differing by rank, then the same everywhere
                x1 = torch.randn(5, 8, generator=torch.Generator().manual_seed(4)).requires_grad_(x1_needs_grad)
                expert_out = recv_x.clone().requires_grad_(experts_train)
                y = ep.combine(expert_out, handle, scales=scales, x1=x1)
                if y.requires_grad:  # the backward's collectives (experts_train) run on every rank
                    y.backward(grad_y)
                if x1_needs_grad and not bitwise_equal(x1.grad, grad_y):
                    return "x1's gradient is not grad_y"
                grads.append(expert_out.grad)
            if experts_train and not bitwise_equal(grads[0], grads[1]):
                return "expert_out's gradient depends on x1.requires_grad"
            # Still in step with the other ranks: one more exchange.
            rows, _ = ep.replicate_rows(torch.full((1, 2), float(rank)))
            return "ok" if bitwise_equal(rows, torch.arange(world, dtype=torch.float32).repeat_interleave(2)
                                         .view(world, 2)) else "the next exchange returned wrong rows"
        except Exception as error:  # noqa: BLE001 - reported per case
            return f"{type(error).__name__}: {error}"

    out["x1_only_here"] = check(experts_train=False)
    out["x1_only_here_experts_train"] = check(experts_train=True)
    return out


def run_timeouts(rank: int, world: int, timeout_s: float) -> Dict[str, str]:
    """Rank 1 does not take part: rank 0's dispatch (group a), then its combine (group b), must
    raise a RuntimeError naming the operation and the rank within the groups' timeout."""
    import datetime
    span = datetime.timedelta(seconds=timeout_s)
    group_a = dist.new_group(list(range(world)), timeout=span)
    group_b = dist.new_group(list(range(world)), timeout=span)
    x = torch.randn(4, 8)
    idx = torch.zeros(4, 1, dtype=torch.int32)
    out: Dict[str, str] = {}
    if rank == 0:
        out["dispatch"] = _raised(lambda: ep.dispatch(x, idx, 2 * world, group=group_a), RuntimeError)
    else:
        time.sleep(2.5 * timeout_s)
    dist.barrier()  # on the default group, whose timeout is long: both ranks go on to group b
    recv_x, _, handle = ep.dispatch(x, idx, 2 * world, group=group_b)
    if rank == 0:
        out["combine"] = _raised(lambda: ep.combine(recv_x, handle), RuntimeError)
    else:
        time.sleep(2.5 * timeout_s)
    return out


def run_subgroup_timeout(rank: int, world: int, timeout_s: float) -> str:
    """Global rank 3 does not take part in a dispatch on the subgroup [2, 3]: global rank 2 must
    raise a RuntimeError naming itself both ways (rank 0 of the subgroup alone names no process)."""
    import datetime
    span = datetime.timedelta(seconds=timeout_s)
    groups = [dist.new_group([0, 1], timeout=span), dist.new_group([2, 3], timeout=span)]  # every rank makes both
    if rank == 2:
        return _raised(lambda: ep.dispatch(torch.randn(4, 8), torch.zeros(4, 1, dtype=torch.int32), 2,
                                           group=groups[1]), RuntimeError)
    if rank == 3:
        time.sleep(2.5 * timeout_s)
    return "not taking part"


# ---- training the layer (examples/python/ep_moe.py) -----------------------------------------------------

def compare_training(rank: int, world: int, configs: List[dict]) -> Dict[str, str]:
    """Each ep_moe config trained on `world` ranks and, in this same process, on a group of one
    (the single-process layer on the global batch): losses, outputs and gradients bit for bit."""
    alone = [dist.new_group([r]) for r in range(world)][rank]  # every rank creates every group
    results = {}
    for cfg in configs:
        try:
            found = ep_moe.differences(cfg, ep_moe.train(cfg), ep_moe.train(cfg, group=alone), rank, world)
            results[cfg["name"]] = "ok" if not found else "differ: " + ", ".join(found)
        except Exception as error:  # noqa: BLE001
            results[cfg["name"]] = f"{type(error).__name__}: {error}"
    return results


# ---- DDP for the router (the non-deterministic path) -------------------------------------------------

def _full_gradient(p: torch.Tensor, world: int) -> torch.Tensor:
    """A parameter's gradient as a plain tensor: FSDP's sharded average gathered, times W."""
    return p.grad.full_tensor() * world if hasattr(p.grad, "full_tensor") else p.grad.clone()


def train_with_data_parallel(rank: int, world: int, spec: dict, wrapper: str, steps: int = 2) -> str:
    """deterministic=False: the router runs on this rank's tokens and DDP (summing hook) or FSDP
    (fully_shard, averaging, times W) completes its gradient. Compared with the single-process layer to
    rounding (not bit for bit: the router's gradient is a sum of per-rank parts), and the router's
    gradient identical on every rank."""
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel
    alone = [dist.new_group([r]) for r in range(world)][rank]
    tokens = spec["tokens"]
    lo, hi = sum(tokens[:rank]), sum(tokens[:rank + 1])
    n = sum(tokens)
    models = {}
    for name, group in (("ep", None), ("single", alone)):
        models[name] = ep.ExpertParallelMoE(spec["hidden"], spec["ffn"], spec["experts"], spec["top_k"],
                                            group=group, deterministic=name == "single", seed=spec["seed"])
    layer = models["ep"]
    if wrapper == "ddp":
        layer.router = DistributedDataParallel(layer.router)
        layer.router.register_comm_hook(None, ep.allreduce_sum_hook)
    else:  # FSDP averages (a divide factor of 1 needs PREMUL_SUM, which gloo lacks): times W below
        fully_shard(layer.router)
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    inputs = torch.randn(n, spec["hidden"], generator=g)
    target = torch.randn(n, spec["hidden"], generator=g)
    out: Dict[str, str] = {}
    for step in range(steps):
        grads = {}
        for name, model in models.items():
            model.zero_grad()
            if name == "ep":  # this rank's part of the global mean: sum / (N * H)
                y = model(inputs[lo:hi])
                loss = ((y - target[lo:hi]) ** 2).sum() / target.numel()
            else:
                y = model(inputs)
                loss = torch.nn.functional.mse_loss(y, target)
            loss.backward()
            grads[name] = {key.replace("module.", ""): _full_gradient(p, world) for key, p in model.named_parameters()}
        local = spec["experts"] // world
        mine = slice(rank * local, (rank + 1) * local)
        for key, grad in grads["ep"].items():
            want = grads["single"][key][mine] if key in ("w1", "w2") else grads["single"][key]
            if not torch.allclose(grad, want, rtol=1e-4, atol=1e-6):
                out[f"{key} step {step}"] = f"differs by {(grad - want).abs().max().item():.3g}"
        router = grads["ep"]["router.weight"]
        everyone = [torch.empty_like(router) for _ in range(world)]
        dist.all_gather(everyone, router)
        if not all(torch.equal(everyone[0], other) for other in everyone):
            out[f"router step {step}"] = "not the same on every rank"
        with torch.no_grad():
            for model in models.values():
                for p in model.parameters():
                    p -= 0.5 * p.grad * (world if hasattr(p.grad, "full_tensor") else 1)
    return "ok" if not out else "; ".join(f"{k}: {v}" for k, v in out.items())


def check_all_to_all(rank: int, world: int) -> str:
    """ep.all_to_all moves rows (any dtype, bit for bit) and sends gradients back the same way."""
    splits_out = [(rank + s) % 3 for s in range(world)]  # rows rank s sends me
    splits_in = [(d + rank) % 3 for d in range(world)]  # rows I send rank d
    rows = (torch.arange(sum(splits_in) * 3, dtype=torch.float32).view(-1, 3) + 100 * rank).to(torch.bfloat16)
    rows.requires_grad_()
    got = ep.all_to_all(rows, splits_out, splits_in)
    expected = []
    for s in range(world):
        start = sum((d + s) % 3 for d in range(rank))
        block = torch.arange(sum((d + s) % 3 for d in range(world)) * 3, dtype=torch.float32).view(-1, 3) + 100 * s
        expected.append(block[start:start + splits_out[s]])
    if not bitwise_equal(got.detach(), torch.cat(expected).to(torch.bfloat16)):
        return "forward rows differ"
    (grad,) = torch.autograd.grad(got, rows, got.detach() * 2)
    return "ok" if bitwise_equal(grad, rows.detach() * 2) else "gradient differs"


def check_second_derivatives(rank: int, world: int) -> str:
    """replicate_rows / local_rows and all_to_all under create_graph=True: the first and second
    derivatives of sum(g(x)^3), g = local_rows(replicate_rows(x)^2) or x's rows sent to rank 0,
    squared there and sent back, equal those of g = x^2 on this rank's rows alone (once, only the
    first derivative was differentiable, silently: the second missed terms)."""
    x = torch.arange(1.0, 4.0 + rank, dtype=torch.float64).view(-1, 1) / 3  # ranks hold different counts
    found = []
    for name, route in (("replicate", lambda v, f: ep.local_rows(*_replicated(f, v))),
                        ("all_to_all", lambda v, f: _round_trip(f, v, rank, world))):
        derivatives = []
        for path in (route, lambda v, f: f(v)):
            leaf = x.clone().requires_grad_()
            loss = (path(leaf, lambda t: t * t) ** 3).sum()
            (first,) = torch.autograd.grad(loss, leaf, create_graph=True)
            (second,) = torch.autograd.grad(first.sum(), leaf)
            derivatives.append((first.detach(), second))
        if not all(bitwise_equal(a, b) for a, b in zip(*derivatives)):
            found.append(name)
    return "ok" if not found else "differ: " + ", ".join(found)


def _replicated(f, rows):
    all_rows, layout = ep.replicate_rows(rows)
    return f(all_rows), layout


def _round_trip(f, rows, rank, world):
    """This rank's rows all sent to rank 0, f applied there, and sent back."""
    counts = ep.replicate_rows(rows.detach())[1].counts  # every rank's row count
    send = [rows.shape[0]] + [0] * (world - 1)
    receive = counts if rank == 0 else [0] * world
    return ep.all_to_all(f(ep.all_to_all(rows, receive, send)), send, receive)


def run_world(rank: int, world: int, plan: dict) -> dict:
    """One process of a test launch: every part of `plan` in order (keys: bitwise, training,
    mismatches (with autograd_flags), timeouts, data_parallel); returns {part: {name: result}}."""
    results: dict = {}
    if "bitwise" in plan:
        results["bitwise"] = run_cases(rank, world, plan["bitwise"])
        results["bitwise"]["all_to_all"] = check_all_to_all(rank, world)
        results["bitwise"]["second_derivatives"] = check_second_derivatives(rank, world)
    if "training" in plan:
        results["training"] = compare_training(rank, world, plan["training"])
    if plan.get("mismatches"):
        results["mismatches"] = run_mismatches(rank, world)
        results["autograd_flags"] = run_autograd_flags(rank, world)
    if "data_parallel" in plan:
        results["data_parallel"] = {wrapper: train_with_data_parallel(rank, world, plan["data_parallel"], wrapper)
                                    for wrapper in ("ddp", "fsdp")}
    if "timeouts" in plan:  # last: its groups are left broken
        results["timeouts"] = run_timeouts(rank, world, plan["timeouts"])
    if "subgroup_timeout" in plan:  # last: its group is left broken
        results["subgroup_timeout"] = run_subgroup_timeout(rank, world, plan["subgroup_timeout"])
    return results
