"""Adapters: turn the forms ALiBi code really takes into kernels ``plsh verify`` can check.

Real implementations rarely have the kernel contract of :mod:`plsh_ref.testing.reference`.
Three adapters cover the common forms, each in a few lines of user code:

* :func:`from_bias_builder`: a function returning the additive ALiBi bias, as BLOOM's
  and Falcon's ``build_alibi_tensor``, MPT's ``build_mpt_alibi_tensor`` and
  x-transformers' ``AlibiPositionalBias`` do. The adapter calls it with the arguments it
  asks for by name, applies the causal and padding masks itself (by position), and runs
  plain softmax attention in the input dtype as HF eager attention does (logits and bias
  in the input dtype, softmax in float32).
* :func:`from_score_mod`: a FlexAttention ``score_mod(score, b, h, q_idx, kv_idx)`` (or a
  factory building one from the problem), evaluated on the whole score tensor at once
  with broadcast index tensors, which is what ``score_mod`` means elementwise.
* :func:`from_hf_attention`: an HF attention function with the ``AttentionInterface``
  signature ``(module, query, key, value, attention_mask, scaling, dropout, **kwargs) ->
  (output (batch, n_q, heads, head_dim_v), weights)``, given an additive 4-D mask that
  holds the ALiBi bias (as BLOOM and Falcon fold it into the mask).

Each adapter returns a torch kernel for ``--slopes standard`` (no ``slopes`` argument:
the wrapped code computes its own) or ``--slopes given``, taking ``attention_mask``. Rows
without an admissible key are set to output 0 (HF leaves them unspecified). The adapters
validate the wrapped code, not themselves: their own masking and softmax are the plain
ones of SPEC section 6. torch is imported when a kernel runs, never at import time.

Arguments a bias builder or score_mod factory may ask for (by parameter name):
``num_heads``, ``batch``, ``n_q``, ``n_k`` (also ``sequence_length``), ``slopes``
(float64 tensor, given mode only), ``query_positions``, ``key_positions`` (int64
``(batch, n)``), ``attention_mask`` (int64 ``(batch, n_k)``, all ones without padding),
``dtype``, ``device``.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["from_bias_builder", "from_hf_attention", "from_score_mod"]

_CONTEXT_NAMES = (
    "num_heads",
    "batch",
    "n_q",
    "n_k",
    "sequence_length",
    "slopes",
    "query_positions",
    "key_positions",
    "attention_mask",
    "dtype",
    "device",
)


def _context(query, key, slopes, query_positions, key_positions, attention_mask):
    """Per-sequence positions and masks of one call, as int64 torch tensors."""
    import torch

    batch, num_heads, n_q = query.shape[:3]
    n_k = key.shape[2]
    device = query.device
    if key_positions is None:
        key_positions = torch.arange(n_k, device=device)
    if query_positions is None:
        query_positions = torch.arange(n_q, device=device) + (n_k - n_q)
    qpos = query_positions.to(device, torch.int64).expand(batch, n_q)
    kpos = key_positions.to(device, torch.int64).expand(batch, n_k)
    if attention_mask is None:
        mask = torch.ones(batch, n_k, dtype=torch.int64, device=device)
    else:
        mask = attention_mask.to(device, torch.int64)
    return {
        "num_heads": num_heads,
        "batch": batch,
        "n_q": n_q,
        "n_k": n_k,
        "sequence_length": n_k,
        "slopes": slopes,
        "query_positions": qpos,
        "key_positions": kpos,
        "attention_mask": mask,
        "dtype": query.dtype,
        "device": device,
    }


def _call_with_context(fn, context):
    """Call ``fn`` with the context entries its signature names (all, for ``**kwargs``)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn(**context)
    wanted = {name: context[name] for name in params if name in context}
    missing = [
        name
        for name, p in params.items()
        if name not in context and p.default is p.empty and p.kind is not p.VAR_POSITIONAL
    ]
    if missing:
        raise TypeError(
            f"adapter: cannot supply argument(s) {missing}; known: {', '.join(_CONTEXT_NAMES)}"
        )
    return fn(**wanted)


def _admissible(context, causal):
    """bool ``(batch, 1, n_q, n_k)``: causal by position and not a pad key."""
    qpos, kpos = context["query_positions"], context["key_positions"]
    ok = (context["attention_mask"] != 0)[:, None, None, :]
    if causal:
        ok = ok & (kpos[:, None, None, :] <= qpos[:, None, :, None])
    return ok


def _as_bias(bias, context):
    """The builder's bias as ``(batch, heads, n_q, n_k)`` (BLOOM's ``(batch*heads, 1, n_k)`` too)."""
    import torch

    batch, h, n_q, n_k = (context[k] for k in ("batch", "num_heads", "n_q", "n_k"))
    bias = torch.as_tensor(bias)
    if bias.ndim == 3 and bias.shape[0] == batch * h and batch * h != h:
        bias = bias.reshape(batch, h, bias.shape[1], bias.shape[2])
    while bias.ndim < 4:
        bias = bias[None]
    return bias.expand(batch, h, n_q, n_k)


def _expand_kv(x, num_heads):
    return x.repeat_interleave(num_heads // x.shape[1], dim=1)


def _attend(query, key, value, bias, admissible, scale):
    """HF-eager-style attention in the input dtype; rows without a key give 0."""
    import torch

    num_heads = query.shape[1]
    k, v = _expand_kv(key, num_heads), _expand_kv(value, num_heads)
    if scale is None:
        scale = query.shape[-1] ** -0.5
    logits = (query @ k.transpose(-1, -2)) * scale + bias.to(query.dtype)
    logits = logits.masked_fill(~admissible, float("-inf"))
    empty = ~admissible.any(dim=-1, keepdim=True)
    weights = torch.softmax(logits.float(), dim=-1).to(query.dtype)
    weights = weights.masked_fill(empty, 0.0)
    return weights @ v


def _kernel(run, slopes: str, supports, name):
    """A kernel with the standard- or given-slopes signature around ``run(..., slopes)``."""
    if slopes not in ("standard", "given"):
        raise ValueError(f"slopes: must be 'standard' or 'given', got {slopes!r}")
    if slopes == "standard":

        def kernel(
            query, key, value, *, causal, scale, query_positions, key_positions, attention_mask=None
        ):
            return run(
                query,
                key,
                value,
                None,
                causal,
                scale,
                query_positions,
                key_positions,
                attention_mask,
            )

    else:

        def kernel(  # type: ignore[misc]  # the given-slopes contract: another signature
            query,
            key,
            value,
            *,
            slopes,
            causal,
            scale,
            query_positions,
            key_positions,
            attention_mask=None,
        ):
            return run(
                query,
                key,
                value,
                slopes,
                causal,
                scale,
                query_positions,
                key_positions,
                attention_mask,
            )

    kernel.__name__ = kernel.__qualname__ = name
    kernel.supports = dict(supports or {})  # type: ignore[attr-defined]  # read by the suite
    return kernel


def from_bias_builder(
    build: Callable[..., Any],
    *,
    slopes: str = "standard",
    supports: Mapping[str, bool] | None = None,
    name: str | None = None,
) -> Callable[..., Any]:
    """A kernel from a function returning the additive ALiBi bias.

    Parameters
    ----------
    build : callable
        Called with the context arguments it names (module docstring); returns a tensor
        broadcastable to ``(batch, num_heads, n_q, n_k)``, or ``(batch * num_heads, n_q or
        1, n_k)`` as BLOOM's ``build_alibi_tensor``. Biases that are right only up to a
        constant per query row (BLOOM's ``m_h * p_j``, MPT's) are fine: softmax does not
        see the constant (the LSE would, so the kernel returns the output only).
    slopes : {"standard", "given"}
        ``standard``: the builder computes its own slopes (the kernel takes no
        ``slopes``); ``given``: the builder asks for ``slopes``.
    supports : dict, optional
        Capabilities of the builder (:data:`plsh_ref.testing.capabilities.CAPABILITIES`), e.g.
        ``{"bidirectional": False, "positions": False}`` for BLOOM, whose bias assumes
        causal attention and positions ``0..n-1`` of each sequence.
    name : str, optional
        Name of the kernel in reports.

    Returns
    -------
    callable
        A torch kernel ``f(query, key, value, *, [slopes,] causal, scale, query_positions,
        key_positions, attention_mask=None) -> output``.

    Raises
    ------
    TypeError
        If ``build`` is not callable.
    ValueError
        On an unknown ``slopes``.

    Examples
    --------
    >>> from transformers.models.bloom.modeling_bloom import build_alibi_tensor  # doctest: +SKIP
    >>> bloom = from_bias_builder(build_alibi_tensor,
    ...                           supports={"bidirectional": False, "positions": False})  # doctest: +SKIP

    References
    ----------
    ``docs/validation.md``, "Adapters for the forms real code takes" (a bias builder);
    the form of BLOOM's and Falcon's ``build_alibi_tensor`` (``transformers``).
    """
    if not callable(build):
        raise TypeError(f"build: must be callable, got {type(build).__name__}")

    def run(query, key, value, slope_values, causal, scale, qpos, kpos, mask):
        context = _context(query, key, slope_values, qpos, kpos, mask)
        bias = _as_bias(_call_with_context(build, context), context)
        return _attend(query, key, value, bias, _admissible(context, causal), scale)

    return _kernel(run, slopes, supports, name or getattr(build, "__name__", "bias_builder"))


def from_score_mod(
    score_mod: Callable[..., Any] | None = None,
    *,
    factory: Callable[..., Any] | None = None,
    slopes: str = "standard",
    flex: bool = False,
    supports: Mapping[str, bool] | None = None,
    name: str | None = None,
) -> Callable[..., Any]:
    """A kernel from a FlexAttention ``score_mod`` (or a factory building one per problem).

    ``score_mod(score, b, h, q_idx, kv_idx)`` is applied to the float32 score tensor
    ``scale * q k^T`` of shape ``(batch, heads, n_q, n_k)`` with index tensors shaped
    ``(batch, 1, 1, 1)``, ``(1, heads, 1, 1)``, ``(1, 1, n_q, 1)``, ``(1, 1, 1, n_k)``;
    ``q_idx``/``kv_idx`` are indices ``0..n-1``, as in FlexAttention, not positions. A
    ``factory`` receives the context arguments it names (module docstring), e.g.
    ``query_positions``, and returns a ``score_mod`` that may close over them. The causal
    and padding masks are applied by the adapter (FlexAttention's ``mask_mod``).

    Parameters
    ----------
    score_mod : callable, optional
    factory : callable, optional
        Exactly one of ``score_mod`` and ``factory``.
    slopes, supports, name
        As :func:`from_bias_builder`.
    flex : bool
        Run the real ``torch.nn.attention.flex_attention.flex_attention`` (eager) with the
        ``score_mod`` and a ``mask_mod`` for the causal and padding masks, instead of the
        broadcast evaluation.

    Returns
    -------
    callable
        A torch kernel (output only).

    Raises
    ------
    TypeError
        If neither or both of ``score_mod`` and ``factory`` are given, or not callable, or
        ``flex`` is not a bool.
    ValueError
        On an unknown ``slopes``.

    References
    ----------
    ``docs/validation.md``, "Adapters for the forms real code takes" (a FlexAttention
    ``score_mod``); ``torch.nn.attention.flex_attention.flex_attention``.
    """
    if (score_mod is None) == (factory is None):
        raise TypeError("score_mod: give exactly one of score_mod and factory")
    fn = score_mod if score_mod is not None else factory
    if not callable(fn):
        raise TypeError(f"score_mod: must be callable, got {type(fn).__name__}")
    if not isinstance(flex, bool):
        raise TypeError(f"flex: must be a bool, got {type(flex).__name__}")

    def run(query, key, value, slope_values, causal, scale, qpos, kpos, mask):
        import torch

        context = _context(query, key, slope_values, qpos, kpos, mask)
        mod = score_mod if score_mod is not None else _call_with_context(factory, context)
        if flex:
            return _flex(query, key, value, mod, context, causal, scale)
        batch, h, n_q, n_k = (context[k] for k in ("batch", "num_heads", "n_q", "n_k"))
        dev = query.device
        k = _expand_kv(key, h).float()
        c = query.shape[-1] ** -0.5 if scale is None else scale
        score = (query.float() @ k.transpose(-1, -2)) * c
        idx = [
            torch.arange(batch, device=dev).view(-1, 1, 1, 1),
            torch.arange(h, device=dev).view(1, -1, 1, 1),
            torch.arange(n_q, device=dev).view(1, 1, -1, 1),
            torch.arange(n_k, device=dev).view(1, 1, 1, -1),
        ]
        score = torch.as_tensor(mod(score, *idx)).float().expand(batch, h, n_q, n_k)
        admissible = _admissible(context, causal)
        score = score.masked_fill(~admissible, float("-inf"))
        empty = ~admissible.any(dim=-1, keepdim=True)
        weights = torch.softmax(score, dim=-1).masked_fill(empty, 0.0)
        return (weights @ _expand_kv(value, h).float()).to(query.dtype)

    return _kernel(run, slopes, supports, name or getattr(fn, "__name__", "score_mod"))


def _flex(query, key, value, mod, context, causal, scale):
    """The real FlexAttention (eager) with a mask_mod for causal-by-position and padding."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    qpos, kpos = context["query_positions"], context["key_positions"]
    keep = context["attention_mask"] != 0
    batch, h, n_q, n_k = (context[k] for k in ("batch", "num_heads", "n_q", "n_k"))
    if n_q == 0 or n_k == 0:
        return query.new_zeros(batch, h, n_q, value.shape[3])

    def mask_mod(b, hh, q_idx, kv_idx):
        ok = keep[b, kv_idx]
        if causal:
            ok = ok & (kpos[b, kv_idx] <= qpos[b, q_idx])
        return ok

    block_mask = create_block_mask(mask_mod, batch, None, n_q, n_k, device=str(query.device))
    with warnings.catch_warnings():
        # eager FlexAttention warns that it is unfused; the values are what is checked
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        out = flex_attention(
            query,
            key,
            value,
            score_mod=mod,
            block_mask=block_mask,
            scale=scale,
            enable_gqa=key.shape[1] != h,
        )
    empty = ~_admissible(context, causal).any(dim=-1, keepdim=True)
    return out.masked_fill(empty, 0.0)


class _AttentionModule:
    """The attributes HF attention functions read from their ``module`` argument."""

    def __init__(self, num_key_value_groups: int):
        self.num_key_value_groups = num_key_value_groups
        self.is_causal = False
        self.training = False


def from_hf_attention(
    attention_fn: Callable[..., Any],
    *,
    slopes: str = "given",
    bias_builder: Callable[..., Any] | None = None,
    supports: Mapping[str, bool] | None = None,
    name: str | None = None,
) -> Callable[..., Any]:
    """A kernel from an HF attention function (``AttentionInterface`` signature).

    The function is called as ``attention_fn(module, query, key, value, attention_mask,
    scaling=scale, dropout=0.0)`` with ``attention_mask`` the additive float mask
    ``(batch, 1 or heads, n_q, n_k)`` in the input dtype holding the ALiBi bias and
    ``torch.finfo(dtype).min`` at masked pairs (how HF models pass ALiBi), and ``module``
    an object with ``num_key_value_groups``, ``is_causal = False`` and ``training =
    False``. Its output ``(batch, n_q, heads, head_dim_v)`` is transposed back.

    Parameters
    ----------
    attention_fn : callable
        E.g. ``transformers.integrations.sdpa_attention.sdpa_attention_forward`` or a
        model's ``eager_attention_forward``.
    slopes : {"given", "standard"}
        ``given``: the mask's ALiBi bias uses the slopes the kernel receives;
        ``standard``: Press et al.'s, or the ``bias_builder``'s own.
    bias_builder : callable, optional
        Builds the ALiBi part of the mask (as in :func:`from_bias_builder`); default
        ``-m_h |p_i - p_j|`` from the slopes, in float32 before the cast.
    supports, name
        As :func:`from_bias_builder`.

    Returns
    -------
    callable
        A torch kernel (output only).

    Raises
    ------
    TypeError
        If ``attention_fn`` is not callable.
    ValueError
        On an unknown ``slopes``.

    References
    ----------
    ``docs/validation.md``, "Adapters for the forms real code takes" (an HF attention
    function); the ``transformers.AttentionInterface`` signature.
    """
    if not callable(attention_fn):
        raise TypeError(f"attention_fn: must be callable, got {type(attention_fn).__name__}")

    def run(query, key, value, slope_values, causal, scale, qpos, kpos, mask):
        import torch

        context = _context(query, key, slope_values, qpos, kpos, mask)
        if bias_builder is not None:
            bias = _as_bias(_call_with_context(bias_builder, context), context)
        else:
            if slope_values is None:
                from ..alibi import alibi_slopes

                slope_values = torch.from_numpy(alibi_slopes(context["num_heads"]))
            distance = (
                context["query_positions"][:, None, :, None]
                - context["key_positions"][:, None, None, :]
            ).abs()
            m = slope_values.to(query.device, torch.float32)[None, :, None, None]
            bias = -m * distance.to(torch.float32)
        admissible = _admissible(context, causal)
        additive = bias.to(query.dtype).masked_fill(~admissible, torch.finfo(query.dtype).min)
        module = _AttentionModule(query.shape[1] // key.shape[1])
        c = query.shape[-1] ** -0.5 if scale is None else scale
        if key.shape[2] == 0:
            return query.new_zeros(*query.shape[:3], value.shape[3])
        out = attention_fn(module, query, key, value, additive, scaling=c, dropout=0.0)
        out = out[0] if isinstance(out, (tuple, list)) else out
        out = out.transpose(1, 2)
        empty = ~admissible.any(dim=-1, keepdim=True)
        return out.masked_fill(empty, 0.0)

    label = name or getattr(attention_fn, "__name__", "hf_attention")
    return _kernel(run, slopes, supports, label)
