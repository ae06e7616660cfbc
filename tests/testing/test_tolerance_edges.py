"""plsh_ref.testing.tolerance: the SPEC section 6 bound pinned to its exact value.

``allowed = factor * max|baseline - ref| + floor_ulps * eps(dtype) * max|ref|``: each
term is checked by an exact binary64 value (not by an inequality a looser bound also
meets), and the assertion at equality (passes) and one ulp above (fails).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from plsh_ref.testing import tolerance as T


def test_eps_table_is_the_machine_epsilons():
    assert T.EPS == {
        "float16": float(np.finfo(np.float16).eps),
        "bfloat16": 2.0**-7,
        "float32": float(np.finfo(np.float32).eps),
        "float64": float(np.finfo(np.float64).eps),
    }


class _TorchDtype:
    """Stands for a torch dtype: only its ``str`` is read."""

    def __init__(self, name):
        self.name = name

    def __str__(self):
        return "torch." + self.name


@pytest.mark.parametrize(
    "dtype, eps",
    [
        ("float16", 2.0**-10),
        ("torch.bfloat16", 2.0**-7),
        (_TorchDtype("float32"), 2.0**-23),
        (np.float16, 2.0**-10),
        (np.dtype("float32"), 2.0**-23),
        (float, 2.0**-52),
        (0.5, 0.5),
        (5e-324, 5e-324),
    ],
)
def test_dtype_eps(dtype, eps):
    assert T.dtype_eps(dtype) == eps


def test_dtype_eps_refusals():
    for bad in (0.0, 1.0, -0.5, math.nan):
        with pytest.raises(ValueError, match=r"^dtype: an epsilon must lie in \(0, 1\)"):
            T.dtype_eps(bad)
    for bad in ("int8", np.int32, "float8", object()):
        with pytest.raises(ValueError, match=r"^dtype: must be one of \['bfloat16', 'float16'"):
            T.dtype_eps(bad)


class _FakeTensor:
    def __init__(self, values, dtype):
        self.values = np.asarray(values)
        self.dtype = dtype
        self.calls = []

    def detach(self):
        self.calls.append("detach")
        return self

    def cpu(self):
        self.calls.append("cpu")
        return self

    def float(self):
        self.calls.append("float")
        return _FakeTensor(self.values.astype(np.float32), "torch.float32")

    def __array__(self, dtype=None, copy=None):
        if self.dtype == "torch.bfloat16":
            raise TypeError("numpy has no bfloat16")  # as torch: .float() must come first
        return self.values if dtype is None else self.values.astype(dtype)


def test_torch_like_inputs():
    bf16 = _FakeTensor([1.0, 2.0], "torch.bfloat16")
    assert T.max_error(bf16, [1.0, 2.5]) == (0.5, (1,))
    assert bf16.calls == ["detach", "cpu", "float"]
    f32 = _FakeTensor(np.array([1.0], dtype=np.float32), "torch.float32")
    assert T.max_error(f32, [1.0]) == (0.0, (0,))
    assert f32.calls == ["detach", "cpu"]


def test_only_real_numbers_are_compared():
    assert T.max_error(np.array([1, 2], dtype=np.int8), np.array([1, 5], dtype=np.uint8)) == (
        3.0,
        (1,),
    )
    for bad in (np.array([True]), np.array([1j]), np.array(["a"])):
        with pytest.raises(TypeError, match=r"^out: must be a real numeric array, got dtype "):
            T.max_error(bad, [1.0])
        with pytest.raises(TypeError, match=r"^ref: must be a real numeric array, got dtype "):
            T.max_error([1.0], bad)


def test_max_error_worst_index_and_infinities():
    ref = np.array([[0.0, 1.0, -np.inf], [2.0, np.inf, 3.0]])
    out = np.array([[0.25, 1.0, -np.inf], [2.0, np.inf, 2.0]])
    assert T.max_error(out, ref) == (1.0, (1, 2))  # matching infinities count 0
    assert T.max_error(out[:1], ref[:1]) == (0.25, (0, 0))
    bad_inf = out.copy()
    bad_inf[1, 1] = -np.inf  # -inf against +inf
    assert T.max_error(bad_inf, ref) == (math.inf, (1, 1))
    nan = out.copy()
    nan[0, 1] = np.nan
    assert T.max_error(nan, ref) == (math.inf, (0, 1))
    inf_out = out.copy()
    inf_out[1, 0] = np.inf  # infinite out against a finite ref
    assert T.max_error(inf_out, ref) == (math.inf, (1, 0))
    finite_out = out.copy()
    finite_out[0, 2] = -1e300  # finite out against an infinite ref
    assert T.max_error(finite_out, ref) == (math.inf, (0, 2))


def test_max_error_shapes():
    assert T.max_error(np.zeros((0, 3)), np.zeros((0, 3))) == (0.0, None)
    with pytest.raises(ValueError, match=r"^out: shape \(2,\) differs from ref shape \(3,\)$"):
        T.max_error(np.zeros(2), np.zeros(3))


def test_allowed_error_exact_value():
    ref = np.array([1.0, -3.0, -np.inf])
    baseline = np.array([1.5, -3.0, -np.inf])
    eps = 2.0**-23
    assert T.allowed_error(ref, baseline, "float32") == 2.0 * 0.5 + 4.0 * eps * 3.0
    assert T.allowed_error(ref, baseline, "float32", factor=3.0) == 3.0 * 0.5 + 4.0 * eps * 3.0
    assert T.allowed_error(ref, baseline, "float32", floor_ulps=1.0) == 2.0 * 0.5 + eps * 3.0
    assert T.allowed_error(ref, baseline, "float32", floor_scale=8.0) == 1.0 + 4.0 * eps * 8.0
    # a floor relative to 0 is a floor of 0 (not the default scale)
    assert T.allowed_error(ref, baseline, "float32", floor_scale=0.0) == 1.0
    # no finite entry: the floor is 0
    assert T.allowed_error([-np.inf], [-np.inf], "float16") == 0.0
    # the floor alone, from max |ref| (a negative entry)
    assert T.allowed_error([0.5, -2.0], [0.5, -2.0], "bfloat16") == 4.0 * 2.0**-7 * 2.0


def test_assertion_at_equality_and_one_ulp_above():
    ref = np.array([1.0, 2.0])
    baseline = np.array([1.0, 2.25])  # baseline error 0.25
    allowed = 2.0 * 0.25 + 4.0 * 2.0**-10 * 2.0
    at_edge = np.array([1.0, 2.0 + allowed])
    assert 2.0 + allowed - 2.0 == allowed  # the error is exactly `allowed`
    assert T.assert_close_to_reference(at_edge, ref, baseline, "float16") == 1.0
    above = np.array([1.0, np.nextafter(2.0 + allowed, np.inf)])
    with pytest.raises(AssertionError) as info:
        T.assert_close_to_reference(above, ref, baseline, "float16", name="lse")
    message = str(info.value)
    assert message.startswith("lse: max|out - ref| = ")
    assert f"> allowed {allowed:.3e} (2 x baseline error 2.500e-01 + 4 ulps of float16)" in message
    assert "worst at (1,): out=" in message
    assert re.search(r"ref=(np\.float64\()?2\.0\)?, baseline=(np\.float64\()?2\.25\)?$", message)


def test_assertion_ratio_and_options():
    ref = np.array([4.0])
    baseline = np.array([5.0])
    out = np.array([4.5])
    allowed = 3.0 * 1.0 + 2.0 * 2.0**-52 * 4.0
    ratio = T.assert_close_to_reference(out, ref, baseline, "float64", factor=3.0, floor_ulps=2.0)
    assert ratio == 0.5 / allowed
    ratio = T.assert_close_to_reference(out, ref, baseline, 0.125, factor=0.0, floor_scale=2.0)
    assert ratio == 0.5 / (4.0 * 0.125 * 2.0)
    with pytest.raises(
        AssertionError, match=r"^output: .*\(0 x baseline error 1\.000e\+00 \+ 1 ulps of 0\.25\)"
    ):
        T.assert_close_to_reference(
            out, ref, baseline, 0.25, factor=0.0, floor_ulps=1.0, floor_scale=1.0
        )
    # nothing allowed and nothing wrong: ratio 0
    assert T.assert_close_to_reference(ref, ref, ref, "float32", floor_scale=0.0) == 0.0
    # a NaN always fails, whatever the allowance
    with pytest.raises(AssertionError, match=r"^grad_query: max\|out - ref\| = inf"):
        T.assert_close_to_reference([np.nan], ref, baseline, "float16", name="grad_query")


def test_allowed_error_names_a_bad_reference():
    with pytest.raises(TypeError, match=r"^ref: must be a real numeric array, got dtype bool$"):
        T.allowed_error(np.array([True]), [1.0], "float32")


def test_infinities_compare_without_a_warning():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # inf - inf must not warn
        assert T.max_error([np.inf, -np.inf], [np.inf, -np.inf]) == (0.0, (0,))


def test_tensor_like_without_dtype_is_read():
    class NoDtype:
        def detach(self):
            return self

        def cpu(self):
            return self

        def __array__(self, dtype=None, copy=None):
            return np.array([2.0, 3.0])

    assert T.max_error(NoDtype(), [2.0, 3.5]) == (0.5, (1,))


def test_allowed_error_names_a_bad_baseline():
    # the yardstick is the baseline: its errors must not be reported as "out"
    with pytest.raises(TypeError, match=r"^baseline: must be a real numeric array, got dtype "):
        T.allowed_error([1.0], np.array(["a"]), "float32")
    with pytest.raises(ValueError, match=r"^baseline: shape \(2,\) differs from ref shape \(1,\)$"):
        T.allowed_error([1.0], [1.0, 2.0], "float32")
