"""The Triton backend of :func:`plsh_fast.plsh_attention`: fused kernels, compiled on CUDA.

What other modules, the tests and the benchmarks import is re-exported here; the modules
themselves are private (one step of the backend each):

* :mod:`~plsh_fast.triton._tiling`: the float64 bins kernel, the counts plan
  (:class:`TilePlan`, :func:`make_plan`, :func:`plan_query_range`), the event-form tile
  counts (:func:`tile_counts`, :func:`tile_counts_all`, :func:`sample_block`);
* :mod:`~plsh_fast.triton._memory`: the masked tile loads and stores of every kernel;
* :mod:`~plsh_fast.triton._config`: :class:`TileConfig`, the one configuration object of
  tile sizes and launch options, and the shipped rules :func:`tile_config`;
* :mod:`~plsh_fast.triton._launch`: what both launchers share (rows sorted by position,
  the resolution of a configuration and plan, :func:`aligned_rows`);
* :mod:`~plsh_fast.triton._forward`: the forward kernel and
  :func:`plsh_forward_triton`;
* :mod:`~plsh_fast.triton._backward`: the delta, dQ and dK/dV kernels and
  :func:`plsh_backward_triton`.

Importing this package imports Triton (``import triton`` inside it is the real Triton:
the package name shadows nothing). Kernels are defined at import; ``TRITON_INTERPRET=1``
must be set before that to run them in the interpreter on CPU tensors (tests only).
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
    tile_counts,
    tile_counts_all,
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
    "tile_counts",
    "tile_counts_all",
]
