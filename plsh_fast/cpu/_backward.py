"""The CPU backward: :func:`plsh_backward_cpu` (package docstring, step 7, on the plan of
steps 1 to 6).

On the forward's tile groups, each row's softmax is recomputed whole in its tile
(:func:`plsh_fast.cpu._tiles.tiles_backward`); query gradients are written per group (rows
are disjoint), key and value gradients are summed into one accumulator per worker (key
windows overlap), dealt round-robin so that the sums have a fixed order, then added up.
"""

from __future__ import annotations

import torch

from . import _band as band_rules
from . import _planning as planning
from . import _pool as pool
from . import _tiles as tiles
from ._forward import prepare
from ._rows import per_head, sorted_rows

__all__ = ["plsh_backward_cpu"]


def plsh_backward_cpu(
    query,
    key,
    value,
    out,
    lse,
    grad_out,
    pitch,
    offset,
    query_positions,
    key_positions,
    scale: float,
    causal: bool,
    *,
    plan=None,
    grad_lse=None,
):
    """Gradients of PLSH attention on CPU, each row's softmax recomputed in its tile.

    With the attention probabilities ``P_i = softmax_j(scale q_i . k_j + log(C_ij / s))``
    (recomputed whole: a query tile's key window holds all of its rows' admissible keys),
    ``dP = dO V^T``, ``delta_i = sum_j P_ij dP_ij - g_i`` (``g``: ``grad_lse``) and
    ``dS = P o (dP - delta)``: ``dQ = scale dS K``, ``dK = scale dS^T Q``, ``dV = P^T dO``
    (``proofs_notes/backward.md``). Neither the saved LSE nor the saved output is read:
    the float32 gradients keep the accuracy of the dense float32 yardstick at any logit
    magnitude (``tests/fast/test_gradient_precision.py``). Keys that no query can reach get
    exactly zero gradient; empty rows contribute nothing.

    Parameters
    ----------
    query, key, value, pitch, offset, query_positions, key_positions, scale, causal, plan
        As :func:`plsh_fast.cpu.plsh_forward_cpu` (pass the forward's ``plan`` to skip
        planning again).
    out, lse : torch.Tensor
        The forward's results (the signature of the Triton path's backward; not read).
    grad_out : torch.Tensor
        ``(batch, num_heads, n_q, head_dim_v)``, gradient of the loss w.r.t. ``out``.
    grad_lse : torch.Tensor or None
        ``(batch, num_heads, n_q)``, gradient of the loss w.r.t. ``lse`` (0 on rows
        without an admissible key), or ``None``.

    Returns
    -------
    (grad_query, grad_key, grad_value) : tuple of torch.Tensor
        Shapes and dtypes of ``query``, ``key``, ``value``; ``grad_key`` and ``grad_value``
        are summed over the query heads sharing a kv head (grouped-query attention).
    """
    batch, num_heads, n_q, _ = query.shape
    if n_q == 0 or key.shape[2] == 0 or batch == 0:
        return torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)
    plan, q, k, v = prepare(
        query, key, value, pitch, offset, query_positions, key_positions, causal, plan
    )
    dtype, rows = plan.dtype, plan.padded_rows
    d_out = per_head(sorted_rows(grad_out, plan.query_order, rows, dtype))
    if grad_lse is not None:
        grad_lse = sorted_rows(grad_lse[..., None], plan.query_order, rows, dtype)[..., 0]
    grad_q, grad_k, grad_v, pad = _tile_groups_backward(
        plan, q, k, v, d_out, grad_lse, num_heads // key.shape[1], query, key, value, scale
    )
    grad_k, grad_v = grad_k[:, :, pad : pad + plan.n_k], grad_v[:, :, pad : pad + plan.n_k]
    grad_q = grad_q[:, :, :n_q]
    if plan.query_inverse is not None:
        grad_q = grad_q[:, :, plan.query_inverse]
    if plan.key_inverse is not None:
        grad_k, grad_v = grad_k[:, :, plan.key_inverse], grad_v[:, :, plan.key_inverse]
    return grad_q.to(query.dtype), grad_k.to(key.dtype), grad_v.to(value.dtype)


def _tile_groups_backward(plan, q, k, v, d_out, grad_lse, group, query, key, value, scale):
    """``(grad_q, grad_k, grad_v, pad)`` in sorted order: query gradients of the padded
    rows, key and value gradients with ``pad`` zero rows at each end (band windows), from
    :func:`plsh_fast.cpu._tiles.tiles_backward` on every tile group in the worker pool."""
    batch, num_heads = query.shape[:2]
    dtype, rows = plan.dtype, plan.padded_rows
    grad_q = torch.zeros(batch, num_heads, rows, query.shape[-1], dtype=dtype)
    workers = torch.get_num_threads()
    specs = planning.chunk_specs(plan, workers)
    workers = max(1, min(workers, len(specs)))
    # Band chunks (step 4) read strided windows of the padded keys and values and
    # add their key gradients into accumulators padded the same way.
    pad, padded = band_rules.padded_kv(plan, specs, group, k, v)
    # Key windows of different chunks overlap: one key/value accumulator per worker.
    size = plan.n_k + 2 * pad
    grad_k = [
        torch.zeros(batch, key.shape[1], size, key.shape[-1], dtype=dtype) for _ in range(workers)
    ]
    grad_v = [
        torch.zeros(batch, key.shape[1], size, value.shape[-1], dtype=dtype) for _ in range(workers)
    ]

    def work(spec, worker):
        chunk = plan.build(spec)
        h, hk = chunk.head, chunk.head // group
        keys, values = band_rules.key_windows(chunk, k[hk], v[hk], padded.get(hk), pad)
        gq, gk, gv = tiles.tiles_backward(
            chunk.take_rows(d_out[h]),
            chunk.take_rows(q[h]),
            keys,
            values,
            chunk.bias.expand(batch, -1, -1, -1),
            scale,
            chunk.empty,
            None if grad_lse is None else chunk.take_rows(grad_lse[:, h]),
        )
        chunk.put_rows(grad_q[:, h], gq)  # disjoint rows
        for acc, grad in ((grad_k[worker][:, hk], gk), (grad_v[worker][:, hk], gv)):
            if chunk.band is not None:
                band_rules.add_windows(chunk, acc, grad, pad)
            else:
                chunk.add_keys(acc[:, pad : pad + plan.n_k], grad)

    pool.run_parallel(specs, work, workers)
    grad_k, grad_v = sum(grad_k[1:], grad_k[0]), sum(grad_v[1:], grad_v[0])
    return grad_q, grad_k, grad_v, pad
