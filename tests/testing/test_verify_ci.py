"""`plsh verify` as a CI step: exit statuses (0 pass, 1 fail, 2 usage, 3 inconclusive),
the floors behind INCONCLUSIVE, --junitxml, --time-budget, custom cases (--spec),
`./file.py:fn`, import-time exits, precision findings and --strict-precision, and
`--slopes standard:max_bias=B`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest

from plsh_ref.cli import main
from plsh_ref.testing.suite import KernelContractError
from plsh_ref.testing.verify import EXIT_STATUSES, parse_slopes

EX = "plsh_ref.testing.examples"
SMALL = ["--cases", "5", "--long-cases", "0"]


def verify(capsys, *args):
    code = main(["verify", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_exit_statuses_are_documented():
    assert EXIT_STATUSES == {0: "pass", 1: "fail", 2: "bad input (usage)", 3: "inconclusive"}
    from plsh_ref.testing import verify as module

    doc = " ".join(module.__doc__.split())
    assert "0 pass, 1 some case fails, 2 bad input" in doc and "3 inconclusive" in doc


def test_decode_and_square_only_kernel_gets_a_full_run(capsys, tmp_path):
    # drawn within the capabilities: n_q = n_k = 1 everywhere, and still 50 random cases
    path = tmp_path / "r.json"
    args = ["--unsupported", "prefill,unequal_lengths", "--json", str(path)]
    code, out, _ = verify(capsys, f"{EX}:numpy_alibi", *args)
    assert code == 0, out
    report = json.loads(path.read_text())
    assert all(
        c["spec"]["n_q"] == c["spec"]["n_k"] == 1 for c in report["cases"] if c["spec"]["n_k"]
    )
    assert sum(c["group"] == "random" for c in report["cases"]) >= 50
    assert report["skipped"] == 0


def test_battery_floor(capsys):
    # almost nothing of the battery runs for this kernel: inconclusive, with the reasons
    code, out, _ = verify(
        capsys,
        f"{EX}:numpy_alibi",
        "--unsupported",
        "positions,attention_mask,gqa,unequal_lengths,prefill,bidirectional,scale,head_dim_v",
        "--cases",
        "0",
    )
    assert code == 3, out
    assert "battery classes covered, below the floor of 50%; excluded by" in out


def test_junitxml_report(capsys, tmp_path):
    path = tmp_path / "verify.xml"
    code, _, _ = verify(capsys, f"{EX}:sign_flipped_alibi", *SMALL, "--junitxml", str(path))
    assert code == 1
    suite = ET.parse(path).getroot()
    assert suite.tag == "testsuite" and int(suite.get("failures")) > 0
    cases = suite.findall("testcase")
    assert len(cases) == int(suite.get("tests"))
    failed = {c.get("name") for c in cases if c.find("failure") is not None}
    assert "bidirectional" in failed
    assert {c.get("classname") for c in cases} >= {"plsh_verify.battery", "plsh_verify.random"}
    code, _, err = verify(capsys, f"{EX}:numpy_alibi", "--junitxml", str(tmp_path / "no" / "x"))
    assert code == 2 and err.startswith("plsh verify: error: --junitxml: folder")


def test_time_budget_makes_an_unfinished_run_inconclusive(capsys):
    code, out, _ = verify(capsys, f"{EX}:numpy_alibi", "--time-budget", "0.3")
    assert code == 3 and "INCONCLUSIVE: --time-budget 0.3 s ran out" in out
    code, _, err = verify(capsys, f"{EX}:numpy_alibi", "--time-budget", "0")
    assert code == 2 and "--time-budget: must be > 0" in err


def test_custom_cases_from_the_command_line(capsys, tmp_path):
    spec = '{"n_q": 1, "n_k": 40, "num_heads": 12, "num_heads_kv": 12, "dtype": "float16"}'
    code, out, _ = verify(
        capsys,
        f"{EX}:numpy_alibi",
        "--no-battery",
        "--cases",
        "0",
        "--long-cases",
        "0",
        "--spec",
        spec,
        "-v",
    )
    assert code == 0 and "custom case custom_0 pass" in out and "H=12 n_q=1 n_k=40" in out
    (tmp_path / "specs.json").write_text(json.dumps([{"causal": False}, {"batch": 2}]))
    code, out, _ = verify(
        capsys,
        f"{EX}:sign_flipped_alibi",
        "--no-battery",
        "--cases",
        "0",
        "--long-cases",
        "0",
        "--spec",
        f"@{tmp_path / 'specs.json'}",
    )
    assert code == 1 and "custom case custom_0: FAIL" in out
    for bad, message in [
        ("{", "--spec: not JSON"),
        ('{"heads": 3}', "--spec: unknown field(s) heads"),
        ('{"n_q": -1}', "--spec: n_q: must be >= 0"),
    ]:
        code, _, err = verify(capsys, f"{EX}:numpy_alibi", "--spec", bad)
        assert code == 2 and message in err and err.count("\n") == 1, err


def test_file_path_kernel_and_import_time_exit(tmp_path):
    (tmp_path / "kern.py").write_text(
        "from plsh_ref.testing.examples import numpy_alibi as attention\n"
    )
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "crashes.py").write_text("raise MemoryError('no room')\n")

    def run(target):
        return subprocess.run(
            [sys.executable, "-m", "plsh_ref.cli", "verify", target, *SMALL],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )

    proc = run("./kern.py:attention")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run("exits:attention")  # sys.exit(3) at import: said so, status 2, one line
    assert proc.returncode == 2
    assert proc.stderr == (
        "plsh verify: error: kernel: module 'exits' called sys.exit(3) at import time\n"
    )
    proc = run("./crashes.py:f")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "cannot import module './crashes.py': MemoryError: no room" in proc.stderr
    proc = run("./missing.py:f")
    assert proc.returncode == 2 and "no file './missing.py'" in proc.stderr


def test_row_constant_bias_is_a_precision_finding_not_a_float32_failure(capsys):
    """m * p_j in float32 is exact in real arithmetic; at 300 tokens and slope 1/2 its
    rounding exceeds the rule: reported with its growth, a failure only when strict."""
    target = "_alibi_kernels:mj_bias_in_input_dtype"
    code, out, _ = verify(capsys, target, "--dtypes", "float32", *SMALL)
    assert code == 0, out
    assert "precision findings, 1 cases (0 failing): precision: row-constant bias" in out
    growth = [line for line in out.splitlines() if line.startswith("  n=")]
    ratios = [float(line.split("(")[-1].rstrip("x)")) for line in growth]
    assert len(ratios) == 4 and ratios[-1] > 2 * ratios[0]  # grows with n
    assert out.rstrip().endswith("1 precision findings)")
    code, out, _ = verify(capsys, target, "--dtypes", "float32", *SMALL, "--strict-precision")
    assert code == 1 and "sequence_longer_than_256: precision: row-constant bias" in out
    # in half precision it fails at defaults, the class named
    code, out, _ = verify(capsys, target, *SMALL)
    assert code == 1
    assert "sequence_longer_than_256_float16: half-precision position arithmetic" in out


def test_a_gross_error_is_reported_before_any_precision_finding(capsys):
    """A negated output fails every case; at float16 positions far from zero the
    rounded-positions yardstick is so coarse that it "explains" even that case. The
    finding once came first and read as the diagnosis; now the failures come first and
    the finding says how many failures no rounding explains."""
    code, out, _ = verify(capsys, "_alibi_kernels:negated_output", *SMALL)
    assert code == 1
    lines = out.splitlines()
    failed = next(i for i, line in enumerate(lines) if line.startswith("battery cases failed"))
    findings = [i for i, line in enumerate(lines) if line.startswith("precision findings")]
    assert findings, out  # the coarse yardstick still matches one case (this test's premise)
    assert findings[0] > failed
    assert re.search(
        r"besides these, \d+ failing cases that no rounding explains", lines[findings[0]]
    )
    # control: a kernel whose only failures are findings gets no such clause
    code, out, _ = verify(capsys, "_alibi_kernels:mj_bias_in_input_dtype", *SMALL)
    assert code == 1 and "precision findings" in out and "no rounding explains" not in out


def test_a_correct_kernel_has_no_precision_finding(capsys):
    code, out, _ = verify(capsys, f"{EX}:numpy_alibi_standard_slopes", *SMALL)
    assert code == 0 and "precision findings" not in out


def test_slopes_with_a_max_bias(capsys, tmp_path, monkeypatch):
    (tmp_path / "mb_kernels.py").write_text(
        textwrap.dedent(
            """
            from plsh_ref.alibi import alibi_slopes
            from plsh_ref.testing.examples import numpy_alibi

            def mb16(query, key, value, *, causal, scale, query_positions, key_positions,
                     attention_mask=None):
                return numpy_alibi(query, key, value,
                                   slopes=alibi_slopes(query.shape[1], max_bias=16.0),
                                   causal=causal, scale=scale,
                                   query_positions=query_positions,
                                   key_positions=key_positions, attention_mask=attention_mask)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, _ = verify(capsys, "mb_kernels:mb16", "--slopes", "standard:max_bias=16", *SMALL)
    assert code == 0 and "slopes=standard:max_bias=16" in out, out
    code, out, _ = verify(capsys, "mb_kernels:mb16", *SMALL)  # the default rule: wrong
    assert code == 1 and "heads_6" in out
    assert parse_slopes("standard:max_bias=16") == ("standard", 16.0)
    assert parse_slopes("given") == ("given", 8.0)
    for bad in ("standard:max_bias=0", "standard:bias=4", "given:max_bias=4", "std"):
        with pytest.raises(KernelContractError, match="^--slopes: "):
            parse_slopes(bad)


def test_positions_option_restricts_the_battery(capsys):
    code, out, _ = verify(capsys, f"{EX}:numpy_alibi", "--positions", "default", *SMALL, "-v")
    assert code == 0
    ran = [line for line in out.splitlines() if line.startswith("  battery ")]
    assert ran and all("offset=" not in line and "positions=default" in line for line in ran)
    assert "  positions_with_gaps: --positions" in out
    assert "  decode_cache_offset: --positions" in out


def test_args_kwargs_wrapper_of_a_standard_slopes_kernel(capsys, tmp_path, monkeypatch):
    # a *args, **kwargs wrapper was taken for given-slopes mode and failed every case
    (tmp_path / "wrapped.py").write_text(
        textwrap.dedent(
            """
            from plsh_ref.testing.examples import numpy_alibi, numpy_alibi_standard_slopes

            def standard(*args, **kwargs):
                return numpy_alibi_standard_slopes(*args, **kwargs)

            def given(*args, **kwargs):
                return numpy_alibi(*args, **kwargs)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, _ = verify(capsys, "wrapped:standard", *SMALL)
    assert code == 0 and "slopes=standard" in out, out
    code, out, _ = verify(capsys, "wrapped:given", *SMALL)
    assert code == 0 and "slopes=given" in out, out


def test_empty_rows_unspecified(capsys, tmp_path, monkeypatch):
    # a kernel leaving rows without an admissible key as NaN (HF leaves them unspecified)
    (tmp_path / "nan_rows_mod.py").write_text(
        textwrap.dedent(
            """
            import numpy as np
            from plsh_ref.testing.examples import numpy_alibi

            def nan_rows(query, key, value, *, slopes, causal, scale, query_positions,
                         key_positions, attention_mask=None):
                out, lse = numpy_alibi(query, key, value, slopes=slopes, causal=causal,
                                       scale=scale, query_positions=query_positions,
                                       key_positions=key_positions,
                                       attention_mask=attention_mask)
                return np.where(np.isneginf(lse)[..., None], np.nan, out).astype(query.dtype)

            nan_rows.supports = {"empty_rows": False}
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, _ = verify(capsys, "nan_rows_mod:nan_rows", *SMALL, "-v")
    assert code == 0, out
    assert "  battery longer_queries pass" in out  # runs, its empty rows not compared
    assert "  no_keys: empty_rows" in out  # nothing left to compare: not covered
    import nan_rows_mod

    nan_rows_mod.nan_rows.supports = {}  # negative control
    code, out, _ = verify(capsys, "nan_rows_mod:nan_rows", *SMALL)
    assert code == 1 and "longer_queries: output contains NaN" in out


def test_shared_positions_only_kernel_still_gets_padded_batches():
    # declaring batch_positions False dropped every padded case (padding needs the mask)
    from plsh_ref.testing.battery import battery_plan
    from plsh_ref.testing.capabilities import effective_capabilities, required_capabilities
    from plsh_ref.testing.examples import numpy_alibi
    from plsh_ref.testing.problems import ProblemSpec

    padded = ProblemSpec(positions="padded", pad=3, batch=2)
    assert "batch_positions" not in required_capabilities(padded)
    assert "attention_mask" in required_capabilities(padded)

    def kernel(
        query,
        key,
        value,
        *,
        slopes,
        causal,
        scale,
        query_positions,
        key_positions,
        attention_mask=None,
    ):
        return numpy_alibi(
            query,
            key,
            value,
            slopes=slopes,
            causal=causal,
            scale=scale,
            query_positions=query_positions,
            key_positions=key_positions,
            attention_mask=attention_mask,
        )

    kernel.supports = {"batch_positions": False}
    cases, not_covered = battery_plan(capabilities=effective_capabilities(kernel))
    names = {n for n, _ in cases}
    assert {"left_padding_masked", "bidirectional_padded", "right_padding"} <= names
    assert [nc.reason for nc in not_covered if nc.name == "per_sequence_positions"] == [
        "batch_positions"
    ]


def test_junitxml_path_is_checked_before_any_case(capsys):
    # "--junitxml /proc/x" ran every case, then failed writing (root may write to /proc
    # by its permission bits; only a real probe sees it cannot)
    code, out, err = verify(
        capsys,
        f"{EX}:numpy_alibi",
        "--no-battery",
        "--cases",
        "2",
        "--junitxml",
        "/proc/plsh-verify.xml",
    )
    assert code == 2 and out == "", out
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("plsh verify: error: --junitxml: "), err


@pytest.mark.parametrize("option", ["--json", "--junitxml"])
def test_a_report_that_cannot_be_written_names_its_own_option(
    capsys, tmp_path, monkeypatch, option
):
    # the message said "--json/--junitxml" whichever report failed
    def refuse(*args, **kwargs):
        raise OSError(28, "No space left on device")

    if option == "--json":
        monkeypatch.setattr(json, "dump", refuse)
    else:
        monkeypatch.setattr(ET.ElementTree, "write", refuse)
    path = tmp_path / "report"
    code, _, err = verify(
        capsys,
        f"{EX}:numpy_alibi",
        "--no-battery",
        "--cases",
        "1",
        "--long-cases",
        "0",
        "--dtypes",
        "float64",
        option,
        str(path),
    )
    assert code == 2, err
    assert err.startswith(f"plsh verify: error: {option}: cannot write the report: "), err
    other = "--junitxml" if option == "--json" else "--json"
    assert other not in err, err


def test_spec_past_max_memory_is_refused_before_the_run(capsys):
    # a --spec case ignored --max-memory and started allocating; --max-seq-len was refused
    spec = '{"n_q": 1000, "n_k": 2000, "batch": 2}'
    code, out, err = verify(
        capsys,
        f"{EX}:numpy_alibi",
        "--no-battery",
        "--cases",
        "0",
        "--long-cases",
        "0",
        "--max-memory",
        "0.1",
        "--spec",
        spec,
    )
    assert code == 2 and out == "", out
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("plsh verify: error: --spec: custom_0 (alibi float32 B=2 H=2 "), err
    assert "more than --max-memory 0.1 GiB" in err, err
    # negative control: the same case within the limit runs (its estimate is 0.36 GiB)
    code, out, err = verify(
        capsys,
        f"{EX}:numpy_alibi",
        "--no-battery",
        "--cases",
        "0",
        "--long-cases",
        "0",
        "--max-memory",
        "0.5",
        "--spec",
        spec,
    )
    assert code == 0, out + err


def test_not_covered_count_of_the_summary_is_the_verdicts(capsys):
    # the summary counted the opt-in packed_varlen ("not covered (5; ...)"), the verdict
    # did not ("PASS (4 battery cases not covered)")
    code, out, _ = verify(
        capsys,
        f"{EX}:numpy_alibi",
        "--unsupported",
        "gqa",
        "--cases",
        "1",
        "--long-cases",
        "0",
        "--dtypes",
        "float64",
    )
    assert code == 0, out
    listed = re.search(r"^battery cases not covered \((\d+); excluded by\):$", out, re.M)
    verdict = re.search(r"^PASS \((\d+) battery cases not covered\)$", out, re.M)
    assert listed and verdict, out
    assert listed.group(1) == verdict.group(1) == "2", out  # gqa_grouped, gqa_single_kv
    block = out[listed.end() : out.index("PASS (")]
    assert "  gqa_grouped: gqa" in block and "  gqa_single_kv: gqa" in block
    # the opt-in convention is listed apart, not counted
    assert re.search(r"^opt-in conventions not covered \(1; .*\n  packed_varlen: ", out, re.M)
