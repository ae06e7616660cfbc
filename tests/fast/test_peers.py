"""plsh_fast.peers against the float64 plsh_ref reference, under the SPEC section 6 rule.

Each peer's result is compared with the float64 reference of the same function (exact ALiBi:
:func:`plsh_ref.attention.alibi_attention`; the reduction: :func:`plsh_ref.attention.
plsh_attention` with ``backend="reduction"``) by
:func:`plsh_ref.testing.tolerance.assert_close_to_reference`, with plain attention with the
same dense bias in the peer's dtype as the yardstick.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from plsh_fast import peers  # noqa: E402
from plsh_ref.alibi import alibi_bias, alibi_slopes, resolve_positions  # noqa: E402
from plsh_ref.attention import alibi_attention, plsh_attention  # noqa: E402
from plsh_ref.partition import count_bias, counts, draw_partition  # noqa: E402
from plsh_ref.testing.baseline import plain_attention_numpy  # noqa: E402
from plsh_ref.testing.tolerance import assert_close_to_reference  # noqa: E402


def _qkv(shape_q, shape_kv, dtype, seed=0, dv=None):
    gen = torch.Generator().manual_seed(seed)
    b, hk, n_k, d = shape_kv
    q = torch.randn(*shape_q, generator=gen, dtype=torch.float64)
    k = torch.randn(b, hk, n_k, d, generator=gen, dtype=torch.float64)
    v = torch.randn(b, hk, n_k, dv or d, generator=gen, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _np(*ts):
    return [t.double().numpy() for t in ts]


def _check(out, q, k, v, bias, ref, dtype, name="output", lse=None, ref_lse=None):
    base, base_lse = plain_attention_numpy(*_np(q, k, v), bias, scale=None, dtype=dtype)
    assert_close_to_reference(out, ref, base, dtype, name=name)
    if lse is not None:
        assert_close_to_reference(lse, ref_lse, base_lse, dtype, name="lse")


POSITIONS = {
    # n_q, n_k, query_positions, key_positions
    "default": (24, 24, None, None),
    "kv_cache": (7, 30, None, None),  # queries aligned to the end of the keys
    "more_queries": (30, 20, None, None),  # first 10 queries have no admissible key
    "shuffled_repeats": (
        20,
        26,
        np.random.default_rng(3).integers(-40, 40, 20),
        np.random.default_rng(4).integers(-40, 40, 26),
    ),
}


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", sorted(POSITIONS))
def test_alibi_bias_equals_reference_bias(case, causal):
    n_q, n_k, qp, kp = POSITIONS[case]
    m = alibi_slopes(4)
    got = peers.sdpa_alibi_bias(
        m, n_q, n_k, query_positions=qp, key_positions=kp, causal=causal, dtype=torch.float64
    )
    ref = alibi_bias(m, *resolve_positions(n_q, n_k, qp, kp), causal=causal)
    np.testing.assert_array_equal(got.numpy(), ref)
    got32 = peers.sdpa_alibi_bias(m, n_q, n_k, query_positions=qp, key_positions=kp, causal=causal)
    assert got32.dtype == torch.float32
    finite = np.isfinite(ref)
    np.testing.assert_array_equal(np.isfinite(got32.numpy()), finite)
    # one rounding of the slope and one of the product: within 2 float32 ulps
    err = np.abs(got32.numpy()[finite] - ref[finite])
    assert np.all(err <= 2 * 2.0**-23 * np.abs(ref[finite]))


@pytest.mark.parametrize("chunk_size", [1, 7, 512])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", sorted(POSITIONS))
def test_exact_alibi_peer_matches_reference(case, causal, chunk_size):
    n_q, n_k, qp, kp = POSITIONS[case]
    q, k, v = _qkv((2, 4, n_q, 8), (2, 2, n_k, 8), torch.float64, dv=5)
    out, lse = peers.chunked_alibi_attention(
        q,
        k,
        v,
        causal=causal,
        query_positions=qp,
        key_positions=kp,
        chunk_size=chunk_size,
        return_lse=True,
    )
    assert out.dtype == torch.float64 and out.shape == (2, 4, n_q, 5)
    ref, ref_lse = alibi_attention(
        *_np(q, k, v), causal=causal, query_positions=qp, key_positions=kp, return_lse=True
    )
    bias = alibi_bias(alibi_slopes(4), *resolve_positions(n_q, n_k, qp, kp), causal=causal)
    _check(out, q, k, v, bias, ref, "float64", lse=lse, ref_lse=ref_lse)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", ["default", "kv_cache", "shuffled_repeats"])
def test_sdpa_peer_matches_reference(case, dtype):
    n_q, n_k, qp, kp = POSITIONS[case]
    causal = case != "shuffled_repeats"  # SDPA gives NaN on rows without admissible keys
    q, k, v = _qkv((1, 4, n_q, 16), (1, 4, n_k, 16), dtype, seed=1)
    out, lse = peers.sdpa_alibi_attention(
        q, k, v, causal=causal, query_positions=qp, key_positions=kp, return_lse=True
    )
    assert out.dtype == dtype and lse.dtype == dtype and lse.shape == (1, 4, n_q)
    ref, ref_lse = alibi_attention(
        *_np(q, k, v), causal=causal, query_positions=qp, key_positions=kp, return_lse=True
    )
    bias = alibi_bias(alibi_slopes(4), *resolve_positions(n_q, n_k, qp, kp), causal=causal)
    name = str(dtype).removeprefix("torch.")
    _check(out, q, k, v, bias, ref, name, lse=lse, ref_lse=ref_lse)
    alone = peers.sdpa_alibi_attention(q, k, v, causal=causal, query_positions=qp, key_positions=kp)
    assert torch.equal(alone, out)  # return_lse=False (the default): the output alone
    # negative control: the LSE of another slope set is outside the rule
    _, other = peers.sdpa_alibi_attention(
        q, k, v, slopes=alibi_slopes(4) * 2, causal=causal, query_positions=qp,
        key_positions=kp, return_lse=True,
    )  # fmt: skip
    with pytest.raises(AssertionError):
        _check(out, q, k, v, bias, ref, name, lse=other, ref_lse=ref_lse)
    prebuilt = peers.sdpa_alibi_bias(
        alibi_slopes(4),
        n_q,
        n_k,
        query_positions=qp,
        key_positions=kp,
        causal=causal,
        dtype=dtype,
    )
    again = peers.sdpa_alibi_attention(q, k, v, bias=prebuilt)
    torch.testing.assert_close(again, out, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", sorted(POSITIONS))
def test_reduction_peer_matches_reference(case, dtype):
    n_q, n_k, qp, kp = POSITIONS[case]
    q, k, v = _qkv((2, 4, n_q, 8), (2, 2, n_k, 8), dtype, seed=2)
    partition = draw_partition(np.array([2.0, 5.0, 11.0, 40.0]), 6, seed=3)
    out, lse = peers.reduction_attention(
        q, k, v, partition=partition, query_positions=qp, key_positions=kp, return_lse=True
    )
    assert out.dtype == dtype and out.shape == q.shape
    ref, ref_lse = plsh_attention(
        *_np(q, k, v),
        partition=partition,
        query_positions=qp,
        key_positions=kp,
        method="reduction",
        return_lse=True,
    )
    qpos, kpos = resolve_positions(n_q, n_k, qp, kp)
    bias = count_bias(counts(partition, qpos, kpos, causal=True), 6)
    name = str(dtype).removeprefix("torch.")
    _check(out, q, k, v, bias, ref, name, lse=lse, ref_lse=ref_lse)


def _flex_eager(*args, **kwargs):
    from torch.nn.attention.flex_attention import flex_attention

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        return flex_attention(*args, **kwargs)


def _alibi_slopes32():
    return torch.tensor(alibi_slopes(4), dtype=torch.float32)


@pytest.mark.parametrize("mask", ["block_mask", "causal_block_mask"])
def test_flex_alibi_peer_matches_reference(mask):
    """FlexAttention (eager) with the ALiBi score_mod and a causal block mask."""
    q, k, v = _qkv((1, 4, 80, 16), (1, 4, 80, 16), torch.float32, seed=4)
    if mask == "block_mask":
        bm = peers.block_mask(peers.causal_mask_mod(), 80, 80)
    else:
        bm = peers.causal_block_mask(80, block=16)  # 5 blocks, partial diagonal blocks
    out = _flex_eager(q, k, v, score_mod=peers.alibi_score_mod(_alibi_slopes32()), block_mask=bm)
    ref, _ = alibi_attention(*_np(q, k, v), return_lse=True)
    _check(
        out,
        q,
        k,
        v,
        alibi_bias(alibi_slopes(4), np.arange(80), np.arange(80), causal=True),
        ref,
        "float32",
    )


def test_causal_block_mask_is_the_causal_mask():
    from torch.nn.attention.flex_attention import create_block_mask

    for n, block in ((80, 16), (128, 128), (300, 128)):
        got = peers.causal_block_mask(n, block=block).to_dense()
        want = create_block_mask(
            peers.causal_mask_mod(), None, None, n, n, device="cpu", BLOCK_SIZE=block
        ).to_dense()
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("causal", [True, False])
def test_flex_window_peer_matches_reference(causal):
    """Windowed ALiBi: the window mask_mod equals the reference with pairs beyond the
    window masked; positions passed as tensors (a KV-cache-like offset)."""
    n_q, n_k = 40, 72
    qpos, kpos = resolve_positions(n_q, n_k, None, None)
    window = torch.tensor([3, 9, 20, 100])
    q, k, v = _qkv((1, 4, n_q, 8), (1, 4, n_k, 8), torch.float32, seed=5)
    bm = peers.block_mask(
        peers.window_mask_mod(
            window,
            causal=causal,
            query_positions=torch.from_numpy(qpos),
            key_positions=torch.from_numpy(kpos),
        ),
        n_q,
        n_k,
        num_heads=4,
    )
    score = peers.alibi_score_mod(_alibi_slopes32(), torch.from_numpy(qpos), torch.from_numpy(kpos))
    out = _flex_eager(q, k, v, score_mod=score, block_mask=bm)
    d = qpos[:, None] - kpos[None, :]
    inside = ((d >= 0) if causal else True) & (np.abs(d) < window.numpy()[:, None, None])
    bias = np.where(inside, alibi_bias(alibi_slopes(4), qpos, kpos, causal=False), -np.inf)
    from plsh_ref.attention import biased_attention

    ref, _ = biased_attention(*_np(q, k, v), bias=bias, return_lse=True)
    _check(out, q, k, v, bias, ref, "float32")
    # negative control: a window of every key is exact ALiBi, a narrower one is not
    exact, _ = alibi_attention(*_np(q, k, v), causal=causal, return_lse=True)
    assert np.max(np.abs(out.double().numpy()[0, 3] - exact[0, 3])) < 1e-5
    assert np.max(np.abs(out.double().numpy()[0, 0] - exact[0, 0])) > 1e-3


def test_compiled_flex_peer_matches_reference():
    """The compiled kernel (as the benchmarks run it) accepts the peers' score and mask
    functions and agrees with the reference. Compiling takes ~15-50 s on two CPU cores:
    the one compiled test of the suite."""
    q, k, v = _qkv((1, 4, 128, 16), (1, 4, 128, 16), torch.float32, seed=6)
    flex = peers.compiled_flex_attention()
    assert peers.compiled_flex_attention() is flex
    out = flex(
        q,
        k,
        v,
        score_mod=peers.alibi_score_mod(_alibi_slopes32()),
        block_mask=peers.causal_block_mask(128),
    )
    ref, _ = alibi_attention(*_np(q, k, v), return_lse=True)
    pos = np.arange(128)
    _check(out, q, k, v, alibi_bias(alibi_slopes(4), pos, pos, causal=True), ref, "float32")


def test_peers_refuse_bad_input():
    q, k, v = _qkv((1, 2, 4, 8), (1, 2, 4, 8), torch.float32)
    part = draw_partition(np.array([2.0, 3.0, 4.0]), 2, seed=0)
    cases = [
        (TypeError, "slopes", lambda: peers.sdpa_alibi_bias(None, 4, 4)),
        (ValueError, "slopes", lambda: peers.sdpa_alibi_bias([0.5, -1.0], 4, 4)),
        (ValueError, "n_q", lambda: peers.sdpa_alibi_bias([0.5], -1, 4)),
        (ValueError, "chunk_size", lambda: peers.chunked_alibi_attention(q, k, v, chunk_size=0)),
        (ValueError, "partition", lambda: peers.reduction_attention(q, k, v, partition=part)),
        (TypeError, "partition", lambda: peers.reduction_attention(q, k, v, partition=(1, 2))),
        (ValueError, "bias", lambda: peers.sdpa_alibi_attention(q, k, v, bias=torch.zeros(2, 4))),
        (TypeError, "window", lambda: peers.window_mask_mod([1, 2])),
        (TypeError, "slopes", lambda: peers.alibi_score_mod([0.5])),
        (TypeError, "bins", lambda: peers.reduction_mask_mod([[0]])),
        (TypeError, "bins", lambda: peers.reduction_block_mask(torch.zeros(2, 2))),
        (ValueError, "batch", lambda: peers.block_mask(peers.causal_mask_mod(), 4, 4, batch=0)),
        (
            ValueError,
            "query",
            lambda: peers.flex_reduction_attention(
                torch.zeros(2, 1, 4, 8),
                torch.zeros(2, 1, 4, 8),
                torch.zeros(2, 1, 4, 8),
                block_mask=None,
                num_samples=2,
                return_lse=True,
            ),  # fmt: skip
        ),
        (
            TypeError,
            "block_mask",
            lambda: peers.flex_reduction_attention(q[:1], k[:1], v[:1], num_samples=2),
        ),
        (
            TypeError,
            "return_lse",
            lambda: peers.flex_reduction_attention(q[:1], k[:1], v[:1], return_lse="yes"),
        ),
        (TypeError, "return_lse", lambda: peers.sdpa_alibi_attention(q, k, v, return_lse=1)),
        (TypeError, "bias", lambda: peers.dense_attention(q, k, v, scale=0.5)),
        (TypeError, "causal", lambda: peers.chunked_alibi_attention(q, k, v, causal="yes")),
        (
            ValueError,
            "query",
            lambda: peers.reduction_attention(q * math.nan, k, v, partition=part.heads(0, 2)),
        ),
    ]
    for exc, name, call in cases:
        with pytest.raises(exc, match=f"^{name}:"):
            call()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", sorted(POSITIONS))
def test_dense_attention_oracle_matches_reference(case, dtype):
    """The dense gradient oracle: output and LSE against the reference (empty rows too)."""
    from plsh_ref.attention import biased_attention

    n_q, n_k, qp, kp = POSITIONS[case]
    q, k, v = _qkv((2, 4, n_q, 8), (2, 2, n_k, 8), dtype, seed=7, dv=3)
    bias = alibi_bias(alibi_slopes(4), *resolve_positions(n_q, n_k, qp, kp), causal=True)
    out, lse = peers.dense_attention(q, k, v, bias=bias, scale=0.7, return_lse=True)
    assert out.dtype == dtype and lse.shape == (2, 4, n_q)
    ref, ref_lse = biased_attention(*_np(q, k, v), bias=bias, scale=0.7, return_lse=True)
    base, base_lse = plain_attention_numpy(*_np(q, k, v), bias, scale=0.7, dtype=str(dtype)[6:])
    assert_close_to_reference(out, ref, base, str(dtype)[6:])
    assert_close_to_reference(lse, ref_lse, base_lse, str(dtype)[6:], name="lse")


def test_dense_attention_gradients():
    """gradcheck in float64, and exactly zero gradients from rows without admissible keys."""
    q, k, v = (t.requires_grad_() for t in _qkv((1, 2, 6, 3), (1, 1, 5, 3), torch.float64))
    bias = alibi_bias(alibi_slopes(2), *resolve_positions(6, 5, None, None), causal=True)
    assert np.all(np.isneginf(bias[:, 0]))  # query 0 sits before every key

    def f(a, b, c):
        return peers.dense_attention(a, b, c, bias=bias, return_lse=True)[0]

    assert torch.autograd.gradcheck(f, (q, k, v))
    out, lse = peers.dense_attention(q, k, v, bias=bias, return_lse=True)
    assert torch.all(out[:, :, 0] == 0) and torch.all(torch.isneginf(lse[:, :, 0]))
    weight = torch.zeros_like(out)
    weight[:, :, 0] = 1.0  # loss reads only the empty row
    (gq,) = torch.autograd.grad((out * weight).sum(), (q,))
    assert torch.all(gq == 0) and torch.isfinite(gq).all()


@pytest.mark.parametrize("mask", ["reduction_block_mask", "block_mask"])
def test_flex_reduction_peer_matches_reference(mask):
    """The batched FlexAttention reduction (eager) against the float64 reduction reference."""
    from torch.nn.attention.flex_attention import flex_attention

    from plsh_fast._partition import bins, partition_tensors

    n, s = 80, 3
    partition = draw_partition(np.array([3.0, 25.0]), s, seed=8)
    q, k, v = _qkv((1, 2, n, 8), (1, 2, n, 8), torch.float32, seed=9)
    pitch, offset = partition_tensors(partition, "cpu")
    b = bins(pitch, offset, torch.arange(n)).transpose(0, 1).contiguous()  # (s, H, n)
    if mask == "reduction_block_mask":
        bm = peers.reduction_block_mask(b, block=16)
    else:
        bm = peers.block_mask(peers.reduction_mask_mod(b), n, n, num_heads=2, batch=s)
    with warnings.catch_warnings():
        # only eager Flex's notice: a deprecation warning of ours would still fail the test
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        out, lse = peers.flex_reduction_attention(
            q, k, v, block_mask=bm, num_samples=s, return_lse=True, flex=flex_attention
        )
        alone = peers.flex_reduction_attention(
            q, k, v, block_mask=bm, num_samples=s, return_lse=False, flex=flex_attention
        )
    assert torch.equal(alone, out)
    ref, ref_lse = plsh_attention(
        *_np(q, k, v), partition=partition, method="reduction", return_lse=True
    )
    pos = np.arange(n)
    bias = count_bias(counts(partition, pos, pos, causal=True), s)
    _check(out, q, k, v, bias, ref, "float32", lse=lse, ref_lse=ref_lse)


def test_expand_kv_repeats_groups_and_refuses_non_multiples():
    # num_heads not a multiple of num_heads_kv used to return num_heads_kv heads (3 -> 2)
    # or none at all (1 -> 0) without a word
    x = torch.arange(2 * 3, dtype=torch.float32).reshape(1, 2, 3, 1)
    out = peers.expand_kv(x, 4)
    assert out.shape == (1, 4, 3, 1)
    assert torch.equal(out[:, 1], x[:, 0]) and torch.equal(out[:, 2], x[:, 1])
    assert peers.expand_kv(x, 2) is x
    for heads in (3, 1, 0, -2):
        with pytest.raises(ValueError, match="^num_heads"):
            peers.expand_kv(x, heads)
    with pytest.raises(TypeError, match="^num_heads"):
        peers.expand_kv(x, 2.0)
    with pytest.raises(TypeError, match="^x"):
        peers.expand_kv(x.numpy(), 2)


def test_flex_reduction_refuses_the_compiled_default_on_cpu():
    """Compiled FlexAttention on the CPU returns no LSE (torch: "`return_lse` is not
    supported yet"), which the merge needs: the default ``flex`` is refused by name before
    any work, whether or not the LSE is asked for (it used to fail inside Inductor)."""
    q = torch.randn(1, 2, 16, 8)
    for return_lse in (True, False):
        with pytest.raises(ValueError, match="^flex: compiled FlexAttention on the CPU"):
            peers.flex_reduction_attention(
                q, q, q, block_mask=object(), num_samples=2, return_lse=return_lse
            )
