"""plsh_fast.nn with a Pólya kernel per head (``kernels=``, plsh_ref.kernels).

The module's partitions must be those of ``draw_partition(kernels, ...)`` (eval and training
draws), its output and gradients those of the float64 reference on the same partition under
the SPEC section 6 rule (bins bit for bit), ``method="exact"`` the exact attention with the
bias ``log k_h``; bad kernels are refused, naming ``kernels``, before any work; the default
(ALiBi, no kernels) is unchanged.
"""

from __future__ import annotations

import copy
import io
import math
import pickle
from dataclasses import dataclass

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch._dynamo.backends.debugging import aot_eager  # noqa: E402

from plsh_fast._partition import bins as fast_bins  # noqa: E402
from plsh_fast.nn import (  # noqa: E402
    PLSHAttention,
    PLSHSelfAttention,
    check_kernel_heads,
    has_torch_bias,
    kernel_bias,
)
from plsh_ref.alibi import alibi_slopes  # noqa: E402
from plsh_ref.attention import biased_attention  # noqa: E402
from plsh_ref.attention import plsh_attention as ref_plsh_attention  # noqa: E402
from plsh_ref.kernels import (  # noqa: E402
    DistanceKernel,
    Exponential,
    KerpleLog,
    KerplePower,
    Mixture,
    kernel_matrix,
)
from plsh_ref.partition import bins, count_bias, counts, derived_seed, draw_partition  # noqa: E402
from plsh_ref.testing.baseline import plain_attention_numpy  # noqa: E402
from plsh_ref.testing.tolerance import assert_close_to_reference  # noqa: E402

torch.set_num_threads(1)

KERNELS = {
    "kerple_log": [KerpleLog(0.7, 0.5), KerpleLog(1.5, 0.1), KerpleLog(0.3, 2.0), KerpleLog(3.0, 1.0)],
    "kerple_power": [KerplePower(0.5, 0.5), KerplePower(2.0, 0.2), KerplePower(0.1, 1.0),
                     KerplePower(1.0, 0.8)],
    "mixture": [Mixture([0.5, 0.5], [Exponential(2.0), KerpleLog(1.0, 1.0)]),
                Mixture([0.25, 0.75], [KerplePower(0.5, 0.5), Exponential(16.0)]),
                Mixture([1.0, 0.0], [KerpleLog(2.0, 0.25), Exponential(1.0)]),
                Exponential(8.0)],
}  # fmt: skip


@dataclass(frozen=True)
class Hyperbolic(DistanceKernel):
    """A Pólya kernel of one's own: ``k = (1 + r)^-2`` (KERPLE-log's (2, 1), written out)."""

    def k(self, r):
        return (1.0 + np.asarray(r, dtype=np.float64)) ** -2.0

    def dk(self, r):
        return -2.0 * (1.0 + np.asarray(r, dtype=np.float64)) ** -3.0

    def d2k(self, r):
        return 6.0 * (1.0 + np.asarray(r, dtype=np.float64)) ** -4.0


@dataclass(frozen=True)
class Gaussian(DistanceKernel):
    """``exp(-r^2)``: decreasing, ``k(0) = 1``, but concave near 0: not of Pólya type."""

    def k(self, r):
        return np.exp(-(np.asarray(r, dtype=np.float64) ** 2))

    def dk(self, r):
        r = np.asarray(r, dtype=np.float64)
        return -2.0 * r * np.exp(-(r**2))

    def d2k(self, r):
        r = np.asarray(r, dtype=np.float64)
        return (4.0 * r**2 - 2.0) * np.exp(-(r**2))


def _qkv(n_q=40, n_k=56, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, n_q, 16, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, n_k, 16, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, n_k, 8, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _np(*ts):
    return [t.detach().double().numpy() for t in ts]


def _dense_grads(q, k, v, g, bias, dtype):
    """Autograd of plain attention with the dense bias (GQA keys repeated) in ``dtype``."""
    a, b, w = (x.detach().to(dtype).clone().requires_grad_() for x in (q, k, v))
    rep = a.shape[1] // b.shape[1]
    kk, vv = b.repeat_interleave(rep, 1), w.repeat_interleave(rep, 1)
    logits = a @ kk.transpose(-1, -2) / math.sqrt(a.shape[-1]) + bias.to(dtype)
    out = torch.softmax(logits, dim=-1) @ vv
    (out * g.to(dtype)).sum().backward()
    return out.detach(), (a.grad, b.grad, w.grad)


# ------------------------------------------------------------------ partitions
@pytest.mark.parametrize("sampler", ["iid", "stratified"])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_module_partitions_are_draw_partition_of_the_kernels(name, sampler):
    core = PLSHAttention(4, 8, kernels=KERNELS[name], seed=5, sampler=sampler)
    kw = {} if sampler == "iid" else {"sampler": sampler}
    assert core.partition == draw_partition(KERNELS[name], 8, 5, **kw)
    assert core.training_partition(3) == draw_partition(KERNELS[name], 8, derived_seed(5, 3), **kw)
    # negative control: the ALiBi module with the same seed draws another partition
    assert PLSHAttention(4, 8, seed=5, sampler=sampler).partition != core.partition
    # the module's float64 buffers give the reference's bins bit for bit
    pos = np.concatenate([np.arange(300), np.array([10**6, 2**40 + 3])])
    got = fast_bins(core.pitch, core.offset, torch.from_numpy(pos)).numpy()
    np.testing.assert_array_equal(got, bins(core.partition, pos))


def test_training_forward_uses_the_kernel_training_draws():
    """Through the operator plsh::training_partition: draw k of the stream is the module's
    training_partition(k), drawn from the kernels (not from the NaN slopes)."""
    core = PLSHAttention(4, 6, kernels=KERNELS["kerple_log"], seed=2, backend="cpu").train()
    q, k, v = _qkv(dtype=torch.float64)
    for draw in range(2):
        out = core(q, k, v)
        ref = ref_plsh_attention(
            *_np(q, k, v), partition=core.training_partition(draw), return_lse=False
        )
        np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=1e-12)
    assert core.num_draws == 2
    assert core.partition == draw_partition(KERNELS["kerple_log"], 6, 2)  # eval one unchanged


def test_reseed_and_self_attention_keep_the_kernels():
    layer = PLSHSelfAttention(32, 4, kernels=KERNELS["mixture"], num_samples=5, seed=0)
    assert layer.attention.kernels == tuple(KERNELS["mixture"])
    layer.attention.reseed(11)
    assert layer.attention.partition == draw_partition(KERNELS["mixture"], 5, 11)
    assert torch.isnan(layer.attention.slopes).all()  # no ALiBi slope is pretended


def test_exponential_kernels_draw_the_alibi_partition_bit_for_bit():
    sigma = 1.0 / alibi_slopes(4)
    alibi = PLSHAttention(4, 8, seed=9)
    kern = PLSHAttention(4, 8, kernels=[Exponential(x) for x in sigma], seed=9)
    assert torch.equal(alibi.pitch, kern.pitch) and torch.equal(alibi.offset, kern.offset)
    assert alibi.training_partition(2) == kern.training_partition(2)


def test_default_module_is_unchanged_by_the_kernels_argument():
    core = PLSHAttention(4, 8, seed=3)
    assert core.kernels is None
    assert core.partition == draw_partition(1.0 / alibi_slopes(4), 8, 3)
    assert core.get_extra_state() == {"seed": 3, "num_draws": 0}
    assert "kernels" not in repr(core)


# ------------------------------------------------------------------ values
@pytest.mark.parametrize("backend", ["cpu", "dense"])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_forward_and_backward_equal_the_reference_on_the_module_partition(name, backend):
    """float32 module against the float64 reference (output) and float64 autograd of the
    dense log(C/s) bias of the reference's counts (gradients), SPEC section 6 rule."""
    core = PLSHAttention(4, 8, kernels=KERNELS[name], seed=7, backend=backend).eval()
    q, k, v = _qkv()
    g = torch.randn(2, 4, 40, 8, generator=torch.Generator().manual_seed(3))
    qr, kr, vr = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = core(qr, kr, vr)
    (out * g).sum().backward()
    part = core.partition
    ref = ref_plsh_attention(*_np(q, k, v), partition=part, causal=True, return_lse=False)
    bias_np = count_bias(counts(part, np.arange(16, 56), np.arange(56), causal=True), 8)
    base, _ = plain_attention_numpy(*_np(q, k, v), bias_np, scale=None, dtype="float32")
    assert_close_to_reference(out.detach().numpy(), ref, base, "float32")
    bias = torch.from_numpy(bias_np)[None]
    ref64, grads64 = _dense_grads(q, k, v, g, bias, torch.float64)
    np.testing.assert_allclose(ref64.numpy(), ref, rtol=0, atol=1e-12)  # the oracle is right
    _, grads32 = _dense_grads(q, k, v, g, bias, torch.float32)
    for label, got, want, base32 in zip(
        ("grad_query", "grad_key", "grad_value"), (qr.grad, kr.grad, vr.grad), grads64, grads32
    ):
        assert_close_to_reference(got.numpy(), want.numpy(), base32.numpy(), "float32", name=label)


def test_kernel_partition_changes_the_module_output():
    # negative control for the comparison above: another kernel, another function
    q, k, v = _qkv(dtype=torch.float64)
    a = PLSHAttention(4, 8, kernels=KERNELS["kerple_log"], seed=7)(q, k, v)
    b = PLSHAttention(4, 8, kernels=KERNELS["kerple_power"], seed=7)(q, k, v)
    assert (a - b).abs().max() > 1e-3


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_exact_method_is_exact_attention_with_the_kernel_bias(name, causal):
    q, k, v = _qkv()
    core = PLSHAttention(4, 3, kernels=KERNELS[name], method="exact", causal=causal)
    out = core(q, k, v)
    qpos, kpos = np.arange(16, 56), np.arange(56)
    with np.errstate(divide="ignore"):
        bias = np.log(
            np.stack([kernel_matrix(c, qpos, kpos, causal=causal) for c in KERNELS[name]])
        )
    ref = biased_attention(*_np(q, k, v), bias=bias, return_lse=False)
    base, _ = plain_attention_numpy(*_np(q, k, v), bias, scale=None, dtype="float32")
    assert_close_to_reference(out.numpy(), ref, base, "float32")
    # float64: the closed-form log k equals log of the reference's k to rounding
    out64 = PLSHAttention(4, 3, kernels=KERNELS[name], method="exact", causal=causal)(
        *(x.double() for x in (q, k, v))
    )
    np.testing.assert_allclose(out64.numpy(), ref, rtol=0, atol=1e-12)
    # negative control: exact ALiBi is another function
    alibi = PLSHAttention(4, 3, method="exact", causal=causal)(q, k, v)
    assert (alibi - out).abs().max() > 1e-3


def test_kernel_bias_matches_log_kernel_matrix_with_batched_positions():
    pos = torch.tensor([[0, 1, 2, 5, 40], [3, 4, 9, 100, 1000]])
    bias = kernel_bias(KERNELS["mixture"], pos, pos, causal=True)
    assert bias.shape == (2, 4, 5, 5) and bias.dtype == torch.float64
    for b in range(2):
        p = pos[b].numpy()
        for h, c in enumerate(KERNELS["mixture"]):
            with np.errstate(divide="ignore"):
                want = np.log(kernel_matrix(c, p, p, causal=True))
            np.testing.assert_allclose(bias[b, h].numpy(), want, rtol=1e-14, atol=1e-15)


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    "kernels,error,match",
    [
        (KERNELS["kerple_log"][:3], ValueError, "^kernels: need 4 kernels"),
        (KerpleLog(0.7, 0.5), TypeError, "^kernels: must be a sequence"),
        ([KerpleLog(0.7, 0.5)] * 3 + [1.0], TypeError, "^kernels: each must be a DistanceKernel"),
        ([Hyperbolic(), Gaussian(), Hyperbolic(), Hyperbolic()], ValueError,
         "^kernels: head 1: Gaussian is not convex"),
    ],
    ids=["count", "single", "number", "not-polya"],
)  # fmt: skip
def test_bad_kernels_are_refused_naming_the_argument_before_any_work(kernels, error, match):
    torch.manual_seed(0)
    state = torch.get_rng_state()
    with pytest.raises(error, match=match):
        PLSHAttention(4, 8, kernels=kernels)  # seed=None: resolving it would draw
    assert torch.equal(torch.get_rng_state(), state)  # refused before the seed was drawn
    with pytest.raises(error, match=match):
        check_kernel_heads(kernels, 4)


def test_kernels_and_slopes_together_are_refused():
    with pytest.raises(ValueError, match="^kernels: replace slopes"):
        PLSHAttention(4, 8, kernels=KERNELS["kerple_log"], slopes=alibi_slopes(4))


def test_own_polya_kernel_runs_plsh_and_is_refused_for_exact():
    own = [Hyperbolic()] * 4
    assert not has_torch_bias(own[0]) and has_torch_bias(KERNELS["mixture"][0])
    core = PLSHAttention(4, 6, kernels=own, seed=1)
    assert core.partition == draw_partition(own, 6, 1)
    q, k, v = _qkv(dtype=torch.float64)
    ref = ref_plsh_attention(*_np(q, k, v), partition=core.partition, return_lse=False)
    np.testing.assert_allclose(core.eval()(q, k, v).numpy(), ref, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="^kernels: head 0: method='exact' needs"):
        PLSHAttention(4, 6, kernels=own, method="exact")


# ------------------------------------------------------------------ state, compile
def test_state_dict_records_the_kernels_and_refuses_others():
    core = PLSHAttention(4, 5, kernels=KERNELS["kerple_power"], seed=4)
    buf = io.BytesIO()
    torch.save(core.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)  # the kernels travel as a string
    twin = PLSHAttention(4, 5, kernels=KERNELS["kerple_power"], seed=0)
    twin.load_state_dict(state)
    assert twin.partition == core.partition and twin.seed == 4
    with pytest.raises(ValueError, match="^state_dict: saved with kernels="):
        PLSHAttention(4, 5, seed=0).load_state_dict(state)
    with pytest.raises(ValueError, match="^state_dict: saved with kernels=None"):
        PLSHAttention(4, 5, kernels=KERNELS["kerple_power"]).load_state_dict(
            PLSHAttention(4, 5, seed=1).state_dict()
        )


def test_unpickled_module_draws_from_its_own_kernels_in_another_process(monkeypatch):
    """The operator receives an index into the process-wide plsh_fast._ops.KERNEL_LAWS; a
    module pickled in one process and loaded in another (simulated: a registry holding
    another law first) must index its own kernels there."""
    import plsh_fast._ops as ops

    core = PLSHAttention(4, 6, kernels=KERNELS["kerple_power"], seed=2, backend="cpu")
    blob = pickle.dumps(core)
    monkeypatch.setattr(ops, "KERNEL_LAWS", [tuple(KERNELS["kerple_log"])])
    loaded = pickle.loads(blob).train()
    q, k, v = _qkv(dtype=torch.float64)
    out = loaded(q, k, v)
    ref = ref_plsh_attention(
        *_np(q, k, v), partition=loaded.training_partition(0), return_lse=False
    )
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=1e-12)
    twin = copy.deepcopy(loaded)
    assert ops.KERNEL_LAWS[twin._kernel_law] == tuple(KERNELS["kerple_power"])


@pytest.mark.parametrize("method", ["plsh", "exact"])
def test_kernel_module_compiles_fullgraph_and_matches_eager(method):
    """Training draws through plsh::training_partition with the kernels' index, and the
    exact kernel bias, traced in one graph with no break."""
    torch._dynamo.reset()
    try:
        results = {}
        for mode in ("compiled", "eager"):
            torch.manual_seed(0)
            layer = PLSHSelfAttention(
                32, 4, kernels=KERNELS["mixture"], num_samples=4, seed=3, method=method
            ).train()
            fn = (
                torch.compile(layer, fullgraph=True, backend=aot_eager)
                if mode == "compiled"
                else layer
            )
            x = torch.randn(2, 24, 32, generator=torch.Generator().manual_seed(1))
            outs = [fn(x) for _ in range(2)]  # two training draws
            outs[1].sum().backward()
            results[mode] = (outs, layer.q_proj.weight.grad, layer.attention.num_draws)
        (c_outs, c_grad, c_draws), (e_outs, e_grad, e_draws) = results["compiled"], results["eager"]
        assert c_draws == e_draws == (2 if method == "plsh" else 0)
        for a, b in zip(c_outs, e_outs):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(c_grad, e_grad, rtol=1e-5, atol=1e-6)
        if method == "plsh":
            assert (c_outs[0] - c_outs[1]).abs().max() > 1e-4  # two draws, two functions
    finally:
        torch._dynamo.reset()
