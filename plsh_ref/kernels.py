"""Distance kernels of Pólya type: random binning for relative biases beyond ALiBi.

For a distance kernel ``k(r)`` on ``r >= 0`` that is convex and decreasing with
``k(0) = 1``, ``k(r) -> 0`` and ``r k'(r) -> 0`` as ``r -> inf``, draw the pitch ``delta``
with density ``p(delta) = delta k''(delta)`` and the offset ``u ~ U[0, delta)``; then two
positions at distance ``r`` share a bin with probability exactly ``k(r)`` (SPEC section 8;
Rahimi & Recht 2007; ``proofs_notes/general_kernels.md``). The pitch law has the CDF
``F(delta) = 1 - k(delta) + delta k'(delta)`` and the mean ``2 int_0^inf k(r) dr``.

Kernels (frozen dataclasses, parameters validated; errors name the argument):

* :class:`Exponential` ``(sigma)``: ALiBi, ``k = exp(-r / sigma)``, pitch ``Gamma(2, sigma)``;
  draws exactly as :func:`plsh_ref.partition.draw_partition` with ``sigma``.
* :class:`KerpleLog` ``(r1, r2)``: KERPLE's log form, bias ``-r1 log(1 + r2 r)``,
  ``k = (1 + r2 r)^(-r1)``. ``r2 delta / (1 + r2 delta) ~ Beta(2, r1)`` (a beta-prime
  pitch): heavy tailed, ``P(delta > b) ~ (r1 + 1) (r2 b)^(-r1)``, infinite mean for
  ``r1 <= 1``.
* :class:`KerplePower` ``(r1, p)``: KERPLE's power form, bias ``-r1 r^p``,
  ``k = exp(-r1 r^p)``, ``0 < p <= 1``; ``r1 delta^p`` is the mixture ``(1 - p) Exp(1) +
  p Gamma(2, 1)``. ``p > 1`` is refused (``k`` is not convex near 0).
* :class:`Mixture` ``(weights, kernels)``: ``sum_i w_i k_i`` with ``w_i >= 0``,
  ``sum w_i = 1``; the pitch laws mix with the same weights.

:class:`DistanceKernel` is the base: a subclass supplies ``k``, ``dk``, ``d2k`` (and, where
it can, accurate ``pitch_cdf``/``pitch_sf``/``pitch_quantile``); the base supplies the
monotone root finder for the quantile, sampling, and :func:`check_polya` refuses a kernel
that violates the conditions (e.g. the Gaussian ``exp(-r^2)``). The module also holds the
closed forms a general kernel needs: the kernel matrix ``E[M] = K``, ``E[M^2]``, the exact
variance of every sampler, block-size, largest-pitch and window laws.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, cast

import mpmath
import numpy as np
from numpy.typing import ArrayLike
from scipy.special import betainc, betaincinv, gamma, gammainc, gammaincc

from .validation import (
    as_float_array,
    as_positions,
    check_bool,
    check_int,
    check_positive_float,
    check_probability,
)

__all__ = [
    "PITCH_FLOOR",
    "DistanceKernel",
    "Exponential",
    "KerpleLog",
    "KerplePower",
    "Mixture",
    "block_extent_sf",
    "block_size_mean",
    "block_size_pmf",
    "check_kernels",
    "check_polya",
    "collision_probability_mp",
    "entry_variance",
    "expected_mask",
    "expected_mask_square",
    "expected_max_extent",
    "expected_window_width",
    "frobenius_error_square",
    "is_builtin",
    "kernel_matrix",
    "largest_pitch_quantile",
    "largest_pitch_sf",
    "variance_proxy",
]

#: smallest pitch :func:`plsh_ref.partition.draw_partition` stores for a kernel (tokens): every
#: pitch below 1 gives the identity mask on integer positions (a half-open bin shorter than 1
#: holds at most one integer), so raising such a pitch to this floor (and drawing its offset
#: in ``[0, floor)``) leaves the law of every mask unchanged, and keeps
#: ``(p - offset) / pitch`` inside int64 for ``|p| < 2^53``.
PITCH_FLOOR = 2.0**-10

#: bisection steps of the generic quantile (log-pitch bracket of width < 1500: 2^-60 after)
_BISECTION_STEPS = 72
_LOG_LO, _LOG_HI = math.log(1e-300), math.log(1e300)


def _as_array(name: str, value) -> np.ndarray:
    return np.asarray(as_float_array(name, value, finite=False), dtype=np.float64)


def _out(x) -> float | np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return float(x) if x.ndim == 0 else x


def _distance(name: str, r) -> np.ndarray:
    r = _as_array(name, r)
    if np.any(r < 0) or np.any(np.isnan(r)):
        raise ValueError(f"{name}: distances must be >= 0")
    return r


@dataclass(frozen=True)
class DistanceKernel:
    """Base of the Pólya-type distance kernels ``k(r)``, ``r >= 0`` (tokens).

    Subclasses implement :meth:`k`, :meth:`dk`, :meth:`d2k` and :meth:`k_mp`; they may
    override :meth:`pitch_cdf`, :meth:`pitch_sf`, :meth:`pitch_quantile`,
    :meth:`sample_pitch` and :meth:`mean_pitch` with closed forms. The defaults here are
    exact formulas in ``k`` (``F = 1 - k + delta k'``, ``1 - F = k - delta k'``) and a
    monotone bisection for the quantile.

    References
    ----------
    ``proofs_notes/general_kernels.md`` (representation theorem, pitch law).
    """

    # ---------------------------------------------------------------- the kernel
    def k(self, r: ArrayLike) -> float | np.ndarray:
        """``k(r)``, float64, the shape of ``r`` (``r >= 0`` tokens)."""
        raise NotImplementedError

    def dk(self, r: ArrayLike) -> float | np.ndarray:
        """``k'(r)``, float64, the shape of ``r``."""
        raise NotImplementedError

    def d2k(self, r: ArrayLike) -> float | np.ndarray:
        """``k''(r)``, float64, the shape of ``r`` (``r > 0``)."""
        raise NotImplementedError

    def k_mp(self, r: float | mpmath.mpf, dps: int = 50) -> mpmath.mpf:
        """``k(r)`` in mpmath at ``dps`` digits (``r`` an mpf or a number)."""
        raise NotImplementedError

    def d2k_mp(self, r: float | mpmath.mpf, dps: int = 50) -> mpmath.mpf:
        """``k''(r)`` in mpmath at ``dps`` digits (``r > 0``)."""
        raise NotImplementedError

    def bias(self, r: ArrayLike) -> float | np.ndarray:
        """The additive attention bias ``log k(r)`` (float64, ``-inf`` where ``k = 0``)."""
        with np.errstate(divide="ignore"):
            return _out(np.log(self.k(_distance("r", r))))

    # ---------------------------------------------------------------- the pitch law
    def pitch_pdf(self, delta: ArrayLike) -> float | np.ndarray:
        """Pitch density ``p(delta) = delta k''(delta)`` (per token), the shape of ``delta``."""
        d = _distance("delta", delta)
        with np.errstate(invalid="ignore"):
            out = np.where(d > 0, d * self.d2k(np.where(d > 0, d, 1.0)), 0.0)
        return _out(out)

    def pitch_cdf(self, delta: ArrayLike) -> float | np.ndarray:
        """``F(delta) = 1 - k(delta) + delta k'(delta) = P(pitch <= delta)``."""
        d = _distance("delta", delta)
        with np.errstate(invalid="ignore"):
            out = np.where(np.isinf(d), 1.0, 1.0 - self.k(d) + d * self.dk(d))
        return _out(out)

    def pitch_sf(self, delta: ArrayLike) -> float | np.ndarray:
        """``1 - F(delta) = k(delta) - delta k'(delta) = P(pitch > delta)``."""
        d = _distance("delta", delta)
        with np.errstate(invalid="ignore"):
            out = np.where(np.isinf(d), 0.0, self.k(d) - d * self.dk(d))
        return _out(out)

    def pitch_quantile(self, lower: ArrayLike, upper: ArrayLike) -> float | np.ndarray:
        """``F^-1`` at probability ``lower = 1 - upper`` (both given: no cancelling subtraction).

        Default: bisection on ``log delta`` over ``[1e-300, 1e300]`` (72 steps), comparing
        ``F(delta)`` with ``lower`` where ``lower < 1/2`` and ``1 - F(delta)`` with ``upper``
        elsewhere; monotone in the probability, and as accurate as the CDF (checked against
        mpmath in ``tests/ref/test_kernels.py``).

        Parameters
        ----------
        lower, upper : array_like of float
            Same shape, in ``[0, 1]``.

        Returns
        -------
        float or numpy.ndarray
            Pitch in tokens (``0`` at ``lower = 0``, ``inf`` at ``upper = 0``).

        Raises
        ------
        ValueError, TypeError
            Shapes differ or values outside ``[0, 1]``.
        """
        lo_p, up_p = _check_probabilities(lower, upper)
        use_lower = lo_p < 0.5
        a = np.full(lo_p.shape, _LOG_LO)
        b = np.full(lo_p.shape, _LOG_HI)
        for _ in range(_BISECTION_STEPS):
            mid = 0.5 * (a + b)
            d = np.exp(mid)
            below = np.where(
                use_lower, self.pitch_cdf(d) < lo_p, self.pitch_sf(d) > up_p
            )  # F(d) < target: the root is above mid
            a = np.where(below, mid, a)
            b = np.where(below, b, mid)
        out = np.exp(0.5 * (a + b))
        out = np.where(lo_p == 0.0, 0.0, np.where(up_p == 0.0, np.inf, out))
        return _out(out)

    def pitch_ppf(self, q: ArrayLike) -> float | np.ndarray:
        """``F^-1(q)``, ``q`` in ``[0, 1]`` (see :meth:`pitch_quantile` for both tails)."""
        q = _as_array("q", q)
        return self.pitch_quantile(q, 1.0 - q)

    def pitch_isf(self, q: ArrayLike) -> float | np.ndarray:
        """``(1 - F)^-1(q)``: the pitch exceeded with probability ``q`` (accurate for tiny ``q``)."""
        q = _as_array("q", q)
        return self.pitch_quantile(1.0 - q, q)

    def sample_pitch(self, rng: np.random.Generator, size: int | tuple) -> np.ndarray:
        """``size`` independent pitches from ``rng`` (float64 tokens).

        Default: inverse CDF of ``rng.random(size)``. Subclasses use exact generators.
        """
        _check_rng(rng)
        u = rng.random(size)
        return np.asarray(self.pitch_quantile(u, 1.0 - u))

    def stratified_pitch(self, uniform: ArrayLike) -> np.ndarray:
        """Stratified pitches ``F^-1((k + U_k) / m)``, ``k = 0..m-1``, from ``U_k`` in ``[0, 1)``.

        As :func:`plsh_ref.samplers.stratified_pitch` (the Gamma(2) case, bit-identical
        for :class:`Exponential`) for this kernel's law: a ``U_0 = 0`` is replaced by
        ``2^-54``; both tail probabilities are passed to :meth:`pitch_quantile`.

        Parameters
        ----------
        uniform : array_like of float, shape ``(..., m)``
            In ``[0, 1)``, strata on the last axis.

        Returns
        -------
        numpy.ndarray
            float64, the shape of ``uniform``, increasing along the last axis (tokens).

        Raises
        ------
        ValueError, TypeError
            ``uniform`` zero-dimensional or outside ``[0, 1)``.
        """
        u = np.array(_as_array("uniform", uniform), dtype=np.float64)
        if u.ndim < 1:
            raise ValueError("uniform: must have at least one dimension (strata last)")
        if np.any((u < 0) | (u >= 1)):
            raise ValueError("uniform: values must lie in [0, 1)")
        u[u == 0.0] = 2.0**-54
        m = u.shape[-1]
        k = np.arange(m, dtype=np.float64)
        return np.asarray(self.pitch_quantile((k + u) / m, ((m - k) - u) / m), dtype=np.float64)

    def mean_pitch(self) -> float:
        """``E[delta] = 2 int_0^inf k(r) dr`` (``inf`` when the integral diverges)."""
        raise NotImplementedError

    def tail_first_moment(self, b: float) -> float:
        """``E[delta 1[delta > b]] = b^2 (-k'(b)) + 2 b k(b) + 2 int_b^inf k`` (``inf`` if divergent)."""
        b = check_positive_float("b", b, allow_zero=True)
        rest = self._tail_integral(b)
        if not math.isfinite(rest):
            return math.inf
        return float(
            -(b * b) * self.dk(np.float64(b)) + 2.0 * b * self.k(np.float64(b)) + 2.0 * rest
        )

    def _tail_integral(self, b: float) -> float:
        """``int_b^inf k(r) dr`` by adaptive quadrature (``inf`` if divergent)."""
        from scipy.integrate import quad

        val, _ = quad(lambda r: float(self.k(np.float64(r))), b, np.inf, limit=200)
        return float(val)


def _check_rng(rng) -> None:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng: must be a numpy.random.Generator, got {type(rng).__name__}")


def _check_probabilities(lower, upper):
    lo = _as_array("lower", lower)
    up = _as_array("upper", upper)
    if lo.shape != up.shape:
        raise ValueError(f"upper: shape {up.shape} differs from lower shape {lo.shape}")
    if np.any((lo < 0) | (lo > 1)) or np.any((up < 0) | (up > 1)):
        raise ValueError("lower: probabilities must lie in [0, 1]")
    return lo, up


# --------------------------------------------------------------------------------------
# The kernels
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Exponential(DistanceKernel):
    """ALiBi's kernel ``k(r) = exp(-r / sigma)``; pitch ``Gamma(2, sigma)`` (the paper's).

    Parameters
    ----------
    sigma : float
        Length scale in tokens (``1 / slope``), finite and > 0.

    Raises
    ------
    ValueError, TypeError
        ``sigma`` not a finite real > 0 (message starts with ``sigma``).

    References
    ----------
    SPEC sections 2 and 8; ``proofs_notes/collision_probability.md``.
    """

    sigma: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigma", check_positive_float("sigma", self.sigma))

    def k(self, r: ArrayLike) -> float | np.ndarray:
        return _out(np.exp(-_distance("r", r) / self.sigma))

    def dk(self, r: ArrayLike) -> float | np.ndarray:
        return _out(-np.exp(-_distance("r", r) / self.sigma) / self.sigma)

    def d2k(self, r: ArrayLike) -> float | np.ndarray:
        return _out(np.exp(-_distance("r", r) / self.sigma) / self.sigma**2)

    def k_mp(self, r: float | mpmath.mpf, dps: int = 50) -> mpmath.mpf:
        with mpmath.workdps(dps):
            return mpmath.exp(-mpmath.mpf(r) / mpmath.mpf(self.sigma))

    def d2k_mp(self, r: float | mpmath.mpf, dps: int = 50) -> mpmath.mpf:
        with mpmath.workdps(dps):
            sig = mpmath.mpf(self.sigma)
            return mpmath.exp(-mpmath.mpf(r) / sig) / sig**2

    def pitch_cdf(self, delta: ArrayLike) -> float | np.ndarray:
        return _out(gammainc(2.0, _distance("delta", delta) / self.sigma))

    def pitch_sf(self, delta: ArrayLike) -> float | np.ndarray:
        return _out(gammaincc(2.0, _distance("delta", delta) / self.sigma))

    def pitch_quantile(self, lower: ArrayLike, upper: ArrayLike) -> float | np.ndarray:
        from .samplers import gamma2_quantile

        lo, up = _check_probabilities(lower, upper)
        return _out(gamma2_quantile(lo, up, self.sigma))

    def sample_pitch(self, rng: np.random.Generator, size: int | tuple) -> np.ndarray:
        """``rng.gamma(2.0, scale=sigma, size=size)``: the draws of ``draw_partition(sigma)``."""
        _check_rng(rng)
        return rng.gamma(2.0, scale=self.sigma, size=size)

    def mean_pitch(self) -> float:
        return 2.0 * self.sigma

    def _tail_integral(self, b: float) -> float:
        return self.sigma * math.exp(-b / self.sigma)


@dataclass(frozen=True)
class KerpleLog(DistanceKernel):
    """KERPLE's logarithmic kernel: bias ``-r1 log(1 + r2 r)``, ``k(r) = (1 + r2 r)^(-r1)``.

    The pitch ``delta`` has ``x = r2 delta`` beta-prime distributed with parameters
    ``(2, r1)``: ``x / (1 + x) ~ Beta(2, r1)``. ``P(delta > b) = (1 + x)^(-r1-1)
    (1 + (r1 + 1) x)``, ``x = r2 b``: a power tail of index ``r1``, so the mean pitch
    ``2 / (r2 (r1 - 1))`` is finite only for ``r1 > 1``.

    Parameters
    ----------
    r1 : float
        Power, finite and > 0.
    r2 : float
        Rate per token, finite and > 0.

    Raises
    ------
    ValueError, TypeError
        A parameter not a finite real > 0 (message starts with its name).

    References
    ----------
    Chi et al. (2022), KERPLE; ``proofs_notes/general_kernels.md``.
    """

    r1: float
    r2: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "r1", check_positive_float("r1", self.r1))
        object.__setattr__(self, "r2", check_positive_float("r2", self.r2))

    def k(self, r: ArrayLike) -> float | np.ndarray:
        return _out(np.exp(-self.r1 * np.log1p(self.r2 * _distance("r", r))))

    def dk(self, r: ArrayLike) -> float | np.ndarray:
        x = self.r2 * _distance("r", r)
        return _out(-self.r1 * self.r2 * np.exp(-(self.r1 + 1.0) * np.log1p(x)))

    def d2k(self, r: ArrayLike) -> float | np.ndarray:
        x = self.r2 * _distance("r", r)
        c = self.r1
        return _out(c * (c + 1.0) * self.r2**2 * np.exp(-(c + 2.0) * np.log1p(x)))

    def k_mp(self, r: float | mpmath.mpf, dps: int = 50) -> mpmath.mpf:
        with mpmath.workdps(dps):
            return (1 + mpmath.mpf(self.r2) * mpmath.mpf(r)) ** (-mpmath.mpf(self.r1))

    def d2k_mp(self, r: float | mpmath.mpf, dps: int = 50) -> mpmath.mpf:
        with mpmath.workdps(dps):
            c, a = mpmath.mpf(self.r1), mpmath.mpf(self.r2)
            return c * (c + 1) * a**2 * (1 + a * mpmath.mpf(r)) ** (-c - 2)

    def pitch_cdf(self, delta: ArrayLike) -> float | np.ndarray:
        x = self.r2 * _distance("delta", delta)
        with np.errstate(invalid="ignore"):
            t = np.where(np.isinf(x), 1.0, x / (1.0 + x))
        return _out(betainc(2.0, self.r1, t))

    def pitch_sf(self, delta: ArrayLike) -> float | np.ndarray:
        x = self.r2 * _distance("delta", delta)
        return _out(betainc(self.r1, 2.0, 1.0 / (1.0 + x)))  # 1 - T ~ Beta(r1, 2)

    def pitch_quantile(self, lower: ArrayLike, upper: ArrayLike) -> float | np.ndarray:
        lo, up = _check_probabilities(lower, upper)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = betaincinv(2.0, self.r1, lo)  # T, accurate for small T
            v = betaincinv(self.r1, 2.0, up)  # 1 - T, accurate for small 1 - T
            x = np.where(lo < 0.5, t / (1.0 - t), (1.0 - v) / v)
        x = np.where(lo == 0.0, 0.0, np.where(up == 0.0, np.inf, x))
        return _out(x / self.r2)

    def sample_pitch(self, rng: np.random.Generator, size: int | tuple) -> np.ndarray:
        """``G2 / (r2 G1)``, ``G2 ~ Gamma(2)`` then ``G1 ~ Gamma(r1)`` from ``rng`` (beta prime)."""
        _check_rng(rng)
        num = rng.standard_gamma(2.0, size=size)
        den = rng.standard_gamma(self.r1, size=size)
        den = np.maximum(den, np.finfo(np.float64).tiny)  # Gamma(r1) can underflow to 0
        return num / (self.r2 * den)

    def mean_pitch(self) -> float:
        return 2.0 / (self.r2 * (self.r1 - 1.0)) if self.r1 > 1.0 else math.inf

    def _tail_integral(self, b: float) -> float:
        if self.r1 <= 1.0:
            return math.inf
        return (1.0 + self.r2 * b) ** (1.0 - self.r1) / (self.r2 * (self.r1 - 1.0))


@dataclass(frozen=True)
class KerplePower(DistanceKernel):
    """KERPLE's power kernel: bias ``-r1 r^p``, ``k(r) = exp(-r1 r^p)``, ``0 < p <= 1``.

    With ``y = r1 delta^p`` the pitch law is the mixture ``(1 - p) Exp(1) + p Gamma(2, 1)``
    in ``y`` (density ``e^(-y) (1 - p + p y)``), so ``P(delta > b) = e^(-y) (1 + p y)``.
    ``p = 1`` is :class:`Exponential` with ``sigma = 1 / r1``.

    Parameters
    ----------
    r1 : float
        Finite and > 0.
    p : float
        In ``(0, 1]``.

    Raises
    ------
    ValueError
        ``r1`` not > 0; ``p`` not in ``(0, 1]``: for ``p > 1`` the kernel is not convex
        (``delta k''(delta) < 0`` for ``delta < ((p - 1) / (r1 p))^(1/p)``), so no pitch law
        exists (message starts with ``p``).
    TypeError
        A parameter not a real number.

    References
    ----------
    Chi et al. (2022), KERPLE; ``proofs_notes/general_kernels.md``.
    """

    r1: float
    p: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "r1", check_positive_float("r1", self.r1))
        p = check_positive_float("p", self.p)
        if p > 1.0:
            edge = ((p - 1.0) / (self.r1 * p)) ** (1.0 / p)
            raise ValueError(
                f"p: must be in (0, 1], got {p}: exp(-r1 r^p) with p > 1 is not convex "
                f"(delta k''(delta) < 0 for delta < {edge:.6g}), so it is not of Pólya type "
                "and no pitch law reproduces it"
            )
        object.__setattr__(self, "p", p)

    def _y(self, r):
        return self.r1 * _distance("r", r) ** self.p

    def k(self, r: ArrayLike) -> float | np.ndarray:
        return _out(np.exp(-self._y(r)))

    def dk(self, r: ArrayLike) -> float | np.ndarray:
        r = _distance("r", r)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = -self.r1 * self.p * r ** (self.p - 1.0) * np.exp(-self.r1 * r**self.p)
        return _out(out)

    def d2k(self, r: ArrayLike) -> float | np.ndarray:
        r = _distance("r", r)
        y = self.r1 * r**self.p
        with np.errstate(divide="ignore", invalid="ignore"):
            out = self.r1 * self.p * r ** (self.p - 2.0) * np.exp(-y) * (self.p * y + 1.0 - self.p)
        return _out(out)

    def k_mp(self, r: float | mpmath.mpf, dps: int = 50) -> mpmath.mpf:
        with mpmath.workdps(dps):
            return mpmath.exp(-mpmath.mpf(self.r1) * mpmath.mpf(r) ** mpmath.mpf(self.p))

    def d2k_mp(self, r: float | mpmath.mpf, dps: int = 50) -> mpmath.mpf:
        with mpmath.workdps(dps):
            a, p, r = mpmath.mpf(self.r1), mpmath.mpf(self.p), mpmath.mpf(r)
            y = a * r**p
            return a * p * r ** (p - 2) * mpmath.exp(-y) * (p * y + 1 - p)

    def pitch_cdf(self, delta: ArrayLike) -> float | np.ndarray:
        y = self._y(delta)
        return _out((1.0 - self.p) * gammainc(1.0, y) + self.p * gammainc(2.0, y))

    def pitch_sf(self, delta: ArrayLike) -> float | np.ndarray:
        y = self._y(delta)
        return _out((1.0 - self.p) * gammaincc(1.0, y) + self.p * gammaincc(2.0, y))

    def sample_pitch(self, rng: np.random.Generator, size: int | tuple) -> np.ndarray:
        """``(Y / r1)^(1/p)`` with ``Y ~ Gamma(1 + B)``, ``B ~ Bernoulli(p)`` drawn first."""
        _check_rng(rng)
        shape = 1.0 + (rng.random(size) < self.p)
        y = rng.standard_gamma(shape)
        return (y / self.r1) ** (1.0 / self.p)

    def mean_pitch(self) -> float:
        return float(2.0 * gamma(1.0 + 1.0 / self.p) * self.r1 ** (-1.0 / self.p))


@dataclass(frozen=True)
class Mixture(DistanceKernel):
    """``k = sum_i w_i k_i``: a mixture of Pólya kernels (e.g. several ALiBi slopes).

    The pitch density, the CDF and the mean mix with the same weights; a pitch is drawn by
    choosing component ``i`` with probability ``w_i`` and drawing from its law.

    Parameters
    ----------
    weights : sequence of float
        Non-negative, summing to 1 (within ``1e-12``); stored as a float tuple.
    kernels : sequence of DistanceKernel
        The components, as many as ``weights``.

    Raises
    ------
    ValueError
        Lengths differ or are 0; a negative weight (the mixture of pitch densities would be
        negative somewhere: not a pitch law, and the sum need not be convex), weights not
        summing to 1 (``k(0) = 1`` fails).
    TypeError
        A component is not a :class:`DistanceKernel`, a weight not a real number.

    References
    ----------
    SPEC section 8; ``proofs_notes/general_kernels.md``.
    """

    weights: tuple
    kernels: tuple

    def __post_init__(self) -> None:
        w = tuple(
            float(check_positive_float("weights", x, allow_zero=True))
            for x in _neg_ok(self.weights)
        )
        kern = tuple(self.kernels)
        if not kern or len(kern) != len(w):
            raise ValueError(
                f"kernels: need as many kernels as weights (>= 1), got {len(kern)} and {len(w)}"
            )
        for c in kern:
            if not isinstance(c, DistanceKernel):
                raise TypeError(f"kernels: each must be a DistanceKernel, got {type(c).__name__}")
        if abs(math.fsum(w) - 1.0) > 1e-12:
            raise ValueError(f"weights: must sum to 1 (k(0) = 1), got sum {math.fsum(w)!r}")
        object.__setattr__(self, "weights", w)
        object.__setattr__(self, "kernels", kern)

    def _mix(self, method: str, x):
        return _out(
            sum(w * np.asarray(getattr(c, method)(x)) for w, c in zip(self.weights, self.kernels))
        )

    def k(self, r: ArrayLike) -> float | np.ndarray:
        return self._mix("k", r)

    def dk(self, r: ArrayLike) -> float | np.ndarray:
        return self._mix("dk", r)

    def d2k(self, r: ArrayLike) -> float | np.ndarray:
        return self._mix("d2k", r)

    def k_mp(self, r: float | mpmath.mpf, dps: int = 50) -> mpmath.mpf:
        with mpmath.workdps(dps):
            return mpmath.fsum(
                mpmath.mpf(w) * c.k_mp(r, dps) for w, c in zip(self.weights, self.kernels)
            )

    def d2k_mp(self, r: float | mpmath.mpf, dps: int = 50) -> mpmath.mpf:
        with mpmath.workdps(dps):
            return mpmath.fsum(
                mpmath.mpf(w) * c.d2k_mp(r, dps) for w, c in zip(self.weights, self.kernels)
            )

    def pitch_cdf(self, delta: ArrayLike) -> float | np.ndarray:
        return self._mix("pitch_cdf", delta)

    def pitch_sf(self, delta: ArrayLike) -> float | np.ndarray:
        return self._mix("pitch_sf", delta)

    def sample_pitch(self, rng: np.random.Generator, size: int | tuple) -> np.ndarray:
        """Components ``rng.choice(len, size, p=weights)``, then each component's draws in order."""
        _check_rng(rng)
        comp = rng.choice(len(self.weights), size=size, p=np.asarray(self.weights))
        out = np.empty(np.shape(comp))
        for i, c in enumerate(self.kernels):
            hit = comp == i
            out[hit] = c.sample_pitch(rng, int(hit.sum()))
        return out

    def mean_pitch(self) -> float:
        return math.fsum(w * c.mean_pitch() for w, c in zip(self.weights, self.kernels) if w > 0)

    def _tail_integral(self, b: float) -> float:
        return math.fsum(
            w * c._tail_integral(b) for w, c in zip(self.weights, self.kernels) if w > 0
        )


def _neg_ok(weights):
    """The weights as reals; a negative one is refused with the reason."""
    out = []
    for x in weights:
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
            raise TypeError(f"weights: must be real numbers, got {type(x).__name__} {x!r}")
        if x < 0:
            raise ValueError(
                f"weights: must be >= 0, got {x}: with a negative weight the mixed pitch "
                "density sum w_i delta k_i''(delta) is not a density (negative somewhere or "
                "the sum not convex), so the mixture is not a random-binning kernel"
            )
        out.append(x)
    return out


# --------------------------------------------------------------------------------------
# Conditions, validation
# --------------------------------------------------------------------------------------


def check_polya(kernel: DistanceKernel, *, r_max: float = 1e12, num: int = 4001) -> DistanceKernel:
    """Check the Pólya conditions of the representation theorem on a grid; return ``kernel``.

    Conditions (``proofs_notes/general_kernels.md``, theorem 1), in this order:
    ``k(0) = 1``; ``k`` decreasing (``k' <= 0``); ``k`` convex (``delta k''(delta) >= 0``:
    the pitch density); ``k(r) -> 0`` and ``r k'(r) -> 0`` (at ``r_max``: ``k <= 0.01``,
    ``k(r_max) < k(r_max / 10)`` and ``|r k'(r)| <= 0.01``; a valid kernel decaying more
    slowly, e.g. KERPLE-log with a tiny ``r1``, needs a larger ``r_max``). Checked at 0 and
    on ``num`` geometric points from ``1e-6`` to ``r_max``, so a violation between grid
    points can be missed: a numerical check, not a proof. The built-in kernels are valid by
    their constructors' conditions.

    Parameters
    ----------
    kernel : DistanceKernel
        The kernel ``k(r)`` to check (its ``k``, ``dk``, ``d2k`` are evaluated in float64).
    r_max : float
        Largest distance checked, tokens, finite and > 0.
    num : int
        Grid points, ``>= 2``.

    Returns
    -------
    DistanceKernel
        ``kernel``, unchanged.

    Raises
    ------
    TypeError
        ``kernel`` is not a :class:`DistanceKernel`.
    ValueError
        The first violated condition, named, with the distance (message starts with
        ``kernel``), e.g. the Gaussian ``exp(-r^2)``: ``kernel: not convex ...``; a bad
        ``r_max`` or ``num`` (named).

    References
    ----------
    ``proofs_notes/general_kernels.md``, section 1 (theorem 1, the Pólya conditions).
    """
    if not isinstance(kernel, DistanceKernel):
        raise TypeError(f"kernel: must be a DistanceKernel, got {type(kernel).__name__}")
    r_max = check_positive_float("r_max", r_max)
    num = check_int("num", num, minimum=2)
    name = type(kernel).__name__
    k0 = float(kernel.k(np.float64(0.0)))
    if abs(k0 - 1.0) > 1e-12:
        raise ValueError(f"kernel: {name} has k(0) = {k0!r}, not 1 (condition k(0) = 1)")
    r = np.geomspace(1e-6, r_max, num)
    with np.errstate(all="ignore"):
        dk = np.asarray(kernel.dk(r))
        dens = r * np.asarray(kernel.d2k(r))
        kv = np.asarray(kernel.k(r))
    bad = np.flatnonzero(~(dk <= 0))
    if bad.size:
        raise ValueError(
            f"kernel: {name} is not decreasing: k'({r[bad[0]]:.6g}) = {dk[bad[0]]:.6g} > 0"
        )
    bad = np.flatnonzero(~(dens >= 0))
    if bad.size:
        raise ValueError(
            f"kernel: {name} is not convex: delta k''(delta) = {dens[bad[0]]:.6g} < 0 at "
            f"delta = {r[bad[0]]:.6g}, so delta k'' is not a pitch density (not of Pólya type)"
        )
    k_tenth = float(kernel.k(np.float64(r_max / 10.0)))
    if not (kv[-1] <= 0.01 and (kv[-1] < k_tenth or kv[-1] == 0.0)):
        raise ValueError(f"kernel: {name} does not tend to 0: k({r_max:g}) = {kv[-1]:.6g}")
    if not abs(r[-1] * dk[-1]) <= 0.01:
        raise ValueError(
            f"kernel: {name} has r k'(r) = {r[-1] * dk[-1]:.6g} at r = {r_max:g} "
            "(condition r k'(r) -> 0)"
        )
    return kernel


def is_builtin(kernel: DistanceKernel) -> bool:
    """Whether ``kernel`` is one of this module's kernels, valid by its constructor's checks.

    True for :class:`Exponential`, :class:`KerpleLog` and :class:`KerplePower` (their exact
    classes: a subclass may redefine ``k``) and a :class:`Mixture` of such; a user's
    :class:`DistanceKernel` subclass is False (:func:`check_kernels` with ``polya=True``
    then runs :func:`check_polya` on it).

    Parameters
    ----------
    kernel : DistanceKernel
        Any object (one that is not a built-in kernel gives False; nothing is raised).

    Returns
    -------
    bool

    References
    ----------
    ``proofs_notes/general_kernels.md``, section 2 (the pitch laws of the built-in kernels).
    """
    if type(kernel) is Mixture:
        return all(is_builtin(c) for c in kernel.kernels)
    return type(kernel) in (Exponential, KerpleLog, KerplePower)


def check_kernels(
    kernels: object, num_heads: int | None = None, *, name: str = "kernels", polya: bool = False
) -> tuple:
    """A sequence of kernels, one per head, as a tuple (validated).

    Parameters
    ----------
    kernels : sequence of DistanceKernel
        One per head.
    num_heads : int or None
        Required length (None: any length >= 1).
    name : str
        The argument's name in error messages.
    polya : bool
        Also run :func:`check_polya` on every kernel that is not :func:`is_builtin` (a
        user's subclass): a kernel that is not of Pólya type has no pitch law, and drawing
        partitions from it would give masks whose mean is not ``k``
        (``proofs_notes/general_kernels.md``, theorem 1).

    Returns
    -------
    tuple of DistanceKernel

    Raises
    ------
    TypeError
        ``kernels`` is a single kernel or not a sequence, or an entry is not a
        :class:`DistanceKernel`.
    ValueError
        Empty, or not ``num_heads`` long; with ``polya``, a kernel violating a Pólya
        condition (``"{name}: head {h}: ..."``, the condition named).

    References
    ----------
    ``proofs_notes/general_kernels.md``, section 1 (theorem 1).
    """
    if isinstance(kernels, DistanceKernel) or isinstance(kernels, (str, bytes)):
        raise TypeError(f"{name}: must be a sequence of DistanceKernel, one per head")
    try:
        out: tuple[Any, ...] = tuple(cast(Any, kernels))
    except TypeError:
        raise TypeError(
            f"{name}: must be a sequence of DistanceKernel, got {type(kernels).__name__}"
        ) from None
    if not out:
        raise ValueError(f"{name}: need at least one kernel (one per head)")
    for c in out:
        if not isinstance(c, DistanceKernel):
            raise TypeError(f"{name}: each must be a DistanceKernel, got {type(c).__name__}")
    if num_heads is not None and len(out) != num_heads:
        raise ValueError(f"{name}: need {num_heads} kernels (one per head), got {len(out)}")
    if polya:
        for h, kernel in enumerate(out):
            if is_builtin(kernel):
                continue
            try:
                check_polya(kernel)
            except ValueError as exc:
                reason = str(exc).removeprefix("kernel: ")
                raise ValueError(f"{name}: head {h}: {reason}") from None
    return out


def _check_kernel(kernel) -> DistanceKernel:
    if not isinstance(kernel, DistanceKernel):
        raise TypeError(f"kernel: must be a DistanceKernel, got {type(kernel).__name__}")
    return kernel


# --------------------------------------------------------------------------------------
# E[M] = K, E[M^2], variance
# --------------------------------------------------------------------------------------


def collision_probability_mp(
    kernel: DistanceKernel, distance: float, *, dps: int = 40
) -> mpmath.mpf:
    """``P(same bin) = int_r^inf (1 - r/delta) delta k''(delta) d delta`` by mpmath quadrature.

    Independent of ``kernel.k``: integrates the pitch density ``delta k''(delta)`` of
    :meth:`DistanceKernel.d2k_mp` (so it checks the representation theorem, not a formula).

    Parameters
    ----------
    kernel : DistanceKernel
        The kernel; only its :meth:`DistanceKernel.d2k_mp` is read.
    distance : float
        ``r >= 0``, tokens (finite).
    dps : int
        Decimal digits of the quadrature (the density is evaluated at ``dps + 10``).

    Returns
    -------
    mpmath.mpf
        ``P(same bin)`` at distance ``r``: ``kernel.k_mp(r)`` for a kernel of Pólya type
        (checked to a relative 1e-18 at ``dps = 25`` in ``tests/ref/test_kernels.py``).

    Raises
    ------
    TypeError, ValueError
        Bad ``kernel`` or ``distance < 0``.

    References
    ----------
    ``proofs_notes/general_kernels.md``, section 1 (theorem 1: ``P(same bin) = k(r)``).
    """
    kernel = _check_kernel(kernel)
    r0 = check_positive_float("distance", distance, allow_zero=True)
    with mpmath.workdps(dps):
        r = mpmath.mpf(r0)

        def integrand(u):  # delta = e^u: the density delta k'' times d delta = delta du
            d = mpmath.exp(u)
            return (1 - r / d) * d * d * kernel.d2k_mp(d, dps + 10)

        # log-pitch: the density is smooth there, with no endpoint singularity; the range
        # e^-3000..e^690 (the mass outside is below 1e-200 for the built-in kernels, p >= 0.1)
        lo = mpmath.log(r) if r > 0 else mpmath.mpf(-3000)
        grid = (-1000, -300, -100, -50, -20, -10, -5, -2, 0, 2, 5, 10, 20, 50, 100, 200, 400, 690)
        near = [lo + mpmath.mpf(10) ** e for e in range(-6, 1)]  # a sharp peak just above r
        pts = sorted({lo, *near, *[mpmath.mpf(e) for e in grid if e > lo + 1]})
        return mpmath.quad(integrand, pts)


def kernel_matrix(
    kernel: DistanceKernel,
    query_positions: ArrayLike,
    key_positions: ArrayLike,
    *,
    causal: bool = False,
) -> np.ndarray:
    """``E[M] = K``, ``K_ij = k(|p_i - p_j|)`` (times the causal 0/1 mask).

    Parameters
    ----------
    kernel : DistanceKernel
    query_positions, key_positions : array_like of int, shapes ``(n_q,)``, ``(n_k,)``
        Positions in tokens.
    causal : bool
        Zero where ``p_j > p_i``.

    Returns
    -------
    numpy.ndarray
        float64 ``(n_q, n_k)``.

    Raises
    ------
    TypeError, ValueError
        Bad kernel or positions.

    References
    ----------
    ``proofs_notes/general_kernels.md`` (theorem 1).
    """
    kernel = _check_kernel(kernel)
    causal = check_bool("causal", causal)
    qpos = as_positions("query_positions", query_positions)
    kpos = as_positions("key_positions", key_positions)
    dist = np.abs(qpos[:, None].astype(np.float64) - kpos[None, :].astype(np.float64))
    out = np.asarray(kernel.k(dist), dtype=np.float64).reshape(dist.shape)
    if causal:
        out = out * (kpos[None, :] <= qpos[:, None])
    return out


def expected_mask(
    kernels: object, query_positions: ArrayLike, key_positions: ArrayLike, *, causal: bool = False
) -> np.ndarray:
    """``E[M(h)]`` for every head: the kernel matrices, float64 ``(num_heads, n_q, n_k)``.

    Parameters
    ----------
    kernels : sequence of DistanceKernel
        One per head (``num_heads >= 1``).
    query_positions, key_positions : array_like of int
        Positions ``(n_q,)``, ``(n_k,)`` in tokens.
    causal : bool
        Zero where ``p_j > p_i``.

    Returns
    -------
    numpy.ndarray
        float64 ``(num_heads, n_q, n_k)``: head ``h`` is ``kernel_matrix(kernels[h], ...)``.

    Raises
    ------
    TypeError, ValueError
        As :func:`check_kernels` and :func:`kernel_matrix`.

    References
    ----------
    ``proofs_notes/general_kernels.md``, section 1 (theorem 1: ``E[M] = K``).
    """
    ks = check_kernels(kernels)
    return np.stack([kernel_matrix(c, query_positions, key_positions, causal=causal) for c in ks])


def expected_mask_square(kernel: DistanceKernel, n: int) -> np.ndarray:
    """``E[M^2]`` for one mask on positions ``0..n-1``: ``sum_l k(span(i, j, l))``.

    Three positions share a bin iff the two extremes do (bins are intervals), so
    ``E[M^2]_ij = (d + 1) k(d) + sum_{a=1}^{i} k(d + a) + sum_{a=1}^{n-1-j} k(d + a)`` for
    ``i <= j``, ``d = j - i``; ``O(n^2)`` with cumulative sums.

    Parameters
    ----------
    kernel : DistanceKernel
    n : int
        Number of positions, ``>= 1`` (the result takes ``8 n^2`` bytes).

    Returns
    -------
    numpy.ndarray
        float64 ``(n, n)``, symmetric.

    Raises
    ------
    TypeError, ValueError
        Bad kernel or ``n < 1``.

    References
    ----------
    ``proofs_notes/general_kernels.md``, section 3 (one mask squared).
    """
    kernel = _check_kernel(kernel)
    n = check_int("n", n, minimum=1)
    kv = np.asarray(kernel.k(np.arange(2 * n, dtype=np.float64)))
    c = np.concatenate([[0.0], np.cumsum(kv)])  # c[m] = sum_{r < m} k(r)
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    lo, hi = np.minimum(i, j), np.maximum(i, j)
    d = hi - lo
    left = c[d + lo + 1] - c[d + 1]
    right = c[d + (n - 1 - hi) + 1] - c[d + 1]
    return (d + 1) * kv[d] + left + right


def variance_proxy(kernel: DistanceKernel, n: int) -> float:
    """``v = ||E[(M - K)^2]||_2 = ||E[M^2] - K^2||_2`` on positions ``0..n-1`` (exact).

    The variance proxy of the matrix Bernstein bound, by ``eigvalsh`` of the ``(n, n)``
    matrix (``O(n^3)`` time, ``O(n^2)`` memory).

    Parameters
    ----------
    kernel : DistanceKernel
    n : int
        Number of positions, ``>= 1``.

    Returns
    -------
    float
        ``v >= 0`` (dimensionless: masks are 0/1).

    Raises
    ------
    TypeError, ValueError
        Bad kernel or ``n < 1``.

    References
    ----------
    ``proofs_notes/general_kernels.md``, section 7 (theorem 2.2 for a general kernel), and
    section 3 for ``E[M^2]``.
    """
    n = check_int("n", n, minimum=1)
    pos = np.arange(n)
    kmat = kernel_matrix(kernel, pos, pos)
    e = expected_mask_square(kernel, n) - kmat @ kmat
    w = np.linalg.eigvalsh(e)
    return float(max(abs(w[0]), abs(w[-1])))


def _stratum_edges(kernel, m):
    k = np.arange(m + 1, dtype=np.float64)
    return np.asarray(kernel.pitch_quantile(k / m, (m - k) / m))


def _partial_collision(kernel, lo, hi, x):
    """``int_{max(lo,x)}^{hi} (1 - x/delta) p(delta) d delta = [F] - x [k']`` (broadcast)."""
    a = np.maximum(lo, x)
    with np.errstate(invalid="ignore"):
        mass = np.where(
            a < 1.0,  # any split works; the sf difference is the accurate one in the tail
            np.asarray(kernel.pitch_cdf(hi)) - np.asarray(kernel.pitch_cdf(a)),
            np.asarray(kernel.pitch_sf(a)) - np.asarray(kernel.pitch_sf(hi)),
        )
        dk_hi = np.where(np.isinf(hi), 0.0, np.asarray(kernel.dk(np.where(np.isinf(hi), 1.0, hi))))
        # x = 0: no x [k'] term (k'(0) may be -inf, as for KERPLE-power: 0 * inf is not 0)
        slope_term = np.where(x == 0, 0.0, x * (dk_hi - np.asarray(kernel.dk(a))))
        out = mass - slope_term
    return np.where(a < hi, out, 0.0)


def entry_variance(
    kernel: DistanceKernel,
    distance: ArrayLike,
    num_samples: int,
    *,
    sampler: str = "iid",
    group_size: int | None = None,
) -> float | np.ndarray:
    """Exact ``Var(M~_ij)`` at ``distance`` for ``kernel`` under ``sampler``.

    As :func:`plsh_ref.samplers.entry_variance` (the ALiBi case, which this equals for
    :class:`Exponential`) with the stratum integrals in closed form for any kernel:
    ``int_a^b (1 - x/delta) delta k''(delta) d delta = F(b) - F(a) - x (k'(b) - k'(a))``
    (``proofs_notes/general_kernels.md``, section 3). ``"iid"``: ``k (1 - k) / s``.

    Parameters
    ----------
    kernel : DistanceKernel
    distance : array_like of float
        ``r >= 0``, tokens (finite).
    num_samples : int
        ``s >= 1``.
    sampler : {"iid", "stratified", "shared"}
        The sampler (:mod:`plsh_ref.samplers`).
    group_size : int, optional
        ``s'`` offsets per pitch (divides ``s``); default as
        :func:`plsh_ref.samplers.resolve_group_size`.

    Returns
    -------
    float or numpy.ndarray
        float64 variance ``>= 0``, the shape of ``distance`` (a float for a scalar).

    Raises
    ------
    TypeError, ValueError
        Bad kernel, distance, ``num_samples``, ``sampler`` or ``group_size``.

    References
    ----------
    ``proofs_notes/general_kernels.md``, sections 3 (correlated samplers) and 8;
    ``proofs_notes/samplers.md``.
    """
    from .samplers import group_moments, resolve_group_size

    kernel = _check_kernel(kernel)
    r = _distance("distance", distance)
    s = check_int("num_samples", num_samples, minimum=1)
    g = resolve_group_size(sampler, s, group_size)
    m = s // g
    if sampler == "iid":
        kv = np.asarray(kernel.k(r))
        return _out(kv * (1.0 - kv) / s)
    if sampler == "stratified":
        edges = _stratum_edges(kernel, m)
        lo, hi, weight = edges[:-1], edges[1:], float(m)
    else:
        lo, hi, weight = np.array([0.0]), np.array([np.inf]), 1.0
    gk, second = group_moments(lambda x: _partial_collision(kernel, lo, hi, x), r, g, weight)
    var = (
        np.sum(second - gk**2, axis=-1) / m**2
        if sampler == "stratified"
        else (second - gk**2)[..., 0] / m
    )
    return _out(np.maximum(var, 0.0))


def frobenius_error_square(
    kernel: DistanceKernel,
    n: int,
    num_samples: int,
    *,
    sampler: str = "iid",
    group_size: int | None = None,
) -> float:
    """Exact ``E||M~ - K||_F^2`` on positions ``0..n-1`` (bidirectional).

    ``sum_{r=1}^{n-1} 2 (n - r) Var_r`` with ``Var_r`` from :func:`entry_variance`.

    Parameters
    ----------
    kernel : DistanceKernel
    n : int
        Number of positions, ``>= 1``.
    num_samples, sampler, group_size
        As :func:`entry_variance`.

    Returns
    -------
    float
        ``E||M~ - K||_F^2 >= 0`` (0 at ``n = 1``).

    Raises
    ------
    TypeError, ValueError
        As :func:`entry_variance`; ``n < 1``.

    References
    ----------
    ``proofs_notes/general_kernels.md``, section 3.
    """
    n = check_int("n", n, minimum=1)
    if n == 1:
        return 0.0
    r = np.arange(1, n, dtype=np.float64)
    var = entry_variance(kernel, r, num_samples, sampler=sampler, group_size=group_size)
    return float(np.sum(2.0 * (n - r) * var))


# --------------------------------------------------------------------------------------
# Block, largest-pitch and window laws
# --------------------------------------------------------------------------------------


def block_extent_sf(kernel: DistanceKernel, b: ArrayLike) -> float | np.ndarray:
    """``P(R >= b) = k(b)``: tail of the right (or left) extent of the block of a position.

    ``P(L >= a, R >= b) = k(a + b)`` (positions ``x - a`` and ``x + b`` share the bin).

    Parameters
    ----------
    kernel : DistanceKernel
    b : float or array_like
        Extents ``b >= 0``, tokens.

    Returns
    -------
    float or numpy.ndarray
        float64 probabilities, the shape of ``b``.

    Raises
    ------
    TypeError, ValueError
        Bad kernel or ``b < 0``.

    References
    ----------
    ``proofs_notes/general_kernels.md``, section 4.
    """
    return _check_kernel(kernel).k(_distance("b", b))


def block_size_pmf(kernel: DistanceKernel, size: ArrayLike) -> float | np.ndarray:
    """``P(K = j) = j (k(j-1) - 2 k(j) + k(j+1))``: size of the block containing a position.

    Parameters
    ----------
    kernel : DistanceKernel
    size : int or array_like of int
        Block sizes ``j >= 1``, tokens.

    Returns
    -------
    float or numpy.ndarray
        float64 probabilities, the shape of ``size``.

    Raises
    ------
    TypeError, ValueError
        Bad kernel or ``size`` not an integer ``>= 1``.

    References
    ----------
    ``proofs_notes/general_kernels.md``, section 4 (block-size law).
    """
    kernel = _check_kernel(kernel)
    j = _as_array("size", size)
    if np.any(j < 1) or np.any(j != np.floor(j)):
        raise ValueError("size: block sizes are integers >= 1")
    return _out(
        j
        * (np.asarray(kernel.k(j - 1)) - 2 * np.asarray(kernel.k(j)) + np.asarray(kernel.k(j + 1)))
    )


def block_size_mean(kernel: DistanceKernel, n: int | None = None) -> float:
    """``E[K] = 1 + 2 sum_{b >= 1} k(b)`` (infinite line; ``inf`` if divergent).

    With ``n`` given: the partial sum ``1 + 2 sum_{b=1}^{n-1} k(b)``, the mean block size at
    the centre of ``n`` positions is at most this.

    Parameters
    ----------
    kernel : DistanceKernel
    n : int, optional
        Number of positions, ``>= 1`` (None: the infinite line).

    Returns
    -------
    float
        Tokens; ``inf`` where the series diverges (KERPLE-log with ``r1 <= 1``).

    Raises
    ------
    TypeError, ValueError
        Bad kernel or ``n``.

    References
    ----------
    ``proofs_notes/general_kernels.md``, section 4.
    """
    kernel = _check_kernel(kernel)
    if n is not None:
        n = check_int("n", n, minimum=1)
        return float(1.0 + 2.0 * np.sum(kernel.k(np.arange(1, n, dtype=np.float64))))
    # integral test: sum_{b>=1} k(b) is finite iff int_1^inf k is
    tail = kernel._tail_integral(1.0)
    if not math.isfinite(tail):
        return math.inf
    b = np.arange(1, 200001, dtype=np.float64)
    head = float(np.sum(kernel.k(b)))
    return 1.0 + 2.0 * (head + kernel._tail_integral(200000.5))


def largest_pitch_sf(kernel: DistanceKernel, b: ArrayLike, num_samples: int) -> float | np.ndarray:
    """``P(max_t delta_t > b) = 1 - F(b)^s`` for ``s`` independent pitches.

    Parameters
    ----------
    kernel : DistanceKernel
    b : float or array_like
        Pitch levels ``b >= 0``, tokens.
    num_samples : int
        ``s >= 1`` independent pitches (the iid sampler).

    Returns
    -------
    float or numpy.ndarray
        float64 probabilities, the shape of ``b``.

    Raises
    ------
    TypeError, ValueError
        Bad kernel, ``b < 0`` or ``num_samples < 1``.

    References
    ----------
    ``proofs_notes/general_kernels.md``, section 5.
    """
    kernel = _check_kernel(kernel)
    s = check_int("num_samples", num_samples, minimum=1)
    sf = np.asarray(kernel.pitch_sf(_distance("b", b)))
    return _out(-np.expm1(s * np.log1p(-np.minimum(sf, 1.0))))


def largest_pitch_quantile(kernel: DistanceKernel, q: float, num_samples: int) -> float:
    """The ``q``-quantile of the largest of ``s`` independent pitches: ``F^-1(q^(1/s))``.

    For :class:`KerpleLog` it grows like ``((r1 + 1) s / (1 - q))^(1/r1) / r2`` (a power of
    ``s``) against ``sigma ln s`` for ALiBi.

    Parameters
    ----------
    kernel : DistanceKernel
    q : float
        Probability in ``(0, 1)``.
    num_samples : int
        ``s >= 1`` independent pitches.

    Returns
    -------
    float
        The quantile, tokens (from the upper probability ``1 - q^(1/s)``, no cancellation).

    Raises
    ------
    TypeError, ValueError
        Bad kernel, ``q`` outside ``(0, 1)``, ``num_samples < 1``.

    References
    ----------
    ``proofs_notes/general_kernels.md``, section 5.
    """
    kernel = _check_kernel(kernel)
    q = check_probability("q", q)
    s = check_int("num_samples", num_samples, minimum=1)
    up = -math.expm1(math.log(q) / s)
    return float(kernel.pitch_quantile(np.array(1.0 - up), np.array(up)))


def expected_window_width(kernel: DistanceKernel, num_samples: int, n: int) -> np.ndarray:
    """Expected fused window per query (keys with ``C_ij > 0``), positions ``0..n-1``.

    ``1 + c[i] + c[n - 1 - i]`` with ``c[m] = sum_{r=1}^{m} (1 - (1 - k(r))^s)`` (the
    extents of the ``s`` blocks of a query are independent with ``P(R >= r) = k(r)``).
    For :class:`KerpleLog` with ``r1 <= 1`` it grows without bound in ``n``.

    Parameters
    ----------
    kernel : DistanceKernel
    num_samples : int
        ``s >= 1`` independent binnings.
    n : int
        Number of positions, ``>= 1``.

    Returns
    -------
    numpy.ndarray
        float64 ``(n,)``, keys per query (between 1 and ``n``).

    Raises
    ------
    TypeError, ValueError
        Bad kernel, ``num_samples`` or ``n``.

    References
    ----------
    ``proofs_notes/general_kernels.md``, section 6.
    """
    kernel = _check_kernel(kernel)
    s = check_int("num_samples", num_samples, minimum=1)
    n = check_int("n", n, minimum=1)
    kv = np.asarray(kernel.k(np.arange(1, n, dtype=np.float64)))
    reach = -np.expm1(s * np.log1p(-np.minimum(kv, 1.0)))
    c = np.concatenate([[0.0], np.cumsum(reach)])
    i = np.arange(n)
    return 1.0 + c[i] + c[n - 1 - i]


def expected_max_extent(kernel: DistanceKernel, num_samples: int, limit: int) -> float:
    """``E[min(max_t R_t, limit)] = sum_{r=1}^{limit} (1 - (1 - k(r))^s)``.

    ``R_t`` is the right (or, by symmetry, left) extent of the block of a fixed position
    under hash ``t``, ``P(R_t >= r) = k(r)``, independent over ``t``. The mean halo of a
    chunk edge (``proofs_notes/halo_bound.md``) and the mean decoding cache length minus one
    (``proofs_notes/decoding_cache.md``) are this with ``limit`` the positions available.
    For :class:`KerpleLog` with ``r1 <= 1`` it diverges as ``limit -> inf`` (about
    ``s limit^(1 - r1) r2^(-r1) / (1 - r1)``).

    Parameters
    ----------
    kernel : DistanceKernel
    num_samples : int
        ``s >= 1`` independent binnings.
    limit : int
        Positions available on the side, ``>= 0``.

    Returns
    -------
    float
        Tokens, in ``[0, limit]``.

    Raises
    ------
    TypeError, ValueError
        Bad kernel, ``num_samples < 1`` or ``limit < 0``.

    References
    ----------
    ``proofs_notes/general_kernels.md`` (section 6).
    """
    kernel = _check_kernel(kernel)
    s = check_int("num_samples", num_samples, minimum=1)
    limit = check_int("limit", limit, minimum=0)
    kv = np.asarray(kernel.k(np.arange(1, limit + 1, dtype=np.float64)))
    return float(np.sum(-np.expm1(s * np.log1p(-np.minimum(kv, 1.0)))))
