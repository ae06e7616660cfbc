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
:func:`plsh_ref.testing.suite.check_case`. Cases needing an input the kernel declares
unsupported (``kernel.supports`` or ``--unsupported``) are skipped and listed, never
counted as passed. The report lists the failures, what they share (for each axis, its
share among failures against its share among passes), the worst cases with the command
that reruns each one alone (``--seed S --case K``), and optionally a JSON report.

Nothing is written to the current folder
unless ``--json PATH`` asks for it. Exit status: 0 all cases pass, 1 some case fails
(or none ran), 2 bad input (the kernel cannot be imported, has the wrong signature,
declares an unknown capability, returns the wrong type/shape/dtype, its framework cannot
be detected, or an option is invalid), always with a one-line explanation and no
traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..experiments.options import (
    JoinedValues,
    add_max_memory_option,
    check_memory,
    option_message,
    output_file,
)
from .problems import DTYPES, POSITION_MODES, ProblemSpec
from .reference import KINDS
from .suite import (
    CAPABILITIES,
    FRAMEWORKS,
    KernelContractError,
    check_case,
    check_signature,
    detect_framework,
    kernel_capabilities,
    load_kernel,
    slope_mode,
)

__all__ = [
    "HELP",
    "SUMMARY",
    "add_arguments",
    "case_features",
    "case_memory_estimate",
    "run",
    "shared_axes",
]

#: one line for ``plsh --help``
SUMMARY = "check a user's attention kernel against the reference"

#: one-line description of the subcommand, shown by ``plsh verify --help``
HELP = (
    "Check an attention kernel MODULE:FUNCTION against the float64 reference: an edge "
    "battery of known bug classes, then random problems drawn from a seed (exact ALiBi or "
    "positional LSH)."
)

_DEFAULT_DTYPES = {"numpy": "float16,float32,float64", "torch": "float16,bfloat16,float32"}
_DEFAULTS = {
    "dtypes": None,
    "causal": "both",
    "positions": ",".join(POSITION_MODES),
    "no_gqa": False,
    "max_seq_len": 16,
    "max_heads": 16,
    "max_head_dim": 8,
    "max_batch": 2,
    "max_samples": 8,
    "unsupported": None,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``plsh verify`` to ``parser``."""
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
        choices=("auto", "given", "standard"),
        default="auto",
        help="given: the kernel receives slopes (standard and random ones); standard: it "
        "takes no slopes argument and must compute Press et al.'s; auto: given if its "
        "signature has slopes (default: auto)",
    )
    parser.add_argument(
        "--framework",
        choices=("auto", *FRAMEWORKS),
        default="auto",
        help="arrays the kernel takes and returns; auto tries numpy, then torch, on one "
        "small problem (default: auto)",
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
    parser.add_argument(
        "--no-battery",
        action="store_true",
        help="skip the edge battery (it runs before the random cases by default)",
    )
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
        default=",".join(POSITION_MODES),
        help=f"comma-separated position modes (default: all of {','.join(POSITION_MODES)})",
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
        help="comma-separated inputs the kernel does not support; their cases are skipped "
        f"and listed (adds to the kernel's `supports` attribute): {', '.join(CAPABILITIES)}",
    )
    parser.add_argument("--max-seq-len", type=int, default=16, help="default: 16")
    parser.add_argument("--max-heads", type=int, default=16, help="default: 16")
    parser.add_argument("--max-head-dim", type=int, default=8, help="default: 8")
    parser.add_argument("--max-batch", type=int, default=2, help="default: 2")
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


def _check_json_path(path) -> None:
    # before the run: a report that cannot be written was only noticed after it
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise KernelContractError(f"--json: {path!r} is a folder, expected a file path")
    if not os.path.isdir(folder):
        raise KernelContractError(f"--json: folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise KernelContractError(f"--json: folder {folder!r} is not writable")


def case_memory_estimate(batch: int, heads: int, seq_len: int, head_dim: int) -> int:
    """Bytes of one case's arrays (an estimate, not a measurement), for ``plsh verify
    --max-memory``.

    Counted: six dense float64 ``(batch, heads, seq_len, seq_len)`` arrays of the
    reference (counts or bias, logits, probabilities and their temporaries) and eight
    float64 ``(batch, heads, seq_len, head_dim)`` inputs and outputs.

    Parameters
    ----------
    batch, heads, seq_len, head_dim : int
        The case's sizes (the largest ones ``--max-batch``, ``--max-heads``,
        ``--max-seq-len``, ``--max-head-dim`` allow).

    Returns
    -------
    int
        Bytes. Nothing is checked or raised here; ``plsh verify`` compares the result with
        ``--max-memory`` (:func:`plsh_ref.experiments.options.check_memory`).
    """
    return 8 * batch * heads * seq_len * (6 * seq_len + 8 * head_dim)


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
    for name, value, minimum in (
        ("cases", args.cases, 0),
        ("seed", args.seed, 0),
        ("max-seq-len", args.max_seq_len, 1),
        ("max-heads", args.max_heads, 1),
        ("max-head-dim", args.max_head_dim, 1),
        ("max-batch", args.max_batch, 1),
        ("max-samples", args.max_samples, 1),
        ("worst", args.worst, 0),
    ):
        if value < minimum:
            raise KernelContractError(f"--{name}: must be >= {minimum}, got {value}")
    _check_case_memory(args)
    if not (args.timeout > 0 and np.isfinite(args.timeout)):
        raise KernelContractError(f"--timeout: must be > 0 seconds, got {args.timeout}")
    if args.json:
        _check_json_path(args.json)
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
                "--dtypes: bfloat16 needs --framework torch (numpy has no bfloat16)"
            )
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
    return " ".join(parts)


def _label(name) -> str:
    return f"battery {name}" if isinstance(name, str) else f"case {name}"


def _json_report(path, header, records, axes, status):
    cases = []
    for name, spec, r in records:
        cases.append(
            {
                "case": name,
                "battery": isinstance(name, str),
                "status": r.status,
                "error": None if not np.isfinite(r.error) else r.error,
                "allowed": r.allowed,
                "lse_error": r.lse_error,
                "lse_allowed": r.lse_allowed,
                "worst_index": list(r.worst_index) if r.worst_index else None,
                "empty_rows": r.empty_rows,
                "message": r.message,
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
        "shared_axes": axes,
        "cases": cases,
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)


def run(args: argparse.Namespace) -> int:
    """Run ``plsh verify``; returns the exit status (0 pass, 1 fail, 2 bad input)."""
    try:
        unsupported = _options(args)
        kernel = load_kernel(args.kernel)
        slopes = args.slopes if args.slopes != "auto" else slope_mode(kernel)
        if args.kind == "plsh":
            slopes = "given"
        takes_mask = check_signature(kernel, args.kind, slopes)
        caps = kernel_capabilities(kernel, unsupported)
        framework = args.framework
        if framework == "auto" and args.device != "cpu":
            framework = "torch"  # numpy kernels run on the CPU only
        if framework == "auto":
            framework = detect_framework(kernel, args.kind, slopes, takes_mask, args.timeout)
        dtypes = _dtypes(args, framework)
        bounds = _bounds(args, dtypes, slopes)
    except KernelContractError as exc:
        return _fail(str(exc))
    from .battery import battery
    from .strategies import sample_specs

    cases: list[tuple[str | int, ProblemSpec]] = []  # battery names, or sampled case numbers
    if not args.no_battery:
        cases += battery(args.kind, seed=args.seed, dtypes=dtypes, slopes=slopes)
    specs = (
        sample_specs(args.kind, seed=args.seed, num_cases=args.cases, **bounds)
        if args.cases
        else []
    )
    cases += list(enumerate(specs))
    if args.case is not None:
        wanted = int(args.case) if args.case.isdigit() else args.case
        cases = [(n, s) for n, s in cases if n == wanted]
        if not cases:
            names = [n for n, _ in battery(args.kind, dtypes=dtypes, slopes=slopes)]
            return _fail(
                f"--case: no case {args.case!r} for these options (random cases 0.."
                f"{len(specs) - 1}, battery cases {', '.join(names)})"
            )
    unsupported_names = [c for c, ok in caps.items() if not ok]
    print(
        f"plsh verify {args.kernel}: kind={args.kind} slopes={slopes} framework={framework} "
        f"device={args.device} seed={args.seed} battery={'no' if args.no_battery else 'yes'} "
        f"cases={len(specs)} dtypes={','.join(dtypes)}"
        + (f" attention_mask={'yes' if takes_mask else 'no (padded cases skipped)'}")
        + (f" unsupported={','.join(unsupported_names)}" if unsupported_names else "")
    )
    records = []
    start = time.perf_counter()
    for name, spec in cases:
        try:
            result = check_case(
                kernel,
                spec.build(),
                framework=framework,
                device=args.device,
                slopes=slopes,
                attention_mask=takes_mask,
                supports=unsupported,
                timeout=args.timeout,
            )
        except KernelContractError as exc:
            return _fail(f"{exc} [{_label(name)}: {spec.summary()}]")
        records.append((name, spec, result))
        if args.verbose or args.case is not None:
            detail = f"\n           {result.message}" if result.message else ""
            print(
                f"  {_label(name)} {result.status} error {result.error:.3g} allowed "
                f"{result.allowed:.3g}  {spec.summary()}{detail}"
            )
        if args.case is not None:
            print(
                "  the same case in Python:\n"
                "    from plsh_ref.testing import ProblemSpec, check_case\n"
                f"    check_case(kernel, {spec!r}.build(),\n"
                f"               framework={framework!r}, device={args.device!r})"
            )
        if args.traceback and result.traceback:
            print(f"  traceback of {_label(name)}:\n" + result.traceback.rstrip())
    elapsed = time.perf_counter() - start
    failed = [rec for rec in records if rec[2].status == "FAIL"]
    skipped = [rec for rec in records if rec[2].status == "skip"]
    passed = [rec for rec in records if rec[2].status == "pass"]
    print(
        f"{len(passed)}/{len(records)} cases passed, {len(failed)} failed, {len(skipped)} "
        f"skipped in {elapsed:.1f} s (allowed error: 2 x that of plain attention in the same "
        f"dtype + 4 ulp floor)"
    )
    if skipped and args.case is None:
        print(f"skipped (never counted as passed), {len(skipped)} cases:")
        for name, spec, r in skipped[: max(args.worst, 10)]:
            print(f"  {_label(name)}: {r.message}  {spec.summary()}")
        if len(skipped) > max(args.worst, 10):
            print(f"  ... and {len(skipped) - max(args.worst, 10)} more")
    battery_failed = [rec for rec in failed if isinstance(rec[0], str)]
    if battery_failed and args.case is None:
        print("battery cases failed (named after the bug class each one targets):")
        for name, _spec, r in battery_failed:
            print(f"  {name}: {r.message}")
            if args.traceback and r.traceback:
                print("    " + r.traceback.rstrip().replace("\n", "\n    "))
    axes = shared_axes(records)
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
            print(f"    rerun: {_rerun_command(args, str(name), framework, slopes)}")
    status = 1 if failed or not passed else 0
    if failed:
        print(f"FAIL: {len(failed)} of {len(records)} cases")
    elif not passed:
        print("FAIL: no case ran (every case was skipped)")
    else:
        print("PASS" + (f" ({len(skipped)} skipped)" if skipped else ""))
    if args.json:
        header = {
            "kernel": args.kernel,
            "kind": args.kind,
            "slopes": slopes,
            "framework": framework,
            "device": args.device,
            "seed": args.seed,
            "dtypes": dtypes,
            "seconds": elapsed,
        }
        try:
            _json_report(args.json, header, records, axes, status)
        except OSError as exc:
            return _fail(f"--json: cannot write {args.json!r}: {exc}")
    return status
