"""The dense form of PLSH attention (plsh_fast.dense) and the "auto" dispatch to it.

Below the crossover, ``backend="auto"`` computes ``softmax(scale q k^T + log(C / s)) v``
with SDPA and a dense bias: the same function as the tiled paths and the float64
reference on the same partition sample. Checked here: the bias equals the reference's
``count_bias(counts)`` bit for bit in float64, outputs and LSE satisfy the SPEC section 6
rule against the reference (padding, GQA, causal and not, float32/float64), gradients
match the tiled CPU path, and the dispatch follows ``DENSE_CROSSOVER``.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import plsh_fast.dense as dense  # noqa: E402
from plsh_fast import plsh_attention  # noqa: E402
from plsh_fast._partition import partition_tensors  # noqa: E402
from plsh_ref import alibi_slopes, draw_partition  # noqa: E402
from plsh_ref.attention import plsh_attention as ref_plsh  # noqa: E402
from plsh_ref.partition import count_bias, counts  # noqa: E402
from plsh_ref.testing.tolerance import assert_close_to_reference  # noqa: E402

SHIPPED = dict(dense.DENSE_CROSSOVER)  # before tests/fast/conftest.py switches it off


@pytest.fixture(autouse=True)
def _shipped_crossover(monkeypatch, _tiled_paths_only):
    monkeypatch.setattr(dense, "DENSE_CROSSOVER", dict(SHIPPED))


def _problem(n_q=37, n_k=37, heads=4, heads_kv=2, s=8, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, n_q, 16, generator=g, dtype=torch.float64)
    k = torch.randn(2, heads_kv, n_k, 16, generator=g, dtype=torch.float64)
    v = torch.randn(2, heads_kv, n_k, 8, generator=g, dtype=torch.float64)
    # sigma of a few tokens, so that both zero and nonzero counts occur at this length
    part = draw_partition(4.0 / alibi_slopes(heads) ** 0.25, s, seed=seed + 1)
    return (q.to(dtype), k.to(dtype), v.to(dtype)), part


def test_dense_bias_equals_the_reference_bias_bit_for_bit():
    _, part = _problem()
    pos_q = torch.tensor([0, 3, 5, 9, 17, 40, 41, 200])
    pos_k = torch.tensor([1, 3, 4, 9, 16, 40, 99, 200, 201])
    pitch, offset = partition_tensors(part, "cpu")
    for causal in (False, True):
        got = dense.dense_count_bias((pitch, offset), pos_q, pos_k, causal=causal)[0].numpy()
        ref = count_bias(counts(part, pos_q.numpy(), pos_k.numpy(), causal=causal), 8)
        assert np.isneginf(ref).any() and np.isfinite(ref).any()  # both kinds of pair
        np.testing.assert_array_equal(got, ref)  # bit for bit, -inf included
        # negative control: one sample less changes the bias
        fewer = dense.dense_count_bias((pitch[:, 1:], offset[:, 1:]), pos_q, pos_k, causal=causal)
        assert not np.array_equal(fewer[0].numpy(), ref[:, :, :])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [True, False])
def test_auto_below_crossover_meets_the_tolerance_rule_with_padding_and_gqa(dtype, causal):
    (q, k, v), part = _problem(dtype=dtype, seed=3)
    mask = torch.ones(2, 37, dtype=torch.bool)
    mask[1, :9] = False  # left padding
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    assert dense.below_crossover(37, 37, q.device)
    out, lse = plsh_attention(q, k, v, partition=part, causal=causal, query_positions=pos,
                              key_positions=pos, attention_mask=mask, return_lse=True)  # fmt: skip
    q64, k64, v64 = (t.double().numpy() for t in (q, k, v))
    ref_out, ref_lse = ref_plsh(q64, k64, v64, partition=part, causal=causal,
                                query_positions=pos.numpy(), key_positions=pos.numpy(),
                                attention_mask=mask.numpy(), return_lse=True)  # fmt: skip
    # the baseline of the rule: plain torch attention with the same dense bias, in dtype
    bias = torch.from_numpy(np.stack([
        count_bias(counts(part, pos[b].numpy(), pos[b].numpy(), causal=causal), 8)
        for b in range(2)
    ]))  # fmt: skip
    bias = bias.masked_fill(~mask[:, None, None, :], -np.inf)
    bias = bias.masked_fill(~mask[:, None, :, None], -np.inf).to(dtype)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    logits = q @ kk.transpose(-1, -2) / 4.0 + bias
    empty = torch.isneginf(logits).all(-1, keepdim=True)
    base = torch.softmax(logits.masked_fill(empty, 0), -1).masked_fill(empty, 0) @ vv
    assert_close_to_reference(out.numpy(), ref_out, base.numpy(), dtype)
    assert torch.equal(out[1, :, :9], torch.zeros_like(out[1, :, :9]))  # pad queries give 0
    assert torch.isneginf(lse[1, :, :9]).all()
    real = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse.double().numpy()[real], ref_lse[real], rtol=0,
                               atol=64 * torch.finfo(dtype).eps * np.abs(ref_lse[real]).max())  # fmt: skip


def test_auto_gradients_match_the_tiled_cpu_path():
    (q, k, v), part = _problem(dtype=torch.float64, seed=5)
    grads = {}
    for backend in ("auto", "cpu"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = plsh_attention(*leaves, partition=part, backend=backend)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        grads[backend] = [out.detach(), *(t.grad for t in leaves)]
    for a, b in zip(grads["auto"], grads["cpu"]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_auto_dispatches_on_the_crossover_constant(monkeypatch):
    """``DENSE_CROSSOVER`` decides: above it the tiled path runs, not the dense one."""
    (q, k, v), part = _problem(seed=7)
    calls = []
    real = dense.dense_plsh_attention
    monkeypatch.setattr(
        "plsh_fast.api.dense_plsh_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw)
    )
    plsh_attention(q, k, v, partition=part)
    assert calls == [1]
    assert SHIPPED["cpu"] >= 37  # the shipped constant sends this problem to the dense path
    monkeypatch.setitem(dense.DENSE_CROSSOVER, "cpu", 36)  # 37 * 37 > 36 * 36
    tiled = plsh_attention(q, k, v, partition=part)
    assert calls == [1]
    torch.testing.assert_close(tiled, real(q, k, v, partition=partition_tensors(part, "cpu"),
                               causal=True, scale=0.25, query_positions=torch.arange(37),
                               key_positions=torch.arange(37)), rtol=2e-5, atol=2e-6)  # fmt: skip
    assert not dense.below_crossover(5, 5, torch.device("meta"))  # unlisted device: never


def test_integer_mask_values_are_checked_on_the_dense_path():
    (q, k, v), part = _problem(seed=9)
    bad = torch.ones(2, 37, dtype=torch.int64)
    bad[0, 3] = 2
    with pytest.raises(ValueError, match="^attention_mask: integer entries"):
        plsh_attention(q, k, v, partition=part, attention_mask=bad)
    good = (bad == 1).to(torch.int64)  # 0/1 integers: the same result as the bool mask
    torch.testing.assert_close(
        plsh_attention(q, k, v, partition=part, attention_mask=good),
        plsh_attention(q, k, v, partition=part, attention_mask=good.bool()),
        rtol=0,
        atol=0,
    )
