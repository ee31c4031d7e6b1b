"""What a call compiled with torch.compile(fullgraph=True) raises when our Python code refuses an argument."""
from __future__ import annotations

import pytest
import torch

# moe_init_routing's int arguments (also torch_npu's npu_moe_init_routing_v2's) and the bool each bool-for-int
# case gives for it.
MOE_INIT_ROUTING_INT_ARGUMENTS = (("active_num", True), ("expert_capacity", True), ("expert_num", True),
                                  ("drop_pad_mode", False), ("expert_tokens_num_type", True), ("quant_mode", False),
                                  ("row_idx_type", True), ("x_dtype", False))


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
