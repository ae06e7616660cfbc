"""Context parallelism: one sequence split over 2 gloo processes (plsh_fast.distributed).

What it shows: ``context_parallel_plsh_attention`` is called on every rank with that
rank's contiguous chunk of the sequence. Each rank receives from the others only the keys
its queries can reach (the halo, at most ``ceil(max pitch) - 1`` positions per side, by
point-to-point messages), so no rank ever holds the whole sequence, and yet each rank's
output and gradients are those of ``plsh_fast.plsh_attention`` on the whole sequence
(same partition sample, global positions). The script starts 2 CPU processes with
``torch.multiprocessing``, joins them in a gloo group (file rendezvous), runs forward and
backward, and compares every rank's slice with a single-process call.

Run::

    python examples/context_parallel.py               # seq_len 2048
    PLSH_EXAMPLE_TINY=1 python examples/context_parallel.py   # seq_len 96 (what CI runs)
"""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import plsh_fast
from plsh_fast.distributed import context_parallel_plsh_attention, plan_context_parallel
from plsh_ref.alibi import alibi_slopes
from plsh_ref.partition import draw_partition

TINY = os.environ.get("PLSH_EXAMPLE_TINY") == "1"
WORLD_SIZE = 2
BATCH, NUM_HEADS, HEAD_DIM = 1, 4, 16
SEQ_LEN = 96 if TINY else 2048
NUM_SAMPLES = 8


def problem() -> tuple[torch.Tensor, ...]:
    """The whole problem, the same on every rank (one seed): q, k, v and an output gradient."""
    generator = torch.Generator().manual_seed(0)
    shape = (BATCH, NUM_HEADS, SEQ_LEN, HEAD_DIM)
    return tuple(torch.randn(shape, generator=generator, dtype=torch.float64) for _ in range(4))


def rank_main(rank: int, store_file: str) -> None:
    """One rank: join the group, attend over its chunk, check it against one process."""
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store_file}",
        rank=rank,
        world_size=WORLD_SIZE,
        timeout=timedelta(seconds=60),
    )
    try:
        # every rank draws the same partition (same seed); a mismatch is refused
        partition = draw_partition(1.0 / alibi_slopes(NUM_HEADS), NUM_SAMPLES, seed=0)
        q, k, v, grad = problem()
        chunk = SEQ_LEN // WORLD_SIZE
        mine = slice(rank * chunk, (rank + 1) * chunk)
        q_local, k_local, v_local = (x[:, :, mine].clone().requires_grad_() for x in (q, k, v))

        out = context_parallel_plsh_attention(q_local, k_local, v_local, partition=partition)
        out.backward(grad[:, :, mine])

        # the single-process result on the whole sequence, restricted to this chunk
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        full = plsh_fast.plsh_attention(q, k, v, partition=partition, backend="cpu")
        full.backward(grad)
        plan = plan_context_parallel(partition, [(r * chunk, (r + 1) * chunk) for r in range(2)])
        pairs = {
            "out": (out, full[:, :, mine]),
            "grad query": (q_local.grad, q.grad[:, :, mine]),
            "grad key": (k_local.grad, k.grad[:, :, mine]),
            "grad value": (v_local.grad, v.grad[:, :, mine]),
        }
        errors = {name: float((a - b).abs().max()) for name, (a, b) in pairs.items()}
        report = ", ".join(f"{name} {e:.1e}" for name, e in errors.items())
        print(
            f"rank {rank}: positions {mine.start}..{mine.stop - 1}, "
            f"received {plan.tokens_received(rank)} halo keys (summed over kv heads); max error {report}",
            flush=True,
        )
        for name, e in errors.items():
            assert e < 1e-10, (rank, name, e)  # float64, summation order only
    finally:
        dist.destroy_process_group()


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        store_file = os.path.join(folder, "store")
        # join=True re-raises a rank's exception here (exit status 1)
        mp.spawn(rank_main, args=(store_file,), nprocs=WORLD_SIZE, join=True)
    print("every rank agrees with the single-process attention")


if __name__ == "__main__":
    main()
