"""Mutation testing of one module with mutmut 3, and its committed report.

``make mutants MODULE=plsh_ref/alibi.py`` (or ``python mutation/run.py plsh_ref/alibi.py``):

1. copies the checkout's files (tracked and untracked, not ignored) into a scratch folder
   (``$PLSH_MUTATION_WORKDIR/<module>``, default under the system temporary folder), so
   that the run never touches the working tree and two modules can run side by side;
2. writes a ``[tool.mutmut]`` table into the scratch ``pyproject.toml``: only ``MODULE`` is
   mutated, and only the test files that ``mutation/targets.toml`` maps to it run;
3. runs ``mutmut run`` there (one worker, ``nice``: the machine is shared);
4. writes ``mutation/reports/<module>.md`` from mutmut's results: killed, survived (with
   the diff of each survivor), equivalent (the survivors that
   ``mutation/equivalent.toml`` lists, each with its reason) and the score
   ``killed / (mutants - equivalent)``.

``--report-only`` rewrites the report from the last run's results (after adding an
equivalence reason, for example); ``--mutants 'name*'`` reruns only the mutants whose
names match (after adding a test), keeping the other results.

An equivalent mutant is identified by its module, its function and the lines it changes
(not by mutmut's number, which shifts when the function is edited); an entry that no
longer matches a survivor is listed in the report as stale.
"""

from __future__ import annotations

import argparse
import datetime as dt
import filecmp
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ROOT / "mutation" / "targets.toml"
EQUIVALENT = ROOT / "mutation" / "equivalent.toml"
REPORTS = ROOT / "mutation" / "reports"

#: statuses that count as a kill: a failing test, or a run past the time limit
KILLED = ("killed", "timeout", "segfault")


def load_targets() -> dict[str, list[str]]:
    """Module path -> test files, from ``mutation/targets.toml``."""
    data = tomllib.loads(TARGETS.read_text("utf-8"))
    return {module: list(entry["tests"]) for module, entry in data["modules"].items()}


def load_scope(module: str) -> list[str]:
    """The ``functions`` patterns of ``module``'s entry (``[]``: the whole module).

    A module of which only some functions are the subject of its tests (``hf.py``: the
    position derivation and the evicting cache layer) lists them as ``fnmatch`` patterns
    of mutmut's mangled names (``x__positions``, ``xǁPLSHCacheLayerǁ*``); the report
    scores those and counts the others as out of scope."""
    data = tomllib.loads(TARGETS.read_text("utf-8"))
    return list(data["modules"][module].get("functions", []))


def in_scope(name: str, scope: list[str]) -> bool:
    """Whether mutant ``name`` belongs to a function matched by ``scope`` (all if empty)."""
    import fnmatch

    return not scope or any(fnmatch.fnmatchcase(function_of(name), p) for p in scope)


def report_path(module: str) -> Path:
    """``plsh_ref/testing/tolerance.py`` -> ``mutation/reports/plsh_ref.testing.tolerance.md``."""
    return REPORTS / (module.removesuffix(".py").replace("/", ".") + ".md")


def checkout_files() -> list[str]:
    """Files of the checkout: tracked and untracked, without the ignored ones."""
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [p for p in out.split("\0") if p and (ROOT / p).is_file()]


def sync_workdir(workdir: Path) -> None:
    """Copy the checkout into ``workdir`` (only files whose content changed)."""
    workdir.mkdir(parents=True, exist_ok=True)
    for rel in checkout_files():
        src, dst = ROOT / rel, workdir / rel
        if dst.exists() and filecmp.cmp(src, dst, shallow=False):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join('"' + v.replace("\\", "/") + '"' for v in values) + "]"


def write_config(workdir: Path, module: str, tests: list[str]) -> None:
    """The scratch ``pyproject.toml``: the project's, plus a ``[tool.mutmut]`` table."""
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    if "[tool.mutmut]" in text:
        raise SystemExit("pyproject.toml: has a [tool.mutmut] table; mutation/run.py writes it")
    # everything else the tests read (benchmarks/, scripts/, docs/, README.md...) is copied too
    also_copy = sorted(
        p.name for p in workdir.iterdir() if p.name not in ("mutants", "plsh_ref", "plsh_fast")
    )
    text += (
        "\n[tool.mutmut]\n"
        f"also_copy = {_toml_list(also_copy)}\n"
        'source_paths = ["plsh_ref", "plsh_fast"]\n'
        f"only_mutate = {_toml_list([module])}\n"
        f"pytest_add_cli_args_test_selection = {_toml_list(tests)}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider"]\n'
        "use_git_change_detection = false\n"
        # fork from a server that never ran a test: a worker forked from the process that
        # ran them (torch, thread pools) can deadlock on a lock held by a thread it lacks,
        # and mutmut's CPU-time limit never fires on a sleeping process
        'process_isolation = "forkserver"\n'
        # a mutant's CPU-time limit is 2 * timeout_multiplier * (its tests' time + 1 s):
        # mutmut's default multiplier 15 lets a looping mutant hold the one worker for 30x
        # its tests' time; 3 still allows a 6x slowdown before counting it as a timeout
        "timeout_multiplier = 3.0\n"
    )
    (workdir / "pyproject.toml").write_text(text, "utf-8")


def run_mutmut(workdir: Path, mutants: list[str], fresh: bool) -> float:
    """Run ``mutmut run`` in ``workdir`` with one worker; returns the wall time in seconds."""
    if fresh and (workdir / "mutants").exists():
        shutil.rmtree(workdir / "mutants")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the mutated copy must be the one imported
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"  # one core per worker, no thread pool to inherit across fork
    cmd = ["nice", "-n", "10", sys.executable, "-m", "mutmut", "run", "--max-children", "1"]
    start = time.perf_counter()
    log = workdir / "mutmut.log"
    with log.open("w") as stream:  # mutmut's progress spinner: to a log, not the terminal
        proc = subprocess.run([*cmd, *mutants], cwd=workdir, env=env, stdout=stream, stderr=stream)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise SystemExit(f"mutmut run failed (exit {proc.returncode}); end of {log}:\n{tail}")
    return time.perf_counter() - start


def record_run(workdir: Path, seconds: float, mutants: list[str]) -> None:
    """Remember when the full run (or a rerun of some mutants) happened, for the report."""
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    runs = load_runs(workdir) if mutants else {}
    if mutants:
        runs.setdefault("reruns", []).append({"date": now, "seconds": seconds, "mutants": mutants})
    else:
        runs = {"date": now, "seconds": seconds, "reruns": []}
    (workdir / "runs.json").write_text(json.dumps(runs, indent=1), "utf-8")


def load_runs(workdir: Path) -> dict:
    path = workdir / "runs.json"
    return json.loads(path.read_text("utf-8")) if path.exists() else {}


def changed_lines(diff: str) -> list[str]:
    """The removed and added lines of a unified diff, stripped (``"- old"``, ``"+ new"``)."""
    lines = []
    for line in diff.splitlines():
        if line.startswith(("---", "+++")):
            continue
        if line[:1] in "+-" and line[1:].strip():
            lines.append(line[0] + " " + line[1:].strip())
    return lines


def function_of(name: str) -> str:
    """``plsh_ref.alibi.x_slopes__mutmut_3`` -> ``x_slopes`` (mutmut's mangled name)."""
    return name.rsplit(".", 1)[-1].rsplit("__mutmut_", 1)[0]


def load_equivalents(module: str) -> list[dict]:
    if not EQUIVALENT.exists():
        return []
    entries = tomllib.loads(EQUIVALENT.read_text("utf-8")).get("equivalent", [])
    for entry in entries:
        missing = {"module", "function", "changed", "reason"} - set(entry)
        if missing:
            raise SystemExit(f"mutation/equivalent.toml: entry {entry} lacks {sorted(missing)}")
    return [e for e in entries if e["module"] == module]


def collect_results(workdir: Path, module: str) -> list[tuple[str, str, str]]:
    """(mutant name, status, diff) for every mutant of ``module`` in the last run."""
    old_cwd = os.getcwd()
    os.chdir(workdir)
    try:
        from mutmut.__main__ import SourceFileMutationData, walk_mutatable_files
        from mutmut.mutation.diff_apply import get_diff_for_mutant
        from mutmut.stats import status_by_exit_code

        rows = []
        for path in walk_mutatable_files():
            if str(path) != module:
                continue
            data = SourceFileMutationData(path=path)
            data.load()
            for name, code in sorted(data.exit_code_by_key.items(), key=_natural):
                rows.append((name, status_by_exit_code[code], get_diff_for_mutant(name, path=path)))
        return rows
    finally:
        os.chdir(old_cwd)


def _natural(item: tuple[str, object]) -> tuple[str, int]:
    head, _, number = item[0].rpartition("__mutmut_")
    return head, int(number) if number.isdigit() else 0


def git_describe() -> str:
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return head + ("+dirty" if dirty else "")


def write_report(
    module: str,
    tests: list[str],
    rows: list[tuple[str, str, str]],
    runs: dict,
    scope: list[str] | None = None,
) -> dict[str, int]:
    """Write ``mutation/reports/<module>.md``; returns the counts (of the mutants in
    ``scope``, :func:`load_scope`)."""
    scope = scope or []
    out_of_scope = [row for row in rows if not in_scope(row[0], scope)]
    rows = [row for row in rows if in_scope(row[0], scope)]
    equivalents = load_equivalents(module)
    used = set()
    killed, survived, equivalent, other, unchecked = [], [], [], [], []
    for name, status, diff in rows:
        if status in KILLED:
            killed.append((name, status))
            continue
        key = (function_of(name), changed_lines(diff))
        match = next(
            (
                i
                for i, e in enumerate(equivalents)
                if (e["function"], list(e["changed"])) == key and i not in used
            ),
            None,
        )
        if match is not None and status in ("survived", "no tests"):
            used.add(match)
            equivalent.append((name, diff, equivalents[match]["reason"]))
        elif status in ("survived", "no tests"):
            survived.append((name, status, diff))
        elif status == "not checked":  # a run stopped before it reached them
            unchecked.append(name)
        else:
            other.append((name, status, diff))
    stale = [e for i, e in enumerate(equivalents) if i not in used]
    total = len(rows)
    scored = total - len(equivalent) - len(unchecked)
    score = 100.0 * len(killed) / scored if scored else 100.0
    counts = {
        "total": total,
        "killed": len(killed),
        "survived": len(survived),
        "equivalent": len(equivalent),
        "other": len(other),
        "unchecked": len(unchecked),
    }
    by_status: dict[str, int] = {}
    for _, status in killed:
        by_status[status] = by_status.get(status, 0) + 1

    out = [
        f"# Mutation report: `{module}`",
        "",
        "Generated by `mutation/run.py` from mutmut's results (do not edit by hand; rerun",
        f"`make mutants MODULE={module}`).",
        "",
        f"- run (UTC): {runs.get('date', '?')}, {runs.get('seconds', float('nan')):.0f} s wall time"
        f" on {platform.machine()}, {os.cpu_count()} CPUs (shared), one mutmut worker",
        *[
            f"- rerun (UTC): {r['date']}, {r['seconds']:.0f} s, of {len(r['mutants'])} mutant pattern(s)"
            " after new tests (the other results stand: tests were only added)"
            for r in runs.get("reruns", [])
        ],
        f"- report written (UTC): {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}",
        f"- code: commit {git_describe()}; mutmut {_mutmut_version()}; Python {platform.python_version()}",
        "- tests run against the mutants: " + ", ".join(f"`{t}`" for t in tests),
        *(
            [
                "- scope (`functions` in `mutation/targets.toml`): "
                + ", ".join(f"`{p}`" for p in scope)
                + f"; {len(out_of_scope)} mutants of the module's other functions are out of"
                " scope (not counted below)",
            ]
            if scope
            else []
        ),
        "",
        "| mutants | killed | survived | equivalent | other | not checked | score (killed / checked non-equivalent) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {total} | {len(killed)} | {len(survived)} | {len(equivalent)} | {len(other)} | {len(unchecked)} | {score:.1f}% |",
        "",
        *(
            [
                f"**Incomplete run**: {len(unchecked)} of {total} mutants were not checked (the run"
                " was stopped); the score covers the checked ones only.",
                "",
            ]
            if unchecked
            else []
        ),
        "Killed by status: " + ", ".join(f"{k} {v}" for k, v in sorted(by_status.items())) + ".",
        "",
        "## Survived",
        "",
    ]
    if not survived:
        out.append("None.")
    for name, status, diff in survived:
        out += [f"### `{name}` ({status})", "", "```diff", *changed_lines(diff), "```", ""]
    out += ["", "## Other (suspicious, skipped, not checked)", ""]
    if not other:
        out.append("None.")
    for name, status, diff in other:
        out += [f"### `{name}` ({status})", "", "```diff", *changed_lines(diff), "```", ""]
    out += ["", "## Equivalent (listed in `mutation/equivalent.toml`)", ""]
    if not equivalent:
        out.append("None.")
    for name, diff, reason in equivalent:
        out += [f"### `{name}`", "", reason.strip(), "", "```diff", *changed_lines(diff), "```", ""]
    if stale:
        out += ["", "## Stale equivalence entries (match no survivor of this run)", ""]
        for entry in stale:
            out.append(f"- `{entry['function']}`: " + "; ".join(entry["changed"]))
    REPORTS.mkdir(parents=True, exist_ok=True)
    report_path(module).write_text("\n".join(out).rstrip() + "\n", "utf-8")
    return counts | {"score_tenths": round(10 * score)}


def _stub(module: str, name: str, diff: str) -> str:
    changed = ",\n".join("    " + json.dumps(line) for line in changed_lines(diff))
    return (
        f"[[equivalent]]  # {name.rsplit('.', 1)[-1]}\n"
        f'module = "{module}"\nfunction = "{function_of(name)}"\n'
        f'changed = [\n{changed},\n]\nreason = """TODO"""\n'
    )


def _mutmut_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("mutmut")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("module", help="e.g. plsh_ref/alibi.py (a key of mutation/targets.toml)")
    parser.add_argument("--report-only", action="store_true", help="rewrite the report only")
    parser.add_argument("--mutants", nargs="*", default=[], help="rerun only these mutant names")
    default_work = Path(
        os.environ.get("PLSH_MUTATION_WORKDIR", Path(tempfile.gettempdir()) / "plsh-mutation")
    )
    parser.add_argument("--workdir", type=Path, default=default_work)
    parser.add_argument(
        "--stub",
        nargs="+",
        metavar="NAME",
        help="print mutation/equivalent.toml entries (reason to be written) for these mutants",
    )
    args = parser.parse_args(argv)

    targets = load_targets()
    module = args.module.replace("\\", "/").removeprefix("./")
    if module not in targets:
        parser.error(f"module: {module!r} is not in mutation/targets.toml ({', '.join(targets)})")
    tests = [t for t in targets[module] if (ROOT / t).is_file()]
    missing = [t for t in targets[module] if t not in tests]
    if missing:
        print("mutation/targets.toml: not found, skipped:", ", ".join(missing), file=sys.stderr)
    workdir = args.workdir / module.removesuffix(".py").replace("/", ".")
    if not args.report_only and not args.stub:
        sync_workdir(workdir)
        write_config(workdir, module, tests)
        seconds = run_mutmut(workdir, args.mutants, fresh=not args.mutants)
        record_run(workdir, seconds, args.mutants)
    rows = collect_results(workdir, module)
    if args.stub:
        for name, _status, diff in rows:
            if name in args.stub or name.rsplit(".", 1)[-1] in args.stub:
                print(_stub(module, name, diff))
        return 0
    if not rows:
        raise SystemExit(f"{module}: no mutmut results in {workdir}")
    counts = write_report(module, tests, rows, load_runs(workdir), load_scope(module))
    print(
        f"{module}: {counts['total']} mutants, {counts['killed']} killed, "
        f"{counts['survived']} survived, {counts['equivalent']} equivalent, "
        f"{counts['other']} other, {counts['unchecked']} not checked: score {counts['score_tenths'] / 10:.1f}% "
        f"-> {report_path(module).relative_to(ROOT)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
