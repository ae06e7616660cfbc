"""Save the CPU path's outputs on the fixed problems of ``tests/_cpu_problems.py``.

``python tests/fast/cpu/data/save_cpu_outputs.py`` (repository root on ``PYTHONPATH``)
writes ``cpu_saved_outputs.npz`` next to this file: for every ``(case, variant)`` of
``SAVED_RUNS`` and dtype of ``SAVED_DTYPES``, the forward ``out``/``lse`` and the three
gradients, plus the torch version and ``torch.backends.cpu.get_cpu_capability()`` of the
machine (bit equality is only expected on the same kernels), whether the fused tile
operator and per-thread limits were available. Run it only to record a deliberate change
of the CPU path's numerics, and say so in the commit; ``test_cpu_saved_outputs.py`` checks
the current code against the file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # tests/: the shared test helpers

import _cpu_problems as P  # noqa: E402

import plsh_fast.cpu as cpu  # noqa: E402


def run(case: str, variant: str, dtype: str) -> dict:
    """The outputs of one saved run under its settings (restored afterwards)."""
    settings = dict(P.SAVED_VARIANTS[variant])
    threads = settings.pop("threads", 1)
    saved = {name: getattr(cpu, name) for name in settings}
    previous = torch.get_num_threads()
    try:
        for name, value in settings.items():
            setattr(cpu, name, value)
        torch.set_num_threads(threads)
        cpu.clear_plan_cache()
        return P.cpu_outputs(P.saved_problem(case, dtype), cpu)
    finally:
        torch.set_num_threads(previous)
        for name, value in saved.items():
            setattr(cpu, name, value)
        cpu.clear_plan_cache()


def main() -> None:
    arrays = {}
    for case, variant in P.SAVED_RUNS:
        for dtype in P.SAVED_DTYPES:
            for field, value in run(case, variant, dtype).items():
                arrays[f"{case}/{variant}/{dtype}/{field}"] = value
    machine = {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "fused_tiles": cpu.fused_tiles_available(),
        "per_thread_limits": cpu.per_thread_limits_available(),
    }
    arrays["machine"] = np.array(json.dumps(machine, sort_keys=True))
    path = HERE / "cpu_saved_outputs.npz"
    np.savez_compressed(path, **arrays)
    print(f"{path}: {path.stat().st_size} bytes, {len(arrays) - 1} arrays, {machine}")


if __name__ == "__main__":
    main()
