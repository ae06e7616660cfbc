"""Partition samples, bins, blocks, masks, counts and ``E[M] = L*`` (SPEC section 2).

The claims are derived in ``proofs_notes/collision_probability.md``.
"""

import math
from fractions import Fraction

import numpy as np
import pytest
from _oracles import binary64_bin, exact_rational_bin, round_to_double
from hypothesis import given
from hypothesis import strategies as st
from scipy import integrate, stats

from plsh_ref.alibi import kernel_matrix
from plsh_ref.partition import (
    PartitionSample,
    bins,
    block_sizes,
    blocks,
    counts,
    draw_partition,
    empirical_mean,
    head_rng,
    masks,
)

SIGMAS = st.sampled_from([0.3, 1.0, 1.4142135623730951, 4.0, 16.0, 256.0, 1e4])


# ---------------------------------------------------------------------------------------
# Drawing: the documented recipe, reproducibility, one stream per global head.


@given(st.integers(0, 2**63), st.integers(1, 6), st.integers(1, 5))
def test_draw_follows_documented_recipe(seed, num_heads, num_samples):
    sigma = np.linspace(0.5, 40.0, num_heads)
    part = draw_partition(sigma, num_samples, seed)
    children = np.random.SeedSequence(seed).spawn(num_heads)
    for h in range(num_heads):
        rng = np.random.default_rng(children[h])
        pitch = rng.gamma(2.0, scale=sigma[h], size=num_samples)
        offset = pitch * rng.random(num_samples)
        np.testing.assert_array_equal(part.pitch[h], pitch)
        np.testing.assert_array_equal(part.offset[h], offset)
        # head_rng is the same stream
        np.testing.assert_array_equal(
            head_rng(seed, h).gamma(2.0, scale=sigma[h], size=num_samples), pitch
        )
    assert part.pitch.dtype == part.offset.dtype == np.float64
    assert np.all((part.offset >= 0) & (part.offset < part.pitch))


@given(st.integers(0, 2**32), st.integers(2, 8), st.data())
def test_slicing_heads_equals_drawing_with_head_start(seed, num_heads, data):
    sigma = 2.0 ** np.arange(num_heads)
    full = draw_partition(sigma, 7, seed)
    h = data.draw(st.integers(0, num_heads - 1))
    stop = data.draw(st.integers(h + 1, num_heads))
    assert draw_partition(sigma[h : h + 1], 7, seed, head_start=h) == full.heads(h, h + 1)
    assert draw_partition(sigma[h:stop], 7, seed, head_start=h) == full.heads(h, stop)
    # Same masks on the slice as on the full draw.
    pos = np.arange(-5, 30)
    np.testing.assert_array_equal(
        masks(draw_partition(sigma[h:stop], 7, seed, head_start=h), pos, pos),
        masks(full, pos, pos)[h:stop],
    )


def test_seed_reproducible_and_distinct():
    sigma = [3.0, 9.0]
    assert draw_partition(sigma, 5, 123) == draw_partition(sigma, 5, 123)
    assert not draw_partition(sigma, 5, 123) == draw_partition(sigma, 5, 124)
    # Heads with equal sigma still get different streams.
    same = draw_partition([4.0, 4.0], 5, 0)
    assert not np.array_equal(same.pitch[0], same.pitch[1])
    # seed=None draws fresh entropy and still gives a valid sample.
    fresh = draw_partition(sigma, 3)
    assert fresh.pitch.shape == (2, 3)


def test_pitch_and_offset_distributions():
    """pitch ~ Gamma(2, scale=sigma), offset / pitch ~ U[0, 1): exact KS tests.

    Under the null the KS p-value is uniform, so each assertion fails with probability
    1e-6 (four assertions: false-failure probability <= 4e-6).
    """
    sigma = np.array([0.7, 64.0])
    part = draw_partition(sigma, 20000, seed=2026)
    for h in range(2):
        p_pitch = stats.kstest(part.pitch[h], stats.gamma(2.0, scale=sigma[h]).cdf).pvalue
        p_off = stats.kstest(part.offset[h] / part.pitch[h], stats.uniform().cdf).pvalue
        assert p_pitch > 1e-6 and p_off > 1e-6


def test_partition_sample_round_trip_and_immutable(tmp_path):
    part = draw_partition([2.0, 5.0, 11.0], 4, seed=9)
    path = tmp_path / "sample.npz"
    part.save(path)
    loaded = PartitionSample.load(path)
    assert loaded == part
    assert loaded.num_heads == 3 and loaded.num_samples == 4
    with pytest.raises(ValueError):
        part.pitch[0, 0] = 1.0  # read-only arrays: a sample cannot change after drawing
    assert part.samples(1, 3) == PartitionSample(part.pitch[:, 1:3], part.offset[:, 1:3])


# ---------------------------------------------------------------------------------------
# Bins: the binary64 definition, and how it relates to exact rational arithmetic.


def _rounding_bound(q: Fraction) -> Fraction:
    """Largest possible |fl(fl(p - u) / delta) - q| for the exact quotient ``q``.

    ``fl(p - u) = (p - u)(1 + e1)`` with ``|e1| <= 2^-53`` (a subnormal difference of two
    doubles is exact); ``fl(x / delta) = (x / delta)(1 + e2) + eta`` with ``|e2| <= 2^-53``,
    ``|eta| <= 2^-1075`` (underflow). Hence ``|Q - q| <= |q| (2^-52 + 2^-106) + 2^-1075``:
    between one and two ulps of ``q``.
    """
    return abs(q) * (Fraction(1, 2**52) + Fraction(1, 2**106)) + Fraction(1, 2**1075)


def _distance_to_integer(q: Fraction) -> Fraction:
    f = q - math.floor(q)
    return min(f, 1 - f)


def _check_bins_against_oracles(part, positions):
    """Compare bins() with the Fraction oracles; return (#evaluations, #near-integer, #differ)."""
    got = bins(part, positions)
    near = differ = 0
    for h in range(part.num_heads):
        for t in range(part.num_samples):
            u, delta = float(part.offset[h, t]), float(part.pitch[h, t])
            for idx, p in enumerate(positions):
                assert got[h, t, idx] == binary64_bin(int(p), u, delta), (p, u, delta)
                exact, q = exact_rational_bin(int(p), u, delta)
                is_near = _distance_to_integer(q) <= _rounding_bound(q)
                near += is_near
                if exact != got[h, t, idx]:
                    differ += 1
                    # The exact floor and the binary64 floor differ only when the exact
                    # quotient lies within rounding B(q) of an integer, by at most
                    # ceil(B(q)) bins: by exactly one while B(q) < 1 (|q| < 2^52 - 1),
                    # by up to 2 ulp(q) beyond (proofs_notes/collision_probability.md, 6).
                    bound = _rounding_bound(q)
                    assert is_near, (p, u, delta)
                    assert 1 <= abs(exact - got[h, t, idx]) <= math.ceil(bound), (p, u, delta)
                    if bound < 1:
                        assert abs(exact - got[h, t, idx]) == 1, (p, u, delta)
    return got.size, near, differ


@given(
    st.integers(0, 2**32),
    SIGMAS,
    st.lists(st.integers(-(2**53) + 1, 2**53 - 1), min_size=1, max_size=6),
    st.integers(-(2**52), 2**52),
)
def test_bins_equal_binary64_and_exact_rational_on_drawn_samples(seed, sigma, far, base):
    part = draw_partition([sigma], 6, seed)
    positions = np.array(far + [base + i for i in range(8)], dtype=np.int64)
    _, _, _ = _check_bins_against_oracles(part, positions)
    assert bins(part, positions).dtype == np.int64


@st.composite
def near_integer_hashes(draw):
    """Offsets chosen so that the exact quotient (p - u) / delta is within ulps of an integer."""
    delta = draw(st.floats(0.01, 1e6, allow_nan=False, allow_infinity=False))
    k = draw(st.integers(-(10**6), 10**6))
    p = draw(st.integers(-(10**9), 10**9))
    u = round_to_double(Fraction(p) - k * Fraction(delta))
    for _ in range(draw(st.integers(0, 3))):
        u = float(np.nextafter(u, draw(st.sampled_from([-np.inf, np.inf]))))
    return delta, u, p


@given(st.lists(near_integer_hashes(), min_size=1, max_size=8))
def test_bins_binary64_on_near_integer_quotients(hashes):
    delta = np.array([[h[0] for h in hashes]])
    offset = np.array([[h[1] for h in hashes]])
    part = PartitionSample(delta, offset)
    for t, (_, _, p) in enumerate(hashes):
        got = bins(part.samples(t, t + 1), [p])[0, 0, 0]
        assert got == binary64_bin(p, offset[0, t], delta[0, t])
        exact, q = exact_rational_bin(p, offset[0, t], delta[0, t])
        if got != exact:
            assert _distance_to_integer(q) <= _rounding_bound(q)


def test_bins_witnesses_where_binary64_and_exact_floor_differ():
    # fl(3 / 0.1) = 30 although 3 / fl(0.1) < 30 exactly: the division rounds up.
    part = PartitionSample([[0.1]], [[0.0]])
    assert bins(part, [3])[0, 0, 0] == 30
    assert exact_rational_bin(3, 0.0, 0.1)[0] == 29
    # fl(4 - 1e-17) = 4: the subtraction rounds up.
    part = PartitionSample([[1.0]], [[1e-17]])
    assert bins(part, [4])[0, 0, 0] == 4
    assert exact_rational_bin(4, 1e-17, 1.0)[0] == 3
    # Near 2^53 with a small pitch, B(q) ~ 2^7.6 and the floors differ by 63 bins, not one.
    p = 2**53 - 3
    part = PartitionSample([[0.01]], [[0.0]])
    exact, q = exact_rational_bin(p, 0.0, 0.01)
    assert bins(part, [p])[0, 0, 0] - exact == 63 <= math.ceil(_rounding_bound(q))
    assert _rounding_bound(Fraction(2**52 - 1)) < 1 <= _rounding_bound(Fraction(2**52))
    # A sweep of constructed near-integer hashes: both directions occur and each one is
    # within the rounding bound (checked inside the helper).
    delta, offset = [], []
    for k in range(1, 400):
        d = 0.1 * k + 0.013
        delta.append(d)
        offset.append(round_to_double(Fraction(1000) - 7 * Fraction(d)))
    part = PartitionSample(np.array([delta]), np.array([offset]))
    total, near, differ = _check_bins_against_oracles(part, np.array([1000]))
    assert total == 399 and near > 0 and differ > 0


# ---------------------------------------------------------------------------------------
# Blocks: contiguous runs of floor(delta) or ceil(delta) positions.


@given(st.integers(0, 2**32), SIGMAS, st.integers(-(2**40), 2**40), st.integers(1, 60))
def test_blocks_are_contiguous_with_floor_or_ceil_sizes(seed, sigma, base, n):
    part = draw_partition([sigma], 4, seed)
    positions = base + np.arange(n)
    b = bins(part, positions)
    assert np.all(np.diff(b, axis=-1) >= 0)  # binary64 bins are monotone in p
    for t in range(4):
        blks = blocks(part, positions, 0, t)
        assert np.array_equal(np.concatenate(blks), np.arange(n))
        for blk in blks:
            assert np.array_equal(blk, np.arange(blk[0], blk[-1] + 1))  # contiguous
        delta, u = float(part.pitch[0, t]), float(part.offset[0, t])
        # Exact arithmetic: an interior block holds every integer of
        # [u + b delta, u + (b+1) delta), floor(delta) or ceil(delta) of them. Binary64 bins
        # differ from the exact ones only at quotients within rounding of an integer (one
        # bin off, see the bins tests), which moves each block end by at most one position.
        # Far from 0 this does happen (about 2e-5 of evaluations at p ~ 2^40), so the
        # assertion is conditioned on it rather than given a probability.
        exact = [exact_rational_bin(int(p), u, delta)[0] for p in positions]
        _, exact_sizes = np.unique(exact, return_counts=True)
        for size in exact_sizes[1:-1]:
            assert size in (math.floor(delta), math.ceil(delta))
        moved = int(np.sum(np.asarray(exact) != b[0, t]))
        for blk in blks[1:-1]:
            assert math.floor(delta) - 2 * moved <= blk.size <= math.ceil(delta) + 2 * moved
            if moved == 0:
                assert blk.size in (math.floor(delta), math.ceil(delta))
        sizes = block_sizes(part, positions)[0][t]
        assert sizes.tolist() == [blk.size for blk in blks]


@given(
    st.integers(0, 2**32),
    SIGMAS,
    st.one_of(st.integers(-(2**20), 2**20), st.integers(-(2**53) + 1, 2**53 - 41)),
    st.integers(1, 40),
)
def test_binary64_block_ends_and_sizes_within_the_rounding_bound(seed, sigma, base, n):
    """proofs_notes/collision_probability.md section 6 and largest_pitch.md section 3.

    With B the largest rounding bound B(q) over the run: each block end of the binary64
    bins is within floor(2 delta B) + 1 positions of the exact one (one position when
    |p| + delta <= 2^50), and a binary64 block has at most ceil((1 + 2B) delta) positions.
    """
    part = draw_partition([sigma], 3, seed)
    positions = base + np.arange(n)
    got = bins(part, positions)
    for t in range(3):
        delta, u = float(part.pitch[0, t]), float(part.offset[0, t])
        exact, quotients = zip(*(exact_rational_bin(int(p), u, delta) for p in positions))
        exact, b64 = np.asarray(exact), got[0, t]
        bound = max(_rounding_bound(q) for q in quotients)
        moves = math.floor(2 * Fraction(delta) * bound) + 1
        if max(abs(int(positions[0])), abs(int(positions[-1]))) + delta <= 2**50:
            assert moves == 1
        # The end of bin k is where the first position with bin >= k sits; the count of
        # positions below it changes only at k = (a bin value) + 1.
        for k in set(exact.tolist()) | set(b64.tolist()):
            for level in (k, k + 1):
                assert abs(int(np.sum(b64 < level)) - int(np.sum(exact < level))) <= moves
        _, sizes = np.unique(b64, return_counts=True)
        assert sizes.max() <= math.ceil((1 + 2 * bound) * Fraction(delta))


def test_binary64_block_can_exceed_ceil_pitch_near_2_53():
    # delta = 0.7: exact blocks hold one position (or none), but near 2^53 the quotients of
    # two neighbours (1/0.7 apart) round to the same even integer: a binary64 block of 2.
    delta = 0.7
    positions = np.array([2**53 - 197, 2**53 - 196])
    part = PartitionSample([[delta]], [[0.0]])
    assert [exact_rational_bin(int(p), 0.0, delta)[0] for p in positions] == [
        math.floor(Fraction(int(p)) / Fraction(delta)) for p in positions
    ]
    assert len({exact_rational_bin(int(p), 0.0, delta)[0] for p in positions}) == 2
    assert block_sizes(part, positions)[0][0].tolist() == [2] and math.ceil(delta) == 1
    _, q = exact_rational_bin(int(positions[-1]), 0.0, delta)
    assert 2 <= math.ceil((1 + 2 * _rounding_bound(q)) * Fraction(delta))


def test_mask_spectrum_is_its_block_sizes():
    part = draw_partition([3.0], 3, seed=5)
    pos = np.arange(25)
    m = masks(part, pos, pos).astype(np.float64)
    for t in range(3):
        eig = np.linalg.eigvalsh(m[0, t])
        nonzero = np.sort(eig[np.abs(eig) > 1e-9])
        np.testing.assert_allclose(nonzero, np.sort(block_sizes(part, pos)[0][t]), atol=1e-9)
        assert np.sum(np.abs(eig) <= 1e-9) == 25 - len(block_sizes(part, pos)[0][t])


# ---------------------------------------------------------------------------------------
# Masks, counts and M~.


@given(
    st.integers(0, 2**32),
    st.integers(1, 3),
    st.integers(1, 6),
    st.lists(st.integers(-30, 30), max_size=10),
    st.lists(st.integers(-30, 30), max_size=10),
    st.booleans(),
)
def test_counts_equal_sum_of_masks(seed, num_heads, s, qpos, kpos, causal):
    part = draw_partition(np.linspace(1.0, 9.0, num_heads), s, seed)
    m = masks(part, qpos, kpos, causal=causal)
    c = counts(part, qpos, kpos, causal=causal)
    assert m.dtype == np.bool_ and m.shape == (num_heads, s, len(qpos), len(kpos))
    assert c.dtype == np.int64 and c.shape == (num_heads, len(qpos), len(kpos))
    bq, bk = bins(part, qpos), bins(part, kpos)
    for h in range(num_heads):
        for t in range(s):
            for i, pi in enumerate(qpos):
                for j, pj in enumerate(kpos):
                    expected = bq[h, t, i] == bk[h, t, j] and not (causal and pj > pi)
                    assert m[h, t, i, j] == expected
    np.testing.assert_array_equal(c, m.sum(axis=1))
    np.testing.assert_array_equal(empirical_mean(part, qpos, kpos, causal=causal), c / s)
    if s > 1:  # counts of disjoint sample ranges add up
        np.testing.assert_array_equal(
            c,
            counts(part.samples(0, 1), qpos, kpos, causal=causal)
            + counts(part.samples(1), qpos, kpos, causal=causal),
        )


def test_equal_positions_always_collide():
    part = draw_partition([0.2, 50.0], 9, seed=1)
    pos = [4, -7, 4, 2**45]
    c = counts(part, pos, pos)
    assert np.all(np.diagonal(c, axis1=1, axis2=2) == 9)
    assert np.all(c[:, 0, 2] == 9)


# ---------------------------------------------------------------------------------------
# Collision probability and E[M] = L*.


@pytest.mark.parametrize("sigma", [0.5, 4.0, 64.0])
@pytest.mark.parametrize("ratio", [0.0, 0.1, 1.0, 3.0, 10.0])
def test_collision_probability_integral(sigma, ratio):
    """E_delta[max(0, 1 - r / delta)] with delta ~ Gamma(2, sigma) equals exp(-r / sigma)."""
    r = ratio * sigma
    density = stats.gamma(2.0, scale=sigma).pdf
    value, err = integrate.quad(
        lambda d: (1 - r / d) * density(d), r, np.inf, epsabs=1e-13, epsrel=1e-12
    )
    assert err < 1e-10
    assert abs(value - np.exp(-r / sigma)) <= 1e-10


@pytest.mark.parametrize("delta", [0.37, 1.0, 2.5, 7.3, 40.0])
def test_collision_probability_given_pitch_on_offset_grid(delta):
    """For a fixed pitch, the fraction of offsets u in [0, delta) that put x and x + r in the
    same bin is max(0, 1 - r / delta). Deterministic: G offsets on a midpoint grid; the
    colliding offsets form at most two intervals (four endpoints), so the grid count is
    within 4 of G (1 - r/delta)^+ (each endpoint misplaces at most one grid point)."""
    grid = 4000
    offsets = (np.arange(grid) + 0.5) * (delta / grid)
    part = PartitionSample(np.full((1, grid), delta), offsets[None])
    for x in (0, 3, 1000003):
        for r in (0, 1, 2, 5, 39):
            b = bins(part, [x, x + r])[0]
            frac = np.mean(b[:, 0] == b[:, 1])
            assert abs(frac - max(0.0, 1.0 - r / delta)) <= 4 / grid


def _binomial_acceptance(n, p, alpha):
    """Interval [lo, hi] with P[X < lo] + P[X > hi] <= alpha for X ~ Binomial(n, p)."""
    lo = stats.binom.ppf(alpha / 2, n, p)
    hi = stats.binom.isf(alpha / 2, n, p)
    return lo, hi


def _collision_test(part, sigmas, bases, distances, alpha):
    """Per head, base and distance: is the number of colliding hashes inside the exact
    binomial acceptance interval of level alpha for p = exp(-r / sigma)?"""
    outcomes = []
    for h, sigma in enumerate(sigmas):
        for x in bases:
            positions = [x] + [x + r for r in distances]
            b = bins(part.heads(h, h + 1), positions)[0]
            for idx, r in enumerate(distances, start=1):
                hits = int(np.sum(b[:, 0] == b[:, idx]))
                lo, hi = _binomial_acceptance(part.num_samples, math.exp(-r / sigma), alpha)
                outcomes.append((sigma, x, r, hits, lo <= hits <= hi))
    return outcomes


SIGMA_MC = [1.5, 4.0, 16.0]
BASES_MC = [0, 7, 1_000_003, 2**30 + 1]
DIST_MC = [1, 2, 5, 13, 40]
N_MC = 60_000


def test_expected_mask_is_kernel_matrix_monte_carlo():
    """E[M(h)_xy] = exp(-|x - y| / sigma) for each of 60 fixed pairs (3 sigmas x 4 base
    positions x 5 distances), N = 60000 independent hashes each.

    The count of collisions is Binomial(N, exp(-r/sigma)) exactly; each check uses the
    exact binomial acceptance interval of level 1e-9 / 60 (Bonferroni), so the
    false-failure probability of the whole test is <= 1e-9. Binary64 bins shift the
    collision probability by at most 2^-51 ((|x| + |y|) / sigma + 2) (see
    proofs_notes/collision_probability.md): below 2e-6 here, a thousandth of the
    acceptance half-width, so the level is unaffected.
    """
    part = draw_partition(SIGMA_MC, N_MC, seed=20260514)
    k = len(SIGMA_MC) * len(BASES_MC) * len(DIST_MC)
    outcomes = _collision_test(part, SIGMA_MC, BASES_MC, DIST_MC, alpha=1e-9 / k)
    assert len(outcomes) == k
    assert all(ok for *_, ok in outcomes), [o for o in outcomes if not o[-1]]


def test_expected_mask_negative_control_exponential_pitch():
    """Negative control: pitches ~ Gamma(1, sigma) (exponential) give the collision
    probability exp(-r/sigma) - (r/sigma) E1(r/sigma) != exp(-r/sigma); the same test must
    reject. With N = 60000 the smallest gap here (r/sigma = 2.5: 0.062 against a binomial
    standard deviation of 5.7e-4) is over 100 standard deviations, while the acceptance
    interval is about 7 standard deviations wide on each side, so the control fails to
    reject with probability far below 1e-9."""
    rng = np.random.default_rng(7)
    pitch = rng.exponential(scale=1.0, size=(1, N_MC)) * np.array(SIGMA_MC[1:2])[:, None]
    offset = pitch * rng.random(pitch.shape)
    outcomes = _collision_test(
        PartitionSample(pitch, offset), SIGMA_MC[1:2], [0], [1, 2, 5, 10], alpha=1e-9 / 60
    )
    assert all(not ok for *_, ok in outcomes), outcomes


def test_empirical_mean_matrix_dkw():
    """max_ij |M~ - L*| on 48 aligned positions, sigma = 4, s = 20000 independent hashes.

    Each half-row of M~ is the empirical survival function of s i.i.d. block extents, so
    by Dvoretzky-Kiefer-Wolfowitz-Massart P[sup > eps] <= 2 exp(-2 s eps^2) per half-row;
    over 2 n half-rows the false-failure probability is <= 1e-9 for the eps below.
    """
    n, s, sigma = 48, 20000, 4.0
    part = draw_partition([sigma], s, seed=11)
    pos = np.arange(n)
    err = np.max(np.abs(empirical_mean(part, pos, pos)[0] - kernel_matrix(sigma, pos, pos)))
    eps = math.sqrt(math.log(2 * 2 * n / 1e-9) / (2 * s))
    assert err <= eps, (err, eps)
    # Causal M~ is the causal mask times M~ (same hashes).
    np.testing.assert_array_equal(
        empirical_mean(part, pos, pos, causal=True)[0], np.tril(empirical_mean(part, pos, pos)[0])
    )


def test_variance_of_empirical_mean():
    """Var(M~_xy) = L*(1 - L*) / s for independent hashes: the counts C of K = 100000
    disjoint groups of s = 4 hashes satisfy E[(C - s p)^2 / s] = p (1 - p).

    Y = (C - s p)^2 / s lies in [0, s]; Hoeffding with Bonferroni over the 3 distances
    gives a false-failure probability <= 1e-9 for the tolerance t below. (Fully correlated
    hashes would give s p (1 - p), four times larger.)
    """
    s, groups, sigma = 4, 100_000, 6.0
    part = draw_partition([sigma], s * groups, seed=314)
    t = s * math.sqrt(math.log(2 * 3 / 1e-9) / (2 * groups))
    for r in (1, 6, 15):
        b = bins(part, [10, 10 + r])[0]
        c = (b[:, 0] == b[:, 1]).reshape(groups, s).sum(axis=1)
        p = math.exp(-r / sigma)
        y = (c - s * p) ** 2 / s
        assert abs(y.mean() - p * (1 - p)) <= t, (r, y.mean(), p * (1 - p), t)
