"""The values of the CPU path's user-set settings, in one place, read at call time.

What each setting means is documented once, in the package docstring
(:mod:`plsh_fast.cpu`, "Settings"), whose ``:value:`` lines must equal the defaults here
(``tests/fast/cpu/test_cpu_settings.py``). Set them on the package,
``plsh_fast.cpu.PLAN_CACHE_BYTES = x``: the package's properties of these names read and
write this module, and every module of the package reads ``settings.NAME`` when a call
runs (never ``from ._settings import NAME``, which would freeze the value).
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

CHUNK_ELEMENTS = 1 << 19  # logits of one stacked call per batch row (step 3)
PATTERN_ROWS_FRACTION = 0.25  # cells per row up to which biases are copied per cell (step 6)
BAND_MAX_TILE = 32  # heads with tiles up to this height run as bands; 0: never (step 4)
BAND_TILE = 32  # tile height of a band head, a power of two in [16, 128] (step 4)
PLAN_CACHE_BYTES = 2**30  # budget of the kept plans, LRU out; 0: none kept (step 8)
USE_FUSED_TILES = True  # torch's fused CPU flash-attention operator when verified (step 7)
FUSED_TORCH_VERSIONS = ((2, 3), (2, 14))  # [first, last) torch releases it was verified on
