"""Variance-reduced partition samplers (``proofs_notes/samplers.md``).

Statistical tests draw ``R`` independent replicas of one head as ``R`` heads of one
partition (each head has its own stream), use fixed seeds, and threshold a z-score at 4.5:
a false failure has probability ``2 Phi(-4.5) = 6.8e-6`` per comparison (each test states
its count). Every statistical test has a negative control that the same statistic rejects.
"""

from __future__ import annotations

import dataclasses
import math

import _paths
import mpmath
import numpy as np
import pytest
import torch
from _cpu_problems import make_problem

import plsh_ref.bounds as bounds
from plsh_ref import samplers as S
from plsh_ref.expectation import expected_window_width, largest_pitch_sf, pitch_sf
from plsh_ref.partition import (
    PartitionSample,
    bins,
    draw_partition,
    empirical_mean,
    head_rng,
)

Z = 4.5  # two-sided false-failure probability 6.8e-6 per comparison


def pair_means(partition, distances, start=0):
    """``M~`` between position ``start`` and ``start + r`` per head: ``(R, len(distances))``."""
    pos = np.concatenate([[start], start + np.asarray(distances)])
    b = bins(partition, pos)
    return (b[:, :, :1] == b[:, :, 1:]).mean(axis=1)


def replicas(sigma, s, reps, seed, **kw):
    return draw_partition(np.full(reps, float(sigma)), s, seed, **kw)


# --------------------------------------------------------------------------------------
# draw_partition: iid unchanged, reproducibility, structure, validation
# --------------------------------------------------------------------------------------


def test_iid_default_is_the_documented_recipe_bit_for_bit():
    sigma = np.array([3.0, 50.0])
    part = draw_partition(sigma, 7, 11)
    assert part == draw_partition(sigma, 7, 11, sampler="iid", group_size=1)
    for h in range(2):
        rng = head_rng(11, h)
        pitch = rng.gamma(2.0, scale=sigma[h], size=7)
        assert np.array_equal(part.pitch[h], pitch)
        assert np.array_equal(part.offset[h], pitch * rng.random(7))
    assert part.sampler == "iid"


def test_stratified_draw_is_the_documented_recipe():
    # the stream order of the draw_partition docstring: U, phase, permutation per head
    sigma, s, g = np.array([3.0, 40.0]), 12, 3
    m = s // g
    part = draw_partition(sigma, s, 9, head_start=1, sampler="stratified", group_size=g)
    for h in range(2):
        rng = head_rng(9, 1 + h)
        pitch = S.stratified_pitch(rng.random(m), sigma[h])
        phase = rng.random(m)
        order = rng.permutation(m)
        for i, k in enumerate(order):
            cols = slice(i * g, (i + 1) * g)
            assert np.all(part.pitch[h, cols] == pitch[k])
            want = pitch[k] * ((phase[k] + np.arange(g) / g) % 1.0)
            np.testing.assert_array_equal(part.offset[h, cols], want)


@pytest.mark.parametrize("sampler", ["stratified", "shared"])
def test_heads_slice_equals_head_start_draw(sampler):
    sigma = np.array([2.0, 8.0, 32.0, 128.0])
    full = draw_partition(sigma, 12, 5, sampler=sampler, group_size=3)
    part = draw_partition(sigma[1:3], 12, 5, head_start=1, sampler=sampler, group_size=3)
    assert full.heads(1, 3) == part
    assert part.sampler == sampler
    assert full == draw_partition(sigma, 12, 5, sampler=sampler, group_size=3)
    assert full != draw_partition(sigma, 12, 6, sampler=sampler, group_size=3)


def test_stratified_structure():
    sigma, s, g = 7.0, 24, 4
    m = s // g
    part = draw_partition([sigma], s, 3, sampler="stratified", group_size=g)
    pitch, offset = part.pitch[0].reshape(m, g), part.offset[0].reshape(m, g)
    assert np.all(pitch == pitch[:, :1])  # a group shares its pitch
    edges = S.stratum_edges(sigma, m)
    strata = np.searchsorted(edges, pitch[:, 0]) - 1
    assert sorted(strata) == list(range(m))  # one pitch per stratum, in random order
    assert np.all((offset >= 0) & (offset < pitch))
    spacing = np.diff(np.sort(offset, axis=1), axis=1)  # systematic: delta / s' apart
    np.testing.assert_allclose(spacing, pitch[:, 1:] / g, rtol=1e-12)


def test_stratified_pitch_replaces_exact_zero():
    assert S.stratified_pitch([0.0, 0.5], 1.0)[0] > 0


def test_sampler_round_trip_and_equality(tmp_path):
    part = draw_partition([4.0], 8, 0, sampler="stratified")
    part.save(tmp_path / "p.npz")
    back = PartitionSample.load(tmp_path / "p.npz")
    assert back == part and back.sampler == "stratified"
    assert PartitionSample(part.pitch, part.offset) != part  # provenance is compared
    assert part.samples(0, 4).sampler == "stratified"
    assert "stratified" in repr(part)
    np.savez(tmp_path / "old.npz", pitch=part.pitch, offset=part.offset)  # older files
    assert PartitionSample.load(tmp_path / "old.npz").sampler == "iid"


@pytest.mark.parametrize(
    "kwargs, name, exc",
    [
        ({"sampler": "lhs"}, "sampler", ValueError),
        ({"sampler": 3}, "sampler", TypeError),
        ({"sampler": "stratified", "group_size": 5}, "group_size", ValueError),
        ({"sampler": "stratified", "group_size": 0}, "group_size", ValueError),
        ({"sampler": "stratified", "group_size": 2.0}, "group_size", TypeError),
        ({"sampler": "iid", "group_size": 2}, "group_size", ValueError),
    ],
)
def test_bad_sampler_arguments(kwargs, name, exc):
    with pytest.raises(exc, match=f"^{name}"):
        draw_partition([1.0], 12, 0, **kwargs)
    with pytest.raises(exc, match=f"^{name}"):
        S.entry_variance(1.0, 1.0, 12, **kwargs)
    with pytest.raises(exc, match=f"^{name}"):
        PartitionSample([[1.0]], [[0.0]], kwargs["sampler"]) if name == "sampler" else (
            S.resolve_group_size(kwargs["sampler"], 12, kwargs["group_size"])
        )


def test_default_group_size_rule():
    assert [S.default_group_size(s) for s in (1, 4, 7, 16, 64, 256, 1024)] == [
        1, 1, 1, 2, 4, 8, 16,
    ]  # fmt: skip
    # at s = 64 the rule is the exact optimum for each sigma of the goal
    for sigma in (4.0, 16.0, 64.0):
        assert S.optimal_group_size(sigma, 1024, 64) == S.default_group_size(64)


def test_gamma2_quantile_accuracy_in_both_tails():
    # relative error in x from the residual of the defining equation at 400 digits:
    # dx / x = (F(x) - lower) / (x f(x)), F(x) = 1 - (1 + x) e^-x, f(x) = x e^-x
    worst = 0.0
    with mpmath.workdps(400):
        for p in [1e-300, 1e-100, 1e-20, 1e-8, 1e-3, 0.3, 0.5]:
            for lo, up in ((p, 1.0 - p), (1.0 - p, p)):
                x = float(S.gamma2_quantile(np.array(lo), np.array(up), 1.0))
                xm = mpmath.mpf(x)
                if lo < 0.5:
                    resid = (1 - (1 + xm) * mpmath.exp(-xm)) - mpmath.mpf(lo)
                else:
                    resid = mpmath.mpf(up) - (1 + xm) * mpmath.exp(-xm)
                worst = max(worst, abs(float(resid / (xm * xm * mpmath.exp(-xm)))))
    assert worst < 1e-13, worst
    # negative control: forming 1 - upper by subtraction loses the lower tail
    bad = float(S.gamma2_quantile(np.array(1.0 - (1.0 - 1e-20)), np.array(1.0 - 1e-20), 1.0))
    assert abs(bad / math.sqrt(2e-20) - 1) > 1e-3


# --------------------------------------------------------------------------------------
# Exact formulas against an independent quadrature and against Monte Carlo
# --------------------------------------------------------------------------------------


def variance_by_quadrature(r, sigma, s, g, stratified):
    """``Var(M~)`` from the grid-count form ``Var(A | delta) = f (1 - f) / s'^2``,
    ``f = frac(s' g(delta))`` (not the covariance sum of the module), by mpmath."""
    mpmath.mp.dps = 30
    m = s // g
    sigma = mpmath.mpf(sigma)

    def dens(d):
        return d * mpmath.exp(-d / sigma) / sigma**2

    def gfun(d):
        return max(mpmath.mpf(0), 1 - r / d)

    def w(d):
        f = g * gfun(d) - mpmath.floor(g * gfun(d))
        return f * (1 - f) / g**2

    edges = [mpmath.mpf(x) for x in S.stratum_edges(float(sigma), m if stratified else 1)]
    edges[-1] = mpmath.inf
    breaks = sorted({mpmath.mpf(r) / (1 - mpmath.mpf(i) / g) for i in range(g)})
    total = mpmath.mpf(0)
    for lo, hi in zip(edges[:-1], edges[1:]):
        pts = [lo] + [b for b in breaks if lo < b < hi] + [hi]
        mass = 1 / mpmath.mpf(m) if stratified else 1
        ew = mpmath.quad(lambda d: w(d) * dens(d), pts) / mass
        eg = mpmath.quad(lambda d: gfun(d) * dens(d), pts) / mass
        eg2 = mpmath.quad(lambda d: gfun(d) ** 2 * dens(d), pts) / mass
        total += ew + eg2 - eg**2
    return float(total / m**2) if stratified else float(total / m)


@pytest.mark.parametrize(
    "r, sigma, s, g, sampler",
    [(3.0, 5.0, 12, 3, "stratified"), (17.0, 9.0, 8, 4, "stratified"),
     (2.0, 5.0, 6, 3, "shared"), (1.0, 0.7, 4, 1, "stratified")],
)  # fmt: skip
def test_entry_variance_matches_quadrature(r, sigma, s, g, sampler):
    exact = S.entry_variance(r, sigma, s, sampler=sampler, group_size=g)
    quad = variance_by_quadrature(r, sigma, s, g, sampler == "stratified")
    assert exact == pytest.approx(quad, rel=1e-9)


def test_iid_formulas_reduce_to_the_paper():
    r = np.arange(0, 40.0)
    lstar = np.exp(-r / 6.0)
    np.testing.assert_allclose(
        S.entry_variance(r, 6.0, 10), lstar * (1 - lstar) / 10, rtol=1e-12, atol=1e-300
    )
    got = S.window_width(6.0, 10, 50, sampler="shared", group_size=1)
    np.testing.assert_allclose(got, expected_window_width(6.0, 10, 50), rtol=1e-12)
    b = np.array([1.0, 10.0, 60.0])
    np.testing.assert_allclose(
        S.largest_pitch_sf_of(b, 6.0, 10, sampler="shared", group_size=2),
        largest_pitch_sf(b, 6.0, 5),
    )


DIST = np.array([1, 3, 10, 30])


@pytest.mark.parametrize("sigma, s, g", [(4.0, 16, 4), (16.0, 12, 3)])
def test_stratified_is_unbiased_monte_carlo(sigma, s, g):
    # 4 distances x 2 cases = 8 comparisons: false failure <= 5.5e-5
    reps = 6000
    mt = pair_means(replicas(sigma, s, reps, 1, sampler="stratified", group_size=g), DIST, 5)
    z = (mt.mean(0) - np.exp(-DIST / sigma)) / (mt.std(0, ddof=1) / math.sqrt(reps))
    assert np.all(np.abs(z) < Z), z


def test_unbiasedness_statistic_rejects_a_biased_sampler():
    # negative control: stratified quantiles of the wrong law (exponential, same mean
    # 2 sigma) are biased; the statistic of the test above must reject them
    sigma, s, g, reps = 4.0, 16, 4, 6000
    part = replicas(sigma, s, reps, 1, sampler="stratified", group_size=g)
    u = 1.0 - np.exp(-part.pitch / sigma) * (1.0 + part.pitch / sigma)  # F(delta) in (0, 1)
    wrong = -2.0 * sigma * np.log1p(-u)  # exponential quantile, mean 2 sigma
    mt = pair_means(PartitionSample(wrong, part.offset / part.pitch * wrong), DIST, 5)
    z = (mt.mean(0) - np.exp(-DIST / sigma)) / (mt.std(0, ddof=1) / math.sqrt(reps))
    assert np.max(np.abs(z)) > 3 * Z, z


def variance_z(mt, exact):
    """z-scores of the sample variances of the columns of ``mt`` against ``exact``."""
    reps = mt.shape[0]
    dev = mt - mt.mean(0)
    var = (dev**2).sum(0) / (reps - 1)
    se = np.sqrt(np.maximum((dev**4).mean(0) - var**2, 1e-300) / reps)
    return (var - exact) / se


@pytest.mark.parametrize(
    "sampler, sigma, s, g", [("stratified", 8.0, 16, 4), ("shared", 8.0, 12, 3)]
)
def test_variance_within_confidence_interval(sampler, sigma, s, g):
    # 4 distances x 2 cases: false failure <= 5.5e-5
    mt = pair_means(replicas(sigma, s, 8000, 2, sampler=sampler, group_size=g), DIST, 2)
    exact = S.entry_variance(DIST, sigma, s, sampler=sampler, group_size=g)
    assert np.all(np.abs(variance_z(mt, exact)) < Z)
    # negative control: the iid variance L(1 - L)/s is rejected for these samples
    lstar = np.exp(-DIST / sigma)
    assert np.max(np.abs(variance_z(mt, lstar * (1 - lstar) / s))) > Z


def frobenius_replicas(sigma, n, s, reps, seed, **kw):
    pos = np.arange(n)
    mt = empirical_mean(replicas(sigma, s, reps, seed, **kw), pos, pos)
    return ((mt - np.exp(-np.abs(pos[:, None] - pos[None, :]) / sigma)) ** 2).sum((1, 2))


def test_frobenius_error_formula_and_reduction_monte_carlo():
    # 3 z-tests: false failure <= 2.1e-5
    sigma, n, s, reps = 8.0, 96, 64, 300
    for sampler in ("iid", "stratified"):
        err = frobenius_replicas(sigma, n, s, reps, 3, sampler=sampler)
        exact = S.frobenius_error_square(sigma, n, s, sampler=sampler)
        assert abs(err.mean() - exact) < Z * err.std(ddof=1) / math.sqrt(reps)
        if sampler == "iid":
            iid = err
    strat = err
    # the goal's ratio at this size, measured: mean ratio <= 0.25 at 4.5 standard errors
    ratio = strat.mean() / iid.mean()
    se = ratio * math.hypot(
        strat.std(ddof=1) / strat.mean() / math.sqrt(reps),
        iid.std(ddof=1) / iid.mean() / math.sqrt(reps),
    )
    assert ratio + Z * se <= 0.25, (ratio, se)


@pytest.mark.parametrize("sigma", [4.0, 16.0, 64.0])
def test_goal_exact_ratio_at_n1024_s64(sigma):
    iid = S.frobenius_error_square(sigma, 1024, 64)
    strat = S.frobenius_error_square(sigma, 1024, 64, sampler="stratified")
    assert strat <= 0.25 * iid


# --------------------------------------------------------------------------------------
# The claims of the note: continuum split, traps
# --------------------------------------------------------------------------------------


def test_between_part_is_one_third_in_the_continuum_limit():
    gaps = []
    for sigma in (25.0, 100.0, 400.0):
        r = np.arange(1.0, 60 * sigma)
        within, between = S.variance_split(r, sigma, 1)
        gaps.append(abs(between.sum() / (within.sum() + between.sum()) - 1 / 3))
    assert gaps[-1] < 1e-6 and gaps[0] > gaps[1] > gaps[2]  # O(sigma^-2) -> 0
    # stratified: within part 2 / (3 s') of the iid total (offsets alone), as sigma grows
    r = np.arange(1.0, 60 * 400.0)
    total = S.entry_variance(r, 400.0, 64).sum()
    w4, _ = S.variance_split(r, 400.0, 64, sampler="stratified", group_size=4)
    assert w4.sum() / total == pytest.approx(2 / 12, rel=1e-4)


def test_antithetic_offsets_gain_nothing_exactly():
    r = np.arange(0, 200.0)
    for sigma, s in ((3.0, 8), (40.0, 64)):
        np.testing.assert_allclose(
            S.entry_variance(r, sigma, s, sampler="shared", group_size=2),
            S.entry_variance(r, sigma, s),
            rtol=1e-10,
            atol=1e-18,
        )


def test_shared_pitch_with_three_or_more_offsets_is_worse_than_iid():
    r = np.arange(1, 200.0)
    iid = S.entry_variance(r, 10.0, 24)
    for g in (3, 4, 6, 8):
        shared = S.entry_variance(r, 10.0, 24, sampler="shared", group_size=g)
        lstar = np.exp(-r / 10.0)
        live = lstar > 1e-12
        assert np.all(shared[live] > iid[live])  # every entry with 0 < L < 1
        # continuum ratio 2/(3 s') + s'/3
    assert S.frobenius_error_square(
        1000.0, 20000, 24, sampler="shared", group_size=4
    ) / S.frobenius_error_square(1000.0, 20000, 24) == pytest.approx(0.5 / 3 + 4 / 3, rel=0.01)


def test_one_group_is_far_worse_than_iid():
    for sigma in (4.0, 64.0):
        iid = S.frobenius_error_square(sigma, 512, 64)
        assert (
            S.frobenius_error_square(sigma, 512, 64, sampler="stratified", group_size=64) > 10 * iid
        )


def test_traps_monte_carlo():
    # shared s'=4: worse than iid; shared s'=2: same as iid (2 z-tests, <= 1.4e-5)
    sigma, n, s, reps = 8.0, 64, 16, 400
    iid = frobenius_replicas(sigma, n, s, reps, 7)
    worse = frobenius_replicas(sigma, n, s, reps, 8, sampler="shared", group_size=4)
    same = frobenius_replicas(sigma, n, s, reps, 9, sampler="shared", group_size=2)

    def z(a, b):
        return (a.mean() - b.mean()) / math.sqrt(a.var(ddof=1) / reps + b.var(ddof=1) / reps)

    assert z(worse, iid) > Z
    assert abs(z(same, iid)) < Z


# --------------------------------------------------------------------------------------
# Largest pitch and window
# --------------------------------------------------------------------------------------


def test_largest_pitch_law_of_stratified_draws():
    # 3 levels: false failure <= 2.1e-5; negative control: the iid law is rejected
    sigma, s, g, reps = 5.0, 32, 4, 6000
    top = replicas(sigma, s, reps, 4, sampler="stratified", group_size=g).pitch.max(1)
    for q in (0.5, 0.9, 0.99):
        b = S.largest_pitch_quantile_of(q, sigma, s, sampler="stratified", group_size=g)
        p = S.largest_pitch_sf_of(b, sigma, s, sampler="stratified", group_size=g)
        assert p == pytest.approx(1 - q, rel=1e-10)
        freq = np.mean(top > b)
        assert abs(freq - p) < Z * math.sqrt(p * (1 - p) / reps)
    b = S.largest_pitch_quantile_of(0.5, sigma, s, sampler="stratified", group_size=g)
    p_iid = largest_pitch_sf(b, sigma, s)
    assert abs(np.mean(top > b) - p_iid) > Z * math.sqrt(p_iid * (1 - p_iid) / reps)
    # exact form: min(1, m P(delta > b))
    assert S.largest_pitch_sf_of(b, sigma, s, sampler="stratified", group_size=g) == (
        pytest.approx(min(1.0, (s // g) * pitch_sf(b, sigma)))
    )


@pytest.mark.parametrize("sampler", ["stratified", "iid"])
def test_window_width_matches_monte_carlo(sampler):
    # mean over queries of the empirical union-of-blocks width (2 tests: <= 1.4e-5)
    sigma, n, s, reps = 6.0, 120, 16, 300
    pos = np.arange(n)
    part = replicas(sigma, s, reps, 5, sampler=sampler)
    width = (empirical_mean(part, pos, pos) > 0).sum(2).mean(1)  # (reps,)
    exact = S.window_width(sigma, s, n, sampler=sampler).mean()
    assert abs(width.mean() - exact) < Z * width.std(ddof=1) / math.sqrt(reps)
    if sampler == "stratified":  # negative control: the iid formula differs measurably
        other = expected_window_width(sigma, s, n).mean()
        assert abs(width.mean() - other) > Z * width.std(ddof=1) / math.sqrt(reps)


def test_window_goal_within_ten_percent_of_iid():
    for sigma in (4.0, 16.0, 64.0):
        iid = expected_window_width(sigma, 64, 1024).mean()
        assert S.window_width(sigma, 64, 1024, sampler="stratified").mean() <= 1.10 * iid


# --------------------------------------------------------------------------------------
# Downstream: the fast path and the bounds
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["cpu", pytest.param("triton", marks=pytest.mark.triton)])
def test_fast_path_with_stratified_partition_matches_reference(backend):
    if backend == "triton":  # the Triton kernels in the interpreter (compiled on CUDA)
        import _triton_interp

        if _triton_interp.COMPILED:
            pytest.skip("this test passes CPU tensors; on CUDA tests/test_triton_* cover it")
        _triton_interp.load("triton")
    from plsh_fast import plsh_attention
    from plsh_ref.testing.baseline import plain_attention_torch
    from plsh_ref.testing.tolerance import assert_close_to_reference

    problem = make_problem(3, num_heads=2, n_q=40, n_k=40, num_samples=8, dtype="float32")
    sigma = 1.0 / np.array([0.5, 1 / 16])
    problem = dataclasses.replace(
        problem, partition=draw_partition(sigma, 8, 3, sampler="stratified", group_size=2)
    )
    out, lse = plsh_attention(
        problem.query, problem.key, problem.value, return_lse=True, backend=backend,
        **problem.kwargs,
    )  # fmt: skip
    ref_out, ref_lse = problem.reference()
    base_out, base_lse = plain_attention_torch(
        *problem.numpy64(), problem.log_weight(), scale=problem.scale, dtype=problem.dtype
    )
    assert not torch.isnan(out).any()
    assert_close_to_reference(out, ref_out, base_out, problem.dtype, name="output")
    assert_close_to_reference(lse, ref_lse, base_lse, problem.dtype, name="lse")


def test_max_norm_bounds_for_correlated_samples():
    # one pitch shared by all s offsets (m = 1): the iid DKW bound would claim
    # P(max |M~ - L*| > 0.35) < 1e-3, but it happens in ~40% of draws; Hoeffding over the
    # m = 1 group says nothing (bound 1). 1 binomial test: false failure <= 6.8e-6.
    sigma, n, s, reps, eps = 8.0, 64, 64, 400, 0.35
    pos = np.arange(n)
    lstar = np.exp(-np.abs(pos[:, None] - pos[None, :]) / sigma)
    part = replicas(sigma, s, reps, 10, sampler="shared", group_size=s)
    freq = np.mean(np.abs(empirical_mean(part, pos, pos) - lstar).max((1, 2)) > eps)
    assert bounds.max_norm_tail_bound(n, s, eps) < 1e-3 < freq - Z * math.sqrt(0.25 / reps)
    assert bounds.max_norm_tail_bound(n, s, eps, sampler="shared", group_size=s) == 1.0
    # stratified, m = 16: Hoeffding with a union over pairs, and its inverse
    p = bounds.max_norm_tail_bound(1024, 64, 0.8, sampler="stratified")
    assert p == pytest.approx(1024 * 1023 * math.exp(-2 * 16 * 0.64))
    e = bounds.max_norm_error_bound(1024, 64, p, sampler="stratified")
    assert e == pytest.approx(0.8)
    with pytest.raises(ValueError, match="^group_size"):
        bounds.max_norm_tail_bound(16, 64, 0.5, sampler="stratified", group_size=5)


def test_block_size_bound_for_stratified_samples():
    # every block of the s masks is at most b with probability >= 1 - delta: the
    # empirical frequency of a larger block stays below delta + 4.5 binomial SE
    sigma, s, reps, delta = 4.0, 64, 600, 0.1
    b = bounds.block_size_bound(sigma, s, delta, sampler="stratified")
    assert b < bounds.block_size_bound(sigma, s, delta)  # fewer distinct pitches
    part = replicas(sigma, s, reps, 11, sampler="stratified")
    b_all = bins(part, np.arange(200)).reshape(reps * s, 200)  # sorted positions
    label = np.concatenate(
        [np.zeros((reps * s, 1), np.int64), np.cumsum(np.diff(b_all, axis=1) != 0, axis=1)], 1
    )
    runs = np.bincount((label + 200 * np.arange(reps * s)[:, None]).ravel())
    runs = np.pad(runs, (0, reps * s * 200 - runs.size)).reshape(reps, s * 200)
    largest = runs.max(1)  # largest block over the s masks of each replica
    assert np.mean(largest > b) <= delta + Z * math.sqrt(delta * (1 - delta) / reps)
    assert bounds.block_size_tail_bound(b, sigma, s, sampler="stratified") <= delta


# --------------------------------------------------------------------------------------
# plsh reproduce compares the samplers
# --------------------------------------------------------------------------------------


def test_reproduce_matrix_part_per_sampler():
    from plsh_ref.experiments.reproduce import matrix_error_experiment

    iid = matrix_error_experiment(96, [8.0], [4, 16], reps=2, seed=1)
    strat = matrix_error_experiment(96, [8.0], [4, 16], reps=2, seed=1, sampler="stratified")
    assert strat["group_sizes"] == [1, 2] and iid["group_sizes"] == [1, 1]
    for res, sampler in ((iid, "iid"), (strat, "stratified")):
        exact = [S.frobenius_error_square(8.0, 96, s, sampler=sampler) for s in (4, 16)]
        np.testing.assert_allclose(res["frobenius_square_exact"][0], exact)
        assert np.all(res["window"] >= 1) and np.all(res["window"] <= 96)
    # the same seed, a different sampler: different draws, the iid part unchanged
    assert not np.array_equal(iid["frobenius"], strat["frobenius"])
    again = matrix_error_experiment(96, [8.0], [4, 16], reps=2, seed=1, sampler="iid")
    np.testing.assert_array_equal(again["frobenius"], iid["frobenius"])


def test_reproduce_cli_compares_samplers(tmp_path, capsys):
    import json

    from plsh_ref.cli import main

    common = ["--n", "48", "--num-samples", "4,8", "--reps", "2", "--output-reps", "1"]
    common += ["--max-tokens", "24", "--no-plots", "--quiet", "--sigma", "4"]
    assert main(["reproduce", *common, "--out", str(tmp_path / "a")]) == 0
    text = capsys.readouterr().out
    assert "stratified / iid" in text and "rel. Fro. stratified" in text
    record = json.loads((tmp_path / "a" / "results.json").read_text())
    assert set(record["samplers"]) == {"iid", "stratified"}
    assert record["config"]["sampler"] == ["iid", "stratified"]
    assert main(["reproduce", *common, "--sampler", "iid", "--out", str(tmp_path / "b")]) == 0
    only = json.loads((tmp_path / "b" / "results.json").read_text())
    assert only["matrix_error"] == record["matrix_error"]  # iid numbers unchanged
    assert set(only["samplers"]) == {"iid"}
    capsys.readouterr()
    # argparse usage error: one line, exit 2 (returned by main, not raised)
    assert main(["reproduce", *common, "--sampler", "lhs", "--out", str(tmp_path / "c")]) == 2
    assert main(["reproduce", *common, "--group-size", "0", "--out", str(tmp_path / "d")]) == 2


def test_numbers_quoted_in_the_note():
    # proofs_notes/samplers.md, sections 4, 5, 7 and 8: each number as printed there
    exact = {16: (0.377, 0.382, 0.379), 64: (0.200, 0.206, 0.203)}
    exact |= {256: (0.111, 0.116, 0.112), 1024: (0.067, 0.069, 0.065)}
    ratios = {}
    for s, quoted in exact.items():
        for sigma, q in zip((4.0, 16.0, 64.0), quoted):
            r = S.frobenius_error_square(sigma, 1024, s, sampler="stratified")
            ratios[s, sigma] = r / S.frobenius_error_square(sigma, 1024, s)
            assert round(ratios[s, sigma], 3) == pytest.approx(q, abs=1e-9), (s, sigma)
    for sigma in (4.0, 16.0, 64.0):  # "falls by 3.0 to 3.1" from s = 64 to 1024
        assert 2.95 <= ratios[64, sigma] / ratios[1024, sigma] <= 3.15
    r = np.arange(1.0, 40 * 100.0)  # sigma = 100 agrees with the note's 400 to 1e-5
    total = S.entry_variance(r, 100.0, 1).sum()
    for m, b in ((2, 0.147), (4, 0.0616), (16, 0.0104), (64, 0.00185)):
        _, between = S.variance_split(r, 100.0, m, sampler="stratified", group_size=1)
        assert between.sum() * m / total == pytest.approx(b, rel=5e-3), m
    for g, q in ((2, 1.00), (3, 1.22), (4, 1.50), (8, 2.75)):
        ratio = S.frobenius_error_square(64.0, 1024, 48 * g, sampler="shared", group_size=g)
        assert ratio / S.frobenius_error_square(64.0, 1024, 48 * g) == pytest.approx(q, abs=0.005)
    for sigma, q in ((4.0, 21.5), (16.0, 21.4), (64.0, 21.3)):
        ratio = S.frobenius_error_square(sigma, 1024, 64, sampler="stratified", group_size=64)
        assert ratio / S.frobenius_error_square(sigma, 1024, 64) == pytest.approx(q, abs=0.05)
    for sigma, med, med_iid, b, b_iid in ((4.0, 21.2, 26.2, 29, 35), (16.0, 84.9, 104.8, 115, 139)):
        kw = {"sampler": "stratified"}
        assert S.largest_pitch_quantile_of(0.5, sigma, 64, **kw) == pytest.approx(med, abs=0.05)
        assert S.largest_pitch_quantile_of(0.5, sigma, 64) == pytest.approx(med_iid, abs=0.05)
        assert bounds.block_size_bound(sigma, 64, 0.1, **kw) == b
        assert bounds.block_size_bound(sigma, 64, 0.1) == b_iid
    for sigma, pct in ((4.0, 4.5), (16.0, 4.4), (64.0, 4.1)):
        w = S.window_width(sigma, 64, 1024, sampler="stratified").mean()
        assert 100 * (w / expected_window_width(sigma, 64, 1024).mean() - 1) == pytest.approx(
            pct, abs=0.05
        )
    for s, pct in ((16, 8.5), (64, 4.5), (256, -1.0), (1024, -6.3)):
        w = S.window_width(16.0, s, sampler="stratified") / expected_window_width(16.0, s)
        assert 100 * (w - 1) == pytest.approx(pct, abs=0.05)


# --------------------------------------------------------------------------------------
# plsh_fast.nn and plsh train-lm can choose the sampler
# --------------------------------------------------------------------------------------


def test_plsh_attention_module_draws_with_its_sampler():
    from plsh_fast.nn import PLSHAttention
    from plsh_ref.partition import derived_seed

    core = PLSHAttention(4, 8, seed=3, sampler="stratified", group_size=2, backend="dense")
    want = draw_partition(core.sigma, 8, 3, sampler="stratified", group_size=2)
    assert core.partition == want and core.partition.sampler == "stratified"
    assert core.training_partition(5) == draw_partition(
        core.sigma, 8, derived_seed(3, 5), sampler="stratified", group_size=2
    )
    assert "sampler='stratified'" in repr(core)
    core.train()
    q = torch.randn(1, 4, 12, 8, dtype=torch.float64)
    out = core(q, q, q)  # training draw through the plsh::training_partition operator
    assert core.num_draws == 1 and torch.isfinite(out).all()
    from plsh_ref.attention import plsh_attention as reference

    ref, _ = reference(
        *(x.numpy() for x in (q, q, q)),
        partition=core.training_partition(0),
        causal=True,
        return_lse=True,
    )
    np.testing.assert_allclose(out.detach().numpy(), ref, rtol=1e-10, atol=1e-12)
    iid = PLSHAttention(4, 8, seed=3)
    assert iid.partition == draw_partition(iid.sigma, 8, 3)  # default unchanged
    with pytest.raises(ValueError, match="^group_size"):
        PLSHAttention(4, 8, sampler="stratified", group_size=3)


def test_train_lm_sampler_option(tmp_path, capsys):
    from plsh_fast.experiments.model import ByteLM
    from plsh_ref.cli import main

    model = ByteLM("plsh-4", d_model=16, num_layers=2, num_heads=2, sampler="stratified")
    assert {core.sampler for core in model.attention_cores()} == {"stratified"}
    assert main(["train-lm", "--sampler", "lhs"]) == 2
    assert capsys.readouterr().err.startswith("plsh train-lm: error: --sampler:")


def test_samplers_bench_runs_and_reports(tmp_path):
    import importlib.util
    import json

    path = _paths.ROOT / "benchmarks" / "samplers_bench.py"
    spec = importlib.util.spec_from_file_location("samplers_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    argv = ["--n", "48", "--num-samples", "16", "--sigma", "4", "--reps", "3"]
    argv += ["--output-samples", "4", "--output-reps", "2", "--max-tokens", "32"]
    assert bench.main([*argv, "--out", str(tmp_path)]) == 0
    (md,) = tmp_path.glob("samplers_*.md")
    (js,) = tmp_path.glob("samplers_*.json")
    assert "| 4 |" in md.read_text() and "other processes shared the machine" in md.read_text()
    record = json.loads(js.read_text())
    exact = record["matrix"]["stratified"]["frobenius_square_exact"][0]
    assert exact == pytest.approx(S.frobenius_error_square(4.0, 48, 16, sampler="stratified"))
    assert np.array(record["output"]["iid"]["rel_fro"]).shape == (1, 2)


def test_every_column_is_marginally_a_paper_hash():
    # Kolmogorov-Smirnov of column 0's pitch over 6000 replicas against Gamma(2, sigma):
    # P(D > 0.0316) <= 2 exp(-2 N 0.0316^2) = 1.3e-5 (DKW-Massart), the false-failure bound.
    # Negative control: without the random group order column 0 would hold the lowest
    # stratum's pitch (the smallest pitch of the replica), which the same test rejects.
    sigma, s, g, reps = 4.0, 16, 4, 6000
    part = replicas(sigma, s, reps, 12, sampler="stratified", group_size=g)
    crit = math.sqrt(math.log(2 / 1.3e-5) / (2 * reps))

    def ks(x):
        x = np.sort(x)
        cdf = 1 - pitch_sf(x, sigma)
        i = np.arange(1, x.size + 1)
        return max(np.max(i / x.size - cdf), np.max(cdf - (i - 1) / x.size))

    assert ks(part.pitch[:, 0]) < crit
    assert ks(part.pitch.min(axis=1)) > crit
    # its offset is uniform on [0, pitch): phase = offset / pitch against U[0, 1)
    u = np.sort(part.offset[:, 0] / part.pitch[:, 0])
    i = np.arange(1, reps + 1)
    assert max(np.max(i / reps - u), np.max(u - (i - 1) / reps)) < crit


def test_reproduce_stratified_errors_recomputed_from_the_draws():
    # each s is a fresh stratified draw with seed + 1000 r; all three norms recomputed
    from plsh_ref.experiments.reproduce import matrix_error_experiment

    n, sig, samples = 40, [3.0, 9.0], [4, 8]
    res = matrix_error_experiment(n, sig, samples, reps=2, seed=4, sampler="stratified")
    pos = np.arange(n)
    lstar = np.exp(-np.abs(pos[:, None] - pos[None, :]) / np.array(sig)[:, None, None])
    for r in range(2):
        for k, s in enumerate(samples):
            part = draw_partition(sig, s, 4 + 1000 * r, sampler="stratified")
            diff = empirical_mean(part, pos, pos) - lstar
            for h in range(2):
                np.testing.assert_allclose(
                    res["spectral"][h, k, r], np.linalg.norm(diff[h], 2), rtol=1e-12
                )
                assert res["max"][h, k, r] == np.abs(diff[h]).max()
                np.testing.assert_allclose(res["frobenius"][h, k, r], np.linalg.norm(diff[h]))
