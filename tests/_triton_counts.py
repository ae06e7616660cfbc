"""The counts tile of :func:`plsh_fast.triton._tiling.tile_counts_all`, stored whole.

A small Triton kernel stores every (query tile, key tile) pair's counts tile, in either
orientation, with or without the tile classification, so that tests can compare it with
:func:`plsh_ref.partition.counts` element by element (``tests/fast/triton/test_tile_counts.py``,
``tests/fast/triton/test_tile_plan_edges.py``). Compiled on CUDA, in the Triton interpreter
on CPU (``tests/_triton_interp.py``).
"""

from __future__ import annotations

import _triton_interp  # (picks compiled/interpreted before triton kernels load)
import numpy as np
import torch
import triton
import triton.language as tl

plsh_triton = _triton_interp.load("triton")
tile_counts_all = _triton_interp.load("triton._tiling").tile_counts_all


@triton.jit
def counts_kernel(
    RowStart, RowEnd, CausalEnd, Out, n_q, n_k, num_samples,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, S_BLOCK: tl.constexpr,
    PASSES: tl.constexpr, TRANSPOSED: tl.constexpr, CLASSIFY: tl.constexpr,
    CAUSAL: tl.constexpr,
):  # fmt: skip
    # grid (query tiles, key tiles, heads): Out[h, i, j] = C_ij of the tile pair.
    m_tile = tl.program_id(0)
    n0 = tl.program_id(1) * BLOCK_N
    h = tl.program_id(2)
    m_first = m_tile.to(tl.int64) * BLOCK_M
    offs_m = m_first + tl.arange(0, BLOCK_M)
    m_valid = offs_m < n_q
    m_last = tl.minimum(m_first + BLOCK_M, n_q) - 1
    offs_n = n0 + tl.arange(0, BLOCK_N)
    n_valid = offs_n < n_k
    c = tile_counts_all(
        RowStart, RowEnd, CausalEnd, h, n0, offs_m, m_first, m_last, n_q, num_samples,
        BLOCK_M, BLOCK_N, S_BLOCK, PASSES, TRANSPOSED, CLASSIFY, None, CAUSAL,
    )  # fmt: skip
    base = Out + h.to(tl.int64) * n_q * n_k
    if TRANSPOSED:
        tl.store(
            base + offs_m[None, :] * n_k + offs_n[:, None],
            c,
            mask=n_valid[:, None] & m_valid[None, :],
        )
    else:
        tl.store(
            base + offs_m[:, None] * n_k + offs_n[None, :],
            c,
            mask=m_valid[:, None] & n_valid[None, :],
        )


def kernel_counts(plan, n_k, num_samples, block_m, block_n, transposed, classify, passes=None):
    """The kernel's counts ``(num_heads, n_q, n_k)``; ``passes``: override the number of
    static passes of :func:`plsh_triton.sample_block` (0: its runtime loop, over passes of
    ``MAX_SAMPLE_BLOCK`` samples as above ``MAX_STATIC_SAMPLES``)."""
    num_heads, n_q, _ = plan.row_start.shape
    s_block, default_passes = plsh_triton.sample_block(num_samples)
    passes = default_passes if passes is None else passes
    if passes == 0:
        s_block = plsh_triton.MAX_SAMPLE_BLOCK
    out = torch.full((num_heads, n_q, n_k), -1, dtype=torch.int32)

    def run(row_start, row_end, causal_end, out):
        grid = (triton.cdiv(n_q, block_m), triton.cdiv(n_k, block_n), num_heads)
        counts_kernel[grid](
            row_start, row_end, causal_end, out, n_q, n_k, num_samples,
            BLOCK_M=block_m, BLOCK_N=block_n, S_BLOCK=s_block, PASSES=passes,
            TRANSPOSED=transposed, CLASSIFY=classify, CAUSAL=plan.causal,
        )  # fmt: skip
        return out

    return _triton_interp.call(run, plan.row_start, plan.row_end, plan.causal_end, out).numpy()


def tile_plan(partition, qpos, kpos, causal, block_m, block_n):
    """The counts plan (:func:`make_plan`) of int64 host positions, on the CPU."""
    return _triton_interp.call(
        plsh_triton.make_plan,
        torch.from_numpy(qpos),
        torch.from_numpy(kpos),
        torch.from_numpy(np.array(partition.pitch)),
        torch.from_numpy(np.array(partition.offset)),
        causal=causal,
        block_m=block_m,
        block_n=block_n,
    )
