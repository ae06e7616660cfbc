"""ALiBi slopes, positions, bias and kernel matrix (SPEC section 1)."""

from fractions import Fraction

import mpmath
import numpy as np
import pytest
from _oracles import mp_slope, press_slope_exponents
from hypothesis import given
from hypothesis import strategies as st

from plsh_ref.alibi import (
    alibi_bias,
    alibi_slopes,
    causal_mask,
    default_positions,
    kernel_matrix,
    resolve_positions,
    sigma_from_slopes,
)


@pytest.mark.parametrize("num_heads", range(1, 65))
def test_slopes_follow_press_rule(num_heads):
    """Each slope is the binary64 value of ``2^e_h`` with ``e_h`` from the rule, in rule order.

    The rule's slopes are real numbers ``2^e``; libm's ``exp2`` is faithful (error < 1 ulp),
    and it is exact when ``e`` is an integer (a power of two).
    """
    slopes = alibi_slopes(num_heads)
    exponents = press_slope_exponents(num_heads)
    assert slopes.dtype == np.float64 and slopes.shape == (num_heads,)
    for got, e in zip(slopes, exponents):
        exact = mp_slope(e)
        if e.denominator == 1:
            assert got == 2.0 ** int(e)
        with mpmath.workdps(50):
            err_ulps = abs(mpmath.mpf(float(got)) - exact) / mpmath.mpf(float(np.spacing(got)))
        assert err_ulps < 1, (num_heads, e, err_ulps)


def test_slopes_six_heads_example_order_kept():
    # SPEC section 1: H=6 -> slopes(4) followed by slopes(8)[0::2][:2]; never sorted.
    assert alibi_slopes(6).tolist() == [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]


@pytest.mark.parametrize("num_heads", [3, 5, 6, 7, 12, 20, 24, 40, 48, 63])
def test_slopes_non_power_of_two_are_distinct_and_not_sorted(num_heads):
    slopes = alibi_slopes(num_heads)
    assert len(set(slopes.tolist())) == num_heads
    assert np.all((slopes > 0) & (slopes < 1))
    # The appended slopes interleave with the first block, so the list is not monotone.
    assert not np.all(np.diff(slopes) < 0)
    c = 1 << (num_heads.bit_length() - 1)
    assert np.all(np.diff(slopes[:c]) < 0) and np.all(np.diff(slopes[c:]) < 0)


@pytest.mark.parametrize("num_heads", [1, 2, 4, 8, 16, 32, 64])
def test_slopes_power_of_two_geometric(num_heads):
    slopes = alibi_slopes(num_heads)
    exponents = press_slope_exponents(num_heads)
    assert exponents[0] == Fraction(-8, num_heads) and exponents[-1] == -8
    assert slopes[-1] == 2.0**-8
    assert np.all(np.diff(slopes) < 0)


def test_sigma_is_inverse_slope():
    slopes = alibi_slopes(12)
    np.testing.assert_array_equal(sigma_from_slopes(slopes), 1.0 / slopes)
    assert sigma_from_slopes(alibi_slopes(4)).tolist() == [4.0, 16.0, 64.0, 256.0]


@pytest.mark.parametrize("n_q,n_k", [(0, 0), (0, 5), (3, 3), (2, 7), (7, 2), (1, 1)])
def test_default_positions_are_end_aligned(n_q, n_k):
    qpos, kpos = default_positions(n_q, n_k)
    assert qpos.dtype == np.int64 and kpos.dtype == np.int64
    assert kpos.tolist() == list(range(n_k))
    assert qpos.tolist() == [n_k - n_q + i for i in range(n_q)]
    if n_q and n_k:
        assert qpos[-1] == kpos[-1]  # the last query sits on the last key


def test_resolve_positions_explicit_and_default():
    qpos, kpos = resolve_positions(2, 3, query_positions=[10.0, 11.0])
    assert qpos.tolist() == [10, 11] and qpos.dtype == np.int64
    assert kpos.tolist() == [0, 1, 2]
    qpos, kpos = resolve_positions(2, 3, key_positions=np.array([5, 1, 9]))
    assert qpos.tolist() == [1, 2] and kpos.tolist() == [5, 1, 9]


@given(
    st.lists(st.integers(-1000, 1000), min_size=0, max_size=9),
    st.lists(st.integers(-1000, 1000), min_size=0, max_size=9),
    st.sampled_from([1, 3, 6, 8]),
    st.booleans(),
)
def test_bias_and_kernel_matrix_by_definition(qpos, kpos, num_heads, causal):
    slopes = alibi_slopes(num_heads)
    bias = alibi_bias(slopes, qpos, kpos, causal=causal)
    kern = kernel_matrix(1.0 / slopes, qpos, kpos, causal=causal)
    assert bias.shape == kern.shape == (num_heads, len(qpos), len(kpos))
    for h, m in enumerate(slopes):
        for i, pi in enumerate(qpos):
            for j, pj in enumerate(kpos):
                masked = causal and pj > pi
                # -m |p_i - p_j|: one rounded product of the exact distance.
                assert bias[h, i, j] == (-np.inf if masked else -(float(m) * abs(pi - pj)))
                if masked:
                    assert kern[h, i, j] == 0.0
                else:
                    with mpmath.workdps(30):
                        exact = mpmath.exp(-abs(pi - pj) / (1 / mpmath.mpf(float(m))))
                    # exp(-d / sigma) with sigma = fl(1/m): two roundings before a faithful exp
                    # each perturb the result by at most (1 + d/sigma) ulps of relative error.
                    tol = (2 + abs(pi - pj) * float(m)) * 2.0**-52 * float(exact) + 5e-324
                    assert abs(kern[h, i, j] - float(exact)) <= tol


def test_kernel_matrix_is_exp_of_bias_and_kms():
    sigma = np.array([2.0, 5.0])
    pos = np.arange(6)
    kern = kernel_matrix(sigma, pos, pos)
    rho = np.exp(-1.0 / sigma)
    for h in range(2):
        expected = rho[h] ** np.abs(pos[:, None] - pos[None, :])
        np.testing.assert_allclose(kern[h], expected, rtol=1e-14, atol=0)
        np.testing.assert_array_equal(kern[h], kern[h].T)  # symmetric Toeplitz
    np.testing.assert_array_equal(np.diagonal(kern, axis1=1, axis2=2), 1.0)
    # scalar sigma gives a 2-D matrix; causal keeps the lower triangle.
    k1 = kernel_matrix(3.0, pos, pos, causal=True)
    assert k1.shape == (6, 6)
    np.testing.assert_array_equal(k1, np.tril(kernel_matrix(3.0, pos, pos)))


def test_causal_mask_admissible_iff_key_not_after_query():
    mask = causal_mask([3, 0, 5], [0, 3, 4, 6])
    assert mask.tolist() == [
        [True, True, False, False],
        [True, False, False, False],
        [True, True, True, False],
    ]
