"""Argument checks shared by :mod:`plsh_ref` and :mod:`plsh_fast` (public).

Every check raises :class:`ValueError` or :class:`TypeError` whose message starts with
the name of the offending argument, so that bad input never reaches the mathematics.
Users writing their own kernels against :mod:`plsh_ref.testing` may call them to refuse
bad input the same way. Each check is defined here only (``plsh_fast._validation`` adds
the torch-side checks and reuses these for scalars and host arrays).

A leaf: it imports no other plsh_ref module, so every module may import it
(``tests/project/test_import_cycles.py``). The checks that need the mathematics live with
it: :func:`plsh_ref.alibi.check_slopes` (default slopes) and
:func:`plsh_ref.partition.check_partition`. :func:`warn_deprecated` is the one helper
through which every deprecated spelling of plsh_ref and plsh_fast warns.

Source: CONTRIBUTING.md (conventions: argument names in messages); SPEC section 2 for the
position range.
"""

from __future__ import annotations

import importlib
import math
import numbers
import warnings
from typing import Any

import numpy as np

__all__ = [
    "as_float_array",
    "as_positions",
    "check_bool",
    "MAX_DPS",
    "MAX_NUM_SAMPLES",
    "PLSHDeprecationWarning",
    "check_dps",
    "check_num_samples",
    "check_int",
    "check_positive_float",
    "check_probability",
    "check_scale",
    "check_sigma",
    "keyword_argument",
    "partition_argument",
    "select_return",
    "warn_deprecated",
]


def check_int(
    name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """Return ``value`` as a Python ``int`` or raise.

    Raises
    ------
    TypeError
        If ``value`` is not an integer (``bool`` and floats are refused).
    ValueError
        If ``value < minimum`` or ``value > maximum``.

    References
    ----------
    CONTRIBUTING.md, "Conventions" (argument errors name the argument).
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name}: must be <= {maximum}, got {value}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """Return ``value`` as a ``bool`` or raise ``TypeError`` (only ``bool``/``numpy.bool_``).

    Flags such as ``causal`` are never coerced from strings, numbers or ``None``: a typo like
    ``causal="no"`` would otherwise silently mean ``True``.

    References
    ----------
    CONTRIBUTING.md, "Conventions" (argument errors name the argument).
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def check_positive_float(name: str, value: Any, *, allow_zero: bool = False) -> float:
    """Return ``value`` as a finite positive ``float`` or raise ``TypeError``/``ValueError``.

    ``allow_zero=True`` also accepts ``0`` (a finite, non-negative value).

    References
    ----------
    CONTRIBUTING.md, "Conventions" (argument errors name the argument).
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    if allow_zero:
        if not 0 <= value < math.inf:  # comparisons only: NaN fails, traceable symbolically
            raise ValueError(f"{name}: must be finite and >= 0, got {value}")
    elif not 0 < value < math.inf:
        raise ValueError(f"{name}: must be finite and > 0, got {value}")
    return value


def check_probability(name: str, value: Any) -> float:
    """Return ``value`` as a float in the open interval (0, 1) or raise.

    References
    ----------
    CONTRIBUTING.md, "Conventions" (argument errors name the argument).
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not (0.0 < value < 1.0):
        raise ValueError(f"{name}: must lie in the open interval (0, 1), got {value}")
    return value


def _tensor_to_numpy(name: str, tensor) -> np.ndarray:
    """A torch tensor's values as numpy (without importing torch); meta tensors are refused."""
    if getattr(getattr(tensor, "device", None), "type", None) == "meta":
        raise ValueError(f"{name}: is a meta tensor (it holds no values)")
    tensor = tensor.detach().cpu()
    if getattr(tensor, "is_floating_point", lambda: False)() and tensor.dtype.itemsize < 4:
        tensor = tensor.float()  # numpy has no bfloat16
    return tensor.numpy()


def as_float_array(
    name: str, value: Any, *, ndim: int | tuple[int, ...] | None = None, finite: bool = True
) -> np.ndarray:
    """Convert ``value`` to a float64 numpy array and check its rank and finiteness.

    Parameters
    ----------
    name : str
        Argument name used in error messages.
    value : array_like
        Real numbers (integers, floats). Complex, boolean, object and string arrays are refused.
    ndim : int or tuple of int, optional
        Accepted number(s) of dimensions.
    finite : bool
        If true, NaN and infinities are refused.

    Raises
    ------
    TypeError
        If ``value`` is not a real numeric array.
    ValueError
        On a wrong number of dimensions or a non-finite entry.

    References
    ----------
    CONTRIBUTING.md, "Conventions" (argument errors name the argument); SPEC section 5 (float64 on
    the reference).
    """
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch.Tensor without importing torch
        value = _tensor_to_numpy(name, value).astype(np.float64)
    arr = np.asarray(value)
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        raise TypeError(f"{name}: must be a real numeric array, got dtype {arr.dtype}")
    arr = arr.astype(np.float64, copy=False)
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if arr.ndim not in allowed:
            raise ValueError(
                f"{name}: must have {' or '.join(map(str, allowed))} dimensions, "
                f"got shape {arr.shape}"
            )
    if finite and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: contains NaN or infinite values")
    return arr


def check_sigma(name: str, value: Any) -> np.ndarray:
    """Return ``value`` as a float64 array of length scales (tokens), each finite and > 0.

    Accepts a scalar (returned with shape ``()``) or an array of any shape.

    References
    ----------
    SPEC section 1 (``sigma = 1 / m``, float64); CONTRIBUTING.md, "Conventions" (argument errors
    name the argument).
    """
    arr = as_float_array(name, value)
    if np.any(arr <= 0):
        raise ValueError(f"{name}: every entry must be > 0, got min {float(arr.min())!r}")
    return arr


def as_positions(name: str, value: Any, *, length: int | None = None) -> np.ndarray:
    """Return integer token positions as a 1-D int64 array or raise.

    Float arrays are accepted only when every entry is integral (e.g. ``3.0``); the
    magnitude must stay below ``2**53`` so that ``float64(p)`` is exact (SPEC section 2).

    Raises
    ------
    TypeError
        If ``value`` holds non-numeric data or non-integral floats.
    ValueError
        On a wrong rank or length, NaN/inf, or ``|p| >= 2**53``.
    """
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = _tensor_to_numpy(name, value)
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise ValueError(f"{name}: must be one-dimensional, got shape {arr.shape}")
    if length is not None and arr.shape[0] != length:
        raise ValueError(f"{name}: must have length {length}, got {arr.shape[0]}")
    if arr.dtype == np.bool_:
        raise TypeError(f"{name}: must hold integers, got dtype bool")
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name}: contains NaN or infinite values")
        if np.any(arr != np.floor(arr)):
            raise TypeError(f"{name}: positions must be integers, got non-integral values")
    elif not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name}: must hold integers, got dtype {arr.dtype}")
    if arr.size and np.max(np.abs(arr.astype(np.float64))) >= 2.0**53:
        raise ValueError(f"{name}: |position| must be < 2**53 so that float64 is exact")
    return arr.astype(np.int64)


#: largest mpmath working precision accepted (decimal digits); mpmath's cost grows faster
#: than linearly in ``dps`` and 10^4 digits is far beyond any use in this package
MAX_DPS = 10_000

#: largest number of partition samples ``s`` :func:`plsh_ref.partition.draw_partition`
#: draws; the attention paths hold ``(num_heads, s, n)`` bins, so larger ``s`` exhausts
#: memory long before it helps (the paper uses s = 10, 20)
MAX_NUM_SAMPLES = 500_000


def check_num_samples(num_samples: Any, name: str = "num_samples") -> int:
    """Return the number of partition samples as an ``int`` in ``[1, MAX_NUM_SAMPLES]``.

    Raises
    ------
    TypeError
        If it is not an integer.
    ValueError
        If it is ``< 1`` or ``> MAX_NUM_SAMPLES`` (500 000).

    References
    ----------
    SPEC section 2 (``s`` samples per head); CONTRIBUTING.md, "Conventions" (argument errors name
    the argument).
    """
    return check_int(name, num_samples, minimum=1, maximum=MAX_NUM_SAMPLES)


def check_dps(dps: Any) -> int:
    """Return the mpmath working precision ``dps`` (decimal digits) or raise.

    Raises
    ------
    TypeError
        If ``dps`` is not an integer.
    ValueError
        If ``dps < 15`` (below binary64 there is nothing to check) or
        ``dps > MAX_DPS`` (10 000).

    References
    ----------
    mpmath's ``mp.dps`` (decimal digits); CONTRIBUTING.md, "Conventions" (argument errors name the
    argument).
    """
    return check_int("dps", dps, minimum=15, maximum=MAX_DPS)


def check_scale(scale: Any, head_dim: int) -> float:
    """The logit scale: ``1 / sqrt(head_dim)`` for ``None``, else ``scale`` checked.

    The single definition of the default scale (that of
    ``torch.nn.functional.scaled_dot_product_attention``), used by the reference, the fast
    path, the ``nn`` modules and :mod:`plsh_fast.peers`. ``head_dim = 0`` gives 1.0 (a
    reference problem without features; the fast path refuses ``head_dim < 1`` first).

    Returns
    -------
    float
        Binary64 ``1.0 / sqrt(head_dim)`` (correctly rounded square root, then one
        division), or ``float(scale)``.

    Raises
    ------
    TypeError
        If ``scale`` is not a real number.
    ValueError
        If ``scale`` is not finite and > 0.

    References
    ----------
    SPEC section 1 (scale ``c``, default ``1/sqrt(head_dim)``);
    ``torch.nn.functional.scaled_dot_product_attention`` (its default scale).
    """
    if scale is None:
        return 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0
    return check_positive_float("scale", scale)


class PLSHDeprecationWarning(DeprecationWarning):
    """The category of every deprecation warning of plsh_ref and plsh_fast.

    A subclass of :class:`DeprecationWarning` (filters and ``pytest.warns`` for that class
    see it too), so that a user, or the project's own test suite (``pyproject.toml``,
    ``[tool.pytest.ini_options] filterwarnings``), can turn the project's deprecations into
    errors without touching those of other libraries::

        warnings.simplefilter("error", PLSHDeprecationWarning)

    References
    ----------
    CONTRIBUTING.md, "The attention family: one signature" (deprecations); ``docs/changelog.md``.
    """


def warn_deprecated(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that ``old`` is deprecated in favour of ``new`` (kept for one release).

    The one deprecation helper of plsh_ref and plsh_fast (every shim calls it, so every
    old spelling warns alike, as a :class:`PLSHDeprecationWarning`;
    ``tests/project/test_deprecations.py`` covers each shim).

    Parameters
    ----------
    old, new : str
        The old spelling and the one to use instead, as a user would write them.
    stacklevel : int
        Passed to :func:`warnings.warn`; the default 3 names the caller of the function
        that calls this helper.

    References
    ----------
    CONTRIBUTING.md, "The attention family: one signature" (an old spelling works for one release);
    ``docs/changelog.md``.
    """
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release; use {new}",
        PLSHDeprecationWarning,
        stacklevel=stacklevel,
    )


def select_return(result: tuple, return_lse: bool | None, function: str) -> Any:
    """``output`` or ``(output, lse)`` by ``return_lse`` (the family's return convention).

    SPEC section 5: ``out``, or ``(out, lse)`` with ``return_lse=True``. The float64
    references returned the pair always; not given, ``return_lse`` keeps that for one
    release, with a DeprecationWarning naming ``function``.

    Parameters
    ----------
    result : tuple
        ``(output, lse)`` as computed.
    return_lse : bool or None
        ``True``: the pair; ``False``: the output; ``None``: the pair, with a warning.
    function : str
        The public function's name, for the warning.

    Raises
    ------
    TypeError
        ``return_lse`` not a bool or ``None``.
    """
    if return_lse is None:
        warn_deprecated(
            f"{function}() without return_lse (it returns (output, lse) for one more release)",
            "return_lse=True for the pair, or return_lse=False for the output alone (the "
            "default from the next release)",
            stacklevel=4,
        )
        return result
    return result if check_bool("return_lse", return_lse) else result[0]


def partition_argument(
    args: tuple, partition: Any, return_lse: bool | None, function: str
) -> tuple[Any, bool | None]:
    """The ``partition`` of a reference call, keyword-only with the old positional form shimmed.

    ``function(query, key, value, partition)`` (positional, the old form) still works for
    one release with a DeprecationWarning and keeps its old return, the pair.

    Parameters
    ----------
    args : tuple
        The positional arguments after ``query, key, value`` (at most the partition).
    partition : PartitionSample or None
        The keyword argument.
    return_lse : bool or None
        As given by the caller.
    function : str
        The public function's name, for the warning.

    Returns
    -------
    (partition, return_lse)
        ``return_lse`` is ``True`` for the old call form when it was not given.

    Raises
    ------
    TypeError
        The partition given twice, more than one extra positional argument, or none at all.

    References
    ----------
    SPEC section 5 (``partition`` keyword-only); CONTRIBUTING.md,
    "The attention family: one signature"; ``docs/changelog.md`` (the positional partition,
    deprecated).
    """
    if args:
        if len(args) > 1 or partition is not None:
            raise TypeError("partition: pass it once, as the keyword partition=")
        warn_deprecated(
            f"{function}(query, key, value, partition) with a positional partition",
            f"{function}(query, key, value, partition=..., return_lse=True)",
            stacklevel=4,
        )
        partition = args[0]
        if return_lse is None:
            return_lse = True  # the old call form keeps its old return, without a second warning
    if partition is None:
        raise TypeError("partition: required (a PartitionSample, keyword partition=)")
    return partition, return_lse


def keyword_argument(args: tuple, name: str, value: Any, old: str, new: str) -> Any:
    """The value of the keyword-only argument ``name``, its old positional form shimmed.

    A function whose argument ``name`` became keyword-only takes ``*args`` after
    ``query, key, value``; the old call ``function(query, key, value, x)`` still works for
    one release, with a :class:`PLSHDeprecationWarning` (``old`` and ``new`` as
    :func:`warn_deprecated`) naming the caller's line.

    Parameters
    ----------
    args : tuple
        The positional arguments after ``query, key, value`` (at most one, the old form).
    name : str
        The argument's name, for the error.
    value : Any
        The keyword argument as given (``None``: not given).
    old, new : str
        The old and the new call, for the warning.

    Returns
    -------
    Any
        ``value``, or the positional argument.

    Raises
    ------
    TypeError
        More than one positional argument, or the argument given both ways.

    References
    ----------
    CONTRIBUTING.md, "The attention family: one signature" (``keyword_argument``);
    ``docs/changelog.md``.
    """
    if not args:
        return value
    if len(args) > 1 or value is not None:
        raise TypeError(f"{name}: pass it once, as the keyword {name}=")
    warn_deprecated(old, new, stacklevel=4)
    return args[0]


#: deprecated names of this module (one release): ``name -> (module, new spelling)``
_MOVED = {
    "check_slopes": ("plsh_ref.alibi", "plsh_ref.alibi.check_slopes"),
    "check_partition": ("plsh_ref.partition", "plsh_ref.partition.check_partition"),
}


def __getattr__(name: str) -> Any:
    """Deprecated names moved out of this module (PEP 562; one release).

    They are looked up at attribute access, after the package has loaded (``plsh_ref``
    imports :mod:`plsh_ref.alibi` and :mod:`plsh_ref.partition`), so this leaf keeps no
    import of either.

    References
    ----------
    PEP 562; ``docs/changelog.md`` (``check_slopes`` and ``check_partition`` moved).
    """
    if name in _MOVED:
        module, new = _MOVED[name]
        warn_deprecated(f"plsh_ref.validation.{name}", new)
        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
