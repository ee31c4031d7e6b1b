"""numerics="atlas_a2" | "ascend_950" on every operator: it picks the forward's quantisation
arithmetic and the backward's float32 order (tree | sequential), and autograd carries the
forward's numerics to its backward. Data spread over many binades, so the two orders differ."""
import pytest
import torch

import moe_routing
from reference import assert_bitwise_equal, bits, grad_reference, random_values, v4_reference

ORDER_OF = {"atlas_a2": "tree", "ascend_950": "sequential"}
OTHER = {"atlas_a2": "ascend_950", "ascend_950": "atlas_a2"}


def case(dtype, seed, n=24, k=8, e=6, h=16):
    gen = torch.Generator().manual_seed(seed)
    return (random_values((n, h), dtype, gen), torch.randint(0, e, (n, k), generator=gen, dtype=torch.int32),
            e, gen)


@pytest.mark.parametrize("numerics", ["atlas_a2", "ascend_950"])
def test_standalone_backward_follows_numerics_and_order_overrides(numerics):
    g, idx, _, gen = case(torch.float32, 1)
    g = random_values((24 * 8, 16), torch.float32, gen)
    eri = torch.randperm(24 * 8, generator=gen).to(torch.int32)
    got = moe_routing.moe_init_routing_grad(g, eri, 8, numerics=numerics)
    assert_bitwise_equal(grad_reference(g, eri, 8, order=ORDER_OF[numerics]), got, numerics)
    other = moe_routing.moe_init_routing_grad(g, eri, 8, numerics=OTHER[numerics])
    assert not torch.equal(bits(got), bits(other)), "the data must tell the two orders apart"
    # An explicit order wins over the numerics.
    overridden = moe_routing.moe_init_routing_grad(g, eri, 8, numerics=numerics, order=ORDER_OF[OTHER[numerics]])
    assert torch.equal(bits(overridden), bits(other))
    assert torch.equal(bits(got), bits(moe_routing.moe_init_routing_grad(g, eri, 8, order=ORDER_OF[numerics])))


CONFIGS = [dict(), dict(active_num=100), dict(active_expert_range=[1, 5], row_idx_type=1),
           dict(drop_pad_mode=1, expert_capacity=20)]


# float32 only: rounded to 16 bits, these sums hardly ever differ between the orders, so a test in
# float16 or bfloat16 could not tell whether the numerics reached the backward.
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "dropless")
@pytest.mark.parametrize("numerics", ["atlas_a2", "ascend_950"])
def test_autograd_backward_runs_in_the_forward_numerics(numerics, config):
    dtype = torch.float32
    x, idx, e, gen = case(dtype, 7)
    x.requires_grad_()
    w = torch.rand(idx.shape, generator=gen).requires_grad_()
    ex, eri, _, _, etw = moe_routing.moe_init_routing(x, idx, topk_weight=w, expert_num=e, numerics=numerics,
                                                      **config)
    gx = random_values(ex.shape, dtype, gen)
    torch.autograd.backward([ex, etw], [gx, torch.zeros_like(etw)])
    # The same gradient by hand: the standalone backward with the order the numerics imply, on
    # the forward's index (in the gather convention the backward reads).
    rows = ex.shape[0] if config.get("drop_pad_mode") == 1 else None
    index = eri if rows is not None else _gather(eri, config, idx, e)
    mode = 1 if rows is not None else 0
    expected = moe_routing.moe_init_routing_grad(gx, index, idx.shape[1], mode, order=ORDER_OF[numerics])
    assert_bitwise_equal(expected, x.grad, f"x.grad under {numerics}")
    other = moe_routing.moe_init_routing_grad(gx, index, idx.shape[1], mode, order=ORDER_OF[OTHER[numerics]])
    assert not torch.equal(bits(other), bits(x.grad)), "the data must tell the two orders apart"


def _gather(eri, config, idx, e):
    start, end = config.get("active_expert_range", [0, e])
    routed = int(((idx >= start) & (idx < end)).sum())
    active = config.get("active_num", -1)
    rows = routed if active <= 0 else min(active, routed)
    if config.get("row_idx_type", 0) == 0:
        return torch.where((eri >= 0) & (eri < rows), eri, -1).to(torch.int32)
    out = torch.full_like(eri, -1)
    out[eri[:rows].long()] = torch.arange(rows, dtype=torch.int32)
    return out


@pytest.mark.parametrize("numerics", ["atlas_a2", "ascend_950"])
def test_v2_autograd_carries_numerics(numerics):
    x, idx, e, gen = case(torch.float32, 9)
    x.requires_grad_()
    ex, eri, _, _ = moe_routing.moe_init_routing_v2(x, idx, expert_num=e, numerics=numerics)
    g = random_values(ex.shape, torch.float32, gen)
    ex.backward(g)
    assert_bitwise_equal(grad_reference(g, eri, idx.shape[1], order=ORDER_OF[numerics]), x.grad, numerics)


@pytest.mark.parametrize("quant_mode", [0, 1])
def test_forward_quantises_in_the_numerics_given(quant_mode):
    gen = torch.Generator().manual_seed(21)
    # Values with many significant bits, where float16 (Ascend 950) and float32 (Atlas A2)
    # static quantisation, and the two dynamic scales (for some rows), round differently.
    x = torch.rand(256, 33, generator=gen) * 40 - 20
    idx = torch.randint(0, 4, (256, 2), generator=gen, dtype=torch.int32)
    kw = dict(expert_num=4, quant_mode=quant_mode)
    if quant_mode == 0:
        kw.update(scale=torch.tensor([1.7]), offset=torch.tensor([-0.3]))
    results = {}
    for numerics in ("atlas_a2", "ascend_950"):
        got = moe_routing.moe_init_routing(x, idx, numerics=numerics, **kw)
        expected = v4_reference(x, idx, numerics=numerics, **kw)
        for name, e_, g_ in zip(("expanded_x", "expanded_row_idx", "counts", "expanded_scale", "topk_weight"),
                                expected, got):
            assert_bitwise_equal(e_, g_, f"{numerics} quant_mode={quant_mode} {name}")
        results[numerics] = got
    differs = [not torch.equal(bits(a), bits(b)) for a, b in zip(results["atlas_a2"], results["ascend_950"])]
    assert differs[0] or differs[3], "the data must tell the two quantisations apart"


def test_numerics_is_checked_by_every_operator():
    x, idx, e, _ = case(torch.float32, 3, n=4, k=2)
    message = 'numerics must be "atlas_a2" or "ascend_950", got "a3"'
    with pytest.raises(ValueError, match="moe_init_routing: " + message):
        moe_routing.moe_init_routing(x, idx, expert_num=e, numerics="a3")
    with pytest.raises(ValueError, match="moe_init_routing_v2: " + message):
        moe_routing.moe_init_routing_v2(x, idx, expert_num=e, numerics="a3")
    with pytest.raises(ValueError, match="moe_init_routing_grad: " + message):
        moe_routing.moe_init_routing_grad(torch.zeros(8, 4), torch.arange(8, dtype=torch.int32), 2, numerics="a3")
