"""Seeded-bug ALiBi kernels for the acceptance matrix of the validation toolkit.

``make_kernel(**bugs)`` builds a numpy ALiBi kernel with the ``plsh verify`` contract
(``attention_mask`` included) computed in the input dtype; with no bug it is correct, and
each keyword switches on one bug of the public record. ``BROKEN`` names one kernel per
bug class; ``CORRECT`` the correct ones. Test helper, not part of the package.
"""

from __future__ import annotations

import numpy as np

from plsh_ref.alibi import alibi_slopes, resolve_batch_positions
from plsh_ref.testing.baseline import plain_attention_numpy
from plsh_ref.testing.problems import round_to_dtype


def _slopes_for(num_heads, given, bugs):
    if given is not None and not bugs.get("standard_slopes"):
        m = np.asarray(given, dtype=np.float64)
    elif bugs.get("power_of_two_rule"):  # 2^(-8(h+1)/H) for every H (attention-gym's)
        m = np.exp2(-8.0 * np.arange(1, num_heads + 1) / num_heads)
    else:
        m = alibi_slopes(num_heads)
    if bugs.get("slopes_bf16"):
        m = round_to_dtype(m, "bfloat16").astype(np.float64)
    return m


def _forward(query, key, value, slopes, causal, scale, qpos, kpos, mask, bugs):
    batch, num_heads, n_q, d = query.shape
    n_k = key.shape[2]
    if bugs.get("ignores_positions"):
        qpos = kpos = None
    if bugs.get("ignores_mask"):
        mask = None
    if bugs.get("first_sequence_positions"):
        qpos = None if qpos is None else np.asarray(qpos).reshape(-1, n_q)[0]
        kpos = None if kpos is None else np.asarray(kpos).reshape(-1, n_k)[0]
    qp, kp, q_keep, k_keep = resolve_batch_positions(batch, n_q, n_k, qpos, kpos, mask)
    if bugs.get("positions_bf16"):
        qp = round_to_dtype(qp.astype(np.float64), "bfloat16").astype(np.float64)
        kp = round_to_dtype(kp.astype(np.float64), "bfloat16").astype(np.float64)
    m = _slopes_for(num_heads, slopes, bugs)
    diff = qp[:, None, :, None] - kp[:, None, None, :]
    distance = diff if bugs.get("signed_distance") else np.abs(diff)
    if bugs.get("capped_distance"):
        distance = np.minimum(distance, 255)
    sign = 1.0 if bugs.get("sign_flipped") else -1.0
    bias = sign * m[None, :, None, None] * distance
    if causal:
        if bugs.get("causal_top_left"):
            allowed = np.arange(n_k)[None, :] <= np.arange(n_q)[:, None]
            bias = np.where(allowed[None, None], bias, -np.inf)
        else:
            bias = np.where(kp[:, None, None, :] <= qp[:, None, :, None], bias, -np.inf)
    keep = q_keep[:, None, :, None] & k_keep[:, None, None, :]
    bias = np.where(keep, bias, -np.inf)
    if bugs.get("gqa_modulo"):
        reps = num_heads // key.shape[1]
        key, value = np.tile(key, (1, reps, 1, 1)), np.tile(value, (1, reps, 1, 1))
    if bugs.get("ignores_scale") or scale is None:
        scale = 1.0 / np.sqrt(d) if d else 1.0
        if bugs.get("default_scale_one"):
            scale = 1.0
        if bugs.get("padded_head_dim"):
            scale = 1.0 / np.sqrt(1 << max(d - 1, 0).bit_length())
    dtype = str(query.dtype)
    if bugs.get("unstable_softmax"):
        logits = (query.astype(dtype) @ np.swapaxes(key, -1, -2).astype(dtype)) * scale
        logits = (logits + bias).astype(dtype)
        with np.errstate(over="ignore", invalid="ignore"):
            p = np.exp(logits).astype(dtype)
            out = (p @ value.astype(dtype)) / p.sum(-1, keepdims=True)
        return np.nan_to_num(out, nan=0.0).astype(query.dtype)
    out, lse = plain_attention_numpy(query, key, value, bias, scale=scale, dtype=dtype)
    if bugs.get("nan_empty_rows"):
        out = np.where(np.isneginf(lse)[..., None], np.nan, out)
    if bugs.get("lse_log2"):
        lse = lse / np.log(2.0)
    if bugs.get("finite_lse_empty_rows"):
        lse = np.where(np.isneginf(lse), -1e4, lse)
    return out.astype(query.dtype), lse.astype(np.float64)


def make_kernel(name, *, standard=False, **bugs):
    """A numpy ALiBi kernel with the bugs switched on (``standard``: own slopes)."""
    if standard:

        def kernel(
            query, key, value, *, causal, scale, query_positions, key_positions, attention_mask=None
        ):
            return _forward(
                query,
                key,
                value,
                None,
                causal,
                scale,
                query_positions,
                key_positions,
                attention_mask,
                {**bugs, "standard_slopes": True},
            )

    else:

        def kernel(
            query,
            key,
            value,
            *,
            slopes,
            causal,
            scale,
            query_positions,
            key_positions,
            attention_mask=None,
        ):
            return _forward(
                query,
                key,
                value,
                slopes,
                causal,
                scale,
                query_positions,
                key_positions,
                attention_mask,
                bugs,
            )

    kernel.__name__ = kernel.__qualname__ = name
    globals()[name] = kernel
    return kernel


#: bug class -> (kernel, the battery case named after it)
BROKEN = {
    "gqa_modulo": (make_kernel("gqa_modulo", gqa_modulo=True), "gqa_grouped"),
    "nan_empty_rows": (make_kernel("nan_empty_rows", nan_empty_rows=True), "longer_queries"),
    "finite_lse_empty_rows": (
        make_kernel("finite_lse_empty_rows", finite_lse_empty_rows=True),
        "no_keys",
    ),
    "positions_bf16": (make_kernel("positions_bf16", positions_bf16=True), "positions_beyond_256"),
    "causal_top_left": (make_kernel("causal_top_left", causal_top_left=True), "decode_chunk"),
    "power_of_two_rule": (
        make_kernel("power_of_two_rule", standard=True, power_of_two_rule=True),
        "heads_6",
    ),
    "slopes_bf16": (
        make_kernel("slopes_bf16", standard=True, slopes_bf16=True),
        "heads_16_float32",
    ),
    "ignores_given_slopes": (
        make_kernel("ignores_given_slopes", standard_slopes=True),
        "random_slopes",
    ),
    "ignores_positions": (
        make_kernel("ignores_positions", ignores_positions=True),
        "positions_with_gaps",
    ),
    "first_sequence_positions": (
        make_kernel("first_sequence_positions", first_sequence_positions=True),
        "per_sequence_positions",
    ),
    "ignores_mask": (make_kernel("ignores_mask", ignores_mask=True), "left_padding_masked"),
    "sign_flipped": (make_kernel("sign_flipped", sign_flipped=True), "bidirectional"),
    "signed_distance": (make_kernel("signed_distance", signed_distance=True), "bidirectional"),
    "capped_distance": (
        make_kernel("capped_distance", capped_distance=True),
        "sequence_longer_than_256",
    ),
    "ignores_scale": (make_kernel("ignores_scale", ignores_scale=True), "scale_not_default"),
    "default_scale_one": (
        make_kernel("default_scale_one", default_scale_one=True),
        "default_scale",
    ),
    "padded_head_dim": (
        make_kernel("padded_head_dim", padded_head_dim=True),
        "head_dim_not_power_of_two",
    ),
    "lse_log2": (make_kernel("lse_log2", lse_log2=True), "heads_6"),
    "unstable_softmax": (
        make_kernel("unstable_softmax", unstable_softmax=True),
        "peaked_softmax_float16",
    ),
}

#: correct kernels of this module (given and standard slopes)
CORRECT = {
    "correct_given": make_kernel("correct_given"),
    "correct_standard": make_kernel("correct_standard", standard=True),
}


def torch_positions_in_input_dtype(
    query, key, value, *, slopes, causal, scale, query_positions, key_positions
):
    """torch, broken: positions cast to the dtype of ``query`` before the distance."""
    import torch

    n_q, n_k = query.shape[2], key.shape[2]
    kp = torch.arange(n_k) if key_positions is None else key_positions
    qp = torch.arange(n_q) + (n_k - n_q) if query_positions is None else query_positions
    qp, kp = qp.to(query.dtype).float(), kp.to(query.dtype).float()  # the bug
    bias = -slopes.float()[:, None, None] * (qp[:, None] - kp[None, :]).abs()
    if causal:
        bias = bias.masked_fill(kp[None, None, :] > qp[None, :, None], float("-inf"))
    group = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(group, dim=1).float()
    v = value.repeat_interleave(group, dim=1).float()
    c = query.shape[-1] ** -0.5 if scale is None else scale
    logits = (query.float() @ k.transpose(-1, -2)) * c + bias
    empty = torch.isneginf(logits).all(dim=-1, keepdim=True)
    w = torch.softmax(logits, dim=-1).nan_to_num(0.0).masked_fill(empty, 0.0)
    return (w @ v).to(query.dtype)


torch_positions_in_input_dtype.supports = {"batch_positions": False}
