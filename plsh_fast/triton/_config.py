"""Tile sizes and launch options of the Triton kernels: one configuration object.

:class:`TileConfig` carries everything a launch of the forward or backward kernels may be
told besides its tensors (query/key tiles of each kernel, warps, software-pipelining stages,
register caps, column chunks of ``head_dim``, the counts' tile classification and the
kernel variant of the negative controls), as JAX Pallas' ``BlockSizes`` does for its
attention kernels; :func:`tile_config` holds the shipped rules that choose it per head size,
dtype, GPU and number of samples (measured in the AOT compile tables). The column chunks
(:func:`head_dim_split`, :func:`pow2`) and the ``tl.dot`` precision
(:func:`dot_precision`) are the other launch rules the kernels share. The launch code
(:mod:`plsh_fast.triton._launch`) resolves a configuration once per pass.
"""

from __future__ import annotations

import dataclasses

import torch
import triton

from ._tiling import MAX_SAMPLE_BLOCK

__all__ = [
    "TileConfig",
    "default_blocks",
    "dot_precision",
    "head_dim_split",
    "pow2",
    "tile_config",
]


def pow2(x: int, minimum: int = 16) -> int:
    """Smallest power of two ``>= max(x, minimum)`` (tile widths of ``tl.arange``)."""
    return max(minimum, triton.next_power_of_2(max(int(x), 1)))


def head_dim_split(head_dim: int, halves: bool = False) -> tuple[int, int]:
    """Column chunks ``(BLOCK_D, BLOCK_D1)`` covering ``head_dim`` (``BLOCK_D1 = 0``: one).

    One power of two when that wastes nothing or a split would not save work, else the
    largest power of two ``<= head_dim`` and the power of two covering the rest (80 -> 64 +
    16, 96 -> 64 + 32, 200 -> 128 + 128 is no saving: 256). ``halves``
    (:attr:`TileConfig.column_halves`): two equal chunks, each half the power of two
    covering ``head_dim`` (64 -> 32 + 32; 80, 96, 128 -> 64 + 64), so that each ``tl.dot``
    stages a narrower operand in registers and every ``head_dim`` in ``(64, 128]`` compiles
    to the register footprint of 128 (padding columns masked).
    """
    full = pow2(head_dim)
    if halves and full >= 32:
        return full // 2, full // 2
    low = max(16, 1 << (max(int(head_dim), 1).bit_length() - 1))
    if low >= head_dim:
        return full, 0
    rest = pow2(head_dim - low)
    return (low, rest) if low + rest < full else (full, 0)


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """Tile sizes and launch options of the forward and backward kernels (all of them).

    The launch code takes one of these (``tiles=``; ``None``: :func:`tile_config`'s) and
    nothing else about how the kernels run; to change one option, ``dataclasses.replace``
    the shipped configuration. Two rules read a field against another: the dQ kernel's key
    tile ``dq_block_n`` (``None``: ``block_n``) must divide ``block_n``, and the dK/dV
    kernel's query tile is ``min(block_m, dkdv_block_m)`` (in the Triton interpreter,
    without a configuration given: ``block_m``).

    Attributes
    ----------
    block_m, block_n : int
        Query and key tile of the forward and dQ kernels (and of the plan they share;
        ``block_n`` is also the key tile of the dK/dV kernel).
    num_warps, num_stages : int
        Warps of the forward kernel; software-pipelining stages of every key/query loop.
    dq_num_warps : int
        Warps of the dQ kernel.
    dkdv_block_m, dkdv_num_warps : int
        Query tile (a divisor of ``block_m``) and warps of the dK/dV kernel.
    column_halves : bool
        ``head_dim`` in two equal column chunks (:func:`head_dim_split`).
    dq_block_n : int or None
        Key tile of the dQ kernel (``None``: ``block_n``), a divisor of ``block_n`` (the
        plan's key ranges start at multiples of ``block_n``, hence of any divisor of it).
    fwd_column_halves : bool or None
        The forward kernel's column chunks (``None``: ``column_halves``); see
        :meth:`halves`.
    fwd_maxnreg : int or None
        Registers per thread ptxas may use in the forward kernel (Triton's ``maxnreg``
        launch option, PTX ``.maxnreg``; ``None``: ptxas's own choice).
    dq_maxnreg, dkdv_maxnreg : int or None
        The same for the dQ and the dK/dV kernel.
    classify : bool
        The counts classify each sample per tile pair as full, disjoint or mixed and skip
        the comparisons of the first two (uniform branches;
        :func:`plsh_fast.triton._tiling.tile_counts`); ``False``: every sample is compared (the
        same counts, bit for bit).
    dkdv_block_n : int or None
        Key tile of the dK/dV kernel (``None``: ``block_n``); its query ranges are planned for
        this tile (:func:`plsh_fast.triton.plan_query_range`), so it need not divide or be
        divided by ``block_n``.
    dkdv_split_d : bool
        Two dK/dV programs per key tile, each accumulating one of the equal column halves
        of dK and dV (both recompute the logits, counts and dP: 1.5 times the MMA work and
        twice the counts and ``exp2``), halving the accumulators' registers. Only where
        the backward takes ``head_dim`` and ``head_dim_v`` each in two equal, non-empty
        column chunks (:func:`head_dim_split`; ``column_halves`` at head sizes above 16);
        ignored otherwise.
    dkdv_manual_x3 : bool
        float32, with ``dkdv_split_d`` and column halves of at least 32: the dK/dV kernel
        writes the logits' and dP's ``tf32x3`` out (``input_precision="tf32"`` dots, as
        Triton's lowering, the same arithmetic): K and V split into TF32 high and low parts
        once per program, in four column quarters (narrower MMA operands keep fewer
        registers live), and dK, dV accumulated per quarter (a fresh tf32x3 accumulator of
        a quarter's width per dot).
    narrow_whole : bool
        Unequal head sizes: the backward kernels take the narrower of ``head_dim`` and
        ``head_dim_v`` in one piece (:func:`head_dim_split` without halves) and only the
        wider in column halves (``column_halves``), except the dK/dV kernel's column-half
        programs (``dkdv_split_d``), which need halves of both (:meth:`backward_chunks`).
    variant : int
        The kernels' formula: 0 PLSH attention (the shipped kernels); negative controls
        and an ablation of the benchmarks and tests: 1, the forward with the bias
        ``-log C`` instead of ``+log C``; 2, the forward with the counts ignored (block
        mask only); 3, the forward without counts (planned key range and causal mask
        only); any non-zero value, the backward with the counts ignored (mask only).
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    dq_num_warps: int
    dkdv_block_m: int
    dkdv_num_warps: int
    column_halves: bool = False
    dq_block_n: int | None = None
    fwd_column_halves: bool | None = None
    fwd_maxnreg: int | None = None
    dkdv_block_n: int | None = None
    dkdv_split_d: bool = False
    dkdv_manual_x3: bool = False
    narrow_whole: bool = False
    dq_maxnreg: int | None = None
    dkdv_maxnreg: int | None = None
    classify: bool = True
    variant: int = 0

    def halves(self, forward: bool) -> bool:
        """Whether the forward (``forward=True``) or the backward kernels take ``head_dim``
        in two equal column chunks (:func:`head_dim_split`)."""
        if forward and self.fwd_column_halves is not None:
            return self.fwd_column_halves
        return self.column_halves

    def backward_chunks(
        self, head_dim: int, head_dim_v: int, dkdv: bool
    ) -> tuple[tuple[int, int], tuple[int, int]]:
        """Column chunks ``((BLOCK_D, BLOCK_D1), (BLOCK_DV, BLOCK_DV1))`` of ``head_dim`` and
        ``head_dim_v`` in the dQ kernel (``dkdv=False``) or the dK/dV kernel (before its
        column-half programs halve them again): :func:`head_dim_split` of each, in halves
        where :meth:`halves` says so, but with :attr:`TileConfig.narrow_whole` the narrower
        of unequal head sizes in one piece (not in the dK/dV kernel's column-half programs,
        :attr:`TileConfig.dkdv_split_d`)."""
        halves = self.halves(forward=False)
        whole = self.narrow_whole and not (dkdv and self.dkdv_split_d)
        widest = max(head_dim, head_dim_v)
        return tuple(
            head_dim_split(d, halves and not (whole and d < widest)) for d in (head_dim, head_dim_v)
        )


def tile_config(
    head_dim: int,
    head_dim_v: int,
    device: torch.device,
    dtype: torch.dtype = torch.bfloat16,
    capability: tuple[int, int] | None = None,
    num_samples: int | None = None,
) -> TileConfig:
    """The shipped :class:`TileConfig` for a head size, dtype and GPU.

    Chosen from the AOT compile tables (``benchmarks/aot_report.py --set full``,
    ``benchmarks/results/aot_2026-12-01_session4*.md``, Triton 3.9 and 3.6) so that at the
    head sizes of that set (40, 64, 72, 80, 96, 112, 120, 128 and 256, 64/128 and 128/64;
    float32, float16, bfloat16; sm_90 and sm_80; 1 to 64 samples) no kernel at
    ``head_dim <= 128`` spills registers, the key/query loops stay software-pipelined
    (``cp.async``), the dots use ``wgmma`` on sm_90 (``mma.sync`` on sm_80; also the
    bfloat16 dK/dV kernel at head_dim 256) and the shared memory fits; speed is a GPU
    measurement (``benchmarks/gpu_check.py``). Head sizes that are not multiples of 16
    (40, 72, 120) need the launch code's :func:`plsh_fast.triton.aligned_rows` copy for
    that (without it they lost ``cp.async`` and some spilled). At unequal head sizes the
    backward kernels take the narrower one whole (:attr:`TileConfig.narrow_whole`: in
    halves it spilled 40-88 B in the float32 dQ kernel on sm_90 and 8-52 B in the
    half-type dK/dV kernel on sm_80). On sm_90 the half types' backward kernels take
    column halves at a head_dim strictly between 96 and 128 (in one 128-wide chunk the
    dK/dV kernel spilled 64 B at 104 and 120 with Triton 3.6) and the float32 forward
    there runs with ``maxnreg = 254``
    (ptxas's own 255 spilled 24 B at 112 with 3.6, and 254 spills 16 B at 128 with 3.6, so
    128 keeps ptxas's choice; ``benchmarks/results/aot_2026-12-01_other_head_dims.md``,
    "Session 4"). More than 64 samples (up to 256) are statically unrolled passes of 32
    samples (:func:`plsh_fast.triton.sample_block`): the loops stay pipelined
    (``benchmarks/results/aot_2026-12-01_samples.md``). Not so: above 256 samples the
    passes are a runtime loop (no ``cp.async``); the float32 forward at head_dim 256 on
    sm_90 (32-row tiles: ``mma.sync``, and it spills); at 256 samples the float32 dQ
    kernel (24 B, Triton 3.9) and forward (16 B, 3.6) on sm_90, and the float32 dQ kernel
    at head_dim 112 from 65 samples (8 B, 3.9; the samples results file, "After the s > 64
    rules"). ``num_samples`` above 64 (more than one pass of the counts): the half types'
    dK/dV kernel on sm_80 at head_dim <= 128 may use 255 registers
    (:attr:`TileConfig.dkdv_maxnreg`; left to itself ptxas stopped at 168 and spilled 72 B
    at 256 samples with Triton 3.9), and float32 on sm_90 at head_dim <= 128 compares
    every sample (:attr:`TileConfig.classify` off: the skips of full and disjoint samples
    made the dQ kernel spill 16 B at 65 samples, 32 B at 128, 96 B at 256 and the forward
    16 B (3.9) and 40 B (3.6) at 256); up to 64 samples (or ``None``) the configuration is
    the same as without it. The float32 dK/dV kernel on sm_90 takes
    64-key tiles (a warpgroup MMA's rows; the plan's key tile stays 16) in two column-half
    programs with its own tf32x3 (:attr:`TileConfig.dkdv_split_d`,
    :attr:`TileConfig.dkdv_manual_x3`; ``benchmarks/results/aot_2026-12-01_fp32_dkdv.md``);
    on sm_80 it keeps 16 x 16 tiles (``mma.sync``). The query tiles stay at 64 rows or
    fewer because a tile's planned key range is about ``BLOCK_M`` plus the window, and the
    PLSH window is short for small sigma. The dQ
    kernel walks the key range in half-width tiles (32 keys on sm_90, 16 on sm_80; with the
    plan's 64/32 it spilled 8-24 B at bf16/fp16 head_dim 96-128 with Triton 3.6, and on
    sm_80 with 3.9). Eight warps would avoid these spills too, but with 64-row tiles the
    second warpgroup (sm_90) or the second four warps (sm_80) only repeat the first's logits
    and counts (``warpsPerCTA = [8, 1]``, the layout a dot feeding another dot takes), twice
    the work. float32 (``tf32x3``: each operand split in a TF32 high and low part, three
    MMAs per dot) takes narrow key tiles, eight warps in the dQ kernel (whose second
    warpgroup also repeats the logits and counts; with four warps it spills 64 B at
    head_dim 128 on sm_90, Triton 3.9) and ``head_dim`` in two column chunks, except the
    sm_90 forward at a head_dim in 65..96 that is not a power of two (96 = 64 + 32: the
    halves 64 + 64 spilled 24 B with 3.6; above 96 the halves spill less than one 128-wide
    chunk: at 112, 0 B against 92 B with 3.9 and 24 B against 192 B with 3.6,
    ``benchmarks/results/aot_2026-12-01_other_head_dims.md``); the sm_80 float32 forward at
    head_dim 65..128 (16 x 16 tiles) lets ptxas use 255 registers (``fwd_maxnreg``; left
    to itself it stopped at 168 and spilled 8 B at head_dim 96 with 3.6, and with two warps
    at 128 with 3.9). On sm_80 the half types at ``head_dim <= 128`` take two column chunks
    too.

    Parameters
    ----------
    head_dim, head_dim_v : int
        Query/key and value head sizes (``<= 256``).
    device : torch.device
        A CUDA device, or any other (the interpreter): 16 x 16 tiles.
    dtype : torch.dtype
        float16, bfloat16 or float32.
    capability : tuple of int or None
        CUDA compute capability (default: the device's).
    num_samples : int or None
        Partition samples ``s`` of the call (``None``: the configuration of ``s <= 64``).

    Returns
    -------
    TileConfig
    """
    widest = max(head_dim, head_dim_v)
    fp32 = dtype == torch.float32
    many = num_samples is not None and num_samples > MAX_SAMPLE_BLOCK  # more than one pass
    if device.type != "cuda":  # the interpreter: the column chunks of a GPU, small tiles
        halves = fp32 and widest <= 128
        return TileConfig(16, 16, 4, 1, 4, 16, 4, halves, narrow_whole=halves)
    if capability is None:
        capability = torch.cuda.get_device_capability(device)
    hopper = capability[0] >= 9
    if widest <= 128 and fp32:
        if hopper:  # dK/dV: 64-key tiles (warpgroup MMAs), column halves, tf32x3 by hand
            return TileConfig(
                64, 16, 4, 2, 8, 16, 4, True,
                fwd_column_halves=pow2(widest) == widest or widest > 96,
                fwd_maxnreg=254 if 96 < widest < 128 else None,
                dkdv_block_n=64, dkdv_split_d=True, dkdv_manual_x3=True, narrow_whole=True,
                classify=not many,
            )  # fmt: skip
        if widest <= 64:
            return TileConfig(64, 16, 4, 2, 8, 16, 8, True, narrow_whole=True)
        return TileConfig(  # sm_80, d 65..128
            16, 16, 4, 2, 8, 16, 8, True, fwd_maxnreg=255, narrow_whole=True
        )
    if widest <= 128 and not hopper:  # mma.sync keeps the accumulators in registers
        return TileConfig(
            64, 32, 4, 3, 4, 16, 4, True, dq_block_n=16, narrow_whole=True,
            dkdv_maxnreg=255 if many else None,
        )  # fmt: skip
    if widest <= 128:  # backward column halves above 96 but at 128 (forward: one chunk)
        halves = 96 < widest < 128
        return TileConfig(
            64, 64, 4, 3, 4, 16, 4, halves, dq_block_n=32, fwd_column_halves=False,
            narrow_whole=halves,
        )  # fmt: skip
    if fp32:  # float32 tiles of width 256: stay inside shared memory
        return TileConfig(32, 32, 8, 2, 8, 16, 8)
    return TileConfig(64, 32, 8, 2, 8, 16, 8)


def default_blocks(
    head_dim: int,
    head_dim_v: int,
    device: torch.device,
    dtype: torch.dtype = torch.bfloat16,
    capability: tuple[int, int] | None = None,
) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` of the shipped forward kernel: the
    first four fields of :func:`tile_config` (same arguments)."""
    cfg = tile_config(head_dim, head_dim_v, device, dtype, capability)
    return cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages


def dot_precision(dtype: torch.dtype, interpreted: bool) -> str:
    """``input_precision`` of ``tl.dot``: float32 inputs use ``tf32x3`` (three TF32 MMAs,
    about float32 accuracy at tensor-core speed) when compiled; half types use the native
    MMA ("tf32" is ignored for them); the interpreter computes in float32 ("ieee")."""
    if interpreted:
        return "ieee"
    return "tf32x3" if dtype == torch.float32 else "tf32"
