"""``plsh bounds``: the computable Theorem 2.1/2.2 bounds and the samples they need.

For each sigma, prints the max-norm (DKW), spectral-norm (truncated matrix Bernstein) and
block-size bounds at the given ``n``, ``s`` and failure probability ``delta``, and the
number of samples needed for a target error ``eps``. Theory: ``proofs_notes/max_norm_bound.md``,
``proofs_notes/spectral_bound.md``, ``proofs_notes/largest_pitch.md``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from ..bounds import (
    block_size_bound,
    max_norm_error_bound,
    required_samples,
    spectral_error_bound,
    spectral_required_samples,
)
from ..expectation import block_size_mean, expected_window_width, variance_proxy_limit
from ..provenance import run_metadata
from ..validation import check_int, check_positive_float, check_probability
from .options import (
    MAX_SIGMA,
    Values,
    add_out_option,
    add_quiet_option,
    integer,
    number,
    option_message,
)

#: one line for ``plsh --help``
SUMMARY = "Theorem 2.1/2.2 bounds and the samples needed for a target error"

HELP = "Theorem 2.1/2.2 bounds and the samples needed for a target error"

#: parameters of :func:`rows` that are options of the command (same name, ``--`` and dashes)
_OPTIONS = ("n", "sigma", "num_samples", "eps", "delta", "spectral_eps")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``plsh bounds``.

    References
    ----------
    README.md, "Command line" (``plsh bounds`` and the options shared by the commands).
    """
    parser.add_argument(
        "--n", type=integer(minimum=1), default=4096, help="sequence length (default: 4096)"
    )
    parser.add_argument(
        "--sigma",
        action=Values,
        positive=True,
        default=[4.0, 16.0, 64.0, 256.0],
        metavar="SIGMA",
        help="length scales, space- or comma-separated (default: those of the 4-head ALiBi "
        "slopes, 4 16 64 256)",
    )
    parser.add_argument(
        "--num-samples", type=integer(minimum=1), default=16, help="samples s (default: 16)"
    )
    parser.add_argument(
        "--eps", type=number(), default=0.1, help="target max-norm error in (0, 1) (default: 0.1)"
    )
    parser.add_argument(
        "--spectral-eps",
        type=number(),
        default=None,
        help="target spectral error (default: eps * coth(1/(2 sigma)))",
    )
    parser.add_argument(
        "--delta", type=number(), default=0.01, help="failure probability in (0, 1) (default: 0.01)"
    )
    add_out_option(parser, "bounds", optional=True)
    add_quiet_option(parser)


def rows(
    n: int,
    sigmas: Sequence[float],
    num_samples: int,
    eps: float,
    delta: float,
    spectral_eps: float | None = None,
) -> list[dict]:
    """One dict per sigma with every reported number (used by :func:`run` and tests).

    Raises
    ------
    ValueError, TypeError
        ``n < 1``, ``sigma <= 0`` or ``> options.MAX_SIGMA``, ``num_samples < 1``, ``eps`` or
        ``delta`` outside (0, 1).

    References
    ----------
    ``proofs_notes/max_norm_bound.md``; ``proofs_notes/spectral_bound.md``;
    ``proofs_notes/largest_pitch.md``, section 3; ``proofs_notes/window_width.md``, section 2.
    """
    n = check_int("n", n, minimum=1)
    s = check_int("num_samples", num_samples, minimum=1)
    eps = check_probability("eps", eps)
    delta = check_probability("delta", delta)
    out = []
    for sigma in sigmas:
        sigma = check_positive_float("sigma", sigma)
        if sigma > MAX_SIGMA:
            raise ValueError(
                f"sigma: must be <= {MAX_SIGMA:g} (options.MAX_SIGMA, the largest length "
                f"scale the commands accept), got {sigma:g}"
            )
        sb = spectral_error_bound(n, sigma, s, delta)
        target = (
            eps * block_size_mean(sigma)
            if spectral_eps is None
            else check_positive_float("spectral_eps", spectral_eps)
        )
        out.append(
            {
                "sigma": sigma,
                "max_norm_eps": max_norm_error_bound(n, s, delta),
                "spectral_eps": sb.eps,
                "spectral_rel": sb.eps / block_size_mean(sigma),
                "variance_proxy": sb.variance_proxy,
                "v_limit": variance_proxy_limit(sigma),
                "truncation": sb.truncation,
                "block_bound": block_size_bound(sigma, s, delta),
                "window": expected_window_width(sigma, s),
                "s_max_norm": required_samples(n, eps, delta),
                "spectral_target": target,
                "s_spectral": _spectral_samples(n, sigma, target, delta, spectral_eps),
            }
        )
    return out


def _spectral_samples(
    n: int, sigma: float, target: float, delta: float, spectral_eps: float | None
) -> int:
    """:func:`spectral_required_samples` for the target; a target that no sample count
    reaches is named as the option that set it (``--spectral-eps`` when given)."""
    try:
        return spectral_required_samples(n, sigma, target, delta)
    except ValueError as exc:
        if spectral_eps is None or not str(exc).startswith("eps:"):
            raise
        raise ValueError("spectral_eps" + str(exc)[len("eps") :]) from None


def run(args: argparse.Namespace) -> int:
    """Print the table (and with ``--out`` write it to ``results.json``); returns 0.

    Raises
    ------
    ValueError, TypeError
        As :func:`rows`.

    References
    ----------
    README.md, "Command line" (``plsh bounds`` writes only when given ``--out``).
    """
    try:
        table = rows(args.n, args.sigma, args.num_samples, args.eps, args.delta, args.spectral_eps)
    except (TypeError, ValueError) as exc:
        raise type(exc)(option_message(exc, _OPTIONS)) from None
    quiet = getattr(args, "quiet", False)
    if not quiet:
        print(
            f"Bounds holding with probability >= 1 - delta = {1 - args.delta:g}, "
            f"n = {args.n}, s = {args.num_samples} independent samples per head"
        )
    head = (
        f"{'sigma':>8} {'max|M~-L*|':>11} {'||M~-L*||':>10} {'rel.':>6} {'v':>10} "
        f"{'v_limit':>10} {'trunc k':>8} {'b_max':>6} {'E window':>9} "
        f"{'s(max)':>8} {'s(spec)':>9}"
    )
    print(head)
    for r in table:
        print(
            f"{r['sigma']:>8g} {r['max_norm_eps']:>11.4g} {r['spectral_eps']:>10.4g} "
            f"{r['spectral_rel']:>6.3f} {r['variance_proxy']:>10.4g} {r['v_limit']:>10.4g} "
            f"{r['truncation']:>8d} {r['block_bound']:>6d} {r['window']:>9.1f} "
            f"{r['s_max_norm']:>8d} {r['s_spectral']:>9d}"
        )
    if quiet:
        return _write(args, table)
    print(
        "columns: max-norm bound (DKW); spectral bound (truncated matrix Bernstein) and "
        "relative to coth(1/(2 sigma)) (||L*||_inf on the infinite line, above its "
        "finite-n value); variance proxy v (exact for "
        "n <= 1024, else its limit) and its limit; "
        "pitch truncation level; block-size bound; expected fused window (keys/query); "
        f"samples for max-norm error {args.eps:g}; samples for spectral error "
        f"{'eps * coth(1/(2 sigma))' if args.spectral_eps is None else args.spectral_eps}."
    )
    return _write(args, table)


def _write(args: argparse.Namespace, table: list[dict]) -> int:
    out = getattr(args, "out", None)
    if out is None:
        return 0
    out.mkdir(parents=True, exist_ok=True)
    config = {k: getattr(args, k) for k in ("n", "sigma", "num_samples", "eps", "delta")}
    config["spectral_eps"] = args.spectral_eps
    record = {"command": "plsh bounds", "provenance": run_metadata(), "config": config}
    record["table"] = table
    (out / "results.json").write_text(json.dumps(record, indent=1))
    print(f"output folder: {out}")
    return 0
