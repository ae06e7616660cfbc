"""GPU check of the Triton path: compiled-kernel correctness, then the GPU benchmark table.

One command (``benchmarks/gpu_check.sh``) meant to finish in under 8 minutes on one H200
with the torch/triton already installed there (PyTorch 2.11, Triton 3.6; nothing can be
installed). Sections, each config guarded by try/except (the error is recorded, the run
goes on) and by a global time budget (configs that would start too late are recorded as
skipped):

1. ``bins``: the Triton float64 bins equal :func:`plsh_ref.partition.bins` bit for bit;
2. ``correctness``: forward (output and LSE) against :func:`plsh_ref.attention.plsh_attention`
   and backward against dense float64 autograd, float16/bfloat16/float32, under the
   tolerance rule of SPEC section 6 (yardstick: plain torch attention with the dense
   ``log M~`` bias in the same dtype, on the GPU);
3. ``large``: tensors of more than 2**31 elements (int64 offsets), checked on the rows
   and keys at the far end of the second batch entry;
4. ``bench``: SPEC section 7 GPU configuration (16 heads, standard slopes, head_dim 128,
   bfloat16, causal, batch 1), n in {4k, 16k, 64k, 256k}, s in {4, 16, 64}: PLSH Triton
   forward and forward+backward against compiled FlexAttention exact ALiBi (``score_mod``,
   causal block mask) and the paper's reduction (s block-diagonal FlexAttention passes
   merged by LSE); median time, peak memory, and output error against float64 exact ALiBi
   on sampled rows. The headline configuration (n = 64k, s = 16) runs first.

Results: ``results.json`` and ``results.md`` in ``--out``. ``--dry-run`` exercises the
argument parsing, the planning of configurations and the table writing on a CPU-only
machine (placeholder numbers, marked as such).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

STUBBED = []


def ensure_importable():
    """Import plsh_ref; if scipy or mpmath is missing (the GPU machine cannot install
    anything), serve inert stand-ins for them: the parts of plsh_ref used here (alibi,
    partition, attention, testing) never call them. Records what was stubbed."""
    import importlib.abc
    import importlib.machinery
    import types

    try:
        import plsh_ref  # noqa: F401

        return
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in ("scipy", "mpmath"):
            raise

    class _Stub(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)

            def unavailable(*args, **kwargs):
                raise RuntimeError(f"{self.__name__}.{name}: not installed on this machine")

            return unavailable

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("scipy", "mpmath"):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            STUBBED.append(spec.name)
            module = _Stub(spec.name)
            module.__path__ = []
            return module

        def exec_module(self, module):
            pass

    for name in [m for m in sys.modules if m.startswith("plsh_ref")]:
        del sys.modules[name]
    sys.meta_path.append(_Finder())
    import plsh_ref  # noqa: F401,F811


SEQ_LENS = (4096, 16384, 65536, 262144)
SAMPLES = (4, 16, 64)
HEADLINE = (65536, 16)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--out",
        default=os.environ.get("OUT", "benchmarks/results/gpu"),
        help="output folder (default $OUT)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=420.0,
        help="seconds for the whole run; configs that cannot start in time are skipped",
    )
    p.add_argument("--seq-lens", type=int, nargs="+", default=list(SEQ_LENS))
    p.add_argument("--samples", type=int, nargs="+", default=list(SAMPLES))
    p.add_argument("--num-heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=["bins", "correctness", "large", "bench", "backward", "reduction", "variants"],
        help="sections or peers to skip",
    )
    p.add_argument(
        "--work-model",
        action="store_true",
        help="CPU only: count tile steps and sample classes of the plan, then exit",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="no GPU: plan the configurations and write placeholder tables",
    )
    return p.parse_args(argv)


def bench_configs(seq_lens, samples):
    """Benchmark (n, s) pairs, the headline first, then by increasing cost."""
    pairs = [(n, s) for n in sorted(seq_lens) for s in sorted(samples)]
    if HEADLINE in pairs:
        pairs.remove(HEADLINE)
        pairs.insert(0, HEADLINE)
    return pairs


class Budget:
    """Wall-clock guard: ``ok(estimate)`` says whether a step may start."""

    def __init__(self, seconds: float):
        self.start = time.monotonic()
        self.seconds = seconds

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def ok(self, estimate: float = 0.0) -> bool:
        return self.left() > estimate


def guarded(records, section, name, budget, estimate, fn):
    """Run ``fn()`` -> dict, record it (or the error, or a budget skip)."""
    rec = {"section": section, "name": name}
    if not budget.ok(estimate):
        rec.update(status="skipped", reason=f"time budget ({budget.left():.0f} s left)")
        records.append(rec)
        print(f"[{section}] {name}: skipped (budget)", flush=True)
        return rec
    t0 = time.monotonic()
    try:
        rec.update(fn())
        rec.setdefault("status", "ok")
    except Exception as exc:  # noqa: BLE001 - every failure is recorded, the run goes on
        rec.update(
            status="error",
            error=f"{type(exc).__name__}: {exc}"[:2000],
            traceback=traceback.format_exc()[-4000:],
        )
    rec["seconds"] = round(time.monotonic() - t0, 2)
    records.append(rec)
    brief = {k: v for k, v in rec.items() if k not in ("traceback",)}
    print(f"[{section}] {json.dumps(brief, default=str)[:600]}", flush=True)
    return rec


# --------------------------------------------------------------------------- helpers (GPU)


def _torch():
    import torch

    return torch


def _partition_tensors(partition, device):
    torch = _torch()
    return (
        torch.tensor(np.array(partition.pitch), dtype=torch.float64, device=device),
        torch.tensor(np.array(partition.offset), dtype=torch.float64, device=device),
    )


def _timeit(fn, reps_max=20, target_s=1.0):
    """Median milliseconds of ``fn`` with CUDA events (after one warm-up call)."""
    torch = _torch()
    fn()
    torch.cuda.synchronize()
    times = []
    t_start = time.monotonic()
    while len(times) < reps_max and (len(times) < 3 or time.monotonic() - t_start < target_s):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times)), len(times)


def _peak_mb(fn):
    torch = _torch()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


# --------------------------------------------------------------------------- 1. bins


def check_bins(device):
    torch = _torch()
    from plsh_fast.triton import compute_bins
    from plsh_ref.partition import bins, draw_partition

    rng = np.random.default_rng(0)
    mismatches = 0
    cases = 0
    for trial in range(20):
        sigma = np.exp(rng.uniform(np.log(0.05), np.log(500.0), size=3))
        part = draw_partition(sigma, int(rng.integers(1, 65)), seed=trial)
        base = int(rng.integers(-(2**45), 2**45)) if trial % 2 else 0
        pos = np.sort(base + rng.integers(-5000, 5000, size=4000)).astype(np.int64)
        got = (
            compute_bins(*_partition_tensors(part, device), torch.tensor(pos, device=device))
            .cpu()
            .numpy()
        )
        mismatches += int(np.count_nonzero(got != bins(part, pos)))
        cases += got.size
    if mismatches:
        raise AssertionError(f"{mismatches} of {cases} bins differ from plsh_ref")
    return {"bins_checked": cases, "mismatches": 0}


# --------------------------------------------------------------------------- 2. correctness


def _dense_bias(partition, qpos, kpos, causal):
    from plsh_ref.partition import counts

    c = counts(partition, qpos, kpos, causal=causal)
    with np.errstate(divide="ignore"):
        return np.log(c / partition.num_samples)


def _dense_grads(q, k, v, g, bias, scale, dtype):
    """Autograd of dense softmax(scale q k^T + bias) v in ``dtype`` on q's device."""
    torch = _torch()
    q, k, v = (t.detach().to(dtype).requires_grad_(True) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kk = k.repeat_interleave(group, dim=1)
    vv = v.repeat_interleave(group, dim=1)
    b = torch.as_tensor(bias, device=q.device).to(dtype)[None]
    empty = torch.isneginf(b).all(dim=-1, keepdim=True)
    logits = torch.where(
        empty, torch.zeros((), dtype=dtype, device=q.device), (q @ kk.transpose(-1, -2)) * scale + b
    )
    out = (torch.softmax(logits, dim=-1) * (~empty)) @ vv
    (out * g.to(dtype)).sum().backward()
    return q.grad, k.grad, v.grad


def check_case(
    device, dtype_name, batch, heads, heads_kv, n_q, n_k, d, dv, s, causal, positions, seed
):
    torch = _torch()
    from plsh_fast.triton import plsh_backward_triton, plsh_forward_triton
    from plsh_ref.attention import plsh_attention
    from plsh_ref.partition import draw_partition
    from plsh_ref.testing.baseline import plain_attention_torch
    from plsh_ref.testing.tolerance import assert_close_to_reference

    dtype = getattr(torch, dtype_name)
    rng = np.random.default_rng(seed)
    sigma = np.exp(rng.uniform(0.0, np.log(256.0), size=heads))
    part = draw_partition(sigma, s, seed=seed)
    if positions == "default":
        qpos, kpos = np.arange(n_q) + (n_k - n_q), np.arange(n_k)
    else:
        kpos = np.cumsum(rng.integers(1, 3, size=n_k)).astype(np.int64) - 7
        qpos = np.sort(rng.integers(kpos[0] - 3, kpos[-1] + 3, size=n_q)).astype(np.int64)
    q = torch.from_numpy(rng.standard_normal((batch, heads, n_q, d))).to(device, dtype)
    k = torch.from_numpy(rng.standard_normal((batch, heads_kv, n_k, d))).to(device, dtype)
    v = torch.from_numpy(rng.standard_normal((batch, heads_kv, n_k, dv))).to(device, dtype)
    g = torch.from_numpy(rng.standard_normal((batch, heads, n_q, dv))).to(device, dtype)
    # non-contiguous (batch, seq, heads, dim) storage for the key
    k = k.transpose(1, 2).contiguous().transpose(1, 2)
    scale = 1.0 / math.sqrt(d)
    pitch, offset = _partition_tensors(part, device)
    qp = torch.tensor(qpos, device=device)
    kp = torch.tensor(kpos, device=device)
    out, lse, stats = plsh_forward_triton(
        q, k, v, pitch, offset, qp, kp, scale, causal, return_stats=True
    )
    q64, k64, v64 = (t.double().cpu().numpy() for t in (q, k, v))
    ref_out, ref_lse = plsh_attention(
        q64,
        k64,
        v64,
        partition=part,
        causal=causal,
        scale=scale,
        query_positions=qpos,
        key_positions=kpos,
        return_lse=True,
    )
    bias = _dense_bias(part, qpos, kpos, causal)
    base_out, base_lse = plain_attention_torch(
        q64, k64, v64, bias, scale=scale, dtype=dtype_name, device=str(device)
    )
    ratios = {}
    ratios["output"] = assert_close_to_reference(out, ref_out, base_out, dtype_name, name="output")
    ratios["lse"] = assert_close_to_reference(lse, ref_lse, base_lse, dtype_name, name="lse")
    grads = plsh_backward_triton(
        q, k, v, out, lse, g, pitch, offset, qp, kp, scale, causal, stats=stats
    )
    ref = _dense_grads(q.double(), k.double(), v.double(), g.double(), bias, scale, torch.float64)
    base = _dense_grads(q, k, v, g, bias, scale, dtype)
    magnitude = max(float(r.abs().max()) for r in ref)
    for name, x, r, b in zip(("grad_query", "grad_key", "grad_value"), grads, ref, base):
        if torch.isnan(x).any():
            raise AssertionError(f"{name}: NaN")
        ratios[name] = assert_close_to_reference(
            x, r, b, dtype_name, name=name, floor_scale=magnitude
        )
    return {"error_over_allowed": {k_: round(v_, 4) for k_, v_ in ratios.items()}}


CORRECTNESS_CASES = [
    dict(
        batch=2,
        heads=4,
        heads_kv=2,
        n_q=300,
        n_k=300,
        d=64,
        dv=64,
        s=8,
        causal=True,
        positions="default",
    ),
    dict(
        batch=1,
        heads=2,
        heads_kv=1,
        n_q=77,
        n_k=301,
        d=80,
        dv=48,
        s=5,
        causal=False,
        positions="explicit",
    ),
    dict(
        batch=1,
        heads=2,
        heads_kv=2,
        n_q=190,
        n_k=190,
        d=256,
        dv=256,
        s=16,
        causal=True,
        positions="default",
    ),
    dict(
        batch=1,
        heads=3,
        heads_kv=1,
        n_q=129,
        n_k=517,
        d=128,
        dv=128,
        s=64,
        causal=True,
        positions="default",
    ),
]


# --------------------------------------------------------------------------- 3. > 2**31 elements


def check_large(device, n=None, window=1024, tail=128):
    """(2, 1, 2**23 + 37, 128) bfloat16: 2.1e9 elements per tensor; check the far end.

    ``n``, ``window``, ``tail`` override the sizes (tests run the same code on a small CPU
    problem): the reference covers the last ``window`` positions of batch entry 1 and is
    exact for its last ``tail`` rows and keys."""
    torch = _torch()
    from plsh_fast.triton import plsh_backward_triton, plsh_forward_triton
    from plsh_ref.attention import plsh_attention
    from plsh_ref.partition import draw_partition
    from plsh_ref.testing.baseline import plain_attention_torch
    from plsh_ref.testing.tolerance import assert_close_to_reference

    d, s = 128, 4
    if n is None:
        n = 2**23 + 37
        assert 2 * n * d > 2**31
    part = draw_partition(np.array([2.0]), s, seed=5)  # pitches << 900 tokens: local blocks
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (2, 1, n, d)
    q = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
    k = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
    v = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
    pos = torch.arange(n, device=device)
    pitch, offset = _partition_tensors(part, device)
    scale = 1.0 / math.sqrt(d)
    out, lse, stats = plsh_forward_triton(
        q, k, v, pitch, offset, pos, pos, scale, True, return_stats=True
    )
    g = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
    dq, dk, dv = plsh_backward_triton(
        q, k, v, out, lse, g, pitch, offset, pos, pos, scale, True, stats=stats
    )
    # window: last W positions of batch entry 1; rows/keys in the last C are exact there
    W, C = window, tail
    sl = slice(n - W, n)
    spos = np.arange(n - W, n)
    qs, ks, vs, gs = (t[1:2, :, sl] for t in (q, k, v, g))
    q64, k64, v64 = (t.double().cpu().numpy() for t in (qs, ks, vs))
    ref_out, ref_lse = plsh_attention(
        q64,
        k64,
        v64,
        partition=part,
        causal=True,
        scale=scale,
        query_positions=spos,
        key_positions=spos,
        return_lse=True,
    )
    bias = _dense_bias(part, spos, spos, True)
    base_out, base_lse = plain_attention_torch(
        q64, k64, v64, bias, scale=scale, dtype="bfloat16", device=str(device)
    )
    tail = np.s_[:, :, -C:]
    r = {}
    r["output"] = assert_close_to_reference(
        out[1:2, :, sl][tail], ref_out[tail], base_out[tail], "bfloat16", name="output"
    )
    r["lse"] = assert_close_to_reference(
        lse[1:2, :, sl][:, :, -C:], ref_lse[:, :, -C:], base_lse[:, :, -C:], "bfloat16", name="lse"
    )
    ref = _dense_grads(
        qs.double(), ks.double(), vs.double(), gs.double(), bias, scale, torch.float64
    )
    base = _dense_grads(qs, ks, vs, gs, bias, scale, torch.bfloat16)
    magnitude = max(float(x[tail].abs().max()) for x in ref)
    for name, x, rr, b in zip(("grad_query", "grad_key", "grad_value"), (dq, dk, dv), ref, base):
        r[name] = assert_close_to_reference(
            x[1:2, :, sl][tail], rr[tail], b[tail], "bfloat16", name=name, floor_scale=magnitude
        )
    del q, k, v, g, out, lse, dq, dk, dv
    torch.cuda.empty_cache()
    return {
        "elements_per_tensor": 2 * n * d,
        "error_over_allowed": {k_: round(v_, 4) for k_, v_ in r.items()},
    }


# --------------------------------------------------------------------------- 4. benchmark


def _exact_alibi_rows(q, k, v, slopes, rows, scale):
    """float64 exact causal ALiBi output for query ``rows`` (default aligned positions)."""
    torch = _torch()
    n = k.shape[2]
    outs = []
    kpos = torch.arange(n, device=q.device, dtype=torch.float64)
    for h in range(q.shape[1]):
        hk = h // (q.shape[1] // k.shape[1])
        qh = q[0, h, rows].double()
        logits = (qh @ k[0, hk].double().T) * scale
        dist = rows.double()[:, None] - kpos[None, :]
        logits = logits - slopes[h] * dist.abs()
        logits = logits.masked_fill(dist < 0, float("-inf"))
        outs.append(torch.softmax(logits, dim=-1) @ v[0, hk].double())
    return torch.stack(outs, dim=0)  # (H, rows, dv)


def _flex():
    from torch.nn.attention import flex_attention as fa

    return fa


def peer_mods(device, slopes, num_heads):
    """The FlexAttention ``score_mod``/``mask_mod`` peers of :mod:`plsh_fast.peers`, made
    once per run (one function object each, tensors updated in place): compiled
    FlexAttention is then compiled once (dynamic shapes) instead of once per closure."""
    torch = _torch()
    from plsh_fast import peers

    slopes_t = torch.tensor(slopes, dtype=torch.float32, device=device)
    window = torch.zeros((num_heads,), dtype=torch.int64, device=device)
    return {
        "alibi": peers.alibi_score_mod(slopes_t),
        "causal": peers.causal_mask_mod(),
        "window": peers.window_mask_mod(window),
        "window_width": window,
    }


def causal_block_mask(n, device, mods):
    """:func:`plsh_fast.peers.causal_block_mask` with the run's single causal ``mask_mod``."""
    from plsh_fast import peers

    mask = peers.causal_block_mask(n, device=device)
    mask.mask_mod = mods["causal"]
    return mask


def window_block_mask(n, width, device, mods, block=128):
    """Causal sliding-window BlockMask (keys ``q - width < k <= q``, the mask_mod of
    :func:`plsh_fast.peers.window_mask_mod`) built from block indices (``O((n/block)^2)``,
    where ``create_block_mask`` would evaluate all ``n^2`` pairs)."""
    torch = _torch()
    fa = _flex()
    nb = (n + block - 1) // block
    qb = torch.arange(nb, device=device)
    kb0 = torch.clamp(torch.div(qb * block - width + 1, block, rounding_mode="floor"), min=0)
    num = (qb - kb0 + 1).to(torch.int32)[None, None]
    idx = kb0[:, None] + torch.arange(nb, device=device)[None, :]
    idx = torch.minimum(idx, qb[:, None]).to(torch.int32)[None, None]
    mods["window_width"].fill_(int(width))
    return fa.BlockMask.from_kv_blocks(
        num, idx, BLOCK_SIZE=block, mask_mod=mods["window"], seq_lengths=(n, n)
    )


def windowed_results(flex, q, k, v, n, scale, err, our_width, our_error, device, mods):
    """Compiled FlexAttention with exact ALiBi cut to a causal window: at our window width,
    and the narrowest width of a doubling sweep whose error is at most ours."""
    rec = {"window_ours": int(our_width)}
    sweep = {}
    try:
        widths = sorted({int(our_width * f) for f in (0.25, 0.5, 1, 2, 4, 8)} - {0})
        for width in widths:
            if width > 4 * n:
                continue
            mask = window_block_mask(n, width, device, mods)

            def fwd(mask=mask, width=width):
                mods["window_width"].fill_(width)
                return flex(q, k, v, score_mod=mods["alibi"], block_mask=mask, scale=scale)

            sweep[width] = {"error": err(fwd()), "fwd_ms": _timeit(fwd, reps_max=10)[0]}
        rec["window_sweep"] = sweep
        if int(our_width) in sweep:
            rec["flex_window_fwd_ms"] = sweep[int(our_width)]["fwd_ms"]
            rec["flex_window_error"] = sweep[int(our_width)]["error"]
        ok = [w for w in sorted(sweep) if sweep[w]["error"] <= our_error]
        if ok:
            rec["window_at_our_error"] = ok[0]
            rec["flex_window_eqerr_fwd_ms"] = sweep[ok[0]]["fwd_ms"]
    except Exception as exc:  # noqa: BLE001
        rec["flex_window_error_msg"] = f"{type(exc).__name__}: {exc}"[:500]
    return rec


def sdpa_results(q, k, v, slopes, n, scale, err, device, max_gb=16.0):
    """torch SDPA with a dense causal ALiBi bias (bf16 ``(1, H, n, n)``) where it fits."""
    H = q.shape[1]
    gb = H * n * n * 2 / 2**30
    if gb > max_gb:
        return {"sdpa_error_msg": f"skipped: dense bias would need {gb:.0f} GB"}
    try:
        from plsh_fast import peers

        bias = peers.sdpa_alibi_bias(slopes, n, n, causal=True, dtype=q.dtype, device=device)

        def fwd():
            return peers.sdpa_alibi_attention(q, k, v, bias=bias, scale=scale)

        rec = {"sdpa_error": err(fwd()), "sdpa_fwd_ms": _timeit(fwd, reps_max=10)[0]}
        del bias
        return rec
    except Exception as exc:  # noqa: BLE001
        return {"sdpa_error_msg": f"{type(exc).__name__}: {exc}"[:500]}


def flex_results(flex, q, k, v, g, n, scale, err, args, device, mods):
    """Compiled FlexAttention exact ALiBi: error, forward and forward+backward times, peak."""
    torch = _torch()
    rec = {}
    try:
        causal_mask = causal_block_mask(n, device, mods)
        alibi = mods["alibi"]

        def flex_fwd():
            return flex(q, k, v, score_mod=alibi, block_mask=causal_mask, scale=scale)

        rec["flex_error"] = err(flex_fwd())
        rec["flex_fwd_ms"], _ = _timeit(flex_fwd, reps_max=10)
        rec["flex_fwd_peak_mb"] = _peak_mb(flex_fwd)
        if "backward" not in args.skip:
            qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))

            def flex_fwd_bwd():
                o = flex(qg, kg, vg, score_mod=alibi, block_mask=causal_mask, scale=scale)
                return torch.autograd.grad(o, (qg, kg, vg), g)

            rec["flex_fwd_bwd_ms"], _ = _timeit(flex_fwd_bwd, reps_max=5)
    except Exception as exc:  # noqa: BLE001
        rec["flex_error_msg"] = f"{type(exc).__name__}: {exc}"[:500]
    return rec


def bench_one(device, n, s, args, state):
    torch = _torch()
    from plsh_fast.triton import (
        compute_bins,
        make_plan,
        plsh_backward_triton,
        plsh_forward_triton,
        tile_config,
    )
    from plsh_ref.alibi import alibi_slopes
    from plsh_ref.partition import draw_partition

    fa = _flex()
    H, d = args.num_heads, args.head_dim
    slopes = alibi_slopes(H)
    part = draw_partition(1.0 / slopes, s, seed=1234)
    # q, k, v, g depend on n only, so that FlexAttention results can be shared across s
    gen = torch.Generator(device=device).manual_seed(n)
    q, k, v, g = (
        torch.randn((1, H, n, d), generator=gen, device=device, dtype=torch.bfloat16)
        for _ in range(4)
    )
    pitch, offset = _partition_tensors(part, device)
    pos = torch.arange(n, device=device)
    scale = 1.0 / math.sqrt(d)
    rows = torch.cat(
        [
            torch.arange(n - 32, n, device=device),
            torch.randint(0, n, (32,), generator=gen, device=device),
        ]
    )
    ref = _exact_alibi_rows(q, k, v, slopes, rows, scale)
    rec = {"n": n, "s": s, "num_heads": H, "head_dim": d}

    def err(out):
        return float((out[0][:, rows].double() - ref).abs().max())

    # PLSH Triton
    def ours_fwd():
        return plsh_forward_triton(
            q, k, v, pitch, offset, pos, pos, scale, True, positions_sorted=True
        )

    out, lse = ours_fwd()
    rec["plsh_error"] = err(out)
    rec["plsh_fwd_ms"], _ = _timeit(ours_fwd)
    rec["plsh_fwd_peak_mb"] = _peak_mb(ours_fwd)
    if "backward" not in args.skip:

        def ours_fwd_bwd():
            o, l_, st, plan = plsh_forward_triton(
                q, k, v, pitch, offset, pos, pos, scale, True, positions_sorted=True,
                return_plan=True, return_stats=True,
            )  # fmt: skip
            return plsh_backward_triton(
                q, k, v, o, l_, g, pitch, offset, pos, pos, scale, True, stats=st, plan=plan
            )

        rec["plsh_fwd_bwd_ms"], _ = _timeit(ours_fwd_bwd)
        rec["plsh_fwd_bwd_peak_mb"] = _peak_mb(ours_fwd_bwd)
    del out, lse

    ablation = dataclasses.replace(tile_config(d, d, q.device, q.dtype, num_samples=s), variant=3)

    def ablation_fwd():  # same kernel, counts not computed (planned range + causal mask)
        return plsh_forward_triton(
            q, k, v, pitch, offset, pos, pos, scale, True, positions_sorted=True, tiles=ablation
        )

    try:
        ablation_fwd()
        rec["nocounts_fwd_ms"], _ = _timeit(ablation_fwd)
        rec["counts_share_of_fwd"] = 1.0 - rec["nocounts_fwd_ms"] / rec["plsh_fwd_ms"]
    except Exception as exc:  # noqa: BLE001
        rec["nocounts_error_msg"] = f"{type(exc).__name__}: {exc}"[:500]
    plan = make_plan(pos, pos, pitch, offset, causal=True, block_m=64, block_n=64)
    widths = (plan.key_range[..., 1] - plan.key_range[..., 0]).float()
    our_width = max(64, int(widths.median(dim=1).values.max().item()) - 64)
    del plan

    # FlexAttention exact ALiBi (compiled), causal block mask: depends on n only, run once
    if "flex" not in state:
        state["flex"] = torch.compile(fa.flex_attention, dynamic=True)
    if "mods" not in state:
        state["mods"] = peer_mods(device, slopes, H)
    mods = state["mods"]
    flex = state["flex"]
    by_n = state.setdefault("flex_by_n", {})
    if n not in by_n:
        by_n[n] = flex_results(flex, q, k, v, g, n, scale, err, args, device, mods)
    rec.update(by_n[n])
    rec.update(
        windowed_results(flex, q, k, v, n, scale, err, our_width, rec["plsh_error"], device, mods)
    )
    rec.update(sdpa_results(q, k, v, slopes, n, scale, err, device))
    if "flex_fwd_ms" in rec:
        rec["speedup_fwd_vs_flex"] = rec["flex_fwd_ms"] / rec["plsh_fwd_ms"]
    if "flex_fwd_bwd_ms" in rec and "plsh_fwd_bwd_ms" in rec:
        rec["speedup_fwd_bwd_vs_flex"] = rec["flex_fwd_bwd_ms"] / rec["plsh_fwd_bwd_ms"]

    # Paper's reduction: s block-diagonal FlexAttention passes, merged by LSE
    nb = (n + 127) // 128
    # kv and q index tables of the batched block mask, plus s copies of the output
    reduction_gb = (2 * s * H * nb * nb * 4 + s * H * n * d * 2) / 2**30
    if "reduction" not in args.skip and reduction_gb > 24:
        rec["reduction_error_msg"] = f"skipped: block masks would need {reduction_gb:.0f} GB"
    elif "reduction" not in args.skip:
        try:
            from plsh_fast import peers

            # (s, H, n) bins; the reduction's mask_mod closes over this config's bins
            bins = compute_bins(pitch, offset, pos).transpose(0, 1).contiguous()
            block_mask = peers.reduction_block_mask(bins)

            def reduction_fwd():
                return peers.flex_reduction_attention(
                    q, k, v, block_mask=block_mask, num_samples=s, scale=scale,
                    return_lse=False, flex=flex,
                )  # fmt: skip

            rec["reduction_error"] = err(reduction_fwd())
            rec["reduction_fwd_ms"], _ = _timeit(reduction_fwd, reps_max=5)
            rec["reduction_fwd_peak_mb"] = _peak_mb(reduction_fwd)
            rec["speedup_fwd_vs_reduction"] = rec["reduction_fwd_ms"] / rec["plsh_fwd_ms"]
            del block_mask, bins
        except Exception as exc:  # noqa: BLE001
            rec["reduction_error_msg"] = f"{type(exc).__name__}: {exc}"[:500]
    del q, k, v, g
    torch.cuda.empty_cache()
    return rec


VARIANTS = [  # (block_m, block_n, num_warps, num_stages, variant): forward-kernel tuning data
    (64, 64, 4, 3, 0),
    (64, 64, 4, 2, 0),
    (64, 64, 8, 3, 0),
    (128, 64, 8, 3, 0),
    (64, 32, 4, 3, 0),
    (64, 32, 8, 3, 0),  # no spills with Triton 3.6 either (AOT); 1.9x counts SASS per element
    (32, 64, 4, 3, 0),
    (64, 64, 4, 3, 3),  # no-counts ablation (not PLSH): what the counts cost
    (64, 64, 4, 3, 4),  # every sample compared (no full/disjoint classification)
]


def _variant_name(bm, bn, warps, stages, variant):
    suffix = {3: "_nocounts", 4: "_noclassify"}.get(variant, "")
    return f"BM{bm}_BN{bn}_w{warps}_st{stages}" + suffix


def bench_variants(device, n, s, args):
    """Forward time of tile-size/stage variants and of the no-counts ablation."""
    torch = _torch()
    from plsh_fast.triton import plsh_forward_triton, tile_config
    from plsh_ref.alibi import alibi_slopes
    from plsh_ref.partition import draw_partition

    H, d = args.num_heads, args.head_dim
    part = draw_partition(1.0 / alibi_slopes(H), s, seed=1234)
    gen = torch.Generator(device=device).manual_seed(7)
    q, k, v = (
        torch.randn((1, H, n, d), generator=gen, device=device, dtype=torch.bfloat16)
        for _ in range(3)
    )
    pitch, offset = _partition_tensors(part, device)
    pos = torch.arange(n, device=device)
    scale = 1.0 / math.sqrt(d)
    shipped = tile_config(d, d, q.device, q.dtype, num_samples=s)
    base = None
    times = {}
    for bm, bn, warps, stages, variant in VARIANTS:
        key = _variant_name(bm, bn, warps, stages, variant)
        try:
            tiles = dataclasses.replace(
                shipped,
                block_m=bm,
                block_n=bn,
                dq_block_n=None,  # the dQ key tile must divide block_n (forward only here)
                num_warps=warps,
                num_stages=stages,
                variant=variant if variant != 4 else 0,
                classify=variant != 4,
            )

            def run(tiles=tiles):
                return plsh_forward_triton(
                    q, k, v, pitch, offset, pos, pos, scale, True, tiles=tiles,
                    positions_sorted=True,
                )  # fmt: skip

            out = run()[0]
            if base is None:
                base = out
            times[key] = {
                "fwd_ms": _timeit(run)[0],
                "max_diff_vs_first": float((out.float() - base.float()).abs().max()),
            }
        except Exception as exc:  # noqa: BLE001
            times[key] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"n": n, "s": s, "variants": times}


def work_model(n, s, num_heads=16, block_m=64, block_n=64, seed=1234):
    """Tile steps and sample classes of the forward kernel's plan, counted on the CPU (numpy).

    Reproduces the kernel's planning (per-tile bin extents, key range per query tile,
    causal cap, default positions) with :func:`plsh_ref.partition.bins` and counts, over
    all (head, query tile, key tile) steps, the samples that are *full* (one common bin),
    *disjoint* and *mixed* (element-wise bin comparison). Returns totals and per-head key
    tiles per query tile, against the ``n_tiles (n_tiles + 1) / 2`` steps of dense causal
    attention. Memory ``num_heads * s * n`` int64.
    """
    from plsh_ref.alibi import alibi_slopes
    from plsh_ref.partition import bins, draw_partition

    part = draw_partition(1.0 / alibi_slopes(num_heads), s, seed=seed)
    pos = np.arange(n)
    nq_t = -(-n // block_m)
    nk_t = -(-n // block_n)
    steps = full = mixed = disjoint = 0
    per_head = []
    for h in range(num_heads):
        b = bins(part.heads(h, h + 1), pos)[0]  # (s, n)
        pad_q = np.pad(b, ((0, 0), (0, nq_t * block_m - n)), mode="edge")
        pad_k = np.pad(b, ((0, 0), (0, nk_t * block_n - n)), mode="edge")
        qlo, qhi = pad_q[:, ::block_m], pad_q[:, block_m - 1 :: block_m]  # (s, nq_t)
        klo, khi = pad_k[:, ::block_n], pad_k[:, block_n - 1 :: block_n]
        start = np.min([np.searchsorted(b[t], qlo[t], side="left") for t in range(s)], axis=0)
        end = np.minimum(np.arange(nq_t) * block_m + block_m, n)  # causal cap (default pos.)
        first = start // block_n
        last = -(-end // block_n)
        head_steps = 0
        for mt in range(nq_t):
            kt = np.arange(first[mt], last[mt])
            ov = (qlo[:, mt, None] <= khi[:, kt]) & (klo[:, kt] <= qhi[:, mt, None])
            fu = ov & (qlo[:, mt, None] == qhi[:, mt, None]) & (klo[:, kt] == khi[:, kt])
            full += int(fu.sum())
            mixed += int((ov & ~fu).sum())
            disjoint += int((~ov).sum())
            head_steps += kt.size
        steps += head_steps
        per_head.append(round(head_steps / nq_t, 2))
    dense = num_heads * nq_t * (nq_t + 1) // 2 * (block_m // block_n if block_m >= block_n else 1)
    return {
        "n": n,
        "s": s,
        "block_m": block_m,
        "block_n": block_n,
        "tile_steps": steps,
        "dense_causal_tile_steps": dense,
        "work_ratio_vs_dense": round(dense / steps, 1),
        "mixed_samples_per_step": round(mixed / steps, 2),
        "full_samples_per_step": round(full / steps, 2),
        "disjoint_samples_per_step": round(disjoint / steps, 2),
        "key_tiles_per_query_tile_by_head": per_head,
    }


def _estimate_seconds(n, s):
    """Rough wall-clock estimate of one benchmark config (compile excluded) on an H200."""
    return 3.0 + 40.0 * (n / 262144) ** 2 + 0.2 * s * n / 65536


# --------------------------------------------------------------------------- output


def _fmt(x, digits=3):
    if x is None:
        return "-"
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        return f"{x:.{digits}g}"
    return str(x)


def write_results(out_dir, payload):
    """Write ``results.json`` and ``results.md``; returns the markdown text."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(payload, f, indent=1, default=str)
    lines = [f"# GPU check ({payload['date']})", ""]
    env = payload["environment"]
    lines += [
        f"- device: {env.get('device')}",
        f"- torch {env.get('torch')}, triton {env.get('triton')}, python {env.get('python')}",
        f"- command: `{payload['command']}`",
        f"- wall time: {payload['wall_s']:.0f} s",
    ]
    if payload.get("dry_run"):
        lines.append("- **dry run: placeholder numbers, nothing was measured**")
    lines += [
        "",
        "## Correctness (error / allowed, SPEC section 6; <= 1 passes)",
        "",
        "| check | status | detail |",
        "|---|---|---|",
    ]
    for r in payload["records"]:
        if r["section"] in ("bench", "variants"):
            continue
        detail = r.get("error_over_allowed", r.get("error", r.get("reason", "")))
        if isinstance(detail, dict):
            detail = ", ".join(f"{k}={_fmt(v)}" for k, v in detail.items())
        lines.append(
            f"| {r['section']}: {r['name']} | {r['status']} | "
            f"{str(detail).replace('|', '/')[:300]} |"
        )
    lines += [
        "",
        "## Benchmark: causal, batch 1, 16 heads (standard slopes), head_dim 128, bfloat16",
        "",
        "Times are medians in ms (CUDA events). Error: max |out - exact ALiBi (float64)| "
        "on 64 sampled rows.",
        "",
        "| n | s | PLSH fwd | Flex fwd | speedup | reduction fwd | PLSH fwd+bwd | "
        "Flex fwd+bwd | speedup | PLSH peak MB | Flex peak MB | err PLSH | err Flex | "
        "err reduction | status |",
        "|" + "---|" * 15,
    ]
    for r in payload["records"]:
        if r["section"] != "bench":
            continue
        cells = [
            r.get("n"),
            r.get("s"),
            r.get("plsh_fwd_ms"),
            r.get("flex_fwd_ms"),
            r.get("speedup_fwd_vs_flex"),
            r.get("reduction_fwd_ms"),
            r.get("plsh_fwd_bwd_ms"),
            r.get("flex_fwd_bwd_ms"),
            r.get("speedup_fwd_bwd_vs_flex"),
            r.get("plsh_fwd_peak_mb"),
            r.get("flex_fwd_peak_mb"),
            r.get("plsh_error"),
            r.get("flex_error"),
            r.get("reduction_error"),
        ]
        status = r["status"] if r["status"] != "error" else "error: " + r.get("error", "")[:80]
        for key in ("flex_error_msg", "reduction_error_msg"):
            if key in r:
                status += f"; {key.split('_')[0]}: {r[key][:60]}"
        lines.append("| " + " | ".join(_fmt(c) for c in cells) + f" | {status.replace('|', '/')} |")
    lines += [
        "",
        "## Peers at equal width / equal error, no-counts ablation, SDPA dense bias",
        "",
        "| n | s | PLSH fwd | no-counts fwd | counts share | window W (ours) | Flex window fwd "
        "| err Flex window | W at our error | Flex window fwd (our error) | SDPA bias fwd | "
        "err SDPA |",
        "|" + "---|" * 12,
    ]
    for r in payload["records"]:
        if r["section"] != "bench":
            continue
        cells = [
            r.get(k)
            for k in (
                "n", "s", "plsh_fwd_ms", "nocounts_fwd_ms", "counts_share_of_fwd",
                "window_ours", "flex_window_fwd_ms", "flex_window_error", "window_at_our_error",
                "flex_window_eqerr_fwd_ms", "sdpa_fwd_ms", "sdpa_error",
            )
        ]  # fmt: skip
        lines.append("| " + " | ".join(_fmt(c) for c in cells) + " |")
    for r in payload["records"]:
        if r["section"] != "variants":
            continue
        lines += [
            "",
            f"## Forward kernel variants (n={r.get('n')}, s={r.get('s')}): "
            f"{r['status']} {r.get('error', '')[:200]}",
            "",
            "| variant | fwd ms | max diff vs first | error |",
            "|---|---|---|---|",
        ]
        for name, v in r.get("variants", {}).items():
            lines.append(
                f"| {name} | {_fmt(v.get('fwd_ms'))} | "
                f"{_fmt(v.get('max_diff_vs_first'))} | {v.get('error', '')[:120]} |"
            )
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(text)
    return text


def environment(dry_run):
    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "stubbed_modules": list(STUBBED),
    }
    try:
        import torch

        env["torch"] = torch.__version__
        env["device"] = (
            torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
        )
    except Exception as exc:  # noqa: BLE001
        env["torch"] = f"unavailable ({exc})"
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception as exc:  # noqa: BLE001
        env["triton"] = f"unavailable ({exc})"
    if dry_run:
        env["device"] = f"{env.get('device')} (dry run)"
    return env


def main(argv=None):
    args = parse_args(argv)
    ensure_importable()
    budget = Budget(args.budget)
    t0 = time.monotonic()
    records = []
    payload = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(
            ["benchmarks/gpu_check.py"] + list(argv if argv is not None else sys.argv[1:])
        ),
        "environment": environment(args.dry_run),
        "dry_run": args.dry_run,
        "records": records,
    }
    configs = bench_configs(args.seq_lens, args.samples)
    if args.work_model:
        for n, s in configs:
            rec = work_model(n, s, args.num_heads)
            print(json.dumps(rec), flush=True)
            records.append({"section": "work_model", "name": f"n={n} s={s}", "status": "ok", **rec})
        payload["wall_s"] = time.monotonic() - t0
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "work_model.json"), "w") as f:
            json.dump(payload, f, indent=1, default=str)
        return 0
    if args.dry_run:
        for i, _case in enumerate(CORRECTNESS_CASES):
            records.append(
                {
                    "section": "correctness",
                    "name": f"float16 case {i}",
                    "status": "dry-run",
                    "error_over_allowed": {"output": 0.0},
                }
            )
        for n, s in configs:
            records.append(
                {
                    "section": "bench",
                    "name": f"n={n} s={s}",
                    "status": "dry-run",
                    "n": n,
                    "s": s,
                    "plsh_fwd_ms": float("nan"),
                    "estimate_s": _estimate_seconds(n, s),
                }
            )
        records.append(
            {
                "section": "variants",
                "name": "forward tile variants",
                "status": "dry-run",
                "n": HEADLINE[0],
                "s": HEADLINE[1],
                "variants": {_variant_name(*v): {"fwd_ms": float("nan")} for v in VARIANTS},
            }
        )
        payload["wall_s"] = time.monotonic() - t0
        write_results(args.out, payload)
        print(f"dry run: {len(configs)} benchmark configs planned; wrote {args.out}")
        return 0
    torch = _torch()
    if not torch.cuda.is_available():
        print("no CUDA device: use --dry-run", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    import torch._dynamo

    for name in (
        "cache_size_limit",
        "recompile_limit",
        "accumulated_cache_size_limit",
        "accumulated_recompile_limit",
    ):
        if hasattr(torch._dynamo.config, name):  # FlexAttention recompiles per sequence length
            setattr(torch._dynamo.config, name, max(256, getattr(torch._dynamo.config, name)))

    def flush():
        payload["wall_s"] = time.monotonic() - t0
        write_results(args.out, payload)

    state = {}
    first_cases = [
        ("bfloat16", 0),
        ("float16", 0),
        ("float32", 0),
        ("bfloat16", 1),
        ("bfloat16", 2),
    ]
    later_cases = [
        (dn, i)
        for dn in ("bfloat16", "float16", "float32")
        for i in range(len(CORRECTNESS_CASES))
        if (dn, i) not in first_cases
    ]

    def correctness(cases):
        if "correctness" in args.skip:
            return
        for dtype_name, i in cases:
            case = CORRECTNESS_CASES[i]
            guarded(
                records,
                "correctness",
                f"{dtype_name} case {i} {case}",
                budget,
                30,
                lambda c=case, dn=dtype_name, i=i: check_case(device, dn, seed=i, **c),
            )
        flush()

    def bench(pairs):
        if "bench" in args.skip:
            return
        for n, s in pairs:
            fresh = n not in state.get("flex_by_n", {})  # compiled FlexAttention for a new n
            guarded(
                records,
                "bench",
                f"n={n} s={s}",
                budget,
                _estimate_seconds(n, s) + (60.0 if fresh and not state.get("flex_by_n") else 5.0),
                lambda n=n, s=s: bench_one(device, n, s, args, state),
            )
            flush()

    # Order: what matters most first, so that a budget cut loses the least.
    if "bins" not in args.skip:
        guarded(records, "bins", "float64 bins vs plsh_ref", budget, 5, lambda: check_bins(device))
    correctness(first_cases)
    bench(configs[:1])  # the headline configuration
    if "large" not in args.skip:
        guarded(
            records,
            "large",
            "2 x 1 x (2^23+37) x 128 bfloat16 (> 2^31 elements)",
            budget,
            40,
            lambda: check_large(device),
        )
        flush()
    bench(configs[1:])
    if "variants" not in args.skip and HEADLINE in configs:
        guarded(
            records,
            "variants",
            f"forward tile variants n={HEADLINE[0]} s={HEADLINE[1]}",
            budget,
            40,
            lambda: bench_variants(device, *HEADLINE, args),
        )
    correctness(later_cases)
    flush()
    failed = [
        r for r in records if r["section"] not in ("bench", "variants") and r["status"] == "error"
    ]
    print(
        f"done in {time.monotonic() - t0:.0f} s; {len(failed)} correctness failures; "
        f"results in {args.out}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
