"""The dense route's kept counts (plsh_fast.dense.DenseCountCache, operator plsh::dense_counts).

Below the crossover, ``backend="auto"`` looks the counts ``C`` of the layer's partition at
the call's positions up in a cache and computes only ``log(C / s)`` per call. Checked here:
the kept counts are the reference's bit for bit on a miss and on a hit, the biases too, and
outputs on a hit equal those on a miss exactly (so the SPEC section 6 rule of
``test_dense_plsh.py`` carries over) and meet the rule against the float64 reference; an
entry kept for other positions, another partition or another causal flag is never served,
with a negative control (a key that ignores the positions does serve the stale entry, so
the test can fail); admission on the second call, the byte budget, the memory (one byte per
pair, a quarter of a float32 bias); under ``torch.compile(fullgraph=True, dynamic=True)``
one graph over several lengths, the lookup running inside it (hits counted), and
``torch.library.opcheck`` of the operator.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import plsh_fast.dense as dense  # noqa: E402
from plsh_fast import plsh_attention  # noqa: E402
from plsh_fast._partition import partition_tensors  # noqa: E402
from plsh_ref import alibi_slopes, draw_partition  # noqa: E402
from plsh_ref.attention import plsh_attention as ref_plsh  # noqa: E402
from plsh_ref.partition import count_bias, counts  # noqa: E402
from plsh_ref.testing.tolerance import assert_close_to_reference  # noqa: E402

SHIPPED = dict(dense.DENSE_CROSSOVER)  # before tests/fast/conftest.py switches it off
S = 8


@pytest.fixture(autouse=True)
def _shipped_crossover(monkeypatch, _tiled_paths_only):
    monkeypatch.setattr(dense, "DENSE_CROSSOVER", dict(SHIPPED))


def _partition(seed=1, heads=4):
    # sigma of a few tokens, so that zero and nonzero counts both occur at these lengths
    return draw_partition(4.0 / alibi_slopes(heads) ** 0.25, S, seed=seed)


def _reference_counts(part, qpos, kpos, causal):
    """``(B|1, H, n_q, n_k)`` int64 counts of plsh_ref, per row of 2-D positions."""
    q2 = qpos[None] if qpos.dim() == 1 else qpos
    k2 = kpos[None] if kpos.dim() == 1 else kpos
    return np.stack([counts(part, a.numpy(), b.numpy(), causal=causal) for a, b in zip(q2, k2)])


POSITIONS = {
    "1-D": (torch.tensor([0, 3, 5, 9, 17, 40, 41, 200]), torch.tensor([1, 3, 4, 9, 16, 40, 99, 200, 201])),
    "2-D": (torch.tensor([[-1, -1, 0, 1, 2, 30], [0, 1, 5, 9, 40, 80]]),) * 2,
}  # fmt: skip


@pytest.mark.parametrize("layout", sorted(POSITIONS))
@pytest.mark.parametrize("causal", [False, True])
def test_kept_counts_and_biases_equal_the_reference_bit_for_bit_on_miss_and_hit(layout, causal):
    part = _partition()
    pt = partition_tensors(part, "cpu")
    qpos, kpos = POSITIONS[layout]
    ref = _reference_counts(part, qpos, kpos, causal)
    assert (ref == 0).any() and (ref > 0).any()  # both kinds of pair
    cache = dense.DenseCountCache()
    served = [cache.counts(pt, qpos, kpos, causal=causal) for _ in range(3)]
    assert (cache.misses, cache.hits, len(cache)) == (2, 1, 1)  # kept on the second call
    assert served[2] is served[1]  # the third call is served the kept tensor
    for got in served:
        assert got.dtype == torch.uint8
        np.testing.assert_array_equal(got.numpy(), ref)
    with dense.use_dense_cache(cache):
        for _ in range(2):  # a hit each
            bias = dense.dense_count_bias(pt, qpos, kpos, causal=causal, cached=True)
            np.testing.assert_array_equal(bias.numpy(), count_bias(ref, S))  # -inf included
    assert cache.hits == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_auto_on_a_hit_equals_the_miss_exactly_and_meets_the_tolerance_rule(dtype):
    part = _partition(seed=3)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 37, 16, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(2, 2, 37, 16, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(2, 2, 37, 8, generator=g, dtype=torch.float64).to(dtype)
    mask = torch.ones(2, 37, dtype=torch.bool)
    mask[1, :9] = False  # left padding
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    kw = dict(partition=part, query_positions=pos, key_positions=pos, attention_mask=mask)
    cache = dense.DenseCountCache()
    assert dense.below_crossover(37, 37, q.device)
    with dense.use_dense_cache(cache):
        outs = [plsh_attention(q, k, v, **kw, return_lse=True) for _ in range(3)]
    assert (cache.misses, cache.hits) == (2, 1)
    for out, lse in outs[1:]:
        assert torch.equal(out, outs[0][0]) and torch.equal(lse, outs[0][1])
    out = outs[2][0]  # served from the cache
    q64, k64, v64 = (t.double().numpy() for t in (q, k, v))
    ref_out = ref_plsh(q64, k64, v64, partition=part, causal=True, query_positions=pos.numpy(),
                       key_positions=pos.numpy(), attention_mask=mask.numpy(),
                       return_lse=False)  # fmt: skip
    bias = torch.from_numpy(count_bias(_reference_counts(part, pos, pos, True), S))
    bias = bias.masked_fill(~mask[:, None, None, :], -np.inf)
    bias = bias.masked_fill(~mask[:, None, :, None], -np.inf).to(dtype)
    logits = q @ k.repeat_interleave(2, 1).transpose(-1, -2) / 4.0 + bias
    empty = torch.isneginf(logits).all(-1, keepdim=True)
    weights = torch.softmax(logits.masked_fill(empty, 0), -1).masked_fill(empty, 0)
    base = weights @ v.repeat_interleave(2, 1)
    assert_close_to_reference(out.numpy(), ref_out, base.numpy(), dtype)


def _stale_case():
    """A cache holding the counts of positions ``a``, then asked for ``b`` of the same shape."""
    part = _partition(seed=5)
    pt = partition_tensors(part, "cpu")
    a = torch.arange(30)
    b = torch.arange(30) * 3 + 7  # same shape and dtype, other positions
    cache = dense.DenseCountCache()
    for _ in range(2):
        cache.counts(pt, a, a, causal=True)  # kept
    assert len(cache) == 1
    ref_a = _reference_counts(part, a, a, True)
    ref_b = _reference_counts(part, b, b, True)
    assert not np.array_equal(ref_a, ref_b)
    return cache, part, pt, b, ref_b


def test_an_entry_kept_for_other_positions_partition_or_causal_flag_is_not_served():
    cache, part, pt, b, ref_b = _stale_case()
    got = cache.counts(pt, b, b, causal=True)
    np.testing.assert_array_equal(got.numpy(), ref_b)
    assert cache.hits == 0
    a = torch.arange(30)
    other = (pt[0], pt[1] + 0.5)  # another partition (offsets moved)
    assert not torch.equal(
        cache.counts(other, a, a, causal=True), cache.counts(pt, a, a, causal=True)
    )
    assert cache.hits == 1  # only the last call: the kept entry of (pt, a, causal)
    np.testing.assert_array_equal(
        cache.counts(pt, a, a, causal=False).numpy(),
        _reference_counts(part, a, a, False),
    )
    assert cache.hits == 1


def test_negative_control_a_key_that_ignores_the_positions_serves_the_stale_entry(monkeypatch):
    """The check above can fail: with the positions left out of the key and of the hit
    test, the counts kept for ``a`` are served for ``b``."""
    cache, part, pt, b, ref_b = _stale_case()
    a = torch.arange(30)
    key = dense.DenseCountCache.key
    monkeypatch.setattr(dense.DenseCountCache, "key", staticmethod(
        lambda pitch, offset, qpos, kpos, causal: key(pitch, offset, a, a, causal)))  # fmt: skip
    monkeypatch.setattr(dense.DenseCountCache, "same_positions", staticmethod(lambda *_: True))
    got = cache.counts(pt, b, b, causal=True)
    assert cache.hits == 1
    assert not np.array_equal(got.numpy(), ref_b)


def test_budget_evicts_least_recently_used_and_zero_keeps_nothing(monkeypatch):
    pt = partition_tensors(_partition(), "cpu")
    one = 4 * 20 * 20  # uint8 counts of 4 heads, 20 x 20 pairs: one byte per pair
    monkeypatch.setattr(dense, "DENSE_CACHE_BYTES", 2 * one)
    cache = dense.DenseCountCache()
    lengths = [torch.arange(20) + 100 * i for i in range(3)]
    for pos in lengths:
        for _ in range(2):
            assert cache.counts(pt, pos, pos, causal=True).shape == (1, 4, 20, 20)
    assert len(cache) == 2 and cache.nbytes == 2 * one  # the first was evicted
    cache.counts(pt, lengths[0], lengths[0], causal=True)
    assert cache.hits == 0
    cache.counts(pt, lengths[2], lengths[2], causal=True)
    assert cache.hits == 1
    # a quarter of the float32 bias the entry stands for
    assert one * 4 == dense.dense_count_bias(pt, lengths[0], lengths[0], causal=True,
                                             dtype=torch.float32).nbytes  # fmt: skip
    monkeypatch.setattr(dense, "DENSE_CACHE_BYTES", 0)
    empty = dense.DenseCountCache()
    for _ in range(3):
        empty.counts(pt, lengths[0], lengths[0], causal=True)
    assert len(empty) == 0 and empty.misses == 3


def test_use_dense_cache_selects_the_cache_and_checks_its_argument():
    cache = dense.DenseCountCache()
    assert dense.active_dense_cache() is not cache
    with dense.use_dense_cache(cache):
        assert dense.active_dense_cache() is cache
        inner = dense.DenseCountCache()
        with dense.use_dense_cache(inner):
            assert dense.active_dense_cache() is inner
        assert dense.active_dense_cache() is cache
    assert dense.active_dense_cache() is not cache
    with pytest.raises(TypeError, match="^cache: must be a DenseCountCache"):
        with dense.use_dense_cache(object()):
            pass


class _Counting:
    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def test_compiled_dense_route_is_one_graph_over_lengths_and_hits_inside_it():
    torch._dynamo.reset()
    pt = partition_tensors(_partition(seed=7), "cpu")
    backend = _Counting()

    def attend(q, pitch, offset):
        return plsh_attention(q, q, q, partition=(pitch, offset))

    compiled = torch.compile(attend, fullgraph=True, dynamic=True, backend=backend)
    cache = dense.DenseCountCache()
    g = torch.Generator().manual_seed(7)
    with dense.use_dense_cache(cache):  # the operator uses the cache active when it runs
        for n in (20, 33, 50):
            q = torch.randn(1, 4, n, 8, generator=g)
            eager = [attend(q, *pt) for _ in range(2)]  # miss, kept
            hits = cache.hits
            got = compiled(q, *pt)
            assert cache.hits == hits + 1  # the lookup ran inside the compiled graph
            assert torch.equal(got, eager[0])
    assert backend.graphs == 1
    torch._dynamo.reset()


def test_dense_counts_operator_passes_opcheck_and_copies_the_kept_counts():
    pt = partition_tensors(_partition(seed=9), "cpu")
    qpos = torch.tensor([[0, 1, 2, 3, 4], [-1, 0, 1, 2, 3]])
    for args in ((*pt, qpos, qpos, True), (*pt, torch.arange(6), torch.arange(9), False)):
        torch.library.opcheck(torch.ops.plsh.dense_counts.default, args)
    cache = dense.DenseCountCache()
    with dense.use_dense_cache(cache):
        first = dense.dense_counts_op(*pt, qpos, qpos, True)
        dense.dense_counts_op(*pt, qpos, qpos, True)
        served = dense.dense_counts_op(*pt, qpos, qpos, True)
    assert cache.hits == 1
    kept = next(iter(cache.entries.values()))[2]
    assert torch.equal(served, kept) and torch.equal(first, kept)
    assert served.data_ptr() != kept.data_ptr()  # a copy: the graph may reuse its memory


def test_biases_of_counts_equal_the_reference_bit_for_bit_for_every_s_up_to_300():
    """``log(C / s)`` looked up in the table equals the reference's ``count_bias(C, s)``
    for every ``s <= 300`` (``torch.log`` missed by one ulp at s = 35, 37, 128, ...)."""
    rng = np.random.default_rng(0)
    like = torch.zeros(3, dtype=torch.uint8)
    for s in range(1, 301):
        want = count_bias(np.arange(s + 1), s)  # the reference's log(c / s), -inf at 0
        np.testing.assert_array_equal(dense.log_count_table_op(like, s).numpy(), want)
        np.testing.assert_array_equal(dense.log_count_table(like, s).numpy(), want)
        c = rng.integers(0, s + 1, size=(1, 2, 7, 9))
        c[0, 0, 0, :2] = (0, s)
        got = dense.count_bias_of_counts(torch.from_numpy(c).to(dense.dense_count_dtype(s)), s)
        np.testing.assert_array_equal(got.numpy(), count_bias(c, s))
    torch.library.opcheck(torch.ops.plsh.log_count_table.default, (like, 8))


def test_rows_without_an_admissible_key_give_zero_output_and_minus_inf_lse():
    """Pad queries and fully padded rows (no admissible key) give 0 and LSE -inf, never NaN;
    real rows are unchanged by the padding of other rows."""
    pt = partition_tensors(_partition(seed=11), "cpu")
    g = torch.Generator().manual_seed(11)
    q = torch.randn(3, 4, 12, 8, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 12, dtype=torch.bool)
    mask[1, :5] = False
    mask[2, :] = False  # nothing to attend
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    kw = dict(partition=pt, causal=True, scale=0.3, query_positions=pos, key_positions=pos)
    out, lse = dense.dense_plsh_attention(q, q, q, attention_mask=mask, return_lse=True, **kw)
    assert not out.isnan().any() and not lse.isnan().any()
    assert torch.equal(out[2], torch.zeros_like(out[2])) and torch.isneginf(lse[2]).all()
    assert torch.equal(out[1, :, :5], torch.zeros_like(out[1, :, :5]))
    assert torch.isneginf(lse[1, :, :5]).all() and torch.isfinite(lse[1, :, 5:]).all()
    alone, _ = dense.dense_plsh_attention(q[:1], q[:1], q[:1], attention_mask=mask[:1],
                                          return_lse=True, **{**kw, "query_positions": pos[:1],
                                                              "key_positions": pos[:1]})  # fmt: skip
    assert torch.equal(alone[0], out[0])


def test_plsh_attention_layers_keep_their_counts_and_fresh_draws_keep_none():
    """``plsh_fast.nn.PLSHAttention`` owns a ``dense_cache``: a fixed partition (eval) hits
    from the third call on; a partition drawn anew every training forward keeps nothing."""
    from plsh_fast.nn import PLSHAttention

    layer = PLSHAttention(4, 8, seed=3)
    q = torch.randn(1, 4, 30, 8, generator=torch.Generator().manual_seed(3))
    shared = dense.active_dense_cache()
    before = (shared.hits, shared.misses)
    layer.eval()
    outs = [layer(q, q, q) for _ in range(3)]
    assert (layer.dense_cache.misses, layer.dense_cache.hits) == (2, 1)
    assert torch.equal(outs[2], outs[0])
    assert (shared.hits, shared.misses) == before  # the layer's own cache, not the shared one
    layer.train()  # resample="every_forward": a new partition per forward
    for _ in range(3):
        layer(q, q, q)
    assert layer.dense_cache.hits == 1 and len(layer.dense_cache) == 1  # nothing new kept
