"""Every deprecated spelling still works for one release, warns, and gives the same result.

Each shim goes through :func:`plsh_ref.validation.warn_deprecated` (category
:class:`plsh_ref.validation.PLSHDeprecationWarning`, an error in this suite outside
``pytest.warns``); each test below calls the old spelling under
``pytest.warns(DeprecationWarning)`` and compares with the new one, so a shim that stops
warning, stops working or changes the result fails here.
"""

from __future__ import annotations

import numpy as np
import pytest

from plsh_ref.alibi import alibi_slopes
from plsh_ref.partition import PartitionSample

# ------------------------------------------------------------- plsh_ref.validation


def test_shims_warn_with_the_project_category_which_the_suite_makes_an_error():
    """Every shim warns through warn_deprecated with PLSHDeprecationWarning (a
    DeprecationWarning); pyproject's filterwarnings turns it into an error, so a test that
    calls an old spelling outside ``pytest.warns`` fails (the project's own code calls
    none); inside ``pytest.warns`` it is caught as a warning."""
    from plsh_ref.validation import PLSHDeprecationWarning, warn_deprecated

    assert issubclass(PLSHDeprecationWarning, DeprecationWarning)
    with pytest.raises(PLSHDeprecationWarning, match="^old is deprecated .*; use new$"):
        warn_deprecated("old", "new")
    with pytest.warns(PLSHDeprecationWarning, match="use new"):
        warn_deprecated("old", "new")


def test_validation_check_slopes_moved_to_alibi():
    import plsh_ref.alibi
    import plsh_ref.validation

    with pytest.warns(DeprecationWarning, match="plsh_ref.alibi.check_slopes"):
        old = plsh_ref.validation.check_slopes
    assert old is plsh_ref.alibi.check_slopes
    np.testing.assert_array_equal(old(None, 4), alibi_slopes(4))


def test_validation_check_partition_moved_to_partition():
    import plsh_ref.partition

    with pytest.warns(DeprecationWarning, match="plsh_ref.partition.check_partition"):
        from plsh_ref.validation import check_partition
    part = PartitionSample(np.ones((2, 3)), np.zeros((2, 3)))
    assert check_partition is plsh_ref.partition.check_partition
    assert check_partition(part, 2) is part


def test_validation_unknown_name_still_raises_attribute_error():
    import plsh_ref.validation

    with pytest.raises(AttributeError, match="no attribute 'no_such_check'"):
        plsh_ref.validation.no_such_check  # noqa: B018


# ---------------------------------------------------------------- plsh_ref.attention


def _ref_case():
    from plsh_ref.partition import draw_partition

    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 2, 5, 3)) for _ in range(3))
    return q, k, v, draw_partition(1.0 / alibi_slopes(2), 4, seed=3)


def test_reference_positional_partition_keeps_the_old_pair():
    from plsh_ref.attention import plsh_attention

    q, k, v, part = _ref_case()
    new = plsh_attention(q, k, v, partition=part, return_lse=True)
    with pytest.warns(DeprecationWarning, match="partition=") as record:
        old = plsh_attention(q, k, v, part)
    assert len(record) == 1  # one warning for the old form, not a second for the return
    assert isinstance(old, tuple) and all(np.array_equal(a, b) for a, b in zip(old, new))


def test_reference_backend_is_the_old_spelling_of_method():
    from plsh_ref.attention import plsh_attention

    q, k, v, part = _ref_case()
    new = plsh_attention(q, k, v, partition=part, method="reduction", return_lse=False)
    with pytest.warns(DeprecationWarning, match="method='reduction'"):
        old = plsh_attention(q, k, v, partition=part, backend="reduction", return_lse=False)
    np.testing.assert_array_equal(old, new)


@pytest.mark.parametrize(
    "name", ["plsh_attention", "alibi_attention", "no_bias_attention", "fixed_block_attention",
             "biased_attention"],
)  # fmt: skip
def test_reference_without_return_lse_returns_the_old_pair(name):
    import plsh_ref.attention as A

    q, k, v, part = _ref_case()
    extra = {
        "plsh_attention": ((), {"partition": part}),
        "fixed_block_attention": ((3,), {}),
        "biased_attention": ((), {"bias": np.zeros((2, 5, 5))}),
    }.get(name, ((), {}))
    fn = getattr(A, name)
    out, lse = fn(q, k, v, *extra[0], **extra[1], return_lse=True)
    assert np.array_equal(fn(q, k, v, *extra[0], **extra[1], return_lse=False), out)
    with pytest.warns(DeprecationWarning, match="return_lse=True"):
        old = fn(q, k, v, *extra[0], **extra[1])
    assert isinstance(old, tuple) and np.array_equal(old[0], out) and np.array_equal(old[1], lse)


def test_mpmath_references_share_the_family_contract():
    """plsh_attention_mp: keyword-only partition (positional warns, keeps the pair);
    both mpmath references: ``return_lse`` selects the return, not given warns."""
    from plsh_ref.mp_attention import alibi_attention_mp, plsh_attention_mp

    q, k, v, part = _ref_case()
    q, k, v = q[..., :3, :], k[..., :3, :], v[..., :3, :]  # mpmath is slow: 3 tokens
    new = plsh_attention_mp(q, k, v, partition=part, return_lse=True, dps=20)
    with pytest.warns(DeprecationWarning, match="partition=") as record:
        old = plsh_attention_mp(q, k, v, part, dps=20)
    assert len(record) == 1
    assert isinstance(old, tuple) and all(np.array_equal(a, b) for a, b in zip(old, new))
    out = plsh_attention_mp(q, k, v, partition=part, return_lse=False, dps=20)
    assert np.array_equal(out, new[0])
    with pytest.raises(TypeError, match="^partition:"):
        plsh_attention_mp(q, k, v, part, partition=part, dps=20)
    pair = alibi_attention_mp(q, k, v, return_lse=True, dps=20)
    assert np.array_equal(alibi_attention_mp(q, k, v, return_lse=False, dps=20), pair[0])
    with pytest.warns(DeprecationWarning, match="return_lse=True"):
        old = alibi_attention_mp(q, k, v, dps=20)
    assert isinstance(old, tuple) and np.array_equal(old[1], pair[1])


# ------------------------------------------------------------------- plsh_fast.peers


def test_peers_alibi_bias_renamed_sdpa_alibi_bias():
    torch = pytest.importorskip("torch")
    from plsh_fast import peers

    new = peers.sdpa_alibi_bias(alibi_slopes(2), 5, 7, causal=True, dtype=torch.float64)
    with pytest.warns(DeprecationWarning, match="sdpa_alibi_bias"):
        old = peers.alibi_bias(alibi_slopes(2), 5, 7, causal=True, dtype=torch.float64)
    assert torch.equal(old, new)


def test_peers_alibi_attention_renamed_chunked_alibi_attention():
    torch = pytest.importorskip("torch")
    from plsh_fast import peers

    q = torch.randn(1, 2, 9, 4, generator=torch.Generator().manual_seed(0))
    new = peers.chunked_alibi_attention(q, q, q, chunk_size=4, return_lse=True)
    with pytest.warns(DeprecationWarning, match="chunked_alibi_attention"):
        old = peers.alibi_attention(q, q, q, chunk_size=4, return_lse=True)
    assert all(torch.equal(a, b) for a, b in zip(old, new))


# ------------------------------------------------------------------ plsh_fast.decoding


def _decoding_case():
    torch = pytest.importorskip("torch")
    from plsh_ref.partition import draw_partition

    part = draw_partition(1.0 / alibi_slopes(2), 4, seed=0)
    q = torch.randn(1, 2, 6, 4, generator=torch.Generator().manual_seed(1))
    return torch, part, q, torch.tensor([3, 5, 6, 9, 10, 12])


def test_decoding_update_positions_renamed_query_positions():
    from plsh_fast.decoding import PLSHDecodingCache

    torch, part, q, pos = _decoding_case()
    new = PLSHDecodingCache(part).update(q, q, q, query_positions=pos)
    with pytest.warns(DeprecationWarning, match="query_positions"):
        positional = PLSHDecodingCache(part).update(q, q, q, pos)
    with pytest.warns(DeprecationWarning, match="query_positions"):
        keyword = PLSHDecodingCache(part).update(q, q, q, positions=pos)
    assert torch.equal(positional, new) and torch.equal(keyword, new)
    assert torch.equal(PLSHDecodingCache(part).update(q, q, q, key_positions=pos), new)


def test_decoding_update_partition_argument_deprecated():
    from plsh_fast.decoding import PLSHDecodingCache

    torch, part, q, pos = _decoding_case()
    new = PLSHDecodingCache(part).update(q, q, q, query_positions=pos)
    with pytest.warns(DeprecationWarning, match="constructor"):
        old = PLSHDecodingCache(part).update(q, q, q, query_positions=pos, partition=part)
    assert torch.equal(old, new)


# ------------------------------------------------------------------------ plsh_fast.nn


def test_nn_exact_is_the_old_spelling_of_method_exact():
    torch = pytest.importorskip("torch")
    from plsh_fast.nn import PLSHAttention

    q = torch.randn(1, 2, 7, 4, generator=torch.Generator().manual_seed(2))
    new = PLSHAttention(2, 3, method="exact", seed=0)
    with pytest.warns(DeprecationWarning, match="method='exact'"):
        old = PLSHAttention(2, 3, exact=True, seed=0)
    assert old.method == "exact" and old.exact
    assert torch.equal(old(q, q, q), new(q, q, q))
    with pytest.raises(ValueError, match="^backend: method='exact'"):
        PLSHAttention(2, 3, method="exact", backend="cpu")
    with pytest.raises(ValueError, match="^method:"):
        PLSHAttention(2, 3, method="counts")


def test_nn_forward_positional_positions():
    torch = pytest.importorskip("torch")
    from plsh_fast.nn import PLSHAttention

    q = torch.randn(1, 2, 7, 4, generator=torch.Generator().manual_seed(3))
    pos = torch.tensor([0, 2, 3, 5, 8, 9, 11])
    core = PLSHAttention(2, 3, seed=0).eval()
    new = core(q, q, q, query_positions=pos, key_positions=pos)
    with pytest.warns(DeprecationWarning, match="query_positions=") as record:
        old = core(q, q, q, pos, pos)
    assert torch.equal(old, new)
    # the warning names this line, not torch.nn.Module.__call__ (where Python's default
    # filters would hide it); called as core.forward(...) too
    assert record[0].filename == __file__
    with pytest.warns(DeprecationWarning, match="query_positions=") as record:
        core.forward(q, q, q, pos, pos)
    assert record[0].filename == __file__
    assert not torch.equal(core(q, q, q), new)  # the positions matter: a real comparison


def test_nn_self_attention_positions_renamed_query_positions():
    torch = pytest.importorskip("torch")
    from plsh_fast.nn import PLSHAttention, PLSHSelfAttention

    torch.manual_seed(0)
    layer = PLSHSelfAttention(8, 2, attention=PLSHAttention(2, 3, seed=0)).eval()
    x = torch.randn(1, 7, 8)
    pos = torch.tensor([0, 2, 3, 5, 8, 9, 11])
    new = layer(x, query_positions=pos)
    with pytest.warns(DeprecationWarning, match="query_positions=") as record:
        positional = layer(x, pos)
    assert record[0].filename == __file__  # the caller's line, not torch's
    with pytest.warns(DeprecationWarning, match="query_positions="):
        keyword = layer(x, positions=pos)
    assert torch.equal(positional, new) and torch.equal(keyword, new)
    assert torch.equal(layer(x, query_positions=pos, key_positions=pos), new)


def test_peers_reduction_attention_positional_partition():
    torch = pytest.importorskip("torch")
    from plsh_fast import peers
    from plsh_ref.partition import draw_partition

    part = draw_partition(1.0 / alibi_slopes(2), 3, seed=4)
    q = torch.randn(1, 2, 9, 4, generator=torch.Generator().manual_seed(5))
    new = peers.reduction_attention(q, q, q, partition=part)
    with pytest.warns(DeprecationWarning, match="partition=") as record:
        old = peers.reduction_attention(q, q, q, part)
    assert record[0].filename == __file__
    assert torch.equal(old, new)


def test_peers_dense_attention_positional_bias():
    torch = pytest.importorskip("torch")
    from plsh_fast import peers
    from plsh_fast.dense import dense_attention

    assert peers.dense_attention is dense_attention
    q = torch.randn(1, 2, 6, 4, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    bias = torch.randn(2, 6, 6, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    new = peers.dense_attention(q, q, q, bias=bias, return_lse=True)
    with pytest.warns(DeprecationWarning, match="bias=") as record:
        old = peers.dense_attention(q, q, q, bias, return_lse=True)
    assert record[0].filename == __file__  # the warning names the caller's line
    assert all(torch.equal(a, b) for a, b in zip(old, new))
    assert not torch.equal(peers.dense_attention(q, q, q, bias=bias * 0), new[0])  # bias matters
    with pytest.raises(TypeError, match="^bias: pass it once"):
        peers.dense_attention(q, q, q, bias, bias=bias)


def test_biased_attention_positional_bias():
    from plsh_ref.attention import biased_attention

    q, k, v, _part = _ref_case()
    bias = np.random.default_rng(8).normal(size=(q.shape[1], q.shape[2], k.shape[2]))
    new = biased_attention(q, k, v, bias=bias, return_lse=True)
    with pytest.warns(DeprecationWarning, match="bias=") as record:
        old = biased_attention(q, k, v, bias, return_lse=True)
    assert len(record) == 1 and record[0].filename == __file__  # names the caller's line
    assert all(np.array_equal(a, b) for a, b in zip(old, new))
    assert not np.array_equal(biased_attention(q, k, v, bias=0 * bias, return_lse=False), new[0])
    with pytest.raises(TypeError, match="^bias: pass it once"):
        biased_attention(q, k, v, bias, bias=bias)
    with pytest.raises(TypeError, match="^bias: required"):
        biased_attention(q, k, v, return_lse=True)


def test_biased_sdpa_positional_bias():
    torch = pytest.importorskip("torch")
    from plsh_fast.nn import biased_sdpa

    q = torch.randn(1, 2, 6, 4, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    bias = torch.randn(2, 6, 6, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    new = biased_sdpa(q, q, q, bias=bias)
    with pytest.warns(DeprecationWarning, match="bias=") as record:
        old = biased_sdpa(q, q, q, bias)
    assert len(record) == 1 and record[0].filename == __file__
    assert torch.equal(old, new)
    assert not torch.equal(biased_sdpa(q, q, q, bias=bias * 0), new)  # bias matters
    with pytest.raises(TypeError, match="^bias: pass it once"):
        biased_sdpa(q, q, q, bias, bias=bias)
    with pytest.raises(TypeError, match="^bias: required"):
        biased_sdpa(q, q, q)


def test_peers_flex_reduction_positional_block_mask_and_the_old_pair():
    torch = pytest.importorskip("torch")
    from torch.nn.attention.flex_attention import flex_attention

    from plsh_fast import peers
    from plsh_fast._partition import bins, partition_tensors
    from plsh_ref.partition import draw_partition

    n, s = 32, 2
    pitch, offset = partition_tensors(draw_partition(1.0 / alibi_slopes(2), s, seed=8), "cpu")
    block_mask = peers.reduction_block_mask(bins(pitch, offset, torch.arange(n)).transpose(0, 1)
                                            .contiguous(), block=16)  # fmt: skip
    q = torch.randn(1, 2, n, 4, generator=torch.Generator().manual_seed(9))
    kw = {"flex": flex_attention}
    new = peers.flex_reduction_attention(
        q, q, q, block_mask=block_mask, num_samples=s, return_lse=True, **kw
    )
    with pytest.warns(DeprecationWarning, match="block_mask=") as record:
        old = peers.flex_reduction_attention(q, q, q, block_mask, s, **kw)
    assert sum(issubclass(r.category, DeprecationWarning) for r in record) == 1
    assert isinstance(old, tuple) and all(torch.equal(a, b) for a, b in zip(old, new))
    with pytest.warns(DeprecationWarning, match="return_lse=True"):
        pair = peers.flex_reduction_attention(q, q, q, block_mask=block_mask, num_samples=s, **kw)
    assert isinstance(pair, tuple) and all(torch.equal(a, b) for a, b in zip(pair, new))
    with pytest.raises(TypeError, match="^block_mask: pass"):
        peers.flex_reduction_attention(q, q, q, block_mask, s, block_mask=block_mask, **kw)
