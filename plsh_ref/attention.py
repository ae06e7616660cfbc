"""Float64 reference attention: exact ALiBi, PLSH (two algorithms), and the baselines.

All functions take the ``(batch, num_heads, seq_len, head_dim)`` layout of
``torch.nn.functional.scaled_dot_product_attention`` and the attention family's keyword-only
arguments in one order (SPEC section 5: ``partition``, ``causal``, ``scale``,
``query_positions``, ``key_positions``, ``attention_mask``, ``return_lse``; ``method`` names
the formula). They return ``output``, or ``(output, lse)`` with ``return_lse=True``:

* ``output``: float64, ``(batch, num_heads, n_q, head_dim_v)``;
* ``lse``: float64, ``(batch, num_heads, n_q)``, ``log sum_j A_ij W_ij`` (natural log)
  with ``A_ij = exp(scale q_i . k_j)`` and ``W`` the kernel/weight matrix. A row with no
  admissible key has output 0 and ``lse = -inf`` (never NaN).

Softmax with an additive bias ``B`` equals ``D^-1 (A o exp(B)) V`` with
``D = diag((A o exp(B)) 1)``: ``proofs_notes/softmax_bias_identity.md``. Exact ALiBi uses
``W = L*``; PLSH attention (Wolfson & Wagner 2026, Theorem 2.2) uses ``W = M~ = C / s``.

Precision: :func:`alibi_attention` and :func:`plsh_attention` take ``precision``.
``"float64"`` (the default) computes in binary64. ``"extended"`` takes the inputs as the
exact binary64 values they hold and computes every intermediate (bias, logits, exponentials,
sums, the LSE) in ``numpy.longdouble``, rounding to float64 once at the end: the reference
that float64 kernels are judged against (:mod:`plsh_ref.testing.reference`), accurate to
about one float64 ulp where binary64 arithmetic errs by a few. It needs a ``longdouble``
wider than float64 (:data:`EXTENDED_AVAILABLE`: x87 80-bit on x86-64 Linux, binary128 on
aarch64 Linux; not on Windows or macOS on Apple silicon).

Deprecated for one release (DeprecationWarning, :func:`plsh_ref.validation.warn_deprecated`):
calling without ``return_lse`` returns ``(output, lse)`` as before (pass ``return_lse=True``
to keep the pair, ``False`` for the output alone, the default from the next release); a
positional ``partition``; ``plsh_attention(backend="counts" | "reduction")`` (now
``method=``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from numpy.typing import ArrayLike

from .alibi import alibi_bias, check_slopes, resolve_batch_positions, resolve_positions
from .partition import PartitionSample, bins, check_partition, count_bias, counts
from .validation import (
    as_float_array,
    check_bool,
    check_int,
    check_scale,
    keyword_argument,
    partition_argument,
    select_return,
    warn_deprecated,
)

__all__ = [
    "EXTENDED_AVAILABLE",
    "PRECISIONS",
    "alibi_attention",
    "biased_attention",
    "expand_kv",
    "fixed_block_attention",
    "no_bias_attention",
    "plsh_attention",
    "precision_dtype",
    "validate_qkv",
]

#: the precisions of :func:`alibi_attention` and :func:`plsh_attention`
PRECISIONS = ("float64", "extended")

#: whether ``numpy.longdouble`` is wider than float64 here, so that ``precision="extended"``
#: works (read at call time)
EXTENDED_AVAILABLE = bool(np.finfo(np.longdouble).eps < np.finfo(np.float64).eps)


def precision_dtype(precision: str) -> type[np.floating]:
    """The numpy type a reference computes in for ``precision``.

    Parameters
    ----------
    precision : {"float64", "extended"}

    Returns
    -------
    type
        ``numpy.float64``, or ``numpy.longdouble`` for ``"extended"``.

    Raises
    ------
    ValueError
        If ``precision`` is unknown, or ``"extended"`` where ``numpy.longdouble`` is no wider
        than float64 (:data:`EXTENDED_AVAILABLE` false).

    References
    ----------
    ``docs/validation.md``, "The tolerance rule" (float64 problems judged against the extended
    reference).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision: must be one of {PRECISIONS}, got {precision!r}")
    if precision == "float64":
        return np.float64
    if not EXTENDED_AVAILABLE:
        raise ValueError(
            "precision: 'extended' needs numpy.longdouble wider than float64; here it has "
            f"eps {float(np.finfo(np.longdouble).eps):.3g} (use plsh_ref.mp_attention instead)"
        )
    return np.longdouble


def validate_qkv(
    query: ArrayLike, key: ArrayLike, value: ArrayLike
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate and convert ``query``, ``key``, ``value`` to float64 arrays.

    Parameters
    ----------
    query : array_like, ``(batch, num_heads, n_q, head_dim)``
    key : array_like, ``(batch, num_heads_kv, n_k, head_dim)``
    value : array_like, ``(batch, num_heads_kv, n_k, head_dim_v)``
        ``num_heads % num_heads_kv == 0`` (grouped-query attention).

    Returns
    -------
    (query, key, value) : tuple of numpy.ndarray
        float64 copies/views.

    Raises
    ------
    TypeError
        If an input is not a real numeric array.
    ValueError
        On wrong rank, NaN/inf, or inconsistent batch, head, length or head_dim.

    References
    ----------
    SPEC section 5 (layout ``(batch, num_heads, seq_len, head_dim)``, grouped-query attention).
    """
    q = as_float_array("query", query, ndim=4)
    k = as_float_array("key", key, ndim=4)
    v = as_float_array("value", value, ndim=4)
    for name, x in (("key", k), ("value", v)):
        if x.shape[0] != q.shape[0]:
            raise ValueError(
                f"{name}: batch size {x.shape[0]} differs from query batch size {q.shape[0]}"
            )
    if k.shape[3] != q.shape[3]:
        raise ValueError(f"key: head_dim {k.shape[3]} differs from query head_dim {q.shape[3]}")
    if v.shape[1] != k.shape[1] or v.shape[2] != k.shape[2]:
        raise ValueError(
            f"value: (num_heads_kv, n_k) = {v.shape[1:3]} differs from key's {k.shape[1:3]}"
        )
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"key: num_heads_kv={k.shape[1]} must divide num_heads={q.shape[1]}")
    return q, k, v


def expand_kv(x: np.ndarray, num_heads: int) -> np.ndarray:
    """Repeat the kv heads of ``x`` so that query head ``h`` sees kv head ``h // group``.

    Parameters
    ----------
    x : numpy.ndarray, ``(batch, num_heads_kv, n, dim)``
        Keys or values; ``num_heads % num_heads_kv == 0`` (checked by :func:`validate_qkv`).
    num_heads : int
        Number of query heads.

    Returns
    -------
    numpy.ndarray
        ``(batch, num_heads, n, dim)``, same dtype (``group = num_heads // num_heads_kv``
        consecutive copies of each kv head: grouped-query attention, CONTRIBUTING.md).

    References
    ----------
    SPEC section 5 (grouped-query attention: query head ``h`` uses kv head ``h // group``).
    """
    return np.repeat(x, num_heads // x.shape[1], axis=1)


def _softmax_with_log_weight(q, k, v, log_weight, scale, work=np.float64):
    """Stable ``softmax(scale q k^T + log_weight) v`` and its LSE; empty rows -> (0, -inf).

    Every intermediate is of type ``work`` (float64 or longdouble), and so are the results.
    """
    num_heads = q.shape[1]
    k = expand_kv(k, num_heads)
    v = expand_kv(v, num_heads)
    if work is not np.float64:
        q, k, v, scale = q.astype(work), k.astype(work), v.astype(work), work(scale)
    with np.errstate(over="ignore", invalid="ignore"):
        scores = scale * np.einsum("bhid,bhjd->bhij", q, k)
        # the same inputs are refused at every precision: finite in float64 terms
        finite = np.isfinite(scores.astype(np.float64, copy=False))
    if not np.all(finite):
        # Finite inputs whose logits overflow binary64 would otherwise look like empty rows
        # (output 0, lse -inf) or give NaN: refuse instead of returning a wrong answer.
        raise ValueError(
            "query: scale * query . key overflows float64 (non-finite logits); "
            "rescale query/key or pass a smaller scale"
        )
    logits = scores + log_weight
    row_max = np.max(logits, axis=-1, keepdims=True, initial=-np.inf)
    empty = ~np.isfinite(row_max)
    shift = np.where(empty, work(0.0), row_max)
    p = np.exp(logits - shift)
    z = p.sum(axis=-1, keepdims=True)
    one = work(1.0)
    out = np.einsum("bhij,bhjd->bhid", p, v) / np.where(empty, one, z)
    out = np.where(empty, work(0.0), out)
    with np.errstate(divide="ignore"):
        lse = np.where(empty, work(-np.inf), shift + np.log(np.where(empty, one, z)))[..., 0]
    return out, lse


def _as_float64(result):
    """``(output, lse)`` rounded to float64 (once; a no-op on float64 results)."""
    out, lse = result
    return out.astype(np.float64, copy=False), lse.astype(np.float64, copy=False)


def _padded_call(attend, q, k, v, query_positions, key_positions, attention_mask):
    """Run ``attend(q, k, v, qpos, kpos) -> (output, lse)`` on a padded batch (SPEC section 5).

    ``attend`` takes 1-D positions shared by its batch. Shared positions without a mask
    are one call. Per-sequence positions or a mask call ``attend`` once per sequence on
    its real tokens only (pad keys and pad query slots dropped), so a left-padded
    sequence gives bit for bit its unpadded result; pad query rows are output 0 and
    ``lse = -inf``.
    """
    batch, num_heads, n_q, n_k = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    shared = attention_mask is None and all(
        p is None or np.ndim(p) == 1 for p in (query_positions, key_positions)
    )
    if shared:
        qpos, kpos = resolve_positions(n_q, n_k, query_positions, key_positions)
        return attend(q, k, v, qpos, kpos)
    qpos, kpos, q_keep, k_keep = resolve_batch_positions(
        batch, n_q, n_k, query_positions, key_positions, attention_mask
    )
    out = np.zeros((batch, num_heads, n_q, v.shape[3]))
    lse = np.full((batch, num_heads, n_q), -np.inf)
    for b in range(batch):
        iq, ik = np.flatnonzero(q_keep[b]), np.flatnonzero(k_keep[b])
        o, l = attend(
            q[b : b + 1][:, :, iq],
            k[b : b + 1][:, :, ik],
            v[b : b + 1][:, :, ik],
            qpos[b, iq],
            kpos[b, ik],
        )
        out[b][:, iq], lse[b][:, iq] = o[0], l[0]
    return out, lse


def biased_attention(
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    *args: Any,
    bias: ArrayLike | None = None,
    scale: float | None = None,
    return_lse: bool | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Softmax attention with an additive bias: ``softmax(scale q k^T + bias) v``.

    Parameters
    ----------
    query, key, value : array_like
        See :func:`validate_qkv`.
    bias : array_like, ``(num_heads, n_q, n_k)`` or ``(batch, num_heads, n_q, n_k)``
        Keyword-only and required: float64; ``-inf`` marks inadmissible pairs (NaN and
        ``+inf`` are refused). Passed positionally, the old form, it still works for one
        release, with a :class:`plsh_ref.validation.PLSHDeprecationWarning`.
    scale : float, optional
        Logit scale, default ``1 / sqrt(head_dim)``.
    return_lse : bool, optional
        ``True``: ``(output, lse)``; ``False``: ``output``; not given: the pair with a
        DeprecationWarning (one release).

    Returns
    -------
    output : numpy.ndarray
        float64 ``(batch, num_heads, n_q, head_dim_v)``.
    lse : numpy.ndarray
        Only with ``return_lse``: float64 ``(batch, num_heads, n_q)``.

    Raises
    ------
    TypeError, ValueError
        See :func:`validate_qkv`; a bias of the wrong shape or holding NaN/``+inf``.

    References
    ----------
    ``proofs_notes/softmax_bias_identity.md``.
    """
    bias = keyword_argument(
        args,
        "bias",
        bias,
        "biased_attention(query, key, value, bias) with a positional bias",
        "biased_attention(query, key, value, bias=...)",
    )
    if bias is None:
        raise TypeError("bias: required (an array (num_heads, n_q, n_k), keyword bias=)")
    q, k, v = validate_qkv(query, key, value)
    b = as_float_array("bias", bias, ndim=(3, 4), finite=False)
    if np.any(np.isnan(b)) or np.any(b == np.inf):
        raise ValueError("bias: contains NaN or +inf (use -inf for masked pairs)")
    want = (q.shape[1], q.shape[2], k.shape[2])
    if b.shape[-3:] != want or (b.ndim == 4 and b.shape[0] != q.shape[0]):
        raise ValueError(f"bias: shape {b.shape} does not match (num_heads, n_q, n_k) = {want}")
    if b.ndim == 3:
        b = b[None]
    result = _softmax_with_log_weight(q, k, v, b, check_scale(scale, q.shape[3]))
    return select_return(result, return_lse, "biased_attention")


def alibi_attention(
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
    precision: str = "float64",
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Exact ALiBi attention in float64: ``softmax(scale q k^T - m_h |p_i - p_j|) v``.

    Equal to ``T*_i = sum_j A_ij L*_ij v_j / sum_j A_ij L*_ij`` with
    ``L*_ij = exp(-|p_i - p_j| / sigma_h)``.

    Parameters
    ----------
    query, key, value : array_like
        ``(batch, num_heads, n_q, head_dim)``, ``(batch, num_heads_kv, n_k, head_dim)``,
        ``(batch, num_heads_kv, n_k, head_dim_v)``; grouped-query heads allowed.
    slopes : array_like, ``(num_heads,)``, optional
        Positive slopes (inverse tokens); default :func:`plsh_ref.alibi.alibi_slopes`.
    causal : bool
        Mask keys with ``p_key > p_query``.
    scale : float, optional
        Logit scale, default ``1 / sqrt(head_dim)``.
    query_positions, key_positions : array_like of int, optional
        Absolute positions ``(n_q,)``, ``(n_k,)`` shared by the batch, or ``(batch, n_q)``,
        ``(batch, n_k)`` per sequence (HF ``position_ids``); default keys ``0..n_k-1`` and
        queries aligned to the end.
    attention_mask : array_like of bool or int, optional
        Key-padding mask ``(batch, n_k)``, 1/True = keep, 0 = pad (HF 2-D convention).
        Pad keys get weight 0; a query slot whose end-aligned key slot is padded is a pad
        query and returns output 0, ``lse = -inf``; positions at pad slots are ignored
        (:func:`plsh_ref.alibi.resolve_batch_positions`). A left-padded sequence gives
        exactly its unpadded result on its real tokens.
    return_lse : bool, optional
        ``True``: ``(output, lse)``; ``False``: ``output``; not given: the pair with a
        DeprecationWarning (one release; the default becomes ``False``, as
        :func:`plsh_fast.plsh_attention`).
    precision : {"float64", "extended"}
        ``"extended"``: the bias ``-m_h |p_i - p_j|``, logits, exponentials, sums and LSE in
        ``numpy.longdouble`` from the exact binary64 inputs, rounded to float64 at the end
        (module docstring; 7-13x slower, measured on a 2-core VM at n = 64-256). Default
        ``"float64"``.

    Returns
    -------
    output : numpy.ndarray
        float64 ``(batch, num_heads, n_q, head_dim_v)``; 0 on rows with no admissible key.
    lse : numpy.ndarray
        Only with ``return_lse``: float64 ``(batch, num_heads, n_q)``; ``-inf`` there.

    Raises
    ------
    TypeError, ValueError
        Bad shapes, NaN/inf, non-dividing head counts, non-positive slopes or scale,
        non-integer positions, logits ``scale q.k`` that overflow float64 (``query``), a
        mask of the wrong shape or with entries other than 0/1 (``attention_mask``); an
        unknown ``precision``, or ``"extended"`` where it is not available
        (:func:`precision_dtype`).

    References
    ----------
    Press et al. (2022); SPEC sections 1 and 5.

    Examples
    --------
    >>> import numpy as np
    >>> from plsh_ref.alibi import alibi_slopes
    >>> from plsh_ref.attention import alibi_attention
    >>> rng = np.random.default_rng(0)
    >>> query, key, value = rng.standard_normal((3, 1, 4, 8, 16))  # (batch, heads, n, head_dim)
    >>> out, lse = alibi_attention(
    ...     query, key, value, slopes=alibi_slopes(4), causal=True, return_lse=True
    ... )
    >>> out.shape, lse.shape
    ((1, 4, 8, 16), (1, 4, 8))
    """
    causal = check_bool("causal", causal)
    work = precision_dtype(precision)
    q, k, v = validate_qkv(query, key, value)
    m = check_slopes(slopes, q.shape[1])
    c = check_scale(scale, q.shape[3])

    def attend(q, k, v, qpos, kpos):
        if work is np.float64:
            bias = alibi_bias(m, qpos, kpos, causal=causal)
        else:
            # The bias is linear in the slopes: B(m) = m B(1), and B(1) = -|p_i - p_j| (or
            # -inf) is exact in float64, so the one product m |p_i - p_j| rounds in ``work``.
            unit = alibi_bias(np.ones_like(m), qpos, kpos, causal=causal)
            bias = m.astype(work)[:, None, None] * unit.astype(work)
        return _softmax_with_log_weight(q, k, v, bias[None], c, work)

    result = _padded_call(attend, q, k, v, query_positions, key_positions, attention_mask)
    return select_return(_as_float64(result), return_lse, "alibi_attention")


def no_bias_attention(
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    *,
    causal: bool = True,
    scale: float | None = None,
    query_positions: ArrayLike | None = None,
    key_positions: ArrayLike | None = None,
    attention_mask: ArrayLike | None = None,
    return_lse: bool | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Baseline without positional bias: ``softmax(scale q k^T) v`` (causal mask optional).

    Shapes, padding (``attention_mask``, per-sequence positions), returns and errors as
    :func:`alibi_attention`. The paper's "no bias" baseline.

    References
    ----------
    ``docs/experiments.md`` (the no-bias baseline of the output experiment).
    """
    causal = check_bool("causal", causal)
    q, k, v = validate_qkv(query, key, value)

    c = check_scale(scale, q.shape[3])

    def attend(q, k, v, qpos, kpos):
        log_w = np.zeros((1, 1, qpos.shape[0], kpos.shape[0]))
        if causal:
            log_w = np.where(kpos[None, :] <= qpos[:, None], 0.0, -np.inf)[None, None]
        return _softmax_with_log_weight(q, k, v, log_w, c)

    result = _padded_call(attend, q, k, v, query_positions, key_positions, attention_mask)
    return select_return(result, return_lse, "no_bias_attention")


def fixed_block_attention(
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    block_size: int | Sequence[int],
    *,
    causal: bool = True,
    scale: float | None = None,
    query_positions: ArrayLike | None = None,
    key_positions: ArrayLike | None = None,
    attention_mask: ArrayLike | None = None,
    return_lse: bool | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Baseline with fixed blocks: attend only within ``floor(p / block_size)`` bins.

    The deterministic block-diagonal mask of the paper's "fixed blocks" baseline.

    Parameters
    ----------
    block_size : int or sequence of int
        Block length in tokens, ``>= 1``: one for all heads, or one per head
        (length ``num_heads``).

    Other parameters (padding included), returns and errors as :func:`alibi_attention`.

    References
    ----------
    ``docs/experiments.md`` (the fixed-block baseline of the output experiment).
    """
    causal = check_bool("causal", causal)
    q, k, v = validate_qkv(query, key, value)
    if np.ndim(block_size) == 0:
        sizes = [check_int("block_size", block_size, minimum=1)] * q.shape[1]
    else:
        sizes = [check_int("block_size", b, minimum=1) for b in cast(Sequence[int], block_size)]
        if len(sizes) != q.shape[1]:
            raise ValueError(
                f"block_size: needs {q.shape[1]} entries (one per head), got {len(sizes)}"
            )
    size = np.asarray(sizes, dtype=np.int64)[:, None, None]

    c = check_scale(scale, q.shape[3])

    def attend(q, k, v, qpos, kpos):
        same = (qpos[None, :, None] // size) == (kpos[None, None, :] // size)
        if causal:
            same &= kpos[None, None, :] <= qpos[None, :, None]
        return _softmax_with_log_weight(q, k, v, np.where(same, 0.0, -np.inf)[None], c)

    result = _padded_call(attend, q, k, v, query_positions, key_positions, attention_mask)
    return select_return(result, return_lse, "fixed_block_attention")


def plsh_attention(
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
    method: str = "counts",
    backend: str | None = None,
    precision: str = "float64",
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """PLSH attention ``T~_i = sum_j A_ij M~_ij v_j / sum_j A_ij M~_ij`` in float64.

    Parameters
    ----------
    query, key, value : array_like
        As :func:`alibi_attention`.
    partition : PartitionSample
        Keyword-only and required; ``num_heads`` must equal the query's; from
        :func:`plsh_ref.partition.draw_partition`. Passed positionally (the old form) it
        still works for one release, with a DeprecationWarning, and returns
        ``(output, lse)`` as before.
    causal, scale, query_positions, key_positions, attention_mask
        As :func:`alibi_attention`; bins use each sequence's own positions, so a
        left-padded sequence gives its unpadded result (bins bit for bit).
    return_lse : bool, optional
        ``True``: ``(output, lse)``; ``False``: ``output``; not given: the pair with a
        DeprecationWarning (one release; the default becomes ``False``, as
        :func:`plsh_fast.plsh_attention`).
    method : {"counts", "reduction"}
        Which formula. ``"counts"``: softmax with bias ``log C_ij`` (one fused pass; SPEC
        section 3b). ``"reduction"``: the paper's algorithm: for every sample, unbiased
        attention inside each block, then the ``s`` partial results are merged by their
        numerators and denominators (an LSE merge). Both compute the same function (to
        rounding).
    backend : {"counts", "reduction"}, optional
        Deprecated spelling of ``method`` (one release; DeprecationWarning): ``backend``
        names where a function runs, and the reference runs in numpy only.
    precision : {"float64", "extended"}
        ``"extended"``: weights ``log(C_ij / s)``, logits, exponentials, sums (and the
        reduction's merge) and LSE in ``numpy.longdouble``, rounded to float64 at the end
        (module docstring). Default ``"float64"``.

    Returns
    -------
    output : numpy.ndarray
        float64 ``(batch, num_heads, n_q, head_dim_v)``.
    lse : numpy.ndarray
        Only with ``return_lse``: float64 ``(batch, num_heads, n_q)``,
        ``lse = log sum_j A_ij M~_ij``.

    Raises
    ------
    TypeError, ValueError
        As :func:`alibi_attention`; no ``partition``, or one with a different number of
        heads; an unknown ``method`` or ``precision``.

    References
    ----------
    Wolfson & Wagner (2026), Theorem 2.2; SPEC section 3.

    Examples
    --------
    >>> import numpy as np
    >>> from plsh_ref.alibi import alibi_slopes
    >>> from plsh_ref.attention import alibi_attention, plsh_attention
    >>> from plsh_ref.partition import draw_partition
    >>> rng = np.random.default_rng(0)
    >>> query, key, value = rng.standard_normal((3, 1, 4, 64, 16))
    >>> partition = draw_partition(1 / alibi_slopes(4), num_samples=256, seed=0)
    >>> approx = plsh_attention(query, key, value, partition=partition, return_lse=False)
    >>> exact = alibi_attention(query, key, value, return_lse=False)
    >>> approx.shape
    (1, 4, 64, 16)
    >>> bool(np.abs(approx - exact).max() < 0.5)  # the error falls like 1 / sqrt(num_samples)
    True
    """
    partition, return_lse = partition_argument(args, partition, return_lse, "plsh_attention")
    if backend is not None:
        warn_deprecated(f"plsh_attention(backend={backend!r})", f"method={backend!r}")
        method = backend
    if method not in ("counts", "reduction"):
        raise ValueError(f"method: must be 'counts' or 'reduction', got {method!r}")
    causal = check_bool("causal", causal)
    work = precision_dtype(precision)
    q, k, v = validate_qkv(query, key, value)
    partition = check_partition(partition, q.shape[1])
    c = check_scale(scale, q.shape[3])

    def attend(q, k, v, qpos, kpos):
        if method == "counts":
            cnt = counts(partition, qpos, kpos, causal=causal)
            w = count_bias(cnt, partition.num_samples, dtype=work)  # log(C / s) in work
            return _softmax_with_log_weight(q, k, v, w[None], c, work)
        return _reduction(q, k, v, partition, qpos, kpos, causal, c, work)

    result = _padded_call(attend, q, k, v, query_positions, key_positions, attention_mask)
    return select_return(_as_float64(result), return_lse, "plsh_attention")


def _reduction(q, k, v, partition, qpos, kpos, causal, c, work=np.float64):
    """Paper's reduction: per sample, unbiased block attention; LSE-merge the samples."""
    batch, num_heads, n_q, _ = q.shape
    group = num_heads // k.shape[1]
    s = partition.num_samples
    bq, bk = bins(partition, qpos), bins(partition, kpos)
    lse_t = np.full((s, batch, num_heads, n_q), -np.inf, dtype=work)
    out_t = np.zeros((s, batch, num_heads, n_q, v.shape[3]), dtype=work)
    for h in range(num_heads):
        kq, kk, kv = q[:, h], k[:, h // group], v[:, h // group]
        for t in range(s):
            for b in np.unique(bq[h, t]):
                iq = np.flatnonzero(bq[h, t] == b)
                ik = np.flatnonzero(bk[h, t] == b)
                if ik.size == 0:
                    continue
                log_w = np.zeros((iq.size, ik.size))
                if causal:
                    log_w = np.where(kpos[ik][None, :] <= qpos[iq][:, None], 0.0, -np.inf)
                o, l = _softmax_with_log_weight(
                    kq[:, None, iq], kk[:, None, ik], kv[:, None, ik], log_w[None, None], c, work
                )
                out_t[t, :, h][:, iq] = o[:, 0]
                lse_t[t, :, h][:, iq] = l[:, 0]
    # Merge: numerator_t = exp(lse_t) out_t, denominator_t = exp(lse_t); M~ = C / s.
    row_max = np.max(lse_t, axis=0)
    empty = ~np.isfinite(row_max)
    shift = np.where(empty, work(0.0), row_max)
    wts = np.exp(lse_t - shift)
    z = wts.sum(axis=0)
    one = work(1.0)
    out = np.einsum("tbhi,tbhid->bhid", wts, out_t) / np.where(empty, one, z)[..., None]
    out = np.where(empty[..., None], work(0.0), out)
    with np.errstate(divide="ignore"):
        lse = np.where(
            empty, work(-np.inf), shift + np.log(np.where(empty, one, z)) - np.log(work(s))
        )
    return out, lse
