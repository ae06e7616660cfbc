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
from _triton_counts import kernel_counts, tile_plan
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from plsh_ref.partition import PartitionSample, counts, draw_partition

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


# ------------------------------------------------------------------ preconditions, devices


def _meta_plan(n_q, n_k, block_m, block_n, causal=False):
    """``make_plan`` on ``meta`` tensors of any length and no head (no bins kernel runs):
    the length checks and the device of every field, without the memory of the rows."""
    q = torch.empty(n_q, dtype=torch.int64, device="meta")
    k = torch.empty(n_k, dtype=torch.int64, device="meta")
    pitch = torch.empty((0, 3), dtype=torch.float64, device="meta")
    return tiling.make_plan(
        q, k, pitch, pitch, causal=causal, block_m=block_m, block_n=block_n, query_range=True
    )


@pytest.mark.parametrize("block_m, block_n", [(16, 64), (64, 16)])
def test_lengths_up_to_two_tiles_below_int32_are_planned_and_longer_refused(block_m, block_n):
    # every row index plus two tiles must fit in int32: n < 2**31 - 2 max(block_m, block_n)
    limit = 2**31 - 2 * max(block_m, block_n)
    for n_q, n_k in [(limit - 1, 5), (5, limit - 1)]:
        plan = _meta_plan(n_q, n_k, block_m, block_n)
        assert plan.causal_end.shape == (n_q,) and plan.n_k == n_k
    for n_q, n_k in [(limit, 5), (5, limit)]:
        with pytest.raises(AssertionError):
            _meta_plan(n_q, n_k, block_m, block_n)


def test_empty_positions_and_other_dtypes_are_refused():
    pitch = torch.ones((1, 2), dtype=torch.float64)
    one = torch.zeros(1, dtype=torch.int64)
    none = torch.zeros(0, dtype=torch.int64)
    pos = torch.arange(4)
    alias = pos.view(torch.int32)[:4]  # the queries' memory read as 4 int32 keys
    assert alias.data_ptr() == pos.data_ptr()
    cases = [(none, one), (one, none), (one.int(), one), (one, one.int()), (pos, alias)]
    for q, k in cases:
        with pytest.raises(AssertionError):
            tiling.make_plan(q, k, pitch, pitch, causal=False, block_m=16, block_n=16)


class _Devices(TorchDispatchMode):
    """Records the device of every tensor an operation returns."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.seen += [
            (str(func), t.device.type) for t in tree_flatten(out)[0] if torch.is_tensor(t)
        ]
        return out


@pytest.mark.parametrize("causal", [False, True])
def test_every_tensor_of_the_plan_is_made_on_the_positions_device(causal):
    # a tensor made elsewhere (a factory without device=) would be a host-to-device copy
    # per call on CUDA, against the plan's promise of device operations only
    with _Devices() as devices:
        plan = _meta_plan(40, 33, 16, 16, causal=causal)
    assert len(devices.seen) > 20
    assert [s for s in devices.seen if s[1] != "meta"] == []
    for field in ("row_start", "row_end", "key_range", "causal_end", "head_order", "query_range"):
        assert getattr(plan, field).device.type == "meta", field


def test_the_bins_of_one_position_tensor_are_computed_once(monkeypatch):
    calls = []
    real = tiling.compute_bins

    def counting(pitch, offset, positions, **kwargs):
        calls.append(positions.shape[0])
        return real(pitch, offset, positions, **kwargs)

    monkeypatch.setattr(tiling, "compute_bins", counting)
    partition = draw_partition([3.0, 20.0], 2, seed=1)
    pitch = torch.from_numpy(partition.pitch.copy()).to(_triton_interp.DEVICE)
    offset = torch.from_numpy(partition.offset.copy()).to(_triton_interp.DEVICE)
    pos = torch.arange(30, device=_triton_interp.DEVICE) * 2
    kwargs = dict(causal=False, block_m=16, block_n=16)
    tiling.make_plan(pos, pos, pitch, offset, **kwargs)
    assert calls == [30]  # self-attention: the keys' bins are the queries'
    calls.clear()
    tiling.make_plan(pos, pos.clone(), pitch, offset, **kwargs)
    assert calls == [30, 30]
    calls.clear()
    # a prefix view starts at the same address but holds other rows: its own bins
    plan = tiling.make_plan(pos, pos[:12], pitch, offset, **kwargs)
    assert calls == [30, 12]
    want = _oracle(
        pos.cpu().numpy(), pos[:12].cpu().numpy(), partition.pitch, partition.offset, False, 16, 16
    )
    assert np.array_equal(plan.row_end.cpu().numpy(), want["row_end"])


@pytest.mark.parametrize(
    "qpos, kpos, causal",
    [
        # one key (the least accepted)
        (np.arange(9) - 4, np.array([0]), False),
        (np.arange(9) - 4, np.array([0]), True),
        # every query past every key: no query tile has a key, and the rows' empty ranges
        # all start at n_k = 2 block_n, a multiple of block_n
        (np.arange(20) + 10_000, np.arange(32), False),
    ],
    ids=["one_key", "one_key_causal", "queries_past_the_keys"],
)
def test_make_plan_at_the_edges_of_the_key_rows(qpos, kpos, causal):
    partition = draw_partition([0.8, 3.0], 3, seed=7)
    pitch = torch.from_numpy(partition.pitch.copy())
    offset = torch.from_numpy(partition.offset.copy())
    plan = _triton_interp.call(
        tiling.make_plan,
        torch.from_numpy(qpos),
        torch.from_numpy(kpos),
        pitch,
        offset,
        causal=causal,
        block_m=8,
        block_n=16,
        query_range=True,
    )
    want = _oracle(qpos, kpos, partition.pitch, partition.offset, causal, 8, 16)
    for field, value in want.items():
        assert np.array_equal(getattr(plan, field).numpy(), value), field


def test_heads_of_equal_work_launch_in_head_order():
    # 24 heads of two widths: more ties than a sort keeps in order without being asked
    partition = draw_partition([2.0, 30.0] * 12, 2, seed=8)
    pitch = torch.from_numpy(partition.pitch.copy())
    offset = torch.from_numpy(partition.offset.copy())
    pos = np.arange(40)
    plan = _triton_interp.call(
        tiling.make_plan,
        torch.from_numpy(pos),
        torch.from_numpy(pos),
        pitch,
        offset,
        causal=True,
        block_m=8,
        block_n=8,
    )
    want = _oracle(pos, pos, partition.pitch, partition.offset, True, 8, 8)
    assert np.array_equal(plan.key_range.numpy(), want["key_range"])
    width = (want["key_range"][..., 1] - want["key_range"][..., 0]).sum(1)
    assert len(set(width.tolist())) < 24  # ties
    assert np.array_equal(plan.head_order.numpy(), want["head_order"])


@pytest.mark.parametrize("num_heads, n", [(1, 5), (2, 1), (1, 1)])
def test_compute_bins_with_one_head_or_one_position(num_heads, n):
    # positions far from 0, so that no bin is 0 (the value of fresh memory)
    partition = draw_partition([0.4, 6.0][:num_heads], 3, seed=2)
    positions = (np.arange(n) * 7 + 10**9).astype(np.int64)
    got = _triton_interp.call(
        tiling.compute_bins,
        torch.from_numpy(partition.pitch.copy()),
        torch.from_numpy(partition.offset.copy()),
        torch.from_numpy(positions),
    )
    want = _bins(partition.pitch, partition.offset, positions)
    assert (want != 0).all()
    assert got.shape == (num_heads, 3, n) and np.array_equal(got.numpy(), want)


def test_compute_bins_refuses_other_dtypes_and_shapes():
    f64 = torch.ones((1, 2), dtype=torch.float64)
    pos = torch.arange(4)
    for pitch, offset, positions in [
        (f64, f64.float(), pos),
        (f64.float(), f64, pos),
        (f64, f64, pos.int()),
        (f64, f64, pos.reshape(2, 2)),
    ]:
        with pytest.raises(AssertionError):
            tiling.compute_bins(pitch, offset, positions)


def test_the_query_ranges_convert_no_row_range():
    """The backward's planning takes one transposed int32 copy of the row ranges (the
    module's memory note): searching int32 tile starts in them needs no conversion, while
    int64 starts would make ``torch.searchsorted`` convert both ``(H s, n_q)`` range tensors
    to int64 first (four times that copy's memory)."""
    partition = draw_partition([3.0, 20.0], 2, seed=1)
    dev = _triton_interp.DEVICE
    pos = torch.arange(40, device=dev)
    plan = tiling.make_plan(
        pos,
        pos,
        torch.from_numpy(partition.pitch.copy()).to(dev),
        torch.from_numpy(partition.offset.copy()).to(dev),
        causal=True,
        block_m=16,
        block_n=16,
    )
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
    ) as prof:
        tiling.plan_query_range(plan)
    converted = [
        e.input_shapes[0]
        for e in prof.events()
        if e.name == "aten::_to_copy" and e.input_shapes and e.input_shapes[0]
    ]
    assert [2 * 2, 40] not in converted, converted
    assert plan.query_range is not None


@pytest.mark.parametrize("causal", [True, False])
def test_counts_tile_with_bin_starts_and_ends_on_tile_starts(causal):
    """Bins of 16 and 32 positions on tiles of 16 (the tile size of the kernel tests): a
    row's bin start (and end) falls exactly on a key tile's start ``n0`` (0, 16 and 32),
    where its event ``[j >= a]`` is 1 on the whole tile pair (a "full" event, ``a(m_last)
    <= n0``, not a mixed or an empty one). The counts tile, both orientations, with the
    tile classification, equals the reference counts (the small, fast case of
    ``test_tile_counts.py``)."""
    partition = PartitionSample(np.array([[16.0, 32.0]]), np.array([[0.0, 16.0]]))
    qpos = kpos = np.arange(48)
    plan = tile_plan(partition, qpos, kpos, causal, 16, 16)
    assert set(plan.row_start.flatten().tolist()) == {0, 16, 32}  # the premise: tile starts
    want = counts(partition, qpos, kpos, causal=causal)
    for transposed in (False, True):
        got = kernel_counts(plan, 48, 2, 16, 16, transposed, True)
        np.testing.assert_array_equal(got, want, err_msg=f"{transposed=}")
