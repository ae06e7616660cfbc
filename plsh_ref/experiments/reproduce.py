"""``plsh reproduce``: the paper's convergence experiment (the project's main job).

Two parts, as in Wolfson & Wagner (2026), section 4 ("convergence"):

1. **Kernel matrix.** For ``n`` aligned positions and each ``sigma``, the error
   ``||M~ - L*||`` in spectral, max and Frobenius norm as the number of samples ``s``
   grows, over independent repetitions, with the fitted log-log slope per sigma and norm
   (Theorem 2.1 predicts ``s^(-1/2)``).
2. **Attention output on real activations.** On the shipped query/key/value of a
   pretrained transformer (``plsh_ref/data``; or ``--qkv FILE``) with the standard ALiBi
   slopes inserted, causal: the error of PLSH attention against exact ALiBi attention
   (max-abs and relative Frobenius) vs ``s``, beside the no-bias and fixed-block baselines
   (Theorem 2.2).

Within one repetition the ``s`` values are nested prefixes of one draw of
``max(samples)`` hashes (a running average, as when a user increases ``s``);
repetitions are independent draws. Every number is computed by this run.

Both parts run once per ``--sampler`` (default ``iid stratified``; ``proofs_notes/samplers.md``).
A prefix of a correlated draw is not a draw of that sampler, so for ``"stratified"`` and
``"shared"`` each ``s`` is a fresh draw (seeds as for iid). The kernel part also reports
the measured fused window (keys with ``C_ij > 0`` per query, mean over queries) and the
exact ``E||M~ - L*||_F^2`` of :func:`plsh_ref.samplers.frobenius_error_square`.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.linalg
from numpy.typing import ArrayLike

from ..alibi import alibi_slopes, kernel_matrix, sigma_from_slopes
from ..attention import alibi_attention, biased_attention, fixed_block_attention, no_bias_attention
from ..partition import count_bias, counts, draw_partition
from ..provenance import run_metadata
from ..samplers import SAMPLERS, default_group_size, frobenius_error_square
from ..validation import MAX_NUM_SAMPLES, check_int
from .options import (
    MAX_REPETITIONS,
    MAX_SIGMA,
    Values,
    add_max_memory_option,
    add_out_option,
    add_quiet_option,
    check_memory,
    default_out_dir,
    integer,
    npz_archive,
    option_message,
)

if TYPE_CHECKING:
    from ..kernels import DistanceKernel

__all__ = [
    "HELP",
    "SUMMARY",
    "add_arguments",
    "KERNEL_KINDS",
    "fit_loglog_slope",
    "kernel_heads",
    "matrix_error_experiment",
    "memory_estimate",
    "output_error_experiment",
    "run",
    "stratified_rate_line",
]

#: one line for ``plsh --help``
SUMMARY = "the paper's convergence experiment (default command)"

HELP = (
    "The paper's convergence experiment: ||M~ - L*|| and the attention output error on "
    "real activations vs the number of samples s."
)

NORMS = ("spectral", "max", "frobenius")

#: ``--kernel`` choices: the relative bias whose kernel ``k(r) = E[M]`` is approximated
KERNEL_KINDS = ("alibi", "kerple-log", "kerple-power")


def kernel_heads(
    kind: str, sigmas: Iterable[float], *, r1: float = 0.7, p: float = 0.5
) -> list | None:
    """One :mod:`plsh_ref.kernels` kernel per length scale ``sigma`` (``None`` for ALiBi).

    ``"alibi"``: ``None`` (the ``sigma`` path of :func:`plsh_ref.partition.draw_partition`,
    bit-identical to the paper's draws). ``"kerple-log"``: ``KerpleLog(r1, 1 / sigma)``,
    ``k = (1 + r / sigma)^(-r1)``. ``"kerple-power"``: ``KerplePower(sigma^(-p), p)``,
    ``k = exp(-(r / sigma)^p)`` (``p = 1`` is ALiBi). ``sigma = 1 / slope`` for the output
    part, so each head keeps ALiBi's length scale.

    Parameters
    ----------
    kind : {"alibi", "kerple-log", "kerple-power"}
    sigmas : sequence of float
        Length scales in tokens, each > 0.
    r1 : float
        KERPLE-log's power (``r1 <= 1``: infinite mean pitch).
    p : float
        KERPLE-power's exponent in ``(0, 1]``.

    Returns
    -------
    list of plsh_ref.kernels.DistanceKernel or None

    Raises
    ------
    ValueError
        Unknown ``kind`` (message starts with ``--kernel``); bad ``r1`` or ``p`` (from the
        kernel classes, message starts with ``r1``/``p``).

    References
    ----------
    ``proofs_notes/general_kernels.md``; Chi et al. (2022), KERPLE.
    """
    from ..kernels import KerpleLog, KerplePower

    if kind == "alibi":
        return None
    if kind == "kerple-log":
        return [KerpleLog(r1, 1.0 / float(sig)) for sig in sigmas]
    if kind == "kerple-power":
        return [KerplePower(float(sig) ** -p, p) for sig in sigmas]
    raise ValueError(f"--kernel: must be one of {KERNEL_KINDS}, got {kind!r}")


def _kernel_label(kind: str, args) -> str:
    if kind == "kerple-log":
        return f"KERPLE-log (r1={args.r1:g})"
    if kind == "kerple-power":
        return f"KERPLE-power (p={args.p:g})"
    return "ALiBi"


#: library parameters named in error messages -> the option that sets them (the arrays
#: come from the --qkv file; a partition whose bins leave int64, from a tiny --sigma)
PARAMETER_OPTIONS = {
    "path": "--qkv",
    "query": "--qkv",
    "key": "--qkv",
    "value": "--qkv",
    "partition": "--sigma",
    "num_samples": "--num-samples",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``plsh reproduce`` on ``parser`` (vocabulary: :mod:`.options`).

    References
    ----------
    ``docs/experiments.md``; README.md, "Command line" (the options shared by the commands).
    """
    _add_grid_arguments(parser)
    _add_repetition_arguments(parser)
    _add_data_arguments(parser)
    _add_draw_arguments(parser)
    _add_kernel_arguments(parser)
    add_out_option(parser, "reproduce")
    add_max_memory_option(parser)
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    add_quiet_option(parser)


def _add_grid_arguments(parser: argparse.ArgumentParser) -> None:
    """``--n``, ``--sigma``, ``--num-samples`` (and their old spellings): the grid of the run."""
    parser.add_argument(
        "--n",
        type=integer(minimum=2),
        default=1024,
        help="sequence length of the kernel-matrix part (default: 1024)",
    )
    sigma: dict[str, Any] = dict(dest="sigmas", action=Values, positive=True, maximum=MAX_SIGMA)
    parser.add_argument(
        "--sigma",
        default=[4.0, 16.0, 64.0],
        metavar="SIGMA",
        help="length scales of the kernel-matrix part, space- or comma-separated "
        "(default: 4 16 64)",
        **sigma,
    )
    parser.add_argument("--sigmas", replacement="--sigma", help=argparse.SUPPRESS, **sigma)
    samples: dict[str, Any] = dict(
        dest="samples",
        action=Values,
        element=int,
        minimum=1,
        maximum=MAX_NUM_SAMPLES,
        unique_sorted=True,
    )
    parser.add_argument(
        "--num-samples",
        default=[1, 2, 4, 8, 16, 32, 64, 128, 256],
        metavar="S",
        help="numbers of samples s, space- or comma-separated (default: 1 2 4 ... 256)",
        **samples,
    )
    parser.add_argument("--samples", replacement="--num-samples", help=argparse.SUPPRESS, **samples)


def _add_repetition_arguments(parser: argparse.ArgumentParser) -> None:
    """``--reps``, ``--output-reps``, ``--fit-min-samples``: repetitions and the slope fit."""
    parser.add_argument(
        "--reps",
        type=integer(minimum=1, maximum=MAX_REPETITIONS),
        default=5,
        help="independent repetitions of the kernel-matrix part (default: 5)",
    )
    parser.add_argument(
        "--output-reps",
        type=integer(minimum=1, maximum=MAX_REPETITIONS),
        default=3,
        help="independent repetitions of the attention-output part (default: 3)",
    )
    parser.add_argument(
        "--fit-min-samples",
        type=integer(minimum=1),
        default=4,
        help="fit the log-log slope on s >= this value (default: 4)",
    )


def _add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """``--qkv``, ``--max-tokens``, ``--fixed-block-size``: the activations and the baseline."""
    parser.add_argument(
        "--qkv",
        type=npz_archive,
        default=None,
        help="an .npz with arrays query, key, value of shape "
        "(batch, num_heads, seq_len, head_dim), or (num_heads, seq_len, head_dim) for one "
        "sequence (see docs); default: the shipped all-MiniLM-L6-v2 activations",
    )
    parser.add_argument(
        "--max-tokens",
        type=integer(minimum=2),
        default=None,
        help="use only the first N tokens of the activations",
    )
    parser.add_argument(
        "--fixed-block-size",
        type=integer(minimum=1),
        default=None,
        help="block size of the fixed-block baseline (default: per head, "
        "the mean block size 2*sigma_h of one PLSH mask, rounded)",
    )


def _add_draw_arguments(parser: argparse.ArgumentParser) -> None:
    """``--seed``, ``--sampler``, ``--group-size``: how the partitions are drawn."""
    parser.add_argument(
        "--seed",
        type=integer(minimum=0),
        default=0,
        help="seed of the partition draws (default: 0)",
    )
    parser.add_argument(
        "--sampler",
        nargs="+",
        choices=SAMPLERS,
        default=["iid", "stratified"],
        metavar="SAMPLER",
        help="partition samplers to compare, one or several of "
        f"{', '.join(SAMPLERS)} (default: iid stratified)",
    )
    parser.add_argument(
        "--group-size",
        type=integer(minimum=1),
        default=None,
        help="group size s' of the correlated samplers for the s it divides (default: "
        "the rule of plsh_ref.samplers.default_group_size)",
    )


def _add_kernel_arguments(parser: argparse.ArgumentParser) -> None:
    """``--kernel``, ``--r1``, ``--p``: the relative bias of the run (:func:`kernel_heads`)."""
    parser.add_argument(
        "--kernel",
        choices=KERNEL_KINDS,
        default="alibi",
        help="relative bias to approximate: alibi (default, the paper), kerple-log "
        "(k = (1 + r/sigma)^-r1) or kerple-power (k = exp(-(r/sigma)^p)); the heads keep "
        "the length scales of --sigma and of the standard ALiBi slopes",
    )
    parser.add_argument(
        "--r1",
        type=float,
        default=None,
        help="KERPLE-log power r1 > 0, with --kernel kerple-log only (default 0.7: "
        "heavy-tailed pitch, infinite mean)",
    )
    parser.add_argument(
        "--p",
        type=float,
        default=None,
        help="KERPLE-power exponent p in (0, 1], with --kernel kerple-power only (default 0.5)",
    )


#: the kernel options, the --kernel they belong to, and their defaults
KERNEL_OPTIONS = {"r1": ("kerple-log", 0.7), "p": ("kerple-power", 0.5)}


def resolve_kernel_options(args: argparse.Namespace) -> None:
    """Refuse a kernel option given for another ``--kernel``; fill in the defaults.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed ``plsh reproduce`` arguments with ``kernel``, ``r1`` and ``p`` (``None``:
        not given); ``r1`` and ``p`` are set to their defaults in place.

    Raises
    ------
    ValueError
        ``--r1`` without ``--kernel kerple-log``, or ``--p`` without ``--kernel
        kerple-power`` (the option would be ignored).

    References
    ----------
    ``docs/kernels.md``, "Convergence on real activations" (``--kernel``, ``--r1``, ``--p``).
    """
    kind = getattr(args, "kernel", "alibi")
    for name, (owner, default) in KERNEL_OPTIONS.items():
        value = getattr(args, name, None)
        if value is not None and kind != owner:
            raise ValueError(f"--{name}: applies to --kernel {owner} only, got --kernel {kind}")
        setattr(args, name, default if value is None else value)


def memory_estimate(
    n: int,
    num_sigmas: int,
    max_samples: int,
    batch: int = 0,
    num_heads: int = 0,
    n_q: int = 0,
    n_k: int = 0,
) -> dict:
    """Bytes the two parts of ``plsh reproduce`` hold at their peaks (upper estimates).

    The kernel-matrix part holds, per sigma, ``L*``, the old and new running counts, the
    counts of one step and ``M~ - L*`` (float64/int64 ``(n, n)``), two ``(n, n)``
    temporaries of the norms, and the bins of up to all samples (int64
    ``(sigmas, s, n)``, queries and keys). The output part holds the same count arrays at
    ``(num_heads, n_q, n_k)`` and four float64 score arrays ``(batch, num_heads, n_q, n_k)``.
    The parts run one after the other.

    Parameters
    ----------
    n, num_sigmas, max_samples : int
        ``--n``, the number of ``--sigma`` values and ``max(--num-samples)``.
    batch, num_heads, n_q, n_k : int, optional
        Shape of the activations of the output part (0: not counted).

    Returns
    -------
    dict
        ``"matrix_square"`` (the ``n^2`` arrays), ``"matrix_bins"`` (the ``s * n`` bins)
        and ``"output"``, in bytes.

    References
    ----------
    README.md, "Command line" (``--max-memory``: sizes refused before allocating).
    """
    return {
        "matrix_square": 8 * (5 * num_sigmas + 2) * n * n,
        "matrix_bins": 16 * num_sigmas * max_samples * n,
        "output": 8 * (5 * num_heads + 4 * batch * num_heads) * n_q * n_k
        + 16 * num_heads * max_samples * (n_q + n_k),
    }


def fit_loglog_slope(samples: ArrayLike, errors: ArrayLike) -> float:
    """Least-squares slope of ``log(error)`` against ``log(s)``.

    Parameters
    ----------
    samples : array_like of int, shape ``(k,)``, ``k >= 2``
    errors : array_like of float, shape ``(k,)``, each > 0

    Returns
    -------
    float
        The fitted exponent ``a`` in ``error ~ C s^a`` (Theorem 2.1 predicts ``-1/2``).

    Raises
    ------
    ValueError
        Fewer than two points, mismatched lengths, or non-positive values.
    """
    x = np.asarray(samples, dtype=np.float64)
    y = np.asarray(errors, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or x.size < 2:
        raise ValueError(
            f"samples: need two or more (s, error) pairs of equal length, got "
            f"{x.shape} and {y.shape}"
        )
    if np.any(x <= 0) or np.any(y <= 0) or not np.all(np.isfinite(y)):
        raise ValueError("errors: all values must be finite and > 0 for a log-log fit")
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def _spectral_norm_symmetric(e: np.ndarray) -> float:
    # One full eigvalsh (one tridiagonalisation) is about 2x faster than two
    # subset_by_index calls, which tridiagonalise twice; same extreme eigenvalues.
    w = scipy.linalg.eigvalsh(e)
    return float(max(abs(w[0]), abs(w[-1])))


def _group_size_for(s: int, group_size) -> int:
    """``group_size`` where it divides ``s``, else the default rule for ``s``."""
    if group_size is not None and s % group_size == 0:
        return group_size
    return default_group_size(s)


def _sampler_counts(sigma, checkpoints, seed, qpos, kpos, causal, sampler, group_size):
    """Yield ``(s, counts)``: running prefixes for iid, one fresh draw per ``s`` otherwise."""
    if sampler == "iid":
        partition = draw_partition(sigma, max(checkpoints), seed=seed)
        yield from _running_counts(partition, checkpoints, qpos, kpos, causal)
        return
    for s in checkpoints:
        g = _group_size_for(s, group_size)
        partition = draw_partition(sigma, s, seed=seed, sampler=sampler, group_size=g)
        yield s, counts(partition, qpos, kpos, causal=causal)


def _running_counts(partition, checkpoints, qpos, kpos, causal):
    """Yield ``(s, counts of the first s hashes)`` for increasing ``s`` in ``checkpoints``."""
    total = None
    done = 0
    for s in checkpoints:
        part = counts(partition.samples(done, s), qpos, kpos, causal=causal)
        total = part if total is None else total + part
        done = s
        yield s, total


def matrix_error_experiment(
    n: int,
    sigmas: Sequence[float],
    samples: Sequence[int],
    reps: int,
    seed: int,
    progress: Callable[[], object] | None = None,
    *,
    sampler: str = "iid",
    group_size: int | None = None,
    kernels: Sequence[DistanceKernel] | None = None,
) -> dict[str, Any]:
    """Errors ``||M~ - L*||`` (bidirectional, positions ``0..n-1``) vs ``s``.

    Parameters
    ----------
    n : int
        Sequence length, ``>= 2``.
    sigmas : sequence of float
        Length scales (tokens), each > 0; drawn as the heads of one partition sample.
    samples : sequence of int
        Increasing numbers of samples ``s >= 1``.
    reps : int
        Independent repetitions (seeds ``seed + 1000 r``).
    seed : int
        Base seed (``>= 0``).
    progress : callable, optional
        Called with no argument after each (repetition, s) step.
    sampler : {"iid", "stratified", "shared"}
        Partition sampler (:func:`plsh_ref.partition.draw_partition`); non-iid samplers
        draw afresh for each ``s``.
    group_size : int, optional
        ``s'`` for the ``s`` it divides; other ``s`` use
        :func:`plsh_ref.samplers.default_group_size`.
    kernels : sequence of plsh_ref.kernels.DistanceKernel, optional
        One kernel per sigma (:func:`kernel_heads`): the partitions are drawn from their
        pitch laws and ``L*`` is their kernel matrix ``K = E[M]``; default ALiBi.

    Returns
    -------
    dict
        ``errors[norm]``: float64 array ``(len(sigmas), len(samples), reps)`` for each of
        ``"spectral"``, ``"max"``, ``"frobenius"``; also ``"relative_frobenius"``
        (divided by ``||L*||_F``), ``"window"`` (measured keys with ``C_ij > 0`` per query,
        mean over queries, same shape), ``"frobenius_square_exact"`` (exact
        ``E||M~ - L*||_F^2``, ``(len(sigmas), len(samples))``), ``"group_sizes"`` and
        ``"n"``.

    Raises
    ------
    TypeError, ValueError
        ``n < 2``, ``reps < 1``, non-positive sigma, or bad ``samples``/``seed`` (from
        :func:`plsh_ref.partition.draw_partition`).

    References
    ----------
    Wolfson & Wagner (2026), Theorem 2.1.
    """
    n = check_int("n", n, minimum=2)
    reps = check_int("reps", reps, minimum=1)
    sig = np.asarray(sigmas, dtype=np.float64)
    pos = np.arange(n, dtype=np.int64)
    law = sig if kernels is None else list(kernels)
    kernel = kernel_matrix(sig, pos, pos) if kernels is None else _expected_mask(law, pos, pos)
    kernel_fro = np.linalg.norm(kernel, axis=(1, 2))
    shape = (sig.size, len(samples), reps)
    errors: dict[str, Any] = {name: np.empty(shape) for name in NORMS}
    errors["window"] = np.empty(shape)
    for r in range(reps):
        draws = _sampler_counts(law, samples, seed + 1000 * r, pos, pos, False, sampler, group_size)
        for k, (s, cnt) in enumerate(draws):
            errors["window"][:, k, r] = (cnt > 0).sum(axis=2).mean(axis=1)
            diff = cnt / s - kernel
            for h in range(sig.size):
                errors["spectral"][h, k, r] = _spectral_norm_symmetric(diff[h])
                errors["max"][h, k, r] = np.abs(diff[h]).max()
                errors["frobenius"][h, k, r] = np.linalg.norm(diff[h])
            if progress is not None:
                progress()
    errors["relative_frobenius"] = errors["frobenius"] / kernel_fro[:, None, None]
    sizes = [1 if sampler == "iid" else _group_size_for(s, group_size) for s in samples]
    errors["group_sizes"] = sizes
    errors["frobenius_square_exact"] = np.array(
        [
            [_exact_frobenius_square(head, n, s, sampler, g) for s, g in zip(samples, sizes)]
            for head in (sig if kernels is None else law)
        ]
    )
    errors["n"] = n
    return errors


def _expected_mask(kernels, qpos, kpos, causal=False):
    from ..kernels import expected_mask

    return expected_mask(kernels, qpos, kpos, causal=causal)


def _exact_frobenius_square(head, n, s, sampler, group_size):
    """``E||M~ - L*||_F^2`` of one head: a sigma (ALiBi) or a kernel."""
    if isinstance(head, (float, np.floating)):
        return frobenius_error_square(head, n, s, sampler=sampler, group_size=group_size)
    from ..kernels import frobenius_error_square as kernel_frobenius_error_square

    return kernel_frobenius_error_square(head, n, s, sampler=sampler, group_size=group_size)


def _output_errors(out, ref):
    max_abs = float(np.abs(out - ref).max())
    rel_fro = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
    return max_abs, rel_fro


def _reference_output(query, key, value, kernels=None):
    """Exact causal attention with the standard ALiBi slopes, or with the bias ``log k_h``
    of one kernel per head (the errors' reference)."""
    if kernels is None:
        slopes = alibi_slopes(query.shape[1])
        return alibi_attention(query, key, value, slopes=slopes, causal=True, return_lse=False)
    n_q, n_k = query.shape[2], key.shape[2]
    mask = _expected_mask(kernels, np.arange(n_k - n_q, n_k), np.arange(n_k), causal=True)
    with np.errstate(divide="ignore"):
        bias = np.log(mask)
    return biased_attention(query, key, value, bias=bias, return_lse=False)


def output_error_experiment(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    samples: Sequence[int],
    reps: int,
    seed: int,
    fixed_block_size: int | Sequence[int] | None = None,
    progress: Callable[[], object] | None = None,
    *,
    sampler: str = "iid",
    group_size: int | None = None,
    reference: np.ndarray | None = None,
    kernels: Sequence[DistanceKernel] | None = None,
) -> dict[str, Any]:
    """Attention output error of PLSH against exact ALiBi (causal, standard slopes) vs ``s``.

    Parameters
    ----------
    query, key, value : numpy.ndarray
        float64, ``(batch, num_heads, n, head_dim)`` (key/value may have fewer heads).
    samples : sequence of int
        Increasing ``s`` values.
    reps : int
        Independent partition draws (seeds ``seed + 1000 r + 1``).
    seed : int
        Base seed.
    fixed_block_size : int, optional
        Block size of the fixed-block baseline; default per head ``round(2 sigma_h)``.
    progress : callable, optional
        Called after each (repetition, s) step.
    sampler, group_size
        As :func:`matrix_error_experiment`.
    reference : numpy.ndarray, optional
        The exact causal ALiBi output of these inputs with the standard slopes, float64
        ``(batch, num_heads, n, head_dim_v)``, when the caller has it already (``plsh
        reproduce`` computes it once for its input check and every sampler); default:
        computed here.
    kernels : sequence of plsh_ref.kernels.DistanceKernel, optional
        One kernel per query head (:func:`kernel_heads` of ``1 / slopes``): partitions from
        their pitch laws, the reference is exact attention with the bias ``log k_h(r)``,
        and the fixed-block size defaults to the mean block size (``n_k`` positions).

    Returns
    -------
    dict
        ``"plsh_max_abs"``, ``"plsh_rel_fro"``: arrays ``(len(samples), reps)``;
        ``"no_bias"`` and ``"fixed_blocks"``: ``{"max_abs", "rel_fro"}``; ``"slopes"``.

    Raises
    ------
    TypeError, ValueError
        ``reps < 1``, bad ``samples``/``seed``, a ``reference`` of another shape, or
        invalid inputs (as :func:`plsh_ref.attention.alibi_attention`).

    References
    ----------
    Wolfson & Wagner (2026), Theorem 2.2 and section 4.
    """
    reps = check_int("reps", reps, minimum=1)
    num_heads = query.shape[1]
    slopes = alibi_slopes(num_heads)
    sigma = sigma_from_slopes(slopes)
    n_q, n_k = query.shape[2], key.shape[2]
    qpos, kpos = np.arange(n_k - n_q, n_k), np.arange(n_k)
    law = sigma if kernels is None else list(kernels)
    if reference is None:
        ref = _reference_output(query, key, value, kernels)
    else:
        ref = np.asarray(reference, dtype=np.float64)
        want = (*np.shape(query)[:3], np.shape(value)[3])
        if ref.shape != want:
            raise ValueError(f"reference: must have shape {want}, got {ref.shape}")
    result: dict[str, Any] = {
        "slopes": slopes.tolist(),
        "plsh_max_abs": np.empty((len(samples), reps)),
        "plsh_rel_fro": np.empty((len(samples), reps)),
    }
    for r in range(reps):
        draws = _sampler_counts(
            law, samples, seed + 1000 * r + 1, qpos, kpos, True, sampler, group_size
        )
        for k, (s, cnt) in enumerate(draws):
            bias = count_bias(cnt, s)
            out, _ = biased_attention(query, key, value, bias=bias, return_lse=True)
            result["plsh_max_abs"][k, r], result["plsh_rel_fro"][k, r] = _output_errors(out, ref)
            if progress is not None:
                progress()
    out, _ = no_bias_attention(query, key, value, causal=True, return_lse=True)
    result["no_bias"] = dict(zip(("max_abs", "rel_fro"), _output_errors(out, ref)))
    if fixed_block_size is None and kernels is None:
        fixed_block_size = [max(1, int(round(2 * s_h))) for s_h in sigma]
    elif fixed_block_size is None:
        from ..kernels import block_size_mean

        fixed_block_size = [max(1, int(round(block_size_mean(c, n_k)))) for c in law]
    out, _ = fixed_block_attention(
        query, key, value, fixed_block_size, causal=True, return_lse=True
    )
    result["fixed_blocks"] = dict(zip(("max_abs", "rel_fro"), _output_errors(out, ref)))
    result["fixed_block_size"] = np.atleast_1d(fixed_block_size).astype(int).tolist()
    return result


def _table(title, header, rows) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join(
        [title, line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]
    )


def _spread(a: np.ndarray) -> str:
    return f"{a.mean():.4g} ± {a.std(ddof=1) if a.size > 1 else 0.0:.2g}"


def _sampler_record(matrix, output) -> dict:
    """The JSON record of one sampler's two parts."""
    keys = (*NORMS, "relative_frobenius", "window", "frobenius_square_exact")
    return {
        "group_sizes": matrix["group_sizes"],
        "matrix_error": {key: np.asarray(matrix[key]).tolist() for key in keys},
        "output_error": {key: output[key].tolist() for key in ("plsh_max_abs", "plsh_rel_fro")},
    }


def _sampler_comparison(runs, samples, sigmas, n, reps, qkv_shape, label="ALiBi") -> str:
    """Tables comparing each sampler with iid (empty if there is nothing to compare)."""
    if "iid" not in runs or len(runs) < 2:
        return ""
    iid_m, iid_o = runs["iid"]
    parts = []
    for name, (mat, out) in runs.items():
        if name == "iid":
            continue
        rows = []
        for j, s in enumerate(samples):
            row = [s, mat["group_sizes"][j]]
            for h in range(len(sigmas)):
                a = mat["frobenius"][h, j] ** 2
                b = iid_m["frobenius"][h, j] ** 2
                ratio = a.mean() / b.mean()
                se = (
                    ratio
                    * np.hypot(
                        a.std(ddof=1) / a.mean() if reps > 1 else 0.0,
                        b.std(ddof=1) / b.mean() if reps > 1 else 0.0,
                    )
                    / np.sqrt(reps)
                )
                exact = mat["frobenius_square_exact"][h, j] / iid_m["frobenius_square_exact"][h, j]
                width = mat["window"][h, j].mean() / iid_m["window"][h, j].mean()
                row += [f"{ratio:.3f} ± {se:.3f}", f"{exact:.3f}", f"{width:.3f}"]
            rows.append(row)
        header = ["s", "group size s'"]
        for sig in sigmas:
            header += [f"sigma={sig:g}: error", "exact", "window"]
        parts.append(
            _table(
                f"Sampler {name} against iid, n={n}, {reps} reps: ratios {name} / iid "
                f"(below 1: {name} is better)\n"
                "  error  = squared Frobenius error ||M~ - L*||_F^2, mean over the reps "
                "± standard error\n"
                "  exact  = the same ratio of the exact expectations E||M~ - L*||_F^2\n"
                "  window = keys per query in some block (the fused window), mean; above 1: "
                "more work",
                header,
                rows,
            )
        )
        rows = [
            [s, _spread(iid_o["plsh_rel_fro"][j]), _spread(out["plsh_rel_fro"][j]),
             _spread(iid_o["plsh_max_abs"][j]), _spread(out["plsh_max_abs"][j])]
            for j, s in enumerate(samples)
        ]  # fmt: skip
        parts.append(
            _table(
                f"Attention output error vs exact {label}, iid and {name} (causal, "
                f"{qkv_shape[1]} heads, n={qkv_shape[2]})",
                ["s", "rel. Fro. iid", f"rel. Fro. {name}", "max-abs iid", f"max-abs {name}"],
                rows,
            )
        )
    return "\n\n".join(parts)


#: y-axis labels of the kernel-matrix plot (matplotlib mathtext)
_NORM_LABELS = {
    "spectral": r"spectral-norm error $\|\tilde M - L^*\|_2$",
    "max": r"largest entry error $\max_{ij}\,|\tilde M_{ij} - L^*_{ij}|$",
    "frobenius": r"Frobenius-norm error $\|\tilde M - L^*\|_F$",
}


def _bar_note(reps: int, others) -> str:
    text = (
        f"markers: mean of {reps} independent repetitions; "
        r"bars: $\pm$ 1 standard deviation over them"
        if reps > 1
        else "one repetition (no error bars)"
    )
    if others:
        text += f"; crosses: {', '.join(others)} sampler (mean only)"
    return text


def _reference_line(ax, s: np.ndarray, anchor: float) -> None:
    """``anchor * (s / s_max)^(-1/2)``: through ``anchor`` at the largest ``s``, where the
    curves are in their asymptotic regime (at small ``s`` they are not yet)."""
    ax.plot(
        s,
        anchor * (s / s[-1]) ** -0.5,
        "k--",
        lw=0.8,
        label=r"$\propto s^{-1/2}$ (through the mean at the largest $s$)",
    )


#: panel titles of the kernel-matrix plot
_NORM_TITLES = {
    "spectral": "spectral norm",
    "max": "max norm (largest entry)",
    "frobenius": "Frobenius norm",
}

#: x label of both figures
_SAMPLES_LABEL = "number of samples $s$ (log scale)"


def _figure_legend(fig, ax) -> None:
    """One legend for the whole figure, below the panels (outside every data area).

    The panels share their curves (one per sigma and sampler, the reference line), so the
    handles of ``ax`` stand for all of them, listed by sigma (each iid curve beside its
    other samplers' ones; matplotlib lists errorbar curves last); ``constrained_layout``
    makes room for the legend.
    """
    handles, labels = ax.get_legend_handles_labels()
    lead = [container.get_label() for container in ax.containers]  # errorbars, drawn order
    order = []
    for label in lead:
        key = label.split(",")[0]
        order += [label] + [x for x in labels if x not in lead and x.split(",")[0] == key]
    order = [labels.index(x) for x in order]
    order += [i for i in range(len(labels)) if i not in order]
    fig.legend(
        [handles[i] for i in order],
        [labels[i] for i in order],
        loc="outside lower center",
        ncols=min(4, len(handles)),
        frameon=False,
    )


def _log_axes(ax, s: np.ndarray, ylabel: str, title: str) -> None:
    """Log-log axes with one plain tick per ``s`` (no overlapping 10^k minor labels)."""
    from matplotlib.ticker import NullFormatter

    ax.set(xscale="log", yscale="log", xlabel=_SAMPLES_LABEL, ylabel=ylabel)
    ax.set_xticks(s, [f"{v:g}" for v in s])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_title(title, fontsize="medium")


def _plot(out_dir: Path, samples, sigmas, matrix, output, others=None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = np.asarray(samples, dtype=np.float64)
    first = ", iid sampler" if others else ""
    return [
        _plot_matrix_error(plt, out_dir, s, sigmas, matrix, others, first),
        _plot_output_error(plt, out_dir, s, output, others, first),
    ]


def _plot_matrix_error(plt, out_dir: Path, s, sigmas, matrix, others, first: str) -> Path:
    """``matrix_error.png``: the three norms of ``M~ - L*`` against ``s``, one curve per sigma."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 5), layout="constrained")
    for ax, norm in zip(axes, NORMS):
        for h, sig in enumerate(sigmas):
            err = matrix[norm][h]
            ax.errorbar(
                s,
                err.mean(axis=1),
                yerr=err.std(axis=1),
                marker="o",
                ms=3,
                capsize=2,
                label=rf"$\sigma = {sig:g}${first}",
            )
            for i, (name, (other, _)) in enumerate((others or {}).items()):
                ax.plot(
                    s,
                    other[norm][h].mean(axis=1),
                    color=f"C{h}",
                    ls=("--", ":", "-.")[i % 3],
                    marker="x",
                    ms=3,
                    label=rf"$\sigma = {sig:g}$, {name} sampler (mean)",
                )
        # geometric mean over sigma of the mean error at the largest s
        _reference_line(ax, s, float(np.exp(np.log(matrix[norm][:, -1].mean(axis=1)).mean())))
        _log_axes(ax, s, _NORM_LABELS[norm], _NORM_TITLES[norm])
    _figure_legend(fig, axes[0])
    fig.suptitle(
        rf"Error of the mean of $s$ masks, $\tilde M$, against the ALiBi kernel matrix $L^*$ "
        f"(n = {matrix['n']} positions)\n{_bar_note(matrix[NORMS[0]].shape[2], others)}",
        fontsize="medium",
    )
    path = out_dir / "matrix_error.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _plot_output_error(plt, out_dir: Path, s, output, others, first: str) -> Path:
    """``output_error.png``: the attention output error against ``s``, with the baselines."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), layout="constrained")
    for ax, key, label, ylabel in zip(
        axes,
        ("max_abs", "rel_fro"),
        ("largest absolute error", "relative Frobenius error"),
        (
            r"largest error $\max |O - O_{\mathrm{ALiBi}}|$",
            r"relative error $\|O - O_{\mathrm{ALiBi}}\|_F \,/\, \|O_{\mathrm{ALiBi}}\|_F$",
        ),
    ):
        err = output[f"plsh_{key}"]
        ax.errorbar(
            s,
            err.mean(axis=1),
            yerr=err.std(axis=1),
            marker="o",
            ms=3,
            capsize=2,
            label=f"positional LSH{first}",
        )
        for i, (name, (_, other)) in enumerate((others or {}).items()):
            ax.plot(
                s,
                other[f"plsh_{key}"].mean(axis=1),
                color=f"C{4 + i}",
                ls="--",
                marker="x",
                ms=3,
                label=f"positional LSH, {name} sampler (mean)",
            )
        ax.axhline(output["no_bias"][key], color="C3", ls=":", label="no positional bias")
        ax.axhline(
            output["fixed_blocks"][key], color="C2", ls="-.", label="fixed blocks (no sampling)"
        )
        _reference_line(ax, s, float(err[-1].mean()))
        _log_axes(ax, s, ylabel, label)
    _figure_legend(fig, axes[0])
    fig.suptitle(
        "Attention output error against exact ALiBi attention (causal, real activations)\n"
        + _bar_note(output["plsh_max_abs"].shape[1], others),
        fontsize="medium",
    )
    path = out_dir / "output_error.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _load_activations(path, max_tokens):
    from ..data import load_qkv

    data = load_qkv(path)
    q, k, v = data["query"], data["key"], data["value"]
    if max_tokens is not None:
        q, k, v = q[:, :, :max_tokens], k[:, :, :max_tokens], v[:, :, :max_tokens]
    source = str(path) if path is not None else "shipped all-MiniLM-L6-v2 activations"
    return q, k, v, source


def _check_args(args: argparse.Namespace) -> dict:
    """Step 1: validate the options, size the memory, load the inputs and the reference.

    Returns the run's configuration (``n``, ``samplers``, ``samples``, ``fit_samples``, the
    activations, their ``source``, the ``reference`` output, the ``kernels`` of the
    kernel-matrix part and ``output_kernels``, one per query head; ``None`` for ALiBi).
    Raises ``ValueError``/``TypeError``/``OSError`` with the option's name.
    """
    n = check_int("--n", args.n, minimum=2)
    check_int("--reps", args.reps, minimum=1)
    check_int("--output-reps", args.output_reps, minimum=1)
    check_int("--seed", args.seed, minimum=0)
    if args.max_tokens is not None:
        check_int("--max-tokens", args.max_tokens, minimum=2)
    if args.fixed_block_size is not None:
        check_int("--fixed-block-size", args.fixed_block_size, minimum=1)
    if args.group_size is not None:
        check_int("--group-size", args.group_size, minimum=1)
    check_int("--fit-min-samples", args.fit_min_samples, minimum=1)
    kind = getattr(args, "kernel", "alibi")
    resolve_kernel_options(args)
    try:  # the kernel classes name their parameter ("p: ..."): the option is "--p"
        kernels = kernel_heads(kind, args.sigmas, r1=args.r1, p=args.p)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"--{exc}") from None
    samplers = list(dict.fromkeys(args.sampler))
    samples = list(args.samples)
    if len(samples) < 2:
        raise ValueError(
            f"--num-samples: need at least two values of s to fit a slope, got {samples}"
        )
    fit_samples = [s for s in samples if s >= args.fit_min_samples]
    if len(fit_samples) < 2:
        raise ValueError(
            f"--fit-min-samples: only {fit_samples} of --num-samples {samples} "
            f"are >= {args.fit_min_samples}; a slope needs two"
        )
    # sizes before allocating: the kernel part first (it needs nothing loaded)
    need = memory_estimate(n, len(args.sigmas), max(samples))
    check_memory("--n", n, need["matrix_square"], args.max_memory)
    check_memory("--num-samples", max(samples), sum(need.values()), args.max_memory)
    q, k, v, source = _load_activations(args.qkv, args.max_tokens)
    need = memory_estimate(0, 0, max(samples), q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    check_memory(
        "--max-tokens",
        args.max_tokens or f"(all {k.shape[2]} tokens)",
        need["output"],
        args.max_memory,
    )
    output_kernels = (
        None
        if kernels is None
        else kernel_heads(kind, sigma_from_slopes(alibi_slopes(q.shape[1])), r1=args.r1, p=args.p)
    )
    reference = _reference_output(q, k, v, output_kernels)  # once, for every sampler
    if not np.any(reference):
        # the relative errors ||out - ref|| / ||ref|| would all be nan
        raise ValueError(
            f"--qkv: the exact ALiBi output of {source} is all zero (e.g. an all-zero "
            "value array), so relative errors are undefined"
        )
    return {
        "n": n,
        "kind": kind,
        "label": _kernel_label(kind, args),
        "kernels": kernels,
        "output_kernels": output_kernels,
        "samplers": samplers,
        "samples": samples,
        "fit_samples": fit_samples,
        "qkv": (q, k, v),
        "source": source,
        "reference": reference,
    }


def _run_parts(args: argparse.Namespace, cfg: dict):
    """Step 2: both parts for every sampler; returns ``(runs, seconds)``."""
    from tqdm import tqdm

    samplers, samples = cfg["samplers"], cfg["samples"]
    q, k, v = cfg["qkv"]
    steps = len(samplers) * (args.reps * len(samples) + args.output_reps * len(samples))
    t0 = time.perf_counter()
    runs = {}
    with tqdm(
        total=steps, desc="plsh reproduce", unit="step", disable=args.quiet, file=sys.stderr
    ) as bar:
        for name in samplers:
            kw = {"sampler": name, "group_size": args.group_size}
            matrix = matrix_error_experiment(
                cfg["n"],
                args.sigmas,
                samples,
                args.reps,
                args.seed,
                lambda: bar.update(1),
                kernels=cfg["kernels"],
                **kw,
            )
            output = output_error_experiment(
                q,
                k,
                v,
                samples,
                args.output_reps,
                args.seed,
                args.fixed_block_size,
                lambda: bar.update(1),
                reference=cfg["reference"],
                kernels=cfg["output_kernels"],
                **kw,
            )
            runs[name] = (matrix, output)
    return runs, time.perf_counter() - t0


def _slope_or_none(fit_samples, errors):
    # An error of exactly 0 (e.g. a tiny problem the partition reproduces exactly) has
    # no logarithm: report no slope rather than fail.
    return fit_loglog_slope(fit_samples, errors) if np.all(errors > 0) else None


def _fit_slopes(args, cfg, matrix, output, runs):
    """Step 3: fitted log-log slopes of the measured errors, and the exact stratified rate.

    ``"stratified_exact"``: per sigma, the slope of the exact Frobenius RMS error
    ``sqrt(E||M~ - L*||_F^2)`` of the ``"stratified"`` sampler over the fitted ``s``
    (``proofs_notes/general_kernels.md``, section 8), when that sampler ran.
    """
    samples, fit_samples = cfg["samples"], cfg["fit_samples"]
    idx = [samples.index(s) for s in fit_samples]
    matrix_slopes = {
        norm: {
            f"{sig:g}": _slope_or_none(fit_samples, matrix[norm][h, idx].mean(1))
            for h, sig in enumerate(args.sigmas)
        }
        for norm in NORMS
    }
    out_slopes = {
        key: _slope_or_none(fit_samples, output[f"plsh_{key}"][idx].mean(1))
        for key in ("max_abs", "rel_fro")
    }
    rate = None
    if "stratified" in runs:
        exact = runs["stratified"][0]["frobenius_square_exact"]
        rate = {
            f"{sig:g}": _slope_or_none(fit_samples, np.sqrt(exact[h, idx]))
            for h, sig in enumerate(args.sigmas)
        }
    return matrix_slopes, out_slopes, rate


def _fmt_slope(x) -> str:
    return "n/a" if x is None else f"{x:+.3f}"


def stratified_rate_line(
    rate: dict[str, float | None], kernels: Sequence[DistanceKernel] | None, n: int, label: str
) -> str:
    """The printed line of the stratified sampler's exact Frobenius RMS slopes.

    Each slope is labelled by what its head was computed for: ``sigma`` for ALiBi, the
    kernel's parameters (its dataclass fields, e.g. ``r1=0.7, r2=0.25``) otherwise, and the
    line names the kernel. The bracket ``-3/4 .. -2/3`` is stated for ALiBi only, the one
    case ``proofs_notes/general_kernels.md`` (section 8) derives and tests it for; for
    another kernel the line says that no range is derived (the default ``--kernel
    kerple-log`` run printed ``-0.641`` at ``sigma = 4``, outside it:
    ``benchmarks/results/reproduce_kernel_2026-12-02.md``). The iid slope is
    ``-1/2`` exactly for every kernel (``Var(M~_ij) = k (1 - k) / s``).

    Parameters
    ----------
    rate : dict of str to float or None
        Slope per head, keyed by ``f"{sigma:g}"`` in head order (``None``: no slope).
    kernels : sequence of plsh_ref.kernels.DistanceKernel or None
        The heads' kernels, as many as ``rate`` (``None``: ALiBi).
    n : int
        Positions of the kernel-matrix part.
    label : str
        The kernel's name in the report (e.g. ``"KERPLE-log (r1=0.7)"``).

    Returns
    -------
    str

    Raises
    ------
    ValueError
        ``kernels`` not as many as ``rate``.
    """
    if kernels is None:
        heads = [f"sigma={sig}" for sig in rate]
        note = (
            "; iid -0.500 (for ALiBi at n = 1024, s = 4..256 the slope lies between -3/4, "
            "offsets dominating, and -2/3, the design's large-s limit: "
            "proofs_notes/general_kernels.md, section 8)"
        )
    else:
        if len(kernels) != len(rate):
            raise ValueError(f"kernels: {len(kernels)} kernels for {len(rate)} slopes")
        heads = [
            ", ".join(f"{f.name}={getattr(c, f.name):g}" for f in dataclasses.fields(c))
            for c in kernels
        ]
        note = (
            "; iid -0.500 (exactly, for every kernel). No range is derived for this kernel: "
            "the bracket -3/4 .. -2/3 of proofs_notes/general_kernels.md, section 8, is "
            "ALiBi's"
        )
    return (
        f"stratified sampler, exact Frobenius RMS error sqrt(E||M~ - L*||_F^2), "
        f"kernel={label}, n={n}: slope "
        + ", ".join(f"{_fmt_slope(x)} ({h})" for h, x in zip(heads, rate.values()))
        + note
    )


def _print_report(args, cfg, matrix, output, slopes, runs) -> None:
    """Step 4: the printed tables."""
    matrix_slopes, out_slopes, rate = slopes
    samples, label = cfg["samples"], cfg["label"]
    q = cfg["qkv"][0]
    sampler = cfg["samplers"][0]
    print()
    for norm in NORMS:
        rows = [
            [s] + [_spread(matrix[norm][h, j]) for h in range(len(args.sigmas))]
            for j, s in enumerate(samples)
        ]
        rows.append(
            ["slope"] + [_fmt_slope(matrix_slopes[norm][f"{sig:g}"]) for sig in args.sigmas]
        )
        print(
            _table(
                f"||M~ - L*|| ({norm} norm), n={cfg['n']}, kernel={label}, sampler={sampler}, "
                f"mean ± sd over {args.reps} reps",
                ["s"] + [f"sigma={sig:g}" for sig in args.sigmas],
                rows,
            )
        )
        print()
    rows = [
        [s, _spread(output["plsh_max_abs"][j]), _spread(output["plsh_rel_fro"][j])]
        for j, s in enumerate(samples)
    ]
    rows.append(["slope", _fmt_slope(out_slopes["max_abs"]), _fmt_slope(out_slopes["rel_fro"])])
    for name, key in (("no bias", "no_bias"), ("fixed blocks", "fixed_blocks")):
        rows.append([name, f"{output[key]['max_abs']:.4g}", f"{output[key]['rel_fro']:.4g}"])
    print(
        _table(
            f"Attention output error vs exact {label} attention (causal, {q.shape[1]} heads, "
            f"standard slopes, n={q.shape[2]}, batch={q.shape[0]}, sampler={sampler}; "
            f"{cfg['source']})",
            ["s", "max-abs", "rel. Frobenius"],
            rows,
        )
    )
    print(f"\nfitted on s in {cfg['fit_samples']}; expected slope about -0.5 (Theorem 2.1)")
    if rate is not None:
        print(stratified_rate_line(rate, cfg["kernels"], cfg["n"], label))
    comparison = _sampler_comparison(
        runs, samples, args.sigmas, cfg["n"], args.reps, q.shape, label=label
    )
    if comparison:
        print("\n" + comparison)


def _results_record(args, cfg, stamp, elapsed, matrix, output, slopes, runs) -> dict:
    """Step 5: the ``results.json`` record."""
    matrix_slopes, out_slopes, rate = slopes
    q, k, v = cfg["qkv"]
    return {
        "command": "plsh reproduce " + " ".join(sys.argv[2:])
        if sys.argv[1:2] == ["reproduce"]
        else " ".join(sys.argv),
        "date_utc": stamp.isoformat(timespec="seconds"),
        "provenance": run_metadata(),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "cpu_count": os.cpu_count(),
        },
        "seconds": round(elapsed, 2),
        "config": {
            "n": cfg["n"],
            "sigmas": list(args.sigmas),
            "samples": cfg["samples"],
            "reps": args.reps,
            "output_reps": args.output_reps,
            "seed": args.seed,
            "fit_samples": cfg["fit_samples"],
            "qkv": cfg["source"],
            "qkv_shape": {"query": list(q.shape), "key": list(k.shape), "value": list(v.shape)},
            "sampler": cfg["samplers"],
            "group_size": args.group_size,
            "kernel": cfg["kind"],
            "kernels": None if cfg["kernels"] is None else [repr(c) for c in cfg["kernels"]],
        },
        "matrix_error": {norm: matrix[norm].tolist() for norm in (*NORMS, "relative_frobenius")},
        "matrix_error_slopes": matrix_slopes,
        "output_error": {
            key: (val.tolist() if isinstance(val, np.ndarray) else val)
            for key, val in output.items()
        },
        "output_error_slopes": out_slopes,
        "stratified_exact_rms_slopes": rate,
        "samplers": {name: _sampler_record(*runs[name]) for name in cfg["samplers"]},
    }


def run(args: argparse.Namespace) -> int:
    """Run the experiment with parsed ``args``; returns the exit status (0, or 2 on bad input).

    Steps: :func:`_check_args`, :func:`_run_parts`, :func:`_fit_slopes`,
    :func:`_print_report`, :func:`_results_record`, then the plots.

    References
    ----------
    ``docs/experiments.md`` (the two parts of the experiment and their tables).
    """
    try:
        cfg = _check_args(args)
    except (ValueError, TypeError, OSError) as exc:
        print(
            f"plsh reproduce: error: {option_message(exc, (), PARAMETER_OPTIONS)}", file=sys.stderr
        )
        return 2
    stamp = _dt.datetime.now(_dt.timezone.utc)
    out_dir = args.out or default_out_dir("reproduce", stamp)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs, elapsed = _run_parts(args, cfg)
    matrix, output = runs[cfg["samplers"][0]]
    slopes = _fit_slopes(args, cfg, matrix, output, runs)
    _print_report(args, cfg, matrix, output, slopes, runs)
    record = _results_record(args, cfg, stamp, elapsed, matrix, output, slopes, runs)
    (out_dir / "results.json").write_text(json.dumps(record, indent=1))
    written = [out_dir / "results.json"]
    if not args.no_plots:
        others = {name: runs[name] for name in cfg["samplers"][1:]}
        written += _plot(out_dir, cfg["samples"], args.sigmas, matrix, output, others=others)
    print(f"\n{elapsed:.2f} s. Wrote {', '.join(p.name for p in written)} to {out_dir}/")
    return 0
