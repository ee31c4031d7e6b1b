"""The core's limits reach the torch operators unchanged (issue 17, items 1 and 8): drop-pad slot
numbers beyond int32 are refused with the core's message (they wrapped to negative slots before),
and a call whose outputs are empty returns at once however many drop-pad slots it has. The binding adds nothing of its own for either: these hold the C++ checks
(tests/adversarial/cpp/test_int32_limits.cpp, test_scratch.cpp) through Python."""
import time

import pytest
import torch

import moe_routing

SLOTS = (r"expert_num \* expert_capacity must be at most 2147483647 \(drop-pad slots e\*C \+ c are "
         r"int32 expanded_row_idx values\), got 65537 \* 32768 = 2147516416")


@pytest.mark.parametrize("op", ["moe_init_routing_v2", "moe_init_routing"])
def test_drop_pad_slots_beyond_int32_are_refused(op):
    x = torch.zeros(32768, 0)
    idx = torch.full((32768, 1), 65536, dtype=torch.int32)
    with pytest.raises(ValueError, match=op + ": " + SLOTS):
        getattr(moe_routing, op)(x, idx, expert_num=65537, expert_capacity=32768, drop_pad_mode=1)


# moe_init_routing_v2 only: every output of this call is empty. (moe_init_routing returns
# expanded_scale and expanded_topk_weight [E*C] even when they are not produced - zeros of the
# planned shape, real outputs of E*C elements that cost their size.)
@pytest.mark.parametrize("capacity", [2 ** 28, 2 ** 31 - 1])
def test_empty_outputs_return_at_once(capacity):
    x = torch.zeros(0, 0)
    idx = torch.zeros(0, 2, dtype=torch.int32)
    start = time.monotonic()
    expanded_x, expanded_row_idx, counts, before_capacity = moe_routing.moe_init_routing_v2(
        x, idx, expert_num=1, expert_capacity=capacity, drop_pad_mode=1)
    elapsed = time.monotonic() - start
    assert expanded_x.shape == (1, capacity, 0) and expanded_row_idx.shape == (0,)
    assert counts.shape == (1,) and before_capacity.shape == (1,)
    assert elapsed < 1.0, f"{elapsed:.2f} s for empty outputs"


def test_combine_grad_drop_pad_shapes_with_a_zero_extent():
    # E*C = 0 fits int32 and the output is empty. [0, 2^62, 4] is no tensor's shape (its strides
    # overflow): the core accepted it and PyTorch failed allocating it (RuntimeError "Stride
    # calculation overflowed"); now the core refuses it (tests/adversarial/cpp/test_int32_limits.cpp).
    # [2^62, 0, 4] is an empty tensor like any other: the binding's byte count overflowed before it
    # reached the zero and refused it ("... at most 2^62 bytes").
    grad_y = torch.zeros(2, 4)
    idx = torch.full((2,), -1, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"moe_finalize_routing_grad: grad_expanded_x would have more than "
                                         r"2\^63 - 1 bytes per expert \(expert_capacity \* H\), got "
                                         r"4611686018427387904 \* 4"):
        moe_routing.moe_finalize_routing_grad(grad_y, idx, drop_pad_mode=1, expert_num=0, expert_capacity=2 ** 62)
    grad_expanded_x, grad_scales = moe_routing.moe_finalize_routing_grad(grad_y, idx, drop_pad_mode=1,
                                                                         expert_num=2 ** 62, expert_capacity=0)
    assert grad_expanded_x.shape == (2 ** 62, 0, 4) and grad_scales.shape == (0,)
    # So the backward of a drop-pad forward with such an empty expanded_x works as its forward does.
    expanded_x = torch.zeros(2 ** 62, 0, 4).requires_grad_()
    out = moe_routing.moe_finalize_routing(expanded_x, idx, drop_pad_mode=3)
    out.backward(torch.ones_like(out))
    assert torch.equal(out, torch.zeros(2, 4)) and expanded_x.grad.shape == (2 ** 62, 0, 4)


def test_an_output_beyond_the_binding_s_byte_limit_names_the_operator_and_the_output():
    # Between 2^62 and 2^63 - 1 bytes the core accepts a shape and the binding refuses to allocate it; its
    # message named its own helper ("new_cpu_output: the tensor must have at most 2^62 bytes").
    x = torch.empty(0, 2 ** 60 + 1)
    idx = torch.empty(0, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^moe_init_routing_v2: expanded_x must have at most 2\^62 bytes \(a CPU "
                                         r"tensor's limit here\), got float32 \[1, 1, 1152921504606846977\]$"):
        moe_routing.moe_init_routing_v2(x, idx, 0, 1, 1, 1)
