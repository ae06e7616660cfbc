"""Peers of PLSH attention in torch: exact ALiBi, SDPA with a dense ALiBi bias, FlexAttention
ALiBi (``score_mod``, causal and windowed ``mask_mod``, block masks) and the paper's reduction.

The benchmarks (``benchmarks/cpu_bench.py``, ``benchmarks/gpu_check.py``) and the tests take
their peers from here, and so can anyone benchmarking ALiBi attention. Layout
``(batch, num_heads, seq_len, head_dim)``; key/value may have ``num_heads_kv`` heads
(``num_heads % num_heads_kv == 0``, query head ``h`` reads kv head ``h // group``).
Positions are integers (``(n,)``, shared by the batch); the defaults are those of
:func:`plsh_ref.alibi.default_positions` (keys ``0..n_k-1``, queries aligned to the end).

* :func:`chunked_alibi_attention`: exact ALiBi attention ``softmax(scale q k^T - m_h |p_i - p_j|) v``
  in float64, a block of query rows at a time (ground truth at lengths where the dense
  reference :func:`plsh_ref.attention.alibi_attention` does not fit in memory).
* :func:`sdpa_alibi_bias` and :func:`sdpa_alibi_attention`: the dense bias ``(num_heads, n_q, n_k)``
  and ``torch.nn.functional.scaled_dot_product_attention`` with it (``O(n_q n_k)`` memory).
* :func:`dense_attention`: ``softmax(scale q k^T + bias) v`` written out in plain torch
  operations in the input dtype, differentiable: the dense gradient oracle of the tests
  and benchmarks (float64 for the reference, the kernel's dtype for the yardstick of the
  SPEC section 6 tolerance rule).
* FlexAttention (``torch.nn.attention.flex_attention``): :func:`alibi_score_mod` adds the
  ALiBi bias to each score; :func:`causal_mask_mod` and :func:`window_mask_mod` (a per-head
  sliding window) say which pairs are computed at all; :func:`block_mask` and
  :func:`causal_block_mask` turn them into the block-sparse ``BlockMask``;
  :func:`compiled_flex_attention` is the compiled kernel. Writing the ALiBi bias as a score
  modification and the window as a mask follows the FlexAttention formulation (PyTorch
  blog "FlexAttention: the flexibility of PyTorch with the performance of FlashAttention",
  2024, and its attention-gym examples); the code here is our own.
* :func:`reduction_attention` (any backend) and :func:`flex_reduction_attention` (one
  batched FlexAttention call, batch entry = sample, with :func:`reduction_mask_mod` /
  :func:`reduction_block_mask`): the paper's algorithm (Wolfson & Wagner 2026, section 2): for
  each of the ``s`` samples, attention without bias inside each block of that sample, then
  the ``s`` partial results merged by their softmax denominators (an LSE merge). It equals
  PLSH attention ``softmax(scale q k^T + log(C/s)) v`` to rounding; each block pass is
  :func:`plsh_fast.plsh_attention` with a one-sample partition.

The score and mask functions read the tensors they were built from (``slopes``, ``window``,
positions) at call time: build them once and update those tensors in place, so that a
compiled FlexAttention sees the same function objects and is not recompiled.

References
----------
Press, Smith & Lewis (2022), *Train Short, Test Long: Attention with Linear Biases Enables
Input Length Extrapolation* (ALiBi); Wolfson & Wagner (2026), *Positional LSH*, section 2
and Theorem 2.2; SPEC sections 1, 3 and 7.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch.nn import functional as F

from plsh_ref.alibi import check_slopes, resolve_positions
from plsh_ref.partition import PartitionSample, check_partition
from plsh_ref.validation import (
    check_bool,
    check_int,
    check_scale,
    keyword_argument,
    select_return,
    warn_deprecated,
)

from . import _validation as V
from .dense import alibi_bias as dense_alibi_bias
from .dense import biased_lse, dense_attention, expand_kv, working_dtype

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

__all__ = [
    "alibi_attention",
    "alibi_bias",
    "alibi_score_mod",
    "block_mask",
    "causal_block_mask",
    "causal_mask_mod",
    "chunked_alibi_attention",
    "compiled_flex_attention",
    "dense_attention",
    "expand_kv",
    "flex_reduction_attention",
    "reduction_attention",
    "reduction_block_mask",
    "reduction_mask_mod",
    "sdpa_alibi_attention",
    "sdpa_alibi_bias",
    "window_mask_mod",
]


def _positions(n_q: int, n_k: int, query_positions, key_positions, device):
    """Validated int64 positions (defaults of plsh_ref.alibi) as tensors on ``device``."""
    qpos, kpos = resolve_positions(n_q, n_k, query_positions, key_positions)
    return torch.from_numpy(qpos).to(device), torch.from_numpy(kpos).to(device)


def sdpa_alibi_bias(
    slopes: ArrayLike | torch.Tensor,
    n_q: int,
    n_k: int,
    *,
    query_positions: ArrayLike | torch.Tensor | None = None,
    key_positions: ArrayLike | torch.Tensor | None = None,
    causal: bool = True,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """Dense ALiBi bias ``-m_h |p_i - p_j|`` (``-inf`` where ``p_j > p_i`` if ``causal``).

    The bias of :func:`sdpa_alibi_attention`, from lengths and optional positions, with
    every argument checked; the values are :func:`plsh_fast.dense.alibi_bias` (the torch
    twin of :func:`plsh_ref.alibi.alibi_bias`, which takes positions). Named
    ``alibi_bias`` before (deprecated alias, one release: its contract differed from
    :func:`plsh_ref.alibi.alibi_bias`).

    Parameters
    ----------
    slopes : array_like or None, ``(num_heads,)``
        ALiBi slopes ``m_h > 0``; ``None`` is not accepted here (the head count comes from
        the slopes): pass :func:`plsh_ref.alibi.alibi_slopes` ``(num_heads)``.
    n_q, n_k : int
        Query and key lengths.
    query_positions, key_positions : array_like of int, optional
        ``(n_q,)``, ``(n_k,)``; defaults of :func:`plsh_ref.alibi.default_positions`.
    causal : bool
    dtype : torch.dtype
        Of the result. The distances and the products are formed in float32 (float64 for a
        float64 bias) and rounded once to ``dtype``; distances up to ``2**24`` are exact in
        float32.
    device : torch.device or str

    Returns
    -------
    torch.Tensor
        ``(num_heads, n_q, n_k)`` in ``dtype`` on ``device``; equals
        :func:`plsh_ref.alibi.alibi_bias` exactly in float64.

    Raises
    ------
    TypeError, ValueError
        Bad slopes (not finite and > 0), non-integer positions or lengths, a non-bool
        ``causal``.

    References
    ----------
    Press et al. (2022), section 3; SPEC section 1.
    """
    causal = check_bool("causal", causal)
    n_q = check_int("n_q", n_q, minimum=0)
    n_k = check_int("n_k", n_k, minimum=0)
    if slopes is None:
        raise TypeError("slopes: required (e.g. plsh_ref.alibi.alibi_slopes(num_heads))")
    m_host = np.atleast_1d(np.asarray(slopes, dtype=np.float64))
    m_host = check_slopes(m_host, m_host.shape[0])
    qpos, kpos = _positions(n_q, n_k, query_positions, key_positions, device)
    return dense_alibi_bias(m_host, qpos, kpos, causal=causal, dtype=dtype)


def alibi_bias(*args: Any, **kwargs: Any) -> torch.Tensor:
    """Deprecated alias of :func:`sdpa_alibi_bias` (one release; DeprecationWarning).

    References
    ----------
    ``docs/changelog.md``, "Unreleased: one API for the attention family" (the rename).
    """
    warn_deprecated("plsh_fast.peers.alibi_bias", "plsh_fast.peers.sdpa_alibi_bias")
    return sdpa_alibi_bias(*args, **kwargs)


def sdpa_alibi_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    slopes: ArrayLike | torch.Tensor | None = None,
    causal: bool = True,
    scale: float | None = None,
    query_positions: ArrayLike | torch.Tensor | None = None,
    key_positions: ArrayLike | torch.Tensor | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Exact ALiBi attention through ``scaled_dot_product_attention`` with a dense bias.

    Parameters
    ----------
    query, key, value : torch.Tensor
        ``(batch, num_heads, n_q, head_dim)``, ``(batch, num_heads_kv, n_k, head_dim)``,
        ``(batch, num_heads_kv, n_k, head_dim_v)``, one floating dtype and device.
    bias : torch.Tensor, optional
        A bias from :func:`sdpa_alibi_bias` ``(num_heads, n_q, n_k)`` in the query's dtype, built
        once and reused (benchmarks time the attention, not the bias); when given,
        ``slopes``, ``causal`` and the positions are not used.
    slopes, causal, query_positions, key_positions
        As :func:`sdpa_alibi_bias` (``slopes`` default :func:`plsh_ref.alibi.alibi_slopes`).
    scale : float, optional
        Default ``1 / sqrt(head_dim)`` (:func:`plsh_ref.validation.check_scale`).
    return_lse : bool
        Also return the LSE ``log sum_j exp(scale q_i . k_j + bias_ij)``. SDPA returns
        none: it is computed by :func:`plsh_fast.dense.biased_lse` from the same bias (one
        more ``(batch, num_heads, n_q, n_k)`` pass, in float32, float64 for float64 inputs).

    Returns
    -------
    out : torch.Tensor
        ``(batch, num_heads, n_q, head_dim_v)``, the query's dtype. As SDPA, a row with no
        admissible key gives NaN (:func:`plsh_fast.nn.biased_sdpa` gives 0 there).
    lse : torch.Tensor
        Only if ``return_lse``: ``(batch, num_heads, n_q)`` in float32 (float64 for float64
        inputs); ``-inf`` on rows with no admissible key.

    Raises
    ------
    TypeError, ValueError
        As :func:`plsh_fast.plsh_attention` for the tensors; bad slopes, positions or scale;
        a ``bias`` of the wrong shape; a non-bool ``return_lse``.

    References
    ----------
    ``torch.nn.functional.scaled_dot_product_attention``; SPEC sections 1 and 7
    (the SDPA peer with a dense bias).
    """
    return_lse = check_bool("return_lse", return_lse)
    V.check_qkv(query, key, value)
    num_heads, n_q, n_k = query.shape[1], query.shape[2], key.shape[2]
    c = check_scale(scale, query.shape[3])
    if bias is None:
        m = check_slopes(slopes, num_heads)
        bias = sdpa_alibi_bias(
            m,
            n_q,
            n_k,
            query_positions=query_positions,
            key_positions=key_positions,
            causal=causal,
            dtype=query.dtype,
            device=query.device,
        )
    if not isinstance(bias, torch.Tensor) or tuple(bias.shape[-3:]) != (num_heads, n_q, n_k):
        got = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
        raise ValueError(f"bias: must be a tensor (num_heads, n_q, n_k), got {got}")
    out = F.scaled_dot_product_attention(
        query,
        expand_kv(key, num_heads),
        expand_kv(value, num_heads),
        attn_mask=bias if bias.dim() == 4 else bias[None],
        scale=c,
    )
    return (out, biased_lse(query, key, bias, scale=c)) if return_lse else out


def chunked_alibi_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    slopes: ArrayLike | torch.Tensor | None = None,
    causal: bool = True,
    scale: float | None = None,
    query_positions: ArrayLike | torch.Tensor | None = None,
    key_positions: ArrayLike | torch.Tensor | None = None,
    chunk_size: int = 512,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Exact ALiBi attention in float64, ``chunk_size`` query rows at a time.

    ``softmax(scale q k^T - m_h |p_i - p_j|) v`` with the causal mask ``p_j <= p_i``; the
    function of :func:`plsh_ref.attention.alibi_attention` in torch, with memory
    ``O(chunk_size * n_k)`` per head instead of ``O(n_q n_k)``. With ``causal`` and sorted
    key positions a chunk reads only the keys up to its largest query position.

    Parameters
    ----------
    query, key, value : torch.Tensor
        As :func:`sdpa_alibi_attention` (any floating dtype; computed in float64).
    slopes, causal, scale, query_positions, key_positions
        As :func:`sdpa_alibi_attention`.
    chunk_size : int
        Query rows per step, ``>= 1``.
    return_lse : bool
        Also return ``lse = log sum_j exp(scale q_i . k_j - m_h |p_i - p_j|)``.

    Returns
    -------
    out : torch.Tensor
        float64 ``(batch, num_heads, n_q, head_dim_v)``; 0 on rows with no admissible key.
    lse : torch.Tensor
        Only if ``return_lse``: float64 ``(batch, num_heads, n_q)``; ``-inf`` on such rows.

    Raises
    ------
    TypeError, ValueError
        As :func:`sdpa_alibi_attention`; ``chunk_size < 1``.

    References
    ----------
    Press et al. (2022); SPEC section 1.
    """
    causal = check_bool("causal", causal)
    return_lse = check_bool("return_lse", return_lse)
    chunk_size = check_int("chunk_size", chunk_size, minimum=1)
    V.check_qkv(query, key, value)
    batch, num_heads, n_q, head_dim = query.shape
    n_k = key.shape[2]
    m = torch.from_numpy(check_slopes(slopes, num_heads)).to(query.device)
    c = check_scale(scale, head_dim)
    qpos, kpos = _positions(n_q, n_k, query_positions, key_positions, query.device)
    q64 = query.double()
    k64 = expand_kv(key, num_heads).double()
    v64 = expand_kv(value, num_heads).double()
    sorted_keys = bool((kpos[1:] >= kpos[:-1]).all()) if n_k > 1 else True
    out = q64.new_zeros(batch, num_heads, n_q, value.shape[3])
    lse = q64.new_full((batch, num_heads, n_q), -math.inf)
    for r0 in range(0, n_q, chunk_size):
        r1 = min(n_q, r0 + chunk_size)
        qp = qpos[r0:r1]
        hi = n_k
        if causal and sorted_keys and n_k:
            hi = int(torch.searchsorted(kpos, qp.max(), right=True))
        if hi == 0:
            continue
        bias = dense_alibi_bias(m, qp, kpos[:hi], causal=causal)
        logits = c * (q64[:, :, r0:r1] @ k64[:, :, :hi].transpose(-1, -2)) + bias
        row_max = logits.amax(dim=-1, keepdim=True)
        empty = torch.isneginf(row_max)
        shift = torch.where(empty, 0.0, row_max)
        p = torch.exp(logits - shift)
        z = p.sum(dim=-1, keepdim=True)
        o = (p @ v64[:, :, :hi]) / torch.where(empty, 1.0, z)
        out[:, :, r0:r1] = torch.where(empty, 0.0, o)
        lse[:, :, r0:r1] = torch.where(empty, -math.inf, shift + torch.log(z))[..., 0]
    return (out, lse) if return_lse else out


def alibi_attention(*args: Any, **kwargs: Any) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Deprecated alias of :func:`chunked_alibi_attention` (one release; DeprecationWarning).

    Renamed because its contract differs from :func:`plsh_ref.attention.alibi_attention`
    (no ``attention_mask``; a ``chunk_size``).

    References
    ----------
    ``docs/changelog.md``, "Unreleased: one API for the attention family" (the rename).
    """
    warn_deprecated("plsh_fast.peers.alibi_attention", "plsh_fast.peers.chunked_alibi_attention")
    return chunked_alibi_attention(*args, **kwargs)


# --------------------------------------------------------------------------- FlexAttention


def _index_positions(query_positions, key_positions):
    """Position lookups for score/mask functions: the index itself when positions are None."""
    qp = None if query_positions is None else torch.as_tensor(query_positions)
    kp = None if key_positions is None else torch.as_tensor(key_positions)

    def q_of(q_idx):
        return q_idx if qp is None else qp[q_idx]

    def k_of(kv_idx):
        return kv_idx if kp is None else kp[kv_idx]

    return q_of, k_of


def alibi_score_mod(
    slopes: torch.Tensor,
    query_positions: torch.Tensor | None = None,
    key_positions: torch.Tensor | None = None,
) -> Callable[..., torch.Tensor]:
    """FlexAttention ``score_mod`` adding the ALiBi bias: ``score - m_h |p_i - p_j|``.

    Parameters
    ----------
    slopes : torch.Tensor, ``(num_heads,)``
        Slopes on the device of the attention (float32 for float32 attention). Read at call
        time, so it may be updated in place.
    query_positions, key_positions : torch.Tensor of int, optional
        Positions indexed by FlexAttention's ``q_idx`` / ``kv_idx``; ``None`` uses the
        indices themselves (self-attention with positions ``0..n-1``).

    Returns
    -------
    callable
        ``score_mod(score, b, h, q_idx, kv_idx)`` for
        ``torch.nn.attention.flex_attention.flex_attention``.

    Raises
    ------
    TypeError
        If ``slopes`` is not a tensor.

    References
    ----------
    Press et al. (2022); the FlexAttention blog's ALiBi ``score_mod`` (PyTorch, 2024).
    """
    if not isinstance(slopes, torch.Tensor):
        raise TypeError(f"slopes: must be a torch.Tensor, got {type(slopes).__name__}")
    q_of, k_of = _index_positions(query_positions, key_positions)

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_of(q_idx) - k_of(kv_idx)).abs()

    return alibi


def causal_mask_mod(
    query_positions: torch.Tensor | None = None, key_positions: torch.Tensor | None = None
) -> Callable[..., torch.Tensor]:
    """FlexAttention ``mask_mod`` of the causal mask: key admissible iff ``p_j <= p_i``.

    Positions as :func:`alibi_score_mod`. Returns ``mask_mod(b, h, q_idx, kv_idx)``.

    References
    ----------
    The ``mask_mod`` of ``torch.nn.attention.flex_attention``; SPEC section 1 (causal:
    ``p_j <= p_i``) and section 7.
    """
    q_of, k_of = _index_positions(query_positions, key_positions)

    def causal(b, h, q_idx, kv_idx):
        return k_of(kv_idx) <= q_of(q_idx)

    return causal


def window_mask_mod(
    window: torch.Tensor,
    *,
    causal: bool = True,
    query_positions: torch.Tensor | None = None,
    key_positions: torch.Tensor | None = None,
) -> Callable[..., torch.Tensor]:
    """FlexAttention ``mask_mod`` of a per-head sliding window of ``window[h]`` tokens.

    Causal: key admissible iff ``0 <= p_i - p_j < window[h]``; otherwise iff
    ``|p_i - p_j| < window[h]``. With :func:`alibi_score_mod` this is windowed ALiBi, the
    peer that attends to as many keys as PLSH attention does.

    Parameters
    ----------
    window : torch.Tensor of int, ``(num_heads,)``
        Window widths in tokens, on the attention's device; read at call time (update in
        place to change the widths without recompiling).
    causal : bool
    query_positions, key_positions
        As :func:`alibi_score_mod`.

    Returns
    -------
    callable
        ``mask_mod(b, h, q_idx, kv_idx)``.

    Raises
    ------
    TypeError
        If ``window`` is not a tensor or ``causal`` not a bool.

    References
    ----------
    The ``mask_mod`` of ``torch.nn.attention.flex_attention``; SPEC section 7 (exact ALiBi
    truncated to a per-head window).
    """
    causal = check_bool("causal", causal)
    if not isinstance(window, torch.Tensor):
        raise TypeError(f"window: must be a torch.Tensor, got {type(window).__name__}")
    q_of, k_of = _index_positions(query_positions, key_positions)

    def windowed(b, h, q_idx, kv_idx):
        d = q_of(q_idx) - k_of(kv_idx)
        if causal:
            return (d >= 0) & (d < window[h])
        return d.abs() < window[h]

    return windowed


def block_mask(
    mask_mod: Callable[..., torch.Tensor],
    n_q: int,
    n_k: int,
    *,
    num_heads: int | None = None,
    batch: int | None = None,
    device: str | torch.device = "cpu",
) -> BlockMask:
    """``create_block_mask(mask_mod, batch, num_heads, n_q, n_k)``: the FlexAttention
    ``BlockMask`` of ``mask_mod`` (128 x 128 blocks).

    ``num_heads=None`` when the mask does not depend on the head (causal), the head count
    for a per-head window; ``batch=None`` shares it over the batch (``num_samples`` for
    :func:`reduction_mask_mod`, whose batch entry is the sample). Evaluates ``mask_mod`` on
    all ``n_q n_k`` pairs (per head and batch entry); for long causal sequences
    :func:`causal_block_mask` and :func:`reduction_block_mask` build masks from block
    indices.

    Raises
    ------
    TypeError, ValueError
        Non-integer or non-positive lengths, head count or batch.

    References
    ----------
    ``create_block_mask`` of ``torch.nn.attention.flex_attention``; SPEC section 7.
    """
    from torch.nn.attention.flex_attention import create_block_mask  # noqa: PLC0415

    n_q = check_int("n_q", n_q, minimum=1)
    n_k = check_int("n_k", n_k, minimum=1)
    if num_heads is not None:
        num_heads = check_int("num_heads", num_heads, minimum=1)
    if batch is not None:
        batch = check_int("batch", batch, minimum=1)
    return create_block_mask(mask_mod, batch, num_heads, n_q, n_k, device=device)


def causal_block_mask(n: int, *, device: str | torch.device = "cpu", block: int = 128) -> BlockMask:
    """Causal ``BlockMask`` for self-attention of length ``n``, built from block indices.

    Query block ``i`` has the full key blocks ``0..i-1`` and the partial (diagonal) block
    ``i``, whose pairs :func:`causal_mask_mod` decides. ``O((n / block)^2)`` work, where
    :func:`block_mask` evaluates all ``n^2`` pairs.

    Raises
    ------
    TypeError, ValueError
        If ``n`` or ``block`` is not an integer ``>= 1``.

    References
    ----------
    ``BlockMask.from_kv_blocks`` of ``torch.nn.attention.flex_attention``; SPEC section 7
    (compiled FlexAttention with a causal block mask).
    """
    from torch.nn.attention.flex_attention import BlockMask  # noqa: PLC0415

    n = check_int("n", n, minimum=1)
    block = check_int("block", block, minimum=1)
    nb = (n + block - 1) // block
    qb = torch.arange(nb, device=device, dtype=torch.int32)
    kv_num = torch.ones((1, 1, nb), dtype=torch.int32, device=device)
    kv_idx = qb[:, None].expand(nb, nb).contiguous()[None, None]
    full_num = qb[None, None].contiguous()
    full_idx = qb[None, :].expand(nb, nb).contiguous()[None, None]
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=block,
        mask_mod=causal_mask_mod(),
        seq_lengths=(n, n),
    )


@cache
def compiled_flex_attention() -> Callable[..., Any]:
    """``torch.compile(flex_attention, dynamic=False)``, compiled once per process.

    Call it as ``compiled_flex_attention()(q, k, v, score_mod=..., block_mask=...)``. The
    first call per shape compiles (about 15 s on the CPU).

    References
    ----------
    ``torch.compile`` of ``flex_attention`` (``torch.nn.attention.flex_attention``);
    SPEC section 7.
    """
    from torch.nn.attention.flex_attention import flex_attention  # noqa: PLC0415

    return torch.compile(flex_attention, dynamic=False)


# ------------------------------------------------------------------------------ reduction


def reduction_mask_mod(bins: torch.Tensor, *, causal: bool = True) -> Callable[..., torch.Tensor]:
    """FlexAttention ``mask_mod`` of the paper's reduction, batch entry ``t`` = sample ``t``.

    Key ``j`` is computed for query ``i`` in batch entry ``t`` iff both sit in the same bin
    of sample ``t`` of head ``h`` (and ``j <= i`` when ``causal``): attention without bias
    inside each block. Self-attention with positions equal to the indices.

    Parameters
    ----------
    bins : torch.Tensor
        int64 ``(num_samples, num_heads, n)``: :func:`plsh_fast._partition.bins` of the
        positions ``0..n-1`` with its first two axes swapped. Read at call time.
    causal : bool

    Returns
    -------
    callable
        ``mask_mod(b, h, q_idx, kv_idx)``.

    Raises
    ------
    TypeError
        If ``bins`` is not a tensor or ``causal`` not a bool.

    References
    ----------
    SPEC section 3, way (a) (the paper's reduction); SPEC section 2 (bins);
    ``proofs_notes/softmax_bias_identity.md``, section 4.
    """
    causal = check_bool("causal", causal)
    if not isinstance(bins, torch.Tensor):
        raise TypeError(f"bins: must be a torch.Tensor, got {type(bins).__name__}")

    def same_bin(b, h, q_idx, kv_idx):
        same = bins[b, h, q_idx] == bins[b, h, kv_idx]
        return same & (kv_idx <= q_idx) if causal else same

    return same_bin


def reduction_block_mask(bins: torch.Tensor, *, block: int = 128) -> BlockMask:
    """Causal ``BlockMask`` of the reduction built from block indices (batch = sample).

    For query block ``qb`` of sample ``t``, the key blocks sharing a bin with the block run
    from the block of the first key in the bin of the block's first query to ``qb``
    (bins are non-decreasing along the positions ``0..n-1``); the pairs inside are decided
    by :func:`reduction_mask_mod` (causal). ``O(num_samples * num_heads * (n / block)^2)``
    index work, where :func:`block_mask` evaluates all pairs.

    Parameters
    ----------
    bins : torch.Tensor
        int64 ``(num_samples, num_heads, n)``, non-decreasing along the last axis.
    block : int
        Block size of FlexAttention (both axes).

    Returns
    -------
    torch.nn.attention.flex_attention.BlockMask
        Batch ``num_samples``, ``num_heads`` heads, ``n x n``.

    Raises
    ------
    TypeError, ValueError
        ``bins`` not a 3-D integer tensor; ``block < 1``.

    References
    ----------
    SPEC section 3, way (a) (the paper's reduction); SPEC section 2 (bins are
    contiguous runs); ``BlockMask.from_kv_blocks`` of ``torch.nn.attention.flex_attention``.
    """
    from torch.nn.attention.flex_attention import BlockMask  # noqa: PLC0415

    if not isinstance(bins, torch.Tensor) or bins.dim() != 3 or bins.is_floating_point():
        raise TypeError("bins: must be an integer tensor (num_samples, num_heads, n)")
    block = check_int("block", block, minimum=1)
    s, h, n = bins.shape
    nb = (n + block - 1) // block
    first_q = torch.arange(nb, device=bins.device) * block
    flat = bins.contiguous().reshape(s * h, n)
    start_key = torch.searchsorted(flat, flat[:, first_q].contiguous(), side="left")
    kb0 = torch.div(start_key, block, rounding_mode="floor").reshape(s, h, nb)
    qb = torch.arange(nb, device=bins.device)[None, None, :]
    num = (qb - kb0 + 1).to(torch.int32)  # (s, H, nb) key blocks per query block
    idx = kb0[..., None] + torch.arange(nb, device=bins.device)[None, None, None, :]
    idx = torch.minimum(idx, qb[..., None]).to(torch.int32)  # entries past num are unused
    return BlockMask.from_kv_blocks(
        num,
        idx,
        BLOCK_SIZE=block,
        mask_mod=reduction_mask_mod(bins, causal=True),
        seq_lengths=(n, n),
    )


def flex_reduction_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *args: Any,
    block_mask: BlockMask | None = None,
    num_samples: int | None = None,
    scale: float | None = None,
    return_lse: bool | None = None,
    flex: Callable[..., Any] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The paper's reduction as one batched FlexAttention call, then the LSE merge.

    ``query``, ``key``, ``value`` (batch 1) are repeated ``num_samples`` times along the
    batch, so that batch entry ``t`` runs sample ``t``'s block attention under
    ``block_mask`` (:func:`reduction_block_mask` or :func:`block_mask` of
    :func:`reduction_mask_mod`); then ``out = sum_t e^{lse_t} out_t / sum_t e^{lse_t}`` and
    ``lse = logsumexp_t(lse_t) - log s`` in float32 (float64 for float64 inputs), as
    :func:`reduction_attention`.

    The merge needs every sample's LSE, so the FlexAttention kernel must return it:
    compiled FlexAttention on the CPU does not (torch 2.13: "torch.compile on CPU only
    supports inference and `return_lse` is not supported yet"), so on the CPU the default
    ``flex`` is refused (pass the eager ``flex_attention``); with ``return_lse`` or without,
    as the output needs the LSEs too.

    Parameters
    ----------
    query, key, value : torch.Tensor
        ``(1, num_heads, n, head_dim)`` (self-attention, positions ``0..n-1``).
    block_mask : BlockMask
        Keyword-only and required (the stand-in of ``partition``): batch ``num_samples``.
    num_samples : int
        Keyword-only and required: the samples ``s >= 1`` of ``block_mask``.
    scale : float, optional
        Default ``1 / sqrt(head_dim)``.
    return_lse : bool
        Also return the merged LSE. Not given, the pair is returned for one more release
        with a :class:`plsh_ref.validation.PLSHDeprecationWarning` (this peer always
        returned it); the output alone from the next release.
    flex : callable, optional
        ``flex_attention`` or :func:`compiled_flex_attention` ``()`` (default: compiled;
        refused on the CPU, see above). The old positional form
        ``flex_reduction_attention(query, key, value, block_mask, num_samples)`` still
        works for one release, with a ``PLSHDeprecationWarning``, and keeps its old
        return, the pair.

    Returns
    -------
    out : torch.Tensor
        ``(1, num_heads, n, head_dim_v)`` in the query's dtype.
    lse : torch.Tensor
        Only if ``return_lse``: ``(1, num_heads, n)`` in float32 (float64 for float64
        inputs).

    Raises
    ------
    TypeError, ValueError
        As :func:`plsh_fast.plsh_attention` for the tensors; a batch other than 1;
        ``block_mask`` or ``num_samples`` missing or given twice; a non-bool
        ``return_lse``; the default ``flex`` on a CPU query (``flex``: no LSE there).

    References
    ----------
    SPEC section 3, way (a) (the paper's reduction, merged by LSE);
    ``proofs_notes/softmax_bias_identity.md``, section 4; SPEC section 7.
    """
    from torch.nn.attention.flex_attention import AuxRequest  # noqa: PLC0415

    if args:
        if len(args) > 2 or block_mask is not None or (len(args) == 2 and num_samples is not None):
            raise TypeError(
                "block_mask: pass block_mask and num_samples once, as the keywords "
                "block_mask= and num_samples="
            )
        warn_deprecated(
            "flex_reduction_attention(query, key, value, block_mask, num_samples) with "
            "positional arguments",
            "flex_reduction_attention(query, key, value, block_mask=..., num_samples=..., "
            "return_lse=True)",
        )
        block_mask, num_samples = (*args, num_samples)[:2]
        if return_lse is None:
            return_lse = True  # the old call form keeps its old return, without a second warning
    if return_lse is not None:
        return_lse = check_bool("return_lse", return_lse)
    V.check_qkv(query, key, value)
    if query.shape[0] != 1:
        raise ValueError(
            f"query: batch must be 1 (samples go along the batch), got {query.shape[0]}"
        )
    if block_mask is None:
        raise TypeError("block_mask: required (a BlockMask of batch num_samples, keyword)")
    if num_samples is None:
        raise TypeError("num_samples: required (the samples of block_mask, keyword)")
    s = check_int("num_samples", num_samples, minimum=1)
    c = check_scale(scale, query.shape[3])
    if flex is None and query.device.type == "cpu":
        raise ValueError(
            "flex: compiled FlexAttention on the CPU returns no LSE, which the reduction's "
            "merge needs; pass flex=torch.nn.attention.flex_attention.flex_attention (eager) "
            "on the CPU"
        )
    flex = compiled_flex_attention() if flex is None else flex
    qs, ks, vs = (t.expand(s, *t.shape[1:]) for t in (query, key, value))
    out_t, aux = flex(qs, ks, vs, block_mask=block_mask, scale=c, return_aux=AuxRequest(lse=True))
    work = working_dtype(query.dtype)
    lse_t = aux.lse.to(work)  # (s, H, n)
    row_max = lse_t.amax(dim=0)
    empty = torch.isneginf(row_max)
    w = torch.exp(lse_t - torch.where(empty, 0.0, row_max))
    z = w.sum(dim=0)
    out = torch.zeros(out_t.shape[1:], dtype=work, device=query.device)
    for t in range(s):  # one sample at a time: no (s, H, n, d) temporary in the work dtype
        out += w[t, ..., None] * out_t[t].to(work)
    out = (out / torch.where(empty, 1.0, z)[..., None]).masked_fill(empty[..., None], 0.0)
    lse = torch.where(empty, -math.inf, row_max + torch.log(z) - math.log(s))
    return select_return((out[None].to(query.dtype), lse[None]), return_lse,
                         "flex_reduction_attention")  # fmt: skip


def reduction_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *args: Any,
    partition: PartitionSample | None = None,
    causal: bool = True,
    scale: float | None = None,
    query_positions: ArrayLike | torch.Tensor | None = None,
    key_positions: ArrayLike | torch.Tensor | None = None,
    return_lse: bool = False,
    backend: str = "auto",
    check_finite: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The paper's reduction: per sample, unbiased attention inside each block; LSE merge.

    For each sample ``t`` of ``partition``, ``(out_t, lse_t)`` is attention restricted to the
    pairs in the same bin of sample ``t`` (times the causal mask), computed by
    :func:`plsh_fast.plsh_attention` with the one-sample partition (its bias ``log(C/1)`` is
    0 or ``-inf``: attention without bias inside each block). The samples are merged by
    their softmax denominators ``exp(lse_t)``::

        out = sum_t exp(lse_t) out_t / sum_t exp(lse_t),
        lse = logsumexp_t(lse_t) - log s,

    which is PLSH attention ``softmax(scale q k^T + log(C / s)) v`` (to rounding) and its LSE.
    The merge runs in the dtype of the returned LSE (float32, float64 for float64 inputs).

    Parameters
    ----------
    query, key, value : torch.Tensor
        As :func:`plsh_fast.plsh_attention`.
    partition : plsh_ref.partition.PartitionSample
        Keyword-only and required: ``num_heads`` heads, ``s`` samples (positional still
        works for one release, with a DeprecationWarning).
    causal, scale, query_positions, key_positions, backend, check_finite
        As :func:`plsh_fast.plsh_attention` (the inputs are checked for NaN/inf once, not
        once per sample).
    return_lse : bool
        Also return the merged LSE.

    Returns
    -------
    out : torch.Tensor
        ``(batch, num_heads, n_q, head_dim_v)``, the query's dtype; 0 on rows with no
        admissible key in any sample.
    lse : torch.Tensor
        Only if ``return_lse``: ``(batch, num_heads, n_q)``; ``-inf`` on such rows.

    Raises
    ------
    TypeError, ValueError
        As :func:`plsh_fast.plsh_attention`; a partition that is not a ``PartitionSample``
        with the query's head count.

    References
    ----------
    Wolfson & Wagner (2026), section 2 (the reduction) and Theorem 2.2; SPEC section 3 (a);
    :func:`plsh_ref.attention.plsh_attention` with ``method="reduction"`` is the float64
    reference.
    """
    from .api import plsh_attention  # noqa: PLC0415 (api imports this package's kernels)

    partition = keyword_argument(
        args,
        "partition",
        partition,
        "peers.reduction_attention(query, key, value, partition) with a positional partition",
        "reduction_attention(query, key, value, partition=...)",
    )
    return_lse = check_bool("return_lse", return_lse)
    V.check_qkv(query, key, value)
    partition = check_partition(partition, query.shape[1])
    if check_bool("check_finite", check_finite):
        V.check_finite(query, key, value)
    outs, lses = [], []
    for t in range(partition.num_samples):
        o, lse = plsh_attention(
            query,
            key,
            value,
            partition=partition.samples(t, t + 1),
            causal=causal,
            scale=scale,
            query_positions=query_positions,
            key_positions=key_positions,
            return_lse=True,
            backend=backend,
            check_finite=False,
        )
        outs.append(o)
        lses.append(lse)
    lse = torch.stack(lses)  # (s, batch, num_heads, n_q)
    row_max = lse.amax(dim=0)
    empty = torch.isneginf(row_max)
    weights = torch.exp(lse - torch.where(empty, 0.0, row_max))  # 0 for empty samples
    z = weights.sum(dim=0)
    weights = weights / torch.where(empty, 1.0, z)
    out = sum(w[..., None] * o.to(lse.dtype) for w, o in zip(weights, outs))
    out = out.masked_fill(empty[..., None], 0.0).to(query.dtype)
    if not return_lse:
        return out
    merged = torch.where(empty, -math.inf, row_max + torch.log(z) - math.log(partition.num_samples))
    return out, merged
