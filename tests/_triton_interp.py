"""Run the Triton-path modules compiled on a CUDA GPU, or in the Triton interpreter (CPU).

One test body for both modes (as JAX Pallas runs its kernel tests in interpret mode on
CPU): when a CUDA device is present (and ``PLSH_TRITON_INTERPRET`` is not ``1``) the
kernels are compiled and the tests' tensors are moved to the GPU by :func:`call`; otherwise
``TRITON_INTERPRET=1`` is set before any ``@triton.jit`` function is defined (Triton reads
it when the decorator runs) and the kernels run in the interpreter on CPU tensors. If
``plsh_fast.tiling`` / ``triton_forward`` / ``triton_backward`` were already imported in the
other mode (for example by another test module importing ``plsh_fast``), :func:`load`
reloads them. The GPU check is therefore ``pytest -m triton`` on the GPU machine.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys

import torch

COMPILED = torch.cuda.is_available() and os.environ.get("PLSH_TRITON_INTERPRET") != "1"
MODE = "compiled" if COMPILED else "interpreted"
DEVICE = torch.device("cuda") if COMPILED else torch.device("cpu")

if COMPILED:
    os.environ.pop("TRITON_INTERPRET", None)
else:
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ.setdefault("OMP_NUM_THREADS", "1")

_MODULES = ("plsh_fast.tiling", "plsh_fast.triton_forward", "plsh_fast.triton_backward")
_KIND = "JITFunction" if COMPILED else "InterpretedFunction"


def _in_mode(module) -> bool:
    kernels = [
        v
        for v in vars(module).values()
        if type(v).__name__ in ("JITFunction", "InterpretedFunction")
    ]
    return all(type(v).__name__ == _KIND for v in kernels)


def load(name: str):
    """Import ``plsh_fast.<name>`` with kernels in this session's mode (reloading stale ones)."""
    stale = [m for m in _MODULES if m in sys.modules and not _in_mode(sys.modules[m])]
    for m in _MODULES:  # dependency order: tiling first
        if m in stale:
            importlib.reload(sys.modules[m])
    return importlib.import_module(f"plsh_fast.{name}")


def _move(x, device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, tuple):
        return tuple(_move(y, device) for y in x)
    if isinstance(x, list):
        return [_move(y, device) for y in x]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(
            x, **{f.name: _move(getattr(x, f.name), device) for f in dataclasses.fields(x)}
        )
    return x


def call(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with every tensor (also inside tuples and dataclasses such as a
    ``TilePlan``) moved to :data:`DEVICE`; the result is moved back to the CPU."""
    out = fn(*_move(args, DEVICE), **{k: _move(v, DEVICE) for k, v in kwargs.items()})
    return _move(out, torch.device("cpu"))


def record_plans(monkeypatch, module) -> list:
    """Replace ``module.make_plan`` by a wrapper recording the ``(query_positions,
    key_positions)`` it is given (on the CPU); returns the (growing) list of pairs."""
    seen = []
    real = module.make_plan

    def recording(query_positions, key_positions, *args, **kwargs):
        seen.append((query_positions.cpu().clone(), key_positions.cpu().clone()))
        return real(query_positions, key_positions, *args, **kwargs)

    monkeypatch.setattr(module, "make_plan", recording)
    return seen
