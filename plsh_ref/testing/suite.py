"""The property suite: run a user's kernel on attention problems and judge it.

For one :class:`~plsh_ref.testing.problems.AttentionProblem`, :func:`check_case`

1. converts the inputs for the kernel (numpy arrays, or torch tensors on a device),
2. calls ``kernel(query, key, value, **problem.kernel_kwargs())``,
3. checks the result against the contract (``output`` or ``(output, lse)`` with shapes
   ``(batch, num_heads, n_q, head_dim_v)`` / ``(batch, num_heads, n_q)``, output dtype equal
   to the input dtype): a violation raises :class:`KernelContractError`,
4. compares output (and LSE, if returned) with the float64 reference under the tolerance
   rule of SPEC section 6: ``max|out - ref| <= 2 max|out_plain - ref| + floor``, where
   ``out_plain`` is plain attention with the same dense bias in the kernel's dtype.

:func:`load_kernel` resolves ``"MODULE:FUNCTION"`` and :func:`check_signature` checks the
keyword-only contract before anything runs.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

import numpy as np

from .baseline import plain_attention_numpy, plain_attention_torch
from .problems import AttentionProblem
from .reference import KINDS
from .tolerance import allowed_error, max_error

__all__ = [
    "FRAMEWORKS",
    "CaseResult",
    "KernelContractError",
    "check_case",
    "check_signature",
    "load_kernel",
]

#: array libraries a kernel may take and return
FRAMEWORKS = ("numpy", "torch")

_KWARGS = {
    "alibi": ("slopes", "causal", "scale", "query_positions", "key_positions"),
    "plsh": ("partition", "causal", "scale", "query_positions", "key_positions"),
}


class KernelContractError(ValueError):
    """The kernel cannot be imported, has the wrong signature, or returns the wrong thing.

    The message is one line meant for the user (``plsh verify`` prints it and exits 2).
    """


@dataclass(frozen=True)
class CaseResult:
    """Outcome of one case of the property suite.

    Attributes
    ----------
    passed : bool
    error : float
        ``max |out - ref|`` over the output (``nan`` if the kernel raised or returned NaN).
    allowed : float
        The tolerance ``2 max|out_plain - ref| + floor``.
    worst_index : tuple of int or None
        Index ``(batch, head, query, channel)`` of the worst output element.
    lse_error, lse_allowed : float or None
        The same for the LSE, when the kernel returns one.
    message : str
        Empty when passed; otherwise why the case failed.
    """

    passed: bool
    error: float
    allowed: float
    worst_index: tuple | None = None
    lse_error: float | None = None
    lse_allowed: float | None = None
    message: str = ""

    @property
    def ratio(self) -> float:
        """``error / allowed`` (``inf`` for a failure without a finite error)."""
        if not np.isfinite(self.error):
            return float("inf")
        ratios = [
            self.error / self.allowed
            if self.allowed > 0
            else (0.0 if self.error == 0 else float("inf"))
        ]
        if self.lse_error is not None:
            ratios.append(
                float("inf")
                if not np.isfinite(self.lse_error)
                else self.lse_error / self.lse_allowed
                if self.lse_allowed > 0
                else (0.0 if self.lse_error == 0 else float("inf"))
            )
        return max(ratios)


def load_kernel(target: str):
    """Import ``"MODULE:FUNCTION"`` (``FUNCTION`` may be dotted, e.g. ``Class.method``).

    Parameters
    ----------
    target : str

    Returns
    -------
    callable

    Raises
    ------
    KernelContractError
        If the string is malformed, the module cannot be imported (its exception is named
        in the message), the attribute is missing, or it is not callable.
    """
    if not isinstance(target, str) or target.count(":") != 1 or not all(target.split(":")):
        raise KernelContractError(f"kernel: expected MODULE:FUNCTION, got {target!r}")
    module_name, attr = target.split(":")
    try:
        obj = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import-time failure is the user's to fix
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise KernelContractError(
            f"kernel: cannot import module {module_name!r}: {type(exc).__name__}: {first}"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise KernelContractError(f"kernel: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise KernelContractError(f"kernel: {target} is a {type(obj).__name__}, not a function")
    return obj


def _contract(kind: str) -> str:
    return f"f(query, key, value, *, {', '.join(_KWARGS[kind])})"


def check_signature(kernel, kind: str) -> None:
    """Check that ``kernel`` accepts the call of the ``kind`` contract.

    Parameters
    ----------
    kernel : callable
    kind : {"alibi", "plsh"}

    Raises
    ------
    KernelContractError
        If ``kernel(query, key, value, **kwargs)`` cannot bind (callables without an
        inspectable signature are accepted).
    ValueError
        If ``kind`` is unknown.
    """
    if kind not in KINDS:
        raise ValueError(f"kind: must be one of {KINDS}, got {kind!r}")
    try:
        sig = inspect.signature(kernel)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(None, None, None, **{name: None for name in _KWARGS[kind]})
    except TypeError as exc:
        name = getattr(kernel, "__qualname__", repr(kernel))
        raise KernelContractError(
            f"kernel: {name}{sig} does not match the {kind} contract {_contract(kind)} ({exc})"
        ) from None


def _to_framework(problem: AttentionProblem, framework: str, device: str):
    kwargs = problem.kernel_kwargs()
    if framework == "numpy":
        if problem.dtype == "bfloat16":
            raise KernelContractError(
                "dtypes: bfloat16 needs --framework torch (numpy has no bfloat16)"
            )
        return problem.query, problem.key, problem.value, kwargs
    import torch

    tdtype = getattr(torch, problem.dtype)

    def t(x):
        return torch.from_numpy(np.ascontiguousarray(x)).to(device=device, dtype=tdtype)

    for name in ("query_positions", "key_positions"):
        if kwargs[name] is not None:
            kwargs[name] = torch.from_numpy(kwargs[name]).to(device)
    if "slopes" in kwargs:
        kwargs["slopes"] = torch.from_numpy(kwargs["slopes"]).to(device)
    return t(problem.query), t(problem.key), t(problem.value), kwargs


def _dtype_name(x) -> str:
    return str(x.dtype).replace("torch.", "")


def _as_float64(x, framework: str) -> np.ndarray:
    if framework == "torch":
        import torch

        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def _split_result(result, framework: str):
    if isinstance(result, (tuple, list)):
        if len(result) != 2:
            raise KernelContractError(
                f"kernel: returned a {type(result).__name__} of length "
                f"{len(result)}; expected output or (output, lse)"
            )
        out, lse = result
    else:
        out, lse = result, None
    array_type = "torch.Tensor" if framework == "torch" else "numpy.ndarray"
    for name, x in (("output", out), ("lse", lse)):
        if x is None:
            continue
        ok = (
            (type(x).__module__.startswith("torch") and hasattr(x, "detach"))
            if framework == "torch"
            else isinstance(x, np.ndarray)
        )
        if not ok:
            raise KernelContractError(
                f"kernel: returned {name} of type {type(x).__name__}; expected {array_type}"
            )
    return out, lse


def check_case(
    kernel, problem: AttentionProblem, *, framework: str = "numpy", device: str = "cpu"
) -> CaseResult:
    """Run ``kernel`` on ``problem`` and compare with the float64 reference.

    Parameters
    ----------
    kernel : callable
        Follows the ``problem.kind`` contract (see :mod:`plsh_ref.testing.reference`).
    problem : AttentionProblem
    framework : {"numpy", "torch"}
        What the kernel takes and returns. ``torch``: inputs are tensors of the problem's
        dtype on ``device``; slopes float64 and positions int64 tensors on ``device``; the
        partition stays a :class:`~plsh_ref.partition.PartitionSample`.
    device : str
        torch device (``"cpu"``, ``"cuda"``); must be ``"cpu"`` for numpy.

    Returns
    -------
    CaseResult
        ``passed`` is false if the kernel raised, returned NaN, missed the ``-inf`` LSE of
        an empty row, or exceeded the tolerance.

    Raises
    ------
    KernelContractError
        If the result has the wrong type, shape, dtype or device.
    ValueError
        On an unknown ``framework`` or a numpy kernel asked for another device.
    """
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework: must be one of {FRAMEWORKS}, got {framework!r}")
    if framework == "numpy" and device != "cpu":
        raise ValueError(f"device: numpy kernels run on 'cpu', got {device!r}")
    spec = problem.spec
    q, k, v, kwargs = _to_framework(problem, framework, device)
    try:
        result = kernel(q, k, v, **kwargs)
    except Exception as exc:  # noqa: BLE001 - a raising kernel fails this case
        first = str(exc).splitlines()[0] if str(exc) else ""
        return CaseResult(False, float("nan"), 0.0, message=f"raised {type(exc).__name__}: {first}")
    out, lse = _split_result(result, framework)
    want_out = (spec.batch, spec.num_heads, spec.n_q, spec.head_dim_v)
    want_lse = want_out[:3]
    if tuple(out.shape) != want_out:
        raise KernelContractError(
            f"kernel: output has shape {tuple(out.shape)}, expected "
            f"{want_out} (batch, num_heads, n_q, head_dim_v)"
        )
    if _dtype_name(out) != _dtype_name(q):
        raise KernelContractError(
            f"kernel: output has dtype {_dtype_name(out)}, expected the "
            f"input dtype {_dtype_name(q)}"
        )
    if framework == "torch" and out.device != q.device:
        raise KernelContractError(f"kernel: output is on {out.device}, inputs on {q.device}")
    if lse is not None:
        if tuple(lse.shape) != want_lse:
            raise KernelContractError(
                f"kernel: lse has shape {tuple(lse.shape)}, expected "
                f"{want_lse} (batch, num_heads, n_q)"
            )
        if not np.issubdtype(
            np.dtype(_dtype_name(lse).replace("bfloat16", "float32")), np.floating
        ):
            raise KernelContractError(
                f"kernel: lse has dtype {_dtype_name(lse)}, expected floating"
            )

    ref_out, ref_lse = problem.reference()
    bias = problem.log_weight()
    if framework == "torch":
        plain_out, plain_lse = plain_attention_torch(
            problem.query,
            problem.key,
            problem.value,
            bias,
            scale=spec.scale,
            dtype=spec.dtype,
            device=device,
        )
    else:
        plain_out, plain_lse = plain_attention_numpy(
            problem.query, problem.key, problem.value, bias, scale=spec.scale, dtype=spec.dtype
        )
    out64 = _as_float64(out, framework)
    error, worst = max_error(out64, ref_out)
    allowed = allowed_error(ref_out, plain_out, spec.dtype)
    messages = []
    if np.any(np.isnan(out64)):
        messages.append("output contains NaN")
    elif error > allowed:
        messages.append(f"output error {error:.3g} > allowed {allowed:.3g} at {worst}")
    lse_error = lse_allowed = None
    if lse is not None:
        lse64 = _as_float64(lse, framework)
        empty = np.isneginf(ref_lse)
        if np.any(np.isneginf(lse64) != empty):
            bad = tuple(int(i) for i in np.argwhere(np.isneginf(lse64) != empty)[0])
            messages.append(
                f"lse must be -inf exactly on rows without admissible keys "
                f"(first mismatch at {bad}: got {lse64[bad]}, expected {ref_lse[bad]})"
            )
        ref_finite = np.where(empty, 0.0, ref_lse)
        lse_error, _ = max_error(np.where(empty, 0.0, lse64), ref_finite)
        lse_allowed = allowed_error(ref_finite, np.where(empty, 0.0, plain_lse), spec.dtype)
        if lse_error > lse_allowed:
            messages.append(f"lse error {lse_error:.3g} > allowed {lse_allowed:.3g}")
    return CaseResult(
        not messages, error, allowed, worst, lse_error, lse_allowed, "; ".join(messages)
    )
