"""Attention at arbitrary precision with mpmath, for small inputs.

The inputs (query, key, value, slopes, scale) are taken as the exact binary64 values
they hold; every operation after that runs at ``dps`` decimal digits inside
``mpmath.workdps``, which restores mpmath's global precision on exit, so the float64
reference can be checked to its last few ulps. Cost: ``O(B H n_q n_k d)`` multiprecision
operations; keep ``n <= 64``.

Source: the definitions of SPEC sections 1 and 3; the identity of
``proofs_notes/softmax_bias_identity.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mpmath
import numpy as np
from numpy.typing import ArrayLike

from .alibi import check_slopes, resolve_batch_positions, resolve_positions
from .attention import validate_qkv
from .partition import PartitionSample, check_partition, counts
from .validation import check_bool, check_dps, check_scale, partition_argument, select_return

__all__ = ["alibi_attention_mp", "plsh_attention_mp", "weighted_attention_mp"]


def weighted_attention_mp(
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    weight: ArrayLike | Callable[[int, int, int], Any],
    *,
    scale: float | None = None,
    dps: int = 30,
) -> tuple[np.ndarray, np.ndarray]:
    """``T_i = sum_j A_ij W_ij v_j / sum_j A_ij W_ij`` and ``lse_i = log sum_j A_ij W_ij``.

    Parameters
    ----------
    query, key, value : array_like
        ``(batch, num_heads, n_q, head_dim)``, ``(batch, num_heads_kv, n_k, head_dim)``,
        ``(batch, num_heads_kv, n_k, head_dim_v)``.
    weight : callable or array_like
        Non-negative weights ``(num_heads, n_q, n_k)`` as an array of floats, or a
        callable ``weight(h, i, j) -> mpf`` evaluated at the working precision (used for
        ``exp(-m_h |p_i - p_j|)``).
    scale : float, optional
        Default ``1 / sqrt(head_dim)`` rounded to binary64 (the float64 reference's value).
    dps : int
        Decimal digits, ``>= 15``.

    Returns
    -------
    (output, lse) : tuple of numpy.ndarray of ``mpmath.mpf`` (dtype object)
        Shapes ``(batch, num_heads, n_q, head_dim_v)`` and ``(batch, num_heads, n_q)``;
        empty rows give 0 and ``-inf``.

    Raises
    ------
    ValueError, TypeError
        As :func:`plsh_ref.attention.validate_qkv`; ``dps < 15``; a weight array of the
        wrong shape or with negative entries.

    References
    ----------
    SPEC sections 1 and 3 (weighted attention and its LSE; empty rows);
    ``proofs_notes/softmax_bias_identity.md``, sections 1-2.
    """
    dps = check_dps(dps)
    q, k, v = validate_qkv(query, key, value)
    batch, num_heads, n_q, head_dim = q.shape
    n_k, dv = k.shape[2], v.shape[3]
    group = num_heads // k.shape[1]
    c = check_scale(scale, head_dim)
    if not callable(weight):
        w_arr = np.asarray(weight, dtype=np.float64)
        if w_arr.shape != (num_heads, n_q, n_k):
            raise ValueError(f"weight: shape {w_arr.shape} must be {(num_heads, n_q, n_k)}")
        if np.any(~np.isfinite(w_arr)) or np.any(w_arr < 0):
            raise ValueError("weight: entries must be finite and >= 0")

        def weight(h, i, j, _w=w_arr):
            return mpmath.mpf(float(_w[h, i, j]))

    out = np.empty((batch, num_heads, n_q, dv), dtype=object)
    lse = np.empty((batch, num_heads, n_q), dtype=object)
    with mpmath.workdps(dps):
        cm = mpmath.mpf(c)
        for b in range(batch):
            for h in range(num_heads):
                hk = h // group
                for i in range(n_q):
                    z = mpmath.mpf(0)
                    num = [mpmath.mpf(0)] * dv
                    for j in range(n_k):
                        wij = weight(h, i, j)
                        if wij == 0:
                            continue
                        dot = mpmath.fsum(
                            mpmath.mpf(float(x)) * mpmath.mpf(float(y))
                            for x, y in zip(q[b, h, i], k[b, hk, j])
                        )
                        aw = mpmath.exp(cm * dot) * wij
                        z += aw
                        for e in range(dv):
                            num[e] += aw * mpmath.mpf(float(v[b, hk, j, e]))
                    if z == 0:
                        out[b, h, i] = [mpmath.mpf(0)] * dv
                        lse[b, h, i] = mpmath.ninf
                    else:
                        out[b, h, i] = [x / z for x in num]
                        lse[b, h, i] = mpmath.log(z)
    return out, lse


def _padded_mp(attend, q, query_positions, key_positions, attention_mask, n_k, dv):
    """Per-sequence calls ``attend(b, qpos, kpos) -> (out, lse)`` on a padded batch.

    Shared positions without a mask are one call with ``b = None``. Otherwise each
    sequence is attended on its real tokens (pad keys and pad query slots dropped, as
    :func:`plsh_ref.attention.alibi_attention` does); pad query rows are 0 and ``-inf``.
    """
    batch, num_heads, n_q = q.shape[:3]
    if attention_mask is None and all(
        p is None or np.ndim(p) == 1 for p in (query_positions, key_positions)
    ):
        qpos, kpos = resolve_positions(n_q, n_k, query_positions, key_positions)
        return attend(None, qpos, kpos, None, None)
    qpos, kpos, q_keep, k_keep = resolve_batch_positions(
        batch, n_q, n_k, query_positions, key_positions, attention_mask
    )
    out = np.empty((batch, num_heads, n_q, dv), dtype=object)
    lse = np.empty((batch, num_heads, n_q), dtype=object)
    for b in range(batch):
        iq, ik = np.flatnonzero(q_keep[b]), np.flatnonzero(k_keep[b])
        o, l = attend(b, qpos[b, iq], kpos[b, ik], iq, ik)
        for h in range(num_heads):
            for i in range(n_q):
                out[b, h, i] = [mpmath.mpf(0)] * dv
                lse[b, h, i] = mpmath.ninf
            for r, i in enumerate(iq):
                out[b, h, i] = o[0, h, r]
                lse[b, h, i] = l[0, h, r]
    return out, lse


def alibi_attention_mp(
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    *,
    slopes: ArrayLike | None = None,
    causal: bool = True,
    scale: float | None = None,
    query_positions: ArrayLike | None = None,
    key_positions: ArrayLike | None = None,
    attention_mask: ArrayLike | None = None,
    return_lse: bool | None = None,
    dps: int = 30,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Exact ALiBi attention at ``dps`` digits (same arguments as
    :func:`plsh_ref.attention.alibi_attention`, padding included, plus ``dps``).

    The weights ``exp(-m_h |p_i - p_j|)`` are evaluated at the working precision from the
    binary64 slopes. Returns object arrays of ``mpmath.mpf``: ``output``, or ``(output, lse)``
    with ``return_lse=True`` (not given: the pair, with a DeprecationWarning, for one
    release); raises as the float64 version and on ``dps < 15``.

    References
    ----------
    SPEC section 1; Press et al. (2022).
    """
    causal = check_bool("causal", causal)
    q, k, v = validate_qkv(query, key, value)
    m = check_slopes(slopes, q.shape[1])

    def attend(b, qpos, kpos, iq, ik):
        def weight(h, i, j):
            if causal and kpos[j] > qpos[i]:
                return mpmath.mpf(0)
            return mpmath.exp(-mpmath.mpf(float(m[h])) * abs(int(qpos[i]) - int(kpos[j])))

        if b is None:
            return weighted_attention_mp(q, k, v, weight, scale=scale, dps=dps)
        sub = (q[b : b + 1][:, :, iq], k[b : b + 1][:, :, ik], v[b : b + 1][:, :, ik])
        return weighted_attention_mp(*sub, weight, scale=check_scale(scale, q.shape[3]), dps=dps)

    result = _padded_mp(
        attend, q, query_positions, key_positions, attention_mask, k.shape[2], v.shape[3]
    )
    return select_return(result, return_lse, "alibi_attention_mp")


def plsh_attention_mp(
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    *args: Any,
    partition: PartitionSample | None = None,
    causal: bool = True,
    scale: float | None = None,
    query_positions: ArrayLike | None = None,
    key_positions: ArrayLike | None = None,
    attention_mask: ArrayLike | None = None,
    return_lse: bool | None = None,
    dps: int = 30,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """PLSH attention with weights ``M~ = C / s`` at ``dps`` digits (arguments as
    :func:`plsh_ref.attention.plsh_attention`, padding included: ``partition`` keyword-only,
    ``(output, lse)`` with ``return_lse=True``). Counts are exact integers; ``C / s`` is
    formed at the working precision.

    Raises
    ------
    TypeError, ValueError
        As :func:`plsh_ref.attention.plsh_attention`, and on ``dps < 15``.

    References
    ----------
    Wolfson & Wagner (2026), Theorem 2.2; SPEC section 3.
    """
    partition, return_lse = partition_argument(args, partition, return_lse, "plsh_attention_mp")
    q, k, v = validate_qkv(query, key, value)
    partition = check_partition(partition, q.shape[1])
    s = partition.num_samples

    def attend(b, qpos, kpos, iq, ik):
        cnt = counts(partition, qpos, kpos, causal=causal)

        def weight(h, i, j):
            return mpmath.mpf(int(cnt[h, i, j])) / s

        if b is None:
            return weighted_attention_mp(q, k, v, weight, scale=scale, dps=dps)
        sub = (q[b : b + 1][:, :, iq], k[b : b + 1][:, :, ik], v[b : b + 1][:, :, ik])
        return weighted_attention_mp(*sub, weight, scale=check_scale(scale, q.shape[3]), dps=dps)

    result = _padded_mp(
        attend, q, query_positions, key_positions, attention_mask, k.shape[2], v.shape[3]
    )
    return select_return(result, return_lse, "plsh_attention_mp")
