"""The batched decode step of PLSHDecodingCache (the ring of plsh_fast/decoding.py) against
the general path: same outputs, same held keys, exact bin edges."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from plsh_fast.decoding import PLSHDecodingCache  # noqa: E402
from plsh_ref import alibi_slopes, draw_partition  # noqa: E402
from plsh_ref.partition import PartitionSample  # noqa: E402
from plsh_ref.partition import bins as ref_bins  # noqa: E402


def _run(part, q, k, v, prefill, mask=None, positions=None, general=False):
    """Prefill, then one token per call; ``general`` forces the per-sequence path."""
    cache = PLSHDecodingCache(part)
    cache._general_only = general
    outs, held = [], []
    n = q.shape[2]
    cuts = [0, prefill, *range(prefill + 1, n + 1)]
    for a, b in zip(cuts[:-1], cuts[1:]):
        pos = None if positions is None or positions[a] is None else positions[a]
        am = mask[:, a:b] if (mask is not None and a == 0) else None
        outs.append(
            cache.update(
                q[:, :, a:b],
                k[:, :, a:b],
                v[:, :, a:b],
                query_positions=pos,
                attention_mask=am,
                return_lse=True,
            )
        )
        held.append(cache.cached_tokens().tolist())
    return cache, outs, held


def _qkv(batch, heads, heads_kv, n, d, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(batch, heads, n, d, generator=g, dtype=dtype),
        torch.randn(batch, heads_kv, n, d, generator=g, dtype=dtype),
        torch.randn(batch, heads_kv, n, d + 2, generator=g, dtype=dtype),
    )


@pytest.mark.parametrize("heads_kv", [4, 2])
def test_the_step_equals_the_general_path(heads_kv):
    """Left-padded batch, GQA, many wraps of the ring (small sigma: bound about 30,
    300 steps) and more than one block of consecutive steps."""
    part = draw_partition(0.1 / alibi_slopes(4), num_samples=8, seed=2)
    q, k, v = _qkv(3, 4, heads_kv, 340, 8)
    mask = torch.ones(3, 40, dtype=torch.bool)
    mask[1, :7] = False
    mask[2, :25] = False
    ring, outs, held = _run(part, q, k, v, 40, mask=mask)
    assert ring._buffers is not None  # the steps ran on the ring
    general, ref_outs, ref_held = _run(part, q, k, v, 40, mask=mask, general=True)
    assert general._buffers is None
    assert held == ref_held
    for (o, l_), (ro, rl) in zip(outs, ref_outs):
        torch.testing.assert_close(o, ro, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(l_, rl, rtol=1e-12, atol=1e-12)
    for b in range(3):  # back to per-sequence tensors: same keys, positions, bins
        assert torch.equal(ring.cached_positions(b), general.cached_positions(b))
        assert torch.equal(ring.key_bins(b), general.key_bins(b))


def test_steps_with_gaps_and_a_float32_model_equal_the_general_path():
    """Explicit positions with gaps (the exact edge search instead of the running one),
    then consecutive steps again; float32 within a few float32 ulps of the general path."""
    part = draw_partition(0.5 / alibi_slopes(4), num_samples=16, seed=4)
    q, k, v = _qkv(2, 4, 4, 120, 16, dtype=torch.float32)
    positions = [None] * 120
    base = 1000
    for i in range(30, 60):  # steps 30..59 jump by 3 positions each
        positions[i] = torch.tensor([[base + 3 * i], [base + 3 * i + 1]])
    positions[0] = torch.arange(30)
    ring, outs, held = _run(part, q, k, v, 30, positions=positions)
    _, ref_outs, ref_held = _run(part, q, k, v, 30, positions=positions, general=True)
    assert held == ref_held
    for (o, _), (ro, _) in zip(outs, ref_outs):
        torch.testing.assert_close(o, ro, rtol=2e-5, atol=2e-6)


def test_bin_edges_are_exact():
    """``L``, the first integer position of a position's bin, against a brute-force scan
    of plsh_ref.partition.bins, for pitches below and above one token and positions up
    to 2**50."""
    rng = np.random.default_rng(7)
    pitch = np.concatenate([rng.uniform(0.3, 1.0, 20), rng.uniform(1.0, 40.0, 44)])
    pitch = pitch.reshape(2, 32)
    offset = pitch * rng.random(pitch.shape)
    part = PartitionSample(pitch, offset)
    q, k, v = _qkv(1, 2, 2, 2, 4)
    cache = PLSHDecodingCache(part)
    cache.update(q, k, v)
    cache.update(q[:, :, :1], k[:, :, :1], v[:, :, :1])
    ring = cache._buffers
    for p in [0, 1, 17, 12345, 2**31 + 5, 2**40 + 3, 2**50 - 100]:
        edges = ring._edges(np.array([p]))[0]
        back = p - np.arange(0, 45)
        b = ref_bins(part, back)  # (H, s, 45)
        same = b == b[..., :1]
        first_other = np.argmin(same, axis=-1)  # steps back to the first other bin
        assert np.array_equal(edges, p - first_other + 1), p


def test_positions_near_two_to_the_fifty_three_take_the_general_path():
    """Beyond ``|p| + pitch <= 2**50`` the ring may not take a step exactly; the cache
    then runs the general path (same results, same bound checks)."""
    part = draw_partition(1.0 / alibi_slopes(2), num_samples=4, seed=1)
    q, k, v = _qkv(1, 2, 2, 40, 4)
    start = 2**53 - 60
    positions = [None] * 40
    positions[0] = torch.arange(start, start + 10)
    _, outs, held = _run(part, q, k, v, 10, positions=positions)
    _, ref_outs, ref_held = _run(part, q, k, v, 10, positions=positions, general=True)
    assert held == ref_held
    for (o, _), (ro, _) in zip(outs, ref_outs):
        torch.testing.assert_close(o, ro, rtol=1e-12, atol=1e-12)


def _ring_pair(part, q, k, v, prefill, steps):
    """Two caches fed the same prefill and ``steps`` decode steps (the ring made)."""
    caches = [PLSHDecodingCache(part) for _ in range(2)]
    for cache in caches:
        cache.update(q[:, :, :prefill], k[:, :, :prefill], v[:, :, :prefill])
        for j in range(prefill, prefill + steps):
            cache.update(q[:, :, j : j + 1], k[:, :, j : j + 1], v[:, :, j : j + 1])
    return caches


def test_a_decode_step_like_the_checked_ones_skips_the_general_checks(monkeypatch):
    """The fast gate: once the ring runs, a step of the checked shapes, dtype and device
    (positions none, the next ones in any accepted form, or a CPU all-real bool mask) is
    taken without the general checks (here made to fail) and gives the rows of a cache
    that takes every step the same way."""
    part = draw_partition(0.25 / alibi_slopes(2), num_samples=4, seed=1)
    q, k, v = _qkv(2, 2, 1, 60, 8, dtype=torch.float32)
    cache, twin = _ring_pair(part, q, k, v, 30, 2)
    assert cache.ring_steps == 2

    def refused(*args, **kwargs):
        raise AssertionError("the general checks ran")

    for name in ("_check_call", "_deprecated_positions"):
        monkeypatch.setattr(cache, name, refused)
    real = torch.ones(2, 1, dtype=torch.bool)
    calls = [
        {},
        {"query_positions": torch.tensor([33])},
        {"query_positions": torch.tensor([[34], [34]])},
        {"query_positions": torch.tensor([[35]])},
        {"attention_mask": real},
        {"attention_mask": real, "query_positions": torch.tensor([37])},
        {"return_lse": True},
        {"check_finite": False},
    ]
    for i, kwargs in enumerate(calls):
        j = slice(32 + i, 33 + i)
        got = cache.update(q[:, :, j], k[:, :, j], v[:, :, j], **kwargs)
        want = twin.update(q[:, :, j], k[:, :, j], v[:, :, j], return_lse=kwargs == calls[6])
        if kwargs == calls[6]:
            torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
            got, want = got[0], want[0]
        assert torch.equal(got, want), kwargs
    assert cache.ring_steps == twin.ring_steps == 2 + len(calls)


def test_decode_step_positions_the_gate_does_not_take_get_the_general_refusals():
    """The gate takes int64 CPU positions of the accepted shapes within ``|p| < 2**53``
    only; any other (a float tensor, one position per sequence as a flat ``(batch,)``,
    ``-2**53``, which also precedes every position) gets the general checks' refusal,
    naming what is wrong; the ring is unchanged."""
    part = draw_partition(0.25 / alibi_slopes(2), num_samples=4, seed=1)
    q, k, v = _qkv(2, 2, 1, 40, 8, dtype=torch.float32)
    cache, _ = _ring_pair(part, q, k, v, 30, 2)
    j = slice(32, 33)
    refused = [
        (TypeError, "^query_positions: must be an integer tensor", torch.tensor([32.0])),
        (ValueError, "^query_positions: must have length 1, got 2", torch.tensor([32, 32])),
        (
            ValueError,
            "^query_positions: \\|position\\| must be < 2\\*\\*53",
            torch.tensor([-(2**53)]),
        ),
        (ValueError, "^query_positions: \\|position\\| must be < 2\\*\\*53", torch.tensor([2**53])),
        (ValueError, "^query_positions: decode step out of order", torch.tensor([1 - 2**53])),
    ]
    for error, match, positions in refused:
        with pytest.raises(error, match=match):
            cache.update(q[:, :, j], k[:, :, j], v[:, :, j], query_positions=positions)
    assert cache.ring_steps == 2 and cache.last_positions().tolist() == [31, 31]


def test_a_step_while_a_sequence_holds_no_key_takes_the_general_path():
    """A sequence that was all padding so far holds no key: the step that brings its first
    real token (position 0) runs the general path, and the ring takes the next one; the
    rows are the general path's."""
    part = draw_partition(0.25 / alibi_slopes(2), num_samples=4, seed=1)
    q, k, v = _qkv(2, 2, 1, 12, 8)
    mask = torch.tensor([[True] * 10, [False] * 10])
    caches = [PLSHDecodingCache(part) for _ in range(2)]
    caches[1]._general_only = True
    rows = []
    for cache in caches:
        out = [cache.update(q[:, :, :10], k[:, :, :10], v[:, :, :10], attention_mask=mask)]
        assert cache.last_positions().tolist() == [9, -1]
        out.append(cache.update(q[:, :, 10:11], k[:, :, 10:11], v[:, :, 10:11]))
        assert cache.ring_steps == 0 and cache.last_positions().tolist() == [10, 0]
        out.append(cache.update(q[:, :, 11:], k[:, :, 11:], v[:, :, 11:]))
        rows.append(out)
    assert caches[0].ring_steps == 1 and caches[1].ring_steps == 0
    for got, want in zip(*rows):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_one_position_for_the_whole_batch_after_a_gap_serves_every_sequence():
    """A decode step's explicit position given once, ``(1,)`` or ``(1, 1)``, after a gap
    (so not the planned consecutive run) is every sequence's: the rows equal those of the
    same position given per sequence, ``(batch, 1)``."""
    part = draw_partition(0.25 / alibi_slopes(2), num_samples=4, seed=1)
    q, k, v = _qkv(2, 2, 1, 40, 8)
    cache, twin = _ring_pair(part, q, k, v, 30, 2)
    for i, shared in enumerate([torch.tensor([40]), torch.tensor([[45]])]):
        j = slice(32 + i, 33 + i)
        got = cache.update(q[:, :, j], k[:, :, j], v[:, :, j], query_positions=shared)
        each = shared.reshape(1, 1).expand(2, 1).clone()
        want = twin.update(q[:, :, j], k[:, :, j], v[:, :, j], query_positions=each)
        assert torch.equal(got, want), shared
    assert cache.last_positions().tolist() == [45, 45] and cache.ring_steps == 4
