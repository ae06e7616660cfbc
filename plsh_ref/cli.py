"""The ``plsh`` command line: a dispatcher over subcommands registered as entry points.

Subcommands are the entry points of the group ``plsh.commands`` (:data:`GROUP`): each
names a module exposing ``HELP`` (its description), ``add_arguments(parser)`` and
``run(args) -> int``, and optionally ``SUMMARY`` (one line for ``plsh --help``) and
``REQUIRES`` (importable modules the command needs, e.g. ``("torch",)``). Any installed
package adds a command by declaring one in its metadata; this package declares
``reproduce``, ``spectrum``, ``bounds``, ``verify`` (plsh_ref) and ``train-lm``
(plsh_fast) in ``pyproject.toml``. Only the chosen module is imported, so the plsh_ref
commands run without torch; ``plsh --help`` imports none of them (it reads each module's
``SUMMARY`` and ``REQUIRES`` from its source, :func:`command_summary`).

With no subcommand, ``plsh`` runs the main job ``plsh reproduce`` with its defaults. A
command whose module or ``REQUIRES`` cannot be imported ends in one line naming what is
missing, exit status 2. A ``ValueError``, ``TypeError``, ``ArithmeticError`` (overflow,
division by zero), ``MemoryError`` or ``OSError`` escaping a subcommand is reported in one
line with exit status 2 (set ``PLSH_DEBUG=1`` for the traceback); a message that starts
with a parameter name the command has as an option (``num_samples: ...``) names the option
(``--num-samples: ...``), as does one listed in the module's optional
``PARAMETER_OPTIONS`` mapping. Ctrl-C ends a command with one line and exit status 130.
A command that fails or is interrupted leaves no empty output folder behind
(:class:`plsh_ref.experiments.options.CreatedFolders`).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import re
import signal
import sys
import threading
from types import FrameType, ModuleType
from typing import NoReturn

__all__ = [
    "DEFAULT_COMMAND",
    "GROUP",
    "INTERRUPTED",
    "TERMINATED",
    "OneLineArgumentParser",
    "command_summary",
    "commands",
    "install_hint",
    "load_command",
    "main",
]

#: entry-point group of the subcommands
GROUP = "plsh.commands"

#: the command run by a bare ``plsh``
DEFAULT_COMMAND = "reproduce"

#: exit status after Ctrl-C (128 + SIGINT, as a shell reports it)
INTERRUPTED = 130

#: exit status after SIGTERM (128 + SIGTERM), e.g. a CI job's timeout or ``kill``
TERMINATED = 143


class _Terminated(BaseException):
    """Raised in the main thread by the SIGTERM handler of a running command."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated()


def commands() -> dict[str, importlib.metadata.EntryPoint]:
    """The installed subcommands: name -> entry point (its value is the module's name).

    References
    ----------
    ``importlib.metadata.entry_points`` (group ``plsh.commands``, declared in ``pyproject.toml``);
    README.md, "Command line".
    """
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


#: the optional-dependency group (pyproject.toml) that installs a top-level module
_EXTRA_OF = {"triton": "fast", "transformers": "hf"}


def install_hint(what: str) -> str:
    """How to install ``what`` (``"torch"`` or another requirement) from a checkout.

    There is no published release: the package installs from its source folder. torch
    comes from the PyTorch CPU wheel index on a machine without a CUDA GPU (the public
    index serves the CUDA build, with its NVIDIA libraries, on Linux; nothing else is
    needed for the CPU path) and with the ``fast`` extra (torch and triton) on a CUDA
    machine; triton and transformers come with their extras (``fast``, ``hf``), anything
    else by name.

    Parameters
    ----------
    what : str
        The top-level module that cannot be imported.

    Returns
    -------
    str
        One sentence of pip commands (no trailing period).

    References
    ----------
    ``docs/quickstart.md``, "Install" (torch from the PyTorch CPU wheel index, then the extras).
    """
    if what == "torch":
        return (
            "on a CPU-only machine `pip install torch --index-url "
            "https://download.pytorch.org/whl/cpu`, on a CUDA machine `pip install -e "
            "'.[fast]'` in the positional-lsh checkout (torch and triton; see the quickstart)"
        )
    extra = _EXTRA_OF.get(what)
    if extra is not None:
        return f"`pip install -e '.[{extra}]'` in the positional-lsh checkout"
    return f"`pip install {what}`"


def _needs_message(command: str, what: str) -> str:
    return f"plsh {command}: needs {what}, which cannot be imported; install it: " + install_hint(
        what
    )


def load_command(name: str) -> ModuleType:
    """Import the module of subcommand ``name``.

    Raises
    ------
    KeyError
        ``name`` is not an installed subcommand.
    ImportError
        The module (or a package it imports) cannot be imported.

    References
    ----------
    ``importlib.import_module`` of the entry point's value (``pyproject.toml``,
    ``[project.entry-points."plsh.commands"]``).
    """
    return importlib.import_module(commands()[name].value)


def _module_file(name: str) -> str | None:
    """The source file of module ``name``, found without importing it or its packages."""
    path = None
    spec = None
    for part in range(1, len(name.split(".")) + 1):
        spec = importlib.machinery.PathFinder.find_spec(".".join(name.split(".")[:part]), path)
        if spec is None:
            return None
        path = spec.submodule_search_locations
    origin = getattr(spec, "origin", None)
    return origin if origin and origin.endswith(".py") else None


def _static_constants(filename: str) -> dict:
    """Module-level ``NAME = <literal>`` assignments of a source file (not executed)."""
    with open(filename, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), filename)
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in ("SUMMARY", "HELP", "REQUIRES"):
                try:
                    found[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    continue
    return found


def _findable(name: str) -> bool:
    """Whether the top-level module ``name`` can be found (found, not imported)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def command_summary(ep: importlib.metadata.EntryPoint) -> str:
    """The one-line description of a subcommand for ``plsh --help``.

    Read from the module's source (``SUMMARY``, else the first sentence of ``HELP``), so
    that the overview imports no command (``train-lm`` would import torch); a module whose
    constants are not literals is imported instead. A requirement in ``REQUIRES`` that is
    not installed is named (``"(needs torch: not installed)"``).

    Parameters
    ----------
    ep : importlib.metadata.EntryPoint
        An entry point of :data:`GROUP` (its value is the command's module name).

    Returns
    -------
    str
        One line; never raises for a module that cannot be imported (it says so).

    References
    ----------
    README.md, "Command line" (the table of commands that ``plsh --help`` summarises).
    """
    filename = _module_file(ep.value)
    constants = _static_constants(filename) if filename else {}
    if "SUMMARY" not in constants and "HELP" not in constants:
        try:
            module = importlib.import_module(ep.value)
        except ModuleNotFoundError as exc:
            return f"(needs {(exc.name or str(exc)).split('.')[0]}: not installed)"
        except ImportError as exc:
            return f"(unavailable: {exc})"
        constants = {k: getattr(module, k, None) for k in ("SUMMARY", "HELP", "REQUIRES")}
    text = constants.get("SUMMARY") or str(constants.get("HELP")).split(". ")[0].rstrip(".")
    for name in constants.get("REQUIRES") or ():
        if not _findable(name):
            text = text.removesuffix(f" (needs {name})") + f" (needs {name}: not installed)"
            break
    return text


def _usage() -> str:
    lines = [
        "usage: plsh [COMMAND] [OPTIONS]",
        "",
        f"With no COMMAND, runs `plsh {DEFAULT_COMMAND}`. Commands:",
    ]
    lines += [f"  {name:<13} {command_summary(ep)}" for name, ep in commands().items()]
    lines += ["", "`plsh COMMAND --help` describes a command's options; `plsh --version`."]
    return "\n".join(lines)


class OneLineArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr, exit status 2.

    argparse's own ``error`` prints the whole usage block before the message; every ``plsh``
    command reports bad options in one line instead (``plsh COMMAND --help`` shows the
    usage).

    References
    ----------
    ``argparse.ArgumentParser.error`` (overridden); README.md, "Command line" (a bad option ends in
    one line, exit status 2).
    """

    def error(self, message: str) -> NoReturn:  # noqa: D102 - argparse API
        # "argument --qkv: no such file" -> "--qkv: no such file", as the commands' own
        # errors name their options
        message = re.sub(r"^argument ([^:\s]+): ", r"\1: ", str(message)).replace("\n", " ")
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``plsh`` console script; returns the exit status.

    A reader of the output that goes away early (``plsh --help | head -3``) ends the
    command with status 1 and no traceback (Python's advice for ``BrokenPipeError``).
    Ctrl-C ends it with one line on stderr and status :data:`INTERRUPTED` (130), SIGTERM
    while a command runs with one line and :data:`TERMINATED` (143); either way the
    output folders the run created and left empty are removed.

    References
    ----------
    README.md, "Command line" (exit statuses 2, 130, 143); Python's ``signal`` documentation,
    "Note on SIGPIPE" (``BrokenPipeError``).
    """
    try:
        status = _main(argv)
        sys.stdout.flush()  # a closed pipe raises here rather than at interpreter exit
        return status
    except KeyboardInterrupt:
        if os.environ.get("PLSH_DEBUG"):
            raise
        words = list(sys.argv[1:] if argv is None else argv)
        command = DEFAULT_COMMAND if not words or words[0].startswith("-") else words[0]
        print(f"\nplsh {command}: interrupted", file=sys.stderr)  # e.g. while importing
        return INTERRUPTED
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
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a usage error (one line, status 2) or --help (status 0)
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    missing = _missing_requirement(module)
    if missing is not None:
        print(_needs_message(command, missing), file=sys.stderr)
        return 2
    from .experiments.options import CreatedFolders

    created = CreatedFolders(getattr(args, "out", None) or None)
    status = 2
    # SIGTERM (a CI timeout, ``kill``) ends the command like Ctrl-C: one line, the empty
    # output folders removed (it used to kill the process and leave them); in the main
    # thread only, where Python runs signal handlers
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        status = int(module.run(args) or 0)
        return status
    except KeyboardInterrupt:
        if os.environ.get("PLSH_DEBUG"):
            raise
        print(f"\nplsh {command}: interrupted", file=sys.stderr)
        status = INTERRUPTED
        return status
    except _Terminated:
        print(f"\nplsh {command}: terminated", file=sys.stderr)
        status = TERMINATED
        return status
    except (ValueError, TypeError, ArithmeticError, MemoryError, OSError) as exc:
        # Bad input (an option out of range, an unreadable file, an argument the library
        # refuses): one line and exit status 2, as for argparse errors. PLSH_DEBUG=1 shows
        # the traceback.
        if os.environ.get("PLSH_DEBUG"):
            raise
        text = _option_text(exc, parser, getattr(module, "PARAMETER_OPTIONS", None))
        print(f"plsh {command}: error: {text}", file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if status != 0:
            created.remove_empty()


def _option_text(exc: BaseException, parser: argparse.ArgumentParser, extra) -> str:
    """``exc``'s message on one line, a leading parameter name turned into its option."""
    from .experiments.options import option_message

    names: dict[str, str] = {}
    for action in parser._actions:  # noqa: SLF001 - argparse keeps no public list
        long = [o for o in action.option_strings if o.startswith("--")]
        if long and action.help != argparse.SUPPRESS:
            names.setdefault(action.dest, long[0])
    names.update(extra or {})
    text = str(exc).replace("\n", " ") or type(exc).__name__
    if isinstance(exc, OSError) and exc.filename is not None and not text.startswith("-"):
        text = f"{exc.strerror or text}: {exc.filename!r}"
    return option_message(Exception(text), (), names)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
