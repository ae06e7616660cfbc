"""Statistical property tests of the random-binning construction, with negative controls.

Every check takes a *sampler* ``(sigma, num_samples, seed) -> PartitionSample`` for one
head. The correct one is :func:`plsh_ref.partition.draw_partition`; two wrong ones are
written here:

* ``rate_sampler``: Gamma(2) with the *rate* ``1/sigma`` passed where numpy wants the
  *scale* (the torch-``Gamma`` mistake of SPEC section 2);
* ``unit_offset_sampler``: offsets on ``[0, 1)`` instead of ``[0, pitch)``.

Each check must pass for the correct sampler and fail for the wrong ones (asserted). All
seeds are fixed; the false-failure probability of every assertion is stated next to it.
A check that a wrong sampler cannot fail by construction says so.
"""

import math

import numpy as np
import pytest
from scipy import stats

from plsh_ref import bounds as bd
from plsh_ref import expectation as ex
from plsh_ref.alibi import kernel_matrix
from plsh_ref.attention import alibi_attention, plsh_attention
from plsh_ref.partition import PartitionSample, bins, draw_partition, empirical_mean

ALPHA = 1e-6  # per-assertion false-failure probability of the exact tests below


def correct_sampler(sigma, s, seed):
    return draw_partition([sigma], s, seed)


def rate_sampler(sigma, s, seed):
    rng = np.random.default_rng(seed)
    pitch = rng.gamma(2.0, scale=1.0 / sigma, size=s)  # WRONG: rate used as scale
    return PartitionSample(pitch[None], (pitch * rng.random(s))[None])


def unit_offset_sampler(sigma, s, seed):
    rng = np.random.default_rng(seed)
    pitch = rng.gamma(2.0, scale=sigma, size=s)
    return PartitionSample(pitch[None], rng.random(s)[None])  # WRONG: offset on [0, 1)


WRONG = [rate_sampler, unit_offset_sampler]


def _binom_upper(trials, p):
    """Largest failure count k with P(Bin(trials, p) > k) > ALPHA, i.e. reject above it."""
    return int(stats.binom.isf(ALPHA, trials, p))


# ------------------------------------------------------------------ O(1/sqrt(s)) slopes

SLOPE_S = np.array([8, 32, 128, 512, 2048])
SLOPE_TRIALS = 16
SLOPE_N = 64


def _loglog_slopes(sampler, sigma):
    """Slopes of log E||M~ - L*|| vs log s for Frobenius, spectral and max norm."""
    pos = np.arange(SLOPE_N)
    lstar = kernel_matrix(sigma, pos, pos)
    means = []
    for s in SLOPE_S:
        errs = []
        for trial in range(SLOPE_TRIALS):
            diff = (
                empirical_mean(sampler(sigma, int(s), 7919 * int(s) + trial), pos, pos)[0] - lstar
            )
            errs.append([np.linalg.norm(diff), np.linalg.norm(diff, 2), np.abs(diff).max()])
        means.append(np.mean(errs, axis=0))
    return np.polyfit(np.log(SLOPE_S), np.log(np.array(means)), 1)[0]


def _slopes_ok(slopes):
    return bool(np.all((slopes >= -0.6) & (slopes <= -0.4)))


@pytest.mark.parametrize("sigma", [2.0, 8.0, 32.0])
def test_error_slopes_are_minus_one_half(sigma):
    slopes = _loglog_slopes(correct_sampler, sigma)
    # Calibrated over 40 other seed sets per sigma (same n, s grid and trials): slope
    # means -0.490..-0.502, standard deviations <= 0.0152, extremes -0.534 and -0.466. The
    # interval [-0.6, -0.4] is >= 6.4 sd from every mean, so by the normal approximation
    # the false-failure probability of the 3 slopes of this test is below 1e-9.
    assert _slopes_ok(slopes), slopes


@pytest.mark.parametrize("sampler", WRONG)
@pytest.mark.parametrize("sigma", [2.0, 32.0])
def test_error_slopes_fail_for_wrong_samplers(sampler, sigma):
    # A biased sampler's error tends to its bias, so the slopes flatten towards 0.
    assert not _slopes_ok(_loglog_slopes(sampler, sigma))


# ------------------------------------------------------------------ exact binomial tests


def _collision_count(sampler, sigma, positions, s, seed):
    part = sampler(sigma, s, seed)
    b = bins(part, positions)[0]  # (s, len(positions))
    return int(np.sum(np.all(b == b[:, :1], axis=1)))


@pytest.mark.parametrize("positions", [(0, 2), (-1, 3), (3, 5, 9)])
def test_collision_count_is_binomial(positions):
    # A set of points shares a bin with probability exp(-span / sigma) (pairs: L*_ij;
    # triples: the terms of E[M^2]). The count over s independent samples is binomial.
    sigma, s = 4.0, 20000
    count = _collision_count(correct_sampler, sigma, np.array(positions), s, 12345)
    p = math.exp(-(max(positions) - min(positions)) / sigma)
    # Exact two-sided binomial test: false-failure probability ALPHA = 1e-6.
    assert stats.binomtest(count, s, p).pvalue > ALPHA


@pytest.mark.parametrize("sampler", WRONG)
@pytest.mark.parametrize("positions", [(0, 2), (-1, 3)])
def test_collision_count_fails_for_wrong_samplers(sampler, positions):
    sigma, s = 4.0, 20000
    count = _collision_count(sampler, sigma, np.array(positions), s, 12345)
    p = math.exp(-(max(positions) - min(positions)) / sigma)
    assert stats.binomtest(count, s, p).pvalue < ALPHA


def _block_sizes_at_zero(sampler, sigma, s, seed):
    pos = np.arange(-100, 101)
    b = bins(sampler(sigma, s, seed), pos)[0]
    same = b == b[:, 100:101]  # position 0 is index 100
    return same.sum(axis=1), same[:, :100].sum(axis=1), same[:, 101:].sum(axis=1)


def _block_law_pvalue(sampler):
    """Chi-square p-values of the size and of the right extent of the block at 0 (the min)."""
    sigma, s, kmax = 4.0, 20000, 30
    sizes, _, right = _block_sizes_at_zero(sampler, sigma, s, 777)
    k = np.arange(1, kmax)
    expected = np.append(ex.block_size_pmf(k, sigma), ex.block_size_sf(kmax, sigma)) * s
    observed = np.append(
        np.bincount(np.minimum(sizes, kmax), minlength=kmax + 1)[1:kmax], np.sum(sizes >= kmax)
    )
    p_size = stats.chisquare(observed, expected).pvalue
    r = np.arange(kmax)
    rho = math.exp(-1 / sigma)
    expected = np.append((1 - rho) * rho**r, rho**kmax) * s  # geometric extent
    observed = np.bincount(np.minimum(right, kmax), minlength=kmax + 1)
    p_extent = stats.chisquare(observed, expected).pvalue
    return min(p_size, p_extent)


def test_block_size_law_chi_square():
    # Size and right extent of the block containing position 0 (extents truncated at 100:
    # probability e^-25). Two chi-square goodness-of-fit tests (31 cells, expected counts
    # >= 14 except the far tail): false-failure ~ 2 ALPHA.
    assert _block_law_pvalue(correct_sampler) > ALPHA


@pytest.mark.parametrize("sampler", WRONG)
def test_block_size_law_fails_for_wrong_samplers(sampler):
    # (With offsets on [0, 1) the *size* law at 0 is nearly right, p ~ 4e-4: the block is
    # about one pitch long; but position 0 is always the right end of its block, which the
    # extent law catches.)
    assert _block_law_pvalue(sampler) < ALPHA


def test_block_extents_are_independent_geometric():
    sigma, s = 4.0, 20000
    _, left, right = _block_sizes_at_zero(correct_sampler, sigma, s, 31337)
    rho = math.exp(-1 / sigma)
    for a, b in [(0, 3), (2, 2), (5, 1)]:
        hits = int(np.sum((left >= a) & (right >= b)))
        # exact binomial, false-failure ALPHA each
        assert stats.binomtest(hits, s, rho ** (a + b)).pvalue > ALPHA


def _window_pvalues(sampler):
    """Binomial tests of P(max_t R_t >= r) = 1 - (1 - rho^r)^s (fused window, one side)."""
    sigma, s, groups = 4.0, 4, 5000
    _, _, right = _block_sizes_at_zero(sampler, sigma, s * groups, 4242)
    max_right = right.reshape(groups, s).max(axis=1)
    out = []
    for r in (4, 12):
        p = 1 - (1 - math.exp(-r / sigma)) ** s
        out.append(stats.binomtest(int(np.sum(max_right >= r)), groups, p).pvalue)
    return out


def test_window_extent_law():
    # Groups of s consecutive samples of one draw are independent partitions of s samples.
    # Two exact binomial tests: false-failure <= 2 ALPHA.
    assert min(_window_pvalues(correct_sampler)) > ALPHA


@pytest.mark.parametrize("sampler", WRONG)
def test_window_extent_law_fails_for_wrong_samplers(sampler):
    assert min(_window_pvalues(sampler)) < ALPHA


def _largest_pitch_pvalue(sampler, sigma):
    s, trials = 16, 2000
    pitch = sampler(sigma, s * trials, 99).pitch[0].reshape(trials, s).max(axis=1)
    median = ex.largest_pitch_quantile(0.5, sigma, s)
    return stats.binomtest(int(np.sum(pitch > median)), trials, 0.5).pvalue


def test_largest_pitch_law():
    # Exact binomial test at the closed-form median: false-failure ALPHA.
    assert _largest_pitch_pvalue(correct_sampler, 4.0) > ALPHA


def test_largest_pitch_law_fails_for_rate_sampler():
    # The unit-offset sampler draws correct pitches, so it passes this check by design.
    assert _largest_pitch_pvalue(rate_sampler, 4.0) < ALPHA
    assert _largest_pitch_pvalue(unit_offset_sampler, 4.0) > ALPHA


# ------------------------------------------------------------------ coverage of the bounds


def _max_norm_failures(sampler, trials=100):
    n, sigma, s, delta = 64, 8.0, 64, 0.2
    pos = np.arange(n)
    eps = bd.max_norm_error_bound(n, s, delta)
    lstar = kernel_matrix(sigma, pos, pos)
    fails = sum(
        np.abs(empirical_mean(sampler(sigma, s, 500 + t), pos, pos)[0] - lstar).max() > eps
        for t in range(trials)
    )
    return fails, _binom_upper(trials, delta)


def test_max_norm_bound_coverage():
    fails, limit = _max_norm_failures(correct_sampler)
    # If P(fail) <= delta, P(failures > limit) <= ALPHA (binomial upper tail).
    assert fails <= limit


@pytest.mark.parametrize("sampler", WRONG)
def test_max_norm_bound_coverage_fails_for_wrong_samplers(sampler):
    fails, limit = _max_norm_failures(sampler)
    assert fails > limit


def _spectral_failures(sampler, trials=40):
    n, sigma, s, delta = 64, 2.0, 256, 0.2
    pos = np.arange(n)
    eps = bd.spectral_error_bound(n, sigma, s, delta).eps
    lstar = kernel_matrix(sigma, pos, pos)
    fails = sum(
        np.linalg.norm(empirical_mean(sampler(sigma, s, 900 + t), pos, pos)[0] - lstar, 2) > eps
        for t in range(trials)
    )
    return fails, _binom_upper(trials, delta)


def test_spectral_bound_coverage():
    fails, limit = _spectral_failures(correct_sampler)
    assert fails <= limit  # false-failure <= ALPHA (binomial upper tail)


@pytest.mark.parametrize("sampler", WRONG)
def test_spectral_bound_coverage_fails_for_wrong_samplers(sampler):
    fails, limit = _spectral_failures(sampler)
    assert fails > limit


def _block_failures(sampler, sigma, trials=200):
    s, delta = 16, 0.1
    b = bd.block_size_bound(sigma, s, delta)
    pos = np.arange(200)
    fails = 0
    for t in range(trials):
        bb = bins(sampler(sigma, s, 3000 + t), pos)[0]
        biggest = max(np.unique(row, return_counts=True)[1].max() for row in bb)
        fails += biggest > b
    return fails, _binom_upper(trials, delta)


def test_block_size_bound_coverage():
    fails, limit = _block_failures(correct_sampler, 0.25)
    assert fails <= limit  # false-failure <= ALPHA


def test_block_size_bound_coverage_fails_for_rate_sampler():
    # With sigma < 1 the rate/scale mix-up inflates the pitches (scale 4 instead of 0.25).
    # The bound depends on the pitches only, so the unit-offset sampler passes by design.
    fails, limit = _block_failures(rate_sampler, 0.25)
    assert fails > limit
    fails, limit = _block_failures(unit_offset_sampler, 0.25)
    assert fails <= limit


def _output_failures(sampler, trials=30):
    n, sigma, s, delta = 32, 4.0, 1024, 0.2
    rng = np.random.default_rng(2024)
    fails = 0
    for t in range(trials):
        q, k, v = (rng.normal(size=(1, 1, n, 8)) for _ in range(3))
        part = sampler(sigma, s, 7000 + t)
        out_t, _ = plsh_attention(q, k, v, partition=part, causal=True, return_lse=True)
        out_s, _ = alibi_attention(q, k, v, slopes=[1 / sigma], causal=True, return_lse=True)
        bound = bd.output_error_bound(q, k, v, s, delta, slopes=[1 / sigma])
        fails += bool(np.any(np.abs(out_t - out_s) > bound))
    return fails, _binom_upper(trials, delta)


def test_output_bound_coverage():
    fails, limit = _output_failures(correct_sampler)
    assert fails <= limit  # false-failure <= ALPHA


@pytest.mark.parametrize("sampler", WRONG)
def test_output_bound_coverage_fails_for_wrong_samplers(sampler):
    fails, limit = _output_failures(sampler)
    assert fails > limit
