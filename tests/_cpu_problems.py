"""Small random attention problems for the torch CPU path tests (forward and backward).

A problem holds torch inputs (possibly non-contiguous views) in one dtype, their exact
float64 values as numpy arrays, a partition sample and explicit or default positions, and
knows its float64 reference (:func:`plsh_ref.attention.plsh_attention`) and the dense
``log M~`` bias of the tolerance-rule baseline (SPEC section 6).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st

from plsh_ref.alibi import resolve_positions
from plsh_ref.attention import plsh_attention as reference_attention
from plsh_ref.partition import PartitionSample, count_bias, counts, draw_partition
from plsh_ref.testing.baseline import plain_attention_torch
from plsh_ref.testing.problems import DTYPES as TOOLKIT_DTYPES
from plsh_ref.testing.strategies import draw_positions
from plsh_ref.testing.tolerance import assert_close_to_reference

#: torch dtype of each dtype name of the toolkit (plsh_ref.testing.problems.DTYPES)
DTYPES = {name: getattr(torch, name) for name in TOOLKIT_DTYPES}
#: layouts of plsh_ref.testing.strategies.draw_positions exercised by the CPU path tests
POSITION_MODES = ("default", "shifted", "gaps", "unsorted", "left_padding")
LAYOUTS = ("contiguous", "bnhd", "strided")


def as_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values as ``x`` (B, H, n, d) in another memory layout (a view)."""
    if layout == "contiguous":
        return x
    if layout == "bnhd":  # (batch, seq, heads, dim) storage
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    big = torch.zeros(*x.shape[:3], 2 * x.shape[3] + 1, dtype=x.dtype)  # padded last dim
    big[..., 1::2] = x
    return big[..., 1::2]


@dataclass
class Problem:
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    partition: PartitionSample
    causal: bool
    scale: float | None
    query_positions: np.ndarray | None
    key_positions: np.ndarray | None
    dtype: str

    def numpy64(self):
        """Float64 numpy copies of the (dtype-rounded) inputs."""
        return tuple(
            x.detach().to(torch.float64).numpy() for x in (self.query, self.key, self.value)
        )

    @property
    def kwargs(self) -> dict:
        """Keyword arguments of :func:`plsh_fast.plsh_attention` for this problem."""
        return {
            "partition": self.partition,
            "causal": self.causal,
            "scale": self.scale,
            "query_positions": self.query_positions,
            "key_positions": self.key_positions,
        }

    def reference(self):
        """Float64 ``(output, lse)`` of :func:`plsh_ref.attention.plsh_attention`."""
        q, k, v = self.numpy64()
        return reference_attention(
            q,
            k,
            v,
            partition=self.partition,
            causal=self.causal,
            scale=self.scale,
            query_positions=self.query_positions,
            key_positions=self.key_positions,
            return_lse=True,
        )

    def log_weight(self) -> np.ndarray:
        """Dense ``log M~`` (``-inf`` where the count is 0), ``(num_heads, n_q, n_k)``."""
        qpos, kpos = resolve_positions(
            self.query.shape[2], self.key.shape[2], self.query_positions, self.key_positions
        )
        c = counts(self.partition, qpos, kpos, causal=self.causal)
        return count_bias(c, self.partition.num_samples)


def make_problem(
    seed: int,
    *,
    batch=1,
    num_heads=2,
    group=1,
    n_q=20,
    n_k=20,
    head_dim=5,
    head_dim_v=3,
    dtype="float32",
    causal=True,
    mode="default",
    num_samples=4,
    log2_sigma=(0.0, 6.0),
    layout="contiguous",
    scale=None,
    requires_grad=False,
) -> Problem:
    """A random problem; ``sigma_h = 2**u`` with ``u`` uniform in ``log2_sigma``."""
    rng = np.random.default_rng(seed)
    tdtype = DTYPES[dtype]
    num_kv = num_heads // group

    def tensor(*shape):
        x = torch.from_numpy(rng.standard_normal(shape)).to(tdtype)
        x = as_layout(x, layout)
        return x.requires_grad_(requires_grad)

    query = tensor(batch, num_heads, n_q, head_dim)
    key = tensor(batch, num_kv, n_k, head_dim)
    value = tensor(batch, num_kv, n_k, head_dim_v)
    sigma = np.exp2(rng.uniform(*log2_sigma, size=num_heads))
    partition = draw_partition(sigma, num_samples, seed=seed)
    qpos, kpos = draw_positions(mode, n_q, n_k, rng)
    return Problem(query, key, value, partition, causal, scale, qpos, kpos, dtype)


@st.composite
def problems(
    draw, *, dtypes=tuple(DTYPES), max_len=70, max_batch=2, layouts=LAYOUTS, requires_grad=False
):
    """Hypothesis strategy over :func:`make_problem` arguments."""
    num_kv = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 2]))
    return make_problem(
        draw(st.integers(0, 2**31 - 1)),
        batch=draw(st.integers(1, max_batch)),
        num_heads=num_kv * group,
        group=group,
        n_q=draw(st.integers(0, max_len)),
        n_k=draw(st.integers(0, max_len)),
        head_dim=draw(st.integers(1, 9)),
        head_dim_v=draw(st.integers(1, 9)),
        dtype=draw(st.sampled_from(dtypes)),
        causal=draw(st.booleans()),
        mode=draw(st.sampled_from(POSITION_MODES)),
        num_samples=draw(st.sampled_from([1, 3, 8])),
        log2_sigma=(-1.0, draw(st.floats(0.0, 8.0))),
        layout=draw(st.sampled_from(layouts)),
        scale=draw(st.sampled_from([None, 0.7])),
        requires_grad=requires_grad,
    )


def check_against_reference(problem, out, lse):
    """``out`` and ``lse`` of ``problem`` pass the SPEC section 6 rule (float64 reference)."""
    ref_out, ref_lse = problem.reference()
    base_out, base_lse = plain_attention_torch(
        *problem.numpy64(), problem.log_weight(), scale=problem.scale, dtype=problem.dtype
    )
    assert out.dtype == problem.query.dtype
    assert lse.dtype == (torch.float64 if problem.dtype == "float64" else torch.float32)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert_close_to_reference(out, ref_out, base_out, problem.dtype, name="output")
    assert_close_to_reference(lse, ref_lse, base_lse, problem.dtype, name="lse")


#: Fixed problems whose CPU forward outputs, LSE and gradients are saved in
#: ``tests/fast/cpu/data/cpu_saved_outputs.npz`` (``tests/fast/cpu/data/save_cpu_outputs.py``)
#: and compared bit for bit by ``tests/fast/cpu/test_cpu_saved_outputs.py``. Together they
#: reach band heads and tile groups (small and large pitches), per-row and cell-pattern
#: count biases, rows without an admissible key, grouped-query heads, a value head_dim
#: different from the query's, unsorted and repeated positions, cross-attention and
#: non-contiguous layouts.
SAVED_CASES = {
    "mixed_pitches_causal": dict(
        seed=101,
        num_heads=4,
        group=2,
        n_q=130,
        n_k=130,
        head_dim=7,
        head_dim_v=4,
        causal=True,
        mode="default",
        num_samples=8,
        log2_sigma=(-1.0, 8.0),
    ),
    "cross_unsorted": dict(
        seed=102,
        num_heads=2,
        n_q=90,
        n_k=77,
        head_dim=5,
        head_dim_v=6,
        causal=False,
        mode="unsorted",
        num_samples=4,
        log2_sigma=(0.0, 6.0),
        layout="strided",
    ),
    "gaps_few_cells": dict(
        seed=103,
        num_heads=3,
        n_q=64,
        n_k=100,
        head_dim=4,
        head_dim_v=4,
        causal=True,
        mode="gaps",
        num_samples=16,
        log2_sigma=(5.0, 8.0),
    ),
    "left_padding_bidirectional": dict(
        seed=104,
        batch=2,
        num_heads=2,
        n_q=96,
        n_k=96,
        head_dim=4,
        head_dim_v=3,
        causal=False,
        mode="left_padding",
        num_samples=3,
        log2_sigma=(-1.0, 3.0),
        layout="bnhd",
        scale=0.7,
    ),
}
#: Module settings (and worker threads) each saved case runs under: name -> settings.
SAVED_VARIANTS = {
    "fused": {},
    "plain_small_chunks": {"USE_FUSED_TILES": False, "CHUNK_ELEMENTS": 1024},
    "two_threads": {"threads": 2},
}
#: ``(case, variant)`` pairs saved, each in float32 and float64.
SAVED_RUNS = [
    (case, variant) for case in SAVED_CASES for variant in ("fused", "plain_small_chunks")
] + [("mixed_pitches_causal", "two_threads")]
SAVED_DTYPES = ("float32", "float64")
#: the arrays saved per run
SAVED_FIELDS = ("out", "lse", "grad_query", "grad_key", "grad_value")


def saved_problem(case: str, dtype: str) -> Problem:
    """The saved case ``case`` in ``dtype`` (deterministic: numpy generators by seed)."""
    kwargs = dict(SAVED_CASES[case])
    return make_problem(kwargs.pop("seed"), dtype=dtype, **kwargs)


def cpu_outputs(problem: Problem, cpu_module) -> dict:
    """Forward ``out``/``lse`` and ``grad_query``/``grad_key``/``grad_value`` of the CPU path.

    Calls ``cpu_module.plsh_forward_cpu`` and ``cpu_module.plsh_backward_cpu`` directly
    (no dispatch), the backward with a seeded ``grad_out`` and ``grad_lse`` (0 on rows
    without an admissible key), under the current module settings and thread count.
    Returns numpy arrays.
    """
    from plsh_fast._partition import partition_tensors

    pitch, offset = partition_tensors(problem.partition, "cpu")
    qpos, kpos = resolve_positions(
        problem.query.shape[2],
        problem.key.shape[2],
        problem.query_positions,
        problem.key_positions,
    )
    qpos, kpos = torch.from_numpy(qpos), torch.from_numpy(kpos)
    scale = problem.scale if problem.scale is not None else problem.query.shape[-1] ** -0.5
    args = (pitch, offset, qpos, kpos, scale, problem.causal)
    q, k, v = problem.query, problem.key, problem.value
    out, lse = cpu_module.plsh_forward_cpu(q, k, v, *args)
    grad_out, grad_lse = saved_gradients(problem, lse)
    grads = cpu_module.plsh_backward_cpu(
        q, k, v, out, lse, grad_out.to(out.dtype), *args, grad_lse=grad_lse.to(lse.dtype)
    )
    values = (out, lse, *grads)
    return {name: x.detach().numpy() for name, x in zip(SAVED_FIELDS, values)}


def saved_gradients(problem: Problem, lse: torch.Tensor):
    """Seeded float64 ``(grad_out, grad_lse)`` of a saved case; ``grad_lse`` is 0 where
    ``lse`` is ``-inf`` (rows without an admissible key)."""
    rng = np.random.default_rng(7)
    b, h, n_q, _ = problem.query.shape
    grad_out = torch.from_numpy(rng.standard_normal((b, h, n_q, problem.value.shape[-1])))
    grad_lse = torch.from_numpy(rng.standard_normal((b, h, n_q)))
    return grad_out, torch.where(torch.isfinite(lse), grad_lse, 0.0)
