"""The wheel as a user gets it: `pip wheel` builds moe_routing against the torch of the running
environment (the Makefile's .venv), and the wheel installs into a fresh virtual environment that
already has that torch - leaving torch exactly as it was - then imports and runs there. A plain
`pip install .` (pip's build isolation on) stops with the command to use instead, also without
touching torch."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from moe_routing import _version_check

ROOT = Path(__file__).resolve().parents[2]


def _run(args, *, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                            timeout=timeout)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(map(str, args))} exited {result.returncode}:\n"
                    f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built by `pip wheel` with this Python (its torch) in pyproject's build tree, the
    one `make python` uses: after that, nothing is recompiled."""
    out = tmp_path_factory.mktemp("wheelhouse")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
          "-w", out, ROOT], cwd=out)
    wheels = list(out.glob("moe_routing-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_is_for_any_python_and_declares_the_supported_torch_range(wheel):
    # No Python C API in the library: py3-none, one wheel for every Python torch runs on.
    assert re.fullmatch(r"moe_routing-0\.1\.0-py3-none-linux_[a-z0-9_]+\.whl", wheel.name)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read("moe_routing-0.1.0.dist-info/METADATA").decode()
        build = archive.read("moe_routing/_torch_build.py").decode()
    requires = re.findall(r"^Requires-Dist: (torch\S*)\s*$", metadata, re.M)
    assert len(requires) == 1
    specifiers = set(requires[0][len("torch"):].split(","))
    assert specifiers == set(_version_check.requirement()[len("torch"):].split(","))
    assert f'TORCH_VERSION = "{torch.__version__}"' in build
    assert "moe_routing/_moe_routing_ops.so" in names
    assert "moe_routing/_version_check.py" in names


def _torch_state(python: Path, cwd: Path) -> dict:
    """What a reinstall or replacement of torch would change: its version, where it is, its
    RECORD (every file with its hash), the inode and time of its largest library."""
    code = (
        "import hashlib, importlib.metadata as md, json, os, torch\n"
        "dist = md.distribution('torch')\n"
        "record = [f for f in dist.files if f.name == 'RECORD'][0]\n"
        "lib = os.path.join(os.path.dirname(torch.__file__), 'lib', 'libtorch_cpu.so')\n"
        "st = os.stat(lib)\n"
        "print(json.dumps({'version': torch.__version__, 'file': torch.__file__,\n"
        "  'record': str(dist.locate_file(record)),\n"
        "  'record_sha256': hashlib.sha256(record.read_text().encode()).hexdigest(),\n"
        "  'lib_inode': st.st_ino, 'lib_mtime_ns': st.st_mtime_ns}))\n")
    return json.loads(_run([python, "-c", code], cwd=cwd).stdout)


# Run in the fresh environment: the README's example, checked against what the operators mean
# (each pair's row of expanded_x is its token's row; per-expert counts; the backward sums the
# rows back), and that moe_routing came from that environment.
SMOKE = """
import sys, torch, moe_routing
from moe_routing.ops import moe_init_routing, moe_init_routing_grad
assert moe_routing.__file__.startswith(sys.prefix), (moe_routing.__file__, sys.prefix)
x = torch.randn(4, 8, requires_grad=True)
expert_idx = torch.tensor([[1, 0], [2, 1], [0, 2], [1, 2]], dtype=torch.int32)
expanded_x, expanded_row_idx, counts, _, _ = moe_init_routing(
    x, expert_idx, expert_num=3, expert_tokens_num_type=1, expert_tokens_num_flag=True)
for pair, row in enumerate(expanded_row_idx.tolist()):
    assert torch.equal(expanded_x[row], x[pair // 2].detach()), pair
assert counts.tolist() == [2, 3, 3], counts
expanded_x.sum().backward()
assert torch.equal(x.grad, moe_init_routing_grad(torch.ones(8, 8), expanded_row_idx, 2))
assert torch.equal(x.grad, torch.full((4, 8), 2.0))
print("moe_routing", moe_routing.__version__, "ran on torch", torch.__version__)
"""


def test_wheel_installs_beside_the_environments_torch_without_touching_it(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    # The environment already has torch: the release this wheel was built against, installed
    # the way the Makefile installs .venv's (from this machine's disk where it lies there).
    # (--no-compile: byte-compiling torch's thousands of modules took most of the test's time.)
    _run([python, "-m", "pip", "install", "-q", "--no-compile", f"torch=={torch.__version__}"],
         cwd=tmp_path)
    before = _torch_state(python, tmp_path)
    assert before["file"].startswith(str(venv))

    # A plain `pip install .` builds in pip's isolated environment, where there is no torch to
    # build against: it must stop, saying what to run, and install nothing.
    isolated = subprocess.run(
        [python, "-m", "pip", "install", "--no-compile", "-C",
         f"build-dir={tmp_path / 'isolated-build'}", ROOT],
        cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert isolated.returncode != 0
    output = " ".join((isolated.stdout + isolated.stderr).split())  # CMake wraps its messages
    assert "cannot import torch" in output, output[-4000:]
    assert "build without pip's build isolation, which hides that torch: pip install " \
        "--no-build-isolation ." in output, output[-4000:]
    assert _torch_state(python, tmp_path) == before

    # The wheel, with pip resolving its dependencies as a user's install would.
    log = _run([python, "-m", "pip", "install", wheel], cwd=tmp_path).stdout
    assert re.search(r"(?m)^Successfully installed moe[-_]routing-0\.1\.0$", log), log
    assert not re.search(r"(?i)uninstalling torch|installed .*\btorch-", log), log
    assert _torch_state(python, tmp_path) == before

    ran = _run([python, "-c", SMOKE], cwd=tmp_path).stdout
    assert f"moe_routing 0.1.0 ran on torch {torch.__version__}" in ran
