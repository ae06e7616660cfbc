"""Band heads of the CPU path (package docstring, step 4).

A head whose tiles are at most ``BAND_MAX_TILE`` rows (small pitches), when queries and
keys have the same sorted positions, takes tiles of ``BAND_TILE`` consecutive rows whose
key windows are all ``[g T + c, g T + c + W)`` (:func:`band_heads`, :func:`band_specs`):
equally spaced windows, read as one strided view of the keys and values padded with zero
rows at both ends (:func:`band_padding`, :func:`pad_rows`, :func:`window_view`), and key
gradients added back in phases of disjoint windows (:func:`add_windows`). Nothing is
gathered.
"""

from __future__ import annotations

import torch

from . import _settings as settings

__all__ = [
    "add_windows",
    "band_heads",
    "band_padding",
    "band_specs",
    "chunk_band",
    "key_windows",
    "pad_rows",
    "padded_kv",
    "window_view",
]


def band_heads(qpos: torch.Tensor, kpos: torch.Tensor, tiles: list[int]):
    """``(tiles, band)``: the tile height of every head and whether it runs as a band.

    Bands need the same sorted positions for queries and keys, so that a tile's window
    moves by the tile height from one tile to the next, and no repeated position (a run of
    equal positions widens every band window by its length). A band head's tile is
    ``BAND_TILE`` (at most the power of two above ``n_q``).
    """
    n_q = qpos.numel()
    same = n_q == kpos.numel() and torch.equal(qpos, kpos) and bool((qpos.diff() > 0).all())
    band = [same and t <= settings.BAND_MAX_TILE for t in tiles]
    cap = 1 << max(0, (max(n_q, 1) - 1).bit_length())
    tiles = [min(settings.BAND_TILE, cap) if b else t for t, b in zip(tiles, band)]
    return tiles, band


def band_specs(h, tile, lo, hi, width, st, en, cut, new):
    """Work items of a band head: consecutive tiles in groups of at most
    ``CHUNK_ELEMENTS`` logits, every window ``[g T + c, g T + c + W)`` with ``c`` the
    smallest start and ``c + W`` the largest end relative to the tile's first row."""
    num_tiles = lo.numel()
    first = torch.arange(num_tiles) * tile
    active = width > 0
    if not bool(active.any()):
        return
    c = int((lo - first)[active].min())
    w = int((hi - first)[active].max()) - c
    cap = max(1, settings.CHUNK_ELEMENTS // (tile * w))
    for i in range(0, num_tiles, cap):
        j = min(i + cap, num_tiles)
        sel = torch.arange(i, j)
        cut_ij = None if cut is None else cut[i:j]
        yield (h, tile, w, sel, sel * tile + c, st[:, i:j], en[:, i:j], cut_ij, new[i:j])


def chunk_band(is_band: bool, sel: torch.Tensor, lo: torch.Tensor, tile: int):
    """``(first row, first key)`` of a chunk of a band head whose tiles ``sel`` are
    consecutive with windows starting ``lo`` one tile height apart, else ``None``."""
    if is_band and bool((sel.diff() == 1).all()) and bool((lo.diff() == tile).all()):
        return int(sel[0]) * tile, int(lo[0])
    return None


def band_padding(plan, specs, group: int) -> tuple[int, set]:
    """``(pad, kv heads)``: zero rows needed at each end of the keys so that every band
    window lies inside, and the kv heads that band heads read."""
    pad, kv = 0, set()
    for h, _, w, _, lo, *_ in specs:
        if plan.band[h] and lo.numel():
            pad = max(pad, -int(lo[0]), int(lo[-1]) + w - plan.n_k)
            kv.add(h // group)
    return pad, kv


def pad_rows(x: torch.Tensor, pad: int) -> torch.Tensor:
    """``x`` (B, n, d) with ``pad`` zero rows before and after, contiguous."""
    return torch.nn.functional.pad(x, (0, 0, pad, pad)) if pad else x.contiguous()


def window_view(chunk, padded: torch.Tensor, pad: int) -> torch.Tensor:
    """The key windows of a band chunk as a strided view ``(B, G, W, d)`` of
    ``padded`` (B, pad + n_k + pad, d), contiguous; windows overlap (read only)."""
    g, t = chunk.rows.shape
    w = chunk.keys.shape[1]
    b, _, d = padded.shape
    start = padded.storage_offset() + (chunk.band[1] + pad) * d
    return padded.as_strided((b, g, w, d), (padded.stride(0), t * d, d, 1), start)


def add_windows(chunk, padded: torch.Tensor, src: torch.Tensor, pad: int) -> None:
    """``padded`` (B, pad + n_k + pad, d) ``+=`` the key windows ``src`` (B, G, W, d) of a
    band chunk: in ``M = ceil(W / T)`` phases of every ``M``-th tile, whose windows are
    ``M T >= W`` apart, so that each phase is one in-place add on a strided view of
    disjoint rows (no index list, unlike ``Chunk.add_keys``)."""
    g, t = chunk.rows.shape
    w, d = src.shape[2], src.shape[3]
    phases = -(-w // t)
    base = padded.storage_offset() + (chunk.band[1] + pad) * padded.stride(1)
    for m in range(min(phases, g)):
        part = src[:, m::phases]
        view = padded.as_strided(
            (padded.shape[0], part.shape[1], w, d),
            (padded.stride(0), phases * t * padded.stride(1), padded.stride(1), 1),
            base + m * t * padded.stride(1),
        )
        view.add_(part)


def padded_kv(plan, specs, group: int, k: list, v: list) -> tuple[int, dict]:
    """``(pad, padded)``: the zero rows at each end (:func:`band_padding`) and, for every
    kv head that band heads read, its keys and values (B, pad + n_k + pad, d) padded so
    (:func:`pad_rows`); band windows are strided views of these."""
    pad, band_kv = band_padding(plan, specs, group)
    return pad, {hk: (pad_rows(k[hk], pad), pad_rows(v[hk], pad)) for hk in band_kv}


def key_windows(chunk, k: torch.Tensor, v: torch.Tensor, padded, pad: int):
    """The key and value windows ``(B, G, W, d)`` of ``chunk`` from its kv head's keys
    ``k`` and values ``v`` (B, n_k, d): strided views of ``padded`` (that head's entry of
    :func:`padded_kv`) for a band chunk, gathered copies otherwise."""
    if chunk.band is not None:
        return window_view(chunk, padded[0], pad), window_view(chunk, padded[1], pad)
    return chunk.take_keys(k), chunk.take_keys(v)
