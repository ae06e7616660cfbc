"""Partition samplers: exact variance, Frobenius error, largest pitch and window of each.

:func:`plsh_ref.partition.draw_partition` offers three ways of drawing the ``s`` hashes of
one head (``sampler=``); all keep the ``(pitch, offset)`` representation (SPEC section 2),
so every downstream function is unchanged. With ``s = m s'`` (``m`` pitch groups of
``s'`` hashes each, ``s'`` the ``group_size``) and ``F`` the Gamma(2, sigma) law:

* ``"iid"`` (the paper): ``s`` independent pitches ``delta_t ~ F``, offsets
  ``u_t ~ U[0, delta_t)``.
* ``"stratified"``: ``m`` independent pitches at stratified quantiles
  ``delta_k = F^-1((k + U_k) / m)``, ``U_k ~ U[0, 1)``, ``k = 0..m-1``; each shared by
  ``s'`` systematically spaced offsets ``(u_k + j delta_k / s') mod delta_k``,
  ``j = 0..s'-1``, ``u_k ~ U[0, delta_k)``; the groups are stored in a random order.
* ``"shared"``: as ``"stratified"`` with ``m`` *independent* pitches ``delta_k ~ F``
  (no stratification). A counterexample kept for the tests and the notes: it is never
  better than ``"iid"`` (``s' = 2``, antithetic offsets, is exactly as good; ``s' >= 3``
  is worse).

Every single hash of every sampler is marginally a paper hash (pitch ~ F, offset uniform),
so ``E[M~] = L*`` for any subset of the hashes; only the dependence between hashes differs.
For two positions at distance ``r`` and ``G_k(x) = m int_{stratum k} (1 - x/delta)_+ dF``
(the collision probability at distance ``x`` given the pitch lies in stratum ``k``;
``m = 1`` and the whole line for ``"shared"``), the group mean ``A_k`` of ``s'`` hashes has

    ``E[A_k^2] = (1/s') [G_k(r) + 2 sum_{j=1}^{s'-1} (j/s') G_k(r s'/j)]``

and ``Var(M~_ij) = (1/m^2) sum_k (E[A_k^2] - G_k(r)^2)``, in closed form (exponentials
only). Derivations, continuum limits and counterexamples: ``proofs_notes/samplers.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import gammainccinv, gammaincinv

from .expectation import expected_window_width, largest_pitch_quantile, largest_pitch_sf
from .validation import as_float_array, check_bool, check_int, check_positive_float

__all__ = [
    "MAX_WINDOW_TERMS",
    "SAMPLERS",
    "check_sampler",
    "default_group_size",
    "entry_variance",
    "frobenius_error_square",
    "gamma2_quantile",
    "group_moments",
    "largest_pitch_quantile_of",
    "largest_pitch_sf_of",
    "optimal_group_size",
    "resolve_group_size",
    "stratified_pitch",
    "stratum_edges",
    "variance_split",
    "window_width",
]

#: the sampler names accepted by :func:`plsh_ref.partition.draw_partition`
SAMPLERS = ("iid", "stratified", "shared")


# --------------------------------------------------------------------------------------
# Validation and the group-size rule
# --------------------------------------------------------------------------------------


def check_sampler(sampler: object) -> str:
    """Return ``sampler`` if it is one of :data:`SAMPLERS`, else raise.

    Raises
    ------
    TypeError
        If ``sampler`` is not a str.
    ValueError
        If it is not ``"iid"``, ``"stratified"`` or ``"shared"``.

    References
    ----------
    ``proofs_notes/samplers.md``, section 1 (the samplers); ``docs/samplers.md``.
    """
    if not isinstance(sampler, str):
        raise TypeError(f"sampler: must be a str, got {type(sampler).__name__}")
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler: must be one of {SAMPLERS}, got {sampler!r}")
    return sampler


def default_group_size(num_samples: int) -> int:
    """The group size ``s'`` used when none is given: the divisor of ``s`` nearest ``0.6 sqrt(s)``.

    Nearest in log scale, ties to the smaller divisor: ``s' = 1, 2, 4, 8, 16`` for
    ``s = 4, 16, 64, 256, 1024``. Over ``s = 2..64`` and ``s`` in {96, 100, 128, 200, 256,
    384, 512}, ``sigma`` in {4, 64} and ``n = 512`` this choice has an
    ``E||M~ - L*||_F^2`` within 0.5% of the best divisor on average and 18% at worst
    (``s = 4``, where ``s' = 2`` is better); :func:`optimal_group_size` finds the best one
    for a given ``(sigma, n)``. A prime ``s`` gets ``s' = 1`` (stratification alone).

    Parameters
    ----------
    num_samples : int
        ``s >= 1``.

    Returns
    -------
    int
        A divisor of ``s``.

    Raises
    ------
    TypeError, ValueError
        ``num_samples`` not an integer ``>= 1``.

    References
    ----------
    ``proofs_notes/samplers.md`` (the rule and its measurement).
    """
    s = check_int("num_samples", num_samples, minimum=1)
    target = 0.6 * math.sqrt(s)
    divisors = [d for d in range(1, s + 1) if s % d == 0]
    return min(divisors, key=lambda d: (abs(math.log(d / target)), d))


def resolve_group_size(sampler: str, num_samples: int, group_size: int | None = None) -> int:
    """The group size ``s'`` of ``sampler`` for ``s`` samples (validated).

    ``"iid"`` has ``s' = 1`` (``group_size`` must be ``None`` or 1); ``"stratified"`` and
    ``"shared"`` take ``group_size`` or :func:`default_group_size`.

    Returns
    -------
    int
        ``s'``, a divisor of ``s``; ``m = s // s'`` pitch groups.

    Raises
    ------
    TypeError
        ``sampler`` not a str, ``group_size`` not an integer.
    ValueError
        Unknown ``sampler``; ``group_size < 1``, not dividing ``num_samples``, or not 1
        for ``"iid"``.

    References
    ----------
    ``proofs_notes/samplers.md``, sections 1 (``s = m s'``) and 4 (group-size rule).
    """
    sampler = check_sampler(sampler)
    s = check_int("num_samples", num_samples, minimum=1)
    if group_size is None:
        return 1 if sampler == "iid" else default_group_size(s)
    g = check_int("group_size", group_size, minimum=1)
    if s % g:
        raise ValueError(f"group_size: must divide num_samples={s}, got {g}")
    if sampler == "iid" and g != 1:
        raise ValueError(f"group_size: must be 1 (or None) for sampler='iid', got {g}")
    return g


# --------------------------------------------------------------------------------------
# Gamma(2, sigma) quantiles and strata
# --------------------------------------------------------------------------------------


def gamma2_quantile(lower: ArrayLike, upper: ArrayLike, sigma: float) -> np.ndarray:
    """``F^-1`` of Gamma(2, sigma) at probability ``lower = 1 - upper``, accurate in both tails.

    Both complementary probabilities are passed so that neither is formed by a
    cancelling subtraction: ``scipy.special.gammaincinv(2, lower)`` is used where
    ``lower < 1/2`` and ``gammainccinv(2, upper)`` elsewhere (relative error below
    ``1e-13`` against mpmath for tail probabilities ``1e-300..1/2`` on either side,
    ``tests/ref/test_samplers.py``).

    Parameters
    ----------
    lower, upper : array_like of float
        Same shape, in ``[0, 1]``, ``lower + upper = 1`` up to rounding.
    sigma : float
        Scale in tokens, > 0.

    Returns
    -------
    numpy.ndarray
        float64, the shape of ``lower``; tokens (``0`` at ``lower = 0``, ``inf`` at
        ``upper = 0``).

    Raises
    ------
    ValueError, TypeError
        Shapes differ, values outside ``[0, 1]``, bad ``sigma``.

    References
    ----------
    ``proofs_notes/samplers.md``, section 1 (``F^-1`` in both tails); ``scipy.special.gammaincinv``,
    ``gammainccinv``.
    """
    sigma = check_positive_float("sigma", sigma)
    lo = np.asarray(as_float_array("lower", lower), dtype=np.float64)
    up = np.asarray(as_float_array("upper", upper), dtype=np.float64)
    if lo.shape != up.shape:
        raise ValueError(f"upper: shape {up.shape} differs from lower shape {lo.shape}")
    if np.any((lo < 0) | (lo > 1)) or np.any((up < 0) | (up > 1)):
        raise ValueError("lower: probabilities must lie in [0, 1]")
    return sigma * np.where(lo < 0.5, gammaincinv(2.0, lo), gammainccinv(2.0, up))


def stratum_edges(sigma: float, num_groups: int) -> np.ndarray:
    """Edges ``q_k = F^-1(k / m)``, ``k = 0..m``, of the ``m`` equal-probability strata.

    Returns
    -------
    numpy.ndarray
        float64 ``(m + 1,)``, tokens; ``q_0 = 0``, ``q_m = inf``.

    Raises
    ------
    ValueError, TypeError
        Bad ``sigma`` or ``num_groups < 1``.

    References
    ----------
    ``proofs_notes/samplers.md``, sections 1 and 3 (strata edges ``q_k = F^-1(k/m)``).
    """
    m = check_int("num_groups", num_groups, minimum=1)
    k = np.arange(m + 1, dtype=np.float64)
    return gamma2_quantile(k / m, (m - k) / m, sigma)


def stratified_pitch(uniform: ArrayLike, sigma: float) -> np.ndarray:
    """Stratified pitches ``delta_k = F^-1((k + U_k) / m)`` from ``U_k`` in ``[0, 1)``.

    A ``U_0 = 0`` (probability ``2^-53``) would give the pitch 0; it is replaced by
    ``2^-54``, which changes no moment of anything.

    Parameters
    ----------
    uniform : array_like of float, shape ``(..., m)``
        ``U_k`` in ``[0, 1)`` (strata on the last axis).
    sigma : float
        Scale, > 0 (tokens).

    Returns
    -------
    numpy.ndarray
        float64, the shape of ``uniform``, increasing along the last axis, finite and > 0
        (tokens).

    Raises
    ------
    ValueError, TypeError
        ``uniform`` zero-dimensional or outside ``[0, 1)``; bad ``sigma``.

    References
    ----------
    ``proofs_notes/samplers.md`` (unbiasedness).
    """
    u = np.array(as_float_array("uniform", uniform), dtype=np.float64)
    if u.ndim < 1:
        raise ValueError("uniform: must have at least one dimension (strata last)")
    if np.any((u < 0) | (u >= 1)):
        raise ValueError("uniform: values must lie in [0, 1)")
    u[u == 0.0] = 2.0**-54
    m = u.shape[-1]
    k = np.arange(m, dtype=np.float64)
    return gamma2_quantile((k + u) / m, ((m - k) - u) / m, sigma)


# --------------------------------------------------------------------------------------
# Exact variance of M~_ij
# --------------------------------------------------------------------------------------


def _partial_collision(lo, hi, x, sigma):
    """``int_{max(lo, x)}^{hi} (delta - x) e^(-delta/sigma) / sigma^2 d delta`` (broadcast)."""

    def primitive(d):
        with np.errstate(invalid="ignore", over="ignore"):
            e = np.exp(-d / sigma)
            val = e * (1.0 + (d - x) / sigma)
        # e = 0 (d = inf, or d / sigma > 745): the value is below the smallest float, and
        # 0 * inf where d / sigma overflows
        return np.where(e == 0.0, 0.0, val)

    a = np.maximum(lo, x)
    return np.where(a < hi, primitive(a) - primitive(hi), 0.0)


def _design(sampler, sigma, num_samples, group_size):
    sampler = check_sampler(sampler)
    sigma = check_positive_float("sigma", sigma)
    s = check_int("num_samples", num_samples, minimum=1)
    g = resolve_group_size(sampler, s, group_size)
    m = s // g
    if sampler == "stratified":
        edges = stratum_edges(sigma, m)
        return sigma, m, g, edges[:-1], edges[1:], float(m)
    # iid is "shared" with s' = 1: one stratum, the whole line
    return sigma, m, g, np.array([0.0]), np.array([np.inf]), 1.0


def group_moments(
    partial_collision: Callable[[np.ndarray], np.ndarray],
    distance: np.ndarray,
    group_size: int,
    weight: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``(G_k(r), E[A_k^2])``: the collision probability and the second moment of a group mean.

    For ``s'`` hashes sharing one pitch with systematically spaced offsets, the group mean
    ``A_k`` at distance ``r`` has ``E[A_k^2] = (1/s') [G_k(r) + 2 sum_{j=1}^{s'-1} (j/s')
    G_k(r s'/j)]`` with ``G_k(x) = weight * partial_collision(x)`` (module docstring;
    ``proofs_notes/samplers.md``, section "Exact variance"). One definition for every
    pitch law: :func:`entry_variance` passes the Gamma(2, sigma) integrals,
    :func:`plsh_ref.kernels.entry_variance` those of a general kernel.

    Parameters
    ----------
    partial_collision : callable
        ``x -> int_{max(lo_k, x)}^{hi_k} (1 - x/delta) dF(delta)`` for each stratum ``k``:
        takes float64 distances of shape ``(..., 1)`` and returns float64 ``(..., m)``
        (strata on the last axis; ``m = 1`` and the whole line without strata).
    distance : numpy.ndarray
        float64 ``r >= 0`` tokens, any shape (not checked: the callers check it).
    group_size : int
        ``s' >= 1``.
    weight : float
        ``m`` for equal-probability strata (``G_k`` is the probability given stratum
        ``k``), 1 without strata.

    Returns
    -------
    tuple of numpy.ndarray
        ``(G_k(r), E[A_k^2])``, float64, shape ``distance.shape + (m,)``.
    """
    x = distance[..., None]
    gk = weight * partial_collision(x)
    second = gk.copy()
    for j in range(1, group_size):
        second += 2.0 * (j / group_size) * weight * partial_collision(x * group_size / j)
    second /= group_size
    return gk, second


def _group_moments(distance, sampler, sigma, num_samples, group_size):
    """``(r, sigma, m, G_k(r), E[A_k^2])`` (checked) with strata on the last axis."""
    r = np.abs(as_float_array("distance", distance))
    sigma, m, g, lo, hi, weight = _design(sampler, sigma, num_samples, group_size)
    lk, second = group_moments(lambda x: _partial_collision(lo, hi, x, sigma), r, g, weight)
    return r, sigma, m, lk, second


def entry_variance(
    distance: ArrayLike,
    sigma: float,
    num_samples: int,
    *,
    sampler: str = "iid",
    group_size: int | None = None,
) -> float | np.ndarray:
    """Exact ``Var(M~_ij)`` for two positions at ``distance`` under ``sampler``.

    ``"iid"``: ``L (1 - L) / s`` with ``L = exp(-r / sigma)``. ``"stratified"``:
    ``(1/m^2) sum_k (E[A_k^2] - G_k(r)^2)`` over the ``m`` strata; ``"shared"``:
    ``(E[A^2] - L^2) / m`` (module docstring). Causally masked entries (``p_j > p_i``)
    are 0 deterministically and are not covered here.

    Parameters
    ----------
    distance : array_like of float
        ``r = |p_i - p_j|`` in tokens (any shape; sign ignored).
    sigma : float
        Length scale, > 0.
    num_samples : int
        ``s >= 1``.
    sampler : {"iid", "stratified", "shared"}
    group_size : int, optional
        ``s'`` (divides ``s``); default :func:`resolve_group_size`.

    Returns
    -------
    float or numpy.ndarray
        float64, the shape of ``distance``.

    Raises
    ------
    ValueError, TypeError
        Bad ``sigma``, ``num_samples``, ``sampler`` or ``group_size``; non-finite distance.

    References
    ----------
    ``proofs_notes/samplers.md`` (section "Exact variance").
    """
    within, between = variance_split(
        distance, sigma, num_samples, sampler=sampler, group_size=group_size
    )
    return within + between


def variance_split(
    distance: ArrayLike,
    sigma: float,
    num_samples: int,
    *,
    sampler: str = "iid",
    group_size: int | None = None,
) -> tuple[float | np.ndarray, float | np.ndarray]:
    """``Var(M~_ij) = within + between``: the within-pitch and the between-pitch parts.

    ``within = (1/m^2) sum_k E_k[Var(A_k | delta_k)]`` (offsets given the pitch) and
    ``between = (1/m^2) sum_k Var_k(g(delta_k))`` with ``g(delta) = (1 - r/delta)_+``.
    For ``"iid"``: ``within = E[g (1 - g)] / s``, ``between = Var(g) / s``; on the
    infinite line and as ``sigma -> inf`` the between part is exactly 1/3 of the total
    (``proofs_notes/samplers.md``).

    Parameters
    ----------
    distance, sigma, num_samples, sampler, group_size
        As :func:`entry_variance`.

    Returns
    -------
    tuple of (float or numpy.ndarray)
        ``(within, between)``, float64, the shape of ``distance``.

    Raises
    ------
    ValueError, TypeError
        As :func:`entry_variance`.

    References
    ----------
    ``proofs_notes/samplers.md``.
    """
    r, sigma, m, lk, second = _group_moments(distance, sampler, sigma, num_samples, group_size)
    if sampler == "stratified":
        # strata are equally likely: E over the pitch of anything = mean over strata
        ek_g2 = _g_square_by_stratum(r, sigma, m)
        within = np.sum(second - ek_g2, axis=-1) / m**2
        between = np.sum(ek_g2 - lk**2, axis=-1) / m**2
    else:
        eg2 = _g_square_by_stratum(r, sigma, 1)
        within = (second - eg2)[..., 0] / m
        between = (eg2 - lk**2)[..., 0] / m
    # r = 0: every hash collides, M~ = 1 exactly; the sums above cancel only up to rounding
    within = np.where(r == 0, 0.0, np.maximum(within, 0.0))
    between = np.where(r == 0, 0.0, np.maximum(between, 0.0))
    if np.ndim(within) == 0:
        return float(within), float(between)
    return within, between


def _g_square_by_stratum(r, sigma, m):
    """``E_k[g(delta)^2]`` per stratum (last axis), ``g = (1 - r/delta)_+``.

    ``int (delta - 2r + r^2/delta) e^(-delta/sigma) / sigma^2`` over ``delta > r`` in the
    stratum: exponentials and ``E1`` (scipy.special.exp1). For ``r > 0``: at ``r = 0`` the
    first stratum's entry is NaN (``0 * E1(0)``, ``E1(0) = inf``); the only caller,
    :func:`variance_split`, sets the variance at ``r = 0`` to exactly 0 (every hash
    collides) without reading it.
    """
    from scipy.special import exp1

    edges = stratum_edges(sigma, m)
    lo, hi = edges[:-1], edges[1:]
    x = r[..., None]
    a = np.maximum(lo, x)

    def primitive(d):
        # antiderivative of (d - 2x + x^2/d) e^(-d/sigma) / sigma^2
        with np.errstate(invalid="ignore", over="ignore"):
            e = np.exp(-d / sigma)
            val = -e * (1.0 + d / sigma) + 2.0 * x / sigma * e - (x / sigma) ** 2 * exp1(d / sigma)
        # e = 0 (d = inf, or d / sigma > 745; d >= x, so (x/sigma)^2 E1(d/sigma) <=
        # (x/sigma) e^(-d/sigma) too): the value is below the smallest float, and inf * 0
        # where (x / sigma)^2 overflows
        return np.where(e == 0.0, 0.0, val)

    # primitive(a) is finite for r > 0 (e(a) > 0 bounds x / sigma <= a / sigma <= 745): no
    # inf - inf
    out = np.where(a < hi, primitive(hi) - primitive(a), 0.0)
    return m * out


def frobenius_error_square(
    sigma: float,
    n: int,
    num_samples: int,
    *,
    sampler: str = "iid",
    group_size: int | None = None,
    causal: bool = False,
) -> float:
    """Exact ``E||M~ - L*||_F^2`` for one head on positions ``0..n-1``.

    ``sum_{r=1}^{n-1} c_r (n - r) Var_r`` with ``c_r = 2`` (bidirectional) or 1 (causal)
    and ``Var_r`` from :func:`entry_variance` (the diagonal is exact). Cost
    ``O(n m s')``.

    Parameters
    ----------
    sigma : float
        > 0 (tokens).
    n : int
        ``>= 1``.
    num_samples : int
        ``s >= 1``.
    sampler : {"iid", "stratified", "shared"}
    group_size : int, optional
        ``s'``; default :func:`resolve_group_size`.
    causal : bool

    Returns
    -------
    float

    Raises
    ------
    ValueError, TypeError
        Bad arguments (names as above).

    References
    ----------
    ``proofs_notes/samplers.md``.
    """
    n = check_int("n", n, minimum=1)
    causal = check_bool("causal", causal)
    if n == 1:
        check_sampler(sampler)
        return 0.0
    r = np.arange(1, n, dtype=np.float64)
    var = entry_variance(r, sigma, num_samples, sampler=sampler, group_size=group_size)
    return float(np.sum((1 if causal else 2) * (n - r) * var))


def optimal_group_size(sigma: float, n: int, num_samples: int, *, causal: bool = False) -> int:
    """The divisor ``s'`` of ``s`` minimising the stratified :func:`frobenius_error_square`.

    Parameters
    ----------
    sigma : float
        > 0 (tokens).
    n : int
        Positions ``0..n-1``, ``>= 1``.
    num_samples : int
        ``s >= 1``.
    causal : bool
        Passed to :func:`frobenius_error_square`, where it halves every error (``c_r =
        1`` instead of 2; exactly, outside float64's subnormal range), so it does not
        change the answer; accepted so that the two functions take the same arguments.

    Returns
    -------
    int
        The smallest minimising divisor of ``s`` (``s' = 1`` for ``s = 1``).

    Raises
    ------
    ValueError, TypeError
        Bad ``sigma``, ``n`` or ``num_samples``.

    References
    ----------
    ``proofs_notes/samplers.md`` (group-size rule).
    """
    s = check_int("num_samples", num_samples, minimum=1)
    divisors = [d for d in range(1, s + 1) if s % d == 0]
    errors = [
        frobenius_error_square(sigma, n, s, sampler="stratified", group_size=d, causal=causal)
        for d in divisors
    ]
    return divisors[int(np.argmin(errors))]


# --------------------------------------------------------------------------------------
# Largest pitch and fused window
# --------------------------------------------------------------------------------------


def largest_pitch_sf_of(
    b: ArrayLike,
    sigma: float,
    num_samples: int,
    *,
    sampler: str = "iid",
    group_size: int | None = None,
) -> float | np.ndarray:
    """``P(max_t delta_t > b)`` for the ``s`` pitches of one head under ``sampler``.

    ``"iid"``: :func:`plsh_ref.expectation.largest_pitch_sf`. ``"shared"``: the same with
    ``m`` pitches. ``"stratified"``: the largest pitch is the top stratum's,
    ``F^-1((m - 1 + U) / m)``, so ``P(max > b) = min(1, m P(delta > b))``.

    Parameters
    ----------
    b : float or array_like
        Level in tokens.
    sigma : float
        > 0.
    num_samples : int
        ``s >= 1``.
    sampler, group_size
        As :func:`entry_variance`.

    Returns
    -------
    float or numpy.ndarray

    Raises
    ------
    ValueError, TypeError
        Bad arguments.

    References
    ----------
    ``proofs_notes/samplers.md`` (largest pitch).
    """
    sigma, m, g, _, _, _ = _design(sampler, sigma, num_samples, group_size)
    if sampler != "stratified":
        return largest_pitch_sf(b, sigma, m)
    level = np.maximum(as_float_array("b", b), 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        x = level / sigma  # inf where it overflows: the tail is 0 there, not m * 0 * inf = NaN
        out = np.minimum(1.0, np.where(np.isinf(x), 0.0, m * np.exp(-x) * (1.0 + x)))
    return float(out) if np.ndim(out) == 0 else out


def largest_pitch_quantile_of(
    q: float, sigma: float, num_samples: int, *, sampler: str = "iid", group_size: int | None = None
) -> float:
    """The ``q``-quantile of the largest pitch under ``sampler`` (tokens).

    ``"stratified"``: ``F^-1(1 - (1 - q)/m)``, i.e. ``sigma gammainccinv(2, (1 - q)/m)``.

    Raises
    ------
    ValueError, TypeError
        ``q`` outside ``(0, 1)``, bad other arguments.

    References
    ----------
    ``proofs_notes/samplers.md`` (largest pitch).
    """
    from .validation import check_probability

    q = check_probability("q", q)
    sigma, m, g, _, _, _ = _design(sampler, sigma, num_samples, group_size)
    if sampler != "stratified":
        return largest_pitch_quantile(q, sigma, m)
    up = (1.0 - q) / m
    return float(gamma2_quantile(np.array(1.0 - up), np.array(up), sigma))


def _no_reach(r, sampler, sigma, num_samples, group_size):
    """``log P(max_t R_t < r)`` for extents ``r`` (last axis summed over groups).

    In units of ``sigma`` (pitches, strata and ``r``): at a subnormal ``sigma`` the strata
    ``sigma q_k`` kept one or two bits (``sigma = 5e-324`` gave a window of 3.05, not 1)
    and ``r / sigma`` overflows; ``x = inf`` makes every term below 0 or its limit."""
    _, m, g, lo, hi, weight = _design(sampler, 1.0, num_samples, group_size)
    with np.errstate(over="ignore"):
        x = (r / sigma)[..., None]

    def sf(d):  # P(delta > d), d in units of sigma
        with np.errstate(invalid="ignore"):
            val = np.exp(-d) * (1.0 + d)
        return np.where(np.isinf(d), 0.0, val)

    def xe(d):  # x exp(-d) for d >= x (0 at d = inf, not inf * 0)
        with np.errstate(invalid="ignore"):
            val = x * np.exp(-d)
        return np.where(np.isinf(d), 0.0, val)

    # P(no offset of the group reaches r | delta) = 1 for delta <= r,
    # 1 - s' + s' r / delta on (r, c), c = r s' / (s' - 1), 0 beyond.
    below = np.where(lo < x, sf(lo) - sf(np.minimum(hi, x)), 0.0)
    c = x * g / (g - 1) if g > 1 else np.full_like(x, np.inf)
    a = np.maximum(lo, x)
    bnd = np.minimum(hi, c)
    mid = np.where(a < bnd, g * (xe(a) - xe(bnd)) - (g - 1) * (sf(a) - sf(bnd)), 0.0)
    # a stratum wholly at or below r reaches nothing: exactly 1, not m (sf(lo) - sf(hi)),
    # which the rounding of the strata's edges puts a few ulps off (1e-14 at r / sigma > 40)
    p = np.where(hi <= x, 1.0, np.clip(weight * (below + mid), 0.0, 1.0))
    with np.errstate(divide="ignore"):
        logp = np.sum(np.log(p), axis=-1)
    # "shared" (and iid): m independent groups with the same law
    return logp if sampler == "stratified" else m * logp


#: the most (extent, stratum) pairs :func:`window_width` evaluates for the stratified and
#: shared samplers, refused before allocating (at the bound about 2.5 s and a peak of 0.7 GB
#: resident, measured 2026-12-03 on a 2-core AMD EPYC; ``sigma = 1e6`` took 415 s before,
#: and ``1e300`` failed inside ``np.arange``)
MAX_WINDOW_TERMS = 2**23


def window_width(
    sigma: float,
    num_samples: int,
    n: int | None = None,
    *,
    sampler: str = "iid",
    group_size: int | None = None,
    causal: bool = False,
) -> float | np.ndarray:
    """Expected fused window per query: keys with ``C_ij > 0``, under ``sampler``.

    The window is the union of the ``s`` blocks containing the query, an interval of
    width ``1 + max_t L_t + max_t R_t``; ``E[max_t R_t] = sum_{r >= 1} P(max_t R_t >= r)``
    with ``P(max_t R_t < r) = prod_k E_k[(1 - s' g(r; delta_k))_+]`` over the independent
    groups. ``"iid"`` gives :func:`plsh_ref.expectation.expected_window_width`.

    Parameters
    ----------
    sigma : float
        > 0 (tokens).
    num_samples : int
        ``s >= 1``.
    n : int, optional
        Positions ``0..n-1``; ``None``: infinite line.
    sampler, group_size
        As :func:`entry_variance`.
    causal : bool
        Count keys ``p_j <= p_i`` only.

    Returns
    -------
    float or numpy.ndarray
        A float (infinite line) or float64 ``(n,)`` per query.

    Raises
    ------
    ValueError, TypeError
        Bad arguments; for ``"stratified"`` and ``"shared"``, more than
        :data:`MAX_WINDOW_TERMS` (extent, stratum) pairs (``sigma`` too large on the line,
        ``n`` too large otherwise), before any allocation.

    References
    ----------
    ``proofs_notes/samplers.md`` (window); ``proofs_notes/window_width.md`` (iid).
    """
    check_sampler(sampler)
    causal = check_bool("causal", causal)
    s = check_int("num_samples", num_samples, minimum=1)
    if sampler == "iid":
        resolve_group_size(sampler, s, group_size)
        return expected_window_width(sigma, s, n, causal=causal)
    sigma_f = check_positive_float("sigma", sigma)
    g = resolve_group_size(sampler, s, group_size)
    strata = s // g if sampler == "stratified" else 1
    if n is None:
        terms = sigma_f * (math.log(s) + 45.0)  # extents r up to where s P(R >= r) < e^-45
        if terms * strata > MAX_WINDOW_TERMS:
            raise ValueError(
                f"sigma: the {sampler} window sums about {terms:.3g} extents over {strata} "
                f"strata, more than MAX_WINDOW_TERMS = {MAX_WINDOW_TERMS} (sampler='iid' "
                f"takes a closed form at any sigma); got sigma = {sigma_f:g}"
            )
        limit = int(math.ceil(terms)) + 2
    else:
        n = check_int("n", n, minimum=1)
        if (n - 1) * strata > MAX_WINDOW_TERMS:
            raise ValueError(
                f"n: the {sampler} window sums n - 1 extents over {strata} strata, more than "
                f"MAX_WINDOW_TERMS = {MAX_WINDOW_TERMS}; got n = {n}"
            )
        limit = n - 1
    r = np.arange(1, limit + 1, dtype=np.float64)
    reach = -np.expm1(_no_reach(r, sampler, sigma_f, s, group_size))
    c = np.concatenate([[0.0], np.cumsum(reach)])
    sides = 1 if causal else 2
    if n is None:
        return 1.0 + sides * float(c[-1])
    i = np.arange(n)
    return 1.0 + c[i] + (0.0 if causal else c[n - 1 - i])
