"""A tiny MoE layer trained for a few steps with our operators gives the same losses and
gradients as the same layer written with plain PyTorch indexing."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import tiny_moe  # noqa: E402


def test_training_matches_plain_pytorch_bitwise():
    # top-2: every token's sum (combine, and x's gradient) has two addends, and one IEEE addition
    # is commutative, so the plain layer's index_add order cannot change a bit: losses and
    # gradients must be identical, step after step.
    ours_losses, ours_grads = tiny_moe.train(True, steps=6, tokens=48)
    plain_losses, plain_grads = tiny_moe.train(False, steps=6, tokens=48)
    assert ours_losses[-1] < ours_losses[0]  # it learns
    assert ours_losses == plain_losses
    for step_a, step_b in zip(ours_grads, plain_grads):
        for a, b in zip(step_a, step_b):
            assert torch.equal(a, b)
            assert a.abs().sum() > 0


def test_example_script_runs():
    assert tiny_moe.main(["--steps", "3", "--tokens", "32"]) == 0
