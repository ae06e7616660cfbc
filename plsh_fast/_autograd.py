"""Backend dispatch over the groups of a (padded) batch, and the eager autograd Function.

:func:`attention_forward` and :func:`attention_backward` run one backend's kernels
(:mod:`plsh_fast.cpu` or :mod:`plsh_fast.triton`; both share one signature) on every group of :func:`plsh_fast._padding.group_batch` and
scatter the results back. :class:`PLSHAttentionFunction` wraps them for eager autograd:
the forward's groups and the CPU path's key-range plan (sorted positions, tiles, block
ranges, tile groups) are kept on the autograd context and reused by the backward instead
of being recomputed. Under ``torch.compile`` the same two functions run inside the
``plsh::attention`` custom operator (:mod:`plsh_fast._ops`), which keeps the forward's
groups with their plans host-side under a handle tensor and hands them to
:func:`attention_backward` as ``groups``: they are reused all the same.

The Triton backward reads the forward's softmax statistics (float32 ``(batch, heads,
n_q, 2)``: row maximum and ``log2`` of the row sum), kept on the context / returned by the
operator, not the rounded float32 LSE; the CPU backward needs neither
(``proofs_notes/backward.md``, section 3).

A gradient flowing into the returned LSE is supported on both backends without a second
kernel: ``d lse_i / d S_ij = P_ij``. Both backwards take it as ``grad_lse``; the Triton
kernels compute ``dS = P o (dO V^T - delta)`` with ``delta_i = sum_k dO_ik O_ik``, and
the LSE gradient ``g`` is subtracted from ``delta``, giving ``dS = P o (dO V^T - delta +
g 1^T)``, exactly the sum of both contributions (no host check of whether it is zero, which
would synchronise the device).

References
----------
``proofs_notes/backward.md`` (gradients from the saved output and statistics); SPEC
section 5 (padded batches).
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from ._padding import group_batch
from .dense import working_dtype

__all__ = [
    "PLSHAttentionFunction",
    "attention_backward",
    "attention_forward",
    "kernels",
]


def kernels(backend: str):
    """``(forward, backward, planner)`` of ``backend`` ("cpu" or "triton"), imported lazily.

    ``planner`` builds the plan that ``forward``/``backward`` accept as ``plan=`` (the CPU
    path's :func:`plsh_fast.cpu.plan_cpu`), or is ``None`` (the Triton forward plans on the
    device and returns its plan with ``return_plan=True``; the backward reuses it).
    """
    if backend == "cpu":
        from .cpu import plan_cpu, plsh_backward_cpu, plsh_forward_cpu

        return plsh_forward_cpu, plsh_backward_cpu, plan_cpu
    if backend == "triton":
        from .triton import plsh_backward_triton, plsh_forward_triton

        return plsh_forward_triton, plsh_backward_triton, None
    raise ValueError(f"backend: must be 'cpu' or 'triton', got {backend!r}")


def attention_forward(
    query,
    key,
    value,
    pitch,
    offset,
    query_positions,
    key_positions,
    attention_mask,
    scale: float,
    causal: bool,
    backend: str,
):
    """``(out, lse, stats, groups)``: PLSH attention of a (padded) batch.

    Arguments as :func:`plsh_fast.cpu.plsh_forward_cpu`, validated, except that positions
    may be ``(batch, n)`` and ``attention_mask`` ``(batch, n_k)`` or ``None``
    (:mod:`plsh_fast._padding`). ``groups`` carry the plans for :func:`attention_backward`.
    ``stats``: Triton, the forward's float32 ``(batch, num_heads, n_q, 2)`` softmax
    statistics for the backward (row maximum and ``log2`` of the row sum,
    :func:`plsh_fast.triton.plsh_forward_triton`); CPU, ``None`` (its backward
    recomputes each row's softmax inside the row's tile).
    """
    forward, _, planner = kernels(backend)
    batch, num_heads, n_q, _ = query.shape
    groups = group_batch(query_positions, key_positions, attention_mask, batch)

    def run(group, q, k, v):
        kwargs = {}
        if planner is not None:
            group.plan = planner(
                pitch, offset, group.query_positions, group.key_positions, causal, q.dtype
            )
            kwargs["plan"] = group.plan
        else:  # Triton: the forward returns its statistics and plan for the backward
            kwargs["return_plan"] = kwargs["return_stats"] = True
        result = forward(
            q,
            k,
            v,
            pitch,
            offset,
            group.query_positions,
            group.key_positions,
            scale,
            causal,
            **kwargs,
        )
        if planner is None:
            o, l_, st, group.plan = result  # plan None when the rows had to be sorted
            return o, l_, st
        return (*result, None)

    if len(groups) == 1 and groups[0].whole:
        out, lse, stats = run(groups[0], query, key, value)
        return out, lse, stats, groups
    out = query.new_zeros(batch, num_heads, n_q, value.shape[3])
    lse = torch.full(
        (batch, num_heads, n_q), -math.inf, dtype=working_dtype(query.dtype), device=query.device
    )
    stats = None
    if planner is None:
        stats = torch.full(
            (batch, num_heads, n_q, 2), -math.inf, dtype=torch.float32, device=query.device
        )
    for group in groups:
        if group.query_positions.numel() == 0 or group.key_positions.numel() == 0:
            continue  # nothing admissible: output 0, LSE -inf as initialised
        o, l, st = run(
            group,
            group.take(query, group.queries),
            group.take(key, group.keys),
            group.take(value, group.keys),
        )
        group.put(out, o, group.queries)
        group.put(lse, l, group.queries)
        if stats is not None:
            group.put(stats, st, group.queries)
    return out, lse, stats, groups


def attention_backward(
    query,
    key,
    value,
    out,
    lse,
    grad_out,
    grad_lse,
    pitch,
    offset,
    query_positions,
    key_positions,
    attention_mask,
    scale: float,
    causal: bool,
    backend: str,
    groups=None,
    stats=None,
):
    """``(grad_query, grad_key, grad_value)`` of :func:`attention_forward`.

    ``grad_out`` or ``grad_lse`` may be ``None`` (no gradient flows into that output).
    ``stats``: the forward's (Triton; ``None`` on CPU, or to recompute the probabilities
    from the rounded ``lse``, :func:`plsh_fast.triton.plsh_backward_triton`).
    ``groups``: the forward's (with their plans); recomputed, with fresh plans, when
    ``None``. Pad query
    rows, pad keys and keys no query reaches get exactly zero gradient.
    """
    _, backward, _ = kernels(backend)
    if groups is None:
        groups = group_batch(query_positions, key_positions, attention_mask, query.shape[0])
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    grad_out = grad_out.to(out.dtype)
    g = None if grad_lse is None else torch.where(torch.isfinite(lse), grad_lse, 0)

    def run(group, *tensors, stats=None, grad_lse=None):
        kwargs = {} if group.plan is None else {"plan": group.plan}
        if stats is not None:
            kwargs["stats"] = stats
        if grad_lse is not None:
            kwargs["grad_lse"] = grad_lse
        return backward(
            *tensors,
            pitch,
            offset,
            group.query_positions,
            group.key_positions,
            scale,
            causal,
            **kwargs,
        )

    if len(groups) == 1 and groups[0].whole:
        grad_query, grad_key, grad_value = run(
            groups[0], query, key, value, out, lse, grad_out, stats=stats, grad_lse=g
        )
    else:
        grad_query, grad_key, grad_value = (torch.zeros_like(t) for t in (query, key, value))
        for group in groups:
            if group.query_positions.numel() == 0 or group.key_positions.numel() == 0:
                continue
            gq, gk, gv = run(
                group,
                group.take(query, group.queries),
                group.take(key, group.keys),
                group.take(value, group.keys),
                group.take(out, group.queries),
                group.take(lse, group.queries),
                group.take(grad_out, group.queries),
                stats=None if stats is None else group.take(stats, group.queries),
                grad_lse=None if g is None else group.take(g, group.queries),
            )
            group.put(grad_query, gq, group.queries)
            group.put(grad_key, gk, group.keys)
            group.put(grad_value, gv, group.keys)
    return grad_query, grad_key, grad_value


class PLSHAttentionFunction(torch.autograd.Function):
    """``(out, lse) = PLSH attention(query, key, value)`` with gradients for q, k, v (eager).

    ``apply(query, key, value, pitch, offset, query_positions, key_positions,
    attention_mask, scale, causal, backend)``; arguments as :func:`attention_forward`,
    already validated. No gradient flows to the partition, the positions or the mask.
    Not twice differentiable.
    """

    @staticmethod
    def forward(
        ctx,
        query,
        key,
        value,
        pitch,
        offset,
        query_positions,
        key_positions,
        attention_mask,
        scale,
        causal,
        backend,
    ):
        out, lse, stats, groups = attention_forward(
            query,
            key,
            value,
            pitch,
            offset,
            query_positions,
            key_positions,
            attention_mask,
            scale,
            causal,
            backend,
        )
        ctx.save_for_backward(query, key, value, out, lse, stats, pitch, offset)
        ctx.groups = groups
        ctx.scale, ctx.causal, ctx.backend = scale, causal, backend
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, grad_lse):
        query, key, value, out, lse, stats, pitch, offset = ctx.saved_tensors
        grads = attention_backward(
            query,
            key,
            value,
            out,
            lse,
            grad_out,
            grad_lse,
            pitch,
            offset,
            None,
            None,
            None,
            ctx.scale,
            ctx.causal,
            ctx.backend,
            groups=ctx.groups,
            stats=stats,
        )
        needs = ctx.needs_input_grad
        return (*(g if need else None for g, need in zip(grads, needs)),) + (None,) * 8
