"""Argument checks shared by :mod:`plsh_ref`.

Every check raises :class:`ValueError` or :class:`TypeError` whose message starts with
the name of the offending argument, so that bad input never reaches the mathematics.
"""

from __future__ import annotations

import numbers

import numpy as np

__all__ = [
    "as_float_array",
    "check_bool",
    "as_positions",
    "check_int",
    "check_positive_float",
    "check_probability",
    "check_sigma",
]


def check_int(name: str, value, *, minimum: int | None = None) -> int:
    """Return ``value`` as a Python ``int`` or raise.

    Raises
    ------
    TypeError
        If ``value`` is not an integer (``bool`` and floats are refused).
    ValueError
        If ``value < minimum``.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {value}")
    return value


def check_bool(name: str, value) -> bool:
    """Return ``value`` as a ``bool`` or raise ``TypeError`` (only ``bool``/``numpy.bool_``).

    Flags such as ``causal`` are never coerced from strings, numbers or ``None``: a typo like
    ``causal="no"`` would otherwise silently mean ``True``.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def check_positive_float(name: str, value) -> float:
    """Return ``value`` as a finite positive ``float`` or raise ``TypeError``/``ValueError``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: must be finite and > 0, got {value}")
    return value


def check_probability(name: str, value) -> float:
    """Return ``value`` as a float in the open interval (0, 1) or raise."""
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
    name: str, value, *, ndim: int | tuple[int, ...] | None = None, finite: bool = True
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


def check_sigma(name: str, value) -> np.ndarray:
    """Return ``value`` as a float64 array of length scales (tokens), each finite and > 0.

    Accepts a scalar (returned with shape ``()``) or an array of any shape.
    """
    arr = as_float_array(name, value)
    if np.any(arr <= 0):
        raise ValueError(f"{name}: every entry must be > 0, got min {arr.min()!r}")
    return arr


def as_positions(name: str, value, *, length: int | None = None) -> np.ndarray:
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
