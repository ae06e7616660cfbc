"""One rank of the context-parallel tests (``tests/fast/test_distributed.py`` starts the ranks).

``python tests/_distributed_worker.py RANK WORLD_SIZE STORE_FILE OUT_DIR`` joins a gloo
process group (file rendezvous, every collective bounded by a timeout), runs every case
below and writes ``OUT_DIR/rank<RANK>.json``: per case, either the measured errors and
allowed errors of the SPEC section 6 tolerance rule, or the error message it raised. The
test process asserts on those files, so a failure names the case and the rank.

Every rank builds the same global problem from the case's seed and compares its slice of
the distributed result with autograd of the dense float64 reference on the whole sequence
(``softmax(scale q k^T + log M~) v`` with the same partition; the yardstick is the same
dense formula in float32).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import plsh_fast.distributed as D  # noqa: E402
from plsh_fast import plsh_attention  # noqa: E402
from plsh_fast.peers import dense_attention  # noqa: E402
from plsh_ref.partition import count_bias, counts, draw_partition  # noqa: E402
from plsh_ref.testing.tolerance import allowed_error, max_error  # noqa: E402

TIMEOUT_S = 60


def dense(q, k, v, pos, partition, causal, scale, dtype):
    """Dense softmax(scale q k^T + log M~) v and its LSE in ``dtype``, with autograd
    (:func:`plsh_fast.peers.dense_attention`)."""
    q, k, v = (torch.from_numpy(x).to(dtype).requires_grad_() for x in (q, k, v))
    bias = count_bias(counts(partition, pos, pos, causal=causal), partition.num_samples)
    out, lse = dense_attention(q, k, v, bias=bias, scale=scale, return_lse=True)
    return (q, k, v), out, lse


def run_case(case: dict, rank: int, world: int) -> dict:
    lengths = case["lengths"][str(world)]
    n = sum(lengths)
    rng = np.random.default_rng(case["seed"])
    batch, h, hkv, d, dv = case["batch"], case["heads"], case["heads_kv"], 8, 6
    q64 = rng.standard_normal((batch, h, n, d))
    k64 = rng.standard_normal((batch, hkv, n, d))
    v64 = rng.standard_normal((batch, hkv, n, dv))
    go = rng.standard_normal((batch, h, n, dv))
    gl = rng.standard_normal((batch, h, n))
    sigma = np.array(case["sigma"], dtype=np.float64)
    partition = draw_partition(sigma, case["num_samples"], case["seed"])
    causal, scale = case["causal"], d**-0.5
    # chunks: rank order given by case["order"] (a permutation), positions from `origin`
    order = case.get("order", {}).get(str(world), list(range(world)))
    starts = np.cumsum([0] + [lengths[r] for r in order])
    start_of = {r: case.get("origin", 0) + int(starts[i]) for i, r in enumerate(order)}
    lo = start_of[rank] - case.get("origin", 0)
    sl = slice(lo, lo + lengths[rank])
    pos = case.get("origin", 0) + np.arange(n)

    def local(x):
        return torch.from_numpy(np.ascontiguousarray(x[:, :, sl])).float().requires_grad_()

    q, k, v = local(q64), local(k64), local(v64)
    kwargs = {"causal": causal, "scale": scale, "return_lse": True}
    if case.get("draw_from_seed"):
        kwargs.update(slopes=1.0 / sigma, num_samples=case["num_samples"], seed=case["seed"])
    else:
        kwargs["partition"] = partition
    if "origin" in case or "order" in case:
        kwargs["chunk_start"] = start_of[rank]
    sent = []
    original = dist.batch_isend_irecv

    def counting(ops):
        sent.extend(
            op.tensor.numel() * op.tensor.element_size() for op in ops if op.op is dist.isend
        )
        return original(ops)

    dist.batch_isend_irecv = counting
    try:
        out, lse = D.context_parallel_plsh_attention(q, k, v, **kwargs)
        forward_bytes = sum(sent)
        loss = (out * torch.from_numpy(go[:, :, sl]).float()).sum()
        loss = loss + (lse * torch.from_numpy(gl[:, :, sl]).float()).sum()
        loss.backward()
    finally:
        dist.batch_isend_irecv = original
    bounds = [(start_of[r], start_of[r] + lengths[r]) for r in range(world)]
    plan = D.plan_context_parallel(partition, bounds, causal=causal, num_heads_kv=hkv)
    result = {
        "forward_bytes": forward_bytes,
        "backward_bytes": sum(sent) - forward_bytes,
        "planned_bytes": plan.bytes_sent(
            rank, batch=batch, head_dim=d, head_dim_v=dv, element_size=4
        ),
        "planned_received_bytes": plan.tokens_received(rank) * batch * (d + dv) * 4,
        "sources": [src for src in range(world) if plan.tokens(src, rank)],
        "halo_tokens": plan.tokens_received(rank),
    }
    # the single-process fast path on the whole sequence, and the dense references
    full = [torch.from_numpy(x).float() for x in (q64, k64, v64)]
    single_out, single_lse = plsh_attention(
        *full,
        partition=partition,
        causal=causal,
        scale=scale,
        query_positions=pos,
        key_positions=pos,
        return_lse=True,
    )
    (q_r, k_r, v_r), ref, ref_lse = dense(
        q64, k64, v64, pos, partition, causal, scale, torch.float64
    )
    ((ref * torch.from_numpy(go)).sum() + (ref_lse * torch.from_numpy(gl)).sum()).backward()
    (q_b, k_b, v_b), base, base_lse = dense(
        q64, k64, v64, pos, partition, causal, scale, torch.float32
    )
    (
        (base * torch.from_numpy(go).float()).sum()
        + (base_lse * torch.from_numpy(gl).float()).sum()
    ).backward()
    grad_scale = max(float(g.grad.abs().max()) for g in (q_r, k_r, v_r))
    checks = {
        "output": (out, ref[:, :, sl], base[:, :, sl], None),
        "single_process_output": (single_out[:, :, sl], ref[:, :, sl], base[:, :, sl], None),
        "lse": (lse, ref_lse[:, :, sl], base_lse[:, :, sl], None),
        "single_process_lse": (single_lse[:, :, sl], ref_lse[:, :, sl], base_lse[:, :, sl], None),
        "grad_query": (q.grad, q_r.grad[:, :, sl], q_b.grad[:, :, sl], grad_scale),
        "grad_key": (k.grad, k_r.grad[:, :, sl], k_b.grad[:, :, sl], grad_scale),
        "grad_value": (v.grad, v_r.grad[:, :, sl], v_b.grad[:, :, sl], grad_scale),
    }
    for name, (got, want, yard, floor_scale) in checks.items():
        got, want, yard = (t.detach().numpy() for t in (got, want, yard))
        result[name] = {
            "error": max_error(got, want)[0],
            "allowed": allowed_error(want, yard, "float32", floor_scale=floor_scale),
        }
    return result


def run_error_case(case: dict, rank: int, world: int) -> dict:
    """Run a call that must fail; return the exception type and message on this rank."""
    n = 6
    q = torch.randn(1, 2, n, 4)
    part = draw_partition(np.array([4.0, 8.0]), 4, case.get("seed_of", {}).get(str(rank), 0))
    kwargs = {"partition": part}
    kind = case["kind"]
    if kind == "overlap":
        kwargs["chunk_start"] = 0
    elif kind == "gap":
        kwargs["chunk_start"] = rank * (n + 1)
    elif kind == "start_on_rank0_only" and rank == 0:
        kwargs["chunk_start"] = 0
    elif kind == "bad_dtype_on_rank1" and rank == 1:
        q = q.to(torch.int32)
    elif kind == "causal_disagrees":
        kwargs["causal"] = rank == 0
    try:
        D.context_parallel_plsh_attention(q, q, q, **kwargs)
    except (TypeError, ValueError) as exc:
        return {"type": type(exc).__name__, "message": str(exc)}
    return {"type": None, "message": ""}


def run_control(case: dict, rank: int, world: int) -> dict:
    """Negative control: a halo one token too narrow per head must break the output."""
    original = D.key_reach

    def narrow(partition, start, stop, **kw):
        first, last = original(partition, start, stop, **kw)
        return np.minimum(first + 1, start), last

    D.key_reach = narrow
    try:
        return run_case(case, rank, world)
    finally:
        D.key_reach = original


def main() -> None:
    rank, world, store, out_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    with open(os.path.join(out_dir, "cases.json")) as f:
        cases = json.load(f)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=TIMEOUT_S),
    )
    results, crashed = {}, None
    try:
        for name, case in cases.items():
            runner = {"error": run_error_case, "control": run_control}.get(
                case.get("type"), run_case
            )
            if crashed:  # the ranks' collectives may be out of step: run nothing more
                results[name] = {"crash": f"not run: case {crashed!r} crashed first"}
                continue
            try:
                results[name] = runner(case, rank, world)
            except Exception:  # reported to the test, which fails naming the case
                results[name] = {"crash": traceback.format_exc()}
                crashed = name
    finally:
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
