"""moe_init_routing_grad through torch: the seed's examples and those of
docs/spec/moe_init_routing.md §1.10, the plain-PyTorch reference bit for bit, errors and their
Python exception types, non-contiguous inputs."""
import pytest
import torch

import moe_routing
from reference import assert_bitwise_equal, grad_reference, random_grad_case

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SCENARIOS = ["dropless", "active", "drop_pad"]
TOP_KS = [1, 2, 3, 4, 5, 7, 8, 9, 16, 127, 128, 130]


def test_seed_example():
    g = torch.tensor([[1.0], [10.0], [100.0], [1000.0], [10000.0], [100000.0]])
    idx = torch.tensor([4, 1, 5, 3, 0, 2], dtype=torch.int32)
    out = moe_routing.moe_init_routing_grad(g, idx, 2)
    assert out.tolist() == [[10010.0], [101000.0], [101.0]]


def test_spec_g1_both_orders():
    g = torch.tensor([[-1, 0.5], [0.5, 0.5], [2.0 ** -30, 0.25], [0.125, 2], [1, 3], [0.25, -1]])
    idx = torch.tensor([4, 0, 2, 1, 5, 3], dtype=torch.int32)
    tree = moe_routing.moe_init_routing_grad(g, idx, 3)
    seq = moe_routing.moe_init_routing_grad(g, idx, 3, order="sequential")
    assert tree.tolist() == [[0.0, 3.75], [0.875, 1.5]]
    assert seq.tolist() == [[2.0 ** -30, 3.75], [0.875, 1.5]]


def test_spec_g2_active_bf16():
    g = torch.tensor([[1.0, 0.00390625], [-2.5, 3.0], [0.5, 1.0]], dtype=torch.bfloat16)
    idx = torch.tensor([2, 0, 4, 3, 1, 5], dtype=torch.int32)
    out = moe_routing.moe_init_routing_grad(g, idx, 2, 0, 3)
    assert out.float().tolist() == [[1.5, 1.0], [0.0, 0.0], [-2.5, 3.0]]


def test_spec_g3_drop_pad_fp16():
    g = torch.tensor([1, 2, 4, 8, 16, 32], dtype=torch.float16).view(3, 2, 1)
    idx = torch.tensor([0, 2, 1, 4, -1, 3, -1, -1], dtype=torch.int32)
    out = moe_routing.moe_init_routing_grad(g, idx, 2, drop_pad_mode=1)
    assert out.float().flatten().tolist() == [5, 18, 8, 0]


def test_spec_g4_g5_orders_disagree():
    g4 = torch.tensor([[1.0], [-1.0], [2.0 ** -24]], dtype=torch.float16)
    idx3 = torch.tensor([0, 1, 2], dtype=torch.int32)
    assert moe_routing.moe_init_routing_grad(g4, idx3, 3).view(torch.int16).item() == 0
    assert moe_routing.moe_init_routing_grad(g4, idx3, 3, order="sequential").view(torch.int16).item() == 1
    g5 = torch.tensor([[1.0], [2.0 ** -24], [-1.0], [2.0 ** -24], [2.0 ** -24]])
    idx5 = torch.arange(5, dtype=torch.int32)
    assert moe_routing.moe_init_routing_grad(g5, idx5, 5).item() == 2.0 ** -24
    assert moe_routing.moe_init_routing_grad(g5, idx5, 5, order="sequential").item() == 2.0 ** -23


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("order", ["tree", "sequential"])
def test_matches_plain_pytorch_reference(dtype, scenario, order):
    gen = torch.Generator().manual_seed(hash((str(dtype), scenario, order)) % 2**31)
    for k in TOP_KS:
        n = int(torch.randint(1, 9, (1,), generator=gen))
        h = 8 * int(torch.randint(1, 5, (1,), generator=gen)) + 3
        g, idx, kw = random_grad_case(scenario, dtype, n, k, h, gen)
        got = moe_routing.moe_init_routing_grad(g, idx, k, kw["drop_pad_mode"], kw["active_num"], order=order)
        expected = grad_reference(g, idx, k, kw["drop_pad_mode"], kw["active_num"], order)
        assert_bitwise_equal(expected, got, f"K={k} {scenario} {dtype} {order}")


def test_non_contiguous_inputs():
    gen = torch.Generator().manual_seed(1)
    g, idx, _ = random_grad_case("dropless", torch.float32, 6, 4, 10, gen, drop_fraction=0)
    g_nc = torch.stack([g, g], dim=2)[..., 0]  # strided view, same values as g
    idx_nc = torch.stack([idx, idx], dim=1)[:, 0]
    assert not g_nc.is_contiguous() and not idx_nc.is_contiguous()
    assert_bitwise_equal(moe_routing.moe_init_routing_grad(g, idx, 4),
                         moe_routing.moe_init_routing_grad(g_nc, idx_nc, 4), "non-contiguous")


def test_thread_count_does_not_change_bits():
    gen = torch.Generator().manual_seed(2)
    # 8 MB of gradient rows: enough for the kernel to split its loops over both threads
    g, idx, _ = random_grad_case("dropless", torch.bfloat16, 512, 8, 1024, gen)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = moe_routing.moe_init_routing_grad(g, idx, 8)
        torch.set_num_threads(2)
        two = moe_routing.moe_init_routing_grad(g, idx, 8)
    finally:
        torch.set_num_threads(before)
    assert_bitwise_equal(one, two, "1 vs 2 threads")


def test_kernels_loops_run_on_pytorchs_threads():
    # The CPU kernels' parallel loops run on PyTorch's intra-op pool (at::parallel_for). With
    # PyTorch's OpenMP backend that needs the extension compiled with OpenMP: without it every
    # loop silently ran on the calling thread only.
    assert torch.ops.moe_routing._uses_torch_pool(), \
        "this build keeps the library's own pool (see the warning of python/CMakeLists.txt)"
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.ops.moe_routing._parallel_loop_threads(2) == 2
        assert torch.ops.moe_routing._parallel_loop_threads(1) == 1
        torch.set_num_threads(1)
        assert torch.ops.moe_routing._parallel_loop_threads(2) == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="num_tasks must be >= 1, got 0"):
        torch.ops.moe_routing._parallel_loop_threads(0)


@pytest.mark.parametrize("args, kwargs, exc, message", [
    ((torch.zeros(6, 2), torch.arange(6, dtype=torch.int32), 0), {}, ValueError, "top_k must be > 0, got 0"),
    ((torch.zeros(6, 2), torch.arange(6, dtype=torch.int64), 2), {}, ValueError,
     "expanded_row_idx must be 1-D int32, got 1-D int64"),
    ((torch.zeros(6, 2), torch.arange(6, dtype=torch.int32), 2, 2), {}, ValueError, "drop_pad_mode must be 0"),
    ((torch.zeros(2, 3, 2), torch.arange(6, dtype=torch.int32), 2), {}, ValueError,
     "grad_expanded_x must be 2-D [rows, H] when drop_pad_mode=0, got 3-D"),
    ((torch.zeros(6, 2, dtype=torch.float64), torch.arange(6, dtype=torch.int32), 2), {}, ValueError,
     "grad_expanded_x must have a dtype among"),
    ((torch.zeros(6, 2), torch.tensor([0, 1, 2, 3, 4, 6], dtype=torch.int32), 2), {}, IndexError,
     "moe_init_routing_grad: expanded_row_idx[5] must be in [0, 6), got 6"),
    ((torch.zeros(6, 2), torch.arange(6, dtype=torch.int32), 2), {"order": "pairwise"}, ValueError,
     'order must be "tree" or "sequential", got "pairwise"'),
])
def test_errors_map_to_python_exceptions(args, kwargs, exc, message):
    with pytest.raises(exc) as info:
        moe_routing.moe_init_routing_grad(*args, **kwargs)
    assert message in str(info.value)


def test_empty_inputs():
    out = moe_routing.moe_init_routing_grad(torch.zeros(0, 5), torch.zeros(0, dtype=torch.int32), 2)
    assert out.shape == (0, 5)
    out = moe_routing.moe_init_routing_grad(torch.zeros(0, 3, 4), torch.full((4,), -1, dtype=torch.int32), 2,
                                            drop_pad_mode=1)
    assert out.shape == (2, 4) and out.eq(0).all() and not torch.signbit(out).any()
