"""moe_routing.torch_npu's routing-map pair, npu_moe_token_permute_with_routing_map and
npu_moe_token_unpermute_with_routing_map, against plain-PyTorch statements of torch_npu's documented
formulas (op-plugin's docs/zh/custom_APIs/torch_npu pages and CANN's MoeTokenPermuteWithRoutingMap /
MoeTokenUnpermuteWithRoutingMap descriptions), bit for bit; the sums in the float32 order of
docs/porting.md. Gradients, torch.compile(fullgraph=True), errors."""
import pytest
import torch

import moe_routing.torch_npu as torch_npu
from reference import assert_bitwise_equal, random_values

I32 = torch.int32
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
permute = torch_npu.npu_moe_token_permute_with_routing_map
unpermute = torch_npu.npu_moe_token_unpermute_with_routing_map


def topk_map(gen, n, e, k, dtype=torch.bool):
    chosen = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(n)])
    return torch.zeros(n, e, dtype=torch.bool).scatter_(1, chosen, True).to(dtype)


def random_map(gen, n, e):
    return torch.rand(n, e, generator=gen) < 0.4


# ---- references: the documented formulas ----------------------------------------------------

def permute_reference(tokens, routing_map, probs, num_out_tokens, drop_and_pad):
    """Dropless: the rows are arange(N) expanded over the experts, masked by routing_map^T (expert-major,
    tokens ascending); sorted_indices = the stable argsort of those tokens (pair -> row); probs^T masked
    alike. drop_and_pad: per expert the first capacity entries of a stable descending argsort of its
    column (routed tokens, then the others); sorted_indices = those tokens; probs at (expert, token)."""
    n, e = routing_map.shape
    mask = routing_map.bool().T
    if not drop_and_pad:
        row_token = torch.arange(n).unsqueeze(0).expand(e, n).masked_select(mask)
        sorted_indices = torch.argsort(row_token, stable=True).to(I32)
        permuted_probs = None if probs is None else probs.T.masked_select(mask)
        return tokens.index_select(0, row_token), permuted_probs, sorted_indices
    capacity = num_out_tokens // e
    picked = routing_map.to(torch.int8).T.argsort(dim=-1, descending=True, stable=True)[:, :capacity]
    row_token = picked.reshape(-1)
    permuted_probs = None
    if probs is not None:
        permuted_probs = probs.T.reshape(-1).index_select(0, (torch.arange(e).unsqueeze(1) * n + picked).reshape(-1))
    return tokens.index_select(0, row_token), permuted_probs, row_token.to(I32)


def float32_sum(terms, token_of_term, n, dtype):
    """out[t] = +0, then + each term of token t in the order given (float32 adds), one RNE narrowing."""
    acc = torch.zeros((n, terms.shape[1]), dtype=torch.float32)
    for term, token in zip(terms, token_of_term.tolist()):
        if token >= 0:
            acc[token] = acc[token] + term
    return acc.to(dtype)


def unpermute_reference(permuted_tokens, sorted_indices, restore_shape, probs, routing_map, drop_and_pad,
                        skip_zero=True):
    """Dropless: out[i // K] += prob_i * permuted_tokens[sorted_indices[i]] for the slots i = i*K + t in
    order, prob_i the i-th of probs masked by routing_map (row-major), -1 / cut rows / (A2) zero probs
    skipped. drop_and_pad: out[sorted_indices[r]] += probs[sorted_indices[r], r // C] * row r, the rows
    of a token in increasing r (the stable sort of sorted_indices). Products in float32."""
    n, _ = restore_shape
    rows = permuted_tokens.float()
    if not drop_and_pad:
        k = sorted_indices.numel() // n
        slot_probs = None
        if probs is not None:
            slot_probs = probs.masked_select(routing_map.bool()).reshape(n, k).reshape(-1).float()
        terms, owners = [], []
        for i, r in enumerate(sorted_indices.tolist()):
            keep = 0 <= r < rows.shape[0] and not (skip_zero and slot_probs is not None and slot_probs[i] == 0)
            term = rows[r] if keep else torch.zeros(rows.shape[1])
            if keep and slot_probs is not None:
                term = slot_probs[i] * term
            terms.append(term)
            owners.append(i // k if keep else -1)
        terms = torch.stack(terms) if terms else rows[:0]
        return float32_sum(terms, torch.tensor(owners, dtype=torch.long), n, permuted_tokens.dtype)
    e = probs.shape[1] if probs is not None else routing_map.shape[1]
    capacity = rows.shape[0] // e
    token = sorted_indices.long()
    order = torch.sort(token, stable=True).indices  # outIndex: rows of each token, increasing
    if probs is not None:
        weights = probs.float()[token, torch.arange(rows.shape[0]) // capacity]
        rows = weights.unsqueeze(1) * rows
    return float32_sum(rows[order], token[order], n, permuted_tokens.dtype)


def permute_case(gen, dtype, n=7, e=5, k=2, h=6, probs_dtype=None, drop_and_pad=False):
    tokens = random_values((n, h), dtype, gen)
    routing_map = topk_map(gen, n, e, k) if not drop_and_pad else random_map(gen, n, e)
    probs = torch.rand(n, e, generator=gen).to(probs_dtype) if probs_dtype is not None else None
    return tokens, routing_map, probs


# ---- the documentation's examples ------------------------------------------------------------

def test_the_documented_examples():
    tokens = torch.tensor([[0.1] * 4, [0.2] * 4, [0.3] * 4], dtype=torch.float16)
    routing_map = torch.ones((3, 2), dtype=torch.int8)
    permuted, permuted_probs, sorted_indices = permute(tokens, routing_map, num_out_tokens=6)
    assert permuted_probs is None
    assert sorted_indices.tolist() == [0, 3, 1, 4, 2, 5] and sorted_indices.dtype == I32
    assert_bitwise_equal(tokens[[0, 1, 2, 0, 1, 2]], permuted)
    assert_bitwise_equal(tokens.repeat_interleave(2, 0), permuted[sorted_indices.long()])
    probs = torch.tensor([[0.5, 0.3], [0.4, 0.6], [0.2, 0.8]], dtype=torch.float16)
    _, permuted_probs, _ = permute(tokens, routing_map, probs=probs, num_out_tokens=6)
    assert_bitwise_equal(probs.T.reshape(-1), permuted_probs)
    permuted, _, sorted_indices = permute(tokens, routing_map, num_out_tokens=4, drop_and_pad=True)
    assert permuted.shape == (4, 4) and sorted_indices.tolist() == [0, 1, 0, 1]

    rows = torch.tensor([[1.0] * 4, [2.0] * 4], dtype=torch.float16)
    index = torch.tensor([0, 1], dtype=I32)
    routing_map = torch.tensor([[1, 0], [0, 1]], dtype=torch.int8)
    out = unpermute(rows, index, [2, 4], probs=torch.tensor([[1.0, 0], [0, 1]], dtype=torch.float16),
                    routing_map=routing_map)
    assert_bitwise_equal(rows, out)
    out = unpermute(rows, index, [2, 4], probs=torch.tensor([[0.5, 0], [0, 0.5]], dtype=torch.float16),
                    routing_map=routing_map, drop_and_pad=True)
    assert_bitwise_equal(torch.tensor([[0.5] * 4, [1.0] * 4], dtype=torch.float16), out)


# ---- forward, bit for bit ----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("with_probs", [False, True])
@pytest.mark.parametrize("drop_and_pad,num_out_tokens", [(False, 14), (True, 10), (True, 15), (True, 35),
                                                          (True, 4), (True, 0), (False, None), (True, None)])
def test_permute_is_the_documented_formula(dtype, with_probs, drop_and_pad, num_out_tokens):
    gen = torch.Generator().manual_seed(1)
    k = 1 if (num_out_tokens is None and not drop_and_pad) else 2  # None means N: top-1
    tokens, routing_map, probs = permute_case(gen, dtype, k=k, probs_dtype=dtype if with_probs else None,
                                              drop_and_pad=drop_and_pad)
    got = permute(tokens, routing_map, probs=probs, num_out_tokens=num_out_tokens, drop_and_pad=drop_and_pad)
    want = permute_reference(tokens, routing_map, probs, 7 if num_out_tokens is None else num_out_tokens,
                             drop_and_pad)
    for name, w, g in zip(("permuted_tokens", "permuted_probs", "sorted_indices"), want, got):
        if w is None:
            assert g is None, name
        else:
            assert_bitwise_equal(w, g, name)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("probs_dtype", [None, "same", torch.float32])
@pytest.mark.parametrize("drop_and_pad", [False, True])
def test_unpermute_is_the_documented_formula_in_float32(dtype, probs_dtype, drop_and_pad):
    gen = torch.Generator().manual_seed(2)
    probs_dtype = dtype if probs_dtype == "same" else probs_dtype
    n, e, k, h = 9, 6, 3, 40
    routing_map = topk_map(gen, n, e, k, torch.int8)
    count = n * k if not drop_and_pad else 24
    tokens = random_values((n, h), dtype, gen)
    probs = None
    if probs_dtype is not None:
        probs = torch.where(routing_map.bool(), torch.rand(n, e, generator=gen), 0).to(probs_dtype)
        probs[0, routing_map[0].bool().nonzero()[0, 0]] = 0  # a zero prob of a routed pair
    _, _, sorted_indices = permute(tokens, routing_map, probs=probs, num_out_tokens=count, drop_and_pad=drop_and_pad)
    rows = random_values((sorted_indices.numel() if drop_and_pad else n * k, h), dtype, gen)
    got = unpermute(rows, sorted_indices, [n, h], probs=probs, routing_map=routing_map, drop_and_pad=drop_and_pad)
    want = unpermute_reference(rows, sorted_indices, (n, h), probs, routing_map, drop_and_pad)
    assert_bitwise_equal(want, got)


def test_dropless_unpermute_skips_zero_probs_on_atlas_a2_only():
    """A routed pair with prob 0 and an Inf row: skipped under atlas_a2 (the A2 kernel's test), NaN under
    ascend_950 (0 * Inf added)."""
    routing_map = torch.tensor([[1, 1], [1, 1]], dtype=torch.int8)
    probs = torch.tensor([[0.5, 0.0], [0.25, 0.75]])
    _, _, sorted_indices = permute(torch.zeros(2, 3), routing_map, num_out_tokens=4)
    rows = torch.tensor([[1.0] * 3, [2.0] * 3, [float("inf")] * 3, [4.0] * 3])  # row 2 = (token 0, expert 1)
    a2 = unpermute(rows, sorted_indices, [2, 3], probs=probs, routing_map=routing_map)
    assert torch.equal(a2[0], torch.full((3,), 0.5))
    a950 = unpermute(rows, sorted_indices, [2, 3], probs=probs, routing_map=routing_map, numerics="ascend_950")
    assert torch.isnan(a950[0]).all()
    assert_bitwise_equal(unpermute_reference(rows, sorted_indices, (2, 3), probs, routing_map, False), a2)


def test_dropless_unpermute_skips_minus_one_slots():
    """The newest torch_npu documentation: a token may use fewer than topK slots, -1 marking the unused."""
    routing_map = torch.tensor([[1, 0, 1], [0, 1, 0]], dtype=torch.int8)
    probs = torch.tensor([[0.5, 0.0, 0.25], [0.0, 2.0, 0.0]])
    rows = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    index = torch.tensor([0, 2, 1, -1], dtype=I32)
    got = unpermute(rows, index, [2, 2], probs=probs, routing_map=routing_map)
    assert_bitwise_equal(torch.tensor([[0.5 + 1.25, 1.0 + 1.5], [6.0, 8.0]]), got)
    assert_bitwise_equal(torch.tensor([[6.0, 8.0], [3.0, 4.0]]), unpermute(rows, index, [2, 2]))


def test_round_trip_with_unit_probs_restores_top1_tokens():
    gen = torch.Generator().manual_seed(4)
    tokens, routing_map, _ = permute_case(gen, torch.bfloat16, k=1)
    permuted, _, sorted_indices = permute(tokens, routing_map, num_out_tokens=7)
    assert_bitwise_equal(tokens, unpermute(permuted, sorted_indices, tokens.shape))



@pytest.mark.parametrize("with_probs", [False, True])
def test_dropless_unpermute_of_a_permute_without_slots_gives_zero_tokens(with_probs):
    """num_out_tokens below N (K = num_out_tokens // N = 0) permutes no rows; the unpermute of that (an
    empty sorted_indices) is restore_shape's [N, H] of +0 - every token's sum is empty - on the autograd
    graph. It returned a [0, H] tensor without probs and refused probs ("probs.size(1) (K) must be >= 1")."""
    n, e, h = 3, 2, 4
    routing_map = torch.zeros(n, e, dtype=torch.bool)
    tokens = torch.randn(n, h, requires_grad=True)
    probs = torch.rand(n, e, requires_grad=True) if with_probs else None
    permuted, permuted_probs, sorted_indices = permute(tokens, routing_map, probs=probs, num_out_tokens=n - 1)
    assert permuted.shape == (0, h) and sorted_indices.shape == (0,)
    for numerics in ("atlas_a2", "ascend_950"):
        out = unpermute(permuted, sorted_indices, [n, h], probs=probs, routing_map=routing_map, numerics=numerics)
        assert_bitwise_equal(torch.zeros(n, h), out)
        leaves = (tokens, probs) if with_probs else (tokens,)
        grads = torch.autograd.grad(out, leaves, torch.ones(n, h), retain_graph=True)
        assert_bitwise_equal(torch.zeros(n, h), grads[0])
        if with_probs:
            assert_bitwise_equal(torch.zeros(n, e), grads[1])
        meta = unpermute(permuted.to("meta"), sorted_indices.to("meta"), [n, h], routing_map=routing_map.to("meta"),
                         probs=None if probs is None else probs.detach().to("meta"))
        assert meta.shape == (n, h) and meta.dtype == out.dtype

# ---- gradients ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("drop_and_pad,count", [(False, 21), (True, 15), (True, 25)])
def test_permute_backward(dtype, drop_and_pad, count):
    """tokens: each token's rows added in float32 from +0 in increasing row (= expert) order, one
    narrowing; probs: the rows' gradients scattered back to their (token, expert), zeros elsewhere."""
    gen = torch.Generator().manual_seed(5)
    tokens, routing_map, probs = permute_case(gen, dtype, k=3, probs_dtype=dtype, drop_and_pad=drop_and_pad)
    tokens.requires_grad_(True)
    probs.requires_grad_(True)
    permuted, permuted_probs, sorted_indices = permute(tokens, routing_map, probs=probs, num_out_tokens=count,
                                                       drop_and_pad=drop_and_pad)
    grad_rows = random_values(permuted.shape, dtype, gen)
    grad_probs = random_values(permuted_probs.shape, dtype, gen)
    torch.autograd.backward((permuted, permuted_probs), (grad_rows, grad_probs))
    n, e = routing_map.shape
    if drop_and_pad:
        row_token = sorted_indices.long()
    else:
        row_token = torch.arange(n).unsqueeze(0).expand(e, n).masked_select(routing_map.bool().T)
    assert_bitwise_equal(float32_sum(grad_rows.float(), row_token, n, dtype), tokens.grad, "tokens")
    row_expert = torch.arange(permuted.shape[0]) // (count // e) if drop_and_pad else \
        torch.arange(e).unsqueeze(1).expand(e, n).masked_select(routing_map.bool().T)
    want = torch.zeros(n, e, dtype=dtype)
    want[row_token, row_expert] = grad_probs
    assert_bitwise_equal(want, probs.grad, "probs")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("drop_and_pad", [False, True])
def test_unpermute_backward(dtype, drop_and_pad):
    """permuted_tokens: one float32 product grad * prob, one narrowing - bit for bit with the float32
    reference's autograd; probs: a float32 sum over H whose order is the operator's (close to the
    reference's; unrouted entries 0 in dropless mode)."""
    gen = torch.Generator().manual_seed(6)
    n, e, k, h = 8, 5, 2, 33
    routing_map = topk_map(gen, n, e, k)
    tokens = random_values((n, h), dtype, gen)
    probs = torch.where(routing_map, torch.rand(n, e, generator=gen) + 0.1, 0).to(dtype)
    count = n * k if not drop_and_pad else 15
    _, _, sorted_indices = permute(tokens, routing_map, probs=probs, num_out_tokens=count, drop_and_pad=drop_and_pad)
    rows = random_values((sorted_indices.numel(), h), dtype, gen)
    grad = random_values((n, h), dtype, gen)
    results = []
    for fn in (unpermute, unpermute_reference):
        r, p = rows.clone().requires_grad_(True), probs.clone().requires_grad_(True)
        out = fn(r, sorted_indices, (n, h), probs=p, routing_map=routing_map, drop_and_pad=drop_and_pad) \
            if fn is unpermute else fn(r, sorted_indices, (n, h), p, routing_map, drop_and_pad)
        out.backward(grad)
        results.append((out, r.grad, p.grad))
    (out, grad_rows, grad_probs), (want_out, want_rows, want_probs) = results
    assert_bitwise_equal(want_out, out, "out")
    assert_bitwise_equal(want_rows, grad_rows, "permuted_tokens")
    tolerance = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(grad_probs.float(), want_probs.float(), rtol=tolerance, atol=tolerance)
    if not drop_and_pad:
        assert (grad_probs[~routing_map] == 0).all()


# ---- torch.compile ---------------------------------------------------------------------------

@pytest.mark.parametrize("drop_and_pad", [False, True])
def test_compiled_permute_expert_unpermute_equals_eager(drop_and_pad):
    def layer(tokens, routing_map, probs, weight):
        permuted, permuted_probs, sorted_indices = permute(tokens, routing_map, probs=probs, num_out_tokens=12,
                                                           drop_and_pad=drop_and_pad)
        expert_out = permuted * weight
        out = unpermute(expert_out, sorted_indices, tokens.shape, probs=probs, routing_map=routing_map,
                        drop_and_pad=drop_and_pad)
        return out, permuted_probs

    gen = torch.Generator().manual_seed(7)
    tokens, routing_map, probs = permute_case(gen, torch.float32, n=6, e=4, k=2, probs_dtype=torch.float32)
    weight = torch.rand(6, generator=gen)
    results = []
    for fn in (layer, torch.compile(layer, fullgraph=True, backend="aot_eager")):
        t, p = tokens.clone().requires_grad_(True), probs.clone().requires_grad_(True)
        out, permuted_probs = fn(t, routing_map, p, weight)
        (out.sum() + permuted_probs.sum()).backward()
        results.append((out, permuted_probs, t.grad, p.grad))
    for eager, compiled in zip(*results):
        assert_bitwise_equal(eager, compiled)



@pytest.mark.parametrize("mode", ["compile", "compiled_autograd"])
@pytest.mark.parametrize("function", ["npu_moe_token_unpermute_with_routing_map", "npu_moe_token_unpermute",
                                      "megatron.unpermute"])
def test_inductor_rounds_the_widened_pairs_narrowings_where_eager_does(function, mode):
    """float16 tokens with float32 probs are widened to float32 for the combine and narrowed after, in
    the forward and (by autograd) in the backward. Inductor fused a plain narrowing with its neighbours
    - the float16 addition after the unpermute, and autograd's addition of the two float16 gradients
    that reach the permuted rows - and rounded once, in float32: gradients differed from eager by
    an ulp. The casts are an operator of their own now (_port._port_cast), which inductor cannot fuse:
    while torch.compile traces (mode "compile"), and where autograd records them, as an eager forward
    whose backward runs under compiled autograd needs (mode "compiled_autograd")."""
    from torch._dynamo import compiled_autograd
    import moe_routing.megatron as megatron
    gen = torch.Generator().manual_seed(0)
    n, e, h = 5, 4, 8
    routing_map = topk_map(gen, n, e, 1)
    probs = torch.rand(n, e, generator=gen)  # float32

    def layer(tokens, residual):
        if function == "megatron.unpermute":
            permuted, _, sorted_indices, _, _ = megatron.permute(tokens, routing_map, num_out_tokens=n)
            out = megatron.unpermute(permuted, sorted_indices, (n, h), probs=probs, routing_map=routing_map)
            return permuted, out + residual
        permuted, _, sorted_indices = permute(tokens, routing_map, num_out_tokens=n)
        if function == "npu_moe_token_unpermute":
            # The same rows through the older function: one pair per token, its prob as [N, 1].
            pair_probs = probs.masked_select(routing_map).reshape(n, 1)
            out = torch_npu.npu_moe_token_unpermute(permuted, sorted_indices, probs=pair_probs)
        else:
            out = unpermute(permuted, sorted_indices, [n, h], probs=probs, routing_map=routing_map)
        return permuted, out + residual

    tokens = random_values((n, h), torch.float16, gen)
    residual = random_values((n, h), torch.float16, gen)
    grads = (random_values((n, h), torch.float16, gen), random_values((n, h), torch.float16, gen))
    results = []
    for compiled in (False, True):
        t = tokens.clone().requires_grad_(True)
        if compiled and mode == "compile":
            outputs = torch.compile(layer, fullgraph=True, backend="inductor")(t, residual)
            torch.autograd.backward(outputs, grads)
        elif compiled:
            outputs = layer(t, residual)
            with compiled_autograd._enable(torch.compile(backend="inductor", fullgraph=True)):
                torch.autograd.backward(outputs, grads)
        else:
            outputs = layer(t, residual)
            torch.autograd.backward(outputs, grads)
        results.append((*outputs, t.grad))
    for eager, got in zip(*results):
        assert_bitwise_equal(eager, got)


@pytest.mark.parametrize("bad", ["token N", "token -1", "beyond int32", "twice for an expert"])
@pytest.mark.parametrize("with_probs", [False, True])
def test_compiled_drop_and_pad_unpermute_refuses_bad_sorted_indices(bad, with_probs):
    """Compiled code has no data checks: a drop_and_pad sorted_indices naming a token outside [0, N) was
    scattered as is (a RuntimeError from PyTorch's scatter on the CPU, a device-side assert on CUDA), and a
    token named twice for one expert silently lost a row. Either must reach the combine as an invalid index
    (INT32_MIN) and be refused, as a compiled dropless call refuses one."""
    n, e, h = 4, 3, 2
    gen = torch.Generator().manual_seed(9)
    tokens, routing_map, probs = permute_case(gen, torch.float32, n=n, e=e, h=h, probs_dtype=torch.float32,
                                              drop_and_pad=True)
    permuted, _, sorted_indices = permute(tokens, routing_map, num_out_tokens=6, drop_and_pad=True)
    index = sorted_indices.long()
    index[0] = {"token N": n, "token -1": -1, "beyond int32": 2**40, "twice for an expert": int(index[1])}[bad]

    def combine(rows, index, probs, routing_map):
        return unpermute(rows, index, [n, h], probs=probs, routing_map=routing_map, drop_and_pad=True)

    compiled = torch.compile(combine, fullgraph=True, backend="aot_eager")
    with pytest.raises(IndexError, match=r"^moe_finalize_routing: expanded_row_idx\[0\] must be in \[0, 6\) .*"
                                         r"got -2147483648$"):
        compiled(permuted, index, probs if with_probs else None, routing_map)
    eager_error = ValueError if bad == "twice for an expert" else IndexError
    with pytest.raises(eager_error, match=r"^npu_moe_token_unpermute_with_routing_map: sorted_indices\[0\]"):
        combine(permuted, index, probs if with_probs else None, routing_map)
    valid = compiled(permuted, sorted_indices, probs if with_probs else None, routing_map)
    assert_bitwise_equal(combine(permuted, sorted_indices, probs if with_probs else None, routing_map), valid)

# ---- errors ------------------------------------------------------------------------------------

def test_permute_errors_name_the_function_and_argument():
    tokens, routing_map = torch.randn(4, 3), topk_map(torch.Generator().manual_seed(8), 4, 3, 2)
    f = "npu_moe_token_permute_with_routing_map"
    with pytest.raises(ValueError, match=rf"^{f}: routing_map must route every token to num_out_tokens // "
                                         rf"num_tokens = 1 experts \(dropless mode\), got 2 for token 0$"):
        permute(tokens, routing_map, num_out_tokens=5)
    with pytest.raises(ValueError, match=rf"^{f}: num_out_tokens must be at most num_tokens \* num_experts = 12, "
                                         rf"got 13$"):
        permute(tokens, routing_map, num_out_tokens=13, drop_and_pad=True)
    with pytest.raises(ValueError, match=rf"^{f}: num_out_tokens must be >= 0, got -1$"):
        permute(tokens, routing_map, num_out_tokens=-1)
    with pytest.raises(ValueError, match=rf"^{f}: routing_map must have one row per token \(4\)"):
        permute(tokens, routing_map[:3], num_out_tokens=6)
    with pytest.raises(ValueError, match=rf"^{f}: probs must have routing_map's shape \[4, 3\], got \[4, 2\]$"):
        permute(tokens, routing_map, probs=torch.rand(4, 2), num_out_tokens=8)
    with pytest.raises(TypeError):
        permute(tokens, routing_map, None, 8)  # probs and the rest are keyword-only, as in torch_npu


def test_unpermute_errors_name_the_function_and_argument():
    f = "npu_moe_token_unpermute_with_routing_map"
    rows, routing_map = torch.randn(4, 3), torch.tensor([[1, 1, 0], [0, 1, 1]], dtype=torch.int8)
    index = torch.tensor([0, 2, 1, 3], dtype=I32)
    with pytest.raises(IndexError, match=rf"^{f}: sorted_indices\[3\] must be in \[-1, 4\)"):
        unpermute(rows, torch.tensor([0, 2, 1, 4], dtype=I32), [2, 3])
    with pytest.raises(ValueError, match=rf"^{f}: routing_map must be given with probs in dropless mode"):
        unpermute(rows, index, [2, 3], probs=torch.rand(2, 3))
    with pytest.raises(ValueError, match=rf"^{f}: restore_shape must be \[num_tokens, hidden\] with permuted_tokens' "
                                         rf"hidden 3, got \[2, 4\]$"):
        unpermute(rows, index, [2, 4])
    with pytest.raises(ValueError, match=rf"^{f}: restore_shape must be a sequence \[num_tokens, hidden\], "
                                         rf"got 'ab'$"):  # was read as the extents 'a', 'b'
        unpermute(rows, index, "ab")
    # No tokens: rows are still refused beyond the N*K = 0 slots (they were dropped and a view of
    # permuted_tokens returned), and probs still need routing_map.
    with pytest.raises(ValueError, match=rf"^{f}: permuted_tokens.size\(0\) must be at most N\*K \(0\) in "
                                         rf"dropless mode, got 4$"):
        unpermute(rows, torch.zeros(0, dtype=I32), [0, 3])
    with pytest.raises(ValueError, match=rf"^{f}: routing_map must be given with probs in dropless mode"):
        unpermute(rows[:0], torch.zeros(0, dtype=I32), [0, 3], probs=torch.rand(0, 3))
    empty = unpermute(rows[:0], torch.zeros(0, dtype=I32), [0, 3])
    assert empty.shape == (0, 3) and empty._base is None  # a new tensor, as every other path returns
    # ... and on the autograd graph of probs too (only the tokens were: autograd.grad refused probs).
    tokens0, probs0 = torch.zeros(0, 3, requires_grad=True), torch.zeros(0, 2, requires_grad=True)
    out0 = unpermute(tokens0, torch.zeros(0, dtype=I32), [0, 3], probs=probs0,
                     routing_map=torch.zeros(0, 2, dtype=torch.bool))
    grads = torch.autograd.grad(out0.sum(), (tokens0, probs0))
    assert grads[0].shape == (0, 3) and grads[1].shape == (0, 2)
    with pytest.raises(ValueError, match=rf"^{f}: sorted_indices must have num_tokens \* topK entries"):
        unpermute(rows, index, [3, 3])
    with pytest.raises(ValueError, match=rf"^{f}: routing_map or probs must be given in drop_and_pad mode"):
        unpermute(rows, torch.tensor([0, 1, 0, 1], dtype=I32), [2, 3], drop_and_pad=True)
    two_experts = torch.tensor([[1, 0], [0, 1]], dtype=torch.int8)
    with pytest.raises(IndexError, match=rf"^{f}: sorted_indices\[1\] must be in \[0, 2\)"):
        unpermute(rows, torch.tensor([0, 2, 0, 1], dtype=I32), [2, 3], routing_map=two_experts, drop_and_pad=True)
    with pytest.raises(ValueError, match=rf"^{f}: sorted_indices\[0\] must name a token once per expert"):
        unpermute(rows, torch.tensor([0, 0, 0, 1], dtype=I32), [2, 3], routing_map=two_experts, drop_and_pad=True)
    with pytest.raises(ValueError, match=rf"^{f}: with drop_and_pad, sorted_indices and permuted_tokens must have "
                                         rf"num_experts \* capacity entries \(a multiple of 3\), got 4 and 4$"):
        unpermute(rows, index, [2, 3], routing_map=routing_map, drop_and_pad=True)
    with pytest.raises(ValueError, match=rf"^{f}: routing_map must route each token to at most topK"):
        unpermute(rows[:2], index[:2], [2, 3], probs=torch.rand(2, 3), routing_map=routing_map)
