"""plsh_ref.provenance: the commit, dirty-tree rule, version and record of a results file.

The dirty-tree rule is checked in a real scratch git checkout: a change to a tracked file
makes it dirty, an untracked file does not. The failure paths (git failing, a truncated
commit, a failing ``git status``) use a stand-in for ``subprocess.run`` that behaves like
the real one (``check=True`` raises on a non-zero exit).
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

import _paths
import numpy as np
import pytest

from plsh_ref import provenance

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs a git executable")


def _git(folder: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(folder), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def checkout(tmp_path: Path) -> tuple[Path, str]:
    """A scratch checkout with one commit of ``pkg/module.py``; returns (folder, commit)."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "module.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "test@example.com")
    _git(repo, "config", "user.name", "test")
    _git(repo, "config", "commit.gpgsign", "false")
    _git(repo, "add", "pkg/module.py")
    _git(repo, "commit", "-q", "-m", "one")
    return repo, _git(repo, "rev-parse", "HEAD")


def test_clean_checkout_gives_its_commit(checkout):
    repo, commit = checkout
    assert len(commit) == 40
    assert provenance.git_commit(repo) == commit
    assert provenance.git_commit(str(repo / "pkg")) == commit


def test_a_file_path_means_its_folder(checkout):
    repo, commit = checkout
    assert provenance.git_commit(repo / "pkg" / "module.py") == commit


def test_default_path_is_the_folder_of_the_module(checkout, monkeypatch):
    repo, commit = checkout
    monkeypatch.setattr(provenance, "__file__", str(repo / "pkg" / "module.py"))
    assert provenance.git_commit() == commit


def test_changed_tracked_file_is_dirty(checkout):
    repo, commit = checkout
    (repo / "pkg" / "module.py").write_text("x = 2\n")
    assert provenance.git_commit(repo) == commit + "+dirty"
    _git(repo, "add", "pkg/module.py")  # staged but not committed: still dirty
    assert provenance.git_commit(repo) == commit + "+dirty"


def test_untracked_file_is_not_dirty(checkout):
    repo, commit = checkout
    (repo / "pkg" / "notes.txt").write_text("scratch\n")
    assert provenance.git_commit(repo) == commit


def test_not_a_checkout_and_no_git_give_none(tmp_path, monkeypatch, checkout):
    outside = tmp_path / "plain"
    outside.mkdir()
    assert provenance.git_commit(outside) is None
    repo, _ = checkout
    monkeypatch.setenv("PATH", str(tmp_path / "no-binaries-here"))
    assert provenance.git_commit(repo) is None  # no git executable


class _FakeRun:
    """``subprocess.run`` for git: canned (returncode, stdout) per subcommand; records calls."""

    def __init__(self, replies):
        self.replies = replies
        self.calls = []

    def __call__(self, args, **kwargs):
        self.calls.append((list(args), kwargs))
        returncode, stdout = self.replies[args[3]]
        if kwargs.get("check") and returncode != 0:
            raise subprocess.CalledProcessError(returncode, args, stdout, "")
        if not kwargs.get("capture_output"):
            stdout = None
        elif not kwargs.get("text"):
            stdout = stdout.encode()
        return subprocess.CompletedProcess(args, returncode, stdout, "")


COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    "head, expected",
    [
        ((0, COMMIT + "\n"), COMMIT),
        ((0, COMMIT[:39] + "\n"), None),  # not a full commit
        ((0, COMMIT + "0\n"), None),
        ((128, COMMIT + "\n"), None),  # git failed, whatever it printed
    ],
)
def test_head_must_succeed_with_forty_digits(monkeypatch, tmp_path, head, expected):
    fake = _FakeRun({"rev-parse": head, "status": (0, "")})
    monkeypatch.setattr(provenance.subprocess, "run", fake)
    assert provenance.git_commit(tmp_path) == expected


def test_failing_status_is_not_dirty_and_not_an_error(monkeypatch, tmp_path):
    fake = _FakeRun({"rev-parse": (0, COMMIT + "\n"), "status": (128, " M file\n")})
    monkeypatch.setattr(provenance.subprocess, "run", fake)
    assert provenance.git_commit(tmp_path) == COMMIT


def test_git_is_asked_with_a_short_timeout_in_the_given_folder(monkeypatch, tmp_path):
    fake = _FakeRun({"rev-parse": (0, COMMIT + "\n"), "status": (0, " M file\n")})
    monkeypatch.setattr(provenance.subprocess, "run", fake)
    assert provenance.git_commit(tmp_path) == COMMIT + "+dirty"
    assert [args for args, _ in fake.calls] == [
        ["git", "-C", str(tmp_path), "rev-parse", "HEAD"],
        ["git", "-C", str(tmp_path), "status", "--porcelain", "--untracked-files=no"],
    ]
    for _, kwargs in fake.calls:
        # a hung git (a network file system, a lock) must not hang the run
        assert 0 < kwargs["timeout"] <= 5


def test_dependency_versions_names_only_the_imported_modules(monkeypatch):
    """Only modules in ``sys.modules`` are recorded (an absent one is left out, not
    recorded as ``None``); a module without a string ``__version__`` and without
    distribution metadata is recorded as ``None``. Nothing is imported to ask."""
    import platform
    import types

    monkeypatch.setattr(
        provenance,
        "DEPENDENCIES",
        {"numpy": "numpy", "plsh_absent": "plsh-absent", "plsh_unversioned": "plsh-absent"},
    )
    monkeypatch.delitem(sys.modules, "plsh_absent", raising=False)
    fake = types.ModuleType("plsh_unversioned")
    fake.__version__ = (1, 2)  # not a string: the distribution's metadata, absent here
    monkeypatch.setitem(sys.modules, "plsh_unversioned", fake)
    assert provenance.dependency_versions() == {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "plsh_unversioned": None,
    }
    assert "plsh_absent" not in sys.modules


def test_package_version_is_pyproject_version():
    import tomllib  # Python >= 3.11, as in tests/cli/test_cli.py

    pyproject = tomllib.loads((_paths.ROOT / "pyproject.toml").read_text("utf-8"))
    assert provenance.DISTRIBUTION == pyproject["project"]["name"]
    try:
        installed = importlib.metadata.version(provenance.DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the package is not installed")
    assert provenance.package_version() == installed


def test_package_version_without_metadata(monkeypatch):
    monkeypatch.setattr(provenance, "DISTRIBUTION", "positional-lsh-not-installed-anywhere")
    assert provenance.package_version() == "0+unknown"


def test_run_metadata_fields(monkeypatch, checkout):
    repo, commit = checkout
    monkeypatch.setattr(provenance, "__file__", str(repo / "pkg" / "module.py"))
    before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    record = provenance.run_metadata()
    after = dt.datetime.now(dt.timezone.utc)
    assert set(record) == {
        "package",
        "version",
        "git_commit",
        "python",
        "numpy",
        "date_utc",
        "machine",
        "argv",
        "dependencies",
    }
    assert record["dependencies"] == provenance.dependency_versions()
    assert record["package"] == provenance.DISTRIBUTION
    assert record["version"] == provenance.package_version()
    assert record["git_commit"] == commit
    assert record["python"] == ".".join(map(str, sys.version_info[:3]))
    assert record["numpy"] == np.__version__
    when = dt.datetime.fromisoformat(record["date_utc"])
    assert when.utcoffset() == dt.timedelta(0)
    assert when.microsecond == 0 and "." not in record["date_utc"]  # seconds
    assert before <= when <= after
    assert set(record["machine"]) == {"platform", "arch", "cpu_count"}
    assert record["machine"]["arch"] == (provenance.platform.machine() or None)
    assert record["machine"]["platform"] == provenance.platform.platform()
    assert record["machine"]["cpu_count"] == provenance.os.cpu_count()
    assert record["argv"] == sys.argv and record["argv"] is not sys.argv


def test_run_metadata_unknown_fields_are_none(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "numpy", None)  # `import numpy` fails
    monkeypatch.setattr(provenance.platform, "machine", lambda: "")
    monkeypatch.setattr(provenance, "__file__", str(tmp_path / "module.py"))  # not a checkout
    record = provenance.run_metadata()
    assert record["numpy"] is None
    assert record["machine"]["arch"] is None
    assert record["git_commit"] is None
