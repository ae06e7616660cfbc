"""PLSH attention as ``torch.library`` custom operators, for ``torch.compile``.

``torch.ops.plsh.attention`` and ``torch.ops.plsh.attention_backward`` wrap
:func:`plsh_fast._autograd.attention_forward` / :func:`plsh_fast._autograd.attention_backward`
(the same kernels as eager mode). Each has a fake (meta) implementation that only
computes output shapes, so Dynamo and AOTAutograd trace a model through them without
running them, with symbolic sequence lengths (one compiled graph serves every length),
and ``register_autograd`` connects the two. :func:`plsh_fast.plsh_attention` calls the
operator when :func:`torch.compiler.is_compiling` is true and the eager
:class:`plsh_fast._autograd.PLSHAttentionFunction` otherwise; the results are the same.
The dense route's operators, ``torch.ops.plsh.dense_counts`` and
``torch.ops.plsh.log_count_table``, live beside the cache they read, in
:mod:`plsh_fast.dense` (:func:`plsh_fast.dense.dense_counts_op`,
:func:`plsh_fast.dense.log_count_table_op`).

Everything the kernels need is a tensor or a constant: the partition's ``pitch`` and
``offset`` (float64 tensors on the query's device), the positions (int64 ``(n,)`` or
``(batch, n)``), the optional key-padding mask; ``scale``, ``causal`` and ``backend`` are
constants of the graph (changing them compiles again).

The forward also returns a one-element int64 handle (value 0) to its batch groups and their
CPU plans (block ranges and tile groups), kept host-side in :data:`KEPT_GROUPS` under the
handle's identity; the handle is saved
for the backward, which reuses the plans as the eager backward does. Every output has a
shape known from the inputs' shapes, so Dynamo traces the operator with or without
``fullgraph=True`` (an output of data-dependent length is a graph break unless
``fullgraph=True``: it split every HF model at each attention call). An entry lives as long
as its handle tensor (a finaliser removes it), so a forward whose graph is dropped keeps
nothing; a backward that finds no entry for its handle object (a compiler copied it, say)
plans again: the same result, recomputed.

Differences from eager mode: the checks that read tensor values in
:func:`plsh_fast.plsh_attention` (finiteness, position and bin range, partition values)
are skipped while compiling; the mask's 0/1 values and per-sequence position ranges are
still checked, at run time, inside the operator (:func:`plsh_fast._padding.group_batch`).

References
----------
PyTorch custom operators (``torch.library.custom_op``, ``register_fake``,
``register_autograd``); SPEC section 5.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from ._autograd import attention_backward as _backward_impl
from ._autograd import attention_forward as _forward_impl
from .dense import working_dtype

__all__ = [
    "KEPT_GROUPS",
    "KERNEL_LAWS",
    "attention",
    "attention_backward",
    "kernel_law_id",
    "training_partition",
]

#: id(handle) -> (weak reference to the handle, the forward's batch groups with their plans)
KEPT_GROUPS: dict[int, tuple] = {}


def _keep_groups(groups) -> torch.Tensor:
    """A fresh ``(1,)`` int64 handle (value 0) to ``groups`` in :data:`KEPT_GROUPS`.

    Keyed by the handle's identity, not its value, so that two calls on the same inputs give
    equal outputs (``torch.library.opcheck``); the entry goes when the handle is freed.
    """
    handle = torch.zeros(1, dtype=torch.int64)
    key = id(handle)
    KEPT_GROUPS[key] = (weakref.ref(handle), groups)
    weakref.finalize(handle, KEPT_GROUPS.pop, key, None)
    return handle


def _kept_groups(handle: torch.Tensor):
    """The groups of ``handle``; ``None`` (the backward plans again) when it is not the
    forward's own handle object (copied by a compiler, or freed and its id reused)."""
    entry = KEPT_GROUPS.get(id(handle))
    return entry[1] if entry is not None and entry[0]() is handle else None


@torch.library.custom_op("plsh::attention", mutates_args=())
def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pitch: torch.Tensor,
    offset: torch.Tensor,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scale: float,
    causal: bool,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, lse, stats, handle)``: :func:`plsh_fast._autograd.attention_forward` as an operator.

    Arguments validated by :func:`plsh_fast.plsh_attention` (shapes there). Returns
    ``out`` ``(batch, num_heads, n_q, head_dim_v)`` in the query dtype, ``lse``
    ``(batch, num_heads, n_q)`` float32 (float64 for float64 inputs), the softmax
    statistics for the backward (Triton: float32 ``(batch, num_heads, n_q, 2)``, row maximum
    and ``log2`` of the row sum, :func:`plsh_fast.triton.plsh_forward_triton`; CPU:
    float32 ``(0,)``, unused) and the ``(1,)`` int64 CPU handle of the forward's groups and
    plans in :data:`KEPT_GROUPS`. ``stats`` and ``handle`` are for the backward, not
    differentiable.
    """
    out, lse, stats, groups = _forward_impl(
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
    plans = _keep_groups(groups)
    if stats is None:
        stats = torch.zeros(0, dtype=torch.float32, device=query.device)
    return (
        out.contiguous(),
        lse.to(working_dtype(query.dtype)).contiguous(),
        stats.contiguous(),
        plans,
    )


@attention.register_fake
def _attention_fake(
    query, key, value, pitch, offset, query_positions, key_positions, attention_mask, scale,
    causal, backend,
):  # fmt: skip
    batch, num_heads, n_q, _ = query.shape
    out = query.new_empty(batch, num_heads, n_q, value.shape[3])
    lse = query.new_empty(batch, num_heads, n_q, dtype=working_dtype(query.dtype))
    shape = (batch, num_heads, n_q, 2) if backend == "triton" else (0,)
    stats = query.new_empty(shape, dtype=torch.float32)
    handle = torch.empty(1, dtype=torch.int64)
    return out, lse, stats, handle


@torch.library.custom_op("plsh::attention_backward", mutates_args=())
def attention_backward(
    grad_out: torch.Tensor,
    grad_lse: torch.Tensor | None,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    stats: torch.Tensor,
    pitch: torch.Tensor,
    offset: torch.Tensor,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    attention_mask: torch.Tensor | None,
    plans: torch.Tensor,
    scale: float,
    causal: bool,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(grad_query, grad_key, grad_value)``: :func:`plsh_fast._autograd.attention_backward`
    with the forward's ``stats`` (an empty one: none) and the groups of its handle ``plans``
    (recomputed, with fresh plans, when the handle has no entry)."""
    grads = _backward_impl(
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
        scale,
        causal,
        backend,
        groups=_kept_groups(plans),
        stats=stats if stats.numel() else None,
    )
    # Contiguous, as the fake implementation promises, and never aliasing an input.
    return tuple(
        g.clone(memory_format=torch.contiguous_format)
        if _aliases(g, query, key, value)
        else g.contiguous()
        for g in grads
    )


def _aliases(t: torch.Tensor, *others: torch.Tensor) -> bool:
    """Whether ``t`` shares storage with one of ``others`` (operators may not alias inputs)."""
    ptr = t.untyped_storage().data_ptr()
    return any(ptr == o.untyped_storage().data_ptr() for o in others if o.numel())


@attention_backward.register_fake
def _attention_backward_fake(grad_out, grad_lse, query, key, value, *_):
    return tuple(
        torch.empty_like(t, memory_format=torch.contiguous_format) for t in (query, key, value)
    )


def _setup_context(ctx, inputs, output):
    (query, key, value, pitch, offset, qpos, kpos, mask, scale, causal, backend) = inputs
    out, lse, stats, plans = output
    ctx.mark_non_differentiable(stats, plans)
    saved = (query, key, value, out, lse, stats, pitch, offset, qpos, kpos, mask, plans)
    ctx.save_for_backward(*saved)
    ctx.scale, ctx.causal, ctx.backend = scale, causal, backend
    # An unused output then gets ``None`` instead of a zeros tensor: no LSE column is
    # appended when only ``out`` is used (the eager Function does the same).
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_out, grad_lse, _grad_stats, _grad_plans):
    query, key, value, out, lse, stats, pitch, offset, qpos, kpos, mask, plans = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    gq, gk, gv = attention_backward(
        grad_out,
        grad_lse,
        query,
        key,
        value,
        out,
        lse,
        stats,
        pitch,
        offset,
        qpos,
        kpos,
        mask,
        plans,
        ctx.scale,
        ctx.causal,
        ctx.backend,
    )
    return gq, gk, gv, None, None, None, None, None, None, None, None


attention.register_autograd(_backward, setup_context=_setup_context)


#: the per-head kernel tuples that modules draw their training partitions from, indexed by the
#: ``kernels`` argument of ``plsh::training_partition`` (an operator takes no Python objects)
KERNEL_LAWS: list[tuple] = []


def kernel_law_id(kernels: tuple) -> int:
    """The index of ``kernels`` (one :class:`plsh_ref.kernels.DistanceKernel` per head) in
    :data:`KERNEL_LAWS`, appended on first use; equal tuples share an index.

    Parameters
    ----------
    kernels : tuple of plsh_ref.kernels.DistanceKernel
        Checked by the caller (:class:`plsh_fast.nn.PLSHAttention`).

    Returns
    -------
    int
        ``>= 0``; what ``training_partition(..., kernels=...)`` receives.
    """
    for i, law in enumerate(KERNEL_LAWS):
        if law == kernels:
            return i
    KERNEL_LAWS.append(tuple(kernels))
    return len(KERNEL_LAWS) - 1


@torch.library.custom_op("plsh::training_partition", mutates_args=("draw_counter",))
def training_partition(
    slopes: torch.Tensor,
    draw_counter: torch.Tensor,
    seed: int,
    like: torch.Tensor,
    sampler: str = "iid",
    group_size: int = 1,
    kernels: int = -1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pitch, offset)`` of training draw ``k = draw_counter`` of a module; ``k += 1``.

    The draw of :meth:`plsh_fast.nn.PLSHAttention.training_partition`:
    :func:`plsh_ref.partition.draw_partition` with ``sigma = 1 / slopes``,
    ``like.shape[1]`` samples and seed :func:`plsh_ref.partition.derived_seed` ``(seed, k)``,
    drawn on the host (numpy, SPEC section 2) and returned as float64 tensors on
    ``like``'s device. ``draw_counter`` is an int64 CPU scalar tensor, advanced in place;
    as an operator the draw runs inside a compiled graph, once per call, and the counter
    never becomes a constant of the graph. ``sampler``/``group_size``: those of the module
    (``group_size`` ignored for ``"iid"``). ``kernels >= 0``: draw from the kernels
    ``KERNEL_LAWS[kernels]`` (:func:`kernel_law_id`) in place of ``sigma`` (``slopes``
    unused); ``-1`` (default): ALiBi's ``sigma``.
    """
    from plsh_ref.partition import derived_seed, draw_partition

    from ._partition import partition_tensors

    draw = int(draw_counter)
    draw_counter.add_(1)
    law: Any = list(KERNEL_LAWS[kernels]) if kernels >= 0 else 1.0 / slopes.detach().cpu().numpy()
    kw: dict[str, Any] = {} if sampler == "iid" else {"sampler": sampler, "group_size": group_size}
    sample = draw_partition(law, like.shape[1], derived_seed(seed, draw), **kw)
    return partition_tensors(sample, like.device)


@training_partition.register_fake
def _training_partition_fake(
    slopes, draw_counter, seed, like, sampler="iid", group_size=1, kernels=-1
):
    return torch.empty_like(like, dtype=torch.float64), torch.empty_like(like, dtype=torch.float64)
