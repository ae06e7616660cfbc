"""The property suite: run a user's kernel on attention problems and judge it.

For one :class:`~plsh_ref.testing.problems.AttentionProblem`, :func:`check_case`

1. skips the problem if it needs an input the kernel declares unsupported
   (:func:`kernel_capabilities`, :data:`CAPABILITIES`),
2. converts the inputs for the kernel (numpy arrays, or torch tensors on a device),
3. calls ``kernel(query, key, value, **kwargs)`` (in a worker thread when a timeout is
   set), with the keyword arguments of its contract (:func:`contract_kwargs`),
4. checks the result against the contract (``output`` or ``(output, lse)`` with shapes
   ``(batch, num_heads, n_q, head_dim_v)`` / ``(batch, num_heads, n_q)``, output dtype equal
   to the input dtype): a violation raises :class:`KernelContractError`,
5. compares output (and LSE, if returned) on the real query rows (pad query slots of a
   padded batch are not compared) with the float64 reference under the tolerance rule of
   SPEC section 6: ``max|out - ref| <= 2 max|out_plain - ref| + floor``, where
   ``out_plain`` is plain attention with the same dense bias in the kernel's dtype.

:func:`load_kernel` resolves ``"MODULE:FUNCTION"`` (the current folder is on the import
path) and :func:`check_signature` checks the keyword-only contract before anything runs.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import threading
import traceback as traceback_module
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from .baseline import plain_attention_numpy, plain_attention_torch
from .problems import DTYPES, AttentionProblem, ProblemSpec
from .reference import KINDS
from .tolerance import allowed_error, max_error

__all__ = [
    "CAPABILITIES",
    "FRAMEWORKS",
    "SLOPES",
    "CaseResult",
    "KernelContractError",
    "check_case",
    "check_signature",
    "contract_kwargs",
    "detect_framework",
    "kernel_capabilities",
    "load_kernel",
    "required_capabilities",
    "slope_mode",
]

#: array libraries a kernel may take and return
FRAMEWORKS = ("numpy", "torch")

#: the slope modes, ``given`` (the kernel receives ``slopes``, standard or random) and
#: ``standard`` (no ``slopes`` argument; the kernel must compute Press et al.'s slopes)
SLOPES = ("given", "standard")

#: what a kernel may declare it does not support (``kernel.supports = {name: False}``);
#: each maps to the problems that need it (:func:`required_capabilities`)
CAPABILITIES = {
    "causal": "causal problems",
    "bidirectional": "bidirectional (non-causal) problems",
    "gqa": "grouped-query heads, num_heads_kv < num_heads",
    "empty": "n_q = 0 or n_k = 0",
    "unequal_lengths": "n_q != n_k (decode and n_q > n_k included)",
    "head_dim_v": "value head_dim != query/key head_dim",
    "positions": "explicit positions (query_positions / key_positions not None)",
    "batch_positions": "per-sequence positions of shape (batch, n)",
    "attention_mask": "a key-padding attention_mask (batch, n_k)",
    "lse": "returning the LSE (declare False to skip the LSE comparison only)",
    **{dtype: f"{dtype} inputs" for dtype in DTYPES},
}

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
        False for a failure; also False for a skipped case (see ``skipped``).
    error : float
        ``max |out - ref|`` over the output (``nan`` if the kernel raised or returned NaN).
    allowed : float
        The tolerance ``2 max|out_plain - ref| + floor``.
    worst_index : tuple of int or None
        Index ``(batch, head, query, channel)`` of the worst output element.
    lse_error, lse_allowed : float or None
        The same for the LSE, when the kernel returns one.
    message : str
        Empty when passed; otherwise why the case failed (or was skipped).
    skipped : bool
        The kernel declared an input of this case unsupported; never counted as passed.
    traceback : str
        The kernel's traceback when it raised (empty otherwise).
    empty_rows : int
        Number of ``(batch, head, query)`` rows without an admissible key (pad query rows
        not counted).
    """

    passed: bool
    error: float
    allowed: float
    worst_index: tuple | None = None
    lse_error: float | None = None
    lse_allowed: float | None = None
    message: str = ""
    skipped: bool = False
    traceback: str = ""
    empty_rows: int = 0

    @property
    def status(self) -> str:
        """``"pass"``, ``"FAIL"`` or ``"skip"``."""
        return "skip" if self.skipped else ("pass" if self.passed else "FAIL")

    @property
    def ratio(self) -> float:
        """``error / allowed`` (``inf`` for a failure without a finite error)."""
        if self.skipped:
            return 0.0
        if not np.isfinite(self.error):
            return float("inf")
        ratios = [
            self.error / self.allowed
            if self.allowed > 0
            else (0.0 if self.error == 0 else float("inf"))
        ]
        if self.lse_error is not None:
            lse_allowed = cast(float, self.lse_allowed)  # set with lse_error
            ratios.append(
                float("inf")
                if not np.isfinite(self.lse_error)
                else self.lse_error / lse_allowed
                if lse_allowed > 0
                else (0.0 if self.lse_error == 0 else float("inf"))
            )
        if not self.passed and self.message:
            ratios.append(float("inf") if "NaN" in self.message or "-inf" in self.message else 0)
        return max(ratios)


def kernel_capabilities(
    kernel: Callable[..., Any], supports: Mapping[str, bool] | None = None
) -> dict:
    """What ``kernel`` supports: its ``supports`` attribute updated by ``supports``.

    Parameters
    ----------
    kernel : callable
        May carry ``kernel.supports = {"bidirectional": False, ...}``.
    supports : dict, optional
        More declarations (e.g. from ``plsh verify --supports``), overriding the attribute.

    Returns
    -------
    dict
        ``{name: bool}`` for every name of :data:`CAPABILITIES` (default True).

    Raises
    ------
    KernelContractError
        On an unknown capability name or a value that is not a bool.
    """
    declared = dict(getattr(kernel, "supports", None) or {})
    declared.update(supports or {})
    out = dict.fromkeys(CAPABILITIES, True)
    for name, value in declared.items():
        if name not in CAPABILITIES:
            raise KernelContractError(
                f"supports: unknown capability {name!r}; known: {', '.join(CAPABILITIES)}"
            )
        if not isinstance(value, (bool, np.bool_)):
            raise KernelContractError(
                f"supports: {name!r} must be True or False, got {type(value).__name__} {value!r}"
            )
        out[name] = bool(value)
    return out


def required_capabilities(spec: ProblemSpec) -> list[str]:
    """The capabilities a problem needs (names of :data:`CAPABILITIES`; ``lse`` excluded)."""
    need = [spec.dtype, "causal" if spec.causal else "bidirectional"]
    if spec.num_heads_kv < spec.num_heads:
        need.append("gqa")
    if spec.n_q == 0 or spec.n_k == 0:
        need.append("empty")
    if spec.n_q != spec.n_k:
        need.append("unequal_lengths")
    if spec.head_dim_v != spec.head_dim:
        need.append("head_dim_v")
    if spec.positions == "padded":
        need.append("attention_mask")
    elif spec.positions != "default" or spec.offset:
        need.append("positions")
    if spec.positions in ("per_sequence", "padded"):
        need.append("batch_positions")
    return need


def load_kernel(target: str) -> Callable[..., Any]:
    """Import ``"MODULE:FUNCTION"`` (``FUNCTION`` may be dotted, e.g. ``Class.method``).

    Parameters
    ----------
    target : str

    Returns
    -------
    callable

    The current folder is put on the import path first (as ``python -m`` does), so a
    kernel in ``./my_kernel.py`` loads as ``my_kernel:attention`` without ``PYTHONPATH``.

    Raises
    ------
    KernelContractError
        If the string is malformed, the module cannot be imported (its exception is named
        in the message), the attribute is missing, or it is not callable.
    """
    if not isinstance(target, str) or target.count(":") != 1 or not all(target.split(":")):
        raise KernelContractError(f"kernel: expected MODULE:FUNCTION, got {target!r}")
    module_name, attr = target.split(":")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
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
        kind = type(obj).__name__
        article = "an" if kind[:1].lower() in "aeiou" else "a"
        raise KernelContractError(f"kernel: {target} is {article} {kind}, not a function")
    return obj


def _names(kind: str, slopes: str) -> tuple:
    names: tuple[str, ...] = _KWARGS[kind]
    if kind == "alibi" and slopes == "standard":
        names = names[1:]
    return names


def _contract(kind: str, slopes: str = "given") -> str:
    return f"f(query, key, value, *, {', '.join(_names(kind, slopes))}[, attention_mask])"


def check_signature(kernel: Callable[..., Any], kind: str, slopes: str = "given") -> bool:
    """Check that ``kernel`` accepts the call of the ``kind`` contract.

    Parameters
    ----------
    kernel : callable
    kind : {"alibi", "plsh"}
    slopes : {"given", "standard"}
        ``standard``: the ``alibi`` contract without ``slopes``.

    Returns
    -------
    bool
        Whether the kernel takes ``attention_mask`` (a parameter of that name or
        ``**kwargs``); kernels that do not are never given padded problems.

    Raises
    ------
    KernelContractError
        If ``kernel(query, key, value, **kwargs)`` cannot bind (callables without an
        inspectable signature are accepted and assumed to take ``attention_mask``).
    ValueError
        If ``kind`` or ``slopes`` is unknown.
    """
    if kind not in KINDS:
        raise ValueError(f"kind: must be one of {KINDS}, got {kind!r}")
    if slopes not in SLOPES:
        raise ValueError(f"slopes: must be one of {SLOPES}, got {slopes!r}")
    try:
        sig = inspect.signature(kernel)
    except (TypeError, ValueError):
        return True
    names = _names(kind, slopes)
    try:
        sig.bind(None, None, None, **dict.fromkeys(names))
    except TypeError as exc:
        name = getattr(kernel, "__qualname__", repr(kernel))
        hint = ""
        if kind == "alibi" and slopes == "standard" and "slopes" in sig.parameters:
            hint = "; it takes slopes: use --slopes given"
        raise KernelContractError(
            f"kernel: {name}{sig} does not match the {kind} contract "
            f"{_contract(kind, slopes)} ({exc}){hint}"
        ) from None
    try:
        sig.bind(None, None, None, **dict.fromkeys(names), attention_mask=None)
        return True
    except TypeError:
        return False


def slope_mode(kernel: Callable[..., Any]) -> str:
    """``"given"`` if ``kernel`` takes a ``slopes`` argument (or ``**kwargs``), else ``"standard"``."""
    try:
        params = inspect.signature(kernel).parameters
    except (TypeError, ValueError):
        return "given"
    if "slopes" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return "given"
    return "standard"


def contract_kwargs(
    problem: AttentionProblem, *, slopes: str = "given", attention_mask: bool = True
) -> dict[str, Any]:
    """The keyword arguments a kernel receives for ``problem`` (numpy values).

    Parameters
    ----------
    problem : AttentionProblem
    slopes : {"given", "standard"}
    attention_mask : bool
        Whether the kernel takes ``attention_mask`` (see :func:`check_signature`).

    Returns
    -------
    dict
    """
    return problem.kernel_kwargs(slopes=slopes, attention_mask=attention_mask)


def _to_framework(kwargs: dict, problem: AttentionProblem, framework: str, device: str):
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

    kwargs = dict(kwargs)
    for name in ("query_positions", "key_positions", "attention_mask"):
        if kwargs.get(name) is not None:
            kwargs[name] = torch.from_numpy(np.ascontiguousarray(kwargs[name])).to(device)
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


def _call(kernel, q, k, v, kwargs, timeout):
    """``(result, exception, traceback text)``; a worker thread when ``timeout`` is set."""
    box = {}

    def target():
        try:
            box["result"] = kernel(q, k, v, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported as the case's failure
            box["exc"] = exc
            box["tb"] = traceback_module.format_exc()

    if timeout is None:
        target()
    else:
        worker = threading.Thread(target=target, daemon=True, name="plsh-verify-kernel")
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            return None, TimeoutError(f"no result after {timeout:g} s (--timeout)"), ""
    return box.get("result"), box.get("exc"), box.get("tb", "")


def _nan_report(x: np.ndarray, empty: np.ndarray) -> str:
    where = np.argwhere(np.isnan(x))
    first = ", ".join(str(tuple(int(i) for i in w)) for w in where[:3])
    rows = {tuple(int(i) for i in w[:3]) for w in where}
    n_empty = sum(bool(empty[r]) for r in rows)
    text = f"output contains NaN at {len(where)} entries, first {first}"
    if n_empty == len(rows):
        return text + " (all on rows without admissible keys: expected output 0)"
    if n_empty:
        return text + f" ({n_empty} of {len(rows)} rows without admissible keys)"
    return text + " (on rows with admissible keys)"


def check_case(
    kernel: Callable[..., Any],
    problem: AttentionProblem,
    *,
    framework: str = "numpy",
    device: str = "cpu",
    slopes: str | None = None,
    attention_mask: bool | None = None,
    supports: dict | None = None,
    timeout: float | None = None,
) -> CaseResult:
    """Run ``kernel`` on ``problem`` and compare with the float64 reference.

    Parameters
    ----------
    kernel : callable
        Follows the ``problem.kind`` contract (see :mod:`plsh_ref.testing.reference`).
    problem : AttentionProblem
    framework : {"numpy", "torch"}
        What the kernel takes and returns. ``torch``: inputs are tensors of the problem's
        dtype on ``device``; slopes float64, positions and ``attention_mask`` int64
        tensors on ``device``; the partition stays a
        :class:`~plsh_ref.partition.PartitionSample`.
    device : str
        torch device (``"cpu"``, ``"cuda"``); must be ``"cpu"`` for numpy.
    slopes : {"given", "standard"}, optional
        ``standard``: the kernel receives no ``slopes`` and must use Press et al.'s; the
        problem must then have standard slopes. Default: :func:`slope_mode` of the kernel.
    attention_mask : bool, optional
        Whether the kernel takes ``attention_mask``; if not, padded problems are skipped.
        Default: read from its signature (:func:`check_signature`).
    supports : dict, optional
        Capabilities (:func:`kernel_capabilities`); default: the kernel's ``supports``.
    timeout : float, optional
        Seconds the kernel may take; a kernel still running then fails the case (its
        thread is left behind, as a daemon).

    Returns
    -------
    CaseResult
        ``skipped`` if the problem needs an unsupported input; otherwise ``passed`` is
        false if the kernel raised, timed out, returned NaN, missed the ``-inf`` LSE of an
        empty row, or exceeded the tolerance.

    Raises
    ------
    KernelContractError
        If the result has the wrong type, shape, dtype or device, or ``supports`` names
        an unknown capability.
    ValueError
        On an unknown ``framework``/``slopes``, a numpy kernel asked for another device,
        or standard-slopes mode on a problem with random slopes.
    """
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework: must be one of {FRAMEWORKS}, got {framework!r}")
    if framework == "numpy" and device != "cpu":
        raise ValueError(f"device: numpy kernels run on 'cpu', got {device!r}")
    if slopes is None:
        slopes = slope_mode(kernel)
    if slopes not in SLOPES:
        raise ValueError(f"slopes: must be one of {SLOPES}, got {slopes!r}")
    if attention_mask is None:
        attention_mask = check_signature(kernel, problem.kind, slopes)
    spec = problem.spec
    if slopes == "standard" and problem.kind == "alibi" and spec.slopes != "standard":
        raise ValueError("slopes: standard-slopes mode needs problems with standard slopes")
    caps = kernel_capabilities(kernel, supports)
    missing = [c for c in required_capabilities(spec) if not caps[c]]
    if spec.positions == "padded" and not attention_mask:
        missing.append("attention_mask (the kernel takes no attention_mask argument)")
    if missing:
        return CaseResult(
            False, float("nan"), 0.0, message=f"unsupported: {', '.join(missing)}", skipped=True
        )
    kwargs = contract_kwargs(problem, slopes=slopes, attention_mask=attention_mask)
    q, k, v, kwargs = _to_framework(kwargs, problem, framework, device)
    result, exc, tb = _call(kernel, q, k, v, kwargs, timeout)
    if exc is not None:
        first = str(exc).splitlines()[0] if str(exc) else ""
        label = "timed out" if isinstance(exc, TimeoutError) and not tb else "raised"
        message = f"{label} {type(exc).__name__}: {first}"
        if label == "timed out":
            message = f"timed out: {first}"
        return CaseResult(False, float("nan"), 0.0, message=message, traceback=tb)
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
        if not caps["lse"]:
            lse = None

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
    # Pad query slots of a padded batch are "don't care": compare the real rows only.
    q_keep = problem.positions_and_keep()[2][:, None, :]
    empty = np.isneginf(ref_lse) & q_keep
    out64 = np.where(q_keep[..., None], _as_float64(out, framework), 0.0)
    ref_out = np.where(q_keep[..., None], ref_out, 0.0)
    plain_out = np.where(q_keep[..., None], plain_out, 0.0)
    error, worst = max_error(out64, ref_out)
    allowed = allowed_error(ref_out, plain_out, spec.dtype)
    messages = []
    if np.any(np.isnan(out64)):
        messages.append(_nan_report(out64, empty))
    elif error > allowed:
        where = f"at {worst}"
        if worst is not None and empty[worst[:3]]:
            where += " (a row without admissible keys: expected output 0)"
        messages.append(f"output error {error:.3g} > allowed {allowed:.3g} {where}")
    lse_error = lse_allowed = None
    if lse is not None:
        lse64 = np.where(q_keep, _as_float64(lse, framework), ref_lse)
        if np.any(np.isneginf(lse64) != np.isneginf(ref_lse)):
            bad = tuple(int(i) for i in np.argwhere(np.isneginf(lse64) != np.isneginf(ref_lse))[0])
            messages.append(
                f"lse must be -inf exactly on rows without admissible keys "
                f"(first mismatch at {bad}: got {lse64[bad]}, expected {ref_lse[bad]})"
            )
        neg = np.isneginf(ref_lse)
        ref_finite = np.where(neg, 0.0, ref_lse)
        lse_error, _ = max_error(np.where(neg, 0.0, lse64), ref_finite)
        lse_allowed = allowed_error(ref_finite, np.where(neg, 0.0, plain_lse), spec.dtype)
        if lse_error > lse_allowed:
            messages.append(f"lse error {lse_error:.3g} > allowed {lse_allowed:.3g}")
    return CaseResult(
        not messages,
        error,
        allowed,
        worst,
        lse_error,
        lse_allowed,
        "; ".join(messages),
        empty_rows=int(empty.sum()),
    )


def detect_framework(
    kernel: Callable[..., Any],
    kind: str,
    slopes: str,
    attention_mask: bool,
    timeout: float | None = None,
) -> str:
    """``"numpy"`` or ``"torch"``: what the kernel returns on one small float32 problem.

    numpy inputs are tried first, then torch (if installed); the first framework whose
    tensors come back is the kernel's.

    Parameters
    ----------
    kernel : callable
    kind : {"alibi", "plsh"}
    slopes : {"given", "standard"}
    attention_mask : bool
        Whether the kernel takes ``attention_mask``.
    timeout : float, optional
        Seconds each probe may take.

    Returns
    -------
    str

    Raises
    ------
    KernelContractError
        If neither works (the message says what each attempt did).
    """
    problem = ProblemSpec(kind=kind, n_q=4, n_k=4, num_heads=2, num_heads_kv=2).build()
    kwargs = contract_kwargs(problem, slopes=slopes, attention_mask=attention_mask)
    tried = []
    candidates = ["numpy"]
    try:
        import torch  # noqa: F401

        candidates.append("torch")
    except ImportError:
        pass
    for framework in candidates:
        q, k, v, kw = _to_framework(kwargs, problem, framework, "cpu")
        result, exc, _ = _call(kernel, q, k, v, kw, timeout)
        if exc is not None:
            first = str(exc).splitlines()[0] if str(exc) else ""
            tried.append(f"with {framework} inputs it raised {type(exc).__name__}: {first}")
            continue
        out = result[0] if isinstance(result, (tuple, list)) and result else result
        module = type(out).__module__.split(".")[0]
        if module == framework:
            return framework
        tried.append(f"with {framework} inputs it returned a {type(out).__name__}")
    raise KernelContractError(
        "framework: cannot tell what the kernel takes ("
        + "; ".join(tried)
        + "); pass --framework numpy or --framework torch"
    )
