"""Vectorised torch CPU path of PLSH attention: forward and backward in ``O(n * window)`` memory.

PLSH attention is softmax attention with the additive bias ``log C_ij``, where
``C_ij = #{t : bin_t(p_i) = bin_t(p_j)}`` counts the hash functions that put query ``i``
and key ``j`` in the same bin (times the causal mask); SPEC section 3 (b), Wolfson &
Wagner (2026), Theorem 2.2. This package computes it without ever forming an ``n x n``
matrix:

1. Keys (and queries) are sorted by position. Bins are non-decreasing in the position,
   so for every sample ``t`` the keys sharing query ``i``'s bin are one contiguous index
   range ``[start_t(i), end_t(i))``, found by ``searchsorted``; the causal cut clips
   ``end_t(i)``. Every such range holds the keys of an interval of positions that
   contains ``p_i``, so their union is contiguous as well: ``C_ij >= 1`` exactly on
   ``[min_t start_t(i), max_t end_t(i))``.
2. Queries are cut into tiles of ``T`` rows (``T`` chosen per head from its pitches).
   A tile reaches the key range ``[min start, max end)`` over its rows and samples: the
   union of its blocks. Starts and (cut) ends are non-decreasing along sorted rows, so
   the range comes from the tile's first and last rows. Keys outside it (in particular
   causally masked key tiles) are never touched.
3. The tiles of a head, sorted by window width (widest first), are cut into groups whose
   widths lie within 1/8 of the group's widest; a group is stacked into one batched call
   with its windows padded to that width ``W`` (padded keys get count 0). Groups hold at
   most ``CHUNK_ELEMENTS`` logits per batch row and do not depend on the batch size.
4. Bands. A head whose tiles are at most :data:`BAND_MAX_TILE` rows (small pitches) pays
   more for many tiny tiles and for copying every key of a window ``W / T`` times than
   for a somewhat wider window. When queries and keys have the same sorted positions,
   such a head takes tiles of :data:`BAND_TILE` consecutive rows whose windows are all
   ``[g T + c, g T + c + W)``, with ``c`` the smallest start and ``c + W`` the largest
   end of any tile relative to its first row (at most the largest pitch apart): equally
   spaced windows, read by the forward as one strided view of the keys and values
   (padded with zero rows at both ends; keys outside ``[0, n_k)`` have count 0), so
   nothing is gathered. Measured on the SPEC section 7 CPU configuration (n = 16k, one
   thread): about 7-10% less forward time at s = 16 and 64 (``benchmarks/README.md``).
5. Inside a window the counts are a difference array: ``+1`` at ``start_t(i)``, ``-1`` at
   ``end_t(i)`` for every sample, then a cumulative sum along the keys (int32): ``O(s)``
   work per row plus one pass over the window, instead of ``s`` comparisons per pair. The
   bias is read from a table of ``s + 1`` entries: ``log(C / s)`` where ``C >= 1`` and
   ``-inf`` where ``C = 0``, so that every inadmissible key gets exactly weight 0 however
   large its logit (a finite stand-in such as ``-1e30`` lets a key whose logit exceeds
   the admissible ones by that much win the softmax). Rows with no admissible key are set
   to output 0 and LSE ``-inf`` explicitly.
6. Rows in the same bin of every sample (a *cell*; about ``sigma / s`` rows on average,
   since the ``s`` partitions together cut about ``s / sigma`` boundaries per token) have
   the same blocks, hence the same counts up to the causal cut. When a group has few
   cells (at most :data:`PATTERN_ROWS_FRACTION` of its rows), the counts of the first
   row of each cell are computed over its uncut blocks and copied to the cell's rows;
   then the keys at or past each row's causal cut are masked, in the columns at or past
   the group's smallest cut only (for self-attention, the last ``T`` columns). The
   result is bit-identical to counting every row.
7. Softmax with that bias and its LSE are computed by torch's fused CPU flash-attention
   kernel (``aten::_scaled_dot_product_flash_attention_for_cpu``) on the stacked tiles, in
   float32 (float64 for float64 inputs; a value head_dim different from the query's is
   zero-padded). That operator is private, so it is used only on the torch releases it
   was verified on and after a once-per-process self-check against the plain
   implementation (:func:`fused_tiles_available`); otherwise a plain torch implementation
   of the same formulas (public operators only) runs (:data:`USE_FUSED_TILES`). The
   backward runs plain torch formulas on the same tiles: since a tile's window holds all
   admissible keys of its rows, it recomputes each row's softmax whole (max-subtracted,
   like the dense float32 yardstick) instead of from the saved float32 LSE, whose rounding
   grows with the logits (``proofs_notes/backward.md``, section 3; torch's fused backward
   takes that LSE).
8. Plans are kept across calls. The plan and the count biases depend only on the
   partition, the positions, the causal flag and the compute dtype, which a model layer
   with a fixed partition repeats every step; the tile kernel alone measured about half
   of a call's time (``benchmarks/README.md``). So the second call with the same inputs
   (a call seen once, such as a decoding step with one more key, keeps nothing) keeps
   its plan with every tile group built (bias and indices) when that fits
   :data:`PLAN_CACHE_BYTES`, and later calls with equal inputs (compared by value: pitch
   and offset bytes, positions hashed, then compared with ``torch.equal``) reuse it, as
   does the forward's backward. Least recently used plans
   go first when the budget is exceeded, and an evicted plan drops its chunks also where
   an autograd graph still holds it. Results are bit-identical with and without keeping.

Memory is ``O(batch * CHUNK_ELEMENTS)`` per tile group in flight plus ``O(s n)`` int64
for the block boundaries of one head, plus at most :data:`PLAN_CACHE_BYTES` for kept
plans (a kept plan is ``O(n * window)``: its chunks hold one count per tile logit, uint8
for ``s <= 255``, the bias rebuilt from them at each use; :func:`kept_plan_bytes`). A
:class:`plsh_fast.nn.PLSHAttention` layer keeps its plans in its own :class:`PlanCache`
(:func:`use_plan_cache`), each within :data:`PLAN_CACHE_BYTES`. Parallelism: with ``torch.get_num_threads() = N > 1``
the tile groups (and the per-head planning) go to ``N`` Python worker threads of one
package-level pool: in the forward and the planning each worker takes the next item when
it is free (their outputs are disjoint, so who runs what does not change a bit), in the
backward they are dealt round-robin (the per-worker key-gradient sums then have a fixed
order); the pool is created on first use, reused by every call, grown when
a call wants more workers (:func:`executor`). Each worker thread limits *its own* OpenMP
and MKL thread counts to 1 when it starts (``omp_set_num_threads`` and
``mkl_set_num_threads_local`` act on the calling thread only): the work is many
independent operators of moderate size, and OpenMP barriers inside each of them stall
whenever another process holds a core. The calling thread and the process-wide setting
(``torch.get_num_threads()``) are never changed, so a call has no side effect on global
state, even when it fails, and concurrent calls from several Python threads cannot leave
a wrong thread count behind. Where those per-thread limits are unavailable (an OpenMP
runtime other than the one found in the process), the work runs serially in the calling
thread with torch's usual intra-op threads (:func:`per_thread_limits_available`).

The plan (sorted positions, tiles, block ranges and the tile groups) is built by
:func:`plan_cpu`; the forward and the backward accept it as ``plan=`` so that
:mod:`plsh_fast._autograd` computes it once per forward and reuses it in the backward
(the compiled backward too: :mod:`plsh_fast._ops` keeps the forward's groups with their
plans host-side, under a handle tensor).

The two public functions have the signature of the Triton path
(:func:`plsh_fast.triton.plsh_forward_triton`,
:func:`plsh_fast.triton.plsh_backward_triton`), so that
:mod:`plsh_fast._autograd` dispatches uniformly. They trust their arguments: validation
happens in :func:`plsh_fast.plsh_attention`.

Where each step lives (private modules; import from ``plsh_fast.cpu`` only):

* ``_settings.py``: the values of the settings below;
* ``_ranges.py``: step 1, block ranges (``searchsorted``, or arithmetic for consecutive
  key positions) and the causal cut;
* ``_planning.py``: steps 2 and 3, the plan (:func:`plan_cpu`, :func:`tile_size`), query
  tiles, their key windows and the tile groups;
* ``_band.py``: step 4, band heads and their strided windows;
* ``_chunks.py``: steps 5 and 6, a tile group's indices and count bias (difference array,
  cells);
* ``_rows.py``: sorted, padded per-head inputs and row gathers;
* ``_tiles.py``: step 7, the tile kernels (:func:`tiles_forward`, the fused operator's
  checks :func:`fused_tiles_available`, the backward's formulas);
* ``_plan_cache.py``: step 8, the kept-plan cache (:func:`clear_plan_cache`,
  :func:`no_kept_plans`, :func:`kept_plan_bytes`; a layer's own :class:`PlanCache`,
  made active by :func:`use_plan_cache`);
* ``_pool.py``: the worker pool and per-thread thread limits (:func:`executor`,
  :func:`per_thread_limits_available`);
* ``_forward.py``, ``_backward.py``: :func:`plsh_forward_cpu`, :func:`plsh_backward_cpu`.

Settings. Set them on this package, ``plsh_fast.cpu.PLAN_CACHE_BYTES = x`` (or with
``monkeypatch.setattr(plsh_fast.cpu, ...)``): they are properties of the package that read
and write ``_settings.py``, which every step reads at call time, so a change takes effect
at the next call wherever the setting is used (``tests/fast/cpu/test_cpu_settings.py``).

.. py:data:: CHUNK_ELEMENTS
   :value: 524288

   Upper bound on the ``tiles * T * W`` logits of one call per batch row (step 3; a
   single tile wider than this still runs alone); float32: about 2 MB per intermediate
   and batch row, which keeps a chunk near the cache and the memory small.

.. py:data:: PATTERN_ROWS_FRACTION
   :value: 0.25

   A group of tiles takes the bias of the first row of each *cell* (rows whose blocks
   agree in every sample, hence whose counts agree up to the causal cut) and copies it to
   the cell's rows when there are at most this fraction as many cells as rows; otherwise
   every row's counts are computed (step 6). Set to 0 (never) or 1 (always) in tests.

.. py:data:: BAND_MAX_TILE
   :value: 32

   Heads whose query tiles are at most this many rows (small pitches) run as a band
   (step 4) when queries and keys have the same positions: tiles of :data:`BAND_TILE`
   consecutive rows whose key windows are equally spaced, read as strided views of the
   keys and values instead of gathered copies. ``0`` disables bands.

.. py:data:: BAND_TILE
   :value: 32

   Query-tile height of a band head (step 4): a power of two in ``[16, 128]``
   (:func:`plan_cpu` raises ``ValueError`` otherwise).

.. py:data:: PLAN_CACHE_BYTES
   :value: 1073741824

   Bytes of built tile groups (count biases, indices and block ranges) that the CPU path
   keeps across calls, least recently used first out (step 8). A call whose partition,
   positions, causal flag and compute dtype equal those of a kept plan skips planning and
   bias building; a plan larger than this is never kept. ``0`` disables the cache (every
   call plans afresh, and a forward's groups are not kept for its backward). Changing it
   takes effect at the next call; :func:`clear_plan_cache` frees what is kept. The
   default, 1 GiB, holds the plan of the SPEC section 7 CPU configuration up to
   n = 64k, s = 64 (731 MiB; 112 MiB at n = 16k, s = 16; the ``kept plan MB`` of
   ``benchmarks/results/cpu_2026-12-01_vm_n16384-65536_t2_r2.md``).

.. py:data:: USE_FUSED_TILES
   :value: True

   Use torch's fused CPU flash-attention operator on the stacked tiles when available
   (step 7). Set to ``False`` to force the plain torch implementation (tests compare both).

.. py:data:: FUSED_TORCH_VERSIONS
   :value: ((2, 3), (2, 14))

   ``[first, last)`` torch ``(major, minor)`` releases on which the private fused operator
   was verified (:func:`fused_tiles_available`); 2.13 is the pinned one.
"""

from __future__ import annotations

import sys
import types

from . import _settings
from ._backward import plsh_backward_cpu
from ._forward import plsh_forward_cpu
from ._plan_cache import (
    PlanCache,
    clear_plan_cache,
    kept_plan_bytes,
    no_kept_plans,
    use_plan_cache,
)
from ._planning import plan_cpu, tile_size
from ._pool import executor, per_thread_limits_available
from ._tiles import fused_tiles_available, tiles_forward

__all__ = [
    "BAND_MAX_TILE",
    "BAND_TILE",
    "CHUNK_ELEMENTS",
    "FUSED_TORCH_VERSIONS",
    "PATTERN_ROWS_FRACTION",
    "PLAN_CACHE_BYTES",
    "USE_FUSED_TILES",
    "PlanCache",
    "clear_plan_cache",
    "executor",
    "fused_tiles_available",
    "kept_plan_bytes",
    "no_kept_plans",
    "per_thread_limits_available",
    "plan_cpu",
    "plsh_backward_cpu",
    "plsh_forward_cpu",
    "tile_size",
    "tiles_forward",
    "use_plan_cache",
]


# The public objects are documented as this package's own: the modules that define them
# are private (the API pages list public modules only).
for _public in (
    PlanCache,
    clear_plan_cache,
    executor,
    fused_tiles_available,
    kept_plan_bytes,
    no_kept_plans,
    per_thread_limits_available,
    plan_cpu,
    plsh_backward_cpu,
    plsh_forward_cpu,
    tile_size,
    tiles_forward,
    use_plan_cache,
):
    _public.__module__ = __name__
del _public


def _setting(name: str) -> property:
    """A property of the package that reads and writes ``_settings.<name>``."""

    def read(_package):
        return getattr(_settings, name)

    def write(_package, value) -> None:
        setattr(_settings, name, value)

    return property(read, write, doc=f"The setting ``{name}`` (``_settings.py``).")


class _Package(types.ModuleType):
    """``plsh_fast.cpu`` itself, whose settings are properties reading and writing
    ``_settings``: they are not copied into the package's namespace, so that
    ``plsh_fast.cpu.PLAN_CACHE_BYTES = x`` (or ``monkeypatch.setattr``) changes the one
    value every module reads at call time, and reading it back gives that value."""

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(_settings.__all__))


for _name in _settings.__all__:
    setattr(_Package, _name, _setting(_name))
del _name

sys.modules[__name__].__class__ = _Package
