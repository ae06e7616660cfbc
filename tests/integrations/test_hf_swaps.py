"""Falcon's ``alibi=True`` layout and MPT swapped to exact ALiBi / PLSH (tiny random configs)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import FalconConfig, FalconForCausalLM  # noqa: E402

import plsh_fast.hf as hf  # noqa: E402
from plsh_ref import draw_partition  # noqa: E402

VOCAB = 101


def _falcon(attn_implementation="sdpa", **kw):
    torch.manual_seed(3)
    cfg = FalconConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                       num_attention_heads=4, alibi=True, new_decoder_architecture=False,
                       multi_query=True, parallel_attn=True, bias=False, **kw)  # fmt: skip
    cfg._attn_implementation = attn_implementation
    return FalconForCausalLM(cfg).eval()


def _batch(n=40):
    ids = torch.randint(0, VOCAB, (2, n), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, :11] = 0  # left padding
    return ids, mask


def test_falcon_alibi_swap_reproduces_the_models_own_logits():
    """Against Falcon's SDPA path (its default). Its eager path differs (max 0.03 on this
    config, transformers 5.24): there the ALiBi term is in the scores and, folded, in the mask."""
    ids, mask = _batch()
    reference = _falcon()
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).logits
        swapped = hf.swap_falcon_attention(_falcon(), "alibi")
        got = swapped(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], rtol=1e-5, atol=1e-5)
    # negative control: ALiBi slopes without Falcon's 1/sqrt(head_dim) change the logits
    for module in swapped.modules():
        if hasattr(module, "plsh_slopes"):
            module.plsh_slopes = module.plsh_slopes * 8.0
    with torch.no_grad():
        off = swapped(input_ids=ids, attention_mask=mask).logits
    assert (off[real] - expected[real]).abs().max() > 1e-3


def test_falcon_plsh_swap_approaches_the_models_logits_with_many_samples():
    """Seeded draws (deterministic): the logit error against Falcon's own ALiBi falls with
    the number of samples, as PLSH's s^(-1/2) rate says (Theorem 2.2)."""
    ids, mask = _batch()
    with torch.no_grad():
        expected = _falcon()(input_ids=ids, attention_mask=mask).logits
        errors = {}
        for s in (2, 512):
            model = hf.swap_falcon_attention(_falcon(), "plsh", num_samples=s, seed=1)
            got = model(input_ids=ids, attention_mask=mask).logits
            errors[s] = (got - expected)[mask.bool()].abs().max().item()
    assert errors[512] < errors[2] / 4
    with pytest.raises(ValueError, match="^model: config.alibi"):
        hf.swap_falcon_attention(FalconForCausalLM(FalconConfig(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=1, num_attention_heads=4)))  # fmt: skip
    with pytest.raises(ValueError, match="^attn_implementation:"):
        hf.swap_falcon_attention(_falcon(), "sdpa")


# ----------------------------------------------------------------------------- MPT
def _mpt(alibi_bias_max=8, n_heads=4):
    from transformers import MptConfig, MptForCausalLM

    torch.manual_seed(4)
    cfg = MptConfig(d_model=48, n_heads=n_heads, n_layers=2, vocab_size=VOCAB, max_seq_len=128,
                    attn_config={"alibi_bias_max": alibi_bias_max})  # fmt: skip
    return MptForCausalLM(cfg).eval()


@pytest.mark.parametrize("num_heads", [1, 3, 4, 6, 8, 12, 16, 20])
@pytest.mark.parametrize("bias_max", [8, 16, 4, 6.5])
def test_mpt_slopes_are_press_et_al_with_its_maximum_bias(num_heads, bias_max):
    """MPT's ``build_mpt_alibi_tensor`` (float32) against ``plsh_ref.alibi.alibi_slopes(H,
    max_bias=B)``: equal to float32 rounding (the slope is ``-alibi[h, 0, -2]``, the bias one
    token back); Press et al.'s default bias 8 differs whenever B is not 8 (control)."""
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    from plsh_ref import alibi_slopes

    theirs = -build_mpt_alibi_tensor(num_heads, 2, alibi_bias_max=bias_max)[:, 0, 0].double()
    np.testing.assert_allclose(theirs.numpy(), alibi_slopes(num_heads, max_bias=bias_max),
                               rtol=2 * 2.0**-24, atol=0)  # fmt: skip
    if bias_max != 8:
        assert not np.allclose(theirs.numpy(), alibi_slopes(num_heads), rtol=1e-3)


def test_mpt_alibi_swap_reproduces_the_models_own_logits():
    """transformers' MptModel builds its ALiBi with the default bias 8 whatever
    ``attn_config.alibi_bias_max`` says (5.24): the default swap reproduces it also for a
    config with 16; the swap with the config's 16 (the original MosaicML slopes) does not."""
    ids, mask = _batch()
    real = mask.bool()
    for heads in (4, 6):
        with torch.no_grad():
            expected = _mpt(16, heads)(input_ids=ids, attention_mask=mask).logits
            got = hf.swap_mpt_attention(_mpt(16, heads), "alibi")(
                input_ids=ids, attention_mask=mask
            ).logits
            torch.testing.assert_close(got[real], expected[real], rtol=1e-5, atol=1e-5)
            off = hf.swap_mpt_attention(_mpt(16, heads), "alibi", alibi_bias_max=16)(
                input_ids=ids, attention_mask=mask
            ).logits
        assert (off[real] - expected[real]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="^max_bias: must be > 0 and < 1024"):
        hf.swap_mpt_attention(_mpt(), "alibi", alibi_bias_max=0.0)
    with pytest.raises(ValueError, match="^model: no MptAttention"):
        hf.swap_mpt_attention(_falcon(), "alibi")


def test_mpt_plsh_swap_equals_the_reference_on_each_layers_query_key_value(monkeypatch):
    """Each layer's PLSH call, on the q/k/v MPT's projections give, against the float64
    reference on the layer's partition (SPEC section 6 rule; the partition handed over is
    the layer's pitch/offset bit for bit, so the bins are the reference's)."""
    from plsh_ref.attention import plsh_attention as ref_plsh
    from plsh_ref.partition import counts
    from plsh_ref.testing.baseline import plain_attention_torch
    from plsh_ref.testing.tolerance import assert_close_to_reference

    calls = []
    real_plsh = hf.plsh_attention

    def recording(query, key, value, **kwargs):
        out = real_plsh(query, key, value, **kwargs)
        calls.append((query, key, value, kwargs, out))
        return out

    monkeypatch.setattr(hf, "plsh_attention", recording)
    ids, mask = _batch(n=30)
    model = hf.swap_mpt_attention(_mpt(), "plsh", num_samples=8, seed=2)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    modules = [b.attn for b in model.transformer.blocks]
    assert len(calls) == len(modules) == 2
    pos = (mask.cumsum(-1) - 1).numpy()
    for module, (q, k, v, kwargs, out) in zip(modules, calls):
        part = module.plsh_partition
        pitch, offset = kwargs["partition"]
        assert torch.equal(pitch, torch.from_numpy(part.pitch.copy()))
        assert torch.equal(offset, torch.from_numpy(part.offset.copy()))
        assert (
            kwargs["query_positions"].tolist() == pos.tolist() == kwargs["key_positions"].tolist()
        )
        assert kwargs["scale"] == module.softmax_scale
        qn, kn, vn = (t.double().numpy() for t in (q, k, v))
        ref = ref_plsh(qn, kn, vn, partition=part, causal=True, scale=module.softmax_scale,
                       query_positions=pos, key_positions=pos, attention_mask=mask.numpy(),
                       return_lse=False)  # fmt: skip
        with np.errstate(divide="ignore"):
            bias = np.stack([np.log(counts(part, p, p, causal=True) / part.num_samples)
                             for p in pos])  # fmt: skip
        bias = np.where(mask.numpy()[:, None, None, :] == 1, bias, -np.inf)
        base, _ = plain_attention_torch(qn, kn, vn, bias, scale=module.softmax_scale,
                                        dtype="float32")  # fmt: skip
        assert_close_to_reference(out.double().numpy(), ref, base, "float32")
    assert not np.allclose(calls[0][4].numpy(), calls[1][4].numpy())  # distinct layers


def test_mpt_decodes_with_plsh_cache_as_the_full_forward():
    """A manual greedy loop (transformers 5.24's MPT generate() feeds the whole sequence
    at every step, so its cache holds the prompt twice, then three times; PLSHCache refuses
    that with the decode-step-order ValueError): each step's logits with PLSHCache equal
    the full forward's last row (the same PLSH function), on the ring, with eviction."""
    model = hf.swap_mpt_attention(_mpt(), "plsh", num_samples=4, seed=0)
    for block in model.transformer.blocks:  # small pitches: the cache evicts
        part = draw_partition(np.full(4, 2.0), 4, seed=int(block.attn.layer_idx))
        block.attn.plsh_partition = part
    ids, mask = _batch(n=10)
    mask[1, :11] = 1
    mask[1, :3] = 0
    cache = hf.PLSHCache(model)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True).logits
        for _ in range(30):
            token = logits[:, -1:].argmax(-1)
            ids = torch.cat([ids, token], 1)
            mask = torch.cat([mask, torch.ones_like(token)], 1)
            logits = model(input_ids=token, attention_mask=mask, cache=cache, use_cache=True).logits
            full = model(input_ids=ids, attention_mask=mask).logits[:, -1:]
            torch.testing.assert_close(logits, full, rtol=1e-5, atol=1e-5)
    assert cache.max_cached_tokens() <= max(cache.bounds()) < 30
    assert all(layer.decoder.ring_steps == 30 for layer in cache.layers)


def test_falcon_plsh_generates_the_same_tokens_with_plsh_cache():
    from transformers import DynamicCache

    model = hf.swap_falcon_attention(_falcon(), "plsh", num_samples=4, seed=0)
    for module in model.modules():  # small pitches: the cache evicts
        if hasattr(module, "plsh_partition"):
            module.plsh_partition = draw_partition(np.full(4, 2.0), 4, seed=module.layer_idx)
    ids, mask = _batch(n=12)
    mask[1, :11] = 1
    mask[1, :3] = 0
    kw = dict(attention_mask=mask, max_new_tokens=30, min_new_tokens=30, do_sample=False)
    cache = hf.PLSHCache(model)
    with torch.no_grad():
        a = model.generate(ids, cache=cache, **kw)
        b = model.generate(ids, cache=DynamicCache(config=model.config), **kw)
    assert torch.equal(a, b)
    assert cache.max_cached_tokens() <= max(cache.bounds()) < 40
    assert all(layer.decoder.ring_steps == 29 for layer in cache.layers)
