"""The deterministic edge battery: one named problem per known class of ALiBi kernel bug.

``plsh verify`` runs these before its random cases, on every seed, so that detection of
the bugs seen in real kernels does not depend on what Hypothesis happens to draw. Each
case is named after the bug class it targets (the report prints the name):

====================================  ===================================================
case                                  bug class it targets
====================================  ===================================================
``heads_6``, ``_12``, ``_20``,        Press et al.'s rule for a number of heads that is
``_40``                               not a power of two (wrong order, wrong interleave)
``heads_16_float32``                  slopes rounded to bf16/fp16 (inexact for H >= 9);
                                      named after the main dtype (float32 if allowed)
``heads_16_<half>``                   H >= 9 with bfloat16/float16 inputs
``gqa_grouped``                       GQA with 1 < H_kv < H (``h % H_kv`` instead of
                                      ``h // group``)
``gqa_single_kv``                     multi-query, H_kv = 1
``decode_one_query``,                 decode shapes 1 <= n_q < n_k, causal alignment of
``decode_chunk``                      queries to the end of the keys
``longer_queries``                    n_q > n_k: causal rows without an admissible key
``bidirectional``,                    non-causal attention, sign of the bias on both sides
``bidirectional_decode``              (``-m (p_i - p_j)`` without the absolute value)
``no_keys``                           n_k = 0: every row empty (output 0, LSE -inf)
``positions_beyond_256``              positions held in bfloat16 (inexact beyond 256)
``positions_far_from_zero``           positions around 2**20 (fp16/bf16/fp32 positions)
``sequence_longer_than_256``          bias tables or caches capped at 256 tokens
``positions_with_gaps``               a kernel that ignores the positions it is given
``per_sequence_positions``            batch > 1 with different positions per sequence
``left_padding_masked``               HF left padding: pad keys masked, pad rows empty
``padded_decode``                     padding with n_q < n_k
``head_dim_not_power_of_two``         default scale from a padded head_dim
``value_head_dim_differs``            value head_dim != key head_dim
``batch``                             batch > 1, shared positions
``scale_not_default``                 a kernel that ignores ``scale``
``default_scale``                     a wrong default scale (``1``, ``1/d``)
``random_slopes``                     a kernel that ignores the slopes it is given
``positions_beyond_256_<half>``,      positions cast to the input dtype (bf16 is inexact
``positions_far_from_zero_<half>``    beyond 256, fp16 overflows at 65504)
``peaked_softmax_<half>``             unstable softmax in low precision
``sequence_longer_than_256_<half>``   positions built in the model dtype
                                      (``arange(n, dtype=query.dtype)``) or the bias
                                      ``m * j`` stored in it: default positions, 8
                                      heads, 300 tokens, each of bfloat16 and float16
``bidirectional_padded``              padding applied to the mask but not to the bias, in
                                      a bidirectional kernel
``right_padding``                     pad tokens at the end of each sequence
``tensor_parallel_heads``             a head slice 4..7 of 12 heads: its slopes are the
                                      global ones (standard mode: the kernel takes
                                      ``head_start``, ``num_heads_total``)
``decode_cache_offset``               a decode step whose cache sits at positions
                                      1000.. (query position from the cache length)
``packed_varlen``                     packed sequences (``cu_seqlens``): attention across
                                      sequences, positions not restarted
====================================  ===================================================

Every case is restricted to what the kernel supports (:func:`battery_plan`,
:func:`plsh_ref.testing.capabilities.restrict`): a causal case becomes bidirectional for
an encoder, a prefill a decode step for a decode-only kernel. A case whose *target* the
kernel does not support (``bidirectional`` for a causal-only kernel) is not run and is
listed as not covered, with the capability or option that excluded it.

All problems are small (at most 300 tokens; 8 heads for the long half-precision ones),
so the battery runs in a few seconds against a numpy kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from .capabilities import CAPABILITIES, restrict
from .problems import DTYPES, POSITION_MODES, ProblemSpec
from .reference import KINDS

__all__ = ["NotCovered", "battery", "battery_plan"]


@dataclass(frozen=True)
class NotCovered:
    """A battery case a kernel cannot run.

    Attributes
    ----------
    name : str
        The case (named after its bug class).
    reason : str
        The capability or option that excludes it (``"bidirectional"``, ``"--causal"``,
        ``"--positions"``, ``"attention_mask (the kernel takes no attention_mask
        argument)"``...).

    References
    ----------
    ``docs/validation.md``, "What is run: the battery, then random problems" (battery cases
    not covered, with what excludes them).
    """

    name: str
    reason: str


def _pick(dtypes, preferred):
    for d in preferred:
        if d in dtypes:
            return d
    return None


def _cases(kind, main, halves, slopes):
    """``(name, changes, targets)``: the battery in its fixed order (``targets``: the
    capabilities a case is about; restricting one of them excludes the case)."""
    half = halves[0] if halves else None
    long = dict(num_heads=8, num_heads_kv=8, n_q=300, n_k=300)
    cases = [
        *[(f"heads_{h}", dict(num_heads=h, num_heads_kv=h), ()) for h in (6, 12, 20, 40)],
        (f"heads_16_{main}", dict(num_heads=16, num_heads_kv=16, n_q=24, n_k=24), ()),
        ("gqa_grouped", dict(num_heads=8, num_heads_kv=2), ("gqa",)),
        ("gqa_single_kv", dict(num_heads=4, num_heads_kv=1), ("gqa",)),
        ("decode_one_query", dict(n_q=1, n_k=12), ("unequal_lengths",)),
        ("decode_chunk", dict(n_q=3, n_k=12), ("unequal_lengths", "prefill")),
        (
            "longer_queries",
            dict(n_q=12, n_k=5),
            ("unequal_lengths", "prefill", "causal"),
        ),
        ("bidirectional", dict(causal=False), ("bidirectional",)),
        ("bidirectional_decode", dict(causal=False, n_q=4, n_k=12), ("bidirectional",)),
        ("no_keys", dict(n_q=3, n_k=0), ("empty", "empty_rows")),
        ("positions_beyond_256", dict(offset=300, n_q=8, n_k=8), ("positions",)),
        ("positions_far_from_zero", dict(offset=2**20 - 3, n_q=8, n_k=8), ("positions",)),
        ("sequence_longer_than_256", long, ()),
        ("positions_with_gaps", dict(positions="explicit", pad=4), ("positions",)),
        (
            "per_sequence_positions",
            dict(positions="per_sequence", pad=3, batch=2),
            ("positions", "batch_positions"),
        ),
        ("left_padding_masked", dict(positions="padded", pad=10, batch=3), ("attention_mask",)),
        (
            "padded_decode",
            dict(positions="padded", pad=6, batch=2, n_q=2, n_k=10),
            ("attention_mask",),
        ),
        (
            "bidirectional_padded",
            dict(positions="padded", pad=10, batch=3, causal=False),
            ("attention_mask", "bidirectional"),
        ),
        (
            "right_padding",
            dict(positions="right_padded", pad=6, batch=3),
            ("attention_mask", "right_padding"),
        ),
        (
            "tensor_parallel_heads",
            dict(num_heads=4, num_heads_kv=4, head_start=4, num_heads_total=12),
            ("head_slice",),
        ),
        ("decode_cache_offset", dict(n_q=1, n_k=40, offset=1000), ("positions",)),
        ("packed_varlen", dict(positions="packed", pad=3, n_q=30, n_k=30), ("varlen",)),
        ("head_dim_not_power_of_two", dict(head_dim=12, head_dim_v=12), ()),
        ("value_head_dim_differs", dict(head_dim=4, head_dim_v=6), ("head_dim_v",)),
        ("batch", dict(batch=3), ()),
        ("scale_not_default", dict(scale=0.3), ("scale",)),
        ("default_scale", dict(head_dim=16, head_dim_v=16, amplitude=2.0), ()),
    ]
    if slopes == "given":
        cases.append(("random_slopes", dict(slopes="random"), ()))
    return cases + _half_cases(half, halves, long)


def _half_cases(half, halves, long):
    """The low-precision cases: ``half`` (bfloat16, else float16) and the long ones in each."""
    cases = []
    if half is not None:
        cases += [
            (
                f"heads_16_{half}",
                dict(num_heads=16, num_heads_kv=16, n_q=24, n_k=24, dtype=half),
                (),
            ),
            (
                f"positions_beyond_256_{half}",
                dict(offset=300, n_q=8, n_k=8, dtype=half),
                ("positions",),
            ),
            (
                f"positions_far_from_zero_{half}",
                dict(offset=2**20 - 3, n_q=8, n_k=8, dtype=half),
                ("positions",),
            ),
            (
                f"peaked_softmax_{half}",
                dict(dtype=half, head_dim=16, head_dim_v=16, amplitude=4.0, n_q=16, n_k=16),
                (),
            ),
        ]
    cases += [(f"sequence_longer_than_256_{h}", dict(long, dtype=h), ()) for h in halves]
    return cases


def battery_plan(
    kind: str = "alibi",
    *,
    seed: int = 0,
    dtypes: Sequence[str] = ("float16", "float32", "float64"),
    slopes: str = "given",
    max_bias: float = 8.0,
    causal: bool | None = None,
    positions: Sequence[str] | None = None,
    capabilities: dict | None = None,
) -> tuple[list[tuple[str, ProblemSpec]], list[NotCovered]]:
    """The battery restricted to a kernel and a run's options, and what it cannot cover.

    Parameters
    ----------
    kind, seed, dtypes, slopes
        As :func:`battery`.
    max_bias : float
        Maximum bias of the standard slope rule (``--slopes standard:max_bias=B``).
    causal : bool, optional
        ``--causal yes`` (True) or ``no`` (False): the other kind of case is restricted
        to this one, or excluded if it is its target (reason ``"--causal"``).
    positions : sequence of str, optional
        ``--positions``: cases of another position mode than these and ``default`` are
        excluded (``"--positions"``), and so are cases with an offset (explicit positions)
        unless one of ``explicit``, ``left_padding``, ``per_sequence`` is listed.
    capabilities : dict, optional
        ``{name: bool}`` (:func:`plsh_ref.testing.capabilities.effective_capabilities`);
        default: everything supported.

    Returns
    -------
    (cases, not_covered) : (list of (str, ProblemSpec), list of NotCovered)
        The runnable cases in the battery's order (each restricted with
        :func:`~plsh_ref.testing.capabilities.restrict`; a restricted case equal to an
        earlier one is not repeated) and the excluded ones.

    Raises
    ------
    ValueError
        As :func:`battery`, or on an unknown position mode or capability.

    References
    ----------
    ``docs/validation.md``, "What is run: the battery, then random problems" and
    "Capabilities: declaring what a kernel does not support".
    """
    if kind not in KINDS:
        raise ValueError(f"kind: must be one of {KINDS}, got {kind!r}")
    if slopes not in ("given", "standard"):
        raise ValueError(f"slopes: must be 'given' or 'standard', got {slopes!r}")
    dtypes = tuple(dtypes)
    if not dtypes or any(d not in DTYPES for d in dtypes):
        raise ValueError(f"dtypes: must be a non-empty subset of {DTYPES}, got {dtypes!r}")
    allowed_positions = tuple(positions) if positions is not None else POSITION_MODES
    if any(p not in POSITION_MODES for p in allowed_positions):
        raise ValueError(f"positions: entries must be in {POSITION_MODES}, got {positions!r}")
    caps = dict.fromkeys(CAPABILITIES, True)
    for name, value in (capabilities or {}).items():
        if name not in caps:
            raise ValueError(f"capabilities: unknown capability {name!r}")
        caps[name] = bool(value)
    option = {}
    if causal is not None:
        option["bidirectional" if causal else "causal"] = "--causal"
        caps["bidirectional" if causal else "causal"] = False
    usable = [d for d in dtypes if caps[d]] or list(dtypes)
    main = _pick(usable, ("float32", "float64", "float16", "bfloat16"))
    halves = [h for h in ("bfloat16", "float16") if h in usable]
    base = ProblemSpec(
        kind=kind,
        dtype=main,
        num_heads=4,
        num_heads_kv=4,
        n_q=10,
        n_k=10,
        head_dim=8,
        head_dim_v=8,
        causal=True,
        max_bias=max_bias,
        num_samples=4 if kind == "plsh" else 1,
    )
    cases: list[tuple[str, ProblemSpec]] = []
    not_covered: list[NotCovered] = []
    seen: dict[ProblemSpec, str] = {}
    for i, (name, changes, targets) in enumerate(_cases(kind, main, halves, slopes)):
        spec = base.replace(data_seed=1000 * seed + i, **changes)
        explicit = {"explicit", "left_padding", "per_sequence"} & set(allowed_positions)
        if spec.positions not in ("default", *allowed_positions) or (spec.offset and not explicit):
            not_covered.append(NotCovered(name, "--positions"))
            continue
        restricted, changed = restrict(spec, caps)
        hit = [c for c in changed if c in targets or restricted is None]
        # what is compared rather than what runs: a case about empty rows has nothing left
        hit += [t for t in targets if t == "empty_rows" and not caps[t]]
        if hit:
            not_covered.append(NotCovered(name, option.get(hit[0], hit[0])))
            continue
        restricted = cast(ProblemSpec, restricted)  # None only with a hit (skipped above)
        key = restricted.replace(data_seed=0)
        if key in seen:
            not_covered.append(NotCovered(name, f"the same problem as {seen[key]} here"))
            continue
        seen[key] = name
        cases.append((name, restricted))
    return cases, not_covered


def battery(
    kind: str = "alibi",
    *,
    seed: int = 0,
    dtypes: Sequence[str] = ("float16", "float32", "float64"),
    slopes: str = "given",
    **restrictions: Any,
) -> list[tuple[str, ProblemSpec]]:
    """The named edge cases, in a fixed order.

    Parameters
    ----------
    kind : {"alibi", "plsh"}
        ``plsh`` cases use ``num_samples = 4`` (several samples, so that estimators that
        agree at ``s = 1`` are told apart).
    seed : int
        Seeds the data of every case (``data_seed = 1000 * seed + index``); the shapes do
        not depend on it.
    dtypes : sequence of str
        dtypes the kernel takes; cases use float32 (else the most precise of them), one
        low-precision dtype (bfloat16, else float16) and, for the long
        ``sequence_longer_than_256_<half>`` cases, each of bfloat16 and float16 present.
    slopes : {"given", "standard"}
        ``standard``: every case uses Press et al.'s slopes (the kernel computes them).
    **restrictions
        ``max_bias``, ``causal``, ``positions``, ``capabilities`` of :func:`battery_plan`.

    Returns
    -------
    list of (str, ProblemSpec)
        The cases :func:`battery_plan` keeps (all of them without restrictions).

    Raises
    ------
    ValueError
        On an unknown ``kind``, ``slopes`` or dtype, or an empty ``dtypes``.

    References
    ----------
    ``docs/validation.md``, "What is run: the battery, then random problems".
    """
    return battery_plan(kind, seed=seed, dtypes=dtypes, slopes=slopes, **restrictions)[0]
