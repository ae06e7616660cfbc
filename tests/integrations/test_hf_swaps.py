"""Falcon's ``alibi=True`` layout swapped to exact ALiBi / PLSH (tiny random config)."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import FalconConfig, FalconForCausalLM  # noqa: E402

import plsh_fast.hf as hf  # noqa: E402

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
