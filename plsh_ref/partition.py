"""Positional LSH: random binning of token positions (SPEC section 2).

One hash function for a head with length scale ``sigma`` draws a pitch
``delta ~ Gamma(shape=2, scale=sigma)`` and an offset ``u ~ Uniform[0, delta)`` and maps a
position ``p`` to ``bin(p) = floor((p - u) / delta)`` evaluated in IEEE binary64. The
0/1 mask ``M(h)_ij = 1[bin(p_i) = bin(p_j)]`` is block diagonal with contiguous blocks and
``E[M(h)] = L*`` exactly (Wolfson & Wagner 2026, section 2, after Rahimi & Recht 2007;
derivation in ``proofs_notes/collision_probability.md``).

A :class:`PartitionSample` holds ``pitch[H, s]`` and ``offset[H, s]``; every other
quantity (bins, blocks, masks, counts, the empirical mean ``M~``) is a function of it and of
the positions, so the reference and the fast path compute the same function when handed
the same sample.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from numpy.typing import ArrayLike

from .alibi import check_slopes, sigma_from_slopes
from .validation import (
    as_float_array,
    as_positions,
    check_bool,
    check_int,
    check_num_samples,
    check_sigma,
)

#: default number of partition samples ``s`` of every entry point that draws a partition
DEFAULT_NUM_SAMPLES = 16

__all__ = [
    "DEFAULT_NUM_SAMPLES",
    "PartitionSample",
    "bins",
    "block_sizes",
    "blocks",
    "check_partition",
    "count_bias",
    "counts",
    "derived_seed",
    "draw_partition",
    "empirical_mean",
    "head_rng",
    "masks",
    "resolve_partition",
]


@dataclass(frozen=True, eq=False)
class PartitionSample:
    """A sample of ``num_samples`` random binnings for each of ``num_heads`` heads.

    Attributes
    ----------
    pitch : numpy.ndarray
        float64, shape ``(num_heads, num_samples)``, each finite and > 0 (tokens).
    offset : numpy.ndarray
        float64, same shape, finite (tokens); drawn in ``[0, pitch)``.
    sampler : str
        How the sample was drawn, one of :data:`plsh_ref.samplers.SAMPLERS` (default
        ``"iid"``: independent hashes, the paper's). Provenance only: bins, counts and
        attention never read it; :mod:`plsh_ref.bounds` does (independence bounds refuse
        a non-iid sample). Kept by :meth:`heads`, :meth:`samples`, :meth:`save`/:meth:`load`
        and compared by ``==``.

    Nothing downstream assumes the samples are independent: correlated samplers may
    produce the same representation (SPEC section 2; ``proofs_notes/samplers.md``).

    Raises
    ------
    ValueError
        If the arrays are not two-dimensional with equal shapes and at least one head and
        one sample, if a pitch is not finite and > 0, or an offset is not finite; an
        unknown ``sampler``.
    TypeError
        If they are not real numeric arrays, or ``sampler`` is not a str.
    """

    pitch: np.ndarray
    offset: np.ndarray
    sampler: str = "iid"

    def __post_init__(self) -> None:
        # lazy: samplers needs scipy/mpmath, and `import plsh_ref` loads this module
        from .samplers import check_sampler

        check_sampler(self.sampler)
        pitch = as_float_array("pitch", self.pitch, ndim=2)
        offset = as_float_array("offset", self.offset, ndim=2)
        if pitch.shape != offset.shape:
            raise ValueError(f"offset: shape {offset.shape} differs from pitch shape {pitch.shape}")
        if pitch.shape[0] < 1:
            raise ValueError("pitch: needs at least one head (num_heads >= 1)")
        if pitch.shape[1] < 1:
            raise ValueError("pitch: needs at least one sample (num_samples >= 1)")
        if np.any(pitch <= 0):
            raise ValueError("pitch: every entry must be > 0")
        pitch = np.array(pitch, dtype=np.float64, order="C")
        offset = np.array(offset, dtype=np.float64, order="C")
        pitch.flags.writeable = False
        offset.flags.writeable = False
        object.__setattr__(self, "pitch", pitch)
        object.__setattr__(self, "offset", offset)

    @property
    def num_heads(self) -> int:
        """Number of heads ``H``."""
        return self.pitch.shape[0]

    @property
    def num_samples(self) -> int:
        """Number of samples ``s`` per head."""
        return self.pitch.shape[1]

    def heads(self, start: int, stop: int | None = None) -> PartitionSample:
        """The sub-sample for heads ``start..stop-1`` (as :func:`draw_partition` with ``head_start``).

        Raises
        ------
        ValueError
            If ``start`` is not in ``[0, num_heads)`` or ``stop`` not in
            ``(start, num_heads]`` (a slice without heads).
        TypeError
            If ``start`` or ``stop`` is not an integer.
        """
        start = check_int("start", start, minimum=0)
        if start >= self.num_heads:
            raise ValueError(f"start: must be < num_heads={self.num_heads}, got {start}")
        stop = self.num_heads if stop is None else check_int("stop", stop, minimum=start + 1)
        if stop > self.num_heads:
            raise ValueError(f"stop: must be <= num_heads={self.num_heads}, got {stop}")
        return PartitionSample(self.pitch[start:stop], self.offset[start:stop], self.sampler)

    def samples(self, start: int, stop: int | None = None) -> PartitionSample:
        """The sub-sample of hashes ``start..stop-1`` of every head.

        Counts of disjoint sample ranges add up: ``counts(p) == counts(p.samples(0, k)) +
        counts(p.samples(k))``, which lets experiments grow ``s`` incrementally. Every single
        hash of every sampler is marginally a paper hash, so any sub-sample is unbiased;
        a sub-sample of a ``"stratified"`` draw is *not* a stratified draw of that size
        (it keeps ``sampler`` and the dependence, not the variance reduction).

        Raises
        ------
        ValueError
            If ``start`` is not in ``[0, num_samples)`` or ``stop`` not in
            ``(start, num_samples]`` (a slice without samples).
        TypeError
            If ``start`` or ``stop`` is not an integer.
        """
        start = check_int("start", start, minimum=0)
        if start >= self.num_samples:
            raise ValueError(f"start: must be < num_samples={self.num_samples}, got {start}")
        stop = self.num_samples if stop is None else check_int("stop", stop, minimum=start + 1)
        if stop > self.num_samples:
            raise ValueError(f"stop: must be <= num_samples={self.num_samples}, got {stop}")
        return PartitionSample(self.pitch[:, start:stop], self.offset[:, start:stop], self.sampler)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PartitionSample):
            return NotImplemented
        return (
            self.pitch.shape == other.pitch.shape
            and np.array_equal(self.pitch, other.pitch)
            and np.array_equal(self.offset, other.offset)
            and self.sampler == other.sampler
        )

    def __repr__(self) -> str:
        extra = "" if self.sampler == "iid" else f", sampler={self.sampler!r}"
        return f"PartitionSample(num_heads={self.num_heads}, num_samples={self.num_samples}{extra})"

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write ``pitch``, ``offset`` and ``sampler`` to an ``.npz`` file (bit-exact round trip)."""
        np.savez(path, pitch=self.pitch, offset=self.offset, sampler=np.array(self.sampler))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PartitionSample:
        """Read a sample written by :meth:`save` (files without ``sampler`` read as ``"iid"``).

        Raises
        ------
        ValueError
            If the file lacks ``pitch`` or ``offset``, or names an unknown sampler.
        """
        with np.load(path) as data:
            for key in ("pitch", "offset"):
                if key not in data:
                    raise ValueError(f"path: file has no array {key!r}")
            sampler = str(data["sampler"][()]) if "sampler" in data else "iid"
            return cls(data["pitch"], data["offset"], sampler)


def head_rng(seed: int, head: int) -> np.random.Generator:
    """The numpy ``Generator`` of global head ``head`` for ``seed``.

    ``default_rng(SeedSequence(seed, spawn_key=(head,)))``: the same stream as the
    ``head``-th child of ``SeedSequence(seed).spawn``, so heads can be drawn one at a time,
    on different devices, in any order.

    Raises
    ------
    TypeError, ValueError
        If ``seed`` or ``head`` is not an integer ``>= 0``.

    References
    ----------
    SPEC section 2 (the stream of global head ``h`` derived from ``(seed, h)``); CONTRIBUTING.md,
    "Conventions" (``PartitionSample``).
    """
    seed = check_int("seed", seed, minimum=0)
    head = check_int("head", head, minimum=0)
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(head,)))


def draw_partition(
    sigma: ArrayLike,
    num_samples: int,
    seed: int | None = None,
    *,
    head_start: int = 0,
    sampler: str = "iid",
    group_size: int | None = None,
) -> PartitionSample:
    """Draw a partition sample: pitch ``~ Gamma(2, scale=sigma_h)``, offset ``~ U[0, pitch)``.

    Every hash has this law whatever the ``sampler``; the samplers differ in the
    dependence between the ``s`` hashes of a head (:mod:`plsh_ref.samplers`).

    Parameters
    ----------
    sigma : array_like, shape ``(num_heads,)``, or sequence of DistanceKernel
        Length scale of each head in tokens (``1 / slope``), each finite and > 0; or one
        :class:`plsh_ref.kernels.DistanceKernel` per head (a general Pólya kernel,
        ``proofs_notes/general_kernels.md``): head ``h`` then draws its pitches with
        ``kernels[h].sample_pitch(rng, s)`` (``"iid"``, ``"shared"``) or
        ``kernels[h].stratified_pitch(U)`` (``"stratified"``) in place of the Gamma draws,
        with the same stream and the same offsets, each pitch raised to
        :data:`plsh_ref.kernels.PITCH_FLOOR` (which changes no mask on integer positions).
        ``Exponential(sigma_h)`` kernels give the ``sigma`` draws bit for bit.
    num_samples : int
        ``s >= 1`` hash functions per head.
    seed : int, optional
        Non-negative seed. Global head ``head_start + h`` draws from
        :func:`head_rng` ``(seed, head_start + h)``: ``pitch = rng.gamma(2.0, scale=sigma_h,
        size=s)`` then ``offset = pitch * rng.random(s)``. ``None`` draws fresh OS entropy
        (not reproducible).
    head_start : int
        Global index of the first head; slicing heads of a larger draw gives the same sample.
    sampler : {"iid", "stratified", "shared"}
        ``"iid"`` (default, the paper; bit-identical to earlier releases): as above.
        ``"stratified"``: with ``s' = group_size`` and ``m = s / s'`` groups, head ``h``'s
        stream gives ``U = rng.random(m)``, ``phase = rng.random(m)``,
        ``order = rng.permutation(m)``; group ``k`` has the pitch
        ``F^-1((k + U_k) / m)`` (:func:`plsh_ref.samplers.stratified_pitch`) shared by the
        offsets ``pitch_k * ((phase_k + j / s') mod 1)``, ``j = 0..s'-1``; the groups are
        stored in the order ``order`` (columns ``t = i s' + j`` hold group ``order[i]``).
        About 5x less ``E||M~ - L*||_F^2`` than ``"iid"`` at ``s = 64``.
        ``"shared"``: ``pitch = rng.gamma(2.0, scale=sigma_h, size=m)``, then ``phase`` as
        above, no stratification: a counterexample, never better than ``"iid"``.
    group_size : int, optional
        ``s'``, a divisor of ``num_samples``; default
        :func:`plsh_ref.samplers.default_group_size` (1 for ``"iid"``, which accepts only 1).

    Returns
    -------
    PartitionSample
        ``pitch`` and ``offset`` of shape ``(num_heads, num_samples)``, float64, with
        ``sampler`` recorded.

    Raises
    ------
    ValueError
        If ``sigma <= 0`` or non-finite, or empty (no head; or an empty kernel list), ``num_samples`` outside ``[1, MAX_NUM_SAMPLES]``
        (500 000, :data:`plsh_ref.validation.MAX_NUM_SAMPLES`), ``seed < 0``,
        ``head_start < 0``, an unknown ``sampler``, or ``group_size`` not a divisor of ``num_samples`` (not 1 for
        ``"iid"``); a kernel of one's own (not :func:`plsh_ref.kernels.is_builtin`) that
        fails :func:`plsh_ref.kernels.check_polya` (``"sigma: head h: ..."``: it has no
        pitch law, so no partition has mean ``k``).
    TypeError
        If ``num_samples``, ``seed``, ``head_start`` or ``group_size`` are not integers,
        ``sampler`` is not a str, or ``sigma`` mixes kernels with numbers or is a single
        kernel (message starts with ``sigma``).

    References
    ----------
    Rahimi & Recht (2007), random binning features; Wolfson & Wagner (2026), section 2;
    ``proofs_notes/samplers.md`` (the correlated samplers).

    Examples
    --------
    >>> import numpy as np
    >>> from plsh_ref.partition import draw_partition
    >>> sigma = np.array([4.0, 16.0])
    >>> partition = draw_partition(sigma, num_samples=8, seed=0)
    >>> partition.pitch.shape, partition.offset.shape  # (num_heads, num_samples)
    ((2, 8), (2, 8))
    >>> partition.heads(1, 2) == draw_partition(sigma[1:], 8, seed=0, head_start=1)
    True
    """
    from .kernels import PITCH_FLOOR, DistanceKernel, check_kernels

    kernels = None
    if isinstance(sigma, DistanceKernel) or (
        isinstance(sigma, (list, tuple)) and any(isinstance(x, DistanceKernel) for x in sigma)
    ):
        kernels = check_kernels(sigma, name="sigma", polya=True)
        num_heads = len(kernels)
    else:
        sig = check_sigma("sigma", sigma)
        if sig.ndim != 1:
            raise ValueError(f"sigma: must be one-dimensional (num_heads,), got shape {sig.shape}")
        num_heads = sig.shape[0]
        if num_heads < 1:
            raise ValueError("sigma: needs at least one head (num_heads >= 1), got an empty array")
    s = check_num_samples(num_samples)
    head_start = check_int("head_start", head_start, minimum=0)
    if seed is None:
        seed = int(np.random.SeedSequence().generate_state(2, np.uint64)[0])
    seed = check_int("seed", seed, minimum=0)
    # lazy: samplers needs scipy/mpmath, and `import plsh_ref` loads this module
    from .samplers import resolve_group_size, stratified_pitch

    group = resolve_group_size(sampler, s, group_size)
    m = s // group
    pitch = np.empty((num_heads, s))
    offset = np.empty((num_heads, s))
    if sampler == "iid":
        for h in range(num_heads):
            rng = head_rng(seed, head_start + h)
            if kernels is None:
                pitch[h] = rng.gamma(2.0, scale=sig[h], size=s)
            else:
                pitch[h] = np.maximum(kernels[h].sample_pitch(rng, s), PITCH_FLOOR)
            offset[h] = pitch[h] * rng.random(s)
        return PartitionSample(pitch, offset, sampler)
    stratified = sampler == "stratified"
    group_pitch = np.empty((num_heads, m))
    uniform = np.empty((num_heads, m))
    phase = np.empty((num_heads, m))
    order = np.empty((num_heads, m), dtype=np.int64)
    for h in range(num_heads):
        rng = head_rng(seed, head_start + h)
        if stratified:
            uniform[h] = rng.random(m)
        elif kernels is None:
            group_pitch[h] = rng.gamma(2.0, scale=sig[h], size=m)
        else:
            group_pitch[h] = np.maximum(kernels[h].sample_pitch(rng, m), PITCH_FLOOR)
        phase[h] = rng.random(m)
        order[h] = rng.permutation(m) if stratified else np.arange(m)
    if stratified and kernels is None:  # F^-1 of Gamma(2, sigma) is sigma times that of Gamma(2, 1)
        group_pitch = sig[:, None] * stratified_pitch(uniform, 1.0)
    elif stratified:  # stratified uniforms pushed through each head's pitch quantile
        head_kernels = cast(tuple, kernels)  # (not None on this branch)
        for kernel in set(head_kernels):  # heads with equal kernels in one vectorised call
            heads = [h for h, c in enumerate(head_kernels) if c == kernel]
            group_pitch[heads] = kernel.stratified_pitch(uniform[heads])
        group_pitch = np.maximum(group_pitch, PITCH_FLOOR)
    grid = (phase[:, :, None] + np.arange(group)[None, None, :] / group) % 1.0
    group_offset = group_pitch[:, :, None] * grid
    rows = np.arange(num_heads)[:, None]
    pitch[:] = np.repeat(group_pitch[rows, order], group, axis=1)
    offset[:] = group_offset[rows, order].reshape(num_heads, s)
    return PartitionSample(pitch, offset, sampler)


def check_partition(
    partition: Any,
    num_heads: int | None = None,
    *,
    num_samples: int | None = None,
    seed: int | None = None,
) -> PartitionSample:
    """Return ``partition`` if it is a :class:`PartitionSample` that fits the call, else raise.

    Parameters
    ----------
    partition : PartitionSample
    num_heads : int, optional
        The query's head count, when the partition must match it.
    num_samples : int, optional
        When given, must equal the partition's sample count.
    seed : None
        A partition and a seed are exclusive; any ``seed`` other than ``None`` raises.

    Returns
    -------
    PartitionSample
        ``partition`` itself.

    Raises
    ------
    TypeError
        ``partition`` is not a ``PartitionSample``; a non-integer ``num_samples``.
    ValueError
        Its head count differs from ``num_heads``; ``num_samples`` disagrees with it; a
        ``seed`` is passed as well.

    References
    ----------
    SPEC section 5 (the ``partition`` argument of the attention family); ``docs/changelog.md``
    (``check_partition`` checks ``num_samples``, refuses a seed alongside a partition).
    """
    if not isinstance(partition, PartitionSample):
        raise TypeError(f"partition: must be a PartitionSample, got {type(partition).__name__}")
    if num_heads is not None and partition.num_heads != num_heads:
        raise ValueError(f"partition: has {partition.num_heads} heads, query has {num_heads}")
    if num_samples is not None and check_num_samples(num_samples) != partition.num_samples:
        raise ValueError(
            f"num_samples: {num_samples} differs from the partition's {partition.num_samples}"
        )
    if seed is not None:
        raise ValueError("seed: pass either a partition or a seed, not both")
    return partition


def resolve_partition(
    partition: PartitionSample | None = None,
    *,
    num_heads: int,
    slopes: ArrayLike | None = None,
    num_samples: int | None = None,
    seed: int | None = None,
) -> PartitionSample:
    """The partition of a call of the attention family: ``partition``, or a fresh draw.

    The one resolution of the ``partition``, ``slopes``, ``num_samples`` and ``seed``
    arguments (the fast path and distributed): a given
    partition is checked against the others (:func:`check_partition`); otherwise one is
    drawn by :func:`draw_partition` with ``sigma = 1 / slopes`` (:func:`plsh_ref.alibi.check_slopes`:
    default ALiBi slopes for ``None``), ``num_samples`` samples (default
    :data:`DEFAULT_NUM_SAMPLES`) and ``seed`` (``None``: fresh OS entropy, not
    reproducible; the seed policy of CONTRIBUTING.md).

    Parameters
    ----------
    partition : PartitionSample, optional
    num_heads : int
        The query's head count.
    slopes : array_like, ``(num_heads,)``, optional
        Positive slopes (inverse tokens); checked also when a partition is given.
    num_samples : int, optional
    seed : int, optional

    Returns
    -------
    PartitionSample

    Raises
    ------
    TypeError, ValueError
        As :func:`check_partition`, :func:`plsh_ref.alibi.check_slopes` and
        :func:`draw_partition`; slopes so small that ``1 / slope`` overflows (``slopes``).

    References
    ----------
    SPEC section 2 (the draw), section 5 (the family's arguments).
    """
    if partition is not None:
        if slopes is not None:
            check_slopes(slopes, num_heads)
        return check_partition(partition, num_heads, num_samples=num_samples, seed=seed)
    sigma = sigma_from_slopes(check_slopes(slopes, num_heads))
    s = DEFAULT_NUM_SAMPLES if num_samples is None else check_num_samples(num_samples)
    return draw_partition(sigma, s, seed)


def bins(partition: PartitionSample, positions: ArrayLike) -> np.ndarray:
    """Bin index ``floor((p - offset) / pitch)`` of every position under every hash.

    The subtraction and the division are the correctly rounded binary64 operations of
    IEEE 754 (numpy float64); this function is the definition that every fast path must
    reproduce bit for bit (SPEC section 2).

    Parameters
    ----------
    partition : PartitionSample
    positions : array_like of int, shape ``(n,)``
        Absolute token positions, ``|p| < 2**53``.

    Returns
    -------
    numpy.ndarray
        int64, shape ``(num_heads, num_samples, n)``.

    Raises
    ------
    TypeError
        If ``partition`` is not a PartitionSample or positions are not integers.
    ValueError
        If positions are not one-dimensional, or a bin index leaves the int64 range
        (a pitch far below the distances involved, e.g. ``sigma = 1e-12`` at ``p = 1e8``;
        argument name ``partition``).
    """
    partition = check_partition(partition)
    p = as_positions("positions", positions).astype(np.float64)
    with np.errstate(over="ignore"):
        quotient = np.floor(
            (p[None, None, :] - partition.offset[..., None]) / partition.pitch[..., None]
        )
    if not np.all((quotient >= -(2.0**63)) & (quotient < 2.0**63)):
        # Casting would wrap silently (every such position in one bin): refuse.
        raise ValueError(
            "partition: bin index floor((p - offset) / pitch) leaves the int64 "
            "range; pitch too small for these positions"
        )
    return quotient.astype(np.int64)


def blocks(
    partition: PartitionSample, positions: ArrayLike, head: int, sample: int
) -> list[np.ndarray]:
    """The blocks of hash ``(head, sample)``: index arrays into ``positions``, one per bin.

    Blocks are listed in increasing bin order, each block's indices in increasing order
    (a stable sort); for sorted positions each block is a contiguous run of indices.

    Returns
    -------
    list of numpy.ndarray
        int64 index arrays partitioning ``range(len(positions))``.

    Raises
    ------
    TypeError
        If ``partition`` is not a PartitionSample or positions are not integers.
    ValueError
        If ``head`` or ``sample`` is out of range, or positions are invalid (see
        :func:`bins`).

    References
    ----------
    SPEC section 2 (contiguous bins); ``proofs_notes/collision_probability.md``, section 5.
    """
    partition = check_partition(partition)
    head = check_int("head", head, minimum=0)
    sample = check_int("sample", sample, minimum=0)
    if head >= partition.num_heads:
        raise ValueError(f"head: must be < num_heads={partition.num_heads}, got {head}")
    if sample >= partition.num_samples:
        raise ValueError(f"sample: must be < num_samples={partition.num_samples}, got {sample}")
    b = bins(partition.heads(head, head + 1), positions)[0, sample]
    order = np.argsort(b, kind="stable")
    _, starts = np.unique(b[order], return_index=True)
    return np.split(order, starts[1:]) if b.size else []


def block_sizes(partition: PartitionSample, positions: ArrayLike) -> list[list[np.ndarray]]:
    """Sizes of the blocks of every hash, ``sizes[h][t]`` (int64, in bin order).

    The nonzero spectrum of one mask ``M(h)`` is exactly this list (each all-ones block of
    size ``k`` has the single nonzero eigenvalue ``k``).

    Raises
    ------
    TypeError, ValueError
        As :func:`bins`.

    References
    ----------
    ``proofs_notes/collision_probability.md``, section 5 (spectrum);
    ``proofs_notes/kms_spectrum.md``, section 5; SPEC section 4.
    """
    partition = check_partition(partition)
    b = bins(partition, positions)
    return [
        [np.unique(b[h, t], return_counts=True)[1] for t in range(b.shape[1])]
        for h in range(b.shape[0])
    ]


def masks(
    partition: PartitionSample,
    query_positions: ArrayLike,
    key_positions: ArrayLike,
    *,
    causal: bool = False,
) -> np.ndarray:
    """All masks ``M(h_t)_ij = 1[bin_t(p_i) = bin_t(p_j)]`` (and ``p_j <= p_i`` if causal).

    Returns
    -------
    numpy.ndarray
        bool, shape ``(num_heads, num_samples, n_q, n_k)`` (memory ``H s n_q n_k`` bytes).

    Raises
    ------
    TypeError
        If ``partition`` is not a PartitionSample, positions are not integers or
        ``causal`` is not a bool.
    ValueError
        If positions are not one-dimensional or ``|p| >= 2**53``, or a bin index leaves
        the int64 range (argument name ``partition``).

    References
    ----------
    SPEC section 2 (the mask ``M(h)``).
    """
    causal = check_bool("causal", causal)
    qpos = as_positions("query_positions", query_positions)
    kpos = as_positions("key_positions", key_positions)
    bq = bins(partition, qpos)
    bk = bins(partition, kpos)
    out = bq[..., :, None] == bk[..., None, :]
    if causal:
        out &= kpos[None, :] <= qpos[:, None]
    return out


def counts(
    partition: PartitionSample,
    query_positions: ArrayLike,
    key_positions: ArrayLike,
    *,
    causal: bool = False,
) -> np.ndarray:
    """Collision counts ``C[h, i, j] = #{t : bin_t(p_i) = bin_t(p_j)}`` (0..s).

    Parameters
    ----------
    partition : PartitionSample
    query_positions, key_positions : array_like of int, shapes ``(n_q,)``, ``(n_k,)``
    causal : bool
        Zero the entries with ``p_key > p_query``.

    Returns
    -------
    numpy.ndarray
        int64, shape ``(num_heads, n_q, n_k)``. ``counts / num_samples`` is ``M~``.

    Raises
    ------
    TypeError
        If ``partition`` is not a PartitionSample, positions are not integers or
        ``causal`` is not a bool.
    ValueError
        If positions are not one-dimensional or ``|p| >= 2**53``, or a bin index leaves
        the int64 range (argument name ``partition``).

    References
    ----------
    SPEC sections 2-3 (``C = s M~``).

    Examples
    --------
    >>> import numpy as np
    >>> from plsh_ref.partition import counts, draw_partition
    >>> partition = draw_partition(np.array([4.0]), num_samples=8, seed=0)
    >>> c = counts(partition, np.arange(5), np.arange(5), causal=True)
    >>> c.shape  # (num_heads, n_q, n_k)
    (1, 5, 5)
    >>> bool((np.diag(c[0]) == 8).all())  # a position shares its bin with itself in every sample
    True
    >>> int(c[0, 0, 4])  # causal: no later key
    0
    """
    causal = check_bool("causal", causal)
    qpos = as_positions("query_positions", query_positions)
    kpos = as_positions("key_positions", key_positions)
    bq = bins(partition, qpos)
    bk = bins(partition, kpos)
    out = np.zeros((bq.shape[0], bq.shape[2], bk.shape[2]), dtype=np.int64)
    for t in range(bq.shape[1]):
        out += bq[:, t, :, None] == bk[:, t, None, :]
    if causal:
        out *= kpos[None, :] <= qpos[:, None]
    return out


def count_bias(counts: ArrayLike, num_samples: int, *, dtype: Any = np.float64) -> np.ndarray:
    """The additive bias of PLSH attention, ``log(C / s) = log M~`` (``-inf`` where ``C = 0``).

    PLSH attention is ``softmax(scale q k^T + count_bias(C, s)) v`` (SPEC section 3 (b));
    this is the one place where the bias is formed from counts (float64 reference,
    :mod:`plsh_fast` dense and CPU paths, peers, experiments), so that every user gets the
    same rounding: one binary64 division ``C / s`` and one ``log``.

    Parameters
    ----------
    counts : array_like of int, any shape
        Collision counts in ``0..num_samples`` (e.g. :func:`counts`, or running counts of
        the first ``num_samples`` samples).
    num_samples : int
        ``s >= 1``.
    dtype : numpy.float64 or numpy.longdouble
        The type the division and the ``log`` are rounded in (``numpy.longdouble``: the
        reference's ``precision="extended"``, :func:`plsh_ref.attention.plsh_attention`).

    Returns
    -------
    numpy.ndarray
        ``dtype``, the shape of ``counts``: ``log(C / s)``, exactly ``-inf`` where ``C = 0``
        (weight 0, however large the logit), ``0.0`` where ``C = s``.

    Raises
    ------
    TypeError
        If ``counts`` is not a real numeric array or ``num_samples`` not an integer.
    ValueError
        If ``num_samples < 1``, a count is not an integer in ``[0, num_samples]``, or
        ``dtype`` is neither float64 nor longdouble.

    References
    ----------
    Wolfson & Wagner (2026), Theorem 2.2; SPEC section 3.
    """
    s = check_int("num_samples", num_samples, minimum=1)
    try:
        work = np.dtype(dtype).type
    except TypeError:
        work = None
    if work not in (np.float64, np.longdouble):
        raise ValueError(f"dtype: must be numpy.float64 or numpy.longdouble, got {dtype!r}")
    c = as_float_array("counts", counts)  # counts <= MAX_NUM_SAMPLES: exact in float64
    if c.size and (np.any(c < 0) or np.any(c > s) or np.any(c != np.floor(c))):
        raise ValueError(f"counts: must be integers in [0, num_samples={s}]")
    with np.errstate(divide="ignore"):
        return np.log(c.astype(work) / work(s))


def empirical_mean(
    partition: PartitionSample,
    query_positions: ArrayLike,
    key_positions: ArrayLike,
    *,
    causal: bool = False,
) -> np.ndarray:
    """Empirical mean ``M~ = (1/s) sum_t M(h_t)``, float64, shape ``(num_heads, n_q, n_k)``.

    Unbiased for ``L*`` (``E[M~] = L*``) when the pitches/offsets are drawn by
    :func:`draw_partition`; see ``proofs_notes/collision_probability.md``.

    Raises
    ------
    TypeError, ValueError
        As :func:`counts`.
    """
    return counts(partition, query_positions, key_positions, causal=causal) / partition.num_samples


def derived_seed(seed: int, *keys: int) -> int:
    """A child seed ``SeedSequence([seed, *keys])`` as a 63-bit ``int`` (one definition).

    Used for the ``draw``-th training partition of a module (``derived_seed(seed, draw)``)
    and for the partition seed of layer ``l`` of a model (``derived_seed(seed, l)``,
    :mod:`plsh_fast.experiments.model`; the layers of :mod:`plsh_fast.nn` and :mod:`plsh_fast.hf`). Children of distinct key tuples are independent
    streams (numpy ``SeedSequence`` entropy mixing); the top bit is dropped so that the
    result is a valid non-negative ``seed``.

    Parameters
    ----------
    seed : int
        Parent seed ``>= 0``.
    *keys : int
        Non-negative integers naming the child (draw index, layer index, ...).

    Returns
    -------
    int
        In ``[0, 2**63)``.

    Raises
    ------
    TypeError, ValueError
        If ``seed`` or a key is not an integer ``>= 0``.

    References
    ----------
    CONTRIBUTING.md, "Seeds (one policy)" (layer ``l`` uses ``derived_seed(seed, l)``); numpy
    ``SeedSequence``.
    """
    seed = check_int("seed", seed, minimum=0)
    key_ints = [check_int("keys", k, minimum=0) for k in keys]
    state = np.random.SeedSequence([seed, *key_ints]).generate_state(1, np.uint64)[0]
    return int(state >> np.uint64(1))
