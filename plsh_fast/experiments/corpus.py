"""Byte-level text corpus from files on disk (default: the CPython standard library).

The running interpreter's standard library (``sysconfig.get_paths()["stdlib"]``) is
human-written Python available offline on every machine with Python. Files are split into
train and validation *by file*, deterministically: a file goes to validation iff the first
8 bytes of ``sha256(relative path)`` read as a big-endian integer, modulo 10000, are below
``10000 * val_fraction``. The split does not depend on the file order, the machine or the
other files present. Directories named ``test``, ``tests``, ``idle_test``,
``site-packages``, ``dist-packages`` and ``__pycache__`` are skipped (test suites hold long
generated literals and binary fixtures).
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass

import numpy as np

from plsh_ref.validation import check_int, check_probability

__all__ = ["EXCLUDED_DIRS", "Corpus", "default_root", "is_validation", "list_files", "load_corpus"]

#: directory names never descended into
EXCLUDED_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
)


def default_root() -> str:
    """The running interpreter's standard-library directory.

    References
    ----------
    ``sysconfig.get_paths()["stdlib"]``; ``README.md``, "Command line" (``plsh train-lm`` on the
    CPython stdlib sources).
    """
    return sysconfig.get_paths()["stdlib"]


def is_validation(relative_path: str, val_fraction: float) -> bool:
    """Whether ``relative_path`` (POSIX separators) belongs to the validation split.

    References
    ----------
    ``docs/experiments.md``, "Training" (``plsh train-lm``); ``hashlib.sha256``.
    """
    digest = hashlib.sha256(relative_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % 10000 < round(10000 * val_fraction)


def list_files(root: str, suffix: str = ".py") -> list[str]:
    """Relative POSIX paths of the files under ``root`` ending in ``suffix``, sorted.

    Raises
    ------
    ValueError
        If ``root`` is not a directory.

    References
    ----------
    ``docs/experiments.md``, "Training" (``plsh train-lm``); ``os.walk``.
    """
    if not os.path.isdir(root):
        raise ValueError(f"root: not a directory: {root!r}")
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
        for name in filenames:
            if name.endswith(suffix):
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                found.append(rel.replace(os.sep, "/"))
    return sorted(found)


@dataclass(frozen=True)
class Corpus:
    """Train and validation byte streams (uint8 numpy arrays) and their file lists.

    References
    ----------
    ``docs/experiments.md``, "Training" (``plsh train-lm``).
    """

    root: str
    train: np.ndarray
    val: np.ndarray
    train_files: tuple[str, ...]
    val_files: tuple[str, ...]

    def summary(self) -> dict:
        """Sizes and provenance, for reports."""
        return {
            "root": self.root,
            "train_files": len(self.train_files),
            "val_files": len(self.val_files),
            "train_bytes": int(self.train.size),
            "val_bytes": int(self.val.size),
        }


def load_corpus(
    root: str | None = None,
    *,
    val_fraction: float = 0.05,
    max_bytes: int | None = None,
    suffix: str = ".py",
) -> Corpus:
    """Read the files under ``root`` and split them into train/validation streams by file.

    Parameters
    ----------
    root : str, optional
        Directory to read; default :func:`default_root` (the standard library).
    val_fraction : float
        Target fraction of files in validation, in (0, 1) (see :func:`is_validation`).
    max_bytes : int, optional
        Stop adding files to a split once it holds this many bytes (files in sorted
        path order), for quick runs.
    suffix : str
        File name ending to include.

    Returns
    -------
    Corpus
        Each split is the concatenation of its files (sorted by path), each followed by a
        newline byte.

    Raises
    ------
    ValueError
        If ``root`` is not a directory, a split ends up empty, or the arguments are out
        of range.

    References
    ----------
    ``docs/experiments.md``, "Training"; ``README.md``, "Command line"
    (``plsh train-lm`` on the CPython stdlib sources).
    """
    root = default_root() if root is None else root
    val_fraction = check_probability("val_fraction", val_fraction)
    if max_bytes is not None:
        max_bytes = check_int("max_bytes", max_bytes, minimum=1)
    parts: dict[str, list[bytes]] = {"train": [], "val": []}
    names: dict[str, list[str]] = {"train": [], "val": []}
    sizes = {"train": 0, "val": 0}
    for rel in list_files(root, suffix):
        split = "val" if is_validation(rel, val_fraction) else "train"
        if max_bytes is not None and sizes[split] >= max_bytes:
            continue
        with open(os.path.join(root, rel), "rb") as fh:
            data = fh.read() + b"\n"
        parts[split].append(data)
        names[split].append(rel)
        sizes[split] += len(data)
    for split in ("train", "val"):
        if not parts[split]:
            raise ValueError(f"root: no {split} files with suffix {suffix!r} under {root!r}")
    streams = {k: np.frombuffer(b"".join(v), dtype=np.uint8) for k, v in parts.items()}
    return Corpus(
        root, streams["train"], streams["val"], tuple(names["train"]), tuple(names["val"])
    )
