"""Decoding with the bounded PLSH KV cache (plsh_fast.decoding, proofs_notes/decoding_cache.md)."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from plsh_fast.decoding import PLSHDecodingCache, cache_bound, reachable_keys  # noqa: E402
from plsh_ref import PartitionSample, alibi_slopes, draw_partition  # noqa: E402
from plsh_ref.attention import plsh_attention as ref_plsh_attention  # noqa: E402
from plsh_ref.expectation import largest_pitch_cdf  # noqa: E402
from plsh_ref.partition import bins as ref_bins  # noqa: E402
from plsh_ref.partition import counts as ref_counts  # noqa: E402
from plsh_ref.testing.baseline import plain_attention_torch  # noqa: E402
from plsh_ref.testing.tolerance import assert_close_to_reference  # noqa: E402


def _inputs(batch, num_heads, num_heads_kv, n, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, num_heads, n, d, generator=g, dtype=torch.float64)
    k = torch.randn(batch, num_heads_kv, n, d, generator=g, dtype=torch.float64)
    v = torch.randn(batch, num_heads_kv, n, d + 3, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _decode(cache, q, k, v, prefill, positions=None, mask=None):
    """Prefill ``prefill`` tokens, then decode one token per call; returns all rows."""
    n = q.shape[2]
    pieces, sizes = [], []
    cuts = [0, prefill, *range(prefill + 1, n + 1)]
    for a, b in zip(cuts[:-1], cuts[1:]):
        pos = None if positions is None else positions[..., a:b]
        am = None if mask is None else mask[:, a:b]
        pieces.append(
            cache.update(
                q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], query_positions=pos, attention_mask=am
            )
        )
        sizes.append(int(cache.cached_tokens().max()))
    return torch.cat(pieces, dim=2), sizes


def _reference_rows(q, k, v, part, pos):
    """float64 reference output and the same-dtype baseline for one sequence's real tokens."""
    qn, kn, vn = (t.double().numpy() for t in (q, k, v))
    ref, _ = ref_plsh_attention(
        qn,
        kn,
        vn,
        partition=part,
        causal=True,
        query_positions=pos,
        key_positions=pos,
        return_lse=True,
    )
    with np.errstate(divide="ignore"):
        bias = np.log(ref_counts(part, pos, pos, causal=True) / part.num_samples)
    base, _ = plain_attention_torch(qn, kn, vn, bias, scale=None, dtype=str(q.dtype).split(".")[1])
    return ref, base


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_decode_equals_full_sequence_reference(dtype):
    part = draw_partition(0.25 / alibi_slopes(4), num_samples=8, seed=3)
    q, k, v = _inputs(1, 4, 2, 160, 16, dtype)
    cache = PLSHDecodingCache(part)
    out, sizes = _decode(cache, q, k, v, prefill=40)
    ref, base = _reference_rows(q, k, v, part, np.arange(160))
    assert_close_to_reference(out.double().numpy(), ref, base, str(dtype).split(".")[1])
    assert max(sizes) <= cache.bound
    assert min(sizes[1:]) < 160 // 2  # keys really were evicted (negative check on eviction)


def test_bins_bit_for_bit_and_live_counts_brute_force():
    part = draw_partition(0.5 / alibi_slopes(4), num_samples=6, seed=11)
    q, k, v = _inputs(1, 4, 4, 120, 8, torch.float32, seed=1)
    cache = PLSHDecodingCache(part)
    _decode(cache, q, k, v, prefill=10)
    pos = cache.cached_positions(0).numpy()
    np.testing.assert_array_equal(cache.key_bins(0).numpy(), ref_bins(part, pos))
    # live keys per head: keys j <= p sharing a bin with the newest query p in some sample
    last = 119
    c = ref_counts(part, [last], np.arange(120), causal=True)[:, 0, :]
    np.testing.assert_array_equal(cache.live_tokens()[0].numpy(), (c > 0).sum(axis=1))
    # every evicted key has count 0 for the newest query (and, by monotonicity, later ones)
    assert (c[:, : pos[0]] == 0).all()
    assert (c[:, pos[0]] > 0).any()  # the oldest kept key is still reachable by some head


def test_batch_with_left_padding_and_own_positions():
    part = draw_partition(0.25 / alibi_slopes(4), num_samples=8, seed=5)
    n, pad = 90, 17
    q, k, v = _inputs(2, 4, 1, n, 8, torch.float32, seed=2)
    mask = torch.ones(2, n, dtype=torch.int64)
    mask[1, :pad] = 0  # sequence 1 is left-padded in the prefill
    prefill = 30
    cache = PLSHDecodingCache(part)
    out, _ = _decode(cache, q, k, v, prefill=prefill, mask=mask)
    assert (out[1, :, :pad] == 0).all()
    for b, first in ((0, 0), (1, pad)):
        real = slice(first, n)
        ref, base = _reference_rows(
            q[b : b + 1, :, real],
            k[b : b + 1, :, real],
            v[b : b + 1, :, real],
            part,
            np.arange(n - first),
        )
        assert_close_to_reference(out[b : b + 1, :, real].numpy(), ref, base, "float32")
    # positions continue per sequence: sequence 1 numbers its real tokens from 0
    assert int(cache.cached_positions(1)[-1]) == n - pad - 1
    assert int(cache.cached_positions(0)[-1]) == n - 1


def test_explicit_positions_with_gaps_and_long_prefill_path():
    # a prefill of 400 tokens goes through plsh_fast.plsh_attention (> dense threshold)
    part = draw_partition(0.5 / alibi_slopes(2), num_samples=4, seed=9)
    n = 430
    pos = np.cumsum(np.random.default_rng(0).integers(1, 4, size=n)) + 1000
    q, k, v = _inputs(1, 2, 2, n, 8, torch.float32, seed=4)
    cache = PLSHDecodingCache(part)
    out, sizes = _decode(cache, q, k, v, prefill=400, positions=torch.from_numpy(pos))
    ref, base = _reference_rows(q, k, v, part, pos)
    assert_close_to_reference(out.numpy(), ref, base, "float32")
    assert max(sizes) <= cache.bound


def test_memory_stays_at_the_bound_over_a_long_decode():
    part = draw_partition([2.0, 6.0], num_samples=16, seed=0)
    cache = PLSHDecodingCache(part)
    q, k, v = _inputs(1, 2, 2, 1, 4, torch.float32)
    per_token = None
    peak = 0
    for _ in range(3000):
        cache.update(q, k, v)
        per_token = per_token or cache.memory_bytes()  # one token's worth, after the first call
        peak = max(peak, cache.memory_bytes())
        assert int(cache.cached_tokens()[0]) <= cache.bound
    assert peak <= cache.bound * per_token
    assert int(cache.cached_positions(0)[-1]) == 2999


def test_cache_bound_law_is_the_largest_pitch_law():
    # cache_bound - 1 = max_t ceil(pitch_t) <= b  iff  max_t pitch_t <= b (b integer), so its
    # CDF is largest_pitch_cdf. DKW: P(sup |F_n - F| > 0.05) <= 2 exp(-2 * 2000 * 0.05^2)
    # = 1.4e-4 (false-failure probability); the negative control uses s = 8 for s = 4.
    sigma, s, draws = 3.0, 4, 2000
    vals = np.array([cache_bound(draw_partition([sigma], s, seed=i)) - 1 for i in range(draws)])
    grid = np.arange(1, 60)
    emp = (vals[:, None] <= grid[None, :]).mean(axis=0)
    assert np.abs(emp - largest_pitch_cdf(grid, sigma, s)).max() <= 0.05
    assert np.abs(emp - largest_pitch_cdf(grid, sigma, 2 * s)).max() > 0.05


def test_live_size_law_after_prefill():
    # After the newest query p, the cache holds 1 + max_{h,t} L_{h,t} keys, L the number of
    # earlier positions in p's bin: P(L >= b) = exp(-b / sigma) (collision probability), the
    # samples independent, so P(size <= 1 + b) = prod_t (1 - exp(-(b + 1) / sigma)).
    # DKW with 400 draws: P(sup |F_n - F| > 0.1) <= 2 exp(-8) = 6.7e-4; negative control:
    # the law for 2 sigma is rejected.
    sigma, s, n = 2.5, 4, 80
    q, k, v = _inputs(1, 1, 1, n, 4, torch.float32)
    sizes = []
    for i in range(400):
        cache = PLSHDecodingCache(draw_partition([sigma], s, seed=10_000 + i))
        cache.update(q, k, v)
        sizes.append(int(cache.cached_tokens()[0]))
    sizes = np.array(sizes)
    b = np.arange(0, 40)

    def law(sig):
        return (1.0 - np.exp(-(b + 1) / sig)) ** s

    emp = (sizes[:, None] <= 1 + b[None, :]).mean(axis=0)
    assert np.abs(emp - law(sigma)).max() <= 0.1
    assert np.abs(emp - law(2 * sigma)).max() > 0.1


def test_bad_input():
    part = draw_partition([4.0, 8.0], num_samples=4, seed=0)
    other = draw_partition([4.0, 8.0], num_samples=4, seed=1)
    cache = PLSHDecodingCache(part)
    q, k, v = _inputs(1, 2, 2, 4, 4, torch.float32)
    cache.update(q, k, v)
    with pytest.raises(ValueError, match="^partition"), pytest.warns(DeprecationWarning):
        cache.update(q[:, :, :1], k[:, :, :1], v[:, :, :1], partition=other)
    with pytest.raises(ValueError, match="^query_positions: decode step out of order"):
        cache.update(q[:, :, :1], k[:, :, :1], v[:, :, :1], query_positions=[2])
    with pytest.raises(ValueError, match="^query_positions: must increase"):
        cache.update(q[:, :, :2], k[:, :, :2], v[:, :, :2], query_positions=[9, 9])
    with pytest.raises(ValueError, match="^query: batch"):
        cache.update(*(torch.cat([t, t]) for t in (q, k, v)))
    with pytest.raises(ValueError, match="^query"):
        cache.update(q.double(), k.double(), v.double())
    with pytest.raises(TypeError, match="^query"):
        cache.update(q.numpy(), k, v)
    with pytest.raises(TypeError, match="^attention_mask"):
        cache.update(q, k, v, attention_mask=torch.ones(1, 4))
    with pytest.raises(ValueError, match="^attention_mask"):
        cache.update(q, k, v, attention_mask=torch.full((1, 4), 2))
    with pytest.raises(TypeError, match="^partition"):
        PLSHDecodingCache("not a partition")
    with pytest.raises(ValueError, match="^scale"):
        PLSHDecodingCache(part, scale=-1.0)
    # nothing was changed by the refused calls
    assert int(cache.cached_positions(0)[-1]) == 3
    assert math.isfinite(cache.bound)


def test_refused_first_call_leaves_the_cache_unset():
    # a first call refused for its positions used to fix the cache's batch, dtype and
    # device already, so the corrected call was refused too
    part = draw_partition([4.0, 8.0], num_samples=4, seed=0)
    cache = PLSHDecodingCache(part)
    q, k, v = _inputs(2, 2, 2, 3, 4, torch.float64)
    with pytest.raises(ValueError, match="^query_positions: must increase"):
        cache.update(q, k, v, query_positions=[2, 1, 0])
    assert cache.batch_size == 0
    q, k, v = _inputs(1, 2, 1, 3, 4, torch.float32)
    out = cache.update(q, k, v)  # another batch, kv heads and dtype: a fresh cache
    assert out.dtype == torch.float32 and cache.cached_positions(0).tolist() == [0, 1, 2]


def test_bad_scale_and_positions_name_the_argument():
    part = draw_partition([4.0, 8.0], num_samples=4, seed=0)
    with pytest.raises(TypeError, match="^scale"):
        PLSHDecodingCache(part, scale="a")
    with pytest.raises(TypeError, match="^scale"):
        PLSHDecodingCache(part, scale=True)
    q, k, v = _inputs(1, 2, 2, 3, 4, torch.float32)
    with pytest.raises(TypeError, match="^query_positions"):
        PLSHDecodingCache(part).update(q, k, v, query_positions="abc")


def test_non_finite_inputs_are_refused_unless_allowed():
    part = draw_partition([4.0, 8.0], num_samples=4, seed=0)
    q, k, v = _inputs(1, 2, 2, 4, 4, torch.float32)
    bad = v.clone()
    bad[0, 1, 2, 0] = float("nan")
    cache = PLSHDecodingCache(part)
    with pytest.raises(ValueError, match="^value: contains NaN"):
        cache.update(q, k, bad)
    assert cache.batch_size == 0  # the refused call left the cache unset
    out = PLSHDecodingCache(part).update(q, k, bad, check_finite=False)
    assert torch.isnan(out).any()  # negative control: with the check off the NaN propagates
    with pytest.raises(TypeError, match="^check_finite"):
        cache.update(q, k, v, check_finite=1)


def test_binary64_bound_equals_cache_bound_below_2_50_and_allows_more_near_2_53():
    # proofs_notes/decoding_cache.md section 2: binary64 bins hold at most
    # ceil((1 + 2B) pitch) positions, which is <= ceil(pitch) + 1 while |p| + pitch <= 2**50
    from plsh_fast.decoding import binary64_bound

    for seed in range(20):
        part = draw_partition([3.0, 40.0, 300.0], num_samples=8, seed=seed)
        assert binary64_bound(part, 2**50 - 4096) <= cache_bound(part)
        assert binary64_bound(part, 0) >= cache_bound(part) - 1  # ceil(pitch) at least
    wide = draw_partition([100.0], num_samples=1, seed=0)
    assert binary64_bound(wide, 2**53 - 1) > cache_bound(wide)  # the excess is possible there


def test_decoding_near_2_53_with_wide_pitches_stays_exact():
    # positions where binary64 bins may exceed ceil(pitch) + 1: no false RuntimeError, and
    # decoding still equals the full-sequence attention
    from plsh_fast import plsh_attention
    from plsh_fast.decoding import binary64_bound

    part = draw_partition([60.0, 120.0], num_samples=4, seed=2)
    n = 300
    pos = torch.arange(2**53 - n, 2**53, dtype=torch.int64)
    q, k, v = _inputs(1, 2, 2, n, 4, torch.float64, seed=5)
    cache = PLSHDecodingCache(part)
    out, sizes = _decode(cache, q, k, v, prefill=100, positions=pos)
    full = plsh_attention(q, k, v, partition=part, query_positions=pos, key_positions=pos)
    torch.testing.assert_close(out, full, rtol=1e-12, atol=1e-12)
    assert max(sizes) <= binary64_bound(part, 2**53 - 1)


def _bins_of(partition, positions):
    return torch.from_numpy(ref_bins(partition, np.asarray(positions)))


def test_reachable_keys_keeps_keys_after_the_reference():
    """The one eviction rule (proofs_notes/decoding_cache.md, Claim 3) where ``==`` and ``>=``
    differ: keys after the reference in a later bin must stay."""
    part = PartitionSample(np.array([[4.0]]), np.array([[0.0]]))  # bins 0,0,0,0,1,1,1,1
    keys = np.arange(8)
    kb, rb = _bins_of(part, keys), _bins_of(part, [3])
    keep = reachable_keys(kb, rb)
    assert keep.tolist() == [True] * 8  # ">=": the tokens 4..7 after r = 3 are kept
    assert (kb == rb).any(dim=1).any(dim=0).tolist() == [True] * 4 + [False] * 4  # "==" drops them
    assert reachable_keys(kb, _bins_of(part, [5])).tolist() == [False] * 4 + [True] * 4
    # drawn partitions: (a) dropped keys have count 0 for every later query, (b) for keys
    # at or before r the rule is "shares a bin with r"
    for seed in range(5):
        part = draw_partition(np.array([2.0, 5.0]), 3, seed=seed)
        keys = np.arange(60)
        kb = _bins_of(part, keys)
        for r in (10, 31, 59):
            keep = reachable_keys(kb, _bins_of(part, [r]))
            later = np.arange(r, 80)
            c = ref_counts(part, later, keys, causal=True).sum(axis=(0, 1))  # over heads, queries
            assert np.all(c[~keep.numpy()] == 0)
            before = kb[..., : r + 1]
            same = (before == _bins_of(part, [r])).any(dim=1).any(dim=0)
            assert torch.equal(keep[: r + 1], same)
    with pytest.raises(TypeError, match="^key_bins"):
        reachable_keys(kb.float(), rb)
    with pytest.raises(ValueError, match="^reference_bins"):
        reachable_keys(kb, rb[0])


def test_cache_right_after_a_prefill_holds_only_keys_the_newest_query_reaches():
    """The decoding cache evicts after attending, from the newest query: after a prefill
    longer than the bound it holds exactly the keys sharing a bin with the newest token
    (from the smallest new query it would keep the whole prompt)."""
    part = draw_partition(np.array([3.0, 6.0]), 4, seed=2)
    cache = PLSHDecodingCache(part)
    q = torch.randn(1, 2, 300, 8, dtype=torch.float64)
    cache.update(q, q, q)
    kb = _bins_of(part, np.arange(300))
    expected = int((kb == kb[..., -1:]).any(dim=1).any(dim=0).sum())
    assert int(cache.cached_tokens()[0]) == expected < cache.bound < 300


def _ring_run(part, q, k, v, prefill, mask):
    """Prefill (left-padded by ``mask``), then one token per call; rows and ring steps."""
    cache = PLSHDecodingCache(part)
    out, _ = _decode(cache, q, k, v, prefill=prefill, mask=mask)
    return cache, out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_many_ring_steps_past_several_evictions_equal_the_float64_reference(
    dtype, one_torch_thread
):
    """Over six times the bound of decode steps (every step on the ring, which wraps six
    times and evicts every key it held several times over), a left-padded GQA batch
    decodes the rows of the float64 reference PLSH attention (SPEC section 6 rule)."""
    part = draw_partition(0.1 / alibi_slopes(4), num_samples=8, seed=2)
    bound = cache_bound(part)  # 119
    prefill, n, pad = 40, 40 + 6 * bound, 15
    q, k, v = _inputs(2, 4, 2, n, 16, dtype, seed=6)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, :pad] = False  # sequence 1 numbers its real tokens from 0: other positions
    cache, out = _ring_run(part, q, k, v, prefill, mask)
    assert cache.ring_steps == n - prefill  # every decode step ran on the ring
    # the oldest key held is far past the prompt: the ring evicted its keys many times over
    assert int(cache.cached_positions(0)[0]) > n - bound - 1 > 5 * bound
    name = str(dtype).split(".")[1]
    for b, first in ((0, 0), (1, pad)):
        real = slice(first, n)
        rows = [t[b : b + 1, :, real] for t in (q, k, v)]
        ref, base = _reference_rows(*rows, part, np.arange(n - first))
        assert_close_to_reference(out[b : b + 1, :, real].double().numpy(), ref, base, name)


def test_a_count_bias_one_step_stale_fails_the_reference_check(monkeypatch, one_torch_thread):
    """Negative control of the test above: a ring whose count bias lags one step (each
    step attends with the previous step's run lengths, a plausible off-by-one) no longer
    meets the SPEC section 6 rule, so that test can fail."""
    from plsh_fast import decoding

    make = decoding._StepRing._block_of

    def stale(self, pos, edges, new_bins):
        block = make(self, pos, edges, new_bins)
        if block is not None and block.size > 1:
            block.repeats = torch.cat([block.repeats[:1], block.repeats[:-1]])
        return block

    monkeypatch.setattr(decoding._StepRing, "_block_of", stale)
    part = draw_partition(0.1 / alibi_slopes(4), num_samples=8, seed=2)
    n = 40 + 6 * cache_bound(part)
    q, k, v = _inputs(2, 4, 2, n, 16, torch.float64, seed=6)
    cache, out = _ring_run(part, q, k, v, 40, None)
    assert cache.ring_steps == n - 40
    ref, base = _reference_rows(q[:1], k[:1], v[:1], part, np.arange(n))
    with pytest.raises(AssertionError):
        assert_close_to_reference(out[:1].numpy(), ref, base, "float64")


def test_refused_decode_steps_leave_the_ring_unchanged():
    """After the ring runs, every refused decode step (each wrong in one way) names its
    argument, and the next good steps give exactly the rows of a cache that never saw them;
    explicit positions of every accepted form give the default positions' rows."""
    part = draw_partition(0.25 / alibi_slopes(2), num_samples=4, seed=1)
    q, k, v = _inputs(2, 2, 1, 60, 8, torch.float32, seed=3)
    caches = [PLSHDecodingCache(part) for _ in range(2)]
    for cache in caches:
        cache.update(q[:, :, :30], k[:, :, :30], v[:, :, :30])
        for j in range(30, 40):
            cache.update(q[:, :, j : j + 1], k[:, :, j : j + 1], v[:, :, j : j + 1])
    cache, twin = caches
    assert cache.ring_steps == 10
    j = slice(40, 41)
    qs, ks, vs = q[:, :, j], k[:, :, j], v[:, :, j]
    bad_key = ks.clone()
    bad_key[1, 0, 0, 3] = float("inf")
    refused = [
        (ValueError, "^key: contains NaN or infinite", (qs, bad_key, vs), {}),
        (ValueError, "^query", (qs.double(), ks.double(), vs.double()), {}),
        (ValueError, "^query: batch", (qs[:1], ks[:1], vs[:1]), {}),
        (ValueError, "^query", (qs[..., :4], ks[..., :4], vs), {}),
        (TypeError, "^query", (qs.numpy(), ks, vs), {}),
        (ValueError, "^query_positions: decode step out of order", (qs, ks, vs),
         {"query_positions": torch.tensor([39])}),
        (ValueError, "^query_positions: decode step out of order", (qs, ks, vs),
         {"query_positions": torch.tensor([[40], [39]])}),
        (ValueError, "^query_positions: \\|position\\| must be < 2\\*\\*53", (qs, ks, vs),
         {"query_positions": torch.tensor([2**53])}),
        (ValueError, "^key_positions: must equal", (qs, ks, vs),
         {"query_positions": [40], "key_positions": [41]}),
        (TypeError, "^return_lse", (qs, ks, vs), {"return_lse": 1}),
        (ValueError, "^attention_mask", (qs, ks, vs),
         {"attention_mask": torch.ones(2, 2, dtype=torch.bool)}),
        (ValueError, "^attention_mask", (qs, ks, vs),
         {"attention_mask": torch.full((2, 1), 2)}),
    ]  # fmt: skip
    for error, match, args, kwargs in refused:
        with pytest.raises(error, match=match):
            cache.update(*args, **kwargs)
    assert cache.ring_steps == 10 and cache.last_positions().tolist() == [39, 39]
    forms = [None, torch.tensor([40 + 1]), torch.tensor([[42], [42]]), torch.tensor([[43]])]
    forms += [torch.tensor([44], dtype=torch.int32), [45]]  # the general checks, same step
    masks = [None, torch.ones(2, 1, dtype=torch.bool), None, torch.ones(2, 1, dtype=torch.int64)]
    masks += [None, torch.ones(2, 1, dtype=torch.bool)]  # all real: the step without a mask
    for i, (form, mask) in enumerate(zip(forms, masks)):
        j = slice(40 + i, 41 + i)
        got = cache.update(
            q[:, :, j], k[:, :, j], v[:, :, j], query_positions=form, attention_mask=mask
        )
        want = twin.update(q[:, :, j], k[:, :, j], v[:, :, j])
        assert torch.equal(got, want), form
    assert cache.ring_steps == twin.ring_steps == 16
    # negative control: a step the twin did not take changes the rows
    j = slice(46, 47)
    cache.update(q[:, :, j], k[:, :, j], v[:, :, j])
    j = slice(47, 48)
    assert not torch.equal(
        cache.update(q[:, :, j], k[:, :, j], v[:, :, j]),
        twin.update(q[:, :, j], k[:, :, j], v[:, :, j]),
    )


def test_deprecated_positions_warn_at_the_callers_line():
    """The deprecation warnings of ``update``'s old spellings point at the caller's line
    (this file), not at the library. Here, not in the files run against decoding.py's
    mutants: mutmut's trampolines add frames between the caller and the library, so the
    warning's frame there is mutmut's whatever the stacklevel."""
    part = PartitionSample(np.array([[1.5, 2.5]]), np.array([[0.3, 1.1]]))
    q = k = v = torch.ones(1, 1, 2, 4, dtype=torch.float64)
    cache = PLSHDecodingCache(part)
    for j, args, kwargs in ((0, ([0],), {}), (1, (), {"positions": [3]})):
        with pytest.warns(DeprecationWarning) as record:
            cache.update(
                q[:, :, j : j + 1], k[:, :, j : j + 1], v[:, :, j : j + 1], *args, **kwargs
            )
        assert [w.filename for w in record] == [__file__]
