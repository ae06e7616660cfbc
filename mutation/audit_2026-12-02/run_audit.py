"""Apply each defect patch in turn, run the module's test files, record killed/survived.

python mutation/audit_2026-12-02/run_audit.py [ID ...]   (from the repository root, clean tree)
Test files per module: mutation/targets.toml (the most specific files for each module); with
AUDIT_TESTS="file ..." set, those files instead (the second pass over the survivors, with the
further test files that grep finds for the defect's function). Results are appended to
results.jsonl next to this script (field "tests": "targets" or the files of AUDIT_TESTS).
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
from make_patches import DEFECTS  # noqa: E402

TARGETS = {
    m: e["tests"]
    for m, e in tomllib.loads((ROOT / "mutation/targets.toml").read_text())["modules"].items()
}
TIMEOUT = 420


def run(ident, module):
    patch = HERE / f"{ident}.diff"
    subprocess.run(["git", "apply", str(patch)], cwd=ROOT, check=True)
    tests = os.environ.get("AUDIT_TESTS", "").split() or TARGETS[module]
    t0 = time.time()
    try:
        proc = subprocess.run(
            [
                "nice",
                ".venv/bin/python",
                "-m",
                "pytest",
                "-x",
                "-q",
                "-p",
                "no:cacheprovider",
                *tests,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        out, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out, rc = (
            (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or ""),
            "timeout",
        )
    finally:
        subprocess.run(["git", "apply", "-R", str(patch)], cwd=ROOT, check=True)
    wall = time.time() - t0
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)
    status = "survived" if rc == 0 else ("timeout" if rc == "timeout" else "killed")
    tail = out.strip().splitlines()[-1] if out.strip() else ""
    return {
        "id": ident,
        "module": module,
        "status": status,
        "rc": rc,
        "killer": failed[:1],
        "wall_s": round(wall, 1),
        "tail": tail,
        "tests": "targets" if tests == TARGETS[module] else " ".join(tests),
    }


def main():
    wanted = set(sys.argv[1:])
    with open(HERE / "results.jsonl", "a") as f:
        for ident, module, _, _ in DEFECTS:
            if wanted and ident not in wanted:
                continue
            res = run(ident, module)
            print(json.dumps(res), flush=True)
            f.write(json.dumps(res) + "\n")
            f.flush()
            diff = subprocess.run(
                ["git", "diff", "--stat", "--", "plsh_ref", "plsh_fast"],
                cwd=ROOT,
                capture_output=True,
                text=True,
            ).stdout
            assert not diff, diff


if __name__ == "__main__":
    main()
