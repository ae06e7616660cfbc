"""What a kernel supports, what a problem needs, and problems restricted to a kernel.

A kernel declares the inputs it cannot take (``kernel.supports = {"bidirectional": False}``
or ``plsh verify --unsupported bidirectional``); some inputs are read from its signature
(``attention_mask``, ``cu_seqlens``, ``head_start``/``num_heads_total``). Cases are drawn
*within* these capabilities, not drawn and then skipped: :func:`restrict` maps a problem
to the nearest one the kernel supports (a causal problem becomes bidirectional for an
encoder, a prefill becomes a decode step for a decode-only kernel, explicit positions
become the default ones for an index-only kernel) and says which capabilities it had to
change. A battery case whose target was changed is *not covered* and is listed with the
capability that excluded it (:mod:`plsh_ref.testing.battery`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .problems import DTYPES, PADDED_MODES, ProblemSpec


class KernelContractError(ValueError):
    """The kernel cannot be imported, has the wrong signature, or returns the wrong thing.

    The message is one line meant for the user (``plsh verify`` prints it and exits 2).

    References
    ----------
    ``docs/validation.md``: exit status 2, bad input (its opening table and "Reading
    the report").
    """


__all__ = [
    "CAPABILITIES",
    "KernelContractError",
    "SIGNATURE_INPUTS",
    "effective_capabilities",
    "kernel_capabilities",
    "optional_inputs",
    "required_capabilities",
    "restrict",
]

#: what a kernel may declare it does not support (``kernel.supports = {name: False}``);
#: each maps to the problems that need it (:func:`required_capabilities`)
CAPABILITIES = {
    "causal": "causal problems",
    "bidirectional": "bidirectional (non-causal) problems",
    "gqa": "grouped-query heads, num_heads_kv < num_heads",
    "empty": "n_q = 0 or n_k = 0",
    "unequal_lengths": "n_q != n_k (False: a square-only kernel, n_q = n_k)",
    "prefill": "n_q > 1 (False: a decode-only kernel, one query row)",
    "head_dim_v": "value head_dim != query/key head_dim",
    "scale": "a given scale (False: the kernel always uses 1/sqrt(head_dim))",
    "positions": "explicit positions (query_positions / key_positions not None)",
    "batch_positions": "per-sequence positions of shape (batch, n)",
    "attention_mask": "a key-padding attention_mask (batch, n_k)",
    "right_padding": "right-padded batches (pad tokens at the end of each sequence)",
    "varlen": "packed variable-length batches (a cu_seqlens argument)",
    "head_slice": "tensor-parallel head slices (head_start, num_heads_total arguments)",
    "empty_rows": "rows without an admissible key are specified (False: not compared)",
    "lse": "returning the LSE (declare False to skip the LSE comparison only)",
    **{dtype: f"{dtype} inputs" for dtype in DTYPES},
}

#: The capabilities read from the kernel's signature, name -> the parameters it needs.
SIGNATURE_INPUTS = {
    "attention_mask": ("attention_mask",),
    "varlen": ("cu_seqlens",),
    "head_slice": ("head_start", "num_heads_total"),
}


def kernel_capabilities(
    kernel: Callable[..., Any], supports: Mapping[str, bool] | None = None
) -> dict:
    """What ``kernel`` declares it supports: its ``supports`` attribute updated by ``supports``.

    Parameters
    ----------
    kernel : callable
        May carry ``kernel.supports = {"bidirectional": False, ...}``.
    supports : dict, optional
        More declarations (e.g. from ``plsh verify --unsupported``), overriding the
        attribute.

    Returns
    -------
    dict
        ``{name: bool}`` for every name of :data:`CAPABILITIES` (default True).

    Raises
    ------
    KernelContractError
        On an unknown capability name or a value that is not a bool.

    References
    ----------
    ``docs/validation.md``, "Capabilities: declaring what a kernel does not support".
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


def optional_inputs(kernel: Callable[..., Any]) -> dict:
    """Which optional contract inputs ``kernel`` takes, from its signature.

    ``attention_mask`` is taken by a parameter of that name or ``**kwargs``;
    ``cu_seqlens`` and ``head_start``/``num_heads_total`` only by parameters of those
    names (a ``**kwargs`` wrapper that ignores them would fail those cases for nothing).

    Parameters
    ----------
    kernel : callable

    Returns
    -------
    dict
        ``{"attention_mask": bool, "varlen": bool, "head_slice": bool}`` (all True for a
        callable without an inspectable signature, except ``varlen`` and ``head_slice``).

    References
    ----------
    ``docs/validation.md``, "The kernel contracts" (the optional ``attention_mask``,
    ``cu_seqlens``, ``head_start`` and ``num_heads_total`` keywords).
    """
    try:
        params = inspect.signature(kernel).parameters
    except (TypeError, ValueError):
        return {"attention_mask": True, "varlen": False, "head_slice": False}
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
    return {
        "attention_mask": "attention_mask" in params or var_kw,
        "varlen": all(n in params for n in SIGNATURE_INPUTS["varlen"]),
        "head_slice": all(n in params for n in SIGNATURE_INPUTS["head_slice"]),
    }


def effective_capabilities(
    kernel: Callable[..., Any], supports: Mapping[str, bool] | None = None, *, slopes: str = "given"
) -> dict:
    """Declared capabilities (:func:`kernel_capabilities`) and the signature's, combined.

    A capability of :data:`SIGNATURE_INPUTS` holds only if declared (default True) and
    the signature takes its inputs, except ``head_slice`` in given-slopes mode, where the
    kernel receives the slice's slopes and needs no head arguments.

    Parameters
    ----------
    kernel : callable
    supports : dict, optional
    slopes : {"given", "standard"}

    Returns
    -------
    dict
        ``{name: bool}`` for every name of :data:`CAPABILITIES`.

    Raises
    ------
    KernelContractError
        As :func:`kernel_capabilities`.

    References
    ----------
    ``docs/validation.md``, "Capabilities: declaring what a kernel does not support" and
    "Conventions: how to declare each one" (the tensor-parallel head slice).
    """
    caps = kernel_capabilities(kernel, supports)
    takes = optional_inputs(kernel)
    for name in SIGNATURE_INPUTS:
        if name == "head_slice" and slopes == "given":
            continue
        caps[name] = caps[name] and takes[name]
    return caps


def required_capabilities(spec: ProblemSpec) -> list[str]:
    """The capabilities a problem needs (names of :data:`CAPABILITIES`; ``lse`` and
    ``empty_rows`` excluded: those change what is compared, not what runs).

    References
    ----------
    ``docs/validation.md``, "Capabilities: declaring what a kernel does not support".
    """
    need = [spec.dtype, "causal" if spec.causal else "bidirectional"]
    if spec.num_heads_kv < spec.num_heads:
        need.append("gqa")
    if spec.n_q == 0 or spec.n_k == 0:
        need.append("empty")
    if spec.n_q != spec.n_k:
        need.append("unequal_lengths")
    if spec.n_q > 1:
        need.append("prefill")
    if spec.head_dim_v != spec.head_dim:
        need.append("head_dim_v")
    if spec.scale is not None:
        need.append("scale")
    if spec.positions in PADDED_MODES:
        need.append("attention_mask")
    elif spec.positions == "packed":
        need.append("varlen")
    elif spec.positions != "default" or spec.offset:
        need.append("positions")
    if spec.positions == "right_padded":
        need.append("right_padding")
    if spec.positions == "per_sequence":
        need.append("batch_positions")
    if spec.num_heads_total:
        need.append("head_slice")
    return need


def restrict(spec: ProblemSpec, caps: dict) -> tuple[ProblemSpec | None, list[str]]:
    """The nearest problem to ``spec`` that a kernel with capabilities ``caps`` supports.

    Each unsupported input is replaced by the supported one (causal by bidirectional or
    the reverse, grouped heads by one kv head per head, ``n_q`` by 1 or by ``n_k``, empty
    lengths by 1, the value head_dim by the key one, a given scale by the default one,
    explicit or per-sequence positions by the default ones or shared ones, a right-padded
    batch by a left-padded one, a padded one by an unpadded one).

    Parameters
    ----------
    spec : ProblemSpec
    caps : dict
        ``{name: bool}``, as :func:`effective_capabilities` returns.

    Returns
    -------
    (spec, changed) : (ProblemSpec or None, list of str)
        The restricted spec (``None`` if no supported problem is near: its dtype, a
        packed batch or a head slice unsupported) and the capabilities that were changed.

    References
    ----------
    ``docs/validation.md``, "What is run: the battery, then random problems" (restricted to the
    kernel, not skipped).
    """
    changed: list[str] = []
    s = spec

    def change(cap, **fields):
        nonlocal s
        changed.append(cap)
        s = s.replace(**fields)

    if not caps[s.dtype]:
        return None, [s.dtype]
    if s.positions == "packed" and not caps["varlen"]:
        return None, ["varlen"]
    if s.num_heads_total and not caps["head_slice"]:
        return None, ["head_slice"]
    if s.causal and not caps["causal"]:
        change("causal", causal=False)
    elif not s.causal and not caps["bidirectional"]:
        change("bidirectional", causal=True)
    if s.num_heads_kv < s.num_heads and not caps["gqa"]:
        change("gqa", num_heads_kv=s.num_heads)
    if (s.n_q == 0 or s.n_k == 0) and not caps["empty"]:
        change("empty", n_q=max(s.n_q, 1), n_k=max(s.n_k, 1))
    if s.positions == "right_padded" and not caps["right_padding"]:
        change("right_padding", positions="padded")
    if s.positions in PADDED_MODES and not caps["attention_mask"]:
        change("attention_mask", positions="default", pad=0)
    if s.positions == "per_sequence" and not caps["batch_positions"]:
        change("batch_positions", positions="explicit")
    if (s.positions in ("explicit", "left_padding", "per_sequence") or s.offset) and not caps[
        "positions"
    ]:
        fields: dict[str, Any] = {"offset": 0}
        if s.positions not in PADDED_MODES:
            fields.update(positions="default", pad=0)
        change("positions", **fields)
    if s.n_q > 1 and not caps["prefill"]:
        if s.positions == "packed":
            return None, ["prefill"]
        change("prefill", n_q=1, n_k=max(s.n_k, 2))
    if s.n_q != s.n_k and not caps["unequal_lengths"]:
        n = 1 if not caps["prefill"] else s.n_k
        change("unequal_lengths", n_q=n, n_k=n)
    if s.head_dim_v != s.head_dim and not caps["head_dim_v"]:
        change("head_dim_v", head_dim_v=s.head_dim)
    if s.scale is not None and not caps["scale"]:
        change("scale", scale=None)
    return s, changed
