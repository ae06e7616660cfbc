"""Low-level torch twins of the float64 reference, shared by every torch module of plsh_fast.

One definition each: :func:`expand_kv` (grouped-query heads, the torch form of
:func:`plsh_ref.attention.expand_kv`) and :func:`working_dtype` (the dtype in which scores,
softmax statistics and the LSE are kept). Nothing here imports another plsh_fast module, so
every module may import it without an import cycle.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["expand_kv", "working_dtype"]


def working_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype scores, softmax statistics and the LSE are kept in for inputs of ``dtype``.

    float64 stays float64 (the reference's precision); every other floating dtype (float32,
    float16, bfloat16) works in float32 (SPEC section 6: the fast path accumulates in
    float32 and returns the LSE in float32).

    Parameters
    ----------
    dtype : torch.dtype
        The dtype of ``query``.

    Returns
    -------
    torch.dtype
        ``torch.float64`` if ``dtype`` is ``torch.float64``, else ``torch.float32``.

    Raises
    ------
    TypeError
        ``dtype`` not a ``torch.dtype``.
    """
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype: must be a torch.dtype, got {type(dtype).__name__}")
    return torch.float64 if dtype == torch.float64 else torch.float32


def expand_kv(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Repeat the kv heads of ``x`` ``(batch, num_heads_kv, n, dim)`` to ``num_heads`` heads.

    Query head ``h`` reads kv head ``h // (num_heads // num_heads_kv)`` (grouped-query
    attention); ``x`` itself when there is nothing to repeat. The torch form of
    :func:`plsh_ref.attention.expand_kv`.

    Parameters
    ----------
    x : torch.Tensor
        ``(batch, num_heads_kv, n, dim)``, any dtype and device.
    num_heads : int
        Number of query heads, a positive multiple of ``num_heads_kv``.

    Returns
    -------
    torch.Tensor
        ``(batch, num_heads, n, dim)``, the dtype and device of ``x``.

    Raises
    ------
    TypeError
        ``x`` not a 4-D ``torch.Tensor``; ``num_heads`` not an int.
    ValueError
        ``num_heads`` not a positive multiple of ``num_heads_kv`` (it silently returned
        ``num_heads_kv`` or 0 heads before).
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise TypeError(f"x: must be a 4-D torch.Tensor, got {type(x).__name__}")
    if isinstance(num_heads, bool) or not isinstance(num_heads, (int, np.integer, torch.SymInt)):
        raise TypeError(f"num_heads: must be an int, got {type(num_heads).__name__}")
    if x.shape[1] < 1 or num_heads < 1 or num_heads % x.shape[1]:
        raise ValueError(
            f"num_heads: {num_heads} is not a multiple of num_heads_kv={x.shape[1]} of x"
        )
    group = num_heads // x.shape[1]
    return x if group == 1 else x.repeat_interleave(group, dim=1)
