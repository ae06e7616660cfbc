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
====================================  ===================================================

All problems are small (at most 300 tokens, one or two heads for the long ones), so
the battery runs in a second or two against a numpy kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .problems import DTYPES, ProblemSpec
from .reference import KINDS

__all__ = ["battery"]


def _pick(dtypes, preferred):
    for d in preferred:
        if d in dtypes:
            return d
    return None


def battery(
    kind: str = "alibi",
    *,
    seed: int = 0,
    dtypes: Sequence[str] = ("float16", "float32", "float64"),
    slopes: str = "given",
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
        dtypes the kernel takes; cases use float32 (else the most precise of them) and
        one low-precision dtype (bfloat16, else float16) if present.
    slopes : {"given", "standard"}
        ``standard``: every case uses Press et al.'s slopes (the kernel computes them).

    Returns
    -------
    list of (str, ProblemSpec)

    Raises
    ------
    ValueError
        On an unknown ``kind``, ``slopes`` or dtype, or an empty ``dtypes``.
    """
    if kind not in KINDS:
        raise ValueError(f"kind: must be one of {KINDS}, got {kind!r}")
    if slopes not in ("given", "standard"):
        raise ValueError(f"slopes: must be 'given' or 'standard', got {slopes!r}")
    dtypes = tuple(dtypes)
    if not dtypes or any(d not in DTYPES for d in dtypes):
        raise ValueError(f"dtypes: must be a non-empty subset of {DTYPES}, got {dtypes!r}")
    main = _pick(dtypes, ("float32", "float64", "float16", "bfloat16"))
    half = _pick(dtypes, ("bfloat16", "float16"))
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
        num_samples=4 if kind == "plsh" else 1,
    )
    cases: list[tuple[str, dict[str, Any]]] = [
        *[(f"heads_{h}", dict(num_heads=h, num_heads_kv=h)) for h in (6, 12, 20, 40)],
        (f"heads_16_{main}", dict(num_heads=16, num_heads_kv=16, n_q=24, n_k=24)),
        ("gqa_grouped", dict(num_heads=8, num_heads_kv=2)),
        ("gqa_single_kv", dict(num_heads=4, num_heads_kv=1)),
        ("decode_one_query", dict(n_q=1, n_k=12)),
        ("decode_chunk", dict(n_q=3, n_k=12)),
        ("longer_queries", dict(n_q=12, n_k=5)),
        ("bidirectional", dict(causal=False)),
        ("bidirectional_decode", dict(causal=False, n_q=4, n_k=12)),
        ("no_keys", dict(n_q=3, n_k=0)),
        ("positions_beyond_256", dict(offset=300, n_q=8, n_k=8)),
        ("positions_far_from_zero", dict(offset=2**20 - 3, n_q=8, n_k=8)),
        ("sequence_longer_than_256", dict(num_heads=2, num_heads_kv=2, n_q=300, n_k=300)),
        ("positions_with_gaps", dict(positions="explicit", pad=4)),
        ("per_sequence_positions", dict(positions="per_sequence", pad=3, batch=2)),
        ("left_padding_masked", dict(positions="padded", pad=10, batch=3)),
        ("padded_decode", dict(positions="padded", pad=6, batch=2, n_q=2, n_k=10)),
        ("head_dim_not_power_of_two", dict(head_dim=12, head_dim_v=12)),
        ("value_head_dim_differs", dict(head_dim=4, head_dim_v=6)),
        ("batch", dict(batch=3)),
        ("scale_not_default", dict(scale=0.3)),
        ("default_scale", dict(head_dim=16, head_dim_v=16, amplitude=2.0)),
    ]
    if slopes == "given":
        cases.append(("random_slopes", dict(slopes="random")))
    if half is not None:
        cases += [
            (f"heads_16_{half}", dict(num_heads=16, num_heads_kv=16, n_q=24, n_k=24, dtype=half)),
            (f"positions_beyond_256_{half}", dict(offset=300, n_q=8, n_k=8, dtype=half)),
            (f"positions_far_from_zero_{half}", dict(offset=2**20 - 3, n_q=8, n_k=8, dtype=half)),
            (
                f"peaked_softmax_{half}",
                dict(dtype=half, head_dim=16, head_dim_v=16, amplitude=4.0, n_q=16, n_k=16),
            ),
        ]
    return [
        (name, base.replace(data_seed=1000 * seed + i, **changes))
        for i, (name, changes) in enumerate(cases)
    ]
