"""Runs of ``plsh verify`` shown in the validation guide.

Usage: ``python docs/_scripts/verify_examples.py OUT_DIR`` (run by ``docs/conf.py`` at every
build). Writes ``OUT_DIR/verify/<name>.txt``: the command, its output and exit status. The
``plsh_fast`` run needs torch; without it the file says so.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

EX = "plsh_ref.testing.examples"
RUNS = {
    "numpy_alibi": [f"{EX}:numpy_alibi", "--cases", "50"],
    "sign_flipped_alibi": [f"{EX}:sign_flipped_alibi", "--cases", "50", "--worst", "3"],
    "averaged_plsh": [f"{EX}:averaged_plsh", "--kind", "plsh", "--cases", "50", "--worst", "3"],
    "averaged_plsh_case": [
        f"{EX}:averaged_plsh",
        "--kind",
        "plsh",
        "--cases",
        "50",
        "--case",
        "CASE",
    ],
    "plsh_fast": [
        "_plsh_fast_kernel:plsh_fast_kernel",
        "--kind",
        "plsh",
        "--framework",
        "torch",
        "--cases",
        "50",
        "--worst",
        "3",
    ],
    "sdpa_alibi": [f"{EX}:sdpa_alibi", "--framework", "torch", "--cases", "50", "--worst", "3"],
    "bad_signature": [f"{EX}:numpy_alibi", "--kind", "plsh"],
}


def run(args):
    # run from tests/: the plsh_fast adapter is the test helper tests/_plsh_fast_kernel.py,
    # found because verify puts the current folder on the import path
    proc = subprocess.run(
        [sys.executable, "-m", "plsh_ref.cli", "verify", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parents[2] / "tests",
    )
    text = f"$ plsh verify {' '.join(args)}\n{proc.stdout}{proc.stderr}"
    return text + f"$ echo $?\n{proc.returncode}\n", proc.stdout


def main(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    first_failure = None
    for name, args in RUNS.items():
        if "--framework" in args and (
            importlib.util.find_spec("torch") is None
            or importlib.util.find_spec("plsh_fast") is None
        ):
            (out / f"{name}.txt").write_text(
                "(torch or plsh_fast is not installed on the machine that built these docs)\n"
            )
            continue
        if "CASE" in args:
            args = [first_failure if a == "CASE" else a for a in args]
        text, stdout = run(args)
        if name == "averaged_plsh":
            first_failure = next(
                line.split("--case ")[1].strip() for line in stdout.splitlines() if "rerun:" in line
            )
        (out / f"{name}.txt").write_text(text)


if __name__ == "__main__":
    main(Path(sys.argv[1]) / "verify")
