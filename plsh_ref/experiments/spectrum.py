"""``plsh spectrum``: the KMS spectrum of ``L*``, its symbol bounds, and the spectra of
``M~`` and ``M~ - L*`` for one head.

Prints a table to stdout and writes two plots (matplotlib, Agg backend) into the output
folder named on the last line. Theory: ``proofs_notes/kms_spectrum.md``.
"""

from __future__ import annotations

import argparse
import math
import pathlib

import numpy as np

from ..alibi import kernel_matrix
from ..partition import draw_partition, empirical_mean
from ..toeplitz import (
    kms_angles,
    kms_log_determinant,
    kms_spectral_norm_limit,
    kms_symbol,
    kms_symbol_bounds,
    mask_spectrum,
)
from ..validation import check_int, check_positive_float

HELP = "KMS spectrum of L*, symbol bounds, spectra of M~ and M~ - L* (plots + table)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``plsh spectrum``."""
    parser.add_argument("--n", type=int, default=256, help="sequence length (default 256)")
    parser.add_argument(
        "--sigma",
        type=float,
        default=16.0,
        help="length scale sigma = 1/slope in tokens (default 16)",
    )
    parser.add_argument(
        "--num-samples", type=int, default=16, help="number of samples s in M~ (default 16)"
    )
    parser.add_argument("--seed", type=int, default=0, help="partition seed (default 0)")
    parser.add_argument(
        "--output",
        "--out",
        dest="output",
        type=pathlib.Path,
        default=pathlib.Path("plsh_spectrum"),
        help="folder for the plots (default ./plsh_spectrum)",
    )


def compute(n: int, sigma: float, num_samples: int, seed: int) -> dict:
    """All quantities of the report as numpy arrays/floats (used by :func:`run` and tests).

    Raises
    ------
    ValueError, TypeError
        ``n < 1``, ``sigma <= 0``, ``num_samples < 1``, ``seed < 0``.
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
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    grid = np.linspace(0, np.pi, 400)
    ax.plot(grid, kms_symbol(grid, sigma), color="0.6", lw=1, label="symbol f(theta)")
    ax.plot(res["theta"], res["kms"], ".", ms=3, label="eigenvalues f(theta_k)")
    ax.axhline(lo, ls="--", lw=0.8, color="k")
    ax.axhline(hi, ls="--", lw=0.8, color="k", label="symbol bounds")
    ax.set_yscale("log")
    ax.set_xlabel("theta")
    ax.set_ylabel("eigenvalue")
    ax.set_title(f"KMS spectrum of L*, n={n}, sigma={sigma:g}")
    ax.legend()
    p1 = out / "kms_spectrum.png"
    fig.tight_layout()
    fig.savefig(p1, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(k, res["kms"], label="L*")
    ax.plot(k, res["m_tilde"], label=f"M~ (s={s})")
    ax.plot(k, np.sort(np.abs(res["error"]))[::-1], label="|eig(M~ - L*)|, sorted")
    ax.plot(k, res["one_mask"], label="one mask M(h): block sizes")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_xlabel("index k (decreasing order)")
    ax.set_ylabel("eigenvalue")
    ax.set_title(f"Spectra, n={n}, sigma={sigma:g}, s={s}")
    ax.legend()
    p2 = out / "mask_spectra.png"
    fig.tight_layout()
    fig.savefig(p2, dpi=120)
    plt.close(fig)
    return [p1, p2]


def run(args: argparse.Namespace) -> int:
    """Print the table, write the plots, name the output folder last. Returns 0."""
    res = compute(args.n, args.sigma, args.num_samples, args.seed)
    lo, hi = res["bounds"]
    lam = res["kms"]
    print(
        f"KMS matrix L*_ij = exp(-|i-j|/sigma), n={args.n}, sigma={args.sigma:g}, "
        f"rho={math.exp(-1 / args.sigma):.6g}"
    )
    print(f"{'quantity':<36}{'value':>16}")
    rows = [
        ("lambda_max (secular equation)", lam[0]),
        ("lambda_max (numpy eigvalsh)", res["dense"][0]),
        ("lambda_min (secular equation)", lam[-1]),
        ("lambda_min (numpy eigvalsh)", res["dense"][-1]),
        ("max |secular - eigvalsh|", float(np.max(np.abs(lam - res["dense"])))),
        ("symbol lower bound tanh(1/(2 sigma))", lo),
        ("symbol upper bound coth(1/(2 sigma))", hi),
        ("limit of ||L*|| as n -> inf", res["limit"]),
        ("log det L* = (n-1) log(1-rho^2)", res["logdet"]),
        (f"||M~||_2 (s={args.num_samples})", res["m_tilde"][0]),
        ("||M~ - L*||_2", float(np.max(np.abs(res["error"])))),
        ("largest block of one mask", res["one_mask"][0]),
        ("rank of one mask (number of blocks)", float(np.count_nonzero(res["one_mask"]))),
    ]
    for name, value in rows:
        print(f"{name:<36}{value:>16.8g}")
    paths = _plot(res, args.n, args.sigma, args.num_samples, args.output)
    for p in paths:
        print(f"plot: {p}")
    print(f"output folder: {args.output}")
    return 0
