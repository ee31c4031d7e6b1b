"""The torch version checks of moe_routing/_version_check.py: the supported range, the torch the
operators were compiled against, the messages, that importing the package applies them before
the library loads, and that the build (the file run as a script) refuses what import refuses."""
from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from moe_routing import _version_check as vc

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "python" / "moe_routing" / "_version_check.py"


@pytest.mark.parametrize("version", ["2.12.0", "2.13.0+cpu", "2.14.1", "2.15.0", "2.15.2+cu130",
                                     "2.13.0a0+git1234abc"])
def test_supported_versions_pass(version):
    vc.check_supported(version)


@pytest.mark.parametrize("version", ["2.11.0", "2.16.0", "2.16.0.dev20261101+cpu", "1.13.1",
                                     "3.0.0"])
def test_unsupported_versions_say_what_is_required(version):
    with pytest.raises(ImportError) as error:
        vc.check_supported(version)
    assert str(error.value) == (
        f"moe_routing requires torch >= 2.12, < 2.16, got {version}; install a supported torch "
        "(pip install 'torch>=2.12,<2.16') and build moe_routing against it (pip install "
        "--no-build-isolation --force-reinstall --no-deps <moe_routing source tree>)")


def test_unreadable_version_is_an_import_error():
    with pytest.raises(ImportError, match=r"cannot read torch's version, got 'nightly'"):
        vc.check_supported("nightly")


def test_another_minor_release_than_built_with_is_refused():
    vc.check_built_with("2.13.1", "2.13.0+cpu")  # patch releases keep the ABI
    with pytest.raises(ImportError) as error:
        vc.check_built_with("2.14.1", "2.13.0+cpu")
    assert str(error.value).startswith(
        "moe_routing's operators were compiled against torch 2.13.0+cpu, got torch 2.14.1; a build "
        "loads only into the torch minor release it was compiled against: rebuild moe_routing "
        "against this torch (pip install --no-build-isolation")


def test_the_build_recorded_the_running_torch():
    from moe_routing._torch_build import TORCH_VERSION

    assert TORCH_VERSION == torch.__version__
    vc.check(torch.__version__)


def test_pyproject_declares_the_checked_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == [vc.requirement()] == ["torch>=2.12,<2.16"]
    # Building needs the environment's own torch, never one pip would install for the build.
    build_requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert not [r for r in build_requires if r.startswith("torch")]


def _python(code: str, *, path: Path | None = None, script: Path | None = None):
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = str(path)
    args = [sys.executable, str(script)] if script else [sys.executable, "-c", code]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=300,
                          cwd=path or Path.cwd())


def test_import_refuses_an_unsupported_torch_before_loading_the_library():
    # The check runs before torch.ops.load_library: with a torch that claims 2.11, importing the
    # package fails with the message and no operator got registered.
    result = _python(
        "import torch\n"
        "torch.__version__ = '2.11.0'\n"
        "try:\n"
        "    import moe_routing\n"
        "except ImportError as e:\n"
        "    print('ImportError:', e)\n"
        "print('registered:', hasattr(torch.ops.moe_routing, 'moe_init_routing'))\n")
    assert result.returncode == 0, result.stderr
    assert "ImportError: moe_routing requires torch >= 2.12, < 2.16, got 2.11.0;" in result.stdout
    assert "registered: False" in result.stdout


def test_import_refuses_another_minor_release_than_built_with():
    other = next(f"2.{minor}.0" for minor in range(12, 16)
                 if (2, minor) != vc.minor_release(torch.__version__))
    result = _python(
        "import torch\n"
        f"torch.__version__ = '{other}'\n"
        "import moe_routing\n")
    assert result.returncode != 0
    assert (f"ImportError: moe_routing's operators were compiled against torch "
            f"{torch.__version__}, got torch {other};") in result.stderr


def test_build_check_prints_what_the_build_needs():
    result = _python("", script=SCRIPT)
    assert result.returncode == 0, result.stderr
    lines = [line.split("=", 1) for line in result.stdout.splitlines()]
    assert [key for key, _ in lines] == ["version", "include", "include", "libdir", "cxx11_abi"]
    values = dict(lines)
    assert values["version"] == torch.__version__
    assert Path(lines[1][1], "torch", "library.h").is_file()
    assert Path(lines[2][1], "torch", "torch.h").is_file()
    assert Path(values["libdir"], "libtorch_cpu.so").is_file()
    assert values["cxx11_abi"] == str(int(torch._C._GLIBCXX_USE_CXX11_ABI))


def _fake_torch(tmp_path: Path, version: str | None) -> Path:
    """A directory whose `torch` is a stand-in of that version (None: no torch importable)."""
    package = tmp_path / "torch"
    package.mkdir()
    if version is None:
        (package / "__init__.py").write_text("raise ImportError('No module named torch')\n")
    else:
        (package / "__init__.py").write_text(f"__version__ = {version!r}\n")
    return tmp_path


def test_build_check_refuses_an_unsupported_torch(tmp_path):
    result = _python("", script=SCRIPT, path=_fake_torch(tmp_path, "2.11.0"))
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("moe_routing requires torch >= 2.12, < 2.16, got 2.11.0;")


def test_build_check_without_torch_names_the_command(tmp_path):
    result = _python("", script=SCRIPT, path=_fake_torch(tmp_path, None))
    assert result.returncode == 1 and result.stdout == ""
    assert "cannot import torch" in result.stderr
    assert result.stderr.rstrip().endswith("pip install --no-build-isolation .")
