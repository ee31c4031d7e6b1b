"""Adversarial calls of the combine's torch operators, as test_torch_adversarial.py for the
dispatch: out= tensors overlapping an input or each other, out= tensors that require grad, devices
that do not match, arguments that would slip through. Each must raise a clear error - PyTorch's
own where PyTorch's out= operators have one - and write nothing."""
import pytest
import torch

import moe_routing

OVERLAP = "some elements of the input tensor and the written-to tensor refer to a single memory location"
NOT_DIFFERENTIABLE = r"\(\): functions with out=\.\.\. arguments don't support automatic differentiation"
I32 = torch.int32


def combine_case(n=4, k=2, h=8, e=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return dict(expanded_x=torch.randn(n * k, h, generator=gen),
                expanded_row_idx=torch.randperm(n * k, generator=gen).to(I32),
                x1=torch.randn(n, h, generator=gen), scales=torch.rand(n, k, generator=gen),
                bias=torch.randn(e, h, generator=gen),
                expert_idx=torch.randint(0, e, (n, k), generator=gen, dtype=I32))


def forward(case, **kwargs):
    case = dict(case)
    return moe_routing.moe_finalize_routing(case.pop("expanded_x"), case.pop("expanded_row_idx"), drop_pad_mode=2,
                                            **case, **kwargs)


def assert_refused(call, watched, error=RuntimeError, match=OVERLAP):
    before = watched.detach().clone()
    with pytest.raises(error, match=match):
        call()
    assert torch.equal(watched.detach(), before)


# ---- out= overlapping an input ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["expanded_x", "x1", "scales", "bias"])
def test_forward_out_overlapping_an_input(name):
    case = combine_case()
    buffer = torch.randn(case[name].numel() + 64)
    case[name] = buffer[:case[name].numel()].view(case[name].shape)  # out [4, 8] starts at the same address
    assert_refused(lambda: forward(case, out=buffer[:32].view(4, 8)), buffer)


def test_forward_out_over_the_index():
    case = combine_case(n=4, k=8, h=2)  # 32 int32 indices = the 8 float32 of out [4, 2]
    out = case["expanded_row_idx"].view(torch.float32)[:8].view(4, 2)
    assert_refused(lambda: forward(case, out=out), case["expanded_row_idx"])


def test_forward_out_in_place_over_x1_is_refused():
    # A tempting in-place residual update (out=x1) reads x1 while writing it.
    case = combine_case()
    assert_refused(lambda: forward(case, out=case["x1"]), case["x1"])


def test_forward_disjoint_view_of_one_buffer_is_fine():
    case = combine_case()
    buffer = torch.empty(case["expanded_x"].numel() + 32)
    buffer[:64] = case["expanded_x"].view(-1)
    case_in_buffer = dict(case, expanded_x=buffer[:64].view(8, 8))
    out = buffer[64:].view(4, 8)
    forward(case_in_buffer, out=out)
    assert torch.equal(out, forward(case))


def grad_call(case, **kwargs):
    return moe_routing.moe_finalize_routing_grad(torch.randn(4, 8, generator=torch.Generator().manual_seed(1)),
                                                 case["expanded_row_idx"], case["expanded_x"], case["scales"],
                                                 case["expert_idx"], case["bias"], **kwargs)


def grad_outs(case):
    return (torch.zeros(8, 8), torch.zeros(4, 2), torch.zeros(3, 8))


def test_grad_out_overlapping_expanded_x():
    case = combine_case()
    outs = list(grad_outs(case))
    outs[0] = case["expanded_x"]  # grad_expanded_x written over the rows grad_scales reads
    assert_refused(lambda: grad_call(case, grad_bias=True, out=tuple(outs)), case["expanded_x"])


def test_grad_out_scales_over_scales():
    case = combine_case()
    outs = list(grad_outs(case))
    outs[1] = case["scales"]
    assert_refused(lambda: grad_call(case, grad_bias=True, out=tuple(outs)), case["scales"])


def test_grad_outs_overlapping_each_other():
    case = combine_case()
    outs = list(grad_outs(case))
    outs[1] = outs[0][:1].view(4, 2)  # grad_scales inside grad_expanded_x's first row
    assert_refused(lambda: grad_call(case, grad_bias=True, out=tuple(outs)), outs[0])
    outs = list(grad_outs(case))
    outs[2] = outs[0][5:8]  # grad_bias over grad_expanded_x's last rows
    assert_refused(lambda: grad_call(case, grad_bias=True, out=tuple(outs)), outs[0])


# ---- out= and autograd --------------------------------------------------------------------------------

def test_forward_out_into_a_leaf_that_requires_grad():
    case = combine_case()
    out = torch.zeros(4, 8, requires_grad=True)
    assert_refused(lambda: forward(case, out=out), out, match="moe_finalize_routing" + NOT_DIFFERENTIABLE)


def test_out_with_inputs_that_require_grad():
    case = combine_case()
    for name in ("expanded_x", "x1", "scales", "bias"):
        changed = dict(case, **{name: case[name].clone().requires_grad_()})
        out = torch.zeros(4, 8)
        assert_refused(lambda: forward(changed, out=out), out, match=NOT_DIFFERENTIABLE)
    outs = grad_outs(case)
    g = torch.randn(4, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="moe_finalize_routing_grad" + NOT_DIFFERENTIABLE):
        moe_routing.moe_finalize_routing_grad(g, case["expanded_row_idx"], case["expanded_x"], case["scales"],
                                              out=outs[:2])
    assert outs[0].eq(0).all() and outs[1].eq(0).all()


def test_out_under_no_grad_writes_as_pytorch_does():
    case = combine_case()
    out = torch.zeros(4, 8, requires_grad=True)
    with torch.no_grad():
        forward(case, out=out)
    assert torch.equal(out.detach(), forward(case))


# ---- devices and shapes -------------------------------------------------------------------------------

def test_meta_out_with_cpu_inputs():
    case = combine_case()
    with pytest.raises(ValueError, match=r"moe_finalize_routing: out y must be on cpu .* got meta"):
        forward(case, out=torch.empty(4, 8, device="meta"))
    with pytest.raises(ValueError, match=r"moe_finalize_routing_grad: out grad_scales must be on cpu .* got meta"):
        grad_call(case, out=(torch.zeros(8, 8), torch.empty(4, 2, device="meta")))


@pytest.mark.parametrize("name", ["expanded_row_idx", "x1", "scales", "bias", "expert_idx"])
def test_meta_input_among_cpu_inputs(name):
    case = combine_case()
    case[name] = case[name].to("meta")
    with pytest.raises(ValueError, match=rf"moe_finalize_routing: {name} must be on cpu \(the device of the "
                                         rf"operator's first input\), got meta"):
        forward(case)


def test_out_must_be_exactly_the_result():
    case = combine_case()
    for bad, got in ((torch.zeros(4, 9), r"float32 \[4, 9\]"),
                     (torch.zeros(8, 4).t(), r"float32 \[4, 8\] \(non-contiguous\)"),
                     (torch.zeros(4, 8, dtype=torch.float64), r"float64 \[4, 8\]"),
                     (torch.zeros(32), r"float32 \[32\]")):
        before = bad.clone()
        with pytest.raises(ValueError, match=r"moe_finalize_routing: out y must be a contiguous float32 tensor of "
                                             r"shape \[4, 8\] on cpu .* got " + got):
            forward(case, out=bad)
        assert torch.equal(bad, before)


@pytest.mark.parametrize("bad", [[0.9, 2.9], (1, 2.0), [torch.tensor(1.5), 3], ["0", "2"], [0, 1, 2], [3], 5,
                                 {3, 1}, frozenset({0, 2}), b"\x00\x01", bytearray(b"\x00\x01"), "01",
                                 {0: 1, 2: 3}])
def test_expert_ranges_must_be_two_ints(bad):
    case = combine_case()
    with pytest.raises(ValueError, match=r"moe_finalize_routing: zero_expert_range must be a list of two ints"):
        forward(case, zero_expert_range=bad)


def test_expert_ranges_accept_integer_values_of_any_kind():
    case = combine_case()
    expected = forward(case, zero_expert_range=[1, 2])
    for same in ((1, 2), [torch.tensor(1), 2], range(1, 3)):
        assert torch.equal(forward(case, zero_expert_range=same), expected)


def test_bad_index_writes_nothing_into_out():
    case = combine_case()
    case["expanded_row_idx"] = case["expanded_row_idx"].clone()
    case["expanded_row_idx"][5] = 8  # == N*K: not a row, not a cut pair
    out = torch.full((4, 8), 3.0)
    assert_refused(lambda: forward(case, out=out), out, error=IndexError,
                   match=r"^moe_finalize_routing: expanded_row_idx\[5\] must be in \[0, 8\) "
                         r"\(-1 marks a dropped pair\), got 8$")
    outs = (torch.full((8, 8), 3.0), torch.full((4, 2), 3.0))
    with pytest.raises(IndexError, match=r"^moe_finalize_routing_grad: expanded_row_idx\[5\] must be in \[0, 8\) "
                                         r"\(-1 marks a dropped pair\), got 8$"):
        grad_call(case, out=outs)
    assert outs[0].eq(3.0).all() and outs[1].eq(3.0).all()


# ---- autograd with inputs of any layout ----------------------------------------------------------------

def test_backward_with_a_transposed_expert_idx_and_a_special_range():
    # Regression: the backward marked the special experts' pairs with special.view(-1), and
    # special took expert_idx's strides: a transposed (non-contiguous) expert_idx, which the
    # forward accepts, made the backward raise "view size is not compatible".
    case = combine_case()
    transposed = case["expert_idx"].t().contiguous().t()
    assert not transposed.is_contiguous()
    grads = []
    for experts in (case["expert_idx"], transposed):
        leaves = {name: case[name].clone().requires_grad_() for name in ("expanded_x", "scales", "bias")}
        out = forward(dict(case, **leaves, expert_idx=experts), zero_expert_range=[1, 2])
        out.backward(torch.ones_like(out))
        grads.append([leaves[name].grad for name in ("expanded_x", "scales", "bias")])
    for want, got in zip(*grads):
        assert torch.equal(want, got)


# ---- found in an adversarial round (2026-12-04) -------------------------------------------------------

LAZY = r"must not be a lazily negated view \(its values are stored unnegated; write into a plain tensor\), got one"


def lazily_negated(shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype)._neg_view()


def test_out_lazy_views_are_refused_not_a_crash():
    # PyTorch's fallback for such a tensor expects the out= overload to return it; ours return nothing:
    # an internal assert, then a segfault on the next call. Twice each, so a crash would show.
    case = combine_case()
    idx = case["expanded_row_idx"]
    for _ in range(2):
        with pytest.raises(ValueError, match="moe_finalize_routing: out " + LAZY):
            forward(case, out=lazily_negated((4, 8)))
        with pytest.raises(ValueError, match="moe_finalize_routing: out " + LAZY):  # the public route to a neg bit
            forward(case, out=torch.zeros(4, 8, dtype=torch.complex64).conj().imag)
        with pytest.raises(ValueError, match="moe_finalize_routing_grad: grad_expanded_x " + LAZY):
            moe_routing.moe_finalize_routing_grad(torch.randn(4, 8), idx, out=(lazily_negated((8, 8)), None))
        with pytest.raises(ValueError, match="moe_init_routing_grad: out " + LAZY):
            moe_routing.moe_init_routing_grad(torch.randn(8, 8), idx, 2, out=lazily_negated((4, 8)))
        with pytest.raises(ValueError, match="moe_finalize_routing: out " + LAZY):
            torch.ops.moe_routing.moe_finalize_routing.out(case["expanded_x"], idx, scales=case["scales"],
                                                           drop_pad_mode=2, out=lazily_negated((4, 8)))


def test_lazily_negated_inputs_of_an_out_call_are_read_as_their_values():
    case = combine_case()
    expected = forward(case)
    negated = dict(case, expanded_x=(-case["expanded_x"])._neg_view(), x1=(-case["x1"])._neg_view())
    out = torch.empty(4, 8)
    forward(negated, out=out)
    assert torch.equal(out, expected)
    assert torch.equal(forward(negated), expected)


@pytest.mark.parametrize("call, name", [
    (lambda c: moe_routing.moe_finalize_routing(c["expanded_x"], None), "moe_finalize_routing: expanded_row_idx"),
    (lambda c: moe_routing.moe_finalize_routing(None, c["expanded_row_idx"]), "moe_finalize_routing: expanded_x"),
    (lambda c: moe_routing.moe_finalize_routing_grad(None, c["expanded_row_idx"]),
     "moe_finalize_routing_grad: grad_y"),
    (lambda c: moe_routing.moe_finalize_routing_grad(torch.randn(4, 8), None),
     "moe_finalize_routing_grad: expanded_row_idx"),
])
def test_none_for_a_required_tensor_is_named(call, name):
    # PyTorch's own message was "tensor does not have a device", naming neither function nor argument.
    with pytest.raises(ValueError, match=name + " must be a tensor, got NoneType"):
        call(combine_case())


@pytest.mark.parametrize("keyword, text, message", [
    ("numerics", "ascend_950\0junk", r'numerics must be "atlas_a2" or "ascend_950", got "ascend_950\\0junk"'),
    ("api", "v2\0x", r'api must be "v1" or "v2", got "v2\\0x"'),
])
def test_a_nul_inside_a_string_is_refused(keyword, text, message):
    # Read as a C string, "ascend_950\0junk" was ascend_950 in eager mode (the meta path refused it).
    with pytest.raises(ValueError, match="moe_finalize_routing: " + message):
        forward(combine_case(), **{keyword: text})


@pytest.mark.parametrize("bad", [0.5, float("nan"), 0.0, "yes"])
def test_grad_bias_must_be_a_bool(bad):
    case = combine_case()
    with pytest.raises(ValueError, match=f"moe_finalize_routing_grad: grad_bias must be a bool, got {bad!r}"):
        moe_routing.moe_finalize_routing_grad(torch.randn(4, 8), case["expanded_row_idx"], grad_bias=bad)


def meta(t):
    return None if t is None else t.to("meta")


@pytest.mark.parametrize("change", [
    dict(x1=torch.randn(4, 8).half()), dict(x1=torch.randn(4, 8, 1)), dict(x2=torch.randn(4, 8).int()),
    dict(scales=torch.rand(4, 2).half()), dict(scales=torch.rand(4, 2).int()),
    dict(bias=torch.randn(3, 8).half()), dict(bias=torch.randn(8)),
    dict(expert_idx=torch.zeros(4, 2, dtype=torch.int64)), dict(expert_idx=torch.zeros(8, dtype=I32)),
])
def test_meta_refuses_a_forward_input_of_a_wrong_dtype_or_rank_as_the_kernel(change):
    # docs/python.md: a fake function refuses a bad attribute, dtype or rank as the kernel does; these passed.
    case = dict(combine_case(), **change)
    with pytest.raises(ValueError) as on_cpu:
        forward(case)
    with pytest.raises(ValueError) as on_meta:
        forward({name: meta(t) for name, t in case.items()})
    assert str(on_meta.value) == str(on_cpu.value)


@pytest.mark.parametrize("change", [
    dict(grad_y=torch.randn(4, 8).int()), dict(scales=torch.rand(4, 2).int()),
    dict(expanded_x=torch.randn(8, 8).half()), dict(expanded_x=torch.randn(8, 4, 2)),
    dict(bias=torch.randn(3, 8).half()), dict(expert_idx=torch.zeros(4, 2, dtype=torch.int64)),
])
def test_meta_refuses_a_backward_input_of_a_wrong_dtype_or_rank_as_the_kernel(change):
    case = combine_case()
    args = dict(grad_y=torch.randn(4, 8), expanded_row_idx=case["expanded_row_idx"],
                expanded_x=case["expanded_x"], scales=case["scales"], expert_idx=case["expert_idx"],
                bias=case["bias"])
    args.update(change)
    with pytest.raises(ValueError) as on_cpu:
        moe_routing.moe_finalize_routing_grad(**args)
    with pytest.raises(ValueError) as on_meta:
        moe_routing.moe_finalize_routing_grad(**{name: meta(t) for name, t in args.items()})
    assert str(on_meta.value) == str(on_cpu.value)
