"""What autograd keeps of a forward for its backward. A backward may only refuse (PyTorch's "modified
by an inplace operation" or "Inference tensors cannot be saved for backward") over a tensor it
reads: PyTorch's own operators save an input only when a gradient that needs it is wanted. The
dispatch's backward used to save expert_idx whatever the row_idx_type, and the combine's every
input - expanded_x ([N*K, H], the largest activation) also where scales need no gradient - so a
valid program that changed such a tensor in place, or made it under torch.inference_mode(), got
an error that named a tensor the gradient never uses, and the memory stayed alive until the
backward. A tensor the backward does read still makes it raise when changed in place."""
import pytest
import torch

import moe_routing
from test_finalize_adversarial import combine_case as finalize_case, forward as combine

I32 = torch.int32
INPLACE = "modified by an inplace operation"


def dispatch_case(n=6, k=2, e=4, h=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, h, generator=gen), torch.randint(0, e, (n, k), generator=gen, dtype=I32),
            torch.rand(n, k, generator=gen), e)


def combine_case():
    return finalize_case(n=5, k=2, h=4, e=3, seed=1)


def grads(loss_of, leaves):
    """The gradients of loss_of() with respect to leaves, which are made to require grad."""
    for t in leaves:
        t.requires_grad_(True)
    return torch.autograd.grad(loss_of(), leaves)


# ---- the dispatch: expert_idx is read only by the scatter convention's dropless backward ----------

@pytest.mark.parametrize("kwargs", [dict(), dict(active_num=5), dict(drop_pad_mode=1, expert_capacity=2)],
                         ids=["dropless", "active", "drop-pad"])
def test_dispatch_backward_leaves_expert_idx_alone_where_it_does_not_read_it(kwargs):
    x, idx, w, e = dispatch_case()
    gen = torch.Generator().manual_seed(5)
    out = moe_routing.moe_init_routing(x, idx, topk_weight=w, expert_num=e, **kwargs)
    g0, g4 = torch.randn(out[0].shape, generator=gen), torch.randn(out[4].shape, generator=gen)
    expected = torch.autograd.grad(
        moe_routing.moe_init_routing(x.requires_grad_(), idx, topk_weight=w.requires_grad_(), expert_num=e,
                                     **kwargs)[::4], (x, w), (g0, g4))
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    idx2 = idx.clone()
    out = moe_routing.moe_init_routing(x2, idx2, topk_weight=w2, expert_num=e, **kwargs)
    idx2.fill_(0)  # the caller reuses its index buffer before the backward
    got = torch.autograd.grad(out[::4], (x2, w2), (g0, g4))
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_dispatch_backward_with_an_inference_mode_expert_idx():
    # A frozen router run under torch.inference_mode(): its expert_idx is an inference tensor.
    x, idx, w, e = dispatch_case()
    expected = grads(lambda: moe_routing.moe_init_routing(x, idx, topk_weight=w, expert_num=e)[0].sum()
                     + moe_routing.moe_init_routing(x, idx, topk_weight=w, expert_num=e)[4].sum(), [x, w])
    with torch.inference_mode():
        frozen = idx.clone()
    got = grads(lambda: moe_routing.moe_init_routing(x, frozen, topk_weight=w, expert_num=e)[0].sum()
                + moe_routing.moe_init_routing(x, frozen, topk_weight=w, expert_num=e)[4].sum(), [x, w])
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_dispatch_backward_that_reads_expert_idx_still_refuses_it_changed():
    x, idx, w, e = dispatch_case()
    out = moe_routing.moe_init_routing(x.requires_grad_(), idx, expert_num=e, active_expert_range=[1, 3],
                                       row_idx_type=1)
    idx.add_(1)
    with pytest.raises(RuntimeError, match=INPLACE):
        out[0].sum().backward()


# ---- the combine: expanded_x for grad_scales, bias / expert_idx for grad_scales and grad_bias --------

@pytest.mark.parametrize("changed", ["expanded_x", "bias", "expert_idx"])
def test_combine_backward_of_expanded_x_alone_leaves_what_it_does_not_read(changed):
    case = combine_case()
    gen = torch.Generator().manual_seed(7)
    grad_y = torch.randn(5, 4, generator=gen)
    ex = case["expanded_x"].clone().requires_grad_()
    expected, = torch.autograd.grad(combine(dict(case, expanded_x=ex)), ex, grad_y)
    case = {name: t.clone() for name, t in case.items()}
    ex = case["expanded_x"].requires_grad_()
    y = combine(case)
    with torch.no_grad():
        case[changed].copy_(torch.zeros_like(case[changed]))  # e.g. a buffer reused for the next micro-batch
    got, = torch.autograd.grad(y, ex, grad_y)
    assert torch.equal(got, expected)


def test_combine_backward_of_the_shared_expert_alone_takes_inference_mode_inputs():
    case = combine_case()
    with torch.inference_mode():
        frozen = {name: t.clone() for name, t in case.items() if name != "x1"}
    x1 = case["x1"].clone().requires_grad_()
    y = combine(dict(frozen, x1=x1))
    grad_y = torch.randn(y.shape, generator=torch.Generator().manual_seed(3))
    got, = torch.autograd.grad(y, x1, grad_y)
    assert torch.equal(got, grad_y)


@pytest.mark.parametrize("wanted, changed", [("scales", "expanded_x"), ("scales", "bias"), ("scales", "expert_idx"),
                                             ("expanded_x", "scales"), ("bias", "scales"),
                                             ("bias", "expert_idx"), ("expanded_x", "expanded_row_idx")])
def test_combine_backward_still_refuses_a_tensor_it_reads_changed_in_place(wanted, changed):
    case = {name: t.clone() for name, t in combine_case().items()}
    case[wanted].requires_grad_()
    y = combine(case)
    with torch.no_grad():
        case[changed].add_(1) if changed != "expert_idx" else case[changed].fill_(0)
    with pytest.raises(RuntimeError, match=INPLACE):
        y.sum().backward()


def test_combine_backward_with_no_rows_and_nothing_saved_for_expanded_x():
    # R = 0 rows: the gradients are zeros of the saved shapes, also without expanded_x itself.
    ex = torch.zeros(0, 4, requires_grad=True)
    bias = torch.randn(3, 4, requires_grad=True)
    scales = torch.rand(2, 2)
    y = moe_routing.moe_finalize_routing(ex, torch.full((4,), -1, dtype=I32), None, None, bias, scales,
                                         torch.zeros(2, 2, dtype=I32), drop_pad_mode=2)
    g_ex, g_bias = torch.autograd.grad(y, (ex, bias), torch.ones(2, 4))
    assert g_ex.shape == (0, 4) and torch.equal(g_bias, torch.zeros(3, 4))


def test_token_unpermute_with_zero_skips_leaves_its_rows_alone_where_probs_need_no_gradient():
    # npu_moe_token_unpermute's atlas_a2 path (a pair whose prob is 0 adds nothing) is a Function of its own,
    # which saved the rows whatever was wanted: changed in place after the forward, they made the backward of
    # the rows alone refuse them.
    import moe_routing.torch_npu as torch_npu
    n, k, h = 5, 2, 4
    gen = torch.Generator().manual_seed(2)
    rows = torch.randn(n * k, h, generator=gen)
    index = torch.randperm(n * k, generator=gen).to(I32)
    probs = torch.rand(n, k, generator=gen)
    probs[1, 0] = 0

    def grad_of_rows(change):
        leaf = rows.clone().requires_grad_()
        source = leaf * 1
        out = torch_npu.npu_moe_token_unpermute(source, index, probs)
        if change:
            source.add_(1)  # the values the backward of the rows alone never reads
        gy = torch.arange(out.numel(), dtype=out.dtype).view_as(out)
        (out * gy).sum().backward()
        return leaf.grad

    assert torch.equal(grad_of_rows(True), grad_of_rows(False))
    leaf = rows.clone().requires_grad_()
    source = leaf * 1
    wanted = probs.clone().requires_grad_()
    out = torch_npu.npu_moe_token_unpermute(source, index, wanted)
    source.add_(1)
    with pytest.raises(RuntimeError, match=INPLACE):  # scales' gradient reads the rows
        out.sum().backward()
