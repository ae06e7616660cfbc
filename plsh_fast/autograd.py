"""The ``torch.autograd.Function`` behind :func:`plsh_fast.plsh_attention`.

Forward and backward dispatch to the CPU path (:mod:`plsh_fast.cpu`) or to the Triton
kernels (:mod:`plsh_fast.triton_forward`, :mod:`plsh_fast.triton_backward`); all four
functions share one signature. The backward uses the saved output and LSE
(``proofs_notes/backward.md``).

A gradient flowing into the returned LSE is supported on both backends without a second
kernel: ``d lse_i / d S_ij = P_ij``, and the backends compute ``dS = P o (dO V^T - delta)``
with ``delta_i = sum_k dO_ik O_ik``. Appending a column of ones to ``V``, a column of zeros
to ``O`` and the LSE gradient ``g`` as a column of ``dO`` turns this into
``dS = P o (dO V^T - delta + g 1^T)``, exactly the sum of both contributions; the extra
column of the value gradient is dropped.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

__all__ = ["PLSHAttentionFunction", "kernels"]


def kernels(backend: str):
    """``(forward, backward)`` functions of ``backend`` ("cpu" or "triton"), imported lazily."""
    if backend == "cpu":
        from .cpu import plsh_backward_cpu, plsh_forward_cpu

        return plsh_forward_cpu, plsh_backward_cpu
    if backend == "triton":
        from .triton_backward import plsh_backward_triton
        from .triton_forward import plsh_forward_triton

        return plsh_forward_triton, plsh_backward_triton
    raise ValueError(f"backend: must be 'cpu' or 'triton', got {backend!r}")


class PLSHAttentionFunction(torch.autograd.Function):
    """``(out, lse) = PLSH attention(query, key, value)`` with gradients for q, k, v.

    ``apply(query, key, value, pitch, offset, query_positions, key_positions, scale,
    causal, backend)``; arguments as :func:`plsh_fast.cpu.plsh_forward_cpu`, already
    validated. No gradient flows to the partition or the positions. Not twice
    differentiable.
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
        scale,
        causal,
        backend,
    ):
        forward, _ = kernels(backend)
        out, lse = forward(
            query, key, value, pitch, offset, query_positions, key_positions, scale, causal
        )
        ctx.save_for_backward(
            query, key, value, out, lse, pitch, offset, query_positions, key_positions
        )
        ctx.scale, ctx.causal, ctx.backend = scale, causal, backend
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, grad_lse):
        query, key, value, out, lse, pitch, offset, qpos, kpos = ctx.saved_tensors
        _, backward = kernels(ctx.backend)
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        grad_out = grad_out.to(out.dtype)
        augmented = grad_lse is not None and bool((grad_lse != 0).any())
        if augmented:
            g = torch.where(torch.isfinite(lse), grad_lse, 0).to(out.dtype)
            value = torch.cat([value, value.new_ones(*value.shape[:3], 1)], dim=-1)
            out = torch.cat([out, out.new_zeros(*out.shape[:3], 1)], dim=-1)
            grad_out = torch.cat([grad_out, g[..., None]], dim=-1)
        grad_query, grad_key, grad_value = backward(
            query, key, value, out, lse, grad_out, pitch, offset, qpos, kpos, ctx.scale, ctx.causal
        )
        if augmented:
            grad_value = grad_value[..., :-1]
        needs = ctx.needs_input_grad
        return (
            grad_query if needs[0] else None,
            grad_key if needs[1] else None,
            grad_value if needs[2] else None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        )
