"""Triton backward kernels of PLSH attention (gradients of the counts-weighted softmax).

With ``x_ij = c q_i.k_j`` (``c`` the scale), weights ``C_ij`` (collision counts, SPEC
section 3) and the saved ``lse_i = log(sum_j C_ij e^{x_ij} / s)``, the attention
probabilities are ``P_ij = C_ij exp(x_ij - lse_i - log s)`` and, as for plain softmax
attention (the counts are constants),

``dV_j = sum_i P_ij dO_i``, ``dP_ij = dO_i . v_j``, ``dS_ij = P_ij (dP_ij - D_i)`` with
``D_i = dO_i . O_i``, ``dQ_i = c sum_j dS_ij k_j``, ``dK_j = c sum_i dS_ij q_i``

(derivation in ``proofs_notes``; FlashAttention-2's recomputation scheme, Dao 2023). Three
kernels, all deterministic (no atomics): ``D`` per row; ``dQ`` per query tile over the
same planned key range as the forward pass; ``dK, dV`` per key tile over the planned
query range of every query head of its key/value group (grouped-query gradients are summed
in registers). Pairs outside the planned ranges, masked pairs and padded rows contribute
exactly zero.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .ordering import position_order, sort_positions, take_rows
from .tiling import (
    make_plan,
    plan_query_range,
    sample_block,
    sum_combine,
    tile_counts_all,
)
from .triton_forward import LENGTHS, LOG2E, dot_precision, head_dim_split, pow2, tile_config

__all__ = ["plsh_backward_triton"]


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
    mask = (offs_m < n_q)[:, None] & (offs_dv < DV)[None, :]
    o = tl.load(
        Out + b * sob + h * soh + offs_m[:, None] * som + offs_dv[None, :] * sod,
        mask=mask,
        other=0.0,
    ).to(tl.float32)
    do = tl.load(
        DOut + b * sdb + h * sdh + offs_m[:, None] * sdm + offs_dv[None, :] * sdd,
        mask=mask,
        other=0.0,
    ).to(tl.float32)
    tl.store(
        Delta + bh.to(tl.int64) * n_q + offs_m,
        tl.reduce(o * do, 1, sum_combine),
        mask=offs_m < n_q,
    )


@triton.jit
def _tile(base, rows, row_stride, cols, col_stride, row_valid, col_valid, UPCAST: tl.constexpr):
    """``base[rows, cols]`` (masked, 0 outside), upcast to float32 in the interpreter."""
    x = tl.load(
        base + rows[:, None] * row_stride + cols[None, :] * col_stride,
        mask=row_valid[:, None] & col_valid[None, :],
        other=0.0,
    )
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def _probabilities(logits, counts, live, lse2, scale_log2, VARIANT: tl.constexpr):
    """``P = C exp2(x log2 e - lse2)`` on admissible pairs (``C > 0``, live row), else 0."""
    logits = logits * scale_log2
    weight = counts.to(tl.float32)  # counts are built in the logits (MMA) layout
    admissible = (weight > 0.0) & live[:, None]
    if VARIANT != 0:  # negative control: counts ignored (mask only), forward/backward mismatch
        weight = tl.where(admissible, 1.0, 0.0)
    return tl.where(admissible, tl.exp2(logits - lse2[:, None]) * weight, 0.0)


@triton.jit(do_not_specialize=LENGTHS)
def _bwd_dq_kernel(
    Q,
    K,
    V,
    DOut,
    Lse,
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
    log2_s,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_D1: tl.constexpr,
    BLOCK_DV1: tl.constexpr,
    S_BLOCK: tl.constexpr,
    MULTI_CHUNK: tl.constexpr,
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
    q = tl.load(
        Q + b * sqb + h.to(tl.int64) * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
        mask=m_valid[:, None] & d_valid[None, :],
        other=0.0,
    )
    do = tl.load(
        DOut + b * sdb + h.to(tl.int64) * sdh + offs_m[:, None] * sdm + offs_dv[None, :] * sdd,
        mask=m_valid[:, None] & dv_valid[None, :],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    q_base = Q + b * sqb + h.to(tl.int64) * sqh
    do_base = DOut + b * sdb + h.to(tl.int64) * sdh
    if BLOCK_D1 > 0:  # second column chunk of head_dim (triton_forward.head_dim_split)
        offs_d1 = BLOCK_D + tl.arange(0, BLOCK_D1)
        d1_valid = offs_d1 < D
        q1 = _tile(q_base, offs_m, sqm, offs_d1, sqd, m_valid, d1_valid, UPCAST)
        dq1 = tl.zeros([BLOCK_M, BLOCK_D1], dtype=tl.float32)
    if BLOCK_DV1 > 0:
        offs_dv1 = BLOCK_DV + tl.arange(0, BLOCK_DV1)
        dv1_valid = offs_dv1 < DV
        do1 = _tile(do_base, offs_m, sdm, offs_dv1, sdd, m_valid, dv1_valid, UPCAST)
    row = bh * n_q + offs_m
    lse = tl.load(Lse + row, mask=m_valid, other=float("-inf"))
    delta = tl.load(Delta + row, mask=m_valid, other=0.0)
    live = lse > float("-inf")
    lse2 = tl.where(live, lse * 1.4426950408889634 + log2_s, 0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    rng = KeyRange + (h.to(tl.int64) * n_q_tiles + m_tile) * 2
    for start_n in tl.range(tl.load(rng), tl.load(rng + 1), BLOCK_N, num_stages=NUM_STAGES):
        offs_n = start_n + tl.arange(0, BLOCK_N).to(tl.int64)
        n_valid = offs_n < n_k
        k = tl.load(
            K + b * skb + hk * skh + offs_n[:, None] * skn + offs_d[None, :] * skd,
            mask=n_valid[:, None] & d_valid[None, :],
            other=0.0,
        )
        v_t = tl.load(
            V + b * svb + hk * svh + offs_n[None, :] * svn + offs_dv[:, None] * svd,
            mask=n_valid[None, :] & dv_valid[:, None],
            other=0.0,
        )
        if UPCAST:
            k = k.to(tl.float32)
            v_t = v_t.to(tl.float32)
        logits = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
        if BLOCK_D1 > 0:
            k1 = _tile(K + b * skb + hk * skh, offs_n, skn, offs_d1, skd, n_valid, d1_valid, UPCAST)
            logits = tl.dot(q1, tl.trans(k1), logits, input_precision=DOT_PREC)
        counts = tile_counts_all(
            RowStart, RowEnd, CausalEnd, h, start_n, offs_m, m_first, m_last, n_q,
            num_samples, BLOCK_M, BLOCK_N, S_BLOCK, MULTI_CHUNK, False, CLASSIFY, logits,
            CAUSAL,
        )  # fmt: skip
        p = _probabilities(logits, counts, live, lse2, scale_log2, VARIANT)
        dp = tl.dot(do, v_t, input_precision=DOT_PREC)
        if BLOCK_DV1 > 0:
            v1 = _tile(
                V + b * svb + hk * svh, offs_n, svn, offs_dv1, svd, n_valid, dv1_valid, UPCAST
            )
            dp = tl.dot(do1, tl.trans(v1), dp, input_precision=DOT_PREC)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PREC)
        if BLOCK_D1 > 0:
            dq1 += tl.dot(ds.to(k1.dtype), k1, input_precision=DOT_PREC)
    dq_base = DQ + b * sgb + h.to(tl.int64) * sgh
    tl.store(
        dq_base + offs_m[:, None] * sgm + offs_d[None, :] * sgd,
        (dq * scale).to(DQ.dtype.element_ty),
        mask=m_valid[:, None] & d_valid[None, :],
    )
    if BLOCK_D1 > 0:
        tl.store(
            dq_base + offs_m[:, None] * sgm + offs_d1[None, :] * sgd,
            (dq1 * scale).to(DQ.dtype.element_ty),
            mask=m_valid[:, None] & d1_valid[None, :],
        )


@triton.jit(do_not_specialize=LENGTHS + ["num_heads_kv", "n_k_tiles"])
def _bwd_dkdv_kernel(
    Q,
    K,
    V,
    DOut,
    Lse,
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
    log2_s,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_D1: tl.constexpr,
    BLOCK_DV1: tl.constexpr,
    S_BLOCK: tl.constexpr,
    MULTI_CHUNK: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PREC: tl.constexpr,
    VARIANT: tl.constexpr,
    CLASSIFY: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    pid = tl.program_id(0)
    n_tile = pid % n_k_tiles  # first key tiles first: causally they have the most queries
    bhk = pid // n_k_tiles
    b = (bhk % batch).to(tl.int64)
    hk = bhk // batch
    n0 = n_tile * BLOCK_N
    offs_n = n0.to(tl.int64) + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    n_valid = offs_n < n_k
    d_valid = offs_d < D
    dv_valid = offs_dv < DV
    k = tl.load(
        K + b * skb + hk.to(tl.int64) * skh + offs_n[:, None] * skn + offs_d[None, :] * skd,
        mask=n_valid[:, None] & d_valid[None, :],
        other=0.0,
    )
    v = tl.load(
        V + b * svb + hk.to(tl.int64) * svh + offs_n[:, None] * svn + offs_dv[None, :] * svd,
        mask=n_valid[:, None] & dv_valid[None, :],
        other=0.0,
    )
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    if BLOCK_D1 > 0:  # second column chunk of head_dim (triton_forward.head_dim_split)
        offs_d1 = BLOCK_D + tl.arange(0, BLOCK_D1)
        d1_valid = offs_d1 < D
        k1 = _tile(
            K + b * skb + hk.to(tl.int64) * skh,
            offs_n,
            skn,
            offs_d1,
            skd,
            n_valid,
            d1_valid,
            UPCAST,
        )
        dk1 = tl.zeros([BLOCK_N, BLOCK_D1], dtype=tl.float32)
    if BLOCK_DV1 > 0:
        offs_dv1 = BLOCK_DV + tl.arange(0, BLOCK_DV1)
        dv1_valid = offs_dv1 < DV
        v1 = _tile(
            V + b * svb + hk.to(tl.int64) * svh,
            offs_n,
            svn,
            offs_dv1,
            svd,
            n_valid,
            dv1_valid,
            UPCAST,
        )
        dv1 = tl.zeros([BLOCK_N, BLOCK_DV1], dtype=tl.float32)
    for g in range(group):
        h = hk * group + g
        rng = QueryRange + (h.to(tl.int64) * n_k_tiles + n_tile) * 2
        for start_m in tl.range(tl.load(rng), tl.load(rng + 1), BLOCK_M, num_stages=NUM_STAGES):
            offs_m = start_m + tl.arange(0, BLOCK_M).to(tl.int64)
            m_valid = offs_m < n_q
            q = tl.load(
                Q + b * sqb + h.to(tl.int64) * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
                mask=m_valid[:, None] & d_valid[None, :],
                other=0.0,
            )
            do = tl.load(
                DOut
                + b * sdb
                + h.to(tl.int64) * sdh
                + offs_m[:, None] * sdm
                + offs_dv[None, :] * sdd,
                mask=m_valid[:, None] & dv_valid[None, :],
                other=0.0,
            )
            row = (b * num_heads + h) * n_q + offs_m
            lse = tl.load(Lse + row, mask=m_valid, other=float("-inf"))
            delta = tl.load(Delta + row, mask=m_valid, other=0.0)
            if UPCAST:
                q = q.to(tl.float32)
                do = do.to(tl.float32)
            # Transposed tiles (keys along the rows): every dot has BLOCK_N rows, so that
            # BLOCK_M can be small (registers) while the MMAs stay warpgroup-sized.
            live = lse > float("-inf")
            lse2 = tl.where(live, lse * 1.4426950408889634 + log2_s, 0.0)
            logits_t = tl.dot(k, tl.trans(q), input_precision=DOT_PREC)
            q_base = Q + b * sqb + h.to(tl.int64) * sqh
            do_base = DOut + b * sdb + h.to(tl.int64) * sdh
            if BLOCK_D1 > 0:
                q1 = _tile(q_base, offs_m, sqm, offs_d1, sqd, m_valid, d1_valid, UPCAST)
                logits_t = tl.dot(k1, tl.trans(q1), logits_t, input_precision=DOT_PREC)
            counts_t = tile_counts_all(
                RowStart, RowEnd, CausalEnd, h, n0, offs_m, start_m,
                tl.minimum(start_m + BLOCK_M, n_q) - 1, n_q, num_samples,
                BLOCK_M, BLOCK_N, S_BLOCK, MULTI_CHUNK, True, CLASSIFY, logits_t, CAUSAL,
            )  # fmt: skip
            if BLOCK_DV1 > 0:
                do1 = _tile(do_base, offs_m, sdm, offs_dv1, sdd, m_valid, dv1_valid, UPCAST)
            logits_t = logits_t * scale_log2
            weight_t = counts_t.to(tl.float32)
            admissible_t = (weight_t > 0.0) & (m_valid & live)[None, :]
            if VARIANT != 0:  # negative control: counts ignored (mask only)
                weight_t = tl.where(admissible_t, 1.0, 0.0)
            p_t = tl.where(admissible_t, tl.exp2(logits_t - lse2[None, :]) * weight_t, 0.0)
            dv += tl.dot(p_t.to(do.dtype), do, input_precision=DOT_PREC)
            dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
            if BLOCK_DV1 > 0:
                dv1 += tl.dot(p_t.to(do1.dtype), do1, input_precision=DOT_PREC)
                dp_t = tl.dot(v1, tl.trans(do1), dp_t, input_precision=DOT_PREC)
            ds_t = p_t * (dp_t - delta[None, :])
            dk += tl.dot(ds_t.to(q.dtype), q, input_precision=DOT_PREC)
            if BLOCK_D1 > 0:
                dk1 += tl.dot(ds_t.to(q1.dtype), q1, input_precision=DOT_PREC)
    tl.store(
        DK + b * skgb + hk.to(tl.int64) * skgh + offs_n[:, None] * skgn + offs_d[None, :] * skgd,
        (dk * scale).to(DK.dtype.element_ty),
        mask=n_valid[:, None] & d_valid[None, :],
    )
    tl.store(
        DV_ + b * svgb + hk.to(tl.int64) * svgh + offs_n[:, None] * svgn + offs_dv[None, :] * svgd,
        dv.to(DV_.dtype.element_ty),
        mask=n_valid[:, None] & dv_valid[None, :],
    )
    if BLOCK_D1 > 0:
        tl.store(
            DK
            + b * skgb
            + hk.to(tl.int64) * skgh
            + offs_n[:, None] * skgn
            + offs_d1[None, :] * skgd,
            (dk1 * scale).to(DK.dtype.element_ty),
            mask=n_valid[:, None] & d1_valid[None, :],
        )
    if BLOCK_DV1 > 0:
        tl.store(
            DV_
            + b * svgb
            + hk.to(tl.int64) * svgh
            + offs_n[:, None] * svgn
            + offs_dv1[None, :] * svgd,
            dv1.to(DV_.dtype.element_ty),
            mask=n_valid[:, None] & dv1_valid[None, :],
        )


def plsh_backward_triton(
    query,
    key,
    value,
    out,
    lse,
    grad_out,
    pitch,
    offset,
    query_positions,
    key_positions,
    scale: float,
    causal: bool,
    *,
    plan=None,
    positions_sorted: bool | None = None,
    _block_m: int | None = None,
    _block_n: int | None = None,
    _variant: int = 0,
    _num_warps=None,
    _num_stages=None,
    _dkdv_block_m: int | None = None,
    _dq_block_n: int | None = None,
    _classify: bool = True,
    _tiles=None,
):
    """Gradients of PLSH attention with respect to query, key and value (Triton).

    Parameters
    ----------
    query, key, value, pitch, offset, query_positions, key_positions, scale, causal
        As :func:`plsh_fast.triton_forward.plsh_forward_triton`.
    out : torch.Tensor
        ``(batch, num_heads, n_q, head_dim_v)`` forward output.
    lse : torch.Tensor
        float32 ``(batch, num_heads, n_q)`` forward LSE (``-inf`` for empty rows).
    grad_out : torch.Tensor
        ``(batch, num_heads, n_q, head_dim_v)`` gradient of the loss with respect to ``out``
        (any strides, same dtype as ``out``).
    plan : plsh_fast.tiling.TilePlan or None
        The forward pass's plan (``plsh_forward_triton(..., return_plan=True)``), reused
        instead of planning again (then the positions are taken as sorted, no check and no
        host synchronisation); ``None`` plans here. Must come from the same positions,
        partition, ``causal`` and default tile sizes.
    positions_sorted : bool or None
        As in :func:`plsh_fast.triton_forward.plsh_forward_triton`.

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
    batch, num_heads, n_q, head_dim = query.shape
    _, num_heads_kv, n_k, _ = key.shape
    head_dim_v = value.shape[3]
    assert key.dtype == query.dtype and value.dtype == query.dtype
    assert grad_out.shape == (batch, num_heads, n_q, head_dim_v)
    assert out.shape == grad_out.shape and lse.shape == (batch, num_heads, n_q)
    assert num_heads % num_heads_kv == 0 and pitch.shape[0] == num_heads
    num_samples = pitch.shape[1]
    kw = dict(
        _block_m=_block_m,
        _block_n=_block_n,
        _variant=_variant,
        _num_warps=_num_warps,
        _num_stages=_num_stages,
        _dkdv_block_m=_dkdv_block_m,
        _dq_block_n=_dq_block_n,
        _classify=_classify,
        _tiles=_tiles,
    )
    if plan is None and not positions_sorted:
        q_order, q_inverse = position_order(query_positions)
        k_order, k_inverse = position_order(key_positions)
        if q_order is not None or k_order is not None:
            # Unsorted positions: the gradients of the forward's sorted rows, put back.
            query, out, lse, grad_out = take_rows(q_order, query, out, lse, grad_out)
            key, value = take_rows(k_order, key, value)
            dq, dk, dv = plsh_backward_triton(
                query,
                key,
                value,
                out,
                lse,
                grad_out,
                pitch,
                offset,
                sort_positions(query_positions, q_order),
                sort_positions(key_positions, k_order),
                scale,
                causal,
                positions_sorted=True,
                **kw,
            )
            return (*take_rows(q_inverse, dq), *take_rows(k_inverse, dk, dv))
    dev = query.device
    dq = torch.zeros_like(query, memory_format=torch.contiguous_format)
    dk = torch.zeros_like(key, memory_format=torch.contiguous_format)
    dv = torch.zeros_like(value, memory_format=torch.contiguous_format)
    if batch == 0 or n_q == 0 or n_k == 0:
        return dq, dk, dv
    tiles = _tiles or tile_config(head_dim, head_dim_v, dev, query.dtype)
    block_m = _block_m or tiles.block_m
    block_n = _block_n or tiles.block_n
    num_stages = _num_stages or tiles.num_stages
    # The dQ kernel may walk the key range in narrower tiles than the plan's (key ranges
    # start at multiples of block_n, hence of any divisor of it).
    dq_block_n = _dq_block_n or (block_n if _block_n else tiles.dq_block_n or block_n)
    assert block_n % dq_block_n == 0
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
    plan_query_range(plan)
    n_q_tiles = triton.cdiv(n_q, block_m)
    n_k_tiles = triton.cdiv(n_k, block_n)
    lse = lse.to(torch.float32).contiguous()
    grad_out = grad_out.to(query.dtype)
    delta = torch.empty((batch, num_heads, n_q), dtype=torch.float32, device=dev)
    (block_d, block_d1), (block_dv, block_dv1) = (
        head_dim_split(head_dim, tiles.halves(forward=False)),
        head_dim_split(head_dim_v, tiles.halves(forward=False)),
    )
    _delta_kernel[(n_q_tiles * batch * num_heads,)](
        out,
        grad_out,
        delta,
        *out.stride(),
        *grad_out.stride(),
        n_q,
        num_heads,
        n_q_tiles,
        DV=head_dim_v,
        BLOCK_M=block_m,
        BLOCK_DV=pow2(head_dim_v),
    )
    interp = type(_bwd_dq_kernel).__name__ == "InterpretedFunction"
    upcast = query.dtype == torch.bfloat16 and interp
    s_block, multi = sample_block(num_samples)
    common = dict(
        D=head_dim,
        DV=head_dim_v,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        BLOCK_DV=block_dv,
        BLOCK_D1=block_d1,
        BLOCK_DV1=block_dv1,
        S_BLOCK=s_block,
        MULTI_CHUNK=multi,
        UPCAST=upcast,
        DOT_PREC=dot_precision(query.dtype, interp or upcast),
        VARIANT=int(_variant),
        CLASSIFY=bool(_classify),
        NUM_STAGES=num_stages,
        CAUSAL=bool(causal),
        num_stages=num_stages,
    )
    scale = float(scale)
    log2_s = math.log2(num_samples)
    _bwd_dq_kernel[(n_q_tiles * batch * num_heads,)](
        query,
        key,
        value,
        grad_out,
        lse,
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
        num_samples,
        n_q_tiles,
        scale,
        scale * LOG2E,
        log2_s,
        num_warps=_num_warps or tiles.dq_num_warps,
        **dict(common, BLOCK_N=dq_block_n),
    )
    # The dK/dV kernel walks the query range in tiles of at most tiles.dkdv_block_m rows (its
    # two float32 accumulators and the key/value tiles stay in registers); query ranges
    # start at multiples of block_m, hence of any divisor of it.
    dkdv_block_m = _dkdv_block_m or (block_m if interp else min(block_m, tiles.dkdv_block_m))
    assert block_m % dkdv_block_m == 0
    _bwd_dkdv_kernel[(n_k_tiles * batch * num_heads_kv,)](
        query,
        key,
        value,
        grad_out,
        lse,
        delta,
        dk,
        dv,
        plan.row_start,
        plan.row_end,
        plan.causal_end,
        plan.query_range,
        *query.stride(),
        *key.stride(),
        *value.stride(),
        *grad_out.stride(),
        *dk.stride(),
        *dv.stride(),
        batch,
        n_q,
        n_k,
        num_heads,
        num_heads_kv,
        num_heads // num_heads_kv,
        num_samples,
        n_q_tiles,
        n_k_tiles,
        scale,
        scale * LOG2E,
        log2_s,
        num_warps=_num_warps or tiles.dkdv_num_warps,
        **dict(common, BLOCK_M=dkdv_block_m),
    )
    return dq, dk, dv
