"""plsh_ref.expectation pinned to exact values: every closed form against its definition
evaluated independently (mpmath sums and integrals at 40 digits, brute-force sums over
triples of positions), at the edges of its domain, with its refusals.
"""

from __future__ import annotations

import itertools
import math
import warnings

import mpmath as mp
import numpy as np
import pytest

from plsh_ref import expectation as E


@pytest.fixture(autouse=True)
def _digits():
    """Work at 40 digits without changing mpmath's global precision for other tests."""
    with mp.workdps(40):
        yield


def close(a, b, rtol=1e-13):
    return abs(float(a) - float(b)) <= rtol * abs(float(b))


def test_collision_probability():
    assert E.collision_probability(3.0, 2.0) == math.exp(-1.5)
    assert E.collision_probability(-3.0, 2.0) == math.exp(-1.5)
    assert type(E.collision_probability(1, 1.0)) is float
    out = E.collision_probability([0.0, 2.0], 4.0)
    assert out.tolist() == [1.0, math.exp(-0.5)]
    with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0"):
        E.collision_probability(1.0, 0.0)
    with pytest.raises(ValueError, match=r"^distance: contains NaN"):
        E.collision_probability(np.nan, 1.0)


@pytest.mark.parametrize("r, sigma", [(0, 1.0), (3, 2.0), (-5, 0.5), (200, 3.0)])
def test_collision_probability_mp_is_the_exponential(r, sigma):
    got = E.collision_probability_mp(r, sigma, dps=30)
    want = mp.e ** (-abs(mp.mpf(r)) / mp.mpf(sigma))
    assert abs(got / want - 1) < mp.mpf(10) ** -28


@pytest.mark.parametrize("r", [0, 2.5, 1e6])
def test_collision_probability_mp_accurate_far_below_one_token(r):
    # sigma = 1e-9: the density lives within nanotokens of r, where break points at the
    # scale of sigma keep the quadrature at about dps digits (measured: 7e-17 at dps 15;
    # points at 4 / sigma, 16 / sigma or below r lose 4-7 digits); r / sigma up to 1e15
    got = E.collision_probability_mp(r, 1e-9, dps=15)
    want = mp.e ** (-(mp.mpf(r) / mp.mpf(1e-9)))
    assert abs(got / want - 1) < mp.mpf(10) ** -13


@pytest.mark.parametrize("r, sigma", [(5.0, 1e-30), (5.0, 1e-300), (1e-300, 1e300)])
def test_collision_probability_mp_at_extreme_scales(r, sigma):
    # in the pitch's excess t = delta - r, mpmath's map of the last interval [64 sigma, inf)
    # lost 8 digits at sigma <= 1e-30 (relative error 4.1e-8 at dps 15)
    got = E.collision_probability_mp(r, sigma, dps=15)
    with mp.workdps(400):
        want = mp.exp(-(mp.mpf(r) / mp.mpf(sigma)))
    assert abs(got / want - 1) < mp.mpf(10) ** -13


@pytest.mark.parametrize("r", [1e61, 1e65, 1e300])
def test_collision_probability_mp_beyond_the_working_precision(r):
    # r / sigma past 10^(dps + 10): r + sigma rounds to r at the working precision, where
    # the quadrature in delta took its scale as 0 and raised ZeroDivisionError
    got = E.collision_probability_mp(r, 1.0, dps=50)
    with mp.workdps(400):  # exp(-r) to 50 digits needs r's 300 digits of the exponent
        want = mp.exp(-mp.mpf(r))
    assert abs(got / want - 1) < mp.mpf(10) ** -40


def test_collision_probability_mp_inputs():
    big = 2**60 + 1  # an int is taken exactly (float(2**60 + 1) == 2**60)
    got = E.collision_probability_mp(big, mp.mpf(2) ** 60, dps=30)
    assert abs(got / mp.e ** (-(mp.mpf(big) / mp.mpf(2) ** 60)) - 1) < mp.mpf(10) ** -28
    assert E.collision_probability_mp(np.int64(1), np.float64(1.0), dps=15) > 0
    for bad in (True, "1", None, np.bool_(True)):
        with pytest.raises(TypeError, match=r"^distance: must be a real number, got "):
            E.collision_probability_mp(bad, 1.0)
    with pytest.raises(TypeError, match=r"^sigma: must be a real number, got str$"):
        E.collision_probability_mp(1.0, "2")
    with pytest.raises(ValueError, match=r"^distance: must be finite, got inf$"):
        E.collision_probability_mp(math.inf, 1.0)
    with pytest.raises(ValueError, match=r"^sigma: must be finite, got nan$"):
        E.collision_probability_mp(1.0, math.nan)
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0, got "):
            E.collision_probability_mp(1.0, bad)
    with pytest.raises(ValueError, match=r"^dps: must be >= 15"):
        E.collision_probability_mp(1.0, 1.0, dps=14)
    before = mp.mp.dps
    E.collision_probability_mp(1.0, 1.0, dps=20)
    assert mp.mp.dps == before


def test_mask_variance_and_relative_error():
    q, k = [0, 3], [1, 2, 5]
    lstar = E.expected_mask(2.0, q, k)
    np.testing.assert_array_equal(E.mask_variance(2.0, q, k, 4), lstar * (1 - lstar) / 4)
    lc = E.expected_mask(2.0, q, k, causal=True)
    np.testing.assert_array_equal(E.mask_variance(2.0, q, k, 1, causal=True), lc * (1 - lc))
    assert lc[0].tolist() == [0.0, 0.0, 0.0] and lc[1, 0] > 0
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1, got 0$"):
        E.mask_variance(2.0, q, k, 0)
    pos = np.arange(5)
    for causal in (False, True):
        lst = E.expected_mask(3.0, pos, pos, causal=causal)
        want = np.sum(lst * (1 - lst)) / (7 * np.sum(lst**2))
        assert E.relative_frobenius_error_square(3.0, 5, 7, causal=causal) == float(want)
    assert E.relative_frobenius_error_square(3.0, 1, 2) == 0.0
    with pytest.raises(ValueError, match=r"^n: must be >= 1, got 0$"):
        E.relative_frobenius_error_square(3.0, 0, 2)
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1, got 0$"):
        E.relative_frobenius_error_square(3.0, 2, 0)
    with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0"):
        E.relative_frobenius_error_square(-3.0, 2, 2)


@pytest.mark.parametrize("positions", [[0, 1, 2, 3], [5, -2, 9, 6, 6, 0], [7]])
def test_expected_mask_square_is_the_triple_sum(positions):
    sigma = 2.5
    p = np.array(positions)
    got = E.expected_mask_square(sigma, p)
    n = p.size
    want = np.zeros((n, n))
    for i, j in itertools.product(range(n), repeat=2):
        # E[M_ik M_kj] = P(p_i, p_k, p_j in one bin) = exp(-span / sigma)
        want[i, j] = sum(
            math.exp(-(max(p[i], p[k], p[j]) - min(p[i], p[k], p[j])) / sigma) for k in range(n)
        )
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)
    lstar = E.expected_mask(sigma, p, p)
    np.testing.assert_allclose(
        E.expected_error_square(sigma, p), want - lstar @ lstar, rtol=1e-12, atol=1e-13
    )
    e2 = want - lstar @ lstar
    assert close(E.variance_proxy(sigma, p), np.max(np.abs(np.linalg.eigvalsh(e2))), rtol=1e-10)


def test_expected_mask_square_refusals():
    with pytest.raises(ValueError, match=r"^positions: needs at least one position \(n >= 1\)$"):
        E.expected_mask_square(1.0, [])
    with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0"):
        E.expected_mask_square(0.0, [1])
    for second_moment in (E.expected_mask_square, E.expected_error_square):
        with pytest.raises(ValueError, match=r"^positions: must be one-dimensional"):
            second_moment(1.0, [[0, 1]])


@pytest.mark.parametrize("sigma", [0.01, 0.5, 3.0, 1e4])
def test_variance_proxy_limit_is_the_sinh_formula(sigma):
    x = 1 / (2 * mp.mpf(sigma))
    assert close(E.variance_proxy_limit(sigma), 1 / (2 * mp.sinh(x) ** 2))


def test_variance_proxy_limit_underflows_to_zero():
    assert E.variance_proxy_limit(1e-3) == 0.0
    with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0"):
        E.variance_proxy_limit(0.0)


@pytest.mark.parametrize("sigma", [0.7, 4.0])
def test_block_laws_against_their_sums(sigma):
    S = mp.mpf(sigma)
    rho = mp.e ** (-1 / S)

    def pmf(k):
        return k * (1 - rho) ** 2 * rho ** (k - 1)

    for k in (1, 2, 5, 17):
        assert close(E.block_size_pmf(k, sigma), pmf(k))
        assert close(E.block_size_sf(k, sigma), mp.nsum(pmf, [k, mp.inf]))
    assert close(E.block_size_mean(sigma), mp.nsum(lambda k: k * pmf(k), [1, mp.inf]))
    assert close(E.block_size_mean(sigma), 1 / mp.tanh(1 / (2 * S)))
    assert E.block_size_sf(1, sigma) == pytest.approx(1.0, rel=1e-15)
    np.testing.assert_array_equal(
        E.block_extent_sf([0, 3], sigma), np.exp(-np.array([0, 3]) / sigma)
    )
    assert type(E.block_extent_sf(2, sigma)) is float
    got = E.block_size_pmf(np.array([1, 2]), sigma)
    assert got.shape == (2,) and close(got[1], pmf(2))
    assert E.expected_reduction_width(sigma, 3) == 3 * E.block_size_mean(sigma)


def test_block_law_refusals():
    with pytest.raises(ValueError, match=r"^k: every entry must be >= 1$"):
        E.block_size_pmf(0, 1.0)
    with pytest.raises(ValueError, match=r"^k: every entry must be >= 1$"):
        E.block_size_sf([1, 0], 1.0)
    with pytest.raises(ValueError, match=r"^b: every entry must be >= 0$"):
        E.block_extent_sf(-1, 1.0)
    assert E.block_extent_sf(0, 1.0) == 1.0
    with pytest.raises(TypeError, match=r"^k: must hold integers, got dtype float64$"):
        E.block_size_pmf(1.0, 1.0)
    with pytest.raises(TypeError, match=r"^b: must hold integers, got dtype bool$"):
        E.block_extent_sf(True, 1.0)
    with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0"):
        E.block_size_mean(0.0)
    for law in (E.block_extent_sf, E.block_size_pmf, E.block_size_sf):
        with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0, got 0.0$"):
            law(1, 0.0)
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1"):
        E.expected_reduction_width(1.0, 0)


@pytest.mark.parametrize(
    "b, sigma, s", [(0.0, 1.0, 1), (3.0, 2.0, 5), (0.5, 4.0, 3), (40.0, 2.0, 64)]
)
def test_largest_pitch_laws_exact(b, sigma, s):
    x = mp.mpf(b) / mp.mpf(sigma)
    tail = (1 + x) * mp.e ** (-x)
    assert close(E.pitch_sf(b, sigma), tail)
    assert close(E.largest_pitch_sf(b, sigma, s), 1 - (1 - tail) ** s) or tail == 1
    cdf = (1 - tail) ** s
    if cdf > 0:
        assert close(E.largest_pitch_cdf(b, sigma, s), cdf, rtol=1e-12)
    else:
        assert E.largest_pitch_cdf(b, sigma, s) == 0.0


def test_largest_pitch_cdf_small_pitch_keeps_relative_accuracy():
    # tail > 0.5: the incomplete-gamma branch; 1 - (1 + x) e^-x ~ x^2 / 2
    got = E.largest_pitch_cdf(1e-6, 1.0, 2)
    x = mp.mpf("1e-6")
    assert close(got, (1 - (1 + x) * mp.e ** (-x)) ** 2, rtol=1e-12)
    arr = E.largest_pitch_cdf(np.array([1e-6, 10.0]), 1.0, 2)
    assert arr.shape == (2,)
    assert close(arr[1], (1 - 11 * mp.e ** (-10)) ** 2, rtol=1e-12)


def test_largest_pitch_refusals():
    with pytest.raises(ValueError, match=r"^b: every entry must be >= 0$"):
        E.pitch_sf(-1e-300, 1.0)
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1"):
        E.largest_pitch_sf(1.0, 1.0, 0)
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1"):
        E.largest_pitch_cdf(1.0, 1.0, 0)
    with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0"):
        E.largest_pitch_cdf(1.0, 0.0, 1)
    assert E.largest_pitch_sf(0.0, 1.0, 3) == 1.0


@pytest.mark.parametrize(
    "q, sigma, s", [(0.5, 1.0, 1), (0.99, 3.0, 16), (1e-3, 2.0, 4), (0.999999, 10.0, 2)]
)
def test_largest_pitch_quantile_inverts_the_cdf(q, sigma, s):
    b = E.largest_pitch_quantile(q, sigma, s)
    x = mp.mpf(b) / sigma
    assert close((1 - (1 + x) * mp.e ** (-x)) ** s, q, rtol=1e-9)


def _largest_pitch_quantile_mp(q, sigma, s):
    """The root of ``1 - (1 + x) e^(-x) = q^(1/s)`` by mpmath, times ``sigma``, with enough
    digits for the cancellation (``x^2 / 2 ~ q^(1/s)`` loses ``-log10 q^(1/s)`` of them)."""
    u = mp.mpf(q) ** (mp.mpf(1) / s)
    with mp.workdps(60 + int(-mp.log10(u))):
        if u < mp.mpf("0.1"):  # start from the series 1 - (1 + x) e^-x = x^2/2 - x^3/3 + ...
            x0 = mp.sqrt(2 * u)
        else:  # and from Lambert W's solution elsewhere
            x0 = -1 - mp.lambertw(-(1 - u) / mp.e, -1).real
        x = mp.findroot(lambda x: (1 - (1 + x) * mp.exp(-x)) / u - 1, x0)
        return sigma * x


@pytest.mark.parametrize(
    "q, sigma, s",
    [
        (1e-300, 1.0, 1),  # was NaN: -t/e rounded onto the branch point of W_{-1}
        (5e-324, 2.0, 1),  # the smallest double
        (1e-17, 1.0, 1),
        (1e-10, 3.0, 1),  # was 3.0e-10 in place of 1.414e-5 * 3 (W_{-1} near -1/e)
        (1e-100, 1.0, 7),
        (0.25, 1.0, 1),
        (0.5, 1.0, 1),  # u = 1/2, where the two formulas meet
        (0.5000001, 1.0, 1),
        (0.9, 4.0, 2),
        (1 - 2**-53, 1.0, 1000),  # u within 1e-19 of 1: only W_{-1} of t keeps the digits
    ],
)
def test_largest_pitch_quantile_full_precision(q, sigma, s):
    b = E.largest_pitch_quantile(q, sigma, s)
    assert math.isfinite(b) and b > 0
    assert close(b, _largest_pitch_quantile_mp(q, sigma, s), rtol=1e-13)


def test_largest_pitch_quantile_refusals():
    with pytest.raises(ValueError, match=r"^q: must lie in the open interval"):
        E.largest_pitch_quantile(1.0, 1.0, 1)
    with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0"):
        E.largest_pitch_quantile(0.5, 0.0, 1)
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1"):
        E.largest_pitch_quantile(0.5, 1.0, 0)


def _extent_terms(sigma, s, r):
    return 1 - (1 - mp.e ** (-mp.mpf(r) / sigma)) ** s


@pytest.mark.parametrize("sigma, s", [(2.0, 3), (0.5, 1), (10.0, 8)])
def test_expected_window_width_sums(sigma, s):
    total = mp.nsum(lambda r: _extent_terms(sigma, s, r), [1, mp.inf])
    assert close(E.expected_window_width(sigma, s), 1 + 2 * total, rtol=1e-12)
    assert close(E.expected_window_width(sigma, s, causal=True), 1 + total, rtol=1e-12)
    n = 6
    c = [mp.fsum(_extent_terms(sigma, s, r) for r in range(1, i + 1)) for i in range(n)]
    got = E.expected_window_width(sigma, s, n)
    want = [1 + c[i] + c[n - 1 - i] for i in range(n)]
    np.testing.assert_allclose(got, [float(w) for w in want], rtol=1e-13)
    got = E.expected_window_width(sigma, s, n, causal=True)
    np.testing.assert_allclose(got, [float(1 + c[i]) for i in range(n)], rtol=1e-13)
    assert E.expected_window_width(sigma, s, 1).tolist() == [1.0]


# -- the line's sum in closed form (proofs_notes/window_width.md section 2a) ----------------


def _line_sum_exact(sigma, s):
    """``sum_{r >= 1} [1 - (1 - rho^r)^s]`` exactly, as the alternating binomial sum
    ``sum_{j=1}^{s} C(s, j) (-1)^(j+1) rho^j / (1 - rho^j)`` (sum over ``r`` of each
    geometric series), at enough digits for its cancellation (about ``s log10(2)``)."""
    with mp.workdps(int(s * 0.302) + 40):
        rho = mp.exp(-1 / mp.mpf(sigma))
        total = mp.fsum(
            mp.binomial(s, j) * (-1) ** (j + 1) * rho**j / (1 - rho**j) for j in range(1, s + 1)
        )
        return +total


def _g_derivative_at_0(s, m):
    """``g^(m)(0)`` of ``g(u) = 1 - (1 - e^-u)^s`` by mpmath's numerical differentiation."""
    return mp.diff(lambda u: 1 - (1 - mp.exp(-u)) ** s, 0, m)


#: the remainder bound of the closed form is ``REMAINDER_CONSTANT * sigma^-5`` (3840 / 30240)
REMAINDER_CONSTANT = 3840 / 30240

LINE_SUM_CASES = [
    (sigma, s) for sigma in (1.5, 2.0, 4.0, 8.0) for s in (1, 2, 3, 4, 5, 6, 7, 10, 50)
]


def _closed_form(monkeypatch, sigma, s):
    """The library's closed form at any sigma: the switch moved below it (public constant)."""
    monkeypatch.setattr(E, "EULER_MACLAURIN_SIGMA", 1.0)
    return mp.mpf(E.expected_window_width(sigma, s, causal=True)) - 1


@pytest.mark.parametrize("sigma, s", LINE_SUM_CASES)
def test_window_sum_euler_maclaurin_within_its_remainder(monkeypatch, sigma, s):
    """Section 2a: ``|closed form - sum| <= 0.127 sigma^-5``; at these small sigma the
    bound (4e-3 to 4e-6) is far above rounding, so the test sees the remainder itself."""
    exact = _line_sum_exact(sigma, s)
    bound = REMAINDER_CONSTANT * sigma**-5
    got = _closed_form(monkeypatch, sigma, s)
    assert abs(got - exact) <= bound + 1e-15 * exact


@pytest.mark.parametrize("sigma, s, m, weight", [(8.0, 1, 1, 1 / 12), (8.0, 2, 3, -1 / 720)])
def test_window_sum_without_a_correction_leaves_the_bound(monkeypatch, sigma, s, m, weight):
    """Negative control of the test above: the closed form with its ``B_2`` (``s = 1``) or
    ``B_4`` (``s = 2``) correction undone lies outside the bound (by 1300x and 4x)."""
    exact = _line_sum_exact(sigma, s)
    bound = REMAINDER_CONSTANT * sigma**-5
    undone = _closed_form(monkeypatch, sigma, s) + weight * _g_derivative_at_0(s, m) / sigma**m
    assert abs(undone - exact) > 3 * bound


@pytest.mark.parametrize("s", range(1, 8))
def test_window_sum_derivatives_at_0_are_the_stirling_table(s):
    """Section 2a: odd ``g^(m)(0) = sum_j C(s, j) (-1)^j j^m = (-1)^s s! S(m, s)``, the
    listed values, 0 for ``s > m``."""
    table = {1: [-1], 3: [-1, 6, -6], 5: [-1, 30, -150, 240, -120]}
    for m, values in table.items():
        numeric = _g_derivative_at_0(s, m)
        alternating = mp.fsum(mp.binomial(s, j) * (-1) ** j * j**m for j in range(1, s + 1))
        stirling = (-1) ** s * mp.factorial(s) * mp.stirling2(m, s)
        want = values[s - 1] if s <= len(values) else 0
        assert abs(numeric - want) < 1e-20 and alternating == want and stirling == want


def _sixth_derivative(s):
    """``g^(6)`` of ``g(u) = 1 - (1 - y)^s``, ``y = e^-u``, as exact integer coefficients of
    ``y^a (1 - y)^b``: ``d/du [y^a (1 - y)^b] = -a y^a (1 - y)^b + b y^(a+1) (1 - y)^(b-1)``
    (no alternating binomial sum, so float64 evaluation cancels nothing)."""
    terms = {(0, s): -1}  # g - 1
    for _ in range(6):
        nxt: dict = {}
        for (a, b), c in terms.items():
            if a:
                nxt[(a, b)] = nxt.get((a, b), 0) - a * c
            if b:
                nxt[(a + 1, b - 1)] = nxt.get((a + 1, b - 1), 0) + b * c
        terms = nxt
    return terms


def _remainder_integral(s, points=400_001):
    """``K_s = int_0^inf |g^(6)(u)| du``: trapezoid rule on ``[0, ln s + 45]`` (beyond,
    ``|g^(6)| <= s^6 ... e^-u`` is below 1e-12)."""
    u = np.linspace(0.0, math.log(s) + 45, points)
    log_y, log_1my = -u, np.log(-np.expm1(-u[1:]))
    log_1my = np.concatenate([[-np.inf], log_1my])
    h = np.zeros_like(u)
    for (a, b), c in _sixth_derivative(s).items():
        with np.errstate(invalid="ignore"):
            h += c * np.exp(a * log_y + np.where(b == 0, 0.0, b * log_1my))
    return float(np.trapezoid(np.abs(h), u))


def test_window_sum_remainder_integral_is_exact_where_known():
    """The quadrature of the next test against ``K_s`` in closed form: ``s = 1``,
    ``g^(6) = e^-u``, ``K = 1``; ``s = 2``, ``g^(6) = 2 e^-u - 64 e^-2u`` (sign change at
    ``e^-u = 1/32``), ``K = 30 + 1/32 + 1/32 = 30.0625``."""
    assert _sixth_derivative(1) == {(1, 0): 1}
    # the trapezoid's error: about h^2 / 12 ~ 1e-9 relative for a smooth integrand (step h
    # ~ 1.1e-4), of order h^2 max|h''| ~ 1e-7 where |g^(6)| has its kink (s = 2)
    assert abs(_remainder_integral(1) - 1.0) < 1e-8
    assert abs(_remainder_integral(2) - 30.0625) < 1e-6


@pytest.mark.parametrize("s", [1, 2, 3, 4, 5, 6, 9, 16, 40, 1000, 10**6])
def test_window_sum_remainder_constant(s):
    """Section 2a: ``K_s <= 3840`` for every ``s`` (Rényi's representation for ``s >= 5``)
    and ``K_s <= sum_j C(s, j) j^5`` for ``s <= 4``."""
    k = _remainder_integral(s) / (1 + 1e-6)  # less the quadrature's error (test above)
    assert k <= 3840
    if s <= 4:
        assert k <= sum(math.comb(s, j) * j**5 for j in range(1, s + 1))


@pytest.mark.parametrize("s", [1, 2, 3, 5, 6, 16, 1000, 10**6])
def test_window_width_on_the_line_switches_to_the_closed_form(monkeypatch, s):
    """Section 2a: just below the switch (direct sum) and at it (closed form) the line's
    width is within 5e-16 of the exact sum (``s = 1000``: the alternating binomial sum at
    340 digits), so the two agree to 1e-15. The direct sum took ``np.cumsum(terms)[-1]``
    before, which carried up to ``10^5`` roundings: 1.0e-12 off at ``s = 1``, just below
    the switch. From the switch on, the direct sum is not called."""
    switch = E.EULER_MACLAURIN_SIGMA
    assert switch == 1000.0
    below = E.expected_window_width(math.nextafter(switch, 0.0), s)
    at = E.expected_window_width(switch, s)
    assert close(at, below, rtol=1e-15)
    if s <= 1000:
        assert close(below, 1 + 2 * _line_sum_exact(math.nextafter(switch, 0.0), s), rtol=5e-16)
        assert close(at, 1 + 2 * _line_sum_exact(switch, s), rtol=5e-16)

    def refuse(*args):
        raise AssertionError("direct sum called above the switch")

    monkeypatch.setattr(E, "_max_extent_mean_direct", refuse)
    for sigma in (switch, 1e6, 1e300):
        width = E.expected_window_width(sigma, s, causal=True)
        assert math.isfinite(width)
    with pytest.raises(AssertionError, match="direct sum called"):
        E.expected_window_width(math.nextafter(switch, 0.0), s)


def test_variance_proxy_limit_overflows_to_inf():
    """``2 rho / (1 - rho)^2`` was a ZeroDivisionError from sigma ~ 1e154 on (``(1 -
    rho)^2`` underflowed to 0); the value ``~2 sigma^2`` exceeds float64 there: ``inf``.
    Just below, the value is finite and exact."""
    for sigma in (1.3e154, 1e200, 1e308):
        assert E.variance_proxy_limit(sigma) == math.inf
    for sigma in (1e100, 1e150, 1.2e153):
        x = 1 / (2 * mp.mpf(sigma))
        assert close(E.variance_proxy_limit(sigma), 1 / (2 * mp.sinh(x) ** 2))


def test_expected_window_width_refusals():
    with pytest.raises(ValueError, match=r"^n: must be >= 1, got 0$"):
        E.expected_window_width(1.0, 1, 0)
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1"):
        E.expected_window_width(1.0, 0)
    with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0"):
        E.expected_window_width(0.0, 1)


def test_pitch_tails_where_b_over_sigma_overflows():
    """``b / sigma = inf`` (``b = 1e300``, ``sigma = 1e-10``): the tail is 0 and the CDF 1,
    without warnings; ``(1 + x) e^-x`` gave NaN there (``(1 + inf) 0``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert E.pitch_sf(1e300, 1e-10) == 0.0
        assert E.pitch_sf([0.0, 1e300], 1e-10).tolist() == [1.0, 0.0]
        assert E.largest_pitch_sf(1e300, 1e-10, 4) == 0.0
        assert E.largest_pitch_cdf(1e300, 1e-10, 4) == 1.0
        assert E.pitch_sf(1e300, 1e-8) == 0.0  # b / sigma = 1e308, just inside the range


def test_largest_pitch_sf_at_zero_raises_no_warning():
    # b = 0: the one-pitch tail is 1 and log1p(-1) = -inf (a division by zero, ignored)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="warn"):
            assert E.largest_pitch_sf(0.0, 2.0, 3) == 1.0
            assert E.largest_pitch_sf(np.array([0.0, 1.0]), 2.0, 3)[0] == 1.0


def test_largest_pitch_cdf_upper_tail_of_many_samples_is_exact():
    # (1 - tail)^s with tail = 36 e^-35 ~ 2e-14 and s = 1e9: exp(s log(head)) from the
    # rounded head = 1 - tail loses 5e-8; exp(s log1p(-tail)) keeps every digit
    b, s = 35.0, 10**9
    x = mp.mpf(b)
    want = (1 - (1 + x) * mp.exp(-x)) ** s
    assert close(E.largest_pitch_cdf(b, 1.0, s), want)


def test_largest_pitch_cdf_at_zero_raises_no_warning():
    # b = 0: head = P(2, 0) = 0 and log(0) = -inf (a division by zero, ignored)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="warn"):
            assert E.largest_pitch_cdf(0.0, 2.0, 3) == 0.0
            assert E.largest_pitch_cdf(np.array([0.0, 1.0]), 2.0, 3)[0] == 0.0


def test_pitch_laws_name_a_bad_level():
    for law in (E.pitch_sf, lambda b, sigma: E.largest_pitch_sf(b, sigma, 2)):
        with pytest.raises(ValueError, match=r"^b: contains NaN"):
            law(np.nan, 1.0)


def test_collision_probability_mp_default_precision_is_50_digits():
    # the value is rounded to ``dps`` digits: the default is the dps = 50 value, bit for bit
    default = E.collision_probability_mp(2.0, 3.0)
    assert default == E.collision_probability_mp(2.0, 3.0, dps=50)
    assert default != E.collision_probability_mp(2.0, 3.0, dps=51)
