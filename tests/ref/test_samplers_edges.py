"""plsh_ref.samplers against the sampling model itself, integrated independently.

One pitch group: pitch ``delta ~ Gamma(2, sigma)`` (restricted to its stratum for
``"stratified"``), ``g`` offsets ``delta ((phase + j / g) mod 1)``. For two positions at
distance ``r < delta`` the number ``N`` of the ``g`` hashes with a bin boundary between
them is ``floor(y)`` or ``floor(y) + 1`` with ``y = r g / delta`` (the latter with
probability ``frac(y)``); for ``r >= delta`` all ``g`` hashes separate them. The group's
collision fraction is ``X = 1 - N / g``. Every variance, split, tail and window width of
the module is this model integrated over ``delta`` in mpmath (``mp.quad`` with the break
points ``r g / k``), compared at relative 1e-10; the refusals are tested at their edges.
"""

from __future__ import annotations

import math
import warnings

import mpmath as mp
import numpy as np
import pytest

from plsh_ref import samplers as S
from plsh_ref.expectation import expected_window_width, largest_pitch_quantile, largest_pitch_sf


@pytest.fixture(autouse=True)
def _digits():
    """Work at 25 digits without changing mpmath's global precision for other tests."""
    with mp.workdps(25):
        yield


def density(d, sigma):
    return d * mp.e ** (-d / sigma) / sigma**2


def strata(sigma, m):
    """Stratum edges of Gamma(2, sigma): P(delta <= e_k) = k / m, by mpmath root finding."""
    edges = [mp.mpf(0)]
    for k in range(1, m):
        target = mp.mpf(k) / m
        edges.append(
            mp.findroot(
                lambda x, t=target: mp.gammainc(2, 0, x / sigma, regularized=True) - t, sigma * 1.5
            )
        )
    return edges + [mp.inf]


def conditional_moments(d, r, g):
    """(E[X | delta], E[X^2 | delta]) of one group's collision fraction."""
    if d <= r:
        return mp.mpf(0), mp.mpf(0)
    y = r * g / d
    fl = mp.floor(y)
    p = y - fl
    x_lo, x_hi = 1 - fl / g, 1 - (fl + 1) / g
    return 1 - r / d, (1 - p) * x_lo**2 + p * x_hi**2


def group_law(r, sigma, g, lo, hi, weight):
    """E[X], E[X^2], E[E[X | delta]^2] over delta in [lo, hi) with density weight * f."""
    points = sorted(
        {mp.mpf(lo), mp.mpf(hi)}
        | {r * g / mp.mpf(k) for k in range(1, g + 1) if lo < r * g / k < hi}
        | ({mp.mpf(r)} if lo < r < hi else set())
    )
    pieces = [
        lambda d, i=i: conditional_moments(d, r, g)[i] * density(d, sigma) * weight
        for i in range(2)
    ]
    ex = mp.quad(pieces[0], points)
    ex2 = mp.quad(pieces[1], points)
    emean2 = mp.quad(
        lambda d: conditional_moments(d, r, g)[0] ** 2 * density(d, sigma) * weight, points
    )
    return ex, ex2, emean2


def model_variance(r, sigma, s, sampler, g):
    """(within, between) variance of M~ at distance r from the model."""
    m = s // g
    if sampler == "stratified":
        edges = strata(sigma, m)
        within = between = mp.mpf(0)
        for k in range(m):
            ex, ex2, em2 = group_law(r, sigma, g, edges[k], edges[k + 1], m)
            within += (ex2 - em2) / m**2
            between += (em2 - ex**2) / m**2
        return within, between
    ex, ex2, em2 = group_law(r, sigma, g, 0, mp.inf, 1)
    return (ex2 - em2) / m, (em2 - ex**2) / m


def close(a, b, rtol=1e-10, atol=1e-300):
    return abs(float(a) - float(b)) <= rtol * abs(float(b)) + atol


@pytest.mark.parametrize(
    "r, sigma, s, sampler, g",
    [
        (3.0, 4.0, 1, "iid", 1),
        (2.0, 5.0, 6, "shared", 3),
        (7.0, 3.0, 4, "shared", 2),
        (2.0, 5.0, 6, "stratified", 3),
        (1.0, 2.0, 4, "stratified", 1),
        (5.0, 8.0, 8, "stratified", 2),
    ],
)
def test_variance_split_is_the_model(r, sigma, s, sampler, g):
    within, between = S.variance_split(r, sigma, s, sampler=sampler, group_size=g)
    w_want, b_want = model_variance(mp.mpf(r), mp.mpf(sigma), s, sampler, g)
    assert close(within, w_want) and close(between, b_want)
    assert S.entry_variance(r, sigma, s, sampler=sampler, group_size=g) == within + between
    assert type(within) is float and type(between) is float


def test_iid_variance_is_binomial():
    lstar = math.exp(-3.0 / 4.0)
    within, between = S.variance_split(3.0, 4.0, 5)
    assert close(within + between, lstar * (1 - lstar) / 5, rtol=1e-12)
    assert S.entry_variance(0.0, 4.0, 5) == 0.0


def test_variance_arrays_and_distance_zero():
    r = np.array([0.0, 1.0, -2.0])
    var = S.entry_variance(r, 3.0, 4, sampler="stratified", group_size=2)
    assert var.shape == (3,) and var[0] == 0.0
    assert var[2] == S.entry_variance(2.0, 3.0, 4, sampler="stratified", group_size=2)
    w, b = S.variance_split(r, 3.0, 4, sampler="shared", group_size=2)
    assert w.shape == b.shape == (3,) and w[0] == 0.0 and b[0] == 0.0


@pytest.mark.parametrize("g", [1, 2, 3, 5])
def test_group_moments_is_the_group_mean_formula(g):
    """E[A^2] = (1/g) [G(r) + 2 sum_{j<g} (j/g) G(r g/j)] with G = weight * integral, here
    for a made-up two-stratum integral, summed independently in mpmath."""
    r = np.array([0.0, 0.4, 3.0])
    weight = 2.0

    def partial(x):  # (..., 1) -> (..., 2): two "strata" that differ
        return np.concatenate([np.exp(-x), 1.0 / (1.0 + x * x)], axis=-1)

    def partial_mp(x):
        return [mp.e ** (-x), 1 / (1 + x * x)]

    gk, second = S.group_moments(partial, r, g, weight)
    assert gk.shape == second.shape == (3, 2)
    for i, ri in enumerate(r):
        ri = mp.mpf(ri)
        want_g = [weight * v for v in partial_mp(ri)]
        want_2 = [mp.mpf(v) for v in want_g]
        for j in range(1, g):
            for k, v in enumerate(partial_mp(ri * g / j)):
                want_2[k] += 2 * mp.mpf(j) / g * weight * v
        for k in range(2):
            assert gk[i, k] == pytest.approx(float(want_g[k]), rel=1e-15)
            assert second[i, k] == pytest.approx(float(want_2[k] / g), rel=1e-14)
    if g == 1:  # one hash per pitch: A = the hash, A^2 = A
        np.testing.assert_array_equal(second, gk)


def test_frobenius_error_square_sums_the_entries():
    n, sigma, s = 6, 3.0, 4
    for sampler, g in (("iid", None), ("stratified", 2), ("shared", 4)):
        var = [
            S.entry_variance(float(r), sigma, s, sampler=sampler, group_size=g) for r in range(1, n)
        ]
        full = sum(2 * (n - r) * v for r, v in zip(range(1, n), var))
        got = S.frobenius_error_square(sigma, n, s, sampler=sampler, group_size=g)
        assert close(got, full, rtol=1e-13)
        got = S.frobenius_error_square(sigma, n, s, sampler=sampler, group_size=g, causal=True)
        assert close(got, full / 2, rtol=1e-13)
    assert S.frobenius_error_square(sigma, 1, s) == 0.0
    with pytest.raises(ValueError, match=r"^sampler: must be one of"):
        S.frobenius_error_square(sigma, 1, s, sampler="x")
    with pytest.raises(ValueError, match=r"^n: must be >= 1, got 0$"):
        S.frobenius_error_square(sigma, 0, s)
    with pytest.raises(TypeError, match=r"^causal: must be a bool"):
        S.frobenius_error_square(sigma, 3, s, causal=0)


def test_optimal_group_size_is_the_argmin():
    for sigma, n, s, causal in ((4.0, 32, 12, False), (64.0, 64, 16, True)):
        divisors = [d for d in range(1, s + 1) if s % d == 0]
        errors = [
            S.frobenius_error_square(sigma, n, s, sampler="stratified", group_size=d, causal=causal)
            for d in divisors
        ]
        assert S.optimal_group_size(sigma, n, s, causal=causal) == divisors[int(np.argmin(errors))]
    assert S.optimal_group_size(4.0, 8, 1) == 1
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1"):
        S.optimal_group_size(4.0, 8, 0)


def test_causal_halves_the_error_exactly_and_leaves_the_optimal_group_size():
    # the docstring's claim: causal counts each pair once (c_r = 1), so every stratified
    # error is exactly half the bidirectional one and the argmin cannot move
    for sigma, n, s in ((4.0, 32, 12), (64.0, 64, 16), (0.5, 9, 6)):
        for d in (x for x in range(1, s + 1) if s % x == 0):
            kw = dict(sampler="stratified", group_size=d)
            both = S.frobenius_error_square(sigma, n, s, causal=False, **kw)
            assert S.frobenius_error_square(sigma, n, s, causal=True, **kw) == both / 2
        assert S.optimal_group_size(sigma, n, s, causal=True) == S.optimal_group_size(
            sigma, n, s, causal=False
        )


def test_default_group_size_rule():
    expected = {1: 1, 4: 1, 16: 2, 64: 4, 256: 8, 1024: 16, 7: 1, 12: 2, 6: 2}
    for s, g in expected.items():
        target = 0.6 * math.sqrt(s)
        divisors = [d for d in range(1, s + 1) if s % d == 0]
        best = min(divisors, key=lambda d: (abs(math.log(d / target)), d))
        assert S.default_group_size(s) == best == g, s
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1, got 0$"):
        S.default_group_size(0)


def test_sampler_and_group_size_refusals_at_their_edges():
    assert S.check_sampler("shared") == "shared"
    with pytest.raises(TypeError, match=r"^sampler: must be a str, got NoneType$"):
        S.check_sampler(None)
    with pytest.raises(
        ValueError, match=r"^sampler: must be one of \('iid', 'stratified', 'shared'\), got 'x'$"
    ):
        S.check_sampler("x")
    assert S.resolve_group_size("iid", 6) == 1
    assert S.resolve_group_size("iid", 6, 1) == 1
    assert S.resolve_group_size("stratified", 64) == 4
    assert S.resolve_group_size("shared", 6, 6) == 6
    assert S.resolve_group_size("shared", 6, 1) == 1
    with pytest.raises(
        ValueError, match=r"^group_size: must be 1 \(or None\) for sampler='iid', got 2$"
    ):
        S.resolve_group_size("iid", 6, 2)
    with pytest.raises(ValueError, match=r"^group_size: must divide num_samples=6, got 4$"):
        S.resolve_group_size("shared", 6, 4)
    with pytest.raises(ValueError, match=r"^group_size: must be >= 1, got 0$"):
        S.resolve_group_size("shared", 6, 0)
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1, got 0$"):
        S.resolve_group_size("shared", 0)


def test_gamma2_quantile_and_strata():
    sigma = 3.0
    edges = S.stratum_edges(sigma, 4)
    want = strata(mp.mpf(sigma), 4)
    assert edges[0] == 0.0 and edges[-1] == np.inf and edges.shape == (5,)
    for e, w in zip(edges[1:-1], want[1:-1]):
        assert close(e, w, rtol=1e-12)
    assert S.stratum_edges(sigma, 1).tolist() == [0.0, np.inf]
    # both tails: lower < 0.5 uses the lower probability, else the upper one
    lo = np.array([1e-20, 0.3, 0.7])
    got = S.gamma2_quantile(lo, 1 - lo, 2.0)
    for x, p in zip(got, lo):
        assert close(mp.gammainc(2, 0, mp.mpf(x) / 2, regularized=True), p, rtol=1e-10)
    tiny_upper = S.gamma2_quantile(np.array(1.0), np.array(1e-30), 1.0)
    assert close(
        mp.gammainc(2, mp.mpf(float(tiny_upper)), mp.inf, regularized=True), 1e-30, rtol=1e-10
    )
    with pytest.raises(ValueError, match=r"^upper: shape \(2,\) differs from lower shape \(1,\)$"):
        S.gamma2_quantile([0.5], [0.5, 0.5], 1.0)
    for lo_, up_ in (([-0.1], [0.5]), ([1.1], [0.5]), ([0.5], [-0.1]), ([0.5], [1.1])):
        with pytest.raises(ValueError, match=r"^lower: probabilities must lie in \[0, 1\]$"):
            S.gamma2_quantile(lo_, up_, 1.0)
    assert S.gamma2_quantile([0.0], [1.0], 1.0).tolist() == [0.0]
    assert S.gamma2_quantile([1.0], [0.0], 1.0).tolist() == [np.inf]
    with pytest.raises(ValueError, match=r"^num_groups: must be >= 1, got 0$"):
        S.stratum_edges(1.0, 0)


def test_stratified_pitch():
    u = np.array([[0.5, 0.0, 0.999]])
    got = S.stratified_pitch(u, 2.0)
    assert got.shape == (1, 3)
    for k, (x, uk) in enumerate(zip(got[0], [0.5, 2.0**-54, 0.999])):
        assert close(mp.gammainc(2, 0, mp.mpf(x) / 2, regularized=True), (k + uk) / 3, rtol=1e-9)
    assert got[0, 1] > 0  # u = 0 is moved off the stratum's lower edge (0 for k = 0 only)
    first = S.stratified_pitch([0.0], 1.0)
    assert 0 < first[0] < 1e-7
    with pytest.raises(ValueError, match=r"^uniform: values must lie in \[0, 1\)$"):
        S.stratified_pitch([1.0], 1.0)
    with pytest.raises(ValueError, match=r"^uniform: values must lie in \[0, 1\)$"):
        S.stratified_pitch([-1e-300], 1.0)
    with pytest.raises(
        ValueError, match=r"^uniform: must have at least one dimension \(strata last\)$"
    ):
        S.stratified_pitch(0.5, 1.0)
    given = np.array([0.0, 0.5])
    S.stratified_pitch(given, 1.0)
    assert given[0] == 0.0  # the caller's array is not changed


def test_largest_pitch_of_each_sampler():
    b, sigma = 9.0, 3.0
    assert S.largest_pitch_sf_of(b, sigma, 6) == largest_pitch_sf(b, sigma, 6)
    assert S.largest_pitch_sf_of(b, sigma, 6, sampler="shared", group_size=3) == largest_pitch_sf(
        b, sigma, 2
    )
    x = b / sigma
    got = S.largest_pitch_sf_of(b, sigma, 6, sampler="stratified", group_size=2)
    assert got == min(1.0, 3 * math.exp(-x) * (1 + x)) and type(got) is float
    assert S.largest_pitch_sf_of(0.5, sigma, 6, sampler="stratified", group_size=2) == 1.0  # capped
    arr = S.largest_pitch_sf_of(
        np.array([-1.0, 30.0]), sigma, 4, sampler="stratified", group_size=1
    )
    assert arr[0] == 1.0 and close(arr[1], 4 * math.exp(-10) * 11, rtol=1e-14)
    q = 0.9
    assert S.largest_pitch_quantile_of(q, sigma, 6) == largest_pitch_quantile(q, sigma, 6)
    assert S.largest_pitch_quantile_of(
        q, sigma, 6, sampler="shared", group_size=2
    ) == largest_pitch_quantile(q, sigma, 3)
    bq = S.largest_pitch_quantile_of(q, sigma, 6, sampler="stratified", group_size=2)
    xq = mp.mpf(bq) / sigma
    assert close((1 + xq) * mp.e ** (-xq), (1 - q) / 3, rtol=1e-10)
    with pytest.raises(ValueError, match=r"^q: must lie in the open interval"):
        S.largest_pitch_quantile_of(1.0, sigma, 6)


def model_no_reach(r, sigma, g, lo, hi, weight):
    """P(no hash of one group puts distance r in one bin), over delta in [lo, hi)."""

    def p(d):
        if d <= r:
            return mp.mpf(1)
        return max(mp.mpf(0), 1 - g + g * r / d)

    points = sorted(
        {mp.mpf(lo), mp.mpf(hi)}
        | {
            x
            for x in (mp.mpf(r), r * g / mp.mpf(g - 1) if g > 1 else None)
            if x is not None and lo < x < hi
        }
    )
    return mp.quad(lambda d: p(d) * density(d, sigma) * weight, points)


@pytest.mark.parametrize(
    "sampler, s, g",
    [("shared", 6, 3), ("stratified", 6, 2), ("shared", 4, 1), ("stratified", 4, 4)],
)
def test_window_width_is_the_model(sampler, s, g):
    sigma, n = mp.mpf(2), 5
    m = s // g
    reach = []
    for r in range(1, n):
        if sampler == "stratified":
            edges = strata(sigma, m)
            none = mp.fprod(
                model_no_reach(mp.mpf(r), sigma, g, edges[k], edges[k + 1], m) for k in range(m)
            )
        else:
            none = model_no_reach(mp.mpf(r), sigma, g, 0, mp.inf, 1) ** m
        reach.append(1 - none)
    c = [mp.fsum(reach[:i]) for i in range(n)]
    got = S.window_width(2.0, s, n, sampler=sampler, group_size=g)
    want = [float(1 + c[i] + c[n - 1 - i]) for i in range(n)]
    np.testing.assert_allclose(got, want, rtol=1e-9)
    got = S.window_width(2.0, s, n, sampler=sampler, group_size=g, causal=True)
    np.testing.assert_allclose(got, [float(1 + c[i]) for i in range(n)], rtol=1e-9)


def test_window_width_unbounded_and_iid():
    assert S.window_width(3.0, 4) == expected_window_width(3.0, 4)
    np.testing.assert_array_equal(
        S.window_width(3.0, 4, 7, causal=True), expected_window_width(3.0, 4, 7, causal=True)
    )
    with pytest.raises(ValueError, match=r"^group_size: must be 1"):
        S.window_width(3.0, 4, sampler="iid", group_size=2)
    # the infinite sum: the finite-n widths increase to it in the middle of a long sequence
    inf = S.window_width(2.0, 6, sampler="shared", group_size=3)
    mid = S.window_width(2.0, 6, 401, sampler="shared", group_size=3)[200]
    assert close(inf, mid, rtol=1e-12)
    inf_c = S.window_width(2.0, 6, sampler="stratified", group_size=3, causal=True)
    last = S.window_width(2.0, 6, 401, sampler="stratified", group_size=3, causal=True)[-1]
    assert close(inf_c, last, rtol=1e-12)
    with pytest.raises(ValueError, match=r"^n: must be >= 1, got 0$"):
        S.window_width(2.0, 6, 0, sampler="shared", group_size=3)
    with pytest.raises(TypeError, match=r"^causal: must be a bool"):
        S.window_width(2.0, 6, causal=None)
    with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0"):
        S.window_width(0.0, 6, sampler="shared", group_size=3)


@pytest.mark.parametrize("sampler, g", [("iid", None), ("stratified", 2), ("shared", 2)])
def test_largest_pitch_sf_of_where_b_over_sigma_overflows(sampler, g):
    """``b / sigma = inf``: the tail is 0 without warnings (stratified gave NaN:
    ``m e^-inf (1 + inf)``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert S.largest_pitch_sf_of(1e300, 1e-10, 6, sampler=sampler, group_size=g) == 0.0
        got = S.largest_pitch_sf_of([0.0, 1e300], 1e-10, 6, sampler=sampler, group_size=g)
        assert got.tolist() == [1.0, 0.0]


@pytest.mark.parametrize("sigma", [1e-5, 1e-300, 1e-310, 5e-324])
@pytest.mark.parametrize(
    "sampler, s, g", [("stratified", 4, 1), ("stratified", 6, 2), ("shared", 6, 3)]
)
def test_window_width_at_a_tiny_sigma_is_one(sigma, sampler, s, g):
    """Every pitch is far below one token, so no block holds two positions: width 1,
    exactly. It was 1.000000000000008 at sigma = 1e-5 (stratified: ``m (sf(lo) - sf(hi))``
    of a stratum wholly below ``r`` is a few ulps off 1), NaN at 1e-310 (``r / sigma``
    overflows: ``inf * 0``) and 3.05 at 5e-324 (strata ``sigma q_k`` with one or two bits
    of a subnormal)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no overflow warnings on the way
        assert S.window_width(sigma, s, sampler=sampler, group_size=g) == 1.0
        assert S.window_width(sigma, s, 5, sampler=sampler, group_size=g).tolist() == [1.0] * 5
        got = S.window_width(sigma, s, 5, sampler=sampler, group_size=g, causal=True)
        assert got.tolist() == [1.0] * 5


def test_window_width_refuses_more_terms_than_its_bound_before_allocating(monkeypatch):
    """``sigma = 1e6`` took 415 s (stratified) and ``1e300`` failed inside ``np.arange``
    without naming ``sigma``: the (extent, stratum) pairs are bounded by
    ``MAX_WINDOW_TERMS``, refused by name (``sigma`` on the line, ``n`` otherwise), the
    bound itself accepted (checked at a lowered bound); iid has no bound (closed form)."""
    for sigma in (1e6, 1e300):
        with pytest.raises(ValueError, match=r"^sigma: the stratified window sums about"):
            S.window_width(sigma, 4, sampler="stratified", group_size=1)
    with pytest.raises(ValueError, match=r"^n: the shared window sums n - 1 extents"):
        S.window_width(2.0, 6, S.MAX_WINDOW_TERMS + 2, sampler="shared", group_size=3)
    assert math.isfinite(S.window_width(1e300, 4))  # iid: no bound
    monkeypatch.setattr(S, "MAX_WINDOW_TERMS", 1000)
    strata, s = 4, 4
    edge = 1000 / strata / (math.log(s) + 45.0) * (1 - 1e-12)  # within the bound
    assert math.isfinite(S.window_width(edge, s, sampler="stratified", group_size=1))
    with pytest.raises(ValueError, match=r"^sigma: "):
        S.window_width(edge * 1.001, s, sampler="stratified", group_size=1)
    # 3 strata: (n - 1) 3 <= 1000 up to n = 334
    assert S.window_width(2.0, 6, 334, sampler="stratified", group_size=2).shape == (334,)
    with pytest.raises(ValueError, match=r"^n: "):
        S.window_width(2.0, 6, 335, sampler="stratified", group_size=2)


def test_stratified_pitch_zero_uniform_is_two_to_the_minus_54():
    """U_k = 0 is replaced by 2^-54 (documented): the first pitch is F^-1(2^-54 / m)."""
    for m in (1, 3):
        first = S.stratified_pitch(np.zeros(m), 2.0)[0]
        want = mp.mpf(2) ** -54 / m
        assert close(mp.gammainc(2, 0, mp.mpf(first) / 2, regularized=True), want, rtol=1e-9)
    with pytest.raises(TypeError, match=r"^uniform: must be a real numeric array"):
        S.stratified_pitch(["a"], 1.0)


def test_largest_pitch_of_stratified_below_one_token():
    """The stratified tail at a level b in (0, 1): m P(delta > b), not clipped at b = 1."""
    sigma, b = 0.1, 0.5  # m = 1 (one group): P(delta > b) = (1 + b/sigma) e^(-b/sigma)
    got = S.largest_pitch_sf_of(b, sigma, 4, sampler="stratified", group_size=4)
    x = mp.mpf(b) / mp.mpf(sigma)
    assert close(got, (1 + x) * mp.e ** (-x), rtol=1e-13)
    with pytest.raises(TypeError, match=r"^b: must be a real numeric array"):
        S.largest_pitch_sf_of(["x"], sigma, 4, sampler="stratified", group_size=2)


def test_largest_pitch_quantile_of_a_given_group_size():
    """group_size = 3 of s = 6 (the default would be 2): m = 2 strata."""
    q, sigma = 0.9, 3.0
    bq = S.largest_pitch_quantile_of(q, sigma, 6, sampler="stratified", group_size=3)
    xq = mp.mpf(bq) / sigma
    assert close((1 + xq) * mp.e ** (-xq), (1 - q) / 2, rtol=1e-10)


@pytest.mark.parametrize("sampler", ["iid", "stratified", "shared"])
def test_variance_at_distance_zero_is_exactly_zero(sampler):
    """At r = 0 every hash collides: M~_ii = 1, no variance, for every group size (and no
    RuntimeWarning from E1(0) = inf on the way)."""
    import warnings

    s = 12
    for g in [d for d in range(1, s + 1) if s % d == 0] if sampler != "iid" else [1]:
        for sigma in (0.3, 3.0, 1e3):
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                w, b = S.variance_split(0.0, sigma, s, sampler=sampler, group_size=g)
                r = np.array([0.0, 1.0])
                var = S.entry_variance(r, sigma, s, sampler=sampler, group_size=g)
            assert w == 0.0 and b == 0.0, (g, sigma)
            assert var[0] == 0.0 and var[1] > 0.0, (g, sigma)


def test_frobenius_error_square_two_positions():
    """n = 2: one off-diagonal pair each way, 2 Var_1, however small Var_1 is."""
    for sigma in (0.02, 3.0):
        var1 = S.entry_variance(1.0, sigma, 12, sampler="stratified", group_size=6)
        got = S.frobenius_error_square(sigma, 2, 12, sampler="stratified", group_size=6)
        assert var1 > 0.0 and close(got, 2 * var1, rtol=1e-13)


@pytest.mark.parametrize("sampler, g", [("stratified", 1), ("stratified", 3), ("shared", 1)])
def test_window_width_warns_nothing(sampler, g):
    """No RuntimeWarning (0 * inf at the top stratum's edge, a division by s' - 1 = 0)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        finite = S.window_width(2.0, 6, 9, sampler=sampler, group_size=g)
        line = S.window_width(2.0, 6, sampler=sampler, group_size=g)
    assert np.all(np.isfinite(finite)) and math.isfinite(line)


@pytest.mark.parametrize("sampler, g", [("iid", 1), ("stratified", 2), ("shared", 2)])
def test_variance_far_beyond_the_scale_is_zero_and_warns_nothing(sampler, g):
    """r / sigma past 1e154 (where (r/sigma)^2 overflows) and past the float range: every
    hash separates the two positions (P(collide) = e^(-r/sigma) underflows), Var = 0."""
    import warnings

    far = np.array([1e150, 1e160, 1e300])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        var = S.entry_variance(far, 1.0, 4, sampler=sampler, group_size=g)
        split = S.variance_split(1.0, 1e-300, 4, sampler=sampler, group_size=g)
        near = S.entry_variance(np.array([1.0, 5.0]), 2.0, 4, sampler=sampler, group_size=g)
    assert var.tolist() == [0.0, 0.0, 0.0] and split == (0.0, 0.0)
    assert np.all(near > 0.0)
    with pytest.raises(ValueError, match=r"^distance: contains NaN or infinite values$"):
        S.entry_variance([np.nan], 1.0, 4, sampler=sampler, group_size=g)


def test_window_width_num_samples_refusals():
    for n in (None, 5):
        with pytest.raises(ValueError, match=r"^num_samples: must be >= 1, got 0$"):
            S.window_width(2.0, 0, n, sampler="shared")
    one = S.window_width(2.0, 1, 5, sampler="stratified")  # s = 1: one stratum, one hash
    np.testing.assert_allclose(one, expected_window_width(2.0, 1, 5), rtol=1e-12)


@pytest.mark.parametrize("sigma", [0.04, 0.3])
def test_window_width_unbounded_at_a_small_scale(sigma):
    """sigma (log s + 45) between 1 and 2 tokens: the infinite sum still reaches distance
    1 and 2, P(max R >= 1) ~ e^(-1/sigma), visible next to 1; the middle of a long
    sequence is the infinite line."""
    inf = S.window_width(sigma, 1, sampler="stratified")
    mid = S.window_width(sigma, 1, 41, sampler="stratified")[20]
    assert inf > 1.0 and close(inf, mid, rtol=1e-14)
    assert close(inf, expected_window_width(sigma, 1), rtol=1e-12)


@pytest.mark.parametrize("s, g, sigma", [(2, 1, 0.3), (4, 2, 0.5), (6, 3, 2.0)])
def test_causal_window_grows_with_the_query_index(s, g, sigma):
    """Each earlier key adds a probability in [0, 1]: the causal widths never decrease
    (also where the stratum probabilities sum to 1 + rounding), up to the line's width."""
    n = int(60 * sigma) + 5
    width = S.window_width(sigma, s, n, sampler="stratified", group_size=g, causal=True)
    assert width[0] == 1.0 and np.all(np.diff(width) >= 0.0)
    line = S.window_width(sigma, s, sampler="stratified", group_size=g, causal=True)
    assert close(width[-1], line, rtol=1e-14)


def test_gamma2_quantile_names_its_arguments():
    with pytest.raises(TypeError, match=r"^lower: must be a real numeric array"):
        S.gamma2_quantile(["a"], [0.5], 1.0)
    with pytest.raises(TypeError, match=r"^upper: must be a real numeric array"):
        S.gamma2_quantile([0.5], ["a"], 1.0)
    with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0"):
        S.gamma2_quantile([0.5], [0.5], 0.0)


def test_gamma2_quantile_branch_at_one_half():
    """lower < 1/2: gammaincinv(2, lower); lower >= 1/2: gammainccinv(2, upper) (documented),
    told apart where the caller's upper is 1 - lower only up to rounding."""
    from scipy.special import gammainccinv, gammaincinv

    below = np.nextafter(0.5, 0.0)
    at = S.gamma2_quantile([0.5], [below], 1.0)
    assert at[0] == gammainccinv(2.0, below) != gammaincinv(2.0, 0.5)
    under = S.gamma2_quantile([below], [0.5], 3.0)
    assert under[0] == 3.0 * gammaincinv(2.0, below)


def test_design_refusals_name_their_arguments():
    for call in (
        lambda **kw: S.entry_variance(1.0, **kw),
        lambda **kw: S.largest_pitch_sf_of(1.0, **kw),
        lambda **kw: S.largest_pitch_quantile_of(0.5, **kw),
    ):
        with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0"):
            call(sigma=0.0, num_samples=4, sampler="stratified", group_size=2)
        with pytest.raises(ValueError, match=r"^num_samples: must be >= 1, got 0$"):
            call(sigma=2.0, num_samples=0, sampler="shared", group_size=2)
        with pytest.raises(TypeError, match=r"^num_samples: must be an integer"):
            call(sigma=2.0, num_samples=4.0, sampler="shared", group_size=2)
    # a group size dividing s = 0 or s < 0 does not make the count valid
    for s in (0, -4):
        with pytest.raises(ValueError, match=rf"^num_samples: must be >= 1, got {s}$"):
            S.resolve_group_size("shared", s, 2)
    with pytest.raises(TypeError, match=r"^sampler: must be a str, got int$"):
        S.check_sampler(3)


def test_window_width_at_a_stratum_edge_just_below_the_cutoff():
    """s' = 2, r = 1: the upper stratum's lower edge q_1 a relative 1e-14 below the cutoff
    c = r s' / (s' - 1) = 2. The probability that the group's offsets miss r on (q_1, c)
    is a difference of nearly equal terms that rounds below 0; clipped at 0, the widths
    stay finite, warn nothing and are continuous in sigma."""
    import warnings

    sigma = 2.0 / S.stratum_edges(1.0, 2)[1] * (1 - 1e-14)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        width = S.window_width(sigma, 4, 3, sampler="stratified", group_size=2)
        near = S.window_width(sigma * (1 - 1e-9), 4, 3, sampler="stratified", group_size=2)
    assert np.all(np.isfinite(width))
    np.testing.assert_allclose(width, near, rtol=1e-7)


def test_optimal_group_size_checks_causal():
    with pytest.raises(TypeError, match=r"^causal: must be a bool"):
        S.optimal_group_size(4.0, 8, 4, causal=0)


@pytest.mark.parametrize("sampler, g", [("iid", 1), ("stratified", 2), ("shared", 2)])
def test_variance_where_r_over_sigma_overflows_is_zero_and_warns_nothing(sampler, g):
    """r / sigma = 1e310, past the float range (inf): no hash collides, Var = 0 exactly,
    and the overflow to inf raises no RuntimeWarning."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        split = S.variance_split(1e10, 1e-300, 4, sampler=sampler, group_size=g)
    assert split == (0.0, 0.0)
