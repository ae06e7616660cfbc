"""``plsh verify MODULE:FUNCTION``: check a user's attention kernel against the reference.

The kernel follows one of the contracts of :mod:`plsh_ref.testing.reference`::

    f(query, key, value, *, slopes, causal, scale, query_positions, key_positions)
    f(query, key, value, *, causal, scale, query_positions, key_positions)  # own slopes
    f(query, key, value, *, partition, causal, scale, query_positions, key_positions)

(``--kind alibi --slopes given``, ``--kind alibi --slopes standard``, ``--kind plsh``;
the slope mode is read from the signature by default), optionally with an
``attention_mask`` keyword (padded batches are then checked too), and returns ``output``
or ``(output, lse)``. First the deterministic edge battery
(:func:`plsh_ref.testing.battery.battery`, one named case per known bug class), then
``--cases`` random problems drawn from ``--seed``
(:func:`plsh_ref.testing.strategies.sample_specs`); each is judged by
:func:`plsh_ref.testing.suite.check_case`. Inputs the kernel declares unsupported
(``kernel.supports`` or ``--unsupported``) are never drawn (see below); a case that
still needs one is skipped and listed, never counted as passed. The report lists the failures, what they share (for each axis, its
share among failures against its share among passes), the worst cases with the command
that reruns each one alone (``--seed S --case K``), and optionally a JSON report.

Cases are drawn within the kernel's capabilities (:mod:`plsh_ref.testing.capabilities`)
and the battery is restricted the same way; battery cases it cannot run are listed as
not covered with the capability that excludes them.

Nothing is written to the current folder unless ``--json PATH`` or ``--junitxml PATH``
asks for it. Exit status (:data:`EXIT_STATUSES`): 0 pass, 1 some case fails, 2 bad
input (the kernel cannot be imported, calls ``sys.exit`` at import, has the wrong
signature, declares an unknown capability, returns the wrong type/shape/dtype, its
framework cannot be detected, or an option is invalid; one line, no traceback), 3
inconclusive (no failure, but fewer cases or battery classes ran than the floors
:data:`MIN_CASE_SHARE` and :data:`MIN_BATTERY_SHARE`, or ``--time-budget`` ran out; the
report names the capability or option that caused it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from ..experiments.options import (
    JoinedValues,
    add_max_memory_option,
    check_memory,
    option_message,
    output_file,
)
from ..validation import MAX_NUM_SAMPLES
from .capabilities import CAPABILITIES, effective_capabilities, kernel_capabilities
from .problems import DTYPES, RANDOM_POSITION_MODES, ProblemSpec
from .reference import KINDS
from .suite import (
    FRAMEWORKS,
    JAX_X64_MESSAGE,
    KernelContractError,
    check_case,
    check_signature,
    detect_framework,
    jax_x64_enabled,
    load_kernel,
    probe_framework,
    slope_mode,
)

#: most random cases of one run (``--cases``, ``--long-cases``); a larger value would run
#: for days (use ``--time-budget`` for long runs)
MAX_CASES = 100_000

__all__ = [
    "EXIT_STATUSES",
    "HELP",
    "MIN_BATTERY_SHARE",
    "MIN_CASE_SHARE",
    "SUMMARY",
    "add_arguments",
    "case_features",
    "case_memory_estimate",
    "parse_slopes",
    "precision_growth",
    "run",
    "shared_axes",
]

#: exit statuses of ``plsh verify``
EXIT_STATUSES = {0: "pass", 1: "fail", 2: "bad input (usage)", 3: "inconclusive"}
#: a run must run at least this share of its battery classes (those its dtypes and slope
#: mode have, opt-in conventions ``packed_varlen`` and ``tensor_parallel_heads`` aside)
MIN_BATTERY_SHARE = 0.5
#: ... and at least this share of its ``--cases`` random cases
MIN_CASE_SHARE = 0.8
#: lengths at which a precision finding's growth is measured
GROWTH_LENGTHS = (64, 128, 256, 512)
#: battery cases of opt-in conventions, not counted by the floor when not covered
_OPT_IN = ("packed_varlen", "tensor_parallel_heads")

#: one line for ``plsh --help``
SUMMARY = "check a user's attention kernel against the reference"

#: one-line description of the subcommand, shown by ``plsh verify --help``
HELP = (
    "Check an attention kernel MODULE:FUNCTION against the reference (float64; extended "
    "precision for float64 problems): an edge battery of known bug classes, then random "
    "problems drawn from a seed (exact ALiBi or positional LSH)."
)

_DEFAULT_DTYPES = {
    "numpy": "float16,float32,float64",
    "torch": "float16,bfloat16,float32",
    "jax": "float16,bfloat16,float32",
}
_DEFAULTS = {
    "dtypes": None,
    "causal": "both",
    "positions": ",".join(RANDOM_POSITION_MODES),
    "no_gqa": False,
    "max_seq_len": 16,
    "max_heads": 16,
    "max_head_dim": 8,
    "max_batch": 2,
    "max_samples": 8,
    "unsupported": None,
    "long_cases": 2,
    "strict_precision": False,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``plsh verify`` to ``parser``.

    References
    ----------
    ``docs/validation.md`` (``plsh verify`` and its options; "In CI"); ``argparse``.
    """
    parser.add_argument(
        "kernel",
        metavar="MODULE:FUNCTION",
        help="the kernel to check, e.g. mypkg.attention:alibi_forward (the current folder "
        "is on the import path)",
    )
    parser.add_argument(
        "--kind",
        choices=KINDS,
        default="alibi",
        help="alibi: f(q, k, v, *, slopes, causal, scale, query_positions, "
        "key_positions[, attention_mask]); plsh: the same with partition instead of slopes "
        "(default: alibi)",
    )
    parser.add_argument(
        "--slopes",
        default="auto",
        metavar="{auto,given,standard[:max_bias=B]}",
        help="given: the kernel receives slopes (standard and random ones); standard: it "
        "takes no slopes argument and must compute Press et al.'s (standard:max_bias=16: "
        "the rule with maximum bias 16 instead of 8); auto: given if its signature has "
        "slopes (default: auto)",
    )
    parser.add_argument(
        "--framework",
        choices=("auto", *FRAMEWORKS),
        default="auto",
        help="arrays the kernel takes and returns; auto tries numpy (a kernel returning "
        "jax arrays is jax), then torch, on one small problem (default: auto)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="torch device for --framework torch, e.g. cpu or cuda (default: cpu)",
    )
    parser.add_argument(
        "--cases", type=int, default=50, help="number of random problems (default: 50)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random cases (default: 0)")
    parser.add_argument(
        "--case",
        default=None,
        help="run only random case K of --seed, or the battery case NAME (as printed)",
    )
    _add_ci_arguments(parser)
    parser.add_argument(
        "--no-battery",
        action="store_true",
        help="skip the edge battery (it runs before the random cases by default)",
    )
    _add_restriction_arguments(parser)


def _add_ci_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--long-cases",
        type=int,
        default=2,
        help="random long cases (257-320 tokens, 8-16 heads) in each half-precision dtype "
        "of the run, after the others (default: 2)",
    )
    parser.add_argument(
        "--spec",
        action="append",
        default=[],
        metavar="JSON",
        help='a custom case: ProblemSpec fields as JSON, e.g. \'{"n_q": 1, "n_k": 700, '
        '"dtype": "float16"}\', or @FILE holding one such object or a list of them '
        "(repeatable; run after the battery, named custom_0, custom_1, ...)",
    )
    parser.add_argument(
        "--strict-precision",
        action="store_true",
        help="fail float32/float64 cases whose error is explained by rounding that grows "
        "with n * slope (a row-constant bias m * p_j); by default they pass and are reported",
    )
    parser.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop running cases after this many seconds in all; the cases not run make "
        "the run inconclusive (exit 3) unless a failure was found (default: no budget)",
    )
    parser.add_argument(
        "--junitxml",
        default=None,
        type=output_file,
        metavar="PATH",
        help="also write a JUnit XML report (one testcase per case) for CI dashboards",
    )


def _add_restriction_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dtypes",
        default=None,
        action=JoinedValues,
        element=str.strip,
        metavar="DTYPES",
        help="comma- or space-separated dtypes (default: float16,float32,float64 for numpy, "
        "float16,bfloat16,float32 for torch)",
    )
    parser.add_argument(
        "--causal",
        choices=("both", "yes", "no"),
        default="both",
        help="causal problems, bidirectional ones, or both (default: both)",
    )
    parser.add_argument(
        "--positions",
        default=",".join(RANDOM_POSITION_MODES),
        help="comma-separated position modes of the random cases; battery cases of other "
        f"modes are not covered (default: all of {','.join(RANDOM_POSITION_MODES)})",
    )
    parser.add_argument(
        "--no-gqa",
        action="store_true",
        help="never draw grouped-query heads (num_heads_kv < num_heads)",
    )
    parser.add_argument(
        "--unsupported",
        default=None,
        metavar="NAMES",
        help="comma-separated inputs the kernel does not support; cases are drawn without "
        "them and battery cases that need them are listed as not covered (adds to the "
        f"kernel's `supports` attribute): {', '.join(CAPABILITIES)}",
    )
    parser.add_argument(
        "--max-seq-len",
        type=int,
        default=16,
        help="longest query and key length (n_q, n_k) of the random cases, the long cases "
        "aside (default: 16)",
    )
    parser.add_argument(
        "--max-heads",
        type=int,
        default=16,
        help="largest number of query heads (num_heads) of the random cases (default: 16)",
    )
    parser.add_argument(
        "--max-head-dim",
        type=int,
        default=8,
        help="largest head_dim of query/key and of value in the random cases (default: 8)",
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=2,
        help="largest batch size of the random cases (default: 2)",
    )
    parser.add_argument(
        "--max-samples",
        type=int,
        default=8,
        help="largest number of partition samples s (default: 8)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds one case may take; a kernel still running then fails that case (default: 30)",
    )
    parser.add_argument(
        "--traceback", action="store_true", help="print the traceback of a kernel that raised"
    )
    parser.add_argument(
        "--json",
        default=None,
        type=output_file,
        metavar="PATH",
        help="also write a machine-readable report",
    )
    parser.add_argument(
        "--worst", type=int, default=5, help="number of worst cases to list (default: 5)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per case")
    add_max_memory_option(parser)


def _fail(message: str) -> int:
    print(f"plsh verify: error: {message}", file=sys.stderr)
    return 2


def _check_json_path(path, option: str = "--json") -> None:
    # before the run: a report that cannot be written was only noticed after it
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise KernelContractError(f"{option}: {path!r} is a folder, expected a file path")
    if not os.path.isdir(folder):
        raise KernelContractError(f"{option}: folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise KernelContractError(f"{option}: folder {folder!r} is not writable")


def parse_slopes(text: str) -> tuple[str, float]:
    """``--slopes`` as ``(mode, max_bias)``: ``"standard:max_bias=16"`` -> ``("standard", 16.0)``.

    Parameters
    ----------
    text : str
        ``auto``, ``given``, ``standard`` or ``standard:max_bias=B`` (``B`` finite, > 0).

    Returns
    -------
    (str, float)
        The mode and the maximum bias of Press et al.'s rule (8.0 unless stated).

    Raises
    ------
    KernelContractError
        On any other form (the message starts with ``--slopes``).

    References
    ----------
    ``docs/validation.md``, "Kernels with their own slopes" (``--slopes standard:max_bias=B``);
    Press et al. (2022).
    """
    mode, _, param = str(text).partition(":")
    if mode not in ("auto", "given", "standard") or (param and mode == "given"):
        raise KernelContractError(
            f"--slopes: expected auto, given, standard or standard:max_bias=B, got {text!r}"
        )
    if not param:
        return mode, 8.0
    name, _, value = param.partition("=")
    try:
        max_bias = float(value)
    except ValueError:
        max_bias = float("nan")
    if name.strip() != "max_bias" or not (np.isfinite(max_bias) and max_bias > 0):
        raise KernelContractError(
            f"--slopes: expected {mode}:max_bias=B with B finite and > 0, got {text!r}"
        )
    return mode, max_bias


def _custom_specs(values, kind: str, max_memory: float) -> list[ProblemSpec]:
    """The ``--spec`` cases: ProblemSpec fields as JSON, or ``@FILE`` (each within
    ``--max-memory``)."""
    specs = []
    fields = {f.name for f in dataclasses.fields(ProblemSpec)}
    for text in values:
        source = text
        if text.startswith("@"):
            try:
                with open(text[1:], encoding="utf-8") as f:
                    source = f.read()
            except OSError as exc:
                raise KernelContractError(f"--spec: cannot read {text[1:]!r}: {exc}") from None
        try:
            data = json.loads(source)
        except json.JSONDecodeError as exc:
            raise KernelContractError(f"--spec: not JSON ({exc}): {text!r}") from None
        for item in data if isinstance(data, list) else [data]:
            if not isinstance(item, dict):
                raise KernelContractError(f"--spec: expected a JSON object, got {item!r}")
            unknown = sorted(set(item) - fields)
            if unknown:
                raise KernelContractError(
                    f"--spec: unknown field(s) {', '.join(unknown)}; ProblemSpec has "
                    f"{', '.join(sorted(fields))}"
                )
            try:
                specs.append(ProblemSpec(**{"kind": kind, **item}))
            except (TypeError, ValueError) as exc:
                raise KernelContractError(f"--spec: {exc}") from None
            _check_spec_memory(f"custom_{len(specs) - 1}", specs[-1], max_memory)
    return specs


def case_memory_estimate(
    batch: int, heads: int, seq_len: int, head_dim: int, *, n_k: int | None = None
) -> int:
    """Bytes of one case's arrays (an estimate, not a measurement), for ``plsh verify
    --max-memory``.

    Counted: six dense float64 ``(batch, heads, seq_len, n_k)`` arrays of the reference
    (counts or bias, logits, probabilities and their temporaries) and eight float64
    ``(batch, heads, max(seq_len, n_k), head_dim)`` inputs and outputs.

    Parameters
    ----------
    batch, heads, seq_len, head_dim : int
        The case's sizes (the largest ones ``--max-batch``, ``--max-heads``,
        ``--max-seq-len``, ``--max-head-dim`` allow); ``seq_len`` is the number of
        queries ``n_q``.
    n_k : int, optional
        The number of keys (default: ``seq_len``, a square problem); a ``--spec`` case
        may have ``n_q != n_k``.

    Returns
    -------
    int
        Bytes. Nothing is checked or raised here; ``plsh verify`` compares the result with
        ``--max-memory`` (:func:`plsh_ref.experiments.options.check_memory`).

    References
    ----------
    ``README.md``, "Command line" (sizes over ``--max-memory`` are refused before
    allocating).
    """
    n_k = seq_len if n_k is None else n_k
    return 8 * batch * heads * (6 * seq_len * n_k + 8 * max(seq_len, n_k) * head_dim)


def _check_spec_memory(name: str, spec: ProblemSpec, max_memory: float) -> None:
    # before the case is built: a --spec of n_q = n_k = 10**8 ignored --max-memory and
    # started allocating
    need = case_memory_estimate(
        spec.batch,
        max(spec.num_heads, spec.num_heads_kv),
        spec.n_q,
        max(spec.head_dim, spec.head_dim_v),
        n_k=spec.n_k,
    )
    try:
        check_memory("--spec", f"{name} ({spec.summary()})", need, max_memory)
    except ValueError as exc:
        raise KernelContractError(str(exc)) from None


def _check_case_memory(args) -> None:
    # before any case is drawn: --max-seq-len 100000000000 reached numpy's "Unable to
    # allocate 3.15 TiB"; each option is checked with the ones before it, so the message
    # names the option that makes the largest case too big
    n, d, b, h = args.max_seq_len, args.max_head_dim, args.max_batch, args.max_heads
    for option, value, need in (
        ("--max-seq-len", n, case_memory_estimate(1, 1, n, 1)),
        ("--max-head-dim", d, case_memory_estimate(1, 1, n, d)),
        ("--max-batch", b, case_memory_estimate(b, 1, n, d)),
        ("--max-heads", h, case_memory_estimate(b, h, n, d)),
    ):
        try:
            check_memory(option, value, need, args.max_memory)
        except ValueError as exc:
            raise KernelContractError(str(exc)) from None


def _options(args):
    if args.framework == "numpy" and args.device != "cpu":
        raise KernelContractError(
            f"--device: numpy kernels run on cpu, got {args.device!r} (use --framework torch)"
        )
    if args.framework == "jax":
        try:
            import jax  # noqa: F401
        except ImportError:
            raise KernelContractError("--framework: jax is not installed") from None
        if args.device != "cpu":
            raise KernelContractError(f"--device: jax kernels run on cpu here, got {args.device!r}")
    if args.framework in ("torch", "auto") and args.device != "cpu" or args.framework == "torch":
        try:
            import torch
        except ImportError:
            if args.framework == "torch":
                raise KernelContractError("--framework: torch is not installed") from None
        else:
            try:
                torch.empty(0, device=args.device)
            except (RuntimeError, AssertionError) as exc:
                raise KernelContractError(
                    f"--device: {args.device!r} is not available: {str(exc).splitlines()[0]}"
                ) from None
    for name, value, minimum, maximum in (
        ("cases", args.cases, 0, MAX_CASES),
        ("seed", args.seed, 0, None),
        ("max-seq-len", args.max_seq_len, 1, None),
        ("max-heads", args.max_heads, 1, None),
        ("max-head-dim", args.max_head_dim, 1, None),
        ("max-batch", args.max_batch, 1, None),
        ("max-samples", args.max_samples, 1, MAX_NUM_SAMPLES),
        ("worst", args.worst, 0, None),
        ("long-cases", args.long_cases, 0, MAX_CASES),
    ):
        if value < minimum:
            raise KernelContractError(f"--{name}: must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise KernelContractError(f"--{name}: must be <= {maximum}, got {value}")
    _check_case_memory(args)
    if not (args.timeout > 0 and np.isfinite(args.timeout)):
        raise KernelContractError(f"--timeout: must be > 0 seconds, got {args.timeout}")
    if args.time_budget is not None and not (
        args.time_budget > 0 and np.isfinite(args.time_budget)
    ):
        raise KernelContractError(f"--time-budget: must be > 0 seconds, got {args.time_budget}")
    if args.json:
        _check_json_path(args.json)
    if args.junitxml:
        _check_json_path(args.junitxml, "--junitxml")
    unsupported = {}
    for name in (args.unsupported or "").split(","):
        if name.strip():
            if name.strip() not in CAPABILITIES:
                raise KernelContractError(
                    f"--unsupported: unknown capability {name.strip()!r}; known: "
                    f"{', '.join(CAPABILITIES)}"
                )
            unsupported[name.strip()] = False
    return unsupported


def _dtypes(args, framework):
    names = (args.dtypes or _DEFAULT_DTYPES[framework]).split(",")
    dtypes = [d.strip() for d in names if d.strip()]
    for d in dtypes:
        if d not in DTYPES:
            raise KernelContractError(
                f"--dtypes: unknown dtype {d!r}; choose from {','.join(DTYPES)}"
            )
        if d == "bfloat16" and framework == "numpy":
            raise KernelContractError(
                "--dtypes: bfloat16 needs --framework torch or jax (numpy has no bfloat16)"
            )
        if d == "float64" and framework == "jax" and not jax_x64_enabled():
            raise KernelContractError(JAX_X64_MESSAGE)
    if not dtypes:
        raise KernelContractError("--dtypes: needs at least one dtype")
    return dtypes


def _bounds(args, dtypes, slopes):
    positions = [p.strip() for p in args.positions.split(",") if p.strip()]
    bounds = dict(
        max_batch=args.max_batch,
        max_heads=args.max_heads,
        max_seq_len=args.max_seq_len,
        max_head_dim=args.max_head_dim,
        dtypes=dtypes,
        causal={"both": None, "yes": True, "no": False}[args.causal],
        gqa=not args.no_gqa,
        positions=positions,
        max_samples=args.max_samples,
        slopes=["standard"] if slopes == "standard" else ["standard", "random"],
    )
    try:
        from .strategies import problem_specs

        problem_specs(args.kind, **bounds)
    except (TypeError, ValueError) as exc:
        raise KernelContractError(option_message(exc, bounds)) from None
    return bounds


def case_features(spec: ProblemSpec, empty_rows: int = 0) -> list[str]:
    """The axes of one case, as labels: ``dtype=float16``, ``gqa(1<H_kv<H)``, ...

    Parameters
    ----------
    spec : ProblemSpec
    empty_rows : int
        Rows without an admissible key (from the case's result).

    Returns
    -------
    list of str

    References
    ----------
    ``docs/validation.md``, "Reading the report" (what the failing cases share).
    """
    h, g = spec.num_heads, spec.num_heads_kv
    labels = [
        f"dtype={spec.dtype}",
        "causal" if spec.causal else "bidirectional",
        "mha" if g == h else ("mqa(H_kv=1)" if g == 1 else "gqa(1<H_kv<H)"),
        "H power of two" if h & (h - 1) == 0 else "H not a power of two",
        f"positions={spec.positions}",
        f"slopes={spec.slopes}",
    ]
    if h >= 9:
        labels.append("H>=9")
    if spec.n_k == 0 or spec.n_q == 0:
        labels.append("empty (n=0)")
    elif spec.n_q == spec.n_k:
        labels.append("n_q=n_k")
    elif spec.n_q < spec.n_k:
        labels.append("decode(1<=n_q<n_k)")
    else:
        labels.append("n_q>n_k")
    if empty_rows:
        labels.append("rows without admissible keys")
    if spec.offset > 256 or spec.positions in ("explicit", "per_sequence"):
        labels.append("positions >256")
    if max(spec.n_q, spec.n_k) > 256:
        labels.append("seq_len>256")
    if spec.batch > 1:
        labels.append("batch>1")
    if spec.head_dim_v != spec.head_dim:
        labels.append("head_dim_v!=head_dim")
    if spec.head_dim & (spec.head_dim - 1):
        labels.append("head_dim not a power of two")
    labels.append("scale given" if spec.scale is not None else "default scale")
    if spec.kind == "plsh":
        labels.append("s=1" if spec.num_samples == 1 else "s>1")
    return labels


def shared_axes(records: Sequence[tuple[Any, ProblemSpec, Any]], top: int = 8) -> list[dict]:
    """What the failing cases share: each label's count among failures and among passes.

    Parameters
    ----------
    records : list of (str, ProblemSpec, CaseResult)
    top : int
        At most this many labels, the most over-represented among failures first.

    Returns
    -------
    list of dict
        ``{"axis", "failures", "num_failures", "passes", "num_passes"}`` for labels whose
        share among failures exceeds their share among passes: first those every failure
        has (by their share among passes, lowest first), then by the difference of shares.

    References
    ----------
    ``docs/validation.md``, "Reading the report" (what the failing cases share).
    """
    failed = [
        case_features(s, r.empty_rows) for _, s, r in records if not r.passed and not r.skipped
    ]
    passed = [case_features(s, r.empty_rows) for _, s, r in records if r.passed]
    if not failed:
        return []
    labels = sorted({label for f in failed for label in f})
    rows = []
    for label in labels:
        nf = sum(label in f for f in failed)
        np_ = sum(label in p for p in passed)
        share_f, share_p = nf / len(failed), (np_ / len(passed) if passed else 0.0)
        if share_f > share_p:
            rows.append((share_f - share_p, share_f, label, nf, np_))
    # labels every failure has come first (fewest passes first), then by share difference
    rows.sort(key=lambda r: (r[1] < 1.0, -r[0], -r[1], r[2]))
    return [
        {
            "axis": label,
            "failures": nf,
            "num_failures": len(failed),
            "passes": np_,
            "num_passes": len(passed),
        }
        for _, _, label, nf, np_ in rows[:top]
    ]


def _rerun_command(args, case: str, framework: str, slopes: str) -> str:
    parts = [f"plsh verify {args.kernel} --kind {args.kind} --slopes {slopes}"]
    parts.append(f"--framework {framework}")
    if args.device != "cpu":
        parts.append(f"--device {args.device}")
    parts.append(f"--seed {args.seed} --cases {args.cases} --case {case}")
    for name, default in _DEFAULTS.items():
        value = getattr(args, name)
        if value != default:
            flag = "--" + name.replace("_", "-")
            parts.append(flag if value is True else f"{flag} {value}")
    for text in args.spec:
        parts.append(f"--spec '{text}'")
    return " ".join(parts)


def _slopes_text(setup) -> str:
    """The ``--slopes`` value that reproduces the run's slope mode."""
    return setup.slopes + (f":max_bias={setup.max_bias:g}" if setup.max_bias != 8.0 else "")


def _label(name) -> str:
    if isinstance(name, str):
        return f"custom case {name}" if name.startswith("custom_") else f"battery {name}"
    return f"case {name}"


def _group(name) -> str:
    if isinstance(name, str):
        return "custom" if name.startswith("custom_") else "battery"
    return "random"


@dataclasses.dataclass
class _Setup:
    """What one ``plsh verify`` run checks, and how (resolved from the options)."""

    kernel: Callable[..., Any]
    slopes: str
    max_bias: float
    framework: str
    dtypes: list
    bounds: dict
    caps: dict
    unsupported: dict
    takes_mask: bool
    custom: list


@dataclasses.dataclass
class _Plan:
    """The cases of one run: ``(name, spec)`` in order, and the battery not covered."""

    cases: list
    not_covered: list
    num_random: int
    num_battery_classes: int


def _setup(args) -> _Setup:
    unsupported = _options(args)
    mode, max_bias = parse_slopes(args.slopes)
    # before the kernel is imported or called: a --spec too large for --max-memory
    custom = _custom_specs(args.spec, args.kind, args.max_memory)
    kernel = load_kernel(args.kernel)
    slopes = mode if mode != "auto" else slope_mode(kernel)
    if args.kind == "plsh":
        slopes = "given"
    elif mode == "auto" and _opaque(kernel):
        slopes = _probe_slope_mode(args, kernel)
    takes_mask = check_signature(kernel, args.kind, slopes)
    caps = effective_capabilities(kernel, unsupported, slopes=slopes)
    caps["attention_mask"] = caps["attention_mask"] and takes_mask
    _check_causal(args, caps, unsupported)
    framework = args.framework
    if framework == "auto" and args.device != "cpu":
        framework = "torch"  # numpy kernels run on the CPU only
    if framework == "auto":
        framework = detect_framework(kernel, args.kind, slopes, takes_mask, args.timeout)
    elif args.device == "cpu":
        _check_framework(args, kernel, slopes, takes_mask)
    dtypes = _dtypes(args, framework)
    bounds = _bounds(args, dtypes, slopes)
    return _Setup(
        kernel, slopes, max_bias, framework, dtypes, bounds, caps, unsupported, takes_mask, custom
    )


def _check_framework(args, kernel, slopes: str, takes_mask: bool) -> None:
    """A given ``--framework`` that the kernel refuses while another works: a usage error.

    It once ran every case, each failing with the same exception from the kernel
    (``0/45 cases passed``), which reads as a broken kernel. A kernel that fails in every
    framework is left to the cases (they report what it raised)."""
    found, note = probe_framework(
        kernel, args.kind, slopes, takes_mask, args.framework, args.timeout
    )
    if found is not None:
        return
    try:
        other = detect_framework(kernel, args.kind, slopes, takes_mask, args.timeout)
    except KernelContractError:
        return
    if other != args.framework:
        raise KernelContractError(
            f"--framework {args.framework}: the kernel does not take {args.framework} arrays "
            f"({note}) but runs on {other} arrays; pass --framework {other} (or leave it out)"
        )


def _check_causal(args, caps: dict, unsupported: dict) -> None:
    # before any case: `--causal yes --unsupported causal` ran the battery's bidirectional
    # cases only and passed, though it asked for causal cases and declared them unsupported
    def source(name: str) -> str:
        if name in unsupported:
            return f"--unsupported {name}"
        return f"the kernel's supports[{name!r}] = False"

    wanted = {"yes": "causal", "no": "bidirectional"}.get(args.causal)
    if wanted is not None and not caps[wanted]:
        raise KernelContractError(
            f"--causal {args.causal}: asks for {wanted} problems only, but {source(wanted)} "
            f"declares them unsupported; drop one of the two"
        )
    if not caps["causal"] and not caps["bidirectional"]:
        given = [n for n in ("causal", "bidirectional") if n in unsupported]
        if len(given) == 2:
            first = "--unsupported: causal and bidirectional together leave"
        elif given:
            other = "causal" if given == ["bidirectional"] else "bidirectional"
            first = f"--unsupported {given[0]}: together with {source(other)} it leaves"
        else:
            first = "supports: causal and bidirectional both False leave"
        raise KernelContractError(
            f"{first} no problem to check (every problem is causal or bidirectional)"
        )


def _opaque(kernel) -> bool:
    """A ``(*args, **kwargs)`` wrapper: its signature says nothing of ``slopes``."""
    import inspect

    try:
        params = inspect.signature(kernel).parameters.values()
    except (TypeError, ValueError):
        return False
    return bool(params) and all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)


def _probe_slope_mode(args, kernel) -> str:
    """Given-slopes mode unless one small call with ``slopes`` fails because of it."""
    framework = args.framework
    try:
        if framework == "auto":
            detect_framework(kernel, args.kind, "given", True, args.timeout)
        return "given"
    except KernelContractError as exc:
        if "slopes" in str(exc):
            return "standard"
        raise


def _plan(args, setup: _Setup):
    """The run's cases (battery, custom, random, long random), or an exit status."""
    from .battery import battery_plan
    from .strategies import long_specs, sample_specs

    causal = setup.bounds["causal"]
    cases: list[Any] = []  # (battery name or sampled case number, ProblemSpec)
    not_covered: list[Any] = []
    if not args.no_battery:
        cases, not_covered = battery_plan(
            args.kind,
            seed=args.seed,
            dtypes=setup.dtypes,
            slopes=setup.slopes,
            max_bias=setup.max_bias,
            causal=causal,
            positions=None
            if args.positions == _DEFAULTS["positions"]
            else setup.bounds["positions"],
            capabilities=setup.caps,
        )
        not_covered = [_explained(nc, setup) for nc in not_covered]
    num_classes = len(cases) + len(not_covered)
    cases += [(f"custom_{i}", spec) for i, spec in enumerate(setup.custom)]
    caps = dict(setup.caps)
    specs = []
    if args.cases:
        specs = sample_specs(
            args.kind,
            seed=args.seed,
            num_cases=args.cases,
            capabilities=caps,
            max_bias=setup.max_bias,
            **setup.bounds,
        )
    halves = [d for d in setup.dtypes if d in ("float16", "bfloat16") and caps[d]]
    specs += long_specs(
        args.kind,
        seed=args.seed,
        num_cases=args.long_cases * len(halves),
        dtypes=halves,
        causal=causal,
        capabilities=caps,
        max_bias=setup.max_bias,
        slopes=setup.bounds["slopes"],
    )
    cases += list(enumerate(specs))
    if args.case is not None:
        wanted = int(args.case) if args.case.isdigit() else args.case
        chosen = [(n, s) for n, s in cases if n == wanted]
        if not chosen:
            names = [n for n, _ in cases if isinstance(n, str)]
            return _fail(
                f"--case: no case {args.case!r} for these options (random cases 0.."
                f"{len(specs) - 1}, battery cases {', '.join(names)})"
            )
        cases = chosen
    return _Plan(cases, not_covered, args.cases, num_classes)


#: why a capability read from the signature is missing
_SIGNATURE_REASONS = {
    "attention_mask": "attention_mask (the kernel takes no attention_mask argument)",
    "varlen": "varlen (the kernel takes no cu_seqlens argument)",
    "head_slice": "head_slice (the kernel takes no head_start, num_heads_total arguments)",
}


def _explained(nc, setup: _Setup):
    declared = kernel_capabilities(setup.kernel, setup.unsupported)
    if nc.reason in _SIGNATURE_REASONS and declared[nc.reason]:
        return dataclasses.replace(nc, reason=_SIGNATURE_REASONS[nc.reason])
    return nc


def _print_header(args, setup: _Setup, plan: _Plan) -> None:
    unsupported_names = [c for c, ok in setup.caps.items() if not ok and c in setup.unsupported]
    attribute = kernel_capabilities(setup.kernel)
    declared = [c for c, ok in attribute.items() if not ok and c not in unsupported_names]
    num_random = sum(not isinstance(n, str) for n, _ in plan.cases)
    slopes = _slopes_text(setup)
    print(
        f"plsh verify {args.kernel}: kind={args.kind} slopes={slopes} "
        f"framework={setup.framework} device={args.device} seed={args.seed} "
        f"battery={'no' if args.no_battery else 'yes'} cases={num_random} "
        f"dtypes={','.join(setup.dtypes)}"
        + (f" attention_mask={'yes' if setup.takes_mask else 'no (padded cases not covered)'}")
        + (f" unsupported={','.join(unsupported_names)}" if unsupported_names else "")
        + (f" supports False: {','.join(declared)}" if declared else "")
    )


def _run_cases(args, setup: _Setup, cases):
    """``(records, names not run, seconds)``; an exit status on a contract violation."""
    records, not_run = [], []
    start = time.perf_counter()
    for name, spec in cases:
        timeout = args.timeout
        if args.time_budget is not None:
            left = args.time_budget - (time.perf_counter() - start)
            if left <= 0:
                not_run.append(name)
                continue
            timeout = min(timeout, left)
        try:
            result = check_case(
                setup.kernel,
                spec.build(),
                framework=setup.framework,
                device=args.device,
                slopes=setup.slopes,
                attention_mask=setup.takes_mask,
                supports=setup.unsupported,
                timeout=timeout,
                strict_precision=args.strict_precision,
            )
        except KernelContractError as exc:
            return _fail(f"{exc} [{_label(name)}: {spec.summary()}]"), None, 0.0
        if timeout < args.timeout and result.message.startswith("timed out"):
            not_run.append(name)  # stopped by the budget, not by --timeout: not a failure
            continue
        records.append((name, spec, result))
        _print_case(args, setup, name, spec, result)
    return records, not_run, time.perf_counter() - start


def _print_case(args, setup, name, spec, result) -> None:
    if args.verbose or args.case is not None:
        detail = f"\n           {result.message}" if result.message else ""
        if result.finding and not result.message:
            detail = f"\n           {result.finding}"
        print(
            f"  {_label(name)} {result.status} error {result.error:.3g} allowed "
            f"{result.allowed:.3g}  {spec.summary()}{detail}"
        )
    if args.case is not None:
        print(
            "  the same case in Python:\n"
            "    from plsh_ref.testing import ProblemSpec, check_case\n"
            f"    check_case(kernel, {spec!r}.build(),\n"
            f"               framework={setup.framework!r}, device={args.device!r})"
        )
    if args.traceback and result.traceback:
        print(f"  traceback of {_label(name)}:\n" + result.traceback.rstrip())


def precision_growth(
    kernel: Callable[..., Any],
    spec: ProblemSpec,
    lengths: Sequence[int] = GROWTH_LENGTHS,
    **check: Any,
) -> list[dict]:
    """The error of ``kernel`` on ``spec`` at several lengths (``n_q = n_k = n``).

    Parameters
    ----------
    kernel : callable
    spec : ProblemSpec
        A case with a precision finding.
    lengths : sequence of int
    **check
        Keyword arguments of :func:`~plsh_ref.testing.suite.check_case`.

    Returns
    -------
    list of dict
        ``{"n", "error", "allowed"}`` per length (float; ``error`` may exceed ``allowed``).

    References
    ----------
    ``docs/validation.md``, "The tolerance rule" (precision findings: reruns at n = 64 to 512).
    """
    rows = []
    for n in lengths:
        r = check_case(kernel, spec.replace(n_q=n, n_k=n).build(), **check)
        rows.append({"n": int(n), "error": float(r.error), "allowed": float(r.allowed)})
    return rows


def _precision_report(args, setup: _Setup, records) -> list[dict]:
    """The precision findings, each with its growth (error against n), printed."""
    found = [(n, s, r) for n, s, r in records if r.finding]
    if not found or args.case is not None and not args.verbose:
        return []
    name, spec, _ = max(found, key=lambda rec: rec[1].n_k)
    check = dict(
        framework=setup.framework,
        device=args.device,
        slopes=setup.slopes,
        attention_mask=setup.takes_mask,
        supports=setup.unsupported,
        timeout=args.timeout,
    )
    growth = precision_growth(setup.kernel, spec, **check)
    failing = [n for n, _, r in found if r.status == "FAIL"]
    # a rounding finding explains its own cases only: where other cases fail with no
    # finding, the kernel has an error that no rounding explains (a sign flip once read as
    # "half-precision position arithmetic" first), so the finding is put after it
    unexplained = sum(r.status == "FAIL" and not r.finding for _, _, r in records)
    besides = (
        f"; besides these, {unexplained} failing cases that no rounding explains (above): "
        "fix those first"
        if unexplained
        else ""
    )
    print(
        f"precision findings, {len(found)} cases ({len(failing)} failing): "
        f"{found[0][2].finding.split(' (output error')[0]}{besides}; error against n "
        f"({_label(name)}, {spec.dtype}, n_q = n_k = n):"
    )
    for row in growth:
        print(
            f"  n={row['n']:<5} error {row['error']:.3g}  allowed {row['allowed']:.3g}  "
            f"({row['error'] / row['allowed'] if row['allowed'] else float('inf'):.2g}x)"
        )
    if spec.dtype in ("float32", "float64") and not args.strict_precision:
        print(
            "  exact in real arithmetic; float32 rounding that grows with n * slope: not a "
            "failure here (--strict-precision makes it one); judge it at your context length"
        )
    return [{"case": n, "finding": r.finding, "growth": growth} for n, _, r in found]


def _print_not_covered(args, plan: _Plan, records) -> None:
    skipped = [rec for rec in records if rec[2].status == "skip"]
    if skipped and args.case is None:
        print(f"skipped (never counted as passed), {len(skipped)} cases:")
        for name, spec, r in skipped[: max(args.worst, 10)]:
            print(f"  {_label(name)}: {r.message}  {spec.summary()}")
        if len(skipped) > max(args.worst, 10):
            print(f"  ... and {len(skipped) - max(args.worst, 10)} more")
    if args.case is not None:
        return
    # opt-in conventions apart: the verdict's "N battery cases not covered" leaves them out
    counted = [nc for nc in plan.not_covered if nc.name not in _OPT_IN]
    opt_in = [nc for nc in plan.not_covered if nc.name in _OPT_IN]
    if counted:
        print(f"battery cases not covered ({len(counted)}; excluded by):")
        for nc in counted:
            print(f"  {nc.name}: {nc.reason}")
    if opt_in:
        print(f"opt-in conventions not covered ({len(opt_in)}; not counted in the verdict):")
        for nc in opt_in:
            print(f"  {nc.name}: {nc.reason}")


def _print_failures(args, setup: _Setup, records, axes) -> None:
    failed = [rec for rec in records if rec[2].status == "FAIL"]
    battery_failed = [rec for rec in failed if isinstance(rec[0], str)]
    if battery_failed and args.case is None:
        print("battery cases failed (named after the bug class each one targets):")
        for name, _spec, r in battery_failed:
            print(f"  {name}: {r.message}")
            if args.traceback and r.traceback:
                print("    " + r.traceback.rstrip().replace("\n", "\n    "))
    if axes and args.case is None:
        print("what the failing cases share (axis: failures vs passes):")
        for a in axes:
            print(
                f"  {a['axis']:<32} {a['failures']}/{a['num_failures']} vs "
                f"{a['passes']}/{a['num_passes']}"
            )
    worst = sorted(failed, key=lambda rec: -rec[2].ratio)[: args.worst]
    if worst and args.case is None:
        print("worst failing cases (error / allowed):")
        for name, spec, r in worst:
            ratio = "inf" if r.ratio == float("inf") else f"{r.ratio:.3g}"
            print(f"  {_label(name)}: FAIL ratio {ratio}  {spec.summary()}")
            print(f"    {r.message}")
            print(
                f"    rerun: {_rerun_command(args, str(name), setup.framework, _slopes_text(setup))}"
            )


def _inconclusive_reason(args, setup: _Setup, plan: _Plan, records, not_run) -> str:
    """Why the run is too thin to pass (empty if it is not)."""
    if args.case is not None:
        return "" if any(r.status == "pass" for _, _, r in records) else "the case was skipped"
    ran = [rec for rec in records if rec[2].status != "skip"]
    if not ran:
        return "no case ran (every case was skipped)"
    if not_run:
        return f"--time-budget {args.time_budget:g} s ran out: {len(not_run)} cases not run"
    reasons = []
    counted = [nc for nc in plan.not_covered if nc.name not in _OPT_IN and "same" not in nc.reason]
    classes = plan.num_battery_classes - (len(plan.not_covered) - len(counted))
    covered = classes - len(counted)
    if not args.no_battery and classes and covered < MIN_BATTERY_SHARE * classes:
        by: dict[str, Any] = {}
        for nc in counted:
            by[nc.reason] = by.get(nc.reason, 0) + 1
        top = ", ".join(f"{r} ({k})" for r, k in sorted(by.items(), key=lambda t: -t[1]))
        reasons.append(
            f"{covered} of {classes} battery classes covered, below the floor of "
            f"{MIN_BATTERY_SHARE:.0%}; excluded by {top}"
        )
    random_ran = sum(isinstance(n, int) and r.status != "skip" for n, _, r in records)
    if plan.num_random and random_ran < MIN_CASE_SHARE * min(plan.num_random, 50):
        off = [c for c, ok in setup.caps.items() if not ok and c not in DTYPES]
        reasons.append(
            f"{random_ran} random cases ran of {plan.num_random} asked, below the floor of "
            f"{MIN_CASE_SHARE:.0%}: the space left by {', '.join(off) or 'the options'} "
            f"is too small"
        )
    return "; ".join(reasons)


def _verdict(args, setup, plan, records, not_run) -> tuple[int, str]:
    failed = [rec for rec in records if rec[2].status == "FAIL"]
    skipped = [rec for rec in records if rec[2].status == "skip"]
    if failed:
        return 1, f"FAIL: {len(failed)} of {len(records)} cases"
    reason = _inconclusive_reason(args, setup, plan, records, not_run)
    if reason:
        return 3, f"INCONCLUSIVE: {reason}"
    notes = []
    if skipped:
        notes.append(f"{len(skipped)} skipped")
    # the count of the summary's "battery cases not covered (N; ...)" line (opt-in
    # conventions are listed apart there): it once counted them, "5" against "PASS (4 ...)"
    not_covered = [nc for nc in plan.not_covered if nc.name not in _OPT_IN]
    if not_covered:
        notes.append(f"{len(not_covered)} battery cases not covered")
    findings = sum(bool(r.finding) for _, _, r in records)
    if findings:
        notes.append(f"{findings} precision findings")
    return 0, "PASS" + (f" ({', '.join(notes)})" if notes else "")


def _write_reports(args, setup, plan, records, axes, status, elapsed, findings):
    header = {
        "kernel": args.kernel,
        "kind": args.kind,
        "slopes": setup.slopes,
        "max_bias": setup.max_bias,
        "framework": setup.framework,
        "device": args.device,
        "seed": args.seed,
        "dtypes": setup.dtypes,
        "seconds": elapsed,
        "not_covered": [dataclasses.asdict(nc) for nc in plan.not_covered],
        "precision_findings": findings,
    }
    option = "--json"
    try:
        if args.json:
            _json_report(args.json, header, records, axes, status)
        option = "--junitxml"
        if args.junitxml:
            _junit_report(args.junitxml, args, records, plan, elapsed)
    except OSError as exc:
        return _fail(f"{option}: cannot write the report: {exc}")
    return status


def run(args: argparse.Namespace) -> int:
    """Run ``plsh verify``; returns the exit status (:data:`EXIT_STATUSES`).

    References
    ----------
    ``docs/validation.md``: the exit statuses (its opening table), "Reading the report" and "In
    CI".
    """
    try:
        setup = _setup(args)
    except KernelContractError as exc:
        return _fail(str(exc))
    plan = _plan(args, setup)
    if isinstance(plan, int):
        return plan
    _print_header(args, setup, plan)
    records, not_run, elapsed = _run_cases(args, setup, plan.cases)
    if isinstance(records, int):
        return records
    failed = sum(r.status == "FAIL" for _, _, r in records)
    skipped = sum(r.status == "skip" for _, _, r in records)
    passed = sum(r.status == "pass" for _, _, r in records)
    print(
        f"{passed}/{len(records)} cases passed, {failed} failed, {skipped} "
        f"skipped in {elapsed:.1f} s (allowed error: 2 x that of plain attention in the same "
        f"dtype + 4 ulp floor)"
    )
    _print_not_covered(args, plan, records)
    axes = shared_axes(records)
    _print_failures(args, setup, records, axes)
    findings = _precision_report(args, setup, records)
    status, verdict = _verdict(args, setup, plan, records, not_run)
    print(verdict)
    return _write_reports(args, setup, plan, records, axes, status, elapsed, findings)


def _json_report(path, header, records, axes, status):
    cases = []
    for name, spec, r in records:
        cases.append(
            {
                "case": name,
                "battery": _group(name) == "battery",
                "group": _group(name),
                "status": r.status,
                "error": None if not np.isfinite(r.error) else r.error,
                "allowed": r.allowed,
                "lse_error": r.lse_error,
                "lse_allowed": r.lse_allowed,
                "worst_index": list(r.worst_index) if r.worst_index else None,
                "empty_rows": r.empty_rows,
                "message": r.message,
                "finding": r.finding,
                "summary": spec.summary(),
                "spec": dataclasses.asdict(spec),
                "features": case_features(spec, r.empty_rows),
            }
        )
    report = {
        **header,
        "passed": sum(r.status == "pass" for _, _, r in records),
        "failed": sum(r.status == "FAIL" for _, _, r in records),
        "skipped": sum(r.status == "skip" for _, _, r in records),
        "exit_status": status,
        "verdict": EXIT_STATUSES[status],
        "shared_axes": axes,
        "cases": cases,
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)


def _junit_report(path, args, records, plan, elapsed) -> None:
    """A JUnit XML report: one testsuite, one testcase per case (not covered: skipped)."""
    import xml.etree.ElementTree as ET

    failures = sum(r.status == "FAIL" for _, _, r in records)
    skips = sum(r.status == "skip" for _, _, r in records) + len(plan.not_covered)
    suite = ET.Element(
        "testsuite",
        name=f"plsh verify {args.kernel}",
        tests=str(len(records) + len(plan.not_covered)),
        failures=str(failures),
        errors="0",
        skipped=str(skips),
        time=f"{elapsed:.3f}",
    )
    for name, spec, r in records:
        case = ET.SubElement(
            suite, "testcase", classname=f"plsh_verify.{_group(name)}", name=str(name)
        )
        if r.status == "FAIL":
            failure = ET.SubElement(case, "failure", message=r.message[:500])
            failure.text = f"{r.message}\n{spec.summary()}\n{r.traceback}"
        elif r.status == "skip":
            ET.SubElement(case, "skipped", message=r.message)
        if r.finding:
            ET.SubElement(case, "system-out").text = r.finding
    for nc in plan.not_covered:
        case = ET.SubElement(suite, "testcase", classname="plsh_verify.battery", name=nc.name)
        ET.SubElement(case, "skipped", message=f"not covered: {nc.reason}")
    cast(Any, ET.ElementTree(ET.Element("testsuites")).getroot()).append(suite)
    tree = ET.ElementTree(suite)
    tree.write(path, encoding="utf-8", xml_declaration=True)
