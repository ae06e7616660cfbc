"""Every script in examples/ runs at its tiny size, and examples/README.md lists it.

Each script runs in its own subprocess (``PLSH_EXAMPLE_TINY=1``, the repository root as the
working directory and first on ``PYTHONPATH``), as a user would run it; ``test_my_kernel.py``
is a pytest file and runs under pytest. The scripts check their own results (``assert``):
a non-zero exit status fails the test with the script's output.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import _paths
import pytest

EXAMPLES = _paths.ROOT / "examples"
#: per script: generous wall-clock limit on the shared CI machine (seconds)
TIMEOUT_S = 300


def _scripts() -> list[str]:
    return sorted(p.name for p in EXAMPLES.glob("*.py"))


def _run(args: list[str]) -> subprocess.CompletedProcess:
    # every DeprecationWarning shown, whichever module it is attributed to (by default only
    # those of __main__ are): test_example_runs greps the project's out of the output
    env = dict(
        os.environ,
        PLSH_EXAMPLE_TINY="1",
        MPLBACKEND="Agg",
        PYTHONWARNINGS="default::DeprecationWarning",
    )
    env["PYTHONPATH"] = os.pathsep.join(
        [str(_paths.ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    return subprocess.run(
        [sys.executable, *args],
        cwd=_paths.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def _needs(script: str) -> None:
    pytest.importorskip("torch")
    if script == "finetune_hf.py":
        pytest.importorskip("transformers")


def test_examples_exist_and_are_listed():
    scripts = _scripts()
    assert len(scripts) >= 5
    readme = (EXAMPLES / "README.md").read_text()
    listed = set(re.findall(r"`([\w]+\.py)`", readme))
    assert listed == set(scripts), (listed, scripts)


@pytest.mark.parametrize("script", _scripts())
def test_example_has_docstring_saying_how_to_run(script):
    source = (EXAMPLES / script).read_text()
    assert source.startswith('"""'), script
    docstring = source.split('"""')[1]
    assert "Run" in docstring and f"examples/{script}" in docstring, script


@pytest.mark.parametrize("script", _scripts())
def test_example_runs(script):
    _needs(script)
    if script.startswith("test_"):
        args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", f"examples/{script}"]
    else:
        args = [f"examples/{script}"]
    result = _run(args)
    assert result.returncode == 0, result.stdout + result.stderr
    # the scripts use the current spellings: a deprecated one warns (plsh_ref.validation)
    output = (result.stdout + result.stderr).splitlines()
    deprecated = [line for line in output if "deprecated and will be removed in the next" in line]
    assert not deprecated, deprecated
    if script.startswith("test_"):
        # the kernel author's file ran its tests (not "no tests ran")
        assert re.search(r"\b4 passed\b", result.stdout), result.stdout
