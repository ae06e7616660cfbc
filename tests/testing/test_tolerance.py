"""The SPEC section 6 tolerance helper (plsh_ref.testing.tolerance)."""

from __future__ import annotations

import numpy as np
import pytest

from plsh_ref.testing.tolerance import (
    allowed_error,
    assert_close_to_reference,
    dtype_eps,
    max_error,
)


def test_dtype_eps_names():
    assert dtype_eps("float16") == 2.0**-10
    assert dtype_eps("torch.bfloat16") == 2.0**-7
    assert dtype_eps(np.float32) == 2.0**-23
    assert dtype_eps(1e-3) == 1e-3
    with pytest.raises(ValueError, match="^dtype"):
        dtype_eps("int8")


def test_max_error_handles_infinities_and_nan():
    ref = np.array([1.0, -np.inf, 2.0])
    assert max_error(np.array([1.0, -np.inf, 2.5]), ref) == (0.5, (2,))
    assert max_error(np.array([1.0, 0.0, 2.0]), ref)[0] == np.inf  # -inf row not matched
    assert max_error(np.array([np.nan, -np.inf, 2.0]), ref) == (np.inf, (0,))
    with pytest.raises(ValueError, match="^out"):
        max_error(np.zeros(2), ref)


def test_rule_is_twice_the_baseline_error_plus_floor():
    ref = np.array([[0.5, -2.0]])
    baseline = ref + np.array([[1e-3, 0.0]])
    floor = 4 * 2.0**-10 * 2.0
    assert allowed_error(ref, baseline, "float16") == pytest.approx(2e-3 + floor)
    assert_close_to_reference(ref + 2e-3 + 0.9 * floor, ref, baseline, "float16")
    with pytest.raises(AssertionError, match=r"worst at \(0, 0\)"):
        assert_close_to_reference(ref + [[2e-3 + 1.1 * floor, 0.0]], ref, baseline, "float16")


def test_floor_scale_override():
    ref = np.zeros(3)
    with pytest.raises(AssertionError):
        assert_close_to_reference(np.full(3, 1e-8), ref, ref, "float32")
    assert_close_to_reference(np.full(3, 1e-8), ref, ref, "float32", floor_scale=1.0)
