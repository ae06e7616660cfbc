"""Adapter from the ``plsh`` kernel contract of ``plsh verify`` to ``plsh_fast.plsh_attention``.

A test helper (plsh_ref imports nothing from plsh_fast): ``plsh verify
_plsh_fast_kernel:plsh_fast_kernel --kind plsh`` run from ``tests/``, or by the tests
with ``tests/`` on the import path. Padded batches included (SPEC section 5).
"""

from __future__ import annotations


def plsh_fast_kernel(
    query,
    key,
    value,
    *,
    partition,
    causal,
    scale,
    query_positions,
    key_positions,
    attention_mask=None,
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
        attention_mask=attention_mask,
        return_lse=True,
    )
