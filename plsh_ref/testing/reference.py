"""Reference callables with the kernel contracts that ``plsh verify`` checks.

Two contracts (keyword-only arguments after ``query, key, value``):

* exact ALiBi: ``f(query, key, value, *, slopes, causal, scale, query_positions,
  key_positions) -> output`` or ``(output, lse)``;
* positional LSH: ``f(query, key, value, *, partition, causal, scale, query_positions,
  key_positions) -> output`` or ``(output, lse)``.

The references below satisfy them and return float64 ``(output, lse)``; they accept numpy
arrays and (duck-typed, without importing torch) CPU or CUDA torch tensors.
"""

from __future__ import annotations

from ..attention import alibi_attention, plsh_attention

__all__ = ["KINDS", "alibi_reference", "plsh_reference", "reference_for"]

#: the kernel kinds, exact ALiBi attention (``alibi``) or PLSH attention given a partition
#: sample (``plsh``)
KINDS = ("alibi", "plsh")


def alibi_reference(
    query,
    key,
    value,
    *,
    slopes=None,
    causal=True,
    scale=None,
    query_positions=None,
    key_positions=None,
    attention_mask=None,
):
    """Exact ALiBi attention in float64 with the ``alibi`` kernel contract.

    Parameters
    ----------
    query, key, value : array_like
        ``(batch, num_heads, n_q, head_dim)``, ``(batch, num_heads_kv, n_k, head_dim)``,
        ``(batch, num_heads_kv, n_k, head_dim_v)``.
    slopes : array_like, ``(num_heads,)``, optional
        Inverse tokens; default Press et al.'s slopes.
    causal : bool
    scale : float, optional
        Default ``1 / sqrt(head_dim)``.
    query_positions, key_positions : array_like of int, optional
        ``(n,)`` shared or ``(batch, n)`` per sequence.
    attention_mask : array_like of bool or int, optional
        Key-padding mask ``(batch, n_k)``, 1 = keep, 0 = pad (SPEC section 5).

    Returns
    -------
    (output, lse) : tuple of numpy.ndarray
        float64, ``(batch, num_heads, n_q, head_dim_v)`` and ``(batch, num_heads, n_q)``.

    Raises
    ------
    TypeError, ValueError
        As :func:`plsh_ref.attention.alibi_attention`.

    Examples
    --------
    >>> import numpy as np
    >>> from plsh_ref.testing import alibi_reference
    >>> q = np.ones((1, 1, 2, 4)); v = np.arange(8.0).reshape(1, 1, 2, 4)
    >>> out, lse = alibi_reference(q, q, v, slopes=[0.5], causal=True, scale=None,
    ...                            query_positions=None, key_positions=None)
    >>> out[0, 0, 0].tolist()  # the first query sees only the first key
    [0.0, 1.0, 2.0, 3.0]
    """
    return alibi_attention(
        query,
        key,
        value,
        slopes=slopes,
        causal=causal,
        scale=scale,
        query_positions=query_positions,
        key_positions=key_positions,
        attention_mask=attention_mask,
        return_lse=True,
    )


def plsh_reference(
    query,
    key,
    value,
    *,
    partition,
    causal=True,
    scale=None,
    query_positions=None,
    key_positions=None,
    attention_mask=None,
):
    """PLSH attention in float64 (count-weighted form) with the ``plsh`` kernel contract.

    Parameters
    ----------
    query, key, value : array_like
        As :func:`alibi_reference`.
    partition : PartitionSample
        One pitch/offset per head and sample (:func:`plsh_ref.partition.draw_partition`).
    causal, scale, query_positions, key_positions, attention_mask
        As :func:`alibi_reference`.

    Returns
    -------
    (output, lse) : tuple of numpy.ndarray
        float64; ``lse = log sum_j A_ij M~_ij``.

    Raises
    ------
    TypeError, ValueError
        As :func:`plsh_ref.attention.plsh_attention`.

    References
    ----------
    Wolfson & Wagner (2026), Theorem 2.2; SPEC section 3.
    """
    return plsh_attention(
        query,
        key,
        value,
        partition=partition,
        causal=causal,
        scale=scale,
        query_positions=query_positions,
        key_positions=key_positions,
        attention_mask=attention_mask,
        return_lse=True,
    )


def reference_for(kind: str):
    """The reference callable of a kernel kind.

    Parameters
    ----------
    kind : {"alibi", "plsh"}

    Returns
    -------
    callable
        :func:`alibi_reference` or :func:`plsh_reference`.

    Raises
    ------
    ValueError
        If ``kind`` is unknown.
    """
    if kind == "alibi":
        return alibi_reference
    if kind == "plsh":
        return plsh_reference
    raise ValueError(f"kind: must be one of {KINDS}, got {kind!r}")
