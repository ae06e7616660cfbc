"""Plans kept across calls by the CPU path (step 8, ``plsh_fast/cpu/_plan_cache.py``).

A plan is kept from the second call with its inputs on; a call whose partition,
positions, causal flag and compute dtype equal a kept plan's skips planning and bias
building and returns bit-identical results; anything else that differs (a position
changed in place, a pitch, the causal flag) plans afresh; the byte budget
``PLAN_CACHE_BYTES`` bounds what is kept (least recently used out, a lowered budget at
the next call) and ``0`` disables it.
"""

from __future__ import annotations

import pytest
import torch

from plsh_fast import cpu, plsh_attention
from plsh_fast.nn import PLSHAttention


def _partition(seed=0, heads=4):
    core = PLSHAttention(heads, 8, seed=seed)
    return core.pitch, core.offset


def _qkv(n=96, heads=4, d=8, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(1, heads, n, d, generator=g).requires_grad_(requires_grad) for _ in range(3)
    ]


@pytest.fixture
def counted(monkeypatch):
    """Counts of ``_planning.make_plan`` (planning) and ``_chunks.make_chunk`` (bias
    building) calls."""
    calls = {"plan": 0, "chunk": 0}
    real_plan, real_chunk = cpu._planning.make_plan, cpu._chunks.make_chunk

    def plan(*args):
        calls["plan"] += 1
        return real_plan(*args)

    def chunk(self, *args):
        calls["chunk"] += 1
        return real_chunk(self, *args)

    monkeypatch.setattr(cpu._planning, "make_plan", plan)
    monkeypatch.setattr(cpu._chunks, "make_chunk", chunk)
    return calls


def _forward(q, k, v, pitch, offset, positions, causal=True):
    return cpu.plsh_forward_cpu(q, k, v, pitch, offset, positions, positions, 0.3, causal)


def _kept(*args, **kwargs):
    """Call :func:`_forward` twice: a plan is kept from the second call with its inputs on."""
    _forward(*args, **kwargs)
    return _forward(*args, **kwargs)


def test_a_repeated_call_skips_planning_and_bias_building(counted, monkeypatch):
    q, k, v = _qkv()
    pitch, offset = _partition()
    positions = torch.arange(96)
    first = _forward(q, k, v, pitch, offset, positions)
    built = counted["chunk"]
    assert counted["plan"] == 1 and built > 0
    assert cpu.kept_plan_bytes() == 0  # seen once: nothing kept
    second = _forward(q, k, v, pitch, offset, positions)
    assert counted == {"plan": 2, "chunk": 2 * built} and cpu.kept_plan_bytes() > 0
    again = _forward(q, k, v, pitch, offset, positions.clone())  # equal values, new tensor
    assert counted == {"plan": 2, "chunk": 2 * built}
    for a, b, c in zip(first, second, again):
        assert torch.equal(a, b) and torch.equal(a, c)
    # Negative control: with the cache off every call plans and builds again, and the
    # result is the same bit for bit; the kept plan is dropped at that call.
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", 0)
    fresh = _forward(q, k, v, pitch, offset, positions)
    assert counted == {"plan": 3, "chunk": 3 * built} and cpu.kept_plan_bytes() == 0
    for a, b in zip(first, fresh):
        assert torch.equal(a, b)


def test_calls_seen_once_keep_nothing(counted):
    """A decoding loop (every call with one more key) must not fill the cache."""
    q = _qkv(n=1)[0]
    pitch, offset = _partition()
    for n_k in range(20, 60):
        k, v = _qkv(n=n_k)[1:]
        cpu.plsh_forward_cpu(
            q, k, v, pitch, offset, torch.tensor([n_k - 1]), torch.arange(n_k), 0.3, True
        )
    assert cpu.kept_plan_bytes() == 0 and len(cpu._plan_cache._CACHE) == 0
    assert counted["plan"] == 40
    # What remembers them is one int per call, not the key (which holds the partition's
    # bytes: 16 KB per call at 16 heads and s = 64).
    assert len(cpu._plan_cache._SEEN) == 40 and all(type(d) is int for d in cpu._plan_cache._SEEN)


def test_per_sequence_positions_get_one_plan_each_within_the_budget():
    """Batch rows with their own positions (same length) are distinct plans, not one key
    that each row overwrites (found by review: the overwritten plans kept their biases
    beyond the budget)."""
    n, batch = 64, 4
    q, k, v = (
        torch.randn(batch, 4, n, 8, generator=torch.Generator().manual_seed(1)) for _ in range(3)
    )
    positions = torch.stack([torch.arange(n) + 777 * b for b in range(batch)])
    for _ in range(3):
        plsh_attention(
            q, k, v, seed=0, num_samples=4, query_positions=positions, key_positions=positions
        )
    assert len(cpu._plan_cache._CACHE) == batch
    sizes = [p.nbytes for p in cpu._plan_cache._CACHE.values()]
    assert cpu.kept_plan_bytes() == sum(sizes) <= cpu.PLAN_CACHE_BYTES


def test_a_lowered_budget_takes_effect_at_the_next_call(monkeypatch):
    q, k, v = _qkv()
    pitch, offset = _partition()
    positions = torch.arange(96)
    _kept(q, k, v, pitch, offset, positions)
    size = cpu.kept_plan_bytes()
    assert size > 0
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", size - 1)
    _forward(q, k, v, pitch, offset, positions[:50])  # any call
    assert cpu.kept_plan_bytes() == 0
    _kept(q, k, v, pitch, offset, positions)
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", 0)
    _forward(q, k, v, pitch, offset, positions)
    assert cpu.kept_plan_bytes() == 0 and len(cpu._plan_cache._CACHE) == 0


@pytest.mark.parametrize("tile", [0, 7, 24, 48, 200, 256])
def test_a_band_tile_outside_the_powers_of_two_is_refused(monkeypatch, tile):
    monkeypatch.setattr(cpu, "BAND_TILE", tile)
    q, k, v = _qkv()
    pitch, offset = _partition()
    with pytest.raises(ValueError, match="^BAND_TILE: must be a power of two in"):
        _forward(q, k, v, pitch, offset, torch.arange(96))
    monkeypatch.setattr(cpu, "BAND_MAX_TILE", 0)  # no bands: the setting is not used
    _forward(q, k, v, pitch, offset, torch.arange(96))


@pytest.mark.parametrize("change", ["position_in_place", "pitch", "offset", "causal", "dtype"])
def test_any_changed_input_plans_afresh(counted, change):
    q, k, v = _qkv()
    pitch, offset = _partition()
    positions = torch.arange(96)
    _kept(q, k, v, pitch, offset, positions)
    assert counted["plan"] == 2
    causal = True
    if change == "position_in_place":
        positions[40] = 41  # same length and end points: only the values tell
    elif change == "pitch":
        pitch = pitch.clone()
        pitch[1, 2] *= 1.5
    elif change == "offset":
        offset = offset.clone()
        offset[0, 0] += 0.25
    elif change == "causal":
        causal = False
    else:
        q, k, v = (t.double() for t in (q, k, v))
    out, lse = _forward(q, k, v, pitch, offset, positions, causal)
    assert counted["plan"] == 3
    cpu.clear_plan_cache()
    ref_out, ref_lse = _forward(q, k, v, pitch, offset, positions, causal)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


def test_the_backward_reuses_the_kept_chunks(counted):
    q, k, v = _qkv(requires_grad=True)
    with torch.no_grad():
        plsh_attention(q, k, v, seed=0, num_samples=4)  # seen once
    counted["chunk"] = 0
    out = plsh_attention(q, k, v, seed=0, num_samples=4)  # kept from this call on
    built = counted["chunk"]
    out.square().sum().backward()
    assert counted["chunk"] == built  # no bias rebuilt for the backward
    grads = [t.grad.clone() for t in (q, k, v)]
    # Same gradients as a run that keeps nothing.
    cpu.clear_plan_cache()
    for t in (q, k, v):
        t.grad = None
    cpu.PLAN_CACHE_BYTES, saved = 0, cpu.PLAN_CACHE_BYTES
    try:
        plsh_attention(q, k, v, seed=0, num_samples=4).square().sum().backward()
    finally:
        cpu.PLAN_CACHE_BYTES = saved
    # Negative control: without keeping, the forward builds and the backward builds again.
    assert counted["chunk"] == built + 2 * built
    for t, g in zip((q, k, v), grads):
        assert torch.equal(t.grad, g)


def test_the_budget_bounds_what_is_kept(counted, monkeypatch):
    q, k, v = _qkv()
    positions = torch.arange(96)
    partitions = [_partition(seed) for seed in range(3)]
    for p in partitions:  # seen once each
        _forward(q, k, v, *p, positions)
    counted["plan"] = 0
    _forward(q, k, v, *partitions[0], positions)
    (first,) = cpu._plan_cache._CACHE.values()
    size = first.nbytes
    assert size > 0 and cpu.kept_plan_bytes() == size
    # Room for two plans: the least recently used one goes when a third comes.
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", 2 * size + size // 2)
    for p in partitions[1:]:
        _forward(q, k, v, *p, positions)
    assert counted["plan"] == 3
    assert cpu.kept_plan_bytes() <= cpu.PLAN_CACHE_BYTES
    assert len(cpu._plan_cache._CACHE) == 2
    # The evicted plan dropped its chunks (an autograd graph holding it keeps no bias).
    assert (
        all(p is not first for p in cpu._plan_cache._CACHE.values()) and first.chunk_store is None
    )
    _forward(q, k, v, *partitions[2], positions)  # kept
    assert counted["plan"] == 3
    _forward(q, k, v, *partitions[0], positions)  # evicted: planned again
    assert counted["plan"] == 4
    # A plan larger than the whole budget is never kept, and its chunks are not held.
    cpu.clear_plan_cache()
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", size // 2)
    for _ in range(3):
        _forward(q, k, v, *partitions[1], positions)
    assert counted["plan"] == 7 and len(cpu._plan_cache._CACHE) == 0


def test_a_plan_kept_in_inference_mode_serves_a_call_with_gradients():
    q, k, v = _qkv(requires_grad=True)
    with torch.inference_mode():
        for _ in range(2):
            kept = plsh_attention(q.detach(), k.detach(), v.detach(), seed=0, num_samples=4)
    assert cpu.kept_plan_bytes() > 0
    out = plsh_attention(q, k, v, seed=0, num_samples=4)
    out.sum().backward()
    assert torch.equal(out.detach(), kept)
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


def test_clear_plan_cache_forgets_everything(counted):
    q, k, v = _qkv()
    pitch, offset = _partition()
    positions = torch.arange(96)
    _kept(q, k, v, pitch, offset, positions)
    assert len(cpu._plan_cache._CACHE) == 1
    cpu.clear_plan_cache()
    assert len(cpu._plan_cache._CACHE) == 0 and cpu.kept_plan_bytes() == 0
    _forward(q, k, v, pitch, offset, positions)
    assert counted["plan"] == 3


def test_only_the_plans_own_work_items_are_kept():
    """Work items recomputed by a caller (``head_specs``) are built afresh, never matched
    by ``id`` to a kept chunk (a temporary's id can be reused by the next temporary)."""
    q, k, v = _qkv()
    pitch, offset = _partition()
    positions = torch.arange(96)
    _kept(q, k, v, pitch, offset, positions)
    plan = cpu.plan_cpu(pitch, offset, positions, positions, True, torch.float32)
    assert plan.chunk_store is not None  # the kept plan
    kept = len(plan.chunk_store)
    for h in range(4):
        for spec in plan.head_specs(h):
            chunk = plan.build(spec)
            assert chunk.bias.shape == (spec[3].numel(), spec[1], spec[2])
    assert len(plan.chunk_store) == kept
    assert all(chunk is not None for chunk in plan.chunk_store.values())


def test_no_kept_plans_plans_afresh_and_leaves_the_kept_plans_alone(counted):
    q, k, v = _qkv()
    pitch, offset = _partition()
    positions = torch.arange(96)
    _kept(q, k, v, pitch, offset, positions)
    kept = cpu.kept_plan_bytes()
    assert counted["plan"] == 2 and kept > 0
    with cpu.no_kept_plans():
        with cpu.no_kept_plans():  # nests
            _forward(q, k, v, pitch, offset, positions)
        _forward(q, k, v, pitch, offset, positions[:50])
        _forward(q, k, v, pitch, offset, positions[:50])  # a repeat is not kept either
    assert counted["plan"] == 5
    assert cpu.kept_plan_bytes() == kept and len(cpu._plan_cache._CACHE) == 1
    _forward(q, k, v, pitch, offset, positions)  # outside: the kept plan serves again
    assert counted["plan"] == 5


@pytest.mark.parametrize("num_samples, dtype", [(16, torch.uint8), (300, torch.int16)])
def test_kept_chunks_hold_counts_and_give_back_the_bias_bit_for_bit(num_samples, dtype):
    """A kept chunk holds its counts in the smallest integer dtype, no bias; the bias
    read back from the table equals the freshly built one bit for bit, and so do the
    outputs (float64 too: the table is per compute dtype)."""
    core = PLSHAttention(4, num_samples, seed=3)
    positions = torch.arange(200)
    for work in (torch.float32, torch.float64):
        q, k, v = (x.to(work) for x in _qkv(n=200))
        fresh = _forward(q, k, v, core.pitch, core.offset, positions)
        kept = _kept(q, k, v, core.pitch, core.offset, positions)
        for a, b in zip(fresh, kept):
            assert torch.equal(a, b)
        plan = cpu.plan_cpu(core.pitch, core.offset, positions, positions, True, work)
        stored = [c for c in plan.chunk_store.values()]
        assert stored and all(c.bias is None and c.counts.dtype == dtype for c in stored)
        for spec, full in zip(plan.specs, plan_full(plan, plan.specs)):
            rebuilt = plan.build(spec)
            built = cpu._chunks.make_chunk(plan, *full)
            assert rebuilt.bias.dtype == work and torch.equal(rebuilt.bias, built.bias)
            assert torch.equal(rebuilt.keys, built.keys) and rebuilt.keys.dtype == torch.int64
        # What is counted is what is held: the compact chunks, and per kept item its
        # tiles and window starts only (the rows' ranges are dropped, Plan.drop_ranges).
        assert all(spec[5:9] == (None,) * 4 for spec in plan.specs)
        held = sum(c.nbytes() for c in stored)
        items = sum(x.numel() * x.element_size() for spec in plan.specs for x in spec[3:5])
        assert held + items == plan.nbytes
        # A call still holding the slim items after the chunks were dropped (evicted
        # meanwhile) plans them again, bit for bit.
        slim = list(plan.specs)
        plan.drop_chunks()
        for spec, built in zip(
            slim, (cpu._chunks.make_chunk(plan, *s) for s in plan_full(plan, slim))
        ):
            assert torch.equal(plan.build(spec).bias, built.bias)
        cpu.clear_plan_cache()


def plan_full(plan, slim):
    """The full work items of ``slim`` ones, from :meth:`Plan.head_specs`."""
    return [plan.head_specs(spec[0])[spec[-1]] for spec in slim]


def test_a_chunk_with_a_bias_off_the_table_does_not_survive_compaction():
    """Negative control of the exactness argument: ``compact`` recovers counts only from
    biases that are entries of the table; a bias shifted by one ulp comes back different."""
    q, k, v = _qkv()
    pitch, offset = _partition()
    positions = torch.arange(96)
    plan = cpu.plan_cpu(pitch, offset, positions, positions, True, torch.float32)
    spec = cpu._planning.chunk_specs(plan, 1)[0]
    chunk = cpu._chunks.make_chunk(plan, *spec)
    finite = torch.isfinite(chunk.bias) & (chunk.bias < 0)
    assert finite.any()
    chunk.bias = torch.where(finite, torch.nextafter(chunk.bias, torch.tensor(0.0)), chunk.bias)
    back = chunk.compact(plan.log_counts).expand(plan.log_counts)
    assert not torch.equal(back.bias, chunk.bias)


def test_each_layer_keeps_its_plan_in_its_own_cache(counted, monkeypatch):
    """With a budget that holds one plan, two layers alternating in the shared cache evict
    each other's plan at every call (the negative control); each in its own PlanCache
    (``use_plan_cache``, as :class:`plsh_fast.nn.PLSHAttention` does), both stay kept."""
    q, k, v = _qkv()
    positions = torch.arange(96)
    layers = [_partition(seed) for seed in (5, 6)]
    _kept(q, k, v, *layers[0], positions)
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", cpu.kept_plan_bytes() * 3 // 2)
    cpu.clear_plan_cache()
    counted["plan"] = 0
    for _ in range(4):  # shared: after the first two rounds every call plans again
        for p in layers:
            _forward(q, k, v, *p, positions)
    assert counted["plan"] == 8
    caches = [cpu.PlanCache(), cpu.PlanCache()]
    counted["plan"] = 0
    results = []
    for _ in range(4):
        for p, cache in zip(layers, caches):
            with cpu.use_plan_cache(cache):
                results.append(_forward(q, k, v, *p, positions))
    assert counted["plan"] == 4  # two calls each to be kept, then none
    assert all(len(c) == 1 and 0 < c.nbytes <= cpu.PLAN_CACHE_BYTES for c in caches)
    for a, b in zip(results[-2:], results[:2]):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    with pytest.raises(TypeError, match="^cache: must be a PlanCache"):
        with cpu.use_plan_cache({}):
            pass


def test_a_model_of_layers_keeps_one_plan_per_layer(counted, monkeypatch):
    """PLSHAttention layers keep their plans in their own caches: with a budget that holds
    one plan, four layers called in turn plan twice each (to be kept), then never again;
    the process-wide cache stays empty. A copy of a layer starts with an empty cache."""
    import copy

    q, k, v = _qkv()
    layers = [PLSHAttention(4, 8, seed=seed, resample="fixed") for seed in range(4)]
    for layer in layers:
        layer.eval()
    layers[0](q, k, v)
    layers[0](q, k, v)
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", layers[0].plan_cache.nbytes * 3 // 2)
    for layer in layers:
        layer.plan_cache.clear()
    counted["plan"] = 0
    first = [layer(q, k, v) for layer in layers]
    for _ in range(3):
        again = [layer(q, k, v) for layer in layers]
    assert counted["plan"] == 8
    assert all(len(layer.plan_cache) == 1 for layer in layers) and cpu.kept_plan_bytes() == 0
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    twin = copy.deepcopy(layers[0])
    assert len(twin.plan_cache) == 0 and torch.equal(twin(q, k, v), first[0])
