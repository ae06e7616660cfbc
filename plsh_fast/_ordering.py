"""Sorting token positions: the fast paths compute on rows sorted by position.

Bins are non-decreasing in the position (SPEC section 2), so with sorted positions the keys
sharing a query's bin form one contiguous index range: the CPU path finds block ranges by
``searchsorted`` and the Triton plan bounds every query tile's key range. Both backends
therefore run on rows permuted into ascending position order (a stable sort, so that
repeated positions keep their relative order) and permute the results back. Sorted
positions, the usual case, cost one comparison pass and no copy.
"""

from __future__ import annotations

import torch

__all__ = ["position_order", "sort_positions", "take_rows"]


def position_order(positions: torch.Tensor):
    """Stable ascending order of ``positions`` and its inverse, or ``(None, None)``.

    Parameters
    ----------
    positions : torch.Tensor
        int64 ``(n,)`` token positions on any device.

    Returns
    -------
    (order, inverse) : tuple of torch.Tensor or tuple of None
        int64 ``(n,)`` with ``positions[order]`` non-decreasing and
        ``order[inverse] == arange(n)``; ``(None, None)`` when ``positions`` is already
        non-decreasing (then no permutation is needed). Reading the answer synchronises
        a CUDA device once.
    """
    if positions.numel() < 2 or bool((positions[1:] >= positions[:-1]).all()):
        return None, None
    order = torch.sort(positions, stable=True).indices
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return order, inverse


def take_rows(order, *tensors: torch.Tensor, dim: int = 2):
    """``tensors`` with their ``dim`` axis permuted by ``order``.

    Parameters
    ----------
    order : torch.Tensor or None
        int64 ``(n,)`` permutation (from :func:`position_order`) on the tensors' device;
        ``None`` returns the tensors unchanged (no copy).
    *tensors : torch.Tensor
        Each with length ``n`` along ``dim`` (``(batch, heads, n, ...)`` for the default
        ``dim = 2``), any dtype.

    Returns
    -------
    tuple of torch.Tensor
        ``t.index_select(dim, order)`` for each tensor (contiguous copies), in order.
    """
    if order is None:
        return tensors
    return tuple(t.index_select(dim, order) for t in tensors)


def sort_positions(positions: torch.Tensor, order) -> torch.Tensor:
    """``positions[order]``: int64 ``(n,)`` positions in ascending order.

    ``order`` is :func:`position_order`'s permutation, or ``None`` (positions already
    sorted; returned as they are).
    """
    return positions if order is None else positions[order]
