"""Every ``plsh`` command driven with a table of bad inputs.

Each bad input must end in exactly one line on stderr that names the option the user
typed, exit status 2, no traceback, and no output folder left behind. The commands run
in-process (``plsh_ref.cli.main``) on tiny sizes, so that an input wrongly accepted
finishes in seconds (and fails the test by its exit status 0); each command's tiny base
command line is run once as the negative control. Only ``--help`` timing and Ctrl-C run
in a subprocess.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import _paths
import numpy as np
import pytest

from plsh_ref import cli
from plsh_ref.experiments import options

HUGE_INT = "1" + "0" * 30  # beyond int64
HUGE_FLOAT = "1e300"
KERNEL = "plsh_ref.testing.examples:numpy_alibi"
SLOPES = "plsh_ref.testing.examples:press_slopes"

#: tiny, valid command lines; a bad option is appended (argparse: the last value counts)
BASE = {
    "spectrum": ["spectrum", "--n", "8", "--num-samples", "2", "--quiet"],
    "bounds": ["bounds", "--n", "16", "--sigma", "4", "--quiet"],
    "reproduce": [
        "reproduce",
        "--n",
        "8",
        "--sigma",
        "4",
        "--num-samples",
        "1",
        "2",
        "--fit-min-samples",
        "1",
        "--reps",
        "1",
        "--output-reps",
        "1",
        "--max-tokens",
        "4",
        "--sampler",
        "iid",
        "--no-plots",
        "--quiet",
    ],
    "verify": ["verify", KERNEL, "--cases", "1", "--no-battery", "--dtypes", "float64"],
    "verify-slopes": ["verify-slopes", SLOPES, "--max-heads", "2"],
    "train-lm": [
        "train-lm",
        "--variants",
        "none",
        "--seq-len",
        "8",
        "--steps",
        "1",
        "--batch-size",
        "1",
        "--d-model",
        "8",
        "--layers",
        "1",
        "--heads",
        "1",
        "--eval-lengths",
        "1",
        "--eval-tokens",
        "16",
        "--seed",
        "0",
        "--max-bytes",
        "20000",
        "--threads",
        "1",
        "--no-eval-exact",
        "--quiet",
    ],
}

#: commands that write an output folder by default (the table passes --out <tmp>/out)
WRITES = {"spectrum", "reproduce", "train-lm"}

# Bad values per kind of option. "huge" is listed only where a huge value is refused (by
# the memory guard or a documented maximum); where it is a valid request (a seed, a block
# larger than the sequence) it is not bad input.
COMMON = ["nan", "inf", "-inf", "abc", ""]
KINDS = {
    "count": COMMON + ["-1", "0", "1.5"],  # an integer >= 1
    "count0": COMMON + ["-1", "1.5"],  # an integer >= 0
    "positive": COMMON + ["-1", "0"],  # a finite float > 0
    "nonnegative": COMMON + ["-1"],
    "probability": COMMON + ["-1", "0", "1", "2"],  # in (0, 1)
    "sigma": COMMON + ["-1", "0", HUGE_FLOAT, "4,,8"],
}

#: (command, option, kind, huge value refused?)
NUMERIC = [
    ("spectrum", "--n", "count", True),
    ("spectrum", "--num-samples", "count", True),
    ("spectrum", "--seed", "count0", False),
    ("spectrum", "--sigma", "sigma", True),
    ("spectrum", "--max-memory", "positive", False),
    ("bounds", "--n", "count", False),
    ("bounds", "--num-samples", "count", False),
    ("bounds", "--eps", "probability", False),
    ("bounds", "--delta", "probability", False),
    ("bounds", "--spectral-eps", "positive", False),
    ("bounds", "--sigma", "sigma", True),
    ("reproduce", "--n", "count", True),
    ("reproduce", "--num-samples", "count", True),
    ("reproduce", "--reps", "count", True),
    ("reproduce", "--output-reps", "count", True),
    ("reproduce", "--fit-min-samples", "count", True),
    ("reproduce", "--max-tokens", "count", False),
    ("reproduce", "--fixed-block-size", "count", False),
    ("reproduce", "--group-size", "count", False),
    ("reproduce", "--seed", "count0", False),
    ("reproduce", "--sigma", "sigma", True),
    ("reproduce", "--max-memory", "positive", False),
    ("verify", "--cases", "count0", True),
    ("verify", "--seed", "count0", False),
    ("verify", "--max-seq-len", "count", True),
    ("verify", "--max-heads", "count", True),
    ("verify", "--max-head-dim", "count", True),
    ("verify", "--max-batch", "count", True),
    ("verify", "--max-samples", "count", True),
    ("verify", "--timeout", "positive", False),
    ("verify", "--worst", "count0", False),
    ("verify", "--long-cases", "count0", True),
    ("verify", "--max-memory", "positive", False),
    ("verify-slopes", "--max-heads", "count", True),
    ("train-lm", "--seq-len", "count", True),
    ("train-lm", "--steps", "count", True),
    ("train-lm", "--batch-size", "count", True),
    ("train-lm", "--d-model", "count", True),
    ("train-lm", "--layers", "count", True),
    ("train-lm", "--heads", "count", True),
    ("train-lm", "--eval-tokens", "count", False),
    ("train-lm", "--eval-lengths", "count", True),
    ("train-lm", "--block-size", "count0", False),
    ("train-lm", "--max-bytes", "count0", False),
    ("train-lm", "--threads", "count", True),
    ("train-lm", "--lr", "positive", False),
    ("train-lm", "--weight-decay", "nonnegative", False),
    ("train-lm", "--val-fraction", "probability", False),
    ("train-lm", "--seed", "count0", False),
    ("train-lm", "--max-memory", "positive", False),
]


def _numeric_cases():
    for command, option, kind, huge in NUMERIC:
        values = KINDS[kind] + ([HUGE_INT] if huge and kind != "sigma" else [])
        if command == "reproduce" and option == "--max-tokens":
            values = values + ["1"]  # two tokens at least
        for value in values:
            yield pytest.param(command, [option, value], option, id=f"{command} {option}={value!r}")


def _special_cases():
    """(command, extra argv, text the one error line must hold); ``{tmp}`` is the test's
    temporary folder, ``{file}`` a text file in it."""
    cases = [
        # missing and wrong files
        ("reproduce", ["--qkv", "missing.npz"], "--qkv: no such file"),
        ("reproduce", ["--qkv", "{file}"], "--qkv: '{file}' is not an .npz archive"),
        ("reproduce", ["--qkv", "{tmp}"], "--qkv:"),
        ("reproduce", ["--qkv", ""], "--qkv:"),
        ("reproduce", ["--qkv", "{tmp}/partial.npz"], "--qkv:"),
        ("train-lm", ["--corpus", "{tmp}/no_such_folder"], "--corpus:"),
        ("verify", ["kbad_for_plsh:notfn"], "kernel: kbad_for_plsh:notfn is an int, not a"),
        ("verify-slopes", ["kbad_for_plsh:notfn"], "kbad_for_plsh:notfn is an int, not a"),
        ("verify", ["no_such_module_for_plsh:f"], "kernel: cannot import module"),
        # a length scale too small for the positions: the partition's bins leave int64
        ("spectrum", ["--sigma", "1e-300"], "--sigma: bin index"),
        ("reproduce", ["--sigma", "1e-300"], "--sigma: bin index"),
        # more samples than a partition may hold (validation.MAX_NUM_SAMPLES)
        ("reproduce", ["--num-samples", "1", "600000"], "--num-samples: expected integers <="),
        ("spectrum", ["--num-samples", "600000"], "--num-samples: must be <= 500000"),
        # sizes past --max-memory name the option that was typed
        ("train-lm", ["--seq-len", "100000000"], "--seq-len: 100000000 would need"),
        ("train-lm", ["--heads", "1000000", "--d-model", "1000000"], "--heads:"),
        # wrong words
        ("reproduce", ["--sampler", "bogus"], "--sampler: invalid choice"),
        ("train-lm", ["--sampler", "bogus"], "--sampler:"),
        ("train-lm", ["--backend", "bogus"], "--backend:"),
        ("train-lm", ["--resample", "bogus"], "--resample:"),
        ("train-lm", ["--variants", "bogus"], "--variants:"),
        ("train-lm", ["--variants", "none,none"], "--variants:"),
        ("train-lm", ["--eval-lengths", "1,x"], "--eval-lengths:"),
        ("train-lm", ["--seed", "0,0"], "--seed:"),
        ("verify", ["--kind", "bogus"], "--kind: invalid choice"),
        ("verify", ["--dtypes", "float99"], "--dtypes:"),
        ("verify", ["--unsupported", "bogus"], "--unsupported:"),
        ("verify", ["--case", "bogus"], "--case:"),
        ("bounds", ["--bogus"], "unrecognized arguments: --bogus"),
        # unwritable and impossible output paths, refused before any computation
        ("spectrum", ["--out", "{file}"], "--out: '{file}' is a file"),
        ("spectrum", ["--out", "{file}/sub"], "--out: cannot create"),
        ("spectrum", ["--out", "/proc/plsh-out"], "--out: cannot create"),
        ("spectrum", ["--out", ""], "--out: expected a folder"),
        ("bounds", ["--out", "/proc/plsh-out"], "--out: cannot create"),
        ("reproduce", ["--out", "/proc/plsh-out"], "--out: cannot create"),
        ("train-lm", ["--out", "/proc/plsh-out"], "--out: cannot create"),
        ("verify", ["--json", "/proc/plsh-report.json"], "--json:"),
        ("verify", ["--json", "{tmp}"], "--json: '{tmp}' is a folder"),
        ("verify", ["--json", "{file}/report.json"], "--json:"),
        ("verify", ["--junitxml", "/proc/plsh-report.xml"], "--junitxml: folder '/proc'"),
        ("verify", ["--junitxml", "{tmp}"], "--junitxml: '{tmp}' is a folder"),
        # a --spec case past --max-memory, refused before it is built
        (
            "verify",
            ["--max-memory", "0.001", "--spec", '{"n_q": 1000, "n_k": 1000}'],
            "--spec: custom_0 (alibi float32 B=1 H=2 n_q=1000 n_k=1000",
        ),
        # conflicting options
        (
            "reproduce",
            ["--num-samples", "1", "2", "--fit-min-samples", "100"],
            "--fit-min-samples:",
        ),
        ("reproduce", ["--num-samples", "2"], "--num-samples: need at least two"),
        ("train-lm", ["--d-model", "10", "--heads", "3"], "--d-model: 10 not divisible by --heads"),
        ("train-lm", ["--eval-lengths", "4", "--eval-tokens", "16"], "--eval-tokens:"),
        ("verify", ["--framework", "numpy", "--device", "cuda"], "--device:"),
        # asking for causal (bidirectional) problems only while declaring them unsupported
        (
            "verify",
            ["--causal", "yes", "--unsupported", "causal"],
            "--causal yes: asks for causal problems only, but --unsupported causal",
        ),
        (
            "verify",
            ["--causal", "no", "--unsupported", "bidirectional"],
            "--causal no: asks for bidirectional problems only, but --unsupported bidirectional",
        ),
        (
            "verify",
            ["--unsupported", "causal,bidirectional"],
            "--unsupported: causal and bidirectional together leave no problem",
        ),
    ]
    for command, extra, text in cases:
        yield pytest.param(command, extra, text, id=f"{command} {' '.join(extra)!r}")


#: a deprecated spelling next to the new one (the base command line may hold one of them):
#: the deprecation line comes first, then the error naming both spellings
CONFLICTS = [
    ("spectrum", ["--out", "{tmp}/a", "--output", "{tmp}/b"], ("--out", "--output")),
    ("bounds", ["--out", "{tmp}/a", "--output", "{tmp}/b"], ("--out", "--output")),
    ("reproduce", ["--sigma", "4", "--sigmas", "8"], ("--sigma", "--sigmas")),
    ("reproduce", ["--samples", "1,2"], ("--num-samples", "--samples")),
    ("train-lm", ["--seeds", "1"], ("--seed", "--seeds")),
    ("train-lm", ["--out", "{tmp}/a", "--output", "{tmp}/b"], ("--out", "--output")),
]


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A fresh current folder with a text file, a partial .npz and a module whose
    ``notfn`` is an int; returns the substitutions for the table's placeholders."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("PLSH_DEBUG", raising=False)
    (tmp_path / "notes.txt").write_text("not an archive\n")
    np.savez(tmp_path / "partial.npz", query=np.zeros((1, 1, 4, 2)))
    (tmp_path / "kbad_for_plsh.py").write_text("notfn = 3\n")
    return {"{tmp}": str(tmp_path), "{file}": str(tmp_path / "notes.txt")}


def _fill(items, subst):
    out = []
    for item in items:
        for key, value in subst.items():
            item = item.replace(key, value)
        out.append(item)
    return out


def _run(command, extra, subst, tmp_path):
    if command == "train-lm":
        pytest.importorskip("torch")
    argv = list(BASE[command])
    extra = list(extra)
    if extra and ":" in extra[0] and not extra[0].startswith("-"):  # another kernel
        argv[1] = extra.pop(0)
    if command in WRITES and "--out" not in extra:
        argv += ["--out", str(tmp_path / "out")]
    return cli.main(argv + _fill(extra, subst))


def _assert_one_line_refusal(capsys, command, code, text, tmp_path, lines=1):
    err = capsys.readouterr().err
    assert code == 2, (code, err)
    assert "Traceback" not in err, err
    got = err.strip().splitlines()
    assert len(got) == lines, err
    assert got[-1].startswith(f"plsh {command}: error: "), err
    assert text in got[-1], (text, err)
    # refused before anything was written: no output folder, no default one
    assert not (tmp_path / "out").exists() and not (tmp_path / "plsh_out").exists()
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("command", list(BASE))
def test_base_command_lines_run(command, workspace, tmp_path, capsys):
    """Negative control: without the bad option each tiny command line succeeds, so the
    refusals below come from the bad option alone."""
    assert _run(command, [], workspace, tmp_path) == 0, capsys.readouterr().err
    if command in WRITES:
        assert (tmp_path / "out" / "results.json").is_file()


@pytest.mark.parametrize("command, extra, option", list(_numeric_cases()))
def test_bad_numeric_value_is_one_line_naming_the_option(
    command, extra, option, workspace, tmp_path, capsys
):
    code = _run(command, extra, workspace, tmp_path)
    _assert_one_line_refusal(capsys, command, code, f"{option}:", tmp_path)


@pytest.mark.parametrize("command, extra, text", list(_special_cases()))
def test_bad_input_is_one_line_naming_the_option(command, extra, text, workspace, tmp_path, capsys):
    code = _run(command, extra, workspace, tmp_path)
    _assert_one_line_refusal(capsys, command, code, _fill([text], workspace)[0], tmp_path)


@pytest.mark.parametrize(
    "command, extra, names", CONFLICTS, ids=[f"{c[0]} {c[2][1]}" for c in CONFLICTS]
)
def test_two_spellings_of_one_option_are_refused(
    command, extra, names, workspace, tmp_path, capsys
):
    code = _run(command, extra, workspace, tmp_path)
    err = capsys.readouterr().err
    first, *rest = err.strip().splitlines()
    assert first.startswith("plsh: warning: ") and "is deprecated" in first, err
    print("\n".join(rest), file=sys.stderr)  # the rest goes to the shared assertion
    _assert_one_line_refusal(capsys, command, code, "given together with", tmp_path)
    assert all(name in rest[0] for name in names), err


def test_empty_folders_of_a_failed_run_are_removed(tmp_path, monkeypatch):
    """A run that fails after creating its output folder (and its parents) leaves none of
    them; folders that existed, and files in them, stay."""
    monkeypatch.chdir(tmp_path)
    kept = tmp_path / "kept"
    kept.mkdir()
    created = options.CreatedFolders(kept / "new" / "deeper")
    (kept / "new" / "deeper" / "sigma-4").mkdir(parents=True)
    assert created.remove_empty() and not (kept / "new").exists() and kept.is_dir()
    default = options.CreatedFolders(None)  # plsh_out/<command>-<time>, plsh_out new
    (tmp_path / "plsh_out" / "reproduce-x").mkdir(parents=True)
    default.remove_empty()
    assert not (tmp_path / "plsh_out").exists()
    (tmp_path / "plsh_out" / "old").mkdir(parents=True)
    default = options.CreatedFolders(None)
    (tmp_path / "plsh_out" / "spectrum-x").mkdir()
    (tmp_path / "plsh_out" / "written").mkdir()
    (tmp_path / "plsh_out" / "written" / "results.json").write_text("{}")
    default.remove_empty()
    assert sorted(p.name for p in (tmp_path / "plsh_out").iterdir()) == ["old", "written"]


def test_option_types_refuse_and_accept():
    assert options.integer(minimum=1)("7") == 7
    assert options.number(positive=True)(" 2.5 ") == 2.5
    for convert, text in [
        (options.integer(minimum=1), "0"),
        (options.integer(maximum=3), "4"),
        (options.integer(), "2.0"),
        (options.number(), "nan"),
        (options.number(below=1), "1"),
        (options.number(positive=True), "-0"),
    ]:
        with pytest.raises(Exception, match=r"^(must|expected)") as info:
            convert(text)
        assert type(info.value).__name__ == "ArgumentTypeError"


# --------------------------------------------------------------------------------------
# subprocess: plsh --help without torch and fast; Ctrl-C
# --------------------------------------------------------------------------------------


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_paths.ROOT), env.get("PYTHONPATH", "")])
    env.pop("PLSH_DEBUG", None)
    return env


def test_plsh_help_imports_no_command_and_no_torch():
    code = (
        "import sys; from plsh_ref import cli; status = cli.main(['--help']); "
        "bad = [m for m in ('torch', 'triton', 'scipy', 'plsh_fast.experiments.train_lm', "
        "'plsh_ref.experiments.reproduce') if m in sys.modules]; "
        "print('imported:', bad); sys.exit(status)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "imported: []" in proc.stdout, proc.stdout
    assert "train-lm" in proc.stdout and "verify" in proc.stdout


def test_plsh_help_answers_in_under_a_second():
    # Importing torch for the overview took 2.4-4.4 s. The CPU time of the whole process
    # (interpreter start included) is what the command costs; the wall time on a machine
    # shared with other jobs adds waiting for a core, so the best of three runs is kept.
    cpu = []
    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-m", "plsh_ref.cli", "--help"],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        assert proc.returncode == 0 and b"train-lm" in out, proc.stderr.read()
        cpu.append(usage.ru_utime + usage.ru_stime)
    assert min(cpu) < 1.0, cpu


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(
    "sig, status, word",
    [
        (signal.SIGINT, cli.INTERRUPTED, "interrupted"),
        (signal.SIGTERM, cli.TERMINATED, "terminated"),
    ],
    ids=["ctrl_c", "sigterm"],
)
def test_a_stop_signal_is_one_line_and_leaves_no_empty_folder(tmp_path, sig, status, word):
    """``plsh reproduce`` makes its output folder, then computes for minutes; Ctrl-C
    printed a traceback and left the empty folder; SIGTERM (a CI timeout, ``kill``) left
    it too. Exit statuses 130 and 143, as a shell reports them."""
    out = tmp_path / "runs" / "interrupted"
    argv = [sys.executable, "-m", "plsh_ref.cli", "reproduce", "--quiet", "--no-plots"]
    proc = subprocess.Popen(
        [*argv, "--out", str(out)],
        env=_env(),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as from a shell: SIGINT at its default. A pytest-xdist worker may run with SIGINT
        # ignored, which the child inherits; Python then installs no KeyboardInterrupt
        # handler and the run went on to its end (exit 0, twice in CI on 2026-12-02)
        preexec_fn=_default_sigint,
    )
    deadline = time.monotonic() + 120
    while not out.is_dir() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert out.is_dir(), "the run never started computing"
    time.sleep(0.3)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status == 128 + sig, err
    assert err.strip() == f"plsh reproduce: {word}", err
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------------------------
# help texts
# --------------------------------------------------------------------------------------

#: the commands that write results, each with the shared --out / --quiet / --seed
RESULT_COMMANDS = ("reproduce", "spectrum", "bounds", "train-lm")


def _actions(command):
    if command == "train-lm":
        pytest.importorskip("torch")
    parser = cli.OneLineArgumentParser(prog=f"plsh {command}")
    cli.load_command(command).add_arguments(parser)
    return {a.option_strings[-1] if a.option_strings else a.dest: a for a in parser._actions}


@pytest.mark.parametrize("command", list(BASE))
def test_help_texts_state_one_default_each(command):
    for name, action in _actions(command).items():
        text = action.help or ""
        assert text.count("(default") <= 1, (name, text)
        if "(default:" in text:
            assert "'" not in text.split("(default:")[-1], (name, text)  # no repr quotes


@pytest.mark.parametrize("command", RESULT_COMMANDS)
def test_shared_options_have_one_spelling(command):
    actions = _actions(command)
    assert actions["--out"].metavar == "DIR"
    assert "--quiet" in actions
    if command != "bounds":  # the bounds are not random
        assert actions["--seed"].metavar in (None, "SEED")
    if "--max-memory" in actions:
        assert actions["--max-memory"].metavar == "GIB"
