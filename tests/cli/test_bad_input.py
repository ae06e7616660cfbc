"""Bad input is refused with ValueError/TypeError naming the argument.

Every message must start with the argument's name followed by a colon
(CONTRIBUTING.md), so each case below checks the exception type and that prefix.
"""

import numpy as np
import pytest
from _oracles import random_qkv

from plsh_ref.alibi import (
    alibi_bias,
    alibi_slopes,
    default_positions,
    kernel_matrix,
    sigma_from_slopes,
)
from plsh_ref.attention import (
    alibi_attention,
    biased_attention,
    fixed_block_attention,
    no_bias_attention,
    plsh_attention,
)
from plsh_ref.mp_attention import alibi_attention_mp, plsh_attention_mp, weighted_attention_mp
from plsh_ref.partition import (
    PartitionSample,
    bins,
    blocks,
    counts,
    draw_partition,
    empirical_mean,
    masks,
)

Q, K, V = random_qkv(0, 1, 2, 2, 3, 3, 2, 2)
PART = draw_partition([2.0, 4.0], 3, seed=0)


def _with(arr, index, value):
    out = np.array(arr, dtype=np.float64)
    out[index] = value
    return out


def _expect(exc, name, fn, *args, **kwargs):
    with pytest.raises(exc, match=rf"^{name}:"):
        fn(*args, **kwargs)


# ---------------------------------------------------------------------------------------
# Partition sampling and hashing.


@pytest.mark.parametrize(
    "exc,name,kwargs",
    [
        (ValueError, "sigma", dict(sigma=[-1.0, 2.0], num_samples=2)),
        (ValueError, "sigma", dict(sigma=[0.0], num_samples=2)),
        (ValueError, "sigma", dict(sigma=[np.nan], num_samples=2)),
        (ValueError, "sigma", dict(sigma=[np.inf], num_samples=2)),
        (ValueError, "sigma", dict(sigma=4.0, num_samples=2)),  # needs (num_heads,)
        (TypeError, "sigma", dict(sigma=["a"], num_samples=2)),
        (ValueError, "num_samples", dict(sigma=[1.0], num_samples=0)),
        (ValueError, "num_samples", dict(sigma=[1.0], num_samples=-3)),
        (TypeError, "num_samples", dict(sigma=[1.0], num_samples=2.5)),
        (TypeError, "num_samples", dict(sigma=[1.0], num_samples=True)),
        (ValueError, "seed", dict(sigma=[1.0], num_samples=2, seed=-1)),
        (TypeError, "seed", dict(sigma=[1.0], num_samples=2, seed=1.5)),
        (ValueError, "head_start", dict(sigma=[1.0], num_samples=2, head_start=-1)),
    ],
)
def test_draw_partition_refuses(exc, name, kwargs):
    _expect(exc, name, draw_partition, **kwargs)


@pytest.mark.parametrize(
    "exc,name,pitch,offset",
    [
        (ValueError, "pitch", [1.0, 2.0], [0.0, 0.0]),  # not 2-D
        (ValueError, "offset", [[1.0, 2.0]], [[0.0]]),  # shapes differ
        (ValueError, "pitch", [[1.0, 0.0]], [[0.0, 0.0]]),  # pitch <= 0
        (ValueError, "pitch", [[1.0, -2.0]], [[0.0, 0.0]]),
        (ValueError, "pitch", [[np.inf]], [[0.0]]),
        (ValueError, "offset", [[1.0]], [[np.nan]]),
        (ValueError, "pitch", np.ones((2, 0)), np.ones((2, 0))),  # s = 0
        (TypeError, "pitch", [["a"]], [[0.0]]),
    ],
)
def test_partition_sample_refuses(exc, name, pitch, offset):
    _expect(exc, name, PartitionSample, pitch, offset)


def test_partition_slicing_refuses():
    _expect(ValueError, "stop", PART.heads, 0, 3)
    _expect(ValueError, "stop", PART.heads, 1, 1)
    _expect(ValueError, "start", PART.heads, -1)
    _expect(ValueError, "stop", PART.samples, 0, 99)
    _expect(TypeError, "start", PART.samples, 0.5)


def test_partition_load_refuses_foreign_file(tmp_path):
    path = tmp_path / "other.npz"
    np.savez(path, pitch=np.ones((1, 1)))
    _expect(ValueError, "path", PartitionSample.load, path)


@pytest.mark.parametrize(
    "exc,name,positions",
    [
        (TypeError, "positions", [0.5, 1.0]),  # non-integer positions
        (ValueError, "positions", [[0, 1]]),  # not 1-D
        (ValueError, "positions", [0.0, np.nan]),
        (ValueError, "positions", [2**53]),  # float64(p) must be exact
        (TypeError, "positions", ["a"]),
        (TypeError, "positions", [True, False]),
    ],
)
def test_bins_refuse_bad_positions(exc, name, positions):
    _expect(exc, name, bins, PART, positions)


@pytest.mark.parametrize("fn", [masks, counts, empirical_mean])
def test_masks_and_counts_name_the_bad_positions(fn):
    _expect(TypeError, "query_positions", fn, PART, [0.5], [1])
    _expect(TypeError, "key_positions", fn, PART, [1], [1.5])
    _expect(ValueError, "key_positions", fn, PART, [1], [[1]])
    _expect(TypeError, "partition", fn, "not a sample", [1], [1])


def test_bins_refuse_int64_overflow():
    """A pitch far below the distances makes floor((p - u) / delta) leave int64; the cast
    used to wrap every such position to the same bin (all keys colliding, M~ = 1 where
    L* = 0). Refused now; the largest representable bins still work."""
    tiny = PartitionSample([[5e-324]], [[0.0]])
    _expect(ValueError, "partition", bins, tiny, [1])
    _expect(
        ValueError, "partition", counts, draw_partition([1e-12], 3, seed=0), [10**8], [10**8 + 1]
    )
    _expect(
        ValueError,
        "partition",
        _ref_plsh,
        Q[:, :1],
        K[:, :1],
        V[:, :1],
        PartitionSample([[1e-300]], [[0.0]]),
    )
    edge = PartitionSample([[1.0, 1.0]], [[-(2.0**62), 2.0**62]])
    assert bins(edge, [2**52]).tolist() == [[[2**62 + 2**52], [2**52 - 2**62]]]


def test_blocks_refuse_out_of_range():
    _expect(ValueError, "head", blocks, PART, [0, 1], 2, 0)
    _expect(ValueError, "sample", blocks, PART, [0, 1], 0, 3)
    _expect(TypeError, "partition", bins, (PART.pitch, PART.offset), [0])


# ---------------------------------------------------------------------------------------
# ALiBi helpers.


def test_alibi_helpers_refuse():
    _expect(ValueError, "num_heads", alibi_slopes, 0)
    _expect(TypeError, "num_heads", alibi_slopes, 2.0)
    _expect(ValueError, "slopes", sigma_from_slopes, [0.5, 0.0])
    _expect(ValueError, "slopes", alibi_bias, [[0.5]], [0], [0], causal=True)
    _expect(ValueError, "slopes", alibi_bias, [-0.5], [0], [0], causal=True)
    _expect(ValueError, "sigma", kernel_matrix, 0.0, [0], [0])
    _expect(ValueError, "sigma", kernel_matrix, -2.0, [0], [0])
    _expect(TypeError, "query_positions", kernel_matrix, 1.0, [0.5], [0])
    _expect(ValueError, "n_q", default_positions, -1, 2)
    _expect(ValueError, "n_k", default_positions, 1, -2)


# ---------------------------------------------------------------------------------------
# Attention: every entry point refuses the same bad inputs.


def _entry_points():
    return {
        "alibi": lambda q, k, v, **kw: alibi_attention(q, k, v, **kw, return_lse=True),
        "plsh_counts": lambda q, k, v, **kw: plsh_attention(
            q, k, v, partition=PART, return_lse=True, **kw
        ),
        "plsh_reduction": lambda q, k, v, **kw: plsh_attention(
            q, k, v, partition=PART, method="reduction", return_lse=True, **kw
        ),
        "no_bias": lambda q, k, v, **kw: no_bias_attention(q, k, v, **kw, return_lse=True),
        "fixed_block": lambda q, k, v, **kw: fixed_block_attention(
            q, k, v, 2, **kw, return_lse=True
        ),
        "alibi_mp": lambda q, k, v, **kw: alibi_attention_mp(q, k, v, return_lse=True, **kw),
        "plsh_mp": lambda q, k, v, **kw: plsh_attention_mp(
            q, k, v, partition=PART, return_lse=True, **kw
        ),
    }


BAD_QKV = [
    # (exception, argument, query, key, value)
    (ValueError, "query", _with(Q, (0, 0, 0, 0), np.nan), K, V),
    (ValueError, "key", Q, _with(K, (0, 1, 2, 1), np.inf), V),
    (ValueError, "value", Q, K, _with(V, (0, 0, 1, 0), -np.inf)),
    (ValueError, "query", Q[0], K, V),  # rank 3
    (ValueError, "key", Q, K[..., :1], V),  # head_dim differs
    (ValueError, "value", Q, K, V[:, :, :2]),  # n_k differs
    (ValueError, "value", Q, K, np.concatenate([V, V])),  # batch differs
    (ValueError, "key", Q, np.concatenate([K, K]), np.concatenate([V, V])),
    (
        ValueError,
        "key",
        np.concatenate([Q, Q], axis=1),
        K[:, :1].repeat(3, axis=1),
        V[:, :1].repeat(3, axis=1),
    ),  # 3 kv heads, 4 heads
    (TypeError, "query", Q.astype(np.complex128), K, V),
    (TypeError, "value", Q, K, V.astype(str)),
]


@pytest.mark.parametrize("entry", list(_entry_points()))
@pytest.mark.parametrize("case", range(len(BAD_QKV)))
def test_attention_refuses_bad_qkv(entry, case):
    exc, name, q, k, v = BAD_QKV[case]
    _expect(exc, name, _entry_points()[entry], q, k, v)


BAD_KWARGS = [
    (TypeError, "query_positions", dict(query_positions=[0.5, 1.0, 2.0])),
    # (batch, n) positions are per-sequence (SPEC section 5); batch 2 != 1 is refused
    (ValueError, "query_positions", dict(query_positions=[[0, 1, 2], [0, 1, 2]])),
    (ValueError, "query_positions", dict(query_positions=[[[0, 1, 2]]])),
    (ValueError, "key_positions", dict(key_positions=[0, 1])),  # wrong length
    (ValueError, "key_positions", dict(key_positions=[0, 1, np.nan])),
    (ValueError, "scale", dict(scale=0.0)),
    (ValueError, "scale", dict(scale=-1.0)),
    (ValueError, "scale", dict(scale=np.nan)),
    (TypeError, "scale", dict(scale="1")),
]


@pytest.mark.parametrize("entry", list(_entry_points()))
@pytest.mark.parametrize("exc,name,kwargs", BAD_KWARGS)
def test_attention_refuses_bad_positions_and_scale(entry, exc, name, kwargs):
    _expect(exc, name, _entry_points()[entry], Q, K, V, **kwargs)


@pytest.mark.parametrize("fn", [alibi_attention, alibi_attention_mp])
def test_alibi_attention_refuses_bad_slopes(fn):
    _expect(ValueError, "slopes", fn, Q, K, V, slopes=[0.5])  # one per head
    _expect(ValueError, "slopes", fn, Q, K, V, slopes=[0.5, 0.0])
    _expect(ValueError, "slopes", fn, Q, K, V, slopes=[0.5, np.inf])


def _ref_plsh(q, k, v, partition, **kw):
    return plsh_attention(q, k, v, partition=partition, return_lse=True, **kw)


def _ref_plsh_mp(q, k, v, partition, **kw):
    return plsh_attention_mp(q, k, v, partition=partition, return_lse=True, **kw)


@pytest.mark.parametrize("fn", [_ref_plsh, _ref_plsh_mp])
def test_plsh_attention_refuses_bad_partition(fn):
    _expect(ValueError, "partition", fn, Q, K, V, PART.heads(0, 1))  # 1 head, query 2
    _expect(ValueError, "partition", fn, Q, K, V, draw_partition([1.0, 2.0, 3.0], 2, seed=0))
    _expect(TypeError, "partition", fn, Q, K, V, (PART.pitch, PART.offset))


def test_plsh_attention_refuses_bad_method():
    _expect(ValueError, "method", _ref_plsh, Q, K, V, PART, method="fast")
    _expect(ValueError, "method", _ref_plsh, Q, K, V, PART, method=None)
    with pytest.warns(DeprecationWarning, match="method="):
        _expect(ValueError, "method", _ref_plsh, Q, K, V, PART, backend="fast")
    _expect(TypeError, "partition", plsh_attention, Q, K, V)


def test_fixed_block_refuses_bad_block_size():
    _expect(ValueError, "block_size", fixed_block_attention, Q, K, V, 0)
    _expect(TypeError, "block_size", fixed_block_attention, Q, K, V, 2.5)
    _expect(ValueError, "block_size", fixed_block_attention, Q, K, V, [2, 3, 4])
    _expect(ValueError, "block_size", fixed_block_attention, Q, K, V, [2, 0])


def test_biased_attention_refuses_bad_bias():
    good = np.zeros((2, 3, 3))
    _expect(ValueError, "bias", biased_attention, Q, K, V, bias=_with(good, (0, 0, 0), np.nan))
    _expect(ValueError, "bias", biased_attention, Q, K, V, bias=_with(good, (0, 0, 0), np.inf))
    _expect(ValueError, "bias", biased_attention, Q, K, V, bias=np.zeros((2, 3, 2)))
    _expect(ValueError, "bias", biased_attention, Q, K, V, bias=np.zeros((3, 2, 3, 3)))
    _expect(ValueError, "bias", biased_attention, Q, K, V, bias=np.zeros(3))
    # -inf is how a pair is masked: accepted
    biased_attention(Q, K, V, bias=_with(good, (0, 0, 0), -np.inf), return_lse=True)


@pytest.mark.parametrize(
    "entry", ["alibi", "plsh_counts", "plsh_reduction", "no_bias", "fixed_block"]
)
def test_overflowing_logits_are_refused_not_returned_as_empty_rows(entry):
    """Finite inputs whose logits overflow binary64 used to give output 0 and lse -inf
    (as if the row were empty) or NaN. They are refused now; the mpmath reference, whose
    exponent range is unbounded, still computes them."""
    big = np.full((1, 2, 3, 2), 1e200)
    _expect(ValueError, "query", _entry_points()[entry], big, big, V)
    mixed = big.copy()
    mixed[..., 1] = -1e200  # q.k = inf - inf = NaN
    _expect(ValueError, "query", _entry_points()[entry], big, mixed, V)
    ones = np.ones((1, 2, 3, 2))
    _expect(ValueError, "query", _entry_points()[entry], ones, ones, V, scale=1e308)


@pytest.mark.parametrize("fn", [alibi_attention_mp, plsh_attention_mp])
def test_mp_attention_refuses_bad_dps(fn):
    kw = (
        {"return_lse": True}
        if fn is alibi_attention_mp
        else {"partition": PART, "return_lse": True}
    )
    _expect(ValueError, "dps", fn, Q, K, V, dps=10, **kw)
    _expect(TypeError, "dps", fn, Q, K, V, dps=30.0, **kw)


def test_weighted_attention_mp_refuses_bad_weight():
    _expect(ValueError, "weight", weighted_attention_mp, Q, K, V, np.ones((2, 3, 2)))
    _expect(ValueError, "weight", weighted_attention_mp, Q, K, V, -np.ones((2, 3, 3)))
    _expect(
        ValueError,
        "weight",
        weighted_attention_mp,
        Q,
        K,
        V,
        _with(np.ones((2, 3, 3)), (0, 0, 0), np.nan),
    )


@pytest.mark.parametrize("flag", ["no", 0, 1, None, 1.0])
def test_causal_must_be_bool(flag):
    """A non-bool `causal` (e.g. the string "no", truthy) was silently coerced before."""
    import plsh_ref
    from plsh_ref.mp_attention import alibi_attention_mp

    rng = np.random.default_rng(0)
    q = rng.normal(size=(1, 2, 3, 4))
    part = plsh_ref.draw_partition([2.0, 4.0], 2, seed=0)
    pos = np.arange(3)
    calls = [
        lambda: plsh_ref.alibi_attention(q, q, q, causal=flag, return_lse=True),
        lambda: plsh_ref.plsh_attention(q, q, q, partition=part, causal=flag, return_lse=True),
        lambda: plsh_ref.no_bias_attention(q, q, q, causal=flag, return_lse=True),
        lambda: plsh_ref.fixed_block_attention(q, q, q, 2, causal=flag, return_lse=True),
        lambda: plsh_ref.kernel_matrix(2.0, pos, pos, causal=flag),
        lambda: plsh_ref.alibi_bias([0.5, 0.25], pos, pos, causal=flag),
        lambda: plsh_ref.counts(part, pos, pos, causal=flag),
        lambda: plsh_ref.masks(part, pos, pos, causal=flag),
        lambda: alibi_attention_mp(q, q, q, causal=flag, return_lse=True),
    ]
    for call in calls:
        with pytest.raises(TypeError, match="^causal"):
            call()


@pytest.mark.parametrize("slope,base", [(1e12, 2**39), (1e300, 0)])
def test_fast_path_refuses_bins_outside_int64_like_the_reference(slope, base):
    """Regression: the fast path returned garbage where plsh_ref.partition.bins refuses.
    The partition is drawn from ``slopes``, so the error names them (it named
    ``partition``, which the caller never passed)."""
    torch = pytest.importorskip("torch")
    from plsh_fast import plsh_attention

    q = k = v = torch.randn(1, 1, 16, 4)
    pos = torch.arange(16) + base
    with pytest.raises(ValueError, match="^slopes: the partition drawn from them has a bin index"):
        plsh_attention(
            q, k, v, slopes=[slope], num_samples=4, seed=0, query_positions=pos, key_positions=pos
        )


def test_negative_slope_message_shows_a_plain_number():
    # numpy 2 printed "got min np.float64(-1.0)"
    with pytest.raises(ValueError, match=r"^slopes: every entry must be > 0, got min -1\.0$"):
        alibi_attention(Q, K, V, slopes=[0.5, -1.0], return_lse=True)
