"""The kept-plan cache's key, admission and eviction rules at their edges.

``plsh_fast/cpu/_plan_cache.py``: the key holds every input and setting that changes the
tile groups; the budget ``PLAN_CACHE_BYTES`` is met with equality (a plan of exactly the
budget is kept, one byte more is not); calls are remembered for admission in a bounded,
least-recently-used table of ``_SEEN_KEYS`` hashes; a kept plan whose key matches but whose
positions differ (a hash collision) is not served. Complements
``tests/fast/cpu/test_cpu_plan_cache.py`` (end-to-end through the CPU path).
"""

from __future__ import annotations

import types

import pytest
import torch

from plsh_fast import cpu
from plsh_fast.nn import PLSHAttention

plan_cache = cpu._plan_cache


@pytest.fixture(autouse=True)
def _fresh_cache():
    cpu.clear_plan_cache()
    yield
    cpu.clear_plan_cache()


def _partition(seed=0, heads=4):
    core = PLSHAttention(heads, 8, seed=seed)
    return core.pitch, core.offset


def _key(pitch=None, offset=None, qpos=None, kpos=None, causal=True, dtype=torch.float32):
    p0, o0 = _partition()
    pitch = p0 if pitch is None else pitch
    offset = o0 if offset is None else offset
    qpos = torch.arange(16) if qpos is None else qpos
    kpos = torch.arange(16) if kpos is None else kpos
    return plan_cache.cache_key(pitch, offset, qpos, kpos, causal, dtype)


class _FakePlan:
    """A stand-in with the attributes and methods the cache reads and calls (a built plan's
    are checked end to end in test_cpu_plan_cache.py): its key, its chunk store (``None``
    once dropped), its size, the cache it was planned under, and how often its ranges were
    dropped (a kept plan is made slim once admitted)."""

    def __init__(self, nbytes, key="k", qpos=None, kpos=None, kept_in=None):
        qpos = torch.arange(4) if qpos is None else qpos
        kpos = torch.arange(4) if kpos is None else kpos
        self.cache_key = (key, qpos, kpos)
        self.chunk_store: dict | None = {}
        self.specs: list | None = []
        self.nbytes = nbytes
        self.kept_in = kept_in
        self.ranges_dropped = 0

    def drop_chunks(self):
        self.chunk_store = None
        self.specs = None

    def drop_ranges(self):
        self.ranges_dropped += 1

    @property
    def dropped(self) -> bool:
        return self.chunk_store is None


def _fake_plan(nbytes, qpos=None, kpos=None, key="k"):
    return _FakePlan(nbytes, key=key, qpos=qpos, kpos=kpos)


def _kept(cache):
    """The keys a cache keeps (a set: which plans, not their order)."""
    return set(cache.plans)


# ----------------------------------------------------------------------------- the key


def test_the_key_is_none_exactly_when_the_budget_is_not_positive(monkeypatch):
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", 0)
    assert _key() is None
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", -5)
    assert _key() is None
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", 1)  # the smallest budget that keeps plans
    assert _key() is not None


def test_equal_inputs_give_equal_keys():
    p, o = _partition()
    a = _key(p, o, torch.arange(16), torch.arange(16))
    b = _key(p.clone(), o.clone(), torch.arange(16).clone(), torch.arange(16).clone())
    assert a == b and hash(a) == hash(b)
    assert a[0] is True  # the causal flag as a bool, not the object passed
    assert _key(causal=1) == _key(causal=True)


@pytest.mark.parametrize(
    "setting, value",
    [
        ("CHUNK_ELEMENTS", 1 << 12),
        ("PATTERN_ROWS_FRACTION", 0.5),
        ("BAND_MAX_TILE", 0),
        ("BAND_TILE", 64),
    ],
)
def test_every_setting_that_changes_the_tile_groups_is_in_the_key(monkeypatch, setting, value):
    before = _key()
    monkeypatch.setattr(cpu, setting, value)
    after = _key()
    assert after != before
    monkeypatch.undo()
    assert _key() == before  # negative control: restored settings, the same key


def test_each_input_is_in_the_key():
    p, o = _partition()
    base = _key(p, o)
    p2 = p.clone()
    p2[0, 0] += 1.0
    o2 = o.clone()
    o2[0, 0] += 0.5
    changed = [
        _key(pitch=p2),
        _key(offset=o2),
        _key(causal=False),
        _key(dtype=torch.float64),
        _key(qpos=torch.arange(1, 17)),
        _key(kpos=torch.arange(1, 17)),
        _key(qpos=torch.arange(15)),  # one query fewer
        _key(kpos=torch.arange(17)),  # one key more
    ]
    for other in changed:
        assert other != base
    # the pitch's shape: the same bytes as 8 x 4 heads/samples or 4 x 8 are different plans
    flat = _key(pitch=p.reshape(-1, p.shape[0]).contiguous(), offset=o.reshape(-1, o.shape[0]))
    assert flat != base
    assert base[2] == tuple(p.shape)


def test_the_key_counts_positions_as_well_as_their_digests():
    key = _key(qpos=torch.arange(10), kpos=torch.arange(12))
    assert key[5] == 10 and key[6] == 12  # query and key counts, in this order


# ----------------------------------------------------------------------------- admission


def test_seen_before_remembers_exactly_the_last_seen_keys():
    n = plan_cache._SEEN_KEYS
    assert n == 4096  # the documented table size (a smaller one admits fewer plans)
    assert not plan_cache.seen_before(("first",))
    assert plan_cache.seen_before(("first",))  # second call: admitted
    for i in range(n - 1):
        assert not plan_cache.seen_before(("other", i))
    assert len(plan_cache._SEEN) == n
    assert plan_cache.seen_before(("first",))  # still in the table (n entries), now newest
    assert not plan_cache.seen_before(("one more",))  # pushes out the least recent: other 0
    assert len(plan_cache._SEEN) == n
    assert not plan_cache.seen_before(("other", 0))  # forgotten
    # ("first",) was moved to the end when seen again, so it survived the push above
    assert plan_cache.seen_before(("first",))


# ----------------------------------------------------------------------------- the budget


def test_a_plan_of_exactly_the_budget_is_kept_and_one_byte_more_is_not(monkeypatch):
    pitch, offset = _partition()
    q, k, v = (
        torch.randn(1, 4, 96, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)
    )
    positions = torch.arange(96)

    def call():
        return cpu.plsh_forward_cpu(q, k, v, pitch, offset, positions, positions, 0.3, True)

    call()
    call()
    size = cpu.kept_plan_bytes()
    assert size > 0
    for budget, kept in ((size, size), (size - 1, 0)):
        cpu.clear_plan_cache()
        monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", budget)
        call()
        call()
        assert cpu.kept_plan_bytes() == kept, budget
        assert len(plan_cache._CACHE) == (1 if kept else 0)


# ----------------------------------------------------------------------------- eviction


def test_plans_that_fill_the_budget_exactly_are_all_kept(monkeypatch):
    """The budget is met with equality; beyond it the least recently used plan goes first,
    its chunks dropped, and a lowered budget applies at ``evict_beyond_budget``."""
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", 300)
    cache = plan_cache.PlanCache()
    a, b, c = _fake_plan(100, key="a"), _fake_plan(200, key="b"), _fake_plan(1, key="c")
    cache.remember(a)
    cache.remember(b)
    assert _kept(cache) == {"a", "b"} and cache.nbytes == 300 and len(cache) == 2  # 300 <= 300
    cache.evict_beyond_budget()
    assert _kept(cache) == {"a", "b"} and not a.dropped and not b.dropped
    cache.remember(c)  # 301 > 300: a, the least recently used, goes
    assert _kept(cache) == {"b", "c"} and cache.nbytes == 201
    assert a.dropped and not b.dropped and not c.dropped
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", 201)
    cache.evict_beyond_budget()  # 201 <= 201: nothing goes
    assert _kept(cache) == {"b", "c"}
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", 200)
    cache.evict_beyond_budget()  # 201 > 200: b goes, c stays
    assert _kept(cache) == {"c"} and cache.nbytes == 1 and b.dropped and not c.dropped
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", 1)
    cache.evict_beyond_budget()  # 1 <= 1
    assert _kept(cache) == {"c"}
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", 0)
    cache.evict_beyond_budget()  # a budget of 0 keeps nothing
    assert not cache.plans and cache.nbytes == 0 and c.dropped


def test_the_module_level_eviction_applies_to_the_active_cache(monkeypatch):
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", 100)
    own = plan_cache.PlanCache()
    a = _FakePlan(100, key="a", kept_in=own)
    plan_cache.remember(a)  # into the cache it was planned under, not the process-wide one
    assert _kept(own) == {"a"} and not plan_cache._CACHE and cpu.kept_plan_bytes() == 0
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", 99)
    plan_cache.evict_beyond_budget()  # the default cache is active: own is left alone
    assert _kept(own) == {"a"}
    with plan_cache.use_plan_cache(own):
        assert plan_cache.active_plan_cache() is own
        plan_cache.evict_beyond_budget()
    assert not own.plans and a.dropped


def test_a_served_plan_becomes_the_most_recently_used(monkeypatch):
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", 200)
    for serve_a in (True, False):  # False: the negative control, a stays the oldest
        cache = plan_cache.PlanCache()
        a, b = _fake_plan(100, key="a"), _fake_plan(100, key="b")
        cache.remember(a)
        cache.remember(b)
        if serve_a:
            assert cache.get("a", *a.cache_key[1:]) is a
        cache.remember(_fake_plan(1, key="c"))  # over budget: the least recently used goes
        assert _kept(cache) == ({"a", "c"} if serve_a else {"b", "c"})


def test_a_key_collision_is_not_served():
    cache = plan_cache.PlanCache()
    a = _fake_plan(10, qpos=torch.arange(4), kpos=torch.arange(4), key="a")
    cache.remember(a)
    assert cache.get("a", torch.arange(4), torch.arange(4)) is a
    assert cache.get("a", torch.arange(1, 5), torch.arange(4)) is None  # other queries
    assert cache.get("a", torch.arange(4), torch.arange(1, 5)) is None  # other keys
    assert cache.get("other", torch.arange(4), torch.arange(4)) is None
    with plan_cache.use_plan_cache(cache):  # the module-level lookup reads the active cache
        assert plan_cache.cached_plan("a", torch.arange(4), torch.arange(4)) is a
        assert plan_cache.cached_plan("a", torch.arange(1, 5), torch.arange(4)) is None
    assert plan_cache.cached_plan("a", torch.arange(4), torch.arange(4)) is None


def test_remembering_the_same_inputs_twice_keeps_the_newer_plan_once(monkeypatch):
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", 1000)
    old, new = _fake_plan(40, key="a"), _fake_plan(70, key="a")
    plan_cache.remember(old)
    plan_cache.remember(old)  # the same plan again: counted once, made slim once
    assert cpu.kept_plan_bytes() == 40 and old.ranges_dropped == 1
    plan_cache.remember(new)
    assert cpu.kept_plan_bytes() == 70 and plan_cache._CACHE["a"] is new
    assert old.dropped and not new.dropped and new.ranges_dropped == 1
    # plans without chunks or without a key are never kept
    no_chunks = _fake_plan(5, key="b")
    no_chunks.chunk_store = None
    plan_cache.remember(no_chunks)
    no_key = _fake_plan(5, key="c")
    no_key.cache_key = None
    plan_cache.remember(no_key)
    assert set(plan_cache._CACHE) == {"a"} and cpu.kept_plan_bytes() == 70
    assert no_chunks.ranges_dropped == 0 and no_key.ranges_dropped == 0


def test_clear_drops_the_chunks_of_every_kept_plan(monkeypatch):
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", 1000)
    own = plan_cache.PlanCache()
    plans = [_fake_plan(5, key=i) for i in range(3)]
    mine = [_FakePlan(7, key=i, kept_in=own) for i in range(2)]
    for p in plans + mine:
        plan_cache.remember(p)
    plan_cache.seen_before(("x",))
    own.seen_before(("y",))
    assert cpu.kept_plan_bytes() == 15 and own.nbytes == 14
    cpu.clear_plan_cache()  # the process-wide cache only
    assert all(p.dropped for p in plans) and not any(p.dropped for p in mine)
    assert cpu.kept_plan_bytes() == 0 and not plan_cache._CACHE and not plan_cache._SEEN
    assert len(own) == 2 and own.seen
    own.clear()
    assert all(p.dropped for p in mine) and own.nbytes == 0 and not own.plans and not own.seen


def test_a_cache_copies_and_pickles_empty():
    import copy
    import pickle

    cache = plan_cache.PlanCache()
    cache.remember(_fake_plan(5, key="a"))
    cache.seen_before(("a",))
    for other in (copy.deepcopy(cache), pickle.loads(pickle.dumps(cache))):
        assert isinstance(other, plan_cache.PlanCache) and other is not cache
        assert len(other) == 0 and other.nbytes == 0 and not other.seen
        other.remember(_fake_plan(3, key="b"))  # a working cache of its own
        assert _kept(other) == {"b"} and _kept(cache) == {"a"}


def test_use_plan_cache_nests_restores_and_refuses_other_objects():
    first, second = plan_cache.PlanCache(), plan_cache.PlanCache()
    assert plan_cache.active_plan_cache() is plan_cache._DEFAULT
    with plan_cache.use_plan_cache(first) as got:
        assert got is first and plan_cache.active_plan_cache() is first  # empty, yet active
        with plan_cache.use_plan_cache(second):
            assert plan_cache.active_plan_cache() is second
        assert plan_cache.active_plan_cache() is first
    assert plan_cache.active_plan_cache() is plan_cache._DEFAULT
    with pytest.raises(TypeError, match=r"^cache: must be a PlanCache, got dict$"):
        with plan_cache.use_plan_cache({}):
            pass
    assert plan_cache.active_plan_cache() is plan_cache._DEFAULT


def test_no_kept_plans_nests_and_restores():
    assert plan_cache.bypassed() is False
    with cpu.no_kept_plans():
        assert plan_cache.bypassed()
        with cpu.no_kept_plans():
            assert plan_cache.bypassed()
        assert plan_cache.bypassed()  # the inner exit restores the outer state
    assert plan_cache.bypassed() is False


def _built_bytes(plan):
    """Bytes of the tensors a kept plan holds: its built chunks' and its specs'."""
    total = 0
    for chunk in plan.chunk_store.values():
        assert chunk is not None  # every chunk built by the call that kept the plan
        total += sum(
            t.numel() * t.element_size() for t in vars(chunk).values() if torch.is_tensor(t)
        )
    for spec in plan.specs:
        # a kept (slim) work item holds its tiles ``sel`` and window starts ``lo`` only
        assert all(t is None for t in spec[5:-1])
        total += sum(t.numel() * t.element_size() for t in spec if torch.is_tensor(t))
    return total


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("band_max_tile", [0, 32])
@pytest.mark.parametrize("n", [96, 200])
def test_the_kept_bytes_are_the_bytes_the_kept_plan_holds(monkeypatch, dtype, band_max_tile, n):
    """``keep_chunks`` sizes a plan before any chunk is built; the estimate is exact: the
    bytes of the tensors its built (compact) chunks and its kept work items hold."""
    monkeypatch.setattr(cpu, "BAND_MAX_TILE", band_max_tile)
    pitch, offset = _partition()
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(1, 4, n, 8, generator=g, dtype=dtype) for _ in range(3))
    positions = torch.arange(n)
    for _ in range(2):
        cpu.plsh_forward_cpu(q, k, v, pitch, offset, positions, positions, 0.3, True)
    (plan,) = plan_cache._CACHE.values()
    assert plan.nbytes == _built_bytes(plan) == cpu.kept_plan_bytes() > 0


def _spec_plan(cache_key=("k",), chunk_store=None):
    """A plan with one work item of 2 tiles of 4 rows and 3 keys (what keep_chunks reads)."""
    sel = torch.arange(2)
    spec = (0, 4, 3, sel, torch.zeros(2, dtype=torch.int64))
    return types.SimpleNamespace(
        cache_key=cache_key,
        chunk_store=chunk_store,
        pitch=torch.ones(1, 8, dtype=torch.float64),
        specs=[spec],
    )


def test_keep_chunks_admits_a_plan_of_exactly_the_budget(monkeypatch):
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", 10**9)
    sized = _spec_plan()
    plan_cache.keep_chunks(sized)
    size = sized.nbytes
    assert sized.chunk_store == {id(sized.specs[0]): None}  # to be built on first use
    assert size > 0
    for budget, kept in ((size, True), (size - 1, False)):
        monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", budget)
        plan = _spec_plan()
        plan_cache.keep_chunks(plan)
        assert (plan.chunk_store is not None) is kept, budget
        assert hasattr(plan, "nbytes") is kept, budget
    # not admitted (no key), or already keeping its chunks: left alone
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", 10**9)
    unadmitted = _spec_plan(cache_key=None)
    plan_cache.keep_chunks(unadmitted)
    assert unadmitted.chunk_store is None and not hasattr(unadmitted, "nbytes")
    store: dict = {}
    holding = _spec_plan(chunk_store=store)
    plan_cache.keep_chunks(holding)
    assert holding.chunk_store is store and not hasattr(holding, "nbytes")


def test_keep_chunks_sizes_the_counts_in_their_own_dtype(monkeypatch):
    """More samples need a wider count dtype (``count_dtype``): the estimate grows by the
    count bytes only (2 tiles x 4 rows x 3 keys counts)."""
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", 10**9)
    narrow, wide = _spec_plan(), _spec_plan()
    wide.pitch = torch.ones(1, 300, dtype=torch.float64)
    plan_cache.keep_chunks(narrow)
    plan_cache.keep_chunks(wide)
    width = [torch.empty((), dtype=cpu._chunks.count_dtype(s)).element_size() for s in (8, 300)]
    assert width[1] > width[0]
    assert wide.nbytes - narrow.nbytes == 2 * 4 * 3 * (width[1] - width[0])


def test_no_kept_plans_is_off_in_a_new_thread():
    """Thread-local: a thread that never entered ``no_kept_plans`` is not bypassed (False,
    not merely falsy), also while another thread is inside it."""
    import threading

    seen = []
    with cpu.no_kept_plans():
        worker = threading.Thread(target=lambda: seen.append(plan_cache.bypassed()))
        worker.start()
        worker.join()
    assert seen == [False] and seen[0] is False
