"""The Triton path's counts plan (``plsh_fast/triton/_tiling.py``) against brute force.

:func:`make_plan` derives from the binary64 bins, without a host synchronisation, each
row's key range per sample, each query tile's key range (the hull of its rows' ranges,
aligned down to ``block_n``), the heads' launch order and, for the backward, each key
tile's query range (:func:`plan_query_range`). Here every field is recomputed by brute
force from the SPEC section 2 bins ``floor((float64(p) - offset) / pitch)`` over all rows
(not only a tile's first and last ones) and compared exactly, on sorted positions with
repeats and gaps, causal and not, with tiles that do and do not divide the lengths; and
:func:`sample_block` follows its documented rule at each of its edges. Runs in the Triton
interpreter on CPU (``tests/_triton_interp.py``; only the bins kernel is a Triton kernel).
"""

from __future__ import annotations

import _triton_interp  # noqa: F401  (picks compiled/interpreted before triton kernels load)
import numpy as np
import pytest
import torch

from plsh_ref.partition import draw_partition

tiling = _triton_interp.load("triton._tiling")

pytestmark = pytest.mark.triton


def _bins(pitch, offset, positions):
    """SPEC section 2, (H, s, n) int64."""
    p = positions.astype(np.float64)
    return np.floor((p[None, None, :] - offset[:, :, None]) / pitch[:, :, None]).astype(np.int64)


def _oracle(qpos, kpos, pitch, offset, causal, block_m, block_n):
    bq, bk = _bins(pitch, offset, qpos), _bins(pitch, offset, kpos)
    H, s, n_q = bq.shape
    n_k = kpos.size
    start = (bk[:, :, None, :] < bq[:, :, :, None]).sum(-1)  # (H, s, n_q)
    end = (bk[:, :, None, :] <= bq[:, :, :, None]).sum(-1)
    cap = (kpos[None, :] <= qpos[:, None]).sum(-1) if causal else np.full(n_q, n_k)
    end = np.minimum(end, cap[None, None, :])
    tiles = range(0, n_q, block_m)
    key_range = np.zeros((H, len(tiles), 2), dtype=np.int64)
    for h in range(H):
        for j, m0 in enumerate(tiles):
            lo = start[h, :, m0 : m0 + block_m].min()
            hi = end[h, :, m0 : m0 + block_m].max()
            lo = lo // block_n * block_n
            key_range[h, j] = (lo, hi) if lo < hi else (0, 0)
    width = (key_range[..., 1] - key_range[..., 0]).sum(1)
    order = sorted(range(H), key=lambda h: -width[h])  # stable: ties by head
    k_tiles = range(0, n_k, block_n)
    query_range = np.zeros((H, len(k_tiles), 2), dtype=np.int64)
    for h in range(H):
        for j, n0 in enumerate(k_tiles):
            rows = [
                np.nonzero((end[h, t] > n0) & (start[h, t] < n0 + block_n))[0] for t in range(s)
            ]
            rows = [r for r in rows if r.size]
            if rows:
                lo = min(r.min() for r in rows) // block_m * block_m
                hi = max(r.max() for r in rows) + 1
                query_range[h, j] = (lo, hi)
    return dict(
        row_start=start.transpose(0, 2, 1),
        row_end=end.transpose(0, 2, 1),
        causal_end=cap,
        key_range=key_range,
        head_order=np.array(order),
        query_range=query_range,
    )


def _positions(rng, n, gaps):
    steps = rng.integers(0, 3 if gaps else 2, size=n)  # repeats (0) and gaps (2)
    return np.cumsum(steps) + int(rng.integers(-50, 50))


CASES = [
    # n_q, n_k, sigma, num_samples, block_m, block_n, causal, same tensor
    (37, 37, [2.0, 9.0, 40.0], 3, 16, 16, True, True),
    (37, 37, [2.0, 9.0, 40.0], 3, 16, 32, False, True),
    (20, 45, [5.0, 1.5], 5, 8, 16, True, False),
    (45, 20, [5.0, 60.0, 0.7], 2, 16, 8, False, False),
    (64, 64, [3.0, 3.0, 30.0, 3.0], 4, 32, 16, True, False),
    (1, 9, [4.0], 1, 16, 16, True, False),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_make_plan_equals_brute_force(case):
    n_q, n_k, sigma, s, block_m, block_n, causal, same = CASES[case]
    rng = np.random.default_rng(case)
    kpos = _positions(rng, n_k, gaps=case % 2 == 0)
    qpos = kpos.copy() if same else _positions(rng, n_q, gaps=True)
    partition = draw_partition(sigma, s, seed=case)
    pitch = torch.from_numpy(partition.pitch.copy())
    offset = torch.from_numpy(partition.offset.copy())
    q = torch.from_numpy(qpos)
    k = q if same else torch.from_numpy(kpos)
    plan = _triton_interp.call(
        tiling.make_plan,
        q,
        k,
        pitch,
        offset,
        causal=causal,
        block_m=block_m,
        block_n=block_n,
        query_range=True,
    )
    want = _oracle(qpos, kpos, partition.pitch, partition.offset, causal, block_m, block_n)
    for field, value in want.items():
        got = getattr(plan, field)
        assert got.dtype == torch.int32, field
        assert np.array_equal(got.numpy(), value), field
    assert (plan.block_m, plan.block_n, plan.causal, plan.n_k) == (block_m, block_n, causal, n_k)
    assert plan.causal is causal
    assert plan.row_start.is_contiguous() and plan.row_end.is_contiguous()


def test_plan_query_range_fills_once_and_returns_the_plan():
    kpos = torch.arange(40)
    partition = draw_partition([3.0, 20.0], 2, seed=1)
    pitch = torch.from_numpy(partition.pitch.copy())
    offset = torch.from_numpy(partition.offset.copy())
    plan = _triton_interp.call(
        tiling.make_plan, kpos, kpos, pitch, offset, causal=True, block_m=16, block_n=16
    )
    assert plan.query_range is None  # only planned on request (backward)
    filled = tiling.plan_query_range(plan)
    assert filled is plan and plan.query_range is not None
    want = _oracle(kpos.numpy(), kpos.numpy(), partition.pitch, partition.offset, True, 16, 16)
    assert np.array_equal(plan.query_range.numpy(), want["query_range"])
    kept = plan.query_range
    assert tiling.plan_query_range(plan).query_range is kept  # not recomputed


def test_compute_bins_is_the_spec_formula_bit_for_bit():
    partition = draw_partition([0.3, 7.0, 1e6], 20, seed=4)  # more samples than one chunk
    positions = np.array([-(2**40), -3, 0, 1, 2, 99, 2**40 + 7, 2**52])
    got = _triton_interp.call(
        tiling.compute_bins,
        torch.from_numpy(partition.pitch.copy()),
        torch.from_numpy(partition.offset.copy()),
        torch.from_numpy(positions),
        block=4,  # several tiles of positions
    )
    assert got.dtype == torch.int64 and got.shape == (3, 20, positions.size)
    assert np.array_equal(got.numpy(), _bins(partition.pitch, partition.offset, positions))


@pytest.mark.parametrize(
    "s, want",
    [
        (1, (2, 1)),  # at least 2
        (2, (2, 1)),
        (3, (4, 1)),
        (33, (64, 1)),
        (tiling.MAX_SAMPLE_BLOCK, (64, 1)),
        (tiling.MAX_SAMPLE_BLOCK + 1, (32, 3)),  # ceil(65 / 32) passes of 32
        (96, (32, 3)),
        (97, (32, 4)),
        (tiling.MAX_STATIC_SAMPLES, (32, 8)),
        (tiling.MAX_STATIC_SAMPLES + 1, (64, 0)),  # runtime loop
        (1000, (64, 0)),
    ],
)
def test_sample_block_follows_its_rule_at_the_edges(s, want):
    assert (tiling.MAX_SAMPLE_BLOCK, tiling.MULTI_PASS_BLOCK, tiling.MAX_STATIC_SAMPLES) == (
        64,
        32,
        256,
    )
    assert tiling.sample_block(s) == want
    block, passes = tiling.sample_block(s)
    if passes:
        assert block * passes >= s  # every sample in some pass
