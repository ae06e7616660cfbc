"""Gradients at large logits: the probabilities are recomputed without the LSE's rounding.

FlashAttention's backward recomputes the probabilities from the saved float32 LSE,
``P = C exp(x - lse - log s)``. ``lse`` is about as large as the row's largest logit, so
its float32 rounding (``|lse| 2**-24``) is a relative error of every ``P`` of the row,
which the dense yardstick of SPEC section 6 (a max-subtracted softmax in float32) does not
have: from logits of standard deviation about 9 the float32 gradients exceeded the
tolerance rule (a fresh-user review, 2026-12-01: ratio 1.07 on the Triton path, 1.39 on the
CPU path, for ``grad_value`` at the case below with ``scale_qk = 3``), and at standard
deviation 64 (``scale_qk = 8``) every gradient failed. Now the Triton forward saves the
row maximum ``m`` (log2 domain) and ``log2`` of the row sum for the backward, which
computes ``P = C 2^((x log2 e - m) - log2 l)``, and the CPU backward recomputes each row's
max-subtracted softmax inside the tile that holds the row's whole key window
(``proofs_notes/backward.md``). Checked here: both backends pass the rule at unit scale
and at standard deviation 64 at head_dim 8; at head_dim 64 the CPU path passes and the
Triton path still fails (a strict xfail, the known limitation below); negative controls:
the recompute from the rounded float32 LSE fails it at standard deviation 64, both as dense float32 arithmetic and as the Triton
kernels' own LSE form (``plsh_backward_triton`` without ``stats``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _gradient_case import PARTITION, SCALE, N, S, bias, inputs, worst_ratio

from plsh_fast import plsh_attention
from plsh_ref.partition import counts


def _lse_recompute_gradients(q, k, v, g):
    """The float32 gradients with ``P = exp(x + log(C / s) - lse)`` recomputed from the
    float32 LSE (FlashAttention's backward, as dense arithmetic)."""
    a, b, w, dout = (x.float() for x in (q, k, v, g))
    logits = a @ b.transpose(-1, -2) * SCALE + bias(torch.float32)
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)  # rounded to float32
    probs = torch.exp(logits - lse)
    out = probs @ w
    dp = dout @ w.transpose(-1, -2)
    ds = probs * (dp - (dout * out).sum(-1, keepdim=True))
    return ds @ b * SCALE, ds.transpose(-1, -2) @ a * SCALE, probs.transpose(-1, -2) @ dout


def _api_gradients(backend, q, k, v, g):
    device = torch.device("cpu")
    if backend == "triton":
        import _triton_interp

        device = _triton_interp.DEVICE
    leaves = [x.detach().float().to(device).requires_grad_() for x in (q, k, v)]
    out = plsh_attention(*leaves, partition=PARTITION, causal=True, backend=backend)
    (out * g.float().to(device)).sum().backward()
    return [x.grad.cpu() for x in leaves]


def _backends():
    return [
        "cpu",
        pytest.param("triton", marks=pytest.mark.triton),
    ]


def _load_triton():
    import _triton_interp  # sets TRITON_INTERPRET=1 and reloads the kernels interpreted

    return _triton_interp.load("triton")


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("scale_qk", [1.0, 3.0, 8.0])
def test_float32_gradients_pass_the_rule_at_unit_and_large_logits(backend, scale_qk, request):
    """Logits of standard deviation 1 (control), 9 and 64: every gradient within the rule.

    Compiled float32 Triton kernels take their dots in tf32x3, less accurate than the float32
    yardstick: at standard deviation 64 the emulation of ``tests/_tf32x3_emulation.py``
    puts this case at 1.04 to 1.90 of the allowed error (from the dots and ``D_i = dO_i .
    O_i``, not the LSE; ``tests/fast/triton/test_tf32x3_precision.py``), so there it is not required
    (a GPU run reports it)."""
    if backend == "triton":
        import _triton_interp

        _load_triton()
        if _triton_interp.COMPILED and scale_qk == 8.0:
            reason = "tf32x3 dots at logit std 64 (docstring); not measured on a GPU yet"
            request.node.add_marker(pytest.mark.xfail(strict=False, reason=reason))
    q, k, v, g = inputs(scale_qk)
    assert worst_ratio(_api_gradients(backend, q, k, v, g), q, k, v, g) <= 1.0


@pytest.mark.triton
@pytest.mark.parametrize("scale_qk", [1.0, 8.0])
def test_triton_gradients_at_head_dim_64_still_fail_at_large_logits(scale_qk, request):
    """Known limitation (a fresh-user review of the split statistics, 2026-12-01): at
    head_dim 64 the Triton gradients still exceed the rule at logit standard deviation 64
    (interpreter: ``grad_value`` 2.5 times the allowed error at this case, 4.5 with seed 1,
    4.7 at head_dim 128; head_dim 8 above passes, head_dim 32 fails in ``grad_query``).
    The split removes the LSE's rounding, but ``y_ij - m_i`` is zero at the maximising key
    only if the backward's recomputed logit rounds exactly as the forward's did (the dK/dV
    kernel computes the transposed tile, another operand order), and the kernels keep
    ``D_i = dO_i . O_i`` with the saved output's rounding (``proofs_notes/backward.md``,
    section 3). The CPU path (whole rows recomputed, ``delta = sum P dP``) passes this case
    (``test_cpu_gradients_at_head_dim_64_pass_at_large_logits``). Strict xfail in the
    interpreter so the test flips when it is fixed; unit scale is the passing control."""
    import _triton_interp

    _load_triton()
    if scale_qk == 8.0:
        request.node.add_marker(
            pytest.mark.xfail(
                strict=not _triton_interp.COMPILED,
                raises=AssertionError,
                reason="recomputed logits round unlike the forward's; D_i = dO . O (docstring)",
            )
        )
    q, k, v, g = inputs(scale_qk, head_dim=64)
    assert worst_ratio(_api_gradients("triton", q, k, v, g), q, k, v, g) <= 1.0


@pytest.mark.parametrize("scale_qk", [1.0, 8.0])
def test_cpu_gradients_at_head_dim_64_pass_at_large_logits(scale_qk):
    """The CPU backward at the head_dim of the Triton limitation above: within the rule."""
    q, k, v, g = inputs(scale_qk, head_dim=64)
    assert worst_ratio(_api_gradients("cpu", q, k, v, g), q, k, v, g) <= 1.0


@pytest.mark.parametrize("scale_qk", [1.0, 8.0])
def test_negative_control_recompute_from_the_rounded_lse(scale_qk):
    """The recompute from the float32 LSE (dense arithmetic): within the rule at unit scale
    (the formula is right), outside it at standard deviation 64 (the rounding is the cause)."""
    q, k, v, g = inputs(scale_qk)
    grads = _lse_recompute_gradients(q, k, v, g)
    if scale_qk == 1.0:
        assert worst_ratio(grads, q, k, v, g) <= 1.0
    else:
        with pytest.raises(AssertionError):
            worst_ratio(grads, q, k, v, g)


def _triton_gradients(q, k, v, g, split: bool):
    """The Triton kernels' gradients, with the forward's statistics (``split``) or from
    its float32 LSE alone."""
    import _triton_interp

    plsh_triton = _load_triton()
    pitch, offset = (torch.from_numpy(np.array(x)) for x in (PARTITION.pitch, PARTITION.offset))
    pos = torch.arange(N)
    q, k, v, g = (x.float() for x in (q, k, v, g))
    out, lse, stats = _triton_interp.call(
        plsh_triton.plsh_forward_triton, q, k, v, pitch, offset, pos, pos, SCALE, True,
        return_stats=True,
    )  # fmt: skip
    kw = {"stats": stats} if split else {}
    grads = _triton_interp.call(
        plsh_triton.plsh_backward_triton, q, k, v, out, lse, g, pitch, offset, pos, pos,
        SCALE, True, **kw,
    )  # fmt: skip
    return [x.cpu() for x in grads]


@pytest.mark.triton
def test_negative_control_triton_kernels_from_the_rounded_lse():
    """The same kernels given only the float32 LSE fail the rule at standard deviation 64;
    with the forward's statistics they pass."""
    q, k, v, g = inputs(8.0)
    assert worst_ratio(_triton_gradients(q, k, v, g, split=True), q, k, v, g) <= 1.0
    with pytest.raises(AssertionError):
        worst_ratio(_triton_gradients(q, k, v, g, split=False), q, k, v, g)


@pytest.mark.triton
def test_triton_statistics_are_the_row_maximum_and_log2_row_sum():
    """``stats = (m, log2 l)``: ``m`` the largest admissible logit in the log2 domain,
    ``0 <= log2 l <= log2(n s)``, ``(m + log2 l) ln 2 - ln s`` the LSE (to float32
    rounding); an empty row gives ``(-inf, -inf)`` (first query before every key)."""
    import _triton_interp

    plsh_triton = _load_triton()
    q, k, v, _ = (x.float() for x in inputs(8.0))
    pitch, offset = (torch.from_numpy(np.array(x)) for x in (PARTITION.pitch, PARTITION.offset))
    qpos, kpos = torch.arange(N), torch.arange(N) + 1
    out, lse, stats = (
        x.cpu()
        for x in _triton_interp.call(
            plsh_triton.plsh_forward_triton,
            q,
            k,
            v,
            pitch,
            offset,
            qpos,
            kpos,
            SCALE,
            True,
            return_stats=True,
        )  # fmt: skip
    )
    c = counts(PARTITION, qpos.numpy(), kpos.numpy(), causal=True)
    logits = (q.double() @ k.double().transpose(-1, -2)) * SCALE / math.log(2.0)
    logits = logits.masked_fill(torch.from_numpy(c == 0)[None], -math.inf)
    row_max = logits.amax(dim=-1)
    live = torch.isfinite(row_max)
    assert not bool(live[..., 0].any()) and bool(live[..., 1:].all())
    assert torch.equal(stats[~live], torch.full_like(stats[~live], -math.inf))
    m, log2_l = stats[..., 0].double(), stats[..., 1].double()
    torch.testing.assert_close(m[live], row_max[live], rtol=1e-6, atol=1e-6)
    # l >= C_max 2^0 >= 1 and l <= n s: log2 l is small, so (x - m) - log2 l rounds little.
    assert bool((log2_l[live] >= 0).all()) and bool((log2_l[live] <= math.log2(N * S)).all())
    natural = (m + log2_l) * math.log(2.0) - math.log(S)
    torch.testing.assert_close(lse.double()[live], natural[live], rtol=1e-6, atol=1e-6)


def test_dq_rounding_factor_is_the_exact_rounding_of_mu():
    """The dQ kernel's ``mu = fl(m + log2 l)``: ``dq_rounding_factor`` gives ``2^e`` with
    ``e = mu - m - log2 l`` exactly when ``|m| >= log2 l`` (Fast2Sum), else to
    ``4 log2(n s) 2^-24``; 1 on empty rows; without
    it (factor 1) the relative error of a row would be about ``|m| 2^-24``."""
    from plsh_fast.triton import dq_rounding_factor  # noqa: PLC0415 (needs triton)

    g = torch.Generator().manual_seed(0)
    m = (torch.rand(4096, generator=g, dtype=torch.float64) * 2 - 1) * 2000.0
    log2_l = torch.rand(4096, generator=g, dtype=torch.float64) * math.log2(4096 * 64)
    stats = torch.stack([m, log2_l], -1).float()
    stats[0] = -math.inf  # an empty row
    m32, l32 = stats[1:, 0].double(), stats[1:, 1].double()
    assert bool((m32.abs() >= l32).any()) and bool((m32.abs() < l32).any())
    mu = (stats[1:, 0] + stats[1:, 1]).double()
    exact = torch.exp2(mu - m32 - l32)  # float64: the rounding of mu, exactly
    factor = dq_rounding_factor(stats).double()
    assert factor[0] == 1.0
    fast2sum = m32.abs() >= l32
    torch.testing.assert_close(factor[1:][fast2sum], exact[fast2sum], rtol=2**-23, atol=0)
    # |m| < log2 l: mu is small, e is found to float32 rounding of log2 l
    bound = 4 * math.log2(4096 * 64) * 2**-24
    assert float((factor[1:][~fast2sum] - exact[~fast2sum]).abs().max()) <= bound
    assert float((exact - 1).abs().max()) > 2**-20  # the correction is not negligible


def test_subtraction_of_the_row_maximum_rounds_as_proofs_notes_says():
    """``proofs_notes/backward.md`` section 3: ``fl(y - m)`` in float32 is exact for
    ``y`` in ``[m/2, 2m]`` (Sterbenz), and its rounding changes ``P = C 2^((y - m) -
    log2 l)`` (``1 <= C <= s``, ``l >= max(1, C 2^(y - m))``) by at most
    ``(ln s + 1) 2^-24`` in absolute value, whatever ``|m|``."""
    rng = np.random.default_rng(0)
    s, count = 64, 200_000
    m = (rng.uniform(-1, 1, count) * 10.0 ** rng.uniform(0, 4, count)).astype(np.float32)
    t = rng.exponential(8.0, count)  # distance below the maximum, log2 units
    y = (m.astype(np.float64) - t).astype(np.float32)
    diff32 = (y - m).astype(np.float64)  # float32 subtraction
    exact = y.astype(np.float64) - m.astype(np.float64)
    same_sign = np.sign(y) == np.sign(m)
    sterbenz = same_sign & (np.abs(y) >= np.abs(m) / 2) & (np.abs(y) <= 2 * np.abs(m))
    assert sterbenz.sum() > count // 4 and (~sterbenz).sum() > count // 100
    assert not np.array_equal(diff32, exact)  # elsewhere the subtraction does round
    assert np.array_equal(diff32[sterbenz], exact[sterbenz])
    c = rng.integers(1, s + 1, count).astype(np.float64)
    l = np.maximum(1.0, c * np.exp2(exact)) * rng.uniform(1, 4, count)
    err = np.abs(c * np.exp2(diff32 - np.log2(l)) - c * np.exp2(exact - np.log2(l)))
    bound = (math.log(s) + 1) * 2.0**-24
    assert float(err.max()) <= bound
    # the bound is not vacuous: the worst case found is within a factor 8 of it
    assert float(err.max()) >= bound / 8
