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

import numpy as np
import torch

from plsh_ref.partition import PartitionSample
from plsh_ref.validation import check_scale, warn_deprecated

from . import _padding as padding
from . import _validation as V
from ._partition import bins, count_bias, partition_tensors
from .api import plsh_attention
from .dense import dense_counts, working_dtype

__all__ = ["PLSHDecodingCache", "binary64_bound", "cache_bound", "reachable_keys"]

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
    ``r`` (new tokens appended before their queries are attended, as in
    :class:`plsh_fast.hf.PLSHCacheLayer`) only ``>=`` keeps them: ``==`` would drop a new
    token whose bins all lie past ``r``'s, though its own query still reaches it.

    Used by :class:`PLSHDecodingCache` (``r`` = the newest query, after attending) and by
    :class:`plsh_fast.hf.PLSHCacheLayer` (``r`` = the smallest new query, before).

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
        Bins of different ranks, or ones with fewer than 3 dimensions.

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
    Each call reads the positions on the host (one device synchronisation) to check this
    and to evict. Memory: ``num_heads_kv * bound * (head_dim + head_dim_v)`` elements per
    sequence plus the int64 bins of the cached keys (``num_heads * num_samples * bound``).

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

    def __init__(self, partition: PartitionSample, *, scale=None):
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

    # ------------------------------------------------------------------ state
    @property
    def batch_size(self) -> int:
        """Number of sequences seen so far (0 before the first call)."""
        return len(self._key)

    def cached_tokens(self) -> torch.Tensor:
        """Keys held per sequence, int64 ``(batch,)``; each ``<= bound``."""
        return torch.tensor([p.numel() for p in self._positions], dtype=torch.int64)

    def live_tokens(self) -> torch.Tensor:
        """Keys each query head can still reach, int64 ``(batch, num_heads)``.

        Key ``j`` is live for head ``h`` iff ``bin_t(j) == bin_t(p)`` in some sample ``t``
        of head ``h``, with ``p`` the newest query position of the sequence. The cache
        keeps the union over heads (a suffix of the positions); this is the per-head view.
        """
        rows = []
        for b, kb in enumerate(self._bins):
            last = self._last[b]
            if last is None or kb.shape[-1] == 0:
                rows.append(torch.zeros(self.partition.num_heads, dtype=torch.int64))
                continue
            qb = self._query_bins(torch.tensor([last], dtype=torch.int64, device=kb.device))
            rows.append((kb == qb).any(dim=1).sum(dim=-1).cpu())
        if not rows:
            return torch.zeros((0, self.partition.num_heads), dtype=torch.int64)
        return torch.stack(rows)

    def cached_positions(self, sequence: int) -> torch.Tensor:
        """int64 ``(L,)`` positions of the keys held for ``sequence``, increasing."""
        return self._positions[self._sequence(sequence)]

    def key_bins(self, sequence: int) -> torch.Tensor:
        """int64 ``(num_heads, num_samples, L)`` bins of the held keys of ``sequence``.

        Equal bit for bit to :func:`plsh_ref.partition.bins` of :meth:`cached_positions`.
        """
        return self._bins[self._sequence(sequence)]

    def _sequence(self, sequence) -> int:
        if isinstance(sequence, bool) or not isinstance(sequence, (int, np.integer)):
            raise TypeError(f"sequence: must be an int, got {type(sequence).__name__}")
        if not 0 <= int(sequence) < self.batch_size:
            raise ValueError(f"sequence: must be in [0, {self.batch_size}), got {sequence}")
        return int(sequence)

    def memory_bytes(self) -> int:
        """Bytes held by the cached keys, values, positions and bins, all sequences."""
        tensors = self._key + self._value + self._positions + self._bins
        return int(sum(t.numel() * t.element_size() for t in tensors))

    def reset(self) -> None:
        """Forget every sequence (the partition and scale are kept)."""
        self._key, self._value, self._positions, self._bins, self._last = [], [], [], [], []
        self._shape = None

    # ------------------------------------------------------------------ helpers
    def _query_bins(self, positions: torch.Tensor) -> torch.Tensor:
        return bins(self._pitch, self._offset, positions)

    def _check_call(self, query, key, value, positions, attention_mask, partition):
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
            if shape != self._shape:
                raise ValueError(
                    f"query: shapes/dtype/device {shape} differ from the cache's {self._shape}"
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
        query,
        key,
        value,
        *args,
        query_positions=None,
        key_positions=None,
        attention_mask=None,
        return_lse: bool = False,
        check_finite: bool = True,
        positions=None,
        partition=None,
    ):
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
            :func:`plsh_fast.plsh_attention`; one read of the new tokens). With it off a NaN
            input propagates to the rows that reach it, and stays in the cache while live.

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
        positions = self._deprecated_positions(args, positions, query_positions, key_positions)
        for flag, value_ in (("return_lse", return_lse), ("check_finite", check_finite)):
            if not isinstance(value_, bool):
                raise TypeError(f"{flag}: must be a bool, got {type(value_).__name__}")
        if partition is not None:
            warn_deprecated(
                "PLSHDecodingCache.update(partition=...)",
                "the constructor's partition only (PLSHDecodingCache(partition))",
            )
        batch, m, shape, mask, positions = self._check_call(
            query, key, value, positions, attention_mask, partition
        )
        if check_finite:
            V.check_finite(query, key, value)
        scale = check_scale(None, shape[2]) if self.scale is None else self.scale
        new_pos = self._new_positions(batch, m, mask, positions)  # checks order, no change yet
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
            keep = torch.ones(m, dtype=torch.bool) if mask is None else mask[b]
            if positions is not None:
                pos = positions[b][keep]
            else:
                start = 0 if last[b] is None else last[b] + 1
                pos = start + torch.arange(int(keep.sum()), dtype=torch.int64)
            if pos.numel() > 1 and bool((pos[1:] <= pos[:-1]).any()):
                raise ValueError(f"query_positions: must increase strictly along sequence {b}")
            if pos.numel() and last[b] is not None and int(pos[0]) <= last[b]:
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
            allowed = max(self.bound, binary64_bound(self.partition, self._last[b]))
            if held > allowed:
                raise RuntimeError(
                    f"decoding cache: {held} keys exceed the bound {allowed} "
                    "(proofs_notes/decoding_cache.md); please report this"
                )

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
