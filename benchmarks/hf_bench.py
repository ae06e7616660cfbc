"""Hugging Face models on the CPU: a compiled training step and ``generate()`` throughput.

Run from the repository root::

    python benchmarks/hf_bench.py train --n 256 1024 4096 --threads 2
    python benchmarks/hf_bench.py generate --prompt 4096 32768 --new-tokens 64 --threads 2

Both parts build a tiny random ``LlamaForCausalLM`` from a config (no download; 2 layers,
hidden 64, 4 heads, 2 key/value heads, vocabulary 256), seeded so every variant starts
from the same weights, and run in one process with the variants taking turns.

``train`` (issue 25, goal: PLSH <= 1.25x ``"alibi"`` at n = 256 and 1024, faster than
``"alibi"`` at n >= 4096): one training step is forward, next-token cross-entropy
(``labels=input_ids``), backward and an AdamW update, batch 1, for

* ``plsh``: ``set_alibi_attention(model, "plsh", seed=0)`` (s = 16, default backend
  ``"auto"``: dense below ``plsh_fast.dense.DENSE_CROSSOVER``, the tiled path above);
* ``alibi``: ``set_alibi_attention(model, "alibi")``: exact ALiBi, dense bias through SDPA;
* ``sdpa``: the unmodified model (RoPE, transformers' ``"sdpa"``): the price of attention
  without a positional bias matrix, for scale.

The model is ``torch.compile(model, fullgraph=True, dynamic=True)`` (Inductor: the forward
and, through AOTAutograd, the backward) and the optimizer step ``torch.compile(opt.step)``
(``--eager-optimizer`` leaves it eager). The first step at each length is reported
separately (the compile at the first length; a recompile would show at a later one), then
``--warmup`` untimed rounds (a compiled optimizer compiles again once its state exists),
then ``--repeats`` rounds in which every variant takes one step; the median per variant and the
median over rounds of plsh / alibi (each round's steps ran back to back, under the same
load). ``--profile`` adds one ``torch.profiler`` step per variant and length: the operators
with the most self CPU time.

``generate`` (issue 25): greedy ``model.generate`` of ``--new-tokens`` tokens after a
prompt of ``--prompt`` random tokens (batch 1) on the ``"plsh"`` model, once with
``plsh_fast.hf.PLSHCache`` and once with transformers' ``DynamicCache``, taking turns
``--repeats`` times. A stopping criterion stamps the time after every generated token: the
prefill time is the start to the first token, the decode rate is the tokens after the first
over the time after the first (median over repeats). Also reported: whether both caches gave
the same tokens, and the bytes of keys and values each cache holds at the end.

Every row records the 1-minute load average (``os.getloadavg``) before and after it: the
development VM is shared. Results go to ``benchmarks/results/hf_<part>_<date>.json`` and
``.md`` (``--out`` for another stem).
"""

from __future__ import annotations

import argparse
import contextlib
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

from plsh_ref.provenance import run_metadata  # noqa: E402

VARIANTS = ("plsh", "alibi", "sdpa")


def tiny_llama(variant: str, *, layers: int = 2, hidden: int = 64, heads: int = 4):
    """The benchmark's tiny random Llama with ``variant`` attention, same weights for all.

    ``variant``: ``"plsh"`` / ``"alibi"`` (``set_alibi_attention``, RoPE removed, seed 0) or
    ``"sdpa"`` (the model as transformers builds it).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    import plsh_fast.hf as hf

    if variant not in VARIANTS:
        raise ValueError(f"variant: must be one of {VARIANTS}, got {variant!r}")
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=1 << 20,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(cfg)
    if variant != "sdpa":
        hf.set_alibi_attention(model, variant, seed=0)
    return model


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _train_step(variant: str, args):
    model = tiny_llama(variant, layers=args.layers, hidden=args.hidden, heads=args.heads).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    backend = args.compile_backend
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=backend)
    opt_step = opt.step if args.eager_optimizer else torch.compile(opt.step, backend=backend)

    def step(ids):
        loss = compiled(input_ids=ids, labels=ids).loss
        loss.backward()
        opt_step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def _profile(step, ids, top: int) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(ids)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    return [
        {
            "op": e.key,
            "self_ms": e.self_cpu_time_total / 1e3,
            "share": e.self_cpu_time_total / total,
            "calls": e.count,
        }
        for e in events[:top]
    ]


def train(args) -> dict:
    """The compiled training-step comparison (see the module docstring)."""
    import torch._dynamo.utils as dynamo_utils

    variants = list(args.variants)
    if args.dense_crossover is not None:  # an experiment: where the dense path would pay
        from plsh_fast import dense

        dense.DENSE_CROSSOVER["cpu"] = args.dense_crossover
    steps = {}
    for variant in variants:
        steps[variant] = _train_step(variant, args)
    dynamo_utils.counters.clear()
    rows = []
    result = {"part": "train", "rows": rows}
    from plsh_fast.dense import DENSE_CROSSOVER

    args.dense_crossover_used = DENSE_CROSSOVER["cpu"]
    for n in args.n:
        ids = torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(n))
        row: dict = {"n": n, "load_before": _load()}
        for variant in variants:  # first step: the compile (first n) or a recompile
            row[f"{variant}_first_s"] = _time(lambda v=variant: steps[v](ids))
            row[f"{variant}_first_load"] = _load()
            print(f"n={n} {variant} first step {row[f'{variant}_first_s']:.1f} s", flush=True)
        for _ in range(args.warmup):  # the optimizer's state appears after its first step
            for variant in variants:
                row[f"{variant}_warmup_s"] = _time(lambda v=variant: steps[v](ids))
        times: dict = {v: [] for v in variants}
        for _ in range(args.repeats):
            for variant in variants:
                times[variant].append(_time(lambda v=variant: steps[v](ids)))
        for variant in variants:
            row[f"{variant}_ms"] = 1e3 * statistics.median(times[variant])
            row[f"{variant}_all_ms"] = [1e3 * t for t in times[variant]]
        if "plsh" in times and "alibi" in times:
            row["plsh_over_alibi"] = statistics.median(
                p / a for p, a in zip(times["plsh"], times["alibi"])
            )
        row["load_after"] = _load()
        row["graphs_so_far"] = int(dynamo_utils.counters["stats"]["unique_graphs"])
        if args.profile:
            row["profile"] = {v: _profile(steps[v], ids, args.profile) for v in variants}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "profile"}), flush=True)
        _write(args, result)  # keep what is measured if a later length is stopped
    return result


class _Stamps:
    """A stopping criterion that never stops and stamps the time of every generated token."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids, scores, **kwargs):
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def _cache_bytes(cache) -> int:
    total = 0
    for layer in cache.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def _generate_once(model, ids, cache, new_tokens: int) -> dict:
    from transformers import StoppingCriteriaList

    stamps = _Stamps()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            cache=cache,
            stopping_criteria=StoppingCriteriaList([stamps]),
            pad_token_id=0,
        )
    t_end = time.perf_counter()
    decode = stamps.times[-1] - stamps.times[0]
    return {
        "prefill_s": stamps.times[0] - t0,
        "decode_tokens_per_s": (len(stamps.times) - 1) / decode if decode > 0 else float("nan"),
        "total_s": t_end - t0,
        "tokens": out[0, ids.shape[1] :].tolist(),
        "cache_bytes": _cache_bytes(cache),
    }


def generate(args) -> dict:
    """``generate()`` with PLSHCache beside DynamicCache (see the module docstring)."""
    from transformers import DynamicCache

    import plsh_fast.hf as hf

    model = tiny_llama("plsh", layers=args.layers, hidden=args.hidden, heads=args.heads).eval()
    caches = {"plsh_cache": lambda: hf.PLSHCache(model), "dynamic_cache": lambda: DynamicCache()}
    rows = []
    result = {"part": "generate", "rows": rows}
    for n in args.prompt:
        ids = torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(n))
        row: dict = {"prompt": n, "new_tokens": args.new_tokens, "load_before": _load()}
        runs: dict = {name: [] for name in caches}
        for make in caches.values():  # warm-up: first calls at this length
            _generate_once(model, ids, make(), 2)
        for _ in range(args.repeats):
            for name, make in caches.items():
                runs[name].append(_generate_once(model, ids, make(), args.new_tokens))
        for name, rs in runs.items():
            row[f"{name}_prefill_s"] = statistics.median(r["prefill_s"] for r in rs)
            row[f"{name}_decode_tokens_per_s"] = statistics.median(
                r["decode_tokens_per_s"] for r in rs
            )
            row[f"{name}_decode_all"] = [r["decode_tokens_per_s"] for r in rs]
            row[f"{name}_mb"] = rs[-1]["cache_bytes"] / 2**20
        row["plsh_over_dynamic_decode"] = (
            row["plsh_cache_decode_tokens_per_s"] / row["dynamic_cache_decode_tokens_per_s"]
        )
        row["same_tokens"] = all(
            a["tokens"] == b["tokens"] for a, b in zip(runs["plsh_cache"], runs["dynamic_cache"])
        )
        row["load_after"] = _load()
        rows.append(row)
        print(json.dumps(row), flush=True)
        _write(args, result)
    return result


def _markdown(result: dict) -> str:
    meta = result["meta"]
    a = meta["args"]
    head = [
        f"# Tiny Llama on the CPU: {result['part']} ({meta['date_utc']})",
        "",
        f"Machine: {meta['cpu_model']} ({meta['machine'].get('cpu_count')} cores, shared with "
        f"other jobs: the 1-minute load average is in every row), torch {meta['torch']}, "
        f"transformers {meta['transformers']}, {a['threads']} torch threads, commit "
        f"{(meta.get('git_commit') or 'unknown')[:10]}. Command: `{meta['command']}`. "
        f"Model: LlamaForCausalLM, {a['layers']} layers, hidden {a['hidden']}, {a['heads']} heads "
        f"({max(1, a['heads'] // 2)} key/value heads), vocabulary 256, random weights, batch 1.",
        "",
    ]
    rows = result["rows"]
    if result["part"] == "train":
        variants = a["variants"]
        opt = "eager" if a["eager_optimizer"] else "`torch.compile(opt.step)`"
        head += [
            "Training step = forward + cross-entropy + backward + AdamW; model "
            f"`torch.compile(fullgraph=True, dynamic=True, backend={a['compile_backend']!r})`, "
            f"optimizer {opt}; `DENSE_CROSSOVER['cpu']` = {a.get('dense_crossover_used')}; "
            f"first step, then {a['warmup']} untimed rounds, then the "
            f"median of {a['repeats']} rounds, the variants taking turns; plsh / alibi is the "
            "median over rounds of the ratio.",
            "",
            "| n | "
            + " | ".join(f"{v} (ms)" for v in variants)
            + " | plsh / alibi | first step (s): "
            + " / ".join(variants)
            + " | load before / after |",
            "|---|" + "---|" * len(variants) + "---|---|---|",
        ]
        for r in rows:
            ratio = f"{r['plsh_over_alibi']:.2f}" if "plsh_over_alibi" in r else "-"
            head.append(
                f"| {r['n']} | "
                + " | ".join(f"{r[f'{v}_ms']:.1f}" for v in variants)
                + f" | {ratio} | "
                + " / ".join(f"{r[f'{v}_first_s']:.1f}" for v in variants)
                + f" | {r['load_before']:.1f} / {r['load_after']:.1f} |"
            )
        head += ["", f"Dynamo graphs after the run: {rows[-1]['graphs_so_far'] if rows else 0}."]
        for r in rows:
            for v, ops in (r.get("profile") or {}).items():
                head += ["", f"Profile, n = {r['n']}, {v} (one step, self CPU time):", ""]
                head += ["| operator | self ms | share | calls |", "|---|---|---|---|"]
                head += [
                    f"| `{o['op']}` | {o['self_ms']:.1f} | {100 * o['share']:.0f}% | {o['calls']} |"
                    for o in ops
                ]
    else:
        head += [
            f'Greedy `generate()` of {a["new_tokens"]} tokens on the `"plsh"` model (s = 16), '
            f"median of {a['repeats']} runs per cache, the caches taking turns. Prefill = start "
            "to first token; decode = tokens after the first / time after the first.",
            "",
            "| prompt | PLSHCache prefill (s) | DynamicCache prefill (s) | PLSHCache decode tok/s "
            "| DynamicCache decode tok/s | PLSH / Dynamic | same tokens | cache MB PLSH / "
            "Dynamic | load before / after |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            head.append(
                f"| {r['prompt']} | {r['plsh_cache_prefill_s']:.2f} | "
                f"{r['dynamic_cache_prefill_s']:.2f} | "
                f"{r['plsh_cache_decode_tokens_per_s']:.1f} | "
                f"{r['dynamic_cache_decode_tokens_per_s']:.1f} | "
                f"{r['plsh_over_dynamic_decode']:.2f} | {r['same_tokens']} | "
                f"{r['plsh_cache_mb']:.2f} / {r['dynamic_cache_mb']:.2f} | "
                f"{r['load_before']:.1f} / {r['load_after']:.1f} |"
            )
    return "\n".join(head) + "\n"


def _write(args, result: dict) -> None:
    import transformers

    date = _dt.datetime.now(_dt.timezone.utc)
    meta = {
        **run_metadata(),
        "cpu_model": _cpu_model(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "command": "python benchmarks/hf_bench.py " + " ".join(args.argv),
        "args": {k: v for k, v in vars(args).items() if k not in ("func", "argv", "out")},
    }
    result["meta"] = meta
    out = args.out or ROOT / "benchmarks" / "results" / f"hf_{result['part']}_{date:%Y-%m-%d}"
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    out.with_suffix(".md").write_text(_markdown(result))


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None, help="result stem (no suffix)")
    sub = parser.add_subparsers(dest="part", required=True)
    p = sub.add_parser("train", help="compiled training step")
    p.add_argument("--n", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps after the first")
    p.add_argument("--eager-optimizer", action="store_true")
    p.add_argument(
        "--dense-crossover",
        type=int,
        default=None,
        help="set plsh_fast.dense.DENSE_CROSSOVER['cpu'] for the run (default: shipped value)",
    )
    p.add_argument(
        "--compile-backend",
        default="inductor",
        help="torch.compile backend (default inductor; 'eager' only traces: for tests)",
    )
    p.add_argument("--profile", type=int, default=0, help="top operators to profile (0: none)")
    p.set_defaults(func=train)
    g = sub.add_parser("generate", help="generate() with PLSHCache and DynamicCache")
    g.add_argument("--prompt", type=int, nargs="+", default=[4096, 32768])
    g.add_argument("--new-tokens", type=int, default=64)
    g.add_argument("--repeats", type=int, default=3)
    g.set_defaults(func=generate)
    args = parser.parse_args(argv)
    for name in ("n", "prompt"):
        if min(getattr(args, name, [2])) < 2:
            parser.error(f"--{name}: lengths must be >= 2")
    if args.repeats < 1 or args.threads < 1:
        parser.error("--repeats and --threads must be >= 1")
    if args.part == "generate" and args.new_tokens < 2:
        parser.error("--new-tokens: must be >= 2")
    args.argv = argv
    torch.set_num_threads(args.threads)
    result = args.func(args)
    _write(args, result)
    print(_markdown(result))
    return result


if __name__ == "__main__":
    main()
