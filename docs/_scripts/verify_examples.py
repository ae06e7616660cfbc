"""Runs of ``plsh verify`` and ``plsh verify-slopes`` shown in the validation guide.

Usage: ``python docs/_scripts/verify_examples.py OUT_DIR`` (run by ``docs/conf.py`` at every
build). Writes ``OUT_DIR/verify/<name>.txt``: the command, its output and exit status. The
runs start in ``tests/``, so that the test helpers ``_plsh_fast_kernel.py`` and
``_thirdparty_kernels.py`` import as ``MODULE:FUNCTION`` (``plsh verify`` puts the
current folder on the import path). Runs that need torch, plsh_fast or transformers say
so when those are not installed.
"""

import importlib.util
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

EX = "plsh_ref.testing.examples"
TP = "_thirdparty_kernels"
TESTS = Path(__file__).resolve().parents[2] / "tests"
#: name -> (command, arguments, modules it needs)
RUNS = {
    "numpy_alibi": ("verify", [f"{EX}:numpy_alibi"], ()),
    "interleaved_gqa": ("verify", [f"{EX}:interleaved_gqa_alibi", "--worst", "2"], ()),
    "averaged_plsh": ("verify", [f"{EX}:averaged_plsh", "--kind", "plsh", "--worst", "2"], ()),
    "averaged_plsh_case": (
        "verify",
        [f"{EX}:averaged_plsh", "--kind", "plsh", "--case", "CASE"],
        (),
    ),
    "bad_signature": ("verify", [f"{EX}:numpy_alibi", "--kind", "plsh"], ()),
    "sdpa_alibi": ("verify", [f"{EX}:sdpa_alibi", "--worst", "2"], ("torch",)),
    "plsh_fast": (
        "verify",
        ["_plsh_fast_kernel:plsh_fast_kernel", "--kind", "plsh", "--worst", "2"],
        ("torch", "plsh_fast"),
    ),
    "bloom": (
        "verify",
        [f"{TP}:bloom", "--worst", "2"],
        ("torch", "transformers", "x_transformers"),
    ),
    "falcon": (
        "verify",
        [f"{TP}:falcon", "--worst", "1"],
        ("torch", "transformers", "x_transformers"),
    ),
    "slopes_press": ("verify-slopes", [f"{EX}:press_slopes"], ()),
}


def run(command, args):
    proc = subprocess.run(
        [sys.executable, "-m", "plsh_ref.cli", command, *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=TESTS,
    )
    text = f"$ plsh {command} {' '.join(args)}\n{proc.stdout}{proc.stderr}"
    return text + f"$ echo $?\n{proc.returncode}\n", proc.stdout


def main(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    runnable = {}
    for name, (command, args, needs) in RUNS.items():
        missing = [m for m in needs if importlib.util.find_spec(m) is None]
        if missing:
            (out / f"{name}.txt").write_text(
                f"({', '.join(missing)} not installed on the machine that built these docs)\n"
            )
        else:
            runnable[name] = (command, args)
    # Each run is its own process: the independent ones run side by side (one per core);
    # the one that reruns a case waits for the run that names it.
    later = {name: run_ for name, run_ in runnable.items() if "CASE" in run_[1]}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = {
            name: pool.submit(run, command, args)
            for name, (command, args) in runnable.items()
            if name not in later
        }
        results = {name: future.result() for name, future in futures.items()}
    if later:
        stdout = results["averaged_plsh"][1]
        case = next(
            line.split("--case ")[1].strip() for line in stdout.splitlines() if "rerun:" in line
        )
        for name, (command, args) in later.items():
            results[name] = run(command, [case if a == "CASE" else a for a in args])
    for name in RUNS:
        if name in results:
            (out / f"{name}.txt").write_text(results[name][0])


if __name__ == "__main__":
    main(Path(sys.argv[1]) / "verify")
