"""The plan of a CPU call (package docstring, steps 1 to 3): sorted positions, tile
heights, block ranges and the tile groups.

:func:`plan_cpu` returns a kept plan (step 8, :mod:`plsh_fast.cpu._plan_cache`) or builds
one (:func:`make_plan`: sort orders, :func:`tile_size` per head, band heads). A
:class:`Plan` computes the block ranges one head at a time (step 1,
:mod:`plsh_fast.cpu._ranges`), the query tiles and their key windows (step 2) and the tile
groups of similar window width (step 3, :meth:`Plan.head_specs`; band heads in
:mod:`plsh_fast.cpu._band`); :func:`chunk_specs` plans every head, in parallel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch

from .._ordering import position_order
from ..dense import working_dtype
from . import _band as band_rules
from . import _chunks as chunks
from . import _plan_cache as plan_cache
from . import _pool as pool
from . import _settings as settings
from ._chunks import Chunk
from ._ranges import block_ranges, clip
from ._rows import pad_last

__all__ = ["Plan", "chunk_specs", "make_plan", "plan_cpu", "tile_size"]

_MIN_TILE = 16
_SLIM = 10  # length of a kept plan's slim work item (Plan.drop_ranges)
_MAX_TILE = 128


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


@dataclass(eq=False)  # identity: plans hold tensors and are kept by identity
class Plan:
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
    band: list[bool]  # per head: tiles run as a band (step 4)
    specs: list | None = None  # work items of every head (:func:`chunk_specs`), cached
    #: Built chunks by ``id`` of their spec (step 8), or ``None`` (built per use).
    chunk_store: dict | None = None
    #: ``(key, query positions, key positions)`` under which the plan may be kept.
    cache_key: tuple | None = None
    nbytes: int = 0  # bytes of the built chunks and block ranges, once kept
    #: ``id`` of each item of :attr:`specs` -> ``(head, place in head_specs(head))``
    origin: dict | None = None
    #: the :class:`~plsh_fast.cpu._plan_cache.PlanCache` it was planned under, if keepable
    kept_in: object | None = None

    @property
    def n_q(self) -> int:
        return self.qpos.numel()

    @property
    def n_k(self) -> int:
        return self.kpos.numel()

    def block_ranges(self, h: int):
        """:func:`plsh_fast.cpu._ranges.block_ranges` of head ``h``: ``(start, end, cut,
        bins)``, each query's block of sorted keys before the causal cut."""
        pitch, offset = self.pitch[h : h + 1], self.offset[h : h + 1]
        return block_ranges(pitch, offset, self.qpos, self.kpos, self.causal)

    def ranges(self, h: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(start, end)``, int64 ``(s, n_q)``: the sorted keys sharing each query's bin
        and admissible to it (:meth:`block_ranges` after the causal cut);
        ``end == start`` marks an empty range (no key in the bin, or all of them causally
        masked).
        """
        start, end, cut, _ = self.block_ranges(h)
        return start, clip(start, end, cut)

    @property
    def padded_rows(self) -> int:
        """Rows after padding to a multiple of every tile height (they are powers of two)."""
        tile = max(self.tiles)
        return -(-self.n_q // tile) * tile

    def chunks(self):
        """Yield the work of every head as :class:`~plsh_fast.cpu._chunks.Chunk` objects of
        bounded size."""
        for h in range(len(self.tiles)):
            for spec in self.head_specs(h):
                yield self.build(spec)

    def build(self, spec) -> Chunk:
        """The chunk (indices and bias) of one work item of :meth:`head_specs`.

        Built once and kept when the plan keeps its chunks (``PLAN_CACHE_BYTES``), with
        its counts in place of its bias (:meth:`~plsh_fast.cpu._chunks.Chunk.compact`; the
        bias is read back from :attr:`log_counts` at each use, bit for bit), and
        ``spec`` is one of the plan's own work items (:attr:`specs`, alive as long as the
        plan, so their ``id`` cannot be taken by another object); a spec is built by one
        worker at a time, so the store needs no lock. Any other spec is built afresh
        (:func:`plsh_fast.cpu._chunks.make_chunk`).
        """
        store = self.chunk_store
        if store is None or id(spec) not in store:
            if len(spec) == _SLIM:  # a kept plan's item whose chunks were dropped meanwhile
                spec = self.head_specs(spec[0])[spec[-1]]
            return chunks.make_chunk(self, *spec)
        kept = store[id(spec)]
        if kept is None:  # kept with counts in place of the bias (Chunk.compact)
            chunk = chunks.make_chunk(self, *spec)
            store[id(spec)] = chunk.compact(self.log_counts)
            return chunk
        return kept.expand(self.log_counts)

    def drop_ranges(self) -> None:
        """Once every chunk is kept (step 8): work items without their rows' ranges
        ``st``, ``en``, cuts and cell starts, which only building a chunk reads and which
        would be most of a kept plan (``2 s`` int64 per query row). A slim item is
        ``(h, tile, w, sel, lo, None, None, None, None, i)``, ``i`` its place in
        :meth:`head_specs` of ``h``, from which :meth:`build` recomputes it if the chunks
        are dropped meanwhile (a call already running with these items)."""
        if self.specs is None or self.chunk_store is None:
            return
        if any(self.chunk_store.get(id(spec)) is None for spec in self.specs):
            return
        if all(len(spec) == _SLIM for spec in self.specs):
            return
        origin = self.origin
        assert origin is not None  # set with the specs (head_specs)
        slim = [spec[:5] + (None, None, None, None, origin[id(spec)]) for spec in self.specs]
        store = self.chunk_store
        self.chunk_store = {id(new): store[id(old)] for old, new in zip(self.specs, slim)}
        self.specs = slim
        self.origin = None

    def drop_chunks(self) -> None:
        """Forget the kept chunks and the work items (an evicted plan; a later use plans its
        items again, :func:`chunk_specs`)."""
        self.chunk_store = None
        self.specs = None

    def head_specs(self, h: int) -> list[tuple]:
        """Work items of head ``h``: groups of tiles of similar window width (step 3), or
        the band groups of a band head (step 4). A work item is ``(h, tile, w, sel, lo,
        st, en, cut, new)``: tiles ``sel`` padded to window width ``w`` starting at ``lo``,
        their rows' ranges ``[st, en)`` (s, G, tile), causal cuts and cell starts."""
        tile = self.tiles[h]
        lo, hi, width, st, en, cut, new = self._tile_windows(h, tile)
        if self.band[h]:
            return list(band_rules.band_specs(h, tile, lo, hi, width, st, en, cut, new))
        return list(_width_groups(h, tile, lo, width, st, en, cut, new))

    def _tile_windows(self, h: int, tile: int):
        """Query tiles of head ``h`` and their key windows (step 2): ``(lo, hi, width)``
        per tile, the tiles' ranges ``st``, ``en`` (s, tiles, tile), causal cuts
        (tiles, tile) or ``None``, and ``new`` (tiles, tile): rows that start a cell."""
        start, end, cut, bq = self.block_ranges(h)
        s, n_q = start.shape
        num_tiles = -(-n_q // tile)
        rows = num_tiles * tile
        # Padded rows: empty ranges, and (causal) no admissible key (no copy without padding).
        st = pad_last(start, rows).view(s, num_tiles, tile)
        en = pad_last(end, rows).view(s, num_tiles, tile)
        if cut is not None:
            cut = pad_last(cut, rows).view(num_tiles, tile)
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
        hi = clip(start[:, last], end[:, last], None if cut is None else cut.view(-1)[last])
        hi = hi.amax(dim=0)
        width = (hi - lo).clamp_(min=0)
        return lo, hi, width, st, en, cut, new

    @cached_property
    def log_counts(self) -> torch.Tensor:
        """``log(c / s)`` for ``c = 0..s`` in the compute dtype (``-inf`` for ``c = 0``),
        :func:`plsh_fast.cpu._chunks.log_count_table`."""
        return chunks.log_count_table(self.pitch.shape[1], self.dtype)


def _width_groups(h, tile, lo, width, st, en, cut, new):
    """Work items of a head that is not a band (step 3).

    Tiles sorted by window width, widest first, are cut into groups of at most
    CHUNK_ELEMENTS logits per batch row whose widths stay within 1/8 of the group's first
    (widest) one, which is the group's padded width: few calls, little padding. Neither
    the groups nor the padded widths depend on the batch size, so a batch row gives the
    same result alone or in a batch.
    """
    order = torch.argsort(width, descending=True, stable=True)
    widths = width[order].tolist()
    # Tiles in that order once, so that every group below is a slice (a view).
    lo, new = lo.index_select(0, order), new.index_select(0, order)
    st, en = st.index_select(1, order), en.index_select(1, order)
    cut = None if cut is None else cut.index_select(0, order)
    i = 0
    while i < len(widths) and widths[i] > 0:
        w = widths[i]
        cap = max(1, settings.CHUNK_ELEMENTS // (tile * w))
        j = i + 1
        while j < len(widths) and j - i < cap and 8 * widths[j] >= 7 * w:
            j += 1
        cut_ij = None if cut is None else cut[i:j]
        yield (h, tile, w, order[i:j], lo[i:j], st[:, i:j], en[:, i:j], cut_ij, new[i:j])
        i = j


def make_plan(pitch, offset, query_positions, key_positions, causal: bool, dtype) -> Plan:
    """A fresh :class:`Plan` (no cache): sort orders, sorted positions, tile heights and
    band heads; block ranges and tile groups are computed on first use. ``dtype``: the
    compute dtype."""
    query_order, query_inverse = position_order(query_positions)
    key_order, key_inverse = position_order(key_positions)
    qpos = query_positions if query_order is None else query_positions[query_order]
    kpos = key_positions if key_order is None else key_positions[key_order]
    n_q = qpos.numel()
    tiles = [tile_size(p, n_q) for p in pitch.mean(dim=1).tolist()]
    tiles, band = band_rules.band_heads(qpos, kpos, tiles)
    return Plan(
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


def plan_cpu(pitch, offset, query_positions, key_positions, causal: bool, dtype) -> Plan:
    """The plan of a CPU call: sorted positions, tile heights, block ranges, tile groups.

    Arguments as :func:`plsh_fast.cpu.plsh_forward_cpu` (``dtype``: the query's). The
    returned object is passed to :func:`plsh_fast.cpu.plsh_forward_cpu` and
    :func:`plsh_fast.cpu.plsh_backward_cpu` as ``plan=`` so that a forward and its backward
    plan once; its tile groups are computed on first use. When a kept plan (step 8,
    ``PLAN_CACHE_BYTES``) has equal pitch, offset, positions, causal flag and compute
    dtype, that plan is returned, with its tile groups and count biases already built. A
    plan is kept from the second call with its inputs on (a call seen once, such as each
    step of a decoding loop, keeps nothing).

    Raises
    ------
    ValueError
        ``BAND_TILE`` is not a power of two in ``[16, 128]`` (package settings).
    """
    band_tile = settings.BAND_TILE
    if settings.BAND_MAX_TILE > 0 and (band_tile not in (16, 32, 64, 128)):
        raise ValueError(f"BAND_TILE: must be a power of two in [16, 128], got {band_tile!r}")
    dtype = working_dtype(dtype)
    if plan_cache.bypassed():
        return make_plan(pitch, offset, query_positions, key_positions, causal, dtype)
    plan_cache.evict_beyond_budget()  # a lowered budget (or 0) takes effect at the next call
    key = plan_cache.cache_key(pitch, offset, query_positions, key_positions, causal, dtype)
    if key is not None:
        plan = plan_cache.cached_plan(key, query_positions, key_positions)
        if plan is not None:
            return plan
    plan = make_plan(pitch, offset, query_positions, key_positions, causal, dtype)
    if key is not None and plan_cache.seen_before(key):
        plan.cache_key = (key, query_positions.clone(), key_positions.clone())
        plan.kept_in = plan_cache.active_plan_cache()
    return plan


def chunk_specs(plan: Plan, workers: int) -> list[tuple]:
    """All work items of all heads, largest first (planning itself runs in parallel on
    ``workers`` threads, :func:`plsh_fast.cpu._pool.run_parallel`).

    Cached on the plan: a plan shared by a forward and its backward plans once. A freshly
    planned plan then keeps its chunks if it may (:func:`plsh_fast.cpu._plan_cache.keep_chunks`).
    """
    if plan.specs is not None:
        return plan.specs
    per_head: list = [None] * len(plan.tiles)

    def plan_head(h, _worker):
        per_head[h] = plan.head_specs(h)

    pool.run_parallel(list(range(len(plan.tiles))), plan_head, workers, dynamic=True)
    specs = [spec for head in per_head for spec in head]
    plan.origin = {id(spec): i for head in per_head for i, spec in enumerate(head)}
    specs.sort(key=lambda spec: -spec[3].numel() * spec[1] * spec[2])
    plan.specs = specs
    plan_cache.keep_chunks(plan)
    return specs
