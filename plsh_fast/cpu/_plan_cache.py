"""The kept-plan cache of the CPU path (package docstring, step 8).

Plans (tile groups with their count biases and indices built) are kept across calls
within ``PLAN_CACHE_BYTES``, least recently used first out, from the second call with
equal inputs on (:func:`seen_before`); a later call with equal partition, positions,
causal flag and compute dtype (:func:`cache_key`, :func:`cached_plan`) reuses one.
:func:`plsh_fast.cpu._planning.plan_cpu` consults this cache; :func:`keep_chunks` and
:func:`remember` admit a plan. User-facing: :func:`clear_plan_cache`,
:func:`no_kept_plans`, :func:`kept_plan_bytes`, and :class:`PlanCache` with
:func:`use_plan_cache` for a cache of one's own (a layer's, :mod:`plsh_fast.nn`).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict

import torch

from . import _settings as settings
from ._chunks import count_dtype

__all__ = [
    "PlanCache",
    "active_plan_cache",
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
    "use_plan_cache",
]

_SEEN_KEYS = 4096


class PlanCache:
    """Kept plans within ``PLAN_CACHE_BYTES``, least recently used first out (step 8).

    The CPU path keeps plans in one process-wide instance unless a caller makes another
    one active in its thread with :func:`use_plan_cache`: each
    :class:`plsh_fast.nn.PLSHAttention` layer owns one, so that a model of ``L`` layers
    keeps ``L`` plans (each within the budget) instead of having its layers evict each
    other's from one shared budget. A plan stays in the instance it was planned under.
    Thread-safe.

    Attributes
    ----------
    nbytes : int
        Bytes of the kept plans (their compact chunks and block ranges).
    """

    def __init__(self) -> None:
        self.plans: OrderedDict = OrderedDict()  # key -> kept Plan, least recently used first
        self.nbytes = 0
        #: ``hash`` of the keys of recent calls (admission on the second call); hashes, not
        #: the keys, so that 4096 remembered calls do not hold 4096 copies of the partition.
        self.seen: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.plans)

    def __deepcopy__(self, memo) -> PlanCache:
        """An empty cache (a copied layer plans again; plans are not copied)."""
        return PlanCache()

    def __reduce__(self):
        return (PlanCache, ())  # pickled empty, like a copy

    def clear(self) -> None:
        """Forget every kept plan and every remembered call (frees their chunks, also where
        an autograd graph still holds a plan: its backward builds them again)."""
        with self._lock:
            for plan in self.plans.values():
                plan.drop_chunks()
            self.plans.clear()
            self.seen.clear()
            self.nbytes = 0

    def _evict(self) -> None:
        """Drop least recently used plans until the kept ones fit ``PLAN_CACHE_BYTES``
        (caller holds the lock). An evicted forward's plan lives on in its autograd graph:
        its chunks are dropped there too (its backward builds them again)."""
        while self.plans and self.nbytes > settings.PLAN_CACHE_BYTES:
            _, old = self.plans.popitem(last=False)
            self.nbytes -= old.nbytes
            old.drop_chunks()

    def evict_beyond_budget(self) -> None:
        """Apply a lowered ``PLAN_CACHE_BYTES`` (or 0) now."""
        if self.plans:
            with self._lock:
                self._evict()

    def get(self, key, query_positions, key_positions):
        """The kept plan of ``key`` whose positions equal these, or ``None``."""
        with self._lock:
            plan = self.plans.get(key)
            if plan is None:
                return None
            _, qpos, kpos = plan.cache_key
            if not (torch.equal(qpos, query_positions) and torch.equal(kpos, key_positions)):
                return None  # a hash collision
            self.plans.move_to_end(key)
            return plan

    def seen_before(self, key) -> bool:
        """Whether a recent call had this key (then its plan may be kept); remembers it. A
        hash collision only keeps a plan one call early."""
        digest = hash(key)
        with self._lock:
            if digest in self.seen:
                self.seen.move_to_end(digest)
                return True
            self.seen[digest] = None
            while len(self.seen) > _SEEN_KEYS:
                self.seen.popitem(last=False)
            return False

    def remember(self, plan) -> None:
        """Keep ``plan`` (whose chunks are all built), evicting the least recently used
        plans beyond ``PLAN_CACHE_BYTES``."""
        key = plan.cache_key[0]
        with self._lock:
            old = self.plans.get(key)
            if old is plan:
                return
            if old is not None:  # same inputs planned twice concurrently: keep the newer
                self.nbytes -= old.nbytes
                old.drop_chunks()
            plan.drop_ranges()
            self.plans[key] = plan
            self.plans.move_to_end(key)
            self.nbytes += plan.nbytes
            self._evict()


_DEFAULT = PlanCache()  # the process-wide instance
_CACHE = _DEFAULT.plans  # the default instance's plans and remembered calls (tests read them)
_SEEN = _DEFAULT.seen
_BYPASS = threading.local()  # no_kept_plans() active in this thread
_ACTIVE = threading.local()  # use_plan_cache() instance of this thread


def bypassed() -> bool:
    """Whether :func:`no_kept_plans` is active in this thread."""
    return getattr(_BYPASS, "on", False)


def active_plan_cache() -> PlanCache:
    """The :class:`PlanCache` that CPU calls of this thread keep plans in: the one of the
    innermost :func:`use_plan_cache`, else the process-wide one."""
    cache = getattr(_ACTIVE, "cache", None)
    return _DEFAULT if cache is None else cache  # not `or`: an empty cache is falsy


@contextlib.contextmanager
def use_plan_cache(cache: PlanCache):
    """Context manager: CPU calls of this thread keep and reuse plans in ``cache``.

    Parameters
    ----------
    cache : PlanCache
        The instance to use (for example a layer's own, :class:`plsh_fast.nn.PLSHAttention`).

    Raises
    ------
    TypeError
        ``cache`` is not a :class:`PlanCache`.

    Notes
    -----
    Thread-local, like :func:`no_kept_plans` (the pool's workers do not plan); nests. A
    backward reuses its forward's plan, wherever it was kept.
    """
    if not isinstance(cache, PlanCache):
        raise TypeError(f"cache: must be a PlanCache, got {type(cache).__name__}")
    previous = getattr(_ACTIVE, "cache", None)
    _ACTIVE.cache = cache
    try:
        yield cache
    finally:
        _ACTIVE.cache = previous


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
    """Forget every plan the CPU path keeps across calls in its process-wide cache
    (``PLAN_CACHE_BYTES``; a layer's own :class:`PlanCache` has ``clear()``).

    Frees their count biases and indices, also where an autograd graph still holds a
    plan (its backward builds them again). Safe to call at any time, also while other
    threads run CPU calls (a call holding a plan keeps working).
    """
    _DEFAULT.clear()


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


def evict_beyond_budget() -> None:
    """Apply a lowered ``PLAN_CACHE_BYTES`` (or 0) now to the active cache
    (:func:`active_plan_cache`): drop least recently used plans until the kept ones fit."""
    active_plan_cache().evict_beyond_budget()


def cached_plan(key, query_positions, key_positions):
    """The active cache's kept plan of ``key`` with these positions, or ``None``."""
    return active_plan_cache().get(key, query_positions, key_positions)


def seen_before(key) -> bool:
    """:meth:`PlanCache.seen_before` of the active cache."""
    return active_plan_cache().seen_before(key)


def _tensor_bytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def keep_chunks(plan) -> None:
    """Let ``plan`` keep its chunks when they fit ``PLAN_CACHE_BYTES`` (sizes known
    from the tile groups before any is built)."""
    if plan.cache_key is None or plan.chunk_store is not None:
        return
    # Kept chunks are compact (Chunk.compact): counts, int64 rows, bool empty, int32 keys;
    # the kept work items hold their tiles and window starts only (Plan.drop_ranges).
    elem = torch.empty((), dtype=count_dtype(plan.pitch.shape[1])).element_size()
    estimate = 0
    for spec in plan.specs:
        _, tile, w, sel, lo = spec[:5]
        estimate += sel.numel() * tile * (w * elem + 9) + sel.numel() * w * 4
        estimate += _tensor_bytes(sel, lo)
    if estimate <= settings.PLAN_CACHE_BYTES:
        plan.chunk_store = dict.fromkeys(map(id, plan.specs))  # built on first use
        plan.nbytes = estimate


def remember(plan) -> None:
    """Keep ``plan`` (whose chunks are all built) in the cache it was planned under
    (``plan.kept_in``), evicting the least recently used plans beyond ``PLAN_CACHE_BYTES``."""
    if plan.chunk_store is None or plan.cache_key is None:
        return
    (_DEFAULT if plan.kept_in is None else plan.kept_in).remember(plan)


def kept_plan_bytes() -> int:
    """Bytes of the plans the CPU path keeps across calls now in its process-wide cache
    (``PLAN_CACHE_BYTES``; a layer's own :class:`PlanCache` has ``nbytes``): their
    compact chunks (counts, indices) and block ranges (``int``, at most the budget)."""
    return _DEFAULT.nbytes
