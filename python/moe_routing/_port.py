"""Helpers shared by the ported APIs (moe_routing.torch_npu, moe_routing.megatron).

Those modules express other libraries' functions through our operators. Everything they do
outside the operators is exact integer or selection work (index transposes, inverses, masks,
slices, widening casts); the floating-point arithmetic stays inside the operators, in their
documented orders. Errors read `<function>: <argument> <constraint>, got <actual>` with the
caller's function and argument names, also when an operator underneath finds the problem.
"""
from __future__ import annotations

import operator
import re
from typing import Dict, Optional, Tuple

import torch
from torch._subclasses.fake_tensor import is_fake

from ._api import (INT32_MAX, INT64_MAX, INT64_MIN, _call, _not_an_int, dtype_name, func_transform_error,
                   moe_finalize_routing, moe_init_routing_v2, non_dense_kind, not_an_int_error)
from ._autograd import refuse_forward_ad

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def is_compiling() -> bool:
    """True while torch.compile traces: data checks (which read tensor values on the host) are left
    out of the graph then, and the operators' own checks remain."""
    return torch.compiler.is_compiling()


def reads_values(function: str, *tensors) -> bool:
    """Whether the ports' data checks run, which read index values on the host: not while
    torch.compile traces, and not on tensors that hold no values (meta tensors, FakeTensorMode's
    fakes), where the call computes only shapes, as the operators' fake functions do. Those paths
    give what a compiled graph gives (an invalid index is refused by the operator that reads it,
    never read as a wrong row). `tensors` are every tensor the check reads, directly or through
    what the call computed from them: where torch.func.vmap batches one of them, the check can
    neither read its values nor be left out (what a compiled graph's skipped checks let through
    would become silently wrong rows of a batch), so `function` refuses the call; an unbatched
    index is checked under vmap as in eager mode."""
    if is_compiling():
        return False
    if any(isinstance(t, torch.Tensor) and is_batched(t) for t in tensors):
        raise NotImplementedError(
            f"{function}: torch.func.vmap over its index arguments is not supported, got a batched one (the "
            "function checks index values on the host, which vmap's batched tensors do not expose); call it once "
            "per sample, or batch moe_routing's operators, which vmap supports")
    return not any(isinstance(t, torch.Tensor) and (t.is_meta or is_fake(t)) for t in tensors)


def is_batched(t: torch.Tensor) -> bool:
    """Whether torch.func.vmap batches t at some level (also inside another transform's wrapper, as
    in vmap(grad(f)))."""
    functorch = torch._C._functorch
    while functorch.is_functorch_wrapped_tensor(t):
        if functorch.is_batchedtensor(t):
            return True
        t = functorch.get_unwrapped(t)
    return False


def renamed_errors(function: str, call, names: Optional[Dict[str, str]] = None):
    """Runs call(); an operator's ValueError / IndexError / NotImplementedError is raised again
    with the operator's name replaced by `function` and its argument names by the caller's
    (`names`: ours -> theirs), so the message names what the caller passed. Under torch.compile
    the call runs as is (a re-raise cannot be traced; the operators' fake functions report with
    their own names at trace time)."""
    if is_compiling():
        return call()
    try:
        return call()
    except (ValueError, IndexError, NotImplementedError) as error:
        message = re.sub(r"^[A-Za-z0-9_]+:", f"{function}:", str(error), count=1)
        for ours, theirs in (names or {}).items():
            message = re.sub(rf"\b{re.escape(ours)}\b", theirs, message)
        raise type(error)(message) from error


def check_tensor(function: str, name: str, tensor, dims, dtypes, shape_text: str = "") -> None:
    """`tensor` is a dense torch.Tensor with one of `dims` dimensions and one of `dtypes`."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{function}: {name} must be a tensor, got {type(tensor).__name__}")
    kind = non_dense_kind(tensor)
    if kind is not None:
        raise ValueError(f"{function}: {name} must be a dense (strided) tensor, got a {kind} tensor")
    if tensor.dim() not in dims:
        wanted = " or ".join(f"{d}-D" for d in dims)
        raise ValueError(f"{function}: {name} must be {wanted}{shape_text}, got {tensor.dim()}-D "
                         f"{list(tensor.shape)}")
    if tensor.dtype not in dtypes:
        wanted = ", ".join(dtype_name(d) for d in dtypes)
        raise ValueError(f"{function}: {name} must be one of {wanted}, got {dtype_name(tensor.dtype)}")


def check_device(function: str, tensors: Dict[str, Optional[torch.Tensor]]) -> None:
    """Every tensor given (None: absent) is on the device of the first: the ports combine them in
    PyTorch ops of their own (gathers, masks, comparisons) before any operator checks devices."""
    first_name, first = next(iter(tensors.items()))
    for name, tensor in tensors.items():
        if tensor is not None and tensor.device != first.device:
            raise ValueError(f"{function}: {name} must be on {first.device} (the device of {first_name}), got "
                             f"{tensor.device}")


def check_int(function: str, name: str, value, minimum: Optional[int] = None):
    """An int (or SymInt, or a 0-dim integer tensor) >= minimum; floats, bools, complex and other
    tensors are refused rather than truncated (the operators' check, _not_an_int)."""
    if _not_an_int(value):
        raise not_an_int_error(function, name, value)
    if isinstance(value, torch.Tensor):
        value = int(value)
    elif not isinstance(value, (int, torch.SymInt)):
        # Not for an int: under torch.compile a symbolic int (x.shape[0] * k) is an int to Dynamo, not
        # a SymInt, and operator.index would specialise it to its value (a recompile per token
        # count; with torch._dynamo.mark_dynamic a ConstraintViolationError).
        try:
            value = operator.index(value)
        except TypeError:
            raise not_an_int_error(function, name, value) from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{function}: {name} must be >= {minimum}, got {value}")
    return value


def shape_argument(function: str, name: str, value) -> list:
    """A shape argument (a sequence of ints: list, tuple, torch.Size, 1-D tensor) as a list of ints >= 0;
    an int, None or a string is not one."""
    try:
        if isinstance(value, (str, bytes)):
            raise TypeError
        extents = list(value)
    except TypeError:
        raise ValueError(f"{function}: {name} must be a sequence [num_tokens, hidden], got {value!r}") from None
    return [check_int(function, name, extent, minimum=0) for extent in extents]


def refuse_non_ints(function: str, values: Dict[str, object]) -> None:
    """Nothing among these int arguments (name -> value), which the caller passes on to an operator as they
    are, that PyTorch's schema would take as another int (a bool, a floating tensor: _not_an_int): the operator
    refuses it too, but in its own name, which renamed_errors cannot replace under torch.compile. Constants
    while tracing, so this runs at trace time, adding nothing to the graph."""
    for name, value in values.items():
        if _not_an_int(value, name):
            raise not_an_int_error(function, name, value)


def first_true(mask: torch.Tensor) -> Optional[int]:
    """The flat position of the first True in mask, or None (reads the data: eager only)."""
    flat = mask.reshape(-1)
    if not bool(flat.any()):
        return None
    return int(flat.nonzero()[0, 0])


def position(shape, flat: int) -> str:
    """`[i][j]` for a flat position in a tensor of `shape` (row-major)."""
    indices = []
    for extent in reversed(list(shape)):
        indices.append(flat % extent if extent else 0)
        flat //= extent if extent else 1
    return "".join(f"[{i}]" for i in reversed(indices))


def int32_index(function: str, name: str, index: torch.Tensor, low: int, high: int, meaning: str) -> torch.Tensor:
    """An index tensor (int32 or int64) as int32, every value in [low, high). In eager mode a value
    outside is an IndexError naming its position; under torch.compile (no data checks) an int64
    value outside the int32 range becomes INT32_MIN instead of wrapping, so the operator that reads
    it rejects it rather than reading a wrong row."""
    checked = reads_values(function, index)
    if checked:
        # A bound outside the index's dtype (num_expert = 2**31 for int32 ids) would wrap in the
        # comparison and flag valid values: compare in int64 then.
        info = torch.iinfo(index.dtype)
        wide = index if info.min <= low and high <= info.max else index.long()
        bad = first_true((wide < max(low, INT64_MIN)) | ((wide >= high) if high <= INT64_MAX else False))
        if bad is not None:
            value = int(index.reshape(-1)[bad])
            raise IndexError(f"{function}: {name}{position(index.shape, bad)} must be in [{low}, {high}) "
                             f"({meaning}), got {value}")
    if index.dtype == torch.int32:
        return index
    if checked and -INT32_MAX - 1 <= low and high <= INT32_MAX + 1:
        # Every value was seen in [low, high), inside int32: the cast is exact, no clamping pass.
        return index.to(torch.int32)
    # Compiled (nothing was checked), or [low, high) reaches past int32 (high = the length of an
    # index of more than 2**31 entries): values outside int32 become INT32_MIN, never wrap.
    return torch.where((index >= -INT32_MAX) & (index <= INT32_MAX), index, -INT32_MAX - 1).to(torch.int32)


def _native_scales(rows_dtype: torch.dtype, scales_dtype: torch.dtype) -> bool:
    """The (rows, scales) dtype pairs moe_finalize_routing takes as they are."""
    return scales_dtype == rows_dtype or (rows_dtype == torch.bfloat16 and scales_dtype == torch.float32)


class _SkipZeroScales(torch.autograd.Function):
    """moe_finalize_routing (drop_pad_mode 2) in which a pair whose scale is exactly 0 adds nothing,
    so an Inf/NaN row times 0 cannot poison its token (Atlas A2's MoeTokenUnpermute kernel). The
    backward differentiates the ordinary sum: such a pair still gets its scale's gradient
    (row . grad_y), as the kernel's MoeTokenUnpermuteGrad gives it.

    Under torch.func it behaves as the operators do (the forward and setup_context are separate,
    which torch.func requires of a Function): vmap batches it as a loop of calls would, and
    torch.func's differentiating transforms are refused with the operator's message (renamed_errors
    gives it the caller's name); weighted_combine refuses forward mode before it is applied."""

    generate_vmap_rule = True

    @staticmethod
    def forward(rows, index, scales, numerics, grad_numerics):
        skipped = torch.where(scales.reshape(-1) == 0, -1, index).to(torch.int32)
        return _call(torch.ops.moe_routing.moe_finalize_routing,
                     rows, skipped, None, None, None, scales, None, None, None, None, None, 2, None, None, None, 1,
                     numerics=numerics, api="v2")

    @staticmethod
    def setup_context(ctx, inputs, output):
        rows, index, scales, _, grad_numerics = inputs
        interpreter = None if is_compiling() else torch._C._functorch.peek_interpreter_stack()
        if (interpreter is not None and interpreter.key() == torch._C._functorch.TransformType.Grad
                and (rows.requires_grad or scales.requires_grad)):
            # torch.func.grad / vjp / jacrev differentiating rows or scales: the backward's operator
            # cannot run under them. Refused here, in the forward, as the operator is (_api._eager).
            raise NotImplementedError(func_transform_error("moe_finalize_routing"))
        # rows are read only by scales' gradient: saved only then, as the operators' autograd saves
        # (a tensor saved and never read made the backward refuse it changed in place).
        ctx.rows_shape = rows.shape
        ctx.save_for_backward(rows if ctx.needs_input_grad[2] else None, index, scales)
        ctx.grad_numerics = grad_numerics

    @staticmethod
    def backward(ctx, grad_y):
        rows, index, scales = ctx.saved_tensors
        want_rows, _, want_scales = ctx.needs_input_grad[:3]
        shape = ctx.rows_shape
        if shape[0] == 0:  # no rows: nothing was read (the grad's active_num 0 would mean "all")
            return grad_y.new_zeros(shape), None, scales.new_zeros(scales.shape), None, None
        grad_rows, grad_scales, _ = _call(
            torch.ops.moe_routing.moe_finalize_routing_grad, grad_y.contiguous(), index, rows, scales, None, None, 0,
            shape[0], 0, 0, numerics=ctx.grad_numerics, compute_grad_scales=want_scales, compute_grad_bias=False)
        return (grad_rows if want_rows else None), None, (grad_scales if want_scales else None), None, None


@torch.library.custom_op("moe_routing::_port_cast", mutates_args=())
def _port_cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x.to(dtype) as an operator of its own (always a new tensor), differentiable: its backward is
    the cast back. Where a port widens a dtype pair the combine does not take together, and narrows
    its result (and autograd narrows the widened inputs' gradients), the narrowing must round where
    eager rounds; torch.compile's inductor fuses a plain .to() with its neighbours (e.g. autograd's
    addition of two float16 gradients of one tensor) and rounds once, in float32, instead
    (torch._inductor.config.emulate_precision_casts is off by default). An operator is opaque to it."""
    return x.to(dtype, copy=True)


@_port_cast.register_fake
def _port_cast_fake(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_like(x, dtype=dtype)


def _port_cast_setup(ctx, inputs, output) -> None:
    ctx.dtype = inputs[0].dtype


def _port_cast_backward(ctx, grad: torch.Tensor):
    return _port_cast(grad, ctx.dtype), None


_port_cast.register_autograd(_port_cast_backward, setup_context=_port_cast_setup)


@_port_cast.register_vmap
def _port_cast_vmap(info, in_dims, x: torch.Tensor, dtype: torch.dtype):
    return _port_cast(x, dtype), in_dims[0]


def _exact_cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x.to(dtype), rounding where eager rounds also when compiled: the opaque _port_cast while
    torch.compile traces, and for a widening that autograd records (its backward, a narrowing, may run
    under compiled autograd, which fuses a plain one); the plain cast otherwise (an operator call with
    autograd costs ~30 us). torch.func's differentiating transforms are refused as the operators refuse
    them, in moe_finalize_routing's name, which renamed_errors turns into the caller's."""
    if is_compiling():
        return _port_cast(x, dtype)
    widening = torch.finfo(dtype).bits > torch.finfo(x.dtype).bits
    if not (widening and torch.is_grad_enabled() and x.requires_grad):
        return x.to(dtype)
    try:
        return _port_cast(x, dtype)
    except RuntimeError as error:
        if type(error) is RuntimeError and "must override the setup_context staticmethod" in str(error):
            raise NotImplementedError(func_transform_error("moe_finalize_routing")) from None
        raise


def weighted_combine(rows: torch.Tensor, index: torch.Tensor, scales: Optional[torch.Tensor], k: int,
                     numerics: str = "ascend_950", skip_zero_scales: bool = False,
                     grad_numerics: Optional[str] = None) -> torch.Tensor:
    """out[i] = sum_t scales[i, t] * rows[index[i*k + t]] (row layout; -1 and values in
    [rows, N*k) skip their pair) through moe_finalize_routing, drop_pad_mode 2, differentiable.

    With numerics "ascend_950" every dtype accumulates in float32: acc = +0, then acc + the float32
    product for t = 0, 1, ... in order, one round-to-nearest-even narrowing to the dtype of rows.
    Dtype pairs the operator does not take together (float16 rows with float32 scales, float32
    rows with 16-bit scales, ...) are widened to float32 first - exact - and the result narrowed
    once to the dtype of rows: the same bits as that arithmetic on the original tensors.
    """
    out_dtype = rows.dtype
    widen = scales is not None and not _native_scales(rows.dtype, scales.dtype)
    if (widen or skip_zero_scales) and not is_compiling():
        # Forward mode is refused as by the operator, before what would lose a tangent on the way to
        # it: _port_cast (an operator with no forward-mode formula) and _SkipZeroScales (a Function's
        # own jvp would stop Dynamo; its forward runs with forward grad mode off, so the operator's own
        # check sees no tangent).
        refuse_forward_ad("moe_finalize_routing", (("expanded_x", rows), ("scales", scales)))
    if widen:
        # Widening is exact; _exact_cast makes every narrowing (the result's, and the gradients' in
        # the backward) round where eager rounds, compiled too.
        rows = rows if rows.dtype == torch.float32 else _exact_cast(rows, torch.float32)
        scales = scales if scales.dtype == torch.float32 else _exact_cast(scales, torch.float32)
    if skip_zero_scales and scales is not None:
        out = _SkipZeroScales.apply(rows, index, scales, numerics, grad_numerics or numerics)
    else:
        out = moe_finalize_routing(rows, index, scales=scales, drop_pad_mode=2, k=k, numerics=numerics)
    return out if out.dtype == out_dtype else _exact_cast(out, out_dtype)


def no_rows(x: torch.Tensor) -> torch.Tensor:
    """An empty [0, H] selection of x that stays on the autograd graph (its gradient is zeros)."""
    return x.index_select(0, torch.empty(0, dtype=torch.long, device=x.device))


def sorted_rows(function, x, keys, rows, numerics, names):
    """moe_init_routing_v2 dropless on (x, keys), first `rows` sorted rows kept: (expanded_x,
    expanded_row_idx). rows = 0 keeps none (V2's active_num 0 would mean all): the sort then runs
    on a zero-width x and expanded_x is an empty selection of x."""
    source = x if rows > 0 else x[:, :0]
    expanded_x, expanded_row_idx, _, _ = renamed_errors(
        function, lambda: moe_init_routing_v2(source, keys, rows, numerics=numerics), names)
    return (expanded_x if rows > 0 else no_rows(x)), expanded_row_idx


# ---- routing maps ([N, E], nonzero = routed): Megatron-Core's permute and torch_npu's routing-map pair ----

def routed_slots(routing_map: torch.Tensor, k: int) -> torch.Tensor:
    """int64 [N, E]: the slot of each routed pair (n, e) among token n's routed experts in increasing
    id (0, 1, ...), k for an unrouted pair or a slot >= k: a scatter target whose column k is dropped."""
    routed = routing_map != 0
    slot = routed.long().cumsum(1) - 1
    return torch.where(routed & (slot < k), slot, k)


def by_slot(values: torch.Tensor, slots: torch.Tensor, k: int, fill) -> torch.Tensor:
    """[N, k]: out[n, slots[n, e]] = values[n, e] for the slots below k, `fill` elsewhere (an exact scatter)."""
    # new_full, not torch.full: under torch.func.vmap it is batched as `values` is, so the in-place
    # scatter below batches too (as in sorted_pairs and megatron's inverse map).
    out = values.new_full((values.shape[0], k + 1), fill)
    return out.scatter_(1, slots, values)[:, :k]


MAP_DTYPES = (torch.bool, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def check_routing_map(function: str, routing_map: torch.Tensor, probs: Optional[torch.Tensor],
                      tokens: Optional[int], first: Dict[str, torch.Tensor]) -> None:
    """routing_map and probs, on the device of `first` ({name: tensor}, the function's first input)."""
    check_tensor(function, "routing_map", routing_map, (2,), MAP_DTYPES, " [num_tokens, num_experts]")
    n, e = routing_map.shape
    if tokens is not None and n != tokens:
        raise ValueError(f"{function}: routing_map must have one row per token ({tokens}), got "
                         f"{list(routing_map.shape)}")
    if e < 1:
        raise ValueError(f"{function}: routing_map must have at least one expert column, got {list(routing_map.shape)}")
    if n * e > INT32_MAX:
        raise ValueError(f"{function}: routing_map must have at most {INT32_MAX} entries (the pairs are indexed in "
                         f"int32), got {n} * {e} = {n * e}")
    if probs is not None:
        check_tensor(function, "probs", probs, (2,), FLOAT_DTYPES, " [num_tokens, num_experts]")
        if probs.shape != routing_map.shape:
            raise ValueError(f"{function}: probs must have routing_map's shape {list(routing_map.shape)}, got "
                             f"{list(probs.shape)}")
    check_device(function, {**first, "routing_map": routing_map, "probs": probs})


def routing_map_keys(routing_map: torch.Tensor, num_out_tokens: int, drop_and_pad: bool) -> Tuple[torch.Tensor, int]:
    """(keys int32 [N, E], rows): a stable sort of the N*E pairs (n, e), flat position n*E + e, by key
    lists Megatron-Core's permuted rows first, in its order; `rows` of them are kept.

    Dropless (Megatron: a stable descending argsort of routing_map^T flattened): routed pairs,
    key e, come first, expert-major and token-ascending; then the unrouted pairs, key E + e, in the
    same order - the rows past the routed count when num_out_tokens exceeds it.
    drop_and_pad (capacity C = num_out_tokens // E, per expert the first C tokens of a stable
    descending argsort of its column): each expert's list is its routed tokens ascending, then its
    unrouted tokens ascending; the first min(C, N) are kept - routed ones with key 2e, unrouted
    (padding) ones with key 2e + 1 - and the rest get key 2E, after every kept pair.
    """
    n, e = routing_map.shape
    routed = routing_map != 0
    expert = torch.arange(e, dtype=torch.int32, device=routing_map.device).expand(n, e)
    if not drop_and_pad:
        return torch.where(routed, expert, expert + e), min(num_out_tokens, n * e)
    capacity = num_out_tokens // e
    routed_rank = routed.cumsum(0) - 1
    other_rank = routed.sum(0) + (~routed).cumsum(0) - 1
    kept = torch.where(routed, routed_rank, other_rank) < capacity
    keys = torch.where(kept, 2 * expert + (~routed).to(torch.int32), 2 * e)
    return keys.to(torch.int32), e * min(capacity, n)


def sorted_pairs(row_idx: torch.Tensor, rows: int) -> torch.Tensor:
    """The flat pair n*E + e of each of the first `rows` sorted rows: the inverse of the sort's
    pair -> row permutation (int64)."""
    pairs = row_idx.numel()
    inverse = row_idx.new_empty(pairs, dtype=torch.long)  # batched under vmap as row_idx (by_slot)
    inverse.scatter_(0, row_idx.long(), torch.arange(pairs, device=row_idx.device))
    return inverse[:rows]
