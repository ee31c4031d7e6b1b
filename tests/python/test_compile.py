"""torch.library.opcheck for every operator, fake shapes equal real shapes, and torch.compile
(fullgraph) of a small MoE layer matching eager bitwise."""
import os
import re
import sys

import numpy as np
import pytest
import torch

import moe_routing
from compile_errors import (MOE_INIT_ROUTING_INT_ARGUMENTS, NON_INT_TENSORS, NON_INT_TENSOR_IDS, TORCH_ENUM_IDS,
                            TORCH_ENUM_VALUES, assert_compiled_raises_value_error, non_int_tensor_message, outcome,
                            same_outcome)
from reference import random_values

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import tiny_moe  # noqa: E402

ops = torch.ops.moe_routing


def grad_samples():
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        g = random_values((12, 6), dtype, gen)
        eri = torch.randperm(12, generator=gen).to(torch.int32)
        yield (g, eri, 3), {}
        yield (g[:7].contiguous(), eri, 3, 0, 7), {}
        yield (g.view(3, 4, 6), torch.where(eri < 10, eri, -1).to(torch.int32), 3, 1, 0), {"order": "sequential"}
        yield (g, eri, 3), {"numerics": "ascend_950"}


def v2_samples():
    gen = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = random_values((6, 5), dtype, gen)
        idx = torch.randint(0, 4, (6, 2), generator=gen, dtype=torch.int32)
        yield (x, idx, 0, 0, 4, 0, 1, False), {}
        yield (x, idx, 5, 0, 4, 0, 2, False), {}
        yield (x, idx, 0, 3, 4, 1, 0, True), {}
        yield (x, idx, 0, 0, 4, 0, 1, False), {"numerics": "ascend_950"}


def v4_samples():
    gen = torch.Generator().manual_seed(2)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = random_values((6, 5), dtype, gen)
        idx = torch.randint(-1, 5, (6, 2), generator=gen, dtype=torch.int32)
        w = torch.rand(6, 2, generator=gen)
        s = torch.rand(6, generator=gen)
        base = dict(expert_num=5)
        yield (x, idx), dict(base, scale=s, topk_weight=w, expert_tokens_num_flag=True)
        yield (x, idx), dict(base, topk_weight=w, active_expert_range=[1, 4], row_idx_type=1, active_num=4)
        yield (x, idx), dict(base, expert_tokens_num_flag=True, expert_tokens_num_type=2)
        yield (x, idx.clamp(min=0)), dict(base, topk_weight=w, drop_pad_mode=1, expert_capacity=2)
        yield (x, idx), dict(base, quant_mode=1, numerics="ascend_950")
        yield (x, idx), dict(base, quant_mode=0, scale=torch.tensor([0.5]), offset=torch.tensor([1.0]))


V4_ORDER = ["scale", "offset", "topk_weight", "active_num", "expert_capacity", "expert_num", "drop_pad_mode",
            "expert_tokens_num_type", "expert_tokens_num_flag", "quant_mode", "active_expert_range",
            "row_idx_type", "x_dtype"]
V4_DEFAULTS = dict(scale=None, offset=None, topk_weight=None, active_num=-1, expert_capacity=-1, expert_num=-1,
                   drop_pad_mode=0, expert_tokens_num_type=0, expert_tokens_num_flag=False, quant_mode=-1,
                   active_expert_range=None, row_idx_type=0, x_dtype=None)


def v4_positional(args, kwargs):
    """The raw operator's call: every argument of CANN's positionally, ours (numerics) by keyword."""
    full = dict(V4_DEFAULTS, **kwargs)
    keywords = {name: full[name] for name in full if name not in V4_ORDER}
    return tuple(args) + tuple(full[name] for name in V4_ORDER), keywords


def all_samples():
    for args, kw in grad_samples():
        yield "moe_init_routing_grad", args, kw
    for args, kw in v2_samples():
        yield "moe_init_routing_v2", args, kw
    for args, kw in v4_samples():
        yield ("moe_init_routing",) + v4_positional(args, kw)


def test_opcheck_out_variants():
    g = torch.randn(12, 6)
    eri = torch.randperm(12).to(torch.int32)
    torch.library.opcheck(ops.moe_init_routing_grad.out, (g, eri, 3), {"out": torch.empty(4, 6)})
    x = torch.randn(6, 5)
    idx = torch.randint(0, 4, (6, 2), dtype=torch.int32)
    outs = moe_routing.moe_init_routing(x, idx, expert_num=4)
    names = ["expanded_x", "expanded_row_idx", "expert_tokens_count_or_cumsum", "expanded_scale",
             "expanded_topk_weight"]
    args, kwargs = v4_positional((x, idx), dict(expert_num=4, numerics="ascend_950"))
    torch.library.opcheck(ops.moe_init_routing.out, args,
                          dict(kwargs, **{n: torch.empty_like(t) for n, t in zip(names, outs)}))


@pytest.mark.parametrize("name, args, kwargs", list(all_samples()))
def test_opcheck(name, args, kwargs):
    torch.library.opcheck(getattr(ops, name).default, args, kwargs)


def assert_fake_shapes_equal_real_shapes(name, args, kwargs):
    """The operator on fake tensors gives the shapes and dtypes it gives on real ones."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    real = getattr(ops, name)(*args, **kwargs)
    real = real if isinstance(real, tuple) else (real,)
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake_kwargs = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        fake = getattr(ops, name)(*fake_args, **fake_kwargs)
    fake = fake if isinstance(fake, tuple) else (fake,)
    assert len(real) == len(fake), name
    for r, f in zip(real, fake):
        assert tuple(r.shape) == tuple(f.shape) and r.dtype == f.dtype, name


@pytest.mark.parametrize("name, args, kwargs", list(all_samples()))
def test_fake_shapes_equal_real_shapes(name, args, kwargs):
    assert_fake_shapes_equal_real_shapes(name, args, kwargs)


def _error(call):
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the type is what is compared
        return type(error), str(error)
    return None


def assert_fake_error_equals_eager_error(name, args, kwargs):
    """The operator on fake and on meta tensors refuses the call as the real kernel does: same
    exception type, same message (under torch.compile that is the error at trace time)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    op = getattr(ops, name)
    eager = _error(lambda: op(*args, **kwargs))
    assert eager is not None, "the case must be refused"

    def converted(convert):
        return ([convert(a) if isinstance(a, torch.Tensor) else a for a in args],
                {k: convert(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})

    with FakeTensorMode() as mode:
        fake_args, fake_kwargs = converted(mode.from_tensor)
        assert _error(lambda: op(*fake_args, **fake_kwargs)) == eager
    meta_args, meta_kwargs = converted(lambda t: t.to("meta"))
    assert _error(lambda: op(*meta_args, **meta_kwargs)) == eager


def refused_dispatch_samples():
    x = torch.randn(6, 5)
    idx = torch.randint(0, 4, (6, 2), dtype=torch.int32)
    g = torch.randn(12, 5)
    eri = torch.randperm(12).to(torch.int32)
    base = dict(expert_num=4)
    # Each was refused differently on fake tensors: a negative extent's RuntimeError ("Trying to
    # create tensor with negative dimension"), another check first, or other words.
    yield "moe_init_routing", (x, idx), dict(base, drop_pad_mode=1)  # expert_capacity left at -1
    yield "moe_init_routing", (x, idx), dict(base, active_expert_range=[3, 1])
    yield "moe_init_routing", (x, idx), dict(base, drop_pad_mode=1, expert_capacity=2, active_expert_range=[1, 3])
    yield "moe_init_routing", (x, idx), dict(base, quant_mode=2)
    yield "moe_init_routing", (x, idx), dict(base, quant_mode=10)
    yield "moe_init_routing", (x, idx), dict(drop_pad_mode=2)
    yield "moe_init_routing", (x, idx), dict(base, expert_tokens_num_type=3, drop_pad_mode=1)
    yield "moe_init_routing", (x.double(), idx), base
    yield "moe_init_routing", (x, idx.long()), base
    yield "moe_init_routing", (x.int(), idx), base
    yield "moe_init_routing_v2", (x, idx, 0, -1, 4, 1), {}
    yield "moe_init_routing_v2", (x, idx, 0, 2, -1, 1), {}
    yield "moe_init_routing_v2", (x.double(), idx, -1), {}
    yield "moe_init_routing_v2", (x.to(torch.int8), idx), {}
    yield "moe_init_routing_grad", (g, eri, 3, 1), {}
    yield "moe_init_routing_grad", (g, eri.long(), 3), {}
    yield "moe_init_routing_grad", (g, eri.view(3, 4), 3), {}
    yield "moe_init_routing_grad", (g.double(), eri, 0), {}
    yield "moe_init_routing_grad", (g, eri, 0, 2), {}
    yield "moe_init_routing_grad", (g, eri, 3, 1, -1), {}


@pytest.mark.parametrize("name, args, kwargs", list(refused_dispatch_samples()))
def test_fake_refuses_as_eager(name, args, kwargs):
    assert_fake_error_equals_eager_error(name, args, kwargs)


def test_out_errors_name_dtypes_as_python_does_on_fake_and_real_tensors():
    # The kernels named dtypes as c10 prints them ("got Half [4, 6]", "got Double"), the fake
    # functions as Python does ("torch.float16"); both now say float16 / float64.
    from torch._subclasses.fake_tensor import FakeTensorMode
    g = torch.randn(12, 6)
    eri = torch.randperm(12).to(torch.int32)
    for out, text in ((torch.empty(4, 6, dtype=torch.float16), "got float16 [4, 6] on cpu"),
                      (torch.empty(3, 6), "got float32 [3, 6] on cpu")):
        eager = _error(lambda: ops.moe_init_routing_grad.out(g, eri, 3, out=out))
        assert eager[0] is ValueError and eager[1].endswith(text), eager
        with FakeTensorMode() as mode:
            fake_g, fake_eri, fake_out = (mode.from_tensor(t) for t in (g, eri, out))
            assert _error(lambda: ops.moe_init_routing_grad.out(fake_g, fake_eri, 3, out=fake_out)) == eager
    with pytest.raises(ValueError, match=r"grad_expanded_x must have a dtype among .*, got float64$"):
        moe_routing.moe_init_routing_grad(g.double(), eri, 3)


def test_compiled_call_reports_the_eager_error_at_trace_time():
    # drop_pad_mode=1 without expert_capacity: torch.compile used to stop with "Trying to create
    # tensor with negative dimension -1" from the fake function instead of the operator's message.
    torch._dynamo.reset()
    x = torch.randn(4, 3)
    idx = torch.randint(0, 4, (4, 2), dtype=torch.int32)
    f = torch.compile(lambda x, i: moe_routing.moe_init_routing(x, i, expert_num=4, drop_pad_mode=1)[0],
                      fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="expert_capacity must be >= 1 when drop_pad_mode=1, got -1"):
        f(x, idx)


def _init_out():
    return tuple(torch.empty(0) for _ in range(5))


# (operator, argument, the bool given, a call of it taking (x, expert_idx, rows, index, flag)): every int argument
# of every operator, positional or by keyword as the public function takes it, and each out= variant once. The
# bool cases give the flag; the tensor cases give the tensor for it (the call's other arguments take 0 or 1).
INT_ARGUMENT_CASES = [
    ("moe_init_routing_grad", "top_k", True, lambda x, i, r, e, b: moe_routing.moe_init_routing_grad(r, e, b)),
    ("moe_init_routing_grad", "drop_pad_mode", False,
     lambda x, i, r, e, b: moe_routing.moe_init_routing_grad(r, e, 1, b)),
    ("moe_init_routing_grad", "active_num", True,
     lambda x, i, r, e, b: moe_routing.moe_init_routing_grad(r, e, 1, active_num=b)),
    ("moe_init_routing_grad", "top_k", True,
     lambda x, i, r, e, b: moe_routing.moe_init_routing_grad(r, e, b, out=torch.empty(8, 3))),
    ("moe_init_routing_v2", "active_num", True, lambda x, i, r, e, b: moe_routing.moe_init_routing_v2(x, i, b)),
    ("moe_init_routing_v2", "expert_capacity", True,
     lambda x, i, r, e, b: moe_routing.moe_init_routing_v2(x, i, expert_capacity=b)),
    ("moe_init_routing_v2", "expert_num", True, lambda x, i, r, e, b: moe_routing.moe_init_routing_v2(x, i, 0, 0, b)),
    ("moe_init_routing_v2", "drop_pad_mode", False,
     lambda x, i, r, e, b: moe_routing.moe_init_routing_v2(x, i, drop_pad_mode=b)),
    ("moe_init_routing_v2", "expert_tokens_count_or_cumsum_flag", True,
     lambda x, i, r, e, b: moe_routing.moe_init_routing_v2(x, i, expert_num=4, expert_tokens_count_or_cumsum_flag=b)),
    *[("moe_init_routing", name, flag,
       lambda x, i, r, e, b, name=name: moe_routing.moe_init_routing(x, i, **{"expert_num": 4, name: b}))
      for name, flag in MOE_INIT_ROUTING_INT_ARGUMENTS],
    ("moe_init_routing", "active_num", True,
     lambda x, i, r, e, b: moe_routing.moe_init_routing(x, i, None, None, None, b, expert_num=4, out=_init_out())),
    ("moe_finalize_routing", "drop_pad_mode", False,
     lambda x, i, r, e, b: moe_routing.moe_finalize_routing(r, e, drop_pad_mode=b, k=2)),
    ("moe_finalize_routing", "k", True, lambda x, i, r, e, b: moe_routing.moe_finalize_routing(r, e, k=b)),
    ("moe_finalize_routing", "k", True,
     lambda x, i, r, e, b: moe_routing.moe_finalize_routing(r, e, k=b, out=torch.empty(8, 3))),
    *[("moe_finalize_routing_grad", name, flag,
       lambda x, i, r, e, b, name=name: moe_routing.moe_finalize_routing_grad(r[:4], e, **{name: b}))
      for name, flag in (("drop_pad_mode", False), ("active_num", True), ("expert_num", True),
                         ("expert_capacity", True))],
    ("moe_finalize_routing_grad", "drop_pad_mode", True,
     lambda x, i, r, e, b: moe_routing.moe_finalize_routing_grad(r[:4], e, drop_pad_mode=b,
                                                                 out=(torch.empty(8, 3), None))),
]


INT_ARGUMENT_IDS = [f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(INT_ARGUMENT_CASES)]


def _int_argument_inputs():
    """(x, expert_idx, rows, index): the inputs each call of INT_ARGUMENT_CASES takes before the int."""
    x, idx = torch.randn(4, 3), torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0]], dtype=torch.int32)
    return x, idx, torch.randn(8, 3), torch.arange(8, dtype=torch.int32)


@pytest.mark.parametrize("operator,argument,flag,call", INT_ARGUMENT_CASES, ids=INT_ARGUMENT_IDS)
def test_compiled_call_refuses_a_bool_for_an_int(operator, argument, flag, call):
    # Under torch.compile the bool check was skipped and PyTorch's schema took True as 1, False as 0 (k=True
    # combined one expert per token): a silent wrong answer compiled only. A bool is a constant while tracing,
    # so the check runs at trace time, and fullgraph=True stops with eager's message.
    inputs = _int_argument_inputs()
    message = f"{operator}: {argument} must be an int, got {flag}"
    with pytest.raises(ValueError, match=f"^{message}$"):
        call(*inputs, flag)  # eager: the same message
    assert_compiled_raises_value_error(message, call, *inputs, flag)


@pytest.mark.parametrize("value", NON_INT_TENSORS, ids=NON_INT_TENSOR_IDS)
@pytest.mark.parametrize("operator,argument,flag,call", INT_ARGUMENT_CASES, ids=INT_ARGUMENT_IDS)
def test_a_tensor_other_than_a_0_dim_integer_one_for_an_int_is_refused(operator, argument, flag, call, value):
    # PyTorch's schema took a floating tensor as its truncation (k=torch.tensor(2.5) combined two experts per
    # token) and a single-element one of more dimensions as its element, eager and compiled; the check refused
    # only bools (compiled, only Python ones). A tensor's rank and dtype are constants while tracing, so the
    # compiled call stops at trace time with eager's message.
    inputs = _int_argument_inputs()
    message = non_int_tensor_message(operator, argument, value)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call(*inputs, value)
    assert_compiled_raises_value_error(message, call, *inputs, value)


@pytest.mark.parametrize("value", TORCH_ENUM_VALUES, ids=TORCH_ENUM_IDS)
@pytest.mark.parametrize("operator,argument,flag,call", INT_ARGUMENT_CASES, ids=INT_ARGUMENT_IDS)
def test_a_torch_enum_for_an_int_is_refused(operator, argument, flag, call, value):
    # PyTorch's schema took a torch.dtype, layout, memory_format or qscheme as its code (expert_num=torch.int64
    # as 4, k=torch.channels_last as 2), eager and compiled: a silent wrong answer. Such a value is a constant
    # while tracing, so the compiled call stops at trace time with eager's message. x_dtype names a dtype
    # (torch_npu passes one): a dtype reaches its own check, which refuses every value but None as not supported.
    inputs = _int_argument_inputs()
    if argument == "x_dtype" and isinstance(value, torch.dtype):
        with pytest.raises(NotImplementedError, match="x_dtype must be None"):
            call(*inputs, value)
        return
    message = f"{operator}: {argument} must be an int, got {value!r}"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call(*inputs, value)
    assert_compiled_raises_value_error(message, call, *inputs, value)


@pytest.mark.parametrize("value", [np.float64(2.5), np.array(2.5), np.array(2.5, dtype=np.float32)],
                         ids=["float64_scalar", "float64_array", "float32_array"])
def test_a_numpy_float_for_a_symint_argument_is_refused_compiled(value):
    # Dynamo hands a NumPy value on as a tensor; for a SymInt argument (active_num) the schema took a floating one
    # as its truncation (2 rows kept for 2.5), compiled only (eager refused np.float64 and now np.array(2.5)).
    # Dynamo cannot describe one while tracing ("repr() on tensor"), so fullgraph=True stops with that; without
    # it, the frame falls back to eager and eager's ValueError comes out. A NumPy int is still an int compiled.
    x, idx = torch.randn(4, 3), torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0]], dtype=torch.int32)

    def dispatch(x, idx, active_num):
        return moe_routing.moe_init_routing_v2(x, idx, active_num)[0]

    torch._dynamo.reset()
    with pytest.raises(Exception) as info:
        torch.compile(dispatch, fullgraph=True, backend="eager")(x, idx, value)
    assert isinstance(info.value, torch._dynamo.exc.TorchDynamoException), repr(info.value)
    torch._dynamo.reset()
    message = f"moe_init_routing_v2: active_num must be an int, got {value!r}"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        torch.compile(dispatch, backend="eager")(x, idx, value)
    for integer in (np.int64(3), np.array(3)):
        torch._dynamo.reset()
        compiled = torch.compile(dispatch, fullgraph=True, backend="eager")
        assert torch.equal(compiled(x, idx, integer), dispatch(x, idx, 3))


@pytest.mark.parametrize("operator,argument,flag,call", INT_ARGUMENT_CASES, ids=INT_ARGUMENT_IDS)
def test_a_0_dim_integer_tensor_for_an_int_is_the_int_it_holds(operator, argument, flag, call):
    # The refusal of other tensors keeps these as they were. Eager: int64 and int32 give what the int gives
    # (the same outputs, or the same error). Compiled, an int64 one for a SymInt argument (active_num, ...) too;
    # for an int one Dynamo stops (no int to pass while tracing): never another answer.
    inputs, value = _int_argument_inputs(), int(flag)
    expected = outcome(lambda: call(*inputs, value))
    for tensor in (torch.tensor(value), torch.tensor(value, dtype=torch.int32)):
        assert same_outcome(outcome(lambda: call(*inputs, tensor)), expected), (tensor, expected)
    schema = getattr(torch.ops.moe_routing, operator).default._schema
    symbolic = [str(a.type) for a in schema.arguments if a.name == argument][0] in ("SymInt", "Optional[SymInt]")
    torch._dynamo.reset()
    compiled = outcome(lambda: torch.compile(call, fullgraph=True, backend="eager")(*inputs, torch.tensor(value)))
    if compiled[0] == "raised":
        assert not (symbolic and expected[0] == "returned"), compiled
    else:
        assert same_outcome(compiled, expected), (compiled, expected)


def test_compiled_call_without_fullgraph_raises_the_value_error_itself():
    # Dynamo runs a frame that raises while traced eagerly when graph breaks are allowed: the ValueError itself.
    torch._dynamo.reset()
    compiled = torch.compile(lambda r, e, k: moe_routing.moe_finalize_routing(r, e, k=k), backend="eager")
    with pytest.raises(ValueError, match="^moe_finalize_routing: k must be an int, got True$"):
        compiled(torch.randn(8, 3), torch.arange(8, dtype=torch.int32), True)


def test_the_bool_check_traces_without_a_graph_break_and_keeps_ints_symbolic():
    # The check reads only constants (the int arguments' table built at import), so valid calls still trace
    # whole: one graph for every token count under dynamic=True, an int argument kept a SymInt.
    from torch._dynamo.testing import CompileCounterWithBackend

    def layer(x, idx, k):
        expanded_x, eri, _, _, _ = moe_routing.moe_init_routing(x, idx, expert_num=4, active_num=x.shape[0] * k)
        combined = moe_routing.moe_finalize_routing(expanded_x, eri, drop_pad_mode=2, k=k)
        return combined + moe_routing.moe_init_routing_grad(expanded_x, eri, k, 0, x.shape[0] * k)

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(layer, fullgraph=True, backend=counter, dynamic=True)
    gen = torch.Generator().manual_seed(12)
    for n in (4, 6, 9):
        x = torch.randn(n, 3, generator=gen)
        idx = torch.randint(0, 4, (n, 2), generator=gen, dtype=torch.int32)
        assert torch.equal(compiled(x, idx, 2), layer(x, idx, 2))
    assert counter.frame_count == 1


def _assert_close_to_rounding(a, b):
    # Agreement to float32 rounding at the tensor's own scale: a gradient whose elements sum terms of
    # magnitude ~20 differs by a few ulp of 20 (~2e-6) when the terms are added in another order,
    # also in an element that nearly cancels. A fixed atol of 1e-6 failed inductor's code on an
    # AVX-512 CPU (Intel, 2026-12-03) by 2e-6 in one element of 256, with max |grad| 21.5.
    scale = max(1.0, a.abs().max().item())
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * scale)


def _layer_outputs_and_grads(model, forward, x):
    model.zero_grad()
    out = forward(x)
    out.sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


def test_compiled_moe_layer_matches_eager_bitwise():
    # fullgraph=True: the whole layer, both operators included, traces without a graph break.
    # aot_eager runs the traced forward graph with eager kernels, so the output equals eager
    # bitwise. (The gradients of torch's own ops in the layer - the expert-weight gather's
    # index_put - are accumulated in a different order by AOT autograd, so they agree to rounding;
    # gradients through our operators are checked bitwise in test_inductor_dispatch_and_combine_bitwise.)
    torch._dynamo.reset()
    model = tiny_moe.TinyMoE(seed=3)
    x = torch.randn(40, 16, generator=torch.Generator().manual_seed(4))
    eager_out, eager_grads = _layer_outputs_and_grads(model, model.forward_ours, x)
    compiled = torch.compile(model.forward_ours, fullgraph=True, backend="aot_eager")
    out, grads = _layer_outputs_and_grads(model, compiled, x)
    assert torch.equal(eager_out, out)
    for a, b in zip(eager_grads, grads):
        _assert_close_to_rounding(a, b)


def test_inductor_moe_layer_matches_eager():
    # Inductor regenerates the layer's own float math (softmax, matmuls), so the layer agrees to
    # rounding; our operators' part is checked bitwise in the next test.
    torch._dynamo.reset()
    model = tiny_moe.TinyMoE(seed=5)
    x = torch.randn(40, 16, generator=torch.Generator().manual_seed(6))
    eager_out, eager_grads = _layer_outputs_and_grads(model, model.forward_ours, x)
    out, grads = _layer_outputs_and_grads(model, torch.compile(model.forward_ours, fullgraph=True), x)
    _assert_close_to_rounding(eager_out, out)
    for a, b in zip(eager_grads, grads):
        _assert_close_to_rounding(a, b)


def test_inductor_dispatch_and_combine_bitwise():
    # Only exact element-wise math around our operators, so every bit must survive inductor.
    def route_and_combine(x, idx, w, c):
        expanded_x, eri, _, _, etw = moe_routing.moe_init_routing(x, idx, topk_weight=w, expert_num=8)
        combined = moe_routing.moe_init_routing_grad(expanded_x * 2.0, eri, idx.shape[1])
        return combined.sum() + (etw * c).sum(), combined

    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(33, 24, generator=gen).requires_grad_()
    idx = torch.randint(0, 8, (33, 4), generator=gen, dtype=torch.int32)
    w = torch.rand(33, 4, generator=gen).requires_grad_()
    c = torch.randn(33 * 4, 1, generator=gen)
    loss, eager = route_and_combine(x, idx, w, c)
    loss.backward()
    eager_grads = (x.grad.clone(), w.grad.clone())
    x.grad = None
    w.grad = None
    loss, compiled = torch.compile(route_and_combine, fullgraph=True)(x, idx, w, c)
    loss.backward()
    assert torch.equal(eager, compiled)
    assert torch.equal(eager_grads[0], x.grad) and torch.equal(eager_grads[1], w.grad)


def test_compiled_grad_with_dynamic_shapes():
    torch._dynamo.reset()
    f = torch.compile(lambda g, i: moe_routing.moe_init_routing_grad(g, i, 2), fullgraph=True, dynamic=True)
    for n in (4, 7, 10):
        g = torch.randn(2 * n, 3)
        i = torch.randperm(2 * n).to(torch.int32)
        assert torch.equal(f(g, i), moe_routing.moe_init_routing_grad(g, i, 2))


def test_compiled_backward_keeps_the_forward_numerics():
    # The keyword-only numerics reaches the backward that AOT autograd traces (aot_eager: the
    # tracing without inductor's code generation, which adds nothing here but minutes): compiled
    # gradients equal eager ones bit for bit under each numerics, and the two numerics give
    # different gradients here (values over many binades, K=8), so a backward that dropped it
    # would fail.
    def route(x, idx, c, numerics):
        expanded_x = moe_routing.moe_init_routing(x, idx, expert_num=8, numerics=numerics)[0]
        return (expanded_x * c).sum()

    gen = torch.Generator().manual_seed(9)
    x = random_values((33, 24), torch.float32, gen)
    idx = torch.randint(0, 8, (33, 8), generator=gen, dtype=torch.int32)
    c = random_values((33 * 8, 24), torch.float32, gen)
    grads = {}
    for numerics in ("atlas_a2", "ascend_950"):
        torch._dynamo.reset()
        eager_x = x.clone().requires_grad_()
        route(eager_x, idx, c, numerics).backward()
        compiled_x = x.clone().requires_grad_()
        torch.compile(route, fullgraph=True, backend="aot_eager")(compiled_x, idx, c, numerics).backward()
        assert torch.equal(eager_x.grad.view(torch.int32), compiled_x.grad.view(torch.int32)), numerics
        grads[numerics] = eager_x.grad
    assert not torch.equal(grads["atlas_a2"].view(torch.int32), grads["ascend_950"].view(torch.int32))


def test_symbolic_active_num_keeps_one_graph():
    # moe_init_routing_v2 and moe_init_routing_grad took active_num as a plain int: a symbolic one
    # (x.shape[0] * K) was specialised to its value, so the token dimension marked dynamic gave a
    # ConstraintViolationError (and dynamic=True a recompile per token count).
    from torch._dynamo.testing import CompileCounterWithBackend

    def route_and_combine(x, idx):
        expanded_x, eri, _, _ = moe_routing.moe_init_routing_v2(x, idx, x.shape[0] * 2 - 1, expert_num=4)
        return moe_routing.moe_init_routing_grad(expanded_x, eri, 2, 0, x.shape[0] * 2 - 1)

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(route_and_combine, fullgraph=True, backend=counter)
    gen = torch.Generator().manual_seed(11)
    for n in (5, 7):
        x = torch.randn(n, 3, generator=gen)
        idx = torch.randint(0, 4, (n, 2), generator=gen, dtype=torch.int32)
        eager_x, compiled_x = x.clone().requires_grad_(), x.clone().requires_grad_()
        eager = route_and_combine(eager_x, idx)
        eager.sum().backward()
        torch._dynamo.mark_dynamic(compiled_x, 0)
        torch._dynamo.mark_dynamic(idx, 0)
        got = compiled(compiled_x, idx)
        got.sum().backward()
        assert torch.equal(eager, got) and torch.equal(eager_x.grad, compiled_x.grad)
    assert counter.frame_count == 1


def test_the_bool_check_knows_every_public_operator():
    # _api's table of int arguments is built from this list, not from the dispatcher's names at import (which
    # would take another library's registrations in the namespace, and failed the import on one without a
    # schema): a new operator must be added to it, and this says so.
    from moe_routing._api import PUBLIC_OPERATORS
    defined = {name.split("::")[1].split(".")[0] for name in torch._C._dispatch_get_all_op_names()
               if name.startswith("moe_routing::") and not name.startswith("moe_routing::_")}
    assert set(PUBLIC_OPERATORS) == defined


def test_another_librarys_registrations_in_the_namespace_leave_the_import_alone():
    # The table was built from every name the dispatcher knew in moe_routing::, at import: an implementation
    # registered there by another library (no schema) or an operator with no default overload failed the import.
    import subprocess
    script = ("import torch\n"
              "fragment = torch.library.Library('moe_routing', 'FRAGMENT')\n"
              "fragment.define('extra.variant(Tensor x) -> Tensor')\n"
              "impl = torch.library.Library('moe_routing', 'IMPL')\n"
              "impl.impl('extra_backend_op', lambda x: x, 'CPU')\n"
              "import moe_routing\n"
              "print(moe_routing.moe_finalize_routing.__name__)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["moe_finalize_routing"]
