"""Float64 problems are judged against a reference more exact than float64.

A correct float64 kernel (``examples/test_my_kernel.py``) must pass every problem of a fixed
derandomized set; judged against the float64 reference it failed some of them (its own
rounding exceeded the 4-ulp floor the yardstick leaves), and a kernel with a real error of
200 ulps must still fail. Verdicts on float32/float16 problems are those of the float64
reference, exactly.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect

import _paths
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from plsh_ref import attention as A
from plsh_ref.attention import alibi_attention, plsh_attention
from plsh_ref.mp_attention import alibi_attention_mp, plsh_attention_mp
from plsh_ref.testing import reference as R
from plsh_ref.testing.problems import ProblemSpec
from plsh_ref.testing.strategies import problem_specs
from plsh_ref.testing.suite import check_case

extended = pytest.mark.skipif(
    not A.EXTENDED_AVAILABLE, reason="numpy.longdouble is float64 on this platform"
)


def _example_kernel():
    """``my_alibi_kernel`` of examples/test_my_kernel.py, a user's correct float64 kernel."""
    path = _paths.ROOT / "examples" / "test_my_kernel.py"
    spec = importlib.util.spec_from_file_location("_plsh_example_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.my_alibi_kernel


@functools.cache
def _fixed_problems(dtype: str, count: int) -> tuple:
    """``count`` derandomized ``problem_specs("alibi")`` problems of ``dtype`` (the same set on
    every run of one Hypothesis version)."""
    specs = []

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(problem_specs("alibi", dtypes=[dtype]))
    def collect(spec):
        specs.append(spec)

    collect()
    return tuple(spec.build() for spec in specs)


def _float64_reference(monkeypatch):
    """Judge with the float64 reference, as before extended precision."""
    monkeypatch.setattr(R, "reference_precision", lambda query, precision="auto": "float64")


def _verdicts(kernel, problems):
    results = [check_case(kernel, p) for p in problems]
    ran = [r for r in results if not r.skipped]
    return results, len(ran), [r.message for r in ran if not r.passed]


def test_reference_precision_by_dtype():
    assert R.reference_precision(np.zeros(2)) == "extended"
    assert R.reference_precision([1.0, 2.0]) == "extended"
    for dtype in (np.float32, np.float16):
        assert R.reference_precision(np.zeros(2, dtype)) == "float64"

    class TorchLike:
        dtype = "torch.float64"

    assert R.reference_precision(TorchLike()) == "extended"
    TorchLike.dtype = "torch.bfloat16"
    assert R.reference_precision(TorchLike()) == "float64"
    assert R.reference_precision(np.zeros(2), "float64") == "float64"
    assert R.reference_precision(np.zeros(2, np.float32), "extended") == "extended"
    with pytest.raises(ValueError, match=r"^precision: must be one of \('auto', 'float64'"):
        R.reference_precision(np.zeros(2), "double")


@extended
def test_example_kernel_passes_float64_problems():
    problems = _fixed_problems("float64", 600)
    _, ran, failures = _verdicts(_example_kernel(), problems)
    assert ran >= 600 and not failures, failures[:3]


@extended
def test_example_kernel_failed_them_against_the_float64_reference(monkeypatch):
    # negative control: the same set judged against the float64 reference (measured
    # 2026-12-02: 10 of 600 fail; the lead's set of 600 other problems: 18)
    problems = _fixed_problems("float64", 600)
    _float64_reference(monkeypatch)
    _, ran, failures = _verdicts(_example_kernel(), problems)
    assert ran >= 600 and failures
    assert all(m.startswith(("output error", "lse error")) for m in failures), failures


@extended
def test_a_real_error_of_200_ulps_still_fails():
    kernel = _example_kernel()

    def off_by_200_ulps(query, key, value, **kwargs):
        out = kernel(query, key, value, **kwargs)
        return out + 200 * 2.0**-52 * np.abs(out).max(initial=0.0)  # every entry

    off_by_200_ulps.__signature__ = inspect.signature(kernel)
    problems = _fixed_problems("float64", 600)[:200]
    results, ran, failures = _verdicts(off_by_200_ulps, problems)
    # every problem with a nonzero output fails (the allowed error was at most 25 ulps)
    nonzero = [
        not r.skipped and bool(np.abs(p.reference()[0]).max(initial=0.0) > 0)
        for r, p in zip(results, problems)
    ]
    assert sum(nonzero) >= 150
    assert [not r.passed for r, nz in zip(results, nonzero) if nz] == [True] * sum(nonzero)


@pytest.mark.parametrize("dtype, count", [("float32", 100), ("float16", 60)])
def test_lower_dtypes_judged_as_before(monkeypatch, dtype, count):
    problems = _fixed_problems(dtype, count)
    kernel = _example_kernel()
    now, ran, failures = _verdicts(kernel, problems)
    assert ran >= count // 2 and not failures, failures[:3]
    _float64_reference(monkeypatch)
    before, _, _ = _verdicts(kernel, problems)
    # the same reference, bit for bit: the same errors, allowed errors and verdicts (repr:
    # exact float digits, and a skipped case's nan error compares equal)
    assert [repr(r) for r in now] == [repr(r) for r in before]


def _small_float64_problem(kind):
    return ProblemSpec(
        kind=kind, dtype="float64", num_heads=2, num_heads_kv=1, n_q=3, n_k=5, data_seed=4
    ).build()


@pytest.mark.parametrize("kind", ["alibi", "plsh"])
def test_without_a_wide_longdouble_small_problems_use_mpmath(monkeypatch, kind):
    # a platform whose longdouble is float64 (Windows, macOS on Apple silicon)
    monkeypatch.setattr(A, "EXTENDED_AVAILABLE", False)
    p = _small_float64_problem(kind)
    kw = p.kernel_kwargs()
    kw.pop("attention_mask")
    if kind == "alibi":
        mp = alibi_attention_mp(p.query, p.key, p.value, **kw, return_lse=True, dps=30)
    else:
        mp = plsh_attention_mp(p.query, p.key, p.value, **kw, return_lse=True, dps=30)
    for got, want in zip(p.reference(), mp):
        np.testing.assert_array_equal(got, want.astype(np.float64))


def test_without_a_wide_longdouble_large_problems_use_float64(monkeypatch):
    monkeypatch.setattr(A, "EXTENDED_AVAILABLE", False)
    monkeypatch.setattr(R, "MP_FALLBACK_WORK", 10)  # the small problem counts as large
    p = _small_float64_problem("alibi")
    kw = p.kernel_kwargs()
    for got, want in zip(
        p.reference(), alibi_attention(p.query, p.key, p.value, **kw, return_lse=True)
    ):
        np.testing.assert_array_equal(got, want)
    p = _small_float64_problem("plsh")
    for got, want in zip(
        p.reference(), plsh_attention(p.query, p.key, p.value, **p.kernel_kwargs(), return_lse=True)
    ):
        np.testing.assert_array_equal(got, want)
