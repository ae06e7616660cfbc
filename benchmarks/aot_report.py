"""Ahead-of-time compilation report of the Triton kernels (no GPU needed).

Compiles the kernels that :func:`plsh_fast.triton.plsh_forward_triton` and
:func:`plsh_fast.triton.plsh_backward_triton` launch, for a CUDA target given by
compute capability (sm_90a, sm_80), through Triton's own compile API
(``triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget(...))``)
and reads what the compiler produced:

* ``registers``, ``stack``, ``spill_stores``, ``spill_loads`` from ``ptxas -v`` (the ptxas
  shipped in the triton wheel, the one Triton itself runs to make the cubin);
* ``smem``: the dynamic shared memory Triton allocates (bytes), ``stages`` (num_stages);
* ``fp64``: number of PTX instructions on ``.f64`` operands (only the bins kernel may have any);
* ``async_copies``: ``cp.async`` / ``cp.async.bulk`` (TMA) instructions in the PTX: the
  software pipeliner moved the tile loads of the main loop ahead (pipelined);
* ``wgmma`` / ``mma``: Hopper warpgroup MMAs and Ampere ``mma.sync`` instructions;
* ``sass``: number of SASS instructions (``cuobjdump -sass``) and ``compile_s``.

The signature, constexprs and alignment attributes are not written here by hand: the real
launch code runs on small CPU tensors with every kernel replaced by a recorder
(:func:`capture_launches`), and each recorded launch is specialised by Triton's own
binder for the chosen target, exactly as ``kernel[grid](...)`` would on a GPU (pointers
16-byte aligned, integers equal to 1 made constants, multiples of 16 marked divisible,
``do_not_specialize`` honoured). ``tests/fast/triton/test_aot_compile.py`` uses the same functions.

Usage: ``python benchmarks/aot_report.py [--set ci|full] [--out DIR]`` prints the table and
writes ``aot_<date>.md`` and ``.json`` into ``--out`` (default ``benchmarks/results``).
Importing this module is cheap and has no side effect (the configuration lists are plain
data); torch, Triton and the kernels are imported by the functions that compile, which
need ``TRITON_INTERPRET`` unset (``main`` clears it).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import io
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

__all__ = [
    "KernelConfig",
    "CI_CONFIGS",
    "FULL_CONFIGS",
    "capture_launches",
    "compile_config",
    "counts_per_sample",
    "markdown_table",
]

_KERNELS = (
    ("triton._tiling", "_bins_kernel"),
    ("triton._forward", "_fwd_kernel"),
    ("triton._backward", "_delta_kernel"),
    ("triton._backward", "_bwd_dq_kernel"),
    ("triton._backward", "_bwd_dkdv_kernel"),
)


def _modules():
    """The package ``plsh_fast.triton`` and its kernel modules, imported compiled (fails if
    ``TRITON_INTERPRET`` is set), by name relative to ``plsh_fast``."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    import importlib

    names = ["triton"] + [name for name, _ in _KERNELS]
    return {name: importlib.import_module(f"plsh_fast.{name}") for name in names}


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """One shipped kernel configuration: which kernel, for which problem and target.

    ``kernel`` is one of ``_bins_kernel``, ``_fwd_kernel``, ``_delta_kernel``,
    ``_bwd_dq_kernel``, ``_bwd_dkdv_kernel``; the tile sizes and warps are the shipped
    defaults (:func:`plsh_fast.triton.tile_config`) for a CUDA device.
    """

    kernel: str
    dtype: str = "bfloat16"
    head_dim: int = 128
    head_dim_v: int | None = None
    num_samples: int = 16
    causal: bool = True
    group: int = 1
    arch: int = 90

    @property
    def name(self) -> str:
        dv = self.head_dim_v or self.head_dim
        d = f"d{self.head_dim}" + (f"/{dv}" if dv != self.head_dim else "")
        extra = ("" if self.causal else " noncausal") + (
            f" g{self.group}" if self.group > 1 else ""
        )
        return f"{self.kernel} {self.dtype} {d} s{self.num_samples}{extra} sm{self.arch}"


def _fwd_bwd(dtype, d, **kw):
    return [
        KernelConfig(k, dtype, d, **kw)
        for k in ("_fwd_kernel", "_bwd_dq_kernel", "_bwd_dkdv_kernel")
    ]


# Representative default set run by CI: the headline problem (bf16, d = 128, s = 16,
# causal) on Hopper for every kernel, its forward at s = 64 (the counts cost per sample),
# the forward on Ampere, float32 (tf32x3) at d = 128 on
# Hopper and d = 64 on Ampere for every kernel, and the float16 dQ kernel at d = 64 on
# Ampere (the configurations that spilled before the float32/sm_80 tiles), head sizes
# that are not multiples of 16, unequal head sizes (each guards a tile_config rule),
# the forward at s = 65 (three static 32-sample passes) and the float32 dQ kernel there
# (TileConfig.classify).
CI_CONFIGS = (
    KernelConfig("_bins_kernel"),
    *_fwd_bwd("bfloat16", 128),
    KernelConfig("_fwd_kernel", "bfloat16", 128, num_samples=64),  # with s = 16: counts cost
    KernelConfig("_fwd_kernel", arch=80),
    *_fwd_bwd("float32", 128),
    *[dataclasses.replace(c, arch=80) for c in _fwd_bwd("float32", 64)],
    KernelConfig("_bwd_dq_kernel", "float16", 64, arch=80),
    # head sizes that are not multiples of 16: pipelined only through aligned_rows
    KernelConfig("_fwd_kernel", "bfloat16", 72),
    KernelConfig("_bwd_dkdv_kernel", "float32", 120),
    # unequal head sizes: the narrower one whole in the backward (TileConfig.narrow_whole)
    KernelConfig("_bwd_dq_kernel", "float32", 128, head_dim_v=64),
    KernelConfig("_bwd_dkdv_kernel", "float16", 64, head_dim_v=128, arch=80),
    # s > 64: the sample blocks' passes unrolled statically, the key loop still pipelined
    KernelConfig("_fwd_kernel", "bfloat16", 128, num_samples=65),
    # float32 on sm_90 above 64 samples compares every sample (TileConfig.classify; the
    # skips spilled 16 B here with Triton 3.9)
    KernelConfig("_bwd_dq_kernel", "float32", 128, num_samples=65),
)
# Every shipped configuration class (benchmarks/aot_report.py --set full; slow tests).
FULL_CONFIGS = (
    *CI_CONFIGS,
    KernelConfig("_delta_kernel"),
    *_fwd_bwd("bfloat16", 64),
    *_fwd_bwd("float16", 128),
    *_fwd_bwd("bfloat16", 96),
    *_fwd_bwd("bfloat16", 256),
    KernelConfig("_fwd_kernel", "bfloat16", 128, causal=False),
    KernelConfig("_fwd_kernel", "bfloat16", 128, group=4),
    KernelConfig("_bwd_dkdv_kernel", "bfloat16", 128, group=4),
    KernelConfig("_fwd_kernel", "bfloat16", 128, head_dim_v=64),
    KernelConfig("_fwd_kernel", "bfloat16", 128, num_samples=1),
    *[
        dataclasses.replace(c, arch=80)
        for c in _fwd_bwd("bfloat16", 128)[1:]
        + _fwd_bwd("float16", 64)[::2]
        + _fwd_bwd("bfloat16", 96)
        + _fwd_bwd("float32", 128)
        + _fwd_bwd("float32", 96)
    ],
    *_fwd_bwd("float32", 64),
    *_fwd_bwd("float32", 96),
    # head sizes users ship besides the powers of two: every branch of tile_config at
    # head_dim <= 128 (float32 on sm_90: one chunk at 80, halves above 96; float32 on
    # sm_80: 64-row tiles up to 64, 16 x 16 above; the half types), strides that are not
    # multiples of 16 (40, 72, 120: aligned_rows) and unequal head sizes
    *[
        c
        for arch in (90, 80)
        for dtype in ("bfloat16", "float32")
        for d in (40, 72, 80, 112, 120)
        for c in _fwd_bwd(dtype, d, arch=arch)
    ],
    *[
        c
        for arch in (90, 80)
        for dtype in ("bfloat16", "float16", "float32")
        for d, dv in ((64, 128), (128, 64))
        for c in _fwd_bwd(dtype, d, head_dim_v=dv, arch=arch)
    ],
    *_fwd_bwd("bfloat16", 112, head_dim_v=64),  # sm_90 half types: backward halves at 112
    KernelConfig("_fwd_kernel", "float32", 256),  # the float32 tiles of width 256
    # s > 64 (plsh_fast.triton.sample_block: four and eight static passes of 32 samples)
    *_fwd_bwd("bfloat16", 128, num_samples=128),
    *_fwd_bwd("bfloat16", 128, num_samples=256),
    *_fwd_bwd("float32", 128, num_samples=128),
    *[dataclasses.replace(c, arch=80) for c in _fwd_bwd("bfloat16", 128, num_samples=128)],
    # s > 64 on sm_80: the half types' dK/dV kernel with maxnreg = 255 (TileConfig.dkdv_maxnreg)
    KernelConfig("_bwd_dkdv_kernel", "bfloat16", 128, num_samples=256, arch=80),
    # s = 256, float32 on sm_90 without the skips (TileConfig.classify)
    *_fwd_bwd("float32", 128, num_samples=256),
)
FULL_CONFIGS = tuple(dict.fromkeys(FULL_CONFIGS))  # each once (CI's are repeated above)


class _Recorder:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args, **kwargs)`` is recorded."""

    def __init__(self, fn):
        self.fn = fn
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))


@contextlib.contextmanager
def capture_launches():
    """Replace every kernel of the Triton modules by a recorder while the block runs.

    Yields a dict ``kernel name -> list of (grid, args, kwargs)``, filled by the launch code
    run inside the block (on CPU tensors: nothing is executed). The launch code sees
    compiled (not interpreted) kernels, so it picks the compiled-mode choices (dot
    precision, no upcast).
    """
    saved = []
    recorders = {}
    modules = _modules()
    for module_name, name in _KERNELS:
        module = modules[module_name]
        fn = getattr(module, name)
        if type(fn).__name__ != "JITFunction":
            raise RuntimeError(
                f"{module.__name__}.{name}: not a JITFunction (TRITON_INTERPRET set?)"
            )
        rec = _Recorder(fn)
        saved.append((module, name, fn))
        recorders[name] = rec
        setattr(module, name, rec)
    calls = {}
    try:
        yield calls
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)
        for name, rec in recorders.items():
            calls[name] = [(rec.fn, *c) for c in rec.calls]


def _launches(cfg: KernelConfig, n: int = 4096):
    """Run the real launch code of ``cfg``'s direction on CPU tensors; the recorded calls."""
    import torch

    plsh_triton = _modules()["triton"]
    dtype = getattr(torch, cfg.dtype)
    d, dv = cfg.head_dim, cfg.head_dim_v or cfg.head_dim
    num_heads = 4 * cfg.group if cfg.group > 1 else 4
    num_heads_kv = num_heads // cfg.group
    q = torch.zeros((1, num_heads, n, d), dtype=dtype)
    k = torch.zeros((1, num_heads_kv, n, d), dtype=dtype)
    v = torch.zeros((1, num_heads_kv, n, dv), dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    pitch = 4.0 + 60.0 * torch.rand(
        (num_heads, cfg.num_samples), dtype=torch.float64, generator=gen
    )
    offset = pitch * torch.rand((num_heads, cfg.num_samples), dtype=torch.float64, generator=gen)
    pos = torch.arange(n, dtype=torch.int64)
    tiles = plsh_triton.tile_config(
        d, dv, torch.device("cuda"), dtype, capability=divmod(cfg.arch, 10),
        num_samples=cfg.num_samples,
    )  # fmt: skip
    blocks = dict(tiles=tiles)
    with capture_launches() as calls:
        if cfg.kernel in ("_fwd_kernel", "_bins_kernel"):
            plsh_triton.plsh_forward_triton(
                q, k, v, pitch, offset, pos, pos, 0.1, cfg.causal, **blocks
            )
        else:
            out = torch.zeros((1, num_heads, n, dv), dtype=dtype)
            lse = torch.zeros((1, num_heads, n), dtype=torch.float32)
            plsh_triton.plsh_backward_triton(
                q, k, v, out, lse, out, pitch, offset, pos, pos, 0.1, cfg.causal, **blocks
            )
    return calls


def _specialise(fn, args, kwargs, target):
    """Triton's own binder: (signature, constexprs, attrs, options) as ``fn[grid]`` makes them."""
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(
        backend, options, bound, specialization, options
    )
    return backend, signature, constexprs, attrs, options


_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILL = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)


def _parse_ptxas(log: str) -> dict:
    regs = [int(x) for x in _PTXAS_REGS.findall(log)]
    spill = [tuple(int(y) for y in x) for x in _PTXAS_SPILL.findall(log)]
    if not regs or not spill:
        raise RuntimeError(f"could not parse the ptxas -v log:\n{log}")
    return dict(
        registers=max(regs),
        stack=max(s[0] for s in spill),
        spill_stores=max(s[1] for s in spill),
        spill_loads=max(s[2] for s in spill),
    )


def _sass_count(cubin: bytes) -> int | None:
    """Number of SASS instructions in ``cubin`` (``cuobjdump -sass``), None if unavailable."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True)
    if res.returncode != 0:
        return None
    return len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+\S", res.stdout, flags=re.M))


def _ptx_stats(ptx: str) -> dict:
    instr = [
        ln.strip() for ln in ptx.splitlines() if ln.strip() and not ln.strip().startswith("//")
    ]
    body = [ln for ln in instr if not ln.startswith(".") and not ln.endswith(":")]
    return dict(
        fp64=sum(1 for ln in body if re.search(r"\.f64\b", ln) and not ln.startswith("mov.b64")),
        async_copies=sum(
            1
            for ln in body
            if re.match(r"(@%p\d+\s+)?cp\.async(\.bulk)?\b", ln)
            and "wait" not in ln
            and "commit" not in ln
        ),
        wgmma=sum(1 for ln in body if "wgmma.mma_async" in ln),
        mma=sum(1 for ln in body if re.search(r"\bmma\.sync\b", ln)),
        local=sum(1 for ln in body if re.search(r"\b(ld|st)\.local\b", ln)),
    )


def compile_config(cfg: KernelConfig, asm_dir: str | None = None) -> dict:
    """Compile ``cfg`` for its target and return its row of the report (see module doc).

    ``asm_dir``: also write the TTGIR, PTX and ptxas log there (for reading the code).

    Raises whatever Triton raises when the kernel does not compile.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    calls = _launches(cfg)[cfg.kernel]
    if not calls:
        raise RuntimeError(f"{cfg.name}: the launch code did not launch {cfg.kernel}")
    fn, _grid, args, kwargs = calls[0]
    target = GPUTarget("cuda", cfg.arch, 32)
    _, signature, constexprs, attrs, options = _specialise(fn, args, kwargs, target)
    src = ASTSource(fn, signature, constexprs, attrs)
    log = io.StringIO()
    knobs = triton.knobs.nvidia
    old = knobs.dump_ptxas_log
    knobs.dump_ptxas_log = True
    t0 = time.perf_counter()
    try:
        # A fresh cache: a cached kernel would skip ptxas (no log) and time nothing.
        with tempfile.TemporaryDirectory() as cache, contextlib.redirect_stdout(log):
            old_cache, triton.knobs.cache.dir = triton.knobs.cache.dir, cache
            try:
                compiled = triton.compile(src, target=target, options=options.__dict__)
            finally:
                triton.knobs.cache.dir = old_cache
    finally:
        knobs.dump_ptxas_log = old
    seconds = time.perf_counter() - t0
    if asm_dir is not None:
        os.makedirs(asm_dir, exist_ok=True)
        stem = os.path.join(asm_dir, re.sub(r"[^A-Za-z0-9]+", "_", cfg.name))
        for ext in ("ttgir", "ptx"):
            with open(f"{stem}.{ext}", "w") as f:
                f.write(compiled.asm[ext])
        with open(f"{stem}.ptxas.txt", "w") as f:
            f.write(log.getvalue())
    row = dict(config=cfg.name, **dataclasses.asdict(cfg))
    row.update(_parse_ptxas(log.getvalue()))
    row.update(_ptx_stats(compiled.asm["ptx"]))
    meta = compiled.metadata
    row.update(
        smem=int(meta.shared),
        stages=int(options.num_stages),
        warps=int(options.num_warps),
        block_m=constexprs_value(constexprs, fn, "BLOCK_M"),
        block_n=constexprs_value(constexprs, fn, "BLOCK_N"),
        sass=_sass_count(compiled.asm["cubin"]),
        compile_s=round(seconds, 1),
    )
    return row


def constexprs_value(constexprs, fn, name):
    """The value of constexpr argument ``name`` of ``fn`` in Triton's constexpr dict."""
    if name not in fn.arg_names:
        return None
    return constexprs.get((fn.arg_names.index(name),))


_COLUMNS = (
    ("config", "configuration"),
    ("block_m", "BM"),
    ("block_n", "BN"),
    ("warps", "warps"),
    ("stages", "stages"),
    ("registers", "regs"),
    ("stack", "stack B"),
    ("spill_stores", "spill st B"),
    ("spill_loads", "spill ld B"),
    ("smem", "smem B"),
    ("async_copies", "cp.async"),
    ("wgmma", "wgmma"),
    ("mma", "mma.sync"),
    ("fp64", "fp64"),
    ("sass", "SASS instr"),
    ("compile_s", "compile s"),
)


def markdown_table(rows) -> str:
    """The report rows as a markdown table (errors as a row with the message)."""
    lines = ["| " + " | ".join(h for _, h in _COLUMNS) + " |"]
    lines.append("|" + "---|" * len(_COLUMNS))
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['config']} | error: {r['error']} |" + " |" * (len(_COLUMNS) - 2))
            continue
        cells = ["" if r.get(k) is None else str(r[k]) for k, _ in _COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: SASS instructions per thread of one iteration of the old kernel's runtime counts loop
#: (commit e0164a6, bf16 d = 128 forward for sm_90a, Triton 3.9 and 3.6 alike:
#: ``results/counts_sass_2026-12-01.md``); issue 14 asks for at most a third of it.
OLD_COUNTS_PER_SAMPLE = 212


def counts_per_sample(rows) -> float | None:
    """SASS instructions per mixed sample of the straight-line counts (forward, bf16, d =
    128, causal, sm_90): the difference of two compiled sample blocks (s = 16 and s = 64)
    over 48, i.e. the static instructions one more sample adds to the kernel (its block,
    branch and share of the tile classification). None if the rows are not in the report."""

    def find(s):
        for r in rows:
            if (
                (r.get("kernel"), r.get("dtype"), r.get("head_dim"), r.get("arch"))
                == ("_fwd_kernel", "bfloat16", 128, 90)
                and (r.get("num_samples"), r.get("head_dim_v"), r.get("group"), r.get("causal"))
                == (s, None, 1, True)
                and r.get("sass")
            ):
                return r["sass"]
        return None

    lo, hi = find(16), find(64)
    return None if lo is None or hi is None else (hi - lo) / 48


def counts_cost(rows) -> str:
    """The sentence of the report on :func:`counts_per_sample` (empty without the rows)."""
    per = counts_per_sample(rows)
    if per is None:
        return ""
    return (
        f"Counts cost (forward, bf16, d = 128, causal, sm_90): {per:.1f} SASS instructions "
        f"per mixed sample (static: (SASS(s = 64) - SASS(s = 16)) / 48), "
        f"{per / OLD_COUNTS_PER_SAMPLE:.2f} times the old kernel's {OLD_COUNTS_PER_SAMPLE}; "
        "samples constant over a tile pair skip their block (a uniform branch each).\n\n"
    )


def _commit() -> str:
    """Short commit of the tree the kernels come from, ``+dirty`` with uncommitted changes."""
    git = ["git", "-C", ROOT]
    try:
        rev = subprocess.run(
            git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            git + ["status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("+dirty" if dirty else "")


def main(argv=None) -> int:
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton <= 3.9 default, silenced
    import torch
    import triton

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=("ci", "full"), default="full")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    parser.add_argument("--label", default="", help="suffix of the result file names")
    args = parser.parse_args(argv)
    configs = CI_CONFIGS if args.set == "ci" else FULL_CONFIGS
    # The tree the kernels are compiled from, read before anything is written: rewriting a
    # committed results file (or a second version's run writing its own) made it "+dirty".
    commit = _commit()
    rows = []
    for cfg in configs:
        try:
            rows.append(compile_config(cfg))
        except Exception as exc:  # recorded, the report goes on
            rows.append(dict(config=cfg.name, error=f"{type(exc).__name__}: {exc}"[:300]))
        print(markdown_table(rows[-1:]).splitlines()[-1], flush=True)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    stem = f"aot_{date}{('_' + args.label) if args.label else ''}"
    os.makedirs(args.out, exist_ok=True)
    header = (
        f"# AOT compile report ({date})\n\n"
        f"Triton {triton.__version__}, torch {torch.__version__}, ptxas from the triton wheel; "
        f"kernels of commit `{commit}`; compiled on a CPU-only machine (no GPU; "
        f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform(terse=True)}), "
        f"{len(rows)} configurations (`--set {args.set}`), compile times on a shared VM. "
        "Produced by `benchmarks/aot_report.py`; columns in its module docstring.\n\n"
    )
    table = markdown_table(rows)
    print(table)
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write(header + counts_cost(rows) + table + "\n")
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump(dict(date=date, triton=triton.__version__, commit=commit, rows=rows), f, indent=1)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
