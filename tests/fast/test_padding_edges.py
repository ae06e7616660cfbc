"""The padded-batch helpers of the fast path at their edges (``plsh_fast/_padding.py``).

Complements ``tests/fast/test_padding_fast.py`` (padded batches end to end through the
kernels) with the helpers themselves: each refusal names its argument and fires exactly at
its threshold (``|p| < 2**53``, mask entries 0/1), ``(1, n)`` positions count as shared,
the omitted positions are the defaults, pad slots are the end-aligned ones, and a batch
splits into exactly one group per distinct signature (real positions *and* mask), also
when sequences pad differently in the same slots, with each group's indices and positions
those of its own sequences. Deterministic: no random draws.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plsh_fast import _padding as padding

CPU = torch.device("cpu")
LIMIT = padding.MAX_ABS_POSITION


# ------------------------------------------------------------------- host positions


@pytest.mark.parametrize(
    "value, error, match",
    [
        ([True, False], TypeError, r"^query_positions: must hold integers, got dtype bool$"),
        ([0.0, np.nan], ValueError, r"^query_positions: contains NaN or infinite values$"),
        ([0.0, np.inf], ValueError, r"^query_positions: contains NaN or infinite values$"),
        (
            [0.0, 1.5],
            TypeError,
            r"^query_positions: positions must be integers, got non-integral values$",
        ),
        ([0.0, 2.0**53], ValueError, r"^query_positions: \|position\| must be < 2\*\*53"),
        ([0.0, -(2.0**53)], ValueError, r"^query_positions: \|position\| must be < 2\*\*53"),
        (["a", "b"], TypeError, r"^query_positions: must hold integers, got dtype <U1$"),
        ([1 + 1j, 2], TypeError, r"^query_positions: must hold integers, got dtype complex128$"),
    ],
)
def test_array_like_positions_are_refused_naming_the_argument(value, error, match):
    with pytest.raises(error, match=match):
        padding.check_positions("query_positions", value, 1, 2, CPU)


def test_array_like_positions_become_int64_with_their_values():
    for value in ([3, -1], np.array([3, -1], dtype=np.int16), [3.0, -1.0]):
        got = padding.check_positions("key_positions", value, 1, 2, CPU)
        assert got.dtype == torch.int64 and got.tolist() == [3, -1]
    # the largest admissible magnitude, as an integral float: kept exactly
    edge = padding.check_positions("key_positions", [2.0**53 - 1, -(2.0**53 - 1)], 1, 2, CPU)
    assert edge.tolist() == [2**53 - 1, -(2**53 - 1)]
    for dtype in (np.float32, np.float64):  # every floating dtype, not float64 only
        got = padding.check_positions("key_positions", np.array([3, -1], dtype=dtype), 1, 2, CPU)
        assert got.dtype == torch.int64 and got.tolist() == [3, -1], dtype
    empty = padding.check_positions("key_positions", np.zeros(0), 1, 0, CPU)
    assert empty.dtype == torch.int64 and empty.shape == (0,)
    # a non-contiguous integer array-like is copied into a contiguous tensor
    strided = np.arange(8)[::2]
    got = padding.check_positions("key_positions", strided, 1, 4, CPU)
    assert got.tolist() == [0, 2, 4, 6] and got.is_contiguous()


# ------------------------------------------------------------------- check_positions


def test_positions_shapes_and_the_shared_row():
    assert padding.check_positions("query_positions", None, 2, 3, CPU) is None
    shared = padding.check_positions("query_positions", torch.tensor([[4, 5, 6]]), 2, 3, CPU)
    assert shared.shape == (3,) and shared.tolist() == [4, 5, 6]  # (1, n) counts as shared
    per = padding.check_positions("query_positions", torch.tensor([[1, 2], [3, 4]]), 2, 2, CPU)
    assert per.shape == (2, 2) and per.tolist() == [[1, 2], [3, 4]]
    narrow = padding.check_positions(
        "query_positions", torch.arange(3, dtype=torch.int8), 1, 3, CPU
    )
    assert narrow.dtype == torch.int64 and narrow.tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    "positions, batch, error, match",
    [
        (torch.arange(4), 2, ValueError, r"^key_positions: must have length 3, got 4$"),
        (
            torch.zeros(3, 3, dtype=torch.int64),
            2,
            ValueError,
            r"^key_positions: per-sequence positions must have shape \(batch, 3\) = \(2, 3\), "
            r"got \(3, 3\)$",
        ),
        (
            torch.zeros(2, 4, dtype=torch.int64),
            2,
            ValueError,
            r"^key_positions: per-sequence positions must have shape",
        ),
        (
            torch.zeros(1, 2, 3, dtype=torch.int64),
            2,
            ValueError,
            r"^key_positions: must have shape \(3,\) or \(batch, 3\), got \(1, 2, 3\)$",
        ),
        (
            torch.zeros((), dtype=torch.int64),
            2,
            ValueError,
            r"^key_positions: must have shape \(3,\) or \(batch, 3\), got \(\)$",
        ),
        (torch.zeros(3, dtype=torch.bool), 2, TypeError, r"^key_positions: must be an integer"),
        (torch.zeros(3), 2, TypeError, r"^key_positions: must be an integer tensor, got dtype"),
        (torch.zeros(3, dtype=torch.complex64), 2, TypeError, r"^key_positions: must be an"),
        (
            torch.zeros(3, dtype=torch.int64, device="meta"),
            2,
            ValueError,
            r"^key_positions: a meta tensor has no values; pass positions on cpu$",
        ),
    ],
)
def test_bad_position_tensors_are_refused(positions, batch, error, match):
    with pytest.raises(error, match=match):
        padding.check_positions("key_positions", positions, batch, 3, CPU)


# ------------------------------------------------------------------- the mask


def test_mask_dtypes_shapes_and_array_likes():
    assert padding.check_attention_mask(None, 2, 3, CPU) is None
    for mask in ([[1, 0, 1], [1, 1, 1]], [[True, False, True], [True, True, True]]):
        got = padding.check_attention_mask(mask, 2, 3, CPU)
        assert isinstance(got, torch.Tensor) and got.shape == (2, 3)
        assert (got != 0).tolist() == [[True, False, True], [True, True, True]]
    ints = torch.tensor([[0, 1, 1]], dtype=torch.int32)
    assert padding.check_attention_mask(ints, 1, 3, CPU).dtype == torch.int32  # read later
    strided = np.ones((2, 6), dtype=np.int64)[:, ::2]
    assert padding.check_attention_mask(strided, 2, 3, CPU).tolist() == [[1, 1, 1]] * 2


@pytest.mark.parametrize(
    "mask, error, match",
    [
        (
            [[1.0, 0.0, 1.0]],
            TypeError,
            r"^attention_mask: must hold bool or integer 0/1, got dtype float64$",
        ),
        ([["a", "b", "c"]], TypeError, r"^attention_mask: must hold bool or integer 0/1"),
        (
            torch.ones(1, 3),
            TypeError,
            r"^attention_mask: must hold bool or integer 0/1, got dtype torch.float32$",
        ),
        (torch.ones(1, 3, dtype=torch.complex64), TypeError, r"^attention_mask: must hold"),
        (
            torch.ones(1, 4, dtype=torch.bool),
            ValueError,
            r"^attention_mask: must have shape \(batch, n_k\) = \(1, 3\), got \(1, 4\)$",
        ),
        (torch.ones(3, dtype=torch.bool), ValueError, r"^attention_mask: must have shape"),
        (
            torch.ones(1, 3, dtype=torch.bool, device="meta"),
            ValueError,
            r"^attention_mask: a meta tensor has no values; pass it on cpu$",
        ),
    ],
)
def test_bad_masks_are_refused(mask, error, match):
    with pytest.raises(error, match=match):
        padding.check_attention_mask(mask, 1, 3, CPU)


# ------------------------------------------------------------------- defaults


@pytest.mark.parametrize("n_q, n_k", [(3, 5), (5, 5), (5, 3), (0, 4), (2, 0), (1, 1)])
def test_default_positions_end_align_the_queries(n_q, n_k):
    qpos, kpos = padding.default_positions(n_q, n_k)
    assert qpos.dtype == kpos.dtype == torch.int64
    assert kpos.tolist() == list(range(n_k))
    assert qpos.tolist() == [n_k - n_q + i for i in range(n_q)]  # SPEC section 1
    meta_q, meta_k = padding.default_positions(n_q, n_k, device=torch.device("meta"))
    assert meta_q.device.type == meta_k.device.type == "meta"  # on the device asked for
    assert meta_q.shape == (n_q,) and meta_k.shape == (n_k,)
    assert meta_q.dtype == meta_k.dtype == torch.int64


def test_resolve_positions_fills_only_the_omitted_positions():
    given = torch.tensor([7, 9])
    qpos, kpos, mask = padding.resolve_positions(None, None, None, 1, 2, 4, CPU)
    assert qpos.tolist() == [2, 3] and kpos.tolist() == [0, 1, 2, 3] and mask is None
    qpos, kpos, _ = padding.resolve_positions(given, None, None, 1, 2, 4, CPU)
    assert qpos.tolist() == [7, 9] and kpos.tolist() == [0, 1, 2, 3]
    qpos, kpos, _ = padding.resolve_positions(None, [5, 6, 7, 8], None, 1, 2, 4, CPU)
    assert qpos.tolist() == [2, 3] and kpos.tolist() == [5, 6, 7, 8]
    mask_in = torch.tensor([[0, 1, 1, 1]])
    qpos, kpos, mask = padding.resolve_positions(given, given + 1, mask_in[:, :2], 1, 2, 2, CPU)
    assert qpos.tolist() == [7, 9] and kpos.tolist() == [8, 10]
    assert mask.tolist() == [[0, 1]]
    with pytest.raises(ValueError, match=r"^attention_mask: must have shape"):
        padding.resolve_positions(None, None, mask_in, 1, 2, 3, CPU)
    with pytest.raises(ValueError, match=r"^query_positions: must have length 2"):
        padding.resolve_positions(torch.arange(3), None, None, 1, 2, 3, CPU)


# ------------------------------------------------------------------- the range check


def test_position_range_refused_exactly_from_two_to_the_53():
    ok = torch.tensor([LIMIT - 1, -(LIMIT - 1), 0])
    padding.check_position_range("query_positions", ok)
    padding.check_position_range("query_positions", torch.zeros(0, dtype=torch.int64))
    for bad in (LIMIT, -LIMIT):
        with pytest.raises(
            ValueError, match=r"^key_positions: \|position\| must be < 2\*\*53 so that float64"
        ):
            padding.check_position_range("key_positions", torch.tensor([0, bad]))
    assert LIMIT == 2**53


# ------------------------------------------------------------------- real slots


def test_real_positions_skip_the_end_aligned_pad_slots():
    qpos, kpos = torch.tensor([2, 3]), torch.tensor([0, 1, 2, 3])
    same = padding.real_positions(qpos, kpos, None, 2)
    assert same[0] is qpos and same[1] is kpos  # nothing read, nothing copied
    mask = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])  # integer mask: 0 = pad
    rq, rk = padding.real_positions(qpos, kpos, mask, 2)
    assert rq.tolist() == [2, 3, 2, 3]  # the queries are the last two keys: all real
    assert rk.tolist() == [2, 3, 1, 2, 3]
    late = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 1]], dtype=torch.bool)  # the 3rd key padded
    rq, rk = padding.real_positions(qpos, kpos, late, 2)
    assert rq.tolist() == [3, 2, 3]  # query 0 is key slot 2 of sequence 0: a pad slot
    assert rk.tolist() == [0, 1, 3, 0, 1, 2, 3]
    # more queries than keys: no query is a pad slot
    rq, rk = padding.real_positions(torch.arange(5), torch.arange(3), late[:, :3], 2)
    assert rq.tolist() == list(range(5)) * 2 and rk.tolist() == [0, 1, 0, 1, 2]
    # per-sequence positions without a mask: every slot of every sequence
    per = torch.tensor([[5, 6], [7, 8]])
    rq, rk = padding.real_positions(per, torch.arange(2), None, 2)
    assert rq.tolist() == [5, 6, 7, 8] and rk.tolist() == [0, 1, 0, 1]


# ------------------------------------------------------------------- groups


def _check_groups(groups, qpos, kpos, mask, batch):
    """Every sequence in exactly one group; each group's indices are its sequences' real
    query slots and kept keys, its positions the positions there, and all its sequences
    share them (the definition of a group)."""
    n_q, n_k = qpos.shape[-1], kpos.shape[-1]
    qpos, kpos = qpos.expand(batch, n_q), kpos.expand(batch, n_k)
    keep_k = torch.ones(batch, n_k, dtype=torch.bool) if mask is None else mask != 0
    if n_q <= n_k:
        keep_q = keep_k[:, n_k - n_q :]
    else:
        keep_q = torch.ones(batch, n_q, dtype=torch.bool)
    seen = []
    for g in groups:
        rows = list(range(batch)) if g.rows is None else g.rows.tolist()
        assert rows, "an empty group"
        seen += rows
        for b in rows:
            want_q = keep_q[b].nonzero().flatten()
            want_k = keep_k[b].nonzero().flatten()
            got_q = torch.arange(n_q) if g.queries is None else g.queries
            got_k = torch.arange(n_k) if g.keys is None else g.keys
            assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k), b
            assert g.query_positions.tolist() == qpos[b, want_q].tolist(), b
            assert g.key_positions.tolist() == kpos[b, want_k].tolist(), b
    assert sorted(seen) == list(range(batch))


def test_a_mask_with_integer_entries_other_than_0_and_1_is_refused():
    pos = torch.arange(3)
    for bad in (2, -1):
        mask = torch.tensor([[1, 1, 1], [1, bad, 1]])
        with pytest.raises(
            ValueError, match=r"^attention_mask: integer entries must be 0 \(pad\) or 1 \(keep\)$"
        ):
            padding.group_batch(pos, pos, mask, 2)
    groups = padding.group_batch(pos, pos, torch.tensor([[1, 1, 1], [0, 1, 1]]), 2)
    assert len(groups) == 2  # 0/1 integers are read as pad/keep


def test_no_mask_and_shared_positions_make_one_whole_group():
    qpos, kpos = torch.arange(2, 5), torch.arange(5)
    (g,) = padding.group_batch(qpos, kpos, None, 3)
    assert g.whole and g.query_positions is qpos and g.key_positions is kpos
    # an all-keep mask: one group of the whole batch, nothing compacted
    (g,) = padding.group_batch(qpos, kpos, torch.ones(3, 5, dtype=torch.bool), 3)
    assert g.whole and g.query_positions.tolist() == [2, 3, 4]
    _check_groups([g], qpos, kpos, torch.ones(3, 5, dtype=torch.bool), 3)


def test_sequences_padding_differently_in_the_same_slots_get_their_own_groups():
    """Equal pad counts in different slots, and equal masked positions with different
    masks: the signature holds the mask as well as the positions."""
    kpos = torch.tensor([0, 5, 6, 7])
    qpos = kpos[2:]
    mask = torch.tensor(
        [
            [0, 1, 1, 1],  # left padded by one
            [1, 0, 1, 1],  # the same count, another slot
            [0, 1, 1, 1],  # as sequence 0
            [1, 1, 1, 1],  # key 0 real: its position is 0, as a pad slot's masked value
            [1, 1, 0, 1],  # the first query is a pad slot
        ],
        dtype=torch.bool,
    )
    groups = padding.group_batch(qpos, kpos, mask, 5)
    _check_groups(groups, qpos, kpos, mask, 5)
    rows = sorted(sorted(g.rows.tolist()) for g in groups)
    assert rows == [[0, 2], [1], [3], [4]]
    (last,) = [g for g in groups if g.rows.tolist() == [4]]
    assert last.queries.tolist() == [1] and last.query_positions.tolist() == [7]
    (full,) = [g for g in groups if g.rows.tolist() == [3]]
    assert full.queries is None and full.keys is None  # nothing to compact in its slots


def test_per_sequence_positions_group_by_their_real_slots_only():
    kpos = torch.tensor(
        [
            [0, 1, 2, 3],
            [99, 1, 2, 3],  # differs from row 0 at a pad slot only
            [0, 1, 2, 4],  # differs at a real slot
        ]
    )
    mask = torch.tensor([[0, 1, 1, 1]] * 3)
    qpos = kpos[:, 1:]
    groups = padding.group_batch(qpos, kpos, mask, 3)
    _check_groups(groups, qpos, kpos, mask, 3)
    assert sorted(sorted(g.rows.tolist()) for g in groups) == [[0, 1], [2]]
    # the same batch without a mask: all three differ
    groups = padding.group_batch(qpos, kpos, None, 3)
    _check_groups(groups, qpos, kpos, None, 3)
    assert len(groups) == 3 and all(g.queries is None and g.keys is None for g in groups)


def test_a_batch_of_one_or_of_equal_sequences_is_one_group():
    kpos = torch.tensor([[3, 4, 5, 6]])
    mask = torch.tensor([[0, 0, 1, 1]])
    (g,) = padding.group_batch(kpos[:, 2:], kpos, mask, 1)
    assert g.rows is None and g.keys.tolist() == [2, 3] and g.queries is None
    assert g.key_positions.tolist() == [5, 6] and g.query_positions.tolist() == [5, 6]
    assert not g.whole
    same = mask.expand(3, 4)
    (g,) = padding.group_batch(torch.arange(2), torch.arange(4), same, 3)
    assert g.rows is None and g.keys.tolist() == [2, 3]
    _check_groups([g], torch.arange(2), torch.arange(4), same, 3)


def test_more_queries_than_keys_keep_every_query():
    mask = torch.tensor([[1, 0, 1], [1, 1, 1]])
    qpos, kpos = torch.arange(5), torch.arange(3)
    groups = padding.group_batch(qpos, kpos, mask, 2)
    _check_groups(groups, qpos, kpos, mask, 2)
    assert all(g.queries is None for g in groups) and len(groups) == 2


def test_group_batch_checks_the_range_at_real_slots_only():
    big = torch.tensor([[LIMIT, 1, 2], [0, 1, 2]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    groups = padding.group_batch(big[:, 1:], big, mask, 2)  # 2**53 at a pad slot: ignored
    assert len(groups) == 2
    for name, qpos, kpos in (
        ("key_positions", big[:, 1:], big),
        ("query_positions", big, torch.tensor([[0, 1, 2], [0, 1, 2]])),
    ):
        with pytest.raises(ValueError, match=rf"^{name}: \|position\| must be < 2\*\*53"):
            padding.group_batch(qpos, kpos, torch.ones(2, 3, dtype=torch.bool), 2)


# ------------------------------------------------------------------- take and put


def _numbered(batch=3, heads=2, n=4, d=2, dtype=torch.float64):
    return torch.arange(batch * heads * n * d, dtype=dtype).view(batch, heads, n, d)


@pytest.mark.parametrize("with_rows", [False, True])
@pytest.mark.parametrize("with_slots", [False, True])
def test_take_and_put_address_exactly_the_groups_rows_and_slots(with_rows, with_slots):
    rows = torch.tensor([2, 0]) if with_rows else None
    slots = torch.tensor([1, 3]) if with_slots else None
    g = padding.Group(rows, None, None, torch.arange(2), torch.arange(2))
    x = _numbered()
    taken = g.take(x, slots)
    want = x[rows] if with_rows else x
    want = want[:, :, slots] if with_slots else want
    assert torch.equal(taken, want)
    dst = torch.full_like(x, -1.0)
    src = (taken + 1000).to(torch.float32)  # another dtype: converted into dst's
    g.put(dst, src, slots)
    expect = torch.full_like(x, -1.0)
    b_index = rows.tolist() if with_rows else list(range(3))
    s_index = slots.tolist() if with_slots else list(range(4))
    for i, b in enumerate(b_index):
        for j, s in enumerate(s_index):
            expect[b, :, s] = src[i, :, j].double()
    assert torch.equal(dst, expect) and dst.dtype == torch.float64


def test_the_keep_masks_are_made_on_the_positions_device():
    """Without a mask, or with more queries than keys, the all-keep masks are new tensors:
    on the device asked for (a CUDA call must not get CPU masks; ``meta`` shows it here)."""
    meta = torch.device("meta")
    query_keep, key_keep = padding._keeps(None, 2, 3, 4, meta)
    assert query_keep.device == key_keep.device == meta
    assert query_keep.shape == (2, 3) and key_keep.shape == (2, 4)
    assert query_keep.dtype == key_keep.dtype == torch.bool
    mask = torch.ones(2, 3, dtype=torch.bool, device=meta)
    query_keep, key_keep = padding._keeps(mask, 2, 5, 3, meta)  # n_q > n_k
    assert query_keep.device == meta and query_keep.shape == (2, 5) and key_keep is mask
    query_keep, key_keep = padding._keeps(None, 1, 2, 2, CPU)
    assert query_keep.all() and key_keep.all()


def test_equal_lengths_make_every_query_the_key_of_its_slot():
    """``n_q == n_k``: query ``i`` is key slot ``i``, so a padded key slot is a pad query."""
    pos = torch.arange(4)
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    rq, rk = padding.real_positions(pos, pos, mask, 2)
    assert rq.tolist() == [1, 2, 3, 0, 1, 2, 3] and rk.tolist() == rq.tolist()
    groups = padding.group_batch(pos, pos, mask, 2)
    _check_groups(groups, pos, pos, mask, 2)
    (padded,) = [g for g in groups if g.rows.tolist() == [0]]
    assert padded.queries.tolist() == [1, 2, 3] and padded.query_positions.tolist() == [1, 2, 3]


def test_array_likes_are_refused_under_torch_compile(monkeypatch):
    """Under ``torch.compile`` nothing is converted on the host: array-likes are refused."""
    monkeypatch.setattr(padding, "_compiling", lambda: True)
    with pytest.raises(
        TypeError, match=r"^query_positions: must be an integer torch.Tensor under torch.compile$"
    ):
        padding.check_positions("query_positions", [0, 1], 1, 2, CPU)
    with pytest.raises(
        TypeError, match=r"^attention_mask: must be a torch.Tensor under torch.compile$"
    ):
        padding.check_attention_mask([[1, 1]], 1, 2, CPU)
    # tensors pass as in eager mode
    assert padding.check_positions("query_positions", torch.arange(2), 1, 2, CPU).tolist() == [0, 1]
    assert padding.check_attention_mask(torch.ones(1, 2, dtype=torch.bool), 1, 2, CPU).all()


def test_checked_inputs_are_moved_to_the_querys_device():
    """Positions, masks and the default positions land on ``device`` (``meta`` stands for a
    device other than the CPU, where the inputs were made)."""
    meta = torch.device("meta")
    got = padding.check_positions("query_positions", torch.arange(3, dtype=torch.int32), 1, 3, meta)
    assert got.device == meta and got.dtype == torch.int64
    mask = padding.check_attention_mask(torch.ones(2, 3, dtype=torch.bool), 2, 3, meta)
    assert mask.device == meta and mask.shape == (2, 3)
    qpos, kpos, mask = padding.resolve_positions(
        None, None, torch.ones(2, 4, dtype=torch.bool), 2, 3, 4, meta
    )
    assert qpos.device == kpos.device == mask.device == meta
    qpos, kpos, _ = padding.resolve_positions(torch.arange(3), torch.arange(4), None, 2, 3, 4, meta)
    assert qpos.device == kpos.device == meta


def test_resolve_positions_checks_each_argument_against_its_own_shape():
    per_q = torch.tensor([[5, 6], [7, 8]])
    per_k = torch.tensor([[1, 2, 3], [4, 5, 6]])
    qpos, kpos, _ = padding.resolve_positions(per_q, per_k, None, 2, 2, 3, CPU)
    assert qpos.tolist() == per_q.tolist() and kpos.tolist() == per_k.tolist()
    with pytest.raises(ValueError, match=r"^key_positions: must have length 4, got 3$"):
        padding.resolve_positions(None, torch.arange(3), None, 1, 2, 4, CPU)
    with pytest.raises(
        ValueError, match=r"^key_positions: per-sequence positions must have shape \(batch, 3\)"
    ):
        padding.resolve_positions(per_q, per_k[:1].expand(3, 3), None, 2, 2, 3, CPU)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_grouping_and_real_positions_stay_on_the_positions_device():
    """The all-keep masks that grouping and the real-slot selection make are on the
    positions' device (CPU masks with CUDA positions raise in ``torch.where``/indexing)."""
    cuda = torch.device("cuda")
    per = torch.tensor([[0, 1, 2], [5, 6, 7]], device=cuda)
    groups = padding.group_batch(per, per, None, 2)
    assert len(groups) == 2 and all(g.key_positions.device.type == "cuda" for g in groups)
    rq, rk = padding.real_positions(per, per, None, 2)
    assert rq.device.type == rk.device.type == "cuda" and rq.tolist() == [0, 1, 2, 5, 6, 7]
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]], device=cuda)
    rq, _ = padding.real_positions(torch.arange(5, device=cuda), per, mask, 2)  # n_q > n_k
    assert rq.device.type == "cuda" and rq.numel() == 10
