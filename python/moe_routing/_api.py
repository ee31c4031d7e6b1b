"""The public functions, with CANN's (cann_ops_transformer) names, argument order and defaults."""
from __future__ import annotations

import operator
from typing import List, Optional, Union

import torch

try:
    import numpy as _numpy
except ImportError:  # torch runs without NumPy; then no value is a NumPy one
    _numpy = None

from . import _library  # noqa: F401  (registers torch.ops.moe_routing.*, which _INT_ARGUMENTS reads)


INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1


def _int64(value) -> bool:
    """value is an int (operator.index) that an int64 holds; a float, str, ... is not."""
    try:
        return INT64_MIN <= operator.index(value) <= INT64_MAX
    except (TypeError, RuntimeError):  # RuntimeError: a uint64 tensor above INT64_MAX has no int64 value
        return False


def _schema(op):
    """The schema of an operator (its default overload's for a packet)."""
    return (op.default if isinstance(op, torch._ops.OpOverloadPacket) else op)._schema


def _name(op) -> str:
    """The operator's name without its namespace: "moe_init_routing"."""
    return _schema(op).name.split("::")[-1]


def _bound_arguments(op, args, kwargs):
    """op's schema, and the values of op(*args, **kwargs) by argument name."""
    schema = _schema(op)
    values = dict(zip((a.name for a in schema.arguments if not a.kwarg_only), args))
    values.update(kwargs)
    return schema, values


def _schema_error(op, args, kwargs) -> Optional[ValueError]:
    """The ValueError for the first argument of op(*args, **kwargs) that the schema refuses (a float
    for an int, an int outside int64, a list for a tensor, ...), or None: PyTorch's own message for
    it is a RuntimeError listing the whole schema, naming neither function nor argument our way."""
    schema, values = _bound_arguments(op, args, kwargs)
    function = _name(op)
    for argument in schema.arguments:
        if argument.name not in values:
            continue
        value, kind = values[argument.name], str(argument.type)
        optional = kind.startswith("Optional[")
        if optional:
            if value is None:
                continue
            kind = kind[len("Optional["):-1]
        if kind == "Tensor" and not isinstance(value, torch.Tensor):
            return ValueError(f"{function}: {argument.name} must be a tensor{' or None' if optional else ''}, got "
                              f"{type(value).__name__}")
        if kind == "str" and not isinstance(value, str):
            return ValueError(f"{function}: {argument.name} must be a str, got {value!r}")
        if kind in ("int", "SymInt", "bool") and not isinstance(value, torch.dtype):  # PyTorch takes a dtype
            try:
                operator.index(value)
            except TypeError:
                if kind != "bool":
                    return not_an_int_error(function, argument.name, value)
                return ValueError(f"{function}: {argument.name} must be a bool, got {value!r}")
            except RuntimeError:  # a uint64 tensor above INT64_MAX (torch cannot give its value as an int)
                return ValueError(f"{function}: {argument.name} must be an int within int64, got {value!r}")
            if kind != "bool" and not _int64(value):  # a bool takes any int: its truth
                return ValueError(f"{function}: {argument.name} must be an int within int64, got {value!r}")
        if (kind in ("List[int]", "List[SymInt]") and isinstance(value, (list, tuple))
                and not all(_int64(v) for v in value)):
            return ValueError(f"{function}: {argument.name} must be a list of ints within int64, got {value!r}")
    return None


def _int_argument_table(op):
    """(op's name, the (position, name) of each positional int (or SymInt) argument, the names of all of them),
    optional ones too."""
    kinds = ("int", "SymInt", "Optional[int]", "Optional[SymInt]")
    arguments = _schema(op).arguments
    return (_name(op), tuple((i, a.name) for i, a in enumerate(arguments) if not a.kwarg_only and str(a.type) in kinds),
            frozenset(a.name for a in arguments if str(a.type) in kinds))


# Every operator's packet and overload (what _call and _functional are given) -> its int argument table, built
# once here: the schema objects it comes from are C++ ones that torch.compile cannot trace, while this dict of
# constants it can, so the check of _refuse_non_int runs at trace time too, without a graph break.
# The public operators (tests/python/test_compile.py checks that these are all the extension defines; a name
# read from the dispatcher at import would also take another library's registrations in the namespace).
PUBLIC_OPERATORS = ("moe_init_routing", "moe_init_routing_v2", "moe_init_routing_grad", "moe_finalize_routing",
                    "moe_finalize_routing_grad")
_INT_ARGUMENTS = {op: _int_argument_table(op)
                  for packet in (getattr(torch.ops.moe_routing, name) for name in PUBLIC_OPERATORS)
                  for op in (packet, *(getattr(packet, overload) for overload in packet.overloads()))}


# Every operator's bool arguments, (position, name) of the positional ones and the names of all: PyTorch's schema
# takes any value for a bool by its truth (expert_tokens_num_flag=0.5 as True, None as False); _refuse_non_int
# refuses what is not a bool.
_BOOL_ARGUMENTS = {op: (tuple((i, a.name) for i, a in enumerate(_schema(op).arguments)
                              if not a.kwarg_only and str(a.type) == "bool"),
                        frozenset(a.name for a in _schema(op).arguments if str(a.type) == "bool"))
                   for op in _INT_ARGUMENTS}


def _numpy_bool(value) -> bool:
    """A NumPy bool scalar (np.bool_; np.bool in NumPy 2), known without importing NumPy."""
    return type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool")


def _not_a_bool(value) -> bool:
    """value, given for a bool argument, is not a bool: a Python, NumPy or symbolic bool passes, and so does an int
    (its truth, as flags are often written) or a 0-dim bool or integer tensor; a float (0.5), None, a str, a
    floating tensor do not."""
    if isinstance(value, (bool, int, torch.SymBool)) or _numpy_bool(value):
        return False
    if isinstance(value, torch.Tensor):
        return value.dim() != 0 or value.is_floating_point() or value.is_complex()
    return True


# The dtypes of a tensor an int argument takes: a 0-dim one of these, as PyTorch's schema reads it (__index__).
_INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
                   torch.uint64)


# The int arguments whose value names a dtype (CANN's x_dtype: torch_npu passes a torch dtype, which the schema
# takes as its code): a torch.dtype is one of their values, and no other int argument's.
_DTYPE_CODE_ARGUMENTS = frozenset({"x_dtype"})

# PyTorch's other enum values, each of which its schema takes as its code for an int (k=torch.channels_last as
# 2, torch.strided as 0): never an int argument's value.
_TORCH_ENUMS = (torch.layout, torch.memory_format, torch.qscheme)


def _not_an_int(value, name: str = "") -> bool:
    """value, given for an int argument, is not an int that PyTorch's schema would pass on as it is, but one it
    would take as something else: a bool (Python, NumPy or torch: 1 or 0); a tensor other than a 0-dim integer
    one (a floating one truncated - 2.5 as 2 -, a single-element one of more dimensions unwrapped); in eager mode
    anything else it converts with __int__ for want of __index__ (a NumPy float array, a Decimal, a Fraction:
    truncated too); a torch.dtype, which it takes as its code (expert_num=torch.int64 as 4), unless the argument
    `name` names a dtype (_DTYPE_CODE_ARGUMENTS); a torch.layout, memory_format or qscheme (_TORCH_ENUMS), taken
    as its code too. An int or a SymInt is none, answered before any attribute is read
    (torch.compile traces that for a symbolic one too); what the schema refuses anyway (a str) is left to it.
    Under torch.compile a tensor's rank and dtype are constants, so the check runs at trace time without a graph
    break. Dynamo makes a NumPy value a tensor (reading its own dtype is "ndarray attribute access"): a floating
    or bool one is refused by its tensor's dtype, though not described (its repr is Dynamo's "repr() on
    tensor": fullgraph=True stops with that, and without it the frame runs eagerly with eager's message)."""
    if type(value) is bool:
        return True
    if value is None or isinstance(value, (int, torch.SymInt)):
        return False
    if isinstance(value, torch.dtype):
        return name not in _DTYPE_CODE_ARGUMENTS
    if isinstance(value, _TORCH_ENUMS):
        return True
    if isinstance(value, torch.Tensor):
        return value.dim() != 0 or value.dtype not in _INTEGER_DTYPES
    if torch.compiler.is_compiling():
        # Dynamo sees any NumPy value as an ndarray, whose dtype it reads only through a tensor of it. For a
        # SymInt argument (active_num) the schema took a floating one as its truncation.
        return (_numpy is not None and isinstance(value, _numpy.ndarray)
                and torch.as_tensor(value).dtype not in _INTEGER_DTYPES)
    if str(getattr(value, "dtype", "")) == "bool":  # a NumPy bool, whichever NumPy (older ones had __index__)
        return True
    try:
        operator.index(value)
        return False
    except TypeError:
        return hasattr(value, "__int__") and not isinstance(value, float)  # the schema refuses a float itself


def dtype_name(dtype: torch.dtype) -> str:
    """A dtype as error messages name it: "float32" for torch.float32."""
    return str(dtype).replace("torch.", "")


def not_an_int_error(function: str, name: str, value) -> ValueError:
    """The refusal of `value` for the int argument `name`, in one wording wherever it is refused: the operators
    (what _not_an_int finds, which PyTorch's schema would take as another int, and what the schema refuses), the
    ports' refuse_non_ints and check_int. A tensor - a bool one, a float one, one of more dimensions - is
    described by its rank and dtype (an int argument takes a 0-dim integer tensor); anything else by its repr
    (a torch enum's, _enum_text)."""
    if isinstance(value, torch.Tensor):
        return ValueError(f"{function}: {name} must be an int or a 0-dim integer tensor, got a {value.dim()}-D "
                          f"{dtype_name(value.dtype)} tensor")
    if isinstance(value, (torch.dtype, *_TORCH_ENUMS)):
        return ValueError(f"{function}: {name} must be an int, got {_enum_text(value)}")
    return ValueError(f"{function}: {name} must be an int, got {value!r}")


# Every torch.qscheme with its text: Dynamo neither repr's nor str's one while tracing, but compares it.
_QSCHEMES = tuple((value, str(value)) for value in dict.fromkeys(
    value for value in vars(torch).values() if isinstance(value, torch.qscheme)))


def _enum_text(value) -> str:
    """A torch.dtype, layout, memory_format or qscheme as its repr reads ("torch.channels_last"), eager and while
    tracing: Dynamo str's the first three (repr is not traceable for all of them) and only compares a qscheme."""
    if isinstance(value, torch.qscheme):
        return next(text for scheme, text in _QSCHEMES if scheme is value)
    return str(value)


def _refuse_non_int(op, args, kwargs):
    """A value given for an int argument that PyTorch's schema would take as another int (_not_an_int: a bool as
    1 or 0, k=torch.tensor(2.5) as 2) is a ValueError naming it, as the ports and the distributed layer refuse
    it. A bool argument still takes a bool. Under torch.compile too: a bool, and a tensor's rank and dtype, are
    constants while tracing, so the check runs at trace time (it reads only the constant _INT_ARGUMENTS) and adds
    nothing to the graph; the traced error carries this message."""
    function, positional, names = _INT_ARGUMENTS[op]
    for i, name in positional:
        if i < len(args) and _not_an_int(args[i], name):
            raise not_an_int_error(function, name, args[i])
    for name, value in kwargs.items():
        if name in names and _not_an_int(value, name):
            raise not_an_int_error(function, name, value)
    positional, names = _BOOL_ARGUMENTS[op]
    for i, name in positional:
        if i < len(args) and _not_a_bool(args[i]):
            raise ValueError(f"{function}: {name} must be a bool, got {args[i]!r}")
    for name, value in kwargs.items():
        if name in names and _not_a_bool(value):
            raise ValueError(f"{function}: {name} must be a bool, got {value!r}")


def _call(op, *args, **kwargs):
    """op(*args, **kwargs) for the out= overloads and for calls inside a torch.autograd.Function
    (_functional does this for the functional ones): a non-int for an int argument refused, then traced as it is
    under torch.compile, else _eager."""
    _refuse_non_int(op, args, kwargs)
    if torch.compiler.is_compiling():
        return op(*args, **kwargs)
    return _eager(op, *args, **kwargs)


def _eager(op, *args, **kwargs):
    """op(*args, **kwargs) outside torch.compile; a scalar of the wrong Python type, or an int
    outside int64, is a ValueError naming it (the check runs only after the schema refused the
    call, so it costs nothing otherwise)."""
    try:
        return op(*args, **kwargs)
    except RuntimeError as error:
        # Only the schema's refusal: the operators' own errors (NotImplementedError is a
        # RuntimeError) pass unchanged.
        refused = None
        if type(error) is RuntimeError and "must override the setup_context staticmethod" in str(error):
            refused = NotImplementedError(func_transform_error(_name(op)))
        elif type(error) is RuntimeError:
            # The schema's refusals, in whatever words PyTorch has for them ("Expected a value of type ...";
            # "tensor does not have a device" for None as a required tensor), or None where the schema takes
            # every argument (the error is then another one, and passes unchanged).
            refused = _schema_error(op, args, kwargs)
        elif type(error) is NotImplementedError and str(error).startswith("Could not run 'moe_routing::"):
            refused = _layout_error(op, args, kwargs)  # the dispatcher's: no kernel for that backend
        if refused is None:
            raise
    raise refused


def _layout_error(op, args, kwargs) -> Optional[ValueError]:
    """The ValueError for the first tensor argument that is not a dense (strided) tensor - sparse,
    MKL-DNN, quantized, nested - for which the dispatcher has no kernel of ours, or None."""
    schema, values = _bound_arguments(op, args, kwargs)
    for argument in schema.arguments:
        t = values.get(argument.name)
        kind = non_dense_kind(t) if isinstance(t, torch.Tensor) else None
        if kind is not None:
            return ValueError(f"{_name(op)}: {argument.name} must be a dense (strided) tensor, got a {kind} tensor")
    return None


def non_dense_kind(t: torch.Tensor) -> Optional[str]:
    """None for a dense (strided) tensor, else what it is: "sparse_coo", "mkldnn", "quantized", ..."""
    if t.is_nested:
        return "nested"
    if t.is_quantized:
        return "quantized"
    return None if t.layout == torch.strided else str(t.layout).replace("torch.", "").lstrip("_")


def func_transform_error(function: str) -> str:
    """The refusal of torch.func's differentiating transforms by `function`."""
    return (f"{function}: torch.func's differentiating transforms (grad, vjp, jacrev, jacfwd, jvp) are not supported, "
            "got an input they differentiate (PyTorch's autograd of custom operators cannot run under them); "
            "differentiate with torch.autograd (backward, torch.autograd.grad); torch.func.vmap is supported")


def _functional(op, *args, **kwargs):
    """op(*args, **kwargs), a functional call. Where grad mode is off or no tensor argument requires grad, and
    nothing traces or transforms the call (torch.compile; a torch.func transform, whose wrapped tensors hide
    requires_grad), it runs below the Autograd key: the Python-level autograd kernel that
    torch.library.register_autograd installs would only find nothing to record, at ~3.5 us per call - as much
    as a one-token call's whole kernel (docs/PERFORMANCE.md, "What a training step sees"). The refusal of
    forward-mode AD is the operators' own (their ADInplaceOrView kernel, which runs below the Autograd key too,
    and _autograd.refuse_forward_ad where autograd records the call)."""
    _refuse_non_int(op, args, kwargs)
    if torch.compiler.is_compiling():
        return op(*args, **kwargs)
    if (torch._C._functorch.peek_interpreter_stack() is not None
            or (torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args))):
        return _eager(op, *args, **kwargs)
    with torch._C._AutoDispatchBelowAutograd():
        return _eager(op, *args, **kwargs)


def moe_init_routing_grad(grad_expanded_x: torch.Tensor, expanded_row_idx: torch.Tensor, top_k: int,
                          drop_pad_mode: int = 0, active_num: Union[int, torch.SymInt] = 0, *,
                          numerics: str = "atlas_a2",
                          order: Optional[str] = None, out=None) -> torch.Tensor:
    """Backward of moe_init_routing: grad_x[i] = sum_t grad_expanded_x[expanded_row_idx[i*top_k + t]].

    Args:
        grad_expanded_x: gradient of expanded_x; float32/float16/bfloat16. [N*K, H] (dropless),
            [active_num, H] (active: drop_pad_mode=0, active_num>0) or [E, C, H] (drop_pad_mode=1).
        expanded_row_idx: int32 [N*K], the forward's output. -1 marks a dropped pair (skipped);
            in the active scenario values >= active_num are skipped too.
        top_k: K > 0.
        drop_pad_mode: 0 (dropless/active) or 1 (drop-pad).
        active_num: >= 0; with drop_pad_mode=0, > 0 selects the active scenario. An int or a SymInt.
        numerics: "atlas_a2" (default; Atlas A2/A3: the tree float32 order) or "ascend_950"
            (Ascend 950: the sequential order).
        order: None (the order numerics implies), or "tree" / "sequential" to override it.
        out: optional contiguous tensor of exactly grad_x's shape and dtype, on the inputs' device,
            to write into (no allocation; not differentiable; must not overlap an input).

    Returns:
        grad_x [N, H], dtype of grad_expanded_x (``out`` when given).

    Raises:
        ValueError: invalid arguments; IndexError: an expanded_row_idx value out of range.
    """
    if out is not None:
        _call(torch.ops.moe_routing.moe_init_routing_grad.out,
            grad_expanded_x, expanded_row_idx, top_k, drop_pad_mode, active_num, numerics=numerics,
            order=order, out=out)
        return out
    return _functional(torch.ops.moe_routing.moe_init_routing_grad, grad_expanded_x, expanded_row_idx, top_k,
                       drop_pad_mode, active_num, numerics=numerics, order=order)


def moe_init_routing_v2(x: torch.Tensor, expert_idx: torch.Tensor, active_num: Union[int, torch.SymInt] = 0,
                        expert_capacity: int = 0, expert_num: int = 0, drop_pad_mode: int = 0,
                        expert_tokens_count_or_cumsum_flag: int = 0,
                        expert_tokens_before_capacity_flag: bool = False, *, numerics: str = "atlas_a2"):
    """aclnnMoeInitRoutingV2 (torch_npu.npu_moe_init_routing_v2 semantics).

    Args:
        x: [N, H] float32/float16/bfloat16.
        expert_idx: [N, K] int32; ids >= 0 (and < expert_num when counts or drop-pad use it).
        active_num: 0 keeps all N*K sorted rows; A > 0 keeps the first min(A, N*K) (dropless). An
            int or a SymInt (torch.compile keeps it symbolic).
        expert_capacity: C, slots per expert (drop_pad_mode=1; 1 <= C <= N).
        expert_num: E (drop_pad_mode=1, or when counts are requested).
        drop_pad_mode: 0 dropless, 1 drop-pad.
        expert_tokens_count_or_cumsum_flag: 0 none, 1 inclusive cumsum, 2 count (dropless only).
        expert_tokens_before_capacity_flag: per-expert counts before capacity (drop-pad only).
        numerics: "atlas_a2" or "ascend_950": the forward is the same in both; autograd's backward
            sums in that device's order (see moe_init_routing_grad).

    Returns:
        (expanded_x, expanded_row_idx, expert_tokens_count_or_cumsum, expert_tokens_before_capacity):
        expanded_x [min(A, N*K) or N*K, H] (dropless) or [E, C, H] (drop-pad, unfilled slots 0);
        expanded_row_idx [N*K] int32 (pair p -> its row or slot; -1 when dropped for capacity);
        the two int32 [E] count tensors (zeros when not requested).
    """
    return _functional(
        torch.ops.moe_routing.moe_init_routing_v2, x, expert_idx, active_num, expert_capacity, expert_num, drop_pad_mode,
        expert_tokens_count_or_cumsum_flag, expert_tokens_before_capacity_flag, numerics=numerics)


def moe_init_routing(x: torch.Tensor, expert_idx: torch.Tensor, scale: Optional[torch.Tensor] = None,
                     offset: Optional[torch.Tensor] = None, topk_weight: Optional[torch.Tensor] = None,
                     active_num: Union[int, torch.SymInt] = -1, expert_capacity: int = -1, expert_num: int = -1,
                     drop_pad_mode: int = 0, expert_tokens_num_type: int = 0, expert_tokens_num_flag: bool = False,
                     quant_mode: int = -1, active_expert_range: Optional[List[int]] = None, row_idx_type: int = 0,
                     x_dtype: Optional[int] = None, *, numerics: str = "atlas_a2", out=None):
    """cann_ops_transformer.moe_init_routing (aclnnMoeInitRoutingV4 semantics), differentiable.

    The arguments up to x_dtype are CANN's, in CANN's order (positional or keyword).

    Args:
        x: [N, H] float32/float16/bfloat16 (int8 allowed with quant_mode=-1).
        expert_idx: [N, K] int32. Ids outside active_expert_range (e.g. -1) are not routed.
        scale: optional float32. quant_mode -1: [N] per-token scale gathered into expanded_scale;
            0: [1] static scale (required); 1: [end-start, H] or [1, H] smooth scale.
        offset: optional float32 [1], static quant only.
        topk_weight: optional float32 [N, K], gathered into expanded_topk_weight.
        active_num: -1/0 keep every routed pair; > 0 keep the first min(active_num, routed). An int
            or a SymInt (torch.compile keeps it symbolic, e.g. x.shape[0] * K).
        expert_capacity: C for drop_pad_mode=1.
        expert_num: E (required, >= 1).
        drop_pad_mode: 0 dropless ([N*K, H]), 1 drop-pad ([E, C, H]).
        expert_tokens_num_type: 0 cumsum, 1 count, 2 key_value ([E, 2]).
        expert_tokens_num_flag: produce expert_tokens_count_or_cumsum (zeros otherwise).
        quant_mode: -1 none, 0 static int8, 1 dynamic int8 (CANN's 2..17: NotImplementedError).
        active_expert_range: [start, end) of experts handled here, two ints (default
            [0, expert_num)).
        row_idx_type: 0 gather (pair -> row, -1 if not routed), 1 scatter (row -> pair).
        x_dtype: CANN's code for the real type of uint8-stored data (float4/hifloat8/int4, its
            quant modes 2..17); must be None here (NotImplementedError otherwise).
        numerics: "atlas_a2" (default; Atlas A2/A3) or "ascend_950" (Ascend 950): the
            quantisation arithmetic, and the accumulation order of autograd's backward.
        out: optional tuple of the five output tensors (contiguous, on the inputs' device,
            exactly the shapes and dtypes the call returns, overlapping no input) to write into;
            no allocation, not differentiable.

    Returns:
        (expanded_x, expanded_row_idx, expert_tokens_count_or_cumsum, expanded_scale,
        expanded_topk_weight). See docs/moe_init_routing.md for shapes.

    Autograd: x, scale (quant_mode -1) and topk_weight get gradients for every non-quantised
    configuration; a quantised forward raises NotImplementedError in backward.
    """
    if active_expert_range is not None:
        active_expert_range = _two_ints("moe_init_routing", "active_expert_range", active_expert_range)
    args = (x, expert_idx, scale, offset, topk_weight, active_num, expert_capacity, expert_num, drop_pad_mode,
            expert_tokens_num_type, expert_tokens_num_flag, quant_mode, active_expert_range, row_idx_type, x_dtype)
    if out is not None:
        names = ("expanded_x", "expanded_row_idx", "expert_tokens_count_or_cumsum", "expanded_scale",
                 "expanded_topk_weight")
        out = _out_tuple("moe_init_routing", out, names)
        _call(torch.ops.moe_routing.moe_init_routing.out, *args, numerics=numerics, **dict(zip(names, out)))
        return out
    return _functional(torch.ops.moe_routing.moe_init_routing, *args, numerics=numerics)


def moe_finalize_routing(expanded_x: torch.Tensor, expanded_row_idx: torch.Tensor,
                         x1: Optional[torch.Tensor] = None, x2: Optional[torch.Tensor] = None,
                         bias: Optional[torch.Tensor] = None, scales: Optional[torch.Tensor] = None,
                         expert_idx: Optional[torch.Tensor] = None, x: Optional[torch.Tensor] = None,
                         alpha1: Optional[torch.Tensor] = None, alpha2: Optional[torch.Tensor] = None,
                         v: Optional[torch.Tensor] = None, drop_pad_mode: Optional[int] = 0,
                         zero_expert_range: Optional[List[int]] = None, copy_expert_range: Optional[List[int]] = None,
                         constant_expert_range: Optional[List[int]] = None, k: Optional[int] = 1, *,
                         numerics: str = "atlas_a2", api: str = "v2", out=None) -> torch.Tensor:
    """cann_ops_transformer.moe_finalize_routing (aclnnMoeFinalizeRoutingV2/V3/V4), differentiable:
    out[i] = x1[i] + x2[i] + sum_t scales[i, t] * (expanded_x[row(i, t)] + bias[expert_idx[i, t]]).

    The arguments up to k are CANN's, in CANN's order (positional or keyword).

    Args:
        expanded_x: the experts' outputs, float32/float16/bfloat16; [R, H] (drop_pad_mode 0/2,
            R <= N*K) or [E, C, H] (1/3).
        expanded_row_idx: int32 [N*K], the row of expanded_x of each (token, choice) pair: at
            t*N + i (drop_pad_mode 0/1, column layout) or i*K + t (2/3, row layout: what
            moe_init_routing returns). -1 skips a pair; in modes 0/2 so does a value in [R, N*K).
        x1, x2: optional [N, H], dtype of expanded_x (shared expert / residual); x2 needs x1.
        bias: optional [E, H], dtype of expanded_x, added to each pair's row; needs expert_idx.
        scales: optional [N, K], dtype of expanded_x (or float32 with bfloat16); K = its size(1).
        expert_idx: optional int32 [N, K] (row-major in every mode), each pair's expert.
        x, alpha1, alpha2, v: V3/V4 special experts (x [N, H]; the others
            [constant range size, H]).
        drop_pad_mode: 0..3 (None: 0), the layout above.
        zero_expert_range, copy_expert_range, constant_expert_range: [start, end) (two ints) or
            None: pairs routed to a zero expert add nothing, a copy expert contributes x[i], a
            constant expert alpha1 * x[i] + alpha2 * v (docs/moe_finalize_routing.md).
        k: K when scales is None (None: 1); with scales, 1 or scales.size(1).
        numerics: "atlas_a2" (default; Atlas A2/A3: float16 accumulates in float16) or
            "ascend_950" (float32 accumulation for every dtype); autograd's backward follows it.
        api: "v2" (default; V2/V3/V4) or "v1" (aclnnMoeFinalizeRouting: drop_pad_mode 0 with x1,
            bias, scales and expert_idx required; bfloat16 rounded half away from zero under
            atlas_a2).
        out: optional contiguous [N, H] tensor of expanded_x's dtype on its device to write into
            (no allocation; not differentiable; must not overlap an input).

    Returns:
        out [N, H], dtype of expanded_x (``out`` when given).

    Raises:
        ValueError: invalid arguments; IndexError: an index or expert id out of range.

    Autograd: expanded_x, scales, x1, x2 and bias get gradients in every drop_pad_mode (see
    moe_finalize_routing_grad and docs/python.md); with a copy or constant expert range only
    expanded_x, x1 and x2 do (NotImplementedError for the others).
    """
    ranges = [None if r is None else _two_ints("moe_finalize_routing", name, r)
              for name, r in (("zero_expert_range", zero_expert_range), ("copy_expert_range", copy_expert_range),
                              ("constant_expert_range", constant_expert_range))]
    args = (expanded_x, expanded_row_idx, x1, x2, bias, scales, expert_idx, x, alpha1, alpha2, v, drop_pad_mode,
            *ranges, k)
    if out is not None:
        _call(torch.ops.moe_routing.moe_finalize_routing.out, *args, numerics=numerics, api=api, out=out)
        return out
    return _functional(torch.ops.moe_routing.moe_finalize_routing, *args, numerics=numerics, api=api)


def moe_finalize_routing_grad(grad_y: torch.Tensor, expanded_row_idx: torch.Tensor,
                              expanded_x: Optional[torch.Tensor] = None, scales: Optional[torch.Tensor] = None,
                              expert_idx: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                              drop_pad_mode: int = 0, active_num: Union[int, torch.SymInt] = 0,
                              expert_num: Union[int, torch.SymInt] = 0,
                              expert_capacity: Union[int, torch.SymInt] = 0, *, numerics: str = "atlas_a2",
                              grad_bias: bool = False, out=None):
    """cann_ops_transformer.moe_finalize_routing_grad (aclnnMoeFinalizeRoutingV2Grad).

    The arguments up to expert_capacity are CANN's, in CANN's order (positional or keyword).
    The index is in row layout (pair p = i*K + t at expanded_row_idx[p]) in both modes.

    Args:
        grad_y: [N, H] float32/float16/bfloat16, the gradient of the forward's out.
        expanded_row_idx: int32 [N*K]. -1 (and in mode 0 a value in [active_num, N*K)) marks a
            dropped pair: it gets no row and a zero grad_scales.
        expanded_x: optional, the forward's, of grad_expanded_x's shape; needed for grad_scales.
        scales: optional [N, K], dtype of grad_y (or float32 with bfloat16). Without it
            K = len(expanded_row_idx) / N and rows get grad_y itself.
        expert_idx, bias: optional, the forward's ([N, K] int32, [E, H]); bias needs expert_idx.
        drop_pad_mode: 0 (dropless: grad_expanded_x [N*K, H], or [active_num, H] when
            0 < active_num < N*K) or 1 (drop-pad: [expert_num, expert_capacity, H]).
        active_num, expert_num, expert_capacity: as above (ints or SymInts).
        numerics: "atlas_a2" (default) or "ascend_950": grad_scales' summation order.
        grad_bias: also return grad_bias (ours: CANN has none) [E, H], dtype of grad_y.
        out: optional tuple (grad_expanded_x, grad_scales[, grad_bias]) to write into (exactly the
            shapes returned; grad_scales may be None: not computed); no allocation, not
            differentiable, must not overlap an input or each other.

    Returns:
        (grad_expanded_x, grad_scales), or with grad_bias=True (grad_expanded_x, grad_scales,
        grad_bias). grad_scales is [N, K] of scales' dtype when scales and expanded_x are given,
        else an empty tensor; grad_bias is empty without bias. Formulas and orders:
        docs/moe_finalize_routing.md.

    Raises:
        ValueError: invalid arguments; IndexError: an index or expert id out of range.
    """
    function = "moe_finalize_routing_grad"
    if _not_a_bool(grad_bias):  # as _refuse_non_int checks the operators' own bool arguments
        raise ValueError(f"{function}: grad_bias must be a bool, got {grad_bias!r}")
    args = (grad_y, expanded_row_idx, expanded_x, scales, expert_idx, bias, drop_pad_mode, active_num, expert_num,
            expert_capacity)
    if out is not None:
        names = ("grad_expanded_x", "grad_scales", "grad_bias")[:3 if grad_bias else 2]
        out = _out_tuple(function, out, names, optional=names[1:])
        _call(torch.ops.moe_routing.moe_finalize_routing_grad.out,
            *args, numerics=numerics, grad_expanded_x=out[0], grad_scales=out[1],
            grad_bias=out[2] if grad_bias else None)
        return out
    try:
        results = _functional(torch.ops.moe_routing.moe_finalize_routing_grad, *args, numerics=numerics,
                              compute_grad_scales=True, compute_grad_bias=grad_bias)
    except ValueError as error:  # the schema's refusal names the operator's argument, not ours
        prefix = f"{function}: compute_grad_bias "
        if not str(error).startswith(prefix):
            raise
        raise ValueError(f"{function}: grad_bias {str(error)[len(prefix):]}") from None
    return results if grad_bias else results[:2]


def _out_tuple(function: str, out, names, optional=()) -> tuple:
    """out= given as a tuple (or list) of one tensor per name, in order; those in `optional` may be
    None (not computed). A tensor is not taken apart into its rows, nor anything else iterated."""
    if not isinstance(out, (tuple, list)) or len(out) != len(names):
        got = len(out) if isinstance(out, (tuple, list)) else type(out).__name__
        raise ValueError(f"{function}: out must be a tuple of {len(names)} tensors ({', '.join(names)}), got {got}")
    for name, t in zip(names, out):
        if not isinstance(t, torch.Tensor) and not (t is None and name in optional):
            raise ValueError(f"{function}: out {name} must be a tensor{' or None' if name in optional else ''}, got "
                             f"{'None' if t is None else type(t).__name__}")
    return tuple(out)


def _two_ints(op: str, name: str, values) -> list:
    """A list of two ints from any sequence of two integer values; floats and bools are refused rather than
    truncated or taken as 0 and 1 ([0.9, 2.9] is not [0, 2], [False, 4] is not [0, 4])."""
    result = None
    # An ordered sequence: a set's order is not its elements' ([3, 1] iterates as [1, 3]), and bytes or a str
    # are not a list of ints however they iterate.
    if not isinstance(values, (set, frozenset, dict, str, bytes, bytearray)):
        try:
            result = None if any(_not_an_int(v) for v in values) else [operator.index(v) for v in values]
        except TypeError:
            result = None
    if result is None or len(result) != 2:
        raise ValueError(f"{op}: {name} must be a list of two ints [start, end], got {values!r}")
    return result
