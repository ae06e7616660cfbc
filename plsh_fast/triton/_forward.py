"""The fused Triton forward kernel of PLSH attention and its launcher.

PLSH attention (Wolfson & Wagner 2026, Theorem 2.2; SPEC section 3) is softmax attention
with the additive bias ``log M~_ij = log(C_ij / s)``, where ``C_ij`` counts the samples
whose bins put positions ``p_i`` and ``p_j`` together. One program handles one query tile
of one (batch, head) and makes a single pass over the keys its rows can reach (planned
by :mod:`plsh_fast.triton._tiling`, about ``BLOCK_M`` plus the largest of the ``s`` pitches,
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
:func:`plsh_fast.triton._tiling.tile_counts` (one-sided events: 1.5 integer instructions
per element and mixed sample, none for samples whose start is before or after the whole
tile pair; more than 64 samples in statically unrolled passes of 32). The key loop is a
software-pipelined ``tl.range`` (key/value tiles loaded ``num_stages - 1`` steps ahead,
``cp.async``/TMA on sm_80+/sm_90; ``benchmarks/aot_report.py`` checks it; up to 256
samples, above which the passes are a runtime loop,
:func:`plsh_fast.triton._tiling.sample_block`). Programs take the heads with the most
planned work first and, within a head, the last query tiles first.

The launcher :func:`plsh_forward_triton` runs in named steps: check the shapes, run on
rows sorted by position (:func:`plsh_fast.triton._launch.on_sorted_rows`), allocate the
results, align the rows, resolve the configuration and plan
(:func:`plsh_fast.triton._launch.prepare_launch`) and launch the kernel
(:func:`launch_forward`).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .._validation import MAX_HEAD_DIM_TRITON, MAX_NUM_SAMPLES_TRITON
from ._config import TileConfig, head_dim_split
from ._launch import LENGTHS, LOG2E, Launch, aligned_rows, on_sorted_rows, prepare_launch
from ._memory import load_tile, store_tile
from ._tiling import TilePlan, max_combine, sum_combine, tile_counts_all

__all__ = ["launch_forward", "plsh_forward_triton"]


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

    q_base = Q + b64 * sqb + h.to(tl.int64) * sqh
    q = load_tile(q_base, offs_m, sqm, offs_d, sqd, m_valid, d_valid, UPCAST)
    if BLOCK_D1 > 0:
        offs_d1 = BLOCK_D + tl.arange(0, BLOCK_D1)
        d1_valid = offs_d1 < D
        q1 = load_tile(q_base, offs_m, sqm, offs_d1, sqd, m_valid, d1_valid, UPCAST)
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
        k = load_tile(k_base, offs_n, skn, offs_d, skd, n_valid, d_valid, UPCAST, True)  # (D, N)
        v = load_tile(v_base, offs_n, svn, offs_dv, svd, n_valid, dv_valid, UPCAST)
        if BLOCK_D1 > 0:
            k1 = load_tile(k_base, offs_n, skn, offs_d1, skd, n_valid, d1_valid, UPCAST, True)
        if BLOCK_DV1 > 0:
            v1 = load_tile(v_base, offs_n, svn, offs_dv1, svd, n_valid, dv1_valid, UPCAST)
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
    o_base = Out + b64 * sob + h.to(tl.int64) * soh
    store_tile(o_base, offs_m, som, offs_dv, sod, m_valid, dv_valid, out)
    if BLOCK_DV1 > 0:
        out1 = tl.where(nonempty[:, None], acc1 / l_safe[:, None], 0.0)
        store_tile(o_base, offs_m, som, offs_dv1, sod, m_valid, dv1_valid, out1)
    row = (b64 * num_heads + h) * n_q + offs_m
    tl.store(Lse + row, lse, mask=m_valid)
    # For the backward, the LSE without rounding (log2 domain): the row maximum m_i that
    # the forward subtracted and log2 of the row sum l_i; -inf and -inf on an empty row.
    tl.store(Stats + 2 * row, m_i, mask=m_valid)
    tl.store(Stats + 2 * row + 1, tl.where(nonempty, tl.log2(l_safe), m_i), mask=m_valid)


def plsh_forward_triton(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pitch: torch.Tensor,
    offset: torch.Tensor,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    scale: float,
    causal: bool,
    *,
    plan: TilePlan | None = None,
    positions_sorted: bool | None = None,
    return_plan: bool = False,
    return_stats: bool = False,
    tiles: TileConfig | None = None,
) -> tuple:
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
    plan : plsh_fast.triton.TilePlan or None
        A plan of an earlier call on the same (sorted) positions, partition, ``causal``
        and tiles (``return_plan=True``): reused, no planning and no check of the
        positions.
    positions_sorted : bool or None
        ``True``: the caller guarantees both position vectors are non-decreasing (e.g. the
        default ``arange`` positions), so no check runs and the forward pass has **no host
        synchronisation**. ``None`` (default): checked (one synchronisation) and unsorted
        rows are sorted and put back (:mod:`plsh_fast._ordering`).
    return_plan : bool
        Also return the :class:`plsh_fast.triton.TilePlan` (for
        :func:`plsh_fast.triton.plsh_backward_triton`'s ``plan``); ``None`` when the
        positions had to be sorted (the plan then describes the sorted rows).
    return_stats : bool
        Also return the softmax statistics ``stats`` that
        :func:`plsh_fast.triton.plsh_backward_triton` takes as ``stats=`` to recompute the
        probabilities without the float32 rounding of the LSE (``proofs_notes/backward.md``).
    tiles : plsh_fast.triton.TileConfig or None
        Tile sizes and launch options (``None``: :func:`plsh_fast.triton.tile_config` for
        the head sizes, dtype, device and number of samples).

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
    _check_shapes(query, key, value, pitch, offset, query_positions, key_positions)
    if plan is None and not positions_sorted:

        def run_sorted(query_rows, key_rows, sorted_query_positions, sorted_key_positions):
            results = plsh_forward_triton(
                *query_rows,
                *key_rows,
                pitch,
                offset,
                sorted_query_positions,
                sorted_key_positions,
                scale,
                causal,
                positions_sorted=True,
                return_stats=True,
                tiles=tiles,
            )
            return results, ()

        # Unsorted positions: run on rows sorted by position (the row ranges of the
        # counts need sorted keys) and put the rows back.
        done = on_sorted_rows(run_sorted, query_positions, key_positions, (query,), (key, value))
        if done is not None:
            (out, lse, stats), _ = done
            return _results(out, lse, stats, None, return_stats, return_plan)
    out, lse, stats = _empty_results(query, value)
    if out.shape[0] == 0 or out.shape[2] == 0 or key.shape[2] == 0:
        return _results(out, lse, stats, None, return_stats, return_plan)
    query, key, value = (aligned_rows(x) for x in (query, key, value))  # cp.async
    launch = prepare_launch(
        query, value, pitch, offset, query_positions, key_positions, causal,
        tiles=tiles, plan=plan, kernel=_fwd_kernel,
    )  # fmt: skip
    launch_forward(launch, query, key, value, out, lse, stats, scale)
    return _results(out, lse, stats, launch.plan, return_stats, return_plan)


def _check_shapes(query, key, value, pitch, offset, query_positions, key_positions) -> None:
    """The launcher's internal preconditions (the inputs were validated by the caller)."""
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
    assert head_dim <= MAX_HEAD_DIM_TRITON and head_dim_v <= MAX_HEAD_DIM_TRITON
    assert 1 <= pitch.shape[1] <= MAX_NUM_SAMPLES_TRITON  # C_ij <= s finite in float16


def _empty_results(query, value) -> tuple:
    """``(out, lse, stats)`` as returned where no key is admissible: zeros, ``-inf``."""
    batch, num_heads, n_q, _ = query.shape
    dev = query.device
    out = torch.zeros((batch, num_heads, n_q, value.shape[3]), dtype=query.dtype, device=dev)
    lse = torch.full((batch, num_heads, n_q), float("-inf"), dtype=torch.float32, device=dev)
    stats = torch.full((batch, num_heads, n_q, 2), float("-inf"), dtype=torch.float32, device=dev)
    return out, lse, stats


def launch_forward(
    launch: Launch,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    stats: torch.Tensor,
    scale: float,
) -> None:
    """Run the forward kernel into ``out``, ``lse`` and ``stats`` (written in place).

    Parameters
    ----------
    launch : plsh_fast.triton._launch.Launch
        The pass's configuration, plan and shared constexprs.
    query, key, value : torch.Tensor
        As :func:`plsh_forward_triton`'s, non-empty, rows sorted by position and aligned
        (:func:`plsh_fast.triton._launch.aligned_rows`).
    out, lse, stats : torch.Tensor
        The results, shaped as :func:`plsh_forward_triton` returns them.
    scale : float
        Logit scale ``c``.
    """
    batch, num_heads, n_q, head_dim = query.shape
    num_heads_kv, n_k, head_dim_v = key.shape[1], key.shape[2], value.shape[3]
    tiles, plan = launch.tiles, launch.plan
    num_samples = launch.num_samples
    split_d = head_dim_split(head_dim, tiles.halves(forward=True))
    split_dv = head_dim_split(head_dim_v, tiles.halves(forward=True))
    grid = (launch.n_q_tiles * batch * num_heads,)
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
        launch.n_q_tiles,
        float(scale) * LOG2E,
        math.log(num_samples),
        BLOCK_D=split_d[0],
        BLOCK_DV=split_dv[0],
        BLOCK_D1=split_d[1],
        BLOCK_DV1=split_dv[1],
        num_warps=tiles.num_warps,
        maxnreg=tiles.fwd_maxnreg,
        **launch.meta,
    )


def _results(out, lse, stats, plan, return_stats: bool, return_plan: bool) -> tuple:
    """``(out, lse[, stats][, plan])`` as :func:`plsh_forward_triton` returns them."""
    return (out, lse) + ((stats,) if return_stats else ()) + ((plan,) if return_plan else ())
