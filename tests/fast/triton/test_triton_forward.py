"""Triton forward kernel against the float64 reference: compiled on CUDA when a GPU is
present, in the Triton interpreter on CPU otherwise (tests/_triton_interp.py).

Every comparison uses the tolerance rule of SPEC section 6
(:func:`plsh_ref.testing.tolerance.assert_close_to_reference`): the kernel's error must be at
most twice that of plain torch attention with the same dense ``log M~`` bias in the same
dtype, plus 4 ulps. Shapes are small (interpreter: several ms per tile step) and the tiles
are 16 x 16 so that several query and key tiles, partial tiles and skipped tiles occur.
"""

from __future__ import annotations

import dataclasses

import _triton_interp  # noqa: F401  (picks compiled/interpreted before triton kernels load)
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from plsh_ref.attention import plsh_attention
from plsh_ref.partition import (
    PartitionSample,
    bins,
    count_bias,  # noqa: E402
    counts,
    draw_partition,
    masks,
)
from plsh_ref.testing.baseline import plain_attention_torch
from plsh_ref.testing.strategies import draw_positions  # noqa: E402
from plsh_ref.testing.tolerance import assert_close_to_reference

plsh_triton = _triton_interp.load("triton")
forward_module = _triton_interp.load("triton._forward")
launch_module = _triton_interp.load("triton._launch")

pytestmark = pytest.mark.triton

BLOCK = 16
DTYPES = {"float32": torch.float32, "float16": torch.float16}


def _tensors(partition):
    return (
        torch.from_numpy(np.array(partition.pitch)),
        torch.from_numpy(np.array(partition.offset)),
    )


def _positions(mode, n_q, n_k, rng):
    """(query_positions, key_positions) int64 numpy arrays of a toolkit position layout."""
    qpos, kpos = draw_positions(mode, n_q, n_k, rng)
    if qpos is None:
        return np.arange(n_q) + (n_k - n_q), np.arange(n_k)
    return qpos, kpos


def _make_view(x: torch.Tensor, kind: str) -> torch.Tensor:
    """The same values as ``x`` in a non-contiguous layout."""
    if kind == "contiguous":
        return x
    if kind == "bnhd":  # (batch, seq, heads, dim) storage, as most models keep it
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    # wider last dimension, sliced
    wide = torch.zeros(x.shape[:-1] + (x.shape[-1] + 3,), dtype=x.dtype)
    wide[..., 1 : 1 + x.shape[-1]] = x
    return wide[..., 1 : 1 + x.shape[-1]]


def _reference(q, k, v, partition, qpos, kpos, causal, scale, dtype_name):
    q64, k64, v64 = (t.double().numpy() for t in (q, k, v))
    ref = plsh_attention(
        q64,
        k64,
        v64,
        partition=partition,
        causal=causal,
        scale=scale,
        query_positions=qpos,
        key_positions=kpos,
        return_lse=True,
    )
    c = counts(partition, qpos, kpos, causal=causal)
    bias = count_bias(c, partition.num_samples)
    base = plain_attention_torch(q64, k64, v64, bias, scale=scale, dtype=dtype_name)
    return ref, base


def _run(q, k, v, partition, qpos, kpos, causal, scale, **changes):
    """The kernel on 16 x 16 tiles; ``changes``: other fields of its ``TileConfig``."""
    pitch, offset = _tensors(partition)
    tiles = _triton_interp.tiles(
        q.shape[3], v.shape[3], q.dtype, partition.num_samples, block_m=BLOCK, block_n=BLOCK,
        **changes,
    )  # fmt: skip
    return _triton_interp.call(
        plsh_triton.plsh_forward_triton,
        q,
        k,
        v,
        pitch,
        offset,
        torch.from_numpy(qpos),
        torch.from_numpy(kpos),
        scale,
        causal,
        tiles=tiles,
    )


def _check(out, lse, ref, base, dtype_name):
    assert_close_to_reference(out, ref[0], base[0], dtype_name, name="output")
    assert_close_to_reference(lse, ref[1], base[1], dtype_name, name="lse")


@st.composite
def forward_cases(draw):
    num_heads_kv = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 2]))
    batch = draw(st.integers(1, 2)) if num_heads_kv * group <= 2 else 1
    return dict(
        batch=batch,
        num_heads_kv=num_heads_kv,
        num_heads=num_heads_kv * group,
        n_q=draw(st.integers(1, 45)),
        n_k=draw(st.integers(1, 45)),
        head_dim=draw(st.integers(1, 20)),
        head_dim_v=draw(st.integers(1, 20)),
        num_samples=draw(st.integers(1, 6)),
        causal=draw(st.booleans()),
        dtype=draw(st.sampled_from(sorted(DTYPES))),
        mode=draw(st.sampled_from(["default", "default", "shifted", "gaps", "unsorted"])),
        view=draw(st.sampled_from(["contiguous", "bnhd", "sliced"])),
        log_sigma=draw(st.lists(st.floats(0.0, np.log(64.0)), min_size=4, max_size=4)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@settings(max_examples=14)
@given(case=forward_cases())
def test_forward_matches_reference(case):
    rng = np.random.default_rng(case["seed"])
    dtype = DTYPES[case["dtype"]]
    b, h, hk = case["batch"], case["num_heads"], case["num_heads_kv"]
    n_q, n_k, d, dv = case["n_q"], case["n_k"], case["head_dim"], case["head_dim_v"]
    sigma = np.exp(np.array(case["log_sigma"][:h]))
    partition = draw_partition(sigma, case["num_samples"], seed=case["seed"])
    qpos, kpos = _positions(case["mode"], n_q, n_k, rng)
    q = torch.from_numpy(rng.standard_normal((b, h, n_q, d))).to(dtype)
    k = torch.from_numpy(rng.standard_normal((b, hk, n_k, d))).to(dtype)
    v = torch.from_numpy(rng.standard_normal((b, hk, n_k, dv))).to(dtype)
    scale = float(rng.uniform(0.2, 1.5))
    ref, base = _reference(q, k, v, partition, qpos, kpos, case["causal"], scale, case["dtype"])
    out, lse = _run(
        _make_view(q, case["view"]),
        _make_view(k, case["view"]),
        _make_view(v, case["view"]),
        partition,
        qpos,
        kpos,
        case["causal"],
        scale,
    )
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert out.shape == (b, h, n_q, dv) and lse.shape == (b, h, n_q)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    _check(out, lse, ref, base, case["dtype"])


def _fixed_case(dtype=torch.float32, causal=True, n=40, s=4, seed=7):
    rng = np.random.default_rng(seed)
    partition = draw_partition(np.array([3.0, 12.0]), s, seed=seed)
    qpos, kpos = np.arange(n), np.arange(n)
    q, k, v = (torch.from_numpy(rng.standard_normal((1, 2, n, 8))).to(dtype) for _ in range(3))
    return q, k, v, partition, qpos, kpos, causal


@pytest.mark.parametrize("variant", [1, 2], ids=["bias_sign_flipped", "counts_ignored"])
def test_negative_controls_fail(variant):
    """Kernels weighting keys by 1/C (bias -log C) or by 1 (mask only) must fail the check."""
    q, k, v, partition, qpos, kpos, causal = _fixed_case()
    ref, base = _reference(q, k, v, partition, qpos, kpos, causal, 0.5, "float32")
    out, lse = _run(q, k, v, partition, qpos, kpos, causal, 0.5)
    _check(out, lse, ref, base, "float32")  # the real kernel passes on this case
    bad_out, bad_lse = _run(q, k, v, partition, qpos, kpos, causal, 0.5, variant=variant)
    with pytest.raises(AssertionError):
        assert_close_to_reference(bad_out, ref[0], base[0], "float32", name="output")


@settings(max_examples=15)
@given(
    mode=st.sampled_from(["default", "shifted", "gaps"]),
    causal=st.booleans(),
    n_q=st.integers(1, 60),
    n_k=st.integers(1, 60),
    s=st.integers(1, 70),
    seed=st.integers(0, 2**31 - 1),
)
def test_plan_row_ranges_give_reference_counts(mode, causal, n_q, n_k, s, seed):
    """sum_t [row_start <= j < row_end] is C_ij of plsh_ref (SPEC section 3), including
    s > 64 (several sample blocks); the plan's ranges are (num_heads, n_q, num_samples)."""
    rng = np.random.default_rng(seed)
    partition = draw_partition(np.array([0.7, 6.0]), s, seed=seed)
    qpos, kpos = _positions(mode, n_q, n_k, rng)
    plan = _triton_interp.call(
        plsh_triton.make_plan,
        torch.from_numpy(qpos),
        torch.from_numpy(kpos),
        *_tensors(partition),
        causal=causal,
        block_m=BLOCK,
        block_n=BLOCK,
    )
    j = np.arange(n_k)
    assert plan.row_start.shape == plan.row_end.shape == (2, n_q, s)
    start = plan.row_start.numpy()[..., None]
    end = plan.row_end.numpy()[..., None]
    got = ((j >= start) & (j < end)).sum(axis=2)
    np.testing.assert_array_equal(got, counts(partition, qpos, kpos, causal=causal))


def _tile_pair_classes(partition, qpos, kpos, causal):
    """Which of ``"full"``, ``"disjoint"`` and ``"partial"`` occur among the (head, sample,
    query tile, key tile) blocks of the masks on ``BLOCK x BLOCK`` tiles (a last tile may
    be short): the three cases of the per-tile-pair classification."""
    m = masks(partition, qpos, kpos, causal=causal)
    found = set()
    for i in range(0, len(qpos), BLOCK):
        for j in range(0, len(kpos), BLOCK):
            tile = m[:, :, i : i + BLOCK, j : j + BLOCK]
            full, none = tile.all(axis=(2, 3)), ~tile.any(axis=(2, 3))
            found |= {"full"} if full.any() else set()
            found |= {"disjoint"} if none.any() else set()
            found |= {"partial"} if (~full & ~none).any() else set()
    return found


@pytest.mark.parametrize("s", [6, 70])
def test_tile_classification_is_exact(s):
    """Skipping full/disjoint samples per tile pair gives bit-identical results to comparing
    every sample (one sample block, and two for s = 70), on 2 x 3 tile pairs where full,
    disjoint and partial samples all occur, causal or not."""
    rng = np.random.default_rng(8)
    partition = draw_partition(np.array([1.5, 9.0, 40.0]), s, seed=8)
    qpos, kpos = np.arange(26) + 4, np.arange(40)
    q = torch.from_numpy(rng.standard_normal((1, 3, 26, 6))).float()
    k, v = (torch.from_numpy(rng.standard_normal((1, 3, 40, 6))).float() for _ in range(2))
    for causal in (True, False):
        assert _tile_pair_classes(partition, qpos, kpos, causal) == {"full", "disjoint", "partial"}
        fast = _run(q, k, v, partition, qpos, kpos, causal, 0.6)
        slow = _run(q, k, v, partition, qpos, kpos, causal, 0.6, classify=False)
        assert torch.equal(fast[0], slow[0]) and torch.equal(fast[1], slow[1])


@pytest.mark.parametrize(("s", "causal"), [(70, True), (130, False), (200, True)])
def test_many_samples_use_several_sample_blocks(s, causal, monkeypatch):
    """s = 70, 130, 200 > 64: the counts are summed over three, five and seven statically
    unrolled 32-sample blocks (the last one partial); still the reference. The launch code
    asks :func:`tile_config` for the tiles of ``s`` samples."""
    q, k, v, partition, qpos, kpos, _ = _fixed_case(n=24, s=s, causal=causal)
    assert plsh_triton.sample_block(s) == (
        plsh_triton.MULTI_PASS_BLOCK,
        -(-s // plsh_triton.MULTI_PASS_BLOCK),
    )
    asked = []
    real = launch_module.tile_config
    monkeypatch.setattr(
        launch_module, "tile_config", lambda *a, **kw: asked.append(kw) or real(*a, **kw)
    )
    ref, base = _reference(q, k, v, partition, qpos, kpos, causal, 0.5, "float32")
    pitch, offset = _tensors(partition)
    out = _triton_interp.call(
        plsh_triton.plsh_forward_triton, q, k, v, pitch, offset, torch.from_numpy(qpos),
        torch.from_numpy(kpos), 0.5, causal,
    )  # fmt: skip
    _check(*out, ref, base, "float32")
    assert [kw.get("num_samples") for kw in asked] == [s]


def test_no_counts_ablation_is_the_causal_window_mask():
    """``variant=3`` (benchmark ablation) weights every planned key by 1: the result is the
    softmax over the keys of the planned range that the causal mask admits, not PLSH."""
    q, k, v, partition, qpos, kpos, causal = _fixed_case(n=20, s=3)
    out, _ = _run(q, k, v, partition, qpos, kpos, causal, 0.5, variant=3)
    ref, base = _reference(q, k, v, partition, qpos, kpos, causal, 0.5, "float32")
    with pytest.raises(AssertionError):
        assert_close_to_reference(out, ref[0], base[0], "float32", name="output")


def test_bfloat16():
    """bf16 inputs (native bf16 dots when compiled; float32 after load in the interpreter)."""
    q, k, v, partition, qpos, kpos, causal = _fixed_case(torch.bfloat16, n=33)
    ref, base = _reference(q, k, v, partition, qpos, kpos, causal, 0.4, "bfloat16")
    out, lse = _run(q, k, v, partition, qpos, kpos, causal, 0.4)
    assert out.dtype == torch.bfloat16
    _check(out, lse, ref, base, "bfloat16")


def test_wide_heads_up_to_256():
    """head_dim 200 (padded to 256) and head_dim_v 256, float16."""
    rng = np.random.default_rng(12)
    partition = draw_partition(np.array([5.0]), 3, seed=12)
    pos = np.arange(21)
    q, k = (torch.from_numpy(rng.standard_normal((1, 1, 21, 200))).half() for _ in range(2))
    v = torch.from_numpy(rng.standard_normal((1, 1, 21, 256))).half()
    ref, base = _reference(q, k, v, partition, pos, pos, True, 0.07, "float16")
    out, lse = _run(q, k, v, partition, pos, pos, True, 0.07)
    _check(out, lse, ref, base, "float16")


def test_batch_invariance():
    """A batch row computed alone equals the same row inside a batch, bit for bit."""
    rng = np.random.default_rng(3)
    partition = draw_partition(np.array([2.0, 30.0]), 3, seed=3)
    qpos, kpos = np.arange(20) + 17, np.arange(37)
    q = torch.from_numpy(rng.standard_normal((3, 2, 20, 5))).float()
    k = torch.from_numpy(rng.standard_normal((3, 1, 37, 5))).float()
    v = torch.from_numpy(rng.standard_normal((3, 1, 37, 6))).float()
    out, lse = _run(q, k, v, partition, qpos, kpos, True, 0.7)
    out1, lse1 = _run(q[1:2], k[1:2], v[1:2], partition, qpos, kpos, True, 0.7)
    assert torch.equal(out[1:2], out1) and torch.equal(lse[1:2], lse1)


def test_empty_rows_and_lengths():
    """Rows without admissible key give output 0 and lse -inf; n_k = 0 and n_q = 0 work."""
    partition = draw_partition(np.array([4.0]), 2, seed=0)
    q = torch.randn(1, 1, 5, 4)
    k = torch.randn(1, 1, 6, 4)
    # queries before every key under causal masking: all rows empty
    out, lse = _run(q, k, k, partition, np.arange(5) - 100, np.arange(6), True, 0.5)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()
    out, lse = _run(q, k[:, :, :0], k[:, :, :0], partition, np.arange(5), np.arange(0), False, 0.5)
    assert out.shape == (1, 1, 5, 4) and torch.isneginf(lse).all() and not out.any()
    out, lse = _run(q[:, :, :0], k, k, partition, np.arange(0), np.arange(6), False, 0.5)
    assert out.shape == (1, 1, 0, 4) and lse.shape == (1, 1, 0)


def test_tiny_pitch_over_a_wide_span_is_exact():
    """Tiny pitches over a wide position span (bins beyond the int32 range): still exact."""
    pitch = np.array([[1e-3, 5.0, 20.0]])
    partition = PartitionSample(pitch, pitch * np.array([[0.3, 0.9, 0.5]]))
    rng = np.random.default_rng(5)
    kpos = np.sort(rng.choice(3 * 10**6, size=30, replace=False)).astype(np.int64)
    kpos[5:12] = kpos[5] + np.arange(7)  # a run of consecutive positions
    qpos = kpos.copy()
    assert np.ptp(bins(partition, kpos)) > 2**31
    q, k, v = (torch.from_numpy(rng.standard_normal((1, 1, 30, 4))).float() for _ in range(3))
    ref, base = _reference(q, k, v, partition, qpos, kpos, True, 0.5, "float32")
    out, lse = _run(q, k, v, partition, qpos, kpos, True, 0.5)
    _check(out, lse, ref, base, "float32")


@settings(max_examples=25)
@given(
    sigma=st.lists(st.floats(0.05, 300.0), min_size=1, max_size=3),
    s=st.integers(1, 20),
    seed=st.integers(0, 2**32 - 1),
    base=st.integers(-(2**45), 2**45),
    n=st.integers(1, 70),
    spread=st.integers(1, 1000),
)
def test_kernel_bins_equal_reference_bits(sigma, s, seed, base, n, spread):
    """The Triton float64 bins equal plsh_ref.partition.bins bit for bit (SPEC section 2)."""
    partition = draw_partition(np.array(sigma), s, seed=seed)
    rng = np.random.default_rng(seed)
    pos = (base + rng.integers(-spread, spread, size=n)).astype(np.int64)
    got = _triton_interp.call(
        plsh_triton.compute_bins, *_tensors(partition), torch.from_numpy(pos), block=BLOCK
    )
    assert got.dtype == torch.int64
    np.testing.assert_array_equal(got.numpy(), bins(partition, pos))


@settings(max_examples=10)
@given(
    mode=st.sampled_from(["default", "shifted", "gaps"]),
    causal=st.booleans(),
    n_q=st.integers(1, 90),
    n_k=st.integers(1, 90),
    seed=st.integers(0, 2**31 - 1),
)
def test_planned_ranges_cover_every_collision(mode, causal, n_q, n_k, seed):
    """Every pair with C_ij > 0 lies in its query tile's key range and key tile's query range
    (sorted positions: the plan's precondition; the entry points sort)."""
    rng = np.random.default_rng(seed)
    partition = draw_partition(np.array([1.41, 8.0, 64.0]), 5, seed=seed)
    qpos, kpos = _positions(mode, n_q, n_k, rng)
    plan = _triton_interp.call(
        plsh_triton.make_plan,
        torch.from_numpy(qpos),
        torch.from_numpy(kpos),
        *_tensors(partition),
        causal=causal,
        block_m=BLOCK,
        block_n=BLOCK,
    )
    plan = _triton_interp.call(plsh_triton.plan_query_range, plan)
    c = counts(partition, qpos, kpos, causal=causal)
    kr = plan.key_range.numpy()
    qr = plan.query_range.numpy()
    hs, iq, jk = np.nonzero(c)
    assert np.all(kr[hs, iq // BLOCK, 0] <= jk) and np.all(jk < kr[hs, iq // BLOCK, 1])
    assert np.all(qr[hs, jk // BLOCK, 0] <= iq) and np.all(iq < qr[hs, jk // BLOCK, 1])
    assert np.all(kr[..., 0] % BLOCK == 0) and np.all(qr[..., 0] % BLOCK == 0)


def test_planned_range_is_local_for_sorted_positions():
    """For sorted positions and small sigma the key range is a short window, not all keys."""
    partition = draw_partition(np.array([2.0]), 8, seed=11)
    pos = torch.arange(2000)
    plan = _triton_interp.call(
        plsh_triton.make_plan, pos, pos, *_tensors(partition), causal=True, block_m=64, block_n=64
    )
    width = (plan.key_range[..., 1] - plan.key_range[..., 0]).max().item()
    # a key range is the tile (64) + at most one extra aligned tile for sigma = 2 at s = 8
    # unless a pitch exceeds 64 tokens: P[Gamma(2, 2) > 64] = 33 e^-32, negligible.
    assert width <= 128


@pytest.mark.parametrize("causal", [True, False])
def test_unsorted_positions_are_planned_in_sorted_order(monkeypatch, causal):
    """Shuffled positions: the kernel runs on rows sorted by position (bounded key ranges)
    and returns rows in the caller's order."""
    seen = _triton_interp.record_plans(monkeypatch)
    rng = np.random.default_rng(21)
    n_q, n_k = 37, 45
    partition = draw_partition(np.array([2.0, 9.0]), 4, seed=21)
    qpos, kpos = rng.permutation(np.arange(n_q) * 3), rng.permutation(np.arange(n_k) * 3 - 20)
    q = torch.from_numpy(rng.standard_normal((1, 2, n_q, 8))).float()
    k, v = (torch.from_numpy(rng.standard_normal((1, 1, n_k, 8))).float() for _ in range(2))
    ref, base = _reference(q, k, v, partition, qpos, kpos, causal, 0.5, "float32")
    out, lse = _run(q, k, v, partition, qpos, kpos, causal, 0.5)
    _check(out, lse, ref, base, "float32")
    assert len(seen) == 1
    for positions in seen[0]:
        assert bool((positions[1:] >= positions[:-1]).all())


def test_heads_with_the_most_planned_work_are_launched_first():
    """head_order lists heads by decreasing planned key tiles (largest sigma first)."""
    partition = draw_partition(np.array([1.5, 200.0, 20.0]), 8, seed=2)
    pos = torch.arange(300)
    plan = _triton_interp.call(
        plsh_triton.make_plan, pos, pos, *_tensors(partition), causal=True, block_m=16, block_n=16
    )
    width = (plan.key_range[..., 1] - plan.key_range[..., 0]).sum(dim=1)
    assert plan.head_order.tolist()[0] == 1 and plan.head_order.tolist()[-1] == 0
    assert torch.all(width[plan.head_order.long()].diff() <= 0)


def test_mode_follows_the_device():
    """Compiled kernels on CUDA tensors when a GPU is present, interpreted on CPU otherwise."""
    kind = type(forward_module._fwd_kernel).__name__
    if torch.cuda.is_available() and _triton_interp.COMPILED:
        assert kind == "JITFunction" and _triton_interp.DEVICE.type == "cuda"
    else:
        assert kind == "InterpretedFunction" and _triton_interp.DEVICE.type == "cpu"


@pytest.mark.parametrize("head_dims", [(48, 80), (96, 20)])
def test_head_dims_split_in_two_column_chunks(head_dims):
    """head_dim 48 = 32 + 16, 80 = 64 + 16, 96 = 64 + 32: two column chunks, not padding
    to the next power of two; the reference all the same."""
    d, dv = head_dims
    assert plsh_triton.head_dim_split(max(d, dv))[1] > 0
    rng = np.random.default_rng(d + dv)
    partition = draw_partition(np.array([4.0, 15.0]), 3, seed=d)
    pos = np.arange(30)
    q, k = (torch.from_numpy(rng.standard_normal((1, 2, 30, d))).half() for _ in range(2))
    v = torch.from_numpy(rng.standard_normal((1, 2, 30, dv))).half()
    ref, base = _reference(q, k, v, partition, pos, pos, True, 0.15, "float16")
    out, lse = _run(q, k, v, partition, pos, pos, True, 0.15)
    _check(out, lse, ref, base, "float16")


def test_column_halves_split_head_dim_in_two_equal_chunks():
    """``halves``: two equal power-of-two chunks covering head_dim (the float32 and sm_80
    tiles); without it the uneven split of the other tiles."""
    split = plsh_triton.head_dim_split
    assert [split(d, halves=True) for d in (20, 40, 64, 80, 96, 128)] == [
        (16, 16), (32, 32), (32, 32), (64, 64), (64, 64), (64, 64),
    ]  # fmt: skip
    assert [split(d) for d in (20, 64, 80, 96, 128)] == [
        (32, 0),
        (64, 0),
        (64, 16),
        (64, 32),
        (128, 0),
    ]
    assert split(16, halves=True) == (16, 0)  # one 16-wide chunk cannot be halved


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("capability", [(9, 0), (8, 0)])
def test_tile_configs_are_consistent(dtype, capability):
    """Every shipped GPU tile configuration: power-of-two tiles, a dK/dV query tile that
    divides the plan's, pipelined loops (>= 2 stages); float32 at head_dim <= 128 in two
    column halves, except the sm_90 forward at a head_dim that is not a power of two (the
    AOT tables' spill-free configurations); on sm_90 the half types take backward column
    halves and float32 ``maxnreg = 254`` in the forward only between 96 and 128; the
    narrower of unequal head sizes is whole wherever the backward takes column halves."""
    for d in (16, 40, 64, 96, 112, 120, 128, 200, 256):
        cfg = plsh_triton.tile_config(d, d, torch.device("cuda"), dtype, capability)
        for size in (cfg.block_m, cfg.block_n, cfg.dkdv_block_m):
            assert size >= 16 and size & (size - 1) == 0
        assert cfg.block_m % cfg.dkdv_block_m == 0 and cfg.num_stages >= 2
        assert cfg.block_n % (cfg.dq_block_n or cfg.block_n) == 0
        assert cfg.num_warps in (4, 8) and cfg.dq_num_warps in (4, 8)
        assert cfg.dkdv_num_warps in (4, 8)
        if dtype == torch.float32 or capability < (9, 0):
            assert cfg.column_halves == cfg.halves(forward=False) == (d <= 128)
            odd_hopper_fp32 = dtype == torch.float32 and capability >= (9, 0) and d in (40, 96)
            assert cfg.halves(forward=True) == (d <= 128 and not odd_hopper_fp32)
        else:
            assert cfg.halves(forward=False) == (96 < d < 128) and not cfg.halves(forward=True)
        assert cfg.narrow_whole == cfg.column_halves
        hopper_fp32 = dtype == torch.float32 and capability >= (9, 0)
        assert (cfg.fwd_maxnreg == 254) == (hopper_fp32 and 96 < d < 128)
        assert plsh_triton.default_blocks(d, d, torch.device("cuda"), dtype, capability) == (
            cfg.block_m,
            cfg.block_n,
            cfg.num_warps,
            cfg.num_stages,
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("capability", [(9, 0), (8, 0)])
def test_tile_config_rules_for_more_than_64_samples(dtype, capability):
    """``tile_config(..., num_samples=s)``: up to 64 samples (one pass of the counts) the
    configuration without ``num_samples`` (the AOT tables' s <= 64 kernels); above, only
    the rules of ``benchmarks/results/aot_2026-12-01_samples.md`` ("After the s > 64
    rules"): the half types on sm_80 at head_dim <= 128 let ptxas use 255 registers in the
    dK/dV kernel (it stopped at 168 and spilled 72 B at s = 256, Triton 3.9); float32 on
    sm_90 at head_dim <= 128 compares every sample (``classify=False``: with the skips of
    full/disjoint samples the dQ kernel spilled 16-96 B and the forward 16-40 B)."""
    dev = torch.device("cuda")
    for d in (16, 40, 64, 96, 112, 120, 128, 200, 256):
        base = plsh_triton.tile_config(d, d, dev, dtype, capability)
        for s in (1, 2, 16, 33, 64):
            assert plsh_triton.tile_config(d, d, dev, dtype, capability, num_samples=s) == base
        rules = {}
        if dtype != torch.float32 and capability < (9, 0) and d <= 128:
            rules["dkdv_maxnreg"] = 255
        if dtype == torch.float32 and capability >= (9, 0) and d <= 128:
            rules["classify"] = False
        for s in (65, 96, 128, 256, 257, 1000):
            cfg = plsh_triton.tile_config(d, d, dev, dtype, capability, num_samples=s)
            assert cfg == dataclasses.replace(base, **rules)


def test_backward_chunks_keep_the_narrower_head_size_whole():
    """``TileConfig.narrow_whole``: the narrower of unequal head sizes in one piece (64, or
    40 -> 32 + 16), the wider in halves; equal sizes and ``narrow_whole=False`` in halves;
    the dK/dV kernel's column-half programs (``dkdv_split_d``) keep halves of both."""
    base = plsh_triton.TileConfig(64, 16, 4, 2, 8, 16, 4, True)
    whole = dataclasses.replace(base, narrow_whole=True)
    assert base.backward_chunks(64, 128, dkdv=False) == ((32, 32), (64, 64))
    assert whole.backward_chunks(64, 128, dkdv=False) == ((64, 0), (64, 64))
    assert whole.backward_chunks(128, 64, dkdv=True) == ((64, 64), (64, 0))
    assert whole.backward_chunks(40, 96, dkdv=False) == ((32, 16), (64, 64))
    assert whole.backward_chunks(128, 128, dkdv=False) == ((64, 64), (64, 64))
    split = dataclasses.replace(whole, dkdv_split_d=True)
    assert split.backward_chunks(64, 128, dkdv=True) == ((32, 32), (64, 64))
    assert split.backward_chunks(64, 128, dkdv=False) == ((64, 0), (64, 64))
    halfless = dataclasses.replace(whole, column_halves=False)
    assert halfless.backward_chunks(64, 128, dkdv=False) == ((64, 0), (128, 0))


@pytest.mark.parametrize("head_dims", [(40, 40), (96, 72)])
def test_float32_column_halves_match_the_reference(head_dims):
    """float32 takes head_dim in two equal column chunks (40 -> 32 + 32 with 24 masked
    columns, 96 -> 64 + 64): the reference all the same."""
    d, dv = head_dims
    cfg = plsh_triton.tile_config(d, dv, _triton_interp.DEVICE, torch.float32)
    assert cfg.column_halves
    rng = np.random.default_rng(d)
    partition = draw_partition(np.array([4.0, 15.0]), 3, seed=d)
    pos = np.arange(30)
    q, k = (torch.from_numpy(rng.standard_normal((1, 2, 30, d))).float() for _ in range(2))
    v = torch.from_numpy(rng.standard_normal((1, 2, 30, dv))).float()
    ref, base = _reference(q, k, v, partition, pos, pos, True, 0.15, "float32")
    out, lse = _run(q, k, v, partition, pos, pos, True, 0.15)
    _check(out, lse, ref, base, "float32")


@pytest.mark.skipif(not _triton_interp.COMPILED, reason="needs CUDA (compiled kernels)")
def test_forward_with_sorted_positions_never_synchronises():
    """positions_sorted=True: planning and kernels are device work only (no host sync)."""
    rng = np.random.default_rng(1)
    partition = draw_partition(np.array([3.0, 40.0]), 16, seed=1)
    dev = _triton_interp.DEVICE
    q, k, v = (
        torch.from_numpy(rng.standard_normal((1, 2, 300, 64))).half().to(dev) for _ in range(3)
    )
    pitch, offset = (t.to(dev) for t in _tensors(partition))
    pos = torch.arange(300, device=dev)
    plsh_triton.plsh_forward_triton(q, k, v, pitch, offset, pos, pos, 0.1, True)  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        plsh_triton.plsh_forward_triton(
            q, k, v, pitch, offset, pos, pos, 0.1, True, positions_sorted=True
        )
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("head_dim", [64, 72, 120, 5])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_aligned_rows_gives_16_element_strides(head_dim, layout):
    """The launch code's copy for pipelined loads: strides but the last are multiples of 16
    elements and the base 16-byte aligned; an input that already is comes back untouched.
    (At head_dim 72 and 120, without it, the forward and dQ kernels had no cp.async and some
    spilled: benchmarks/results/aot_2026-12-01_other_head_dims.md; the CI AOT set compiles
    the head_dim 72 forward and the head_dim 120 float32 dK/dV kernel to check it.)"""
    base = torch.randn(2, 5, 3, 3 * head_dim + 1)
    if layout == "contiguous":
        x = base[..., :head_dim].contiguous()
    elif layout == "transposed":  # (batch, seq, heads, d) storage, HF style
        x = base[..., :head_dim].contiguous().transpose(1, 2)
    else:  # a slice of a fused projection: unaligned strides and base
        x = base[..., 1 : 1 + head_dim]
    y = plsh_triton.aligned_rows(x)
    assert torch.equal(y, x) and y.shape == x.shape and y.dtype == x.dtype
    assert y.stride(-1) == 1 and all(s % 16 == 0 for s in y.stride()[:-1])
    assert y.data_ptr() % 16 == 0
    already = x.stride(-1) == 1 and all(s % 16 == 0 for s in x.stride()[:-1])
    already = already and x.data_ptr() % 16 == 0
    assert (y is x) == already  # no copy exactly when none is needed
    if head_dim == 64 and layout != "sliced":
        assert y is x  # the common head sizes are never copied
