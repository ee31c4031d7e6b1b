"""Plain-PyTorch statements of the specification, used as the reference in the Python tests.

Written from docs/spec/moe_init_routing.md §1.6, §1.7, §2.4, §3.2, with docs/decisions.md's choices
where CANN leaves behaviour undefined, using torch indexing and float32 element-wise adds only
(exact IEEE operations, no reassociation).
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


# ---- forward ---------------------------------------------------------------------------------

def _counts(keys, start, end):
    return torch.bincount(keys - start, minlength=end - start)[: end - start] if keys.numel() else \
        torch.zeros(end - start, dtype=torch.int64)


def _drop_pad_slots(keys, order, experts, capacity):
    """For sorted pairs: the slot e*C + rank (rank = position among the expert's pairs) or -1."""
    sorted_keys = keys[order]
    counts = torch.bincount(sorted_keys, minlength=experts)[:experts] if keys.numel() else \
        torch.zeros(experts, dtype=torch.int64)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(order.numel()) - starts[sorted_keys]
    return torch.where(rank < capacity, sorted_keys * capacity + rank, -1), counts


def v2_reference(x, expert_idx, active_num=0, expert_capacity=0, expert_num=0, drop_pad_mode=0,
                 expert_tokens_count_or_cumsum_flag=0, expert_tokens_before_capacity_flag=False):
    n, h = x.shape
    k = expert_idx.shape[1]
    pairs = n * k
    keys = expert_idx.reshape(-1).long()
    order = torch.argsort(keys, stable=True)
    eri = torch.empty(pairs, dtype=torch.int32)
    e = expert_num
    counts = torch.zeros(max(e, 0), dtype=torch.int32)
    before = torch.zeros(max(e, 0), dtype=torch.int32)
    if drop_pad_mode == 0:
        eri[order] = torch.arange(pairs, dtype=torch.int32)
        rows = pairs if active_num == 0 else min(active_num, pairs)
        expanded_x = x[order[:rows] // k]
        if expert_tokens_count_or_cumsum_flag:
            c = _counts(keys, 0, e)
            counts = (torch.cumsum(c, 0) if expert_tokens_count_or_cumsum_flag == 1 else c).to(torch.int32)
    else:
        slots, c = _drop_pad_slots(keys, order, e, expert_capacity)
        eri[order] = slots.to(torch.int32)
        expanded_x = torch.zeros(e * expert_capacity, h, dtype=x.dtype)
        kept = slots >= 0
        expanded_x[slots[kept]] = x[order[kept] // k]
        expanded_x = expanded_x.view(e, expert_capacity, h)
        if expert_tokens_before_capacity_flag:
            before = c.to(torch.int32)
    return expanded_x, eri, counts, before


def _round_half_away(q):
    q64 = q.double()
    r = torch.sign(q64) * torch.floor(q64.abs() + 0.5)
    return r


def quantize_static(rows, scale, offset, numerics):
    if numerics == "atlas_a2":
        t = rows.float() * scale[0] + (offset[0] if offset is not None else 0.0)
        q = torch.round(t)  # half to even
    else:
        h = rows.float().half()
        t = (h * scale.half()[0]).half()
        t = (t + (offset.half()[0] if offset is not None else torch.tensor(0.0, dtype=torch.half))).half()
        q = torch.round(t.float())
    q = torch.where(torch.isnan(q), 0.0, q)
    return q.clamp(-128, 127).to(torch.int8)


def quantize_dynamic(rows, smooth, numerics):
    f = rows.float()
    if smooth is not None:
        f = f * smooth
    m = f.abs().amax(dim=1, keepdim=True) if f.shape[1] else torch.zeros(f.shape[0], 1)
    if numerics == "atlas_a2":
        sc = m / torch.tensor(127.0)
    else:
        sc = m * torch.tensor(1.0 / 127.0, dtype=torch.float32)
    q = _round_half_away(f / sc)
    q = torch.where(torch.isnan(q), 0.0, q).clamp(-128, 127).to(torch.int8)
    return q, sc.view(-1)


def v4_reference(x, expert_idx, scale=None, offset=None, topk_weight=None, active_num=-1,
                 expert_capacity=-1, expert_num=-1, drop_pad_mode=0, expert_tokens_num_type=0,
                 expert_tokens_num_flag=False, quant_mode=-1, active_expert_range=None,
                 row_idx_type=0, numerics="atlas_a2"):
    n, h = x.shape
    k = expert_idx.shape[1]
    pairs = n * k
    e = expert_num
    start, end = (0, e) if active_expert_range is None else tuple(active_expert_range)
    keys = expert_idx.reshape(-1).long()
    valid = (keys >= start) & (keys < end)
    positions = torch.nonzero(valid).flatten()
    order = positions[torch.argsort(keys[positions], stable=True)]
    avail = order.numel()
    counts_in_range = _counts(keys[valid], start, end)
    if not expert_tokens_num_flag:
        counts = torch.zeros(end - start, dtype=torch.int64)
    elif expert_tokens_num_type == 0:
        counts = torch.cumsum(counts_in_range, 0)
    elif expert_tokens_num_type == 1:
        counts = counts_in_range.clone()
    else:
        counts = torch.zeros(e, 2, dtype=torch.int64)
        ids = torch.nonzero(counts_in_range).flatten()
        counts[: ids.numel(), 0] = ids + start
        counts[: ids.numel(), 1] = counts_in_range[ids]
    out_dtype = torch.int8 if quant_mode in (0, 1) else x.dtype

    def transform(rows_x, row_keys):
        if quant_mode == 0:
            return quantize_static(rows_x, scale, offset, numerics), None
        if quant_mode == 1:
            smooth = None
            if scale is not None:
                smooth = scale[0:1].expand(rows_x.shape[0], -1) if scale.shape[0] == 1 else scale[row_keys - start]
            return quantize_dynamic(rows_x, smooth, numerics)
        return rows_x, None

    if drop_pad_mode == 1:
        c = expert_capacity
        slots, _ = _drop_pad_slots(keys, order, e, c)
        eri = torch.full((pairs,), -1, dtype=torch.int32)
        eri[order] = slots.to(torch.int32)
        kept = slots >= 0
        src = order[kept]
        expanded_x = torch.zeros(e * c, h, dtype=out_dtype)
        expanded_x[slots[kept]] = x[src // k]
        expanded_scale = torch.zeros(e * c)
        if scale is not None:
            expanded_scale[slots[kept]] = scale[src // k]
        expanded_topk_weight = torch.zeros(e * c, 1) if topk_weight is not None else torch.zeros(0)
        if topk_weight is not None:
            expanded_topk_weight[slots[kept], 0] = topk_weight.reshape(-1)[src]
        return expanded_x.view(e, c, h), eri, counts, expanded_scale, expanded_topk_weight

    r = avail if active_num <= 0 else min(active_num, avail)
    if row_idx_type == 0:
        eri = torch.full((pairs,), -1, dtype=torch.int32)
        eri[order] = torch.arange(avail, dtype=torch.int32)
    else:
        # The tail: the pairs not routed, as CANN's golden orders them: ids < start taken as INT32_MAX, then
        # by (id, p), so an id equal to INT32_MAX ties with them and takes its place among them by p.
        tail = torch.nonzero((keys >= end) | (keys < start)).flatten()
        tail_keys = torch.where(keys[tail] < start, 2**31 - 1, keys[tail])
        eri = torch.cat([order, tail[torch.argsort(tail_keys, stable=True)]]).to(torch.int32)
    src = order[:r]
    expanded_x = torch.zeros(pairs, h, dtype=out_dtype)
    expanded_scale = torch.zeros(pairs)
    rows, sc = transform(x[src // k], keys[src])
    expanded_x[:r] = rows
    if quant_mode == 1:
        expanded_scale[:r] = sc
    elif scale is not None and quant_mode == -1:
        expanded_scale[:r] = scale[src // k]
    expanded_topk_weight = torch.zeros(0)
    if topk_weight is not None:
        expanded_topk_weight = torch.zeros(pairs, 1)
        expanded_topk_weight[:r, 0] = topk_weight.reshape(-1)[src]
    return expanded_x, eri, counts, expanded_scale, expanded_topk_weight
