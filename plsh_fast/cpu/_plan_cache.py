"""The kept-plan cache of the CPU path (package docstring, step 8).

Plans (tile groups with their count biases and indices built) are kept across calls
within ``PLAN_CACHE_BYTES``, least recently used first out, from the second call with
equal inputs on (:func:`seen_before`); a later call with equal partition, positions,
causal flag and compute dtype (:func:`cache_key`, :func:`cached_plan`) reuses one.
:func:`plsh_fast.cpu._planning.plan_cpu` consults this cache; :func:`keep_chunks` and
:func:`remember` admit a plan. User-facing: :func:`clear_plan_cache`,
:func:`no_kept_plans`, :func:`kept_plan_bytes`.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict

import torch

from . import _settings as settings

__all__ = [
    "bypassed",
    "cache_key",
    "cached_plan",
    "clear_plan_cache",
    "evict_beyond_budget",
    "keep_chunks",
    "kept_plan_bytes",
    "no_kept_plans",
    "remember",
    "seen_before",
]

_CACHE: OrderedDict = OrderedDict()  # key -> kept Plan, least recently used first
_CACHE_BYTES = 0  # sum of the kept plans' nbytes
#: ``hash`` of the keys of recent calls (admission on the second call); hashes, not the
#: keys, so that 4096 remembered calls do not hold 4096 copies of the partition's bytes.
_SEEN: OrderedDict = OrderedDict()
_SEEN_KEYS = 4096
_CACHE_LOCK = threading.Lock()


_BYPASS = threading.local()  # no_kept_plans() active in this thread


def bypassed() -> bool:
    """Whether :func:`no_kept_plans` is active in this thread."""
    return getattr(_BYPASS, "on", False)


@contextlib.contextmanager
def no_kept_plans():
    """Context manager: CPU calls of this thread plan afresh and leave the kept plans alone.

    Inside it :func:`plsh_fast.cpu.plan_cpu` neither uses, keeps nor evicts plans (unlike
    ``PLAN_CACHE_BYTES = 0``, which also drops what is kept at the next call): for a
    one-off call whose plan should not displace the kept ones, or to time a call that
    plans (``benchmarks/cpu_bench.py``, ``plsh_cold``). Thread-local: the pool's workers
    do not plan. Nests.
    """
    previous = getattr(_BYPASS, "on", False)
    _BYPASS.on = True
    try:
        yield
    finally:
        _BYPASS.on = previous


def clear_plan_cache() -> None:
    """Forget every plan the CPU path keeps across calls (``PLAN_CACHE_BYTES``).

    Frees their count biases and indices, also where an autograd graph still holds a
    plan (its backward builds them again). Safe to call at any time, also while other
    threads run CPU calls (a call holding a plan keeps working).
    """
    global _CACHE_BYTES
    with _CACHE_LOCK:
        for plan in _CACHE.values():
            plan.chunk_store = None
        _CACHE.clear()
        _SEEN.clear()
        _CACHE_BYTES = 0


def cache_key(pitch, offset, query_positions, key_positions, causal, dtype):
    """Hashable key of a plan's inputs (positions are compared again on a hit), or
    ``None`` when plans are not kept. The package settings that change the tile groups are
    in it."""
    if settings.PLAN_CACHE_BYTES <= 0:
        return None

    def digest(x):
        return hash(x.detach().cpu().contiguous().numpy().tobytes())

    return (
        bool(causal),
        dtype,
        tuple(pitch.shape),
        pitch.detach().cpu().numpy().tobytes(),
        offset.detach().cpu().numpy().tobytes(),
        query_positions.numel(),
        key_positions.numel(),
        digest(query_positions),
        digest(key_positions),
        settings.CHUNK_ELEMENTS,
        settings.PATTERN_ROWS_FRACTION,
        settings.BAND_MAX_TILE,
        settings.BAND_TILE,
    )


def _evict_beyond_budget() -> None:
    """Drop least recently used plans until the kept ones fit ``PLAN_CACHE_BYTES``
    (caller holds the lock). An evicted forward's plan lives on in its autograd graph:
    its chunks are dropped there too (its backward builds them again)."""
    global _CACHE_BYTES
    while _CACHE and _CACHE_BYTES > settings.PLAN_CACHE_BYTES:
        _, old = _CACHE.popitem(last=False)
        _CACHE_BYTES -= old.nbytes
        old.chunk_store = None


def evict_beyond_budget() -> None:
    """Apply a lowered ``PLAN_CACHE_BYTES`` (or 0) now: drop least recently used plans
    until the kept ones fit (takes the lock; nothing to do when nothing is kept)."""
    if _CACHE:
        with _CACHE_LOCK:
            _evict_beyond_budget()


def cached_plan(key, query_positions, key_positions):
    with _CACHE_LOCK:
        plan = _CACHE.get(key)
        if plan is None:
            return None
        _, qpos, kpos = plan.cache_key
        if not (torch.equal(qpos, query_positions) and torch.equal(kpos, key_positions)):
            return None  # a hash collision
        _CACHE.move_to_end(key)
        return plan


def seen_before(key) -> bool:
    """Whether a recent call had this key (then its plan may be kept); remembers it. A
    hash collision only keeps a plan one call early."""
    digest = hash(key)
    with _CACHE_LOCK:
        if digest in _SEEN:
            _SEEN.move_to_end(digest)
            return True
        _SEEN[digest] = None
        while len(_SEEN) > _SEEN_KEYS:
            _SEEN.popitem(last=False)
        return False


def _tensor_bytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def keep_chunks(plan) -> None:
    """Let ``plan`` keep its chunks when they fit ``PLAN_CACHE_BYTES`` (sizes known
    from the tile groups before any is built)."""
    if plan.cache_key is None or plan.chunk_store is not None:
        return
    elem = torch.empty((), dtype=plan.dtype).element_size()
    estimate = 0
    for spec in plan.specs:
        _, tile, w, sel = spec[:4]
        estimate += sel.numel() * tile * (w * elem + 9) + sel.numel() * w * 8
        estimate += _tensor_bytes(*(t for t in spec[4:] if isinstance(t, torch.Tensor)))
    if estimate <= settings.PLAN_CACHE_BYTES:
        plan.chunk_store = dict.fromkeys(map(id, plan.specs))  # built on first use
        plan.nbytes = estimate


def remember(plan) -> None:
    """Keep ``plan`` (whose chunks are all built) in the cache, evicting the least
    recently used plans beyond ``PLAN_CACHE_BYTES``."""
    global _CACHE_BYTES
    if plan.chunk_store is None or plan.cache_key is None:
        return
    key = plan.cache_key[0]
    with _CACHE_LOCK:
        old = _CACHE.get(key)
        if old is plan:
            return
        if old is not None:  # same inputs planned twice concurrently: keep the newer
            _CACHE_BYTES -= old.nbytes
            old.chunk_store = None
        _CACHE[key] = plan
        _CACHE.move_to_end(key)
        _CACHE_BYTES += plan.nbytes
        _evict_beyond_budget()


def kept_plan_bytes() -> int:
    """Bytes of the plans the CPU path keeps across calls now (``PLAN_CACHE_BYTES``):
    their count biases, chunk indices and block ranges (``int``, at most the budget)."""
    with _CACHE_LOCK:
        return _CACHE_BYTES
