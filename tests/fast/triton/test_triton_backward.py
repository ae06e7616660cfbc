"""Triton backward kernels against dense float64 autograd: compiled on CUDA when a GPU is
present, in the Triton interpreter on CPU otherwise (tests/_triton_interp.py).

The reference gradient is torch autograd through dense softmax attention with the bias
``log M~`` of the same partition sample, in float64; the yardstick of the tolerance rule
(SPEC section 6) is the same dense autograd computation in the kernel's dtype.
"""

from __future__ import annotations

import _triton_interp  # noqa: F401  (picks compiled/interpreted before triton kernels load)
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from plsh_ref.partition import (
    count_bias,  # noqa: E402
    counts,
    draw_partition,
)
from plsh_ref.testing.tolerance import assert_close_to_reference

plsh_triton = _triton_interp.load("triton")
backward_module = _triton_interp.load("triton._backward")
launch_module = _triton_interp.load("triton._launch")

pytestmark = pytest.mark.triton

BLOCK = 16
DTYPES = {"float32": torch.float32, "float16": torch.float16}


def _dense_grads(q, k, v, grad_out, bias, scale, dtype):
    """Autograd of softmax(scale q k^T + bias) v in ``dtype``; empty rows give 0."""
    q, k, v = (t.detach().to(dtype).requires_grad_(True) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kk = k.repeat_interleave(group, dim=1)
    vv = v.repeat_interleave(group, dim=1)
    b = torch.from_numpy(bias).to(dtype)[None]
    empty = torch.isneginf(b).all(dim=-1, keepdim=True)
    logits = torch.where(
        empty, torch.zeros((), dtype=dtype), (q @ kk.transpose(-1, -2)) * scale + b
    )
    weights = torch.softmax(logits, dim=-1) * (~empty)
    out = weights @ vv
    (out * grad_out.to(dtype)).sum().backward()
    return q.grad, k.grad, v.grad


def _case(rng, batch, num_heads, num_heads_kv, n_q, n_k, d, dv, s, dtype, sigma, seed):
    partition = draw_partition(sigma, s, seed=seed)
    q = torch.from_numpy(rng.standard_normal((batch, num_heads, n_q, d))).to(dtype)
    k = torch.from_numpy(rng.standard_normal((batch, num_heads_kv, n_k, d))).to(dtype)
    v = torch.from_numpy(rng.standard_normal((batch, num_heads_kv, n_k, dv))).to(dtype)
    g = torch.from_numpy(rng.standard_normal((batch, num_heads, n_q, dv))).to(dtype)
    return partition, q, k, v, g


def _blocks(q, v, partition, **changes):
    """16 x 16 tiles of the shipped ``TileConfig`` and ``changes`` (other fields)."""
    changes = dict(dict(block_m=BLOCK, block_n=BLOCK), **changes)
    return _triton_interp.tiles(q.shape[3], v.shape[3], q.dtype, partition.num_samples, **changes)


#: ``_kernel_grads``'s default backward tiles: 16 x 16 (and the ``changes`` given).
SMALL = "16 x 16"


def _kernel_grads(q, k, v, g, partition, qpos, kpos, scale, causal, tiles=SMALL, **changes):
    """The forward on 16 x 16 tiles, then the backward on ``tiles`` (a ``TileConfig``;
    ``None``: the launch code's own choice; default: 16 x 16 tiles with ``changes``)."""
    pitch = torch.from_numpy(np.array(partition.pitch))
    offset = torch.from_numpy(np.array(partition.offset))
    qp, kp = torch.from_numpy(qpos), torch.from_numpy(kpos)
    out, lse, stats = _triton_interp.call(
        plsh_triton.plsh_forward_triton,
        q, k, v, pitch, offset, qp, kp, scale, causal, tiles=_blocks(q, v, partition),
        return_stats=True,
    )  # fmt: skip
    tiles = _blocks(q, v, partition, **changes) if tiles is SMALL else tiles
    return _triton_interp.call(
        plsh_triton.plsh_backward_triton,
        q,
        k,
        v,
        out,
        lse,
        g,
        pitch,
        offset,
        qp,
        kp,
        scale,
        causal,
        stats=stats,
        tiles=tiles,
    )


def _check_grads(q, k, v, g, partition, qpos, kpos, scale, causal, dtype_name, **kw):
    c = counts(partition, qpos, kpos, causal=causal)
    bias = count_bias(c, partition.num_samples)
    ref = _dense_grads(q.double(), k.double(), v.double(), g.double(), bias, scale, torch.float64)
    base = _dense_grads(q, k, v, g, bias, scale, DTYPES.get(dtype_name, torch.bfloat16))
    got = _kernel_grads(q, k, v, g, partition, qpos, kpos, scale, causal, **kw)
    # The floor (4 ulps) is relative to the largest entry of all three gradients: a
    # gradient can vanish identically (grad_query of a query with one admissible key is
    # exactly 0) while the kernel's rounding of D_i = dO_i . O_i leaves ulp-sized residue.
    magnitude = max(float(r.abs().max()) if r.numel() else 0.0 for r in ref)
    for name, x, r, b in zip(("grad_query", "grad_key", "grad_value"), got, ref, base):
        assert x.dtype == q.dtype and x.shape == r.shape
        assert not torch.isnan(x).any()
        assert_close_to_reference(x, r, b, dtype_name, name=name, floor_scale=magnitude)
    return got, c


@settings(max_examples=10)
@given(
    num_heads_kv=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 2]),
    n_q=st.integers(1, 40),
    n_k=st.integers(1, 40),
    d=st.integers(1, 19),
    dv=st.integers(1, 19),
    s=st.integers(1, 5),
    causal=st.booleans(),
    dtype=st.sampled_from(sorted(DTYPES)),
    explicit=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_backward_matches_dense_autograd(
    num_heads_kv, group, n_q, n_k, d, dv, s, causal, dtype, explicit, seed
):
    rng = np.random.default_rng(seed)
    num_heads = num_heads_kv * group
    sigma = np.exp(rng.uniform(0.0, np.log(64.0), size=num_heads))
    partition, q, k, v, g = _case(
        rng, 1, num_heads, num_heads_kv, n_q, n_k, d, dv, s, DTYPES[dtype], sigma, seed
    )
    if explicit:  # increasing with gaps; some queries precede every key (empty rows)
        kpos = np.cumsum(rng.integers(1, 3, size=n_k)).astype(np.int64)
        qpos = np.sort(rng.integers(-3, kpos[-1] + 3, size=n_q)).astype(np.int64)
    else:
        qpos, kpos = np.arange(n_q) + (n_k - n_q), np.arange(n_k)
    _check_grads(q, k, v, g, partition, qpos, kpos, float(rng.uniform(0.3, 1.2)), causal, dtype)


def test_inadmissible_rows_and_keys_get_exactly_zero_gradient():
    """Queries without admissible keys get dQ = 0; keys no query may see get dK = dV = 0."""
    rng = np.random.default_rng(4)
    partition, q, k, v, g = _case(
        rng, 2, 2, 1, 21, 30, 6, 5, 3, torch.float32, np.array([3.0, 20.0]), 4
    )
    kpos = np.arange(30) + 10  # keys 10..39
    qpos = np.arange(21) + 3  # queries 3..23: rows 3..9 see no key (causal)
    (dq, dk, dv), c = _check_grads(q, k, v, g, partition, qpos, kpos, 0.6, True, "float32")
    empty_rows = np.flatnonzero(c.sum(axis=(0, 2)) == 0)
    dead_keys = np.flatnonzero(c.sum(axis=(0, 1)) == 0)
    assert empty_rows.size and dead_keys.size
    assert torch.equal(dq[:, :, empty_rows], torch.zeros_like(dq[:, :, empty_rows]))
    assert torch.equal(dk[:, :, dead_keys], torch.zeros_like(dk[:, :, dead_keys]))
    assert torch.equal(dv[:, :, dead_keys], torch.zeros_like(dv[:, :, dead_keys]))


def test_bfloat16():
    rng = np.random.default_rng(9)
    partition, q, k, v, g = _case(
        rng, 1, 2, 2, 25, 25, 8, 8, 4, torch.bfloat16, np.array([4.0, 16.0]), 9
    )
    pos = np.arange(25)
    _check_grads(q, k, v, g, partition, pos, pos, 0.5, True, "bfloat16")


def test_plan_saved_by_the_forward_gives_the_same_gradients(monkeypatch):
    """Backward with the forward's plan (no second planning pass) is bit-identical, and so
    is a forward given that plan."""
    rng = np.random.default_rng(6)
    partition, q, k, v, g = _case(
        rng, 1, 2, 1, 35, 35, 6, 6, 5, torch.float32, np.array([2.0, 25.0]), 6
    )
    pos = torch.arange(35)
    pitch = torch.from_numpy(np.array(partition.pitch))
    offset = torch.from_numpy(np.array(partition.offset))
    blocks = dict(tiles=_blocks(q, v, partition))
    call = _triton_interp.call
    out, lse, stats, plan = call(
        plsh_triton.plsh_forward_triton,
        q, k, v, pitch, offset, pos, pos, 0.5, True, return_plan=True, return_stats=True,
        **blocks,
    )  # fmt: skip
    fresh = call(
        plsh_triton.plsh_backward_triton,
        q, k, v, out, lse, g, pitch, offset, pos, pos, 0.5, True, stats=stats, **blocks,
    )  # fmt: skip
    planned = _triton_interp.record_plans(monkeypatch)
    saved = call(
        plsh_triton.plsh_backward_triton,
        q, k, v, out, lse, g, pitch, offset, pos, pos, 0.5, True, stats=stats, plan=plan,
        **blocks,
    )  # fmt: skip
    assert planned == []  # no planning in the backward pass
    assert all(torch.equal(a, b) for a, b in zip(fresh, saved))
    again = call(
        plsh_triton.plsh_forward_triton,
        q, k, v, pitch, offset, pos, pos, 0.5, True, plan=plan, **blocks,
    )  # fmt: skip
    assert torch.equal(again[0], out) and torch.equal(again[1], lse)


def test_key_value_gradients_with_smaller_query_tiles():
    """The dK/dV kernel walking the query range in tiles smaller than the plan's (as the
    compiled default, 16 rows for block_m = 64) gives the reference gradients."""
    rng = np.random.default_rng(17)
    partition, q, k, v, g = _case(
        rng, 1, 4, 2, 70, 70, 8, 6, 5, torch.float32, np.array([2.0, 7.0, 30.0, 90.0]), 17
    )
    pos = np.arange(70)
    for causal in (True, False):
        _check_grads(
            q, k, v, g, partition, pos, pos, 0.6, causal, "float32", block_m=32, dkdv_block_m=16
        )


def test_query_gradients_with_narrower_key_tiles():
    """The dQ kernel walking the key range in tiles narrower than the plan's (as the
    compiled default: 32 keys for block_n = 64 on sm_90, 16 for 32 on sm_80) gives the
    reference gradients; key ranges start at multiples of the plan's tile."""
    rng = np.random.default_rng(19)
    partition, q, k, v, g = _case(
        rng, 1, 2, 2, 70, 75, 8, 6, 5, torch.float32, np.array([2.0, 40.0]), 19
    )
    qpos, kpos = np.arange(70) + 5, np.arange(75)
    for causal in (True, False):
        _check_grads(
            q, k, v, g, partition, qpos, kpos, 0.6, causal, "float32", block_n=32, dq_block_n=16
        )


@pytest.mark.parametrize(("s", "causal", "n"), [(70, True, 24), (200, False, 16)])
def test_many_samples_use_several_sample_blocks(s, causal, n, monkeypatch):
    """s = 70, 200 > 64: every backward kernel sums the counts over three and seven
    statically unrolled 32-sample blocks (the last one partial; start and end events at
    200). The launch code asks ``tile_config`` for the tiles of ``s`` samples."""
    rng = np.random.default_rng(19)
    partition, q, k, v, g = _case(
        rng, 1, 2, 1, n, n, 6, 6, s, torch.float32, np.array([2.0, 9.0]), 19
    )
    asked = []
    real = launch_module.tile_config
    monkeypatch.setattr(
        launch_module, "tile_config", lambda *a, **kw: asked.append(kw) or real(*a, **kw)
    )
    pos = np.arange(n)
    _check_grads(q, k, v, g, partition, pos, pos, 0.6, causal, "float32", tiles=None)
    assert [kw.get("num_samples") for kw in asked] == [s]


def test_tile_classification_gives_the_same_gradients():
    """Skipping full/disjoint samples per tile pair: bit-identical gradients."""
    rng = np.random.default_rng(6)
    partition, q, k, v, g = _case(
        rng, 1, 2, 1, 35, 35, 6, 6, 5, torch.float32, np.array([2.0, 25.0]), 6
    )
    pos = np.arange(35)
    fast = _kernel_grads(q, k, v, g, partition, pos, pos, 0.5, True)
    slow = _kernel_grads(q, k, v, g, partition, pos, pos, 0.5, True, classify=False)
    assert all(torch.equal(a, b) for a, b in zip(fast, slow))


def test_negative_control_counts_ignored_fails():
    """Backward probabilities without the count weights must fail the same check."""
    rng = np.random.default_rng(2)
    partition, q, k, v, g = _case(
        rng, 1, 2, 1, 40, 40, 8, 8, 4, torch.float32, np.array([3.0, 12.0]), 2
    )
    pos = np.arange(40)
    _check_grads(q, k, v, g, partition, pos, pos, 0.5, True, "float32")
    with pytest.raises(AssertionError):
        _check_grads(q, k, v, g, partition, pos, pos, 0.5, True, "float32", variant=1)


def test_unsorted_positions_give_the_gradients_in_the_callers_order(monkeypatch):
    """Shuffled (and repeated) positions: both passes plan on sorted rows; the gradients
    come back in the caller's row order."""
    planned = _triton_interp.record_plans(monkeypatch)
    rng = np.random.default_rng(13)
    partition, q, k, v, g = _case(
        rng, 1, 2, 1, 33, 29, 6, 5, 3, torch.float32, np.array([2.5, 11.0]), 13
    )
    qpos = rng.permutation(np.arange(33) * 2).astype(np.int64)
    kpos = rng.permutation(np.repeat(np.arange(15), 2)[:29] * 4).astype(np.int64)
    for causal in (True, False):
        _check_grads(q, k, v, g, partition, qpos, kpos, 0.7, causal, "float32")
    assert len(planned) == 4  # the forward and the backward pass, causal and not
    for positions in (p for pair in planned for p in pair):
        assert bool((positions[1:] >= positions[:-1]).all())


@pytest.mark.parametrize("dtype_name", ["float16", "float32"])
@pytest.mark.parametrize("head_dims", [(48, 80), (20, 96)])
def test_head_dims_split_in_two_column_chunks(head_dims, dtype_name):
    """Two column chunks in every backward kernel: float16 48 = 32 + 16, 80 = 64 + 16,
    96 = 64 + 32; float32 the wider head size in equal halves, 80 and 96 -> 64 + 64
    (``TileConfig.column_halves``), the narrower whole, 48 = 32 + 16 and 20 -> 32
    (``TileConfig.narrow_whole``): the reference gradients."""
    d, dv = head_dims
    dtype = DTYPES[dtype_name]
    tiles = plsh_triton.tile_config(d, dv, _triton_interp.DEVICE, dtype)
    assert tiles.column_halves == tiles.narrow_whole == (dtype == torch.float32)
    rng = np.random.default_rng(d + dv)
    partition, q, k, v, g = _case(rng, 1, 2, 1, 30, 30, d, dv, 3, dtype, np.array([3.0, 14.0]), d)
    pos = np.arange(30)
    _check_grads(q, k, v, g, partition, pos, pos, 0.2, True, dtype_name)


class _LaunchRecorder:
    """Wraps a kernel: ``kernel[grid](...)`` runs it and records ``(grid, constexprs)``."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((grid, kwargs))
            return self.kernel[grid](*args, **kwargs)

        return launch


@pytest.mark.parametrize(
    "head_dims,group,causal",
    [((40, 72), 2, True), ((64, 64), 1, False), ((128, 96), 1, True), ((20, 24), 1, True)],
)
def test_float32_sm90_key_value_layout(monkeypatch, head_dims, group, causal):
    """The float32 dK/dV layout of sm_90 (``TileConfig.dkdv_block_n``, ``dkdv_split_d``,
    ``dkdv_manual_x3``) with small tiles: key tiles wider than the plan's (their own query
    ranges), two programs per key tile accumulating one column half each (in two quarters),
    tf32x3 of the logits and dP written out over four column quarters of 16 and 32
    columns (padded ones included), GQA, n_q != n_k: the reference gradients. Head sizes
    20/24 (column halves of 16) keep Triton's own tf32x3 (quarters would be narrower than
    16 columns)."""
    d, dv = head_dims
    tiles = plsh_triton.TileConfig(
        16, 16, 4, 1, 4, 16, 4, True, dkdv_block_n=32, dkdv_split_d=True, dkdv_manual_x3=True
    )
    recorder = _LaunchRecorder(backward_module._bwd_dkdv_kernel)
    monkeypatch.setattr(backward_module, "_bwd_dkdv_kernel", recorder)
    rng = np.random.default_rng(d + dv + group)
    sigma = np.array([2.0, 9.0, 40.0, 3.0])[: 2 * group]
    partition, q, k, v, g = _case(
        rng, 1, 2 * group, 2, 37, 45, d, dv, 3, torch.float32, sigma, d + dv
    )
    qpos, kpos = np.arange(37) + 8, np.arange(45)
    _check_grads(
        q, k, v, g, partition, qpos, kpos, 0.3, causal, "float32", tiles=tiles
    )  # fmt: skip
    ((grid, kw),) = recorder.launches
    assert kw["BLOCK_N"] == 32 and kw["SPLIT_D"]
    assert grid == (2 * 2 * 2,)  # 2 key tiles of 32 (45 keys) x 2 kv heads x 2 halves
    assert kw["MANUAL_X3"] == (min(d, dv) > 32)


def test_row_strides_too_long_for_int32_tile_offsets_are_detected():
    """The dK/dV kernel addresses tiles with int32 offsets from a 64-bit base; a row
    stride with ``block * stride >= 2**31`` must send the tensor through ``.contiguous()``
    (meta tensors: strides without storage)."""
    fits = plsh_triton.rows_fit_int32
    x = torch.empty((1, 2, 8, 16), device="meta")
    assert fits(x, 64)
    wide = torch.empty_strided((1, 2, 8, 16), (0, 0, 2**27, 1), device="meta")
    assert fits(wide, 15) and not fits(wide, 16)
    assert fits(wide.contiguous(), 16)
