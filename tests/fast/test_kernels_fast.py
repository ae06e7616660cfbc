"""The fast path on partitions drawn from general Pólya kernels (plsh_ref.kernels).

Nothing downstream of the partition depends on the pitch law, so
:func:`plsh_fast.plsh_attention` with a partition drawn from KERPLE-log (heavy-tailed, long
blocks), KERPLE-power or a mixture must equal :func:`plsh_ref.attention.plsh_attention` on
the same sample under the SPEC section 6 rule, with the bins bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from plsh_fast import plsh_attention  # noqa: E402
from plsh_fast._partition import bins as fast_bins  # noqa: E402
from plsh_ref.attention import plsh_attention as ref_plsh_attention  # noqa: E402
from plsh_ref.kernels import Exponential, KerpleLog, KerplePower, Mixture  # noqa: E402
from plsh_ref.partition import bins, count_bias, counts, draw_partition  # noqa: E402
from plsh_ref.testing.baseline import plain_attention_numpy  # noqa: E402
from plsh_ref.testing.tolerance import assert_close_to_reference  # noqa: E402

torch.set_num_threads(1)

KERNELS = {
    "kerple_log": [KerpleLog(0.7, 0.5), KerpleLog(1.5, 0.1), KerpleLog(0.3, 2.0), KerpleLog(3.0, 1.0)],
    "kerple_power": [KerplePower(0.5, 0.5), KerplePower(2.0, 0.2), KerplePower(0.1, 1.0),
                     KerplePower(1.0, 0.8)],
    "mixture": [Mixture([0.5, 0.5], [Exponential(2.0), KerpleLog(1.0, 1.0)])] * 4,
}  # fmt: skip


def _qkv(n_q, n_k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, n_q, 16, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, n_k, 16, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, n_k, 8, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("sampler", ["iid", "stratified"])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_bins_bit_for_bit(name, sampler):
    part = draw_partition(KERNELS[name], 16, seed=4, sampler=sampler)
    pos = np.concatenate([np.arange(300), np.array([10**6, 2**40 + 3])])
    pitch = torch.from_numpy(part.pitch.copy())
    offset = torch.from_numpy(part.offset.copy())
    got = fast_bins(pitch, offset, torch.from_numpy(pos)).numpy()
    np.testing.assert_array_equal(got, bins(part, pos))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_fast_path_equals_reference_on_kernel_partitions(name, dtype, causal):
    n_q, n_k, s = 40, 64, 8
    q, k, v = _qkv(n_q, n_k, dtype, seed=1)
    part = draw_partition(KERNELS[name], s, seed=7)
    out, lse = plsh_attention(q, k, v, partition=part, causal=causal, return_lse=True)
    qn, kn, vn = (t.double().numpy() for t in (q, k, v))
    ref, ref_lse = ref_plsh_attention(qn, kn, vn, partition=part, causal=causal, return_lse=True)
    qpos, kpos = np.arange(n_k - n_q, n_k), np.arange(n_k)
    bias = count_bias(counts(part, qpos, kpos, causal=causal), s)
    dt = str(dtype).removeprefix("torch.")
    base, base_lse = plain_attention_numpy(qn, kn, vn, bias, scale=None, dtype=dt)
    assert_close_to_reference(out.double().numpy(), ref, base, dt)
    assert_close_to_reference(lse.double().numpy(), ref_lse, base_lse, dt, name="lse")


def test_kernel_partition_changes_the_output():
    # negative control: another kernel's partition gives another function (the comparison
    # above is not vacuous)
    q, k, v = _qkv(40, 64, torch.float64, seed=1)
    a = plsh_attention(q, k, v, partition=draw_partition(KERNELS["kerple_log"], 8, seed=7))
    b = plsh_attention(q, k, v, partition=draw_partition(KERNELS["kerple_power"], 8, seed=7))
    assert (a - b).abs().max() > 1e-3
