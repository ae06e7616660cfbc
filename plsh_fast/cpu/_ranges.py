"""Block ranges of the CPU path (package docstring, step 1).

Keys and queries are sorted by position; bins are non-decreasing in the position, so the
keys sharing a query's bin in sample ``t`` are one contiguous range of sorted keys
``[start_t(i), end_t(i))``: two ``searchsorted`` calls, or, for consecutive key positions,
elementwise arithmetic on the bin boundaries (:func:`block_ranges_unit_steps`). The causal
cut clips the ends (:func:`clip`).
"""

from __future__ import annotations

import torch

from .._partition import bins

__all__ = ["block_ranges", "block_ranges_unit_steps", "clip"]


def block_ranges(pitch, offset, qpos, kpos, causal: bool):
    """``(start, end, cut, bins)``: each query's block of sorted keys, before the causal cut.

    ``pitch``, ``offset``: float64 ``(1, s)``, one head's partition; ``qpos``, ``kpos``:
    sorted int64 positions. ``start``, ``end``: int64 ``(s, n_q)``, the sorted keys sharing
    the query's bin in sample ``t`` are ``[start, end)``. Bins are non-decreasing along
    sorted positions (floor of a monotone, correctly rounded map), so each bin is one
    contiguous run of sorted keys. ``cut``: int64 ``(n_q,)``, the number of keys with
    ``p_key <= p_query`` (causal), or ``None`` when not causal. ``bins``: int64
    ``(s, n_q)``, the query bins.
    """
    bq = bins(pitch, offset, qpos)
    if _unit_steps(kpos) and _small(kpos) and _small(qpos) and _small_partition(pitch, offset):
        start, end = block_ranges_unit_steps(pitch, offset, bq, kpos)
    else:
        bk = bins(pitch, offset, kpos).contiguous()
        start = torch.searchsorted(bk, bq, right=False)
        end = torch.searchsorted(bk, bq, right=True)
    cut = torch.searchsorted(kpos, qpos, right=True) if causal else None
    return start[0], end[0], cut, bq[0]


def clip(start: torch.Tensor, end: torch.Tensor, cut) -> torch.Tensor:
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


def block_ranges_unit_steps(pitch, offset, bq, kpos):
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
