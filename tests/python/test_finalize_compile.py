"""torch.library.opcheck for the combine's operators (functional and out=), fake shapes equal real
shapes, torch.compile(fullgraph=True) of forward and backward bit for bit, dynamic shapes."""
import pytest
import torch

import moe_routing
import moe_routing.ops
from reference import random_values
from test_compile import assert_fake_error_equals_eager_error, assert_fake_shapes_equal_real_shapes

ops = torch.ops.moe_routing
I32 = torch.int32
FORWARD_ORDER = ["x1", "x2", "bias", "scales", "expert_idx", "x", "alpha1", "alpha2", "v", "drop_pad_mode",
                 "zero_expert_range", "copy_expert_range", "constant_expert_range", "k"]
FORWARD_DEFAULTS = dict(x1=None, x2=None, bias=None, scales=None, expert_idx=None, x=None, alpha1=None, alpha2=None,
                        v=None, drop_pad_mode=0, zero_expert_range=None, copy_expert_range=None,
                        constant_expert_range=None, k=1)
GRAD_ORDER = ["expanded_x", "scales", "expert_idx", "bias", "drop_pad_mode", "active_num", "expert_num",
              "expert_capacity"]
GRAD_DEFAULTS = dict(expanded_x=None, scales=None, expert_idx=None, bias=None, drop_pad_mode=0, active_num=0,
                     expert_num=0, expert_capacity=0)


def positional(args, kwargs, order, defaults):
    """The raw operator's call: CANN's arguments positionally, ours by keyword."""
    full = dict(defaults, **kwargs)
    keywords = {name: value for name, value in full.items() if name not in order}
    return tuple(args) + tuple(full[name] for name in order), keywords


def forward_samples():
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        n, k, h, e = 5, 3, 7, 4
        rows = random_values((n * k, h), dtype, gen)
        index = torch.randperm(n * k, generator=gen).to(I32)
        index[2] = -1
        experts = torch.randint(0, e, (n, k), generator=gen, dtype=I32)
        scales = random_values((n, k), torch.float32 if dtype == torch.bfloat16 else dtype, gen)
        x1, x2 = random_values((n, h), dtype, gen), random_values((n, h), dtype, gen)
        bias = random_values((e, h), dtype, gen)
        yield (rows, index), dict(scales=scales, drop_pad_mode=2)
        yield (rows[:9].contiguous(), index), dict(x1=x1, x2=x2, bias=bias, scales=scales, expert_idx=experts)
        yield (rows.view(e - 1, 5, h), torch.where(index < 15, index, -1).to(I32)), dict(
            x1=x1, scales=scales, drop_pad_mode=3, numerics="ascend_950")
        yield (rows.view(e - 1, 5, h), index), dict(k=3, drop_pad_mode=1)
        yield (rows, index), dict(x1=x1, bias=bias, scales=scales, expert_idx=experts, api="v1")
        yield (rows, index), dict(expert_idx=experts, x=x1, alpha1=bias[:1], alpha2=bias[1:2], v=bias[2:3], k=3,
                                  zero_expert_range=[0, 1], copy_expert_range=[1, 2], constant_expert_range=[3, 4])


def grad_samples():
    gen = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        n, k, h, e = 4, 3, 70, 3
        grad_y = random_values((n, h), dtype, gen)
        index = torch.randperm(n * k, generator=gen).to(I32)
        rows = random_values((n * k, h), dtype, gen)
        scales = random_values((n, k), torch.float32 if dtype == torch.bfloat16 else dtype, gen)
        experts = torch.randint(0, e, (n, k), generator=gen, dtype=I32)
        bias = random_values((e, h), dtype, gen)
        yield (grad_y, index), dict(expanded_x=rows, scales=scales)
        yield (grad_y, index), dict(expanded_x=rows[:7].contiguous(), scales=scales, active_num=7,
                                    numerics="ascend_950")
        yield (grad_y, torch.where(index < 8, index, -1).to(I32)), dict(
            expanded_x=rows[:8].view(2, 4, h), scales=scales, expert_idx=experts % 2, bias=bias[:2], drop_pad_mode=1,
            expert_num=2, expert_capacity=4, compute_grad_bias=True)
        yield (grad_y, index), dict(scales=scales, expert_idx=experts, bias=bias, compute_grad_scales=False,
                                    compute_grad_bias=True)
        yield (grad_y, index), {}


def all_samples():
    for args, kwargs in forward_samples():
        yield ("moe_finalize_routing",) + positional(args, kwargs, FORWARD_ORDER, FORWARD_DEFAULTS)
    for args, kwargs in grad_samples():
        yield ("moe_finalize_routing_grad",) + positional(args, kwargs, GRAD_ORDER, GRAD_DEFAULTS)


@pytest.mark.parametrize("name, args, kwargs", list(all_samples()))
def test_opcheck(name, args, kwargs):
    torch.library.opcheck(getattr(ops, name).default, args, kwargs)


@pytest.mark.parametrize("name, args, kwargs", list(all_samples()))
def test_fake_shapes_equal_real_shapes(name, args, kwargs):
    assert_fake_shapes_equal_real_shapes(name, args, kwargs)


def test_opcheck_out_variants():
    for args, kwargs in list(forward_samples())[:3]:
        pargs, pkw = positional(args, kwargs, FORWARD_ORDER, FORWARD_DEFAULTS)
        out = torch.empty_like(ops.moe_finalize_routing(*pargs, **pkw))
        torch.library.opcheck(ops.moe_finalize_routing.out, pargs, dict(pkw, out=out))
    for args, kwargs in list(grad_samples())[:3]:
        kwargs = {k: v for k, v in kwargs.items() if not k.startswith("compute_")}
        pargs, pkw = positional(args, kwargs, GRAD_ORDER, GRAD_DEFAULTS)
        gx, gs, gb = ops.moe_finalize_routing_grad(*pargs, **pkw, compute_grad_bias=True)
        outs = dict(grad_expanded_x=torch.empty_like(gx))
        if gs.numel():
            outs["grad_scales"] = torch.empty_like(gs)
        if gb.numel():
            outs["grad_bias"] = torch.empty_like(gb)
        torch.library.opcheck(ops.moe_finalize_routing_grad.out, pargs, dict(pkw, **outs))


def test_fake_out_variants_check_shapes_like_the_kernels():
    rows, index = torch.empty(6, 4, device="meta"), torch.empty(6, dtype=I32, device="meta")
    moe_routing.moe_finalize_routing(rows, index, k=2, out=torch.empty(3, 4, device="meta"))
    with pytest.raises(ValueError, match=r"moe_finalize_routing: out y must be a contiguous float32 tensor of "
                                         r"shape \[3, 4\]"):
        moe_routing.moe_finalize_routing(rows, index, k=2, out=torch.empty(3, 5, device="meta"))
    g = torch.empty(3, 4, device="meta")
    with pytest.raises(ValueError, match=r"moe_finalize_routing_grad: grad_scales needs scales and expanded_x, got "
                                         r"no expanded_x"):
        moe_routing.moe_finalize_routing_grad(g, index, None, torch.empty(3, 2, device="meta"),
                                              out=(torch.empty(6, 4, device="meta"), torch.empty(3, 2, device="meta")))


def _error(call):
    try:
        call()
    except ValueError as error:
        return str(error)
    return "no error"


# (drop_pad_mode, expert_num, expert_capacity, active_num, hidden, dtype): calls the core's shape
# inference refuses before any data is read.
REFUSED_GRAD_SHAPES = {
    # One expert's slots: 2^59 * 8 float32 elements = 2^64 bytes (2^62 elements: the strides fit).
    "bytes_per_expert_without_experts": (1, 0, 2**59, 0, 8, torch.float32),
    "bytes_per_expert_bfloat16": (1, 3, 2**60, 0, 4, torch.bfloat16),
    "int32_slots": (1, 2**20, 2**12, 0, 8, torch.float32),
    "negative_expert_num": (1, -1, 2, 0, 8, torch.float32),
    "negative_expert_capacity": (1, 2, -2, 0, 8, torch.float32),
    "negative_active_num": (0, 0, 0, -3, 8, torch.float32),
    "negative_expert_num_dropless": (0, -1, 0, 0, 8, torch.float32),
}


@pytest.mark.parametrize("case", sorted(REFUSED_GRAD_SHAPES))
def test_fake_grad_refuses_what_the_kernel_refuses(case):
    """The fake kernel (meta tensors, FakeTensorMode: what torch.compile traces with) refuses the
    grad's shapes that the eager kernel refuses, with the same message; it once traced them (and
    for an empty [0, C, H] returned a tensor whose byte strides overflow int64)."""
    mode, experts, capacity, active, hidden, dtype = REFUSED_GRAD_SHAPES[case]
    grad_y, index = torch.zeros(4, hidden, dtype=dtype), torch.full((8,), -1, dtype=I32)

    def call(g, i):
        return lambda: moe_routing.moe_finalize_routing_grad(g, i, drop_pad_mode=mode, active_num=active,
                                                             expert_num=experts, expert_capacity=capacity)

    eager = _error(call(grad_y, index))
    assert eager.startswith("moe_finalize_routing_grad: "), eager
    assert _error(call(grad_y.to("meta"), index.to("meta"))) == eager
    with torch._subclasses.fake_tensor.FakeTensorMode() as fake:
        assert _error(call(fake.from_tensor(grad_y), fake.from_tensor(index))) == eager


def test_fake_grad_refuses_more_than_int64_bytes():
    # E*C int32 and C*H bytes within int64, the whole not: a grad_y of 2^31 columns (8 GiB), so
    # compared with the core's message (meta.cpp) rather than run eagerly.
    grad_y, index = torch.empty(1, 2**31, device="meta"), torch.full((1,), -1, dtype=I32, device="meta")
    with pytest.raises(ValueError, match=r"^moe_finalize_routing_grad: grad_expanded_x would have more than "
                                         r"2\^63 - 1 bytes, got 2147483647 rows of 2147483648$"):
        moe_routing.moe_finalize_routing_grad(grad_y, index, drop_pad_mode=1, expert_num=2**31 - 1,
                                              expert_capacity=1)


def combine_layer(rows, index, x1, scales, bias, experts, numerics):
    out = moe_routing.moe_finalize_routing(rows * 2.0, index, x1, None, bias, scales, experts, drop_pad_mode=2,
                                           numerics=numerics)
    return out * 0.5


def combine_inputs(seed, n=13, k=4, h=100, e=5):
    gen = torch.Generator().manual_seed(seed)
    return dict(rows=random_values((n * k, h), torch.bfloat16, gen).requires_grad_(),
                index=torch.randperm(n * k, generator=gen).to(I32),
                x1=random_values((n, h), torch.bfloat16, gen).requires_grad_(),
                scales=random_values((n, k), torch.float32, gen).requires_grad_(),
                bias=random_values((e, h), torch.bfloat16, gen).requires_grad_(),
                experts=torch.randint(0, e, (n, k), generator=gen, dtype=I32))


def run_and_grads(fn, inputs, numerics, grad_seed=3):
    for t in inputs.values():
        t.grad = None
    out = fn(**inputs, numerics=numerics)
    out.backward(random_values(out.shape, torch.bfloat16, torch.Generator().manual_seed(grad_seed)))
    return [out.detach()] + [inputs[name].grad.clone() for name in ("rows", "x1", "scales", "bias")]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_combine_forward_and_backward_bitwise(backend):
    # fullgraph=True: forward and AOT-traced backward without a graph break. Only exact scalings by
    # powers of two around our operator, so every bit must survive code generation; the numerics
    # reaches the traced backward (grad_scales' order differs between the two at H = 100).
    grads = {}
    for numerics in ("atlas_a2", "ascend_950"):
        torch._dynamo.reset()
        inputs = combine_inputs(11)
        eager = run_and_grads(combine_layer, inputs, numerics)
        compiled = run_and_grads(torch.compile(combine_layer, fullgraph=True, backend=backend), inputs, numerics)
        for name, a, b in zip(["out", "rows", "x1", "scales", "bias"], eager, compiled):
            assert torch.equal(a.float().view(torch.int32), b.float().view(torch.int32)), (numerics, name)
        grads[numerics] = eager[3]
    assert not torch.equal(grads["atlas_a2"], grads["ascend_950"])


def test_compiled_column_layout_and_drop_pad_backward():
    def layer(rows, index, scales, mode):
        return moe_routing.moe_finalize_routing(rows, index, scales=scales, drop_pad_mode=mode)

    gen = torch.Generator().manual_seed(21)
    for mode, shape in ((0, (12, 6)), (1, (3, 4, 6)), (3, (3, 4, 6))):
        torch._dynamo.reset()
        rows = random_values(shape, torch.float32, gen)
        index = torch.randperm(12, generator=gen).to(I32)
        scales = torch.rand(4, 3, generator=gen)
        results = []
        for fn in (layer, torch.compile(layer, fullgraph=True, backend="aot_eager")):
            r, s = rows.clone().requires_grad_(), scales.clone().requires_grad_()
            out = fn(r, index, s, mode)
            out.backward(torch.ones_like(out))
            results.append((out.detach(), r.grad, s.grad))
        for a, b in zip(*results):
            assert torch.equal(a, b), mode


def test_compiled_with_dynamic_shapes():
    torch._dynamo.reset()

    def layer(rows, index, scales):
        return moe_routing.moe_finalize_routing(rows, index, scales=scales, drop_pad_mode=2)

    compiled = torch.compile(layer, fullgraph=True, dynamic=True, backend="aot_eager")
    for n in (3, 5, 9):
        gen = torch.Generator().manual_seed(n)
        rows = torch.randn(2 * n, 8, generator=gen)
        index = torch.randperm(2 * n, generator=gen).to(I32)
        scales = torch.rand(n, 2, generator=gen)
        got, want = [], []
        for fn, store in ((compiled, got), (layer, want)):
            r, s = rows.clone().requires_grad_(), scales.clone().requires_grad_()
            out = fn(r, index, s)
            out.sum().backward()
            store.extend([out.detach(), r.grad, s.grad])
        assert all(torch.equal(a, b) for a, b in zip(got, want)), n
    f = torch.compile(lambda g, i, x, s: moe_routing.moe_finalize_routing_grad(g, i, x, s), fullgraph=True,
                      dynamic=True)
    for n in (4, 7):
        g, x, s = torch.randn(n, 3), torch.randn(2 * n, 3), torch.rand(n, 2)
        i = torch.randperm(2 * n).to(I32)
        assert all(torch.equal(a, b) for a, b in zip(f(g, i, x, s), moe_routing.moe_finalize_routing_grad(g, i, x, s)))


def refused_combine_samples():
    n, k, h = 4, 2, 3
    rows = torch.randn(n * k, h)
    index = torch.randperm(n * k).to(I32)
    grad_y = torch.randn(n, h)
    # Each was refused differently on fake tensors (another check first, or other words).
    yield "moe_finalize_routing", (rows, index), dict(drop_pad_mode=1)
    yield "moe_finalize_routing", (rows.view(2, 4, h), index), {}
    yield "moe_finalize_routing", (rows.view(2, 4, h), index), dict(k=0)
    yield "moe_finalize_routing", (rows, index), dict(drop_pad_mode=2, api="v1")
    yield "moe_finalize_routing", (rows, index), dict(zero_expert_range=[0, 1, 2], numerics="x")
    yield "moe_finalize_routing", (rows, index), dict(zero_expert_range=[0, 1, 2], drop_pad_mode=4)
    yield "moe_finalize_routing", (rows.double(), index), dict(k=0)
    yield "moe_finalize_routing", (rows, index), dict(zero_expert_range=[2, 1])
    yield "moe_finalize_routing", (rows, index), dict(zero_expert_range=[0, 2], copy_expert_range=[1, 3])
    yield "moe_finalize_routing", (rows, index), dict(scales=torch.randn(n))
    yield "moe_finalize_routing_grad", (grad_y.double(), index), dict(active_num=-1)
    yield "moe_finalize_routing_grad", (grad_y, index), dict(bias=torch.randn(2, h).double(), drop_pad_mode=2)


@pytest.mark.parametrize("name, args, kwargs", list(refused_combine_samples()))
def test_fake_refuses_as_eager(name, args, kwargs):
    assert_fake_error_equals_eager_error(name, args, kwargs)


# moe_finalize_routing's refusals of k: (kwargs, message, whether the fake kernel refuses it too - the others
# need the extents, left to the kernel at run time).
K_ERRORS = [
    (dict(k=0), "moe_finalize_routing: k must be >= 1, got 0", True),
    (dict(k=3), "moe_finalize_routing: len(expanded_row_idx) must be a multiple of k (3), got 4", False),
    (dict(k=3, scales=torch.ones(2, 2)),
     "moe_finalize_routing: k must be 1 or scales.size(1) (2) when scales is given, got 3", False),
]


@pytest.mark.parametrize("kwargs, message, fake_refuses", K_ERRORS, ids=["k0", "multiple", "scales"])
def test_errors_about_k_name_k_on_every_path(kwargs, message, fake_refuses):
    """The top-k argument is `k` in the schema and in every Python signature; the core (and the C ABI and the
    CLI) call it top_k. The messages named top_k (and K for the length) in Python - eager, fake and compiled
    alike - an argument the caller never passed; the binding now names it as the schema does."""
    rows, index = torch.randn(4, 8), torch.arange(4, dtype=I32)
    calls = {
        "moe_routing": lambda r, i: moe_routing.moe_finalize_routing(r, i, **kwargs),
        "moe_routing.ops": lambda r, i: moe_routing.ops.moe_finalize_routing(r, i, **kwargs),
        "torch.ops": lambda r, i: ops.moe_finalize_routing(r, i, **kwargs),
        "out=": lambda r, i: moe_routing.moe_finalize_routing(r, i, **kwargs, out=r.new_empty(2, 8)),
        "torch.ops out=": lambda r, i: ops.moe_finalize_routing.out(r, i, **kwargs, out=r.new_empty(2, 8)),
        "autograd": lambda r, i: moe_routing.moe_finalize_routing(r.detach().requires_grad_(), i, **kwargs),
    }
    for path, call in calls.items():
        assert _error(lambda: call(rows, index)) == message, path
    if fake_refuses:
        with torch._subclasses.fake_tensor.FakeTensorMode() as fake:
            assert _error(lambda: calls["moe_routing"](fake.from_tensor(rows), fake.from_tensor(index))) == message
        assert _error(lambda: calls["torch.ops"](rows.to("meta"), index.to("meta"))) == message
    torch._dynamo.reset()
    compiled = torch.compile(calls["moe_routing"], fullgraph=True, backend="eager")
    with pytest.raises(Exception) as info:
        compiled(rows, index)
    if fake_refuses:  # at trace time, by the fake kernel: Dynamo's error carries it
        assert f"ValueError({message!r})" in str(info.value), str(info.value)
    else:  # at run time, by the kernel
        assert type(info.value) is ValueError and str(info.value) == message
