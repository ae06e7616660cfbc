"""The tolerance rule of SPEC section 6 for fast paths, and an assertion that reports the worst element.

A fast result ``out`` (in a low-precision dtype) is compared with the float64 reference
``ref`` on the same partition sample. Its allowed error is measured against a yardstick:
``baseline``, plain attention with the same dense bias computed in the same dtype as
``out`` (:mod:`plsh_ref.testing.baseline`)::

    max |out - ref| <= factor * max |baseline - ref| + floor,
    floor = floor_ulps * eps(dtype) * max |ref|,

with ``factor = 2`` and ``floor_ulps = 4`` by default. For a float64 ``out`` the reference
must be more exact than float64, or its own rounding (a few ulps, as large as a correct
kernel's) is charged to the kernel and the floor is all that is left: the validation
toolkit computes it in extended precision (:mod:`plsh_ref.testing.reference`;
``docs/validation.md``). The rule itself is the same for every dtype. Infinite entries (an LSE of ``-inf``
for a row without an admissible key) must match exactly; a NaN anywhere in ``out`` fails.

numpy only (torch tensors are accepted through ``numpy.asarray`` after ``.detach().cpu()``,
duck-typed, without importing torch).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["EPS", "allowed_error", "assert_close_to_reference", "dtype_eps", "max_error"]

#: machine epsilon (distance from 1 to the next float) of each supported dtype
EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}


def dtype_eps(dtype: str | np.dtype) -> float:
    """Machine epsilon of ``dtype``.

    Parameters
    ----------
    dtype : str, numpy dtype, torch dtype or float
        A name in :data:`EPS` (``"float16"``, ``"torch.bfloat16"``, ...), a numpy dtype, a
        torch dtype (by its name), or an epsilon given directly as a float in ``(0, 1)``.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        If the dtype is unknown or the float is not in ``(0, 1)``.

    References
    ----------
    SPEC section 6 (the floor: a few ulps of the dtype); ``numpy.finfo(dtype).eps``,
    and ``2**-7`` for bfloat16 (8 significand bits).
    """
    if isinstance(dtype, float):
        if not 0.0 < dtype < 1.0:
            raise ValueError(f"dtype: an epsilon must lie in (0, 1), got {dtype}")
        return dtype
    name = str(dtype).removeprefix("torch.")
    if name not in EPS:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            pass
    if name not in EPS:
        raise ValueError(f"dtype: must be one of {sorted(EPS)}, got {dtype!r}")
    return EPS[name]


def _as_float64(name, x) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor, duck-typed
        x = x.detach().cpu()
        if str(getattr(x, "dtype", "")) == "torch.bfloat16":
            x = x.float()
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name}: must be a real numeric array, got dtype {arr.dtype}")
    return arr.astype(np.float64)


def max_error(out: ArrayLike, ref: ArrayLike) -> tuple[float, tuple | None]:
    """``max |out - ref|`` and the index of the worst element.

    Entries that are infinite in ``ref`` must be equal in ``out`` (error 0 if so, ``inf``
    if not); a NaN in ``out`` or an infinite ``out`` against a finite ``ref`` gives ``inf``.

    Returns
    -------
    (error, index) : (float, tuple of int or None)
        ``index`` is ``None`` for empty arrays.

    Raises
    ------
    TypeError
        If ``out`` or ``ref`` is not a real numeric array (the message names it).
    ValueError
        If the shapes differ.

    References
    ----------
    SPEC section 6 (``max|out - ref|``); ``docs/validation.md``, "Reading the report" (the
    worst element).
    """
    return _max_error(out, ref, "out")


def _max_error(out, ref, name: str) -> tuple[float, tuple | None]:
    """:func:`max_error`; ``name`` is what ``out`` is called in the error messages."""
    o = _as_float64(name, out)
    r = _as_float64("ref", ref)
    if o.shape != r.shape:
        raise ValueError(f"{name}: shape {o.shape} differs from ref shape {r.shape}")
    if o.size == 0:
        return 0.0, None
    with np.errstate(invalid="ignore"):
        diff = np.abs(o - r)
    same_inf = np.isinf(r) & (o == r)
    diff = np.where(same_inf, 0.0, diff)
    diff = np.where(np.isnan(diff), np.inf, diff)
    flat = int(np.argmax(diff))
    return float(diff.flat[flat]), tuple(int(i) for i in np.unravel_index(flat, o.shape))


def allowed_error(
    ref: ArrayLike,
    baseline: ArrayLike,
    dtype: str | np.dtype,
    *,
    factor: float = 2.0,
    floor_ulps: float = 4.0,
    floor_scale: float | None = None,
) -> float:
    """The SPEC section 6 bound ``factor max|baseline - ref| + floor_ulps eps(dtype) max|ref|``.

    Parameters
    ----------
    ref : array_like
        float64 reference.
    baseline : array_like
        Plain attention with the same dense bias in ``dtype`` (the yardstick).
    dtype
        The dtype of the fast result (see :func:`dtype_eps`).
    factor, floor_ulps : float
        Defaults 2 and 4 (SPEC section 6).
    floor_scale : float, optional
        Magnitude the floor is relative to; default ``max|ref|`` over finite entries. Pass
        the magnitude of a larger family when ``ref`` may vanish identically (for example
        the largest entry of all three gradients, when ``grad_query`` is exactly 0 for a
        query with a single admissible key).

    Returns
    -------
    float

    Raises
    ------
    TypeError
        If ``ref`` or ``baseline`` is not a real numeric array (the message names it).
    ValueError
        If ``baseline`` and ``ref`` differ in shape (``baseline: shape ...``).
    """
    r = _as_float64("ref", ref)
    finite = np.abs(r[np.isfinite(r)])
    scale = float(finite.max()) if finite.size else 0.0
    if floor_scale is not None:
        scale = float(floor_scale)
    base_err, _ = _max_error(baseline, ref, "baseline")
    return factor * base_err + floor_ulps * dtype_eps(dtype) * scale


def assert_close_to_reference(
    out: ArrayLike,
    ref: ArrayLike,
    baseline: ArrayLike,
    dtype: str | np.dtype,
    *,
    name: str = "output",
    factor: float = 2.0,
    floor_ulps: float = 4.0,
    floor_scale: float | None = None,
) -> float:
    """Assert the tolerance rule of SPEC section 6; the message names the worst element.

    Parameters
    ----------
    out : array_like
        The fast result (any float dtype; compared in float64).
    ref : array_like
        The float64 reference on the same partition sample, same shape.
    baseline : array_like
        Plain attention with the same dense bias in ``dtype``, same shape.
    dtype
        dtype of ``out`` (see :func:`dtype_eps`).
    name : str
        What is compared (``"output"``, ``"lse"``, ``"grad_query"``...), for the message.
    factor, floor_ulps, floor_scale : float
        See :func:`allowed_error`.

    Returns
    -------
    float
        ``error / allowed`` (at most 1 when the assertion passes).

    Raises
    ------
    AssertionError
        If ``max|out - ref| > allowed``, with the worst index and values.

    Examples
    --------
    >>> import numpy as np
    >>> from plsh_ref.testing.tolerance import assert_close_to_reference
    >>> ref = np.linspace(-1.0, 1.0, 7)  # float64 reference
    >>> baseline = ref.astype(np.float32)  # plain float32 computation of the same function
    >>> ratio = assert_close_to_reference(ref.astype(np.float32), ref, baseline, "float32")
    >>> ratio <= 1.0  # error / allowed error
    True
    >>> assert_close_to_reference(ref + 0.1, ref, baseline, "float32")
    Traceback (most recent call last):
        ...
    AssertionError: ...
    """
    err, idx = max_error(out, ref)
    allowed = allowed_error(
        ref, baseline, dtype, factor=factor, floor_ulps=floor_ulps, floor_scale=floor_scale
    )
    if not err <= allowed:
        o = _as_float64("out", out)
        r = _as_float64("ref", ref)
        b = _as_float64("baseline", baseline)
        raise AssertionError(
            f"{name}: max|out - ref| = {err:.3e} > allowed {allowed:.3e} "
            f"({factor:g} x baseline error {max_error(baseline, ref)[0]:.3e} + "
            f"{floor_ulps:g} ulps of {dtype}); worst at {idx}: out={o[idx]!r}, "
            f"ref={r[idx]!r}, baseline={b[idx]!r}"
        )
    if allowed > 0:
        return err / allowed
    return 0.0
