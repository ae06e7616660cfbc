"""Load the Triton-path modules in the Triton interpreter (CPU) for the tests.

``TRITON_INTERPRET=1`` must be set before a ``@triton.jit`` function is defined: Triton
reads it when the decorator runs. This module sets it, and if ``plsh_fast.tiling`` /
``plsh_fast.triton_forward`` / ``plsh_fast.triton_backward`` were already imported in
compiled mode (for example by another test module importing ``plsh_fast``), reloads them so
that their kernels are interpreted. Nothing else in the process depends on the variable.
"""

from __future__ import annotations

import importlib
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("OMP_NUM_THREADS", "1")

_MODULES = ("plsh_fast.tiling", "plsh_fast.triton_forward", "plsh_fast.triton_backward")


def _interpreted(module) -> bool:
    kernels = [
        v
        for v in vars(module).values()
        if type(v).__name__ in ("JITFunction", "InterpretedFunction")
    ]
    return all(type(v).__name__ == "InterpretedFunction" for v in kernels)


def load(name: str):
    """Import ``plsh_fast.<name>`` with interpreted kernels (reloading stale modules)."""
    stale = [m for m in _MODULES if m in sys.modules and not _interpreted(sys.modules[m])]
    for m in _MODULES:  # dependency order: tiling first
        if m in stale:
            importlib.reload(sys.modules[m])
    return importlib.import_module(f"plsh_fast.{name}")


def record_plans(monkeypatch, module) -> list:
    """Replace ``module.make_plan`` by a wrapper recording the ``(query_positions,
    key_positions)`` it is given; returns the (growing) list of recorded pairs."""
    seen = []
    real = module.make_plan

    def recording(query_positions, key_positions, *args, **kwargs):
        seen.append((query_positions.clone(), key_positions.clone()))
        return real(query_positions, key_positions, *args, **kwargs)

    monkeypatch.setattr(module, "make_plan", recording)
    return seen
