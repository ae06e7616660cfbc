"""CPU-only checks of benchmarks/gpu_check.py: imports, planning, error recording, tables.

The GPU sections cannot run in CI; ``--dry-run`` exercises everything around them.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import _paths
import pytest

ROOT = str(_paths.ROOT)
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_check.py")


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # torch.compile/dynamo looks functions' modules up
    spec.loader.exec_module(module)
    return module


def test_headline_config_runs_first(gpu_check):
    configs = gpu_check.bench_configs([4096, 65536, 262144, 16384], [64, 4, 16])
    assert configs[0] == (65536, 16)
    assert sorted(configs) == sorted(
        (n, s) for n in (4096, 16384, 65536, 262144) for s in (4, 16, 64)
    )
    assert len(configs) == 12


def test_guarded_records_errors_and_budget_skips(gpu_check):
    records = []
    budget = gpu_check.Budget(1000.0)

    def boom():
        raise RuntimeError("kernel exploded")

    gpu_check.guarded(records, "correctness", "boom", budget, 1.0, boom)
    gpu_check.guarded(records, "correctness", "fine", budget, 1.0, lambda: {"x": 1})
    gpu_check.guarded(records, "bench", "late", budget, 5000.0, lambda: {"x": 2})
    assert [r["status"] for r in records] == ["error", "ok", "skipped"]
    assert "kernel exploded" in records[0]["error"] and records[1]["x"] == 1
    assert "x" not in records[2]


def test_large_tensor_check_runs_on_a_small_cpu_problem(gpu_check):
    """The > 2**31-element check's code path (windowed reference, tolerance rule) at n=300."""
    import _triton_interp  # compiled on a GPU, interpreted on CPU

    rec = gpu_check.check_large(_triton_interp.DEVICE.type, n=300, window=200, tail=48)
    assert set(rec["error_over_allowed"]) == {
        "output",
        "lse",
        "grad_query",
        "grad_key",
        "grad_value",
    }
    assert all(r <= 1.0 for r in rec["error_over_allowed"].values())


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_bench_one_runs_on_cpu_with_eager_flex(gpu_check, monkeypatch):
    """The benchmark body (ours in the Triton interpreter, eager FlexAttention peers, the
    reduction) on a tiny CPU problem, timing and CUDA memory stubbed out; the error columns
    are real: PLSH and the reduction compute the same function, FlexAttention is exact."""
    from types import SimpleNamespace

    import _triton_interp  # compiled on a GPU, interpreted on CPU
    from torch.nn.attention import flex_attention as fa

    monkeypatch.setattr(gpu_check, "_timeit", lambda fn, **kw: (fn() is not None and 1.0, 1))
    monkeypatch.setattr(gpu_check, "_peak_mb", lambda fn: 0.0)
    args = SimpleNamespace(num_heads=2, head_dim=16, skip=[])
    device = _triton_interp.DEVICE.type
    rec = gpu_check.bench_one(device, 192, 4, args, {"flex": fa.flex_attention})
    assert "reduction_error_msg" not in rec, rec.get("reduction_error_msg")
    # FlexAttention has no backward on CPU: the only acceptable recorded failure here
    assert "flex_error_msg" not in rec or "backward on CPU" in rec["flex_error_msg"], rec
    assert rec["flex_error"] < 2e-2  # exact ALiBi, bfloat16 rounding only
    assert abs(rec["reduction_error"] - rec["plsh_error"]) < 2e-2  # same estimator, bf16
    assert rec["plsh_error"] > rec["flex_error"]  # PLSH approximates ALiBi
    assert rec["speedup_fwd_vs_flex"] == 1.0 and "plsh_fwd_bwd_ms" in rec
    # peers: SDPA with the dense bias is exact ALiBi too; windowed Flex at our width is
    # exact inside the window; the no-counts ablation ran (same kernel, counts skipped)
    assert "sdpa_error_msg" not in rec and rec["sdpa_error"] < 2e-2, rec
    assert "flex_window_error_msg" not in rec, rec.get("flex_window_error_msg")
    assert rec["window_ours"] >= 64 and "flex_window_fwd_ms" in rec
    assert "nocounts_error_msg" not in rec and rec["nocounts_fwd_ms"] == 1.0


def test_dry_run_writes_tables(tmp_path):
    out = tmp_path / "gpu"
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--dry-run", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert proc.returncode == 0, proc.stderr
    payload = json.loads((out / "results.json").read_text())
    bench = [r for r in payload["records"] if r["section"] == "bench"]
    assert len(bench) == 12 and (bench[0]["n"], bench[0]["s"]) == (65536, 16)
    assert all(math.isfinite(r["estimate_s"]) for r in bench)
    md = (out / "results.md").read_text()
    # one row in the main table and one in the peers (window, SDPA, no-counts) table
    assert "dry run" in md and md.count("| 65536 | 16 |") == 2
    assert "| BM64_BN64_w4_st3_nocounts |" in md and "Flex window fwd" in md
    assert md.count("\n| ") >= 12 + 4  # bench rows + correctness rows + headers
