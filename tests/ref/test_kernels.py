"""General Pólya kernels: pitch laws, E[M] = k, samplers, laws and bounds (plsh_ref.kernels).

The claims of ``proofs_notes/general_kernels.md``. Statistical tests use fixed seeds and a
z-score threshold ``Z = 5.0`` per comparison (two-sided false-failure probability
``2 Phi(-5) = 5.7e-7``); each states its number of comparisons, and each has a negative
control (a wrong pitch law) that the same statistic rejects.
"""

from __future__ import annotations

import hashlib
import math

import mpmath
import numpy as np
import pytest
from _oracles import Gaussian

from plsh_ref import expectation as E
from plsh_ref import samplers as S
from plsh_ref.alibi import kernel_matrix as alibi_kernel_matrix
from plsh_ref.bounds import kernel_spectral_error_bound, spectral_error_bound
from plsh_ref.kernels import (
    DistanceKernel,
    Exponential,
    KerpleLog,
    KerplePower,
    Mixture,
    block_size_mean,
    block_size_pmf,
    check_kernels,
    check_polya,
    collision_probability_mp,
    entry_variance,
    expected_mask,
    expected_mask_square,
    expected_window_width,
    frobenius_error_square,
    is_builtin,
    kernel_matrix,
    largest_pitch_quantile,
    largest_pitch_sf,
)
from plsh_ref.partition import bins, counts, draw_partition

Z = 5.0  # two-sided false-failure probability 5.7e-7 per comparison

KERNELS = {
    "exponential": Exponential(3.0),
    "kerple_log_heavy": KerpleLog(0.7, 0.5),
    "kerple_log": KerpleLog(2.5, 0.2),
    "kerple_power": KerplePower(0.5, 0.5),
    "kerple_power_small_p": KerplePower(2.0, 0.2),
    "mixture": Mixture([0.3, 0.7], [Exponential(2.0), KerpleLog(1.0, 1.0)]),
}
IDS = list(KERNELS)
ALL = list(KERNELS.values())


def pair_means(partition, distances):
    """``M~`` between position 0 and ``r`` per head: ``(H, len(distances))``."""
    pos = np.concatenate([[0], np.asarray(distances)])
    b = bins(partition, pos)
    return (b[:, :, :1] == b[:, :, 1:]).mean(axis=1)


class HandExponential(DistanceKernel):
    """A user's own ``exp(-r / sigma)``: of Pólya type, but not a built-in class."""

    def __init__(self, sigma):
        self.sigma = sigma

    def k(self, r):
        return np.exp(-np.asarray(r, dtype=float) / self.sigma)

    def dk(self, r):
        return -self.k(r) / self.sigma

    def d2k(self, r):
        return self.k(r) / self.sigma**2


class WrongPitchLog(KerpleLog):
    """Negative control: KERPLE-log's ``k`` with the pitch law of ``r1 + 0.3``."""

    def sample_pitch(self, rng, size):
        return KerpleLog(self.r1 + 0.3, self.r2).sample_pitch(rng, size)

    def pitch_quantile(self, lower, upper):
        return KerpleLog(self.r1 + 0.3, self.r2).pitch_quantile(lower, upper)


# --------------------------------------------------------------------------------------
# Theorem 1: E[M] = k, exactly (mpmath quadrature of the pitch law)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", ALL, ids=IDS)
def test_collision_probability_is_k_by_quadrature_of_the_pitch_law(kernel):
    for r in (0.0, 0.5, 1.0, 7.0, 30.0):
        got = collision_probability_mp(kernel, r, dps=25)
        want = kernel.k_mp(r, 25)
        assert abs(got - want) <= 1e-18 * want, (r, got, want)
        assert float(kernel.k(r)) == pytest.approx(float(want), rel=2e-15)


def test_quadrature_rejects_a_wrong_pitch_law():
    # negative control: the pitch law of KERPLE-log with another r1 does not give its k
    wrong = KerpleLog(1.0, 0.5)
    right = KerpleLog(0.7, 0.5)
    got = collision_probability_mp(wrong, 7.0, dps=25)
    assert abs(got - right.k_mp(7.0, 25)) > 1e-2


@pytest.mark.parametrize("kernel", ALL, ids=IDS)
def test_pitch_density_integrates_to_the_cdf(kernel):
    # F(delta) = int_0^delta t k''(t) dt = 1 - k(delta) + delta k'(delta)
    for d in (0.3, 2.0, 11.0, 150.0):
        with mpmath.workdps(30):
            dd = mpmath.mpf(d)
            f = mpmath.quad(
                lambda u: mpmath.exp(2 * u) * kernel.d2k_mp(mpmath.exp(u), 40),
                [-3000, -300, -50, -10, -2, mpmath.log(dd)],
            )
        assert float(kernel.pitch_cdf(d)) == pytest.approx(float(f), rel=1e-13)
        assert float(kernel.pitch_sf(d)) == pytest.approx(float(1 - f), rel=1e-12)
        # the generic formula of the base class gives the same (to its cancellation)
        assert float(DistanceKernel.pitch_cdf(kernel, d)) == pytest.approx(float(f), rel=1e-9)


@pytest.mark.parametrize("kernel", ALL, ids=IDS)
def test_mean_pitch_is_twice_the_integral_of_k(kernel):
    mean = kernel.mean_pitch()
    with mpmath.workdps(30):
        integral = 2 * mpmath.quad(lambda r: kernel.k_mp(r, 30), [0, 1, 10, 100, mpmath.inf])
    if isinstance(kernel, KerpleLog) and kernel.r1 <= 1:
        assert mean == math.inf
        # the heavy tail: P(delta > b) b -> inf, i.e. no finite mean
        big = np.array([1e4, 1e6, 1e8])
        assert np.all(np.diff(kernel.pitch_sf(big) * big) > 0)
    elif isinstance(kernel, Mixture):
        assert mean == math.inf  # its KerpleLog(1, 1) component has no mean
    else:
        assert mean == pytest.approx(float(integral), rel=1e-10)


def test_kerple_log_tail_index_is_r1():
    kern = KerpleLog(0.7, 0.5)
    b = 1e9
    # P(delta > b) ~ (r1 + 1) (r2 b)^(-r1)
    assert kern.pitch_sf(b) == pytest.approx(1.7 * (0.5 * b) ** -0.7, rel=1e-6)
    assert KerpleLog(2.5, 0.2).mean_pitch() == pytest.approx(2 / (0.2 * 1.5))


# --------------------------------------------------------------------------------------
# Quantiles: round trips and mpmath
# --------------------------------------------------------------------------------------

PROBS = np.array([1e-30, 1e-12, 1e-5, 0.01, 0.3, 0.5, 0.7, 0.99])


def _mp_sf(kernel, d):
    """``P(pitch > d)`` by mpmath quadrature of the density ``delta k''`` in ``log delta``."""
    with mpmath.workdps(30):
        lo = mpmath.log(mpmath.mpf(d))
        pts = sorted({lo, *[lo + e for e in (0.01, 0.1, 1, 3, 10, 30)], mpmath.mpf(700)})
        return mpmath.quad(lambda u: mpmath.exp(2 * u) * kernel.d2k_mp(mpmath.exp(u), 40), pts)


@pytest.mark.parametrize("kernel", ALL, ids=IDS)
def test_quantile_round_trips_in_both_tails(kernel):
    lower = kernel.pitch_quantile(PROBS, 1.0 - PROBS)
    upper = kernel.pitch_quantile(1.0 - PROBS, PROBS)
    assert np.all(np.diff(lower) > 0) and np.all(np.diff(upper) < 0)  # monotone
    assert np.allclose(kernel.pitch_cdf(lower), PROBS, rtol=1e-12, atol=0)
    assert np.allclose(kernel.pitch_sf(upper), PROBS, rtol=1e-12, atol=0)
    assert kernel.pitch_ppf(0.0) == 0.0 and kernel.pitch_ppf(1.0) == math.inf
    assert kernel.pitch_isf(PROBS[2]) == upper[2]


@pytest.mark.parametrize("kernel", ALL, ids=IDS)
def test_quantile_against_mpmath(kernel):
    # the float64 quantile's tail probability by mpmath quadrature of the density: within
    # 1e-13 (1 + elasticity) of q, the elasticity delta p(delta) / q converting the pitch's
    # relative error into q's
    for q in (1e-9, 0.01, 0.5, 0.9):
        d = float(kernel.pitch_isf(q))
        got = float(_mp_sf(kernel, d))
        elasticity = d * float(kernel.pitch_pdf(d)) / q
        assert abs(got - q) <= 1e-13 * (1 + elasticity) * q, (q, d, got)


def test_exponential_quantile_is_the_gamma2_quantile():
    u = np.array([1e-20, 0.2, 0.5, 0.9])
    assert np.array_equal(
        Exponential(7.0).pitch_quantile(u, 1 - u), S.gamma2_quantile(u, 1 - u, 7.0)
    )


# --------------------------------------------------------------------------------------
# Refusals
# --------------------------------------------------------------------------------------


def test_is_builtin_names_the_constructor_checked_kernels_only():
    for kernel in ALL:
        assert is_builtin(kernel), kernel
    # a subclass may redefine k; a mixture is built-in only if every component is
    assert not is_builtin(WrongPitchLog(1.0, 0.5))
    assert not is_builtin(HandExponential(4.0))
    assert not is_builtin(Mixture([0.5, 0.5], [Exponential(1.0), HandExponential(4.0)]))
    assert is_builtin(Mixture([0.5, 0.5], [Exponential(1.0), KerplePower(1.0, 0.5)]))


def test_draw_partition_refuses_a_users_kernel_that_is_not_of_polya_type():
    # the Gaussian has no pitch law: draw_partition used to draw from its "quantile"
    # anyway; now it is refused before any draw, naming the head and the condition
    with pytest.raises(ValueError, match=r"^sigma: head 1: Gaussian is not convex"):
        draw_partition([Exponential(4.0), Gaussian()], num_samples=4, seed=0)
    with pytest.raises(ValueError, match=r"^kernels: head 0: Gaussian is not convex"):
        check_kernels([Gaussian()], polya=True)
    # control: without polya=True the sequence check alone accepts it
    gaussian = Gaussian()
    assert check_kernels([gaussian]) == (gaussian,)
    # a user's valid kernel is accepted and draws pitches of the exponential's law
    # (Gamma(2, sigma): mean 2 sigma); 4000 draws, mean within 6 standard errors
    # (sd of the mean sqrt(2) sigma / sqrt(4000); false failure < 1e-8)
    p = draw_partition([HandExponential(4.0)], num_samples=4000, seed=0)
    assert abs(p.pitch.mean() - 8.0) <= 6 * math.sqrt(2) * 4.0 / math.sqrt(4000)


def test_non_polya_kernels_are_refused_naming_the_condition():
    with pytest.raises(ValueError, match=r"^p: .*not convex"):
        KerplePower(1.0, 2.0)
    with pytest.raises(ValueError, match=r"^kernel: Gaussian is not convex"):
        check_polya(Gaussian())
    with pytest.raises(ValueError, match=r"^weights: must be >= 0"):
        Mixture([1.5, -0.5], [Exponential(1.0), Exponential(4.0)])
    with pytest.raises(ValueError, match=r"^weights: must sum to 1"):
        Mixture([0.5, 0.4], [Exponential(1.0), Exponential(4.0)])
    # the Gaussian is refused by draw_partition-independent checks; the valid ones pass
    for kernel in ALL:
        assert check_polya(kernel) is kernel


def test_negative_weight_mixture_is_indeed_not_convex():
    # why it is refused: 2 e^-r - e^-2r has k'' = 2e^-r - 4e^-2r < 0 at r = 0
    r = np.array([0.01, 0.1])
    assert np.all(2 * np.exp(-r) - 4 * np.exp(-2 * r) < 0)


def test_power_p_above_one_has_negative_pitch_density():
    # the counterexample of the note: delta k''(delta) < 0 near 0 for p = 2
    r1, p = 1.0, 2.0
    d = np.array([0.1, 0.5])
    y = r1 * d**p
    d2k = r1 * p * d ** (p - 2) * np.exp(-y) * (p * y + 1 - p)
    assert np.all(d * d2k < 0)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: Exponential(-1.0), "^sigma:"),
        (lambda: Exponential(float("inf")), "^sigma:"),
        (lambda: KerpleLog(0.0, 1.0), "^r1:"),
        (lambda: KerpleLog(1.0, -2.0), "^r2:"),
        (lambda: KerplePower(-1.0, 0.5), "^r1:"),
        (lambda: KerplePower(1.0, 0.0), "^p:"),
        (lambda: Mixture([1.0], []), "^kernels:"),
    ],
)
def test_bad_parameters_name_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_types_name_the_argument():
    with pytest.raises(TypeError, match="^sigma:"):
        Exponential("3")
    with pytest.raises(TypeError, match="^kernels:"):
        Mixture([1.0], [3.0])
    with pytest.raises(TypeError, match="^sigma:"):
        draw_partition(Exponential(2.0), 4, 0)  # one kernel, not a sequence
    with pytest.raises(TypeError, match="^sigma:"):
        draw_partition([Exponential(2.0), 3.0], 4, 0)
    with pytest.raises(ValueError, match="^kernels: need 2"):
        check_kernels([Exponential(1.0)], num_heads=2)
    with pytest.raises(TypeError, match="^rng:"):
        Exponential(1.0).sample_pitch(0, 3)


def test_kernels_are_frozen():
    kern = KerpleLog(1.0, 2.0)
    with pytest.raises(AttributeError):
        kern.r1 = 3.0
    assert kern == KerpleLog(1, 2) and hash(kern) == hash(KerpleLog(1.0, 2.0))


# --------------------------------------------------------------------------------------
# draw_partition with a kernel per head: the default path is unchanged
# --------------------------------------------------------------------------------------

#: sha256 prefixes of pitch||offset of draw_partition([1, 4, 64, 0.3], 16, seed=12345,
#: head_start=2, ...) computed with the code before kernels were accepted (main at 9f4d212)
PINNED = {
    ("iid", None): "e444422809bc9a124996036ef96a17d5",
    ("stratified", None): "fe5fbecbf7d49840e13eff556796452d",
    ("stratified", 4): "4d9112c42617a0b5680ffba701144866",
    ("shared", 2): "f1aa533edc695e9187d5c8445236968c",
}


@pytest.mark.parametrize("sampler, group", list(PINNED), ids=[f"{a}-{b}" for a, b in PINNED])
def test_default_sigma_path_is_bit_identical_to_the_pinned_draws(sampler, group):
    sig = [1.0, 4.0, 64.0, 0.3]
    part = draw_partition(sig, 16, seed=12345, head_start=2, sampler=sampler, group_size=group)
    digest = hashlib.sha256(part.pitch.tobytes() + part.offset.tobytes()).hexdigest()
    assert digest[:32] == PINNED[(sampler, group)]
    # and the Exponential kernel per head draws the same bits
    kern = [Exponential(x) for x in sig]
    same = draw_partition(kern, 16, seed=12345, head_start=2, sampler=sampler, group_size=group)
    assert same == part


@pytest.mark.parametrize("sampler", ["iid", "stratified", "shared"])
def test_kernel_draws_are_reproducible_sliceable_and_well_formed(sampler):
    kern = [KerpleLog(0.7, 0.5), KerplePower(0.5, 0.5), Exponential(3.0)]
    part = draw_partition(kern, 8, seed=3, sampler=sampler, group_size=None)
    assert part == draw_partition(kern, 8, seed=3, sampler=sampler)
    assert part.heads(1, 3) == draw_partition(kern[1:], 8, seed=3, head_start=1, sampler=sampler)
    assert np.all(part.pitch > 0) and np.all(np.isfinite(part.pitch))
    assert np.all((part.offset >= 0) & (part.offset < part.pitch))
    assert part.sampler == sampler


def test_stratified_pitches_are_the_kernel_quantiles_of_stratified_uniforms():
    from plsh_ref.partition import head_rng

    kern = KerpleLog(0.7, 0.5)
    part = draw_partition([kern], 16, seed=9, sampler="stratified", group_size=4)
    rng = head_rng(9, 0)
    u = rng.random(4)
    want = kern.pitch_quantile((np.arange(4) + u) / 4, (4 - np.arange(4) - u) / 4)
    assert np.array_equal(np.sort(np.unique(part.pitch[0])), np.sort(want))


# --------------------------------------------------------------------------------------
# Monte Carlo: collision frequencies = k(r), iid and stratified, with a negative control
# --------------------------------------------------------------------------------------

DISTANCES = np.array([1, 2, 3, 5, 8, 13, 21, 34])


def _max_z_iid(kernel, seed, s=40000):
    part = draw_partition([kernel], s, seed=seed)
    freq = pair_means(part, DISTANCES)[0]
    k = np.asarray(kernel.k(DISTANCES.astype(float)))
    return float(np.max(np.abs(freq - k) / np.sqrt(k * (1 - k) / s)))


@pytest.mark.parametrize("kernel", ALL, ids=IDS)
def test_iid_collision_frequencies_match_k(kernel):
    # 8 comparisons per kernel: false-failure probability <= 8 * 5.7e-7 = 4.6e-6
    assert _max_z_iid(kernel, seed=2026) < Z


def test_iid_collision_test_rejects_a_wrong_pitch_law():
    # negative control: the same statistic for KERPLE-log's k and the pitch law of r1 + 0.3
    assert _max_z_iid(WrongPitchLog(0.7, 0.5), seed=2026) > 3 * Z


def _stratified_z(kernel, seed, reps=3000, s=16, group=4, law=None):
    """Draws from ``law`` (default ``kernel``), compared with ``kernel``'s k and variance."""
    part = draw_partition([law or kernel] * reps, s, seed=seed, sampler="stratified",
                          group_size=group)  # fmt: skip
    freq = pair_means(part, DISTANCES)  # (reps, distances), independent rows
    k = np.asarray(kernel.k(DISTANCES.astype(float)))
    var = np.asarray(entry_variance(kernel, DISTANCES.astype(float), s, sampler="stratified",
                                    group_size=group))  # fmt: skip
    z_mean = np.abs(freq.mean(axis=0) - k) / np.sqrt(var / reps)
    return freq, var, z_mean


@pytest.mark.parametrize("kernel", [KERNELS["kerple_log_heavy"], KERNELS["kerple_power"]],
                         ids=["kerple_log_heavy", "kerple_power"])  # fmt: skip
def test_stratified_sampler_is_unbiased_with_the_exact_variance(kernel):
    freq, var, z_mean = _stratified_z(kernel, seed=77)
    # 8 mean comparisons (CLT over 3000 independent replicas): 4.6e-6
    assert np.all(z_mean < Z), z_mean
    # the exact variance: sample variance within Z of its standard error (fourth moment
    # from the data), 8 comparisons: 4.6e-6
    dev = freq - freq.mean(axis=0)
    sample_var = (dev**2).sum(axis=0) / (freq.shape[0] - 1)
    se = np.sqrt(np.maximum((dev**4).mean(axis=0) - sample_var**2, 1e-300) / freq.shape[0])
    assert np.all(np.abs(sample_var - var) < Z * se), (sample_var, var)


def test_stratified_test_rejects_a_wrong_pitch_law():
    # negative control: stratified uniforms pushed through the wrong quantile are biased
    _, _, z_mean = _stratified_z(KerpleLog(0.7, 0.5), seed=77, law=WrongPitchLog(0.7, 0.5))
    assert np.max(z_mean) > 3 * Z


# --------------------------------------------------------------------------------------
# Closed forms: E[M] = K, E[M^2], variance of every sampler
# --------------------------------------------------------------------------------------


def test_kernel_matrix_and_expected_mask():
    qpos, kpos = np.array([5, 9, 9, 20]), np.arange(12)
    kern = KerpleLog(0.7, 0.5)
    km = kernel_matrix(kern, qpos, kpos, causal=True)
    want = (1 + 0.5 * np.abs(qpos[:, None] - kpos[None, :])) ** -0.7 * (kpos <= qpos[:, None])
    np.testing.assert_allclose(km, want, rtol=1e-15)
    np.testing.assert_array_equal(
        expected_mask([Exponential(4.0), Exponential(0.5)], qpos, kpos),
        alibi_kernel_matrix(np.array([4.0, 0.5]), qpos, kpos),
    )


def test_expected_mask_square_generalises_the_alibi_closed_form():
    np.testing.assert_allclose(
        expected_mask_square(Exponential(6.0), 40),
        E.expected_mask_square(6.0, np.arange(40)),
        rtol=1e-13,
    )


def test_expected_mask_square_by_monte_carlo():
    kern = KerpleLog(0.7, 0.5)
    n, s = 12, 20000
    part = draw_partition([kern], s, seed=5)
    b = bins(part, np.arange(n))[0]
    m = (b[:, :, None] == b[:, None, :]).astype(float)  # (s, n, n)
    sq = np.einsum("tij,tjk->tik", m, m)
    mean, sd = sq.mean(axis=0), sq.std(axis=0) / math.sqrt(s)
    # 144 comparisons: 144 * 5.7e-7 = 8.2e-5
    assert np.all(np.abs(mean - expected_mask_square(kern, n)) < Z * sd + 1e-12)


@pytest.mark.parametrize("sampler, group", [("iid", None), ("stratified", 4), ("shared", 4),
                                            ("stratified", 1), ("stratified", None)])  # fmt: skip
def test_entry_variance_generalises_the_alibi_formulas(sampler, group):
    r = np.array([0.0, 1.0, 2.0, 5.0, 17.0, 80.0, 400.0])
    got = entry_variance(Exponential(9.0), r, 16, sampler=sampler, group_size=group)
    want = S.entry_variance(r, 9.0, 16, sampler=sampler, group_size=group)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-16)


def test_iid_variance_is_k_one_minus_k_over_s():
    kern = KerplePower(0.5, 0.5)
    r = np.arange(1.0, 30.0)
    k = kern.k(r)
    np.testing.assert_array_equal(entry_variance(kern, r, 8), k * (1 - k) / 8)
    want = 2 * np.sum((30 - r) * k * (1 - k) / 8)
    assert frobenius_error_square(kern, 30, 8) == pytest.approx(want, rel=1e-14)


# --------------------------------------------------------------------------------------
# Block, largest-pitch and window laws
# --------------------------------------------------------------------------------------


def test_block_size_law_generalises_alibi_and_sums_to_one():
    j = np.arange(1, 4000)
    np.testing.assert_allclose(block_size_pmf(Exponential(5.0), j), E.block_size_pmf(j, 5.0),
                               rtol=1e-11, atol=1e-300)  # fmt: skip
    kern = KerpleLog(2.5, 0.2)
    j = np.arange(1, 2_000_001, dtype=float)
    pmf = block_size_pmf(kern, j)
    assert np.all(pmf >= 0)
    assert pmf.sum() == pytest.approx(1.0, abs=1e-6)
    assert block_size_mean(kern) == pytest.approx(float(np.sum(j * pmf)), rel=1e-3)
    assert block_size_mean(Exponential(5.0)) == pytest.approx(E.block_size_mean(5.0), rel=1e-12)


def test_block_size_monte_carlo():
    kern = KerpleLog(0.7, 0.5)
    s, n, x = 20000, 400, 200
    part = draw_partition([kern], s, seed=8)
    b = bins(part, np.arange(n))[0]
    size = (b == b[:, x : x + 1]).sum(axis=1)
    size = size[(b[:, 0] != b[:, x]) & (b[:, -1] != b[:, x])]  # blocks inside the window
    for j in (1, 2, 3, 5):
        p = float(block_size_pmf(kern, j))
        freq = np.mean(size == j)
        # 4 comparisons, 2.3e-6 (the conditioning on interior blocks changes p < 1e-3)
        assert abs(freq - p) < Z * math.sqrt(p * (1 - p) / size.size) + 1e-3


def test_kerple_log_heavy_block_mean_is_infinite():
    kern = KerpleLog(0.7, 0.5)
    assert block_size_mean(kern) == math.inf
    # the partial means grow like C n^(1 - r1) + const: increments per decade -> 10^0.3
    m = [block_size_mean(kern, n) for n in (10**4, 10**5, 10**6)]
    assert (m[2] - m[1]) / (m[1] - m[0]) == pytest.approx(10**0.3, rel=1e-3)


def test_largest_pitch_law():
    kern = KerpleLog(0.7, 0.5)
    for s in (1, 16, 256):
        for q in (0.5, 0.99):
            b = largest_pitch_quantile(kern, q, s)
            assert largest_pitch_sf(kern, b, s) == pytest.approx(1 - q, rel=1e-9)
    # ALiBi: the existing closed form
    assert largest_pitch_quantile(Exponential(4.0), 0.9, 64) == pytest.approx(
        E.largest_pitch_quantile(0.9, 4.0, 64), rel=1e-12
    )
    # KERPLE-log: a power of s, ((r1 + 1) s / (1 - q))^(1/r1) / r2 asymptotically
    b = largest_pitch_quantile(kern, 0.99, 4096)
    assert b == pytest.approx((1.7 * 4096 / 0.01) ** (1 / 0.7) / 0.5, rel=0.01)


def test_largest_pitch_monte_carlo():
    kern = KerpleLog(0.7, 0.5)
    reps, s = 4000, 16
    part = draw_partition([kern] * reps, s, seed=12)
    top = part.pitch.max(axis=1)
    for q in (0.5, 0.9):
        b = largest_pitch_quantile(kern, q, s)
        freq = np.mean(top <= b)
        # 2 comparisons: 1.1e-6
        assert abs(freq - q) < Z * math.sqrt(q * (1 - q) / reps)


def test_window_width_generalises_alibi_and_matches_monte_carlo():
    np.testing.assert_allclose(
        expected_window_width(Exponential(3.0), 8, 50),
        E.expected_window_width(3.0, 8, 50),
        rtol=1e-12,
    )
    kern = KerpleLog(0.7, 0.5)
    n, s, reps = 64, 4, 3000
    part = draw_partition([kern] * reps, s, seed=21)
    width = (counts(part, np.arange(n), np.arange(n)) > 0).sum(axis=2)  # (reps, n)
    want = expected_window_width(kern, s, n)
    mean, sd = width.mean(axis=0), width.std(axis=0) / math.sqrt(reps)
    # 64 comparisons: 3.6e-5
    assert np.all(np.abs(mean - want) < Z * sd)


def test_kerple_log_heavy_window_grows_without_bound():
    kern = KerpleLog(0.7, 0.5)
    w = [expected_window_width(kern, 16, n)[n // 2] for n in (10**3, 10**4, 10**5)]
    assert w[2] / w[1] > 1.9 and w[1] / w[0] > 1.9  # ~ n^(0.3) -> 10^0.3 = 2.0 per decade
    light = [expected_window_width(KerpleLog(2.5, 0.2), 16, n)[n // 2] for n in (10**4, 10**5)]
    assert light[1] / light[0] < 1.01  # r1 > 1: converges


# --------------------------------------------------------------------------------------
# Theorem 2.1 / 2.2 for a general kernel
# --------------------------------------------------------------------------------------


def test_kernel_spectral_bound_reduces_to_the_alibi_bound():
    a = kernel_spectral_error_bound(256, Exponential(8.0), 64, 0.05)
    b = spectral_error_bound(256, 8.0, 64, 0.05)
    assert a.truncation == b.truncation
    assert a.eps == pytest.approx(b.eps, rel=1e-4)


@pytest.mark.parametrize("kernel", [KerpleLog(0.7, 0.5), KerplePower(0.5, 0.5)],
                         ids=["kerple_log_heavy", "kerple_power"])  # fmt: skip
def test_kernel_spectral_bound_holds_on_draws(kernel):
    n, s, delta = 128, 32, 5e-8
    bound = kernel_spectral_error_bound(n, kernel, s, delta)
    pos = np.arange(n)
    kmat = kernel_matrix(kernel, pos, pos)
    errs = []
    for seed in range(20):
        cnt = counts(draw_partition([kernel], s, seed=seed), pos, pos)[0]
        w = np.linalg.eigvalsh(cnt / s - kmat)  # symmetric: the spectral norm
        errs.append(max(-w[0], w[-1]))
    # each draw exceeds eps with probability <= 5e-8 if the theorem holds: 20 draws, 1e-6
    assert max(errs) < bound.eps


def test_max_norm_dkw_bound_holds_for_kerple_log():
    from plsh_ref.bounds import max_norm_error_bound

    kern = KerpleLog(0.7, 0.5)
    n, s = 200, 64
    eps = max_norm_error_bound(n, s, 1e-7)
    pos = np.arange(n)
    kmat = kernel_matrix(kern, pos, pos)
    worst = max(
        np.abs(counts(draw_partition([kern], s, seed=t), pos, pos)[0] / s - kmat).max()
        for t in range(10)
    )
    # DKW holds for any kernel: each draw exceeds eps with probability <= 1e-7; 10 draws, 1e-6
    assert worst < eps


def test_tail_first_moment():
    # ALiBi: e^(-b/sigma) (b^2/sigma + 2b + 2 sigma) (spectral_bound.md); KERPLE: quadrature
    b, sig = 7.0, 3.0
    want = math.exp(-b / sig) * (b * b / sig + 2 * b + 2 * sig)
    assert Exponential(sig).tail_first_moment(b) == pytest.approx(want, rel=1e-13)
    for kern in (KerpleLog(2.5, 0.2), KerplePower(0.5, 0.5)):
        with mpmath.workdps(30):
            lo = mpmath.log(b)
            quad = mpmath.quad(
                lambda u, kern=kern: mpmath.exp(3 * u) * kern.d2k_mp(mpmath.exp(u), 40),
                [lo, lo + 1, lo + 5, lo + 20, 700],
            )
        assert kern.tail_first_moment(b) == pytest.approx(float(quad), rel=1e-8)
    assert KerpleLog(0.7, 0.5).tail_first_moment(b) == math.inf


def test_expected_max_extent_is_the_one_sided_window():
    from plsh_ref.kernels import expected_max_extent

    kern = KerpleLog(0.7, 0.5)
    n, s = 300, 8
    # position 0 of n: window 1 + c_{n-1}
    assert expected_max_extent(kern, s, n - 1) == pytest.approx(
        expected_window_width(kern, s, n)[0] - 1, rel=1e-14
    )
    # Monte Carlo: the right extent of position 0 over s hashes
    reps = 3000
    part = draw_partition([kern] * reps, s, seed=31)
    b = bins(part, np.arange(n))  # (reps, s, n)
    reach = (b == b[:, :, :1]).sum(axis=2).max(axis=1) - 1  # max_t R_t, capped at n - 1
    # 1 comparison: 5.7e-7
    assert abs(reach.mean() - expected_max_extent(kern, s, n - 1)) < Z * reach.std() / math.sqrt(
        reps
    )


# --------------------------------------------------------------------------------------
# The stratified sampler's rate (section 8)
# --------------------------------------------------------------------------------------

N_RATE = 1024
R_RATE = np.arange(1, N_RATE, dtype=float)
W_RATE = 2 * (N_RATE - R_RATE)


def _split(sigma, s, g):
    a, b = S.variance_split(R_RATE, sigma, s, sampler="stratified", group_size=g)
    return float(np.sum(W_RATE * a)), float(np.sum(W_RATE * b))


def test_within_part_is_at_most_a_quarter_over_s_s_prime():
    for sigma in (4.0, 64.0):
        for s, g in ((16, 4), (64, 8), (48, 3), (20, 20)):
            a, _ = S.variance_split(R_RATE, sigma, s, sampler="stratified", group_size=g)
            assert np.all(a <= 1 / (4 * s * g) * (1 + 1e-12))
    # and the bound is not loose by orders: somewhere within 3x of it
    a, _ = S.variance_split(R_RATE, 16.0, 64, sampler="stratified", group_size=8)
    assert a.max() > 1 / (4 * 64 * 8) / 3


def test_within_part_scales_as_one_over_s_s_prime():
    m = 16
    scaled = [_split(16.0, m * g, g)[0] * m * g * g for g in (1, 2, 4, 8, 16, 32, 64)]
    assert max(scaled) / min(scaled) < 1.016


def test_between_part_decays_like_m_to_a_power_decreasing_to_two():
    between = [_split(16.0, m, 1)[1] for m in (4, 16, 64, 256, 1024)]
    exponents = -np.diff(np.log(between)) / np.log(4.0)
    assert np.all((exponents > 2.0) & (exponents < 2.4)), exponents
    assert np.all(np.diff(exponents) < 0), exponents  # decreasing towards 2


def test_stratified_rate_lies_between_the_two_regimes():
    from plsh_ref.experiments.reproduce import fit_loglog_slope

    s = np.array([4, 8, 16, 32, 64, 128, 256])
    for sigma in (4.0, 16.0, 64.0):
        strat = [S.frobenius_error_square(sigma, N_RATE, int(x), sampler="stratified") for x in s]
        iid = [S.frobenius_error_square(sigma, N_RATE, int(x)) for x in s]
        slope = fit_loglog_slope(s, np.sqrt(strat))
        assert -0.75 < slope < -2 / 3, (sigma, slope)
        assert fit_loglog_slope(s, np.sqrt(iid)) == pytest.approx(-0.5, abs=1e-12)


def test_check_polya_refuses_a_kernel_without_limit_zero():
    class Plateau(DistanceKernel):
        """``(1 + e^-r) / 2``: convex and decreasing but tends to 1/2 (k -> 0 fails)."""

        def k(self, r):
            return 0.5 * (1 + np.exp(-np.asarray(r, dtype=float)))

        def dk(self, r):
            return -0.5 * np.exp(-np.asarray(r, dtype=float))

        def d2k(self, r):
            return 0.5 * np.exp(-np.asarray(r, dtype=float))

    with pytest.raises(ValueError, match="^kernel: Plateau does not tend to 0"):
        check_polya(Plateau())


def test_stratified_largest_pitch_is_the_top_stratum():
    kern = KerpleLog(0.7, 0.5)
    reps, s, g = 4000, 16, 4
    m = s // g
    part = draw_partition([kern] * reps, s, seed=13, sampler="stratified", group_size=g)
    top = part.pitch.max(axis=1)
    for q in (0.5, 0.9):
        b = float(kern.pitch_isf((1 - q) / m))  # P(max > b) = m P(delta > b) = 1 - q
        freq = np.mean(top <= b)
        # 2 comparisons: 1.1e-6
        assert abs(freq - q) < Z * math.sqrt(q * (1 - q) / reps)
    # negative control: the iid law of the largest of m pitches is a different quantile
    b_iid = largest_pitch_quantile(kern, 0.3, m)
    assert abs(np.mean(top <= b_iid) - 0.3) > Z * math.sqrt(0.21 / reps)


@pytest.mark.parametrize("sampler", ["iid", "stratified", "shared"])
@pytest.mark.parametrize(
    "kernel",
    [Exponential(4.0), KerpleLog(0.7, 0.25), KerplePower(0.4, 0.5), KerplePower(1.0, 1.0)],
    ids=repr,
)
def test_entry_variance_vanishes_at_distance_zero(kernel, sampler):
    # M~_ii = 1 in every draw, so Var = 0 at r = 0, and the variance is continuous there;
    # KERPLE-power with p < 1 has k'(0) = -inf, where 0 * k'(0) once gave NaN
    var = np.asarray(entry_variance(kernel, [0.0, 1e-9], 16, sampler=sampler), dtype=float)
    assert np.all(np.isfinite(var)), var
    assert abs(var[0]) <= 1e-15
    assert 0.0 <= var[1] <= 1e-5
