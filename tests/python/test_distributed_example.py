"""examples/python/ep_moe.py launched the documented way, by torchrun: every rank's losses,
outputs and gradients equal the single-process layer's bit for bit (the script's exit status)."""
from __future__ import annotations

import os
import subprocess
import sys

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python", "ep_moe.py")


def test_torchrun_two_ranks_with_capacity():
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    result = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", EXAMPLE, "--steps", "2",
                             "--capacity", "5", "--tokens", "7,0"],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "equal the single-process run bit for bit" in result.stdout, result.stdout
