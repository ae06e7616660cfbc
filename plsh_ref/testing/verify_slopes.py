"""``plsh verify-slopes MODULE:FUNCTION``: check an ALiBi slope function alone.

Nearly every real ALiBi implementation computes its own slopes (BLOOM's
``_get_alibi_slopes``, MPT's ``alibi_bias_max`` rule, x-transformers, attention-gym's
``exp2(-(h+1) * 8 / H)``, Falcon). This command calls ``FUNCTION(num_heads)`` for
``num_heads = 1..--max-heads`` (default 64) and compares the result with
:func:`plsh_ref.alibi.alibi_slopes` (Press et al.'s rule, SPEC section 1; ``--max-bias B``
for the rule with maximum bias ``B`` instead of 8, as MPT's ``alibi_bias_max``), entry by
entry. Each ``num_heads`` is classed by its largest relative error ``r``: ``exact``
(``r = 0``), ``float64`` (``r <= 2 H eps64``: the same rule spelled differently, e.g.
``start * ratio**i``), ``float32`` (``r <= 2 H eps32``: computed in float32),
``bfloat16`` or ``float16`` (values held in that dtype and ``r <= 2 eps`` of it: the
right rule rounded to it), or ``wrong rule``. exact, float64 and float32
pass (SPEC: slopes at least float32 in kernels; ``--exact`` accepts bit equality only);
bfloat16/float16 slopes are flagged (inexact from ``num_heads = 9`` on: ``2^-0.5`` has no
bf16 representation) and fail, as does a wrong rule. The report gives the first wrong
``num_heads``, its wrong entries and the largest relative error.

The function may return a list, a numpy array or a torch tensor (any dtype). Exit
status: 0 pass, 1 fail, 2 bad input (not importable, not callable, raises, returns the
wrong length or a non-numeric value), always with one line for bad input. The report
leads with the verdict (``PASS: ...`` or ``FAIL: ...``) and says how many head counts are
bit-equal and how many within rounding.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from ..alibi import MAX_BIAS, alibi_slopes
from ..validation import check_int
from .problems import round_to_dtype
from .suite import KernelContractError, load_kernel
from .tolerance import EPS

__all__ = [
    "HELP",
    "MAX_HEADS",
    "SUMMARY",
    "SlopeReport",
    "add_arguments",
    "check_slopes_function",
    "run",
]

#: Largest ``--max-heads``: the check calls the function once per head count, so its
#: cost grows as ``max_heads**2``; no model has come near this many heads.
MAX_HEADS = 4096

#: one line for ``plsh --help``
SUMMARY = "check an ALiBi slope function against Press et al.'s"

#: one-line description of the subcommand
HELP = (
    "Check an ALiBi slope function MODULE:FUNCTION(num_heads) exactly against Press et "
    "al.'s slopes for num_heads = 1..64, flagging slopes rounded to bf16/fp16/fp32."
)


class SlopeReport:
    """Outcome of :func:`check_slopes_function`.

    Attributes
    ----------
    wrong : list of int
        ``num_heads`` values whose slopes are not bit-equal to Press et al.'s.
    rounded_to : dict
        ``num_heads -> class`` for those: ``"float64"``, ``"float32"``, ``"bfloat16"``,
        ``"float16"`` (the right rule within ``2 num_heads`` ulps of float64 or float32,
        whose powers accumulate a rounding each, or within 2 ulps of bfloat16 or float16
        for values held in it) or ``"wrong rule"``.
    max_relative_error : float
        Over all heads and all ``num_heads``.
    first_detail : str
        The first wrong ``num_heads`` with its wrong entries (empty if none).

    References
    ----------
    ``docs/validation.md``, "Kernels with their own slopes"; Press et al. (2022); SPEC section 1.
    """

    def __init__(self) -> None:
        self.wrong: list[int] = []
        self.rounded_to: dict[int, str] = {}
        self.max_relative_error = 0.0
        self.first_detail = ""

    def passed(self, *, exact: bool = False) -> bool:
        """Every ``num_heads`` bit-exact, or (unless ``exact``) within float32 rounding."""
        if exact:
            return not self.wrong
        return all(self.rounded_to[h] in ("float64", "float32") for h in self.wrong)


def _as_float64(value, num_heads: int) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        value = value.numpy()
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise KernelContractError(
            f"slopes: for num_heads={num_heads} the function returned a "
            f"{type(value).__name__}, not numbers"
        ) from None
    arr = arr.reshape(-1) if arr.size == num_heads else arr
    if arr.shape != (num_heads,):
        raise KernelContractError(
            f"slopes: for num_heads={num_heads} the function returned shape {arr.shape}, "
            f"expected ({num_heads},)"
        )
    return arr


def check_slopes_function(
    function: Callable[[int], Any], max_heads: int = 64, max_bias: float = 8.0
) -> SlopeReport:
    """Compare ``function(num_heads)`` with Press et al.'s slopes for ``1..max_heads``.

    Parameters
    ----------
    function : callable
        ``function(num_heads) -> slopes`` (list, numpy array or torch tensor).
    max_heads : int
        Largest ``num_heads`` checked (``1 <= max_heads``; the CLI caps it at
        :data:`MAX_HEADS`).
    max_bias : float
        Maximum bias of the rule (:func:`plsh_ref.alibi.alibi_slopes`), default 8.

    Returns
    -------
    SlopeReport

    Raises
    ------
    KernelContractError
        If the function raises or returns a value of the wrong length or type.
    TypeError, ValueError
        If ``max_heads`` is not an integer ``>= 1`` or ``max_bias`` is not in
        ``(0, plsh_ref.alibi.MAX_BIAS)``.

    References
    ----------
    Press et al. (2022); SPEC section 1.
    """
    max_heads = check_int("max_heads", max_heads, minimum=1)
    alibi_slopes(1, max_bias=max_bias)  # validates max_bias before the function runs
    report = SlopeReport()
    for h in range(1, max_heads + 1):
        try:
            got = function(h)
        except Exception as exc:  # noqa: BLE001 - the user's function; one line
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise KernelContractError(
                f"slopes: the function raised {type(exc).__name__} for num_heads={h}: {first}"
            ) from None
        got = _as_float64(got, h)
        want = alibi_slopes(h, max_bias=max_bias)
        if np.array_equal(got, want):
            continue
        report.wrong.append(h)
        with np.errstate(invalid="ignore", divide="ignore"):
            rel = np.abs(got - want) / want
        rel = np.where(np.isnan(rel), np.inf, rel)
        report.max_relative_error = max(report.max_relative_error, float(rel.max()))
        report.rounded_to[h] = "wrong rule"
        for dtype in ("float64", "float32", "bfloat16", "float16"):
            # float64/float32: 2 ulps per head (start * ratio**i, pow(base, i) in that
            # precision accumulate a rounding per power); bf16/fp16: values held in it
            held = dtype in ("float64", "float32") or np.array_equal(
                round_to_dtype(got, dtype).astype(np.float64), got
            )
            ulps = 2 * h if dtype in ("float64", "float32") else 2
            if held and float(rel.max()) <= ulps * EPS[dtype]:
                report.rounded_to[h] = dtype
                break
        if not report.first_detail:
            bad = np.flatnonzero(got != want)[:4]
            entries = ", ".join(
                f"h={i}: {float(got[i])!r} (expected {float(want[i])!r})" for i in bad
            )
            report.first_detail = (
                f"num_heads={h}: {len(np.flatnonzero(got != want))} of {h} slopes differ; {entries}"
            )
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``plsh verify-slopes`` to ``parser``.

    References
    ----------
    ``docs/validation.md``, "Kernels with their own slopes" (``plsh verify-slopes``); ``argparse``.
    """
    parser.add_argument(
        "function",
        metavar="MODULE:FUNCTION",
        help="FUNCTION(num_heads) -> slopes, e.g. mypkg.alibi:get_slopes (the current "
        "folder is on the import path)",
    )
    parser.add_argument(
        "--max-heads",
        type=int,
        default=64,
        help=f"check num_heads = 1..N, N <= {MAX_HEADS} (default: 64)",
    )
    parser.add_argument(
        "--max-bias",
        type=float,
        default=8.0,
        help="maximum bias of Press et al.'s rule, 2^(-B (h+1)/H) (default: 8)",
    )
    parser.add_argument(
        "--exact",
        action="store_true",
        help="accept bit-equal slopes only (default: float64 and float32 rounding pass)",
    )


def run(args: argparse.Namespace) -> int:
    """Run ``plsh verify-slopes``; 0 pass, 1 fail, 2 bad input.

    References
    ----------
    ``docs/validation.md``, "Kernels with their own slopes" (``plsh verify-slopes``).
    """
    try:
        if not 1 <= args.max_heads <= MAX_HEADS:
            raise KernelContractError(
                f"--max-heads: must be in 1..{MAX_HEADS}, got {args.max_heads}"
            )
        if not (np.isfinite(args.max_bias) and 0 < args.max_bias < MAX_BIAS):
            raise KernelContractError(
                f"--max-bias: must be > 0 and < {MAX_BIAS:g}, got {args.max_bias:g}"
            )
        function = load_kernel(args.function, label="function")
        report = check_slopes_function(function, args.max_heads, args.max_bias)
    except KernelContractError as exc:
        print(f"plsh verify-slopes: error: {exc}", file=sys.stderr)
        return 2
    n = args.max_heads
    rule = "Press et al.'s slopes" + (
        f" (max_bias={args.max_bias:g})" if args.max_bias != 8.0 else ""
    )
    by_class: dict[str, list[int]] = {}
    for h in report.wrong:
        by_class.setdefault(report.rounded_to[h], []).append(h)
    passed = report.passed(exact=args.exact)
    equal = n - len(report.wrong)
    rounding = sum(len(by_class.get(c, [])) for c in ("float64", "float32"))
    if passed:
        detail = f"{equal} of {n} head counts bit-equal"
        if rounding:
            detail += f", {rounding} within float64/float32 rounding"
        print(f"PASS: plsh verify-slopes {args.function}: {rule}; {detail}")
    else:
        print(
            f"FAIL: plsh verify-slopes {args.function}: {len(report.wrong)} of {n} head "
            f"counts differ from {rule} (first: num_heads={report.wrong[0]}; largest "
            f"relative error {report.max_relative_error:.3g})"
        )
    if not report.wrong:
        return 0
    notes = {
        "float64": "within float64 rounding (the rule spelled differently): fine",
        "float32": "within float32 rounding (the right rule held in float32): fine for "
        "kernels (SPEC section 1)" + ("; --exact fails it" if args.exact else ""),
        "bfloat16": "LOW PRECISION: the right rule rounded to bfloat16; keep slopes in "
        "float32 or float64",
        "float16": "LOW PRECISION: the right rule rounded to float16; keep slopes in "
        "float32 or float64",
        "wrong rule": "WRONG RULE: not " + rule,
    }
    if args.exact and "float64" in by_class:
        notes["float64"] += "; --exact fails it"
    for name, heads in by_class.items():
        print(f"  num_heads {_ranges(heads)}: {notes[name]}")
    print(f"  {'first difference' if passed else 'first wrong'}: {report.first_detail}")
    return 0 if passed else 1


def _ranges(values) -> str:
    values = sorted(values)
    out, start = [], values[0]
    for a, b in zip(values, values[1:] + [None]):
        if b != a + 1:
            out.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out)
