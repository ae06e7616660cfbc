"""Example kernels for ``plsh verify``: correct ones and deliberately broken ones.

They follow the kernel contracts of :mod:`plsh_ref.testing.reference` and exist to show
what the property suite accepts and what it catches (the validation guide runs them).
Nothing here imports torch or ``plsh_fast`` at import time.

* :func:`numpy_alibi` (correct): ALiBi attention computed in the input dtype with numpy,
  padded batches included.
* :func:`numpy_alibi_standard_slopes` (correct): the same, computing Press et al.'s
  slopes itself (``--slopes standard``, taken automatically from its signature).
* :func:`sdpa_alibi` (correct, torch): ALiBi through
  ``torch.nn.functional.scaled_dot_product_attention`` with a dense bias, a template for
  torch kernels.
* :func:`sign_flipped_alibi` (broken): the bias ``+m |i - j|`` instead of ``-m |i - j|``.
* :func:`interleaved_gqa_alibi` (broken): query head ``h`` reads kv head ``h % H_kv``.
* :func:`averaged_plsh` (broken): the mean of the ``s`` per-sample softmax outputs, a
  different estimator from PLSH attention, which sums numerators and denominators first
  (SPEC section 4). It agrees when ``s = 1``, so the suite must find cases with ``s > 1``.
* :func:`mask_only_plsh` (broken): uses ``1[C_ij > 0]`` instead of the counts ``C_ij``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..alibi import alibi_bias, resolve_batch_positions, resolve_positions
from ..attention import biased_attention
from ..partition import PartitionSample, count_bias, counts
from .baseline import plain_attention_numpy

__all__ = [
    "averaged_plsh",
    "interleaved_gqa_alibi",
    "mask_only_plsh",
    "numpy_alibi",
    "numpy_alibi_standard_slopes",
    "press_slopes",
    "sdpa_alibi",
    "sign_flipped_alibi",
]


def _positions(query, key, query_positions, key_positions):
    return resolve_positions(query.shape[2], key.shape[2], query_positions, key_positions)


def _padded_alibi_bias(query, key, slopes, causal, query_positions, key_positions, attention_mask):
    """``(batch, heads, n_q, n_k)`` ALiBi bias of a padded batch, ``-inf`` where masked."""
    qpos, kpos, q_keep, k_keep = resolve_batch_positions(
        query.shape[0], query.shape[2], key.shape[2], query_positions, key_positions, attention_mask
    )
    bias = np.stack([alibi_bias(slopes, qp, kp, causal=causal) for qp, kp in zip(qpos, kpos)])
    bias = bias.reshape(query.shape[0], len(slopes), query.shape[2], key.shape[2])
    keep = q_keep[:, None, :, None] & k_keep[:, None, None, :]
    return np.where(keep, bias, -np.inf)


def numpy_alibi(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    *,
    slopes: np.ndarray,
    causal: bool,
    scale: float | None,
    query_positions: np.ndarray | None,
    key_positions: np.ndarray | None,
    attention_mask: np.ndarray | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Correct ALiBi attention computed in the dtype of ``query`` (numpy contract).

    Parameters
    ----------
    query, key, value : numpy.ndarray
        float16, float32 or float64, layout ``(batch, num_heads[_kv], seq_len, head_dim)``.
    slopes : numpy.ndarray
        float64 ``(num_heads,)``.
    causal : bool
    scale : float or None
    query_positions, key_positions : numpy.ndarray or None
        ``(n,)`` shared or ``(batch, n)`` per sequence.
    attention_mask : numpy.ndarray or None
        ``(batch, n_k)``, 1 = keep, 0 = pad.

    Returns
    -------
    (output, lse) : tuple of numpy.ndarray
        Output in the dtype of ``query``, LSE in float32 (float64 for float64 inputs).

    References
    ----------
    SPEC sections 1 and 5; ``docs/validation.md``, "Reading the report" (the correct kernel).
    """
    bias = _padded_alibi_bias(
        query, key, np.asarray(slopes), causal, query_positions, key_positions, attention_mask
    )
    out, lse = plain_attention_numpy(query, key, value, bias, scale=scale, dtype=str(query.dtype))
    lse_dtype = np.float64 if query.dtype == np.float64 else np.float32
    return out.astype(query.dtype), lse.astype(lse_dtype)


def press_slopes(num_heads: int) -> np.ndarray:
    """Press et al.'s slopes, written out as their reference code does (float64).

    ``start = 2^(-2^-(log2(n) - 3))`` and ``start^(h+1)`` for a power of two ``n``;
    otherwise the slopes of the largest power of two below, then every other slope of
    twice that. An independent spelling of :func:`plsh_ref.alibi.alibi_slopes`, for
    ``plsh verify-slopes`` and :func:`numpy_alibi_standard_slopes`.

    Parameters
    ----------
    num_heads : int
        ``>= 1``.

    Returns
    -------
    numpy.ndarray
        float64 ``(num_heads,)``.

    References
    ----------
    Press et al. (2022) and their reference code; SPEC section 1.
    """

    def power_of_2(n):
        start = 2.0 ** (-(2.0 ** -(np.log2(n) - 3)))
        return [start ** (i + 1) for i in range(n)]

    if np.log2(num_heads).is_integer():
        return np.array(power_of_2(num_heads))
    closest = 2 ** int(np.floor(np.log2(num_heads)))
    extra = power_of_2(2 * closest)[0::2][: num_heads - closest]
    return np.array(power_of_2(closest) + extra)


def numpy_alibi_standard_slopes(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    *,
    causal: bool,
    scale: float | None,
    query_positions: np.ndarray | None,
    key_positions: np.ndarray | None,
    attention_mask: np.ndarray | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Correct ALiBi attention with its own slopes (:func:`press_slopes`), numpy contract.

    No ``slopes`` argument: ``plsh verify`` runs it in ``--slopes standard`` mode. Other
    parameters and returns as :func:`numpy_alibi`.

    References
    ----------
    ``docs/validation.md``, "Kernels with their own slopes"; Press et al. (2022).
    """
    return numpy_alibi(
        query,
        key,
        value,
        slopes=press_slopes(query.shape[1]),
        causal=causal,
        scale=scale,
        query_positions=query_positions,
        key_positions=key_positions,
        attention_mask=attention_mask,
    )


def sdpa_alibi(
    query: Any,
    key: Any,
    value: Any,
    *,
    slopes: Any,
    causal: bool,
    scale: float | None,
    query_positions: Any,
    key_positions: Any,
    attention_mask: Any = None,
) -> Any:
    """Correct ALiBi attention through torch's ``scaled_dot_product_attention`` (torch contract).

    The dense bias ``-m_h |p_i - p_j|`` (``-inf`` where causal forbids or a key is padded)
    is built per sequence in float64 and passed as ``attn_mask`` in the input dtype;
    grouped-query heads use ``enable_gqa``. Rows without an admissible key come out of
    SDPA as NaN and are set to 0, as the contract requires.

    Parameters
    ----------
    query, key, value : torch.Tensor
        float16, bfloat16 or float32 (float64 on CPU), on one device.
    slopes : torch.Tensor
        float64 ``(num_heads,)``.
    causal : bool
    scale : float or None
    query_positions, key_positions : torch.Tensor or None
        int64 ``(n,)`` or ``(batch, n)``.
    attention_mask : torch.Tensor or None
        int64 ``(batch, n_k)``, 1 = keep, 0 = pad.

    Returns
    -------
    torch.Tensor
        Output in the dtype of ``query``, ``(batch, num_heads, n_q, head_dim_v)``.

    References
    ----------
    ``torch.nn.functional.scaled_dot_product_attention`` (``attn_mask``,
    ``enable_gqa``); SPEC sections 1 and 5.
    """
    import torch
    import torch.nn.functional as F

    batch, n_q, n_k = query.shape[0], query.shape[2], key.shape[2]
    device = query.device
    if key_positions is None:
        key_positions = torch.arange(n_k, device=device)
    if query_positions is None:
        query_positions = torch.arange(n_q, device=device) + (n_k - n_q)
    qpos = query_positions.expand(batch, n_q)[:, None, :, None]
    kpos = key_positions.expand(batch, n_k)[:, None, None, :]
    distance = (qpos - kpos).abs().to(torch.float64)
    bias = -slopes.to(device)[None, :, None, None] * distance
    if causal:
        bias = bias.masked_fill(kpos > qpos, float("-inf"))
    if attention_mask is not None:
        bias = bias.masked_fill(attention_mask[:, None, None, :] == 0, float("-inf"))
    if n_k == 0:  # SDPA needs at least one key; no key means output 0
        return query.new_zeros(*query.shape[:3], value.shape[3])
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=bias.to(query.dtype),
        scale=scale,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return torch.nan_to_num(out, nan=0.0)


def sign_flipped_alibi(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    *,
    slopes: np.ndarray,
    causal: bool,
    scale: float | None,
    query_positions: np.ndarray | None,
    key_positions: np.ndarray | None,
    attention_mask: np.ndarray | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Broken: ALiBi with the bias sign flipped (``+m |i - j|``), computed in float64.

    Same contract as :func:`numpy_alibi`; returns the output only, in the input dtype.

    References
    ----------
    SPEC section 1 (the bias ``-m |p_i - p_j|``, negated here);
    ``docs/validation.md``, "What is run: the battery, then random problems" (the sign of the bias).
    """
    bias = _padded_alibi_bias(
        query, key, np.asarray(slopes), causal, query_positions, key_positions, attention_mask
    )
    bias = np.where(np.isfinite(bias), -bias, bias)
    out, _ = biased_attention(query, key, value, bias=bias, scale=scale, return_lse=True)
    return out.astype(query.dtype)


def interleaved_gqa_alibi(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    *,
    slopes: np.ndarray,
    causal: bool,
    scale: float | None,
    query_positions: np.ndarray | None,
    key_positions: np.ndarray | None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Broken: query head ``h`` reads kv head ``h % num_heads_kv`` instead of ``h // group``.

    The layout ``repeat(k, 'b g n d -> b (r g) n d')`` gives (as in x-transformers'
    ``Attend``); right for ``num_heads_kv`` 1 or ``num_heads``, wrong in between. Same
    contract as :func:`numpy_alibi`.

    References
    ----------
    SPEC section 5 (query head ``h`` uses kv head ``h // group``, not ``h % H_kv``);
    ``docs/validation.md``, "Reading the report".
    """
    reps = query.shape[1] // key.shape[1]
    key, value = np.tile(key, (1, reps, 1, 1)), np.tile(value, (1, reps, 1, 1))
    return numpy_alibi(
        query,
        key,
        value,
        slopes=slopes,
        causal=causal,
        scale=scale,
        query_positions=query_positions,
        key_positions=key_positions,
    )[0]


def averaged_plsh(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    *,
    partition: PartitionSample,
    causal: bool,
    scale: float | None,
    query_positions: np.ndarray | None,
    key_positions: np.ndarray | None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Broken: the mean over samples of per-sample block softmax outputs (float64).

    Each sample ``t`` gives ``softmax(scale q k^T + log M(h_t)) v``; averaging these
    outputs weights the samples equally instead of by their softmax denominators.

    Parameters
    ----------
    query, key, value : numpy.ndarray
    partition : PartitionSample
    causal, scale, query_positions, key_positions
        As the ``plsh`` contract.

    Returns
    -------
    numpy.ndarray
        Output in the input dtype.

    References
    ----------
    SPEC section 4 (averaging the per-sample outputs is a different estimator);
    ``proofs_notes/softmax_bias_identity.md``, section 5;
    ``docs/validation.md``, "Reading the report".
    """
    qpos, kpos = _positions(query, key, query_positions, key_positions)
    outs = []
    for t in range(partition.num_samples):
        one = partition.samples(t, t + 1)
        log_w = count_bias(counts(one, qpos, kpos, causal=causal), 1)
        outs.append(biased_attention(query, key, value, bias=log_w, scale=scale, return_lse=False))
    return np.mean(outs, axis=0).astype(query.dtype)


def mask_only_plsh(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    *,
    partition: PartitionSample,
    causal: bool,
    scale: float | None,
    query_positions: np.ndarray | None,
    key_positions: np.ndarray | None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Broken: attends to every key sharing a bin in some sample, ignoring the counts.

    Same contract as :func:`averaged_plsh`; returns ``(output, lse)`` in float64 inputs'
    precision, cast to the input dtype for the output.

    References
    ----------
    SPEC section 3 (keys weighted by the counts ``C_ij``, which this ignores).
    """
    qpos, kpos = _positions(query, key, query_positions, key_positions)
    c = counts(partition, qpos, kpos, causal=causal)
    bias = np.where(c > 0, 0.0, -np.inf)
    out, lse = biased_attention(query, key, value, bias=bias, scale=scale, return_lse=True)
    return out.astype(query.dtype), lse


# These two take shared (n,) positions only: a declared capability, so that per-sequence
# cases are not drawn (the battery's are listed as not covered) instead of failing for the
# wrong reason.
# the capability attribute the suite reads (docs/validation.md); functions declare no attributes
averaged_plsh.supports = {"batch_positions": False}  # type: ignore[attr-defined]
mask_only_plsh.supports = {"batch_positions": False}  # type: ignore[attr-defined]
