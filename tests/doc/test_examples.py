"""Every script in examples/ runs at its tiny size, and examples/README.md lists it.

Each script runs in its own subprocess (``PLSH_EXAMPLE_TINY=1``, the repository root as the
working directory and first on ``PYTHONPATH``), as a user would run it; ``test_my_kernel.py``
is a pytest file and runs under pytest, reproducibly: a fixed Hypothesis seed and an empty
example database of its own (:func:`_pytest_args`, :func:`_run`), so a CI failure replays
exactly. The scripts check their own results (``assert``): a non-zero exit status fails the
test with the script's output.
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


#: the Hypothesis seed of the example pytest run (reproducible draws)
HYPOTHESIS_SEED = 0


def _pytest_args(path: str) -> list[str]:
    """The command line of a pytest example file: fixed seed, no cache."""
    return [
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--hypothesis-seed={HYPOTHESIS_SEED}",
        path,
    ]


def _run(args: list[str], storage: str | None = None) -> subprocess.CompletedProcess:
    """Run ``python *args`` in the repository root; ``storage``: Hypothesis's directory (its
    example database; a fresh one replays nothing from earlier runs). Every
    DeprecationWarning is shown, whichever module it is attributed to (by default only
    those of __main__ are): test_example_runs greps the project's out of the output."""
    env = dict(
        os.environ,
        PLSH_EXAMPLE_TINY="1",
        MPLBACKEND="Agg",
        PYTHONWARNINGS="default::DeprecationWarning",
    )
    if storage is not None:
        env["HYPOTHESIS_STORAGE_DIRECTORY"] = storage
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
def test_example_runs(script, tmp_path):
    _needs(script)
    if script.startswith("test_"):
        args = _pytest_args(f"examples/{script}")
    else:
        args = [f"examples/{script}"]
    result = _run(args, storage=str(tmp_path / "hypothesis"))
    assert result.returncode == 0, result.stdout + result.stderr
    # the scripts use the current spellings: a deprecated one warns (plsh_ref.validation)
    output = (result.stdout + result.stderr).splitlines()
    deprecated = [line for line in output if "deprecated and will be removed in the next" in line]
    assert not deprecated, deprecated
    if script.startswith("test_"):
        # the kernel author's file ran its tests (not "no tests ran")
        assert re.search(r"\b4 passed\b", result.stdout), result.stdout


_PROBE = """
import os

from plsh_ref.testing import make_property_suite
from plsh_ref.testing.examples import numpy_alibi


def kernel(query, key, value, **kwargs):
    with open(os.environ["PLSH_PROBE_OUT"], "a") as f:
        f.write(f"{query.shape} {query.dtype} {float(abs(query.astype(float)).sum())!r}\\n")
    return numpy_alibi(query, key, value, **kwargs)


kernel.__signature__ = __import__("inspect").signature(numpy_alibi)
test_probe = make_property_suite(kernel, kind="alibi", max_examples=5)
"""


# the variables by which Hypothesis decides it runs in CI (hypothesis._settings._CI_VARS);
# there it loads its "ci" profile, which derandomizes and ignores --hypothesis-seed
_CI_VARIABLES = (
    "CI",
    "__TOX_ENVIRONMENT_VARIABLE_ORIGINAL_CI",
    "TF_BUILD",
    "bamboo.buildKey",
    "BUILDKITE",
    "CIRCLECI",
    "CIRRUS_CI",
    "CODEBUILD_BUILD_ID",
    "GITHUB_ACTIONS",
    "GITLAB_CI",
    "HEROKU_TEST_RUN_ID",
    "TEAMCITY_VERSION",
)


def test_example_pytest_run_is_reproducible(tmp_path, monkeypatch):
    # a kernel file like examples/test_my_kernel.py, recording the problems it is given:
    # two runs with the example's command line draw the same problems (CI once failed on
    # a draw no one could replay); a run with another seed draws others (control; the
    # chance that five random problems repeat is negligible). Outside CI, that is: the
    # runs here see no CI variable. Where one is set (the second half), Hypothesis
    # derandomizes: every seed draws the same problems, so a CI run replays anyway (the
    # control of this test once failed in CI for that reason).
    probe = tmp_path / "test_probe_kernel.py"
    probe.write_text(_PROBE)
    for variable in _CI_VARIABLES:
        monkeypatch.delenv(variable, raising=False)

    def draws(args, name):
        out = tmp_path / name
        monkeypatch.setenv("PLSH_PROBE_OUT", str(out))
        result = _run(args, storage=str(tmp_path / f"hypothesis_{name}"))
        assert result.returncode == 0, result.stdout + result.stderr
        return out.read_text()

    def seeded(seed):
        args = [
            f"--hypothesis-seed={seed}" if a.startswith("--hypothesis-seed") else a
            for a in _pytest_args(str(probe))
        ]
        assert f"--hypothesis-seed={seed}" in args
        return args

    first = draws(_pytest_args(str(probe)), "first")
    assert first.count("\n") >= 5
    assert draws(_pytest_args(str(probe)), "second") == first
    assert draws(seeded(HYPOTHESIS_SEED + 1), "reseeded") != first

    monkeypatch.setenv("CI", "true")
    in_ci = draws(seeded(HYPOTHESIS_SEED), "ci_first")
    assert draws(seeded(HYPOTHESIS_SEED + 1), "ci_reseeded") == in_ci
