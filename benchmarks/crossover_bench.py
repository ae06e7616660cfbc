"""Where the tiled PLSH path starts to pay: dense PLSH against the tiled path, and the model goal.

Run from the repository root::

    python benchmarks/crossover_bench.py --threads 2

Part 1 (the crossover, one attention call): forward + backward of PLSH attention on the
same partition computed densely (:func:`plsh_fast.dense.dense_plsh_attention`: SDPA with the
bias ``log(C / s)``) and by the tiled CPU path (``backend="cpu"``), next to exact ALiBi
through SDPA with a dense bias; SPEC section 7's CPU configuration (batch 1, 4 heads with
the standard slopes, head_dim 64, float32, causal, ``--num-samples``). The methods take
turns call by call, so load from other processes hits them alike; the median of
``--repeats`` calls after one warm-up is reported, and the crossover is the largest ``n``
at which dense is no slower than tiled (``plsh_fast.dense.DENSE_CROSSOVER`` holds the
shipped value).

Part 2 (the goal of issue 25, ``--model``): a training step (forward, loss, backward, AdamW)
of a tiny random HF Llama (2 layers, hidden 64, 4 heads, 2 kv heads) with
``attn_implementation="plsh"`` (default backend ``"auto"``: dense below the crossover) and
``"alibi"`` (exact ALiBi, dense bias through SDPA), both ``torch.compile(fullgraph=True,
dynamic=True)`` with Inductor, in this one process, steps interleaved; median step time per
length and the ratio plsh / alibi.

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


def _tiny_llama(impl: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    import plsh_fast.hf as hf

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=96,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=8192)  # fmt: skip
    return hf.set_alibi_attention(LlamaForCausalLM(cfg).train(), impl, seed=0)


def model_goal(lengths, repeats) -> list[dict]:
    steps = {}
    for impl in ("plsh", "alibi"):
        model = _tiny_llama(impl)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        compiled = torch.compile(model, fullgraph=True, dynamic=True)

        def step(ids, compiled=compiled, opt=opt):
            compiled(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        steps[impl] = step
    rows = []
    for n in lengths:
        ids = torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(n))
        first = {impl: _time(lambda s=s: s(ids)) for impl, s in steps.items()}  # (re)compiles
        times = {impl: [] for impl in steps}
        for _ in range(repeats):
            for impl, s in steps.items():
                times[impl].append(_time(lambda s=s: s(ids)))
        row = {"n": n, **{f"{impl}_ms": 1e3 * statistics.median(t) for impl, t in times.items()}}
        row.update({f"{impl}_first_s": t for impl, t in first.items()})
        row["plsh_over_alibi"] = row["plsh_ms"] / row["alibi_ms"]
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
    if result.get("model"):
        lines += [
            "",
            "## Compiled tiny Llama training step (fullgraph, dynamic, Inductor), "
            f"median of {result['model_repeats']}",
            "",
            "| n | plsh (ms) | alibi (ms) | plsh / alibi | first step plsh / alibi (s) |",
            "|---|---|---|---|---|",
        ]
        for r in result["model"]:
            lines.append(
                f"| {r['n']} | {r['plsh_ms']:.1f} | {r['alibi_ms']:.1f} | "
                f"{r['plsh_over_alibi']:.2f} | {r['plsh_first_s']:.1f} / {r['alibi_first_s']:.1f} |"
            )
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
    parser.add_argument("--model", type=int, nargs="*", default=None,
                        help="also the compiled tiny-Llama step at these lengths")  # fmt: skip
    parser.add_argument("--model-repeats", type=int, default=5)
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

    write()  # part 1 is kept even if the (long) model part is stopped
    if args.model:
        result["model"] = model_goal(args.model, args.model_repeats)
        result["model_repeats"] = args.model_repeats
        write()
    print(_markdown(result))
    return result


if __name__ == "__main__":
    main()
