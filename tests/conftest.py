"""Shared pytest configuration: Hypothesis profiles; no CPU plan kept across tests.

``ci`` (the default): no deadline (CI machines are slow and shared), derandomized so a
run is reproducible, a moderate number of examples. ``dev``: more examples, random.
Select with ``HYPOTHESIS_PROFILE=dev``.
"""

import importlib.util
import os
import sys

import pytest
from hypothesis import HealthCheck, settings

# Fix the Triton mode (compiled on CUDA, interpreter on CPU) before any test imports
# torch._dynamo or triton: a test module that imports ``_triton_interp`` only inside a test
# otherwise gets kernels that fail in the interpreter when torch._dynamo was imported first
# (seen with tests/fast/test_nn.py before tests/fast/test_padding_fast.py in one process).
if importlib.util.find_spec("torch") is not None and importlib.util.find_spec("triton"):
    import _triton_interp  # noqa: F401

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=25,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=200)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _no_kept_cpu_plans():
    """Every test starts without plans kept by the CPU path (``plsh_fast.cpu``
    ``PLAN_CACHE_BYTES``), so that a test that patches the planner or the chunk builder
    sees them run. Torch-free tests do not import torch for it."""
    cpu = sys.modules.get("plsh_fast.cpu")
    if cpu is not None:
        cpu.clear_plan_cache()
