"""The torch_npu and Megatron ports on tensors that hold no values: meta tensors (shape inference,
deferred initialisation) and FakeTensorMode's fakes. Their data checks read index values on the
host, which such tensors do not have (`.item()` failed on every port that checks its indices); the
operators' fake functions give the shapes. Each port's outputs must have the shapes and dtypes of
the same call on CPU tensors. Under torch.func.vmap, whose batched tensors hold no values the host
can read either, a port refuses by name where its checks would read batched values; the others'
batches must equal a loop of calls, bit for bit."""
import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import moe_routing.torch_npu as torch_npu
from moe_routing.megatron import permute, unpermute

N, K, H, E = 4, 2, 8, 4


def _inputs(seed=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, H, generator=g)
    expert_idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(N)]).to(torch.int32)
    probs = torch.rand(N, K, generator=g)
    routing_map = torch.zeros(N, E, dtype=torch.bool).scatter_(1, expert_idx.long(), True)
    map_probs = torch.zeros(N, E).masked_scatter_(routing_map, probs)
    _, row_idx = torch_npu.npu_moe_token_permute(x, expert_idx)
    permuted, _, sorted_indices, _, _ = permute(x, routing_map, map_probs, N * K)
    column_row_idx = torch.arange(N * K, dtype=torch.int32).view(K, N).t().contiguous()
    _, _, pad_indices = torch_npu.npu_moe_token_permute_with_routing_map(x, routing_map, num_out_tokens=N * K,
                                                                         drop_and_pad=True)
    return dict(x=x, expert_idx=expert_idx, probs=probs, routing_map=routing_map, map_probs=map_probs,
                row_idx=row_idx, permuted=permuted, pad_indices=pad_indices, sorted_indices=sorted_indices,
                column_row_idx=column_row_idx,
                rows=torch.randn(N * K, H, generator=g), sorted_ids=torch.sort(expert_idx.view(-1)).values)


CALLS = {
    "npu_moe_init_routing": lambda t: torch_npu.npu_moe_init_routing(t["x"], t["column_row_idx"], t["expert_idx"], N),
    "npu_moe_init_routing_v2": lambda t: torch_npu.npu_moe_init_routing_v2(
        t["x"], t["expert_idx"], active_num=N * K, expert_num=E, expert_tokens_num_type=1,
        expert_tokens_num_flag=True),
    "npu_moe_finalize_routing": lambda t: torch_npu.npu_moe_finalize_routing(
        t["rows"], None, None, None, t["probs"], t["row_idx"], t["expert_idx"]),
    "npu_moe_token_permute": lambda t: torch_npu.npu_moe_token_permute(t["x"], t["expert_idx"]),
    "npu_moe_token_permute_cut": lambda t: torch_npu.npu_moe_token_permute(t["x"], t["expert_idx"], N * K - 3),
    "npu_moe_token_unpermute": lambda t: torch_npu.npu_moe_token_unpermute(t["rows"], t["row_idx"], t["probs"]),
    "npu_moe_token_unpermute_no_probs": lambda t: torch_npu.npu_moe_token_unpermute(t["rows"], t["row_idx"]),
    # Rows cut: the eager path with values skips the cut pairs' indices; without values, as compiled.
    "npu_moe_token_unpermute_no_probs_cut": lambda t: torch_npu.npu_moe_token_unpermute(t["rows"][:5], t["row_idx"]),
    "npu_moe_compute_expert_tokens": lambda t: torch_npu.npu_moe_compute_expert_tokens(t["sorted_ids"], E),
    "npu_moe_token_permute_with_routing_map": lambda t: torch_npu.npu_moe_token_permute_with_routing_map(
        t["x"], t["routing_map"], probs=t["map_probs"], num_out_tokens=N * K),
    "npu_moe_token_permute_with_routing_map_drop_and_pad": lambda t: torch_npu.npu_moe_token_permute_with_routing_map(
        t["x"], t["routing_map"], num_out_tokens=N * K, drop_and_pad=True),
    "npu_moe_token_unpermute_with_routing_map": lambda t: torch_npu.npu_moe_token_unpermute_with_routing_map(
        t["rows"], t["row_idx"], [N, H], probs=t["map_probs"], routing_map=t["routing_map"]),
    "npu_moe_token_unpermute_with_routing_map_drop_and_pad":
        lambda t: torch_npu.npu_moe_token_unpermute_with_routing_map(
        t["rows"], t["pad_indices"], [N, H], probs=t["map_probs"], routing_map=t["routing_map"], drop_and_pad=True),
    "megatron.permute": lambda t: permute(t["x"], t["routing_map"], t["map_probs"], N * K),
    "megatron.permute_batch_invariant": lambda t: permute(t["x"], t["routing_map"], None, N * K,
                                                          return_batch_invariant_inverse_map=True),
    "megatron.unpermute": lambda t: unpermute(t["permuted"], t["sorted_indices"], (N, H), t["map_probs"],
                                              t["routing_map"]),
}


def _described(outputs):
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    return [None if o is None else (tuple(o.shape), o.dtype) for o in outputs]


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_port_on_meta_tensors_gives_the_shapes_of_the_cpu_call(name):
    inputs = _inputs()
    expected = _described(CALLS[name](inputs))
    got = CALLS[name]({key: value.to("meta") for key, value in inputs.items()})
    assert _described(got) == expected
    assert all(o is None or o.is_meta for o in (got if isinstance(got, (tuple, list)) else (got,)))


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_port_under_fake_tensor_mode_gives_the_shapes_of_the_cpu_call(name):
    inputs = _inputs()
    expected = _described(CALLS[name](inputs))
    with FakeTensorMode() as mode:
        got = CALLS[name]({key: mode.from_tensor(value) for key, value in inputs.items()})
    assert _described(got) == expected


def test_values_are_still_checked_on_real_tensors():
    # The data checks still run where there are values: an index out of range is named.
    inputs = _inputs()
    bad = inputs["row_idx"].clone()
    bad[3] = N * K
    with pytest.raises(IndexError, match=r"npu_moe_token_unpermute: sorted_indices\[3\] must be in \[-1, 8\)"):
        torch_npu.npu_moe_token_unpermute(inputs["rows"], bad, inputs["probs"])


# The calls whose path reads no index values on the host: they batch under vmap.
VMAP_BATCHED = {"megatron.permute", "npu_moe_finalize_routing", "npu_moe_init_routing_v2",
                "npu_moe_token_permute_with_routing_map_drop_and_pad"}
REFUSED_UNDER_VMAP = r"^(\w+): torch\.func\.vmap over its index arguments is not supported"


def _present(outputs):
    return tuple(o for o in (outputs if isinstance(outputs, (tuple, list)) else (outputs,)) if o is not None)


@pytest.mark.filterwarnings("ignore:There is a performance drop")  # the operators' batching is a loop
@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_port_under_vmap_refuses_by_name_or_equals_a_loop_of_calls(name):
    # Under vmap a port whose data checks would read batched index values refuses the call in its own name
    # (they could neither read them nor be left out: a compiled graph's caveats would become silent wrong
    # rows); before, PyTorch's "data-dependent control flow" or in-place scatter errors. The rest batch, equal
    # to a loop of calls bit for bit.
    samples = [_inputs(seed) for seed in (3, 4, 5)]
    batched = {key: torch.stack([sample[key] for sample in samples]) for key in samples[0]}
    if name not in VMAP_BATCHED:
        with pytest.raises(NotImplementedError, match=REFUSED_UNDER_VMAP) as refused:
            torch.func.vmap(lambda t: _present(CALLS[name](t)))(batched)
        # In the port's own name (the calls' names are the port's, with a suffix for the variant).
        assert name.split(".")[-1].startswith(re.match(REFUSED_UNDER_VMAP, str(refused.value)).group(1))
        return
    got = torch.func.vmap(lambda t: _present(CALLS[name](t)))(batched)
    for b, sample in enumerate(samples):
        want = _present(CALLS[name](sample))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g[b].dtype == w.dtype and torch.equal(g[b], w), (name, b)


def test_a_port_under_vmap_refuses_also_where_its_checked_index_is_not_batched():
    # The index itself is one tensor for the whole batch, but the check compares it with rows computed from
    # the batched permuted tokens (a review found vmap's data-dependent error there when only the index's
    # batching decided). Nested in grad, the batched tensor is wrapped: refused as well.
    samples = [_inputs(seed) for seed in (3, 4)]
    rows = torch.stack([sample["permuted"] for sample in samples])
    t = samples[0]
    with pytest.raises(NotImplementedError, match=REFUSED_UNDER_VMAP.replace(r"(\w+)", "unpermute")):
        torch.func.vmap(lambda p: unpermute(p, t["sorted_indices"], (N, H), None, t["routing_map"]))(rows)
    with pytest.raises(NotImplementedError, match=REFUSED_UNDER_VMAP.replace(r"(\w+)", "npu_moe_token_permute")):
        torch.func.vmap(lambda i: torch.func.grad(lambda x: torch_npu.npu_moe_token_permute(x, i)[0].sum())(
            t["x"]))(torch.stack([s["expert_idx"] for s in samples]))
