"""The ``plsh`` command line: a dispatcher over subcommands registered as entry points.

Subcommands are the entry points of the group ``plsh.commands`` (:data:`GROUP`): each
names a module exposing ``HELP`` (its description), ``add_arguments(parser)`` and
``run(args) -> int``, and optionally ``SUMMARY`` (one line for ``plsh --help``) and
``REQUIRES`` (importable modules the command needs, e.g. ``("torch",)``). Any installed
package adds a command by declaring one in its metadata; this package declares
``reproduce``, ``spectrum``, ``bounds``, ``verify`` (plsh_ref) and ``train-lm``
(plsh_fast) in ``pyproject.toml``. Only the chosen module is imported, so the plsh_ref
commands run without torch.

With no subcommand, ``plsh`` runs the main job ``plsh reproduce`` with its defaults. A
command whose module or ``REQUIRES`` cannot be imported ends in one line naming what is
missing, exit status 2. A ``ValueError``, ``TypeError``, ``ArithmeticError`` (overflow,
division by zero), ``MemoryError`` or ``OSError`` escaping a subcommand is reported in one line with exit
status 2 (set ``PLSH_DEBUG=1`` for the traceback).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import sys

__all__ = ["DEFAULT_COMMAND", "GROUP", "commands", "load_command", "main"]

#: entry-point group of the subcommands
GROUP = "plsh.commands"

#: the command run by a bare ``plsh``
DEFAULT_COMMAND = "reproduce"


def commands() -> dict[str, importlib.metadata.EntryPoint]:
    """The installed subcommands: name -> entry point (its value is the module's name)."""
    found = {ep.name: ep for ep in importlib.metadata.entry_points(group=GROUP)}
    # the default command first, the rest in the order their packages declare them
    return dict(sorted(found.items(), key=lambda item: item[0] != DEFAULT_COMMAND))


def _missing_requirement(module) -> str | None:
    """The first module in ``module.REQUIRES`` that cannot be imported, else ``None``."""
    for name in getattr(module, "REQUIRES", ()):
        try:
            importlib.import_module(name)
        except ImportError:
            return name
    return None


def _needs_message(command: str, what: str) -> str:
    return f"plsh {command}: needs {what}, which cannot be imported; install it, e.g. " + (
        "`pip install torch==2.13.0` (a CPU build where a plain `torch` would pull a "
        "multi-GB CUDA one; see the quickstart), then `pip install positional-lsh[fast]`"
        if what == "torch"
        else "`pip install positional-lsh[fast]`"
    )


def load_command(name: str):
    """Import the module of subcommand ``name``.

    Raises
    ------
    KeyError
        ``name`` is not an installed subcommand.
    ImportError
        The module (or a package it imports) cannot be imported.
    """
    return importlib.import_module(commands()[name].value)


def _summary(ep) -> str:
    try:
        module = importlib.import_module(ep.value)
    except ModuleNotFoundError as exc:
        return f"(needs {(exc.name or str(exc)).split('.')[0]}: not installed)"
    except ImportError as exc:
        return f"(unavailable: {exc})"
    text = getattr(module, "SUMMARY", None) or module.HELP.split(". ")[0].rstrip(".")
    missing = _missing_requirement(module)
    if missing:
        text = text.removesuffix(f" (needs {missing})") + f" (needs {missing}: not installed)"
    return text


def _usage() -> str:
    lines = [
        "usage: plsh [COMMAND] [OPTIONS]",
        "",
        f"With no COMMAND, runs `plsh {DEFAULT_COMMAND}`. Commands:",
    ]
    lines += [f"  {name:<10} {_summary(ep)}" for name, ep in commands().items()]
    lines += ["", "`plsh COMMAND --help` describes a command's options; `plsh --version`."]
    return "\n".join(lines)


class OneLineArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr, exit status 2.

    argparse's own ``error`` prints the whole usage block before the message; every ``plsh``
    command reports bad options in one line instead (``plsh COMMAND --help`` shows the
    usage).
    """

    def error(self, message):  # noqa: D102 - argparse API
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``plsh`` console script; returns the exit status.

    A reader of the output that goes away early (``plsh --help | head -3``) ends the
    command with status 1 and no traceback (Python's advice for ``BrokenPipeError``).
    """
    try:
        status = _main(argv)
        sys.stdout.flush()  # a closed pipe raises here rather than at interpreter exit
        return status
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the exit-time flush must not fail again
        return 1


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv and argv[0] in ("-V", "--version"):
        from .provenance import package_version

        print(f"positional-lsh {package_version()}")
        return 0
    if not argv or argv[0].startswith("-"):
        command = DEFAULT_COMMAND
    else:
        command = argv.pop(0)
    available = commands()
    if command not in available:
        print(
            f"plsh: unknown command {command!r} (one of: {', '.join(available)}; see plsh --help)",
            file=sys.stderr,
        )
        return 2
    try:
        module = importlib.import_module(available[command].value)
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            # a dependency that is not installed (e.g. torch for train-lm)
            print(_needs_message(command, exc.name.split(".")[0]), file=sys.stderr)
        else:
            print(
                f"plsh {command}: cannot import {available[command].value}: {exc}", file=sys.stderr
            )
        return 2
    parser = OneLineArgumentParser(prog=f"plsh {command}", description=module.HELP)
    module.add_arguments(parser)
    args = parser.parse_args(argv)
    missing = _missing_requirement(module)
    if missing is not None:
        print(_needs_message(command, missing), file=sys.stderr)
        return 2
    try:
        return int(module.run(args) or 0)
    except (ValueError, TypeError, ArithmeticError, MemoryError, OSError) as exc:
        # Bad input (an option out of range, an unreadable file, an argument the library
        # refuses): one line and exit status 2, as for argparse errors. PLSH_DEBUG=1 shows
        # the traceback.
        if os.environ.get("PLSH_DEBUG"):
            raise
        text = str(exc).replace("\n", " ") or type(exc).__name__
        print(f"plsh {command}: error: {text}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
