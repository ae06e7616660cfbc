"""Positions from the padding mask and the evicting cache layer of ``plsh_fast/hf.py``, at
their edges: a mask exactly as long as the keys, a sliding window exactly the PLSH reach,
a decode step exactly one past the newest cached position, and batches whose sequences pad
differently (each sequence holds its own reachable real keys, padding is never held;
``proofs_notes/decoding_cache.md``, Claim 1).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import plsh_fast.hf as hf  # noqa: E402
from plsh_ref import PartitionSample, draw_partition  # noqa: E402


def _part(pitch=4.0):
    return PartitionSample(np.array([[pitch]]), np.array([[0.0]]))  # bins [4b, 4b + 4)


def _kv(batch, m):
    return torch.arange(float(batch * m)).reshape(batch, 1, m, 1)


def _step(layer, positions, keep=None, tokens=None):
    """One call as the attention functions make it: stage with ``update``, then ``attend``
    (query, key and value all ``tokens``, default :func:`_kv`)."""
    positions = torch.as_tensor(positions)
    batch, m = positions.shape
    x = _kv(batch, m) if tokens is None else tokens
    keys, values = layer.update(x.clone(), x.clone(), kwargs={"position_ids": positions})
    mask = None if keep is None else torch.as_tensor(keep)
    return layer.attend(x, keys, values, attention_mask=mask)


# ----------------------------------------------------------------------------- the mask


def test_padding_mask_defaults_to_all_real_tokens():
    mask = hf._padding_mask(None, 2, 3, "cpu")
    assert mask.dtype == torch.bool and mask.shape == (2, 3) and bool(mask.all())


def test_padding_mask_exactly_as_long_as_the_keys_is_accepted():
    m = torch.tensor([[0, 1, 1], [1, 1, 1]])
    out = hf._padding_mask(m, 2, 3, "cpu")  # total == n_k
    assert out.dtype == torch.bool and out.tolist() == [[False, True, True], [True] * 3]
    assert hf._padding_mask(m, 2, 2, "cpu").shape == (2, 3)  # longer than the keys
    with pytest.raises(ValueError, match="^attention_mask: shape \\(2, 3\\) cannot cover"):
        hf._padding_mask(m, 2, 4, "cpu")  # one key more than the mask covers
    with pytest.raises(ValueError, match="^attention_mask: shape \\(2, 3\\) cannot cover"):
        hf._padding_mask(m, 3, 3, "cpu")  # another batch
    with pytest.raises(ValueError, match="^attention_mask: the 'plsh'/'alibi' attention"):
        hf._padding_mask(m[:, None, None], 2, 3, "cpu")  # a 4-D mask
    with pytest.raises(ValueError, match="^attention_mask: the 'plsh'/'alibi' attention"):
        hf._padding_mask([[1, 1, 1]], 1, 3, "cpu")  # not a tensor


def test_padding_mask_is_made_on_the_given_device():
    # "meta" tells the device apart on a CPU-only machine (a dropped device= gives cpu)
    assert hf._padding_mask(None, 2, 3, "meta").device.type == "meta"
    assert hf._padding_mask(torch.tensor([[0, 1, 1]]), 1, 3, "meta").device.type == "meta"


def test_the_registered_mask_builder_covers_every_token_seen():
    # the 2-D keep-mask of kv_offset + kv_length tokens: all real without a mask; a shorter
    # mask (a static cache's slots beyond it) padded with absent tokens, a longer one cut
    build = hf._padding_mask_builder
    ones = build(2, 1, 3, kv_offset=2, device="meta")
    assert ones.shape == (2, 5) and ones.dtype == torch.bool and ones.device.type == "meta"
    assert bool(build(2, 1, 3, kv_offset=2).all())
    given = torch.tensor([[0, 1, 1], [1, 1, 1]])
    assert build(2, 1, 3, attention_mask=given).tolist() == [[False, True, True], [True] * 3]
    padded = build(2, 1, 3, kv_offset=2, attention_mask=given)
    assert padded.dtype == torch.bool
    assert padded.tolist() == [[False, True, True, False, False], [True, True, True, False, False]]
    # more sequences than tokens: the mask's length is its last axis, not its first
    wide = build(4, 1, 3, attention_mask=torch.ones(4, 2))
    assert wide.tolist() == [[True, True, False]] * 4
    cut = build(2, 1, 2, attention_mask=given)
    assert cut.tolist() == [[False, True], [True, True]]
    assert build(1, 1, 4, q_offset=3, attention_mask=torch.ones(1, 4)).shape == (1, 4)


def test_the_mask_builder_refuses_a_mask_that_is_not_2d_by_its_own_shape():
    # transformers hands a 4-D mask to no builder; any other rank is refused with the shape
    # given (not the shape of a mask padded along another axis)
    for shape in [(1, 5, 2), (3,)]:
        with pytest.raises(ValueError) as err:
            hf._padding_mask_builder(1, 1, 3, attention_mask=torch.ones(shape))
        assert str(err.value) == (
            "attention_mask: the 'plsh'/'alibi' attention needs the 2-D padding mask (batch, "
            f"tokens), got shape {shape}"
        )


# ----------------------------------------------------------------------------- positions


def test_positions_count_the_real_tokens_before_each():
    mask = torch.tensor([[False, False, True, True, True], [True] * 5])
    qpos, kpos, kmask = hf._positions(mask, 2, 4)
    assert kpos.tolist() == [[-1, 0, 1, 2], [1, 2, 3, 4]]  # cumsum(mask) - 1, last 4
    assert kmask.tolist() == [[False, True, True, True], [True] * 4]
    assert qpos.tolist() == [[1, 2], [3, 4]]  # the last 2 of the keys
    qpos, _, _ = hf._positions(mask, 1, 4)
    assert qpos.tolist() == [[2], [4]]  # the newest token only
    qpos, _, _ = hf._positions(mask, 0, 4)
    assert qpos.shape == (2, 0)


def test_cached_positions_may_differ_only_at_padding():
    mask = torch.tensor([[False, True, True], [True, True, True]])
    key = torch.zeros(2, 1, 3, 1)
    key.plsh_positions = torch.tensor([[57, 0, 1], [0, 1, 2]])  # slot 0 of row 0 is a pad
    hf._positions(mask, 1, 3, key)  # accepted
    key.plsh_positions = torch.tensor([[-1, 0, 1], [0, 1, 3]])  # a real slot differs
    with pytest.raises(ValueError, match="^position_ids: the positions PLSHCache evicted"):
        hf._positions(mask, 1, 3, key)
    key.plsh_positions = torch.tensor([[0, 1], [1, 2]])  # another number of slots
    with pytest.raises(ValueError, match="^position_ids: the positions PLSHCache evicted"):
        hf._positions(mask, 1, 3, key)


def test_keys_of_another_partition_are_refused():
    mask = torch.ones(1, 3, dtype=torch.bool)
    part, other = _part(4.0), _part(8.0)
    key = torch.zeros(1, 1, 3, 1)
    hf._positions(mask, 1, 3, key, part)  # untagged keys: any partition
    key.plsh_partition = part
    hf._positions(mask, 1, 3, key, part)
    hf._positions(mask, 1, 3, key, None)  # no partition to compare with
    with pytest.raises(ValueError, match="^partition: the PLSHCache layer holding these keys"):
        hf._positions(mask, 1, 3, key, other)


def test_keys_from_an_evicting_cache_are_refused_by_exact_alibi():
    key = torch.zeros(1, 1, 2, 1)
    hf._check_not_evicting(key)
    key.plsh_partition = _part()
    with pytest.raises(ValueError, match="^key: comes from a PLSHCache"):
        hf._check_not_evicting(key)


# ----------------------------------------------------------------------------- the cache layer


def test_position_ids_are_required_and_shaped():
    layer = hf.PLSHCacheLayer(_part())
    with pytest.raises(ValueError, match="^position_ids: PLSHCache needs"):
        layer.update(_kv(1, 2), _kv(1, 2), kwargs={})
    with pytest.raises(ValueError, match="^position_ids: shape \\(3, 2\\), expected \\(2, 2\\)"):
        layer.update(_kv(2, 2), _kv(2, 2), kwargs={"position_ids": torch.zeros(3, 2)})
    # (m,) and (1, m) serve every sequence; a plain keyword is read too
    keys, _ = layer.update(_kv(2, 2), _kv(2, 2), kwargs={"position_ids": torch.tensor([0, 1])})
    assert keys.plsh_positions.tolist() == [[0, 1], [0, 1]]
    assert keys.plsh_positions.dtype == torch.int64
    layer.attend(_kv(2, 2), keys, _kv(2, 2))
    keys, values = layer.update(_kv(2, 1), _kv(2, 1), position_ids=torch.tensor([[2]]))
    layer.attend(_kv(2, 1), keys, values)
    assert [layer.decoder.cached_positions(b).tolist() for b in (0, 1)] == [[0, 1, 2]] * 2


def test_a_step_exactly_after_the_newest_position_is_accepted_and_a_repeat_refused():
    layer = hf.PLSHCacheLayer(_part())
    _step(layer, [[0, 1, 2], [5, 6, 7]])
    with pytest.raises(ValueError, match="^position_ids: decode step out of order"):
        _step(layer, [[3], [7]])  # one sequence repeats its newest position
    _step(layer, [[3], [8]])
    assert layer.decoder.last_positions().tolist() == [3, 8]


def test_eviction_keeps_exactly_the_keys_a_later_query_can_reach():
    layer = hf.PLSHCacheLayer(_part())
    keys, _ = layer.update(_kv(1, 10), _kv(1, 10), kwargs={"position_ids": torch.arange(10)})
    assert keys.plsh_cache_layer is layer and keys.plsh_partition is layer.partition
    out = layer.attend(_kv(1, 10), keys, _kv(1, 10))
    assert out.shape == (1, 1, 10, 1)
    # the newest query 9 is in bin 2 ([8, 12)): only 8 and 9 can be reached again
    assert layer.decoder.cached_positions(0).tolist() == [8, 9] and layer.cached_tokens() == 2
    _step(layer, [[10]])
    assert layer.decoder.ring_steps == 1  # a decode step: the batched ring
    assert layer.cached_tokens() == 3 and layer.get_seq_length() == 11
    assert layer.get_mask_sizes(1) == (12, 0)  # the mask covers every token seen
    assert layer.decoder.cached_positions(0).tolist() == [8, 9, 10]


def test_the_layer_attends_only_the_keys_it_staged_and_only_causally():
    layer = hf.PLSHCacheLayer(_part())
    keys, values = layer.update(_kv(1, 2), _kv(1, 2), kwargs={"position_ids": torch.arange(2)})
    with pytest.raises(ValueError, match="^key: not the keys this PLSHCache layer staged"):
        layer.attend(_kv(1, 2), keys.clone(), values)
    with pytest.raises(ValueError, match="^causal: PLSHCache decodes causal attention only"):
        layer.attend(_kv(1, 2), keys, values, causal=False)
    layer.attend(_kv(1, 2), keys, values, scale=0.5)
    keys, values = layer.update(_kv(1, 1), _kv(1, 1), kwargs={"position_ids": torch.tensor([2])})
    with pytest.raises(ValueError, match="^scale: 0.25, the cache attends with 0.5"):
        layer.attend(_kv(1, 1), keys, values, scale=0.25)


def test_attend_without_staged_keys_is_refused_whatever_the_key():
    # nothing staged (a new layer, after an attend, after reset): every key is refused,
    # None included (no staged keys is not a key to match)
    layer = hf.PLSHCacheLayer(_part())
    x = _kv(1, 2)
    for state in ("new", "attended", "reset"):
        for key in (None, x):
            with pytest.raises(ValueError, match="^key: not the keys this PLSHCache layer staged"):
                layer.attend(x, key, x)
        if state == "new":
            keys, values = layer.update(x, x, kwargs={"position_ids": torch.arange(2)})
            layer.attend(x, keys, values)
        else:
            layer.reset()


def test_the_tagged_positions_are_on_the_keys_device():
    # position_ids on the host, keys elsewhere ("meta" stands for an accelerator on a
    # CPU-only machine): the positions the attention compares with are moved to the keys
    layer = hf.PLSHCacheLayer(_part())
    k = torch.zeros(1, 1, 2, 1, device="meta")
    keys, _ = layer.update(k, k, kwargs={"position_ids": torch.arange(2)})
    assert keys.plsh_positions.device.type == "meta"
    assert keys.plsh_positions.dtype == torch.int64 and keys.plsh_positions.shape == (1, 2)


def test_an_empty_layer_reports_no_slots():
    layer = hf.PLSHCacheLayer(_part())
    assert layer.cached_tokens() == 0 and layer.get_mask_sizes(3) == (3, 0)
    with pytest.raises(ValueError, match="^max_length: PLSHCache cannot be cropped"):
        layer.crop(2)
    with pytest.raises(TypeError, match="^partition: must be a PartitionSample"):
        hf.PLSHCacheLayer(np.ones((1, 1)))
    with pytest.raises(ValueError, match="^delta: no positions decoded yet"):
        layer.error_bound(0.1)


def test_padding_is_never_held():
    """Pad tokens carry whatever position the caller wrote (here 9, in a later bin than
    the real tokens): only the mask tells they are pads, and they are never held."""
    layer = hf.PLSHCacheLayer(_part())
    keep = [[False, False] + [True] * 6]
    _step(layer, [[9, 9, 0, 1, 2, 3, 4, 5]], keep)
    assert layer.decoder.cached_positions(0).tolist() == [4, 5]
    _step(layer, [[6]])  # r = 6, bin 1: keys 4, 5 and the new one
    assert layer.decoder.cached_positions(0).tolist() == [4, 5, 6]


def test_sequences_padded_differently_hold_each_their_own_reachable_keys():
    layer = hf.PLSHCacheLayer(_part())
    # row 0: real 0..7; row 1: two pads (at a reachable position), then real 0..5
    positions = [list(range(8)), [9, 9, 0, 1, 2, 3, 4, 5]]
    keep = [[True] * 8, [False, False] + [True] * 6]
    _step(layer, positions, keep)
    _step(layer, [[8], [6]])  # r = 8 (bin 2) for row 0, r = 6 (bin 1) for row 1
    assert layer.decoder.cached_positions(0).tolist() == [8]
    assert layer.decoder.cached_positions(1).tolist() == [4, 5, 6]
    assert layer.cached_tokens() == 3 and layer.decoder.ring_steps == 1


def test_a_step_of_pads_only_holds_nothing():
    layer = hf.PLSHCacheLayer(_part())
    _step(layer, [[0, 1, 2]], keep=[[False, False, False]])
    assert layer.cached_tokens() == 0 and layer.get_seq_length() == 3
    assert layer.decoder.last_positions().tolist() == [-1]


def test_reorder_cache_moves_each_sequence_with_its_keys():
    layer = hf.PLSHCacheLayer(_part())
    _step(layer, [[0, 1], [4, 5]], keep=[[False, True], [True, True]])
    out_before = _step(layer, [[2], [6]])
    layer = hf.PLSHCacheLayer(_part())
    _step(layer, [[0, 1], [4, 5]], keep=[[False, True], [True, True]])
    layer.reorder_cache(torch.tensor([1, 0]))
    assert layer.decoder.cached_positions(0).tolist() == [4, 5]
    assert layer.decoder.cached_positions(1).tolist() == [1]
    # the next step of the reordered cache gives the rows of the original, swapped
    out_after = _step(layer, [[6], [2]], tokens=_kv(2, 1).flip(0))
    assert torch.equal(out_after, out_before.flip(0))
    layer.batch_repeat_interleave(2)  # (4 sequences: 0, 0, 1, 1 of the reordered cache)
    assert [len(layer.decoder.cached_positions(b)) for b in range(4)] == [3, 3, 2, 2]
    layer.batch_select_indices(torch.tensor([1, 2]))
    assert [layer.decoder.cached_positions(b).tolist() for b in (0, 1)] == [[4, 5, 6], [1, 2]]
    with pytest.raises(TypeError, match="^indices: must be integers"):
        layer.decoder.select([0.5, 1.0])
    with pytest.raises(ValueError, match="^indices: must lie in \\[0, 2\\)"):
        layer.decoder.select([0, 2])
    with pytest.raises(ValueError, match="^indices: must be 1-D"):
        layer.decoder.select([[0, 1]])
    layer.reset()
    assert layer.cached_tokens() == 0 and layer.get_seq_length() == 0


def test_cache_bounds_are_the_layers_cache_bounds():
    part = draw_partition([3.0, 9.0], num_samples=4, seed=1)
    layer = hf.PLSHCacheLayer(part)
    assert layer.bound == int(np.ceil(part.pitch.max())) + 1


def test_the_position_refusals_say_what_to_do_instead():
    mask = torch.ones(1, 3, dtype=torch.bool)
    key = torch.zeros(1, 1, 3, 1)
    key.plsh_partition = _part(8.0)
    with pytest.raises(ValueError) as err:
        hf._positions(mask, 1, 3, key, _part(4.0))
    assert str(err.value) == (
        "partition: the PLSHCache layer holding these keys was built for another partition "
        "than the attention module's (rebuild the cache after changing partitions)"
    )
    key = torch.zeros(1, 1, 3, 1)
    key.plsh_positions = torch.tensor([[0, 1, 3]])
    with pytest.raises(ValueError) as err:
        hf._positions(mask, 1, 3, key)
    assert str(err.value) == (
        "position_ids: the positions PLSHCache evicted with differ from those implied by "
        "attention_mask (real tokens before each token); pass position_ids = "
        "attention_mask.cumsum(-1) - 1, as generate() does"
    )
    with pytest.raises(ValueError) as err:
        hf._padding_mask(torch.ones(1, 1, 1, 3), 1, 3, "cpu")
    assert str(err.value) == (
        "attention_mask: the 'plsh'/'alibi' attention needs the 2-D padding mask (batch, "
        "tokens) that its registered mask builder makes, got shape torch.Size([1, 1, 1, 3]); "
        "a model that builds its own 4-D mask is not supported (see swap_bloom_attention)"
    )
    with pytest.raises(ValueError) as err:
        hf._padding_mask([[1, 1, 1]], 1, 3, "cpu")  # no shape at all
    assert "makes, got shape None; a model" in str(err.value)
    key = torch.zeros(1, 1, 3, 1)
    key.plsh_partition = _part(4.0)
    with pytest.raises(ValueError) as err:
        hf._check_not_evicting(key)
    assert str(err.value) == (
        "key: comes from a PLSHCache, whose evicted keys exact ALiBi still weights; "
        "use DynamicCache with the 'alibi' attention"
    )
    layer = hf.PLSHCacheLayer(_part())
    with pytest.raises(ValueError) as err:
        layer.update(_kv(1, 2), _kv(1, 2), kwargs={})
    assert str(err.value) == (
        "position_ids: PLSHCache needs the new tokens' position_ids in the attention kwargs "
        "(models built on AttentionInterface pass them)"
    )
    _step(layer, [[0, 1]])
    with pytest.raises(ValueError) as err:
        layer.update(_kv(1, 1), _kv(1, 1), kwargs={"position_ids": torch.tensor([[1]])})
    assert str(err.value) == (
        "position_ids: decode step out of order (new positions must follow the cached ones)"
    )
    with pytest.raises(TypeError) as err:
        hf.PLSHCacheLayer("not a partition")
    assert str(err.value) == "partition: must be a PartitionSample, got str"


def test_the_layer_tags_its_keys_and_attends_with_the_default_scale_of_head_dim():
    # 2 heads of head_dim 4: the default scale is 1 / sqrt(head_dim) = 1/2 (not of the head
    # count); the outputs are the full-sequence PLSH attention's on the layer's partition
    from plsh_fast import plsh_attention

    part = draw_partition([3.0, 9.0], num_samples=4, seed=1)
    layer = hf.PLSHCacheLayer(part)
    assert layer.partition is part
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g, dtype=torch.float64) for _ in range(3))
    positions = torch.arange(6, dtype=torch.int32)[None]  # int32: tagged as int64
    keys, values = layer.update(k, v, kwargs={"position_ids": positions})
    assert keys.plsh_partition is part and keys.plsh_cache_layer is layer
    assert keys.plsh_positions.dtype == torch.int64
    assert keys.plsh_positions.tolist() == [list(range(6))]
    out = layer.attend(q, keys, values)
    ref = plsh_attention(q, k, v, partition=part, causal=True)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    # control: the scale of the head count (1 / sqrt(2)) gives other outputs
    other = plsh_attention(q, k, v, partition=part, causal=True, scale=2**-0.5)
    assert float((other - ref).abs().max()) > 1e-3
    assert layer.error_bound() == layer.error_bound(0.05)
    assert layer.error_bound() != layer.error_bound(0.5)


def test_keep_from_a_models_own_4d_mask_reads_the_newest_query_row():
    # BLOOM/Falcon/MPT swaps get the model's 4-D mask: bool (True = keep) or additive (kept
    # above the dtype's minimum); the newest query's row tells which keys are real
    keep = hf._keep_from_additive_mask
    lo = torch.finfo(torch.float32).min
    additive = torch.tensor([[[[0.0, lo, lo], [0.0, 0.0, lo], [lo, 0.0, 0.0]]]])
    assert keep(additive, 1, 3, None, 0, "cpu").tolist() == [[False, True, True]]
    boolean = torch.tensor([[[[True, False], [False, True]]]])
    assert keep(boolean, 1, 2, None, 0, "cpu").tolist() == [[False, True]]
    # without a mask: every token seen so far (the cache's) and the new ones
    ones = keep(None, 2, 3, None, 0, "meta")
    assert ones.shape == (2, 3) and ones.dtype == torch.bool and ones.device.type == "meta"

    class Past:
        def get_seq_length(self, layer_idx):
            return 5 if layer_idx == 1 else 0

    assert keep(None, 1, 2, Past(), 1, "cpu").shape == (1, 7)
    assert bool(keep(None, 1, 2, Past(), 1, "cpu").all())
    assert keep(None, 1, 2, Past(), 0, "cpu").shape == (1, 2)
