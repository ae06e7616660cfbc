"""Fast PLSH attention in torch: a vectorised CPU path and a fused Triton GPU path.

The public entry point is :func:`plsh_attention`; it computes exactly the function of
:func:`plsh_ref.attention.plsh_attention` (count-weighted ALiBi approximation, Wolfson &
Wagner 2026, Theorem 2.2) for the same partition sample, with autograd support.
"""

from plsh_ref.provenance import package_version as _package_version

from .api import plsh_attention

#: the installed distribution's version (one number for plsh_ref and plsh_fast, in pyproject)
__version__ = _package_version()

__all__ = ["plsh_attention"]
