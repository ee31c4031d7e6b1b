"""README.md's golden-data block runs as written: every `moe-routing` command of it, in order, on small inputs
named as the block names them (x.npy [N, H], idx.npy [N, K] int32 expert ids, g.npy and ex.npy [N*K, H],
w.npy [N, K], gy.npy [N, H]; K = 2 as it says), exits 0 and writes what the next one reads. It once fed the
[N, K] expert ids to the commands that take the forward's expanded_row_idx, and every later command failed."""
import os
import re
import shlex
import subprocess

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CLI = os.environ.get("MOE_ROUTING_CLI", os.path.join(ROOT, "build", "moe-routing"))


def golden_block():
    """The commands of README.md's ```sh block that holds `golden init-routing-v2`, continuation lines joined."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    blocks = [b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "golden init-routing-v2" in b]
    assert len(blocks) == 1, "README.md: expected one sh block with the golden commands"
    joined = blocks[0].replace("\\\n", " ")
    return [shlex.split(line) for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_golden_block_runs_as_written(tmp_path):
    assert os.access(CLI, os.X_OK), f"{CLI} missing: `make build` first (or set MOE_ROUTING_CLI)"
    n, k, h, experts = 4, 2, 8, 8
    rng = np.random.default_rng(7)
    np.save(tmp_path / "x.npy", rng.standard_normal((n, h), dtype=np.float32))
    np.save(tmp_path / "idx.npy", rng.integers(0, experts, (n, k), dtype=np.int32))
    np.save(tmp_path / "g.npy", rng.standard_normal((n * k, h), dtype=np.float32))
    np.save(tmp_path / "ex.npy", rng.standard_normal((n * k, h), dtype=np.float32))
    np.save(tmp_path / "w.npy", rng.random((n, k), dtype=np.float32))
    np.save(tmp_path / "gy.npy", rng.standard_normal((n, h), dtype=np.float32))
    commands = golden_block()
    assert len(commands) >= 5 and all(c[0] == "build/moe-routing" for c in commands), commands
    for command in commands:
        done = subprocess.run([CLI, *command[1:]], cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, f"{shlex.join(command)}\n{done.stderr}"
    # What the block says it writes, with the shapes the operators give.
    assert np.load(tmp_path / "fwd" / "expanded_row_idx.npy").shape == (n * k,)
    assert np.load(tmp_path / "grad_x.npy").shape == (n, h)
    assert np.load(tmp_path / "out.npy").shape == (n, h)
    assert np.load(tmp_path / "bwd" / "grad_expanded_x.npy").shape == (n * k, h)
    assert np.load(tmp_path / "bwd" / "grad_scales.npy").shape == (n, k)
