"""The counts tile of :func:`plsh_fast.triton._tiling.tile_counts_all`, element by element, against
:func:`plsh_ref.partition.counts` (SPEC section 3): compiled on CUDA, in the Triton
interpreter on CPU (tests/_triton_interp.py).

The kernels only see the counts through the attention they weight; here a small kernel
(``tests/_triton_counts.py``) stores every (query tile, key tile) pair's counts tile (event
form), in both orientations (the forward/dQ tile with two columns per int32 and the
key/value-gradient kernel's transposed sign-bit tile), causal (start events and the
causal-end mask) and not (start and end events), with and without the tile classification
(constant / mixed events), so that a wrong count anywhere (also in a pair that the
attention tests would weight only slightly) fails. Rows and keys past the ends are not
compared (every caller masks them).
"""

from __future__ import annotations

import _triton_interp  # noqa: F401  (picks compiled/interpreted before triton kernels load)
import numpy as np
import pytest
from _triton_counts import kernel_counts, plsh_triton, tile_plan
from hypothesis import given, settings
from hypothesis import strategies as st

from plsh_ref.partition import counts, draw_partition
from plsh_ref.testing.strategies import draw_positions

pytestmark = pytest.mark.triton


def _check(
    qpos, kpos, sigma, s, seed, causal, block_m, block_n, passes=None, classify=(True, False)
):
    partition = draw_partition(np.asarray(sigma, dtype=np.float64), s, seed=seed)
    plan = tile_plan(partition, qpos, kpos, causal, block_m, block_n)
    want = counts(partition, qpos, kpos, causal=causal)
    for transposed in (False, True):
        for cls in classify:
            got = kernel_counts(plan, len(kpos), s, block_m, block_n, transposed, cls, passes)
            np.testing.assert_array_equal(got, want, err_msg=f"{transposed=} classify={cls}")


@settings(max_examples=6)
@given(
    mode=st.sampled_from(["default", "shifted", "gaps"]),
    causal=st.booleans(),
    n_q=st.integers(1, 40),
    n_k=st.integers(1, 40),
    s=st.integers(1, 9),
    seed=st.integers(0, 2**31 - 1),
)
def test_counts_tile_equals_reference_counts(mode, causal, n_q, n_k, s, seed):
    """Every entry of every counts tile (16 x 16 tiles, several per axis, partial ones)."""
    rng = np.random.default_rng(seed)
    qpos, kpos = draw_positions(mode, n_q, n_k, rng)
    if qpos is None:
        qpos, kpos = np.arange(n_q) + (n_k - n_q), np.arange(n_k)
    _check(qpos, kpos, [0.4, 3.0, 20.0], s, seed, causal, 16, 16)


@pytest.mark.parametrize("causal", [True, False])
def test_counts_tile_with_two_sample_blocks(causal):
    """s = 70 > 64 (two passes of 64 samples), query and key tiles of different sizes."""
    qpos, kpos = np.arange(20) + 12, np.arange(40)
    _check(qpos, kpos, [0.6, 12.0], 70, 3, causal, 16, 32)


@pytest.mark.parametrize(
    ("s", "causal", "classify"),
    [(65, True, (True, False)), (130, False, (True,)), (200, True, (True,))],
)
def test_counts_tile_with_several_static_passes(s, causal, classify):
    """s = 65, 130, 200: three, five and seven statically unrolled passes of 32 samples, the
    last one partial (not a multiple of 32), query and key tiles of different sizes (both
    orientations; without the tile classification at 65 only: interpreter time)."""
    assert plsh_triton.sample_block(s) == (
        plsh_triton.MULTI_PASS_BLOCK,
        -(-s // plsh_triton.MULTI_PASS_BLOCK),
    )
    qpos, kpos = np.arange(20) + 12, np.arange(40)
    _check(qpos, kpos, [0.6, 12.0], s, s, causal, 16, 32, classify=classify)


@pytest.mark.parametrize("causal", [True, False])
def test_counts_tile_runtime_pass_loop(causal):
    """The runtime loop over the passes (``PASSES = 0``, what :func:`plsh_triton.sample_block`
    picks above ``MAX_STATIC_SAMPLES``), here at s = 130 (three passes of 64): the same
    counts."""
    qpos, kpos = np.arange(20) + 12, np.arange(40)
    _check(qpos, kpos, [0.6, 12.0], 130, 5, causal, 16, 32, passes=0, classify=(True,))


def test_sample_block_covers_every_sample_with_the_fewest_passes():
    """``(S_BLOCK, PASSES)``: up to ``MAX_SAMPLE_BLOCK`` samples one pass of the smallest
    power of two (at least 2) covering ``s``; above, ``MULTI_PASS_BLOCK``-sample passes,
    as few as cover ``s``, while they hold at most ``MAX_STATIC_SAMPLES``; beyond that the
    runtime loop (``PASSES = 0``) over ``MAX_SAMPLE_BLOCK``-sample passes."""
    big, multi, cap = (
        plsh_triton.MAX_SAMPLE_BLOCK,
        plsh_triton.MULTI_PASS_BLOCK,
        plsh_triton.MAX_STATIC_SAMPLES,
    )
    assert big == 64 and multi & (multi - 1) == 0 and multi <= big < cap
    for s in range(1, 2 * cap + 2):
        block, passes = plsh_triton.sample_block(s)
        assert block & (block - 1) == 0 and 2 <= block <= big, s
        if s <= big:
            assert passes == 1 and (block // 2 < s <= block or s == 1), s
        elif -(-s // multi) * multi <= cap:
            assert block == multi and passes == -(-s // multi), s
        else:
            assert (block, passes) == (big, 0), s
        if passes:
            assert (passes - 1) * block < s <= passes * block <= max(cap, block), s


def test_counts_tile_negative_control():
    """The comparison can fail: counts of a partition drawn with another seed differ."""
    qpos = kpos = np.arange(24)
    partition = draw_partition(np.array([2.0]), 5, seed=1)
    other = draw_partition(np.array([2.0]), 5, seed=2)
    plan = tile_plan(other, qpos, kpos, True, 16, 16)
    for transposed in (False, True):
        got = kernel_counts(plan, 24, 5, 16, 16, transposed, True)  # stored at [i, j]
        assert not np.array_equal(got, counts(partition, qpos, kpos, causal=True))
        np.testing.assert_array_equal(got, counts(other, qpos, kpos, causal=True))
