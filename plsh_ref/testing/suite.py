"""The property suite: run a user's kernel on attention problems and judge it.

For one :class:`~plsh_ref.testing.problems.AttentionProblem`, :func:`check_case`

1. skips the problem if it needs an input the kernel declares unsupported
   (:func:`kernel_capabilities`, :data:`~plsh_ref.testing.capabilities.CAPABILITIES`),
2. converts the inputs for the kernel (numpy arrays, or torch tensors on a device),
3. calls ``kernel(query, key, value, **kwargs)`` (in a worker thread when a timeout is
   set), with the keyword arguments of its contract (:func:`contract_kwargs`),
4. checks the result against the contract (``output`` or ``(output, lse)`` with shapes
   ``(batch, num_heads, n_q, head_dim_v)`` / ``(batch, num_heads, n_q)``, output dtype equal
   to the input dtype): a violation raises :class:`KernelContractError`,
5. compares output (and LSE, if returned) on the real query rows (pad query slots of a
   padded batch are not compared) with the reference under the tolerance rule of
   SPEC section 6: ``max|out - ref| <= 2 max|out_plain - ref| + floor``, where
   ``out_plain`` is plain attention with the same dense bias in the kernel's dtype. The
   reference is float64, computed in extended precision for float64 problems
   (:func:`~plsh_ref.testing.reference.reference_precision`), so that the error measured is
   the kernel's own and not the float64 reference's rounding.

:func:`load_kernel` resolves ``"MODULE:FUNCTION"`` (the current folder is on the import
path) and :func:`check_signature` checks the keyword-only contract before anything runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import threading
import traceback as traceback_module
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from .baseline import plain_attention_numpy, plain_attention_torch
from .capabilities import (
    CAPABILITIES,  # noqa: F401 - still importable from here
    KernelContractError,
    kernel_capabilities,
    optional_inputs,
    required_capabilities,
)
from .problems import PADDED_MODES, AttentionProblem, ProblemSpec
from .reference import KINDS
from .tolerance import allowed_error, max_error

__all__ = [
    "FRAMEWORKS",
    "JAX_X64_MESSAGE",
    "PRECISION_FINDING",
    "SLOPES",
    "CaseResult",
    "check_case",
    "check_signature",
    "contract_kwargs",
    "detect_framework",
    "probe_framework",
    "jax_x64_enabled",
    "load_kernel",
    "row_constant_bias",
    "slope_mode",
]

#: array libraries a kernel may take and return
FRAMEWORKS = ("numpy", "torch", "jax")

#: the slope modes, ``given`` (the kernel receives ``slopes``, standard or random) and
#: ``standard`` (no ``slopes`` argument; the kernel must compute Press et al.'s slopes)
SLOPES = ("given", "standard")

_KWARGS = {
    "alibi": ("slopes", "causal", "scale", "query_positions", "key_positions"),
    "plsh": ("partition", "causal", "scale", "query_positions", "key_positions"),
}

#: the finding of an exact-in-real-arithmetic kernel whose rounding grows with n * slope
PRECISION_FINDING = "precision: row-constant bias (m * p_j) rounding"


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
    finding : str
        A named precision finding (:data:`PRECISION_FINDING`) on a case whose error is
        explained by rounding that grows with ``n * slope``; such a case passes in float32
        and float64 (it is reported) unless ``strict_precision``, and fails in half
        precision. Empty otherwise.

    References
    ----------
    SPEC section 6 (error and allowed error); ``docs/validation.md``, "Reading the report".
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
    finding: str = ""

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


def load_kernel(target: str, *, label: str = "kernel") -> Callable[..., Any]:
    """Import ``"MODULE:FUNCTION"`` or ``"path/to/file.py:FUNCTION"`` (``FUNCTION`` may be
    dotted, e.g. ``Class.method``).

    The current folder is put on the import path first (as ``python -m`` does), so a
    kernel in ``./my_kernel.py`` loads as ``my_kernel:attention`` or
    ``./my_kernel.py:attention`` without ``PYTHONPATH``.

    Parameters
    ----------
    target : str
    label : str
        What ``target`` is called in the error messages: ``"kernel"`` (``plsh verify``), or
        the argument the user typed it as (``plsh verify-slopes`` passes ``"function"``).

    Returns
    -------
    callable

    Raises
    ------
    KernelContractError
        If the string is malformed, the module cannot be imported (its exception, or the
        ``sys.exit`` status it called at import time, is named in the message), the
        attribute is missing, or it is not callable.

    References
    ----------
    ``docs/validation.md``, its opening (``plsh verify`` puts the current folder on the import
    path; ``MODULE:FUNCTION`` or a file path).
    """
    if not isinstance(target, str) or target.count(":") != 1 or not all(target.split(":")):
        raise KernelContractError(f"{label}: expected MODULE:FUNCTION, got {target!r}")
    module_name, attr = target.split(":")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    obj = _import_module(module_name, label)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise KernelContractError(f"{label}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        kind = type(obj).__name__
        article = "an" if kind[:1].lower() in "aeiou" else "a"
        raise KernelContractError(f"{label}: {target} is {article} {kind}, not a function")
    return obj


def _import_module(module_name: str, label: str):
    """The module of that name, or of that file path (``./kernel.py``); one-line errors."""
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            path = os.path.abspath(module_name)
            if not os.path.isfile(path):
                raise KernelContractError(f"{label}: no file {module_name!r}")
            name = os.path.splitext(os.path.basename(path))[0]
            spec = cast(Any, importlib.util.spec_from_file_location(name, path))  # a .py file
            module = importlib.util.module_from_spec(spec)
            sys.path.insert(0, os.path.dirname(path))
            sys.modules[name] = module
            spec.loader.exec_module(module)
            return module
        return importlib.import_module(module_name)
    except KernelContractError:
        raise
    except SystemExit as exc:
        raise KernelContractError(
            f"{label}: module {module_name!r} called sys.exit({exc.code!r}) at import time"
        ) from None
    except BaseException as exc:  # noqa: BLE001 - any import-time failure is the user's to fix
        if isinstance(exc, KeyboardInterrupt):
            raise
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise KernelContractError(
            f"{label}: cannot import module {module_name!r}: {type(exc).__name__}: {first}"
        ) from None


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

    References
    ----------
    ``docs/validation.md``, "The kernel contracts".
    """
    if kind not in KINDS:
        raise ValueError(f"kind: must be one of {KINDS}, got {kind!r}")
    if slopes not in SLOPES:
        raise ValueError(f"slopes: must be one of {SLOPES}, got {slopes!r}")
    try:
        sig = inspect.signature(kernel)
    except (TypeError, ValueError):
        return True
    names = _names(kind, slopes) + tuple(
        n for n in ("cu_seqlens", "head_start", "num_heads_total") if n in sig.parameters
    )
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
    """``"given"`` if ``kernel`` takes a ``slopes`` argument (or ``**kwargs``), else ``"standard"``.

    References
    ----------
    ``docs/validation.md``, "The kernel contracts" (the slope mode is read from the signature) and
    "Kernels with their own slopes".
    """
    try:
        params = inspect.signature(kernel).parameters
    except (TypeError, ValueError):
        return "given"
    if "slopes" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return "given"
    return "standard"


def contract_kwargs(
    problem: AttentionProblem,
    *,
    slopes: str = "given",
    attention_mask: bool = True,
    inputs: Any = None,
) -> dict[str, Any]:
    """The keyword arguments a kernel receives for ``problem`` (numpy values).

    Parameters
    ----------
    problem : AttentionProblem
    slopes : {"given", "standard"}
    attention_mask : bool
        Whether the kernel takes ``attention_mask`` (see :func:`check_signature`).
    inputs : dict, optional
        :func:`~plsh_ref.testing.capabilities.optional_inputs` of the kernel: with
        ``varlen``, ``cu_seqlens`` is passed; with ``head_slice``, ``head_start`` and
        ``num_heads_total``.

    Returns
    -------
    dict

    References
    ----------
    ``docs/validation.md``, "The kernel contracts"; SPEC section 5.
    """
    inputs = inputs or {}
    return problem.kernel_kwargs(
        slopes=slopes,
        attention_mask=attention_mask,
        cu_seqlens=bool(inputs.get("varlen")),
        head_slice=bool(inputs.get("head_slice")),
    )


def jax_x64_enabled() -> bool:
    """Whether JAX runs in x64 mode (float64 arrays); False without JAX.

    References
    ----------
    JAX's ``jax_enable_x64`` option;
    ``docs/validation.md``, "Conventions: how to declare each one" (a JAX kernel).
    """
    try:
        import jax
    except ImportError:
        return False
    return bool(jax.config.read("jax_enable_x64"))


#: the message for float64 JAX cases without x64 mode
JAX_X64_MESSAGE = (
    "--dtypes: float64 with --framework jax needs x64 mode: set JAX_ENABLE_X64=1 or call "
    "jax.config.update('jax_enable_x64', True) before the run, or leave float64 out"
)


def _to_jax(kwargs: dict, problem: AttentionProblem):
    import jax.numpy as jnp

    x64 = jax_x64_enabled()
    if problem.dtype == "float64" and not x64:
        raise KernelContractError(JAX_X64_MESSAGE)
    dtype = getattr(jnp, problem.dtype)
    kwargs = dict(kwargs)
    for name in ("query_positions", "key_positions", "attention_mask", "cu_seqlens"):
        if kwargs.get(name) is not None:
            kwargs[name] = jnp.asarray(kwargs[name], dtype=jnp.int64 if x64 else jnp.int32)
    if "slopes" in kwargs:
        kwargs["slopes"] = jnp.asarray(kwargs["slopes"], dtype=jnp.float64 if x64 else jnp.float32)
    q, k, v = (jnp.asarray(x, dtype=dtype) for x in (problem.query, problem.key, problem.value))
    return q, k, v, kwargs


def _to_framework(kwargs: dict, problem: AttentionProblem, framework: str, device: str):
    if framework == "numpy":
        if problem.dtype == "bfloat16":
            raise KernelContractError(
                "dtypes: bfloat16 needs --framework torch or jax (numpy has no bfloat16)"
            )
        return problem.query, problem.key, problem.value, kwargs
    if framework == "jax":
        return _to_jax(kwargs, problem)
    import torch

    tdtype = getattr(torch, problem.dtype)

    def t(x):
        return torch.from_numpy(np.ascontiguousarray(x)).to(device=device, dtype=tdtype)

    kwargs = dict(kwargs)
    for name in ("query_positions", "key_positions", "attention_mask", "cu_seqlens"):
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
    # numpy and jax arrays (a jax bfloat16 array converts exactly, through ml_dtypes)
    return np.asarray(x, dtype=np.float64)


_ARRAY_TYPES = {"numpy": "numpy.ndarray", "torch": "torch.Tensor", "jax": "jax.Array"}


def _is_array(x, framework: str) -> bool:
    if framework == "torch":
        return type(x).__module__.startswith("torch") and hasattr(x, "detach")
    if framework == "jax":
        return type(x).__module__.split(".")[0] in ("jax", "jaxlib") and hasattr(x, "dtype")
    return isinstance(x, np.ndarray)


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
    for name, x in (("output", out), ("lse", lse)):
        if x is not None and not _is_array(x, framework):
            raise KernelContractError(
                f"kernel: returned {name} of type {type(x).__name__}; expected "
                f"{_ARRAY_TYPES[framework]}"
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
    strict_precision: bool = False,
) -> CaseResult:
    """Run ``kernel`` on ``problem`` and compare with the reference (module docstring, step 5).

    Parameters
    ----------
    kernel : callable
        Follows the ``problem.kind`` contract (see :mod:`plsh_ref.testing.reference`).
    problem : AttentionProblem
    framework : {"numpy", "torch", "jax"}
        What the kernel takes and returns. ``torch``: inputs are tensors of the problem's
        dtype on ``device``; slopes float64, positions, ``attention_mask`` and
        ``cu_seqlens`` int64 tensors on ``device``; the partition stays a
        :class:`~plsh_ref.partition.PartitionSample`. ``jax``: jax arrays (float64 and
        int64 only in x64 mode, else float32 slopes and int32 integers).
    device : str
        torch device (``"cpu"``, ``"cuda"``); must be ``"cpu"`` for numpy and jax.
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
    strict_precision : bool
        Fail a float32/float64 case whose error is explained by rounding that grows with
        ``n * slope`` (:data:`PRECISION_FINDING`); by default it passes with the finding.

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
        On an unknown ``framework``/``slopes``, a numpy or jax kernel asked for another
        device, or standard-slopes mode on a problem with random slopes.

    References
    ----------
    SPEC section 6; ``docs/validation.md``, "The tolerance rule".
    """
    slopes, caps, inputs = _case_setup(
        kernel, problem, framework, device, slopes, attention_mask, supports
    )
    missing = _missing_capabilities(problem.spec, caps, inputs, slopes)
    if missing:
        return CaseResult(
            False, float("nan"), 0.0, message=f"unsupported: {', '.join(missing)}", skipped=True
        )
    kwargs = contract_kwargs(
        problem, slopes=slopes, attention_mask=inputs["attention_mask"], inputs=inputs
    )
    q, k, v, kwargs = _to_framework(kwargs, problem, framework, device)
    result, exc, tb = _call(kernel, q, k, v, kwargs, timeout)
    if exc is not None:
        return _raised(exc, tb)
    out, lse = _checked_result(result, problem.spec, q, framework)
    out64 = _as_float64(out, framework)
    lse64 = _as_float64(lse, framework) if lse is not None and caps["lse"] else None
    return _judge(problem, out64, lse64, caps, framework, device, strict_precision)


def _case_setup(kernel, problem, framework, device, slopes, attention_mask, supports):
    """Validated ``(slopes mode, capabilities, optional inputs)`` of one case."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework: must be one of {FRAMEWORKS}, got {framework!r}")
    if framework in ("numpy", "jax") and device != "cpu":
        raise ValueError(f"device: {framework} kernels run on 'cpu', got {device!r}")
    if slopes is None:
        slopes = slope_mode(kernel)
    if slopes not in SLOPES:
        raise ValueError(f"slopes: must be one of {SLOPES}, got {slopes!r}")
    inputs = optional_inputs(kernel)
    if attention_mask is None:
        attention_mask = check_signature(kernel, problem.kind, slopes)
    inputs["attention_mask"] = bool(attention_mask)
    if slopes == "standard" and problem.kind == "alibi" and problem.spec.slopes != "standard":
        raise ValueError("slopes: standard-slopes mode needs problems with standard slopes")
    caps = kernel_capabilities(kernel, supports)
    return slopes, caps, inputs


def _missing_capabilities(spec: ProblemSpec, caps: dict, inputs: dict, slopes: str) -> list[str]:
    """Capabilities (or signature inputs) a problem needs and the kernel lacks."""
    missing = [c for c in required_capabilities(spec) if not caps[c]]
    if spec.positions in PADDED_MODES and not inputs["attention_mask"]:
        missing.append("attention_mask (the kernel takes no attention_mask argument)")
    if spec.positions == "packed" and not inputs["varlen"]:
        missing.append("varlen (the kernel takes no cu_seqlens argument)")
    if spec.num_heads_total and slopes == "standard" and not inputs["head_slice"]:
        missing.append("head_slice (the kernel takes no head_start, num_heads_total arguments)")
    return missing


def _raised(exc: BaseException, tb: str) -> CaseResult:
    first = str(exc).splitlines()[0] if str(exc) else ""
    if isinstance(exc, TimeoutError) and not tb:
        message = f"timed out: {first}"
    else:
        message = f"raised {type(exc).__name__}: {first}"
    return CaseResult(False, float("nan"), 0.0, message=message, traceback=tb)


def _checked_result(result, spec: ProblemSpec, q, framework: str):
    """``(out, lse)`` of the kernel's result, checked against the contract."""
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
    return out, lse


def _plain(problem: AttentionProblem, bias, framework: str, device: str):
    """The yardstick: plain attention with ``bias`` in the problem's dtype."""
    spec = problem.spec
    q, k, v = problem.query, problem.key, problem.value
    if framework == "torch":
        return plain_attention_torch(
            q, k, v, bias, scale=spec.scale, dtype=spec.dtype, device=device
        )
    return plain_attention_numpy(q, k, v, bias, scale=spec.scale, dtype=spec.dtype)


def row_constant_bias(problem: AttentionProblem) -> np.ndarray:
    """The ALiBi bias of a causal problem written as ``m_h (p_j - p_0)`` (``p_0``: the first
    real key of each sequence), float64 ``(batch, num_heads, n_q, n_k)``, ``-inf`` where
    masked.

    Equal to ``-m_h |p_i - p_j|`` up to a constant per query row, so softmax gives the same
    output in real arithmetic; rounded to a dtype, its error grows with ``m_h (p_j - p_0)``,
    i.e. with ``n * slope``. The yardstick of :data:`PRECISION_FINDING`.

    Raises
    ------
    ValueError
        If the problem is not a causal ALiBi problem.

    References
    ----------
    ``docs/validation.md``, "The tolerance rule" (precision findings); SPEC section 1 (the bias).
    """
    spec = problem.spec
    if problem.kind != "alibi" or not spec.causal:
        raise ValueError("problem: the row-constant form holds for causal ALiBi problems only")
    _, kpos, _, k_keep = problem.positions_and_keep()
    big = np.iinfo(np.int64).max
    first = np.where(k_keep, kpos, big).min(axis=1, initial=big)
    first = np.where(first == big, 0, first)
    rel = (kpos - first[:, None]).astype(np.float64)
    bias = problem.slopes[None, :, None, None] * rel[:, None, None, :]
    bias = np.broadcast_to(bias, (spec.batch, spec.num_heads, spec.n_q, spec.n_k))
    return np.where(np.isneginf(problem.log_weight()), -np.inf, bias)


def _judge(problem, out64, lse64, caps, framework, device, strict_precision) -> CaseResult:
    """Compare the kernel's float64 output (and LSE) with the reference under SPEC 6."""
    spec = problem.spec
    ref_out, ref_lse = problem.reference()
    plain_out, plain_lse = _plain(problem, problem.log_weight(), framework, device)
    # Pad query slots of a padded batch are "don't care": compare the real rows only;
    # rows without an admissible key too, for a kernel declaring empty_rows False.
    q_keep = problem.positions_and_keep()[2][:, None, :]
    empty = np.isneginf(ref_lse) & q_keep
    keep = q_keep & ~empty if not caps["empty_rows"] else np.broadcast_to(q_keep, empty.shape)
    out64 = np.where(keep[..., None], out64, 0.0)
    ref_out = np.where(keep[..., None], ref_out, 0.0)
    plain_out = np.where(keep[..., None], plain_out, 0.0)
    error, worst = max_error(out64, ref_out)
    allowed = allowed_error(ref_out, plain_out, spec.dtype)
    messages, finding = [], ""
    if np.any(np.isnan(out64)):
        messages.append(_nan_report(out64, empty))
    elif error > allowed:
        finding = _precision_finding(problem, ref_out, keep, error, framework, device)
        where = f"at {worst}"
        if worst is not None and empty[worst[:3]]:
            where += " (a row without admissible keys: expected output 0)"
        text = f"output error {error:.3g} > allowed {allowed:.3g} {where}"
        if finding and spec.dtype in ("float32", "float64") and not strict_precision:
            finding += f" ({text}; passes: float32 rounding, see the growth with n)"
        elif finding:
            messages.append(f"{finding}: {text}")
        else:
            messages.append(text)
    lse_error = lse_allowed = None
    if lse64 is not None:
        lse_error, lse_allowed, lse_messages = _judge_lse(
            lse64, ref_lse, plain_lse, keep, spec.dtype
        )
        messages += lse_messages
    return CaseResult(
        not messages,
        error,
        allowed,
        worst,
        lse_error,
        lse_allowed,
        "; ".join(messages),
        empty_rows=int(empty.sum()),
        finding=finding,
    )


def _precision_finding(problem, ref_out, keep, error, framework, device) -> str:
    """:data:`PRECISION_FINDING` if the error is within the row-constant yardstick's."""
    if problem.kind != "alibi" or not problem.spec.causal or problem.cu_seqlens is not None:
        return ""
    dtype = problem.spec.dtype
    half = dtype in ("float16", "bfloat16")
    # no np.errstate needed: plain_attention_numpy computes on the bias under its own (an
    # overflowed yardstick warns of nothing), and the torch path raises no numpy warning
    biases = [row_constant_bias(problem)] + ([_rounded_positions_bias(problem)] if half else [])
    for bias in biases:
        yard_out, _ = _plain(problem, bias, framework, device)
        yard_out = np.where(keep[..., None], yard_out, 0.0)
        yard_allowed = allowed_error(ref_out, yard_out, dtype)
        # a yardstick that overflowed (positions beyond float16's range) explains nothing
        if np.isfinite(yard_allowed) and error <= yard_allowed:
            if half:
                return (
                    f"half-precision position arithmetic ({PRECISION_FINDING.split(': ')[1]} "
                    f"or positions held in {dtype})"
                )
            return PRECISION_FINDING
    return ""


def _rounded_positions_bias(problem: AttentionProblem) -> np.ndarray:
    """The ALiBi bias (and causal mask) from positions rounded to the problem's dtype."""
    from .problems import round_to_dtype

    spec = problem.spec
    qpos, kpos, q_keep, k_keep = problem.positions_and_keep()

    def r(p):
        with np.errstate(over="ignore"):
            return round_to_dtype(p.astype(np.float64), spec.dtype).astype(np.float64)

    per = []
    for b in range(spec.batch):
        qp, kp = r(qpos[b]), r(kpos[b])
        with np.errstate(invalid="ignore"):
            bias = -problem.slopes[:, None, None] * np.abs(qp[:, None] - kp[None, :])[None]
        if spec.causal:
            bias = np.where(kp[None, None, :] <= qp[None, :, None], bias, -np.inf)
        per.append(bias)
    keep = q_keep[:, None, :, None] & k_keep[:, None, None, :]
    shape = (spec.batch, spec.num_heads, spec.n_q, spec.n_k)
    bias = np.stack(per) if per else np.zeros(shape)
    return np.where(keep, bias, -np.inf)


def _judge_lse(lse64, ref_lse, plain_lse, keep, dtype):
    """``(error, allowed, messages)`` of the LSE on the compared rows."""
    messages = []
    lse64 = np.where(keep, lse64, ref_lse)
    missed = ~np.isneginf(lse64) & np.isneginf(ref_lse)  # an empty row without -inf
    spurious = np.isneginf(lse64) & ~np.isneginf(ref_lse)  # -inf on a row that has keys
    if np.any(missed):
        bad = tuple(int(i) for i in np.argwhere(missed)[0])
        messages.append(
            f"lse must be -inf on rows without admissible keys ({int(missed.sum())} of them "
            f"are not; first at {bad}: got {lse64[bad]})"
        )
    if np.any(spurious):
        bad = tuple(int(i) for i in np.argwhere(spurious)[0])
        messages.append(
            f"lse is -inf on rows that have admissible keys ({int(spurious.sum())} of them; "
            f"first at {bad}: expected {ref_lse[bad]})"
        )
    neg = np.isneginf(ref_lse)
    ref_finite = np.where(neg, 0.0, ref_lse)
    lse_error, _ = max_error(np.where(neg, 0.0, lse64), ref_finite)
    lse_allowed = allowed_error(ref_finite, np.where(neg, 0.0, plain_lse), dtype)
    if lse_error > lse_allowed:
        messages.append(f"lse error {lse_error:.3g} > allowed {lse_allowed:.3g}")
    return lse_error, lse_allowed, messages


def detect_framework(
    kernel: Callable[..., Any],
    kind: str,
    slopes: str,
    attention_mask: bool,
    timeout: float | None = None,
) -> str:
    """``"numpy"``, ``"torch"`` or ``"jax"``: what the kernel returns on one small float32
    problem.

    numpy inputs are tried first (a JAX kernel given numpy arrays returns jax arrays: it
    is a JAX kernel), then torch (if installed); the first framework whose arrays come
    back is the kernel's.

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

    References
    ----------
    ``docs/validation.md``, its opening (the framework is detected) and
    "Conventions: how to declare each one" (``--framework``).
    """
    tried = []
    candidates = ["numpy"]
    try:
        import torch  # noqa: F401

        candidates.append("torch")
    except ImportError:
        pass
    for framework in candidates:
        found, note = probe_framework(kernel, kind, slopes, attention_mask, framework, timeout)
        if found is not None:
            return found
        tried.append(note)
    raise KernelContractError(
        "framework: cannot tell what the kernel takes ("
        + "; ".join(tried)
        + "); pass --framework numpy, torch or jax"
    )


def probe_framework(
    kernel: Callable[..., Any],
    kind: str,
    slopes: str,
    attention_mask: bool,
    framework: str,
    timeout: float | None = None,
) -> tuple[str | None, str]:
    """Call ``kernel`` once on a small float32 problem in ``framework``'s arrays (CPU).

    Parameters
    ----------
    kernel, kind, slopes, attention_mask, timeout
        As :func:`detect_framework`.
    framework : {"numpy", "torch", "jax"}
        The inputs' framework (torch and jax must be installed for theirs).

    Returns
    -------
    (str or None, str)
        The framework whose arrays came back (``"jax"`` for jax arrays from numpy inputs),
        or ``None`` and what the call did instead (``"with torch inputs it raised ..."``).

    References
    ----------
    ``docs/validation.md``, its opening (the framework is detected) and
    "Conventions: how to declare each one" (``--framework``).
    """
    problem = ProblemSpec(kind=kind, n_q=4, n_k=4, num_heads=2, num_heads_kv=2).build()
    kwargs = contract_kwargs(
        problem, slopes=slopes, attention_mask=attention_mask, inputs=optional_inputs(kernel)
    )
    q, k, v, kw = _to_framework(kwargs, problem, framework, "cpu")
    result, exc, _ = _call(kernel, q, k, v, kw, timeout)
    if exc is not None:
        first = str(exc).splitlines()[0] if str(exc) else ""
        return None, f"with {framework} inputs it raised {type(exc).__name__}: {first}"
    out = result[0] if isinstance(result, (tuple, list)) and result else result
    module = type(out).__module__.split(".")[0]
    if module == framework:
        return framework, ""
    if framework in ("numpy", "jax") and module in ("jax", "jaxlib"):
        return "jax", ""
    return None, f"with {framework} inputs it returned a {type(out).__name__}"
