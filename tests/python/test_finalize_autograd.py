"""Autograd through moe_finalize_routing: every drop_pad_mode, every differentiable input
(expanded_x, scales, x1, x2, bias), gradients equal to the documented formulas bit for bit
(finalize_reference.finalize_grad_reference), the forward's numerics carried to the backward,
and the gradients being the derivative (adjoint identities, exact on small integers)."""
import itertools

import pytest
import torch

import moe_routing
from finalize_reference import finalize_grad_reference
from reference import assert_bitwise_equal, random_values
from test_finalize import DTYPES, MODES, NUMERICS, idx, random_forward_case

I32 = torch.int32


def pair_rows(expanded_row_idx, mode, n, k):
    """Pair p = i*K + t -> the row it reads, in row layout (modes 0/1 store it at t*N + i)."""
    if mode in (2, 3):
        return expanded_row_idx.clone()
    return torch.tensor([int(expanded_row_idx[t * n + i]) for i in range(n) for t in range(k)], dtype=I32)


def expected_gradients(case, kwargs, mode, grad_y, numerics, zero_range=None):
    """The documented gradients: grad_expanded_x, grad_scales, grad_bias by the formulas of
    docs/moe_finalize_routing.md (as the grad with every row of expanded_x a slot), x1/x2 grad_y."""
    n, k = case["n"], case["k"]
    expanded_x = case["expanded_x"]
    hidden = expanded_x.shape[-1]
    rows = expanded_x.reshape(-1, hidden)
    index = pair_rows(case["expanded_row_idx"], mode, n, k)
    expert_idx = kwargs.get("expert_idx")
    if zero_range is not None:
        zero = (expert_idx.view(-1) >= zero_range[0]) & (expert_idx.view(-1) < zero_range[1])
        index = torch.where(zero, -1, index).to(I32)
    # Rows >= R (cut by active_num) and -1 read nothing: the grad's drop-pad form with one expert
    # of R slots treats every index outside [0, R) so.
    grad_x, grad_scales, grad_bias = finalize_grad_reference(
        grad_y, index, rows, kwargs.get("scales"), expert_idx if "bias" in kwargs else None, kwargs.get("bias"),
        drop_pad_mode=1, expert_num=1, expert_capacity=rows.shape[0], numerics=numerics)
    return grad_x.view(expanded_x.shape), grad_scales, grad_bias


def leaf(t):
    return t.detach().clone().requires_grad_()


@pytest.mark.parametrize("numerics", NUMERICS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gradients_equal_documented_formulas(dtype, mode, numerics):
    gen = torch.Generator().manual_seed(500 + 10 * mode + DTYPES.index(dtype) + 5 * NUMERICS.index(numerics))
    scale_dtypes = [None, dtype] + ([torch.float32] if dtype == torch.bfloat16 else [])
    for _ in range(3):
        case = random_forward_case(dtype, mode, gen, h=int(torch.randint(1, 90, (1,), generator=gen)))
        n, k, h, e = case["n"], case["k"], case["h"], case["e"]
        for skip, with_bias, scale_dtype in itertools.product(["none", "x1", "x1+x2"], [False, True], scale_dtypes):
            kwargs = {}
            if skip != "none":
                kwargs["x1"] = leaf(random_values((n, h), dtype, gen))
            if skip == "x1+x2":
                kwargs["x2"] = leaf(random_values((n, h), dtype, gen))
            if with_bias:
                kwargs["bias"] = leaf(random_values((e, h), dtype, gen))
                kwargs["expert_idx"] = case["expert_idx"]
            if scale_dtype is not None:
                kwargs["scales"] = leaf(random_values((n, k), scale_dtype, gen))
            else:
                kwargs["k"] = k
            expanded_x = leaf(case["expanded_x"])
            out = moe_routing.moe_finalize_routing(expanded_x, case["expanded_row_idx"], drop_pad_mode=mode,
                                                   numerics=numerics, **kwargs)
            grad_y = random_values(out.shape, dtype, gen)
            out.backward(grad_y)
            what = f"mode {mode} {numerics} {sorted(kwargs)}"
            want_x, want_scales, want_bias = expected_gradients(case, kwargs, mode, grad_y, numerics)
            assert_bitwise_equal(want_x, expanded_x.grad, f"{what}: expanded_x.grad")
            if "scales" in kwargs:
                assert_bitwise_equal(want_scales, kwargs["scales"].grad, f"{what}: scales.grad")
            if with_bias:
                assert_bitwise_equal(want_bias, kwargs["bias"].grad, f"{what}: bias.grad")
            for name in ("x1", "x2"):
                if name in kwargs:
                    assert_bitwise_equal(grad_y, kwargs[name].grad, f"{what}: {name}.grad")


@pytest.mark.parametrize("mode", MODES)
def test_each_input_alone(mode):
    # Whichever inputs require grad, each gets the gradient it gets when all do.
    gen = torch.Generator().manual_seed(40 + mode)
    case = random_forward_case(torch.float32, mode, gen, n=6, k=3, h=11, experts=4, capacity=4)
    base = dict(expanded_x=case["expanded_x"], x1=random_values((6, 11), torch.float32, gen),
                x2=random_values((6, 11), torch.float32, gen), bias=random_values((4, 11), torch.float32, gen),
                scales=random_values((6, 3), torch.float32, gen))
    grad_y = random_values((6, 11), torch.float32, gen)

    def backward(inputs):
        others = {name: t for name, t in inputs.items() if name != "expanded_x"}
        moe_routing.moe_finalize_routing(inputs["expanded_x"], case["expanded_row_idx"], expert_idx=case["expert_idx"],
                                         drop_pad_mode=mode, **others).backward(grad_y)

    every = {name: leaf(t) for name, t in base.items()}
    backward(every)
    for name in base:
        alone = dict(base, **{name: leaf(base[name])})
        backward(alone)
        assert_bitwise_equal(every[name].grad, alone[name].grad, f"mode {mode}: {name} alone")
        assert alone[name].grad.abs().sum() > 0


def test_backward_is_our_operator_and_skips_unneeded_work():
    ex = torch.randn(8, 4, requires_grad=True)
    scales = torch.rand(4, 2)
    out = moe_routing.moe_finalize_routing(ex, torch.randperm(8).to(I32), scales=scales, drop_pad_mode=2)
    with torch.autograd.profiler.profile() as prof:
        out.sum().backward()
    assert any("moe_routing::moe_finalize_routing_grad" in ev.name for ev in prof.function_events)
    # Only x1 requires grad: its gradient is grad_y itself, no grad operator runs.
    x1 = torch.randn(4, 4, requires_grad=True)
    out = moe_routing.moe_finalize_routing(ex.detach(), torch.randperm(8).to(I32), x1, scales=scales,
                                           drop_pad_mode=2)
    g = torch.randn(4, 4)
    with torch.autograd.profiler.profile() as prof:
        out.backward(g)
    assert not any("moe_finalize_routing_grad" in ev.name for ev in prof.function_events)
    assert torch.equal(x1.grad, g)


def test_forward_numerics_reaches_the_backward():
    # grad_scales sums H products in each device's order; over many binades at H = 200 the two
    # orders give different bits, and each equals its documented order.
    gen = torch.Generator().manual_seed(8)
    n, k, h = 16, 4, 200
    rows = random_values((n * k, h), torch.float32, gen)
    index = torch.randperm(n * k, generator=gen).to(I32)
    grad_y = random_values((n, h), torch.float32, gen)
    grads = {}
    for numerics in NUMERICS:
        scales = leaf(random_values((n, k), torch.float32, torch.Generator().manual_seed(9)))
        moe_routing.moe_finalize_routing(rows, index, scales=scales, drop_pad_mode=2,
                                         numerics=numerics).backward(grad_y)
        _, expected, _ = finalize_grad_reference(grad_y, index, rows, scales.detach(), numerics=numerics)
        assert_bitwise_equal(expected, scales.grad, numerics)
        grads[numerics] = scales.grad
    assert not torch.equal(grads["atlas_a2"], grads["ascend_950"])


def test_column_layout_gradients_equal_row_layout_with_the_transposed_index():
    gen = torch.Generator().manual_seed(10)
    n, k, h = 5, 3, 7
    for row_mode, col_mode in ((2, 0), (3, 1)):
        case = random_forward_case(torch.bfloat16, row_mode, gen, n=n, k=k, h=h, experts=3)
        row_index = case["expanded_row_idx"]
        col_index = row_index.view(n, k).t().reshape(-1).contiguous()
        grads = []
        for mode, index in ((row_mode, row_index), (col_mode, col_index)):
            ex, s, b = leaf(case["expanded_x"]), leaf(torch.rand(n, k, generator=torch.Generator().manual_seed(1))), \
                leaf(random_values((3, h), torch.bfloat16, torch.Generator().manual_seed(2)))
            out = moe_routing.moe_finalize_routing(ex, index, bias=b, scales=s, expert_idx=case["expert_idx"],
                                                   drop_pad_mode=mode)
            out.backward(random_values(out.shape, torch.bfloat16, torch.Generator().manual_seed(3)))
            grads.append((out, ex.grad, s.grad, b.grad))
        for a, c in zip(*grads):
            assert torch.equal(a.float().view(torch.int32), c.float().view(torch.int32))


def small_ints(shape, gen, dtype=torch.float32):
    return torch.randint(-4, 5, shape, generator=gen).to(dtype)


@pytest.mark.parametrize("mode", MODES)
def test_adjoint_identities_exact_on_small_integers(mode):
    # With small integers every sum is exact, so the gradients must satisfy, exactly,
    # <f(a), g> = <a, grad_a> for the inputs f is linear in (expanded_x, x1, x2, bias with the
    # others fixed) and <f(s) - (x1 + x2), g> = <s, grad_s> (f is affine in scales).
    gen = torch.Generator().manual_seed(60 + mode)
    for _ in range(5):
        case = random_forward_case(torch.float32, mode, gen, n=7, k=3, h=6, experts=4, capacity=5)
        rows = small_ints(case["expanded_x"].shape, gen)
        inputs = dict(x1=small_ints((7, 6), gen), x2=small_ints((7, 6), gen), bias=small_ints((4, 6), gen),
                      scales=small_ints((7, 3), gen))
        g = small_ints((7, 6), gen).double()

        def f(**changes):
            values = dict(inputs, expanded_x=rows)
            values.update(changes)
            ex = values.pop("expanded_x")
            return moe_routing.moe_finalize_routing(ex, case["expanded_row_idx"], expert_idx=case["expert_idx"],
                                                    drop_pad_mode=mode, **values)

        leaves = {name: leaf(t) for name, t in dict(inputs, expanded_x=rows).items()}
        out = f(**leaves)
        out.backward(g.float())

        def dot(a, b):
            return (a.double() * b.double()).sum().item()
        zero = {name: torch.zeros_like(t) for name, t in dict(inputs, expanded_x=rows).items()}
        # f(expanded_x) with x1 = x2 = bias = 0 is linear in expanded_x; likewise for bias.
        assert dot(f(x1=zero["x1"], x2=zero["x2"], bias=zero["bias"]), g) == dot(rows, leaves["expanded_x"].grad)
        assert dot(f(x1=zero["x1"], x2=zero["x2"], expanded_x=zero["expanded_x"]), g) == \
            dot(inputs["bias"], leaves["bias"].grad)
        for name in ("x1", "x2"):
            assert torch.equal(leaves[name].grad, g.float())
        assert dot(out.detach() - inputs["x1"] - inputs["x2"], g) == dot(inputs["scales"], leaves["scales"].grad)
        assert leaves["expanded_x"].grad.abs().sum() > 0 and leaves["scales"].grad.abs().sum() > 0


def test_special_experts_backward():
    gen = torch.Generator().manual_seed(70)
    n, k, h = 6, 3, 5
    case = random_forward_case(torch.float32, 2, gen, n=n, k=k, h=h, experts=6)
    experts = torch.randint(0, 6, (n, k), generator=gen, dtype=I32)
    case["expert_idx"] = experts
    # A zero range alone: every gradient, its pairs dropped.
    kwargs = dict(scales=leaf(torch.rand(n, k, generator=gen)), bias=leaf(random_values((6, h), torch.float32, gen)),
                  expert_idx=experts, x1=leaf(torch.randn(n, h, generator=gen)))
    ex = leaf(case["expanded_x"])
    out = moe_routing.moe_finalize_routing(ex, case["expanded_row_idx"], drop_pad_mode=2, zero_expert_range=[4, 6],
                                           **kwargs)
    g = torch.randn(out.shape, generator=gen)
    out.backward(g)
    want_x, want_s, want_b = expected_gradients(case, kwargs, 2, g, "atlas_a2", zero_range=(4, 6))
    assert_bitwise_equal(want_x, ex.grad, "zero range: expanded_x")
    assert_bitwise_equal(want_s, kwargs["scales"].grad, "zero range: scales")
    assert_bitwise_equal(want_b, kwargs["bias"].grad, "zero range: bias")
    assert kwargs["scales"].grad[experts >= 4].eq(0).all()
    # Copy and constant ranges: expanded_x, x1, x2 get gradients (those pairs read no row) ...
    special = dict(x=torch.randn(n, h, generator=gen), alpha1=torch.randn(1, h, generator=gen),
                   alpha2=torch.randn(1, h, generator=gen), v=torch.randn(1, h, generator=gen),
                   copy_expert_range=[3, 4], constant_expert_range=[5, 6], zero_expert_range=[4, 5])
    scales = torch.rand(n, k, generator=gen)
    ex = leaf(case["expanded_x"])
    x1 = leaf(torch.randn(n, h, generator=gen))
    out = moe_routing.moe_finalize_routing(ex, case["expanded_row_idx"], x1, scales=scales, expert_idx=experts,
                                           drop_pad_mode=2, **special)
    out.backward(g)
    want_x, _, _ = expected_gradients(case, dict(scales=scales, expert_idx=experts), 2, g, "atlas_a2",
                                      zero_range=(3, 6))
    assert_bitwise_equal(want_x, ex.grad, "special ranges: expanded_x")
    assert torch.equal(x1.grad, g)
    # ... the others need the special terms: NotImplementedError naming them.
    for name in ("scales", "bias", "x", "alpha1"):
        inputs = dict(special, scales=scales, bias=torch.randn(6, h, generator=gen))
        inputs[name] = leaf(inputs[name])
        out = moe_routing.moe_finalize_routing(case["expanded_x"], case["expanded_row_idx"], expert_idx=experts,
                                               drop_pad_mode=2, **inputs)
        with pytest.raises(NotImplementedError, match=rf"moe_finalize_routing: backward is not implemented for "
                                                      rf"{name} with a copy or constant expert range"):
            out.backward(g)


def test_backward_of_empty_and_all_dropped_inputs():
    # R = 0 (every pair dropped or cut): expanded_x's gradient is empty, scales' and bias's zero.
    scales = leaf(torch.rand(2, 2))
    bias = leaf(torch.randn(3, 4))
    ex = leaf(torch.randn(0, 4))
    out = moe_routing.moe_finalize_routing(ex, idx([-1, 3, 0, -1]), bias=bias, scales=scales,
                                           expert_idx=idx([[0, 1], [2, 0]]), drop_pad_mode=2)
    out.backward(torch.randn(2, 4))
    assert ex.grad.shape == (0, 4) and scales.grad.eq(0).all() and bias.grad.eq(0).all()
    for mode, shape in ((0, (0, 5)), (1, (2, 0, 5)), (2, (0, 5)), (3, (0, 0, 5))):
        ex = leaf(torch.randn(shape))
        s = leaf(torch.rand(0, 3))
        out = moe_routing.moe_finalize_routing(ex, idx([]), scales=s, drop_pad_mode=mode)
        out.backward(torch.randn(0, 5))
        assert ex.grad.shape == shape and s.grad.shape == (0, 3)


def test_double_backward_is_refused_rather_than_wrong():
    # The grad operator has no derivative of its own: a second backward through it says so
    # (without its autograd kernel PyTorch warned and went on with a wrong, missing gradient).
    ex = leaf(torch.randn(4, 3))
    scales = leaf(torch.rand(2, 2))
    out = moe_routing.moe_finalize_routing(ex, idx([0, 1, 2, 3]), scales=scales, drop_pad_mode=2)
    (grad_ex,) = torch.autograd.grad(out.sum(), [ex], create_graph=True)
    with pytest.raises(NotImplementedError, match="moe_finalize_routing_grad: backward is not implemented"):
        torch.autograd.grad(grad_ex.sum(), [scales])
