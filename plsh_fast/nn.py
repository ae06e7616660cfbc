"""``torch.nn`` modules for positional-LSH attention.

* :class:`PLSHAttention`: the core operation on ``(batch, num_heads, seq_len, head_dim)``
  tensors, a drop-in replacement for attention with an ALiBi bias. It owns the ALiBi
  slopes and a partition sample (``pitch``/``offset``, float64 buffers that survive
  ``.half()``/``.to(dtype)`` and travel in the ``state_dict``); in training mode it draws
  a fresh partition every forward (``resample="every_forward"``) or keeps its own
  (``resample="fixed"``); in eval mode it always uses its own, seeded one.
  ``method="exact"`` computes exact ALiBi attention instead, for comparison. With
  ``kernels`` (one :mod:`plsh_ref.kernels` Pólya kernel per head, e.g. KERPLE) it
  approximates the bias ``log k_h(|p_i - p_j|)`` instead of ALiBi's: the partitions are
  drawn from the kernels and ``method="exact"`` uses that bias
  (``proofs_notes/general_kernels.md``).
* :class:`PLSHSelfAttention`: a self-attention layer (query/key/value/output projections
  around a core module) for ``(batch, seq_len, embed_dim)`` inputs, as used by the
  language models of ``plsh train-lm``.
* :func:`biased_sdpa`: ``scaled_dot_product_attention`` with a dense additive bias that
  follows the conventions of the library (grouped-query heads, an empty row gives 0).
* :func:`kernel_bias`: the dense bias ``log k_h(|p_i - p_j|)`` of one kernel per head in
  torch (the exact path of a module with ``kernels``); :func:`check_kernel_heads` the one
  check of a ``kernels`` argument (also used by :mod:`plsh_fast.hf`).

A partition is a function of absolute token positions, not of a sequence length: the
same module evaluates sequences of any length (SPEC section 2).

References
----------
Wolfson & Wagner (2026), Theorem 2.2 (PLSH attention = softmax with bias ``log C``);
Press et al. (2022) (ALiBi); ``proofs_notes/gradient_expectation.md`` (what training with
a resampled partition estimates).
"""

from __future__ import annotations

import math
import sys
from types import FrameType
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch import nn
from torch.nn import functional as F

from plsh_ref.alibi import check_slopes, sigma_from_slopes
from plsh_ref.kernels import (
    DistanceKernel,
    Exponential,
    KerpleLog,
    KerplePower,
    Mixture,
    check_kernels,
    is_builtin,
)
from plsh_ref.partition import DEFAULT_NUM_SAMPLES, PartitionSample, derived_seed, draw_partition
from plsh_ref.samplers import resolve_group_size
from plsh_ref.validation import (
    check_bool,
    check_int,
    check_positive_float,
    check_scale,
    keyword_argument,
    warn_deprecated,
)

from . import _padding as P
from . import _validation as V
from ._partition import bins as torch_bins
from ._partition import count_bias
from .cpu import PlanCache, use_plan_cache
from .dense import DenseCountCache, alibi_bias, biased_lse, dense_counts, expand_kv, use_dense_cache

__all__ = [
    "PLSHAttention",
    "PLSHSelfAttention",
    "biased_sdpa",
    "check_attention_inputs",
    "check_kernel_heads",
    "derived_seed",
    "has_torch_bias",
    "kernel_bias",
    "resolve_seed",
    "seed_layers",
]

_RESAMPLE = ("every_forward", "fixed")
_BACKENDS = ("auto", "cpu", "triton", "dense")
_METHODS = ("plsh", "exact")


def check_attention_inputs(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, num_heads: int | None = None
) -> None:
    """Check ``(batch, heads, seq_len, head_dim)`` attention inputs before any work.

    :func:`plsh_fast._validation.check_qkv` (the checks of :func:`plsh_fast.plsh_attention`)
    plus the module's head count.

    Parameters
    ----------
    query : torch.Tensor, ``(batch, num_heads, n_q, head_dim)``
    key : torch.Tensor, ``(batch, num_heads_kv, n_k, head_dim)``
    value : torch.Tensor, ``(batch, num_heads_kv, n_k, head_dim_v)``
        Floating tensors of one dtype on one device; ``num_heads % num_heads_kv == 0``.
    num_heads : int, optional
        Required number of query heads (the module's).

    Raises
    ------
    TypeError
        If an input is not a tensor, not floating point, or its dtype differs from the
        query's (whether or not it requires grad).
    ValueError
        On a wrong rank, a device or shape mismatch, or a head count that does not fit.

    References
    ----------
    SPEC section 5 (layout, grouped-query heads); ``CONTRIBUTING.md``,
    Conventions section (errors name the argument).
    """
    V.check_qkv(query, key, value)
    if num_heads is not None and query.shape[1] != num_heads:
        raise ValueError(f"query: has {query.shape[1]} heads, the module has num_heads={num_heads}")


def biased_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *args: Any,
    bias: torch.Tensor | np.ndarray | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """``softmax(scale q k^T + bias) v`` through ``scaled_dot_product_attention``.

    Dense: builds ``(num_heads, n_q, n_k)`` logits, so meant for short sequences, exact
    ALiBi comparisons and baselines.

    Parameters
    ----------
    query, key, value : torch.Tensor
        ``(batch, num_heads, n_q, head_dim)``, ``(batch, num_heads_kv, n_k, head_dim)``,
        ``(batch, num_heads_kv, n_k, head_dim_v)``; key/value heads are repeated for
        grouped-query attention (query head ``h`` uses kv head ``h // group``).
    bias : torch.Tensor or numpy.ndarray
        Keyword-only and required (passed positionally, the old form, it works for one
        release with a :class:`plsh_ref.validation.PLSHDeprecationWarning`):
        ``(num_heads, n_q, n_k)`` or ``(batch or 1, num_heads, n_q, n_k)``. Additive bias
        (``-inf`` masks a pair); cast to the query's dtype and device. NaN and ``+inf``
        (also after the cast) are refused in eager mode (the check reads the values; it
        is skipped under ``torch.compile``): a NaN row would otherwise come out as an
        empty row (output 0) without a word.
    scale : float, optional
        Logit scale, default ``1 / sqrt(head_dim)``.

    Returns
    -------
    torch.Tensor
        ``(batch, num_heads, n_q, head_dim_v)`` in the query's dtype. A row whose keys are
        all masked gives 0 (and zero gradient), never NaN (SPEC section 1).

    Raises
    ------
    TypeError, ValueError
        See :func:`check_attention_inputs`; a bias of the wrong shape or holding NaN or
        ``+inf`` (argument name ``bias``).
    """
    bias = keyword_argument(
        args,
        "bias",
        bias,
        "biased_sdpa(query, key, value, bias) with a positional bias",
        "biased_sdpa(query, key, value, bias=...)",
    )
    if bias is None:
        raise TypeError("bias: required (a tensor (num_heads, n_q, n_k), keyword bias=)")
    check_attention_inputs(query, key, value)
    num_heads, n_q, n_k = query.shape[1], query.shape[2], key.shape[2]
    bias = torch.as_tensor(bias).to(device=query.device, dtype=query.dtype)
    if bias.dim() == 3:
        bias = bias[None]
    if (
        bias.dim() != 4
        or tuple(bias.shape[1:]) != (num_heads, n_q, n_k)
        or (bias.shape[0] not in (1, query.shape[0]))
    ):
        raise ValueError(
            f"bias: shape {tuple(bias.shape)} does not match (num_heads, n_q, n_k) = "
            f"{(num_heads, n_q, n_k)} (optionally with a leading batch dimension)"
        )
    eager = not torch.compiler.is_compiling()
    if eager and bias.numel() and bool((torch.isnan(bias) | (bias == float("inf"))).any()):
        raise ValueError(f"bias: contains NaN or +inf in {query.dtype} (use -inf for masked pairs)")
    key, value = expand_kv(key, num_heads), expand_kv(value, num_heads)
    if scale is None:
        scale = check_scale(scale, query.shape[3])
    if n_k == 0 or n_q == 0:
        return query.new_zeros(query.shape[:3] + (value.shape[3],))
    # Rows with no admissible key: softmax of all -inf is NaN; give them bias 0 and reset
    # their output to 0 (always, without a host check: no synchronisation, no graph break).
    empty = ~torch.isfinite(bias).any(dim=-1, keepdim=True)  # (B, H, n_q, 1)
    bias = bias.masked_fill(empty, 0.0)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=bias, scale=float(scale))
    return out.masked_fill(empty, 0.0)


def has_torch_bias(kernel: DistanceKernel) -> bool:
    """Whether :func:`kernel_bias` has a torch form of ``log k`` for ``kernel``.

    True for :class:`plsh_ref.kernels.Exponential`, ``KerpleLog``, ``KerplePower`` (their
    exact classes, not subclasses, which may redefine ``k``) and a ``Mixture`` of such:
    the kernels of :func:`plsh_ref.kernels.is_builtin`, each of which has a torch form.

    Parameters
    ----------
    kernel : plsh_ref.kernels.DistanceKernel

    Returns
    -------
    bool

    References
    ----------
    SPEC section 8 (the built-in kernels); ``docs/kernels.md``, "In torch modules
    and Hugging Face models".
    """
    return is_builtin(kernel)


def check_kernel_heads(
    kernels: object, num_heads: int, *, name: str = "kernels"
) -> tuple[DistanceKernel, ...]:
    """A ``kernels`` argument: one Pólya kernel per head, as a tuple, checked before any work.

    :func:`plsh_ref.kernels.check_kernels` (a sequence of ``num_heads``
    :class:`plsh_ref.kernels.DistanceKernel`), then :func:`plsh_ref.kernels.check_polya`
    on every kernel whose class does not guarantee the conditions by its constructor (any
    class but the built-in ``Exponential``, ``KerpleLog``, ``KerplePower`` and mixtures of
    them): a kernel of one's own that is not of Pólya type (e.g. the Gaussian
    ``exp(-r^2)``) is refused.

    Parameters
    ----------
    kernels : sequence of plsh_ref.kernels.DistanceKernel
    num_heads : int
        Required length.
    name : str
        Argument name in the messages.

    Returns
    -------
    tuple of plsh_ref.kernels.DistanceKernel

    Raises
    ------
    TypeError
        Not a sequence of kernels (a single kernel included).
    ValueError
        Not ``num_heads`` kernels; a kernel violating a Pólya condition (the condition and
        the head are named). Every message starts with ``name``.

    References
    ----------
    ``proofs_notes/general_kernels.md`` (theorem 1: the conditions).
    """
    return check_kernels(kernels, num_heads, name=name, polya=True)


def _log_kernel(kernel: DistanceKernel, distance: torch.Tensor) -> torch.Tensor:
    """``log k(r)`` of a kernel with a torch form, float64 like ``distance``."""
    if type(kernel) is Exponential:
        return -distance / kernel.sigma
    if type(kernel) is KerpleLog:
        return -kernel.r1 * torch.log1p(kernel.r2 * distance)
    if type(kernel) is KerplePower:
        return -kernel.r1 * distance.pow(kernel.p)
    if type(kernel) is Mixture:
        parts = [
            math.log(w) + _log_kernel(c, distance)
            for w, c in zip(kernel.weights, kernel.kernels)
            if w > 0
        ]
        return torch.logsumexp(torch.stack(parts), dim=0)
    raise ValueError(
        f"kernels: {type(kernel).__name__} has no torch form of log k (built-in kernels only)"
    )


def kernel_bias(
    kernels: tuple[DistanceKernel, ...] | list[DistanceKernel], query_positions: torch.Tensor, key_positions: torch.Tensor, *,
    causal: bool, dtype: torch.dtype = torch.float64,
) -> torch.Tensor:  # fmt: skip
    """Dense bias ``log k_h(|p_i - p_j|)`` of one kernel per head, ``-inf`` where ``p_j > p_i``
    if ``causal``: the exact attention that a partition drawn from ``kernels`` approximates.

    The torch twin of ``log`` :func:`plsh_ref.kernels.kernel_matrix`, with ``log k`` in
    closed form in float64 (no underflow of ``k``): ``Exponential(sigma)``: ``-r / sigma``
    (ALiBi with slope ``1 / sigma``); ``KerpleLog(r1, r2)``: ``-r1 log1p(r2 r)``;
    ``KerplePower(r1, p)``: ``-r1 r^p``; ``Mixture``: ``logsumexp_i(log w_i + log k_i)``.
    Only torch operations on the positions (no host synchronisation; works under
    ``torch.compile``). No argument checks (callers pass :func:`check_kernel_heads` output
    whose kernels satisfy :func:`has_torch_bias`, and checked positions).

    Parameters
    ----------
    kernels : sequence of plsh_ref.kernels.DistanceKernel
        ``num_heads`` kernels with :func:`has_torch_bias`.
    query_positions, key_positions : torch.Tensor
        int64, ``(n_q,)`` and ``(n_k,)`` shared by the batch, or ``(batch, n_q)`` and
        ``(batch, n_k)`` (``(1, n)`` broadcasts), on one device.
    causal : bool
    dtype : torch.dtype
        Of the result (computed in float64, rounded once).

    Returns
    -------
    torch.Tensor
        ``(num_heads, n_q, n_k)`` for 1-D positions, ``(batch, num_heads, n_q, n_k)`` for
        2-D ones, in ``dtype`` on the positions' device.

    Raises
    ------
    ValueError
        A kernel without a torch form (message starts with ``kernels``).

    References
    ----------
    ``proofs_notes/general_kernels.md``; Chi et al. (2022), KERPLE (the biases).
    """
    pi = query_positions[..., None, :, None]
    pj = key_positions[..., None, None, :]
    distance = (pi - pj).abs().to(torch.float64)
    bias = torch.cat([_log_kernel(c, distance) for c in kernels], dim=-3)
    if causal:
        bias = bias.masked_fill(pj > pi, -math.inf)
    return bias.to(dtype)


def _in_backward_pass() -> bool:
    """Whether an autograd backward pass is running in this thread (checkpoint recompute)."""
    task_id = getattr(torch._C, "_current_graph_task_id", None)
    return task_id is not None and task_id() != -1


def resolve_seed(seed: int | None) -> int:
    """A module's seed: ``seed`` checked, or one drawn from torch's default generator.

    The seed policy of the package (CONTRIBUTING.md, "Seeds"): a module or converted model
    built with ``seed=None`` draws its model-level seed once, at construction, with one
    ``torch.randint`` from torch's default generator, and keeps it (state dict, model
    config). So the layers of a model get distinct partitions, and ``torch.manual_seed(s)``
    before building the model reproduces all of them, as it does the weights. Used by
    :class:`PLSHAttention` and :mod:`plsh_fast.hf`.

    Parameters
    ----------
    seed : int or None
        ``>= 0``, or ``None`` to draw one.

    Returns
    -------
    int
        In ``[0, 2**63 - 1)``.

    Raises
    ------
    TypeError, ValueError
        ``seed`` not an integer ``>= 0``.

    References
    ----------
    ``CONTRIBUTING.md``, "Seeds (one policy)"; ``docs/dropin.md``, "One partition
    per layer"; SPEC section 5.
    """
    if seed is None:
        return int(torch.randint(0, 2**63 - 1, ()).item())
    return check_int("seed", seed, minimum=0)


def seed_layers(model: nn.Module, seed: int) -> list[int]:
    """Reseed every :class:`PLSHAttention` of ``model`` from one model-level ``seed``.

    The ``l``-th :class:`PLSHAttention` in ``model.modules()`` order (registration order:
    layer ``l`` of a stack of blocks) gets the seed ``derived_seed(seed, l)``
    (:func:`derived_seed`): its eval partition is redrawn and its training stream restarts
    (:meth:`PLSHAttention.reseed`). Layers thus draw distinct partitions, and the same
    ``seed`` reproduces every one of them, whatever the torch RNG state was when the model
    was built. This is also the layer seeding of ``plsh train-lm``
    (:mod:`plsh_fast.experiments.model`).

    Parameters
    ----------
    model : torch.nn.Module
        Any module (a single :class:`PLSHAttention` counts as layer 0).
    seed : int
        Model-level seed ``>= 0``.

    Returns
    -------
    list of int
        The seeds given, in layer order.

    Raises
    ------
    TypeError
        If ``model`` is not a ``torch.nn.Module``; if ``seed`` is not an integer.
    ValueError
        If ``seed < 0``.

    References
    ----------
    ``docs/dropin.md``, "One partition per layer"; SPEC section 5.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: must be a torch.nn.Module, got {type(model).__name__}")
    seed = check_int("seed", seed, minimum=0)
    seeds: list[int] = []
    for module in model.modules():
        if isinstance(module, PLSHAttention):
            seeds.append(derived_seed(seed, len(seeds)))
            module.reseed(seeds[-1])
    return seeds


class PLSHAttention(nn.Module):
    """Positional-LSH attention on ``(batch, num_heads, seq_len, head_dim)`` tensors.

    Computes ``softmax(scale q k^T + log C) v`` where ``C[h, i, j]`` counts the hashes of
    head ``h`` that put positions ``p_i`` and ``p_j`` in the same bin (Wolfson & Wagner
    2026, Theorem 2.2; SPEC section 3), i.e. an unbiased random approximation ``M~ = C/s``
    of the ALiBi kernel matrix ``exp(-m_h |p_i - p_j|)``.

    Parameters
    ----------
    num_heads : int
        Number of query heads ``H >= 1``.
    num_samples : int
        Hashes per head ``s >= 1`` (the paper trains with 10 or 20).
    slopes : array_like, shape ``(num_heads,)``, optional
        ALiBi slopes (inverse tokens), default :func:`plsh_ref.alibi.alibi_slopes`.
        Stored as a float64 buffer ``slopes``; ``sigma = 1 / slopes``.
    kernels : sequence of plsh_ref.kernels.DistanceKernel, optional
        One Pólya kernel per head (``Exponential``, ``KerpleLog``, ``KerplePower``,
        ``Mixture`` or a ``DistanceKernel`` of one's own), in place of ``slopes``: the
        module then approximates the bias ``log k_h(|p_i - p_j|)``. Every partition (eval
        and training) is :func:`plsh_ref.partition.draw_partition` ``(kernels, ...)``, and
        ``method="exact"`` uses the bias of :func:`kernel_bias` (the built-in kernels only:
        a kernel of one's own has no torch form of ``log k``, refused with ``ValueError``
        for ``method="exact"``; ``method="plsh"`` takes any). The ``slopes`` buffer then
        holds NaN (no head has an ALiBi slope; so does ``sigma``). Checked by
        :func:`check_kernel_heads` (count, Pólya conditions). Not in the state dict's
        tensors: the extra state records ``repr(kernels)``, and loading a state dict
        saved with other kernels raises ``ValueError``. ``None`` (default): ALiBi.
    causal : bool
        Mask keys with ``p_key > p_query``.
    scale : float, optional
        Logit scale, default ``1 / sqrt(head_dim)``.
    seed : int, optional
        Seed of the eval partition (``draw_partition(sigma, num_samples, seed)``) and of
        the stream of training partitions (draw ``k`` uses ``SeedSequence([seed, k])``).
        ``None`` (default) draws the seed at construction from torch's default generator
        (one ``torch.randint``), so that the layers of a model get distinct partitions and
        ``torch.manual_seed(s)`` before building the model reproduces all of them, as it
        does the weights; :func:`seed_layers` reseeds every layer of a built model from
        one model-level seed instead. The seed is kept in the state dict.
    resample : {"every_forward", "fixed"}
        In training mode, draw a fresh partition every forward (the draw counter is saved
        in the state dict, so a resumed run continues the same stream), or use the
        module's own partition as in eval mode. Activation checkpointing recomputes the
        forward during the backward pass, where ``"every_forward"`` would draw another
        partition than the one the loss used: that case raises ``ValueError``; use
        ``"fixed"`` (and :meth:`set_partition` between steps) in checkpointed regions.
    method : {"plsh", "exact"}
        Which formula: PLSH attention, or exact ALiBi attention (dense bias through SDPA;
        for comparison; with ``kernels``, exact attention with their bias). ``exact=True`` is the old spelling of ``method="exact"``
        (DeprecationWarning, one release).
    backend : {"auto", "cpu", "triton", "dense"}
        Where it runs. ``"auto"``/``"cpu"``/``"triton"``: :func:`plsh_fast.plsh_attention`
        with that backend (fused; Triton on CUDA, vectorised torch on CPU). ``"dense"``:
        SDPA with a dense ``log(C / s)`` bias (the same function, ``O(n_q n_k)`` memory; for
        short sequences and comparisons). ``method="exact"`` runs dense (``"auto"`` or
        ``"dense"``). ``"fast"`` is the old name of ``"auto"`` (DeprecationWarning, one
        release).
    check_finite : bool
        Passed to :func:`plsh_fast.plsh_attention`: eager-mode checks that read tensor
        values (NaN/inf inputs, position and bin range). ``False`` removes the device
        synchronisations they cost on CUDA.
    sampler : {"iid", "stratified", "shared"}
        Partition sampler of every draw (eval and training), passed to
        :func:`plsh_ref.partition.draw_partition` (``proofs_notes/samplers.md``).
    group_size : int, optional
        Its group size ``s'`` (default :func:`plsh_ref.samplers.default_group_size`).

    Attributes
    ----------
    slopes : torch.Tensor
        float64 buffer ``(num_heads,)`` (NaN with ``kernels``).
    kernels : tuple of plsh_ref.kernels.DistanceKernel or None
        The heads' kernels, ``None`` for ALiBi.
    pitch, offset : torch.Tensor
        float64 buffers ``(num_heads, num_samples)``: the module's own (eval) partition.

    Notes
    -----
    The float64 buffers keep float64 whatever ``.half()``, ``.to(dtype)`` or
    ``.bfloat16()`` do to the rest of a model (only their device follows); bins must be
    computed in binary64 (SPEC section 2). Loading a state dict restores them bit for bit;
    a state dict with another ``num_samples`` (same heads) is adopted.

    Training with ``resample="every_forward"`` gives unbiased stochastic gradients of a
    surrogate objective (the loss averaged over partitions), not of the exact ALiBi loss;
    the two differ by ``O(1/s)``, see ``proofs_notes/gradient_expectation.md``.

    Works under ``torch.compile(fullgraph=True)`` with every backend (and ``exact``),
    dynamic sequence lengths included: the attention is the custom operator
    ``plsh::attention`` (:mod:`plsh_fast._ops`), the training draws are the operator
    ``plsh::training_partition``, and the exact and dense biases are built with torch
    operations from the float64 buffers. The buffers are passed to the kernels as they
    are (no host round trip).

    Raises
    ------
    TypeError, ValueError
        On invalid arguments (message starts with the argument name).

    Examples
    --------
    >>> import torch
    >>> from plsh_fast.nn import PLSHAttention
    >>> attention = PLSHAttention(num_heads=4, num_samples=16, seed=0)
    >>> query, key, value = (torch.randn(2, 4, 32, 16) for _ in range(3))
    >>> attention(query, key, value).shape
    torch.Size([2, 4, 32, 16])
    """

    # registered buffers (nn.Module.__getattr__ is typed Tensor | Module)
    draw_counter: torch.Tensor
    slopes: torch.Tensor
    pitch: torch.Tensor
    offset: torch.Tensor

    _FLOAT64_BUFFERS = ("slopes", "pitch", "offset")

    def __init__(
        self,
        num_heads: int,
        num_samples: int = DEFAULT_NUM_SAMPLES,
        *,
        slopes: ArrayLike | None = None,
        kernels: Any = None,
        causal: bool = True,
        scale: float | None = None,
        seed: int | None = None,
        resample: str = "every_forward",
        method: str = "plsh",
        backend: str = "auto",
        check_finite: bool = True,
        sampler: str = "iid",
        group_size: int | None = None,
        exact: bool | None = None,
    ) -> None:
        super().__init__()
        num_heads = check_int("num_heads", num_heads, minimum=1)
        num_samples = V.check_num_samples(num_samples)
        self.sampler = sampler
        self.group_size = resolve_group_size(sampler, num_samples, group_size)
        if kernels is None:
            self.kernels: tuple[DistanceKernel, ...] | None = None
            m = check_slopes(slopes, num_heads)
        else:
            if slopes is not None:
                raise ValueError(
                    "kernels: replace slopes (a kernel per head in place of ALiBi slopes); "
                    "give one of them, not both"
                )
            self.kernels = check_kernel_heads(kernels, num_heads)
            m = np.full(num_heads, np.nan)
            from ._ops import kernel_law_id  # noqa: PLC0415 (registers the operators)

            self._kernel_law = kernel_law_id(self.kernels)  # the training draws' index
        if scale is not None:
            scale = check_positive_float("scale", scale)
        if resample not in _RESAMPLE:
            raise ValueError(f"resample: must be one of {_RESAMPLE}, got {resample!r}")
        if backend == "fast":
            warn_deprecated("PLSHAttention(backend='fast')", "backend='auto' (the same)")
            backend = "auto"
        if backend not in _BACKENDS:
            raise ValueError(f"backend: must be one of {_BACKENDS}, got {backend!r}")
        if exact is not None:
            warn_deprecated(f"PLSHAttention(exact={exact!r})", "method='exact' or method='plsh'")
            method = "exact" if check_bool("exact", exact) else "plsh"
        if method not in _METHODS:
            raise ValueError(f"method: must be one of {_METHODS}, got {method!r}")
        if method == "exact" and self.kernels is not None:
            for h, kernel in enumerate(self.kernels):
                if not has_torch_bias(kernel):
                    raise ValueError(
                        f"kernels: head {h}: method='exact' needs the torch form of log k of "
                        f"kernel_bias, which {type(kernel).__name__} has not (the built-in "
                        "Exponential, KerpleLog, KerplePower and Mixture have one); use "
                        "method='plsh', or plsh_ref.attention.biased_attention with "
                        "log plsh_ref.kernels.kernel_matrix for the exact attention"
                    )
        if method == "exact" and backend in ("cpu", "triton"):
            raise ValueError(
                f"backend: method='exact' runs on the dense backend only ('auto' or 'dense'), "
                f"got {backend!r}"
            )
        self.seed = resolve_seed(seed)
        self.num_heads = num_heads
        self.causal = check_bool("causal", causal)
        self.scale = scale
        self.resample = resample
        self.method = method
        self.exact = method == "exact"  # read-only view kept for old readers
        self.backend = backend
        self.check_finite = check_bool("check_finite", check_finite)
        # Training-draw counter: an int64 CPU tensor (stays on the CPU whatever the
        # module's device), advanced in place by plsh::training_partition.
        self.register_buffer("draw_counter", torch.zeros((), dtype=torch.int64), persistent=False)
        self.register_buffer("slopes", torch.from_numpy(m.copy()))
        law: Any = sigma_from_slopes(m) if self.kernels is None else list(self.kernels)
        part = draw_partition(law, num_samples, self.seed, **self._sampler_kwargs())
        self.register_buffer("pitch", torch.from_numpy(part.pitch.copy()))
        self.register_buffer("offset", torch.from_numpy(part.offset.copy()))
        # This layer's own kept CPU plans (plsh_fast.cpu.PlanCache): the layers of a model
        # do not evict each other's plans from one shared budget (eager calls).
        self.plan_cache = PlanCache()
        # ... and its own dense counts (the calls below plsh_fast.dense.DENSE_CROSSOVER)
        self.dense_cache = DenseCountCache()

    # ------------------------------------------------------------------ state
    @property
    def num_draws(self) -> int:
        """Training partitions drawn so far (the next draw has this index)."""
        return int(self.draw_counter)

    @num_draws.setter
    def num_draws(self, value: int) -> None:
        self.draw_counter.fill_(check_int("num_draws", value, minimum=0))

    def reseed(self, seed: int) -> None:
        """Adopt ``seed``: redraw the eval partition from it and restart the training stream.

        Keeps ``num_samples`` and the device. Used by :func:`seed_layers`.

        Raises
        ------
        TypeError, ValueError
            If ``seed`` is not an integer ``>= 0``.
        """
        self.seed = check_int("seed", seed, minimum=0)
        self.set_partition(
            draw_partition(self._law(), self.num_samples, self.seed, **self._sampler_kwargs())
        )
        self.num_draws = 0

    def __setstate__(self, state: dict[str, Any]) -> None:
        # unpickled or deep-copied (maybe in another process): the index of the kernels in
        # the process-wide plsh_fast._ops.KERNEL_LAWS is this process's, not the pickler's
        super().__setstate__(state)
        kernels = getattr(self, "kernels", None)
        if kernels is not None:
            from ._ops import kernel_law_id  # noqa: PLC0415

            self._kernel_law = kernel_law_id(kernels)

    def _law(self) -> Any:
        """What :func:`plsh_ref.partition.draw_partition` draws from: the kernels, or sigma."""
        return self.sigma if self.kernels is None else list(self.kernels)

    def _sampler_kwargs(self) -> dict:
        """``sampler``/``group_size`` keywords of :func:`plsh_ref.partition.draw_partition`."""
        if self.sampler == "iid":
            return {}
        return {"sampler": self.sampler, "group_size": self.group_size}

    @property
    def num_samples(self) -> int:
        """Hashes per head ``s`` of the module's partition."""
        return int(self.pitch.shape[1])

    @property
    def sigma(self) -> np.ndarray:
        """Length scales ``1 / slopes`` in tokens, float64 numpy ``(num_heads,)``."""
        return 1.0 / self.slopes.detach().cpu().numpy()

    @property
    def partition(self) -> PartitionSample:
        """The module's own (eval) partition as a :class:`plsh_ref.PartitionSample`."""
        return PartitionSample(
            self.pitch.detach().cpu().numpy(), self.offset.detach().cpu().numpy(), self.sampler
        )

    def set_partition(self, partition: PartitionSample) -> None:
        """Replace the module's partition (its ``num_samples`` may differ).

        Raises
        ------
        TypeError
            If ``partition`` is not a :class:`plsh_ref.PartitionSample`.
        ValueError
            If its head count differs from ``num_heads``.
        """
        if not isinstance(partition, PartitionSample):
            raise TypeError(f"partition: must be a PartitionSample, got {type(partition).__name__}")
        if partition.num_heads != self.num_heads:
            raise ValueError(
                f"partition: has {partition.num_heads} heads, the module has "
                f"num_heads={self.num_heads}"
            )
        device = self.pitch.device
        self.pitch = torch.tensor(partition.pitch, dtype=torch.float64, device=device)
        self.offset = torch.tensor(partition.offset, dtype=torch.float64, device=device)

    def training_partition(self, draw: int) -> PartitionSample:
        """The ``draw``-th partition of the training stream (reproducible from ``seed``)."""
        draw = check_int("draw", draw, minimum=0)
        return draw_partition(
            self._law(), self.num_samples, derived_seed(self.seed, draw), **self._sampler_kwargs()
        )

    def get_extra_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"seed": self.seed, "num_draws": self.num_draws}
        if self.kernels is not None:  # a string: state dicts stay loadable with weights_only
            state["kernels"] = repr(self.kernels)
        return state

    def set_extra_state(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or not {"seed", "num_draws"} <= set(state):
            raise ValueError(
                "state_dict: extra state of PLSHAttention must be a dict with "
                f"'seed' and 'num_draws', got {state!r}"
            )
        mine = None if self.kernels is None else repr(self.kernels)
        if state.get("kernels") != mine:
            raise ValueError(
                f"state_dict: saved with kernels={state.get('kernels')}, the module has "
                f"kernels={mine} (build the module with the kernels it was saved with)"
            )
        self.seed = check_int("seed", state["seed"], minimum=0)
        self.num_draws = check_int("num_draws", state["num_draws"], minimum=0)

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        pitch = state_dict.get(prefix + "pitch")
        offset = state_dict.get(prefix + "offset")
        if pitch is not None:
            if pitch.dim() != 2 or pitch.shape[0] != self.num_heads:
                raise ValueError(
                    f"partition: state_dict entry {prefix}pitch has shape "
                    f"{tuple(pitch.shape)}, the module has "
                    f"num_heads={self.num_heads}"
                )
            if offset is not None and offset.shape != pitch.shape:
                raise ValueError(
                    f"partition: state_dict entries {prefix}pitch and "
                    f"{prefix}offset differ in shape"
                )
            if pitch.shape != self.pitch.shape:  # adopt another num_samples
                if offset is None:
                    raise ValueError(
                        f"partition: state_dict entry {prefix}pitch has "
                        f"num_samples={pitch.shape[1]} (the module has "
                        f"{self.pitch.shape[1]}) but {prefix}offset is missing"
                    )
                self.pitch = torch.empty(pitch.shape, dtype=torch.float64, device=self.pitch.device)
                self.offset = torch.empty(
                    pitch.shape, dtype=torch.float64, device=self.offset.device
                )
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def _apply(self, fn, recurse=True):
        # Keep slopes/pitch/offset in float64 whatever fn does to dtypes; follow devices.
        saved = {name: self._buffers[name] for name in self._FLOAT64_BUFFERS}
        super()._apply(fn, recurse)
        for name, old in saved.items():
            new = self._buffers[name]
            self._buffers[name] = old.to(device=new.device, dtype=torch.float64)
        self._buffers["draw_counter"] = self._buffers["draw_counter"].cpu()
        return self

    def extra_repr(self) -> str:
        kind = "method='exact'" if self.exact else f"num_samples={self.num_samples}"
        return (
            f"num_heads={self.num_heads}, {kind}, causal={self.causal}, "
            f"resample={self.resample!r}, backend={self.backend!r}, seed={self.seed}"
            + ("" if self.sampler == "iid" else f", sampler={self.sampler!r}")
            + ("" if self.kernels is None else f", kernels={self.kernels!r}")
        )

    # ---------------------------------------------------------------- forward
    def _forward_partition(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(pitch, offset)`` float64 tensors of this forward (the buffers, or a draw)."""
        if self.training and self.resample == "every_forward":
            if not torch.compiler.is_compiling() and _in_backward_pass():
                # Activation checkpointing recomputes the forward inside the backward; the
                # recomputation would draw the next partition, not the one the loss used,
                # and the gradients would silently belong to another function.
                raise ValueError(
                    "resample: PLSHAttention's forward runs during a backward pass "
                    "(activation checkpointing recomputes it); with "
                    "resample='every_forward' the recomputation would draw another "
                    "partition than the forward did. Use resample='fixed' (and "
                    "set_partition between steps) inside checkpointed regions."
                )
            from ._ops import training_partition  # noqa: PLC0415 (registers the operator)

            if self.kernels is not None:
                return training_partition(
                    self.slopes, self.draw_counter, self.seed, self.pitch, self.sampler,
                    self.group_size, self._kernel_law,
                )  # fmt: skip
            if self.sampler == "iid":
                return training_partition(self.slopes, self.draw_counter, self.seed, self.pitch)
            return training_partition(
                self.slopes, self.draw_counter, self.seed, self.pitch, self.sampler,
                self.group_size,
            )  # fmt: skip
        return self.pitch, self.offset

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, query_positions: ArrayLike | torch.Tensor | None=None, key_positions: ArrayLike | torch.Tensor | None=None,
        attention_mask: torch.Tensor | None=None, return_lse: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Attention output, or ``(out, lse)`` with ``return_lse=True`` (SPEC section 5).

        Parameters
        ----------
        query : torch.Tensor, ``(batch, num_heads, n_q, head_dim)``
        key : torch.Tensor, ``(batch, num_heads_kv, n_k, head_dim)``
        value : torch.Tensor, ``(batch, num_heads_kv, n_k, head_dim_v)``
            One floating dtype, one device; ``num_heads % num_heads_kv == 0``.
        query_positions, key_positions : torch.Tensor or array_like of int, optional
            Absolute positions ``(n_q,)``, ``(n_k,)`` shared by the batch, or
            ``(batch, n_q)``, ``(batch, n_k)`` per sequence (HF ``position_ids``); default
            keys ``0..n_k-1`` and queries aligned to the end. Any length works: the
            partition is a function of positions.
        attention_mask : torch.Tensor, optional
            Key-padding mask ``(batch, n_k)``, bool or integer 0/1, 1 = keep, 0 = pad
            (HF 2-D convention); pad query slots (end-aligned) give output 0. See
            :mod:`plsh_fast._padding` for the exact semantics and synchronisation.
        return_lse : bool
            Also return the LSE ``lse_i = log sum_j exp(scale q_i . k_j) C_ij / s`` (exact
            ALiBi with ``method="exact"``: ``log sum_j exp(scale q_i . k_j - m_h |p_i -
            p_j|)``), differentiable like the output. The fused backends return their
            kernels' LSE (:func:`plsh_fast.plsh_attention`); the dense and exact paths,
            whose SDPA returns none, compute it from the same bias
            (:func:`plsh_fast.dense.biased_lse`).
        *args
            Deprecated (one release, DeprecationWarning): positions passed positionally,
            ``forward(query, key, value, query_positions, key_positions)``.

        Returns
        -------
        out : torch.Tensor
            ``(batch, num_heads, n_q, head_dim_v)``, the query's dtype.
        lse : torch.Tensor
            Only if ``return_lse``: ``(batch, num_heads, n_q)``, float32 (float64 for
            float64 inputs), natural log; ``-inf`` on rows without an admissible key (pad
            queries included).

        Raises
        ------
        TypeError, ValueError
            See :func:`check_attention_inputs` and :func:`plsh_fast.plsh_attention`
            (positions, mask); a non-bool ``return_lse``.
        """
        if args:
            query_positions, key_positions = _deprecated_positional_positions(
                args, query_positions, key_positions, _module_call_frames()
            )
        return_lse = check_bool("return_lse", return_lse)
        check_attention_inputs(query, key, value, self.num_heads)
        if self.exact or self.backend == "dense":
            batch, _, n_q, _ = query.shape
            n_k, device = key.shape[2], query.device
            qpos, kpos, mask = P.resolve_positions(
                query_positions, key_positions, attention_mask, batch, n_q, n_k, device
            )
            if not torch.compiler.is_compiling():
                mask = _eager_mask_values(mask)
                real_q, real_k = P.real_positions(qpos, kpos, mask, batch)
                P.check_position_range("query_positions", real_q)
                P.check_position_range("key_positions", real_k)
            if self.exact:
                q2 = qpos if qpos.dim() == 2 else qpos[None]
                k2 = kpos if kpos.dim() == 2 else kpos[None]
                if self.kernels is None:
                    bias = alibi_bias(self.slopes, q2, k2, causal=self.causal)
                else:
                    bias = kernel_bias(self.kernels, q2, k2, causal=self.causal)
            else:
                bias = _log_count_bias(*self._forward_partition(), qpos, kpos, self.causal)
            bias = _mask_bias(bias, mask, n_q, n_k)
            out = biased_sdpa(query, key, value, bias=bias, scale=self.scale)
            if not return_lse:
                return out
            c = check_scale(self.scale, query.shape[3])
            return out, biased_lse(query, key, bias, scale=c)
        from .api import plsh_attention  # noqa: PLC0415 (plsh_fast.api imports torch/triton)

        def attend() -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
            return plsh_attention(
                query,
                key,
                value,
                causal=self.causal,
                scale=self.scale,
                partition=self._forward_partition(),
                query_positions=query_positions,
                key_positions=key_positions,
                attention_mask=attention_mask,
                return_lse=return_lse,
                backend=self.backend,
                check_finite=self.check_finite,
            )

        if torch.compiler.is_compiling():  # the compiled operators keep them process-wide
            return attend()
        with use_plan_cache(self.plan_cache), use_dense_cache(self.dense_cache):
            return attend()  # this layer's CPU plans and dense counts


def _module_call_frames() -> int:
    """Frames of ``torch.nn.Module.__call__`` between the calling ``forward`` and its caller.

    0 when ``forward`` is called directly. A deprecation warning raised in a ``forward``
    adds them to its stacklevel so that it names the user's line, not torch's (a
    DeprecationWarning attributed to torch is hidden by Python's default filters).
    """
    frame: FrameType | None = sys._getframe(2)  # 0: here, 1: the forward, 2: its caller
    count = 0
    while frame is not None and frame.f_code.co_filename == _MODULE_CALL_FILE:
        count += 1
        frame = frame.f_back
    return count


#: the file of ``torch.nn.Module.__call__`` (``_call_impl``, ``_wrapped_call_impl``)
_MODULE_CALL_FILE = nn.Module.__call__.__code__.co_filename


def _deprecated_positional_positions(args, query_positions, key_positions, frames: int = 0):
    """``(query_positions, key_positions)`` from the old positional form (warns; ``frames``:
    :func:`_module_call_frames` of the forward)."""
    if len(args) > 2 or query_positions is not None or key_positions is not None:
        raise TypeError(
            "query_positions: pass positions once, as the keywords query_positions= and "
            "key_positions="
        )
    if not torch.compiler.is_compiling():  # Dynamo cannot trace warnings.warn
        warn_deprecated(
            "PLSHAttention.forward(query, key, value, query_positions, key_positions) with "
            "positional positions",
            "forward(query, key, value, query_positions=..., key_positions=...)",
            stacklevel=4 + frames,
        )
    return (*args, None)[:2] if len(args) == 1 else tuple(args)


def _eager_mask_values(mask):
    """A bool mask; integer entries other than 0/1 raise (reads the mask; eager only)."""
    if mask is None or mask.dtype == torch.bool:
        return mask
    if bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError("attention_mask: integer entries must be 0 (pad) or 1 (keep)")
    return mask != 0


def _log_count_bias(pitch, offset, qpos, kpos, causal: bool) -> torch.Tensor:
    """``log(C / s)`` (``-inf`` where ``C = 0``), float64 ``(B|1, H, n_q, n_k)``.

    :func:`plsh_fast.dense.dense_counts` of the bins of :func:`plsh_fast._partition.bins`
    (binary64, equal to the reference's), then :func:`plsh_fast._partition.count_bias`.
    """
    q2 = qpos if qpos.dim() == 2 else qpos[None]
    k2 = kpos if kpos.dim() == 2 else kpos[None]
    bq = torch_bins(pitch, offset, q2.reshape(-1)).view(*pitch.shape, *q2.shape)
    bk = torch_bins(pitch, offset, k2.reshape(-1)).view(*pitch.shape, *k2.shape)
    # (H, s, B, n) -> (B, H, s, n)
    bq, bk = bq.permute(2, 0, 1, 3), bk.permute(2, 0, 1, 3)
    count = dense_counts(bq, bk, q2[:, None], k2[:, None], causal=causal)
    return count_bias(count, pitch.shape[1])


def _mask_bias(bias, mask, n_q: int, n_k: int):
    """``bias`` with pad keys and pad query rows (end-aligned) set to ``-inf``."""
    if mask is None:
        return bias
    keep = mask if mask.dtype == torch.bool else mask != 0
    bias = bias.masked_fill(~keep[:, None, None, :], -math.inf)
    if n_q <= n_k:
        bias = bias.masked_fill(~keep[:, None, n_k - n_q :, None], -math.inf)
    return bias


class PLSHSelfAttention(nn.Module):
    """Self-attention layer: projections around a ``(batch, heads, seq, dim)`` core.

    ``y = out_proj(core(q_proj x, k_proj x, v_proj x))`` with heads split from and merged
    into the last dimension, like ``nn.MultiheadAttention`` with an ALiBi bias.

    Parameters
    ----------
    embed_dim : int
        Model width; divisible by ``num_heads``.
    num_heads : int
        Query heads.
    num_heads_kv : int, optional
        Key/value heads for grouped-query attention (divides ``num_heads``); default
        ``num_heads``.
    projection_bias : bool
        Bias terms in the projections (``bias=`` is the old name, accepted with a
        ``DeprecationWarning`` for one release).
    attention : torch.nn.Module, optional
        The core, called as ``attention(q, k, v, query_positions=..., key_positions=...)``
        (and ``attention_mask=`` when one is given) on
        ``(batch, heads, seq, head_dim)`` tensors; default
        ``PLSHAttention(num_heads, **attention_kwargs)``. Baselines (no bias, fixed
        blocks) plug in here.
    **attention_kwargs
        Passed to :class:`PLSHAttention` when ``attention`` is not given.

    Raises
    ------
    TypeError, ValueError
        On non-integer or non-dividing sizes, or a core with another ``num_heads``.

    References
    ----------
    ``docs/dropin.md``; ``torch.nn.MultiheadAttention`` (the layer it mirrors);
    SPEC section 5.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        num_heads_kv: int | None = None,
        projection_bias: bool = False,
        attention: nn.Module | None = None,
        **attention_kwargs: Any,
    ) -> None:
        super().__init__()
        if "bias" in attention_kwargs:
            warn_deprecated("PLSHSelfAttention(bias=...)", "projection_bias= (the same)")
            projection_bias = attention_kwargs.pop("bias")
        bias = check_bool("projection_bias", projection_bias)
        embed_dim = check_int("embed_dim", embed_dim, minimum=1)
        num_heads = check_int("num_heads", num_heads, minimum=1)
        num_heads_kv = (
            num_heads
            if num_heads_kv is None
            else check_int("num_heads_kv", num_heads_kv, minimum=1)
        )
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim: {embed_dim} is not divisible by num_heads={num_heads}")
        if num_heads % num_heads_kv:
            raise ValueError(f"num_heads_kv: {num_heads_kv} does not divide num_heads={num_heads}")
        if attention is None:
            attention = PLSHAttention(num_heads, **attention_kwargs)
        elif attention_kwargs:
            raise ValueError(
                f"attention_kwargs: unused when attention is given: {sorted(attention_kwargs)}"
            )
        core_heads = getattr(attention, "num_heads", num_heads)
        if core_heads != num_heads:
            raise ValueError(
                f"attention: core has num_heads={core_heads}, the layer has {num_heads}"
            )
        self.embed_dim, self.num_heads, self.num_heads_kv = embed_dim, num_heads, num_heads_kv
        self.head_dim = embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, num_heads_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, num_heads_kv * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.attention = attention

    def forward(
        self, x: torch.Tensor, *args: Any, query_positions: ArrayLike | torch.Tensor | None=None, key_positions: ArrayLike | torch.Tensor | None=None, attention_mask: torch.Tensor | None=None,
        return_lse: bool = False, positions: ArrayLike | torch.Tensor | None=None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Self-attention of ``x``, or ``(y, lse)`` with ``return_lse=True`` (SPEC section 5).

        Parameters
        ----------
        x : torch.Tensor, ``(batch, seq_len, embed_dim)``
        query_positions, key_positions : torch.Tensor or array_like of int, optional
            Absolute positions of the tokens, ``(seq_len,)`` shared by the batch or
            ``(batch, seq_len)`` per sequence (HF ``position_ids``); the queries and keys
            are the same tokens, so one given is used for both; default ``0..seq_len-1``.
        positions
            Deprecated (one release, DeprecationWarning; also positional): the old name of
            ``query_positions``.
        attention_mask : torch.Tensor, optional
            Key-padding mask ``(batch, seq_len)``, 1 = keep, 0 = pad (HF convention);
            pad tokens' rows are 0 before ``out_proj`` (see :class:`PLSHAttention`).
        return_lse : bool
            Also return the core's LSE (:meth:`PLSHAttention.forward`); the core is then
            called with ``return_lse=True`` and must return ``(out, lse)``.

        Returns
        -------
        y : torch.Tensor
            ``(batch, seq_len, embed_dim)``.
        lse : torch.Tensor
            Only if ``return_lse``: the core's, ``(batch, num_heads, seq_len)``.

        Raises
        ------
        TypeError
            If ``x`` is not a floating-point ``torch.Tensor``; a non-bool ``return_lse``.
        ValueError
            If ``x`` is not ``(batch, seq_len, embed_dim)``.
        """
        if args or positions is not None:
            if len(args) > 1 or (args and positions is not None):
                raise TypeError("positions: pass positions once, as query_positions=")
            if not torch.compiler.is_compiling():  # Dynamo cannot trace warnings.warn
                warn_deprecated(
                    "PLSHSelfAttention.forward(x, positions)",
                    "forward(x, query_positions=...)",
                    stacklevel=3 + _module_call_frames(),
                )
            positions = args[0] if args else positions
            query_positions = positions if query_positions is None else query_positions
        query_positions = key_positions if query_positions is None else query_positions
        key_positions = query_positions if key_positions is None else key_positions
        return_lse = check_bool("return_lse", return_lse)
        if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
            kind = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
            raise TypeError(f"x: must be a floating-point torch.Tensor, got {kind}")
        if x.dim() != 3 or x.shape[2] != self.embed_dim:
            raise ValueError(f"x: must be (batch, seq_len, {self.embed_dim}), got {tuple(x.shape)}")
        b, n, _ = x.shape

        def heads(t, h):
            return t.view(b, n, h, self.head_dim).transpose(1, 2)

        q = heads(self.q_proj(x), self.num_heads)
        k = heads(self.k_proj(x), self.num_heads_kv)
        v = heads(self.v_proj(x), self.num_heads_kv)
        kw = {"query_positions": query_positions, "key_positions": key_positions}
        if attention_mask is not None:
            kw["attention_mask"] = attention_mask
        if return_lse:  # only then: a custom core need not know the argument
            kw["return_lse"] = True
        result = self.attention(q, k, v, **kw)
        core_out = result[0] if return_lse else result
        y = self.out_proj(core_out.transpose(1, 2).reshape(b, n, self.embed_dim))
        return (y, result[1]) if return_lse else y
