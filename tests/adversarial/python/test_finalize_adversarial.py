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


@pytest.mark.parametrize("bad", [[0.9, 2.9], (1, 2.0), [torch.tensor(1.5), 3], ["0", "2"], [0, 1, 2], [3], 5])
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
