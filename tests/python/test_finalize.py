"""moe_finalize_routing and moe_finalize_routing_grad through torch: the worked examples of
docs/spec/moe_finalize_routing.md §5, the NumPy statement of the specification
(finalize_reference.py) bit for bit for every dtype x mode x numerics x optional-input
combination, special values, the skips, errors and their messages, empty inputs."""
import itertools
import re

import pytest
import torch

import moe_routing
from finalize_reference import finalize_grad_reference, finalize_reference
from moe_routing.ops import moe_finalize_routing as ops_moe_finalize_routing
from moe_routing.ops import moe_finalize_routing_grad as ops_moe_finalize_routing_grad
from reference import assert_bitwise_equal, random_values
from test_cann_port import _REQUIRED, check_signature

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
NUMERICS = ["atlas_a2", "ascend_950"]
MODES = [0, 1, 2, 3]
I32 = torch.int32


def idx(values):
    return torch.tensor(values, dtype=I32)


# ---- the worked examples (docs/spec/moe_finalize_routing.md §5) ---------------------------------

def test_spec_example_forward_mode_2():
    rows = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    scales = torch.tensor([[0.5, 0.25], [2.0, 1.0]])
    x1 = torch.tensor([[10.0], [20.0]])
    for numerics in NUMERICS:
        out = moe_routing.moe_finalize_routing(rows, idx([1, 3, 0, 2]), x1, scales=scales, drop_pad_mode=2,
                                               numerics=numerics)
        assert out.tolist() == [[12.0], [25.0]]


def test_spec_example_forward_column_layout_is_the_transpose():
    # Mode 0 reads pair (i, t) at t*N + i: the same example with its index transposed.
    rows = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    scales = torch.tensor([[0.5, 0.25], [2.0, 1.0]])
    out = moe_routing.moe_finalize_routing(rows, idx([1, 0, 3, 2]), torch.tensor([[10.0], [20.0]]), None, None,
                                           scales, None, None, None, None, None, 0)
    assert out.tolist() == [[12.0], [25.0]]


def test_spec_example_grad():
    grad_y = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    expanded_x = torch.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]])
    scales = torch.tensor([[0.5, 0.25], [2.0, 1.0]])
    for numerics in NUMERICS:
        grad_x, grad_scales = moe_routing.moe_finalize_routing_grad(grad_y, idx([1, 3, 0, 2]), expanded_x, scales,
                                                                    numerics=numerics)
        assert grad_x.tolist() == [[6, 8], [0.5, 1], [3, 4], [0.25, 0.5]]
        assert grad_scales.tolist() == [[8, 20], [4, 32]]


def test_spec_example_accumulation_type():
    rows = torch.tensor([[2048.0], [1.0], [1.0]], dtype=torch.float16)
    ones = torch.ones(1, 3, dtype=torch.float16)
    a2 = moe_routing.moe_finalize_routing(rows, idx([0, 1, 2]), scales=ones, drop_pad_mode=2)
    a950 = moe_routing.moe_finalize_routing(rows, idx([0, 1, 2]), scales=ones, drop_pad_mode=2,
                                            numerics="ascend_950")
    assert a2.item() == 2048 and a950.item() == 2050


def test_doc_example_v1_rounds_bfloat16_half_away():
    # 1 + 2^-8 is a tie between bfloat16 neighbours 1 and 1 + 2^-7.
    rows = torch.tensor([[1.0]]).to(torch.bfloat16)
    x1 = torch.tensor([[2.0 ** -8]]).to(torch.bfloat16)
    args = (rows, idx([0]), x1, None, torch.zeros(1, 1, dtype=torch.bfloat16), torch.ones(1, 1),
            torch.zeros(1, 1, dtype=I32))
    v1 = moe_routing.moe_finalize_routing(*args, api="v1")
    v2 = moe_routing.moe_finalize_routing(*args)
    assert v1.item() == 1 + 2.0 ** -7 and v2.item() == 1.0
    # ascend_950 has no V1 kernel: its round-to-nearest-even applies (docs/moe_finalize_routing.md).
    assert moe_routing.moe_finalize_routing(*args, api="v1", numerics="ascend_950").item() == 1.0


def test_ops_module_exports_the_same_functions():
    assert ops_moe_finalize_routing is moe_routing.moe_finalize_routing
    assert ops_moe_finalize_routing_grad is moe_routing.moe_finalize_routing_grad


# cann_ops_transformer's moe_finalize_routing and moe_finalize_routing_grad (its torch extension):
# name and default of each parameter, in order, every one positional-or-keyword.
CANN_MOE_FINALIZE_ROUTING = [
    ("expanded_x", _REQUIRED), ("expanded_row_idx", _REQUIRED), ("x1", None), ("x2", None), ("bias", None),
    ("scales", None), ("expert_idx", None), ("x", None), ("alpha1", None), ("alpha2", None), ("v", None),
    ("drop_pad_mode", 0), ("zero_expert_range", None), ("copy_expert_range", None), ("constant_expert_range", None),
    ("k", 1)]
CANN_MOE_FINALIZE_ROUTING_GRAD = [
    ("grad_y", _REQUIRED), ("expanded_row_idx", _REQUIRED), ("expanded_x", None), ("scales", None),
    ("expert_idx", None), ("bias", None), ("drop_pad_mode", 0), ("active_num", 0), ("expert_num", 0),
    ("expert_capacity", 0)]


def test_signatures_and_schemas_are_cann_s():
    check_signature(moe_routing.moe_finalize_routing, CANN_MOE_FINALIZE_ROUTING)
    check_signature(moe_routing.moe_finalize_routing_grad, CANN_MOE_FINALIZE_ROUTING_GRAD)
    for op, cann in ((torch.ops.moe_routing.moe_finalize_routing, CANN_MOE_FINALIZE_ROUTING),
                     (torch.ops.moe_routing.moe_finalize_routing_grad, CANN_MOE_FINALIZE_ROUTING_GRAD)):
        schema = op.default._schema
        assert [a.name for a in schema.arguments if not a.kwarg_only] == [name for name, _ in cann]
    assert "int? drop_pad_mode=0" in str(torch.ops.moe_routing.moe_finalize_routing.default._schema)


def test_canns_autograd_use_runs_unchanged():
    # CANN's torch extension differentiates expanded_x and scales of a column-layout forward
    # (drop_pad_mode 0/1) through its V2Grad; the same call here, with the same gradients as the
    # grad called by hand on the row-layout index (what CANN's wrapper does).
    gen = torch.Generator().manual_seed(2)
    n, k, h = 3, 2, 5
    expanded_x = torch.randn(n * k, h, generator=gen, requires_grad=True)
    scales = torch.rand(n, k, generator=gen, requires_grad=True)
    index = torch.randperm(n * k, generator=gen).to(I32)
    out = ops_moe_finalize_routing(expanded_x, index, None, None, None, scales, None, None, None, None, None, 0)
    grad_y = torch.randn(n, h, generator=gen)
    out.backward(grad_y)
    row_layout = index.view(k, n).t().reshape(-1)
    grad_x, grad_scales = ops_moe_finalize_routing_grad(grad_y, row_layout, expanded_x.detach(), scales.detach(),
                                                        None, None, 0, n * k, 0, 0)
    assert torch.equal(expanded_x.grad, grad_x) and torch.equal(scales.grad, grad_scales)


# ---- random cases against the reference ----------------------------------------------------------

def random_index(mode, n, k, rows, gen, drop_fraction=0.15):
    """expanded_row_idx for `mode`: dropless values in [0, N*K) (those >= rows cut by active_num),
    drop-pad values in [0, rows); some -1."""
    limit = n * k if mode in (0, 2) else rows
    values = torch.randint(0, max(limit, 1), (n * k,), generator=gen)
    if limit == 0:
        values.fill_(-1)
    drop = torch.rand(n * k, generator=gen) < drop_fraction
    return torch.where(drop, -1, values).to(I32)


def random_forward_case(dtype, mode, gen, n=None, k=None, h=None, experts=None, capacity=None):
    n = n if n is not None else int(torch.randint(1, 12, (1,), generator=gen))
    k = k if k is not None else int(torch.randint(1, 5, (1,), generator=gen))
    h = h if h is not None else int(torch.randint(1, 40, (1,), generator=gen))
    e = experts if experts is not None else int(torch.randint(1, 6, (1,), generator=gen))
    if mode in (1, 3):
        capacity = capacity if capacity is not None else int(torch.randint(0, n + 2, (1,), generator=gen))
        expanded_x = random_values((e, capacity, h), dtype, gen)
        rows = e * capacity
    else:
        rows = int(torch.randint(0, n * k + 1, (1,), generator=gen))  # < N*K: rows cut by active_num
        expanded_x = random_values((rows, h), dtype, gen)
    index = random_index(mode, n, k, rows, gen)
    expert_idx = torch.randint(0, e, (n, k), generator=gen, dtype=I32)
    return dict(expanded_x=expanded_x, expanded_row_idx=index, n=n, k=k, h=h, e=e, expert_idx=expert_idx)


def optional_inputs(case, dtype, gen):
    """Every combination of x1 / x2, bias and scales (same dtype, and float32 for bfloat16)."""
    n, k, h, e = case["n"], case["k"], case["h"], case["e"]
    scale_dtypes = [None, dtype] + ([torch.float32] if dtype == torch.bfloat16 else [])
    for skip, with_bias, scale_dtype in itertools.product(["none", "x1", "x1+x2"], [False, True], scale_dtypes):
        kwargs = {}
        if skip != "none":
            kwargs["x1"] = random_values((n, h), dtype, gen)
        if skip == "x1+x2":
            kwargs["x2"] = random_values((n, h), dtype, gen)
        if with_bias:
            kwargs["bias"] = random_values((e, h), dtype, gen)
            kwargs["expert_idx"] = case["expert_idx"]
        if scale_dtype is not None:
            kwargs["scales"] = random_values((n, k), scale_dtype, gen)
        else:
            kwargs["k"] = k
        yield kwargs


@pytest.mark.parametrize("numerics", NUMERICS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_matches_reference(dtype, mode, numerics):
    gen = torch.Generator().manual_seed(100 + 10 * mode + DTYPES.index(dtype) + 7 * NUMERICS.index(numerics))
    for _ in range(4):
        case = random_forward_case(dtype, mode, gen)
        for kwargs in optional_inputs(case, dtype, gen):
            args = (case["expanded_x"], case["expanded_row_idx"])
            expected = finalize_reference(*args, drop_pad_mode=mode, numerics=numerics, **kwargs)
            got = moe_routing.moe_finalize_routing(*args, drop_pad_mode=mode, numerics=numerics, **kwargs)
            assert_bitwise_equal(expected, got, f"mode {mode} {numerics} {sorted(kwargs)}")


@pytest.mark.parametrize("numerics", NUMERICS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_api_v1_matches_reference(dtype, numerics):
    gen = torch.Generator().manual_seed(7 + DTYPES.index(dtype))
    for _ in range(6):
        case = random_forward_case(dtype, 0, gen)
        n, k, h, e = case["n"], case["k"], case["h"], case["e"]
        for x2, scale_dtype in itertools.product([False, True], [dtype, torch.float32] if dtype == torch.bfloat16
                                                 else [dtype]):
            kwargs = dict(x1=random_values((n, h), dtype, gen), bias=random_values((e, h), dtype, gen),
                          scales=random_values((n, k), scale_dtype, gen), expert_idx=case["expert_idx"])
            if x2:
                kwargs["x2"] = random_values((n, h), dtype, gen)
            args = (case["expanded_x"], case["expanded_row_idx"])
            expected = finalize_reference(*args, numerics=numerics, api="v1", **kwargs)
            got = moe_routing.moe_finalize_routing(*args, numerics=numerics, api="v1", **kwargs)
            assert_bitwise_equal(expected, got, f"v1 {numerics} {sorted(kwargs)}")


@pytest.mark.parametrize("numerics", NUMERICS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_special_experts_match_reference(dtype, numerics):
    # Experts 0..1 ordinary, 2 zero, 3..4 copy, 5..6 constant (any order of the ranges).
    gen = torch.Generator().manual_seed(31 + DTYPES.index(dtype))
    ranges = dict(zero_expert_range=[2, 3], copy_expert_range=[3, 5], constant_expert_range=[5, 7])
    for mode, with_bias, with_scales, with_x1 in itertools.product(MODES, [False, True], [False, True],
                                                                   [False, True]):
        case = random_forward_case(dtype, mode, gen, experts=7)
        n, k, h = case["n"], case["k"], case["h"]
        kwargs = dict(expert_idx=torch.randint(0, 7, (n, k), generator=gen, dtype=I32),
                      x=random_values((n, h), dtype, gen), alpha1=random_values((2, h), dtype, gen),
                      alpha2=random_values((2, h), dtype, gen), v=random_values((2, h), dtype, gen), **ranges)
        if with_bias:
            kwargs["bias"] = random_values((7 if mode in (0, 2) else case["e"], h), dtype, gen)
            if mode in (1, 3):  # drop-pad: bias has E rows, the experts of expanded_x
                kwargs["expert_idx"] = kwargs["expert_idx"] % case["e"]
        kwargs["scales" if with_scales else "k"] = random_values((n, k), dtype, gen) if with_scales else k
        if with_x1:
            kwargs["x1"] = random_values((n, h), dtype, gen)
        args = (case["expanded_x"], case["expanded_row_idx"])
        expected = finalize_reference(*args, drop_pad_mode=mode, numerics=numerics, **kwargs)
        got = moe_routing.moe_finalize_routing(*args, drop_pad_mode=mode, numerics=numerics, **kwargs)
        assert_bitwise_equal(expected, got, f"special experts mode {mode} {sorted(kwargs)}")


def test_special_experts_zero_range_alone_and_overlap_free_order():
    # A zero expert needs neither x nor alpha: its pairs add nothing, like dropped ones.
    rows = torch.tensor([[1.0], [2.0], [4.0], [8.0]])
    experts = idx([[0, 1], [1, 1]])
    out = moe_routing.moe_finalize_routing(rows, idx([0, 1, 2, 3]), expert_idx=experts, drop_pad_mode=2, k=2,
                                           zero_expert_range=[1, 2])
    assert out.tolist() == [[1.0], [0.0]]


def random_grad_case(dtype, mode, gen, n=None, k=None, h=None):
    n = n if n is not None else int(torch.randint(1, 10, (1,), generator=gen))
    k = k if k is not None else int(torch.randint(1, 5, (1,), generator=gen))
    h = h if h is not None else int(torch.randint(1, 80, (1,), generator=gen))
    pairs = n * k
    attrs = dict(drop_pad_mode=mode)
    if mode == 1:
        experts = int(torch.randint(1, 5, (1,), generator=gen))
        capacity = int(torch.randint(0, n + 2, (1,), generator=gen))
        attrs.update(expert_num=experts, expert_capacity=capacity)
        rows, shape = experts * capacity, (experts, capacity, h)
    else:
        experts = int(torch.randint(1, 5, (1,), generator=gen))
        active = int(torch.randint(0, pairs + 2, (1,), generator=gen))
        attrs["active_num"] = active
        rows = active if 0 < active < pairs else pairs
        shape = (rows, h)
    # Forward-shaped indices: each row named at most once (a permutation), some dropped.
    if mode == 1:
        perm = torch.randperm(max(pairs, rows), generator=gen)[:pairs]
        index = torch.where(perm < rows, perm, -1)
    else:
        index = torch.randperm(pairs, generator=gen)
    index = torch.where(torch.rand(pairs, generator=gen) < 0.15, -1, index).to(I32)
    return dict(grad_y=random_values((n, h), dtype, gen), expanded_row_idx=index, n=n, k=k, h=h, e=experts,
                shape=shape, attrs=attrs)


def grad_optionals(case, dtype, gen):
    n, k, h, e = case["n"], case["k"], case["h"], case["e"]
    scale_dtypes = [None, dtype] + ([torch.float32] if dtype == torch.bfloat16 else [])
    for with_x, with_bias, scale_dtype in itertools.product([False, True], [False, True], scale_dtypes):
        if scale_dtype is None and k > 1 and n == 0:
            continue
        kwargs = {}
        if with_x:
            kwargs["expanded_x"] = random_values(case["shape"], dtype, gen)
        if with_bias:
            kwargs["bias"] = random_values((e, h), dtype, gen)
            kwargs["expert_idx"] = torch.randint(0, e, (n, k), generator=gen, dtype=I32)
        if scale_dtype is not None:
            kwargs["scales"] = random_values((n, k), scale_dtype, gen)
        yield kwargs


def assert_grad_outputs(expected, got, what, with_bias=False):
    expected_x, expected_scales, expected_bias = expected
    assert_bitwise_equal(expected_x, got[0], f"{what}: grad_expanded_x")
    if expected_scales is None:
        assert got[1].numel() == 0, f"{what}: grad_scales should be empty"
    else:
        assert_bitwise_equal(expected_scales, got[1], f"{what}: grad_scales")
    if with_bias:
        if expected_bias is None:
            assert got[2].numel() == 0, f"{what}: grad_bias should be empty"
        else:
            assert_bitwise_equal(expected_bias, got[2], f"{what}: grad_bias")


@pytest.mark.parametrize("numerics", NUMERICS)
@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grad_matches_reference(dtype, mode, numerics):
    gen = torch.Generator().manual_seed(300 + 10 * mode + DTYPES.index(dtype) + 5 * NUMERICS.index(numerics))
    for _ in range(5):
        case = random_grad_case(dtype, mode, gen)
        for kwargs in grad_optionals(case, dtype, gen):
            args = (case["grad_y"], case["expanded_row_idx"])
            expected = finalize_grad_reference(*args, numerics=numerics, **case["attrs"], **kwargs)
            got = moe_routing.moe_finalize_routing_grad(*args, numerics=numerics, grad_bias=True, **case["attrs"],
                                                        **kwargs)
            assert_grad_outputs(expected, got, f"mode {mode} {numerics} {sorted(kwargs)}", with_bias=True)
            two = moe_routing.moe_finalize_routing_grad(*args, numerics=numerics, **case["attrs"], **kwargs)
            assert len(two) == 2 and torch.equal(two[0], got[0]) and torch.equal(two[1], got[1])


@pytest.mark.parametrize("numerics", NUMERICS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("h", [63, 64, 65, 100, 511, 512, 513, 1025, 4100])
def test_grad_scales_orders_over_hidden_sizes(dtype, numerics, h):
    # The 64-lane trees and the fold (ascend_950), the 512-lane groups (atlas_a2).
    gen = torch.Generator().manual_seed(h)
    case = random_grad_case(dtype, 0, gen, n=3, k=2, h=h)
    case["attrs"]["active_num"] = 0
    case["shape"] = (6, h)
    case["expanded_row_idx"] = torch.randperm(6, generator=gen).to(I32)
    for kwargs in grad_optionals(case, dtype, gen):
        if "scales" not in kwargs or "expanded_x" not in kwargs:
            continue
        args = (case["grad_y"], case["expanded_row_idx"])
        expected = finalize_grad_reference(*args, numerics=numerics, **kwargs)
        got = moe_routing.moe_finalize_routing_grad(*args, numerics=numerics, **kwargs)
        assert_grad_outputs(expected, got, f"H={h} {numerics} {sorted(kwargs)}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_grad_scales_atlas_chunks(dtype):
    # H beyond atlas_a2's chunk (12264 .. 19616 products): the chunk sums are added in order.
    gen = torch.Generator().manual_seed(5)
    h = 20000
    grad_y = random_values((1, h), dtype, gen)
    expanded_x = random_values((2, h), dtype, gen)
    scales = random_values((1, 2), dtype, gen)
    index = idx([1, 0])
    for bias in (None, random_values((1, h), dtype, gen)):
        extra = dict(expert_idx=torch.zeros(1, 2, dtype=I32), bias=bias) if bias is not None else {}
        for numerics in NUMERICS:
            expected = finalize_grad_reference(grad_y, index, expanded_x, scales, numerics=numerics, **extra)
            got = moe_routing.moe_finalize_routing_grad(grad_y, index, expanded_x, scales, numerics=numerics,
                                                        **extra)
            assert_grad_outputs(expected, got, f"H={h} {numerics} bias={bias is not None}")


def test_grad_two_pairs_on_one_row_sum_in_pair_order():
    # Not an init-routing output, but the gradient of a forward that reads the row twice.
    grad_y = torch.tensor([[1.0], [3.0]])
    scales = torch.tensor([[2.0], [0.5]])
    grad_x, _ = moe_routing.moe_finalize_routing_grad(grad_y, idx([0, 0]), None, scales)
    assert grad_x.tolist() == [[3.5], [0.0]]


# ---- special values ----------------------------------------------------------------------------

SPECIALS = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1.0, -1.0, 2.0 ** -140, -(2.0 ** -133),
            6.0e-8, -5.96e-8, 65504.0, 3.0e38, -3.0e38, 1e-39]


def special_values(shape, dtype, gen):
    pool = torch.tensor(SPECIALS)
    picks = torch.randint(0, len(SPECIALS), shape, generator=gen)
    mixed = torch.where(torch.rand(shape, generator=gen) < 0.7, pool[picks], random_values(shape, torch.float32, gen))
    return mixed.to(dtype)


@pytest.mark.parametrize("numerics", NUMERICS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_special_values_forward_and_grad(dtype, numerics):
    gen = torch.Generator().manual_seed(77 + DTYPES.index(dtype))
    for mode in MODES:
        for _ in range(3):
            case = random_forward_case(dtype, mode, gen, h=9)
            n, k, h, e = case["n"], case["k"], case["h"], case["e"]
            expanded_x = special_values(case["expanded_x"].shape, dtype, gen)
            scales_dtype = torch.float32 if dtype == torch.bfloat16 else dtype
            with_bias = dict(scales=special_values((n, k), scales_dtype, gen),
                             bias=special_values((e, h), dtype, gen), expert_idx=case["expert_idx"])
            skips = ({}, dict(x1=special_values((n, h), dtype, gen)),
                     dict(x1=special_values((n, h), dtype, gen), x2=special_values((n, h), dtype, gen)))
            for kwargs, extra in itertools.product((with_bias, dict(k=k)), skips):
                args = (expanded_x, case["expanded_row_idx"])
                expected = finalize_reference(*args, drop_pad_mode=mode, numerics=numerics, **kwargs, **extra)
                got = moe_routing.moe_finalize_routing(*args, drop_pad_mode=mode, numerics=numerics, **kwargs,
                                                       **extra)
                assert_bitwise_equal(expected, got, f"special values mode {mode}")
    for mode in (0, 1):
        for _ in range(4):
            case = random_grad_case(dtype, mode, gen, h=70)
            n, k, h, e = case["n"], case["k"], case["h"], case["e"]
            grad_y = special_values((n, h), dtype, gen)
            scales_dtype = torch.float32 if dtype == torch.bfloat16 else dtype
            kwargs = dict(expanded_x=special_values(case["shape"], dtype, gen),
                          scales=special_values((n, k), scales_dtype, gen), bias=special_values((e, h), dtype, gen),
                          expert_idx=torch.randint(0, e, (n, k), generator=gen, dtype=I32))
            args = (grad_y, case["expanded_row_idx"])
            expected = finalize_grad_reference(*args, numerics=numerics, **case["attrs"], **kwargs)
            got = moe_routing.moe_finalize_routing_grad(*args, numerics=numerics, grad_bias=True, **case["attrs"],
                                                        **kwargs)
            assert_grad_outputs(expected, got, f"special values grad mode {mode}", with_bias=True)


def test_nan_is_stored_canonically():
    bits = {torch.float32: 0x7FC00000, torch.float16: 0x7E00, torch.bfloat16: 0x7FC0}
    for dtype, view in ((torch.float32, torch.int32), (torch.float16, torch.int16), (torch.bfloat16, torch.int16)):
        rows = torch.tensor([[float("inf")], [float("-inf")]]).to(dtype)
        out = moe_routing.moe_finalize_routing(rows, idx([0, 1]), k=2, drop_pad_mode=2)  # inf + -inf
        assert out.view(view).item() & 0xFFFFFFFF == bits[dtype]


def test_first_term_assigned_rule():
    minus_zero = torch.tensor([[-0.0]])
    for dtype, a2_sign in ((torch.bfloat16, -1), (torch.float32, 1), (torch.float16, 1)):
        rows = minus_zero.to(dtype)
        a2 = moe_routing.moe_finalize_routing(rows, idx([0]), drop_pad_mode=2)
        a950 = moe_routing.moe_finalize_routing(rows, idx([0]), drop_pad_mode=2, numerics="ascend_950")
        # atlas_a2 assigns the first term (bf16: -0 survives; fp32/fp16 add a zero bias first:
        # -0 + 0 = +0); ascend_950 adds it to +0.
        assert torch.copysign(torch.ones(1), a2.float()).item() == a2_sign, dtype
        assert torch.copysign(torch.ones(1), a950.float()).item() == 1, dtype
    # With x1 nothing is assigned: -0 (x1) + 0 = +0 under atlas_a2; ascend_950 keeps x1 = -0.
    rows = torch.tensor([[-0.0]]).to(torch.bfloat16)
    x1 = torch.tensor([[-0.0]]).to(torch.bfloat16)
    a2 = moe_routing.moe_finalize_routing(rows, idx([-1]), x1, drop_pad_mode=2)
    a950 = moe_routing.moe_finalize_routing(rows, idx([-1]), x1, drop_pad_mode=2, numerics="ascend_950")
    assert torch.signbit(a2.float()).item() is False and torch.signbit(a950.float()).item() is True
    # No term and no x1: +0 in both.
    for numerics in NUMERICS:
        out = moe_routing.moe_finalize_routing(rows, idx([-1]), drop_pad_mode=2, numerics=numerics)
        assert torch.signbit(out.float()).item() is False


# ---- skips ---------------------------------------------------------------------------------------

def test_minus_one_skips_its_pair_in_every_mode():
    rows2 = torch.tensor([[1.0], [2.0], [4.0], [8.0]])
    rows3 = rows2.view(2, 2, 1)
    scales = torch.ones(2, 2)
    for mode, rows in ((0, rows2), (1, rows3), (2, rows2), (3, rows3)):
        out = moe_routing.moe_finalize_routing(rows, idx([0, -1, 2, -1]), scales=scales, drop_pad_mode=mode)
        # Column layout: token 0 has positions 0 and 2, token 1 positions 1 and 3 (both -1); row
        # layout: token 0 positions 0 and 1, token 1 positions 2 and 3.
        expected = [[5.0], [0.0]] if mode in (0, 1) else [[1.0], [4.0]]
        assert out.tolist() == expected, mode


def test_rows_cut_by_active_num_are_skipped_in_dropless_modes():
    rows = torch.tensor([[1.0], [2.0]])  # R = 2 < N*K = 4: values 2 and 3 were cut
    for mode in (0, 2):
        out = moe_routing.moe_finalize_routing(rows, idx([0, 1, 3, 2]), k=2, drop_pad_mode=mode)
        assert out.tolist() == ([[1.0], [2.0]] if mode == 0 else [[3.0], [0.0]]), mode
    with pytest.raises(IndexError, match=r"moe_finalize_routing: expanded_row_idx\[1\] must be in \[0, 2\) "
                                         r"\(-1 marks a dropped pair, values in \[2, 4\) pairs cut by active_num\), "
                                         r"got 4$"):
        moe_routing.moe_finalize_routing(rows, idx([0, 4, 2, 1]), k=2, drop_pad_mode=2)
    # Drop-pad: every value outside [0, E*C) but -1 is an error.
    with pytest.raises(IndexError, match=r"^moe_finalize_routing: expanded_row_idx\[2\] must be in \[0, 2\) "
                                         r"\(-1 marks a dropped pair\), got 2$"):
        moe_routing.moe_finalize_routing(rows.view(1, 2, 1), idx([0, 1, 2, -1]), k=2, drop_pad_mode=3)
    # The grad: values in [active_num, N*K) are cut pairs.
    grad_x, grad_scales = moe_routing.moe_finalize_routing_grad(
        torch.tensor([[1.0], [2.0]]), idx([0, 3, 2, 1]), rows, torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
        active_num=2)
    assert grad_x.tolist() == [[1.0], [8.0]] and grad_scales.tolist() == [[1.0, 0.0], [0.0, 4.0]]


# ---- errors --------------------------------------------------------------------------------------

def forward_base():
    return dict(expanded_x=torch.ones(4, 3), expanded_row_idx=idx([0, 1, 2, 3]), scales=torch.ones(2, 2),
                drop_pad_mode=2)


FORWARD_ERRORS = [
    (dict(drop_pad_mode=4), ValueError, r"drop_pad_mode must be 0 \(dropless, column\), 1 \(drop-pad, column\), "
                                        r"2 \(dropless, row\) or 3 \(drop-pad, row\), got 4"),
    (dict(expanded_x=torch.ones(4, 3, 1)), ValueError,
     r"expanded_x must be 2-D \[R, H\] when drop_pad_mode=2 \(dropless\), got "),
    (dict(drop_pad_mode=1), ValueError, r"expanded_x must be 3-D \[E, C, H\] when drop_pad_mode=1 \(drop-pad\), got"),
    (dict(expanded_x=torch.ones(4, 3, dtype=torch.float64)), ValueError,
     r"expanded_x must have a dtype among float32, float16, bfloat16, int8, int32, int64, got float64"),
    (dict(expanded_x=torch.ones(4, 3, dtype=torch.int32)), ValueError,
     r"expanded_x must be float16, bfloat16 or float32, got int32"),
    (dict(expanded_row_idx=torch.arange(4)), ValueError, r"expanded_row_idx must be 1-D int32, got "),
    (dict(expanded_x=torch.ones(5, 3)), ValueError,
     r"expanded_x.size\(0\) must be at most N\*K \(4\) in dropless mode, got 5"),
    (dict(x2=torch.ones(2, 3)), ValueError, r"x2 needs x1 \(CANN adds x2 only to x1\), got x2 without x1"),
    (dict(bias=torch.ones(2, 3)), ValueError, r"bias needs expert_idx \(the row of bias of each pair\), got none"),
    (dict(x1=torch.ones(2, 4)), ValueError, r"x1 must be 2-D float32 \[2, 3\] \(\[N, H\]\), got "),
    (dict(x1=torch.ones(2, 3, dtype=torch.float16)), ValueError, r"x1 must be 2-D float32 \[2, 3\] \(\[N, H\]\), got"),
    (dict(scales=torch.ones(2, 2, dtype=torch.float16)), ValueError,
     r"scales must be 2-D \[N, K\] of the dtype of expanded_x \(float32\), got "),
    (dict(scales=torch.ones(3, 2)), ValueError, r"scales must be \[N, K\] = \[2, 2\], got "),
    (dict(scales=torch.ones(2, 3)), ValueError, r"len\(expanded_row_idx\) must be a multiple of K \(3\), got 4"),
    (dict(k=3), ValueError, r"k must be 1 or scales.size\(1\) \(2\) when scales is given, got 3"),
    (dict(scales=None, k=0), ValueError, r"k must be >= 1, got 0"),
    (dict(scales=None, k=3), ValueError, r"len\(expanded_row_idx\) must be a multiple of k \(3\), got 4"),
    (dict(expert_idx=idx([[0, 0], [0, 0]]), bias=torch.ones(1, 2)), ValueError,
     r"bias must be 2-D float32 \[E, 3\] \(\[E, H\]\), got "),
    (dict(expert_idx=idx([0, 0, 0, 0])), ValueError, r"expert_idx must be 2-D int32 \[2, 2\] \(\[N, K\]\), got "),
    (dict(numerics="a3"), ValueError, r'numerics must be "atlas_a2" or "ascend_950", got "a3"'),
    (dict(api="v3"), ValueError, r'api must be "v1" or "v2", got "v3"'),
    (dict(api="v1"), ValueError, r"drop_pad_mode must be 0 with api v1 \(its column layout\), got 2"),
    (dict(api="v1", drop_pad_mode=0), ValueError, r"x1 must be present with api v1, got none"),
    (dict(zero_expert_range=[1, 2, 3]), ValueError,
     r"zero_expert_range must be a list of two ints \[start, end\], got \[1, 2, 3\]"),
    (dict(copy_expert_range=[0.5, 2]), ValueError, r"copy_expert_range must be a list of two ints"),
    (dict(zero_expert_range=[2, 1]), ValueError,
     r"zero_expert_range must be \[-1, -1\] \(none\) or \[start, end\) with 0 <= start < end, got \[2, 1\)"),
    (dict(zero_expert_range=[0, 2], expert_idx=idx([[0, 0], [0, 0]]), copy_expert_range=[1, 3],
          x=torch.ones(2, 3)), ValueError,
     r"zero_expert_range and copy_expert_range must not overlap, got \[0, 2\) and \[1, 3\)"),
    (dict(zero_expert_range=[0, 2]), ValueError, r"zero_expert_range needs expert_idx, got none"),
    (dict(copy_expert_range=[0, 2], expert_idx=idx([[0, 0], [0, 0]])), ValueError,
     r"copy_expert_range needs x \(the tokens' input rows\), got none"),
    (dict(constant_expert_range=[0, 2], expert_idx=idx([[0, 0], [0, 0]]), x=torch.ones(2, 3)), ValueError,
     r"constant_expert_range needs alpha1, alpha2 and v, got none"),
    (dict(alpha1=torch.ones(1, 3)), ValueError, r"alpha1, alpha2 and v must be given together, got alpha1, no "
                                               r"alpha2 and no v"),
    (dict(expanded_row_idx=idx([0, 1, 2, 4])), IndexError,
     r"expanded_row_idx\[3\] must be in \[0, 4\) \(-1 marks a dropped pair\), got 4$"),
    (dict(expanded_row_idx=idx([0, -2, 2, 3])), IndexError, 
     r"expanded_row_idx\[1\] must be in \[0, 4\) \(-1 marks a dropped pair\), got -2$"),
    (dict(expert_idx=idx([[0, 0], [2, 0]]), bias=torch.ones(2, 3)), IndexError,
     r"expert_idx\[1\]\[0\] must be in \[0, 2\) \(the rows of bias\), got 2$"),
    (dict(x1=torch.ones(2, 3, device="meta")), ValueError,
     r"x1 must be on cpu \(the device of the operator's first input\), got meta"),
]


@pytest.mark.parametrize("change, error, message", FORWARD_ERRORS, ids=lambda v: None)
def test_forward_errors_and_nothing_written(change, error, message):
    kwargs = dict(forward_base(), **change)
    expanded_x, expanded_row_idx = kwargs.pop("expanded_x"), kwargs.pop("expanded_row_idx")
    with pytest.raises(error, match="^moe_finalize_routing: " + message):
        moe_routing.moe_finalize_routing(expanded_x, expanded_row_idx, **kwargs)
    # The same call into an out= tensor of the base case's shape: the same error, nothing written
    # (cases that change that shape, or whose error comes from elsewhere, are left out).
    if "device" in message or expanded_x.dtype != torch.float32 or expanded_x.dim() != 2:
        return
    out = torch.full((2, 3), 7.0)
    with pytest.raises(error, match="^moe_finalize_routing: " + message):
        moe_routing.moe_finalize_routing(expanded_x, expanded_row_idx, **kwargs, out=out)
    assert out.eq(7.0).all()


def grad_base():
    return dict(grad_y=torch.ones(2, 3), expanded_row_idx=idx([0, 1, 2, 3]), expanded_x=torch.ones(4, 3),
                scales=torch.ones(2, 2))


GRAD_ERRORS = [
    (dict(drop_pad_mode=2), ValueError,
     r"drop_pad_mode must be 0 \(dropless, row layout\) or 1 \(drop-pad, row layout\), got 2"),
    (dict(active_num=-1), ValueError, r"active_num must be >= 0, got -1"),
    (dict(expert_num=-1), ValueError, r"expert_num must be >= 0, got -1"),
    (dict(grad_y=torch.ones(2, 3, 1)), ValueError, r"grad_y must be 2-D \[N, H\] float16, bfloat16 or float32, got"),
    (dict(scales=torch.ones(3, 2)), ValueError, r"scales must be \[N, K\] with N = grad_y.size\(0\) \(2\) and K >= 1"),
    (dict(scales=torch.ones(2, 3)), ValueError, r"len\(expanded_row_idx\) must be N\*K \(2 \* 3\), got 4"),
    (dict(scales=None, expanded_row_idx=idx([0, 1, 2])), ValueError,
     r"len\(expanded_row_idx\) must be a positive multiple of N \(2\) when scales is absent, got 3"),
    (dict(expanded_x=torch.ones(4, 4)), ValueError,
     r"expanded_x must be 2-D float32 \[4, 3\] \(the shape of grad_expanded_x\), got "),
    (dict(bias=torch.ones(2, 3)), ValueError, r"bias needs expert_idx \(the row of bias of each pair\), got none"),
    (dict(numerics="x"), ValueError, r'numerics must be "atlas_a2" or "ascend_950", got "x"'),
    (dict(expanded_row_idx=idx([0, 1, 2, 9])), IndexError, 
     r"expanded_row_idx\[3\] must be in \[0, 4\) \(-1 marks a dropped pair\), got 9$"),
    (dict(expert_idx=idx([[0, 5], [0, 0]]), bias=torch.ones(2, 3)), IndexError,
     r"expert_idx\[0\]\[1\] must be in \[0, 2\) \(the rows of bias\), got 5$"),
]


@pytest.mark.parametrize("change, error, message", GRAD_ERRORS, ids=lambda v: None)
def test_grad_errors_and_nothing_written(change, error, message):
    kwargs = dict(grad_base(), **change)
    grad_y, index = kwargs.pop("grad_y"), kwargs.pop("expanded_row_idx")
    with pytest.raises(error, match="^moe_finalize_routing_grad: " + message):
        moe_routing.moe_finalize_routing_grad(grad_y, index, **kwargs)
    if grad_y.dim() != 2 or kwargs.get("drop_pad_mode", 0) != 0 or kwargs.get("active_num", 0) < 0:
        return
    outs = (torch.full((4, 3), 7.0), torch.full((2, 2), 7.0))
    with pytest.raises(error, match="^moe_finalize_routing_grad: " + message):
        moe_routing.moe_finalize_routing_grad(grad_y, index, **kwargs, out=outs)
    assert all(o.eq(7.0).all() for o in outs)


def test_grad_out_tuple_length_and_unproducible_outputs():
    g, index = torch.ones(2, 3), idx([0, 1, 2, 3])
    with pytest.raises(ValueError, match=r"moe_finalize_routing_grad: out must be a tuple of 2 tensors "
                                         r"\(grad_expanded_x, grad_scales\), got 1"):
        moe_routing.moe_finalize_routing_grad(g, index, out=(torch.empty(4, 3),))
    with pytest.raises(ValueError, match=r"moe_finalize_routing_grad: grad_scales needs scales and expanded_x, got "
                                         r"no expanded_x"):
        moe_routing.moe_finalize_routing_grad(g, index, None, torch.ones(2, 2),
                                              out=(torch.empty(4, 3), torch.empty(2, 2)))
    with pytest.raises(ValueError, match=r"moe_finalize_routing_grad: grad_bias needs bias, got none"):
        moe_routing.moe_finalize_routing_grad(g, index, grad_bias=True,
                                              out=(torch.empty(4, 3), None, torch.empty(1, 3)))


# ---- out= and the functional results agree ----------------------------------------------------------

def test_out_variants_equal_functional_results():
    gen = torch.Generator().manual_seed(12)
    case = random_forward_case(torch.bfloat16, 2, gen, n=5, k=3, h=17, experts=4)
    kwargs = dict(x1=random_values((5, 17), torch.bfloat16, gen), scales=torch.rand(5, 3, generator=gen),
                  bias=random_values((4, 17), torch.bfloat16, gen), expert_idx=case["expert_idx"], drop_pad_mode=2)
    args = (case["expanded_x"], case["expanded_row_idx"])
    expected = moe_routing.moe_finalize_routing(*args, **kwargs)
    out = torch.empty_like(expected)
    assert moe_routing.moe_finalize_routing(*args, **kwargs, out=out) is out
    assert torch.equal(out, expected)
    grad_y = random_values((5, 17), torch.bfloat16, gen)
    index = torch.randperm(15, generator=gen).to(I32)
    gkw = dict(expanded_x=random_values((15, 17), torch.bfloat16, gen), scales=kwargs["scales"],
               expert_idx=case["expert_idx"], bias=kwargs["bias"])
    expected = moe_routing.moe_finalize_routing_grad(grad_y, index, **gkw, grad_bias=True)
    outs = tuple(torch.empty_like(t) for t in expected)
    assert moe_routing.moe_finalize_routing_grad(grad_y, index, **gkw, grad_bias=True, out=outs) == outs
    assert all(torch.equal(a, b) for a, b in zip(expected, outs))
    only_x = (torch.empty_like(expected[0]), None)
    moe_routing.moe_finalize_routing_grad(grad_y, index, **gkw, out=only_x)
    assert torch.equal(only_x[0], expected[0])


def test_positional_arguments_in_canns_order():
    gen = torch.Generator().manual_seed(3)
    case = random_forward_case(torch.float32, 0, gen, n=4, k=2, h=5, experts=3)
    x1, x2 = torch.randn(4, 5, generator=gen), torch.randn(4, 5, generator=gen)
    bias, scales = torch.randn(3, 5, generator=gen), torch.rand(4, 2, generator=gen)
    args = (case["expanded_x"], case["expanded_row_idx"])
    by_keyword = moe_routing.moe_finalize_routing(*args, x1=x1, x2=x2, bias=bias, scales=scales,
                                                  expert_idx=case["expert_idx"], drop_pad_mode=0, k=2)
    positional = moe_routing.moe_finalize_routing(*args, x1, x2, bias, scales, case["expert_idx"], None, None, None,
                                                  None, 0, None, None, None, 2)
    raw = torch.ops.moe_routing.moe_finalize_routing(*args, x1, x2, bias, scales, case["expert_idx"], None, None,
                                                     None, None, 0, None, None, None, 2)
    assert torch.equal(by_keyword, positional) and torch.equal(by_keyword, raw)
    # CANN's optional ints accept None: their defaults.
    assert torch.equal(moe_routing.moe_finalize_routing(*args, drop_pad_mode=None, k=None, scales=scales, x1=x1),
                       moe_routing.moe_finalize_routing(*args, scales=scales, x1=x1))
    g = torch.randn(4, 5, generator=gen)
    index = torch.randperm(8, generator=gen).to(I32)
    ex = torch.randn(8, 5, generator=gen)
    a = moe_routing.moe_finalize_routing_grad(g, index, ex, scales, case["expert_idx"], bias, 0, 0, 0, 0)
    b = moe_routing.moe_finalize_routing_grad(g, index, expanded_x=ex, scales=scales, expert_idx=case["expert_idx"],
                                              bias=bias)
    assert all(torch.equal(p, q) for p, q in zip(a, b))


def test_non_contiguous_inputs():
    gen = torch.Generator().manual_seed(4)
    rows = torch.randn(4, 12, generator=gen)[:, ::2]
    scales = torch.rand(2, 6, generator=gen)[:, ::3]
    index = idx([3, 9, 0, 9, 2, 9, 1, 9])[::2]
    out = moe_routing.moe_finalize_routing(rows, index, scales=scales, drop_pad_mode=2)
    assert torch.equal(out, moe_routing.moe_finalize_routing(rows.contiguous(), index.contiguous(),
                                                             scales=scales.contiguous(), drop_pad_mode=2))


# ---- empty inputs ---------------------------------------------------------------------------------

def test_empty_inputs():
    for mode in MODES:
        shape = (0, 4) if mode in (0, 2) else (2, 0, 4)
        out = moe_routing.moe_finalize_routing(torch.ones(shape), idx([]), scales=torch.ones(0, 3), drop_pad_mode=mode)
        assert out.shape == (0, 4)
    # No rows at all (R = 0, E*C = 0): every pair dropped; out is x1, or +0.
    x1 = torch.tensor([[1.0, -2.0]])
    assert moe_routing.moe_finalize_routing(torch.ones(0, 2), idx([-1, 1]), x1, k=2, drop_pad_mode=2).tolist() == \
        [[1.0, -2.0]]
    assert moe_routing.moe_finalize_routing(torch.ones(3, 0, 2), idx([-1, -1]), k=2, drop_pad_mode=1).tolist() == \
        [[0.0, 0.0]]
    # H = 0.
    assert moe_routing.moe_finalize_routing(torch.ones(4, 0), idx([0, 1, 2, 3]), k=2).shape == (2, 0)
    # The grad: N = 0, H = 0, E*C = 0.
    gx, gs = moe_routing.moe_finalize_routing_grad(torch.ones(0, 3), idx([]), torch.ones(0, 3), torch.ones(0, 2))
    assert gx.shape == (0, 3) and gs.shape == (0, 2)
    gx, gs = moe_routing.moe_finalize_routing_grad(torch.ones(2, 0), idx([1, 0]), torch.ones(2, 0), torch.ones(2, 1))
    assert gx.shape == (2, 0) and gs.tolist() == [[0.0], [0.0]]
    gx, gs = moe_routing.moe_finalize_routing_grad(torch.ones(1, 3), idx([-1, -1]), torch.ones(0, 5, 3),
                                                   torch.ones(1, 2), drop_pad_mode=1, expert_num=0, expert_capacity=5)
    assert gx.shape == (0, 5, 3) and gs.tolist() == [[0.0, 0.0]]
    # Without scales or expanded_x grad_scales is an empty tensor (CANN's output has no meaning).
    gx, gs = moe_routing.moe_finalize_routing_grad(torch.ones(2, 3), idx([1, 0]))
    assert gs.shape == (0,) and gx.tolist() == [[1.0] * 3, [1.0] * 3]


def _raises_exactly(message, call):
    with pytest.raises(ValueError, match=f"^{message}$"):
        call()


def test_a_non_tensor_for_a_tensor_argument_is_a_value_error_naming_it():
    # PyTorch's schema refused these with a RuntimeError printing the whole schema.
    rows, index = torch.ones(4, 3), idx([0, 1, 2, 3])
    _raises_exactly("moe_finalize_routing: expanded_x must be a tensor, got list",
                    lambda: moe_routing.moe_finalize_routing([[1.0]], index))
    _raises_exactly("moe_finalize_routing: scales must be a tensor or None, got list",
                    lambda: moe_routing.moe_finalize_routing(rows, index, scales=[[1.0, 1.0], [1.0, 1.0]],
                                                             drop_pad_mode=2))
    _raises_exactly("moe_finalize_routing: x1 must be a tensor or None, got int",
                    lambda: moe_routing.moe_finalize_routing(rows, index, 3, k=2))
    _raises_exactly("moe_finalize_routing: out must be a tensor, got str",
                    lambda: moe_routing.moe_finalize_routing(rows, index, k=2, out="y"))
    _raises_exactly("moe_finalize_routing_grad: expanded_row_idx must be a tensor, got list",
                    lambda: moe_routing.moe_finalize_routing_grad(torch.ones(2, 3), [0, 1, 2, 3]))


def test_grad_bias_of_the_wrong_type_is_named_grad_bias():
    # The schema's refusal named the raw operator's compute_grad_bias (and called it an int).
    _raises_exactly("moe_finalize_routing_grad: grad_bias must be a bool, got 'yes'",
                    lambda: moe_routing.moe_finalize_routing_grad(torch.ones(2, 3), idx([0, 1, 2, 3]),
                                                                  grad_bias="yes"))


def test_out_tuples_are_tuples_of_tensors():
    # A tensor passed as the grad's out= was taken apart into its rows and written; a None
    # grad_expanded_x was PyTorch's "tensor does not have a device".
    rows, index, scales, g = torch.ones(4, 3), idx([0, 1, 2, 3]), torch.ones(2, 2), torch.ones(2, 3)
    out = torch.full((2, 2, 1), 7.0)
    _raises_exactly(r"moe_finalize_routing_grad: out must be a tuple of 2 tensors \(grad_expanded_x, grad_scales\), "
                    r"got Tensor",
                    lambda: moe_routing.moe_finalize_routing_grad(torch.ones(2, 1), idx([0, 1]), torch.ones(2, 1),
                                                                  torch.ones(2, 1), out=out))
    assert out.eq(7.0).all()
    _raises_exactly("moe_finalize_routing_grad: out grad_expanded_x must be a tensor, got None",
                    lambda: moe_routing.moe_finalize_routing_grad(g, index, rows, scales, out=(None, None)))
    _raises_exactly("moe_finalize_routing_grad: out grad_scales must be a tensor or None, got float",
                    lambda: moe_routing.moe_finalize_routing_grad(g, index, rows, scales,
                                                                  out=(torch.empty(4, 3), 1.0)))
    _raises_exactly(r"moe_init_routing: out must be a tuple of 5 tensors \(expanded_x, expanded_row_idx, .*\), "
                    r"got Tensor",
                    lambda: moe_routing.moe_init_routing(torch.ones(2, 3), idx([[0], [1]]), expert_num=2,
                                                         out=torch.zeros(5, 2, 3)))
    # A list is a sequence of outputs as a tuple is.
    outs = [torch.empty(4, 3), torch.empty(2, 2)]
    assert moe_routing.moe_finalize_routing_grad(g, index, rows, scales, out=outs) == tuple(outs)


def test_an_inference_tensor_out_outside_inference_mode_is_refused_before_writing():
    # PyTorch allows no in-place update of an inference tensor outside inference mode; the out=
    # kernels wrote it first and raised afterwards (and raised nothing when every argument was an
    # inference tensor).
    rows, index = torch.ones(4, 3), idx([0, 1, 2, 3])
    with torch.inference_mode():
        out = torch.full((2, 3), 7.0)
        outs = (torch.full((4, 3), 7.0), torch.full((2, 2), 7.0))
        inference_rows, inference_index = rows.clone(), index.clone()
    message = "must not be an inference tensor outside torch.inference_mode()"
    for args in ((rows, index), (inference_rows, inference_index)):
        with pytest.raises(RuntimeError, match=rf"^moe_finalize_routing: out y {re.escape(message)}"):
            moe_routing.moe_finalize_routing(*args, k=2, out=out)
        assert out.eq(7.0).all()
        with pytest.raises(RuntimeError, match=rf"^moe_finalize_routing_grad: out grad_expanded_x "
                                               rf"{re.escape(message)}"):
            moe_routing.moe_finalize_routing_grad(torch.ones(2, 3), args[1], args[0], torch.ones(2, 2), out=outs)
        assert all(o.eq(7.0).all() for o in outs)
    with torch.inference_mode():  # inside inference mode it is written, as PyTorch's out= operators do
        moe_routing.moe_finalize_routing(rows, index, k=2, out=out)
    assert out.eq(2.0).all()


def test_a_tensor_that_is_not_dense_is_a_value_error_naming_it():
    # The dispatcher refused these with its NotImplementedError ("Could not run ... with arguments
    # from the 'SparseCPU' backend ..."), naming no argument.
    rows, index = torch.ones(2, 3), idx([0, 1])
    quantized = torch.quantize_per_tensor(rows, 0.1, 0, torch.qint8)
    calls = [
        ("expanded_x must be a dense \\(strided\\) tensor, got a sparse_coo tensor",
         lambda: moe_routing.moe_finalize_routing(rows.to_sparse(), index, k=2)),
        ("expanded_x must be a dense \\(strided\\) tensor, got a mkldnn tensor",
         lambda: moe_routing.moe_finalize_routing(rows.to_mkldnn(), index, k=2)),
        ("expanded_x must be a dense \\(strided\\) tensor, got a quantized tensor",
         lambda: moe_routing.moe_finalize_routing(quantized, index, k=2)),
        ("scales must be a dense \\(strided\\) tensor, got a sparse_csr tensor",
         lambda: moe_routing.moe_finalize_routing(rows, index, scales=torch.ones(1, 2).to_sparse_csr())),
        ("out must be a dense \\(strided\\) tensor, got a sparse_coo tensor",
         lambda: moe_routing.moe_finalize_routing(rows, index, k=2, out=torch.ones(1, 3).to_sparse())),
    ]
    for message, call in calls:
        with pytest.raises(ValueError, match=f"^moe_finalize_routing: {message}$"):
            call()
    with pytest.raises(ValueError, match="^moe_finalize_routing_grad: grad_y must be a dense \\(strided\\) tensor"):
        moe_routing.moe_finalize_routing_grad(rows.to_sparse(), index)
