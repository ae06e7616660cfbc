"""The bins kernel, the counts plan, the tile counts and the key/query ranges of the
Triton kernels (what the forward and backward kernels share besides their tiles).

The Triton kernels never divide in float32 and never compare bins element by element.
The bins ``floor((float64(p) - offset) / pitch)`` (SPEC section 2) are computed once per
call by a small Triton kernel in binary64 (Triton's float64 ``/`` is LLVM ``fdiv double``,
which NVPTX lowers to the correctly rounded ``div.rn.f64``; the interpreter uses numpy's
float64 division), so they are bit-identical to :func:`plsh_ref.partition.bins`
(:func:`compute_bins` is the test entry point). From them the plan derives, on the device
and without a host synchronisation, the row ranges of the counts:

* with key positions sorted (the kernels' entry points sort rows by position,
  :mod:`plsh_fast._ordering`), the keys that share query ``i``'s bin of sample ``t`` are one
  contiguous index range ``[a_t(i), b_t(i))`` (a bin is a non-decreasing function of the
  position): ``a_t(i)`` / ``b_t(i)`` is the number of keys whose bin is ``<`` / ``<=``
  the query's bin (``torch.searchsorted`` on the exact integer bins, so the ranges are
  exact). Causal attention caps ``b_t(i)`` at the number of keys ``p_j <= p_i``. Hence

  ``C_ij = sum_t [a_t(i) <= j < b_t(i)] = sum_t ([j >= a_t(i)] - [j >= b_t(i)])``

  (``[L_t(i) <= p_j <= R_t(i)]`` with ``L_t, R_t`` the integer ends of the bin, read on
  the sorted key index), which a kernel evaluates from the int32 ``row_start`` ``a_t(i)``
  and ``row_end`` ``b_t(i)``, both ``(num_heads, n_q, num_samples)`` (a row's samples
  contiguous), as one-sided events (:func:`tile_counts`: 1.5 instructions per element and
  mixed event, two columns per int32; causally only start events and one mask at the
  causal end), directly in the layout of the attention tile, and only for the events that
  split the tile pair: per (query tile, key tile) an event is constant (no per-element
  work) or *mixed*, decided from the ranges of the tile's first and last rows;
* per (head, query tile), the key range ``[start, end)`` the tile can reach: the hull of its
  rows' ranges, ``start`` rounded down to a multiple of ``BLOCK_N`` (causal tile skipping is
  part of it, since the ranges are capped); per (head, key tile), the query range used by
  the key/value-gradient kernel (:func:`plan_query_range`, backward only);
* the order in which the kernels take the heads: most planned key tiles first (the heads
  with the largest sigma), so that the longest programs start first.

Memory: ``num_heads * num_samples * (n_q + n_k)`` int64 bins (freed after planning) and
``2 * num_heads * num_samples * n_q`` int32 ranges, kept for the backward pass (its query
ranges take a transposed copy of them while planned).

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
#: Samples per statically unrolled pass above ``MAX_SAMPLE_BLOCK`` (:func:`sample_block`).
MULTI_PASS_BLOCK = 32
#: Most samples whose passes :func:`tile_counts_all` unrolls statically (:func:`sample_block`).
MAX_STATIC_SAMPLES = 256


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
    row_start, row_end : torch.Tensor
        int32 ``(num_heads, n_q, num_samples)`` (a row's samples contiguous): keys
        ``[row_start, row_end)`` share query ``i``'s bin of sample ``t`` (capped causally),
        so ``C_ij`` is the number of samples with ``row_start <= j < row_end``.
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
    """Row ranges of the counts, tile extents and key (and query) ranges for the Triton kernels.

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
    row_start = row_start.reshape(num_heads, num_samples, n_q)
    row_end = row_end.reshape(num_heads, num_samples, n_q)
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
        row_start.transpose(1, 2).contiguous(),
        row_end.transpose(1, 2).contiguous(),
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
    num_heads, n_q, num_samples = plan.row_start.shape
    dev = plan.row_start.device
    n0 = torch.arange(0, plan.n_k, plan.block_n, device=dev, dtype=torch.int32)
    n_k_tiles = n0.shape[0]
    rs = plan.row_start.transpose(1, 2).reshape(num_heads * num_samples, n_q).contiguous()
    re = plan.row_end.transpose(1, 2).reshape(num_heads * num_samples, n_q).contiguous()
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


def sample_block(num_samples: int) -> tuple[int, int]:
    """``(S_BLOCK, PASSES)`` for :func:`~plsh_fast.triton._tiling.tile_counts_all`: samples
    per unrolled pass of :func:`~plsh_fast.triton._tiling.tile_counts` and the number of
    passes.

    Up to ``MAX_SAMPLE_BLOCK`` (64) samples: one pass of the smallest power of two ``>= s``
    (at least 2). Above: ``PASSES = ceil(s / MULTI_PASS_BLOCK)`` passes of
    ``MULTI_PASS_BLOCK`` (32) samples, unrolled statically (``tl.static_range``: no loop
    inside the caller's key loop, which stays software-pipelined), up to
    ``MAX_STATIC_SAMPLES`` (256) samples; 32-sample passes, with int32 bit masks, kept the
    float32 forward and dQ kernels on sm_90 spill-free with Triton 3.6 where 64-sample
    passes spilled 16-32 B, and pad ``s`` less (``benchmarks/results/
    aot_2026-12-01_samples.md``). Above ``MAX_STATIC_SAMPLES``: ``(MAX_SAMPLE_BLOCK, 0)``,
    a runtime loop over the passes (static code of that many samples would only grow the
    kernel and its compile time; the key loop around it is then not pipelined). One kernel
    is compiled per ``(S_BLOCK, PASSES)`` (``num_samples`` itself is not specialised).

    Parameters
    ----------
    num_samples : int
        ``s >= 1``.

    Returns
    -------
    tuple of int
        ``(S_BLOCK, PASSES)``.

    Source: issue 14 (pipelined K/V loads).
    """
    s = int(num_samples)
    if s <= MAX_SAMPLE_BLOCK:
        return max(2, triton.next_power_of_2(s)), 1
    passes = -(-s // MULTI_PASS_BLOCK)
    if passes * MULTI_PASS_BLOCK > MAX_STATIC_SAMPLES:
        return MAX_SAMPLE_BLOCK, 0
    return MULTI_PASS_BLOCK, passes


@triton.jit
def _row_index(h, c0, n0, rows, n_q, num_samples):
    """Index of sample ``c0`` of each row in the ``(num_heads, n_q, num_samples)`` ranges.

    ``rows`` are clamped to ``n_q - 1`` (padded rows read the last row; callers mask them),
    so the per-sample loads need no mask. ``n0 >> 31`` is 0 (``n0 >= 0``) but not provably
    so: it keeps the per-sample loads inside the caller's key loop (L1 hits) instead of
    hoisting ``S_BLOCK`` row vectors into registers for the whole loop (register spills).
    """
    rows = tl.minimum(rows, n_q - 1)
    return (h.to(tl.int64) * n_q + rows) * num_samples + c0 + (n0 >> 31)


@triton.jit
def _lane_bits(flags, lane, S_BLOCK: tl.constexpr):
    """The ``S_BLOCK`` booleans ``flags`` as one integer, bit ``t`` for lane ``t`` (int32
    for ``S_BLOCK <= 32``, int64 above)."""
    if S_BLOCK <= 32:
        bit = tl.full([S_BLOCK], 1, tl.int32) << lane
    else:
        bit = tl.full([S_BLOCK], 1, tl.int64) << lane.to(tl.int64)
    return tl.reduce(tl.where(flags, bit, 0), 0, sum_combine)


@triton.jit
def _event_classes(x_first, x_last, n0, hi, lane, lane_valid, CLASSIFY: tl.constexpr):
    """``(full, mixed)`` per lane for the one-sided events ``[j >= x]`` over the key tile
    ``[n0, hi)``: ``x`` of the tile's first and last rows (non-decreasing in the row);
    full: 1 on the whole tile pair, mixed: split by it (``CLASSIFY=False``: every valid
    lane mixed, none full)."""
    if CLASSIFY:
        full = x_last <= n0
        mixed = (x_last > n0) & (x_first < hi)
    else:
        full = lane < 0
        mixed = lane_valid
    return full, mixed


@triton.jit
def _zero_tile(like, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TRANSPOSED: tl.constexpr):
    """int32 zeros of the counts tile, in ``like``'s layout when given (see tile_counts)."""
    if like is not None:
        zero = ((like.to(tl.uint32, bitcast=True) >> 16) >> 16).to(tl.int32, bitcast=True)
    elif TRANSPOSED:
        zero = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.int32)
    else:
        zero = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32)
    return zero


@triton.jit
def tile_counts(
    RowStart,
    RowEnd,
    CausalEnd,
    h,
    c0,
    n0,
    offs_m,
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
    CAUSAL: tl.constexpr = False,
    acc=None,
    LAST: tl.constexpr = True,
):
    """Counts ``C_ij = sum_t [a_t(i) <= j < b_t(i)]`` of samples ``c0 .. c0 + S_BLOCK - 1``
    for one (query tile, key tile ``[n0, n0 + BLOCK_N)``) pair, int32 ``(BLOCK_M,
    BLOCK_N)`` (``TRANSPOSED``: ``(BLOCK_N, BLOCK_M)``, keys along the rows, for the
    key/value-gradient kernel), as sums of one-sided **events**.

    ``RowStart``, ``RowEnd``: the plan's ``row_start`` ``a_t(i)`` and ``row_end``
    ``b_t(i)``, int32 ``(num_heads, n_q, num_samples)`` (a row's samples are contiguous,
    so sample ``t`` is an immediate offset from the row's address: one ``LDG`` per row and
    mixed sample, no address arithmetic); ``CausalEnd``: the plan's ``causal_end``
    ``(n_q,)``; ``CAUSAL``: the plan was capped causally. ``offs_m``: the tile's rows
    (int64; rows past ``n_q`` read row ``n_q - 1``, so the loads need no mask; they get
    some count in ``[0, s]``, callers mask them); ``m_first``, ``m_last``: its first and
    last valid rows. Samples past ``num_samples`` count nothing.

    ``[a <= j < b] = [j >= a] - [j >= b]`` (without causal capping ``b >= a``). An event
    is decided for the whole tile pair from the ends of the tile's first and last valid
    rows (ranges are non-decreasing in the row: ``[j >= a]`` is 1 everywhere if
    ``a(m_last) <= n0`` and 0 everywhere if ``a(m_first) >= n0 + BLOCK_N``); the constant
    ones are one integer added to the tile, only the others ("mixed") are evaluated per
    element (``CLASSIFY=False``: every event; exactness test). ``CAUSAL``: every sample
    ends at the row's causal end ``b_0(i) = #{j : p_j <= p_i}`` (bins are non-decreasing
    in the position, so the uncapped end is never smaller), hence ``C_ij = [j < b_0(i)]
    sum_t [j >= a_t(i)]``: no end events, and one mask, decided by two scalar loads, where
    the causal end splits the tile pair. The sample loop is static (unrolled, one uniform
    branch per mixed event on an int32 bit mask, int64 for ``S_BLOCK = 64``; no
    data-dependent loop), so the caller's key loop stays software-pipelined.

    Per mixed event the tile ``(BLOCK_M, BLOCK_N)`` packs two adjacent columns into one
    int32 (16-bit lanes): ``lane = BLOCK_N + c - a'`` with ``a' = clamp(a - n0, 0,
    BLOCK_N)`` and ``c`` the column in the tile lies in ``[0, 2 BLOCK_N)``, so its bit of
    value ``BLOCK_N`` is ``[c >= a']`` and no lane borrows from the other: one subtraction,
    one mask and one add per column pair, 1.5 instructions per element (an end event:
    ``lane = BLOCK_N - 1 + b' - c``, bit ``[c < b']``, its ``-1`` in the constant). A lane
    accumulates at most ``2 S_BLOCK BLOCK_N < 2**16``; the constant is added modulo
    ``2**32`` (the final lanes are the counts times ``BLOCK_N``, in ``[0, 2**16)``). The
    transposed tile uses sign bits, ``[j >= a] = ((a - 1 - j) mod 2**32) >> 31`` (exact:
    indices are below ``2**31``), one subtraction and one shift-add per element.

    ``like``: a tensor of the counts tile's shape in the layout the caller uses the counts
    in (its logits tile, the MMA layout); the counts start from ``(like >> 16) >> 16``, a
    zero that LLVM folds away but Triton's layout passes do not, so the counts are built in
    that layout (without it Triton 3.6 builds them in a blocked layout with 32 rows per
    thread and converts the tile through shared memory every step).

    ``acc``, ``LAST`` (the passes of :func:`tile_counts_all`): ``acc`` is the previous
    passes' unfinished tile (this pass's events are added to it instead of a zero tile);
    ``LAST=False`` returns this pass's tile unfinished: in the forward/dQ orientation the
    packed ``uint32 (BLOCK_M, BLOCK_N // 2)`` two-column tile, not unpacked, and (both
    orientations) without the causal mask. The packed lanes stay exact over several passes
    as long as ``s BLOCK_N < 2**16`` (the final lanes are the counts times ``BLOCK_N``; the
    sums are modulo ``2**32``).

    Cost (SASS, ``benchmarks/results/counts_sass_2026-12-01.md``): a mixed event is a
    58-instruction block plus a bit test and a branch in the forward and dQ kernels
    (64 x 64 tiles, 4 warps).
    """
    cols = n0 + tl.arange(0, BLOCK_N)  # int32 key indices
    hi = n0 + BLOCK_N
    row = _row_index(h, c0, n0, offs_m, n_q, num_samples)
    lane = tl.arange(0, S_BLOCK)
    lane_valid = (c0 + lane) < num_samples
    hrow = h.to(tl.int64) * n_q
    first = (hrow + m_first) * num_samples + c0 + lane
    last = (hrow + m_last) * num_samples + c0 + lane
    a_first = tl.load(RowStart + first, mask=lane_valid, other=2**30)
    a_last = tl.load(RowStart + last, mask=lane_valid, other=2**30)
    a_full, a_mixed = _event_classes(a_first, a_last, n0, hi, lane, lane_valid, CLASSIFY)
    a_bits = _lane_bits(a_mixed, lane, S_BLOCK)
    n_const = tl.reduce(a_full.to(tl.int32), 0, sum_combine)
    if CAUSAL:
        ce_first = tl.load(CausalEnd + m_first)
        ce_last = tl.load(CausalEnd + m_last)
        b_bits = 0
        dead = ce_last <= n0  # every key of the tile is past every row's causal end
        a_bits = tl.where(dead, 0, a_bits)
        n_const = tl.where(dead, 0, n_const)
    else:
        b_first = tl.load(RowEnd + first, mask=lane_valid, other=2**30)
        b_last = tl.load(RowEnd + last, mask=lane_valid, other=2**30)
        b_full, b_mixed = _event_classes(b_first, b_last, n0, hi, lane, lane_valid, CLASSIFY)
        b_bits = _lane_bits(b_mixed, lane, S_BLOCK)
        n_const -= tl.reduce((b_full | b_mixed).to(tl.int32), 0, sum_combine)
    if TRANSPOSED:
        if acc is not None:
            counts = acc + n_const
        else:
            counts = _zero_tile(like, BLOCK_M, BLOCK_N, TRANSPOSED) + n_const
        for t in tl.static_range(S_BLOCK):
            if ((a_bits >> t) & 1) != 0:  # [j >= a]
                a1 = tl.load(RowStart + row + t) - 1
                d = (a1[None, :] - cols[:, None]).to(tl.uint32, bitcast=True)
                counts += (d >> 31).to(tl.int32, bitcast=True)
            if not CAUSAL:
                if ((b_bits >> t) & 1) != 0:  # -[j >= b] (its -1 is in n_const)
                    b = tl.load(RowEnd + row + t)
                    d = (cols[:, None] - b[None, :]).to(tl.uint32, bitcast=True)
                    counts += (d >> 31).to(tl.int32, bitcast=True)
    else:
        # Two adjacent columns per int32 (16-bit lanes): lane = BLOCK_N + c - a' with
        # a' = clamp(a - n0, 0, BLOCK_N), c the column in the tile; its bit of value
        # BLOCK_N is [c >= a'] and no lane borrows from the other.
        tl.static_assert(2 * S_BLOCK * BLOCK_N < 65536, "16-bit lanes would overflow")
        HALF: tl.constexpr = BLOCK_N // 2
        ONE2: tl.constexpr = BLOCK_N * 65537
        if acc is not None:
            w2 = acc
        elif like is not None:
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
                a = tl.load(RowStart + row + t) - n0
                y = (tl.minimum(tl.maximum(a, 0), BLOCK_N) * 65537).to(tl.uint32, bitcast=True)
                w2 += (x_a[None, :] - y[:, None]) & ONE2
            if not CAUSAL:
                if ((b_bits >> t) & 1) != 0:  # -[j >= b] (its -1 is in n_const)
                    b = tl.load(RowEnd + row + t) - n0
                    y = ((tl.minimum(tl.maximum(b, 0), BLOCK_N) + BLOCK_N - 1) * 65537).to(
                        tl.uint32, bitcast=True
                    )
                    w2 += (y[:, None] - x_b[None, :]) & ONE2
        if LAST:
            lo = ((w2 & 65535) // BLOCK_N).to(tl.int32, bitcast=True)
            hi2 = (w2 // (BLOCK_N * 65536)).to(tl.int32, bitcast=True)
            counts = tl.join(lo, hi2).reshape(BLOCK_M, BLOCK_N)
        else:
            counts = w2
    if CAUSAL and LAST:
        if ce_first < hi:  # the causal end splits the tile pair
            ce = tl.load(CausalEnd + tl.minimum(offs_m, n_q - 1) + (n0 >> 31))
            if TRANSPOSED:
                counts = tl.where(cols[:, None] < ce[None, :], counts, 0)
            else:
                counts = tl.where(cols[None, :] < ce[:, None], counts, 0)
    return counts


@triton.jit
def tile_counts_all(
    RowStart, RowEnd, CausalEnd, h, n0, offs_m, m_first, m_last, n_q, num_samples,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, S_BLOCK: tl.constexpr,
    PASSES: tl.constexpr, TRANSPOSED: tl.constexpr, CLASSIFY: tl.constexpr, like=None,
    CAUSAL: tl.constexpr = False,
):  # fmt: skip
    """:func:`tile_counts` over all ``num_samples`` samples, int32 ``(BLOCK_M, BLOCK_N)``
    (``TRANSPOSED``: ``(BLOCK_N, BLOCK_M)``): the sum of the passes over the sample blocks
    ``[c0, c0 + S_BLOCK)``, ``c0 = 0, S_BLOCK, ...`` (samples past ``num_samples`` count
    nothing; integer sums, so the order of the passes does not matter and the counts are
    exact). ``(S_BLOCK, PASSES)`` come from :func:`sample_block`: ``PASSES >= 1`` passes
    unrolled statically (``PASSES * S_BLOCK >= num_samples``, no loop, so the caller's key
    loop stays software-pipelined), or ``PASSES = 0``, above ``MAX_STATIC_SAMPLES``: a
    runtime loop of passes (then the caller's key loop is not software-pipelined)."""
    if PASSES == 0:
        counts = _zero_tile(like, BLOCK_M, BLOCK_N, TRANSPOSED)
        for c0 in range(0, num_samples, S_BLOCK):
            counts += tile_counts(
                RowStart, RowEnd, CausalEnd, h, c0, n0, offs_m, m_first, m_last, n_q,
                num_samples, BLOCK_M, BLOCK_N, S_BLOCK, TRANSPOSED, CLASSIFY, like, CAUSAL,
            )  # fmt: skip
    else:
        # Passes 1.. continue the previous passes' tile (packed two columns per int32 in
        # the forward/dQ orientation); the last one unpacks it and applies the causal mask.
        tl.static_assert(PASSES * S_BLOCK * BLOCK_N < 65536, "16-bit lanes would overflow")
        counts = tile_counts(
            RowStart, RowEnd, CausalEnd, h, 0, n0, offs_m, m_first, m_last, n_q, num_samples,
            BLOCK_M, BLOCK_N, S_BLOCK, TRANSPOSED, CLASSIFY, like, CAUSAL, None, PASSES == 1,
        )  # fmt: skip
        for p in tl.static_range(1, PASSES):
            counts = tile_counts(
                RowStart, RowEnd, CausalEnd, h, p * S_BLOCK, n0, offs_m, m_first, m_last,
                n_q, num_samples, BLOCK_M, BLOCK_N, S_BLOCK, TRANSPOSED, CLASSIFY, like,
                CAUSAL, counts, p == PASSES - 1,
            )  # fmt: skip
    return counts
