"""Vectorised torch CPU path of PLSH attention: forward and backward in ``O(n * window)`` memory.

PLSH attention is softmax attention with the additive bias ``log C_ij``, where
``C_ij = #{t : bin_t(p_i) = bin_t(p_j)}`` counts the hash functions that put query ``i``
and key ``j`` in the same bin (times the causal mask); SPEC section 3 (b), Wolfson &
Wagner (2026), Theorem 2.2. This module computes it without ever forming an ``n x n``
matrix:

1. Keys (and queries) are sorted by position. Bins are non-decreasing in the position,
   so for every sample ``t`` the keys sharing query ``i``'s bin are one contiguous index
   range ``[start_t(i), end_t(i))``, found by ``searchsorted``; the causal cut clips
   ``end_t(i)``. Every such range holds the keys of an interval of positions that
   contains ``p_i``, so their union is contiguous as well: ``C_ij >= 1`` exactly on
   ``[min_t start_t(i), max_t end_t(i))``.
2. Queries are cut into tiles of ``T`` rows (``T`` chosen per head from its pitches).
   A tile reaches the key range ``[min start, max end)`` over its rows and samples: the
   union of its blocks. Starts and (cut) ends are non-decreasing along sorted rows, so
   the range comes from the tile's first and last rows. Keys outside it (in particular
   causally masked key tiles) are never touched.
3. The tiles of a head, sorted by window width (widest first), are cut into groups whose
   widths lie within 1/8 of the group's widest; a group is stacked into one batched call
   with its windows padded to that width ``W`` (padded keys get count 0). Groups hold at
   most ``CHUNK_ELEMENTS`` logits per batch row and do not depend on the batch size.
4. Bands. A head whose tiles are at most :data:`BAND_MAX_TILE` rows (small pitches) pays
   more for many tiny tiles and for copying every key of a window ``W / T`` times than
   for a somewhat wider window. When queries and keys have the same sorted positions,
   such a head takes tiles of :data:`BAND_TILE` consecutive rows whose windows are all
   ``[g T + c, g T + c + W)``, with ``c`` the smallest start and ``c + W`` the largest
   end of any tile relative to its first row (at most the largest pitch apart): equally
   spaced windows, read by the forward as one strided view of the keys and values
   (padded with zero rows at both ends; keys outside ``[0, n_k)`` have count 0), so
   nothing is gathered. Measured on the SPEC section 7 CPU configuration (n = 16k, one
   thread): about 7-10% less forward time at s = 16 and 64 (``benchmarks/README.md``).
5. Inside a window the counts are a difference array: ``+1`` at ``start_t(i)``, ``-1`` at
   ``end_t(i)`` for every sample, then a cumulative sum along the keys (int32): ``O(s)``
   work per row plus one pass over the window, instead of ``s`` comparisons per pair. The
   bias is read from a table of ``s + 1`` entries: ``log(C / s)`` where ``C >= 1`` and
   ``-inf`` where ``C = 0``, so that every inadmissible key gets exactly weight 0 however
   large its logit (a finite stand-in such as ``-1e30`` lets a key whose logit exceeds
   the admissible ones by that much win the softmax). Rows with no admissible key are set
   to output 0 and LSE ``-inf`` explicitly.
6. Rows in the same bin of every sample (a *cell*; about ``sigma / s`` rows on average,
   since the ``s`` partitions together cut about ``s / sigma`` boundaries per token) have
   the same blocks, hence the same counts up to the causal cut. When a group has few
   cells (at most :data:`PATTERN_ROWS_FRACTION` of its rows), the counts of the first
   row of each cell are computed over its uncut blocks and copied to the cell's rows;
   then the keys at or past each row's causal cut are masked, in the columns at or past
   the group's smallest cut only (for self-attention, the last ``T`` columns). The
   result is bit-identical to counting every row.
7. Softmax with that bias and its LSE are computed by torch's fused CPU flash-attention
   kernel (``aten::_scaled_dot_product_flash_attention_for_cpu``) on the stacked tiles, in
   float32 (float64 for float64 inputs; a value head_dim different from the query's is
   zero-padded). That operator is private, so it is used only on the torch releases it
   was verified on and after a once-per-process self-check against the plain
   implementation (:func:`fused_tiles_available`); otherwise a plain torch implementation
   of the same formulas (public operators only) runs (:data:`USE_FUSED_TILES`). The
   backward runs plain torch formulas on the same tiles: since a tile's window holds all
   admissible keys of its rows, it recomputes each row's softmax whole (max-subtracted,
   like the dense float32 yardstick) instead of from the saved float32 LSE, whose rounding
   grows with the logits (``proofs_notes/backward.md``, section 3; torch's fused backward
   takes that LSE).
8. Plans are kept across calls. The plan and the count biases depend only on the
   partition, the positions, the causal flag and the compute dtype, which a model layer
   with a fixed partition repeats every step; the tile kernel alone measured about half
   of a call's time (``benchmarks/README.md``). So the second call with the same inputs
   (a call seen once, such as a decoding step with one more key, keeps nothing) keeps
   its plan with every tile group built (bias and indices) when that fits
   :data:`PLAN_CACHE_BYTES`, and later calls with equal inputs (compared by value: pitch
   and offset bytes, positions hashed, then compared with ``torch.equal``) reuse it, as
   does the forward's backward. Least recently used plans
   go first when the budget is exceeded, and an evicted plan drops its chunks also where
   an autograd graph still holds it. Results are bit-identical with and without keeping.

Memory is ``O(batch * CHUNK_ELEMENTS)`` per tile group in flight plus ``O(s n)`` int64
for the block boundaries of one head, plus at most :data:`PLAN_CACHE_BYTES` for kept
plans (a kept plan is ``O(n * window)``: its biases hold one value per tile logit,
:func:`kept_plan_bytes`). Parallelism: with ``torch.get_num_threads() = N > 1``
the tile groups (and the per-head planning) go to ``N`` Python worker threads of one
module-level pool: in the forward and the planning each worker takes the next item when
it is free (their outputs are disjoint, so who runs what does not change a bit), in the
backward they are dealt round-robin (the per-worker key-gradient sums then have a fixed
order); the pool is created on first use, reused by every call, grown when
a call wants more workers (:func:`executor`). Each worker thread limits *its own* OpenMP
and MKL thread counts to 1 when it starts (``omp_set_num_threads`` and
``mkl_set_num_threads_local`` act on the calling thread only): the work is many
independent operators of moderate size, and OpenMP barriers inside each of them stall
whenever another process holds a core. The calling thread and the process-wide setting
(``torch.get_num_threads()``) are never changed, so a call has no side effect on global
state, even when it fails, and concurrent calls from several Python threads cannot leave
a wrong thread count behind. Where those per-thread limits are unavailable (an OpenMP
runtime other than the one found in the process), the work runs serially in the calling
thread with torch's usual intra-op threads (:func:`per_thread_limits_available`).

The plan (sorted positions, tiles, block ranges and the tile groups) is built by
:func:`plan_cpu`; the forward and the backward accept it as ``plan=`` so that
:mod:`plsh_fast._autograd` computes it once per forward and reuses it in the backward.

The two public functions have the signature of the Triton path
(:func:`plsh_fast.triton_forward.plsh_forward_triton`,
:func:`plsh_fast.triton_backward.plsh_backward_triton`), so that
:mod:`plsh_fast._autograd` dispatches uniformly. They trust their arguments: validation
happens in :func:`plsh_fast.plsh_attention`.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from plsh_ref.partition import count_bias

from ._ordering import position_order
from ._partition import bins

__all__ = [
    "BAND_MAX_TILE",
    "BAND_TILE",
    "CHUNK_ELEMENTS",
    "FUSED_TORCH_VERSIONS",
    "PATTERN_ROWS_FRACTION",
    "PLAN_CACHE_BYTES",
    "USE_FUSED_TILES",
    "clear_plan_cache",
    "executor",
    "fused_tiles_available",
    "kept_plan_bytes",
    "no_kept_plans",
    "per_thread_limits_available",
    "plan_cpu",
    "plan_from_tensor",
    "plan_to_tensor",
    "plsh_backward_cpu",
    "plsh_forward_cpu",
    "tile_size",
    "tiles_forward",
]

#: Upper bound on the ``tiles * T * W`` logits of one call per batch row (a single tile
#: wider than this still runs alone); float32: about 2 MB per intermediate and batch row,
#: which keeps a chunk near the cache and the memory small.
CHUNK_ELEMENTS = 1 << 19

#: A group of tiles takes the bias of the first row of each *cell* (rows whose blocks
#: agree in every sample, hence whose counts agree up to the causal cut) and copies it to
#: the cell's rows when there are at most this fraction as many cells as rows; otherwise
#: every row's counts are computed. Set to 0 (never) or 1 (always) in tests.
PATTERN_ROWS_FRACTION = 0.25

#: Heads whose query tiles are at most this many rows (small pitches, module step 4) run
#: as a band when queries and keys have the same positions: tiles of :data:`BAND_TILE`
#: consecutive rows whose key windows are equally spaced, read as strided views of the
#: keys and values instead of gathered copies. ``0`` disables bands.
BAND_MAX_TILE = 32

#: Query-tile height of a band head (module step 4).
BAND_TILE = 32

#: Bytes of built tile groups (count biases, indices and block ranges) that the CPU path
#: keeps across calls, least recently used first out (module step 8). A call whose
#: partition, positions, causal flag and compute dtype equal those of a kept plan skips
#: planning and bias building; a plan larger than this is never kept. ``0`` disables
#: the cache (every call plans afresh, and a forward's groups are not kept for its
#: backward). Changing it takes effect at the next call; :func:`clear_plan_cache` frees
#: what is kept. The default, 1 GiB, holds the plan of the SPEC section 7 CPU
#: configuration up to n = 64k, s = 64 (731 MiB; 112 MiB at n = 16k, s = 16; the
#: ``kept plan MB`` of ``benchmarks/results/cpu_2026-12-01_vm_n16384-65536_t2_r2.md``).
PLAN_CACHE_BYTES = 2**30

#: Use torch's fused CPU flash-attention operator on the stacked tiles when available.
#: Set to ``False`` to force the plain torch implementation (tests compare both).
USE_FUSED_TILES = True

_MIN_TILE = 16
_MAX_TILE = 128
#: ``[first, last)`` torch ``(major, minor)`` releases on which the private fused operator
#: was verified (:func:`fused_tiles_available`); 2.13 is the pinned one.
FUSED_TORCH_VERSIONS = ((2, 3), (2, 14))

_FUSED_OK: bool | None = None  # result of the version check and self-check, once
_FUSED_LOCK = threading.Lock()
_FUSED = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def tile_size(mean_pitch: float, n_q: int) -> int:
    """Query-tile height for a head whose pitches average ``mean_pitch`` tokens.

    A power of two in ``[16, 128]`` near ``mean_pitch / 4`` (``sigma / 2``): the window of
    a tile is its height plus the largest left extent of its blocks (about
    ``sigma (ln s + 0.58)``), so a height below ``sigma`` wastes little, while short tiles
    copy every key of the window ``W / T`` times into the stacked calls. Measured on the
    SPEC section 7 CPU configuration (n = 16k, s = 16, 2 threads), ``sigma / 2`` took
    about 25% less time than ``sigma / 4`` and the same as ``sigma`` (see
    ``benchmarks/README.md``). Never taller than the power of two above ``n_q``.
    """
    target = max(mean_pitch / 4.0, 1.0)
    t = 1 << int(round(math.log2(target)))
    t = min(max(t, _MIN_TILE), _MAX_TILE)
    return min(t, 1 << max(0, (max(n_q, 1) - 1).bit_length()))


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass
class _Chunk:
    """One call's work: ``G`` query tiles of ``T`` rows, each with a key window of ``W``."""

    head: int
    rows: torch.Tensor  # (G, T) indices into the padded sorted query rows
    keys: torch.Tensor  # (G, W) indices into the sorted keys (clamped; extra keys have count 0)
    bias: torch.Tensor  # (G, T, W) log(C / s) (-inf where C = 0), compute dtype
    empty: torch.Tensor  # (G, T) bool, rows without any admissible key
    #: ``(first row, first key)`` of a band chunk (module step 4): its rows are
    #: consecutive and tile ``g``'s keys are ``first key + g T + [0, W)``, possibly
    #: starting before 0 or ending past ``n_k`` (those keys have count 0); else ``None``.
    band: tuple[int, int] | None = None

    def take_rows(self, x: torch.Tensor) -> torch.Tensor:
        """The chunk's rows of ``x`` (B, n, ...) as ``(B, G, T, ...)`` (a view for a band)."""
        if self.band is not None:
            g, t = self.rows.shape
            return x[:, self.band[0] : self.band[0] + g * t].unflatten(1, (g, t))
        return _gather(x, self.rows)

    def window_view(self, padded: torch.Tensor, pad: int) -> torch.Tensor:
        """The key windows of a band chunk as a strided view ``(B, G, W, d)`` of
        ``padded`` (B, pad + n_k + pad, d), contiguous; windows overlap (read only)."""
        g, t = self.rows.shape
        w = self.keys.shape[1]
        b, _, d = padded.shape
        start = padded.storage_offset() + (self.band[1] + pad) * d
        return padded.as_strided((b, g, w, d), (padded.stride(0), t * d, d, 1), start)

    def take_keys(self, x: torch.Tensor) -> torch.Tensor:
        """The chunk's key windows of ``x`` (B, n_k, d) as ``(B, G, W, d)``."""
        return _gather(x, self.keys)

    def put_rows(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``dst`` (B, n, ...) rows of the chunk ``= src`` (B, G, T, ...); rows are disjoint."""
        if self.band is not None:
            dst[:, self.band[0] : self.band[0] + self.rows.numel()] = src.flatten(1, 2)
            return
        dst.index_copy_(1, self.rows.reshape(-1), src.flatten(1, 2))

    def add_windows(self, padded: torch.Tensor, src: torch.Tensor, pad: int) -> None:
        """``padded`` (B, pad + n_k + pad, d) ``+=`` the key windows ``src`` (B, G, W, d) of a
        band chunk: in ``M = ceil(W / T)`` phases of every ``M``-th tile, whose windows are
        ``M T >= W`` apart, so that each phase is one in-place add on a strided view of
        disjoint rows (no index list, unlike :meth:`add_keys`)."""
        g, t = self.rows.shape
        w, d = src.shape[2], src.shape[3]
        phases = -(-w // t)
        base = padded.storage_offset() + (self.band[1] + pad) * padded.stride(1)
        for m in range(min(phases, g)):
            part = src[:, m::phases]
            view = padded.as_strided(
                (padded.shape[0], part.shape[1], w, d),
                (padded.stride(0), phases * t * padded.stride(1), padded.stride(1), 1),
                base + m * t * padded.stride(1),
            )
            view.add_(part)

    def add_keys(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``dst`` (B, n_k, d) rows of the key windows ``+= src`` (B, G, W, d)."""
        flat, src = self.keys.reshape(-1), src.flatten(1, 2)
        for b in range(dst.shape[0]):  # dim 0 of a contiguous row block: see _gather
            dst[b].index_add_(0, flat, src[b])


@dataclass(eq=False)  # identity: plans hold tensors and are kept by identity
class _Plan:
    """Sort orders, tiles and block ranges shared by the forward and the backward.

    Block ranges are computed one head at a time (:meth:`ranges`), so the plan holds
    ``O(s n)`` integers at once, not ``O(H s n)``.
    """

    query_order: torch.Tensor | None
    query_inverse: torch.Tensor | None
    key_order: torch.Tensor | None
    key_inverse: torch.Tensor | None
    qpos: torch.Tensor  # (n_q,) sorted
    kpos: torch.Tensor  # (n_k,) sorted
    pitch: torch.Tensor  # (H, s) float64
    offset: torch.Tensor
    causal: bool
    tiles: list[int]  # tile height per head
    dtype: torch.dtype
    band: list[bool]  # per head: tiles run as a band (module step 4)
    specs: list | None = None  # work items of every head (:func:`_chunk_specs`), cached
    #: Built chunks by ``id`` of their spec (module step 8), or ``None`` (built per use).
    chunk_store: dict | None = None
    #: ``(key, query positions, key positions)`` under which the plan may be kept.
    cache_key: tuple | None = None
    nbytes: int = 0  # bytes of the built chunks and block ranges, once kept

    @property
    def n_q(self) -> int:
        return self.qpos.numel()

    @property
    def n_k(self) -> int:
        return self.kpos.numel()

    def block_ranges(self, h: int):
        """``(start, end, cut, bins)``: each query's block of sorted keys, before the causal cut.

        ``start``, ``end``: int64 ``(s, n_q)``, the sorted keys sharing the query's bin in
        sample ``t`` are ``[start, end)``. Bins are non-decreasing along sorted positions
        (floor of a monotone, correctly rounded map), so each bin is one contiguous run of
        sorted keys. ``cut``: int64 ``(n_q,)``, the number of keys with ``p_key <= p_query``
        (causal), or ``None`` when not causal. ``bins``: int64 ``(s, n_q)``, the query bins.
        """
        pitch, offset = self.pitch[h : h + 1], self.offset[h : h + 1]
        bq = bins(pitch, offset, self.qpos)
        if (
            _unit_steps(self.kpos)
            and _small(self.kpos)
            and _small(self.qpos)
            and _small_partition(pitch, offset)
        ):
            start, end = _block_ranges_unit_steps(pitch, offset, bq, self.kpos)
        else:
            bk = bins(pitch, offset, self.kpos).contiguous()
            start = torch.searchsorted(bk, bq, right=False)
            end = torch.searchsorted(bk, bq, right=True)
        cut = torch.searchsorted(self.kpos, self.qpos, right=True) if self.causal else None
        return start[0], end[0], cut, bq[0]

    def ranges(self, h: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(start, end)``, int64 ``(s, n_q)``: the sorted keys sharing each query's bin
        and admissible to it (:meth:`block_ranges` after the causal cut);
        ``end == start`` marks an empty range (no key in the bin, or all of them causally
        masked).
        """
        start, end, cut, _ = self.block_ranges(h)
        return start, _clip(start, end, cut)

    @property
    def padded_rows(self) -> int:
        """Rows after padding to a multiple of every tile height (they are powers of two)."""
        tile = max(self.tiles)
        return -(-self.n_q // tile) * tile

    def chunks(self):
        """Yield the work of every head as :class:`_Chunk` objects of bounded size."""
        for h in range(len(self.tiles)):
            for spec in self.head_specs(h):
                yield self.build(spec)

    def build(self, spec) -> _Chunk:
        """The :class:`_Chunk` (indices and bias) of one work item of :meth:`head_specs`.

        Built once and kept when the plan keeps its chunks (:data:`PLAN_CACHE_BYTES`) and
        ``spec`` is one of the plan's own work items (:attr:`specs`, alive as long as the
        plan, so their ``id`` cannot be taken by another object); a spec is built by one
        worker at a time, so the store needs no lock. Any other spec is built afresh.
        """
        store = self.chunk_store
        if store is None or id(spec) not in store:
            return self._make_chunk(*spec)
        chunk = store[id(spec)]
        if chunk is None:
            chunk = store[id(spec)] = self._make_chunk(*spec)
        return chunk

    def head_specs(self, h: int) -> list[tuple]:
        """Work items of head ``h``: groups of tiles of similar window width (module step 3)."""
        return list(self._head_chunks(h, self.tiles[h]))

    def _head_chunks(self, h: int, tile: int):
        start, end, cut, bq = self.block_ranges(h)
        s, n_q = start.shape
        num_tiles = -(-n_q // tile)
        rows = num_tiles * tile
        # Padded rows: empty ranges, and (causal) no admissible key (no copy without padding).
        st = _pad_last(start, rows).view(s, num_tiles, tile)
        en = _pad_last(end, rows).view(s, num_tiles, tile)
        if cut is not None:
            cut = _pad_last(cut, rows).view(num_tiles, tile)
        # A row starts a new cell (rows in the same bin of every sample, hence with the
        # same counts before the causal cut) when one of its bins differs from the
        # previous row's; padded rows form cells of their own.
        new = torch.ones(num_tiles * tile, dtype=torch.bool)
        new[1:n_q] = (bq[:, 1:] != bq[:, :-1]).any(dim=0)
        new = new.view(num_tiles, tile)
        new[:, 0] = True
        # Window of each tile: starts and cut ends are non-decreasing along sorted rows,
        # so the first row has the smallest starts and the last (real) row the largest
        # ends. (A first row whose range is empty in some sample can only widen it.)
        first = torch.arange(num_tiles) * tile
        last = torch.clamp(first + tile, max=n_q) - 1
        lo = start[:, first].amin(dim=0)
        hi = _clip(start[:, last], end[:, last], None if cut is None else cut.view(-1)[last])
        hi = hi.amax(dim=0)
        width = (hi - lo).clamp_(min=0)
        if self.band[h]:
            yield from self._band_chunks(h, tile, lo, hi, width, st, en, cut, new)
            return
        # Tiles sorted by window width, widest first, are cut into groups of at most
        # CHUNK_ELEMENTS logits per batch row whose widths stay within 1/8 of the group's
        # first (widest) one, which is the group's padded width: few calls, little padding.
        # Neither the groups nor the padded widths depend on the batch size, so a batch
        # row gives the same result alone or in a batch.
        order = torch.argsort(width, descending=True, stable=True)
        widths = width[order].tolist()
        # Tiles in that order once, so that every group below is a slice (a view).
        lo, new = lo.index_select(0, order), new.index_select(0, order)
        st, en = st.index_select(1, order), en.index_select(1, order)
        cut = None if cut is None else cut.index_select(0, order)
        i = 0
        while i < len(widths) and widths[i] > 0:
            w = widths[i]
            cap = max(1, CHUNK_ELEMENTS // (tile * w))
            j = i + 1
            while j < len(widths) and j - i < cap and 8 * widths[j] >= 7 * w:
                j += 1
            yield (
                h,
                tile,
                w,
                order[i:j],
                lo[i:j],
                st[:, i:j],
                en[:, i:j],
                None if cut is None else cut[i:j],
                new[i:j],
            )
            i = j

    def _band_chunks(self, h, tile, lo, hi, width, st, en, cut, new):
        """Work items of a band head (module step 4): consecutive tiles in groups of at most
        ``CHUNK_ELEMENTS`` logits, every window ``[g T + c, g T + c + W)`` with ``c`` the
        smallest start and ``c + W`` the largest end relative to the tile's first row."""
        num_tiles = lo.numel()
        first = torch.arange(num_tiles) * tile
        active = width > 0
        if not bool(active.any()):
            return
        c = int((lo - first)[active].min())
        w = int((hi - first)[active].max()) - c
        cap = max(1, CHUNK_ELEMENTS // (tile * w))
        for i in range(0, num_tiles, cap):
            j = min(i + cap, num_tiles)
            sel = torch.arange(i, j)
            cut_ij = None if cut is None else cut[i:j]
            yield (h, tile, w, sel, sel * tile + c, st[:, i:j], en[:, i:j], cut_ij, new[i:j])

    def _make_chunk(self, h, tile, w, sel, lo, st, en, cut, new) -> _Chunk:
        g = sel.numel()
        rows = sel[:, None] * tile + torch.arange(tile)
        # Clamped at both ends: keys outside [0, n_k) (band windows) have count 0.
        keys = (lo[:, None] + torch.arange(w)).clamp_(0, max(self.n_k - 1, 0))
        band = None
        if self.band[h] and bool((sel.diff() == 1).all()) and bool((lo.diff() == tile).all()):
            band = (int(sel[0]) * tile, int(lo[0]))
        clipped = _clip(st, en, cut)
        empty = (clipped <= st).all(dim=0)
        cell = new.cumsum(dim=1).sub_(1)  # (G, T) cell of each row
        cells = int(cell[:, -1].max()) + 1
        if cells > PATTERN_ROWS_FRACTION * tile:
            # Rows change blocks often (small sigma): count every row's ranges directly.
            bias = self._bias(st, clipped, lo, w)
            return _Chunk(h, rows, keys, bias, empty, band)
        # Few cells: count the first row of each cell over its blocks (before the causal
        # cut), copy that row to the cell's rows, then mask the keys past each row's cut.
        first = torch.full((g, cells), tile - 1).scatter_reduce_(
            1, cell, torch.arange(tile).expand(g, tile), "amin"
        )
        first = first.expand(st.shape[0], g, cells)
        pattern = self._bias(st.gather(2, first), en.gather(2, first), lo, w)
        pick = (cell + cells * torch.arange(g)[:, None]).view(-1)
        bias = pattern.view(g * cells, w).index_select(0, pick).view(g, tile, w)
        if cut is not None:
            rel_cut = cut - lo[:, None]  # keys at or past it: inadmissible
            c0 = max(int(rel_cut.min()), 0)
            if c0 < w:
                past = torch.arange(c0, w) >= rel_cut[..., None]
                bias[..., c0:].masked_fill_(past, -math.inf)  # log 0: inadmissible
        return _Chunk(h, rows, keys, bias, empty, band)

    def _bias(self, st, en, lo, w) -> torch.Tensor:
        """``log(C / s)`` over the window ``[lo, lo + w)`` of ranges ``[st, en)`` (s, G, R).

        A difference array of the counts (+1 at each start, -1 at each end, ranges clamped
        to the window; empty ranges cancel), summed along the keys in int32, then read from
        the table :attr:`log_counts` (the masked bias where ``C = 0``): ``(G, R, w)``.
        """
        g, r = st.shape[1], st.shape[2]
        # Contiguous (G, R, s) indices: scatter_add_ is about 15% faster than on the view.
        rel_st = (st - lo[None, :, None]).clamp_(0, w).permute(1, 2, 0).contiguous()
        rel_en = (en - lo[None, :, None]).clamp_(0, w).permute(1, 2, 0).contiguous()
        diff = torch.zeros(g, r, w + 1, dtype=torch.int32)
        ones = torch.ones((), dtype=torch.int32).expand(g, r, rel_st.shape[2])
        diff.scatter_add_(2, rel_st, ones)
        diff.scatter_add_(2, rel_en, -ones)
        counts = diff[..., :w].cumsum(-1, dtype=torch.int32)
        return self.log_counts.index_select(0, counts.view(-1)).view(g, r, w)

    @cached_property
    def log_counts(self) -> torch.Tensor:
        """``log(c / s)`` for ``c = 0..s`` in the compute dtype (``-inf`` for ``c = 0``).

        Rounded once from float64, so that the softmax's LSE is directly
        ``log sum_j exp(scale q_i . k_j) C_ij / s``: subtracting ``log s`` from a float32
        LSE afterwards would cancel catastrophically when the LSE is far below ``log s``.
        """
        s = self.pitch.shape[1]
        table = count_bias(np.arange(s + 1), s)  # table[0] = log 0 = -inf: weight exactly 0
        return torch.from_numpy(table).to(self.dtype)


def _clip(start: torch.Tensor, end: torch.Tensor, cut) -> torch.Tensor:
    """Block ends after the causal cut (``cut`` broadcasts over the samples), never
    below the starts; ``end`` itself when ``cut`` is ``None``."""
    if cut is None:
        return end
    return torch.maximum(torch.minimum(end, cut), start)


def _unit_steps(kpos: torch.Tensor) -> bool:
    """Whether sorted key positions are consecutive integers ``k0, k0 + 1, ...``."""
    n = kpos.numel()
    return n > 0 and int(kpos[-1] - kpos[0]) == n - 1 and bool((kpos[1:] > kpos[:-1]).all())


def _small(positions: torch.Tensor) -> bool:
    """``|p| < 2**40`` for the end points of sorted positions (rounding error << 1 token)."""
    return positions.numel() == 0 or max(abs(int(positions[0])), abs(int(positions[-1]))) < 2**40


def _small_partition(pitch: torch.Tensor, offset: torch.Tensor) -> bool:
    """Pitches and ``|offset|`` below ``2**39`` tokens: bin boundaries ``offset + b * pitch``
    near positions below ``2**40`` then stay far inside int64 and within ``2**-11`` tokens
    of exact (:func:`_first_position`); larger ones take the binary-search path."""
    return float(pitch.max()) < 2.0**39 and float(offset.abs().max()) < 2.0**39


def _first_position(pitch, offset, b: torch.Tensor) -> torch.Tensor:
    """Smallest integer position whose bin is ``>= b``, with bins in binary64 (exact).

    ``ceil(offset + b * pitch)`` is within one of the answer for positions below ``2**40``
    in magnitude (its rounding error is below ``2**-12`` tokens there; the caller checks);
    one step in each direction with the exact bin function fixes it.
    """
    pitch, offset = pitch[..., None], offset[..., None]
    p = torch.ceil(offset + b.to(torch.float64) * pitch)

    def bin_of(x):
        return torch.floor((x - offset) / pitch)

    bf = b.to(torch.float64)
    p = torch.where(bin_of(p - 1.0) >= bf, p - 1.0, p)
    p = torch.where(bin_of(p) < bf, p + 1.0, p)
    return p.to(torch.int64)


def _block_ranges_unit_steps(pitch, offset, bq, kpos):
    """``searchsorted`` of the query bins among the key bins, for consecutive key positions.

    Key ``j`` has position ``k0 + j``, so the keys of bin ``b`` are the indices
    ``[first(b) - k0, first(b + 1) - k0)`` clipped to ``[0, n_k]``: elementwise arithmetic
    instead of two binary searches per (head, sample, query).
    """
    k0, n_k = int(kpos[0]), kpos.numel()
    if bq.shape[-1] == 0:
        return bq.clone(), bq.clone()
    lowest = bq.amin(dim=-1, keepdim=True)
    spans = (bq.amax(dim=-1, keepdim=True) - lowest + 2).reshape(-1)  # bins + 1, per sample
    total = int(spans.sum())
    if total <= spans.numel() * (2 * bq.shape[-1] + 2):
        # At most about twice as many bins as queries in all: evaluate the boundary of
        # every bin once (one evaluation per bin instead of two per query) and gather. Each
        # sample's table covers its own bins only (one flat, ragged table): with s = 64
        # the smallest pitch would otherwise size every sample's table.
        base = spans.cumsum(0).sub_(spans)  # start of each sample's table

        # Per-sample values repeated over the sample's bins (repeat_interleave and
        # index_select: several times faster on the CPU than advanced indexing).
        def per_bin(x):
            return x.reshape(-1).repeat_interleave(spans, output_size=total)

        b = (per_bin(lowest - base.view(lowest.shape))).add_(torch.arange(total))
        first = _first_position(per_bin(pitch), per_bin(offset), b[:, None])[:, 0]
        first = (first - k0).clamp_(0, n_k)
        rel = (bq - lowest).add_(base.view(lowest.shape)).view(-1)
        start = first.index_select(0, rel).view(bq.shape)
        return start, first.index_select(0, rel.add_(1)).view(bq.shape)
    start = (_first_position(pitch, offset, bq) - k0).clamp_(0, n_k)
    end = (_first_position(pitch, offset, bq + 1) - k0).clamp_(0, n_k)
    return start, end


def _plan(pitch, offset, query_positions, key_positions, causal: bool, dtype) -> _Plan:
    query_order, query_inverse = position_order(query_positions)
    key_order, key_inverse = position_order(key_positions)
    qpos = query_positions if query_order is None else query_positions[query_order]
    kpos = key_positions if key_order is None else key_positions[key_order]
    n_q = qpos.numel()
    tiles = [tile_size(p, n_q) for p in pitch.mean(dim=1).tolist()]
    # Bands (module step 4) need the same sorted positions for queries and keys, so that
    # a tile's window moves by the tile height from one tile to the next, and no repeated
    # position (a run of equal positions widens every band window by its length).
    same = n_q == kpos.numel() and torch.equal(qpos, kpos) and bool((qpos.diff() > 0).all())
    band = [same and t <= BAND_MAX_TILE for t in tiles]
    cap = 1 << max(0, (max(n_q, 1) - 1).bit_length())
    tiles = [min(BAND_TILE, cap) if b else t for t, b in zip(tiles, band)]
    return _Plan(
        query_order,
        query_inverse,
        key_order,
        key_inverse,
        qpos.contiguous(),
        kpos.contiguous(),
        pitch,
        offset,
        bool(causal),
        tiles,
        dtype,
        band,
    )


_DONE = object()  # end of a dynamic task queue (:func:`_run_parallel`)
_POOL: ThreadPoolExecutor | None = None
_POOL_PID: int | None = None  # process that created the pool (a forked child makes its own)
_POOL_LOCK = threading.Lock()
_LIMITS: tuple | None = None  # (omp_set_num_threads, mkl_set_num_threads_local or None)
_LIMITS_FOUND = False


def _thread_limit_functions():
    """The per-thread ``omp_set_num_threads`` of the process's OpenMP runtime (the one torch
    loaded) and MKL's ``mkl_set_num_threads_local`` when present, or ``None``."""
    global _LIMITS, _LIMITS_FOUND
    if _LIMITS_FOUND:
        return _LIMITS
    _LIMITS_FOUND = True
    omp = mkl = None
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:
        paths = set()
    for path in sorted(paths):
        name = path.rsplit("/", 1)[-1]
        if omp is None and name.startswith(("libgomp", "libiomp5", "libomp")):
            try:
                omp = ctypes.CDLL(path).omp_set_num_threads
            except (OSError, AttributeError):
                omp = None
        if mkl is None and name.startswith(("libtorch_cpu", "libmkl_rt")):
            try:
                # The Fortran entry point (trailing underscore) takes its argument by
                # reference in every MKL build.
                mkl = ctypes.CDLL(path).mkl_set_num_threads_local_
            except (OSError, AttributeError):
                mkl = None
    if omp is not None:
        omp.argtypes = [ctypes.c_int]
        if mkl is not None:
            mkl.argtypes = [ctypes.POINTER(ctypes.c_int)]
        _LIMITS = (omp, mkl)
    return _LIMITS


def _limit_this_thread() -> None:
    """Pool initializer: one OpenMP/MKL thread for this worker thread only."""
    limits = _thread_limit_functions()
    if limits is None:
        return
    torch.get_num_threads()  # torch's lazy per-thread init first (it would reset the limit)
    omp, mkl = limits
    omp(1)
    if mkl is not None:
        mkl(ctypes.byref(ctypes.c_int(1)))


def per_thread_limits_available() -> bool:
    """Whether worker threads can limit their own OpenMP threads (else: serial calls)."""
    return _thread_limit_functions() is not None


def executor(workers: int) -> ThreadPoolExecutor | None:
    """The module's worker pool with at least ``workers`` threads, or ``None``.

    Created lazily on first use and reused by every call; replaced by a larger pool when a
    call wants more workers (the old one finishes its queued work and exits), and made
    anew in a process forked after its creation (whose copy has no threads). ``None``
    when per-thread thread limits are unavailable (:func:`per_thread_limits_available`).
    """
    global _POOL, _POOL_PID
    if not per_thread_limits_available():
        return None
    with _POOL_LOCK:
        if _POOL is not None and _POOL_PID != os.getpid():
            _POOL = None  # inherited through fork: its threads do not exist in this process
        if _POOL is None or _POOL._max_workers < workers:
            old = _POOL
            _POOL = ThreadPoolExecutor(
                workers, thread_name_prefix="plsh-cpu", initializer=_limit_this_thread
            )
            _POOL_PID = os.getpid()
            if old is not None:
                old.shutdown(wait=False)
        return _POOL


def _run_parallel(tasks: list, fn, workers: int, dynamic: bool = False) -> None:
    """``fn(task, worker)`` for every task, on ``workers`` threads of the module's pool.

    Each worker thread runs torch operators with one OpenMP thread (module docstring), so
    the parallelism comes from independent tiles running concurrently (torch operators
    release the GIL). By default tasks are dealt round-robin in the given order, so the
    assignment (and every floating-point sum over a worker's tasks) is deterministic for a
    given thread count. ``dynamic``: each worker takes the next task in the given order
    when it is free, so that a worker whose core another process holds does not hold up
    the call; only for tasks whose results do not depend on the worker (the forward's
    disjoint rows, the per-head planning). Returns after every worker has finished, then
    raises the first error if any.
    """
    pool = executor(workers) if workers > 1 and len(tasks) > 1 else None
    if pool is None:
        with torch.no_grad():
            for task in tasks:
                fn(task, 0)
        return
    # Grad and inference mode are thread-local: the workers never record a graph, and they
    # run in inference mode when the caller does (tensors created in inference mode may
    # only be updated in place inside it).
    inference = torch.is_inference_mode_enabled()

    if dynamic:
        queue = iter(tasks)
        lock = threading.Lock()

        def mine(_w):
            while True:
                with lock:
                    task = next(queue, _DONE)
                if task is _DONE:
                    return
                yield task

    else:

        def mine(w):
            return tasks[w::workers]

    def deal(w):
        with torch.inference_mode(inference), torch.no_grad():
            for task in mine(w):
                fn(task, w)

    jobs = [pool.submit(deal, w) for w in range(workers)]
    errors = [job.exception() for job in jobs]  # waits for every worker
    for error in errors:
        if error is not None:
            raise error


def _chunk_specs(plan: _Plan, workers: int) -> list[tuple]:
    """All work items of all heads, largest first (planning itself runs in parallel).

    Cached on the plan: a plan shared by a forward and its backward plans once.
    """
    if plan.specs is not None:
        return plan.specs
    per_head: list = [None] * len(plan.tiles)

    def plan_head(h, _worker):
        per_head[h] = plan.head_specs(h)

    _run_parallel(list(range(len(plan.tiles))), plan_head, workers, dynamic=True)
    specs = [spec for head in per_head for spec in head]
    specs.sort(key=lambda spec: -spec[3].numel() * spec[1] * spec[2])
    plan.specs = specs
    _keep_chunks(plan)
    return specs


def _band_padding(plan: _Plan, specs, group: int) -> tuple[int, set]:
    """``(pad, kv heads)``: zero rows needed at each end of the keys so that every band
    window (module step 4) lies inside, and the kv heads that band heads read."""
    pad, kv = 0, set()
    for h, _, w, _, lo, *_ in specs:
        if plan.band[h] and lo.numel():
            pad = max(pad, -int(lo[0]), int(lo[-1]) + w - plan.n_k)
            kv.add(h // group)
    return pad, kv


def _pad_rows(x: torch.Tensor, pad: int) -> torch.Tensor:
    """``x`` (B, n, d) with ``pad`` zero rows before and after, contiguous."""
    return torch.nn.functional.pad(x, (0, 0, pad, pad)) if pad else x.contiguous()


def _sorted_rows(x: torch.Tensor, order, rows: int, dtype) -> torch.Tensor:
    """``x`` (B, H, n, d) in ``dtype``, rows sorted by ``order`` and zero-padded to ``rows``."""
    x = x.to(dtype)
    if order is not None:
        x = x.index_select(2, order)
    if rows > x.shape[2]:
        x = torch.nn.functional.pad(x, (0, 0, 0, rows - x.shape[2]))
    return x


def _per_head(x: torch.Tensor) -> list[torch.Tensor]:
    """Contiguous ``(B, n, d)`` slices of every head of ``x`` (B, H, n, d)."""
    return [x[:, h].contiguous() for h in range(x.shape[1])]


def _gather(rows_tensor: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``rows_tensor[:, idx]`` for ``rows_tensor`` (B, n, ...) and ``idx`` (G, W): (B, G, W, ...).

    One ``index_select`` along dim 0 of each batch row's contiguous ``(n, ...)`` block,
    like :meth:`_Chunk.add_keys` for ``index_add_``: torch's CPU kernels are faster along
    dim 0 of a contiguous tensor than along dim 1 of the batched one (``index_add_``
    measurably so; see the CPU notes in ``benchmarks/README.md``).
    """
    b, _, *rest = rows_tensor.shape
    flat = idx.reshape(-1)
    if b == 1:
        return rows_tensor[0].index_select(0, flat).view(1, *idx.shape, *rest)
    out = rows_tensor.new_empty(b, flat.numel(), *rest)
    for i in range(b):
        torch.index_select(rows_tensor[i], 0, flat, out=out[i])
    return out.view(b, *idx.shape, *rest)


def _pad_last(x: torch.Tensor, size: int) -> torch.Tensor:
    return x if x.shape[-1] == size else torch.nn.functional.pad(x, (0, size - x.shape[-1]))


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def fused_tiles_available() -> bool:
    """Whether the forward's tiles run on torch's private fused CPU flash-attention operator.

    ``aten::_scaled_dot_product_flash_attention_for_cpu`` is private: its presence,
    signature, LSE convention and mask semantics may change between torch releases. It is
    used only when :data:`USE_FUSED_TILES` is set, the operator exists, the torch version
    lies in :data:`FUSED_TORCH_VERSIONS` (the releases it was verified on), and a
    self-check passes once per process: on a small seeded problem with masked (``-inf``)
    and finite bias entries its output and LSE must match the plain torch implementation
    to float32 rounding. Otherwise the plain implementation runs (same formulas, module
    step 7). The self-check uses its own generator (the global RNG is untouched) and runs
    under ``no_grad``. The backward always runs the plain formulas (its fused operator
    recomputes the probabilities from the float32 LSE; :func:`plsh_backward_cpu`).
    """
    global _FUSED_OK
    if not USE_FUSED_TILES or _FUSED is None:
        return False
    if _FUSED_OK is None:
        with _FUSED_LOCK:
            if _FUSED_OK is None:
                low, high = FUSED_TORCH_VERSIONS
                _FUSED_OK = low <= _torch_version() < high and _fused_self_check()
    return _FUSED_OK


def _fused_self_check() -> bool:
    """The fused operator agrees with :func:`_plain_tiles_forward` (see above)."""
    g = torch.Generator().manual_seed(20261201)
    q, k, v = (torch.randn(1, 2, m, 8, generator=g) for m in (5, 7, 7))
    bias = torch.log(torch.randint(0, 4, (1, 2, 5, 7), generator=g).float() / 3.0)
    bias[..., 0] = 0.0  # every row has an admissible key
    try:
        with torch.no_grad():
            out, lse = _fused_tiles_forward(q, k, v, bias, 0.3)
            ref_out, ref_lse = _plain_tiles_forward(q, k, v, bias, 0.3)
    except (RuntimeError, TypeError, ValueError):
        return False
    pairs = [(out, ref_out), (lse, ref_lse)]
    return all(a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in pairs)


def tiles_forward(q, k, v, bias, scale):
    """The tile kernel of the CPU forward: ``softmax(scale q k^T + bias) v`` and its LSE.

    Module step 6: torch's fused CPU flash-attention operator when
    :func:`fused_tiles_available`, otherwise the plain torch formulas. Public so that
    ``benchmarks/cpu_bench.py`` can time the kernel alone on the plan's tile groups (the
    bound on what the rest of the path can gain). Trusts its arguments (no validation).

    Parameters
    ----------
    q : torch.Tensor
        ``(B, G, T, d)``: ``G`` query tiles of ``T`` rows, float32 or float64.
    k, v : torch.Tensor
        ``(B, G, W, d)`` and ``(B, G, W, dv)``: each tile's key window, same dtype.
    bias : torch.Tensor
        ``(B, G, T, W)`` additive logit bias (``log(C / s)``, ``-inf`` where ``C = 0``).
    scale : float
        Logit scale.

    Returns
    -------
    out, lse : torch.Tensor
        ``(B, G, T, dv)`` and ``(B, G, T)`` (natural log), in the dtype of ``q``. Rows
        whose bias is ``-inf`` everywhere give meaningless values (callers reset them).

    References
    ----------
    SPEC section 3 (b); ``proofs_notes/backward.md`` (the LSE convention).
    """
    if fused_tiles_available():
        return _fused_tiles_forward(q, k, v, bias, scale)
    return _plain_tiles_forward(q, k, v, bias, scale)


def _fused_tiles_forward(q, k, v, bias, scale):
    width = max(q.shape[-1], v.shape[-1])
    out, lse = _FUSED(
        _pad_last(q, width),
        _pad_last(k, width),
        _pad_last(v, width),
        attn_mask=bias,
        scale=scale,
    )
    return out[..., : v.shape[-1]], lse.to(q.dtype)


def _plain_tiles_forward(q, k, v, bias, scale):
    logits = torch.matmul(q, k.transpose(-1, -2)).mul_(scale).add_(bias)
    row_max = logits.amax(dim=-1, keepdim=True)
    probs = logits.sub_(row_max).exp_()
    denom = probs.sum(dim=-1, keepdim=True)
    out = torch.matmul(probs, v).div_(denom)
    return out, (row_max + denom.log())[..., 0]


def _tiles_backward(grad_out, q, k, v, bias, scale, empty, grad_lse=None):
    """Gradients of :func:`tiles_forward`: ``(B, G, T, d)``, ``(B, G, W, d)``, ``(B, G, W, dv)``.

    ``empty`` (``(G, T)`` bool, broadcast over the batch) marks rows whose bias is ``-inf``
    everywhere; ``grad_lse`` (``(B, G, T)`` or ``None``) is the gradient with respect to
    the tile rows' LSE. A tile's key window holds every admissible key of each of its rows
    (module step 2), so each row's softmax is recomputed whole, as the dense float32
    yardstick of SPEC section 6 does: ``P = softmax(x)`` (``x - max`` exact near the
    maximum; ``exp(x - lse)`` would carry the float32 rounding of ``lse``, about
    ``|lse| 2^-24``, into every probability of the row) and ``dS = P o (dP - delta + g)``
    with ``delta_i = sum_j P_ij dP_ij`` (the softmax backward; ``dO_i . O_i`` from the
    saved output would leave its rounding in ``dS`` of saturated rows, where the exact
    ``dP_ij - delta_i`` nearly vanishes), ``proofs_notes/backward.md``. Empty rows get
    probability 0 (``softmax`` of an all ``-inf`` row is NaN).
    """
    logits = torch.matmul(q, k.transpose(-1, -2)).mul_(scale).add_(bias)
    probs = torch.softmax(logits, dim=-1).masked_fill_(empty[..., None], 0.0)
    d_logits = torch.matmul(grad_out, v.transpose(-1, -2)).mul_(probs)  # P o dP
    delta = d_logits.sum(dim=-1, keepdim=True)
    if grad_lse is not None:
        delta = delta.sub_(grad_lse[..., None])
    d_logits = d_logits.sub_(probs * delta)
    grad_q = torch.matmul(d_logits, k).mul_(scale)
    grad_k = torch.matmul(d_logits.transpose(-1, -2), q).mul_(scale)
    grad_v = torch.matmul(probs.transpose(-1, -2), grad_out)
    return grad_q, grad_k, grad_v


def plan_cpu(pitch, offset, query_positions, key_positions, causal: bool, dtype) -> _Plan:
    """The plan of a CPU call: sorted positions, tile heights, block ranges, tile groups.

    Arguments as :func:`plsh_forward_cpu` (``dtype``: the query's). The returned object is
    passed to :func:`plsh_forward_cpu` and :func:`plsh_backward_cpu` as ``plan=`` so that
    a forward and its backward plan once; its tile groups are computed on first use.
    When a kept plan (module step 8, :data:`PLAN_CACHE_BYTES`) has equal pitch, offset,
    positions, causal flag and compute dtype, that plan is returned, with its tile groups
    and count biases already built. A plan is kept from the second call with its inputs
    on (a call seen once, such as each step of a decoding loop, keeps nothing).

    Raises
    ------
    ValueError
        ``BAND_TILE`` is not a power of two in ``[16, 128]`` (module settings).
    """
    if BAND_MAX_TILE > 0 and (BAND_TILE not in (16, 32, 64, 128)):
        raise ValueError(f"BAND_TILE: must be a power of two in [16, 128], got {BAND_TILE!r}")
    dtype = _compute_dtype(dtype)
    if getattr(_BYPASS, "on", False):
        return _plan(pitch, offset, query_positions, key_positions, causal, dtype)
    if _CACHE:
        with _CACHE_LOCK:
            _evict_beyond_budget()  # a lowered budget (or 0) takes effect at the next call
    key = _cache_key(pitch, offset, query_positions, key_positions, causal, dtype)
    if key is not None:
        plan = _cached_plan(key, query_positions, key_positions)
        if plan is not None:
            return plan
    plan = _plan(pitch, offset, query_positions, key_positions, causal, dtype)
    if key is not None and _seen_before(key):
        plan.cache_key = (key, query_positions.clone(), key_positions.clone())
    return plan


_CACHE: OrderedDict = OrderedDict()  # key -> kept _Plan, least recently used first
_CACHE_BYTES = 0  # sum of the kept plans' nbytes
#: ``hash`` of the keys of recent calls (admission on the second call); hashes, not the
#: keys, so that 4096 remembered calls do not hold 4096 copies of the partition's bytes.
_SEEN: OrderedDict = OrderedDict()
_SEEN_KEYS = 4096
_CACHE_LOCK = threading.Lock()


_BYPASS = threading.local()  # no_kept_plans() active in this thread


@contextlib.contextmanager
def no_kept_plans():
    """Context manager: CPU calls of this thread plan afresh and leave the kept plans alone.

    Inside it :func:`plan_cpu` neither uses, keeps nor evicts plans (unlike
    ``PLAN_CACHE_BYTES = 0``, which also drops what is kept at the next call): for a
    one-off call whose plan should not displace the kept ones, or to time a call that
    plans (``benchmarks/cpu_bench.py``, ``plsh_cold``). Thread-local: the pool's workers
    do not plan. Nests.
    """
    previous = getattr(_BYPASS, "on", False)
    _BYPASS.on = True
    try:
        yield
    finally:
        _BYPASS.on = previous


def clear_plan_cache() -> None:
    """Forget every plan the CPU path keeps across calls (:data:`PLAN_CACHE_BYTES`).

    Frees their count biases and indices, also where an autograd graph still holds a
    plan (its backward builds them again). Safe to call at any time, also while other
    threads run CPU calls (a call holding a plan keeps working).
    """
    global _CACHE_BYTES
    with _CACHE_LOCK:
        for plan in _CACHE.values():
            plan.chunk_store = None
        _CACHE.clear()
        _SEEN.clear()
        _CACHE_BYTES = 0


def _cache_key(pitch, offset, query_positions, key_positions, causal, dtype):
    """Hashable key of a plan's inputs (positions are compared again on a hit), or
    ``None`` when plans are not kept. The module settings that change the tile groups are
    in it."""
    if PLAN_CACHE_BYTES <= 0:
        return None

    def digest(x):
        return hash(x.detach().cpu().contiguous().numpy().tobytes())

    return (
        bool(causal),
        dtype,
        tuple(pitch.shape),
        pitch.detach().cpu().numpy().tobytes(),
        offset.detach().cpu().numpy().tobytes(),
        query_positions.numel(),
        key_positions.numel(),
        digest(query_positions),
        digest(key_positions),
        CHUNK_ELEMENTS,
        PATTERN_ROWS_FRACTION,
        BAND_MAX_TILE,
        BAND_TILE,
    )


def _evict_beyond_budget() -> None:
    """Drop least recently used plans until the kept ones fit :data:`PLAN_CACHE_BYTES`
    (caller holds the lock). An evicted forward's plan lives on in its autograd graph:
    its chunks are dropped there too (its backward builds them again)."""
    global _CACHE_BYTES
    while _CACHE and _CACHE_BYTES > PLAN_CACHE_BYTES:
        _, old = _CACHE.popitem(last=False)
        _CACHE_BYTES -= old.nbytes
        old.chunk_store = None


def _cached_plan(key, query_positions, key_positions) -> _Plan | None:
    with _CACHE_LOCK:
        plan = _CACHE.get(key)
        if plan is None:
            return None
        _, qpos, kpos = plan.cache_key
        if not (torch.equal(qpos, query_positions) and torch.equal(kpos, key_positions)):
            return None  # a hash collision
        _CACHE.move_to_end(key)
        return plan


def _seen_before(key) -> bool:
    """Whether a recent call had this key (then its plan may be kept); remembers it. A
    hash collision only keeps a plan one call early."""
    digest = hash(key)
    with _CACHE_LOCK:
        if digest in _SEEN:
            _SEEN.move_to_end(digest)
            return True
        _SEEN[digest] = None
        while len(_SEEN) > _SEEN_KEYS:
            _SEEN.popitem(last=False)
        return False


def _tensor_bytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _keep_chunks(plan: _Plan) -> None:
    """Let ``plan`` keep its chunks when they fit :data:`PLAN_CACHE_BYTES` (sizes known
    from the tile groups before any is built)."""
    if plan.cache_key is None or plan.chunk_store is not None:
        return
    elem = torch.empty((), dtype=plan.dtype).element_size()
    estimate = 0
    for spec in plan.specs:
        _, tile, w, sel = spec[:4]
        estimate += sel.numel() * tile * (w * elem + 9) + sel.numel() * w * 8
        estimate += _tensor_bytes(*(t for t in spec[4:] if isinstance(t, torch.Tensor)))
    if estimate <= PLAN_CACHE_BYTES:
        plan.chunk_store = dict.fromkeys(map(id, plan.specs))  # built on first use
        plan.nbytes = estimate


def _remember(plan: _Plan) -> None:
    """Keep ``plan`` (whose chunks are all built) in the cache, evicting the least
    recently used plans beyond :data:`PLAN_CACHE_BYTES`."""
    global _CACHE_BYTES
    if plan.chunk_store is None or plan.cache_key is None:
        return
    key = plan.cache_key[0]
    with _CACHE_LOCK:
        old = _CACHE.get(key)
        if old is plan:
            return
        if old is not None:  # same inputs planned twice concurrently: keep the newer
            _CACHE_BYTES -= old.nbytes
            old.chunk_store = None
        _CACHE[key] = plan
        _CACHE.move_to_end(key)
        _CACHE_BYTES += plan.nbytes
        _evict_beyond_budget()


def kept_plan_bytes() -> int:
    """Bytes of the plans the CPU path keeps across calls now (:data:`PLAN_CACHE_BYTES`):
    their count biases, chunk indices and block ranges (``int``, at most the budget)."""
    with _CACHE_LOCK:
        return _CACHE_BYTES


_SPEC_HEADER = 6  # head, tile, width, tiles in the group, samples, has causal cut


def plan_to_tensor(plan: _Plan) -> torch.Tensor:
    """The plan's tile groups as one int64 1-D CPU tensor (for :func:`plan_from_tensor`).

    Custom operators pass only tensors from a forward to its backward
    (:mod:`plsh_fast._ops`); this is how the compiled backward reuses the forward's plan.
    ``[-1]`` when the forward built no tile groups (empty inputs).
    """
    if plan.specs is None:
        return torch.full((1,), -1, dtype=torch.int64)
    # The tile heights and band flags of the heads come first: the backward must use the
    # forward's even if the module settings changed in between.
    heads = len(plan.tiles)
    parts = [torch.tensor([len(plan.specs), heads, *plan.tiles, *plan.band], dtype=torch.int64)]
    for h, tile, w, sel, lo, st, en, cut, new in plan.specs:
        header = [h, tile, w, sel.numel(), st.shape[0], cut is not None]
        parts += [torch.tensor(header, dtype=torch.int64), sel, lo, st.reshape(-1), en.reshape(-1)]
        if cut is not None:
            parts.append(cut.reshape(-1))
        parts.append(new.reshape(-1).to(torch.int64))
    return torch.cat(parts)


def plan_from_tensor(
    blob: torch.Tensor, pitch, offset, query_positions, key_positions, causal: bool, dtype
) -> _Plan:
    """The plan of :func:`plan_cpu` with the tile groups decoded from :func:`plan_to_tensor`.

    Sort orders and tile heights are recomputed (``O(n)``); the block ranges and tile
    groups (the expensive part) are read from ``blob``, unless :func:`plan_cpu` returns a
    kept plan, whose groups are the same (same inputs, deterministic planning).
    """
    plan = plan_cpu(pitch, offset, query_positions, key_positions, causal, dtype)
    count = int(blob[0])
    if count < 0 or plan.specs is not None:
        return plan
    heads = int(blob[1])
    plan.tiles = blob[2 : 2 + heads].tolist()
    plan.band = [bool(b) for b in blob[2 + heads : 2 + 2 * heads].tolist()]
    specs, at = [], 2 + 2 * heads
    for _ in range(count):
        h, tile, w, g, s, has_cut = blob[at : at + _SPEC_HEADER].tolist()
        at += _SPEC_HEADER

        def take(size, shape):
            nonlocal at
            out = blob[at : at + size].view(shape)
            at += size
            return out

        sel, lo = take(g, (g,)), take(g, (g,))
        st, en = take(s * g * tile, (s, g, tile)), take(s * g * tile, (s, g, tile))
        cut = take(g * tile, (g, tile)) if has_cut else None
        new = take(g * tile, (g, tile)).bool()
        specs.append((h, tile, w, sel, lo, st, en, cut, new))
    plan.specs = specs
    return plan


def _prepare(query, key, value, pitch, offset, query_positions, key_positions, causal, plan):
    """The plan and the per-head sorted (and, for queries, padded) compute-dtype inputs."""
    dtype = _compute_dtype(query.dtype)
    if plan is None:
        plan = plan_cpu(pitch, offset, query_positions, key_positions, causal, dtype)
    q = _per_head(_sorted_rows(query, plan.query_order, plan.padded_rows, dtype))
    k = _per_head(_sorted_rows(key, plan.key_order, 0, dtype))
    v = _per_head(_sorted_rows(value, plan.key_order, 0, dtype))
    return plan, q, k, v


def _empty_result(query, value, n_q):
    b, h = query.shape[:2]
    out = torch.zeros(b, h, n_q, value.shape[-1], dtype=query.dtype)
    lse = torch.full((b, h, n_q), -math.inf, dtype=_compute_dtype(query.dtype))
    return out, lse


def plsh_forward_cpu(
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
):
    """PLSH attention forward on CPU: ``softmax(scale q k^T + log C) v`` and its LSE.

    Parameters
    ----------
    query : torch.Tensor
        ``(batch, num_heads, n_q, head_dim)``, float16/bfloat16/float32/float64, any strides.
    key : torch.Tensor
        ``(batch, num_heads_kv, n_k, head_dim)``; ``num_heads % num_heads_kv == 0``.
    value : torch.Tensor
        ``(batch, num_heads_kv, n_k, head_dim_v)``.
    pitch, offset : torch.Tensor
        float64 ``(num_heads, num_samples)``: the partition sample.
    query_positions, key_positions : torch.Tensor
        int64 ``(n_q,)``, ``(n_k,)`` absolute positions (any order, repeats allowed).
    scale : float
        Logit scale.
    causal : bool
        Key ``j`` admissible for query ``i`` iff ``p_j <= p_i``.
    plan : object, optional
        :func:`plan_cpu` of the same pitch, offset, positions and causal flag (built here
        when omitted).

    Returns
    -------
    out : torch.Tensor
        ``(batch, num_heads, n_q, head_dim_v)`` in the query dtype; 0 on empty rows.
    lse : torch.Tensor
        ``(batch, num_heads, n_q)``, float32 (float64 for float64 inputs):
        ``log sum_j exp(scale q_i . k_j) C_ij / s``; ``-inf`` on empty rows.

    References
    ----------
    Wolfson & Wagner (2026), Theorem 2.2; SPEC section 3 (b); module docstring.
    """
    batch, num_heads, n_q, _ = query.shape
    if n_q == 0 or key.shape[2] == 0 or batch == 0:
        return _empty_result(query, value, n_q)
    plan, q, k, v = _prepare(
        query, key, value, pitch, offset, query_positions, key_positions, causal, plan
    )
    dtype, rows, group = plan.dtype, plan.padded_rows, num_heads // key.shape[1]
    out = torch.zeros(batch, num_heads, rows, value.shape[-1], dtype=dtype)
    lse = torch.full((batch, num_heads, rows), -math.inf, dtype=dtype)
    workers = torch.get_num_threads()

    specs = _chunk_specs(plan, workers)
    # Band heads (module step 4) read their key windows as strided views of the keys and
    # values padded by ``pad`` zero rows at each end (keys there have count 0).
    pad, band_kv = _band_padding(plan, specs, group)
    padded = {hk: (_pad_rows(k[hk], pad), _pad_rows(v[hk], pad)) for hk in band_kv}

    def work(spec, _worker):
        chunk = plan.build(spec)
        h, hk = chunk.head, chunk.head // group
        if chunk.band is not None:
            keys, values = (chunk.window_view(x, pad) for x in padded[hk])
        else:
            keys, values = chunk.take_keys(k[hk]), chunk.take_keys(v[hk])
        o, l = tiles_forward(
            chunk.take_rows(q[h]), keys, values, chunk.bias.expand(batch, -1, -1, -1), scale
        )
        o = o.masked_fill(chunk.empty[..., None], 0.0)
        l = l.masked_fill(chunk.empty, -math.inf)
        chunk.put_rows(out[:, h], o)  # rows of different chunks are disjoint
        chunk.put_rows(lse[:, h], l)

    _run_parallel(specs, work, workers, dynamic=True)  # disjoint rows: any worker
    _remember(plan)
    out, lse = out[:, :, :n_q], lse[:, :, :n_q]
    if plan.query_inverse is not None:
        out, lse = out[:, :, plan.query_inverse], lse[:, :, plan.query_inverse]
    return out.to(query.dtype), lse


def plsh_backward_cpu(
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
    grad_lse=None,
):
    """Gradients of PLSH attention on CPU, each row's softmax recomputed in its tile.

    With the attention probabilities ``P_i = softmax_j(scale q_i . k_j + log(C_ij / s))``
    (recomputed whole: a query tile's key window holds all of its rows' admissible keys),
    ``dP = dO V^T``, ``delta_i = sum_j P_ij dP_ij - g_i`` (``g``: ``grad_lse``) and
    ``dS = P o (dP - delta)``: ``dQ = scale dS K``, ``dK = scale dS^T Q``, ``dV = P^T dO``
    (``proofs_notes/backward.md``). Neither the saved LSE nor the saved output is read:
    the float32 gradients keep the accuracy of the dense float32 yardstick at any logit
    magnitude (``tests/fast/test_gradient_precision.py``). Keys that no query can reach get
    exactly zero gradient; empty rows contribute nothing.

    Parameters
    ----------
    query, key, value, pitch, offset, query_positions, key_positions, scale, causal, plan
        As :func:`plsh_forward_cpu` (pass the forward's ``plan`` to skip planning again).
    out, lse : torch.Tensor
        The forward's results (the signature of the Triton path's backward; not read).
    grad_out : torch.Tensor
        ``(batch, num_heads, n_q, head_dim_v)``, gradient of the loss w.r.t. ``out``.
    grad_lse : torch.Tensor or None
        ``(batch, num_heads, n_q)``, gradient of the loss w.r.t. ``lse`` (0 on rows
        without an admissible key), or ``None``.

    Returns
    -------
    (grad_query, grad_key, grad_value) : tuple of torch.Tensor
        Shapes and dtypes of ``query``, ``key``, ``value``; ``grad_key`` and ``grad_value``
        are summed over the query heads sharing a kv head (grouped-query attention).
    """
    batch, num_heads, n_q, _ = query.shape
    if n_q == 0 or key.shape[2] == 0 or batch == 0:
        return torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)
    plan, q, k, v = _prepare(
        query, key, value, pitch, offset, query_positions, key_positions, causal, plan
    )
    dtype, rows, group = plan.dtype, plan.padded_rows, num_heads // key.shape[1]
    d_out = _per_head(_sorted_rows(grad_out, plan.query_order, rows, dtype))
    if grad_lse is not None:
        grad_lse = _sorted_rows(grad_lse[..., None], plan.query_order, rows, dtype)[..., 0]
    grad_q = torch.zeros(batch, num_heads, rows, query.shape[-1], dtype=dtype)
    workers = torch.get_num_threads()
    specs = _chunk_specs(plan, workers)
    workers = max(1, min(workers, len(specs)))
    # Band chunks (module step 4) read strided windows of the padded keys and values and
    # add their key gradients into accumulators padded the same way.
    pad, band_kv = _band_padding(plan, specs, group)
    padded = {hk: (_pad_rows(k[hk], pad), _pad_rows(v[hk], pad)) for hk in band_kv}
    # Key windows of different chunks overlap: one key/value accumulator per worker.
    size = plan.n_k + 2 * pad
    grad_k = [
        torch.zeros(batch, key.shape[1], size, key.shape[-1], dtype=dtype) for _ in range(workers)
    ]
    grad_v = [
        torch.zeros(batch, key.shape[1], size, value.shape[-1], dtype=dtype) for _ in range(workers)
    ]

    def work(spec, worker):
        chunk = plan.build(spec)
        h, hk = chunk.head, chunk.head // group
        if chunk.band is not None:
            keys, values = (chunk.window_view(x, pad) for x in padded[hk])
        else:
            keys, values = chunk.take_keys(k[hk]), chunk.take_keys(v[hk])
        gq, gk, gv = _tiles_backward(
            chunk.take_rows(d_out[h]),
            chunk.take_rows(q[h]),
            keys,
            values,
            chunk.bias.expand(batch, -1, -1, -1),
            scale,
            chunk.empty,
            None if grad_lse is None else chunk.take_rows(grad_lse[:, h]),
        )
        chunk.put_rows(grad_q[:, h], gq)  # disjoint rows
        for acc, grad in ((grad_k[worker][:, hk], gk), (grad_v[worker][:, hk], gv)):
            if chunk.band is not None:
                chunk.add_windows(acc, grad, pad)
            else:
                chunk.add_keys(acc[:, pad : pad + plan.n_k], grad)

    _run_parallel(specs, work, workers)
    grad_k, grad_v = sum(grad_k[1:], grad_k[0]), sum(grad_v[1:], grad_v[0])
    grad_k, grad_v = grad_k[:, :, pad : pad + plan.n_k], grad_v[:, :, pad : pad + plan.n_k]
    grad_q = grad_q[:, :, :n_q]
    if plan.query_inverse is not None:
        grad_q = grad_q[:, :, plan.query_inverse]
    if plan.key_inverse is not None:
        grad_k, grad_v = grad_k[:, :, plan.key_inverse], grad_v[:, :, plan.key_inverse]
    return grad_q.to(query.dtype), grad_k.to(key.dtype), grad_v.to(value.dtype)
