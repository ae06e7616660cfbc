"""Bytes sent per rank by the context-parallel halo exchange, against all-gathering K/V.

Run from the repository root, e.g.::

    python benchmarks/halo_bench.py                       # the default table below
    python benchmarks/halo_bench.py --n 65536 --ranks 4 --num-samples 16 --measure-ranks

Configuration (SPEC section 7, GPU): batch 1, 16 heads with the standard 16-head ALiBi
slopes (sigma 1.41 .. 256), no GQA, head_dim 128, bfloat16 (2 bytes), one partition drawn
from ``--seed``, the sequence split in equal contiguous chunks.

* **computed** (every ``n`` x ``--ranks`` x ``--num-samples``, causal and bidirectional):
  :func:`plsh_fast.distributed.plan_context_parallel`, the code path that
  :func:`plsh_fast.distributed.context_parallel_plsh_attention` runs on every rank, gives
  the exact bytes each rank sends (``HaloPlan.bytes_sent``); reported as the largest over
  ranks. Against it: the ring-attention volume, every rank sending its K/V chunk to the
  ``P - 1`` others (``(P - 1) n / P`` tokens x 16 heads x (128 + 128) x 2 bytes), and the
  halo bound of ``proofs_notes/halo_bound.md``: the realised bound
  ``sum_h (ceil(max_t pitch_ht) - 1)`` per boundary and side, its law (per-head 0.99
  quantile of the largest pitch, :func:`plsh_ref.expectation.largest_pitch_quantile`,
  minus one, summed over heads), and the expected exact halo
  ``sum_h sum_b [1 - (1 - rho_h^b)^s]`` (iid samples).
* **measured** (``--measure-n`` x ``--measure-ranks``, CPU, gloo, causal): that many
  processes run :func:`plsh_fast.distributed.halo_exchange` forward and backward on
  random bfloat16 K/V; the bytes handed to ``torch.distributed.batch_isend_irecv`` are
  counted and must equal the plan's. The wall time of the exchange and, up to
  ``--gather-max`` tokens, of a ``torch.distributed.all_gather`` of the K/V chunks (ring
  attention's volume) are measured in the same run (median of ``--repeats``).

Results go to ``benchmarks/results/halo_<date>.json`` and ``.md`` with the date, machine
and provenance.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from plsh_fast.distributed import plan_context_parallel  # noqa: E402
from plsh_ref.alibi import alibi_slopes  # noqa: E402
from plsh_ref.expectation import expected_window_width, largest_pitch_quantile  # noqa: E402
from plsh_ref.partition import draw_partition  # noqa: E402

NUM_HEADS, HEAD_DIM, ELEMENT_SIZE, BATCH = 16, 128, 2, 1
TOKEN_BYTES = BATCH * (HEAD_DIM + HEAD_DIM) * ELEMENT_SIZE  # one (kv head, position) of K+V


def _bounds(n: int, ranks: int) -> list[tuple[int, int]]:
    edges = [n * r // ranks for r in range(ranks + 1)]
    return list(zip(edges[:-1], edges[1:]))


def ring_bytes(n: int, ranks: int) -> int:
    """Bytes one rank sends when every rank sends its K/V chunk to the ``P - 1`` others."""
    return (ranks - 1) * (n // ranks) * NUM_HEADS * TOKEN_BYTES


def computed_row(n: int, ranks: int, s: int, causal: bool, seed: int) -> dict:
    sigma = 1.0 / alibi_slopes(NUM_HEADS)
    partition = draw_partition(sigma, s, seed)
    t0 = time.perf_counter()
    plan = plan_context_parallel(partition, _bounds(n, ranks), causal=causal)
    plan_s = time.perf_counter() - t0
    sent = [
        plan.bytes_sent(
            r, batch=BATCH, head_dim=HEAD_DIM, head_dim_v=HEAD_DIM, element_size=ELEMENT_SIZE
        )
        for r in range(ranks)
    ]
    sides = 1 if causal else 2
    realised = int((np.ceil(partition.pitch.max(axis=1)) - 1).sum())
    quantile = sum(largest_pitch_quantile(0.99, sg, s) - 1.0 for sg in sigma)
    mean = sum(expected_window_width(sg, s, causal=True) - 1.0 for sg in sigma)
    ring = ring_bytes(n, ranks)
    return {
        "n": n,
        "ranks": ranks,
        "num_samples": s,
        "causal": causal,
        "halo_bytes_max": max(sent),
        "halo_bytes_mean": float(np.mean(sent)),
        "ring_bytes": ring,
        "ratio_ring_over_halo": ring / max(max(sent), 1),
        # per boundary side, summed over heads, in bytes (x sides for one rank)
        "bound_realised_bytes": sides * realised * TOKEN_BYTES,
        "bound_q99_bytes": sides * quantile * TOKEN_BYTES,
        "expected_halo_bytes": sides * mean * TOKEN_BYTES,
        "plan_seconds": plan_s,
    }


# --------------------------------------------------------------------------------------
# measured: one process per rank
# --------------------------------------------------------------------------------------


def worker(
    rank: int,
    world: int,
    store: str,
    n: int,
    s: int,
    seed: int,
    gather: bool,
    repeats: int,
    out: str,
) -> None:
    import torch
    import torch.distributed as dist

    from plsh_fast.distributed import halo_exchange

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=300),
    )
    partition = draw_partition(1.0 / alibi_slopes(NUM_HEADS), s, seed)
    plan = plan_context_parallel(partition, _bounds(n, world), causal=True)
    a, b = plan.bounds[rank]
    gen = torch.Generator().manual_seed(rank)
    key = torch.randn(BATCH, NUM_HEADS, b - a, HEAD_DIM, generator=gen).bfloat16()
    value = torch.randn(BATCH, NUM_HEADS, b - a, HEAD_DIM, generator=gen).bfloat16()
    key.requires_grad_()
    value.requires_grad_()
    counted = []
    original = dist.batch_isend_irecv

    def counting(ops):
        counted.extend(
            o.tensor.numel() * o.tensor.element_size() for o in ops if o.op is dist.isend
        )
        return original(ops)

    dist.batch_isend_irecv = counting
    forward_s, total_s = [], []
    for _ in range(repeats):
        counted.clear()
        dist.barrier()
        t0 = time.perf_counter()
        key_ext, value_ext = halo_exchange(key, value, plan)
        t1 = time.perf_counter()
        forward = sum(counted)
        (key_ext.sum() + value_ext.sum()).backward()
        t2 = time.perf_counter()
        backward = sum(counted) - forward
        dist.barrier()
        forward_s.append(t1 - t0)
        total_s.append(t2 - t0)
        key.grad = value.grad = None
    dist.batch_isend_irecv = original
    planned = plan.bytes_sent(
        rank, batch=BATCH, head_dim=HEAD_DIM, head_dim_v=HEAD_DIM, element_size=ELEMENT_SIZE
    )
    received = plan.tokens_received(rank) * TOKEN_BYTES
    result = {
        "rank": rank,
        "forward_bytes": forward,
        "backward_bytes": backward,
        "planned_bytes": planned,
        "planned_received_bytes": received,
        "forward_seconds": statistics.median(forward_s),
        "forward_backward_seconds": statistics.median(total_s),
    }
    if gather:
        kv = torch.cat([key.detach(), value.detach()], dim=-1).contiguous()
        gathered = [torch.empty_like(kv) for _ in range(world)]
        times = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_gather(gathered, kv)
            dist.barrier()
            times.append(time.perf_counter() - t0)
        result["all_gather_seconds"] = statistics.median(times)
        result["all_gather_bytes_per_rank"] = (world - 1) * kv.numel() * kv.element_size()
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(result, f)


def measured_row(n: int, world: int, s: int, seed: int, gather: bool, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    str(r),
                    str(world),
                    os.path.join(tmp, "store"),
                    str(n),
                    str(s),
                    str(seed),
                    str(int(gather)),
                    str(repeats),
                    os.path.join(tmp, f"{r}.json"),
                ]
            )
            for r in range(world)
        ]
        for p in procs:
            if p.wait(timeout=1800) != 0:
                raise SystemExit(f"halo_bench: a worker exited {p.returncode}")
        ranks = [json.load(open(os.path.join(tmp, f"{r}.json"))) for r in range(world)]
    for r in ranks:
        if r["forward_bytes"] != r["planned_bytes"] or (
            r["backward_bytes"] != r["planned_received_bytes"]
        ):
            raise SystemExit(f"halo_bench: rank {r['rank']} sent other bytes than planned: {r}")
    row = {
        "n": n,
        "ranks": world,
        "num_samples": s,
        "causal": True,
        "halo_bytes_max_measured": max(r["forward_bytes"] for r in ranks),
        "ring_bytes": ring_bytes(n, world),
        "forward_seconds_max": max(r["forward_seconds"] for r in ranks),
        "forward_backward_seconds_max": max(r["forward_backward_seconds"] for r in ranks),
        "per_rank": ranks,
    }
    if gather:
        row["all_gather_seconds_max"] = max(r["all_gather_seconds"] for r in ranks)
    return row


def _mib(x: float) -> str:
    return f"{x / 2**20:.3f}"


def markdown(result: dict) -> str:
    meta = result["provenance"]
    lines = [
        f"# Context-parallel halo exchange: bytes per rank ({result['date']})",
        "",
        f"Machine: {result['host']}, {meta['machine']['platform']}, "
        f"{meta['machine']['cpu_count']} CPUs; torch {result['torch']}; git "
        f"{meta['git_commit']}. Other processes shared the machine during the run.",
        "",
        "Configuration: batch 1, 16 heads (standard slopes, sigma 1.41..256), no GQA, "
        "head_dim 128, bfloat16, equal contiguous chunks, partition seed "
        f"{result['seed']}. Generated by `{' '.join(meta['argv'])}`.",
        "",
        "## Computed (the plan of `plsh_fast.distributed`, no communication)",
        "",
        "Halo: the largest number of bytes any rank sends in one forward exchange (the "
        "backward returns as many gradient bytes). Ring: a rank sending its K/V chunk to "
        "the P - 1 others (ring attention / all-gather). Bound: "
        "`sum_h (ceil(max_t pitch) - 1)` tokens per side for this partition; q99: the "
        "per-head 0.99 quantile of the largest pitch minus one, summed; expected: the "
        "exact mean halo (iid samples). MiB.",
        "",
        "| n | P | s | causal | halo (max) | ring | ring / halo | bound (this draw) "
        "| bound q99 | expected halo |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["computed"]:
        lines.append(
            f"| {r['n']} | {r['ranks']} | {r['num_samples']} | {r['causal']} | "
            f"{_mib(r['halo_bytes_max'])} | {_mib(r['ring_bytes'])} | "
            f"{r['ratio_ring_over_halo']:.0f} | {_mib(r['bound_realised_bytes'])} | "
            f"{_mib(r['bound_q99_bytes'])} | {_mib(r['expected_halo_bytes'])} |"
        )
    lines += [
        "",
        "## Measured (CPU, gloo, causal; `halo_exchange` forward + backward)",
        "",
        "Bytes counted at `torch.distributed.batch_isend_irecv`; every rank sent exactly "
        "its planned bytes (checked). Times: median over repeats, slowest rank, on a "
        "shared 2-core machine (orientation only; the two times of a row come from the "
        "same run). The exchange time includes building the contiguous [halo + local] key and "
        "value tensors (a copy of the local chunk); the "
        "backward adds the gradient slices and their return.",
        "",
        "| n | P | s | halo bytes (max, measured) | ring bytes | exchange fwd s "
        "| exchange fwd+bwd s | all_gather K/V s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["measured"]:
        gather = f"{r['all_gather_seconds_max']:.3f}" if "all_gather_seconds_max" in r else "-"
        lines.append(
            f"| {r['n']} | {r['ranks']} | {r['num_samples']} | "
            f"{r['halo_bytes_max_measured']} | {r['ring_bytes']} | "
            f"{r['forward_seconds_max']:.3f} | {r['forward_backward_seconds_max']:.3f} | "
            f"{gather} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--worker":
        a = sys.argv[2:]
        worker(
            int(a[0]),
            int(a[1]),
            a[2],
            int(a[3]),
            int(a[4]),
            int(a[5]),
            bool(int(a[6])),
            int(a[7]),
            a[8],
        )
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[65536, 262144, 1048576])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--num-samples", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--measure-n", type=int, nargs="*", default=[65536, 262144])
    parser.add_argument("--measure-ranks", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--measure-num-samples", type=int, default=16)
    parser.add_argument(
        "--gather-max",
        type=int,
        default=65536,
        help="largest n whose all_gather of K/V is timed (default 65536)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="partition seed (default 0)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    import torch

    from plsh_ref.provenance import run_metadata

    computed = [
        computed_row(n, p, s, causal, args.seed)
        for causal in (True, False)
        for n in args.n
        for p in args.ranks
        for s in args.num_samples
    ]
    measured = [
        measured_row(n, p, args.measure_num_samples, args.seed, n <= args.gather_max, args.repeats)
        for n in args.measure_n
        for p in args.measure_ranks
    ]
    today = _dt.date.today().isoformat()
    result = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "torch": torch.__version__,
        "seed": args.seed,
        "config": {
            "batch": BATCH,
            "num_heads": NUM_HEADS,
            "head_dim": HEAD_DIM,
            "dtype": "bfloat16",
        },
        "computed": computed,
        "measured": measured,
        "provenance": run_metadata(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"halo_{today}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
