"""``torch.nn`` modules for positional-LSH attention.

* :class:`PLSHAttention`: the core operation on ``(batch, num_heads, seq_len, head_dim)``
  tensors, a drop-in replacement for attention with an ALiBi bias. It owns the ALiBi
  slopes and a partition sample (``pitch``/``offset``, float64 buffers that survive
  ``.half()``/``.to(dtype)`` and travel in the ``state_dict``); in training mode it draws
  a fresh partition every forward (``resample="every_forward"``) or keeps its own
  (``resample="fixed"``); in eval mode it always uses its own, seeded one.
  ``exact=True`` computes exact ALiBi attention instead, for comparison.
* :class:`PLSHSelfAttention`: a self-attention layer (query/key/value/output projections
  around a core module) for ``(batch, seq_len, embed_dim)`` inputs, as used by the
  language models of ``plsh train-lm``.
* :func:`biased_sdpa`: ``scaled_dot_product_attention`` with a dense additive bias that
  follows the conventions of the library (grouped-query heads, an empty row gives 0).

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
import warnings

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from plsh_ref.partition import DEFAULT_NUM_SAMPLES, PartitionSample, derived_seed, draw_partition
from plsh_ref.samplers import resolve_group_size
from plsh_ref.validation import check_bool, check_int, check_positive_float, check_scale

from . import _padding as P
from . import _validation as V
from ._partition import bins as torch_bins
from ._partition import count_bias
from .cpu import PlanCache, use_plan_cache
from .dense import expand_kv

__all__ = [
    "PLSHAttention",
    "PLSHSelfAttention",
    "biased_sdpa",
    "check_attention_inputs",
    "derived_seed",
    "seed_layers",
]

_RESAMPLE = ("every_forward", "fixed")
_BACKENDS = ("auto", "cpu", "triton", "dense")


def check_attention_inputs(query, key, value, num_heads: int | None = None) -> None:
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
    """
    V.check_qkv(query, key, value)
    if num_heads is not None and query.shape[1] != num_heads:
        raise ValueError(f"query: has {query.shape[1]} heads, the module has num_heads={num_heads}")


def biased_sdpa(query, key, value, bias, *, scale=None):
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


def _in_backward_pass() -> bool:
    """Whether an autograd backward pass is running in this thread (checkpoint recompute)."""
    task_id = getattr(torch._C, "_current_graph_task_id", None)
    return task_id is not None and task_id() != -1


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
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: must be a torch.nn.Module, got {type(model).__name__}")
    seed = check_int("seed", seed, minimum=0)
    seeds = []
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
    exact : bool
        Compute exact ALiBi attention (dense bias through SDPA) instead of PLSH.
    backend : {"auto", "cpu", "triton", "dense"}
        ``"auto"``/``"cpu"``/``"triton"``: :func:`plsh_fast.plsh_attention` with that
        backend (fused; Triton on CUDA, vectorised torch on CPU). ``"dense"``: SDPA with a
        dense ``log(C / s)`` bias (the same function, ``O(n_q n_k)`` memory; for short
        sequences and comparisons). ``"fast"`` is the old name of ``"auto"`` (accepted
        with a ``DeprecationWarning`` for one release).
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
        float64 buffer ``(num_heads,)``.
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
    """

    _FLOAT64_BUFFERS = ("slopes", "pitch", "offset")

    def __init__(
        self,
        num_heads: int,
        num_samples: int = DEFAULT_NUM_SAMPLES,
        *,
        slopes=None,
        causal: bool = True,
        scale=None,
        seed: int | None = None,
        resample: str = "every_forward",
        exact: bool = False,
        backend: str = "auto",
        check_finite: bool = True,
        sampler: str = "iid",
        group_size: int | None = None,
    ):
        super().__init__()
        num_heads = check_int("num_heads", num_heads, minimum=1)
        num_samples = V.check_num_samples(num_samples)
        self.sampler = sampler
        self.group_size = resolve_group_size(sampler, num_samples, group_size)
        m = V.check_slopes(slopes, num_heads)
        if scale is not None:
            scale = check_positive_float("scale", scale)
        if resample not in _RESAMPLE:
            raise ValueError(f"resample: must be one of {_RESAMPLE}, got {resample!r}")
        if backend == "fast":
            warnings.warn(
                "backend: 'fast' is deprecated, use 'auto' (the same)",
                DeprecationWarning,
                stacklevel=2,
            )
            backend = "auto"
        if backend not in _BACKENDS:
            raise ValueError(f"backend: must be one of {_BACKENDS}, got {backend!r}")
        if seed is None:
            seed = int(torch.randint(0, 2**63 - 1, ()).item())
        self.seed = check_int("seed", seed, minimum=0)
        self.num_heads = num_heads
        self.causal = check_bool("causal", causal)
        self.scale = scale
        self.resample = resample
        self.exact = check_bool("exact", exact)
        self.backend = backend
        self.check_finite = check_bool("check_finite", check_finite)
        # Training-draw counter: an int64 CPU tensor (stays on the CPU whatever the
        # module's device), advanced in place by plsh::training_partition.
        self.register_buffer("draw_counter", torch.zeros((), dtype=torch.int64), persistent=False)
        self.register_buffer("slopes", torch.from_numpy(m.copy()))
        part = draw_partition(1.0 / m, num_samples, self.seed, **self._sampler_kwargs())
        self.register_buffer("pitch", torch.from_numpy(part.pitch.copy()))
        self.register_buffer("offset", torch.from_numpy(part.offset.copy()))
        # This layer's own kept CPU plans (plsh_fast.cpu.PlanCache): the layers of a model
        # do not evict each other's plans from one shared budget (eager calls).
        self.plan_cache = PlanCache()

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
            draw_partition(self.sigma, self.num_samples, self.seed, **self._sampler_kwargs())
        )
        self.num_draws = 0

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
            self.sigma, self.num_samples, derived_seed(self.seed, draw), **self._sampler_kwargs()
        )

    def get_extra_state(self):
        return {"seed": self.seed, "num_draws": self.num_draws}

    def set_extra_state(self, state) -> None:
        if not isinstance(state, dict) or not {"seed", "num_draws"} <= set(state):
            raise ValueError(
                "state_dict: extra state of PLSHAttention must be a dict with "
                f"'seed' and 'num_draws', got {state!r}"
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
        kind = "exact ALiBi" if self.exact else f"num_samples={self.num_samples}"
        return (
            f"num_heads={self.num_heads}, {kind}, causal={self.causal}, "
            f"resample={self.resample!r}, backend={self.backend!r}, seed={self.seed}"
            + ("" if self.sampler == "iid" else f", sampler={self.sampler!r}")
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

            if self.sampler == "iid":
                return training_partition(self.slopes, self.draw_counter, self.seed, self.pitch)
            return training_partition(
                self.slopes, self.draw_counter, self.seed, self.pitch, self.sampler,
                self.group_size,
            )  # fmt: skip
        return self.pitch, self.offset

    def forward(
        self, query, key, value, query_positions=None, key_positions=None, attention_mask=None
    ):
        """Attention output.

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

        Returns
        -------
        torch.Tensor
            ``(batch, num_heads, n_q, head_dim_v)``, the query's dtype.

        Raises
        ------
        TypeError, ValueError
            See :func:`check_attention_inputs` and :func:`plsh_fast.plsh_attention`
            (positions, mask).
        """
        check_attention_inputs(query, key, value, self.num_heads)
        if self.exact or self.backend == "dense":
            batch, _, n_q, _ = query.shape
            n_k, device = key.shape[2], query.device
            qpos = P.check_positions("query_positions", query_positions, batch, n_q, device)
            kpos = P.check_positions("key_positions", key_positions, batch, n_k, device)
            mask = P.check_attention_mask(attention_mask, batch, n_k, device)
            default_q, default_k = P.default_positions(n_q, n_k, device)
            qpos = default_q if qpos is None else qpos
            kpos = default_k if kpos is None else kpos
            if not torch.compiler.is_compiling():
                mask = _eager_mask_values(mask)
                real_q, real_k = P.real_positions(qpos, kpos, mask, batch)
                P.check_position_range("query_positions", real_q)
                P.check_position_range("key_positions", real_k)
            if self.exact:
                bias = _alibi_bias(self.slopes, qpos, kpos, self.causal)
            else:
                bias = _log_count_bias(*self._forward_partition(), qpos, kpos, self.causal)
            bias = _mask_bias(bias, mask, n_q, n_k)
            return biased_sdpa(query, key, value, bias, scale=self.scale)
        from .api import plsh_attention  # noqa: PLC0415 (plsh_fast.api imports torch/triton)

        def attend():
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
                backend=self.backend,
                check_finite=self.check_finite,
            )

        if torch.compiler.is_compiling():  # the compiled operator keeps plans process-wide
            return attend()
        with use_plan_cache(self.plan_cache):  # this layer's CPU plans
            return attend()


def _eager_mask_values(mask):
    """A bool mask; integer entries other than 0/1 raise (reads the mask; eager only)."""
    if mask is None or mask.dtype == torch.bool:
        return mask
    if bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError("attention_mask: integer entries must be 0 (pad) or 1 (keep)")
    return mask != 0


def _pairwise(qpos: torch.Tensor, kpos: torch.Tensor):
    """``(p_i, p_j)`` broadcast to ``(B or 1, 1, n_q, n_k)`` from 1-D or 2-D positions."""
    qpos = qpos if qpos.dim() == 2 else qpos[None]
    kpos = kpos if kpos.dim() == 2 else kpos[None]
    return qpos[:, None, :, None], kpos[:, None, None, :]


def _alibi_bias(slopes, qpos, kpos, causal: bool) -> torch.Tensor:
    """Exact ALiBi bias ``-m_h |p_i - p_j|`` (``-inf`` causally), float64 ``(B|1, H, n_q, n_k)``.

    The torch form of :func:`plsh_ref.alibi.alibi_bias` (float64, same operations).
    """
    pi, pj = _pairwise(qpos, kpos)
    distance = (pi - pj).abs().to(torch.float64)
    bias = -slopes.to(torch.float64)[None, :, None, None] * distance
    if causal:
        bias = bias.masked_fill(pj > pi, -math.inf)
    return bias


def _log_count_bias(pitch, offset, qpos, kpos, causal: bool) -> torch.Tensor:
    """``log(C / s)`` (``-inf`` where ``C = 0``), float64 ``(B|1, H, n_q, n_k)``.

    ``C[h, i, j] = #{t : bin_t(p_i) = bin_t(p_j)}`` times the causal mask, with the bins
    of :func:`plsh_fast._partition.bins` (binary64, equal to the reference's); summed one
    sample at a time, so memory is ``O(B H n_q n_k)``.
    """
    num_samples = pitch.shape[1]
    q2 = qpos if qpos.dim() == 2 else qpos[None]
    k2 = kpos if kpos.dim() == 2 else kpos[None]
    bq = torch_bins(pitch, offset, q2.reshape(-1)).view(*pitch.shape, *q2.shape)
    bk = torch_bins(pitch, offset, k2.reshape(-1)).view(*pitch.shape, *k2.shape)
    # (H, s, B, n) -> (B, H, s, n)
    bq, bk = bq.permute(2, 0, 1, 3), bk.permute(2, 0, 1, 3)
    count = torch.zeros(
        max(bq.shape[0], bk.shape[0]),
        pitch.shape[0],
        q2.shape[1],
        k2.shape[1],
        dtype=torch.float64,
        device=pitch.device,
    )
    for t in range(num_samples):
        count += bq[:, :, t, :, None] == bk[:, :, t, None, :]
    if causal:
        pi, pj = _pairwise(qpos, kpos)
        count = count.masked_fill(pj > pi, 0.0)
    return count_bias(count, num_samples)


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
        The core, called as ``attention(q, k, v, positions, positions)`` (and
        ``attention_mask=`` when one is given) on
        ``(batch, heads, seq, head_dim)`` tensors; default
        ``PLSHAttention(num_heads, **attention_kwargs)``. Baselines (no bias, fixed
        blocks) plug in here.
    **attention_kwargs
        Passed to :class:`PLSHAttention` when ``attention`` is not given.

    Raises
    ------
    TypeError, ValueError
        On non-integer or non-dividing sizes, or a core with another ``num_heads``.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        num_heads_kv: int | None = None,
        projection_bias: bool = False,
        attention: nn.Module | None = None,
        **attention_kwargs,
    ):
        super().__init__()
        if "bias" in attention_kwargs:
            warnings.warn(
                "bias: deprecated, use projection_bias (the same)",
                DeprecationWarning,
                stacklevel=2,
            )
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

    def forward(self, x, positions=None, attention_mask=None):
        """Self-attention of ``x``.

        Parameters
        ----------
        x : torch.Tensor, ``(batch, seq_len, embed_dim)``
        positions : torch.Tensor or array_like of int, optional
            Absolute positions of the tokens, ``(seq_len,)`` shared by the batch or
            ``(batch, seq_len)`` per sequence (HF ``position_ids``), used for queries and
            keys; default ``0..seq_len-1``.
        attention_mask : torch.Tensor, optional
            Key-padding mask ``(batch, seq_len)``, 1 = keep, 0 = pad (HF convention);
            pad tokens' rows are 0 before ``out_proj`` (see :class:`PLSHAttention`).

        Returns
        -------
        torch.Tensor
            ``(batch, seq_len, embed_dim)``.

        Raises
        ------
        TypeError
            If ``x`` is not a floating-point ``torch.Tensor``.
        ValueError
            If ``x`` is not ``(batch, seq_len, embed_dim)``.
        """
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
        if attention_mask is None:
            y = self.attention(q, k, v, positions, positions)
        else:
            y = self.attention(q, k, v, positions, positions, attention_mask=attention_mask)
        return self.out_proj(y.transpose(1, 2).reshape(b, n, self.embed_dim))
