"""``input_precision="tf32x3"`` of the float32 Triton kernels against the tolerance rule.

The float32 kernels (``plsh_fast.triton._forward``, ``plsh_fast.triton._backward``) compile
every ``tl.dot`` as three TF32 tensor-core MMAs (``dot_precision``). The Triton interpreter
computes those dots exactly in float32, so the interpreted kernel tests cannot fail on
tf32x3. Here the kernels' float32 arithmetic is redone on CPU with a model of the compiled
dots (``tests/_tf32x3_emulation.py``: the split ``a = a_hi + a_lo`` with ``cvt.rna``, the
three MMAs in Triton's order with the accumulator added last, exact products, chunks of 8
rounded into the float32 accumulator; the assumptions are listed there) and held to the
SPEC section 6 rule against the float64 reference, as the other fast-path tests are: the
output and LSE of the forward, and the three gradients of the backward.

Shapes are SPEC section 7's GPU configuration scaled down: causal, batch 1, four of the
standard 16-head slopes (sigma 1.41, 8, 45.3, 256), head_dim 64 and 128, 300 positions
(partial tiles; the shipped float32 tiles of sm_90, ``tile_config``: 64 x 16, head_dim
in two column halves; the dK/dV kernel's 64-key tiles in two column-half programs, its
tf32x3 written out with the same arithmetic), num_samples 4 and 16,
standard-normal inputs (and one case of magnitude 8, logits of standard deviation 64). The MMA's treatment of the low bits of a
non-TF32 operand and the rounding of its accumulation are not published: each case runs
under three models (truncated operands / round-to-nearest accumulation; operands rounded
like ``cvt.rna``; truncated operands, accumulation toward zero and 2-ulp ``exp2`` and
division errors). Negative control: plain ``tf32`` (one MMA on the raw float32 operands)
must fail the same rule. ``test_emulation_follows_the_kernels`` ties the emulation to the
kernels: run with the same tiles, they agree to float32 rounding.
"""

from __future__ import annotations

import math
from fractions import Fraction

import _gradient_case as case
import _triton_interp
import numpy as np
import pytest
import torch
from _tf32x3_emulation import (
    KernelArithmetic,
    emulated_backward,
    emulated_dot,
    emulated_forward,
    round_tf32,
)

from plsh_fast.peers import dense_attention
from plsh_ref.alibi import alibi_slopes
from plsh_ref.attention import plsh_attention
from plsh_ref.partition import count_bias, counts, draw_partition
from plsh_ref.testing.baseline import plain_attention_torch
from plsh_ref.testing.tolerance import assert_close_to_reference

plsh_triton = _triton_interp.load("triton")

N = 300
HEADS = [0, 5, 10, 15]  # of the standard 16-head slopes: sigma 1.41 .. 256
MODELS = {
    "truncate": dict(operand_rounding="rz", accumulate="rn"),
    "rna": dict(operand_rounding="rna", accumulate="rn"),
    "pessimistic": dict(operand_rounding="rz", accumulate="rz", approx_ulps=2.0),
}


def _gpu_tiles(head_dim: int, arch: int = 90):
    """The shipped float32 tiles on sm_<arch> (TileConfig) and the emulation's keywords."""
    tiles = plsh_triton.tile_config(
        head_dim, head_dim, torch.device("cuda"), torch.float32, capability=divmod(arch, 10)
    )
    fwd_split = plsh_triton.head_dim_split(head_dim, tiles.halves(forward=True))
    split = plsh_triton.head_dim_split(head_dim, tiles.halves(forward=False))
    forward = dict(block_m=tiles.block_m, block_n=tiles.block_n, d_split=fwd_split)
    backward = dict(forward, d_split=split, dkdv_block_m=tiles.dkdv_block_m, dv_split=split)
    return tiles, forward, backward


@pytest.fixture(autouse=True)
def _one_thread():
    """Many small float64 matmuls: one thread (two spin badly on a shared 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _tf32_by_definition(x: float, mode: str) -> float:
    """The TF32 number nearest to ``x`` (ties away from zero) or toward zero, from the
    exact binary expansion: a multiple of ``2^(e - 10)`` with ``2^e <= |x| < 2^(e + 1)``."""
    if x == 0.0:
        return x
    a = Fraction(abs(x))
    e = math.frexp(abs(x))[1] - 1
    quantum = Fraction(2) ** (e - 10)
    m, rem = divmod(a, quantum)
    if mode == "rna" and rem >= quantum / 2:
        m += 1
    return math.copysign(float(m * quantum), x)


def test_round_tf32_matches_its_definition_including_ties():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(4000) * np.exp2(rng.integers(-30, 30, 4000))).astype(np.float32)
    bits = x.view(np.uint32)
    ties = ((bits & ~np.uint32(0x1FFF)) | np.uint32(0x1000)).view(np.float32)  # exact halves
    x = np.concatenate([x, ties, np.float32([1.0, -1.5, 3.0e38, -0.0])])
    t = torch.from_numpy(x)
    for mode in ("rna", "rz"):
        got = round_tf32(t, mode).numpy()
        want = np.array([_tf32_by_definition(float(v), mode) for v in x], dtype=np.float32)
        np.testing.assert_array_equal(got, want)
    hi = round_tf32(t, "rna")
    lo = t - hi  # exact in float32: |lo| <= 2^-11 |x|
    assert torch.equal(hi.double() + lo.double(), t.double())
    assert bool((lo.abs() <= hi.abs() * 2.0**-11).all())
    with pytest.raises(TypeError, match="^x:"):
        round_tf32(t.double())


def test_emulated_dots_error_sizes():
    """tf32x3 is float32-accurate on one dot, plain tf32 is not, ieee is torch's matmul."""
    gen = torch.Generator().manual_seed(1)
    a = torch.randn((64, 128), generator=gen)
    b = torch.randn((128, 32), generator=gen)
    exact = a.double() @ b.double()
    scale = float((a.double().abs() @ b.double().abs()).max())
    err = {
        p: float((emulated_dot(a, b, None, p).double() - exact).abs().max()) / scale
        for p in ("ieee", "tf32x3", "tf32")
    }
    assert err["tf32x3"] < 4 * 2.0**-23 and err["ieee"] < 4 * 2.0**-23
    assert err["tf32"] > 2.0**-14  # TF32 rounding, 2^-11 per operand
    assert torch.equal(emulated_dot(a, b, None, "ieee"), a @ b)
    # Operands that are TF32 numbers already: a_lo = b_lo = 0, tf32x3 equals one MMA.
    a_t, b_t = round_tf32(a), round_tf32(b)
    assert torch.equal(emulated_dot(a_t, b_t, None, "tf32x3"), emulated_dot(a_t, b_t, None, "tf32"))


def _dense_grads(q, k, v, grad_out, bias, scale, dtype):
    q, k, v = (t.detach().to(dtype).requires_grad_(True) for t in (q, k, v))
    out = dense_attention(q, k, v, bias=bias, scale=scale)
    (out * grad_out.to(dtype)).sum().backward()
    return q.grad, k.grad, v.grad


def _problem(head_dim, num_samples, magnitude=1.0, seed=0):
    rng = np.random.default_rng(seed)
    sigma = 1.0 / alibi_slopes(16)[HEADS]
    partition = draw_partition(sigma, num_samples, seed=seed)
    shape = (1, len(HEADS), N, head_dim)
    q, k, v, g = (
        torch.from_numpy(magnitude * rng.standard_normal(shape)).float() for _ in range(4)
    )
    pos = np.arange(N)
    c = counts(partition, pos, pos, causal=True)
    bias = count_bias(c, num_samples)
    scale = 1.0 / math.sqrt(head_dim)
    q64, k64, v64 = (t.double().numpy() for t in (q, k, v))
    ref = plsh_attention(
        q64, k64, v64, partition=partition, causal=True, scale=scale, query_positions=pos,
        key_positions=pos,
     return_lse=True,)  # fmt: skip
    base = plain_attention_torch(q64, k64, v64, bias, scale=scale, dtype="float32")
    grad_ref = _dense_grads(q.double(), k.double(), v.double(), g.double(), bias, scale,
                            torch.float64)  # fmt: skip
    grad_base = _dense_grads(q, k, v, g, bias, scale, torch.float32)
    return dict(
        qkvg=(q, k, v, g), counts=c, s=num_samples, scale=scale, ref=ref, base=base,
        grad_ref=grad_ref, grad_base=grad_base,
    )  # fmt: skip


def _check(problem, arith, arch=90):
    """The SPEC section 6 rule on the forward (output, LSE) and the three gradients."""
    q, k, v, g = problem["qkvg"]
    c, s, scale = problem["counts"], problem["s"], problem["scale"]
    _, fwd, bwd = _gpu_tiles(q.shape[3], arch)
    out, lse, stats = emulated_forward(arith, q, k, v, c, s, scale, return_stats=True, **fwd)
    ref, base = problem["ref"], problem["base"]
    ratios = [
        assert_close_to_reference(out, ref[0], base[0], "float32", name="output"),
        assert_close_to_reference(lse, ref[1], base[1], "float32", name="lse"),
    ]
    grads = emulated_backward(arith, q, k, v, out, lse, g, c, s, scale, stats=stats, **bwd)
    # Floor relative to the largest gradient entry, as tests/fast/triton/test_plsh_triton.py.
    magnitude = max(float(r.abs().max()) for r in problem["grad_ref"])
    for name, x, r, b in zip(
        ("grad_query", "grad_key", "grad_value"), grads, problem["grad_ref"],
        problem["grad_base"],
    ):  # fmt: skip
        ratios.append(
            assert_close_to_reference(x, r, b, "float32", name=name, floor_scale=magnitude)
        )
    return ratios


@pytest.mark.triton
@pytest.mark.parametrize("d", [32, 64])
def test_emulation_follows_the_kernels(d):
    """The emulation is the kernels' algorithm: against the Triton kernels run with the
    same tiles (interpreter: float32 dots, so ``ieee``; compiled on a GPU: ``tf32x3``, so
    this also checks the model against the hardware), forward and backward agree to
    float32 rounding (1e-5 relative; a wrong weight, LSE term or tile order would not).
    d = 64: the dK/dV kernel's own tf32x3 (column quarters of 16, sm_90)."""
    rng = np.random.default_rng(3)
    n, s = 100, 4
    sigma = 1.0 / alibi_slopes(16)[[0, 12]]
    partition = draw_partition(sigma, s, seed=3)
    q, k, v, g = (torch.from_numpy(rng.standard_normal((1, 2, n, d))).float() for _ in range(4))
    pos = np.arange(n)
    c = counts(partition, pos, pos, causal=True)
    scale = 0.3
    pitch, offset = (torch.from_numpy(np.array(x)) for x in (partition.pitch, partition.offset))
    tpos = torch.from_numpy(pos)
    tiles, fwd, bwd = _gpu_tiles(d)
    blocks = dict(tiles=tiles)
    out, lse, stats = _triton_interp.call(
        plsh_triton.plsh_forward_triton, q, k, v, pitch, offset, tpos, tpos, scale, True,
        return_stats=True, **blocks,
    )  # fmt: skip
    grads = _triton_interp.call(
        plsh_triton.plsh_backward_triton, q, k, v, out, lse, g, pitch, offset, tpos, tpos,
        scale, True, stats=stats, **blocks,
    )  # fmt: skip
    arith = KernelArithmetic("tf32x3" if _triton_interp.COMPILED else "ieee")
    e_out, e_lse, e_stats = emulated_forward(arith, q, k, v, c, s, scale, return_stats=True, **fwd)
    e_grads = emulated_backward(arith, q, k, v, out, lse, g, c, s, scale, stats=stats.cpu(), **bwd)
    for name, got, want in zip(
        ("output", "lse", "stats", "grad_query", "grad_key", "grad_value"),
        (out, lse, stats, *grads),
        (e_out, e_lse, e_stats, *e_grads),
    ):
        _assert_agree(got, want, name)
    # Negative control: the emulation with the counts replaced by the mask disagrees.
    bad_out, _ = emulated_forward(arith, q, k, v, (c > 0).astype(np.int64), s, scale, **fwd)
    with pytest.raises(AssertionError):
        _assert_agree(out, bad_out, "output")


def _assert_agree(got, want, name):
    assert torch.equal(torch.isinf(got), torch.isinf(want)), name
    fin = torch.isfinite(want)
    torch.testing.assert_close(
        got[fin], want[fin], rtol=1e-5, atol=1e-5 * float(want[fin].abs().max()), msg=name
    )


@pytest.mark.parametrize(
    "head_dim,num_samples,arch",
    [(64, 4, 90), (64, 16, 90), (128, 4, 90), (128, 16, 90), (128, 16, 80)],
)
def test_tf32x3_kernels_pass_the_tolerance_rule(head_dim, num_samples, arch):
    """The shipped float32 tiles of sm_90 and, at d = 128, of sm_80 (16 x 16; at d = 64 the
    sm_80 tiles are those of sm_90)."""
    problem = _problem(head_dim, num_samples)
    for kw in MODELS.values():
        _check(problem, KernelArithmetic("tf32x3", **kw), arch)


def test_tf32x3_large_logits_pass_the_tolerance_rule():
    """Magnitude 8 (logits of standard deviation 64): the dots' error dominates."""
    problem = _problem(64, 16, magnitude=8.0, seed=1)
    for kw in MODELS.values():
        _check(problem, KernelArithmetic("tf32x3", **kw))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_plain_tf32_fails_the_tolerance_rule(head_dim):
    """Negative control: one TF32 MMA per dot is ~2^-11 relative, hundreds of times the
    float32 yardstick; the rule must reject it (forward output first)."""
    problem = _problem(head_dim, 16)
    with pytest.raises(AssertionError, match="^output:"):
        _check(problem, KernelArithmetic("tf32", **MODELS["rna"]))
    arith = KernelArithmetic("tf32", **MODELS["truncate"])
    q, k, v, g = problem["qkvg"]
    _, fwd, bwd = _gpu_tiles(head_dim)
    out, lse = emulated_forward(
        arith, q, k, v, problem["counts"], problem["s"], problem["scale"], **fwd
    )
    with pytest.raises(AssertionError, match="^lse:"):
        assert_close_to_reference(lse, problem["ref"][1], problem["base"][1], "float32",
                                  name="lse")  # fmt: skip
    # The backward on its own (fed the float64 forward) also fails.
    ref_out = torch.from_numpy(problem["ref"][0]).float()
    ref_lse = torch.from_numpy(problem["ref"][1]).float()
    dq, _, _ = emulated_backward(
        arith, q, k, v, ref_out, ref_lse, g, problem["counts"], problem["s"], problem["scale"],
        **bwd,
    )  # fmt: skip
    with pytest.raises(AssertionError, match="^grad_query:"):
        assert_close_to_reference(dq, problem["grad_ref"][0], problem["grad_base"][0],
                                  "float32", name="grad_query")  # fmt: skip


def test_split_lse_passes_at_logit_std_9_under_every_model():
    """The case of ``tests/fast/test_gradient_precision.py`` at logits of standard deviation 9
    (40 positions, head_dim 8, s = 3) through the kernels' arithmetic: with the forward's
    statistics (row maximum, ``log2`` row sum) the gradients pass the rule under every
    model; the recompute from the float32 LSE alone (negative control) fails it under every
    model (1.17 to 1.44 of the allowed error)."""
    q, k, v, g = (x.float() for x in case.inputs(3.0))
    c = counts(case.PARTITION, np.arange(case.N), np.arange(case.N), causal=True)
    ref = case.dense_gradients(q, k, v, g, torch.float64)
    base = case.dense_gradients(q, k, v, g, torch.float32)
    floor = max(float(r.abs().max()) for r in ref)

    def worst(grads):
        return max(
            assert_close_to_reference(x, r, b, "float32", name=n, floor_scale=floor)
            for n, x, r, b in zip(("grad_query", "grad_key", "grad_value"), grads, ref, base)
        )

    for kw in MODELS.values():
        arith = KernelArithmetic("tf32x3", **kw)
        out, lse, stats = emulated_forward(arith, q, k, v, c, case.S, case.SCALE, return_stats=True)
        args = (arith, q, k, v, out, lse, g, c, case.S, case.SCALE)
        assert worst(emulated_backward(*args, stats=stats)) <= 1.0
        with pytest.raises(AssertionError):
            worst(emulated_backward(*args))
