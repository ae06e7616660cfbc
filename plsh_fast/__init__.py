"""Fast PLSH attention in torch: a vectorised CPU path and a fused Triton GPU path.

The public entry point is :func:`plsh_attention`; it computes exactly the function of
:func:`plsh_ref.attention.plsh_attention` (count-weighted ALiBi approximation, Wolfson &
Wagner 2026, Theorem 2.2) for the same partition sample, with autograd support.
"""

from .api import plsh_attention

__all__ = ["plsh_attention"]
