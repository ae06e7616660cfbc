"""The Triton path on partitions drawn from general Pólya kernels (plsh_ref.kernels):
compiled on CUDA, interpreted on CPU (tests/_triton_interp.py), against the float64
reference under the SPEC section 6 rule. Small shapes: the interpreter is slow."""

from __future__ import annotations

import _triton_interp  # noqa: F401  (picks compiled/interpreted before triton kernels load)
import numpy as np
import pytest
import torch

from plsh_ref.attention import plsh_attention as ref_plsh_attention
from plsh_ref.kernels import Exponential, KerpleLog, KerplePower, Mixture
from plsh_ref.partition import count_bias, counts, draw_partition
from plsh_ref.testing.baseline import plain_attention_numpy
from plsh_ref.testing.tolerance import assert_close_to_reference

_triton_interp.load("triton")
from plsh_fast import plsh_attention  # noqa: E402

pytestmark = pytest.mark.triton

KERNELS = {
    "kerple_log": [KerpleLog(0.7, 0.5), KerpleLog(3.0, 1.0)],
    "kerple_power": [KerplePower(2.0, 0.2), KerplePower(0.5, 0.5)],
    "mixture": [Mixture([0.5, 0.5], [Exponential(2.0), KerpleLog(1.0, 1.0)])] * 2,
}


@pytest.mark.parametrize("sampler", ["iid", "stratified"])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_triton_path_equals_reference_on_kernel_partitions(name, sampler):
    n, s = 40, 4
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 16, generator=gen) for _ in range(3))
    part = draw_partition(KERNELS[name], s, seed=5, sampler=sampler)
    out, lse = _triton_interp.call(
        plsh_attention, q, k, v, partition=part, return_lse=True, backend="triton"
    )
    qn, kn, vn = (t.double().numpy() for t in (q, k, v))
    ref, ref_lse = ref_plsh_attention(qn, kn, vn, partition=part, causal=True, return_lse=True)
    pos = np.arange(n)
    bias = count_bias(counts(part, pos, pos, causal=True), s)
    base, base_lse = plain_attention_numpy(qn, kn, vn, bias, scale=None, dtype="float32")
    assert_close_to_reference(out.double().numpy(), ref, base, "float32")
    assert_close_to_reference(lse.double().numpy(), ref_lse, base_lse, "float32", name="lse")
