"""Padded batches in the float64 reference (SPEC section 5): per-sequence positions
``(batch, n)`` and the key-padding ``attention_mask`` ``(batch, n_k)``, 1 = keep, 0 = pad."""

from __future__ import annotations

import numpy as np
import pytest

from plsh_ref.alibi import alibi_slopes, resolve_batch_positions
from plsh_ref.attention import (
    alibi_attention,
    fixed_block_attention,
    no_bias_attention,
    plsh_attention,
)
from plsh_ref.partition import bins, draw_partition

H = 4
PART = draw_partition(1.0 / alibi_slopes(H), 6, seed=5)


def _qkv(rng, batch, n_q, n_k, heads=H, heads_kv=2, d=3, dv=5):
    return (
        rng.standard_normal((batch, heads, n_q, d)),
        rng.standard_normal((batch, heads_kv, n_k, d)),
        rng.standard_normal((batch, heads_kv, n_k, dv)),
    )


ENTRY_POINTS = {
    "alibi": lambda *a, **kw: alibi_attention(*a, **kw, return_lse=True),
    "plsh_counts": lambda *a, **kw: plsh_attention(
        *a, partition=PART, method="counts", **kw, return_lse=True
    ),
    "plsh_reduction": lambda *a, **kw: plsh_attention(
        *a, partition=PART, method="reduction", **kw, return_lse=True
    ),
    "no_bias": lambda *a, **kw: no_bias_attention(*a, **kw, return_lse=True),
    "fixed_block": lambda *a, **kw: fixed_block_attention(*a, 3, **kw, return_lse=True),
}


def _left_padded_batch(rng, lengths, n, start=0):
    """A batch of sequences of the given lengths, left-padded to n, HF style."""
    batch = len(lengths)
    mask = np.zeros((batch, n), dtype=np.int64)
    pos = np.full((batch, n), 1, dtype=np.int64)  # HF puts 1 at pad slots
    for b, length in enumerate(lengths):
        mask[b, n - length :] = 1
        pos[b, n - length :] = start + np.arange(length)
    return mask, pos


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("causal", [True, False])
def test_left_padded_sequence_gives_its_unpadded_result_exactly(name, causal):
    fn = ENTRY_POINTS[name]
    rng = np.random.default_rng(1)
    n, lengths = 9, [9, 4, 1]
    q, k, v = _qkv(rng, len(lengths), n, n)
    mask, pos = _left_padded_batch(rng, lengths, n, start=7)
    # garbage at pad slots: positions there are ignored, pad keys get weight 0
    pos[1, 0] = -(2**62)
    k[1, :, :2] = 1e3
    out, lse = fn(
        q, k, v, causal=causal, query_positions=pos, key_positions=pos, attention_mask=mask
    )
    for b, length in enumerate(lengths):
        real = slice(n - length, n)
        p = 7 + np.arange(length)
        want_out, want_lse = fn(
            q[b : b + 1, :, real],
            k[b : b + 1, :, real],
            v[b : b + 1, :, real],
            causal=causal,
            query_positions=p,
            key_positions=p,
        )
        np.testing.assert_array_equal(out[b : b + 1, :, real], want_out)
        np.testing.assert_array_equal(lse[b : b + 1, :, real], want_lse)
        # pad query slots: output 0 and lse -inf, never NaN
        assert np.all(out[b, :, : n - length] == 0)
        assert np.all(np.isneginf(lse[b, :, : n - length]))


def test_bins_of_a_padded_sequence_are_its_unpadded_bins():
    pos = np.array([[1, 1, 0, 1, 2], [5, 6, 7, 8, 9]])
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    qpos, kpos, q_keep, k_keep = resolve_batch_positions(2, 5, 5, pos, pos, mask)
    np.testing.assert_array_equal(
        bins(PART, kpos[0][k_keep[0]]), bins(PART, np.array([0, 1, 2], dtype=np.int64))
    )
    np.testing.assert_array_equal(bins(PART, kpos[1]), bins(PART, pos[1]))
    assert q_keep.tolist() == k_keep.tolist()


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_pad_keys_get_weight_zero(name):
    fn = ENTRY_POINTS[name]
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, 2, 3, 6)
    mask = np.array([[1, 0, 1, 1, 0, 1], [1, 1, 1, 1, 1, 1]], dtype=bool)
    out, lse = fn(q, k, v, causal=False, attention_mask=mask)
    v2 = v.copy()
    v2[0, :, [1, 4]] = 1e6  # values of pad keys do not matter
    k2 = k.copy()
    k2[0, :, [1, 4]] = -1e2
    out2, lse2 = fn(q, k2, v2, causal=False, attention_mask=mask)
    np.testing.assert_array_equal(out, out2)
    np.testing.assert_array_equal(lse, lse2)
    # negative control: without the mask the pad keys change the result
    out3, _ = fn(q, k2, v2, causal=False)
    assert not np.allclose(out3[0], out[0])


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_fully_padded_rows_give_zero_and_minus_inf(name):
    fn = ENTRY_POINTS[name]
    rng = np.random.default_rng(3)
    q, k, v = _qkv(rng, 2, 2, 4)  # decode shape n_q < n_k
    mask = np.array([[0, 0, 0, 0], [1, 1, 1, 1]])
    out, lse = fn(q, k, v, causal=True, attention_mask=mask)
    assert not np.any(np.isnan(out)) and not np.any(np.isnan(lse))
    assert np.all(out[0] == 0) and np.all(np.isneginf(lse[0]))
    assert np.all(np.isfinite(lse[1]))


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_per_sequence_positions_equal_separate_calls(name):
    fn = ENTRY_POINTS[name]
    rng = np.random.default_rng(4)
    q, k, v = _qkv(rng, 2, 3, 5)
    kpos = np.array([[0, 2, 3, 7, 8], [2**20, 2**20 + 1, 2**20 + 5, 2**20 + 6, 2**20 + 9]])
    qpos = kpos[:, -3:]
    out, lse = fn(q, k, v, causal=True, query_positions=qpos, key_positions=kpos)
    for b in range(2):
        o, l = fn(
            q[b : b + 1],
            k[b : b + 1],
            v[b : b + 1],
            causal=True,
            query_positions=qpos[b],
            key_positions=kpos[b],
        )
        np.testing.assert_array_equal(out[b : b + 1], o)
        np.testing.assert_array_equal(lse[b : b + 1], l)
    # shared (n,) positions are the same as the row repeated over the batch
    shared = fn(q, k, v, causal=True, query_positions=qpos[0], key_positions=kpos[0])
    repeated = fn(q, k, v, causal=True, query_positions=qpos[[0, 0]], key_positions=kpos[[0, 0]])
    np.testing.assert_array_equal(shared[0], repeated[0])


def test_counts_and_reduction_agree_on_padded_batches():
    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, 3, 7, 7)
    mask, pos = _left_padded_batch(rng, [7, 3, 5], 7, start=100)
    kw = dict(causal=True, query_positions=pos, key_positions=pos, attention_mask=mask)
    a = plsh_attention(q, k, v, partition=PART, method="counts", **kw, return_lse=True)
    b = plsh_attention(q, k, v, partition=PART, method="reduction", **kw, return_lse=True)
    np.testing.assert_allclose(a[0], b[0], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(a[1]), np.isneginf(b[1]))


@pytest.mark.parametrize(
    "kwargs, exc, name",
    [
        (dict(attention_mask=np.ones((2, 4))), TypeError, "attention_mask"),
        (dict(attention_mask=np.ones((2, 5), dtype=int)), ValueError, "attention_mask"),
        (dict(attention_mask=2 * np.ones((2, 4), dtype=int)), ValueError, "attention_mask"),
        (dict(key_positions=np.zeros((3, 4), dtype=int)), ValueError, "key_positions"),
        (dict(query_positions=np.zeros((2, 2, 3), dtype=int)), ValueError, "query_positions"),
        (dict(key_positions=np.full((2, 4), 0.5)), TypeError, "key_positions"),
    ],
)
def test_bad_padding_arguments_name_the_argument(kwargs, exc, name):
    rng = np.random.default_rng(6)
    q, k, v = _qkv(rng, 2, 3, 4)
    for fn in ENTRY_POINTS.values():
        with pytest.raises(exc, match=rf"^{name}:"):
            fn(q, k, v, causal=True, **kwargs)


@pytest.mark.parametrize("kind", ["alibi", "plsh"])
def test_mp_attention_pads_like_the_float64_reference(kind):
    from plsh_ref.mp_attention import alibi_attention_mp, plsh_attention_mp

    rng = np.random.default_rng(8)
    q, k, v = _qkv(rng, 2, 4, 4, heads=2, heads_kv=1, d=2, dv=2)
    part = draw_partition([2.0, 5.0], 3, seed=1)
    mask, pos = _left_padded_batch(rng, [4, 2], 4, start=3)
    kw = dict(causal=True, query_positions=pos, key_positions=pos, attention_mask=mask)
    if kind == "alibi":
        mp = alibi_attention_mp(q, k, v, slopes=[0.5, 0.25], return_lse=True, dps=20, **kw)
        ref = alibi_attention(q, k, v, slopes=[0.5, 0.25], **kw, return_lse=True)
    else:
        mp = plsh_attention_mp(q, k, v, partition=part, return_lse=True, dps=20, **kw)
        ref = plsh_attention(q, k, v, partition=part, **kw, return_lse=True)
    np.testing.assert_allclose(mp[0].astype(float), ref[0], rtol=0, atol=1e-14)
    np.testing.assert_array_equal(np.isneginf(mp[1].astype(float)), np.isneginf(ref[1]))
    assert np.isneginf(ref[1][1, :, :2]).all()  # the pad query rows of sequence 1
