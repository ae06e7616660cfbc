"""Padded batches for the fast path: per-sequence positions and a key-padding mask.

The kernels (:mod:`plsh_fast.cpu`, :mod:`plsh_fast.triton_forward`,
:mod:`plsh_fast.triton_backward`) take positions ``(n,)`` shared by the batch and no mask.
A padded batch (SPEC section 5, HF conventions) is reduced to such calls without touching
them: the sequences that share their real positions and their mask form a *group*; per
group, the real queries and the kept keys are compacted (``index_select``) and the kernel
runs on them with 1-D positions. A left-padded sequence therefore gives exactly the bins,
the counts and (to rounding of the batch layout) the outputs of the same sequence
unpadded, and what a pad slot holds (its key, value or position) cannot change a real
token's output.

Conventions, identical to :func:`plsh_ref.alibi.resolve_batch_positions` (the float64
reference):

* ``query_positions`` / ``key_positions``: ``(n,)`` shared or ``(batch, n)`` per sequence
  (HF ``position_ids``; ``(1, n)`` counts as shared). Integer tensors (int64 or any
  integer dtype, converted to int64); array-likes are converted on the host in eager mode.
* ``attention_mask``: ``(batch, n_k)``, bool or integer 0/1, 1/True = keep, 0 = pad.
* A query slot ``i`` is a pad slot when ``n_q <= n_k`` and its end-aligned key slot
  ``n_k - n_q + i`` is padded (the query is that token): its output is 0 and its LSE
  ``-inf``, and it gets zero gradient. Positions at pad slots (query or key) are ignored,
  any int64 value.
* A real query whose kept keys are all inadmissible (all padded, or causally masked)
  gets output 0 and LSE ``-inf`` as every empty row does.

Synchronisation: without a mask and with 1-D positions nothing here reads tensor values.
With a mask or per-sequence positions, :func:`group_batch` reads them on the host (mask
values 0/1, ``torch.unique`` over the per-sequence signatures, the kept indices): one
device synchronisation per call, unavoidable because the number of groups and the
compacted lengths are data-dependent shapes. It runs inside the kernel call (eagerly, or
inside the ``plsh::attention`` custom operator under ``torch.compile``), so its errors are
raised in both modes.

References
----------
SPEC section 5 (padded batches); ``plsh_ref.attention`` (the reference's per-sequence
semantics).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = [
    "MAX_ABS_POSITION",
    "Group",
    "check_attention_mask",
    "default_positions",
    "check_positions",
    "check_position_range",
    "group_batch",
    "real_positions",
    "resolve_positions",
]

#: Positions must satisfy ``|p| < 2**53`` so that ``float64(p)`` is exact (SPEC section 2).
MAX_ABS_POSITION = 2**53


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def _host_positions(name: str, value) -> torch.Tensor:
    """An array-like of integer positions as an int64 CPU tensor (eager only)."""
    arr = np.asarray(value)
    if arr.dtype == np.bool_:
        raise TypeError(f"{name}: must hold integers, got dtype bool")
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name}: contains NaN or infinite values")
        if np.any(arr != np.floor(arr)):
            raise TypeError(f"{name}: positions must be integers, got non-integral values")
        # compared in float64: 2**53 overflows a float16 (a RuntimeWarning, not a refusal)
        if arr.size and np.max(np.abs(arr.astype(np.float64))) >= MAX_ABS_POSITION:
            raise ValueError(f"{name}: |position| must be < 2**53 so that float64 is exact")
    elif not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name}: must hold integers, got dtype {arr.dtype}")
    return torch.from_numpy(np.ascontiguousarray(arr.astype(np.int64)))


def default_positions(n_q: int, n_k: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Default positions as int64 tensors: keys ``0..n_k-1``, queries aligned to the end.

    The torch (device-side, ``torch.compile``-friendly) form of
    :func:`plsh_ref.alibi.default_positions`, with the same values (tested): queries
    ``n_k - n_q + (0..n_q-1)`` (SPEC section 1). The lengths are trusted (tensor shapes).

    Returns
    -------
    (query_positions, key_positions) : tuple of torch.Tensor
        int64 ``(n_q,)`` and ``(n_k,)`` on ``device``.
    """
    return (
        torch.arange(n_k - n_q, n_k, dtype=torch.int64, device=device),
        torch.arange(n_k, dtype=torch.int64, device=device),
    )


def check_positions(name: str, positions, batch: int, length: int, device) -> torch.Tensor | None:
    """Positions as an int64 tensor ``(length,)`` or ``(batch, length)`` on ``device``.

    Parameters
    ----------
    name : str
        ``"query_positions"`` or ``"key_positions"`` (for messages).
    positions : torch.Tensor or array_like of int, or None
        ``(length,)`` shared by the batch, ``(batch, length)`` per sequence, or
        ``(1, length)`` (treated as shared). Integer dtypes; array-likes may hold integral
        floats (converted on the host, eager mode only).
    batch, length : int
        Batch size and sequence length of the matching query or key.
    device : torch.device
        Device of the query.

    Returns
    -------
    torch.Tensor or None
        int64, on ``device``; ``None`` when ``positions`` is ``None``. The magnitude bound
        ``|p| < 2**53`` needs values and is checked by :func:`check_position_range` (eager)
        or :func:`group_batch`.

    Raises
    ------
    TypeError
        A bool, floating or complex tensor (positions are integers), non-integral or
        non-numeric array-likes, an array-like under ``torch.compile``.
    ValueError
        A wrong rank or shape, a ``meta`` tensor.
    """
    if positions is None:
        return None
    if not isinstance(positions, torch.Tensor):
        if _compiling():
            raise TypeError(f"{name}: must be an integer torch.Tensor under torch.compile")
        positions = _host_positions(name, positions)
    if positions.device.type == "meta":
        raise ValueError(f"{name}: a meta tensor has no values; pass positions on {device}")
    if positions.dtype == torch.bool or positions.is_floating_point() or positions.is_complex():
        raise TypeError(f"{name}: must be an integer tensor, got dtype {positions.dtype}")
    if positions.dim() == 2 and positions.shape[0] == 1 and batch != 1:
        positions = positions[0]
    if positions.dim() == 1:
        if positions.shape[0] != length:
            raise ValueError(f"{name}: must have length {length}, got {positions.shape[0]}")
    elif positions.dim() == 2:
        if tuple(positions.shape) != (batch, length):
            raise ValueError(
                f"{name}: per-sequence positions must have shape (batch, {length}) = "
                f"{(batch, length)}, got {tuple(positions.shape)}"
            )
    else:
        raise ValueError(
            f"{name}: must have shape ({length},) or (batch, {length}), "
            f"got {tuple(positions.shape)}"
        )
    return positions.to(device=device, dtype=torch.int64)


def check_attention_mask(attention_mask, batch: int, n_k: int, device) -> torch.Tensor | None:
    """The key-padding mask as a bool or integer tensor ``(batch, n_k)`` on ``device``.

    Shapes and dtypes only; that integer entries are 0 or 1 is checked where the mask is
    read (:func:`group_batch`), so that it holds under ``torch.compile`` too.

    Raises
    ------
    TypeError
        A dtype other than bool or integer (e.g. a float mask), an array-like under
        ``torch.compile``.
    ValueError
        A shape other than ``(batch, n_k)``, a ``meta`` tensor.
    """
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, torch.Tensor):
        if _compiling():
            raise TypeError("attention_mask: must be a torch.Tensor under torch.compile")
        arr = np.asarray(attention_mask)
        if not (arr.dtype == np.bool_ or np.issubdtype(arr.dtype, np.integer)):
            raise TypeError(f"attention_mask: must hold bool or integer 0/1, got dtype {arr.dtype}")
        attention_mask = torch.from_numpy(np.ascontiguousarray(arr))
    if attention_mask.is_floating_point() or attention_mask.is_complex():
        raise TypeError(
            f"attention_mask: must hold bool or integer 0/1, got dtype {attention_mask.dtype}"
        )
    if tuple(attention_mask.shape) != (batch, n_k):
        raise ValueError(
            f"attention_mask: must have shape (batch, n_k) = {(batch, n_k)}, "
            f"got {tuple(attention_mask.shape)}"
        )
    if attention_mask.device.type == "meta":
        raise ValueError(f"attention_mask: a meta tensor has no values; pass it on {device}")
    return attention_mask.to(device)


def resolve_positions(
    query_positions, key_positions, attention_mask, batch: int, n_q: int, n_k: int, device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The positions and mask of one call: ``(query_positions, key_positions, mask)``.

    The one resolution of the ``query_positions``, ``key_positions`` and
    ``attention_mask`` arguments of the torch entry points (:func:`plsh_fast.plsh_attention`,
    the dense paths of :class:`plsh_fast.nn.PLSHAttention`): each checked
    (:func:`check_positions`, :func:`check_attention_mask`) and the omitted positions
    replaced by :func:`default_positions`.

    Returns
    -------
    (torch.Tensor, torch.Tensor, torch.Tensor or None)
        int64 positions ``(n_q,)`` or ``(batch, n_q)``, ``(n_k,)`` or ``(batch, n_k)``, and
        the mask ``(batch, n_k)`` (or ``None``), all on ``device``.

    Raises
    ------
    TypeError, ValueError
        As :func:`check_positions` and :func:`check_attention_mask`.
    """
    qpos = check_positions("query_positions", query_positions, batch, n_q, device)
    kpos = check_positions("key_positions", key_positions, batch, n_k, device)
    mask = check_attention_mask(attention_mask, batch, n_k, device)
    if qpos is None or kpos is None:
        default_q, default_k = default_positions(n_q, n_k, device)
        qpos = default_q if qpos is None else qpos
        kpos = default_k if kpos is None else kpos
    return qpos, kpos, mask


def check_position_range(name: str, positions: torch.Tensor) -> None:
    """Refuse ``|p| >= 2**53`` (reads the values: one synchronisation on CUDA).

    Raises
    ------
    ValueError
        Naming ``name``.
    """
    if positions.numel() and bool((positions.abs() >= MAX_ABS_POSITION).any()):
        raise ValueError(f"{name}: |position| must be < 2**53 so that float64 is exact")


def _keeps(attention_mask, batch: int, n_q: int, n_k: int, device):
    """``(query_keep, key_keep)`` bool ``(batch, n_q)``, ``(batch, n_k)`` of a bool mask."""
    if attention_mask is None:
        return (
            torch.ones(batch, n_q, dtype=torch.bool, device=device),
            torch.ones(batch, n_k, dtype=torch.bool, device=device),
        )
    if n_q <= n_k:
        query_keep = attention_mask[:, n_k - n_q :]
    else:
        query_keep = torch.ones(batch, n_q, dtype=torch.bool, device=device)
    return query_keep, attention_mask


def real_positions(query_positions, key_positions, attention_mask, batch: int):
    """The positions at real (non-pad) slots, flattened: ``(query, key)`` int64 1-D.

    For value checks (range of positions, range of bins) that must ignore pad slots.
    Without a mask and with 1-D positions the inputs are returned as they are (no host
    read); otherwise the mask is read (a synchronisation on CUDA).
    """
    if attention_mask is None and query_positions.dim() == 1 and key_positions.dim() == 1:
        return query_positions, key_positions
    n_q, n_k = query_positions.shape[-1], key_positions.shape[-1]
    mask = None if attention_mask is None else attention_mask != 0
    query_keep, key_keep = _keeps(mask, batch, n_q, n_k, query_positions.device)
    return (
        query_positions.expand(batch, n_q)[query_keep],
        key_positions.expand(batch, n_k)[key_keep],
    )


@dataclass
class Group:
    """Sequences of a batch that share their real positions and their mask.

    ``rows``: int64 batch indices (``None``: the whole batch); ``queries``, ``keys``: int64
    indices of the real query slots and kept keys (``None``: all of them);
    ``query_positions``, ``key_positions``: int64 1-D positions of those slots; ``plan``:
    the backend's plan of the forward call, reused by the backward (eager mode).
    """

    rows: torch.Tensor | None
    queries: torch.Tensor | None
    keys: torch.Tensor | None
    query_positions: torch.Tensor
    key_positions: torch.Tensor
    plan: object = field(default=None, repr=False)

    @property
    def whole(self) -> bool:
        """Whether the group is the whole batch with every slot (no compaction)."""
        return self.rows is None and self.queries is None and self.keys is None

    def take(self, x: torch.Tensor, slots: torch.Tensor | None) -> torch.Tensor:
        """``x`` ``(batch, heads, n, ...)`` restricted to the group's rows and ``slots``."""
        if self.rows is not None:
            x = x.index_select(0, self.rows)
        if slots is not None:
            x = x.index_select(2, slots)
        return x

    def put(self, dst: torch.Tensor, src: torch.Tensor, slots: torch.Tensor | None) -> None:
        """``dst[rows][:, :, slots] = src`` in place (``dst`` ``(batch, heads, n, ...)``)."""
        if self.rows is None:
            if slots is None:
                dst.copy_(src)
            else:
                dst.index_copy_(2, slots, src.to(dst.dtype))
            return
        if slots is not None:
            block = dst.index_select(0, self.rows)
            block.index_copy_(2, slots, src.to(dst.dtype))
            src = block
        dst.index_copy_(0, self.rows, src.to(dst.dtype))


def _indices(keep: torch.Tensor) -> torch.Tensor | None:
    """Indices of the True entries of a 1-D bool tensor, or ``None`` when all are True."""
    index = keep.nonzero().flatten()
    return None if index.numel() == keep.numel() else index


def group_batch(
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    attention_mask: torch.Tensor | None,
    batch: int,
) -> list[Group]:
    """Split a (padded) batch into groups that each run as one 1-D-position kernel call.

    Parameters
    ----------
    query_positions, key_positions : torch.Tensor
        int64 ``(n_q,)`` / ``(batch, n_q)`` and ``(n_k,)`` / ``(batch, n_k)``, as returned
        by :func:`check_positions`.
    attention_mask : torch.Tensor or None
        bool or integer ``(batch, n_k)`` (:func:`check_attention_mask`).
    batch : int
        Batch size.

    Returns
    -------
    list of Group
        One group with no compaction when positions are 1-D and there is no mask (nothing
        is read on the host then); otherwise one group per distinct signature
        (real query positions, kept key positions, mask), in ``torch.unique`` order.

    Raises
    ------
    ValueError
        Integer mask entries other than 0 and 1 (``attention_mask``); per-sequence
        positions with ``|p| >= 2**53`` at a real slot.
    """
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        if bool(((attention_mask != 0) & (attention_mask != 1)).any()):
            raise ValueError("attention_mask: integer entries must be 0 (pad) or 1 (keep)")
        attention_mask = attention_mask != 0
    if attention_mask is None and query_positions.dim() == 1 and key_positions.dim() == 1:
        return [Group(None, None, None, query_positions, key_positions)]
    n_q, n_k = query_positions.shape[-1], key_positions.shape[-1]
    query_keep, key_keep = _keeps(attention_mask, batch, n_q, n_k, query_positions.device)
    qpos = torch.where(query_keep, query_positions.expand(batch, n_q), 0)
    kpos = torch.where(key_keep, key_positions.expand(batch, n_k), 0)
    check_position_range("query_positions", qpos)
    check_position_range("key_positions", kpos)
    signature = torch.cat([qpos, kpos, query_keep.long(), key_keep.long()], dim=1)
    firsts: list[int] | None
    if batch <= 1 or bool((signature == signature[:1]).all()):
        firsts, inverse = [0], None
    else:
        _, inverse = torch.unique(signature, dim=0, return_inverse=True)
        firsts = None
    groups = []
    rows_list: list[torch.Tensor | None]
    if inverse is None:
        rows_list = [None]
    else:
        count = int(inverse.max()) + 1
        groups_rows = [(inverse == g).nonzero().flatten() for g in range(count)]
        firsts = [int(rows[0]) for rows in groups_rows]
        rows_list = list(groups_rows)
    assert firsts is not None  # set on both branches
    for rows, first in zip(rows_list, firsts):
        queries, keys = _indices(query_keep[first]), _indices(key_keep[first])
        groups.append(
            Group(
                rows,
                queries,
                keys,
                qpos[first] if queries is None else qpos[first].index_select(0, queries),
                kpos[first] if keys is None else kpos[first].index_select(0, keys),
            )
        )
    return groups
