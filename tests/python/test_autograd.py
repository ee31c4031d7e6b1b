"""Autograd: loss.backward() runs our backward operator; every non-quantised configuration is
differentiable, gradients equal the reference backward bit for bit."""
import pytest
import torch

import moe_routing
import moe_routing.torch_npu
from reference import assert_bitwise_equal, grad_reference, random_values


def gather_index(expanded_row_idx, row_idx_type, rows_written):
    """Pair -> the expanded row holding it (or -1), from either row_idx_type."""
    eri = expanded_row_idx.long()
    if row_idx_type == 0:
        return torch.where((eri >= 0) & (eri < rows_written), eri, -1).to(torch.int32)
    out = torch.full_like(eri, -1)
    out[eri[:rows_written]] = torch.arange(rows_written)
    return out.to(torch.int32)


def test_seed_example_manual_and_autograd():
    x = torch.arange(6.0).view(3, 2).requires_grad_()
    idx = torch.tensor([[1, 0], [2, 1], [0, 2]], dtype=torch.int32)
    ex, eri, _, _, _ = moe_routing.moe_init_routing(x, idx, expert_num=3)
    g = torch.arange(12.0).view(6, 2) * 10
    (ex * g).sum().backward()
    manual = moe_routing.moe_init_routing_grad(g, eri, 2)
    assert torch.equal(x.grad, manual)
    # x.grad[i] = sum of g over the rows that token i was copied to.
    for i in range(3):
        assert torch.equal(x.grad[i], g[eri[2 * i].item()] + g[eri[2 * i + 1].item()])


def test_backward_is_our_operator():
    x = torch.randn(4, 8, requires_grad=True)
    idx = torch.randint(0, 4, (4, 2), dtype=torch.int32)
    ex = moe_routing.moe_init_routing(x, idx, expert_num=4)[0]
    with torch.autograd.profiler.profile() as prof:
        ex.sum().backward()
    assert any("moe_routing::moe_init_routing_grad" in e.name for e in prof.function_events)


CONFIGS = [
    dict(),  # dropless
    dict(active_num=7),  # truncation
    dict(active_expert_range=[1, 5]),  # partial range (pairs outside are not routed)
    dict(active_expert_range=[2, 6], row_idx_type=1),
    dict(active_expert_range=[0, 5], row_idx_type=1, active_num=5),
    dict(drop_pad_mode=1, expert_capacity=3),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "dropless")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gradients_equal_reference_backward(config, dtype):
    gen = torch.Generator().manual_seed(17)
    n, k, e, h = 9, 3, 6, 10
    x = random_values((n, h), dtype, gen).requires_grad_()
    idx = torch.randint(0, e, (n, k), generator=gen, dtype=torch.int32)
    w = torch.rand(n, k, generator=gen).requires_grad_()
    s = torch.rand(n, generator=gen).requires_grad_()
    ex, eri, _, es, etw = moe_routing.moe_init_routing(x, idx, scale=s, topk_weight=w, expert_num=e, **config)
    gx = random_values(ex.shape, dtype, gen)
    gs = torch.rand(es.shape, generator=gen)
    gw = torch.rand(etw.shape, generator=gen)
    torch.autograd.backward([ex, es, etw], [gx, gs, gw])
    if config.get("drop_pad_mode") == 1:
        index, mode = eri, 1
        grad_x_ref = grad_reference(gx, index, k, 1)
        grad_w_ref = grad_reference(gw.view(e, -1, 1), index, 1, 1).view(n, k)
        grad_s_ref = grad_reference(gs.view(e, -1, 1), index, k, 1).view(n)
    else:
        start, end = config.get("active_expert_range", [0, e])
        routed = int(((idx >= start) & (idx < end)).sum())
        active = config.get("active_num", -1)
        rows_written = routed if active <= 0 else min(active, routed)
        index = gather_index(eri, config.get("row_idx_type", 0), rows_written)
        grad_x_ref = grad_reference(gx, index, k)
        grad_w_ref = grad_reference(gw, index, 1).view(n, k)
        grad_s_ref = grad_reference(gs.view(-1, 1), index, k).view(n)
    assert_bitwise_equal(grad_x_ref, x.grad, "x.grad")
    assert_bitwise_equal(grad_w_ref, w.grad, "topk_weight.grad")
    assert_bitwise_equal(grad_s_ref, s.grad, "scale.grad")
    assert x.grad.abs().sum() > 0


@pytest.mark.parametrize("kwargs", [dict(active_num=0), dict(active_num=5), dict(drop_pad_mode=1, expert_capacity=2)])
def test_v2_autograd(kwargs):
    gen = torch.Generator().manual_seed(2)
    x = random_values((6, 5), torch.float32, gen).requires_grad_()
    idx = torch.randint(0, 4, (6, 2), generator=gen, dtype=torch.int32)
    ex, eri, _, _ = moe_routing.moe_init_routing_v2(x, idx, expert_num=4, **kwargs)
    g = random_values(ex.shape, torch.float32, gen)
    ex.backward(g)
    expected = grad_reference(g, eri, 2, kwargs.get("drop_pad_mode", 0), kwargs.get("active_num", 0))
    assert_bitwise_equal(expected, x.grad, "v2 x.grad")


def test_adjoint_identity_in_float64():
    # <moe_init_routing(x), g> == <x, grad(g)> exactly on small integers.
    gen = torch.Generator().manual_seed(4)
    x = torch.randint(-8, 8, (12, 7), generator=gen).float()
    idx = torch.randint(-1, 7, (12, 3), generator=gen, dtype=torch.int32)
    for kw in [dict(expert_num=6, active_expert_range=[0, 6]), dict(expert_num=6, active_num=20),
               dict(expert_num=6, active_expert_range=[1, 4], row_idx_type=1)]:
        x_ = x.clone().requires_grad_()
        ex = moe_routing.moe_init_routing(x_, idx, **kw)[0]
        g = torch.randint(-8, 8, ex.shape, generator=gen).float()
        ex.backward(g)
        lhs = (ex.double() * g.double()).sum()
        rhs = (x.double() * x_.grad.double()).sum()
        assert lhs.item() == rhs.item(), kw


def test_quantised_forward_raises_in_backward():
    x = torch.randn(4, 8, requires_grad=True)
    idx = torch.randint(0, 4, (4, 2), dtype=torch.int32)
    ex, _, _, scale, _ = moe_routing.moe_init_routing(x, idx, expert_num=4, quant_mode=1)
    assert ex.dtype == torch.int8
    with pytest.raises(NotImplementedError, match="quant_mode=1"):
        scale.sum().backward()


def test_integer_inputs_get_no_gradient():
    x = torch.randn(4, 8, requires_grad=True)
    idx = torch.randint(0, 4, (4, 2), dtype=torch.int32)
    ex = moe_routing.moe_init_routing(x, idx, expert_num=4)[0]
    ex.sum().backward()
    assert idx.grad is None and x.grad is not None


def test_combine_through_grad_operator_is_differentiable():
    gen = torch.Generator().manual_seed(8)
    y = torch.randn(12, 5, generator=gen, requires_grad=True)
    eri = torch.randperm(12, generator=gen).to(torch.int32)
    eri[3] = -1
    out = moe_routing.moe_init_routing_grad(y, eri, 3)
    g = torch.randn(out.shape, generator=gen)
    out.backward(g)
    expected = torch.zeros(12, 5)
    for p in range(12):
        if eri[p] >= 0:
            expected[eri[p]] = g[p // 3]
    assert torch.equal(y.grad, expected)


@pytest.mark.parametrize("mode", ["requires_grad", "plain", "no_grad", "inference_mode"])
def test_functional_calls_record_a_graph_exactly_when_a_gradient_is_needed(mode):
    # Calls that need no graph skip the Python-level autograd kernel (_api._functional); the results and
    # what is recorded must not change.
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(6, 32, generator=gen)
    idx = torch.stack([torch.randperm(8, generator=gen)[:2] for _ in range(6)]).to(torch.int32)
    scales = torch.rand(6, 2, generator=gen)
    expected = moe_routing.moe_init_routing(x, idx, expert_num=8)[0]
    x = x.clone().requires_grad_(mode != "plain")
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(mode, torch.enable_grad)
    with context():
        expanded_x, eri = moe_routing.moe_init_routing(x, idx, expert_num=8)[:2]
        y = moe_routing.moe_finalize_routing(expanded_x, eri, scales=scales, drop_pad_mode=2)
        grad_x = moe_routing.moe_init_routing_grad(expanded_x, eri, 2)
        grads = moe_routing.moe_finalize_routing_grad(y, eri, expanded_x, scales)
    assert torch.equal(expanded_x.detach(), expected)
    tracked = mode == "requires_grad"
    for t in (expanded_x, y, grad_x, grads[0]):
        assert (t.grad_fn is not None) == tracked
    if tracked:
        y.sum().backward()
        assert x.grad is not None and x.grad.shape == x.shape


def test_functional_calls_under_vmap_keep_the_graph_of_the_outer_tensor():
    # Inside torch.func.vmap the batched tensor reports requires_grad=False although the outer one requires
    # grad: the call must still go through the autograd kernel (a review found the gradient dropped).
    x = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(6))
    idx = torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0]], dtype=torch.int32)

    def grad_sum(op):
        xr = x.clone().requires_grad_()
        (torch.func.vmap(op)(xr).sum() + xr.sum()).backward()
        return xr.grad

    ours = grad_sum(lambda b: moe_routing.moe_init_routing(b, idx, expert_num=4)[0])
    raw = grad_sum(lambda b: torch.ops.moe_routing.moe_init_routing(b, idx, expert_num=4)[0])
    assert torch.equal(ours, raw)
    assert torch.equal(ours, torch.full_like(x, 3.0))  # K = 2 rows per token, plus xr.sum()


def _one_call_of_each_operator(ops=moe_routing):
    """(name, f): f(t) calls one of the operators with t as its differentiable input; ops is
    moe_routing (the public functions) or torch.ops.moe_routing (the raw operators)."""
    idx = torch.tensor([[1, 0], [2, 1], [0, 2]], dtype=torch.int32)
    eri = torch.tensor([3, 0, 5, 1, 2, 4], dtype=torch.int32)
    return [
        ("moe_init_routing", lambda t: ops.moe_init_routing(t, idx, expert_num=3)[0]),
        ("moe_init_routing_v2", lambda t: ops.moe_init_routing_v2(t, idx, expert_num=3)[0]),
        ("moe_init_routing_grad", lambda t: ops.moe_init_routing_grad(t.repeat(2, 1), eri, 2)),
        ("moe_finalize_routing",
         lambda t: ops.moe_finalize_routing(t.repeat(2, 1), eri, k=2, drop_pad_mode=2)),
        ("moe_finalize_routing_grad", lambda t: ops.moe_finalize_routing_grad(t, eri)[0]),
    ]


# The argument that f of _one_call_of_each_operator passes t as.
_DIFFERENTIATED_ARGUMENT = ["x", "x", "grad_expanded_x", "expanded_x", "grad_y"]


@pytest.mark.parametrize("ops", ["public", "raw"])
@pytest.mark.parametrize("index", range(5))
def test_forward_mode_ad_is_refused(index, ops):
    # The operators have no forward derivative; PyTorch's kernel for custom operators ran them on
    # the primal alone, so the tangent was dropped: jvp returned zeros, a dual output had none. The
    # public functions refused it; the raw torch.ops.moe_routing operators still dropped it, in
    # every mode and transform below.
    import torch.autograd.forward_ad as fwAD
    name, f = _one_call_of_each_operator(moe_routing if ops == "public" else torch.ops.moe_routing)[index]
    message = (rf"^{name}: forward-mode AD \(torch.func.jvp, jacfwd, torch.autograd.forward_ad\) is not "
               f"supported, got {_DIFFERENTIATED_ARGUMENT[index]} with a tangent; differentiate in reverse mode")
    x = torch.arange(6.0).view(3, 2)
    with pytest.raises(NotImplementedError, match=message):
        torch.func.jvp(f, (x,), (torch.ones_like(x),))
    with pytest.raises(NotImplementedError, match=message):
        torch.func.jvp(f, (x.clone().requires_grad_(),), (torch.ones_like(x),))
    with pytest.raises(NotImplementedError, match=message):
        torch.func.jacfwd(f)(x)
    batch = torch.arange(12.0).view(2, 3, 2)
    with pytest.raises(NotImplementedError, match=message):  # the public functions' check raised a RuntimeError
        torch.func.jvp(torch.func.vmap(f), (batch,), (torch.ones_like(batch),))
    # In grad mode or not; with an input that requires grad, autograd records the call, whose
    # autograd.Function hides the tangent from the operator (PyTorch's message spoke of a jvp
    # method of an autograd.Function the caller never wrote).
    for grad_mode in (torch.enable_grad, torch.no_grad):
        for requires_grad in (False, True):
            with fwAD.dual_level(), grad_mode():
                primal = x.clone().requires_grad_(requires_grad)
                with pytest.raises(NotImplementedError, match=message):
                    f(fwAD.make_dual(primal, torch.ones_like(x)))
                assert torch.equal(f(primal), f(x))  # a dual level without tangents: the call runs
    # Without a tangent the call runs: torch.func.vmap batches it as a loop of calls would.
    assert torch.equal(torch.func.vmap(f)(batch), torch.stack([f(b) for b in batch]))


@pytest.mark.parametrize("ops", ["public", "raw"])
def test_forward_mode_ad_under_inference_mode_is_left_out_as_by_pytorch(ops):
    # Inference mode turns autograd off, forward mode too: torch.sin of a dual tensor has no
    # tangent there, and neither has an operator's output (nothing is refused or computed).
    import torch.autograd.forward_ad as fwAD
    x = torch.arange(6.0).view(3, 2)
    probs = torch.tensor([[0.5, 0.0], [1.0, 2.0], [0.25, 1.0]])
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.ones_like(x))
        dual_probs = fwAD.make_dual(probs, torch.ones_like(probs))
        with torch.inference_mode():
            assert fwAD.unpack_dual(torch.sin(dual)).tangent is None
            for _, f in _one_call_of_each_operator(moe_routing if ops == "public" else torch.ops.moe_routing):
                out = f(dual)
                assert fwAD.unpack_dual(out).tangent is None and torch.equal(out, f(x))
            # The torch_npu port's atlas_a2 combine checks in Python (its zero-scale skip): it refused there.
            index = torch.tensor([3, 0, 5, 1, 2, 4], dtype=torch.int32)
            rows = torch.arange(12.0).view(6, 2)
            unpermute = moe_routing.torch_npu.npu_moe_token_unpermute
            out = unpermute(rows, index, dual_probs, numerics="atlas_a2")
            assert fwAD.unpack_dual(out).tangent is None
            assert torch.equal(out, unpermute(rows, index, probs, numerics="atlas_a2"))


@pytest.mark.parametrize("index", range(5))
def test_a_dual_level_without_a_tangent_leaves_compile_and_fake_tensors_alone(index):
    # Inside an open dual level (a JVP elsewhere in the model), the refusal's check in setup_context ran
    # unpack_dual on fake tensors: torch.compile and FakeTensorMode failed an internal assert of PyTorch's
    # (_fw_primal) with no tangent anywhere.
    import torch.autograd.forward_ad as fwAD
    from torch._subclasses.fake_tensor import FakeTensorMode
    name, f = _one_call_of_each_operator()[index]
    x = torch.arange(6.0).view(3, 2)
    # moe_finalize_routing_grad has no backward of its own (a second derivative), which aot_eager would trace.
    twice = name != "moe_finalize_routing_grad"
    leaf = x.clone().requires_grad_(twice)
    expected = f(leaf)
    if twice:
        expected.sum().backward()
    with fwAD.dual_level():
        torch._dynamo.reset()
        t = x.clone().requires_grad_(twice)
        out = torch.compile(f, backend="aot_eager", fullgraph=True)(t)
        assert_bitwise_equal(out, expected, name)
        if twice:
            out.sum().backward()
            assert_bitwise_equal(t.grad, leaf.grad, name)
        with FakeTensorMode():  # every tensor of the call made here, so fake
            _, fake_call = _one_call_of_each_operator()[index]
            assert fake_call(torch.arange(6.0).view(3, 2).requires_grad_()).shape == expected.shape


@pytest.mark.parametrize("index", range(5))
def test_func_grad_is_refused_with_our_message(index):
    # PyTorch's message spoke of an autograd.Function that "must override the setup_context
    # staticmethod", which the caller never wrote.
    name, f = _one_call_of_each_operator()[index]
    x = torch.arange(6.0).view(3, 2)
    with pytest.raises(NotImplementedError, match=f"^{name}: torch.func's differentiating transforms"):
        torch.func.grad(lambda t: f(t).sum())(x)
    with pytest.raises(NotImplementedError, match=f"^{name}: torch.func's differentiating transforms"):
        torch.func.vjp(f, x)


def _one_out_call_of_each_combine_operator():
    """(name, f): f(t) calls an out= overload with t as an input and returns the out= tensor."""
    eri = torch.tensor([3, 0, 5, 1, 2, 4], dtype=torch.int32)

    def finalize(t):
        out = torch.empty(3, 2)
        moe_routing.moe_finalize_routing(t.repeat(2, 1), eri, k=2, drop_pad_mode=2, out=out)
        return out

    def finalize_grad(t):
        outs = (torch.empty(6, 2), None)
        moe_routing.moe_finalize_routing_grad(t, eri, out=outs)
        return outs[0]

    def init_grad(t):
        out = torch.empty(3, 2)
        moe_routing.moe_init_routing_grad(t.repeat(2, 1), eri, 2, out=out)
        return out

    return [("moe_finalize_routing", finalize), ("moe_finalize_routing_grad", finalize_grad),
            ("moe_init_routing_grad", init_grad)]


@pytest.mark.parametrize("index", range(3))
def test_forward_mode_ad_through_an_out_variant_is_refused(index):
    # The out= overloads are not differentiable: a tangent on an argument was dropped without a
    # word (jvp returned zeros, the out= tensor had no tangent); PyTorch's out= operators raise.
    import torch.autograd.forward_ad as fwAD
    name, f = _one_out_call_of_each_combine_operator()[index]
    x = torch.arange(6.0).view(3, 2)
    message = f"^{name}: forward-mode AD .* is not supported with out= .*, got .* with a tangent"
    with pytest.raises(NotImplementedError, match=message):
        torch.func.jvp(f, (x,), (torch.ones_like(x),))
    for grad_mode in (torch.enable_grad, torch.no_grad):
        with fwAD.dual_level(), grad_mode():
            with pytest.raises(NotImplementedError, match=message):
                f(fwAD.make_dual(x, torch.ones_like(x)))
    with fwAD.dual_level():  # a dual level without tangents: the call runs
        assert torch.equal(f(x), f(x.clone()))
