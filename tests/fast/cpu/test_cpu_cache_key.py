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


def _fake_plan(nbytes, qpos=None, kpos=None, key="k"):
    """A stand-in with the attributes the cache reads (a built plan's are checked end to end
    in test_cpu_plan_cache.py)."""
    qpos = torch.arange(4) if qpos is None else qpos
    kpos = torch.arange(4) if kpos is None else kpos
    return types.SimpleNamespace(cache_key=(key, qpos, kpos), chunk_store={}, nbytes=nbytes)


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
        total += sum(t.numel() * t.element_size() for t in spec[4:] if torch.is_tensor(t))
    return total


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
