"""Row plumbing of the CPU path: inputs in sorted, padded per-head form and row gathers.

The forward and the backward run on rows sorted by position (package docstring, step 1)
and padded to a multiple of the tile height (step 2); tile groups gather their rows and key
windows along dim 0 of each batch row's contiguous block (step 3).
"""

from __future__ import annotations

import torch

__all__ = ["gather", "pad_last", "per_head", "sorted_rows"]


def sorted_rows(x: torch.Tensor, order, rows: int, dtype) -> torch.Tensor:
    """``x`` (B, H, n, d) in ``dtype``, rows sorted by ``order`` and zero-padded to ``rows``."""
    x = x.to(dtype)
    if order is not None:
        x = x.index_select(2, order)
    if rows > x.shape[2]:
        x = torch.nn.functional.pad(x, (0, 0, 0, rows - x.shape[2]))
    return x


def per_head(x: torch.Tensor) -> list[torch.Tensor]:
    """Contiguous ``(B, n, d)`` slices of every head of ``x`` (B, H, n, d)."""
    return [x[:, h].contiguous() for h in range(x.shape[1])]


def gather(rows_tensor: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``rows_tensor[:, idx]`` for ``rows_tensor`` (B, n, ...) and ``idx`` (G, W): (B, G, W, ...).

    One ``index_select`` along dim 0 of each batch row's contiguous ``(n, ...)`` block,
    like ``Chunk.add_keys`` (:mod:`plsh_fast.cpu._chunks`) for ``index_add_``: torch's CPU
    kernels are faster along dim 0 of a contiguous tensor than along dim 1 of the batched
    one (``index_add_`` measurably so; see the CPU notes in ``benchmarks/README.md``).
    """
    b, _, *rest = rows_tensor.shape
    flat = idx.reshape(-1)
    if b == 1:
        return rows_tensor[0].index_select(0, flat).view(1, *idx.shape, *rest)
    out = rows_tensor.new_empty(b, flat.numel(), *rest)
    for i in range(b):
        torch.index_select(rows_tensor[i], 0, flat, out=out[i])
    return out.view(b, *idx.shape, *rest)


def pad_last(x: torch.Tensor, size: int) -> torch.Tensor:
    """``x`` zero-padded along its last dim to ``size`` (``x`` itself when already so)."""
    return x if x.shape[-1] == size else torch.nn.functional.pad(x, (0, size - x.shape[-1]))
