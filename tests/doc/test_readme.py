"""The README's Python examples run as written."""

import re

import _paths
import numpy as np

README = _paths.ROOT / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)  # noqa: S102
    # The fast path on the reference's partition is the reference's function.
    ref = namespace["approx"]
    out = namespace["plsh_attention"](
        *(namespace["torch"].from_numpy(namespace[x]) for x in ("q", "k", "v")),
        partition=namespace["partition"],
    )
    assert np.abs(out.numpy() - ref).max() < 1e-10
    assert namespace["qt"].grad is not None and namespace["qt"].grad.abs().sum() > 0
