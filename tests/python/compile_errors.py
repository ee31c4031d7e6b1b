"""What a call compiled with torch.compile(fullgraph=True) raises when our Python code refuses an argument."""
from __future__ import annotations

import pytest
import torch

# moe_init_routing's int arguments (also torch_npu's npu_moe_init_routing_v2's) and the bool each bool-for-int
# case gives for it.
MOE_INIT_ROUTING_INT_ARGUMENTS = (("active_num", True), ("expert_capacity", True), ("expert_num", True),
                                  ("drop_pad_mode", False), ("expert_tokens_num_type", True), ("quant_mode", False),
                                  ("row_idx_type", True), ("x_dtype", False))

# Tensors for an int argument that PyTorch's schema took as another int (a floating one as its truncation,
# torch.tensor(2.5) as 2; a complex one or a bool one; a single-element one of more dimensions as its element),
# and their ids: every int argument refuses each, eager and compiled. A 0-dim integer tensor is an int.
NON_INT_TENSORS = (torch.tensor(2.5), torch.tensor(2.5, dtype=torch.float64), torch.tensor(2.5 + 0j),
                   torch.tensor(True), torch.tensor([2]))
NON_INT_TENSOR_IDS = ("float32", "float64", "complex64", "bool", "1d_int64")

# PyTorch's enum values, each of which its schema took as its code for an int (torch.int64 as 4,
# torch.channels_last as 2, torch.strided as 0, torch.per_channel_affine as 2), and their ids: every int argument
# refuses each, eager and compiled, except a dtype for x_dtype (which names one).
TORCH_ENUM_VALUES = (torch.int64, torch.channels_last, torch.strided, torch.per_channel_affine)
TORCH_ENUM_IDS = ("dtype", "memory_format", "layout", "qscheme")


def non_int_tensor_message(function: str, argument: str, tensor: torch.Tensor) -> str:
    """The refusal of tensor (one of NON_INT_TENSORS) for the int argument of function."""
    return (f"{function}: {argument} must be an int or a 0-dim integer tensor, got a {tensor.dim()}-D "
            f"{str(tensor.dtype).replace('torch.', '')} tensor")


def outcome(call):
    """What call() gives: ("returned", its tensors, flattened) or ("raised", type, message)."""
    try:
        result = call()
    except Exception as error:  # noqa: BLE001 - the type and message are what is compared
        return "raised", type(error), str(error)
    flat = result if isinstance(result, (tuple, list)) else (result,)
    return "returned", [t for t in flat if t is not None]


def same_outcome(a, b) -> bool:
    """Two outcome()s are one: equal tensors, or the same exception type and message."""
    if a[0] != b[0] or a[0] == "raised":
        return a == b
    return len(a[1]) == len(b[1]) and all(torch.equal(s, t) for s, t in zip(a[1], b[1]))


def assert_compiled_raises_value_error(message: str, fn, *args) -> None:
    """torch.compile(fn, fullgraph=True)(*args) stops at trace time with ValueError(message). Raised by our
    code while Dynamo traces it, the error reaches the caller as Dynamo's Unsupported ("Observed exception")
    carrying ValueError('<message>'), as any Python raise in a fullgraph trace does (without fullgraph Dynamo
    runs the frame eagerly and the ValueError itself comes out); the ValueError itself is taken too, should a
    PyTorch release pass it on as it is."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    with pytest.raises(Exception) as info:
        compiled(*args)
    error = info.value
    if type(error) is ValueError:
        assert str(error) == message
    else:
        assert isinstance(error, torch._dynamo.exc.TorchDynamoException), repr(error)
        assert f"ValueError({message!r})" in str(error), str(error)
