"""Bins and tile planning shared by the Triton forward and backward kernels.

The Triton kernels never divide in float32: the bins ``floor((float64(p) - offset) / pitch)``
(SPEC section 2) are computed once per call by a small Triton kernel in binary64 (Triton's
float64 ``/`` is LLVM ``fdiv double``, which NVPTX lowers to the correctly rounded
``div.rn.f64``; the interpreter uses numpy's float64 division) and stored as integers
*relative to the bin of the smallest position*, so that equality of bins (all that the
counts ``C_ij`` need) is preserved exactly while the stored values usually fit int32.

Why precomputed bins rather than bins inside the attention kernels: a tile step needs the
bins of the ``BLOCK_M`` queries and ``BLOCK_N`` keys only for the samples whose bins split
the tile pair (the others are classified from per-tile minimum/maximum bins, below). A
load of ``BLOCK_M + BLOCK_N`` int32 replaces as many float64 divisions, which are fast on
H100/H200 but 32-64x slower on consumer GPUs; the price is ``num_heads * num_samples * n``
int32 of scratch memory (67 MB at n = 64k, s = 16, 16 heads) and one extra memory-bound
pass (about 15 us there on an H200 at 4.8 TB/s).

Tile planning (host side, torch, on the tensors' device):

* per query tile of ``BLOCK_M`` rows and per sample ``t``, the minimum and maximum bin of
  the tile's positions (``qlo``, ``qhi``), and the same per key tile of ``BLOCK_N`` keys
  (``klo``, ``khi``). A bin is a non-decreasing function of the position, so these are the
  bins of the extreme positions and need no sorting. A kernel classifies each sample for a
  (query tile, key tile) pair: *full* (one common bin: every pair collides, count +1 for
  the whole tile), *disjoint* (bin ranges do not overlap: nothing collides), or *mixed*
  (compare the bins element by element);
* per (head, query tile), the key range ``[start, end)`` that the tile's blocks can reach:
  the union over samples of the keys whose bin lies in ``[qlo_t, qhi_t]``. With sorted key
  positions each sample gives a contiguous index range (``torch.searchsorted`` on that
  sample's key bins) and the union of ranges that all meet the query tile's span is
  contained in their hull; causal attention also stops at the last key position
  ``<=`` the tile's largest query position (causal tile skipping). With unsorted key
  positions the range is all keys (correct, slow); the kernels' entry points therefore
  sort the rows by position first (:mod:`plsh_fast.ordering`), so that this happens only
  when ``make_plan`` is called directly. ``start`` is rounded down to a
  multiple of ``BLOCK_N`` so that key tiles are aligned with ``klo``/``khi``;
* symmetrically, per (head, key tile), the query range used by the key/value-gradient
  kernel of the backward pass.

Source: SPEC sections 2-3 and ``proofs_notes`` on the fused counts pass (the window
``~ 2 sigma (ln s + 0.58)`` keys per query).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

__all__ = ["TilePlan", "compute_bins", "make_plan", "tile_counts"]

_INT32_SAFE = 2**31 - 8


# Reductions through ``tl.reduce`` with Triton's own combine functions: the same code as
# ``tl.sum``/``tl.max``/``tl.min`` once compiled, but in the interpreter it skips the
# per-call re-patching of a nested ``@triton.jit`` wrapper (about 4 ms per call on CPU).
@triton.jit
def _sum_fallback(a, b):
    return a + b


@triton.jit
def _max_fallback(a, b):
    return tl.maximum(a, b)


@triton.jit
def _min_fallback(a, b):
    return tl.minimum(a, b)


_sum_combine = getattr(tl.standard, "_sum_combine", _sum_fallback)
_max_combine = getattr(tl.standard, "_elementwise_max", _max_fallback)
_min_combine = getattr(tl.standard, "_elementwise_min", _min_fallback)


@triton.jit
def _bins_kernel(
    Pos,
    Pitch,
    Offset,
    RefPos,
    Bins,
    TileLo,
    TileHi,
    TilePosMin,
    TilePosMax,
    n,
    num_samples,
    n_tiles,
    BLOCK: tl.constexpr,
    S_CHUNK: tl.constexpr,
    WRITE_BINS: tl.constexpr,
    RELATIVE: tl.constexpr,
):
    # grid: (n_tiles, num_heads); program = one tile of positions, all samples of one head.
    # bin(p) = floor((float64(p) - offset) / pitch) in binary64 (SPEC section 2): Triton's
    # float64 "/" is LLVM fdiv double, lowered to the correctly rounded div.rn.f64 on
    # NVIDIA; the interpreter uses numpy's float64 division.
    tile = tl.program_id(0)
    h = tl.program_id(1)
    offs = tile.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < n
    ref_pos = tl.load(RefPos)
    p = tl.load(Pos + offs, mask=valid, other=ref_pos)
    lane = tl.arange(0, S_CHUNK)
    for c0 in range(0, num_samples, S_CHUNK):
        t_valid = (c0 + lane) < num_samples
        hs = h.to(tl.int64) * num_samples + c0 + lane
        pitch = tl.load(Pitch + hs, mask=t_valid, other=1.0)
        offset = tl.load(Offset + hs, mask=t_valid, other=0.0)
        b = tl.floor((p[None, :].to(tl.float64) - offset[:, None]) / pitch[:, None]).to(tl.int64)
        if RELATIVE:  # relative to the bin of the smallest position: >= 0, usually < 2**31
            b = b - tl.floor((ref_pos.to(tl.float64) - offset) / pitch).to(tl.int64)[:, None]
        if WRITE_BINS:
            tl.store(
                Bins + hs[:, None] * n + offs[None, :],
                b.to(Bins.dtype.element_ty),
                mask=t_valid[:, None] & valid[None, :],
            )
        big = 2**62
        lo = tl.reduce(tl.where(valid[None, :], b, big), 1, _min_combine)
        hi = tl.reduce(tl.where(valid[None, :], b, -big), 1, _max_combine)
        slot = (h.to(tl.int64) * n_tiles + tile) * num_samples + c0 + lane
        tl.store(TileLo + slot, lo.to(TileLo.dtype.element_ty), mask=t_valid)
        tl.store(TileHi + slot, hi.to(TileHi.dtype.element_ty), mask=t_valid)
    if h == 0:
        tl.store(TilePosMin + tile, tl.reduce(tl.where(valid, p, 2**62), 0, _min_combine))
        tl.store(TilePosMax + tile, tl.reduce(tl.where(valid, p, -(2**62)), 0, _max_combine))


@dataclass
class _TileBins:
    bins: torch.Tensor  # (H, s, n) int32/int64, relative to the bin of the smallest position
    lo: torch.Tensor  # (H, n_tiles, s) smallest bin of each tile
    hi: torch.Tensor  # (H, n_tiles, s) largest bin of each tile
    pos_min: torch.Tensor  # (n_tiles,) int64 smallest position of each tile
    pos_max: torch.Tensor  # (n_tiles,) int64 largest position of each tile
    block: int


def _tile_bins(
    positions, pitch, offset, ref_pos, block, dtype, bins=None, relative=True
) -> _TileBins:
    num_heads, num_samples = pitch.shape
    n = positions.shape[0]
    n_tiles = triton.cdiv(n, block)
    dev = positions.device
    write = bins is None
    if write:
        bins = torch.empty((num_heads, num_samples, n), dtype=dtype, device=dev)
    lo = torch.empty((num_heads, n_tiles, num_samples), dtype=dtype, device=dev)
    hi = torch.empty_like(lo)
    pos_min = torch.empty((n_tiles,), dtype=torch.int64, device=dev)
    pos_max = torch.empty_like(pos_min)
    if n_tiles > 0:
        _bins_kernel[(n_tiles, num_heads)](
            positions,
            pitch,
            offset,
            ref_pos,
            bins,
            lo,
            hi,
            pos_min,
            pos_max,
            n,
            num_samples,
            n_tiles,
            BLOCK=block,
            S_CHUNK=min(16, triton.next_power_of_2(num_samples)),
            WRITE_BINS=write,
            RELATIVE=relative,
        )
    return _TileBins(bins, lo, hi, pos_min, pos_max, block)


def compute_bins(
    pitch: torch.Tensor, offset: torch.Tensor, positions: torch.Tensor, *, block: int = 64
) -> torch.Tensor:
    """The absolute bins computed by the Triton bin function, ``(num_heads, num_samples, n)``.

    Debug/test entry point: runs the Triton kernel of the planning pass with the same
    float64 bin function (``_bin_f64``) but without the shift to relative bins, so that
    tests can compare it bit for bit with :func:`plsh_ref.partition.bins`.

    Parameters
    ----------
    pitch, offset : torch.Tensor
        float64 ``(num_heads, num_samples)``.
    positions : torch.Tensor
        int64 ``(n,)``, ``|p| < 2**53``.
    block : int
        Tile size of the bins kernel (power of two).

    Returns
    -------
    torch.Tensor
        int64 ``(num_heads, num_samples, n)``.
    """
    assert pitch.dtype == torch.float64 and offset.dtype == torch.float64
    assert positions.dtype == torch.int64 and positions.dim() == 1
    zero = torch.zeros((1,), dtype=torch.int64, device=positions.device)
    return _tile_bins(
        positions.contiguous(),
        pitch.contiguous(),
        offset.contiguous(),
        zero,
        block,
        torch.int64,
        relative=False,
    ).bins


@dataclass
class TilePlan:
    """Everything the Triton kernels need besides query/key/value.

    Attributes
    ----------
    bins_q, bins_k : torch.Tensor
        ``(num_heads, num_samples, n_q)`` and ``(..., n_k)``, int32 (int64 when the bin
        span does not fit), bins relative to the bin of the smallest position; the same
        tensor when query and key positions are equal.
    qlo, qhi : torch.Tensor
        ``(num_heads, n_q_tiles, num_samples)`` smallest/largest bin of each query tile.
    klo, khi : torch.Tensor
        ``(num_heads, n_k_tiles, num_samples)`` the same for key tiles.
    key_range : torch.Tensor
        int32 ``(num_heads, n_q_tiles, 2)``: ``[start, end)`` keys of each query tile,
        ``start`` a multiple of ``block_n`` (``start >= end`` means no key).
    query_range : torch.Tensor or None
        int32 ``(num_heads, n_k_tiles, 2)``, the queries that reach each key tile
        (``start`` a multiple of ``block_m``); only when asked for (backward).
    block_m, block_n : int
        Query and key tile sizes the plan was made for.
    """

    bins_q: torch.Tensor
    bins_k: torch.Tensor
    qlo: torch.Tensor
    qhi: torch.Tensor
    klo: torch.Tensor
    khi: torch.Tensor
    key_range: torch.Tensor
    query_range: torch.Tensor | None
    block_m: int
    block_n: int


def _reach(seq_bins, tile_lo, tile_hi, sorted_seq, n_seq, causal_bound, align):
    """``[start, end)`` of the entries of ``seq_bins`` whose bin lies in some ``[lo_t, hi_t]``.

    ``seq_bins``: (H, s, n_seq) bins of the other side (sorted along n when ``sorted_seq``);
    ``tile_lo``/``tile_hi``: (H, n_tiles, s). ``causal_bound``: None, or (side, bound)
    with bound (n_tiles,) an index bound: ``("end", e)`` caps end at ``e``, ``("start", b)``
    raises start to ``b``.
    """
    num_heads, n_tiles, num_samples = tile_lo.shape
    dev = tile_lo.device
    if sorted_seq and n_seq > 0:
        seq = seq_bins.reshape(num_heads * num_samples, n_seq)
        lo = tile_lo.permute(0, 2, 1).reshape(num_heads * num_samples, n_tiles).contiguous()
        hi = tile_hi.permute(0, 2, 1).reshape(num_heads * num_samples, n_tiles).contiguous()
        first = torch.searchsorted(seq, lo, side="left")
        last = torch.searchsorted(seq, hi, side="right")
        # Only samples whose range is non-empty contribute to the hull.
        nonempty = first < last
        big = torch.iinfo(torch.int64).max
        start = torch.where(nonempty, first, big).reshape(num_heads, num_samples, n_tiles)
        end = torch.where(nonempty, last, 0).reshape(num_heads, num_samples, n_tiles)
        start = start.amin(dim=1)
        end = end.amax(dim=1)
    else:
        start = torch.zeros((num_heads, n_tiles), dtype=torch.int64, device=dev)
        end = torch.full((num_heads, n_tiles), n_seq, dtype=torch.int64, device=dev)
    if causal_bound is not None:
        side, bound = causal_bound
        if side == "end":
            end = torch.minimum(end, bound[None, :])
        else:
            start = torch.maximum(start, bound[None, :])
    start = torch.div(start, align, rounding_mode="floor") * align
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
    """Bins, per-tile bin extents and key (and query) ranges for the Triton kernels.

    Parameters
    ----------
    query_positions, key_positions : torch.Tensor
        int64 ``(n_q,)``, ``(n_k,)`` on the kernels' device, ``n_q, n_k >= 1``.
    pitch, offset : torch.Tensor
        float64 ``(num_heads, num_samples)`` on the same device.
    causal : bool
        Cap key ranges at the tile's largest query position (and raise query ranges to the
        key tile's smallest key position).
    block_m, block_n : int
        Query and key tile sizes of the kernel that will use the plan.
    query_range : bool
        Also plan the query range of every key tile (backward, key/value gradients).

    Returns
    -------
    TilePlan
    """
    qpos = query_positions.contiguous()
    kpos = key_positions.contiguous()
    pitch = pitch.contiguous()
    offset = offset.contiguous()
    n_q, n_k = qpos.shape[0], kpos.shape[0]
    assert n_q >= 1 and n_k >= 1
    assert n_q < 2**31 - 2 * max(block_m, block_n) and n_k < 2**31 - 2 * max(block_m, block_n)
    assert pitch.dtype == torch.float64 and offset.dtype == torch.float64
    assert qpos.dtype == torch.int64 and kpos.dtype == torch.int64
    # One host synchronisation for every data-dependent decision.
    pmin = torch.minimum(qpos.min(), kpos.min())
    pmax = torch.maximum(qpos.max(), kpos.max())
    span_bins = (pmax - pmin).to(torch.float64) / pitch.min() + 2.0
    same_t = (
        (qpos == kpos).all()
        if n_q == n_k and qpos.data_ptr() != kpos.data_ptr()
        else torch.tensor(n_q == n_k, device=qpos.device)
    )
    stats = torch.stack(
        [
            (qpos[1:] >= qpos[:-1]).all().to(torch.float64),
            (kpos[1:] >= kpos[:-1]).all().to(torch.float64),
            span_bins,
            same_t.to(torch.float64),
        ]
    ).tolist()
    sorted_q, sorted_k, span, same = bool(stats[0]), bool(stats[1]), stats[2], bool(stats[3])
    dtype = torch.int32 if span < _INT32_SAFE else torch.int64
    ref_pos = pmin.reshape(1)
    tq = _tile_bins(qpos, pitch, offset, ref_pos, block_m, dtype)
    if same and block_m == block_n:
        tk = tq
    elif same:
        tk = _tile_bins(kpos, pitch, offset, ref_pos, block_n, dtype, bins=tq.bins)
    else:
        tk = _tile_bins(kpos, pitch, offset, ref_pos, block_n, dtype)
    key_bound = None
    if causal and sorted_k:
        key_bound = ("end", torch.searchsorted(kpos, tq.pos_max, side="right"))
    key_range = _reach(tk.bins, tq.lo, tq.hi, sorted_k, n_k, key_bound, block_n)
    q_range = None
    if query_range:
        q_bound = None
        if causal and sorted_q:
            q_bound = ("start", torch.searchsorted(qpos, tk.pos_min, side="left"))
        q_range = _reach(tq.bins, tk.lo, tk.hi, sorted_q, n_q, q_bound, block_m)
    return TilePlan(
        tq.bins, tk.bins, tq.lo, tq.hi, tk.lo, tk.hi, key_range, q_range, block_m, block_n
    )


@triton.jit
def tile_counts(
    BinsQ,
    BinsK,
    QLo,
    QHi,
    KLo,
    KHi,
    h,
    m_tile,
    n_tile,
    offs_m,
    offs_n,
    m_valid,
    n_valid,
    n_q,
    n_k,
    num_samples,
    n_q_tiles,
    n_k_tiles,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    S_CHUNK: tl.constexpr,
    CLASSIFY: tl.constexpr,
    UNROLL: tl.constexpr,
):
    """Counts ``C_ij = #{t : bin_t(p_i) = bin_t(p_j)}`` for one (query tile, key tile) pair.

    Samples are classified ``S_CHUNK`` at a time from the per-tile bin extents: *full*
    samples (one common bin) add 1 to the whole tile without touching the bins, *disjoint*
    ones add nothing, and only *mixed* samples compare bins element by element. Returns
    the int32 ``(BLOCK_M, BLOCK_N)`` counts (not yet causally masked) and the number of
    samples that are not disjoint (0 means the tile pair has no collision at all).
    ``CLASSIFY=False`` compares every sample element by element (for measurements only).

    ``UNROLL = 0``: one loop iteration per mixed sample (two dependent loads each).
    ``UNROLL = U > 0``: samples in groups of ``U``; a group with a mixed sample issues the
    ``U`` pairs of (masked) bin loads together, so their latency overlaps, at the price of
    comparing the non-mixed samples of the group too (their masked loads give
    non-matching sentinels). Which is faster is a GPU measurement (benchmarks/gpu_check.py).
    """
    counts = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32)
    n_full = tl.full([], 0, tl.int32)
    n_touch = tl.full([], 0, tl.int32)
    lane = tl.arange(0, S_CHUNK)
    q_slot = (h.to(tl.int64) * n_q_tiles + m_tile) * num_samples
    k_slot = (h.to(tl.int64) * n_k_tiles + n_tile) * num_samples
    for c0 in range(0, num_samples, S_CHUNK):
        t_valid = (c0 + lane) < num_samples
        qlo = tl.load(QLo + q_slot + c0 + lane, mask=t_valid, other=0)
        qhi = tl.load(QHi + q_slot + c0 + lane, mask=t_valid, other=0)
        klo = tl.load(KLo + k_slot + c0 + lane, mask=t_valid, other=1)
        khi = tl.load(KHi + k_slot + c0 + lane, mask=t_valid, other=1)
        overlap = t_valid & (qlo <= khi) & (klo <= qhi)
        full = overlap & (qlo == qhi) & (klo == khi)
        if not CLASSIFY:
            overlap = t_valid
            full = t_valid & (lane < 0)
        mixed = overlap & (~full)
        n_full += tl.reduce(full.to(tl.int32), 0, _sum_combine)
        n_touch += tl.reduce(overlap.to(tl.int32), 0, _sum_combine)
        bits = tl.reduce(
            tl.where(mixed, tl.full([S_CHUNK], 1, tl.int64) << lane.to(tl.int64), 0),
            0,
            _sum_combine,
        )
        if UNROLL == 0:
            tt = tl.full([], 0, tl.int64)
            while (bits >> tt) != 0:
                if ((bits >> tt) & 1) != 0:
                    row = h.to(tl.int64) * num_samples + c0 + tt
                    bq = tl.load(BinsQ + row * n_q + offs_m, mask=m_valid, other=-1)
                    bk = tl.load(BinsK + row * n_k + offs_n, mask=n_valid, other=-2)
                    counts += (bq[:, None] == bk[None, :]).to(tl.int32)
                tt += 1
        else:
            for c1 in range(0, S_CHUNK, UNROLL):
                group = (bits >> c1) & ((1 << UNROLL) - 1)
                if group != 0:
                    for u in tl.static_range(UNROLL):
                        bit = (group >> u) & 1
                        on_m = m_valid & ((offs_m * 0 + bit) != 0)
                        on_n = n_valid & ((offs_n * 0 + bit) != 0)
                        row = h.to(tl.int64) * num_samples + c0 + c1 + u
                        bq = tl.load(BinsQ + row * n_q + offs_m, mask=on_m, other=-1)
                        bk = tl.load(BinsK + row * n_k + offs_n, mask=on_n, other=-2)
                        counts += (bq[:, None] == bk[None, :]).to(tl.int32)
    return counts + n_full, n_touch
