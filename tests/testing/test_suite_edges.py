"""plsh_ref.testing.suite at its edges: the case result's ratio and status in every
branch, the capability rules of each problem, the kernel contract's refusals, and
check_case's verdicts and messages for kernels that are wrong in one precise way.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from plsh_ref.testing import suite as S
from plsh_ref.testing.examples import numpy_alibi, numpy_alibi_standard_slopes
from plsh_ref.testing.problems import ProblemSpec

INF = math.inf


# --- CaseResult -----------------------------------------------------------------------


def test_ratio_and_status_in_every_branch():
    R = S.CaseResult
    assert R(True, 1.0, 4.0).ratio == 0.25 and R(True, 1.0, 4.0).status == "pass"
    assert R(False, 5.0, 4.0).status == "FAIL"
    skip = R(False, math.nan, 0.0, skipped=True)
    assert skip.ratio == 0.0 and skip.status == "skip"
    assert R(False, INF, 1.0).ratio == INF
    assert R(False, math.nan, 1.0).ratio == INF
    assert R(True, 0.0, 0.0).ratio == 0.0  # nothing allowed, nothing wrong
    assert R(False, 1e-300, 0.0).ratio == INF
    assert R(True, 1.0, 2.0, lse_error=3.0, lse_allowed=1.0).ratio == 3.0
    assert R(True, 3.0, 2.0, lse_error=1.0, lse_allowed=4.0).ratio == 1.5
    assert R(False, 1.0, 2.0, lse_error=INF, lse_allowed=1.0).ratio == INF
    assert R(True, 1.0, 2.0, lse_error=0.0, lse_allowed=0.0).ratio == 0.5
    assert R(False, 1.0, 2.0, lse_error=1e-9, lse_allowed=0.0).ratio == INF
    # a failure reported by message only (e.g. lse -inf on the wrong rows)
    assert R(False, 1.0, 2.0, message="lse must be -inf exactly").ratio == INF
    assert R(False, 1.0, 2.0, message="output contains NaN at 1 entries").ratio == INF
    assert R(False, 1.0, 2.0, message="output error 3 > allowed 2").ratio == 0.5
    assert R(True, 1.0, 2.0, message="lse -inf note").ratio == 0.5  # passed: message ignored


# --- capabilities ----------------------------------------------------------------------


def test_kernel_capabilities():
    def kernel(query, key, value, **kw):
        return None

    caps = S.kernel_capabilities(kernel)
    assert set(caps) == set(S.CAPABILITIES) and all(caps.values())
    kernel.supports = {"gqa": False, "float16": np.bool_(False)}
    caps = S.kernel_capabilities(kernel, {"causal": False, "gqa": True})
    assert caps["gqa"] is True and caps["float16"] is False and caps["causal"] is False
    assert type(caps["float16"]) is bool
    assert caps["bidirectional"] is True
    with pytest.raises(
        S.KernelContractError, match=r"^supports: unknown capability 'flash'; known: causal, "
    ):
        S.kernel_capabilities(kernel, {"flash": True})
    with pytest.raises(
        S.KernelContractError, match=r"^supports: 'gqa' must be True or False, got int 0$"
    ):
        S.kernel_capabilities(kernel, {"gqa": 0})
    kernel.supports = None
    assert all(S.kernel_capabilities(kernel).values())
    assert set(S.CAPABILITIES) >= {"float16", "bfloat16", "float32", "float64", "lse"}


# --- the kernel contract ---------------------------------------------------------------


def test_load_kernel(tmp_path, monkeypatch):
    assert S.load_kernel("plsh_ref.testing.examples:numpy_alibi") is numpy_alibi
    for bad in ("nocolon", "a:b:c", ":f", "m:", 3):
        with pytest.raises(S.KernelContractError, match=r"^kernel: expected MODULE:FUNCTION, got "):
            S.load_kernel(bad)
    with pytest.raises(
        S.KernelContractError,
        match=r"^kernel: cannot import module 'no_such_mod_xyz': ModuleNotFoundError: No module named 'no_such_mod_xyz'$",
    ):
        S.load_kernel("no_such_mod_xyz:f")
    with pytest.raises(
        S.KernelContractError,
        match=r"^kernel: module 'plsh_ref.testing' has no attribute 'examples.nope'$",
    ):
        S.load_kernel("plsh_ref.testing:examples.nope")
    assert S.load_kernel("plsh_ref.testing:examples.numpy_alibi") is numpy_alibi
    with pytest.raises(
        S.KernelContractError,
        match=r"^kernel: plsh_ref.testing.suite:FRAMEWORKS is a tuple, not a function$",
    ):
        S.load_kernel("plsh_ref.testing.suite:FRAMEWORKS")
    (tmp_path / "my_kernel_in_cwd.py").write_text("def f(q, k, v, **kw):\n    return q\n")
    (tmp_path / "broken_kernel_mod.py").write_text("raise RuntimeError('boom\\nsecond line')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(S.sys, "path", [p for p in S.sys.path if p not in ("", str(tmp_path))])
    assert S.load_kernel("my_kernel_in_cwd:f").__name__ == "f"
    with pytest.raises(
        S.KernelContractError,
        match=r"^kernel: cannot import module 'broken_kernel_mod': RuntimeError: boom$",
    ):
        S.load_kernel("broken_kernel_mod:f")


def test_check_signature_and_slope_mode():
    def good(query, key, value, *, slopes, causal, scale, query_positions, key_positions):
        return None

    def masked(
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
        return None

    def standard(query, key, value, *, causal, scale, query_positions, key_positions):
        return None

    assert S.check_signature(good, "alibi") is False  # no attention_mask argument
    assert S.check_signature(masked, "alibi") is True
    assert S.check_signature(standard, "alibi", "standard") is False
    assert S.check_signature(max, "alibi") is True  # a builtin without a signature
    with pytest.raises(
        S.KernelContractError,
        match=r"does not match the alibi contract f\(query, key, value, \*, slopes, causal, scale, query_positions, key_positions\[, attention_mask\]\)",
    ):
        S.check_signature(standard, "alibi")
    with pytest.raises(S.KernelContractError, match=r"; it takes slopes: use --slopes given$"):
        S.check_signature(lambda q, k, v, *, slopes: None, "alibi", "standard")
    with pytest.raises(
        S.KernelContractError,
        match=r"the plsh contract f\(query, key, value, \*, partition, causal",
    ):
        S.check_signature(good, "plsh")
    with pytest.raises(ValueError, match=r"^kind: must be one of \('alibi', 'plsh'\), got 'x'$"):
        S.check_signature(good, "x")
    with pytest.raises(
        ValueError, match=r"^slopes: must be one of \('given', 'standard'\), got 'x'$"
    ):
        S.check_signature(good, "alibi", "x")
    assert S.slope_mode(good) == "given"
    assert S.slope_mode(standard) == "standard"
    assert S.slope_mode(lambda q, k, v, **kw: None) == "given"
    assert S.slope_mode(max) == "given"


# --- check_case ------------------------------------------------------------------------


def _problem(**changes):
    fields = dict(dtype="float64", num_heads=2, num_heads_kv=2, n_q=4, n_k=4)
    return ProblemSpec(**(fields | changes)).build()


def test_check_case_passes_the_reference_kernel():
    res = S.check_case(numpy_alibi, _problem())
    assert res.passed and res.status == "pass" and res.message == ""
    assert res.lse_error is not None and res.lse_error <= res.lse_allowed
    assert res.error <= res.allowed and res.empty_rows == 0
    res = S.check_case(numpy_alibi_standard_slopes, _problem())
    assert res.passed
    longer = S.check_case(numpy_alibi, _problem(n_q=6, n_k=2))
    # n_q = 6 > n_k = 2: query positions -4..1, rows -4..-1 have no key, in each of 2 heads
    assert longer.passed and longer.empty_rows == 2 * 4


def test_unsupported_cases_are_skipped_with_the_reason():
    def no_mask(query, key, value, *, slopes, causal, scale, query_positions, key_positions):
        raise AssertionError("never called")

    padded = ProblemSpec(dtype="float64", positions="padded", pad=2, batch=2).build()
    res = S.check_case(no_mask, padded)
    assert res.skipped and res.status == "skip" and not res.passed
    assert (
        res.message == "unsupported: attention_mask (the kernel takes no attention_mask argument)"
    )
    res = S.check_case(numpy_alibi, _problem(), supports={"float64": False, "causal": False})
    assert res.skipped and res.message == "unsupported: float64, causal"
    assert math.isnan(res.error) and res.allowed == 0.0


def _with_lse(query, key, value, **kw):
    from plsh_ref.testing.reference import alibi_reference

    return alibi_reference(query, key, value, **kw)


def _kernel(transform):
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
        out, lse = _with_lse(
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
        return transform(out.astype(query.dtype), lse)

    return kernel


def test_output_errors_are_located():
    def shifted(out, lse):
        out = out.copy()
        out[0, 1, 2, 3] += 1.0
        return out, lse

    res = S.check_case(_kernel(shifted), _problem())
    assert not res.passed and res.worst_index == (0, 1, 2, 3)
    assert res.message.startswith("output error 1 > allowed ") and res.message.endswith(
        " at (0, 1, 2, 3)"
    )
    assert res.error == pytest.approx(1.0, abs=1e-12)


def test_errors_on_rows_without_keys_are_named():
    def nonzero_empty(out, lse):
        out = out.copy()
        out[0, 0, 0] = 0.5  # n_q > n_k: row 0 has no admissible key
        return out, lse

    res = S.check_case(_kernel(nonzero_empty), _problem(n_q=6, n_k=2))
    assert "(a row without admissible keys: expected output 0)" in res.message

    def nan_empty(out, lse):
        out = out.copy()
        out[0, :, :4] = np.nan  # rows 0..3 have no key (n_k = 2, positions -4..1)
        return out, lse

    res = S.check_case(_kernel(nan_empty), _problem(n_q=6, n_k=2))
    assert res.message == (
        "output contains NaN at 32 entries, first (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2)"
        " (all on rows without admissible keys: expected output 0)"
    )
    assert res.ratio == INF

    def nan_mixed(out, lse):
        out = out.copy()
        out[0, 0, 3:5, 0] = np.nan  # row 3 empty, row 4 not
        return out, lse

    res = S.check_case(_kernel(nan_mixed), _problem(n_q=6, n_k=2))
    assert res.message.endswith(" (1 of 2 rows without admissible keys)")

    def nan_full(out, lse):
        out = out.copy()
        out[0, 0, 1, 0] = np.nan
        return out, lse

    res = S.check_case(_kernel(nan_full), _problem())
    assert res.message.endswith(" (on rows with admissible keys)")


def test_lse_checks():
    def finite_lse_on_empty_row(out, lse):
        lse = lse.copy()
        lse[0, 1, 0] = 0.0
        return out, lse

    res = S.check_case(_kernel(finite_lse_on_empty_row), _problem(n_q=6, n_k=2))
    assert (
        "lse must be -inf on rows without admissible keys (1 of them are not; first at (0, 1, 0): got 0.0)"
        in res.message
    )
    assert "have admissible keys" not in res.message and not res.passed

    def neginf_lse_on_a_row_with_keys(out, lse):
        lse = lse.copy()
        lse[0, 1, 5] = -np.inf  # query 5 of 6 sees both keys
        return out, lse

    # the opposite case reads as itself, not as "must be -inf on rows without keys"
    res = S.check_case(_kernel(neginf_lse_on_a_row_with_keys), _problem(n_q=6, n_k=2))
    ref_lse = _problem(n_q=6, n_k=2).reference()[1]
    assert res.message.startswith(
        "lse is -inf on rows that have admissible keys (1 of them; first at (0, 1, 5): "
        f"expected {ref_lse[0, 1, 5]})"
    )
    assert "without admissible keys" not in res.message and not res.passed

    def bad_lse(out, lse):
        return out, lse + 1.0

    res = S.check_case(_kernel(bad_lse), _problem())
    assert res.message.startswith("lse error 1 > allowed ") and not res.passed
    # declaring lse unsupported skips the LSE comparison only
    res = S.check_case(_kernel(bad_lse), _problem(), supports={"lse": False})
    assert res.passed and res.lse_error is None

    def out_only(out, lse):
        return out

    res = S.check_case(_kernel(out_only), _problem())
    assert res.passed and res.lse_error is None and res.lse_allowed is None


def test_contract_violations_raise():
    for transform, message in [
        (
            lambda o, l: (o, l, l),
            r"^kernel: returned a tuple of length 3; expected output or \(output, lse\)$",
        ),
        (
            lambda o, l: {"out": o},
            r"^kernel: returned output of type dict; expected numpy.ndarray$",
        ),
        (
            lambda o, l: (o, l.tolist()),
            r"^kernel: returned lse of type list; expected numpy.ndarray$",
        ),
        (
            lambda o, l: o[..., :1],
            r"^kernel: output has shape \(1, 2, 4, 1\), expected \(1, 2, 4, 4\) \(batch, num_heads, n_q, head_dim_v\)$",
        ),
        (
            lambda o, l: o.astype(np.float32),
            r"^kernel: output has dtype float32, expected the input dtype float64$",
        ),
        (
            lambda o, l: (o, l[..., :2]),
            r"^kernel: lse has shape \(1, 2, 2\), expected \(1, 2, 4\) \(batch, num_heads, n_q\)$",
        ),
        (lambda o, l: (o, l.astype(np.int64)), r"^kernel: lse has dtype int64, expected floating$"),
    ]:
        with pytest.raises(S.KernelContractError, match=message):
            S.check_case(_kernel(transform), _problem())
    res = S.check_case(_kernel(lambda o, l: [o, l]), _problem())
    assert res.passed  # a list of two is (output, lse)


def test_exceptions_and_timeouts_are_reported():
    def raising(query, key, value, **kw):
        raise RuntimeError("first line\nsecond line")

    res = S.check_case(raising, _problem())
    assert not res.passed and res.message == "raised RuntimeError: first line"
    assert "RuntimeError" in res.traceback and math.isnan(res.error)

    def silent(query, key, value, **kw):
        raise KeyError()

    assert S.check_case(silent, _problem()).message == "raised KeyError: "

    def slow(query, key, value, **kw):
        time.sleep(2.0)
        return numpy_alibi(query, key, value, **kw)

    res = S.check_case(slow, _problem(), timeout=0.05)
    assert res.message == "timed out: no result after 0.05 s (--timeout)" and res.traceback == ""

    def raises_timeout(query, key, value, **kw):
        raise TimeoutError("own timeout")

    res = S.check_case(raises_timeout, _problem(), timeout=5.0)
    assert res.message == "raised TimeoutError: own timeout"  # the kernel's own, with a traceback
    res = S.check_case(numpy_alibi, _problem(), timeout=30.0)
    assert res.passed


def test_detect_framework():
    assert S.detect_framework(numpy_alibi, "alibi", "given", True) == "numpy"

    def lists(query, key, value, **kw):
        return [1.0]

    with pytest.raises(
        S.KernelContractError,
        match=r"^framework: cannot tell what the kernel takes \(with numpy inputs it returned a float",
    ):
        S.detect_framework(lists, "alibi", "given", True)

    def raising(query, key, value, **kw):
        raise ValueError("nope\nmore")

    with pytest.raises(
        S.KernelContractError, match=r"with numpy inputs it raised ValueError: nope[;)]"
    ):
        S.detect_framework(raising, "alibi", "given", True)
