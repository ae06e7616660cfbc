"""CPU benchmark of the PLSH CPU path against exact and windowed ALiBi peers (SPEC section 7).

Run from the repository root, e.g.::

    python benchmarks/cpu_bench.py --n 1024 4096 16384 --s 4 16 64 --threads 2

Every method runs in this one process, side by side, on the same inputs (batch 1, 4 heads
with the standard slopes, sigma 4/16/64/256, head_dim 64, float32, causal). The peers and
the float64 exact reference come from :mod:`plsh_fast.peers`:

* ``plsh``: :func:`plsh_fast.plsh_attention` (the tiled CPU path, ``backend="cpu"``: below ``plsh_fast.dense.DENSE_CROSSOVER`` the default would run the dense route) with a fixed seeded partition,
  as a model layer calls it every step: the plan (tile groups and count biases) is kept
  across calls (``plsh_fast.cpu.PLAN_CACHE_BYTES``, step 8, ``plsh_fast/cpu/_plan_cache.py``),
  like the block mask of the FlexAttention peers, which is built once and reused; ``kept
  plan MB`` is what it keeps (0 where the plan exceeds the budget and every call plans);
* ``plsh_cold``: the same with no plan kept (``plsh_fast.cpu.no_kept_plans``): every call
  plans and builds its biases, as a call with new positions or a new partition does;
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
  merged by their LSE; run with no plan kept (its ``s`` plans would evict ``plsh``'s from
  the shared budget). Compiled FlexAttention on the CPU has no ``return_lse``, so it
  cannot provide the per-sample denominators that the merge needs.

Timing: for every (n, s) all methods get one warm-up call, then ``--repeats`` rounds in
which each method runs once, taking turns; reported is the median per method. On a shared
machine the load changes from second to second; taking turns exposes every method to the
same load, so ratios within one (n, s) are robust, absolute times are not. The
s-independent peers (``sdpa_dense``, ``flex_exact``) run in the first s round only.

Floor (SPEC section 7; issue 15): in the same rounds, ``gemm_tiles`` runs the GEMMs of our
tile groups alone (same shapes, same worker threads, no bias, softmax or gathers) and gives
the machine's GFLOP/s on the shapes the method uses; the floor is the window work
``4 d n sum_h support_h`` (``support_h``: mean keys with a nonzero count per query) at that
rate. Every method's time is reported as ``x floor``; forward+backward against 3.5 floors
(7 GEMMs of the window instead of 2). A ``2048^3`` sgemm with torch's threads
(``gemm_large``) is reported beside it. ``kernel_tiles`` runs the tile kernel alone
(:func:`plsh_fast.cpu.tiles_forward`, torch's fused flash-attention operator) on our tile
groups, prebuilt: ``plsh`` over it is what planning, bias building, gathers and scatters
add, and it over the floor is what the kernel itself costs beyond the GEMMs.

Reported per method: median wall time, ``x floor``, peak memory, and the output error
against float64 exact ALiBi attention (computed in query chunks; on ``--error-rows``
evenly spaced rows when n is larger): max absolute error and relative Frobenius error
``||out - exact||_F / ||exact||_F``. Forward+backward time is measured for ``plsh`` and
for ``sdpa_dense`` up to ``--sdpa-backward-max`` (its backward keeps several ``n x n``
float32 tensors); compiled FlexAttention has no backward on the CPU. ``flex_exact`` runs
up to ``--flex-exact-max``, the reduction up to ``n * s <= --reduction-max``. Windowed
block masks are built from block indices (:func:`window_block_mask`).

Peak memory: tracemalloc does not see torch's allocations, so each (method, n, s) runs once
more in a fresh subprocess that builds the inputs, warms the method up, resets the
kernel's peak-RSS counter (``echo 5 > /proc/self/clear_refs``) and reports
``VmHWM - VmRSS`` over one call: the extra resident memory of one call (with
``MALLOC_MMAP_THRESHOLD_=65536`` so that freed buffers leave the resident set), the shared inputs
excluded, what the method builds for the call included (the dense bias of
``sdpa_dense``; not the block mask of FlexAttention, which is built once, before the
reset, and reused across calls); one warm-up call (compilation, thread pools, library
initialisation) runs before the reset. ``--memory plsh`` measures ours only, ``--memory none``
skips this.

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
from plsh_fast._partition import partition_tensors  # noqa: E402
from plsh_ref.alibi import alibi_slopes  # noqa: E402
from plsh_ref.partition import PartitionSample, draw_partition  # noqa: E402

HEADS, HEAD_DIM = 4, 64
METHODS = (
    "plsh",
    "plsh_cold",
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


def error_rows(n: int, limit: int):
    """Query rows on which errors are measured: all (``None``) up to ``limit``, else ``limit``
    evenly spaced rows (the float64 reference costs ``O(n^2)`` per row set)."""
    if n <= limit:
        return None
    return torch.linspace(0, n - 1, limit).round().long().unique()


def exact_alibi(q, k, v, slopes, chunk: int = 512, rows=None) -> torch.Tensor:
    """Causal exact ALiBi attention in float64, ``chunk`` query rows at a time (on ``rows``)."""
    if rows is None:
        return peers.chunked_alibi_attention(q, k, v, slopes=slopes, chunk_size=chunk)
    return peers.chunked_alibi_attention(
        q[:, :, rows], k, v, slopes=slopes, chunk_size=chunk, query_positions=rows
    )


def errors(out: torch.Tensor, exact: torch.Tensor, rows=None) -> dict:
    out = out if rows is None else out[:, :, rows]
    diff = out.double() - exact
    return {
        "max_abs_error": diff.abs().max().item(),
        "rel_fro_error": (diff.norm() / exact.norm()).item(),
    }


# ----------------------------------------------------------------------------- methods


def dense_alibi_bias(n: int, slopes) -> torch.Tensor:
    """float32 causal ALiBi bias ``(1, H, n, n)`` (:func:`plsh_fast.peers.sdpa_alibi_bias`)."""
    return peers.sdpa_alibi_bias(slopes, n, n, causal=True, dtype=torch.float32)[None]


# One score_mod / mask_mod for all calls, reading fixed tensors whose contents change, so
# that the compiled kernel is not recompiled for every window (guards see the same objects).
_SLOPES = torch.tensor(alibi_slopes(HEADS), dtype=torch.float32)
_WINDOW = torch.zeros(HEADS, dtype=torch.int64)
_ALIBI_SCORE = peers.alibi_score_mod(_SLOPES)
_CAUSAL = peers.causal_mask_mod()
_CAUSAL_WINDOW = peers.window_mask_mod(_WINDOW, causal=True)


def window_block_mask(n: int, window, block: int = 128):
    """Causal per-head sliding-window ``BlockMask`` (``0 <= i - j < window[h]``) built from
    block indices in ``O(H (n / block)^2)``; :func:`plsh_fast.peers.block_mask` evaluates all
    ``H n^2`` pairs (17e9 at n = 64k). Key blocks wholly inside the window are *full* (no
    ``mask_mod`` call), the others that meet it *partial*, as ``create_block_mask`` makes them.
    """
    from torch.nn.attention.flex_attention import BlockMask  # noqa: PLC0415

    nb = (n + block - 1) // block
    kv_num = torch.zeros(1, HEADS, nb, dtype=torch.int32)
    kv_idx = torch.zeros(1, HEADS, nb, nb, dtype=torch.int32)
    full_num = torch.zeros(1, HEADS, nb, dtype=torch.int32)
    full_idx = torch.zeros(1, HEADS, nb, nb, dtype=torch.int32)
    for h, w in enumerate(int(x) for x in window):
        for qb in range(nb):
            lo_q, hi_q = qb * block, min(qb * block + block, n) - 1  # query rows of the block
            first = max(0, (lo_q - w + 1) // block)  # a key block meets the window
            partial, full = [], []
            for kb in range(first, qb + 1):
                lo_k, hi_k = kb * block, min(kb * block + block, n) - 1
                if lo_q - hi_k >= 0 and hi_q - lo_k < w:
                    full.append(kb)
                elif hi_q - lo_k >= 0 and lo_q - hi_k < w:
                    partial.append(kb)
            kv_num[0, h, qb], full_num[0, h, qb] = len(partial), len(full)
            kv_idx[0, h, qb, : len(partial)] = torch.tensor(partial, dtype=torch.int32)
            full_idx[0, h, qb, : len(full)] = torch.tensor(full, dtype=torch.int32)
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=block,
        mask_mod=_CAUSAL_WINDOW,
        seq_lengths=(n, n),
    )


def flex_runner(n: int, slopes, window=None):
    """Compiled FlexAttention exact ALiBi; ``window`` (per head, tokens) adds a sliding window."""
    assert np.array_equal(slopes, _SLOPES.double().numpy())
    f = peers.compiled_flex_attention()
    if window is None:
        block_mask = peers.block_mask(_CAUSAL, n, n)
        return lambda q, k, v: f(q, k, v, score_mod=_ALIBI_SCORE, block_mask=block_mask)
    w = torch.as_tensor(window, dtype=torch.int64)
    _WINDOW.copy_(w)
    block_mask = window_block_mask(n, w)

    def run_window(q, k, v):
        _WINDOW.copy_(w)
        return f(q, k, v, score_mod=_ALIBI_SCORE, block_mask=block_mask)

    return run_window


def reduction(q, k, v, partition: PartitionSample) -> torch.Tensor:
    """The paper's reduction: one block-diagonal pass per sample, merged by the LSE
    (:func:`plsh_fast.peers.reduction_attention`, each pass our CPU path)."""
    return peers.reduction_attention(q, k, v, partition=partition, causal=True, check_finite=False)


def support_width(partition: PartitionSample, n: int) -> tuple[list[float], list[float]]:
    """Per head: mean keys with a nonzero count per query, and mean tile window (logits/row)."""
    pitch, offset = partition_tensors(partition, "cpu")
    pos = torch.arange(n)
    plan = plsh_cpu.plan_cpu(pitch, offset, pos, pos, True, torch.float32)
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


# ----------------------------------------------------------------------------- floor


def tile_gemm_probe(partition: PartitionSample, n: int, threads: int):
    """The GEMMs of our forward alone: ``(callable, flops)``.

    For every tile group of the plan (``G`` tiles of ``T`` rows, window ``W``) one batched
    ``(G, T, d) x (G, d, W)`` and one ``(G, T, W) x (G, W, d)`` product on random float32
    data, dealt to ``threads`` workers of the CPU path's pool exactly like the tiles (each
    worker with one OpenMP thread). No bias, no softmax, no gathers: the measured rate is
    what this machine gives on the shapes the method uses.
    """
    pitch, offset = partition_tensors(partition, "cpu")
    pos = torch.arange(n)
    plan = plsh_cpu.plan_cpu(pitch, offset, pos, pos, True, torch.float32)
    shapes = [
        (spec[3].numel(), spec[1], spec[2]) for h in range(HEADS) for spec in plan.head_specs(h)
    ]
    shapes.sort(key=lambda gtw: -gtw[0] * gtw[1] * gtw[2])
    g = torch.Generator().manual_seed(3)
    big = max(gg * max(tt, ww) * max(HEAD_DIM, tt) for gg, tt, ww in shapes)
    buf = [torch.randn(big, generator=g) for _ in range(3)]
    flops = sum(4 * HEAD_DIM * gg * tt * ww for gg, tt, ww in shapes)

    def one(shape):
        gg, tt, ww = shape
        a = buf[0][: gg * tt * HEAD_DIM].view(gg, tt, HEAD_DIM)
        b = buf[1][: gg * ww * HEAD_DIM].view(gg, ww, HEAD_DIM)
        p = buf[2][: gg * tt * ww].view(gg, tt, ww)
        torch.matmul(a, b.transpose(-1, -2))
        torch.matmul(p, b)

    pool = plsh_cpu.executor(threads) if threads > 1 else None

    def run():
        if pool is None:
            for shape in shapes:
                one(shape)
            return None

        def deal(w):
            with torch.no_grad():
                for shape in shapes[w::threads]:
                    one(shape)

        for job in [pool.submit(deal, w) for w in range(threads)]:
            job.result()
        return None

    return run, flops


def tile_kernel_probe(partition: PartitionSample, n: int, threads: int, inputs):
    """The tile kernel of our forward alone, on our own tile groups: a zero-argument callable.

    Every tile group of the plan is built once here (gathered query rows and key/value
    windows, the count bias), then the callable runs only
    :func:`plsh_fast.cpu.tiles_forward` (torch's fused CPU flash-attention operator) on
    them, dealt to ``threads`` workers of the CPU path's pool like the forward deals
    them. Planning, bias building, gathers and scatters are excluded: ``plsh`` minus this
    is what the rest of the path costs, and this over the floor is what the kernel alone
    costs (the bound on what the rest of the path can gain). Holds every group's bias at
    once (``4 * sum_groups G T W`` bytes).
    """
    q, k, v, _ = inputs
    pitch, offset = partition_tensors(partition, "cpu")
    pos = torch.arange(n)
    plan = plsh_cpu.plan_cpu(pitch, offset, pos, pos, True, torch.float32)
    work = []
    for h in range(HEADS):
        for spec in plan.head_specs(h):
            chunk = plan.build(spec)
            work.append(
                (
                    chunk.take_rows(q[:, h].contiguous()),
                    chunk.take_keys(k[:, h].contiguous()),
                    chunk.take_keys(v[:, h].contiguous()),
                    chunk.bias[None],
                )
            )
    work.sort(key=lambda t: -t[3].numel())
    scale = HEAD_DIM**-0.5
    pool = plsh_cpu.executor(threads) if threads > 1 else None

    def deal(w):
        with torch.no_grad():
            for item in work[w::threads]:
                plsh_cpu.tiles_forward(*item, scale)

    def run():
        if pool is None:
            deal(0)
            return None
        for job in [pool.submit(deal, w) for w in range(threads)]:
            job.result()
        return None

    return run


def large_gemm_probe(size: int = 2048):
    """One ``size^3`` float32 GEMM with torch's intra-op threads: ``(callable, flops)``."""
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(size, size, generator=g), torch.randn(size, size, generator=g)
    return (lambda: torch.mm(a, b)), 2 * size**3


def interleaved_times(fns: dict, repeats: int) -> tuple[dict, dict]:
    """Median wall time of every callable, measured taking turns.

    One warm-up call each (compilation, allocator, pools; its result is returned), then
    ``repeats`` rounds in which every method runs once, in the same order: load from other
    processes affects all methods alike, so the ratios are robust even when absolute times
    drift. Returns ``(median seconds, warm-up results)``.
    """
    results = {name: fn() for name, fn in fns.items()}
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}, results


def cold(fn):
    """``fn`` run inside :func:`plsh_fast.cpu.no_kept_plans`: every call plans and builds
    its count biases afresh, and the plans kept for the other methods stay (setting
    ``PLAN_CACHE_BYTES = 0`` would drop them at each call)."""

    def run():
        with plsh_cpu.no_kept_plans():
            return fn()

    return run


def method_fn(name: str, n: int, s: int, inputs, extra=None):
    """A zero-argument callable running ``name`` on ``inputs`` (forward only)."""
    q, k, v, slopes = inputs
    if name == "plsh":
        partition = partition_for(s)
        return lambda: plsh_attention(
            q, k, v, partition=partition, backend="cpu", check_finite=False
        )
    if name == "plsh_cold":
        partition = partition_for(s)
        return cold(
            lambda: plsh_attention(q, k, v, partition=partition, backend="cpu", check_finite=False)
        )
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
        # Cold: its s one-sample plans, kept, would evict the plan of `plsh` (the budget
        # is shared) and make every `plsh` call of the round plan afresh.
        return cold(lambda: reduction(q, k, v, partition))
    raise ValueError(f"name: unknown method {name!r}")


def backward_fn(name: str, n: int, s: int, inputs):
    q, k, v, slopes = inputs
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(5))
    if name in ("plsh", "plsh_cold"):
        partition = partition_for(s)

        def run():
            out = plsh_attention(*leaves, partition=partition, backend="cpu", check_finite=False)
            out.backward(grad)

        return run if name == "plsh" else cold(run)
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
    if name == "plsh":
        fn()  # a plan is kept from the second call on: the measured call reuses it
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
    rows, floors = [], []
    threads = torch.get_num_threads()
    for n in args.n:
        inputs = make_inputs(n)
        q, k, v, slopes = inputs
        sub = error_rows(n, args.error_rows)
        t0 = time.perf_counter()
        exact = exact_alibi(q, k, v, slopes, rows=sub)
        print(f"n={n}: exact float64 reference in {time.perf_counter() - t0:.1f} s", flush=True)
        shared = {}  # s-independent peers: measured in the first s round, copied to the others
        for si, s in enumerate(args.s):
            partition = partition_for(s)
            support, logits = support_width(partition, n)
            fns, info = {}, {}
            fns["gemm_tiles"], tile_flops = tile_gemm_probe(partition, n, threads)
            fns["gemm_large"], large_flops = large_gemm_probe()
            fns["kernel_tiles"] = tile_kernel_probe(partition, n, threads, inputs)
            fns["plsh"] = method_fn("plsh", n, s, inputs)
            plsh_cpu.clear_plan_cache()
            fns["plsh"]()  # a plan is kept from the second call with its inputs on
            ours_error = errors(fns["plsh"](), exact, sub)
            info["plsh"] = {"kept_plan_mb": plsh_cpu.kept_plan_bytes() / 2**20}
            if args.backward:
                fns["plsh_fwd_bwd"] = backward_fn("plsh", n, s, inputs)
            if "plsh_cold" in args.methods:
                fns["plsh_cold"] = method_fn("plsh_cold", n, s, inputs)
                if args.backward:
                    fns["plsh_cold_fwd_bwd"] = backward_fn("plsh_cold", n, s, inputs)
            if si == 0 and "sdpa_dense" in args.methods and n <= args.sdpa_max:
                fns["sdpa_dense"] = method_fn("sdpa_dense", n, s, inputs)
                if args.backward and n <= args.sdpa_backward_max:
                    fns["sdpa_dense_fwd_bwd"] = backward_fn("sdpa_dense", n, s, inputs)
            if si == 0 and "flex_exact" in args.methods and n <= args.flex_exact_max:
                fns["flex_exact"] = method_fn("flex_exact", n, s, inputs)
            if "flex_window_width" in args.methods:
                width = [max(1, math.ceil(w)) for w in support]
                fns["flex_window_width"] = method_fn("flex_window_width", n, s, inputs, width)
                info["flex_window_width"] = {"window": width}
            if "flex_window_error" in args.methods:
                sigma = 1.0 / slopes
                for c in WINDOW_GRID:
                    window = [max(1, math.ceil(c * sg)) for sg in sigma]
                    fn = method_fn("flex_window_error", n, s, inputs, window)
                    if errors(fn(), exact, sub)["rel_fro_error"] <= ours_error["rel_fro_error"]:
                        fns["flex_window_error"] = fn
                        info["flex_window_error"] = {"window": window, "window_sigmas": c}
                        break
            if "reduction" in args.methods and n * s <= args.reduction_max:
                fns["reduction"] = method_fn("reduction", n, s, inputs)
            times, outs = interleaved_times(fns, args.repeats)
            window_flops = 4 * HEAD_DIM * n * sum(support)
            rate = tile_flops / times["gemm_tiles"]
            floor = window_flops / rate
            floors.append(
                {
                    "n": n,
                    "s": s,
                    "window_gflop": window_flops / 1e9,
                    "tile_gflop": tile_flops / 1e9,
                    "tile_gemm_gflops": rate / 1e9,
                    "large_gemm_gflops": large_flops / times["gemm_large"] / 1e9,
                    "floor_s": floor,
                    "kernel_tiles_s": times["kernel_tiles"],
                    "kernel_tiles_x_floor": times["kernel_tiles"] / floor,
                    "widest_head_support": max(support),
                }
            )
            print(
                f" n={n} s={s}: floor {floor:.4f} s (window {window_flops / 1e9:.2f} GFLOP at"
                f" {rate / 1e9:.1f} GFLOP/s on the tile GEMMs; 2048^3 sgemm"
                f" {floors[-1]['large_gemm_gflops']:.1f} GFLOP/s); tile kernel alone"
                f" {times['kernel_tiles']:.4f} s ({times['kernel_tiles'] / floor:.2f}x floor)",
                flush=True,
            )
            for name in [m for m in METHODS if m in fns]:
                row = {
                    "method": name,
                    "n": n,
                    "s": s,
                    "time_s": times[name],
                    "x_floor": times[name] / floor,
                    **errors(outs[name], exact, sub),
                    "window": info.get(name, {}).get("window"),
                    **{k_: v_ for k_, v_ in info.get(name, {}).items() if k_ != "window"},
                }
                if name == "plsh":
                    row["support_per_head"] = support
                    row["logits_per_row_per_head"] = logits
                if name + "_fwd_bwd" in times:
                    row["fwd_bwd_time_s"] = times[name + "_fwd_bwd"]
                    row["fwd_bwd_x_floor"] = times[name + "_fwd_bwd"] / (3.5 * floor)
                if args.memory == "all" or (args.memory == "plsh" and name.startswith("plsh")):
                    row["peak_mb"] = measure_memory(name, n, s, row["window"], threads)
                    if "fwd_bwd_time_s" in row:
                        row["fwd_bwd_peak_mb"] = measure_memory(
                            name, n, s, None, threads, backward=True
                        )
                if name in ("sdpa_dense", "flex_exact"):
                    shared[name] = row
                rows.append(row)
            for row in shared.values():
                if row["s"] != s:
                    rows.append(dict(row, s=s, measured_in_round_s=row["s"]))
            for row in [r for r in rows if r["n"] == n and r["s"] == s]:
                print(
                    f"  {row['method']:18s} s={s:3d} {row['time_s']:8.3f} s"
                    f" ({row['x_floor']:.2f}x floor)  fwd+bwd={row.get('fwd_bwd_time_s')}"
                    f"  err={row['rel_fro_error']:.3e}  mem={row.get('peak_mb')}",
                    flush=True,
                )
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_average": os.getloadavg(),
        "args": vars(args),
        "floors": floors,
        "rows": rows,
    }


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def markdown(result: dict) -> str:
    m = result["machine"]
    load = result.get("load_average")
    lines = [
        f"# CPU benchmark, {result['date']}",
        "",
        f"Machine: {m['cpu']} ({m['cores']} cores, {m['threads']} torch threads), "
        f"torch {m['torch']}, Python {m['python']}, host `{m['host']}`"
        + (
            f"; load average at the end {load[0]:.1f} (shared with other processes)."
            if load
            else "."
        ),
        "",
        "Config: batch 1, 4 heads (sigma 4, 16, 64, 256), head_dim 64, float32, causal. "
        "Methods take turns (one call each per round, median over rounds), so ratios within "
        "one (n, s) are robust to the machine's load; absolute times are not. "
        "Time: median wall seconds; memory: extra peak RSS of one call (MB; for `plsh` the"
        " kept plan, `kept plan MB`, was built by the warm-up call and is not in it); error: "
        "relative Frobenius error against float64 exact ALiBi"
        f" ({'all rows' if result['args']['error_rows'] >= max(result['args']['n']) else 'on ' + str(result['args']['error_rows']) + ' evenly spaced rows where n is larger'}). "
        "Command: "
        f"`python benchmarks/cpu_bench.py {' '.join(result['argv'])}`.",
        "",
        "Floor: the window FLOPs `4 d n sum_h support_h` (support: mean keys with a nonzero"
        " count per query) divided by the GFLOP/s this machine reached, in the same round, on"
        " the GEMMs of our tile groups alone (same shapes, same workers, no bias or softmax)."
        " `x floor` = time / floor; forward+backward against 3.5x the floor (7 GEMMs instead"
        " of 2).",
        " Kernel alone: torch's fused flash-attention operator on our own tile groups,"
        " prebuilt (no planning, bias building, gathers or scatters), same workers: the"
        " part of `plsh` that the rest of the path cannot remove.",
        "",
        "| n | s | window GFLOP | tile GFLOP | tile GEMM GFLOP/s | 2048^3 sgemm GFLOP/s |"
        " floor (s) | kernel alone (s) | kernel alone x floor | plsh / kernel alone |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    ours = {(r["n"], r["s"]): r["time_s"] for r in result["rows"] if r["method"] == "plsh"}
    for f in result["floors"]:
        kernel = f.get("kernel_tiles_s")
        plsh = ours.get((f["n"], f["s"]))
        lines.append(
            f"| {f['n']} | {f['s']} | {f['window_gflop']:.2f} | {f['tile_gflop']:.2f} | "
            f"{f['tile_gemm_gflops']:.1f} | {f['large_gemm_gflops']:.1f} | {f['floor_s']:.4f} |"
            f" {_fmt(kernel, '.4f')} | {_fmt(f.get('kernel_tiles_x_floor'), '.2f')} |"
            f" {_fmt(None if kernel is None or plsh is None else plsh / kernel, '.2f')} |"
        )
    lines += [
        "",
        "| n | s | method | time (s) | x floor | fwd+bwd (s) | fwd+bwd / fwd | peak MB |"
        " fwd+bwd MB | kept plan MB | rel. error | max abs error | window (tokens per head) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
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
        if "measured_in_round_s" in r:
            window = f"(measured in the s = {r['measured_in_round_s']} round) " + (window or "")
        fb = r.get("fwd_bwd_time_s")
        lines.append(
            f"| {r['n']} | {r['s']} | {r['method']} | {_fmt(r['time_s'], '.4f')} | "
            f"{_fmt(r.get('x_floor'), '.2f')} | {_fmt(fb, '.4f')} | "
            f"{_fmt(None if fb is None else fb / r['time_s'], '.2f')} | "
            f"{_fmt(r.get('peak_mb'), '.0f')} | "
            f"{_fmt(r.get('fwd_bwd_peak_mb'), '.0f')} | {_fmt(r.get('kept_plan_mb'), '.0f')} | "
            f"{r['rel_fro_error']:.3e} | "
            f"{r['max_abs_error']:.3e} | {window or '-'} |"
        )
    lines += ["", "Speed-ups of `plsh` (time of the peer / time of plsh, forward):", ""]
    by = {}
    for r in result["rows"]:
        by.setdefault((r["n"], r["s"]), {})[r["method"]] = r
    for (n, s), d in sorted(by.items()):
        ours = d["plsh"]["time_s"]
        parts = [f"{name} {d[name]['time_s'] / ours:.2f}x" for name in d if name != "plsh"]
        lines.append(f"- n={n}, s={s}: " + ", ".join(parts))
    lines += [
        "",
        "Growth from the smallest to the largest s (plsh forward time; widest head's support):",
        "",
    ]
    floors = {(f["n"], f["s"]): f for f in result["floors"]}
    for n in sorted({n for n, _ in by}):
        ss = sorted(s for nn, s in by if nn == n)
        if len(ss) > 1:
            a, b = by[(n, ss[0])]["plsh"], by[(n, ss[-1])]["plsh"]
            sa, sb = floors[(n, ss[0])], floors[(n, ss[-1])]
            lines.append(
                f"- n={n}, s={ss[0]} -> {ss[-1]}: time {b['time_s'] / a['time_s']:.2f}x"
                f" (not across rounds robust), support"
                f" {sb['widest_head_support'] / sa['widest_head_support']:.2f}x"
            )
    return "\n".join(lines) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--s", type=int, nargs="+", default=[4, 16, 64])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--memory",
        choices=["all", "plsh", "none"],
        default="all",
        help="peak memory of every method, of plsh and plsh_cold only, or none (one subprocess each)",
    )
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
    p.add_argument(
        "--flex-exact-max", type=int, default=16384, help="largest n for compiled Flex exact"
    )
    p.add_argument(
        "--reduction-max",
        type=int,
        default=1 << 20,
        help="largest n * s for the reduction (s passes of the CPU path per call)",
    )
    p.add_argument(
        "--error-rows",
        type=int,
        default=16384,
        help="errors on this many evenly spaced query rows when n is larger (float64 reference)",
    )
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
