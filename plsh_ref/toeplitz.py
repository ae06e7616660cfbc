"""Spectra of ``L*`` (the Kac-Murdock-Szego matrix) and of one mask ``M(h)``.

For aligned positions ``0..n-1`` and bidirectional attention, ``L*_ij = rho^|i-j|`` with
``rho = exp(-1/sigma)`` is the Kac-Murdock-Szego (KMS) Toeplitz matrix. Its symbol is
``f(theta) = (1 - rho^2) / (1 - 2 rho cos theta + rho^2)`` and its eigenvalues are
``f(theta_k)``, ``k = 1..n``, where ``theta_k`` is the unique root in
``[(k-1) pi / n, k pi / (n+1)]`` of the secular equation::

    g(theta) = sin((n+1) theta) - 2 rho sin(n theta) + rho^2 sin((n-1) theta) = 0,

with eigenvector ``x_j = sin(j theta_k) - rho sin((j-1) theta_k)``, ``j = 1..n``. The inverse
is ``tridiag(-rho, 1 + rho^2, -rho) / (1 - rho^2)`` with corner entries ``1 / (1 - rho^2)``,
and ``det L* = (1 - rho^2)^(n-1)``. One mask ``M(h)`` is block diagonal with all-ones blocks,
so its spectrum is its list of block sizes padded with zeros.

Derivations: ``proofs_notes/kms_spectrum.md``. Sources: Kac, Murdock & Szego (1953),
*On the eigenvalues of certain Hermitian forms*; Grenander & Szego (1958), *Toeplitz
forms and their applications*.
"""

from __future__ import annotations

import math
from typing import Any

import mpmath
import numpy as np
from numpy.typing import ArrayLike

from .partition import PartitionSample, block_sizes
from .validation import as_float_array, check_dps, check_int, check_positive_float

__all__ = [
    "kms_angles",
    "kms_angles_mp",
    "kms_determinant",
    "kms_eigenvalues",
    "kms_eigenvalues_mp",
    "kms_eigenvectors",
    "kms_inverse",
    "kms_log_determinant",
    "kms_secular",
    "kms_spectral_norm_limit",
    "kms_symbol",
    "kms_symbol_bounds",
    "mask_spectrum",
]


def _check(n, sigma) -> tuple[int, float]:
    return check_int("n", n, minimum=1), check_positive_float("sigma", sigma)


def kms_symbol(theta: ArrayLike, sigma: float) -> float | np.ndarray:
    """The symbol ``f(theta) = sum_k rho^|k| e^(i k theta) = (1 - rho^2) / (1 - 2 rho cos theta + rho^2)``.

    Parameters
    ----------
    theta : float or array_like
        Angles in radians.
    sigma : float
        Length scale in tokens, > 0 (``rho = exp(-1/sigma)``).

    Returns
    -------
    float or numpy.ndarray
        float64, shape of ``theta``.

    Raises
    ------
    ValueError, TypeError
        Bad ``sigma`` or non-finite ``theta``.

    References
    ----------
    ``proofs_notes/kms_spectrum.md``.
    """
    sigma = check_positive_float("sigma", sigma)
    th = as_float_array("theta", theta)
    rho = math.exp(-1.0 / sigma)
    # 1 - 2 rho cos + rho^2 = (1 - rho)^2 + 4 rho sin^2(theta/2): no cancellation near 0.
    one_minus_rho = -math.expm1(-1.0 / sigma)
    out = one_minus_rho * (1.0 + rho) / (one_minus_rho**2 + 4.0 * rho * np.sin(th / 2) ** 2)
    return float(out) if out.ndim == 0 else out


def kms_symbol_bounds(sigma: float) -> tuple[float, float]:
    """``(min f, max f) = ((1 - rho)/(1 + rho), (1 + rho)/(1 - rho)) = (tanh(1/(2 sigma)), coth(1/(2 sigma)))``.

    Every eigenvalue of ``L*`` (any ``n``) lies strictly inside this interval.

    Raises
    ------
    ValueError, TypeError
        Bad ``sigma``.

    References
    ----------
    ``proofs_notes/kms_spectrum.md``.
    """
    sigma = check_positive_float("sigma", sigma)
    t = math.tanh(0.5 / sigma)
    return t, 1.0 / t


def kms_spectral_norm_limit(sigma: float) -> float:
    """``lim_n ||L*_n||_2 = f(0) = coth(1 / (2 sigma))``; the norms increase to it with ``n``.

    Raises
    ------
    ValueError, TypeError
        Bad ``sigma``.

    References
    ----------
    ``proofs_notes/kms_spectrum.md``.
    """
    return kms_symbol_bounds(sigma)[1]


def kms_secular(theta: ArrayLike, n: int, sigma: float) -> float | np.ndarray:
    """The secular function ``g(theta) = sin((n+1) theta) - 2 rho sin(n theta) + rho^2 sin((n-1) theta)``.

    Its roots in ``(0, pi)`` are the angles of the eigenvalues of ``L*`` (float64).

    Raises
    ------
    ValueError, TypeError
        Bad ``n``, ``sigma`` or ``theta``.

    References
    ----------
    ``proofs_notes/kms_spectrum.md``, section 3 (the secular equation); SPEC section 4.
    """
    n, sigma = _check(n, sigma)
    th = as_float_array("theta", theta)
    rho = math.exp(-1.0 / sigma)
    out = np.sin((n + 1) * th) - 2 * rho * np.sin(n * th) + rho**2 * np.sin((n - 1) * th)
    return float(out) if out.ndim == 0 else out


def _reduced_secular_np(theta: np.ndarray, n: int, sigma: float) -> np.ndarray:
    """``g(theta) / sin(theta)`` in a cancellation-free form.

    With ``sin((n+1)t) = 2 cos t sin(nt) - sin((n-1)t)``::

        g(t) = 2 (cos t - rho) sin(n t) - (1 - rho^2) sin((n-1) t),

    and ``cos t - rho = (1 - rho) - 2 sin^2(t/2)`` is formed without cancellation when
    ``rho`` is close to 1. Dividing by ``sin t`` removes the spurious root ``t = 0``; the
    value there is the limit ``(1 - rho)(2n - (1 + rho)(n - 1)) > 0``.
    """
    rho = math.exp(-1.0 / sigma)
    one_minus_rho = -math.expm1(-1.0 / sigma)
    cos_minus_rho = one_minus_rho - 2.0 * np.sin(theta / 2) ** 2
    g = 2.0 * cos_minus_rho * np.sin(n * theta) - one_minus_rho * (1 + rho) * np.sin(
        (n - 1) * theta
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        out = g / np.sin(theta)
    limit = one_minus_rho * (2 * n - (1 + rho) * (n - 1))
    return np.where(theta == 0, limit, out)


def _brackets(n: int):
    k = np.arange(1, n + 1, dtype=np.float64)
    return (k - 1) * np.pi / n, k * np.pi / (n + 1)


def kms_angles(n: int, sigma: float) -> np.ndarray:
    """The angles ``theta_1 < ... < theta_n`` of the KMS eigenvalues, in float64.

    Bisection on all ``n`` interlacing brackets ``[(k-1) pi/n, k pi/(n+1)]`` at once,
    on the reduced secular function ``g(theta)/sin(theta)``, run until the brackets stop
    shrinking (full binary64 resolution of ``theta``). ``O(n^2)`` work.

    Parameters
    ----------
    n : int
        Matrix size, ``>= 1``.
    sigma : float
        Length scale, > 0.

    Returns
    -------
    numpy.ndarray
        float64, shape ``(n,)``, increasing, in ``(0, pi)``.

    Raises
    ------
    ValueError, TypeError
        ``n < 1`` or bad ``sigma``.

    References
    ----------
    ``proofs_notes/kms_spectrum.md``.
    """
    n, sigma = _check(n, sigma)
    lo, hi = _brackets(n)
    f_lo = _reduced_secular_np(lo, n, sigma)
    # up to ~1100 halvings: the first bracket starts at 0 and its root theta_1 ~ sqrt(2/sigma)
    # can lie far below 2^-200 (200 steps gave wrong eigenvalues for sigma >= 1e120)
    for _ in range(1100):
        mid = 0.5 * (lo + hi)
        if np.all((mid == lo) | (mid == hi)):
            break
        f_mid = _reduced_secular_np(mid, n, sigma)
        left = np.sign(f_mid) == np.sign(f_lo)
        lo = np.where(left, mid, lo)
        f_lo = np.where(left, f_mid, f_lo)
        hi = np.where(left, hi, mid)
    return 0.5 * (lo + hi)


def kms_eigenvalues(n: int, sigma: float) -> np.ndarray:
    """Eigenvalues of ``L*`` (``n x n`` KMS matrix), float64, in decreasing order.

    ``f(theta_k)`` for the angles of :func:`kms_angles`. Agrees with
    ``numpy.linalg.eigvalsh`` to a few ulps of ``||L*||`` (``tests/ref/test_toeplitz.py``).

    Parameters
    ----------
    n : int
        ``>= 1``.
    sigma : float
        > 0.

    Returns
    -------
    numpy.ndarray
        float64, shape ``(n,)``, decreasing, inside :func:`kms_symbol_bounds`.

    Raises
    ------
    ValueError, TypeError
        ``n < 1`` or bad ``sigma``.

    References
    ----------
    Kac, Murdock & Szego (1953); ``proofs_notes/kms_spectrum.md``.
    """
    return np.asarray(kms_symbol(kms_angles(n, sigma), sigma))


def _secular_mp(theta, n: int, rho, one_minus_rho):
    """``g(theta)`` at the working precision, in the form of :func:`_reduced_secular_np`."""
    cos_minus_rho = one_minus_rho - 2 * mpmath.sin(theta / 2) ** 2
    return 2 * cos_minus_rho * mpmath.sin(n * theta) - one_minus_rho * (1 + rho) * mpmath.sin(
        (n - 1) * theta
    )


def kms_angles_mp(n: int, sigma: float | mpmath.mpf, *, dps: int = 50) -> list:
    """The KMS angles at ``dps`` decimal digits (mpmath), increasing.

    Each root is found by the Anderson-Bjorck bracketing method (``mpmath.findroot``,
    ``solver='anderson'``) on its interlacing bracket ``[(k-1) pi/n, k pi/(n+1)]``, applied
    to ``g(theta) / sin(theta)`` (for ``k = 1`` the bracket starts just above 0).
    mpmath's global precision is restored on exit.

    Parameters
    ----------
    n : int
        ``1 <= n``; cost ``O(n^2)`` multiprecision operations (keep ``n <= 64`` in tests).
    sigma : float or mpmath.mpf
        Length scale, > 0 (binary64 value taken exactly).
    dps : int
        Decimal digits, ``>= 15``.

    Returns
    -------
    list of mpmath.mpf
        ``n`` angles in ``(0, pi)``.

    Raises
    ------
    ValueError, TypeError
        ``n < 1``, bad ``sigma``, ``dps < 15``.

    References
    ----------
    ``proofs_notes/kms_spectrum.md``.
    """
    n = check_int("n", n, minimum=1)
    dps = check_dps(dps)
    sig_mp = (
        sigma if isinstance(sigma, mpmath.mpf) else mpmath.mpf(check_positive_float("sigma", sigma))
    )
    if not (mpmath.isfinite(sig_mp) and sig_mp > 0):
        raise ValueError(f"sigma: must be finite and > 0, got {sigma}")
    out = []
    # for a huge sigma the roots k >= 2 lie within ~1/sigma of (k-1) pi/n: resolve them
    # with log10(sigma) more digits (else g/sin at (k-1) pi/n is a rounding error)
    extra = max(0, int(mpmath.ceil(mpmath.log10(sig_mp))))
    with mpmath.workdps(dps + 10 + extra):
        rho = mpmath.exp(-1 / sig_mp)
        one_minus_rho = -mpmath.expm1(-1 / sig_mp)

        def reduced(t):
            return _secular_mp(t, n, rho, one_minus_rho) / mpmath.sin(t)

        def first(t):
            # on (0, pi/(n+1)) g / sin is of the size of its value (1 - rho)(n + 1) at 0:
            # scaled to O(n), findroot's absolute stopping rule |f| < tol gives dps digits
            # of theta_1 ~ sqrt(2 / (n sigma)) also for a huge sigma
            return reduced(t) / one_minus_rho

        for k in range(1, n + 1):
            lo = (k - 1) * mpmath.pi / n if k > 1 else mpmath.pi / (n + 1) * mpmath.mpf(2) ** (-dps)
            hi = k * mpmath.pi / (n + 1)
            # k = 1: g also vanishes at 0, so solve g / sin (> 0 on (0, theta_1)) from just
            # inside; for a huge sigma theta_1 lies below pi/(n+1) 2^-dps: move the bracket
            # down until its start is below the root
            while k == 1 and not reduced(lo) > 0:
                lo, hi = lo * mpmath.mpf(2) ** (-dps), lo
            # k = 1: solve for theta / hi, as findroot's stopping rule on the bracket's
            # length is absolute (theta_1 can be far below 1)
            scale = hi if k == 1 else 1

            def scaled(u: Any, scale: Any = scale) -> Any:
                return first(u * scale)

            root = scale * mpmath.findroot(
                scaled if k == 1 else reduced,
                (lo / scale, hi / scale),
                solver="anderson",
                tol=mpmath.mpf(10) ** (-(dps + 5)),
                maxsteps=400,
            )
            if not lo <= root <= hi:  # pragma: no cover - bracketing solvers stay inside
                raise ArithmeticError(f"root {k} left its bracket")
            out.append(root)
    with mpmath.workdps(dps):
        return [+t for t in out]


def kms_eigenvalues_mp(n: int, sigma: float | mpmath.mpf, *, dps: int = 50) -> list:
    """Eigenvalues ``f(theta_k)`` of ``L*`` at ``dps`` digits, decreasing (mpmath).

    Arguments and errors as :func:`kms_angles_mp`; returns a list of ``mpmath.mpf``.
    mpmath's global precision is restored on exit.

    References
    ----------
    ``proofs_notes/kms_spectrum.md``.
    """
    angles = kms_angles_mp(n, sigma, dps=dps)
    with mpmath.workdps(dps + 10):
        sig_mp = sigma if isinstance(sigma, mpmath.mpf) else mpmath.mpf(float(sigma))
        rho = mpmath.exp(-1 / sig_mp)
        one_minus_rho = -mpmath.expm1(-1 / sig_mp)
        # (1 - rho^2) / (1 - 2 rho cos t + rho^2) without cancellation when rho ~ 1
        vals = [
            one_minus_rho * (1 + rho) / (one_minus_rho**2 + 4 * rho * mpmath.sin(t / 2) ** 2)
            for t in angles
        ]
    with mpmath.workdps(dps):
        return [+v for v in vals]


def kms_eigenvectors(n: int, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """Eigenpairs of ``L*``: ``x_j = sin(j theta_k) - rho sin((j-1) theta_k)``, normalised.

    Parameters
    ----------
    n : int
        ``>= 1``.
    sigma : float
        > 0.

    Returns
    -------
    (eigenvalues, eigenvectors) : tuple of numpy.ndarray
        float64 ``(n,)`` decreasing, and ``(n, n)`` with unit columns (column ``k`` for
        eigenvalue ``k``), so that ``L* V = V diag(eigenvalues)``.

    Raises
    ------
    ValueError, TypeError
        ``n < 1`` or bad ``sigma``.

    References
    ----------
    ``proofs_notes/kms_spectrum.md``.
    """
    n, sigma = _check(n, sigma)
    theta = kms_angles(n, sigma)
    rho = math.exp(-1.0 / sigma)
    j = np.arange(1, n + 1, dtype=np.float64)[:, None]
    vec = np.sin(j * theta[None, :]) - rho * np.sin((j - 1) * theta[None, :])
    vec /= np.linalg.norm(vec, axis=0, keepdims=True)
    return np.asarray(kms_symbol(theta, sigma)), vec


def kms_inverse(n: int, sigma: float) -> np.ndarray:
    """``L*^-1 = tridiag(-rho, 1 + rho^2, -rho) / (1 - rho^2)`` with corner diagonal entries ``1/(1 - rho^2)``.

    Parameters
    ----------
    n : int
        ``>= 1`` (``n = 1`` gives ``[[1]]``).
    sigma : float
        > 0.

    Returns
    -------
    numpy.ndarray
        float64, ``(n, n)``, symmetric tridiagonal.

    Raises
    ------
    ValueError, TypeError
        ``n < 1`` or bad ``sigma``.

    References
    ----------
    ``proofs_notes/kms_spectrum.md`` (the inverse of an AR(1) covariance).
    """
    n, sigma = _check(n, sigma)
    rho = math.exp(-1.0 / sigma)
    one_minus_rho2 = -math.expm1(-2.0 / sigma)
    out = np.zeros((n, n))
    if n == 1:
        out[0, 0] = 1.0
        return out
    idx = np.arange(n)
    out[idx, idx] = 1.0 + rho**2
    out[0, 0] = out[-1, -1] = 1.0
    out[idx[:-1], idx[1:]] = -rho
    out[idx[1:], idx[:-1]] = -rho
    return out / one_minus_rho2


def kms_log_determinant(n: int, sigma: float) -> float:
    """``log det L* = (n - 1) log(1 - rho^2)`` (natural log; never underflows).

    Raises
    ------
    ValueError, TypeError
        ``n < 1`` or bad ``sigma``.

    References
    ----------
    ``proofs_notes/kms_spectrum.md``.
    """
    n, sigma = _check(n, sigma)
    return (n - 1) * math.log(-math.expm1(-2.0 / sigma))


def kms_determinant(n: int, sigma: float) -> float:
    """``det L* = (1 - rho^2)^(n-1)``, ``rho = exp(-1/sigma)`` (float).

    May underflow to 0 for large ``n``; see :func:`kms_log_determinant`, whose arguments
    and errors (``n < 1``, sigma not finite and > 0) this shares.

    References
    ----------
    ``proofs_notes/kms_spectrum.md``.
    """
    return math.exp(kms_log_determinant(n, sigma))


def mask_spectrum(
    partition: PartitionSample, positions: ArrayLike, head: int = 0, sample: int = 0
) -> np.ndarray:
    """Eigenvalues of one mask ``M(h)`` (bidirectional, square on ``positions``).

    ``M(h)`` is, up to a permutation, block diagonal with all-ones blocks; a ``k x k``
    all-ones block has eigenvalues ``k, 0, ..., 0``. So the spectrum is the list of block
    sizes (from :func:`plsh_ref.partition.block_sizes`) followed by ``n - #blocks`` zeros,
    and ``||M(h)||_2`` is the largest block.

    Parameters
    ----------
    partition : PartitionSample
    positions : array_like of int, shape ``(n,)``
    head, sample : int
        Which hash function.

    Returns
    -------
    numpy.ndarray
        float64, shape ``(n,)``, decreasing.

    Raises
    ------
    TypeError, ValueError
        If ``partition`` is not a PartitionSample, ``head``/``sample`` out of range, or
        positions invalid.

    References
    ----------
    ``proofs_notes/kms_spectrum.md`` (last section).
    """
    if not isinstance(partition, PartitionSample):
        raise TypeError(f"partition: must be a PartitionSample, got {type(partition).__name__}")
    head = check_int("head", head, minimum=0)
    sample = check_int("sample", sample, minimum=0)
    if head >= partition.num_heads:
        raise ValueError(f"head: must be < num_heads={partition.num_heads}, got {head}")
    if sample >= partition.num_samples:
        raise ValueError(f"sample: must be < num_samples={partition.num_samples}, got {sample}")
    sizes = block_sizes(partition.heads(head, head + 1), positions)[0][sample]
    n = int(sizes.sum())
    out = np.zeros(n)
    out[: sizes.size] = np.sort(sizes)[::-1]
    return out
