"""The SPEC section 6 rule's own noise for float32 gradients at large logits, measured.

At logits of standard deviation 64 to 100 the float32 yardstick (dense max-subtracted
softmax attention, torch autograd) and any other float32 attention whose logits round
differently both err by about the logits' float32 rounding, but ``max|error|`` is taken
over the few rows in which two keys compete, so the rule's factor 2 does not always
cover a second, independent draw of it (``proofs_notes/backward.md``, section 3). This
script counts, over seeds of the case of ``tests/_gradient_case.py`` (40 positions, two
heads, ``s = 3``, causal), how often the rule fails and by how much:

* ``dense two-chunk``: float32 attention that differs from the yardstick only in summing
  its logits from two half-width matmuls (``two_chunk_gradients``), seeds ``0..--dense-seeds``;
* ``triton`` (the kernels, in the Triton interpreter on CPU, or compiled on a GPU) and
  ``cpu``: ``plsh_attention``'s gradients of the loss ``sum(out g) + sum(lse g_lse)``
  (``--no-lse-grad``: ``g_lse = 0``, the output's gradient alone), seeds ``0..--seeds``.

Usage: ``python benchmarks/gradient_noise.py [--seeds 6] [--dense-seeds 200]
[--no-lse-grad] [--out DIR]`` prints the table and writes ``gradient_noise_<date>.md``
(``gradient_noise_<date>_no_lse_grad.md``) into ``--out`` (default
``benchmarks/results``). ``TRITON_INTERPRET=1`` is set unless a CUDA device is present.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAD_DIMS = (8, 32, 64, 128)
#: ``scale_qk`` of ``_gradient_case.inputs`` and the logits' standard deviation it gives.
STDS = {8.0: 64, 10.0: 100}


def _setup():
    for path in (ROOT, os.path.join(ROOT, "tests")):
        if path not in sys.path:
            sys.path.insert(0, path)
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    torch.set_num_threads(1)


def _api_ratios(
    backend: str, scale_qk: float, seed: int, head_dim: int, lse_grad: bool
) -> list[float]:
    """``error / allowed`` of ``grad_query``, ``grad_key``, ``grad_value`` of
    ``plsh_attention`` on ``backend`` (LSE gradient included, or ``0``)."""
    import numpy as np
    import torch
    from _gradient_case import PARTITION, N, dense_gradients_with_lse, inputs, rule_ratio

    from plsh_fast import plsh_attention

    q, k, v, g = inputs(scale_qk, seed, head_dim=head_dim)
    g_lse = torch.from_numpy(np.random.default_rng(seed + 1).standard_normal((1, 2, N)))
    g_lse = g_lse if lse_grad else torch.zeros_like(g_lse)
    device = torch.device("cuda" if backend == "triton" and torch.cuda.is_available() else "cpu")
    leaves = [x.detach().float().to(device).requires_grad_() for x in (q, k, v)]
    out, lse = plsh_attention(
        *leaves, partition=PARTITION, causal=True, return_lse=True, backend=backend
    )
    ((out * g.float().to(device)).sum() + (lse * g_lse.float().to(device)).sum()).backward()
    ref = dense_gradients_with_lse(q, k, v, g, g_lse, torch.float64)
    base = dense_gradients_with_lse(q, k, v, g, g_lse, torch.float32)
    floor = max(float(r.abs().max()) for r in ref)
    return [rule_ratio(x.grad.cpu(), r, b, floor) for x, r, b in zip(leaves, ref, base)]


def _row(kind, head_dim, std, ratios, names=None) -> str:
    fails = sum(r > 1.0 for r in ratios)
    worst = max(range(len(ratios)), key=ratios.__getitem__)
    where = f" ({names[worst]})" if names else ""
    return (
        f"| {kind} | {head_dim} | {std} | {len(ratios)} | {fails} | {fails / len(ratios):.3f} "
        f"| {ratios[worst]:.2f}{where} |"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=6, help="seeds of the kernel rows")
    parser.add_argument("--dense-seeds", type=int, default=200)
    parser.add_argument("--no-lse-grad", dest="lse_grad", action="store_false")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = parser.parse_args(argv)
    _setup()
    import torch
    from _gradient_case import two_chunk_ratios

    mode = (
        "compiled, " + torch.cuda.get_device_name() if torch.cuda.is_available() else "interpreted"
    )
    lines = [
        "| attention | head_dim | logit std | cases | rule failures | fraction | worst ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    start = time.time()
    for head_dim in HEAD_DIMS:
        for scale_qk, std in STDS.items():
            ratios = two_chunk_ratios(scale_qk, range(args.dense_seeds), head_dim=head_dim)
            lines.append(_row("dense two-chunk float32", head_dim, std, ratios))
            print(lines[-1], flush=True)
    grads = ("grad_query", "grad_key", "grad_value")
    for backend in ("cpu", "triton"):
        for head_dim in HEAD_DIMS:
            for scale_qk, std in STDS.items():
                per_seed = [
                    _api_ratios(backend, scale_qk, s, head_dim, args.lse_grad)
                    for s in range(args.seeds)
                ]
                ratios = [max(r) for r in per_seed]
                names = [f"seed {s}, {grads[r.index(max(r))]}" for s, r in enumerate(per_seed)]
                label = f"{backend} ({mode})" if backend == "triton" else "cpu"
                lines.append(_row(label, head_dim, std, ratios, names))
                print(lines[-1], flush=True)
    date = datetime.date.today().isoformat()
    header = [
        f"# Gradient rule noise at large logits{'' if args.lse_grad else ', no LSE gradient'} "
        f"({date})",
        "",
        f"`python benchmarks/gradient_noise.py --seeds {args.seeds} --dense-seeds "
        f"{args.dense_seeds}{'' if args.lse_grad else ' --no-lse-grad'}`; {platform.node() or 'host'}, {platform.processor() or 'cpu'}, "
        f"torch {torch.__version__}, {time.time() - start:.0f} s. A case fails when the worst "
        "of its three gradients exceeds the SPEC section 6 rule (ratio > 1).",
        "",
    ]
    text = "\n".join(header + lines) + "\n"
    os.makedirs(args.out, exist_ok=True)
    suffix = "" if args.lse_grad else "_no_lse_grad"
    path = os.path.join(args.out, f"gradient_noise_{date}{suffix}.md")
    with open(path, "w") as f:
        f.write(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
