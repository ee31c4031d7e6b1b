"""A tiny MoE layer trained for a few steps with our operators gives the same losses and
gradients as the same layer written with plain PyTorch indexing."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import tiny_moe  # noqa: E402


def test_training_matches_plain_pytorch():
    ours_losses, ours_grads = tiny_moe.train(True, steps=6, tokens=48)
    plain_losses, plain_grads = tiny_moe.train(False, steps=6, tokens=48)
    assert ours_losses[-1] < ours_losses[0]  # it learns
    for a, b in zip(ours_losses, plain_losses):
        assert abs(a - b) <= 1e-6 * max(1.0, abs(b))
    for step_a, step_b in zip(ours_grads, plain_grads):
        for a, b in zip(step_a, step_b):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            assert a.abs().sum() > 0


def test_example_script_runs():
    assert tiny_moe.main(["--steps", "3", "--tokens", "32"]) == 0
