"""Acceptance matrix of the conventions: a correct kernel for each convention (encoder,
decode-only, square-only, causal-only, fixed scale, tensor-parallel head slices, packed
varlen, no right padding) passes its default run, and each seeded convention bug is
caught by the battery case named after it on each of 5 seeds, at default options (the
battery is restricted to the kernel's capabilities exactly as `plsh verify` does it)."""

from __future__ import annotations

import json
import time

import _alibi_kernels as K
import pytest

from plsh_ref.cli import main
from plsh_ref.testing.battery import battery_plan
from plsh_ref.testing.capabilities import effective_capabilities
from plsh_ref.testing.suite import check_case, slope_mode

SEEDS = range(5)
TORCH_DTYPES = ("float16", "bfloat16", "float32")


def _battery_results(kernel, seed, dtypes=("float16", "float32", "float64"), framework="numpy"):
    slopes = slope_mode(kernel)
    caps = effective_capabilities(kernel, slopes=slopes)
    cases, _ = battery_plan(seed=seed, dtypes=dtypes, slopes=slopes, capabilities=caps)
    return {
        name: check_case(kernel, spec.build(), framework=framework, slopes=slopes)
        for name, spec in cases
    }


@pytest.mark.parametrize("bug", sorted(K.CONVENTION_BUGS))
def test_every_convention_bug_is_caught_by_its_battery_case_on_every_seed(bug):
    kernel, case = K.CONVENTION_BUGS[bug]
    slopes = slope_mode(kernel)
    caps = effective_capabilities(kernel, slopes=slopes)
    for seed in SEEDS:
        cases = dict(battery_plan(seed=seed, slopes=slopes, capabilities=caps)[0])
        assert case in cases, (bug, seed, sorted(cases))  # covered for this kernel
        result = check_case(kernel, cases[case].build(), slopes=slopes)
        assert result.status == "FAIL", (bug, seed, result)


def test_convention_correct_kernels_pass_the_battery_on_every_seed():
    # seed 0 of every correct kernel runs in the full default runs below; seeds 1-4 here
    # for the kernels of the new battery cases (each battery costs about 0.4 s of CPU)
    names = ["correct_tensor_parallel", "correct_varlen", "correct_encoder"]
    names += ["correct_no_right_padding"]
    for name in names:
        kernel = getattr(K, name)
        for seed in range(1, 5):
            bad = {n: r.message for n, r in _battery_results(kernel, seed).items() if not r.passed}
            assert bad == {}, (name, seed, bad)


def _verify_json(tmp_path, target, *args):
    report = tmp_path / "report.json"
    start = time.perf_counter()
    code = main(["verify", target, "--json", str(report), *args])
    return code, json.loads(report.read_text()), time.perf_counter() - start


@pytest.mark.parametrize("name", K.CONVENTION_CORRECT)
def test_convention_correct_kernels_pass_a_full_default_run(tmp_path, capsys, name):
    code, report, seconds = _verify_json(tmp_path, f"_alibi_kernels:{name}")
    out = capsys.readouterr().out
    assert code == 0 and report["failed"] == 0 and report["skipped"] == 0, out
    # drawn within the capabilities, not drawn and skipped: a full run
    assert sum(c["group"] == "random" for c in report["cases"]) >= 50, out
    assert sum(c["battery"] for c in report["cases"]) >= 20, out
    assert seconds < 60, seconds


def test_index_only_encoder_gets_a_full_run_restricted_to_what_it_supports(tmp_path, capsys):
    code, report, _ = _verify_json(tmp_path, "_alibi_kernels:correct_encoder")
    specs = [c["spec"] for c in report["cases"]]
    assert code == 0 and all(not s["causal"] for s in specs)
    assert all(
        s["positions"] in ("default", "padded", "right_padded") and s["offset"] == 0 for s in specs
    )
    not_covered = {nc["name"]: nc["reason"] for nc in report["not_covered"]}
    assert not_covered["positions_with_gaps"] == "positions"
    assert not_covered["longer_queries"] == "causal"
    # negative control: the same kernel without its declarations fails the causal cases
    kernel = K.correct_encoder
    assert kernel.supports == {"causal": False, "positions": False}


def test_causal_option_restricts_the_battery(tmp_path, capsys):
    # a causal-only kernel run with --causal yes got the bidirectional battery cases
    code, report, _ = _verify_json(
        tmp_path, "_alibi_kernels:correct_causal_only", "--causal", "yes", "--cases", "5"
    )
    assert code == 0
    assert all(c["spec"]["causal"] for c in report["cases"])
    reasons = {nc["name"]: nc["reason"] for nc in report["not_covered"]}
    assert reasons["bidirectional"] == reasons["bidirectional_padded"] == "--causal"


@pytest.mark.parametrize(
    "kernel",
    ["torch_arange_positions_in_input_dtype", "torch_mj_bias_in_input_dtype"],
)
def test_half_precision_position_arithmetic_is_caught_on_every_seed(kernel):
    """Index-only torch kernels doing positions or m * j in the model dtype: the long
    default-position half-precision cases catch them on every seed, with the class named."""
    pytest.importorskip("torch")
    fn = getattr(K, kernel)
    caps = effective_capabilities(fn)
    for seed in SEEDS:
        cases = dict(battery_plan(seed=seed, dtypes=TORCH_DTYPES, capabilities=caps)[0])
        spec = cases["sequence_longer_than_256_bfloat16"]
        r = check_case(fn, spec.build(), framework="torch")
        assert r.status == "FAIL" and "half-precision position arithmetic" in r.message, (
            seed,
            r,
        )


def test_half_precision_position_bug_fails_a_full_default_run(tmp_path, capsys):
    pytest.importorskip("torch")
    code, report, seconds = _verify_json(
        tmp_path, "_alibi_kernels:torch_arange_positions_in_input_dtype"
    )
    out = capsys.readouterr().out
    assert code == 1, out
    failed = {c["case"]: c["message"] for c in report["cases"] if c["status"] == "FAIL"}
    assert "half-precision position arithmetic" in failed["sequence_longer_than_256_bfloat16"]
    assert "sequence_longer_than_256_bfloat16: half-precision position arithmetic" in out
    assert seconds < 60, seconds
