"""plsh_ref: exact, high-precision reference for ALiBi and positional-LSH attention.

Wolfson & Wagner, *Positional LSH: Binary Block Matrix Approximation for Attention with
Linear Biases* (arXiv 2605.09472, 2026). Depends on numpy, scipy and mpmath only.

``import plsh_ref`` loads the numpy-only modules (:mod:`.alibi`, :mod:`.attention`,
:mod:`.partition`); the modules that need scipy or mpmath (:mod:`.bounds`,
:mod:`.expectation`, :mod:`.toeplitz`, :mod:`.mp_attention`) and every other submodule load
on first access (``plsh_ref.bounds``), PEP 562.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import alibi, attention, partition
from .alibi import alibi_bias, alibi_slopes, default_positions, kernel_matrix, sigma_from_slopes
from .attention import (
    alibi_attention,
    biased_attention,
    fixed_block_attention,
    no_bias_attention,
    plsh_attention,
)
from .partition import PartitionSample, bins, counts, draw_partition, empirical_mean, masks
from .provenance import package_version as _package_version

#: the installed distribution's version (written once, in pyproject.toml)
__version__ = _package_version()

#: submodules loaded on first attribute access (scipy/mpmath and the rest)
_LAZY_SUBMODULES = frozenset(
    {
        "bounds",
        "cli",
        "data",
        "expectation",
        "experiments",
        "kernels",
        "mp_attention",
        "provenance",
        "testing",
        "toeplitz",
        "validation",
    }
)

__all__ = [
    "PartitionSample",
    "alibi",
    "attention",
    "bounds",
    "expectation",
    "kernels",
    "partition",
    "toeplitz",
    "alibi_attention",
    "alibi_bias",
    "alibi_slopes",
    "biased_attention",
    "bins",
    "counts",
    "default_positions",
    "draw_partition",
    "empirical_mean",
    "fixed_block_attention",
    "kernel_matrix",
    "masks",
    "no_bias_attention",
    "plsh_attention",
    "sigma_from_slopes",
]


def __getattr__(name: str) -> Any:
    """A lazy submodule (``_LAZY_SUBMODULES``), imported on first access.

    References
    ----------
    PEP 562 (module ``__getattr__``); the package docstring names the lazy submodules.
    """
    if name in _LAZY_SUBMODULES:
        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names and its lazy submodules, sorted.

    References
    ----------
    PEP 562 (module ``__dir__``).
    """
    return sorted(set(globals()) | _LAZY_SUBMODULES)
