"""Masked tile loads and stores of the Triton kernels (``@triton.jit`` helpers).

Every query, key, value, output and gradient tile that the forward kernel
(:mod:`plsh_fast.triton._forward`) and the backward kernels
(:mod:`plsh_fast.triton._backward`) read or write goes through :func:`load_tile` or
:func:`store_tile`: the element ``[r, c]`` of a tile sits at ``base + rows[r] * row_stride +
cols[c] * col_stride``, rows and columns outside the tensor (padding of the last tile, the
padded columns of a ``head_dim`` that is not a power of two) are masked, read as 0 and never
written. Triton inlines the helpers, so a call compiles to the expression written out in
the kernel (the same addresses, summed in the same order; the AOT compile table,
``benchmarks/aot_report.py``, is the check).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["load_tile", "store_tile"]


@triton.jit
def load_tile(
    base,
    rows,
    row_stride,
    cols,
    col_stride,
    row_valid,
    col_valid,
    UPCAST: tl.constexpr,
    TRANSPOSED: tl.constexpr = False,
):
    """The tile ``base[rows, cols]`` (``(len(rows), len(cols))``), masked, 0 outside.

    ``row_valid`` / ``col_valid``: the rows and columns inside the tensor (boolean vectors
    of the shapes of ``rows`` / ``cols``). ``TRANSPOSED``: the transposed tile, shape
    ``(len(cols), len(rows))`` (keys along the columns: the B operand of ``q k^T``),
    loaded directly in that layout. ``UPCAST``: converted to float32 (bfloat16 in the
    interpreter, whose numpy has no bfloat16 arithmetic); else the element type of ``base``.
    """
    if TRANSPOSED:
        x = tl.load(
            base + rows[None, :] * row_stride + cols[:, None] * col_stride,
            mask=row_valid[None, :] & col_valid[:, None],
            other=0.0,
        )
    else:
        x = tl.load(
            base + rows[:, None] * row_stride + cols[None, :] * col_stride,
            mask=row_valid[:, None] & col_valid[None, :],
            other=0.0,
        )
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def store_tile(base, rows, row_stride, cols, col_stride, row_valid, col_valid, x):
    """``base[rows, cols] = x`` (masked: only the valid rows and columns are written), cast
    to the element type of ``base``; ``x`` has shape ``(len(rows), len(cols))``."""
    tl.store(
        base + rows[:, None] * row_stride + cols[None, :] * col_stride,
        x.to(base.dtype.element_ty),
        mask=row_valid[:, None] & col_valid[None, :],
    )
