"""The tile kernels of the CPU path (package docstring, step 7).

Softmax with the count bias and its LSE on stacked tiles: torch's fused CPU
flash-attention operator (``aten::_scaled_dot_product_flash_attention_for_cpu``) behind a
version check and a once-per-process self-check (:func:`fused_tiles_available`), else the
plain torch formulas (``USE_FUSED_TILES``); and the backward's plain formulas, each row's
softmax recomputed whole (:func:`tiles_backward`).
"""

from __future__ import annotations

import threading

import torch

from . import _settings as settings
from ._rows import pad_last

__all__ = ["fused_tiles_available", "tiles_backward", "tiles_forward"]

_FUSED_OK: bool | None = None  # result of the version check and self-check, once
_FUSED_LOCK = threading.Lock()
_FUSED = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def fused_tiles_available() -> bool:
    """Whether the forward's tiles run on torch's private fused CPU flash-attention operator.

    ``aten::_scaled_dot_product_flash_attention_for_cpu`` is private: its presence,
    signature, LSE convention and mask semantics may change between torch releases. It is
    used only when ``plsh_fast.cpu.USE_FUSED_TILES`` is set, the operator exists, the torch version
    lies in ``plsh_fast.cpu.FUSED_TORCH_VERSIONS`` (the releases it was verified on), and a
    self-check passes once per process: on a small seeded problem with masked (``-inf``)
    and finite bias entries its output and LSE must match the plain torch implementation
    to float32 rounding. Otherwise the plain implementation runs (same formulas, package
    docstring, step 7). The self-check uses its own generator (the global RNG is untouched) and runs
    under ``no_grad``. The backward always runs the plain formulas (its fused operator
    recomputes the probabilities from the float32 LSE; :func:`plsh_fast.cpu.plsh_backward_cpu`).
    """
    global _FUSED_OK
    if not settings.USE_FUSED_TILES or _FUSED is None:
        return False
    if _FUSED_OK is None:
        with _FUSED_LOCK:
            if _FUSED_OK is None:
                low, high = settings.FUSED_TORCH_VERSIONS
                _FUSED_OK = low <= _torch_version() < high and _fused_self_check()
    return _FUSED_OK


def _fused_self_check() -> bool:
    """The fused operator agrees with :func:`_plain_tiles_forward` (see above)."""
    g = torch.Generator().manual_seed(20261201)
    q, k, v = (torch.randn(1, 2, m, 8, generator=g) for m in (5, 7, 7))
    bias = torch.log(torch.randint(0, 4, (1, 2, 5, 7), generator=g).float() / 3.0)
    bias[..., 0] = 0.0  # every row has an admissible key
    try:
        with torch.no_grad():
            out, lse = _fused_tiles_forward(q, k, v, bias, 0.3)
            ref_out, ref_lse = _plain_tiles_forward(q, k, v, bias, 0.3)
    except (RuntimeError, TypeError, ValueError):
        return False
    pairs = [(out, ref_out), (lse, ref_lse)]
    return all(a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in pairs)


def tiles_forward(q, k, v, bias, scale):
    """The tile kernel of the CPU forward: ``softmax(scale q k^T + bias) v`` and its LSE.

    Step 7: torch's fused CPU flash-attention operator when
    :func:`fused_tiles_available`, otherwise the plain torch formulas. Public so that
    ``benchmarks/cpu_bench.py`` can time the kernel alone on the plan's tile groups (the
    bound on what the rest of the path can gain). Trusts its arguments (no validation).

    Parameters
    ----------
    q : torch.Tensor
        ``(B, G, T, d)``: ``G`` query tiles of ``T`` rows, float32 or float64.
    k, v : torch.Tensor
        ``(B, G, W, d)`` and ``(B, G, W, dv)``: each tile's key window, same dtype.
    bias : torch.Tensor
        ``(B, G, T, W)`` additive logit bias (``log(C / s)``, ``-inf`` where ``C = 0``).
    scale : float
        Logit scale.

    Returns
    -------
    out, lse : torch.Tensor
        ``(B, G, T, dv)`` and ``(B, G, T)`` (natural log), in the dtype of ``q``. Rows
        whose bias is ``-inf`` everywhere give meaningless values (callers reset them).

    References
    ----------
    SPEC section 3 (b); ``proofs_notes/backward.md`` (the LSE convention).
    """
    if fused_tiles_available():
        return _fused_tiles_forward(q, k, v, bias, scale)
    return _plain_tiles_forward(q, k, v, bias, scale)


def _fused_tiles_forward(q, k, v, bias, scale):
    width = max(q.shape[-1], v.shape[-1])
    out, lse = _FUSED(
        pad_last(q, width),
        pad_last(k, width),
        pad_last(v, width),
        attn_mask=bias,
        scale=scale,
    )
    return out[..., : v.shape[-1]], lse.to(q.dtype)


def _plain_tiles_forward(q, k, v, bias, scale):
    logits = torch.matmul(q, k.transpose(-1, -2)).mul_(scale).add_(bias)
    row_max = logits.amax(dim=-1, keepdim=True)
    probs = logits.sub_(row_max).exp_()
    denom = probs.sum(dim=-1, keepdim=True)
    out = torch.matmul(probs, v).div_(denom)
    return out, (row_max + denom.log())[..., 0]


def tiles_backward(grad_out, q, k, v, bias, scale, empty, grad_lse=None):
    """Gradients of :func:`tiles_forward`: ``(B, G, T, d)``, ``(B, G, W, d)``, ``(B, G, W, dv)``.

    ``empty`` (``(G, T)`` bool, broadcast over the batch) marks rows whose bias is ``-inf``
    everywhere; ``grad_lse`` (``(B, G, T)`` or ``None``) is the gradient with respect to
    the tile rows' LSE. A tile's key window holds every admissible key of each of its rows
    (step 2), so each row's softmax is recomputed whole, as the dense float32
    yardstick of SPEC section 6 does: ``P = softmax(x)`` (``x - max`` exact near the
    maximum; ``exp(x - lse)`` would carry the float32 rounding of ``lse``, about
    ``|lse| 2^-24``, into every probability of the row) and ``dS = P o (dP - delta + g)``
    with ``delta_i = sum_j P_ij dP_ij`` (the softmax backward; ``dO_i . O_i`` from the
    saved output would leave its rounding in ``dS`` of saturated rows, where the exact
    ``dP_ij - delta_i`` nearly vanishes), ``proofs_notes/backward.md``. Empty rows get
    probability 0 (``softmax`` of an all ``-inf`` row is NaN).
    """
    logits = torch.matmul(q, k.transpose(-1, -2)).mul_(scale).add_(bias)
    probs = torch.softmax(logits, dim=-1).masked_fill_(empty[..., None], 0.0)
    d_logits = torch.matmul(grad_out, v.transpose(-1, -2)).mul_(probs)  # P o dP
    delta = d_logits.sum(dim=-1, keepdim=True)
    if grad_lse is not None:
        delta = delta.sub_(grad_lse[..., None])
    d_logits = d_logits.sub_(probs * delta)
    grad_q = torch.matmul(d_logits, k).mul_(scale)
    grad_k = torch.matmul(d_logits.transpose(-1, -2), q).mul_(scale)
    grad_v = torch.matmul(probs.transpose(-1, -2), grad_out)
    return grad_q, grad_k, grad_v
