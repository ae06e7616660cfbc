"""Reference callables with the kernel contracts that ``plsh verify`` checks.

Two contracts (keyword-only arguments after ``query, key, value``):

* exact ALiBi: ``f(query, key, value, *, slopes, causal, scale, query_positions,
  key_positions) -> output`` or ``(output, lse)``;
* positional LSH: ``f(query, key, value, *, partition, causal, scale, query_positions,
  key_positions) -> output`` or ``(output, lse)``.

The references below satisfy them and return float64 ``(output, lse)``; they accept numpy
arrays and (duck-typed, without importing torch) CPU or CUDA torch tensors.

Precision (:func:`reference_precision`): inputs of a dtype below float64 are judged against
the float64 reference (its rounding is far below theirs). Float64 inputs are judged against
a reference more exact than float64, or the reference's own rounding, a few ulps, would be
charged to the kernel (the SPEC section 6 yardstick shares the float64 reference's order of
operations, so the allowed error often collapses to the 4-ulp floor, below the float64
reference's own error): the float64 reference then runs in extended precision
(``precision="extended"`` of :mod:`plsh_ref.attention`: ``numpy.longdouble`` throughout,
rounded to float64 once). Where ``longdouble`` is no wider than float64 (Windows, macOS on
Apple silicon) small problems (at most :data:`MP_FALLBACK_WORK` multiply-adds) run in
:mod:`plsh_ref.mp_attention` at 30 digits instead, and larger ones in float64, as before.
Measured on a 2-core x86-64 VM (2026-12-02): a correct float64 numpy kernel
(``examples/test_my_kernel.py``) failed 18 of 600 derandomized float64 problems against the
float64 reference and fails none against the extended one (``docs/validation.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
from numpy.typing import ArrayLike

from .. import attention as _attention_module
from ..attention import PRECISIONS, alibi_attention, plsh_attention
from ..partition import PartitionSample

__all__ = [
    "KINDS",
    "MP_FALLBACK_WORK",
    "REFERENCE_PRECISIONS",
    "alibi_reference",
    "plsh_reference",
    "reference_for",
    "reference_precision",
]

#: the kernel kinds, exact ALiBi attention (``alibi``) or PLSH attention given a partition
#: sample (``plsh``)
KINDS = ("alibi", "plsh")

#: the ``precision`` values of the reference callables: ``"auto"`` (by the inputs' dtype,
#: :func:`reference_precision`) and those of :mod:`plsh_ref.attention`
REFERENCE_PRECISIONS = ("auto", *PRECISIONS)

#: the largest problem, in multiply-adds ``batch * num_heads * n_q * n_k * (head_dim +
#: head_dim_v)``, computed with mpmath where ``longdouble`` is no wider than float64
#: (measured on a loaded 2-core VM, 2026-12-02: 4.5 s for 131 072, the largest of 600 random
#: float64 cases; their median, 576, takes milliseconds)
MP_FALLBACK_WORK = 200_000


def reference_precision(query: Any, precision: str = "auto") -> str:
    """The precision the reference computes in for inputs like ``query``.

    Parameters
    ----------
    query : array_like or tensor
        Only its dtype is read (``query.dtype``, else ``numpy.asarray(query).dtype``).
    precision : {"auto", "float64", "extended"}
        ``"auto"``: ``"extended"`` for float64 inputs, ``"float64"`` for every other dtype.

    Returns
    -------
    str
        ``"float64"`` or ``"extended"``.

    Raises
    ------
    ValueError
        If ``precision`` is unknown.

    Examples
    --------
    >>> import numpy as np
    >>> from plsh_ref.testing.reference import reference_precision
    >>> reference_precision(np.zeros(2, np.float32)), reference_precision(np.zeros(2))
    ('float64', 'extended')

    References
    ----------
    ``docs/validation.md``, "The tolerance rule" (float64 problems judged against the
    extended reference).
    """
    if precision not in REFERENCE_PRECISIONS:
        raise ValueError(f"precision: must be one of {REFERENCE_PRECISIONS}, got {precision!r}")
    if precision != "auto":
        return precision
    dtype = getattr(query, "dtype", None)
    if dtype is None:
        dtype = np.asarray(query).dtype
    return "extended" if str(dtype).removeprefix("torch.") == "float64" else "float64"


def _mp_fallback(query: ArrayLike, key: ArrayLike, value: ArrayLike) -> bool:
    """Extended precision asked for where longdouble is float64: mpmath if small enough."""
    if _attention_module.EXTENDED_AVAILABLE:
        return False
    q, k, v = (np.shape(x) for x in (query, key, value))
    return q[0] * q[1] * q[2] * k[2] * (q[3] + v[3]) <= MP_FALLBACK_WORK


def _call_reference(exact, mp_name, query, key, value, precision, **kwargs):
    """``exact(..., precision=...)``, or its mpmath twin (:func:`_mp_fallback`)."""
    precision = reference_precision(query, precision)
    if precision == "extended" and _mp_fallback(query, key, value):
        from .. import mp_attention

        out, lse = getattr(mp_attention, mp_name)(
            query, key, value, **kwargs, return_lse=True, dps=30
        )
        return out.astype(np.float64), lse.astype(np.float64)
    if precision == "extended" and not _attention_module.EXTENDED_AVAILABLE:
        precision = "float64"  # too large for mpmath: the float64 reference, as documented
    out = exact(query, key, value, **kwargs, return_lse=True, precision=precision)
    return cast(tuple[np.ndarray, np.ndarray], out)  # return_lse=True: (output, lse)


def alibi_reference(
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
    precision: str = "auto",
) -> tuple[np.ndarray, np.ndarray]:
    """Exact ALiBi attention with the ``alibi`` kernel contract, float64 results.

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
    precision : {"auto", "float64", "extended"}
        Default ``"auto"``: extended precision for float64 inputs (module docstring),
        float64 otherwise (:func:`reference_precision`).

    Returns
    -------
    (output, lse) : tuple of numpy.ndarray
        float64, ``(batch, num_heads, n_q, head_dim_v)`` and ``(batch, num_heads, n_q)``.

    Raises
    ------
    TypeError, ValueError
        As :func:`plsh_ref.attention.alibi_attention`; an unknown ``precision``.

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
    return _call_reference(
        alibi_attention,
        "alibi_attention_mp",
        query,
        key,
        value,
        precision,
        slopes=slopes,
        causal=causal,
        scale=scale,
        query_positions=query_positions,
        key_positions=key_positions,
        attention_mask=attention_mask,
    )


def plsh_reference(
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    *,
    partition: PartitionSample,
    causal: bool = True,
    scale: float | None = None,
    query_positions: ArrayLike | None = None,
    key_positions: ArrayLike | None = None,
    attention_mask: ArrayLike | None = None,
    precision: str = "auto",
) -> tuple[np.ndarray, np.ndarray]:
    """PLSH attention (count-weighted form) with the ``plsh`` kernel contract, float64 results.

    Parameters
    ----------
    query, key, value : array_like
        As :func:`alibi_reference`.
    partition : PartitionSample
        One pitch/offset per head and sample (:func:`plsh_ref.partition.draw_partition`).
    causal, scale, query_positions, key_positions, attention_mask, precision
        As :func:`alibi_reference`.

    Returns
    -------
    (output, lse) : tuple of numpy.ndarray
        float64; ``lse = log sum_j A_ij M~_ij``.

    Raises
    ------
    TypeError, ValueError
        As :func:`plsh_ref.attention.plsh_attention`; an unknown ``precision``.

    References
    ----------
    Wolfson & Wagner (2026), Theorem 2.2; SPEC section 3.
    """
    return _call_reference(
        plsh_attention,
        "plsh_attention_mp",
        query,
        key,
        value,
        precision,
        partition=partition,
        causal=causal,
        scale=scale,
        query_positions=query_positions,
        key_positions=key_positions,
        attention_mask=attention_mask,
    )


def reference_for(kind: str) -> Callable[..., tuple[np.ndarray, np.ndarray]]:
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

    References
    ----------
    ``docs/validation.md``, "The kernel contracts" (the ``alibi`` and ``plsh`` kinds); SPEC
    sections 1 and 3.
    """
    if kind == "alibi":
        return alibi_reference
    if kind == "plsh":
        return plsh_reference
    raise ValueError(f"kind: must be one of {KINDS}, got {kind!r}")
