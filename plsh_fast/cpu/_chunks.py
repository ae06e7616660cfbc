"""A tile group's indices and count bias (package docstring, steps 3, 5 and 6).

:class:`Chunk` is one stacked call's work: ``G`` query tiles of ``T`` rows, each with a
key window of ``W`` keys, their bias and empty rows, and how to take and put its rows and
windows. :func:`make_chunk` builds it from a work item of the plan
(:meth:`plsh_fast.cpu._planning.Plan.head_specs`): the counts as a difference array summed
along the keys (step 5, :func:`window_bias`), read from the table of ``log(c / s)``
(:func:`log_count_table`), computed for the first row of each cell and copied to the cell's
rows when cells are few (step 6). A chunk kept in a plan (step 8) holds its counts in the
smallest integer dtype instead of its bias (:meth:`Chunk.compact`, uint8 for ``s <= 255``:
a quarter of a float32 bias) and reads the bias back from the table at each use
(:meth:`Chunk.expand`), bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from plsh_ref.partition import count_bias

from . import _band as band_rules
from . import _settings as settings
from ._ranges import clip
from ._rows import gather

__all__ = ["Chunk", "count_dtype", "log_count_table", "make_chunk", "window_bias"]


@dataclass
class Chunk:
    """One call's work: ``G`` query tiles of ``T`` rows, each with a key window of ``W``."""

    head: int
    rows: torch.Tensor  # (G, T) indices into the padded sorted query rows
    keys: torch.Tensor  # (G, W) indices into the sorted keys (clamped; extra keys have count 0)
    #: (G, T, W) log(C / s) (-inf where C = 0), compute dtype; ``None`` in a compact chunk
    bias: torch.Tensor | None
    empty: torch.Tensor  # (G, T) bool, rows without any admissible key
    #: ``(first row, first key)`` of a band chunk (step 4, :mod:`plsh_fast.cpu._band`): its
    #: rows are consecutive and tile ``g``'s keys are ``first key + g T + [0, W)``, possibly
    #: starting before 0 or ending past ``n_k`` (those keys have count 0); else ``None``.
    band: tuple[int, int] | None = None
    #: (G, T, W) counts ``C`` in :func:`count_dtype` of a compact chunk (:meth:`compact`),
    #: else ``None``; ``keys`` is then int32
    counts: torch.Tensor | None = None

    def compact(self, log_counts: torch.Tensor) -> Chunk:
        """This chunk with its counts in place of its bias, and int32 key indices (step 8).

        The bias holds only entries of ``log_counts`` (:func:`log_count_table`, strictly
        increasing from ``-inf``), so ``searchsorted`` recovers each count exactly;
        :meth:`expand` gives back a bias equal bit for bit. ``uint8`` counts are a quarter
        of a float32 bias and an eighth of a float64 one.
        """
        assert self.bias is not None  # a chunk with its bias (not compact yet)
        counts = torch.searchsorted(log_counts, self.bias.reshape(-1))
        counts = counts.to(count_dtype(log_counts.numel() - 1)).view(self.bias.shape)
        return replace(self, bias=None, counts=counts, keys=self.keys.to(torch.int32))

    def expand(self, log_counts: torch.Tensor) -> Chunk:
        """A compact chunk (:meth:`compact`) with its bias read from ``log_counts`` again:
        ``(G, T, W)`` in the table's dtype, equal bit for bit to the bias it was made from."""
        assert self.counts is not None  # a compact chunk
        index = self.counts.reshape(-1).to(torch.int32)
        bias = log_counts.index_select(0, index).view(self.counts.shape)
        return replace(self, bias=bias, counts=None, keys=self.keys.long())

    def nbytes(self) -> int:
        """Bytes held by the chunk's tensors (indices, bias or counts, empty rows)."""
        held = (self.rows, self.keys, self.bias, self.empty, self.counts)
        return sum(t.numel() * t.element_size() for t in held if t is not None)

    def take_rows(self, x: torch.Tensor) -> torch.Tensor:
        """The chunk's rows of ``x`` (B, n, ...) as ``(B, G, T, ...)`` (a view for a band)."""
        if self.band is not None:
            g, t = self.rows.shape
            return x[:, self.band[0] : self.band[0] + g * t].unflatten(1, (g, t))
        return gather(x, self.rows)

    def take_keys(self, x: torch.Tensor) -> torch.Tensor:
        """The chunk's key windows of ``x`` (B, n_k, d) as ``(B, G, W, d)``."""
        return gather(x, self.keys)

    def put_rows(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``dst`` (B, n, ...) rows of the chunk ``= src`` (B, G, T, ...); rows are disjoint."""
        if self.band is not None:
            dst[:, self.band[0] : self.band[0] + self.rows.numel()] = src.flatten(1, 2)
            return
        dst.index_copy_(1, self.rows.reshape(-1), src.flatten(1, 2))

    def add_keys(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``dst`` (B, n_k, d) rows of the key windows ``+= src`` (B, G, W, d)."""
        flat, src = self.keys.reshape(-1), src.flatten(1, 2)
        for b in range(dst.shape[0]):  # dim 0 of a contiguous row block: see gather
            dst[b].index_add_(0, flat, src[b])


def make_chunk(plan, h, tile, w, sel, lo, st, en, cut, new) -> Chunk:
    """The :class:`Chunk` of one work item ``(h, tile, w, sel, lo, st, en, cut, new)`` of
    ``plan`` (a :class:`plsh_fast.cpu._planning.Plan`): rows, key windows, empty rows and
    the count bias, per row (step 5) or per cell (step 6)."""
    rows = sel[:, None] * tile + torch.arange(tile)
    # Clamped at both ends: keys outside [0, n_k) (band windows) have count 0.
    keys = (lo[:, None] + torch.arange(w)).clamp_(0, max(plan.n_k - 1, 0))
    band = band_rules.chunk_band(plan.band[h], sel, lo, tile)
    clipped = clip(st, en, cut)
    empty = (clipped <= st).all(dim=0)
    cell = new.cumsum(dim=1).sub_(1)  # (G, T) cell of each row
    cells = int(cell[:, -1].max()) + 1
    if cells > settings.PATTERN_ROWS_FRACTION * tile:
        # Rows change blocks often (small sigma): count every row's ranges directly.
        bias = window_bias(plan.log_counts, st, clipped, lo, w)
        return Chunk(h, rows, keys, bias, empty, band)
    bias = _cell_bias(plan.log_counts, st, en, cut, lo, w, cell, cells)
    return Chunk(h, rows, keys, bias, empty, band)


def _cell_bias(log_counts, st, en, cut, lo, w, cell, cells) -> torch.Tensor:
    """Few cells (step 6): count the first row of each cell over its blocks (before the
    causal cut), copy that row to the cell's rows, then mask the keys past each row's cut.
    ``(G, T, w)``, bit-identical to :func:`window_bias` of every row's clipped ranges."""
    g, tile = cell.shape
    first = torch.full((g, cells), tile - 1).scatter_reduce_(
        1, cell, torch.arange(tile).expand(g, tile), "amin"
    )
    first = first.expand(st.shape[0], g, cells)
    pattern = window_bias(log_counts, st.gather(2, first), en.gather(2, first), lo, w)
    pick = (cell + cells * torch.arange(g)[:, None]).view(-1)
    bias = pattern.view(g * cells, w).index_select(0, pick).view(g, tile, w)
    if cut is not None:
        rel_cut = cut - lo[:, None]  # keys at or past it: inadmissible
        c0 = max(int(rel_cut.min()), 0)
        if c0 < w:
            past = torch.arange(c0, w) >= rel_cut[..., None]
            bias[..., c0:].masked_fill_(past, -math.inf)  # log 0: inadmissible
    return bias


def window_bias(log_counts, st, en, lo, w) -> torch.Tensor:
    """``log(C / s)`` over the window ``[lo, lo + w)`` of ranges ``[st, en)`` (s, G, R).

    A difference array of the counts (+1 at each start, -1 at each end, ranges clamped
    to the window; empty ranges cancel), summed along the keys in int32, then read from
    the table ``log_counts`` (:func:`log_count_table`; the masked bias where ``C = 0``):
    ``(G, R, w)``.
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
    return log_counts.index_select(0, counts.view(-1)).view(g, r, w)


def count_dtype(num_samples: int) -> torch.dtype:
    """Smallest dtype holding the counts ``0..num_samples`` of a compact chunk:
    ``torch.uint8`` up to 255 samples, then ``torch.int16``, then ``torch.int32``."""
    if num_samples <= 255:
        return torch.uint8
    return torch.int16 if num_samples <= 32767 else torch.int32


def log_count_table(num_samples: int, dtype: torch.dtype) -> torch.Tensor:
    """``log(c / s)`` for ``c = 0..s`` in ``dtype`` (``-inf`` for ``c = 0``), ``(s + 1,)``.

    Rounded once from float64, so that the softmax's LSE is directly
    ``log sum_j exp(scale q_i . k_j) C_ij / s``: subtracting ``log s`` from a float32
    LSE afterwards would cancel catastrophically when the LSE is far below ``log s``.
    """
    table = count_bias(np.arange(num_samples + 1), num_samples)  # table[0] = -inf: weight 0
    return torch.from_numpy(table).to(dtype)
