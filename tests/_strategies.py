"""Hypothesis strategy for small float64 attention problems used by the plsh_ref tests.

Unlike :mod:`plsh_ref.testing.strategies` (a toolkit for checking other people's kernels
in several dtypes), this draws float64 problems with arbitrary integer positions:
unsorted, repeated, negative, far from zero, so that the reference is exercised outside
the layouts a kernel would see. Layout names as
:data:`plsh_ref.testing.strategies.POSITION_LAYOUTS` (``unsorted``, ``shifted``); the
integers are drawn by Hypothesis here so that they shrink.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from _oracles import random_qkv
from hypothesis import strategies as st

from plsh_ref.alibi import alibi_slopes, resolve_positions
from plsh_ref.partition import PartitionSample, draw_partition

__all__ = ["Problem", "problems"]


@dataclass
class Problem:
    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    slopes: np.ndarray
    partition: PartitionSample
    causal: bool
    query_positions: np.ndarray | None
    key_positions: np.ndarray | None
    scale: float | None

    @property
    def positions(self):
        """The positions actually used (defaults resolved)."""
        return resolve_positions(
            self.query.shape[2], self.key.shape[2], self.query_positions, self.key_positions
        )

    @property
    def kwargs(self):
        return dict(
            causal=self.causal,
            scale=self.scale,
            query_positions=self.query_positions,
            key_positions=self.key_positions,
        )

    @property
    def num_heads(self):
        return self.query.shape[1]


@st.composite
def problems(
    draw,
    *,
    max_seq_len=10,
    max_heads=4,
    max_batch=2,
    max_head_dim=5,
    max_samples=6,
    positions=("default", "unsorted", "shifted"),
):
    """Draw a :class:`Problem`; shapes may be empty, n_q != n_k, grouped-query heads."""
    num_heads = draw(st.integers(1, max_heads))
    num_heads_kv = draw(st.sampled_from([g for g in range(1, num_heads + 1) if num_heads % g == 0]))
    n_k = draw(st.integers(0, max_seq_len))
    n_q = draw(st.one_of(st.just(n_k), st.integers(0, max_seq_len)))
    head_dim = draw(st.integers(1, max_head_dim))
    head_dim_v = draw(st.integers(1, max_head_dim))
    batch = draw(st.integers(1, max_batch))
    seed = draw(st.integers(0, 2**32 - 1))
    q, k, v = random_qkv(
        seed,
        batch,
        num_heads,
        num_heads_kv,
        n_q,
        n_k,
        head_dim,
        head_dim_v,
        magnitude=draw(st.sampled_from([0.5, 1.0, 2.0])),
    )
    slopes = draw(
        st.one_of(
            st.just(alibi_slopes(num_heads)),
            st.lists(st.floats(2.0**-8, 2.0), min_size=num_heads, max_size=num_heads).map(
                lambda x: np.array(x, dtype=np.float64)
            ),
        )
    )
    mode = draw(st.sampled_from(positions))
    qpos = kpos = None
    if mode == "unsorted":  # arbitrary integers: unsorted, repeated, negative
        qpos = np.array(
            draw(st.lists(st.integers(-20, 20), min_size=n_q, max_size=n_q)), dtype=np.int64
        )
        kpos = np.array(
            draw(st.lists(st.integers(-20, 20), min_size=n_k, max_size=n_k)), dtype=np.int64
        )
    elif mode == "shifted":  # the default layout shifted far from zero, end-aligned
        base = draw(st.integers(-(2**40), 2**40))
        kpos = base + np.arange(n_k, dtype=np.int64)
        qpos = base + n_k - n_q + np.arange(n_q, dtype=np.int64)
    part = draw_partition(
        1.0 / slopes, draw(st.integers(1, max_samples)), draw(st.integers(0, 2**32 - 1))
    )
    return Problem(
        q,
        k,
        v,
        slopes,
        part,
        draw(st.booleans()),
        qpos,
        kpos,
        draw(st.one_of(st.none(), st.floats(0.1, 2.0))),
    )
