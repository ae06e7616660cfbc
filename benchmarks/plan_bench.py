"""Kept CPU plans: memory of compact chunks (uint8 counts) against float biases, and forward cost.

Run from the repository root, e.g.::

    python benchmarks/plan_bench.py --n 16384 65536 --s 16 64 --threads 2

Configuration of ``benchmarks/cpu_bench.py`` (SPEC section 7): batch 1, 4 heads with the
standard slopes (sigma 4, 16, 64, 256), head_dim 64, float32, causal. For each ``(n, s)``
one process measures, side by side on the same inputs and partition:

* ``compact``: the forward with its plan kept as the CPU path keeps it (step 8): each tile
  group's counts in ``uint8`` (``int16`` above 255 samples) and int32 key indices, the
  bias ``log(C / s)`` read back from the table at each use (``Chunk.expand``);
* ``float_bias``: the same plan kept as it was kept before: the float32 bias of every
  tile logit, int64 key indices, and the rows' block ranges in the work items (obtained
  by making ``Chunk.compact``, ``Chunk.expand`` and ``Plan.drop_ranges`` do nothing in
  this process);
* ``cold``: no plan kept (``plsh_fast.cpu.no_kept_plans``): every call plans.

Memory: bytes held by each kept plan (its chunks' tensors, counted from the tensors, plus
the block ranges). Time: one warm-up call each (which keeps the plans), then ``--repeats``
rounds in which the three methods take turns; the median per method. Outputs of
``compact`` and ``float_bias`` are checked equal bit for bit. Results go to
``benchmarks/results/plan_<date>_t<threads>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from plsh_fast import cpu  # noqa: E402
from plsh_fast._partition import partition_tensors  # noqa: E402
from plsh_ref import alibi_slopes, draw_partition  # noqa: E402
from plsh_ref.provenance import run_metadata  # noqa: E402


def _held_bytes(plan) -> int:
    """Bytes of the kept plan's chunks counted from their tensors, plus its block ranges."""
    chunks = [c for c in plan.chunk_store.values() if c is not None]
    ranges = 0
    for spec in plan.specs:
        ranges += sum(t.numel() * t.element_size() for t in spec[4:] if torch.is_tensor(t))
    return sum(c.nbytes() for c in chunks) + ranges


def bench(n: int, s: int, args) -> dict:
    heads, d = 4, 64
    slopes = alibi_slopes(heads)
    part = draw_partition(1.0 / slopes, s, seed=args.seed)
    pitch, offset = partition_tensors(part, torch.device("cpu"))
    g = torch.Generator().manual_seed(n + s)
    q, k, v = (torch.randn(1, heads, n, d, generator=g) for _ in range(3))
    pos = torch.arange(n)
    scale = d**-0.5
    compact_cache, float_cache = cpu.PlanCache(), cpu.PlanCache()
    chunk_cls, plan_cls = cpu._chunks.Chunk, cpu._planning.Plan
    real = chunk_cls.compact, chunk_cls.expand, plan_cls.drop_ranges

    def identity(self, _table):
        return self

    def nothing(self):
        return None

    def forward():
        return cpu.plsh_forward_cpu(q, k, v, pitch, offset, pos, pos, scale, True)

    def compact():
        with cpu.use_plan_cache(compact_cache):
            return forward()

    def float_bias():
        chunk_cls.compact, chunk_cls.expand, plan_cls.drop_ranges = identity, identity, nothing
        try:
            with cpu.use_plan_cache(float_cache):
                return forward()
        finally:
            chunk_cls.compact, chunk_cls.expand, plan_cls.drop_ranges = real

    def cold():
        with cpu.no_kept_plans():
            return forward()

    methods = {"compact": compact, "float_bias": float_bias, "cold": cold}
    outs = {}
    for name, fn in methods.items():  # two calls: a plan is kept from the second one on
        fn()
        outs[name] = fn()
    for a, b in zip(outs["compact"], outs["float_bias"]):
        assert torch.equal(a, b), "kept compact and float plans differ"
    (compact_plan,) = compact_cache.plans.values()
    (float_plan,) = float_cache.plans.values()
    row = {
        "n": n,
        "num_samples": s,
        "compact_plan_bytes": _held_bytes(compact_plan),
        "float_plan_bytes": _held_bytes(float_plan),
        "compact_plan_counted": compact_cache.nbytes,
    }
    times = {name: [] for name in methods}
    for _ in range(args.repeats):
        for name, fn in methods.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    for name, t in times.items():
        row[f"{name}_s"] = statistics.median(t)
    row["memory_ratio"] = row["float_plan_bytes"] / row["compact_plan_bytes"]
    row["time_ratio"] = row["compact_s"] / row["float_bias_s"]
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[16384, 65536])
    parser.add_argument("--s", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cpu.PLAN_CACHE_BYTES = 4 * 2**30  # both layouts kept at every size measured
    rows = []
    for n in args.n:
        for s in args.s:
            row = bench(n, s, args)
            rows.append(row)
            print(json.dumps(row), flush=True)
    meta = {**run_metadata(), "threads": args.threads, "torch": torch.__version__}
    meta["load_average_end"] = os.getloadavg()
    meta["args"] = vars(args)
    stamp = _dt.datetime.now(_dt.timezone.utc)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = out / f"plan_{stamp:%Y-%m-%d}_t{args.threads}"
    base.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    load = ", ".join(f"{x:.1f}" for x in meta["load_average_end"])
    lines = [
        f"# Kept CPU plans: compact counts against float biases, {meta['date_utc']}",
        "",
        f"2-core VM, {args.threads} torch threads, torch {meta['torch']}, commit "
        f"{(meta['git_commit'] or 'unknown')[:10]}; load average at the end {load} (shared "
        "with other processes: the three methods take turns, so the ratios hold, absolute "
        "times do not). Batch 1, 4 heads (sigma 4, 16, 64, 256), head_dim 64, float32, "
        f"causal; median of {args.repeats} rounds. Made by `benchmarks/plan_bench.py`.",
        "",
        "| n | s | float32-bias plan MB | compact plan MB | memory ratio | forward, float "
        "plan (s) | forward, compact plan (s) | compact / float | forward, no plan kept (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['n']} | {r['num_samples']} | {r['float_plan_bytes'] / 2**20:.1f} | "
            f"{r['compact_plan_bytes'] / 2**20:.1f} | {r['memory_ratio']:.2f} | "
            f"{r['float_bias_s']:.4f} | {r['compact_s']:.4f} | {r['time_ratio']:.3f} | "
            f"{r['cold_s']:.4f} |"
        )
    base.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {base}.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
