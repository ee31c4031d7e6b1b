"""Adversarial calls of the torch operators (issue 17, items 2, 9 and 10). Each call here was
accepted before and gave a wrong result, wrote where it must not, or computed nothing; each must
now raise a clear error - PyTorch's own where PyTorch's out= operators have one - and write
nothing."""
import pytest
import torch

import moe_routing

# PyTorch's messages (ATen/MemoryOverlap.cpp, torch/_library/autograd.py), matched in part.
OVERLAP = "some elements of the input tensor and the written-to tensor refer to a single memory location"
NOT_DIFFERENTIABLE = r"\(\): functions with out=\.\.\. arguments don't support automatic differentiation"


def routing_case(n=4, k=2, e=4, h=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, generator=gen)
    idx = torch.randint(0, e, (n, k), generator=gen, dtype=torch.int32)
    return x, idx, e


def forward_outs(x, idx, e, **kwargs):
    return tuple(torch.zeros_like(t) for t in moe_routing.moe_init_routing(x, idx, expert_num=e, **kwargs))


# ---- item 2: out= overlapping an input (or another output) ------------------------------------

def test_grad_out_overlapping_grad_expanded_x():
    g = torch.randn(18, 4)
    idx = torch.randperm(18, generator=torch.Generator().manual_seed(1)).to(torch.int32)
    before = g.clone()
    with pytest.raises(RuntimeError, match=OVERLAP):
        moe_routing.moe_init_routing_grad(g, idx, 3, out=g[:6])
    assert torch.equal(g, before)


def test_grad_out_overlapping_expanded_row_idx():
    # grad_x [6, 3] float32 laid over the 18 int32 indices themselves.
    idx = torch.randperm(18, generator=torch.Generator().manual_seed(2)).to(torch.int32)
    before = idx.clone()
    with pytest.raises(RuntimeError, match=OVERLAP):
        moe_routing.moe_init_routing_grad(torch.randn(18, 3), idx, 3, out=idx.view(torch.float32).view(6, 3))
    assert torch.equal(idx, before)


def assert_forward_refused(x, idx, e, change, error=RuntimeError, match=OVERLAP):
    """moe_init_routing with out= tensors edited by change(outs), which returns the tensor whose
    contents must survive the refused call."""
    outs = list(forward_outs(x, idx, e))
    watched = change(outs)
    before = watched.detach().clone()
    with pytest.raises(error, match=match):
        moe_routing.moe_init_routing(x, idx, expert_num=e, out=tuple(outs))
    assert torch.equal(watched.detach(), before)


def test_forward_out_overlapping_x():
    x, idx, e = routing_case()
    buffer = torch.randn(x.numel() * idx.shape[1])  # expanded_x [8, 8]; x is its first half
    x = buffer[:x.numel()].view(x.shape)

    def expanded_x_over_x(outs):
        outs[0] = buffer.view(outs[0].shape)
        return buffer
    assert_forward_refused(x, idx, e, expanded_x_over_x)


def test_forward_out_overlapping_expert_idx():
    x, idx, e = routing_case()

    def row_idx_over_expert_idx(outs):  # written over the indices it is computed from
        outs[1] = idx.view(-1)
        return idx
    assert_forward_refused(x, idx, e, row_idx_over_expert_idx)


def test_forward_outs_overlapping_each_other():
    x, idx, e = routing_case()

    def scale_over_row_idx(outs):
        outs[3] = outs[1].view(torch.float32)
        return outs[1]
    assert_forward_refused(x, idx, e, scale_over_row_idx)


def test_disjoint_views_of_one_buffer_are_fine():
    g = torch.randn(24, 4)
    idx = torch.randperm(18, generator=torch.Generator().manual_seed(3)).to(torch.int32)
    out = g[18:]  # [6, 4], after the 18 rows read
    moe_routing.moe_init_routing_grad(g[:18], idx, 3, out=out)
    assert torch.equal(out, moe_routing.moe_init_routing_grad(g[:18].clone(), idx, 3))


# ---- item 9: out= into a tensor that requires grad ----------------------------------------------

def test_grad_out_into_a_leaf_that_requires_grad():
    g = torch.randn(6, 4)
    idx = torch.arange(6, dtype=torch.int32)
    leaf = torch.zeros(3, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="moe_init_routing_grad" + NOT_DIFFERENTIABLE):
        moe_routing.moe_init_routing_grad(g, idx, 2, out=leaf)
    assert torch.equal(leaf.detach(), torch.zeros(3, 4))


def test_forward_out_into_a_leaf_that_requires_grad():
    x, idx, e = routing_case()

    def leaf_expanded_x(outs):
        outs[0] = torch.zeros_like(outs[0]).requires_grad_()
        return outs[0]
    assert_forward_refused(x, idx, e, leaf_expanded_x, match="moe_init_routing" + NOT_DIFFERENTIABLE)


def test_out_with_an_input_that_requires_grad():
    g = torch.randn(6, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match=NOT_DIFFERENTIABLE):
        moe_routing.moe_init_routing_grad(g, torch.arange(6, dtype=torch.int32), 2, out=torch.empty(3, 4))
    x, idx, e = routing_case()
    with pytest.raises(RuntimeError, match=NOT_DIFFERENTIABLE):
        moe_routing.moe_init_routing(x.requires_grad_(), idx, expert_num=e, out=forward_outs(x, idx, e))


def test_out_under_no_grad_writes_as_pytorch_does():
    # torch.add(a, b, out=leaf) is allowed under no_grad; so are ours, with the right result.
    g = torch.randn(6, 4)
    idx = torch.arange(6, dtype=torch.int32)
    leaf = torch.zeros(3, 4, requires_grad=True)
    with torch.no_grad():
        moe_routing.moe_init_routing_grad(g, idx, 2, out=leaf)
    assert torch.equal(leaf.detach(), moe_routing.moe_init_routing_grad(g, idx, 2))


# ---- out= into a tensor autograd saved for a backward ----------------------------------------------
# An out= call writes its tensors in place; as after PyTorch's own out= operators, a backward that
# saved one of them must then raise rather than compute the gradient from the new contents.
MODIFIED = "one of the variables needed for gradient computation has been modified by an inplace operation"


def test_out_over_a_saved_expanded_row_idx_makes_the_backward_raise():
    x, idx, e = routing_case()
    x.requires_grad_()
    outs = moe_routing.moe_init_routing(x, idx, expert_num=e)  # saves expanded_row_idx (outs[1])
    weight = torch.arange(outs[0].numel(), dtype=torch.float32).view(outs[0].shape)
    other = forward_outs(x.detach(), idx.flip(0), e)
    moe_routing.moe_init_routing(x.detach(), idx.flip(0), expert_num=e, out=(other[0], outs[1]) + other[2:])
    with pytest.raises(RuntimeError, match=MODIFIED):
        (outs[0] * weight).sum().backward()  # before: no error, and a gradient of the new routing


def out_calls():
    """(name, call(out tensors), the out tensors) for every out= overload, each out= tensor given."""
    x, idx, e = routing_case()
    g, rows = torch.randn(8, 8), torch.randperm(8, generator=torch.Generator().manual_seed(4)).to(torch.int32)
    scales = torch.rand(4, 2)
    return [
        ("moe_init_routing", lambda o: moe_routing.moe_init_routing(x, idx, expert_num=e, out=o),
         forward_outs(x, idx, e)),
        ("moe_init_routing_grad", lambda o: moe_routing.moe_init_routing_grad(g, rows, 2, out=o[0]),
         (torch.empty(4, 8),)),
        ("moe_finalize_routing", lambda o: moe_routing.moe_finalize_routing(g, rows, scales=scales, out=o[0]),
         (torch.empty(4, 8),)),
        ("moe_finalize_routing_grad",
         lambda o: moe_routing.moe_finalize_routing_grad(torch.randn(4, 8), rows, g, scales, out=o),
         (torch.empty(8, 8), torch.empty(4, 2))),
    ]


@pytest.mark.parametrize("case", range(4), ids=[c[0] for c in out_calls()])
def test_every_out_overload_bumps_the_version_of_what_it_writes(case):
    _, call, outs = out_calls()[case]
    before = [t._version for t in outs]
    call(outs)
    assert [t._version for t in outs] == [v + 1 for v in before]
    with torch.no_grad():  # as PyTorch's in-place operators: no_grad writes are tracked as well,
        call(outs)
    with torch.inference_mode():  # and so are inference mode's writes into normal tensors
        call(outs)
    assert [t._version for t in outs] == [v + 3 for v in before]


# ---- a tensor reaching past its storage ---------------------------------------------------------
# untyped_storage().resize_ shrinks a storage under the tensors viewing it; their shapes then reach
# past its memory, which a kernel would read or write out of bounds.
PAST_STORAGE = r"must lie within its storage \(was the storage resized after the tensor was made\?\), got "


def shrunk(shape, dtype=torch.float32, keep_bytes=64):
    t = torch.ones(shape, dtype=dtype)
    t.untyped_storage().resize_(keep_bytes)
    return t


def test_an_input_past_its_storage_is_refused():
    with pytest.raises(ValueError, match="moe_init_routing_grad: grad_expanded_x " + PAST_STORAGE):
        moe_routing.moe_init_routing_grad(shrunk((6, 4096)), torch.arange(6, dtype=torch.int32), 1)
    x, idx, e = routing_case(h=4096)
    with pytest.raises(ValueError, match="moe_init_routing: expert_idx " + PAST_STORAGE + "8 elements from"):
        moe_routing.moe_init_routing(x, shrunk(idx.shape, torch.int32, keep_bytes=28), expert_num=e)


def test_an_out_past_its_storage_is_refused_before_anything_is_written():
    out = torch.zeros(3, 4096)[1:]  # [2, 4096] from element 4096
    out.untyped_storage().resize_(4 * 4096 + 64)
    with pytest.raises(ValueError, match="moe_init_routing_grad: grad_x " + PAST_STORAGE + "8192 elements from "
                                         "element 4096 of a storage of 16448 bytes"):
        moe_routing.moe_init_routing_grad(torch.randn(4, 4096), torch.arange(4, dtype=torch.int32), 2, out=out)
    assert not torch.frombuffer(bytearray(out.untyped_storage()[4 * 4096:]), dtype=torch.uint8).any()


# ---- item 10: arguments that slipped through -----------------------------------------------------

@pytest.mark.parametrize("bad", [[0.9, 2.9], (1, 2.0), [torch.tensor(1.5), 3], ["0", "2"], [0, 1, 2], [3]])
def test_active_expert_range_must_be_two_ints(bad):
    x, idx, e = routing_case()
    with pytest.raises(ValueError, match=r"moe_init_routing: active_expert_range must be a list of two ints"):
        moe_routing.moe_init_routing(x, idx, expert_num=e, active_expert_range=bad)


def test_active_expert_range_accepts_integer_values_of_any_kind():
    x, idx, e = routing_case()
    expected = moe_routing.moe_init_routing(x, idx, expert_num=e, active_expert_range=[1, 3])
    for same in ((1, 3), [torch.tensor(1), 3], range(1, 3 + 1, 2)):
        got = moe_routing.moe_init_routing(x, idx, expert_num=e, active_expert_range=same)
        assert all(torch.equal(a, b) for a, b in zip(expected, got))


def test_grad_meta_out_with_cpu_inputs():
    with pytest.raises(ValueError, match=r"moe_init_routing_grad: out grad_x must be on cpu .* got meta"):
        moe_routing.moe_init_routing_grad(torch.randn(6, 4), torch.arange(6, dtype=torch.int32), 2,
                                          out=torch.empty(3, 4, device="meta"))


def test_forward_meta_out_with_cpu_inputs():
    x, idx, e = routing_case()

    def meta_counts(outs):
        outs[2] = torch.empty_like(outs[2], device="meta")
        return outs[0]
    assert_forward_refused(x, idx, e, meta_counts, error=ValueError,
                           match=r"moe_init_routing: out expert_tokens_count_or_cumsum must be on cpu .* got meta")


def test_meta_input_among_cpu_inputs():
    x, idx, e = routing_case()
    with pytest.raises(ValueError, match=r"moe_init_routing: expert_idx must be on cpu .* got meta"):
        moe_routing.moe_init_routing(x, idx.to("meta"), expert_num=e)
    with pytest.raises(ValueError, match=r"moe_init_routing_grad: expanded_row_idx must be on meta .* got cpu"):
        moe_routing.moe_init_routing_grad(torch.empty(6, 4, device="meta"), torch.arange(6, dtype=torch.int32), 2)


def test_all_meta_out_call_is_shape_checked():
    # Every tensor on the meta device is a legitimate shape-only call; a wrong out shape is still
    # reported as the CPU kernel reports it.
    g = torch.empty(6, 4, device="meta")
    idx = torch.empty(6, dtype=torch.int32, device="meta")
    moe_routing.moe_init_routing_grad(g, idx, 2, out=torch.empty(3, 4, device="meta"))
    with pytest.raises(ValueError, match=r"out grad_x must be a contiguous float32 tensor of shape \[3, 4\]"):
        moe_routing.moe_init_routing_grad(g, idx, 2, out=torch.empty(3, 5, device="meta"))


# ---- fakes refuse as the kernels do (an adversarial round, 2026-12-04) ----------------------------------

def _parity_cases():
    """(name, call(device)): each call differs from a valid one in one dtype, rank, attribute or input's presence,
    which the kernel refused on the CPU while the fake (meta tensors; torch.compile's trace) accepted it or
    refused it in other words."""
    def z(device, *shape, dtype=torch.float32):
        return torch.zeros(*shape, dtype=dtype, device=device)

    def idx(device):
        return torch.arange(8, dtype=torch.int32, device=device)

    def experts(device):
        return torch.tensor([[0, 1], [2, 3], [0, 1], [2, 3]], dtype=torch.int32, device=device)

    return [
        ("9-D grad", lambda d: moe_routing.moe_init_routing_grad(z(d, 1, 1, 1, 1, 1, 1, 1, 8, 8), idx(d), 2)),
        ("NUL in numerics", lambda d: moe_routing.moe_init_routing_grad(z(d, 8, 8), idx(d), 2, numerics="atlas_a2\0")),
        ("fp16 topk_weight", lambda d: moe_routing.moe_init_routing(z(d, 4, 8), experts(d), expert_num=4,
                                                                    topk_weight=z(d, 4, 2, dtype=torch.half))),
        ("fp16 offset", lambda d: moe_routing.moe_init_routing(z(d, 4, 8), experts(d), expert_num=4, quant_mode=0,
                                                               scale=z(d, 1), offset=z(d, 1, dtype=torch.half))),
        ("quant_mode 0 without scale", lambda d: moe_routing.moe_init_routing(z(d, 4, 8), experts(d), expert_num=4,
                                                                              quant_mode=0)),
        ("quant_mode 0 with a [4] scale", lambda d: moe_routing.moe_init_routing(z(d, 4, 8), experts(d),
                                                                                 expert_num=4, quant_mode=0,
                                                                                 scale=z(d, 4))),
        ("quant_mode 1 with a 1-D scale", lambda d: moe_routing.moe_init_routing(z(d, 4, 8), experts(d),
                                                                                 expert_num=4, quant_mode=1,
                                                                                 scale=z(d, 4))),
        # Extents: the fake let them through to the kernel (a trace built a graph that failed at its first run).
        ("quant_mode -1 with a [1] scale", lambda d: moe_routing.moe_init_routing(z(d, 4, 8), experts(d),
                                                                                  expert_num=4, scale=z(d, 1))),
        ("quant_mode -1 with a [1] scale and an offset", lambda d: moe_routing.moe_init_routing(
            z(d, 4, 8), experts(d), expert_num=4, scale=z(d, 1), offset=z(d, 1))),
        ("quant_mode 1 with a [2, 8] scale", lambda d: moe_routing.moe_init_routing(z(d, 4, 8), experts(d),
                                                                                    expert_num=4, quant_mode=1,
                                                                                    scale=z(d, 2, 8))),
        ("a [4, 3] topk_weight", lambda d: moe_routing.moe_init_routing(z(d, 4, 8), experts(d), expert_num=4,
                                                                       topk_weight=z(d, 4, 3))),
        ("a [2] offset", lambda d: moe_routing.moe_init_routing(z(d, 4, 8), experts(d), expert_num=4, quant_mode=0,
                                                                scale=z(d, 1), offset=z(d, 2))),
        ("api v1 without x1", lambda d: moe_routing.moe_finalize_routing(z(d, 8, 8), idx(d), k=2, api="v1")),
        ("zero range without expert_idx", lambda d: moe_routing.moe_finalize_routing(
            z(d, 8, 8), idx(d), k=2, drop_pad_mode=2, zero_expert_range=[0, 1])),
        ("copy range without x", lambda d: moe_routing.moe_finalize_routing(
            z(d, 8, 8), idx(d), expert_idx=experts(d), drop_pad_mode=2, copy_expert_range=[0, 1])),
        ("alpha without a constant range", lambda d: moe_routing.moe_finalize_routing(
            z(d, 8, 8), idx(d), k=2, drop_pad_mode=2, alpha1=z(d, 1, 8), alpha2=z(d, 1, 8), v=z(d, 1, 8))),
        ("int64 index of the combine grad", lambda d: moe_routing.moe_finalize_routing_grad(z(d, 4, 8), idx(d).long())),
        ("fp16 grad_y, fp32 expanded_x and scales", lambda d: moe_routing.moe_finalize_routing_grad(
            z(d, 4, 8, dtype=torch.half), idx(d), z(d, 8, 8), z(d, 4, 2))),
        ("9-D grad_scales out= without scales", lambda d: moe_routing.moe_finalize_routing_grad(
            z(d, 4, 8), idx(d), out=(z(d, 8, 8), z(d, 1, 1, 1, 1, 1, 1, 1, 1, 1)))),
        ("drop-pad slots beyond int32", lambda d: moe_routing.moe_init_routing_v2(
            z(d, 4, 0), z(d, 4, 1, dtype=torch.int32), 0, 4, 2**30, 1)),
        ("drop-pad slots beyond int32, the torch API", lambda d: moe_routing.moe_init_routing(
            z(d, 4, 0), z(d, 4, 1, dtype=torch.int32), expert_capacity=4, expert_num=2**30, drop_pad_mode=1)),
        # Outputs whose bytes pass int64 (an adversarial round of the C ABI, 2026-12-04): the core refuses them
        # in shape inference; the fake made PyTorch's "Storage size calculation overflowed".
        ("drop-pad expanded_x beyond int64 bytes", lambda d: moe_routing.moe_init_routing_v2(
            z(d, 0, 2**62), z(d, 0, 1, dtype=torch.int32), 0, 1, 1, 1)),
        ("drop-pad expanded_x beyond int64 bytes, the torch API", lambda d: moe_routing.moe_init_routing(
            z(d, 0, 2**62), z(d, 0, 1, dtype=torch.int32), expert_capacity=1, expert_num=1, drop_pad_mode=1)),
        ("grad_x beyond int64 bytes", lambda d: moe_routing.moe_init_routing_grad(
            z(d, 0, 1, 2**62), z(d, 1, dtype=torch.int32), 1, 1)),
        ("the combine's out beyond int64 bytes", lambda d: moe_routing.moe_finalize_routing(
            z(d, 0, 2**62), torch.full((1,), -1, dtype=torch.int32, device=d), drop_pad_mode=2)),
    ]


@pytest.mark.parametrize("name, call", _parity_cases(), ids=[c[0] for c in _parity_cases()])
def test_a_fake_refuses_as_the_kernel_does(name, call):
    with pytest.raises(ValueError) as on_cpu:
        call("cpu")
    with pytest.raises(ValueError) as on_meta:
        call("meta")
    assert str(on_meta.value).replace(" on meta", " on cpu") == str(on_cpu.value)


# ---- the dispatch and its ports (an adversarial round, 2026-12-04) ------------------------------------

def test_unpermute_without_probs_checks_its_indices_when_compiled():
    # Compiled, an index in [N*K, 2^31) was taken for a cut row and gave a zero row: the port passes the rows
    # as the grad's active_num, and the eager index check is not in the graph.
    import moe_routing.torch_npu as tn
    torch._dynamo.reset()
    compiled = torch.compile(tn.npu_moe_token_unpermute, fullgraph=True)
    for rows in (6, 5):  # every row present; one cut
        tokens = torch.randn(rows, 2)
        good = torch.tensor([0, 1, 2, 3, 4, 5 if rows == 6 else -1])
        assert torch.equal(compiled(tokens, good), tn.npu_moe_token_unpermute(tokens, good))
        bad = torch.tensor([0, 1, 2, 3, 4, 100])
        with pytest.raises(IndexError, match="100"):
            tn.npu_moe_token_unpermute(tokens, bad)
        with pytest.raises(IndexError, match="100"):
            compiled(tokens, bad)


def test_unpermute_refuses_more_rows_than_pairs():
    import moe_routing.torch_npu as tn
    with pytest.raises(ValueError, match=r"npu_moe_token_unpermute: permuted_tokens.size\(0\) must be at most N\*K "
                                         r"\(6\) in dropless mode, got 8"):
        tn.npu_moe_token_unpermute(torch.randn(8, 4), torch.arange(6))


def test_an_unsigned_tensor_above_int64_for_an_int_argument():
    x, ids = torch.randn(4, 8), torch.tensor([[0, 1], [2, 0], [1, 2], [0, 2]], dtype=torch.int32)
    big = torch.tensor(2**63, dtype=torch.uint64)
    with pytest.raises(ValueError, match="moe_init_routing: expert_num must be an int within int64"):
        moe_routing.moe_init_routing(x, ids, expert_num=big)
    with pytest.raises(ValueError, match="moe_init_routing_v2: active_num must be an int within int64"):
        moe_routing.moe_init_routing_v2(x, ids, active_num=big, expert_num=3)


@pytest.mark.parametrize("bad", [0.5, 2.0, float("nan"), None, torch.tensor(0.5), "yes"])
def test_a_bool_argument_takes_a_bool(bad):
    # PyTorch's schema took any value by its truth (0.5 and nan as True, None as False).
    x, ids = torch.randn(4, 8), torch.tensor([[0, 1], [2, 0], [1, 2], [0, 2]], dtype=torch.int32)
    with pytest.raises(ValueError, match="moe_init_routing: expert_tokens_num_flag must be a bool, got"):
        moe_routing.moe_init_routing(x, ids, expert_num=3, expert_tokens_num_flag=bad)
    with pytest.raises(ValueError, match="moe_init_routing_v2: expert_tokens_before_capacity_flag must be a bool"):
        moe_routing.moe_init_routing_v2(x, ids, 0, 0, 3, 0, 0, bad)


def test_a_bool_argument_takes_python_numpy_and_int_truths():
    import numpy as np
    x, ids = torch.randn(4, 8), torch.tensor([[0, 1], [2, 0], [1, 2], [0, 2]], dtype=torch.int32)
    expected = moe_routing.moe_init_routing(x, ids, expert_num=3, expert_tokens_num_flag=True)[2]
    for same in (1, np.True_, torch.tensor(True)):
        assert torch.equal(moe_routing.moe_init_routing(x, ids, expert_num=3, expert_tokens_num_flag=same)[2],
                           expected)


@pytest.mark.parametrize("bad", ["np.int64(1)", "torch.tensor(1)", "{0, 3}"])
def test_npu_init_routing_v2_active_expert_range_of_a_scalar_or_unordered_type(bad):
    # A NumPy or 0-d tensor scalar had no len() (a TypeError from inside the port).
    import numpy as np  # noqa: F401  (used by the eval)
    import moe_routing.torch_npu as tn
    x, ids = torch.randn(4, 8), torch.tensor([[0, 1], [2, 0], [1, 2], [0, 2]], dtype=torch.int32)
    with pytest.raises(ValueError, match="npu_moe_init_routing_v2: active_expert_range must be a list of two ints"):
        tn.npu_moe_init_routing_v2(x, ids, expert_num=3, active_expert_range=eval(bad))
