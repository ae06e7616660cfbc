"""Where the tiled PLSH path starts to pay: dense PLSH against the tiled path, and the model goal.

Run from the repository root::

    python benchmarks/crossover_bench.py --threads 2

The crossover, one attention call: forward + backward of PLSH attention on the
same partition computed densely (:func:`plsh_fast.dense.dense_plsh_attention`: SDPA with the
bias ``log(C / s)``) and by the tiled CPU path (``backend="cpu"``), next to exact ALiBi
through SDPA with a dense bias; SPEC section 7's CPU configuration (batch 1, 4 heads with
the standard slopes, head_dim 64, float32, causal, ``--num-samples``). The methods take
turns call by call, so load from other processes hits them alike; the median of
``--repeats`` calls after one warm-up is reported, and the crossover is the largest ``n``
at which dense is no slower than tiled (``plsh_fast.dense.DENSE_CROSSOVER`` holds the
shipped value).

The model-level goal of issue 25 (a compiled tiny-Llama training step) is
``benchmarks/hf_bench.py train``.

Writes ``benchmarks/results/crossover_<date>.md`` and ``.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import time
from pathlib import Path

import torch


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _attention_calls(n: int, heads: int, head_dim: int, num_samples: int):
    """The three forward+backward callables on one problem of length ``n``."""
    from plsh_fast import plsh_attention
    from plsh_fast._partition import partition_tensors
    from plsh_fast.dense import dense_plsh_attention
    from plsh_fast.peers import sdpa_alibi_attention
    from plsh_ref import alibi_slopes, draw_partition

    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(1, heads, n, head_dim, generator=g) for _ in range(3))
    part = draw_partition(1.0 / alibi_slopes(heads), num_samples, seed=0)
    pitch, offset = partition_tensors(part, "cpu")
    pos = torch.arange(n)
    scale = head_dim**-0.5

    def backward_of(f):
        def run():
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            f(*leaves).sum().backward()

        return run

    return {
        "dense": backward_of(
            lambda a, b, c: dense_plsh_attention(
                a,
                b,
                c,
                partition=(pitch, offset),
                causal=True,
                scale=scale,
                query_positions=pos,
                key_positions=pos,
            )  # fmt: skip
        ),
        "tiled": backward_of(
            lambda a, b, c: plsh_attention(a, b, c, partition=(pitch, offset), backend="cpu")
        ),
        "alibi_sdpa": backward_of(lambda a, b, c: sdpa_alibi_attention(a, b, c, causal=True)),
    }


def crossover(lengths, heads, head_dim, num_samples, repeats) -> list[dict]:
    rows = []
    for n in lengths:
        calls = _attention_calls(n, heads, head_dim, num_samples)
        times = {name: [] for name in calls}
        for f in calls.values():
            f()  # warm-up (and the CPU path's kept plan, as in training)
        for _ in range(repeats):
            for name, f in calls.items():
                times[name].append(_time(f))
        row = {"n": n, **{f"{name}_ms": 1e3 * statistics.median(t) for name, t in times.items()}}
        row["dense_over_tiled"] = row["dense_ms"] / row["tiled_ms"]
        rows.append(row)
        print(row, flush=True)
    return rows


def _markdown(result: dict) -> str:
    meta = result["provenance"]
    lines = [
        f"# Dense PLSH against the tiled path ({result['date']})",
        "",
        f"Machine: {meta.get('machine', '?')}, torch {torch.__version__}, "
        f"{result['threads']} threads; command `{result['command']}`.",
        "",
        f"## One attention call, forward + backward (batch 1, {result['heads']} heads, "
        f"head_dim {result['head_dim']}, float32, causal, s = {result['num_samples']}), "
        f"median of {result['repeats']}",
        "",
        "| n | dense PLSH (ms) | tiled PLSH (ms) | dense / tiled | exact ALiBi SDPA (ms) |",
        "|---|---|---|---|---|",
    ]
    for r in result["crossover"]:
        lines.append(
            f"| {r['n']} | {r['dense_ms']:.1f} | {r['tiled_ms']:.1f} | "
            f"{r['dense_over_tiled']:.2f} | {r['alibi_sdpa_ms']:.1f} |"
        )
    lines += ["", f"Measured crossover (largest n with dense <= tiled): {result['measured']}; "
              f"shipped `DENSE_CROSSOVER['cpu']` = {result['shipped']}."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    import sys

    from plsh_fast.dense import DENSE_CROSSOVER
    from plsh_ref.provenance import run_metadata

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--num-samples", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = crossover(args.n, args.heads, args.head_dim, args.num_samples, args.repeats)
    fits = [r["n"] for r in rows if r["dense_ms"] <= r["tiled_ms"]]
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    result = {
        "date": date,
        "command": "python " + " ".join(["benchmarks/crossover_bench.py", *sys.argv[1:]]),
        "threads": args.threads,
        "heads": args.heads,
        "head_dim": args.head_dim,
        "num_samples": args.num_samples,
        "repeats": args.repeats,
        "crossover": rows,
        "measured": max(fits) if fits else None,
        "shipped": DENSE_CROSSOVER["cpu"],
        "provenance": run_metadata(),
    }
    out = args.out or Path("benchmarks/results") / f"crossover_{date}"
    out.parent.mkdir(parents=True, exist_ok=True)

    def write():
        out.with_suffix(".json").write_text(json.dumps(result, indent=2, default=str))
        out.with_suffix(".md").write_text(_markdown(result))

    write()
    print(_markdown(result))
    return result


if __name__ == "__main__":
    main()
