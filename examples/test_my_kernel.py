"""Validate your own attention kernel from pytest with plsh_ref.testing.

What it shows: a kernel author's test file. ``my_alibi_kernel`` below stands for *your*
kernel (here a plain numpy ALiBi attention written from scratch). Three kinds of test:

* ``test_my_kernel_properties``: the property suite in one line,
  ``make_property_suite(kernel)``: Hypothesis draws attention problems (shapes, dtypes,
  positions, padding, grouped-query heads, ...), compares the kernel with the reference
  (float64; beyond float64 for float64 problems) under the tolerance rule (SPEC section 6)
  and shrinks a failure to the smallest problem;
* ``test_my_kernel_battery``: the deterministic edge battery (one named problem per known
  bug class; cases needing an input the kernel does not take come back skipped);
* ``test_one_case_with_the_plugin_fixture``: the ``plsh_check`` fixture of the pytest
  plugin that ships with ``plsh_ref`` (entry point ``pytest11``);
* ``test_broken_kernel_is_caught``: a negative control, a kernel with the ALiBi sign
  flipped, must fail the same checks.

Run (from the repository root, or copy the file into your project)::

    python -m pytest examples/test_my_kernel.py
    PLSH_EXAMPLE_TINY=1 python -m pytest examples/test_my_kernel.py   # fewer examples (CI)
"""

from __future__ import annotations

import os

import numpy as np

from plsh_ref.testing import make_property_suite
from plsh_ref.testing.battery import battery
from plsh_ref.testing.suite import check_case

TINY = os.environ.get("PLSH_EXAMPLE_TINY") == "1"


def my_alibi_kernel(
    query, key, value, *, slopes, causal, scale, query_positions, key_positions, attention_mask=None
):
    """Exact ALiBi attention in numpy, in the dtype of ``query``: the kernel under test."""
    num_heads, n_q, n_k = query.shape[1], query.shape[2], key.shape[2]
    group = num_heads // key.shape[1]
    key, value = np.repeat(key, group, axis=1), np.repeat(value, group, axis=1)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    qpos = np.arange(n_k - n_q, n_k) if query_positions is None else np.asarray(query_positions)
    kpos = np.arange(n_k) if key_positions is None else np.asarray(key_positions)
    qpos = np.broadcast_to(qpos, (query.shape[0], n_q))[:, None, :, None]
    kpos = np.broadcast_to(kpos, (query.shape[0], n_k))[:, None, None, :]
    distance = np.abs(qpos - kpos).astype(np.float64)
    logits = scale * (query.astype(np.float64) @ np.swapaxes(key, -1, -2).astype(np.float64))
    logits = logits - np.asarray(slopes)[None, :, None, None] * distance
    keep = np.ones(logits.shape, dtype=bool)
    if causal:
        keep &= kpos <= qpos
    if attention_mask is not None:
        keep &= np.asarray(attention_mask, dtype=bool)[:, None, None, :]
    logits = np.where(keep, logits, -np.inf)
    top = logits.max(axis=-1, keepdims=True, initial=-np.inf)  # n_k = 0 allowed
    top = np.where(np.isfinite(top), top, 0.0)
    weights = np.exp(logits - top)
    total = weights.sum(axis=-1, keepdims=True)
    out = np.where(total > 0, (weights @ value.astype(np.float64)) / np.maximum(total, 1e-300), 0)
    return out.astype(query.dtype)  # rows without a key give 0


def sign_flipped_kernel(query, key, value, *, slopes, **kwargs):
    """A broken kernel: ALiBi with the slopes' sign flipped (rewards distance)."""
    return my_alibi_kernel(query, key, value, slopes=-np.asarray(slopes), **kwargs)


test_my_kernel_properties = make_property_suite(
    my_alibi_kernel, kind="alibi", max_examples=10 if TINY else 100
)


def test_my_kernel_battery():
    # cases needing an input the kernel does not take (e.g. packed sequences, cu_seqlens)
    # come back skipped, with the reason; every other case must pass
    results = {
        name: check_case(my_alibi_kernel, spec.build())
        for name, spec in battery("alibi", dtypes=["float32", "float64"])
    }
    failed = {name: r.message for name, r in results.items() if not (r.passed or r.skipped)}
    assert not failed, failed
    assert sum(r.passed for r in results.values()) >= len(results) // 2


def test_one_case_with_the_plugin_fixture(plsh_check):
    # the pytest plugin shipped with plsh_ref (entry point pytest11): one case, asserted
    _name, spec = battery("alibi", dtypes=["float32"])[0]
    plsh_check(my_alibi_kernel, spec.build())


def test_broken_kernel_is_caught():
    results = [
        check_case(sign_flipped_kernel, spec.build())
        for _name, spec in battery("alibi", dtypes=["float32", "float64"])
    ]
    assert any(not (r.passed or r.skipped) for r in results)
