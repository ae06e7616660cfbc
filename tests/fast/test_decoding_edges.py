"""The decoding cache's thresholds and bounds at their exact edges (``plsh_fast/decoding.py``).

Pinned where an inequality alone would let a weaker rule pass: the dense-counts path is
taken up to and including ``_DENSE_PAIRS`` (query, key) pairs; :func:`binary64_bound` at
hand-computed values (``proofs_notes/decoding_cache.md`` section 2); the runtime check of
the held keys allows :func:`binary64_bound` where it exceeds ``bound`` and refuses one key
more; the order checks refuse a repeated position (equality) and accept the next one.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _torch_lazy import take_lazy_imports

from plsh_fast import decoding
from plsh_fast.decoding import PLSHDecodingCache, binary64_bound, cache_bound, reachable_keys
from plsh_ref import PartitionSample, draw_partition

take_lazy_imports()  # once per process (tests/_torch_lazy.py)
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/fast/conftest.py


def _part(pitch, offset=None):
    pitch = np.atleast_2d(np.asarray(pitch, dtype=np.float64))
    offset = np.zeros_like(pitch) if offset is None else np.atleast_2d(offset)
    return PartitionSample(pitch, offset)


def _qkv(n, heads=1, d=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, heads, n, d, generator=g, dtype=dtype) for _ in range(3)]


# ----------------------------------------------------------------------- the dense path


@pytest.fixture
def full_calls(monkeypatch):
    """Counts the calls that go through plsh_fast.plsh_attention instead of dense counts."""
    calls = []
    real = decoding.plsh_attention

    def counted(*args, **kwargs):
        calls.append(args[1].shape[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(decoding, "plsh_attention", counted)
    return calls


def test_the_dense_path_serves_up_to_exactly_dense_pairs(full_calls):
    assert decoding._DENSE_PAIRS == 1 << 16
    part = draw_partition([8.0], num_samples=2, seed=0)
    side = 256  # a prefill of 256 queries against 256 keys: 65536 pairs, the dense path
    q, k, v = _qkv(side + 1)
    dense = PLSHDecodingCache(part).update(q[:, :, :side], k[:, :, :side], v[:, :, :side])
    assert full_calls == []
    full = PLSHDecodingCache(part).update(q, k, v)  # 257 * 257 pairs: the general path
    assert full_calls == [side + 1]
    torch.testing.assert_close(full[:, :, :side], dense, rtol=1e-12, atol=1e-12)


def test_the_full_attention_path_gets_the_scale_positions_and_check_finite(full_calls):
    """A call past ``_DENSE_PAIRS`` (through :func:`plsh_fast.plsh_attention`) with a given
    scale and positions with gaps far from 0: the rows of the same tokens fed in calls of
    the dense path; with ``check_finite=False`` a NaN value is let through (no refusal), to
    the row of its own token at least."""
    part = draw_partition([8.0], num_samples=2, seed=0)
    n = 257
    q, k, v = _qkv(n)
    pos = torch.tensor([1000 + 2 * i + (i % 3 == 0) for i in range(n)])
    once = PLSHDecodingCache(part, scale=0.3).update(q, k, v, query_positions=pos)
    assert full_calls == [n]
    chunked = PLSHDecodingCache(part, scale=0.3)
    cuts = [0, 128, 200, n]
    rows = [
        chunked.update(*(t[:, :, a:b] for t in (q, k, v)), query_positions=pos[a:b])
        for a, b in zip(cuts[:-1], cuts[1:])
    ]
    assert full_calls == [n]  # the chunks took the dense path
    torch.testing.assert_close(once, torch.cat(rows, dim=2), rtol=1e-12, atol=1e-12)
    bad = v.clone()
    bad[0, 0, 100, 0] = math.nan
    out = PLSHDecodingCache(part, scale=0.3).update(
        q, k, bad, query_positions=pos, check_finite=False
    )
    assert full_calls == [n, n] and torch.isnan(out[0, 0, 100]).any()


# ----------------------------------------------------------------------- binary64_bound


@pytest.mark.parametrize(
    "pitch, position, expected",
    [
        # B = (|p| / pitch + 1) 2**-52 (the other terms vanish in binary64):
        (4.0, 0, 5),  # (1 + 2**-51) 4 = 4 + 2**-49 -> 5
        (3.5, 0, 4),  # just above 3.5 -> 4
        (8.0, 2**52, 11),  # B = 1/8 + 2**-52: (1.25 + 2**-51) 8 = 10 + 2**-48 -> 11
        (8.0, -(2**52), 11),  # |p|
        (2.0, 2**52, 5),
        # 3.5 + |p| / 2**51 just below 4: the "+ 1" term decides between 4 and 5
        (3.5, 2**50 - 5, 4),
        (3.5, 2**50 - 3, 5),  # B = 1/2 + 2**-52: (2 + 2**-51) 2 = 4 + 2**-50 -> 5
    ],
)
def test_binary64_bound_at_hand_computed_values(pitch, position, expected):
    assert binary64_bound(_part([[pitch]]), position) == expected


def test_binary64_bound_is_the_largest_over_heads_and_samples():
    part = _part([[2.0, 9.0, 3.0], [4.0, 1.0, 7.5]])
    assert binary64_bound(part, 0) == 10  # ceil(9 (1 + 2**-51)) from the middle sample
    assert cache_bound(part) == 10  # max ceil(pitch) + 1


def test_the_tiny_rounding_terms_are_below_binary64_resolution():
    """Why 2**-106 and 2**-1075 in :func:`binary64_bound` never change its value (they are
    the exact bound's terms, kept for the derivation)."""
    assert 2.0**-52 + 2.0**-106 == 2.0**-52
    assert 2.0**-1075 == 0.0


# ----------------------------------------------------------------------- the held-keys check


def _decode_steps(cache, n, seed=0):
    q, k, v = _qkv(n, seed=seed)
    for i in range(n):
        cache.update(q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1])


def test_the_held_keys_check_allows_binary64_bound_and_not_one_more(monkeypatch):
    part = _part([[4.0]])  # bins [0, 4), [4, 8): after position 7, keys 4..7 are held
    held = 4
    # bound below the held keys, binary64_bound exactly the held keys: allowed
    cache = PLSHDecodingCache(part)
    cache.bound = held - 1
    monkeypatch.setattr(decoding, "binary64_bound", lambda partition, p: held)
    _decode_steps(cache, 8)
    assert int(cache.cached_tokens()[0]) == held
    # both one below the held keys: refused
    cache = PLSHDecodingCache(part)
    cache.bound = held - 1
    monkeypatch.setattr(decoding, "binary64_bound", lambda partition, p: held - 1)
    with pytest.raises(RuntimeError) as err:
        _decode_steps(cache, 8)
    assert str(err.value) == (
        "decoding cache: 4 keys exceed the bound 3 (proofs_notes/decoding_cache.md); "
        "please report this"
    )
    # bound itself larger than binary64_bound: the larger of the two is the limit
    cache = PLSHDecodingCache(part)
    cache.bound = held
    monkeypatch.setattr(decoding, "binary64_bound", lambda partition, p: 1)
    _decode_steps(cache, 8)
    assert int(cache.cached_tokens()[0]) == held


def test_the_held_keys_check_reads_the_newest_position(monkeypatch):
    seen = []

    def spy(partition, p):
        seen.append(p)
        assert partition is part  # the cache's own partition
        return 10

    part = _part([[4.0]])
    cache = PLSHDecodingCache(part)
    cache.bound = 1
    monkeypatch.setattr(decoding, "binary64_bound", spy)
    q, k, v = _qkv(3)
    cache.update(q, k, v, query_positions=[100, 101, 102])
    assert seen == [102]


# ----------------------------------------------------------------------- order checks


def test_a_repeated_position_is_refused_and_the_next_one_accepted():
    part = draw_partition([8.0], num_samples=2, seed=0)
    q, k, v = _qkv(3)
    cache = PLSHDecodingCache(part)
    with pytest.raises(ValueError, match="^query_positions: must increase strictly along"):
        cache.update(q[:, :, :2], k[:, :, :2], v[:, :, :2], query_positions=[5, 5])
    cache.update(q[:, :, :2], k[:, :, :2], v[:, :, :2], query_positions=[5, 6])
    with pytest.raises(ValueError, match="^query_positions: must increase strictly along"):
        fresh = PLSHDecodingCache(part)  # a step back that is still after the first position
        fresh.update(q, k, v, query_positions=[0, 5, 3])
    assert fresh.batch_size == 0  # refused before any change
    with pytest.raises(ValueError, match="^query_positions: decode step out of order"):
        cache.update(q[:, :, 2:], k[:, :, 2:], v[:, :, 2:], query_positions=[6])
    cache.update(q[:, :, 2:], k[:, :, 2:], v[:, :, 2:], query_positions=[7])
    assert cache.cached_positions(0)[-1] == 7


def test_default_positions_continue_after_the_newest():
    part = draw_partition([8.0], num_samples=2, seed=0)
    q, k, v = _qkv(4)
    cache = PLSHDecodingCache(part)
    cache.update(q[:, :, :2], k[:, :, :2], v[:, :, :2], query_positions=[10, 11])
    cache.update(q[:, :, 2:], k[:, :, 2:], v[:, :, 2:])
    assert cache.cached_positions(0).tolist()[-2:] == [12, 13]
    fresh = PLSHDecodingCache(part)
    fresh.update(q, k, v)
    assert fresh.cached_positions(0).tolist()[0] in (0, 1, 2, 3)
    assert fresh.cached_positions(0).tolist()[-1] == 3


# ----------------------------------------------------------------------- the eviction rule


def test_reachable_keys_refuses_mismatched_ranks_and_non_int64():
    kb = torch.zeros((1, 1, 4), dtype=torch.int64)
    with pytest.raises(ValueError, match="^reference_bins: rank 2 differs"):
        reachable_keys(kb, torch.zeros((1, 1), dtype=torch.int64))
    with pytest.raises(TypeError, match="^key_bins: must be an int64"):
        reachable_keys(kb.to(torch.int32), kb[..., :1])
    with pytest.raises(TypeError, match="^reference_bins: must be an int64"):
        reachable_keys(kb, kb[..., :1].double())


def test_reachable_keys_is_any_sample_of_any_head():
    # key bins (heads 2, samples 2, L 3); reference bin 1 everywhere
    kb = torch.tensor([[[0, 0, 1], [0, 0, 0]], [[0, 1, 1], [0, 0, 0]]], dtype=torch.int64)
    ref = torch.ones((2, 2, 1), dtype=torch.int64)
    assert reachable_keys(kb, ref).tolist() == [False, True, True]
    # one head reaching key 1 is enough; one sample is enough
    assert reachable_keys(kb[:1], ref[:1]).tolist() == [False, False, True]
    assert reachable_keys(kb[:, 1:], ref[:, 1:]).tolist() == [False, False, False]


def test_cache_bound_rounds_up_the_largest_pitch():
    assert cache_bound(_part([[2.0, 3.25], [1.0, 3.0]])) == math.ceil(3.25) + 1
    assert cache_bound(_part([[4.0]])) == 5


def test_live_keys_that_are_not_a_suffix_are_a_runtime_error(monkeypatch):
    """A defensive check (unreachable while bins are monotone in the position): a rule that
    kept keys out of order would be reported, not silently mis-evicted."""

    def holes(key_bins, reference_bins):
        live = torch.ones(key_bins.shape[-1], dtype=torch.bool)
        live[-1] = False
        return live

    monkeypatch.setattr(decoding, "reachable_keys", holes)
    cache = PLSHDecodingCache(_part([[4.0]]))
    q, k, v = _qkv(3)
    with pytest.raises(RuntimeError) as err:
        cache.update(q, k, v)
    assert str(err.value) == "decoding cache: live keys are not a suffix (positions out of order?)"


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"dtype": torch.float32},
            r"^query: dtype torch\.float32 differs from the cache's torch\.float64 ",
        ),
        ({"d": 8}, r"^query: head_dim 8 differs from the cache's 4 "),
        ({"d_v": 8}, r"^value: head_dim 8 differs from the cache's 4 "),
    ],
    ids=["dtype", "head_dim", "head_dim_v"],
)
def test_a_call_unlike_the_first_names_what_differs(change, message):
    """A later call whose dtype or head sizes differ from the first call's is refused naming
    the argument and the field (it printed two bare tuples), and leaves the cache as it was."""
    cache = PLSHDecodingCache(_part([[3.0, 5.0]]))
    cache.update(*_qkv(4), query_positions=torch.arange(4))
    q, k, v = _qkv(1, d=change.get("d", 4), dtype=change.get("dtype", torch.float64))
    if "d_v" in change:
        v = torch.zeros(1, 1, 1, change["d_v"], dtype=torch.float64)
    before = (cache.cached_tokens(), cache.last_positions())
    with pytest.raises(ValueError, match=message):
        cache.update(q, k, v, query_positions=torch.tensor([4]))
    assert torch.equal(cache.cached_tokens(), before[0])
    assert torch.equal(cache.last_positions(), before[1])
    cache.update(*_qkv(1, seed=1), query_positions=torch.tensor([4]))  # still serves its shape
