"""`plsh verify`: capabilities, slope modes, framework detection,
timeout, traceback, JSON report, shared-axis summary, NaN positions, the import path and
the current folder, and `plsh verify-slopes`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from plsh_ref.cli import main
from plsh_ref.testing import ProblemSpec, check_case, examples
from plsh_ref.testing.suite import KernelContractError, kernel_capabilities

EX = "plsh_ref.testing.examples"


def verify(capsys, *args):
    code = main(["verify", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _module(tmp_path, monkeypatch, source, name="user_kernels_v2"):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)


KERNELS = """
    import time
    import numpy as np
    from plsh_ref.testing import examples

    def no_bidirectional(query, key, value, *, slopes, causal, scale, query_positions,
                         key_positions, attention_mask=None):
        if not causal:
            raise NotImplementedError("causal only")
        return examples.numpy_alibi(query, key, value, slopes=slopes, causal=causal,
                                    scale=scale, query_positions=query_positions,
                                    key_positions=key_positions,
                                    attention_mask=attention_mask)

    no_bidirectional.supports = {"bidirectional": False}

    def unknown_capability(query, key, value, *, slopes, causal, scale, query_positions,
                           key_positions):
        return query

    unknown_capability.supports = {"flash": False}

    def sleepy(query, key, value, *, slopes, causal, scale, query_positions, key_positions):
        time.sleep(3)
        return query

    def raises(query, key, value, *, slopes, causal, scale, query_positions, key_positions):
        return helper(query)

    def helper(query):
        raise RuntimeError("deep inside the kernel")

    def nan_rows(query, key, value, *, slopes, causal, scale, query_positions, key_positions,
                 attention_mask=None):
        out, lse = examples.numpy_alibi(query, key, value, slopes=slopes, causal=causal,
                                        scale=scale, query_positions=query_positions,
                                        key_positions=key_positions,
                                        attention_mask=attention_mask)
        return np.where(np.isneginf(lse)[..., None], np.nan, out).astype(query.dtype)

    def returns_list(query, key, value, *, slopes, causal, scale, query_positions,
                     key_positions):
        return [[1.0]]

    def torch_only(query, key, value, *, slopes, causal, scale, query_positions,
                   key_positions):
        return query.new_zeros(1)  # numpy arrays have no new_zeros
    """


def test_capabilities_restrict_the_cases_and_list_the_battery_not_covered(
    capsys, tmp_path, monkeypatch
):
    _module(tmp_path, monkeypatch, KERNELS)
    code, out, err = verify(capsys, "user_kernels_v2:no_bidirectional", "--cases", "20")
    assert code == 0, out + err
    # drawn within the capabilities: nothing skipped, the bidirectional battery listed
    assert "skipped (never counted as passed)" not in out
    assert "20 failed" not in out and " 0 skipped in " in out
    assert "battery cases not covered" in out and "  bidirectional: bidirectional" in out
    assert "PASS (" in out and "battery cases not covered)" in out
    # check_case itself still skips (never passes) a case the kernel cannot run
    from plsh_ref.testing import ProblemSpec as Spec

    r = check_case(sys.modules["user_kernels_v2"].no_bidirectional, Spec(causal=False).build())
    assert r.skipped and not r.passed and "unsupported: bidirectional" in r.message
    # negative control: without the declaration the same kernel fails those cases
    monkeypatch.setattr(sys.modules["user_kernels_v2"].no_bidirectional, "supports", {})
    code, out, _ = verify(capsys, "user_kernels_v2:no_bidirectional", "--cases", "20")
    assert code == 1 and "raised NotImplementedError: causal only" in out


def test_unknown_capability_is_bad_input(capsys, tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, KERNELS)
    code, _, err = verify(capsys, "user_kernels_v2:unknown_capability")
    assert code == 2 and err.strip().count("\n") == 0
    assert "supports: unknown capability 'flash'" in err
    with pytest.raises(KernelContractError, match="must be True or False"):
        kernel_capabilities(examples.numpy_alibi, {"gqa": "no"})


def test_unsupported_option_restricts(capsys):
    code, out, _ = verify(capsys, f"{EX}:numpy_alibi", "--unsupported", "gqa,head_dim_v", "-v")
    assert code == 0 and "unsupported=gqa,head_dim_v" in out
    assert "  gqa_grouped: gqa" in out and "  value_head_dim_differs: head_dim_v" in out
    cases = [line for line in out.splitlines() if line.startswith("  case ")]
    assert len(cases) >= 50 and not any("kv " in line for line in cases)


def test_timeout_fails_the_case_and_verify_moves_on(capsys, tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, KERNELS)
    code, out, _ = verify(
        capsys,
        "user_kernels_v2:sleepy",
        "--framework",
        "numpy",
        "--timeout",
        "0.2",
        "--cases",
        "1",
        "--no-battery",
    )
    assert code == 1 and "timed out: no result after 0.2 s (--timeout)" in out


def test_traceback_option(capsys, tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, KERNELS)
    args = ["user_kernels_v2:raises", "--framework", "numpy", "--cases", "2"]
    code, out, _ = verify(capsys, *args)
    assert code == 1 and "raised RuntimeError: deep inside the kernel" in out
    assert "Traceback" not in out
    code, out, _ = verify(capsys, *args, "--traceback")
    assert "Traceback (most recent call last)" in out and "in helper" in out


def test_nan_positions_and_empty_rows_are_labelled(tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, KERNELS)
    import user_kernels_v2

    problem = ProblemSpec(n_q=6, n_k=3, causal=True, dtype="float64").build()  # 3 empty rows
    result = check_case(user_kernels_v2.nan_rows, problem)
    assert not result.passed and result.empty_rows == 2 * 3
    assert "output contains NaN at 24 entries, first (0, 0, 0, 0)" in result.message
    assert "all on rows without admissible keys: expected output 0" in result.message


def test_json_report_and_shared_axes(capsys, tmp_path):
    path = tmp_path / "r.json"
    code, out, _ = verify(
        capsys, f"{EX}:interleaved_gqa_alibi", "--cases", "30", "--json", str(path)
    )
    report = json.loads(path.read_text())
    assert code == 1 == report["exit_status"]
    assert report["failed"] == sum(c["status"] == "FAIL" for c in report["cases"])
    # every failure is a grouped-query case, and the summary says so first
    assert all("gqa(1<H_kv<H)" in c["features"] for c in report["cases"] if c["status"] == "FAIL")
    top = report["shared_axes"][0]
    assert top["axis"] == "gqa(1<H_kv<H)" and top["failures"] == top["num_failures"]
    assert "what the failing cases share" in out
    line = "gqa(1<H_kv<H)"
    assert any(
        l.strip().startswith(line) and f"{top['failures']}/{top['num_failures']} vs" in l
        for l in out.splitlines()
    )
    assert {c["case"] for c in report["cases"] if c["battery"]} >= {"gqa_grouped", "no_keys"}


def test_framework_is_detected_or_bad_input(capsys, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    _module(tmp_path, monkeypatch, KERNELS)
    code, out, _ = verify(capsys, f"{EX}:sdpa_alibi", "--cases", "3", "--no-battery")
    assert code == 0 and "framework=torch" in out
    code, _, err = verify(capsys, "user_kernels_v2:returns_list")
    assert code == 2 and err.startswith(
        "plsh verify: error: framework: cannot tell what the kernel"
    )
    assert "--framework numpy, torch or jax" in err and err.count("\n") == 1


def test_standard_slopes_mode_from_the_signature(capsys):
    code, out, _ = verify(capsys, f"{EX}:numpy_alibi_standard_slopes", "--cases", "20")
    assert code == 0 and "slopes=standard" in out
    code, _, err = verify(capsys, f"{EX}:numpy_alibi", "--slopes", "standard")
    assert code == 2 and "it takes slopes: use --slopes given" in err


def test_kernel_in_the_current_folder_no_files_written(tmp_path):
    (tmp_path / "my_kernel.py").write_text(
        "from plsh_ref.testing.examples import numpy_alibi as attention\n"
    )
    before = sorted(os.listdir(tmp_path))
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "HYPOTHESIS_STORAGE_DIRECTORY")
    }
    proc = subprocess.run(
        [sys.executable, "-m", "plsh_ref.cli", "verify", "my_kernel:attention", "--cases", "5"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = sorted(n for n in os.listdir(tmp_path) if n != "__pycache__")
    assert after == before  # no .hypothesis/, no plsh_out/


SLOPES = """
    import numpy as np
    from plsh_ref.alibi import alibi_slopes
    from plsh_ref.testing.problems import round_to_dtype

    def good(num_heads):
        return alibi_slopes(num_heads).tolist()

    def power_of_two_rule(num_heads):
        return np.exp2(-8.0 * np.arange(1, num_heads + 1) / num_heads)

    def bf16(num_heads):
        return round_to_dtype(alibi_slopes(num_heads), "bfloat16")

    def raises(num_heads):
        if num_heads == 5:
            raise ValueError("five")
        return alibi_slopes(num_heads)

    def short(num_heads):
        return alibi_slopes(num_heads)[:-1] if num_heads > 3 else alibi_slopes(num_heads)
    """


@pytest.mark.parametrize(
    "function, code, expected",
    [
        ("good", 0, "PASS: plsh verify-slopes user_slopes:good: Press et al.'s slopes; 64 of 64"),
        (
            f"{EX}:press_slopes",
            0,
            "PASS: plsh verify-slopes plsh_ref.testing.examples:press_slopes: Press et al.'s "
            "slopes; 9 of 64 head counts bit-equal, 55 within float64/float32 rounding",
        ),
        ("power_of_two_rule", 1, "first: num_heads=3"),
        ("bf16", 1, "num_heads 9-64: LOW PRECISION: the right rule rounded to bfloat16"),
    ],
)
def test_verify_slopes(capsys, tmp_path, monkeypatch, function, code, expected):
    _module(tmp_path, monkeypatch, SLOPES, name="user_slopes")
    target = function if ":" in function else f"user_slopes:{function}"
    assert main(["verify-slopes", target]) == code
    out = capsys.readouterr().out
    assert expected in out, out
    assert out.startswith("PASS: " if code == 0 else "FAIL: "), out  # the verdict first
    assert "not bit-equal" not in out  # rounding is stated, without alarm
    if function == "power_of_two_rule":
        assert "WRONG RULE" in out and "largest relative error" in out


def test_verify_slopes_with_a_max_bias(capsys, tmp_path, monkeypatch):
    _module(
        tmp_path,
        monkeypatch,
        """
        from plsh_ref.alibi import alibi_slopes

        def bias16(num_heads):
            return alibi_slopes(num_heads, max_bias=16.0)
        """,
        name="user_slopes16",
    )
    assert main(["verify-slopes", "user_slopes16:bias16", "--max-bias", "16"]) == 0
    assert capsys.readouterr().out.startswith("PASS: ")
    # negative control: against the default rule it is a wrong rule
    assert main(["verify-slopes", "user_slopes16:bias16"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL: ") and "WRONG RULE" in out
    assert main(["verify-slopes", "user_slopes16:bias16", "--max-bias", "0"]) == 2
    capsys.readouterr()
    # a max bias whose slopes underflow to 0 is refused in one line (it warned and FAILed)
    assert main(["verify-slopes", "user_slopes16:bias16", "--max-bias", "1e308"]) == 2
    err = capsys.readouterr().err
    assert err == "plsh verify-slopes: error: --max-bias: must be > 0 and < 1024, got 1e+308\n"


def test_alibi_slopes_max_bias_default_is_bit_identical():
    import numpy as np

    from plsh_ref.alibi import alibi_slopes

    def press(n, b=8.0):  # the rule with the constant written out
        def p(k):
            return np.exp2(-b * np.arange(1, k + 1, dtype=np.float64) / k)

        c = 1 << (n.bit_length() - 1)
        return p(n) if n == c else np.concatenate([p(c), p(2 * c)[0::2][: n - c]])

    for h in range(1, 130):
        assert np.array_equal(alibi_slopes(h), press(h))
        assert np.array_equal(alibi_slopes(h, max_bias=16), press(h, 16.0))
    assert alibi_slopes(4, max_bias=16).tolist() == [2.0**-4, 2.0**-8, 2.0**-12, 2.0**-16]
    for bad, error in [(0.0, ValueError), (float("inf"), ValueError), ("8", TypeError)]:
        with pytest.raises(error, match="^max_bias: "):
            alibi_slopes(4, max_bias=bad)


@pytest.mark.parametrize(
    "function, message",
    [
        ("raises", "the function raised ValueError for num_heads=5: five"),
        ("short", "for num_heads=4 the function returned shape (3,), expected (4,)"),
        ("missing", "has no attribute 'missing'"),
    ],
)
def test_verify_slopes_bad_input(capsys, tmp_path, monkeypatch, function, message):
    _module(tmp_path, monkeypatch, SLOPES, name="user_slopes")
    assert main(["verify-slopes", f"user_slopes:{function}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_verify_slopes_error_names_the_option(capsys):
    # said "max-heads:" without the dashes
    assert main(["verify-slopes", "plsh_ref.alibi:alibi_slopes", "--max-heads", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "plsh verify-slopes: error: --max-heads: must be in 1..4096, got 0\n", err


def test_verify_slopes_caps_max_heads_before_the_run(capsys):
    # --max-heads 100000 ran for minutes (max_heads**2 slope values) without a cap
    from plsh_ref.testing.verify_slopes import MAX_HEADS

    function = "plsh_ref.alibi:alibi_slopes"
    assert main(["verify-slopes", function, "--max-heads", str(MAX_HEADS + 1)]) == 2
    err = capsys.readouterr().err
    expected = f"must be in 1..{MAX_HEADS}, got {MAX_HEADS + 1}"
    assert err == f"plsh verify-slopes: error: --max-heads: {expected}\n", err


@pytest.mark.parametrize("bad, error", [(0, ValueError), (2.0, TypeError), (True, TypeError)])
def test_check_slopes_function_refuses_bad_max_heads(bad, error):
    from plsh_ref.testing.verify_slopes import check_slopes_function

    calls = []
    with pytest.raises(error, match="max_heads"):
        check_slopes_function(lambda h: calls.append(h), bad)
    assert not calls


def test_verify_slopes_catches_rounding_only_from_nine_heads():
    """bf16 holds 2^(-k) exactly: power-of-two head counts up to 8 stay exact."""
    from plsh_ref.alibi import alibi_slopes
    from plsh_ref.testing.problems import round_to_dtype
    from plsh_ref.testing.verify_slopes import check_slopes_function

    report = check_slopes_function(lambda h: round_to_dtype(alibi_slopes(h), "bfloat16"), 16)
    assert report.wrong == list(range(9, 17)) and not report.passed()
    assert 0 < report.max_relative_error <= 2.0**-8  # round to nearest: half a bf16 ulp


def test_a_run_where_every_case_is_skipped_fails(capsys):
    def kernel(query, key, value, *, slopes, causal, scale, query_positions, key_positions):
        raise AssertionError("never called")

    kernel.supports = {"causal": False, "bidirectional": False}
    from plsh_ref.testing.battery import battery

    results = [check_case(kernel, spec.build()) for _, spec in battery()]
    assert all(r.skipped and not r.passed and r.status == "skip" for r in results)


def test_cli_run_where_no_case_can_run_is_inconclusive(capsys):
    # (--unsupported causal,bidirectional is refused as bad input now: exit 2)
    code, out, _ = verify(
        capsys,
        f"{EX}:numpy_alibi",
        "--unsupported",
        "float64",
        "--dtypes",
        "float64",
        "--cases",
        "5",
    )
    assert code == 3 and "INCONCLUSIVE: no case ran" in out


@pytest.mark.parametrize(
    "target, rest",
    [
        (
            "mod_missing_for_plsh:f",
            "cannot import module 'mod_missing_for_plsh': ModuleNotFoundError",
        ),
        ("plsh_ref.alibi:missing", "module 'plsh_ref.alibi' has no attribute 'missing'"),
        ("plsh_ref.alibi:__name__", "plsh_ref.alibi:__name__ is a str, not a function"),
        ("no_colon", "expected MODULE:FUNCTION, got 'no_colon'"),
    ],
)
def test_verify_slopes_load_errors_name_the_function(capsys, target, rest):
    # said "kernel: ..." although the user typed a slope function
    assert main(["verify-slopes", target]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"plsh verify-slopes: error: function: {rest}"), err
    assert "kernel" not in err, err


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--causal", "no"],
            "--causal no: asks for bidirectional problems only, but the kernel's "
            "supports['bidirectional'] = False declares them unsupported",
        ),
        (
            ["--unsupported", "causal"],
            "--unsupported causal: together with the kernel's supports['bidirectional'] = "
            "False it leaves no problem to check",
        ),
    ],
)
def test_causal_options_that_leave_nothing_are_refused(
    capsys, tmp_path, monkeypatch, args, message
):
    # "--causal yes --unsupported causal" ran the other cases and passed; the same
    # conflict with the kernel's own `supports` declaration
    _module(tmp_path, monkeypatch, KERNELS)
    code, out, err = verify(capsys, "user_kernels_v2:no_bidirectional", "--cases", "2", *args)
    assert code == 2 and out == "", out
    assert len(err.strip().splitlines()) == 1 and message in err, err
    # negative control: the kernel's causal problems alone are a valid request
    code, out, err = verify(
        capsys,
        "user_kernels_v2:no_bidirectional",
        "--cases",
        "2",
        "--long-cases",
        "0",
        "--causal",
        "yes",
    )
    assert code == 0, out + err
