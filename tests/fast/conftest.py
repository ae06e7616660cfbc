"""tests/fast exercise the tiled paths: ``backend="auto"`` does not take the dense one here.

Below ``plsh_fast.dense.DENSE_CROSSOVER`` the default backend computes PLSH densely, and
nearly every problem in these tests is that short: without this fixture they would test
the dense path instead of the CPU/Triton kernels they were written for. Tests of the dense
path and of the dispatch (``test_dense_plsh.py``) put the shipped crossover back.
"""

import sys

import pytest


@pytest.fixture(autouse=True)
def _tiled_paths_only(monkeypatch):
    dense = sys.modules.get("plsh_fast.dense")
    if dense is not None:
        monkeypatch.setattr(dense, "DENSE_CROSSOVER", {})
    yield


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test: tiny kernels run several times slower when two
    threads wait on each other on a machine with more processes than cores (the 300-step ring
    decodes of test_decoding.py: 12 s instead of 0.7 s when they were written); results do not
    depend on it."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
