"""How a left-padded sequence is numbered when no positions are given (docs/dropin.md).

With an ``attention_mask`` and no positions, :func:`plsh_fast.plsh_attention` (and the nn
modules, which call it) number the *slots* ``n_k - n_q + i`` / ``0..n_k-1``, pads included,
while :class:`plsh_fast.decoding.PLSHDecodingCache` numbers the *real tokens* ``0, 1, ...``
(HF's ``attention_mask.cumsum(-1) - 1``). A partition's bins depend on absolute positions,
so a left-padded sequence gives its unpadded PLSH result on its real tokens:

* through the cache, without positions;
* through ``plsh_attention`` / the modules only when the positions are passed
  (``cumsum - 1``); without them it gives the unpadded result *shifted by the padding*
  (real tokens at positions ``pad, pad + 1, ...``), which is another function.

Both defaults are kept; these tests state them.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from plsh_fast import plsh_attention  # noqa: E402
from plsh_fast.decoding import PLSHDecodingCache  # noqa: E402
from plsh_fast.nn import PLSHAttention  # noqa: E402
from plsh_ref.partition import draw_partition  # noqa: E402

PAD, REAL = 5, 12  # one sequence: 5 pad slots, then 12 real tokens
ATOL = 1e-12  # float64: the same function up to summation order


def _case():
    partition = draw_partition(np.array([2.0, 5.0]), 4, seed=21)
    gen = torch.Generator().manual_seed(22)
    q, k, v = (torch.randn(1, 2, PAD + REAL, 8, generator=gen, dtype=torch.float64) for _ in "qkv")
    mask = torch.ones(1, PAD + REAL, dtype=torch.bool)
    mask[0, :PAD] = False
    return partition, q, k, v, mask


def _unpadded(partition, q, k, v, positions=None):
    real = [t[:, :, PAD:] for t in (q, k, v)]
    return plsh_attention(*real, partition=partition, query_positions=positions,
                          key_positions=positions, return_lse=True)  # fmt: skip


def _assert_same(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=ATOL)


def _far(a, b):
    return (a - b).abs().max().item() > 1e-3


def test_plsh_attention_with_a_mask_numbers_slots():
    partition, q, k, v, mask = _case()
    out, lse = plsh_attention(q, k, v, partition=partition, attention_mask=mask, return_lse=True)
    unpadded, unpadded_lse = _unpadded(partition, q, k, v)
    shifted, shifted_lse = _unpadded(partition, q, k, v, positions=torch.arange(PAD, PAD + REAL))
    # the real tokens sit at their slots PAD..PAD+REAL-1: the unpadded result shifted
    _assert_same(out[:, :, PAD:], shifted)
    _assert_same(lse[:, :, PAD:], shifted_lse)
    # which is not the unpadded sequence's result (other bins)
    assert _far(out[:, :, PAD:], unpadded) and _far(lse[:, :, PAD:], unpadded_lse)
    # the module does the same (it calls plsh_attention)
    core = PLSHAttention(2, 4, seed=0).eval()
    core.set_partition(partition)
    _assert_same(core(q, k, v, attention_mask=mask)[:, :, PAD:], shifted)


def test_plsh_attention_with_a_mask_and_positions_gives_the_unpadded_result():
    partition, q, k, v, mask = _case()
    position_ids = (mask.to(torch.int64).cumsum(-1) - 1).clamp_min(0)  # HF, pads clamped
    out, lse = plsh_attention(
        q, k, v, partition=partition, query_positions=position_ids, key_positions=position_ids,
        attention_mask=mask, return_lse=True,
    )  # fmt: skip
    unpadded, unpadded_lse = _unpadded(partition, q, k, v)
    _assert_same(out[:, :, PAD:], unpadded)
    _assert_same(lse[:, :, PAD:], unpadded_lse)
    assert (out[:, :, :PAD] == 0).all() and torch.isneginf(lse[:, :, :PAD]).all()
    core = PLSHAttention(2, 4, seed=0).eval()
    core.set_partition(partition)
    out_module = core(q, k, v, query_positions=position_ids, key_positions=position_ids,
                      attention_mask=mask)  # fmt: skip
    _assert_same(out_module[:, :, PAD:], unpadded)


def test_decoding_cache_with_a_mask_numbers_real_tokens():
    partition, q, k, v, mask = _case()
    out, lse = PLSHDecodingCache(partition).update(q, k, v, attention_mask=mask, return_lse=True)
    unpadded, unpadded_lse = _unpadded(partition, q, k, v)
    _assert_same(out[:, :, PAD:], unpadded)
    _assert_same(lse[:, :, PAD:], unpadded_lse)
    # so without positions the cache and plsh_attention differ on a padded batch
    sliced = plsh_attention(q, k, v, partition=partition, attention_mask=mask)
    assert _far(out[:, :, PAD:], sliced[:, :, PAD:])
    # decoding on: the next token is real token REAL (position REAL), as unpadded
    gen = torch.Generator().manual_seed(23)
    q1, k1, v1 = (torch.randn(1, 2, 1, 8, generator=gen, dtype=torch.float64) for _ in "qkv")
    cache = PLSHDecodingCache(partition)
    cache.update(q, k, v, attention_mask=mask)
    step = cache.update(q1, k1, v1)
    full = plsh_attention(
        torch.cat([q[:, :, PAD:], q1], 2), torch.cat([k[:, :, PAD:], k1], 2),
        torch.cat([v[:, :, PAD:], v1], 2), partition=partition,
    )  # fmt: skip
    _assert_same(step, full[:, :, -1:])
