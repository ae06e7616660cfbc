"""Plain attention with a dense bias in a low-precision dtype: the yardstick of SPEC section 6.

The tolerance rule compares a kernel's error against the error of the most direct
implementation in the same dtype, ``softmax(scale q k^T + bias) v`` computed with every
intermediate in that dtype. :func:`plain_attention_numpy` does it in numpy (float16,
float32, float64; bfloat16 is emulated by rounding each intermediate to bfloat16), and
:func:`plain_attention_torch` in torch, imported only when called.

Rows without an admissible key (all bias entries ``-inf``) return output 0 and
``lse = -inf``, the convention of the reference.
"""

from __future__ import annotations

import numpy as np

from ..attention import expand_kv
from ..validation import check_scale
from .problems import round_to_dtype

__all__ = ["plain_attention_numpy", "plain_attention_torch"]


def plain_attention_numpy(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    bias: np.ndarray,
    *,
    scale: float | None,
    dtype: str,
) -> tuple[np.ndarray, np.ndarray]:
    """``softmax(scale q k^T + bias) v`` with every intermediate rounded to ``dtype``.

    Parameters
    ----------
    query, key, value : numpy.ndarray
        Layout ``(batch, num_heads[_kv], seq_len, head_dim)``; grouped-query heads allowed.
    bias : numpy.ndarray
        float64, ``(num_heads, n_q, n_k)`` or ``(batch, num_heads, n_q, n_k)``; ``-inf``
        where masked.
    scale : float or None
        Logit scale; ``None`` means ``1 / sqrt(head_dim)``.
    dtype : {"float16", "bfloat16", "float32", "float64"}

    Returns
    -------
    (output, lse) : tuple of numpy.ndarray
        float64 arrays holding values of ``dtype``: ``(batch, num_heads, n_q, head_dim_v)``
        and ``(batch, num_heads, n_q)``.

    Raises
    ------
    ValueError
        If ``dtype`` is unknown.

    References
    ----------
    SPEC section 6 (the yardstick: plain attention with the same dense bias in the
    dtype of ``out``); ``docs/validation.md``, "The tolerance rule".
    """

    def r(x):
        return round_to_dtype(x, dtype).astype(np.float64)

    q = r(query)
    k = r(expand_kv(np.asarray(key, dtype=np.float64), q.shape[1]))
    v = r(expand_kv(np.asarray(value, dtype=np.float64), q.shape[1]))
    c = check_scale(None, q.shape[3]) if scale is None else float(scale)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        logits = r(r(np.einsum("bhid,bhjd->bhij", q, k)) * r(np.float64(c)))
        logits = r(logits + r(bias if np.ndim(bias) == 4 else np.asarray(bias)[None]))
        row_max = np.max(logits, axis=-1, keepdims=True, initial=-np.inf)
        empty = ~np.isfinite(row_max)
        shift = np.where(empty, 0.0, row_max)
        p = r(np.exp(logits - shift))
        z = r(p.sum(axis=-1, keepdims=True))
        out = r(r(np.einsum("bhij,bhjd->bhid", p, v)) / np.where(empty, 1.0, z))
        lse = r(shift + np.log(np.where(empty, 1.0, z)))[..., 0]
    out = np.where(empty, 0.0, out)
    lse = np.where(empty[..., 0], -np.inf, lse)
    return out, lse


def plain_attention_torch(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    bias: np.ndarray,
    *,
    scale: float | None,
    dtype: str,
    device: str = "cpu",
) -> tuple[np.ndarray, np.ndarray]:
    """The same as :func:`plain_attention_numpy`, computed by torch in ``dtype`` on ``device``.

    Parameters
    ----------
    query, key, value, bias, scale
        As :func:`plain_attention_numpy` (numpy arrays).
    dtype : {"float16", "bfloat16", "float32", "float64"}
    device : str
        A torch device string, e.g. ``"cpu"`` or ``"cuda"``.

    Returns
    -------
    (output, lse) : tuple of numpy.ndarray
        float64 copies of the torch results.

    Raises
    ------
    ImportError
        If torch is not installed.

    References
    ----------
    SPEC section 6 (the yardstick: plain torch attention with the same dense bias
    in the dtype of ``out``); ``docs/validation.md``, "The tolerance rule".
    """
    import torch

    tdtype = getattr(torch, dtype)

    def t(x):
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)).to(device, tdtype)

    q = t(query)
    k = t(expand_kv(np.asarray(key, dtype=np.float64), q.shape[1]))
    v = t(expand_kv(np.asarray(value, dtype=np.float64), q.shape[1]))
    c = check_scale(None, q.shape[3]) if scale is None else float(scale)
    bias = np.asarray(bias)
    logits = (q @ k.transpose(-1, -2)) * c + t(bias if bias.ndim == 4 else bias[None])
    empty = (
        torch.isneginf(logits).all(dim=-1)
        if logits.shape[-1]
        else torch.ones(logits.shape[:-1], dtype=torch.bool, device=device)
    )
    weights = torch.softmax(logits, dim=-1) if logits.shape[-1] else logits
    out = torch.nan_to_num(weights @ v, nan=0.0)
    lse = (
        torch.logsumexp(logits, dim=-1)
        if logits.shape[-1]
        else torch.full(logits.shape[:-1], -float("inf"), dtype=tdtype, device=device)
    )
    out = torch.where(empty[..., None], torch.zeros_like(out), out)
    lse = torch.where(empty, torch.full_like(lse, -float("inf")), lse)
    return (
        out.detach().to("cpu", torch.float64).numpy(),
        lse.detach().to("cpu", torch.float64).numpy(),
    )
