"""The ``plsh`` command line: a dispatcher over subcommands.

Each subcommand lives in its own module exposing ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``. Only the chosen module is imported,
so ``plsh reproduce`` runs without torch. With no subcommand, ``plsh`` runs the main job
``plsh reproduce`` with its defaults. A ``ValueError``, ``TypeError``, ``OverflowError`` or
``OSError`` escaping a subcommand is reported in one line with exit status 2 (set
``PLSH_DEBUG=1`` for the traceback).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

__all__ = ["COMMANDS", "main"]

#: subcommand name -> module implementing it
COMMANDS = {
    "reproduce": "plsh_ref.experiments.reproduce",
    "spectrum": "plsh_ref.experiments.spectrum",
    "bounds": "plsh_ref.experiments.bounds_report",
    "verify": "plsh_ref.testing.verify",
    "train-lm": "plsh_fast.experiments.train_lm",
}

_SUMMARIES = {
    "reproduce": "the paper's convergence experiment (default command)",
    "spectrum": "KMS spectrum of L*, symbol bounds, spectra of M~ and M~ - L*",
    "bounds": "Theorem 2.1/2.2 bounds and the samples needed for a target error",
    "verify": "check a user's attention kernel against the reference",
    "train-lm": "train small byte-level LMs: ALiBi vs PLSH vs baselines (needs torch)",
}


def _usage() -> str:
    lines = [
        "usage: plsh [COMMAND] [OPTIONS]",
        "",
        "With no COMMAND, runs `plsh reproduce`. Commands:",
    ]
    lines += [f"  {name:<10} {_SUMMARIES[name]}" for name in COMMANDS]
    lines += ["", "`plsh COMMAND --help` describes a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``plsh`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv and argv[0] in ("-V", "--version"):
        from . import __version__

        print(f"positional-lsh {__version__}")
        return 0
    if not argv or argv[0].startswith("-"):
        command = "reproduce"
    else:
        command = argv.pop(0)
    if command not in COMMANDS:
        print(f"plsh: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(COMMANDS[command])
    except ImportError as exc:
        print(
            f"plsh {command}: cannot import {COMMANDS[command]} ({exc}); "
            "install the extras it needs, e.g. `pip install positional-lsh[fast]`",
            file=sys.stderr,
        )
        return 2
    parser = argparse.ArgumentParser(prog=f"plsh {command}", description=module.HELP)
    module.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return int(module.run(args) or 0)
    except (ValueError, TypeError, OverflowError, OSError) as exc:
        # Bad input (an option out of range, an unreadable file, an argument the library
        # refuses): one line and exit status 2, as for argparse errors. PLSH_DEBUG=1 shows
        # the traceback.
        if os.environ.get("PLSH_DEBUG"):
            raise
        print(f"plsh {command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
