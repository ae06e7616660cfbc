"""Public torch entry point: :func:`plsh_attention` (validation, partition, dispatch)."""

from __future__ import annotations

import torch
from numpy.typing import ArrayLike

from plsh_ref.alibi import check_slopes
from plsh_ref.partition import PartitionSample, resolve_partition
from plsh_ref.validation import check_bool, check_scale

from . import _padding as P
from . import _validation as V
from ._autograd import PLSHAttentionFunction
from ._partition import partition_tensors
from .dense import below_crossover, dense_plsh_attention

__all__ = ["plsh_attention"]


def plsh_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    partition: PartitionSample | tuple[torch.Tensor, torch.Tensor] | None = None,
    slopes: ArrayLike | torch.Tensor | None = None,
    num_samples: int | None = None,
    seed: int | None = None,
    causal: bool = True,
    scale: float | None = None,
    query_positions: ArrayLike | torch.Tensor | None = None,
    key_positions: ArrayLike | torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    return_lse: bool = False,
    backend: str = "auto",
    check_finite: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """PLSH attention: softmax attention with the count-weighted ALiBi approximation.

    Computes ``T~_i = sum_j A_ij C_ij v_j / sum_j A_ij C_ij`` with
    ``A_ij = exp(scale q_i . k_j)`` and ``C_ij`` the number of the ``num_samples`` random
    binnings of positions that put ``p_i`` and ``p_j`` in the same bin (times the causal
    mask), i.e. ``softmax(scale Q K^T + log C) V``. Its expectation over partitions
    approximates exact ALiBi attention with slopes ``m_h`` at rate ``s^(-1/2)``. For the
    same partition sample it is the function of :func:`plsh_ref.attention.plsh_attention`
    (float64 reference). Differentiable in ``query``, ``key``, ``value`` (and through the
    returned LSE).

    Parameters
    ----------
    query : torch.Tensor
        ``(batch, num_heads, n_q, head_dim)``; float16, bfloat16, float32 (float64 on the CPU
        path); any strides; ``n_q >= 0``; ``head_dim <= 256`` on the Triton path.
    key : torch.Tensor
        ``(batch, num_heads_kv, n_k, head_dim)`` with ``num_heads % num_heads_kv == 0``
        (grouped-query attention: query head ``h`` reads kv head
        ``h // (num_heads // num_heads_kv)``).
    value : torch.Tensor
        ``(batch, num_heads_kv, n_k, head_dim_v)``.
    slopes : array_like or torch.Tensor, shape ``(num_heads,)``, optional
        ALiBi slopes ``m_h > 0`` (inverse tokens), held in float64 on the host; default
        :func:`plsh_ref.alibi.alibi_slopes` ``(num_heads)``. Used to draw the partition
        (``sigma_h = 1 / m_h``); ignored when ``partition`` is given.
    num_samples : int, optional
        Number of random binnings ``s >= 1`` per head (default 16; at most 32768 on the
        Triton path). Must match the partition when one is given.
    causal : bool
        Key ``j`` admissible for query ``i`` iff ``p_j <= p_i``.
    scale : float, optional
        Logit scale, default ``1 / sqrt(head_dim)``.
    partition : plsh_ref.partition.PartitionSample or (torch.Tensor, torch.Tensor), optional
        The partition sample (``pitch``, ``offset`` of shape ``(num_heads, s)``): a
        :class:`~plsh_ref.partition.PartitionSample` (host arrays, copied to the device
        per call) or a pair of float64 tensors ``(pitch, offset)`` on the query's device,
        passed to the kernels as they are (what :class:`plsh_fast.nn.PLSHAttention` does
        with its buffers, and what ``torch.compile`` needs). When omitted one is drawn by
        :func:`plsh_ref.partition.draw_partition` with ``sigma = 1 / slopes`` and ``seed``.
    seed : int, optional
        Seed of the draw (``None``: fresh OS entropy, not reproducible). Exclusive with
        ``partition``.
    query_positions, key_positions : torch.Tensor or array_like of int, optional
        Absolute positions ``(n_q,)``, ``(n_k,)`` shared by the batch, or ``(batch, n_q)``,
        ``(batch, n_k)`` per sequence (HF ``position_ids``; ``(1, n)`` counts as shared);
        integer tensors (any order, repeats allowed, ``|p| < 2**53`` at real slots; any
        int64 value at pad slots). Default: keys ``0..n_k-1``, queries aligned to the end
        (``n_k - n_q + (0..n_q-1)``). Bins use each sequence's own positions.
    attention_mask : torch.Tensor, optional
        Key-padding mask ``(batch, n_k)``, bool or integer 0/1, 1/True = keep, 0 = pad
        (HF 2-D convention). Pad keys get weight 0; a query slot whose end-aligned key
        slot ``n_k - n_q + i`` is padded (``n_q <= n_k``) is a pad query: output 0,
        LSE ``-inf``, zero gradient. A left-padded sequence with HF ``position_ids`` gives
        exactly its unpadded bins and outputs on its real tokens
        (:mod:`plsh_fast._padding`, same semantics as :func:`plsh_ref.plsh_attention`).
    return_lse : bool
        Also return the LSE.
    backend : {"auto", "cpu", "triton"}
        Where it runs. ``"auto"``: densely (:func:`plsh_fast.dense.dense_plsh_attention`,
        SDPA with the bias ``log(C / s)``: the same function, bins bit for bit) when
        ``n_q * n_k <= n**2`` with ``n = plsh_fast.dense.DENSE_CROSSOVER[device type]``,
        the crossover below which dense attention costs less than the tiled paths
        (measured, ``benchmarks/crossover_bench.py``); above it the CPU path for CPU
        tensors and the Triton kernels for CUDA tensors.
        ``"triton"`` with CPU tensors runs the Triton interpreter (``TRITON_INTERPRET=1``
        must be set before Triton is imported; for tests).
    check_finite : bool
        The checks that read tensor values (default on, eager mode only): NaN/inf in
        ``query``, ``key``, ``value``; a tensor partition's values (finite ``pitch > 0``,
        finite offsets); ``|p| < 2**53`` at real positions; bins of the extreme positions
        inside int64. They cost one extra read of every input (``O(n d)``, against the
        attention's ``O(n w d)``) and one host read of the results (a device
        synchronisation on CUDA); pass ``False`` in a hot loop whose inputs you trust.
        With it off the results for such inputs are unspecified: a NaN or inf in a key or
        value can reach every output row of its head, also rows that cannot attend to it
        (a masked weight 0 times NaN is NaN). Under
        ``torch.compile`` they are skipped (they would need values while tracing).
        Finite inputs whose logits ``scale q_i . k_j`` overflow the working dtype (float32
        for half and float32 inputs: beyond about ``3.4e38``) are not refused: a row whose
        logits all overflow to ``-inf`` has output 0 on the dense and CPU paths, LSE
        ``-inf`` on the dense path but 0 on the CPU path, and the gradients of such
        inputs overflow to NaN (on the CPU path in every key's and value's gradient of the
        head; measured 2026-12-03,
        ``tests/fast/test_api.py::test_logits_overflowing_the_working_dtype``).

    Returns
    -------
    out : torch.Tensor
        ``(batch, num_heads, n_q, head_dim_v)``, dtype of ``query``; 0 on rows with no
        admissible key.
    lse : torch.Tensor
        Only if ``return_lse``: ``(batch, num_heads, n_q)``, float32 (float64 for float64
        inputs), ``log sum_j exp(scale q_i . k_j) C_ij / s`` (natural log); ``-inf`` on
        rows with no admissible key.

    Raises
    ------
    TypeError
        A ``causal``, ``return_lse`` or ``check_finite`` that is not a bool; non-tensor
        or sparse inputs, non-floating or mixed dtypes, float64 off the CPU, a partition
        that is neither a ``PartitionSample`` nor a pair of float64 tensors, non-integer
        ``num_samples``/``seed``/positions, a mask that is neither bool nor integer.
    ValueError
        Tensors on different devices, wrong ranks or inconsistent shapes, head counts that
        do not divide, ``num_samples < 1``, slopes of the wrong length or not > 0, a
        partition with another head count or sample count, both ``partition`` and
        ``seed``, positions of the wrong length or batch, a mask of the wrong shape or with
        integer entries other than 0/1, an unknown or unavailable ``backend``,
        ``num_samples > 32768`` on the Triton path,
        non-finite inputs when ``check_finite``, slopes so small that ``1 / slope``
        overflows, a bin index ``floor((p - offset) / pitch)`` outside the int64 range
        (pitch too small for the positions; as :func:`plsh_ref.partition.bins`). All
        raised before any kernel launch. Shape and dtype errors are raised under
        ``torch.compile`` as well (while tracing; with ``fullgraph=True`` Dynamo reports
        them as ``torch._dynamo.exc.Unsupported`` quoting the message); mask values are
        checked at run time inside the operator.

    Notes
    -----
    Cost per head: each query attends to the union of its ``s`` blocks, about
    ``sigma (ln s + 0.58)`` keys back (``2 sigma (ln s + 0.58)`` without ``causal``), plus
    the height of its tile of queries; planning costs ``O(s n)``. Memory is
    ``O(n * window)``, never ``n_q x n_k``; the CPU path also keeps recent plans (tile
    groups and count biases) across calls within ``plsh_fast.cpu.PLAN_CACHE_BYTES``, so
    that a repeated call with the same partition and positions skips planning
    (``docs/dropin.md``). Rows are processed sorted by position (unsorted
    positions are sorted and the results put back). On the 2-core development CPU the
    path beats dense attention from about ``n = 4k`` (``benchmarks/README.md``).

    ``torch.compile``: inside a compiled region the call is the custom operator
    ``plsh::attention`` (:mod:`plsh_fast._ops`), which Dynamo traces with symbolic
    sequence lengths (``fullgraph=True`` works; one graph serves every length); pass the
    partition as tensors (or use :class:`plsh_fast.nn.PLSHAttention`). In eager mode it
    is :class:`plsh_fast._autograd.PLSHAttentionFunction`, whose backward reuses the
    forward's plan; both compute the same function.

    Synchronisation (CUDA): the value checks (``check_finite``); with a mask or
    per-sequence positions, grouping the batch (:mod:`plsh_fast._padding`: the groups and
    their lengths are data-dependent); the kernels' own planning (sorting check of the
    positions, tile ranges; :mod:`plsh_fast.triton`). Nothing else reads device
    values: the partition and the positions stay on the device.

    References
    ----------
    Wolfson & Wagner (2026), *Positional LSH*, Theorem 2.2; SPEC sections 2-3 and 5;
    ``proofs_notes/backward.md`` for the gradients.

    Examples
    --------
    >>> import torch
    >>> from plsh_fast import plsh_attention
    >>> q = k = v = torch.randn(1, 4, 128, 64)
    >>> out = plsh_attention(q, k, v, num_samples=16, seed=0)
    >>> tuple(out.shape)
    (1, 4, 128, 64)
    """
    causal = check_bool("causal", causal)
    return_lse = check_bool("return_lse", return_lse)
    check_finite = check_bool("check_finite", check_finite)
    V.check_qkv(query, key, value)
    batch, num_heads, n_q, head_dim = query.shape
    n_k, head_dim_v = key.shape[2], value.shape[3]
    device = query.device
    requested = backend
    backend = V.check_backend(backend, device, head_dim, head_dim_v)
    c = check_scale(scale, head_dim)
    eager = not torch.compiler.is_compiling()
    qpos, kpos, mask = P.resolve_positions(
        query_positions, key_positions, attention_mask, batch, n_q, n_k, device
    )
    if isinstance(partition, (tuple, list)):
        pitch, offset = _check_partition_tensors(partition, num_heads, num_samples, seed, device)
        sample = None
    else:
        sample = resolve_partition(
            partition, num_heads=num_heads, slopes=slopes, num_samples=num_samples, seed=seed
        )
        pitch, offset = partition_tensors(sample, device)
    V.check_backend_num_samples(backend, pitch.shape[1])
    if slopes is not None and partition is not None and eager:
        check_slopes(slopes, num_heads)
    if eager and check_finite:
        _check_values(
            query,
            key,
            value,
            pitch,
            offset,
            *P.real_positions(qpos, kpos, mask, batch),
            drawn_from_slopes=partition is None and slopes is not None,
        )
    # Dense below the crossover; under torch.compile not with an integer mask, whose 0/1
    # values only the operator checks (at run time).
    integer_mask = mask is not None and mask.dtype != torch.bool
    if requested == "auto" and below_crossover(n_q, n_k, device) and (eager or not integer_mask):
        if integer_mask:
            assert mask is not None  # integer_mask implies a mask
            if bool((torch.ne(mask, 0) & torch.ne(mask, 1)).any()):
                raise ValueError("attention_mask: integer entries must be 0 (pad) or 1 (keep)")
            mask = torch.ne(mask, 0)
        return dense_plsh_attention(
            query,
            key,
            value,
            partition=(pitch, offset),
            causal=causal,
            scale=c,
            query_positions=qpos,
            key_positions=kpos,
            attention_mask=mask,
            return_lse=return_lse,
        )
    args = (query, key, value, pitch, offset, qpos, kpos, mask, c, causal, backend)
    if eager:
        out, lse = PLSHAttentionFunction.apply(*args)
    else:
        from ._ops import attention  # noqa: PLC0415 (registers the operator on first use)

        out, lse, _, _ = attention(*args)
    return (out, lse) if return_lse else out


def _check_values(
    query, key, value, pitch, offset, real_q, real_k, *, drawn_from_slopes: bool = False
) -> None:
    """Every check that reads tensor values, with one host read (one sync on CUDA).

    Finite ``query``/``key``/``value``; a partition with finite ``pitch > 0`` and finite
    offsets; real positions with ``|p| < 2**53``; bins ``floor((p - offset) / pitch)`` of
    the extreme real positions inside the int64 range (bins are monotone in ``p``, so the
    extremes decide; as :func:`plsh_ref.partition.bins`). Eager mode only.

    Raises
    ------
    ValueError
        Naming the first failing argument (``query``, ``key``, ``value``, ``partition``,
        ``query_positions``, ``key_positions``, and for the bin range ``partition``, or
        ``slopes`` when ``drawn_from_slopes``: the partition was drawn from them).
    """
    true = torch.ones((), dtype=torch.bool, device=pitch.device)
    flags = [torch.isfinite(t).all() if t.numel() else true for t in (query, key, value)]
    flags.append(((pitch > 0) & torch.isfinite(pitch) & torch.isfinite(offset)).all())
    for positions in (real_q, real_k):
        flags.append((positions.abs() < P.MAX_ABS_POSITION).all() if positions.numel() else true)
    ends = torch.cat([real_q, real_k])
    if ends.numel():
        extremes = torch.stack([ends.min(), ends.max()]).to(torch.float64)
        quotient = torch.floor((extremes - offset[..., None]) / pitch[..., None])
        flags.append(((quotient >= -(2.0**63)) & (quotient < 2.0**63)).all())
    messages = (
        "query: contains NaN or infinite values",
        "key: contains NaN or infinite values",
        "value: contains NaN or infinite values",
        "partition: pitch must be finite and > 0, offset finite",
        "query_positions: |position| must be < 2**53 so that float64 is exact",
        "key_positions: |position| must be < 2**53 so that float64 is exact",
        "slopes: the partition drawn from them has a bin index floor((p - offset) / pitch) "
        "outside the int64 range; slope too large (pitch too small) for these positions"
        if drawn_from_slopes
        else "partition: bin index floor((p - offset) / pitch) leaves the int64 range; pitch "
        "too small for these positions",
    )
    for ok, message in zip(torch.stack([f.to(pitch.device) for f in flags]).tolist(), messages):
        if not ok:
            raise ValueError(message)


def _check_partition_tensors(partition, num_heads: int, num_samples, seed, device):
    """``(pitch, offset)`` float64 tensors ``(num_heads, s)`` of a tensor partition, on ``device``.

    Shapes and dtypes only; values (``pitch > 0`` finite, finite offsets, bin range) are
    checked by the caller in eager mode with ``check_finite``.

    Raises
    ------
    TypeError
        Not a pair of tensors, or not float64.
    ValueError
        Wrong shapes, ``num_samples`` that disagrees, a ``seed`` as well.
    """
    if len(partition) != 2 or not all(isinstance(t, torch.Tensor) for t in partition):
        raise TypeError(
            "partition: must be a plsh_ref.partition.PartitionSample or a pair of float64 "
            f"tensors (pitch, offset), got {type(partition).__name__} of "
            f"{[type(t).__name__ for t in partition]}"
        )
    pitch, offset = partition
    if pitch.dtype != torch.float64 or offset.dtype != torch.float64:
        raise TypeError(
            f"partition: pitch and offset must be float64 (bins are binary64, SPEC section 2), "
            f"got {pitch.dtype}, {offset.dtype}"
        )
    if pitch.dim() != 2 or pitch.shape != offset.shape or pitch.shape[1] < 1:
        raise ValueError(
            "partition: pitch and offset must have one shape (num_heads, num_samples >= 1), "
            f"got {tuple(pitch.shape)}, {tuple(offset.shape)}"
        )
    if pitch.shape[0] != num_heads:
        raise ValueError(f"partition: has {pitch.shape[0]} heads, query has {num_heads}")
    if num_samples is not None and V.check_num_samples(num_samples) != pitch.shape[1]:
        raise ValueError(
            f"num_samples: {num_samples} differs from the partition's {pitch.shape[1]}"
        )
    if seed is not None:
        raise ValueError("seed: pass either a partition or a seed, not both")
    return pitch.to(device), offset.to(device)
