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
and at standard deviation 64 at head_dim 8; at head_dim 64 the CPU path passes; the
Triton path passes at head_dim 64, 72 and 128, standard deviation 64 and 100, with an LSE
gradient too, now that the forward's logits are the backward kernels' dot and the LSE
gradient is folded into ``D``; negative controls: the forward's former transposed K tile
and the LSE gradient as an extra value column fail it in ``grad_value``, the recompute
from the rounded float32 LSE fails it at standard deviation 64, both as dense float32
arithmetic and as the Triton kernels' own LSE form (``plsh_backward_triton`` without
``stats``); and the rule's own noise at large logits, which no float32 formula removes.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np
import pytest
import torch
from _gradient_case import (
    PARTITION,
    SCALE,
    N,
    S,
    bias,
    dense_gradients,
    dense_gradients_with_lse,
    inputs,
    rule_ratio,
    two_chunk_ratios,
    worst_ratio,
)

from plsh_fast import plsh_attention
from plsh_ref.partition import counts
from plsh_ref.testing.tolerance import assert_close_to_reference


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


def _blas_dots(width: int) -> tuple[bool, bool]:
    """For float32 ``(16, width)`` operands: whether numpy's ``q @ k.T`` equals
    ``(k @ q.T).T`` bit for bit (the interpreter's forward / dQ and dK/dV logits: the shared
    layout), and whether it equals ``q @ ascontiguousarray(k.T)`` (the forward's former K
    tile loaded transposed)."""
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((16, width)).astype(np.float32) * 8 for _ in range(2))
    shared = np.matmul(q, k.T)
    return (
        np.array_equal(shared, np.matmul(k, q.T).T),
        np.array_equal(shared, np.matmul(q, np.ascontiguousarray(k.T))),
    )


#: why the interpreted kernels' logits may differ between the kernels on some machines
BLAS_REASON = (
    "in the interpreter tl.dot is numpy's float32 matmul, whose rounding depends on the BLAS "
    "kernel OpenBLAS picks for the CPU: its Haswell and Zen kernels round q @ k.T and "
    "(k @ q.T).T differently (measured on an AMD EPYC, 2026-12-02), so the forward and "
    "backward kernels' logits differ there, which is not the GPU's behaviour; `make tests` "
    "pins OPENBLAS_CORETYPE=Sandybridge on x86-64, where they round alike"
)


def _load_triton():
    import _triton_interp  # sets TRITON_INTERPRET=1 and reloads the kernels interpreted

    if not _triton_interp.COMPILED and not all(_blas_dots(w)[0] for w in (16, 32, 64)):
        pytest.skip(BLAS_REASON)
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


def _worst_ratio_with_lse(grads, q, k, v, g, g_lse) -> float:
    ref = dense_gradients_with_lse(q, k, v, g, g_lse, torch.float64)
    base = dense_gradients_with_lse(q, k, v, g, g_lse, torch.float32)
    floor = max(float(r.abs().max()) for r in ref)
    return max(
        assert_close_to_reference(x.numpy(), r.numpy(), b.numpy(), "float32", floor_scale=floor)
        for x, r, b in zip(grads, ref, base)
    )


@pytest.mark.triton
@pytest.mark.parametrize("head_dim", [64, 72, 128])
@pytest.mark.parametrize("scale_qk", [8.0, 10.0])
def test_triton_gradients_with_lse_pass_the_rule_at_large_logits(head_dim, scale_qk, request):
    """Logit standard deviation 64 and 100 at head_dim 64, 72 (two padded 64-column chunks)
    and 128, through ``grad_query``, ``grad_key``, ``grad_value`` of the loss ``sum(out g) +
    sum(lse g_lse)`` (the output's and the LSE's gradient together): every gradient within
    the rule. The forward kernel's logits are the backward kernels' dot (same operand
    layout, same chunks), so the maximising key's ``y - m`` is 0 in the backward too, and
    the LSE gradient is folded into ``D`` (no extra value column, which changed the chunks
    of the backward's logits); before, ``grad_value`` reached 2.5 to 25 times the allowed
    error here (``test_negative_control_forward_logits_in_the_transposed_k_layout``), and
    with the LSE's extra column 2 to 14 times. Fixed seed, deterministic arithmetic; over
    seeds 0-5 (interpreter, 2026-12-01) one case of 36 at head_dim 64-128 exceeded the rule
    (head_dim 72, seed 2: 2.2 in ``grad_query``), the size of the rule's own noise at these
    logits (``test_rule_noise_of_independent_float32_gradients_at_large_logits``), so a
    fresh seed fails with probability about 3-10%. Compiled (tf32x3 dots) not required."""
    assert _triton_ratio_with_lse(scale_qk, head_dim, head_dim, request) <= 1.0


def _triton_ratio_with_lse(scale_qk, head_dim, head_dim_v, request) -> float:
    """Worst rule ratio of the Triton gradients (``plsh_attention``, shipped tiles) of the
    loss ``sum(out g) + sum(lse g_lse)`` at the case's seed 0 (a non-strict xfail when
    compiled: tf32x3 dots, not required)."""
    import _triton_interp

    _load_triton()
    if _triton_interp.COMPILED:
        reason = "tf32x3 dots at logit std 64 (test above); not measured on a GPU yet"
        request.node.add_marker(pytest.mark.xfail(strict=False, reason=reason))
    q, k, v, g = inputs(scale_qk, head_dim=head_dim, head_dim_v=head_dim_v)
    g_lse = torch.from_numpy(np.random.default_rng(1).standard_normal((1, 2, N)))
    device = _triton_interp.DEVICE
    leaves = [x.detach().float().to(device).requires_grad_() for x in (q, k, v)]
    out, lse = plsh_attention(
        *leaves, partition=PARTITION, causal=True, return_lse=True, backend="triton"
    )
    ((out * g.float().to(device)).sum() + (lse * g_lse.float().to(device)).sum()).backward()
    grads = [x.grad.cpu() for x in leaves]
    return _worst_ratio_with_lse(grads, q, k, v, g, g_lse)


@pytest.mark.triton
@pytest.mark.parametrize("head_dims", [(32, 64), (64, 128), (128, 64)])
@pytest.mark.parametrize("scale_qk", [8.0, 10.0])
def test_triton_gradients_at_unequal_head_sizes_pass_the_rule_at_large_logits(
    head_dims, scale_qk, request
):
    """Unequal head sizes, logit standard deviation 64 and 100, with an LSE gradient: every
    gradient within the rule. The backward takes the narrower ``head_dim`` whole
    (``TileConfig.narrow_whole``), and the float32 forward now takes it in the same chunks
    (``TileConfig.forward_chunks``); before, it took it in halves, its logits rounded
    otherwise and ``grad_value`` reached 2.6 and 6.5 times the allowed error at 32/64 and
    64/128, standard deviation 64 (6.6 and 12.1 at 100;
    ``test_negative_control_forward_chunks_unlike_the_backward``). At 128/64 the wider
    ``head_dim`` is in halves in both (a control of the rule's direction). Fixed seed,
    deterministic; noise as in the test above."""
    d, dv = head_dims
    assert _triton_ratio_with_lse(scale_qk, d, dv, request) <= 1.0


@pytest.mark.triton
@pytest.mark.parametrize("head_dims", [(32, 64), (64, 128)])
def test_negative_control_forward_chunks_unlike_the_backward(head_dims):
    """The forward kernel with its former column chunks at unequal head sizes (the
    configuration without ``narrow_whole``: ``head_dim`` in halves, 16 + 16 and 32 + 32,
    while the backward takes it whole): ``grad_value`` fails the rule at logit standard
    deviation 64 (2.6 and 6.5 times the allowed error, interpreter 2026-12-01), the shipped
    forward (the backward's chunks) passes it."""
    import _triton_interp

    if _triton_interp.COMPILED:
        pytest.skip("interpreter rounding (numpy matmul of the column chunks)")
    d, dv = head_dims
    q, k, v, g = inputs(8.0, head_dim=d, head_dim_v=dv)
    ref = dense_gradients(q, k, v, g, torch.float64)
    base = dense_gradients(q, k, v, g, torch.float32)
    floor = max(float(r.abs().max()) for r in ref)

    def value_ratio(forward_tiles):
        grads = _triton_gradients(q, k, v, g, split=True, forward_tiles=forward_tiles)
        return rule_ratio(grads[2], ref[2], base[2], floor)

    former = _forward_tiles(q, v, narrow_whole=False)
    assert former.forward_chunks(d, dv, torch.float32)[0] == (d // 2, d // 2)
    assert _forward_tiles(q, v).forward_chunks(d, dv, torch.float32)[0] == (d, 0)
    assert value_ratio(None) <= 1.0
    assert value_ratio(former) > 2.0


def test_float32_forward_chunks_are_the_dq_kernels():
    """``TileConfig.forward_chunks``: float32 at unequal head sizes, the narrower
    ``head_dim`` in the dQ kernel's chunks (whole under ``narrow_whole``: 64, 40 -> 32 +
    16), on every shipped configuration (interpreter, sm_90, sm_80) where the backward takes
    it whole; the value head size and the half types keep the forward's own split (halves
    where ``TileConfig.halves(forward=True)``), and so does a wider ``head_dim``."""
    plsh_triton = _load_triton()
    split = plsh_triton.head_dim_split
    devices = [(torch.device("cpu"), None), (torch.device("cuda"), (9, 0))]
    devices.append((torch.device("cuda"), (8, 0)))
    checked = 0
    for device, capability in devices:
        for d, dv in [(64, 128), (40, 128), (32, 64), (128, 64), (64, 64), (96, 128)]:
            for dtype in (torch.float32, torch.bfloat16):
                cfg = plsh_triton.tile_config(d, dv, device, dtype, capability)
                halves = cfg.halves(forward=True)
                chunks_d, chunks_dv = cfg.forward_chunks(d, dv, dtype)
                assert chunks_dv == split(dv, halves)
                dq_d = cfg.backward_chunks(d, dv, dkdv=False)[0]
                if dtype == torch.float32 and cfg.narrow_whole and d < dv:
                    assert chunks_d == dq_d == split(d)
                    checked += 1
                else:
                    assert chunks_d == split(d, halves)
    assert checked == 3 * 4  # four narrower head sizes on each of the three configurations


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


def _forward_tiles(q, v, **changes):
    """The shipped float32 configuration of the case's head sizes with ``changes``
    (``dataclasses.replace``), for the forward kernel alone."""
    import _triton_interp

    plsh_triton = _load_triton()
    tiles = plsh_triton.tile_config(q.shape[-1], v.shape[-1], _triton_interp.DEVICE, torch.float32)
    return dataclasses.replace(tiles, **changes)


def _triton_gradients(q, k, v, g, split: bool, forward_tiles=None):
    """The Triton kernels' gradients, with the forward's statistics (``split``) or from
    its float32 LSE alone; ``forward_tiles``: the forward kernel's ``TileConfig``
    (``None``: the shipped one; the backward always runs the shipped one)."""
    import _triton_interp

    plsh_triton = _load_triton()
    pitch, offset = (torch.from_numpy(np.array(x)) for x in (PARTITION.pitch, PARTITION.offset))
    pos = torch.arange(N)
    scale = 1.0 / math.sqrt(q.shape[-1])
    q, k, v, g = (x.float() for x in (q, k, v, g))
    out, lse, stats = _triton_interp.call(
        plsh_triton.plsh_forward_triton, q, k, v, pitch, offset, pos, pos, scale, True,
        return_stats=True, tiles=forward_tiles,
    )  # fmt: skip
    kw = {"stats": stats} if split else {}
    grads = _triton_interp.call(
        plsh_triton.plsh_backward_triton, q, k, v, out, lse, g, pitch, offset, pos, pos,
        scale, True, **kw,
    )  # fmt: skip
    return [x.cpu() for x in grads]


@pytest.mark.triton
@pytest.mark.parametrize("head_dim", [64, 128])
def test_negative_control_forward_logits_in_the_transposed_k_layout(head_dim):
    """The forward kernel with its former logits' dot (``TileConfig.variant=4``: the K tile loaded
    transposed, ``(D, BLOCK_N)``, whose float32 dot rounds unlike the backward kernels'
    ``tl.dot(q, tl.trans(k))`` / ``tl.dot(k, tl.trans(q))`` in the interpreter from column
    chunks of 32): ``grad_value`` fails the rule at logit standard deviation 64 (2.5 and
    4.7 times the allowed error), the same kernels with the shared layout pass it."""
    import _triton_interp

    if _triton_interp.COMPILED:
        pytest.skip("interpreter rounding (numpy matmul of the two operand layouts)")
    if _blas_dots(32)[1]:
        pytest.skip(
            "this BLAS kernel rounds the transposed K tile like the shared layout (OpenBLAS's "
            "Sandybridge kernel, pinned by `make tests`; the kernel of the CPU this control was "
            "written on rounded it apart from width 32): the former layout is not wrong here"
        )
    _load_triton()
    q, k, v, g = inputs(8.0, head_dim=head_dim)
    ref = dense_gradients(q, k, v, g, torch.float64)
    base = dense_gradients(q, k, v, g, torch.float32)
    floor = max(float(r.abs().max()) for r in ref)

    def value_ratio(variant):
        tiles = _forward_tiles(q, v, variant=variant)
        grads = _triton_gradients(q, k, v, g, split=True, forward_tiles=tiles)
        return rule_ratio(grads[2], ref[2], base[2], floor)

    assert value_ratio(0) <= 1.0
    assert value_ratio(4) > 2.0


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


def test_rule_noise_of_independent_float32_gradients_at_large_logits():
    """The rule's own noise at large logits (``proofs_notes/backward.md``, section 3): float32
    attention that differs from the yardstick only in how its logits' float32 dot rounds
    (two half-width matmuls) fails the rule for a fraction of the seeds at logit standard
    deviation 64, none at unit scale. Its probability errors come from the logits' rounding
    alone and are as large as the yardstick's, but ``max|error|`` is taken over the few rows
    in which two keys compete, so the factor 2 of the rule does not always cover a second,
    independent draw of it. Seeds 0-99, head_dim 32 (measured 2026-12-01: 0 of 100 fail at
    unit scale, max ratio below 0.5; 6 of 100 at standard deviation 64, ``0.065`` of 200);
    deterministic."""
    unit = two_chunk_ratios(1.0, range(100))
    large = two_chunk_ratios(8.0, range(100))
    assert max(unit) < 0.5
    failures = sum(r > 1.0 for r in large)
    assert 2 <= failures <= 20, failures


@pytest.mark.triton
def test_negative_control_lse_gradient_as_an_extra_value_column():
    """The LSE gradient through the former extra value column (``V' = [V, 1]``, ``O' = [O,
    0]``, ``dO' = [dO, g_lse]``, the same kernels): the value head size becomes 65, the
    backward then takes head_dim 64 whole (``TileConfig.narrow_whole``) while the forward
    took it in two column chunks, and ``grad_value`` fails the rule at logit standard
    deviation 64 (4.4 times the allowed error); folded into ``D`` (``grad_lse=``) it passes."""
    import _triton_interp

    if _triton_interp.COMPILED:
        pytest.skip("interpreter rounding (numpy matmul of the column chunks)")
    plsh_triton = _load_triton()
    q, k, v, g = inputs(8.0, head_dim=64)
    g_lse = torch.from_numpy(np.random.default_rng(1).standard_normal((1, 2, N)))
    ref = dense_gradients_with_lse(q, k, v, g, g_lse, torch.float64)
    base = dense_gradients_with_lse(q, k, v, g, g_lse, torch.float32)
    floor = max(float(r.abs().max()) for r in ref)
    pitch, offset = (torch.from_numpy(np.array(x)) for x in (PARTITION.pitch, PARTITION.offset))
    pos = torch.arange(N)
    q, k, v, g, g_lse = (x.float() for x in (q, k, v, g, g_lse))
    args = (pitch, offset, pos, pos, 1.0 / math.sqrt(64), True)
    out, lse, stats = plsh_triton.plsh_forward_triton(q, k, v, *args, return_stats=True)
    folded = plsh_triton.plsh_backward_triton(
        q, k, v, out, lse, g, *args, stats=stats, grad_lse=g_lse
    )
    ones, zeros = v.new_ones(*v.shape[:3], 1), v.new_zeros(*v.shape[:3], 1)
    column = plsh_triton.plsh_backward_triton(
        q, k, torch.cat([v, ones], -1), torch.cat([out, zeros], -1), lse,
        torch.cat([g, g_lse[..., None]], -1), *args, stats=stats,
    )  # fmt: skip
    assert rule_ratio(folded[2], ref[2], base[2], floor) <= 1.0
    assert rule_ratio(column[2][..., :-1], ref[2], base[2], floor) > 2.0


def test_interpreter_dots_of_the_shared_layout_round_alike():
    """What the kernels' shared layout relies on in the interpreter (``tl.dot`` is
    ``np.matmul``): ``q @ trans(k)`` (forward, dQ kernel) and ``k @ trans(q)`` (dK/dV
    kernel) give the same float32 logits bit for bit, at chunk widths 16 to 64. Where the
    BLAS kernel is not the pinned one (``OPENBLAS_CORETYPE`` unset, or set by the machine to
    another kernel: Haswell was seen 2026-12-02) and rounds them apart, the interpreted
    Triton tests are skipped (:data:`BLAS_REASON`); with Sandybridge pinned, as
    ``make tests`` does, this must hold."""
    alike = [_blas_dots(w)[0] for w in (16, 32, 64)]
    if not all(alike) and os.environ.get("OPENBLAS_CORETYPE", "").lower() != "sandybridge":
        pytest.skip(BLAS_REASON)
    assert alike == [True, True, True]


def test_negative_control_the_blas_check_sees_a_different_rounding():
    """The check above can fail: float32 logits summed in another order (the columns
    reversed) differ from ``q @ k.T`` in some bits at these sizes."""
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((16, 64)).astype(np.float32) * 8 for _ in range(2))
    reordered = np.zeros((16, 16), dtype=np.float32)
    for c in reversed(range(64)):
        reordered += np.outer(q[:, c], k[:, c])
    assert not np.array_equal(np.matmul(q, k.T), reordered)
