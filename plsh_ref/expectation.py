"""Closed forms for the random-binning construction of one head.

Everything here is a function of the length scale ``sigma`` (tokens) and, where it
matters, of the token positions and the number of samples ``s``; nothing is estimated.
With ``rho = exp(-1 / sigma)``:

* collision probability ``P[bin(x) = bin(y)] = exp(-|x - y| / sigma)`` (closed form and
  mpmath quadrature over the Gamma(2, sigma) pitch), hence ``E[M] = L*``;
* ``Var(M~_ij) = L*_ij (1 - L*_ij) / s`` for independent samples;
* ``E[M^2]`` and ``E[(M - L*)^2]`` in closed form, and the variance proxy
  ``v = ||E[(M - L*)^2]||_2 <= 1 / (2 sinh^2(1 / (2 sigma)))``;
* the block containing a fixed position: geometric extents, size law
  ``k (1 - rho)^2 rho^(k-1)``, mean ``coth(1 / (2 sigma))``;
* the largest pitch over ``s`` samples: tail and quantiles (Lambert W);
* the expected fused window per query ``1 + 2 sum_r [1 - (1 - rho^r)^s]``.

Derivations: ``proofs_notes/expectation.md``, ``proofs_notes/block_laws.md``,
``proofs_notes/largest_pitch.md``, ``proofs_notes/window_width.md``. Source of the
construction: Rahimi & Recht (2007); Wolfson & Wagner (2026), section 2.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
from numpy.typing import ArrayLike
from scipy.special import digamma, gammainc, gammaincinv, lambertw

from .alibi import kernel_matrix
from .validation import (
    as_float_array,
    as_positions,
    check_dps,
    check_int,
    check_positive_float,
    check_probability,
)

__all__ = [
    "block_extent_sf",
    "block_size_mean",
    "block_size_pmf",
    "block_size_sf",
    "collision_probability",
    "collision_probability_mp",
    "expected_error_square",
    "expected_mask",
    "expected_mask_square",
    "expected_reduction_width",
    "expected_window_width",
    "largest_pitch_cdf",
    "largest_pitch_quantile",
    "largest_pitch_sf",
    "mask_variance",
    "pitch_sf",
    "relative_frobenius_error_square",
    "variance_proxy",
    "variance_proxy_limit",
]


def _rho(sigma: float) -> float:
    return math.exp(-1.0 / sigma)


# --------------------------------------------------------------------------------------
# Collision probability, E[M], Var(M~)
# --------------------------------------------------------------------------------------


def collision_probability(distance: ArrayLike, sigma: float) -> float | np.ndarray:
    """Probability that two positions at ``distance`` share a bin: ``exp(-|r| / sigma)``.

    ``P[bin(x) = bin(y)] = E_delta[max(0, 1 - |x - y| / delta)]`` with
    ``delta ~ Gamma(shape=2, scale=sigma)``, which integrates to ``exp(-|x - y| / sigma)``.

    Parameters
    ----------
    distance : float or array_like
        ``r = |x - y|`` in tokens (any real; the absolute value is used).
    sigma : float
        Length scale in tokens, finite and > 0.

    Returns
    -------
    float or numpy.ndarray
        float64, the shape of ``distance``.

    Raises
    ------
    ValueError
        If ``sigma`` is not finite and > 0, or ``distance`` holds NaN/inf.
    TypeError
        If an argument is not real.

    References
    ----------
    ``proofs_notes/expectation.md``; Rahimi & Recht (2007), random binning.
    """
    sigma = check_positive_float("sigma", sigma)
    r = as_float_array("distance", distance)
    out = np.exp(-np.abs(r) / sigma)
    return float(out) if out.ndim == 0 else out


def collision_probability_mp(
    distance: float | mpmath.mpf, sigma: float | mpmath.mpf, *, dps: int = 50
) -> mpmath.mpf:
    """The collision probability by mpmath quadrature over the pitch, at ``dps`` digits.

    Evaluates ``int_r^inf (1 - r / delta) delta exp(-delta / sigma) / sigma^2 d delta``
    (the Gamma(2, sigma) density times the probability ``1 - r / delta`` that a uniform
    offset leaves both points in one bin) with tanh-sinh quadrature, after the
    substitution ``delta = r + sigma u``: ``exp(-r / sigma) int_0^inf u exp(-u) du``, at any
    ``r / sigma`` (mpmath's exponent range holds ``exp(-1e300)``) and any ``sigma``. What it
    checks is the model's integral, reduced by that substitution; the general kernels'
    :func:`plsh_ref.kernels.collision_probability_mp` integrates a kernel's pitch density
    as it is. The inputs are taken
    as the exact binary64 values they hold (or as given if already ``mpmath.mpf``).
    mpmath's global precision is restored on exit, also on error.

    Parameters
    ----------
    distance : float or mpmath.mpf
        ``r >= 0`` in tokens (the absolute value is used).
    sigma : float or mpmath.mpf
        Length scale in tokens, > 0.
    dps : int
        Working precision in decimal digits, ``>= 15``.

    Returns
    -------
    mpmath.mpf
        The integral, correct to about ``dps - 5`` digits (checked against
        ``exp(-r / sigma)`` to 40 digits at ``dps = 50`` in ``tests/ref/test_expectation.py``).

    Raises
    ------
    ValueError
        If ``sigma <= 0``, a value is not finite, or ``dps < 15``.
    TypeError
        If ``dps`` is not an integer or the values are not real.

    References
    ----------
    ``proofs_notes/expectation.md``.
    """
    dps = check_dps(dps)
    with mpmath.workdps(dps + 10):
        r = abs(_to_mpf("distance", distance))
        s = _to_mpf("sigma", sigma)
        if s <= 0:
            raise ValueError(f"sigma: must be finite and > 0, got {sigma}")

        def integrand(u):  # delta = r + sigma u, without the factor exp(-r / sigma)
            return u * mpmath.exp(-u)

        # In u the break points stay apart at any r / sigma (in delta, r + sigma rounds to
        # r once r / sigma passes 10^(dps + 10), and the quadrature divided by zero), and
        # exp(-delta / sigma) = exp(-r / sigma) exp(-u) keeps u's digits, which r + sigma u
        # would drop; mpmath's map of [a, inf) is not scale-free (in t = delta - r the
        # last interval lost 8 digits at sigma <= 1e-30), u is. mpmath.quad stops on an
        # absolute error estimate: the integrand divided by its value at its mode u = 1 is
        # of size 1, so the stopping rule is relative.
        scale = integrand(1)
        points = [0, mpmath.mpf(1) / 4, 1, 4, 16, 64, mpmath.inf]
        # exp(-x) to p bits needs x to p bits after its binary point: mag(x) more bits
        with mpmath.workprec(mpmath.mp.prec + max(0, mpmath.mag(r) - mpmath.mag(s))):
            factor = mpmath.exp(-r / s)
        value = factor * scale * mpmath.quad(lambda u: integrand(u) / scale, points)
    with mpmath.workdps(dps):
        return +value


def _to_mpf(name: str, value):
    if isinstance(value, mpmath.mpf):
        out = value
    else:
        if isinstance(value, (bool, np.bool_)) or not isinstance(
            value, (int, float, np.integer, np.floating)
        ):
            raise TypeError(f"{name}: must be a real number, got {type(value).__name__}")
        out = (
            mpmath.mpf(float(value))
            if not isinstance(value, (int, np.integer))
            else mpmath.mpf(int(value))
        )
    if not mpmath.isfinite(out):
        raise ValueError(f"{name}: must be finite, got {value}")
    return out


def expected_mask(
    sigma: ArrayLike, query_positions: ArrayLike, key_positions: ArrayLike, *, causal: bool = False
) -> np.ndarray:
    """``E[M(h)] = L*``: the kernel matrix ``exp(-|p_i - p_j| / sigma)`` (times the causal mask).

    The expectation of one mask equals the kernel matrix exactly because each entry is
    the collision probability (:func:`collision_probability`); this delegates to
    :func:`plsh_ref.alibi.kernel_matrix`. Shapes, dtypes and errors as there.

    References
    ----------
    Wolfson & Wagner (2026), section 2; ``proofs_notes/expectation.md``.
    """
    return kernel_matrix(sigma, query_positions, key_positions, causal=causal)


def mask_variance(
    sigma: ArrayLike,
    query_positions: ArrayLike,
    key_positions: ArrayLike,
    num_samples: int,
    *,
    causal: bool = False,
) -> np.ndarray:
    """``Var(M~_ij) = L*_ij (1 - L*_ij) / s`` for ``s`` independent samples.

    Each ``M(h_t)_ij`` is Bernoulli(``L*_ij``); the mean of ``s`` independent copies has
    this variance. Correlated samplers (SPEC section 2) have a different (smaller) one.

    Parameters
    ----------
    sigma : float or array_like ``(num_heads,)``
        Length scale(s) in tokens, > 0.
    query_positions, key_positions : array_like of int, ``(n_q,)``, ``(n_k,)``
    num_samples : int
        ``s >= 1``.
    causal : bool
        Zero above the causal boundary (there ``M~ = 0`` deterministically).

    Returns
    -------
    numpy.ndarray
        float64, ``(n_q, n_k)`` or ``(num_heads, n_q, n_k)`` as :func:`expected_mask`.

    Raises
    ------
    ValueError, TypeError
        On bad ``sigma``, positions, or ``num_samples < 1``.

    References
    ----------
    ``proofs_notes/expectation.md``.
    """
    s = check_int("num_samples", num_samples, minimum=1)
    lstar = kernel_matrix(sigma, query_positions, key_positions, causal=causal)
    return lstar * (1.0 - lstar) / s


def relative_frobenius_error_square(
    sigma: float, n: int, num_samples: int, *, causal: bool = False
) -> float:
    """``E||M~ - L*||_F^2 / ||L*||_F^2 = sum L*(1 - L*) / (s sum L*^2)`` (positions ``0..n-1``).

    As ``n -> inf`` this tends to ``sech(1 / sigma) / s`` (bidirectional) and to
    ``exp(-1 / sigma) / s`` (causal): about ``1/s`` only when ``sigma`` is large
    (``sech(1) = 0.65``, ``exp(-1) = 0.37`` at ``sigma = 1``).

    Parameters
    ----------
    sigma : float
        > 0.
    n : int
        ``>= 1``.
    num_samples : int
        ``s >= 1`` independent samples.
    causal : bool

    Returns
    -------
    float

    Raises
    ------
    ValueError, TypeError
        Bad ``sigma``, ``n < 1``, ``num_samples < 1``.

    References
    ----------
    ``proofs_notes/expectation.md``.
    """
    sigma = check_positive_float("sigma", sigma)
    n = check_int("n", n, minimum=1)
    s = check_int("num_samples", num_samples, minimum=1)
    pos = np.arange(n)
    lstar = kernel_matrix(sigma, pos, pos, causal=causal)
    return float(np.sum(lstar * (1.0 - lstar)) / (s * np.sum(lstar**2)))


# --------------------------------------------------------------------------------------
# Second moments: E[M^2], E[(M - L*)^2], variance proxy
# --------------------------------------------------------------------------------------


def expected_mask_square(sigma: float, positions: ArrayLike) -> np.ndarray:
    """``E[M^2]`` for the square mask on ``positions`` (closed form, ``O(n^2)``).

    ``(M^2)_ij = 1[i ~ j] |block(i)|``, so ``E[M^2]_ij = sum_k P[i, j, k share a bin]`` and
    a set of points shares a bin with probability ``exp(-span / sigma)`` (bins are
    intervals). For positions sorted so that ``i <= j``::

        E[M^2]_ij = exp(-(p_j - p_i) / sigma) * ((j - i + 1) + left_i + right_j),
        left_i  = sum_{k < i} exp(-(p_i - p_k) / sigma),
        right_j = sum_{k > j} exp(-(p_k - p_j) / sigma).

    For ``positions = 0..n-1``: ``rho^r (r + 1 + rho (2 - rho^i - rho^(n-1-j)) / (1 - rho))``.

    Parameters
    ----------
    sigma : float
        Length scale in tokens, > 0.
    positions : array_like of int, shape ``(n,)``
        Token positions (any order; repeats allowed), ``n >= 1``.

    Returns
    -------
    numpy.ndarray
        float64, shape ``(n, n)``, symmetric, in the order of ``positions``.

    Raises
    ------
    ValueError, TypeError
        If ``sigma`` is not finite and > 0, or positions are not 1-D integers with ``n >= 1``.

    References
    ----------
    ``proofs_notes/spectral_bound.md`` (second moment).
    """
    sigma = check_positive_float("sigma", sigma)
    p = as_positions("positions", positions)
    n = p.shape[0]
    if n < 1:
        raise ValueError("positions: needs at least one position (n >= 1)")
    order = np.argsort(p, kind="stable")
    ps = p[order].astype(np.float64)
    step = np.exp(-np.diff(ps) / sigma)  # exp(-(p_{k+1} - p_k) / sigma)
    left = np.zeros(n)
    right = np.zeros(n)
    for k in range(1, n):  # left_k = (left_{k-1} + 1) step_{k-1}
        left[k] = (left[k - 1] + 1.0) * step[k - 1]
    for k in range(n - 2, -1, -1):
        right[k] = (right[k + 1] + 1.0) * step[k]
    idx = np.arange(n)
    lo = np.minimum(idx[:, None], idx[None, :])
    hi = np.maximum(idx[:, None], idx[None, :])
    span = ps[hi] - ps[lo]
    sorted_out = np.exp(-span / sigma) * ((hi - lo + 1) + left[lo] + right[hi])
    out = np.empty_like(sorted_out)
    out[np.ix_(order, order)] = sorted_out
    return out


def expected_error_square(sigma: float, positions: ArrayLike) -> np.ndarray:
    """``E[(M - L*)^2] = E[M^2] - L*^2`` for one mask on ``positions``.

    Entrywise non-negative and at most ``csch(1 / sigma) L*`` (equality on the infinite
    line). Arguments, shape and errors as :func:`expected_mask_square`.

    References
    ----------
    ``proofs_notes/spectral_bound.md``.
    """
    m2 = expected_mask_square(sigma, positions)
    p = as_positions("positions", positions)
    lstar = kernel_matrix(sigma, p, p)
    return m2 - lstar @ lstar


def variance_proxy(sigma: float, positions: ArrayLike) -> float:
    """The matrix-Bernstein variance proxy ``v = ||E[(M - L*)^2]||_2`` (one sample).

    Computed with ``numpy.linalg.eigvalsh`` from :func:`expected_error_square`
    (``O(n^3)``; use :func:`variance_proxy_limit` for an ``n``-free upper bound).

    Returns
    -------
    float
        ``v >= 0``; ``v <= variance_proxy_limit(sigma)`` for distinct positions.

    Raises
    ------
    ValueError, TypeError
        As :func:`expected_mask_square`.

    References
    ----------
    ``proofs_notes/spectral_bound.md``; Tropp (2015), Theorem 6.1.1.
    """
    e2 = expected_error_square(sigma, positions)
    return float(np.max(np.abs(np.linalg.eigvalsh(e2))))


def variance_proxy_limit(sigma: float) -> float:
    """``1 / (2 sinh^2(1 / (2 sigma))) = csch(1/sigma) coth(1/(2 sigma))``.

    The supremum over ``n`` (and any set of distinct integer positions) of
    :func:`variance_proxy`; about ``2 sigma^2`` for large ``sigma``, ``inf`` once that
    exceeds the float64 range (``sigma`` above about ``1.3e154``); 0 once it underflows
    (``sigma`` below about ``1.4e-3``).

    Raises
    ------
    ValueError, TypeError
        If ``sigma`` is not finite and > 0.

    References
    ----------
    ``proofs_notes/spectral_bound.md``.
    """
    sigma = check_positive_float("sigma", sigma)
    # 1 / (2 sinh^2(x)) with x = 1/(2 sigma), written as 2 rho t^2 with rho = e^(-2x) and
    # t = sigma / u, u = sigma (rho - 1) in [-1, 0): no overflow of sinh for tiny sigma (the
    # value underflows to 0), no cancellation in 1 - rho for large sigma (expm1), and no
    # underflow of (1 - rho)^2 to 0 for huge sigma (it was a ZeroDivisionError from about
    # sigma = 1e154: the value overflows to inf there instead).
    rho = math.exp(-1.0 / sigma)
    t = sigma / (sigma * math.expm1(-1.0 / sigma))  # float products overflow to inf, ** raises
    return 2.0 * rho * t * t


# --------------------------------------------------------------------------------------
# The block containing a fixed position
# --------------------------------------------------------------------------------------


def _as_int_array(name: str, value, minimum: int) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name}: must hold integers, got dtype {arr.dtype}")
    if np.any(arr < minimum):
        raise ValueError(f"{name}: every entry must be >= {minimum}")
    return arr.astype(np.int64)


def _scalar_or_array(x: np.ndarray):
    return float(x) if x.ndim == 0 else x


def block_extent_sf(b: ArrayLike, sigma: float) -> float | np.ndarray:
    """``P(R >= b) = rho^b``: tail of the right (or left) extent of the block of a position.

    ``R`` is the number of positions to the right of a fixed position in its block
    (infinite line of integers). ``R`` and the left extent are independent geometric
    variables on ``{0, 1, ...}``.

    Parameters
    ----------
    b : int or array_like of int
        ``b >= 0`` tokens.
    sigma : float
        Length scale, > 0.

    Returns
    -------
    float or numpy.ndarray
        float64, shape of ``b``.

    Raises
    ------
    ValueError, TypeError
        If ``b`` is not a non-negative integer, or ``sigma`` not finite and > 0.

    References
    ----------
    ``proofs_notes/block_laws.md``.
    """
    sigma = check_positive_float("sigma", sigma)
    b = _as_int_array("b", b, 0)
    return _scalar_or_array(np.exp(-b / sigma))


def block_size_pmf(k: ArrayLike, sigma: float) -> float | np.ndarray:
    """``P(K = k) = k (1 - rho)^2 rho^(k-1)``: size of the block containing a fixed position.

    ``K = L + R + 1`` with independent geometric extents; the size-biased version of the
    (geometric) law of a typical block.

    Parameters
    ----------
    k : int or array_like of int
        ``k >= 1`` tokens.
    sigma : float
        Length scale, > 0.

    Returns
    -------
    float or numpy.ndarray
        float64, shape of ``k``.

    Raises
    ------
    ValueError, TypeError
        If ``k < 1`` or not integer, or ``sigma`` not finite and > 0.

    References
    ----------
    ``proofs_notes/block_laws.md``.
    """
    sigma = check_positive_float("sigma", sigma)
    k = _as_int_array("k", k, 1)
    one_minus_rho = -math.expm1(-1.0 / sigma)
    return _scalar_or_array(k * one_minus_rho**2 * np.exp(-(k - 1) / sigma))


def block_size_sf(k: ArrayLike, sigma: float) -> float | np.ndarray:
    """``P(K >= k) = rho^(k-1) (k (1 - rho) + rho)`` for the block containing a position.

    Arguments, returns and errors as :func:`block_size_pmf`.

    References
    ----------
    ``proofs_notes/block_laws.md``.
    """
    sigma = check_positive_float("sigma", sigma)
    k = _as_int_array("k", k, 1)
    rho = _rho(sigma)
    return _scalar_or_array(np.exp(-(k - 1) / sigma) * (k * -math.expm1(-1.0 / sigma) + rho))


def block_size_mean(sigma: float) -> float:
    """``E[K] = (1 + rho) / (1 - rho) = coth(1 / (2 sigma))`` (about ``2 sigma``, not ``3 sigma``).

    Raises
    ------
    ValueError, TypeError
        If ``sigma`` is not finite and > 0.

    References
    ----------
    ``proofs_notes/block_laws.md``.
    """
    sigma = check_positive_float("sigma", sigma)
    return 1.0 / math.tanh(0.5 / sigma)


# --------------------------------------------------------------------------------------
# Largest pitch over s samples
# --------------------------------------------------------------------------------------


def pitch_sf(b: ArrayLike, sigma: float) -> float | np.ndarray:
    """``P(delta > b) = (1 + b / sigma) exp(-b / sigma)`` for ``delta ~ Gamma(2, sigma)``.

    Parameters
    ----------
    b : float or array_like
        ``b >= 0`` tokens.
    sigma : float
        Length scale, > 0.

    Returns
    -------
    float or numpy.ndarray
        In ``[0, 1]``; 0 where ``b / sigma`` overflows float64 (was NaN).

    Raises
    ------
    ValueError, TypeError
        If ``b`` is negative or not finite, or ``sigma`` not finite and > 0.

    References
    ----------
    ``proofs_notes/largest_pitch.md``.
    """
    sigma = check_positive_float("sigma", sigma)
    b = as_float_array("b", b)
    if np.any(b < 0):
        raise ValueError("b: every entry must be >= 0")
    with np.errstate(over="ignore", invalid="ignore"):
        x = b / sigma  # inf once b / sigma overflows (a tiny sigma): the tail is 0 there
        tail = np.where(np.isinf(x), 0.0, (1.0 + x) * np.exp(-x))  # (1 + inf) 0 is NaN
    return _scalar_or_array(tail)


def largest_pitch_sf(b: ArrayLike, sigma: float, num_samples: int) -> float | np.ndarray:
    """``P(max_t delta_t > b) = 1 - (1 - (1 + b/sigma) e^(-b/sigma))^s`` (independent samples).

    Computed as ``-expm1(s log1p(-pitch_sf))`` so that tiny tails keep their digits.

    Parameters
    ----------
    b : float or array_like
        ``b >= 0`` tokens.
    sigma : float
        Length scale, > 0.
    num_samples : int
        ``s >= 1``.

    Returns
    -------
    float or numpy.ndarray

    Raises
    ------
    ValueError, TypeError
        On negative ``b``, bad ``sigma`` or ``num_samples < 1``.

    References
    ----------
    ``proofs_notes/largest_pitch.md``.
    """
    s = check_int("num_samples", num_samples, minimum=1)
    tail = np.asarray(pitch_sf(b, sigma))
    with np.errstate(divide="ignore"):
        out = -np.expm1(s * np.log1p(-tail))
    return _scalar_or_array(out)


def largest_pitch_cdf(b: ArrayLike, sigma: float, num_samples: int) -> float | np.ndarray:
    """``P(max_t delta_t <= b) = (1 - (1 + b/sigma) e^(-b/sigma))^s`` (``b`` in tokens).

    Arguments, shapes and errors as :func:`largest_pitch_sf` (``num_samples < 1``, sigma
    not finite and > 0).

    References
    ----------
    ``proofs_notes/largest_pitch.md``.
    """
    s = check_int("num_samples", num_samples, minimum=1)
    tail = np.asarray(pitch_sf(b, sigma))
    # One-sample CDF 1 - (1 + x) e^-x: from the tail it cancels for small x (about x^2/2
    # is left, with an absolute error of one ulp of 1); the regularised incomplete gamma
    # P(2, x) keeps its relative accuracy there.
    with np.errstate(over="ignore"):  # b / sigma = inf: gammainc gives 1, the CDF's limit
        head = gammainc(2.0, np.asarray(b, dtype=np.float64) / check_positive_float("sigma", sigma))
    with np.errstate(divide="ignore"):
        out = np.where(tail < 0.5, np.exp(s * np.log1p(-tail)), np.exp(s * np.log(head)))
    return _scalar_or_array(out)


def largest_pitch_quantile(q: float, sigma: float, num_samples: int) -> float:
    """The ``q``-quantile of the largest of ``s`` independent Gamma(2, sigma) pitches.

    Solves ``(1 + x) e^(-x) = t`` with ``t = 1 - q^(1/s)`` and ``x = b / sigma``:
    ``x = -1 - W_{-1}(-t / e)`` (lower real branch of Lambert W) when ``q^(1/s) > 1/2``;
    below, where ``-t / e`` is within rounding of the branch point ``-1/e``, ``x`` is the
    inverse of the Gamma(2, 1) CDF ``1 - (1 + x) e^(-x)`` at ``q^(1/s)``
    (``scipy.special.gammaincinv``), which keeps full relative precision down to the
    smallest ``q``.

    Parameters
    ----------
    q : float
        Probability in ``(0, 1)``.
    sigma : float
        Length scale, > 0.
    num_samples : int
        ``s >= 1``.

    Returns
    -------
    float
        ``b >= 0`` tokens with ``P(max_t delta_t <= b) = q``.

    Raises
    ------
    ValueError, TypeError
        If ``q`` is not in ``(0, 1)``, ``sigma`` is bad or ``num_samples < 1``.

    References
    ----------
    ``proofs_notes/largest_pitch.md``; Corless et al. (1996) for Lambert W.
    """
    q = check_probability("q", q)
    sigma = check_positive_float("sigma", sigma)
    s = check_int("num_samples", num_samples, minimum=1)
    u = math.exp(math.log(q) / s)  # single-pitch CDF: P(delta <= b) = q^(1/s)
    if u <= 0.5:
        # t = 1 - u rounds towards 1 and -t/e onto the branch point, where W_{-1} loses
        # every digit (NaN below u ~ 1e-17); the Gamma(2) CDF's inverse keeps them
        x = float(gammaincinv(2.0, u))
    else:
        t = -math.expm1(math.log(q) / s)  # single-pitch tail probability
        x = -1.0 - float(lambertw(-t / math.e, k=-1).real)
    return sigma * max(x, 0.0)


# --------------------------------------------------------------------------------------
# Expected fused window width per query
# --------------------------------------------------------------------------------------


#: sigma from which the infinite-line sum of :func:`expected_window_width` is taken in
#: closed form (Euler-Maclaurin, ``proofs_notes/window_width.md`` section 2a) instead of
#: term by term: below it the direct sum has at most ``1000 (ln s + 42)`` terms, above it
#: the closed form's remainder is below ``0.127 sigma^-5 <= 1.3e-16``
EULER_MACLAURIN_SIGMA = 1000.0

#: ``(-1)^s s! S(m, s)`` (``S``: Stirling numbers of the second kind) for odd ``m = 1, 3, 5``
#: and ``s = 1..5``: ``sigma^m`` times the ``m``-th derivative at 0 of
#: ``r -> 1 - (1 - e^(-r/sigma))^s``, which vanishes for ``s > m``
_ODD_DERIVATIVES_AT_0 = {
    1: (-1.0, 0.0, 0.0, 0.0, 0.0),
    3: (-1.0, 6.0, -6.0, 0.0, 0.0),
    5: (-1.0, 30.0, -150.0, 240.0, -120.0),
}

#: ``B_2 / 2!``, ``B_4 / 4!``, ``B_6 / 6!`` (Bernoulli numbers)
_BERNOULLI_OVER_FACTORIAL = {1: 1.0 / 12.0, 3: -1.0 / 720.0, 5: 1.0 / 30240.0}


def _max_extent_terms(sigma: float, s: int, limit: int) -> np.ndarray:
    """``P(max_t R_t >= r) = 1 - (1 - rho^r)^s`` for ``r = 1..limit``, float64."""
    r = np.arange(1, limit + 1, dtype=np.float64)
    # r / sigma = inf at a subnormal sigma (the term is 0); rho^r = 1 at a huge one (log1p(-1)
    # = -inf, the term is 1)
    with np.errstate(over="ignore", divide="ignore"):
        return -np.expm1(s * np.log1p(-np.exp(-r / sigma)))


def _max_extent_tail_sum(sigma: float, s: int, limit: int) -> np.ndarray:
    """Cumulative sums ``c[m] = sum_{r=1}^{m} [1 - (1 - rho^r)^s]`` for ``m = 0..limit``."""
    return np.concatenate([[0.0], np.cumsum(_max_extent_terms(sigma, s, limit))])


def _max_extent_mean_direct(sigma: float, s: int) -> float:
    """``sum_{r >= 1} [1 - (1 - rho^r)^s]`` term by term (``sigma < 1000``), correctly
    rounded sum (``math.fsum``) of the terms down to ``s rho^r < 1e-18``."""
    limit = int(math.ceil(sigma * (math.log(s) + 18 * math.log(10)))) + 1
    return math.fsum(_max_extent_terms(sigma, s, limit))


def _max_extent_mean_euler_maclaurin(sigma: float, s: int) -> float:
    """``sum_{r >= 1} [1 - (1 - rho^r)^s]`` in closed form (``sigma >= 1000``).

    Euler-Maclaurin to the sixth derivative: ``sigma H_s - 1/2 - sum_k B_2k / (2k)!
    f^(2k-1)(0)``, the corrections nonzero only for ``s <= 5``; the remainder is at most
    ``0.127 sigma^-5`` (``proofs_notes/window_width.md`` section 2a).
    """
    harmonic = float(digamma(s + 1.0)) + float(np.euler_gamma)
    total = sigma * harmonic - 0.5
    if s <= 5:
        for m, b in _BERNOULLI_OVER_FACTORIAL.items():
            total -= b * _ODD_DERIVATIVES_AT_0[m][s - 1] * (1.0 / sigma) ** m  # no overflow
    return total


def expected_window_width(
    sigma: float, num_samples: int, n: int | None = None, *, causal: bool = False
) -> float | np.ndarray:
    """Expected number of keys with a nonzero count ``C_ij`` for a query (fused window).

    The keys with ``C_ij > 0`` are the union of the ``s`` blocks containing the query, an
    interval, so its width is ``1 + max_t L_t + max_t R_t`` with ``P(max_t R_t >= r) =
    1 - (1 - rho^r)^s`` (independent samples). On the infinite line::

        E[width] = 1 + 2 sum_{r >= 1} [1 - (1 - rho^r)^s]  ~  2 sigma (ln s + 0.5772) + 1,

    (``1 + sum`` when causal). For aligned positions ``0..n-1`` the sums stop at the ends.
    The line's sum is taken term by term below ``sigma = EULER_MACLAURIN_SIGMA`` (1000; at
    most ``1000 (ln s + 42)`` terms) and in closed form from there (Euler-Maclaurin,
    absolute error at most ``0.127 sigma^-5``): its time and memory do not grow with
    ``sigma``. The finite-``n`` sums have ``n - 1`` terms.

    Parameters
    ----------
    sigma : float
        Length scale, > 0.
    num_samples : int
        ``s >= 1`` independent samples.
    n : int, optional
        Sequence length (positions ``0..n-1``). ``None``: infinite line.
    causal : bool
        Count only keys ``p_j <= p_i``.

    Returns
    -------
    float or numpy.ndarray
        A float for the infinite line, else float64 ``(n,)`` (one value per query).

    Raises
    ------
    ValueError, TypeError
        Bad ``sigma``, ``num_samples < 1`` or ``n < 1``.

    References
    ----------
    ``proofs_notes/window_width.md`` (sections 2 and 2a).
    """
    sigma = check_positive_float("sigma", sigma)
    s = check_int("num_samples", num_samples, minimum=1)
    sides = 1 if causal else 2
    if n is None:
        if sigma >= EULER_MACLAURIN_SIGMA:
            return 1.0 + sides * _max_extent_mean_euler_maclaurin(sigma, s)
        return 1.0 + sides * _max_extent_mean_direct(sigma, s)
    n = check_int("n", n, minimum=1)
    c = _max_extent_tail_sum(sigma, s, n - 1)
    i = np.arange(n)
    left = c[i]
    right = 0.0 if causal else c[n - 1 - i]
    return 1.0 + left + right


def expected_reduction_width(sigma: float, num_samples: int) -> float:
    """Expected keys per query in the paper's reduction: ``s coth(1 / (2 sigma))``.

    Each of the ``s`` block passes attends to the whole block containing the query, whose
    mean size is :func:`block_size_mean` (infinite line); about ``2 sigma s``.

    Raises
    ------
    ValueError, TypeError
        Bad ``sigma`` or ``num_samples < 1``.

    References
    ----------
    ``proofs_notes/window_width.md``.
    """
    s = check_int("num_samples", num_samples, minimum=1)
    return s * block_size_mean(sigma)
