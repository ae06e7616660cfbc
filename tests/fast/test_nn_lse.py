"""``PLSHAttention(...)(..., return_lse=True)``: the LSE of every method/backend path.

The fused backends return their kernels' LSE; the dense and exact paths attend through SDPA,
which returns none, and compute it from the same bias (:func:`plsh_fast.dense.biased_lse`).
Each path's ``(out, lse)`` is compared with the float64 reference of the same function
(:func:`plsh_ref.plsh_attention` on the module's partition, :func:`plsh_ref.alibi_attention`
for ``method="exact"``) under the SPEC section 6 rule, forward and backward through the LSE
(the gradient oracle is :func:`plsh_fast.peers.dense_attention` with the reference's bias,
in float64, and in float32 as the yardstick).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import plsh_ref  # noqa: E402
from plsh_fast.nn import PLSHAttention, PLSHSelfAttention  # noqa: E402
from plsh_fast.peers import dense_attention  # noqa: E402
from plsh_ref.alibi import alibi_bias, resolve_positions  # noqa: E402
from plsh_ref.partition import count_bias, counts, draw_partition  # noqa: E402
from plsh_ref.testing.baseline import plain_attention_numpy  # noqa: E402
from plsh_ref.testing.tolerance import assert_close_to_reference  # noqa: E402

#: (method, backend): every path of PLSHAttention.forward
PATHS = [
    ("plsh", "auto"),  # below the crossover: the dense path of plsh_fast.plsh_attention
    ("plsh", "cpu"),
    pytest.param("plsh", "triton", marks=pytest.mark.triton),
    ("plsh", "dense"),
    ("exact", "auto"),
    ("exact", "dense"),
]

#: name -> (n_q, n_k, left padding of batch entry 1 or None)
CASES = {"kv_cache": (7, 30, None), "left_padded": (24, 24, 5)}


def _core(method, backend):
    if backend == "triton":
        import _triton_interp  # interpreter on CPU, compiled on CUDA

        _triton_interp.load("triton")
    return PLSHAttention(4, 6, seed=11, method=method, backend=backend, resample="fixed").eval()


def _inputs(case, dtype, seed=0):
    n_q, n_k, pad = CASES[case]
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, n_q, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 2, n_k, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 2, n_k, 5, generator=gen, dtype=torch.float64)
    mask = None
    if pad is not None:
        mask = torch.ones(2, n_k, dtype=torch.bool)
        mask[1, :pad] = False
    return q.to(dtype), k.to(dtype), v.to(dtype), mask


def _reference_bias(core, q, k, mask):
    """The float64 bias ``(batch, H, n_q, n_k)`` of the module's function: ``log(C / s)``
    (or the ALiBi bias), ``-inf`` at pad keys and on pad query rows (end-aligned slots;
    positions number the slots, as plsh_fast.plsh_attention does without positions)."""
    n_q, n_k = q.shape[2], k.shape[2]
    qpos, kpos = resolve_positions(n_q, n_k, None, None)
    if core.method == "exact":
        bias = alibi_bias(core.slopes.numpy(), qpos, kpos, causal=core.causal)
    else:
        bias = count_bias(counts(core.partition, qpos, kpos, causal=core.causal), 6)
    bias = np.broadcast_to(bias, (q.shape[0], *bias.shape)).copy()
    if mask is not None:
        keep = mask.numpy()
        bias[np.broadcast_to(~keep[:, None, None, :], bias.shape)] = -np.inf
        pad_rows = ~keep[:, n_k - n_q :]
        bias[np.broadcast_to(pad_rows[:, None, :, None], bias.shape)] = -np.inf
    return bias


def _reference(core, q, k, v, mask):
    args = [t.double().numpy() for t in (q, k, v)]
    kw = {"causal": core.causal, "attention_mask": None if mask is None else mask.numpy()}
    if core.method == "exact":
        return plsh_ref.alibi_attention(*args, return_lse=True, **kw)
    return plsh_ref.plsh_attention(*args, partition=core.partition, return_lse=True, **kw)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(("method", "backend"), PATHS)
def test_lse_of_every_path_equals_the_reference(method, backend, case):
    core = _core(method, backend)
    q, k, v, mask = _inputs(case, torch.float32)
    out, lse = core(q, k, v, attention_mask=mask, return_lse=True)
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:3]
    # the output is the one of return_lse=False, bit for bit
    assert torch.equal(out, core(q, k, v, attention_mask=mask))
    ref, ref_lse = _reference(core, q, k, v, mask)
    bias = _reference_bias(core, q, k, mask)
    base, base_lse = plain_attention_numpy(
        *(t.double().numpy() for t in (q, k, v)), bias, scale=None, dtype="float32"
    )
    np.testing.assert_array_equal(np.isneginf(lse.numpy()), np.isneginf(ref_lse))
    finite = np.isfinite(ref_lse)
    assert_close_to_reference(lse.numpy()[finite], ref_lse[finite], base_lse[finite], "float32",
                              name="lse")  # fmt: skip
    assert_close_to_reference(out.numpy(), ref, base, "float32")
    if mask is not None:  # pad query rows: LSE -inf (the check above would not see NaN)
        assert np.isneginf(lse.numpy()[1, :, :5]).all() and (out[1, :, :5] == 0).all()
    # negative control: another partition's (or exact ALiBi's) LSE is far outside the rule
    other = PLSHAttention(4, 6, seed=12, backend="dense").eval()
    _, other_lse = other(q, k, v, attention_mask=mask, return_lse=True)
    with pytest.raises(AssertionError):
        assert_close_to_reference(other_lse.numpy()[finite], ref_lse[finite], base_lse[finite],
                                  "float32", name="lse")  # fmt: skip


def _grads(fn, q, k, v, weight_out, weight_lse):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = fn(*leaves)
    loss = (out * weight_out).sum()
    if weight_lse is not None:
        loss = loss + (torch.where(torch.isfinite(lse), lse, 0.0) * weight_lse).sum()
    loss.backward()
    return [t.grad.double().numpy() for t in leaves]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(("method", "backend"), PATHS)
def test_gradients_through_the_lse_follow_the_reference(method, backend, case):
    """d/d(q, k, v) of ``sum(w_o * out) + sum(w_l * lse)`` against the float64 dense
    oracle with the reference's bias (SPEC section 6 rule, float32 dense yardstick)."""
    core = _core(method, backend)
    q, k, v, mask = _inputs(case, torch.float32, seed=1)
    gen = torch.Generator().manual_seed(2)
    weight_out = torch.randn(2, 4, q.shape[2], 5, generator=gen)
    weight_lse = torch.randn(2, 4, q.shape[2], generator=gen)
    bias = torch.from_numpy(_reference_bias(core, q, k, mask))

    def oracle(dtype):
        def fn(a, b, c):
            return dense_attention(a, b, c, bias=bias.to(dtype), return_lse=True)

        return fn

    def module(a, b, c):
        return core(a, b, c, attention_mask=mask, return_lse=True)

    got = _grads(module, q, k, v, weight_out, weight_lse)
    ref = _grads(oracle(torch.float64), q.double(), k.double(), v.double(),
                 weight_out.double(), weight_lse.double())  # fmt: skip
    base = _grads(oracle(torch.float32), q, k, v, weight_out, weight_lse)
    for name, g, r, b in zip(("grad_query", "grad_key", "grad_value"), got, ref, base):
        assert_close_to_reference(g, r, b, "float32", name=name)
    # negative control: without the LSE term the oracle's query and key gradients are far
    # outside the rule (the LSE term matters; the value gradient does not depend on it)
    without = _grads(oracle(torch.float64), q.double(), k.double(), v.double(),
                     weight_out.double(), None)  # fmt: skip
    for name, g, r, b in zip(("grad_query", "grad_key"), without, ref, base):
        with pytest.raises(AssertionError):
            assert_close_to_reference(g, r, b, "float32", name=name)


def test_float64_dense_and_exact_lse_equal_the_reference_to_rounding():
    """In float64 the SDPA paths' LSE is the reference's to a few ulps (a fixed bound, not
    only the relative rule)."""
    q, k, v, mask = _inputs("left_padded", torch.float64, seed=3)
    for method in ("plsh", "exact"):
        core = _core(method, "dense")
        _, lse = core(q, k, v, attention_mask=mask, return_lse=True)
        _, ref_lse = _reference(core, q, k, v, mask)
        assert lse.dtype == torch.float64
        np.testing.assert_array_equal(np.isneginf(lse.numpy()), np.isneginf(ref_lse))
        finite = np.isfinite(ref_lse)
        np.testing.assert_allclose(lse.numpy()[finite], ref_lse[finite], rtol=0, atol=1e-12)


def test_self_attention_returns_the_cores_lse():
    torch.manual_seed(0)
    layer = PLSHSelfAttention(32, 4, num_heads_kv=2, num_samples=5, seed=2, backend="dense")
    layer.eval()
    x = torch.randn(2, 17, 32)
    mask = torch.ones(2, 17, dtype=torch.bool)
    mask[0, :3] = False
    y, lse = layer(x, attention_mask=mask, return_lse=True)
    assert torch.equal(y, layer(x, attention_mask=mask))
    b, n = 2, 17
    q = layer.q_proj(x).view(b, n, 4, 8).transpose(1, 2)
    k = layer.k_proj(x).view(b, n, 2, 8).transpose(1, 2)
    v = layer.v_proj(x).view(b, n, 2, 8).transpose(1, 2)
    _, core_lse = layer.attention(q, k, v, attention_mask=mask, return_lse=True)
    assert torch.equal(lse, core_lse) and lse.shape == (2, 4, 17)
    assert torch.isneginf(lse[0, :, :3]).all() and torch.isfinite(lse[0, :, 3:]).all()
    # another partition gives another LSE (the comparison above can fail)
    layer.attention.set_partition(draw_partition(layer.attention.sigma, 5, 3))
    assert not torch.equal(layer(x, attention_mask=mask, return_lse=True)[1], lse)


def test_return_lse_must_be_bool():
    core = PLSHAttention(2, 4, seed=0)
    q = torch.randn(1, 2, 6, 4)
    with pytest.raises(TypeError, match="^return_lse"):
        core(q, q, q, return_lse="yes")
    layer = PLSHSelfAttention(8, 2, seed=0)
    with pytest.raises(TypeError, match="^return_lse"):
        layer(torch.randn(1, 6, 8), return_lse=1)


@pytest.mark.parametrize(
    ("method", "backend"), [("plsh", "cpu"), ("plsh", "dense"), ("exact", "dense")]
)
def test_lse_under_torch_compile_equals_eager(method, backend):
    """``return_lse=True`` traces with ``fullgraph=True`` (aot_eager: the graph, not Inductor's
    code) and gives eager's ``(out, lse)`` and gradients through the LSE."""
    core = _core(method, backend)
    q, k, v, mask = _inputs("left_padded", torch.float32, seed=4)
    compiled = torch.compile(core, fullgraph=True, backend="aot_eager")
    results = []
    for fn in (core, compiled):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, lse = fn(*leaves, attention_mask=mask, return_lse=True)
        (out.sum() + torch.where(torch.isfinite(lse), lse, 0.0).sum()).backward()
        results.append([out, lse, *(t.grad for t in leaves)])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
