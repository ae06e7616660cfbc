"""Band heads of the CPU path (``plsh_fast/cpu/_band.py``) at their edges.

* The key/value gradients of band heads are added back through strided views of the padded
  gradients, one view per phase of tiles, spanning the batch by the padded tensor's batch
  stride: with several batch entries every entry's gradients must be its own. Checked
  against dense float64 attention with the exact ``log M~`` bias (SPEC section 1), so the
  only difference is float64 rounding (``1e-10`` relative, far below any misplaced key).
* :func:`~plsh_fast.cpu._band.pad_rows` adds the zero rows and copies only what it must.
"""

from __future__ import annotations

import pytest
import torch
from _cpu_problems import make_problem

from plsh_fast import cpu, plsh_attention
from plsh_fast._partition import partition_tensors


def _dense(q, k, v, bias, scale, group):
    """Dense float64 attention with additive bias ``(H, n_q, n_k)``: ``(out, lse)``."""
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    logits = (q @ k.transpose(-1, -2)) * scale + bias
    lse = torch.logsumexp(logits, dim=-1)
    return torch.softmax(logits, dim=-1) @ v, lse


@pytest.mark.parametrize("causal", [True, False])
def test_band_gradients_of_every_batch_entry_are_the_dense_ones(causal):
    problem = make_problem(
        8, batch=3, num_heads=4, group=2, n_q=200, n_k=200, head_dim=8, head_dim_v=5,
        dtype="float64", causal=causal, num_samples=8, log2_sigma=(1.0, 5.0),
        requires_grad=True,
    )  # fmt: skip
    pitch, offset = partition_tensors(problem.partition, "cpu")
    pos = torch.arange(200)
    assert all(cpu.plan_cpu(pitch, offset, pos, pos, causal, torch.float64).band)
    q, k, v = problem.query, problem.key, problem.value
    g = torch.Generator().manual_seed(1)
    grad_out = torch.randn(3, 4, 200, 5, generator=g, dtype=torch.float64)
    grad_lse = torch.randn(3, 4, 200, generator=g, dtype=torch.float64)
    out, lse = plsh_attention(q, k, v, return_lse=True, backend="cpu", **problem.kwargs)
    got = torch.autograd.grad((out * grad_out).sum() + (lse * grad_lse).sum(), (q, k, v))
    bias = torch.from_numpy(problem.log_weight())
    ref_out, ref_lse = _dense(q, k, v, bias, q.shape[-1] ** -0.5, 2)
    want = torch.autograd.grad((ref_out * grad_out).sum() + (ref_lse * grad_lse).sum(), (q, k, v))
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    for name, a, b in zip(("query", "key", "value"), got, want):
        scale = float(b.abs().max())
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10 * scale, msg=name)
        for i in range(3):  # each batch entry its own gradients (not another entry's)
            assert not torch.allclose(b[i], b[(i + 1) % 3], rtol=1e-3, atol=0), name


def test_pad_rows_adds_zero_rows_and_copies_only_what_it_must():
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    padded = cpu._band.pad_rows(x, 2)
    assert padded.shape == (2, 9, 3) and padded.is_contiguous()
    assert torch.equal(padded[:, 2:7], x)
    assert not padded[:, :2].any() and not padded[:, 7:].any()
    # no padding needed: contiguous keys are read in place (no copy per kv head) ...
    assert cpu._band.pad_rows(x, 0) is x
    # ... other layouts become one contiguous copy
    y = x.transpose(0, 1).contiguous().transpose(0, 1)
    z = cpu._band.pad_rows(y, 0)
    assert z.is_contiguous() and torch.equal(z, x) and z.data_ptr() != y.data_ptr()
