"""The large-logit gradient case shared by ``test_gradient_precision.py`` and
``test_tf32x3_precision.py``: 40 positions, two heads of head_dim 8, ``s = 3``, causal,
logits scaled by ``scale_qk**2`` (standard deviation 1, 9, 64 for 1, 3, 8)."""

from __future__ import annotations

import math

import numpy as np
import torch

from plsh_ref.partition import count_bias, counts, draw_partition
from plsh_ref.testing.tolerance import allowed_error, assert_close_to_reference, max_error

__all__ = [
    "D",
    "N",
    "PARTITION",
    "S",
    "SCALE",
    "bias",
    "dense_gradients",
    "dense_gradients_with_lse",
    "inputs",
    "rule_ratio",
    "two_chunk_gradients",
    "two_chunk_ratios",
    "worst_ratio",
]

N, D, S = 40, 8, 3
PARTITION = draw_partition(np.array([2.0, 9.0]), S, seed=0)
SCALE = 1.0 / math.sqrt(D)


def inputs(scale_qk: float, seed: int = 0, head_dim: int = D, head_dim_v: int | None = None):
    """float64 ``(query, key, value, grad_out)``: ``(1, 2, N, head_dim)`` (query, key) and
    ``(1, 2, N, head_dim_v)`` (value, grad_out; ``None``: ``head_dim``), drawn in that
    order from one generator (equal head sizes: the same draws whatever ``head_dim_v``)."""
    rng = np.random.default_rng(seed)
    widths = (head_dim, head_dim, head_dim_v or head_dim, head_dim_v or head_dim)
    q, k, v, g = (rng.standard_normal((1, 2, N, w)) for w in widths)
    return [torch.from_numpy(x) for x in (q * scale_qk, k * scale_qk, v, g)]


def bias(dtype):
    """The dense ``log(C / s)`` bias ``(1, 2, N, N)`` (``-inf`` where ``C = 0``)."""
    c = counts(PARTITION, np.arange(N), np.arange(N), causal=True)
    return torch.from_numpy(count_bias(c, S))[None].to(dtype)


def dense_gradients(q, k, v, g, dtype):
    """Autograd of plain softmax attention with the dense ``log(C / s)`` bias (scale
    ``head_dim**-0.5``, ``SCALE`` at the case's head_dim)."""
    a, b, w = (x.detach().to(dtype).clone().requires_grad_() for x in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1])
    probs = torch.softmax(a @ b.transpose(-1, -2) * scale + bias(dtype), dim=-1)
    ((probs @ w) * g.to(dtype)).sum().backward()
    return a.grad, b.grad, w.grad


def worst_ratio(grads, q, k, v, g) -> float:
    """Largest ``error / allowed`` of the three gradients (float32 ``grads``) under the
    SPEC section 6 rule, the floor relative to the largest gradient; raises past the rule."""
    ref = dense_gradients(q, k, v, g, torch.float64)
    base = dense_gradients(q, k, v, g, torch.float32)
    floor = max(float(r.abs().max()) for r in ref)
    return max(
        assert_close_to_reference(x.numpy(), r.numpy(), b.numpy(), "float32", floor_scale=floor)
        for x, r, b in zip(grads, ref, base)
    )


def rule_ratio(out, ref, base, floor) -> float:
    """``max|out - ref| / allowed`` of the SPEC section 6 rule (float32), without raising."""
    allowed = allowed_error(ref.numpy(), base.numpy(), "float32", floor_scale=floor)
    return max_error(out.numpy(), ref.numpy())[0] / allowed


def dense_gradients_with_lse(q, k, v, g, g_lse, dtype):
    """Autograd of dense attention (:func:`dense_gradients`) for the loss ``sum(out g) +
    sum(lse g_lse)``."""
    a, b, w = (x.detach().to(dtype).clone().requires_grad_() for x in (q, k, v))
    logits = a @ b.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias(dtype)
    out = torch.softmax(logits, dim=-1) @ w
    lse = torch.logsumexp(logits, dim=-1)
    ((out * g.to(dtype)).sum() + (lse * g_lse.to(dtype)).sum()).backward()
    return a.grad, b.grad, w.grad


def two_chunk_gradients(q, k, v, g):
    """float32 gradients of dense attention (:func:`dense_gradients`) with the logits
    summed from two half-width matmuls, as the Triton kernels' two column chunks: the
    yardstick's arithmetic with another, equally accurate, rounding of the logits."""
    a, b, w = (x.detach().float().clone().requires_grad_() for x in (q, k, v))
    half = q.shape[-1] // 2
    logits = a[..., :half] @ b[..., :half].transpose(-1, -2)
    logits = logits + a[..., half:] @ b[..., half:].transpose(-1, -2)
    probs = torch.softmax(logits / math.sqrt(q.shape[-1]) + bias(torch.float32), dim=-1)
    ((probs @ w) * g.float()).sum().backward()
    return a.grad, b.grad, w.grad


def two_chunk_ratios(scale_qk: float, seeds, head_dim: int = 32) -> list[float]:
    """The rule's worst ``error / allowed`` of the three gradients of
    :func:`two_chunk_gradients` per seed (the seeds' cases stacked along the batch axis,
    each compared on its own, its floor relative to its own largest gradient)."""
    cases = [inputs(scale_qk, s, head_dim=head_dim) for s in seeds]
    q, k, v, g = (torch.cat(x) for x in zip(*cases))
    grads, ref, base = (
        f(q, k, v, g)
        for f in (
            two_chunk_gradients,
            lambda *x: dense_gradients(*x, torch.float64),
            lambda *x: dense_gradients(*x, torch.float32),
        )
    )
    ratios = []
    for i in range(len(cases)):
        floor = max(float(r[i].abs().max()) for r in ref)
        ratios.append(max(rule_ratio(x[i], r[i], b[i], floor) for x, r, b in zip(grads, ref, base)))
    return ratios
