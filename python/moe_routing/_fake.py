"""Fake (meta) functions: output shapes from input shapes and attributes, without reading data.

They mirror the C++ core's shape inference (src/ops/*/meta.cpp) with symbolic sizes so that
torch.compile and dynamic shapes work; tests/python/test_compile.py checks them against the real
kernels' outputs on every scenario. They also serve meta tensors, and calls whose tensors are on
different devices land here (the meta device outranks the others in dispatch), so they check the
devices as the device kernels do.
"""
from __future__ import annotations

import math

import torch

from ._port import INT32_MAX, INT64_MAX, check_device, dtype_name

_NUMERICS = ("atlas_a2", "ascend_950")
_ORDERS = ("tree", "sequential")


def _shown(text):
    """A string attribute as the binding's messages quote it: a NUL inside shown as \\0."""
    return str(text).replace("\0", "\\0")


def _check_numerics(op, numerics):
    if numerics not in _NUMERICS:
        raise ValueError(f'{op}: numerics must be "atlas_a2" or "ascend_950", got "{_shown(numerics)}"')


def _check_devices(op, first, **tensors):
    """Every tensor on the device of the operator's first input (the device kernels' rule)."""
    check_device(op, {"the operator's first input": first, **tensors})


_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_CORE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int32, torch.int64)


_MAX_DIMS = 8  # moe_routing::kMaxDims


def _check_core_dtypes(op, **tensors):
    """The binding's first checks of each tensor (its Call::view): at most 8 dimensions, a dtype the core has."""
    for name, t in tensors.items():
        if t is not None and t.dim() > _MAX_DIMS:
            raise ValueError(f"{op}: {name} must have at most {_MAX_DIMS} dimensions, got {t.dim()}")
        if t is not None and t.dtype not in _CORE_DTYPES:
            raise ValueError(f"{op}: {name} must have a dtype among float32, float16, bfloat16, int8, int32, int64, "
                             f"got {dtype_name(t.dtype)}")


def _describe(t):
    """A tensor as the core's messages describe it: "2-D float32 [10, 4]"."""
    return f"{t.dim()}-D {dtype_name(t.dtype)} {list(t.shape)}"


def _check_out(op, first, outs, expected):
    """out= tensors: exactly what the functional operator returns, on its device (contiguous is
    not a property fake tensors track reliably, so the device kernel checks that)."""
    _check_devices(op, first, **{f"out {name}": t for name, t in outs.items()})
    for (name, out), want in zip(outs.items(), expected):
        if out.shape != want.shape or out.dtype != want.dtype:
            raise ValueError(f"{op}: out {name} must be a contiguous {dtype_name(want.dtype)} tensor of shape "
                             f"{list(want.shape)} on {first.device} (the device of the operator's first "
                             f"input), got {dtype_name(out.dtype)} {list(out.shape)} on {out.device}")


@torch.library.register_fake("moe_routing::moe_init_routing_grad")
def _moe_init_routing_grad_fake(grad_expanded_x, expanded_row_idx, top_k, drop_pad_mode=0,
                                active_num=0, *, numerics="atlas_a2", order=None):
    op = "moe_init_routing_grad"
    # The binding's checks (devices, numerics, order, dtypes), then the core's
    # (src/ops/moe_init_routing_grad/meta.cpp), in their order and words.
    _check_devices(op, grad_expanded_x, expanded_row_idx=expanded_row_idx)
    _check_numerics(op, numerics)
    if order is not None and order not in _ORDERS:
        raise ValueError(f'{op}: order must be "tree" or "sequential", got "{_shown(order)}"')
    _check_core_dtypes(op, grad_expanded_x=grad_expanded_x, expanded_row_idx=expanded_row_idx)
    if drop_pad_mode not in (0, 1):
        raise ValueError(f"{op}: drop_pad_mode must be 0 (dropless/active) or 1 (drop-pad), got {drop_pad_mode}")
    if top_k <= 0:
        raise ValueError(f"{op}: top_k must be > 0, got {top_k}")
    if active_num < 0:
        raise ValueError(f"{op}: active_num must be >= 0, got {active_num}")
    if drop_pad_mode == 0 and grad_expanded_x.dim() != 2:
        raise ValueError(f"{op}: grad_expanded_x must be 2-D [rows, H] when drop_pad_mode=0, got "
                         f"{_describe(grad_expanded_x)}")
    if drop_pad_mode == 1 and grad_expanded_x.dim() != 3:
        raise ValueError(f"{op}: grad_expanded_x must be 3-D [E, C, H] when drop_pad_mode=1, got "
                         f"{_describe(grad_expanded_x)}")
    if grad_expanded_x.dtype not in _FLOATS:
        raise ValueError(f"{op}: grad_expanded_x must be float16, bfloat16 or float32, got "
                         f"{dtype_name(grad_expanded_x.dtype)}")
    if expanded_row_idx.dim() != 1 or expanded_row_idx.dtype != torch.int32:
        raise ValueError(f"{op}: expanded_row_idx must be 1-D int32, got {_describe(expanded_row_idx)}")
    hidden = grad_expanded_x.shape[-1]
    num_rows = expanded_row_idx.shape[0] // top_k
    _check_output_bytes(op, "grad_x", grad_expanded_x.dtype, (num_rows, hidden))
    return grad_expanded_x.new_empty((num_rows, hidden))


def _check_output_bytes(op, name, dtype, shape):
    """The core's check_output_bytes (src/ops/validation.cpp) where the extents are ints (symbolic ones are left to
    the kernel): an output whose size in bytes passes int64 is no tensor's shape, and an empty one always fits."""
    if any(not isinstance(d, int) for d in shape) or 0 in shape:
        return
    if math.prod(shape) * dtype.itemsize > INT64_MAX:
        raise ValueError(f"{op}: {name} would have more than 2^63 - 1 bytes, got {len(shape)}-D {dtype_name(dtype)} "
                         f"[{', '.join(str(d) for d in shape)}]")


def _check_routing_inputs(op, x, expert_idx, numerics, **optional):
    """What the binding checks before the core's shape inference: devices, numerics, dtypes."""
    _check_devices(op, x, expert_idx=expert_idx, **optional)
    _check_numerics(op, numerics)
    _check_core_dtypes(op, x=x, expert_idx=expert_idx, **optional)


def _check_x_and_expert_idx(op, x, expert_idx):
    """The core's check of x [N, H] and expert_idx [N, K] int32, after the attributes'."""
    if x.dim() != 2:
        raise ValueError(f"{op}: x must be 2-D [N, H], got {_describe(x)}")
    if expert_idx.dim() != 2:
        raise ValueError(f"{op}: expert_idx must be 2-D [N, K], got {_describe(expert_idx)}")
    if expert_idx.dtype != torch.int32:
        raise ValueError(f"{op}: expert_idx must be int32, got {dtype_name(expert_idx.dtype)}")



def _check_v2_attrs(op, active_num, expert_capacity, expert_num, drop_pad_mode, flag):
    """The core's attribute checks of moe_init_routing_v2 (src/ops/moe_init_routing/meta.cpp), in its
    order and words: the error at trace time is eager's (not a negative extent's RuntimeError)."""
    if drop_pad_mode not in (0, 1):
        raise ValueError(f"{op}: drop_pad_mode must be 0 (dropless) or 1 (drop-pad), got {drop_pad_mode}")
    for name, value in (("active_num", active_num), ("expert_capacity", expert_capacity),
                        ("expert_num", expert_num)):
        if value < 0:
            raise ValueError(f"{op}: {name} must be >= 0, got {value}")
    if expert_num > INT32_MAX:
        raise ValueError(f"{op}: expert_num must be at most 2147483647 (int32 expert ids), got {expert_num}")
    if flag not in (0, 1, 2):
        raise ValueError(f"{op}: expert_tokens_count_or_cumsum_flag must be 0 (none), 1 (cumsum) or 2 (count), "
                         f"got {flag}")
    if drop_pad_mode == 1 and expert_capacity < 1:
        raise ValueError(f"{op}: expert_capacity must be >= 1 when drop_pad_mode=1, got {expert_capacity}")
    if drop_pad_mode == 1 and expert_num < 1:
        raise ValueError(f"{op}: expert_num must be >= 1 when drop_pad_mode=1, got {expert_num}")
    if flag > 0 and expert_num < 1:
        raise ValueError(f"{op}: expert_num must be >= 1 when expert_tokens_count_or_cumsum_flag is 1 or 2, "
                         f"got {expert_num}")


@torch.library.register_fake("moe_routing::moe_init_routing_v2")
def _moe_init_routing_v2_fake(x, expert_idx, active_num=0, expert_capacity=0, expert_num=0,
                              drop_pad_mode=0, expert_tokens_count_or_cumsum_flag=0,
                              expert_tokens_before_capacity_flag=False, *, numerics="atlas_a2"):
    op = "moe_init_routing_v2"
    _check_routing_inputs(op, x, expert_idx, numerics)
    _check_v2_attrs(op, active_num, expert_capacity, expert_num, drop_pad_mode, expert_tokens_count_or_cumsum_flag)
    _check_x_and_expert_idx(op, x, expert_idx)
    if x.dtype not in _FLOATS:
        raise ValueError(f"{op}: x must be float16, bfloat16 or float32, got {dtype_name(x.dtype)}")
    n, hidden = x.shape
    pairs = n * expert_idx.shape[1]
    _check_slots_fit_int32(op, drop_pad_mode, expert_num, expert_capacity)
    if drop_pad_mode == 1:
        _check_output_bytes(op, "expanded_x", x.dtype, (expert_num, expert_capacity, hidden))
        expanded_x = x.new_empty((expert_num, expert_capacity, hidden))
    else:
        rows = pairs if active_num == 0 else torch.sym_min(active_num, pairs)
        _check_output_bytes(op, "expanded_x", x.dtype, (rows, hidden))
        expanded_x = x.new_empty((rows, hidden))
    expanded_row_idx = x.new_empty((pairs,), dtype=torch.int32)
    counts = x.new_empty((expert_num,), dtype=torch.int32)
    before_capacity = x.new_empty((expert_num,), dtype=torch.int32)
    return expanded_x, expanded_row_idx, counts, before_capacity


def _check_slots_fit_int32(op, drop_pad_mode, expert_num, expert_capacity):
    """The core's check_slots_fit_int32 (src/ops/moe_init_routing/meta.cpp), attributes only."""
    if drop_pad_mode == 1 and expert_num * expert_capacity > INT32_MAX:
        raise ValueError(f"{op}: expert_num * expert_capacity must be at most 2147483647 (drop-pad slots e*C + c are "
                         f"int32 expanded_row_idx values), got {expert_num} * {expert_capacity} = "
                         f"{expert_num * expert_capacity}")


def _check_v4_attrs(op, quant_mode, drop_pad_mode, expert_num, active_expert_range, expert_tokens_num_type,
                    row_idx_type, active_num, expert_capacity):
    """The core's attribute checks of moe_init_routing (src/ops/moe_init_routing/meta.cpp), in its
    order and words; returns the expert range [start, end)."""
    if not (-1 <= quant_mode <= 9 or 11 <= quant_mode <= 17):
        raise ValueError(f"{op}: quant_mode must be -1 (none), 0 (static int8), 1 (dynamic int8) or one of CANN's "
                         f"modes 2-9, 11-17 (not supported here), got {quant_mode}")
    if quant_mode > 1:
        raise NotImplementedError(
            f"{op}: quant_mode must be one of the supported modes -1 (none), 0 (static int8) or 1 (dynamic int8); "
            f"CANN's MX/FP8/HiF8/INT4 modes are not implemented, got {quant_mode}")
    if drop_pad_mode not in (0, 1):
        raise ValueError(f"{op}: drop_pad_mode must be 0 (dropless) or 1 (drop-pad), got {drop_pad_mode}")
    if expert_num < 1:
        raise ValueError(f"{op}: expert_num must be >= 1, got {expert_num}")
    if expert_num > INT32_MAX:
        raise ValueError(f"{op}: expert_num must be at most 2147483647 (int32 expert ids), got {expert_num}")
    start, end = (0, expert_num) if active_expert_range is None else tuple(active_expert_range)
    if not 0 <= start < end <= expert_num:
        raise ValueError(f"{op}: active_expert_range must be [start, end) with 0 <= start < end <= expert_num "
                         f"({expert_num}), got [{start}, {end}]")
    if expert_tokens_num_type not in (0, 1, 2):
        raise ValueError(f"{op}: expert_tokens_num_type must be 0 (cumsum), 1 (count) or 2 (key_value), "
                         f"got {expert_tokens_num_type}")
    if row_idx_type not in (0, 1):
        raise ValueError(f"{op}: row_idx_type must be 0 (gather) or 1 (scatter), got {row_idx_type}")
    if active_num < -1:
        raise ValueError(f"{op}: active_num must be -1 or 0 (keep every routed pair) or > 0, got {active_num}")
    if drop_pad_mode == 1:
        if expert_capacity < 1:
            raise ValueError(f"{op}: expert_capacity must be >= 1 when drop_pad_mode=1, got {expert_capacity}")
        if row_idx_type != 0:
            raise ValueError(f"{op}: row_idx_type must be 0 when drop_pad_mode=1, got {row_idx_type}")
        if quant_mode != -1:
            raise ValueError(f"{op}: quant_mode must be -1 when drop_pad_mode=1, got {quant_mode}")
        if (start, end) != (0, expert_num):
            raise ValueError(f"{op}: active_expert_range must be the full [0, expert_num) = [0, {expert_num}) when "
                             f"drop_pad_mode=1, got [{start}, {end}]")
    return start, end


def _check_v4_optional_inputs(op, scale, offset, topk_weight, quant_mode, n, hidden, k, experts):
    """The core's rules for scale, offset and topk_weight (src/ops/moe_init_routing/meta.cpp): which must be given
    and which not, their shapes and dtypes, in its order and words. An extent compared with a symbolic size
    becomes a guard of the trace: the kernel requires the equality anyway."""
    def float32(t, dims):
        return t.dim() == dims and t.dtype == torch.float32

    def shaped(t, shape):
        return float32(t, len(shape)) and all(a == b for a, b in zip(t.shape, shape))
    if quant_mode == -1 and scale is not None and not shaped(scale, (n,)):
        raise ValueError(f"{op}: scale must be 1-D float32 [N] = [{n}] (a per-token scale) when quant_mode=-1, got "
                         f"{_describe(scale)}")
    if quant_mode == 0 and scale is None:
        raise ValueError(f"{op}: scale must be given (1-D float32 [1]) when quant_mode=0, got none")
    if quant_mode == 0 and not shaped(scale, (1,)):
        raise ValueError(f"{op}: scale must be 1-D float32 [1] when quant_mode=0, got {_describe(scale)}")
    if quant_mode == 1 and scale is not None and not (shaped(scale, (experts, hidden)) or shaped(scale, (1, hidden))):
        raise ValueError(f"{op}: scale must be 2-D float32 [end - start, H] = [{experts}, {hidden}] or [1, {hidden}] "
                         f"(a smooth scale) when quant_mode=1, got {_describe(scale)}")
    if offset is not None and quant_mode != 0:
        raise ValueError(f"{op}: offset must be none unless quant_mode=0 (it is only used by static quantisation), "
                         f"got {_describe(offset)} with quant_mode={quant_mode}")
    if offset is not None and not shaped(offset, (1,)):
        raise ValueError(f"{op}: offset must be 1-D float32 [1] when quant_mode=0, got {_describe(offset)}")
    if topk_weight is not None and not shaped(topk_weight, (n, k)):
        raise ValueError(f"{op}: topk_weight must be 2-D float32 [N, K] = [{n}, {k}], got {_describe(topk_weight)}")


@torch.library.register_fake("moe_routing::moe_init_routing")
def _moe_init_routing_fake(x, expert_idx, scale=None, offset=None, topk_weight=None, active_num=-1,
                           expert_capacity=-1, expert_num=-1, drop_pad_mode=0, expert_tokens_num_type=0,
                           expert_tokens_num_flag=False, quant_mode=-1, active_expert_range=None,
                           row_idx_type=0, x_dtype=None, *, numerics="atlas_a2"):
    op = "moe_init_routing"
    if x_dtype is not None:
        raise NotImplementedError(f"{op}: x_dtype must be None (CANN's float4/hifloat8/int4 data types are "
                                  f"not supported), got {x_dtype}")
    if active_expert_range is not None and len(active_expert_range) != 2:
        raise ValueError(f"{op}: active_expert_range must be a list of two ints [start, end], got "
                         f"{len(active_expert_range)} values")
    _check_routing_inputs(op, x, expert_idx, numerics, scale=scale, offset=offset, topk_weight=topk_weight)
    start, end = _check_v4_attrs(op, quant_mode, drop_pad_mode, expert_num, active_expert_range,
                                 expert_tokens_num_type, row_idx_type, active_num, expert_capacity)
    _check_x_and_expert_idx(op, x, expert_idx)
    quantised = quant_mode in (0, 1)
    if quantised and x.dtype not in _FLOATS:
        raise ValueError(f"{op}: x must be float16, bfloat16 or float32 when quant_mode is 0 or 1, got "
                         f"{dtype_name(x.dtype)}")
    if not quantised and x.dtype not in _FLOATS + (torch.int8,):
        raise ValueError(f"{op}: x must be float16, bfloat16, float32 or int8, got {dtype_name(x.dtype)}")
    n, hidden = x.shape
    pairs = n * expert_idx.shape[1]
    _check_v4_optional_inputs(op, scale, offset, topk_weight, quant_mode, n, hidden, expert_idx.shape[1],
                              end - start)
    _check_slots_fit_int32(op, drop_pad_mode, expert_num, expert_capacity)
    out_dtype = torch.int8 if quantised else x.dtype
    if drop_pad_mode == 1:
        rows = expert_num * expert_capacity
        _check_output_bytes(op, "expanded_x", out_dtype, (expert_num, expert_capacity, hidden))
        expanded_x = x.new_empty((expert_num, expert_capacity, hidden), dtype=out_dtype)
    else:
        rows = pairs
        _check_output_bytes(op, "expanded_x", out_dtype, (pairs, hidden))
        expanded_x = x.new_empty((pairs, hidden), dtype=out_dtype)
    expanded_row_idx = x.new_empty((pairs,), dtype=torch.int32)
    if expert_tokens_num_flag and expert_tokens_num_type == 2:
        counts = x.new_empty((expert_num, 2), dtype=torch.int64)
    else:
        counts = x.new_empty((end - start,), dtype=torch.int64)
    expanded_scale = x.new_empty((rows,), dtype=torch.float32)
    if topk_weight is not None:
        expanded_topk_weight = x.new_empty((rows, 1), dtype=torch.float32)
    else:
        expanded_topk_weight = x.new_empty((0,), dtype=torch.float32)
    return expanded_x, expanded_row_idx, counts, expanded_scale, expanded_topk_weight


@torch.library.register_fake("moe_routing::moe_init_routing_grad.out")
def _moe_init_routing_grad_out_fake(grad_expanded_x, expanded_row_idx, top_k, drop_pad_mode=0,
                                    active_num=0, *, numerics="atlas_a2", order=None, out):
    expected = _moe_init_routing_grad_fake(grad_expanded_x, expanded_row_idx, top_k, drop_pad_mode, active_num,
                                           numerics=numerics, order=order)
    _check_out("moe_init_routing_grad", grad_expanded_x, {"grad_x": out}, (expected,))
    return None


@torch.library.register_fake("moe_routing::moe_init_routing.out")
def _moe_init_routing_out_fake(x, expert_idx, scale=None, offset=None, topk_weight=None, active_num=-1,
                               expert_capacity=-1, expert_num=-1, drop_pad_mode=0, expert_tokens_num_type=0,
                               expert_tokens_num_flag=False, quant_mode=-1, active_expert_range=None,
                               row_idx_type=0, x_dtype=None, *, numerics="atlas_a2", expanded_x, expanded_row_idx,
                               expert_tokens_count_or_cumsum, expanded_scale, expanded_topk_weight):
    expected = _moe_init_routing_fake(x, expert_idx, scale, offset, topk_weight, active_num, expert_capacity,
                                      expert_num, drop_pad_mode, expert_tokens_num_type, expert_tokens_num_flag,
                                      quant_mode, active_expert_range, row_idx_type, x_dtype, numerics=numerics)
    outs = dict(expanded_x=expanded_x, expanded_row_idx=expanded_row_idx,
                expert_tokens_count_or_cumsum=expert_tokens_count_or_cumsum, expanded_scale=expanded_scale,
                expanded_topk_weight=expanded_topk_weight)
    _check_out("moe_init_routing", x, outs, expected)
    return None


# ---- the combine -------------------------------------------------------------------------------

_FINALIZE_APIS = ("v1", "v2")


def _check_2d_kind(op, name, t, dtype, extents, what):
    """The core's check of a present 2-D input (check_2d in src/ops/moe_finalize_routing/meta.cpp), its rank and
    dtype, in its words: the extents may be symbolic here, and the device kernel checks them. `extents()` gives
    the (rows, cols) the message names, computed only for the message (no guard on a symbolic size)."""
    if t is not None and (t.dim() != 2 or t.dtype != dtype):
        rows, cols = extents()
        raise ValueError(f"{op}: {name} must be 2-D {dtype_name(dtype)} [{rows}, {cols}] ({what}), got "
                         f"{_describe(t)}")


def _check_scales_kind(op, scales, dtype, of):
    """scales: 2-D of the data's dtype, or float32 with bfloat16 data (both operators' rule and words)."""
    mixed = dtype == torch.bfloat16 and scales.dtype == torch.float32
    if scales.dim() != 2 or (scales.dtype != dtype and not mixed):
        raise ValueError(f"{op}: scales must be 2-D [N, K] of the dtype of {of} ({dtype_name(dtype)}"
                         f"{') or float32' if dtype == torch.bfloat16 else ')'}, got {_describe(scales)}")


def _check_bias_kind(op, bias, dtype, hidden):
    if bias is not None and (bias.dim() != 2 or bias.dtype != dtype):
        raise ValueError(f"{op}: bias must be 2-D {dtype_name(dtype)} [E, {hidden}] ([E, H]), got {_describe(bias)}")


def _check_finalize_presence(op, api, x1, x2, bias, scales, expert_idx, x, alpha1, alpha2, v, enabled):
    """The core's rules on which inputs the api and the other inputs require (src/ops/moe_finalize_routing/
    meta.cpp), in its order and words; `enabled` maps the enabled ranges' names to [start, end)."""
    if api == "v1":
        for name, t in (("x1", x1), ("bias", bias), ("scales", scales), ("expert_idx", expert_idx)):
            if t is None:
                raise ValueError(f"{op}: {name} must be present with api v1, got none")
        for name, t in (("x", x), ("alpha1", alpha1), ("alpha2", alpha2), ("v", v)):
            if t is not None:
                raise ValueError(f"{op}: {name} must be absent with api v1 (it belongs to V3/V4), got {_describe(t)}")
    if x2 is not None and x1 is None:
        raise ValueError(f"{op}: x2 needs x1 (CANN adds x2 only to x1), got x2 without x1")
    if bias is not None and expert_idx is None:
        raise ValueError(f"{op}: bias needs expert_idx (the row of bias of each pair), got none")
    names = ("zero_expert_range", "copy_expert_range", "constant_expert_range")
    for name in names:
        if name in enabled and expert_idx is None:
            raise ValueError(f"{op}: {name} needs expert_idx, got none")
    for name in names[1:]:
        if name in enabled and x is None:
            raise ValueError(f"{op}: {name} needs x (the tokens' input rows), got none")
    given = [t is not None for t in (alpha1, alpha2, v)]
    if len(set(given)) > 1:
        no = ["" if g else "no " for g in given]
        raise ValueError(f"{op}: alpha1, alpha2 and v must be given together, got {no[0]}alpha1, {no[1]}alpha2 and "
                         f"{no[2]}v")
    if "constant_expert_range" in enabled and not given[0]:
        raise ValueError(f"{op}: constant_expert_range needs alpha1, alpha2 and v, got none")
    if given[0] and "constant_expert_range" not in enabled:
        raise ValueError(f"{op}: alpha1, alpha2 and v need constant_expert_range, got [-1, -1] (none)")


@torch.library.register_fake("moe_routing::moe_finalize_routing")
def _moe_finalize_routing_fake(expanded_x, expanded_row_idx, x1=None, x2=None, bias=None, scales=None,
                               expert_idx=None, x=None, alpha1=None, alpha2=None, v=None, drop_pad_mode=0,
                               zero_expert_range=None, copy_expert_range=None, constant_expert_range=None, k=1, *,
                               numerics="atlas_a2", api="v2"):
    op = "moe_finalize_routing"
    # The binding's checks (range lengths, numerics, api, devices and dtypes), then the core's
    # (src/ops/moe_finalize_routing/meta.cpp), in their order and words.
    ranges = (("zero_expert_range", zero_expert_range), ("copy_expert_range", copy_expert_range),
              ("constant_expert_range", constant_expert_range))
    for name, r in ranges:
        if r is not None and len(r) != 2:
            raise ValueError(f"{op}: {name} must be a list of two ints [start, end], got {len(r)} values")
    _check_numerics(op, numerics)
    if api not in _FINALIZE_APIS:
        raise ValueError(f'{op}: api must be "v1" or "v2", got "{_shown(api)}"')
    inputs = dict(expanded_row_idx=expanded_row_idx, x1=x1, x2=x2, bias=bias, scales=scales, expert_idx=expert_idx,
                  x=x, alpha1=alpha1, alpha2=alpha2, v=v)
    _check_devices(op, expanded_x, **inputs)
    _check_core_dtypes(op, expanded_x=expanded_x, **inputs)
    mode = 0 if drop_pad_mode is None else drop_pad_mode
    if mode not in (0, 1, 2, 3):
        raise ValueError(f"{op}: drop_pad_mode must be 0 (dropless, column), 1 (drop-pad, column), "
                         f"2 (dropless, row) or 3 (drop-pad, row), got {mode}")
    # The core's top_k, named as the schema names it (so does the kernel's message: torch_ops.cpp).
    if (1 if k is None else k) < 1:
        raise ValueError(f"{op}: k must be >= 1, got {k}")
    enabled = [(name, tuple(r)) for name, r in ranges if r is not None and tuple(r) != (-1, -1)]
    for name, (begin, end) in enabled:
        if begin < 0 or end <= begin:
            raise ValueError(f"{op}: {name} must be [-1, -1] (none) or [start, end) with 0 <= start < end, got "
                             f"[{begin}, {end})")
    for i, (a_name, a) in enumerate(enabled):
        for b_name, b in enabled[i + 1:]:
            if a[0] < b[1] and b[0] < a[1]:
                raise ValueError(f"{op}: {a_name} and {b_name} must not overlap, got [{a[0]}, {a[1]}) and "
                                 f"[{b[0]}, {b[1]})")
    if api == "v1" and mode != 0:
        raise ValueError(f"{op}: drop_pad_mode must be 0 with api v1 (its column layout), got {mode}")
    if api == "v1" and enabled:
        raise ValueError(f"{op}: expert ranges must be [-1, -1] with api v1 (they are V3/V4's), got an enabled "
                         "range")
    drop_pad = mode in (1, 3)
    if expanded_x.dim() != (3 if drop_pad else 2):
        raise ValueError(f"{op}: expanded_x must be {'3-D [E, C, H]' if drop_pad else '2-D [R, H]'} when "
                         f"drop_pad_mode={mode} ({'drop-pad' if drop_pad else 'dropless'}), got "
                         f"{_describe(expanded_x)}")
    if expanded_x.dtype not in _FLOATS:
        raise ValueError(f"{op}: expanded_x must be float16, bfloat16 or float32, got {dtype_name(expanded_x.dtype)}")
    if expanded_row_idx.dim() != 1 or expanded_row_idx.dtype != torch.int32:
        raise ValueError(f"{op}: expanded_row_idx must be 1-D int32, got {_describe(expanded_row_idx)}")
    _check_finalize_presence(op, api, x1, x2, bias, scales, expert_idx, x, alpha1, alpha2, v, dict(enabled))
    top_k = 1 if k is None else k
    if scales is not None:
        _check_scales_kind(op, scales, expanded_x.dtype, "expanded_x")
        if scales.shape[1] < 1:
            raise ValueError(f"{op}: scales.size(1) (K) must be >= 1, got {scales.shape[1]}")
        top_k = scales.shape[1]
    n, hidden, dtype = expanded_row_idx.shape[0] // top_k, expanded_x.shape[-1], expanded_x.dtype
    # The other inputs' ranks and dtypes, in the core's order.
    _check_2d_kind(op, "x1", x1, dtype, lambda: (n, hidden), "[N, H]")
    _check_2d_kind(op, "x2", x2, dtype, lambda: (n, hidden), "[N, H]")
    _check_2d_kind(op, "expert_idx", expert_idx, torch.int32, lambda: (n, top_k), "[N, K]")
    _check_bias_kind(op, bias, dtype, hidden)
    _check_2d_kind(op, "x", x, dtype, lambda: (n, hidden), "[N, H]")
    if alpha1 is not None and constant_expert_range is not None:
        def constant_rows():
            return constant_expert_range[1] - constant_expert_range[0], hidden
        for name, t in (("alpha1", alpha1), ("alpha2", alpha2), ("v", v)):
            _check_2d_kind(op, name, t, dtype, constant_rows, "[constant_expert_range size, H]")
    _check_output_bytes(op, "out", dtype, (n, hidden))
    return expanded_x.new_empty((n, hidden))


@torch.library.register_fake("moe_routing::moe_finalize_routing.out")
def _moe_finalize_routing_out_fake(expanded_x, expanded_row_idx, x1=None, x2=None, bias=None, scales=None,
                                   expert_idx=None, x=None, alpha1=None, alpha2=None, v=None, drop_pad_mode=0,
                                   zero_expert_range=None, copy_expert_range=None, constant_expert_range=None, k=1,
                                   *, numerics="atlas_a2", api="v2", out):
    expected = _moe_finalize_routing_fake(expanded_x, expanded_row_idx, x1, x2, bias, scales, expert_idx, x, alpha1,
                                          alpha2, v, drop_pad_mode, zero_expert_range, copy_expert_range,
                                          constant_expert_range, k, numerics=numerics, api=api)
    _check_out("moe_finalize_routing", expanded_x, {"y": out}, (expected,))
    return None


def _finalize_grad_shapes(op, grad_y, expanded_row_idx, expanded_x, scales, expert_idx, bias, drop_pad_mode,
                          active_num, expert_num, expert_capacity, numerics):
    """(grad_expanded_x, grad_scales, grad_bias) as empty tensors of their full shapes; grad_scales and
    grad_bias None where the inputs cannot produce them."""
    inputs = dict(expanded_row_idx=expanded_row_idx, expanded_x=expanded_x, scales=scales, expert_idx=expert_idx,
                  bias=bias)
    _check_devices(op, grad_y, **inputs)
    _check_numerics(op, numerics)
    _check_core_dtypes(op, grad_y=grad_y, **inputs)
    if drop_pad_mode not in (0, 1):
        raise ValueError(f"{op}: drop_pad_mode must be 0 (dropless, row layout) or 1 (drop-pad, row layout), "
                         f"got {drop_pad_mode}")
    for name, value in (("active_num", active_num), ("expert_num", expert_num), ("expert_capacity", expert_capacity)):
        if value < 0:
            raise ValueError(f"{op}: {name} must be >= 0, got {value}")
    if grad_y.dim() != 2 or grad_y.dtype not in _FLOATS:
        raise ValueError(f"{op}: grad_y must be 2-D [N, H] float16, bfloat16 or float32, got {_describe(grad_y)}")
    if expanded_row_idx.dim() != 1 or expanded_row_idx.dtype != torch.int32:
        raise ValueError(f"{op}: expanded_row_idx must be 1-D int32, got {_describe(expanded_row_idx)}")
    if scales is not None:  # the core checks scales' kind next, before the rows
        _check_scales_kind(op, scales, grad_y.dtype, "grad_y")
    n, hidden = grad_y.shape
    pairs = expanded_row_idx.shape[0]
    if drop_pad_mode == 1:
        # The core's rules (src/ops/moe_finalize_routing_grad/meta.cpp), as exact products (Python
        # ints do not overflow): one expert's C*H slots addressable in bytes even when E = 0 (a
        # tensor's strides), the E*C slots int32 indices, the whole within int64 bytes.
        if expert_capacity * hidden * grad_y.element_size() > INT64_MAX:
            raise ValueError(f"{op}: grad_expanded_x would have more than 2^63 - 1 bytes per expert "
                             f"(expert_capacity * H), got {expert_capacity} * {hidden}")
        if expert_num * expert_capacity > INT32_MAX:
            raise ValueError(f"{op}: expert_num * expert_capacity must be at most 2147483647 (int32 indices), got "
                             f"{expert_num} * {expert_capacity}")
        if expert_num * expert_capacity * hidden * grad_y.element_size() > INT64_MAX:
            raise ValueError(f"{op}: grad_expanded_x would have more than 2^63 - 1 bytes, got "
                             f"{expert_num * expert_capacity} rows of {hidden}")
        grad_expanded_x = grad_y.new_empty((expert_num, expert_capacity, hidden))
    else:
        # The core's rule (active_num in (0, N*K) cuts the rows), written without a guard on the
        # symbolic pair count.
        rows = pairs if active_num == 0 else torch.sym_min(active_num, pairs)
        grad_expanded_x = grad_y.new_empty((rows, hidden))
    # The optional inputs' ranks and dtypes, in the core's words (src/ops/moe_finalize_routing_grad/meta.cpp).
    if expanded_x is not None and (expanded_x.dim() != grad_expanded_x.dim() or expanded_x.dtype != grad_y.dtype):
        raise ValueError(f"{op}: expanded_x must be {grad_expanded_x.dim()}-D {dtype_name(grad_y.dtype)} "
                         f"{list(grad_expanded_x.shape)} (the shape of grad_expanded_x), got {_describe(expanded_x)}")
    def n_k():
        return n, scales.shape[1] if scales is not None else (pairs // n if n else 0)
    _check_2d_kind(op, "expert_idx", expert_idx, torch.int32, n_k, "[N, K]")
    _check_bias_kind(op, bias, grad_y.dtype, hidden)
    grad_scales = None
    if scales is not None and expanded_x is not None:
        grad_scales = scales.new_empty(scales.shape)
    grad_bias = None if bias is None else grad_y.new_empty(bias.shape)
    return grad_expanded_x, grad_scales, grad_bias


@torch.library.register_fake("moe_routing::moe_finalize_routing_grad")
def _moe_finalize_routing_grad_fake(grad_y, expanded_row_idx, expanded_x=None, scales=None, expert_idx=None,
                                    bias=None, drop_pad_mode=0, active_num=0, expert_num=0, expert_capacity=0, *,
                                    numerics="atlas_a2", compute_grad_scales=True, compute_grad_bias=False):
    grad_expanded_x, grad_scales, grad_bias = _finalize_grad_shapes(
        "moe_finalize_routing_grad", grad_y, expanded_row_idx, expanded_x, scales, expert_idx, bias, drop_pad_mode,
        active_num, expert_num, expert_capacity, numerics)
    # Not asked for, or not producible: an empty tensor of the output's dtype (the kernel's rule).
    scales_dtype = grad_y.dtype if scales is None else scales.dtype
    if grad_scales is None or not compute_grad_scales:
        grad_scales = grad_y.new_empty((0,), dtype=scales_dtype)
    if grad_bias is None or not compute_grad_bias:
        grad_bias = grad_y.new_empty((0,))
    return grad_expanded_x, grad_scales, grad_bias


@torch.library.register_fake("moe_routing::moe_finalize_routing_grad.out")
def _moe_finalize_routing_grad_out_fake(grad_y, expanded_row_idx, expanded_x=None, scales=None, expert_idx=None,
                                        bias=None, drop_pad_mode=0, active_num=0, expert_num=0, expert_capacity=0, *,
                                        numerics="atlas_a2", grad_expanded_x, grad_scales=None, grad_bias=None):
    op = "moe_finalize_routing_grad"
    expected = _finalize_grad_shapes(op, grad_y, expanded_row_idx, expanded_x, scales, expert_idx, bias,
                                     drop_pad_mode, active_num, expert_num, expert_capacity, numerics)
    # The binding's order: each out= tensor the inputs can produce checked against its shape, one they cannot
    # produce only viewed (rank, dtype), then the core's refusal of it.
    outs = (("grad_expanded_x", grad_expanded_x, expected[0]), ("grad_scales", grad_scales, expected[1]),
            ("grad_bias", grad_bias, expected[2]))
    for name, t, want in outs:
        if t is not None and want is not None:
            _check_out(op, grad_y, {name: t}, (want,))
    for name, t, want in outs:
        if t is not None and want is None:
            _check_core_dtypes(op, **{name: t})
    if grad_scales is not None and expected[1] is None:
        raise ValueError(f"{op}: grad_scales needs scales and expanded_x, got "
                         f"{'no expanded_x' if scales is not None else 'no scales'}")
    if grad_bias is not None and expected[2] is None:
        raise ValueError(f"{op}: grad_bias needs bias, got none")
    return None


@torch.library.register_fake("moe_routing::_empty_from_output_cache")
def _empty_from_output_cache_fake(shape, dtype):
    return torch.empty(shape, dtype=dtype)
