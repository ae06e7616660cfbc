"""ALiBi: slopes, token positions, the bias matrix and the kernel matrix ``L*``.

Source: Press, Smith & Lewis, *Train Short, Test Long* (ICLR 2022), and SPEC section 1.
The kernel-matrix view ``L*_ij = exp(-|p_i - p_j| / sigma)`` is the object of
Wolfson & Wagner (2026), section 2; ``proofs_notes/softmax_bias_identity.md`` shows that
softmax with the bias equals ``D^-1 (A o L*) V``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from .validation import as_positions, check_bool, check_int, check_sigma

__all__ = [
    "MAX_BIAS",
    "MAX_HEADS",
    "alibi_bias",
    "alibi_slopes",
    "causal_mask",
    "check_slopes",
    "default_positions",
    "kernel_matrix",
    "resolve_batch_positions",
    "resolve_positions",
    "sigma_from_slopes",
]


def _power_of_two_slopes(num_heads: int, max_bias: float = 8.0) -> np.ndarray:
    h = np.arange(1, num_heads + 1, dtype=np.float64)
    return np.exp2(-max_bias * h / num_heads)


#: the most heads :func:`alibi_slopes` accepts (an input bound: ``alibi_slopes(10**9)`` used
#: to allocate until the process was killed)
MAX_HEADS = 2**20

#: ``max_bias`` of :func:`alibi_slopes` must stay below it: the smallest slope is
#: ``2**-max_bias``, whose length scale ``sigma = 2**max_bias`` is finite in float64 only
#: below 1024 (at 1e308 the slopes underflowed to 0, with an overflow warning)
MAX_BIAS = 1024.0


def alibi_slopes(num_heads: int, max_bias: float = 8.0) -> np.ndarray:
    """ALiBi slopes ``m_h`` for ``num_heads`` heads, in head order (never sorted).

    For a power of two ``H``: ``m_h = 2^(-b (h+1) / H)``, ``h = 0..H-1``, with ``b =
    max_bias`` (8 in Press et al.; MPT's ``alibi_bias_max`` and some model families set
    another). Otherwise, with ``c`` the largest power of two below ``H``, the slopes for
    ``c`` followed by the first ``H - c`` entries of ``slopes(2c)[0::2]`` (Press et al.'s
    rule). The default ``max_bias=8.0`` gives the same bits as the rule with the constant 8.

    Parameters
    ----------
    num_heads : int
        Number of attention heads, ``1 <= num_heads <=`` :data:`MAX_HEADS` (``2**20``: a
        bound on input, refused before allocating; models have at most a few hundred).
    max_bias : float
        The maximum bias ``b`` of the rule, ``0 < b <`` :data:`MAX_BIAS` (1024: the
        smallest slope ``2^-b`` keeps a finite ``sigma = 2^b``; default 8.0).

    Returns
    -------
    numpy.ndarray
        float64, shape ``(num_heads,)``; units: inverse tokens.

    Raises
    ------
    TypeError
        If ``num_heads`` is not an integer.
    ValueError
        If ``num_heads < 1`` or ``> MAX_HEADS``, or ``max_bias`` is not in
        ``(0, MAX_BIAS)``.

    Examples
    --------
    >>> alibi_slopes(6).tolist()
    [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]
    >>> alibi_slopes(2, max_bias=16).tolist()
    [0.00390625, 1.52587890625e-05]

    References
    ----------
    Press et al. (2022), section 3 and their reference code; SPEC section 1.
    """
    num_heads = check_int("num_heads", num_heads, minimum=1, maximum=MAX_HEADS)
    if isinstance(max_bias, bool) or not isinstance(max_bias, (int, float, np.floating)):
        raise TypeError(f"max_bias: must be a real number, got {type(max_bias).__name__}")
    if not (np.isfinite(max_bias) and 0 < max_bias < MAX_BIAS):
        raise ValueError(
            f"max_bias: must be > 0 and < {MAX_BIAS:g} (the smallest slope 2**-max_bias "
            f"needs a finite sigma = 2**max_bias), got {max_bias!r}"
        )
    max_bias = float(max_bias)
    if num_heads & (num_heads - 1) == 0:
        return _power_of_two_slopes(num_heads, max_bias)
    c = 1 << (num_heads.bit_length() - 1)
    extra = _power_of_two_slopes(2 * c, max_bias)[0::2][: num_heads - c]
    return np.concatenate([_power_of_two_slopes(c, max_bias), extra])


def check_slopes(slopes: ArrayLike | None, num_heads: int) -> np.ndarray:
    """ALiBi slopes as a float64 array ``(num_heads,)``; the default slopes for ``None``.

    The one resolution of the ``slopes`` argument of the attention family (reference, fast
    path, peers, nn modules).

    Parameters
    ----------
    slopes : array_like or None
        Positive finite slopes (inverse tokens), one per head; ``None`` means
        :func:`alibi_slopes` ``(num_heads)`` (Press et al. 2022).
    num_heads : int
        Number of query heads.

    Returns
    -------
    numpy.ndarray
        float64, ``(num_heads,)``.

    Raises
    ------
    TypeError
        Non-numeric slopes.
    ValueError
        Wrong shape, a slope that is not finite and > 0.

    References
    ----------
    Press et al. (2022); SPEC section 1.
    """
    if slopes is None:
        return alibi_slopes(num_heads)
    m = check_sigma("slopes", slopes)
    if m.shape != (num_heads,):
        raise ValueError(f"slopes: must have shape ({num_heads},), got {m.shape}")
    return m


def sigma_from_slopes(slopes: ArrayLike) -> np.ndarray:
    """Length scales ``sigma_h = 1 / m_h`` (tokens), float64, same shape as ``slopes``.

    Raises
    ------
    ValueError
        If a slope is not finite and > 0, or so small that ``1 / slope`` overflows float64
        (argument name ``slopes``).

    References
    ----------
    SPEC section 1 (``sigma_h = 1 / m_h``).
    """
    with np.errstate(divide="ignore", over="ignore"):
        sigma = 1.0 / check_sigma("slopes", slopes)
    if not np.all(np.isfinite(sigma)):
        raise ValueError("slopes: too small, sigma = 1 / slope overflows float64")
    return sigma


def default_positions(n_q: int, n_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Default absolute positions: keys ``0..n_k-1``, queries aligned to the end.

    ``p_query = n_k - n_q + (0..n_q-1)``, as FlashAttention aligns a short query block
    against a KV cache. Positions may be negative when ``n_q > n_k``.

    Returns
    -------
    (query_positions, key_positions) : tuple of numpy.ndarray
        int64, shapes ``(n_q,)`` and ``(n_k,)``.

    Raises
    ------
    TypeError, ValueError
        If ``n_q`` or ``n_k`` is not an integer ``>= 0``.

    References
    ----------
    SPEC section 1 (query/key positions, end-aligned queries as in FlashAttention).
    """
    n_q = check_int("n_q", n_q, minimum=0)
    n_k = check_int("n_k", n_k, minimum=0)
    return (np.arange(n_q, dtype=np.int64) + (n_k - n_q), np.arange(n_k, dtype=np.int64))


def resolve_positions(
    n_q: int,
    n_k: int,
    query_positions: ArrayLike | None = None,
    key_positions: ArrayLike | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Explicit positions where given (validated, int64), defaults otherwise.

    Raises
    ------
    TypeError
        If positions are not integers.
    ValueError
        If their lengths differ from ``n_q``/``n_k`` or they are not one-dimensional.

    References
    ----------
    SPEC section 1 (default and explicit position ids); CONTRIBUTING.md, "Conventions" (positions).
    """
    default_q, default_k = default_positions(n_q, n_k)
    qpos = (
        default_q
        if query_positions is None
        else as_positions("query_positions", query_positions, length=n_q)
    )
    kpos = (
        default_k
        if key_positions is None
        else as_positions("key_positions", key_positions, length=n_k)
    )
    return qpos, kpos


def _keep_mask(attention_mask, batch: int, n_k: int) -> np.ndarray:
    """``attention_mask`` as bool ``(batch, n_k)``: True = keep, False = pad."""
    if hasattr(attention_mask, "detach") and hasattr(attention_mask, "cpu"):
        attention_mask = attention_mask.detach().cpu().numpy()
    arr = np.asarray(attention_mask)
    if arr.shape != (batch, n_k):
        raise ValueError(
            f"attention_mask: must have shape (batch, n_k) = {(batch, n_k)}, got {arr.shape}"
        )
    if arr.dtype == np.bool_:
        return arr.copy()
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"attention_mask: must hold bool or integer 0/1, got dtype {arr.dtype}")
    if np.any((arr != 0) & (arr != 1)):
        raise ValueError("attention_mask: integer entries must be 0 (pad) or 1 (keep)")
    return arr == 1


def _batch_positions(name: str, value, batch: int, length: int, keep) -> np.ndarray:
    """``(n,)`` or ``(batch, n)`` positions as int64 ``(batch, n)``; pad slots set to 0."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    if arr.ndim == 1:
        arr = np.broadcast_to(arr, (batch, arr.shape[0]))
    elif arr.ndim != 2 or arr.shape[0] != batch:
        raise ValueError(
            f"{name}: must have shape ({length},) or (batch, {length}) = {(batch, length)}, "
            f"got {arr.shape}"
        )
    if arr.shape[1] != length:  # before the pad slots are zeroed (a shape mismatch there)
        raise ValueError(f"{name}: must have length {length}, got {arr.shape[1]}")
    if keep is not None and np.issubdtype(arr.dtype, np.integer):
        arr = np.where(keep, arr, 0)  # positions at pad slots are ignored (any int64 value)
    rows = [as_positions(name, row, length=length) for row in arr]
    return np.stack(rows) if rows else np.zeros((0, length), dtype=np.int64)


def resolve_batch_positions(
    batch: int,
    n_q: int,
    n_k: int,
    query_positions: ArrayLike | None = None,
    key_positions: ArrayLike | None = None,
    attention_mask: ArrayLike | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-sequence positions and keep masks of a padded batch (SPEC section 5).

    Positions may be shared by the batch, ``(n,)``, or given per sequence, ``(batch, n)``
    (HF ``position_ids``); ``None`` means the defaults of :func:`default_positions`. The
    key-padding mask ``attention_mask`` follows the HF 2-D convention: shape
    ``(batch, n_k)``, bool or integer 0/1, 1/True = keep, 0 = pad. Query slot ``i`` is a
    pad slot when ``n_q <= n_k`` and its end-aligned key slot ``n_k - n_q + i`` is padded
    (the query is that token). Positions at pad slots are ignored: they may hold any
    integer value and are returned as 0.

    Parameters
    ----------
    batch, n_q, n_k : int
        Batch size and sequence lengths, ``>= 0``.
    query_positions, key_positions : array_like of int, optional
        ``(n_q,)`` / ``(batch, n_q)`` and ``(n_k,)`` / ``(batch, n_k)``.
    attention_mask : array_like of bool or int, optional
        ``(batch, n_k)``; ``None`` keeps every key.

    Returns
    -------
    (query_positions, key_positions, query_keep, key_keep) : tuple of numpy.ndarray
        int64 ``(batch, n_q)`` and ``(batch, n_k)``; bool ``(batch, n_q)`` (False on pad
        query slots) and ``(batch, n_k)`` (False on pad keys).

    Raises
    ------
    TypeError
        If positions are not integers or the mask is neither bool nor integer.
    ValueError
        On wrong shapes, ``|p| >= 2**53`` at a real slot, or mask entries other than 0/1.

    References
    ----------
    SPEC section 5 (padded batches); HF ``attention_mask`` / ``position_ids`` conventions.
    """
    batch = check_int("batch", batch, minimum=0)
    n_q = check_int("n_q", n_q, minimum=0)
    n_k = check_int("n_k", n_k, minimum=0)
    key_keep = np.ones((batch, n_k), dtype=bool)
    query_keep = np.ones((batch, n_q), dtype=bool)
    if attention_mask is not None:
        key_keep = _keep_mask(attention_mask, batch, n_k)
        if n_q <= n_k:
            query_keep = key_keep[:, n_k - n_q :].copy()
    default_q, default_k = default_positions(n_q, n_k)
    qpos = _batch_positions(
        "query_positions",
        default_q if query_positions is None else query_positions,
        batch,
        n_q,
        query_keep,
    )
    kpos = _batch_positions(
        "key_positions", default_k if key_positions is None else key_positions, batch, n_k, key_keep
    )
    return np.where(query_keep, qpos, 0), np.where(key_keep, kpos, 0), query_keep, key_keep


def causal_mask(query_positions: ArrayLike, key_positions: ArrayLike) -> np.ndarray:
    """Boolean admissibility ``p_key <= p_query``, shape ``(n_q, n_k)``.

    Raises
    ------
    TypeError, ValueError
        If positions are not one-dimensional integers with ``|p| < 2**53``.

    References
    ----------
    SPEC section 1 (causal: ``-inf`` for ``p_j > p_i``); CONTRIBUTING.md, "Conventions" (causal).
    """
    qpos = as_positions("query_positions", query_positions)
    kpos = as_positions("key_positions", key_positions)
    return kpos[None, :] <= qpos[:, None]


def _distance(qpos: np.ndarray, kpos: np.ndarray) -> np.ndarray:
    # Exact: int64 difference, then float64 (exact below 2**53).
    return np.abs(qpos[:, None] - kpos[None, :]).astype(np.float64)


def alibi_bias(
    slopes: ArrayLike, query_positions: ArrayLike, key_positions: ArrayLike, *, causal: bool
) -> np.ndarray:
    """ALiBi bias ``B[h, i, j] = -m_h |p_i - p_j|`` (``-inf`` where causal forbids).

    Parameters
    ----------
    slopes : array_like, shape ``(num_heads,)``
        Positive slopes (inverse tokens).
    query_positions, key_positions : array_like of int, shapes ``(n_q,)``, ``(n_k,)``
    causal : bool
        If true, entries with ``p_key > p_query`` are ``-inf``.

    Returns
    -------
    numpy.ndarray
        float64, shape ``(num_heads, n_q, n_k)``.

    Raises
    ------
    ValueError, TypeError
        On non-positive/non-finite slopes or non-integer positions.

    References
    ----------
    SPEC section 1; Press et al. (2022).
    """
    causal = check_bool("causal", causal)
    m = check_sigma("slopes", slopes)
    if m.ndim != 1:
        raise ValueError(f"slopes: must be one-dimensional, got shape {m.shape}")
    qpos = as_positions("query_positions", query_positions)
    kpos = as_positions("key_positions", key_positions)
    bias = -m[:, None, None] * _distance(qpos, kpos)[None]
    if causal:
        bias = np.where(causal_mask(qpos, kpos)[None], bias, -np.inf)
    return bias


def kernel_matrix(
    sigma: ArrayLike, query_positions: ArrayLike, key_positions: ArrayLike, *, causal: bool = False
) -> np.ndarray:
    """Kernel matrix ``L*_ij = exp(-|p_i - p_j| / sigma)`` (times the causal 0/1 mask).

    Parameters
    ----------
    sigma : float or array_like, shape ``(num_heads,)``
        Length scale(s) in tokens, ``sigma = 1 / slope``, each > 0.
    query_positions, key_positions : array_like of int, shapes ``(n_q,)``, ``(n_k,)``
    causal : bool
        Multiply by ``1[p_key <= p_query]``.

    Returns
    -------
    numpy.ndarray
        float64, shape ``(n_q, n_k)`` for scalar sigma, else ``(num_heads, n_q, n_k)``.

    Raises
    ------
    ValueError, TypeError
        If sigma <= 0 or non-finite, or positions are not integers.

    References
    ----------
    Wolfson & Wagner (2026), section 2 (``L* = E[M(h)]``); SPEC section 1.
    """
    causal = check_bool("causal", causal)
    sig = check_sigma("sigma", sigma)
    qpos = as_positions("query_positions", query_positions)
    kpos = as_positions("key_positions", key_positions)
    dist = _distance(qpos, kpos)
    with np.errstate(over="ignore"):  # dist / sigma = inf at a subnormal sigma: L* = 0 there
        out = np.exp(-dist / sig[..., None, None])
    if causal:
        out = out * causal_mask(qpos, kpos)
    return out
