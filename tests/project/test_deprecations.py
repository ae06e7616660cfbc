"""Every deprecated spelling still works for one release, warns, and gives the same result.

Each shim goes through :func:`plsh_ref.validation.warn_deprecated`; each test below calls
the old spelling under ``pytest.warns(DeprecationWarning)`` and compares with the new one,
so a shim that stops warning, stops working or changes the result fails here.
"""

from __future__ import annotations

import numpy as np
import pytest

from plsh_ref.alibi import alibi_slopes
from plsh_ref.partition import PartitionSample

# ------------------------------------------------------------- plsh_ref.validation


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
