"""Hypothesis strategies for attention problems (numpy data, small sizes by default).

The main strategy is :func:`attention_problems`: it draws a
:class:`~plsh_ref.testing.problems.ProblemSpec`
(shapes, grouped-query heads, dtype, causal or not, default / explicit / left-padded
positions, slopes, number of partition samples, scale, a data seed) and builds its arrays.
Hypothesis shrinks the spec, so a failure is reported as the smallest problem found, and
the spec alone rebuilds it. The smaller strategies (:func:`dtypes`, :func:`slopes`,
:func:`positions`, :func:`partition_samples`) are there for property tests of your own.

:func:`sample_specs` draws a fixed list of specs from a seed, without a test function;
``plsh verify`` uses it, so ``--seed S --case K`` names one case reproducibly (for a given
Hypothesis version).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from hypothesis import strategies as st
from numpy.typing import ArrayLike

from ..alibi import alibi_slopes
from ..partition import PartitionSample, draw_partition
from ..validation import check_bool, check_int
from .problems import (
    DTYPES,
    RANDOM_POSITION_MODES,
    SLOPE_MODES,
    AttentionProblem,
    ProblemSpec,
)
from .reference import KINDS

__all__ = [
    "POSITION_LAYOUTS",
    "attention_problems",
    "draw_positions",
    "dtypes",
    "long_specs",
    "partition_samples",
    "positions",
    "problem_specs",
    "sample_specs",
    "slopes",
]

#: dtypes drawn by default, the ones a numpy kernel can take (bfloat16 is opt-in)
DEFAULT_DTYPES = ("float16", "float32", "float64")

#: position layouts of :func:`draw_positions`; ``default``, ``explicit`` and
#: ``left_padding`` mean what they mean in :data:`plsh_ref.testing.problems.POSITION_MODES`
POSITION_LAYOUTS = ("default", "explicit", "left_padding", "shifted", "gaps", "unsorted")


def draw_positions(
    mode: str, n_q: int, n_k: int, rng: np.random.Generator
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(query_positions, key_positions)`` of one layout, drawn from a numpy generator.

    The one generator of position layouts for seeded (non-Hypothesis) tests; the same
    names as :func:`positions` and :class:`~plsh_ref.testing.problems.ProblemSpec`.

    Parameters
    ----------
    mode : str
        One of :data:`POSITION_LAYOUTS`:

        * ``default``: ``(None, None)`` (keys ``0..n_k-1``, queries end-aligned);
        * ``explicit``: increasing positions with gaps of 1..4 tokens, a chunk deep inside a
          long sequence (as :class:`~plsh_ref.testing.problems.ProblemSpec`, ``pad=3``);
        * ``left_padding``: the default layout shifted left by a pad length in
          ``[0, n_k)``, so the first keys sit at negative positions;
        * ``shifted``: the default layout shifted by an offset in ``[-1000, 10**9)``;
        * ``gaps``: increasing key positions with gaps of 1..3 tokens (starting near
          ``-5``), sorted query positions anywhere around them: some queries may precede
          every key (rows without an admissible key when causal);
        * ``unsorted``: unsorted integers with repeats, some negative.
    n_q, n_k : int
        Lengths, ``>= 0``.
    rng : numpy.random.Generator

    Returns
    -------
    (query_positions, key_positions) : tuple of numpy.ndarray or None
        int64 ``(n_q,)`` and ``(n_k,)``, or ``(None, None)`` for ``default``.

    Raises
    ------
    TypeError, ValueError
        On negative or non-integer lengths or an unknown ``mode``.

    References
    ----------
    SPEC section 1 (default positions: keys ``0..n_k-1``, queries aligned to the end);
    ``CONTRIBUTING.md``, Conventions section (the tests' position layouts come
    from ``plsh_ref.testing``).
    """
    n_q = check_int("n_q", n_q, minimum=0)
    n_k = check_int("n_k", n_k, minimum=0)
    if mode not in POSITION_LAYOUTS:
        raise ValueError(f"mode: must be one of {POSITION_LAYOUTS}, got {mode!r}")
    if mode == "default":
        return None, None
    if mode == "explicit":
        spec = ProblemSpec(n_q=n_q, n_k=n_k, positions="explicit", pad=3)
        return spec._positions(rng)[:2]
    if mode == "shifted":
        shift = int(rng.integers(-1000, 10**9))
        return np.arange(n_q) + (n_k - n_q) + shift, np.arange(n_k) + shift
    if mode == "left_padding":
        pad = int(rng.integers(0, max(n_k, 1)))
        return np.arange(n_q) + (n_k - n_q - pad), np.arange(n_k) - pad
    if mode == "gaps":
        k = np.cumsum(rng.integers(1, 4, size=n_k)) - 5
        lo, hi = (int(k.min()) - 3, int(k.max()) + 4) if n_k else (-3, 4)
        q = np.sort(rng.integers(lo, hi, size=n_q))
        return q.astype(np.int64), k.astype(np.int64)
    return (
        rng.integers(-20, 3 * n_q + 5, size=n_q).astype(np.int64),
        rng.integers(-20, 3 * n_k + 5, size=n_k).astype(np.int64),
    )


def _check_choices(name: str, values, allowed) -> tuple:
    values = (values,) if isinstance(values, str) else tuple(values)
    if not values:
        raise ValueError(f"{name}: needs at least one entry")
    for v in values:
        if v not in allowed:
            raise ValueError(f"{name}: entries must be in {tuple(allowed)}, got {v!r}")
    return values


def dtypes(allowed: Sequence[str] = DEFAULT_DTYPES) -> st.SearchStrategy[str]:
    """dtype names, shrinking toward the first entry.

    Parameters
    ----------
    allowed : sequence of str
        Subset of ``("float16", "bfloat16", "float32", "float64")``.

    Returns
    -------
    hypothesis.strategies.SearchStrategy
        Draws one of ``allowed`` (a ``str``).

    Raises
    ------
    ValueError
        If ``allowed`` is empty or names an unknown dtype.

    References
    ----------
    SPEC section 5 (dtypes); Hypothesis ``sampled_from``;
    ``docs/validation.md``, "Strategies for your own properties".
    """
    return st.sampled_from(_check_choices("allowed", allowed, DTYPES))


def slopes(num_heads: int, *, standard: bool | None = None) -> st.SearchStrategy[np.ndarray]:
    """ALiBi slopes for ``num_heads`` heads: Press et al.'s or log-uniform in ``[2^-10, 2]``.

    Parameters
    ----------
    num_heads : int
        ``>= 1``.
    standard : bool, optional
        ``True``: only :func:`plsh_ref.alibi.alibi_slopes`; ``False``: only random slopes;
        ``None`` (default): either.

    Returns
    -------
    hypothesis.strategies.SearchStrategy
        Draws float64 arrays of shape ``(num_heads,)``, each entry > 0 (inverse tokens).

    Raises
    ------
    TypeError, ValueError
        If ``num_heads`` is not an integer ``>= 1``.

    References
    ----------
    Press et al. (2022); SPEC section 1; ``docs/validation.md``, "Strategies for your own
    properties".
    """
    num_heads = check_int("num_heads", num_heads, minimum=1)
    exponents = st.lists(st.floats(-10.0, 1.0), min_size=num_heads, max_size=num_heads)
    random = exponents.map(lambda e: np.exp2(np.asarray(e, dtype=np.float64)))
    fixed = st.just(None).map(lambda _: alibi_slopes(num_heads))
    if standard is True:
        return fixed
    if standard is False:
        return random
    return fixed | random


def positions(
    n_q: int, n_k: int, *, modes: Sequence[str] = ("default", "explicit", "left_padding")
) -> st.SearchStrategy[tuple[np.ndarray | None, np.ndarray | None]]:
    """``(query_positions, key_positions)`` for lengths ``n_q`` and ``n_k``.

    Parameters
    ----------
    n_q, n_k : int
        Sequence lengths, ``>= 0``.
    modes : sequence of str
        Subset of ``("default", "explicit", "left_padding")``: ``default`` gives
        ``(None, None)``; ``explicit`` increasing int64 positions with gaps, up to ``10^6``
        from 0; ``left_padding`` the default layout shifted by a pad length, so the first
        tokens sit at negative positions.

    Returns
    -------
    hypothesis.strategies.SearchStrategy
        Draws pairs of int64 arrays of shapes ``(n_q,)``, ``(n_k,)``, or ``(None, None)``.

    Raises
    ------
    TypeError, ValueError
        On negative lengths or unknown modes.

    References
    ----------
    SPEC sections 1 and 5 (default and explicit positions); ``docs/validation.md``, "Strategies for
    your own properties".
    """
    n_q = check_int("n_q", n_q, minimum=0)
    n_k = check_int("n_k", n_k, minimum=0)
    modes = _check_choices("modes", modes, ("default", "explicit", "left_padding"))

    def build(mode, pad, data_seed):
        spec = ProblemSpec(n_q=n_q, n_k=n_k, positions=mode, pad=pad, data_seed=data_seed)
        return spec._positions(np.random.default_rng(data_seed))[:2]

    return st.builds(build, st.sampled_from(modes), st.integers(0, 8), st.integers(0, 2**32 - 1))


def partition_samples(
    sigma: ArrayLike, *, max_samples: int = 8
) -> st.SearchStrategy[PartitionSample]:
    """Partition samples for length scales ``sigma`` (:func:`~plsh_ref.partition.draw_partition`).

    Parameters
    ----------
    sigma : array_like, ``(num_heads,)``
        Length scales in tokens, each > 0.
    max_samples : int
        Largest ``num_samples`` drawn (``>= 1``); shrinks toward 1.

    Returns
    -------
    hypothesis.strategies.SearchStrategy
        Draws :class:`~plsh_ref.partition.PartitionSample` of shape ``(num_heads, s)``.

    Raises
    ------
    TypeError, ValueError
        On invalid ``sigma`` or ``max_samples``.

    References
    ----------
    SPEC section 2 (a partition sample); ``docs/validation.md``, "Strategies for your own
    properties".
    """
    sig = np.array(sigma, dtype=np.float64)
    draw_partition(sig, 1, seed=0)  # validates sigma now rather than inside a test
    max_samples = check_int("max_samples", max_samples, minimum=1)
    return st.builds(
        lambda s, seed: draw_partition(sig, s, seed=seed),
        st.integers(1, max_samples),
        st.integers(0, 2**32 - 1),
    )


#: head counts drawn besides 1..4: non-powers of two and H >= 9 (where bf16 slopes are
#: inexact and Press et al.'s rule interleaves)
_MANY_HEADS = (6, 8, 12, 16, 20)
#: position offsets: 0, beyond 256 (where bfloat16 positions stop being exact), ~2**20
_OFFSETS = (0, 0, 300, 2**20 - 3)


class _HypothesisChoices:
    """The choices of :func:`_spec_from` drawn by Hypothesis (shrinking toward the first)."""

    def __init__(self, draw):
        self.draw = draw

    def integers(self, low, high):
        return self.draw(st.integers(low, high))

    def sampled_from(self, values):
        return self.draw(st.sampled_from(values))

    def booleans(self):
        return self.draw(st.booleans())

    def floats(self, low, high):
        return self.draw(st.floats(low, high))


class _GeneratorChoices:
    """The same choices from a numpy ``Generator`` (for :func:`sample_specs`)."""

    def __init__(self, rng):
        self.rng = rng

    def integers(self, low, high):
        return int(self.rng.integers(low, high + 1))

    def sampled_from(self, values):
        return values[int(self.rng.integers(len(values)))]

    def booleans(self):
        return bool(self.rng.integers(2))

    def floats(self, low, high):
        return float(self.rng.uniform(low, high))


def _spec_from(
    choose,
    kind,
    max_batch,
    max_heads,
    max_seq_len,
    max_head_dim,
    dtype_names,
    causal,
    gqa,
    position_modes,
    max_samples,
    max_amplitude,
    slope_modes,
):
    """One spec from ``choose`` (Hypothesis draws or a numpy Generator): the distribution."""
    many = [h for h in _MANY_HEADS if h <= max_heads]
    if many and choose.booleans():
        num_heads = choose.sampled_from(many)
    else:
        num_heads = choose.integers(1, min(4, max_heads))
    divisors = [g for g in range(1, num_heads + 1) if num_heads % g == 0]
    groups = [g for g in divisors if 1 < g < num_heads]
    choices = ["mha"] + (["gqa", "gqa"] if gqa and groups else []) + (["mqa"] if gqa else [])
    grouping = choose.sampled_from(choices) if num_heads > 1 else "mha"
    num_heads_kv = {
        "mha": num_heads,
        "mqa": 1,
        "gqa": choose.sampled_from(groups) if groups else num_heads,
    }[grouping]
    # Few empty problems: n_k = 0 about one case in 16; decode (1 <= n_q < n_k) and
    # n_q > n_k as often as n_q = n_k.
    low = 0 if choose.integers(0, 15) == 0 else 1
    n_k = choose.integers(min(low, max_seq_len), max_seq_len)
    shape = choose.sampled_from(["square", "decode", "longer_queries"])
    if shape == "decode" and n_k >= 2:
        n_q = choose.integers(1, n_k - 1)
    elif shape == "longer_queries" and n_k < max_seq_len:
        n_q = choose.integers(n_k + 1, max_seq_len)
    else:
        n_q = n_k
    head_dim = choose.integers(1, max_head_dim)
    head_dim_v = choose.integers(1, max_head_dim) if choose.booleans() else head_dim
    positions = choose.sampled_from(position_modes)
    if positions == "padded":
        n_q = min(n_q, n_k)
    offset = choose.sampled_from(_OFFSETS)
    return ProblemSpec(
        kind=kind,
        batch=choose.integers(1, max_batch),
        num_heads=num_heads,
        num_heads_kv=num_heads_kv,
        n_q=n_q,
        n_k=n_k,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        dtype=choose.sampled_from(dtype_names),
        causal=choose.booleans() if causal is None else causal,
        positions=positions,
        pad=choose.integers(0, max_seq_len),
        offset=offset,
        slopes=choose.sampled_from(slope_modes),
        # Only PLSH problems use num_samples; drawing it for ALiBi made distinct specs of
        # identical problems (two equal cases in one `plsh verify` run).
        num_samples=choose.integers(1, max_samples) if kind == "plsh" else 1,
        scale=choose.floats(0.05, 2.0) if choose.booleans() else None,
        amplitude=choose.floats(0.25, max_amplitude),
        data_seed=choose.integers(0, 2**32 - 1),
    )


@st.composite
def _specs(draw, *args):
    return _spec_from(_HypothesisChoices(draw), *args)


def problem_specs(
    kind: str = "alibi",
    *,
    max_batch: int = 2,
    max_heads: int = 16,
    max_seq_len: int = 16,
    max_head_dim: int = 8,
    dtypes: Sequence[str] = DEFAULT_DTYPES,
    causal: bool | None = None,
    gqa: bool = True,
    positions: Sequence[str] = RANDOM_POSITION_MODES,
    max_samples: int = 8,
    max_amplitude: float = 3.0,
    slopes: Sequence[str] = SLOPE_MODES,
) -> st.SearchStrategy[ProblemSpec]:
    """Specs of attention problems (no arrays): see :class:`~plsh_ref.testing.problems.ProblemSpec`.

    Parameters
    ----------
    kind : {"alibi", "plsh"}
        Exact ALiBi problems, or PLSH problems with a partition sample.
    max_batch, max_heads, max_seq_len, max_head_dim : int
        Upper bounds (lengths may be 0, ``n_q`` may differ from ``n_k``, the value head_dim
        may differ from the query/key head_dim). The distribution is balanced over the
        axes where kernels break: head counts 1..4 and 6, 8, 12, 16, 20 (up to
        ``max_heads``); no grouping, ``1 < num_heads_kv < num_heads`` and
        ``num_heads_kv = 1``; ``n_q = n_k``, decode ``1 <= n_q < n_k`` and ``n_q > n_k`` in
        equal shares; ``n_k = 0`` rarely (1 in 16); position offsets 0, 300 and about
        ``2**20``.
    dtypes : sequence of str
        dtype names to draw from (see :func:`dtypes`).
    causal : bool, optional
        Fix causal (``True``) or bidirectional (``False``); default: both.
    gqa : bool
        Allow ``num_heads_kv`` to be a proper divisor of ``num_heads``.
    positions : sequence of str
        Position modes (see :func:`positions`).
    max_samples : int
        Largest number of partition samples ``s`` (``plsh`` problems).
    max_amplitude : float
        Largest standard deviation of query/key entries (peaked softmax rows).
    slopes : sequence of str
        Slope modes (``"standard"``, ``"random"``); ``["standard"]`` for kernels that
        compute their own slopes.

    Returns
    -------
    hypothesis.strategies.SearchStrategy
        Draws :class:`~plsh_ref.testing.problems.ProblemSpec`.

    Raises
    ------
    TypeError, ValueError
        On invalid bounds or choices (message starts with the argument name).

    References
    ----------
    ``docs/validation.md``, "What is run: the battery, then random problems" (the balanced
    distribution) and "Strategies for your own properties".
    """
    return _specs(
        *_bound_args(
            kind,
            max_batch=max_batch,
            max_heads=max_heads,
            max_seq_len=max_seq_len,
            max_head_dim=max_head_dim,
            dtypes=dtypes,
            causal=causal,
            gqa=gqa,
            positions=positions,
            max_samples=max_samples,
            max_amplitude=max_amplitude,
            slopes=slopes,
        )
    )


def _bound_args(
    kind="alibi",
    *,
    max_batch=2,
    max_heads=16,
    max_seq_len=16,
    max_head_dim=8,
    dtypes=DEFAULT_DTYPES,
    causal=None,
    gqa=True,
    positions=RANDOM_POSITION_MODES,
    max_samples=8,
    max_amplitude=3.0,
    slopes=SLOPE_MODES,
) -> tuple:
    """The validated arguments of :func:`_spec_from` (defaults as :func:`problem_specs`)."""
    if kind not in KINDS:
        raise ValueError(f"kind: must be one of {KINDS}, got {kind!r}")
    max_batch = check_int("max_batch", max_batch, minimum=1)
    max_heads = check_int("max_heads", max_heads, minimum=1)
    max_seq_len = check_int("max_seq_len", max_seq_len, minimum=0)
    max_head_dim = check_int("max_head_dim", max_head_dim, minimum=1)
    max_samples = check_int("max_samples", max_samples, minimum=1)
    dtype_names = _check_choices("dtypes", dtypes, DTYPES)
    position_modes = _check_choices("positions", positions, RANDOM_POSITION_MODES)
    slope_modes = _check_choices("slopes", slopes, SLOPE_MODES)
    if not (np.isfinite(max_amplitude) and max_amplitude >= 0.25):
        raise ValueError(f"max_amplitude: must be finite and >= 0.25, got {max_amplitude!r}")
    if causal is not None:
        causal = check_bool("causal", causal)
    gqa = check_bool("gqa", gqa)
    return (
        kind,
        max_batch,
        max_heads,
        max_seq_len,
        max_head_dim,
        dtype_names,
        causal,
        gqa,
        position_modes,
        max_samples,
        float(max_amplitude),
        slope_modes,
    )


def attention_problems(kind: str = "alibi", **bounds: Any) -> st.SearchStrategy[AttentionProblem]:
    """Attention problems with their arrays: ``problem_specs(kind, **bounds)`` built.

    Parameters
    ----------
    kind : {"alibi", "plsh"}
    **bounds
        Keyword arguments of :func:`problem_specs`.

    Returns
    -------
    hypothesis.strategies.SearchStrategy
        Draws :class:`~plsh_ref.testing.problems.AttentionProblem` (numpy arrays, no torch).

    Examples
    --------
    >>> from hypothesis import given
    >>> from plsh_ref.testing import attention_problems
    >>> @given(attention_problems("plsh", dtypes=["float64"]))
    ... def test_rows_are_convex_combinations(problem):
    ...     out, lse = problem.reference()
    ...     assert np.all(np.abs(out) <= np.abs(problem.value).max(initial=0) + 1e-12)
    >>> test_rows_are_convex_combinations()

    References
    ----------
    ``docs/validation.md``, "In your pytest suite" and "Strategies for your own properties".
    """
    return problem_specs(kind, **bounds).map(ProblemSpec.build)


def _problem_key(spec: ProblemSpec):
    """What makes two specs the same problem (fields a problem ignores are normalised)."""
    import dataclasses

    changes: dict[str, Any] = {}
    if spec.positions == "default":
        changes["pad"] = 0
    if spec.kind == "alibi":
        changes["num_samples"] = 1
    return dataclasses.replace(spec, **changes)


def sample_specs(
    kind: str = "alibi",
    *,
    seed: int = 0,
    num_cases: int = 50,
    capabilities: dict | None = None,
    max_bias: float = 8.0,
    **bounds: Any,
) -> list[ProblemSpec]:
    """A fixed list of ``num_cases`` specs drawn from ``seed``, with the distribution of
    :func:`problem_specs`, within a kernel's capabilities.

    The choices come from ``numpy.random.default_rng(seed)``, not from Hypothesis: the
    list depends on ``seed``, ``kind``, ``bounds`` and ``capabilities`` only (Hypothesis
    mixes constants of the modules loaded from the current folder into its draws, so its
    examples depend on where and with what it runs). Nothing is written to disk. Specs
    that describe the same problem are kept once, and at most two empty ones (``n_q = 0``
    or ``n_k = 0``; the battery has its own). Each draw is restricted to the
    ``capabilities`` (:func:`plsh_ref.testing.capabilities.restrict`) before it is kept,
    so a kernel that supports less still gets ``num_cases`` cases it can run (fewer only
    if the restricted space is smaller); with every capability (the default) the list
    is the same as without.

    Parameters
    ----------
    kind : {"alibi", "plsh"}
    seed : int
        ``>= 0``.
    num_cases : int
        ``>= 1``. Fewer specs are returned only if the space is exhausted.
    capabilities : dict, optional
        ``{name: bool}`` of :data:`plsh_ref.testing.capabilities.CAPABILITIES`.
    max_bias : float
        Maximum bias of the standard slope rule of every spec.
    **bounds
        Keyword arguments of :func:`problem_specs`.

    Returns
    -------
    list of ProblemSpec

    Raises
    ------
    TypeError, ValueError
        On an invalid ``seed``, ``num_cases`` or bound.

    Examples
    --------
    >>> from plsh_ref.testing import sample_specs
    >>> a = sample_specs("alibi", seed=3, num_cases=5)
    >>> a == sample_specs("alibi", seed=3, num_cases=5)
    True

    References
    ----------
    ``docs/validation.md``, "What is run: the battery, then random problems" (``--cases`` random
    problems from ``--seed``, drawn with numpy's generator).
    """
    seed = check_int("seed", seed, minimum=0)
    num_cases = check_int("num_cases", num_cases, minimum=1)
    args = _bound_args(kind, **bounds)
    choose = _GeneratorChoices(np.random.default_rng(np.random.SeedSequence([seed, 11])))
    return _distinct(lambda: _spec_from(choose, *args), num_cases, capabilities, max_bias)


def _distinct(draw, num_cases, capabilities, max_bias) -> list[ProblemSpec]:
    """Up to ``num_cases`` distinct restricted specs from ``draw()`` (at most 2 empty)."""
    from .capabilities import CAPABILITIES, restrict

    caps = dict.fromkeys(CAPABILITIES, True)
    caps.update(capabilities or {})
    found: list[ProblemSpec] = []
    seen: set = set()
    empty = 0
    for _ in range(50 * num_cases):  # the space may be smaller than num_cases
        if len(found) == num_cases:
            break
        spec, _ = restrict(draw(), caps)
        if spec is None:
            continue
        if max_bias != 8.0:
            spec = spec.replace(max_bias=max_bias)
        key = _problem_key(spec)
        if key in seen:
            continue
        if spec.n_q == 0 or spec.n_k == 0:
            if empty == 2:
                continue
            empty += 1
        seen.add(key)
        found.append(spec)
    return found


#: lengths and head counts of :func:`long_specs`
LONG_LENGTHS = (257, 320)
LONG_HEADS = (8, 12, 16)


def long_specs(
    kind: str = "alibi",
    *,
    seed: int = 0,
    num_cases: int = 2,
    dtypes: Sequence[str] = ("float16", "bfloat16"),
    causal: bool | None = None,
    capabilities: dict | None = None,
    max_bias: float = 8.0,
    slopes: Sequence[str] = SLOPE_MODES,
) -> list[ProblemSpec]:
    """Random long cases in half precision: ``n_k`` in 257..320, 8, 12 or 16 heads,
    default positions.

    Where positions or the bias ``m * j`` are held in bfloat16 or float16 (integers are
    exact in bfloat16 only up to 256), the error shows from a few hundred tokens on; the
    short random cases of :func:`sample_specs` never reach it. Drawn from their own
    stream of ``seed``, so they do not change the other cases.

    Parameters
    ----------
    kind : {"alibi", "plsh"}
    seed : int
    num_cases : int
        ``>= 0``.
    dtypes : sequence of str
        Only the half-precision ones are used, in turn; none: no case.
    causal : bool, optional
    capabilities : dict, optional
    max_bias : float
    slopes : sequence of str

    Returns
    -------
    list of ProblemSpec

    Raises
    ------
    TypeError, ValueError
        On an invalid ``seed`` or ``num_cases``.

    References
    ----------
    ``docs/validation.md``, "What is run: the battery, then random problems" (``--long-cases``).
    """
    seed = check_int("seed", seed, minimum=0)
    num_cases = check_int("num_cases", num_cases, minimum=0)
    halves = [d for d in dtypes if d in ("float16", "bfloat16")]
    if not halves or not num_cases:
        return []
    rng = np.random.default_rng(np.random.SeedSequence([seed, 23]))
    counter = iter(range(10**9))

    def draw():
        i = next(counter)
        heads = LONG_HEADS[int(rng.integers(len(LONG_HEADS)))]
        n_k = int(rng.integers(LONG_LENGTHS[0], LONG_LENGTHS[1] + 1))
        return ProblemSpec(
            kind=kind,
            num_heads=heads,
            num_heads_kv=heads if rng.integers(2) else heads // 4,
            n_q=n_k if rng.integers(2) else int(rng.integers(1, n_k)),
            n_k=n_k,
            head_dim=int(rng.integers(4, 17)),
            head_dim_v=int(rng.integers(4, 17)),
            dtype=halves[i % len(halves)],
            causal=bool(rng.integers(2)) if causal is None else causal,
            slopes=str(slopes[int(rng.integers(len(slopes)))]),
            num_samples=int(rng.integers(1, 5)) if kind == "plsh" else 1,
            amplitude=float(rng.uniform(0.5, 2.0)),
            data_seed=int(rng.integers(0, 2**32 - 1)),
        )

    return _distinct(draw, num_cases, capabilities, max_bias)
