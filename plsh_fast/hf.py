"""Hugging Face transformers integration: ``attn_implementation="plsh"`` and ``"alibi"``.

Importing this module registers two attention implementations with
``transformers.AttentionInterface`` (and a matching mask builder with
``transformers.masking_utils.AttentionMaskInterface``):

* ``"plsh"``: PLSH attention (:func:`plsh_fast.plsh_attention`) with one partition sample
  per layer, drawn from a model-level seed and the layer index
  (:func:`plsh_ref.partition.derived_seed`), slopes from the model's head count (Press et al.);
* ``"alibi"``: exact ALiBi attention with the same slopes and positions (the reference the
  paper approximates), through ``scaled_dot_product_attention`` with a dense bias.

Models that dispatch attention through the interface (Llama, Mistral, Qwen2/3 and most
decoder-only models of transformers 5; the class flag ``_supports_attention_backend``) can
then be built or switched with ``attn_implementation="plsh"``. :func:`set_alibi_attention`
also removes the rotary embedding in the chosen layers (as Llama-4 does in its NoPE
layers), which turns a RoPE model into an ALiBi/PLSH one; with ``kernels=`` (one
:mod:`plsh_ref.kernels` Pólya kernel per head, stored as ``config.plsh_kernels``) it
approximates their bias (KERPLE, mixtures) instead of ALiBi's. :func:`swap_bloom_attention`,
:func:`swap_falcon_attention` and :func:`swap_mpt_attention` replace the attention of
models whose ALiBi is built into their attention modules (BLOOM, Falcon's ``alibi=True``
layout, MPT). Each attention layer keeps its CPU plans in its own
:class:`plsh_fast.cpu.PlanCache` and the counts of its short (dense) calls in its own
:class:`plsh_fast.dense.DenseCountCache` (:func:`prepare_layer`). :class:`PLSHCache` is a
transformers ``Cache`` for ``generate()`` with one
:class:`plsh_fast.decoding.PLSHDecodingCache` per layer: it evicts the keys no later query
can reach (``proofs_notes/decoding_cache.md``), decodes on that cache's ring and reports
its a-priori error bound against exact ALiBi (:meth:`PLSHCache.error_bound`).

Positions follow transformers' convention for padded batches: the position of a token is
the number of real tokens before it (``attention_mask.cumsum(-1) - 1``), so a left-padded
sequence gets exactly the bins and output of the same sequence unpadded (as BLOOM builds
its ALiBi). The model's ``position_ids`` are not used by the attention; with
:class:`PLSHCache`, which evicts by ``position_ids``, they must agree with the mask on real
tokens (``generate()`` makes them so; checked, ``ValueError`` otherwise). Attention dropout is not supported (``ValueError`` when it would apply).

References
----------
Wolfson & Wagner (2026), *Positional LSH*, section 5 (ALiBi and PLSH in pretrained Llama /
Mistral models, Qwen3 trained with them); Press et al. (2022) for the slopes; SPEC
section 5 for the padding conventions.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from plsh_ref.alibi import alibi_slopes
from plsh_ref.partition import DEFAULT_NUM_SAMPLES, PartitionSample, derived_seed, draw_partition
from plsh_ref.validation import check_bool, check_num_samples, check_scale

from ._partition import partition_tensors
from .api import plsh_attention
from .cpu import PlanCache, use_plan_cache
from .decoding import DecodingErrorBound, PLSHDecodingCache, cache_bound
from .dense import DenseCountCache, alibi_bias, expand_kv, use_dense_cache
from .nn import check_kernel_heads, has_torch_bias, kernel_bias, resolve_seed

try:  # transformers is an optional dependency (extra "hf")
    from transformers import AttentionInterface
    from transformers.cache_utils import Cache, DynamicLayer
    from transformers.masking_utils import AttentionMaskInterface
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "plsh_fast.hf needs transformers: pip install -e '.[hf]' in the positional-lsh checkout"
    ) from exc

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = [
    "ATTN_IMPLEMENTATIONS",
    "PLSHCache",
    "PLSHCacheLayer",
    "alibi_attention_forward",
    "kernels_from_config",
    "kernels_to_config",
    "layer_partition",
    "plsh_attention_forward",
    "prepare_layer",
    "register",
    "set_alibi_attention",
    "swap_bloom_attention",
    "swap_falcon_attention",
    "swap_mpt_attention",
]

#: the attention implementations this module registers
ATTN_IMPLEMENTATIONS = ("plsh", "alibi")

#: the model-level seed that set_alibi_attention and swap_bloom_attention used by default
#: before seed=None drew one (pass seed=DEFAULT_SEED for the old partitions)
DEFAULT_SEED = 0


def layer_seed(seed: int, layer: int) -> int:
    """Seed of layer ``layer``'s partition: :func:`plsh_ref.partition.derived_seed` ``(seed, layer)``.

    References
    ----------
    ``docs/huggingface.md`` (layer ``l`` draws with ``derived_seed(seed, l)``); SPEC section 5
    (distinct partitions per layer from one model-level seed).
    """
    return derived_seed(seed, layer)


# --------------------------------------------------------------------------- positions
def _padding_mask(attention_mask, batch: int, n_k: int, device) -> torch.Tensor:
    """The 2-D keep-mask ``(batch, total)`` of every token seen so far (``total >= n_k``)."""
    if attention_mask is None:
        return torch.ones((batch, n_k), dtype=torch.bool, device=device)
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2:
        shape = getattr(attention_mask, "shape", None)
        raise ValueError(
            "attention_mask: the 'plsh'/'alibi' attention needs the 2-D padding mask (batch, "
            f"tokens) that its registered mask builder makes, got shape {shape}; a model "
            "that builds its own 4-D mask is not supported (see swap_bloom_attention)"
        )
    mask = attention_mask.to(device=device, dtype=torch.bool)
    if mask.shape[0] != batch or mask.shape[1] < n_k:
        raise ValueError(
            f"attention_mask: shape {tuple(mask.shape)} cannot cover batch {batch} with {n_k} keys"
        )
    return mask


def _positions(mask: torch.Tensor, n_q: int, n_k: int, key=None, partition=None):
    """Key/query positions and the key keep-mask from the 2-D padding mask.

    The keys are the last ``n_k`` tokens seen and the queries the last ``n_q`` of them (as in
    transformers' caches); positions are ``cumsum(mask) - 1``. Keys handed out by a
    :class:`PLSHCache` carry the positions the cache evicted with; they must agree.
    """
    pos = mask.to(torch.int64).cumsum(-1) - 1
    kpos, kmask = pos[:, -n_k:], mask[:, -n_k:]
    qpos = kpos[:, -n_q:] if n_q else kpos[:, :0]
    if torch.compiler.is_compiling():
        # a traced forward reads keys from transformers' own caches (PLSHCache evicts by
        # data-dependent slot counts and runs eagerly); the checks below read host objects
        return qpos, kpos, kmask
    cached = getattr(key, "plsh_positions", None)
    held = getattr(key, "plsh_partition", None)
    if partition is not None and held is not None and held is not partition and held != partition:
        raise ValueError(
            "partition: the PLSHCache layer holding these keys was built for another partition "
            "than the attention module's (rebuild the cache after changing partitions)"
        )
    if cached is not None and (
        tuple(cached.shape) != tuple(kpos.shape) or bool((cached != kpos)[kmask].any())
    ):
        raise ValueError(
            "position_ids: the positions PLSHCache evicted with differ from those implied by "
            "attention_mask (real tokens before each token); pass position_ids = "
            "attention_mask.cumsum(-1) - 1, as generate() does"
        )
    return qpos, kpos, kmask


# --------------------------------------------------------------------------- partitions
def kernels_to_config(kernels: Iterable[Any]) -> list[dict[str, Any]]:
    """The heads' kernels as the JSON-ready list stored as ``config.plsh_kernels``.

    One dict per head: ``{"kernel": <class name>, <field>: <value>, ...}`` with the fields of
    the :mod:`plsh_ref.kernels` dataclass (a ``Mixture``'s ``kernels`` as such dicts, its
    ``weights`` as a list), so ``save_pretrained`` writes them and
    :func:`kernels_from_config` rebuilds equal kernels.

    Parameters
    ----------
    kernels : sequence of plsh_ref.kernels.DistanceKernel
        Built-in kernels (``Exponential``, ``KerpleLog``, ``KerplePower``, ``Mixture`` of
        them; :func:`plsh_fast.nn.has_torch_bias`).

    Returns
    -------
    list of dict

    Raises
    ------
    ValueError
        A kernel of one's own (a config stores kernels by name and parameters; message
        starts with ``kernels``).

    References
    ----------
    ``docs/kernels.md``, "In torch modules and Hugging Face models"
    (``config.plsh_kernels``); SPEC section 8.
    """
    out = []
    for h, kernel in enumerate(kernels):
        if not has_torch_bias(kernel):
            raise ValueError(
                f"kernels: head {h}: {type(kernel).__name__} cannot be stored in the model "
                "config (built-in Exponential, KerpleLog, KerplePower and Mixture only)"
            )
        out.append(_kernel_dict(kernel))
    return out


def _kernel_dict(kernel) -> dict[str, Any]:
    entry: dict[str, Any] = {"kernel": type(kernel).__name__}
    for field in dataclasses.fields(kernel):
        value = getattr(kernel, field.name)
        if field.name == "kernels":
            value = [_kernel_dict(c) for c in value]
        elif isinstance(value, tuple):
            value = [float(x) for x in value]
        entry[field.name] = value
    return entry


def kernels_from_config(entries: Iterable[Any]) -> tuple:
    """The kernels of ``config.plsh_kernels`` (:func:`kernels_to_config`'s list).

    Parameters
    ----------
    entries : sequence of dict

    Returns
    -------
    tuple of plsh_ref.kernels.DistanceKernel

    Raises
    ------
    ValueError
        An entry that is not a dict naming a built-in kernel with its parameters (message
        starts with ``config.plsh_kernels``); bad parameters (from the kernel classes).

    References
    ----------
    ``docs/kernels.md``, "In torch modules and Hugging Face models"
    (``config.plsh_kernels``); SPEC section 8.
    """
    from plsh_ref import kernels as K  # noqa: PLC0415 (the classes, by name)

    classes = {c.__name__: c for c in (K.Exponential, K.KerpleLog, K.KerplePower, K.Mixture)}

    def build(entry):
        if not isinstance(entry, dict) or entry.get("kernel") not in classes:
            raise ValueError(
                "config.plsh_kernels: each entry must be a dict with 'kernel' one of "
                f"{sorted(classes)} and its parameters, got {entry!r}"
            )
        params = {k: v for k, v in entry.items() if k != "kernel"}
        if entry["kernel"] == "Mixture":
            params["kernels"] = [build(c) for c in params.get("kernels", ())]
        try:
            return classes[entry["kernel"]](**params)
        except TypeError as exc:
            raise ValueError(f"config.plsh_kernels: {entry!r}: {exc}") from None

    if isinstance(entries, (str, bytes, dict)) or not hasattr(entries, "__iter__"):
        raise ValueError(f"config.plsh_kernels: must be a list of dicts, got {entries!r}")
    return tuple(build(e) for e in entries)


def _config_law(config, num_heads: int) -> Any:
    """What a layer's partition is drawn from: ``config.plsh_kernels``, or ALiBi's sigma."""
    entries = getattr(config, "plsh_kernels", None)
    if entries is None:
        return 1.0 / alibi_slopes(num_heads)
    return list(check_kernel_heads(kernels_from_config(entries), num_heads))


def layer_partition(module: torch.nn.Module, num_heads: int) -> PartitionSample:
    """The partition sample of one attention module, drawn on first use if it has none.

    Parameters
    ----------
    module : torch.nn.Module
        A transformers attention module with a ``layer_idx``. :func:`set_alibi_attention`
        sets ``module.plsh_partition``; otherwise one is drawn with ``num_samples`` /
        ``seed`` from the model config's ``plsh_num_samples`` / ``plsh_seed`` for layer
        ``module.layer_idx`` (defaults: 16, and a model-level seed drawn once by
        :func:`plsh_fast.nn.resolve_seed` and written to the config as ``plsh_seed``, the
        package's seed policy), from the kernels of ``config.plsh_kernels``
        (:func:`kernels_from_config`; :func:`plsh_ref.partition.draw_partition`
        ``(kernels, ...)``) when the config has them.
    num_heads : int
        The query head count (slopes: :func:`plsh_ref.alibi.alibi_slopes` ``(num_heads)``;
        the number of kernels).

    Returns
    -------
    PartitionSample
        ``(num_heads, num_samples)``.

    Raises
    ------
    ValueError
        If the module has no ``layer_idx`` and no partition (per-layer partitions need
        one), or its partition has another head count; ``config.plsh_kernels`` not
        ``num_heads`` valid kernels.

    References
    ----------
    ``docs/huggingface.md``, "A RoPE model turned into an ALiBi/PLSH model" (``config.plsh_seed``,
    ``config.plsh_num_samples``); ``CONTRIBUTING.md``, "Seeds (one policy)".
    """
    part = getattr(module, "plsh_partition", None)
    if part is None:
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            raise ValueError(
                "module: an attention module without layer_idx needs set_alibi_attention() "
                "to give it a partition"
            )
        config = getattr(module, "config", None)
        law = _config_law(config, num_heads)  # checked before the seed is drawn
        s = int(getattr(config, "plsh_num_samples", DEFAULT_NUM_SAMPLES))
        seed = getattr(config, "plsh_seed", None)
        if seed is None:
            seed = resolve_seed(None)
            if config is not None:
                config.plsh_seed = seed  # every layer of the model shares it
        seed = int(seed)
        part = draw_partition(law, s, layer_seed(seed, int(layer)))
        cast(Any, module).plsh_partition = part
    if part.num_heads != num_heads:
        raise ValueError(
            f"module: its partition has {part.num_heads} heads, the attention {num_heads}"
        )
    return part


def _module_device(module) -> torch.device:
    """The device of a module's first parameter (CPU for a module without any)."""
    for param in module.parameters():
        return param.device
    return torch.device("cpu")


def prepare_layer(
    module: torch.nn.Module, num_heads: int, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Everything a traced ``"plsh"`` forward reads from a layer, computed outside the trace.

    The partition sample (:func:`layer_partition`, drawn if missing), its ``pitch`` and
    ``offset`` as float64 tensors on ``device`` and its reach
    (:func:`plsh_fast.decoding.cache_bound`) are stored on the module as
    ``module.plsh_prepared``; the attention function reads them there under
    ``torch.compile`` (no host arrays, no comparison of partitions and no NumPy inside the
    graph). :func:`set_alibi_attention`, :func:`swap_bloom_attention`,
    :func:`swap_falcon_attention`, :func:`swap_mpt_attention` and every eager forward call
    it; an eager call after ``module.plsh_partition`` was replaced prepares the new one.

    It also gives the module its own kept-plan cache, ``module.plsh_plan_cache`` (a
    :class:`plsh_fast.cpu.PlanCache`, as :class:`plsh_fast.nn.PLSHAttention` owns one):
    eager CPU calls of the layer keep their plans there, each layer within
    ``plsh_fast.cpu.PLAN_CACHE_BYTES``, so that the layers of a model do not evict each
    other's plans from one shared budget; and its own dense-count cache,
    ``module.plsh_dense_cache`` (a :class:`plsh_fast.dense.DenseCountCache`), for the calls
    below ``plsh_fast.dense.DENSE_CROSSOVER``. A new partition empties both. (A traced
    forward runs the compiled operators, which keep plans and counts process-wide.)

    Parameters
    ----------
    module : torch.nn.Module
        An attention module (as :func:`layer_partition`).
    num_heads : int
        Query head count.
    device : torch.device, optional
        Of the tensors; default the module's (its first parameter's) device.

    Returns
    -------
    (pitch, offset, bound) : tuple
        float64 ``(num_heads, num_samples)`` tensors and an int.

    Raises
    ------
    ValueError
        As :func:`layer_partition`.

    References
    ----------
    ``docs/huggingface.md``, "Compiling: one graph, every length", "Kept plans, one cache per layer"
    and "Kept counts, one cache per layer".
    """
    part = layer_partition(module, num_heads)
    device = _module_device(module) if device is None else torch.device(device)
    prepared = getattr(module, "plsh_prepared", None)
    plans = getattr(module, "plsh_plan_cache", None)
    if not isinstance(plans, PlanCache):
        plans = PlanCache()
        setattr(module, "plsh_plan_cache", plans)  # noqa: B010 (not a module or buffer)
    counts = getattr(module, "plsh_dense_cache", None)
    if not isinstance(counts, DenseCountCache):
        counts = DenseCountCache()
        setattr(module, "plsh_dense_cache", counts)  # noqa: B010 (not a module or buffer)
    if prepared is None or prepared[0] is not part or prepared[1].device != device:
        if prepared is not None and prepared[0] is not part:
            plans.clear()  # the old partition's plans are never hit again
            counts.clear()  # nor its counts
        pitch, offset = partition_tensors(part, device)
        prepared = (part, pitch, offset, cache_bound(part))
        setattr(module, "plsh_prepared", prepared)  # noqa: B010 (not a registered buffer)
    return prepared[1:]


def _layer_plsh_attention(module, query, key, value, pitch, offset, **kwargs) -> torch.Tensor:
    """:func:`plsh_fast.plsh_attention` on the layer's partition, keeping CPU plans and dense
    counts in the layer's own ``plsh_plan_cache`` / ``plsh_dense_cache``
    (:func:`prepare_layer`) when eager."""
    plans = None if torch.compiler.is_compiling() else getattr(module, "plsh_plan_cache", None)
    counts = getattr(module, "plsh_dense_cache", None) if plans is not None else None
    if plans is None or counts is None:  # traced: the compiled operators keep them process-wide
        return cast(
            torch.Tensor, plsh_attention(query, key, value, partition=(pitch, offset), **kwargs)
        )
    with use_plan_cache(plans), use_dense_cache(counts):
        return cast(
            torch.Tensor, plsh_attention(query, key, value, partition=(pitch, offset), **kwargs)
        )


def _module_slopes(module, num_heads: int) -> torch.Tensor:
    """float64 CPU tensor of the slopes of ``num_heads`` heads, kept on the module.

    Made on the first eager call (or at set-up) from :func:`plsh_ref.alibi.alibi_slopes`,
    so that a traced forward reads a tensor, not a (read-only) NumPy array.
    """
    slopes = getattr(module, "plsh_slopes", None)
    if slopes is None or slopes.shape[0] != num_heads:
        slopes = torch.tensor(alibi_slopes(num_heads), dtype=torch.float64)
        if not torch.compiler.is_compiling():
            module.plsh_slopes = slopes
    return slopes


def _traced_layer_state(module, device):
    """``(pitch, offset, bound)`` prepared by :func:`prepare_layer` (under ``torch.compile``)."""
    prepared = getattr(module, "plsh_prepared", None)
    if prepared is None:
        raise ValueError(
            "module: this layer's partition is not prepared; call set_alibi_attention(model, "
            "'plsh') (or swap_bloom_attention / one eager forward) before torch.compile"
        )
    _, pitch, offset, bound = prepared
    return pitch.to(device), offset.to(device), bound


# --------------------------------------------------------------------------- attention
def _check_dropout(module, dropout):
    if dropout and float(dropout) > 0.0 and getattr(module, "training", False):
        raise ValueError(
            f"dropout: attention dropout ({dropout}) is not supported by the 'plsh'/'alibi' "
            "attention; set the config's attention_dropout to 0"
        )


def plsh_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function ``"plsh"`` (the ``AttentionInterface`` signature).

    Parameters
    ----------
    module : torch.nn.Module
        The calling attention module (``layer_idx``, ``is_causal``, ``config``).
    query : torch.Tensor
        ``(batch, num_heads, n_q, head_dim)``.
    key, value : torch.Tensor
        ``(batch, num_heads_kv, n_k, head_dim)``: the cache contents plus the new tokens.
    attention_mask : torch.Tensor or None
        The 2-D keep-mask ``(batch, tokens seen)`` of the registered mask builder.
    scaling : float, optional
        Logit scale (default ``1 / sqrt(head_dim)``).
    dropout : float
        Must be 0 while training (not supported).
    **kwargs
        ``sliding_window`` (transformers' window, Mistral/Qwen3): accepted when no key
        outside it can share a bin with the query (``cache_bound(partition) <=
        sliding_window``), refused otherwise. The rest is ignored (``position_ids``
        included: positions come from the mask).

    Returns
    -------
    (attn_output, None)
        ``attn_output`` is ``(batch, n_q, num_heads, head_dim_v)``, as transformers expects.

    Raises
    ------
    ValueError
        A 4-D mask, keys from a :class:`PLSHCache` whose positions disagree with the mask,
        attention dropout, a ``sliding_window`` narrower than the partition's reach.

    Notes
    -----
    Keys staged by a :class:`PLSHCacheLayer` (a :class:`PLSHCache` in ``generate()``) are
    the new tokens only: that layer attends them (:meth:`PLSHCacheLayer.attend`, its
    decoding cache's ring for a decode step). Otherwise the call is
    :func:`plsh_fast.plsh_attention` over all keys, keeping CPU plans in the layer's own
    ``plsh_plan_cache`` when eager (:func:`prepare_layer`).

    References
    ----------
    Wolfson & Wagner (2026), Theorem 2.2; SPEC section 5 (padding).
    """
    _check_dropout(module, dropout)
    batch, num_heads, n_q, _ = query.shape
    n_k = key.shape[2]
    mask = _padding_mask(attention_mask, batch, n_k, query.device)
    if torch.compiler.is_compiling():
        pitch, offset, bound = _traced_layer_state(module, query.device)
        part = None
    else:
        pitch, offset, bound = prepare_layer(module, num_heads, query.device)
        part = module.plsh_partition
    _check_sliding_window(kwargs.get("sliding_window"), bound)
    qpos, kpos, kmask = _positions(mask, n_q, n_k, key, part)
    causal = bool(getattr(module, "is_causal", True))
    layer = None if torch.compiler.is_compiling() else getattr(key, "plsh_cache_layer", None)
    if layer is not None:  # the new tokens staged by a PLSHCache layer: it attends them
        out = layer.attend(query, key, value, attention_mask=kmask, scale=scaling, causal=causal)
    else:
        out = _layer_plsh_attention(
            module,
            query,
            key,
            value,
            pitch,
            offset,
            causal=causal,
            scale=scaling,
            query_positions=qpos,
            key_positions=kpos,
            attention_mask=kmask,
        )
    return out.transpose(1, 2).contiguous(), None  # return_lse=False


def _check_sliding_window(window, bound: int):
    """PLSH with a sliding window: accepted only where the window cannot change a count.

    A nonzero count needs a shared bin, so ``p_query - p_key <= cache_bound(part) - 1``
    (``proofs_notes/decoding_cache.md``; ``bound`` is ``cache_bound`` of the layer's
    partition); with ``bound <= window`` every such key is inside
    transformers' window (``p_query - p_key < window``) and the window is a no-op. A
    narrower window is refused: PLSH attention has no per-query key window, and ignoring it
    made generate() (whose cache keeps only the window) disagree with the full forward.
    """
    if window is None:
        return
    if bound > int(window):
        raise ValueError(
            f"sliding_window: {window} is narrower than this layer's PLSH reach ({bound} "
            "positions, cache_bound of its partition); set config.sliding_window = None "
            "(or use larger windows / smaller pitches)"
        )


def _check_not_evicting(key):
    if getattr(key, "plsh_partition", None) is not None:
        raise ValueError(
            "key: comes from a PLSHCache, whose evicted keys exact ALiBi still weights; "
            "use DynamicCache with the 'alibi' attention"
        )


def _alibi_core(
    query, key, value, slopes, qpos, kpos, kmask, causal, scaling, window=None, kernels=None
):
    """Exact ALiBi through SDPA with a dense bias; rows without keys give 0.

    ``window``: transformers' sliding window, key kept iff ``p_query - p_key < window``.
    ``kernels``: one kernel per head, whose bias ``log k`` replaces ALiBi's (``slopes``
    unused).
    """
    batch, num_heads, n_q, head_dim = query.shape
    if kernels is None:
        bias = alibi_bias(slopes, qpos, kpos, causal=False, dtype=torch.float32)
    else:
        bias = kernel_bias(kernels, qpos, kpos, causal=False, dtype=torch.float32)
    keep = kmask[:, None, None, :]
    if causal:
        keep = keep & (kpos[:, None, None, :] <= qpos[:, None, :, None])
    if window is not None:
        keep = keep & (kpos[:, None, None, :] > qpos[:, None, :, None] - int(window))
    bias = bias.masked_fill(~keep, -math.inf)
    empty = ~keep.any(dim=-1, keepdim=True)
    bias = bias.masked_fill(empty, 0.0).to(query.dtype)
    k, v = expand_kv(key, num_heads), expand_kv(value, num_heads)
    scale = check_scale(None, head_dim) if scaling is None else float(scaling)
    out = torch.nn.functional.scaled_dot_product_attention(query, k, v, attn_mask=bias, scale=scale)
    return out.masked_fill(empty, 0.0)


def alibi_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function ``"alibi"``: exact ALiBi, same conventions as ``"plsh"``.

    Arguments, returns and errors as :func:`plsh_attention_forward`; the bias is
    ``-m_h |p_i - p_j|`` with the slopes of :func:`plsh_ref.alibi.alibi_slopes`
    ``(num_heads)`` (Press et al. 2022; SPEC section 1). Keys from a :class:`PLSHCache`
    are refused (``ValueError`` naming ``key``): exact ALiBi still weights the keys it evicted.
    A ``sliding_window`` keyword (Mistral, Qwen3) is honoured: key kept iff
    ``p_query - p_key < sliding_window``, as transformers' own masks and its sliding cache.
    With kernels per head (:func:`set_alibi_attention` ``kernels=``, ``config.plsh_kernels``)
    the bias is theirs, ``log k_h(|p_i - p_j|)`` (:func:`plsh_fast.nn.kernel_bias`): the exact
    attention that ``"plsh"`` then approximates.
    """
    _check_dropout(module, dropout)
    if not torch.compiler.is_compiling():
        _check_not_evicting(key)
    batch, num_heads, n_q, _ = query.shape
    n_k = key.shape[2]
    mask = _padding_mask(attention_mask, batch, n_k, query.device)
    qpos, kpos, kmask = _positions(mask, n_q, n_k, key)
    out = _alibi_core(
        query,
        key,
        value,
        _module_slopes(module, num_heads),
        qpos,
        kpos,
        kmask,
        bool(getattr(module, "is_causal", True)),
        scaling,
        kwargs.get("sliding_window"),
        kernels=_module_kernels(module, num_heads),
    )
    return out.transpose(1, 2).contiguous(), None


def _module_kernels(module, num_heads: int):
    """The layer's kernels (``module.plsh_kernels``, else ``config.plsh_kernels``) or None."""
    kernels = getattr(module, "plsh_kernels", None)
    entries = getattr(getattr(module, "config", None), "plsh_kernels", None)
    if kernels is None and entries is not None:
        if torch.compiler.is_compiling():
            raise ValueError(
                "config.plsh_kernels: this layer's kernels are not prepared; call "
                "set_alibi_attention(model, 'alibi', kernels=...) (or one eager forward) "
                "before torch.compile"
            )
        kernels = check_kernel_heads(kernels_from_config(entries), num_heads)
        module.plsh_kernels = kernels
    return kernels


def _padding_mask_builder(
    batch_size,
    q_length,
    kv_length,
    q_offset=0,
    kv_offset=0,
    attention_mask=None,
    device="cpu",
    **kwargs,
):
    """Mask builder for ``"plsh"``/``"alibi"``: the 2-D keep-mask of every token seen."""
    total = kv_offset + kv_length  # no int(): symbolic under torch.compile(dynamic=True)
    if attention_mask is None:
        return torch.ones((batch_size, total), dtype=torch.bool, device=device)
    if attention_mask.dim() != 2:  # (a 4-D mask reaches no builder: transformers keeps it)
        raise ValueError(
            "attention_mask: the 'plsh'/'alibi' attention needs the 2-D padding mask (batch, "
            f"tokens), got shape {tuple(attention_mask.shape)}"
        )
    mask = attention_mask.to(dtype=torch.bool)
    if mask.shape[-1] < total:  # tokens beyond the given mask (e.g. a static cache) are absent
        mask = torch.nn.functional.pad(mask, (0, total - mask.shape[-1]))
    return mask[:, :total]


def register() -> None:
    """Register ``"plsh"`` and ``"alibi"`` with transformers (done on import; idempotent).

    References
    ----------
    ``transformers.AttentionInterface.register`` and
    ``transformers.masking_utils.AttentionMaskInterface.register``; ``docs/huggingface.md``.
    """
    AttentionInterface.register("plsh", plsh_attention_forward)
    AttentionInterface.register("alibi", alibi_attention_forward)
    AttentionMaskInterface.register("plsh", _padding_mask_builder)
    AttentionMaskInterface.register("alibi", _padding_mask_builder)


register()


# --------------------------------------------------------------------------- model set-up
def _attention_modules(model):
    """``(layer_idx, module)`` of every attention module that uses the interface."""
    found = []
    for module in model.modules():
        if hasattr(module, "layer_idx") and any(
            hasattr(module, name) for name in ("q_proj", "qkv_proj", "query_key_value")
        ):
            found.append((int(module.layer_idx), module))
    return found


def _identity_rope(module, args, kwargs):
    pe = kwargs.get("position_embeddings")
    if pe is not None:
        cos, sin = pe
        kwargs["position_embeddings"] = (torch.ones_like(cos), torch.zeros_like(sin))
    return args, kwargs


def set_alibi_attention(
    model: PreTrainedModel,
    attn_implementation: str = "plsh",
    *,
    layers: Iterable[int] | None = None,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    seed: int | None = None,
    kernels: Any = None,
    remove_rope: bool = True,
) -> PreTrainedModel:
    """Switch a transformers model to ALiBi/PLSH attention; optionally drop its RoPE.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A model whose attention goes through ``AttentionInterface``
        (``_supports_attention_backend``), e.g. Llama, Mistral, Qwen3.
    attn_implementation : {"plsh", "alibi"}
        Set on the whole model (``model.set_attn_implementation``).
    layers : iterable of int, optional
        Layers whose rotary embedding is removed (default: all). Layers outside it keep RoPE
        and still use the chosen attention (ALiBi on top of RoPE).
    num_samples : int
        ``s`` of every layer's partition (``"plsh"``).
    seed : int, optional
        Model-level seed; layer ``l`` draws with ``layer_seed(seed, l)``; written to the
        config as ``plsh_seed`` / ``plsh_num_samples``. ``None``: drawn once from torch's
        default generator (:func:`plsh_fast.nn.resolve_seed`; it was 0 before, pass
        ``seed=0`` for the old partitions).
    kernels : sequence of plsh_ref.kernels.DistanceKernel, optional
        One Pólya kernel per query head (``config.num_attention_heads`` of them), in place
        of ALiBi (``proofs_notes/general_kernels.md``): layer ``l``'s partition is
        :func:`plsh_ref.partition.draw_partition` ``(kernels, num_samples, layer_seed(seed,
        l))``, ``"alibi"`` becomes exact attention with their bias ``log k_h``, and the
        kernels are written to the config as ``plsh_kernels`` (:func:`kernels_to_config`;
        a model saved with them draws the same partitions when loaded with
        ``attn_implementation="plsh"``). Built-in kernels only (``Exponential``,
        ``KerpleLog``, ``KerplePower``, ``Mixture``: a config stores them by name).
        ``None`` (default): ALiBi, as before (an earlier ``plsh_kernels`` is cleared).
    remove_rope : bool
        Remove the rotary embedding in ``layers`` (forward pre-hook that makes the rotation
        the identity: ``cos = 1``, ``sin = 0``).

    Returns
    -------
    model
        The same model, modified in place. Each attention module gets ``plsh_partition``.

    Raises
    ------
    ValueError
        An unknown ``attn_implementation``; a model that does not use the attention
        interface or has no recognisable attention modules; a layer index out of range;
        ``num_samples`` outside ``[1, MAX_NUM_SAMPLES]`` or a negative ``seed``
        (:mod:`plsh_ref.validation`); ``kernels`` not one valid built-in kernel per head
        (:func:`plsh_fast.nn.check_kernel_heads`; message starts with ``kernels``).
    TypeError
        Non-integer ``num_samples``/``seed``/``layers``, non-bool ``remove_rope``;
        ``kernels`` not a sequence of kernels.

    References
    ----------
    Wolfson & Wagner (2026), section 5; Llama 4's NoPE layers for removing RoPE per layer.

    Examples
    --------
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> import plsh_fast.hf as plsh_hf
    >>> config = LlamaConfig(
    ...     vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4,
    ... )
    >>> model = plsh_hf.set_alibi_attention(LlamaForCausalLM(config), "plsh", num_samples=8, seed=0)
    >>> model.config._attn_implementation
    'plsh'
    >>> model(torch.randint(0, 64, (1, 10))).logits.shape
    torch.Size([1, 10, 64])
    """
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation: must be one of {ATTN_IMPLEMENTATIONS}, got {attn_implementation!r}"
        )
    remove_rope = check_bool("remove_rope", remove_rope)
    num_samples = check_num_samples(num_samples)
    stored = None
    if kernels is not None:  # checked before the seed is drawn
        kernels = check_kernel_heads(kernels, int(model.config.num_attention_heads))
        stored = kernels_to_config(kernels)
    seed = resolve_seed(seed)
    if not getattr(type(model), "_supports_attention_backend", False):
        raise ValueError(
            f"model: {type(model).__name__} does not dispatch attention through "
            "transformers.AttentionInterface (use swap_bloom_attention for BLOOM)"
        )
    modules = _attention_modules(model)
    if not modules:
        raise ValueError(f"model: no attention modules with a layer_idx in {type(model).__name__}")
    all_layers = sorted({i for i, _ in modules})
    chosen = set(all_layers) if layers is None else set()
    if layers is not None:
        if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
            raise TypeError(f"layers: must be an iterable of ints, got {type(layers).__name__}")
        for layer in layers:
            if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)):
                raise TypeError(f"layers: must hold ints, got {type(layer).__name__}")
            if int(layer) not in all_layers:
                raise ValueError(f"layers: {layer} is not a layer of the model ({all_layers})")
            chosen.add(int(layer))
    config = model.config
    config.plsh_seed = int(seed)
    config.plsh_num_samples = int(num_samples)
    if stored is not None or getattr(config, "plsh_kernels", None) is not None:
        config.plsh_kernels = stored  # only a model given kernels gets the entry
    num_heads = int(config.num_attention_heads)
    law = 1.0 / alibi_slopes(num_heads) if kernels is None else list(kernels)
    for layer, module in modules:
        module.plsh_partition = draw_partition(law, int(num_samples), layer_seed(int(seed), layer))
        module.plsh_kernels = kernels
        prepare_layer(module, num_heads)
        _module_slopes(module, num_heads)
        old = getattr(module, "_plsh_rope_hook", None)
        if old is not None:
            old.remove()
            module._plsh_rope_hook = None
        if remove_rope and layer in chosen:
            module._plsh_rope_hook = module.register_forward_pre_hook(
                _identity_rope, with_kwargs=True
            )
    model.set_attn_implementation(attn_implementation)
    return model


# --------------------------------------------------------------------------- built-in ALiBi
def _swapped_attention(self, query, key, value, keep_all, layer_past, scale, num_heads):
    """The attention of a module with built-in ALiBi (BLOOM, Falcon, MPT), swapped.

    ``query``/``key``/``value`` ``(batch, heads, n_q, head_dim)`` are the new tokens',
    ``keep_all`` ``(batch, columns)`` the keep-mask of the model's own mask row of the
    newest query, whose last ``n_q`` columns are the new tokens (its columns are the
    tokens the cache reports, :meth:`PLSHCacheLayer.get_mask_sizes`). Positions are
    ``cumsum(keep) - 1`` (as the models' ALiBi tensors), continued from the cache's newest
    position once a :class:`PLSHCacheLayer` holds tokens; the cache is updated here with
    them as ``position_ids``. Returns ``(batch, num_heads, n_q, head_dim_v)``.
    """
    n_q = query.shape[2]
    tracing = torch.compiler.is_compiling()
    plsh_layer = None
    if layer_past is not None and self.layer_idx < len(getattr(layer_past, "layers", [])):
        candidate = layer_past.layers[self.layer_idx]
        plsh_layer = candidate if isinstance(candidate, PLSHCacheLayer) else None
    new_keep = keep_all[:, -n_q:]
    if plsh_layer is not None and plsh_layer.decoder.batch_size:
        # tokens were seen: positions continue each sequence's newest one
        last = plsh_layer.decoder.last_positions().to(keep_all.device)
        new_pos = last[:, None] + new_keep.to(torch.int64).cumsum(-1)
    else:  # nothing seen yet: the mask covers every token
        new_pos = (keep_all.to(torch.int64).cumsum(-1) - 1)[:, -n_q:]
    if layer_past is not None:
        key, value = layer_past.update(key, value, self.layer_idx, kwargs={"position_ids": new_pos})
    n_k = key.shape[2]
    staged = None if tracing else getattr(key, "plsh_cache_layer", None)
    if self.plsh_attn_implementation == "alibi":
        if not tracing:
            _check_not_evicting(key)
        kpos = (keep_all.to(torch.int64).cumsum(-1) - 1)[:, -n_k:]
        kmask = keep_all[:, -n_k:]
        slopes = _module_slopes(self, num_heads)
        return _alibi_core(query, key, value, slopes, kpos[:, -n_q:], kpos, kmask, True, scale)
    if tracing:
        pitch, offset, _ = _traced_layer_state(self, query.device)
    else:
        pitch, offset, _ = prepare_layer(self, num_heads, query.device)
        held = getattr(key, "plsh_partition", None)
        if held is not None and held is not self.plsh_partition and held != self.plsh_partition:
            raise ValueError(
                "partition: the PLSHCache was built for another partition of this layer"
            )
    if staged is not None:  # the new tokens staged by a PLSHCache layer: it attends them
        return staged.attend(query, key, value, attention_mask=new_keep, scale=scale, causal=True)
    kpos = (keep_all.to(torch.int64).cumsum(-1) - 1)[:, -n_k:]
    return _layer_plsh_attention(
        self,
        query,
        key,
        value,
        pitch,
        offset,
        causal=True,
        scale=scale,
        query_positions=kpos[:, -n_q:],
        key_positions=kpos,
        attention_mask=keep_all[:, -n_k:],
    )


def _keep_from_additive_mask(attention_mask, batch, n_q, layer_past, layer_idx, device):
    """Keep-mask of the newest query's row of a model's 4-D mask (bool True = keep, or
    additive: kept entries above the dtype's minimum); all True without a mask."""
    if attention_mask is None:
        seen = layer_past.get_seq_length(layer_idx) if layer_past is not None else 0
        return torch.ones((batch, n_q + seen), dtype=torch.bool, device=device)
    last = attention_mask[:, 0, -1, :]
    return last if last.dtype == torch.bool else last > torch.finfo(last.dtype).min


def _check_swap(model, attn_implementation, num_samples, seed, cls, name):
    """Argument checks of the swaps; the modules of class ``cls`` (``ValueError`` if none)."""
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation: must be one of {ATTN_IMPLEMENTATIONS}, got {attn_implementation!r}"
        )
    num_samples = check_num_samples(num_samples)
    seed = resolve_seed(seed)
    found: list[Any] = [m for m in model.modules() if isinstance(m, cls)]
    if not found:
        raise ValueError(f"model: no {name} modules in {type(model).__name__}")
    return num_samples, seed, found


def _swap_module(module, attn_implementation, slopes, num_samples, seed, num_heads, forward):
    """Give one module its slopes, partition (drawn with ``sigma = 1 / slopes``, layer
    seed), prepared state and swapped ``forward``."""
    setattr(module, "plsh_attn_implementation", attn_implementation)  # noqa: B010
    setattr(module, "plsh_slopes", torch.tensor(slopes, dtype=torch.float64))  # noqa: B010
    partition = draw_partition(
        1.0 / np.asarray(slopes, dtype=np.float64),
        int(num_samples),
        layer_seed(int(seed), int(module.layer_idx)),
    )
    setattr(module, "plsh_partition", partition)  # noqa: B010
    prepare_layer(module, num_heads)
    module.forward = types.MethodType(forward, module)


# --------------------------------------------------------------------------- BLOOM
def _bloom_forward(
    self,
    hidden_states,
    residual,
    alibi,
    attention_mask,
    layer_past=None,
    use_cache=False,
    output_attentions=False,
    **kwargs,
):
    """BloomAttention.forward with the attention itself replaced by ALiBi/PLSH."""
    batch, n_q, _ = hidden_states.shape
    fused = self.query_key_value(hidden_states)
    query, key, value = self._reshape(fused)  # (batch, heads, n, head_dim)
    if attention_mask is None:
        keep_all = _keep_from_additive_mask(
            None, batch, n_q, layer_past, self.layer_idx, hidden_states.device
        )
    else:  # BLOOM's mask: 0 where kept (bool masks: True = keep)
        last = attention_mask[:, 0, -1, :]
        keep_all = last if last.dtype == torch.bool else last == 0
    if self.training and self.attention_dropout.p > 0:
        raise ValueError("dropout: attention dropout is not supported by the swapped attention")
    out = _swapped_attention(
        self, query, key, value, keep_all, layer_past, self.inv_norm_factor, self.num_heads
    )
    context = out.transpose(1, 2).reshape(batch, n_q, self.hidden_size)
    output = self.dense(context)
    output = torch.nn.functional.dropout(output, p=self.hidden_dropout, training=self.training)
    return output + residual, None


def swap_bloom_attention(
    model: PreTrainedModel,
    attn_implementation: str = "plsh",
    *,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    seed: int | None = None,
) -> PreTrainedModel:
    """Replace the built-in ALiBi attention of a BLOOM model by ``"plsh"`` or exact ``"alibi"``.

    BLOOM adds ``slope * key_position`` inside its attention module (a row shift of
    ``-slope |i - j|``, the same causal softmax) instead of dispatching through
    ``AttentionInterface``; this rebinds each ``BloomAttention.forward`` to one that keeps the
    projections, cache and dropout of the original and computes the attention with
    :func:`plsh_fast.plsh_attention` (per-layer partitions) or exact ALiBi. Positions come from
    BLOOM's padding mask (``cumsum - 1``, as its ``build_alibi_tensor``).

    Parameters
    ----------
    model : transformers.BloomForCausalLM or transformers.BloomModel
    attn_implementation : {"plsh", "alibi"}
    num_samples, seed : int
        As :func:`set_alibi_attention`.

    Returns
    -------
    model
        Modified in place.

    Raises
    ------
    ValueError
        Unknown ``attn_implementation``; no ``BloomAttention`` in the model; tensor-parallel
        checkpoints with ``pretraining_tp > 1`` and ``slow_but_exact`` (not supported);
        ``num_samples`` outside ``[1, MAX_NUM_SAMPLES]`` or a negative ``seed``.
    TypeError
        Non-integer ``num_samples``/``seed``.

    References
    ----------
    Le Scao et al. (2022), BLOOM; Press et al. (2022); Wolfson & Wagner (2026).
    """
    from transformers.models.bloom.modeling_bloom import BloomAttention

    num_samples, seed, found = _check_swap(
        model, attn_implementation, num_samples, seed, BloomAttention, "BloomAttention"
    )
    for module in found:
        if module.pretraining_tp > 1 and module.slow_but_exact:
            raise ValueError("model: pretraining_tp > 1 with slow_but_exact is not supported")
    for module in found:
        slopes = alibi_slopes(module.num_heads)
        _swap_module(
            module, attn_implementation, slopes, num_samples, seed, module.num_heads, _bloom_forward
        )
    return model


# --------------------------------------------------------------------------- Falcon
def _falcon_forward(
    self,
    hidden_states,
    alibi,
    attention_mask,
    position_ids=None,
    layer_past=None,
    use_cache=False,
    output_attentions=False,
    position_embeddings=None,
    **kwargs,
):
    """FalconAttention.forward (``alibi=True`` layout) with the attention replaced by ALiBi/PLSH."""
    fused = self.query_key_value(hidden_states)
    num_kv_heads = self.num_heads if self.new_decoder_architecture else self.num_kv_heads
    query, key, value = self._split_heads(fused)
    batch, n_q = query.shape[:2]
    query = query.transpose(1, 2).reshape(batch, self.num_heads, n_q, self.head_dim)
    key = key.transpose(1, 2).reshape(batch, num_kv_heads, n_q, self.head_dim)
    value = value.transpose(1, 2).reshape(batch, num_kv_heads, n_q, self.head_dim)
    # Falcon's 4-D float mask (ALiBi folded in): masked entries hold the dtype's minimum
    keep_all = _keep_from_additive_mask(
        attention_mask, batch, n_q, layer_past, self.layer_idx, hidden_states.device
    )
    if self.training and self.attention_dropout.p > 0:
        raise ValueError("dropout: attention dropout is not supported by the swapped attention")
    out = _swapped_attention(
        self, query, key, value, keep_all, layer_past, self.inv_norm_factor, self.num_heads
    )
    context = out.transpose(1, 2).reshape(batch, n_q, self.num_heads * self.head_dim)
    return self.dense(context), None


def swap_falcon_attention(
    model: PreTrainedModel,
    attn_implementation: str = "plsh",
    *,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    seed: int | None = None,
) -> PreTrainedModel:
    """Replace the built-in ALiBi of a Falcon model (``config.alibi=True``) by ``"plsh"``/``"alibi"``.

    Falcon's ``alibi=True`` layout adds ``slope_h * p_key`` to the logits *before* the
    ``1 / sqrt(head_dim)`` scaling (in its eager path; its SDPA path folds the same, divided by
    ``sqrt(head_dim)``, into the mask), so its effective ALiBi slopes are
    ``m_h / sqrt(head_dim)`` with ``m_h`` of :func:`plsh_ref.alibi.alibi_slopes`: ``"alibi"``
    uses them (exact ALiBi; it reproduces the model's logits wherever Falcon's bfloat16
    product ``slope * position`` is exact, e.g. power-of-two head counts and positions below
    256, tested), ``"plsh"`` draws each layer's partition with ``sigma_h = sqrt(head_dim) /
    m_h``. Projections, the fused QKV layout (multi-query, new decoder architecture) and the
    cache are Falcon's; positions come from the padding mask (``cumsum - 1``, as Falcon's
    ``build_alibi_tensor``).

    Parameters
    ----------
    model : transformers.FalconForCausalLM or transformers.FalconModel
        With ``config.alibi=True``.
    attn_implementation : {"plsh", "alibi"}
    num_samples, seed : int
        As :func:`set_alibi_attention`.

    Returns
    -------
    model
        Modified in place.

    Raises
    ------
    ValueError
        Unknown ``attn_implementation``; no ``FalconAttention``; a model without ALiBi
        (``config.alibi=False``: a RoPE Falcon, use :func:`set_alibi_attention` semantics
        instead); ``num_samples`` outside ``[1, MAX_NUM_SAMPLES]``, a negative ``seed``.
    TypeError
        Non-integer ``num_samples``/``seed``.

    References
    ----------
    Almazrouei et al. (2023), Falcon; Press et al. (2022); Wolfson & Wagner (2026).
    """
    from transformers.models.falcon.modeling_falcon import FalconAttention

    num_samples, seed, found = _check_swap(
        model, attn_implementation, num_samples, seed, FalconAttention, "FalconAttention"
    )
    if not getattr(model.config, "alibi", False):
        raise ValueError("model: config.alibi is False (a RoPE Falcon has no ALiBi to swap)")
    for module in found:
        slopes = alibi_slopes(module.num_heads) * module.inv_norm_factor
        _swap_module(
            module,
            attn_implementation,
            slopes,
            num_samples,
            seed,
            module.num_heads,
            _falcon_forward,
        )
    return model


# --------------------------------------------------------------------------- MPT
def _mpt_forward(
    self, hidden_states, position_bias=None, cache=None, attention_mask=None, **kwargs
):
    """MptAttention.forward with the attention replaced by ALiBi/PLSH (MPT's own ALiBi
    tensor ``position_bias`` is not read)."""
    batch, n_q = hidden_states.shape[:2]
    fused = self.Wqkv(hidden_states)
    if self.clip_qkv:
        fused = fused.clamp(min=-self.clip_qkv, max=self.clip_qkv)
    query, key, value = (
        t.reshape(batch, n_q, self.n_heads, self.head_dim).transpose(1, 2)
        for t in fused.chunk(3, dim=2)
    )
    if attention_mask is None:
        keep_all = _keep_from_additive_mask(
            None, batch, n_q, cache, self.layer_idx, hidden_states.device
        )
    else:  # MPT's boolean mask: True where masked
        keep_all = ~attention_mask[:, 0, -1, :].to(torch.bool)
    if self.training and self.attn_dropout_p > 0:
        raise ValueError("dropout: attention dropout is not supported by the swapped attention")
    out = _swapped_attention(
        self, query, key, value, keep_all, cache, float(self.softmax_scale), self.n_heads
    )
    context = out.transpose(1, 2).reshape(batch, n_q, self.hidden_size)
    return self.out_proj(context), None


def swap_mpt_attention(
    model: PreTrainedModel,
    attn_implementation: str = "plsh",
    *,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    seed: int | None = None,
    alibi_bias_max: float = 8.0,
) -> PreTrainedModel:
    """Replace the built-in ALiBi of an MPT model by ``"plsh"`` or exact ``"alibi"``.

    MPT adds ``slope_h * (p_key - const)`` to the scaled logits (a constant per query row,
    the same causal softmax as ``-slope_h |p_i - p_j|``), with the slopes of MPT's
    ``build_mpt_alibi_tensor``: ``2^(-B (h+1) / H')`` over the next power of two ``H' >=
    H``, interleaved as ``[1::2] + [::2]`` when ``H`` is not a power of two. That is Press
    et al.'s rule with maximum bias ``B`` (:func:`plsh_ref.alibi.alibi_slopes` ``(H,
    max_bias=B)``, tested entry by entry against MPT's function). transformers' ``MptModel``
    calls it with the default ``B = 8`` whatever ``config.attn_config.alibi_bias_max`` says
    (transformers 5.24; MosaicML's own code passes the config's value): the default here
    reproduces the transformers model; pass ``alibi_bias_max=config.attn_config.alibi_bias_max``
    for the original code's slopes. ``"plsh"`` draws each layer's partition with ``sigma_h
    = 1 / m_h``. Projections, ``clip_qkv``, ``softmax_scale`` and the cache are MPT's;
    positions come from the padding mask (``cumsum - 1``; MPT's ALiBi uses token indices,
    which differ from these by a constant per left-padded sequence: the same softmax).

    Parameters
    ----------
    model : transformers.MptForCausalLM or transformers.MptModel
    attn_implementation : {"plsh", "alibi"}
    num_samples, seed : int
        As :func:`set_alibi_attention`.
    alibi_bias_max : float
        ``B`` of the slope rule, finite and ``> 0`` (default 8, as transformers' MPT).

    Returns
    -------
    model
        Modified in place.

    Raises
    ------
    ValueError
        Unknown ``attn_implementation``; no ``MptAttention``; ``num_samples`` outside
        ``[1, MAX_NUM_SAMPLES]``, a negative ``seed``; ``alibi_bias_max`` not finite and
        ``> 0``.
    TypeError
        Non-integer ``num_samples``/``seed``, non-real ``alibi_bias_max``.

    References
    ----------
    MosaicML (2023), MPT-7B; Press et al. (2022); Wolfson & Wagner (2026).
    """
    from transformers.models.mpt.modeling_mpt import MptAttention

    num_samples, seed, found = _check_swap(
        model, attn_implementation, num_samples, seed, MptAttention, "MptAttention"
    )
    alibi_slopes(1, max_bias=alibi_bias_max)  # checks it before any module changes
    for module in found:
        slopes = alibi_slopes(module.n_heads, max_bias=alibi_bias_max)
        _swap_module(
            module, attn_implementation, slopes, num_samples, seed, module.n_heads, _mpt_forward
        )
    return model


# --------------------------------------------------------------------------- the cache
class PLSHCacheLayer(DynamicLayer):
    """One layer of :class:`PLSHCache`: a :class:`plsh_fast.decoding.PLSHDecodingCache`.

    transformers calls :meth:`update` with the new tokens' keys and values before the
    attention; here it only stages them (with their ``position_ids``) and hands them back
    tagged. The ``"plsh"`` attention then calls :meth:`attend`, which appends, attends and
    evicts in one :meth:`PLSHDecodingCache.update <plsh_fast.decoding.PLSHDecodingCache.update>`
    call of the layer's decoding cache ``decoder``: one real token per sequence (a decode
    step) takes its batched ring (one attention call, planned 64 consecutive positions at
    a time; ``decoder.ring_steps`` counts them), anything else (the prefill, padding) its
    general path. Eviction is that cache's (:func:`plsh_fast.decoding.reachable_keys`,
    ``proofs_notes/decoding_cache.md``): each sequence holds at most
    :func:`~plsh_fast.decoding.cache_bound` keys, pads are never held, and the outputs
    equal the full-sequence PLSH attention on the same partition. :meth:`error_bound` is
    the decoding cache's a-priori bound against exact ALiBi.

    Parameters
    ----------
    partition : plsh_ref.partition.PartitionSample
        The layer's partition, ``(num_heads, num_samples)``.

    Attributes
    ----------
    decoder : plsh_fast.decoding.PLSHDecodingCache
        Holds the keys and values.
    bound : int
        ``cache_bound(partition)``.

    Raises
    ------
    TypeError
        ``partition`` is not a :class:`~plsh_ref.partition.PartitionSample`.
    """

    def __init__(self, partition: PartitionSample) -> None:
        super().__init__()
        if not isinstance(partition, PartitionSample):
            raise TypeError(f"partition: must be a PartitionSample, got {type(partition).__name__}")
        self.partition = partition
        self.decoder = PLSHDecodingCache(partition)
        self.bound = self.decoder.bound
        self.cumulative_length = 0
        self._staged: torch.Tensor | None = None  # the key tensor update() handed out last

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stage the new keys/values for :meth:`attend`; return them tagged.

        Parameters
        ----------
        key_states, value_states : torch.Tensor
            ``(batch, num_heads_kv, m, head_dim)`` and ``(..., head_dim_v)``, the new tokens.
        kwargs : dict
            The attention kwargs transformers passes (``kwargs=``, or plain keywords):
            ``position_ids`` ``(batch, m)`` or ``(1, m)`` / ``(m,)`` int64 positions of the
            new tokens (required).

        Returns
        -------
        (keys, values) : tuple of torch.Tensor
            ``key_states`` and ``value_states`` themselves; the keys carry
            ``plsh_cache_layer`` (this layer), ``plsh_positions`` ``(batch, m)`` and
            ``plsh_partition`` for the attention functions.

        Raises
        ------
        ValueError
            Missing or mis-shaped ``position_ids``; a step whose first position does not
            follow a sequence's newest cached one.

        References
        ----------
        ``proofs_notes/decoding_cache.md``.
        """
        attn_kwargs = kwargs.get("kwargs") or {}
        position_ids = attn_kwargs.get("position_ids", kwargs.get("position_ids"))
        if position_ids is None:
            raise ValueError(
                "position_ids: PLSHCache needs the new tokens' position_ids in the "
                "attention kwargs (models built on AttentionInterface pass them)"
            )
        batch, _, m, _ = key_states.shape
        new_pos = torch.as_tensor(position_ids, device=key_states.device).to(torch.int64)
        if new_pos.dim() == 1:
            new_pos = new_pos[None]
        new_pos = new_pos.expand(batch, m) if new_pos.shape[0] == 1 else new_pos
        if tuple(new_pos.shape) != (batch, m):
            raise ValueError(f"position_ids: shape {tuple(new_pos.shape)}, expected {(batch, m)}")
        if m and self.decoder.batch_size == batch:
            last = self.decoder.last_positions().to(new_pos.device)
            if bool((new_pos[:, 0] <= last).any()):
                raise ValueError(
                    "position_ids: decode step out of order (new positions must follow the "
                    "cached ones)"
                )
        self.cumulative_length += m
        tagged = cast(Any, key_states)  # attributes read by the attention functions
        tagged.plsh_cache_layer = self
        tagged.plsh_positions = new_pos
        tagged.plsh_partition = self.partition
        self._staged = key_states
        return key_states, value_states

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        scale: float | None = None,
        causal: bool = True,
    ) -> torch.Tensor:
        """Attend the new queries to the held keys plus the staged ones; append, evict.

        Parameters
        ----------
        query : torch.Tensor
            ``(batch, num_heads, m, head_dim)``.
        key, value : torch.Tensor
            The tensors :meth:`update` returned last (the new tokens).
        attention_mask : torch.Tensor, optional
            ``(batch, m)`` bool, False for padding (not held, output rows 0).
        scale : float, optional
            Logit scale (default ``1 / sqrt(head_dim)``); fixed by the first call.
        causal : bool
            Must be True (decoding is causal).

        Returns
        -------
        torch.Tensor
            ``(batch, num_heads, m, head_dim_v)``: the rows of the full-sequence
            :func:`plsh_fast.plsh_attention` (causal, same partition) at these positions.

        Raises
        ------
        ValueError
            ``key`` not the tensor staged last; ``causal`` False; a ``scale`` other than the
            first call's; and as :meth:`plsh_fast.decoding.PLSHDecodingCache.update`.

        References
        ----------
        ``proofs_notes/decoding_cache.md``; SPEC section 3.
        """
        if not isinstance(key, torch.Tensor) or key is not self._staged:  # None: none staged
            raise ValueError("key: not the keys this PLSHCache layer staged last (call update)")
        if not causal:
            raise ValueError("causal: PLSHCache decodes causal attention only")
        decoder = self.decoder
        scale = check_scale(scale, query.shape[-1])
        if decoder.scale is None:
            decoder.scale = scale
        elif scale != decoder.scale:
            raise ValueError(f"scale: {scale}, the cache attends with {decoder.scale}")
        positions = cast(Any, key).plsh_positions
        out = decoder.update(
            query,
            key,
            value,
            query_positions=positions.cpu(),
            attention_mask=None if attention_mask is None else attention_mask.cpu(),
        )
        self._staged = None
        return cast(torch.Tensor, out)

    def error_bound(self, delta: float = 0.05) -> DecodingErrorBound:
        """This layer's a-priori bound against exact ALiBi for the positions seen so far:
        :meth:`plsh_fast.decoding.PLSHDecodingCache.error_bound` (Theorems 2.1, 2.2)."""
        return self.decoder.error_bound(delta)

    def get_seq_length(self) -> int:
        """Tokens seen so far (evicted ones included), as transformers counts positions."""
        return self.cumulative_length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """``(kv_length, kv_offset)``: every token seen plus the new ones, from the first.

        Models with built-in ALiBi build their masks and ALiBi tensors over all positions
        (Falcon adds one to the other, so they must agree); the attention reads only the
        new tokens' columns (their padding), and the held keys carry their positions.
        """
        return self.cumulative_length + query_length, 0

    def cached_tokens(self) -> int:
        """The most keys any sequence of the batch holds now."""
        if self.decoder.batch_size == 0:
            return 0
        return int(self.decoder.cached_tokens().max())

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Reorder the sequences for beam search (:meth:`PLSHDecodingCache.select`)."""
        if self.decoder.batch_size:
            self.decoder.select(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat each sequence ``repeats`` times in place (transformers' batch expansion)."""
        if self.decoder.batch_size:
            self.decoder.select(np.repeat(np.arange(self.decoder.batch_size), int(repeats)))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the sequences ``indices`` (:meth:`PLSHDecodingCache.select`)."""
        if self.decoder.batch_size:
            self.decoder.select(indices)

    def reset(self) -> None:
        """Forget every token (the partition is kept)."""
        self.decoder.reset()
        self.cumulative_length = 0
        self._staged = None

    def crop(self, max_length: int) -> None:  # noqa: D401 - transformers API
        """Not supported: evicted keys cannot be restored."""
        raise ValueError("max_length: PLSHCache cannot be cropped (evicted keys are gone)")


def _swapped_classes():
    """transformers' attention classes with built-in ALiBi that the swaps replace."""
    from transformers.models.bloom.modeling_bloom import BloomAttention
    from transformers.models.falcon.modeling_falcon import FalconAttention
    from transformers.models.mpt.modeling_mpt import MptAttention

    return {BloomAttention: "bloom", FalconAttention: "falcon", MptAttention: "mpt"}


class PLSHCache(Cache):
    """A transformers ``Cache`` for ``generate()`` with one bounded decoding cache per layer.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A model set up by :func:`set_alibi_attention` (``"plsh"``) or one of the swaps
        (:func:`swap_bloom_attention`, :func:`swap_falcon_attention`,
        :func:`swap_mpt_attention`) with ``"plsh"``; each attention module's
        ``plsh_partition`` is used (drawn on the spot, as the attention function would, if
        missing).

    Raises
    ------
    ValueError
        A model without recognisable attention modules, or one whose attention is not
        ``"plsh"`` (exact ALiBi, SDPA, BLOOM's own: they still weight the evicted keys).
    TypeError
        ``model`` is not a ``torch.nn.Module``.

    Notes
    -----
    Use ``model.generate(..., cache=PLSHCache(model))``. Each layer is a
    :class:`PLSHCacheLayer`, that is a :class:`plsh_fast.decoding.PLSHDecodingCache`: decode
    steps run on its ring (one attention call per layer and step), and decoding gives the
    same tokens as with transformers' ``DynamicCache`` (tested), with memory bounded per
    layer and sequence by ``cache_bound`` of the layer's partition instead of growing with
    the context. ``max_cached_tokens()`` reports the largest layer; :meth:`error_bound`
    the a-priori error bound of every layer after any step.

    References
    ----------
    ``proofs_notes/decoding_cache.md``.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model: must be a transformers model, got {type(model).__name__}")
        config = model.config
        swapped = [m for m in model.modules() if hasattr(m, "plsh_attn_implementation")]
        names = _swapped_classes()
        built_in = [m for m in model.modules() if isinstance(m, tuple(names))]
        impls: set[Any]
        if swapped:  # BLOOM, Falcon, MPT after a swap
            modules = swapped
            impls = {getattr(m, "plsh_attn_implementation") for m in modules}  # noqa: B009
        elif built_in and not getattr(type(model), "_supports_attention_backend", False):
            modules = built_in  # their own ALiBi attention
            impls = {names[type(m)] for m in modules}
        else:
            modules = [m for _, m in sorted(_attention_modules(model), key=lambda x: x[0])]
            impls = {getattr(config, "_attn_implementation", None)}
        if not modules:
            raise ValueError(f"model: no attention modules in {type(model).__name__}")
        if impls != {"plsh"}:
            # the evicted keys still carry weight under any other attention (exact ALiBi, SDPA)
            raise ValueError(
                f"model: PLSHCache is exact only for PLSH attention, the model uses "
                f"{sorted(map(str, impls))}; call set_alibi_attention(model, 'plsh') or "
                "swap_bloom_attention(model, 'plsh') first, or use DynamicCache"
            )
        if swapped:  # the swapped modules' own head counts (BLOOM, Falcon: num_heads; MPT)
            heads = [int(getattr(m, "num_heads", 0) or getattr(m, "n_heads")) for m in modules]  # noqa: B009
        else:
            heads = [int(config.num_attention_heads)] * len(modules)
        layers: list[Any] = [PLSHCacheLayer(layer_partition(m, h)) for m, h in zip(modules, heads)]
        super().__init__(layers=layers)

    def max_cached_tokens(self) -> int:
        """Largest number of keys held by any layer and sequence now."""
        return max(
            (cast(PLSHCacheLayer, layer).cached_tokens() for layer in self.layers), default=0
        )

    def bounds(self) -> list[int]:
        """``cache_bound`` of each layer's partition."""
        return [cast(PLSHCacheLayer, layer).bound for layer in self.layers]

    def error_bound(self, delta: float = 0.05) -> list[DecodingErrorBound]:
        """Each layer's a-priori bound against exact ALiBi, for the positions seen so far.

        Parameters
        ----------
        delta : float
            Failure probability per layer, in ``(0, 1)`` (over the draw of that layer's
            partition; for all ``L`` layers at once, ``L * delta`` by a union bound).

        Returns
        -------
        list of plsh_fast.decoding.DecodingErrorBound
            One per layer, in layer order: with probability ``>= 1 - delta`` every count
            weight of that layer is within ``eps`` of the ALiBi kernel and every output row
            decoded so far within ``range_k(V_i) eps sum_j A_ij / sum_j A_ij L*_ij`` of
            exact ALiBi attention on the layer's query/key/value (Theorem 2.2,
            :func:`plsh_ref.bounds.output_error_bound` with this ``eps``).

        Raises
        ------
        ValueError, TypeError
            ``delta`` outside ``(0, 1)``; a call before any token was decoded.

        References
        ----------
        Wolfson & Wagner (2026), Theorems 2.1 and 2.2; ``proofs_notes/output_bound.md``.
        """
        return [cast(PLSHCacheLayer, layer).error_bound(delta) for layer in self.layers]
