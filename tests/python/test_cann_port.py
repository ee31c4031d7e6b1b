"""moe_routing.ops ports cann_ops_transformer.ops by one import: the functions accept CANN's
arguments positionally and by keyword, in CANN's order with CANN's defaults, and the calls of
CANN's documentation (torchapi_moe_init_routing.md: single operator and graph mode) and of the
seed article's two examples (torchapi_moe_init_routing_grad.md: manual and automatic backward) run
here as written, with `.npu()` / device="npu" dropped."""
import inspect
import re

import numpy
import pytest
import torch
import torch._dynamo.testing

from moe_routing.ops import (moe_finalize_routing, moe_finalize_routing_grad, moe_init_routing, moe_init_routing_grad,
                              moe_init_routing_v2)
from reference import assert_bitwise_equal, grad_reference, v4_reference

_REQUIRED = inspect.Parameter.empty
# CANN's Python functions (cann_ops_transformer/ops/moe): name and default of each parameter, in
# order, every one positional-or-keyword.
CANN_MOE_INIT_ROUTING = [
    ("x", _REQUIRED), ("expert_idx", _REQUIRED), ("scale", None), ("offset", None), ("topk_weight", None),
    ("active_num", -1), ("expert_capacity", -1), ("expert_num", -1), ("drop_pad_mode", 0),
    ("expert_tokens_num_type", 0), ("expert_tokens_num_flag", False), ("quant_mode", -1),
    ("active_expert_range", None), ("row_idx_type", 0), ("x_dtype", None)]
CANN_MOE_INIT_ROUTING_GRAD = [
    ("grad_expanded_x", _REQUIRED), ("expanded_row_idx", _REQUIRED), ("top_k", _REQUIRED), ("drop_pad_mode", 0),
    ("active_num", 0)]
OUTPUT_NAMES = ("expanded_x", "expanded_row_idx", "expert_tokens_count_or_cumsum", "expanded_scale",
                "expanded_topk_weight")


def check_signature(function, cann):
    params = list(inspect.signature(function).parameters.values())
    head = [(p.name, p.default) for p in params[:len(cann)]]
    assert head == cann, function.__name__
    assert all(p.kind == p.POSITIONAL_OR_KEYWORD for p in params[:len(cann)])
    assert all(p.kind == p.KEYWORD_ONLY for p in params[len(cann):]), "ours come after CANN's, by keyword"


def test_signatures_are_cann_s():
    check_signature(moe_init_routing, CANN_MOE_INIT_ROUTING)
    check_signature(moe_init_routing_grad, CANN_MOE_INIT_ROUTING_GRAD)


def test_operator_schemas_carry_cann_s_arguments():
    schema = torch.ops.moe_routing.moe_init_routing.default._schema
    positional = [a for a in schema.arguments if not a.kwarg_only]
    assert [a.name for a in positional] == [name for name, _ in CANN_MOE_INIT_ROUTING]
    assert "SymInt active_num=-1" in str(schema) and "int? x_dtype=None" in str(schema)
    grad = torch.ops.moe_routing.moe_init_routing_grad.default._schema
    assert [a.name for a in grad.arguments if not a.kwarg_only] == [n for n, _ in CANN_MOE_INIT_ROUTING_GRAD]


def test_every_argument_positionally():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 6, generator=gen)
    idx = torch.randint(0, 6, (5, 3), generator=gen, dtype=torch.int32)
    w = torch.rand(5, 3, generator=gen)
    s = torch.rand(5, generator=gen)
    positional = moe_init_routing(x, idx, s, None, w, 9, -1, 6, 0, 1, True, -1, [1, 5], 1, None)
    keywords = moe_init_routing(x, idx, scale=s, topk_weight=w, active_num=9, expert_num=6, expert_tokens_num_type=1,
                                expert_tokens_num_flag=True, active_expert_range=[1, 5], row_idx_type=1)
    for a, b, name in zip(keywords, positional, OUTPUT_NAMES):
        assert_bitwise_equal(a, b, name)
    g = torch.randn(9, 6, generator=gen)
    assert_bitwise_equal(moe_init_routing_grad(g, positional[1], 3, 0, 9),
                         moe_init_routing_grad(g, positional[1], top_k=3, drop_pad_mode=0, active_num=9), "grad")


def test_x_dtype_is_accepted_as_none_and_refused_otherwise():
    x = torch.randn(2, 4)
    idx = torch.zeros(2, 1, dtype=torch.int32)
    moe_init_routing(x, idx, None, None, None, -1, -1, 1, 0, 0, False, -1, None, 0, None)
    for code in (1, 290):  # any of CANN's codes (torch_npu's dtype numbers)
        try:
            moe_init_routing(x, idx, expert_num=1, x_dtype=code)
        except NotImplementedError as error:
            assert f"moe_init_routing: x_dtype must be None" in str(error) and str(code) in str(error)
        else:
            raise AssertionError("x_dtype was accepted")


def test_a_scalar_of_the_wrong_type_is_a_value_error_naming_it():
    # PyTorch's schema refused these with a RuntimeError that printed the whole schema and named
    # neither the function nor the argument our way.
    x, expert_idx = torch.randn(4, 3), torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0]], dtype=torch.int32)
    rows, index = torch.randn(8, 3), torch.arange(8, dtype=torch.int32)
    calls = [
        ("moe_init_routing: active_num must be an int, got 2.0",
         lambda: moe_init_routing(x, expert_idx, active_num=2.0)),
        ("moe_init_routing: expert_num must be an int, got 4.0",
         lambda: moe_init_routing(x, expert_idx, expert_num=4.0)),
        ("moe_init_routing: numerics must be a str, got 3", lambda: moe_init_routing(x, expert_idx, numerics=3)),
        ("moe_init_routing: active_num must be an int, got None",
         lambda: moe_init_routing(x, expert_idx, active_num=None)),
        ("moe_finalize_routing: numerics must be a str, got None",
         lambda: moe_finalize_routing(rows, index, numerics=None)),
        ("moe_init_routing_v2: active_num must be an int, got 2.0", lambda: moe_init_routing_v2(x, expert_idx, 2.0)),
        ("moe_init_routing_grad: top_k must be an int, got 2.0", lambda: moe_init_routing_grad(rows, index, 2.0)),
        ("moe_finalize_routing: k must be an int, got 2.0", lambda: moe_finalize_routing(rows, index, k=2.0)),
        ("moe_finalize_routing: drop_pad_mode must be an int, got '2'",
         lambda: moe_finalize_routing(rows, index, k=2, drop_pad_mode="2", out=torch.empty(4, 3))),
        ("moe_finalize_routing_grad: drop_pad_mode must be an int, got 0.0",
         lambda: moe_finalize_routing_grad(torch.randn(4, 3), index, drop_pad_mode=0.0)),
    ]
    for message, call in calls:
        with pytest.raises(ValueError, match=f"^{message}$"):
            call()
    with pytest.raises(ValueError, match="^moe_init_routing: expert_num must be an int, got 4.0$"):
        moe_init_routing(x.requires_grad_(), expert_idx, expert_num=4.0)  # the autograd path too


def test_a_bool_for_an_int_is_a_value_error_naming_it():
    # PyTorch's schema took True as 1 and False as 0 (k=True combined one expert per token), while the
    # ports and the distributed layer refuse a bool for an int. A bool argument still takes one.
    x, expert_idx = torch.randn(4, 3), torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0]], dtype=torch.int32)
    rows, index = torch.randn(8, 3), torch.arange(8, dtype=torch.int32)
    calls = [
        ("moe_finalize_routing: k must be an int, got True", lambda: moe_finalize_routing(rows, index, k=True)),
        ("moe_finalize_routing: drop_pad_mode must be an int, got False",
         lambda: moe_finalize_routing(rows, index, drop_pad_mode=False, k=2)),
        ("moe_finalize_routing: k must be an int, got True",
         lambda: moe_finalize_routing(rows, index, k=True, out=torch.empty(8, 3))),
        ("moe_finalize_routing: k must be an int, got True",
         lambda: moe_finalize_routing(rows.requires_grad_(), index, k=True)),  # the autograd path too
        ("moe_init_routing: expert_num must be an int, got True",
         lambda: moe_init_routing(x, expert_idx, expert_num=True)),
        ("moe_init_routing_v2: active_num must be an int, got True", lambda: moe_init_routing_v2(x, expert_idx, True)),
        ("moe_init_routing_grad: top_k must be an int, got True", lambda: moe_init_routing_grad(rows, index, True)),
        ("moe_finalize_routing_grad: drop_pad_mode must be an int, got False",
         lambda: moe_finalize_routing_grad(torch.randn(4, 3), index, drop_pad_mode=False)),
        # NumPy's and torch's bools too, and bools inside the [start, end] ranges.
        (r"moe_finalize_routing: k must be an int, got np.True_",
         lambda: moe_finalize_routing(rows, index, k=numpy.bool_(True))),
        (r"moe_finalize_routing: k must be an int or a 0-dim integer tensor, got a 0-D bool tensor",
         lambda: moe_finalize_routing(rows, index, k=torch.tensor(True))),
        (r"moe_init_routing: active_expert_range must be a list of two ints \[start, end\], got \[False, 4\]",
         lambda: moe_init_routing(x, expert_idx, expert_num=4, active_expert_range=[False, 4])),
        (r"moe_finalize_routing: zero_expert_range must be a list of two ints \[start, end\], got \[0, True\]",
         lambda: moe_finalize_routing(rows, index, k=2, zero_expert_range=[0, True])),
    ]
    for message, call in calls:
        with pytest.raises(ValueError, match=f"^{message}$"):
            call()
    # A bool for a bool argument is one, and an int for an int still is.
    assert moe_init_routing_v2(x, expert_idx, 0, 0, 0, 0, 0, False)[0].shape == (8, 3)
    assert moe_finalize_routing(rows, index, k=2).shape == (4, 3)


def test_a_value_the_schema_would_truncate_for_an_int_is_a_value_error_naming_it():
    # PyTorch's schema converts a value without __index__ through __int__: a NumPy float array (k=array(2.5)
    # combined two experts per token), a Decimal, a Fraction were taken as their truncation. Refused now, as a
    # float is; a NumPy int, scalar or 0-dim array, is still an int. (Tensors: test_compile.py.)
    from decimal import Decimal
    from fractions import Fraction
    x, expert_idx = torch.randn(4, 3), torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0]], dtype=torch.int32)
    rows, index = torch.randn(8, 3), torch.arange(8, dtype=torch.int32)
    for value in (numpy.array(2.5), numpy.array(2.5, dtype=numpy.float32), numpy.array([2]), Decimal("2.5"),
                  Fraction(5, 2)):
        for function, argument, call in (
                ("moe_finalize_routing", "k", lambda v: moe_finalize_routing(rows, index, k=v)),
                ("moe_init_routing_v2", "active_num", lambda v: moe_init_routing_v2(x, expert_idx, v)),
                ("moe_init_routing", "expert_num", lambda v: moe_init_routing(x, expert_idx, expert_num=v)),
                ("moe_finalize_routing_grad", "drop_pad_mode",
                 lambda v: moe_finalize_routing_grad(torch.randn(4, 3), index, drop_pad_mode=v))):
            message = f"{function}: {argument} must be an int, got {value!r}"
            with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
                call(value)
    for value in (numpy.int64(2), numpy.array(2), numpy.int32(2)):
        assert torch.equal(moe_finalize_routing(rows, index, k=value), moe_finalize_routing(rows, index, k=2))
        assert torch.equal(moe_init_routing_v2(x, expert_idx, value)[0], moe_init_routing_v2(x, expert_idx, 2)[0])


def test_an_int_outside_int64_is_a_value_error_naming_it():
    # PyTorch's schema refused these with a RuntimeError ("Expected a value of type 'int' ... but
    # instead found type 'int'") that named neither the function nor the argument our way.
    x, expert_idx = torch.randn(4, 3), torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0]], dtype=torch.int32)
    rows, index = torch.randn(8, 3), torch.arange(8, dtype=torch.int32)
    calls = [
        ("moe_init_routing: expert_num must be an int within int64, got 1180591620717411303424",
         lambda: moe_init_routing(x, expert_idx, expert_num=2**70)),
        ("moe_init_routing: active_num must be an int within int64, got -18446744073709551616",
         lambda: moe_init_routing(x, expert_idx, expert_num=4, active_num=-2**64)),
        (rf"moe_init_routing: active_expert_range must be a list of ints within int64, got \[0, {2**70}\]",
         lambda: moe_init_routing(x, expert_idx, expert_num=4, active_expert_range=[0, 2**70])),
        ("moe_init_routing_v2: expert_capacity must be an int within int64, got -9223372036854775809",
         lambda: moe_init_routing_v2(x, expert_idx, 0, -2**63 - 1)),
        ("moe_init_routing_grad: top_k must be an int within int64, got 18446744073709551616",
         lambda: moe_init_routing_grad(rows, index, 2**64)),
        ("moe_finalize_routing: k must be an int within int64, got 9223372036854775808",
         lambda: moe_finalize_routing(rows, index, k=2**63)),
        ("moe_finalize_routing: k must be an int within int64, got 9223372036854775808",
         lambda: moe_finalize_routing(rows, index, k=2**63, out=torch.empty(4, 3))),
        ("moe_finalize_routing_grad: expert_num must be an int within int64, got 9223372036854775808",
         lambda: moe_finalize_routing_grad(torch.randn(4, 3), index, drop_pad_mode=1, expert_num=2**63)),
    ]
    for message, call in calls:
        with pytest.raises(ValueError, match=f"^{message}$"):
            call()
    with pytest.raises(ValueError, match="^moe_init_routing: expert_num must be an int within int64, got "):
        moe_init_routing(x.requires_grad_(), expert_idx, expert_num=2**70)  # the autograd path too
    # The bounds themselves are int64s: the operator's own checks judge them.
    with pytest.raises(ValueError, match=r"^moe_finalize_routing: len\(expanded_row_idx\) must be a multiple of k "
                                         r"\(9223372036854775807\)"):
        moe_finalize_routing(rows, index, k=2**63 - 1)


def test_active_num_stays_symbolic_under_compile():
    # With an `int` active_num torch.compile would specialise on x.shape[0] * K and compile once per
    # token count; as a SymInt one graph serves them all.
    counter = torch._dynamo.testing.CompileCounter()

    @torch.compile(backend=counter, dynamic=True, fullgraph=True)
    def route(x, idx):
        return moe_init_routing(x, idx, active_num=x.shape[0] * idx.shape[1] - 3, expert_num=4)

    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(2)
    for n in (5, 7, 11):
        x = torch.randn(n, 8, generator=gen)
        idx = torch.randint(0, 4, (n, 2), generator=gen, dtype=torch.int32)
        expected = moe_init_routing(x, idx, active_num=2 * n - 3, expert_num=4)
        for a, b, name in zip(expected, route(x, idx), OUTPUT_NAMES):
            assert_bitwise_equal(a, b, f"N={n} {name}")
    assert counter.frame_count == 1


# ---- CANN's documentation: torchapi_moe_init_routing.md -------------------------------------------

def test_cann_doc_single_operator_example():
    torch.manual_seed(0)
    n = 3
    h = 2
    k = 4
    expert_num = 256
    expert_capacity = -1
    drop_pad_mode = 0
    expert_tokens_num_type = 1
    expert_tokens_num_flag = True
    quant_mode = -1
    active_expert_range = [0, 4]
    row_idx_type = 1

    x = torch.randn((n, h), dtype=torch.float32)
    expert_idx = torch.randint(0, expert_num, (n, k), dtype=torch.int32)
    expert_idx[0, 1] = 2  # (not in the example: so that at least one pair falls in [0, 4))
    scale = torch.randn((n,), dtype=torch.float32)

    expanded_x, expanded_row_idx, expert_tokens_count, expanded_scale, expanded_topk_weight = \
        moe_init_routing(x, expert_idx, scale=scale,
                         active_num=-1, expert_capacity=expert_capacity,
                         expert_num=expert_num, drop_pad_mode=drop_pad_mode,
                         expert_tokens_num_type=expert_tokens_num_type,
                         expert_tokens_num_flag=expert_tokens_num_flag,
                         quant_mode=quant_mode, active_expert_range=active_expert_range,
                         row_idx_type=row_idx_type)
    assert expanded_topk_weight.shape == (0,)
    expected = v4_reference(x, expert_idx, scale=scale, expert_num=expert_num, expert_tokens_num_type=1,
                            expert_tokens_num_flag=True, active_expert_range=[0, 4], row_idx_type=1)
    got = (expanded_x, expanded_row_idx, expert_tokens_count, expanded_scale, expanded_topk_weight)
    for e, g, name in zip(expected, got, OUTPUT_NAMES):
        assert_bitwise_equal(e, g, f"single operator: {name}")

    topk_weight = torch.randn((n, k), dtype=torch.float32)
    expanded_x, expanded_row_idx, expert_tokens_count, expanded_scale, expanded_topk_weight = \
        moe_init_routing(x, expert_idx, topk_weight=topk_weight, scale=scale,
                         active_num=-1, expert_capacity=expert_capacity,
                         expert_num=expert_num, drop_pad_mode=drop_pad_mode,
                         expert_tokens_num_type=expert_tokens_num_type,
                         expert_tokens_num_flag=expert_tokens_num_flag,
                         quant_mode=quant_mode, active_expert_range=active_expert_range,
                         row_idx_type=row_idx_type)
    expected = v4_reference(x, expert_idx, scale=scale, topk_weight=topk_weight, expert_num=expert_num,
                            expert_tokens_num_type=1, expert_tokens_num_flag=True, active_expert_range=[0, 4],
                            row_idx_type=1)
    got = (expanded_x, expanded_row_idx, expert_tokens_count, expanded_scale, expanded_topk_weight)
    for e, g, name in zip(expected, got, OUTPUT_NAMES):
        assert_bitwise_equal(e, g, f"single operator with topk_weight: {name}")


class MoeInitRoutingModel(torch.nn.Module):
    def forward(self, x, expert_idx, *, topk_weight=None, scale=None, offset=None,
                active_num=-1, expert_capacity=-1, expert_num=-1, drop_pad_mode=0,
                expert_tokens_num_type=0, expert_tokens_num_flag=False, quant_mode=-1,
                active_expert_range=None, row_idx_type=0):
        return moe_init_routing(x, expert_idx, topk_weight=topk_weight,
                                scale=scale, offset=offset, active_num=active_num,
                                expert_capacity=expert_capacity, expert_num=expert_num,
                                drop_pad_mode=drop_pad_mode,
                                expert_tokens_num_type=expert_tokens_num_type,
                                expert_tokens_num_flag=expert_tokens_num_flag,
                                quant_mode=quant_mode,
                                active_expert_range=active_expert_range,
                                row_idx_type=row_idx_type)


def test_cann_doc_graph_mode_example():
    # The documentation compiles with torchair's NPU backend; here torch.compile's own.
    torch._dynamo.reset()
    torch.manual_seed(1)
    n = 3
    h = 2
    k = 4
    expert_num = 256
    active_expert_range = [0, 4]

    x = torch.randn((n, h), dtype=torch.float32)
    expert_idx = torch.randint(0, expert_num, (n, k), dtype=torch.int32)
    expert_idx[1, 2] = 3  # (not in the example: so that at least one pair falls in [0, 4))
    topk_weight = torch.randn((n, k), dtype=torch.float32)
    scale = torch.randn((1,), dtype=torch.float32)
    offset = torch.randn((1,), dtype=torch.float32)

    model = MoeInitRoutingModel()
    model = torch.compile(model, dynamic=False)
    expanded_x, expanded_row_idx, expert_tokens_count, expanded_scale, expanded_topk_weight = \
        model(x, expert_idx, topk_weight=topk_weight, scale=scale, offset=offset,
              active_num=-1, expert_capacity=-1, expert_num=expert_num,
              drop_pad_mode=0, expert_tokens_num_type=1,
              expert_tokens_num_flag=True, quant_mode=0,
              active_expert_range=active_expert_range, row_idx_type=1)
    expected = v4_reference(x, expert_idx, scale=scale, offset=offset, topk_weight=topk_weight, expert_num=256,
                            expert_tokens_num_type=1, expert_tokens_num_flag=True, quant_mode=0,
                            active_expert_range=[0, 4], row_idx_type=1)
    assert expanded_x.dtype == torch.int8
    got = (expanded_x, expanded_row_idx, expert_tokens_count, expanded_scale, expanded_topk_weight)
    for e, g, name in zip(expected, got, OUTPUT_NAMES):
        if name != "expanded_scale":  # static quantisation: CANN leaves it empty, ours is unspecified
            assert_bitwise_equal(e, g, f"graph mode: {name}")


# ---- the seed article's two examples (torchapi_moe_init_routing_grad.md) ------------------------

def test_seed_example_manual_backward():
    torch.manual_seed(2)
    n = 4
    h = 8
    k = 2
    expert_num = 8
    drop_pad_mode = 0
    expert_tokens_num_type = 1
    expert_tokens_num_flag = True
    quant_mode = -1
    active_expert_range = [0, 4]
    row_idx_type = 0

    x = torch.randn((n, h), dtype=torch.float32)
    expert_idx = torch.randint(0, expert_num, (n, k), dtype=torch.int32)

    expanded_x, expanded_row_idx, expert_tokens_count, expanded_scale, expanded_topk_weight = \
        moe_init_routing(x, expert_idx, active_num=-1, expert_capacity=-1, expert_num=expert_num,
                         drop_pad_mode=drop_pad_mode, expert_tokens_num_type=expert_tokens_num_type,
                         expert_tokens_num_flag=expert_tokens_num_flag, quant_mode=quant_mode,
                         active_expert_range=active_expert_range, row_idx_type=row_idx_type)

    grad_expanded_x = torch.randn_like(expanded_x)
    grad_x = moe_init_routing_grad(grad_expanded_x, expanded_row_idx, top_k=k, drop_pad_mode=drop_pad_mode,
                                   active_num=0)
    assert grad_x.shape == torch.Size([4, 8])
    assert_bitwise_equal(grad_reference(grad_expanded_x, expanded_row_idx, k), grad_x, "seed example 1")


def test_seed_example_automatic_backward():
    torch.manual_seed(3)
    n = 4
    h = 8
    k = 2
    expert_num = 8

    x = torch.randn((n, h), dtype=torch.float32, requires_grad=True)
    expert_idx = torch.randint(0, expert_num, (n, k), dtype=torch.int32)

    expanded_x, expanded_row_idx, expert_tokens_count, expanded_scale, expanded_topk_weight = \
        moe_init_routing(x, expert_idx, active_num=-1, expert_capacity=-1, expert_num=expert_num,
                         drop_pad_mode=0, expert_tokens_num_type=1, expert_tokens_num_flag=True,
                         quant_mode=-1, active_expert_range=[0, 4], row_idx_type=0)

    loss = expanded_x.sum()
    loss.backward()
    assert x.grad.shape == torch.Size([4, 8])
    # d(sum)/dx[i] = the number of token i's pairs routed to an expert in [0, 4).
    routed = ((expert_idx >= 0) & (expert_idx < 4)).sum(dim=1, dtype=torch.float32)
    assert torch.equal(x.grad, routed[:, None].expand(n, h))
