"""plsh_ref.validation: every refusal threshold at equality, both sides, with its message.

A check that refuses ``value < minimum`` must accept ``minimum`` itself and refuse the
next value down; each limit is tested at the edge, and each message starts with the
argument's name (CONTRIBUTING.md).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from plsh_ref import validation as V
from plsh_ref.alibi import alibi_slopes, check_slopes
from plsh_ref.partition import PartitionSample, check_partition

TINY = 5e-324  # the smallest positive binary64 number


# --- check_int -----------------------------------------------------------------------


def test_check_int_limits_are_inclusive():
    assert V.check_int("n", 3, minimum=3) == 3
    assert V.check_int("n", 7, maximum=7) == 7
    assert V.check_int("n", 5, minimum=5, maximum=5) == 5
    with pytest.raises(ValueError, match=r"^n: must be >= 3, got 2$"):
        V.check_int("n", 2, minimum=3)
    with pytest.raises(ValueError, match=r"^n: must be <= 7, got 8$"):
        V.check_int("n", 8, maximum=7)


def test_check_int_zero_limits_are_limits():
    # a limit of 0 is a limit (not "no limit")
    with pytest.raises(ValueError, match=r"^n: must be >= 0, got -1$"):
        V.check_int("n", -1, minimum=0)
    with pytest.raises(ValueError, match=r"^n: must be <= 0, got 1$"):
        V.check_int("n", 1, maximum=0)
    assert V.check_int("n", -(10**30)) == -(10**30)  # no limits given: none applied


def test_check_int_types():
    value = V.check_int("n", np.int64(4), minimum=1)
    assert value == 4 and type(value) is int
    for bad in (True, np.bool_(False), 3.0, "3", None):
        with pytest.raises(TypeError, match=r"^n: must be an integer, got "):
            V.check_int("n", bad)


# --- check_bool ----------------------------------------------------------------------


def test_check_bool():
    assert V.check_bool("causal", True) is True
    out = V.check_bool("causal", np.bool_(False))
    assert out is False
    for bad in (1, 0, "no", None, 1.0):
        with pytest.raises(TypeError, match=r"^causal: must be a bool, got "):
            V.check_bool("causal", bad)


# --- check_positive_float / check_probability ------------------------------------------


def test_check_positive_float_edge_of_zero():
    assert V.check_positive_float("x", TINY) == TINY
    with pytest.raises(ValueError, match=r"^x: must be finite and > 0, got 0.0$"):
        V.check_positive_float("x", 0)
    with pytest.raises(ValueError, match=r"^x: must be finite and > 0, got -5e-324$"):
        V.check_positive_float("x", -TINY)
    for bad in (math.inf, math.nan):
        with pytest.raises(ValueError, match=r"^x: must be finite and > 0"):
            V.check_positive_float("x", bad)


def test_check_positive_float_allow_zero():
    assert V.check_positive_float("x", 0, allow_zero=True) == 0.0
    assert V.check_positive_float("x", TINY, allow_zero=True) == TINY
    with pytest.raises(ValueError, match=r"^x: must be finite and >= 0, got -5e-324$"):
        V.check_positive_float("x", -TINY, allow_zero=True)
    for bad in (math.inf, math.nan):
        with pytest.raises(ValueError, match=r"^x: must be finite and >= 0"):
            V.check_positive_float("x", bad, allow_zero=True)


def test_check_positive_float_types():
    out = V.check_positive_float("x", np.float32(0.5))
    assert out == 0.5 and type(out) is float
    assert type(V.check_positive_float("x", 2)) is float
    for bad in (True, np.bool_(True), "1", None, 1j):
        with pytest.raises(TypeError, match=r"^x: must be a real number, got "):
            V.check_positive_float("x", bad)


def test_check_probability_open_interval():
    assert V.check_probability("delta", TINY) == TINY
    below_one = 1.0 - 2.0**-53
    assert V.check_probability("delta", below_one) == below_one
    for bad in (0.0, 1.0, -TINY, math.nan, math.inf):
        with pytest.raises(ValueError, match=r"^delta: must lie in the open interval \(0, 1\)"):
            V.check_probability("delta", bad)
    out = V.check_probability("delta", np.float32(0.25))
    assert out == 0.25 and type(out) is float
    for bad in (True, np.bool_(False), "0.5", None):
        with pytest.raises(TypeError, match=r"^delta: must be a real number, got "):
            V.check_probability("delta", bad)


# --- torch-like inputs (duck-typed: this file does not import torch) --------------------


class _Dtype:
    def __init__(self, itemsize):
        self.itemsize = itemsize


class _Device:
    def __init__(self, kind):
        self.type = kind


class _FakeTensor:
    """Enough of ``torch.Tensor`` for the validation module's duck typing."""

    def __init__(self, values, *, itemsize=4, floating=True, device="cpu"):
        self.values = np.asarray(values)
        self.dtype = _Dtype(itemsize)
        self.device = _Device(device)
        self.floating = floating
        self.calls = []

    def detach(self):
        self.calls.append("detach")
        return self

    def cpu(self):
        self.calls.append("cpu")
        return self

    def is_floating_point(self):
        return self.floating

    def float(self):
        self.calls.append("float")
        return _FakeTensor(self.values.astype(np.float32), itemsize=4)

    def numpy(self):
        return self.values


def test_tensor_values_half_precision_is_widened_first():
    half = _FakeTensor([1.5, 2.5], itemsize=2)
    out = V.as_float_array("x", half)
    assert "float" in half.calls and out.dtype == np.float64
    np.testing.assert_array_equal(out, [1.5, 2.5])
    single = _FakeTensor(np.array([1.5], dtype=np.float32), itemsize=4)
    V.as_float_array("x", single)
    assert single.calls == ["detach", "cpu"]  # float32 is read as it is
    ints = _FakeTensor(np.array([3, 4], dtype=np.int16), itemsize=2, floating=False)
    np.testing.assert_array_equal(V.as_positions("p", ints), [3, 4])
    assert "float" not in ints.calls  # integers are never rounded through float


def test_meta_tensor_is_refused():
    with pytest.raises(ValueError, match=r"^x: is a meta tensor \(it holds no values\)$"):
        V.as_float_array("x", _FakeTensor([1.0], device="meta"))
    with pytest.raises(ValueError, match=r"^p: is a meta tensor"):
        V.as_positions("p", _FakeTensor([1], device="meta", floating=False))


def test_tensor_like_without_device_is_read():
    class NoDevice:
        """A tensor-like object with no ``device`` attribute at all."""

        dtype = _Dtype(8)

        def detach(self):
            return self

        def cpu(self):
            return self

        def is_floating_point(self):
            return True

        def numpy(self):
            return np.array([2.0])

    assert not hasattr(NoDevice(), "device")
    np.testing.assert_array_equal(V.as_float_array("x", NoDevice()), [2.0])


# --- as_float_array / check_sigma -------------------------------------------------------


def test_as_float_array_dtypes():
    out = V.as_float_array("x", [1, 2])
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [1.0, 2.0])
    f64 = np.arange(3.0)
    assert V.as_float_array("x", f64) is f64  # float64 input is not copied
    for bad in ([True, False], [1j], np.array(["a"]), np.array([object()])):
        with pytest.raises(TypeError, match=r"^x: must be a real numeric array, got dtype "):
            V.as_float_array("x", bad)


def test_as_float_array_ndim():
    assert V.as_float_array("x", 1.0, ndim=0).shape == ()
    assert V.as_float_array("x", [[1.0]], ndim=(1, 2)).shape == (1, 1)
    with pytest.raises(ValueError, match=r"^x: must have 1 dimensions, got shape \(1, 1\)$"):
        V.as_float_array("x", [[1.0]], ndim=1)
    with pytest.raises(ValueError, match=r"^x: must have 1 or 2 dimensions, got shape \(\)$"):
        V.as_float_array("x", 1.0, ndim=(1, 2))


def test_as_float_array_finite():
    with pytest.raises(ValueError, match=r"^x: contains NaN or infinite values$"):
        V.as_float_array("x", [1.0, math.nan])
    with pytest.raises(ValueError, match=r"^x: contains NaN or infinite values$"):
        V.as_float_array("x", [-math.inf])
    out = V.as_float_array("x", [math.nan, math.inf], finite=False)
    assert np.isnan(out[0]) and out[1] == math.inf


def test_check_sigma_edge_of_zero():
    assert V.check_sigma("sigma", TINY).shape == ()
    np.testing.assert_array_equal(V.check_sigma("sigma", [[TINY, 2.0]]), [[TINY, 2.0]])
    with pytest.raises(ValueError, match=r"^sigma: every entry must be > 0, got min 0\.0$"):
        V.check_sigma("sigma", [1.0, 0.0])
    with pytest.raises(ValueError, match=r"^sigma: every entry must be > 0, got min -2\.0$"):
        V.check_sigma("sigma", [-2.0, 3.0])


# --- as_positions ----------------------------------------------------------------------


def test_positions_magnitude_limit_at_equality():
    edge = 2**53 - 1
    np.testing.assert_array_equal(V.as_positions("p", [edge, -edge]), [edge, -edge])
    for bad in (2**53, -(2**53)):
        with pytest.raises(ValueError, match=r"^p: \|position\| must be < 2\*\*53"):
            V.as_positions("p", np.array([0, bad], dtype=np.int64))
    with pytest.raises(ValueError, match=r"^p: \|position\| must be < 2\*\*53"):
        V.as_positions("p", [2.0**53])


def test_positions_shape_and_length():
    assert V.as_positions("p", np.zeros(0, dtype=np.int64)).shape == (0,)
    assert V.as_positions("p", [], length=0).dtype == np.int64
    np.testing.assert_array_equal(V.as_positions("p", [4, 5], length=2), [4, 5])
    with pytest.raises(ValueError, match=r"^p: must be one-dimensional, got shape \(1, 2\)$"):
        V.as_positions("p", [[1, 2]])
    with pytest.raises(ValueError, match=r"^p: must be one-dimensional, got shape \(\)$"):
        V.as_positions("p", 3)
    with pytest.raises(ValueError, match=r"^p: must have length 3, got 2$"):
        V.as_positions("p", [1, 2], length=3)


def test_positions_dtypes():
    out = V.as_positions("p", np.array([3.0, -1.0]))
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, [3, -1])
    assert V.as_positions("p", np.array([1, 2], dtype=np.uint8)).dtype == np.int64
    with pytest.raises(TypeError, match=r"^p: must hold integers, got dtype bool$"):
        V.as_positions("p", [True, False])
    with pytest.raises(TypeError, match=r"^p: positions must be integers, got non-integral"):
        V.as_positions("p", [1.0, 1.5])
    with pytest.raises(ValueError, match=r"^p: contains NaN or infinite values$"):
        V.as_positions("p", [1.0, math.nan])
    with pytest.raises(ValueError, match=r"^p: contains NaN or infinite values$"):
        V.as_positions("p", [math.inf])
    with pytest.raises(TypeError, match=r"^p: must hold integers, got dtype <U1$"):
        V.as_positions("p", np.array(["1"]))
    with pytest.raises(TypeError, match=r"^p: must hold integers, got dtype complex128$"):
        V.as_positions("p", np.array([1 + 0j]))


# --- named limits ----------------------------------------------------------------------


def test_num_samples_limits_at_equality():
    assert V.MAX_NUM_SAMPLES == 500_000
    assert V.check_num_samples(1) == 1
    assert V.check_num_samples(V.MAX_NUM_SAMPLES) == V.MAX_NUM_SAMPLES
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1, got 0$"):
        V.check_num_samples(0)
    with pytest.raises(ValueError, match=r"^num_samples: must be <= 500000, got 500001$"):
        V.check_num_samples(V.MAX_NUM_SAMPLES + 1)
    with pytest.raises(ValueError, match=r"^samples_per_head: must be >= 1"):
        V.check_num_samples(0, name="samples_per_head")
    with pytest.raises(TypeError, match=r"^num_samples: must be an integer"):
        V.check_num_samples(2.0)


def test_dps_limits_at_equality():
    assert V.MAX_DPS == 10_000
    assert V.check_dps(15) == 15
    assert V.check_dps(V.MAX_DPS) == V.MAX_DPS
    with pytest.raises(ValueError, match=r"^dps: must be >= 15, got 14$"):
        V.check_dps(14)
    with pytest.raises(ValueError, match=r"^dps: must be <= 10000, got 10001$"):
        V.check_dps(V.MAX_DPS + 1)


# --- check_scale / check_slopes / check_partition ---------------------------------------


def test_default_scale_and_its_edge():
    assert V.check_scale(None, 64) == 0.125
    assert V.check_scale(None, 2) == 1.0 / math.sqrt(2.0)
    assert V.check_scale(None, 1) == 1.0
    assert V.check_scale(None, 0) == 1.0  # a problem without features
    out = V.check_scale(np.float32(0.5), 64)
    assert out == 0.5 and type(out) is float
    with pytest.raises(ValueError, match=r"^scale: must be finite and > 0, got 0\.0$"):
        V.check_scale(0.0, 64)
    with pytest.raises(TypeError, match=r"^scale: must be a real number"):
        V.check_scale("0.1", 64)


def test_check_slopes():
    np.testing.assert_array_equal(check_slopes(None, 6), alibi_slopes(6))
    given = check_slopes([0.5, TINY], 2)
    assert given.dtype == np.float64
    np.testing.assert_array_equal(given, [0.5, TINY])
    with pytest.raises(ValueError, match=r"^slopes: must have shape \(3,\), got \(2,\)$"):
        check_slopes([0.5, 0.25], 3)
    with pytest.raises(ValueError, match=r"^slopes: every entry must be > 0"):
        check_slopes([0.5, 0.0], 2)
    with pytest.raises(TypeError, match=r"^slopes: must be a real numeric array"):
        check_slopes(["a", "b"], 2)


def test_check_partition():
    partition = PartitionSample(np.ones((2, 3)), np.zeros((2, 3)))
    assert check_partition(partition) is partition
    assert check_partition(partition, 2) is partition
    with pytest.raises(ValueError, match=r"^partition: has 2 heads, query has 3$"):
        check_partition(partition, 3)
    with pytest.raises(TypeError, match=r"^partition: must be a PartitionSample, got tuple$"):
        check_partition((np.ones((2, 3)), np.zeros((2, 3))), 2)


def test_type_errors_name_the_type_and_value():
    with pytest.raises(TypeError, match=r"^x: must be a real number, got str '1'$"):
        V.check_positive_float("x", "1")
    with pytest.raises(TypeError, match=r"^delta: must be a real number, got str '0\.5'$"):
        V.check_probability("delta", "0.5")
    with pytest.raises(TypeError, match=r"^n: must be an integer, got float 3\.0$"):
        V.check_int("n", 3.0)
    with pytest.raises(TypeError, match=r"^causal: must be a bool, got int 1$"):
        V.check_bool("causal", 1)


def test_tensor_like_without_is_floating_point_is_not_widened():
    class Int16Like:
        """Tensor-like (detach/cpu/numpy) with a 2-byte dtype and no is_floating_point."""

        dtype = _Dtype(2)
        device = _Device("cpu")

        def detach(self):
            return self

        def cpu(self):
            return self

        def numpy(self):
            return np.array([3, 4], dtype=np.int16)

    np.testing.assert_array_equal(V.as_positions("p", Int16Like()), [3, 4])
    np.testing.assert_array_equal(V.as_float_array("x", Int16Like()), [3.0, 4.0])


class _DetachOnly(np.ndarray):
    """An array with a ``detach`` attribute but no ``cpu``: not a torch tensor."""

    detach = "not a method"


def test_arrays_with_only_one_torch_method_are_arrays():
    pos = np.array([1, 2]).view(_DetachOnly)
    np.testing.assert_array_equal(V.as_positions("p", pos), [1, 2])
    np.testing.assert_array_equal(V.as_float_array("x", pos), [1.0, 2.0])


def test_float32_and_float16_positions():
    for dtype in (np.float32, np.float16):
        out = V.as_positions("p", np.array([3.0, -2.0], dtype=dtype))
        assert out.dtype == np.int64 and out.tolist() == [3, -2]
        with pytest.raises(TypeError, match=r"^p: positions must be integers, got non-integral"):
            V.as_positions("p", np.array([1.5], dtype=dtype))
        with pytest.raises(ValueError, match=r"^p: contains NaN or infinite values$"):
            V.as_positions("p", np.array([np.inf], dtype=dtype))


def test_single_and_half_precision_arrays_are_real_numbers():
    for dtype in (np.float32, np.float16):
        out = V.as_float_array("x", np.array([0.5, 2.0], dtype=dtype))
        assert out.dtype == np.float64 and out.tolist() == [0.5, 2.0]


# --- partition_argument ------------------------------------------------------------------


def test_partition_argument_keeps_the_old_positional_form_returning_the_pair():
    """The old call ``f(q, k, v, partition)`` warns once and, with ``return_lse`` not
    given, is answered ``return_lse=True`` (its old return, the pair, without the second
    warning of :func:`select_return`); a given ``return_lse`` and the keyword form are
    passed through."""
    part = object()  # partition_argument passes the partition on unchecked
    with pytest.warns(V.PLSHDeprecationWarning, match=r"^f\(query, key, value, partition\) "):
        assert V.partition_argument((part,), None, None, "f") == (part, True)
    with pytest.warns(V.PLSHDeprecationWarning):
        assert V.partition_argument((part,), None, False, "f") == (part, False)
    assert V.partition_argument((), part, None, "f") == (part, None)
    assert V.partition_argument((), part, False, "f") == (part, False)
    with pytest.raises(TypeError, match=r"^partition: pass it once, as the keyword partition=$"):
        V.partition_argument((part,), part, None, "f")
    with pytest.raises(TypeError, match=r"^partition: pass it once"):
        V.partition_argument((part, part), None, None, "f")
    with pytest.raises(TypeError, match=r"^partition: required \(a PartitionSample"):
        V.partition_argument((), None, True, "f")
