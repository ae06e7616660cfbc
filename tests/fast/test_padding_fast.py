"""Padded batches in plsh_fast (SPEC section 5): per-sequence positions and attention_mask.

A left-padded sequence must give exactly its unpadded bins, and its unpadded outputs and
gradients on its real tokens; pad slots get output 0 / LSE -inf / zero gradient; what a
pad slot holds cannot change anything real. Checked on the CPU path, the Triton
interpreter path, the nn modules (fast, dense, exact) and against the float64 padded
reference plsh_ref.plsh_attention.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import plsh_ref  # noqa: E402
from plsh_fast import _padding as padding  # noqa: E402
from plsh_fast import plsh_attention  # noqa: E402
from plsh_fast.nn import PLSHAttention, PLSHSelfAttention  # noqa: E402
from plsh_ref.alibi import alibi_slopes  # noqa: E402
from plsh_ref.partition import bins, draw_partition  # noqa: E402

LENGTHS = (20, 13, 7)  # real lengths of the three sequences, left-padded to 20
N = 20
HEADS, HEADS_KV, D = 4, 2, 8


def _partition(s=6, seed=3):
    return draw_partition(1.0 / alibi_slopes(HEADS), s, seed=seed)


def _batch(dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    b = len(LENGTHS)
    q = torch.randn(b, HEADS, N, D, generator=g, dtype=dtype)
    k = torch.randn(b, HEADS_KV, N, D, generator=g, dtype=dtype)
    v = torch.randn(b, HEADS_KV, N, D + 3, generator=g, dtype=dtype)
    mask = torch.zeros(b, N, dtype=torch.int64)
    for i, length in enumerate(LENGTHS):
        mask[i, N - length :] = 1
    # HF left padding: position_ids = cumsum(mask) - 1, pad slots filled with 1
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    return q, k, v, mask, positions


def _unpadded(x, i, length):
    return x[i : i + 1, :, N - length :]


@pytest.mark.parametrize("causal", [True, False])
def test_left_padded_sequences_give_their_unpadded_results(causal):
    q, k, v, mask, pos = _batch()
    part = _partition()
    out, lse = plsh_attention(
        q,
        k,
        v,
        partition=part,
        causal=causal,
        query_positions=pos,
        key_positions=pos,
        attention_mask=mask,
        return_lse=True,
    )
    for i, length in enumerate(LENGTHS):
        o1, l1 = plsh_attention(
            _unpadded(q, i, length),
            _unpadded(k, i, length),
            _unpadded(v, i, length),
            partition=part,
            causal=causal,
            return_lse=True,
        )
        torch.testing.assert_close(out[i : i + 1, :, N - length :], o1, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse[i : i + 1, :, N - length :], l1, rtol=1e-12, atol=1e-12)
        # pad query slots: output 0, LSE -inf
        assert torch.equal(out[i, :, : N - length], torch.zeros_like(out[i, :, : N - length]))
        assert torch.isneginf(lse[i, :, : N - length]).all()
    # and the float64 padded reference agrees (same partition, same semantics)
    ref, ref_lse = plsh_ref.plsh_attention(
        q.numpy(),
        k.numpy(),
        v.numpy(),
        partition=part,
        causal=causal,
        query_positions=pos.numpy(),
        key_positions=pos.numpy(),
        attention_mask=mask.numpy(),
        return_lse=True,
    )
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=1e-10)
    np.testing.assert_allclose(lse.numpy(), ref_lse, rtol=0, atol=1e-10)


def test_groups_use_each_sequences_own_positions_bit_for_bit():
    """Bins of a left-padded sequence are those of the sequence unpadded (int64 equality)."""
    _, _, _, mask, pos = _batch()
    groups = padding.group_batch(pos, pos, mask, len(LENGTHS))
    assert len(groups) == len(LENGTHS)
    part = _partition()
    seen = set()
    for group in groups:
        (row,) = group.rows.tolist()
        length = LENGTHS[row]
        seen.add(row)
        assert torch.equal(group.key_positions, torch.arange(length))
        assert torch.equal(group.query_positions, torch.arange(length))
        np.testing.assert_array_equal(
            bins(part, group.key_positions.numpy()), bins(part, np.arange(length))
        )
    assert seen == set(range(len(LENGTHS)))
    # negative control: the padded row's raw positions would give other bins
    assert not np.array_equal(bins(part, pos[2].numpy()[-7:]), bins(part, pos[2].numpy()[:7]))


def test_sequences_sharing_positions_and_mask_form_one_group():
    _, _, _, mask, pos = _batch()
    mask2 = torch.cat([mask[1:2], mask[1:2], mask[2:3]])
    pos2 = torch.cat([pos[1:2], pos[1:2], pos[2:3]])
    groups = padding.group_batch(pos2, pos2, mask2, 3)
    assert sorted(len(g.rows) for g in groups) == [1, 2]
    # 1-D positions without a mask: one group, no compaction, nothing read on the host
    (whole,) = padding.group_batch(torch.arange(5), torch.arange(5), None, 3)
    assert whole.whole


def test_pad_slot_contents_cannot_change_real_outputs():
    q, k, v, mask, pos = _batch()
    part = _partition()
    kwargs = dict(partition=part, query_positions=pos, key_positions=pos, attention_mask=mask)
    out = plsh_attention(q, k, v, **kwargs)
    pad = mask == 0
    k2, v2, q2 = k.clone(), v.clone(), q.clone()
    k2[pad[:, None].expand_as(k2[..., 0])] = 1e3
    v2[pad[:, None].expand_as(v2[..., 0])] = -7.0
    q2[pad[:, None].expand_as(q2[..., 0])] = 5.0
    pos2 = pos.masked_fill(pad, 10**15)  # any int64 value at pad slots
    out2 = plsh_attention(
        q2, k2, v2, partition=part, query_positions=pos2, key_positions=pos2, attention_mask=mask
    )
    assert torch.equal(out, out2)
    # negative control: without the mask the pad keys do change real outputs
    out3 = plsh_attention(q, k2, v2, partition=part, query_positions=pos, key_positions=pos)
    assert not torch.allclose(out3[2, :, -7:], out[2, :, -7:])


def test_padded_backward_equals_unpadded_backward_and_pads_get_zero_gradient():
    q, k, v, mask, pos = _batch()
    part = _partition()
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = plsh_attention(
        *leaves,
        partition=part,
        query_positions=pos,
        key_positions=pos,
        attention_mask=mask,
        return_lse=True,
    )
    w = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    wl = torch.linspace(0.5, -0.5, lse.numel(), dtype=lse.dtype).view_as(lse)
    (out * w).sum().add(torch.where(torch.isfinite(lse), lse * wl, 0).sum()).backward()
    for i, length in enumerate(LENGTHS):
        sub = [_unpadded(x, i, length).clone().requires_grad_() for x in (q, k, v)]
        o1, l1 = plsh_attention(*sub, partition=part, return_lse=True)
        (
            (o1 * _unpadded(w, i, length)).sum() + (l1 * wl[i : i + 1, :, N - length :]).sum()
        ).backward()
        for leaf, s in zip(leaves, sub):
            torch.testing.assert_close(
                leaf.grad[i : i + 1, :, N - length :], s.grad, rtol=1e-10, atol=1e-12
            )
            assert torch.equal(
                leaf.grad[i, :, : N - length], torch.zeros_like(leaf.grad[i, :, : N - length])
            )


def test_a_row_whose_keys_are_all_padded_gives_zero_and_minus_inf_without_nan():
    q, k, v, mask, pos = _batch()
    mask[1] = 0  # every key of sequence 1 padded
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = plsh_attention(
        *leaves,
        partition=_partition(),
        query_positions=pos,
        key_positions=pos,
        attention_mask=mask.bool(),
        return_lse=True,
    )
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.isneginf(lse[1]).all()
    out.sum().backward()
    for leaf in leaves:
        assert torch.isfinite(leaf.grad).all()
        assert torch.equal(leaf.grad[1], torch.zeros_like(leaf.grad[1]))


def test_modules_fast_dense_exact_with_padding():
    """PLSHAttention backends agree on a padded batch; exact matches the padded reference."""
    q, k, v, mask, pos = _batch()
    outs = {}
    for backend in ("auto", "dense"):
        core = PLSHAttention(HEADS, 6, seed=4, backend=backend).eval()
        outs[backend] = core(q, k, v, query_positions=pos, key_positions=pos, attention_mask=mask)
    torch.testing.assert_close(outs["auto"], outs["dense"], rtol=1e-10, atol=1e-12)
    exact = PLSHAttention(HEADS, method="exact")(
        q, k, v, query_positions=pos, key_positions=pos, attention_mask=mask
    )
    ref, _ = plsh_ref.alibi_attention(
        q.numpy(),
        k.numpy(),
        v.numpy(),
        query_positions=pos.numpy(),
        key_positions=pos.numpy(),
        attention_mask=mask.numpy(),
        return_lse=True,
    )
    np.testing.assert_allclose(exact.numpy(), ref, rtol=0, atol=1e-12)
    layer = PLSHSelfAttention(16, 4, attention=PLSHAttention(4, 6, seed=1)).double().eval()
    x = torch.randn(len(LENGTHS), N, 16, dtype=torch.float64)
    y = layer(x, query_positions=pos, attention_mask=mask)
    y1 = layer(x[2:3, N - LENGTHS[2] :])
    torch.testing.assert_close(y[2:3, N - LENGTHS[2] :], y1, rtol=1e-10, atol=1e-12)


@pytest.mark.triton
def test_triton_interpreter_path_with_padding_matches_the_cpu_path():
    import _triton_interp

    _triton_interp.load("triton")
    q, k, v, mask, pos = _batch(dtype=torch.float32)
    part = _partition(s=4)
    results = []
    for backend in ("cpu", "triton"):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out, lse = plsh_attention(
            *leaves,
            partition=part,
            query_positions=pos,
            key_positions=pos,
            attention_mask=mask,
            return_lse=True,
            backend=backend,
        )
        out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
        results.append((out, lse, *(x.grad for x in leaves)))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert torch.isneginf(results[1][1][2, :, : N - LENGTHS[2]]).all()


BAD = [
    ("query_positions", ValueError, dict(query_positions=torch.zeros(2, N, dtype=torch.int64))),
    ("query_positions", TypeError, dict(query_positions=torch.arange(N, dtype=torch.float32))),
    ("key_positions", TypeError, dict(key_positions=torch.ones(N, dtype=torch.bool))),
    ("key_positions", ValueError, dict(key_positions=torch.zeros(3, N, 1, dtype=torch.int64))),
    ("attention_mask", TypeError, dict(attention_mask=torch.ones(3, N))),
    ("attention_mask", ValueError, dict(attention_mask=torch.ones(2, N, dtype=torch.bool))),
    ("attention_mask", ValueError, dict(attention_mask=torch.ones(3, N - 1, dtype=torch.bool))),
    ("attention_mask", ValueError, dict(attention_mask=torch.full((3, N), 2))),
    (
        "key_positions",
        ValueError,
        dict(
            key_positions=torch.full((3, N), 2**60),
            attention_mask=torch.ones(3, N, dtype=torch.bool),
        ),
    ),
]


@pytest.mark.parametrize("name,error,kwargs", BAD, ids=[f"{i}-{b[0]}" for i, b in enumerate(BAD)])
def test_bad_positions_and_masks_name_the_argument(name, error, kwargs):
    q, k, v, _, _ = _batch(dtype=torch.float32)
    with pytest.raises(error, match=f"^{name}:"):
        plsh_attention(q, k, v, partition=_partition(), **kwargs)
    with pytest.raises(error, match=f"^{name}:"):
        core = PLSHAttention(HEADS, 6, seed=0, backend="dense")
        core(
            q,
            k,
            v,
            query_positions=kwargs.get("query_positions"),
            key_positions=kwargs.get("key_positions"),
            attention_mask=kwargs.get("attention_mask"),
        )


@pytest.mark.triton
def test_triton_backward_reuses_the_forward_plan(monkeypatch):
    import _triton_interp

    launch = _triton_interp.load("triton._launch")  # where both passes plan
    calls = []
    real = launch.make_plan

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, 2, 40, 16, generator=g, dtype=torch.float32).requires_grad_()
        for _ in range(3)
    )
    monkeypatch.setattr(launch, "make_plan", counting)
    out = plsh_attention(q, k, v, num_samples=4, seed=0, backend="triton")
    assert calls == [1]  # the forward planned (the counter sees the launch code's plans)
    out.sum().backward()
    assert calls == [1]  # the backward planned nothing: it used the forward's plan
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_float16_array_like_positions_are_taken_without_a_warning():
    # the 2**53 magnitude check once ran in float16, where 2**53 overflows: a RuntimeWarning
    # ("overflow encountered in cast") on every float16 array of positions
    import warnings

    cpu = torch.device("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = padding.check_positions(
            "key_positions", np.array([3, -1, 2048], np.float16), 1, 3, cpu
        )
    assert got.dtype == torch.int64 and got.tolist() == [3, -1, 2048]
