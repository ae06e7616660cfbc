"""Independent oracles for the plsh_ref tests.

Nothing here calls the function it checks: slopes come from Press et al.'s rule written
out with exact rational exponents, binary64 rounding is done with integers, and attention
is the dense formula ``D^-1 (A o W) V`` without the max-shift of the implementation.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np

from plsh_ref.kernels import DistanceKernel

__all__ = [
    "binary64_bin",
    "dense_weighted_attention",
    "exact_rational_bin",
    "mp_slope",
    "press_slope_exponents",
    "random_qkv",
    "round_to_double",
]


def press_slope_exponents(num_heads: int) -> list[Fraction]:
    """Exponents ``e_h`` with ``m_h = 2^e_h`` by the rule of Press et al. (ICLR 2022).

    Power of two ``H``: geometric sequence starting at ``2^(-8/H)`` with ratio ``2^(-8/H)``.
    Otherwise: the ``c`` slopes for the largest power of two ``c < H``, then every other
    slope (``0, 2, 4, ...``) of the ``2c`` sequence, the first ``H - c`` of them.
    """

    def geometric(n: int) -> list[Fraction]:
        start = Fraction(-8, n)
        return [start * (i + 1) for i in range(n)]

    if num_heads & (num_heads - 1) == 0:
        return geometric(num_heads)
    c = 1
    while 2 * c < num_heads:
        c *= 2
    return geometric(c) + geometric(2 * c)[0::2][: num_heads - c]


def round_to_double(x: Fraction) -> float:
    """Round a rational to the nearest binary64 number, ties to even (IEEE 754 default).

    Written with integer arithmetic only (no ``float(Fraction)``), including subnormals.
    Raises ``OverflowError`` beyond the binary64 range (not needed by these tests).
    """
    x = Fraction(x)
    if x == 0:
        return 0.0
    sign = -1.0 if x < 0 else 1.0
    a = abs(x)
    # e = floor(log2 a): start from the bit lengths, then correct by at most one.
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if a < Fraction(2) ** e:
        e -= 1
    elif a >= Fraction(2) ** (e + 1):
        e += 1
    quantum = max(e, -1022) - 52  # spacing of binary64 numbers around a
    scaled = a / Fraction(2) ** quantum  # a in units of the spacing
    m = scaled.numerator // scaled.denominator
    rem = scaled - m
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and m % 2 == 1):
        m += 1
    if quantum + m.bit_length() > 1024:
        raise OverflowError("beyond binary64 range")
    return sign * math.ldexp(m, quantum)  # exact: m <= 2^53


def binary64_bin(p: int, offset: float, pitch: float) -> int:
    """``floor(fl(fl(p - offset) / pitch))`` with both roundings done by :func:`round_to_double`."""
    diff = round_to_double(Fraction(p) - Fraction(offset))
    quotient = round_to_double(Fraction(diff) / Fraction(pitch))
    return math.floor(Fraction(quotient))


def exact_rational_bin(p: int, offset: float, pitch: float) -> tuple[int, Fraction]:
    """``floor((p - offset) / pitch)`` in exact rational arithmetic, and the exact quotient."""
    q = (Fraction(p) - Fraction(offset)) / Fraction(pitch)
    return math.floor(q), q


def dense_weighted_attention(q, k, v, weight, scale):
    """Direct ``T = D^-1 (A o W) V``, ``lse = log((A o W) 1)`` with ``A = exp(scale q k^T)``.

    ``q``: ``(B, H, n_q, d)``; ``k``, ``v``: ``(B, H_kv, n_k, .)``; ``weight``: ``(H, n_q, n_k)``
    or ``(B, H, n_q, n_k)``, non-negative. Query head ``h`` uses kv head ``h // (H // H_kv)``.
    No max-shift: only for inputs with moderate logits. Empty rows give 0 and ``-inf``.
    """
    batch, num_heads, n_q, _ = q.shape
    group = num_heads // k.shape[1]
    w = np.broadcast_to(weight, (batch, num_heads, n_q, k.shape[2]))
    out = np.zeros((batch, num_heads, n_q, v.shape[3]))
    lse = np.full((batch, num_heads, n_q), -np.inf)
    for b in range(batch):
        for h in range(num_heads):
            a = np.exp(scale * (q[b, h] @ k[b, h // group].T)) * w[b, h]
            z = a.sum(axis=1)
            nonempty = z > 0
            out[b, h][nonempty] = (a @ v[b, h // group])[nonempty] / z[nonempty, None]
            lse[b, h][nonempty] = np.log(z[nonempty])
    return out, lse


def random_qkv(
    seed: int,
    batch: int,
    num_heads: int,
    num_heads_kv: int,
    n_q: int,
    n_k: int,
    head_dim: int,
    head_dim_v: int,
    *,
    magnitude: float = 1.0,
):
    """Standard normal query/key/value (float64) times ``magnitude``, from ``seed``."""
    rng = np.random.default_rng(seed)
    q = magnitude * rng.standard_normal((batch, num_heads, n_q, head_dim))
    k = magnitude * rng.standard_normal((batch, num_heads_kv, n_k, head_dim))
    v = rng.standard_normal((batch, num_heads_kv, n_k, head_dim_v))
    return q, k, v


def mp_slope(exponent: Fraction, dps: int = 50) -> mpmath.mpf:
    """``2^exponent`` at ``dps`` digits."""
    with mpmath.workdps(dps):
        return mpmath.power(2, mpmath.mpf(exponent.numerator) / exponent.denominator)


class Gaussian(DistanceKernel):
    """``exp(-r^2)``: positive definite, decreasing, but not convex near 0 (not Pólya)."""

    def k(self, r):
        return np.exp(-(np.asarray(r, dtype=float) ** 2))

    def dk(self, r):
        r = np.asarray(r, dtype=float)
        return -2 * r * np.exp(-(r**2))

    def d2k(self, r):
        r = np.asarray(r, dtype=float)
        return (4 * r**2 - 2) * np.exp(-(r**2))
