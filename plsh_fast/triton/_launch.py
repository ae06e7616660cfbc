"""What the Triton forward and backward launchers share: one definition each.

* :func:`on_sorted_rows`: the kernels need rows sorted by position (the counts' row ranges
  are contiguous only on sorted keys, :mod:`plsh_fast.triton._tiling`); unsorted positions
  are sorted (:mod:`plsh_fast._ordering`), the pass runs on the sorted rows and its results
  are put back in the caller's row order.
* :func:`prepare_launch`: the tile-configuration resolution of a pass: the
  :class:`~plsh_fast.triton._config.TileConfig` (given, or :func:`tile_config`'s for the
  problem), the plan (given, or made here), the tiles every kernel of the pass takes and
  the constexprs and launch options they share (:class:`Launch`).
* :func:`aligned_rows`: the 16-element row strides that the pipelined loads need.
* :data:`LOG2E`, :data:`LENGTHS`: the logits' base change and the kernels' unspecialised
  length arguments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
import triton

from .._ordering import position_order, sort_positions, take_rows
from ._config import TileConfig, dot_precision, tile_config
from ._tiling import TilePlan, make_plan, sample_block

__all__ = [
    "LENGTHS",
    "LOG2E",
    "Launch",
    "aligned_rows",
    "interpreting",
    "on_sorted_rows",
    "prepare_launch",
]

#: ``log2(e)``: the kernels compute ``exp2(x log2 e)`` for ``exp(x)``.
LOG2E = 1.4426950408889634

#: Scalar arguments that change with the problem size: not specialised (no recompilation
#: per length; Triton would otherwise compile one kernel per divisibility class).
LENGTHS = ["batch", "n_q", "n_k", "num_heads", "group", "num_samples", "n_q_tiles"]


def aligned_rows(x: torch.Tensor) -> torch.Tensor:
    """``x``, or a copy of it whose strides (but the last) are multiples of 16 elements.

    Triton specialises an integer argument as "divisible by 16" or not at all, and proves
    a tile's rows 16-byte aligned (which ``cp.async``, the kernels' software-pipelined
    loads, needs) only from strides divisible by 16 and a 16-byte aligned base. A
    ``head_dim`` that is not a multiple of 16 (40, 72, 120) gives contiguous rows of
    another stride, and the kernels then load synchronously
    (``benchmarks/results/aot_2026-12-01_other_head_dims.md``). Such inputs are copied
    into a buffer with the last dimension padded to a multiple of 16 and returned as a view
    of the first ``x.shape[-1]`` columns (the kernels mask the padding): one extra read and
    write of the tensor, ``O(n head_dim)`` against the attention's ``O(n window
    head_dim)``.

    Parameters
    ----------
    x : torch.Tensor
        ``(batch, heads, seq_len, head_dim)``, any dtype, device and strides.

    Returns
    -------
    torch.Tensor
        ``x`` itself when its base is 16-byte aligned, its last stride 1 and its other
        strides multiples of 16 (or the tensor is empty); else the aligned copy (same
        values, shape, dtype and device).
    """
    if x.numel() == 0:
        return x
    aligned = (
        x.stride(-1) == 1 and all(st % 16 == 0 for st in x.stride()[:-1]) and x.data_ptr() % 16 == 0
    )
    if aligned:
        return x
    width = -(-x.shape[-1] // 16) * 16
    buf = x.new_empty((*x.shape[:-1], width))
    buf[..., : x.shape[-1]].copy_(x)
    return buf[..., : x.shape[-1]]


def interpreting(kernel: object) -> bool:
    """Whether ``kernel`` (a ``@triton.jit`` function) runs in the Triton interpreter
    (``TRITON_INTERPRET=1`` when it was defined); anything else (a compiled kernel, a
    recorder standing in for one) is taken as compiled."""
    return type(kernel).__name__ == "InterpretedFunction"


def on_sorted_rows(
    run: Callable,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    query_rows: Sequence[torch.Tensor],
    key_rows: Sequence[torch.Tensor],
) -> tuple[tuple, tuple] | None:
    """``run`` on rows sorted by position, its results put back in the caller's order.

    Parameters
    ----------
    run : callable
        ``run(query_rows, key_rows, query_positions, key_positions) -> (query_results,
        key_results)``: the pass on sorted rows (tuples of tensors with the rows along
        dimension 2, ``(batch, heads, n, ...)``; positions non-decreasing).
    query_positions, key_positions : torch.Tensor
        int64 ``(n_q,)``, ``(n_k,)``.
    query_rows, key_rows : sequence of torch.Tensor
        The tensors indexed by query rows (``n_q`` along dimension 2) and by key rows.

    Returns
    -------
    tuple or None
        ``(query_results, key_results)`` in the caller's row order; ``None`` when both
        position vectors are non-decreasing already (nothing was run: the caller runs the
        pass itself). Reading the order synchronises a CUDA device once per vector.
    """
    q_order, q_inverse = position_order(query_positions)
    k_order, k_inverse = position_order(key_positions)
    if q_order is None and k_order is None:
        return None
    query_results, key_results = run(
        take_rows(q_order, *query_rows),
        take_rows(k_order, *key_rows),
        sort_positions(query_positions, q_order),
        sort_positions(key_positions, k_order),
    )
    return take_rows(q_inverse, *query_results), take_rows(k_inverse, *key_results)


@dataclasses.dataclass(frozen=True)
class Launch:
    """A pass's resolved launch: its configuration, plan and the tiles of each kernel.

    Attributes
    ----------
    tiles : TileConfig
        The configuration (given, or :func:`tile_config`'s).
    plan : TilePlan
        The plan (given, or made by :func:`prepare_launch` with the configuration's tiles).
    num_samples : int
        Partition samples ``s`` of the pass.
    n_q_tiles : int
        Query tiles of ``block_m`` rows.
    interpreted : bool
        The kernels run in the Triton interpreter.
    dq_block_n : int
        Key tile of the dQ kernel (a divisor of ``block_n``).
    dkdv_block_m, dkdv_block_n : int
        Query tile (a divisor of ``block_m``) and key tile of the dK/dV kernel.
    meta : dict
        The constexprs and launch options every kernel of the pass takes (``D``, ``DV``,
        ``BLOCK_M``, ``BLOCK_N``, ``S_BLOCK``, ``PASSES``, ``UPCAST``, ``DOT_PREC``,
        ``VARIANT``, ``CLASSIFY``, ``NUM_STAGES``, ``CAUSAL``, ``num_stages``).
    """

    tiles: TileConfig
    plan: TilePlan
    num_samples: int
    n_q_tiles: int
    interpreted: bool
    dq_block_n: int
    dkdv_block_m: int
    dkdv_block_n: int
    meta: dict


def prepare_launch(
    query: torch.Tensor,
    value: torch.Tensor,
    pitch: torch.Tensor,
    offset: torch.Tensor,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    causal: bool,
    *,
    tiles: TileConfig | None,
    plan: TilePlan | None,
    kernel: object,
) -> Launch:
    """Resolve the configuration of one pass, plan it if needed, and the kernels' shared
    arguments.

    Parameters
    ----------
    query, value : torch.Tensor
        ``(batch, num_heads, n_q, head_dim)`` and ``(batch, num_heads_kv, n_k,
        head_dim_v)`` of the pass (their dtype, device and head sizes are read).
    pitch, offset : torch.Tensor
        float64 ``(num_heads, num_samples)``.
    query_positions, key_positions : torch.Tensor
        int64 ``(n_q,)``, ``(n_k,)``, non-decreasing, ``n_q, n_k >= 1``.
    causal : bool
        Causal attention.
    tiles : TileConfig or None
        The configuration; ``None``: :func:`tile_config` for the head sizes, dtype, device
        and number of samples.
    plan : TilePlan or None
        A plan made for the same positions, partition, ``causal`` and tiles; ``None``:
        made here (:func:`plsh_fast.triton._tiling.make_plan`).
    kernel
        One of the pass's kernels (:func:`interpreting` reads its type).

    Returns
    -------
    Launch
    """
    head_dim, head_dim_v = query.shape[3], value.shape[3]
    num_samples = pitch.shape[1]
    n_k = key_positions.shape[0]
    interp = interpreting(kernel)
    given = tiles is not None
    if tiles is None:
        tiles = tile_config(
            head_dim, head_dim_v, query.device, query.dtype, num_samples=num_samples
        )
    block_m, block_n = tiles.block_m, tiles.block_n
    # The dQ kernel may walk the key range in narrower tiles than the plan's (key ranges
    # start at multiples of block_n, hence of any divisor of it).
    dq_block_n = tiles.dq_block_n or block_n
    assert block_n % dq_block_n == 0
    # The dK/dV kernel walks the query range in tiles of at most tiles.dkdv_block_m rows (its
    # two float32 accumulators stay in registers); query ranges start at multiples of
    # block_m, hence of any divisor of it. Its key tile may be wider than the plan's
    # (float32 on sm_90: warpgroup-sized MMAs): its query ranges are planned for that tile.
    dkdv_block_m = min(block_m, tiles.dkdv_block_m) if given or not interp else block_m
    assert block_m % dkdv_block_m == 0
    dkdv_block_n = tiles.dkdv_block_n or block_n
    if plan is None:
        plan = make_plan(
            query_positions,
            key_positions,
            pitch,
            offset,
            causal=causal,
            block_m=block_m,
            block_n=block_n,
        )
    assert (plan.block_m, plan.block_n, plan.causal, plan.n_k) == (block_m, block_n, causal, n_k)
    upcast = query.dtype == torch.bfloat16 and interp
    s_block, passes = sample_block(num_samples)
    meta = dict(
        D=head_dim,
        DV=head_dim_v,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        S_BLOCK=s_block,
        PASSES=passes,
        UPCAST=upcast,
        DOT_PREC=dot_precision(query.dtype, interp or upcast),
        VARIANT=int(tiles.variant),
        CLASSIFY=bool(tiles.classify),
        NUM_STAGES=tiles.num_stages,
        CAUSAL=bool(causal),
        num_stages=tiles.num_stages,
    )
    n_q_tiles = triton.cdiv(query.shape[2], block_m)
    return Launch(
        tiles, plan, num_samples, n_q_tiles, interp, dq_block_n, dkdv_block_m, dkdv_block_n, meta
    )
