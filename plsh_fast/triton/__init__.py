"""The Triton backend of ``plsh_fast.plsh_attention``: fused kernels, compiled on CUDA.

What other modules, the tests and the benchmarks import is re-exported here; the modules
themselves are private, one step of the backend each:

* ``_tiling``: the float64 bins kernel (``compute_bins``), the counts plan (``TilePlan``,
  ``make_plan``, ``plan_query_range``) and the event-form tile counts (``tile_counts``,
  ``tile_counts_all``, ``sample_block``);
* ``_memory``: the masked tile loads and stores of every kernel;
* ``_config``: ``TileConfig``, the one configuration object of tile sizes and launch
  options, and ``tile_config``, the shipped rules that choose it;
* ``_launch``: what both launchers share (rows sorted by position, the resolution of a
  configuration and plan, ``aligned_rows``);
* ``_forward``: the forward kernel and ``plsh_forward_triton``;
* ``_backward``: the delta, dQ and dK/dV kernels and ``plsh_backward_triton``.

Importing this package imports Triton (``import triton`` inside it is the real Triton:
the package name shadows nothing). The kernels are defined at import;
``TRITON_INTERPRET=1`` must be set before that to run them in the interpreter on CPU
tensors (tests only).
"""

from __future__ import annotations

from ._backward import dq_rounding_factor, plsh_backward_triton, rows_fit_int32
from ._config import TileConfig, default_blocks, dot_precision, head_dim_split, pow2, tile_config
from ._forward import plsh_forward_triton
from ._launch import aligned_rows
from ._tiling import (
    MAX_SAMPLE_BLOCK,
    MAX_STATIC_SAMPLES,
    MULTI_PASS_BLOCK,
    TilePlan,
    compute_bins,
    make_plan,
    plan_query_range,
    sample_block,
)

__all__ = [
    "MAX_SAMPLE_BLOCK",
    "MAX_STATIC_SAMPLES",
    "MULTI_PASS_BLOCK",
    "TileConfig",
    "TilePlan",
    "aligned_rows",
    "compute_bins",
    "default_blocks",
    "dot_precision",
    "dq_rounding_factor",
    "head_dim_split",
    "make_plan",
    "plan_query_range",
    "plsh_backward_triton",
    "plsh_forward_triton",
    "pow2",
    "rows_fit_int32",
    "sample_block",
    "tile_config",
]

# The public objects are documented as this package's own: the modules that define them
# are private (the API pages list public modules only).
for _public in (
    TileConfig,
    TilePlan,
    aligned_rows,
    compute_bins,
    default_blocks,
    dot_precision,
    dq_rounding_factor,
    head_dim_split,
    make_plan,
    plan_query_range,
    plsh_backward_triton,
    plsh_forward_triton,
    pow2,
    rows_fit_int32,
    sample_block,
    tile_config,
):
    _public.__module__ = __name__
del _public
