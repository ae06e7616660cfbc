"""Adapter from the ``plsh`` kernel contract of ``plsh verify`` to ``plsh_fast.plsh_attention``.

A test helper (plsh_ref imports nothing from plsh_fast): ``plsh verify
_plsh_fast_kernel:plsh_fast_kernel --kind plsh`` run from ``tests/``, or by the tests
with ``tests/`` on the import path.
"""

from __future__ import annotations


def plsh_fast_kernel(
    query, key, value, *, partition, causal, scale, query_positions, key_positions
):
    """``plsh_fast.plsh_attention`` with the ``plsh`` contract; returns ``(output, lse)``."""
    import plsh_fast

    return plsh_fast.plsh_attention(
        query,
        key,
        value,
        partition=partition,
        causal=causal,
        scale=scale,
        query_positions=query_positions,
        key_positions=key_positions,
        return_lse=True,
    )


# shared (n,) positions only until plsh_fast's padding lands (issue 12)
plsh_fast_kernel.supports = {"batch_positions": False}
