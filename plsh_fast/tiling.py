"""Bins and tile planning shared by the Triton forward and backward kernels.

The Triton kernels never divide in float32 and never compare bins element by element.
The bins ``floor((float64(p) - offset) / pitch)`` (SPEC section 2) are computed once per
call by a small Triton kernel in binary64 (Triton's float64 ``/`` is LLVM ``fdiv double``,
which NVPTX lowers to the correctly rounded ``div.rn.f64``; the interpreter uses numpy's
float64 division), so they are bit-identical to :func:`plsh_ref.partition.bins`
(:func:`compute_bins` is the test entry point). From them the plan derives, on the device
and without a host synchronisation, the **interval form** of the counts:

* with key positions sorted (the kernels' entry points sort rows by position,
  :mod:`plsh_fast.ordering`), the keys that share query ``i``'s bin of sample ``t`` are one
  contiguous index range ``[a_t(i), b_t(i))`` (a bin is a non-decreasing function of the
  position): ``a_t(i)`` / ``b_t(i)`` is the number of keys whose bin is ``<`` / ``<=``
  the query's bin (``torch.searchsorted`` on the exact integer bins, so the ranges are
  exact). Causal attention caps ``b_t(i)`` at the number of keys ``p_j <= p_i``. Hence

  ``C_ij = sum_t [a_t(i) <= j < b_t(i)]``

  (interval form: ``[L_t(i) <= p_j <= R_t(i)]`` with ``L_t, R_t`` the integer ends of the
  bin, read on the sorted key index), which a kernel evaluates from two int32 per row and
  sample (``row_start`` ``a_t(i)`` and ``row_width`` ``b_t(i) - a_t(i)``, both
  ``(num_heads, num_samples, n_q)``) with one subtraction and one comparison per element
  and sample, directly in the layout of the attention tile (:func:`tile_counts`), and only
  for the samples whose bins split the tile pair: per (query tile, key tile) a sample is
  *full* (every pair collides: count +1, no comparison), *disjoint* or *mixed*, decided
  from the ranges of the tile's first and last rows;
* per (head, query tile), the key range ``[start, end)`` the tile can reach: the hull of its
  rows' ranges, ``start`` rounded down to a multiple of ``BLOCK_N`` (causal tile skipping is
  part of it, since the ranges are capped); per (head, key tile), the query range used by
  the key/value-gradient kernel (:func:`plan_query_range`, backward only);
* the order in which the kernels take the heads: most planned key tiles first (the heads
  with the largest sigma), so that the longest programs start first.

Memory: ``num_heads * num_samples * (n_q + n_k)`` int64 bins (freed after planning) and
``2 * num_heads * num_samples * n_q`` int32 ranges, kept for the backward pass.

Source: SPEC sections 2-3; ``proofs_notes`` on the fused counts pass (the window
``~ 2 sigma (ln s + 0.58)`` keys per query).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

__all__ = [
    "TilePlan",
    "compute_bins",
    "make_plan",
    "plan_query_range",
    "sample_block",
    "tile_counts",
    "tile_counts_all",
    "max_combine",
    "sum_combine",
]

#: Largest sample block handled by one unrolled pass of :func:`tile_counts`.
MAX_SAMPLE_BLOCK = 64


# Reductions through ``tl.reduce`` with Triton's own combine functions: the same code as
# ``tl.sum``/``tl.max`` once compiled, but in the interpreter it skips the per-call
# re-patching of a nested ``@triton.jit`` wrapper (about 4 ms per call on CPU).
@triton.jit
def _sum_fallback(a, b):
    return a + b


@triton.jit
def _max_fallback(a, b):
    return tl.maximum(a, b)


sum_combine = getattr(tl.standard, "_sum_combine", _sum_fallback)
max_combine = getattr(tl.standard, "_elementwise_max", _max_fallback)


@triton.jit
def _bins_kernel(
    Pos, Pitch, Offset, Bins, n, num_samples, BLOCK: tl.constexpr, S_CHUNK: tl.constexpr
):
    # grid: (n_tiles, num_heads); program = one tile of positions, all samples of one head.
    # bin(p) = floor((float64(p) - offset) / pitch) in binary64 (SPEC section 2): Triton's
    # float64 "/" is LLVM fdiv double, lowered to the correctly rounded div.rn.f64 on
    # NVIDIA; the interpreter uses numpy's float64 division.
    tile = tl.program_id(0)
    h = tl.program_id(1)
    offs = tile.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < n
    p = tl.load(Pos + offs, mask=valid, other=0)
    lane = tl.arange(0, S_CHUNK)
    for c0 in range(0, num_samples, S_CHUNK):
        t_valid = (c0 + lane) < num_samples
        hs = h.to(tl.int64) * num_samples + c0 + lane
        pitch = tl.load(Pitch + hs, mask=t_valid, other=1.0)
        offset = tl.load(Offset + hs, mask=t_valid, other=0.0)
        b = tl.floor((p[None, :].to(tl.float64) - offset[:, None]) / pitch[:, None]).to(tl.int64)
        tl.store(Bins + hs[:, None] * n + offs[None, :], b, mask=t_valid[:, None] & valid[None, :])


def compute_bins(
    pitch: torch.Tensor, offset: torch.Tensor, positions: torch.Tensor, *, block: int = 64
) -> torch.Tensor:
    """The bins computed by the Triton float64 bins kernel, ``(num_heads, num_samples, n)``.

    Bit-identical to :func:`plsh_ref.partition.bins` (SPEC section 2); the planning pass
    of the kernels uses exactly these values.

    Parameters
    ----------
    pitch, offset : torch.Tensor
        float64 ``(num_heads, num_samples)``.
    positions : torch.Tensor
        int64 ``(n,)``, ``|p| < 2**53``, on the same device.
    block : int
        Tile size of the bins kernel (power of two).

    Returns
    -------
    torch.Tensor
        int64 ``(num_heads, num_samples, n)``.
    """
    assert pitch.dtype == torch.float64 and offset.dtype == torch.float64
    assert positions.dtype == torch.int64 and positions.dim() == 1
    num_heads, num_samples = pitch.shape
    n = positions.shape[0]
    out = torch.empty((num_heads, num_samples, n), dtype=torch.int64, device=positions.device)
    if n > 0 and num_heads > 0:
        _bins_kernel[(triton.cdiv(n, block), num_heads)](
            positions.contiguous(),
            pitch.contiguous(),
            offset.contiguous(),
            out,
            n,
            num_samples,
            BLOCK=block,
            S_CHUNK=min(16, triton.next_power_of_2(num_samples)),
        )
    return out


@dataclass
class TilePlan:
    """Everything the Triton kernels need besides query/key/value (rows sorted by position).

    Attributes
    ----------
    row_start, row_end, row_width : torch.Tensor
        int32 ``(num_heads, num_samples, n_q)``: keys ``[row_start, row_end)`` share query
        ``i``'s bin of sample ``t`` (capped causally), so ``C_ij`` is the number of samples
        with ``row_start <= j < row_end``; ``row_width = max(row_end - row_start, 0)``.
    key_range : torch.Tensor
        int32 ``(num_heads, n_q_tiles, 2)``: ``[start, end)`` keys of each query tile,
        ``start`` a multiple of ``block_n`` (``start >= end`` means no key).
    causal_end : torch.Tensor
        int32 ``(n_q,)``: number of keys ``p_j <= p_i`` (``n_k`` when not causal).
    head_order : torch.Tensor
        int32 ``(num_heads,)``: heads by decreasing planned work (launch order).
    query_range : torch.Tensor or None
        int32 ``(num_heads, n_k_tiles, 2)``, the queries that reach each key tile
        (``start`` a multiple of ``block_m``); filled by :func:`plan_query_range`.
    block_m, block_n, causal, n_k : int, int, bool, int
        What the plan was made for.
    """

    row_start: torch.Tensor
    row_end: torch.Tensor
    row_width: torch.Tensor
    key_range: torch.Tensor
    causal_end: torch.Tensor
    head_order: torch.Tensor
    query_range: torch.Tensor | None
    block_m: int
    block_n: int
    causal: bool
    n_k: int


def _floor_to(x, align):
    return torch.div(x, align, rounding_mode="floor") * align


def _ranges(start, end, align):
    """``[start, end)`` int32 pairs, ``start`` aligned down; empty ranges as ``(0, 0)``."""
    start = _floor_to(start, align)
    empty = start >= end
    start = torch.where(empty, 0, start)
    end = torch.where(empty, 0, end)
    return torch.stack([start, end], dim=-1).to(torch.int32).contiguous()


def make_plan(
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    pitch: torch.Tensor,
    offset: torch.Tensor,
    *,
    causal: bool,
    block_m: int,
    block_n: int,
    query_range: bool = False,
) -> TilePlan:
    """Interval-form counts, tile extents and key (and query) ranges for the Triton kernels.

    No host synchronisation: every step is a device operation.

    Parameters
    ----------
    query_positions, key_positions : torch.Tensor
        int64 ``(n_q,)``, ``(n_k,)`` on the kernels' device, ``n_q, n_k >= 1``, both
        **non-decreasing** (precondition, not checked: the kernels' entry points sort).
    pitch, offset : torch.Tensor
        float64 ``(num_heads, num_samples)`` on the same device.
    causal : bool
        Cap each row's ranges at the keys ``p_j <= p_i``.
    block_m, block_n : int
        Query and key tile sizes of the kernels that will use the plan.
    query_range : bool
        Also plan the query range of every key tile (backward, key/value gradients).

    Returns
    -------
    TilePlan
    """
    qpos = query_positions.contiguous()
    kpos = key_positions.contiguous()
    n_q, n_k = qpos.shape[0], kpos.shape[0]
    assert n_q >= 1 and n_k >= 1
    assert n_q < 2**31 - 2 * max(block_m, block_n) and n_k < 2**31 - 2 * max(block_m, block_n)
    assert qpos.dtype == torch.int64 and kpos.dtype == torch.int64
    num_heads, num_samples = pitch.shape
    dev = qpos.device
    bins_q = compute_bins(pitch, offset, qpos)
    same = qpos.data_ptr() == kpos.data_ptr() and n_q == n_k
    bins_k = bins_q if same else compute_bins(pitch, offset, kpos)
    flat_k = bins_k.reshape(num_heads * num_samples, n_k)
    flat_q = bins_q.reshape(num_heads * num_samples, n_q)
    row_start = torch.searchsorted(flat_k, flat_q, side="left", out_int32=True)
    row_end = torch.searchsorted(flat_k, flat_q, side="right", out_int32=True)
    del bins_q, bins_k, flat_k, flat_q
    if causal:
        causal_end = torch.searchsorted(kpos, qpos, side="right", out_int32=True)
        row_end = torch.minimum(row_end, causal_end[None, :])
    else:
        causal_end = torch.full((n_q,), n_k, dtype=torch.int32, device=dev)
    row_start = row_start.reshape(num_heads, num_samples, n_q).contiguous()
    row_end = row_end.reshape(num_heads, num_samples, n_q).contiguous()
    first = torch.arange(0, n_q, block_m, device=dev)
    last = torch.clamp(first + block_m, max=n_q) - 1
    ext = torch.stack(
        [row_start[..., first], row_start[..., last], row_end[..., first], row_end[..., last]],
        dim=2,
    )  # (H, s, 4, n_q_tiles)
    start = ext[:, :, 0, :].amin(dim=1).to(torch.int64)  # (H, n_q_tiles)
    end = ext[:, :, 3, :].amax(dim=1).to(torch.int64)
    key_range = _ranges(start, end, block_n)
    width = (key_range[..., 1] - key_range[..., 0]).to(torch.int64).sum(dim=1)
    head_order = torch.sort(width, descending=True, stable=True).indices.to(torch.int32)
    plan = TilePlan(
        row_start,
        row_end,
        torch.clamp(row_end - row_start, min=0),
        key_range,
        causal_end,
        head_order,
        None,
        block_m,
        block_n,
        bool(causal),
        n_k,
    )
    if query_range:
        plan_query_range(plan)
    return plan


def plan_query_range(plan: TilePlan) -> TilePlan:
    """Fill ``plan.query_range``: per (head, key tile) the hull of the queries reaching it.

    Sample ``t`` reaches key tile ``[n0, n0 + block_n)`` from the rows with
    ``row_end > n0`` (a suffix, since ranges are non-decreasing) and ``row_start <
    n0 + block_n`` (a prefix); the query range is the hull of these intervals over ``t``.
    Device operations only. Returns ``plan`` (modified in place).
    """
    if plan.query_range is not None:
        return plan
    num_heads, num_samples, n_q = plan.row_start.shape
    dev = plan.row_start.device
    n0 = torch.arange(0, plan.n_k, plan.block_n, device=dev, dtype=torch.int32)
    n_k_tiles = n0.shape[0]
    rs = plan.row_start.reshape(num_heads * num_samples, n_q)
    re = plan.row_end.reshape(num_heads * num_samples, n_q)
    lo = torch.searchsorted(re, n0.expand(rs.shape[0], n_k_tiles).contiguous(), side="right")
    hi = torch.searchsorted(
        rs, (n0 + plan.block_n).expand(rs.shape[0], n_k_tiles).contiguous(), side="left"
    )
    nonempty = lo < hi
    big = torch.iinfo(torch.int64).max
    lo = torch.where(nonempty, lo, big).reshape(num_heads, num_samples, n_k_tiles).amin(dim=1)
    hi = torch.where(nonempty, hi, 0).reshape(num_heads, num_samples, n_k_tiles).amax(dim=1)
    plan.query_range = _ranges(lo, hi, plan.block_m)
    return plan


def sample_block(num_samples: int) -> tuple[int, bool]:
    """``(S_BLOCK, MULTI_CHUNK)`` for :func:`tile_counts`: samples per unrolled pass (a power
    of two, at most ``MAX_SAMPLE_BLOCK``) and whether several passes are needed."""
    block = min(MAX_SAMPLE_BLOCK, max(2, triton.next_power_of_2(int(num_samples))))
    return block, num_samples > block


@triton.jit
def tile_counts(
    RowStart,
    RowWidth,
    h,
    c0,
    n0,
    offs_m,
    m_valid,
    m_first,
    m_last,
    n_q,
    num_samples,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    S_BLOCK: tl.constexpr,
    TRANSPOSED: tl.constexpr = False,
    CLASSIFY: tl.constexpr = True,
    like=None,
    EVENTS: tl.constexpr = False,
    CAUSAL: tl.constexpr = False,
):
    """Counts ``C_ij = sum_t [a_t(i) <= j < a_t(i) + w_t(i)]`` of samples ``c0 ..
    c0 + S_BLOCK - 1`` for one (query tile, key tile ``[n0, n0 + BLOCK_N)``) pair, int32
    ``(BLOCK_M, BLOCK_N)`` (``TRANSPOSED``: ``(BLOCK_N, BLOCK_M)``, keys along the rows, for
    the key/value-gradient kernel).

    Two exact forms of the same integers: the interval form (default; one unsigned
    comparison per element and mixed sample, :func:`_interval_counts`) and the event form
    (``EVENTS=True``, :func:`_event_counts`, about a third of the interval form's SASS
    instructions per mixed sample; ``CAUSAL`` must then say whether the plan was capped
    causally). The kernels use the interval form; the event form is opt-in, for the forward
    only (``plsh_forward_triton(..., _events=True)``), because with it some shipped
    configurations spill registers (forward bf16 at head_dim 96 and at s = 64, float32 at
    head_dim 96; the dQ kernel at bf16/float32 head_dim 128; Triton 3.9 and 3.6:
    ``benchmarks/results/counts_sass_2026-12-01.md``).

    ``CLASSIFY``: per tile pair, samples (or events) that are constant over the pair (from
    the ranges of the tile's first and last valid rows ``m_first``, ``m_last``; ranges are
    non-decreasing in the row) cost one integer, only the others ("mixed") are evaluated
    per element; ``CLASSIFY=False`` evaluates all of them (exactness test). The sample loop
    is static (unrolled, one uniform branch per mixed sample, no data-dependent loop), so
    the caller's key loop stays software-pipelined. ``like``: a tensor of the counts tile's
    shape in the layout the caller uses the counts in (its logits tile, the MMA layout); the
    counts start from ``(like >> 16) >> 16``, a zero that LLVM folds away but Triton's
    layout passes do not, so the counts are built in that layout (without it Triton 3.6
    builds them in a blocked layout with 32 rows per thread, loads the two row ends once per
    element and converts the tile through shared memory every step). Rows with ``m_valid``
    false get some count in ``[0, s]`` (callers mask them); samples past ``num_samples``
    count nothing.
    """
    if EVENTS:
        counts = _event_counts(
            RowStart, RowWidth, h, c0, n0, offs_m, m_valid, m_first, m_last, n_q,
            num_samples, BLOCK_M, BLOCK_N, S_BLOCK, TRANSPOSED, CLASSIFY, like, CAUSAL,
        )  # fmt: skip
    else:
        counts = _interval_counts(
            RowStart, RowWidth, h, c0, n0, offs_m, m_valid, m_first, m_last, n_q,
            num_samples, BLOCK_M, BLOCK_N, S_BLOCK, TRANSPOSED, CLASSIFY, like,
        )  # fmt: skip
    return counts


@triton.jit
def _interval_counts(
    RowStart,
    RowWidth,
    h,
    c0,
    n0,
    offs_m,
    m_valid,
    m_first,
    m_last,
    n_q,
    num_samples,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    S_BLOCK: tl.constexpr,
    TRANSPOSED: tl.constexpr,
    CLASSIFY: tl.constexpr,
    like,
):
    """The counts of :func:`tile_counts` in interval form (``EVENTS=False``).

    Per mixed sample: two int32 loads per row and, per element, one subtraction and one
    unsigned comparison (``(j - a) mod 2**32 < w`` is ``a <= j < a + w`` for ``0 <= w <
    2**31``).
    """
    cols = n0 + tl.arange(0, BLOCK_N)  # int32 key indices
    n_q64 = n_q.to(tl.int64)
    # ``n0 >> 31`` is 0 (n0 >= 0) but not provably so: it keeps the row loads inside the
    # caller's key loop (L1 hits) instead of hoisting 2 * S_BLOCK row vectors, broadcast
    # to tiles, into registers for the whole loop (register spills).
    row = (h.to(tl.int64) * num_samples + c0) * n_q64 + offs_m + (n0 >> 31)
    if CLASSIFY:
        # Ranges are non-decreasing in the row: the tile's first and last valid rows decide
        # which samples cover the whole tile pair (full), miss it (disjoint) or split it.
        lane = tl.arange(0, S_BLOCK)
        lane_valid = (c0 + lane) < num_samples
        srow = (h.to(tl.int64) * num_samples + c0 + lane) * n_q64
        a_first = tl.load(RowStart + srow + m_first, mask=lane_valid, other=2**30)
        b_first = a_first + tl.load(RowWidth + srow + m_first, mask=lane_valid, other=0)
        a_last = tl.load(RowStart + srow + m_last, mask=lane_valid, other=2**30)
        b_last = a_last + tl.load(RowWidth + srow + m_last, mask=lane_valid, other=0)
        full = (a_last <= n0) & (b_first >= n0 + BLOCK_N)
        touch = (b_last > n0) & (a_first < n0 + BLOCK_N)
        mixed = touch & (~full)
        n_full = tl.reduce(full.to(tl.int32), 0, sum_combine)
        bits = tl.reduce(
            tl.where(mixed, tl.full([S_BLOCK], 1, tl.int64) << lane.to(tl.int64), 0),
            0,
            sum_combine,
        )
    else:
        n_full = 0
    if like is not None:
        zero = (like.to(tl.uint32, bitcast=True) >> 16) >> 16
        counts = zero.to(tl.int32, bitcast=True) + n_full
    elif TRANSPOSED:
        counts = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.int32) + n_full
    else:
        counts = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32) + n_full
    for t in tl.static_range(S_BLOCK):
        if CLASSIFY:
            on = ((bits >> t) & 1) != 0
        else:
            on = True
        if on:
            valid = m_valid & (tl.full([BLOCK_M], c0 + t, tl.int32) < num_samples)
            a = tl.load(RowStart + row + t * n_q64, mask=valid, other=0)
            w = tl.load(RowWidth + row + t * n_q64, mask=valid, other=0)
            if TRANSPOSED:
                d = (cols[:, None] - a[None, :]).to(tl.uint32, bitcast=True)
                counts += (d < w.to(tl.uint32, bitcast=True)[None, :]).to(tl.int32)
            else:
                d = (cols[None, :] - a[:, None]).to(tl.uint32, bitcast=True)
                counts += (d < w.to(tl.uint32, bitcast=True)[:, None]).to(tl.int32)
    return counts


@triton.jit
def _event_counts(
    RowStart,
    RowWidth,
    h,
    c0,
    n0,
    offs_m,
    m_valid,
    m_first,
    m_last,
    n_q,
    num_samples,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    S_BLOCK: tl.constexpr,
    TRANSPOSED: tl.constexpr,
    CLASSIFY: tl.constexpr,
    like,
    CAUSAL: tl.constexpr,
):
    """The counts of :func:`tile_counts` as one-sided events (``EVENTS=True``).

    ``[a <= j < b] = [j >= a] - [j >= b]`` with ``b = a + w`` (``w >= 0``). An event is
    decided for the whole tile pair from the ends of the tile's first and last valid rows
    (``[j >= a]`` is 1 everywhere if ``a(m_last) <= n0`` and 0 everywhere if ``a(m_first)
    >= n0 + BLOCK_N``; the constant ones are one integer added to the tile) and evaluated
    per element only otherwise ("mixed"; ``CLASSIFY=False``: every event). ``CAUSAL``
    (ranges capped causally): every sample ends at the row's causal end ``b_0(i) = #{j :
    p_j <= p_i}`` (bins are non-decreasing in the position, so the uncapped end is never
    smaller), hence ``C_ij = [j < b_0(i)] sum_t [j >= a_t(i)]``: no end events, one mask
    where the causal end splits the tile pair.

    Per mixed event the tile ``(BLOCK_M, BLOCK_N)`` packs two adjacent columns into one
    int32 (16-bit lanes): ``lane = BLOCK_N + c - a'`` with ``a' = clamp(a - n0, 0,
    BLOCK_N)`` and ``c`` the column in the tile lies in ``[0, 2 BLOCK_N)``, so its bit of
    value ``BLOCK_N`` is ``[c >= a']`` and no lane borrows from the other: one subtraction,
    one mask and one add per column pair (an end event: ``lane = BLOCK_N - 1 + b' - c``,
    bit ``[c < b']``, its ``-1`` in the constant). A lane accumulates at most ``2 S_BLOCK
    BLOCK_N < 2**16``; the constant is added modulo ``2**32`` (the final lanes are the
    counts times ``BLOCK_N``, in ``[0, 2**16)``). The transposed tile uses sign bits,
    ``[j >= a] = ((a - 1 - j) mod 2**32) >> 31`` (exact: indices are below ``2**31``), one
    subtraction and one shift-add per element. The loads' mask keeps the redundant sample
    bound ``c0 + t < num_samples`` (without it the float32 forward at head_dim 128 spills
    under Triton 3.9: found by compiling, the cause is not established).
    """
    cols = n0 + tl.arange(0, BLOCK_N)  # int32 key indices
    n_q64 = n_q.to(tl.int64)
    hi = n0 + BLOCK_N
    # ``n0 >> 31`` is 0 (n0 >= 0) but not provably so: it keeps the row loads inside the
    # caller's key loop (L1 hits) instead of hoisting 2 * S_BLOCK row vectors, broadcast
    # to tiles, into registers for the whole loop (register spills).
    row = (h.to(tl.int64) * num_samples + c0) * n_q64 + offs_m + (n0 >> 31)
    lane = tl.arange(0, S_BLOCK)
    lane_valid = (c0 + lane) < num_samples
    srow = (h.to(tl.int64) * num_samples + c0 + lane) * n_q64
    a_first = tl.load(RowStart + srow + m_first, mask=lane_valid, other=2**30)
    b_first = a_first + tl.load(RowWidth + srow + m_first, mask=lane_valid, other=0)
    a_last = tl.load(RowStart + srow + m_last, mask=lane_valid, other=2**30)
    b_last = a_last + tl.load(RowWidth + srow + m_last, mask=lane_valid, other=0)
    if CLASSIFY:
        a_full = a_last <= n0
        a_mixed = (a_last > n0) & (a_first < hi)
        b_full = b_last <= n0
        b_mixed = (b_last > n0) & (b_first < hi)
    else:
        a_full = lane < 0
        a_mixed = lane_valid
        b_full = lane < 0
        b_mixed = lane_valid
    bit = tl.full([S_BLOCK], 1, tl.int64) << lane.to(tl.int64)
    a_bits = tl.reduce(tl.where(a_mixed, bit, 0), 0, sum_combine)
    n_const = tl.reduce(a_full.to(tl.int32), 0, sum_combine)
    if CAUSAL:
        ce_first = tl.reduce(tl.where(lane == 0, b_first, 0), 0, sum_combine)
        ce_last = tl.reduce(tl.where(lane == 0, b_last, 0), 0, sum_combine)
        b_bits = 0
        dead = ce_last <= n0  # every key of the tile is past every row's causal end
        a_bits = tl.where(dead, 0, a_bits)
        n_const = tl.where(dead, 0, n_const)
    else:
        b_bits = tl.reduce(tl.where(b_mixed, bit, 0), 0, sum_combine)
        n_const -= tl.reduce((b_full | b_mixed).to(tl.int32), 0, sum_combine)
    if TRANSPOSED:
        if like is not None:
            zero = (like.to(tl.uint32, bitcast=True) >> 16) >> 16
            counts = zero.to(tl.int32, bitcast=True) + n_const
        else:
            counts = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.int32) + n_const
        for t in tl.static_range(S_BLOCK):
            if ((a_bits >> t) & 1) != 0:  # [j >= a]
                valid = m_valid & (tl.full([BLOCK_M], c0 + t, tl.int32) < num_samples)
                a1 = tl.load(RowStart + row + t * n_q64, mask=valid, other=0) - 1
                d = (a1[None, :] - cols[:, None]).to(tl.uint32, bitcast=True)
                counts += (d >> 31).to(tl.int32, bitcast=True)
            if not CAUSAL:
                if ((b_bits >> t) & 1) != 0:  # -[j >= b] (its -1 is in n_const)
                    valid = m_valid & (tl.full([BLOCK_M], c0 + t, tl.int32) < num_samples)
                    b = tl.load(RowStart + row + t * n_q64, mask=valid, other=0)
                    b += tl.load(RowWidth + row + t * n_q64, mask=valid, other=0)
                    d = (cols[:, None] - b[None, :]).to(tl.uint32, bitcast=True)
                    counts += (d >> 31).to(tl.int32, bitcast=True)
    else:
        # Two adjacent columns per int32 (16-bit lanes): lane = BLOCK_N + c - a' with
        # a' = clamp(a - n0, 0, BLOCK_N), c the column in the tile; its bit of value
        # BLOCK_N is [c >= a'] and no lane borrows from the other.
        tl.static_assert(2 * S_BLOCK * BLOCK_N < 65536, "16-bit lanes would overflow")
        HALF: tl.constexpr = BLOCK_N // 2
        ONE2: tl.constexpr = BLOCK_N * 65537
        if like is not None:
            lo_t, hi_t = tl.split(like.reshape(BLOCK_M, HALF, 2))
            w2 = (lo_t.to(tl.uint32, bitcast=True) >> 16) >> 16
        else:
            w2 = tl.zeros([BLOCK_M, HALF], dtype=tl.uint32)
        w2 += (n_const * ONE2).to(tl.uint32, bitcast=True)
        k2 = 2 * tl.arange(0, HALF)
        x_a = ((BLOCK_N + k2) | ((BLOCK_N + 1 + k2) << 16)).to(tl.uint32, bitcast=True)
        x_b = (k2 | ((k2 + 1) << 16)).to(tl.uint32, bitcast=True)
        for t in tl.static_range(S_BLOCK):
            if ((a_bits >> t) & 1) != 0:  # [j >= a]
                valid = m_valid & (tl.full([BLOCK_M], c0 + t, tl.int32) < num_samples)
                a = tl.load(RowStart + row + t * n_q64, mask=valid, other=0) - n0
                y = (tl.minimum(tl.maximum(a, 0), BLOCK_N) * 65537).to(tl.uint32, bitcast=True)
                w2 += (x_a[None, :] - y[:, None]) & ONE2
            if not CAUSAL:
                if ((b_bits >> t) & 1) != 0:  # -[j >= b] (its -1 is in n_const)
                    valid = m_valid & (tl.full([BLOCK_M], c0 + t, tl.int32) < num_samples)
                    b = tl.load(RowStart + row + t * n_q64, mask=valid, other=0) - n0
                    b += tl.load(RowWidth + row + t * n_q64, mask=valid, other=0)
                    y = ((tl.minimum(tl.maximum(b, 0), BLOCK_N) + BLOCK_N - 1) * 65537).to(
                        tl.uint32, bitcast=True
                    )
                    w2 += (y[:, None] - x_b[None, :]) & ONE2
        lo = ((w2 & 65535) // BLOCK_N).to(tl.int32, bitcast=True)
        hi2 = (w2 // (BLOCK_N * 65536)).to(tl.int32, bitcast=True)
        counts = tl.join(lo, hi2).reshape(BLOCK_M, BLOCK_N)
    if CAUSAL:
        if ce_first < hi:  # the causal end splits the tile pair
            ce = tl.load(RowStart + row, mask=m_valid, other=0)
            ce += tl.load(RowWidth + row, mask=m_valid, other=0)
            if TRANSPOSED:
                counts = tl.where(cols[:, None] < ce[None, :], counts, 0)
            else:
                counts = tl.where(cols[None, :] < ce[:, None], counts, 0)
    return counts


@triton.jit
def tile_counts_all(
    RowStart, RowWidth, h, n0, offs_m, m_valid, m_first, m_last, n_q, num_samples,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, S_BLOCK: tl.constexpr,
    MULTI_CHUNK: tl.constexpr, TRANSPOSED: tl.constexpr, CLASSIFY: tl.constexpr, like=None,
    EVENTS: tl.constexpr = False, CAUSAL: tl.constexpr = False,
):  # fmt: skip
    """:func:`tile_counts` over all ``num_samples`` samples: one unrolled pass of
    ``S_BLOCK`` samples, or (``MULTI_CHUNK``, ``s > MAX_SAMPLE_BLOCK``) a loop of passes
    (then the caller's key loop is not software-pipelined)."""
    if MULTI_CHUNK:
        if like is not None:
            zero = (like.to(tl.uint32, bitcast=True) >> 16) >> 16
            counts = zero.to(tl.int32, bitcast=True)
        elif TRANSPOSED:
            counts = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.int32)
        else:
            counts = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32)
        for c0 in range(0, num_samples, S_BLOCK):
            counts += tile_counts(
                RowStart, RowWidth, h, c0, n0, offs_m, m_valid, m_first, m_last, n_q,
                num_samples, BLOCK_M, BLOCK_N, S_BLOCK, TRANSPOSED, CLASSIFY, like, EVENTS,
                CAUSAL,
            )  # fmt: skip
    else:
        counts = tile_counts(
            RowStart, RowWidth, h, 0, n0, offs_m, m_valid, m_first, m_last, n_q, num_samples,
            BLOCK_M, BLOCK_N, S_BLOCK, TRANSPOSED, CLASSIFY, like, EVENTS, CAUSAL,
        )  # fmt: skip
    return counts
