"""plsh_ref.alibi at its edges: Press et al.'s slopes from their definition, positions of
padded batches (pad slots, per-sequence positions, the mask's forms and refusals), and
the bias / kernel matrix entry by entry, with large positions and the causal edge
``p_key == p_query``.
"""

from __future__ import annotations

import numpy as np
import pytest

from plsh_ref import alibi


def _press_slopes(num_heads):
    """Press et al.'s reference code (``get_slopes``), in Python floats."""

    def power_of_two(n):
        start = 2 ** (-(2 ** -(np.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if np.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    c = 2 ** int(np.floor(np.log2(num_heads)))
    return power_of_two(c) + power_of_two(2 * c)[0::2][: num_heads - c]


@pytest.mark.parametrize("num_heads", [1, 2, 3, 5, 6, 7, 8, 12, 16, 24, 33])
def test_slopes_are_press_et_al(num_heads):
    np.testing.assert_allclose(
        alibi.alibi_slopes(num_heads), _press_slopes(num_heads), rtol=1e-13
    )  # their code accumulates start**i
    assert alibi.alibi_slopes(num_heads).shape == (num_heads,)


def test_slopes_exact_small_cases():
    assert alibi.alibi_slopes(1).tolist() == [2.0**-8]
    assert alibi.alibi_slopes(2).tolist() == [2.0**-4, 2.0**-8]
    assert alibi.alibi_slopes(3).tolist() == [2.0**-4, 2.0**-8, 2.0**-2]
    assert alibi.alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]
    with pytest.raises(ValueError, match=r"^num_heads: must be >= 1, got 0$"):
        alibi.alibi_slopes(0)


def test_sigma_from_slopes():
    np.testing.assert_array_equal(alibi.sigma_from_slopes([0.5, 0.25]), [2.0, 4.0])
    assert alibi.sigma_from_slopes(0.125) == 8.0
    with pytest.raises(ValueError, match=r"^slopes: every entry must be > 0"):
        alibi.sigma_from_slopes([0.5, 0.0])


def test_default_positions_exact():
    q, k = alibi.default_positions(3, 5)
    assert q.tolist() == [2, 3, 4] and k.tolist() == [0, 1, 2, 3, 4]
    assert q.dtype == k.dtype == np.int64
    q, k = alibi.default_positions(4, 2)
    assert q.tolist() == [-2, -1, 0, 1] and k.tolist() == [0, 1]
    q, k = alibi.default_positions(0, 0)
    assert q.shape == k.shape == (0,)
    with pytest.raises(ValueError, match=r"^n_q: must be >= 0, got -1$"):
        alibi.default_positions(-1, 2)
    with pytest.raises(ValueError, match=r"^n_k: must be >= 0, got -1$"):
        alibi.default_positions(2, -1)


def test_resolve_positions():
    q, k = alibi.resolve_positions(2, 3)
    assert q.tolist() == [1, 2] and k.tolist() == [0, 1, 2]
    q, k = alibi.resolve_positions(2, 3, [7, 9])
    assert q.tolist() == [7, 9] and k.tolist() == [0, 1, 2]
    q, k = alibi.resolve_positions(2, 3, None, [5.0, 6.0, 8.0])
    assert q.tolist() == [1, 2] and k.tolist() == [5, 6, 8] and k.dtype == np.int64
    with pytest.raises(ValueError, match=r"^query_positions: must have length 2, got 3$"):
        alibi.resolve_positions(2, 3, [1, 2, 3])
    with pytest.raises(ValueError, match=r"^key_positions: must have length 3, got 2$"):
        alibi.resolve_positions(2, 3, None, [1, 2])


class _FakeTensor:
    """A torch-like array (``detach().cpu().numpy()``), without importing torch."""

    def __init__(self, values):
        self.values = np.asarray(values)

    def detach(self):
        return self

    def cpu(self):
        return self

    def numpy(self):
        return self.values


def test_mask_forms():
    mask_int = np.array([[0, 1, 1], [1, 1, 1]])
    for mask in (mask_int, mask_int.astype(bool), mask_int.astype(np.uint8), _FakeTensor(mask_int)):
        q, k, q_keep, k_keep = alibi.resolve_batch_positions(2, 2, 3, attention_mask=mask)
        assert k_keep.tolist() == [[False, True, True], [True, True, True]]
        assert q_keep.tolist() == [[True, True], [True, True]]  # queries are the last tokens
        assert k_keep.dtype == q_keep.dtype == np.bool_
    given = np.array([[True, False]])
    _, _, _, k_keep = alibi.resolve_batch_positions(1, 1, 2, attention_mask=given)
    k_keep[0, 0] = False
    assert given[0, 0]  # the caller's mask is not aliased


def test_mask_refusals():
    with pytest.raises(
        ValueError, match=r"^attention_mask: must have shape \(batch, n_k\) = \(2, 3\), got \(3,\)$"
    ):
        alibi.resolve_batch_positions(2, 3, 3, attention_mask=[1, 1, 1])
    with pytest.raises(ValueError, match=r"^attention_mask: integer entries must be 0 \(pad\)"):
        alibi.resolve_batch_positions(1, 2, 2, attention_mask=[[1, 2]])
    with pytest.raises(ValueError, match=r"^attention_mask: integer entries must be 0 \(pad\)"):
        alibi.resolve_batch_positions(1, 2, 2, attention_mask=[[-1, 1]])
    with pytest.raises(
        TypeError, match=r"^attention_mask: must hold bool or integer 0/1, got dtype float64$"
    ):
        alibi.resolve_batch_positions(1, 2, 2, attention_mask=[[1.0, 1.0]])


def test_query_slots_follow_the_keys_they_are():
    mask = [[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]]
    q, k, q_keep, k_keep = alibi.resolve_batch_positions(2, 3, 5, attention_mask=mask)
    assert q_keep.tolist() == [[True, True, True], [True, True, False]]
    assert k.tolist() == [[0, 0, 2, 3, 4], [0, 1, 2, 3, 0]]  # 0 at pad slots
    assert q.tolist() == [[2, 3, 4], [2, 3, 0]]
    # n_q == n_k: every query slot is its key slot
    _, _, q_keep, _ = alibi.resolve_batch_positions(2, 5, 5, attention_mask=mask)
    assert q_keep.tolist() == np.asarray(mask, dtype=bool).tolist()
    # n_q > n_k: queries are not key tokens, none is a pad slot
    _, _, q_keep, _ = alibi.resolve_batch_positions(2, 6, 5, attention_mask=mask)
    assert q_keep.all() and q_keep.shape == (2, 6)


def test_pad_slots_may_hold_any_integer():
    mask = [[0, 1, 1]]
    huge = 2**62  # beyond 2**53: refused at a real slot, ignored at a pad slot
    q, k, _, _ = alibi.resolve_batch_positions(
        1, 1, 3, query_positions=[[5]], key_positions=[[huge, 3, 5]], attention_mask=mask
    )
    assert k.tolist() == [[0, 3, 5]] and q.tolist() == [[5]]
    with pytest.raises(ValueError, match=r"^key_positions: \|position\| must be < 2\*\*53"):
        alibi.resolve_batch_positions(1, 1, 3, key_positions=[[huge, 3, 5]])
    with pytest.raises(ValueError, match=r"^query_positions: \|position\| must be < 2\*\*53"):
        alibi.resolve_batch_positions(
            1, 1, 3, query_positions=[[huge]], key_positions=[[huge, 3, 5]], attention_mask=mask
        )


def test_per_sequence_and_shared_positions():
    q, k, q_keep, k_keep = alibi.resolve_batch_positions(
        2, 2, 3, query_positions=[1, 2], key_positions=_FakeTensor([[0, 1, 2], [10, 20, 30]])
    )
    assert q.tolist() == [[1, 2], [1, 2]] and q.dtype == np.int64
    assert k.tolist() == [[0, 1, 2], [10, 20, 30]] and k.dtype == np.int64
    assert q_keep.all() and k_keep.all() and q_keep.shape == (2, 2) and k_keep.shape == (2, 3)
    q, k, _, _ = alibi.resolve_batch_positions(3, 1, 2)
    assert q.tolist() == [[1]] * 3 and k.tolist() == [[0, 1]] * 3
    q, k, q_keep, k_keep = alibi.resolve_batch_positions(0, 2, 3)
    assert q.shape == (0, 2) and k.shape == (0, 3) and q.dtype == k.dtype == np.int64
    # float positions stay exact integers
    _, k, _, _ = alibi.resolve_batch_positions(1, 1, 2, key_positions=[[4.0, 6.0]])
    assert k.tolist() == [[4, 6]]


def test_batch_position_refusals():
    with pytest.raises(
        ValueError,
        match=r"^key_positions: must have shape \(3,\) or \(batch, 3\) = \(2, 3\), got \(1, 3\)$",
    ):
        alibi.resolve_batch_positions(2, 2, 3, key_positions=[[0, 1, 2]])
    with pytest.raises(
        ValueError, match=r"^query_positions: must have shape \(2,\) or \(batch, 2\)"
    ):
        alibi.resolve_batch_positions(1, 2, 3, query_positions=np.zeros((1, 1, 2), dtype=int))
    with pytest.raises(ValueError, match=r"^batch: must be >= 0, got -1$"):
        alibi.resolve_batch_positions(-1, 2, 3)
    with pytest.raises(ValueError, match=r"^n_q: must be >= 0, got -1$"):
        alibi.resolve_batch_positions(1, -1, 3)
    with pytest.raises(ValueError, match=r"^n_k: must be >= 0, got -2$"):
        alibi.resolve_batch_positions(1, 2, -2)
    with pytest.raises(TypeError, match=r"^key_positions: positions must be integers"):
        alibi.resolve_batch_positions(1, 1, 2, key_positions=[[0.5, 1.0]], attention_mask=[[1, 1]])


def test_causal_mask_edge_is_admissible():
    mask = alibi.causal_mask([3, 5], [2, 3, 4, 5, 6])
    assert mask.tolist() == [
        [True, True, False, False, False],
        [True, True, True, True, False],
    ]


def test_bias_entries():
    slopes = np.array([0.5, 0.25])
    q = np.array([2**52, 2**52 + 3])  # large positions: the int64 difference is exact
    k = np.array([2**52 + 1, 2**52 - 2, 2**52 + 3])
    dist = np.array([[1.0, 2.0, 3.0], [2.0, 5.0, 0.0]])
    bias = alibi.alibi_bias(slopes, q, k, causal=False)
    np.testing.assert_array_equal(bias, -slopes[:, None, None] * dist[None])
    causal = alibi.alibi_bias(slopes, q, k, causal=True)
    admissible = np.array([[False, True, False], [True, True, True]])
    np.testing.assert_array_equal(causal, np.where(admissible, bias, -np.inf))
    assert causal.dtype == np.float64 and causal.shape == (2, 2, 3)
    with pytest.raises(ValueError, match=r"^slopes: must be one-dimensional, got shape \(1, 2\)$"):
        alibi.alibi_bias([[0.5, 0.25]], q, k, causal=True)
    with pytest.raises(TypeError, match=r"^causal: must be a bool"):
        alibi.alibi_bias(slopes, q, k, causal=1)


def test_kernel_matrix_entries():
    q = np.array([10, 13])
    k = np.array([11, 8, 13])
    dist = np.array([[1.0, 2.0, 3.0], [2.0, 5.0, 0.0]])
    out = alibi.kernel_matrix(2.0, q, k)
    np.testing.assert_array_equal(out, np.exp(-dist / 2.0))
    assert out.shape == (2, 3)
    heads = alibi.kernel_matrix([2.0, 4.0], q, k, causal=True)
    admissible = np.array([[False, True, False], [True, True, True]])
    np.testing.assert_array_equal(heads[1], np.where(admissible, np.exp(-dist / 4.0), 0.0))
    np.testing.assert_array_equal(heads[0], np.where(admissible, np.exp(-dist / 2.0), 0.0))
    assert heads.shape == (2, 2, 3)
    with pytest.raises(ValueError, match=r"^sigma: every entry must be > 0"):
        alibi.kernel_matrix(0.0, q, k)
    with pytest.raises(TypeError, match=r"^causal: must be a bool"):
        alibi.kernel_matrix(1.0, q, k, causal=None)


@pytest.mark.parametrize("mask", [None, [[1, 1, 1]]])
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(key_positions=[0, 1, 2, 3]), r"^key_positions: must have length 3, got 4$"),
        (dict(query_positions=[1, 2, 3]), r"^query_positions: must have length 2, got 3$"),
        (dict(query_positions=[[1, 2, 3]]), r"^query_positions: must have length 2, got 3$"),
        (dict(key_positions=[[0, 1]]), r"^key_positions: must have length 3, got 2$"),
    ],
)
def test_wrong_length_positions_name_the_argument(kwargs, message, mask):
    # integer positions of the wrong length once failed in numpy's broadcasting (zeroing
    # pad slots) with "operands could not be broadcast", naming no argument
    with pytest.raises(ValueError, match=message):
        alibi.resolve_batch_positions(1, 2, 3, attention_mask=mask, **kwargs)


def test_keep_masks_are_bool_without_a_mask():
    _, _, q_keep, k_keep = alibi.resolve_batch_positions(2, 2, 3)
    assert q_keep.dtype == k_keep.dtype == np.bool_
    assert q_keep.shape == (2, 2) and k_keep.shape == (2, 3)


class _HalfTensorLike(np.ndarray):
    """An array with a ``detach`` attribute but no ``cpu``: not a torch tensor."""

    detach = "not a method"


def test_only_torch_like_objects_are_detached():
    mask = np.array([[0, 1, 1]]).view(_HalfTensorLike)
    pos = np.array([[4, 5, 6]]).view(_HalfTensorLike)
    q, k, _, k_keep = alibi.resolve_batch_positions(1, 1, 3, key_positions=pos, attention_mask=mask)
    assert k_keep.tolist() == [[False, True, True]] and k.tolist() == [[0, 5, 6]]


def test_non_integral_positions_are_refused_at_pad_slots_too():
    # pad slots may hold any integer; a float that is not integral is still refused
    with pytest.raises(TypeError, match=r"^key_positions: positions must be integers"):
        alibi.resolve_batch_positions(1, 1, 2, key_positions=[[0.5, 1.0]], attention_mask=[[0, 1]])
    _, k, _, _ = alibi.resolve_batch_positions(
        1, 1, 2, key_positions=[[7.0, 1.0]], attention_mask=[[0, 1]]
    )
    assert k.tolist() == [[0, 1]]


def test_refusals_name_the_argument():
    with pytest.raises(TypeError, match=r"^query_positions: positions must be integers"):
        alibi.causal_mask([0.5], [0])
    with pytest.raises(TypeError, match=r"^key_positions: positions must be integers"):
        alibi.causal_mask([0], [0.5])
    with pytest.raises(TypeError, match=r"^query_positions: positions must be integers"):
        alibi.alibi_bias([1.0], [0.5], [0], causal=False)
    with pytest.raises(TypeError, match=r"^key_positions: positions must be integers"):
        alibi.alibi_bias([1.0], [0], [0.5], causal=False)
    with pytest.raises(ValueError, match=r"^slopes: every entry must be > 0"):
        alibi.alibi_bias([0.0], [0], [0], causal=False)
    with pytest.raises(TypeError, match=r"^query_positions: positions must be integers"):
        alibi.kernel_matrix(1.0, [0.5], [0])
    with pytest.raises(TypeError, match=r"^key_positions: positions must be integers"):
        alibi.kernel_matrix(1.0, [0], [0.5])


def test_max_bias_is_bounded_where_sigma_stays_finite():
    """``max_bias = 1e308`` overflowed (a RuntimeWarning) and gave slopes 0; the bound is
    ``MAX_BIAS = 1024`` (the smallest slope ``2**-max_bias`` keeps ``sigma = 2**max_bias``
    finite), refused by name at and above it, accepted just below with positive slopes."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        below = alibi.alibi_slopes(4, max_bias=1023.5)
        assert np.all(below > 0) and below[-1] == 2.0**-1023.5
        assert np.all(np.isfinite(alibi.sigma_from_slopes(below)))
        for bad in (alibi.MAX_BIAS, 1e308):
            with pytest.raises(ValueError, match=r"^max_bias: must be > 0 and < 1024"):
                alibi.alibi_slopes(4, max_bias=bad)


def test_kernel_matrix_at_a_subnormal_sigma_is_the_identity_without_warnings():
    """``dist / sigma`` overflows to inf at ``sigma = 1e-320`` (it warned): ``L* = I``."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = alibi.kernel_matrix(1e-320, np.arange(4), np.arange(4), causal=False)
    assert np.array_equal(got, np.eye(4))


def test_num_heads_is_bounded_before_any_allocation():
    """``alibi_slopes(10**9)`` allocated until the process was killed; the bound is refused
    by name, and the bound itself is accepted (the slopes of the largest head count are the
    rule's: the last power-of-two rule slope is ``2**-max_bias``)."""
    with pytest.raises(ValueError, match=r"^num_heads: must be <= 1048576, got 1048577$"):
        alibi.alibi_slopes(alibi.MAX_HEADS + 1)
    with pytest.raises(ValueError, match=r"^num_heads: "):
        alibi.alibi_slopes(10**9)
    top = alibi.alibi_slopes(alibi.MAX_HEADS)
    assert top.shape == (alibi.MAX_HEADS,) and top[-1] == 2.0**-8


def test_max_bias_is_checked_and_used_for_every_head_count():
    """``max_bias``: refused by type and range with its exact messages (``0`` too, but
    ``0.5`` accepted: the bound is ``> 0``), and used by both parts of the rule (a head
    count that is not a power of two takes its extra slopes from ``2c`` heads at the same
    ``max_bias``)."""
    with pytest.raises(TypeError, match=r"^max_bias: must be a real number, got str$"):
        alibi.alibi_slopes(4, max_bias="8")
    with pytest.raises(TypeError, match=r"^max_bias: must be a real number, got bool$"):
        alibi.alibi_slopes(4, max_bias=True)
    with pytest.raises(ValueError, match=r"^max_bias: must be > 0 and < 1024 .*got 0\.0$"):
        alibi.alibi_slopes(4, max_bias=0.0)
    assert alibi.alibi_slopes(2, max_bias=0.5).tolist() == [2.0**-0.25, 2.0**-0.5]
    # 6 heads: the 4-head slopes, then slopes(8)[0::2][:2], all at max_bias 16
    want = [2.0**-4, 2.0**-8, 2.0**-12, 2.0**-16, 2.0**-2, 2.0**-6]
    assert alibi.alibi_slopes(6, max_bias=16).tolist() == want
