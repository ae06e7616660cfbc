"""The user-set settings of the CPU path, in one place, read at call time.

Set them on the package, ``plsh_fast.cpu.PLAN_CACHE_BYTES = x``: :mod:`plsh_fast.cpu`
forwards reads and writes of these names to this module, and every module of the package
reads them here when a call runs, so a setting takes effect at the next call wherever it
is used. The step numbers are those of the package docstring (:mod:`plsh_fast.cpu`).
"""

from __future__ import annotations

__all__ = [
    "BAND_MAX_TILE",
    "BAND_TILE",
    "CHUNK_ELEMENTS",
    "FUSED_TORCH_VERSIONS",
    "PATTERN_ROWS_FRACTION",
    "PLAN_CACHE_BYTES",
    "USE_FUSED_TILES",
]

#: Upper bound on the ``tiles * T * W`` logits of one call per batch row (a single tile
#: wider than this still runs alone); float32: about 2 MB per intermediate and batch row,
#: which keeps a chunk near the cache and the memory small (step 3).
CHUNK_ELEMENTS = 1 << 19

#: A group of tiles takes the bias of the first row of each *cell* (rows whose blocks
#: agree in every sample, hence whose counts agree up to the causal cut) and copies it to
#: the cell's rows when there are at most this fraction as many cells as rows; otherwise
#: every row's counts are computed (step 6). Set to 0 (never) or 1 (always) in tests.
PATTERN_ROWS_FRACTION = 0.25

#: Heads whose query tiles are at most this many rows (small pitches, step 4) run
#: as a band when queries and keys have the same positions: tiles of :data:`BAND_TILE`
#: consecutive rows whose key windows are equally spaced, read as strided views of the
#: keys and values instead of gathered copies. ``0`` disables bands.
BAND_MAX_TILE = 32

#: Query-tile height of a band head (step 4).
BAND_TILE = 32

#: Bytes of built tile groups (count biases, indices and block ranges) that the CPU path
#: keeps across calls, least recently used first out (step 8). A call whose
#: partition, positions, causal flag and compute dtype equal those of a kept plan skips
#: planning and bias building; a plan larger than this is never kept. ``0`` disables
#: the cache (every call plans afresh, and a forward's groups are not kept for its
#: backward). Changing it takes effect at the next call; ``clear_plan_cache`` frees
#: what is kept. The default, 1 GiB, holds the plan of the SPEC section 7 CPU
#: configuration up to n = 64k, s = 64 (731 MiB; 112 MiB at n = 16k, s = 16; the
#: ``kept plan MB`` of ``benchmarks/results/cpu_2026-12-01_vm_n16384-65536_t2_r2.md``).
PLAN_CACHE_BYTES = 2**30

#: Use torch's fused CPU flash-attention operator on the stacked tiles when available
#: (step 7). Set to ``False`` to force the plain torch implementation (tests compare both).
USE_FUSED_TILES = True

#: ``[first, last)`` torch ``(major, minor)`` releases on which the private fused operator
#: was verified (``fused_tiles_available``); 2.13 is the pinned one.
FUSED_TORCH_VERSIONS = ((2, 3), (2, 14))
