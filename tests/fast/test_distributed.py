"""Context parallelism (:mod:`plsh_fast.distributed`) and the halo bound.

* Spawned gloo process groups of 2 and 4 CPU processes (``tests/_distributed_worker.py``,
  file rendezvous, 60 s timeout on every collective, the whole run bounded by a subprocess
  timeout): output, LSE and the gradients of query, key and value equal the dense float64
  reference on the whole sequence under the SPEC section 6 tolerance rule, as does the
  single-process :func:`plsh_fast.plsh_attention`; uneven and empty chunks, chunks in
  permuted rank order at an offset, GQA, causal and bidirectional, halos wider than a
  chunk (coming from several ranks); the bytes sent are exactly the plan's; a halo one
  token too narrow fails (negative control). Bad input raises a clear error on every rank
  and the group stays usable.
* Without processes: the exact reach against a brute-force count oracle, the plan, the
  checksum, and every claim of ``proofs_notes/halo_bound.md``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import _paths
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import plsh_fast.distributed as D
from plsh_ref.expectation import expected_window_width, largest_pitch_sf
from plsh_ref.partition import PartitionSample, counts, draw_partition

WORKER = str(_paths.TESTS / "_distributed_worker.py")
RUN_TIMEOUT_S = 240

_BASE = {"batch": 2, "heads": 4, "heads_kv": 2, "num_samples": 8}
CASES = {
    "causal_gqa_uneven": {
        **_BASE,
        "seed": 3,
        "causal": True,
        "sigma": [2.0, 6.0, 20.0, 60.0],
        "lengths": {"2": [29, 83], "4": [7, 50, 2, 41]},
    },
    "bidirectional_permuted_offset_empty": {
        **_BASE,
        "batch": 1,
        "heads_kv": 4,
        "num_samples": 6,
        "seed": 5,
        "causal": False,
        "sigma": [3.0, 12.0, 40.0, 90.0],
        "lengths": {"2": [40, 25], "4": [30, 0, 9, 45]},
        "order": {"2": [1, 0], "4": [2, 0, 3, 1]},
        "origin": 1000,
    },
    "causal_tiny_chunks_seed_draw": {
        "batch": 1,
        "heads": 2,
        "heads_kv": 1,
        "num_samples": 4,
        "seed": 11,
        "causal": True,
        "draw_from_seed": True,
        "sigma": [5.0, 50.0],
        "lengths": {"2": [3, 100], "4": [3, 3, 3, 100]},
    },
    "bidirectional_tiny_chunks": {
        "batch": 1,
        "heads": 2,
        "heads_kv": 2,
        "num_samples": 4,
        "seed": 12,
        "causal": False,
        "sigma": [30.0, 30.0],
        "lengths": {"2": [50, 4], "4": [40, 4, 4, 40]},
    },
    "control_narrow_halo": {
        **_BASE,
        "type": "control",
        "seed": 3,
        "causal": True,
        "sigma": [2.0, 6.0, 20.0, 60.0],
        "lengths": {"2": [29, 83], "4": [7, 50, 2, 41]},
    },
    "partition_disagrees": {"type": "error", "kind": "seeds", "seed_of": {"1": 1}},
    "overlap": {"type": "error", "kind": "overlap"},
    "gap": {"type": "error", "kind": "gap"},
    "start_on_rank0_only": {"type": "error", "kind": "start_on_rank0_only"},
    "bad_dtype_on_rank1": {"type": "error", "kind": "bad_dtype_on_rank1"},
    "causal_disagrees": {"type": "error", "kind": "causal_disagrees"},
    "recovered_after_errors": {
        **_BASE,
        "seed": 21,
        "causal": True,
        "sigma": [4.0, 4.0, 16.0, 16.0],
        "lengths": {"2": [20, 21], "4": [10, 11, 12, 13]},
    },
}
ATTENTION_CASES = [n for n, c in CASES.items() if "type" not in c]
ERRORS = {  # case -> (exception type on each rank, start of the message on each rank)
    "partition_disagrees": (["ValueError"], ["partition: ranks disagree"]),
    "overlap": (["ValueError"], ["chunk_start: the chunks do not tile"]),
    "gap": (["ValueError"], ["chunk_start: the chunks do not tile"]),
    "start_on_rank0_only": (["ValueError"], ["chunk_start: given on some ranks"]),
    "bad_dtype_on_rank1": (
        ["ValueError", "TypeError"],
        ["group: rank 1 refused its arguments: query: dtype", "query: dtype"],
    ),
    "causal_disagrees": (["ValueError"], ["causal: ranks disagree"]),
}


def _spawn(world: int, tmp_path) -> list[dict]:
    """Run ``world`` worker processes; their results, or fail naming the rank."""
    with open(tmp_path / "cases.json", "w") as f:
        json.dump(CASES, f)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, str(r), str(world), str(tmp_path / "store"), str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=RUN_TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        pytest.fail(f"world {world}: the ranks did not finish in {RUN_TIMEOUT_S} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} of {world} exited {p.returncode}:\n{log}"
    results = []
    for r in range(world):
        with open(tmp_path / f"rank{r}.json") as f:
            results.append(json.load(f))
    return results


@pytest.fixture(scope="module", params=[2, 4], ids=["world2", "world4"])
def world_results(request, tmp_path_factory):
    world = request.param
    return world, _spawn(world, tmp_path_factory.mktemp(f"world{world}"))


def _case(world_results, name):
    world, results = world_results
    for r, res in enumerate(results):
        assert "crash" not in res[name], f"{name}, rank {r}/{world}:\n{res[name]['crash']}"
    return world, [res[name] for res in results]


@pytest.mark.parametrize("name", ATTENTION_CASES)
def test_matches_whole_sequence_reference(world_results, name):
    """Every rank's output, LSE and gradients (query, key, value) against the dense float64
    reference on the whole sequence, under the tolerance rule; the single-process fast
    path passes the same rule on the same slice."""
    world, per_rank = _case(world_results, name)
    for r, res in enumerate(per_rank):
        for quantity in (
            "output",
            "lse",
            "grad_query",
            "grad_key",
            "grad_value",
            "single_process_output",
            "single_process_lse",
        ):
            got = res[quantity]
            assert got["error"] <= got["allowed"], (
                f"{name}, rank {r}/{world}, {quantity}: error {got['error']:.3e} > "
                f"allowed {got['allowed']:.3e}"
            )


@pytest.mark.parametrize("name", ATTENTION_CASES)
def test_sends_exactly_the_planned_halo(world_results, name):
    """The bytes handed to batch_isend_irecv are the plan's: forward, the keys and values
    it sends; backward, the gradients of the halo it received."""
    world, per_rank = _case(world_results, name)
    for r, res in enumerate(per_rank):
        assert res["forward_bytes"] == res["planned_bytes"], (name, r)
        assert res["backward_bytes"] == res["planned_received_bytes"], (name, r)
    assert sum(res["halo_tokens"] for res in per_rank) > 0, name


def test_halo_wider_than_a_chunk_spans_several_ranks(world_results):
    world, per_rank = _case(world_results, "causal_tiny_chunks_seed_draw")
    if world == 4:  # rank 3 (100 tokens after three chunks of 3) hears from ranks 0, 1, 2
        assert per_rank[3]["sources"] == [0, 1, 2]
    world, per_rank = _case(world_results, "bidirectional_tiny_chunks")
    if world == 4:  # the chunks of 4 tokens hear from both sides, beyond their neighbours
        assert per_rank[1]["sources"] == [0, 2, 3] and per_rank[2]["sources"] == [0, 1, 3]


def test_negative_control_narrow_halo_fails(world_results):
    """Dropping one halo token per head breaks the tolerance rule on some rank."""
    world, per_rank = _case(world_results, "control_narrow_halo")
    assert any(res["output"]["error"] > res["output"]["allowed"] for res in per_rank)


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_bad_input_raises_on_every_rank(world_results, name):
    world, per_rank = _case(world_results, name)
    types, starts = ERRORS[name]
    for r, res in enumerate(per_rank):
        i = 1 if (len(types) > 1 and r == 1) else 0
        assert res["type"] == types[i], (name, r, res)
        assert res["message"].startswith(starts[i]), (name, r, res["message"])


def test_not_initialised_is_a_clear_error():
    assert not torch.distributed.is_initialized()
    q = torch.randn(1, 2, 4, 4)
    part = draw_partition([4.0, 8.0], 2, 0)
    with pytest.raises(ValueError, match="^group: torch.distributed is not initialised"):
        D.context_parallel_plsh_attention(q, q, q, partition=part)
    plan = D.plan_context_parallel(part, [(0, 4)])
    with pytest.raises(ValueError, match="^group: torch.distributed is not initialised"):
        D.halo_exchange(q, q, plan)


# --------------------------------------------------------------------------------------
# Geometry without processes
# --------------------------------------------------------------------------------------


def _brute_reach(partition, start, stop, lo, hi, causal):
    """First/last key in [lo, hi) with a nonzero count for some query in [start, stop)."""
    keys = np.arange(lo, hi)
    c = counts(partition, np.arange(start, stop), keys, causal=causal).sum(axis=1)
    first = np.array([keys[np.nonzero(row)[0][0]] for row in c])
    last = np.array([keys[np.nonzero(row)[0][-1]] for row in c])
    return first, last


@settings(max_examples=40)
@given(
    seed=st.integers(0, 2**32),
    log_sigma=st.floats(-1.0, 5.0),
    num_samples=st.integers(1, 6),
    shift=st.sampled_from([0, -300, 10**9, 2**50]),
    lengths=st.tuples(st.integers(1, 40), st.integers(1, 12), st.integers(1, 40)),
    causal=st.booleans(),
)
def test_key_reach_equals_count_oracle(seed, log_sigma, num_samples, shift, lengths, causal):
    """The reach is exact: the first/last key with a nonzero count C (plsh_ref.partition.counts),
    for a chunk in the middle of a sequence, any position shift up to 2**50."""
    part = draw_partition(np.exp([log_sigma, log_sigma + 1.0]), num_samples, seed)
    lo = shift
    start = lo + lengths[0]
    stop = start + lengths[1]
    hi = stop + lengths[2]
    first, last = D.key_reach(part, start, stop, causal=causal, sequence_start=lo, sequence_stop=hi)
    want_first, want_last = _brute_reach(part, start, stop, lo, hi, causal)
    np.testing.assert_array_equal(first, want_first)
    np.testing.assert_array_equal(last, want_last)


def test_plan_is_consistent():
    """Own chunk plus received ranges cover every kv head's reach; nothing is sent to
    oneself; causal plans only send forward; GQA ranges are the union over the group."""
    part = draw_partition([2.0, 9.0, 30.0, 70.0], 8, 1)
    bounds = [(0, 7), (7, 57), (57, 59), (59, 100)]
    for causal in (True, False):
        plan = D.plan_context_parallel(part, bounds, causal=causal, num_heads_kv=2)
        for dst, (a, b) in enumerate(bounds):
            for g in range(2):
                covered = set(range(a, b))
                for src in range(4):
                    lo, hi = plan.transfer(src, dst)[g]
                    assert not (covered & set(range(lo, hi)))
                    covered |= set(range(lo, hi))
                lo, hi = plan.key_ranges[dst, g]
                assert covered == set(range(lo, hi)), (causal, dst, g)
                first, last = D.key_reach(
                    part, a, b, causal=causal, sequence_start=0, sequence_stop=100
                )
                assert lo == first[2 * g : 2 * g + 2].min()
                assert hi == last[2 * g : 2 * g + 2].max() + 1
            assert plan.tokens(dst, dst) == 0
            if causal:
                assert all(plan.tokens(src, dst) == 0 for src in range(dst + 1, 4))
        assert plan.bytes_sent(0, batch=2, head_dim=3, head_dim_v=5, element_size=2) == (
            plan.tokens_sent(0) * 2 * 8 * 2
        )


@pytest.mark.parametrize(
    ("bounds", "match"),
    [
        ([(0, 5), (4, 9)], "^chunk_bounds: the chunks do not tile.*overlap"),
        ([(0, 5), (6, 9)], "^chunk_bounds: the chunks do not tile.*gap"),
        ([(0, 5), (5, 3)], "^chunk_bounds: rank 1 has stop 3 < start 5"),
        ([], "^chunk_bounds: needs at least one rank"),
    ],
)
def test_plan_refuses_bad_chunks(bounds, match):
    part = draw_partition([4.0], 2, 0)
    with pytest.raises(ValueError, match=match):
        D.plan_context_parallel(part, bounds)


def test_plan_refuses_bad_arguments():
    part = draw_partition([4.0, 4.0], 2, 0)
    with pytest.raises(TypeError, match="^chunk_bounds"):
        D.plan_context_parallel(part, [(0, 1.5)])
    with pytest.raises(TypeError, match="^chunk_bounds"):
        D.plan_context_parallel(part, 3)
    with pytest.raises(ValueError, match="^num_heads_kv"):
        D.plan_context_parallel(part, [(0, 4)], num_heads_kv=3)
    with pytest.raises(TypeError, match="^partition"):
        D.plan_context_parallel(None, [(0, 4)])
    with pytest.raises(ValueError, match="^stop"):
        D.key_reach(part, 5, 5)
    with pytest.raises(ValueError, match="^sequence_start"):
        D.key_reach(part, 5, 9, sequence_start=6)


def test_partition_checksum():
    part = draw_partition([4.0, 8.0], 3, 0)
    same = PartitionSample(part.pitch.copy(), part.offset.copy())
    assert D.partition_checksum(part) == D.partition_checksum(same)
    bumped = part.offset.copy()
    bumped[1, 2] = np.nextafter(bumped[1, 2], np.inf)
    assert D.partition_checksum(part) != D.partition_checksum(PartitionSample(part.pitch, bumped))
    assert D.partition_checksum(part) != D.partition_checksum(part.heads(0, 1))
    assert 0 <= D.partition_checksum(part) < 2**63


# --------------------------------------------------------------------------------------
# proofs_notes/halo_bound.md
# --------------------------------------------------------------------------------------


def _left_halo_widths(part, boundary=10**6):
    first, _ = D.key_reach(part, boundary, boundary + 1, sequence_start=0)
    return boundary - first


def test_halo_at_most_ceil_largest_pitch_minus_one_and_tight():
    """Claim 2: start - first <= ceil(max_t pitch_t) - 1 for every head; equality occurs
    (negative control: the bound lowered by one token fails on some head)."""
    sigma = np.repeat([0.7, 3.0, 20.0, 150.0], 500)
    part = draw_partition(sigma, 4, 2)
    widths = _left_halo_widths(part)
    bound = np.ceil(part.pitch.max(axis=1)).astype(np.int64) - 1
    assert np.all(widths <= bound)
    assert np.any(widths == bound)


@pytest.mark.parametrize(("sigma", "num_samples"), [(3.0, 1), (12.0, 4), (40.0, 16)])
def test_halo_width_law(sigma, num_samples):
    """Claim 3: P(W >= b) = 1 - (1 - exp(-b/sigma))^s, for 4000 independent heads, by the
    DKW inequality (sup |F_N - F| > eps with probability <= 2 exp(-2 N eps^2) = 1e-6 at
    eps = 0.0425: false-failure probability 1e-6 per case). Negative control: the law with
    2 s samples (or sigma * 1.25 for s = 1) is rejected at the same eps."""
    n_heads = 4000
    eps = math.sqrt(math.log(2 / 1e-6) / (2 * n_heads))
    widths = _left_halo_widths(draw_partition(np.full(n_heads, sigma), num_samples, 8))
    b = np.arange(0, int(widths.max()) + 2)
    empirical_sf = (widths[None, :] >= b[:, None]).mean(axis=1)

    def law(sig, s):
        return 1.0 - (1.0 - np.exp(-b / sig)) ** s

    assert np.max(np.abs(empirical_sf - law(sigma, num_samples))) <= eps
    wrong = law(sigma * 1.25, 1) if num_samples == 1 else law(sigma, 2 * num_samples)
    assert np.max(np.abs(empirical_sf - wrong)) > eps


def test_halo_mean_is_window_tail_sum():
    """Claim 3 (mean): E[W] = sum_b [1 - (1 - rho^b)^s] = expected_window_width(causal) - 1,
    checked on 4000 heads to 5 standard errors (false failure < 1e-6); the s-sample
    mean with s+2 samples is rejected (negative control)."""
    sigma, s, n_heads = 16.0, 8, 4000
    widths = _left_halo_widths(draw_partition(np.full(n_heads, sigma), s, 9))
    mean = expected_window_width(sigma, s, causal=True) - 1.0
    se = widths.std(ddof=1) / math.sqrt(n_heads)
    assert abs(widths.mean() - mean) <= 5 * se
    wrong = expected_window_width(sigma, s + 2, causal=True) - 1.0
    assert abs(widths.mean() - wrong) > 5 * se


def test_largest_pitch_law_dominates_halo_law():
    """Claim 4: P(W >= b) <= P(max_t pitch_t > b) (largest_pitch_sf) for all b, and the
    largest-pitch quantile is an upper quantile of W: checked on the grid and on draws."""
    for sigma in (1.5, 10.0, 256.0):
        for s in (1, 4, 16, 64):
            b = np.arange(0, int(40 * sigma))
            halo_sf = 1.0 - (1.0 - np.exp(-b / sigma)) ** s
            assert np.all(halo_sf <= largest_pitch_sf(b, sigma, s) + 1e-15)


def test_gqa_halo_is_the_largest_over_the_group():
    """Claim 5: a kv head's halo is the max over its query heads (independent heads:
    P(W_g < b) = prod_h (1 - rho_h^b)^s)."""
    part = draw_partition([3.0, 30.0, 5.0, 50.0], 4, 6)
    plan = D.plan_context_parallel(part, [(0, 500), (500, 900)], num_heads_kv=2)
    widths = 500 - D.key_reach(part, 500, 900, sequence_start=0, sequence_stop=900)[0]
    assert list(500 - plan.key_ranges[1, :, 0]) == [widths[:2].max(), widths[2:].max()]


def test_gqa_halo_law():
    """Claim 4: P(W_g >= b) = 1 - prod_h (1 - rho_h^b)^s for a kv head serving heads of
    sigma 10 and 16 (s = 4), 3000 groups, DKW band at false-failure probability 1e-6.
    Negative control: the law of the sigma = 16 head alone is rejected."""
    groups, s = 3000, 4
    eps = math.sqrt(math.log(2 / 1e-6) / (2 * groups))
    part = draw_partition(np.tile([10.0, 16.0], groups), s, 10)
    plan = D.plan_context_parallel(part, [(0, 10**6), (10**6, 10**6 + 1)], num_heads_kv=groups)
    widths = 10**6 - plan.key_ranges[1, :, 0]
    b = np.arange(0, int(widths.max()) + 2)
    empirical_sf = (widths[None, :] >= b[:, None]).mean(axis=1)
    law = 1.0 - ((1.0 - np.exp(-b / 10.0)) * (1.0 - np.exp(-b / 16.0))) ** s
    assert np.max(np.abs(empirical_sf - law)) <= eps
    alone = 1.0 - (1.0 - np.exp(-b / 16.0)) ** s
    assert np.max(np.abs(empirical_sf - alone)) > eps
