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
from typing import Any, cast

import numpy as np

from ..alibi import alibi_slopes
from ..partition import PartitionSample, draw_partition
from ..validation import check_int
from .reference import KINDS, reference_for

__all__ = [
    "DTYPES",
    "PADDED_MODES",
    "POSITION_MODES",
    "RANDOM_POSITION_MODES",
    "SLOPE_MODES",
    "AttentionProblem",
    "ProblemSpec",
    "round_to_dtype",
]

#: largest position offset a spec may ask for (far beyond the 2**20 the battery uses)
MAX_OFFSET = 2**40

#: dtype names a problem may have; ``bfloat16`` needs a torch kernel
DTYPES = ("float16", "bfloat16", "float32", "float64")
#: ways of choosing positions, ``default`` (keys ``0..n_k-1``, queries end-aligned, passed
#: as ``None``), ``explicit`` (increasing positions with gaps, far from 0), ``left_padding``
#: (the default layout shifted left by ``pad`` tokens, so padding sits at negative
#: positions), ``per_sequence`` (explicit positions with gaps, different for every sequence,
#: shape ``(batch, n)``) or ``padded`` (an HF left-padded batch: each sequence has up to
#: ``pad`` pad tokens (spread evenly from 0), an ``attention_mask`` ``(batch, n_k)`` and
#: ``position_ids``
#: ``(batch, n)`` counting its real tokens, 1 at pad slots as HF writes them),
#: ``right_padded`` (the same with the pad tokens at the end of each sequence) or ``packed``
#: (a packed variable-length batch: ``batch = 1``, ``n_q = n_k``, ``pad`` sequences
#: concatenated, described by ``cu_seqlens``; positions restart at 0 in each sequence and
#: no token attends across sequences, as FlashAttention's ``varlen`` functions)
POSITION_MODES = (
    "default",
    "explicit",
    "left_padding",
    "per_sequence",
    "padded",
    "right_padded",
    "packed",
)
#: the position modes random cases draw from by default (the others are battery cases)
RANDOM_POSITION_MODES = POSITION_MODES[:5]
#: modes with an ``attention_mask``
PADDED_MODES = ("padded", "right_padded")
#: slope choices, ``standard`` (Press et al.'s slopes) or ``random`` (log-uniform)
SLOPE_MODES = ("standard", "random")


def round_to_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float64 ``x`` to ``dtype`` as torch casts it (round to nearest even).

    float16 and float32: the nearest value. bfloat16: through float32, two roundings, as
    torch's float64 to bfloat16 cast does; it differs from the nearest bfloat16 only just
    off a bfloat16 tie (``1 + 2^-8 + 2^-30`` gives 1.0, the nearest is ``1 + 2^-7``).

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

    References
    ----------
    IEEE 754 rounding to nearest, ties to even (bfloat16: the upper 16 bits of binary32);
    ``docs/validation.md``, "The tolerance rule" (the dtype-rounded inputs).
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
        Left-padding length (``left_padding``), largest pad length of a sequence
        (``padded``, ``right_padded``), gap scale (``explicit``, ``per_sequence``) or number
        of packed sequences (``packed``, ``>= 1``).
    offset : int
        Added to every real position (``0 <= offset <= 2**40``): positions far from 0. With
        ``default`` positions and ``offset > 0`` the shifted positions are passed explicitly.
    slopes : str
        One of ``"standard"`` or ``"random"``.
    max_bias : float
        Maximum bias of the standard slope rule (:func:`plsh_ref.alibi.alibi_slopes`).
    head_start, num_heads_total : int
        Tensor-parallel head slice: the kernel sees heads ``head_start .. head_start +
        num_heads - 1`` of ``num_heads_total`` (0: ``num_heads``, no slice); standard
        slopes are then the global ones of those heads.
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

    References
    ----------
    ``docs/validation.md``, "What is run: the battery, then random problems" and "In CI"
    (``--spec``); SPEC section 5 (shapes, positions, padding).
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
    offset: int = 0
    slopes: str = "standard"
    max_bias: float = 8.0
    head_start: int = 0
    num_heads_total: int = 0
    num_samples: int = 4
    scale: float | None = None
    amplitude: float = 1.0
    data_seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind: must be one of {KINDS}, got {self.kind!r}")
        for name in ("batch", "num_heads", "num_heads_kv", "head_dim", "head_dim_v", "num_samples"):
            check_int(name, getattr(self, name), minimum=1)
        for name in ("n_q", "n_k", "pad", "offset", "data_seed", "head_start", "num_heads_total"):
            check_int(name, getattr(self, name), minimum=0)
        if self.num_heads_total and self.head_start + self.num_heads > self.num_heads_total:
            raise ValueError(
                f"num_heads_total: must be >= head_start + num_heads = "
                f"{self.head_start + self.num_heads}, got {self.num_heads_total}"
            )
        if self.head_start and not self.num_heads_total:
            raise ValueError("head_start: needs num_heads_total (the global head count)")
        if not (np.isfinite(self.max_bias) and self.max_bias > 0):
            raise ValueError(f"max_bias: must be finite and > 0, got {self.max_bias!r}")
        if self.positions == "packed" and (
            self.batch != 1 or self.n_q != self.n_k or not 1 <= self.pad <= max(self.n_k, 1)
        ):
            raise ValueError(
                f"positions: 'packed' needs batch=1, n_q=n_k and 1 <= pad (sequences) <= n_k, "
                f"got batch={self.batch}, n_q={self.n_q}, n_k={self.n_k}, pad={self.pad}"
            )
        if self.offset > MAX_OFFSET:
            raise ValueError(f"offset: must be <= 2**40, got {self.offset}")
        if self.positions in PADDED_MODES and self.n_q > self.n_k:
            raise ValueError(
                f"positions: {self.positions!r} needs n_q <= n_k (queries are the last tokens), "
                f"got n_q={self.n_q} > n_k={self.n_k}"
            )
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

    def replace(self, **changes: Any) -> ProblemSpec:
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
        if self.offset:
            text += f" offset={self.offset}"
        if self.kind == "plsh":
            text += f" s={self.num_samples}"
        if self.scale is not None:
            text += f" scale={self.scale:.6g}"
        if self.num_heads_total:
            stop = self.head_start + self.num_heads
            text += f" heads={self.head_start}..{stop - 1}/{self.num_heads_total}"
        if self.max_bias != 8.0:
            text += f" max_bias={self.max_bias:g}"
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
            slopes = self.standard_slopes()
        else:
            slopes = np.exp2(rng.uniform(-10.0, 1.0, size=self.num_heads))
        qpos, kpos, mask = self._positions(rng)
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
            attention_mask=mask,
            cu_seqlens=self.cu_seqlens(),
        )

    def standard_slopes(self) -> np.ndarray:
        """Press et al.'s slopes of this spec's heads (of the global heads of a slice).

        Returns
        -------
        numpy.ndarray
            float64 ``(num_heads,)``: ``alibi_slopes(num_heads_total, max_bias)[head_start :
            head_start + num_heads]``.
        """
        total = self.num_heads_total or self.num_heads
        slopes = alibi_slopes(total, max_bias=self.max_bias)
        return slopes[self.head_start : self.head_start + self.num_heads].copy()

    def cu_seqlens(self) -> np.ndarray | None:
        """Start offsets of the packed sequences, int64 ``(pad + 1,)`` (``None`` unless packed).

        The lengths differ (the first sequences are the shortest) and add up to ``n_k``.
        """
        if self.positions != "packed":
            return None
        k = self.pad
        # deterministic, unequal lengths: 1, 2, 3, ... parts, scaled to n_k
        weights = np.arange(1, k + 1, dtype=np.float64)
        bounds = np.floor(np.cumsum(weights) / weights.sum() * self.n_k).astype(np.int64)
        bounds = np.maximum(bounds, np.arange(1, k + 1))
        bounds[-1] = self.n_k
        return np.concatenate([[0], bounds]).astype(np.int64)

    def _positions(self, rng):
        """``(query_positions, key_positions, attention_mask)`` of this spec."""
        if self.positions == "default":
            if not self.offset:
                return None, None, None
            kpos = np.arange(self.n_k, dtype=np.int64)
            qpos = np.arange(self.n_q, dtype=np.int64) + (self.n_k - self.n_q)
            return qpos + self.offset, kpos + self.offset, None
        if self.positions == "left_padding":
            kpos = np.arange(self.n_k, dtype=np.int64) - self.pad + self.offset
            qpos = np.arange(self.n_q, dtype=np.int64) + (self.n_k - self.n_q - self.pad)
            return qpos + self.offset, kpos, None
        if self.positions == "packed":
            return None, None, None
        if self.positions == "right_padded":
            most = min(self.pad, self.n_k)
            pads = (np.arange(self.batch) * most) // max(self.batch - 1, 1)
            if self.batch == 1:
                pads = np.array([most])
            mask = np.arange(self.n_k)[None, :] < (self.n_k - pads)[:, None]
            kpos = np.where(mask, np.cumsum(mask, axis=1) - 1 + self.offset, 1).astype(np.int64)
            return kpos[:, self.n_k - self.n_q :].copy(), kpos, mask.astype(np.int64)
        if self.positions == "padded":
            # pad lengths spread evenly from 0 to min(pad, n_k) (one sequence only: the most)
            most = min(self.pad, self.n_k)
            pads = (np.arange(self.batch) * most) // max(self.batch - 1, 1)
            if self.batch == 1:
                pads = np.array([most])
            mask = np.arange(self.n_k)[None, :] >= pads[:, None]
            kpos = np.where(mask, np.cumsum(mask, axis=1) - 1 + self.offset, 1).astype(np.int64)
            return kpos[:, self.n_k - self.n_q :].copy(), kpos, mask.astype(np.int64)
        rows = [
            self._explicit(rng)
            for _ in range(self.batch if self.positions == "per_sequence" else 1)
        ]
        qpos, kpos = (np.stack([r[i] for r in rows]) for i in (0, 1))
        if self.positions == "explicit":
            qpos, kpos = qpos[0], kpos[0]
        return qpos, kpos, None

    def _explicit(self, rng):
        # a chunk deep inside a long sequence, with gaps of 1..pad+1 tokens
        start = int(rng.integers(0, 10**6)) + self.offset
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
        int64 ``(n_q,)``, ``(n_k,)``, or ``(batch, n_q)``, ``(batch, n_k)`` per sequence;
        ``None`` for the default positions.
    attention_mask : numpy.ndarray or None
        int64 0/1 ``(batch, n_k)`` (1 = keep) for ``padded`` and ``right_padded`` problems,
        else ``None``.
    cu_seqlens : numpy.ndarray or None
        int64 ``(num_sequences + 1,)`` start offsets of a ``packed`` problem, else ``None``.

    References
    ----------
    ``docs/validation.md``, "The kernel contracts" (the arguments table); SPEC section 5.
    """

    spec: ProblemSpec
    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    slopes: np.ndarray
    partition: PartitionSample | None
    query_positions: np.ndarray | None
    key_positions: np.ndarray | None
    attention_mask: np.ndarray | None = None
    cu_seqlens: np.ndarray | None = None

    @property
    def kind(self) -> str:
        """``"alibi"`` or ``"plsh"``."""
        return self.spec.kind

    @property
    def dtype(self) -> str:
        """Name of the dtype of the inputs and of the expected output."""
        return self.spec.dtype

    def kernel_kwargs(
        self,
        *,
        slopes: str = "given",
        attention_mask: bool = True,
        cu_seqlens: bool = False,
        head_slice: bool = False,
    ) -> dict:
        """Keyword arguments of the kernel contract for this problem's kind.

        ``alibi``: ``slopes, causal, scale, query_positions, key_positions``;
        ``plsh``: ``partition, causal, scale, query_positions, key_positions``
        (numpy values; :mod:`plsh_ref.testing.suite` converts them for torch kernels).

        Parameters
        ----------
        slopes : {"given", "standard"}
            ``"standard"``: no ``slopes`` argument (the kernel computes Press et al.'s
            slopes itself; the problem's slopes are then the standard ones).
        attention_mask : bool
            Include ``attention_mask`` (``None`` unless the problem is padded).
        cu_seqlens : bool
            Include ``cu_seqlens`` (``None`` unless the problem is ``packed``).
        head_slice : bool
            Include ``head_start`` and ``num_heads_total`` (the tensor-parallel slice; ``0``
            and ``num_heads`` without one).

        Raises
        ------
        ValueError
            If ``slopes`` is unknown.
        """
        if slopes not in ("given", "standard"):
            raise ValueError(f"slopes: must be 'given' or 'standard', got {slopes!r}")
        kwargs = {
            "causal": self.spec.causal,
            "scale": self.spec.scale,
            "query_positions": self.query_positions,
            "key_positions": self.key_positions,
        }
        if attention_mask:
            kwargs["attention_mask"] = self.attention_mask
        if cu_seqlens:
            kwargs["cu_seqlens"] = self.cu_seqlens
        if head_slice:
            kwargs["head_start"] = self.spec.head_start
            kwargs["num_heads_total"] = self.spec.num_heads_total or self.spec.num_heads
        if self.kind == "plsh":
            return {"partition": self.partition, **kwargs}
        return kwargs if slopes == "standard" else {"slopes": self.slopes, **kwargs}

    def reference(self) -> tuple[np.ndarray, np.ndarray]:
        """Float64 reference ``(output, lse)`` on the (dtype-rounded) inputs.

        Returns
        -------
        (output, lse) : tuple of numpy.ndarray
            float64, ``(batch, num_heads, n_q, head_dim_v)`` and ``(batch, num_heads, n_q)``.
        """
        kwargs = self.kernel_kwargs()
        if self.kind == "alibi":
            kwargs["slopes"] = self.slopes
        fn = reference_for(self.kind)
        if self.cu_seqlens is None:
            return fn(self.query, self.key, self.value, **kwargs)
        # packed: each sequence alone, positions from 0 (+ offset), then concatenated
        parts = []
        for start, stop in zip(self.cu_seqlens[:-1], self.cu_seqlens[1:]):
            pos = np.arange(stop - start, dtype=np.int64) + self.spec.offset
            kw = {**kwargs, "query_positions": pos, "key_positions": pos}
            kw.pop("attention_mask", None)
            sl = slice(int(start), int(stop))
            parts.append(fn(self.query[:, :, sl], self.key[:, :, sl], self.value[:, :, sl], **kw))
        out = np.concatenate([p[0] for p in parts], axis=2)
        lse = np.concatenate([p[1] for p in parts], axis=2)
        return out, lse

    def positions_and_keep(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per-sequence positions and keep masks (:func:`plsh_ref.alibi.resolve_batch_positions`).

        Returns
        -------
        (query_positions, key_positions, query_keep, key_keep) : tuple of numpy.ndarray
            int64 ``(batch, n_q)``, ``(batch, n_k)``; bool ``(batch, n_q)``, ``(batch, n_k)``.
        """
        from ..alibi import resolve_batch_positions

        spec = self.spec
        if self.cu_seqlens is not None:
            lengths = np.diff(self.cu_seqlens)
            pos = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths]) + spec.offset
            keep = np.ones((1, spec.n_k), dtype=bool)
            return pos[None].copy(), pos[None].copy(), keep, keep.copy()
        return resolve_batch_positions(
            spec.batch,
            spec.n_q,
            spec.n_k,
            self.query_positions,
            self.key_positions,
            self.attention_mask,
        )

    def log_weight(self) -> np.ndarray:
        """The dense additive bias of this problem, float64 ``(batch, num_heads, n_q, n_k)``.

        ALiBi: ``-m_h |p_i - p_j|``; PLSH: ``log M~_ij``; ``-inf`` where masked (causal,
        pad keys, pad query rows). Used by the plain-attention baseline of the tolerance
        rule (SPEC section 6).
        """
        from ..alibi import alibi_bias
        from ..partition import empirical_mean

        qpos, kpos, q_keep, k_keep = self.positions_and_keep()
        per = []
        for b in range(self.spec.batch):
            if self.kind == "alibi":
                w = alibi_bias(self.slopes, qpos[b], kpos[b], causal=self.spec.causal)
            else:
                with np.errstate(divide="ignore"):
                    partition = cast(PartitionSample, self.partition)  # kind "plsh" has one
                    w = np.log(empirical_mean(partition, qpos[b], kpos[b], causal=self.spec.causal))
            per.append(w)
        shape = (0, self.spec.num_heads, self.spec.n_q, self.spec.n_k)
        log_w = np.stack(per) if per else np.zeros(shape)
        keep = q_keep[:, None, :, None] & k_keep[:, None, None, :]
        if self.cu_seqlens is not None:  # no token attends across packed sequences
            seq = np.repeat(np.arange(len(self.cu_seqlens) - 1), np.diff(self.cu_seqlens))
            keep = keep & (seq[:, None] == seq[None, :])[None, None]
        return np.where(keep, log_w, -np.inf)
