"""The scripts around moe_routing.distributed: examples/python/ep_moe.py launched the documented way,
by torchrun (every rank's losses, outputs and gradients equal the single-process layer's bit for
bit: the script's exit status), and tools/gpu_check_ep.py on the CPU."""
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


def test_gpu_check_script_on_the_cpu():
    """tools/gpu_check_ep.py (run by tools/gpu_check.sh with NCCL on CUDA tensors) takes the
    same path with gloo on CPU tensors here, so that it cannot rot unseen."""
    script = os.path.join(os.path.dirname(EXAMPLE), "..", "..", "tools", "gpu_check_ep.py")
    result = subprocess.run([sys.executable, script, "--backend", "gloo", "--device", "cpu"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "8 of 8 scenarios bit for bit equal" in result.stdout, result.stdout


def test_ep_bench_runs_at_a_tiny_size():
    """bench/ep_bench.py end to end (its own bit-for-bit check against the single-device operators
    included) at a size that takes seconds; the timings themselves are not asserted."""
    script = os.path.join(os.path.dirname(EXAMPLE), "..", "..", "bench", "ep_bench.py")
    result = subprocess.run([sys.executable, script, "--hidden", "32", "--experts", "8", "--top-k", "2",
                             "--tokens", "0,16", "--runs", "1", "--warmup", "0", "--markdown"],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| 16 | 32 |" in result.stdout, result.stdout
