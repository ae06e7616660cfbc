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

Old spellings (``--output``, ``--samples``, ``--sigmas``, ``--seeds``, ``--no-progress``)
are accepted until version 0.2 and print a deprecation line on stderr
(:class:`StoreValue` and friends with ``replacement=``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import sys
from pathlib import Path

__all__ = [
    "DEFAULT_MAX_MEMORY_GIB",
    "OUT_ROOT",
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
    "option_message",
]

#: parent folder of the default output folders
OUT_ROOT = Path("plsh_out")

#: default of ``--max-memory`` in GiB (2^30 bytes)
DEFAULT_MAX_MEMORY_GIB = 8.0

#: the release that drops the deprecated spellings
_REMOVED_IN = "0.2"


def default_out_dir(command: str, now: _dt.datetime | None = None) -> Path:
    """``plsh_out/<command>-<UTC time as YYYYmmdd-HHMMSS>``, the default ``--out``.

    Parameters
    ----------
    command : str
        The subcommand name, e.g. ``"reproduce"`` or ``"train-lm"``.
    now : datetime, optional
        Time stamp (default: now, UTC).
    """
    stamp = now or _dt.datetime.now(_dt.timezone.utc)
    return OUT_ROOT / f"{command}-{stamp:%Y%m%d-%H%M%S}"


def deprecation(old: str, new: str) -> None:
    """Print the one-line deprecation notice for the option spelling ``old`` to stderr."""
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


class StoreValue(_Deprecatable):
    """Like ``action="store"``; with ``replacement="--new"`` the flag is a deprecated alias.

    Giving both spellings (``--out A --output B``) is a usage error: which one wins would
    depend on their order.
    """

    def __call__(self, parser, namespace, values, option_string=None):
        self._announce(option_string)
        spelled = getattr(namespace, "_spelled", {})
        other = spelled.get(self.dest)
        if other is not None and other != option_string:
            raise argparse.ArgumentError(self, f"given together with {other}; give one of them")
        spelled[self.dest] = option_string
        namespace._spelled = spelled
        setattr(namespace, self.dest, values)


class StoreConst(_Deprecatable):
    """A flag storing ``const`` (``store_true``/``store_false`` style), deprecatable."""

    def __init__(self, option_strings, dest, const, default=None, **kwargs):
        super().__init__(option_strings, dest, nargs=0, const=const, default=default, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        self._announce(option_string)
        setattr(namespace, self.dest, self.const)


class Values(_Deprecatable):
    """One or several values, space- or comma-separated (``--sigma 4 16`` = ``--sigma 4,16``).

    ``element`` converts one value (default ``float``; non-finite floats are refused);
    ``minimum`` (inclusive) and ``positive=True`` (``> 0``) are checked per value;
    ``unique_sorted=True`` stores the sorted distinct values. Bad values are an argparse
    usage error naming the option (exit status 2).
    """

    def __init__(
        self,
        *args,
        element=float,
        minimum=None,
        positive: bool = False,
        unique_sorted: bool = False,
        **kwargs,
    ):
        kwargs.setdefault("nargs", "+")
        self.element = element
        self.minimum = minimum
        self.positive = positive
        self.unique_sorted = unique_sorted
        super().__init__(*args, **kwargs)

    def convert(self, tokens) -> list:
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
        return sorted(set(values)) if self.unique_sorted else values

    def __call__(self, parser, namespace, values, option_string=None):
        self._announce(option_string)
        setattr(namespace, self.dest, self.convert(values))


class JoinedValues(Values):
    """:class:`Values` stored as one comma-separated string (for string-typed options)."""

    def __call__(self, parser, namespace, values, option_string=None):
        self._announce(option_string)
        setattr(namespace, self.dest, ",".join(map(str, self.convert(values))))


def add_out_option(parser: argparse.ArgumentParser, command: str, *, optional: bool = False):
    """``--out DIR`` (dest ``out``, a :class:`~pathlib.Path` or ``None``) and ``--output``.

    ``optional=True``: the command writes nothing unless ``--out`` is given.
    """
    text = (
        "also write results.json into this folder (default: print only)"
        if optional
        else f"output folder (default: plsh_out/{command}-<UTC time>)"
    )
    parser.add_argument("--out", dest="out", type=Path, default=None, action=StoreValue, help=text)
    parser.add_argument(
        "--output",
        dest="out",
        type=Path,
        action=StoreValue,
        replacement="--out",
        help=argparse.SUPPRESS,
    )


def add_quiet_option(parser: argparse.ArgumentParser) -> None:
    """``--quiet`` (dest ``quiet``): no progress bars and no commentary."""
    parser.add_argument(
        "--quiet",
        dest="quiet",
        action=StoreConst,
        const=True,
        default=False,
        help="no progress bars and no commentary: results and the output path only",
    )


def add_max_memory_option(parser: argparse.ArgumentParser) -> None:
    """``--max-memory GIB`` (dest ``max_memory``, float, default :data:`DEFAULT_MAX_MEMORY_GIB`)."""
    parser.add_argument(
        "--max-memory",
        dest="max_memory",
        type=float,
        default=DEFAULT_MAX_MEMORY_GIB,
        metavar="GIB",
        help="refuse, before allocating, sizes whose estimated memory exceeds this many GiB "
        f"(default: {DEFAULT_MAX_MEMORY_GIB:g})",
    )


def format_bytes(nbytes: float) -> str:
    """``nbytes`` as a short human-readable string in binary units (``"12.5 GiB"``)."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{int(nbytes)} B"


def check_memory(option: str, value, needed_bytes: float, max_memory_gib: float) -> None:
    """Refuse a size whose estimated memory ``needed_bytes`` exceeds ``max_memory_gib``.

    Raises
    ------
    ValueError
        ``"--max-memory: ..."`` if the limit is not a finite number > 0; else, when the
        estimate is over the limit, a message starting with ``option`` that names the
        memory the size would need and the limit.
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


def option_message(exc: Exception, names, options=None) -> str:
    """The message of ``exc`` with a leading library parameter name turned into its option.

    Library functions name their parameter (``"num_samples: must be >= 1"``); a command
    that passes an option straight through reports the option (``"--num-samples: must be
    >= 1"``) when that name is in ``names`` (parameter names equal to the option's
    destination) or in ``options``, an optional mapping from parameter name to option for
    names spelled otherwise (``{"root": "--corpus"}``). Other messages are returned
    unchanged.
    """
    text = str(exc)
    name, colon, rest = text.partition(":")
    if colon and options is not None and name in options:
        return f"{options[name]}:{rest}"
    if colon and name in names:
        return f"--{name.replace('_', '-')}:{rest}"
    return text
