"""plsh_fast.hf with a Pólya kernel per head (``set_alibi_attention(kernels=...)``,
``config.plsh_kernels``): partitions drawn from the kernels, a training step, the exact
``"alibi"`` attention with the kernels' bias, refusals before any work."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import plsh_fast.hf as hf  # noqa: E402
from plsh_ref.attention import biased_attention  # noqa: E402
from plsh_ref.kernels import (  # noqa: E402
    DistanceKernel,
    Exponential,
    KerpleLog,
    KerplePower,
    Mixture,
    kernel_matrix,
)
from plsh_ref.partition import draw_partition  # noqa: E402

VOCAB = 61
KERNELS = (
    KerpleLog(0.7, 1 / 16),
    KerplePower(0.25, 0.5),
    Mixture([0.5, 0.5], [Exponential(4.0), KerpleLog(1.5, 0.1)]),
    Exponential(64.0),
)


@dataclass(frozen=True)
class Hyperbolic(DistanceKernel):
    """A valid kernel of one's own, ``(1 + r)^-2``: a config cannot store it."""

    def k(self, r):
        return (1.0 + np.asarray(r, dtype=np.float64)) ** -2.0

    def dk(self, r):
        return -2.0 * (1.0 + np.asarray(r, dtype=np.float64)) ** -3.0

    def d2k(self, r):
        return 6.0 * (1.0 + np.asarray(r, dtype=np.float64)) ** -4.0


@dataclass(frozen=True)
class Gaussian(DistanceKernel):
    """``exp(-r^2)``: not convex near 0, not of Pólya type."""

    def k(self, r):
        return np.exp(-(np.asarray(r, dtype=np.float64) ** 2))

    def dk(self, r):
        r = np.asarray(r, dtype=np.float64)
        return -2.0 * r * np.exp(-(r**2))

    def d2k(self, r):
        r = np.asarray(r, dtype=np.float64)
        return (4.0 * r**2 - 2.0) * np.exp(-(r**2))


def _config(**kw):
    return LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       **kw)  # fmt: skip


def _llama(**kw):
    torch.manual_seed(0)
    return LlamaForCausalLM(_config(**kw))


def _layers(model):
    return [m for _, m in sorted(hf._attention_modules(model), key=lambda t: t[0])]


def test_llama_with_kernels_per_head_draws_their_partitions_and_trains_one_step():
    model = hf.set_alibi_attention(_llama(), "plsh", num_samples=6, seed=3, kernels=KERNELS)
    for layer, module in enumerate(_layers(model)):
        assert module.plsh_partition == draw_partition(list(KERNELS), 6, hf.layer_seed(3, layer))
    # negative control: the ALiBi set-up with the same seed draws other partitions
    alibi = hf.set_alibi_attention(_llama(), "plsh", num_samples=6, seed=3)
    assert _layers(alibi)[0].plsh_partition != _layers(model)[0].plsh_partition
    assert getattr(alibi.config, "plsh_kernels", None) is None  # default config unchanged
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().max() > 0
    opt.step()
    assert not torch.equal(model.model.layers[0].self_attn.q_proj.weight, before)
    # the plsh output differs from the ALiBi model's on the same weights
    with torch.no_grad():
        other = alibi(input_ids=ids).logits
        mine = model(input_ids=ids).logits
    assert (other - mine).abs().max() > 1e-4


def test_config_stores_the_kernels_and_a_model_built_from_it_draws_them():
    model = hf.set_alibi_attention(_llama(), "plsh", num_samples=5, seed=8, kernels=KERNELS)
    entries = model.config.plsh_kernels
    assert json.loads(json.dumps(entries)) == entries  # JSON-ready (save_pretrained)
    assert hf.kernels_from_config(entries) == KERNELS
    json.loads(model.config.to_json_string())  # the config still serialises
    # a fresh model from that config draws each layer's partition on first use
    fresh = LlamaForCausalLM(model.config)
    fresh.set_attn_implementation("plsh")
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(2))
    fresh(input_ids=ids)
    for layer, module in enumerate(_layers(fresh)):
        assert module.plsh_partition == draw_partition(list(KERNELS), 5, hf.layer_seed(8, layer))
    # switching back to ALiBi clears the kernels
    hf.set_alibi_attention(model, "plsh", num_samples=5, seed=8)
    assert model.config.plsh_kernels is None
    assert _layers(model)[0].plsh_partition == _alibi_partition(5, 8)


def _alibi_partition(s, seed):
    from plsh_ref.alibi import alibi_slopes

    return draw_partition(1.0 / alibi_slopes(4), s, hf.layer_seed(seed, 0))


def test_alibi_implementation_with_kernels_is_exact_attention_with_their_bias():
    model = hf.set_alibi_attention(_llama(), "alibi", seed=0, kernels=KERNELS)
    module = _layers(model)[0]
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, 10, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, 10, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, 10, 8, generator=g, dtype=torch.float64)
    mask = torch.ones(2, 10, dtype=torch.bool)
    out, _ = hf.alibi_attention_forward(module, q, k, v, mask)
    pos = np.arange(10)
    with np.errstate(divide="ignore"):
        bias = np.log(np.stack([kernel_matrix(c, pos, pos, causal=True) for c in KERNELS]))
    ref = biased_attention(q.numpy(), k.numpy(), v.numpy(), bias=bias, return_lse=False)
    # float32 bias (as the ALiBi bias of this function), float64 attention
    np.testing.assert_allclose(out.transpose(1, 2).numpy(), ref, rtol=0, atol=1e-5)
    alibi = hf.set_alibi_attention(_llama(), "alibi", seed=0)  # negative control
    plain, _ = hf.alibi_attention_forward(_layers(alibi)[0], q, k, v, mask)
    assert (plain - out).abs().max() > 1e-3


@pytest.mark.parametrize(
    "kernels,error,match",
    [
        (KERNELS[:3], ValueError, "^kernels: need 4 kernels"),
        (KERNELS[0], TypeError, "^kernels: must be a sequence"),
        ((Gaussian(),) * 4, ValueError, "^kernels: head 0: Gaussian is not convex"),
        ((Hyperbolic(),) * 4, ValueError, "^kernels: head 0: Hyperbolic cannot be stored"),
    ],
    ids=["count", "single", "not-polya", "not-storable"],
)
def test_bad_kernels_are_refused_before_any_work(kernels, error, match):
    model = _llama()
    torch.manual_seed(5)
    state = torch.get_rng_state()
    with pytest.raises(error, match=match):
        hf.set_alibi_attention(model, "plsh", kernels=kernels)  # seed=None would draw
    assert torch.equal(torch.get_rng_state(), state)
    assert getattr(model.config, "plsh_seed", None) is None
    assert all(getattr(m, "plsh_partition", None) is None for m in _layers(model))


def test_bad_config_kernels_are_refused_naming_the_entry():
    with pytest.raises(ValueError, match="^config.plsh_kernels: each entry"):
        hf.kernels_from_config([{"kernel": "Gaussian"}])
    with pytest.raises(ValueError, match="^config.plsh_kernels: must be a list"):
        hf.kernels_from_config("KerpleLog")
    model = _llama()
    model.config.plsh_kernels = hf.kernels_to_config(KERNELS[:2])  # 2 kernels, 4 heads
    model.set_attn_implementation("plsh")
    with pytest.raises(ValueError, match="^kernels: need 4 kernels"):
        model(input_ids=torch.zeros(1, 4, dtype=torch.long))
