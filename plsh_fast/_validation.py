"""Torch-side argument checks of :func:`plsh_fast.plsh_attention`.

Every check raises :class:`ValueError` or :class:`TypeError` whose message starts with the
name of the offending argument, before any kernel is launched. Scalar and host-array checks
reuse :mod:`plsh_ref.validation`.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from plsh_ref.validation import as_positions, check_num_samples  # re-exported

__all__ = [
    "BACKENDS",
    "MAX_HEAD_DIM_TRITON",
    "MAX_NUM_SAMPLES_TRITON",
    "check_backend",
    "check_backend_num_samples",
    "check_finite",
    "check_num_samples",
    "check_bins_in_range",
    "check_positions",
    "check_qkv",
]

BACKENDS = ("auto", "cpu", "triton")
#: Largest head_dim of the Triton kernels (SPEC section 5).
MAX_HEAD_DIM_TRITON = 256
#: Largest num_samples of the Triton kernels: the weights ``C_ij <= s`` of the softmax
#: numerator, cast to the value dtype for the ``P V`` MMA, stay finite in float16.
MAX_NUM_SAMPLES_TRITON = 32768

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_qkv(query, key, value) -> None:
    """Check types, devices, dtypes, ranks and shapes of ``query``, ``key``, ``value``.

    Shapes: ``(batch, num_heads, n_q, head_dim)``, ``(batch, num_heads_kv, n_k, head_dim)``,
    ``(batch, num_heads_kv, n_k, head_dim_v)`` with ``num_heads % num_heads_kv == 0``,
    ``head_dim >= 1``, ``head_dim_v >= 1``. All three share one device and one floating
    dtype (float16, bfloat16, float32, or float64 on the CPU).

    Raises
    ------
    TypeError
        A non-tensor or a sparse tensor, a non-floating dtype, mixed dtypes, or float64 on a
        non-CPU device.
    ValueError
        Different devices, wrong ranks, inconsistent batch/length/head_dim, head counts that
        do not divide.
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: must be a torch.Tensor, got {type(t).__name__}")
        if t.layout != torch.strided:
            raise TypeError(f"{name}: must be a dense (strided) tensor, got layout {t.layout}")
        if t.dim() != 4:
            raise ValueError(
                f"{name}: must have 4 dimensions (batch, heads, seq_len, head_dim), "
                f"got shape {tuple(t.shape)}"
            )
        if t.dtype not in _FLOAT_DTYPES:
            raise TypeError(
                f"{name}: dtype must be float16, bfloat16, float32 or float64, got {t.dtype}"
            )
    for name, t in (("key", key), ("value", value)):
        if t.device != query.device:
            raise ValueError(f"{name}: on device {t.device}, query on {query.device}")
        if t.dtype != query.dtype:
            raise TypeError(f"{name}: dtype {t.dtype} differs from query dtype {query.dtype}")
    if query.dtype == torch.float64 and query.device.type != "cpu":
        raise TypeError("query: float64 is supported on the CPU path only")
    b, h, _, d = query.shape
    if key.shape[0] != b or value.shape[0] != b:
        raise ValueError(
            f"key: batch sizes differ: query {b}, key {key.shape[0]}, value {value.shape[0]}"
        )
    if d < 1 or value.shape[3] < 1:
        raise ValueError(f"query: head_dim and head_dim_v must be >= 1, got {d}, {value.shape[3]}")
    if key.shape[3] != d:
        raise ValueError(f"key: head_dim {key.shape[3]} differs from query head_dim {d}")
    if value.shape[1] != key.shape[1] or value.shape[2] != key.shape[2]:
        raise ValueError(
            f"value: (num_heads_kv, n_k) = {tuple(value.shape[1:3])} differs from "
            f"key's {tuple(key.shape[1:3])}"
        )
    if h < 1 or key.shape[1] < 1 or h % key.shape[1] != 0:
        raise ValueError(f"key: num_heads_kv={key.shape[1]} must divide num_heads={h} (both >= 1)")


def check_finite(query, key, value) -> None:
    """Refuse NaN/inf in ``query``, ``key``, ``value`` (one extra pass over each tensor).

    Raises
    ------
    ValueError
        Naming the first tensor that holds a non-finite value.
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.numel() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name}: contains NaN or infinite values")


def check_positions(name: str, positions, length: int, device) -> torch.Tensor | None:
    """Explicit positions as an int64 tensor on ``device``, or ``None`` if not given.

    Integers (or integral floats) of magnitude ``< 2**53``, one-dimensional, of length
    ``length`` (validated on the host by :func:`plsh_ref.validation.as_positions`).
    """
    if positions is None:
        return None
    arr = as_positions(name, positions, length=length)
    return torch.from_numpy(np.ascontiguousarray(arr)).to(device)


def check_backend(backend: str, device: torch.device, head_dim: int, head_dim_v: int) -> str:
    """Resolve ``backend`` ("auto", "cpu", "triton") for tensors on ``device``.

    ``"auto"``: the CPU path for CPU tensors, Triton otherwise. ``"triton"`` on CPU tensors
    runs the kernels in the Triton interpreter and needs ``TRITON_INTERPRET=1`` in the
    environment before Triton is imported (tests only).

    Raises
    ------
    ValueError
        Unknown backend; ``"cpu"`` with non-CPU tensors; ``"triton"`` on CPU without
        ``TRITON_INTERPRET=1``; head_dim above 256 on the Triton path; tensors on a
        device other than CPU or CUDA (e.g. ``meta``; argument name ``query``).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend: must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        backend = "cpu" if device.type == "cpu" else "triton"
    if backend == "cpu" and device.type != "cpu":
        raise ValueError(f"backend: 'cpu' needs CPU tensors, got device {device}")
    if backend == "triton":
        if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                "backend: 'triton' on CPU tensors needs TRITON_INTERPRET=1 set "
                "before triton is imported (a CUDA-only option otherwise)"
            )
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"query: device {device} is not supported (CPU or CUDA tensors)")
        if max(head_dim, head_dim_v) > MAX_HEAD_DIM_TRITON:
            raise ValueError(
                f"backend: head_dim up to {MAX_HEAD_DIM_TRITON} on the Triton path, "
                f"got {max(head_dim, head_dim_v)}"
            )
    return backend


def check_backend_num_samples(backend: str, num_samples: int) -> None:
    """Refuse more than :data:`MAX_NUM_SAMPLES_TRITON` samples on the Triton path.

    Raises
    ------
    ValueError
        ``backend == "triton"`` (resolved) and ``num_samples > MAX_NUM_SAMPLES_TRITON``.
    """
    if backend == "triton" and num_samples > MAX_NUM_SAMPLES_TRITON:
        raise ValueError(
            f"num_samples: at most {MAX_NUM_SAMPLES_TRITON} on the Triton path (the count "
            f"weights C_ij <= s must stay finite in float16), got {num_samples}; use "
            "backend='cpu' for more"
        )


def check_bins_in_range(
    partition, query_positions: torch.Tensor, key_positions: torch.Tensor
) -> None:
    """Refuse a partition whose bin indices leave int64 for these positions.

    Bins are monotone in the position, so only the smallest and largest positions need
    checking; they go through :func:`plsh_ref.partition.bins`, which raises the same
    ``ValueError`` as the reference (argument ``partition``). Reads two integers of each
    position tensor (a device synchronisation on CUDA).

    Raises
    ------
    ValueError
        A bin index ``floor((p - offset) / pitch)`` outside ``[-2**63, 2**63)``.

    References
    ----------
    SPEC section 2 (bins in binary64, stored as int64).
    """
    from plsh_ref.partition import bins

    ends = [
        int(v)
        for t in (query_positions, key_positions)
        if t.numel()
        for v in torch.stack([t.min(), t.max()]).tolist()
    ]
    if ends:
        bins(partition, np.array([min(ends), max(ends)], dtype=np.int64))
