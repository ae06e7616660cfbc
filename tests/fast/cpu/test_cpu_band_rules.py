"""The band rules of the CPU path (``plsh_fast/cpu/_band.py``) on hand-made inputs.

End to end (``tests/fast/cpu/test_cpu_band.py``) a band window wider than needed, or more
zero rows of padding than needed, gives the same attention: only the work grows. These
tests pin the rules themselves: a band head's window ``[g T + c, g T + c + W)`` spans
exactly the smallest start and the largest end of its tiles that have keys (a tile of one
key counts, an empty one does not); groups hold at most ``CHUNK_ELEMENTS`` logits, one tile
at least; the padding is the least that puts every band window inside the keys, read
only from band heads.
"""

from __future__ import annotations

import types

import pytest
import torch

from plsh_fast import cpu

band = cpu._band


def _specs(tile, lo, hi, h=0):
    lo, hi = torch.tensor(lo), torch.tensor(hi)
    n = lo.numel()
    width = hi - lo
    st = torch.arange(2 * n).reshape(2, n)
    en = st + 1
    new = torch.arange(n) + 100
    return list(band.band_specs(h, tile, lo, hi, width, st, en, None, new))


def test_the_window_spans_the_tiles_with_keys():
    # tile 4: tile g's first row 4 g; windows relative to it: [-2, 3), [0, 5), [1, 2)
    (spec,) = _specs(4, lo=[-2, 4, 9], hi=[3, 9, 10])
    h, tile, w, sel, lo, st, en, cut, new = spec
    assert (h, tile, w) == (0, 4, 7)  # c = -2, c + W = 5
    assert sel.tolist() == [0, 1, 2] and lo.tolist() == [-2, 2, 6]
    assert st.tolist() == [[0, 1, 2], [3, 4, 5]] and en.tolist() == [[1, 2, 3], [4, 5, 6]]
    assert cut is None and new.tolist() == [100, 101, 102]


def test_empty_tiles_do_not_widen_the_window_and_one_key_does():
    # tile 1 is empty (width 0) with a far start; tile 2 holds one key, the furthest end
    (spec,) = _specs(4, lo=[0, -50, 8], hi=[4, -50, 13])
    assert spec[2] == 5 and spec[4].tolist() == [0, 4, 8]  # c = 0, c + W = 13 - 8 = 5
    (spec,) = _specs(4, lo=[0, 4, 12], hi=[2, 6, 13])  # last tile: one key, at 12
    assert spec[2] == 5  # its relative end 13 - 8 = 5 is the largest: c = 0, W = 5
    (spec,) = _specs(4, lo=[3, 4], hi=[4, 8])  # tile 0: one key, at relative 3
    assert spec[2] == 4 and spec[4].tolist() == [0, 4]  # c = 0 (tile 1), end 4
    assert _specs(4, lo=[0, 4], hi=[0, 4]) == []  # no tile with keys: no work items


def test_groups_hold_at_most_chunk_elements_logits_and_one_tile_at_least(monkeypatch):
    lo, hi = [0, 4, 8, 12, 16], [4, 8, 12, 16, 20]  # tile 4, W 4: 16 logits per tile
    monkeypatch.setattr(cpu, "CHUNK_ELEMENTS", 32)
    assert [s[3].tolist() for s in _specs(4, lo, hi)] == [[0, 1], [2, 3], [4]]
    monkeypatch.setattr(cpu, "CHUNK_ELEMENTS", 47)
    assert [s[3].tolist() for s in _specs(4, lo, hi)] == [[0, 1], [2, 3], [4]]
    monkeypatch.setattr(cpu, "CHUNK_ELEMENTS", 48)
    assert [s[3].tolist() for s in _specs(4, lo, hi)] == [[0, 1, 2], [3, 4]]
    monkeypatch.setattr(cpu, "CHUNK_ELEMENTS", 1)  # less than one tile: one tile per group
    assert [s[3].tolist() for s in _specs(4, lo, hi)] == [[0], [1], [2], [3], [4]]
    specs = _specs(4, lo, hi)
    assert [s[4].tolist() for s in specs] == [[0], [4], [8], [12], [16]]
    assert [s[8].tolist() for s in specs] == [[100], [101], [102], [103], [104]]


def _plan(bands, n_k):
    return types.SimpleNamespace(band=bands, n_k=n_k)


def _spec(h, w, lo):
    return (h, 4, w, None, torch.tensor(lo))


def test_band_padding_is_the_least_that_holds_every_window():
    plan = _plan([True, True, False, True], n_k=16)
    assert band.band_padding(plan, [], 1) == (0, set())  # nothing banded: no padding
    # window [0, 4) .. [12, 16): inside the keys
    assert band.band_padding(plan, [_spec(0, 4, [0, 4, 8, 12])], 1) == (0, {0})
    # a window starting 3 before the first key: 3 zero rows
    assert band.band_padding(plan, [_spec(0, 4, [-3, 1])], 1) == (3, {0})
    # a window ending 2 past the last key: lo[-1] + w - n_k = 14 + 4 - 16
    assert band.band_padding(plan, [_spec(1, 4, [2, 14])], 1) == (2, {1})
    # the larger of the two ends, over every band spec; kv heads by the group
    specs = [_spec(0, 4, [-1, 3]), _spec(1, 6, [5, 15]), _spec(3, 4, [0])]
    assert band.band_padding(plan, specs, 2) == (5, {0, 1})


def test_band_padding_ignores_heads_that_are_not_bands_and_empty_specs():
    plan = _plan([False, True], n_k=8)
    # head 0 is not a band: its (far) window neither pads nor marks a kv head
    assert band.band_padding(plan, [_spec(0, 4, [-20, 30])], 1) == (0, set())
    assert band.band_padding(plan, [_spec(1, 4, [])], 1) == (0, set())  # no tiles
    assert band.band_padding(plan, [_spec(0, 4, [-20]), _spec(1, 4, [-1])], 1) == (1, {1})


def test_band_heads_need_equal_strictly_increasing_positions(monkeypatch):
    monkeypatch.setattr(cpu, "BAND_MAX_TILE", 32)
    monkeypatch.setattr(cpu, "BAND_TILE", 32)
    pos = torch.arange(100)
    assert band.band_heads(pos, pos, [8, 32, 33]) == ([32, 32, 33], [True, True, False])
    assert band.band_heads(pos, pos.clone(), [8])[1] == [True]
    assert band.band_heads(pos, pos + 1, [8])[1] == [False]  # other positions
    assert band.band_heads(pos, torch.arange(101), [8])[1] == [False]  # other length
    rep = torch.tensor([0, 1, 1, 2])
    assert band.band_heads(rep, rep, [8])[1] == [False]  # a repeated position
    # the band tile is at most the power of two at or above n_q
    assert band.band_heads(torch.arange(5), torch.arange(5), [2])[0] == [8]
    assert band.band_heads(torch.arange(8), torch.arange(8), [2])[0] == [8]
    assert band.band_heads(torch.arange(9), torch.arange(9), [2])[0] == [16]
    assert band.band_heads(torch.arange(1), torch.arange(1), [2])[0] == [1]
    monkeypatch.setattr(cpu, "BAND_MAX_TILE", 0)
    assert band.band_heads(pos, pos, [8])[1] == [False]


@pytest.mark.parametrize("tile", [4, 8])
def test_chunk_band_needs_consecutive_tiles_one_tile_apart(tile):
    sel, lo = torch.tensor([2, 3, 4]), torch.tensor([1, 1 + tile, 1 + 2 * tile])
    assert band.chunk_band(True, sel, lo, tile) == (2 * tile, 1)
    assert band.chunk_band(False, sel, lo, tile) is None
    assert band.chunk_band(True, torch.tensor([2, 4, 5]), lo, tile) is None
    assert band.chunk_band(True, sel, torch.tensor([1, 1 + tile, 2 + 2 * tile]), tile) is None
