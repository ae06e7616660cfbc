"""Tests of `plsh verify MODULE:FUNCTION` (plsh_ref.testing.verify through the dispatcher)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from plsh_ref.cli import main
from plsh_ref.testing.battery import battery

EX = "plsh_ref.testing.examples"


def verify(capsys, *args):
    code = main(["verify", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_correct_kernel_passes(capsys):
    code, out, err = verify(capsys, f"{EX}:numpy_alibi", "--cases", "40", "--long-cases", "0")
    assert code == 0, out + err
    n = len(battery("alibi")) - 1  # packed_varlen: numpy_alibi takes no cu_seqlens
    assert f"{n + 40}/{n + 40} cases passed, 0 failed, 0 skipped" in out
    assert out.rstrip().endswith("PASS")


@pytest.mark.parametrize(
    "kernel, kind",
    [("sign_flipped_alibi", "alibi"), ("averaged_plsh", "plsh"), ("mask_only_plsh", "plsh")],
)
def test_broken_kernel_fails_with_reproducible_cases(capsys, kernel, kind):
    code, out, _ = verify(capsys, f"{EX}:{kernel}", "--kind", kind, "--cases", "30", "--seed", "4")
    assert code == 1 and "FAIL:" in out
    reruns = re.findall(r"rerun: plsh verify (.*)", out)
    assert reruns, out
    # the printed command reruns exactly that case, which fails again with the same error
    worst = re.search(r"output error (\S+) > allowed.*\n    rerun: plsh verify", out)
    first_error = worst.group(1)
    code, again, _ = verify(capsys, *reruns[0].split())
    assert code == 1
    assert f"output error {first_error} > allowed" in again
    assert "0/1 cases passed" in again and "--case" in reruns[0]
    # and the printed ProblemSpec rebuilds it without Hypothesis
    from plsh_ref.testing import ProblemSpec, check_case, examples  # noqa: F401

    spec = eval(
        re.search(r"check_case\(kernel, (ProblemSpec\(.*?\))\.build\(\)", again, flags=re.S).group(
            1
        )
    )
    result = check_case(getattr(examples, kernel), spec.build())
    assert not result.passed and f"output error {first_error} > allowed" in result.message


def test_options_shape_the_cases(capsys):
    code, out, _ = verify(
        capsys,
        f"{EX}:numpy_alibi",
        "--cases",
        "15",
        "--dtypes",
        "float64",
        "--causal",
        "no",
        "--no-gqa",
        "--positions",
        "left_padding",
        "--max-seq-len",
        "5",
        "-v",
    )
    assert code == 0
    cases = [line for line in out.splitlines() if line.strip().startswith("case ")]
    assert len(cases) >= 15
    body = "\n".join(cases)
    assert "float16" not in body and " causal " not in body and "kv " not in body
    assert "positions=default" not in body and "positions=explicit" not in body


def _write_module(tmp_path, monkeypatch, source):
    (tmp_path / "user_kernels.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("user_kernels", None)


BAD_KERNELS = """
    import numpy as np
    from plsh_ref.testing import alibi_reference

    def two_args(query, key):
        return query

    def wrong_shape(query, key, value, *, slopes, causal, scale, query_positions, key_positions):
        return np.zeros((1, 1, 1, 1), dtype=query.dtype)

    def wrong_dtype(query, key, value, *, slopes, causal, scale, query_positions, key_positions):
        return alibi_reference(query, key, value, slopes=slopes, causal=causal, scale=scale,
                               query_positions=query_positions, key_positions=key_positions)

    not_a_function = 3

    raise_on_import = False
    """


@pytest.mark.parametrize(
    "args, message",
    [
        (["no_such_module_xyz:f"], "cannot import module 'no_such_module_xyz'"),
        (["user_kernels"], "expected MODULE:FUNCTION"),
        (["user_kernels:missing"], "has no attribute 'missing'"),
        (["user_kernels:not_a_function"], "is an int, not a function"),
        (["user_kernels:two_args"], "does not match the alibi contract"),
        (["user_kernels:wrong_shape"], "output has shape (1, 1, 1, 1)"),
        (["user_kernels:wrong_dtype", "--dtypes", "float32"], "output has dtype float64"),
        ([f"{EX}:numpy_alibi", "--dtypes", "bfloat16"], "bfloat16 needs --framework torch"),
        ([f"{EX}:numpy_alibi", "--dtypes", "float8"], "--dtypes: unknown dtype 'float8'"),
        ([f"{EX}:numpy_alibi", "--case", "52", "--cases", "50"], "--case: no case '52'"),
        ([f"{EX}:numpy_alibi", "--case", "heads_7"], "battery cases heads_6"),
        (
            [f"{EX}:numpy_alibi", "--unsupported", "flash"],
            "--unsupported: unknown capability 'flash'",
        ),
        ([f"{EX}:numpy_alibi", "--timeout", "0"], "--timeout: must be > 0"),
        # 0 ran only the empty-sequence cases and printed PASS
        ([f"{EX}:numpy_alibi", "--max-seq-len", "0"], "--max-seq-len: must be >= 1"),
        # sizes are checked before any case is drawn (numpy's "Unable to allocate 3.15 TiB")
        (
            [f"{EX}:numpy_alibi", "--max-seq-len", "100000000000"],
            "--max-seq-len: 100000000000 would need about",
        ),
        (
            [f"{EX}:numpy_alibi", "--max-head-dim", "1000000000"],
            "--max-head-dim: 1000000000 would need about",
        ),
        ([f"{EX}:numpy_alibi", "--max-batch", "1000000000"], "--max-batch: 1000000000 would"),
        ([f"{EX}:numpy_alibi", "--max-memory", "0"], "--max-memory: must be > 0 GiB"),
        (
            [f"{EX}:numpy_alibi", "--framework", "numpy", "--device", "cuda"],
            "numpy kernels run on cpu",
        ),
        ([f"{EX}:numpy_alibi", "--positions", "middle"], "--positions: entries must be in"),
    ],
)
def test_bad_input_one_line_exit_2(capsys, tmp_path, monkeypatch, args, message):
    _write_module(tmp_path, monkeypatch, BAD_KERNELS)
    code, out, err = verify(capsys, *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("plsh verify: error: ") and message in err, err


@pytest.mark.parametrize("where", ["missing_folder", "a_folder"])
def test_json_path_is_checked_before_the_run(capsys, tmp_path, where):
    # "--json /nonexistent/dir/x.json" printed PASS after the whole run, then exit 2
    path = tmp_path / "no_such_dir" / "x.json" if where == "missing_folder" else tmp_path
    args = [f"{EX}:numpy_alibi", "--no-battery", "--cases", "2", "--json", str(path)]
    code, out, err = verify(capsys, *args)
    assert code == 2 and out == "", out
    assert len(err.strip().splitlines()) == 1 and err.startswith("plsh verify: error: --json: "), (
        err
    )


def test_unavailable_device_is_bad_input(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is available here")
    code, _, err = verify(capsys, f"{EX}:sdpa_alibi", "--framework", "torch", "--device", "cuda")
    assert code == 2 and err.startswith("plsh verify: error: --device: 'cuda' is not available")
    assert len(err.strip().splitlines()) == 1


def test_console_script_no_traceback(tmp_path):
    """Through the installed entry point: an import error inside the user's module."""
    (tmp_path / "broken_mod.py").write_text("import numpy\nraise RuntimeError('boom')\n")
    proc = subprocess.run(
        [sys.executable, "-m", "plsh_ref.cli", "verify", "broken_mod:f"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "plsh verify: error: kernel: cannot import module 'broken_mod': RuntimeError: boom"
    )


def test_torch_framework_with_sdpa(capsys):
    pytest.importorskip("torch")
    code, out, err = verify(capsys, f"{EX}:sdpa_alibi", "--cases", "30")
    assert code == 0 and "0 failed, 0 skipped" in out, out + err
    assert "framework=torch" in out  # detected: numpy inputs make it raise


@pytest.mark.parametrize(
    "kernel, given, works",
    [("numpy_alibi", "torch", "numpy"), ("sdpa_alibi", "numpy", "torch")],
)
def test_a_wrong_framework_is_refused_naming_the_right_one(capsys, kernel, given, works):
    # it once ran every case, each failing with the kernel's own exception (0/45 passed)
    pytest.importorskip("torch")
    code, out, err = verify(capsys, f"{EX}:{kernel}", "--framework", given, "--cases", "3")
    assert code == 2 and not out, out + err
    assert err.strip().count("\n") == 0, err
    assert f"--framework {given}: the kernel does not take {given} arrays" in err
    assert f"pass --framework {works}" in err
    # control: the right one runs
    code, out, err = verify(capsys, f"{EX}:{kernel}", "--framework", works, "--cases", "3")
    assert code == 0, out + err


def test_torch_framework_with_plsh_fast(capsys):
    pytest.importorskip("torch")
    pytest.importorskip("plsh_fast")
    code, out, err = verify(
        capsys,
        "_plsh_fast_kernel:plsh_fast_kernel",
        "--kind",
        "plsh",
        "--framework",
        "torch",
        "--cases",
        "12",
        "--max-seq-len",
        "12",
    )
    assert code == 0, out + err


def test_every_option_has_a_description():
    # --max-seq-len, --max-heads, --max-head-dim, --max-batch showed only "default: N"
    import argparse

    from plsh_ref.testing.verify import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    bare = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        words = re.sub(r"\(?default: [^)]*\)?", "", action.help or "").strip(" .;,")
        if len(words.split()) < 3:
            bare.append(action.option_strings or action.dest)
    assert not bare, bare
