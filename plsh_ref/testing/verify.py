"""``plsh verify MODULE:FUNCTION``: check a user's attention kernel against the reference.

The kernel follows one of two contracts (:mod:`plsh_ref.testing.reference`)::

    f(query, key, value, *, slopes, causal, scale, query_positions, key_positions)
    f(query, key, value, *, partition, causal, scale, query_positions, key_positions)

(``--kind alibi`` and ``--kind plsh``)

and returns ``output`` or ``(output, lse)``. Hypothesis draws ``--cases`` problems from
``--seed`` (:func:`plsh_ref.testing.strategies.sample_specs`); each is run and judged by
:func:`plsh_ref.testing.suite.check_case`. The report lists the worst cases with the
command that reruns each one alone (``--seed S --case K``).

Exit status: 0 all cases pass, 1 some case fails, 2 bad input (the kernel cannot be
imported, has the wrong signature, returns the wrong type/shape/dtype, or an option is
invalid), always with a one-line explanation and no traceback.
"""

from __future__ import annotations

import argparse
import sys
import time

from .problems import DTYPES, POSITION_MODES
from .reference import KINDS
from .suite import FRAMEWORKS, KernelContractError, check_case, check_signature, load_kernel

__all__ = ["HELP", "add_arguments", "run"]

#: one-line description of the subcommand, shown by ``plsh verify --help``
HELP = (
    "Check an attention kernel MODULE:FUNCTION against the float64 reference on "
    "Hypothesis-generated problems (exact ALiBi or positional LSH)."
)

_DEFAULT_DTYPES = {"numpy": "float16,float32,float64", "torch": "float16,bfloat16,float32"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``plsh verify`` to ``parser``."""
    parser.add_argument(
        "kernel",
        metavar="MODULE:FUNCTION",
        help="the kernel to check, e.g. mypkg.attention:alibi_forward",
    )
    parser.add_argument(
        "--kind",
        choices=KINDS,
        default="alibi",
        help="alibi: f(q, k, v, *, slopes, causal, scale, query_positions, "
        "key_positions); plsh: the same with partition instead of slopes "
        "(default: alibi)",
    )
    parser.add_argument(
        "--framework",
        choices=FRAMEWORKS,
        default="numpy",
        help="arrays the kernel takes and returns (default: numpy)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="torch device for --framework torch, e.g. cpu or cuda (default: cpu)",
    )
    parser.add_argument("--cases", type=int, default=50, help="number of problems (default: 50)")
    parser.add_argument("--seed", type=int, default=0, help="Hypothesis seed (default: 0)")
    parser.add_argument(
        "--case", type=int, default=None, help="run only case K of --seed (as printed in a report)"
    )
    parser.add_argument(
        "--dtypes",
        default=None,
        help="comma-separated dtypes (default: float16,float32,float64 for numpy, "
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
    parser.add_argument("--max-seq-len", type=int, default=16, help="default: 16")
    parser.add_argument("--max-heads", type=int, default=4, help="default: 4")
    parser.add_argument("--max-head-dim", type=int, default=8, help="default: 8")
    parser.add_argument("--max-batch", type=int, default=2, help="default: 2")
    parser.add_argument(
        "--max-samples",
        type=int,
        default=8,
        help="largest number of partition samples s (default: 8)",
    )
    parser.add_argument(
        "--worst", type=int, default=5, help="number of worst cases to list (default: 5)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per case")


def _fail(message: str) -> int:
    print(f"plsh verify: {message}", file=sys.stderr)
    return 2


def _options(args):
    framework = args.framework
    if framework == "numpy" and args.device != "cpu":
        raise KernelContractError(
            f"device: numpy kernels run on cpu, got {args.device!r} (use --framework torch)"
        )
    if framework == "torch":
        try:
            import torch
        except ImportError:
            raise KernelContractError("framework: torch is not installed") from None
        try:
            torch.empty(0, device=args.device)
        except (RuntimeError, AssertionError) as exc:
            raise KernelContractError(
                f"device: {args.device!r} is not available: {str(exc).splitlines()[0]}"
            ) from None
    names = (args.dtypes or _DEFAULT_DTYPES[framework]).split(",")
    dtypes = [d.strip() for d in names if d.strip()]
    for d in dtypes:
        if d not in DTYPES:
            raise KernelContractError(
                f"dtypes: unknown dtype {d!r}; choose from {','.join(DTYPES)}"
            )
        if d == "bfloat16" and framework == "numpy":
            raise KernelContractError(
                "dtypes: bfloat16 needs --framework torch (numpy has no bfloat16)"
            )
    positions = [p.strip() for p in args.positions.split(",") if p.strip()]
    for name, value, minimum in (
        ("cases", args.cases, 1),
        ("seed", args.seed, 0),
        ("max-seq-len", args.max_seq_len, 0),
        ("max-heads", args.max_heads, 1),
        ("max-head-dim", args.max_head_dim, 1),
        ("max-batch", args.max_batch, 1),
        ("max-samples", args.max_samples, 1),
        ("worst", args.worst, 0),
    ):
        if value < minimum:
            raise KernelContractError(f"{name}: must be >= {minimum}, got {value}")
    if args.case is not None and not 0 <= args.case < args.cases:
        raise KernelContractError(
            f"case: must be in 0..{args.cases - 1} (--cases {args.cases}), got {args.case}"
        )
    causal = {"both": None, "yes": True, "no": False}[args.causal]
    try:
        from .strategies import problem_specs

        problem_specs(
            args.kind,
            max_batch=args.max_batch,
            max_heads=args.max_heads,
            max_seq_len=args.max_seq_len,
            max_head_dim=args.max_head_dim,
            dtypes=dtypes,
            causal=causal,
            gqa=not args.no_gqa,
            positions=positions,
            max_samples=args.max_samples,
        )
    except (TypeError, ValueError) as exc:
        raise KernelContractError(str(exc)) from None
    return dict(
        max_batch=args.max_batch,
        max_heads=args.max_heads,
        max_seq_len=args.max_seq_len,
        max_head_dim=args.max_head_dim,
        dtypes=dtypes,
        causal=causal,
        gqa=not args.no_gqa,
        positions=positions,
        max_samples=args.max_samples,
    )


def _rerun_command(args, case: int) -> str:
    parts = [f"plsh verify {args.kernel} --kind {args.kind}"]
    if args.framework != "numpy":
        parts.append(f"--framework {args.framework} --device {args.device}")
    parts.append(f"--seed {args.seed} --cases {args.cases} --case {case}")
    defaults = {
        "dtypes": None,
        "causal": "both",
        "positions": ",".join(POSITION_MODES),
        "no_gqa": False,
        "max_seq_len": 16,
        "max_heads": 4,
        "max_head_dim": 8,
        "max_batch": 2,
        "max_samples": 8,
    }
    for name, default in defaults.items():
        value = getattr(args, name)
        if value != default:
            flag = "--" + name.replace("_", "-")
            parts.append(flag if value is True else f"{flag} {value}")
    return " ".join(parts)


def run(args: argparse.Namespace) -> int:
    """Run ``plsh verify``; returns the exit status (0 pass, 1 fail, 2 bad input)."""
    try:
        bounds = _options(args)
        kernel = load_kernel(args.kernel)
        check_signature(kernel, args.kind)
    except KernelContractError as exc:
        return _fail(str(exc))
    from .strategies import sample_specs

    specs = sample_specs(args.kind, seed=args.seed, num_cases=args.cases, **bounds)
    if args.case is not None and args.case >= len(specs):
        return _fail(
            f"case: only {len(specs)} distinct cases exist for these options, "
            f"got --case {args.case}"
        )
    indices = range(len(specs)) if args.case is None else [args.case]
    print(
        f"plsh verify {args.kernel}: kind={args.kind} framework={args.framework} "
        f"device={args.device} seed={args.seed} cases={len(indices)} "
        f"dtypes={','.join(bounds['dtypes'])}"
    )
    results = []
    start = time.perf_counter()
    for i in indices:
        spec = specs[i]
        try:
            result = check_case(kernel, spec.build(), framework=args.framework, device=args.device)
        except KernelContractError as exc:
            return _fail(f"{exc} [case {i}: {spec.summary()}]")
        results.append((i, spec, result))
        if args.verbose or args.case is not None:
            status = "pass" if result.passed else "FAIL"
            detail = f"\n           {result.message}" if result.message else ""
            print(
                f"  case {i:3d} {status} error {result.error:.3g} allowed {result.allowed:.3g}"
                f"  {spec.summary()}{detail}"
            )
        if args.case is not None:
            print(
                "  the same case in Python, without Hypothesis:\n"
                "    from plsh_ref.testing import ProblemSpec, check_case\n"
                f"    check_case(kernel, {spec!r}.build(),\n"
                f"               framework={args.framework!r}, device={args.device!r})"
            )
    elapsed = time.perf_counter() - start
    failed = [(i, spec, r) for i, spec, r in results if not r.passed]
    worst = sorted(results, key=lambda item: -item[2].ratio)[: args.worst]
    print(
        f"{len(results) - len(failed)}/{len(results)} cases passed in {elapsed:.1f} s "
        f"(allowed error: 2 x that of plain attention in the same dtype + 4 ulp floor)"
    )
    if worst and args.case is None:
        print("worst cases (error / allowed):")
        for i, spec, r in worst:
            ratio = "inf" if r.ratio == float("inf") else f"{r.ratio:.3g}"
            print(f"  case {i}: {'pass' if r.passed else 'FAIL'} ratio {ratio}  {spec.summary()}")
            if r.message:
                print(f"    {r.message}")
            if not r.passed:
                print(f"    rerun: {_rerun_command(args, i)}")
    print("PASS" if not failed else f"FAIL: {len(failed)} of {len(results)} cases")
    return 0 if not failed else 1
