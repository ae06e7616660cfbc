"""plsh_ref.bounds pinned to exact values at the edges where they matter.

An inequality such as ``P(error > eps) <= bound`` is also met by a looser bound, so each
closed form is compared with the same formula evaluated independently in mpmath at 40
digits (relative 1e-14), each "smallest s / smallest b" is checked to be the smallest
(the answer meets the target, one less does not), and the Bernstein step is checked to
solve its equation.
"""

from __future__ import annotations

import math
import warnings

import mpmath as mp
import numpy as np
import pytest

from plsh_ref import bounds as B
from plsh_ref.expectation import largest_pitch_sf
from plsh_ref.partition import PartitionSample
from plsh_ref.samplers import largest_pitch_sf_of
from plsh_ref.toeplitz import kms_spectral_norm_limit


@pytest.fixture(autouse=True)
def _digits():
    """Work at 40 digits without changing mpmath's global precision for other tests."""
    with mp.workdps(40):
        yield


def close(a, b, rtol=1e-14):
    return abs(a - float(b)) <= rtol * abs(float(b))


@pytest.mark.parametrize("n, s, eps", [(2, 1, 0.5), (5, 3, 0.25), (1000, 200, 0.1), (7, 64, 0.05)])
def test_max_norm_tail_bound_iid_exact(n, s, eps):
    want = min(1, 2 * (n - 1) * mp.e ** (-2 * s * mp.mpf(eps) ** 2))
    assert close(B.max_norm_tail_bound(n, s, eps), want)


@pytest.mark.parametrize("sampler, group, m", [("stratified", 4, 16), ("shared", 2, 32)])
def test_max_norm_tail_bound_grouped_exact(sampler, group, m):
    n, s, eps = 10, 64, 0.4
    want = n * (n - 1) * mp.e ** (-2 * m * mp.mpf(eps) ** 2)
    assert want < 1
    got = B.max_norm_tail_bound(n, s, eps, sampler=sampler, group_size=group)
    assert close(got, want)
    # default group size of s = 64 is 4 (m = 16)
    got = B.max_norm_tail_bound(n, s, eps, sampler="stratified")
    assert close(got, n * (n - 1) * mp.e ** (-2 * 16 * mp.mpf(eps) ** 2))


def test_max_norm_tail_bound_edges():
    assert B.max_norm_tail_bound(1, 1, 0.5) == 0.0
    assert B.max_norm_tail_bound(1, 4, 0.5, sampler="stratified", group_size=2) == 0.0
    assert B.max_norm_tail_bound(100, 1, 0.01) == 1.0  # capped at 1
    assert B.max_norm_tail_bound(100, 4, 0.01, sampler="shared", group_size=2) == 1.0
    with pytest.raises(ValueError, match=r"^n: must be >= 1, got 0$"):
        B.max_norm_tail_bound(0, 1, 0.5)
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1, got 0$"):
        B.max_norm_tail_bound(2, 0, 0.5)
    with pytest.raises(ValueError, match=r"^eps: must lie in the open interval"):
        B.max_norm_tail_bound(2, 1, 1.0)
    with pytest.raises(ValueError, match=r"^sampler: must be one of"):
        B.max_norm_tail_bound(2, 1, 0.5, sampler="x")


@pytest.mark.parametrize(
    "n, s, delta", [(2, 1, 0.5), (5, 3, 0.01), (1000, 200, 1e-6), (8, 16, 0.9)]
)
def test_max_norm_error_bound_iid_exact(n, s, delta):
    want = mp.sqrt(max(0, mp.log(2 * (n - 1) / mp.mpf(delta))) / (2 * s))
    assert close(B.max_norm_error_bound(n, s, delta), want)


def test_max_norm_error_bound_grouped_and_edges():
    n, s, delta = 30, 12, 0.05
    want = mp.sqrt(mp.log(n * (n - 1) / mp.mpf(delta)) / (2 * 4))
    got = B.max_norm_error_bound(n, s, delta, sampler="stratified", group_size=3)
    assert close(got, want)
    assert B.max_norm_error_bound(1, 3, 0.5) == 0.0
    assert B.max_norm_error_bound(1, 4, 0.5, sampler="shared", group_size=2) == 0.0
    # 2 (n - 1) < delta: the log is negative, clipped to 0
    assert B.max_norm_error_bound(2, 5, 0.9999999) == math.sqrt(
        max(0.0, math.log(2.0 / 0.9999999)) / 10.0
    )
    # n (n - 1) = 2 < 1 / delta... with n = 2 and a correlated sampler, log(2 / delta) > 0
    got = B.max_norm_error_bound(2, 4, 0.5, sampler="shared", group_size=2)
    assert close(got, mp.sqrt(mp.log(4) / 4))
    with pytest.raises(ValueError, match=r"^delta: must lie in the open interval"):
        B.max_norm_error_bound(2, 1, 0.0)


def test_tail_and_error_bounds_are_inverse():
    for n, s, delta in [(10, 7, 0.05), (300, 50, 1e-3)]:
        eps = B.max_norm_error_bound(n, s, delta)
        assert math.isclose(B.max_norm_tail_bound(n, s, eps), delta, rel_tol=1e-12)
        eps = B.max_norm_error_bound(n, s * 2, delta, sampler="shared", group_size=2)
        assert math.isclose(
            B.max_norm_tail_bound(n, s * 2, eps, sampler="shared", group_size=2),
            delta,
            rel_tol=1e-12,
        )


@pytest.mark.parametrize(
    "n, eps, delta",
    [
        (2, 0.5, 0.5),
        (10, 0.1, 0.05),
        (1000, 0.01, 1e-6),
        (3, 0.9, 0.9),
        (50, 0.2, 0.3),
        # delta = the tail at s = 1 (to rounding): the estimate ceil(log(2(n-1)/delta) /
        # (2 eps^2)) rounds up to 2 and the guard must step down to 1
        (2, 0.6141945387851184, 0.9405197016631046),
        (3, 0.9711244904247763, 0.6066087915429754),
    ],
)
def test_required_samples_is_the_smallest(n, eps, delta):
    s = B.required_samples(n, eps, delta)

    def tail(k):
        return 2 * (n - 1) * mp.e ** (-2 * k * mp.mpf(eps) ** 2)

    assert tail(s) <= delta
    assert s == 1 or tail(s - 1) > delta
    assert type(s) is int


@pytest.mark.parametrize(
    "n, eps, delta, estimate",
    [
        (10, 0.3, 1.3657903141304475e-16, 220),  # the estimate one too high
        (3, 0.3, 7.46511579071838e-17, 215),
        (10, 0.1, 0.07504793456227399, 274),  # the estimate one too low
        (3, 0.1, 0.03100193556454676, 243),
    ],
)
def test_required_samples_rounding_guards(n, eps, delta, estimate):
    """delta within an ulp of the tail at some s: ceil(log(2(n-1)/delta) / (2 eps^2))
    rounds to the wrong side, and the two guard loops must correct it. At such a delta
    float and exact tails can disagree, so the oracle here is the condition in binary64,
    searched from s = 1."""
    assert max(1, math.ceil(math.log(2.0 * (n - 1) / delta) / (2.0 * eps * eps))) == estimate

    def tail(k):
        return 2.0 * (n - 1) * math.exp(-2.0 * k * eps * eps)

    want = next(k for k in range(1, 10**6) if tail(k) <= delta)
    assert abs(want - estimate) == 1
    assert B.required_samples(n, eps, delta) == want


@pytest.mark.parametrize("sampler", ["iid", "stratified", "shared"])
def test_max_norm_error_bound_with_a_log_term_below_one(sampler):
    # n = 2, delta = 0.9: log(n (n - 1) / delta) = log(2 / 0.9) = 0.80 (and the iid
    # log(2 (n - 1) / delta) the same): the square root of a term below 1, not clipped
    n, s, delta = 2, 4, 0.9
    groups = 4 if sampler == "iid" else 2
    want = mp.sqrt(mp.log(mp.mpf(2) / mp.mpf(delta)) / (2 * groups))
    kw = {} if sampler == "iid" else {"sampler": sampler, "group_size": 2}
    assert close(B.max_norm_error_bound(n, s, delta, **kw), want)


def test_max_norm_tail_bound_refuses_num_samples_before_eps():
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1, got 0$"):
        B.max_norm_tail_bound(5, 0, 2.0)
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1, got -1$"):
        B.max_norm_tail_bound(5, -1, 0.5, sampler="shared")


def test_max_norm_error_bound_refusals_name_the_argument_first():
    # each refused by its own check, before the later arguments are looked at
    with pytest.raises(ValueError, match=r"^n: must be >= 1, got 0$"):
        B.max_norm_error_bound(0, 4, 2.0)
    with pytest.raises(TypeError, match=r"^n: must be an integer"):
        B.max_norm_error_bound(2.5, 4, 0.1)
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1, got 0$"):
        B.max_norm_error_bound(5, 0, 2.0)
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1, got -3$"):
        B.max_norm_error_bound(5, -3, 0.1, sampler="stratified")
    assert B.max_norm_error_bound(1, 1, 0.5) == 0.0


def test_required_samples_edges():
    assert B.required_samples(1, 0.5, 0.5) == 1
    # 2 (n - 1) exp(-2 eps^2) <= delta already at s = 1
    assert B.required_samples(2, 0.99, 0.9) == 1
    # exactly at the ceiling: log(2 / delta) / (2 eps^2) = 8 for delta = 2 e^-4, eps = 1/2
    delta = 2.0 * math.exp(-4.0)
    s = B.required_samples(2, 0.5, delta)
    assert s in (8, 9) and 2.0 * math.exp(-2.0 * s * 0.25) <= delta
    assert 2.0 * math.exp(-2.0 * (s - 1) * 0.25) > delta
    with pytest.raises(
        ValueError, match=r"^eps: 1e-09 needs about 1e1[0-9] samples, beyond 2\*\*53"
    ):
        B.required_samples(10, 1e-9, 0.1)
    s = B.required_samples(2, 1e-7, 0.5)
    assert 2.0 * math.exp(-2.0 * s * 1e-14) <= 0.5 < 2.0 * math.exp(-2.0 * (s - 1) * 1e-14)
    with pytest.raises(ValueError, match=r"^n: must be >= 1"):
        B.required_samples(0, 0.5, 0.5)
    with pytest.raises(ValueError, match=r"^eps: must lie in the open interval"):
        B.required_samples(2, 0.0, 0.5)
    with pytest.raises(ValueError, match=r"^delta: must lie in the open interval"):
        B.required_samples(2, 0.5, 1.0)


def test_required_samples_limit_at_two_to_the_53():
    # log_s = log(log_term) - log 2 - 2 log eps against log(2**53)
    n, delta = 2, 2.0 * math.exp(-1.0)  # log_term = 1
    eps_edge = math.sqrt(1.0 / (2.0 * 2.0**53))
    above = eps_edge * (1 - 1e-9)
    with pytest.raises(ValueError, match=r"^eps: "):
        B.required_samples(n, above, delta)
    below = eps_edge * (1 + 1e-6)
    s = B.required_samples(n, below, delta)
    assert 2.0**52 < s <= 2.0**53
    # the refusal says how many samples, to the nearest power of ten
    eps = 1e-10
    about = round(float(mp.log10(mp.log(2 * (n - 1) / mp.mpf(delta)) / (2 * mp.mpf(eps) ** 2))))
    assert about == 20
    with pytest.raises(ValueError) as info:
        B.required_samples(n, eps, delta)
    assert str(info.value) == (
        "eps: 1e-10 needs about 1e20 samples, beyond 2**53 where a sample count is exact "
        "in floating point; use a larger eps"
    )


@pytest.mark.parametrize(
    "sigma, s, delta, kw",
    [
        (4.0, 8, 0.05, {}),
        (0.3, 2, 0.5, {}),  # sigma < 1: the search starts at b = 1
        (100.0, 32, 1e-20, {}),  # delta below 2^-53
        (10.0, 16, 0.01, {"sampler": "stratified", "group_size": 4}),
        (10.0, 16, 0.01, {"sampler": "shared", "group_size": 2}),
        (3.0, 1, 0.96, {}),  # the answer 1 lies below the first bracket end ceil(sigma) = 3
    ],
)
def test_block_size_bound_is_the_smallest(sigma, s, delta, kw):
    b = B.block_size_bound(sigma, s, delta, **kw)
    assert largest_pitch_sf_of(float(b), sigma, s, **kw) <= delta
    assert b == 0 or largest_pitch_sf_of(float(b - 1), sigma, s, **kw) > delta
    assert B.block_size_tail_bound(b, sigma, s, **kw) <= delta
    assert B.block_size_tail_bound(b - 1, sigma, s, **kw) > delta


def test_block_size_bound_at_a_delta_equal_to_the_tail():
    """delta equal to the tail at b = 5 (in binary64): 5 tokens are enough (tail <= delta)."""
    delta = float(largest_pitch_sf(5.0, 2.0, 4))
    assert B.block_size_bound(2.0, 4, delta) == 5
    assert float(largest_pitch_sf(4.0, 2.0, 4)) > delta


def test_block_size_tail_bound_is_the_largest_pitch_law():
    assert B.block_size_tail_bound(7, 3.0, 5) == float(largest_pitch_sf(7.0, 3.0, 5))
    assert B.block_size_tail_bound(0, 3.0, 5) == 1.0
    got = B.block_size_tail_bound(7, 3.0, 6, sampler="stratified", group_size=3)
    assert got == float(largest_pitch_sf_of(7.0, 3.0, 6, sampler="stratified", group_size=3))
    with pytest.raises(ValueError, match=r"^b: must be >= 0, got -1$"):
        B.block_size_tail_bound(-1, 3.0, 5)
    with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0"):
        B.block_size_bound(0.0, 5, 0.1)
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1"):
        B.block_size_bound(1.0, 0, 0.1)
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1, got 0$"):
        B.block_size_bound(1.0, 0, 1.0)  # before delta is looked at
    with pytest.raises(ValueError, match=r"^delta: must lie in the open interval"):
        B.block_size_bound(1.0, 1, 1.0)


@pytest.mark.parametrize(
    "n, sigma, s, delta", [(16, 4.0, 8, 0.1), (64, 2.0, 32, 1e-3), (5, 50.0, 4, 0.5)]
)
def test_spectral_bound_solves_its_bernstein_equation(n, sigma, s, delta):
    out = B.spectral_error_bound(n, sigma, s, delta)
    assert out.eps == out.bernstein + out.bias
    assert out.probability == delta and out.num_samples == s
    rest = delta - out.truncation_probability
    assert rest > 0
    tau, v, r = mp.mpf(out.bernstein), mp.mpf(out.variance_proxy), mp.mpf(out.range_bound)
    lhs = 2 * n * mp.e ** (-s * tau**2 / (2 * (v + r * tau / 3)))
    assert abs(lhs / rest - 1) < 1e-10
    if out.truncation >= n:
        assert out.truncation_probability == 0.0 and out.bias == 0.0
    else:
        assert out.truncation_probability == float(
            largest_pitch_sf(float(out.truncation), sigma, s)
        )


@pytest.mark.parametrize(
    "n, sigma, s, delta", [(50, 4.0, 8, 0.2), (64, 2.0, 32, 1e-3), (200, 3.0, 16, 0.05)]
)
def test_spectral_truncation_terms(n, sigma, s, delta):
    out = B.spectral_error_bound(n, sigma, s, delta)
    k = out.truncation
    assert k < n  # these cases truncate
    lnorm = min(float(n), kms_spectral_norm_limit(sigma))
    K, S = mp.mpf(k), mp.mpf(sigma)
    tail = mp.e ** (-K / S)
    p_one = (1 + K / S) * tail  # P(delta > k) for Gamma(2, sigma)
    moment = tail * (K * K / S + 2 * K + 2 * S) + p_one
    assert close(out.bias, min(n * p_one, moment + lnorm * p_one), rtol=1e-12)
    assert out.range_bound == max(float(k), lnorm) + out.bias


def test_spectral_variance_default_and_given():
    exact = B.spectral_error_bound(12, 3.0, 4, 0.1)
    given = B.spectral_error_bound(12, 3.0, 4, 0.1, variance=exact.variance_proxy)
    assert given == exact
    zero = B.spectral_error_bound(12, 3.0, 4, 0.1, variance=0.0)
    assert zero.variance_proxy == 0.0 and zero.eps < exact.eps
    with pytest.raises(ValueError, match=r"^variance: must be finite and >= 0"):
        B.spectral_error_bound(12, 3.0, 4, 0.1, variance=-1.0)
    assert B.EXACT_VARIANCE_MAX_N == 1024


def test_spectral_variance_is_the_exact_one_up_to_exact_variance_max_n(monkeypatch):
    """At ``n == EXACT_VARIANCE_MAX_N`` the default proxy is still the exact ``||E[(M -
    L*)^2]||`` (times ``1 + 1e-12``, capped by the limit), from ``n + 1`` the limit. The
    threshold is lowered to 12 (the rule, not the value 1024, is under test; 1024 is pinned
    above) and the exact proxy is recomputed here from the definition: three positions
    share a bin with probability ``exp(-span / sigma)``, so ``E[M^2]_ij = sum_k
    exp(-(max - min) / sigma)`` over ``i, j, k``, minus ``L*^2``."""
    n, sigma, s, delta = 12, 3.0, 8, 0.05
    monkeypatch.setattr(B, "EXACT_VARIANCE_MAX_N", n)
    i, j, k = np.ix_(np.arange(n), np.arange(n), np.arange(n))
    span = np.maximum(np.maximum(i, j), k) - np.minimum(np.minimum(i, j), k)
    lstar = np.exp(-np.abs(np.subtract.outer(np.arange(n), np.arange(n))) / sigma)
    e2 = np.exp(-span / sigma).sum(axis=2) - lstar @ lstar
    limit = 1.0 / (2.0 * math.sinh(1.0 / (2.0 * sigma)) ** 2)
    exact = np.max(np.abs(np.linalg.eigvalsh(e2))) * (1 + 1e-12)
    assert exact < 0.9 * limit  # the premise: the two proxies differ at this n
    at = B.spectral_error_bound(n, sigma, s, delta)
    assert close(at.variance_proxy, exact, rtol=1e-13)
    assert at == B.spectral_error_bound(n, sigma, s, delta, variance=at.variance_proxy)
    above = B.spectral_error_bound(n + 1, sigma, s, delta)
    assert close(above.variance_proxy, limit, rtol=1e-13)


def test_spectral_required_samples_is_the_smallest():
    n, sigma, delta, eps = 16, 4.0, 0.1, 3.0
    s = B.spectral_required_samples(n, sigma, eps, delta)
    assert B.spectral_error_bound(n, sigma, s, delta).eps <= eps
    assert s == 1 or B.spectral_error_bound(n, sigma, s - 1, delta).eps > eps
    big = B.spectral_error_bound(n, sigma, 1, delta).eps
    assert B.spectral_required_samples(n, sigma, big, delta) == 1
    with pytest.raises(ValueError, match=r"^eps: not reached with num_samples <= 8$"):
        B.spectral_required_samples(n, sigma, 1e-3, delta, max_samples=8)
    with pytest.raises(ValueError, match=r"^eps: must be finite and > 0"):
        B.spectral_required_samples(n, sigma, 0.0, delta)


def _gamma2_truncation_mp(n, sigma, s, k, lnorm):
    """(P(max pitch > k), bias bound, range R0) of the truncated Bernstein step, in mpmath,
    for Gamma(2, sigma) pitches (``proofs_notes/spectral_bound.md``)."""
    if k >= n:
        return mp.mpf(0), mp.mpf(0), max(mp.mpf(n), lnorm)
    K, S = mp.mpf(k), mp.mpf(sigma)
    tail = mp.e ** (-K / S)
    p_one = (1 + K / S) * tail
    moment = tail * (K * K / S + 2 * K + 2 * S) + p_one
    return 1 - (1 - p_one) ** s, min(n * p_one, moment + lnorm * p_one), max(K, lnorm)


def _spectral_error_mp(n, sigma, s, delta, v):
    """spectral_error_bound's documented recipe in mpmath: levels n and, for each f in
    {0.5, 0.3, 0.1, 0.03, 0.01, 0.001}, the smallest integer b with P(max_t delta_t > b)
    <= f delta (by scanning b), clipped to 1..n; the best truncated Bernstein step."""
    lnorm = min(mp.mpf(n), mp.mpf(kms_spectral_norm_limit(sigma)))
    levels = {n}
    for frac in ("0.5", "0.3", "0.1", "0.03", "0.01", "0.001"):
        b = 0
        while _gamma2_truncation_mp(n + b + 1, sigma, s, b, lnorm)[0] > mp.mpf(frac) * delta:
            b += 1
        levels.add(max(1, min(n, b)))
    best = None
    for k in sorted(levels):
        p_trunc, bias, r0 = _gamma2_truncation_mp(n, sigma, s, k, lnorm)
        ell = mp.log(2 * n / (mp.mpf(delta) - p_trunc))
        a = ell * (r0 + bias) / (3 * s)
        tau = a + mp.sqrt(a * a + 2 * ell * v / s)
        if best is None or tau + bias < best[0]:
            best = (tau + bias, k, p_trunc, r0 + bias, bias)
    return best


def test_spectral_error_bound_level_clipped_to_one():
    """sigma = 0.05, s = 1, delta = 0.9: every level's tail fraction is met at b <= 1, the
    level clipped up to 1 is the best (k = 2 would give a larger R)."""
    n, sigma, s, delta = 8, 0.05, 1, 0.9
    out = B.spectral_error_bound(n, sigma, s, delta)
    eps, k, p_trunc, r, bias = _spectral_error_mp(n, sigma, s, delta, mp.mpf(out.variance_proxy))
    assert k == 1 and out.truncation == 1
    assert close(out.eps, eps, rtol=1e-12) and close(out.range_bound, r, rtol=1e-13)
    assert close(out.bias, bias, rtol=1e-12)
    assert close(out.truncation_probability, p_trunc, rtol=1e-12)


def test_spectral_bounds_at_the_smallest_delta():
    """delta = 5e-324 (the smallest double): every f delta rounds to 0, so no truncation
    level has a tail to aim at; only the untruncated level n is left (no refusal)."""
    from plsh_ref.kernels import Exponential

    for out in (
        B.spectral_error_bound(8, 2.0, 4, 5e-324),
        B.kernel_spectral_error_bound(8, Exponential(2.0), 4, 5e-324),
    ):
        assert out.truncation == 8 and out.probability == 5e-324
        assert out.truncation_probability == 0.0 and out.bias == 0.0


def test_spectral_required_samples_refusals_edges_and_given_variance():
    n, sigma, delta, eps = 16, 4.0, 0.1, 3.0
    with pytest.raises(ValueError, match=r"^n: must be >= 1, got 0$"):
        B.spectral_required_samples(0, sigma, eps, delta)
    with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0"):
        B.spectral_required_samples(n, 0.0, eps, delta)
    with pytest.raises(ValueError, match=r"^max_samples: must be >= 1, got 0$"):
        B.spectral_required_samples(n, sigma, eps, delta, max_samples=0)
    # n = 1 is valid: the smallest s
    one = B.spectral_required_samples(1, sigma, 0.5, delta)
    assert B.spectral_error_bound(1, sigma, one, delta).eps <= 0.5
    assert one == 1 or B.spectral_error_bound(1, sigma, one - 1, delta).eps > 0.5
    # the limit itself may be the answer (40 is not a power of two); one below is refused
    s = B.spectral_required_samples(n, sigma, eps, delta)
    assert s & (s - 1) != 0
    assert B.spectral_required_samples(n, sigma, eps, delta, max_samples=s) == s
    with pytest.raises(ValueError, match=rf"^eps: not reached with num_samples <= {s - 1}$"):
        B.spectral_required_samples(n, sigma, eps, delta, max_samples=s - 1)
    # a given variance proxy is the one used (four times the exact one: more samples)
    v = 4 * B.spectral_error_bound(n, sigma, 1, delta).variance_proxy
    s4 = B.spectral_required_samples(n, sigma, eps, delta, variance=v)
    assert s4 > s
    assert B.spectral_error_bound(n, sigma, s4, delta, variance=v).eps <= eps
    assert B.spectral_error_bound(n, sigma, s4 - 1, delta, variance=v).eps > eps


def _spectral_tail_mp(n, sigma, s, eps, v):
    """The documented minimum over k = n and ceil(sigma x), x = 40 geometric points in
    [0.5, 200], of p_k + 2 n exp(-s tau^2 / (2 (v + R tau / 3))), tau = eps - bias > 0."""
    lnorm = min(mp.mpf(n), mp.mpf(kms_spectral_norm_limit(sigma)))
    grid = [mp.mpf("0.5") * mp.mpf(400) ** (mp.mpf(i) / 39) for i in range(40)]
    levels = {n} | {max(1, min(n, int(mp.ceil(sigma * x)))) for x in grid}
    best, best_k = mp.mpf(1), None
    for k in sorted(levels):
        p_trunc, bias, r0 = _gamma2_truncation_mp(n, sigma, s, k, lnorm)
        tau = eps - bias
        if tau <= 0:
            continue
        value = p_trunc + 2 * n * mp.e ** (-s * tau**2 / (2 * (v + (r0 + bias) * tau / 3)))
        if value < best:
            best, best_k = value, k
    return best, best_k


@pytest.mark.parametrize(
    "n, sigma, s, eps, level",
    [
        (64, 2.3, 400, 1.5, 46),  # the best level truncates (k = ceil(2.3 x) < n)
        (30, 0.7, 300, 0.8, 17),
        (64, 2.3, 400, 3.0, 64),  # no truncation wins
        (8, 2.3, 4000, 1.0, 8),  # a bound far below 1e-100
        (64, 0.05, 100, 0.1, 1),  # sigma x < 1: the level clipped up to 1 wins
        (1, 2.0, 1, 0.5, 1),  # one position, one sample
    ],
)
def test_spectral_tail_bound_is_its_minimum(n, sigma, s, eps, level):
    v = B.spectral_error_bound(n, sigma, s, 0.1).variance_proxy  # the default proxy
    want, best_k = _spectral_tail_mp(n, sigma, s, eps, mp.mpf(v))
    assert best_k == level and 0 < want < 1
    assert close(B.spectral_tail_bound(n, sigma, s, eps), want, rtol=1e-13)
    # a given proxy is used as given
    want_given, _ = _spectral_tail_mp(n, sigma, s, eps, mp.mpf(2 * v))
    assert close(B.spectral_tail_bound(n, sigma, s, eps, variance=2 * v), want_given, rtol=1e-13)


def _kernel_spectral_mp(n, kernel, s, delta, sf, kvals, first_moment):
    """kernel_spectral_error_bound's documented recipe, independently: levels n and the
    1 - f delta quantiles of the largest pitch (mpmath roots of the pitch tail ``sf``),
    ||K|| by eigvalsh of ``kvals(|i - j|)``, the truncated Bernstein step in mpmath. The
    proxy v and ||K|| carry the function's relative 1e-12 margin against rounding."""
    from plsh_ref.kernels import variance_proxy

    pos = np.arange(n)
    kmat = kvals(np.abs(pos[:, None] - pos[None, :]).astype(float))
    lnorm = mp.mpf(float(np.linalg.eigvalsh(kmat)[-1])) * (1 + mp.mpf(1e-12))
    v = mp.mpf(variance_proxy(kernel, n)) * (1 + mp.mpf(1e-12))
    levels = {n}
    for frac in ("0.5", "0.3", "0.1", "0.03", "0.01", "0.001"):
        target = 1 - (1 - mp.mpf(frac) * mp.mpf(delta)) ** (mp.mpf(1) / s)  # P(delta > q)
        q = mp.findroot(lambda b, t=target: mp.log(sf(b)) - mp.log(t), mp.mpf(10), solver="secant")
        levels.add(int(max(1, min(n, math.ceil(float(q))))))
    best = None
    for k in sorted(levels):
        K = mp.mpf(k)
        if k >= n:
            p_trunc, bias, r0 = mp.mpf(0), mp.mpf(0), max(mp.mpf(n), lnorm)
        else:
            p_one = sf(K)
            bias = min(n * p_one, first_moment(K) + p_one + lnorm * p_one)
            p_trunc, r0 = 1 - (1 - p_one) ** s, max(K, lnorm)
        if p_trunc >= delta:
            continue
        ell = mp.log(2 * n / (mp.mpf(delta) - p_trunc))
        a = ell * (r0 + bias) / (3 * s)
        tau = a + mp.sqrt(a * a + 2 * ell * v / s)
        if best is None or tau + bias < best[0]:
            best = (tau + bias, k, p_trunc, r0 + bias, bias, tau, v)
    return best, sorted(levels)


def test_kernel_spectral_error_bound_refusals_and_smallest_inputs():
    from plsh_ref.kernels import Exponential

    kern = Exponential(2.0)
    with pytest.raises(ValueError, match=r"^n: must be >= 1, got 0$"):
        B.kernel_spectral_error_bound(0, kern, 4, 0.1)
    with pytest.raises(ValueError, match=r"^n: must be <= 1024, got 1025$"):
        B.kernel_spectral_error_bound(1025, kern, 4, 0.1)
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1, got 0$"):
        B.kernel_spectral_error_bound(8, kern, 0, 0.1)
    with pytest.raises(ValueError, match=r"^delta: must lie in the open interval"):
        B.kernel_spectral_error_bound(8, kern, 4, 1.0)
    # in argument order, before the later arguments are looked at
    with pytest.raises(ValueError, match=r"^n: must be >= 1, got 0$"):
        B.kernel_spectral_error_bound(0, kern, 0, 1.0)
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1, got 0$"):
        B.kernel_spectral_error_bound(8, kern, 0, 1.0)
    one = B.kernel_spectral_error_bound(1, kern, 1, 0.5)  # n = 1 and s = 1 are valid
    assert one.truncation == 1 and one.num_samples == 1 and math.isfinite(one.eps)


def _kerple_log_mp(r1, r2):
    r1, r2 = mp.mpf(r1), mp.mpf(r2)
    return lambda b: (1 + r2 * b) ** (-r1 - 1) * (1 + (r1 + 1) * r2 * b)


@pytest.mark.parametrize(
    "case, levels, level",
    [
        ("exponential_3", [29, 31, 34, 38, 42, 49, 64], 29),
        ("exponential_8", [83, 87, 97, 107, 117, 136, 256], 83),
        ("kerple_log_heavy", [20, 34, 105, 128], 20),  # r1 = 1: no mean, bias n P(delta > k)
        ("kerple_log_untruncated", [128], 128),
    ],
)
def test_kernel_spectral_error_bound_is_its_recipe(case, levels, level):
    from plsh_ref.kernels import Exponential, KerpleLog

    sig = {"exponential_3": 3.0, "exponential_8": 8.0}.get(case)
    if sig is not None:
        S = mp.mpf(sig)
        n, s, delta, kernel = (64, 32, 0.05, None) if sig == 3.0 else (256, 64, 0.05, None)
        kernel = Exponential(sig)
        sf = lambda b: (1 + b / S) * mp.e ** (-b / S)  # noqa: E731
        kvals = lambda r: np.exp(-r / sig)  # noqa: E731
        moment = lambda k: mp.e ** (-k / S) * (k * k / S + 2 * k + 2 * S)  # noqa: E731
    else:
        r1, r2 = (1.0, 5.0) if case == "kerple_log_heavy" else (0.7, 0.5)
        n, s, delta = (128, 8, 0.3) if case == "kerple_log_heavy" else (128, 32, 5e-8)
        kernel = KerpleLog(r1, r2)
        sf = _kerple_log_mp(r1, r2)
        kvals = lambda r: (1 + r2 * r) ** (-r1)  # noqa: E731
        moment = lambda k: mp.inf  # noqa: E731
    best, got_levels = _kernel_spectral_mp(n, kernel, s, delta, sf, kvals, moment)
    assert got_levels == levels and best[1] == level
    out = B.kernel_spectral_error_bound(n, kernel, s, delta)
    eps, k, p_trunc, r, bias, tau, v = best
    assert out.truncation == k and out.probability == delta and out.num_samples == s
    assert close(out.eps, eps, rtol=1e-12) and close(out.bernstein, tau, rtol=1e-12)
    assert close(out.range_bound, r, rtol=1e-13) and close(out.variance_proxy, v, rtol=1e-14)
    if k < n:
        assert close(out.bias, bias, rtol=1e-12)
        assert close(out.truncation_probability, p_trunc, rtol=1e-12)
    else:
        assert out.bias == 0.0 and out.truncation_probability == 0.0


def _exponential_recipe(n, sigma, s, delta):
    from plsh_ref.kernels import Exponential

    S = mp.mpf(sigma)
    return _kernel_spectral_mp(
        n,
        Exponential(sigma),
        s,
        delta,
        lambda b: (1 + b / S) * mp.e ** (-b / S),
        lambda r: np.exp(-r / sigma),
        lambda k: mp.e ** (-k / S) * (k * k / S + 2 * k + 2 * S),
    )


@pytest.mark.parametrize(
    "n, sigma, s, delta, level, why",
    [
        (16, 0.5, 1, 0.9, 2, "the 1 - 0.3 delta level alone is the best"),
        (16, 1.0, 32, 0.9, 9, "the 1 - 0.1 delta level alone is the best"),
        (8, 0.05, 1, 0.9, 1, "every quantile is below 1: level clipped to 1, R = ||K||"),
        (16, 1.0, 4, 0.9995, None, "delta near 1: 1 - f delta is still a probability"),
        (64, 3.0, 32, 1e-17, None, "1 - f delta rounds to 1: levels from the tail itself"),
    ],
)
def test_kernel_spectral_error_bound_levels_at_the_edges(n, sigma, s, delta, level, why):
    """Cases where a single candidate level decides the result (each level of the recipe
    must be there), the smallest level 1 with ``R = ||K||`` (its 1e-12 margin shows at
    rtol 1e-13), and ``delta`` at both ends of ``(0, 1)``: the recipe in mpmath."""
    from plsh_ref.kernels import Exponential

    best, levels = _exponential_recipe(n, sigma, s, delta)
    eps, k, p_trunc, r, bias, tau, v = best
    if level is not None:
        assert k == level, why
    out = B.kernel_spectral_error_bound(n, Exponential(sigma), s, delta)
    assert out.truncation == k and out.probability == delta and out.num_samples == s
    assert close(out.eps, eps, rtol=1e-12) and close(out.bernstein, tau, rtol=1e-12)
    assert close(out.range_bound, r, rtol=1e-13) and close(out.variance_proxy, v, rtol=1e-14)
    if k < n:
        assert close(out.bias, bias, rtol=1e-12)
        assert close(out.truncation_probability, p_trunc, rtol=1e-12)
    else:
        assert out.bias == 0.0 and out.truncation_probability == 0.0


@pytest.mark.parametrize(
    "eps",
    [
        8.772388268377445e-09,  # the answer 2**53 - 2; log_s rounds to log(2**53) exactly
        1e-7,  # about 7e13 samples: one more changes the tail by less than 1e-13
    ],
)
def test_required_samples_near_2_53_is_the_exact_ceiling(eps):
    """Beyond about 2**40 samples binary64 cannot resolve one sample more: the answer must
    still be the smallest s with 2 (n - 1) exp(-2 s eps^2) <= delta (mpmath, 40 digits)."""
    n, delta = 2, 0.5
    E = mp.mpf(eps)
    want = int(mp.ceil(mp.log(2 * (n - 1) / mp.mpf(delta)) / (2 * E * E)))
    assert 2**40 < want <= 2**53
    assert 2 * (n - 1) * mp.e ** (-2 * want * E * E) <= delta
    assert 2 * (n - 1) * mp.e ** (-2 * (want - 1) * E * E) > delta
    assert B.required_samples(n, eps, delta) == want


def test_required_samples_refuses_an_answer_just_above_2_53():
    """eps = 8.772388268377443e-09: the answer is 2**53 + 1 (mpmath), past the limit."""
    eps = 8.772388268377443e-09
    E = mp.mpf(eps)
    assert mp.ceil(mp.log(4) / (2 * E * E)) == 2**53 + 1
    with pytest.raises(ValueError, match=r"^eps: 8\.77239e-09 needs about 1e16 samples"):
        B.required_samples(2, eps, 0.5)


def test_spectral_error_bound_refuses_num_samples_before_delta():
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1, got 0$"):
        B.spectral_error_bound(8, 2.0, 0, 1.0)
    with pytest.raises(TypeError, match=r"^num_samples: must be an integer"):
        B.spectral_error_bound(8, 2.0, 2.5, 0.1)


def test_spectral_tail_bound_refusals_name_the_argument():
    with pytest.raises(ValueError, match=r"^n: must be >= 1, got 0$"):
        B.spectral_tail_bound(0, 2.0, 4, 0.5)
    with pytest.raises(TypeError, match=r"^n: must be an integer"):
        B.spectral_tail_bound(2.5, 2.0, 4, 0.5)
    with pytest.raises(ValueError, match=r"^sigma: must be finite and > 0"):
        B.spectral_tail_bound(8, 0.0, 4, 0.5)
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1, got 0$"):
        B.spectral_tail_bound(8, 2.0, 0, 0.5)
    with pytest.raises(TypeError, match=r"^num_samples: must be an integer"):
        B.spectral_tail_bound(8, 2.0, 4.5, 0.5)
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1, got 0$"):
        B.spectral_tail_bound(8, 2.0, 0, 0.0)  # before eps is looked at
    assert 0.0 < B.spectral_tail_bound(8, 2.0, 1, 5.0) <= 1.0  # s = 1 is valid


def test_spectral_tail_bound_edges():
    assert B.spectral_tail_bound(8, 2.0, 4, 1e-9) == 1.0  # nothing below the bias
    small = B.spectral_tail_bound(8, 2.0, 10_000, 2.0)
    assert 0.0 <= small < 1e-6
    with pytest.raises(ValueError, match=r"^eps: must be finite and > 0"):
        B.spectral_tail_bound(8, 2.0, 4, 0.0)


def _problem():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(1, 2, 4, 3))
    k = rng.normal(size=(1, 2, 5, 3))
    v = rng.normal(size=(1, 2, 5, 2))
    return q, k, v


def _weights(q, k, slopes, causal, qpos, kpos, scale):
    logits = scale * np.einsum("bhid,bhjd->bhij", q, k)
    adm = (kpos[None, :] <= qpos[:, None]) if causal else np.ones((qpos.size, kpos.size), bool)
    logits = np.where(adm, logits, -np.inf)
    a = np.exp(logits - logits.max(axis=-1, keepdims=True))
    lstar = np.exp(-np.abs(qpos[:, None] - kpos[None, :])[None] * np.asarray(slopes)[:, None, None])
    return a, lstar, adm


@pytest.mark.parametrize("positions", ["default", "given"])
@pytest.mark.parametrize("causal", [True, False])
def test_output_certificate_is_its_formula(causal, positions):
    q, k, v = _problem()
    part = PartitionSample(np.array([[2.0, 3.0, 1.5], [4.0, 1.0, 2.5]]), np.zeros((2, 3)) + 0.25)
    slopes = [0.5, 0.25]
    if positions == "default":  # aligned at the end
        qpos, kpos = np.arange(1, 5), np.arange(5)
        given = {}
    else:  # both given, neither the default
        qpos, kpos = np.array([3, 4, 6, 9]), np.array([0, 2, 4, 6, 7])
        given = {"query_positions": qpos, "key_positions": kpos}
    got = B.output_error_certificate(
        q, k, v, part, slopes=slopes, causal=causal, scale=0.7, **given
    )
    a, lstar, adm = _weights(q, k, slopes, causal, qpos, kpos, 0.7)
    from plsh_ref.partition import counts

    mt = counts(part, qpos, kpos, causal=causal) / 3
    lstar = lstar * adm
    ratio = np.sum(a * np.abs(mt - lstar), -1) / np.sum(a * lstar, -1)
    vv = np.broadcast_to(v[:, :, None], (1, 2, 4, 5, 2))
    adm5 = adm[None, None, :, :, None]
    vrange = np.max(np.where(adm5, vv, -np.inf), 3) - np.min(np.where(adm5, vv, np.inf), 3)
    want = vrange * ratio[..., None]
    # a row whose PLSH weights all vanish (Z~ = 0, possible off the aligned positions)
    # gets max |v| over its admissible keys
    vanished = np.sum(a * mt, -1) == 0
    assert vanished.any() == (positions == "given")
    vabs = np.max(np.where(adm5, np.abs(vv), 0.0), 3)
    want = np.where(vanished[..., None], vabs, want)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


def test_output_certificate_when_the_alibi_weights_underflow():
    import warnings

    from plsh_ref import alibi_attention, plsh_attention

    # query 2000, keys 0 and 1, slope 1: every L* = e^-2000 underflows (Z* = 0), but
    # alibi_attention (log-space) still weighs key 1 by 1 / (1 + e^-1); one huge bin puts
    # the three positions together, so PLSH averages the two keys equally
    q, k = np.ones((1, 1, 1, 2)), np.ones((1, 1, 2, 2))
    v = np.array([[[[3.0, -1.0], [-5.0, 2.0]]]])
    part = PartitionSample(np.array([[1e6]]), np.array([[0.0]]))
    kw = {"causal": True, "query_positions": [2000], "key_positions": [0, 1]}
    error = np.abs(
        plsh_attention(q, k, v, partition=part, return_lse=False, **kw)
        - alibi_attention(q, k, v, slopes=[1.0], return_lse=False, **kw)
    )
    assert error[0, 0, 0, 0] > 1.8  # was certified 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the 0/0 row is handled, not warned
        got = B.output_error_certificate(q, k, v, part, slopes=[1.0], **kw)
    np.testing.assert_array_equal(got, [[[[8.0, 3.0]]]])  # the range of the values
    assert np.all(got >= error)
    # no admissible key: 0 (and no warning either)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        none = B.output_error_certificate(
            q, k, v, part, slopes=[1.0], causal=True, query_positions=[-1], key_positions=[0, 1]
        )
    np.testing.assert_array_equal(none, np.zeros((1, 1, 1, 2)))


def test_output_bounds_with_logits_beyond_the_exponent_range():
    # logits +-1800 and +-1200: unshifted exp overflows, and one shift for all rows
    # underflows the negative row; each row is scaled by its own maximum (softmax)
    from scipy.special import softmax

    from plsh_ref.partition import counts

    q = np.array([[[[30.0, 30.0], [-30.0, -30.0]]]])
    k = np.array([[[[30.0, 30.0], [20.0, 20.0]]]])
    v = np.array([[[[1.0, -2.0], [4.0, 0.5]]]])
    part = PartitionSample(np.array([[3.0, 5.0]]), np.array([[0.5, 1.0]]))
    kw = {"slopes": [0.5], "causal": False, "scale": 1.0}
    kw |= {"query_positions": [0, 1], "key_positions": [0, 1]}
    a = softmax(np.einsum("bhid,bhjd->bhij", q, k), axis=-1)
    lstar = np.exp(-0.5 * np.abs(np.arange(2)[:, None] - np.arange(2)[None, :]))
    mt = counts(part, np.arange(2), np.arange(2)) / 2
    vrange = (v.max(axis=2) - v.min(axis=2))[:, :, None, :]
    ratio = np.sum(a * np.abs(mt - lstar), -1) / np.sum(a * lstar, -1)
    got = B.output_error_certificate(q, k, v, part, **kw)
    np.testing.assert_allclose(got, vrange * ratio[..., None], rtol=1e-12, atol=0)
    eps = B.max_norm_error_bound(2, 64, 0.1)
    assert eps < lstar.min()  # no row may vanish
    prior = B.output_error_bound(q, k, v, 64, 0.1, **kw)
    ratio = eps * np.sum(a, -1) / np.sum(a * lstar, -1)
    np.testing.assert_allclose(prior, vrange * ratio[..., None], rtol=1e-12, atol=0)


def test_output_certificate_rows_without_weight():
    # one key far away: L* > 0 but PLSH puts query and key in different bins
    q = np.ones((1, 1, 1, 2))
    k = np.ones((1, 1, 1, 2))
    v = np.array([[[[3.0, -5.0]]]])
    part = PartitionSample(np.array([[1.0]]), np.array([[0.5]]))
    got = B.output_error_certificate(
        q, k, v, part, slopes=[0.1], query_positions=[1], key_positions=[0]
    )
    np.testing.assert_array_equal(got, [[[[3.0, 5.0]]]])  # max |v|: the output is 0
    # no admissible key: bound 0
    got = B.output_error_certificate(
        q, k, v, part, slopes=[0.1], query_positions=[0], key_positions=[1]
    )
    np.testing.assert_array_equal(got, np.zeros((1, 1, 1, 2)))
    with pytest.raises(ValueError, match=r"^partition: has 1 heads, query has 2$"):
        B.output_error_certificate(np.ones((1, 2, 1, 2)), k, v, part)


@pytest.mark.parametrize("causal", [True, False])
def test_output_bound_is_its_formula(causal):
    q, k, v = _problem()
    slopes = [0.5, 0.25]
    qpos, kpos = np.array([3, 4, 6, 9]), np.arange(5) * 2
    got = B.output_error_bound(
        q,
        k,
        v,
        8,
        0.1,
        slopes=slopes,
        causal=causal,
        scale=0.7,
        query_positions=qpos,
        key_positions=kpos,
    )
    n = np.unique(np.concatenate([qpos, kpos])).size
    assert n == 7
    eps = B.max_norm_error_bound(n, 8, 0.1 / 2)
    a, lstar, adm = _weights(q, k, slopes, causal, qpos, kpos, 0.7)
    lstar = lstar * adm
    ratio = eps * np.sum(a, -1) / np.sum(a * lstar, -1)
    vv = np.broadcast_to(v[:, :, None], (1, 2, 4, 5, 2))
    adm5 = adm[None, None, :, :, None]
    vrange = np.max(np.where(adm5, vv, -np.inf), 3) - np.min(np.where(adm5, vv, np.inf), 3)
    want = vrange * ratio[..., None]
    lmax = np.max(np.where(adm[None], lstar, -np.inf), -1)
    vabs = np.max(np.where(adm5, np.abs(vv), 0.0), 3)
    vanish = (eps >= lmax)[None, :, :, None]
    want = np.where(vanish, np.maximum(want, vabs), want)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    grouped = B.output_error_bound(
        q,
        k,
        v,
        8,
        0.1,
        slopes=slopes,
        causal=causal,
        scale=0.7,
        query_positions=qpos,
        key_positions=kpos,
        sampler="shared",
        group_size=2,
    )
    eps_g = B.max_norm_error_bound(n, 8, 0.05, sampler="shared", group_size=2)
    assert eps_g > eps
    assert np.all(grouped >= got) and np.any(grouped > got)
    # a group size other than the default (2 for s = 8) is the one used
    grouped4 = B.output_error_bound(
        q,
        k,
        v,
        8,
        0.1,
        slopes=slopes,
        causal=causal,
        scale=0.7,
        query_positions=qpos,
        key_positions=kpos,
        sampler="shared",
        group_size=4,
    )
    eps_4 = B.max_norm_error_bound(n, 8, 0.05, sampler="shared", group_size=4)
    assert eps_4 > eps_g
    want_4 = vrange * (eps_4 * np.sum(a, -1) / np.sum(a * lstar, -1))[..., None]
    want_4 = np.where((eps_4 >= lmax)[None, :, :, None], np.maximum(want_4, vabs), want_4)
    np.testing.assert_allclose(grouped4, want_4, rtol=1e-12, atol=0)


def _slope_with_kernel_value(target):
    """A slope whose L* at distance 1 is exactly ``target`` (a search over nearby doubles)."""
    from plsh_ref.alibi import kernel_matrix

    base = -math.log(target)
    for k in range(-64, 65):
        slope = base * (1 + k * 2.0**-52)
        if kernel_matrix(1.0 / slope, np.array([1]), np.array([0]))[0, 0] == target:
            return slope
    raise AssertionError("no slope found")


def test_output_bound_vanishing_row_at_equality():
    # L* = eps exactly: on the event M~ >= L* - eps = 0, so the row may vanish and gets
    # max |v| (one key: the range is 0, so the bound is max |v| or nothing)
    eps = B.max_norm_error_bound(2, 4, 0.1)
    slope = _slope_with_kernel_value(eps)
    q = np.ones((1, 1, 1, 2))
    v = np.array([[[[3.0, -5.0]]]])
    got = B.output_error_bound(
        q, q, v, 4, 0.1, slopes=[slope], query_positions=[1], key_positions=[0]
    )
    np.testing.assert_array_equal(got, [[[[3.0, 5.0]]]])
    below = B.output_error_bound(  # L* just above eps: the row cannot vanish
        q, q, v, 4, 0.1, slopes=[slope * 0.999], query_positions=[1], key_positions=[0]
    )
    np.testing.assert_array_equal(below, np.zeros((1, 1, 1, 2)))


def test_output_bound_rows_without_weight_and_inadmissible_keys():
    import warnings

    q = np.ones((1, 1, 2, 2))
    k = np.ones((1, 1, 3, 2))
    v = np.array([[[[3.0, -1.0], [-5.0, 2.0], [7.0, 7.0]]]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the 0/0 and x/0 rows are handled, not warned
        got = B.output_error_bound(
            q, k, v, 4, 0.1, slopes=[1.0], query_positions=[-1, 2000], key_positions=[0, 1, 4000]
        )
    # query -1 (causal): no admissible key, bound 0. Query 2000: keys 0 and 1 admissible,
    # L* = e^-2000 = 0 (Z* = 0): the range (8, 3) of their values (both outputs are
    # averages of them; was max |v| = (5, 2), below the error the certificate test shows),
    # and key 4000 (inadmissible) does not count.
    np.testing.assert_array_equal(got, [[[[0.0, 0.0], [8.0, 3.0]]]])
    # an inadmissible key does not stop a row from vanishing: query 30 with keys 0 and 40
    # (values below 1 in magnitude: the inadmissible key's |v| = 2 must not count either)
    small = np.array([[[[0.5, -0.25], [2.0, -2.0]]]])
    far = B.output_error_bound(
        q[:, :, :1], k[:, :, :2], small, 4, 0.1, slopes=[1.0],
        query_positions=[30], key_positions=[0, 40],
    )  # fmt: skip
    eps = B.max_norm_error_bound(3, 4, 0.1)
    assert math.exp(-30.0) <= eps
    assert far[0, 0, 0].tolist() == [0.5, 0.25]


def test_output_bound_vanishing_rows_get_max_abs_value():
    # a key so far that L* <= eps: the row may vanish, so the bound covers max |v|
    q = np.ones((1, 1, 1, 2))
    k = np.ones((1, 1, 1, 2))
    v = np.array([[[[3.0, -5.0]]]])
    got = B.output_error_bound(
        q, k, v, 4, 0.1, slopes=[1.0], query_positions=[30], key_positions=[0]
    )
    np.testing.assert_array_equal(got, [[[[3.0, 5.0]]]])
    none = B.output_error_bound(
        q, k, v, 4, 0.1, slopes=[1.0], query_positions=[0], key_positions=[1]
    )
    np.testing.assert_array_equal(none, np.zeros((1, 1, 1, 2)))
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1"):
        B.output_error_bound(q, k, v, 0, 0.1)
    with pytest.raises(ValueError, match=r"^delta: must lie in the open interval"):
        B.output_error_bound(q, k, v, 4, 1.0)
    # the scalar arguments are refused before any work on the tensors (a query of the
    # wrong rank would be refused second)
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1"):
        B.output_error_bound(q[0], k, v, 0, 0.1)
    with pytest.raises(ValueError, match=r"^delta: must lie in the open interval"):
        B.output_error_bound(q[0], k, v, 4, 0.0)


def test_spectral_bound_at_a_subnormal_sigma_is_the_limit():
    """``k / sigma`` overflows to inf at ``sigma = 1e-320``: the truncation terms are 0 (they
    were ``(1 + inf) 0 = NaN``, and ``spectral_required_samples`` then reported ``eps`` not
    reached); the bound equals its value at ``sigma = 1e-300``, where the terms underflow to
    0 without overflow."""
    from plsh_ref.bounds import spectral_error_bound, spectral_required_samples

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tiny = spectral_error_bound(4096, 1e-320, 1000, 0.01)
        ref = spectral_error_bound(4096, 1e-300, 1000, 0.01)
        assert math.isfinite(tiny.eps) and tiny == ref
        assert tiny.bias == 0.0 and tiny.truncation_probability == 0.0
        assert spectral_required_samples(4096, 5e-324, 0.1, 0.01) == spectral_required_samples(
            4096, 1e-300, 0.1, 0.01
        )
