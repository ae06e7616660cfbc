"""Theorem 2.1 and 2.2 of Wolfson & Wagner (2026) in explicit, computable form.

The paper states its guarantees with unspecified constants; every constant below is
ours, derived in ``proofs_notes/`` (each function names its note). All probabilities are
over the partition sample and assume its ``s`` samples are **independent** (as drawn by
:func:`plsh_ref.partition.draw_partition` with ``sampler="iid"``) unless a function takes
``sampler=``. For the correlated samplers (``"stratified"``, ``"shared"``;
``proofs_notes/samplers.md``): the max-norm bounds take ``sampler=`` and use Hoeffding
over the ``m`` independent pitch groups (DKW needs iid hashes); the block-size bounds take
``sampler=`` and use that sampler's largest-pitch law; the a-posteriori
:func:`output_error_certificate` holds for any sample; the spectral bounds and
:func:`required_samples` hold for ``"iid"`` only (matrix Bernstein with the one-mask
variance proxy assumes independent masks) and must not be applied to a correlated sample.

* Max norm (``proofs_notes/max_norm_bound.md``): each half-row of ``M~`` is an empirical
  survival function, so Dvoretzky-Kiefer-Wolfowitz with Massart's constant gives
  ``P(max_ij |M~ - L*| > eps) <= 2 (n - 1) exp(-2 s eps^2)``.
* Spectral norm (``proofs_notes/spectral_bound.md``): matrix Bernstein with the exact
  variance proxy ``v = ||E[(M - L*)^2]||``, after truncating the unbounded pitch at ``k``
  (the truncation costs ``P(max_t delta_t > k)`` and a bias term).
* Block size (``proofs_notes/largest_pitch.md``): every block has at most ``k`` tokens
  when every pitch is ``<= k``.
* Attention output (``proofs_notes/output_bound.md``): the row-wise certificate
  ``|T~_ik - T*_ik| <= range_k(V) sum_j A_ij |M~_ij - L*_ij| / sum_j A_ij L*_ij`` for a
  given partition sample and Q/K/V, and its a-priori form through the max-norm bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mpmath
import numpy as np
from numpy.typing import ArrayLike

from .alibi import check_slopes, kernel_matrix, resolve_positions
from .attention import expand_kv, validate_qkv
from .expectation import (
    largest_pitch_sf,
    variance_proxy,
    variance_proxy_limit,
)
from .partition import PartitionSample, check_partition, counts
from .samplers import largest_pitch_sf_of, resolve_group_size
from .toeplitz import kms_spectral_norm_limit
from .validation import (
    check_int,
    check_positive_float,
    check_probability,
    check_scale,
)

if TYPE_CHECKING:
    from .kernels import DistanceKernel

__all__ = [
    "SpectralBound",
    "block_size_bound",
    "block_size_tail_bound",
    "kernel_spectral_error_bound",
    "max_norm_error_bound",
    "max_norm_tail_bound",
    "output_error_bound",
    "output_error_certificate",
    "required_samples",
    "spectral_error_bound",
    "spectral_required_samples",
    "spectral_tail_bound",
]

#: largest ``n`` for which :func:`spectral_error_bound` computes ``v`` exactly (``O(n^3)``)
EXACT_VARIANCE_MAX_N = 1024


# --------------------------------------------------------------------------------------
# Max norm: DKW (Massart)
# --------------------------------------------------------------------------------------


def max_norm_tail_bound(
    n: int, num_samples: int, eps: float, *, sampler: str = "iid", group_size: int | None = None
) -> float:
    """``min(1, 2 (n - 1) exp(-2 s eps^2)) >= P(max_ij |M~_ij - L*_ij| > eps)``.

    Valid for any ``n`` distinct integer positions, bidirectional or causal, and any query
    and key subsets of them. For ``sampler="stratified"`` or ``"shared"`` (``m = s / s'``
    independent groups, each group mean in ``[0, 1]``): Hoeffding per entry and a union
    bound over the ``n (n - 1) / 2`` pairs, ``min(1, n (n - 1) exp(-2 m eps^2))``
    (``proofs_notes/samplers.md``).

    Parameters
    ----------
    n : int
        Number of distinct positions, ``>= 1`` (``n = 1``: ``M~ = L* = 1``, bound 0).
    num_samples : int
        ``s >= 1`` samples.
    eps : float
        Error level in ``(0, 1)``.
    sampler : {"iid", "stratified", "shared"}
        How the sample is drawn (:func:`plsh_ref.partition.draw_partition`).
    group_size : int, optional
        ``s'`` of a correlated sampler (default :func:`plsh_ref.samplers.resolve_group_size`).

    Returns
    -------
    float
        A probability bound in ``[0, 1]``.

    Raises
    ------
    ValueError, TypeError
        ``n < 1``, ``num_samples < 1``, ``eps`` outside ``(0, 1)``, bad ``sampler`` or
        ``group_size``.

    References
    ----------
    Massart (1990), *The tight constant in the DKW inequality*;
    ``proofs_notes/max_norm_bound.md``.
    """
    n = check_int("n", n, minimum=1)
    s = check_int("num_samples", num_samples, minimum=1)
    eps = check_probability("eps", eps)
    groups = _independent_groups(sampler, s, group_size)
    if n == 1:
        return 0.0
    if sampler != "iid":
        return min(1.0, n * (n - 1.0) * math.exp(-2.0 * groups * eps * eps))
    return min(1.0, 2.0 * (n - 1) * math.exp(-2.0 * s * eps * eps))


def _independent_groups(sampler, num_samples: int, group_size) -> int:
    """Number ``m`` of independent pitch groups (``s`` for ``"iid"``); validates."""
    return num_samples // resolve_group_size(sampler, num_samples, group_size)


def max_norm_error_bound(
    n: int, num_samples: int, delta: float, *, sampler: str = "iid", group_size: int | None = None
) -> float:
    """``eps = sqrt(log(2 (n - 1) / delta) / (2 s))``: ``P(max |M~ - L*| > eps) <= delta``.

    For a correlated ``sampler``: ``eps = sqrt(log(n (n - 1) / delta) / (2 m))``, the
    inverse of :func:`max_norm_tail_bound` (Hoeffding over the ``m`` groups).

    Parameters
    ----------
    n : int
        Distinct positions, ``>= 1`` (``n = 1`` gives 0).
    num_samples : int
        ``s >= 1``.
    delta : float
        Failure probability in ``(0, 1)``.
    sampler, group_size
        As :func:`max_norm_tail_bound`.

    Returns
    -------
    float
        ``eps >= 0`` (may exceed 1, then the statement is empty).

    Raises
    ------
    ValueError, TypeError
        ``n < 1``, ``num_samples < 1``, ``delta`` outside ``(0, 1)``, bad ``sampler``.

    References
    ----------
    ``proofs_notes/max_norm_bound.md``; ``proofs_notes/samplers.md``.
    """
    n = check_int("n", n, minimum=1)
    s = check_int("num_samples", num_samples, minimum=1)
    delta = check_probability("delta", delta)
    groups = _independent_groups(sampler, s, group_size)
    if n == 1:
        return 0.0
    if sampler != "iid":
        return math.sqrt(max(0.0, math.log(n * (n - 1.0) / delta)) / (2.0 * groups))
    return math.sqrt(max(0.0, math.log(2.0 * (n - 1) / delta)) / (2.0 * s))


def required_samples(n: int, eps: float, delta: float) -> int:
    """Smallest ``s`` with ``2 (n - 1) exp(-2 s eps^2) <= delta``: ``ceil(log(2 (n-1)/delta) / (2 eps^2))``.

    Parameters
    ----------
    n : int
        Distinct positions, ``>= 1``.
    eps : float
        Target max-norm error in ``(0, 1)``.
    delta : float
        Failure probability in ``(0, 1)``.

    Returns
    -------
    int
        ``s >= 1``.

    Raises
    ------
    ValueError, TypeError
        ``n < 1``, ``eps`` or ``delta`` outside ``(0, 1)``, or ``eps`` so small that the
        answer exceeds ``2**53`` (message starts with ``eps``).

    References
    ----------
    ``proofs_notes/max_norm_bound.md``.
    """
    n = check_int("n", n, minimum=1)
    eps = check_probability("eps", eps)
    delta = check_probability("delta", delta)
    if n == 1:
        return 1
    log_term = math.log(2.0 * (n - 1) / delta)
    # s ~ log_term / (2 eps^2), estimated in log space: eps^2 underflows for eps < 1e-154
    log_s = math.log(log_term) - math.log(2.0) - 2.0 * math.log(eps)
    too_many = (
        f"eps: {eps:g} needs about 1e{log_s / math.log(10.0):.0f} samples, beyond 2**53 where "
        "a sample count is exact in floating point; use a larger eps"
    )
    if log_s > math.log(2.0**53):
        raise ValueError(too_many)
    s = max(1, math.ceil(log_term / (2.0 * eps * eps)))
    if s > 2**40:
        # one sample more changes the tail by a factor exp(-2 eps^2), within binary64
        # rounding of 1 near 2**53 (the loops below were off by a few counts there, and
        # returned 2**53 for an answer of 2**53 + 1): the exact ceiling at 40 digits
        with mpmath.workdps(40):
            t = mpmath.log(2 * (n - 1) / mpmath.mpf(delta)) / (2 * mpmath.mpf(eps) ** 2)
            s = int(mpmath.ceil(t))
        if s > 2**53:
            raise ValueError(too_many)
        return s
    while s > 1 and 2.0 * (n - 1) * math.exp(-2.0 * (s - 1) * eps * eps) <= delta:
        s -= 1  # guard against rounding up one too many
    while 2.0 * (n - 1) * math.exp(-2.0 * s * eps * eps) > delta:
        s += 1
    return s


# --------------------------------------------------------------------------------------
# Block size
# --------------------------------------------------------------------------------------


def block_size_tail_bound(
    b: int, sigma: float, num_samples: int, *, sampler: str = "iid", group_size: int | None = None
) -> float:
    """``P(some block of some of the s masks has more than b tokens) <= P(max_t delta_t > b)``.

    A bin is a half-open interval of length ``delta``, so in exact arithmetic it holds at
    most ``ceil(delta)`` integers; a block of ``b + 1`` tokens needs ``delta > b``. The right
    side is :func:`plsh_ref.expectation.largest_pitch_sf`, exact for independent samples.
    The binary64 bins of :func:`plsh_ref.partition.bins` at positions ``|p| <= P`` hold at
    most ``ceil((1 + 2B) delta)`` tokens, ``B = (P/delta + 1)(2^-52 + 2^-106) + 2^-1075``
    (more than ``ceil(delta)`` is possible near ``2^53``); for them the right side is
    ``largest_pitch_sf(b', sigma, s)`` with ``b' = (b - 2cP) / (1 + 2c + 2^-1074)``,
    ``c = 2^-52 + 2^-106``, a threshold about ``2^-51 (P + b)`` lower
    (``proofs_notes/largest_pitch.md``, section 3). A correlated ``sampler`` uses its own
    largest-pitch law (:func:`plsh_ref.samplers.largest_pitch_sf_of`; for
    ``"stratified"`` ``min(1, m P(delta > b))``): the argument needs no independence.

    Parameters
    ----------
    b : int
        Block size in tokens, ``>= 0``.
    sigma : float
        Length scale, > 0.
    num_samples : int
        ``s >= 1``.
    sampler, group_size
        As :func:`max_norm_tail_bound`.

    Returns
    -------
    float

    Raises
    ------
    ValueError, TypeError
        ``b < 0``, bad ``sigma``, ``num_samples < 1``, bad ``sampler`` or ``group_size``.

    References
    ----------
    ``proofs_notes/largest_pitch.md``; ``proofs_notes/samplers.md``.
    """
    b = check_int("b", b, minimum=0)
    return float(
        largest_pitch_sf_of(float(b), sigma, num_samples, sampler=sampler, group_size=group_size)
    )


def block_size_bound(
    sigma: float,
    num_samples: int,
    delta: float,
    *,
    sampler: str = "iid",
    group_size: int | None = None,
) -> int:
    """Smallest integer ``b`` with :func:`block_size_tail_bound` ``<= delta``.

    With probability ``>= 1 - delta`` every block of the ``s`` masks of one head has at most
    ``b`` tokens (any sequence length). ``b`` is found by bisection on the tail itself (so
    any ``delta`` in ``(0, 1)`` works, also below ``2^-53`` where ``1 - delta`` rounds to 1);
    it is ``ceil(q)`` with ``q`` the ``1 - delta`` quantile of the largest pitch,
    ``b ~ sigma (ln(s/delta) + ln ln(s/delta))``.
    ``sampler``/``group_size`` as :func:`block_size_tail_bound`.

    Raises
    ------
    ValueError, TypeError
        Bad ``sigma``, ``num_samples < 1``, ``delta`` outside ``(0, 1)``, bad ``sampler``.

    References
    ----------
    ``proofs_notes/largest_pitch.md``; ``proofs_notes/samplers.md``.
    """
    sigma = check_positive_float("sigma", sigma)
    s = check_int("num_samples", num_samples, minimum=1)
    delta = check_probability("delta", delta)
    kw: dict[str, Any] = {"sampler": sampler, "group_size": group_size}

    def above(b: int) -> bool:
        return bool(largest_pitch_sf_of(float(b), sigma, s, **kw) > delta)

    # Search on the survival function itself (nonincreasing in b, 0 far out): the
    # ``1 - delta`` quantile cannot be asked for once ``1 - delta`` rounds to 1
    # (``delta`` below about 1.1e-16).
    if not above(0):
        return 0
    lo, hi = 0, max(1, math.ceil(sigma))  # above(lo) holds throughout
    while above(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if above(mid) else (lo, mid)
    return hi


# --------------------------------------------------------------------------------------
# Spectral norm: truncated matrix Bernstein
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpectralBound:
    """A spectral-norm bound ``P(||M~ - L*||_2 > eps) <= probability`` and its ingredients.

    Attributes
    ----------
    eps : float
        The bound on ``||M~ - L*||_2`` (``= bernstein + bias``).
    probability : float
        Failure probability (``truncation_probability + bernstein_probability``).
    num_samples : int
    variance_proxy : float
        ``v`` used for one sample (``>= ||E[(M - L*)^2]||``).
    truncation : int
        Pitch level ``k`` (tokens); ``k >= n`` means no truncation was needed.
    truncation_probability : float
        ``P(max_t delta_t > k)`` (0 when ``k >= n``).
    range_bound : float
        ``R``: bound on ``||M_t - L*||`` on the truncation event, plus the bias.
    bias : float
        Bound on ``||E[(M - L*) 1[delta > k]]||``.
    bernstein : float
        The matrix-Bernstein deviation ``tau``.

    References
    ----------
    ``proofs_notes/spectral_bound.md``, sections 2 (truncation) and 3 (matrix Bernstein and the
    bound).
    """

    eps: float
    probability: float
    num_samples: int
    variance_proxy: float
    truncation: int
    truncation_probability: float
    range_bound: float
    bias: float
    bernstein: float


def _spectral_setup(n: int, sigma: float, variance):
    if variance is None:
        if n <= EXACT_VARIANCE_MAX_N:
            v = variance_proxy(sigma, np.arange(n))
            v = min(v * (1 + 1e-12), variance_proxy_limit(sigma))
        else:
            v = variance_proxy_limit(sigma)
    else:
        # 0 is a valid proxy: for small sigma the limit underflows to 0 (M = I = L* up
        # to rounding), and the Bernstein tail is then set by the range term alone.
        v = check_positive_float("variance", variance, allow_zero=True)
    return v, min(float(n), kms_spectral_norm_limit(sigma))


def _truncation_terms(n: int, sigma: float, s: int, k: int, lnorm: float):
    """(P(trunc fails), bias bound, range bound R) for pitch level k."""
    if k >= n:
        return 0.0, 0.0, max(float(n), lnorm)
    tail = math.exp(-k / sigma)
    if tail == 0.0:  # k / sigma past ~745 (inf at a subnormal sigma): every term is 0,
        p_one = moment = 0.0  # not (1 + inf) 0 = NaN
    else:
        p_one = (1 + k / sigma) * tail  # P(delta > k)
        # E[(delta + 1) 1[delta > k]] for Gamma(2, sigma): e^{-k/s}(k^2/s + 2k + 2s) + P.
        moment = tail * (k * k / sigma + 2 * k + 2 * sigma) + p_one
    bias = min(n * p_one, moment + lnorm * p_one)
    p_trunc = float(largest_pitch_sf(float(k), sigma, s))
    return p_trunc, bias, max(float(k), lnorm)


def _bernstein_tau(n: int, s: int, v: float, r: float, delta: float) -> float:
    # 2n exp(-s tau^2 / (2 (v + r tau / 3))) = delta, solved for tau > 0.
    ell = math.log(2.0 * n / delta)
    a = ell * r / (3.0 * s)
    return a + math.sqrt(a * a + 2.0 * ell * v / s)


def _candidate_levels(n: int, sigma: float, s: int, delta: float):
    # The levels whose tail P(max_t delta_t > k) is just below a fraction of delta, found
    # on the tail itself (a quantile at 1 - frac delta fails once that rounds to 1).
    levels = {n}
    for frac in (0.5, 0.3, 0.1, 0.03, 0.01, 1e-3):
        if frac * delta > 0.0:
            levels.add(max(1, min(n, block_size_bound(sigma, s, frac * delta))))
    return sorted(levels)


def spectral_error_bound(
    n: int, sigma: float, num_samples: int, delta: float, *, variance: float | None = None
) -> SpectralBound:
    """``eps`` with ``P(||M~ - L*||_2 > eps) <= delta`` for aligned positions ``0..n-1``.

    Truncated matrix Bernstein (``proofs_notes/spectral_bound.md``): with ``X_t = M_t - L*``,
    the event ``G = {max_t delta_t <= k}`` of probability ``>= 1 - p_k``, the bias
    ``mu = E[X 1[delta > k]]`` and ``R = max(min(n, k), ||L*||) + ||mu||``,
    ``P(||M~ - L*|| > tau + ||mu||) <= p_k + 2 n exp(-s tau^2 / (2 (v + R tau / 3)))``.
    ``k`` is chosen among a few quantiles of the largest pitch (and ``k = n``, no
    truncation); the best resulting ``eps`` is returned. Independent (``"iid"``) samples
    only: do not apply it to a ``"stratified"`` or ``"shared"`` sample
    (``proofs_notes/samplers.md``).

    Parameters
    ----------
    n : int
        Sequence length (square, bidirectional mask), ``>= 1``.
    sigma : float
        Length scale, > 0.
    num_samples : int
        ``s >= 1`` independent samples.
    delta : float
        Failure probability in ``(0, 1)``.
    variance : float, optional
        Variance proxy ``v >= 0``; default: exact ``||E[(M - L*)^2]||`` for
        ``n <= EXACT_VARIANCE_MAX_N``, else the limit ``1 / (2 sinh^2(1/(2 sigma)))``
        (which underflows to 0 for ``sigma`` below about 0.0014).

    Returns
    -------
    SpectralBound

    Raises
    ------
    ValueError, TypeError
        ``n < 1``, bad ``sigma``, ``num_samples < 1``, ``delta`` outside ``(0, 1)``.

    References
    ----------
    Tropp (2015), *An Introduction to Matrix Concentration Inequalities*, Theorem 6.1.1;
    Wolfson & Wagner (2026), Theorem 2.1 (spectral part); ``proofs_notes/spectral_bound.md``.
    """
    n = check_int("n", n, minimum=1)
    sigma = check_positive_float("sigma", sigma)
    s = check_int("num_samples", num_samples, minimum=1)
    delta = check_probability("delta", delta)
    v, lnorm = _spectral_setup(n, sigma, variance)
    best = None
    for k in _candidate_levels(n, sigma, s, delta):
        p_trunc, bias, r0 = _truncation_terms(n, sigma, s, k, lnorm)
        if p_trunc >= delta:
            continue
        r = r0 + bias
        tau = _bernstein_tau(n, s, v, r, delta - p_trunc)
        cand = SpectralBound(
            eps=tau + bias,
            probability=delta,
            num_samples=s,
            variance_proxy=v,
            truncation=k,
            truncation_probability=p_trunc,
            range_bound=r,
            bias=bias,
            bernstein=tau,
        )
        if best is None or cand.eps < best.eps:
            best = cand
    assert best is not None  # the candidate loop runs at least once
    return best


def kernel_spectral_error_bound(
    n: int, kernel: DistanceKernel, num_samples: int, delta: float
) -> SpectralBound:
    """:func:`spectral_error_bound` for a general Pólya kernel ``k`` (``E[M] = K``).

    The same truncated matrix Bernstein inequality with the kernel's own ingredients
    (``proofs_notes/general_kernels.md``, section 7): the exact proxy
    ``v = ||E[M^2] - K^2||`` (:func:`plsh_ref.kernels.variance_proxy`, ``O(n^3)``),
    ``||K||`` by ``eigvalsh``, ``P(max_t delta_t > k) = 1 - F(k)^s`` and the bias
    ``||mu|| <= min(n P(delta > k), E[(delta + 1) 1[delta > k]] + ||K|| P(delta > k))``, whose
    second term is infinite for a heavy tail without a mean (KERPLE-log, ``r1 <= 1``), where
    the first remains. Levels ``k``: ``n`` (no truncation) and the ``1 - f delta`` quantiles of
    the largest pitch, ``f`` in ``{0.5, 0.3, 0.1, 0.03, 0.01, 0.001}``, clipped to ``1..n``.
    Independent (``"iid"``) samples only.

    Parameters
    ----------
    n : int
        Positions ``0..n-1`` (square, bidirectional), ``1 <= n <= EXACT_VARIANCE_MAX_N``.
    kernel : plsh_ref.kernels.DistanceKernel
    num_samples : int
        ``s >= 1``.
    delta : float
        Failure probability in ``(0, 1)``.

    Returns
    -------
    SpectralBound

    Raises
    ------
    ValueError, TypeError
        ``n`` outside ``1..EXACT_VARIANCE_MAX_N``, bad kernel, ``num_samples < 1``,
        ``delta`` outside ``(0, 1)``.

    References
    ----------
    Tropp (2015), Theorem 6.1.1; ``proofs_notes/general_kernels.md``.
    """
    from .kernels import kernel_matrix, largest_pitch_sf
    from .kernels import variance_proxy as kernel_variance_proxy

    n = check_int("n", n, minimum=1, maximum=EXACT_VARIANCE_MAX_N)
    s = check_int("num_samples", num_samples, minimum=1)
    delta = check_probability("delta", delta)
    v = kernel_variance_proxy(kernel, n) * (1 + 1e-12)
    pos = np.arange(n)
    lnorm = float(np.linalg.eigvalsh(kernel_matrix(kernel, pos, pos))[-1]) * (1 + 1e-12)
    levels = {n}
    for frac in (0.5, 0.3, 0.1, 0.03, 0.01, 1e-3):
        # the one-pitch tail u with 1 - (1 - u)^s = frac delta, from the tail itself: the
        # quantile at 1 - frac delta cannot be asked for once that rounds to 1 (delta below
        # about 1e-13 for frac = 1e-3)
        if frac * delta > 0.0:
            u = -math.expm1(math.log1p(-frac * delta) / s)
            q = float(kernel.pitch_quantile(np.array(1.0 - u), np.array(u)))
            levels.add(int(max(1, min(n, math.ceil(q)))))
    best = None
    for k in sorted(levels):
        if k >= n:
            p_trunc, bias, r0 = 0.0, 0.0, max(float(n), lnorm)
        else:
            p_one = float(kernel.pitch_sf(float(k)))
            moment = kernel.tail_first_moment(float(k)) + p_one
            bias = min(n * p_one, moment + lnorm * p_one)
            p_trunc = float(largest_pitch_sf(kernel, float(k), s))
            r0 = max(float(k), lnorm)
        if p_trunc >= delta:
            continue
        r = r0 + bias
        tau = _bernstein_tau(n, s, v, r, delta - p_trunc)
        cand = SpectralBound(
            eps=tau + bias,
            probability=delta,
            num_samples=s,
            variance_proxy=v,
            truncation=k,
            truncation_probability=p_trunc,
            range_bound=r,
            bias=bias,
            bernstein=tau,
        )
        if best is None or cand.eps < best.eps:
            best = cand
    assert best is not None  # the candidate loop runs at least once
    return best


def spectral_tail_bound(
    n: int, sigma: float, num_samples: int, eps: float, *, variance: float | None = None
) -> float:
    """An upper bound on ``P(||M~ - L*||_2 > eps)`` (aligned positions ``0..n-1``).

    The same truncated Bernstein inequality as :func:`spectral_error_bound`, minimised over
    the truncation level ``k`` on a fixed grid (``k = n`` and 40 levels ``ceil(sigma x)``,
    ``x`` geometric from 0.5 to 200, clipped to ``1..n``). ``eps`` is a spectral-norm
    level > 0 (not limited to ``(0, 1)``). Returns a probability bound in ``[0, 1]``.

    Raises
    ------
    ValueError, TypeError
        ``n < 1``, bad ``sigma``, ``num_samples < 1``, ``eps <= 0``.

    References
    ----------
    ``proofs_notes/spectral_bound.md``.
    """
    n = check_int("n", n, minimum=1)
    sigma = check_positive_float("sigma", sigma)
    s = check_int("num_samples", num_samples, minimum=1)
    eps = check_positive_float("eps", eps)
    v, lnorm = _spectral_setup(n, sigma, variance)
    levels = sorted(
        {n} | {max(1, min(n, math.ceil(sigma * x))) for x in np.geomspace(0.5, 200.0, 40)}
    )
    best = 1.0
    for k in levels:
        p_trunc, bias, r0 = _truncation_terms(n, sigma, s, k, lnorm)
        tau = eps - bias
        if tau <= 0:
            continue
        r = r0 + bias
        tail = 2.0 * n * math.exp(-s * tau * tau / (2.0 * (v + r * tau / 3.0)))
        best = min(best, p_trunc + tail)
    return best


def spectral_required_samples(
    n: int,
    sigma: float,
    eps: float,
    delta: float,
    *,
    variance: float | None = None,
    max_samples: int = 10**9,
) -> int:
    """Smallest ``s`` (found by bisection) with ``spectral_error_bound(n, sigma, s, delta).eps <= eps``.

    Parameters
    ----------
    eps : float
        Target spectral error > 0.
    delta : float
        Failure probability in ``(0, 1)``.
    max_samples : int
        Search limit, ``>= 1``: the answer may be ``max_samples`` itself.

    Returns
    -------
    int

    Raises
    ------
    ValueError, TypeError
        As :func:`spectral_error_bound`; ``eps <= 0``; ``max_samples < 1``; no
        ``s <= max_samples`` suffices (message starts with ``eps``).

    References
    ----------
    ``proofs_notes/spectral_bound.md``.
    """
    n = check_int("n", n, minimum=1)
    sigma = check_positive_float("sigma", sigma)
    eps = check_positive_float("eps", eps)
    delta = check_probability("delta", delta)
    max_samples = check_int("max_samples", max_samples, minimum=1)
    v, _ = _spectral_setup(n, sigma, variance)

    def ok(s):
        return spectral_error_bound(n, sigma, s, delta, variance=v).eps <= eps

    hi = 1
    while not ok(hi):
        if hi >= max_samples:
            raise ValueError(f"eps: not reached with num_samples <= {max_samples}")
        hi = min(2 * hi, max_samples)  # max_samples itself is tried
    lo = hi // 2  # ok(lo) fails: lo <= the previous hi (or lo = 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


# --------------------------------------------------------------------------------------
# Attention output
# --------------------------------------------------------------------------------------


def _scores_and_weights(query, key, value, slopes, causal, scale, query_positions, key_positions):
    """Shifted attention weights A (0 where inadmissible), L*, V expanded, positions."""
    q, k, v = validate_qkv(query, key, value)
    m = check_slopes(slopes, q.shape[1])
    qpos, kpos = resolve_positions(q.shape[2], k.shape[2], query_positions, key_positions)
    c = check_scale(scale, q.shape[3])
    k = expand_kv(k, q.shape[1])
    v = expand_kv(v, q.shape[1])
    logits = c * np.einsum("bhid,bhjd->bhij", q, k)
    admissible = np.ones((qpos.size, kpos.size), dtype=bool)
    if causal:
        admissible = kpos[None, :] <= qpos[:, None]
    logits = np.where(admissible, logits, -np.inf)
    row_max = np.max(logits, axis=-1, keepdims=True, initial=-np.inf)
    a = np.exp(logits - np.where(np.isfinite(row_max), row_max, 0.0))  # A up to a row factor
    lstar = kernel_matrix(1.0 / m, qpos, kpos, causal=causal)  # (H, n_q, n_k)
    return a, lstar, v, admissible, qpos, kpos


def _value_range(v: np.ndarray, admissible: np.ndarray):
    """Per row and column: max - min of v over admissible keys, and max |v| (0 if none)."""
    adm = admissible[None, None, :, :, None]
    vv = v[:, :, None, :, :]
    # initial=: no key at all (n_k = 0) is a row with no admissible key, not a numpy error
    vmax = np.max(np.where(adm, vv, -np.inf), axis=3, initial=-np.inf)
    vmin = np.min(np.where(adm, vv, np.inf), axis=3, initial=np.inf)
    vabs = np.max(np.where(adm, np.abs(vv), 0.0), axis=3, initial=0.0)
    empty = ~np.isfinite(vmax)
    return np.where(empty, 0.0, vmax - vmin), vabs


def output_error_certificate(
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    partition: PartitionSample,
    *,
    slopes: ArrayLike | None = None,
    causal: bool = True,
    scale: float | None = None,
    query_positions: ArrayLike | None = None,
    key_positions: ArrayLike | None = None,
) -> np.ndarray:
    """A-posteriori bound on ``|T~_ik - T*_ik|`` for a given partition sample and Q/K/V.

    Deterministic in the sample, so it holds for every sampler (``partition.sampler``).

    From the exact identity ``T~_i - T*_i = sum_j E_ij (v_j - T~_i) / Z*_i`` with
    ``E = A o (M~ - L*)`` and ``Z*_i = sum_j A_ij L*_ij``::

        |T~_ik - T*_ik| <= range_k(V_i) * sum_j A_ij |M~_ij - L*_ij| / sum_j A_ij L*_ij,

    where ``range_k(V_i)`` is ``max - min`` of ``v_jk`` over the keys admissible for query
    ``i``. A row whose PLSH weights all vanish (``Z~_i = 0``, impossible for aligned
    self-attention) outputs 0 and gets the bound ``max_j |v_jk|``; a row with no
    admissible key gets 0; a row whose ``Z*_i`` underflows to 0 although it has admissible
    keys (every ``A_ij L*_ij`` below the smallest double, keys ~750 / slope away) gets the
    range: both outputs are averages of its values. The version with the signed sum ``|sum_j E_ij|`` is false
    (``tests/ref/test_bounds.py`` exhibits a counterexample).

    Parameters
    ----------
    query, key, value : array_like
        ``(batch, num_heads, n_q, head_dim)``, ``(batch, num_heads_kv, n_k, head_dim)``,
        ``(batch, num_heads_kv, n_k, head_dim_v)``.
    partition : PartitionSample
        ``num_heads`` heads.
    slopes : array_like ``(num_heads,)``, optional
        ALiBi slopes (``sigma = 1 / slope``); default :func:`plsh_ref.alibi.alibi_slopes`.
    causal, scale, query_positions, key_positions
        As :func:`plsh_ref.attention.plsh_attention`.

    Returns
    -------
    numpy.ndarray
        float64, ``(batch, num_heads, n_q, head_dim_v)``; an upper bound on
        ``|plsh_attention - alibi_attention|`` up to float64 rounding of those two.

    Raises
    ------
    TypeError, ValueError
        As :func:`plsh_ref.attention.plsh_attention`.

    References
    ----------
    Wolfson & Wagner (2026), Theorem 2.2; ``proofs_notes/output_bound.md``.
    """
    a, lstar, v, admissible, qpos, kpos = _scores_and_weights(
        query, key, value, slopes, causal, scale, query_positions, key_positions
    )
    partition = check_partition(partition, a.shape[1])
    mt = counts(partition, qpos, kpos, causal=causal) / partition.num_samples
    z_star = np.sum(a * lstar[None], axis=-1)
    z_tilde = np.sum(a * mt[None], axis=-1)
    err = np.sum(a * np.abs(mt - lstar)[None], axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        # Z* = 0 with admissible keys (every A_ij L*_ij underflows): both outputs are still
        # averages of the row's values, so the range bounds their difference
        ratio = np.where(z_star > 0, err / z_star, 1.0)
    vrange, vabs = _value_range(v, admissible)
    bound = vrange * ratio[..., None]
    has_key = np.any(admissible, axis=-1)[None, None, :, None]
    return np.where((z_tilde == 0)[..., None] & has_key, vabs, bound)


def output_error_bound(
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    num_samples: int,
    delta: float,
    *,
    slopes: ArrayLike | None = None,
    causal: bool = True,
    scale: float | None = None,
    query_positions: ArrayLike | None = None,
    key_positions: ArrayLike | None = None,
    sampler: str = "iid",
    group_size: int | None = None,
) -> np.ndarray:
    """A-priori bound: with probability ``>= 1 - delta`` over the partition sample,
    simultaneously for every head, row and column,
    ``|T~_ik - T*_ik| <= range_k(V_i) * eps * sum_j A_ij / sum_j A_ij L*_ij``.

    ``eps = max_norm_error_bound(n, s, delta / num_heads)`` with ``n`` the number of
    distinct query/key positions (DKW with a union bound over heads). The event
    ``max |M~ - L*| <= eps`` does not involve Q/K/V, so the bound holds for all inputs at
    once (the "uniform" form of Theorem 2.2). On the event a row can lose all its PLSH
    weight only if every admissible ``L*_ij <= eps``; such rows get ``max(bound, max_j |v_jk|)``.
    A row whose ``Z*_i`` underflows to 0 gets the range in place of the ratio (as in
    :func:`output_error_certificate`).

    Parameters
    ----------
    query, key, value : array_like
        As :func:`output_error_certificate`.
    num_samples : int
        ``s >= 1`` independent samples per head.
    delta : float
        Failure probability in ``(0, 1)``.
    slopes, causal, scale, query_positions, key_positions
        As :func:`output_error_certificate`.
    sampler, group_size
        How the partition is drawn; passed to :func:`max_norm_error_bound` (Hoeffding over
        pitch groups for a correlated sampler).

    Returns
    -------
    numpy.ndarray
        float64, ``(batch, num_heads, n_q, head_dim_v)``.

    Raises
    ------
    TypeError, ValueError
        As :func:`output_error_certificate`; ``num_samples < 1``; ``delta`` outside (0, 1).

    References
    ----------
    Wolfson & Wagner (2026), Theorem 2.2; ``proofs_notes/output_bound.md``.
    """
    s = check_int("num_samples", num_samples, minimum=1)
    delta = check_probability("delta", delta)
    a, lstar, v, admissible, qpos, kpos = _scores_and_weights(
        query, key, value, slopes, causal, scale, query_positions, key_positions
    )
    n = np.unique(np.concatenate([qpos, kpos])).size
    eps = max_norm_error_bound(n, s, delta / a.shape[1], sampler=sampler, group_size=group_size)
    z_star = np.sum(a * lstar[None], axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        # Z* = 0 with admissible keys: the range, as in output_error_certificate
        ratio = np.where(z_star > 0, eps * np.sum(a, axis=-1) / z_star, 1.0)
    vrange, vabs = _value_range(v, admissible)
    bound = vrange * ratio[..., None]
    # On the event, M~_ij >= L*_ij - eps > 0 wherever L*_ij > eps; a row can vanish (and
    # output 0) only if every admissible L*_ij <= eps. Cover those rows by max |v|.
    lmax = np.max(np.where(admissible[None], lstar, -np.inf), axis=-1, initial=-np.inf)
    can_vanish = (eps >= lmax)[None, :, :, None] & np.isfinite(lmax)[None, :, :, None]
    return np.where(can_vanish, np.maximum(bound, vabs), bound)
