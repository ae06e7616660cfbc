"""Context parallelism (:mod:`plsh_fast.distributed`) in one process, ranks as threads.

``tests/fast/test_distributed.py`` runs the real thing (gloo process groups of spawned
processes) against the float64 reference; those processes are out of reach of an
in-process check of the exchange. Here the module's ``torch.distributed`` is replaced by
an in-memory stand-in (:class:`_World`: point-to-point messages in FIFO queues, an
``all_gather`` through a barrier) and the ranks run as threads of this process, so that
every step of :func:`~plsh_fast.distributed.context_parallel_plsh_attention` and
:func:`~plsh_fast.distributed.halo_exchange` runs here:

* each rank's output, LSE and query/key/value gradients equal those of the single-process
  :func:`plsh_fast.plsh_attention` on the whole sequence (float64; both sum the same
  nonzero terms, so they agree to float64 rounding, checked at ``1e-12`` relative, far
  below any effect of a missing or misplaced key);
* the bytes each rank sends are the plan's (``HaloPlan.bytes_sent``), forward and backward;
* every refusal is raised before any message, naming its argument, and a rank whose
  arguments are refused makes every other rank raise ``group: rank r refused ...``.

Deterministic (fixed seeds); a rank that waits for a message that never comes fails after
``WAIT_S`` seconds instead of hanging.
"""

from __future__ import annotations

import queue
import re
import threading
import time
import types

import numpy as np
import pytest
import torch

import plsh_fast.distributed as D
from plsh_fast import plsh_attention
from plsh_ref.partition import draw_partition

WAIT_S = 30.0


class _World:
    """In-memory collectives for ``size`` ranks run as threads (the parts of
    ``torch.distributed`` the module calls)."""

    def __init__(self, size: int):
        self.size = size
        self.barrier = threading.Barrier(size, timeout=WAIT_S)
        self.slots: list = [None] * size
        self.queues = {(s, d): queue.Queue() for s in range(size) for d in range(size)}
        self.sent = [0] * size  # bytes handed to isend, per rank
        self.lock = threading.Lock()
        self.waiting = 0  # ranks blocked in a receive or a collective, or finished
        self.done = 0
        self.gathers = [0] * size  # all_gather calls, per rank
        self.isend, self.irecv = "isend", "irecv"
        self.devices: set = set()  # of every tensor handed to a collective

    # the torch.distributed functions the module uses -------------------------------------
    def is_available(self):
        return True

    def is_initialized(self):
        return True

    def get_rank(self, group):
        return group.rank

    def get_world_size(self, group):
        # the tests' ranks are a subgroup: the default group (None) is larger
        return self.size if group is not None else self.size + 1

    def P2POp(self, op, tensor, group, group_peer):  # noqa: N802 (torch's name)
        return types.SimpleNamespace(op=op, tensor=tensor, group=group, peer=group_peer)

    def batch_isend_irecv(self, ops):
        self.devices.update(op.tensor.device for op in ops)
        for op in ops:
            if op.op == "isend":
                self.sent[op.group.rank] += op.tensor.numel() * op.tensor.element_size()
                self.queues[(op.group.rank, op.peer)].put(op.tensor.clone())
        for op in ops:
            if op.op == "irecv":
                buf = self._receive(op.peer, op.group.rank)
                assert buf.shape == op.tensor.shape, "a message of another size"
                op.tensor.copy_(buf)
        return [types.SimpleNamespace(wait=lambda: None) for _ in ops]

    def _receive(self, src, dst):
        """The next message from ``src``; a deadlock (every other rank blocked or finished,
        nothing sent) fails at once instead of after ``WAIT_S``."""
        box = self.queues[(src, dst)]
        with self.lock:
            self.waiting += 1
        try:
            deadline = time.monotonic() + WAIT_S
            idle = 0
            while True:
                try:
                    return box.get(timeout=0.02)
                except queue.Empty:
                    pass
                with self.lock:
                    stuck = self.waiting + self.done == self.size and box.empty()
                idle = idle + 1 if stuck else 0
                if idle >= 25 or time.monotonic() > deadline:  # 0.5 s with nothing to come
                    raise RuntimeError(f"rank {dst} waits for a message from {src} never sent")
        finally:
            with self.lock:
                self.waiting -= 1

    def _wait(self):
        """A barrier wait that fails at once when a finished rank can never reach it."""
        with self.lock:
            self.waiting += 1
        try:
            while True:
                try:
                    self.barrier.wait(timeout=0.05)
                    return
                except threading.BrokenBarrierError:
                    with self.lock:
                        if self.done:
                            raise RuntimeError("a rank finished while the others wait") from None
                    if self.barrier.broken:
                        self.barrier.reset()
        finally:
            with self.lock:
                self.waiting -= 1

    def _gather(self, rank, value):
        self._wait()
        self.slots[rank] = value
        self._wait()
        values = list(self.slots)
        self._wait()
        return values

    def all_gather(self, out, vec, group):
        self.devices.update(t.device for t in [vec, *out])
        self.gathers[group.rank] += 1
        for dst, src in zip(out, self._gather(group.rank, vec.clone())):
            dst.copy_(src)

    def all_gather_object(self, out, obj, group):
        out[:] = self._gather(group.rank, obj)


def _run(world: _World, work):
    """``work(rank)`` on one thread per rank; the results (or raised exceptions) by rank."""
    results: list = [None] * world.size

    def target(rank):
        try:
            results[rank] = work(rank)
        except BaseException as exc:  # noqa: BLE001 (reported to the test)
            results[rank] = exc
        finally:
            with world.lock:
                world.done += 1

    threads = [threading.Thread(target=target, args=(r,)) for r in range(world.size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=4 * WAIT_S)
    assert not any(t.is_alive() for t in threads), "a rank did not finish"
    return results


@pytest.fixture
def world(monkeypatch):
    def make(size):
        w = _World(size)
        monkeypatch.setattr(D, "dist", w)
        return w

    return make


def _group(rank):
    return types.SimpleNamespace(rank=rank)


def _inputs(n, heads=4, heads_kv=2, d=8, dv=6, batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, n, d, generator=g, dtype=torch.float64)
    k = torch.randn(batch, heads_kv, n, d, generator=g, dtype=torch.float64)
    v = torch.randn(batch, heads_kv, n, dv, generator=g, dtype=torch.float64)
    grad = torch.randn(batch, heads, n, dv, generator=g, dtype=torch.float64)
    grad_lse = torch.randn(batch, heads, n, generator=g, dtype=torch.float64)
    return q, k, v, grad, grad_lse


def _close(got, want, what):
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=lambda m: f"{what}: {m}")


CASES = {
    # lengths per rank, chunk order (None: rank order from 0), origin, causal, sigma
    "causal_uneven": ([29, 60, 11], None, 0, True, [2.0, 6.0, 20.0, 60.0]),
    "bidirectional_permuted_offset": ([20, 0, 33, 17], [2, 0, 3, 1], 500, False, [3.0, 40.0]),
    "causal_halo_beyond_a_chunk": ([3, 3, 50], None, 0, True, [40.0, 90.0]),
    "bidirectional_tiny_chunks": ([30, 4, 4, 30], None, 0, False, [30.0, 30.0, 30.0, 30.0]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_rank_equals_the_whole_sequence_on_its_chunk(world, name):
    lengths, order, origin, causal, sigma = CASES[name]
    heads = 4
    partition = draw_partition(np.resize(np.asarray(sigma), heads), 6, seed=3)
    n = sum(lengths)
    q, k, v, grad, grad_lse = _inputs(n)
    # the chunks in `order` along the sequence (rank r holds the order.index(r)-th chunk)
    order = list(range(len(lengths))) if order is None else order
    starts, pos = {}, origin
    for r in order:
        starts[r] = pos
        pos += lengths[r]
    given_start = origin != 0 or order != sorted(order)
    whole = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = plsh_attention(
        *whole,
        partition=partition,
        causal=causal,
        query_positions=torch.arange(origin, origin + n),
        key_positions=torch.arange(origin, origin + n),
        return_lse=True,
        backend="cpu",
    )
    (out * grad).sum().add_((lse * grad_lse).sum()).backward()
    w = world(len(lengths))

    def work(rank):
        sl = slice(starts[rank] - origin, starts[rank] - origin + lengths[rank])
        mine = [t[:, :, sl].clone().requires_grad_(True) for t in (q, k, v)]
        o, s = D.context_parallel_plsh_attention(
            *mine,
            partition=partition,
            causal=causal,
            chunk_start=starts[rank] if given_start else None,
            return_lse=True,
            backend="cpu",
            group=_group(rank),
        )
        forward_bytes = w.sent[rank]
        (o * grad[:, :, sl]).sum().add_((s * grad_lse[:, :, sl]).sum()).backward()
        return sl, o.detach(), s.detach(), [t.grad for t in mine], forward_bytes

    results = _run(w, work)
    bounds = [(starts[r], starts[r] + lengths[r]) for r in range(len(lengths))]
    plan = D.plan_context_parallel(partition, bounds, causal=causal, num_heads_kv=2)
    for rank, res in enumerate(results):
        assert not isinstance(res, BaseException), f"rank {rank}: {res!r}"
        sl, o, s, grads, forward_bytes = res
        _close(o, out.detach()[:, :, sl], f"rank {rank} output")
        _close(s, lse.detach()[:, :, sl], f"rank {rank} lse")
        for what, got, ref in zip(("query", "key", "value"), grads, whole):
            _close(got, ref.grad[:, :, sl], f"rank {rank} grad_{what}")
        planned = plan.bytes_sent(rank, batch=2, head_dim=8, head_dim_v=6, element_size=8)
        assert forward_bytes == planned, rank
        # the backward returns the gradients of the halo received: its bytes, to the owners
        received = plan.tokens_received(rank) * 2 * (8 + 6) * 8
        assert w.sent[rank] - forward_bytes == received, rank
    assert sum(plan.tokens_received(r) for r in range(len(lengths))) > 0
    assert w.gathers == [1] * len(lengths)  # one all_gather per call


def test_without_chunk_start_the_chunks_follow_in_rank_order(world):
    partition = draw_partition([5.0, 5.0], 4, seed=1)
    q, k, v, _, _ = _inputs(30, heads=2, heads_kv=2)
    want = plsh_attention(q, k, v, partition=partition, backend="cpu")
    w = world(3)
    cuts = [0, 7, 7, 30]  # rank 1 holds no token

    def work(rank):
        sl = slice(cuts[rank], cuts[rank + 1])
        out = D.context_parallel_plsh_attention(
            q[:, :, sl], k[:, :, sl], v[:, :, sl], partition=partition, group=_group(rank)
        )
        return sl, out

    for rank, res in enumerate(_run(w, work)):
        assert not isinstance(res, BaseException), f"rank {rank}: {res!r}"
        sl, out = res
        assert out.shape == (2, 2, sl.stop - sl.start, 6)
        _close(out, want[:, :, sl], f"rank {rank}")


def test_the_partition_drawn_from_a_seed_is_the_single_process_one(world):
    slopes = np.array([0.5, 0.05])
    q, k, v, _, _ = _inputs(24, heads=2, heads_kv=1)
    want = plsh_attention(q, k, v, slopes=slopes, num_samples=4, seed=9, backend="cpu")
    w = world(2)

    def work(rank):
        sl = slice(12 * rank, 12 * rank + 12)
        return D.context_parallel_plsh_attention(
            q[:, :, sl],
            k[:, :, sl],
            v[:, :, sl],
            slopes=slopes,
            num_samples=4,
            seed=9,
            scale=0.7,
            group=_group(rank),
        )

    want = plsh_attention(q, k, v, slopes=slopes, num_samples=4, seed=9, scale=0.7)
    for rank, out in enumerate(_run(w, work)):
        assert not isinstance(out, BaseException), f"rank {rank}: {out!r}"
        _close(out, want[:, :, 12 * rank : 12 * rank + 12], f"rank {rank}")


# ----------------------------------------------------------------------------- refusals


def _refused(world, size, changes, n=8):
    """Run every rank with ``changes[rank]`` (keyword overrides); the exceptions by rank."""
    partition = draw_partition([4.0, 8.0], 4, seed=2)
    q, k, v, _, _ = _inputs(n * size, heads=2, heads_kv=2, batch=1)
    w = world(size)

    def work(rank):
        sl = slice(n * rank, n * rank + n)
        kwargs = dict(partition=partition, group=_group(rank))
        args = [q[:, :, sl], k[:, :, sl], v[:, :, sl]]
        for key, value in changes.get(rank, {}).items():
            if key in ("query", "key", "value"):
                args[("query", "key", "value").index(key)] = value(args)
            else:
                kwargs[key] = value
        D.context_parallel_plsh_attention(*args, **kwargs)
        return None

    results = _run(w, work)
    if any(r is not None for r in results):
        assert w.sent == [0] * size  # refused before any point-to-point message
    return results


@pytest.mark.parametrize(
    "changes, messages",
    [
        (
            {1: {"causal": False}},
            [r"^causal: ranks disagree \(per rank: \[1, 0\]\)$"] * 2,
        ),
        ({0: {"scale": 0.5}}, [r"^scale: ranks disagree"] * 2),
        (
            {1: {"partition": draw_partition([4.0, 8.0], 4, seed=3)}},
            [
                r"^partition: ranks disagree on the partition sample \(checksums differ\); "
                r"draw it from the same seed and sampler on every rank \(per rank: \[\d+, \d+\]\)$"
            ]
            * 2,
        ),
        ({0: {"chunk_start": 0}}, [r"^chunk_start: given on some ranks and not on others"] * 2),
        ({0: {"chunk_start": 0}, 1: {"chunk_start": 4}}, [r"^chunk_start: the chunks do not"] * 2),
        ({0: {"chunk_start": 8}, 1: {"chunk_start": 20}}, [r"^chunk_start: the chunks do not"] * 2),
        (
            {
                1: {
                    "query": lambda a: a[0].float(),
                    "key": lambda a: a[1].float(),
                    "value": lambda a: a[2].float(),
                }
            },
            [r"^query: ranks disagree on the dtype"] * 2,
        ),
        (
            {1: {"key": lambda a: a[1][:, :1], "value": lambda a: a[2][:, :1]}},
            [r"^num_heads_kv: ranks disagree"] * 2,
        ),
        (
            {1: {"value": lambda a: a[2][..., :3]}},
            [r"^head_dim_v: ranks disagree"] * 2,
        ),
        (
            {
                0: {
                    "query": lambda a: torch.cat([a[0], a[0]], dim=0),
                    "key": lambda a: torch.cat([a[1], a[1]], dim=0),
                    "value": lambda a: torch.cat([a[2], a[2]], dim=0),
                }
            },
            [r"^batch: ranks disagree"] * 2,
        ),
    ],
    ids=[
        "causal",
        "scale",
        "partition",
        "start_on_one_rank",
        "overlap",
        "gap",
        "dtype",
        "kv_heads",
        "head_dim_v",
        "batch",
    ],
)
def test_ranks_that_disagree_all_raise_the_same_error(world, changes, messages):
    results = _refused(world, 2, changes)
    for rank, (res, match) in enumerate(zip(results, messages)):
        assert isinstance(res, ValueError), f"rank {rank}: {res!r}"
        assert re.search(match, str(res)), (rank, str(res))


@pytest.mark.parametrize(
    "changes, bad, own, others",
    [
        (
            {1: {"query": lambda a: a[0].to(torch.int64)}},
            1,
            (TypeError, r"^query: "),
            r"^group: rank 1 refused its arguments: query: ",
        ),
        (
            {1: {"key": lambda a: a[1][:, :, :5], "value": lambda a: a[2][:, :, :5]}},
            1,
            (
                ValueError,
                r"^key: holds 5 positions, query 8: every rank holds the queries "
                r"and keys of the same chunk \(self-attention\)$",
            ),
            r"^group: rank 1 refused its arguments: key: holds 5 positions",
        ),
        (
            {0: {"partition": None}},
            0,
            (
                ValueError,
                r"^seed: required when no partition is given \(every rank must draw the same "
                r"partition sample\)$",
            ),
            r"^group: rank 0 refused its arguments: seed: required",
        ),
        (
            {0: {"chunk_start": 2**53 - 8}, 1: {"chunk_start": 0}},  # end 2**53: refused
            0,
            (ValueError, r"^chunk_start: positions must have magnitude < 2\*\*53$"),
            r"^group: rank 0 refused its arguments: chunk_start: positions must have",
        ),
        (
            {1: {"query": lambda a: a[0].clone().fill_(float("nan"))}},
            1,
            (ValueError, r"^query: "),
            r"^group: rank 1 refused its arguments: query: ",
        ),
        (
            {1: {"causal": "yes"}},
            1,
            (TypeError, r"^causal: "),
            r"^group: rank 1 refused its arguments: causal: ",
        ),
        (
            {1: {"check_finite": 1}},
            1,
            (TypeError, r"^check_finite: "),
            r"^group: rank 1 refused its arguments: check_finite: ",
        ),
        (
            {0: {"chunk_start": 0.0}, 1: {"chunk_start": 8}},
            0,
            (TypeError, r"^chunk_start: must be an integer, got float 0\.0$"),
            r"^group: rank 0 refused its arguments: chunk_start: must be an integer",
        ),
    ],
    ids=[
        "dtype",
        "key_length",
        "seed",
        "start_range",
        "nan",
        "causal",
        "check_finite",
        "start_type",
    ],
)
def test_a_refused_rank_raises_its_error_and_the_others_name_it(world, changes, bad, own, others):
    results = _refused(world, 2, changes)
    for rank, res in enumerate(results):
        if rank == bad:
            assert isinstance(res, own[0]) and re.search(own[1], str(res)), (rank, res)
        else:
            assert isinstance(res, ValueError) and re.search(others, str(res)), (rank, res)


@pytest.mark.parametrize(
    "changes, got",
    [
        ({"query": lambda a: _wide(a[0]), "key": lambda a: _wide(a[1])}, 257),
        ({"value": lambda a: _wide(a[2])}, 257),
    ],
    ids=["head_dim", "head_dim_v"],
)
def test_the_triton_head_dim_limit_is_checked_on_both_head_dims(world, monkeypatch, changes, got):
    # the Triton backend on CPU tensors is the interpreter: allowed with TRITON_INTERPRET=1
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    results = _refused(world, 2, {1: {"backend": "triton", **changes}})
    own = rf"^backend: head_dim up to 256 on the Triton path, got {got}$"
    assert isinstance(results[1], ValueError) and re.search(own, str(results[1])), results[1]
    others = r"^group: rank 1 refused its arguments: backend: head_dim up to 256"
    assert isinstance(results[0], ValueError) and re.search(others, str(results[0])), results[0]


def _wide(x):
    """``x`` with 257 features (one past the Triton path's head_dim limit)."""
    return torch.zeros(*x.shape[:3], 257, dtype=x.dtype)


def test_an_explicit_chunk_start_of_zero_is_position_zero(world):
    partition = draw_partition([5.0, 9.0], 4, seed=4)
    q, k, v, _, _ = _inputs(20, heads=2, heads_kv=2)
    want = plsh_attention(q, k, v, partition=partition, backend="cpu")
    w = world(2)
    cuts = [0, 11, 20]

    def work(rank):
        sl = slice(cuts[rank], cuts[rank + 1])
        return sl, D.context_parallel_plsh_attention(
            q[:, :, sl],
            k[:, :, sl],
            v[:, :, sl],
            partition=partition,
            chunk_start=cuts[rank],  # 0 on rank 0
            group=_group(rank),
        )

    for rank, res in enumerate(_run(w, work)):
        assert not isinstance(res, BaseException), f"rank {rank}: {res!r}"
        sl, out = res
        _close(out, want[:, :, sl], f"rank {rank}")


def test_the_collectives_buffers_are_on_the_inputs_device(world, monkeypatch):
    """NCCL takes only tensors on the rank's GPU: the metadata vector and the receive
    buffers are made on the inputs' device, not on the default one. Here the default device
    is ``meta`` while they are made (the CPU inputs stand for CUDA inputs); a buffer made
    there holds no data and is seen by the stand-in."""
    for name in ("_gather_meta", "_point_to_point"):
        real = getattr(D, name)

        def under_meta(*args, _real=real, **kwargs):
            with torch.device("meta"):
                return _real(*args, **kwargs)

        monkeypatch.setattr(D, name, under_meta)
    partition = draw_partition([4.0, 30.0], 4, seed=6)
    q, k, v, _, _ = _inputs(24, heads=2, heads_kv=2)
    want = plsh_attention(q, k, v, partition=partition, backend="cpu")
    w = world(2)

    def work(rank):
        sl = slice(12 * rank, 12 * rank + 12)
        return D.context_parallel_plsh_attention(
            q[:, :, sl], k[:, :, sl], v[:, :, sl], partition=partition, group=_group(rank)
        )

    results = _run(w, work)
    assert w.devices == {torch.device("cpu")}
    for rank, out in enumerate(results):
        assert not isinstance(out, BaseException), f"rank {rank}: {out!r}"
        _close(out, want[:, :, 12 * rank : 12 * rank + 12], f"rank {rank}")
    assert sum(w.sent) > 0  # the halo was exchanged


def test_a_chunk_start_at_the_edge_of_the_range_is_accepted(world):
    edge = 2**53 - 9  # rank 1 holds [2**53 - 9, 2**53 - 1): its end is the last one accepted
    results = _refused(world, 2, {0: {"chunk_start": edge - 8}, 1: {"chunk_start": edge}})
    assert results == [None, None]
    low = -(2**53) + 1  # rank 0 starts at -(2**53 - 1), the most negative accepted
    results = _refused(world, 2, {0: {"chunk_start": low}, 1: {"chunk_start": low + 8}})
    assert results == [None, None]
    results = _refused(world, 2, {0: {"chunk_start": low - 1}, 1: {"chunk_start": low + 7}})
    assert all(isinstance(r, ValueError) for r in results)


def test_nan_passes_with_check_finite_off(world):
    results = _refused(
        world,
        2,
        {r: {"check_finite": False} for r in range(2)}
        | {1: {"check_finite": False, "value": lambda a: a[2].clone().fill_(float("nan"))}},
    )
    assert results == [None, None]


def test_not_a_member_of_the_group(world):
    w = world(1)
    del w
    q = torch.zeros(1, 2, 4, 4)
    with pytest.raises(ValueError, match=r"^group: this process is not a member of the process"):
        D.context_parallel_plsh_attention(
            q, q, q, partition=draw_partition([4.0, 8.0], 2, 0), group=_group(-1)
        )


# ----------------------------------------------------------------------------- halo_exchange


def test_halo_exchange_refusals_name_the_argument(world):
    world(2)
    partition = draw_partition([4.0, 8.0], 4, seed=0)
    plan = D.plan_context_parallel(partition, [(0, 6), (6, 12)])
    k = torch.zeros(1, 2, 6, 4)
    g0 = _group(0)
    with pytest.raises(TypeError, match=r"^plan: must be a HaloPlan, got tuple$"):
        D.halo_exchange(k, k, (0, 6), group=g0)
    with pytest.raises(TypeError, match=r"^key: must be a 4-dimensional torch.Tensor$"):
        D.halo_exchange(k[0], k, plan, group=g0)
    with pytest.raises(TypeError, match=r"^value: must be a 4-dimensional torch.Tensor$"):
        D.halo_exchange(k, k.numpy(), plan, group=g0)
    with pytest.raises(TypeError, match=r"^value: dtype torch.float64 differs from key dtype"):
        D.halo_exchange(k, k.double(), plan, group=g0)
    other = D.plan_context_parallel(partition, [(0, 4), (4, 8), (8, 12)])
    with pytest.raises(ValueError, match=r"^plan: made for 3 ranks, the group has 2$"):
        D.halo_exchange(k, k, other, group=g0)
    with pytest.raises(
        ValueError, match=r"^key: shape \(1, 2, 5, 4\) does not hold the chunk \[0, 6\)$"
    ):
        D.halo_exchange(k[:, :, :5], k[:, :, :5], plan, group=g0)
    with pytest.raises(ValueError, match=r"^key: shape \(1, 2, 6, 4\) does not hold the chunk"):
        D.halo_exchange(k, k[:, :1], plan, group=g0)
    with pytest.raises(ValueError, match=r"^key: 1 kv heads, the plan was made for 2$"):
        D.halo_exchange(k[:, :1], k[:, :1], plan, group=g0)


def test_halo_exchange_returns_the_keys_at_the_plans_positions(world):
    """Rank r's result holds, at each planned position, the owner's key and value for the
    kv heads whose halo covers it, and 0 elsewhere."""
    partition = draw_partition([3.0, 3.0, 30.0, 30.0], 4, seed=5)
    bounds = [(0, 10), (10, 13), (13, 40)]
    plan = D.plan_context_parallel(partition, bounds, causal=False, num_heads_kv=2)
    g = torch.Generator().manual_seed(0)
    key = torch.randn(2, 2, 40, 3, generator=g)
    value = torch.randn(2, 2, 40, 5, generator=g)
    w = world(3)

    def work(rank):
        a, b = bounds[rank]
        return D.halo_exchange(key[:, :, a:b], value[:, :, a:b], plan, group=_group(rank))

    for rank, res in enumerate(_run(w, work)):
        assert not isinstance(res, BaseException), f"rank {rank}: {res!r}"
        key_ext, value_ext = res
        positions = plan.key_positions(rank)
        assert key_ext.shape == (2, 2, positions.size, 3)
        assert value_ext.shape == (2, 2, positions.size, 5)
        for head in range(2):
            lo, hi = plan.key_ranges[rank, head]
            inside = torch.from_numpy((positions >= lo) & (positions < hi))
            idx = torch.from_numpy(positions)
            assert torch.equal(key_ext[:, head][:, inside], key[:, head][:, idx[inside]])
            assert torch.equal(value_ext[:, head][:, inside], value[:, head][:, idx[inside]])
            assert not key_ext[:, head][:, ~inside].any()
    assert (
        sum(w.sent)
        == sum(
            plan.bytes_sent(r, batch=2, head_dim=3, head_dim_v=5, element_size=4) for r in range(3)
        )
        > 0
    )


def test_pack_and_unpack_round_trip_each_kv_heads_ranges():
    g = torch.Generator().manual_seed(1)
    key = torch.randn(2, 3, 10, 4, generator=g)
    value = torch.randn(2, 3, 10, 2, generator=g)
    ranges = np.array([[102, 105], [100, 100], [107, 110]])  # origin 100; head 1 sends nothing
    buf = D._pack(key, value, ranges, 100)
    assert buf.dtype == torch.uint8 and buf.numel() == D._nbytes(key, value, ranges)
    assert D._nbytes(key, value, ranges) == 6 * 2 * (4 + 2) * 4
    k2, v2 = torch.zeros_like(key), torch.zeros_like(value)
    D._unpack(buf, k2, v2, ranges, 100, accumulate=False)
    for head, (lo, hi) in enumerate(ranges.tolist()):
        s = slice(lo - 100, hi - 100)
        assert torch.equal(k2[:, head, s], key[:, head, s])
        assert torch.equal(v2[:, head, s], value[:, head, s])
    mask = torch.zeros(10, dtype=torch.bool)
    assert not k2[:, 1].any() and not v2[:, 1].any()
    mask[2:5] = True
    assert not k2[:, 0][:, ~mask].any()
    D._unpack(buf, k2, v2, ranges, 100, accumulate=True)  # adds: twice the values
    assert torch.equal(k2[:, 0, 2:5], 2 * key[:, 0, 2:5])
    assert torch.equal(v2[:, 2, 7:10], 2 * value[:, 2, 7:10])


# --- the pure parts: tiling rule, checksum, plan geometry (no world needed) ----------------


def test_not_initialised_names_the_call_to_make(monkeypatch):
    monkeypatch.setattr(D.dist, "is_initialized", lambda: False)
    with pytest.raises(
        ValueError,
        match=r"^group: torch\.distributed is not initialised; call "
        r"torch\.distributed\.init_process_group first$",
    ):
        D._check_initialized(None)


def test_tiling_ignores_empty_chunks_wherever_they_sit():
    # an empty chunk is not part of the sequence, even at a position far from it
    D._check_tiling([(0, 0), (3, 6), (6, 9), (100, 100)], "chunk_bounds")
    D._check_tiling([(6, 9), (5, 5), (3, 6)], "chunk_bounds")
    plan = D.plan_context_parallel(draw_partition(np.array([4.0]), 2, seed=0), [(0, 0), (3, 9)])
    assert plan.bounds == ((0, 0), (3, 9))


def test_tiling_refusals_name_overlap_and_gap():
    with pytest.raises(
        ValueError,
        match=r"^chunk_bounds: the chunks do not tile the sequence: rank 1 holds positions "
        r"\[0, 4\) and rank 0 \[3, 8\) \(overlap\)$",
    ):
        D._check_tiling([(3, 8), (0, 4)], "chunk_bounds")
    with pytest.raises(
        ValueError,
        match=r"^chunk_start: the chunks do not tile the sequence: rank 0 holds positions "
        r"\[0, 4\) and rank 1 \[5, 8\) \(gap\)$",
    ):
        D._check_tiling([(0, 4), (5, 8)], "chunk_start")
    with pytest.raises(ValueError, match=r"^chunk_bounds: rank 1 has stop 2 < start 3$"):
        D._check_tiling([(0, 3), (3, 2)], "chunk_bounds")


def test_tiling_positions_below_two_to_the_53():
    """The first position ``start`` and the last ``stop - 1`` must have magnitude < 2**53,
    on each side of zero, whichever rank holds them."""
    big = 2**53
    message = r"^chunk_bounds: positions must have magnitude < 2\*\*53$"
    for ok in ([(0, big)], [(-big + 1, 0)], [(5, 9), (9, big)], [(big - 10, big)]):
        D._check_tiling(ok, "chunk_bounds")
    for bad in ([(0, big + 1)], [(-big, -big + 5)], [(5, 9), (9, big + 1)], [(-big, 3)]):
        with pytest.raises(ValueError, match=message):
            D._check_tiling(bad, "chunk_bounds")


def test_partition_checksum_bits():
    """The checksum is BLAKE2b-64 of the shape (little-endian int64) and the float64 bytes
    of pitch then offset, read little-endian, shifted right by one bit."""
    import hashlib

    from plsh_ref.partition import PartitionSample

    part = draw_partition(np.array([2.0, 8.0]), 3, seed=4)
    digest = hashlib.blake2b(digest_size=8)
    digest.update(np.array([2, 3], dtype="<i8").tobytes())
    digest.update(part.pitch.astype("<f8").tobytes())
    digest.update(part.offset.astype("<f8").tobytes())
    assert D.partition_checksum(part) == int.from_bytes(digest.digest(), "little") >> 1
    # the pitch alone changes it (offsets kept)
    other = PartitionSample(part.pitch * 1.5, part.offset)
    assert D.partition_checksum(other) != D.partition_checksum(part)
    with pytest.raises(TypeError, match=r"^partition: must be a PartitionSample, got int$"):
        D.partition_checksum(3)


# --- key_reach: its contract at the edges (no world needed) --------------------------------


def _reach_oracle(partition, start, stop, lo, hi, causal):
    """First/last key in [lo, hi) with a nonzero count (plsh_ref.partition.counts) for some
    query in [start, stop), per head."""
    from plsh_ref.partition import counts

    keys = np.arange(lo, hi)
    c = counts(partition, np.arange(start, stop), keys, causal=causal).sum(axis=1)
    first = np.array([keys[np.nonzero(row)[0][0]] for row in c])
    last = np.array([keys[np.nonzero(row)[0][-1]] for row in c])
    return first, last


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    ("lo", "start", "stop", "hi"),
    [(-60, 55, 58, 70), (-70, -58, -55, 60), (-3, 0, 1, 4), (-80, -1, 1, 80)],
)
def test_key_reach_of_a_sequence_across_position_zero(causal, lo, start, stop, hi):
    """Negative and positive positions in one sequence (``chunk_start`` may be negative):
    the reach is the count oracle's, with blocks wider than the distances to zero."""
    partition = draw_partition(np.array([30.0, 200.0, 3.0]), 4, seed=7)
    first, last = D.key_reach(
        partition, start, stop, causal=causal, sequence_start=lo, sequence_stop=hi
    )
    want_first, want_last = _reach_oracle(partition, start, stop, lo, hi, causal)
    np.testing.assert_array_equal(first, want_first)
    np.testing.assert_array_equal(last, want_last)


def test_key_reach_is_int64_and_causal_by_default():
    partition = draw_partition(np.array([20.0, 60.0]), 4, seed=8)
    default = D.key_reach(partition, 100, 110, sequence_start=0, sequence_stop=300)
    causal = D.key_reach(partition, 100, 110, causal=True, sequence_start=0, sequence_stop=300)
    both = D.key_reach(partition, 100, 110, causal=False, sequence_start=0, sequence_stop=300)
    for first, last in (default, causal, both):
        assert first.dtype == np.int64 and last.dtype == np.int64
        assert first.shape == last.shape == (2,)
    np.testing.assert_array_equal(default[0], causal[0])
    np.testing.assert_array_equal(default[1], [109, 109])  # causal: nothing after stop - 1
    assert np.all(both[1] > 109)  # the blocks of position 109 reach further right


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (("pitch", 0, 4), {}, TypeError, r"^partition: must be a PartitionSample, got str$"),
        ((0, 4), {"causal": "yes"}, TypeError, r"^causal: must be a bool, got str 'yes'$"),
        ((1.5, 4), {}, TypeError, r"^start: must be an integer, got float 1\.5$"),
        ((0, 4.0), {}, TypeError, r"^stop: must be an integer, got float 4\.0$"),
        ((0, 4), {"sequence_start": 0.5}, TypeError, r"^sequence_start: must be an integer"),
        ((0, 4), {"sequence_stop": "9"}, TypeError, r"^sequence_stop: must be an integer"),
        ((5, 5), {}, ValueError, r"^stop: must be > start=5, got 5$"),
        (
            (5, 9),
            {"sequence_start": 0, "sequence_stop": 8},
            ValueError,
            r"^sequence_start: the sequence \[0, 8\) must contain the chunk \[5, 9\)$",
        ),
    ],
    ids=[
        "partition",
        "causal",
        "start",
        "stop",
        "sequence_start",
        "sequence_stop",
        "empty",
        "contain",
    ],
)
def test_key_reach_refusals_name_the_argument(args, kwargs, error, match):
    partition = draw_partition(np.array([4.0]), 2, seed=0)
    call = args if args[0] == "pitch" else (partition, *args)
    with pytest.raises(error, match=match):
        D.key_reach(*call, **kwargs)


def test_key_reach_positions_below_two_to_the_53():
    """The sequence's first position and its last (``sequence_stop - 1``) must have
    magnitude < 2**53: accepted at 2**53 - 1 on each side, refused at 2**53."""
    big = 2**53
    partition = draw_partition(np.array([4.0, 9.0]), 3, seed=1)
    message = r"^sequence_start: positions must have magnitude < 2\*\*53$"
    first, last = D.key_reach(partition, big - 6, big, causal=False)  # last position 2**53 - 1
    assert np.all(first >= big - 6) and np.all(last == big - 1)
    first, last = D.key_reach(partition, -big + 1, -big + 7, causal=False)
    assert np.all(first == -big + 1) and np.all(last <= -big + 6)
    for start, stop, kwargs in [
        (big - 6, big, {"sequence_stop": big + 1}),  # last position 2**53
        (big - 6, big - 1, {"sequence_stop": big + 2}),
        (-big + 1, -big + 7, {"sequence_start": -big}),
    ]:
        with pytest.raises(ValueError, match=message):
            D.key_reach(partition, start, stop, causal=False, **kwargs)


def test_key_reach_refuses_bin_indices_outside_int64_at_the_threshold():
    """With pitch 2**-11 (offset 0) the bin of position p is p * 2**11, inside int64 iff
    p < 2**52: a sequence ending at 2**52 - 1 is accepted, one ending at 2**52 refused."""
    from plsh_ref.partition import PartitionSample

    partition = PartitionSample(np.full((1, 2), 2.0**-11), np.zeros((1, 2)))
    edge = 2**52
    first, last = D.key_reach(partition, edge - 4, edge, causal=False)
    assert first.tolist() == [edge - 4] and last.tolist() == [edge - 1]  # one position a bin
    with pytest.raises(ValueError, match=r"^partition: bin index"):
        D.key_reach(partition, edge - 4, edge + 1, causal=False)
    with pytest.raises(ValueError, match=r"^partition: bin index"):
        D.key_reach(partition, edge - 4, edge - 2, causal=False, sequence_stop=edge + 1)


# --- plan_context_parallel: its contract at the edges ---------------------------------------


def test_plan_is_causal_by_default_int64_and_read_only():
    partition = draw_partition(np.array([20.0, 60.0, 5.0, 9.0]), 4, seed=9)
    bounds = [(0, 40), (40, 41), (41, 90)]
    plan = D.plan_context_parallel(partition, bounds, num_heads_kv=2)
    assert plan.causal is True
    assert plan.key_ranges.dtype == np.int64 and plan.key_ranges.shape == (3, 2, 2)
    # causal: every kv head's range ends at the chunk's stop, and starts at the reach
    for rank, (a, b) in enumerate(bounds):
        first, _ = D.key_reach(partition, a, b, sequence_start=0, sequence_stop=90)
        assert plan.key_ranges[rank, :, 1].tolist() == [b, b]
        assert plan.key_ranges[rank, :, 0].tolist() == [first[:2].min(), first[2:].min()]
    with pytest.raises(ValueError, match="read-only"):
        plan.key_ranges[0, 0, 0] = 5  # shared by every rank's exchange: immutable
    both = D.plan_context_parallel(partition, bounds, causal=False, num_heads_kv=2)
    assert both.causal is False
    assert np.all(both.key_ranges[:2, :, 1] > [[40], [41]])  # right halos


def test_plan_with_every_chunk_empty():
    """No rank holds a token: nothing to send, each range is the empty ``(start, start)``."""
    partition = draw_partition(np.array([4.0]), 2, seed=0)
    plan = D.plan_context_parallel(partition, [(0, 0), (7, 7)], causal=False)
    assert plan.key_ranges.tolist() == [[[0, 0]], [[7, 7]]]
    assert plan.tokens_sent(0) == plan.tokens_received(1) == 0
    assert plan.key_positions(1).size == 0


@pytest.mark.parametrize("empty", [(-50, -50), (90, 90), (40, 40)])
def test_an_empty_chunk_does_not_extend_the_sequence(empty):
    """The sequence is the union of the non-empty chunks: an empty chunk elsewhere (before,
    after, or at a boundary) leaves every other rank's reach as without it."""
    partition = draw_partition(np.array([30.0, 80.0]), 4, seed=10)
    bounds = [(0, 40), (40, 60)]
    want = D.plan_context_parallel(partition, bounds, causal=False)
    for at in range(3):
        with_empty = bounds[:at] + [empty] + bounds[at:]
        plan = D.plan_context_parallel(partition, with_empty, causal=False)
        got = np.delete(plan.key_ranges, at, axis=0)
        np.testing.assert_array_equal(got, want.key_ranges)
        assert plan.key_ranges[at].tolist() == [[empty[0], empty[0]]] * 2
    # the reach stays inside [0, 60) although the blocks are wider than the chunks
    assert want.key_ranges.min() == 0 and want.key_ranges.max() == 60


@pytest.mark.parametrize(
    ("bounds", "kwargs", "error", "match"),
    [
        (
            [(0, 4, 8)],
            {},
            TypeError,
            r"^chunk_bounds: must be a sequence of \(start, stop\) pairs$",
        ),
        ([5], {}, TypeError, r"^chunk_bounds: must be a sequence of \(start, stop\) pairs$"),
        (None, {}, TypeError, r"^chunk_bounds: must be a sequence of \(start, stop\) pairs$"),
        ([(0.5, 4)], {}, TypeError, r"^chunk_bounds: must be an integer, got float 0\.5$"),
        ([(0, 4.0)], {}, TypeError, r"^chunk_bounds: must be an integer, got float 4\.0$"),
        ([(0, 4)], {"causal": 1}, TypeError, r"^causal: must be a bool, got int 1$"),
        ([(0, 4)], {"num_heads_kv": 0}, ValueError, r"^num_heads_kv: must be >= 1, got 0$"),
        ([(0, 4)], {"num_heads_kv": 1.0}, TypeError, r"^num_heads_kv: must be an integer"),
        ([(0, 4)], {"num_heads_kv": 3}, ValueError, r"^num_heads_kv: 3 must divide num_heads=2$"),
        ([], {}, ValueError, r"^chunk_bounds: needs at least one rank$"),
    ],
)
def test_plan_refusals_name_the_argument(bounds, kwargs, error, match):
    partition = draw_partition(np.array([4.0, 8.0]), 2, seed=0)
    with pytest.raises(error, match=match):
        D.plan_context_parallel(partition, bounds, **kwargs)


def test_plan_refuses_a_non_partition_by_its_type():
    with pytest.raises(TypeError, match=r"^partition: must be a PartitionSample, got list$"):
        D.plan_context_parallel([[4.0]], [(0, 4)])


def test_plan_with_one_kv_head_and_one_head_per_kv_head():
    """``num_heads_kv`` 1 (multi-query) is the union over all heads; ``num_heads`` (the
    default) is each head's own reach."""
    partition = draw_partition(np.array([3.0, 50.0, 12.0]), 4, seed=11)
    bounds = [(0, 30), (30, 70)]
    first, _ = D.key_reach(partition, 30, 70, sequence_start=0, sequence_stop=70)
    one = D.plan_context_parallel(partition, bounds, num_heads_kv=1)
    assert one.key_ranges[1].tolist() == [[first.min(), 70]]
    own = D.plan_context_parallel(partition, bounds)
    assert own.key_ranges[1, :, 0].tolist() == first.tolist()
    assert own.num_heads_kv == 3 and one.num_heads_kv == 1


# --- context_parallel_plsh_attention: one rank, and a rank without tensors ------------------


@pytest.mark.parametrize("chunk_start", [None, 300])
def test_a_world_of_one_rank_is_the_single_process_attention(world, chunk_start):
    """world_size 1: the whole sequence on one rank, no halo; output and LSE are those of
    plsh_attention at the same positions."""
    partition = draw_partition(np.array([5.0, 40.0]), 4, seed=12)
    q, k, v, _, _ = _inputs(17, heads=2, heads_kv=1)
    origin = chunk_start or 0
    pos = torch.arange(origin, origin + 17)
    want, want_lse = plsh_attention(
        q,
        k,
        v,
        partition=partition,
        query_positions=pos,
        key_positions=pos,
        return_lse=True,
        backend="cpu",
    )
    w = world(1)

    def work(rank):
        return D.context_parallel_plsh_attention(
            q,
            k,
            v,
            partition=partition,
            chunk_start=chunk_start,
            return_lse=True,
            backend="cpu",
            group=_group(rank),
        )

    (res,) = _run(w, work)
    assert not isinstance(res, BaseException), repr(res)
    _close(res[0], want, "output")
    _close(res[1], want_lse, "lse")
    assert w.sent == [0]


@pytest.mark.parametrize("convert", [np.asarray, torch.Tensor.tolist], ids=["numpy", "list"])
def test_a_rank_whose_query_is_not_a_tensor_is_refused_like_the_others(world, convert):
    """A non-tensor query (a numpy array, nested lists: no ``device``) is refused on its rank
    (TypeError naming ``query``) and named by the others; the metadata of the refused rank
    is then gathered on the CPU."""
    results = _refused(world, 2, {1: {"query": lambda a: convert(a[0])}})
    assert isinstance(results[1], TypeError) and re.search(r"^query: ", str(results[1])), results
    assert isinstance(results[0], ValueError), results
    assert re.search(r"^group: rank 1 refused its arguments: query: ", str(results[0])), results
