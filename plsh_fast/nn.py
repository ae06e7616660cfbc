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

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from plsh_ref.alibi import alibi_bias, resolve_positions
from plsh_ref.partition import PartitionSample, count_bias, counts, draw_partition
from plsh_ref.validation import check_bool, check_int, check_positive_float, check_scale

from . import _validation as V

__all__ = [
    "PLSHAttention",
    "PLSHSelfAttention",
    "biased_sdpa",
    "check_attention_inputs",
    "derived_seed",
]

_RESAMPLE = ("every_forward", "fixed")
_BACKENDS = ("fast", "dense")


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
    bias : torch.Tensor or numpy.ndarray, ``(num_heads, n_q, n_k)``
        Additive bias (``-inf`` masks a pair); cast to the query's dtype and device. NaN
        and ``+inf`` (also after the cast) are refused: a NaN row would otherwise come out
        as an empty row (output 0) without a word.
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
    if tuple(bias.shape) != (num_heads, n_q, n_k):
        raise ValueError(
            f"bias: shape {tuple(bias.shape)} does not match (num_heads, n_q, "
            f"n_k) = {(num_heads, n_q, n_k)}"
        )
    if bias.numel() and bool((torch.isnan(bias) | (bias == float("inf"))).any()):
        raise ValueError(f"bias: contains NaN or +inf in {query.dtype} (use -inf for masked pairs)")
    group = num_heads // key.shape[1]
    if group > 1:
        key = key.repeat_interleave(group, dim=1)
        value = value.repeat_interleave(group, dim=1)
    if scale is None:
        scale = check_scale(scale, query.shape[3])
    if n_k == 0 or n_q == 0:
        return query.new_zeros(query.shape[:3] + (value.shape[3],))
    empty = ~torch.isfinite(bias).any(dim=-1, keepdim=True)  # (H, n_q, 1): no admissible key
    has_empty = bool(empty.any())
    if has_empty:
        bias = bias.masked_fill(empty, 0.0)
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=bias[None], scale=float(scale)
    )
    if has_empty:
        out = out.masked_fill(empty[None], 0.0)
    return out


def _in_backward_pass() -> bool:
    """Whether an autograd backward pass is running in this thread (checkpoint recompute)."""
    task_id = getattr(torch._C, "_current_graph_task_id", None)
    return task_id is not None and task_id() != -1


def derived_seed(seed: int, *keys: int) -> int:
    """A child seed ``SeedSequence([seed, *keys])`` as a 63-bit ``int`` (one definition).

    Used for the ``draw``-th training partition of a module (``derived_seed(seed, draw)``)
    and for the partition seed of layer ``l`` of a model (``derived_seed(seed, l)``,
    :mod:`plsh_fast.experiments.model`). Children of distinct key tuples are independent
    streams (numpy ``SeedSequence`` entropy mixing); the top bit is dropped so that the
    result is a valid non-negative ``seed``.

    Parameters
    ----------
    seed : int
        Parent seed ``>= 0``.
    *keys : int
        Non-negative integers naming the child (draw index, layer index, ...).

    Returns
    -------
    int
        In ``[0, 2**63)``.

    Raises
    ------
    TypeError, ValueError
        If ``seed`` or a key is not an integer ``>= 0``.
    """
    seed = check_int("seed", seed, minimum=0)
    keys = [check_int("keys", k, minimum=0) for k in keys]
    state = np.random.SeedSequence([seed, *keys]).generate_state(1, np.uint64)[0]
    return int(state >> np.uint64(1))


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
        ``None`` picks a random seed once, at construction; it is kept in the state dict.
    resample : {"every_forward", "fixed"}
        In training mode, draw a fresh partition every forward (the draw counter is saved
        in the state dict, so a resumed run continues the same stream), or use the
        module's own partition as in eval mode. Activation checkpointing recomputes the
        forward during the backward pass, where ``"every_forward"`` would draw another
        partition than the one the loss used: that case raises ``ValueError``; use
        ``"fixed"`` (and :meth:`set_partition` between steps) in checkpointed regions.
    exact : bool
        Compute exact ALiBi attention (dense bias through SDPA) instead of PLSH.
    backend : {"fast", "dense"}
        ``"fast"``: :func:`plsh_fast.plsh_attention` (fused; Triton on CUDA, vectorised
        torch on CPU). ``"dense"``: SDPA with a dense ``log C`` bias (the same function,
        ``O(n_q n_k)`` memory; for short sequences and comparisons).

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

    Raises
    ------
    TypeError, ValueError
        On invalid arguments (message starts with the argument name).
    """

    _FLOAT64_BUFFERS = ("slopes", "pitch", "offset")

    def __init__(
        self,
        num_heads: int,
        num_samples: int = 16,
        *,
        slopes=None,
        causal: bool = True,
        scale=None,
        seed: int | None = 0,
        resample: str = "every_forward",
        exact: bool = False,
        backend: str = "fast",
    ):
        super().__init__()
        num_heads = check_int("num_heads", num_heads, minimum=1)
        num_samples = V.check_num_samples(num_samples)
        m = V.check_slopes(slopes, num_heads)
        if scale is not None:
            scale = check_positive_float("scale", scale)
        if resample not in _RESAMPLE:
            raise ValueError(f"resample: must be one of {_RESAMPLE}, got {resample!r}")
        if backend not in _BACKENDS:
            raise ValueError(f"backend: must be one of {_BACKENDS}, got {backend!r}")
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1, np.uint64)[0] >> np.uint64(1))
        self.seed = check_int("seed", seed, minimum=0)
        self.num_heads = num_heads
        self.causal = check_bool("causal", causal)
        self.scale = scale
        self.resample = resample
        self.exact = check_bool("exact", exact)
        self.backend = backend
        self.num_draws = 0
        self.register_buffer("slopes", torch.from_numpy(m.copy()))
        part = draw_partition(1.0 / m, num_samples, self.seed)
        self.register_buffer("pitch", torch.from_numpy(part.pitch.copy()))
        self.register_buffer("offset", torch.from_numpy(part.offset.copy()))

    # ------------------------------------------------------------------ state
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
            self.pitch.detach().cpu().numpy(), self.offset.detach().cpu().numpy()
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
        return draw_partition(self.sigma, self.num_samples, derived_seed(self.seed, draw))

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
        return self

    def extra_repr(self) -> str:
        kind = "exact ALiBi" if self.exact else f"num_samples={self.num_samples}"
        return (
            f"num_heads={self.num_heads}, {kind}, causal={self.causal}, "
            f"resample={self.resample!r}, backend={self.backend!r}, seed={self.seed}"
        )

    # ---------------------------------------------------------------- forward
    def _forward_partition(self) -> PartitionSample:
        if self.training and self.resample == "every_forward":
            if _in_backward_pass():
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
            part = self.training_partition(self.num_draws)
            self.num_draws += 1
            return part
        return self.partition

    def forward(self, query, key, value, query_positions=None, key_positions=None):
        """Attention output.

        Parameters
        ----------
        query : torch.Tensor, ``(batch, num_heads, n_q, head_dim)``
        key : torch.Tensor, ``(batch, num_heads_kv, n_k, head_dim)``
        value : torch.Tensor, ``(batch, num_heads_kv, n_k, head_dim_v)``
            One floating dtype, one device; ``num_heads % num_heads_kv == 0``.
        query_positions, key_positions : array_like or torch.Tensor of int, optional
            Absolute positions ``(n_q,)``, ``(n_k,)``, shared by the batch; default keys
            ``0..n_k-1`` and queries aligned to the end. Any length works: the partition
            is a function of positions.

        Returns
        -------
        torch.Tensor
            ``(batch, num_heads, n_q, head_dim_v)``, the query's dtype.

        Raises
        ------
        TypeError, ValueError
            See :func:`check_attention_inputs`; non-integer positions.
        """
        check_attention_inputs(query, key, value, self.num_heads)
        qpos, kpos = resolve_positions(query.shape[2], key.shape[2], query_positions, key_positions)
        slopes = self.slopes.detach().cpu().numpy()
        if self.exact:
            bias = alibi_bias(slopes, qpos, kpos, causal=self.causal)
            return biased_sdpa(query, key, value, torch.from_numpy(bias), scale=self.scale)
        part = self._forward_partition()
        if self.backend == "dense":
            bias = count_bias(counts(part, qpos, kpos, causal=self.causal), part.num_samples)
            return biased_sdpa(query, key, value, torch.from_numpy(bias), scale=self.scale)
        from .api import plsh_attention  # noqa: PLC0415 (plsh_fast.api imports torch/triton)

        return plsh_attention(
            query,
            key,
            value,
            slopes=slopes,
            num_samples=part.num_samples,
            causal=self.causal,
            scale=self.scale,
            partition=part,
            query_positions=torch.from_numpy(qpos),
            key_positions=torch.from_numpy(kpos),
        )


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
    bias : bool
        Bias terms in the projections.
    attention : torch.nn.Module, optional
        The core, called as ``attention(q, k, v, positions, positions)`` on
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
        bias: bool = False,
        attention: nn.Module | None = None,
        **attention_kwargs,
    ):
        super().__init__()
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

    def forward(self, x, positions=None):
        """Self-attention of ``x``.

        Parameters
        ----------
        x : torch.Tensor, ``(batch, seq_len, embed_dim)``
        positions : array_like or torch.Tensor of int, ``(seq_len,)``, optional
            Absolute positions shared by queries and keys; default ``0..seq_len-1``.

        Returns
        -------
        torch.Tensor
            ``(batch, seq_len, embed_dim)``.

        Raises
        ------
        ValueError
            If ``x`` is not ``(batch, seq_len, embed_dim)``.
        """
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[2] != self.embed_dim:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x: must be (batch, seq_len, {self.embed_dim}), got {shape}")
        b, n, _ = x.shape

        def heads(t, h):
            return t.view(b, n, h, self.head_dim).transpose(1, 2)

        q = heads(self.q_proj(x), self.num_heads)
        k = heads(self.k_proj(x), self.num_heads_kv)
        v = heads(self.v_proj(x), self.num_heads_kv)
        y = self.attention(q, k, v, positions, positions)
        return self.out_proj(y.transpose(1, 2).reshape(b, n, self.embed_dim))
