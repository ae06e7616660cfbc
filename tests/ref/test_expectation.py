"""Deterministic tests of plsh_ref.expectation (closed forms; no sampling).

Statistical checks of the same laws against draws live in tests/ref/test_statistics.py.
"""

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plsh_ref import expectation as ex
from plsh_ref.alibi import kernel_matrix

# ---------------------------------------------------------------- collision probability


@settings(max_examples=8)
@given(r=st.floats(0.0, 2000.0), sigma=st.floats(0.05, 1000.0))
def test_quadrature_equals_exp_to_40_digits(r, sigma):
    # proofs_notes/expectation.md: int (1 - r/d) Gamma(2, sigma)(d) dd = exp(-r/sigma).
    before = mpmath.mp.dps
    value = ex.collision_probability_mp(r, sigma, dps=50)
    assert mpmath.mp.dps == before
    with mpmath.workdps(60):
        exact = mpmath.exp(-mpmath.mpf(r) / mpmath.mpf(sigma))
        assert abs(value - exact) <= mpmath.mpf(10) ** -40 * exact


def test_quadrature_is_not_the_wrong_parameterisation():
    # A Gamma *rate* density in place of the *scale* density gives another number, so the
    # 40-digit agreement above is a real check of the scale convention.
    r, sigma = 3.0, 4.0
    with mpmath.workdps(50):
        s = mpmath.mpf(sigma)
        wrong = mpmath.quad(lambda d: (1 - r / d) * d * mpmath.exp(-d * s) * s**2, [r, mpmath.inf])
        good = ex.collision_probability_mp(r, sigma, dps=50)
        assert abs(wrong - good) > mpmath.mpf("0.1")


def test_closed_form_matches_kernel_matrix():
    pos = np.arange(7) * 3
    lstar = kernel_matrix(2.5, pos, pos)
    np.testing.assert_array_equal(ex.collision_probability(pos[:, None] - pos[None, :], 2.5), lstar)
    np.testing.assert_array_equal(
        ex.expected_mask(2.5, pos, pos, causal=True), kernel_matrix(2.5, pos, pos, causal=True)
    )
    assert ex.collision_probability(-3.0, 3.0) == math.exp(-1.0)


def test_mpmath_precision_restored_on_error():
    before = mpmath.mp.dps
    with pytest.raises(ValueError, match="^sigma"):
        ex.collision_probability_mp(1.0, -2.0, dps=40)
    assert mpmath.mp.dps == before


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: ex.collision_probability(1.0, 0.0), "sigma"),
        (lambda: ex.collision_probability(1.0, -1.0), "sigma"),
        (lambda: ex.collision_probability_mp(1.0, 2.0, dps=14), "dps"),
        (lambda: ex.collision_probability_mp(float("nan"), 2.0), "distance"),
        (lambda: ex.mask_variance(1.0, [0, 1], [0, 1], 0), "num_samples"),
        (lambda: ex.expected_mask_square(1.0, np.zeros(0, dtype=np.int64)), "positions"),
        (lambda: ex.expected_mask_square(-1.0, [0, 1]), "sigma"),
        (lambda: ex.block_size_pmf(0, 2.0), "k"),
        (lambda: ex.block_extent_sf(-1, 2.0), "b"),
        (lambda: ex.pitch_sf(-1.0, 2.0), "b"),
        (lambda: ex.largest_pitch_quantile(1.0, 2.0, 4), "q"),
        (lambda: ex.largest_pitch_quantile(0.0, 2.0, 4), "q"),
        (lambda: ex.largest_pitch_quantile(0.5, 2.0, 0), "num_samples"),
        (lambda: ex.expected_window_width(2.0, 4, n=0), "n"),
        (lambda: ex.expected_window_width(0.0, 4), "sigma"),
        (lambda: ex.relative_frobenius_error_square(2.0, 0, 4), "n"),
    ],
)
def test_bad_input(call, name):
    with pytest.raises(ValueError, match=f"^{name}"):
        call()


def test_mask_variance():
    pos = np.arange(5)
    lstar = kernel_matrix(3.0, pos, pos)
    np.testing.assert_allclose(
        ex.mask_variance(3.0, pos, pos, 8), lstar * (1 - lstar) / 8, rtol=0, atol=0
    )


# ---------------------------------------------------------------- second moments


def _brute_mask_square(sigma, pos):
    n = len(pos)
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            trip = np.stack([np.full(n, pos[i]), np.full(n, pos[j]), pos])
            out[i, j] = np.exp(-(trip.max(0) - trip.min(0)) / sigma).sum()
    return out


@settings(max_examples=15)
@given(pos=st.lists(st.integers(-40, 40), min_size=1, max_size=9), sigma=st.floats(0.2, 50.0))
def test_mask_square_matches_triple_sum(pos, sigma):
    # E[M^2]_ij = sum_k P(i, j, k in one bin) = sum_k exp(-span/sigma), any order, repeats.
    pos = np.array(pos)
    np.testing.assert_allclose(
        ex.expected_mask_square(sigma, pos), _brute_mask_square(sigma, pos), rtol=1e-12, atol=0
    )


@pytest.mark.parametrize("n, sigma", [(1, 2.0), (12, 3.0), (40, 0.7)])
def test_mask_square_aligned_closed_form(n, sigma):
    rho = math.exp(-1 / sigma)
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    lo, hi = np.minimum(i, j), np.maximum(i, j)
    r = hi - lo
    closed = rho**r * (r + 1 + rho * (2 - rho**lo - rho ** (n - 1 - hi)) / (1 - rho))
    np.testing.assert_allclose(
        ex.expected_mask_square(sigma, np.arange(n)), closed, rtol=1e-12, atol=0
    )


@pytest.mark.parametrize("sigma", [0.5, 2.0, 6.0])
def test_error_square_is_csch_times_kernel_in_the_interior(sigma):
    # Infinite line: E[(M - L*)^2] = csch(1/sigma) L*. Finite n: entrywise between 0 and
    # that, and equal up to rho^(distance to the ends) in the interior.
    n = 400
    pos = np.arange(n)
    e2 = ex.expected_error_square(sigma, pos)
    line = kernel_matrix(sigma, pos, pos) / math.sinh(1 / sigma)
    assert np.all(e2 >= -1e-12) and np.all(e2 <= line * (1 + 1e-12) + 1e-15)
    mid = slice(190, 210)  # rho^190 <= 2e-14 for sigma <= 6
    np.testing.assert_allclose(e2[mid, mid], line[mid, mid], rtol=1e-10)


@pytest.mark.parametrize("sigma", [0.5, 3.0, 10.0])
def test_variance_proxy_below_limit_and_increasing(sigma):
    vals = [ex.variance_proxy(sigma, np.arange(n)) for n in (4, 16, 64, 256)]
    lim = ex.variance_proxy_limit(sigma)
    assert all(a <= b * (1 + 1e-12) for a, b in zip(vals, vals[1:]))
    assert vals[-1] <= lim * (1 + 1e-12)
    assert math.isclose(lim, 1 / (math.sinh(1 / sigma) * math.tanh(0.5 / sigma)), rel_tol=1e-12)
    # Subsets of positions: entrywise smaller, so also below the limit.
    assert ex.variance_proxy(sigma, np.array([0, 3, 4, 9, 30])) <= lim


@pytest.mark.parametrize("sigma", [0.5, 3.0, 10.0])
def test_relative_frobenius_limits(sigma):
    big = 1500  # the ends change the ratio by O(sigma / n)
    assert math.isclose(
        ex.relative_frobenius_error_square(sigma, big, 1), 1 / math.cosh(1 / sigma), rel_tol=2e-2
    )
    assert math.isclose(
        ex.relative_frobenius_error_square(sigma, big, 1, causal=True),
        math.exp(-1 / sigma),
        rel_tol=2e-2,
    )
    assert ex.relative_frobenius_error_square(sigma, 50, 10) == pytest.approx(
        ex.relative_frobenius_error_square(sigma, 50, 1) / 10, rel=1e-14
    )


# ---------------------------------------------------------------- block laws


@pytest.mark.parametrize("sigma", [0.3, 1.0, 7.0, 100.0])
def test_block_size_law(sigma):
    k = np.arange(1, int(60 * sigma) + 200)
    pmf = ex.block_size_pmf(k, sigma)
    assert math.isclose(pmf.sum(), 1.0, rel_tol=1e-12)
    assert math.isclose((k * pmf).sum(), ex.block_size_mean(sigma), rel_tol=1e-10)
    rho = math.exp(-1 / sigma)
    assert math.isclose(ex.block_size_mean(sigma), (1 + rho) / (1 - rho), rel_tol=1e-12)
    # Size = L + R + 1 with independent geometric extents: convolution.
    ext = (1 - rho) * rho ** np.arange(k.size)
    conv = np.convolve(ext, ext)[: k.size]
    np.testing.assert_allclose(pmf, conv, rtol=1e-10, atol=1e-300)
    np.testing.assert_allclose(
        ex.block_size_sf(k[:50], sigma), 1 - np.concatenate([[0], np.cumsum(pmf[:49])]), atol=1e-12
    )
    assert ex.block_extent_sf(3, sigma) == pytest.approx(rho**3, rel=1e-14)


def test_block_mean_is_about_two_sigma():
    for sigma in (8.0, 64.0, 256.0):
        assert abs(ex.block_size_mean(sigma) - 2 * sigma) < 1 / (6 * sigma) + 1e-9


# ---------------------------------------------------------------- largest pitch


@settings(max_examples=20)
@given(q=st.floats(0.001, 0.999), sigma=st.floats(0.1, 500.0), s=st.integers(1, 4096))
def test_largest_pitch_quantile_inverts_cdf(q, sigma, s):
    b = ex.largest_pitch_quantile(q, sigma, s)
    assert ex.largest_pitch_cdf(b, sigma, s) == pytest.approx(q, rel=1e-9, abs=1e-12)


def test_largest_pitch_single_sample_is_gamma():
    from scipy.stats import gamma

    for b in (0.3, 2.0, 17.0):
        assert ex.pitch_sf(b, 4.0) == pytest.approx(gamma.sf(b, 2.0, scale=4.0), rel=1e-12)
        assert ex.largest_pitch_sf(b, 4.0, 5) == pytest.approx(
            1 - gamma.cdf(b, 2.0, scale=4.0) ** 5, rel=1e-12
        )


def test_largest_pitch_median_growth():
    # median / sigma - (ln s + ln ln s) decreases to -ln ln 2 = 0.367 (slowly: the next
    # term of W_{-1} is O(ln ln s / ln s)); proofs_notes/largest_pitch.md.
    gaps = [
        ex.largest_pitch_quantile(0.5, 1.0, s) - (math.log(s) + math.log(math.log(s)))
        for s in (10**2, 10**4, 10**6, 10**9, 10**15)
    ]
    assert all(a > b for a, b in zip(gaps, gaps[1:]))
    assert all(-math.log(math.log(2)) < g < 1.0 for g in gaps)


# ---------------------------------------------------------------- window width


def test_window_width_finite_and_line():
    sigma, s = 4.0, 8
    line = ex.expected_window_width(sigma, s)
    w = ex.expected_window_width(sigma, s, n=601)
    assert w[300] == pytest.approx(line, rel=1e-12)
    assert w[0] < w[300] and w[0] == pytest.approx((line + 1) / 2, rel=1e-12)
    wc = ex.expected_window_width(sigma, s, n=601, causal=True)
    assert wc[0] == 1.0 and wc[-1] == pytest.approx((line + 1) / 2, rel=1e-12)
    # s = 1: one block, mean coth(1/(2 sigma)).
    assert ex.expected_window_width(sigma, 1) == pytest.approx(ex.block_size_mean(sigma), rel=1e-12)


@pytest.mark.parametrize("sigma, s", [(0.7, 3), (64.0, 4), (256.0, 16), (256.0, 64)])
def test_window_width_asymptotics(sigma, s):
    # Riemann-sum sandwich (proofs_notes/window_width.md): |E[width] - 2 sigma H_s| <= 1.
    harmonic = sum(1 / k for k in range(1, s + 1))
    width = ex.expected_window_width(sigma, s)
    assert abs(width - 2 * sigma * harmonic) <= 1 + 1e-12 * width
    assert ex.expected_reduction_width(sigma, s) == pytest.approx(s * ex.block_size_mean(sigma))


def test_variance_proxy_limit_extreme_sigma():
    """math.sinh(0.5/sigma) overflowed (OverflowError) for sigma = 1e-9; the limit is 0."""
    import math

    from plsh_ref.expectation import variance_proxy_limit

    assert variance_proxy_limit(1e-9) == 0.0
    for sigma in (0.3, 2.0, 50.0, 1e4):
        assert math.isclose(
            variance_proxy_limit(sigma), 0.5 / math.sinh(0.5 / sigma) ** 2, rel_tol=1e-13
        )
    assert math.isclose(variance_proxy_limit(1e8), 2e16, rel_tol=1e-7)  # ~ 2 sigma^2
