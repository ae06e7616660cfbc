"""plsh_ref.testing.adapters with torch only (the third-party runs are in
tests/integrations/test_thirdparty_kernels.py): correct adapted code passes, each adapter can fail."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from plsh_ref.alibi import alibi_slopes  # noqa: E402
from plsh_ref.testing import ProblemSpec, check_case  # noqa: E402
from plsh_ref.testing.adapters import (  # noqa: E402
    from_bias_builder,
    from_hf_attention,
    from_score_mod,
)
from plsh_ref.testing.battery import battery  # noqa: E402
from plsh_ref.testing.suite import slope_mode  # noqa: E402

DTYPES = ("float16", "bfloat16", "float32")


def _battery_failures(kernel):
    slopes = slope_mode(kernel)
    out = []
    for name, spec in battery(dtypes=DTYPES, slopes=slopes):
        r = check_case(kernel, spec.build(), framework="torch")
        if not (r.passed or r.skipped):
            out.append(name)
    return out


def _exact_bias(num_heads, query_positions, key_positions):
    m = torch.from_numpy(alibi_slopes(num_heads)).float()
    d = (query_positions[:, None, :, None] - key_positions[:, None, None, :]).abs().float()
    return -m[None, :, None, None] * d


def test_bias_builder_correct_and_wrong():
    assert _battery_failures(from_bias_builder(_exact_bias)) == []

    def wrong_sign(num_heads, query_positions, key_positions):
        return -_exact_bias(num_heads, query_positions, key_positions)

    assert "bidirectional" in _battery_failures(from_bias_builder(wrong_sign))


def test_bias_builder_bloom_layout_and_given_slopes():
    # (batch * heads, 1, n_k) with m_h * p_j, right up to a constant per row when causal
    def bloom_like(slopes, key_positions, num_heads, batch, n_k):
        b = slopes.float()[None, :, None] * key_positions[:, None, :].float()
        return b.reshape(batch * num_heads, 1, n_k)

    kernel = from_bias_builder(
        bloom_like, slopes="given", supports={"bidirectional": False, "positions": False}
    )
    # m_h * p_j cast to the input dtype (HF eager): exact in float32, but in half precision
    # its rounding grows with n * slope and the long half-precision cases catch it
    assert _battery_failures(kernel) == [
        "sequence_longer_than_256_bfloat16",
        "sequence_longer_than_256_float16",
    ]
    # negative control: claimed bidirectional support fails
    kernel.supports = {"positions": False}
    assert "bidirectional" in _battery_failures(kernel)


def test_score_mod_factory_and_plain_score_mod():
    def factory(num_heads, query_positions, key_positions):
        m = torch.from_numpy(alibi_slopes(num_heads)).float()

        def alibi(score, b, h, q_idx, kv_idx):
            return score - m[h] * (query_positions[b, q_idx] - key_positions[b, kv_idx]).abs()

        return alibi

    assert _battery_failures(from_score_mod(factory=factory)) == []

    # indices instead of positions: right only for default positions with n_q = n_k
    def by_index(score, b, h, q_idx, kv_idx):
        m = torch.exp2(-(h + 1) * 8.0 / 4)
        return score - m * (q_idx - kv_idx).abs()

    failures = _battery_failures(from_score_mod(by_index))
    assert "decode_chunk" in failures and "positions_with_gaps" in failures
    with pytest.raises(TypeError, match="^score_mod"):
        from_score_mod(by_index, factory=factory)
    with pytest.raises(TypeError, match="^score_mod"):
        from_score_mod()


def _eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    k = key.repeat_interleave(module.num_key_value_groups, dim=1)
    v = value.repeat_interleave(module.num_key_value_groups, dim=1)
    w = (query @ k.transpose(-1, -2)) * scaling + attention_mask
    w = torch.softmax(w.float(), dim=-1).to(query.dtype)
    return (w @ v).transpose(1, 2), w


def test_hf_attention_function():
    assert _battery_failures(from_hf_attention(_eager)) == []

    def no_scale(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        return _eager(module, query, key, value, attention_mask, 1.0)

    assert "scale_not_default" in _battery_failures(from_hf_attention(no_scale))


def test_adapter_bad_arguments():
    with pytest.raises(TypeError, match="^build"):
        from_bias_builder(3)
    with pytest.raises(ValueError, match="^slopes"):
        from_bias_builder(_exact_bias, slopes="mine")
    with pytest.raises(TypeError, match="^attention_fn"):
        from_hf_attention(None)

    def needs_unknown(num_heads, window):
        return 0

    result = check_case(from_bias_builder(needs_unknown), ProblemSpec().build(), framework="torch")
    assert not result.passed and "cannot supply argument(s) ['window']" in result.message


def test_score_mod_through_the_real_flex_attention():
    pytest.importorskip("torch.nn.attention.flex_attention")

    def factory(num_heads, query_positions, key_positions):
        m = torch.from_numpy(alibi_slopes(num_heads)).float()

        def alibi(score, b, h, q_idx, kv_idx):
            return score - m[h] * (query_positions[b, q_idx] - key_positions[b, kv_idx]).abs()

        return alibi

    def by_index(score, b, h, q_idx, kv_idx):  # FlexAttention indices, not positions
        return score - torch.exp2(-(h + 1) * 8.0 / 4) * (q_idx - kv_idx).abs()

    good = from_score_mod(factory=factory, flex=True)
    bad = from_score_mod(by_index, flex=True)
    cases = dict(battery(dtypes=DTYPES, slopes="standard"))
    for name in ("decode_chunk", "gqa_grouped", "left_padding_masked", "no_keys"):
        result = check_case(good, cases[name].build(), framework="torch")
        assert result.passed, (name, result.message)
    assert not check_case(bad, cases["decode_chunk"].build(), framework="torch").passed
    with pytest.raises(TypeError, match="^flex"):
        from_score_mod(by_index, flex="yes")
