"""Loads the compiled operator library next to this file (registers torch.ops.moe_routing.*)."""
from __future__ import annotations

import glob
import os

import torch

from . import _version_check

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load() -> str:
    # Before the library: a torch it cannot load into gets a message saying what to do, not an
    # undefined-symbol error from the dynamic loader.
    _version_check.check(torch.__version__)
    candidates = sorted(glob.glob(os.path.join(_HERE, "_moe_routing_ops*.so")))
    if not candidates:
        raise ImportError(
            "moe_routing: the compiled operator library _moe_routing_ops.so is missing next to "
            f"{_HERE}; install the package with `pip install --no-build-isolation .` (see README)"
        )
    torch.ops.load_library(candidates[0])
    return candidates[0]


LIBRARY_PATH = _load()
