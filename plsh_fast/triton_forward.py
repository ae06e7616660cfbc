"""Fused Triton forward kernel of PLSH attention (counts-weighted online softmax).

PLSH attention (Wolfson & Wagner 2026, Theorem 2.2; SPEC section 3) is softmax attention
with the additive bias ``log M~_ij = log(C_ij / s)``, where ``C_ij`` counts the samples
whose bins put positions ``p_i`` and ``p_j`` together. One program handles one query tile
of one (batch, head) and makes a single pass over the keys its rows can reach (planned
by :mod:`plsh_fast.tiling`, about ``BLOCK_M`` plus the largest of the ``s`` pitches,
``~ sigma (ln s + ln ln s)``, keys per causal tile for sorted positions; one query's
expected window is shorter, ``~ sigma (ln s + 0.58)``, ``proofs_notes/window_width.md``),
with an online softmax in which key ``j`` is weighted by ``C_ij``:

``out_i = sum_j C_ij exp(c q_i.k_j - m_i) v_j / sum_j C_ij exp(c q_i.k_j - m_i)``,
``lse_i = m_i + log(sum_j C_ij exp(c q_i.k_j - m_i)) - log(s)``,

with ``m_i`` the running maximum of the logits over admissible keys (``C_ij > 0``; the
causal mask is part of the counts' row ranges). For the backward it also stores ``m_i``
and ``log2`` of the row sum (log2 domain), the LSE without its float32 rounding
(``proofs_notes/backward.md``, section 3). Since ``C_ij <= s`` the weights never
overflow, and no logarithm of a count is taken. The counts of a tile pair come from
:func:`plsh_fast.tiling.tile_counts` (one-sided events: 1.5 integer instructions per
element and mixed sample, none for samples whose start is before or after the whole tile
pair; more than 64 samples in statically unrolled passes of 32). The key loop is a
software-pipelined ``tl.range`` (key/value tiles loaded ``num_stages - 1`` steps ahead,
``cp.async``/TMA on sm_80+/sm_90; ``benchmarks/aot_report.py`` checks it; up to 256
samples, above which the passes are a runtime loop, :func:`plsh_fast.tiling.sample_block`).
Programs take the heads with the most planned work first and, within a head, the last query tiles first.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl

from ._ordering import position_order, sort_positions, take_rows
from .tiling import (
    MAX_SAMPLE_BLOCK,
    make_plan,
    max_combine,
    sample_block,
    sum_combine,
    tile_counts_all,
)

__all__ = [
    "TileConfig",
    "aligned_rows",
    "plsh_forward_triton",
    "default_blocks",
    "dot_precision",
    "head_dim_split",
    "pow2",
    "tile_config",
]

LOG2E = 1.4426950408889634

#: Scalar arguments that change with the problem size: not specialised (no recompilation
#: per length; Triton would otherwise compile one kernel per divisibility class).
LENGTHS = ["batch", "n_q", "n_k", "num_heads", "group", "num_samples", "n_q_tiles"]


@triton.jit(do_not_specialize=LENGTHS)
def _fwd_kernel(
    Q,
    K,
    V,
    Out,
    Lse,
    Stats,
    RowStart,
    RowEnd,
    KeyRange,
    CausalEnd,
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
    sob,
    soh,
    som,
    sod,
    batch,
    n_q,
    n_k,
    num_heads,
    group,
    num_samples,
    n_q_tiles,
    scale_log2,
    log_s,
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
    # Head dimensions that are not powers of two are split in two power-of-two column
    # chunks (80 = 64 + 16, 96 = 64 + 32; head_dim_split): BLOCK_D (+ BLOCK_D1 if > 0).
    pid = tl.program_id(0)
    m_tile = n_q_tiles - 1 - pid % n_q_tiles  # last (causally longest) query tiles first
    rest = pid // n_q_tiles
    b = rest % batch
    h = tl.load(HeadOrder + rest // batch)  # heads with the most planned work first
    hk = h // group
    b64 = b.to(tl.int64)

    offs_m = m_tile.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    m_valid = offs_m < n_q
    d_valid = offs_d < D
    dv_valid = offs_dv < DV
    m_first = m_tile.to(tl.int64) * BLOCK_M
    m_last = tl.minimum(m_first + BLOCK_M, n_q) - 1

    q = tl.load(
        Q + b64 * sqb + h.to(tl.int64) * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
        mask=m_valid[:, None] & d_valid[None, :],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)
    if BLOCK_D1 > 0:
        offs_d1 = BLOCK_D + tl.arange(0, BLOCK_D1)
        d1_valid = offs_d1 < D
        q1 = tl.load(
            Q + b64 * sqb + h.to(tl.int64) * sqh + offs_m[:, None] * sqm + offs_d1[None, :] * sqd,
            mask=m_valid[:, None] & d1_valid[None, :],
            other=0.0,
        )
        if UPCAST:
            q1 = q1.to(tl.float32)
    if BLOCK_DV1 > 0:
        offs_dv1 = BLOCK_DV + tl.arange(0, BLOCK_DV1)
        dv1_valid = offs_dv1 < DV
        acc1 = tl.zeros([BLOCK_M, BLOCK_DV1], dtype=tl.float32)
    if VARIANT == 3:
        causal_end = tl.load(CausalEnd + offs_m, mask=m_valid, other=0)

    k_base = K + b64 * skb + hk.to(tl.int64) * skh
    v_base = V + b64 * svb + hk.to(tl.int64) * svh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    rng = KeyRange + (h.to(tl.int64) * n_q_tiles + m_tile) * 2
    key_start = tl.load(rng)
    key_end = tl.load(rng + 1)
    for start_n in tl.range(key_start, key_end, BLOCK_N, num_stages=NUM_STAGES):
        offs_n = start_n + tl.arange(0, BLOCK_N).to(tl.int64)
        n_valid = offs_n < n_k
        k = tl.load(
            k_base + offs_n[None, :] * skn + offs_d[:, None] * skd,
            mask=n_valid[None, :] & d_valid[:, None],
            other=0.0,
        )
        v = tl.load(
            v_base + offs_n[:, None] * svn + offs_dv[None, :] * svd,
            mask=n_valid[:, None] & dv_valid[None, :],
            other=0.0,
        )
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        if BLOCK_D1 > 0:
            k1 = tl.load(
                k_base + offs_n[None, :] * skn + offs_d1[:, None] * skd,
                mask=n_valid[None, :] & d1_valid[:, None],
                other=0.0,
            )
            if UPCAST:
                k1 = k1.to(tl.float32)
        if BLOCK_DV1 > 0:
            v1 = tl.load(
                v_base + offs_n[:, None] * svn + offs_dv1[None, :] * svd,
                mask=n_valid[:, None] & dv1_valid[None, :],
                other=0.0,
            )
            if UPCAST:
                v1 = v1.to(tl.float32)
        if VARIANT == 3:  # ablation: no counts (planned range and causal mask only)
            cols = start_n + tl.arange(0, BLOCK_N)
            admissible = cols[None, :] < causal_end[:, None]
            weight = tl.full([BLOCK_M, BLOCK_N], 1.0, dtype=tl.float32)
        logits = tl.dot(q, k, input_precision=DOT_PREC)
        if BLOCK_D1 > 0:
            logits = tl.dot(q1, k1, logits, input_precision=DOT_PREC)
        if VARIANT != 3:  # counts built in the logits' (MMA) layout
            counts = tile_counts_all(
                RowStart, RowEnd, CausalEnd, h, start_n, offs_m, m_first, m_last, n_q,
                num_samples, BLOCK_M, BLOCK_N, S_BLOCK, PASSES, False, CLASSIFY,
                logits, CAUSAL,
            )  # fmt: skip
            weight = counts.to(tl.float32)
            admissible = weight > 0.0
            if VARIANT == 1:  # negative control: bias -log C instead of +log C
                weight = 1.0 / tl.maximum(weight, 1.0)
            elif VARIANT == 2:  # negative control: counts ignored (block mask only)
                weight = tl.where(admissible, 1.0, 0.0)
        logits = logits * scale_log2
        logits = tl.where(admissible, logits, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(logits, 1, max_combine))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.where(admissible, tl.exp2(logits - m_use[:, None]) * weight, 0.0)
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.reduce(p, 1, sum_combine)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
        if BLOCK_DV1 > 0:
            acc1 = acc1 * alpha[:, None] + tl.dot(p.to(v1.dtype), v1, input_precision=DOT_PREC)
        m_i = m_new

    nonempty = l_i > 0.0
    l_safe = tl.where(nonempty, l_i, 1.0)
    out = tl.where(nonempty[:, None], acc / l_safe[:, None], 0.0)
    lse = tl.where(nonempty, m_i * 0.6931471805599453 + tl.log(l_safe) - log_s, float("-inf"))
    tl.store(
        Out + b64 * sob + h.to(tl.int64) * soh + offs_m[:, None] * som + offs_dv[None, :] * sod,
        out.to(Out.dtype.element_ty),
        mask=m_valid[:, None] & dv_valid[None, :],
    )
    if BLOCK_DV1 > 0:
        out1 = tl.where(nonempty[:, None], acc1 / l_safe[:, None], 0.0)
        tl.store(
            Out
            + b64 * sob
            + h.to(tl.int64) * soh
            + offs_m[:, None] * som
            + offs_dv1[None, :] * sod,
            out1.to(Out.dtype.element_ty),
            mask=m_valid[:, None] & dv1_valid[None, :],
        )
    row = (b64 * num_heads + h) * n_q + offs_m
    tl.store(Lse + row, lse, mask=m_valid)
    # For the backward, the LSE without rounding (log2 domain): the row maximum m_i that
    # the forward subtracted and log2 of the row sum l_i; -inf and -inf on an empty row.
    tl.store(Stats + 2 * row, m_i, mask=m_valid)
    tl.store(Stats + 2 * row + 1, tl.where(nonempty, tl.log2(l_safe), m_i), mask=m_valid)


def aligned_rows(x: torch.Tensor) -> torch.Tensor:
    """``x``, or a copy of it whose strides (but the last) are multiples of 16 elements.

    Triton specialises an integer argument as "divisible by 16" or not at all, and proves
    a tile's rows 16-byte aligned (which ``cp.async``, the kernels' software-pipelined
    loads, needs) only from strides divisible by 16 and a 16-byte aligned base. A
    ``head_dim`` that is not a multiple of 16 (40, 72, 120) gives contiguous rows of
    another stride, and the kernels then load synchronously
    (``benchmarks/results/aot_2026-12-01_other_head_dims.md``). Such inputs are copied
    into a buffer with the last dimension padded to a multiple of 16 and returned as a view
    of the first ``x.shape[-1]`` columns (the kernels mask the padding): one extra read and
    write of the tensor, ``O(n head_dim)`` against the attention's ``O(n window
    head_dim)``.

    Parameters
    ----------
    x : torch.Tensor
        ``(batch, heads, seq_len, head_dim)``, any dtype, device and strides.

    Returns
    -------
    torch.Tensor
        ``x`` itself when its base is 16-byte aligned, its last stride 1 and its other
        strides multiples of 16 (or the tensor is empty); else the aligned copy (same
        values, shape, dtype and device).
    """
    if x.numel() == 0:
        return x
    aligned = (
        x.stride(-1) == 1 and all(st % 16 == 0 for st in x.stride()[:-1]) and x.data_ptr() % 16 == 0
    )
    if aligned:
        return x
    width = -(-x.shape[-1] // 16) * 16
    buf = x.new_empty((*x.shape[:-1], width))
    buf[..., : x.shape[-1]].copy_(x)
    return buf[..., : x.shape[-1]]


def pow2(x: int, minimum: int = 16) -> int:
    """Smallest power of two ``>= max(x, minimum)`` (tile widths of ``tl.arange``)."""
    return max(minimum, triton.next_power_of_2(max(int(x), 1)))


def head_dim_split(head_dim: int, halves: bool = False) -> tuple[int, int]:
    """Column chunks ``(BLOCK_D, BLOCK_D1)`` covering ``head_dim`` (``BLOCK_D1 = 0``: one).

    One power of two when that wastes nothing or a split would not save work, else the
    largest power of two ``<= head_dim`` and the power of two covering the rest (80 -> 64 +
    16, 96 -> 64 + 32, 200 -> 128 + 128 is no saving: 256). ``halves``
    (:attr:`TileConfig.column_halves`): two equal chunks, each half the power of two
    covering ``head_dim`` (64 -> 32 + 32; 80, 96, 128 -> 64 + 64), so that each ``tl.dot``
    stages a narrower operand in registers and every ``head_dim`` in ``(64, 128]`` compiles
    to the register footprint of 128 (padding columns masked).
    """
    full = pow2(head_dim)
    if halves and full >= 32:
        return full // 2, full // 2
    low = max(16, 1 << (max(int(head_dim), 1).bit_length() - 1))
    if low >= head_dim:
        return full, 0
    rest = pow2(head_dim - low)
    return (low, rest) if low + rest < full else (full, 0)


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """Tile sizes and launch parameters of the forward and backward kernels.

    Attributes
    ----------
    block_m, block_n : int
        Query and key tile of the forward and dQ kernels (and of the plan they share;
        ``block_n`` is also the key tile of the dK/dV kernel).
    num_warps, num_stages : int
        Warps of the forward kernel; software-pipelining stages of every key/query loop.
    dq_num_warps : int
        Warps of the dQ kernel.
    dkdv_block_m, dkdv_num_warps : int
        Query tile (a divisor of ``block_m``) and warps of the dK/dV kernel.
    column_halves : bool
        ``head_dim`` in two equal column chunks (:func:`head_dim_split`).
    dq_block_n : int or None
        Key tile of the dQ kernel (``None``: ``block_n``), a divisor of ``block_n`` (the
        plan's key ranges start at multiples of ``block_n``, hence of any divisor of it).
    fwd_column_halves : bool or None
        The forward kernel's column chunks (``None``: ``column_halves``); see
        :meth:`halves`.
    fwd_maxnreg : int or None
        Registers per thread ptxas may use in the forward kernel (Triton's ``maxnreg``
        launch option, PTX ``.maxnreg``; ``None``: ptxas's own choice).
    dq_maxnreg, dkdv_maxnreg : int or None
        The same for the dQ and the dK/dV kernel.
    classify : bool
        The counts classify each sample per tile pair as full, disjoint or mixed and skip
        the comparisons of the first two (uniform branches; :func:`plsh_fast.tiling.tile_counts`);
        ``False``: every sample is compared (the same counts, bit for bit).
    dkdv_block_n : int or None
        Key tile of the dK/dV kernel (``None``: ``block_n``); its query ranges are planned for
        this tile (:func:`plsh_fast.tiling.plan_query_range`), so it need not divide or be
        divided by ``block_n``.
    dkdv_split_d : bool
        Two dK/dV programs per key tile, each accumulating one of the equal column halves
        of dK and dV (both recompute the logits, counts and dP: 1.5 times the MMA work and
        twice the counts and ``exp2``), halving the accumulators' registers. Only where
        the backward takes ``head_dim`` and ``head_dim_v`` each in two equal, non-empty
        column chunks (:func:`head_dim_split`; ``column_halves`` at head sizes above 16);
        ignored otherwise.
    dkdv_manual_x3 : bool
        float32, with ``dkdv_split_d`` and column halves of at least 32: the dK/dV kernel
        writes the logits' and dP's ``tf32x3`` out (``input_precision="tf32"`` dots, as
        Triton's lowering, the same arithmetic): K and V split into TF32 high and low parts
        once per program, in four column quarters (narrower MMA operands keep fewer
        registers live), and dK, dV accumulated per quarter (a fresh tf32x3 accumulator of
        a quarter's width per dot).
    narrow_whole : bool
        Unequal head sizes: the backward kernels take the narrower of ``head_dim`` and
        ``head_dim_v`` in one piece (:func:`head_dim_split` without halves) and only the
        wider in column halves (``column_halves``), except the dK/dV kernel's column-half
        programs (``dkdv_split_d``), which need halves of both (:meth:`backward_chunks`).
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    dq_num_warps: int
    dkdv_block_m: int
    dkdv_num_warps: int
    column_halves: bool = False
    dq_block_n: int | None = None
    fwd_column_halves: bool | None = None
    fwd_maxnreg: int | None = None
    dkdv_block_n: int | None = None
    dkdv_split_d: bool = False
    dkdv_manual_x3: bool = False
    narrow_whole: bool = False
    dq_maxnreg: int | None = None
    dkdv_maxnreg: int | None = None
    classify: bool = True

    def halves(self, forward: bool) -> bool:
        """Whether the forward (``forward=True``) or the backward kernels take ``head_dim``
        in two equal column chunks (:func:`head_dim_split`)."""
        if forward and self.fwd_column_halves is not None:
            return self.fwd_column_halves
        return self.column_halves

    def backward_chunks(
        self, head_dim: int, head_dim_v: int, dkdv: bool
    ) -> tuple[tuple[int, int], tuple[int, int]]:
        """Column chunks ``((BLOCK_D, BLOCK_D1), (BLOCK_DV, BLOCK_DV1))`` of ``head_dim`` and
        ``head_dim_v`` in the dQ kernel (``dkdv=False``) or the dK/dV kernel (before its
        column-half programs halve them again): :func:`head_dim_split` of each, in halves
        where :meth:`halves` says so, but with :attr:`TileConfig.narrow_whole` the narrower
        of unequal head sizes in one piece (not in the dK/dV kernel's column-half programs,
        :attr:`TileConfig.dkdv_split_d`)."""
        halves = self.halves(forward=False)
        whole = self.narrow_whole and not (dkdv and self.dkdv_split_d)
        widest = max(head_dim, head_dim_v)
        d_split, dv_split = (
            head_dim_split(d, halves and not (whole and d < widest)) for d in (head_dim, head_dim_v)
        )
        return d_split, dv_split


def tile_config(
    head_dim: int,
    head_dim_v: int,
    device: torch.device,
    dtype: torch.dtype = torch.bfloat16,
    capability: tuple[int, int] | None = None,
    num_samples: int | None = None,
) -> TileConfig:
    """The shipped :class:`TileConfig` for a head size, dtype and GPU.

    Chosen from the AOT compile tables (``benchmarks/aot_report.py --set full``,
    ``benchmarks/results/aot_2026-12-01_session4*.md``, Triton 3.9 and 3.6) so that at the
    head sizes of that set (40, 64, 72, 80, 96, 112, 120, 128 and 256, 64/128 and 128/64;
    float32, float16, bfloat16; sm_90 and sm_80; 1 to 64 samples) no kernel at
    ``head_dim <= 128`` spills registers, the key/query loops stay software-pipelined
    (``cp.async``), the dots use ``wgmma`` on sm_90 (``mma.sync`` on sm_80; also the
    bfloat16 dK/dV kernel at head_dim 256) and the shared memory fits; speed is a GPU
    measurement (``benchmarks/gpu_check.py``). Head sizes that are not multiples of 16
    (40, 72, 120) need the launch code's :func:`aligned_rows` copy for that (without it
    they lost ``cp.async`` and some spilled). At unequal head sizes the backward kernels
    take the narrower one whole (:attr:`TileConfig.narrow_whole`: in halves it spilled
    40-88 B in the float32 dQ kernel on sm_90 and 8-52 B in the half-type dK/dV kernel on
    sm_80). On sm_90 the half types' backward kernels take column halves at a head_dim
    strictly between 96 and 128 (in one 128-wide chunk the dK/dV kernel spilled 64 B at
    104 and 120 with Triton 3.6) and the float32 forward there runs with ``maxnreg = 254``
    (ptxas's own 255 spilled 24 B at 112 with 3.6, and 254 spills 16 B at 128 with 3.6, so
    128 keeps ptxas's choice; ``benchmarks/results/aot_2026-12-01_other_head_dims.md``,
    "Session 4"). More than 64 samples (up to 256) are statically unrolled passes of 32
    samples (:func:`plsh_fast.tiling.sample_block`): the loops stay pipelined
    (``benchmarks/results/aot_2026-12-01_samples.md``). Not so: above 256 samples the
    passes are a runtime loop (no ``cp.async``); the float32 forward at head_dim 256 on
    sm_90 (32-row tiles: ``mma.sync``, and it spills); at 256 samples the float32 dQ
    kernel (24 B, Triton 3.9) and forward (16 B, 3.6) on sm_90, and the float32 dQ kernel
    at head_dim 112 from 65 samples (8 B, 3.9; the samples results file, "After the s > 64
    rules"). ``num_samples`` above 64 (more than one pass of the counts): the half types'
    dK/dV kernel on sm_80 at head_dim <= 128 may use 255 registers
    (:attr:`TileConfig.dkdv_maxnreg`; left to itself ptxas stopped at 168 and spilled 72 B
    at 256 samples with Triton 3.9), and float32 on sm_90 at head_dim <= 128 compares
    every sample (:attr:`TileConfig.classify` off: the skips of full and disjoint samples
    made the dQ kernel spill 16 B at 65 samples, 32 B at 128, 96 B at 256 and the forward
    16 B (3.9) and 40 B (3.6) at 256); up to 64 samples (or ``None``) the configuration is
    the same as without it. The float32 dK/dV kernel on sm_90 takes
    64-key tiles (a warpgroup MMA's rows; the plan's key tile stays 16) in two column-half
    programs with its own tf32x3 (:attr:`TileConfig.dkdv_split_d`,
    :attr:`TileConfig.dkdv_manual_x3`; ``benchmarks/results/aot_2026-12-01_fp32_dkdv.md``);
    on sm_80 it keeps 16 x 16 tiles (``mma.sync``). The query tiles stay at 64 rows or
    fewer because a tile's planned key range is about ``BLOCK_M`` plus the window, and the
    PLSH window is short for small sigma. The dQ
    kernel walks the key range in half-width tiles (32 keys on sm_90, 16 on sm_80; with the
    plan's 64/32 it spilled 8-24 B at bf16/fp16 head_dim 96-128 with Triton 3.6, and on
    sm_80 with 3.9). Eight warps would avoid these spills too, but with 64-row tiles the
    second warpgroup (sm_90) or the second four warps (sm_80) only repeat the first's logits
    and counts (``warpsPerCTA = [8, 1]``, the layout a dot feeding another dot takes), twice
    the work. float32 (``tf32x3``: each operand split in a TF32 high and low part, three
    MMAs per dot) takes narrow key tiles, eight warps in the dQ kernel (whose second
    warpgroup also repeats the logits and counts; with four warps it spills 64 B at
    head_dim 128 on sm_90, Triton 3.9) and ``head_dim`` in two column chunks, except the
    sm_90 forward at a head_dim in 65..96 that is not a power of two (96 = 64 + 32: the
    halves 64 + 64 spilled 24 B with 3.6; above 96 the halves spill less than one 128-wide
    chunk: at 112, 0 B against 92 B with 3.9 and 24 B against 192 B with 3.6,
    ``benchmarks/results/aot_2026-12-01_other_head_dims.md``); the sm_80 float32 forward at
    head_dim 65..128 (16 x 16 tiles) lets ptxas use 255 registers (``fwd_maxnreg``; left
    to itself it stopped at 168 and spilled 8 B at head_dim 96 with 3.6, and with two warps
    at 128 with 3.9). On sm_80 the half types at ``head_dim <= 128`` take two column chunks
    too.

    Parameters
    ----------
    head_dim, head_dim_v : int
        Query/key and value head sizes (``<= 256``).
    device : torch.device
        A CUDA device, or any other (the interpreter): 16 x 16 tiles.
    dtype : torch.dtype
        float16, bfloat16 or float32.
    capability : tuple of int or None
        CUDA compute capability (default: the device's).
    num_samples : int or None
        Partition samples ``s`` of the call (``None``: the configuration of ``s <= 64``).

    Returns
    -------
    TileConfig
    """
    widest = max(head_dim, head_dim_v)
    fp32 = dtype == torch.float32
    many = num_samples is not None and num_samples > MAX_SAMPLE_BLOCK  # more than one pass
    if device.type != "cuda":  # the interpreter: the column chunks of a GPU, small tiles
        halves = fp32 and widest <= 128
        return TileConfig(16, 16, 4, 1, 4, 16, 4, halves, narrow_whole=halves)
    if capability is None:
        capability = torch.cuda.get_device_capability(device)
    hopper = capability[0] >= 9
    if widest <= 128 and fp32:
        if hopper:  # dK/dV: 64-key tiles (warpgroup MMAs), column halves, tf32x3 by hand
            return TileConfig(
                64, 16, 4, 2, 8, 16, 4, True,
                fwd_column_halves=pow2(widest) == widest or widest > 96,
                fwd_maxnreg=254 if 96 < widest < 128 else None,
                dkdv_block_n=64, dkdv_split_d=True, dkdv_manual_x3=True, narrow_whole=True,
                classify=not many,
            )  # fmt: skip
        if widest <= 64:
            return TileConfig(64, 16, 4, 2, 8, 16, 8, True, narrow_whole=True)
        return TileConfig(  # sm_80, d 65..128
            16, 16, 4, 2, 8, 16, 8, True, fwd_maxnreg=255, narrow_whole=True
        )
    if widest <= 128 and not hopper:  # mma.sync keeps the accumulators in registers
        return TileConfig(
            64, 32, 4, 3, 4, 16, 4, True, dq_block_n=16, narrow_whole=True,
            dkdv_maxnreg=255 if many else None,
        )  # fmt: skip
    if widest <= 128:  # backward column halves above 96 but at 128 (forward: one chunk)
        halves = 96 < widest < 128
        return TileConfig(
            64, 64, 4, 3, 4, 16, 4, halves, dq_block_n=32, fwd_column_halves=False,
            narrow_whole=halves,
        )  # fmt: skip
    if fp32:  # float32 tiles of width 256: stay inside shared memory
        return TileConfig(32, 32, 8, 2, 8, 16, 8)
    return TileConfig(64, 32, 8, 2, 8, 16, 8)


def default_blocks(
    head_dim: int,
    head_dim_v: int,
    device: torch.device,
    dtype: torch.dtype = torch.bfloat16,
    capability: tuple[int, int] | None = None,
) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` of the shipped forward kernel: the
    first four fields of :func:`tile_config` (same arguments)."""
    cfg = tile_config(head_dim, head_dim_v, device, dtype, capability)
    return cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages


def dot_precision(dtype: torch.dtype, interpreted: bool) -> str:
    """``input_precision`` of ``tl.dot``: float32 inputs use ``tf32x3`` (three TF32 MMAs,
    about float32 accuracy at tensor-core speed) when compiled; half types use the native
    MMA ("tf32" is ignored for them); the interpreter computes in float32 ("ieee")."""
    if interpreted:
        return "ieee"
    return "tf32x3" if dtype == torch.float32 else "tf32"


def _interpreting() -> bool:
    return type(_fwd_kernel).__name__ == "InterpretedFunction"


def plsh_forward_triton(
    query,
    key,
    value,
    pitch,
    offset,
    query_positions,
    key_positions,
    scale: float,
    causal: bool,
    *,
    plan=None,
    positions_sorted: bool | None = None,
    return_plan: bool = False,
    return_stats: bool = False,
    _block_m: int | None = None,
    _block_n: int | None = None,
    _variant: int = 0,
    _num_warps=None,
    _num_stages=None,
    _classify: bool | None = None,
    _tiles: TileConfig | None = None,
):
    """PLSH attention forward on the fused Triton kernel.

    Inputs are validated by :func:`plsh_fast.plsh_attention`; only internal preconditions
    are asserted here.

    Parameters
    ----------
    query : torch.Tensor
        ``(batch, num_heads, n_q, head_dim)``, float16/bfloat16/float32, any strides.
    key : torch.Tensor
        ``(batch, num_heads_kv, n_k, head_dim)``, same dtype and device.
    value : torch.Tensor
        ``(batch, num_heads_kv, n_k, head_dim_v)``.
    pitch, offset : torch.Tensor
        float64 ``(num_heads, num_samples)`` partition sample on the same device.
    query_positions, key_positions : torch.Tensor
        int64 ``(n_q,)``, ``(n_k,)`` absolute positions on the same device.
    scale : float
        Logit scale ``c`` (``A_ij = exp(c q_i . k_j)``).
    causal : bool
        Keys with ``p_j > p_i`` are inadmissible.
    positions_sorted : bool or None
        ``True``: the caller guarantees both position vectors are non-decreasing (e.g. the
        default ``arange`` positions), so no check runs and the forward pass has **no host
        synchronisation**. ``None`` (default): checked (one synchronisation) and unsorted
        rows are sorted and put back (:mod:`plsh_fast._ordering`).
    plan : plsh_fast.tiling.TilePlan or None
        A plan of an earlier call on the same (sorted) positions, partition and ``causal``
        (``return_plan=True``): reused, no planning and no check of the positions.
    return_plan : bool
        Also return the :class:`plsh_fast.tiling.TilePlan` (for
        :func:`plsh_fast.triton_backward.plsh_backward_triton`'s ``plan``); ``None`` when
        the positions had to be sorted (the plan then describes the sorted rows).
    return_stats : bool
        Also return the softmax statistics ``stats`` that
        :func:`plsh_fast.triton_backward.plsh_backward_triton` takes as ``stats=`` to
        recompute the probabilities without the float32 rounding of the LSE
        (``proofs_notes/backward.md``).

    Returns
    -------
    (out, lse[, stats][, plan]) : tuple
        ``out`` ``(batch, num_heads, n_q, head_dim_v)`` in the query dtype (contiguous);
        ``lse`` float32 ``(batch, num_heads, n_q)``, ``log sum_j A_ij M~_ij`` (natural log).
        A row with no admissible key has ``out = 0`` and ``lse = -inf``. ``stats`` (only
        with ``return_stats``): float32 ``(batch, num_heads, n_q, 2)``, per row the
        maximum ``m_i`` of the admissible logits in the log2 domain (``c q_i.k_j log2 e``,
        exactly the value the kernel subtracted) and ``log2 l_i``, ``l_i = sum_j C_ij
        2^(c q_i.k_j log2 e - m_i)``, so that ``lse_i = (m_i + log2 l_i) ln 2 - ln s``;
        ``(-inf, -inf)`` on a row with no admissible key. ``plan`` only with
        ``return_plan``.

    References
    ----------
    Wolfson & Wagner (2026), Theorem 2.2; SPEC sections 2-3.
    """
    batch, num_heads, n_q, head_dim = query.shape
    _, num_heads_kv, n_k, _ = key.shape
    head_dim_v = value.shape[3]
    assert query.dtype in (torch.float16, torch.bfloat16, torch.float32)
    assert key.dtype == query.dtype and value.dtype == query.dtype
    assert key.shape[0] == batch and key.shape[3] == head_dim
    assert value.shape[:3] == key.shape[:3]
    assert num_heads % num_heads_kv == 0
    assert pitch.shape == offset.shape and pitch.shape[0] == num_heads
    assert query_positions.shape == (n_q,) and key_positions.shape == (n_k,)
    assert head_dim <= 256 and head_dim_v <= 256
    num_samples = pitch.shape[1]
    assert 1 <= num_samples <= 32768  # C_ij <= s must stay finite in float16
    kw = dict(
        _block_m=_block_m,
        _block_n=_block_n,
        _variant=_variant,
        _num_warps=_num_warps,
        _num_stages=_num_stages,
        _classify=_classify,
        _tiles=_tiles,
    )
    if plan is None and not positions_sorted:
        q_order, q_inverse = position_order(query_positions)
        k_order, _ = position_order(key_positions)
        if q_order is not None or k_order is not None:
            # Unsorted positions: run on rows sorted by position (the row ranges of the
            # counts need sorted keys) and put the rows back.
            (query,) = take_rows(q_order, query)
            key, value = take_rows(k_order, key, value)
            out, lse, stats = plsh_forward_triton(
                query,
                key,
                value,
                pitch,
                offset,
                sort_positions(query_positions, q_order),
                sort_positions(key_positions, k_order),
                scale,
                causal,
                positions_sorted=True,
                return_stats=True,
                **kw,
            )
            out, lse, stats = take_rows(q_inverse, out, lse, stats)
            return _results(out, lse, stats, None, return_stats, return_plan)
    dev = query.device
    out = torch.zeros((batch, num_heads, n_q, head_dim_v), dtype=query.dtype, device=dev)
    lse = torch.full((batch, num_heads, n_q), float("-inf"), dtype=torch.float32, device=dev)
    stats = torch.full((batch, num_heads, n_q, 2), float("-inf"), dtype=torch.float32, device=dev)
    if batch == 0 or n_q == 0 or n_k == 0:
        return _results(out, lse, stats, None, return_stats, return_plan)
    query, key, value = (aligned_rows(x) for x in (query, key, value))  # cp.async
    tiles = _tiles or tile_config(head_dim, head_dim_v, dev, query.dtype, num_samples=num_samples)
    block_m = _block_m or tiles.block_m
    block_n = _block_n or tiles.block_n
    num_warps = _num_warps or tiles.num_warps
    num_stages = _num_stages or tiles.num_stages
    if plan is None:
        plan = make_plan(
            query_positions,
            key_positions,
            pitch,
            offset,
            causal=causal,
            block_m=block_m,
            block_n=block_n,
        )
    assert (plan.block_m, plan.block_n, plan.causal, plan.n_k) == (block_m, block_n, causal, n_k)
    n_q_tiles = triton.cdiv(n_q, block_m)
    interp = _interpreting()
    upcast = query.dtype == torch.bfloat16 and interp
    s_block, passes = sample_block(num_samples)
    split_d = head_dim_split(head_dim, tiles.halves(forward=True))
    split_dv = head_dim_split(head_dim_v, tiles.halves(forward=True))
    grid = (n_q_tiles * batch * num_heads,)
    assert grid[0] < 2**31
    _fwd_kernel[grid](
        query,
        key,
        value,
        out,
        lse,
        stats,
        plan.row_start,
        plan.row_end,
        plan.key_range,
        plan.causal_end,
        plan.head_order,
        *query.stride(),
        *key.stride(),
        *value.stride(),
        *out.stride(),
        batch,
        n_q,
        n_k,
        num_heads,
        num_heads // num_heads_kv,
        num_samples,
        n_q_tiles,
        float(scale) * LOG2E,
        math.log(num_samples),
        D=head_dim,
        DV=head_dim_v,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=split_d[0],
        BLOCK_DV=split_dv[0],
        BLOCK_D1=split_d[1],
        BLOCK_DV1=split_dv[1],
        S_BLOCK=s_block,
        PASSES=passes,
        UPCAST=upcast,
        DOT_PREC=dot_precision(query.dtype, interp or upcast),
        VARIANT=int(_variant),
        CLASSIFY=bool(tiles.classify if _classify is None else _classify),
        NUM_STAGES=num_stages,
        CAUSAL=bool(causal),
        num_warps=num_warps,
        num_stages=num_stages,
        maxnreg=tiles.fwd_maxnreg,
    )
    return _results(out, lse, stats, plan, return_stats, return_plan)


def _results(out, lse, stats, plan, return_stats: bool, return_plan: bool) -> tuple:
    """``(out, lse[, stats][, plan])`` as :func:`plsh_forward_triton` returns them."""
    return (out, lse) + ((stats,) if return_stats else ()) + ((plan,) if return_plan else ())
