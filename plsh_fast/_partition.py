"""Moving a :class:`plsh_ref.partition.PartitionSample` to torch, and bins in torch.

The partition sample is always drawn on the host by :func:`plsh_ref.partition.draw_partition`
(numpy, seeded per global head), so the reference and the fast paths compute the same
function. This module only converts it to float64 device tensors and evaluates the bins
``floor((float64(p) - offset) / pitch)`` with torch's binary64 subtraction and division,
which are the correctly rounded IEEE 754 operations that :func:`plsh_ref.partition.bins`
uses (SPEC section 2): the two give identical int64 bins (tested bit for bit in
``tests/fast/cpu/test_cpu_path.py``).
"""

from __future__ import annotations

import numpy as np
import torch

from plsh_ref.partition import PartitionSample

__all__ = ["bins", "count_bias", "partition_tensors"]


def partition_tensors(partition: PartitionSample, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pitch, offset)`` of ``partition`` as float64 tensors ``(num_heads, num_samples)`` on ``device``.

    The values are copied bit for bit (float64 to float64).
    """
    pitch = torch.from_numpy(np.array(partition.pitch, dtype=np.float64))
    offset = torch.from_numpy(np.array(partition.offset, dtype=np.float64))
    return pitch.to(device), offset.to(device)


def count_bias(counts: torch.Tensor, num_samples: int, dtype=torch.float64) -> torch.Tensor:
    """``log(C / s)`` of count tensors (``-inf`` where ``C = 0``), the torch form of
    :func:`plsh_ref.partition.count_bias`.

    The same operations (one binary64 division ``C / s``, then ``log``), so in float64 the
    two agree bit for bit on the same counts (tested); the result is then rounded once to
    ``dtype``. No argument checks and no host synchronisation (callers inside the fast
    paths, also under ``torch.compile``, pass counts they built).

    Parameters
    ----------
    counts : torch.Tensor
        Integer or floating counts in ``0..num_samples``, any shape, any device.
    num_samples : int
        ``s >= 1``.
    dtype : torch.dtype
        Of the result (default float64).

    Returns
    -------
    torch.Tensor
        The shape and device of ``counts``.

    References
    ----------
    Wolfson & Wagner (2026), Theorem 2.2; SPEC section 3.
    """
    return torch.log(counts.to(torch.float64) / num_samples).to(dtype)


def bins(pitch: torch.Tensor, offset: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Bin index ``floor((float64(p) - offset) / pitch)`` of every position under every hash.

    Parameters
    ----------
    pitch, offset : torch.Tensor
        float64, ``(num_heads, num_samples)``.
    positions : torch.Tensor
        int64, ``(n,)``, ``|p| < 2**53`` (so that ``float64(p)`` is exact).

    Returns
    -------
    torch.Tensor
        int64, ``(num_heads, num_samples, n)``, equal bit for bit to
        :func:`plsh_ref.partition.bins` on the same sample and positions.

    References
    ----------
    SPEC section 2 (bins are defined in binary64; never in float32).
    """
    if pitch.dtype != torch.float64 or offset.dtype != torch.float64:
        raise TypeError(
            f"pitch: pitch and offset must be float64, got {pitch.dtype}, {offset.dtype}"
        )
    if positions.dtype != torch.int64:
        raise TypeError(f"positions: must be int64, got {positions.dtype}")
    p = positions.to(torch.float64)
    quotient = p[None, None, :] - offset[..., None]
    return quotient.div_(pitch[..., None]).floor_().to(torch.int64)
