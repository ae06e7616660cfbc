"""Vectorised torch CPU path of PLSH attention: forward and backward in ``O(n * window)`` memory.

PLSH attention is softmax attention with the additive bias ``log C_ij``, where
``C_ij = #{t : bin_t(p_i) = bin_t(p_j)}`` counts the hash functions that put query ``i``
and key ``j`` in the same bin (times the causal mask); SPEC section 3 (b), Wolfson &
Wagner (2026), Theorem 2.2. This module computes it without ever forming an ``n x n``
matrix:

1. Keys (and queries) are sorted by position. Bins are non-decreasing in the position,
   so for every sample ``t`` the keys sharing query ``i``'s bin are one contiguous index
   range ``[start_t(i), end_t(i))``, found by ``searchsorted``; the causal cut clips
   ``end_t(i)``.
2. Queries are cut into tiles of ``T`` rows (``T`` chosen per head from its pitches).
   A tile reaches the key range ``[min start, max end)`` over its rows and samples: the
   union of its blocks, which also skips every causally masked key tile.
3. Tiles of one head whose windows have about the same width are stacked into one batched
   matrix product (the window is padded to a common width ``W``; padded keys get count 0).
4. Inside a window the counts are a difference array: ``+1`` at ``start_t(i)``, ``-1`` at
   ``end_t(i)`` for every sample, then a cumulative sum along the keys: ``O(s)`` work per
   row plus one pass over the window, instead of ``s`` comparisons per pair.
5. Softmax with the bias ``log C`` and its LSE are computed in float32 (float64 for float64
   inputs); the backward recomputes the probabilities from the saved LSE
   (``proofs_notes/backward.md``).

Memory is ``O(batch * chunk)`` for the tiles in flight plus ``O(H s n)`` int64 for the
block boundaries; the chunk size bounds the working set (:data:`CHUNK_ELEMENTS`).
Parallelism over batch, heads-in-a-chunk and tiles comes from torch's intra-op threads.

The two functions have the signature of the Triton path
(:func:`plsh_fast.triton_forward.plsh_forward_triton`,
:func:`plsh_fast.triton_backward.plsh_backward_triton`), so that
:mod:`plsh_fast.autograd` dispatches uniformly. They trust their arguments: validation
happens in :func:`plsh_fast.plsh_attention`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .partition import bins

__all__ = ["CHUNK_ELEMENTS", "plsh_backward_cpu", "plsh_forward_cpu", "tile_size"]

#: Upper bound on ``batch * tiles * T * W`` logits held at once (float32: 4 bytes each).
#: About 2 MB per intermediate keeps a chunk near the cache and the memory small.
CHUNK_ELEMENTS = 1 << 19

_MIN_TILE = 16
_MAX_TILE = 128


def tile_size(mean_pitch: float, n_q: int) -> int:
    """Query-tile height for a head whose pitches average ``mean_pitch`` tokens.

    A power of two in ``[16, 128]`` near a quarter of the mean pitch (``sigma / 2``): the
    window of a tile is its height plus the largest left extent of its blocks (about
    ``sigma (ln s + 0.58)``), so a height well below ``sigma`` wastes little, while tiny
    tiles make the batched products inefficient. Never taller than ``n_q`` needs.
    """
    target = max(mean_pitch / 4.0, 1.0)
    t = 1 << int(round(math.log2(target)))
    t = min(max(t, _MIN_TILE), _MAX_TILE)
    return max(1, min(t, 1 << max(0, (max(n_q, 1) - 1).bit_length())))


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _order(positions: torch.Tensor):
    """Stable sorting permutation and its inverse, or ``(None, None)`` if already sorted."""
    if positions.numel() < 2 or bool((positions[1:] >= positions[:-1]).all()):
        return None, None
    order = torch.sort(positions, stable=True).indices
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return order, inverse


@dataclass
class _Chunk:
    head: int
    rows: torch.Tensor       # (G, T) indices into the padded sorted query rows
    keys: torch.Tensor       # (G, W) indices into the sorted keys (clamped; extra keys have count 0)
    log_counts: torch.Tensor  # (G, T, W) log C in the compute dtype (-inf where C = 0)


@dataclass
class _Plan:
    """Sort orders, tiles and block ranges shared by the forward and the backward."""

    query_order: torch.Tensor | None
    query_inverse: torch.Tensor | None
    key_order: torch.Tensor | None
    key_inverse: torch.Tensor | None
    n_q: int
    n_k: int
    tiles: list[int]               # tile height per head
    start: torch.Tensor            # (H, s, n_q) int64, sorted coordinates
    end: torch.Tensor              # (H, s, n_q) int64, end > start or end == start (empty)
    dtype: torch.dtype

    def chunks(self, batch: int):
        """Yield the work of every head as :class:`_Chunk` objects of bounded size."""
        for h, tile in enumerate(self.tiles):
            yield from self._head_chunks(h, tile, batch)

    def _head_chunks(self, h: int, tile: int, batch: int):
        s = self.start.shape[1]
        num_tiles = -(-self.n_q // tile)
        pad = num_tiles * tile - self.n_q
        st = torch.nn.functional.pad(self.start[h], (0, pad))  # padded rows: empty ranges
        en = torch.nn.functional.pad(self.end[h], (0, pad))
        st = st.view(s, num_tiles, tile)
        en = en.view(s, num_tiles, tile)
        nonempty = en > st
        big = torch.iinfo(torch.int64).max
        lo = torch.where(nonempty, st, big).amin(dim=(0, 2))
        hi = torch.where(nonempty, en, -1).amax(dim=(0, 2))
        width = (hi - lo).clamp_(min=0)
        # Round widths up (at most 1/8 extra) so that tiles fall into few buckets.
        gran = torch.clamp(torch.pow(2, torch.floor(torch.log2(width.clamp(min=1).double())))
                           .long() // 8, min=16)
        padded = torch.where(width > 0, -(-width // gran) * gran, 0)
        for w in torch.unique(padded).tolist():
            if w == 0:
                continue
            ids = torch.nonzero(padded == w).flatten()
            per_chunk = max(1, CHUNK_ELEMENTS // (batch * tile * w))
            for c0 in range(0, ids.numel(), per_chunk):
                sel = ids[c0:c0 + per_chunk]
                yield self._make_chunk(h, tile, w, sel, lo[sel], st[:, sel], en[:, sel])

    def _make_chunk(self, h, tile, w, sel, lo, st, en) -> _Chunk:
        g = sel.numel()
        rows = sel[:, None] * tile + torch.arange(tile)
        keys = (lo[:, None] + torch.arange(w)).clamp_(max=max(self.n_k - 1, 0))
        # Difference array of the counts: +1 at start, -1 at end (empty ranges cancel).
        empty = en <= st
        rel_st = torch.where(empty, 0, st - lo[None, :, None])
        rel_en = torch.where(empty, 0, en - lo[None, :, None])
        diff = torch.zeros(g, tile, w + 1, dtype=self.dtype)
        ones = torch.ones((), dtype=self.dtype).expand(g, tile, rel_st.shape[0])
        diff.scatter_add_(2, rel_st.permute(1, 2, 0), ones)
        diff.scatter_add_(2, rel_en.permute(1, 2, 0), -ones)
        log_counts = diff[..., :w].cumsum_(-1).log_()
        return _Chunk(h, rows, keys, log_counts)


def _plan(pitch, offset, query_positions, key_positions, causal: bool, dtype) -> _Plan:
    query_order, query_inverse = _order(query_positions)
    key_order, key_inverse = _order(key_positions)
    qpos = query_positions if query_order is None else query_positions[query_order]
    kpos = key_positions if key_order is None else key_positions[key_order]
    bq = bins(pitch, offset, qpos)
    bk = bins(pitch, offset, kpos).contiguous()
    # Bins are non-decreasing along sorted positions (floor of a monotone correctly
    # rounded map), so each bin is one contiguous run of sorted keys.
    start = torch.searchsorted(bk, bq, right=False)
    end = torch.searchsorted(bk, bq, right=True)
    if causal:
        cut = torch.searchsorted(kpos, qpos, right=True)  # keys with p_key <= p_query
        end = torch.minimum(end, cut)
    end = torch.maximum(end, start)
    mean_pitch = pitch.mean(dim=1).tolist()
    n_q, n_k = qpos.numel(), kpos.numel()
    tiles = [tile_size(p, n_q) for p in mean_pitch]
    return _Plan(query_order, query_inverse, key_order, key_inverse, n_q, n_k, tiles,
                 start, end, dtype)


def _sorted_rows(x: torch.Tensor, order, tile_pad: int, dtype) -> torch.Tensor:
    """``x`` (B, H, n, d) in the compute dtype, rows sorted by ``order``, padded by ``tile_pad`` rows."""
    x = x.to(dtype)
    if order is not None:
        x = x.index_select(2, order)
    if tile_pad:
        x = torch.nn.functional.pad(x, (0, 0, 0, tile_pad))
    return x


def _gather(rows_tensor: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``rows_tensor[:, idx]`` for ``rows_tensor`` (B, n, d) and ``idx`` (G, W): (B, G, W, d)."""
    b, _, d = rows_tensor.shape
    return rows_tensor.index_select(1, idx.reshape(-1)).view(b, *idx.shape, d)


def _empty_result(query, value, n_q):
    b, h = query.shape[:2]
    lse_dtype = _compute_dtype(query.dtype)
    out = torch.zeros(b, h, n_q, value.shape[-1], dtype=query.dtype)
    lse = torch.full((b, h, n_q), -math.inf, dtype=lse_dtype)
    return out, lse


def plsh_forward_cpu(query, key, value, pitch, offset, query_positions, key_positions,
                     scale: float, causal: bool):
    """PLSH attention forward on CPU: ``softmax(scale q k^T + log C) v`` and its LSE.

    Parameters
    ----------
    query : torch.Tensor
        ``(batch, num_heads, n_q, head_dim)``, float16/bfloat16/float32/float64, any strides.
    key : torch.Tensor
        ``(batch, num_heads_kv, n_k, head_dim)``; ``num_heads % num_heads_kv == 0``.
    value : torch.Tensor
        ``(batch, num_heads_kv, n_k, head_dim_v)``.
    pitch, offset : torch.Tensor
        float64 ``(num_heads, num_samples)``: the partition sample.
    query_positions, key_positions : torch.Tensor
        int64 ``(n_q,)``, ``(n_k,)`` absolute positions (any order, repeats allowed).
    scale : float
        Logit scale.
    causal : bool
        Key ``j`` admissible for query ``i`` iff ``p_j <= p_i``.

    Returns
    -------
    out : torch.Tensor
        ``(batch, num_heads, n_q, head_dim_v)`` in the query dtype; 0 on empty rows.
    lse : torch.Tensor
        ``(batch, num_heads, n_q)``, float32 (float64 for float64 inputs):
        ``log sum_j exp(scale q_i . k_j) C_ij / s``; ``-inf`` on empty rows.

    References
    ----------
    Wolfson & Wagner (2026), Theorem 2.2; SPEC section 3 (b); module docstring.
    """
    batch, num_heads, n_q, _ = query.shape
    n_k = key.shape[2]
    if n_q == 0 or n_k == 0 or batch == 0:
        return _empty_result(query, value, n_q)
    dtype = _compute_dtype(query.dtype)
    group = num_heads // key.shape[1]
    plan = _plan(pitch, offset, query_positions, key_positions, causal, dtype)
    log_s = math.log(pitch.shape[1])
    max_tile = max(plan.tiles)
    pad = -(-n_q // max_tile) * max_tile - n_q
    q = _sorted_rows(query, plan.query_order, pad, dtype) * scale
    k = _sorted_rows(key, plan.key_order, 0, dtype)
    v = _sorted_rows(value, plan.key_order, 0, dtype)
    out = torch.zeros(batch, num_heads, n_q + pad, value.shape[-1], dtype=dtype)
    lse = torch.full((batch, num_heads, n_q + pad), -math.inf, dtype=dtype)
    for chunk in plan.chunks(batch):
        h, hk = chunk.head, chunk.head // group
        qt = _gather(q[:, h], chunk.rows)                       # (B, G, T, d)
        kw = _gather(k[:, hk], chunk.keys)                      # (B, G, W, d)
        vw = _gather(v[:, hk], chunk.keys)                      # (B, G, W, dv)
        logits = torch.matmul(qt, kw.transpose(-1, -2)).add_(chunk.log_counts)
        row_max = logits.amax(dim=-1, keepdim=True)
        row_max = torch.where(torch.isfinite(row_max), row_max, 0.0)
        probs = logits.sub_(row_max).exp_()
        denom = probs.sum(dim=-1, keepdim=True)
        o = torch.matmul(probs, vw).div_(torch.where(denom > 0, denom, 1.0))
        rows = chunk.rows.reshape(-1)
        out[:, h].index_copy_(1, rows, o.flatten(1, 2))
        lse[:, h].index_copy_(1, rows, (row_max + denom.log()).flatten(1, 3) - log_s)
    out, lse = out[:, :, :n_q], lse[:, :, :n_q]
    if plan.query_inverse is not None:
        out, lse = out[:, :, plan.query_inverse], lse[:, :, plan.query_inverse]
    return out.to(query.dtype), lse


def plsh_backward_cpu(query, key, value, out, lse, grad_out, pitch, offset, query_positions,
                      key_positions, scale: float, causal: bool):
    """Gradients of PLSH attention on CPU from the saved output and LSE.

    With ``P_ij = exp(scale q_i . k_j + log C_ij - log s - lse_i)`` (the attention
    probabilities), ``dP = dO V^T``, ``delta_i = sum_k dO_ik O_ik`` and
    ``dS = P o (dP - delta)``: ``dQ = scale dS K``, ``dK = scale dS^T Q``, ``dV = P^T dO``
    (``proofs_notes/backward.md``). Keys that no query can reach get exactly zero
    gradient; empty rows contribute nothing.

    Parameters
    ----------
    query, key, value, pitch, offset, query_positions, key_positions, scale, causal
        As :func:`plsh_forward_cpu`.
    out, lse : torch.Tensor
        The forward's results.
    grad_out : torch.Tensor
        ``(batch, num_heads, n_q, head_dim_v)``, gradient of the loss w.r.t. ``out``.

    Returns
    -------
    (grad_query, grad_key, grad_value) : tuple of torch.Tensor
        Shapes and dtypes of ``query``, ``key``, ``value``; ``grad_key`` and ``grad_value``
        are summed over the query heads sharing a kv head (grouped-query attention).
    """
    batch, num_heads, n_q, _ = query.shape
    n_k = key.shape[2]
    dtype = _compute_dtype(query.dtype)
    if n_q == 0 or n_k == 0 or batch == 0:
        return torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)
    group = num_heads // key.shape[1]
    plan = _plan(pitch, offset, query_positions, key_positions, causal, dtype)
    log_s = math.log(pitch.shape[1])
    max_tile = max(plan.tiles)
    pad = -(-n_q // max_tile) * max_tile - n_q
    q = _sorted_rows(query, plan.query_order, pad, dtype)
    k = _sorted_rows(key, plan.key_order, 0, dtype)
    v = _sorted_rows(value, plan.key_order, 0, dtype)
    d_out = _sorted_rows(grad_out, plan.query_order, pad, dtype)
    o = _sorted_rows(out, plan.query_order, pad, dtype)
    delta = (d_out * o).sum(dim=-1)                             # (B, H, n_q + pad)
    # Row shift lse + log s; empty rows (lse = -inf) get +inf so that P = 0 there.
    shift = _sorted_rows(lse[..., None], plan.query_order, pad, dtype)[..., 0] + log_s
    shift = torch.where(torch.isfinite(shift), shift, math.inf)
    grad_q = torch.zeros_like(q)
    grad_k = torch.zeros_like(k)
    grad_v = torch.zeros_like(v)
    for chunk in plan.chunks(batch):
        h, hk = chunk.head, chunk.head // group
        rows = chunk.rows.reshape(-1)
        keys = chunk.keys.reshape(-1)
        qt = _gather(q[:, h], chunk.rows)
        kw = _gather(k[:, hk], chunk.keys)
        vw = _gather(v[:, hk], chunk.keys)
        dot = _gather(d_out[:, h], chunk.rows)
        row_shift = shift[:, h][:, chunk.rows][..., None]       # (B, G, T, 1)
        row_delta = delta[:, h][:, chunk.rows][..., None]
        probs = (torch.matmul(qt, kw.transpose(-1, -2)).mul_(scale)
                 .add_(chunk.log_counts).sub_(row_shift).exp_())
        d_probs = torch.matmul(dot, vw.transpose(-1, -2))
        d_logits = d_probs.sub_(row_delta).mul_(probs)
        grad_q[:, h].index_copy_(1, rows, torch.matmul(d_logits, kw).flatten(1, 2) * scale)
        grad_k[:, hk].index_add_(1, keys, torch.matmul(d_logits.transpose(-1, -2), qt)
                                 .flatten(1, 2), alpha=scale)
        grad_v[:, hk].index_add_(1, keys, torch.matmul(probs.transpose(-1, -2), dot).flatten(1, 2))
    grad_q = grad_q[:, :, :n_q]
    if plan.query_inverse is not None:
        grad_q = grad_q[:, :, plan.query_inverse]
    if plan.key_inverse is not None:
        grad_k, grad_v = grad_k[:, :, plan.key_inverse], grad_v[:, :, plan.key_inverse]
    return grad_q.to(query.dtype), grad_k.to(key.dtype), grad_v.to(value.dtype)
