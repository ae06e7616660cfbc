"""CPU benchmark of the PLSH CPU path against exact and windowed ALiBi peers (SPEC section 7).

Run from the repository root, e.g.::

    python benchmarks/cpu_bench.py --n 1024 4096 16384 --s 4 16 64 --threads 2

Every method runs in this one process, side by side, on the same inputs (batch 1, 4 heads
with the standard slopes, sigma 4/16/64/256, head_dim 64, float32, causal). The peers and
the float64 exact reference come from :mod:`plsh_fast.peers`:

* ``plsh``: :func:`plsh_fast.plsh_attention` (the CPU path) with a fixed seeded partition;
* ``sdpa_dense``: ``scaled_dot_product_attention`` with a dense float32 ALiBi bias
  ``(1, H, n, n)`` (causal ``-inf`` folded in); the time excludes building the bias, the
  memory includes it;
* ``flex_exact``: compiled FlexAttention with an ALiBi ``score_mod`` and a causal block mask;
* ``flex_window_width``: the same with a per-head sliding window of the width our path
  attends to (mean over queries of the number of keys with a nonzero count, per head);
* ``flex_window_error``: the same with the per-head window ``c * sigma_h`` for the smallest
  ``c`` of a grid whose output error is at most ours (same error as ours);
* ``reduction``: the paper's reduction: ``s`` block-diagonal passes (one per sample, each
  our CPU tile kernel with a one-sample partition, so each pass touches only its blocks)
  merged by their LSE. Compiled FlexAttention on the CPU has no ``return_lse``, so it
  cannot provide the per-sample denominators that the merge needs.

Reported per method: median wall time over ``--repeats`` calls after one warm-up call,
peak memory, and the output error against float64 exact ALiBi attention (computed in
query chunks): max absolute error and relative Frobenius error
``||out - exact||_F / ||exact||_F``. Forward+backward time is measured for ``plsh`` and
for ``sdpa_dense`` up to ``--sdpa-backward-max`` (its backward keeps several ``n x n``
float32 tensors); compiled FlexAttention has no backward on the CPU.

Peak memory: tracemalloc does not see torch's allocations, so each (method, n, s) runs once
more in a fresh subprocess that builds the inputs, warms the method up, resets the
kernel's peak-RSS counter (``echo 5 > /proc/self/clear_refs``) and reports
``VmHWM - VmRSS`` over one call: the extra resident memory of one call (with
``MALLOC_MMAP_THRESHOLD_=65536`` so that freed buffers leave the resident set), the shared inputs
excluded, what the method builds for the call included (the dense bias of
``sdpa_dense``; not the block mask of FlexAttention, which is built once, before the
reset, and reused across calls); one warm-up call (compilation, thread pools, library
initialisation) runs before the reset. ``--memory none`` skips this.

Results go to ``benchmarks/results/cpu_<date>_<host>_n<sizes>_t<threads>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from plsh_fast import cpu as plsh_cpu  # noqa: E402
from plsh_fast import peers, plsh_attention  # noqa: E402
from plsh_fast.partition import partition_tensors  # noqa: E402
from plsh_ref.alibi import alibi_slopes  # noqa: E402
from plsh_ref.partition import PartitionSample, draw_partition  # noqa: E402

HEADS, HEAD_DIM = 4, 64
METHODS = (
    "plsh",
    "sdpa_dense",
    "flex_exact",
    "flex_window_width",
    "flex_window_error",
    "reduction",
)
WINDOW_GRID = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0)


# ----------------------------------------------------------------------------- inputs


def make_inputs(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, HEADS, n, HEAD_DIM, generator=g) for _ in range(3))
    return q, k, v, alibi_slopes(HEADS)


def partition_for(s: int, seed: int = 1) -> PartitionSample:
    return draw_partition(1.0 / alibi_slopes(HEADS), s, seed=seed)


def exact_alibi(q, k, v, slopes, chunk: int = 512) -> torch.Tensor:
    """Causal exact ALiBi attention in float64, ``chunk`` query rows at a time."""
    return peers.alibi_attention(q, k, v, slopes=slopes, chunk_size=chunk)


def errors(out: torch.Tensor, exact: torch.Tensor) -> dict:
    diff = out.double() - exact
    return {
        "max_abs_error": diff.abs().max().item(),
        "rel_fro_error": (diff.norm() / exact.norm()).item(),
    }


# ----------------------------------------------------------------------------- methods


def dense_alibi_bias(n: int, slopes) -> torch.Tensor:
    """float32 causal ALiBi bias ``(1, H, n, n)`` (:func:`plsh_fast.peers.alibi_bias`)."""
    return peers.alibi_bias(slopes, n, n, causal=True, dtype=torch.float32)[None]


# One score_mod / mask_mod for all calls, reading fixed tensors whose contents change, so
# that the compiled kernel is not recompiled for every window (guards see the same objects).
_SLOPES = torch.tensor(alibi_slopes(HEADS), dtype=torch.float32)
_WINDOW = torch.zeros(HEADS, dtype=torch.int64)
_ALIBI_SCORE = peers.alibi_score_mod(_SLOPES)
_CAUSAL = peers.causal_mask_mod()
_CAUSAL_WINDOW = peers.window_mask_mod(_WINDOW, causal=True)


def flex_runner(n: int, slopes, window=None):
    """Compiled FlexAttention exact ALiBi; ``window`` (per head, tokens) adds a sliding window."""
    assert np.array_equal(slopes, _SLOPES.double().numpy())
    f = peers.compiled_flex_attention()
    if window is None:
        block_mask = peers.block_mask(_CAUSAL, n, n)
        return lambda q, k, v: f(q, k, v, score_mod=_ALIBI_SCORE, block_mask=block_mask)
    w = torch.as_tensor(window, dtype=torch.int64)
    _WINDOW.copy_(w)
    block_mask = peers.block_mask(_CAUSAL_WINDOW, n, n, num_heads=HEADS)

    def run_window(q, k, v):
        _WINDOW.copy_(w)
        return f(q, k, v, score_mod=_ALIBI_SCORE, block_mask=block_mask)

    return run_window


def reduction(q, k, v, partition: PartitionSample) -> torch.Tensor:
    """The paper's reduction: one block-diagonal pass per sample, merged by the LSE
    (:func:`plsh_fast.peers.reduction_attention`, each pass our CPU path)."""
    return peers.reduction_attention(q, k, v, partition, causal=True, check_finite=False)


def support_width(partition: PartitionSample, n: int) -> tuple[list[float], list[float]]:
    """Per head: mean keys with a nonzero count per query, and mean tile window (logits/row)."""
    pitch, offset = partition_tensors(partition, "cpu")
    pos = torch.arange(n)
    plan = plsh_cpu._plan(pitch, offset, pos, pos, True, torch.float32)
    support = []
    for h in range(HEADS):
        start, end = plan.ranges(h)
        nonempty = end > start
        lo = torch.where(nonempty, start, n).amin(dim=0)
        hi = torch.where(nonempty, end, 0).amax(dim=0)
        support.append((hi - lo).double().mean().item())
    logits = [0.0] * HEADS
    for chunk in plan.chunks():
        logits[chunk.head] += chunk.bias.numel() / n
    return support, logits


def method_fn(name: str, n: int, s: int, inputs, extra=None):
    """A zero-argument callable running ``name`` on ``inputs`` (forward only)."""
    q, k, v, slopes = inputs
    if name == "plsh":
        partition = partition_for(s)
        return lambda: plsh_attention(q, k, v, partition=partition, check_finite=False)
    if name == "sdpa_dense":
        bias = dense_alibi_bias(n, slopes)
        return lambda: peers.sdpa_alibi_attention(q, k, v, bias=bias)
    if name == "flex_exact":
        run = flex_runner(n, slopes)
        return lambda: run(q, k, v)
    if name in ("flex_window_width", "flex_window_error"):
        run = flex_runner(n, slopes, window=extra)
        return lambda: run(q, k, v)
    if name == "reduction":
        partition = partition_for(s)
        return lambda: reduction(q, k, v, partition)
    raise ValueError(f"name: unknown method {name!r}")


def backward_fn(name: str, n: int, s: int, inputs):
    q, k, v, slopes = inputs
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(5))
    if name == "plsh":
        partition = partition_for(s)

        def run():
            out = plsh_attention(*leaves, partition=partition, check_finite=False)
            out.backward(grad)

        return run
    bias = dense_alibi_bias(n, slopes)

    def run_sdpa():
        out = peers.sdpa_alibi_attention(*leaves, bias=bias)
        out.backward(grad)

    return run_sdpa


def median_time(fn, repeats: int) -> tuple[float, object]:
    result = fn()  # warm-up (compilation, allocator)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


# ----------------------------------------------------------------------------- memory


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure_memory_child(name, n, s, window, backward):
    inputs = make_inputs(n)

    def build():
        if backward:
            return backward_fn(name, n, s, inputs)
        return method_fn(name, n, s, inputs, window)

    reuse = name.startswith("flex")  # the block mask is built once and reused
    fn = build()
    fn()  # warm-up: compilation, thread pools, library initialisation
    if not reuse:
        del fn
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _status_kb("VmRSS")
    if not reuse:
        fn = build()  # what the method builds for a call (e.g. the dense bias) counts
    fn()
    return (_status_kb("VmHWM") - before) / 1024.0


def measure_memory(name, n, s, window, threads, backward=False) -> float | None:
    cmd = [
        sys.executable,
        __file__,
        "--memory-child",
        json.dumps({"name": name, "n": n, "s": s, "window": window, "backward": backward}),
        "--threads",
        str(threads),
    ]
    try:
        # A fixed mmap threshold makes glibc return every large freed block to the OS,
        # so that the resident set tracks live memory and the warm-up call's freed
        # buffers do not hide the second call's peak.
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=REPO, env=env)
        return float(res.stdout.strip().splitlines()[-1])
    except Exception as exc:  # noqa: BLE001 - report and continue the table
        print(f"  memory of {name} n={n} s={s} failed: {exc}", file=sys.stderr)
        return None


# ----------------------------------------------------------------------------- driver


def machine() -> dict:
    cpu_model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu_model = next(
                line.split(":", 1)[1].strip() for line in f if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    return {
        "host": socket.gethostname(),
        "cpu": cpu_model,
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def run(args) -> dict:
    rows = []
    for n in args.n:
        inputs = make_inputs(n)
        q, k, v, slopes = inputs
        t0 = time.perf_counter()
        exact = exact_alibi(q, k, v, slopes)
        print(f"n={n}: exact float64 reference in {time.perf_counter() - t0:.1f} s", flush=True)
        shared = {}  # s-independent peers, measured once per n

        def record(name, s, fn_name=None, window=None, **info):
            if name not in args.methods and name != "plsh":
                return None
            key = (fn_name or name, tuple(window) if window else None)
            if key in shared:
                row = dict(shared[key], s=s, **info)
            else:
                t, out = median_time(method_fn(name, n, s, inputs, window), args.repeats)
                row = {
                    "method": name,
                    "n": n,
                    "s": s,
                    "time_s": t,
                    **errors(out, exact),
                    "window": window,
                    **info,
                }
                if args.memory == "all":
                    row["peak_mb"] = measure_memory(name, n, s, window, args.threads)
                if name in ("sdpa_dense", "flex_exact"):
                    shared[key] = row
            rows.append(row)
            print(
                f"  {name:18s} s={s:3d} {row['time_s']:8.3f} s  err={row['rel_fro_error']:.3e}"
                f"  mem={row.get('peak_mb')}",
                flush=True,
            )
            return row

        for s in args.s:
            ours = record("plsh", s)
            support, logits = support_width(partition_for(s), n)
            ours["support_per_head"] = support
            ours["logits_per_row_per_head"] = logits
            if n <= args.sdpa_max:
                record("sdpa_dense", s)
            record("flex_exact", s)
            record("flex_window_width", s, window=[max(1, math.ceil(w)) for w in support])
            sigma = 1.0 / slopes
            chosen = None
            for c in WINDOW_GRID if "flex_window_error" in args.methods else ():
                window = [max(1, math.ceil(c * sg)) for sg in sigma]
                out = method_fn("flex_window_error", n, s, inputs, window)()
                if errors(out, exact)["rel_fro_error"] <= ours["rel_fro_error"]:
                    chosen = (c, window)
                    break
            if chosen is not None:
                record("flex_window_error", s, window=chosen[1], window_sigmas=chosen[0])
            record("reduction", s)
            if args.backward:
                t, _ = median_time(backward_fn("plsh", n, s, inputs), args.repeats)
                ours["fwd_bwd_time_s"] = t
                if args.memory == "all":
                    ours["fwd_bwd_peak_mb"] = measure_memory(
                        "plsh", n, s, None, args.threads, backward=True
                    )
                if n <= args.sdpa_backward_max and "sdpa_dense" in args.methods:
                    key = ("sdpa_dense_bwd", None)
                    if key not in shared:
                        t, _ = median_time(backward_fn("sdpa_dense", n, s, inputs), args.repeats)
                        shared[key] = {"fwd_bwd_time_s": t}
                        if args.memory == "all":
                            shared[key]["fwd_bwd_peak_mb"] = measure_memory(
                                "sdpa_dense", n, s, None, args.threads, backward=True
                            )
                    sdpa_rows = [
                        r
                        for r in rows
                        if r["method"] == "sdpa_dense" and r["n"] == n and r["s"] == s
                    ]
                    for r in sdpa_rows:
                        r.update(shared[key])
                print(f"  fwd+bwd plsh {ours['fwd_bwd_time_s']:.3f} s", flush=True)
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "args": vars(args),
        "rows": rows,
    }


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"# CPU benchmark, {result['date']}",
        "",
        f"Machine: {m['cpu']} ({m['cores']} cores, {m['threads']} torch threads), "
        f"torch {m['torch']}, Python {m['python']}, host `{m['host']}`.",
        "",
        "Config: batch 1, 4 heads (sigma 4, 16, 64, 256), head_dim 64, float32, causal. "
        "Time: median wall seconds; memory: extra peak RSS of one call (MB); error: "
        "relative Frobenius error against float64 exact ALiBi. Command: "
        f"`python benchmarks/cpu_bench.py {' '.join(result['argv'])}`.",
        "",
        "| n | s | method | time (s) | fwd+bwd (s) | peak MB | fwd+bwd MB | rel. error |"
        " max abs error | window (tokens per head) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        window = r.get("window")
        if r["method"] == "plsh":
            window = (
                "support "
                + ", ".join(f"{w:.0f}" for w in r["support_per_head"])
                + "; tile "
                + ", ".join(f"{w:.0f}" for w in r["logits_per_row_per_head"])
            )
        elif r["method"] == "flex_window_error":
            window = f"{r['window_sigmas']} sigma = {window}"
        lines.append(
            f"| {r['n']} | {r['s']} | {r['method']} | {_fmt(r['time_s'], '.4f')} | "
            f"{_fmt(r.get('fwd_bwd_time_s'), '.4f')} | {_fmt(r.get('peak_mb'), '.0f')} | "
            f"{_fmt(r.get('fwd_bwd_peak_mb'), '.0f')} | {r['rel_fro_error']:.3e} | "
            f"{r['max_abs_error']:.3e} | {window or '-'} |"
        )
    lines += ["", "Speed-ups of `plsh` (time of the peer / time of plsh, forward):", ""]
    by = {}
    for r in result["rows"]:
        by.setdefault((r["n"], r["s"]), {})[r["method"]] = r
    for (n, s), d in sorted(by.items()):
        ours = d["plsh"]["time_s"]
        parts = [f"{name} {d[name]['time_s'] / ours:.1f}x" for name in d if name != "plsh"]
        lines.append(f"- n={n}, s={s}: " + ", ".join(parts))
    return "\n".join(lines) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--s", type=int, nargs="+", default=[4, 16, 64])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--memory", choices=["all", "none"], default="all")
    p.add_argument(
        "--methods",
        nargs="+",
        default=list(METHODS),
        choices=METHODS,
        help="peers to run (plsh always runs)",
    )
    p.add_argument("--backward", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument(
        "--sdpa-max",
        type=int,
        default=16384,
        help="largest n for SDPA with a dense bias (memory ~ 4 H n^2 bytes)",
    )
    p.add_argument("--sdpa-backward-max", type=int, default=4096)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.memory_child:
        spec = json.loads(args.memory_child)
        print(
            measure_memory_child(
                spec["name"], spec["n"], spec["s"], spec["window"], spec["backward"]
            )
        )
        return
    t0 = time.perf_counter()
    result = run(args)
    result["argv"] = argv
    result["total_seconds"] = time.perf_counter() - t0
    from plsh_ref.provenance import run_metadata

    result["provenance"] = run_metadata()  # package version, git commit, machine, time
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = "-".join(str(n) for n in args.n)
    stem = f"cpu_{_dt.date.today().isoformat()}_{socket.gethostname()}_n{sizes}_t{args.threads}"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str))
    (args.out / f"{stem}.md").write_text(markdown(result))
    print(f"wrote {args.out / stem}.json/.md in {result['total_seconds']:.0f} s")


if __name__ == "__main__":
    main()
