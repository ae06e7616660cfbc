"""Example kernels for ``plsh verify``: two correct ones and three deliberately broken ones.

They follow the kernel contracts of :mod:`plsh_ref.testing.reference` and exist to show
what the property suite accepts and what it catches (the validation guide runs them):

* :func:`numpy_alibi` (correct): ALiBi attention computed in the input dtype with numpy.
* :func:`sdpa_alibi` (correct, torch): ALiBi through
  ``torch.nn.functional.scaled_dot_product_attention`` with a dense bias, a template for
  torch kernels.
* :func:`plsh_fast_kernel` (correct, torch): a thin adapter from the ``plsh`` contract to
  ``plsh_fast.plsh_attention``.
* :func:`sign_flipped_alibi` (broken): the bias ``+m |i - j|`` instead of ``-m |i - j|``.
* :func:`averaged_plsh` (broken): the mean of the ``s`` per-sample softmax outputs, a
  different estimator from PLSH attention, which sums numerators and denominators first
  (SPEC section 4). It agrees when ``s = 1``, so the suite must find cases with ``s > 1``.
* :func:`mask_only_plsh` (broken): uses ``1[C_ij > 0]`` instead of the counts ``C_ij``.
"""

from __future__ import annotations

import numpy as np

from ..alibi import alibi_bias, resolve_positions
from ..attention import biased_attention
from ..partition import count_bias, counts
from .baseline import plain_attention_numpy

__all__ = [
    "averaged_plsh",
    "mask_only_plsh",
    "numpy_alibi",
    "plsh_fast_kernel",
    "sdpa_alibi",
    "sign_flipped_alibi",
]


def _positions(query, key, query_positions, key_positions):
    return resolve_positions(query.shape[2], key.shape[2], query_positions, key_positions)


def numpy_alibi(query, key, value, *, slopes, causal, scale, query_positions, key_positions):
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

    Returns
    -------
    (output, lse) : tuple of numpy.ndarray
        Output in the dtype of ``query``, LSE in float32 (float64 for float64 inputs).
    """
    qpos, kpos = _positions(query, key, query_positions, key_positions)
    bias = alibi_bias(slopes, qpos, kpos, causal=causal)
    out, lse = plain_attention_numpy(query, key, value, bias, scale=scale, dtype=str(query.dtype))
    lse_dtype = np.float64 if query.dtype == np.float64 else np.float32
    return out.astype(query.dtype), lse.astype(lse_dtype)


def sdpa_alibi(query, key, value, *, slopes, causal, scale, query_positions, key_positions):
    """Correct ALiBi attention through torch's ``scaled_dot_product_attention`` (torch contract).

    The dense bias ``-m_h |p_i - p_j|`` (``-inf`` where causal forbids) is passed as
    ``attn_mask`` in the input dtype; grouped-query heads use ``enable_gqa``. Rows without
    an admissible key come out of SDPA as NaN and are set to 0, as the contract requires.

    Parameters
    ----------
    query, key, value : torch.Tensor
        float16, bfloat16 or float32 (float64 on CPU), on one device.
    slopes : torch.Tensor
        float64 ``(num_heads,)``.
    causal : bool
    scale : float or None
    query_positions, key_positions : torch.Tensor or None
        int64.

    Returns
    -------
    torch.Tensor
        Output in the dtype of ``query``, ``(batch, num_heads, n_q, head_dim_v)``.
    """
    import torch
    import torch.nn.functional as F

    n_q, n_k = query.shape[2], key.shape[2]
    device = query.device
    if key_positions is None:
        key_positions = torch.arange(n_k, device=device)
    if query_positions is None:
        query_positions = torch.arange(n_q, device=device) + (n_k - n_q)
    distance = (query_positions[:, None] - key_positions[None, :]).abs().to(torch.float64)
    bias = -slopes.to(device)[:, None, None] * distance
    if causal:
        bias = bias.masked_fill(
            key_positions[None, None, :] > query_positions[None, :, None], float("-inf")
        )
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


def sign_flipped_alibi(query, key, value, *, slopes, causal, scale, query_positions, key_positions):
    """Broken: ALiBi with the bias sign flipped (``+m |i - j|``), computed in float64.

    Same contract as :func:`numpy_alibi`; returns the output only, in the input dtype.
    """
    qpos, kpos = _positions(query, key, query_positions, key_positions)
    bias = -alibi_bias(slopes, qpos, kpos, causal=False)
    if causal:
        bias = np.where(kpos[None, None, :] <= qpos[None, :, None], bias, -np.inf)
    out, _ = biased_attention(query, key, value, bias, scale=scale)
    return out.astype(query.dtype)


def averaged_plsh(query, key, value, *, partition, causal, scale, query_positions, key_positions):
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
    """
    qpos, kpos = _positions(query, key, query_positions, key_positions)
    outs = []
    for t in range(partition.num_samples):
        one = partition.samples(t, t + 1)
        log_w = count_bias(counts(one, qpos, kpos, causal=causal), 1)
        outs.append(biased_attention(query, key, value, log_w, scale=scale)[0])
    return np.mean(outs, axis=0).astype(query.dtype)


def mask_only_plsh(query, key, value, *, partition, causal, scale, query_positions, key_positions):
    """Broken: attends to every key sharing a bin in some sample, ignoring the counts.

    Same contract as :func:`averaged_plsh`; returns ``(output, lse)`` in float64 inputs'
    precision, cast to the input dtype for the output.
    """
    qpos, kpos = _positions(query, key, query_positions, key_positions)
    c = counts(partition, qpos, kpos, causal=causal)
    bias = np.where(c > 0, 0.0, -np.inf)
    out, lse = biased_attention(query, key, value, bias, scale=scale)
    return out.astype(query.dtype), lse


def plsh_fast_kernel(
    query, key, value, *, partition, causal, scale, query_positions, key_positions
):
    """Adapter from the ``plsh`` contract to ``plsh_fast.plsh_attention`` (torch).

    Run it with ``plsh verify plsh_ref.testing.examples:plsh_fast_kernel --kind plsh
    --framework torch``. Imports ``plsh_fast`` (and so torch) only when called.

    Parameters
    ----------
    query, key, value : torch.Tensor
    partition : PartitionSample
    causal, scale, query_positions, key_positions
        As the ``plsh`` contract (positions as int64 tensors or ``None``).

    Returns
    -------
    (output, lse) : tuple of torch.Tensor
    """
    import plsh_fast

    return plsh_fast.plsh_attention(
        query,
        key,
        value,
        partition=partition,
        causal=causal,
        scale=scale,
        query_positions=query_positions,
        key_positions=key_positions,
        return_lse=True,
    )
