"""CPU-only checks of benchmarks/cpu_bench.py helpers: the windowed block mask built from
block indices equals FlexAttention's own, taking turns times every method, the floor probe
counts the FLOPs of the plan's tile groups."""

from __future__ import annotations

import importlib.util
import sys

import _paths
import pytest
import torch

ROOT = _paths.ROOT


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("cpu_bench", ROOT / "benchmarks" / "cpu_bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["cpu_bench"] = module
    spec.loader.exec_module(module)
    return module


def _blocks(num, idx, heads):
    nb = num.shape[-1]
    out = torch.zeros(heads, nb, nb, dtype=torch.int32)
    for h in range(heads):
        for q in range(nb):
            for j in idx[0, h, q, : num[0, h, q]].tolist():
                out[h, q, j] += 1
    return out


@pytest.mark.parametrize(
    ("n", "window"),
    [(1024, [1, 128, 256, 2000]), (768, [3, 100, 129, 700]), (1000, [5, 64, 300, 1])],
)
def test_window_block_mask_matches_create_block_mask(bench, n, window):
    from plsh_fast import peers

    bench._WINDOW.copy_(torch.tensor(window))
    ours = bench.window_block_mask(n, window)
    theirs = peers.block_mask(bench._CAUSAL_WINDOW, n, n, num_heads=bench.HEADS)
    assert torch.equal(ours.to_dense(), theirs.to_dense())
    if n % 128 == 0:  # same full/partial split (torch also marks a ragged last block partial)
        for num, idx in (
            ("full_kv_num_blocks", "full_kv_indices"),
            ("kv_num_blocks", "kv_indices"),
        ):
            a = _blocks(getattr(ours, num), getattr(ours, idx), bench.HEADS)
            b = _blocks(getattr(theirs, num), getattr(theirs, idx), bench.HEADS)
            assert torch.equal(a, b)


def test_wrong_window_is_detected(bench):
    # Negative control for the comparison above: a window off by one block differs.
    bench._WINDOW.copy_(torch.tensor([1, 128, 256, 384]))
    ours = bench.window_block_mask(1024, [1, 128, 256, 512])
    from plsh_fast import peers

    theirs = peers.block_mask(bench._CAUSAL_WINDOW, 1024, 1024, num_heads=bench.HEADS)
    assert not torch.equal(ours.to_dense(), theirs.to_dense())


def test_interleaved_times_runs_each_method_once_per_round(bench):
    calls = []
    fns = {"a": lambda: calls.append("a") or 1, "b": lambda: calls.append("b") or 2}
    times, results = bench.interleaved_times(fns, repeats=3)
    assert calls == ["a", "b"] * 4  # warm-up round, then three rounds taking turns
    assert results == {"a": 1, "b": 2}
    assert set(times) == {"a", "b"} and all(t >= 0 for t in times.values())


def test_tile_probe_flops_are_the_plans_tile_logits(bench):
    partition = bench.partition_for(4)
    _, logits = bench.support_width(partition, 512)
    run, flops = bench.tile_gemm_probe(partition, 512, threads=1)
    run()
    # 4 d flops per tile logit (two GEMMs); logits per row per head times rows.
    assert flops == pytest.approx(4 * bench.HEAD_DIM * 512 * sum(logits))


@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_probe_runs_the_tile_kernel_on_every_tile_logit(bench, monkeypatch, threads):
    """The kernel-alone probe calls ``tiles_forward`` on exactly the plan's tile groups."""
    from plsh_fast import cpu

    n = 512
    partition = bench.partition_for(4)
    _, logits = bench.support_width(partition, n)
    inputs = bench.make_inputs(n)
    seen = []
    real = cpu.tiles_forward

    def spy(q, k, v, bias, scale):
        seen.append(bias.numel())
        assert q.shape[-2] * k.shape[-2] * q.shape[-3] == bias.numel()
        return real(q, k, v, bias, scale)

    monkeypatch.setattr(cpu, "tiles_forward", spy)
    run = bench.tile_kernel_probe(partition, n, threads, inputs)
    assert seen == []  # building the groups does not run the kernel
    run()
    # One call per tile group; together they cover every tile logit of every head once.
    assert sum(seen) == pytest.approx(n * sum(logits))


def test_plsh_cold_and_the_reduction_keep_no_plan_and_plsh_keeps_one(bench):
    from plsh_fast import cpu

    inputs = bench.make_inputs(256)
    cpu.clear_plan_cache()
    cold = bench.method_fn("plsh_cold", 256, 4, inputs)
    out_cold = cold()
    bench.method_fn("reduction", 256, 4, inputs)()  # its s one-sample plans are not kept
    assert cpu.kept_plan_bytes() == 0  # every cold call plans afresh
    assert cpu.PLAN_CACHE_BYTES > 0  # and the setting is restored
    plsh = bench.method_fn("plsh", 256, 4, inputs)
    plsh()
    out = plsh()
    kept = cpu.kept_plan_bytes()
    assert kept > 0  # negative control: a repeated call keeps its plan
    # A cold call between two plsh calls leaves plsh's plan kept (with the budget set to
    # 0 for the cold call, the first version dropped it every round).
    cold()
    assert cpu.kept_plan_bytes() == kept
    assert torch.equal(out, out_cold)
