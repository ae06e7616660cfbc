"""Shared pytest configuration: Hypothesis profiles.

``ci`` (the default): no deadline (CI machines are slow and shared), derandomized so a
run is reproducible, a moderate number of examples. ``dev``: more examples, random.
Select with ``HYPOTHESIS_PROFILE=dev``.
"""

import importlib.util
import os

from hypothesis import HealthCheck, settings

# Fix the Triton mode (compiled on CUDA, interpreter on CPU) before any test imports
# torch._dynamo or triton: a test module that imports ``_triton_interp`` only inside a test
# otherwise gets kernels that fail in the interpreter when torch._dynamo was imported first
# (seen with tests/test_nn.py before tests/test_padding_fast.py in one process).
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
