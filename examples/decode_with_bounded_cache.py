"""Causal decoding with the bounded key/value cache of plsh_fast.decoding.

What it shows: with a fixed partition sample, a key that shares no bin with the newest
query can never share one with a later query (positions only grow), so
``PLSHDecodingCache`` drops it. The cache therefore holds at most ``cache.bound`` keys per
sequence however long the generation runs, and its outputs are *exactly* the rows of the
full-sequence ``plsh_fast.plsh_attention`` (``proofs_notes/decoding_cache.md``). The
script prefills a prompt, decodes token by token, prints the cache size against the bound,
and compares every decoded row with one full-sequence call.

Run::

    python examples/decode_with_bounded_cache.py                 # 256-token prompt, 512 steps
    PLSH_EXAMPLE_TINY=1 python examples/decode_with_bounded_cache.py   # 32 + 48 (what CI runs)
"""

from __future__ import annotations

import os

import numpy as np
import torch

import plsh_fast
from plsh_fast.decoding import PLSHDecodingCache
from plsh_ref.partition import draw_partition

TINY = os.environ.get("PLSH_EXAMPLE_TINY") == "1"


def main() -> None:
    batch, num_heads, head_dim = 1, 4, 16
    prompt_len, steps = (32, 48) if TINY else (256, 512)
    total = prompt_len + steps
    # sigma = 1 / slope of 1, 2, 4, 8 tokens: steep slopes, so that eviction shows early
    sigma = np.array([1.0, 2.0, 4.0, 8.0])
    partition = draw_partition(sigma, num_samples=8, seed=0)

    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(batch, num_heads, total, head_dim, generator=generator, dtype=torch.float64)
        for _ in range(3)
    )

    cache = PLSHDecodingCache(partition)
    print(f"cache bound: {cache.bound} keys per sequence")
    outputs = [cache.update(q[:, :, :prompt_len], k[:, :, :prompt_len], v[:, :, :prompt_len])]
    largest = int(cache.cached_tokens().max())
    for t in range(prompt_len, total):
        step = slice(t, t + 1)
        outputs.append(cache.update(q[:, :, step], k[:, :, step], v[:, :, step]))
        largest = max(largest, int(cache.cached_tokens().max()))
        if (t - prompt_len) % max(1, steps // 4) == 0:
            print(f"position {t:5d}: {int(cache.cached_tokens().max()):4d} keys cached")
    decoded = torch.cat(outputs, dim=2)

    full = plsh_fast.plsh_attention(q, k, v, partition=partition, causal=True, backend="cpu")
    err = float((decoded - full).abs().max())
    print(f"largest cache: {largest} keys (bound {cache.bound}) for {total} tokens")
    print(f"max |decoded - full-sequence attention| = {err:.2e}")
    assert largest <= cache.bound
    assert err < 1e-12, err  # float64: the same sums in another order


if __name__ == "__main__":
    main()
