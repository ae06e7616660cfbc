"""Small causal byte-level transformer with a pluggable positional scheme.

No positional embeddings: positions enter only through the attention core, as in ALiBi
models. Variants (the paper's downstream comparison, Wolfson & Wagner 2026):

* ``alibi``: exact ALiBi (:class:`plsh_fast.nn.PLSHAttention` with ``method="exact"``);
* ``plsh-S``: positional LSH with ``S`` hashes per head, a fresh partition every training
  forward and a fixed, seeded one in eval mode;
* ``none``: causal attention without positional bias;
* ``blocks``: attention restricted to fixed blocks ``floor(p / b_h)`` (causal); by default
  ``b_h = round(2 sigma_h)``, the mean PLSH pitch of head ``h``, i.e. one deterministic
  partition per head with the pitch PLSH draws on average and offset 0.

Every variant has the same parameters (the cores have none), so one init seed gives
identical initial weights across variants.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from plsh_ref.alibi import alibi_slopes, resolve_positions
from plsh_ref.partition import derived_seed
from plsh_ref.validation import check_int

from ..nn import (
    PLSHAttention,
    PLSHSelfAttention,
    biased_sdpa,
    check_attention_inputs,
)

__all__ = [
    "ByteLM",
    "FixedBlockAttention",
    "NoBiasAttention",
    "default_block_sizes",
    "make_attention",
    "parse_variant",
]

_PLSH = re.compile(r"^plsh-(\d+)$")


def parse_variant(name: str) -> tuple[str, int | None]:
    """``"alibi" | "none" | "blocks" | "plsh-S"`` -> (kind, num_samples or None).

    Raises
    ------
    ValueError
        On an unknown name or ``S < 1``.

    References
    ----------
    ``docs/experiments.md``, "Training"; ``README.md``, "Command line"
    (the ``plsh train-lm`` variants).
    """
    if name in ("alibi", "none", "blocks"):
        return name, None
    match = _PLSH.match(name)
    if match and int(match.group(1)) >= 1:
        return "plsh", int(match.group(1))
    raise ValueError(
        f"variants: unknown variant {name!r} (use alibi, none, blocks, plsh-S with S >= 1)"
    )


def default_block_sizes(num_heads: int) -> list[int]:
    """Per-head fixed block size ``round(2 sigma_h)`` (mean PLSH pitch), at least 1.

    References
    ----------
    SPEC section 2 (pitch mean ``2 sigma``) and section 1 (``sigma_h = 1 / m_h``).
    """
    return [max(1, int(round(2.0 / m))) for m in alibi_slopes(num_heads)]


class _MaskAttention(nn.Module):
    """Dense causal attention with a 0/-inf mask from positions (baseline cores)."""

    def __init__(self, num_heads: int, causal: bool = True):
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        self.causal = bool(causal)

    def _allowed(self, qpos: np.ndarray, kpos: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def forward(self, query, key, value, query_positions=None, key_positions=None):
        check_attention_inputs(query, key, value, self.num_heads)
        qpos, kpos = resolve_positions(query.shape[2], key.shape[2], query_positions, key_positions)
        allowed = np.broadcast_to(self._allowed(qpos, kpos), (self.num_heads, qpos.size, kpos.size))
        if self.causal:
            allowed = allowed & (kpos[None, None, :] <= qpos[None, :, None])
        bias = torch.from_numpy(np.where(allowed, 0.0, -np.inf))
        return biased_sdpa(query, key, value, bias=bias)


class NoBiasAttention(_MaskAttention):
    """Baseline core: ``softmax(q k^T / sqrt(d))`` with the causal mask only.

    References
    ----------
    ``docs/experiments.md`` (the baseline without positional bias);
    ``plsh_ref.attention.no_bias_attention``.
    """

    def _allowed(self, qpos, kpos):
        return np.ones((1, qpos.size, kpos.size), dtype=bool)


class FixedBlockAttention(_MaskAttention):
    """Baseline core: attend only within fixed blocks ``floor(p / b_h)`` (and causal).

    Same function as :func:`plsh_ref.attention.fixed_block_attention`.

    Parameters
    ----------
    num_heads : int
    block_sizes : sequence of int
        One block size (tokens, >= 1) per head.
    causal : bool

    References
    ----------
    ``docs/experiments.md`` (the baseline with fixed blocks).
    """

    def __init__(self, num_heads: int, block_sizes: Sequence[int], causal: bool = True) -> None:
        super().__init__(num_heads, causal)
        sizes = [check_int("block_sizes", b, minimum=1) for b in block_sizes]
        if len(sizes) != self.num_heads:
            raise ValueError(f"block_sizes: needs {self.num_heads} entries, got {len(sizes)}")
        self.block_sizes = sizes

    def _allowed(self, qpos, kpos):
        size = np.asarray(self.block_sizes, dtype=np.int64)[:, None, None]
        return (qpos[None, :, None] // size) == (kpos[None, None, :] // size)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, block_sizes={self.block_sizes}"


def make_attention(
    variant: str,
    num_heads: int,
    *,
    seed: int,
    backend: str = "auto",
    block_sizes: Sequence[int] | None = None,
    resample: str = "every_forward",
    sampler: str = "iid",
) -> nn.Module:
    """The attention core of one layer for ``variant`` (see :func:`parse_variant`).

    References
    ----------
    ``docs/experiments.md``, "Training"; ``README.md``, "Command line"
    (the ``plsh train-lm`` variants).
    """
    kind, s = parse_variant(variant)
    if kind == "alibi":
        return PLSHAttention(num_heads, 1, method="exact", seed=seed)
    if kind == "plsh":
        assert s is not None  # "plsh-S" always names S
        return PLSHAttention(
            num_heads, s, seed=seed, backend=backend, resample=resample, sampler=sampler
        )
    if kind == "none":
        return NoBiasAttention(num_heads)
    return FixedBlockAttention(num_heads, block_sizes or default_block_sizes(num_heads))


class _Block(nn.Module):
    def __init__(self, d_model: int, num_heads: int, attention: nn.Module, mlp_ratio: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = PLSHSelfAttention(d_model, num_heads, attention=attention)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, mlp_ratio * d_model),
            nn.GELU(),
            nn.Linear(mlp_ratio * d_model, d_model),
        )

    def forward(self, x, positions=None):
        x = x + self.attn(self.ln1(x), query_positions=positions)
        return x + self.mlp(self.ln2(x))


class ByteLM(nn.Module):
    """Pre-LayerNorm causal transformer over bytes (vocabulary 256), tied embeddings.

    Parameters
    ----------
    variant : str
        Positional scheme, see :func:`parse_variant`.
    d_model, num_layers, num_heads : int
        Width, depth, heads (``d_model % num_heads == 0``).
    mlp_ratio : int
        MLP hidden width / ``d_model``.
    seed : int
        Partition seed; layer ``l`` uses :func:`plsh_ref.partition.derived_seed` ``(seed, l)``.
    backend : {"auto", "cpu", "triton", "dense"}
        PLSH backend (see :class:`plsh_fast.nn.PLSHAttention`).
    block_sizes : sequence of int, optional
        Per-head block sizes of the ``blocks`` variant.
    resample : {"every_forward", "fixed"}
        Training partitions of the PLSH variants (see :class:`plsh_fast.nn.PLSHAttention`).
    sampler : {"iid", "stratified", "shared"}
        Partition sampler of the PLSH variants (``proofs_notes/samplers.md``).

    Notes
    -----
    Parameters are initialised from torch's global RNG (normal, std 0.02); call
    ``torch.manual_seed`` first for identical weights across variants.
    """

    def __init__(
        self,
        variant: str,
        *,
        d_model: int = 128,
        num_layers: int = 4,
        num_heads: int = 4,
        mlp_ratio: int = 4,
        seed: int = 0,
        backend: str = "auto",
        block_sizes: Sequence[int] | None = None,
        resample: str = "every_forward",
        sampler: str = "iid",
    ) -> None:
        super().__init__()
        parse_variant(variant)
        self.variant = variant
        self.embed = nn.Embedding(256, d_model)
        self.blocks = nn.ModuleList(
            _Block(
                d_model,
                num_heads,
                make_attention(
                    variant,
                    num_heads,
                    seed=derived_seed(seed, layer),
                    backend=backend,
                    block_sizes=block_sizes,
                    resample=resample,
                    sampler=sampler,
                ),
                mlp_ratio,
            )
            for layer in range(num_layers)
        )
        self.ln_f = nn.LayerNorm(d_model)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                bias = getattr(module, "bias", None)
                if bias is not None:
                    nn.init.zeros_(bias)

    def attention_cores(self) -> list[nn.Module]:
        """The attention core of every layer."""
        return [cast(Any, block).attn.attention for block in self.blocks]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-byte logits ``(batch, seq_len, 256)`` for int64 ``tokens (batch, seq_len)``."""
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.embed.weight.T
