"""The vectorised torch CPU path (:mod:`plsh_fast.cpu`) against the float64 reference.

Comparisons use the tolerance rule of SPEC section 6
(:func:`plsh_ref.testing.tolerance.assert_close_to_reference`): the error of the CPU path
must be at most twice that of plain torch attention with the same dense ``log M~`` bias in
the same dtype, plus 4 ulps of ``max|ref|``. ``CHUNK_ELEMENTS`` is lowered in most tests so
that several window buckets and chunks per head occur even at these small sizes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _cpu_problems import check_against_reference, make_problem, problems
from hypothesis import given, settings
from hypothesis import strategies as st

import plsh_fast.cpu as cpu
from plsh_fast import plsh_attention
from plsh_fast._partition import bins as torch_bins
from plsh_fast._partition import partition_tensors
from plsh_ref.partition import PartitionSample, draw_partition
from plsh_ref.partition import bins as ref_bins

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(cpu, "CHUNK_ELEMENTS", 2048)


@given(
    st.integers(0, 2**31 - 1),
    st.integers(0, 300),
    st.floats(-2.0, 10.0),
    st.sampled_from([1, 5, 64]),
)
def test_bins_equal_reference_bit_for_bit(seed, n, log2_sigma, num_samples):
    rng = np.random.default_rng(seed)
    partition = draw_partition(np.exp2([log2_sigma, log2_sigma / 2]), num_samples, seed=seed)
    pos = rng.integers(-(2**52), 2**52, size=n) if seed % 2 else rng.integers(-50, 10**6, size=n)
    pitch, offset = partition_tensors(partition, "cpu")
    got = torch_bins(pitch, offset, torch.from_numpy(pos.astype(np.int64)))
    assert got.dtype == torch.int64
    np.testing.assert_array_equal(got.numpy(), ref_bins(partition, pos))


@given(
    st.integers(0, 2**31 - 1),
    st.integers(1, 300),
    st.integers(1, 200),
    st.sampled_from([0, -7, 2**39]),
    st.floats(-3.0, 9.0),
)
def test_block_ranges_by_arithmetic_equal_searchsorted(seed, n_k, n_q, k0, log2_sigma):
    """Consecutive key positions: block ranges from bin boundaries equal binary search."""
    rng = np.random.default_rng(seed)
    partition = draw_partition(np.exp2([log2_sigma, log2_sigma + 2]), 7, seed=seed)
    pitch, offset = partition_tensors(partition, "cpu")
    kpos = torch.arange(n_k) + k0
    qpos = torch.sort(torch.from_numpy(rng.integers(k0 - 60, k0 + n_k + 60, size=n_q))).values
    bq = torch_bins(pitch, offset, qpos)
    bk = torch_bins(pitch, offset, kpos).contiguous()
    start, end = cpu._ranges.block_ranges_unit_steps(pitch, offset, bq, kpos)
    assert torch.equal(start, torch.searchsorted(bk, bq))
    assert torch.equal(end, torch.searchsorted(bk, bq, right=True))


@pytest.mark.parametrize("k0", [0, -5, 2**39])
def test_block_ranges_ragged_bin_table_equal_searchsorted(k0):
    """One tiny pitch among large ones (the s = 64 case): each sample's bin table covers its
    own bins (one ragged table; the tiny pitch alone has more bins than 2n), and the ranges
    still equal binary search."""
    rng = np.random.default_rng(3)
    pitch = torch.tensor([[0.3, 50.0, 61.5, 47.25, 80.0, 55.0, 52.0]], dtype=torch.float64)
    offset = pitch * torch.from_numpy(rng.random(pitch.shape))
    n = 400
    kpos = torch.arange(n) + k0
    qpos = torch.sort(torch.from_numpy(rng.integers(k0 - 30, k0 + n + 30, size=n))).values
    bq = torch_bins(pitch, offset, qpos)
    spans = bq.amax(-1) - bq.amin(-1) + 2
    assert int(spans.max()) > 2 * n + 2 and int(spans.sum()) <= spans.numel() * (2 * n + 2)
    start, end = cpu._ranges.block_ranges_unit_steps(pitch, offset, bq, kpos)
    bk = torch_bins(pitch, offset, kpos).contiguous()
    assert torch.equal(start, torch.searchsorted(bk, bq))
    assert torch.equal(end, torch.searchsorted(bk, bq, right=True))


@given(problems())
def test_matches_reference(problem):
    out, lse = plsh_attention(
        problem.query, problem.key, problem.value, return_lse=True, **problem.kwargs
    )
    check_against_reference(problem, out, lse)


@settings(max_examples=10)
@given(problems(dtypes=("float64",)))
def test_matches_reference_float64(problem):
    out, lse = plsh_attention(
        problem.query, problem.key, problem.value, return_lse=True, **problem.kwargs
    )
    check_against_reference(problem, out, lse)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mode", ["default", "unsorted"])
def test_plain_torch_fallback_matches_reference(monkeypatch, dtype, mode):
    monkeypatch.setattr(cpu, "USE_FUSED_TILES", False)
    problem = make_problem(
        3,
        batch=2,
        num_heads=4,
        group=2,
        n_q=90,
        n_k=77,
        head_dim=7,
        head_dim_v=4,
        dtype=dtype,
        mode=mode,
        num_samples=8,
        log2_sigma=(0.0, 7.0),
    )
    out, lse = plsh_attention(
        problem.query, problem.key, problem.value, return_lse=True, **problem.kwargs
    )
    check_against_reference(problem, out, lse)


@pytest.mark.parametrize("causal", [True, False])
def test_longer_sequences_with_several_tile_sizes(causal):
    # sigma from 2 to 256: tile heights 16..64, windows from a few keys to the whole row
    problem = make_problem(
        11,
        num_heads=4,
        n_q=700,
        n_k=700,
        head_dim=16,
        head_dim_v=16,
        causal=causal,
        num_samples=16,
        log2_sigma=(1.0, 8.0),
    )
    out, lse = plsh_attention(
        problem.query, problem.key, problem.value, return_lse=True, **problem.kwargs
    )
    check_against_reference(problem, out, lse)


def test_batch_invariance():
    """A batch row computed alone equals the same row inside a batch, bit for bit."""
    problem = make_problem(
        5, batch=3, num_heads=2, n_q=150, n_k=150, head_dim=8, head_dim_v=8, num_samples=8
    )
    whole = plsh_attention(problem.query, problem.key, problem.value, **problem.kwargs)
    for b in range(3):
        alone = plsh_attention(
            problem.query[b : b + 1],
            problem.key[b : b + 1],
            problem.value[b : b + 1],
            **problem.kwargs,
        )
        assert torch.equal(alone[0], whole[b])


def test_tiles_touch_only_the_reachable_window():
    """Memory and work O(n * window): far fewer logits than n^2 when sigma << n."""
    n = 4096
    partition = draw_partition(np.array([4.0, 16.0]), 16, seed=0)
    pitch, offset = partition_tensors(partition, "cpu")
    pos = torch.arange(n)
    plan = cpu._planning.make_plan(pitch, offset, pos, pos, True, torch.float32)
    logits = 0
    for chunk in plan.chunks():
        assert chunk.bias.numel() <= max(
            cpu.CHUNK_ELEMENTS, chunk.bias.shape[1] * chunk.bias.shape[2]
        )
        logits += chunk.bias.numel()
    # expected causal window ~ sigma (ln 16 + 0.58) + tile: about 50 and 130 keys per row
    assert logits < 2 * n * 200
    assert logits > n * (4 + 16)  # every row sees at least about sigma keys


@pytest.mark.parametrize("n_q,n_k", [(0, 0), (0, 5), (5, 0), (1, 1), (1, 9), (9, 1)])
def test_tiny_and_empty_sequences(n_q, n_k):
    problem = make_problem(1, batch=2, n_q=n_q, n_k=n_k)
    out, lse = plsh_attention(
        problem.query, problem.key, problem.value, return_lse=True, **problem.kwargs
    )
    assert out.shape == (2, 2, n_q, 3) and lse.shape == (2, 2, n_q)
    if n_k == 0:
        assert torch.equal(out, torch.zeros_like(out))
        assert torch.isneginf(lse).all()
    else:
        check_against_reference(problem, out, lse)


def test_rows_without_admissible_key():
    """Queries before every key (causal): output exactly 0, LSE -inf, never NaN."""
    problem = make_problem(2, n_q=6, n_k=10, causal=True, mode="default")
    qpos = np.array([-9, -3, 0, 4, 5, 9])  # each of the last four is a key position
    kpos = np.arange(10)
    out, lse = plsh_attention(
        problem.query,
        problem.key,
        problem.value,
        return_lse=True,
        partition=problem.partition,
        query_positions=qpos,
        key_positions=kpos,
    )
    assert torch.equal(out[:, :, :2], torch.zeros_like(out[:, :, :2]))
    assert torch.isneginf(lse[:, :, :2]).all() and torch.isfinite(lse[:, :, 2:]).all()
    assert not torch.isnan(out).any()


def _corrupt(monkeypatch, how):
    original = cpu._chunks.make_chunk

    def make_chunk(self, *args):
        chunk = original(self, *args)
        admissible = torch.isfinite(chunk.bias)  # inadmissible keys have bias -inf
        if how == "counts_ignored":
            chunk.bias = torch.where(admissible, 0.0, chunk.bias).to(chunk.bias.dtype)
        else:  # sign of the bias flipped
            chunk.bias = torch.where(admissible, -chunk.bias, chunk.bias)
        return chunk

    monkeypatch.setattr(cpu._chunks, "make_chunk", make_chunk)
    cpu.clear_plan_cache()  # a kept plan would skip the corrupted chunk builder


@pytest.mark.parametrize("how", ["counts_ignored", "sign_flipped"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_negative_controls_fail_the_same_check(monkeypatch, how, dtype):
    problem = make_problem(
        7,
        num_heads=2,
        n_q=80,
        n_k=80,
        head_dim=8,
        head_dim_v=8,
        dtype=dtype,
        num_samples=8,
        log2_sigma=(3.0, 5.0),
    )
    out, lse = plsh_attention(
        problem.query, problem.key, problem.value, return_lse=True, **problem.kwargs
    )
    check_against_reference(problem, out, lse)  # the real kernel passes
    _corrupt(monkeypatch, how)
    bad_out, bad_lse = plsh_attention(
        problem.query, problem.key, problem.value, return_lse=True, **problem.kwargs
    )
    with pytest.raises(AssertionError):
        check_against_reference(problem, bad_out, bad_lse)


@settings(max_examples=10)
@given(problems(dtypes=("float32",), max_len=40))
def test_chunk_size_does_not_change_the_result(problem):
    small = plsh_attention(problem.query, problem.key, problem.value, **problem.kwargs)
    cpu.CHUNK_ELEMENTS = 1 << 20
    large = plsh_attention(problem.query, problem.key, problem.value, **problem.kwargs)
    cpu.CHUNK_ELEMENTS = 2048
    magnitude = large.abs().max().item() if large.numel() else 1.0
    torch.testing.assert_close(small, large, rtol=4e-6, atol=4e-6 * magnitude)


def test_tile_groups_pad_little_and_cover_every_window(monkeypatch):
    """Stacked tiles are padded to at most 8/7 of their own window, never below it
    (groups of tiles sorted by width; bands are checked in tests/fast/cpu/test_cpu_band.py)."""
    monkeypatch.setattr(cpu, "BAND_MAX_TILE", 0)
    n = 3000
    partition = draw_partition(np.array([3.0, 40.0, 300.0]), 16, seed=4)
    pitch, offset = partition_tensors(partition, "cpu")
    pos = torch.arange(n)
    plan = cpu._planning.make_plan(pitch, offset, pos, pos, True, torch.float32)
    seen = 0
    for h in range(3):
        start, end = plan.ranges(h)
        for spec in plan.head_specs(h):
            chunk = plan.build(spec)
            w = chunk.keys.shape[1]
            for tile_rows in chunk.rows:
                rows = tile_rows[tile_rows < n]
                nonempty = end[:, rows] > start[:, rows]
                need = (end[:, rows][nonempty].max() - start[:, rows][nonempty].min()).item()
                assert need <= w <= max(8 * need / 7, need + 1)
                seen += 1
    assert seen == sum(-(-n // t) for t in plan.tiles)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("mode", ["default", "gaps", "unsorted"])
def test_cell_pattern_bias_equals_per_row_bias(monkeypatch, causal, mode):
    """The bias copied from one row per cell (then causally cut) is bit-identical to the
    bias counted row by row, for every chunk."""
    rng = np.random.default_rng(3)
    n_q, n_k = 300, 340
    if mode == "default":
        qpos, kpos = torch.arange(n_k - n_q, n_k), torch.arange(n_k)
    elif mode == "gaps":
        kpos = torch.from_numpy(np.cumsum(rng.integers(1, 4, n_k)) - 50)
        qpos = torch.from_numpy(np.sort(rng.integers(-60, int(kpos[-1]) + 5, n_q)))
    else:
        kpos = torch.from_numpy(rng.permutation(n_k) * 2)
        qpos = torch.from_numpy(rng.permutation(n_q) * 2 + 1)
    partition = draw_partition(np.array([1.5, 30.0, 400.0]), 8, seed=2)
    pitch, offset = partition_tensors(partition, "cpu")
    plan = cpu._planning.make_plan(pitch, offset, qpos, kpos, causal, torch.float32)
    biases = {}
    for fraction in (0.0, 1.0):
        monkeypatch.setattr(cpu, "PATTERN_ROWS_FRACTION", fraction)
        biases[fraction] = [(c.rows, c.keys, c.bias, c.empty) for c in plan.chunks()]
    assert len(biases[0.0]) == len(biases[1.0]) > 3
    for per_row, pattern in zip(biases[0.0], biases[1.0]):
        for a, b in zip(per_row, pattern):
            assert torch.equal(a, b)


@pytest.mark.parametrize("fraction", [0.0, 1.0])
def test_both_bias_constructions_match_the_reference(monkeypatch, fraction):
    monkeypatch.setattr(cpu, "PATTERN_ROWS_FRACTION", fraction)
    problem = make_problem(
        17,
        num_heads=3,
        n_q=260,
        n_k=300,
        head_dim=8,
        head_dim_v=8,
        causal=True,
        num_samples=8,
        log2_sigma=(0.0, 9.0),
    )
    out, lse = plsh_attention(
        problem.query, problem.key, problem.value, return_lse=True, **problem.kwargs
    )
    check_against_reference(problem, out, lse)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("cells", [0.0, 1.0], ids=["per_row_counts", "cell_counts"])
def test_masked_keys_get_zero_weight_even_with_huge_logits(monkeypatch, fused, cells):
    """Regression: the bias of an inadmissible key was the finite -1e30, so a causally
    masked key whose logit exceeded the admissible ones by ~1e30 won the softmax."""
    from plsh_ref.attention import plsh_attention as reference

    monkeypatch.setattr(cpu, "USE_FUSED_TILES", fused)
    monkeypatch.setattr(cpu, "PATTERN_ROWS_FRACTION", cells)
    partition = draw_partition(np.array([4.0, 30.0]), 4, seed=0)
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 40, 4, generator=gen) * 1e16 for _ in range(2))
    v = torch.randn(1, 2, 40, 4, generator=gen)
    out = plsh_attention(q, k, v, partition=partition)
    ref, _ = reference(
        q.double().numpy(),
        k.double().numpy(),
        v.double().numpy(),
        partition=partition,
        return_lse=True,
    )
    torch.testing.assert_close(out.double(), torch.from_numpy(ref), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("sigma", [1e-18**-1, 1e20, 1e100])
def test_huge_sigma_gives_plain_causal_attention(sigma):
    """Regression: pitches above ~9e18 overflowed int64 in the bin-boundary arithmetic, so
    every block came out empty (output 0, LSE -inf) instead of one bin for all tokens."""
    from plsh_ref.attention import plsh_attention as reference

    partition = draw_partition(np.array([sigma]), 4, seed=0)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 1, 64, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    out, lse = plsh_attention(q, k, v, partition=partition, return_lse=True)
    ref, ref_lse = reference(q.numpy(), k.numpy(), v.numpy(), partition=partition, return_lse=True)
    torch.testing.assert_close(out, torch.from_numpy(ref), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, torch.from_numpy(ref_lse), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("offset", [1e15, 1e16, 1e17])
def test_large_offsets_of_a_hand_made_partition(offset):
    """Regression: with |offset| past ~1e16 the bin boundaries of the consecutive-positions
    shortcut were off by more than one token; such partitions now take binary search."""
    from plsh_ref.attention import plsh_attention as reference

    partition = PartitionSample(np.array([[3.0, 7.0]]), np.array([[offset, 3 * offset]]))
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 1, 64, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    out = plsh_attention(q, k, v, partition=partition)
    ref, _ = reference(q.numpy(), k.numpy(), v.numpy(), partition=partition, return_lse=True)
    torch.testing.assert_close(out, torch.from_numpy(ref), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("num_samples", [100, 1000])
def test_lse_far_below_log_s_keeps_float32_precision(num_samples):
    """Regression: the LSE was computed with bias log C and log s subtracted afterwards in
    float32, which cancels when the LSE is far below log s (one token, every count s)."""
    import dataclasses

    problem = make_problem(
        3,
        num_heads=1,
        n_q=1,
        n_k=1,
        head_dim=4,
        head_dim_v=4,
        num_samples=num_samples,
        log2_sigma=(20.0, 20.0),
    )
    problem = dataclasses.replace(problem, query=problem.query * 0.05)
    out, lse = plsh_attention(
        problem.query, problem.key, problem.value, return_lse=True, **problem.kwargs
    )
    check_against_reference(problem, out, lse)


@pytest.mark.parametrize("threads", [1, 2])
def test_inference_mode_with_worker_threads(monkeypatch, threads):
    """Regression: with two torch threads the worker threads ran outside the caller's
    inference mode and failed updating its inference tensors in place."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        q = torch.randn(1, 2, 64, 8, generator=torch.Generator().manual_seed(0))
        expected = plsh_attention(q, q, q, seed=0, num_samples=4)
        with torch.inference_mode():
            out = plsh_attention(q, q, q, seed=0, num_samples=4)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(out, expected)
