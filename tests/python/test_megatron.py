"""moe_routing.megatron against plain-PyTorch transcriptions of Megatron-Core's permute / unpermute
(main, unfused path, and its batch-invariant unpermute).

What is compared, and why:
* permute moves data only (a stable sort, gathers): permuted_input, permuted_probs, sorted_indices
  and the probs' gradient equal the transcription's bit for bit, for every dtype.
* unpermute is a sum. Megatron's unfused formula multiplies in promote(tokens, probs) and adds with
  index_add_ / scatter_add_, whose order PyTorch does not document; the transcription below fixes
  that order to increasing permuted row (what index_add_ does on the CPU), which for each token is
  increasing expert id - moe_routing's documented order. So:
  - whenever promote(tokens, probs) is float32 (float32 probs, or float32 tokens): Megatron's
    promotion is then exactly our arithmetic, equal bit for bit to the transcription as written;
  - 16-bit probs or none (Megatron multiplies and adds in 16 bits; we in float32 by design): equal
    bit for bit to the transcription evaluated on float32-widened operands, and close to the 16-bit
    one;
  - Megatron's batch-invariant unpermute (float32, +0, slots in increasing expert order, one
    narrowing) on one expert-parallel rank: equal bit for bit for every dtype.
* Gradients: the tokens' gradient of permute is the same ordered float32 sum; unpermute's
  gradient of the permuted tokens is one float32 product per element (bit for bit against
  Megatron's autograd when its arithmetic is float32); the probs' gradient of unpermute is a sum
  over H in moe_finalize_routing_grad's ascend_950 order (bit for bit against that order's
  statement, close to Megatron's autograd, whose reduction order is PyTorch's).
"""
import inspect
import re

import numpy as np
import pytest
import torch

from moe_routing.megatron import permute, unpermute
from compile_errors import (NON_INT_TENSOR_IDS, NON_INT_TENSORS, assert_compiled_raises_value_error,
                            non_int_tensor_message)
from finalize_reference import grad_scales_sum
from reference import assert_bitwise_equal, random_values

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_REQUIRED = inspect.Parameter.empty


def canonical_nan(t):
    return torch.where(torch.isnan(t), torch.tensor(float("nan"), dtype=t.dtype), t)


def assert_same(expected, got, what=""):
    """Bit for bit, every NaN counted as the canonical one."""
    assert_bitwise_equal(canonical_nan(expected), canonical_nan(got), what)


# ---- routing maps ----------------------------------------------------------------------------

def topk_routing(gen, n, e, k, probs_dtype=torch.float32):
    scores = torch.rand(n, e, generator=gen)
    top = scores.topk(k, dim=1).indices
    routing_map = torch.zeros(n, e, dtype=torch.bool).scatter(1, top, True)
    probs = torch.where(routing_map, torch.softmax(scores, dim=1), 0.0).to(probs_dtype)
    return routing_map, probs


def capacity_routing(gen, n, e, capacity, probs_dtype=torch.float32):
    """Every expert keeps its `capacity` best tokens (apply_router_token_dropping's pad_to_capacity
    result): each column has exactly `capacity` Trues, rows vary."""
    scores = torch.rand(n, e, generator=gen)
    top = scores.topk(capacity, dim=0).indices
    routing_map = torch.zeros(n, e, dtype=torch.bool).scatter(0, top, True)
    probs = torch.where(routing_map, scores, 0.0).to(probs_dtype)
    return routing_map, probs


# ---- the transcriptions ----------------------------------------------------------------------

def megatron_permute(tokens, routing_map, probs=None, num_out_tokens=None, drop_and_pad=False):
    """Megatron-Core main, moe_utils.permute, unfused: (permuted_input, permuted_probs, sorted_indices)."""
    n, e = routing_map.shape
    if drop_and_pad and num_out_tokens is not None:
        capacity = num_out_tokens // e
        # Per expert (a row of the transposed map, as int8), a stable descending argsort over the
        # tokens: routed ones first; the first `capacity` are kept.
        per_expert = torch.argsort(routing_map.to(torch.int8).T, dim=1, descending=True, stable=True)
        token_ids = per_expert[:, :capacity].reshape(-1)
        flat = (torch.arange(e).repeat_interleave(capacity) * n + token_ids)
    else:
        # Flat positions e*N + n of the transposed map, Trues first (stable), first num_out_tokens.
        flat = torch.argsort(routing_map.bool().T.reshape(-1), descending=True, stable=True)[:num_out_tokens]
        token_ids = flat % n
    permuted_probs = None if probs is None else probs.T.reshape(-1)[flat]
    return tokens.index_select(0, token_ids), permuted_probs, token_ids


def ordered_index_add(rows_out, index, values):
    """out = zeros; out[index[d]] += values[d] for d = 0, 1, ... in order (index_add_'s CPU order)."""
    out = torch.zeros(rows_out, values.shape[1], dtype=values.dtype)
    for d in range(index.numel()):
        out[index[d]] = out[index[d]] + values[d]
    return out


def megatron_unpermute(permuted, sorted_indices, restore_shape, probs=None, routing_map=None, drop_and_pad=False,
                       widen=False):
    """Megatron-Core main, moe_utils.unpermute, unfused, the scatter's order fixed to increasing row.
    widen=True evaluates it on float32-widened operands."""
    dtype = permuted.dtype
    if widen:
        permuted = permuted.float()
        probs = None if probs is None else probs.float()
    x = permuted
    if probs is not None:
        n, e = routing_map.shape
        if drop_and_pad:
            capacity = sorted_indices.numel() // e
            weights = probs.T.reshape(-1)[torch.arange(e).repeat_interleave(capacity) * n + sorted_indices]
        else:
            weights = probs.T[routing_map.T]  # expert-major, token-ascending, as masked_select
        x = permuted * weights.unsqueeze(-1)  # PyTorch's type promotion
    return ordered_index_add(restore_shape[0], sorted_indices, x).to(dtype)


def expert_order(routing_map, num_out_tokens, drop_and_pad):
    """The permuted rows in increasing (expert, token) order: moe_routing's summation order. It is
    the rows' own order except when dropless rows past the routed pairs (unrouted pairs, listed
    after every routed one) exist."""
    if drop_and_pad:
        return torch.arange(num_out_tokens // routing_map.shape[1] * routing_map.shape[1])
    flat = torch.argsort(routing_map.bool().T.reshape(-1), descending=True, stable=True)[:num_out_tokens]
    return torch.argsort(flat, stable=True)


def megatron_inverse_map(routing_map, flat_pairs, num_out_tokens):
    """Megatron's batch-invariant inverse map [2, N, topk]: for token n and slot s (its routed
    experts in increasing id) the permuted row and the expert."""
    n, e = routing_map.shape
    topk = num_out_tokens // n
    experts, tokens = flat_pairs // n, flat_pairs % n
    slot_of = routing_map.long().cumsum(1) - 1
    rows = torch.full((n, topk), -1, dtype=torch.long)
    expert_ids = torch.full((n, topk), -1, dtype=torch.long)
    for d in range(flat_pairs.numel()):
        t, x = int(tokens[d]), int(experts[d])
        rows[t, slot_of[t, x]] = d
        expert_ids[t, slot_of[t, x]] = x
    return torch.stack((rows, expert_ids))


def megatron_batch_invariant_unpermute(permuted, restore_shape, probs, inverse_map):
    """Megatron's batch_invariant.unpermute on one expert-parallel rank: float32 partial sum from
    +0 over the slots in order (invalid slots add +0), added to a float32 zero, one narrowing."""
    rows, experts = inverse_map
    partial = torch.zeros(restore_shape)
    for s in range(rows.shape[1]):
        valid = (rows[:, s] >= 0) & (experts[:, s] >= 0)
        chunk = permuted.index_select(0, rows[:, s].clamp_min(0)).float()
        if probs is not None:
            chunk = chunk * probs.gather(1, experts[:, s].clamp_min(0).unsqueeze(1)).float()
        partial = partial + torch.where(valid.unsqueeze(1), chunk, 0.0)
    return (torch.zeros(restore_shape) + partial).to(permuted.dtype)


# ---- signatures ------------------------------------------------------------------------------

MEGATRON_PERMUTE = [("tokens", _REQUIRED), ("routing_map", _REQUIRED), ("probs", None), ("num_out_tokens", None),
                    ("fused", False), ("drop_and_pad", False), ("tokens_per_expert", None), ("align_size", 0),
                    ("return_batch_invariant_inverse_map", False)]
MEGATRON_UNPERMUTE = [("permuted_tokens", _REQUIRED), ("sorted_indices", _REQUIRED), ("restore_shape", _REQUIRED),
                      ("probs", None), ("routing_map", None), ("fused", False), ("drop_and_pad", False),
                      ("pad_offsets", None), ("batch_invariant_inverse_map", None)]


@pytest.mark.parametrize("function,theirs", [(permute, MEGATRON_PERMUTE), (unpermute, MEGATRON_UNPERMUTE)])
def test_signatures_are_megatron_main_s(function, theirs):
    params = list(inspect.signature(function).parameters.values())
    assert [(p.name, p.default) for p in params] == theirs
    assert all(p.kind == p.POSITIONAL_OR_KEYWORD for p in params)


# ---- permute ---------------------------------------------------------------------------------

PERMUTE_CASES = [  # (routing, k or capacity, num_out_tokens as a function of the map, drop_and_pad)
    ("topk", 2, lambda m: m.numel() // m.shape[1] * 2, False),  # dropless: N * topk
    ("topk", 3, lambda m: int(m.sum()) - 4, False),  # fewer rows than routed pairs: the last experts' tail is cut
    ("topk", 2, lambda m: int(m.sum()) + 5, False),  # more: unrouted (expert, token) pairs follow
    ("capacity", 3, lambda m: 3 * m.shape[1], True),  # pad_to_capacity: every column has capacity Trues
    ("topk", 2, lambda m: 4 * m.shape[1], True),  # capacity 4: short columns padded with unrouted tokens
    ("topk", 2, lambda m: 1 * m.shape[1], True),  # capacity 1: the rest dropped
]


def make_case(case, dtype, probs_dtype=torch.float32, seed=0):
    routing, size, rows_of, drop_and_pad = PERMUTE_CASES[case]
    gen = torch.Generator().manual_seed(seed * 10 + case)
    n, e, h = 9, 5, 6
    make = topk_routing if routing == "topk" else capacity_routing
    routing_map, probs = make(gen, n, e, size, probs_dtype)
    tokens = random_values((n, h), dtype, gen)
    return tokens, routing_map, probs, rows_of(routing_map), drop_and_pad


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", range(len(PERMUTE_CASES)))
def test_permute_equals_megatron(case, dtype):
    tokens, routing_map, probs, num_out_tokens, drop_and_pad = make_case(case, dtype, probs_dtype=dtype)
    tokens_per_expert = routing_map.sum(0)
    got = permute(tokens, routing_map, probs, num_out_tokens, drop_and_pad=drop_and_pad,
                  tokens_per_expert=tokens_per_expert)
    want = megatron_permute(tokens, routing_map, probs, num_out_tokens, drop_and_pad)
    assert len(got) == 5 and got[3] is None and got[4] is tokens_per_expert
    assert_bitwise_equal(want[0], got[0], "permuted_input")
    assert_bitwise_equal(want[1], got[1], "permuted_probs")
    assert got[2].dtype == torch.int64 and torch.equal(want[2], got[2]), "sorted_indices"
    no_probs = permute(tokens, routing_map.to(torch.int8), None, torch.tensor(num_out_tokens),
                       fused=True, drop_and_pad=drop_and_pad)  # an int map, a 0-dim count, fused ignored
    assert no_probs[1] is None
    assert_bitwise_equal(want[0], no_probs[0])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", range(len(PERMUTE_CASES)))
def test_permute_gradients(case, dtype):
    tokens, routing_map, probs, num_out_tokens, drop_and_pad = make_case(case, dtype, seed=1)
    tokens.requires_grad_(True)
    probs.requires_grad_(True)
    permuted, permuted_probs, sorted_indices, _, _ = permute(tokens, routing_map, probs, num_out_tokens,
                                                             drop_and_pad=drop_and_pad)
    gen = torch.Generator().manual_seed(case)
    grad_rows, grad_probs = random_values(permuted.shape, dtype, gen), torch.rand(permuted_probs.shape, generator=gen)
    torch.autograd.backward([permuted, permuted_probs], [grad_rows, grad_probs])
    # tokens: each token's rows added in float32 from +0 in increasing expert order, one narrowing.
    order = expert_order(routing_map, num_out_tokens, drop_and_pad)
    want_tokens = ordered_index_add(tokens.shape[0], sorted_indices[order], grad_rows.float()[order]).to(dtype)
    assert_bitwise_equal(want_tokens, tokens.grad, "grad_tokens")
    # probs: Megatron's own autograd (a scatter of each row's gradient to its (token, expert)).
    probs_m = probs.detach().clone().requires_grad_(True)
    megatron_permute(tokens.detach(), routing_map, probs_m, num_out_tokens, drop_and_pad)[1].backward(grad_probs)
    assert_bitwise_equal(probs_m.grad, probs.grad, "grad_probs")
    if dtype == torch.float32 and case != 2:  # Megatron's index_select backward adds in the same order here
        tokens_m = tokens.detach().clone().requires_grad_(True)
        megatron_permute(tokens_m, routing_map, None, num_out_tokens, drop_and_pad)[0].backward(grad_rows)
        assert_bitwise_equal(tokens_m.grad, tokens.grad, "grad_tokens vs Megatron")


def test_permute_worked_example():
    # N = 3 tokens, E = 3 experts; token 0 -> {0, 2}, token 1 -> {1}, token 2 -> {0, 1}.
    routing_map = torch.tensor([[1, 0, 1], [0, 1, 0], [1, 1, 0]], dtype=torch.bool)
    tokens = torch.tensor([[10.0], [20.0], [30.0]])
    probs = torch.tensor([[0.6, 0, 0.4], [0, 1.0, 0], [0.5, 0.5, 0]])
    permuted, permuted_probs, sorted_indices, _, _ = permute(tokens, routing_map, probs, 5)
    assert sorted_indices.tolist() == [0, 2, 1, 2, 0]  # expert 0: tokens 0, 2; expert 1: 1, 2; expert 2: 0
    assert permuted.view(-1).tolist() == [10, 30, 20, 30, 10]
    assert permuted_probs.tolist() == pytest.approx([0.6, 0.5, 1.0, 0.5, 0.4])
    out = unpermute(permuted * 2, sorted_indices, tokens.shape, probs, routing_map)
    assert out.view(-1).tolist() == pytest.approx([20.0, 40.0, 60.0])


# ---- unpermute -------------------------------------------------------------------------------

UNPERMUTE_DTYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16),
                    (torch.float16, torch.float16), (torch.float16, torch.float32), (torch.float32, torch.bfloat16)]


@pytest.mark.parametrize("dtype,probs_dtype", UNPERMUTE_DTYPES)
@pytest.mark.parametrize("case", [0, 3, 4, 5])  # every case where Megatron's unpermute takes probs
def test_unpermute_equals_megatron(case, dtype, probs_dtype):
    tokens, routing_map, probs, num_out_tokens, drop_and_pad = make_case(case, dtype, probs_dtype, seed=2)
    permuted, _, sorted_indices, _, _ = permute(tokens, routing_map, probs, num_out_tokens, drop_and_pad=drop_and_pad)
    gen = torch.Generator().manual_seed(case)
    expert_out = random_values(permuted.shape, dtype, gen)  # the experts' outputs
    for weights in (probs, None):
        got = unpermute(expert_out, sorted_indices, tokens.shape, weights, routing_map, drop_and_pad=drop_and_pad)
        float32_math = weights is not None and torch.promote_types(dtype, probs_dtype) == torch.float32
        want = megatron_unpermute(expert_out, sorted_indices, tokens.shape, weights, routing_map, drop_and_pad,
                                  widen=not float32_math)
        assert_same(want, got, f"probs {weights is not None}")
        # Megatron's own 16-bit arithmetic differs only by its roundings.
        native = megatron_unpermute(expert_out, sorted_indices, tokens.shape, weights, routing_map, drop_and_pad)
        torch.testing.assert_close(native.float(), got.float(), rtol=0.05, atol=0.05 * float(got.abs().max()))


@pytest.mark.parametrize("case", [1, 2])
def test_unpermute_other_row_counts_sum_in_expert_order(case):
    """num_out_tokens below or above the routed pairs (Megatron's unpermute then takes no probs: its
    masked_select yields one weight per routed pair): the rows are pairs as permute made them (cut
    ones missing, extra unrouted ones present), each weighted by its pair's prob (permute's
    permuted_probs) and added per token in increasing expert order."""
    tokens, routing_map, probs, num_out_tokens, _ = make_case(case, torch.bfloat16, seed=3)
    permuted, permuted_probs, sorted_indices, _, _ = permute(tokens, routing_map, probs, num_out_tokens)
    gen = torch.Generator().manual_seed(3)
    expert_out = random_values(permuted.shape, torch.bfloat16, gen)
    by_expert = expert_order(routing_map, num_out_tokens, False)
    for weights, per_row in ((None, expert_out.float()), (probs, expert_out.float() * permuted_probs[:, None])):
        got = unpermute(expert_out, sorted_indices, tokens.shape, weights, routing_map=routing_map)
        want = ordered_index_add(9, sorted_indices[by_expert], per_row[by_expert]).to(torch.bfloat16)
        assert_bitwise_equal(want, got)


@pytest.mark.parametrize("dtype,probs_dtype", UNPERMUTE_DTYPES)
def test_unpermute_equals_megatron_batch_invariant_unpermute(dtype, probs_dtype):
    gen = torch.Generator().manual_seed(4)
    n, e, k, h = 11, 6, 3, 5
    routing_map, probs = topk_routing(gen, n, e, k, probs_dtype)
    tokens = random_values((n, h), dtype, gen)
    permuted, _, sorted_indices, inverse_map, _ = permute(tokens, routing_map, probs, n * k,
                                                          return_batch_invariant_inverse_map=True)
    flat = torch.argsort(routing_map.T.reshape(-1), descending=True, stable=True)[:n * k]
    assert torch.equal(megatron_inverse_map(routing_map, flat, n * k), inverse_map)
    expert_out = random_values(permuted.shape, dtype, gen)
    expert_out[3, 1] = float("inf")
    for weights in (probs, None):
        got = unpermute(expert_out, sorted_indices, tokens.shape, weights, routing_map,
                        batch_invariant_inverse_map=inverse_map)
        assert_same(megatron_batch_invariant_unpermute(expert_out, tokens.shape, weights, inverse_map), got)


@pytest.mark.parametrize("dtype,probs_dtype", UNPERMUTE_DTYPES)
@pytest.mark.parametrize("case", [0, 4])
def test_unpermute_gradients(case, dtype, probs_dtype):
    tokens, routing_map, probs, num_out_tokens, drop_and_pad = make_case(case, dtype, probs_dtype, seed=5)
    permuted, _, sorted_indices, _, _ = permute(tokens, routing_map, probs, num_out_tokens, drop_and_pad=drop_and_pad)
    gen = torch.Generator().manual_seed(case)
    expert_out = random_values(permuted.shape, dtype, gen).requires_grad_(True)
    probs.requires_grad_(True)
    out = unpermute(expert_out, sorted_indices, tokens.shape, probs, routing_map, drop_and_pad=drop_and_pad)
    grad_out = random_values(out.shape, dtype, gen)
    out.backward(grad_out)
    # Rows: one float32 product of the widened token gradient and the row's prob, one narrowing -
    # exactly Megatron's autograd on float32-widened operands.
    rows_m = expert_out.detach().float().requires_grad_(True)
    probs_m = probs.detach().float().requires_grad_(True)
    megatron_unpermute(rows_m, sorted_indices, tokens.shape, probs_m, routing_map, drop_and_pad).backward(
        grad_out.float())
    assert_same(rows_m.grad.to(dtype), expert_out.grad, "grad_permuted_tokens")
    # Probs: per (token, expert) pair with a row, the float32 products row * grad_out summed over H
    # in the ascend_950 order of moe_finalize_routing_grad; 0 elsewhere.
    n, e = routing_map.shape
    keys = megatron_permute(tokens, routing_map, None, num_out_tokens, drop_and_pad)
    experts = torch.arange(permuted.shape[0]) // (permuted.shape[0] // e) if drop_and_pad else \
        torch.argsort(routing_map.T.reshape(-1), descending=True, stable=True)[:num_out_tokens] // n
    want = torch.zeros(n, e)
    for d in range(permuted.shape[0]):
        token, expert = int(keys[2][d]), int(experts[d])
        products = (expert_out[d].detach().float() * grad_out[token].float()).numpy().astype(np.float32)
        want[token, expert] = float(grad_scales_sum(products, "ascend_950", 0))
    assert_same(want.to(probs_dtype), probs.grad, "grad_probs")
    torch.testing.assert_close(probs_m.grad.to(probs_dtype), probs.grad, rtol=1e-5, atol=1e-5 * float(
        probs.grad.abs().max().float()))


def test_unpermute_is_deterministic_across_thread_counts():
    tokens, routing_map, probs, num_out_tokens, _ = make_case(0, torch.bfloat16, seed=6)
    tokens = random_values((9, 4099), torch.bfloat16, torch.Generator().manual_seed(6))
    results = []
    saved = torch.get_num_threads()
    try:
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            t = tokens.clone().requires_grad_(True)
            p = probs.clone().requires_grad_(True)
            permuted, _, sorted_indices, _, _ = permute(t, routing_map, p, num_out_tokens)
            out = unpermute(permuted * 3, sorted_indices, t.shape, p, routing_map)
            out.backward(torch.ones_like(out))
            results.append((out, t.grad, p.grad))
    finally:
        torch.set_num_threads(saved)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert_bitwise_equal(a, b)


@pytest.mark.parametrize("n,e,h,rows", [(0, 3, 4, 0), (3, 1, 0, 3), (3, 2, 4, 0)])
@pytest.mark.parametrize("drop_and_pad", [False, True])
def test_empty_inputs(n, e, h, rows, drop_and_pad):
    tokens = torch.randn(n, h, requires_grad=True)
    routing_map = torch.rand(n, e, generator=torch.Generator().manual_seed(n)) > 0.5
    probs = torch.rand(n, e, requires_grad=True)
    permuted, permuted_probs, sorted_indices, _, _ = permute(tokens, routing_map, probs, rows,
                                                             drop_and_pad=drop_and_pad)
    assert permuted.shape == (rows, h) and permuted_probs.shape == (rows,) and sorted_indices.shape == (rows,)
    out = unpermute(permuted, sorted_indices, (n, h), probs, routing_map, drop_and_pad=drop_and_pad)
    assert out.shape == (n, h) and not out.any()
    (out.sum() + permuted_probs.sum()).backward()
    assert tokens.grad.shape == (n, h) and probs.grad.shape == (n, e)


# ---- errors ----------------------------------------------------------------------------------

def test_errors_name_the_argument():
    tokens, routing_map, probs, num_out_tokens, _ = make_case(0, torch.float32, seed=7)
    permuted, _, sorted_indices, _, _ = permute(tokens, routing_map, probs, num_out_tokens)
    # The meta device stands in for a second device: probs was gathered with the tokens' index (a
    # RuntimeError, or silently accepted on meta), sorted_indices compared, and routing_map reported
    # as the operator's expert_idx.
    meta = lambda t: t.to("meta")
    for name, call in (("routing_map", lambda: permute(tokens, meta(routing_map), probs, num_out_tokens)),
                       ("probs", lambda: permute(tokens, routing_map, meta(probs), num_out_tokens))):
        with pytest.raises(ValueError, match=rf"^permute: {name} must be on cpu \(the device of tokens\), got meta$"):
            call()
    for name, args in (("sorted_indices", (meta(sorted_indices), probs, routing_map)),
                       ("probs", (sorted_indices, meta(probs), routing_map)),
                       ("routing_map", (sorted_indices, probs, meta(routing_map)))):
        with pytest.raises(ValueError, match=rf"^unpermute: {name} must be on cpu \(the device of permuted_tokens\), "
                                             rf"got meta$"):
            unpermute(permuted, args[0], tokens.shape, args[1], args[2])
    # None: the routed pairs, dropless, as Megatron-Core's permute reads None (v0.10 - v0.16 take the
    # argument as optional; with None its drop_and_pad branch is skipped); it was refused. An integer
    # map's nonzero entries are its routed pairs (2 and -1 count once each), not its sum. Not without
    # values.
    int_map = routing_map.to(torch.int8) * torch.randint(1, 3, routing_map.shape, dtype=torch.int8)
    int_map[int_map == 2] = -1 if int_map.numel() > 0 else 0
    routed = int(routing_map.count_nonzero())
    assert int(int_map.sum()) != routed  # the test tells the count from the sum
    for flag in (False, True):
        for got, want in zip(permute(tokens, int_map, probs, drop_and_pad=flag),
                             permute(tokens, routing_map, probs, routed)):
            assert (got is None and want is None) or torch.equal(got, want)
    with pytest.raises(ValueError, match=r"^permute: num_out_tokens must be given \(None reads the routed count "):
        permute(tokens.to("meta"), routing_map.to("meta"))
    with pytest.raises(ValueError, match="permute: num_out_tokens must be >= 0, got -1"):
        permute(tokens, routing_map, probs, -1)
    with pytest.raises(ValueError, match="permute: tokens must be one of float32, float16, bfloat16, got float64"):
        permute(tokens.double(), routing_map, probs, num_out_tokens)
    with pytest.raises(ValueError, match=r"permute: probs must have routing_map's shape \[9, 5\], got \[9, 4\]"):
        permute(tokens, routing_map, probs[:, :4], num_out_tokens)
    with pytest.raises(ValueError, match="permute: routing_map must have one row per token"):
        permute(tokens[:8], routing_map, None, num_out_tokens)
    with pytest.raises(ValueError, match="permute: return_batch_invariant_inverse_map needs num_out_tokens a multiple"):
        permute(tokens, routing_map, None, 10, return_batch_invariant_inverse_map=True)
    # A token routed to more (or fewer) experts than num_out_tokens / num_tokens: its slots would
    # spill into the next token's; the map was silently wrong before this check.
    uneven = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 1]], dtype=torch.bool)
    with pytest.raises(ValueError, match="permute: return_batch_invariant_inverse_map needs every token routed to "
                                         "exactly num_out_tokens / num_tokens = 2 experts, got 3 for token 0"):
        permute(torch.ones(2, 3), uneven, None, 4, return_batch_invariant_inverse_map=True)
    # No tokens: an empty map (this raised ZeroDivisionError), and a clear error for rows asked.
    empty = permute(torch.ones(0, 3), torch.zeros(0, 4, dtype=torch.bool), None, 0,
                    return_batch_invariant_inverse_map=True)
    assert empty[3].shape == (2, 0, 0) and empty[3].dtype == torch.long and empty[0].shape == (0, 3)
    with pytest.raises(ValueError, match="permute: return_batch_invariant_inverse_map needs num_out_tokens a multiple "
                                         "of num_tokens 0"):
        permute(torch.ones(0, 3), torch.zeros(0, 4, dtype=torch.bool), None, 2,
                return_batch_invariant_inverse_map=True)
    with pytest.raises(ValueError, match="unpermute: routing_map must be given"):
        unpermute(permuted, sorted_indices, tokens.shape)
    with pytest.raises(ValueError, match=r"unpermute: restore_shape must be \[num_tokens, hidden\] = \[9, 6\]"):
        unpermute(permuted, sorted_indices, (9, 5), routing_map=routing_map)
    # Iterating 9 raised TypeError: 'int' object is not iterable; "ab" was read as the extents 'a', 'b'.
    for not_a_shape in (9, None, "ab"):
        with pytest.raises(ValueError, match=rf"unpermute: restore_shape must be a sequence \[num_tokens, hidden\], "
                                             rf"got {not_a_shape!r}"):
            unpermute(permuted, sorted_indices, not_a_shape, routing_map=routing_map)
    bad = sorted_indices.clone()
    bad[4] = (bad[4] + 1) % 9
    with pytest.raises(ValueError, match=r"unpermute: sorted_indices\[4\] must be \d+ \(the token of row 4"):
        unpermute(permuted, bad, tokens.shape, probs, routing_map)
    with pytest.raises(ValueError, match="unpermute: sorted_indices must have one entry per row"):
        unpermute(permuted, sorted_indices[:-1], tokens.shape, probs, routing_map)
    with pytest.raises(ValueError, match="unpermute: pad_offsets must be None"):
        unpermute(permuted, sorted_indices, tokens.shape, probs, routing_map, pad_offsets=torch.zeros(5))
    with pytest.raises(ValueError, match=r"unpermute: with drop_and_pad, permuted_tokens must have num_experts \* "
                                         r"capacity rows \(a multiple of 5\), got 18"):
        unpermute(permuted, sorted_indices, tokens.shape, probs, routing_map, drop_and_pad=True)
    with pytest.raises(ValueError, match=r"unpermute: permuted_tokens must have at most num_tokens \* num_experts "
                                         r"= 45"):
        unpermute(torch.zeros(46, 6), torch.zeros(46, dtype=torch.long), tokens.shape, None, routing_map)


# ---- torch.compile ---------------------------------------------------------------------------

@pytest.mark.parametrize("drop_and_pad,backend,dynamic", [(False, "inductor", None), (True, "aot_eager", True)])
def test_compile_fullgraph_bit_for_bit(drop_and_pad, backend, dynamic):
    case = 4 if drop_and_pad else 0
    tokens, routing_map, probs, num_out_tokens, _ = make_case(case, torch.bfloat16, seed=8)

    def layer(tokens, probs, weight):
        permuted, permuted_probs, sorted_indices, _, _ = permute(tokens, routing_map, probs, num_out_tokens,
                                                                 drop_and_pad=drop_and_pad)
        expert_out = permuted * weight
        return unpermute(expert_out, sorted_indices, tokens.shape, probs, routing_map, drop_and_pad=drop_and_pad), \
            permuted_probs

    weight = torch.rand(6, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    results = []
    for fn in (layer, torch.compile(layer, fullgraph=True, backend=backend, dynamic=dynamic)):
        t, p = tokens.clone().requires_grad_(True), probs.clone().requires_grad_(True)
        out, permuted_probs = fn(t, p, weight)
        (out.float().sum() + permuted_probs.sum()).backward()
        results.append((out, permuted_probs, t.grad, p.grad))
    for eager, compiled in zip(*results):
        assert_bitwise_equal(eager, compiled)


# (function, argument, a call taking (tokens, routing_map, the value for the int)): the int arguments (align_size
# is accepted and ignored, as Megatron's unfused path does).
INT_ARGUMENT_CASES = [
    ("permute", "num_out_tokens", lambda t, m, b: permute(t, m, num_out_tokens=b)[0]),
    ("unpermute", "restore_shape",
     lambda t, m, b: unpermute(t.repeat(2, 1), torch.tensor([0, 1, 0, 1]), [2, b], None, m)),
]


@pytest.mark.parametrize("function,argument,call", INT_ARGUMENT_CASES)
def test_compiled_call_refuses_a_bool_for_an_int(function, argument, call):
    # They refuse a bool under torch.compile(fullgraph=True) as in eager.
    tokens, routing_map = torch.randn(2, 3), torch.ones(2, 2, dtype=torch.bool)
    message = f"{function}: {argument} must be an int, got True"
    with pytest.raises(ValueError, match=f"^{message}$"):
        call(tokens, routing_map, True)
    assert_compiled_raises_value_error(message, call, tokens, routing_map, True)


@pytest.mark.parametrize("value", NON_INT_TENSORS, ids=NON_INT_TENSOR_IDS)
@pytest.mark.parametrize("function,argument,call", INT_ARGUMENT_CASES)
def test_a_non_int_tensor_for_an_int_is_refused_eager_and_compiled(function, argument, call, value):
    # And any tensor but a 0-dim integer one (check_int took a complex one as int() does: 2.5+0j as 2), while
    # a 0-dim int64 one is the int it holds, eager.
    tokens, routing_map = torch.randn(2, 3), torch.ones(2, 2, dtype=torch.bool)
    message = non_int_tensor_message(function, argument, value)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call(tokens, routing_map, value)
    assert_compiled_raises_value_error(message, call, tokens, routing_map, value)
    assert torch.equal(call(tokens, routing_map, torch.tensor(3)), call(tokens, routing_map, 3))


def test_a_sparse_input_is_a_value_error_naming_it():
    # unpermute's sparse permuted_tokens reached moe_init_routing_v2, which named its own x.
    routing_map = torch.tensor([[1, 0, 1], [0, 1, 0]], dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^unpermute: permuted_tokens must be a dense \(strided\) tensor, got a "
                                         r"sparse_coo tensor$"):
        unpermute(torch.randn(3, 3).to_sparse(), torch.tensor([0, 0, 1]), (2, 3), None, routing_map)
