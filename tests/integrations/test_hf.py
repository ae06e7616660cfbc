"""plsh_fast.hf: attn_implementation="plsh"/"alibi" in real transformers models (tiny random configs)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    BloomConfig,
    BloomForCausalLM,
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import plsh_fast.hf as hf  # noqa: E402
from plsh_fast.decoding import DecodingErrorBound, cache_bound  # noqa: E402
from plsh_ref import PartitionSample, alibi_slopes, draw_partition  # noqa: E402
from plsh_ref.attention import alibi_attention as ref_alibi  # noqa: E402
from plsh_ref.attention import plsh_attention as ref_plsh  # noqa: E402
from plsh_ref.bounds import max_norm_error_bound  # noqa: E402

VOCAB = 101


def _llama(**kw):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        **kw,
    )
    return LlamaForCausalLM(cfg).eval()


def _qwen3():
    torch.manual_seed(1)
    cfg = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
    )
    return Qwen3ForCausalLM(cfg).eval()


def _bloom():
    torch.manual_seed(2)
    cfg = BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4)
    return BloomForCausalLM(cfg).eval()


def _batch(n=24, pad=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (2, n), generator=g)
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, :pad] = 0  # left padding, as generate() expects for decoder-only models
    return ids, mask


def _small_sigma_partitions(model, sigma=2.0, s=4):
    """Give every layer a partition with small pitches so that the cache must evict."""
    for layer, module in hf._attention_modules(model):
        module.plsh_partition = draw_partition(np.full(4, sigma), s, seed=100 + layer)


@pytest.mark.parametrize("make", [_llama, _qwen3], ids=["llama", "qwen3"])
def test_forward_padding_and_generate(make):
    model = hf.set_alibi_attention(make(), "plsh", num_samples=8, seed=3)
    ids, mask = _batch()
    logits = model(ids, attention_mask=mask).logits
    assert torch.isfinite(logits).all()
    # a left-padded sequence gives the result of the same sequence unpadded
    alone = model(ids[1:, 7:]).logits
    torch.testing.assert_close(logits[1, 7:], alone[0], rtol=1e-5, atol=1e-5)
    # negative control: ignoring the mask changes the real tokens' logits
    unmasked = model(ids).logits
    assert (unmasked[1, 7:] - alone[0]).abs().max() > 1e-3
    out_dyn = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=8,
        do_sample=False,
        cache=DynamicCache(config=model.config),
    )
    out_plsh = model.generate(
        ids, attention_mask=mask, max_new_tokens=8, do_sample=False, cache=hf.PLSHCache(model)
    )
    assert torch.equal(out_dyn, out_plsh)


def test_bounded_cache_evicts_and_decodes_exactly():
    model = hf.set_alibi_attention(_llama(), "plsh", num_samples=4, seed=0)
    _small_sigma_partitions(model)
    ids, mask = _batch(n=12, pad=3)
    cache = hf.PLSHCache(model)
    out_plsh = model.generate(
        ids, attention_mask=mask, max_new_tokens=60, do_sample=False, min_new_tokens=60, cache=cache
    )
    out_dyn = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=60,
        do_sample=False,
        min_new_tokens=60,
        cache=DynamicCache(config=model.config),
    )
    assert torch.equal(out_plsh, out_dyn)
    # 72 tokens seen; each sequence holds at most its layer's bound (pads are never held)
    assert cache.max_cached_tokens() <= max(cache.bounds())
    assert cache.max_cached_tokens() < 72 // 2
    assert cache.get_seq_length() == 71  # the last generated token is never fed back
    # every decode step ran on the layers' rings (one attention call each)
    assert [layer.decoder.ring_steps for layer in cache.layers] == [59, 59]
    # the reported bound: positions 0..70 seen, DKW with a union over the 4 heads
    eps = max_norm_error_bound(71, 4, 0.1 / 4)
    assert cache.error_bound(0.1) == [DecodingErrorBound(eps, 0.1, 71, 4, 4)] * 2


def test_training_step_changes_parameters():
    model = hf.set_alibi_attention(_llama(), "plsh", num_samples=8, seed=0).train()
    ids, mask = _batch()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    loss = model(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
    loss.backward()
    grad = model.model.layers[0].self_attn.q_proj.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().max() > 0
    opt.step()
    assert not torch.equal(before, model.model.layers[0].self_attn.q_proj.weight)


def test_from_config_with_attn_implementation_plsh_draws_per_layer_partitions():
    cfg = _llama().config
    cfg.plsh_seed, cfg.plsh_num_samples = 5, 6
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="plsh").eval()
    ids, _ = _batch()
    model(ids)
    parts = [m.plsh_partition for _, m in hf._attention_modules(model)]
    assert parts[0].num_samples == 6
    assert parts[0] != parts[1]  # distinct per layer
    assert parts[1] == draw_partition(1 / alibi_slopes(4), 6, hf.layer_seed(5, 1))  # reproducible


def test_from_config_without_a_seed_draws_one_and_writes_it_to_the_config():
    """``docs/huggingface.md``: without ``config.plsh_seed`` the model draws a seed once
    and writes it to the config (16 samples by default), so a model built from that config
    draws the same partitions."""
    cfg = _llama().config
    assert getattr(cfg, "plsh_seed", None) is None
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="plsh").eval()
    ids, _ = _batch()
    model(ids)
    seed = model.config.plsh_seed
    assert isinstance(seed, int) and seed >= 0
    parts = [m.plsh_partition for _, m in hf._attention_modules(model)]
    assert parts[0].num_samples == 16
    again = AutoModelForCausalLM.from_config(model.config, attn_implementation="plsh").eval()
    again(ids)
    assert [m.plsh_partition for _, m in hf._attention_modules(again)] == parts


def test_rope_removed_only_in_chosen_layers():
    # with RoPE removed everywhere, the rotary frequencies do not matter; with it kept in
    # layer 1 (negative control) they do
    ids, _ = _batch()
    outs = {}
    for layers in ([0, 1], [0]):
        for scale in (1.0, 3.0):
            model = hf.set_alibi_attention(_llama(), "alibi", layers=layers)
            model.model.rotary_emb.inv_freq.mul_(scale)
            outs[(tuple(layers), scale)] = model(ids).logits
    torch.testing.assert_close(outs[((0, 1), 1.0)], outs[((0, 1), 3.0)])
    assert (outs[((0,), 1.0)] - outs[((0,), 3.0)]).abs().max() > 1e-4


def test_alibi_reproduces_bloom_own_attention():
    model = _bloom()
    ids, mask = _batch()
    own = model(ids, attention_mask=mask).logits
    hf.swap_bloom_attention(model, "alibi")
    ours = model(ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(ours[real], own[real], rtol=1e-5, atol=1e-5)
    hf.swap_bloom_attention(model, "plsh", num_samples=4, seed=0)
    plsh = model(ids, attention_mask=mask).logits
    assert (plsh[real] - own[real]).abs().max() > 1e-4  # PLSH is an approximation (control)


def test_bloom_plsh_generate_with_bounded_cache():
    model = hf.swap_bloom_attention(_bloom(), "plsh", num_samples=4, seed=0)
    for m in model.modules():
        if hasattr(m, "plsh_partition"):
            m.plsh_partition = draw_partition(np.full(4, 2.0), 4, seed=int(m.layer_idx))
    ids, mask = _batch(n=10, pad=2)
    cache = hf.PLSHCache(model)
    kw = dict(attention_mask=mask, max_new_tokens=40, min_new_tokens=40, do_sample=False)
    a = model.generate(ids, cache=cache, **kw)
    b = model.generate(ids, cache=DynamicCache(config=model.config), **kw)
    assert torch.equal(a, b)
    assert cache.max_cached_tokens() <= max(cache.bounds()) < 50
    assert [layer.decoder.ring_steps for layer in cache.layers] == [39, 39]


def _qkv(batch=2, heads=4, kv=2, n=20, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, h, n, d, generator=g, dtype=torch.float64) for h in (heads, kv, kv))


def test_attention_functions_match_the_reference_with_padding():
    q, k, v = _qkv()
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[0, :5] = False
    module = torch.nn.Module()
    module.layer_idx, module.is_causal = 0, True
    module.plsh_partition = draw_partition(1 / alibi_slopes(4), 8, seed=0)
    pos = (mask.long().cumsum(-1) - 1).numpy()
    out, _ = hf.plsh_attention_forward(module, q, k, v, mask, scaling=0.3)
    ref, _ = ref_plsh(
        q.numpy(),
        k.numpy(),
        v.numpy(),
        partition=module.plsh_partition,
        scale=0.3,
        query_positions=pos,
        key_positions=pos,
        attention_mask=mask.numpy(),
        return_lse=True,
    )
    np.testing.assert_allclose(out.transpose(1, 2).numpy(), ref, rtol=1e-10, atol=1e-12)
    out, _ = hf.alibi_attention_forward(module, q, k, v, mask, scaling=0.3)
    ref, _ = ref_alibi(
        q.numpy(),
        k.numpy(),
        v.numpy(),
        scale=0.3,
        query_positions=pos,
        key_positions=pos,
        attention_mask=mask.numpy(),
        return_lse=True,
    )
    np.testing.assert_allclose(out.transpose(1, 2).numpy(), ref, rtol=1e-10, atol=1e-12)


def test_bad_input():
    bloom = _bloom()
    with pytest.raises(ValueError, match="^model"):
        hf.set_alibi_attention(bloom, "plsh")
    with pytest.raises(ValueError, match="^attn_implementation"):
        hf.set_alibi_attention(_llama(), "flash")
    with pytest.raises(ValueError, match="^layers"):
        hf.set_alibi_attention(_llama(), "plsh", layers=[7])
    with pytest.raises(TypeError, match="^num_samples"):
        hf.set_alibi_attention(_llama(), "plsh", num_samples=2.5)
    with pytest.raises(ValueError, match="^model"):
        hf.swap_bloom_attention(_llama(), "plsh")
    q, k, v = _qkv()
    module = torch.nn.Module()
    module.layer_idx, module.is_causal = 0, True
    with pytest.raises(ValueError, match="^attention_mask"):
        hf.plsh_attention_forward(module, q, k, v, torch.zeros(2, 1, 20, 20))
    module.train()
    with pytest.raises(ValueError, match="^dropout"):
        hf.plsh_attention_forward(module, q, k, v, None, dropout=0.1)
    # a cache used with another partition
    model = hf.set_alibi_attention(_llama(), "plsh", num_samples=4, seed=0)
    ids, mask = _batch()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = hf.PLSHCache(model)
    model(ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
    step = dict(attention_mask=torch.cat([mask, mask[:, :1]], 1), position_ids=pos[:, -1:] + 1)
    hf.set_alibi_attention(model, "plsh", num_samples=4, seed=1)
    with pytest.raises(ValueError, match="^partition"):
        model(ids[:, :1], cache=cache, use_cache=True, **step)
    # a manual forward with a cache and padding but HF's default (unpadded) position_ids
    cache = hf.PLSHCache(model)
    with pytest.raises(ValueError, match="^position_ids"):
        model(ids, attention_mask=mask, cache=cache, use_cache=True)
    # a decode step out of order
    layer = hf.PLSHCacheLayer(draw_partition([2.0], 2, seed=0))
    kv = torch.zeros(1, 1, 3, 4)
    keys, values = layer.update(kv, kv, kwargs={"position_ids": torch.tensor([[0, 1, 2]])})
    layer.attend(kv, keys, values)
    with pytest.raises(ValueError, match="^position_ids: decode step out of order"):
        layer.update(kv[:, :, :1], kv[:, :, :1], kwargs={"position_ids": torch.tensor([[1]])})
    with pytest.raises(ValueError, match="^position_ids"):
        layer.update(kv[:, :, :1], kv[:, :, :1])


def test_plsh_cache_refuses_models_whose_attention_reads_evicted_keys():
    # exact ALiBi (and SDPA, BLOOM's own attention) still weight the keys PLSHCache evicts:
    # with small pitches generate() gave other tokens than DynamicCache, silently
    model = hf.set_alibi_attention(_llama(), "alibi")
    with pytest.raises(ValueError, match="^model: PLSHCache is exact only for PLSH"):
        hf.PLSHCache(model)
    with pytest.raises(ValueError, match="^model: PLSHCache is exact only for PLSH"):
        hf.PLSHCache(_llama())  # sdpa
    with pytest.raises(ValueError, match="^model: PLSHCache is exact only for PLSH"):
        hf.PLSHCache(hf.swap_bloom_attention(_bloom(), "alibi"))
    with pytest.raises(ValueError, match="^model: PLSHCache is exact only for PLSH"):
        hf.PLSHCache(_bloom())
    with pytest.raises(TypeError, match="^model"):
        hf.PLSHCache(None)
    # a cache built for "plsh", then the model switched to "alibi"
    plsh = hf.set_alibi_attention(_llama(), "plsh", num_samples=4, seed=0)
    cache = hf.PLSHCache(plsh)
    plsh.set_attn_implementation("alibi")
    ids, mask = _batch()
    with pytest.raises(ValueError, match="^key: comes from a PLSHCache"):
        plsh(ids, attention_mask=mask, cache=cache, use_cache=True)
    with pytest.raises(TypeError, match="^layers"):
        hf.set_alibi_attention(_llama(), "plsh", layers=1)


def _mistral(sliding_window):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(3)
    cfg = MistralConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=4096,
        sliding_window=sliding_window,
    )
    return MistralForCausalLM(cfg).eval()


def test_sliding_window_honoured_by_alibi_and_guarded_for_plsh():
    # transformers' cache keeps only the window of a sliding-window model (Mistral's
    # default is 4096); the attention functions ignored the window, so generate() with the
    # default cache silently disagreed with the full forward (0.36 in the logits here)
    ids, mask = _batch(n=10, pad=3)
    kw = dict(attention_mask=mask, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    kw.update(output_scores=True, return_dict_in_generate=True)
    model = hf.set_alibi_attention(_mistral(6), "alibi")
    out = model.generate(ids, cache=DynamicCache(config=model.config), **kw)
    full_mask = torch.cat([mask, torch.ones(2, 12, dtype=torch.long)], 1)
    full = model(out.sequences, attention_mask=full_mask).logits
    for t, scores in enumerate(out.scores):
        finite = torch.isfinite(scores)  # generate() masks the eos token (min_new_tokens)
        torch.testing.assert_close(scores[finite], full[:, 9 + t][finite], rtol=1e-5, atol=1e-5)
    # negative control: without the window the real tokens' logits change
    wide = hf.set_alibi_attention(_mistral(None), "alibi")
    assert (wide(out.sequences, attention_mask=full_mask).logits - full)[:, 3:].abs().max() > 1e-3
    # PLSH: a window narrower than the partition's reach is refused, a wide enough one is
    # a no-op (generate with the windowed cache equals PLSHCache)
    model = hf.set_alibi_attention(_mistral(6), "plsh", num_samples=4, seed=0)
    with pytest.raises(ValueError, match="^sliding_window: 6 is narrower"):
        model(ids, attention_mask=mask)
    for layer, module in hf._attention_modules(model):
        module.plsh_partition = draw_partition(np.full(4, 0.5), 4, seed=200 + layer)
        assert cache_bound(module.plsh_partition) <= 6
    a = model.generate(ids, cache=DynamicCache(config=model.config), **kw).sequences
    b = model.generate(ids, cache=hf.PLSHCache(model), **kw).sequences
    assert torch.equal(a, b)


def test_cache_layer_holds_the_new_tokens_a_later_query_reaches():
    """Staged tokens are attended before the eviction, whose reference is then the newest
    query (``proofs_notes/decoding_cache.md``, Claim 1): tokens in later bins than the
    smallest new query stay."""
    layer = hf.PLSHCacheLayer(PartitionSample(np.array([[4.0]]), np.array([[0.0]])))
    kv = torch.arange(5.0).reshape(1, 1, 5, 1)
    keys, values = layer.update(kv, kv, kwargs={"position_ids": torch.tensor([[3, 4, 5, 6, 7]])})
    assert keys.shape[2] == 5 and layer.cached_tokens() == 0  # staged, not yet held
    layer.attend(kv, keys, values)
    assert layer.decoder.cached_positions(0).tolist() == [4, 5, 6, 7]
    # the next step (r = 8, bin 2) drops every key of bins 0 and 1
    keys, values = layer.update(
        kv[:, :, :1], kv[:, :, :1], kwargs={"position_ids": torch.tensor([[8]])}
    )
    layer.attend(kv[:, :, :1], keys, values)
    assert layer.decoder.cached_positions(0).tolist() == [8]


def test_beam_search_with_plsh_cache_gives_the_dynamic_cache_tokens():
    """Beam search reorders (and expands) the cache's sequences every step
    (``PLSHDecodingCache.select``); with evicting partitions the tokens equal DynamicCache's."""
    model = hf.set_alibi_attention(_llama(), "plsh", num_samples=4, seed=0)
    _small_sigma_partitions(model)
    ids, mask = _batch(n=12, pad=3)
    kw = dict(attention_mask=mask, max_new_tokens=20, min_new_tokens=20, do_sample=False)
    kw["num_beams"] = 3
    cache = hf.PLSHCache(model)
    a = model.generate(ids, cache=cache, **kw)
    b = model.generate(ids, cache=DynamicCache(config=model.config), **kw)
    assert torch.equal(a, b)
    assert cache.max_cached_tokens() <= max(cache.bounds()) < 32
