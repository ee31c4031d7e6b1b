"""moe_routing.distributed across real processes: gloo on 127.0.0.1, the processes spawned here
(ep.run_local, bounded timeouts), one launch per world size running every scenario
(tests/python/ep_cases.py). Forward, every gradient and a few training steps of
ExpertParallelMoE must equal the single-device computation of the global batch bit for bit;
mismatched arguments must raise the same ValueError on every rank, and a rank that does not take
part must surface as a RuntimeError naming the operation and the rank."""
from __future__ import annotations

import functools
import os
import re
import types

import pytest
import torch

import ep_cases
from ep_cases import ep_moe
import moe_routing.distributed as ep
from moe_routing.distributed import _comm as comm_module
from moe_routing.distributed import _ep as ep_module
from moe_routing.distributed import _launch as launch_module
from ep_cases import case

TOKENS = {1: [9], 2: [7, 0], 4: [5, 0, 9, 2]}
FIRST_EMPTY = {2: [0, 9], 4: [0, 6, 3, 0]}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _bitwise_specs(world: int):
    tokens = TOKENS[world]
    specs = []
    for name, dtype in DTYPES.items():
        specs.append(case(f"{name}_dropless", tokens, dtype=dtype))
        specs.append(case(f"{name}_capacity", tokens, dtype=dtype, capacity=3))
    specs += [
        case("ascend_950_float16_capacity", tokens, dtype=torch.float16, capacity=2, numerics="ascend_950"),
        case("ascend_950_bfloat16", tokens, dtype=torch.bfloat16, numerics="ascend_950"),
        case("bfloat16_float32_scales", tokens, dtype=torch.bfloat16, scales="float32", capacity=4),
        case("no_scales_bias_x1", tokens, scales=None, bias=False, x1=False),
        case("x1_x2_no_bias", tokens, dtype=torch.float16, x2=True, bias=False),
        case("top3_h33", tokens, dtype=torch.float16, top_k=3, hidden=33, experts=4 * world),
        case("capacity_1", tokens, capacity=1),
        case("repeated_choices", tokens, dtype=torch.bfloat16, top_k=4, repeats=True),
        case("repeated_choices_capacity", tokens, top_k=4, repeats=True, capacity=2),
        case("capacity_everything", tokens, dtype=torch.bfloat16, capacity=sum(tokens)),
        # More experts than the first counts message holds (the continuation messages).
        case("many_experts", tokens, experts=448, top_k=3, capacity=2),
        # Gradients with create_graph=True (a PyTorch error on the staging copies once).
        case("create_graph", tokens, create_graph=True),
        case("create_graph_capacity", tokens, dtype=torch.bfloat16, capacity=2, create_graph=True),
    ]
    if world > 1:
        local = specs[0]["experts"] // world
        block = tuple(range(local, 2 * local))  # rank 1's experts: it receives nothing
        specs += [case("first_rank_empty", FIRST_EMPTY[world], dtype=torch.float16, capacity=3),
                  case("rank_receives_nothing", tokens, unused_experts=block),
                  case("rank_receives_nothing_capacity", tokens, dtype=torch.bfloat16, capacity=2,
                       unused_experts=block)]
    else:
        specs.append(case("empty_batch", [0]))
    return specs


def _training_configs(world: int):
    configs = []
    for name, dtype, capacity in (("float32", torch.float32, None), ("bfloat16", torch.bfloat16, None),
                                  ("float32_capacity", torch.float32, 3)):
        cfg = ep_moe.config(TOKENS[world], hidden=16, ffn=24, experts=max(4, 2 * world), capacity=capacity,
                            dtype=dtype, steps=3)
        cfg["name"] = name
        configs.append(cfg)
    return configs


def _plan(world: int) -> dict:
    plan = {"bitwise": _bitwise_specs(world), "training": _training_configs(world), "mismatches": world > 1}
    if world == 2:
        data_parallel = case("data_parallel", [6, 5], experts=4)
        data_parallel["ffn"] = 24
        plan["data_parallel"] = data_parallel
        plan["timeouts"] = 1.0
    if world == 4:
        plan["subgroup_timeout"] = 1.0
    return plan


@functools.lru_cache(maxsize=None)
def _launch(world: int):
    return ep.run_local(ep_cases.run_world, world, _plan(world), timeout=240, collective_timeout=60)


def _cases(part: str):
    return [(world, spec["name"]) for world in TOKENS for spec in _plan(world).get(part, [])]


@pytest.mark.parametrize("world,name", _cases("bitwise") + [(w, name) for w in TOKENS
                                                             for name in ("all_to_all", "second_derivatives")])
def test_dispatch_combine_bitwise(world, name):
    """recv_x (the single-device expanded_x rows of this rank's experts), tokens_per_local_expert,
    y and the gradients of x, scales, x1, x2, bias (the whole, global one) and the experts'
    parameters on every rank."""
    for rank, results in enumerate(_launch(world)):
        assert results["bitwise"][name] == "ok", f"world {world}, rank {rank}: {results['bitwise'][name]}"


@pytest.mark.parametrize("world,name", _cases("training"))
def test_training_bitwise(world, name):
    """Three SGD steps of ExpertParallelMoE (deterministic router) on `world` ranks: losses,
    outputs and every parameter's gradient equal the single-process layer's."""
    for rank, results in enumerate(_launch(world)):
        assert results["training"][name] == "ok", f"world {world}, rank {rank}: {results['training'][name]}"


# A sparse tensor of the right shape and dtype on the last rank (the cases in ep_cases.run_mismatches).
SPARSE = "must be a dense tensor (torch.strided layout), got a torch.sparse_coo tensor (on rank"

MISMATCHES = {
    "num_experts": "num_experts must be the same on every rank",
    "hidden": "the hidden size H (x.size(1)) must be the same on every rank",
    "top_k": "the top-k K (expert_idx.size(1)) must be the same on every rank",
    "dtype": "the dtype of x must be the same on every rank",
    "capacity": "expert_capacity must be the same on every rank",
    "numerics": "numerics must be the same on every rank",
    "expert_id": "expert_idx values must be in [0, num_experts)",
    "x_dtype": "x must be a 2-D float32, float16 or bfloat16 tensor",
    "x_dtype_everywhere": "x must be a 2-D float32, float16 or bfloat16 tensor [N, H], got 2-D float64 [5, 8] on cpu "
                          "(on rank 0, and on rank",
    "divisible": "num_experts must be divisible by the world size",
    "requires_grad": "x.requires_grad (with grad mode) must be the same on every rank",
    "expert_out_shape": "expert_out must be float32",
    "scales_presence": "whether scales is given, and its dtype must be the same on every rank",
    "scales_shape": "scales must be float32 [N, K]",
    "operation": "every rank must call the same operation at the same time",
    "handle": "the dispatch the handle comes from (the group's dispatches, counted from 1) must be the same on "
              "every rank",
    "replicate_rows": "replicate_rows: rows.dim() must be the same on every rank, got 2 (rank",
    "replicate_rows_dtype": "replicate_rows: the dtype of rows must be the same on every rank, got float32 (rank",
    "all_to_all_splits": "all_to_all: output_split_sizes must be what the ranks send, got rank 1 expecting 2 rows "
                         "from rank 0, which sends it 1",
    "all_to_all_arguments": "all_to_all: input_split_sizes must be ",
    "replicate_rows_operation": "every rank must call the same operation at the same time, got replicate_rows "
                                "(rank 0), dispatch (rank",
    "all_to_all_requires_grad": "all_to_all: rows.requires_grad (with grad mode) must be the same on every rank, "
                                "got True (rank 0), False (rank",
    "replicate_rows_requires_grad": "replicate_rows: rows.requires_grad (with grad mode) must be the same on every "
                                    "rank, got True (rank 0), False (rank",
    "local_rows_backward_dtype": "local_rows: the dtype of grad_output must be the same on every rank, got "
                                 "float16 (rank",
    "local_rows_backward_width": "local_rows: grad_output.size(1) must be the same on every rank, got 8 "
                                 "(rank",
    "replicate_rows_device": "replicate_rows: the device type of rows must be the same on every rank, got cpu (rank",
    "all_to_all_device": "all_to_all: the device type of rows must be the same on every rank, got cpu (rank",
    "dispatch_device": "dispatch: the device type of x must be the same on every rank, got cpu (rank",
    "combine_device": "combine: the device type of expert_out must be the same on every rank, got cpu (rank",
    "all_to_all_split_int64": "all_to_all: output_split_sizes must be at most 9223372036854775807 each (int64), "
                              "got 9223372036854775808 (on rank 0)",
    "dispatch_sparse_x": "dispatch: x " + SPARSE,
    "dispatch_sparse_expert_idx": "dispatch: expert_idx " + SPARSE,
    "combine_sparse_expert_out": "combine: expert_out " + SPARSE,
    "combine_sparse_scales": "combine: scales " + SPARSE,
    "combine_sparse_x1": "combine: x1 " + SPARSE,
    "combine_sparse_bias": "combine: bias " + SPARSE,
    "replicate_rows_sparse": "replicate_rows: rows " + SPARSE,
    "all_to_all_sparse": "all_to_all: rows " + SPARSE,
    "replicate_rows_nested": "replicate_rows: rows must be a dense tensor (torch.strided layout), got a nested tensor "
                             "(on rank",
}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", sorted(MISMATCHES))
def test_mismatch_raises_the_same_error_everywhere(world, name):
    messages = [results["mismatches"][name] for results in _launch(world)]
    assert all(m == messages[0] for m in messages), f"ranks raised different errors: {messages}"
    assert messages[0].startswith("ValueError: moe_routing.distributed"), messages[0]
    assert MISMATCHES[name] in messages[0], messages[0]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", ["x1_only_here", "x1_only_here_experts_train"])
def test_combine_with_x1_needing_grad_on_some_ranks(world, name):
    """x1's (and x2's) gradient is grad_y on its own rank, no collective: ranks may differ in
    x1.requires_grad; the gradients are those with every x1 needing one, the ranks stay in step."""
    for rank, results in enumerate(_launch(world)):
        assert results["autograd_flags"][name] == "ok", f"world {world}, rank {rank}: {results['autograd_flags'][name]}"


@pytest.mark.parametrize("world", [2, 4])
def test_group_usable_after_mismatches(world):
    assert all(results["mismatches"]["still_works"] == "ok" for results in _launch(world))


@pytest.mark.parametrize("operation", ["dispatch", "combine"])
def test_peer_not_taking_part_times_out(operation):
    """Rank 1 skips the call: rank 0 gets a RuntimeError naming the operation and itself, after
    the group's 1 s timeout, instead of hanging."""
    message = _launch(2)[0]["timeouts"][operation]
    assert message.startswith(f"RuntimeError: moe_routing.distributed.{operation}: rank 0 of 2"), message
    assert "timed out" in message.lower(), message
    seconds = float(message.rsplit("(after ", 1)[1].split(" s)")[0])
    assert seconds < 10, message


def test_timeout_in_a_subgroup_names_the_global_rank():
    """On the subgroup [2, 3] of 4 ranks, global rank 2 is rank 0 of 2: the error says both."""
    message = _launch(4)[2]["subgroup_timeout"]
    assert message.startswith("RuntimeError: moe_routing.distributed.dispatch: rank 0 of 2 (global rank 2): the "
                              "agreement and counts exchange (all_gather) failed"), message
    assert "timed out" in message.lower(), message


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
def test_router_under_data_parallel(wrapper):
    """deterministic=False with the router in DDP (summing hook) or FSDP (fully_shard; its average
    times W): gradients agree with the single-process layer to rounding and the router's
    is the same on every rank."""
    for rank, results in enumerate(_launch(2)):
        assert results["data_parallel"][wrapper] == "ok", f"rank {rank}: {results['data_parallel'][wrapper]}"


class _SecondStartFails:
    """A spawn context whose second Process.start() raises, as when the system refuses a process."""

    def __init__(self):
        self.spawn = torch.multiprocessing.get_context("spawn")
        self.processes = []

    def Queue(self):
        return self.spawn.Queue()

    def Process(self, *args, **kwargs):
        process = self.spawn.Process(*args, **kwargs)
        self.processes.append(process)
        if len(self.processes) == 2:
            def refuse():
                raise OSError("cannot start rank 1")
            process.start = refuse
        return process


def test_a_process_that_cannot_start_stops_the_started_ones(monkeypatch):
    """run_local re-raises the start's error after terminating and reaping rank 0 (which would
    otherwise wait at the rendezvous for ranks that never come), and starts no further rank."""
    context = _SecondStartFails()
    monkeypatch.setattr(launch_module, "mp", types.SimpleNamespace(get_context=lambda method: context))
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    with pytest.raises(OSError, match="cannot start rank 1"):
        ep.run_local(ep_cases.run_world, 3, {}, timeout=60)
    first, _, third = context.processes
    assert first.pid is not None and not first.is_alive() and first.exitcode is not None
    assert third.pid is None
    assert "GLOO_SOCKET_IFNAME" not in os.environ


@pytest.mark.parametrize("spec", [case("dropless", [7]), case("capacity", [7], capacity=2, dtype=torch.bfloat16)],
                         ids=lambda s: s["name"])
def test_world_of_one_without_torch_distributed(spec):
    """Without an initialised process group dispatch / combine run as a world of one."""
    assert not torch.distributed.is_initialized()
    assert ep_cases.compare(spec, 0, 1) == "ok"


@pytest.mark.parametrize("arguments,message", [
    (dict(num_experts=0), "dispatch: num_experts must be >= 1, got 0"),
    (dict(num_experts=4.0), "dispatch: num_experts must be an int, got 4.0"),
    (dict(num_experts=True), "dispatch: num_experts must be an int, got True"),
    # check_int took a complex tensor as int() does (2.5+0j as 2).
    (dict(num_experts=torch.tensor(2.5 + 0j)),
     "dispatch: num_experts must be an int or a 0-dim integer tensor, got a 0-D complex64 tensor"),
    (dict(expert_capacity=0), "dispatch: expert_capacity must be >= 1, got 0"),
    (dict(numerics="a3"), 'dispatch: numerics must be "atlas_a2" or "ascend_950", got "a3"'),
    # Unhashable: once a TypeError on this rank alone, before the exchange (its peers waited).
    (dict(numerics=["atlas_a2"]), 'dispatch: numerics must be "atlas_a2" or "ascend_950", got "[\'atlas_a2\']"'),
    (dict(combine_numerics="a3"), 'combine: numerics must be "atlas_a2" or "ascend_950", got "a3"'),
    (dict(combine_numerics=["a3"]), 'combine: numerics must be "atlas_a2" or "ascend_950", got "[\'a3\']"'),
], ids=["num_experts_0", "num_experts_float", "num_experts_bool", "num_experts_complex", "capacity_0",
        "dispatch_numerics", "dispatch_numerics_list", "combine_numerics", "combine_numerics_list"])
def test_bad_arguments_world_of_one(arguments, message):
    """The operators' shared argument checks (an int, not a float or a bool; the numerics names),
    named moe_routing.distributed.dispatch / combine."""
    x, idx = torch.randn(3, 4), torch.tensor([[0], [1], [0]], dtype=torch.int32)
    dispatch_arguments = {"num_experts": 2, **arguments}
    combine_numerics = dispatch_arguments.pop("combine_numerics", "atlas_a2")
    with pytest.raises(ValueError, match=re.escape(f"moe_routing.distributed.{message} (on rank 0)")):
        recv_x, _, handle = ep.dispatch(x, idx, **dispatch_arguments)
        ep.combine(recv_x, handle, numerics=combine_numerics)


@pytest.mark.parametrize("arguments,name", [(dict(num_experts=True), "num_experts"),
                                            (dict(num_experts=2, expert_capacity=True), "expert_capacity")])
def test_a_bool_for_an_int_under_torch_compile_world_of_one(arguments, name):
    """Under torch.compile (graph breaks allowed: dispatch is eager-only, docs/distributed.md) a bool for an
    int is still refused: the check is check_int's, which runs compiled or not (the single-device operators
    once skipped theirs there)."""
    x, idx = torch.randn(3, 4), torch.tensor([[0], [1], [0]], dtype=torch.int32)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, idx: ep.dispatch(x, idx, **arguments)[0], backend="eager")
    with pytest.raises(ValueError, match=re.escape(f"moe_routing.distributed.dispatch: {name} must be an int, got "
                                                   f"True (on rank 0)")):
        compiled(x, idx)


def test_int32_limits_are_agreed_world_of_one():
    """The single-device int32 limits are dispatch's checks (agreed: the same ValueError on every
    rank); an expert_capacity of 2**63 once overflowed the int64 agreement message on its own rank
    (a RuntimeError there while the peers waited) and 2**40 reached torch.full (found by an
    adversarial review)."""
    x, idx = torch.randn(3, 4), torch.tensor([[0], [1], [0]], dtype=torch.int32)
    prefix = "moe_routing.distributed.dispatch: "
    for capacity, shown in ((2**40, "2 * 1099511627776"), (2**63, "2 * 9223372036854775808")):
        with pytest.raises(ValueError, match=re.escape(
                prefix + "num_experts * expert_capacity must be at most 2147483647 (int32 row indices, as "
                f"single-device drop-pad), got {shown} (on rank 0)")):
            ep.dispatch(x, idx, 2, expert_capacity=capacity)
    # num_experts beyond int32 once reached every rank's E-sized count buffers (2**33 experts: 64 GiB
    # each; found by an adversarial review); 2**62 failed in torch's own words.
    for experts in (2**33, 2**62):
        with pytest.raises(ValueError, match=re.escape(
                prefix + f"num_experts must be at most 2147483647 (int32 expert ids), got {experts} (on rank 0)")):
            ep.dispatch(x, idx, experts)
    # N * K beyond int32 (stride-0 views: no memory), refused before any reduction over the ids.
    big_x = torch.zeros(1, 4).expand(2**30 + 1, 4)
    big_idx = torch.zeros(1, 2, dtype=torch.int32).expand(2**30 + 1, 2)
    with pytest.raises(ValueError, match=re.escape(
            prefix + "expert_idx must have at most 2147483647 elements (N * K: int32 row indices), got "
            "1073741825 * 2 (on rank 0)")):
        ep.dispatch(big_x, big_idx, 2)


def test_rows_without_columns_are_refused_world_of_one():
    """x [N, 0] once passed dispatch and failed in combine with PyTorch's view error (found by an
    adversarial review)."""
    with pytest.raises(ValueError, match=re.escape("moe_routing.distributed.dispatch: x must have at least one "
                                                   "column (H >= 1), got 2-D float32 [3, 0] on cpu (on rank 0)")):
        ep.dispatch(torch.zeros(3, 0), torch.tensor([[0], [1], [0]], dtype=torch.int32), 2)


def test_expert_idx_changed_after_dispatch_does_not_change_combine_world_of_one():
    """The handle keeps its own copy of expert_idx: combine's bias rows come from the ids that were
    dispatched, as the backward's do (it kept the caller's tensor, so an in-place change between
    dispatch and combine changed y but not its gradient; found by an adversarial review)."""
    g = torch.Generator().manual_seed(3)
    x, bias = torch.randn(5, 4, generator=g), torch.randn(4, 4, generator=g)
    idx = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2], [0, 2]], dtype=torch.int32)
    recv_x, _, handle = ep.dispatch(x, idx.clone(), 4)
    expected = ep.combine(recv_x, handle, bias=bias)
    moved = idx.clone()
    recv_x, _, handle = ep.dispatch(x, moved, 4)
    moved.copy_(moved.flip(0))  # other in-range ids, in place
    assert torch.equal(ep.combine(recv_x, handle, bias=bias), expected)


def test_combine_backward_leaves_expert_out_alone_where_scales_need_no_gradient_world_of_one():
    """expert_out is read by the backward only for scales' gradient; kept whatever was wanted, it made
    the backward refuse it changed in place after the combine (PyTorch's "modified by an inplace
    operation"), where the gradient of x never reads it."""
    g = torch.Generator().manual_seed(4)
    x, scales = torch.randn(5, 4, generator=g), torch.rand(5, 2, generator=g)
    idx = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2], [0, 2]], dtype=torch.int32)

    def grad_of_x(change):
        leaf = x.clone().requires_grad_()
        recv_x, _, handle = ep.dispatch(leaf, idx, 4)
        expert_out = recv_x * 2
        y = ep.combine(expert_out, handle, scales=scales)
        if change:
            expert_out.add_(1)
        y.backward(torch.arange(y.numel(), dtype=y.dtype).view_as(y))
        return leaf.grad

    assert torch.equal(grad_of_x(True), grad_of_x(False))
    recv_x, _, handle = ep.dispatch(x.clone().requires_grad_(), idx, 4)
    expert_out = recv_x * 2
    y = ep.combine(expert_out, handle, scales=scales.clone().requires_grad_())
    expert_out.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):  # scales' gradient reads it
        y.sum().backward()


def test_all_to_all_splits_world_of_one():
    """Splits may be any ints (here 0-dim tensors) and are checked once converted: one per rank,
    none negative, the input splits summing to the rows."""
    rows = torch.arange(6.0).view(3, 2).requires_grad_()
    out = ep.all_to_all(rows, [torch.tensor(3)], [torch.tensor(3)])
    out.backward(torch.ones_like(out))
    assert torch.equal(out, rows) and torch.equal(rows.grad, torch.ones_like(rows))
    prefix = "moe_routing.distributed.all_to_all: "
    with pytest.raises(ValueError, match=re.escape(prefix + "output_split_sizes must be 1 non-negative ints "
                                                   "(one per rank), got [3, 0]")):
        ep.all_to_all(rows, [3, 0], [3])
    with pytest.raises(ValueError, match=re.escape(prefix + "input_split_sizes must be 1 non-negative ints "
                                                   "(one per rank), got [-1]")):
        ep.all_to_all(rows, [3], [torch.tensor(-1)])
    with pytest.raises(ValueError, match=re.escape(prefix + "sum(input_split_sizes) must equal rows.size(0) (3), "
                                                   "got 2")):
        ep.all_to_all(rows, [3], [2])
    # Floats, bools and strings were converted by int() (3.7 -> 3, True -> 1, "3" -> 3): refused now
    # (found by an adversarial review). So are complex tensors, which check_int took as int() does (2.5+0j -> 2)
    # or met with int()'s RuntimeError (2+1j), on this rank alone.
    for bad in ([3.7], [True], ["3"], [torch.tensor(3.5 + 0j)], [torch.tensor(3 + 1j)]):
        with pytest.raises(ValueError, match=re.escape(prefix + "output_split_sizes must be 1 non-negative ints "
                                                       f"(one per rank), got {bad!r}")):
            ep.all_to_all(rows, bad, [3])
    # Beyond int64 a split size failed to enter the agreement message, on its own rank, before the
    # exchange its peers waited in: now it is the agreement's error ("(on rank 0)").
    with pytest.raises(ValueError, match=re.escape(prefix + "output_split_sizes must be at most 9223372036854775807 "
                                                   "each (int64), got 9223372036854775808 (on rank 0)")):
        ep.all_to_all(rows, [2**63], [3])


@pytest.mark.parametrize("handle", [None, (1, 2), "handle", ep.DispatchHandle()],
                         ids=["none", "tuple", "str", "handle_not_from_dispatch"])
def test_combine_refuses_a_non_handle_before_any_collective(handle, monkeypatch):
    """Without a handle there is no group to agree on: combine once exchanged on the default group
    instead (in a subgroup its peers waited in theirs, and it in its own, until both timed out).
    A TypeError now, on this rank alone, before any collective."""
    def no_collective(*args, **kwargs):
        raise AssertionError("combine attempted a collective")

    monkeypatch.setattr(comm_module.Comm, "all_gather_fixed", no_collective)
    monkeypatch.setattr(comm_module.Comm, "all_to_all_rows", no_collective)
    got = type(handle).__name__ + (" (not made by dispatch)" if isinstance(handle, ep.DispatchHandle) else "")
    with pytest.raises(TypeError, match=re.escape("moe_routing.distributed.combine: handle must be the handle "
                                                  f"returned by dispatch, got {got}")):
        ep.combine(torch.zeros(3, 4), handle)


@pytest.mark.parametrize("op,argument", [("dispatch", "x"), ("combine", "expert_out"), ("replicate_rows", "rows"),
                                         ("all_to_all", "rows")])
def test_device_type_is_agreed_world_of_one(op, argument, monkeypatch):
    """A peer whose tensors are CUDA ones (its agreement record forged: this rank's, but for the
    device type): every rank raises, naming the argument and both device types. The device type
    was once not agreed: a rank with CPU tensors among CUDA ones met NCCL's error alone, in the rows'
    exchange, while its peers waited there."""
    x, idx = torch.randn(3, 4), torch.tensor([[0], [1], [0]], dtype=torch.int32)
    recv_x, _, handle = ep.dispatch(x, idx, 2)
    calls = {"dispatch": lambda: ep.dispatch(x, idx, 2), "combine": lambda: ep.combine(recv_x, handle),
             "replicate_rows": lambda: ep.replicate_rows(x), "all_to_all": lambda: ep.all_to_all(x, [3], [3])}
    exchange = comm_module.Comm.all_gather_fixed

    def with_a_cuda_peer(self, message, step):
        table = exchange(self, message, step)
        peer = table[0].clone()
        peer[ep_module._F_DEVICE] = ep_module._device_code(types.SimpleNamespace(device=torch.device("cuda")))
        return torch.cat([table, peer.unsqueeze(0)])

    monkeypatch.setattr(comm_module.Comm, "all_gather_fixed", with_a_cuda_peer)
    with pytest.raises(ValueError, match=re.escape(f"moe_routing.distributed.{op}: the device type of {argument} must "
                                                   "be the same on every rank, got cpu (rank 0), cuda (rank 1)")):
        calls[op]()
