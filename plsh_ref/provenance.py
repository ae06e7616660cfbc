"""Provenance of a results file: which code, on which machine, at what time.

Every results JSON written by the ``plsh`` commands and the benchmarks carries
:func:`run_metadata` under the key ``"provenance"``, so a number can be traced to the
package version and git commit that produced it.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path

__all__ = [
    "DEPENDENCIES",
    "DISTRIBUTION",
    "dependency_versions",
    "git_commit",
    "package_version",
    "run_metadata",
]

#: name of the installed distribution that holds ``plsh_ref`` and ``plsh_fast``
DISTRIBUTION = "positional-lsh"

#: the libraries whose versions a results file records when the run imported them
#: (module name -> distribution name)
DEPENDENCIES = {
    "numpy": "numpy",
    "scipy": "scipy",
    "mpmath": "mpmath",
    "matplotlib": "matplotlib",
    "torch": "torch",
    "triton": "triton",
    "transformers": "transformers",
    "hypothesis": "hypothesis",
}


def dependency_versions() -> dict:
    """Versions of Python and of the :data:`DEPENDENCIES` this process has imported.

    Only modules already in ``sys.modules`` are reported (nothing is imported to ask:
    a run of ``plsh spectrum`` records no torch, and does not load it).

    Returns
    -------
    dict
        ``{"python": "3.11.7", "numpy": "2.4.6", ...}``: the module's ``__version__``,
        else its distribution's metadata version, else ``None``.

    References
    ----------
    README.md, "Command line" (each ``results.json`` records the versions of the libraries the run
    imported); ``importlib.metadata.version``.
    """
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for module_name, distribution in DEPENDENCIES.items():
        module = sys.modules.get(module_name)
        if module is None:
            continue
        version = getattr(module, "__version__", None)
        if not isinstance(version, str):
            try:
                version = importlib.metadata.version(distribution)
            except importlib.metadata.PackageNotFoundError:
                version = None
        versions[module_name] = version
    return versions


def package_version() -> str:
    """Version of the installed ``positional-lsh`` distribution (written once, in pyproject).

    Returns
    -------
    str
        e.g. ``"0.1.0"``; ``"0+unknown"`` when the package runs from a source tree that
        was never installed (no distribution metadata).

    References
    ----------
    ``importlib.metadata.version``; the ``version`` of ``pyproject.toml``.
    """
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def git_commit(path: str | os.PathLike | None = None) -> str | None:
    """The git commit of the checkout holding ``path`` (default: this package), or ``None``.

    Never raises: no git executable, not a checkout (an installed wheel), a timeout or any
    other failure gives ``None``. A checkout with uncommitted changes to tracked files
    gives the commit with ``"+dirty"`` appended.

    Parameters
    ----------
    path : path-like, optional
        A file or folder inside the checkout; default the folder of this module.

    Returns
    -------
    str or None
        40 hexadecimal digits (optionally ``+dirty``), or ``None``.

    References
    ----------
    ``git rev-parse HEAD`` and ``git status --porcelain --untracked-files=no``; README.md,
    "Command line" (the git commit in each ``results.json``).
    """
    try:
        folder = Path(path) if path is not None else Path(__file__).resolve().parent
        if folder.is_file():
            folder = folder.parent
        run = lambda *cmd: subprocess.run(  # noqa: E731
            ["git", "-C", str(folder), *cmd],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
        head = run("rev-parse", "HEAD")
        commit = head.stdout.strip()
        if head.returncode != 0 or len(commit) != 40:
            return None
        status = run("status", "--porcelain", "--untracked-files=no")
        if status.returncode == 0 and status.stdout.strip():
            commit += "+dirty"
        return commit
    except Exception:  # noqa: BLE001 - provenance must never fail a run
        return None


def run_metadata() -> dict:
    """Provenance record for a results JSON (package, code version, machine, time).

    Returns
    -------
    dict
        JSON-serialisable: ``package`` (distribution name), ``version``
        (:func:`package_version`), ``git_commit`` (:func:`git_commit`, ``None`` outside a
        git checkout), ``python``, ``numpy`` (versions), ``dependencies`` (the versions of
        Python and of every library of :data:`DEPENDENCIES` the run imported,
        :func:`dependency_versions`), ``date_utc`` (ISO 8601, seconds),
        ``machine`` (``platform``, ``arch``, ``cpu_count``), ``argv`` (the command
        line of this process).

    Notes
    -----
    Never raises; a field that cannot be determined is ``None``. Imports nothing beyond
    numpy and the standard library; call it after the computation, so that the libraries
    the run used are imported (and recorded).

    References
    ----------
    README.md, "Command line" (what each ``results.json`` records).
    """
    try:
        import numpy

        numpy_version = numpy.__version__
    except Exception:  # noqa: BLE001
        numpy_version = None
    return {
        "package": DISTRIBUTION,
        "version": package_version(),
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "numpy": numpy_version,
        "dependencies": dependency_versions(),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "arch": platform.machine() or None,
            "cpu_count": os.cpu_count(),
        },
        "argv": list(sys.argv),
    }
