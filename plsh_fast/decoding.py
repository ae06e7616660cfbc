"""Causal decoding with a provably bounded KV cache (exact PLSH attention, not an approximation).

A query at position ``p`` attends key ``j`` with weight proportional to the count
``C_pj = #{t : bin_t(j) == bin_t(p)}`` (SPEC section 3). Bins are monotone in the position,
so once every sample's bin of the newest query has moved past a key's bin, no later query
can reach that key again: its count stays 0 for ever. The keys still reachable form a
suffix of the cached positions, at most ``max_t ceil(pitch_t) + 1`` tokens long, a bound
known when the partition is drawn (``proofs_notes/decoding_cache.md``). Evicting the rest
changes nothing: decoding with :class:`PLSHDecodingCache` computes exactly the
full-sequence :func:`plsh_fast.plsh_attention` on the same partition, at a memory cost that
does not grow with the context.

The cache holds one layer's keys and values for every sequence of a batch; sequences may
have different lengths and positions. Each call of :meth:`PLSHDecodingCache.update`
appends new tokens, attends the new queries to the cached keys plus the new ones, and then
evicts the keys no later query can reach.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from numpy.typing import ArrayLike

from plsh_ref.bounds import max_norm_error_bound
from plsh_ref.partition import PartitionSample
from plsh_ref.validation import check_probability, check_scale, warn_deprecated

from . import _padding as padding
from . import _validation as V
from ._partition import bins, count_bias, partition_tensors
from .api import plsh_attention
from .dense import dense_counts, working_dtype

__all__ = [
    "DecodingErrorBound",
    "PLSHDecodingCache",
    "binary64_bound",
    "cache_bound",
    "reachable_keys",
]

#: above this many (new query, cached key) pairs per sequence and head, a call goes
#: through :func:`plsh_fast.plsh_attention` instead of the dense counts form
_DENSE_PAIRS = 1 << 16


def reachable_keys(key_bins: torch.Tensor, reference_bins: torch.Tensor) -> torch.Tensor:
    """The eviction rule of both decoding caches: which keys a query at ``p >= r`` can reach.

    Key ``j`` is kept iff ``bin_t(j) >= bin_t(r)`` in some sample ``t`` of some head, with
    ``r`` the smallest position of any query still to be attended. Every other key has
    ``bin_t(j) < bin_t(r) <= bin_t(p)`` for all ``t`` and every later query ``p >= r``, so its
    count is 0 for ever (``proofs_notes/decoding_cache.md``, Claim 1 and section 4). For keys
    at positions ``j <= r`` the rule is "shares a bin with ``r``" (``==``); for keys after
    ``r`` (new tokens held before their queries are attended) only ``>=`` keeps them:
    ``==`` would drop a new token whose bins all lie past ``r``'s, though its own query
    still reaches it.

    Used by :class:`PLSHDecodingCache` (``r`` = the newest query, after attending), and so
    by :class:`plsh_fast.hf.PLSHCacheLayer`, which holds one per layer.

    Parameters
    ----------
    key_bins : torch.Tensor
        int64 ``(num_heads, num_samples, ..., L)``: the bins of the held keys.
    reference_bins : torch.Tensor
        int64 ``(num_heads, num_samples, ..., 1)``: the bins of ``r`` (one per sequence in
        the ``...`` axes).

    Returns
    -------
    torch.Tensor
        bool ``(..., L)``: True for the keys to keep. Bins are monotone in the position, so
        for increasing key positions the kept keys are a suffix.

    Raises
    ------
    TypeError
        Bins that are not int64 tensors.
    ValueError
        Bins of different ranks, or ones with fewer than 2 dimensions.

    References
    ----------
    ``proofs_notes/decoding_cache.md`` section 4 (one rule for both caches).
    """
    for name, t in (("key_bins", key_bins), ("reference_bins", reference_bins)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int64:
            raise TypeError(
                f"{name}: must be an int64 torch.Tensor, got {getattr(t, 'dtype', type(t))}"
            )
    if key_bins.dim() < 2 or key_bins.dim() != reference_bins.dim():
        raise ValueError(
            f"reference_bins: rank {reference_bins.dim()} differs from key_bins' "
            f"{key_bins.dim()} (both (num_heads, num_samples, ..., L or 1))"
        )
    return (key_bins >= reference_bins).any(dim=1).any(dim=0)


def cache_bound(partition: PartitionSample) -> int:
    """Most keys the decoding cache can ever hold for ``partition``: ``max ceil(pitch) + 1``.

    Parameters
    ----------
    partition : plsh_ref.partition.PartitionSample
        ``pitch`` of shape ``(num_heads, num_samples)``, float64, in tokens.

    Returns
    -------
    int
        ``max_{h,t} ceil(pitch_{h,t}) + 1`` tokens: a bin ``[u + b delta, u + (b+1) delta)``
        holds at most ``ceil(delta)`` integers, and a binary64 bin at most one more while
        ``|p| + delta <= 2**50`` (beyond, see :func:`binary64_bound`;
        ``proofs_notes/decoding_cache.md``). The cache holds the reachable keys of the
        newest query, all in one bin with it in some sample.

    Raises
    ------
    TypeError
        If ``partition`` is not a :class:`~plsh_ref.partition.PartitionSample`.

    References
    ----------
    ``proofs_notes/decoding_cache.md`` (derivation and the law of the bound, which is the
    largest-pitch law of ``proofs_notes/largest_pitch.md``).
    """
    if not isinstance(partition, PartitionSample):
        raise TypeError(f"partition: must be a PartitionSample, got {type(partition).__name__}")
    return int(math.ceil(float(np.max(partition.pitch)))) + 1


def binary64_bound(partition: PartitionSample, max_abs_position: int) -> int:
    """Largest binary64 block, hence cache size, for positions up to ``max_abs_position``.

    A binary64 bin holds at most ``ceil((1 + 2 B) pitch)`` integer positions, with
    ``B = (|p| / pitch + 1) (2**-52 + 2**-106) + 2**-1075`` the rounding bound of the bin
    quotient (``proofs_notes/collision_probability.md``, *Blocks*). While
    ``|p| + pitch <= 2**50`` this is at most :func:`cache_bound`; near ``2**53`` it can
    exceed it.

    Parameters
    ----------
    partition : plsh_ref.partition.PartitionSample
        ``pitch`` ``(num_heads, num_samples)``, float64, in tokens.
    max_abs_position : int
        Largest ``|p|`` of the positions involved (``< 2**53``).

    Returns
    -------
    int
        ``max_{h,t} ceil((1 + 2 B_{h,t}) pitch_{h,t})`` (tokens).

    References
    ----------
    ``proofs_notes/decoding_cache.md`` section 2.
    """
    pitch = np.asarray(partition.pitch, dtype=np.float64)
    rounding = (abs(int(max_abs_position)) / pitch + 1.0) * (2.0**-52 + 2.0**-106) + 2.0**-1075
    return int(np.max(np.ceil((1.0 + 2.0 * rounding) * pitch)))


@dataclass(frozen=True)
class DecodingErrorBound:
    """The a-priori error statement of a decoding cache's attention against exact ALiBi.

    With probability at least ``1 - delta`` over the draw of the cache's partition,
    every count weight ``C_ij / s`` the cache can have used, for any query and key
    positions within the span seen (``num_positions`` integers), is within ``eps`` of
    the ALiBi kernel ``L*_ij = exp(-slope_h |p_i - p_j|)`` in every head (evicted keys
    included: their weight is 0 and ``L*_ij <= eps``); on that event every output row
    decoded so far satisfies, for every head, row and value column,
    ``|T~_ik - T*_ik| <= range_k(V_i) eps sum_j A_ij / sum_j A_ij L*_ij`` (Theorem 2.2,
    :func:`plsh_ref.bounds.output_error_bound` with this ``eps``; ``A_ij`` the softmax
    numerators over all keys up to the row, ``range_k`` over them).

    Attributes
    ----------
    eps : float
        :func:`plsh_ref.bounds.max_norm_error_bound` of ``(num_positions, num_samples,
        delta / num_heads)`` for the partition's sampler (DKW, a union bound over heads).
    delta : float
        Failure probability in ``(0, 1)``.
    num_positions, num_samples, num_heads : int
        The span of integer positions seen (``max - min + 1`` over all sequences, an upper
        bound on the distinct positions), ``s`` and the head count.

    References
    ----------
    Wolfson & Wagner (2026), Theorems 2.1 and 2.2; ``proofs_notes/max_norm_bound.md``,
    ``proofs_notes/output_bound.md``.
    """

    eps: float
    delta: float
    num_positions: int
    num_samples: int
    num_heads: int


class PLSHDecodingCache:
    """Bounded key/value cache for causal PLSH decoding of one attention layer.

    Parameters
    ----------
    partition : plsh_ref.partition.PartitionSample
        The layer's partition sample, ``(num_heads, num_samples)``: the same one the
        full-sequence attention would use.
    scale : float, optional
        Logit scale; default ``1 / sqrt(head_dim)`` of the first call.

    Attributes
    ----------
    bound : int
        :func:`cache_bound` of the partition: no sequence holds more keys than this after a
        call while its positions satisfy ``|p| + pitch <= 2**50``; beyond, binary64 bins
        can be up to :func:`binary64_bound` long (checked on every call; a violation of
        the larger of the two is a ``RuntimeError``).
    ring_steps : int
        Calls taken by the batched decode step (one real token per sequence, positions
        given or not: a ring of ``bound`` columns, one attention call) since construction
        or :meth:`reset`; every other call takes the general path.

    Raises
    ------
    TypeError
        ``partition`` not a :class:`~plsh_ref.partition.PartitionSample`; ``scale`` not a
        real number.
    ValueError
        ``scale`` not finite and > 0.

    Notes
    -----
    Positions must increase strictly along each sequence, across calls: the eviction rule
    relies on later queries having larger positions (``proofs_notes/decoding_cache.md``).
    Each call reads the positions on the host to check this and to evict (one device
    synchronisation on the general path). A decode step on the ring reads nothing from
    the device but the three sums of the finiteness check (none with
    ``check_finite=False``): its positions, bin edges and count bias are planned on the
    host, up to 64 steps per transfer. Memory: ``num_heads_kv * bound * (head_dim +
    head_dim_v)`` elements per sequence, plus on the general path the int64 bins of the
    cached keys (``num_heads * num_samples * bound``), on the ring the int64 positions
    (``bound``, on the host) and the planned run lengths (at most a quarter of the keys
    and values).

    References
    ----------
    SPEC section 3 (PLSH attention as count-weighted softmax);
    ``proofs_notes/decoding_cache.md``.

    Examples
    --------
    >>> import torch
    >>> from plsh_ref import alibi_slopes, draw_partition
    >>> from plsh_fast.decoding import PLSHDecodingCache
    >>> part = draw_partition(1 / alibi_slopes(4), num_samples=16, seed=0)
    >>> cache = PLSHDecodingCache(part)
    >>> q = k = v = torch.randn(1, 4, 64, 32)
    >>> out = cache.update(q, k, v)                     # prefill 64 tokens
    >>> out = cache.update(q[:, :, :1], k[:, :, :1], v[:, :, :1])  # one decode step
    >>> bool((cache.cached_tokens() <= cache.bound).all())
    True
    """

    def __init__(self, partition: PartitionSample, *, scale: float | None = None) -> None:
        self.bound = cache_bound(partition)
        self.partition = partition
        self.scale = None if scale is None else check_scale(scale, 1)
        self._pitch: torch.Tensor | None = None
        self._offset: torch.Tensor | None = None
        self._key: list[torch.Tensor] = []  # per sequence (num_heads_kv, L_b, head_dim)
        self._value: list[torch.Tensor] = []
        self._positions: list[torch.Tensor] = []  # per sequence int64 (L_b,)
        self._bins: list[torch.Tensor] = []  # per sequence int64 (num_heads, s, L_b)
        self._last: list[int | None] = []  # newest query position per sequence
        self._shape: tuple | None = (
            None  # (num_heads, num_heads_kv, head_dim, head_dim_v, dtype, device)
        )
        #: the decode-step buffers (:meth:`_step`), or ``None`` while the per-sequence
        #: tensors above hold the cache
        self._buffers: _StepRing | None = None
        self._general_only = False  # a step the ring cannot take runs the general path
        #: calls taken by the batched decode step (the ring) so far
        self.ring_steps = 0
        self._span: tuple[int, int] | None = None  # smallest and largest position seen

    # ------------------------------------------------------------------ state
    @property
    def batch_size(self) -> int:
        """Number of sequences seen so far (0 before the first call)."""
        return len(self._key)

    def cached_tokens(self) -> torch.Tensor:
        """Keys held per sequence, int64 ``(batch,)`` on the host; each ``<= bound``."""
        if self._buffers is not None:
            return torch.tensor(self._buffers.lengths(), dtype=torch.int64, device="cpu")
        return torch.tensor([p.numel() for p in self._positions], dtype=torch.int64, device="cpu")

    def live_tokens(self) -> torch.Tensor:
        """Keys each query head can still reach, int64 ``(batch, num_heads)`` on the host.

        Key ``j`` is live for head ``h`` iff ``bin_t(j) == bin_t(p)`` in some sample ``t``
        of head ``h``, with ``p`` the newest query position of the sequence. The cache
        keeps the union over heads (a suffix of the positions); this is the per-head view.
        """
        self._unbuffer()
        rows = []
        for b, kb in enumerate(self._bins):
            last = self._last[b]
            if last is None or kb.shape[-1] == 0:
                rows.append(torch.zeros(self.partition.num_heads, dtype=torch.int64, device="cpu"))
                continue
            qb = self._query_bins(torch.tensor([last], dtype=torch.int64, device=kb.device))
            rows.append((kb == qb).any(dim=1).sum(dim=-1).cpu())
        if not rows:
            return torch.zeros((0, self.partition.num_heads), dtype=torch.int64, device="cpu")
        return torch.stack(rows)

    def cached_positions(self, sequence: int) -> torch.Tensor:
        """int64 ``(L,)`` positions of the keys held for ``sequence``, increasing."""
        self._unbuffer()
        return self._positions[self._sequence(sequence)]

    def key_bins(self, sequence: int) -> torch.Tensor:
        """int64 ``(num_heads, num_samples, L)`` bins of the held keys of ``sequence``.

        Equal bit for bit to :func:`plsh_ref.partition.bins` of :meth:`cached_positions`.
        """
        self._unbuffer()
        return self._bins[self._sequence(sequence)]

    def last_positions(self) -> torch.Tensor:
        """int64 ``(batch,)``: the newest position of each sequence, on the host.

        ``-1`` for a sequence without any real token yet (its first token then gets
        position 0 by default, as transformers numbers real tokens).
        """
        if self._buffers is not None:
            return torch.from_numpy(self._buffers.last.copy())
        return torch.tensor(
            [-1 if p is None else p for p in self._last], dtype=torch.int64, device="cpu"
        )

    def select(self, indices: ArrayLike | torch.Tensor) -> None:
        """Keep the sequences ``indices``, in that order (beam search's reorder).

        Sequence ``i`` of the cache becomes the old sequence ``indices[i]`` (repeats
        allowed); the partition, scale and span of positions seen are kept.

        Parameters
        ----------
        indices : torch.Tensor or array_like of int
            ``(new_batch,)`` indices into the sequences held now.

        Raises
        ------
        TypeError
            Non-integer indices.
        ValueError
            Indices not 1-D, or outside ``[0, batch)``.
        """
        idx = np.asarray(indices.cpu() if isinstance(indices, torch.Tensor) else indices)
        if idx.size == 0 and not isinstance(indices, torch.Tensor):
            idx = idx.astype(np.int64)  # an empty list keeps no sequence (np.asarray: float64)
        if idx.dtype == np.bool_ or not np.issubdtype(idx.dtype, np.integer):
            raise TypeError(f"indices: must be integers, got dtype {idx.dtype}")
        if idx.ndim != 1:
            raise ValueError(f"indices: must be 1-D, got shape {idx.shape}")
        if idx.size and not (0 <= int(idx.min()) and int(idx.max()) < self.batch_size):
            raise ValueError(f"indices: must lie in [0, {self.batch_size}), got {idx.tolist()}")
        self._unbuffer()
        order = [int(i) for i in idx]
        # the per-sequence tensors are never written in place: repeats may share them
        for name in ("_key", "_value", "_positions", "_bins", "_last"):
            held = getattr(self, name)
            setattr(self, name, [held[i] for i in order])

    def _sequence(self, sequence) -> int:
        if isinstance(sequence, bool) or not isinstance(sequence, (int, np.integer)):
            raise TypeError(f"sequence: must be an int, got {type(sequence).__name__}")
        if not 0 <= int(sequence) < self.batch_size:
            raise ValueError(f"sequence: must be in [0, {self.batch_size}), got {sequence}")
        return int(sequence)

    def memory_bytes(self) -> int:
        """Bytes held by the cached keys, values, positions and bins, all sequences (while
        decoding one token per call: the ring's ``capacity = bound`` columns of keys,
        values and host positions, and its planned count-bias run lengths; it holds no
        bins)."""
        if self._buffers is not None:
            return self._buffers.nbytes()
        tensors = self._key + self._value + self._positions + self._bins
        return int(sum(t.numel() * t.element_size() for t in tensors))

    def error_bound(self, delta: float = 0.05) -> DecodingErrorBound:
        """The a-priori bound on this layer's output error against exact ALiBi attention,
        for the positions decoded so far (:class:`DecodingErrorBound`).

        Computed from the partition and the span of positions only (no Q/K/V, no device
        work), so it can be read after every step; it grows like ``sqrt(log n)``.

        Parameters
        ----------
        delta : float
            Failure probability in ``(0, 1)`` (over the partition's draw).

        Returns
        -------
        DecodingErrorBound

        Raises
        ------
        ValueError, TypeError
            ``delta`` outside ``(0, 1)``; a call before any token was decoded.

        References
        ----------
        :func:`plsh_ref.bounds.max_norm_error_bound`, :func:`plsh_ref.bounds.output_error_bound`.
        """
        delta = check_probability("delta", delta)
        span = self._seen()
        if span is None:
            raise ValueError("delta: no positions decoded yet (call update first)")
        n = span[1] - span[0] + 1
        heads, s = self.partition.num_heads, self.partition.num_samples
        eps = max_norm_error_bound(n, s, delta / heads, sampler=self.partition.sampler)
        return DecodingErrorBound(eps, delta, n, s, heads)

    def reset(self) -> None:
        """Forget every sequence (the partition and scale are kept)."""
        self._key, self._value, self._positions, self._bins, self._last = [], [], [], [], []
        self._shape = None
        self._buffers = None
        self._span = None
        self.ring_steps = 0

    # ------------------------------------------------------------------ helpers
    def _query_bins(self, positions: torch.Tensor) -> torch.Tensor:
        assert self._pitch is not None and self._offset is not None  # set by the first call
        return bins(self._pitch, self._offset, positions)

    def _check_call(
        self, query, key, value, positions, attention_mask, partition
    ) -> tuple[int, int, tuple, torch.Tensor | None, torch.Tensor | None]:
        V.check_qkv(query, key, value)  # types, ranks, dtypes, devices, head counts
        if partition is not None and partition != self.partition:
            raise ValueError(
                "partition: differs from the partition this cache was built with "
                "(a cache serves one layer's partition only)"
            )
        batch, num_heads, m, head_dim = query.shape
        if num_heads != self.partition.num_heads:
            raise ValueError(
                f"query: {num_heads} heads, the partition has {self.partition.num_heads}"
            )
        if key.shape[2] != m:
            raise ValueError(
                f"key: holds {key.shape[2]} new tokens, query {m} (one key per new token)"
            )
        shape = (num_heads, key.shape[1], head_dim, value.shape[3], query.dtype, query.device)
        if self._shape is not None:
            fields = (
                ("query", "num_heads"),
                ("key", "num_key_value_heads"),
                ("query", "head_dim"),
                ("value", "head_dim"),
                ("query", "dtype"),
                ("query", "device"),
            )
            for (argument, field), got, kept in zip(fields, shape, self._shape):
                if got != kept:
                    raise ValueError(
                        f"{argument}: {field} {got} differs from the cache's {kept} "
                        "(set by its first call)"
                    )
            if batch != self.batch_size:
                raise ValueError(
                    f"query: batch {batch}, the cache holds {self.batch_size} sequences"
                )
        mask = padding.check_attention_mask(attention_mask, batch, m, torch.device("cpu"))
        if mask is not None and mask.dtype != torch.bool:
            if bool(((mask != 0) & (mask != 1)).any()):
                raise ValueError("attention_mask: integer masks must hold only 0 and 1")
            mask = mask.bool()
        positions = padding.check_positions(
            "query_positions", positions, batch, m, torch.device("cpu")
        )
        if positions is not None:
            padding.check_position_range("query_positions", positions)
            positions = positions.expand(batch, m)
        return batch, m, shape, mask, positions

    # ------------------------------------------------------------------ the call
    def update(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *args: Any,
        query_positions: ArrayLike | torch.Tensor | None = None,
        key_positions: ArrayLike | torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        return_lse: bool = False,
        check_finite: bool = True,
        positions: ArrayLike | torch.Tensor | None = None,
        partition: PartitionSample | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Append ``m`` new tokens, attend their queries causally, evict unreachable keys.

        Parameters
        ----------
        query : torch.Tensor
            ``(batch, num_heads, m, head_dim)``, float16/bfloat16/float32/float64: the new
            tokens' queries (``m >= 1``; a long prompt on the first call is the prefill).
        key, value : torch.Tensor
            ``(batch, num_heads_kv, m, head_dim)`` and ``(batch, num_heads_kv, m, head_dim_v)``.
        query_positions, key_positions : torch.Tensor or array_like of int, optional
            ``(m,)`` or ``(batch, m)`` absolute positions of the new tokens (their queries
            and keys are the same tokens: give either, or both equal); strictly
            increasing along each sequence, across calls. Default: continue each sequence
            from its newest position + 1 (``0..m-1`` on the first call; with an
            ``attention_mask``, real tokens are numbered ``0, 1, ...`` as HF's
            ``position_ids`` for left padding).
        attention_mask : torch.Tensor, optional
            ``(batch, m)`` bool or 0/1 integers, 1 = real token, 0 = pad (HF convention):
            pad tokens are neither cached nor attended, their output rows are 0 (LSE
            ``-inf``).
        positions, partition
            Deprecated (one release, DeprecationWarning): ``positions`` (also positional) is
            ``query_positions``; the partition is the constructor's only (an ``update``
            ``partition`` must equal it).
        return_lse : bool
            Also return the LSE ``(batch, num_heads, m)`` (float32, float64 for float64).
        check_finite : bool
            Refuse NaN/inf in ``query``, ``key``, ``value`` (default, as
            :func:`plsh_fast.plsh_attention`; one read of the new tokens). With it off the
            results for such inputs are unspecified (a NaN key or value can reach rows that
            cannot attend to it, as there), and a bad token stays in the cache while live.

        Returns
        -------
        out : torch.Tensor
            ``(batch, num_heads, m, head_dim_v)``, dtype of ``query``: equal to the rows of
            the full-sequence :func:`plsh_fast.plsh_attention` (``causal=True``, same
            partition) at these positions.
        lse : torch.Tensor
            Only if ``return_lse``.

        Raises
        ------
        TypeError
            Non-tensor inputs, mixed or non-floating dtypes, a non-integer mask or positions,
            a non-bool ``return_lse`` or ``check_finite``.
        ValueError
            Wrong ranks or shapes, head counts that do not divide, a batch size, head count,
            head_dim, dtype or device other than the cache's, a ``partition`` other than the
            cache's, positions that do not increase strictly along a sequence (a decode step
            out of order), ``|p| >= 2**53``, NaN/inf inputs when ``check_finite``,
            ``query_positions`` and ``key_positions`` that differ. A refused call leaves the
            cache unchanged.

        References
        ----------
        ``proofs_notes/decoding_cache.md``; SPEC section 3.
        """
        ring = self._buffers
        if (  # a decode step like the ones before: the checks reduce to comparisons
            ring is not None
            and not args
            and positions is None
            and partition is None
            and key_positions is None
            and (attention_mask is None or ring.all_real(attention_mask))
            and type(return_lse) is bool
            and type(check_finite) is bool
            and ring.accepts(query, key, value)
        ):
            pos = self._step_positions(ring, query_positions)
            if pos is not False:
                if check_finite and not _sum_is_finite(query, key, value):
                    V.check_finite(query, key, value)  # names the argument (or passes)
                return self._step(query, key, value, pos, return_lse)
        positions = self._deprecated_positions(args, positions, query_positions, key_positions)
        for flag, value_ in (("return_lse", return_lse), ("check_finite", check_finite)):
            if not isinstance(value_, bool):
                raise TypeError(f"{flag}: must be a bool, got {type(value_).__name__}")
        if partition is not None:
            warn_deprecated(
                "PLSHDecodingCache.update(partition=...)",
                "the constructor's partition only (PLSHDecodingCache(partition))",
            )
        batch, m, shape, mask, checked = self._check_call(
            query, key, value, positions, attention_mask, partition
        )
        if check_finite and not (m == 1 and _sum_is_finite(query, key, value)):
            V.check_finite(query, key, value)  # names the argument (or passes: overflow)
        scale = check_scale(None, shape[2]) if self.scale is None else self.scale
        if self._can_step(m, mask):
            pos = None if checked is None else checked[:, 0].numpy().astype(np.int64)
            return self._step(query, key, value, pos, return_lse)
        self._unbuffer()  # the general path below works on per-sequence tensors
        new_pos = self._new_positions(batch, m, mask, checked)  # checks order, no change yet
        for _, pos in new_pos:
            if pos.numel():
                self._see(int(pos[0]), int(pos[-1]))
        if self._shape is None:
            self._start(shape, batch, key, value)
        out = query.new_zeros((batch, shape[0], m, shape[3]))
        lse_dtype = working_dtype(query.dtype)
        lse = torch.full((batch, shape[0], m), -math.inf, dtype=lse_dtype, device=query.device)
        for b, (keep, pos) in enumerate(new_pos):
            if pos.numel() == 0:
                continue
            idx = keep.nonzero().flatten().to(query.device)
            o_b, l_b = self._append_and_attend(b, query, key, value, idx, pos, scale)
            out[b].index_copy_(1, idx, o_b.to(out.dtype))
            lse[b].index_copy_(1, idx, l_b.to(lse_dtype))
            self._evict(b)
        return (out, lse) if return_lse else out

    # ------------------------------------------------------------- its steps
    @staticmethod
    def _deprecated_positions(args, positions, query_positions, key_positions):
        """The new tokens' positions from ``query_positions``/``key_positions`` (or old spellings)."""
        if len(args) > 1:
            raise TypeError(f"update: takes 3 positional arguments after self, got {3 + len(args)}")
        if args:
            warn_deprecated(
                "PLSHDecodingCache.update(query, key, value, positions)",
                "update(query, key, value, query_positions=...)",
                stacklevel=4,
            )
            positions = args[0]
        elif positions is not None:
            warn_deprecated(
                "PLSHDecodingCache.update(positions=...)",
                "update(query_positions=...)",
                stacklevel=4,
            )
        given = [p for p in (positions, query_positions, key_positions) if p is not None]
        if len(given) > 1 and not all(
            np.array_equal(np.asarray(given[0]), np.asarray(g)) for g in given[1:]
        ):
            raise ValueError(
                "key_positions: must equal query_positions (the new queries and keys are the "
                "same tokens)"
            )
        return given[0] if given else None

    def _new_positions(self, batch: int, m: int, mask, positions) -> list:
        """``[(keep, positions)]`` of the new real tokens per sequence, on the host.

        Checks that they increase strictly along each sequence and follow the cached ones
        (before the cache changes: a refused call leaves it as it was).
        """
        last = self._last if self._shape is not None else [None] * batch
        new_pos = []
        for b in range(batch):
            keep = torch.ones(m, dtype=torch.bool, device="cpu") if mask is None else mask[b]
            last_b = last[b]
            if positions is not None:
                pos = positions[b][keep]
            else:
                start = 0 if last_b is None else last_b + 1
                pos = start + torch.arange(int(keep.sum()), dtype=torch.int64, device="cpu")
            if pos.numel() > 1 and bool((pos[1:] <= pos[:-1]).any()):
                raise ValueError(f"query_positions: must increase strictly along sequence {b}")
            if pos.numel() and last_b is not None and int(pos[0]) <= last_b:
                raise ValueError(
                    f"query_positions: decode step out of order for sequence {b}: position "
                    f"{int(pos[0])} after {last[b]}"
                )
            new_pos.append((keep, pos))
        return new_pos

    def _start(self, shape: tuple, batch: int, key, value) -> None:
        """Empty per-sequence state on the first call (the partition moves to the device)."""
        device = key.device
        self._shape = shape
        self._pitch, self._offset = partition_tensors(self.partition, device)
        self._key = [key.new_zeros((shape[1], 0, shape[2])) for _ in range(batch)]
        self._value = [value.new_zeros((shape[1], 0, shape[3])) for _ in range(batch)]
        self._positions = [torch.zeros(0, dtype=torch.int64, device=device) for _ in range(batch)]
        self._bins = [
            torch.zeros((shape[0], self.partition.num_samples, 0), dtype=torch.int64, device=device)
            for _ in range(batch)
        ]
        self._last = [None] * batch

    def _append_and_attend(self, b: int, query, key, value, idx, pos, scale):
        """Attend sequence ``b``'s new real queries to its held keys plus the new ones.

        The new tokens are appended once the attention has succeeded.
        """
        pos_d = pos.to(query.device)
        new_bins = self._query_bins(pos_d)
        k_all = torch.cat([self._key[b], key[b].index_select(1, idx)], dim=1)
        v_all = torch.cat([self._value[b], value[b].index_select(1, idx)], dim=1)
        p_all = torch.cat([self._positions[b], pos_d])
        b_all = torch.cat([self._bins[b], new_bins], dim=-1)
        q_b = query[b].index_select(1, idx)
        out = self._attend(q_b, k_all, v_all, pos_d, p_all, new_bins, b_all, scale)
        self._key[b], self._value[b], self._positions[b], self._bins[b] = k_all, v_all, p_all, b_all
        self._last[b] = int(pos[-1])
        return out

    def _evict(self, b: int) -> None:
        """Drop sequence ``b``'s keys no later query can reach; check the bound.

        The reference is the newest query (all later ones come after it):
        :func:`reachable_keys`.
        """
        kb = self._bins[b]
        live = reachable_keys(kb, kb[..., -1:])
        first = int(live.numel() - int(live.sum()))
        if not bool(live[first:].all()):  # bins are monotone: the live keys are a suffix
            raise RuntimeError(
                "decoding cache: live keys are not a suffix (positions out of order?)"
            )
        self._key[b] = self._key[b][:, first:]
        self._value[b] = self._value[b][:, first:]
        self._positions[b] = self._positions[b][first:]
        self._bins[b] = kb[..., first:]
        held = self._positions[b].numel()
        if held > self.bound:
            allowed = max(self.bound, binary64_bound(self.partition, cast(int, self._last[b])))
            if held > allowed:
                raise RuntimeError(
                    f"decoding cache: {held} keys exceed the bound {allowed} "
                    "(proofs_notes/decoding_cache.md); please report this"
                )

    # ------------------------------------------------------------- one decode step
    def _can_step(self, m: int, mask) -> bool:
        """Whether the call is a plain decode step: one real token per sequence, every
        sequence already holding keys (then :meth:`_step` runs, batched)."""
        if m != 1 or self._shape is None or self.batch_size == 0 or self._general_only:
            return False
        if self._buffers is None and any(last is None for last in self._last):
            return False
        return mask is None or bool(mask.all())

    def _see(self, low: int, high: int) -> None:
        """Widen the span of positions seen (for :meth:`error_bound`)."""
        if self._span is None:
            self._span = (low, high)
        else:
            self._span = (min(self._span[0], low), max(self._span[1], high))

    def _seen(self) -> tuple[int, int] | None:
        """The smallest and largest position seen. The ring's steps only raise the
        largest (a step's positions follow each sequence's newest), read from the ring."""
        span, ring = self._span, self._buffers
        if ring is not None and span is not None:
            span = (span[0], max(span[1], int(ring.last.max())))
        return span

    def _unbuffer(self) -> None:
        """Move the cache back into per-sequence tensors (the general path's form)."""
        if self._buffers is not None:
            self._span = self._seen()
            self._buffers.write_back(self)
            self._buffers = None

    def _step_positions(self, ring: _StepRing, query_positions):
        """The explicit positions of a decode step as int64 ``(batch,)`` on the host,
        ``None`` for the default ones, or ``False`` when they are not a plain int64 CPU
        tensor of an accepted shape within ``|p| < 2**53`` (the caller then runs every
        check of :meth:`_check_call`)."""
        if query_positions is None:
            return None
        if (
            not isinstance(query_positions, torch.Tensor)
            or query_positions.dtype is not torch.int64
            or query_positions.device.type != "cpu"
            or query_positions.shape not in ring.position_shapes
        ):
            return False
        pos = query_positions.numpy().reshape(-1)
        if not (-padding.MAX_ABS_POSITION < pos.min() and pos.max() < padding.MAX_ABS_POSITION):
            return False
        return np.broadcast_to(pos, ring.last.shape) if pos.size == 1 else pos

    def _step(self, query, key, value, pos: np.ndarray | None, return_lse: bool):
        """One decode step of every sequence, batched: no per-sequence loop, no host
        synchronisation, no allocation beyond the step's bias and logits
        (:class:`_StepRing`). ``pos``: int64 ``(batch,)`` explicit positions on the host,
        or ``None`` (each sequence's next).

        The same function as the general path. Falls back to it when the ring cannot take
        the step exactly (a block edge out of the checked range, or no dead column: only
        possible where ``|p| + pitch > 2**50``, ``proofs_notes/decoding_cache.md``).
        """
        if self._buffers is None:
            self._buffers = _StepRing(self)
        ring = self._buffers
        if pos is not None:
            behind = pos <= ring.last
            if behind.any():
                b = int(behind.nonzero()[0][0])
                raise ValueError(
                    f"query_positions: decode step out of order for sequence {b}: position "
                    f"{int(pos[b])} after {int(ring.last[b])}"
                )
            # explicit positions that continue every sequence by one (generate()'s
            # position_ids) take the planned run of consecutive steps, as no positions do
            if (pos == ring.last + 1).all():
                pos = None
        if not ring.plan(pos):  # not exactly representable by the ring: the general path
            given = ring.last + 1 if pos is None else pos
            self._unbuffer()
            self._general_only = True
            try:
                return self.update(
                    query, key, value, query_positions=torch.from_numpy(given.copy())[:, None],
                    return_lse=return_lse, check_finite=False,
                )  # fmt: skip
            finally:
                self._general_only = False
        self.ring_steps += 1
        scale = ring.default_scale if self.scale is None else self.scale
        return ring.attend(query, key, value, scale, return_lse)

    def _attend(self, q, k, v, qpos, kpos, qbins, kbins, scale):
        """One sequence: new queries ``(H, m, d)`` against keys ``(H_kv, L, d)``."""
        num_heads, m = q.shape[0], q.shape[1]
        length = k.shape[1]
        if m * length > _DENSE_PAIRS:
            o, l_ = plsh_attention(
                q[None],
                k[None],
                v[None],
                partition=self.partition,
                causal=True,
                scale=scale,
                query_positions=qpos,
                key_positions=kpos,
                return_lse=True,
                check_finite=False,
            )
            return o[0], l_[0]
        num_heads_kv = k.shape[0]
        group = num_heads // num_heads_kv
        work = working_dtype(q.dtype)
        kx, vx = k.to(work), v.to(work)  # no copy when already in the working dtype
        counts = dense_counts(qbins, kbins, qpos, kpos, causal=True)  # (H, m, L)
        log_w = count_bias(counts, self.partition.num_samples, dtype=work)
        # grouped-query heads share their kv head: (H_kv, group * m, d) against (H_kv, L, d)
        qg = q.to(work).reshape(num_heads_kv, group * m, -1)
        logits = torch.baddbmm(
            log_w.view(num_heads_kv, group * m, length), qg, kx.transpose(-1, -2), alpha=scale
        )
        lse = torch.logsumexp(logits, dim=-1)
        empty = torch.isneginf(lse)
        logits.sub_(torch.where(empty, 0.0, lse)[..., None]).exp_()
        out = torch.bmm(logits, vx).masked_fill_(empty[..., None], 0.0)
        return out.view(num_heads, m, -1), lse.view(num_heads, m)


def _sum_is_finite(query, key, value) -> bool:
    """A decode step's finiteness check, one reduction per tensor: a NaN or inf anywhere
    makes a sum non-finite (finite sums prove every element finite); a non-finite sum
    (also one that merely overflowed) sends the caller to the element-wise check."""
    return math.isfinite(float(query.sum()) + float(key.sum()) + float(value.sum()))


class _StepRing:
    """The decode-step form of :class:`PLSHDecodingCache`: a ring of ``capacity`` columns.

    Keys ``(B, H_kv, capacity, d)`` and values on the device, their positions ``(B,
    capacity)`` on the host. Attention does not depend on the order of the keys, so the
    columns are a FIFO ring: a step writes its new token into column ``head`` (for every
    sequence the oldest held key, or an unused column), advances ``head`` and attends all
    ``capacity`` columns. No bins are stored: key ``j`` shares the bin of sample ``t``
    with the newest query ``p`` (both ``<= p``) iff ``p_j >= L_t``, the first integer
    position of ``p``'s bin, so the count of a key is ``#{t : p_j >= L_t}``; ``L`` is found
    exactly on the host from the binary64 bins (:meth:`_edges`, :meth:`_consecutive`). A
    key is dead iff ``p_j < min L``; the oldest key is dead whenever any is, and unused
    columns hold a position below every ``L`` (count 0). ``capacity`` is the cache bound:
    memory does not grow, and the overwritten key is always dead within ``|p| + pitch <=
    2**50`` (else the step goes to the general path). After a step exactly the keys the
    general path holds are live.

    The count bias of a step is built without reading any position on the device. Taken
    oldest first, the positions of the columns increase, so along that order the count
    of head ``h`` is a staircase: ``k``-th oldest column has count ``#{t : e_t <= k}``, with
    ``e_t`` the number of columns below ``L_t``. The bias row is then ``log(c / s)`` for
    ``c = 0..s`` repeated ``e_(c+1) - e_(c)`` times (``e`` sorted, ``e_(0) = 0``,
    ``e_(s+1) = capacity``), turned from oldest-first into column order (one split at
    the ring's head): one :func:`torch.repeat_interleave` per step. The run lengths of up
    to ``_BLOCK`` steps are computed on the host at once (:meth:`_block_of`) and moved to
    the device in one transfer.
    """

    _UNUSED = -(2**62)  # position of an unused column: below every L
    _BLOCK = 64  # steps planned at once (:meth:`_block_of`)

    def __init__(self, cache) -> None:
        lengths = [p.numel() for p in cache._positions]
        capacity = max(cache.bound, max(lengths))
        batch, num_heads = len(lengths), cache._shape[0]
        k0, v0 = cache._key[0], cache._value[0]
        self.key = k0.new_zeros((batch, k0.shape[0], capacity, k0.shape[2]))
        self.value = v0.new_zeros((batch, v0.shape[0], capacity, v0.shape[2]))
        self.host_positions = np.full((batch, capacity), self._UNUSED, dtype=np.int64)
        # each sequence's keys in its last columns, oldest first: the FIFO starts at 0
        for b, n in enumerate(lengths):
            self.key[b, :, capacity - n :] = cache._key[b]
            self.value[b, :, capacity - n :] = cache._value[b]
            self.host_positions[b, capacity - n :] = cache._positions[b].cpu().numpy()
        self.head = 0
        self.last = np.array(cache._last, dtype=np.int64)
        self.pitch = np.asarray(cache.partition.pitch, dtype=np.float64)
        self.offset = np.asarray(cache.partition.offset, dtype=np.float64)
        num_samples = cache.partition.num_samples
        # oldest live position per sequence (every held key is live after a call)
        self.first = np.array([int(p[0]) for p in cache._positions], dtype=np.int64)
        self.edges = self._edges(self.last)  # L of the newest queries, or None
        self.last_bins = self._bins(self.last)
        self._block: _Block | None = None  # the planned steps (:meth:`_block_of`)
        work = working_dtype(k0.dtype)
        levels = count_bias(torch.arange(num_samples + 1, device=k0.device), num_samples, work)
        # repeat_interleave's values: per (sequence, head) row the levels twice (the
        # columns from the head on, then those before it)
        self.levels = levels.repeat(2 * batch * num_heads)
        self.group = num_heads // k0.shape[0]
        self.bias_shape = (batch, k0.shape[0], self.group, capacity)
        self.bias_numel = batch * num_heads * capacity
        # the run lengths of a block never take more than a quarter of the keys and values
        per_step = 2 * batch * num_heads * (num_samples + 1) * 8
        ring_bytes = self.key.numel() * self.key.element_size() * (1 + v0.shape[2] / k0.shape[2])
        self.block_size = max(1, min(self._BLOCK, capacity, int(ring_bytes / 4 // per_step)))
        # the exact shapes a decode step's tensors have (a call with these was checked)
        self.step_shapes = (
            (batch, num_heads, 1, k0.shape[2]),
            (batch, k0.shape[0], 1, k0.shape[2]),
            (batch, v0.shape[0], 1, v0.shape[2]),
        )
        self.dtype, self.device = cache._shape[4], cache._shape[5]
        #: one-element column indices for index_copy_ (made once, not per step)
        self.column_index = list(torch.arange(capacity, device=k0.device)[:, None].unbind(0))
        #: shapes of explicit step positions: shared, per sequence, shared as a row
        self.position_shapes = ((1,), (batch, 1), (1, 1))
        self.mask_shape = (batch, 1)
        self.default_scale = check_scale(None, k0.shape[2])

    def accepts(self, query, key, value) -> bool:
        """Whether ``query, key, value`` are a decode step of this ring: tensors of the
        shapes, dtype, device and layout of the calls already checked (then every check of
        :meth:`PLSHDecodingCache._check_call` passes; otherwise the caller runs them)."""
        qs, ks, vs = self.step_shapes
        dtype, device = self.dtype, self.device
        return (
            isinstance(query, torch.Tensor)
            and isinstance(key, torch.Tensor)
            and isinstance(value, torch.Tensor)
            and query.shape == qs
            and key.shape == ks
            and value.shape == vs
            and query.dtype is dtype
            and key.dtype is dtype
            and value.dtype is dtype
            and query.layout is torch.strided
            and key.layout is torch.strided
            and value.layout is torch.strided
            and query.device == device
            and key.device == device
            and value.device == device
        )

    def all_real(self, attention_mask) -> bool:
        """Whether ``attention_mask`` is a bool CPU tensor ``(batch, 1)`` of real tokens only
        (as :class:`plsh_fast.hf.PLSHCache` passes on a decode step): then the step is the
        one without a mask. Anything else gets the general checks."""
        return (
            isinstance(attention_mask, torch.Tensor)
            and attention_mask.dtype is torch.bool
            and attention_mask.device.type == "cpu"
            and attention_mask.shape == self.mask_shape
            and bool(attention_mask.all())
        )

    def _bins(self, pos: np.ndarray) -> np.ndarray:
        """Bins ``(..., H, s)`` of positions ``(...)``, binary64 (SPEC section 2; as
        float64 integers): ``floor((float64(p) - offset) / pitch)``."""
        return np.floor((pos.astype(np.float64)[..., None, None] - self.offset) / self.pitch)

    def _edges(self, pos: np.ndarray):
        """``L`` ``(B, H, s)`` int64: the first integer position of each position's bin,
        or ``None`` if the checked candidates do not bracket it.

        The candidates ``x0 - 2 .. x0 + 2`` around ``x0 = floor(offset + bin * pitch)`` are
        binned exactly; bins are monotone in the position, so ``L`` is the first candidate
        whose bin is at least the position's, provided the first candidate's bin is below
        it and the last's is not (checked: otherwise ``None``). Within ``|p| + pitch <=
        2**50`` the rounding of ``x0`` is below one position, so this always holds.
        """
        b = self._bins(pos)
        x0 = np.floor(self.offset + b * self.pitch).astype(np.int64)
        cand = x0[..., None] + np.arange(-2, 3)
        cb = np.floor((cand.astype(np.float64) - self.offset[..., None]) / self.pitch[..., None])
        ok = cb >= b[..., None]  # monotone in the candidate: False..., True...
        if ok[..., 0].any() or not ok[..., -1].all():
            return None
        return x0 - 2 + ok.argmax(axis=-1)

    def plan(self, pos: np.ndarray | None) -> bool:
        """Make the next step ready: ``True``, or ``False`` if the ring cannot take it
        exactly (then the general path runs it; the ring is unchanged).

        ``pos`` ``None``: the next position of every sequence (``p + 1``), from the planned
        block of consecutive steps (:meth:`_consecutive`, a new block when it is used up).
        Otherwise explicit positions, and ``p + 1`` when the edges of ``p`` are not known: a
        block of that one step, its edges found by :meth:`_edges`.
        """
        block = self._block
        if pos is None:
            if block is not None and block.next < block.size:
                return True
            if self.edges is not None:
                self._block = self._consecutive()
                return self._block is not None
            pos = self.last + 1
        self._block = None
        edges = self._edges(pos)
        if edges is None:
            return False
        self._block = self._block_of(pos[None], edges[None], self._bins(pos)[None])
        return self._block is not None

    def _consecutive(self):
        """The block of the next ``block_size`` consecutive steps ``p + 1, p + 2, ...``.

        Along them each ``L`` follows from the previous one: unchanged where the bin is
        unchanged, else the new position itself (its bin is then above the previous
        position's, so no integer before it shares it); a running maximum over the block.
        """
        size = self.block_size
        pos = self.last[None, :] + 1 + np.arange(size)[:, None]  # (K, B)
        new_bins = self._bins(pos)  # (K, B, H, s)
        previous = np.concatenate([self.last_bins[None], new_bins[:-1]])
        moved = new_bins != previous
        edges = np.where(moved, pos[..., None, None], np.iinfo(np.int64).min)
        edges[0] = np.where(moved[0], edges[0], self.edges)
        for i in range(1, size):  # the running maximum (np.maximum.accumulate along the
            np.maximum(edges[i - 1], edges[i], out=edges[i])  # first axis is 10x slower)
        return self._block_of(pos, edges, new_bins)

    def _block_of(self, pos: np.ndarray, edges: np.ndarray, new_bins: np.ndarray):
        """The :class:`_Block` of steps at positions ``pos`` ``(K, B)`` (consecutive when
        ``K > 1``) with edges ``L`` ``(K, B, H, s)``, cut before the first step that would
        overwrite a live key (``None`` if that is the first).

        The run lengths of step ``i``: the columns oldest first are the ring's old ones
        after the ``i + 1`` overwritten, then the new positions ``pos[0..i]``; ``e_t``, the
        number of them below ``L_t``, is ``max(0, #{old < L_t} - (i + 1)) + clip(L_t -
        pos[0], 0, i + 1)``. Column order starts at the oldest column ``r = head + i + 1``
        (mod capacity), so columns ``0..r-1`` hold the oldest-first indices ``[capacity - r,
        capacity)`` and columns ``r..capacity-1`` the indices ``[0, capacity - r)``: the
        runs clipped to the first range, then to the second.
        """
        capacity = self.key.shape[2]
        size, batch = pos.shape
        first = edges.reshape(size, batch, -1).min(axis=2)  # (K, B)
        columns = (self.head + np.arange(size)) % capacity
        dead = (self.host_positions[:, columns].T < first).all(axis=1)  # (K,)
        if not dead.all():
            size = int(np.argmin(dead))  # steps before the first one that cannot run
            if size == 0:
                return None
            pos, edges, new_bins, first = pos[:size], edges[:size], new_bins[:size], first[:size]
        old = self.host_positions[:, (self.head + np.arange(capacity)) % capacity]
        below = np.empty(edges.shape[1:], dtype=np.int64)  # #{old < L} of the first step
        for b in range(batch):  # oldest first, each sequence's positions increase
            below[b] = np.searchsorted(old[b], edges[0, b], side="left")
        # a later step's L is the first step's or a position of the block, above every
        # old one (a run of consecutive steps moves L only to its own positions)
        below = np.where(edges == edges[:1], below, capacity)
        steps = np.arange(1, size + 1)[:, None, None, None]
        e = np.maximum(below - steps, 0) + np.clip(edges - pos[:1, :, None, None], 0, steps)
        e.sort(axis=-1)
        zero = np.zeros(e.shape[:-1] + (1,), dtype=np.int64)
        bounds = np.concatenate([zero, e, zero + capacity], axis=-1)  # (K, B, H, s + 2)
        low, high = bounds[..., :-1], bounds[..., 1:]
        split = capacity - (self.head + steps) % capacity
        tail = np.maximum(high - np.maximum(low, split), 0)  # columns 0..r-1
        front = np.maximum(np.minimum(high, split) - low, 0)  # columns r..capacity-1
        repeats = np.concatenate([tail, front], axis=-1).reshape(size, -1)
        repeats_t = torch.from_numpy(repeats).to(self.key.device)
        return _Block(pos, first, edges, new_bins, repeats_t)

    def attend(self, query, key, value, scale: float, return_lse: bool):
        """Take the planned step: write the new tokens, attend every column (no host reads)."""
        block = cast(_Block, self._block)
        i = block.next
        block.next = i + 1
        col = self.head
        index = self.column_index[col]
        self.key.index_copy_(2, index, key)
        self.value.index_copy_(2, index, value)
        pos = block.pos[i]
        self.host_positions[:, col] = pos
        self.last, self.first, self.edges = pos, block.first[i], block.edges[i]
        self.last_bins = block.bins[i]
        self.head = (col + 1) % self.key.shape[2]
        bias = torch.repeat_interleave(
            self.levels, block.repeats[i], output_size=self.bias_numel
        ).view(self.bias_shape)
        batch, num_heads_kv = self.bias_shape[:2]
        # grouped-query heads share their kv head: the group is SDPA's query axis
        q = query if self.group == 1 else query.reshape(batch, num_heads_kv, self.group, -1)
        k, v = self.key, self.value
        work = self.levels.dtype
        if k.dtype != work:  # float16/bfloat16 inputs compute in float32
            q, k, v = q.to(work), k.to(work), v.to(work)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
        if self.group != 1:
            out = out.reshape(query.shape[0], query.shape[1], 1, -1)
        if out.dtype != query.dtype:
            out = out.to(query.dtype)
        if not return_lse:
            return out
        logits = torch.matmul(q, k.transpose(-1, -2)).mul_(scale).add_(bias)
        return out, torch.logsumexp(logits, dim=-1).reshape(query.shape[0], query.shape[1], 1)

    def lengths(self) -> list[int]:
        """Keys held (live) per sequence."""
        return (self.host_positions >= self.first[:, None]).sum(axis=1).tolist()

    def write_back(self, cache) -> None:
        """Per-sequence tensors of the live keys, by position, for the general path."""
        device = self.key.device
        for b in range(self.key.shape[0]):
            live = np.nonzero(self.host_positions[b] >= self.first[b])[0]
            live = live[np.argsort(self.host_positions[b, live], kind="stable")]
            idx = torch.from_numpy(live).to(device)
            cache._key[b] = self.key[b].index_select(1, idx)
            cache._value[b] = self.value[b].index_select(1, idx)
            cache._positions[b] = torch.from_numpy(self.host_positions[b, live]).to(device)
            cache._bins[b] = bins(cache._pitch, cache._offset, cache._positions[b])
            cache._last[b] = int(self.last[b])

    def nbytes(self) -> int:
        """Bytes of the ring: all ``capacity`` columns of keys, values and (host) positions,
        and the bias levels and run lengths of the planned block."""
        tensors = [self.key, self.value, self.levels]
        if self._block is not None:
            tensors.append(self._block.repeats)
        held = sum(t.numel() * t.element_size() for t in tensors)
        return int(held + self.host_positions.nbytes)


@dataclass
class _Block:
    """Planned decode steps of a :class:`_StepRing` (host arrays indexed by step ``i``).

    ``pos`` ``(K, B)`` positions, ``first`` ``(K, B)`` their ``min L``, ``edges`` ``(K, B,
    H, s)`` their ``L``, ``bins`` ``(K, B, H, s)`` their bins; ``repeats`` the int64 run
    lengths ``(K, B * H * 2 (s + 1))`` on the device (:meth:`_StepRing._block_of`);
    ``next`` the next step to take.
    """

    pos: np.ndarray
    first: np.ndarray
    edges: np.ndarray
    bins: np.ndarray
    repeats: torch.Tensor
    next: int = 0

    @property
    def size(self) -> int:
        return self.pos.shape[0]
