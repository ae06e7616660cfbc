"""A partition sample drawn and inspected with plsh_ref, then used by plsh_fast.

What it shows: PLSH attention is a function of one *partition sample* (a pitch and an
offset per head and sample). ``plsh_ref.partition.draw_partition`` draws it from the heads'
``sigma = 1 / slope``; ``bins`` puts positions into bins, ``counts`` counts, for every
query/key pair, the samples that put both in one bin (the ``C`` of Theorem 2.2). The same
sample is passed to the fast torch path ``plsh_fast.plsh_attention(..., partition=...)``,
whose output is then checked against the float64 reference
``plsh_ref.attention.plsh_attention`` and the dense formula ``softmax(q k^T / sqrt(d) +
log C) v``.

Run::

    python examples/custom_partition.py             # seq_len 512
    PLSH_EXAMPLE_TINY=1 python examples/custom_partition.py   # seq_len 64 (what CI runs)
"""

from __future__ import annotations

import os

import numpy as np
import torch

import plsh_fast
from plsh_ref.alibi import alibi_slopes
from plsh_ref.attention import plsh_attention as reference_plsh_attention
from plsh_ref.partition import bins, count_bias, counts, draw_partition

TINY = os.environ.get("PLSH_EXAMPLE_TINY") == "1"


def main() -> None:
    batch, num_heads, head_dim = 1, 4, 16
    seq_len = 64 if TINY else 512
    num_samples = 8

    # 1. the partition sample: sigma_h = 1 / slope_h, one pitch and offset per (head, sample)
    sigma = 1.0 / alibi_slopes(num_heads)
    partition = draw_partition(sigma, num_samples, seed=0)
    print("sigma per head:", sigma)
    print("pitch (num_heads, num_samples):", partition.pitch.shape, partition.pitch.dtype)

    # 2. what it does to positions: bin indices per (head, sample, position)
    positions = np.arange(seq_len)
    position_bins = bins(partition, positions)
    print("bins of positions 0..7, head 0, sample 0:", position_bins[0, 0, :8])

    # 3. the counts C_ij (causal): how many samples put query i and key j in one bin
    c = counts(partition, positions, positions, causal=True)
    print("counts shape:", c.shape, " C[0, 5, 5] =", c[0, 5, 5], "(= num_samples on the diagonal)")

    # 4. the same partition in the fast path and in the float64 reference
    rng = np.random.default_rng(0)
    q64, k64, v64 = (rng.standard_normal((batch, num_heads, seq_len, head_dim)) for _ in range(3))
    q, k, v = (torch.from_numpy(x).float() for x in (q64, k64, v64))
    out = plsh_fast.plsh_attention(q, k, v, partition=partition, causal=True, backend="cpu")
    ref = reference_plsh_attention(
        q64, k64, v64, partition=partition, causal=True, return_lse=False
    )

    # 5. the dense formula with the counts as a log bias, for comparison
    bias = count_bias(c, num_samples)  # log(C / s); -inf where C = 0
    logits = q64 @ np.swapaxes(k64, -1, -2) / np.sqrt(head_dim) + bias[None]
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    dense = (weights / weights.sum(-1, keepdims=True)) @ v64

    err_fast = float(np.abs(out.double().numpy() - ref).max())
    err_dense = float(np.abs(dense - ref).max())
    print(f"max |fast (float32) - reference (float64)| = {err_fast:.2e}")
    print(f"max |dense formula - reference|          = {err_dense:.2e}")
    assert err_fast < 1e-4, err_fast  # float32 rounding, seq_len <= 512, |v| ~ 1
    assert err_dense < 1e-12, err_dense


if __name__ == "__main__":
    main()
