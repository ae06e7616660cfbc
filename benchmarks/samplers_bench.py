"""Issue 16 goal measurement: iid against stratified partition samplers.

For ``n`` aligned positions (bidirectional), ``s`` samples and each ``sigma``, over
``--reps`` independent draws per sampler: the squared Frobenius error ``||M~ - L*||_F^2``
(mean and its standard error, the ratio stratified/iid with a delta-method standard
error, and the exact ``E||M~ - L*||_F^2`` of :mod:`plsh_ref.samplers`), the measured fused
window (keys with ``C_ij > 0`` per query, mean over queries and draws, against the exact
expectation), and the largest pitch. Then the causal attention output error against exact
ALiBi on the shipped activations (standard slopes), per sampler and ``s``.

Usage::

    python benchmarks/samplers_bench.py --out benchmarks/results  # writes samplers_<date>.{md,json}

Every number is measured by this run (``proofs_notes/samplers.md`` has the theory).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from plsh_ref.alibi import alibi_slopes, kernel_matrix, sigma_from_slopes
from plsh_ref.attention import alibi_attention, biased_attention
from plsh_ref.data import load_qkv
from plsh_ref.expectation import expected_window_width
from plsh_ref.partition import count_bias, counts, draw_partition
from plsh_ref.provenance import run_metadata
from plsh_ref.samplers import frobenius_error_square, resolve_group_size, window_width

SAMPLERS = ("iid", "stratified")


def matrix_part(n, s, sigmas, reps, seed):
    pos = np.arange(n)
    sig = np.asarray(sigmas, dtype=np.float64)
    kernel = kernel_matrix(sig, pos, pos)
    out = {}
    for sampler in SAMPLERS:
        err = np.empty((sig.size, reps))
        width = np.empty((sig.size, reps))
        top = np.empty((sig.size, reps))
        for r in range(reps):
            part = draw_partition(sig, s, seed + 1000 * r, sampler=sampler)
            cnt = counts(part, pos, pos)
            err[:, r] = ((cnt / s - kernel) ** 2).sum(axis=(1, 2))
            width[:, r] = (cnt > 0).sum(axis=2).mean(axis=1)
            top[:, r] = part.pitch.max(axis=1)
        out[sampler] = {
            "group_size": resolve_group_size(sampler, s),
            "frobenius_square": err,
            "frobenius_square_exact": [
                frobenius_error_square(x, n, s, sampler=sampler) for x in sig
            ],
            "window": width,
            "window_exact": [
                float(
                    window_width(x, s, n, sampler=sampler).mean()
                    if sampler != "iid"
                    else expected_window_width(x, s, n).mean()
                )
                for x in sig
            ],
            "largest_pitch": top,
        }
    return out


def output_part(samples, reps, seed, max_tokens=None):
    data = load_qkv(None)
    q, k, v = (data[x][:, :, :max_tokens] for x in ("query", "key", "value"))
    slopes = alibi_slopes(q.shape[1])
    sigma = sigma_from_slopes(slopes)
    n = k.shape[2]
    pos = np.arange(n)
    ref, _ = alibi_attention(q, k, v, slopes=slopes, causal=True, return_lse=True)
    out = {"shape": list(q.shape)}
    for sampler in SAMPLERS:
        rel = np.empty((len(samples), reps))
        mx = np.empty((len(samples), reps))
        for j, s in enumerate(samples):
            for r in range(reps):
                part = draw_partition(sigma, s, seed + 1000 * r + 1, sampler=sampler)
                res, _ = biased_attention(
                    q,
                    k,
                    v,
                    bias=count_bias(counts(part, pos, pos, causal=True), s),
                    return_lse=True,
                )
                rel[j, r] = np.linalg.norm(res - ref) / np.linalg.norm(ref)
                mx[j, r] = np.abs(res - ref).max()
        out[sampler] = {"rel_fro": rel, "max_abs": mx}
    return out


def ratio_se(a, b):
    """``mean(a) / mean(b)`` and its delta-method standard error (independent samples)."""
    ra = a.std(ddof=1) / a.mean() / math.sqrt(a.size)
    rb = b.std(ddof=1) / b.mean() / math.sqrt(b.size)
    ratio = a.mean() / b.mean()
    return ratio, ratio * math.hypot(ra, rb)


def mean_se(a):
    return a.mean(), a.std(ddof=1) / math.sqrt(a.size)


def report(cfg, mat, outp, seconds) -> str:
    lines = [
        f"# Samplers: iid vs stratified ({cfg['date']})",
        "",
        f"Measured by `python benchmarks/samplers_bench.py {' '.join(cfg['argv'])}` in "
        f"{seconds:.0f} s on {cfg['machine']}; other processes shared the machine (times "
        "are not comparable across runs; every ratio below is between the two samplers "
        "of this run). Theory: `proofs_notes/samplers.md`.",
        "",
        f"## Kernel matrix: n = {cfg['n']}, s = {cfg['s']}, bidirectional, {cfg['reps']} "
        "draws per sampler",
        "",
        f"Stratified group size s' = {mat['stratified']['group_size']} "
        f"(m = {cfg['s'] // mat['stratified']['group_size']} pitch groups). "
        "`||M~ - L*||_F^2`: mean ± standard error over draws; exact: "
        "`plsh_ref.samplers.frobenius_error_square`.",
        "",
        "| sigma | iid: F^2 (exact) | stratified: F^2 (exact) | ratio ± se (exact) "
        "| goal <= 0.25 |",
        "|---|---|---|---|---|",
    ]
    for h, sigma in enumerate(cfg["sigmas"]):
        a = mat["stratified"]["frobenius_square"][h]
        b = mat["iid"]["frobenius_square"][h]
        ratio, se = ratio_se(a, b)
        ea = mat["stratified"]["frobenius_square_exact"][h]
        eb = mat["iid"]["frobenius_square_exact"][h]
        ma, sa = mean_se(a)
        mb, sb = mean_se(b)
        ok = "yes" if ratio + 2 * se <= 0.25 else ("within 2 se" if ratio <= 0.25 else "no")
        lines.append(
            f"| {sigma:g} | {mb:.4g} ± {sb:.2g} ({eb:.4g}) | {ma:.4g} ± {sa:.2g} ({ea:.4g}) "
            f"| {ratio:.3f} ± {se:.3f} ({ea / eb:.3f}) | {ok} |"
        )
    lines += [
        "",
        "Fused window (keys with a nonzero count per query, mean over queries; mean ± se "
        "over draws, exact expectation in parentheses) and the largest pitch (mean over "
        "draws):",
        "",
        "| sigma | iid window | stratified window | ratio | goal <= 1.10 | largest pitch iid "
        "| largest pitch stratified |",
        "|---|---|---|---|---|---|---|",
    ]
    for h, sigma in enumerate(cfg["sigmas"]):
        wa = mat["stratified"]["window"][h]
        wb = mat["iid"]["window"][h]
        ratio, se = ratio_se(wa, wb)
        ma, sa = mean_se(wa)
        mb, sb = mean_se(wb)
        lines.append(
            f"| {sigma:g} | {mb:.1f} ± {sb:.1f} ({mat['iid']['window_exact'][h]:.1f}) "
            f"| {ma:.1f} ± {sa:.1f} ({mat['stratified']['window_exact'][h]:.1f}) "
            f"| {ratio:.3f} ± {se:.3f} | {'yes' if ratio <= 1.10 else 'no'} "
            f"| {mat['iid']['largest_pitch'][h].mean():.1f} "
            f"| {mat['stratified']['largest_pitch'][h].mean():.1f} |"
        )
    shape = outp["shape"]
    lines += [
        "",
        f"## Attention output on the shipped activations ({shape[1]} heads, n = {shape[2]}, "
        f"batch {shape[0]}, standard slopes, causal), {cfg['output_reps']} draws",
        "",
        "Relative Frobenius and max-abs error against exact ALiBi attention (mean ± se).",
        "",
        "| s | rel. Fro. iid | rel. Fro. stratified | ratio | max-abs iid | max-abs stratified |",
        "|---|---|---|---|---|---|",
    ]
    for j, s in enumerate(cfg["output_samples"]):
        a = outp["stratified"]["rel_fro"][j]
        b = outp["iid"]["rel_fro"][j]
        ratio, _ = ratio_se(a, b)
        ma, sa = mean_se(a)
        mb, sb = mean_se(b)
        xa, xsa = mean_se(outp["stratified"]["max_abs"][j])
        xb, xsb = mean_se(outp["iid"]["max_abs"][j])
        lines.append(
            f"| {s} | {mb:.4f} ± {sb:.4f} | {ma:.4f} ± {sa:.4f} | {ratio:.3f} "
            f"| {xb:.3f} ± {xsb:.3f} | {xa:.3f} ± {xsa:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--num-samples", type=int, default=64)
    parser.add_argument("--sigma", type=float, nargs="+", default=[4.0, 16.0, 64.0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--output-samples", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--output-reps", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=None, help="first N tokens only")
    parser.add_argument("--seed", type=int, default=0, help="base seed (default: 0)")
    parser.add_argument("--out", type=Path, default=Path("."), help="output directory")
    args = parser.parse_args(argv)
    if args.n < 2 or args.num_samples < 1 or args.reps < 2 or args.output_reps < 2:
        print(
            "samplers_bench: --n >= 2, --num-samples >= 1, --reps/--output-reps >= 2",
            file=sys.stderr,
        )
        return 2
    t0 = time.perf_counter()
    mat = matrix_part(args.n, args.num_samples, args.sigma, args.reps, args.seed)
    outp = output_part(args.output_samples, args.output_reps, args.seed, args.max_tokens)
    seconds = time.perf_counter() - t0
    meta = run_metadata()
    date = dt.datetime.now(dt.timezone.utc).date().isoformat()
    cfg = {
        "date": date,
        "argv": sys.argv[1:] if argv is None else list(argv),
        "machine": "{platform}, {cpu_count} CPUs".format(**meta["machine"]),
        "n": args.n,
        "s": args.num_samples,
        "sigmas": args.sigma,
        "reps": args.reps,
        "output_samples": args.output_samples,
        "output_reps": args.output_reps,
        "seed": args.seed,
    }
    text = report(cfg, mat, outp, seconds)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"samplers_{date}.md").write_text(text)

    def plain(x):
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        return x.tolist() if isinstance(x, np.ndarray) else x

    record = {"config": cfg, "seconds": round(seconds, 1), "provenance": meta}
    record["matrix"] = plain(mat)
    record["output"] = plain(outp)
    (args.out / f"samplers_{date}.json").write_text(json.dumps(record, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
