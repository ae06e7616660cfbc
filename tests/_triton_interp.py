"""Run the Triton-path modules compiled on a CUDA GPU, or in the Triton interpreter (CPU).

One test body for both modes (as JAX Pallas runs its kernel tests in interpret mode on
CPU): when a CUDA device is present (and ``PLSH_TRITON_INTERPRET`` is not ``1``) the
kernels are compiled and the tests' tensors are moved to the GPU by :func:`call`; otherwise
``TRITON_INTERPRET=1`` is set before any ``@triton.jit`` function is defined (Triton reads
it when the decorator runs) and the kernels run in the interpreter on CPU tensors. If the
modules of ``plsh_fast.triton`` were already imported in the other mode (for example by
another test module importing ``plsh_fast``), :func:`load` reloads them all. The GPU check
is therefore ``pytest -m triton`` on the GPU machine.
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

#: The modules of plsh_fast.triton in dependency order (each after what it imports).
_MODULES = tuple(
    f"plsh_fast.triton.{m}"
    for m in ("_tiling", "_memory", "_config", "_launch", "_forward", "_backward")
) + ("plsh_fast.triton",)
_KIND = "JITFunction" if COMPILED else "InterpretedFunction"


def _in_mode(module) -> bool:
    kernels = [
        v
        for v in vars(module).values()
        if type(v).__name__ in ("JITFunction", "InterpretedFunction")
    ]
    return all(type(v).__name__ == _KIND for v in kernels)


def load(name: str = "triton"):
    """Import ``plsh_fast.<name>`` (``"triton"``, or one of its modules such as
    ``"triton._launch"``) with kernels in this session's mode: if any module of the package
    was defined in the other mode, all of them are reloaded, in dependency order (so that
    every name a module imported from another is the reloaded one)."""
    loaded = [m for m in _MODULES if m in sys.modules]
    if any(not _in_mode(sys.modules[m]) for m in loaded):
        for m in loaded:
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


def tiles(head_dim, head_dim_v, dtype, num_samples=None, **changes):
    """The shipped ``TileConfig`` of :data:`DEVICE` (``plsh_fast.triton.tile_config``) with
    ``changes`` (``dataclasses.replace``). A changed ``block_n`` makes the dQ kernel's key
    tile ``block_n`` too unless ``dq_block_n`` is given (it must divide ``block_n``)."""
    config = load().tile_config(head_dim, head_dim_v, DEVICE, dtype, num_samples=num_samples)
    if "block_n" in changes:
        changes.setdefault("dq_block_n", None)
    return dataclasses.replace(config, **changes)


def record_plans(monkeypatch, module=None) -> list:
    """Replace ``module.make_plan`` (default: the launch code's, ``plsh_fast.triton._launch``,
    where both passes plan) by a wrapper recording the ``(query_positions, key_positions)``
    it is given (on the CPU); returns the (growing) list of pairs."""
    seen = []
    module = load("triton._launch") if module is None else module
    real = module.make_plan

    def recording(query_positions, key_positions, *args, **kwargs):
        seen.append((query_positions.cpu().clone(), key_positions.cpu().clone()))
        return real(query_positions, key_positions, *args, **kwargs)

    monkeypatch.setattr(module, "make_plan", recording)
    return seen
