"""plsh_ref.partition at its edges: the documented draw (each sampler's formula, replayed
from the head's stream), the sample's refusals and slices at their limits, bins at the
edge of the int64 range, counts and the count bias entry by entry.
"""

from __future__ import annotations

import numpy as np
import pytest

from plsh_ref import partition as P
from plsh_ref.samplers import stratified_pitch


def _sample(pitch, offset, sampler="iid"):
    return P.PartitionSample(np.asarray(pitch, float), np.asarray(offset, float), sampler)


# --- the draw, replayed from its documented formula ------------------------------------


def test_iid_draw_is_the_documented_formula():
    sigma = np.array([3.0, 0.5, 40.0])
    part = P.draw_partition(sigma, 5, seed=11, head_start=2)
    assert part.sampler == "iid" and part.pitch.shape == (3, 5)
    for h in range(3):
        rng = np.random.default_rng(np.random.SeedSequence(11, spawn_key=(2 + h,)))
        pitch = rng.gamma(2.0, scale=sigma[h], size=5)
        np.testing.assert_array_equal(part.pitch[h], pitch)
        np.testing.assert_array_equal(part.offset[h], pitch * rng.random(5))


def test_head_rng_is_the_spawned_child():
    child = np.random.SeedSequence(7).spawn(4)[3]
    a = P.head_rng(7, 3).random(4)
    np.testing.assert_array_equal(a, np.random.default_rng(child).random(4))
    with pytest.raises(ValueError, match=r"^seed: must be >= 0, got -1$"):
        P.head_rng(-1, 0)
    with pytest.raises(ValueError, match=r"^head: must be >= 0, got -1$"):
        P.head_rng(0, -1)
    assert (
        P.head_rng(0, 0).random()
        == np.random.default_rng(np.random.SeedSequence(0, spawn_key=(0,))).random()
    )


@pytest.mark.parametrize("group", [2, 3])
def test_stratified_draw_is_the_documented_formula(group):
    sigma = np.array([2.0, 7.0])
    s = 6
    m = s // group
    part = P.draw_partition(sigma, s, seed=5, head_start=1, sampler="stratified", group_size=group)
    assert part.sampler == "stratified"
    for h in range(2):
        rng = P.head_rng(5, 1 + h)
        uniform, phase, order = rng.random(m), rng.random(m), rng.permutation(m)
        group_pitch = sigma[h] * stratified_pitch(uniform, 1.0)
        for i in range(m):
            k = order[i]
            for j in range(group):
                t = i * group + j
                assert part.pitch[h, t] == group_pitch[k]
                grid = (phase[k] + j / group) % 1.0
                assert part.offset[h, t] == group_pitch[k] * grid


def test_shared_draw_is_the_documented_formula():
    sigma = np.array([4.0])
    part = P.draw_partition(sigma, 6, seed=9, sampler="shared", group_size=3)
    rng = P.head_rng(9, 0)
    group_pitch = rng.gamma(2.0, scale=4.0, size=2)
    phase = rng.random(2)
    for k in range(2):  # groups in their natural order
        for j in range(3):
            assert part.pitch[0, 3 * k + j] == group_pitch[k]
            assert part.offset[0, 3 * k + j] == group_pitch[k] * ((phase[k] + j / 3) % 1.0)


def test_draw_refusals_and_edges():
    with pytest.raises(
        ValueError, match=r"^sigma: must be one-dimensional \(num_heads,\), got shape \(\)$"
    ):
        P.draw_partition(2.0, 4, seed=0)
    with pytest.raises(ValueError, match=r"^sigma: must be one-dimensional"):
        P.draw_partition([[2.0]], 4, seed=0)
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1, got 0$"):
        P.draw_partition([2.0], 0, seed=0)
    with pytest.raises(ValueError, match=r"^head_start: must be >= 0, got -1$"):
        P.draw_partition([2.0], 4, seed=0, head_start=-1)
    with pytest.raises(ValueError, match=r"^seed: must be >= 0, got -3$"):
        P.draw_partition([2.0], 4, seed=-3)
    one = P.draw_partition([2.0], 1, seed=0)
    assert one.num_samples == 1 and one.num_heads == 1
    fresh = P.draw_partition([2.0, 3.0], 3)  # seed None: OS entropy
    assert fresh.pitch.shape == (2, 3) and np.all(fresh.pitch > 0)
    assert np.all((0 <= fresh.offset) & (fresh.offset < fresh.pitch))


def test_fresh_entropy_differs_between_calls():
    # P(two 64-bit OS seeds collide) ~ 2^-64
    a = P.draw_partition([2.0], 4)
    b = P.draw_partition([2.0], 4)
    assert not np.array_equal(a.pitch, b.pitch)


def test_draw_refuses_no_heads():
    # was a PartitionSample with zero heads
    with pytest.raises(ValueError, match=r"^sigma: needs at least one head \(num_heads >= 1\)"):
        P.draw_partition([], 4, seed=0)
    with pytest.raises(ValueError, match=r"^sigma: needs at least one head"):
        P.draw_partition(np.zeros(0), 4, seed=0, sampler="stratified", group_size=2)
    assert P.draw_partition([1.0], 4, seed=0).num_heads == 1


# --- PartitionSample -------------------------------------------------------------------


def test_sample_refusals_at_their_edges():
    tiny = _sample([[5e-324]], [[0.0]])
    assert tiny.pitch[0, 0] == 5e-324
    with pytest.raises(ValueError, match=r"^pitch: every entry must be > 0$"):
        _sample([[1.0, 0.0]], [[0.0, 0.0]])
    with pytest.raises(
        ValueError, match=r"^pitch: needs at least one sample \(num_samples >= 1\)$"
    ):
        _sample(np.zeros((2, 0)), np.zeros((2, 0)))
    with pytest.raises(ValueError, match=r"^pitch: needs at least one head \(num_heads >= 1\)$"):
        _sample(np.zeros((0, 3)), np.zeros((0, 3)))
    with pytest.raises(
        ValueError, match=r"^offset: shape \(1, 2\) differs from pitch shape \(1, 3\)$"
    ):
        _sample([[1.0, 1.0, 1.0]], [[0.0, 0.0]])
    with pytest.raises(ValueError, match=r"^pitch: must have 2 dimensions"):
        _sample([1.0], [[0.0]])
    with pytest.raises(ValueError, match=r"^offset: contains NaN or infinite values$"):
        _sample([[1.0]], [[np.inf]])
    neg = _sample([[1.0]], [[-7.5]])  # any finite offset
    assert neg.offset[0, 0] == -7.5


def test_sample_arrays_are_frozen_copies():
    pitch = np.array([[1.0, 2.0]])
    part = _sample(pitch, [[0.0, 0.5]])
    pitch[0, 0] = 9.0
    assert part.pitch[0, 0] == 1.0
    assert part.pitch.dtype == np.float64 and part.pitch.flags.c_contiguous
    assert part.offset.flags.c_contiguous
    with pytest.raises(ValueError):
        part.pitch[0, 0] = 3.0
    with pytest.raises(ValueError):
        part.offset[0, 0] = 3.0
    fortran = _sample(np.asfortranarray(np.ones((2, 3))), np.asfortranarray(np.zeros((2, 3))))
    assert fortran.pitch.flags.c_contiguous and fortran.offset.flags.c_contiguous


def test_heads_and_samples_slices_at_their_edges():
    part = P.draw_partition([1.0, 2.0, 3.0], 4, seed=0, sampler="stratified", group_size=2)
    assert part.heads(0) == part
    assert part.heads(2).num_heads == 1
    last = part.heads(2, 3)
    np.testing.assert_array_equal(last.pitch, part.pitch[2:3])
    np.testing.assert_array_equal(last.offset, part.offset[2:3])
    assert last.sampler == "stratified"
    with pytest.raises(ValueError, match=r"^stop: must be <= num_heads=3, got 4$"):
        part.heads(0, 4)
    with pytest.raises(ValueError, match=r"^stop: must be >= 2, got 1$"):
        part.heads(1, 1)
    with pytest.raises(ValueError, match=r"^start: must be >= 0, got -1$"):
        part.heads(-1)
    with pytest.raises(ValueError, match=r"^start: must be < num_heads=3, got 3$"):
        part.heads(3)  # was a sample with zero heads
    with pytest.raises(ValueError, match=r"^start: must be < num_heads=3, got 7$"):
        part.heads(7)
    tail = part.samples(3, 4)
    np.testing.assert_array_equal(tail.pitch, part.pitch[:, 3:4])
    np.testing.assert_array_equal(tail.offset, part.offset[:, 3:4])
    assert tail.sampler == "stratified" and part.samples(0) == part
    assert part.samples(1).num_samples == 3
    with pytest.raises(ValueError, match=r"^stop: must be <= num_samples=4, got 5$"):
        part.samples(0, 5)
    with pytest.raises(ValueError, match=r"^stop: must be >= 3, got 2$"):
        part.samples(2, 2)
    with pytest.raises(ValueError, match=r"^start: must be >= 0, got -2$"):
        part.samples(-2)
    with pytest.raises(ValueError, match=r"^start: must be < num_samples=4, got 4$"):
        part.samples(4)


def test_equality_and_repr():
    a = _sample([[1.0, 2.0]], [[0.0, 0.5]])
    assert a == _sample([[1.0, 2.0]], [[0.0, 0.5]])
    assert a != _sample([[1.0, 2.0]], [[0.0, 0.25]])
    assert a != _sample([[1.0, 3.0]], [[0.0, 0.5]])
    assert a != _sample([[1.0, 2.0]], [[0.0, 0.5]], "shared")
    assert _sample([[1.0], [2.0]], [[0.0], [0.5]]) != _sample([[1.0, 2.0]], [[0.0, 0.5]])
    assert a.__eq__((a.pitch, a.offset)) is NotImplemented
    assert repr(a) == "PartitionSample(num_heads=1, num_samples=2)"
    assert repr(_sample([[1.0]], [[0.0]], "stratified")) == (
        "PartitionSample(num_heads=1, num_samples=1, sampler='stratified')"
    )


def test_save_and_load(tmp_path):
    part = P.draw_partition([1.0, 5.0], 4, seed=3, sampler="shared", group_size=2)
    part.save(tmp_path / "p.npz")
    back = P.PartitionSample.load(tmp_path / "p.npz")
    assert back == part and back.sampler == "shared"
    np.savez(tmp_path / "old.npz", pitch=part.pitch, offset=part.offset)  # no sampler key
    assert P.PartitionSample.load(tmp_path / "old.npz").sampler == "iid"
    np.savez(tmp_path / "bad.npz", pitch=part.pitch)
    with pytest.raises(ValueError, match=r"^path: file has no array 'offset'$"):
        P.PartitionSample.load(tmp_path / "bad.npz")
    np.savez(tmp_path / "bad2.npz", offset=part.offset)
    with pytest.raises(ValueError, match=r"^path: file has no array 'pitch'$"):
        P.PartitionSample.load(tmp_path / "bad2.npz")


# --- bins, blocks, masks, counts --------------------------------------------------------


def test_bins_entries_and_edges():
    part = _sample([[2.0, 3.0]], [[0.5, 0.0]])
    b = P.bins(part, [-1, 0, 2, 3, 5])
    assert b.dtype == np.int64 and b.shape == (1, 2, 5)
    assert b[0, 0].tolist() == [-1, -1, 0, 1, 2]  # floor((p - 0.5) / 2)
    assert b[0, 1].tolist() == [-1, 0, 0, 1, 1]  # floor(p / 3): p = 3 opens a new bin
    with pytest.raises(TypeError, match=r"^partition: must be a PartitionSample, got tuple$"):
        P.bins((part.pitch, part.offset), [0])
    assert P.bins(part, []).shape == (1, 2, 0)


def test_bins_int64_range_edge():
    # quotient exactly -2**63 is representable; 2**63 is not
    at_edge = _sample([[1.0]], [[2.0**63]])
    assert P.bins(at_edge, [0]).tolist() == [[[-(2**63)]]]
    beyond = _sample([[1.0]], [[-(2.0**63)]])
    with pytest.raises(ValueError, match=r"^partition: bin index floor\(\(p - offset\) / pitch\)"):
        P.bins(beyond, [0])
    below = _sample([[0.5]], [[2.0**63]])
    with pytest.raises(ValueError, match=r"^partition: bin index"):
        P.bins(below, [0])


def test_blocks_and_block_sizes():
    part = _sample([[2.0, 3.0], [10.0, 1.0]], [[0.5, 0.0], [0.0, 0.0]])
    pos = [0, 1, 2, 3, 4]
    assert [blk.tolist() for blk in P.blocks(part, pos, 0, 0)] == [[0], [1, 2], [3, 4]]
    assert [blk.tolist() for blk in P.blocks(part, pos, 0, 1)] == [[0, 1, 2], [3, 4]]
    assert [blk.tolist() for blk in P.blocks(part, pos, 1, 0)] == [[0, 1, 2, 3, 4]]
    assert P.blocks(part, [], 1, 1) == []
    with pytest.raises(ValueError, match=r"^head: must be < num_heads=2, got 2$"):
        P.blocks(part, pos, 2, 0)
    with pytest.raises(ValueError, match=r"^sample: must be < num_samples=2, got 2$"):
        P.blocks(part, pos, 0, 2)
    with pytest.raises(ValueError, match=r"^head: must be >= 0, got -1$"):
        P.blocks(part, pos, -1, 0)
    with pytest.raises(ValueError, match=r"^sample: must be >= 0, got -1$"):
        P.blocks(part, pos, 0, -1)
    sizes = P.block_sizes(part, pos)
    assert [[s.tolist() for s in head] for head in sizes] == [[[1, 2, 2], [3, 2]], [[5], [1] * 5]]
    with pytest.raises(TypeError, match=r"^partition: must be a PartitionSample"):
        P.block_sizes(None, pos)
    with pytest.raises(TypeError, match=r"^partition: must be a PartitionSample"):
        P.blocks(None, pos, 0, 0)


def test_masks_counts_and_mean_entries():
    part = _sample([[2.0, 3.0]], [[0.5, 0.0]])
    q, k = [2, 3], [0, 1, 2, 3]
    m = P.masks(part, q, k)
    assert m.dtype == np.bool_ and m.shape == (1, 2, 2, 4)
    # bins sample 0: keys [-1, 0, 0, 1], queries [0, 1]; sample 1: keys [0, 0, 0, 1]
    assert m[0, 0].tolist() == [[False, True, True, False], [False, False, False, True]]
    assert m[0, 1].tolist() == [[True, True, True, False], [False, False, False, True]]
    c = P.counts(part, q, k)
    assert c.dtype == np.int64 and c.tolist() == [[[1, 2, 2, 0], [0, 0, 0, 2]]]
    qc, kc = [1, 2], [0, 1, 2, 3]
    mc = P.masks(part, qc, kc, causal=True)
    cc = P.counts(part, qc, kc, causal=True)
    assert cc.tolist() == mc.sum(axis=1).tolist()
    assert cc[0].tolist() == [[1, 2, 0, 0], [1, 2, 2, 0]]  # p_key == p_query admitted
    np.testing.assert_array_equal(P.empirical_mean(part, qc, kc, causal=True), cc / 2)
    np.testing.assert_array_equal(P.empirical_mean(part, q, k), c / 2)
    with pytest.raises(TypeError, match=r"^causal: must be a bool"):
        P.counts(part, q, k, causal=1)
    with pytest.raises(TypeError, match=r"^causal: must be a bool"):
        P.masks(part, q, k, causal="yes")
    with pytest.raises(TypeError, match=r"^query_positions: positions must be integers"):
        P.counts(part, [0.5], k)
    with pytest.raises(TypeError, match=r"^key_positions: positions must be integers"):
        P.masks(part, q, [0.5])


def test_count_bias_edges():
    out = P.count_bias([0, 1, 4, 2], 4)
    assert out[0] == -np.inf and out[2] == 0.0
    assert out[1] == np.log(1 / 4) and out[3] == np.log(2 / 4)
    assert P.count_bias(np.zeros((0, 3)), 1).shape == (0, 3)
    for bad in ([5], [-1], [1.5]):
        with pytest.raises(ValueError, match=r"^counts: must be integers in \[0, num_samples=4\]$"):
            P.count_bias(bad, 4)
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1, got 0$"):
        P.count_bias([0], 0)
    assert P.count_bias([1.0], 1).tolist() == [0.0]


def test_derived_seed():
    state = np.random.SeedSequence([5, 2, 9]).generate_state(1, np.uint64)[0]
    assert P.derived_seed(5, 2, 9) == int(state) >> 1
    assert 0 <= P.derived_seed(0) < 2**63
    assert P.derived_seed(5, 2) != P.derived_seed(5, 3)
    assert type(P.derived_seed(1, 1)) is int
    with pytest.raises(ValueError, match=r"^keys: must be >= 0, got -1$"):
        P.derived_seed(1, -1)
    with pytest.raises(ValueError, match=r"^seed: must be >= 0, got -1$"):
        P.derived_seed(-1)


def test_default_num_samples():
    assert P.DEFAULT_NUM_SAMPLES == 16


# --- the draw with a kernel per head, replayed from its documented formula --------------


def _kernels():
    from plsh_ref.kernels import Exponential, KerpleLog

    # Exponential(1e-4): Gamma(2, 1e-4) pitches lie below PITCH_FLOOR = 2^-10 and are raised
    return [KerpleLog(0.7, 0.5), Exponential(1e-4), KerpleLog(0.7, 0.5), Exponential(3.0)]


def test_iid_kernel_draw_is_the_documented_formula():
    from plsh_ref.kernels import PITCH_FLOOR

    kern = _kernels()
    part = P.draw_partition(kern, 5, seed=4, head_start=3)
    assert part.sampler == "iid" and part.pitch.shape == (4, 5)
    for h, kernel in enumerate(kern):
        rng = P.head_rng(4, 3 + h)
        pitch = np.maximum(kernel.sample_pitch(rng, 5), PITCH_FLOOR)
        np.testing.assert_array_equal(part.pitch[h], pitch)
        np.testing.assert_array_equal(part.offset[h], pitch * rng.random(5))
    assert np.all(part.pitch[1] == PITCH_FLOOR)  # every pitch of Exponential(1e-4) raised
    assert P.draw_partition(tuple(kern), 5, seed=4, head_start=3) == part


@pytest.mark.parametrize("sampler, group", [("shared", 2), ("stratified", 2), ("stratified", 3)])
def test_grouped_kernel_draw_is_the_documented_formula(sampler, group):
    from plsh_ref.kernels import PITCH_FLOOR

    kern, s = _kernels(), 6
    m = s // group
    part = P.draw_partition(kern, s, seed=8, head_start=1, sampler=sampler, group_size=group)
    assert part.sampler == sampler
    for h, kernel in enumerate(kern):
        rng = P.head_rng(8, 1 + h)
        if sampler == "stratified":
            uniform, phase, order = rng.random(m), rng.random(m), rng.permutation(m)
            group_pitch = kernel.stratified_pitch(uniform)
        else:
            group_pitch = kernel.sample_pitch(rng, m)
            phase, order = rng.random(m), np.arange(m)
        group_pitch = np.maximum(group_pitch, PITCH_FLOOR)
        for i in range(m):
            k = order[i]
            for j in range(group):
                t = i * group + j
                assert part.pitch[h, t] == group_pitch[k]
                assert part.offset[h, t] == group_pitch[k] * ((phase[k] + j / group) % 1.0)
    assert np.all(part.pitch[1] == PITCH_FLOOR)


def test_kernel_draw_refusals():
    from plsh_ref.kernels import Exponential

    with pytest.raises(TypeError, match=r"^sigma: must be a sequence of DistanceKernel"):
        P.draw_partition(Exponential(2.0), 4, seed=0)  # one kernel, not a sequence
    for mixed in ([Exponential(2.0), 3.0], (3.0, Exponential(2.0))):
        with pytest.raises(TypeError, match=r"^sigma: each must be a DistanceKernel, got float$"):
            P.draw_partition(mixed, 4, seed=0)
    with pytest.raises(ValueError, match=r"^num_samples: must be >= 1, got 0$"):
        P.draw_partition([Exponential(2.0)], 0, seed=0)


# --- each argument named in its refusal, defaults, warnings (partition mutation run) ------


def test_refusals_name_the_positions_argument():
    part = _sample([[2.0]], [[0.5]])
    with pytest.raises(TypeError, match=r"^positions: positions must be integers"):
        P.bins(part, [0.5])
    with pytest.raises(TypeError, match=r"^query_positions: positions must be integers"):
        P.masks(part, [0.5], [0])
    with pytest.raises(TypeError, match=r"^key_positions: positions must be integers"):
        P.counts(part, [0], [0.5])


def test_masks_and_counts_are_bidirectional_by_default():
    part = _sample([[4.0]], [[0.0]])  # positions 0..3 in one bin
    assert P.masks(part, [0], [0, 3]).tolist() == [[[[True, True]]]]
    assert P.counts(part, [0], [0, 3]).tolist() == [[[1, 1]]]
    assert P.masks(part, [0], [0, 3], causal=True).tolist() == [[[[True, False]]]]


def test_bins_overflow_is_refused_without_a_warning():
    """(p - offset) / pitch past the float range: refused with the documented message, no
    RuntimeWarning on the way (the overflow to inf is expected and checked)."""
    import warnings

    part = _sample([[1e-300]], [[0.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(
            ValueError,
            match=r"^partition: bin index floor\(\(p - offset\) / pitch\) leaves the int64 "
            r"range; pitch too small for these positions$",
        ):
            P.bins(part, [10**10])


def test_count_bias_of_zero_counts_warns_nothing():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = P.count_bias([0, 2], 2)
        ext = P.count_bias([0, 1], 3, dtype=np.longdouble)
    assert out.tolist() == [-np.inf, 0.0]
    assert ext.dtype == np.longdouble and ext[0] == -np.inf
    assert ext[1] == np.log(np.longdouble(1) / np.longdouble(3))


def test_blocks_of_unsorted_positions_list_each_block_in_index_order():
    # 40 shuffled positions in 4 bins: each block is its bin's indices, increasing (a stable
    # sort; an unstable one returns the same sets in another order)
    pos = np.random.default_rng(3).permutation(40)
    part = _sample([[10.0]], [[0.0]])
    got = P.blocks(part, pos, 0, 0)
    want = [np.flatnonzero(pos // 10 == k) for k in range(4)]
    assert [blk.tolist() for blk in got] == [w.tolist() for w in want]


def test_sample_offset_must_be_two_dimensional():
    with pytest.raises(ValueError, match=r"^offset: must have 2 dimensions, got shape \(1,\)$"):
        _sample([[1.0]], [0.0])


def test_draw_names_sigma_in_its_value_refusals():
    with pytest.raises(ValueError, match=r"^sigma: every entry must be > 0, got min -1.0$"):
        P.draw_partition([2.0, -1.0], 4, seed=0)
    with pytest.raises(TypeError, match=r"^sigma: must be a real numeric array"):
        P.draw_partition(["a"], 4, seed=0)


def test_draw_checks_the_seed_before_the_sampler():
    # a negative seed is the draw's own refusal, whatever else is wrong with the call
    with pytest.raises(ValueError, match=r"^seed: must be >= 0, got -1$"):
        P.draw_partition([2.0], 4, seed=-1, sampler="bogus")


def test_draw_refuses_a_users_kernel_that_is_not_of_polya_type():
    from _oracles import Gaussian

    from plsh_ref.kernels import Exponential

    with pytest.raises(ValueError, match=r"^sigma: head 1: Gaussian is not convex"):
        P.draw_partition([Exponential(4.0), Gaussian()], 4, seed=0)


def test_resolve_partition_checks_a_given_partition_against_the_call():
    part = P.draw_partition([2.0, 3.0], 4, seed=1)
    assert P.resolve_partition(part, num_heads=2, slopes=[0.5, 0.25]) is part
    assert P.resolve_partition(part, num_heads=2) is part
    with pytest.raises(ValueError, match=r"^partition: has 2 heads, query has 3$"):
        P.resolve_partition(part, num_heads=3)
    with pytest.raises(ValueError, match=r"^slopes: "):
        P.resolve_partition(part, num_heads=2, slopes=[0.5, -0.25])
    with pytest.raises(ValueError, match=r"^slopes: "):
        P.resolve_partition(part, num_heads=2, slopes=[0.5, 0.25, 0.125])
    with pytest.raises(ValueError, match=r"^num_samples: 3 differs from the partition's 4$"):
        P.resolve_partition(part, num_heads=2, num_samples=3)
    with pytest.raises(ValueError, match=r"^seed: pass either a partition or a seed"):
        P.resolve_partition(part, num_heads=2, seed=0)
    drawn = P.resolve_partition(num_heads=2, slopes=[0.5, 0.25], num_samples=3, seed=7)
    assert drawn == P.draw_partition([2.0, 4.0], 3, seed=7)
