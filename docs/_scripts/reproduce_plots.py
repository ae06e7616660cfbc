"""Plots of a reduced ``plsh reproduce`` run for the experiments page.

Usage: ``python docs/_scripts/reproduce_plots.py OUT_DIR`` (run by ``docs/conf.py`` at every
build, a few seconds on one core). Writes ``OUT_DIR/reproduce/`` with the PNG plots,
``results.json`` and ``log.txt`` (the printed tables). The full default run is
``plsh reproduce``; this one uses the options in ``ARGS`` below.
"""

import contextlib
import io
import sys
from pathlib import Path

from plsh_ref.cli import main as plsh

ARGS = [
    "reproduce",
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

if __name__ == "__main__":
    out = Path(sys.argv[1]) / "reproduce"
    out.mkdir(parents=True, exist_ok=True)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = plsh([*ARGS, "--out", str(out)])
    (out / "log.txt").write_text(
        "$ plsh " + " ".join(ARGS) + f" --out {out.name}/\n\n" + buffer.getvalue()
    )
    if code != 0:
        sys.exit(f"plsh reproduce failed with exit status {code}:\n{buffer.getvalue()}")
