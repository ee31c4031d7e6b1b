"""moe_routing.torch_npu against plain-PyTorch statements of torch_npu's documented semantics (A2/A3):
signatures, outputs bit for bit, gradients bit for bit in the documented orders, torch_npu's quirks
as decided in docs/porting.md, clear errors, torch.compile(fullgraph=True)."""
import inspect
import re

import numpy as np
import pytest
import torch

import moe_routing
import moe_routing.torch_npu as torch_npu
from compile_errors import (MOE_INIT_ROUTING_INT_ARGUMENTS, NON_INT_TENSORS, NON_INT_TENSOR_IDS, TORCH_ENUM_IDS,
                            TORCH_ENUM_VALUES, assert_compiled_raises_value_error, non_int_tensor_message, outcome,
                            same_outcome)
from finalize_reference import atlas_chunk, grad_scales_sum
from reference import assert_bitwise_equal, grad_reference, random_values, v4_reference

I32, I64 = torch.int32, torch.int64
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_REQUIRED = inspect.Parameter.empty
POS, KW = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY

# torch_npu's schemas (op-plugin op_plugin_functions.yaml): (name, default, kind) of each parameter.
TORCH_NPU_SIGNATURES = {
    "npu_moe_init_routing": [("x", _REQUIRED, POS), ("row_idx", _REQUIRED, POS), ("expert_idx", _REQUIRED, POS),
                             ("active_num", _REQUIRED, POS)],
    "npu_moe_init_routing_v2": [
        ("x", _REQUIRED, POS), ("expert_idx", _REQUIRED, POS), ("scale", None, KW), ("offset", None, KW),
        ("active_num", -1, KW), ("expert_capacity", -1, KW), ("expert_num", -1, KW), ("drop_pad_mode", 0, KW),
        ("expert_tokens_num_type", 0, KW), ("expert_tokens_num_flag", False, KW), ("quant_mode", -1, KW),
        ("active_expert_range", [], KW), ("row_idx_type", 0, KW), ("x_dtype", None, KW)],
    "npu_moe_finalize_routing": [
        ("expanded_permuted_rows", _REQUIRED, POS), ("skip1", _REQUIRED, POS), ("skip2", _REQUIRED, POS),
        ("bias", _REQUIRED, POS), ("scales", _REQUIRED, POS), ("expanded_src_to_dst_row", _REQUIRED, POS),
        ("export_for_source_row", None, POS), ("drop_pad_mode", 0, POS), ("k", 1, POS)],
    "npu_moe_token_permute": [("tokens", _REQUIRED, POS), ("indices", _REQUIRED, POS), ("num_out_tokens", None, POS),
                              ("padded_mode", False, POS)],
    "npu_moe_token_unpermute": [
        ("permuted_tokens", _REQUIRED, POS), ("sorted_indices", _REQUIRED, POS), ("probs", None, POS),
        ("padded_mode", False, POS), ("restore_shape", None, POS)],
    "npu_moe_token_permute_with_routing_map": [
        ("tokens", _REQUIRED, POS), ("routing_map", _REQUIRED, POS), ("probs", None, KW), ("num_out_tokens", None, KW),
        ("drop_and_pad", False, KW)],
    "npu_moe_token_unpermute_with_routing_map": [
        ("permuted_tokens", _REQUIRED, POS), ("sorted_indices", _REQUIRED, POS), ("restore_shape", _REQUIRED, POS),
        ("probs", None, KW), ("routing_map", None, KW), ("drop_and_pad", False, KW)],
    "npu_moe_compute_expert_tokens": [("sorted_expert_for_source_row", _REQUIRED, POS), ("num_expert", _REQUIRED, POS)],
}


def canonical_nan(t):
    """Every NaN as the canonical quiet NaN (our operators store NaNs so; PyTorch's own float32 ->
    bfloat16 cast, which the mixed-dtype paths and the references use, does not)."""
    return torch.where(torch.isnan(t), torch.tensor(float("nan"), dtype=t.dtype), t)


def assert_same(expected, got, what=""):
    """Bit for bit, every NaN counted as the canonical one."""
    assert_bitwise_equal(canonical_nan(expected), canonical_nan(got), what)


def column_row_idx(n, k):
    return torch.arange(n * k, dtype=I32).reshape(k, n).T


def routing_case(gen, n, k, e, dtype=torch.float32, h=6):
    x = random_values((n, h), dtype, gen)
    expert_idx = torch.randint(0, e, (n, k), generator=gen, dtype=I32)
    return x, expert_idx


# ---- signatures ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(TORCH_NPU_SIGNATURES))
def test_signatures_are_torch_npu_s(name):
    params = list(inspect.signature(getattr(torch_npu, name)).parameters.values())
    theirs = TORCH_NPU_SIGNATURES[name]
    head = params[:len(theirs)]
    for p, (want_name, want_default, want_kind) in zip(head, theirs):
        assert p.name == want_name, name
        assert p.kind == want_kind, (name, p.name)
        if name == "npu_moe_finalize_routing" and p.name == "export_for_source_row":
            continue  # required in torch_npu; ours has a sentinel so that its documented alias works
        assert p.default == want_default or (p.default is _REQUIRED and want_default is _REQUIRED), (name, p.name)
    rest = params[len(theirs):]
    ours = [] if name == "npu_moe_compute_expert_tokens" else ["numerics"]  # an integer count has no numerics
    assert [p.name for p in rest if p.name != "expert_for_source_row"] == ours
    assert all(p.kind == KW for p in rest)


def test_import_as_torch_npu_exposes_every_function():
    assert sorted(torch_npu.__all__) == sorted(TORCH_NPU_SIGNATURES)


# ---- npu_moe_init_routing (V1) ---------------------------------------------------------------

def v1_reference(x, row_idx, expert_idx, active_num):
    """The documented formula: a stable sort of expert_idx (row-major) carrying row_idx's values v;
    expanded_row_idx[v[d]] = d; expanded_x[d] = x[v[d] mod N] for the first min(N, A)*K rows."""
    n, k = expert_idx.shape
    keys = expert_idx.reshape(-1).long()
    order = torch.argsort(keys, stable=True)
    v = row_idx.reshape(-1)[order].long()
    expanded_row_idx = torch.empty(n * k, dtype=I32)
    expanded_row_idx[v] = torch.arange(n * k, dtype=I32)
    rows = min(n, active_num) * k
    return x[v[:rows] % n], expanded_row_idx, keys[order].to(I32)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n,k,e,active_num", [(5, 2, 4, 3), (7, 3, 5, 7), (6, 4, 3, 100), (4, 1, 2, 0), (0, 2, 3, 5),
                                              (9, 8, 16, 4)])
def test_init_routing_v1_matches_documented_formula(dtype, n, k, e, active_num):
    gen = torch.Generator().manual_seed(n * 100 + k)
    x, expert_idx = routing_case(gen, n, k, e, dtype)
    got = torch_npu.npu_moe_init_routing(x, column_row_idx(n, k), expert_idx, active_num)
    want = v1_reference(x, column_row_idx(n, k), expert_idx, active_num)
    for w, g, what in zip(want, got, ("expanded_x", "expanded_row_idx", "expanded_expert_idx")):
        assert_bitwise_equal(w, g, what)


def test_init_routing_v1_worked_example():
    # N = 3, K = 2: expert_idx [[1, 0], [2, 1], [0, 2]] sorts (stable, row-major p) to p = 1, 4, 0, 3, 2, 5.
    x = torch.tensor([[1.0, 1.5], [2.0, 2.5], [3.0, 3.5]])
    expert_idx = torch.tensor([[1, 0], [2, 1], [0, 2]], dtype=I32)
    expanded_x, expanded_row_idx, expanded_expert_idx = torch_npu.npu_moe_init_routing(
        x, column_row_idx(3, 2), expert_idx, 2)
    assert expanded_x.tolist() == [[1.0, 1.5], [3.0, 3.5], [1.0, 1.5], [2.0, 2.5]]  # min(3, 2) * 2 rows
    # Column layout: entry t*N + i is the row of pair (i, t): pairs (0,0)->2 (1,0)->4 (2,0)->1 (0,1)->0 ...
    assert expanded_row_idx.tolist() == [2, 4, 1, 0, 3, 5]
    assert expanded_expert_idx.tolist() == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("numerics,order", [("atlas_a2", "tree"), ("ascend_950", "sequential")])
def test_init_routing_v1_backward_sums_in_the_numerics_order(numerics, order):
    gen = torch.Generator().manual_seed(3)
    n, k, active_num = 6, 5, 4
    x, expert_idx = routing_case(gen, n, k, 7)
    x.requires_grad_(True)
    expanded_x, expanded_row_idx, _ = torch_npu.npu_moe_init_routing(x, column_row_idx(n, k), expert_idx, active_num,
                                                                     numerics=numerics)
    grad = random_values(expanded_x.shape, torch.float32, gen)
    expanded_x.backward(grad)
    row_layout = expanded_row_idx.view(k, n).T.reshape(-1)
    want = grad_reference(grad, row_layout, k, 0, active_num * k, order=order)
    assert_bitwise_equal(want, x.grad, "grad_x")


def test_init_routing_v1_checks():
    x, expert_idx = torch.randn(3, 2), torch.tensor([[1, 0], [2, 1], [0, 2]], dtype=I32)
    f = torch_npu.npu_moe_init_routing
    with pytest.raises(ValueError, match=r"npu_moe_init_routing: row_idx\[0\]\[1\] must be t\*N \+ i = 3"):
        f(x, torch.arange(6, dtype=I32).view(3, 2), expert_idx, 3)
    with pytest.raises(ValueError, match="npu_moe_init_routing: active_num must be >= 0, got -1"):
        f(x, column_row_idx(3, 2), expert_idx, -1)
    with pytest.raises(ValueError, match="npu_moe_init_routing: row_idx must be one of int32, got int64"):
        f(x, column_row_idx(3, 2).long(), expert_idx, 3)
    with pytest.raises(ValueError, match="npu_moe_init_routing: expert_idx must have x's 4 rows, got 3"):
        f(torch.randn(4, 2), column_row_idx(3, 2), expert_idx, 3)
    with pytest.raises(IndexError, match=r"^npu_moe_init_routing: expert_idx\[1\]\[0\] must be >= 0 "
                                         r"\(expert ids are never negative\), got -2$"):
        f(x, column_row_idx(3, 2), torch.tensor([[1, 0], [-2, 1], [0, 2]], dtype=I32), 3)


# ---- npu_moe_init_routing_v2 -----------------------------------------------------------------

def v2_torch_npu_reference(x, expert_idx, **kw):
    """torch_npu's output conventions over the V3/V4 routing (reference.v4_reference): four outputs;
    expanded_x and expanded_scale cut to min(active_num, N*K) rows in dropless mode when
    active_num > 0; the key-value count shape [expert_num, 2] whatever the flag."""
    active_num = kw.get("active_num", -1)
    ex, eri, counts, scale, _ = v4_reference(x, expert_idx, **kw)
    if kw.get("drop_pad_mode", 0) == 0 and active_num > 0:
        rows = min(active_num, expert_idx.numel())
        ex, scale = ex[:rows], scale[:rows]
    if not kw.get("expert_tokens_num_flag", False) and kw.get("expert_tokens_num_type", 0) == 2:
        counts = torch.zeros(kw["expert_num"], 2, dtype=I64)
    return ex, eri, counts, scale


V2_CASES = [
    dict(expert_num=6),
    dict(expert_num=6, active_num=7, expert_tokens_num_type=1, expert_tokens_num_flag=True),
    dict(expert_num=6, active_num=100, expert_tokens_num_type=0, expert_tokens_num_flag=True),
    dict(expert_num=6, active_num=-3),
    # vllm-ascend's call: active_num = N*K, counts, an expert-parallel range.
    dict(expert_num=6, active_num=24, expert_tokens_num_type=1, expert_tokens_num_flag=True,
         active_expert_range=[2, 5]),
    dict(expert_num=6, active_num=5, active_expert_range=[1, 4], row_idx_type=1),
    dict(expert_num=6, expert_tokens_num_type=2, expert_tokens_num_flag=True),
    dict(expert_num=6, expert_tokens_num_type=2),
    dict(expert_num=6, expert_capacity=3, drop_pad_mode=1, expert_tokens_num_type=1, expert_tokens_num_flag=True),
    dict(expert_num=6, quant_mode=1, active_num=9),
    dict(expert_num=6, quant_mode=0),
]


@pytest.mark.parametrize("numerics", ["atlas_a2", "ascend_950"])
@pytest.mark.parametrize("case", range(len(V2_CASES)))
def test_init_routing_v2_outputs(case, numerics):
    kw = dict(V2_CASES[case])
    gen = torch.Generator().manual_seed(case)
    x, expert_idx = routing_case(gen, 8, 3, 6, torch.bfloat16 if case % 2 else torch.float32)
    if kw.get("quant_mode") == 0:
        kw.update(scale=torch.tensor([1.7]), offset=torch.tensor([0.25]))
    elif kw.get("quant_mode", -1) == -1 and case % 3 == 0:
        kw["scale"] = torch.rand(8, generator=gen)
    got = torch_npu.npu_moe_init_routing_v2(x, expert_idx, numerics=numerics, **kw)
    assert len(got) == 4
    want = v2_torch_npu_reference(x, expert_idx, numerics=numerics, **kw)
    for w, g, what in zip(want, got, ("expanded_x", "expanded_row_idx", "expert_token_cumsum_or_count",
                                      "expanded_scale")):
        assert_bitwise_equal(w, g, what)


def test_init_routing_v2_empty_range_means_all_experts():
    gen = torch.Generator().manual_seed(5)
    x, expert_idx = routing_case(gen, 5, 2, 4)
    default = torch_npu.npu_moe_init_routing_v2(x, expert_idx, expert_num=4, expert_tokens_num_flag=True)
    explicit = torch_npu.npu_moe_init_routing_v2(x, expert_idx, expert_num=4, expert_tokens_num_flag=True,
                                                 active_expert_range=[0, 4])
    for a, b in zip(default, explicit):
        assert_bitwise_equal(a, b)
    # Each call substitutes its own expert_num (torch_npu's C++ keeps the first call's).
    other = torch_npu.npu_moe_init_routing_v2(x, expert_idx % 3, expert_num=3, expert_tokens_num_flag=True)
    assert other[2].shape == (3,)


def test_init_routing_v2_checks():
    gen = torch.Generator().manual_seed(6)
    x, expert_idx = routing_case(gen, 5, 2, 4)
    f = torch_npu.npu_moe_init_routing_v2
    with pytest.raises(TypeError):
        f(x, expert_idx, None)  # keyword-only after expert_idx, as in torch_npu's schema
    with pytest.raises(ValueError, match="npu_moe_init_routing_v2: expert_num must be >= 1, got -1"):
        f(x, expert_idx)
    with pytest.raises(ValueError, match="npu_moe_init_routing_v2: active_expert_range"):
        f(x, expert_idx, expert_num=4, active_expert_range=2)  # int[2] broadcasts 2 to [2, 2]: empty
    with pytest.raises(ValueError, match="npu_moe_init_routing_v2: active_expert_range"):
        f(x, expert_idx, expert_num=4, active_expert_range=[1, 2, 3])
    with pytest.raises(NotImplementedError, match="npu_moe_init_routing_v2: x_dtype must be None"):
        f(x, expert_idx, expert_num=4, x_dtype=1)
    with pytest.raises(ValueError, match="npu_moe_init_routing_v2: x must be 2-D"):
        f(x.view(-1), expert_idx, expert_num=4)
    with pytest.raises(ValueError, match="npu_moe_init_routing_v2: expert_capacity must be an int, got 2.0"):
        f(x, expert_idx, expert_num=4, drop_pad_mode=1, expert_capacity=2.0)  # was the schema's RuntimeError


def test_an_int_outside_int64_is_a_value_error_naming_the_function():
    # Each was PyTorch's schema RuntimeError, from the operator underneath.
    gen = torch.Generator().manual_seed(6)
    x, expert_idx = routing_case(gen, 5, 2, 4)
    f = torch_npu.npu_moe_init_routing_v2
    with pytest.raises(ValueError, match=f"^npu_moe_init_routing_v2: expert_num must be an int within int64, "
                                         f"got {2**70}$"):
        f(x, expert_idx, expert_num=2**70)  # was the schema's RuntimeError
    with pytest.raises(ValueError, match=f"^npu_moe_compute_expert_tokens: num_expert must be an int within int64, "
                                         f"got {2**64}$"):
        torch_npu.npu_moe_compute_expert_tokens(torch.zeros(3, dtype=torch.int32), 2**64)
    rows, index = torch.randn(8, 3), torch.arange(8, dtype=torch.int32)
    with pytest.raises(ValueError, match=f"^npu_moe_finalize_routing: k must be an int within int64, got {2**63}$"):
        torch_npu.npu_moe_finalize_routing(rows, None, None, None, None, index, None, k=2**63)


def test_init_routing_v2_is_differentiable():
    gen = torch.Generator().manual_seed(7)
    x, expert_idx = routing_case(gen, 6, 3, 5)
    scale = torch.rand(6, generator=gen)
    x.requires_grad_(True)
    scale.requires_grad_(True)
    ex, eri, _, es = torch_npu.npu_moe_init_routing_v2(x, expert_idx, scale=scale, active_num=11, expert_num=5,
                                                       active_expert_range=[1, 5])
    g, gs = random_values(ex.shape, torch.float32, gen), random_values(es.shape, torch.float32, gen)
    torch.autograd.backward([ex, es], [g, gs])
    assert_bitwise_equal(grad_reference(g, eri, 3, 0, 11), x.grad, "grad_x")
    assert_bitwise_equal(grad_reference(gs.view(-1, 1), eri, 3, 0, 11).view(-1), scale.grad, "grad_scale")


# ---- npu_moe_finalize_routing ----------------------------------------------------------------

def finalize_case(seed, n, k, h, e, dtype):
    """(rows [N*K, H], index (a permutation), skip1, skip2, bias, scales, expert ids)."""
    gen = torch.Generator().manual_seed(seed)
    rows = random_values((n * k, h), dtype, gen)
    index = torch.randperm(n * k, generator=gen).to(I32)
    skip1, skip2 = random_values((n, h), dtype, gen), random_values((n, h), dtype, gen)
    bias = random_values((e, h), dtype, gen)
    scales = random_values((n, k), dtype, gen)
    return rows, index, skip1, skip2, bias, scales, torch.randint(0, e, (n, k), generator=gen, dtype=I32)


def test_finalize_routing_is_moe_finalize_routing_with_torch_npu_s_names():
    rows, index, skip1, skip2, bias, scales, experts = finalize_case(8, 5, 3, 4, 4, torch.float16)
    for mode in (0, 2):
        want = moe_routing.moe_finalize_routing(rows, index, skip1, skip2, bias, scales, experts, drop_pad_mode=mode)
        positional = torch_npu.npu_moe_finalize_routing(rows, skip1, skip2, bias, scales, index, experts, mode)
        schema_kw = torch_npu.npu_moe_finalize_routing(
            expanded_permuted_rows=rows, skip1=skip1, skip2=skip2, bias=bias, scales=scales,
            expanded_src_to_dst_row=index, export_for_source_row=experts, drop_pad_mode=mode)
        doc_kw = torch_npu.npu_moe_finalize_routing(rows, skip1, skip2, bias, scales, index,
                                                    expert_for_source_row=experts, drop_pad_mode=mode)
        for got in (positional, schema_kw, doc_kw):
            assert_bitwise_equal(want, got)


def test_finalize_routing_formula_in_float32():
    # K = 2, float32: out = skip1 + skip2 + s0 * (row0 + b0) + s1 * (row1 + b1), added left to right.
    n, k = 4, 2
    rows, index, skip1, skip2, bias, scales, experts = finalize_case(9, n, k, 5, 3, torch.float32)
    col = index.view(k, n)  # drop_pad_mode 0: pair (i, t) at t*N + i
    want = skip1 + skip2
    for t in range(k):
        want = want + scales[:, t:t + 1] * (rows[col[t].long()] + bias[experts[:, t].long()])
    got = torch_npu.npu_moe_finalize_routing(rows, skip1, skip2, bias, scales, index, experts, 0)
    assert_bitwise_equal(want, got)


def test_finalize_routing_argument_rules():
    rows, index = torch.randn(4, 3), torch.arange(4, dtype=I32)
    f = torch_npu.npu_moe_finalize_routing
    with pytest.raises(TypeError, match="pass one, got both"):
        f(rows, None, None, None, None, index, export_for_source_row=None, expert_for_source_row=None)
    with pytest.raises(TypeError, match="missing required argument export_for_source_row"):
        f(rows, None, None, None, None, index)
    with pytest.raises(TypeError):
        f(rows, index)  # skip1 .. scales have no defaults, as in torch_npu's schema
    with pytest.raises(ValueError, match="npu_moe_finalize_routing: skip2 needs skip1"):
        f(rows, None, torch.randn(4, 3), None, None, index, None, 2)
    with pytest.raises(IndexError, match=r"^npu_moe_finalize_routing: expanded_src_to_dst_row\[1\] must be in \[0, 4\) "
                                         r"\(-1 marks a dropped pair\), got 9$"):
        f(rows, None, None, None, None, torch.tensor([0, 9, 1, 2], dtype=I32), None, 2)
    # The core's name for k (top_k, and K for the length without scales) named no argument of this call.
    with pytest.raises(ValueError, match=r"npu_moe_finalize_routing: k must be 1 or scales.size\(1\) \(2\) when "
                                         r"scales is given, got 4"):
        f(torch.randn(8, 3), None, None, None, torch.rand(2, 2), torch.arange(8, dtype=I32), None, 0, 4)
    with pytest.raises(ValueError, match="npu_moe_finalize_routing: k must be >= 1, got 0"):
        f(rows, None, None, None, None, index, None, 0, 0)
    with pytest.raises(ValueError, match=r"^npu_moe_finalize_routing: len\(expanded_src_to_dst_row\) must be a "
                                         r"multiple of k \(3\), got 4$"):
        f(rows, None, None, None, None, index, None, 2, 3)
    # Compiled, the operator's fake kernel refuses k at trace time, in the operator's name (docs/porting.md)
    # and with the argument's: k.
    torch._dynamo.reset()
    compiled = torch.compile(lambda r, i: f(r, None, None, None, None, i, None, 0, 0), fullgraph=True,
                             backend="eager")
    with pytest.raises(Exception, match=re.escape("ValueError('moe_finalize_routing: k must be >= 1, got 0')")):
        compiled(rows, index)
    out = f(rows, None, None, None, None, index, None, None, None)  # optional ints accept None
    assert_bitwise_equal(moe_routing.moe_finalize_routing(rows, index), out)


def test_v1_pipeline_init_compute_finalize():
    """torch_npu's V1 pipeline: init_routing -> compute_expert_tokens -> experts -> finalize
    (drop_pad_mode 0, column layout), against plain PyTorch per expert."""
    gen = torch.Generator().manual_seed(10)
    n, k, h, e = 7, 2, 4, 3
    x, expert_idx = routing_case(gen, n, k, e, h=h)
    weights = random_values((e, h), torch.float32, gen)  # expert j scales its rows by weights[j]
    scales = random_values((n, k), torch.float32, gen)
    skip1 = random_values((n, h), torch.float32, gen)
    expanded_x, expanded_row_idx, expanded_expert_idx = torch_npu.npu_moe_init_routing(
        x, column_row_idx(n, k), expert_idx, n)
    ends = torch_npu.npu_moe_compute_expert_tokens(expanded_expert_idx, e)
    starts = torch.cat([torch.zeros(1, dtype=I32), ends[:-1]])
    expert_out = torch.cat([expanded_x[s:t] * weights[j] for j, (s, t) in enumerate(zip(starts, ends))])
    out = torch_npu.npu_moe_finalize_routing(expert_out, skip1, None, None, scales, expanded_row_idx, expert_idx, 0)
    # float32 under atlas_a2: acc = skip1 + 0 (no skip2), then per slot (row + 0) * scale added in order.
    want = skip1 + 0
    for t in range(k):
        want = want + ((x * weights[expert_idx[:, t].long()]) + 0) * scales[:, t:t + 1]
    assert_bitwise_equal(want, out)


# ---- npu_moe_token_permute -------------------------------------------------------------------

def permute_reference(tokens, indices, num_out_tokens=None):
    """The documented semantics: a stable sort of the flattened indices (the dtype's min and max
    first and last); sorted_indices[p] = row of pair p; permuted_tokens[d] = tokens[pair // K]."""
    k = 1 if indices.dim() == 1 else indices.shape[1]
    flat = indices.reshape(-1).double()  # float keys, as the device sorts them (exact below 2^24)
    order = torch.argsort(flat, stable=True)
    sorted_indices = torch.empty_like(order, dtype=I32)
    sorted_indices[order] = torch.arange(order.numel(), dtype=I32)
    pairs = order.numel()
    n_out = 0 if num_out_tokens is None else num_out_tokens
    rows = min(n_out, pairs) if n_out > 0 else pairs + n_out
    return tokens[order[:rows] // k], sorted_indices


def megatron_legacy_permute(tokens, indices, num_out_tokens=None):
    """Megatron-Core <= v0.9's permute(tokens, indices, num_out_tokens): its sorted_indices is row
    -> pair, the inverse of torch_npu's (op-plugin's test states the relation)."""
    k = 1 if indices.dim() == 1 else indices.shape[1]
    sorted_legacy = torch.argsort(indices.reshape(-1), stable=True)
    rows = sorted_legacy.numel() if num_out_tokens is None else num_out_tokens
    return tokens.index_select(0, sorted_legacy[:rows] // k), sorted_legacy


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("index_dtype", [I32, I64])
@pytest.mark.parametrize("num_out_tokens", [None, 0, 5, 1000, -4])
def test_token_permute_matches_documented_semantics(dtype, index_dtype, num_out_tokens):
    gen = torch.Generator().manual_seed(11)
    tokens = random_values((6, 5), dtype, gen)
    indices = torch.randint(0, 4, (6, 3), generator=gen).to(index_dtype)
    got = torch_npu.npu_moe_token_permute(tokens, indices, num_out_tokens)
    want = permute_reference(tokens, indices, num_out_tokens)
    assert_bitwise_equal(want[0], got[0], "permuted_tokens")
    assert_bitwise_equal(want[1], got[1], "sorted_indices")
    if num_out_tokens is None or num_out_tokens > 0:
        legacy_tokens, legacy_sorted = megatron_legacy_permute(tokens, indices.long(), num_out_tokens)
        assert_bitwise_equal(legacy_tokens, got[0])
        assert torch.equal(torch.argsort(legacy_sorted).to(I32), got[1])


def test_token_permute_one_dimensional_indices_and_sentinels():
    gen = torch.Generator().manual_seed(12)
    tokens = random_values((6, 3), torch.float32, gen)
    for dtype in (I32, I64):
        info = torch.iinfo(dtype)
        indices = torch.tensor([3, info.max, 0, info.min, 3, 1], dtype=dtype)
        got = torch_npu.npu_moe_token_permute(tokens, indices, num_out_tokens=-1)
        want = permute_reference(tokens, indices, num_out_tokens=-1)  # the max sentinel sorts last: cut first
        assert_bitwise_equal(want[0], got[0])
        assert_bitwise_equal(want[1], got[1])
        assert got[1].tolist() == [3, 5, 1, 0, 4, 2]


def test_token_permute_backward_adds_slots_in_order_in_float32():
    gen = torch.Generator().manual_seed(13)
    n, k = 5, 4
    tokens = random_values((n, 7), torch.bfloat16, gen).requires_grad_(True)
    indices = torch.randint(0, 3, (n, k), generator=gen, dtype=I64)
    permuted, sorted_indices = torch_npu.npu_moe_token_permute(tokens, indices, num_out_tokens=13)
    grad = random_values(permuted.shape, torch.bfloat16, gen)
    permuted.backward(grad)
    want = torch.zeros(n, 7)
    for i in range(n):
        for t in range(k):
            row = int(sorted_indices[i * k + t])
            if row < 13:  # rows that were cut get nothing
                want[i] = want[i] + grad[row].float()
    assert_bitwise_equal(want.to(torch.bfloat16), tokens.grad)


def test_token_permute_checks():
    tokens, indices = torch.randn(3, 2), torch.tensor([[0, 1], [2, 1], [1, 0]])
    f = torch_npu.npu_moe_token_permute
    with pytest.raises(ValueError, match="npu_moe_token_permute: padded_mode must be False"):
        f(tokens, indices, None, True)
    with pytest.raises(ValueError, match="npu_moe_token_permute: num_out_tokens must be >= -6, got -7"):
        f(tokens, indices, -7)
    with pytest.raises(IndexError, match=r"npu_moe_token_permute: indices\[1\]\[0\] must be in \[0, 16777216\)"
                                         r".*got -2"):
        f(tokens, torch.tensor([[0, 1], [-2, 1], [1, 0]]))
    with pytest.raises(IndexError, match=r"indices\[2\]\[1\] must be in .*got 16777216"):
        f(tokens, torch.tensor([[0, 1], [2, 1], [1, 1 << 24]], dtype=I32))
    with pytest.raises(ValueError, match="npu_moe_token_permute: indices must have tokens' 3 rows, got 2"):
        f(tokens, indices[:2])
    with pytest.raises(ValueError, match="npu_moe_token_permute: indices must be one of int32, int64, got float32"):
        f(tokens, indices.float())


# ---- npu_moe_token_unpermute -----------------------------------------------------------------

def unpermute_reference(permuted, sorted_indices, probs=None, skip_zero=True):
    """The documented sum with A2's kernel arithmetic as docs/porting.md models it: float32, +0,
    then prob * row (float32 product) for t = 0 .. K-1, a pair skipped when its index is -1 or
    >= R, or (skip_zero) its prob is 0; one round-to-nearest-even narrowing. Without probs one
    row per pair, copied."""
    rows, h = permuted.shape
    idx = sorted_indices.long()
    if probs is None:
        out = torch.zeros(idx.numel(), h, dtype=permuted.dtype)
        live = (idx >= 0) & (idx < rows)
        out[live] = permuted[idx[live]]
        return out
    n, k = probs.shape
    acc = torch.zeros(n, h)
    for i in range(n):
        for t in range(k):
            r, p = int(idx[i * k + t]), probs[i, t].float()
            if r < 0 or r >= rows or (skip_zero and p == 0):
                continue
            acc[i] = acc[i] + permuted[r].float() * p
    return acc.to(permuted.dtype)


def unpermute_grad_reference(grad_out, permuted, sorted_indices, probs, numerics):
    """grad_permuted[idx[p]] = float32(g[i]) * float32(prob) narrowed (rows no pair reads: 0);
    grad_probs[p] = the float32 products row * g summed in the numerics' order (0 for a pair whose
    index is -1 or >= R) - moe_finalize_routing_grad's orders, finalize_reference.grad_scales_sum."""
    rows, h = permuted.shape
    n, k = probs.shape
    grad_permuted = torch.zeros(rows, h, dtype=permuted.dtype)
    grad_probs = torch.zeros(n, k)
    for i in range(n):
        for t in range(k):
            r = int(sorted_indices[i * k + t])
            if r < 0 or r >= rows:
                continue
            grad_permuted[r] = (grad_out[i].float() * probs[i, t].float()).to(permuted.dtype)
            products = (permuted[r].float() * grad_out[i].float()).numpy().astype(np.float32)
            with np.errstate(all="ignore"):  # Inf rows make NaN sums on purpose
                grad_probs[i, t] = float(grad_scales_sum(products, numerics, atlas_chunk(grad_out.dtype, False)))
    return grad_permuted, grad_probs.to(probs.dtype)


@pytest.mark.parametrize("dtype,probs_dtype", [(torch.float32, torch.float32), (torch.float16, torch.float16),
                                               (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                               (torch.float16, torch.float32), (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("numerics", ["atlas_a2", "ascend_950"])
def test_token_unpermute_forward_and_backward(dtype, probs_dtype, numerics):
    gen = torch.Generator().manual_seed(14)
    n, k, h, cut = 5, 3, 9, 2
    permuted = random_values((n * k - cut, h), dtype, gen)
    sorted_indices = torch.randperm(n * k, generator=gen).to(I32)  # the two highest rows were cut
    probs = random_values((n, k), probs_dtype, gen)
    probs[1, 2] = 0  # a masked expert: skipped under atlas_a2 ...
    permuted[int(sorted_indices[1 * k + 2])] = float("inf")  # ... so its Inf row does not poison token 1
    permuted.requires_grad_(True)
    probs.requires_grad_(True)
    out = torch_npu.npu_moe_token_unpermute(permuted, sorted_indices, probs, numerics=numerics)
    want = unpermute_reference(permuted.detach(), sorted_indices, probs.detach(), skip_zero=numerics == "atlas_a2")
    assert_same(want, out, "out")
    assert torch.isfinite(out[1]).all() == (numerics == "atlas_a2")
    grad_out = random_values(out.shape, dtype, gen)
    out.backward(grad_out)
    want_permuted, want_probs = unpermute_grad_reference(grad_out, permuted.detach(), sorted_indices,
                                                         probs.detach(), numerics)
    assert_same(want_permuted, permuted.grad, "grad_permuted_tokens")
    assert_same(want_probs, probs.grad, "grad_probs")
    assert not torch.equal(probs.grad[1, 2], torch.zeros((), dtype=probs_dtype))  # a zero prob keeps its gradient


def test_token_unpermute_without_probs_copies_rows():
    gen = torch.Generator().manual_seed(15)
    permuted = random_values((7, 4), torch.float32, gen)
    permuted[2, 1] = -0.0
    sorted_indices = torch.randperm(8, generator=gen)  # int64, as torch_npu's docstring shows
    permuted.requires_grad_(True)
    out = torch_npu.npu_moe_token_unpermute(permuted, sorted_indices)
    assert_bitwise_equal(unpermute_reference(permuted.detach(), sorted_indices), out)
    out.backward(torch.arange(32.0).view(8, 4))
    assert torch.equal(permuted.grad, torch.arange(32.0).view(8, 4)[torch.argsort(sorted_indices)[:7]])


def test_token_permute_unpermute_round_trip():
    gen = torch.Generator().manual_seed(16)
    tokens = random_values((6, 5), torch.bfloat16, gen)
    indices = torch.randint(0, 4, (6, 2), generator=gen, dtype=I32)
    probs = torch.full((6, 2), 0.5, dtype=torch.bfloat16)
    permuted, sorted_indices = torch_npu.npu_moe_token_permute(tokens, indices)
    assert_bitwise_equal(tokens, torch_npu.npu_moe_token_unpermute(permuted, sorted_indices, probs))


def test_token_unpermute_after_init_routing_v2_with_a_range_vllm_style():
    """vllm-ascend feeds npu_moe_init_routing_v2's expanded_row_idx (-1 for other ranks' experts)
    through abs() into npu_moe_token_unpermute with those experts' weights zeroed: the zero-prob
    skip keeps row 1 (which -1 became) out of their tokens."""
    gen = torch.Generator().manual_seed(17)
    x, expert_idx = routing_case(gen, 6, 2, 6)
    ex, eri, _, _ = torch_npu.npu_moe_init_routing_v2(x, expert_idx, active_num=12, expert_num=6,
                                                      active_expert_range=[2, 6])
    weights = torch.rand(6, 2, generator=gen)
    local = (expert_idx >= 2) & (expert_idx < 6)
    out = torch_npu.npu_moe_token_unpermute(ex, eri.abs(), torch.where(local, weights, 0.0))
    want = torch.zeros(6, 6)
    for i in range(6):
        for t in range(2):
            if local[i, t]:
                want[i] = want[i] + x[i] * weights[i, t]
    assert_bitwise_equal(want, out)


def test_token_unpermute_checks():
    permuted, idx, probs = torch.randn(4, 3), torch.tensor([0, 1, 2, 3], dtype=I32), torch.rand(2, 2)
    f = torch_npu.npu_moe_token_unpermute
    with pytest.raises(IndexError, match=r"npu_moe_token_unpermute: sorted_indices\[2\] must be in \[-1, 4\).*got 4"):
        f(permuted, torch.tensor([0, 1, 4, 3], dtype=I32), probs)
    with pytest.raises(IndexError, match=r"sorted_indices\[0\] must be in \[-1, 4\).*got -2147483649"):
        f(permuted, torch.tensor([-2**31 - 1, 1, 2, 3]))
    with pytest.raises(ValueError, match=r"npu_moe_token_unpermute: probs must have one entry per pair \(4"):
        f(permuted, idx, torch.rand(3, 2))
    with pytest.raises(ValueError, match="npu_moe_token_unpermute: padded_mode must be False"):
        f(permuted, idx, probs, True)
    with pytest.raises(ValueError, match='npu_moe_token_unpermute: numerics must be "atlas_a2" or "ascend_950"'):
        f(permuted, idx, probs, numerics="a3")
    with pytest.raises(ValueError, match="npu_moe_token_unpermute: probs must be one of float32"):
        f(permuted, idx, probs.double())
    assert f(permuted, idx, probs, restore_shape=[2, 3]).shape == (2, 3)  # ignored, as in torch_npu


def test_inputs_on_another_device_are_named():
    """The meta device stands in for a second device. The ports combine these tensors in PyTorch ops
    of their own before any operator checks devices: the results were RuntimeErrors from those ops
    (or .item() on a meta tensor) naming no function or argument."""
    gen = torch.Generator().manual_seed(31)
    x, expert_idx = routing_case(gen, 4, 2, 3)
    permuted, sorted_indices = torch_npu.npu_moe_token_permute(x, expert_idx)
    probs = torch.rand(4, 2)
    meta = lambda t: t.to("meta")
    calls = [
        ("npu_moe_init_routing: row_idx must be on cpu \\(the device of x\\), got meta",
         lambda: torch_npu.npu_moe_init_routing(x, meta(column_row_idx(4, 2)), expert_idx, 4)),
        ("npu_moe_token_permute: indices must be on cpu \\(the device of tokens\\), got meta",
         lambda: torch_npu.npu_moe_token_permute(x, meta(expert_idx))),
        ("npu_moe_token_unpermute: sorted_indices must be on cpu \\(the device of permuted_tokens\\), got meta",
         lambda: torch_npu.npu_moe_token_unpermute(permuted, meta(sorted_indices), probs)),
        ("npu_moe_token_unpermute: probs must be on cpu \\(the device of permuted_tokens\\), got meta",
         lambda: torch_npu.npu_moe_token_unpermute(permuted, sorted_indices, meta(probs))),
    ]
    for message, call in calls:
        with pytest.raises(ValueError, match=message):
            call()


def test_empty_inputs():
    """No tokens, or every row cut: empty outputs of the documented shapes, gradients of zeros."""
    x, idx = torch.randn(0, 3, requires_grad=True), torch.zeros(0, 2, dtype=I32)
    permuted, sorted_indices = torch_npu.npu_moe_token_permute(x, idx)
    assert permuted.shape == (0, 3) and sorted_indices.shape == (0,)
    assert torch_npu.npu_moe_token_unpermute(permuted, sorted_indices, torch.zeros(0, 2)).shape == (0, 3)
    assert [t.shape for t in torch_npu.npu_moe_init_routing(x, idx, idx, 3)] == [(0, 3), (0,), (0,)]
    x = torch.randn(3, 4, requires_grad=True)
    probs = torch.rand(3, 2, requires_grad=True)
    permuted, sorted_indices = torch_npu.npu_moe_token_permute(x, torch.zeros(3, 2, dtype=I32), -6)
    out = torch_npu.npu_moe_token_unpermute(permuted * 2, sorted_indices, probs)
    assert permuted.shape == (0, 4) and torch.equal(out, torch.zeros(3, 4))
    out.sum().backward()
    assert torch.equal(probs.grad, torch.zeros(3, 2)) and torch.equal(x.grad, torch.zeros(3, 4))
    expanded_x, _, _ = torch_npu.npu_moe_init_routing(x, column_row_idx(3, 2), torch.zeros(3, 2, dtype=I32), 0)
    assert expanded_x.shape == (0, 4)


# ---- npu_moe_compute_expert_tokens -----------------------------------------------------------

def test_compute_expert_tokens():
    f = torch_npu.npu_moe_compute_expert_tokens
    assert f(torch.tensor([0, 0, 0, 1, 1, 2], dtype=I32), 3).tolist() == [3, 5, 6]
    assert f(torch.tensor([0, 2, 2, 4], dtype=I32), 6).tolist() == [1, 1, 3, 3, 4, 4]  # empty experts repeat
    gen = torch.Generator().manual_seed(18)
    ids = torch.sort(torch.randint(0, 40, (300,), generator=gen, dtype=I32)).values
    got = f(ids, 50)
    assert got.dtype == I32 and got.shape == (50,)
    assert torch.equal(got, torch.searchsorted(ids, torch.arange(50, dtype=I32), right=True).to(I32))
    assert f(torch.empty(0, dtype=I32), 2).tolist() == [0, 0]
    with pytest.raises(IndexError, match=r"npu_moe_compute_expert_tokens: sorted_expert_for_source_row\[2\] must be "
                                         r"in \[0, 3\).*got 3"):
        f(torch.tensor([0, 1, 3], dtype=I32), 3)
    with pytest.raises(ValueError, match="npu_moe_compute_expert_tokens: num_expert must be >= 1, got 0"):
        f(torch.tensor([0], dtype=I32), 0)
    with pytest.raises(ValueError, match="sorted_expert_for_source_row must be one of int32, got int64"):
        f(torch.tensor([0]), 1)


def test_compute_expert_tokens_num_expert_beyond_int32_names_num_expert():
    # The ids' range check compared int32 ids with num_expert as an int32 scalar: 2**31 wrapped
    # and the valid id 0 was reported as out of range instead of num_expert as too large.
    for num_expert in (2**31, 2**40):
        with pytest.raises(ValueError, match=rf"npu_moe_compute_expert_tokens: num_expert must be at most "
                                             rf"2147483647 .*got {num_expert}"):
            torch_npu.npu_moe_compute_expert_tokens(torch.tensor([0, 1], dtype=I32), num_expert)


# ---- torch.compile ---------------------------------------------------------------------------

def test_compile_fullgraph_pipeline_bit_for_bit():
    """V2 dispatch -> a linear expert -> token unpermute (atlas_a2: the zero-prob skip's autograd
    function), and the V1 path, compiled with fullgraph=True, forward and backward."""

    def v2_layer(x, expert_idx, weight, probs):
        ex, eri, _, _ = torch_npu.npu_moe_init_routing_v2(x, expert_idx, active_num=x.shape[0] * 2, expert_num=4)
        return torch_npu.npu_moe_token_unpermute(ex * weight, eri, probs)

    def v1_layer(x, expert_idx, probs):
        ex, eri, _ = torch_npu.npu_moe_init_routing(x, column_row_idx(x.shape[0], 2), expert_idx, x.shape[0])
        return torch_npu.npu_moe_finalize_routing(ex, None, None, None, probs, eri, None, 0)

    def permute_layer(x, expert_idx, probs):
        permuted, sorted_indices = torch_npu.npu_moe_token_permute(x, expert_idx, -3)
        return torch_npu.npu_moe_token_unpermute(permuted, sorted_indices, probs, numerics="ascend_950")

    gen = torch.Generator().manual_seed(19)
    x, expert_idx = routing_case(gen, 6, 2, 4)
    probs = torch.rand(6, 2, generator=gen)
    probs[2, 1] = 0
    weight = torch.rand(6, generator=gen)
    # x and probs get gradients (weight's would be a reduction of PyTorch's, which inductor may reorder).
    cases = [(v2_layer, (x, expert_idx, weight, probs), "inductor", None),
             (v1_layer, (x, expert_idx, probs), "aot_eager", None),
             (permute_layer, (x, expert_idx, probs), "aot_eager", True)]  # dynamic shapes
    for layer, args, backend, dynamic in cases:
        results = []
        for fn in (layer, torch.compile(layer, fullgraph=True, backend=backend, dynamic=dynamic)):
            leaves = [a.detach().clone().requires_grad_(a is x or a is probs) for a in args]
            out = fn(*leaves)
            out.backward(torch.ones_like(out))
            results.append([out] + [a.grad for a in leaves if a.requires_grad])
        for eager, compiled in zip(*results):
            assert_bitwise_equal(eager, compiled, layer.__name__)


def test_compiled_unpermute_refuses_int64_indices_beyond_int32():
    """Compiled code has no data checks: an int64 sorted_indices value that a plain int32 cast
    would wrap onto a valid row (2**32 + 1 -> 1) must reach the operator as INT32_MIN and be
    refused, not read row 1."""
    permuted, probs = torch.randn(4, 3), torch.rand(2, 2)
    index = torch.tensor([0, 1, 2**32 + 1, 3])
    compiled = torch.compile(torch_npu.npu_moe_token_unpermute, fullgraph=True, backend="aot_eager")
    with pytest.raises(IndexError, match=r"^moe_finalize_routing: expanded_row_idx\[2\] must be in \[0, 4\) "
                                         r"\(-1 marks a dropped pair\), got -2147483648$"):
        compiled(permuted, index, probs)


# (function, argument, the bool given, a call taking (x, expert_idx, rows, index, flag)): every int argument of
# every function that has one (npu_moe_token_unpermute's restore_shape is ignored, as torch_npu ignores it). The
# bool cases give the flag, the tensor cases a tensor for it.
INT_ARGUMENT_CASES = [
    ("npu_moe_init_routing", "active_num", True,
     lambda x, i, r, e, b: torch_npu.npu_moe_init_routing(x, column_row_idx(4, 2), i, b)),
    *[("npu_moe_init_routing_v2", name, flag,
       lambda x, i, r, e, b, name=name: torch_npu.npu_moe_init_routing_v2(x, i, **{"expert_num": 4, name: b}))
      for name, flag in MOE_INIT_ROUTING_INT_ARGUMENTS],
    ("npu_moe_finalize_routing", "drop_pad_mode", False,
     lambda x, i, r, e, b: torch_npu.npu_moe_finalize_routing(r, None, None, None, None, e, None, b, 2)),
    ("npu_moe_finalize_routing", "k", True,
     lambda x, i, r, e, b: torch_npu.npu_moe_finalize_routing(r, None, None, None, None, e, None, k=b)),
    ("npu_moe_token_permute", "num_out_tokens", True, lambda x, i, r, e, b: torch_npu.npu_moe_token_permute(x, i, b)),
    ("npu_moe_token_permute_with_routing_map", "num_out_tokens", True,
     lambda x, i, r, e, b: torch_npu.npu_moe_token_permute_with_routing_map(
         x, torch.zeros(4, 4, dtype=torch.bool).scatter_(1, i.long(), True), num_out_tokens=b)),
    ("npu_moe_compute_expert_tokens", "num_expert", True,
     lambda x, i, r, e, b: torch_npu.npu_moe_compute_expert_tokens(e, b)),
]


@pytest.mark.parametrize("function,argument,flag,call", INT_ARGUMENT_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in INT_ARGUMENT_CASES])
def test_compiled_call_refuses_a_bool_for_an_int(function, argument, flag, call):
    """A bool for an int argument is eager's ValueError under torch.compile(fullgraph=True) too, naming the
    function: the ints passed on to an operator were refused only by the operator, which under torch.compile
    skipped the check (PyTorch's schema took the bool as 1 or 0) and could not have been renamed anyway."""
    x, idx = torch.randn(4, 3), torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0]], dtype=I32)
    rows, index = torch.randn(8, 3), torch.arange(8, dtype=I32)
    message = f"{function}: {argument} must be an int, got {flag}"
    with pytest.raises(ValueError, match=f"^{message}$"):
        call(x, idx, rows, index, flag)  # eager: the same message
    assert_compiled_raises_value_error(message, call, x, idx, rows, index, flag)


@pytest.mark.parametrize("value", NON_INT_TENSORS, ids=NON_INT_TENSOR_IDS)
@pytest.mark.parametrize("function,argument,flag,call", INT_ARGUMENT_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in INT_ARGUMENT_CASES])
def test_a_non_int_tensor_for_an_int_is_refused_alike_by_check_int_and_refuse_non_ints(function, argument, flag,
                                                                                        call, value):
    """A tensor other than a 0-dim integer one for an int argument, eager and compiled. refuse_non_ints (once
    refuse_bools: the ints handed on to an operator) let a floating one through, which the operator took as its
    truncation (k=torch.tensor(2.5) as 2), compiled too; check_int (active_num, num_out_tokens, num_expert) took
    a complex one as int() does (2.5+0j as 2). A bool one they refused in two wordings ("got a 0-D bool
    tensor", "got tensor(True)"); one helper words all, as the operators' own check does."""
    from moe_routing._port import check_int, refuse_non_ints
    x, idx = torch.randn(4, 3), torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0]], dtype=I32)
    rows, index = torch.randn(8, 3), torch.arange(8, dtype=I32)
    message = non_int_tensor_message(function, argument, value)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call(x, idx, rows, index, value)
    for check in (lambda v: check_int(function, argument, v), lambda v: refuse_non_ints(function, {argument: v})):
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            check(value)
    assert_compiled_raises_value_error(message, call, x, idx, rows, index, value)


@pytest.mark.parametrize("value", TORCH_ENUM_VALUES, ids=TORCH_ENUM_IDS)
@pytest.mark.parametrize("function,argument,flag,call", INT_ARGUMENT_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in INT_ARGUMENT_CASES])
def test_a_torch_enum_for_an_int_is_refused(function, argument, flag, call, value):
    """A torch.dtype, layout, memory_format or qscheme for an int argument, eager and compiled: PyTorch's schema
    took it as its code (expert_num=torch.int64 as 4, k=torch.channels_last as 2) and check_int as not an int;
    x_dtype, which names a dtype, still takes a dtype (and refuses every value but None as not supported)."""
    from moe_routing._port import check_int, refuse_non_ints
    x, idx = torch.randn(4, 3), torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0]], dtype=I32)
    rows, index = torch.randn(8, 3), torch.arange(8, dtype=I32)
    if argument == "x_dtype" and isinstance(value, torch.dtype):
        with pytest.raises(NotImplementedError, match="x_dtype must be None"):
            call(x, idx, rows, index, torch.int8)
        return
    message = f"{function}: {argument} must be an int, got {value!r}"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call(x, idx, rows, index, value)
    for check in (lambda v: check_int(function, argument, v), lambda v: refuse_non_ints(function, {argument: v})):
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            check(value)
    assert_compiled_raises_value_error(message, call, x, idx, rows, index, value)


@pytest.mark.parametrize("function,argument,flag,call", INT_ARGUMENT_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in INT_ARGUMENT_CASES])
def test_a_0_dim_integer_tensor_for_an_int_is_the_int_it_holds(function, argument, flag, call):
    """The refusal of other tensors keeps these: an int64 or int32 one gives what its int gives (eager)."""
    x, idx = torch.randn(4, 3), torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0]], dtype=I32)
    rows, index = torch.randn(8, 3), torch.arange(8, dtype=I32)
    expected = outcome(lambda: call(x, idx, rows, index, int(flag)))
    for tensor in (torch.tensor(int(flag)), torch.tensor(int(flag), dtype=I32)):
        assert same_outcome(outcome(lambda: call(x, idx, rows, index, tensor)), expected), (tensor, expected)


def test_compiled_ports_keep_the_token_count_symbolic():
    """With the token dimension marked dynamic, one graph serves every token count: check_int took a
    traced int (x.shape[0] * K, which Dynamo does not show as a SymInt) through operator.index, and
    moe_init_routing_v2 / moe_init_routing_grad took active_num as a plain int, both specialising it
    (torch._dynamo.mark_dynamic: ConstraintViolationError; dynamic=True: a recompile per count)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    def v1_layer(x, expert_idx, probs):
        ex, eri, _ = torch_npu.npu_moe_init_routing(x, column_row_idx(x.shape[0], 2), expert_idx, x.shape[0])
        return torch_npu.npu_moe_finalize_routing(ex, None, None, None, probs, eri, None, 0)

    def v2_layer(x, expert_idx, probs):
        ex, eri, _, _ = torch_npu.npu_moe_init_routing_v2(x, expert_idx, active_num=x.shape[0] * 2, expert_num=4)
        return torch_npu.npu_moe_token_unpermute(ex, eri, probs)

    def permute_layer(x, expert_idx, probs):
        permuted, sorted_indices = torch_npu.npu_moe_token_permute(x, expert_idx, x.shape[0])
        return torch_npu.npu_moe_token_unpermute(permuted, sorted_indices, probs, numerics="ascend_950")

    gen = torch.Generator().manual_seed(23)
    for layer in (v1_layer, v2_layer, permute_layer):
        torch._dynamo.reset()
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(layer, fullgraph=True, backend=counter)
        for n in (5, 7):
            x, expert_idx = routing_case(gen, n, 2, 4)
            probs = torch.rand(n, 2, generator=gen)
            results = []
            for fn in (layer, compiled):
                leaves = [x.clone().requires_grad_(), expert_idx.clone(), probs.clone().requires_grad_()]
                if fn is compiled:
                    for t in leaves:
                        torch._dynamo.mark_dynamic(t, 0)
                out = fn(*leaves)
                out.backward(torch.ones_like(out))
                results.append([out, leaves[0].grad, leaves[2].grad])
            for eager, got in zip(*results):
                assert_bitwise_equal(eager, got, layer.__name__)
        assert counter.frame_count == 1, layer.__name__


@pytest.mark.parametrize("numerics", ["atlas_a2", "ascend_950"])
@pytest.mark.parametrize("rows_dtype", [torch.float32, torch.float16])
def test_token_unpermute_under_torch_func_transforms(numerics, rows_dtype):
    # atlas_a2's zero-prob skip is an autograd.Function: under vmap, jvp and grad it raised
    # PyTorch's "must override the setup_context staticmethod" (a method the caller never wrote),
    # where ascend_950's path batches under vmap and names the function when it refuses.
    # float16 rows with float32 probs take the widened path (_port.weighted_combine, whose casts are
    # an operator of their own while compiling): the same refusals, in the caller's name, and batching.
    import torch.autograd.forward_ad as fwAD
    gen = torch.Generator().manual_seed(21)
    permuted = random_values((6, 4), rows_dtype, gen)
    index = torch.randperm(6, generator=gen).to(I32)
    probs = torch.rand(3, 2, generator=gen)
    probs[0, 1] = 0

    def f(rows, p):
        return torch_npu.npu_moe_token_unpermute(rows, index, p, numerics=numerics)

    rows_batch = torch.stack([permuted, 2 * permuted])
    probs_batch = torch.stack([probs, probs.flip(0)])
    assert_bitwise_equal(torch.stack([f(r, p) for r, p in zip(rows_batch, probs_batch)]),
                         torch.func.vmap(f)(rows_batch, probs_batch))
    assert_bitwise_equal(torch.stack([f(r, probs) for r in rows_batch]),
                         torch.func.vmap(f, in_dims=(0, None))(rows_batch, probs))
    message = "^npu_moe_token_unpermute: forward-mode AD .* is not supported"
    with pytest.raises(NotImplementedError, match=message):
        torch.func.jvp(lambda r: f(r, probs), (permuted,), (torch.ones_like(permuted),))
    with fwAD.dual_level():
        with pytest.raises(NotImplementedError, match=message):
            f(permuted, fwAD.make_dual(probs, torch.ones_like(probs)))
    # Nested with vmap both ways: under jvp of vmap, atlas_a2's check raised "Batching rule not implemented for
    # aten::_unpack_dual" (the tangent is on the tensor the batched one wraps).
    with pytest.raises(NotImplementedError, match=message):
        torch.func.jvp(torch.func.vmap(lambda r: f(r, probs)), (rows_batch,), (torch.ones_like(rows_batch),))
    with pytest.raises(NotImplementedError, match=message):
        torch.func.vmap(lambda r: torch.func.jvp(lambda x: f(x, probs), (r,), (torch.ones_like(r),)))(rows_batch)
    refused = "^npu_moe_token_unpermute: torch.func's differentiating transforms"
    with pytest.raises(NotImplementedError, match=refused):
        torch.func.grad(lambda r: f(r, probs).sum())(permuted)
    with pytest.raises(NotImplementedError, match=refused):
        torch.func.jacrev(lambda p: f(permuted, p))(probs)
    # Inside such a transform, a call that is not differentiated runs.
    weight = torch.ones(3, 4)
    assert_bitwise_equal(f(permuted, probs).float(),
                         torch.func.grad(lambda w: (w * f(permuted, probs)).sum())(weight))


def test_a_combine_input_that_is_not_dense_is_a_value_error_naming_it():
    # Some reached PyTorch's own ops first: "reshape is not implemented for sparse tensors", the
    # dispatcher's "Could not run 'aten::lt.Scalar' with arguments from the 'SparseCPU' backend".
    rows, index, probs = torch.randn(4, 3), torch.tensor([1, 3, 0, 2], dtype=I32), torch.rand(2, 2)
    calls = [
        ("npu_moe_token_unpermute: probs", lambda: torch_npu.npu_moe_token_unpermute(rows, index, probs.to_sparse())),
        ("npu_moe_token_unpermute: sorted_indices",
         lambda: torch_npu.npu_moe_token_unpermute(rows, index.to_sparse(), probs)),
        ("npu_moe_finalize_routing: expanded_permuted_rows",
         lambda: torch_npu.npu_moe_finalize_routing(rows.to_sparse(), None, None, None, probs, index, None,
                                                    drop_pad_mode=2)),
    ]
    for message, call in calls:
        with pytest.raises(ValueError, match=f"^{message} must be a dense \\(strided\\) tensor, got a sparse_coo "
                                             f"tensor$"):
            call()
