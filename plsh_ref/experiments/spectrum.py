"""``plsh spectrum``: the KMS spectrum of ``L*``, its symbol bounds, and the spectra of
``M~`` and ``M~ - L*`` for one head.

Prints a table to stdout and writes ``results.json`` (the table and
:func:`plsh_ref.provenance.run_metadata`) and two plots (matplotlib, Agg backend) per sigma
into the output folder named on the last line (default ``plsh_out/spectrum-<UTC time>``).
Theory: ``proofs_notes/kms_spectrum.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib

import numpy as np

from ..alibi import kernel_matrix
from ..partition import draw_partition, empirical_mean
from ..provenance import run_metadata
from ..toeplitz import (
    kms_angles,
    kms_log_determinant,
    kms_spectral_norm_limit,
    kms_symbol,
    kms_symbol_bounds,
    mask_spectrum,
)
from ..validation import MAX_NUM_SAMPLES, check_int, check_positive_float
from .options import (
    MAX_SIGMA,
    Values,
    add_max_memory_option,
    add_out_option,
    add_quiet_option,
    check_memory,
    default_out_dir,
    integer,
    option_message,
)

#: one line for ``plsh --help``
SUMMARY = "KMS spectrum of L*, symbol bounds, spectra of M~ and M~ - L*"

HELP = "KMS spectrum of L*, symbol bounds, spectra of M~ and M~ - L* (plots + table)"

#: library parameters named in error messages -> the option that sets them (a partition
#: whose bins leave int64 comes from a --sigma too small for --n)
PARAMETER_OPTIONS = {"partition": "--sigma", "sigma": "--sigma", "num_samples": "--num-samples"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``plsh spectrum`` (vocabulary: :mod:`.options`).

    References
    ----------
    README.md, "Command line" (``plsh spectrum`` and the options shared by the commands).
    """
    parser.add_argument(
        "--n", type=integer(minimum=1), default=256, help="sequence length (default: 256)"
    )
    parser.add_argument(
        "--sigma",
        action=Values,
        positive=True,
        maximum=MAX_SIGMA,
        default=[16.0],
        metavar="SIGMA",
        help="length scale(s) sigma = 1/slope in tokens, space- or comma-separated; one "
        "table column and one pair of plots per value (default: 16)",
    )
    parser.add_argument(
        "--num-samples",
        type=integer(minimum=1, maximum=MAX_NUM_SAMPLES),
        default=16,
        help="number of samples s in M~ (default: 16)",
    )
    parser.add_argument(
        "--seed", type=integer(minimum=0), default=0, help="partition seed (default: 0)"
    )
    add_out_option(parser, "spectrum")
    add_max_memory_option(parser)
    add_quiet_option(parser)


def memory_estimate(n: int, num_samples: int) -> int:
    """Bytes :func:`compute` holds at its peak for one sigma (an upper estimate).

    ``L*``, the counts, ``M~``, ``M~ - L*`` and the eigenvalue solver's copy and workspace:
    seven float64/int64 ``(n, n)`` arrays, one boolean ``(n, n)`` temporary, and the bins
    of the ``s`` samples (int64 ``(s, n)``, queries and keys).

    References
    ----------
    README.md, "Command line" (``--max-memory``: sizes refused before allocating).
    """
    return 57 * n * n + 16 * num_samples * n


def compute(n: int, sigma: float, num_samples: int, seed: int) -> dict:
    """All quantities of the report as numpy arrays/floats (used by :func:`run` and tests).

    Raises
    ------
    ValueError, TypeError
        ``n < 1``, ``sigma <= 0``, ``num_samples < 1``, ``seed < 0``.

    References
    ----------
    ``proofs_notes/kms_spectrum.md``, sections 1-5; SPEC section 4 (the KMS facts).
    """
    n = check_int("n", n, minimum=1)
    sigma = check_positive_float("sigma", sigma)
    s = check_int("num_samples", num_samples, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    pos = np.arange(n)
    theta = kms_angles(n, sigma)
    lam = kms_symbol(theta, sigma)
    lstar = kernel_matrix(sigma, pos, pos)
    part = draw_partition([sigma], s, seed)
    mt = empirical_mean(part, pos, pos)[0]
    return {
        "theta": theta,
        "kms": lam,
        "dense": np.sort(np.linalg.eigvalsh(lstar))[::-1],
        "bounds": kms_symbol_bounds(sigma),
        "limit": kms_spectral_norm_limit(sigma),
        "logdet": kms_log_determinant(n, sigma),
        "m_tilde": np.sort(np.linalg.eigvalsh(mt))[::-1],
        "error": np.sort(np.linalg.eigvalsh(mt - lstar))[::-1],
        "one_mask": mask_spectrum(part, pos, 0, 0),
    }


def _plot(res: dict, n: int, sigma: float, s: int, out: pathlib.Path) -> list[pathlib.Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    lo, hi = res["bounds"]
    k = np.arange(1, n + 1)
    fig, ax = plt.subplots(figsize=(6.4, 4.8), layout="constrained")
    grid = np.linspace(0, np.pi, 400)
    ax.plot(grid, kms_symbol(grid, sigma), color="0.6", lw=1, label=r"symbol $f(\theta)$")
    ax.plot(
        res["theta"], res["kms"], ".", ms=3, label=r"eigenvalues $f(\theta_k)$ (secular equation)"
    )
    ax.axhline(lo, ls="--", lw=0.8, color="k")
    ax.axhline(
        hi, ls="--", lw=0.8, color="k", label=r"bounds $\tanh(1/2\sigma)$, $\coth(1/2\sigma)$"
    )
    ax.set_yscale("log")
    ax.set_xlabel(r"angle $\theta$ (radians)")
    ax.set_ylabel(r"eigenvalue $\lambda$ of $L^*$")
    ax.set_title(rf"KMS spectrum of $L^*$, $n = {n}$, $\sigma = {sigma:g}$", fontsize="medium")
    fig.legend(loc="outside lower center", ncols=2, frameon=False, fontsize="small")
    p1 = out / "kms_spectrum.png"
    fig.savefig(p1, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.4, 4.8), layout="constrained")
    ax.plot(k, res["kms"], label=r"$L^*$")
    ax.plot(k, res["m_tilde"], label=rf"$\tilde M$ ($s = {s}$)")
    ax.plot(k, np.sort(np.abs(res["error"]))[::-1], label=r"$|\lambda_k(\tilde M - L^*)|$, sorted")
    ax.plot(k, res["one_mask"], label=r"one mask $M(h)$: block sizes")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_xlabel(r"index $k$ (decreasing order)")
    ax.set_ylabel(r"eigenvalue $\lambda_k$ (symlog scale)")
    ax.set_title(
        rf"Spectra, $n = {n}$, $\sigma = {sigma:g}$, $s = {s}$ (one draw, no error bars)",
        fontsize="medium",
    )
    fig.legend(loc="outside lower center", ncols=2, frameon=False, fontsize="small")
    p2 = out / "mask_spectra.png"
    fig.savefig(p2, dpi=120)
    plt.close(fig)
    return [p1, p2]


def _table_rows(res: dict, num_samples: int) -> list[tuple[str, float]]:
    lam = res["kms"]
    lo, hi = res["bounds"]
    return [
        ("lambda_max (secular equation)", lam[0]),
        ("lambda_max (numpy eigvalsh)", res["dense"][0]),
        ("lambda_min (secular equation)", lam[-1]),
        ("lambda_min (numpy eigvalsh)", res["dense"][-1]),
        ("max |secular - eigvalsh|", float(np.max(np.abs(lam - res["dense"])))),
        ("symbol lower bound tanh(1/(2 sigma))", lo),
        ("symbol upper bound coth(1/(2 sigma))", hi),
        ("limit of ||L*|| as n -> inf", res["limit"]),
        ("log det L* = (n-1) log(1-rho^2)", res["logdet"]),
        (f"||M~||_2 (s={num_samples})", res["m_tilde"][0]),
        ("||M~ - L*||_2", float(np.max(np.abs(res["error"])))),
        ("largest block of one mask", res["one_mask"][0]),
        ("rank of one mask (number of blocks)", float(np.count_nonzero(res["one_mask"]))),
    ]


def run(args: argparse.Namespace) -> int:
    """Print the table, write ``results.json`` and the plots, name the output folder last.

    With several ``--sigma`` values the table has one column per sigma and each sigma's
    plots go to ``<out>/sigma-<sigma>/``; with one, into ``<out>/``. Returns 0.

    Raises
    ------
    ValueError, TypeError
        Bad options (as :func:`compute`), or ``--n`` / ``--num-samples`` whose
        :func:`memory_estimate` exceeds ``--max-memory`` (checked before allocating).

    References
    ----------
    README.md, "Command line" (``plsh spectrum``); ``proofs_notes/kms_spectrum.md``.
    """
    n = check_int("--n", args.n, minimum=1)
    s = check_int("--num-samples", args.num_samples, minimum=1)
    check_int("--seed", args.seed, minimum=0)
    check_memory("--n", n, memory_estimate(n, 0), args.max_memory)
    check_memory("--num-samples", s, memory_estimate(n, s), args.max_memory)
    sigmas = list(args.sigma)
    out = args.out or default_out_dir("spectrum")
    try:
        results = [compute(n, sigma, s, args.seed) for sigma in sigmas]
    except (TypeError, ValueError) as exc:
        raise type(exc)(option_message(exc, ("n", "seed"), PARAMETER_OPTIONS)) from None
    tables = [_table_rows(res, s) for res in results]
    if not args.quiet:
        rhos = ", ".join(f"{math.exp(-1 / sg):.6g}" for sg in sigmas)
        print(
            f"KMS matrix L*_ij = exp(-|i-j|/sigma), n={n}, "
            f"sigma={' '.join(f'{sg:g}' for sg in sigmas)}, rho={rhos}"
        )
    print(f"{'quantity':<36}" + "".join(f"{f'sigma={sg:g}':>16}" for sg in sigmas))
    for i, (name, _) in enumerate(tables[0]):
        print(f"{name:<36}" + "".join(f"{table[i][1]:>16.8g}" for table in tables))
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "command": "plsh spectrum",
        "provenance": run_metadata(),
        "config": {"n": n, "sigma": sigmas, "num_samples": s, "seed": args.seed},
        "table": {
            f"{sg:g}": {name: float(value) for name, value in table}
            for sg, table in zip(sigmas, tables)
        },
    }
    (out / "results.json").write_text(json.dumps(record, indent=1))
    for sigma, res in zip(sigmas, results):
        folder = out if len(sigmas) == 1 else out / f"sigma-{sigma:g}"
        for p in _plot(res, n, sigma, s, folder):
            if not args.quiet:
                print(f"plot: {p}")
    print(f"output folder: {out}")
    return 0
