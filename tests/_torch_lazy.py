"""Take torch's lazy imports when a test module is imported, not in its first test.

``torch.testing.assert_close`` imports ``torch.distributed.tensor`` and
``torch.broadcast_shapes`` (called by ``plsh_fast.dense.dense_counts``) imports ``torch.fx``
and sympy on first use, 1-3 s each. The mutation runner (``mutation/run.py``) forks each
mutant's tests from a process that imported the test modules: imports taken there are paid
once, imports taken in a test are paid by every mutant (and counted in its time limit).
"""

import torch


def take_lazy_imports() -> None:
    torch.testing.assert_close(torch.zeros(1), torch.zeros(1))
    torch.broadcast_shapes((1,), (2,))
