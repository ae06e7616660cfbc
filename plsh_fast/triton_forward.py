"""Fused Triton forward kernel of PLSH attention (counts-weighted online softmax).

PLSH attention (Wolfson & Wagner 2026, Theorem 2.2; SPEC section 3) is softmax attention
with the additive bias ``log M~_ij = log(C_ij / s)``, where ``C_ij`` counts the samples
whose bins put positions ``p_i`` and ``p_j`` together. One program handles one query tile
of one (batch, head) and makes a single pass over the keys its blocks can reach (planned
by :mod:`plsh_fast.tiling`, about ``BLOCK_M + sigma (ln s + ln ln s)`` keys per tile for
sorted positions), with an online softmax in which key ``j`` is weighted by ``C_ij``:

``out_i = sum_j C_ij exp(c q_i.k_j - m_i) v_j / sum_j C_ij exp(c q_i.k_j - m_i)``,
``lse_i = m_i + log(sum_j C_ij exp(c q_i.k_j - m_i)) - log(s)``,

with ``m_i`` the running maximum of the logits over admissible keys (``C_ij > 0``, and
``p_j <= p_i`` when causal). Since ``C_ij <= s`` the weights never overflow, and no
logarithm of a count is taken. The counts of a tile pair come from
:func:`plsh_fast.tiling.tile_counts` (per-sample classification, element-wise bin
comparison only for samples whose bins split the tile pair).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .ordering import position_order, sort_positions, take_rows
from .tiling import _max_combine, _sum_combine, make_plan, tile_counts

__all__ = ["plsh_forward_triton", "default_blocks"]

LOG2E = 1.4426950408889634


@triton.jit
def _fwd_kernel(
    Q,
    K,
    V,
    Out,
    Lse,
    BinsQ,
    BinsK,
    QLo,
    QHi,
    KLo,
    KHi,
    KeyRange,
    QPos,
    KPos,
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
    n_q,
    n_k,
    num_heads,
    group,
    num_samples,
    n_q_tiles,
    n_k_tiles,
    scale_log2,
    log_s,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    S_CHUNK: tl.constexpr,
    CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PREC: tl.constexpr,
    VARIANT: tl.constexpr,
    CLASSIFY: tl.constexpr,
    UNROLL: tl.constexpr,
):
    pid = tl.program_id(0)
    m_tile = pid % n_q_tiles
    bh = pid // n_q_tiles
    b = bh // num_heads
    h = bh % num_heads
    hk = h // group
    b64 = b.to(tl.int64)

    offs_m = m_tile.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    m_valid = offs_m < n_q
    d_valid = offs_d < D
    dv_valid = offs_dv < DV

    q = tl.load(
        Q + b64 * sqb + h.to(tl.int64) * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
        mask=m_valid[:, None] & d_valid[None, :],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)
    qpos = tl.load(QPos + offs_m, mask=m_valid, other=0)

    k_base = K + b64 * skb + hk.to(tl.int64) * skh
    v_base = V + b64 * svb + hk.to(tl.int64) * svh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    rng = KeyRange + (h.to(tl.int64) * n_q_tiles + m_tile) * 2
    key_start = tl.load(rng)
    key_end = tl.load(rng + 1)
    for start_n in range(key_start, key_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N).to(tl.int64)
        n_valid = offs_n < n_k
        counts, n_touch = tile_counts(
            BinsQ,
            BinsK,
            QLo,
            QHi,
            KLo,
            KHi,
            h,
            m_tile,
            start_n // BLOCK_N,
            offs_m,
            offs_n,
            m_valid,
            n_valid,
            n_q,
            n_k,
            num_samples,
            n_q_tiles,
            n_k_tiles,
            BLOCK_M,
            BLOCK_N,
            S_CHUNK,
            CLASSIFY,
            UNROLL,
        )
        if n_touch > 0:
            admissible = (counts > 0) & n_valid[None, :]
            if CAUSAL:
                kpos = tl.load(KPos + offs_n, mask=n_valid, other=0)
                admissible = admissible & (kpos[None, :] <= qpos[:, None])
            if VARIANT == 0:
                weight = counts.to(tl.float32)
            elif VARIANT == 1:  # negative control: bias -log C instead of +log C
                weight = 1.0 / tl.maximum(counts, 1).to(tl.float32)
            else:  # negative control: counts ignored (block mask only)
                weight = tl.full([BLOCK_M, BLOCK_N], 1.0, dtype=tl.float32)
            k = tl.load(
                k_base + offs_n[None, :] * skn + offs_d[:, None] * skd,
                mask=n_valid[None, :] & d_valid[:, None],
                other=0.0,
            )
            if UPCAST:
                k = k.to(tl.float32)
            logits = tl.dot(q, k, input_precision=DOT_PREC) * scale_log2
            logits = tl.where(admissible, logits, float("-inf"))
            m_new = tl.maximum(m_i, tl.reduce(logits, 1, _max_combine))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.where(admissible, tl.exp2(logits - m_use[:, None]) * weight, 0.0)
            alpha = tl.exp2(m_i - m_use)
            l_i = l_i * alpha + tl.reduce(p, 1, _sum_combine)
            v = tl.load(
                v_base + offs_n[:, None] * svn + offs_dv[None, :] * svd,
                mask=n_valid[:, None] & dv_valid[None, :],
                other=0.0,
            )
            if UPCAST:
                v = v.to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
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
    tl.store(Lse + (b64 * num_heads + h) * n_q + offs_m, lse, mask=m_valid)


def _pow2(x: int, minimum: int = 16) -> int:
    return max(minimum, triton.next_power_of_2(max(int(x), 1)))


def default_blocks(
    head_dim: int, head_dim_v: int, device: torch.device, dtype: torch.dtype = torch.bfloat16
) -> tuple[int, int, int]:
    """``(BLOCK_M, BLOCK_N, num_warps)`` for a head size (untuned heuristic; GPU-measured later).

    Small query tiles keep the planned key range ``BLOCK_M + window`` tight (the PLSH window
    is short for small sigma); wide heads use narrower key tiles to bound registers.
    """
    if device.type != "cuda":
        return 16, 16, 4
    widest = max(head_dim, head_dim_v)
    if widest <= 64:
        return 64, 64, 4
    if widest <= 128:
        return 64, 64, 4
    if dtype == torch.float32:  # float32 tiles of width 256: stay inside shared memory
        return 32, 32, 8
    return 64, 32, 8


def _unroll_for(unroll: int, num_samples: int) -> int:
    """Sample-group size of :func:`plsh_fast.tiling.tile_counts` (0: one mixed sample at a time)."""
    if unroll <= 0:
        return 0
    return min(triton.next_power_of_2(unroll), min(32, _pow2(num_samples, minimum=2)))


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
    _block_m: int | None = None,
    _block_n: int | None = None,
    _variant: int = 0,
    _num_warps=None,
    _classify: bool = True,
    _unroll: int = 0,
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

    Returns
    -------
    (out, lse) : tuple of torch.Tensor
        ``out`` ``(batch, num_heads, n_q, head_dim_v)`` in the query dtype (contiguous);
        ``lse`` float32 ``(batch, num_heads, n_q)``, ``log sum_j A_ij M~_ij`` (natural log).
        A row with no admissible key has ``out = 0`` and ``lse = -inf``.

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
    q_order, q_inverse = position_order(query_positions)
    k_order, _ = position_order(key_positions)
    if q_order is not None or k_order is not None:
        # Unsorted positions: run on rows sorted by position, where every query tile has
        # a bounded key range (plsh_fast.ordering), and put the rows back.
        (query,) = take_rows(q_order, query)
        key, value = take_rows(k_order, key, value)
        out, lse = plsh_forward_triton(
            query,
            key,
            value,
            pitch,
            offset,
            sort_positions(query_positions, q_order),
            sort_positions(key_positions, k_order),
            scale,
            causal,
            _block_m=_block_m,
            _block_n=_block_n,
            _variant=_variant,
            _num_warps=_num_warps,
            _classify=_classify,
            _unroll=_unroll,
        )
        return take_rows(q_inverse, out, lse)
    dev = query.device
    out = torch.zeros((batch, num_heads, n_q, head_dim_v), dtype=query.dtype, device=dev)
    lse = torch.full((batch, num_heads, n_q), float("-inf"), dtype=torch.float32, device=dev)
    if batch == 0 or n_q == 0 or n_k == 0:
        return out, lse
    block_m, block_n, num_warps = default_blocks(head_dim, head_dim_v, dev, query.dtype)
    block_m = _block_m or block_m
    block_n = _block_n or block_n
    num_warps = _num_warps or num_warps
    plan = make_plan(
        query_positions,
        key_positions,
        pitch,
        offset,
        causal=causal,
        block_m=block_m,
        block_n=block_n,
    )
    n_q_tiles = triton.cdiv(n_q, block_m)
    n_k_tiles = triton.cdiv(n_k, block_n)
    interp = _interpreting()
    upcast = query.dtype == torch.bfloat16 and interp
    prec = "ieee" if (query.dtype == torch.float32 or upcast) else "tf32"
    grid = (n_q_tiles * batch * num_heads,)
    assert grid[0] < 2**31
    _fwd_kernel[grid](
        query,
        key,
        value,
        out,
        lse,
        plan.bins_q,
        plan.bins_k,
        plan.qlo,
        plan.qhi,
        plan.klo,
        plan.khi,
        plan.key_range,
        query_positions.contiguous(),
        key_positions.contiguous(),
        *query.stride(),
        *key.stride(),
        *value.stride(),
        *out.stride(),
        n_q,
        n_k,
        num_heads,
        num_heads // num_heads_kv,
        num_samples,
        n_q_tiles,
        n_k_tiles,
        float(scale) * LOG2E,
        math.log(num_samples),
        D=head_dim,
        DV=head_dim_v,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=_pow2(head_dim),
        BLOCK_DV=_pow2(head_dim_v),
        S_CHUNK=min(32, _pow2(num_samples, minimum=2)),
        CAUSAL=bool(causal),
        UPCAST=upcast,
        DOT_PREC=prec,
        VARIANT=int(_variant),
        CLASSIFY=bool(_classify),
        UNROLL=_unroll_for(_unroll, num_samples),
        num_warps=num_warps,
    )
    return out, lse
