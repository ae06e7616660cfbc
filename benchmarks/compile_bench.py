"""torch.compile against eager: a small-model training step on the CPU (issue 12).

Run from the repository root::

    python benchmarks/compile_bench.py --n 512 2048 8192 --threads 2

Model: :class:`plsh_fast.experiments.model.ByteLM` with 2 layers, d_model 128, 4 heads
(the standard slopes), batch 1, causal; ``plsh-16`` (PLSH, 16 samples, the fast backend
``"auto"``, a fresh partition every step) and ``alibi`` (exact ALiBi through SDPA with a
dense bias). A step is forward, next-byte cross-entropy, backward and an AdamW update.
Each variant runs eagerly and compiled (``torch.compile(model, fullgraph=True,
dynamic=True)``, Inductor), in this one process, interleaved step by step so that load
from other processes hits both alike.

Reported per (variant, mode, n): the median step time over ``--repeats`` steps after the
warm-up, the median over step pairs of compiled / eager (each pair ran back to back, so it
sees the same load from other processes) and the ratio of the fastest steps; for the compiled model, the first step at the first length (the compile) and the
first step at each later length (a recompile would show here), and Dynamo's frame count
(one compile serves every length when it stays at 1). The compiled losses are checked
against eager on the same partition (same draw index, same weights): the relative
difference is reported.
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import json
import platform
import socket
import statistics
import time
from pathlib import Path

import torch


def _step_fn(model, opt):
    def step(tokens):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
        )
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--repeats-long", type=int, default=3, help="steps measured for n >= 4096 (slow)"
    )
    parser.add_argument("--variants", nargs="+", default=["plsh-16", "alibi"])
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import torch._dynamo.utils as dynamo_utils

    from plsh_fast.experiments.model import ByteLM

    t_start = time.perf_counter()
    rows = []
    for variant in args.variants:
        torch.manual_seed(0)
        eager = ByteLM(variant, d_model=128, num_layers=2, num_heads=4, seed=0)
        twin = copy.deepcopy(eager)
        compiled = torch.compile(twin, fullgraph=True, dynamic=True)
        steps = {
            "eager": _step_fn(eager, torch.optim.AdamW(eager.parameters(), lr=1e-3)),
            "compiled": _step_fn(compiled, torch.optim.AdamW(twin.parameters(), lr=1e-3)),
        }
        cores = {"eager": eager.attention_cores(), "compiled": twin.attention_cores()}
        dynamo_utils.counters.clear()
        torch._dynamo.reset()
        for index, n in enumerate(args.n):
            gen = torch.Generator().manual_seed(n)
            tokens = torch.randint(0, 256, (1, n + 1), generator=gen)
            first = {}
            for mode in ("compiled", "eager"):
                t0 = time.perf_counter()
                loss = steps[mode](tokens)
                first[mode] = (time.perf_counter() - t0, float(loss))
            times = {"eager": [], "compiled": []}
            losses = {"eager": [], "compiled": []}
            for _ in range(args.repeats if n < 4096 else args.repeats_long):
                for mode in ("eager", "compiled"):
                    t0 = time.perf_counter()
                    loss = steps[mode](tokens)
                    times[mode].append(time.perf_counter() - t0)
                    losses[mode].append(float(loss))
            draws = {mode: [c.num_draws for c in cores[mode]] for mode in cores}
            rel = max(abs(a - b) / abs(b) for a, b in zip(losses["compiled"], losses["eager"]))
            # Steps alternate eager/compiled: the ratio of each pair sees the same load.
            pair_ratio = statistics.median(c / e for c, e in zip(times["compiled"], times["eager"]))
            for mode in ("eager", "compiled"):
                rows.append(
                    {
                        "variant": variant,
                        "mode": mode,
                        "n": n,
                        "median_step_s": statistics.median(times[mode]),
                        "min_step_s": min(times[mode]),
                        "median_pair_ratio_compiled_over_eager": pair_ratio,
                        "first_step_s": first[mode][0],
                        "first_step_is": (
                            "compile"
                            if mode == "compiled" and index == 0
                            else "first call at this length"
                        ),
                        "steps": len(times[mode]),
                        "draws": draws[mode],
                        "max_rel_loss_diff_compiled_vs_eager": rel,
                        "frames_compiled_so_far": int(
                            dynamo_utils.counters["stats"]["unique_graphs"]
                        ),
                    }
                )
            print(rows[-2], rows[-1], flush=True)
    record = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "host": socket.gethostname(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": args.threads,
        },
        "config": {
            "model": "ByteLM, 2 layers, d_model 128, 4 heads, batch 1, causal",
            "variants": args.variants,
            "n": args.n,
            "repeats": args.repeats,
            "repeats_long": args.repeats_long,
            "compile": "torch.compile(model, fullgraph=True, dynamic=True), Inductor",
        },
        "note": (
            "other processes shared the 2-core machine during the run; compare ratios "
            "within this run (eager and compiled steps interleaved), not absolute times "
            "across runs"
        ),
        "total_seconds": time.perf_counter() - t_start,
        "rows": rows,
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"compile_{record['date_utc'][:10]}_{socket.gethostname()}_t{args.threads}"
    (out_dir / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")
    (out_dir / f"{stem}.md").write_text(_markdown(record))
    print(f"wrote {out_dir / stem}.json/.md")
    return record


def _markdown(record: dict) -> str:
    lines = [
        f"# torch.compile vs eager: training step ({record['date_utc']})",
        "",
        f"Machine: {record['machine']['host']}, {record['machine']['platform']}, torch "
        f"{record['machine']['torch']}, {record['machine']['threads']} threads. "
        f"{record['note'].capitalize()}.",
        "",
        f"{record['config']['model']}; {record['config']['compile']}; median of "
        f"{record['config']['repeats']} steps ({record['config']['repeats_long']} for "
        "n >= 4096) after a warm-up step (forward, cross-entropy, "
        "backward, AdamW). `plsh-16`: PLSH with 16 samples, fast backend, fresh partition "
        "per step; `alibi`: exact ALiBi (dense bias, SDPA).",
        "",
        "| variant | n | eager step (s) | compiled step (s) | compiled / eager, median of "
        "pairs | same, min / min | compiled first step (s) | graphs | max rel. loss diff |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rows = record["rows"]
    for eager, compiled in zip(rows[0::2], rows[1::2]):
        lines.append(
            f"| {eager['variant']} | {eager['n']} | {eager['median_step_s']:.3f} | "
            f"{compiled['median_step_s']:.3f} | "
            f"{compiled['median_pair_ratio_compiled_over_eager']:.2f} | "
            f"{compiled['min_step_s'] / eager['min_step_s']:.2f} | "
            f"{compiled['first_step_s']:.1f} ({compiled['first_step_is']}) | "
            f"{compiled['frames_compiled_so_far']} | "
            f"{compiled['max_rel_loss_diff_compiled_vs_eager']:.1e} |"
        )
    lines += [
        "",
        f"Total run time {record['total_seconds']:.0f} s. `graphs`: Dynamo's unique graphs "
        "so far for the variant (1 = one compile served every length).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
