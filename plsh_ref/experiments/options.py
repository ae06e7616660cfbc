"""The options every ``plsh`` command spells the same way, and the memory guard.

One vocabulary for all subcommands (``reproduce``, ``spectrum``, ``bounds``, ``verify``,
``train-lm``):

* ``--out DIR``: output folder; default ``plsh_out/<command>-<UTC time>/``
  (:func:`default_out_dir`) for every command that writes files.
* ``--num-samples``: the number(s) of partition samples ``s``.
* ``--sigma``: one or several length scales (space- or comma-separated).
* ``--seed``: the seed, its default shown in ``--help``.
* ``--quiet``: no progress bars and no commentary; results and the output path only.
* ``--max-memory GIB``: ``spectrum``, ``reproduce``, ``train-lm`` and ``verify``, whose
  arrays grow like ``n^2`` or ``s * n``, refuse before allocating a size whose estimated
  memory exceeds this limit, default :data:`DEFAULT_MAX_MEMORY_GIB` = 8 GiB (:func:`check_memory`).

Option values are checked when the command line is parsed, before any computation, by the
argparse ``type`` functions here: :func:`integer` and :func:`number` (ranges, no NaN or
infinity), :func:`output_folder` and :func:`output_file` (the path can be created and
written), :func:`npz_archive` (an existing ``.npz`` file). Their errors name the option
(``--qkv: no such file: 'missing.npz'``). :class:`CreatedFolders` removes the empty
folders a command created when it fails or is interrupted.

Old spellings (``--output`` everywhere; ``--samples``, ``--sigmas`` in ``plsh reproduce``;
``--seeds``, ``--no-progress`` in ``plsh train-lm``) are accepted until version 0.2 and print a deprecation line on stderr
(:class:`StoreValue` and friends with ``replacement=``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
import sys
import tempfile
import zipfile
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_MAX_MEMORY_GIB",
    "MAX_REPETITIONS",
    "MAX_SIGMA",
    "OUT_ROOT",
    "CreatedFolders",
    "JoinedValues",
    "StoreConst",
    "StoreValue",
    "Values",
    "add_max_memory_option",
    "add_out_option",
    "add_quiet_option",
    "check_memory",
    "default_out_dir",
    "deprecation",
    "format_bytes",
    "integer",
    "npz_archive",
    "number",
    "option_message",
    "output_file",
    "output_folder",
]

#: parent folder of the default output folders
OUT_ROOT = Path("plsh_out")

#: default of ``--max-memory`` in GiB (2^30 bytes)
DEFAULT_MAX_MEMORY_GIB = 8.0

#: the release that drops the deprecated spellings
_REMOVED_IN = "0.2"

#: largest length scale ``--sigma`` the commands accept (tokens): far beyond any sequence
#: length whose ``(n, n)`` arrays fit in memory (every entry of ``L*`` is then within 1e-2 of
#: 1); above about 1e154 the closed forms underflow (``(1 - rho)^2``) and return NaN
MAX_SIGMA = 1e6

#: largest number of repetitions or steps a command accepts (``--reps``, ``--cases``...):
#: each one costs a full computation, so more would run for days
MAX_REPETITIONS = 100_000


def _refuse(message: str) -> None:
    raise argparse.ArgumentTypeError(message)


def integer(minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: a decimal integer in ``[minimum, maximum]`` (either optional).

    Parameters
    ----------
    minimum, maximum : int, optional
        Inclusive bounds.

    Returns
    -------
    callable
        ``str -> int``; raises ``argparse.ArgumentTypeError`` (reported by argparse as
        ``--option: must be >= 1, got 0``) for text that is not an integer or out of range.

    References
    ----------
    ``argparse`` ``type=`` callables (``argparse.ArgumentTypeError``); README.md, "Command line"
    (option values checked before any computation).
    """

    def convert(text: str) -> int:
        try:
            value = int(str(text).strip())
        except ValueError:
            _refuse(f"expected an integer, got {text!r}")
        if minimum is not None and value < minimum:
            _refuse(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            _refuse(f"must be <= {maximum}, got {value}")
        return value

    convert.__name__ = "integer"
    return convert


def number(
    minimum: float | None = None,
    maximum: float | None = None,
    *,
    positive: bool = False,
    below: float | None = None,
    unit: str = "",
) -> Callable[[str], float]:
    """An argparse ``type``: a finite float, ``>= minimum``, ``<= maximum``, ``< below``
    and (``positive=True``) ``> 0``; ``unit`` (e.g. ``"GiB"``) follows the bounds in
    messages.

    Returns
    -------
    callable
        ``str -> float``; raises ``argparse.ArgumentTypeError`` for text that is not a
        number, NaN, an infinity, or out of range.

    References
    ----------
    ``argparse`` ``type=`` callables (``argparse.ArgumentTypeError``); README.md, "Command line"
    (option values checked before any computation).
    """

    def convert(text: str) -> float:
        try:
            value = float(str(text).strip())
        except ValueError:
            _refuse(f"expected a number, got {text!r}")
        if not math.isfinite(value):
            _refuse(f"must be a finite number, got {text!r}")
        tail = f" {unit}" if unit else ""
        if positive and not value > 0:
            _refuse(f"must be > 0{tail}, got {value:g}")
        if minimum is not None and value < minimum:
            _refuse(f"must be >= {minimum:g}{tail}, got {value:g}")
        if maximum is not None and value > maximum:
            _refuse(f"must be <= {maximum:g}{tail}, got {value:g}")
        if below is not None and not value < below:
            _refuse(f"must be < {below:g}{tail}, got {value:g}")
        return value

    convert.__name__ = "number"
    return convert


def _nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists (``.`` for a relative path's root)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def _probe(folder: Path) -> str | None:
    """Why nothing can be created in the existing folder ``folder``, or ``None``.

    A real probe (an empty folder made and removed at once): permission bits alone say
    yes to root on read-only mounts and in ``/proc``.
    """
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".plsh-probe-", dir=folder))
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _check_writable_folder(path: Path) -> None:
    """Refuse a folder that neither exists as a writable folder nor can be created."""
    if path.exists():
        if not path.is_dir():
            _refuse(f"{str(path)!r} is a file, expected a folder")
        why = _probe(path)
        if why:
            _refuse(f"folder {str(path)!r} is not writable: {why}")
        return
    parent = _nearest_existing(path)
    if not parent.is_dir():
        _refuse(f"cannot create {str(path)!r}: {str(parent)!r} is a file, not a folder")
    why = _probe(parent)
    if why:
        _refuse(f"cannot create {str(path)!r} in {str(parent)!r}: {why}")


def output_folder(text: str) -> Path:
    """An argparse ``type`` for an output folder (``--out``): checked, not created.

    The folder must be writable if it exists, or creatable (its closest existing ancestor
    a writable folder); nothing is created here, so a command refused later leaves nothing
    behind.

    Raises
    ------
    argparse.ArgumentTypeError
        Empty text, an existing file, or a folder that cannot be written or created.

    References
    ----------
    README.md, "Command line" (``--out DIR``; output paths checked before any computation);
    ``argparse`` ``type=`` callables.
    """
    if not str(text).strip():
        _refuse("expected a folder, got an empty path")
    path = Path(text)
    _check_writable_folder(path)
    return path


def output_file(text: str) -> str:
    """An argparse ``type`` for an output file (``--json PATH``): checked, not created.

    Returns the text unchanged (a path as typed).

    Raises
    ------
    argparse.ArgumentTypeError
        Empty text, an existing folder, an existing file that is not writable, or a
        parent folder that cannot be written or created.

    References
    ----------
    README.md, "Command line" (``plsh verify --json PATH``; output paths checked before any
    computation); ``argparse`` ``type=`` callables.
    """
    if not str(text).strip():
        _refuse("expected a file path, got an empty path")
    path = Path(text)
    if path.is_dir():
        _refuse(f"{text!r} is a folder, expected a file path")
    if path.exists():
        try:
            with open(path, "a"):
                pass
        except OSError as exc:
            _refuse(f"file {text!r} is not writable: {exc.strerror or exc}")
    _check_writable_folder(path.parent)
    return text


def npz_archive(text: str) -> Path:
    """An argparse ``type`` for an input ``.npz`` file (``--qkv``): exists, readable, a zip.

    Only the container is checked here; the arrays it must hold are checked by the command
    that reads it (:func:`plsh_ref.data.load_qkv`).

    Raises
    ------
    argparse.ArgumentTypeError
        Empty text, no such file, a folder, an unreadable file, or a file that is not a
        numpy ``.npz`` archive (a zip file, as written by ``numpy.savez``).

    References
    ----------
    ``numpy.savez`` (an ``.npz`` file is a zip archive); the file format of :mod:`plsh_ref.data`;
    ``docs/experiments.md`` (``--qkv FILE``).
    """
    if not str(text).strip():
        _refuse("expected an .npz file, got an empty path")
    path = Path(text)
    if not path.exists():
        _refuse(f"no such file: {text!r}")
    if path.is_dir():
        _refuse(f"{text!r} is a folder, expected an .npz file")
    if not os.access(path, os.R_OK):
        _refuse(f"file {text!r} is not readable")
    try:
        is_zip = zipfile.is_zipfile(path)
    except OSError as exc:
        _refuse(f"cannot read {text!r}: {exc.strerror or exc}")
    if not is_zip:
        _refuse(f"{text!r} is not an .npz archive (write one with numpy.savez)")
    return path


class CreatedFolders:
    """The folders a command creates under its output path, to remove them if it fails.

    Construct before the command runs (it records which of ``path``, its ancestors and,
    for the default output folder, the children of :data:`OUT_ROOT` exist);
    :meth:`remove_empty` afterwards deletes those created since that are empty, so an
    interrupted or refused run leaves no empty output folder. Never raises.

    Parameters
    ----------
    path : path-like or None
        The ``--out`` folder; ``None``: the default ``plsh_out/<command>-<time>``.

    References
    ----------
    README.md, "Command line" (no failed or interrupted command leaves an empty output folder).
    """

    def __init__(self, path: str | os.PathLike | None) -> None:
        self.root = Path(path) if path else OUT_ROOT
        chain = (self.root, *self.root.parents)
        self.missing = [p for p in chain if str(p) not in ("", ".") and not p.exists()]
        self.children = None
        if path is None and self.root.is_dir():
            self.children = {p.name for p in self.root.iterdir()}

    def remove_empty(self) -> list[Path]:
        """Remove the empty folders created since construction; returns the removed ones."""
        removed = []
        candidates = []
        if self.children is not None and self.root.is_dir():
            candidates += [p for p in self.root.iterdir() if p.name not in self.children]
        candidates += self.missing  # deepest first
        for folder in candidates:
            try:
                for sub in sorted(folder.rglob("*"), key=lambda p: -len(p.parts)):
                    if sub.is_dir() and not any(sub.iterdir()):
                        sub.rmdir()
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
                    removed.append(folder)
            except OSError:
                continue
        return removed


def default_out_dir(command: str, now: _dt.datetime | None = None) -> Path:
    """``plsh_out/<command>-<UTC time as YYYYmmdd-HHMMSS>``, the default ``--out``.

    Parameters
    ----------
    command : str
        The subcommand name, e.g. ``"reproduce"`` or ``"train-lm"``.
    now : datetime, optional
        Time stamp (default: now, UTC).

    References
    ----------
    README.md, "Command line" (``--out DIR``, default ``plsh_out/<command>-<UTC time>/``).
    """
    stamp = now or _dt.datetime.now(_dt.timezone.utc)
    return OUT_ROOT / f"{command}-{stamp:%Y%m%d-%H%M%S}"


def deprecation(old: str, new: str) -> None:
    """Print the one-line deprecation notice for the option spelling ``old`` to stderr.

    References
    ----------
    README.md, "Command line" (old spellings work until 0.2, with a deprecation line on stderr).
    """
    print(
        f"plsh: warning: {old} is deprecated and will be removed in {_REMOVED_IN}; use {new}",
        file=sys.stderr,
    )


class _Deprecatable(argparse.Action):
    """An action that, given ``replacement=``, announces its flag as deprecated when used."""

    def __init__(self, *args, replacement: str | None = None, **kwargs):
        self.replacement = replacement
        super().__init__(*args, **kwargs)

    def _announce(self, option_string):
        if self.replacement is not None:
            deprecation(option_string, self.replacement)

    def _record_spelling(self, namespace, option_string) -> None:
        """Refuse a second spelling of the same option (``--sigma 4 --sigmas 8``): which
        one wins would depend on their order. The same spelling twice keeps argparse's
        rule (the last one counts)."""
        spelled = getattr(namespace, "_spelled", {})
        other = spelled.get(self.dest)
        if other is not None and option_string is not None and other != option_string:
            raise argparse.ArgumentError(self, f"given together with {other}; give one of them")
        if option_string is not None:
            spelled[self.dest] = option_string
        namespace._spelled = spelled


class StoreValue(_Deprecatable):
    """Like ``action="store"``; with ``replacement="--new"`` the flag is a deprecated alias.

    Giving both spellings (``--out A --output B``) is a usage error: which one wins would
    depend on their order.

    References
    ----------
    ``argparse.Action`` (``action="store"``); README.md, "Command line" (old spellings until 0.2).
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        self._announce(option_string)
        self._record_spelling(namespace, option_string)
        setattr(namespace, self.dest, values)


class StoreConst(_Deprecatable):
    """A flag storing ``const`` (``store_true``/``store_false`` style), deprecatable.

    References
    ----------
    ``argparse.Action`` (``action="store_const"``); README.md, "Command line" (old spellings until
    0.2).
    """

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        const: Any,
        default: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(option_strings, dest, nargs=0, const=const, default=default, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        self._announce(option_string)
        setattr(namespace, self.dest, self.const)


class Values(_Deprecatable):
    """One or several values, space- or comma-separated (``--sigma 4 16`` = ``--sigma 4,16``).

    ``element`` converts one value (default ``float``; non-finite floats are refused);
    ``minimum``, ``maximum`` (inclusive) and ``positive=True`` (``> 0``) are checked per value;
    ``unique_sorted=True`` stores the sorted distinct values. Bad values are an argparse
    usage error naming the option (exit status 2).

    References
    ----------
    ``argparse.Action`` with ``nargs="+"``; README.md, "Command line" (``--sigma``: one or several
    values, space- or comma-separated).
    """

    def __init__(
        self,
        *args: Any,
        element: Callable[[str], Any] = float,
        minimum: float | None = None,
        maximum: float | None = None,
        positive: bool = False,
        unique_sorted: bool = False,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("nargs", "+")
        self.element = element
        self.minimum = minimum
        self.maximum = maximum
        self.positive = positive
        self.unique_sorted = unique_sorted
        super().__init__(*args, **kwargs)

    def convert(self, tokens: Sequence[str]) -> list:
        """The list of converted values of ``tokens`` (each may hold commas)."""
        kind = "integers" if self.element is int else "numbers"
        items = [x for tok in tokens for x in str(tok).split(",")]
        if any(not x.strip() for x in items):
            raise argparse.ArgumentError(
                self, f"empty value between commas in {' '.join(map(str, tokens))!r}"
            )
        try:
            values = [self.element(x) for x in items]
        except ValueError:
            raise argparse.ArgumentError(
                self, f"expected {kind}, got {' '.join(map(str, tokens))!r}"
            ) from None
        if not values:
            raise argparse.ArgumentError(self, "expected at least one value")
        for v in values:
            if isinstance(v, float) and not math.isfinite(v):
                raise argparse.ArgumentError(self, f"expected finite {kind}, got {v}")
            if self.positive and not v > 0:
                raise argparse.ArgumentError(self, f"expected {kind} > 0, got {v}")
            if self.minimum is not None and v < self.minimum:
                raise argparse.ArgumentError(self, f"expected {kind} >= {self.minimum}, got {v}")
            if self.maximum is not None and v > self.maximum:
                raise argparse.ArgumentError(
                    self, f"expected {kind} <= {self.maximum:g}, got {v:g}"
                )
        return sorted(set(values)) if self.unique_sorted else values

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        self._announce(option_string)
        self._record_spelling(namespace, option_string)
        setattr(namespace, self.dest, self.convert(values))


class JoinedValues(Values):
    """:class:`Values` stored as one comma-separated string (for string-typed options).

    References
    ----------
    ``argparse.Action``; README.md, "Command line" (values space- or comma-separated).
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        self._announce(option_string)
        self._record_spelling(namespace, option_string)
        setattr(namespace, self.dest, ",".join(map(str, self.convert(values))))


def add_out_option(
    parser: argparse.ArgumentParser, command: str, *, optional: bool = False
) -> None:
    """``--out DIR`` (dest ``out``, a :class:`~pathlib.Path` or ``None``) and ``--output``.

    ``optional=True``: the command writes nothing unless ``--out`` is given.

    References
    ----------
    README.md, "Command line" (``--out DIR``; ``--output`` deprecated until 0.2).
    """
    text = (
        "also write results.json into this folder (default: print only)"
        if optional
        else f"output folder (default: plsh_out/{command}-<UTC time>)"
    )
    parser.add_argument(
        "--out",
        dest="out",
        type=output_folder,
        default=None,
        action=StoreValue,
        metavar="DIR",
        help=text,
    )
    parser.add_argument(
        "--output",
        dest="out",
        type=output_folder,
        action=StoreValue,
        replacement="--out",
        help=argparse.SUPPRESS,
    )


def add_quiet_option(parser: argparse.ArgumentParser) -> None:
    """``--quiet`` (dest ``quiet``): no progress bars and no commentary.

    References
    ----------
    README.md, "Command line" (``--quiet``: no progress bars or commentary).
    """
    parser.add_argument(
        "--quiet",
        dest="quiet",
        action=StoreConst,
        const=True,
        default=False,
        help="no progress bars and no commentary: results and the output path only",
    )


def add_max_memory_option(parser: argparse.ArgumentParser) -> None:
    """``--max-memory GIB`` (dest ``max_memory``, float, default :data:`DEFAULT_MAX_MEMORY_GIB`).

    References
    ----------
    README.md, "Command line" (``--max-memory``, default 8 GiB).
    """
    parser.add_argument(
        "--max-memory",
        dest="max_memory",
        type=number(positive=True, unit="GiB"),
        default=DEFAULT_MAX_MEMORY_GIB,
        metavar="GIB",
        help="refuse, before allocating, sizes whose estimated memory exceeds this many GiB "
        f"(default: {DEFAULT_MAX_MEMORY_GIB:g})",
    )


def format_bytes(nbytes: float) -> str:
    """``nbytes`` as a short human-readable string in binary units (``"12.5 GiB"``).

    References
    ----------
    IEC 80000-13 binary prefixes (``KiB = 2**10`` bytes, ...), as in the ``--max-memory`` messages
    (README.md, "Command line").
    """
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{int(nbytes)} B"


def check_memory(option: str, value: object, needed_bytes: float, max_memory_gib: float) -> None:
    """Refuse a size whose estimated memory ``needed_bytes`` exceeds ``max_memory_gib``.

    Raises
    ------
    ValueError
        ``"--max-memory: ..."`` if the limit is not a finite number > 0; else, when the
        estimate is over the limit, a message starting with ``option`` that names the
        memory the size would need and the limit.

    References
    ----------
    README.md, "Command line" (sizes over ``--max-memory`` refused before allocating, naming the
    option and the memory needed).
    """
    if not (isinstance(max_memory_gib, (int, float)) and math.isfinite(max_memory_gib)):
        raise ValueError(f"--max-memory: must be a finite number of GiB, got {max_memory_gib!r}")
    if max_memory_gib <= 0:
        raise ValueError(f"--max-memory: must be > 0 GiB, got {max_memory_gib!r}")
    if needed_bytes > max_memory_gib * 2**30:
        raise ValueError(
            f"{option}: {value} would need about {format_bytes(needed_bytes)} of memory, "
            f"more than --max-memory {max_memory_gib:g} GiB; choose a smaller {option} "
            "or raise --max-memory"
        )


def option_message(
    exc: Exception, names: Collection[str], options: Mapping[str, str] | None = None
) -> str:
    """The message of ``exc`` with a leading library parameter name turned into its option.

    Library functions name their parameter (``"num_samples: must be >= 1"``); a command
    that passes an option straight through reports the option (``"--num-samples: must be
    >= 1"``) when that name is in ``names`` (parameter names equal to the option's
    destination) or in ``options``, an optional mapping from parameter name to option for
    names spelled otherwise (``{"root": "--corpus"}``). Other messages are returned
    unchanged.

    References
    ----------
    CONTRIBUTING.md, "Conventions" (messages start with the argument name); README.md,
    "Command line" (a bad option value ends in one line naming the option).
    """
    text = str(exc)
    name, colon, rest = text.partition(":")
    if colon and options is not None and name in options:
        return f"{options[name]}:{rest}"
    if colon and name in names:
        return f"--{name.replace('_', '-')}:{rest}"
    return text
