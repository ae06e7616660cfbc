"""The CPU path has no side effects on global state.

It used to call ``torch.set_num_threads(1)`` for the whole process during every call and
start a new thread pool per call. Now worker threads of one module-level pool limit their
own OpenMP/MKL threads; the process-wide thread count, grad mode and RNG states are left
as found, also when a call fails.
"""

import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import plsh_fast.cpu as cpu  # noqa: E402
from plsh_fast import plsh_attention  # noqa: E402

pytestmark = pytest.mark.skipif(
    not cpu.per_thread_limits_available(), reason="no per-thread OpenMP limits here"
)


@pytest.fixture
def two_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)


def _inputs(requires_grad=False):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 4, 96, 8, generator=g).requires_grad_(requires_grad) for _ in range(3)]


def test_workers_run_single_threaded_while_the_process_setting_stays(two_threads, monkeypatch):
    seen = {"worker": set(), "fresh_thread": set()}
    real = cpu._tiles.tiles_forward

    def spy(*args):
        seen["worker"].add(torch.get_num_threads())
        # A thread started now inherits the process-wide setting (torch's lazy per-thread
        # init): the old global set_num_threads(1) showed up here as 1.
        fresh = threading.Thread(target=lambda: seen["fresh_thread"].add(torch.get_num_threads()))
        fresh.start()
        fresh.join()
        return real(*args)

    monkeypatch.setattr(cpu._tiles, "tiles_forward", spy)
    plsh_attention(*_inputs(), seed=0, num_samples=4)
    assert seen["worker"] == {1}
    assert seen["fresh_thread"] == {2}
    assert torch.get_num_threads() == 2


def test_global_state_is_restored_even_when_a_worker_fails(two_threads, monkeypatch):
    calls = []

    def failing(*args):
        calls.append(threading.current_thread().name)
        raise RuntimeError("injected")

    monkeypatch.setattr(cpu._tiles, "tiles_forward", failing)
    rng, np_rng = torch.random.get_rng_state(), np.random.get_state()
    with pytest.raises(RuntimeError, match="injected"):
        plsh_attention(*_inputs(), seed=0, num_samples=4)
    assert calls and all(name.startswith("plsh-cpu") for name in calls)  # ran in workers
    assert torch.get_num_threads() == 2
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), np_rng))
    monkeypatch.undo()
    torch.set_num_threads(2)
    out = plsh_attention(*_inputs(), seed=0, num_samples=4)  # the pool still works
    assert torch.isfinite(out).all()


def test_one_pool_serves_every_call(two_threads):
    q, k, v = _inputs(requires_grad=True)
    plsh_attention(q, k, v, seed=0, num_samples=4).sum().backward()
    pool = cpu.executor(2)
    threads = threading.active_count()
    for _ in range(4):
        plsh_attention(q, k, v, seed=0, num_samples=4).sum().backward()
    assert cpu.executor(2) is pool
    assert threading.active_count() == threads
    names = {t.name for t in threading.enumerate() if t.name.startswith("plsh-cpu")}
    assert 1 <= len(names) <= 2


def test_forward_plan_is_reused_by_the_backward(two_threads, monkeypatch):
    made = []
    real = cpu._planning.make_plan

    def counting(*args):
        made.append(1)
        return real(*args)

    monkeypatch.setattr(cpu._planning, "make_plan", counting)
    q, k, v = _inputs(requires_grad=True)
    plsh_attention(q, k, v, seed=0, num_samples=4).sum().backward()
    assert len(made) == 1  # planned once for the forward and its backward
    # negative control: with no plan kept across calls (step 8), a direct backward
    # call without the plan plans again
    monkeypatch.setattr(cpu, "PLAN_CACHE_BYTES", 0)
    out, lse = cpu.plsh_forward_cpu(
        q, k, v, *_partition(), torch.arange(96), torch.arange(96), 0.3, True
    )
    cpu.plsh_backward_cpu(
        q, k, v, out, lse, out, *_partition(), torch.arange(96), torch.arange(96), 0.3, True
    )
    assert len(made) == 3


def _partition():
    from plsh_fast.nn import PLSHAttention

    core = PLSHAttention(4, 4, seed=0)
    return core.pitch, core.offset


def test_a_forked_child_gets_its_own_pool(two_threads):
    """A pool inherited through fork has no threads: the child must not wait on it."""
    import multiprocessing

    plsh_attention(*_inputs(), seed=0, num_samples=4)  # the parent's pool exists
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_call, args=(queue,))
    child.start()
    child.join(timeout=120)
    if child.is_alive():  # the bug: the child waits for ever on the inherited pool
        child.kill()
        child.join()
    assert child.exitcode == 0
    assert queue.get(timeout=5) is True


def _child_call(queue):
    torch.set_num_threads(2)
    out = plsh_attention(*_inputs(), seed=0, num_samples=4)
    queue.put(bool(torch.isfinite(out).all()))


def test_dynamic_dealing_lets_a_free_worker_take_a_slow_workers_share(two_threads):
    """The forward deals tiles dynamically: a worker slowed down (here by a sleep, as by
    another process on its core) does not hold up the call, every task runs exactly once,
    and the result does not depend on who ran what."""
    import threading
    import time

    done, lock = [], threading.Lock()

    def fn(task, worker):
        if worker == 0:
            time.sleep(0.05)
        with lock:
            done.append((task, worker))

    cpu._pool.run_parallel(list(range(20)), fn, 2, dynamic=True)
    assert sorted(t for t, _ in done) == list(range(20))
    by_worker = [sum(1 for _, w in done if w == k) for k in (0, 1)]
    assert by_worker[1] > by_worker[0]  # the free worker took more
    # Negative control: round-robin dealing gives each worker half, however slow.
    done.clear()
    cpu._pool.run_parallel(list(range(20)), fn, 2)
    assert [sum(1 for _, w in done if w == k) for k in (0, 1)] == [10, 10]
    # The forward (dealt dynamically) is bit-identical with 2 threads and with 1.
    q, k, v = _inputs()
    two = plsh_attention(q, k, v, seed=0, num_samples=8)
    torch.set_num_threads(1)
    cpu.clear_plan_cache()
    one = plsh_attention(q, k, v, seed=0, num_samples=8)
    assert torch.equal(one, two)
