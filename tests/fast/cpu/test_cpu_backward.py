"""Gradients of :func:`plsh_fast.plsh_attention` on the CPU path.

* ``torch.autograd.gradcheck`` in float64 (output and LSE) on problems with grouped-query
  heads, odd head_dims, lengths that are not tile multiples, unsorted positions, causal and
  bidirectional attention, for the fused tile kernel and the plain-torch fallback;
* float32/float16 gradients against autograd of a dense float64 reference with the same
  partition under the tolerance rule of SPEC section 6 (baseline: the same dense autograd
  in the tested dtype);
* exact zeros: keys that no query can reach and rows without an admissible key get
  exactly zero gradient, and no gradient is ever NaN.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _cpu_problems import make_problem, problems
from hypothesis import given, settings

import plsh_fast.cpu as cpu
from plsh_fast import plsh_attention
from plsh_fast.peers import dense_attention
from plsh_ref.testing.tolerance import assert_close_to_reference

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(cpu, "CHUNK_ELEMENTS", 1024)


def _finite_lse(out_lse):
    out, lse = out_lse
    return out, torch.where(torch.isfinite(lse), lse, 0.0)


def _gradcheck(p, fast_mode):
    def f(q, k, v):
        return _finite_lse(plsh_attention(q, k, v, return_lse=True, **p.kwargs))

    return torch.autograd.gradcheck(f, (p.query, p.key, p.value), fast_mode=fast_mode)


@pytest.mark.parametrize("cells", [0.0, 1.0], ids=["per_row_counts", "cell_counts"])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("mode", ["default", "unsorted", "gaps"])
def test_gradcheck_float64(monkeypatch, fused, causal, mode, cells):
    """Fast-mode gradcheck (random directions) on a problem with several tiles per head,
    with the counts of every row computed directly and copied from cells."""
    monkeypatch.setattr(cpu, "USE_FUSED_TILES", fused)
    monkeypatch.setattr(cpu, "PATTERN_ROWS_FRACTION", cells)
    p = make_problem(
        21,
        batch=2,
        num_heads=4,
        group=2,
        n_q=19,
        n_k=23,
        head_dim=3,
        head_dim_v=5,
        dtype="float64",
        causal=causal,
        mode=mode,
        num_samples=3,
        log2_sigma=(0.0, 4.0),
        requires_grad=True,
    )
    assert _gradcheck(p, fast_mode=True)


@pytest.mark.parametrize("causal", [True, False])
def test_gradcheck_float64_full_jacobian(causal):
    """Every Jacobian entry, on a smaller problem (GQA, unsorted positions, empty rows)."""
    p = make_problem(
        8,
        batch=1,
        num_heads=2,
        group=2,
        n_q=7,
        n_k=9,
        head_dim=3,
        head_dim_v=2,
        dtype="float64",
        causal=causal,
        mode="unsorted",
        num_samples=3,
        log2_sigma=(0.0, 3.0),
        requires_grad=True,
    )
    assert _gradcheck(p, fast_mode=False)


def dense_reference(problem, dtype):
    """Autograd of dense softmax(scale q k^T + log M~) v in ``dtype`` (GQA expanded)."""
    q, k, v = (torch.from_numpy(x).to(dtype).requires_grad_() for x in problem.numpy64())
    return q, k, v, dense_attention(q, k, v, bias=problem.log_weight(), scale=problem.scale)


@settings(max_examples=15)
@given(problems(dtypes=("float32", "float16"), max_len=40, requires_grad=True))
def test_gradients_match_dense_reference(problem):
    out = plsh_attention(problem.query, problem.key, problem.value, **problem.kwargs)
    grad_out = torch.from_numpy(np.random.default_rng(0).standard_normal(out.shape))
    out.backward(grad_out.to(out.dtype))
    q64, k64, v64, ref = dense_reference(problem, torch.float64)
    ref.backward(grad_out)
    qb, kb, vb, base = dense_reference(problem, problem.query.dtype)
    base.backward(grad_out.to(base.dtype))
    refs = (q64.grad, k64.grad, v64.grad)
    scale = max([g.abs().max().item() for g in refs if g.numel()] + [0.0])
    for name, got, want, yard in (
        ("grad_query", problem.query.grad, q64.grad, qb.grad),
        ("grad_key", problem.key.grad, k64.grad, kb.grad),
        ("grad_value", problem.value.grad, v64.grad, vb.grad),
    ):
        assert got.dtype == problem.query.dtype and got.shape == want.shape
        assert not torch.isnan(got).any()
        assert_close_to_reference(got, want, yard, problem.dtype, name=name, floor_scale=scale)


@pytest.mark.parametrize("fused", [True, False])
def test_unreachable_keys_and_empty_rows_get_exact_zero_gradient(monkeypatch, fused):
    monkeypatch.setattr(cpu, "USE_FUSED_TILES", fused)
    p = make_problem(
        4,
        batch=2,
        num_heads=2,
        n_q=8,
        n_k=12,
        head_dim=4,
        head_dim_v=4,
        dtype="float32",
        causal=True,
        requires_grad=True,
    )
    qpos = np.array([-7, -2, 0, 1, 2, 3, 4, 5])  # the first two see no key
    kpos = np.array([0, 1, 2, 3, 4, 5, 30, 31, 32, 33, 34, 35])  # the last six: no query
    out, lse = plsh_attention(
        p.query,
        p.key,
        p.value,
        partition=p.partition,
        query_positions=qpos,
        key_positions=kpos,
        return_lse=True,
    )
    (out.square().sum() + torch.where(torch.isfinite(lse), lse, 0.0).sum()).backward()
    for g in (p.query.grad, p.key.grad, p.value.grad):
        assert not torch.isnan(g).any() and torch.isfinite(g).all()
    assert torch.equal(p.query.grad[:, :, :2], torch.zeros_like(p.query.grad[:, :, :2]))
    assert torch.equal(p.key.grad[:, :, 6:], torch.zeros_like(p.key.grad[:, :, 6:]))
    assert torch.equal(p.value.grad[:, :, 6:], torch.zeros_like(p.value.grad[:, :, 6:]))
    assert p.key.grad[:, :, :6].abs().sum() > 0 and p.value.grad[:, :, :6].abs().sum() > 0


def test_fused_and_plain_tiles_agree_in_output_lse_and_gradients(monkeypatch):
    """The fused forward operator and the plain one give the same output and LSE, and the
    gradients (the backward is plain either way and reads neither) are the same."""
    p = make_problem(
        9,
        batch=1,
        num_heads=4,
        group=4,
        n_q=200,
        n_k=200,
        head_dim=8,
        head_dim_v=6,
        dtype="float64",
        num_samples=8,
        log2_sigma=(1.0, 7.0),
        mode="unsorted",
        requires_grad=True,
    )
    grads, results = [], []
    for fused in (True, False):
        monkeypatch.setattr(cpu, "USE_FUSED_TILES", fused)
        if fused and not cpu.fused_tiles_available():
            pytest.skip("the fused operator is not available on this torch")
        out, lse = plsh_attention(p.query, p.key, p.value, return_lse=True, **p.kwargs)
        results.append((out.detach(), lse.detach()))
        total = (out * torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype)).sum()
        grads.append(torch.autograd.grad(total + lse.sum(), (p.query, p.key, p.value)))
    for a, b in (*zip(*results), *zip(*grads)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_no_grad_inputs_build_no_graph():
    p = make_problem(1, dtype="float32")
    out = plsh_attention(p.query, p.key, p.value, **p.kwargs)
    assert out.grad_fn is None and not out.requires_grad


def test_two_worker_threads_give_the_same_results(monkeypatch):
    """Tiles run on Python worker threads when torch has several intra-op threads."""
    p = make_problem(
        12,
        batch=2,
        num_heads=4,
        group=2,
        n_q=150,
        n_k=150,
        head_dim=8,
        head_dim_v=8,
        dtype="float32",
        num_samples=8,
        log2_sigma=(1.0, 6.0),
        requires_grad=True,
    )
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        try:
            out = plsh_attention(p.query, p.key, p.value, **p.kwargs)
            grads = torch.autograd.grad(out.square().sum(), (p.query, p.key, p.value))
            assert torch.get_num_threads() == threads  # restored after the call
        finally:
            torch.set_num_threads(1)
        results.append((out, *grads))
    assert torch.equal(results[0][0], results[1][0])  # each row is computed by one tile
    assert torch.equal(results[0][1], results[1][1])  # so is each query gradient
    for a, b in zip(results[0][2:], results[1][2:]):  # key/value: summed per worker
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
