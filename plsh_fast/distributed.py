"""Context parallelism: PLSH attention over a sequence split across ranks, with a bounded halo.

Each rank of a ``torch.distributed`` process group holds one contiguous chunk of the
sequence (global positions ``start .. stop - 1``) with its queries, keys and values. PLSH
attention is local: query ``p`` gives key ``j`` a nonzero count ``C_pj`` only if some
sample puts both in one bin, and bins are contiguous runs of positions. So the keys that a
chunk's queries reach form, per head, the interval from the first position of the blocks
containing the chunk's first position to the last position of the blocks containing its
last position (causal: only the left part). Outside its own chunk a rank needs only that
*halo*, whose width is at most ``ceil(max_t pitch_t) - 1`` tokens per side and head,
whatever the sequence length (``proofs_notes/halo_bound.md``). Ring attention, which exact
ALiBi needs, passes every key and value around the ring instead.

:func:`context_parallel_plsh_attention` does the following on every rank:

1. One ``all_gather`` of a small int64 vector: the chunk bounds, the shapes, dtype,
   causal flag, scale and a checksum of the partition sample
   (:func:`partition_checksum`). Every rank checks that the chunks tile one contiguous
   range of positions and that all ranks agree, and raises the same error if not (a rank
   whose own arguments are bad raises its error, the others name that rank): nothing is
   left waiting.
2. :func:`plan_context_parallel` computes, from the partition and the bounds alone (no
   communication), the exact key range every rank's queries reach, per kv head
   (:func:`key_reach`), and from it which slice of its keys every rank sends to which.
3. :func:`halo_exchange`: point-to-point ``batch_isend_irecv`` of exactly those key and
   value slices (a halo wider than one chunk comes from several ranks; causal: from the
   ranks holding earlier positions only). Its backward sends the gradients of the
   received keys and values back to their owners, which add them to their own.
4. The local fast path :func:`plsh_fast.plsh_attention` on the local queries against the
   halo plus local keys, with explicit global positions and the same partition sample.

The result (output, LSE, and the gradients of query, key, value) is that of
:func:`plsh_fast.plsh_attention` on the whole sequence, restricted to the rank's chunk.
Positions are never sent: they follow from the gathered bounds. The communication goes
through the group's backend unchanged (gloo on CPU tensors, NCCL on CUDA tensors); the
buffers live on the device of ``query``.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from numpy.typing import ArrayLike

from plsh_ref.partition import PartitionSample, resolve_partition
from plsh_ref.partition import bins as reference_bins
from plsh_ref.validation import check_bool, check_int, check_scale

from . import _validation as V
from .api import plsh_attention

__all__ = [
    "HaloPlan",
    "context_parallel_plsh_attention",
    "halo_exchange",
    "key_reach",
    "partition_checksum",
    "plan_context_parallel",
]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Fields of the vector every rank contributes to the one all_gather, in order.
_META = (
    "error",
    "has_start",
    "chunk_start",
    "length",
    "partition",
    "batch",
    "num_heads",
    "num_heads_kv",
    "head_dim",
    "head_dim_v",
    "dtype",
    "causal",
    "scale",
)


# --------------------------------------------------------------------------------------
# Halo geometry (numpy, no communication)
# --------------------------------------------------------------------------------------


def _bin_floor(pitch: np.ndarray, offset: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``floor((float64(p) - offset) / pitch)`` elementwise, as a float64 array.

    The binary64 formula of :func:`plsh_ref.partition.bins` (which evaluates all pairs of
    positions and hashes) applied to one position per hash; equal to it bit for bit
    (``tests/fast/test_distributed.py::test_key_reach_equals_count_oracle``).
    """
    return np.floor((positions.astype(np.float64) - offset) / pitch)


def _block_edge(
    pitch: np.ndarray, offset: np.ndarray, p: int, limit: int, direction: int
) -> np.ndarray:
    """Farthest position from ``p`` toward ``direction`` (-1 or +1), not past ``limit``,
    in the same bin as ``p``, for every hash (int64, shape of ``pitch``).

    Bins are non-decreasing in the position (both roundings are monotone), so the
    positions sharing ``p``'s bin are an interval: an exponential search from a first
    guess of ``ceil(pitch) + 2`` finds a position outside it, then a bisection its edge.
    ``O(log(pitch))`` evaluations of the binary64 bin per hash, exact by construction.
    """
    span = abs(limit - p)
    b0 = _bin_floor(pitch, offset, np.full(pitch.shape, p, dtype=np.int64))

    def in_bin(x: np.ndarray) -> np.ndarray:
        inside_limit = (x - limit) * direction <= 0
        safe = np.where(inside_limit, x, p)
        return inside_limit & (_bin_floor(pitch, offset, safe) == b0)

    guess = np.ceil(np.minimum(pitch, float(span + 1))).astype(np.int64) + 2
    step = np.minimum(guess, span + 1)
    while True:
        grow = in_bin(p + direction * step)
        if not grow.any():
            break
        step = np.where(grow, np.minimum(2 * step, span + 1), step)
    inside = np.full(pitch.shape, p, dtype=np.int64)
    outside = p + direction * step
    while True:
        open_ = np.abs(outside - inside) > 1
        if not open_.any():
            return inside
        mid = (inside + outside) // 2
        hit = in_bin(mid)
        inside = np.where(open_ & hit, mid, inside)
        outside = np.where(open_ & ~hit, mid, outside)


def key_reach(
    partition: PartitionSample,
    start: int,
    stop: int,
    *,
    causal: bool = True,
    sequence_start: int | None = None,
    sequence_stop: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Smallest and largest key position that the queries ``start .. stop - 1`` reach, per head.

    Query ``p`` reaches key ``j`` (count ``C_pj >= 1``) iff some sample puts both in one
    bin. Bins are contiguous and non-decreasing in the position, so over the chunk the
    reached keys of head ``h`` are the interval ``[min_t first_t(start), max_t
    last_t(stop - 1)]`` with ``first_t(p)`` / ``last_t(p)`` the first / last position of
    ``p``'s bin under sample ``t`` (``last`` is ``stop - 1`` when ``causal``), clipped to
    the sequence. Computed exactly with the binary64 bins of
    :func:`plsh_ref.partition.bins`.

    Parameters
    ----------
    partition : PartitionSample
        ``pitch``, ``offset`` ``(num_heads, num_samples)``.
    start, stop : int
        The chunk's global positions ``start .. stop - 1`` (``stop > start``), ``|p| < 2**53``.
    causal : bool
        Keys after ``stop - 1`` are never reached.
    sequence_start, sequence_stop : int, optional
        The whole sequence is ``sequence_start .. sequence_stop - 1`` (default: the chunk);
        it must contain the chunk.

    Returns
    -------
    (first, last) : tuple of numpy.ndarray
        int64, ``(num_heads,)``, global positions, ``first <= start``, ``last >= stop - 1``.
        ``start - first`` is the left halo width of each head, at most
        ``ceil(max_t pitch_t) - 1`` (binary64 bins: ``ceil((1 + 2B) max_t pitch_t) - 1``,
        the same unless positions come near ``2**53``); for independent samples its law is
        that of the largest of ``s`` geometric block extents, ``P(W >= b) = 1 - (1 -
        exp(-b / sigma))^s``.

    Raises
    ------
    TypeError
        ``partition`` is not a PartitionSample; non-integer bounds; non-bool ``causal``.
    ValueError
        ``stop <= start``, a sequence range that does not contain the chunk, positions of
        magnitude ``>= 2**53``, or a bin index outside int64 (argument ``partition``).

    References
    ----------
    ``proofs_notes/halo_bound.md`` (sections 1-2); SPEC section 2 (bins).
    """
    if not isinstance(partition, PartitionSample):
        raise TypeError(f"partition: must be a PartitionSample, got {type(partition).__name__}")
    causal = check_bool("causal", causal)
    start = check_int("start", start)
    stop = check_int("stop", stop)
    if stop <= start:
        raise ValueError(f"stop: must be > start={start}, got {stop}")
    lo = start if sequence_start is None else check_int("sequence_start", sequence_start)
    hi = stop if sequence_stop is None else check_int("sequence_stop", sequence_stop)
    if lo > start or hi < stop:
        raise ValueError(
            f"sequence_start: the sequence [{lo}, {hi}) must contain the chunk [{start}, {stop})"
        )
    if max(abs(lo), abs(hi - 1)) >= 2**53:
        raise ValueError("sequence_start: positions must have magnitude < 2**53")
    reference_bins(partition, np.array([lo, hi - 1], dtype=np.int64))  # int64 range check
    pitch, offset = partition.pitch, partition.offset
    first = _block_edge(pitch, offset, start, lo, -1).min(axis=1)
    if causal:
        last = np.full(partition.num_heads, stop - 1, dtype=np.int64)
    else:
        last = _block_edge(pitch, offset, stop - 1, hi - 1, +1).max(axis=1)
    return first.astype(np.int64), last.astype(np.int64)


def _check_tiling(bounds: list[tuple[int, int]], name: str) -> None:
    """Refuse chunks (``[start, stop)`` per rank) that overlap or leave a gap."""
    for rank, (a, b) in enumerate(bounds):
        if b < a:
            raise ValueError(f"{name}: rank {rank} has stop {b} < start {a}")
    nonempty = sorted((a, b, r) for r, (a, b) in enumerate(bounds) if b > a)
    for (a0, b0, r0), (a1, b1, r1) in zip(nonempty, nonempty[1:]):
        if a1 != b0:
            kind = "overlap" if a1 < b0 else "gap"
            raise ValueError(
                f"{name}: the chunks do not tile the sequence: rank {r0} holds positions "
                f"[{a0}, {b0}) and rank {r1} [{a1}, {b1}) ({kind})"
            )
    if nonempty and max(abs(nonempty[0][0]), abs(nonempty[-1][1] - 1)) >= 2**53:
        raise ValueError(f"{name}: positions must have magnitude < 2**53")


@dataclass(frozen=True, eq=False)
class HaloPlan:
    """Who sends which keys to whom: the result of :func:`plan_context_parallel`.

    Attributes
    ----------
    bounds : tuple of (int, int)
        ``(start, stop)`` global positions of each rank's chunk, in group rank order.
    key_ranges : numpy.ndarray
        int64 ``(world_size, num_heads_kv, 2)``: the keys ``[first, stop)`` that rank
        ``r``'s queries reach through kv head ``g`` (its chunk plus its halo; an empty
        chunk gives ``(start, start)``).
    causal : bool
        Whether the plan is for causal attention (no right halo).

    References
    ----------
    ``proofs_notes/halo_bound.md``, sections 1 and 2 (the exact reach of a chunk,
    ``HaloPlan.transfer``); ``docs/context_parallel.md``.
    """

    bounds: tuple
    key_ranges: np.ndarray
    causal: bool

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return len(self.bounds)

    @property
    def num_heads_kv(self) -> int:
        """Number of kv heads."""
        return self.key_ranges.shape[1]

    def transfer(self, src: int, dst: int) -> np.ndarray:
        """Key ranges ``[lo, hi)`` (global positions) that ``src`` sends to ``dst`` per kv head.

        int64 ``(num_heads_kv, 2)``; ``lo == hi`` where nothing is sent. Empty for
        ``src == dst``.
        """
        a, b = self.bounds[src]
        need = self.key_ranges[dst]
        lo = np.maximum(need[:, 0], a)
        hi = np.minimum(need[:, 1], b)
        if src == dst or b <= a:
            hi = lo
        hi = np.maximum(hi, lo)
        return np.stack([lo, hi], axis=1)

    def tokens(self, src: int, dst: int) -> int:
        """Number of (kv head, position) pairs ``src`` sends to ``dst``."""
        r = self.transfer(src, dst)
        return int((r[:, 1] - r[:, 0]).sum())

    def tokens_sent(self, rank: int) -> int:
        """(kv head, position) pairs of keys that ``rank`` sends in one exchange."""
        return sum(self.tokens(rank, dst) for dst in range(self.world_size))

    def tokens_received(self, rank: int) -> int:
        """(kv head, position) pairs of keys that ``rank`` receives: its halo."""
        return sum(self.tokens(src, rank) for src in range(self.world_size))

    def bytes_sent(
        self, rank: int, *, batch: int, head_dim: int, head_dim_v: int, element_size: int
    ) -> int:
        """Bytes of keys and values that ``rank`` sends in the forward exchange.

        ``tokens_sent(rank) * batch * (head_dim + head_dim_v) * element_size``; the backward
        sends the same number of bytes of gradients the other way.
        """
        return self.tokens_sent(rank) * batch * (head_dim + head_dim_v) * element_size

    def key_positions(self, rank: int) -> np.ndarray:
        """Global positions (int64, contiguous) of the keys :func:`halo_exchange` returns."""
        r = self.key_ranges[rank]
        return np.arange(int(r[:, 0].min()), int(r[:, 1].max()), dtype=np.int64)


def plan_context_parallel(
    partition: PartitionSample,
    chunk_bounds: Sequence[tuple[int, int]],
    *,
    causal: bool = True,
    num_heads_kv: int | None = None,
) -> HaloPlan:
    """The halo exchange for chunks ``chunk_bounds`` of one sequence: no communication.

    Every rank computes the same plan from the same partition sample and bounds. Kv head
    ``g`` serves query heads ``g * k .. (g + 1) * k - 1`` (``k = num_heads / num_heads_kv``)
    and needs the union of their reaches (:func:`key_reach`).

    Parameters
    ----------
    partition : PartitionSample
        ``(num_heads, num_samples)``, the same on every rank.
    chunk_bounds : sequence of (int, int)
        ``(start, stop)`` global positions held by each rank (group rank order); the
        non-empty chunks must tile one contiguous range (any rank order).
    causal : bool
        Causal attention: halos only toward earlier positions.
    num_heads_kv : int, optional
        Kv heads (grouped-query attention); must divide ``num_heads``. Default
        ``num_heads``.

    Returns
    -------
    HaloPlan

    Raises
    ------
    TypeError
        Bad ``partition``, non-integer bounds or ``num_heads_kv``, non-bool ``causal``.
    ValueError
        Empty ``chunk_bounds``, a chunk with ``stop < start``, chunks that overlap or leave
        a gap (argument ``chunk_bounds``), ``num_heads_kv`` not dividing ``num_heads``,
        positions of magnitude ``>= 2**53`` or bins outside int64.

    References
    ----------
    ``proofs_notes/halo_bound.md``.

    Examples
    --------
    >>> import numpy as np
    >>> from plsh_ref.partition import draw_partition
    >>> from plsh_fast.distributed import plan_context_parallel
    >>> partition = draw_partition(np.array([2.0, 8.0]), num_samples=4, seed=0)
    >>> plan = plan_context_parallel(partition, [(0, 64), (64, 128)])
    >>> plan.world_size, plan.tokens_received(0)  # causal: the first chunk needs no halo
    (2, 0)
    >>> plan.tokens_received(1) > 0
    True
    """
    if not isinstance(partition, PartitionSample):
        raise TypeError(f"partition: must be a PartitionSample, got {type(partition).__name__}")
    causal = check_bool("causal", causal)
    bounds = []
    try:
        items = list(chunk_bounds)
    except TypeError:
        raise TypeError("chunk_bounds: must be a sequence of (start, stop) pairs") from None
    for item in items:
        try:
            a, b = item
        except (TypeError, ValueError):
            raise TypeError("chunk_bounds: must be a sequence of (start, stop) pairs") from None
        bounds.append((check_int("chunk_bounds", a), check_int("chunk_bounds", b)))
    if not bounds:
        raise ValueError("chunk_bounds: needs at least one rank")
    _check_tiling(bounds, "chunk_bounds")
    h = partition.num_heads
    g = h if num_heads_kv is None else check_int("num_heads_kv", num_heads_kv, minimum=1)
    if h % g:
        raise ValueError(f"num_heads_kv: {g} must divide num_heads={h}")
    nonempty = [(a, b) for a, b in bounds if b > a]
    seq_lo = min((a for a, _ in nonempty), default=0)
    seq_hi = max((b for _, b in nonempty), default=0)
    ranges = np.empty((len(bounds), g, 2), dtype=np.int64)
    for rank, (a, b) in enumerate(bounds):
        if b <= a:
            ranges[rank] = a
            continue
        first, last = key_reach(
            partition, a, b, causal=causal, sequence_start=seq_lo, sequence_stop=seq_hi
        )
        ranges[rank, :, 0] = first.reshape(g, h // g).min(axis=1)
        ranges[rank, :, 1] = last.reshape(g, h // g).max(axis=1) + 1
    ranges.flags.writeable = False
    return HaloPlan(bounds=tuple(bounds), key_ranges=ranges, causal=causal)


def partition_checksum(partition: PartitionSample) -> int:
    """A 63-bit checksum of the partition sample's shape and exact ``pitch``/``offset`` bits.

    Ranks compare it once per call to detect different partitions (a different seed,
    sampler or head slice). BLAKE2b of the float64 bytes, as a non-negative int.

    Raises
    ------
    TypeError
        ``partition`` is not a PartitionSample.

    References
    ----------
    ``docs/context_parallel.md`` (step 1: a checksum of the partition);
    ``hashlib.blake2b``.
    """
    if not isinstance(partition, PartitionSample):
        raise TypeError(f"partition: must be a PartitionSample, got {type(partition).__name__}")
    digest = hashlib.blake2b(digest_size=8)
    digest.update(np.array(partition.pitch.shape, dtype="<i8").tobytes())
    digest.update(np.ascontiguousarray(partition.pitch, dtype="<f8").tobytes())
    digest.update(np.ascontiguousarray(partition.offset, dtype="<f8").tobytes())
    return int.from_bytes(digest.digest(), "little") >> 1


# --------------------------------------------------------------------------------------
# The exchange (point-to-point, differentiable)
# --------------------------------------------------------------------------------------


def _pack(key: torch.Tensor, value: torch.Tensor, ranges: np.ndarray, origin: int) -> torch.Tensor:
    """The slices ``[lo, hi)`` (global positions; index 0 is ``origin``) of every kv head of
    ``key`` then ``value``, flattened into one byte buffer."""
    parts = []
    for x in (key, value):
        for g, (lo, hi) in enumerate(ranges.tolist()):
            if hi > lo:
                parts.append(x[:, g, lo - origin : hi - origin].reshape(-1))
    return torch.cat(parts).view(torch.uint8)


def _nbytes(key: torch.Tensor, value: torch.Tensor, ranges: np.ndarray) -> int:
    m = int((ranges[:, 1] - ranges[:, 0]).sum())
    return m * key.shape[0] * (key.shape[3] + value.shape[3]) * key.element_size()


def _unpack(
    buf: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    ranges: np.ndarray,
    origin: int,
    *,
    accumulate: bool,
) -> None:
    """Write (or add) a buffer made by :func:`_pack` into ``key`` and ``value``."""
    flat = buf.view(key.dtype)
    i = 0
    for x in (key, value):
        for g, (lo, hi) in enumerate(ranges.tolist()):
            if hi <= lo:
                continue
            dst = x[:, g, lo - origin : hi - origin]
            part = flat[i : i + dst.numel()].view(dst.shape)
            i += dst.numel()
            if accumulate:
                dst.add_(part)
            else:
                dst.copy_(part)


def _point_to_point(sends, recvs, group) -> dict:
    """Post every send ``(peer, buffer)`` and receive ``(peer, nbytes)`` at once; wait.

    Returns the received buffers by peer. At most one message per ordered pair of ranks.
    """
    ops, received = [], {}
    for peer, buf in sends:
        ops.append(dist.P2POp(dist.isend, buf, group=group, group_peer=peer))
    for peer, nbytes, device in recvs:
        received[peer] = torch.empty(nbytes, dtype=torch.uint8, device=device)
        ops.append(dist.P2POp(dist.irecv, received[peer], group=group, group_peer=peer))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return received


class _HaloExchange(torch.autograd.Function):
    """``(key_ext, value_ext)``: the local keys/values with the halo received from the
    owners; backward returns the halo gradients to their owners, which add them."""

    @staticmethod
    def forward(ctx, key, value, plan: HaloPlan, rank: int, group):
        start, _ = plan.bounds[rank]
        positions = plan.key_positions(rank)
        e0 = int(positions[0]) if positions.size else start
        n_ext = positions.size
        b, g = key.shape[:2]
        key_ext = key.new_zeros(b, g, n_ext, key.shape[3])
        value_ext = value.new_zeros(b, g, n_ext, value.shape[3])
        key_ext[:, :, start - e0 : start - e0 + key.shape[2]] = key
        value_ext[:, :, start - e0 : start - e0 + value.shape[2]] = value
        peers = range(plan.world_size)
        sends = [
            (dst, _pack(key, value, plan.transfer(rank, dst), start))
            for dst in peers
            if plan.tokens(rank, dst)
        ]
        recvs = [
            (src, _nbytes(key, value, plan.transfer(src, rank)), key.device)
            for src in peers
            if plan.tokens(src, rank)
        ]
        for src, buf in _point_to_point(sends, recvs, group).items():
            _unpack(buf, key_ext, value_ext, plan.transfer(src, rank), e0, accumulate=False)
        ctx.plan, ctx.rank, ctx.group, ctx.e0, ctx.n = plan, rank, group, e0, key.shape[2]
        return key_ext, value_ext

    @staticmethod
    def backward(ctx, grad_key_ext, grad_value_ext):
        plan, rank, e0 = ctx.plan, ctx.rank, ctx.e0
        start, _ = plan.bounds[rank]
        local = slice(start - e0, start - e0 + ctx.n)
        grad_key = grad_key_ext[:, :, local].contiguous()
        grad_value = grad_value_ext[:, :, local].contiguous()
        peers = range(plan.world_size)
        sends = [
            (src, _pack(grad_key_ext, grad_value_ext, plan.transfer(src, rank), e0))
            for src in peers
            if plan.tokens(src, rank)
        ]
        recvs = [
            (dst, _nbytes(grad_key, grad_value, plan.transfer(rank, dst)), grad_key.device)
            for dst in peers
            if plan.tokens(rank, dst)
        ]
        for dst, buf in _point_to_point(sends, recvs, ctx.group).items():
            _unpack(buf, grad_key, grad_value, plan.transfer(rank, dst), start, accumulate=True)
        return grad_key, grad_value, None, None, None


def _check_initialized(group) -> int:
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "group: torch.distributed is not initialised; call "
            "torch.distributed.init_process_group first"
        )
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("group: this process is not a member of the process group")
    return rank


def halo_exchange(
    key: torch.Tensor,
    value: torch.Tensor,
    plan: HaloPlan,
    *,
    group: dist.ProcessGroup | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Receive the halo of this rank's chunk from its owners (differentiable).

    Sends every other rank the slices of ``key`` and ``value`` that ``plan`` says it needs,
    receives its own halo, and returns the keys/values at the global positions
    ``plan.key_positions(rank)``. Where a kv head's halo is narrower than the union over
    kv heads the returned entries are 0: no query of this chunk reaches them through that
    head (count 0, weight exactly 0). The backward sends the gradients of the received
    entries back to their owners, which add them to the gradients of their own keys and
    values; every rank of the group must run it (as every rank runs the forward).

    Parameters
    ----------
    key, value : torch.Tensor
        ``(batch, num_heads_kv, n, head_dim)``, ``(batch, num_heads_kv, n, head_dim_v)``:
        this rank's chunk, ``n = stop - start`` of ``plan.bounds[rank]``; one dtype.
    plan : HaloPlan
        From :func:`plan_context_parallel`, the same on every rank.
    group : torch.distributed.ProcessGroup, optional
        Default: the default group. Ranks are group ranks.

    Returns
    -------
    (key_ext, value_ext) : tuple of torch.Tensor
        ``(batch, num_heads_kv, len(plan.key_positions(rank)), head_dim[_v])``.

    Raises
    ------
    TypeError
        ``plan`` is not a HaloPlan; ``key``/``value`` are not tensors of one dtype.
    ValueError
        ``torch.distributed`` not initialised or this process not in ``group``; a plan for
        another world size; shapes that disagree with the plan.

    References
    ----------
    ``proofs_notes/halo_bound.md``.
    """
    rank = _check_initialized(group)
    if not isinstance(plan, HaloPlan):
        raise TypeError(f"plan: must be a HaloPlan, got {type(plan).__name__}")
    for name, t in (("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise TypeError(f"{name}: must be a 4-dimensional torch.Tensor")
    if value.dtype != key.dtype:
        raise TypeError(f"value: dtype {value.dtype} differs from key dtype {key.dtype}")
    if plan.world_size != dist.get_world_size(group):
        raise ValueError(
            f"plan: made for {plan.world_size} ranks, the group has {dist.get_world_size(group)}"
        )
    a, b = plan.bounds[rank]
    if key.shape[2] != b - a or value.shape[:3] != key.shape[:3]:
        raise ValueError(f"key: shape {tuple(key.shape)} does not hold the chunk [{a}, {b})")
    if key.shape[1] != plan.num_heads_kv:
        raise ValueError(f"key: {key.shape[1]} kv heads, the plan was made for {plan.num_heads_kv}")
    return _HaloExchange.apply(key.contiguous(), value.contiguous(), plan, rank, group)


# --------------------------------------------------------------------------------------
# Context-parallel attention
# --------------------------------------------------------------------------------------


def _float_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _local_meta(
    query,
    key,
    value,
    partition,
    slopes,
    num_samples,
    seed,
    causal,
    scale,
    chunk_start,
    backend,
    check_finite,
):
    """Validate this rank's arguments; return (metadata dict, resolved values)."""
    causal = check_bool("causal", causal)
    check_finite = check_bool("check_finite", check_finite)
    V.check_qkv(query, key, value)
    batch, num_heads, n, head_dim = query.shape
    if key.shape[2] != n:
        raise ValueError(
            f"key: holds {key.shape[2]} positions, query {n}: every rank holds the queries "
            "and keys of the same chunk (self-attention)"
        )
    backend = V.check_backend(backend, query.device, head_dim, value.shape[3])
    if partition is None and seed is None:
        raise ValueError(
            "seed: required when no partition is given (every rank must draw the same "
            "partition sample)"
        )
    sample = resolve_partition(
        partition, num_heads=num_heads, slopes=slopes, num_samples=num_samples, seed=seed
    )
    c = check_scale(scale, head_dim)
    if chunk_start is not None:
        chunk_start = check_int("chunk_start", chunk_start)
        if max(abs(chunk_start), abs(chunk_start + n)) >= 2**53:
            raise ValueError("chunk_start: positions must have magnitude < 2**53")
    if check_finite:
        V.check_finite(query, key, value)
    meta = {
        "error": 0,
        "has_start": int(chunk_start is not None),
        "chunk_start": chunk_start or 0,
        "length": n,
        "partition": partition_checksum(sample),
        "batch": batch,
        "num_heads": num_heads,
        "num_heads_kv": key.shape[1],
        "head_dim": head_dim,
        "head_dim_v": value.shape[3],
        "dtype": _DTYPES.index(query.dtype),
        "causal": int(causal),
        "scale": _float_bits(c),
    }
    return meta, (sample, c, causal, backend)


def _gather_meta(meta: dict, device, group) -> list[dict]:
    vec = torch.tensor([meta[k] for k in _META], dtype=torch.int64, device=device)
    out = [torch.empty_like(vec) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, vec, group=group)
    return [dict(zip(_META, t.tolist())) for t in out]


def _agree(metas: list[dict]) -> None:
    """Raise the same ValueError on every rank if the ranks disagree."""
    names = {
        "partition": "partition: ranks disagree on the partition sample (checksums differ); "
        "draw it from the same seed and sampler on every rank",
        "dtype": "query: ranks disagree on the dtype",
        "causal": "causal: ranks disagree",
        "scale": "scale: ranks disagree",
        "has_start": "chunk_start: given on some ranks and not on others",
    }
    for field in _META[4:] + ("has_start",):
        values = [m[field] for m in metas]
        if len(set(values)) > 1:
            msg = names.get(field, f"{field}: ranks disagree")
            raise ValueError(f"{msg} (per rank: {values})")


def context_parallel_plsh_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    partition: PartitionSample | None = None,
    slopes: ArrayLike | None = None,
    num_samples: int | None = None,
    seed: int | None = None,
    causal: bool = True,
    scale: float | None = None,
    chunk_start: int | None = None,
    return_lse: bool = False,
    backend: str = "auto",
    check_finite: bool = True,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """PLSH attention of a sequence split in contiguous chunks over a process group.

    Call it on every rank of ``group`` with that rank's chunk. The result on each rank is
    :func:`plsh_fast.plsh_attention` of the whole sequence (same partition sample, global
    positions) restricted to the rank's queries, and so are the gradients of ``query``,
    ``key`` and ``value``. Each rank receives only the keys and values in its halo
    (:func:`plan_context_parallel`), at most ``ceil(max pitch) - 1`` positions per side
    and kv head, by point-to-point messages; the backward returns their gradients.

    Parameters
    ----------
    query : torch.Tensor
        ``(batch, num_heads, n, head_dim)``: the queries at global positions
        ``chunk_start .. chunk_start + n - 1``; ``n >= 0`` may differ between ranks.
        Dtypes as :func:`plsh_fast.plsh_attention`.
    key, value : torch.Tensor
        ``(batch, num_heads_kv, n, head_dim)``, ``(batch, num_heads_kv, n, head_dim_v)``,
        the same positions (self-attention; ``num_heads % num_heads_kv == 0``).
    partition : plsh_ref.partition.PartitionSample, optional
        ``(num_heads, num_samples)``, the same on every rank (checked: a checksum is
        compared). Omitted: drawn from ``seed`` (required then) with ``sigma = 1 / slopes``.
        For heads also split across ranks, pass ``partition.heads(start, stop)``.
    group : torch.distributed.ProcessGroup, optional
        The ranks sharing the sequence (default: the default group). Its backend is used
        unchanged (gloo for CPU tensors, NCCL for CUDA tensors).
    causal : bool
        Key ``j`` admissible for query ``i`` iff ``p_j <= p_i`` (halo from earlier
        positions only).
    scale : float, optional
        Logit scale, default ``1 / sqrt(head_dim)``.
    chunk_start : int, optional
        Global position of this rank's first token. Omitted on every rank: the chunks
        follow each other in group rank order from position 0. Given: on every rank; the
        chunks (any rank order) must tile one contiguous range, ``|p| < 2**53``.
    slopes, num_samples, seed
        As :func:`plsh_fast.plsh_attention` (used only to draw the partition).
    return_lse : bool
        Also return the LSE ``(batch, num_heads, n)``.
    backend : {"auto", "cpu", "triton"}
        The local fast path (:func:`plsh_fast.plsh_attention`).
    check_finite : bool
        Refuse NaN/inf in this rank's inputs.

    Returns
    -------
    out : torch.Tensor
        ``(batch, num_heads, n, head_dim_v)``, dtype of ``query``.
    lse : torch.Tensor
        Only if ``return_lse``: as :func:`plsh_fast.plsh_attention`.

    Raises
    ------
    ValueError
        ``torch.distributed`` not initialised or this process not in ``group``
        (``group``); chunks that overlap or leave a gap, or ``chunk_start`` given on some
        ranks only (``chunk_start``); ranks that disagree on the partition sample
        (``partition``), on the shapes, dtype, ``causal`` or ``scale``; a bin index
        outside int64 for the sequence's positions. All raised on every rank, before any
        point-to-point message.
    TypeError, ValueError
        Bad arguments of this rank as :func:`plsh_fast.plsh_attention` (``seed`` required
        without ``partition``; ``key`` must hold ``n`` positions); raised on this rank,
        while the other ranks raise ``ValueError("group: rank r refused its arguments:
        ...")``.

    Notes
    -----
    Communication per call: one ``all_gather`` of 13 int64 per rank, then point-to-point
    messages carrying exactly the halo (forward), and the same volume of gradients
    (backward). Every rank must run the backward if one does (as with DDP).

    References
    ----------
    ``proofs_notes/halo_bound.md``; Wolfson & Wagner (2026), Theorem 2.2; SPEC sections 2-3.
    """
    rank = _check_initialized(group)
    error = None
    try:
        meta, resolved = _local_meta(
            query,
            key,
            value,
            partition,
            slopes,
            num_samples,
            seed,
            causal,
            scale,
            chunk_start,
            backend,
            check_finite,
        )
    except (TypeError, ValueError) as exc:
        error = exc
        meta = dict.fromkeys(_META, 0)
        meta["error"] = 1
    device = query.device if isinstance(query, torch.Tensor) else torch.device("cpu")
    metas = _gather_meta(meta, device, group)
    if error is not None:
        messages = [None] * len(metas)
        dist.all_gather_object(messages, str(error), group=group)
        raise error
    bad = [r for r, m in enumerate(metas) if m["error"]]
    if bad:
        messages = [None] * len(metas)
        dist.all_gather_object(messages, "", group=group)
        raise ValueError(f"group: rank {bad[0]} refused its arguments: {messages[bad[0]]}")
    _agree(metas)
    sample, c, causal, backend = resolved
    if metas[0]["has_start"]:
        bounds = [(m["chunk_start"], m["chunk_start"] + m["length"]) for m in metas]
    else:
        ends = np.cumsum([0] + [m["length"] for m in metas]).tolist()
        bounds = list(zip(ends[:-1], ends[1:]))
    _check_tiling(bounds, "chunk_start")
    plan = plan_context_parallel(sample, bounds, causal=causal, num_heads_kv=key.shape[1])
    key_ext, value_ext = halo_exchange(key, value, plan, group=group)
    a, b = bounds[rank]
    kpos = torch.from_numpy(plan.key_positions(rank)).to(query.device)
    qpos = torch.arange(a, b, dtype=torch.int64, device=query.device)
    out, lse = plsh_attention(
        query,
        key_ext,
        value_ext,
        partition=sample,
        causal=causal,
        scale=c,
        query_positions=qpos,
        key_positions=kpos,
        return_lse=True,
        backend=backend,
        check_finite=False,
    )
    return (out, lse) if return_lse else out
