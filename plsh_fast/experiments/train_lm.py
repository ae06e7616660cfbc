"""``plsh train-lm``: small byte-level LMs with exact ALiBi, PLSH and baselines.

The paper's downstream claim (Wolfson & Wagner 2026, experiments with Qwen3-0.6B and
Mistral-7B): with few hashes (s = 10, 20) positional LSH trains models as good as exact
ALiBi, better than no positional bias and than fixed blocks, also when evaluated at twice
the training length.
This command checks it at a scale that runs on two CPU cores.

* Data: the CPython standard library sources of the running interpreter, split into
  train/validation by file with a hash of the relative path
  (:mod:`plsh_fast.experiments.corpus`); bytes are the tokens.
* Model: :class:`plsh_fast.experiments.model.ByteLM`, a pre-LayerNorm causal transformer
  without positional embeddings; the variants differ only in the attention core
  (``alibi``, ``plsh-S``, ``none``, ``blocks`` with per-head block ``round(2 sigma_h)``).
* Protocol: for each seed, every variant starts from the same initial weights and sees
  the same batches in the same order (AdamW, linear warmup over 10% of the steps, cosine
  decay to 10%, gradient clipping at 1). PLSH draws a fresh partition every training
  forward (each layer its own stream).
* Evaluation: mean next-byte loss over the same held-out text cut into windows of ``L``,
  ``2L`` and ``4L`` bytes (every position scored), reported as bits per byte and
  perplexity per byte, mean and sample sd over seeds. PLSH variants are evaluated with
  their fixed, seeded eval partition, and also with exact ALiBi swapped in (rows
  ``plsh-S (eval: exact ALiBi)``), which separates the trained weights from the
  approximation at evaluation time.

Outputs in ``--out`` (default ``plsh_out/train-lm-<UTC time>``): ``results.json`` (every training
curve and evaluation), ``results.md`` (table and the exact command), ``results.png``
(training curves and validation bits per byte against evaluation length).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from plsh_ref.experiments.options import (
    DEFAULT_MAX_MEMORY_GIB,
    JoinedValues,
    StoreConst,
    StoreValue,
    check_memory,
    default_out_dir,
    deprecation,
    integer,
    number,
    option_message,
    output_folder,
)
from plsh_ref.provenance import run_metadata

if TYPE_CHECKING:  # torch is imported only when a run starts (`plsh train-lm --help` needs none)
    from torch import nn

    from .corpus import Corpus

#: what the command needs beyond plsh_ref (checked by the ``plsh`` dispatcher)
REQUIRES = ("torch",)

#: one line for ``plsh --help``
SUMMARY = "train small byte-level LMs: ALiBi vs PLSH vs baselines (needs torch)"

HELP = (
    "Train small causal byte-level transformers on the Python standard library with "
    "exact ALiBi, positional LSH (s=10, 20), no positional bias and fixed blocks; "
    "report validation bits per byte at 1x, 2x, 4x the training length."
)

DEFAULT_VARIANTS = "alibi,plsh-10,plsh-20,none,blocks"

#: (flag, attribute, type, default, help) of every option, in command order
_OPTIONS = [
    (
        "--variants",
        "variants",
        str,
        DEFAULT_VARIANTS,
        "comma- or space-separated variants: alibi, plsh-S (S hashes), none, blocks",
    ),
    ("--seq-len", "seq_len", int, 128, "training length L (bytes)"),
    ("--steps", "steps", int, 250, "optimizer steps per variant and seed"),
    ("--batch-size", "batch_size", int, 32, "sequences per step"),
    ("--d-model", "d_model", int, 128, "model width"),
    ("--layers", "layers", int, 4, "transformer layers"),
    ("--heads", "heads", int, 4, "attention heads (standard ALiBi slopes)"),
    ("--lr", "lr", float, 3e-3, "peak AdamW learning rate (linear warmup, cosine decay)"),
    ("--weight-decay", "weight_decay", float, 0.01, "AdamW weight decay"),
    ("--eval-lengths", "eval_lengths", str, "1,2,4", "evaluation lengths as multiples of L"),
    (
        "--eval-tokens",
        "eval_tokens",
        int,
        32768,
        "validation bytes scored at each evaluation length (same text for every length)",
    ),
    (
        "--block-size",
        "block_size",
        int,
        0,
        "block size of the 'blocks' variant; 0: per head round(2 sigma_h)",
    ),
    (
        "--resample",
        "resample",
        str,
        "every_forward",
        "PLSH training partitions: every_forward (fresh draw per forward) or fixed (the eval "
        "partition throughout)",
    ),
    (
        "--sampler",
        "sampler",
        str,
        "iid",
        "PLSH partition sampler: iid (the paper) or stratified (stratified pitches shared "
        "by systematic offsets, about 5x less kernel-matrix error at s=64; "
        "proofs_notes/samplers.md)",
    ),
    (
        "--backend",
        "backend",
        str,
        "dense",
        "PLSH backend: dense (SDPA with a log-count bias; fastest on CPU at these lengths) "
        "or auto, cpu, triton (plsh_fast.plsh_attention; 'fast' is the deprecated name of "
        "auto); the same function",
    ),
    (
        "--seed",
        "seeds",
        str,
        "0,1",
        "one or several seeds (space- or comma-separated); each seed fixes the initial weights, the batch order and the "
        "partitions, shared by all variants; the table reports mean +- sd over seeds",
    ),
    ("--val-fraction", "val_fraction", float, 0.05, "fraction of files held out"),
    (
        "--max-bytes",
        "max_bytes",
        int,
        0,
        "stop adding files to a split once it holds this many bytes (whole files, so a split "
        "may exceed it; 0: no cap)",
    ),
    ("--corpus", "corpus", str, "", "directory of .py files (default: the stdlib)"),
    ("--threads", "threads", int, 2, "torch CPU threads"),
    ("--out", "out", str, None, "output folder (default: plsh_out/train-lm-<UTC time>)"),
    (
        "--max-memory",
        "max_memory",
        float,
        DEFAULT_MAX_MEMORY_GIB,
        "refuse, before allocating, sizes (--seq-len, --batch-size, --heads, --layers, "
        "--d-model, --steps) whose estimated memory exceeds this many GiB",
    ),
]

#: the option of each parameter name that starts an error message (``root``: of the corpus)
PARAMETER_OPTIONS = {dest: flag for flag, dest, _, _, _ in _OPTIONS} | {"root": "--corpus"}

#: accepted values of --backend (those of plsh_fast.nn.PLSHAttention)
BACKENDS = ("auto", "cpu", "triton", "dense")

#: old option spellings (old -> new), accepted until 0.2 with a deprecation line
DEPRECATED = {"--seeds": "--seed", "--output": "--out", "--no-progress": "--quiet"}

#: integer options that accept 0 (meaning "default" or "no cap"); the others need >= 1
_ZERO_ALLOWED = ("block_size", "max_bytes")

#: most torch CPU threads accepted by --threads (torch takes an int32; more threads than
#: cores only slow a run down)
MAX_THREADS = 1024


def _output_folder(text: str) -> str:
    """``--out``: a folder that can be written or created (checked when parsing), as text."""
    return str(output_folder(text))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``plsh train-lm`` on an ``argparse`` parser.

    Shared spellings (``--out``, ``--seed``, ``--quiet``) follow
    :mod:`plsh_ref.experiments.options`; the old ones in :data:`DEPRECATED` still work.

    References
    ----------
    ``README.md``, "Command line" (the shared option spellings); ``argparse``.
    """
    for flag, dest, typ, default, text in _OPTIONS:
        kw: dict[str, Any]
        if dest == "seeds":
            kw = dict(action=JoinedValues, element=int, minimum=0, metavar="SEED")
        elif dest == "variants":
            kw = dict(action=JoinedValues, element=str.strip, metavar="VARIANTS")
        elif dest == "out":
            kw = dict(action=StoreValue, type=_output_folder, metavar="DIR")
            text = text.split(" (default")[0]
        elif typ is int:
            top = MAX_THREADS if dest == "threads" else None
            kw = dict(type=integer(minimum=0 if dest in _ZERO_ALLOWED else 1, maximum=top))
        elif dest == "max_memory":
            kw = dict(type=number(positive=True, unit="GiB"), metavar="GIB")
        elif typ is float:
            kw = dict(type=number())
        else:
            kw = dict(type=typ)
        shown = "plsh_out/train-lm-<UTC time>" if dest == "out" else default
        if dest == "corpus":
            shown = "the standard library"
            text = text.split(" (default")[0]
        if isinstance(default, float):
            shown = f"{default:g}"
        parser.add_argument(
            flag, dest=dest, default=default, help=f"{text} (default: {shown})", **kw
        )
        old = [o for o, new in DEPRECATED.items() if new == flag]
        if old:
            parser.add_argument(*old, dest=dest, replacement=flag, help=argparse.SUPPRESS, **kw)
    parser.add_argument(
        "--no-eval-exact",
        dest="eval_exact",
        action="store_false",
        help="skip evaluating PLSH-trained models with exact ALiBi",
    )
    quiet: dict[str, Any] = dict(dest="progress", action=StoreConst, const=False, default=True)
    parser.add_argument(
        "--quiet",
        help="no progress bars and no commentary: results and the output path only",
        **quiet,
    )
    parser.add_argument("--no-progress", replacement="--quiet", help=argparse.SUPPRESS, **quiet)


def command_line(args: argparse.Namespace) -> str:
    """The full ``plsh train-lm`` command (every option spelled out) that reproduces ``args``.

    References
    ----------
    ``README.md``, "Command line" (``plsh train-lm``); ``docs/experiments.md``, "Training".
    """
    parts = ["plsh", "train-lm"]
    for flag, dest, _, _, _ in _OPTIONS:
        value = getattr(args, dest)
        if dest == "out" or (dest == "corpus" and not value):
            continue
        parts += [flag, str(value)]
    if not args.eval_exact:
        parts.append("--no-eval-exact")
    return " ".join(parts)


def memory_estimate(
    seq_len: int, batch_size: int, heads: int, layers: int, longest_factor: int
) -> int:
    """Bytes of the attention arrays of one run at their peak (an upper estimate).

    Training keeps, per layer, about four float32 ``(batch, heads, L, L)`` arrays for the
    backward pass (bias, scores, probabilities, their gradient) and the log-count bias of
    PLSH; evaluation at the longest length ``f L`` holds four such arrays for
    ``max(1, 16384 // (f L))`` windows of one layer at a time. Model weights and
    activations of width ``d_model`` are small beside them at these sizes.

    References
    ----------
    ``README.md``, "Command line" (sizes over ``--max-memory`` are refused before
    allocating).
    """
    train = 4 * 4 * layers * batch_size * heads * seq_len**2 + 8 * layers * heads * seq_len**2
    length = longest_factor * seq_len
    evaluation = 4 * 4 * max(1, 16384 // length) * heads * length**2
    return int(max(train, evaluation))


def model_memory_estimate(d_model: int, layers: int, mlp_ratio: int = 4) -> int:
    """Bytes of the model's parameters with their gradients and AdamW's two moments (an
    upper estimate: 16 bytes per float32 parameter).

    The byte embedding and output layer hold ``2 * 256 * d_model`` parameters, each layer
    ``(4 + 2 * mlp_ratio) d_model**2`` (query/key/value/output projections and the MLP)
    plus ``O(d_model)`` biases and norms (``plsh_fast.experiments.model``); checked
    against the parameter count of ``ByteLM`` (``tests/cli/test_cli.py``).

    Parameters
    ----------
    d_model, layers, mlp_ratio : int
        The model's width, number of layers and MLP width factor.

    Returns
    -------
    int
        Bytes. Nothing is raised here; ``plsh train-lm`` compares the result with
        ``--max-memory``.

    References
    ----------
    ``README.md``, "Command line" (``--max-memory``); ``torch.optim.AdamW`` (two
    moments per parameter).
    """
    per_layer = (4 + 2 * mlp_ratio) * d_model**2 + (8 + mlp_ratio) * d_model
    return int(16 * (2 * 256 * d_model + layers * per_layer))


def _check_args(args) -> tuple[list[str], list[int], list[int]]:
    from .model import parse_variant

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants:
        raise ValueError("variants: empty list")
    for v in variants:
        parse_variant(v)
    if len(set(variants)) != len(variants):
        raise ValueError(f"variants: duplicates in {variants}")
    try:
        factors = sorted({int(f) for f in args.eval_lengths.split(",")})
    except ValueError:
        raise ValueError(
            f"eval_lengths: must be comma-separated integers, got {args.eval_lengths!r}"
        ) from None
    try:
        seeds = [int(x) for x in args.seeds.split(",")]
    except ValueError:
        raise ValueError(f"seeds: must be comma-separated integers, got {args.seeds!r}") from None
    if min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds: must be distinct and >= 0, got {args.seeds!r}")
    if not factors or factors[0] < 1:
        raise ValueError(f"eval_lengths: multiples must be >= 1, got {args.eval_lengths!r}")
    for name in (
        "seq_len",
        "steps",
        "batch_size",
        "d_model",
        "layers",
        "heads",
        "eval_tokens",
        "threads",
    ):
        if getattr(args, name) < 1:
            raise ValueError(f"{name}: must be >= 1, got {getattr(args, name)}")
    # sizes before the options that depend on them: --seq-len 100000000 was reported as
    # an --eval-tokens below the longest evaluation length
    _check_sizes(args, factors)
    if args.d_model % args.heads:
        raise ValueError(f"d_model: {args.d_model} not divisible by --heads {args.heads}")
    if args.eval_tokens < args.seq_len * factors[-1]:
        raise ValueError(
            f"eval_tokens: must be >= the longest evaluation length "
            f"{args.seq_len * factors[-1]}, got {args.eval_tokens}"
        )
    if args.resample not in ("every_forward", "fixed"):
        raise ValueError(f"resample: must be 'every_forward' or 'fixed', got {args.resample!r}")
    if args.sampler not in ("iid", "stratified"):
        raise ValueError(f"sampler: must be 'iid' or 'stratified', got {args.sampler!r}")
    if args.backend == "fast":  # the old name of "auto" (plsh_fast.nn), until 0.2
        deprecation("--backend fast", "--backend auto")
        args.backend = "auto"
    if args.backend not in BACKENDS:
        raise ValueError(f"backend: must be one of {', '.join(BACKENDS)}, got {args.backend!r}")
    if args.backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        # the models train on CPU tensors: found only at the first PLSH variant otherwise,
        # after the variants before it had trained
        raise ValueError(
            "backend: 'triton' on CPU tensors (this command trains on the CPU) needs "
            "TRITON_INTERPRET=1 set before triton is imported"
        )
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise ValueError(f"lr: must be finite and > 0, got {args.lr}")
    if not (math.isfinite(args.weight_decay) and args.weight_decay >= 0):
        raise ValueError(f"weight_decay: must be finite and >= 0, got {args.weight_decay}")
    if not 0.0 < args.val_fraction < 1.0:
        raise ValueError(f"val_fraction: must lie in (0, 1), got {args.val_fraction}")
    for name in ("block_size", "max_bytes"):
        if getattr(args, name) < 0:
            raise ValueError(f"{name}: must be >= 0 (0: default), got {getattr(args, name)}")
    return variants, factors, seeds


def _largest(args, names, factors=None) -> tuple[str, object]:
    """Of the options ``names`` (attributes), the one furthest above its default, and its
    value; ``factors``: also ``--eval-lengths`` (its longest multiple against 4)."""
    defaults = {dest: default for _, dest, _, default, _ in _OPTIONS}
    ratios = {PARAMETER_OPTIONS[name]: getattr(args, name) / defaults[name] for name in names}
    values = {PARAMETER_OPTIONS[name]: getattr(args, name) for name in names}
    if factors is not None:
        ratios["--eval-lengths"] = factors[-1] / 4
        values["--eval-lengths"] = args.eval_lengths
    option = max(ratios, key=lambda o: ratios[o])
    return option, values[option]


def _check_sizes(args, factors) -> None:
    """Refuse, before allocating, sizes over ``--max-memory``, naming the option to lower.

    The attention arrays grow with ``--seq-len``, ``--batch-size``, ``--heads`` and
    ``--layers`` (:func:`memory_estimate`), the model with ``--d-model`` and ``--layers``
    (:func:`model_memory_estimate`), the batch order with ``--steps`` times
    ``--batch-size`` (int64 offsets); the message names the option furthest above its
    default.
    """
    attention = memory_estimate(args.seq_len, args.batch_size, args.heads, args.layers, factors[-1])
    option, value = _largest(args, ("seq_len", "batch_size", "heads", "layers"), factors)
    check_memory(option, value, attention, args.max_memory)
    # before nn.Embedding allocates: --d-model 100000000 ended in torch's RuntimeError
    option, value = _largest(args, ("d_model", "layers"))
    check_memory(option, value, model_memory_estimate(args.d_model, args.layers), args.max_memory)
    option, value = _largest(args, ("steps", "batch_size"))
    order = 8 * args.steps * args.batch_size + 64 * args.steps  # offsets, training curve
    check_memory(option, value, order, args.max_memory)


def _lr_at(step: int, total: int, peak: float) -> float:
    warmup = max(1, total // 10)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def _windows(stream: np.ndarray, starts: np.ndarray, length: int):
    import torch

    idx = starts[:, None] + np.arange(length + 1)[None, :]
    chunk = torch.from_numpy(stream[idx].astype(np.int64))
    return chunk[:, :-1], chunk[:, 1:]


def evaluate(
    model: nn.Module, stream: np.ndarray, length: int, num_tokens: int, batch_tokens: int = 16384
) -> float:
    """Mean next-byte cross-entropy (nats) over non-overlapping windows of ``length``.

    The windows tile the first ``num_tokens`` (rounded down to a multiple of ``length``)
    predicted bytes of ``stream``; every position of every window is scored.

    References
    ----------
    ``README.md``, "Command line" (evaluation at 1x/2x/4x the training length);
    ``torch.nn.functional.cross_entropy``.
    """
    import torch
    from torch.nn import functional as F

    count = min(num_tokens, stream.size - 1) // length
    if count < 1:
        raise ValueError(f"stream: too short for one window of length {length}")
    starts = np.arange(count) * length
    per_batch = max(1, batch_tokens // length)
    total, n = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for b in range(0, count, per_batch):
            x, y = _windows(stream, starts[b : b + per_batch], length)
            logits = model(x)
            total += F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1), reduction="sum").item()
            n += y.numel()
    model.train(was_training)
    return total / n


def _metrics(loss: float) -> dict:
    return {"loss_nats": loss, "bits_per_byte": loss / math.log(2.0), "perplexity": math.exp(loss)}


def batch_order(corpus: Corpus, args: argparse.Namespace, seed: int) -> np.ndarray:
    """Start offsets ``(steps, batch_size)`` of the training windows for ``seed``.

    References
    ----------
    ``docs/experiments.md``, "Training"; ``numpy.random.SeedSequence``.
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    return rng.integers(0, corpus.train.size - args.seq_len - 1, size=(args.steps, args.batch_size))


def train_variant(
    variant: str,
    seed: int,
    corpus: Corpus,
    args: argparse.Namespace,
    batch_starts: np.ndarray,
    factors: Sequence[int],
    block_sizes: Sequence[int],
) -> dict:
    """Train one variant from the init of ``seed`` on ``batch_starts``; evaluate it.

    References
    ----------
    ``docs/experiments.md``, "Training"; ``torch.optim.AdamW``.
    """
    import torch
    from torch.nn import functional as F
    from tqdm import tqdm

    from .model import ByteLM, parse_variant

    torch.manual_seed(seed)
    model = ByteLM(
        variant,
        d_model=args.d_model,
        num_layers=args.layers,
        num_heads=args.heads,
        seed=seed,
        backend=args.backend,
        resample=args.resample,
        block_sizes=block_sizes,
        sampler=args.sampler,
    )
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay},
            {"params": rest, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    losses = []
    t0 = time.perf_counter()
    model.train()
    bar = tqdm(
        range(args.steps),
        desc=f"{variant:>8} seed {seed}",
        disable=not args.progress,
        dynamic_ncols=True,
        file=sys.stderr,
    )
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, args.steps, args.lr)
        x, y = _windows(corpus.train, batch_starts[step], args.seq_len)
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == args.steps - 1:
            bar.set_postfix(bpb=f"{losses[-1] / math.log(2):.3f}")
    bar.close()
    train_s = time.perf_counter() - t0
    result: dict[str, Any] = {
        "variant": variant,
        "seed": seed,
        "train_loss": losses,
        "train_seconds": train_s,
        "eval": {},
    }
    for f in factors:
        result["eval"][str(f)] = _metrics(
            evaluate(model, corpus.val, f * args.seq_len, args.eval_tokens)
        )
    if parse_variant(variant)[0] == "plsh" and args.eval_exact:
        cores: list[Any] = model.attention_cores()  # PLSHAttention cores (a plsh variant)
        for core in cores:
            core.exact = True
        result["eval_exact_alibi"] = {
            str(f): _metrics(evaluate(model, corpus.val, f * args.seq_len, args.eval_tokens))
            for f in factors
        }
        for core in cores:
            core.exact = False
    result["eval_seconds"] = time.perf_counter() - t0 - train_s
    return result


def summarize(results: list[dict], factors: Sequence[int]) -> list[dict]:
    """Rows of the table, one per variant (and per PLSH variant evaluated with exact ALiBi).

    Per evaluation length: mean and sample sd over seeds of the loss (as bits per byte and
    perplexity of the mean loss) and, when ``alibi`` was trained, the difference to
    ``alibi`` paired by seed (same initial weights and batches), mean and sd over seeds.

    References
    ----------
    ``docs/experiments.md``, "Training".
    """
    rows: dict[str, Any] = {}
    order: list[str] = []
    for r in results:
        for key, suffix in (("eval", ""), ("eval_exact_alibi", " (eval: exact ALiBi)")):
            if key not in r:
                continue
            name = r["variant"] + suffix
            if name not in rows:
                rows[name] = {str(f): {} for f in factors}
                order.append(name)
            for f in factors:
                rows[name][str(f)][r["seed"]] = r[key][str(f)]["loss_nats"]

    def mean_sd(x):
        x = np.asarray(x) / math.log(2.0)
        return float(x.mean()), (float(x.std(ddof=1)) if x.size > 1 else float("nan"))

    out = []
    for name in order:
        row: dict[str, Any] = {
            "name": name,
            "seeds": sorted(rows[name][str(factors[0])]),
            "lengths": {},
        }
        for f in factors:
            by_seed = rows[name][str(f)]
            loss = np.asarray([by_seed[k] for k in sorted(by_seed)])
            cell = dict(_metrics(float(loss.mean())))
            cell["bits_per_byte_sd"] = mean_sd(loss)[1]
            if "alibi" in rows:
                ref = rows["alibi"][str(f)]
                diff = [by_seed[k] - ref[k] for k in sorted(by_seed) if k in ref]
                cell["delta_bpb_vs_alibi"], cell["delta_bpb_vs_alibi_sd"] = mean_sd(diff)
            row["lengths"][str(f)] = cell
        out.append(row)
    return out


def _pm(mean: float, sd: float, digits: int = 4, sign: bool = False) -> str:
    text = f"{mean:+.{digits}f}" if sign else f"{mean:.{digits}f}"
    return text if math.isnan(sd) else f"{text} ± {sd:.{digits}f}"


def markdown_table(rows: list[dict], factors: Sequence[int], seq_len: int) -> str:
    """Validation bits per byte (mean ± sd over seeds), the paired difference to exact
    ALiBi (when trained) and the perplexity per byte, at each evaluation length.

    References
    ----------
    ``docs/experiments.md``, "Training".
    """
    lengths = [f * seq_len for f in factors]
    has_delta = "delta_bpb_vs_alibi" in rows[0]["lengths"][str(factors[0])]
    head = ["variant"] + [f"bpb @ {n}" for n in lengths]
    if has_delta:
        head += [f"Δ bpb vs alibi @ {n}" for n in lengths]
    head += [f"ppl @ {n}" for n in lengths]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for row in rows:
        cells = [row["lengths"][str(f)] for f in factors]
        line = [row["name"]] + [_pm(c["bits_per_byte"], c["bits_per_byte_sd"]) for c in cells]
        if has_delta:
            line += [
                _pm(c["delta_bpb_vs_alibi"], c["delta_bpb_vs_alibi_sd"], sign=True) for c in cells
            ]
        line += [f"{c['perplexity']:.3f}" for c in cells]
        lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines)


def _plot(results: list[dict], rows: list[dict], factors, seq_len: int, path: str) -> None:
    """Training curves, validation bpb against length, and the paired gap to exact ALiBi."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_delta = "delta_bpb_vs_alibi" in rows[0]["lengths"][str(factors[0])]
    fig, axes = plt.subplots(1, 3 if has_delta else 2, figsize=(16 if has_delta else 11, 4.4))
    curves: dict[str, Any] = {}
    for r in results:
        curves.setdefault(r["variant"], []).append(np.asarray(r["train_loss"]))
    colors = {v: f"C{k}" for k, v in enumerate(curves)}
    for variant, losses in curves.items():
        loss = np.mean(losses, axis=0) / math.log(2.0)
        k = max(1, len(loss) // 30)
        smooth = np.convolve(loss, np.ones(k) / k, mode="valid")
        axes[0].plot(np.arange(smooth.size) + k, smooth, color=colors[variant], label=variant)
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("training bits per byte (moving average, mean over seeds)")
    axes[0].set_title(f"training, L = {seq_len}")
    lengths = [f * seq_len for f in factors]
    for row in rows:
        base = row["name"].split(" ")[0]
        style = dict(
            color=colors[base],
            marker="o",
            capsize=3,
            label=row["name"],
            linestyle="--" if "exact ALiBi" in row["name"] else "-",
        )
        cells = [row["lengths"][str(f)] for f in factors]
        err = [c["bits_per_byte_sd"] for c in cells]
        axes[1].errorbar(
            lengths,
            [c["bits_per_byte"] for c in cells],
            yerr=None if any(map(math.isnan, err)) else err,
            **style,
        )
        if has_delta:
            err = [c["delta_bpb_vs_alibi_sd"] for c in cells]
            axes[2].errorbar(
                lengths,
                [c["delta_bpb_vs_alibi"] for c in cells],
                yerr=None if any(map(math.isnan, err)) else err,
                **style,
            )
    axes[1].set_ylabel("validation bits per byte (mean ± sd over seeds)")
    axes[1].set_title("length extrapolation")
    if has_delta:
        axes[2].axhline(0.0, color="gray", linewidth=0.8)
        axes[2].set_ylabel("bpb minus exact ALiBi (paired by seed)")
        axes[2].set_title("gap to exact ALiBi")
    for ax in axes[1:]:
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_xlabel("evaluation length (bytes)")
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """Run the experiment described by ``args`` (see :func:`add_arguments`); return 0.

    Raises
    ------
    ValueError
        On invalid options (message starts with the option's name).

    References
    ----------
    ``docs/experiments.md``, "Training"; ``README.md``, "Command line".
    """
    import torch

    from .corpus import load_corpus
    from .model import default_block_sizes

    try:
        variants, factors, seeds = _check_args(args)
        corpus = load_corpus(
            args.corpus or None, val_fraction=args.val_fraction, max_bytes=args.max_bytes or None
        )
        if corpus.train.size <= args.seq_len + 1:
            raise ValueError(
                f"corpus: training split has {corpus.train.size} bytes, fewer than --seq-len + 2"
            )
        if corpus.val.size <= args.seq_len * factors[-1]:  # noticed only after training
            raise ValueError(
                f"corpus: validation split has {corpus.val.size} bytes, fewer than the longest "
                f"evaluation length {args.seq_len * factors[-1]} + 1 (--seq-len, --eval-lengths)"
            )
    except ValueError as exc:  # name the options, not the parameters (steps: -> --steps:)
        raise ValueError(option_message(exc, (), PARAMETER_OPTIONS)) from None
    torch.set_num_threads(args.threads)
    block_sizes = (
        [args.block_size] * args.heads if args.block_size > 0 else default_block_sizes(args.heads)
    )
    out = str(args.out or default_out_dir("train-lm"))
    os.makedirs(out, exist_ok=True)
    cmd = command_line(args)
    if args.progress:
        print(f"plsh train-lm: {corpus.summary()}", file=sys.stderr)
    t0 = time.perf_counter()
    results = []
    for seed in seeds:
        starts = batch_order(corpus, args, seed)
        results += [
            train_variant(v, seed, corpus, args, starts, factors, block_sizes) for v in variants
        ]
    wall = time.perf_counter() - t0
    rows = summarize(results, factors)
    meta = {
        "command": cmd,
        "provenance": run_metadata(),
        "wall_seconds": wall,
        "corpus": corpus.summary(),
        "block_sizes": block_sizes,
        "eval_lengths": [f * args.seq_len for f in factors],
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "threads": args.threads,
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "params": {k: getattr(args, k) for _, k, _, _, _ in _OPTIONS},
    }
    table = markdown_table(rows, factors, args.seq_len)
    with open(os.path.join(out, "results.json"), "w") as fh:
        json.dump({"meta": meta, "table": rows, "results": results}, fh, indent=1)
    times: dict[str, Any] = {}
    for r in results:
        times[r["variant"]] = times.get(r["variant"], 0.0) + r["train_seconds"] / len(seeds)
    times_text = ", ".join(f"{v} {t:.0f} s" for v, t in times.items())
    spread = f"mean ± sample sd over seeds {seeds}" if len(seeds) > 1 else f"one seed ({seeds[0]})"
    with open(os.path.join(out, "results.md"), "w") as fh:
        fh.write(
            f"# plsh train-lm\n\nCommand: `{cmd}`\n\n"
            f"Validation bits per byte (lower is better; {spread}) and perplexity per "
            f"byte (of the mean loss), trained at L = {args.seq_len}. PLSH rows use "
            f"each layer's fixed eval partition unless marked exact ALiBi.\n\n"
            f"{table}\n\n"
            f"Corpus: {corpus.summary()}. Fixed block sizes per head: {block_sizes}. "
            f"Mean training time per run: {times_text}; total wall time {wall:.0f} s "
            f"({args.threads} threads, torch {torch.__version__}, "
            f"{meta['date_utc']} UTC).\n"
        )
    _plot(results, rows, factors, args.seq_len, os.path.join(out, "results.png"))
    print(table)
    print(f"total wall time {wall:.0f} s; results written to {os.path.abspath(out)}")
    return 0
