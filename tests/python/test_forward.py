"""moe_init_routing_v2 and moe_init_routing through torch: the worked examples of
docs/spec/moe_init_routing.md, a plain-PyTorch statement of it (reference.py) bit for bit, errors
and their exception types."""
import itertools

import pytest
import torch

import moe_routing
from moe_routing.ops import moe_init_routing as ops_moe_init_routing
from reference import assert_bitwise_equal, random_values, v2_reference, v4_reference

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
V4_NAMES = ["expanded_x", "expanded_row_idx", "expert_tokens_count_or_cumsum", "expanded_scale",
            "expanded_topk_weight"]
V2_NAMES = ["expanded_x", "expanded_row_idx", "expert_tokens_count_or_cumsum", "expert_tokens_before_capacity"]


def assert_outputs_equal(expected, got, names, what):
    for e, g, name in zip(expected, got, names):
        assert_bitwise_equal(e, g, f"{what}: {name}")


def test_spec_f1_dropless_active_num():
    x = torch.tensor([[1, 1.5], [2, 2.5], [3, 3.5]])
    idx = torch.tensor([[1, 0], [2, 1], [0, 2]], dtype=torch.int32)
    ex, eri, cum, _ = moe_routing.moe_init_routing_v2(x, idx, active_num=3, expert_num=3,
                                                      expert_tokens_count_or_cumsum_flag=1)
    assert eri.tolist() == [2, 0, 4, 3, 1, 5]
    assert ex.tolist() == [[1, 1.5], [3, 3.5], [1, 1.5]]
    assert cum.tolist() == [2, 4, 6]
    ex, _, counts, _ = moe_routing.moe_init_routing_v2(x, idx, expert_num=3, expert_tokens_count_or_cumsum_flag=2)
    assert ex[:, 0].tolist() == [1, 3, 1, 2, 2, 3] and counts.tolist() == [2, 2, 2]


def test_spec_f2_drop_pad():
    x = torch.tensor([[10.0], [20.0], [30.0], [40.0]])
    idx = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0]], dtype=torch.int32)
    ex, eri, _, before = moe_routing.moe_init_routing_v2(
        x, idx, expert_capacity=2, expert_num=3, drop_pad_mode=1, expert_tokens_before_capacity_flag=True)
    assert eri.tolist() == [0, 2, 1, 4, -1, 3, -1, -1]
    assert ex.flatten().tolist() == [10, 20, 10, 30, 20, 0]
    assert before.tolist() == [4, 3, 1]


def test_spec_f3_range_row_idx_types_and_counts():
    x = torch.tensor([[1.0, 2], [3, 4], [5, 6]])
    idx = torch.tensor([[1, 3], [0, 2], [2, 1]], dtype=torch.int32)
    w = torch.tensor([[.1, .2], [.3, .4], [.5, .6]])
    common = dict(topk_weight=w, expert_num=4, active_expert_range=[1, 3], expert_tokens_num_flag=True)
    ex, eri, cum, _, etw = moe_routing.moe_init_routing(x, idx, **common)
    assert eri.tolist() == [0, -1, -1, 2, 3, 1]
    assert ex[:4].tolist() == [[1, 2], [5, 6], [3, 4], [5, 6]] and ex[4:].eq(0).all()
    assert cum.tolist() == [2, 4]
    assert torch.equal(etw[:4, 0], torch.tensor([0.1, 0.6, 0.4, 0.5]))
    _, eri1, counts, _, _ = moe_routing.moe_init_routing(x, idx, row_idx_type=1, expert_tokens_num_type=1, **common)
    assert eri1.tolist() == [0, 5, 3, 4, 1, 2] and counts.tolist() == [2, 2]
    _, _, kv, _, _ = moe_routing.moe_init_routing(x, idx, expert_tokens_num_type=2, **common)
    assert kv.tolist() == [[1, 2], [2, 2], [0, 0], [0, 0]]


def test_scatter_tail_ties_int32_max_with_the_ids_below_the_range():
    # docs/moe_init_routing.md, row_idx_type: the tail holds ids >= end by (id, p), then ids < start by p, and an
    # id equal to INT32_MAX takes its place among the latter by p (CANN's golden maps ids < start to INT32_MAX).
    x = torch.tensor([[1.0], [2.0], [3.0]])
    idx = torch.tensor([[0, 1], [2, 2**31 - 1], [1, 0]], dtype=torch.int32)
    kw = dict(expert_num=3, active_expert_range=[1, 2], row_idx_type=1)
    _, eri, _, _, _ = moe_routing.moe_init_routing(x, idx, **kw)
    assert eri.tolist()[2:] == [2, 0, 3, 5]
    assert_outputs_equal(v4_reference(x, idx, **kw), moe_routing.moe_init_routing(x, idx, **kw), V4_NAMES, "example")
    gen = torch.Generator().manual_seed(5)
    for n, k in [(7, 3), (40, 4)]:
        pool = torch.tensor([0, 1, 2, 3, 4, 5, 2**31 - 2, 2**31 - 1], dtype=torch.int32)
        idx = pool[torch.randint(0, pool.numel(), (n, k), generator=gen)]
        x = torch.randn(n, 5, generator=gen)
        for start, end in [(2, 4), (0, 6), (5, 6)]:
            kw = dict(expert_num=6, active_expert_range=[start, end], row_idx_type=1, expert_tokens_num_flag=True)
            assert_outputs_equal(v4_reference(x, idx, **kw), moe_routing.moe_init_routing(x, idx, **kw), V4_NAMES,
                                 f"n={n} k={k} range=[{start}, {end})")


def test_spec_q1_dynamic_int8():
    x = torch.tensor([[127.0, 2.5, -2.5, 0.5, -126.4]])
    idx = torch.zeros(1, 1, dtype=torch.int32)
    for numerics in ("atlas_a2", "ascend_950"):
        ex, _, _, scale, _ = moe_routing.moe_init_routing(x, idx, expert_num=1, quant_mode=1, numerics=numerics)
        assert ex.tolist() == [[127, 3, -3, 1, -126]] and scale.tolist() == [1.0]
    x2 = torch.tensor([[1.0, -0.5, 0.25, 0.0]])
    ex, _, _, scale, _ = moe_routing.moe_init_routing(x2, idx, expert_num=1, quant_mode=1)
    assert ex.tolist() == [[127, -64, 32, 0]] and scale.item() == 0.007874015718698502
    smooth = torch.tensor([[2.0, 1, -4, 1]])
    ex, _, _, scale, _ = moe_routing.moe_init_routing(x2, torch.ones(1, 1, dtype=torch.int32), scale=smooth,
                                                      expert_num=2, active_expert_range=[1, 2], quant_mode=1)
    assert ex[0].tolist() == [127, -32, -64, 0] and scale[0].item() == 0.015748031437397003


def test_spec_q2_static_int8_and_flavours():
    x = torch.tensor([[1.0, -0.75, 0.25, 100.0, -1.25]])
    idx = torch.zeros(1, 1, dtype=torch.int32)
    for numerics in ("atlas_a2", "ascend_950"):
        ex, _, _, _, _ = moe_routing.moe_init_routing(x, idx, scale=torch.tensor([2.0]), offset=torch.tensor([0.5]),
                                                      expert_num=1, quant_mode=0, numerics=numerics)
        assert ex.tolist() == [[2, -1, 1, 127, -2]]
    x = torch.tensor([[3.824000835418701]])
    a2 = moe_routing.moe_init_routing(x, idx, scale=torch.tensor([1.7]), expert_num=1, quant_mode=0)[0]
    a950 = moe_routing.moe_init_routing(x, idx, scale=torch.tensor([1.7]), expert_num=1, quant_mode=0,
                                        numerics="ascend_950")[0]
    assert a2.item() == 7 and a950.item() == 6


def _random_idx(n, k, lo, hi, gen):
    return torch.randint(lo, hi, (n, k), generator=gen, dtype=torch.int32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_v2_matches_reference(dtype):
    gen = torch.Generator().manual_seed(5)
    for n, k, e in [(1, 1, 1), (7, 3, 4), (33, 8, 16), (13, 2, 64)]:
        x = random_values((n, 19), dtype, gen)
        idx = _random_idx(n, k, 0, e, gen)
        for active_num, flag in itertools.product([0, 1, n * k // 2 + 1, n * k + 5], [0, 1, 2]):
            kw = dict(active_num=active_num, expert_num=e, expert_tokens_count_or_cumsum_flag=flag)
            assert_outputs_equal(v2_reference(x, idx, **kw), moe_routing.moe_init_routing_v2(x, idx, **kw),
                                 V2_NAMES, f"v2 dropless {kw}")
        for capacity in sorted({1, max(1, n // 2), n}):
            kw = dict(expert_capacity=capacity, expert_num=e, drop_pad_mode=1, expert_tokens_before_capacity_flag=True)
            assert_outputs_equal(v2_reference(x, idx, **kw), moe_routing.moe_init_routing_v2(x, idx, **kw),
                                 V2_NAMES, f"v2 drop-pad {kw}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("quant_mode", [-1, 0, 1])
def test_v4_matches_reference(dtype, quant_mode):
    gen = torch.Generator().manual_seed(11 + quant_mode)
    for n, k, e in [(1, 1, 2), (9, 3, 8), (31, 4, 16)]:
        x = random_values((n, 21), dtype, gen)
        idx = _random_idx(n, k, -1, e + 1, gen)  # includes -1 and e: not routed
        idx = idx.clamp(max=e - 1) if e == 1 else idx
        w = torch.rand(n, k, generator=gen)
        for start, end in [(0, e), (1, e - 1) if e > 2 else (0, e)]:
            for numerics, row_idx_type, num_type, active_num in itertools.product(
                    ["atlas_a2", "ascend_950"], [0, 1], [0, 1, 2], [-1, n * k // 3 + 1]):
                kw = dict(topk_weight=w, expert_num=e, active_expert_range=[start, end], expert_tokens_num_flag=True,
                          expert_tokens_num_type=num_type, row_idx_type=row_idx_type, active_num=active_num,
                          quant_mode=quant_mode, numerics=numerics)
                if quant_mode == -1:
                    kw["scale"] = torch.rand(n, generator=gen)
                elif quant_mode == 0:
                    kw["scale"], kw["offset"] = torch.tensor([1.7]), torch.tensor([-0.5])
                else:
                    kw["scale"] = torch.rand(end - start, 21, generator=gen) + 0.5
                assert_outputs_equal(v4_reference(x, idx, **kw), moe_routing.moe_init_routing(x, idx, **kw),
                                     V4_NAMES, f"v4 n={n} k={k} e={e} {kw}")
        if quant_mode == -1:
            idx_in = _random_idx(n, k, 0, e, gen)
            for capacity in sorted({1, max(1, n // 3), n}):
                kw = dict(topk_weight=w, scale=torch.rand(n, generator=gen), expert_num=e, expert_capacity=capacity,
                          drop_pad_mode=1, expert_tokens_num_flag=True)
                assert_outputs_equal(v4_reference(x, idx_in, **kw), moe_routing.moe_init_routing(x, idx_in, **kw),
                                     V4_NAMES, f"v4 drop-pad {kw}")


def test_ops_module_is_the_same_function():
    x = torch.randn(4, 8)
    idx = torch.randint(0, 4, (4, 2), dtype=torch.int32)
    a = ops_moe_init_routing(x, idx, expert_num=4)
    b = moe_routing.moe_init_routing(x, idx, expert_num=4)
    for u, v in zip(a, b):
        assert torch.equal(u, v)


def test_non_contiguous_inputs():
    gen = torch.Generator().manual_seed(3)
    x = random_values((10, 12), torch.bfloat16, gen)
    idx = _random_idx(10, 3, 0, 5, gen)
    x_nc = torch.stack([x, x], dim=2)[..., 0]
    idx_nc = idx.t().contiguous().t()
    assert not x_nc.is_contiguous() and not idx_nc.is_contiguous()
    assert_outputs_equal(moe_routing.moe_init_routing(x, idx, expert_num=5),
                         moe_routing.moe_init_routing(x_nc, idx_nc, expert_num=5), V4_NAMES, "non-contiguous")


@pytest.mark.parametrize("call, exc, message", [
    (lambda: moe_routing.moe_init_routing_v2(torch.zeros(2, 3), torch.tensor([[0, 7]], dtype=torch.int32).repeat(2, 1),
                                             expert_num=4, expert_tokens_count_or_cumsum_flag=2),
     IndexError, "moe_init_routing_v2: expert_idx[0][1] must be in [0, 4) (expert_num), got 7"),
    (lambda: moe_routing.moe_init_routing_v2(torch.zeros(2, 3), torch.zeros(3, 2, dtype=torch.int32)),
     ValueError, "expert_idx.size(0) must equal x.size(0)"),
    (lambda: moe_routing.moe_init_routing_v2(torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.int32), drop_pad_mode=1,
                                             expert_num=2), ValueError, "expert_capacity must be >= 1"),
    (lambda: moe_routing.moe_init_routing(torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.int32), expert_num=2,
                                          quant_mode=5), NotImplementedError, "quant_mode"),
    (lambda: moe_routing.moe_init_routing(torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.int32), expert_num=2,
                                          x_dtype=torch.int8), NotImplementedError, "x_dtype must be None"),
    (lambda: moe_routing.moe_init_routing(torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.int32)),
     ValueError, "expert_num must be >= 1, got -1"),
    (lambda: moe_routing.moe_init_routing(torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.int32), expert_num=4,
                                          active_expert_range=[3, 1]), ValueError, "active_expert_range"),
    (lambda: moe_routing.moe_init_routing(torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.int32), expert_num=4,
                                          numerics="a3"), ValueError, 'numerics must be "atlas_a2" or "ascend_950"'),
])
def test_errors_map_to_python_exceptions(call, exc, message):
    with pytest.raises(exc) as info:
        call()
    assert message in str(info.value)


def test_empty_batch():
    ex, eri, counts, scale, etw = moe_routing.moe_init_routing(torch.zeros(0, 8), torch.zeros(0, 2, dtype=torch.int32),
                                                               expert_num=4, expert_tokens_num_flag=True)
    assert ex.shape == (0, 8) and eri.shape == (0,) and counts.tolist() == [0, 0, 0, 0]


def test_out_variants_write_into_given_tensors_and_match():
    gen = torch.Generator().manual_seed(21)
    x = random_values((9, 13), torch.bfloat16, gen)
    idx = _random_idx(9, 3, -1, 6, gen)
    w = torch.rand(9, 3, generator=gen)
    kw = dict(topk_weight=w, expert_num=6, active_expert_range=[1, 5], expert_tokens_num_flag=True, row_idx_type=1)
    expected = moe_routing.moe_init_routing(x, idx, **kw)
    out = tuple(torch.full_like(t, 7) for t in expected)
    got = moe_routing.moe_init_routing(x, idx, out=out, **kw)
    for e, g, o, name in zip(expected, got, out, V4_NAMES):
        assert g.data_ptr() == o.data_ptr(), name
        assert_bitwise_equal(e, o, f"out= {name}")
    g_rows = random_values((27, 13), torch.bfloat16, gen)
    grad_out = torch.empty(9, 13, dtype=torch.bfloat16)
    r = moe_routing.moe_init_routing_grad(g_rows, expected[1], 3, out=grad_out)
    assert r.data_ptr() == grad_out.data_ptr()
    # row_idx_type 1 output is a permutation: as a gather index it is valid for the backward
    assert_bitwise_equal(moe_routing.moe_init_routing_grad(g_rows, expected[1], 3), grad_out, "grad out=")


def test_out_of_the_wrong_shape_is_rejected():
    g = torch.randn(6, 4)
    idx = torch.arange(6, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"out grad_x must be a contiguous float32 tensor of shape \[3, 4\] on cpu"):
        moe_routing.moe_init_routing_grad(g, idx, 2, out=torch.empty(3, 5))
    with pytest.raises(ValueError, match="non-contiguous"):
        moe_routing.moe_init_routing_grad(g, idx, 2, out=torch.empty(4, 3).t())


@pytest.mark.parametrize("drop_pad_mode", [0, 1])
def test_thread_count_does_not_change_bits(drop_pad_mode):
    # 8 MB of expanded rows: enough for the kernel to split its loops over both threads, which run
    # on PyTorch's intra-op pool.
    gen = torch.Generator().manual_seed(5)
    n, k, e, h = 512, 8, 64, 1024
    x = torch.randn(n, h, generator=gen).to(torch.bfloat16)
    idx = torch.randint(-1, e, (n, k), generator=gen, dtype=torch.int32)
    kw = dict(expert_num=e, expert_tokens_num_type=1, expert_tokens_num_flag=True, drop_pad_mode=drop_pad_mode,
              expert_capacity=(n * k // e) if drop_pad_mode else -1)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = moe_routing.moe_init_routing(x, idx, **kw)
        torch.set_num_threads(2)
        two = moe_routing.moe_init_routing(x, idx, **kw)
    finally:
        torch.set_num_threads(before)
    assert_outputs_equal(one, two, V4_NAMES, "1 vs 2 threads")
    assert one[0].abs().sum() > 0  # rows were copied, not only zero-filled
