"""Attention test problems: a small, reproducible description and the arrays it stands for.

A :class:`ProblemSpec` is a handful of integers and strings (shapes, dtype, position
mode, a data seed). :meth:`ProblemSpec.build` turns it into an :class:`AttentionProblem`
holding numpy arrays, deterministically: the same spec gives the same arrays on every
machine. Hypothesis draws and shrinks specs (:mod:`plsh_ref.testing.strategies`), the
``plsh verify`` report prints them, and a failing case can be rebuilt from its spec alone.

Everything here is numpy only (no torch): ``bfloat16`` problems hold float32 arrays whose
values are exactly representable in bfloat16, and a torch kernel receives them cast to
``torch.bfloat16`` (:mod:`plsh_ref.testing.suite`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..alibi import alibi_slopes
from ..partition import PartitionSample, draw_partition
from ..validation import check_int
from .reference import KINDS, reference_for

__all__ = [
    "DTYPES",
    "POSITION_MODES",
    "SLOPE_MODES",
    "AttentionProblem",
    "ProblemSpec",
    "round_to_dtype",
]

#: dtype names a problem may have; ``bfloat16`` needs a torch kernel
DTYPES = ("float16", "bfloat16", "float32", "float64")
#: ways of choosing positions, ``default`` (keys ``0..n_k-1``, queries end-aligned, passed
#: as ``None``), ``explicit`` (increasing positions with gaps, far from 0) or ``left_padding``
#: (the default layout shifted left by ``pad`` tokens, so padding sits at negative positions)
POSITION_MODES = ("default", "explicit", "left_padding")
#: slope choices, ``standard`` (Press et al.'s slopes) or ``random`` (log-uniform)
SLOPE_MODES = ("standard", "random")


def round_to_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float64 ``x`` to the nearest value of ``dtype`` (round to nearest even).

    Parameters
    ----------
    x : numpy.ndarray
        float64 values.
    dtype : {"float16", "bfloat16", "float32", "float64"}

    Returns
    -------
    numpy.ndarray
        ``x`` in the numpy dtype of that name; ``bfloat16`` values are returned as float32
        (numpy has no bfloat16), each exactly representable in bfloat16.

    Raises
    ------
    ValueError
        If ``dtype`` is not one of :data:`DTYPES`.

    Examples
    --------
    >>> from plsh_ref.testing.problems import round_to_dtype
    >>> round_to_dtype(np.array([1 + 2**-9]), "bfloat16").tolist()
    [1.0]
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype: must be one of {DTYPES}, got {dtype!r}")
    x = np.asarray(x, dtype=np.float64)
    if dtype != "bfloat16":
        return x.astype(dtype)
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    # Round to nearest even on the 16 low bits (finite inputs only: ours are Gaussian).
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


@dataclass(frozen=True)
class ProblemSpec:
    """A reproducible description of one attention problem (no arrays).

    Attributes
    ----------
    kind : {"alibi", "plsh"}
        Exact ALiBi attention, or PLSH attention given a partition sample.
    batch, num_heads, num_heads_kv : int
        ``num_heads % num_heads_kv == 0`` (grouped-query attention when they differ).
    n_q, n_k : int
        Query and key sequence lengths (``>= 0``).
    head_dim, head_dim_v : int
        Query/key and value head dimensions (``>= 1``).
    dtype : str
        One of :data:`DTYPES`: the dtype of query, key, value and of the kernel's output.
    causal : bool
        Keys with ``p_key > p_query`` are masked.
    positions : str
        One of :data:`POSITION_MODES`.
    pad : int
        Left-padding length (``left_padding`` mode) or gap scale (``explicit`` mode).
    slopes : str
        One of ``"standard"`` or ``"random"``.
    num_samples : int
        Samples ``s`` of the partition (``plsh`` problems; ignored for ``alibi``).
    scale : float or None
        Logit scale; ``None`` means the default ``1 / sqrt(head_dim)``.
    amplitude : float
        Standard deviation of query and key entries (large values give peaked softmax).
    data_seed : int
        Seed of every random array of the problem (and of the partition sample).

    Raises
    ------
    ValueError, TypeError
        On inconsistent or out-of-range fields (message starts with the field name).
    """

    kind: str = "alibi"
    batch: int = 1
    num_heads: int = 2
    num_heads_kv: int = 2
    n_q: int = 8
    n_k: int = 8
    head_dim: int = 4
    head_dim_v: int = 4
    dtype: str = "float32"
    causal: bool = True
    positions: str = "default"
    pad: int = 0
    slopes: str = "standard"
    num_samples: int = 4
    scale: float | None = None
    amplitude: float = 1.0
    data_seed: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind: must be one of {KINDS}, got {self.kind!r}")
        for name in ("batch", "num_heads", "num_heads_kv", "head_dim", "head_dim_v", "num_samples"):
            check_int(name, getattr(self, name), minimum=1)
        for name in ("n_q", "n_k", "pad", "data_seed"):
            check_int(name, getattr(self, name), minimum=0)
        if self.num_heads % self.num_heads_kv:
            raise ValueError(
                f"num_heads_kv: must divide num_heads={self.num_heads}, got {self.num_heads_kv}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: must be one of {DTYPES}, got {self.dtype!r}")
        if self.positions not in POSITION_MODES:
            raise ValueError(f"positions: must be one of {POSITION_MODES}, got {self.positions!r}")
        if self.slopes not in SLOPE_MODES:
            raise ValueError(f"slopes: must be one of {SLOPE_MODES}, got {self.slopes!r}")
        if self.scale is not None and not (np.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"scale: must be None or finite and > 0, got {self.scale!r}")
        if not (np.isfinite(self.amplitude) and self.amplitude > 0):
            raise ValueError(f"amplitude: must be finite and > 0, got {self.amplitude!r}")

    def replace(self, **changes) -> ProblemSpec:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def summary(self) -> str:
        """One line naming the fields that matter, e.g. for a failure report."""
        gqa = f"/{self.num_heads_kv}kv" if self.num_heads_kv != self.num_heads else ""
        text = (
            f"{self.kind} {self.dtype} B={self.batch} H={self.num_heads}{gqa} "
            f"n_q={self.n_q} n_k={self.n_k} d={self.head_dim}/{self.head_dim_v} "
            f"{'causal' if self.causal else 'bidirectional'} positions={self.positions}"
        )
        if self.positions != "default":
            text += f"(pad={self.pad})"
        if self.kind == "plsh":
            text += f" s={self.num_samples}"
        if self.scale is not None:
            text += f" scale={self.scale:.6g}"
        return (
            text + f" slopes={self.slopes} amplitude={self.amplitude:g} data_seed={self.data_seed}"
        )

    def build(self) -> AttentionProblem:
        """The arrays of this problem, drawn from ``numpy.random.default_rng(data_seed)``.

        Returns
        -------
        AttentionProblem
        """
        rng = np.random.default_rng(self.data_seed)
        q_shape = (self.batch, self.num_heads, self.n_q, self.head_dim)
        k_shape = (self.batch, self.num_heads_kv, self.n_k, self.head_dim)
        v_shape = (self.batch, self.num_heads_kv, self.n_k, self.head_dim_v)
        query = round_to_dtype(self.amplitude * rng.standard_normal(q_shape), self.dtype)
        key = round_to_dtype(self.amplitude * rng.standard_normal(k_shape), self.dtype)
        value = round_to_dtype(rng.standard_normal(v_shape), self.dtype)
        if self.slopes == "standard":
            slopes = alibi_slopes(self.num_heads)
        else:
            slopes = np.exp2(rng.uniform(-10.0, 1.0, size=self.num_heads))
        qpos, kpos = self._positions(rng)
        partition = None
        if self.kind == "plsh":
            partition = draw_partition(1.0 / slopes, self.num_samples, seed=self.data_seed)
        return AttentionProblem(
            spec=self,
            query=query,
            key=key,
            value=value,
            slopes=slopes,
            partition=partition,
            query_positions=qpos,
            key_positions=kpos,
        )

    def _positions(self, rng):
        if self.positions == "default":
            return None, None
        if self.positions == "left_padding":
            kpos = np.arange(self.n_k, dtype=np.int64) - self.pad
            qpos = np.arange(self.n_q, dtype=np.int64) + (self.n_k - self.n_q - self.pad)
            return qpos, kpos
        # explicit: a chunk deep inside a long sequence, with gaps of 1..pad+1 tokens
        start = int(rng.integers(0, 10**6))
        kpos = start + np.cumsum(rng.integers(1, self.pad + 2, size=self.n_k), dtype=np.int64)
        last = int(kpos[-1]) if self.n_k else start
        qpos = last - self.n_q + np.cumsum(rng.integers(1, 3, size=self.n_q), dtype=np.int64)
        return qpos.astype(np.int64), kpos.astype(np.int64)


@dataclass(frozen=True, eq=False)
class AttentionProblem:
    """The arrays of one attention problem, built by :meth:`ProblemSpec.build`.

    Attributes
    ----------
    spec : ProblemSpec
        The description this problem was built from.
    query, key, value : numpy.ndarray
        Shapes ``(batch, num_heads, n_q, head_dim)``, ``(batch, num_heads_kv, n_k,
        head_dim)``, ``(batch, num_heads_kv, n_k, head_dim_v)``; dtype ``spec.dtype``
        (float32 holding bfloat16 values for ``bfloat16``); entries never all zero.
    slopes : numpy.ndarray
        float64, ``(num_heads,)``, inverse tokens.
    partition : PartitionSample or None
        Drawn from ``1 / slopes`` for ``plsh`` problems, else ``None``.
    query_positions, key_positions : numpy.ndarray or None
        int64 ``(n_q,)``, ``(n_k,)``; ``None`` for the default positions.
    """

    spec: ProblemSpec
    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    slopes: np.ndarray
    partition: PartitionSample | None
    query_positions: np.ndarray | None
    key_positions: np.ndarray | None

    @property
    def kind(self) -> str:
        """``"alibi"`` or ``"plsh"``."""
        return self.spec.kind

    @property
    def dtype(self) -> str:
        """Name of the dtype of the inputs and of the expected output."""
        return self.spec.dtype

    def kernel_kwargs(self) -> dict:
        """Keyword arguments of the kernel contract for this problem's kind.

        ``alibi``: ``slopes, causal, scale, query_positions, key_positions``;
        ``plsh``: ``partition, causal, scale, query_positions, key_positions``
        (numpy values; :mod:`plsh_ref.testing.suite` converts them for torch kernels).
        """
        kwargs = {
            "causal": self.spec.causal,
            "scale": self.spec.scale,
            "query_positions": self.query_positions,
            "key_positions": self.key_positions,
        }
        if self.kind == "alibi":
            return {"slopes": self.slopes, **kwargs}
        return {"partition": self.partition, **kwargs}

    def reference(self) -> tuple[np.ndarray, np.ndarray]:
        """Float64 reference ``(output, lse)`` on the (dtype-rounded) inputs.

        Returns
        -------
        (output, lse) : tuple of numpy.ndarray
            float64, ``(batch, num_heads, n_q, head_dim_v)`` and ``(batch, num_heads, n_q)``.
        """
        return reference_for(self.kind)(self.query, self.key, self.value, **self.kernel_kwargs())

    def log_weight(self) -> np.ndarray:
        """The dense additive bias of this problem, float64 ``(num_heads, n_q, n_k)``.

        ALiBi: ``-m_h |p_i - p_j|``; PLSH: ``log M~_ij``; ``-inf`` where masked. Used by
        the plain-attention baseline of the tolerance rule (SPEC section 6).
        """
        from ..alibi import alibi_bias, resolve_positions
        from ..partition import empirical_mean

        qpos, kpos = resolve_positions(
            self.spec.n_q, self.spec.n_k, self.query_positions, self.key_positions
        )
        if self.kind == "alibi":
            return alibi_bias(self.slopes, qpos, kpos, causal=self.spec.causal)
        with np.errstate(divide="ignore"):
            return np.log(empirical_mean(self.partition, qpos, kpos, causal=self.spec.causal))
