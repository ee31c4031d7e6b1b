"""Plain NumPy statements of the combine's specification, the reference of the Python combine tests.

Written from docs/spec/moe_finalize_routing.md §2-§4 and docs/moe_finalize_routing.md (the special
experts, moe_routing's gradients), with docs/decisions.md §16's choices, independently of the C++
core: element-wise IEEE operations of NumPy (float32, and float16, which NumPy computes in float32
and rounds once: the correctly rounded float16 operation), one pair or one term at a time in the
documented order. bfloat16 has no NumPy type: values are kept in float32 and rounded through
torch's round-to-nearest-even conversion (or the bit rule below for round-half-away).
"""
from __future__ import annotations

import numpy as np
import torch

CANONICAL_NAN = {torch.float32: 0x7FC00000, torch.float16: 0x7E00, torch.bfloat16: 0x7FC0}
_INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def _widen(t: torch.Tensor) -> np.ndarray:
    """Exact float32 values of a float tensor."""
    return t.detach().float().numpy()


def _as_torch(values: np.ndarray, dtype: torch.dtype, half_away: bool = False) -> torch.Tensor:
    """float32 (or float16) values narrowed to `dtype`, NaN stored canonically."""
    f32 = np.ascontiguousarray(values, dtype=np.float32)
    if dtype == torch.bfloat16 and half_away:
        # Ties away from zero: add half of the dropped 16 bits to the magnitude, then truncate
        # (the carry walks into the exponent, and from the largest finite value to infinity).
        bits = f32.view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x8000) >> 16).astype(np.uint16)
        out = torch.from_numpy(rounded.view(np.int16).copy()).view(torch.bfloat16)
    elif dtype == torch.float16:
        out = torch.from_numpy(f32.astype(np.float16))
    else:
        out = torch.from_numpy(f32.copy()).to(dtype)
    nan = torch.isnan(out)
    if nan.any():
        view = out.view(_INT_VIEW[dtype]).clone()
        view[nan] = CANONICAL_NAN[dtype]
        out = view.view(dtype)
    return out


def _rounded(values: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """float32 values rounded (to nearest even) to `dtype`, kept as float32."""
    if dtype == torch.float32:
        return values.astype(np.float32)
    return _as_torch(values, dtype).float().numpy()


def _in(expert: np.ndarray, expert_range) -> np.ndarray:
    if expert_range is None or tuple(expert_range) == (-1, -1):
        return np.zeros(expert.shape, dtype=bool)
    start, end = expert_range
    return (expert >= start) & (expert < end)


def finalize_reference(expanded_x, expanded_row_idx, x1=None, x2=None, bias=None, scales=None, expert_idx=None,
                       x=None, alpha1=None, alpha2=None, v=None, drop_pad_mode=0, zero_expert_range=None,
                       copy_expert_range=None, constant_expert_range=None, k=1, *, numerics="atlas_a2",
                       api="v2") -> torch.Tensor:
    """out [N, H] of moe_finalize_routing (docs/spec/moe_finalize_routing.md §3).

    Assumes valid inputs."""
    with np.errstate(all="ignore"):  # overflow to inf and NaN are values under test, not mistakes
        return _finalize(expanded_x, expanded_row_idx, x1, x2, bias, scales, expert_idx, x, alpha1, alpha2, v,
                         drop_pad_mode, zero_expert_range, copy_expert_range, constant_expert_range, k, numerics,
                         api)


def _finalize(expanded_x, expanded_row_idx, x1, x2, bias, scales, expert_idx, x, alpha1, alpha2, v, drop_pad_mode,
              zero_expert_range, copy_expert_range, constant_expert_range, k, numerics, api):
    dtype = expanded_x.dtype
    hidden = expanded_x.shape[-1]
    top_k = scales.shape[1] if scales is not None else k
    pairs = expanded_row_idx.numel()
    n = pairs // top_k
    rows = expanded_x.reshape(-1, hidden)
    num_rows = rows.shape[0]
    # atlas_a2's float16 kernels never widen: float16 operations; everything else in float32.
    acc_type = np.float16 if dtype == torch.float16 and numerics == "atlas_a2" else np.float32

    def values(t):
        return t.detach().numpy() if acc_type == np.float16 else _widen(t)

    idx = expanded_row_idx.numpy().astype(np.int64)
    idx = idx.reshape(top_k, n).T if drop_pad_mode in (0, 1) else idx.reshape(n, top_k)
    experts = expert_idx.numpy().astype(np.int64) if expert_idx is not None else None
    row_values = values(rows)
    zero = acc_type(0)
    if x1 is not None:
        if numerics == "ascend_950" and x2 is None:
            acc = values(x1)
        else:
            acc = values(x1) + (values(x2) if x2 is not None else zero)
    else:
        acc = np.zeros((n, hidden), dtype=acc_type)
    taken = np.zeros((n, 1), dtype=bool)
    assign_first = x1 is None and numerics == "atlas_a2"
    for t in range(top_k):
        r = idx[:, t]
        live = (r >= 0) & (r < num_rows)  # -1 and rows cut by active_num add nothing
        expert = experts[:, t] if experts is not None else None
        if expert is not None:
            live &= ~_in(expert, zero_expert_range)
        term = row_values[np.where(live, r, 0)] if num_rows else np.zeros((n, hidden), dtype=acc_type)
        if expert is not None and x is not None:
            copy = _in(expert, copy_expert_range)
            term = np.where(copy[:, None], values(x), term)
            constant = _in(expert, constant_expert_range)
            if constant.any():
                c = np.where(constant, expert - constant_expert_range[0], 0)
                xs, a1, a2, vs = (_widen(t_) for t_ in (x, alpha1, alpha2, v))
                value = _rounded(_rounded(xs * a1[c], dtype) + _rounded(vs[c] * a2[c], dtype), dtype)
                term = np.where(constant[:, None], value.astype(acc_type), term)
        if bias is not None:
            term = term + values(bias)[np.where(live, expert, 0)]
        elif numerics == "atlas_a2" and dtype != torch.bfloat16:
            term = term + zero  # the fp32/fp16 kernels add a zero bias: -0 becomes +0
        if scales is not None:
            s = scales[:, t].detach()
            s = s.numpy() if acc_type == np.float16 else _widen(s)
            term = term * s[:, None]
        live = live[:, None]
        if assign_first:
            acc = np.where(live, np.where(taken, acc + term, term), acc)
            taken |= live
        else:
            acc = np.where(live, acc + term, acc)
    return _as_torch(acc, dtype, half_away=api == "v1" and numerics == "atlas_a2")


def _padded_tree(values: np.ndarray, lanes: int) -> np.float32:
    """Adjacent-pair binary tree over `lanes` lanes, the missing ones +0."""
    level = np.zeros(lanes, dtype=np.float32)
    level[: values.size] = values
    while level.size > 1:
        level = level[0::2] + level[1::2]
    return level[0]


def grad_scales_sum(products: np.ndarray, numerics: str, chunk: int) -> np.float32:
    """Σ of one pair's float32 products in the order of the numerics
    (docs/spec/moe_finalize_routing.md §4)."""
    h = products.size
    if numerics == "atlas_a2":
        total = np.float32(0)
        for c0 in range(0, h, chunk):
            part = products[c0:c0 + chunk]
            chunk_sum = np.float32(0)
            for g0 in range(0, part.size, 512):
                chunk_sum = chunk_sum + _padded_tree(part[g0:g0 + 512], 512)
            total = total + chunk_sum
        return total
    if h <= 64:
        return _padded_tree(products, 64)
    q = 1 << (h.bit_length() - 1)
    folded = products[:q].copy()
    folded[: h - q] = products[: h - q] + products[q:h]
    sums = np.array([_padded_tree(folded[b:b + 64], 64) for b in range(0, q, 64)], dtype=np.float32)
    while sums.size > 64:
        half = sums.size // 2
        sums = sums[:half] + sums[half:]
    return _padded_tree(sums, 64)


def atlas_chunk(dtype: torch.dtype, has_bias: bool) -> int:
    """Products per chunk of atlas_a2's grad_scales (docs/spec/moe_finalize_routing.md §4)."""
    if dtype == torch.float32:
        return 12264 if has_bias else 16352
    return 14016 if has_bias else 19616


def finalize_grad_reference(grad_y, expanded_row_idx, expanded_x=None, scales=None, expert_idx=None, bias=None,
                            drop_pad_mode=0, active_num=0, expert_num=0, expert_capacity=0, *,
                            numerics="atlas_a2"):
    """(grad_expanded_x, grad_scales or None, grad_bias or None) of moe_finalize_routing_grad
    (docs/spec/moe_finalize_routing.md §4 and moe_routing's gradients). Row layout. Assumes valid inputs."""
    with np.errstate(all="ignore"):
        return _grad(grad_y, expanded_row_idx, expanded_x, scales, expert_idx, bias, drop_pad_mode, active_num,
                     expert_num, expert_capacity, numerics)


def _grad(grad_y, expanded_row_idx, expanded_x, scales, expert_idx, bias, drop_pad_mode, active_num, expert_num,
          expert_capacity, numerics):
    dtype = grad_y.dtype
    n, hidden = grad_y.shape
    pairs = expanded_row_idx.numel()
    top_k = scales.shape[1] if scales is not None else (pairs // n if n else 1)
    if drop_pad_mode == 1:
        shape = (expert_num, expert_capacity, hidden)
        num_rows = expert_num * expert_capacity
    else:
        num_rows = active_num if 0 < active_num < pairs else pairs
        shape = (num_rows, hidden)
    gy = _widen(grad_y)
    s = _widen(scales) if scales is not None else None
    idx = expanded_row_idx.numpy().astype(np.int64)
    experts = expert_idx.numpy().reshape(-1).astype(np.int64) if expert_idx is not None else None
    live = (idx >= 0) & (idx < num_rows)

    def term(p):
        i, t = divmod(p, top_k)
        return gy[i] * s[i, t] if s is not None else gy[i]

    grad_rows = np.zeros((num_rows, hidden), dtype=np.float32)
    written = np.zeros(num_rows, dtype=bool)
    for p in np.nonzero(live)[0]:
        r = idx[p]
        grad_rows[r] = grad_rows[r] + term(p) if written[r] else term(p)
        written[r] = True
    grad_expanded_x = _as_torch(grad_rows, dtype).view(shape)

    grad_scales = None
    if scales is not None and expanded_x is not None:
        x_rows = _widen(expanded_x).reshape(-1, hidden)
        b = _widen(bias) if bias is not None else None
        chunk = atlas_chunk(dtype, bias is not None)
        sums = np.zeros(pairs, dtype=np.float32)
        for p in np.nonzero(live)[0]:
            row = x_rows[idx[p]] + b[experts[p]] if b is not None else x_rows[idx[p]]
            sums[p] = grad_scales_sum(row * gy[p // top_k], numerics, chunk)
        grad_scales = _as_torch(sums.reshape(n, top_k), scales.dtype)

    grad_bias = None
    if bias is not None:
        acc = np.zeros((bias.shape[0], hidden), dtype=np.float32)
        seen = np.zeros(bias.shape[0], dtype=bool)
        for p in np.nonzero(live)[0]:
            e = experts[p]
            acc[e] = acc[e] + term(p) if seen[e] else term(p)
            seen[e] = True
        grad_bias = _as_torch(acc, dtype)
    return grad_expanded_x, grad_scales, grad_bias
