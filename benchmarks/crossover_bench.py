"""Where the tiled PLSH path starts to pay: dense PLSH against the tiled path, and the model goal.

Run from the repository root::

    python benchmarks/crossover_bench.py --threads 2

The crossover, one attention call: forward + backward of PLSH attention on the
same partition computed densely (:func:`plsh_fast.dense.dense_plsh_attention`: SDPA with the
bias ``log(C / s)``; ``dense``: its counts kept across calls in a
:class:`plsh_fast.dense.DenseCountCache`, as a layer with a fixed partition has them from
its third call on; ``dense_cold``: built every call) and by the tiled CPU path
(``backend="cpu"``, its plan kept likewise), next to exact ALiBi through SDPA with a dense
bias; SPEC section 7's CPU configuration (batch 1, 4 heads with the standard slopes,
head_dim 64, float32, causal, ``--num-samples``). The methods take turns call by call, so
load from other processes hits them alike; the median of ``--repeats`` calls after two
warm-up calls is reported, and the crossover is the largest ``n`` at which dense (kept
counts) is no slower than tiled (``plsh_fast.dense.DENSE_CROSSOVER`` holds the shipped
value).

Also the forward alone (no gradient) of the dense route with its kept ``uint8`` counts
(``log(C / s)`` looked up per call) against the same attention fed a kept float32 bias
(what keeping the bias itself would cost in time; it takes four times the memory):
issue 25 item 5 asks for the compact form at <= 10% forward cost. ``--compiled-forward``
adds the same two forwards under ``torch.compile(fullgraph=True)`` (Inductor), where the
lookup of ``log(C / s)`` is fused into the kernel that writes the bias, as in a compiled
model.

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


def _biased(q, k, v, bias, scale):
    """The steps of :func:`plsh_fast.dense.dense_plsh_attention` after its bias: SDPA with a
    given (kept) bias, rows without a key set to 0."""
    from plsh_fast.dense import expand_kv

    empty = torch.isneginf(bias).all(dim=-1, keepdim=True)
    k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=bias.masked_fill(empty, 0.0), scale=scale
    )
    return out.masked_fill(empty, 0.0)


def _attention_calls(n: int, heads: int, head_dim: int, num_samples: int, compiled: bool = False):
    """The forward+backward callables and the forward-only ones on one problem of length
    ``n``."""
    from plsh_fast import dense, plsh_attention
    from plsh_fast._partition import partition_tensors
    from plsh_fast.dense import dense_count_bias, dense_plsh_attention
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

    def forward_of(f):
        def run():
            with torch.no_grad():
                f(q, k, v)

        return run

    cache = dense.DenseCountCache()

    def dense_call(a, b, c):
        with dense.use_dense_cache(cache):
            return dense_plsh_attention(
                a, b, c, partition=(pitch, offset), causal=True, scale=scale,
                query_positions=pos, key_positions=pos,
            )  # fmt: skip

    def dense_cold(a, b, c):
        saved, dense.DENSE_CACHE_BYTES = dense.DENSE_CACHE_BYTES, 0
        try:
            return dense_call(a, b, c)
        finally:
            dense.DENSE_CACHE_BYTES = saved

    kept_bias = dense_count_bias((pitch, offset), pos, pos, causal=True, dtype=q.dtype)
    extra = {}
    if compiled:
        inner = torch.compile(
            lambda a, b, c: dense_plsh_attention(
                a,
                b,
                c,
                partition=(pitch, offset),
                causal=True,
                scale=scale,
                query_positions=pos,
                key_positions=pos,
            ),  # fmt: skip
            fullgraph=True,
        )

        def compiled_counts(a, b, c):
            with dense.use_dense_cache(cache):  # the operator looks up the cache active now
                return inner(a, b, c)

        compiled_bias = torch.compile(lambda a, b, c: _biased(a, b, c, kept_bias, scale),
                                      fullgraph=True)  # fmt: skip
        extra = {
            "fwd_counts_compiled": forward_of(compiled_counts),
            "fwd_f32_bias_compiled": forward_of(compiled_bias),
        }
    calls = {
        "dense": backward_of(dense_call),
        "dense_cold": backward_of(dense_cold),
        "tiled": backward_of(
            lambda a, b, c: plsh_attention(a, b, c, partition=(pitch, offset), backend="cpu")
        ),
        "alibi_sdpa": backward_of(lambda a, b, c: sdpa_alibi_attention(a, b, c, causal=True)),
        "fwd_counts": forward_of(dense_call),
        "fwd_f32_bias": forward_of(lambda a, b, c: _biased(a, b, c, kept_bias, scale)),
        **extra,
    }
    kept = {
        "counts_bytes": lambda: cache.nbytes,
        "f32_bias_bytes": lambda: kept_bias.numel() * kept_bias.element_size(),
    }
    return calls, kept


def crossover(lengths, heads, head_dim, num_samples, repeats, compiled=False) -> list[dict]:
    rows = []
    for n in lengths:
        calls, kept = _attention_calls(n, heads, head_dim, num_samples, compiled)
        times = {name: [] for name in calls}
        for _ in range(2):  # warm-up: kept plans and counts from the second call on
            for f in calls.values():
                f()
        for _ in range(repeats):
            for name, f in calls.items():
                times[name].append(_time(f))
        row = {"n": n, **{f"{name}_ms": 1e3 * statistics.median(t) for name, t in times.items()}}
        row["dense_over_tiled"] = row["dense_ms"] / row["tiled_ms"]
        row["fwd_counts_over_f32_bias"] = row["fwd_counts_ms"] / row["fwd_f32_bias_ms"]
        if compiled:
            row["fwd_compiled_counts_over_f32_bias"] = (
                row["fwd_counts_compiled_ms"] / row["fwd_f32_bias_compiled_ms"]
            )
        row.update({name: size() for name, size in kept.items()})
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
        "| n | dense PLSH, kept counts (ms) | dense PLSH, counts built (ms) | tiled PLSH (ms) "
        "| dense / tiled | exact ALiBi SDPA (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["crossover"]:
        lines.append(
            f"| {r['n']} | {r['dense_ms']:.1f} | {r['dense_cold_ms']:.1f} | {r['tiled_ms']:.1f} | "
            f"{r['dense_over_tiled']:.2f} | {r['alibi_sdpa_ms']:.1f} |"
        )
    lines += ["", f"Measured crossover (largest n with dense <= tiled): {result['measured']}; "
              f"shipped `DENSE_CROSSOVER['cpu']` = {result['shipped']}."]  # fmt: skip
    lines += [
        "",
        "## Forward alone (no gradient): kept uint8 counts against a kept float32 bias",
        "",
        "| n | kept counts (ms) | kept float32 bias (ms) | counts / bias time "
        "| counts MiB | bias MiB |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["crossover"]:
        lines.append(
            f"| {r['n']} | {r['fwd_counts_ms']:.2f} | {r['fwd_f32_bias_ms']:.2f} | "
            f"{r['fwd_counts_over_f32_bias']:.2f} | {r['counts_bytes'] / 2**20:.3f} | "
            f"{r['f32_bias_bytes'] / 2**20:.3f} |"
        )
    if result.get("compiled_forward"):
        lines += [
            "",
            "## Forward alone under `torch.compile(fullgraph=True)` (Inductor)",
            "",
            "| n | kept counts (ms) | kept float32 bias (ms) | counts / bias time |",
            "|---|---|---|---|",
        ]
        for r in result["crossover"]:
            lines.append(
                f"| {r['n']} | {r['fwd_counts_compiled_ms']:.2f} | "
                f"{r['fwd_f32_bias_compiled_ms']:.2f} | "
                f"{r['fwd_compiled_counts_over_f32_bias']:.2f} |"
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
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--compiled-forward", action="store_true", help="also the two forwards compiled"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = crossover(
        args.n, args.heads, args.head_dim, args.num_samples, args.repeats, args.compiled_forward
    )
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
        "compiled_forward": args.compiled_forward,
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
