"""Figures of the general-kernels chapter (``docs/kernels.md``).

Usage: ``python docs/_scripts/kernels_plots.py OUT_DIR`` (run by ``docs/conf.py`` at every
build). Writes ``OUT_DIR/kernels/``:

* ``reproduce/``: a reduced ``plsh reproduce --kernel kerple-log`` run (its PNG plots,
  ``results.json`` and ``log.txt``, the printed tables);
* ``costs.png`` and ``costs.txt``: the heavy-tail costs against ``s`` from the closed forms
  of :mod:`plsh_ref.kernels` (expected fused window, mean halo, 99% bound on the decoding
  cache and the halo) for ALiBi and the KERPLE kernels at one length scale;
* ``rate.txt``: the exact Frobenius RMS slope of the stratified sampler (n = 1024).
"""

import contextlib
import io
import sys
from pathlib import Path

import numpy as np

from plsh_ref import samplers
from plsh_ref.cli import main as plsh
from plsh_ref.experiments.reproduce import fit_loglog_slope
from plsh_ref.kernels import (
    Exponential,
    KerpleLog,
    KerplePower,
    expected_max_extent,
    expected_window_width,
    largest_pitch_quantile,
)

ARGS = [
    "reproduce",
    "--kernel",
    "kerple-log",
    "--r1",
    "0.7",
    "--n",
    "512",
    "--reps",
    "3",
    "--output-reps",
    "2",
    "--num-samples",
    "1,2,4,8,16,32,64",
    "--max-tokens",
    "256",
    "--seed",
    "0",
    "--quiet",
]

SIGMA = 16.0
N = 4096  # positions available to the window and the halo
SAMPLES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
KERNELS = {
    "ALiBi, exp(-r/16)": Exponential(SIGMA),
    "KERPLE-log r1=0.7 (infinite mean pitch)": KerpleLog(0.7, 1 / SIGMA),
    "KERPLE-log r1=2": KerpleLog(2.0, 1 / SIGMA),
    "KERPLE-power p=0.5": KerplePower(SIGMA**-0.5, 0.5),
}


def costs(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = ["kernel | s | window (n=4096, centre) | mean halo | 99% cache/halo bound"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), constrained_layout=True)
    for name, kern in KERNELS.items():
        window = [expected_window_width(kern, s, N)[N // 2] for s in SAMPLES]
        halo = [expected_max_extent(kern, s, N - 1) for s in SAMPLES]
        bound = [np.ceil(largest_pitch_quantile(kern, 0.99, s)) + 1 for s in SAMPLES]
        for ax, y in zip(axes, (window, halo, bound)):
            ax.plot(SAMPLES, y, marker="o", ms=3, label=name)
        for s, w, h, b in zip(SAMPLES, window, halo, bound):
            rows.append(f"{name} | {s} | {w:.1f} | {h:.1f} | {b:.4g}")
    titles = (
        f"expected fused window (keys with C > 0), n = {N}",
        f"mean halo E[min(max_t L_t, n - 1)], n = {N}",
        "99% bound: cache and halo <= ceil(max pitch) + 1",
    )
    for ax, title in zip(axes, titles):
        ax.set(xscale="log", yscale="log", xlabel="samples $s$", ylabel="tokens", title=title)
        ax.legend(fontsize=7)
    fig.savefig(out / "costs.png", dpi=120)
    plt.close(fig)
    (out / "costs.txt").write_text("\n".join(rows) + "\n")


def rate(out: Path) -> None:
    s = np.array([4, 8, 16, 32, 64, 128, 256])
    lines = ["sigma | stratified RMS slope | iid RMS slope (n = 1024, s = 4..256)"]
    for sigma in (4.0, 16.0, 64.0):
        strat = [
            samplers.frobenius_error_square(sigma, 1024, int(x), sampler="stratified") for x in s
        ]
        iid = [samplers.frobenius_error_square(sigma, 1024, int(x)) for x in s]
        lines.append(
            f"{sigma:g} | {fit_loglog_slope(s, np.sqrt(strat)):+.4f} | "
            f"{fit_loglog_slope(s, np.sqrt(iid)):+.4f}"
        )
    (out / "rate.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    out = Path(sys.argv[1]) / "kernels"
    (out / "reproduce").mkdir(parents=True, exist_ok=True)
    costs(out)
    rate(out)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = plsh([*ARGS, "--out", str(out / "reproduce")])
    (out / "reproduce" / "log.txt").write_text(
        "$ plsh " + " ".join(ARGS) + " --out reproduce/\n\n" + buffer.getvalue()
    )
    if code != 0:
        sys.exit(f"plsh reproduce failed with exit status {code}:\n{buffer.getvalue()}")
