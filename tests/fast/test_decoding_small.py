"""PLSHDecodingCache at tiny sizes, every function pinned (``plsh_fast/decoding.py``).

The decoding cache against the general (non-decoding) path, the full-sequence
:func:`plsh_fast.plsh_attention` of each sequence's real tokens on the same partition, and
its decode step (the ring) against its own per-sequence path (a cache with the ring
switched off), at sizes that take milliseconds: two heads, three samples, a bound of 5
keys, so that a few dozen steps wrap the ring many times. Also each refusal with its full
message, each public parameter's other value, the state accessors and the memory
accounting. The long and statistical decodes are in ``test_decoding.py`` and
``test_decoding_step.py``.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import numpy as np
import pytest
import torch
from _torch_lazy import take_lazy_imports

from plsh_fast import decoding, plsh_attention
from plsh_fast.decoding import DecodingErrorBound, PLSHDecodingCache, cache_bound, reachable_keys
from plsh_ref import PartitionSample
from plsh_ref.bounds import max_norm_error_bound
from plsh_ref.partition import bins as ref_bins
from plsh_ref.partition import counts as ref_counts

take_lazy_imports()  # once per process (tests/_torch_lazy.py)
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/fast/conftest.py


# pitches below and above one token, offsets inside the bins: bound ceil(3.2) + 1 = 5
PITCH = np.array([[1.5, 2.5, 3.2], [2.0, 0.7, 2.9]])
OFFSET = np.array([[0.3, 1.1, 0.0], [1.9, 0.2, 2.5]])
PART = PartitionSample(PITCH, OFFSET)
TOL = {"rtol": 1e-12, "atol": 1e-12}


def _qkv(batch, heads_kv, n, d, dtype=torch.float64, seed=0, heads=2, d_v=None):
    g = torch.Generator().manual_seed(seed)
    d_v = d + 1 if d_v is None else d_v
    return (
        torch.randn(batch, heads, n, d, generator=g, dtype=torch.float64).to(dtype),
        torch.randn(batch, heads_kv, n, d, generator=g, dtype=torch.float64).to(dtype),
        torch.randn(batch, heads_kv, n, d_v, generator=g, dtype=torch.float64).to(dtype),
    )


def _cols(t, a, b):
    return t[:, :, a:b]


def _feed(cache, q, k, v, cuts, positions=None, mask=None, lse=True):
    """Calls over ``q[:, :, a:b]`` for consecutive cuts; ``positions[i]``/``mask[i]`` per call."""
    outs, held, last = [], [], []
    for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        kwargs = {}
        if positions is not None and positions[i] is not None:
            kwargs["query_positions"] = positions[i]
        if mask is not None and mask[i] is not None:
            kwargs["attention_mask"] = mask[i]
        want_lse = lse if isinstance(lse, bool) else lse[i]
        got = cache.update(
            _cols(q, a, b), _cols(k, a, b), _cols(v, a, b), return_lse=want_lse, **kwargs
        )
        outs.append(got)
        held.append(cache.cached_tokens().tolist())
        last.append(cache.last_positions().tolist())
    return outs, held, last


def _general(part=PART, **kwargs):
    """A cache that never takes the ring (its per-sequence path only)."""
    cache = PLSHDecodingCache(part, **kwargs)
    cache._general_only = True
    return cache


def _full_rows(part, q, k, v, pos, scale=None):
    """The general path: full-sequence plsh_attention of one sequence's real tokens."""
    pos = torch.as_tensor(pos, dtype=torch.int64)
    return plsh_attention(
        q,
        k,
        v,
        partition=part,
        causal=True,
        scale=scale,
        query_positions=pos,
        key_positions=pos,
        return_lse=True,
    )


def _assert_same(outs, ref_outs, **tol):
    tol = tol or TOL
    assert len(outs) == len(ref_outs)
    for got, want in zip(outs, ref_outs):
        assert type(got) is type(want)
        if isinstance(got, tuple):
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and g.shape == w.shape
                torch.testing.assert_close(g, w, **tol)
        else:
            assert got.dtype == want.dtype and got.shape == want.shape
            torch.testing.assert_close(got, want, **tol)


# ------------------------------------------------------------------ ring == general path


@pytest.mark.parametrize(
    "heads_kv, d, block",
    [(2, 64, 5), (2, 16, 5), (1, 16, 2), (1, 4, 1)],
    ids=["block-capacity", "block-5", "gqa-block-2", "gqa-block-1"],
)
def test_the_ring_equals_the_per_sequence_path_and_the_full_attention(heads_kv, d, block):
    """A left-padded batch, prefill then 24 steps (the ring wraps about five times, blocks
    of several steps used up and planned again): the same rows, LSE, held keys, positions
    and bins as the per-sequence path, and the rows of the full-sequence attention."""
    batch, prefill, n = 2, 6, 30
    q, k, v = _qkv(batch, heads_kv, n, d)
    mask0 = torch.ones(batch, prefill, dtype=torch.bool)
    mask0[1, :2] = False  # sequence 1: 4 real prompt tokens, positions 0..3
    cuts = [0, prefill, *range(prefill + 1, n + 1)]
    masks = [mask0] + [None] * (n - prefill)
    lse = [True] + [i % 3 != 1 for i in range(n - prefill)]  # both return forms on the ring
    ring = PLSHDecodingCache(PART)
    outs, held, last = _feed(ring, q, k, v, cuts, mask=masks, lse=lse)
    assert ring._buffers is not None and ring.ring_steps == n - prefill
    assert ring._buffers.block_size == block
    general = _general()
    ref_outs, ref_held, ref_last = _feed(general, q, k, v, cuts, mask=masks, lse=lse)
    assert general._buffers is None and general.ring_steps == 0
    _assert_same(outs, ref_outs)
    assert held == ref_held and last == ref_last
    assert max(max(h) for h in held) <= ring.bound == 5
    assert last[-1] == [n - 1, n - 3]
    # against the full-sequence attention of each sequence's real tokens
    for b, first in ((0, 0), (1, 2)):
        rows = [t[b : b + 1, :, first:] for t in (q, k, v)]
        full, full_lse = _full_rows(PART, *rows, torch.arange(n - first))
        got = torch.cat([o[0] if isinstance(o, tuple) else o for o in outs], dim=2)
        torch.testing.assert_close(got[b : b + 1, :, first:], full, **TOL)
        step_lse = torch.cat([o[1][b : b + 1, :, -1:] for o in outs[1:] if isinstance(o, tuple)], 2)
        steps_kept = [prefill + i for i in range(n - prefill) if lse[i + 1]]
        torch.testing.assert_close(step_lse, full_lse[..., [s - first for s in steps_kept]], **TOL)
    assert torch.equal(outs[0][0][1, :, :2], torch.zeros(2, 2, d + 1, dtype=torch.float64))
    assert torch.isneginf(outs[0][1][1, :, :2]).all()
    # back in per-sequence tensors: the same keys, values, positions and bins
    assert torch.equal(ring.live_tokens(), general.live_tokens())
    for b in range(batch):
        assert torch.equal(ring.cached_positions(b), general.cached_positions(b))
        assert torch.equal(ring.key_bins(b), general.key_bins(b))
        assert torch.equal(ring._key[b], general._key[b])
        assert torch.equal(ring._value[b], general._value[b])
    assert ring._last == general._last == [n - 1, n - 3]
    # and decoding goes on from there (a new ring) with the same rows
    more = _qkv(batch, heads_kv, 3, d, seed=1)
    _assert_same(_feed(ring, *more, [0, 1, 2, 3])[0], _feed(general, *more, [0, 1, 2, 3])[0])
    assert ring.ring_steps == n - prefill + 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_steps_compute_in_float32_and_return_the_input_dtype(dtype):
    q, k, v = _qkv(2, 1, 14, 8, dtype=dtype)
    cuts = [0, 4, *range(5, 15)]
    ring, general = PLSHDecodingCache(PART), _general()
    outs, held, _ = _feed(ring, q, k, v, cuts)
    ref_outs, ref_held, _ = _feed(general, q, k, v, cuts)
    assert ring.ring_steps == 10 and held == ref_held
    for (o, l_), (ro, rl) in zip(outs, ref_outs):
        assert o.dtype == dtype and l_.dtype == rl.dtype == torch.float32
        # float32 kernels of two orders of summation; bfloat16 rows rounded once from them
        tol = (
            {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 8e-3, "atol": 8e-3}
        )
        torch.testing.assert_close(o, ro, **tol)
        torch.testing.assert_close(l_, rl, rtol=1e-5, atol=1e-5)
    # against float64 (the general path's rows computed from the same rounded inputs)
    full, _ = _full_rows(PART, *(t[:1].double() for t in (q, k, v)), torch.arange(14))
    got = torch.cat([o[:1] for o, _ in outs], dim=2).double()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, full, rtol=tol, atol=tol)


def test_a_given_scale_is_used_by_both_paths():
    q, k, v = _qkv(2, 2, 12, 4)
    cuts = [0, 5, *range(6, 13)]
    outs, _, _ = _feed(PLSHDecodingCache(PART, scale=0.3), q, k, v, cuts)
    ref_outs, _, _ = _feed(_general(scale=0.3), q, k, v, cuts)
    _assert_same(outs, ref_outs)
    full, full_lse = _full_rows(PART, *(t[1:] for t in (q, k, v)), torch.arange(12), scale=0.3)
    got = torch.cat([o for o, _ in outs], dim=2)[1:]
    torch.testing.assert_close(got, full, **TOL)
    default, _, _ = _feed(PLSHDecodingCache(PART), q, k, v, cuts)
    assert not torch.allclose(default[-1][0], outs[-1][0])  # negative control: scale matters


def test_explicit_positions_on_the_ring_gaps_and_every_form():
    """Steps with gaps (each ring step's bin edges found exactly), the shared forms
    ``(1,)`` and ``(1, 1)``, per sequence ``(batch, 1)``, and positions that continue every
    sequence (the planned run of consecutive steps): the per-sequence path's rows."""
    q, k, v = _qkv(2, 1, 16, 16)
    cuts = [0, 4, *range(5, 17)]
    positions = [
        torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23]]),
        torch.tensor([[14], [30]]),  # next / gap
        torch.tensor([[19], [31]]),  # gap / next
        torch.tensor([40]),  # shared, a gap for both
        None,
        torch.tensor([[42]]),  # shared, the next of both: the planned run
        torch.tensor([[43], [43]]),  # the next of both, per sequence
        torch.tensor([[44], [44]]),
        torch.tensor([47]),
        torch.tensor([[48], [60]]),
        None,
        None,
        torch.tensor([[51], [63]]),
    ]
    ring, general = PLSHDecodingCache(PART), _general()
    outs, held, last = _feed(ring, q, k, v, cuts, positions=positions)
    ref_outs, ref_held, ref_last = _feed(general, q, k, v, cuts, positions=positions)
    _assert_same(outs, ref_outs)
    assert held == ref_held and last == ref_last
    assert last[-1] == [51, 63] and ring.ring_steps == 12
    for b in range(2):
        assert torch.equal(ring.cached_positions(b), general.cached_positions(b))
    # the full-sequence attention at these positions (sequence 1)
    pos1 = [20, 21, 22, 23, 30, 31, 40, 41, 42, 43, 44, 47, 60, 61, 62, 63]
    full, _ = _full_rows(PART, *(t[1:] for t in (q, k, v)), pos1)
    torch.testing.assert_close(torch.cat([o for o, _ in outs], dim=2)[1:], full, **TOL)


def test_explicit_next_positions_take_the_planned_block():
    """Positions that continue every sequence by one (generate()'s position_ids) plan the
    block of consecutive steps, as no positions do; a gap plans a block of one step."""
    q, k, v = _qkv(1, 2, 12, 16)
    cache = PLSHDecodingCache(PART)
    cache.update(*(t[:, :, :4] for t in (q, k, v)))
    cache.update(*(t[:, :, 4:5] for t in (q, k, v)), query_positions=torch.tensor([4]))
    ring = cache._buffers
    assert ring.block_size == 5 and ring._block.size == 5 and ring._block.next == 1
    cache.update(*(t[:, :, 5:6] for t in (q, k, v)), query_positions=torch.tensor([[5]]))
    assert ring._block.size == 5 and ring._block.next == 2
    cache.update(*(t[:, :, 6:7] for t in (q, k, v)), query_positions=torch.tensor([9]))
    assert ring._block.size == 1 and ring._block.next == 1
    cache.update(*(t[:, :, 7:8] for t in (q, k, v)))  # from an exact L: consecutive again
    assert ring._block.size == 5 and ring._block.next == 1
    assert cache.ring_steps == 4


@pytest.mark.parametrize(
    "heads, d, pitch, block",
    [(1, 16, 70.0, 64), (2, 2, 70.0, 17), (1, 8, 3.0, 4)],
    ids=["64-steps", "memory", "capacity"],
)
def test_a_block_is_64_steps_at_most_and_its_run_lengths_a_quarter_of_the_ring(
    heads, d, pitch, block
):
    """Up to 64 steps are planned at once, no more than the ring's capacity, and no more
    than a quarter of the keys' and values' bytes go to their run lengths."""
    part = PartitionSample(np.full((heads, 1), pitch), np.zeros((heads, 1)))
    q, k, v = _qkv(1, heads, 3, d, heads=heads, d_v=d)
    cache = PLSHDecodingCache(part)
    cache.update(*(t[:, :, :2] for t in (q, k, v)))
    cache.update(*(t[:, :, 2:] for t in (q, k, v)))
    ring = cache._buffers
    capacity = cache_bound(part)
    assert ring.key.shape[2] == capacity
    ring_bytes = 2 * heads * capacity * d * 8  # keys and values, float64
    per_step = 2 * heads * (1 + 1) * 8  # int64 run lengths of one step: 2 (s + 1) per head
    assert ring._block.size == block == min(64, capacity, max(1, ring_bytes // 4 // per_step))
    assert ring._block.repeats.shape == (block, 2 * heads * 2)
    assert ring._block.repeats.dtype == torch.int64


def _unpatched_bound(monkeypatch, allowed=10):
    monkeypatch.setattr(decoding, "binary64_bound", lambda partition, p: allowed)


def test_a_step_that_would_overwrite_a_live_key_runs_the_general_path(monkeypatch):
    """A ring narrower than the live keys (as binary64 bins can make it near ``2**53``,
    here by a lowered bound): the block is cut before the step that would overwrite a
    live key, that step runs the general path, and a new, wider ring takes the next."""
    part = PartitionSample(np.array([[4.0]]), np.array([[0.0]]))  # bins [0, 4), [4, 8), ...
    _unpatched_bound(monkeypatch)
    q, k, v = _qkv(1, 1, 16, 16, heads=1)
    cuts = [0, 5, *range(6, 17)]
    caches = []
    for general in (False, True):
        cache = _general(part) if general else PLSHDecodingCache(part)
        cache.bound = 2
        caches.append((cache, _feed(cache, q, k, v, cuts)))
    (ring, (outs, held, last)), (_, (ref_outs, ref_held, ref_last)) = caches
    _assert_same(outs, ref_outs)
    assert held == ref_held and last == ref_last
    assert [h[0] for h in held] == [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4]
    # step 5 on the ring (column of no key), 6 and 7 not (their oldest key is live), 8 on
    # a ring of 4 columns, ...: every step from 8 on
    assert ring.ring_steps == 1 + 8
    assert ring._buffers.key.shape[2] == 4 and not ring._general_only
    full, _ = _full_rows(part, q, k, v, torch.arange(16))
    torch.testing.assert_close(torch.cat([o for o, _ in outs], dim=2), full, **TOL)


def test_a_step_whose_bin_edges_are_not_bracketed_runs_the_general_path(monkeypatch):
    """Where the edge search cannot bracket a bin edge (only possible beyond ``|p| +
    pitch <= 2**50``; simulated here for positions 7 and 20), the step runs the general
    path; a ring started without the newest query's edges plans that one step exactly."""
    real = decoding._StepRing._edges

    def unbracketed(self, pos):
        return None if np.isin(pos, [7, 20]).any() else real(self, pos)

    monkeypatch.setattr(decoding._StepRing, "_edges", unbracketed)
    q, k, v = _qkv(1, 2, 14, 16)
    cuts = [0, 8, *range(9, 15)]
    positions = [None, None, None, torch.tensor([20]), None, None, torch.tensor([[30]])]
    ring = PLSHDecodingCache(PART)
    outs, held, last = _feed(ring, q, k, v, cuts, positions=positions)
    ref_outs, ref_held, ref_last = _feed(_general(), q, k, v, cuts, positions=positions)
    _assert_same(outs, ref_outs)
    assert held == ref_held and last == ref_last
    assert [x[0] for x in last] == [7, 8, 9, 20, 21, 22, 30]
    assert ring.ring_steps == 5  # all but the step to 20
    assert not ring._general_only


def test_a_fallback_step_keeps_check_finite_off_and_return_lse(monkeypatch):
    """The general path of a step the ring cannot take gets the caller's ``return_lse``
    and no second finiteness check (``check_finite=False`` lets a NaN through)."""
    monkeypatch.setattr(decoding._StepRing, "plan", lambda self, pos: False)  # no step on the ring
    q, k, v = _qkv(1, 2, 6, 4)
    cache = PLSHDecodingCache(PART)
    cache.update(*(t[:, :, :4] for t in (q, k, v)))
    cache.update(*(t[:, :, 4:5] for t in (q, k, v)))
    assert cache.ring_steps == 0 and cache._buffers is None
    bad = v[:, :, 5:6].clone()
    bad[0, 0, 0, 0] = float("nan")
    out = cache.update(q[:, :, 5:6], k[:, :, 5:6], bad, check_finite=False)
    assert not isinstance(out, tuple) and torch.isnan(out).any()
    assert int(cache.last_positions()[0]) == 5


# ------------------------------------------------------------------ the fast gate


def _ring_cache(batch=2, heads_kv=1, n=40, d=4, prefill=6, steps=2, dtype=torch.float64, seed=0):
    q, k, v = _qkv(batch, heads_kv, n, d, dtype=dtype, seed=seed)
    caches = [PLSHDecodingCache(PART) for _ in range(2)]
    for cache in caches:
        cache.update(*(t[:, :, :prefill] for t in (q, k, v)))
        for j in range(prefill, prefill + steps):
            cache.update(*(t[:, :, j : j + 1] for t in (q, k, v)))
    return caches, (q, k, v)


def test_a_decode_step_like_the_checked_ones_skips_the_general_checks(monkeypatch):
    (cache, twin), (q, k, v) = _ring_cache()

    def refused(*args, **kwargs):
        raise AssertionError("the general checks ran")

    for name in ("_check_call", "_deprecated_positions", "_new_positions", "_can_step"):
        monkeypatch.setattr(cache, name, refused)
    real = torch.ones(2, 1, dtype=torch.bool)
    calls = [
        {},
        {"query_positions": torch.tensor([9])},
        {"query_positions": torch.tensor([[10], [10]])},
        {"query_positions": torch.tensor([[11]])},
        {"attention_mask": real},
        {"attention_mask": real, "query_positions": torch.tensor([13])},
        {"return_lse": True},
        {"check_finite": False},
        {"query_positions": torch.tensor([2**50 - 10])},  # far ahead: a block of one step
    ]
    for i, kwargs in enumerate(calls):
        j = slice(8 + i, 9 + i)
        got = cache.update(q[:, :, j], k[:, :, j], v[:, :, j], **kwargs)
        want = twin.update(
            q[:, :, j], k[:, :, j], v[:, :, j],
            query_positions=kwargs.get("query_positions"),
            return_lse=kwargs.get("return_lse", False),
        )  # fmt: skip
        _assert_same([got], [want])
    assert cache.ring_steps == twin.ring_steps == 2 + len(calls)


@pytest.mark.parametrize(
    "change",
    ["query_batch", "key_heads", "value_dim", "dtype", "meta", "layout", "mask"],
)
def test_a_step_unlike_the_checked_ones_gets_the_general_checks(change):
    """Each of the gate's conditions alone sends a step to the general checks, which
    refuse it (so a gate that let it through would not refuse it, or not so)."""
    (cache, _), (q, k, v) = _ring_cache()
    qs, ks, vs = (t[:, :, 8:9] for t in (q, k, v))
    kwargs = {}
    if change == "query_batch":
        qs, error = qs[:1], ValueError
    elif change == "key_heads":
        ks, error = torch.cat([ks, ks], dim=1), ValueError
    elif change == "value_dim":
        vs, error = vs[..., :2], ValueError
    elif change == "dtype":
        qs, ks, vs = qs.float(), ks.float(), vs.float()
        error = ValueError
    elif change == "meta":
        qs, ks, vs = (t.float().to("meta") for t in (qs, ks, vs))
        error = (ValueError, TypeError)
    elif change == "layout":
        qs, error = qs.to_sparse(), TypeError
    else:
        kwargs["attention_mask"], error = torch.full((2, 1), 2), ValueError
    before = (cache.cached_tokens(), cache.last_positions(), cache.ring_steps)
    with pytest.raises(error):
        cache.update(qs, ks, vs, **kwargs)
    assert torch.equal(cache.cached_tokens(), before[0])
    assert torch.equal(cache.last_positions(), before[1]) and cache.ring_steps == before[2]


@pytest.mark.parametrize("which", ["query", "key", "value"])
def test_each_of_the_three_tensors_is_checked_by_the_gate(which):
    """The gate compares each of query, key and value (shape, dtype): one of them alone
    unlike the checked calls gets the general refusal naming it."""
    (cache, _), (q, k, v) = _ring_cache()
    t = {"query": q, "key": k, "value": v}
    step = {name: x[:, :, 8:9] for name, x in t.items()}
    wrong_dtype = dict(step)
    wrong_dtype[which] = step[which].float()
    with pytest.raises((TypeError, ValueError), match=f"^({which}|query|key|value)"):
        cache.update(wrong_dtype["query"], wrong_dtype["key"], wrong_dtype["value"])
    wrong_shape = dict(step)
    wrong_shape[which] = torch.cat([step[which], step[which]], dim=2)
    with pytest.raises(ValueError):
        cache.update(wrong_shape["query"], wrong_shape["key"], wrong_shape["value"])
    assert cache.ring_steps == 2
    for name in ("query", "key", "value"):
        if name != which:
            continue
        sparse = dict(step)
        sparse[name] = step[name].to_sparse()
        with pytest.raises(TypeError, match=f"^{name}: "):
            cache.update(sparse["query"], sparse["key"], sparse["value"])
    assert cache.ring_steps == 2


def test_positions_the_gate_does_not_take_get_the_general_path():
    """Positions the gate leaves to the general checks: another integer dtype or a list
    (accepted there: the same rows), a flat ``(batch,)`` (refused), ``+-2**53`` (refused
    naming the range)."""
    (cache, twin), (q, k, v) = _ring_cache()
    j = slice(8, 9)
    got = cache.update(
        q[:, :, j], k[:, :, j], v[:, :, j], query_positions=torch.tensor([8], dtype=torch.int32)
    )
    want = twin.update(q[:, :, j], k[:, :, j], v[:, :, j])
    _assert_same([got], [want])
    j = slice(9, 10)
    got = cache.update(q[:, :, j], k[:, :, j], v[:, :, j], query_positions=[[9], [9]])
    _assert_same([got], [twin.update(q[:, :, j], k[:, :, j], v[:, :, j])])
    refused = [
        ("^query_positions: must have length 1, got 2", torch.tensor([10, 10])),
        (r"^query_positions: \|position\| must be < 2\*\*53", torch.tensor([-(2**53)])),
        (r"^query_positions: \|position\| must be < 2\*\*53", torch.tensor([2**53])),
        (r"^query_positions: \|position\| must be < 2\*\*53", torch.tensor([[2**53], [10]])),
    ]
    for match, positions in refused:
        with pytest.raises(ValueError, match=match):
            cache.update(q[:, :, j], k[:, :, j], v[:, :, j], query_positions=positions)
    assert cache.last_positions().tolist() == [9, 9]


def test_a_step_behind_a_sequence_names_it():
    (cache, _), (q, k, v) = _ring_cache()
    j = slice(8, 9)
    for positions, message in [
        (torch.tensor([[9], [7]]), "sequence 1: position 7 after 7"),
        (torch.tensor([[6], [9]]), "sequence 0: position 6 after 7"),
        (torch.tensor([7]), "sequence 0: position 7 after 7"),
    ]:
        with pytest.raises(ValueError) as err:
            cache.update(q[:, :, j], k[:, :, j], v[:, :, j], query_positions=positions)
        assert str(err.value) == f"query_positions: decode step out of order for {message}"
    assert cache.ring_steps == 2 and cache.last_positions().tolist() == [7, 7]


def test_a_padded_decode_step_runs_the_general_path():
    """A step with a pad token (mask False for one sequence): that sequence gets no key and
    a zero row (LSE ``-inf``), the other its row; then the ring again."""
    (cache, _), (q, k, v) = _ring_cache()
    general = _general()
    general.update(*(t[:, :, :6] for t in (q, k, v)))
    for j in (6, 7):
        general.update(*(t[:, :, j : j + 1] for t in (q, k, v)))
    for c in (cache, general):
        pad = torch.tensor([[True], [False]])
        out, lse = c.update(
            q[:, :, 8:9], k[:, :, 8:9], v[:, :, 8:9], attention_mask=pad, return_lse=True
        )
        assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.isneginf(lse[1]).all()
        assert c.last_positions().tolist() == [8, 7]
    assert cache.ring_steps == 2
    for j in (9, 10):
        _assert_same(
            [cache.update(*(t[:, :, j : j + 1] for t in (q, k, v)))],
            [general.update(*(t[:, :, j : j + 1] for t in (q, k, v)))],
        )
    assert cache.ring_steps == 4 and cache.last_positions().tolist() == [10, 9]


def test_an_integer_mask_is_the_bool_one():
    q, k, v = _qkv(2, 1, 6, 4)
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    outs = []
    for m in (mask, mask.bool()):
        cache = PLSHDecodingCache(PART)
        o = cache.update(*(t[:, :, :5] for t in (q, k, v)), attention_mask=m, return_lse=True)
        o2 = cache.update(*(t[:, :, 5:] for t in (q, k, v)), attention_mask=m[:, :1])
        outs.append((o, o2, cache.cached_positions(1).tolist()))
    _assert_same([outs[0][0], outs[0][1]], [outs[1][0], outs[1][1]])
    assert outs[0][2] == outs[1][2] == [0, 1, 2]  # the step's pad token is no key
    with pytest.raises(ValueError) as err:
        PLSHDecodingCache(PART).update(q, k, v, attention_mask=torch.full((2, 6), 2))
    assert str(err.value) == "attention_mask: integer masks must hold only 0 and 1"


# ------------------------------------------------------------------ finiteness


def test_the_step_runs_the_element_wise_check_only_for_a_non_finite_sum(monkeypatch):
    (cache, _), (q, k, v) = _ring_cache()
    calls = []
    real = decoding.V.check_finite

    def spy(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(decoding.V, "check_finite", spy)
    cache.update(*(t[:, :, 8:9] for t in (q, k, v)))
    assert calls == []  # finite sums prove the step finite

    def big(t):  # finite, its sum 1e308 finite, two such sums overflow
        return torch.full_like(t, 1e308 / t.numel())

    cache.update(q[:, :, 9:10], big(k[:, :, 9:10]), big(v[:, :, 9:10]))
    assert calls == [1]
    bad = v[:, :, 10:11].clone()
    bad[1, 0, 0, 2] = float("nan")
    with pytest.raises(ValueError, match="^value: contains NaN"):
        cache.update(q[:, :, 10:11], k[:, :, 10:11], bad)
    assert calls == [1, 1] and cache.ring_steps == 4
    out = cache.update(q[:, :, 10:11], k[:, :, 10:11], bad, check_finite=False)
    assert calls == [1, 1] and torch.isnan(out[1]).any() and not torch.isnan(out[0]).any()
    # the general path's one-token call: the same rule
    fresh = PLSHDecodingCache(PART)
    fresh.update(q[:1, :, :1], k[:1, :, :1], v[:1, :, :1])
    assert calls == [1, 1]  # one token: the sums decide
    fresh.update(q[:1, :, 1:2], big(k[:1, :, 1:2]), big(v[:1, :, 1:2]))
    assert calls == [1, 1, 1]
    fresh.update(q[:1, :, 2:3], k[:1, :, 2:3], v[:1, :, 2:3])
    assert calls == [1, 1, 1]
    fresh.update(q[:1, :, 3:5], k[:1, :, 3:5], v[:1, :, 3:5])  # more tokens: element-wise
    assert calls == [1, 1, 1, 1]
    kb, vb = big(k[:, :, :1]), big(v[:, :, :1])
    assert not decoding._sum_is_finite(q[:, :, :1], kb, vb)
    assert not decoding._sum_is_finite(q[:, :, :1], -kb, -vb)
    assert decoding._sum_is_finite(q[:, :, :1], kb, -vb)
    assert decoding._sum_is_finite(kb, q[:, :, :1], -vb)


# ------------------------------------------------------------------ refusals


def _message(error, call, *args, **kwargs):
    with pytest.raises(error) as err:
        call(*args, **kwargs)
    return str(err.value)


def test_the_free_functions_refuse_with_their_messages():
    kb = torch.zeros((1, 1, 4), dtype=torch.int64)
    assert _message(TypeError, reachable_keys, [0, 1], kb) == (
        "key_bins: must be an int64 torch.Tensor, got <class 'list'>"
    )
    assert _message(TypeError, reachable_keys, kb, kb.int()) == (
        "reference_bins: must be an int64 torch.Tensor, got torch.int32"
    )
    one = torch.zeros(4, dtype=torch.int64)
    assert _message(ValueError, reachable_keys, one, one[:1]) == (
        "reference_bins: rank 1 differs from key_bins' 1 (both (num_heads, num_samples, "
        "..., L or 1))"
    )
    assert _message(ValueError, reachable_keys, kb, kb[0, :, :1]) == (
        "reference_bins: rank 2 differs from key_bins' 3 (both (num_heads, num_samples, "
        "..., L or 1))"
    )
    # rank 2 (num_heads, num_samples) with one key: the smallest accepted
    two = torch.tensor([[0, 3]], dtype=torch.int64)
    assert reachable_keys(two, torch.tensor([[1, 3]])).tolist() is True
    assert (
        _message(TypeError, cache_bound, "part") == "partition: must be a PartitionSample, got str"
    )
    assert _message(TypeError, PLSHDecodingCache, None) == (
        "partition: must be a PartitionSample, got NoneType"
    )


def _two_seq_cache():
    q, k, v = _qkv(2, 2, 8, 4)
    cache = PLSHDecodingCache(PART)
    cache.update(*(t[:, :, :3] for t in (q, k, v)))
    return cache, (q, k, v)


def test_update_refuses_with_its_messages_and_leaves_the_cache_unchanged():
    cache, (q, k, v) = _two_seq_cache()
    step = [t[:, :, 3:4] for t in (q, k, v)]
    other = PartitionSample(PITCH, OFFSET + 0.1)
    cases = [
        (ValueError, "partition: differs from the partition this cache was built with "
         "(a cache serves one layer's partition only)", step, {"partition": other}),
        (ValueError, "query: 4 heads, the partition has 2",
         [torch.cat([step[0], step[0]], 1), step[1], step[2]], {}),
        (ValueError, "key: holds 2 new tokens, query 1 (one key per new token)",
         [step[0], torch.cat([step[1]] * 2, 2), torch.cat([step[2]] * 2, 2)], {}),
        (ValueError, "key: num_key_value_heads 1 differs from the cache's 2 (set by its first call)",
         [step[0], step[1][:, :1], step[2][:, :1]], {}),
        (ValueError, "query: head_dim 2 differs from the cache's 4 (set by its first call)",
         [step[0][..., :2], step[1][..., :2], step[2]], {}),
        (ValueError, "value: head_dim 3 differs from the cache's 5 (set by its first call)",
         [step[0], step[1], step[2][..., :3]], {}),
        (ValueError, "query: dtype torch.float32 differs from the cache's torch.float64 "
         "(set by its first call)", [t.float() for t in step], {}),
        (ValueError, "query: batch 1, the cache holds 2 sequences", [t[:1] for t in step], {}),
        (ValueError, "query_positions: decode step out of order for sequence 0: position 2 "
         "after 2", step, {"query_positions": [2]}),
        (ValueError, "query_positions: decode step out of order for sequence 1: position 1 "
         "after 2", [t[:, :, 3:5] for t in (q, k, v)], {"query_positions": [[5, 6], [1, 6]]}),
        (ValueError, "query_positions: must increase strictly along sequence 1",
         [t[:, :, 3:5] for t in (q, k, v)], {"query_positions": [[5, 6], [6, 6]]}),
        (ValueError, "key_positions: must equal query_positions (the new queries and keys are "
         "the same tokens)", step, {"query_positions": [3], "key_positions": [4]}),
        (TypeError, "update: takes 3 positional arguments after self, got 5", step + [[3], [3]], {}),
        (TypeError, "return_lse: must be a bool, got int", step, {"return_lse": 1}),
        (TypeError, "check_finite: must be a bool, got NoneType", step, {"check_finite": None}),
        (ValueError, "attention_mask: a meta tensor has no values; pass it on cpu", step,
         {"attention_mask": torch.ones((2, 1), dtype=torch.bool, device="meta")}),
        (ValueError, "query_positions: a meta tensor has no values; pass positions on cpu", step,
         {"query_positions": torch.empty(1, dtype=torch.int64, device="meta")}),
    ]  # fmt: skip
    for error, message, args, kwargs in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            got = _message(error, cache.update, *args, **kwargs)
        assert got == message, message
    assert cache.last_positions().tolist() == [2, 2] and cache.cached_tokens().tolist() == [3, 3]
    cache.update(*step)
    assert cache.last_positions().tolist() == [3, 3]
    # the device (float32: float64 is CPU-only)
    f32 = PLSHDecodingCache(PART)
    f32.update(*(t[:, :, :3].float() for t in (q, k, v)))
    meta = [t[:, :, 3:4].float().to("meta") for t in (q, k, v)]
    assert _message(ValueError, f32.update, *meta, check_finite=False) == (
        "query: device meta differs from the cache's cpu (set by its first call)"
    )


def test_the_fields_a_later_call_must_keep_are_checked_on_the_ring_too():
    (cache, _), (q, k, v) = _ring_cache()
    step = [t[:, :, 8:9] for t in (q, k, v)]
    message = _message(ValueError, cache.update, *(t.float() for t in step))
    assert message == (
        "query: dtype torch.float32 differs from the cache's torch.float64 (set by its first call)"
    )
    assert cache.ring_steps == 2


def test_deprecated_spellings_warn_and_still_work():
    cache, (q, k, v) = _two_seq_cache()
    twin, _ = _two_seq_cache()
    step = [t[:, :, 3:4] for t in (q, k, v)]
    want = twin.update(*step, query_positions=[5])
    with pytest.warns(DeprecationWarning) as record:
        got = cache.update(*step, [5])
    assert torch.equal(got, want)
    assert str(record[0].message) == (
        "PLSHDecodingCache.update(query, key, value, positions) is deprecated and will be "
        "removed in the next release; use update(query, key, value, query_positions=...)"
    )
    step = [t[:, :, 4:5] for t in (q, k, v)]
    want = twin.update(*step, query_positions=[7])
    with pytest.warns(DeprecationWarning) as record:
        got = cache.update(*step, positions=[7])
    assert torch.equal(got, want)
    assert str(record[0].message) == (
        "PLSHDecodingCache.update(positions=...) is deprecated and will be removed in the "
        "next release; use update(query_positions=...)"
    )
    step = [t[:, :, 5:6] for t in (q, k, v)]
    want = twin.update(*step)
    with pytest.warns(DeprecationWarning) as record:
        got = cache.update(*step, partition=PART)
    assert torch.equal(got, want)
    assert str(record[0].message) == (
        "PLSHDecodingCache.update(partition=...) is deprecated and will be removed in the next "
        "release; use the constructor's partition only (PLSHDecodingCache(partition))"
    )
    # key_positions alone, or equal to query_positions, are the new tokens' positions
    step = [t[:, :, 6:7] for t in (q, k, v)]
    assert torch.equal(
        cache.update(*step, key_positions=[11]), twin.update(*step, query_positions=[11])
    )
    step = [t[:, :, 7:8] for t in (q, k, v)]
    got = cache.update(*step, query_positions=[[12], [13]], key_positions=np.array([[12], [13]]))
    assert torch.equal(got, twin.update(*step, query_positions=[[12], [13]]))
    assert cache.last_positions().tolist() == [12, 13]


def test_select_keeps_and_reorders_sequences():
    """Beam search's reorder, on the ring and on per-sequence tensors: sequence ``i``
    becomes the old ``indices[i]``; decoding on gives the rows of a cache fed the
    reordered sequences from the start."""
    q, k, v = _qkv(3, 1, 14, 4)
    order = [2, 0, 2, 1]
    for form in (torch.tensor(order), np.array(order), order):
        cache = PLSHDecodingCache(PART)
        cache.update(
            *(t[:, :, :5] for t in (q, k, v)),
            query_positions=[[0, 1, 2, 3, 4], [3, 4, 5, 6, 7], [10, 11, 12, 13, 14]],
        )
        for j in range(5, 9):
            cache.update(*(t[:, :, j : j + 1] for t in (q, k, v)))
        assert cache.ring_steps == 4
        bound_before = cache.error_bound()
        cache.select(form)
        assert cache.batch_size == 4 and cache.last_positions().tolist() == [18, 8, 18, 11]
        assert cache.error_bound() == bound_before  # the span seen is kept
        reordered = [t[order] for t in (q, k, v)]
        twin = PLSHDecodingCache(PART)
        twin.update(
            *(t[:, :, :5] for t in reordered),
            query_positions=[
                [10, 11, 12, 13, 14],
                [0, 1, 2, 3, 4],
                [10, 11, 12, 13, 14],
                [3, 4, 5, 6, 7],
            ],
        )
        for j in range(5, 9):
            twin.update(*(t[:, :, j : j + 1] for t in reordered))
        for j in range(9, 14):
            _assert_same(
                [cache.update(*(t[:, :, j : j + 1] for t in reordered), return_lse=True)],
                [twin.update(*(t[:, :, j : j + 1] for t in reordered), return_lse=True)],
            )
        for b in range(4):
            assert torch.equal(cache.cached_positions(b), twin.cached_positions(b))
    cache.select(torch.zeros(0, dtype=torch.int64))
    assert cache.batch_size == 0 and cache.cached_tokens().tolist() == []


def test_select_of_an_empty_list_keeps_no_sequence():
    # np.asarray([]) is float64: the empty list was refused as "must be integers", while
    # the empty int64 tensor (above) empties the cache; an empty float tensor stays refused
    cache, _ = _two_seq_cache()
    assert (
        _message(TypeError, cache.select, torch.zeros(0))
        == "indices: must be integers, got dtype float32"
    )
    cache.select([])
    assert cache.batch_size == 0 and cache.cached_tokens().tolist() == []


def test_select_refuses_bad_indices_with_their_messages():
    cache, _ = _two_seq_cache()
    assert (
        _message(TypeError, cache.select, [True, False])
        == "indices: must be integers, got dtype bool"
    )
    assert (
        _message(TypeError, cache.select, [0.0]) == "indices: must be integers, got dtype float64"
    )
    assert _message(ValueError, cache.select, [[0, 1]]) == "indices: must be 1-D, got shape (1, 2)"
    assert _message(ValueError, cache.select, [0, 2]) == "indices: must lie in [0, 2), got [0, 2]"
    assert _message(ValueError, cache.select, [-1, 1]) == "indices: must lie in [0, 2), got [-1, 1]"
    cache.select([1, 1, 0, 0])  # the edges 0 and batch - 1 are inside
    assert cache.batch_size == 4


def test_sequence_accessors_refuse_with_their_messages():
    cache, _ = _two_seq_cache()
    assert _message(TypeError, cache.cached_positions, True) == "sequence: must be an int, got bool"
    assert _message(TypeError, cache.key_bins, 1.0) == "sequence: must be an int, got float"
    assert _message(ValueError, cache.cached_positions, 2) == "sequence: must be in [0, 2), got 2"
    assert _message(ValueError, cache.key_bins, -1) == "sequence: must be in [0, 2), got -1"
    assert cache.cached_positions(np.int64(1)).tolist() == [0, 1, 2]
    assert cache.key_bins(0).shape == (2, 3, 3)


# ------------------------------------------------------------------ state and accounting


def test_state_before_any_call_and_after_reset():
    cache = PLSHDecodingCache(PART)
    for c in (cache,):
        assert c.batch_size == 0 and c.ring_steps == 0 and c.bound == 5
        assert c.cached_tokens().tolist() == [] and c.cached_tokens().dtype == torch.int64
        assert c.last_positions().tolist() == [] and c.last_positions().dtype == torch.int64
        assert c.live_tokens().shape == (0, 2) and c.live_tokens().dtype == torch.int64
        assert c.memory_bytes() == 0
        assert _message(ValueError, c.error_bound) == (
            "delta: no positions decoded yet (call update first)"
        )
    (ring, _), (q, k, v) = _ring_cache()
    ring.reset()
    assert ring.batch_size == 0 and ring.ring_steps == 0 and ring.memory_bytes() == 0
    assert ring._buffers is None and ring.last_positions().tolist() == []
    assert _message(ValueError, ring.error_bound).startswith("delta: no positions")
    # another batch, head count and dtype after the reset: a fresh cache's rows
    q, k, v = _qkv(1, 2, 3, 6, dtype=torch.float32)
    fresh = PLSHDecodingCache(PART)
    _assert_same([ring.update(q, k, v, return_lse=True)], [fresh.update(q, k, v, return_lse=True)])


def test_a_sequence_without_real_tokens_holds_nothing():
    q, k, v = _qkv(2, 1, 6, 4)
    mask = torch.tensor([[True] * 5, [False] * 5])
    cache = PLSHDecodingCache(PART)
    out, lse = cache.update(*(t[:, :, :5] for t in (q, k, v)), attention_mask=mask, return_lse=True)
    assert torch.equal(out[1], torch.zeros(2, 5, 5, dtype=torch.float64))
    assert torch.isneginf(lse[1]).all() and lse.dtype == torch.float64
    assert cache.last_positions().tolist() == [4, -1]
    assert cache.cached_tokens().tolist()[1] == 0
    assert (
        cache.cached_positions(1).shape == (0,) and cache.cached_positions(1).dtype == torch.int64
    )
    assert cache.key_bins(1).shape == (2, 3, 0) and cache.key_bins(1).dtype == torch.int64
    assert cache._key[1].shape == (1, 0, 4) and cache._value[1].shape == (1, 0, 5)
    assert cache.live_tokens()[1].tolist() == [0, 0]
    cache.update(*(t[:, :, 5:] for t in (q, k, v)))  # its first real token: position 0
    assert cache.last_positions().tolist() == [5, 0] and cache.ring_steps == 0
    assert cache.cached_positions(1).tolist() == [0]


def test_live_tokens_and_bins_against_the_reference_partition():
    q, k, v = _qkv(2, 1, 20, 4)
    cache = PLSHDecodingCache(PART)
    cache.update(
        *(t[:, :, :6] for t in (q, k, v)),
        query_positions=[[0, 1, 2, 3, 4, 5], [7, 9, 10, 11, 12, 13]],
    )
    for j in range(6, 20):
        cache.update(*(t[:, :, j : j + 1] for t in (q, k, v)))
        live = cache.live_tokens()
        for b, last in enumerate(cache.last_positions().tolist()):
            pos = cache.cached_positions(b).numpy()
            assert np.array_equal(cache.key_bins(b).numpy(), ref_bins(PART, pos))
            c = ref_counts(PART, [last], pos, causal=True)[:, 0, :]  # (H, L)
            assert live[b].tolist() == (c > 0).sum(axis=1).tolist()
            everything = np.arange(pos[0] - 20, last + 1)
            c_all = ref_counts(PART, [last], everything, causal=True)[:, 0, :]
            assert (c_all[:, everything < pos[0]] == 0).all()  # the evicted are unreachable
            assert (c_all[:, everything == pos[0]] > 0).any()  # the oldest held is not
    assert cache.last_positions().tolist() == [19, 27]


def test_memory_bytes_of_both_forms():
    q, k, v = _qkv(2, 1, 12, 4, dtype=torch.float32)
    cache = PLSHDecodingCache(PART)
    cache.update(*(t[:, :, :6] for t in (q, k, v)))
    held = cache.cached_tokens().tolist()
    # keys (1 head, 4) and values (1 head, 5) float32, int64 positions, int64 bins (2 x 3)
    per_key = (4 + 5) * 4 + 8 + 2 * 3 * 8
    assert cache.memory_bytes() == sum(held) * per_key
    cache.update(*(t[:, :, 6:7] for t in (q, k, v)))
    ring = cache._buffers
    capacity = 5
    steps = ring._block.size
    expected = (
        2 * capacity * (4 + 5) * 4  # the ring's keys and values
        + 2 * capacity * 8  # host positions
        + 2 * 2 * 2 * (3 + 1) * 4  # count levels, float32: per (sequence, head) 2 (s + 1)
        + steps * 2 * 2 * 2 * (3 + 1) * 8  # the planned run lengths, int64
    )
    assert cache.memory_bytes() == expected
    ring._block = None
    assert cache.memory_bytes() == expected - steps * 2 * 2 * 2 * (3 + 1) * 8


def test_error_bound_spans_every_position_seen():
    cache = PLSHDecodingCache(PART)
    q, k, v = _qkv(2, 1, 12, 4)
    cache.update(*(t[:, :, :4] for t in (q, k, v)), query_positions=[[5, 6, 7, 8], [2, 3, 4, 9]])
    bound = cache.error_bound(0.1)
    expected = max_norm_error_bound(8, 3, 0.1 / 2, sampler=PART.sampler)
    assert bound == DecodingErrorBound(expected, 0.1, 8, 3, 2)
    for j in range(4, 8):
        cache.update(*(t[:, :, j : j + 1] for t in (q, k, v)))
    assert cache.ring_steps == 4  # positions 9..12 and 10..13 on the ring
    assert cache.error_bound().num_positions == 13 - 2 + 1
    assert cache.error_bound().eps == max_norm_error_bound(12, 3, 0.05 / 2, sampler=PART.sampler)
    cache.cached_positions(0)  # back to per-sequence tensors: the span is kept
    assert cache.error_bound().num_positions == 12
    cache.update(*(t[:, :, 8:9] for t in (q, k, v)), query_positions=[[20], [14]])
    assert cache.error_bound().num_positions == 19
    for delta in (0.0, 1.0, float("nan")):
        with pytest.raises(ValueError, match="^delta"):
            cache.error_bound(delta)
    assert math.isfinite(cache.error_bound(0.5).eps)


def test_bin_edges_exact_or_none_where_the_candidates_cannot_bracket_them():
    """``_edges``: the first integer position of each bin (a brute-force scan back), also
    for a pitch far above the position; ``None`` where the five candidates around the
    estimate cannot be binned apart (``|p| ~ 2**60``, binary64 spacing 256), even when
    another sample's edge is found."""
    part = PartitionSample(
        np.array([[1.5, 2.0**62], [0.7, 3.2]]), np.array([[0.25, 3.5], [0.2, 0.0]])
    )
    (cache, _), _ = _ring_cache()
    ring = cache._buffers  # its host partition swapped for this one (no ring of 2**62 keys)
    ring.pitch, ring.offset = part.pitch, part.offset
    for p in [4, 5, 17, 1000, 2**40 + 3]:
        edges = ring._edges(np.array([p]))[0]
        back = p - np.arange(0, 8)
        b = ref_bins(part, back)
        first_other = np.argmin(b == b[..., :1], axis=-1)
        expected = np.where(part.pitch > 8, 4, p - first_other + 1)  # 2**62: the bin from 3.5
        assert np.array_equal(edges, expected), p
    assert ring._edges(np.array([2**60])) is None
    assert ring._edges(np.array([2**60 + 1000])) is None


def test_live_tokens_per_head_for_every_kind_of_sequence():
    """A sequence without tokens (first in the batch) gets zeros, one holding a single key
    its count, the rest theirs; int64 throughout, also under another default device (the
    newest position is made on the bins' device)."""
    part = PartitionSample(np.array([[1.0, 1.0], [4.0, 1.0]]), np.zeros((2, 2)))
    q, k, v = _qkv(3, 2, 6, 4)
    mask = torch.tensor([[False] * 6, [True] * 6, [True] * 6])
    cache = PLSHDecodingCache(part)
    cache.update(
        q,
        k,
        v,
        attention_mask=mask,
        query_positions=[[0, 1, 2, 3, 4, 5]] * 2 + [[0, 1, 2, 3, 4, 8]],
    )
    # head 0 (pitch 1): each bin holds one position; head 1: bins [4, 8) and [8, 12)
    # the accessors return host tensors under another default device (they were made on
    # it: live_tokens failed, stacking a meta/CUDA row of zeros with host rows)
    with torch.device("meta"):
        live, held, last = cache.live_tokens(), cache.cached_tokens(), cache.last_positions()
        empty = PLSHDecodingCache(part).live_tokens()
    for t in (live, held, last, empty):
        assert t.dtype == torch.int64 and t.device.type == "cpu"
    assert held.tolist() == [0, 2, 1] and last.tolist() == [-1, 5, 8]
    assert live.tolist() == [[0, 0], [1, 2], [1, 1]] and empty.shape == (0, 2)
    cache.update(*(t[:, :, :1] for t in (q, k, v)))  # on the ring
    with torch.device("meta"):
        held, last = cache.cached_tokens(), cache.last_positions()
    assert held.device.type == last.device.type == "cpu"
    assert last.tolist() == [0, 6, 9]


def test_error_bound_uses_the_partitions_sampler():
    part = PartitionSample(PITCH, OFFSET, sampler="stratified")
    cache = PLSHDecodingCache(part)
    cache.update(*_qkv(1, 2, 4, 4), query_positions=[3, 4, 5, 9])
    expected = max_norm_error_bound(7, 3, 0.05 / 2, sampler="stratified")
    assert cache.error_bound().eps == expected
    assert expected != max_norm_error_bound(7, 3, 0.05 / 2)  # negative control


def test_non_integer_step_positions_are_refused_on_the_ring():
    """Float or bool positions of a decode step's shape are refused by the general checks
    (the gate takes int64 only), naming the argument; the ring is unchanged."""
    (cache, _), (q, k, v) = _ring_cache()
    j = slice(8, 9)
    for positions in (torch.tensor([8.0]), torch.tensor([[8.0], [9.0]]), torch.tensor([True])):
        with pytest.raises(TypeError, match="^query_positions: must be an integer tensor"):
            cache.update(q[:, :, j], k[:, :, j], v[:, :, j], query_positions=positions)
    assert cache.ring_steps == 2 and cache.last_positions().tolist() == [7, 7]


def test_an_all_real_mask_on_a_first_decode_step_takes_the_ring():
    """A decode step whose mask marks every token real (bool or 0/1) is a plain step: the
    ring takes it, as without a mask, with the same rows."""
    for mask in (torch.ones((2, 1), dtype=torch.bool), torch.ones((2, 1), dtype=torch.int64)):
        q, k, v = _qkv(2, 1, 6, 4)
        cache, plain = PLSHDecodingCache(PART), PLSHDecodingCache(PART)
        for c in (cache, plain):
            c.update(*(t[:, :, :5] for t in (q, k, v)))
        got = cache.update(*(t[:, :, 5:] for t in (q, k, v)), attention_mask=mask)
        want = plain.update(*(t[:, :, 5:] for t in (q, k, v)))
        assert cache.ring_steps == plain.ring_steps == 1
        _assert_same([got], [want])


def test_an_empty_batch_decodes_on_the_general_path():
    """A batch of no sequences (from the start, or after ``select`` of none): its decode
    steps return empty rows on the general path (the ring needs a sequence)."""
    q, k, v = _qkv(2, 1, 6, 4)
    fresh = PLSHDecodingCache(PART)
    assert fresh.update(*(t[:0, :, :3] for t in (q, k, v))).shape == (0, 2, 3, 5)
    emptied = PLSHDecodingCache(PART)
    emptied.update(*(t[:, :, :3] for t in (q, k, v)))
    emptied.select(np.array([], dtype=np.int64))
    for cache in (fresh, emptied):
        out = cache.update(*(t[:0, :, 3:4] for t in (q, k, v)))
        assert out.shape == (0, 2, 1, 5) and cache.ring_steps == 0 and cache.batch_size == 0


def test_a_row_that_reaches_no_key_is_zero_with_lse_minus_inf():
    """With ``check_finite=False`` an infinite query can give every logit of its row
    ``-inf`` (here ``+inf`` against keys whose first feature is negative): the row is 0 and
    its LSE ``-inf``, as a pad row; every row is :func:`plsh_fast.plsh_attention`'s (the
    CPU kernel's LSE of that row is 0, not compared)."""
    q, k, v = _qkv(1, 1, 4, 4)
    k = k.clone()
    k[..., 0] = -1.0 - k[..., 0].abs()
    q = q.clone()
    q[0, 0, 2] = torch.tensor([math.inf, 0.0, 0.0, 0.0])
    out, lse = PLSHDecodingCache(PART).update(q, k, v, return_lse=True, check_finite=False)
    assert torch.equal(out[0, 0, 2], torch.zeros(5, dtype=torch.float64))
    assert torch.isneginf(lse[0, 0, 2]) and not torch.isnan(out).any()
    full, full_lse = plsh_attention(
        q, k, v, partition=PART, causal=True, return_lse=True, check_finite=False
    )
    torch.testing.assert_close(out, full, **TOL)
    lse[0, 0, 2] = full_lse[0, 0, 2]
    torch.testing.assert_close(lse, full_lse, **TOL)


def test_a_general_call_at_the_newest_position_is_out_of_order():
    """A call of two tokens whose first repeats the newest position is refused (equality
    is out of order, on the general path as on the ring), naming the positions."""
    cache, (q, k, v) = _two_seq_cache()  # positions 0, 1, 2
    with pytest.raises(ValueError) as err:
        cache.update(*(t[:, :, 3:5] for t in (q, k, v)), query_positions=[2, 3])
    assert str(err.value) == (
        "query_positions: decode step out of order for sequence 0: position 2 after 2"
    )
    assert cache.last_positions().tolist() == [2, 2]
    cache.update(*(t[:, :, 3:5] for t in (q, k, v)), query_positions=[3, 4])
    assert cache.last_positions().tolist() == [4, 4]


@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("path", ["ring", "general"])
def test_repeating_one_sequences_newest_position_is_refused_on_every_path(path, m):
    """One token or two, on a cache that has taken the ring or on the per-sequence path
    only: a call whose first position for sequence 1 is that sequence's newest one (the
    other sequence's positions are fine) is refused naming the argument, the sequence and
    the positions, before any change (the held positions of both sequences stay)."""
    (ring, _), (q, k, v) = _ring_cache()  # positions 0..7 in both sequences
    if path == "ring":
        cache = ring
    else:
        cache = _general()
        _feed(cache, q, k, v, [0, 6, 7, 8])
    held = [cache.cached_positions(b).tolist() for b in range(2)]
    assert cache.last_positions().tolist() == [7, 7] and held[1][-1] == 7
    new = [t[:, :, 8 : 8 + m] for t in (q, k, v)]
    positions = torch.tensor([[8, 9][:m], [7, 8][:m]])
    with pytest.raises(ValueError) as err:
        cache.update(*new, query_positions=positions)
    assert str(err.value) == (
        "query_positions: decode step out of order for sequence 1: position 7 after 7"
    )
    assert cache.last_positions().tolist() == [7, 7]
    assert [cache.cached_positions(b).tolist() for b in range(2)] == held
    cache.update(*new, query_positions=positions + 1)  # one later: accepted
    assert cache.last_positions().tolist() == [8 + m, 7 + m]


def test_the_span_seen_is_the_lowest_of_any_sequence():
    """The span of positions seen starts at the lowest position of every sequence, also
    when a later sequence starts above the first one's newest position."""
    cache = PLSHDecodingCache(PART)
    q, k, v = _qkv(2, 1, 4, 4)
    cache.update(q, k, v, query_positions=[[0, 1, 2, 3], [10, 11, 12, 13]])
    assert cache.error_bound().num_positions == 14


def test_a_decode_does_not_depend_on_the_default_device():
    """Host tensors decoded under another default device (a ``torch.device`` context:
    meta here, as CUDA would be) give the same rows: a prefill without mask or positions
    (its positions made on the host), ring steps, a padded step on the general path and
    the ring again; the accessors return host tensors, also while the ring holds the
    cache."""
    q, k, v = _qkv(2, 1, 12, 4)
    pad = torch.tensor([[True], [False]])
    calls = [(0, 4, {}), *((j, j + 1, {}) for j in range(4, 8))]
    calls += [(8, 9, {"attention_mask": pad}), (9, 10, {}), (10, 11, {}), (11, 12, {})]
    results = []
    for device in (None, "meta"):
        cache = PLSHDecodingCache(PART)
        rows, held = [], []
        with torch.device(device) if device else contextlib.nullcontext():
            for a, b, kwargs in calls:
                rows.append(
                    cache.update(*(t[:, :, a:b] for t in (q, k, v)), return_lse=True, **kwargs)
                )
                held.append(cache.cached_tokens())
            accessors = [cache.last_positions(), *held]
            ring_steps = cache.ring_steps
            accessors += [cache.live_tokens(), cache.cached_positions(0), cache.key_bins(1)]
        assert all(t.device.type == "cpu" for t in accessors)
        results.append((rows, [t.tolist() for t in accessors], ring_steps))
    (rows, accessors, ring_steps), (meta_rows, meta_accessors, meta_ring_steps) = results
    _assert_same(meta_rows, rows)
    assert meta_accessors == accessors and meta_ring_steps == ring_steps == 7
    assert accessors[0] == [11, 10]


def test_bin_edges_two_and_three_positions_above_the_estimate():
    """Beyond ``2**53`` the estimate ``x0 = floor(offset + bin * pitch)`` can lie two or
    three positions below the first position ``L`` of a bin: two is within the five
    candidates (``L`` found exactly: its bin is the position's, the one before not), three
    is not (``None``, as for any candidate set that does not bracket it)."""
    (cache, _), _ = _ring_cache()
    ring = cache._buffers

    def binned(x, pitch, offset):
        return np.floor((np.float64(x) - offset) / pitch)

    # (position, pitch, offset) with L = x0 + 2 and L = x0 + 3 (found by a brute-force scan)
    two, three = (19945673687093877, 28.25, 2.5), (18556898148119029, 34.5, 15.5)
    for (p, pitch, offset), found in ((two, True), (three, False)):
        ring.pitch = np.array([[pitch, 1.5]])
        ring.offset = np.array([[offset, 0.25]])
        b = binned(p, pitch, offset)
        x0 = int(np.floor(offset + b * pitch))
        first = next(x for x in range(x0 - 5, x0 + 6) if binned(x, pitch, offset) >= b)
        assert first - x0 == (2 if found else 3)
        edges = ring._edges(np.array([p]))
        if not found:
            assert edges is None
            continue
        assert int(edges[0, 0, 0]) == first
        assert binned(first - 1, pitch, offset) < b <= binned(first, pitch, offset)
