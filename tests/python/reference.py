"""Plain-PyTorch statements of the spec, used as the reference in the Python tests.

Written from the spec (shared/spec/cann_moe_routing_spec.md §1.6, §1.7, §2.4, §3.2), with torch
indexing and float32 element-wise adds only (exact IEEE operations, no reassociation).
"""
from __future__ import annotations

import math

import torch


def tree_bins(top_k: int) -> int:
    if top_k >= 128:
        return 64
    levels = max(0, int(math.floor(math.log2(top_k))) - 1)
    return 1 << levels


def grad_reference(grad_expanded_x, expanded_row_idx, top_k, drop_pad_mode=0, active_num=0,
                   order="tree"):
    hidden = grad_expanded_x.shape[-1]
    rows = grad_expanded_x.reshape(-1, hidden).float()
    k = top_k
    n = expanded_row_idx.numel() // k
    idx = expanded_row_idx.reshape(n, k).long()
    present = idx != -1
    if drop_pad_mode == 0 and active_num > 0:
        present &= idx < active_num
    if rows.shape[0] == 0:
        addends = torch.zeros(n, k, hidden)
    else:
        addends = rows[torch.where(present, idx, 0)]  # [N, K, H]

    def add_if(acc, t):
        return torch.where(present[:, t, None], acc + addends[:, t], acc)

    if order == "sequential":
        acc = torch.zeros(n, hidden)
        for t in range(k):
            acc = add_if(acc, t)
    else:
        b = tree_bins(k)
        bins = [torch.where(present[:, 2 * j, None], addends[:, 2 * j], torch.zeros(n, hidden))
                for j in range(b)]
        m = b
        while 2 * m < k:
            bins[m % b] = add_if(bins[m % b], 2 * m)
            m += 1
        m = 0
        while 2 * m + 1 < k:
            bins[m % b] = add_if(bins[m % b], 2 * m + 1)
            m += 1
        s = 1
        while s < b:
            for q in range(s, b, 2 * s):
                bins[q - s] = bins[q - s] + bins[q]
            s *= 2
        acc = bins[0]
    acc = torch.where(torch.isnan(acc), torch.tensor(float("nan")), acc)  # canonical NaN
    return acc.to(grad_expanded_x.dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The stored bit patterns, for bitwise comparisons."""
    t = t.contiguous()
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.view(torch.int16)
    if t.dtype == torch.float32:
        return t.view(torch.int32)
    return t


def assert_bitwise_equal(expected: torch.Tensor, got: torch.Tensor, what: str = "") -> None:
    assert expected.dtype == got.dtype, f"{what}: dtype {got.dtype} != {expected.dtype}"
    assert expected.shape == got.shape, f"{what}: shape {tuple(got.shape)} != {tuple(expected.shape)}"
    eb, gb = bits(expected), bits(got)
    differ = (eb != gb)
    if differ.any():
        first = differ.flatten().nonzero()[0].item()
        raise AssertionError(
            f"{what}: {int(differ.sum())} of {differ.numel()} elements differ; first at flat index "
            f"{first}: expected {expected.flatten()[first].item()!r}, got {got.flatten()[first].item()!r}")


def random_values(shape, dtype, generator):
    """Values spread over many binades so that the float32 order matters."""
    mantissa = torch.rand(shape, generator=generator) * 2 - 1
    exponent = torch.randint(-12, 13, shape, generator=generator).float()
    return (mantissa * torch.exp2(exponent)).to(dtype)


def random_grad_case(scenario, dtype, n, k, h, generator, drop_fraction=0.1):
    """(grad_expanded_x, expanded_row_idx, kwargs) valid for the scenario."""
    pairs = n * k
    perm = torch.randperm(pairs, generator=generator).to(torch.int32)
    kwargs = {"drop_pad_mode": 0, "active_num": 0}
    if scenario == "dropless":
        shape = (pairs, h)
    elif scenario == "active":
        active = int(torch.randint(1, max(pairs, 1) + 1, (1,), generator=generator))
        kwargs["active_num"] = active
        shape = (active, h)
    else:
        experts = int(torch.randint(1, 9, (1,), generator=generator))
        capacity = int(torch.randint(1, pairs // experts + 2, (1,), generator=generator))
        kwargs["drop_pad_mode"] = 1
        shape = (experts, capacity, h)
        perm = torch.where(perm < experts * capacity, perm, -1).to(torch.int32)
    drop = torch.rand(pairs, generator=generator) < drop_fraction
    perm = torch.where(drop, -1, perm).to(torch.int32)
    return random_values(shape, dtype, generator), perm, kwargs
