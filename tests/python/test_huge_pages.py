"""The functional operators' new outputs: huge pages asked for (MOE_ROUTING_HUGE_PAGES, default on),
and the same bits as the out= calls with the advice on and off."""
import os

import pytest
import torch

import moe_routing

THP = os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled")
HUGE = 2 << 20


@pytest.fixture
def huge_pages(monkeypatch):
    """Sets MOE_ROUTING_HUGE_PAGES for the test (the library reads it on every allocation)."""
    def set_to(value):
        if value is None:
            monkeypatch.delenv("MOE_ROUTING_HUGE_PAGES", raising=False)
        else:
            monkeypatch.setenv("MOE_ROUTING_HUGE_PAGES", value)
    return set_to


def vm_flags(address):
    """The VmFlags of the mapping of /proc/self/smaps holding `address`."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split(" ", 1)[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("VmFlags:"):
                return line.split()[1:]
    return []


def interior(t):
    """An address inside the tensor's 2 MiB-aligned interior."""
    return (t.data_ptr() + HUGE - 1) // HUGE * HUGE


def routing(n, k, e, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(n)]).to(torch.int32)


def forward_case(n=160, k=4, e=16, h=4100, dtype=torch.bfloat16):  # expanded_x ~5 MiB
    gen = torch.Generator().manual_seed(1)
    return torch.randn(n, h, generator=gen).to(dtype), routing(n, k, e)


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_new_outputs_get_huge_pages_advised_unless_turned_off(huge_pages):
    # expanded_x of 64 MiB: glibc maps it anew for every call, so each allocation's advice is its own.
    x, idx = forward_case(n=1024, k=8, e=64, h=4096)
    huge_pages(None)
    expanded_x = moe_routing.moe_init_routing(x, idx, expert_num=64)[0]
    assert expanded_x.nbytes == 64 << 20
    assert ("hg" in vm_flags(interior(expanded_x))) == THP
    del expanded_x
    huge_pages("0")
    expanded_x = moe_routing.moe_init_routing(x, idx, expert_num=64)[0]
    if not os.environ.get("THP_MEM_ALLOC_ENABLE"):  # PyTorch's own advice would set the flag
        assert "hg" not in vm_flags(interior(expanded_x))


@pytest.mark.parametrize("setting", [None, "0"], ids=["advised", "off"])
def test_functional_calls_equal_out_calls_bit_for_bit(huge_pages, setting):
    huge_pages(setting)
    x, idx = forward_case()
    kw = dict(expert_num=16, expert_tokens_num_type=1, expert_tokens_num_flag=True)
    fresh = moe_routing.moe_init_routing(x, idx, **kw)
    assert fresh[0].nbytes >= 4 << 20
    outs = tuple(torch.full_like(t, 7) for t in fresh)
    moe_routing.moe_init_routing(x, idx, **kw, out=outs)
    for a, b in zip(fresh, outs):
        assert torch.equal(a, b)
    eri = fresh[1]
    n, k = idx.shape
    gen = torch.Generator().manual_seed(2)
    # The dispatch's backward: grad_x [N, H].
    grad = torch.randn(n * k * 2, 4100, generator=gen).to(torch.bfloat16)[: n * k]
    grad_x = moe_routing.moe_init_routing_grad(grad, eri, k)
    out = torch.full_like(grad_x, 7)
    moe_routing.moe_init_routing_grad(grad, eri, k, out=out)
    assert torch.equal(grad_x, out)
    # The combine and its grad: y [N, H], grad_expanded_x [N*K, H] (~5 MiB).
    scales = torch.rand(n, k, generator=gen)
    y = moe_routing.moe_finalize_routing(fresh[0], eri, scales=scales, drop_pad_mode=2)
    out = torch.full_like(y, 7)
    moe_routing.moe_finalize_routing(fresh[0], eri, scales=scales, drop_pad_mode=2, out=out)
    assert torch.equal(y, out)
    grad_y = torch.randn(n, 4100, generator=gen).to(torch.bfloat16)
    grads = moe_routing.moe_finalize_routing_grad(grad_y, eri, fresh[0], scales)
    assert grads[0].nbytes >= 4 << 20
    outs = (torch.full_like(grads[0], 7), torch.full_like(grads[1], 7))
    moe_routing.moe_finalize_routing_grad(grad_y, eri, fresh[0], scales, out=outs)
    assert torch.equal(grads[0], outs[0]) and torch.equal(grads[1], outs[1])
