"""Fast PLSH attention in torch: a vectorised CPU path and a fused Triton GPU path.

The public entry point is :func:`plsh_attention`; it computes exactly the function of
:func:`plsh_ref.attention.plsh_attention` (count-weighted ALiBi approximation, Wolfson &
Wagner 2026, Theorem 2.2) for the same partition sample, with autograd support.
"""

from typing import Any

from plsh_ref.provenance import package_version as _package_version

#: the installed distribution's version (one number for plsh_ref and plsh_fast, in pyproject)
__version__ = _package_version()

__all__ = ["plsh_attention"]


def __getattr__(name: str) -> Any:
    """``plsh_attention``, imported (with torch) on first use.

    References
    ----------
    PEP 562 (module ``__getattr__``).
    """
    # torch is imported on first use of plsh_attention, not by ``import plsh_fast``: the
    # ``plsh`` command line imports plsh_fast.experiments.train_lm to show ``--help`` and
    # to say that torch is missing, which must work without torch (PEP 562).
    if name == "plsh_attention":
        try:
            import torch  # noqa: F401, PLC0415 (checked first: a missing torch is named)
        except ModuleNotFoundError as error:
            if error.name != "torch":
                raise
            raise ModuleNotFoundError(
                "plsh_fast needs torch, which is not installed: install it first "
                "(README, Install; on a CPU-only machine from the PyTorch CPU wheel index, "
                "pip install torch --index-url https://download.pytorch.org/whl/cpu)",
                name="torch",
            ) from None
        from .api import plsh_attention

        globals()[name] = plsh_attention
        return plsh_attention
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
