"""Overview figure of the docs: sampled PLSH masks, their mean M~, and L*.

Usage: ``python docs/_scripts/overview_figure.py OUT_DIR`` (run by ``docs/conf.py`` at
every build; writes ``OUT_DIR/overview.png``). Uses only plsh_ref and matplotlib.
"""

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from plsh_ref.alibi import kernel_matrix  # noqa: E402
from plsh_ref.partition import draw_partition, empirical_mean, masks  # noqa: E402

N, SIGMA, SHOWN, S, SEED = 64, 8.0, 3, 64, 0


def main(out_dir: Path) -> Path:
    pos = np.arange(N)
    partition = draw_partition([SIGMA], S, seed=SEED)
    some = masks(partition.samples(0, SHOWN), pos, pos)[0]
    mean = empirical_mean(partition, pos, pos)[0]
    exact = kernel_matrix(SIGMA, pos, pos)
    panels = [
        (some[t], f"mask $M(h_{t + 1})$\npitch {partition.pitch[0, t]:.1f}") for t in range(SHOWN)
    ]
    panels += [(mean, f"mean $\\tilde M$ of s={S}"), (exact, f"$L^*$, $\\sigma$={SIGMA:g}")]
    fig, axes = plt.subplots(1, len(panels), figsize=(2.3 * len(panels), 2.9), layout="constrained")
    for ax, (img, title) in zip(axes, panels):
        ax.imshow(img, cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(title, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    path = out_dir / "overview.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main(Path(sys.argv[1]))
