"""`make test-cuda-build` on a machine without nvcc (no CUDA toolkit) skips the CUDA build and its
tests with one line saying so, and succeeds. (Where nvcc exists, as here and in CI, `make test`
itself runs the other branch: the CUDA build and its tests.)"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cuda_build_without_nvcc_is_skipped_in_one_line(tmp_path):
    missing = tmp_path / "no-cuda" / "bin" / "nvcc"
    # This test runs under `make test`: the outer make's flags must not reach this one.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    result = subprocess.run(["make", "--no-print-directory", "test-cuda-build", f"NVCC={missing}"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        f"== make test-cuda-build: skipped, no nvcc at {missing}: the CUDA backend is neither "
        "built nor tested (install the CUDA toolkit or set NVCC=/path/to/nvcc)"]
    assert result.stderr == ""  # and no cmake command ran (make would have echoed it)

