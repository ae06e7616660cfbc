"""The CPU path's worker pool and per-thread OpenMP/MKL limits (package docstring,
"Parallelism").

With ``torch.get_num_threads() = N > 1`` the tile groups (and the per-head planning) go to
``N`` Python worker threads of one module-level pool (:func:`executor`), each of which
limits its own OpenMP and MKL threads to 1 when it starts; :func:`run_parallel` deals the
tasks. Where those per-thread limits are unavailable the work runs serially in the calling
thread (:func:`per_thread_limits_available`).
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

__all__ = ["executor", "per_thread_limits_available", "run_parallel"]

_DONE = object()  # end of a dynamic task queue (:func:`run_parallel`)
_POOL: ThreadPoolExecutor | None = None
_POOL_PID: int | None = None  # process that created the pool (a forked child makes its own)
_POOL_LOCK = threading.Lock()
_LIMITS: tuple | None = None  # (omp_set_num_threads, mkl_set_num_threads_local or None)
_LIMITS_FOUND = False


def _thread_limit_functions():
    """The per-thread ``omp_set_num_threads`` of the process's OpenMP runtime (the one torch
    loaded) and MKL's ``mkl_set_num_threads_local`` when present, or ``None``."""
    global _LIMITS, _LIMITS_FOUND
    if _LIMITS_FOUND:
        return _LIMITS
    _LIMITS_FOUND = True
    omp = mkl = None
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:
        paths = set()
    for path in sorted(paths):
        name = path.rsplit("/", 1)[-1]
        if omp is None and name.startswith(("libgomp", "libiomp5", "libomp")):
            try:
                omp = ctypes.CDLL(path).omp_set_num_threads
            except (OSError, AttributeError):
                omp = None
        if mkl is None and name.startswith(("libtorch_cpu", "libmkl_rt")):
            try:
                # The Fortran entry point (trailing underscore) takes its argument by
                # reference in every MKL build.
                mkl = ctypes.CDLL(path).mkl_set_num_threads_local_
            except (OSError, AttributeError):
                mkl = None
    if omp is not None:
        omp.argtypes = [ctypes.c_int]
        if mkl is not None:
            mkl.argtypes = [ctypes.POINTER(ctypes.c_int)]
        _LIMITS = (omp, mkl)
    return _LIMITS


def _limit_this_thread() -> None:
    """Pool initializer: one OpenMP/MKL thread for this worker thread only."""
    limits = _thread_limit_functions()
    if limits is None:
        return
    torch.get_num_threads()  # torch's lazy per-thread init first (it would reset the limit)
    omp, mkl = limits
    omp(1)
    if mkl is not None:
        mkl(ctypes.byref(ctypes.c_int(1)))


def per_thread_limits_available() -> bool:
    """Whether worker threads can limit their own OpenMP threads (else: serial calls)."""
    return _thread_limit_functions() is not None


def executor(workers: int) -> ThreadPoolExecutor | None:
    """The module's worker pool with at least ``workers`` threads, or ``None``.

    Created lazily on first use and reused by every call; replaced by a larger pool when a
    call wants more workers (the old one finishes its queued work and exits), and made
    anew in a process forked after its creation (whose copy has no threads). ``None``
    when per-thread thread limits are unavailable (:func:`per_thread_limits_available`).
    """
    global _POOL, _POOL_PID
    if not per_thread_limits_available():
        return None
    with _POOL_LOCK:
        if _POOL is not None and _POOL_PID != os.getpid():
            _POOL = None  # inherited through fork: its threads do not exist in this process
        if _POOL is None or _POOL._max_workers < workers:
            old = _POOL
            _POOL = ThreadPoolExecutor(
                workers, thread_name_prefix="plsh-cpu", initializer=_limit_this_thread
            )
            _POOL_PID = os.getpid()
            if old is not None:
                old.shutdown(wait=False)
        return _POOL


def run_parallel(tasks: list, fn, workers: int, dynamic: bool = False) -> None:
    """``fn(task, worker)`` for every task, on ``workers`` threads of the module's pool.

    Each worker thread runs torch operators with one OpenMP thread (package docstring), so
    the parallelism comes from independent tiles running concurrently (torch operators
    release the GIL). By default tasks are dealt round-robin in the given order, so the
    assignment (and every floating-point sum over a worker's tasks) is deterministic for a
    given thread count. ``dynamic``: each worker takes the next task in the given order
    when it is free, so that a worker whose core another process holds does not hold up
    the call; only for tasks whose results do not depend on the worker (the forward's
    disjoint rows, the per-head planning). Returns after every worker has finished, then
    raises the first error if any.
    """
    pool = executor(workers) if workers > 1 and len(tasks) > 1 else None
    if pool is None:
        with torch.no_grad():
            for task in tasks:
                fn(task, 0)
        return
    # Grad and inference mode are thread-local: the workers never record a graph, and they
    # run in inference mode when the caller does (tensors created in inference mode may
    # only be updated in place inside it).
    inference = torch.is_inference_mode_enabled()

    if dynamic:
        queue = iter(tasks)
        lock = threading.Lock()

        def mine(_w):
            while True:
                with lock:
                    task = next(queue, _DONE)
                if task is _DONE:
                    return
                yield task

    else:

        def mine(w):
            return tasks[w::workers]

    def deal(w):
        with torch.inference_mode(inference), torch.no_grad():
            for task in mine(w):
                fn(task, w)

    jobs = [pool.submit(deal, w) for w in range(workers)]
    errors = [job.exception() for job in jobs]  # waits for every worker
    for error in errors:
        if error is not None:
            raise error
