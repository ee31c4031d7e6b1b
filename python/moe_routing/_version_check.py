"""The torch releases moe_routing supports, checked before its compiled operators load.

The operators are C++ compiled against torch's C++ API, which keeps no binary compatibility
between minor releases (docs/python.md, "Which torch"): a build loads only into the torch minor
release it was compiled with. So importing moe_routing checks first, with a message saying what to
do, that the running torch is (1) in the supported range and (2) the minor release the extension
was compiled against (recorded by the build in _torch_build.py) - instead of an undefined-symbol
error from the dynamic loader, or a crash. Run as a script (python/CMakeLists.txt does, with the
build's Python), it applies (1) to the torch that Python imports, so that an unsupported torch is
refused before anything is compiled, and prints what the build needs of that torch.

This file imports nothing of the package and nothing but the standard library at module level,
so the build can run it from the source tree.
"""
from __future__ import annotations

import re
import sys

# The supported torch minor releases: [TORCH_MIN, TORCH_END). pyproject.toml's dependency on
# torch says the same (tests/python/test_version_check.py keeps the two equal).
TORCH_MIN = (2, 12)
TORCH_END = (2, 16)

# What rebuilds the extension against the torch of the current environment, from a source tree.
REBUILD = "pip install --no-build-isolation --force-reinstall --no-deps <moe_routing source tree>"


def _text(minor: tuple[int, int]) -> str:
    return f"{minor[0]}.{minor[1]}"


def requirement() -> str:
    """The supported range as a pip requirement, e.g. `torch>=2.12,<2.16`."""
    return f"torch>={_text(TORCH_MIN)},<{_text(TORCH_END)}"


def minor_release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string: 2.13.0, 2.13.0+cpu, 2.14.0a0+git1234abc."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ImportError(f"moe_routing cannot read torch's version, got {version!r}")
    return int(match.group(1)), int(match.group(2))


def check_supported(version: str) -> None:
    """Raises ImportError unless torch `version` is in [TORCH_MIN, TORCH_END)."""
    if TORCH_MIN <= minor_release(version) < TORCH_END:
        return
    raise ImportError(
        f"moe_routing requires torch >= {_text(TORCH_MIN)}, < {_text(TORCH_END)}, got {version}; "
        f"install a supported torch (pip install '{requirement()}') and build moe_routing "
        f"against it ({REBUILD})")


def check_built_with(version: str, built_with: str) -> None:
    """Raises ImportError unless torch `version` is the minor release the extension was compiled
    against (`built_with`); patch releases of one minor release keep the C++ ABI."""
    if minor_release(version) == minor_release(built_with):
        return
    raise ImportError(
        f"moe_routing's operators were compiled against torch {built_with}, got torch {version}; "
        f"a build loads only into the torch minor release it was compiled against: rebuild "
        f"moe_routing against this torch ({REBUILD})")


def check(version: str) -> None:
    """Both checks for the running torch `version`, before the operators load."""
    check_supported(version)
    try:
        from ._torch_build import TORCH_VERSION
    except ImportError as error:
        raise ImportError(
            "moe_routing is incomplete: _torch_build.py, written by the build next to the compiled "
            f"operators, is missing; reinstall it ({REBUILD})") from error
    check_built_with(version, TORCH_VERSION)


def _main() -> int:
    """The build's check. Prints what the build needs of this Python's torch, one `key=value` a
    line - version, include (each include directory), libdir, cxx11_abi - or, on stderr, why it
    cannot be built against (exit status 1). These are torch's own compile and link settings for
    C++ extensions (torch.utils.cpp_extension's, which imports setuptools, so not used here);
    CMake's find_package(Torch) is not used because with a CUDA build of torch it requires the
    CUDA toolkit, which the CPU operators do not need."""
    try:
        import torch
    except ImportError as error:
        print(
            f"{sys.executable} cannot import torch ({error}). moe_routing's operators are compiled "
            "against the torch of the environment they are installed into, so install torch there "
            f"first (pip install '{requirement()}') and build without pip's build isolation, "
            "which hides that torch: pip install --no-build-isolation .",
            file=sys.stderr)
        return 1
    try:
        check_supported(torch.__version__)
    except ImportError as error:
        print(error, file=sys.stderr)
        return 1
    import os

    root = os.path.dirname(os.path.abspath(torch.__file__))
    include = os.path.join(root, "include")
    print(f"version={torch.__version__}")
    print(f"include={include}")
    print(f"include={os.path.join(include, 'torch', 'csrc', 'api', 'include')}")
    print(f"libdir={os.path.join(root, 'lib')}")
    print(f"cxx11_abi={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
