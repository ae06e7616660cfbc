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
    if bugs.get("negated_output"):
        out = -out
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
    "negated_output": (make_kernel("negated_output", negated_output=True), "heads_6"),
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


# --- conventions: each with a correct kernel and a seeded bug -----------------------------

from plsh_ref.testing import examples  # noqa: E402


def _numpy_alibi(query, key, value, slopes, causal, scale, qpos, kpos, mask):
    return examples.numpy_alibi(
        query,
        key,
        value,
        slopes=slopes,
        causal=causal,
        scale=scale,
        query_positions=qpos,
        key_positions=kpos,
        attention_mask=mask,
    )


def mj_bias_in_input_dtype(
    query, key, value, *, causal, scale, query_positions, key_positions, attention_mask=None
):
    """Broken in half precision: the row-constant bias ``m * p_j`` (BLOOM's form, exact in
    real arithmetic for causal attention) stored in the input dtype; output only (the
    LSE of that form is shifted per row)."""
    batch, num_heads, n_q, d = query.shape
    n_k = key.shape[2]
    qp, kp, q_keep, k_keep = resolve_batch_positions(
        batch, n_q, n_k, query_positions, key_positions, attention_mask
    )
    dtype = query.dtype
    m = alibi_slopes(num_heads).astype(dtype)
    big = np.iinfo(np.int64).max
    first = np.where(k_keep, kp, big).min(axis=1, initial=big)
    first = np.where(first == big, 0, first)
    with np.errstate(over="ignore"):
        rel = (kp - first[:, None]).astype(dtype)
        bias = (m[None, :, None, None] * rel[:, None, None, :]).astype(dtype)  # the bug
    bias = np.broadcast_to(bias.astype(np.float64), (batch, num_heads, n_q, n_k))
    ok = (kp[:, None, None, :] <= qp[:, None, :, None]) & k_keep[:, None, None, :]
    ok = ok & q_keep[:, None, :, None]
    bias = np.where(ok, bias, -np.inf)
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    out, _ = plain_attention_numpy(query, key, value, bias, scale=scale, dtype=str(dtype))
    return out.astype(dtype)


mj_bias_in_input_dtype.supports = {"bidirectional": False}


def mask_only_when_causal(
    query, key, value, *, slopes, causal, scale, query_positions, key_positions, attention_mask=None
):
    """Broken: padding applied to the mask only when causal."""
    if causal or attention_mask is None:
        return _numpy_alibi(
            query, key, value, slopes, causal, scale, query_positions, key_positions, attention_mask
        )
    # bidirectional: positions from the indices, pad keys kept
    return _numpy_alibi(query, key, value, slopes, causal, scale, None, None, None)


def left_padding_only(
    query, key, value, *, slopes, causal, scale, query_positions, key_positions, attention_mask=None
):
    """Broken: the pad count ``n_k - sum(mask)`` of each sequence is masked at its start
    (left padding assumed), whatever the mask says."""
    if attention_mask is not None:
        n_k = key.shape[2]
        pads = n_k - np.asarray(attention_mask).sum(axis=1)
        attention_mask = (np.arange(n_k)[None, :] >= pads[:, None]).astype(np.int64)
    return _numpy_alibi(
        query, key, value, slopes, causal, scale, query_positions, key_positions, attention_mask
    )


def decode_query_from_cache_length(
    query, key, value, *, slopes, causal, scale, query_positions, key_positions, attention_mask=None
):
    """Broken: in a decode step (one query) the query position is the cache length
    ``n_k - 1``, not the position it is given."""
    if query.shape[2] == 1 and key_positions is not None:
        query_positions = np.full(1, key.shape[2] - 1)
    return _numpy_alibi(
        query, key, value, slopes, causal, scale, query_positions, key_positions, attention_mask
    )


def _tensor_parallel(bug):
    def kernel(
        query,
        key,
        value,
        *,
        causal,
        scale,
        query_positions,
        key_positions,
        attention_mask=None,
        head_start,
        num_heads_total,
    ):
        h = query.shape[1]
        if bug == "local":  # the slopes of the local head count
            m = alibi_slopes(h)
        elif bug == "first":  # the global rule, but heads 0..h-1
            m = alibi_slopes(num_heads_total)[:h]
        else:
            m = alibi_slopes(num_heads_total)[head_start : head_start + h]
        return _numpy_alibi(
            query, key, value, m, causal, scale, query_positions, key_positions, attention_mask
        )

    kernel.__name__ = kernel.__qualname__ = f"tensor_parallel_{bug}"
    return kernel


correct_tensor_parallel = _tensor_parallel("correct")
tensor_parallel_local_slopes = _tensor_parallel("local")
tensor_parallel_first_heads = _tensor_parallel("first")


def _varlen(crosses):
    def kernel(
        query, key, value, *, slopes, causal, scale, query_positions, key_positions, cu_seqlens
    ):
        if cu_seqlens is None or crosses:  # the bug: one sequence of all the tokens
            return _numpy_alibi(
                query, key, value, slopes, causal, scale, query_positions, key_positions, None
            )
        parts = []
        for start, stop in zip(cu_seqlens[:-1], cu_seqlens[1:]):
            sl = slice(int(start), int(stop))
            parts.append(
                _numpy_alibi(
                    query[:, :, sl],
                    key[:, :, sl],
                    value[:, :, sl],
                    slopes,
                    causal,
                    scale,
                    None,
                    None,
                    None,
                )
            )
        return tuple(np.concatenate([p[i] for p in parts], axis=2) for i in range(2))

    kernel.__name__ = kernel.__qualname__ = "varlen_crosses_sequences" if crosses else "varlen"
    return kernel


correct_varlen = _varlen(False)
varlen_crosses_sequences = _varlen(True)


def _restricted(name, **supports):
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
        return _numpy_alibi(
            query, key, value, slopes, causal, scale, query_positions, key_positions, attention_mask
        )

    kernel.__name__ = kernel.__qualname__ = name
    kernel.supports = supports
    return kernel


#: correct kernels of restricted conventions (each declares what it does not support)
correct_encoder = _restricted("correct_encoder", causal=False, positions=False)
correct_decode_only = _restricted("correct_decode_only", prefill=False)
correct_square_only = _restricted("correct_square_only", unequal_lengths=False)
correct_causal_only = _restricted("correct_causal_only", bidirectional=False)
correct_fixed_scale = _restricted("correct_fixed_scale", scale=False)
correct_no_right_padding = _restricted("correct_no_right_padding", right_padding=False)

#: convention bug -> (kernel, the battery case that must catch it)
CONVENTION_BUGS = {
    "mask_only_when_causal": (mask_only_when_causal, "bidirectional_padded"),
    "left_padding_only": (left_padding_only, "right_padding"),
    "decode_query_from_cache_length": (decode_query_from_cache_length, "decode_cache_offset"),
    "tensor_parallel_local_slopes": (tensor_parallel_local_slopes, "tensor_parallel_heads"),
    "tensor_parallel_first_heads": (tensor_parallel_first_heads, "tensor_parallel_heads"),
    "varlen_crosses_sequences": (varlen_crosses_sequences, "packed_varlen"),
    "mj_bias_in_input_dtype": (mj_bias_in_input_dtype, "sequence_longer_than_256_float16"),
}

#: correct kernels of the conventions (each must pass its default run)
CONVENTION_CORRECT = [
    "correct_tensor_parallel",
    "correct_varlen",
    "correct_encoder",
    "correct_decode_only",
    "correct_square_only",
    "correct_causal_only",
    "correct_fixed_scale",
    "correct_no_right_padding",
]


def torch_arange_positions_in_input_dtype(
    query, key, value, *, slopes, causal, scale, query_positions, key_positions
):
    """torch, index-only, broken: positions built as ``arange(n, dtype=query.dtype)``."""
    import torch

    n_q, n_k = query.shape[2], key.shape[2]
    kp = torch.arange(n_k, dtype=query.dtype).float()  # the bug
    qp = (torch.arange(n_q, dtype=query.dtype) + (n_k - n_q)).float()
    return _torch_attend(query, key, value, slopes, causal, scale, qp, kp, None)


torch_arange_positions_in_input_dtype.supports = {"positions": False}


def torch_mj_bias_in_input_dtype(
    query, key, value, *, slopes, causal, scale, query_positions, key_positions
):
    """torch, index-only, causal, broken: the bias ``m * j`` stored in the input dtype."""
    import torch

    n_q, n_k = query.shape[2], key.shape[2]
    kp = torch.arange(n_k, dtype=torch.float32)
    qp = torch.arange(n_q, dtype=torch.float32) + (n_k - n_q)
    mj = (slopes.float()[:, None, None] * kp[None, None, :]).to(query.dtype).float()  # bug
    return _torch_attend(query, key, value, slopes, causal, scale, qp, kp, mj)


torch_mj_bias_in_input_dtype.supports = {"positions": False, "bidirectional": False}


def _torch_attend(query, key, value, slopes, causal, scale, qp, kp, bias):
    import torch

    if bias is None:
        bias = -slopes.float()[:, None, None] * (qp[:, None] - kp[None, :]).abs()
    bias = bias.expand(query.shape[1], qp.shape[0], kp.shape[0])
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


def jax_alibi(query, key, value, *, slopes, causal, scale, query_positions, key_positions):
    """A JAX ALiBi kernel (jax arrays in and out, computed in float32, jitted per shape)."""
    import jax.numpy as jnp

    n_q, n_k = query.shape[2], key.shape[2]
    kp = jnp.arange(n_k) if key_positions is None else key_positions
    qp = jnp.arange(n_q) + (n_k - n_q) if query_positions is None else query_positions
    return _jax_core(query, key, value, slopes, qp, kp, causal, scale)


jax_alibi.supports = {"batch_positions": False}


def _jax_core(query, key, value, slopes, qp, kp, causal, scale):
    import jax

    return jax.jit(_jax_attend, static_argnames=("causal", "scale"))(
        query, key, value, slopes, qp, kp, causal=causal, scale=scale
    )


def _jax_attend(query, key, value, slopes, qp, kp, *, causal, scale):
    import jax
    import jax.numpy as jnp

    work = jnp.promote_types(query.dtype, jnp.float32)  # float32, float64 in x64 mode
    group = query.shape[1] // key.shape[1]
    k = jnp.repeat(key, group, axis=1).astype(work)
    v = jnp.repeat(value, group, axis=1).astype(work)
    c = query.shape[-1] ** -0.5 if scale is None else scale
    diff = (qp[:, None] - kp[None, :]).astype(work)
    bias = -slopes.astype(work)[:, None, None] * jnp.abs(diff)
    if causal:
        bias = jnp.where(kp[None, None, :] > qp[None, :, None], -jnp.inf, bias)
    logits = jnp.einsum("bhid,bhjd->bhij", query.astype(work), k) * c + bias
    empty = jnp.all(jnp.isneginf(logits), axis=-1, keepdims=True)
    w = jax.nn.softmax(jnp.where(empty, 0.0, logits), axis=-1)
    w = jnp.where(empty, 0.0, w)
    return jnp.einsum("bhij,bhjd->bhid", w, v).astype(query.dtype)


def jax_positions_in_input_dtype(
    query, key, value, *, slopes, causal, scale, query_positions, key_positions
):
    """JAX, broken: positions cast to the input dtype (bf16 is inexact beyond 256)."""
    import jax.numpy as jnp

    n_q, n_k = query.shape[2], key.shape[2]
    kp = jnp.arange(n_k) if key_positions is None else key_positions
    qp = jnp.arange(n_q) + (n_k - n_q) if query_positions is None else query_positions
    kp = kp.astype(query.dtype)  # the bug
    qp = qp.astype(query.dtype)
    return _jax_core(query, key, value, slopes, qp, kp, causal, scale)


jax_positions_in_input_dtype.supports = {"batch_positions": False}
