"""Real third-party ALiBi code (PyPI ``transformers``, ``x-transformers``) as ``plsh verify``
kernels, through the adapters of :mod:`plsh_ref.testing.adapters`. Test helper.

No weights are downloaded: only functions (bias builders, attention functions) and
modules without parameters are used. Correct ones: BLOOM's and MPT's bias builders (in
float32: their bias ``m_h p_j`` is held in the model dtype, which the long half-precision
battery cases catch), HF's
SDPA and eager attention functions with an ALiBi mask, x-transformers'
``AlibiPositionalBias``, an attention-gym-style score_mod taking the given slopes.
Known-wrong ones (caught by the battery): Falcon's ``build_alibi_tensor`` (slopes and
``m * p_j`` in bfloat16), x-transformers' ``Attend`` (kv head ``h % H_kv``; rows without
an admissible key get the mean of the values), the attention-gym slope formula
``exp2(-(h+1) 8/H)`` (right only for a power-of-two H).
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.bloom.modeling_bloom import build_alibi_tensor as bloom_build_alibi
from transformers.models.falcon.modeling_falcon import build_alibi_tensor as falcon_build_alibi
from transformers.models.llama.modeling_llama import eager_attention_forward
from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor
from x_transformers.attend import Attend
from x_transformers.x_transformers import AlibiPositionalBias

from plsh_ref.testing.adapters import from_bias_builder, from_hf_attention, from_score_mod

# BLOOM/Falcon: bias m_h * p_j with p_j = cumsum(attention_mask) - 1, right (up to a
# constant per row) for causal attention over each sequence's own tokens 0..n-1.
bloom = from_bias_builder(
    bloom_build_alibi, supports={"bidirectional": False, "positions": False}, name="bloom"
)
falcon = from_bias_builder(
    falcon_build_alibi, supports={"bidirectional": False, "positions": False}, name="falcon"
)


def _mpt_bias(num_heads, sequence_length):
    return build_mpt_alibi_tensor(num_heads, sequence_length)


# MPT: bias m_h * (j - (n - 1)) relative to the last key, no padding support
mpt = from_bias_builder(
    _mpt_bias,
    supports={"bidirectional": False, "positions": False, "attention_mask": False},
    name="mpt",
)


def _x_transformers_bias(num_heads, query_positions, key_positions):
    return AlibiPositionalBias(num_heads).forward_custom_pos(query_positions, key_positions)


# x-transformers' einx expression has no size for an empty axis: n = 0 is unsupported
x_transformers_alibi = from_bias_builder(
    _x_transformers_bias, supports={"empty": False}, name="x_transformers_alibi"
)

hf_sdpa = from_hf_attention(sdpa_attention_forward, name="hf_sdpa")
hf_eager = from_hf_attention(eager_attention_forward, name="hf_eager")


def _gym_given_slopes(slopes, query_positions, key_positions):
    # attention-gym's ALiBi score_mod, written from its formula, with the given slopes and
    # the problem's positions instead of indices
    def alibi(score, b, h, q_idx, kv_idx):
        distance = (query_positions[b, q_idx] - key_positions[b, kv_idx]).abs()
        return score - slopes.float()[h] * distance

    return alibi


gym_given_slopes = from_score_mod(
    factory=_gym_given_slopes, slopes="given", name="gym_given_slopes"
)


def _gym_formula(num_heads, query_positions, key_positions):
    # attention-gym's slope rule exp2(-(h + 1) * 8 / H): Press et al.'s for H = 2^k only
    def alibi(score, b, h, q_idx, kv_idx):
        m = torch.exp2(-(h + 1) * 8.0 / num_heads)
        return score - m * (query_positions[b, q_idx] - key_positions[b, kv_idx]).abs()

    return alibi


gym_formula = from_score_mod(factory=_gym_formula, name="gym_formula")


def x_transformers_attend(
    query, key, value, *, slopes, causal, scale, query_positions, key_positions
):
    """x-transformers' ``Attend`` with the exact ALiBi bias of default positions."""
    n_q, n_k = query.shape[2], key.shape[2]
    qpos = torch.arange(n_q) + (n_k - n_q)
    kpos = torch.arange(n_k)
    bias = -slopes.float()[:, None, None] * (qpos[:, None] - kpos[None, :]).abs().float()
    out, _ = Attend(causal=causal, scale=scale)(query, key, value, attn_bias=bias.to(query.dtype))
    return out


x_transformers_attend.supports = {"positions": False, "empty": False}
