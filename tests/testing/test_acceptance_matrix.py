"""Acceptance matrix of the validation toolkit: correct kernels raise no false
alarm, every seeded bug class is caught at default options on each of 5 seeds, and each
kernel is verified in well under 60 s at defaults.

Seeds 1-4 run the edge battery only (it is part of every default run, so a battery
failure fails the default run too); seed 0 runs the whole default `plsh verify`.
"""

from __future__ import annotations

import json
import time

import _alibi_kernels as K
import pytest

from plsh_ref.cli import main
from plsh_ref.testing import examples
from plsh_ref.testing.battery import battery, battery_plan
from plsh_ref.testing.capabilities import effective_capabilities
from plsh_ref.testing.suite import check_case, slope_mode

SEEDS = range(5)


def _battery_failures(kernel, kind="alibi", seed=0):
    # the battery restricted to the kernel's capabilities, as `plsh verify` runs it
    slopes = "given" if kind == "plsh" else slope_mode(kernel)
    caps = effective_capabilities(kernel, slopes=slopes)
    cases, _ = battery_plan(kind, seed=seed, slopes=slopes, capabilities=caps)
    return [name for name, spec in cases if not check_case(kernel, spec.build()).passed]


def _battery_case(kernel, case, seed):
    """One named case of the battery as `plsh verify` runs it for ``kernel`` (only that
    case is run: the claim is about it, and the long cases cost most of the battery)."""
    slopes = slope_mode(kernel)
    caps = effective_capabilities(kernel, slopes=slopes)
    return dict(battery_plan(seed=seed, slopes=slopes, capabilities=caps)[0])[case]


@pytest.mark.parametrize("bug", sorted(K.BROKEN))
def test_every_bug_class_is_caught_by_its_battery_case_on_every_seed(bug):
    kernel, case = K.BROKEN[bug]
    for seed in SEEDS:
        result = check_case(kernel, _battery_case(kernel, case, seed).build())
        assert result.status == "FAIL", (bug, seed, result)


@pytest.mark.parametrize("kernel", ["averaged_plsh", "mask_only_plsh"])
def test_plsh_bug_classes_are_caught_on_every_seed(kernel):
    for seed in SEEDS:
        assert _battery_failures(getattr(examples, kernel), "plsh", seed), seed


@pytest.mark.parametrize(
    "kernel",
    [
        K.CORRECT["correct_given"],
        K.CORRECT["correct_standard"],
        examples.numpy_alibi,
        examples.numpy_alibi_standard_slopes,
    ],
    ids=lambda k: k.__name__,
)
def test_correct_kernels_pass_the_battery_on_every_seed(kernel):
    for seed in SEEDS:
        assert _battery_failures(kernel, seed=seed) == [], seed


def _verify_json(tmp_path, target, *args):
    report = tmp_path / "report.json"
    start = time.perf_counter()
    code = main(["verify", target, "--json", str(report), *args])
    seconds = time.perf_counter() - start
    return code, json.loads(report.read_text()), seconds


#: full default runs (battery + 50 random cases) for a few classes; the test above covers
#: every class on every seed through the battery, which every default run includes
FULL_RUNS = ["causal_top_left", "gqa_modulo", "nan_empty_rows", "positions_bf16", "ignores_mask"]


@pytest.mark.parametrize("bug", FULL_RUNS)
def test_default_run_fails_broken_kernels_and_names_the_bug_class(tmp_path, capsys, bug):
    kernel, case = K.BROKEN[bug]
    code, report, seconds = _verify_json(tmp_path, f"_alibi_kernels:{bug}")
    assert code == 1 and report["failed"] > 0
    failed = {c["case"] for c in report["cases"] if c["status"] == "FAIL"}
    assert case in failed
    assert report["shared_axes"], "the report says what the failures share"
    assert seconds < 60, seconds  # measured on 2 shared cores: well under a second of cases


@pytest.mark.parametrize("name", sorted(K.CORRECT))
def test_default_run_passes_correct_kernels(tmp_path, capsys, name):
    code, report, seconds = _verify_json(tmp_path, f"_alibi_kernels:{name}")
    assert code == 0 and report["failed"] == 0 and report["skipped"] == 0, report
    assert report["passed"] == len(report["cases"]) >= 50 + 30
    assert seconds < 60, seconds


def test_torch_positions_in_the_input_dtype_are_caught_on_every_seed():
    """A torch kernel casting positions to the input dtype is exact in float32; the
    bfloat16 battery cases with positions beyond 256 catch it on every seed."""
    pytest.importorskip("torch")
    dtypes = ("float16", "bfloat16", "float32")
    kernel = K.torch_positions_in_input_dtype
    wanted = ("positions_beyond_256_bfloat16", "positions_far_from_zero_bfloat16")
    wanted += ("positions_beyond_256",)
    for seed in SEEDS:
        results = {
            name: check_case(kernel, spec.build(), framework="torch")
            for name, spec in battery(seed=seed, dtypes=dtypes)
            if name in wanted
        }
        failed = [name for name, r in results.items() if r.status == "FAIL"]
        assert "positions_beyond_256_bfloat16" in failed, (seed, failed)
        assert "positions_far_from_zero_bfloat16" in failed
        assert "positions_beyond_256" not in failed  # float32 positions are exact there
