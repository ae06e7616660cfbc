"""Gradients at large logits: a known limitation of the LSE-recompute backward.

Both backward passes (Triton kernels, CPU path with torch's fused tile kernel) recompute
the probabilities from the saved float32 LSE, ``P = C exp(x - lse - log s)``, as
FlashAttention does. ``lse`` is about as large as the row's largest logit, so its float32
rounding (``|lse| 2**-24``) is a relative error of every ``P`` of the row, which the
dense yardstick of SPEC section 6 (a max-subtracted softmax in float32) does not have.
From logits of standard deviation about 9 the float32 gradients exceed the tolerance rule
(a fresh-user review, 2026-12-01: ratio 1.07 on the Triton path, 1.39 on the CPU path,
for ``grad_value`` at the case below with ``scale_qk = 3``); at standard deviation 64
(``scale_qk = 8``) every gradient fails. The forward output and LSE pass at every
magnitude. A fix keeps the LSE in two float32 parts (row maximum and ``log2`` of the
row sum) for the backward; not built yet. The failing case is a strict xfail, so the test
flips when it is fixed; unit-scale logits are the passing control.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plsh_fast import plsh_attention
from plsh_ref.partition import count_bias, counts, draw_partition
from plsh_ref.testing.tolerance import assert_close_to_reference

N, D, S = 40, 8, 3
PARTITION = draw_partition(np.array([2.0, 9.0]), S, seed=0)


def _inputs(scale_qk: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    q, k, v, g = (rng.standard_normal((1, 2, N, D)) for _ in range(4))
    return [torch.from_numpy(x) for x in (q * scale_qk, k * scale_qk, v, g)]


def _dense_gradients(q, k, v, g, dtype):
    """Autograd of plain softmax attention with the dense ``log(C / s)`` bias."""
    c = counts(PARTITION, np.arange(N), np.arange(N), causal=True)
    bias = torch.from_numpy(count_bias(c, S))[None].to(dtype)
    a, b, w = (x.detach().to(dtype).clone().requires_grad_() for x in (q, k, v))
    probs = torch.softmax(a @ b.transpose(-1, -2) / D**0.5 + bias, dim=-1)
    ((probs @ w) * g.to(dtype)).sum().backward()
    return a.grad, b.grad, w.grad


def _worst_ratio(backend: str, scale_qk: float) -> float:
    q, k, v, g = _inputs(scale_qk)
    ref = _dense_gradients(q, k, v, g, torch.float64)
    base = _dense_gradients(q, k, v, g, torch.float32)
    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    out = plsh_attention(*leaves, partition=PARTITION, causal=True, backend=backend)
    (out * g.float()).sum().backward()
    floor = max(float(r.abs().max()) for r in ref)
    return max(
        assert_close_to_reference(
            x.grad.numpy(), r.numpy(), b.numpy(), "float32", floor_scale=floor
        )
        for x, r, b in zip(leaves, ref, base)
    )


def _backends():
    return [
        "cpu",
        pytest.param("triton", marks=pytest.mark.triton),
    ]


def _load_triton(backend):
    if backend == "triton":
        import _triton_interp  # sets TRITON_INTERPRET=1 and reloads the kernels interpreted

        _triton_interp.load("triton_forward")
        _triton_interp.load("triton_backward")


@pytest.mark.parametrize("backend", _backends())
def test_gradients_at_unit_scale_logits_pass_the_rule(backend):
    _load_triton(backend)
    assert _worst_ratio(backend, 1.0) <= 1.0


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="the backward recomputes P from a float32 LSE whose rounding grows with |lse| "
    "(module docstring); logits of standard deviation 64 fail the tolerance rule",
)
def test_gradients_at_large_logits_pass_the_rule(backend):
    _load_triton(backend)
    _worst_ratio(backend, 8.0)
