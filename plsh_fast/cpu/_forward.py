"""The CPU forward (package docstring, steps 1 to 8 in order): :func:`plsh_forward_cpu`.

Plans (or reuses the plan), sorts and pads the inputs per head (:func:`prepare`), runs the
tile kernel on every tile group in the worker pool, writes each group's rows of the output
and the LSE, keeps the plan when it may, and puts the rows back in the caller's order.
"""

from __future__ import annotations

import math

import torch

from ..dense import working_dtype
from . import _band as band_rules
from . import _plan_cache as plan_cache
from . import _planning as planning
from . import _pool as pool
from . import _tiles as tiles
from ._rows import per_head, sorted_rows

__all__ = ["empty_result", "plsh_forward_cpu", "prepare"]


def prepare(query, key, value, pitch, offset, query_positions, key_positions, causal, plan):
    """The plan and the per-head sorted (and, for queries, padded) compute-dtype inputs."""
    dtype = working_dtype(query.dtype)
    if plan is None:
        plan = planning.plan_cpu(pitch, offset, query_positions, key_positions, causal, dtype)
    q = per_head(sorted_rows(query, plan.query_order, plan.padded_rows, dtype))
    k = per_head(sorted_rows(key, plan.key_order, 0, dtype))
    v = per_head(sorted_rows(value, plan.key_order, 0, dtype))
    return plan, q, k, v


def empty_result(query, value, n_q):
    """Output 0 and LSE ``-inf`` of a call without queries, keys or batch rows."""
    b, h = query.shape[:2]
    out = torch.zeros(b, h, n_q, value.shape[-1], dtype=query.dtype)
    lse = torch.full((b, h, n_q), -math.inf, dtype=working_dtype(query.dtype))
    return out, lse


def plsh_forward_cpu(
    query,
    key,
    value,
    pitch,
    offset,
    query_positions,
    key_positions,
    scale: float,
    causal: bool,
    *,
    plan=None,
):
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
    plan : object, optional
        :func:`plsh_fast.cpu.plan_cpu` of the same pitch, offset, positions and causal
        flag (built here when omitted).

    Returns
    -------
    out : torch.Tensor
        ``(batch, num_heads, n_q, head_dim_v)`` in the query dtype; 0 on empty rows.
    lse : torch.Tensor
        ``(batch, num_heads, n_q)``, float32 (float64 for float64 inputs):
        ``log sum_j exp(scale q_i . k_j) C_ij / s``; ``-inf`` on empty rows.

    References
    ----------
    Wolfson & Wagner (2026), Theorem 2.2; SPEC section 3 (b); :mod:`plsh_fast.cpu`.
    """
    batch, num_heads, n_q, _ = query.shape
    if n_q == 0 or key.shape[2] == 0 or batch == 0:
        return empty_result(query, value, n_q)
    plan, q, k, v = prepare(
        query, key, value, pitch, offset, query_positions, key_positions, causal, plan
    )
    out, lse = _tile_groups_forward(plan, q, k, v, num_heads // key.shape[1], value, scale)
    plan_cache.remember(plan)
    out, lse = out[:, :, :n_q], lse[:, :, :n_q]
    if plan.query_inverse is not None:
        out, lse = out[:, :, plan.query_inverse], lse[:, :, plan.query_inverse]
    return out.to(query.dtype), lse


def _tile_groups_forward(plan, q, k, v, group: int, value, scale: float):
    """Output and LSE ``(B, H, padded rows, dv)``, ``(B, H, padded rows)`` in sorted row
    order: the tile kernel on every tile group, in the worker pool (steps 3 to 7)."""
    batch, num_heads = q[0].shape[0], len(q)
    dtype, rows = plan.dtype, plan.padded_rows
    out = torch.zeros(batch, num_heads, rows, value.shape[-1], dtype=dtype)
    lse = torch.full((batch, num_heads, rows), -math.inf, dtype=dtype)
    workers = torch.get_num_threads()

    specs = planning.chunk_specs(plan, workers)
    # Band heads (step 4) read their key windows as strided views of the keys and
    # values padded by ``pad`` zero rows at each end (keys there have count 0).
    pad, padded = band_rules.padded_kv(plan, specs, group, k, v)

    def work(spec, _worker):
        chunk = plan.build(spec)
        h, hk = chunk.head, chunk.head // group
        keys, values = band_rules.key_windows(chunk, k[hk], v[hk], padded.get(hk), pad)
        o, l = tiles.tiles_forward(
            chunk.take_rows(q[h]), keys, values, chunk.bias.expand(batch, -1, -1, -1), scale
        )
        o = o.masked_fill(chunk.empty[..., None], 0.0)
        l = l.masked_fill(chunk.empty, -math.inf)
        chunk.put_rows(out[:, h], o)  # rows of different chunks are disjoint
        chunk.put_rows(lse[:, h], l)

    pool.run_parallel(specs, work, workers, dynamic=True)  # disjoint rows: any worker
    return out, lse
