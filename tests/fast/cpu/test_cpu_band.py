"""Band heads of the CPU path (``plsh_fast.cpu`` step 4, ``plsh_fast/cpu/_band.py``).

Heads with small query tiles, when queries and keys have the same positions, run as bands:
consecutive tiles whose key windows are equally spaced, read as strided views of padded
keys and values. Checked here: which heads become bands; every window covers each row's
blocks; windows start before key 0 and end past the last key (padding) and still give the
reference result; forward and backward agree with the path without bands.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _cpu_problems import check_against_reference, make_problem

from plsh_fast import cpu, plsh_attention
from plsh_fast._partition import partition_tensors
from plsh_ref.partition import draw_partition

SIGMAS = np.array([2.0, 6.0, 40.0, 300.0])  # tiles 16, 16, 32 (bands) and 128 (not)


def _partition(s=8, seed=3):
    return draw_partition(SIGMAS, s, seed=seed)


def _plan(n, causal=True, key_n=None):
    pitch, offset = partition_tensors(_partition(), "cpu")
    qpos = torch.arange(n)
    kpos = qpos if key_n is None else torch.arange(key_n)
    return cpu.plan_cpu(pitch, offset, qpos, kpos, causal, torch.float32)


def test_small_tiles_become_bands_only_for_self_attention():
    plan = _plan(2000)
    assert plan.band == [True, True, True, False]
    assert plan.tiles[:3] == [cpu.BAND_TILE] * 3
    # Negative controls: other key positions (cross attention), or bands disabled.
    assert not any(_plan(2000, key_n=1999).band)
    cpu.BAND_MAX_TILE, saved = 0, cpu.BAND_MAX_TILE
    try:
        assert not any(_plan(2000).band)
    finally:
        cpu.BAND_MAX_TILE = saved


@pytest.mark.parametrize("causal", [True, False])
def test_band_windows_are_regular_and_cover_every_row(causal):
    n = 1000
    plan = _plan(n, causal)
    for h in range(4):
        start, end = plan.ranges(h)
        for spec in plan.head_specs(h):
            chunk = plan.build(spec)
            if not plan.band[h]:
                assert chunk.band is None
                continue
            assert chunk.band is not None
            g, t = chunk.rows.shape
            first_row, first_key = chunk.band
            assert torch.equal(chunk.rows.reshape(-1), torch.arange(first_row, first_row + g * t))
            w = chunk.keys.shape[1]
            for i in range(g):
                lo = first_key + i * t  # equally spaced windows
                rows = chunk.rows[i][chunk.rows[i] < n]
                nonempty = end[:, rows] > start[:, rows]
                assert start[:, rows][nonempty].min() >= lo
                assert end[:, rows][nonempty].max() <= lo + w


@pytest.mark.parametrize("causal", [True, False])
def test_band_heads_match_the_reference_with_windows_past_both_ends(causal):
    """Windows start before key 0 (first tiles) and, without the causal cut, end past the
    last key: the padding rows must get weight 0. Tolerance rule of SPEC section 6 against
    the float64 reference, batch 2, grouped-query attention (4 query heads, 2 kv heads)."""
    problem = make_problem(
        5, batch=2, num_heads=4, group=2, n_q=300, n_k=300, head_dim=16, head_dim_v=8,
        causal=causal, num_samples=8, log2_sigma=(1.0, 5.0),
    )  # fmt: skip
    pitch, offset = partition_tensors(problem.partition, "cpu")
    pos = torch.arange(300)
    plan = cpu.plan_cpu(pitch, offset, pos, pos, causal, torch.float32)
    assert all(plan.band)
    pad, _ = cpu._band.band_padding(plan, cpu._planning.chunk_specs(plan, 1), 2)
    assert pad > 0  # the windows do reach outside [0, n)
    out, lse = plsh_attention(
        problem.query, problem.key, problem.value, return_lse=True, **problem.kwargs
    )
    check_against_reference(problem, out, lse)


def test_bands_and_tile_groups_agree_forward_and_backward(monkeypatch):
    n = 400
    g = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(1, 4, n, 16, generator=g, requires_grad=True) for _ in range(3))
    partition = _partition()

    def run():
        out, lse = plsh_attention(q, k, v, partition=partition, return_lse=True)
        grads = torch.autograd.grad((out * out).sum() + lse.sum(), (q, k, v))
        return (out, lse, *grads)

    with_bands = run()
    monkeypatch.setattr(cpu, "BAND_MAX_TILE", 0)
    without = run()
    for a, b in zip(with_bands, without):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5 * float(b.detach().abs().max()))


def test_repeated_positions_are_not_banded():
    """A run of equal positions would widen every band window by its length (found by
    review: bands 2-3x slower with 2048 repeated positions); such heads keep tile groups."""
    pitch, offset = partition_tensors(_partition(), "cpu")
    pos = torch.arange(400)
    pos[:100] = 0
    plan = cpu.plan_cpu(pitch, offset, pos, pos, True, torch.float32)
    assert not any(plan.band)
    assert any(_plan(400).band)  # negative control: distinct positions do get bands
