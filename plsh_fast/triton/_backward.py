"""Triton backward kernels of PLSH attention (gradients of the counts-weighted softmax).

With ``x_ij = c q_i.k_j`` (``c`` the scale), weights ``C_ij`` (collision counts, SPEC
section 3) and the forward's statistics ``m_i`` (the row maximum of ``x_ij log2 e``) and
``log2 l_i`` (``l_i = sum_j C_ij 2^(x_ij log2 e - m_i)``), the attention probabilities are
``P_ij = C_ij 2^((x_ij log2 e - m_i) - log2 l_i)``, without the float32 rounding of
``lse_i = (m_i + log2 l_i) ln 2 - ln s`` (``proofs_notes/backward.md``, section 3; the
dQ kernel holds ``fl(m_i + log2 l_i)`` and the launch code undoes its rounding,
:func:`dq_rounding_factor`) and, as for plain softmax attention (the counts are
constants),

``dV_j = sum_i P_ij dO_i``, ``dP_ij = dO_i . v_j``, ``dS_ij = P_ij (dP_ij - D_i)`` with
``D_i = dO_i . O_i``, ``dQ_i = c sum_j dS_ij k_j``, ``dK_j = c sum_i dS_ij q_i``

(derivation in ``proofs_notes``; FlashAttention-2's recomputation scheme, Dao 2023). Three
kernels, all deterministic (no atomics): ``D`` per row; ``dQ`` per query tile over the
same planned key range as the forward pass; ``dK, dV`` per key tile over the planned
query range of every query head of its key/value group (grouped-query gradients are summed
in registers). Pairs outside the planned ranges, masked pairs and padded rows contribute
exactly zero.

The launcher :func:`plsh_backward_triton` runs in named steps: check the shapes, form the
statistics (:func:`softmax_statistics`), run on rows sorted by position
(:func:`plsh_fast.triton._launch.on_sorted_rows`), align the rows, resolve the
configuration and plan (:func:`plsh_fast.triton._launch.prepare_launch`), then the three
kernels: ``launch_delta``, ``launch_dq`` (and the row factor
:func:`dq_rounding_factor`) and :func:`launch_dkdv`.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl

from ._config import TileConfig, pow2
from ._launch import LENGTHS, LOG2E, Launch, aligned_rows, on_sorted_rows, prepare_launch
from ._memory import load_tile, store_tile
from ._tiling import TilePlan, plan_query_range, sum_combine, tile_counts_all

__all__ = [
    "dkdv_layout",
    "dq_rounding_factor",
    "launch_delta",
    "launch_dkdv",
    "launch_dq",
    "plsh_backward_triton",
    "rows_fit_int32",
    "softmax_statistics",
]


@triton.jit(do_not_specialize=["n_q", "num_heads", "n_q_tiles"])
def _delta_kernel(
    Out,
    DOut,
    Delta,
    sob,
    soh,
    som,
    sod,
    sdb,
    sdh,
    sdm,
    sdd,
    n_q,
    num_heads,
    n_q_tiles,
    DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    pid = tl.program_id(0)
    m_tile = pid % n_q_tiles
    bh = pid // n_q_tiles
    b = (bh // num_heads).to(tl.int64)
    h = (bh % num_heads).to(tl.int64)
    offs_m = m_tile.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    m_valid = offs_m < n_q
    dv_valid = offs_dv < DV
    o = load_tile(Out + b * sob + h * soh, offs_m, som, offs_dv, sod, m_valid, dv_valid, True)
    do = load_tile(DOut + b * sdb + h * sdh, offs_m, sdm, offs_dv, sdd, m_valid, dv_valid, True)
    tl.store(
        Delta + bh.to(tl.int64) * n_q + offs_m,
        tl.reduce(o * do, 1, sum_combine),
        mask=m_valid,
    )


@triton.jit
def _row_max(Stats, row, valid):
    """``(live, m)`` of the rows ``row`` (masked by ``valid``) of the forward's statistics
    (``plsh_forward_triton(..., return_stats=True)``): ``live`` for a row with an
    admissible key, its row maximum ``m`` (log2 domain; 0 on the other rows)."""
    m = tl.load(Stats + 2 * row, mask=valid, other=float("-inf"))
    live = m > float("-inf")
    return live, tl.where(live, m, 0.0)


@triton.jit
def _log2_row_sum(Stats, row, valid, live):
    """``log2 l`` of the rows ``row`` of the forward's statistics (0 where not ``live``)."""
    return tl.where(live, tl.load(Stats + 2 * row + 1, mask=valid, other=0.0), 0.0)


@triton.jit
def _row_stats(Stats, row, valid):
    """``(live, m, log2 l)`` of the rows ``row`` (masked by ``valid``) of the forward's
    statistics, both read by one 8-byte load per row (the dK/dV kernel's software pipeline
    prefetches it with the query tiles; in its float32 sm_90 layout two loads spilled with
    Triton 3.6, and in the float32 sm_80 one this load did); ``m`` and ``log2 l`` are 0
    where not ``live``."""
    pair = tl.load(
        Stats.to(tl.pointer_type(tl.int64)) + row, mask=valid, other=0xFF800000
    )  # (m, log2 l) little-endian; masked rows: m = -inf
    m = (pair & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
    log2_l = (pair >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    live = m > float("-inf")
    return live, tl.where(live, m, 0.0), tl.where(live, log2_l, 0.0)


@triton.jit
def _probabilities(logits, counts, live, lse2, scale_log2, VARIANT: tl.constexpr):
    """``C exp2(x log2 e - lse2)`` on admissible pairs (``C > 0``, live row), else 0."""
    logits = logits * scale_log2
    weight = counts.to(tl.float32)  # counts are built in the logits (MMA) layout
    admissible = (weight > 0.0) & live[:, None]
    if VARIANT != 0:  # negative control: counts ignored (mask only), forward/backward mismatch
        weight = tl.where(admissible, 1.0, 0.0)
    return tl.where(admissible, tl.exp2(logits - lse2[:, None]) * weight, 0.0)


# tf32x3 written out (the float32 dK/dV kernel on sm_90, TileConfig.dkdv_manual_x3): the
# split a = a_hi + a_lo (a_hi = cvt.rna.tf32.f32(a), a_lo = a - a_hi exact) and three TF32
# MMAs, as Triton's own F32DotTC lowering of input_precision="tf32x3" does, but with the
# loop-invariant operand (K, V) split once per program, not per query step. Measured and
# rejected (benchmarks/results/aot_2026-12-01_fp32_dkdv.md):
# dK, dV accumulated in place (fewer registers; fails the tolerance rule when the MMA rounds
# its accumulation toward zero) and the four quarters chained in one dot (more live B
# operands: spills; and a different rounding that fails it under another model).


@triton.jit
def _round_tf32(x):
    """float32 ``x`` rounded to TF32 (to nearest, ties away from zero, as PTX
    ``cvt.rna.tf32.f32``); infinities and NaNs unchanged."""
    bits = x.to(tl.int32, bitcast=True)
    rounded = tl.where((bits & 0x7FFFFFFF) < 0x7F800000, (bits + 0x1000) & -8192, bits)
    return rounded.to(tl.float32, bitcast=True)


@triton.jit
def _split_tile(base, rows, row_stride, cols, col_stride, row_valid, col_valid):
    """``(hi, lo)`` of the float32 tile ``base[rows, cols]`` (masked, 0 outside): ``hi`` its
    TF32 rounding, ``lo`` the rest. The barrier after it keeps the next tile's load from
    being scheduled before this one is split (live registers in the prologue)."""
    x = load_tile(base, rows, row_stride, cols, col_stride, row_valid, col_valid, False)
    lo = x - _round_tf32(x)
    hi = x - lo
    tl.debug_barrier()
    return hi, lo


@triton.jit
def _dot_half(a0, a0_lo, a1, a1_lo, base, rows, row_stride, c0, col_stride, row_valid, n_cols):
    """``tl.dot(a, b^T, input_precision="tf32x3")`` over one column half given as two
    quarters: ``a_c`` split (``a_c + a_c_lo``), ``b_c = base[rows, c0 + c Q + (0..Q-1)]``
    (float32, masked to ``< n_cols``), ``Q = a0.shape[1]``. ``F32DotTC``'s lowering of the
    half-width dot (each of its three MMA terms over both quarters in column order, the NaN
    step before the last): the quarters only narrow the MMA operands."""
    Q: tl.constexpr = a0.shape[1]
    cols = c0 + tl.arange(0, Q)
    b0 = tl.trans(
        load_tile(base, rows, row_stride, cols, col_stride, row_valid, cols < n_cols, False)
    )
    cols = cols + Q
    b1 = tl.trans(
        load_tile(base, rows, row_stride, cols, col_stride, row_valid, cols < n_cols, False)
    )
    h0 = _round_tf32(b0)
    h1 = _round_tf32(b1)
    d = tl.dot(a0_lo, h0, input_precision="tf32")
    d = tl.dot(a1_lo, h1, d, input_precision="tf32")
    d = tl.dot(a0, b0 - h0, d, input_precision="tf32")
    d = tl.dot(a1, b1 - h1, d, input_precision="tf32")
    d = tl.where(d == d, d, 0.0)
    d = tl.dot(a0, h0, d, input_precision="tf32")
    return tl.dot(a1, h1, d, input_precision="tf32")


@triton.jit(do_not_specialize=LENGTHS)
def _bwd_dq_kernel(
    Q,
    K,
    V,
    DOut,
    Stats,
    Delta,
    DQ,
    RowStart,
    RowEnd,
    CausalEnd,
    KeyRange,
    HeadOrder,
    sqb,
    sqh,
    sqm,
    sqd,
    skb,
    skh,
    skn,
    skd,
    svb,
    svh,
    svn,
    svd,
    sdb,
    sdh,
    sdm,
    sdd,
    sgb,
    sgh,
    sgm,
    sgd,
    batch,
    n_q,
    n_k,
    num_heads,
    group,
    num_samples,
    n_q_tiles,
    scale,
    scale_log2,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_D1: tl.constexpr,
    BLOCK_DV1: tl.constexpr,
    S_BLOCK: tl.constexpr,
    PASSES: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PREC: tl.constexpr,
    VARIANT: tl.constexpr,
    CLASSIFY: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    pid = tl.program_id(0)
    m_tile = n_q_tiles - 1 - pid % n_q_tiles
    rest = pid // n_q_tiles
    b = (rest % batch).to(tl.int64)
    h = tl.load(HeadOrder + rest // batch)
    bh = b * num_heads + h
    hk = (h // group).to(tl.int64)
    offs_m = m_tile.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    m_valid = offs_m < n_q
    m_first = m_tile.to(tl.int64) * BLOCK_M
    m_last = tl.minimum(m_first + BLOCK_M, n_q) - 1
    d_valid = offs_d < D
    dv_valid = offs_dv < DV
    q_base = Q + b * sqb + h.to(tl.int64) * sqh
    q = load_tile(q_base, offs_m, sqm, offs_d, sqd, m_valid, d_valid, UPCAST)
    do_base = DOut + b * sdb + h.to(tl.int64) * sdh
    do = load_tile(do_base, offs_m, sdm, offs_dv, sdd, m_valid, dv_valid, UPCAST)
    if BLOCK_D1 > 0:  # second column chunk of head_dim (_config.head_dim_split)
        offs_d1 = BLOCK_D + tl.arange(0, BLOCK_D1)
        d1_valid = offs_d1 < D
        q1 = load_tile(q_base, offs_m, sqm, offs_d1, sqd, m_valid, d1_valid, UPCAST)
        dq1 = tl.zeros([BLOCK_M, BLOCK_D1], dtype=tl.float32)
    if BLOCK_DV1 > 0:
        offs_dv1 = BLOCK_DV + tl.arange(0, BLOCK_DV1)
        dv1_valid = offs_dv1 < DV
        do1 = load_tile(do_base, offs_m, sdm, offs_dv1, sdd, m_valid, dv1_valid, UPCAST)
    row = bh * n_q + offs_m
    # mu = fl(m + log2 l), one row vector across the loop (as an LSE would be): the loop's
    # C 2^(x log2 e - mu) is P 2^-e, e = mu - m - log2 l; the launch code multiplies the rows
    # of dQ by 2^e (dq_rounding_factor).
    live, row_max = _row_max(Stats, row, m_valid)
    lse2 = row_max + _log2_row_sum(Stats, row, m_valid, live)
    delta = tl.load(Delta + row, mask=m_valid, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    rng = KeyRange + (h.to(tl.int64) * n_q_tiles + m_tile) * 2
    for start_n in tl.range(tl.load(rng), tl.load(rng + 1), BLOCK_N, num_stages=NUM_STAGES):
        offs_n = start_n + tl.arange(0, BLOCK_N).to(tl.int64)
        n_valid = offs_n < n_k
        k = load_tile(K + b * skb + hk * skh, offs_n, skn, offs_d, skd, n_valid, d_valid, UPCAST)
        v_t = load_tile(
            V + b * svb + hk * svh, offs_n, svn, offs_dv, svd, n_valid, dv_valid, UPCAST, True
        )  # (DV, N)
        logits = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
        if BLOCK_D1 > 0:
            k1 = load_tile(
                K + b * skb + hk * skh, offs_n, skn, offs_d1, skd, n_valid, d1_valid, UPCAST
            )
            logits = tl.dot(q1, tl.trans(k1), logits, input_precision=DOT_PREC)
        counts = tile_counts_all(
            RowStart, RowEnd, CausalEnd, h, start_n, offs_m, m_first, m_last, n_q,
            num_samples, BLOCK_M, BLOCK_N, S_BLOCK, PASSES, False, CLASSIFY, logits,
            CAUSAL,
        )  # fmt: skip
        p = _probabilities(logits, counts, live, lse2, scale_log2, VARIANT)
        dp = tl.dot(do, v_t, input_precision=DOT_PREC)
        if BLOCK_DV1 > 0:
            v1 = load_tile(
                V + b * svb + hk * svh, offs_n, svn, offs_dv1, svd, n_valid, dv1_valid, UPCAST
            )
            dp = tl.dot(do1, tl.trans(v1), dp, input_precision=DOT_PREC)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PREC)
        if BLOCK_D1 > 0:
            dq1 += tl.dot(ds.to(k1.dtype), k1, input_precision=DOT_PREC)
    dq_base = DQ + b * sgb + h.to(tl.int64) * sgh
    store_tile(dq_base, offs_m, sgm, offs_d, sgd, m_valid, d_valid, dq * scale)
    if BLOCK_D1 > 0:
        store_tile(dq_base, offs_m, sgm, offs_d1, sgd, m_valid, d1_valid, dq1 * scale)


@triton.jit(do_not_specialize=LENGTHS + ["num_heads_kv", "n_k_tiles"])
def _bwd_dkdv_kernel(
    Q,
    K,
    V,
    DOut,
    Stats,
    Delta,
    DK,
    DV_,
    RowStart,
    RowEnd,
    CausalEnd,
    QueryRange,
    sqb,
    sqh,
    sqm,
    sqd,
    skb,
    skh,
    skn,
    skd,
    svb,
    svh,
    svn,
    svd,
    sdb,
    sdh,
    sdm,
    sdd,
    skgb,
    skgh,
    skgn,
    skgd,
    svgb,
    svgh,
    svgn,
    svgd,
    batch,
    n_q,
    n_k,
    num_heads,
    num_heads_kv,
    group,
    num_samples,
    n_q_tiles,
    n_k_tiles,
    scale,
    scale_log2,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_D1: tl.constexpr,
    BLOCK_DV1: tl.constexpr,
    S_BLOCK: tl.constexpr,
    PASSES: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PREC: tl.constexpr,
    VARIANT: tl.constexpr,
    CLASSIFY: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    CAUSAL: tl.constexpr,
    SPLIT_D: tl.constexpr,
    MANUAL_X3: tl.constexpr,
    STATS_PAIR: tl.constexpr,
):
    pid = tl.program_id(0)
    if SPLIT_D:  # two programs per key tile, each accumulating one column half of dK, dV
        half = pid % 2
        pid = pid // 2
    else:
        half = 0
    n_tile = pid % n_k_tiles  # first key tiles first: causally they have the most queries
    bhk = pid // n_k_tiles
    b = (bhk % batch).to(tl.int64)
    hk = bhk // batch
    n0 = n_tile * BLOCK_N
    # Tile-relative int32 row offsets on 64-bit scalar bases (the launch code keeps
    # BLOCK * row stride < 2**31): fewer 64-bit registers live across the query loop.
    rows_n = tl.arange(0, BLOCK_N)
    n_valid = n0 + rows_n < n_k
    n64 = n0.to(tl.int64)
    k_base = K + b * skb + hk.to(tl.int64) * skh + n64 * skn
    v_base = V + b * svb + hk.to(tl.int64) * svh + n64 * svn
    if MANUAL_X3:  # BLOCK_D, BLOCK_D1: the two column quarters of this program's half
        offs_d = half * 2 * BLOCK_D + tl.arange(0, BLOCK_D)
        offs_dv = half * 2 * BLOCK_DV + tl.arange(0, BLOCK_DV)
        offs_d1 = offs_d + BLOCK_D
        offs_dv1 = offs_dv + BLOCK_DV
        # K, V (the A operands of the logits and dP dots) in all four quarters, split once.
        cd = tl.arange(0, BLOCK_D)
        cdv = tl.arange(0, BLOCK_DV)
        k0, k0_lo = _split_tile(k_base, rows_n, skn, cd, skd, n_valid, cd < D)
        k1q, k1q_lo = _split_tile(k_base, rows_n, skn, cd + BLOCK_D, skd, n_valid, cd + BLOCK_D < D)
        k2, k2_lo = _split_tile(
            k_base, rows_n, skn, cd + 2 * BLOCK_D, skd, n_valid, cd + 2 * BLOCK_D < D
        )
        k3, k3_lo = _split_tile(
            k_base, rows_n, skn, cd + 3 * BLOCK_D, skd, n_valid, cd + 3 * BLOCK_D < D
        )
        v0, v0_lo = _split_tile(v_base, rows_n, svn, cdv, svd, n_valid, cdv < DV)
        v1q, v1q_lo = _split_tile(
            v_base, rows_n, svn, cdv + BLOCK_DV, svd, n_valid, cdv + BLOCK_DV < DV
        )
        v2, v2_lo = _split_tile(
            v_base, rows_n, svn, cdv + 2 * BLOCK_DV, svd, n_valid, cdv + 2 * BLOCK_DV < DV
        )
        v3, v3_lo = _split_tile(
            v_base, rows_n, svn, cdv + 3 * BLOCK_DV, svd, n_valid, cdv + 3 * BLOCK_DV < DV
        )
    else:  # BLOCK_D, BLOCK_D1: this program's chunk (half) and the other one
        offs_d = half * BLOCK_D + tl.arange(0, BLOCK_D)
        offs_dv = half * BLOCK_DV + tl.arange(0, BLOCK_DV)
        if BLOCK_D1 > 0:  # second column chunk of head_dim (_config.head_dim_split)
            offs_d1 = (1 - half) * BLOCK_D + tl.arange(0, BLOCK_D1)
        if BLOCK_DV1 > 0:
            offs_dv1 = (1 - half) * BLOCK_DV + tl.arange(0, BLOCK_DV1)
    # Whether this program accumulates the second chunk of dK (dV).
    ACC_D1: tl.constexpr = BLOCK_D1 > 0 and (MANUAL_X3 or not SPLIT_D)
    ACC_DV1: tl.constexpr = BLOCK_DV1 > 0 and (MANUAL_X3 or not SPLIT_D)
    d_valid = offs_d < D
    dv_valid = offs_dv < DV
    if BLOCK_D1 > 0:
        d1_valid = offs_d1 < D
    if BLOCK_DV1 > 0:
        dv1_valid = offs_dv1 < DV
    if not MANUAL_X3:
        k = load_tile(k_base, rows_n, skn, offs_d, skd, n_valid, d_valid, UPCAST)
        v = load_tile(v_base, rows_n, svn, offs_dv, svd, n_valid, dv_valid, UPCAST)
        if BLOCK_D1 > 0:
            k1 = load_tile(k_base, rows_n, skn, offs_d1, skd, n_valid, d1_valid, UPCAST)
        if BLOCK_DV1 > 0:
            v1 = load_tile(v_base, rows_n, svn, offs_dv1, svd, n_valid, dv1_valid, UPCAST)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    if ACC_D1:
        dk1 = tl.zeros([BLOCK_N, BLOCK_D1], dtype=tl.float32)
    if ACC_DV1:
        dv1 = tl.zeros([BLOCK_N, BLOCK_DV1], dtype=tl.float32)
    for g in range(group):
        h = hk * group + g
        rng = QueryRange + (h.to(tl.int64) * n_k_tiles + n_tile) * 2
        for start_m in tl.range(tl.load(rng), tl.load(rng + 1), BLOCK_M, num_stages=NUM_STAGES):
            rows = tl.arange(0, BLOCK_M)
            offs_m = start_m + rows
            m_valid = offs_m < n_q
            m64 = tl.cast(start_m, tl.int64)  # a Python int in the interpreter
            q_base = Q + b * sqb + h.to(tl.int64) * sqh + m64 * sqm
            do_base = DOut + b * sdb + h.to(tl.int64) * sdh + m64 * sdm
            q = load_tile(q_base, rows, sqm, offs_d, sqd, m_valid, d_valid, UPCAST)
            do = load_tile(do_base, rows, sdm, offs_dv, sdd, m_valid, dv_valid, UPCAST)
            row0 = (b * num_heads + h) * n_q + m64
            if STATS_PAIR:  # one 8-byte load (two spilled 12 B: float32 sm_90, Triton 3.6)
                live, row_max, log2_l = _row_stats(Stats, row0 + rows, m_valid)
            else:  # two loads (one 8-byte load spilled 8 B: float32 sm_80, Triton 3.6)
                live, row_max = _row_max(Stats, row0 + rows, m_valid)
                log2_l = _log2_row_sum(Stats, row0 + rows, m_valid, live)
            delta = tl.load(Delta + row0 + rows, mask=m_valid, other=0.0)
            # Transposed tiles (keys along the rows): every dot has BLOCK_N rows, so that
            # BLOCK_M can be small (registers) while the MMAs stay warpgroup-sized.
            if BLOCK_D1 > 0 and (ACC_D1 or not MANUAL_X3):
                q1 = load_tile(q_base, rows, sqm, offs_d1, sqd, m_valid, d1_valid, UPCAST)
            if MANUAL_X3:
                # Two halves, each one tf32x3 dot, added as tl.dot(k1, q1^T, tl.dot(k, q^T)).
                logits_t = _dot_half(
                    k2, k2_lo, k3, k3_lo, q_base, rows, sqm, 2 * BLOCK_D, sqd, m_valid, D
                ) + _dot_half(k0, k0_lo, k1q, k1q_lo, q_base, rows, sqm, 0, sqd, m_valid, D)
            else:
                logits_t = tl.dot(k, tl.trans(q), input_precision=DOT_PREC)
                if BLOCK_D1 > 0:
                    logits_t = tl.dot(k1, tl.trans(q1), logits_t, input_precision=DOT_PREC)
            counts_t = tile_counts_all(
                RowStart, RowEnd, CausalEnd, h, n0, m64 + rows.to(tl.int64), start_m,
                tl.minimum(start_m + BLOCK_M, n_q) - 1, n_q, num_samples,
                BLOCK_M, BLOCK_N, S_BLOCK, PASSES, True, CLASSIFY, logits_t, CAUSAL,
            )  # fmt: skip
            if BLOCK_DV1 > 0:
                do1 = load_tile(do_base, rows, sdm, offs_dv1, sdd, m_valid, dv1_valid, UPCAST)
            logits_t = logits_t * scale_log2
            weight_t = counts_t.to(tl.float32)
            admissible_t = (weight_t > 0.0) & (m_valid & live)[None, :]
            if VARIANT != 0:  # negative control: counts ignored (mask only)
                weight_t = tl.where(admissible_t, 1.0, 0.0)
            p_t = tl.exp2(logits_t - row_max[None, :] - log2_l[None, :])
            p_t = tl.where(admissible_t, p_t * weight_t, 0.0)
            dv += tl.dot(p_t.to(do.dtype), do, input_precision=DOT_PREC)
            if ACC_DV1:
                dv1 += tl.dot(p_t.to(do1.dtype), do1, input_precision=DOT_PREC)
            if MANUAL_X3:
                dp_t = _dot_half(
                    v2, v2_lo, v3, v3_lo, do_base, rows, sdm, 2 * BLOCK_DV, sdd, m_valid, DV
                ) + _dot_half(v0, v0_lo, v1q, v1q_lo, do_base, rows, sdm, 0, sdd, m_valid, DV)
            else:
                dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
                if BLOCK_DV1 > 0:
                    dp_t = tl.dot(v1, tl.trans(do1), dp_t, input_precision=DOT_PREC)
            ds_t = p_t * (dp_t - delta[None, :])
            dk += tl.dot(ds_t.to(q.dtype), q, input_precision=DOT_PREC)
            if ACC_D1:
                dk1 += tl.dot(ds_t.to(q1.dtype), q1, input_precision=DOT_PREC)
    dk_base = DK + b * skgb + hk.to(tl.int64) * skgh + n64 * skgn
    dv_base = DV_ + b * svgb + hk.to(tl.int64) * svgh + n64 * svgn
    store_tile(dk_base, rows_n, skgn, offs_d, skgd, n_valid, d_valid, dk * scale)
    store_tile(dv_base, rows_n, svgn, offs_dv, svgd, n_valid, dv_valid, dv)
    if ACC_D1:
        store_tile(dk_base, rows_n, skgn, offs_d1, skgd, n_valid, d1_valid, dk1 * scale)
    if ACC_DV1:
        store_tile(dv_base, rows_n, svgn, offs_dv1, svgd, n_valid, dv1_valid, dv1)


def dq_rounding_factor(stats: torch.Tensor) -> torch.Tensor:
    """``2^e`` per row, ``e = mu - m - log2 l`` the rounding error of ``mu = fl(m + log2 l)``.

    The dQ kernel holds one row vector across its key loop, ``mu``, and computes
    ``C 2^(x log2 e - mu) = P 2^-e``; its rows are multiplied by this factor afterwards
    (in the kernel's epilogue the row multiply made the float32 sm_90 kernel spill). ``mu``
    is formed here by the same float32 addition as in the kernel, so ``e`` is the kernel's
    error exactly when ``|m| >= log2 l`` (Fast2Sum: ``mu - m`` is then exact), else to
    float32 rounding of ``log2 l`` (``proofs_notes/backward.md``).

    Parameters
    ----------
    stats : torch.Tensor
        float32 ``(batch, num_heads, n_q, 2)``: ``m`` and ``log2 l`` per row
        (``plsh_forward_triton(..., return_stats=True)``).

    Returns
    -------
    torch.Tensor
        float32 ``(batch, num_heads, n_q)``; 1 on rows without an admissible key.
    """
    m, log2_l = stats.unbind(-1)
    live = m > float("-inf")
    mu = m + log2_l
    return torch.where(live, torch.exp2((mu - m) - log2_l), 1.0)


def rows_fit_int32(x: torch.Tensor, block: int) -> bool:
    """Whether ``block`` rows of ``x`` span fewer than ``2**31`` elements, so that a kernel
    may address a tile of them with int32 offsets from a 64-bit base (the dK/dV kernel
    does; the launch code passes ``x.contiguous()`` otherwise).

    Parameters
    ----------
    x : torch.Tensor
        ``(batch, heads, seq_len, head_dim)``, any dtype, device and strides (only
        ``x.stride(2)``, in elements, is read).
    block : int
        Rows per tile.

    Returns
    -------
    bool
    """
    return abs(x.stride(2)) * block < 2**31


def plsh_backward_triton(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    pitch: torch.Tensor,
    offset: torch.Tensor,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    scale: float,
    causal: bool,
    *,
    stats: torch.Tensor | None = None,
    grad_lse: torch.Tensor | None = None,
    plan: TilePlan | None = None,
    positions_sorted: bool | None = None,
    tiles: TileConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of PLSH attention with respect to query, key and value (Triton).

    Parameters
    ----------
    query, key, value, pitch, offset, query_positions, key_positions, scale, causal
        As :func:`plsh_fast.triton.plsh_forward_triton`.
    out : torch.Tensor
        ``(batch, num_heads, n_q, head_dim_v)`` forward output.
    lse : torch.Tensor
        float32 ``(batch, num_heads, n_q)`` forward LSE (``-inf`` for empty rows); read
        only when ``stats`` is ``None``.
    grad_out : torch.Tensor
        ``(batch, num_heads, n_q, head_dim_v)`` gradient of the loss with respect to ``out``
        (any strides, same dtype as ``out``).
    stats : torch.Tensor or None
        The forward's float32 ``(batch, num_heads, n_q, 2)`` softmax statistics
        (``plsh_forward_triton(..., return_stats=True)``: row maximum and ``log2`` of the row
        sum): the probabilities are recomputed as ``C 2^((x log2 e - m) - log2 l)``, whose
        error does not grow with the logits' magnitude (``proofs_notes/backward.md``).
        ``None``: recomputed from ``lse``
        (:func:`plsh_fast.triton._backward.softmax_statistics`), FlashAttention's
        form, whose float32 rounding of ``lse`` is a relative error of about
        ``|lse| 2^-24`` of every probability in the row (float32 gradients then fail the
        SPEC section 6 rule from logits of standard deviation about 9,
        ``tests/fast/test_gradient_precision.py``).
    grad_lse : torch.Tensor or None
        float32 ``(batch, num_heads, n_q)`` gradient of the loss with respect to the LSE
        (finite; 0 on empty rows), or ``None``: added as ``dS = P (dP - D + g)``
        (``proofs_notes/backward.md``, section 5) by subtracting it from ``D``
        (``launch_delta``), so that the value head size, hence the column chunks of
        the logits' dots, stay the forward's.
    plan : plsh_fast.triton.TilePlan or None
        The forward pass's plan (``plsh_forward_triton(..., return_plan=True)``), reused
        instead of planning again (then the positions are taken as sorted, no check and no
        host synchronisation); ``None`` plans here. Must come from the same positions,
        partition, ``causal`` and tiles.
    positions_sorted : bool or None
        As in :func:`plsh_fast.triton.plsh_forward_triton`.
    tiles : plsh_fast.triton.TileConfig or None
        Tile sizes and launch options, as in :func:`plsh_fast.triton.plsh_forward_triton`
        (the forward's, when ``plan`` is the forward's).

    Returns
    -------
    (grad_query, grad_key, grad_value) : tuple of torch.Tensor
        Shapes and dtypes of ``query``, ``key``, ``value`` (contiguous); ``grad_key`` and
        ``grad_value`` are summed over the query heads of each key/value group.
        Rows without an admissible key and keys that no query may attend get exactly 0.

    References
    ----------
    Dao (2023), FlashAttention-2, backward pass; SPEC section 3 (weights ``C_ij``).
    """
    _check_shapes(query, key, value, out, lse, grad_out, pitch)
    stats = softmax_statistics(lse, pitch.shape[1]) if stats is None else stats
    assert stats.shape == (*lse.shape, 2) and stats.dtype == torch.float32
    if plan is None and not positions_sorted:

        def run_sorted(query_rows, key_rows, sorted_query_positions, sorted_key_positions):
            q, o, l_, g, st, *gl = query_rows
            dq, dk, dv = plsh_backward_triton(
                q, *key_rows, o, l_, g, pitch, offset, sorted_query_positions,
                sorted_key_positions, scale, causal, stats=st,
                grad_lse=gl[0] if gl else None, positions_sorted=True, tiles=tiles,
            )  # fmt: skip
            return (dq,), (dk, dv)

        # Unsorted positions: the gradients of the forward's sorted rows, put back.
        query_rows: tuple[torch.Tensor, ...] = (query, out, lse, grad_out, stats)
        query_rows += () if grad_lse is None else (grad_lse,)
        done = on_sorted_rows(run_sorted, query_positions, key_positions, query_rows, (key, value))
        if done is not None:
            return (*done[0], *done[1])
    dq, dk, dv = (
        torch.zeros_like(x, memory_format=torch.contiguous_format) for x in (query, key, value)
    )
    if query.shape[0] == 0 or query.shape[2] == 0 or key.shape[2] == 0:
        return dq, dk, dv
    # 16-element row strides for the pipelined loads (cp.async)
    query, key, value, grad_out = (aligned_rows(x) for x in (query, key, value, grad_out))
    launch = prepare_launch(
        query, value, pitch, offset, query_positions, key_positions, causal,
        tiles=tiles, plan=plan, kernel=_bwd_dq_kernel,
    )  # fmt: skip
    stats = stats.contiguous()
    if stats.data_ptr() % 8:  # the dK/dV kernel reads each row's pair as one 8-byte word
        stats = stats.clone()
    grad_out = grad_out.to(query.dtype)
    delta = launch_delta(launch, out, grad_out, grad_lse)
    launch_dq(launch, query, key, value, grad_out, stats, delta, dq, scale)
    dq.mul_(dq_rounding_factor(stats)[..., None])
    launch_dkdv(launch, query, key, value, grad_out, stats, delta, dk, dv, scale)
    return dq, dk, dv


def _check_shapes(query, key, value, out, lse, grad_out, pitch) -> None:
    """The launcher's internal preconditions (the inputs were validated by the caller)."""
    batch, num_heads, n_q, _ = query.shape
    num_heads_kv, head_dim_v = key.shape[1], value.shape[3]
    assert key.dtype == query.dtype and value.dtype == query.dtype
    assert grad_out.shape == (batch, num_heads, n_q, head_dim_v)
    assert out.shape == grad_out.shape and lse.shape == (batch, num_heads, n_q)
    assert num_heads % num_heads_kv == 0 and pitch.shape[0] == num_heads


def softmax_statistics(lse: torch.Tensor, num_samples: int) -> torch.Tensor:
    """The statistics ``(m, log2 l)`` that reproduce a rounded LSE: FlashAttention's
    recompute, ``m = lse log2 e + log2 s`` and ``log2 l = 0``.

    The backward kernels recompute ``P = C 2^((x log2 e - m) - log2 l)``; with these
    statistics that is ``C 2^(x log2 e - (lse log2 e + log2 s))``, whose float32 rounding
    of ``lse`` is a relative error of about ``|lse| 2^-24`` of every probability
    (``proofs_notes/backward.md``, section 3; the forward's own statistics avoid it).

    Parameters
    ----------
    lse : torch.Tensor
        ``(batch, num_heads, n_q)`` forward LSE (natural log), any floating dtype.
    num_samples : int
        Partition samples ``s``.

    Returns
    -------
    torch.Tensor
        float32 ``(batch, num_heads, n_q, 2)``; ``(-inf, 0)`` on a row with ``lse = -inf``.
    """
    lse = lse.to(torch.float32)
    return torch.stack([lse * LOG2E + math.log2(num_samples), torch.zeros_like(lse)], -1)


def launch_delta(
    launch: Launch,
    out: torch.Tensor,
    grad_out: torch.Tensor,
    grad_lse: torch.Tensor | None = None,
) -> torch.Tensor:
    """``D_i = dO_i . O_i - g_i`` per row (the delta kernel, then the LSE gradient ``g``
    subtracted), float32 ``(batch, num_heads, n_q)``.

    ``out``, ``grad_out``: ``(batch, num_heads, n_q, head_dim_v)``, any strides;
    ``grad_lse``: ``(batch, num_heads, n_q)`` or ``None`` (``g = 0``). The kernels'
    ``dS = P (dP - D)`` is then ``P (dP - dO . O + g)``, the sum of the output's and the
    LSE's contributions (``proofs_notes/backward.md``, section 5).
    """
    batch, num_heads, n_q, head_dim_v = out.shape
    delta = torch.empty((batch, num_heads, n_q), dtype=torch.float32, device=out.device)
    _delta_kernel[(launch.n_q_tiles * batch * num_heads,)](
        out,
        grad_out,
        delta,
        *out.stride(),
        *grad_out.stride(),
        n_q,
        num_heads,
        launch.n_q_tiles,
        DV=head_dim_v,
        BLOCK_M=launch.tiles.block_m,
        BLOCK_DV=pow2(head_dim_v),
    )
    if grad_lse is not None:  # dS = P (dP - (D - g))
        delta.sub_(grad_lse.to(torch.float32))
    return delta


def launch_dq(
    launch: Launch,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    grad_out: torch.Tensor,
    stats: torch.Tensor,
    delta: torch.Tensor,
    dq: torch.Tensor,
    scale: float,
) -> None:
    """The dQ kernel into ``dq`` (in place; rows still to be multiplied by
    :func:`dq_rounding_factor`): per query tile over the forward's planned key range, in
    key tiles of ``launch.dq_block_n``.

    ``query``, ``key``, ``value``, ``grad_out``: the pass's (sorted, aligned) tensors;
    ``stats``: contiguous float32 ``(batch, num_heads, n_q, 2)``; ``delta``: from
    ``launch_delta``; ``dq``: contiguous, shaped as ``query``.
    """
    batch, num_heads, n_q, head_dim = query.shape
    num_heads_kv, n_k, head_dim_v = key.shape[1], key.shape[2], value.shape[3]
    tiles, plan = launch.tiles, launch.plan
    (block_d, block_d1), (block_dv, block_dv1) = tiles.backward_chunks(
        head_dim, head_dim_v, dkdv=False
    )
    scale = float(scale)
    _bwd_dq_kernel[(launch.n_q_tiles * batch * num_heads,)](
        query,
        key,
        value,
        grad_out,
        stats,
        delta,
        dq,
        plan.row_start,
        plan.row_end,
        plan.causal_end,
        plan.key_range,
        plan.head_order,
        *query.stride(),
        *key.stride(),
        *value.stride(),
        *grad_out.stride(),
        *dq.stride(),
        batch,
        n_q,
        n_k,
        num_heads,
        num_heads // num_heads_kv,
        launch.num_samples,
        launch.n_q_tiles,
        scale,
        scale * LOG2E,
        num_warps=tiles.dq_num_warps,
        maxnreg=tiles.dq_maxnreg,
        **dict(
            launch.meta, BLOCK_N=launch.dq_block_n, BLOCK_D=block_d, BLOCK_DV=block_dv,
            BLOCK_D1=block_d1, BLOCK_DV1=block_dv1,
        ),
    )  # fmt: skip


def dkdv_layout(launch: Launch, head_dim: int, head_dim_v: int, dtype: torch.dtype) -> dict:
    """The dK/dV kernel's column layout: ``SPLIT_D``, ``MANUAL_X3`` and its column chunks
    ``BLOCK_D``, ``BLOCK_D1``, ``BLOCK_DV``, ``BLOCK_DV1`` (constexprs), from
    :meth:`TileConfig.backward_chunks` and the configuration's ``dkdv_split_d`` (equal,
    non-empty column halves only) and ``dkdv_manual_x3`` (float32, halves of at least
    32 columns: the kernel's chunks are then the two quarters of a program's half)."""
    tiles = launch.tiles
    (block_d, block_d1), (block_dv, block_dv1) = tiles.backward_chunks(
        head_dim, head_dim_v, dkdv=True
    )
    halves = block_d == block_d1 and block_dv == block_dv1  # equal column halves
    split_d = tiles.dkdv_split_d and halves and block_d1 > 0 and block_dv1 > 0
    # Column quarters of at least 16 (the smallest tl.dot operand), in column-half programs.
    manual_x3 = tiles.dkdv_manual_x3 and dtype == torch.float32
    manual_x3 = manual_x3 and split_d and min(block_d1, block_dv1) >= 32
    chunks = dict(BLOCK_D=block_d, BLOCK_D1=block_d1, BLOCK_DV=block_dv, BLOCK_DV1=block_dv1)
    if manual_x3:  # the kernel's BLOCK_D, BLOCK_D1: the two quarters of a program's half
        chunks = dict(
            BLOCK_D=block_d // 2, BLOCK_D1=block_d // 2, BLOCK_DV=block_dv // 2,
            BLOCK_DV1=block_dv // 2,
        )  # fmt: skip
    return dict(SPLIT_D=split_d, MANUAL_X3=manual_x3, **chunks)


def launch_dkdv(
    launch: Launch,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    grad_out: torch.Tensor,
    stats: torch.Tensor,
    delta: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    scale: float,
) -> None:
    """The dK/dV kernel into ``dk``, ``dv`` (in place): per key tile of
    ``launch.dkdv_block_n`` over the planned query range of every query head of its
    key/value group (:func:`plsh_fast.triton._tiling.plan_query_range`; planned for that
    key tile when it is not the plan's), in query tiles of ``launch.dkdv_block_m``.

    Arguments as ``launch_dq``; ``dk``, ``dv`` contiguous, shaped as ``key``, ``value``.
    """
    batch, num_heads, n_q, head_dim = query.shape
    num_heads_kv, n_k, head_dim_v = key.shape[1], key.shape[2], value.shape[3]
    tiles, plan = launch.tiles, launch.plan
    dkdv_block_m, dkdv_block_n = launch.dkdv_block_m, launch.dkdv_block_n
    if dkdv_block_n == plan.block_n:
        query_range = plan_query_range(plan).query_range
    else:
        wide = dataclasses.replace(plan, block_n=dkdv_block_n, query_range=None)
        query_range = plan_query_range(wide).query_range
    n_k_tiles = triton.cdiv(n_k, dkdv_block_n)
    layout = dkdv_layout(launch, head_dim, head_dim_v, query.dtype)
    # int32 tile offsets (rows_fit_int32); a row stride too long for them: contiguous rows.
    q_, do_ = (x if rows_fit_int32(x, dkdv_block_m) else x.contiguous() for x in (query, grad_out))
    k_, v_ = (x if rows_fit_int32(x, dkdv_block_n) else x.contiguous() for x in (key, value))
    scale = float(scale)
    _bwd_dkdv_kernel[(n_k_tiles * batch * num_heads_kv * (2 if layout["SPLIT_D"] else 1),)](
        q_,
        k_,
        v_,
        do_,
        stats,
        delta,
        dk,
        dv,
        plan.row_start,
        plan.row_end,
        plan.causal_end,
        query_range,
        *q_.stride(),
        *k_.stride(),
        *v_.stride(),
        *do_.stride(),
        *dk.stride(),
        *dv.stride(),
        batch,
        n_q,
        n_k,
        num_heads,
        num_heads_kv,
        num_heads // num_heads_kv,
        launch.num_samples,
        launch.n_q_tiles,
        n_k_tiles,
        scale,
        scale * LOG2E,
        num_warps=tiles.dkdv_num_warps,
        maxnreg=tiles.dkdv_maxnreg,
        STATS_PAIR=layout["MANUAL_X3"],  # the register footprint measured best (kernel comment)
        **dict(launch.meta, BLOCK_M=dkdv_block_m, BLOCK_N=dkdv_block_n, **layout),
    )
