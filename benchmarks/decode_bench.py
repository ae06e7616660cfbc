"""Decoding benchmark: the bounded PLSH cache against exact ALiBi with a full cache and a window.

Run from the repository root, e.g.::

    python benchmarks/decode_bench.py --context 8192 65536 262144 --batch 1 8 --threads 1

For each context length ``N`` and batch size (``--num-heads`` heads with the standard
slopes, head_dim 64, float32, ``s = --num-samples``), one process measures side by side:

* ``plsh_cache``: :class:`plsh_fast.decoding.PLSHDecodingCache` after a prefill of the
  context, then ``--steps`` decode steps of one token per sequence (exact PLSH attention;
  the cache keeps only the keys that later queries can reach, at most
  ``cache_bound(partition)``), with its default ``check_finite=True``. The prefill feeds
  only the last ``--prefill-tail`` tokens of the context, at their positions
  ``N - tail .. N - 1``: the cache after a call holds the keys the newest query reaches,
  all within the last ``bound`` positions, so for ``tail >= bound`` its state is the one a
  prefill of all ``N`` tokens leaves (the prefill's own outputs are not measured);
* ``alibi_full``: exact ALiBi over the whole cache of ``N + step`` keys, through
  ``scaled_dot_product_attention`` with the ALiBi bias row of the new query;
* ``alibi_window``: the same over the last ``W`` keys only, ``W`` the PLSH cache bound (a
  sliding-window cache of equal size; an approximation of ALiBi).

Reported: decode tokens/s (batch x steps per second: median step time after one warm-up
step; the three methods take turns at every step, so a load from other processes hits them
alike), the cache memory in bytes (keys and values; the PLSH cache also counts its int64
positions), the PLSH cache size after prefill and at the end (largest sequence), its bound,
and the load average. Results go to ``benchmarks/results/decode_<date>_t<threads>.json``
and ``.md``, with the package version and git commit.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from plsh_fast.decoding import PLSHDecodingCache, cache_bound  # noqa: E402
from plsh_ref import alibi_slopes, draw_partition  # noqa: E402
from plsh_ref.provenance import run_metadata  # noqa: E402


def _alibi_step(q, k, v, slopes_t, pos_q, pos_k):
    """Exact ALiBi for one new query ``(1, H, 1, d)`` against cached keys ``(1, H, L, d)``."""
    bias = -slopes_t[:, None, None] * (pos_q - pos_k).abs().to(torch.float32)[None, None, :]
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias[None])


def _interleaved_rates(fns: dict, steps: int) -> tuple[dict, dict]:
    """Steps/s of each method, from the median and from the mean step time over steps, the
    methods taking turns at every step.

    Taking turns makes a load from other processes hit every method alike, so the ratios
    between methods stay meaningful on a shared machine. The median ignores the steps
    another process pre-empted, and also work done once every few steps (the PLSH cache
    plans up to 64 steps at once); the mean counts both.
    """
    times = {name: [] for name in fns}
    for fn in fns.values():
        fn(0)  # warm-up
    for i in range(1, steps + 1):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn(i)
            times[name].append(time.perf_counter() - t0)
    medians = {name: 1.0 / statistics.median(t) for name, t in times.items()}
    means = {name: 1.0 / statistics.mean(t) for name, t in times.items()}
    return medians, means


def _profile_steps(step, window, start: int, steps: int, cache=None) -> dict:
    """Median time of the pieces of the PLSH decode step over ``steps`` more steps.

    Medians, not totals (a profiler's totals on a loaded machine are dominated by the
    steps another process pre-empted): the whole ``update``, and inside it the argument
    checks (on a decode step the ring's comparison of shapes, dtypes and devices with the
    checked calls), the finiteness check, the ring's plan, its ``attend`` and, inside
    that, ``torch.repeat_interleave`` (the count bias) and SDPA; ``window`` (the same-size
    window peer) takes turns with it, and its SDPA is timed alike. Wraps those functions
    for the duration (they are the package's internals: this probes
    ``plsh_fast/decoding.py``). With ``cache``, also the median time of planning one block
    of steps on the host (the ring's ``_consecutive``, which changes nothing), and that
    per step: the step medians leave it out, as it runs once per block.
    """
    import functools

    from plsh_fast import decoding

    times: dict = {}
    current = ["plsh"]

    def wrap(owner, name, label):
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def timed(*a, **kw):
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            times.setdefault(f"{current[0]}: {label}", []).append(time.perf_counter() - t0)
            return out

        setattr(owner, name, timed)
        return owner, name, fn

    sdpa = torch.nn.functional.scaled_dot_product_attention
    saved = [
        wrap(decoding.PLSHDecodingCache, "_check_call", "argument checks"),
        wrap(decoding._StepRing, "accepts", "argument checks"),
        wrap(decoding, "_sum_is_finite", "finiteness check"),
        wrap(decoding._StepRing, "plan", "ring plan"),
        wrap(decoding._StepRing, "attend", "ring attend"),
        wrap(torch, "repeat_interleave", "repeat_interleave (count bias)"),
        wrap(torch.nn.functional, "scaled_dot_product_attention", "SDPA"),
    ]
    try:
        for i in range(start, start + steps):
            for name, fn in (("plsh", step), ("window", window)):
                current[0] = name
                t0 = time.perf_counter()
                fn(i)
                times.setdefault(f"{name}: whole step", []).append(time.perf_counter() - t0)
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)
    assert torch.nn.functional.scaled_dot_product_attention is sdpa
    pieces = {label: 1e6 * statistics.median(t) for label, t in sorted(times.items())}
    ring = None if cache is None else cache._buffers
    if ring is not None:  # the step medians miss the steps that plan a block: time it apart
        plans = []
        for _ in range(16):  # planning reads the ring's state and changes nothing
            t0 = time.perf_counter()
            block = ring._consecutive()
            plans.append(time.perf_counter() - t0)
        size = block.size if block is not None else ring.block_size
        pieces[f"plsh: planning one block of {size} steps (median of 16)"] = 1e6 * (
            statistics.median(plans)
        )
        pieces["plsh: block planning per step"] = 1e6 * statistics.median(plans) / size
    return pieces


def bench(context: int, batch: int, args) -> dict:
    H, d, s = args.num_heads, args.head_dim, args.num_samples
    slopes = alibi_slopes(H)
    part = draw_partition(1.0 / slopes, s, seed=args.seed)
    bound = cache_bound(part)
    with_full = args.full_max_context is None or context <= args.full_max_context
    tail = min(context, max(args.prefill_tail, bound))
    a = context - tail
    # Only the full-cache peer reads keys before the prefill tail: without it the tokens
    # from position `a` on are drawn (index i holds position origin + i), so a 256k
    # context at batch 8 fits in memory.
    origin = 0 if with_full else a
    g = torch.Generator().manual_seed(context)
    extra = args.steps * (2 if args.profile else 1)  # profiled steps follow the timed ones
    total = context + extra + 1
    q = torch.randn(batch, H, total - origin, d, generator=g)
    k = torch.randn(batch, H, total - origin, d, generator=g)
    v = torch.randn(batch, H, total - origin, d, generator=g)
    row = {"context": context, "batch": batch, "num_heads": H, "head_dim": d}
    row.update({"num_samples": s, "bound": bound})

    cache = PLSHDecodingCache(part)
    t0 = time.perf_counter()
    cache.update(
        q[:, :, a - origin : context - origin],
        k[:, :, a - origin : context - origin],
        v[:, :, a - origin : context - origin],
        query_positions=torch.arange(a, context),
    )
    row["plsh_prefill_tail"] = tail
    row["plsh_prefill_s"] = time.perf_counter() - t0
    row["plsh_cached_after_prefill"] = int(cache.cached_tokens().max())

    slopes_t = torch.from_numpy(slopes).to(torch.float32)
    pos = torch.arange(origin, total)  # pos[i] = origin + i

    def plsh_step(i):
        j = context + i - origin
        cache.update(q[:, :, j : j + 1], k[:, :, j : j + 1], v[:, :, j : j + 1])

    def full_step(i):
        j = context + i  # origin is 0 here
        _alibi_step(
            q[:, :, j : j + 1], k[:, :, : j + 1], v[:, :, : j + 1], slopes_t, pos[j], pos[: j + 1]
        )

    def window_step(i):
        j = context + i - origin
        a = max(0, j + 1 - bound)
        _alibi_step(
            q[:, :, j : j + 1],
            k[:, :, a : j + 1],
            v[:, :, a : j + 1],
            slopes_t,
            pos[j],
            pos[a : j + 1],
        )

    fns = {"plsh": plsh_step, "alibi_full": full_step, "alibi_window": window_step}
    if not with_full:
        del fns["alibi_full"]
        row["alibi_full_tokens_per_s"] = None  # not measured (--full-max-context)
    rates, mean_rates = _interleaved_rates(fns, args.steps)
    for name, rate in rates.items():
        row[f"{name}_tokens_per_s"] = batch * rate
    row["plsh_over_window"] = rates["plsh"] / rates["alibi_window"]
    row["plsh_over_window_mean"] = mean_rates["plsh"] / mean_rates["alibi_window"]
    if args.profile:
        row["step_pieces_us"] = _profile_steps(
            plsh_step, window_step, args.steps + 1, args.steps, cache=cache
        )
    row["plsh_cached_at_end"] = int(cache.cached_tokens().max())
    row["plsh_cache_bytes"] = cache.memory_bytes()
    row["alibi_full_cache_bytes"] = batch * 2 * H * (context + args.steps) * d * 4
    row["alibi_window_cache_bytes"] = batch * 2 * H * bound * d * 4
    row["load_average"] = os.getloadavg()[0]
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, nargs="+", default=[8192, 65536, 262144])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prefill-tail", type=int, default=4096)
    parser.add_argument("--num-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--num-samples", type=int, default=16)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="partition seed (default: 0)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--full-max-context",
        type=int,
        default=None,
        help="measure exact ALiBi over the full cache only up to this context (default: all)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="time the pieces of the PLSH step (medians)"
    )
    parser.add_argument("--label", default="", help="suffix of the result file names")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    if min(args.context) < 1 or args.steps < 1:
        parser.error("--context and --steps must be >= 1")
    torch.set_num_threads(args.threads)
    rows = []
    for n in args.context:
        for batch in args.batch:
            row = bench(n, batch, args)
            rows.append(row)
            print(json.dumps(row), flush=True)
    stamp = _dt.datetime.now(_dt.timezone.utc)
    meta = {
        **run_metadata(),
        "host": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "threads": args.threads,
        "torch": torch.__version__,
        "args": vars(args),
        "command": " ".join(
            ["python benchmarks/decode_bench.py", *(sys.argv[1:] if argv is None else argv)]
        ),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = out / f"decode_{stamp:%Y-%m-%d}_t{args.threads}{args.label}"
    base.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    load = ", ".join(f"{r['load_average']:.1f}" for r in rows)
    lines = [
        f"# Decoding benchmark, {meta['date_utc']}",
        "",
        f"CPU: {meta['cpu_model']}, {args.threads} torch threads, torch {meta['torch']}, commit "
        f"{(meta['git_commit'] or 'unknown')[:10]}; machine shared with other processes (1-min "
        f"load average per row: {load}). {args.num_heads} heads (standard slopes), head_dim "
        f"{args.head_dim}, float32, s = {args.num_samples}; tokens/s = batch x steps/s, the "
        f"median over {args.steps} one-token steps, the three methods taking turns at every "
        'step (the ratios hold under the load, absolute numbers do not); "means": the '
        "ratio of mean step times instead (it counts the steps other processes pre-empted, "
        "and the PLSH cache's planning once per block of steps). PLSH cache with "
        f"check_finite=True. Command: `{meta['command']}`.",
        "",
        "| context | batch | PLSH cache tok/s | full ALiBi tok/s | window ALiBi tok/s | PLSH / window "
        "| PLSH / window, means | PLSH cache (tokens after prefill / end / bound) | PLSH cache MB "
        "| full cache MB | window cache MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['context']} | {r['batch']} | {r['plsh_tokens_per_s']:.0f} | "
            f"{_rate(r['alibi_full_tokens_per_s'])} | {r['alibi_window_tokens_per_s']:.0f} | "
            f"{r['plsh_over_window']:.2f} | {r['plsh_over_window_mean']:.2f} | "
            f"{r['plsh_cached_after_prefill']} / "
            f"{r['plsh_cached_at_end']} / {r['bound']} | {r['plsh_cache_bytes'] / 2**20:.2f} | "
            f"{r['alibi_full_cache_bytes'] / 2**20:.1f} | {r['alibi_window_cache_bytes'] / 2**20:.2f} |"
        )
    for r in rows:
        if r.get("step_pieces_us"):
            lines += [
                "",
                f"Step pieces, context {r['context']}, batch {r['batch']}: median microseconds "
                f"over {args.steps} more steps, PLSH and window taking turns (`--profile`):",
                "",
                "| piece | us |",
                "|---|---|",
            ]
            lines += [f"| {k} | {v:.1f} |" for k, v in r["step_pieces_us"].items()]
    base.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {base}.json and .md")
    return 0


def _rate(value) -> str:
    return "not measured" if value is None else f"{value:.0f}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
