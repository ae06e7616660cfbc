"""Low-level torch twins of the float64 reference, shared by every torch module of plsh_fast.

One definition each: :func:`expand_kv` (grouped-query heads, the torch form of
:func:`plsh_ref.attention.expand_kv`), :func:`working_dtype` (the dtype in which scores,
softmax statistics and the LSE are kept), :func:`alibi_bias` (the torch form of
:func:`plsh_ref.alibi.alibi_bias`), :func:`dense_counts` (the count matrix ``C`` of
:func:`plsh_ref.partition.counts` from bins), :func:`dense_attention` (softmax attention
with an additive bias in plain torch operations) and :func:`biased_lse` (the LSE of the
paths that attend through SDPA, which returns none); and the dense PLSH route of
``backend="auto"`` below :data:`DENSE_CROSSOVER`: :func:`partition_counts` (the counts of a
partition at given positions), :class:`DenseCountCache` (those counts kept across calls,
compactly, per layer), with its two custom operators for ``torch.compile``
(``dense_counts_op`` and ``log_count_table_op``: ``torch.ops.plsh.dense_counts`` and
``torch.ops.plsh.log_count_table``), and :func:`dense_plsh_attention`.
Apart from the torch-side argument checks (:mod:`plsh_fast._validation`) nothing here
imports another plsh_fast module at import time (:mod:`plsh_fast._partition` only inside a
function), so every module may import it without an import cycle.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike

from plsh_ref.validation import check_bool, check_scale, keyword_argument

from . import _validation as V

__all__ = [
    "DENSE_CACHE_BYTES",
    "DENSE_CROSSOVER",
    "DenseCountCache",
    "active_dense_cache",
    "alibi_bias",
    "below_crossover",
    "biased_lse",
    "cached_partition_counts",
    "count_bias_of_counts",
    "dense_attention",
    "dense_count_bias",
    "dense_count_dtype",
    "dense_counts",
    "dense_plsh_attention",
    "expand_kv",
    "log_count_table",
    "partition_counts",
    "use_dense_cache",
    "working_dtype",
]


def working_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype scores, softmax statistics and the LSE are kept in for inputs of ``dtype``.

    float64 stays float64 (the reference's precision); every other floating dtype (float32,
    float16, bfloat16) works in float32 (SPEC section 6: the fast path accumulates in
    float32 and returns the LSE in float32).

    Parameters
    ----------
    dtype : torch.dtype
        The dtype of ``query``.

    Returns
    -------
    torch.dtype
        ``torch.float64`` if ``dtype`` is ``torch.float64``, else ``torch.float32``.

    Raises
    ------
    TypeError
        ``dtype`` not a ``torch.dtype``.
    """
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype: must be a torch.dtype, got {type(dtype).__name__}")
    return torch.float64 if dtype == torch.float64 else torch.float32


def expand_kv(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Repeat the kv heads of ``x`` ``(batch, num_heads_kv, n, dim)`` to ``num_heads`` heads.

    Query head ``h`` reads kv head ``h // (num_heads // num_heads_kv)`` (grouped-query
    attention); ``x`` itself when there is nothing to repeat. The torch form of
    :func:`plsh_ref.attention.expand_kv`.

    Parameters
    ----------
    x : torch.Tensor
        ``(batch, num_heads_kv, n, dim)``, any dtype and device.
    num_heads : int
        Number of query heads, a positive multiple of ``num_heads_kv``.

    Returns
    -------
    torch.Tensor
        ``(batch, num_heads, n, dim)``, the dtype and device of ``x``.

    Raises
    ------
    TypeError
        ``x`` not a 4-D ``torch.Tensor``; ``num_heads`` not an int.
    ValueError
        ``num_heads`` not a positive multiple of ``num_heads_kv`` (it silently returned
        ``num_heads_kv`` or 0 heads before).

    References
    ----------
    SPEC section 5 (grouped-query attention: query head ``h`` uses kv head
    ``h // (num_heads / num_heads_kv)``).
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise TypeError(f"x: must be a 4-D torch.Tensor, got {type(x).__name__}")
    if isinstance(num_heads, bool) or not isinstance(num_heads, (int, np.integer, torch.SymInt)):
        raise TypeError(f"num_heads: must be an int, got {type(num_heads).__name__}")
    if x.shape[1] < 1 or num_heads < 1 or num_heads % x.shape[1]:
        raise ValueError(
            f"num_heads: {num_heads} is not a multiple of num_heads_kv={x.shape[1]} of x"
        )
    group = num_heads // x.shape[1]
    return x if group == 1 else x.repeat_interleave(group, dim=1)


def _pairwise(query_positions: torch.Tensor, key_positions: torch.Tensor):
    """``(p_i, p_j)`` broadcast to ``(..., 1, n_q, 1)`` and ``(..., 1, 1, n_k)``.

    1-D positions give ``(1, n_q, 1)``/``(1, 1, n_k)`` (a head axis in front); 2-D
    ``(batch, n)`` positions give ``(batch, 1, n_q, 1)``/``(batch, 1, 1, n_k)``.
    """
    return query_positions[..., None, :, None], key_positions[..., None, None, :]


def alibi_bias(
    slopes: ArrayLike | torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor, *, causal: bool,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:  # fmt: skip
    """Dense ALiBi bias ``-m_h |p_i - p_j|``, ``-inf`` where ``p_j > p_i`` if ``causal``.

    The torch form of :func:`plsh_ref.alibi.alibi_bias` (same operations: the integer
    distance, converted once, times the slope): in float64 it equals the reference bit for
    bit. No argument checks and no host synchronisation (callers inside the fast paths,
    also under ``torch.compile``, pass checked slopes and positions).

    Parameters
    ----------
    slopes : torch.Tensor or array_like
        ``(num_heads,)`` positive slopes (inverse tokens).
    query_positions, key_positions : torch.Tensor
        int64, ``(n_q,)`` and ``(n_k,)`` shared by the batch, or ``(batch, n_q)`` and
        ``(batch, n_k)`` (``(1, n)`` broadcasts), on one device.
    causal : bool
    dtype : torch.dtype
        Of the result; the product is formed in :func:`working_dtype` ``(dtype)`` (float32
        for float32/float16/bfloat16, whose distances are exact up to ``2**24``) and rounded
        once to ``dtype``.

    Returns
    -------
    torch.Tensor
        ``(num_heads, n_q, n_k)`` for 1-D positions, ``(batch, num_heads, n_q, n_k)`` for
        2-D ones, in ``dtype`` on the positions' device.

    References
    ----------
    Press et al. (2022), section 3; SPEC section 1.
    """
    work = working_dtype(dtype)
    pi, pj = _pairwise(query_positions, key_positions)
    m = torch.as_tensor(slopes, dtype=work, device=query_positions.device)
    bias = -m[:, None, None] * (pi - pj).abs().to(work)
    if causal:
        bias = bias.masked_fill(pj > pi, -math.inf)
    return bias.to(dtype)


def dense_counts(
    query_bins: torch.Tensor, key_bins: torch.Tensor, query_positions: torch.Tensor,
    key_positions: torch.Tensor, *, causal: bool, dtype: torch.dtype = torch.int64,
) -> torch.Tensor:  # fmt: skip
    """The count matrix ``C_ij = #{t : bin_t(p_i) = bin_t(p_j)}`` (times the causal mask).

    The torch form of :func:`plsh_ref.partition.counts` from bins (those of
    :func:`plsh_fast._partition.bins`, equal bit for bit to the reference's), summed one
    sample at a time so that memory stays ``O(... n_q n_k)``. ``log(C / s)`` is
    :func:`plsh_fast._partition.count_bias` of it. No argument checks and no host
    synchronisation.

    Parameters
    ----------
    query_bins, key_bins : torch.Tensor
        int64 ``(..., num_samples, n_q)`` and ``(..., num_samples, n_k)`` with
        broadcastable leading dimensions (e.g. ``(num_heads,)`` or
        ``(batch, num_heads)``).
    query_positions, key_positions : torch.Tensor
        int64 positions whose shapes broadcast like the bins without the sample axis
        (``(n_q,)`` or ``(batch, 1, n_q)``); read only when ``causal``.
    causal : bool
        Zero the counts of pairs with ``p_j > p_i``.

    dtype : torch.dtype
        Integer dtype of the counts (default int64); it must hold ``num_samples``
        (``uint8`` up to 255 samples: one byte per pair, what the dense path of
        ``backend="auto"`` uses).

    Returns
    -------
    torch.Tensor
        ``(..., n_q, n_k)`` counts in ``0..num_samples``, in ``dtype``.

    References
    ----------
    Wolfson & Wagner (2026), Theorem 2.2; SPEC section 3.
    """
    shape = torch.broadcast_shapes(query_bins.shape[:-2], key_bins.shape[:-2])
    count = torch.zeros(
        (*shape, query_bins.shape[-1], key_bins.shape[-1]),
        dtype=dtype,
        device=query_bins.device,
    )
    for t in range(query_bins.shape[-2]):
        count += query_bins[..., t, :, None] == key_bins[..., t, None, :]
    if causal:
        count.masked_fill_(key_positions[..., None, :] > query_positions[..., :, None], 0)
    return count


def dense_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *args: Any,
    bias: torch.Tensor | np.ndarray | None = None,
    scale: float | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``softmax(scale q k^T + bias) v`` in plain torch operations, in the input dtype.

    Every intermediate (logits, softmax, products) is a torch operation in the dtype of
    ``query``, so autograd through it gives the dense gradients in that dtype: the gradient
    oracle of the tests (in float64) and the plain-dtype yardstick of the tolerance rule
    (SPEC section 6). A row whose bias is ``-inf`` everywhere gives output 0, LSE ``-inf``
    and zero gradients (SPEC section 1), never NaN. Also exported as
    :func:`plsh_fast.peers.dense_attention`.

    Parameters
    ----------
    query, key, value : torch.Tensor
        ``(batch, num_heads, n_q, head_dim)``, ``(batch, num_heads_kv, n_k, head_dim)``,
        ``(batch, num_heads_kv, n_k, head_dim_v)``; one floating dtype and device.
    bias : torch.Tensor or numpy.ndarray
        Keyword-only and required (the low-level stand-in of ``partition`` / ``slopes``,
        first after ``value``): ``(num_heads, n_q, n_k)`` or ``(batch, num_heads, n_q,
        n_k)``; ``-inf`` masks a pair (e.g. :func:`plsh_ref.partition.count_bias` for PLSH
        attention); cast to the query's dtype and device. Passed positionally, the old
        form, it still works for one release, with a
        :class:`plsh_ref.validation.PLSHDeprecationWarning`.
    scale : float, optional
        Default ``1 / sqrt(head_dim)``.
    return_lse : bool
        Also return ``logsumexp(scale q k^T + bias)`` over the keys.

    Returns
    -------
    out : torch.Tensor
        ``(batch, num_heads, n_q, head_dim_v)``, the query's dtype.
    lse : torch.Tensor
        Only if ``return_lse``: ``(batch, num_heads, n_q)``.

    Raises
    ------
    TypeError, ValueError
        As :func:`plsh_fast.plsh_attention` for the tensors; a bias missing, given twice or
        of another shape.
    """
    bias = keyword_argument(
        args,
        "bias",
        bias,
        "dense_attention(query, key, value, bias) with a positional bias",
        "dense_attention(query, key, value, bias=...)",
    )
    if bias is None:
        raise TypeError("bias: required (a tensor (num_heads, n_q, n_k), keyword bias=)")
    return_lse = check_bool("return_lse", return_lse)
    V.check_qkv(query, key, value)
    num_heads, n_q, n_k = query.shape[1], query.shape[2], key.shape[2]
    b = torch.as_tensor(bias).to(device=query.device, dtype=query.dtype)
    if b.dim() == 3:
        b = b[None]
    if (
        b.dim() != 4
        or tuple(b.shape[1:]) != (num_heads, n_q, n_k)
        or (b.shape[0] not in (1, query.shape[0]))
    ):
        raise ValueError(
            f"bias: shape {tuple(b.shape)} does not match (num_heads, n_q, n_k) = "
            f"{(num_heads, n_q, n_k)} (optionally with a leading batch dimension)"
        )
    c = check_scale(scale, query.shape[3])
    logits = (query @ expand_kv(key, num_heads).transpose(-1, -2)) * c + b
    empty = torch.isneginf(logits).all(dim=-1, keepdim=True)  # also true when n_k = 0
    safe = torch.where(empty, torch.zeros((), dtype=logits.dtype), logits)
    weights = torch.softmax(safe, dim=-1).masked_fill(empty, 0.0)
    out = weights @ expand_kv(value, num_heads)
    if not return_lse:
        return out
    lse = torch.logsumexp(safe, dim=-1, keepdim=True).masked_fill(empty, -math.inf)
    return out, lse[..., 0]


def biased_lse(
    query: torch.Tensor, key: torch.Tensor, bias: torch.Tensor, *, scale: float
) -> torch.Tensor:
    """The LSE ``log sum_j exp(scale q_i . k_j + bias_ij)`` of biased attention, in
    :func:`working_dtype`.

    What the dense paths that attend through ``scaled_dot_product_attention`` (which
    returns no LSE) return as their LSE: :func:`dense_plsh_attention`, the dense and exact
    paths of :class:`plsh_fast.nn.PLSHAttention` and
    :func:`plsh_fast.peers.sdpa_alibi_attention`. Differentiable through torch autograd;
    a row whose bias is ``-inf`` everywhere (no admissible key, ``n_k = 0`` included)
    gives ``-inf`` and zero gradients, never NaN (SPEC section 1). No argument checks and
    no host synchronisation (callers check first; traces under ``torch.compile``).

    Parameters
    ----------
    query : torch.Tensor
        ``(batch, num_heads, n_q, head_dim)``, floating.
    key : torch.Tensor
        ``(batch, num_heads_kv, n_k, head_dim)``, the query's dtype
        (``num_heads % num_heads_kv == 0``).
    bias : torch.Tensor
        ``(num_heads, n_q, n_k)`` or ``(batch or 1, num_heads, n_q, n_k)``, any floating
        dtype (converted to the working dtype), ``-inf`` for masked pairs, no NaN or
        ``+inf``.
    scale : float
        Logit scale.

    Returns
    -------
    torch.Tensor
        ``(batch, num_heads, n_q)`` in :func:`working_dtype` ``(query.dtype)`` (float32,
        float64 for float64 inputs), natural log.

    References
    ----------
    SPEC section 1 (the LSE); Wolfson & Wagner (2026), Theorem 2.2 (its PLSH form with
    ``bias = log(C / s)``).
    """
    work = working_dtype(query.dtype)
    b = bias.to(work)
    if b.dim() == 3:
        b = b[None]
    empty = torch.isneginf(b).all(dim=-1, keepdim=True)  # also true when n_k = 0
    b = b.masked_fill(empty, 0.0)
    k = expand_kv(key, query.shape[1])
    logits = (query.to(work) @ k.to(work).transpose(-1, -2)) * scale + b
    lse = torch.logsumexp(logits, dim=-1, keepdim=True).masked_fill(empty, -math.inf)
    return lse[..., 0]


#: Sequence length ``n`` per device type up to which ``backend="auto"`` computes PLSH
#: attention densely (:func:`dense_plsh_attention`): a call takes the dense path when
#: ``n_q * n_k <= n**2``. Measured by ``benchmarks/crossover_bench.py`` (CPU, dense with its
#: counts kept against the tiled path with its plan kept:
#: ``benchmarks/results/crossover_2026-12-02_kept_counts.md``, largest measured ``n`` with
#: dense no slower: 256); the CUDA value is an estimate until measured there
#: (``docs/huggingface.md``). Device types not listed never take the dense path.
DENSE_CROSSOVER = {"cpu": 256, "cuda": 2048}


def below_crossover(n_q: int, n_k: int, device: torch.device) -> bool:
    """Whether ``backend="auto"`` computes an ``n_q x n_k`` problem on ``device`` densely.

    ``n_q * n_k <= DENSE_CROSSOVER[device.type] ** 2`` (symbolic sizes under
    ``torch.compile`` give a guard, so a compiled model holds at most one graph per side of
    the crossover).

    Parameters
    ----------
    n_q, n_k : int or torch.SymInt
        Query and key counts.
    device : torch.device

    Returns
    -------
    bool

    References
    ----------
    ``docs/huggingface.md``, "Short sequences: the same function, computed densely" and
    "Where the crossover lies".
    """
    limit = DENSE_CROSSOVER.get(torch.device(device).type)
    return limit is not None and n_q * n_k <= limit * limit


def dense_count_dtype(num_samples: int) -> torch.dtype:
    """The integer dtype of the dense counts ``0..num_samples``: ``uint8`` up to 255 samples
    (one byte per pair, a quarter of a float32 bias), ``int32`` above.

    Parameters
    ----------
    num_samples : int or torch.SymInt
        ``s >= 1``.

    Returns
    -------
    torch.dtype

    References
    ----------
    ``docs/huggingface.md``, "Kept counts, one cache per layer" (``uint8`` up to 255 samples).
    """
    return torch.uint8 if num_samples <= 255 else torch.int32


def partition_counts(
    partition: tuple[torch.Tensor, torch.Tensor],
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    *,
    causal: bool,
) -> torch.Tensor:
    """The counts ``C_ij = #{t : bin_t(p_i) = bin_t(p_j)}`` of a partition, 0 causally.

    The bins are :func:`plsh_fast._partition.bins` (binary64, equal bit for bit to
    :func:`plsh_ref.partition.bins`), summed one sample at a time by :func:`dense_counts`
    in :func:`dense_count_dtype`: equal to :func:`plsh_ref.partition.counts` (tested). Cost
    ``O(batch H s n_q n_k)``; what :class:`DenseCountCache` keeps so that a repeated call
    skips it. No argument checks and no host synchronisation (traces under
    ``torch.compile``).

    Parameters
    ----------
    partition : (torch.Tensor, torch.Tensor)
        ``(pitch, offset)`` float64 ``(num_heads, num_samples)``.
    query_positions, key_positions : torch.Tensor
        int64 ``(n_q,)``/``(n_k,)`` or ``(batch, n_q)``/``(batch, n_k)``, on the partition's
        device.
    causal : bool
        Count 0 where ``p_j > p_i``.

    Returns
    -------
    torch.Tensor
        ``(batch or 1, num_heads, n_q, n_k)`` in :func:`dense_count_dtype` ``(num_samples)``.

    References
    ----------
    Wolfson & Wagner (2026), Theorem 2.2; SPEC sections 2-3.
    """
    from ._partition import bins  # noqa: PLC0415 (_partition imports nothing here)

    pitch, offset = partition
    num_heads, num_samples = pitch.shape
    q2 = query_positions if query_positions.dim() == 2 else query_positions[None]
    k2 = key_positions if key_positions.dim() == 2 else key_positions[None]
    # (H, s, B|1, n) -> (B|1, H, s, n)
    qb = bins(pitch, offset, q2.reshape(-1)).view(num_heads, num_samples, *q2.shape)
    kb = bins(pitch, offset, k2.reshape(-1)).view(num_heads, num_samples, *k2.shape)
    qb, kb = qb.permute(2, 0, 1, 3), kb.permute(2, 0, 1, 3)
    return dense_counts(
        qb, kb, q2[:, None], k2[:, None], causal=causal, dtype=dense_count_dtype(num_samples)
    )


#: Bytes of counts one :class:`DenseCountCache` keeps (least recently used first out); 0
#: keeps none. The counts of a layer at ``n`` tokens take ``batch * num_heads * n**2`` bytes
#: (``uint8``), a quarter of the float32 bias they stand for.
DENSE_CACHE_BYTES = 256 * 2**20

_SEEN_KEYS = 4096


class DenseCountCache:
    """Dense counts (:func:`partition_counts`) kept across calls, per layer.

    The counts depend only on the partition, the positions and ``causal``, which repeat
    at every step of training or evaluation with a fixed partition (the HF layers'): the
    dense route of ``backend="auto"`` (:func:`dense_plsh_attention`) looks them up here
    and then only computes the cheap ``log(C / s)`` of them per call. An entry is keyed
    like the CPU path's kept plans (``plsh_fast.cpu._plan_cache.cache_key``): the device,
    ``causal``, the partition's ``pitch`` and ``offset`` values (bytes, compared exactly)
    and the positions' shapes and content (hashed; compared again with ``torch.equal`` on
    a hit, so a hash collision is a miss, never a stale entry). Entries are admitted on the
    second call with their key (:class:`plsh_fast.cpu.PlanCache` does the same), so that
    one-off calls (a partition drawn anew each training step) keep nothing, and evicted
    least recently used first beyond :data:`DENSE_CACHE_BYTES`. Counts on devices other
    than the CPU are not kept (the key would read the positions to the host: a
    synchronisation per call); they are rebuilt. Thread-safe.

    Each attention layer of :mod:`plsh_fast.hf` (:func:`plsh_fast.hf.prepare_layer`) and
    each :class:`plsh_fast.nn.PLSHAttention` owns one (eager calls,
    :func:`use_dense_cache`); otherwise, and under ``torch.compile`` (the operator
    ``plsh::dense_counts``), one process-wide instance is used.

    Attributes
    ----------
    nbytes : int
        Bytes of the kept counts.
    hits, misses : int
        Calls served from the cache and calls that built their counts.

    References
    ----------
    ``docs/huggingface.md``, "Kept counts, one cache per layer".
    """

    def __init__(self) -> None:
        #: key -> (query_positions, key_positions, counts), least recently used first
        self.entries: OrderedDict = OrderedDict()
        #: ``hash`` of the keys of recent calls (admission on the second call)
        self.seen: OrderedDict = OrderedDict()
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.entries)

    def __deepcopy__(self, memo: dict) -> DenseCountCache:
        """An empty cache (a copied layer builds its counts again)."""
        return DenseCountCache()

    def __reduce__(self) -> tuple[type[DenseCountCache], tuple[()]]:
        return (DenseCountCache, ())  # pickled empty, like a copy

    def clear(self) -> None:
        """Forget every kept entry and remembered call (the statistics stay)."""
        with self._lock:
            self.entries.clear()
            self.seen.clear()
            self.nbytes = 0

    @staticmethod
    def key(
        pitch: torch.Tensor, offset: torch.Tensor, query_positions: torch.Tensor,
        key_positions: torch.Tensor, causal: bool,
    ) -> tuple | None:  # fmt: skip
        """The hashable key of a call, or ``None`` when its counts are not kept (a device
        other than the CPU, or ``DENSE_CACHE_BYTES <= 0``)."""
        if DENSE_CACHE_BYTES <= 0 or pitch.device.type != "cpu":
            return None

        def digest(x: torch.Tensor) -> int:
            return hash(x.detach().contiguous().numpy().tobytes())

        return (
            bool(causal),
            tuple(pitch.shape),
            pitch.detach().contiguous().numpy().tobytes(),
            offset.detach().contiguous().numpy().tobytes(),
            tuple(query_positions.shape),
            tuple(key_positions.shape),
            digest(query_positions),
            digest(key_positions),
        )

    @staticmethod
    def same_positions(
        entry: tuple, query_positions: torch.Tensor, key_positions: torch.Tensor
    ) -> bool:
        """Whether a kept ``entry`` was built for exactly these positions."""
        return torch.equal(entry[0], query_positions) and torch.equal(entry[1], key_positions)

    def counts(
        self,
        partition: tuple[torch.Tensor, torch.Tensor],
        query_positions: torch.Tensor,
        key_positions: torch.Tensor,
        *,
        causal: bool,
    ) -> torch.Tensor:
        """:func:`partition_counts` of these arguments, kept or looked up.

        Parameters and returns as :func:`partition_counts`. The result may be the kept
        tensor itself: do not modify it.
        """
        pitch, offset = partition
        key = self.key(pitch, offset, query_positions, key_positions, causal)
        admit = False
        if key is not None:
            with self._lock:
                entry = self.entries.get(key)
                if entry is not None and self.same_positions(entry, query_positions, key_positions):
                    self.entries.move_to_end(key)
                    self.hits += 1
                    return entry[2]
                digest = hash(key)
                admit = digest in self.seen
                self.seen[digest] = None
                self.seen.move_to_end(digest)
                while len(self.seen) > _SEEN_KEYS:
                    self.seen.popitem(last=False)
        with self._lock:
            self.misses += 1
        count = partition_counts(partition, query_positions, key_positions, causal=causal)
        size = count.numel() * count.element_size()
        if admit and size <= DENSE_CACHE_BYTES:
            entry = (query_positions.detach().clone(), key_positions.detach().clone(), count)
            with self._lock:
                old = self.entries.pop(key, None)
                if old is not None:
                    self.nbytes -= old[2].numel() * old[2].element_size()
                self.entries[key] = entry
                self.nbytes += size
                while self.entries and self.nbytes > DENSE_CACHE_BYTES:
                    _, dropped = self.entries.popitem(last=False)
                    self.nbytes -= dropped[2].numel() * dropped[2].element_size()
        return count


_DEFAULT_DENSE_CACHE = DenseCountCache()  # the process-wide instance
_ACTIVE_DENSE = threading.local()  # use_dense_cache() instance of this thread


def active_dense_cache() -> DenseCountCache:
    """The :class:`DenseCountCache` that dense calls of this thread use: the one of the
    innermost :func:`use_dense_cache`, else the process-wide one.

    References
    ----------
    ``docs/huggingface.md``, "Kept counts, one cache per layer".
    """
    cache = getattr(_ACTIVE_DENSE, "cache", None)
    return _DEFAULT_DENSE_CACHE if cache is None else cache  # not `or`: empty is falsy


@contextlib.contextmanager
def use_dense_cache(cache: DenseCountCache) -> Iterator[DenseCountCache]:
    """Context manager: dense PLSH calls of this thread keep and reuse counts in ``cache``.

    Parameters
    ----------
    cache : DenseCountCache
        For example a layer's own (:func:`plsh_fast.hf.prepare_layer`).

    Raises
    ------
    TypeError
        ``cache`` is not a :class:`DenseCountCache`.

    Notes
    -----
    Thread-local and nesting, like :func:`plsh_fast.cpu.use_plan_cache`; eager calls only
    (a compiled graph's ``plsh::dense_counts`` uses the cache active when it runs).

    References
    ----------
    ``docs/huggingface.md``, "Kept counts, one cache per layer".
    """
    if not isinstance(cache, DenseCountCache):
        raise TypeError(f"cache: must be a DenseCountCache, got {type(cache).__name__}")
    previous = getattr(_ACTIVE_DENSE, "cache", None)
    _ACTIVE_DENSE.cache = cache
    try:
        yield cache
    finally:
        _ACTIVE_DENSE.cache = previous


def cached_partition_counts(
    partition: tuple[torch.Tensor, torch.Tensor],
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    *,
    causal: bool,
) -> torch.Tensor:
    """:func:`partition_counts` through the active :class:`DenseCountCache`.

    Eager: :meth:`DenseCountCache.counts` of :func:`active_dense_cache`. Under
    ``torch.compile``: the custom operator ``plsh::dense_counts``
    (``dense_counts_op``), opaque to Dynamo (a fake implementation
    gives the shape, symbolic in the lengths), so the cache lookup runs inside the compiled
    graph at every call without a graph break or a recompile per length. Parameters and
    returns as :func:`partition_counts`; the result must not be modified.

    References
    ----------
    ``docs/huggingface.md``, "Kept counts, one cache per layer" (the operator
    ``plsh::dense_counts`` under ``torch.compile``).
    """
    if torch.compiler.is_compiling():
        pitch, offset = partition
        return dense_counts_op(pitch, offset, query_positions, key_positions, causal)
    return active_dense_cache().counts(partition, query_positions, key_positions, causal=causal)


_LOG_COUNT_TABLES: dict = {}  # (num_samples, device) -> float64 table, built once


def log_count_table(like: torch.Tensor, num_samples: int) -> torch.Tensor:
    """``log(c / s)`` for ``c = 0..s`` (``-inf`` for ``c = 0``), float64 ``(s + 1,)``.

    The values of :func:`plsh_ref.partition.count_bias` of ``0..s``, computed by that very
    function (NumPy's ``log``, position-independent: looked up per pair they equal the
    reference's ``count_bias`` of any count array bit for bit, tested for every ``s`` up to
    300), once per ``(s, device)``, on ``like``'s device. ``torch.log`` is not used: its
    float64 result differs from NumPy's by one unit in the last place for some counts at
    696 of the sample counts ``s <= 1024`` (``s = 35, 37, 128, ...``; measured on the
    development CPU). Under ``torch.compile`` it is the operator ``plsh::log_count_table``
    (``log_count_table_op``): a compiled graph then reads the ``s + 1``
    values from memory per pair instead of inlining a ``log`` per pair into the lookup
    (Inductor fuses a computed table into its consumer).

    Parameters
    ----------
    like : torch.Tensor
        Any tensor on the device wanted (for example the counts).
    num_samples : int or torch.SymInt
        ``s >= 1``.

    Returns
    -------
    torch.Tensor
        float64 ``(num_samples + 1,)``; the kept table itself in eager mode (do not modify
        it).

    References
    ----------
    SPEC section 3.
    """
    if torch.compiler.is_compiling():
        return log_count_table_op(like, num_samples)
    key = (int(num_samples), like.device)
    table = _LOG_COUNT_TABLES.get(key)
    if table is None:
        from plsh_ref.partition import count_bias  # noqa: PLC0415 (NumPy, the reference's)

        values = count_bias(np.arange(key[0] + 1), key[0])
        table = _LOG_COUNT_TABLES.setdefault(key, torch.from_numpy(values).to(like.device))
    return table


@torch.library.custom_op("plsh::dense_counts", mutates_args=())
def dense_counts_op(
    pitch: torch.Tensor,
    offset: torch.Tensor,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    causal: bool,
) -> torch.Tensor:
    """The dense counts of :func:`partition_counts`, looked up in (or kept
    in) the active :class:`DenseCountCache`, as an operator.

    What :func:`cached_partition_counts` calls under ``torch.compile``: the
    cache lookup reads the positions' values, so it cannot be traced; as an operator with a
    fake implementation (the shape ``(batch or 1, num_heads, n_q, n_k)`` and
    :func:`dense_count_dtype`, symbolic in the lengths) it runs inside the
    compiled graph at every call, without a graph break or a recompile per length. Returns
    a copy of the kept counts (an operator's output may not be a tensor that outlives the
    call in a cache: the compiled graph could reuse its memory). No gradient (counts).

    References
    ----------
    ``docs/huggingface.md``, "Kept counts, one cache per layer"; ``torch.library.custom_op``
    with ``register_fake``.
    """
    count = active_dense_cache().counts(
        (pitch, offset), query_positions, key_positions, causal=causal
    )
    return count.clone(memory_format=torch.contiguous_format)


@dense_counts_op.register_fake
def _cached_dense_counts_fake(pitch, offset, query_positions, key_positions, causal):
    batch_q = query_positions.shape[0] if query_positions.dim() == 2 else 1
    batch_k = key_positions.shape[0] if key_positions.dim() == 2 else 1
    (batch,) = torch.broadcast_shapes((batch_q,), (batch_k,))
    shape = (batch, pitch.shape[0], query_positions.shape[-1], key_positions.shape[-1])
    return pitch.new_empty(shape, dtype=dense_count_dtype(pitch.shape[1]))


@torch.library.custom_op("plsh::log_count_table", mutates_args=())
def log_count_table_op(like: torch.Tensor, num_samples: int) -> torch.Tensor:
    """``log(c / s)`` for ``c = 0..num_samples``, float64 on ``like``'s device, as an operator.

    What :func:`log_count_table` calls under ``torch.compile``: an operator's
    output is a buffer, so the compiled lookup of ``log(C / s)`` reads these ``s + 1``
    values instead of computing a float64 ``log`` per pair (Inductor inlines a computed
    table into its consumer). The values of :func:`log_count_table` (the
    reference's), copied (an operator's output may not be the kept table).

    References
    ----------
    ``docs/huggingface.md``, "Where the crossover lies" (``plsh::log_count_table``); SPEC
    section 3 (the bias ``log(C / s)``); ``torch.library.custom_op``.
    """
    return log_count_table(like, num_samples).clone()


@log_count_table_op.register_fake
def _log_count_table_fake(like, num_samples):
    return like.new_empty(num_samples + 1, dtype=torch.float64)


def count_bias_of_counts(
    count: torch.Tensor,
    num_samples: int,
    *,
    attention_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """``log(C / s)`` of dense counts, ``-inf`` where ``C = 0`` and at pads, in ``dtype``.

    :func:`plsh_fast._partition.count_bias` of ``0..s`` (the reference's operations) looked
    up per pair and rounded once to ``dtype``: elementwise, ``O(batch H n_q n_k)``, what a
    call does per step when its counts are kept (:class:`DenseCountCache`).

    Parameters
    ----------
    count : torch.Tensor
        Integer ``(batch or 1, num_heads, n_q, n_k)`` counts in ``0..num_samples``
        (:func:`partition_counts`).
    num_samples : int
        ``s``.
    attention_mask : torch.Tensor, optional
        bool ``(batch, n_k)``, True = keep: ``-inf`` at pad keys and on the rows of pad
        queries (end-aligned key slot ``n_k - n_q + i`` padded, when ``n_q <= n_k``).
    dtype : torch.dtype
        Of the result.

    Returns
    -------
    torch.Tensor
        ``(batch or 1, num_heads, n_q, n_k)`` in ``dtype``.

    References
    ----------
    Wolfson & Wagner (2026), Theorem 2.2; SPEC section 3.
    """
    n_q, n_k = count.shape[-2], count.shape[-1]
    table = log_count_table(count, num_samples)
    # log(C / s); -inf where C = 0 (index_select: twice as fast as advanced indexing, eager)
    flat = count.reshape(-1).to(torch.int32)
    bias = table.to(dtype).index_select(0, flat).view(count.shape)
    if attention_mask is not None:
        bias = bias.masked_fill(~attention_mask[:, None, None, :], -math.inf)
        if n_q <= n_k:
            bias = bias.masked_fill(~attention_mask[:, None, n_k - n_q :, None], -math.inf)
    return bias


def dense_count_bias(
    partition: tuple[torch.Tensor, torch.Tensor],
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    *,
    causal: bool,
    attention_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
    cached: bool = False,
) -> torch.Tensor:
    """The dense PLSH bias ``log(C_ij / s)``: ``-inf`` where ``C = 0``, causally and at pads.

    :func:`count_bias_of_counts` of :func:`partition_counts` (``cached=False``) or of
    :func:`cached_partition_counts` (``cached=True``: the counts kept in the active
    :class:`DenseCountCache`, the same values), so in float64 it equals
    :func:`plsh_ref.partition.count_bias` of :func:`plsh_ref.partition.counts` bit for bit
    (tested, both routes). No argument checks and no host synchronisation on the uncached
    route (traces under ``torch.compile``; the cached route is an operator there).

    Parameters
    ----------
    partition : (torch.Tensor, torch.Tensor)
        ``(pitch, offset)`` float64 ``(num_heads, num_samples)``.
    query_positions, key_positions : torch.Tensor
        int64 ``(n_q,)``/``(n_k,)`` or ``(batch, n_q)``/``(batch, n_k)``, on the partition's
        device.
    causal : bool
        ``-inf`` where ``p_j > p_i``.
    attention_mask : torch.Tensor, optional
        bool ``(batch, n_k)``, True = keep: ``-inf`` at pad keys and on the rows of pad
        queries (end-aligned key slot ``n_k - n_q + i`` padded, when ``n_q <= n_k``).
    dtype : torch.dtype
        Of the result.
    cached : bool
        Look the counts up in (and keep them in) the active :class:`DenseCountCache`.

    Returns
    -------
    torch.Tensor
        ``(batch or 1, num_heads, n_q, n_k)`` in ``dtype``.

    References
    ----------
    Wolfson & Wagner (2026), Theorem 2.2; SPEC sections 2-3.
    """
    counts_of = cached_partition_counts if cached else partition_counts
    count = counts_of(partition, query_positions, key_positions, causal=causal)
    return count_bias_of_counts(
        count, partition[0].shape[1], attention_mask=attention_mask, dtype=dtype
    )


def dense_plsh_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    partition: tuple[torch.Tensor, torch.Tensor],
    causal: bool,
    scale: float,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """PLSH attention computed densely: ``softmax(scale q k^T + log(C / s)) v`` through SDPA.

    The same function as :func:`plsh_fast.plsh_attention` on the same partition (the tiled
    paths skip only pairs with ``C = 0``): the counts are :func:`partition_counts` (bins
    equal bit for bit to :func:`plsh_ref.partition.bins`), kept across calls in the active
    :class:`DenseCountCache` (:func:`cached_partition_counts`: a repeated call with the
    same partition and positions skips building them), and ``log(C / s)`` is
    :func:`plsh_fast._partition.count_bias` of ``0..s`` looked up per pair (the reference's
    operations, rounded once to the query dtype). Differentiable through torch autograd
    (the bias takes no gradient). Cost ``O(batch H n_q n_k d)`` time when the counts are
    kept (``+ O(batch H n_q n_k s)`` when built), ``O(batch H n_q n_k)`` memory: the path
    ``backend="auto"`` takes below :data:`DENSE_CROSSOVER`. Arguments are not checked here
    (:func:`plsh_fast.plsh_attention` checks them first); no host synchronisation on the
    GPU, and it traces under ``torch.compile`` (the lookup is the operator
    ``plsh::dense_counts``).

    Parameters
    ----------
    query : torch.Tensor
        ``(batch, num_heads, n_q, head_dim)``, float16/bfloat16/float32/float64.
    key, value : torch.Tensor
        ``(batch, num_heads_kv, n_k, head_dim)`` and ``(..., head_dim_v)``, the query's dtype.
    partition : (torch.Tensor, torch.Tensor)
        ``(pitch, offset)`` float64 ``(num_heads, num_samples)`` on the query's device.
    causal : bool
        Key ``j`` admissible for query ``i`` iff ``p_j <= p_i``.
    scale : float
        Logit scale.
    query_positions, key_positions : torch.Tensor
        int64 ``(n_q,)``/``(n_k,)`` or ``(batch, n_q)``/``(batch, n_k)``.
    attention_mask : torch.Tensor, optional
        bool ``(batch, n_k)``, True = keep; a query whose end-aligned key slot
        ``n_k - n_q + i`` is padded (``n_q <= n_k``) is a pad query (as the tiled paths).
    return_lse : bool
        Also return the LSE ``log sum_j exp(scale q_i . k_j) C_ij / s``.

    Returns
    -------
    out : torch.Tensor
        ``(batch, num_heads, n_q, head_dim_v)``, the query's dtype; 0 on rows without an
        admissible key (pad queries included).
    lse : torch.Tensor
        Only if ``return_lse``: ``(batch, num_heads, n_q)`` in :func:`working_dtype`,
        ``-inf`` on rows without an admissible key.

    References
    ----------
    Wolfson & Wagner (2026), Theorem 2.2 (``softmax(QK^T + log M~)``); SPEC sections 2, 3, 5.
    """
    num_heads = query.shape[1]
    count = cached_partition_counts(partition, query_positions, key_positions, causal=causal)
    bias = count_bias_of_counts(
        count, partition[0].shape[1], attention_mask=attention_mask, dtype=query.dtype
    )
    # rows without an admissible key (bias -inf everywhere), read from the 1-byte counts
    keep = count != 0
    if attention_mask is not None:
        keep = keep & attention_mask[:, None, None, :]
        if query.shape[2] <= key.shape[2]:
            keep = keep & attention_mask[:, None, key.shape[2] - query.shape[2] :, None]
    empty = ~keep.any(dim=-1, keepdim=True)
    k, v = expand_kv(key, num_heads), expand_kv(value, num_heads)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, k, v, attn_mask=bias.masked_fill(empty, 0.0), scale=scale
    )
    out = out.masked_fill(empty, 0.0)
    if not return_lse:
        return out
    return out, biased_lse(query, key, bias, scale=scale)
