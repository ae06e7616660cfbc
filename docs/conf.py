"""Sphinx configuration of the positional-lsh documentation.

Build (from the repository root; the Makefile target ``docs`` runs both)::

    python -m sphinx -W --keep-going -n -b html -d docs/_build/doctrees docs docs/_build/html
    python -m sphinx -W --keep-going -n -b doctest -d docs/_build/doctrees docs docs/_build/doctest

(one doctree folder for both: the doctest build reuses the environment the html build read).

When the builder starts (event ``builder-inited``, so importing this file writes nothing),
it generates sources that git ignores and that are rewritten only when their content
changes, so incremental builds stay incremental:

* ``theory/<note>.md``: one stub per ``proofs_notes/<note>.md`` holding only an
  ``{include}`` of it, so the notes are the theory chapters (not copies) and a new note
  appears by itself; likewise ``benchmarks/<table>.md`` per ``benchmarks/results/*.md``;
* ``api/<module>.md``: one ``automodule`` page per public module of ``plsh_ref`` and
  ``plsh_fast`` (every module whose dotted name has no part starting with ``_``); a package
  page also lists its modules and the functions and classes of each direct submodule
  (``__all__`` if the module has one), so a new module needs no edit here;
* ``_generated/``: the overview figure (``_scripts/overview_figure.py``), the plots of a
  reduced ``plsh reproduce`` run (``_scripts/reproduce_plots.py``), the general-kernels
  figures (``_scripts/kernels_plots.py``) and the ``plsh verify`` runs of the validation
  guide (``_scripts/verify_examples.py``).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MPLBACKEND", "Agg")

project = "positional-lsh"
author = "positional-lsh developers"
copyright = "2026, positional-lsh developers"
try:
    from plsh_ref import __version__ as release
except ImportError:  # pragma: no cover - the build needs plsh_ref importable anyway
    release = "unknown"
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    # MathJax 3.2 bundled and copied into _static/mathjax: formulas render without network
    # (the default mathjax_path is a CDN URL); tests/doc/test_docs_build.py checks the built page.
    "sphinx-mathjax-offline",
    "sphinx.ext.doctest",
    "sphinx.ext.viewcode",
    "sphinxcontrib.bibtex",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "README.md"]
templates_path: list[str] = []

# --- MyST -------------------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
myst_dmath_double_inline = True

# --- HTML -------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"positional-lsh {release}"
html_static_path: list[str] = []

# --- bibliography -------------------------------------------------------------------------
bibtex_bibfiles = ["references.bib"]
bibtex_default_style = "plain"
bibtex_reference_style = "author_year"

# --- autodoc / napoleon -----------------------------------------------------------------
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = False  # True fails on defaults like 10**9 (Sphinx 9.0)
napoleon_google_docstring = False
napoleon_numpy_docstring = True
# Types in numpy-style docstrings are prose ("array_like, shape (n,)"), not cross-references.
napoleon_use_param = False
napoleon_use_rtype = False
napoleon_preprocess_types = False
# "Attributes" sections render like "Parameters" (prose types, no cross-references).
napoleon_custom_sections = [("Attributes", "params_style")]
# Methods without a docstring (e.g. torch.autograd.Function.forward overrides) must not
# inherit torch's docstrings, whose references cannot resolve here.
autodoc_inherit_docstrings = False

# triton is optional on CPU machines: mock it when absent so plsh_fast still documents.
autodoc_mock_imports: list[str] = []
try:
    import triton  # noqa: F401
except Exception:  # noqa: BLE001 - any failure to import triton means "document without it"
    autodoc_mock_imports.append("triton")

# --- nitpicky: external names we cannot resolve offline (no intersphinx) ---------------
# Only types from other projects and docstring prose are ignored; a broken reference to
# one of our own objects (plsh_ref.*, plsh_fast.*) still fails the build.
_PY_ROLES = r"py:(class|obj|data|exc|func|meth|attr|mod)"
nitpick_ignore_regex = [
    # third-party classes named unqualified in annotations (transformers, FlexAttention)
    (r"py:class", r"(PreTrainedModel|BlockMask)"),
    # dotted names outside our two packages (numpy.ndarray, torch.Tensor, importlib.x, ...)
    (_PY_ROLES, r"(?!plsh_ref\b|plsh_fast\b)[A-Za-z_]\w*\..*"),
    (
        _PY_ROLES,
        r"(numpy|np|scipy|mpmath|torch|triton|hypothesis|pytest|argparse|pathlib|"
        r"importlib|collections|typing|types|dataclasses|os|matplotlib|tqdm)",
    ),
    # private objects (a private base class, a helper named in a docstring) are not
    # documented by design, so a reference to one renders as plain code
    (_PY_ROLES, r"(.*\.)?_\w+(\..*)?"),
    (
        r"py:class",
        r"(array_like|array-like|optional|callable|default.*|shape.*|dtype.*|"
        r"ndarray|Tensor|Generator|SearchStrategy|Namespace|Path|PathLike|"
        r"module|function|mpf|any|Any|Callable|Sequence|Iterable|Iterator|"
        r"Mapping|NDArray|ArgumentParser)",
    ),
    (r"py:class", r"[A-Za-z_][\w.]*\[.*"),  # subscripted generics in signatures
]

# --- doctest ------------------------------------------------------------------------------
doctest_global_setup = """
import numpy as np
from plsh_ref import *
try:
    import torch, plsh_fast
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False
"""
doctest_test_doctest_blocks = "default"


# --- generated sources --------------------------------------------------------------------
def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _sync_dir(directory: Path, wanted: dict[str, str], keep: set[str]) -> None:
    """Make ``directory``'s ``*.md`` files exactly ``wanted`` (plus the ``keep`` names)."""
    for name, text in wanted.items():
        _write_if_changed(directory / name, text)
    for path in directory.glob("*.md"):
        if path.name not in wanted and path.name not in keep:
            path.unlink()


def _theory_stubs() -> None:
    notes = sorted((ROOT / "proofs_notes").glob("*.md"))
    wanted = {
        note.name: (f"```{{include}} ../../proofs_notes/{note.name}\n:relative-images:\n```\n")
        for note in notes
        if note.name.lower() != "readme.md"
    }
    _sync_dir(DOCS / "theory", wanted, keep={"index.md"})


#: facts that tell benchmark reports of one title apart, tried in this order (a report
#: states them in its header): the Triton version, the commit of the kernels, the number of
#: compiled configurations, then the counts cost
_TITLE_FACTS = [
    (r"Triton (\d+\.\d+(?:\.\d+)?)", "Triton {}"),
    (r"commit `([0-9a-f]{7,40})`", "kernels of {}"),
    (r"(\d+) configurations", "{} configurations"),
    (r"([\d.]+) SASS instructions per mixed sample", "counts {} SASS instructions per sample"),
]


def _heading(text: str) -> tuple[str | None, int]:
    """The first line's ``# `` title of ``text`` and the number of lines up to it."""
    for number, line in enumerate(text.splitlines()):
        if line.strip():
            return (line[2:].strip(), number + 1) if line.startswith("# ") else (None, 0)
    return None, 0


def benchmark_titles(texts: dict[str, str]) -> dict[str, str]:
    """A distinct page title for each benchmark report (file name -> title).

    A report keeps its own ``# `` title (or its file stem when it has none) when no other
    report shares it; reports that share one get the facts of :data:`_TITLE_FACTS` found
    in their text appended, one more fact at a time until the titles differ, and the file
    stem as the last resort.
    """
    base = {}
    for name, text in texts.items():
        title, _ = _heading(text)
        base[name] = title or Path(name).stem
    titles = dict(base)
    for name in texts:
        group = [other for other in texts if base[other] == base[name]]
        if len(group) == 1:
            continue
        for depth in range(1, len(_TITLE_FACTS) + 2):
            candidates = {}
            for member in group:
                facts = []
                for pattern, template in _TITLE_FACTS[:depth]:
                    found = re.search(pattern, texts[member])
                    if found:
                        facts.append(template.format(found.group(1)))
                if depth > len(_TITLE_FACTS):
                    facts.append(Path(member).stem)
                candidates[member] = (
                    f"{base[member]}: {', '.join(facts)}" if facts else base[member]
                )
            if len(set(candidates.values())) == len(group):
                break
        titles[name] = candidates[name]
    return titles


def benchmark_pages() -> dict[str, str]:
    """The stub of each ``benchmarks/results/*.md`` (file name -> MyST source).

    Each stub states the report's title (:func:`benchmark_titles`) and includes the report
    from the line after its own title, so every page has one, distinct, title.
    """
    tables = sorted((ROOT / "benchmarks" / "results").glob("*.md"))
    texts = {table.name: table.read_text() for table in tables}
    titles = benchmark_titles(texts)
    pages = {}
    for name, text in texts.items():
        _, skip = _heading(text)
        start = f":start-line: {skip}\n" if skip else ""
        pages[name] = (
            f"# {titles[name]}\n\n```{{include}} ../../benchmarks/results/{name}\n"
            f"{start}:relative-images:\n```\n"
        )
    return pages


def _benchmark_stubs() -> None:
    _sync_dir(DOCS / "benchmarks", benchmark_pages(), keep={"index.md"})


def public_modules(package: str) -> list[str]:
    """Dotted names of the public modules of ``package`` (no part starting with ``_``)."""
    try:
        pkg = importlib.import_module(package)
    except ImportError:
        return []
    names = [package]
    for info in pkgutil.walk_packages(pkg.__path__, prefix=f"{package}."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return sorted(names)


def _is_triton_kernel(obj) -> bool:
    return type(obj).__name__ == "JITFunction" and callable(getattr(obj, "fn", None))


def _triton_kernels(module_name: str) -> list[str]:
    """Names in ``module.__all__`` bound to ``@triton.jit`` functions."""
    module = importlib.import_module(module_name)
    return [
        name
        for name in getattr(module, "__all__", [])
        if _is_triton_kernel(getattr(module, name, None))
    ]


def documented_members(module_name: str) -> list[str]:
    """Canonical dotted names of the public functions and classes a module offers.

    ``__all__`` when the module has one (a package's re-exports resolve to the module
    that defines them), else the public functions and classes it defines itself; names
    that do not come from ``plsh_ref``/``plsh_fast`` are left out, ``@triton.jit`` kernels
    are kept under the module that defines them.
    """
    import inspect

    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is None:
        names = [
            name
            for name, obj in vars(module).items()
            if not name.startswith("_")
            and (inspect.isfunction(obj) or inspect.isclass(obj) or _is_triton_kernel(obj))
            and getattr(obj, "__module__", module_name) == module_name
        ]
    out = []
    for name in names:
        obj = getattr(module, name, None)
        if _is_triton_kernel(obj):
            out.append(f"{module_name}.{name}")
        elif inspect.isfunction(obj) or inspect.isclass(obj):
            home = getattr(obj, "__module__", "") or ""
            if home.split(".")[0] in ("plsh_ref", "plsh_fast"):
                out.append(f"{home}.{obj.__qualname__}")
    return list(dict.fromkeys(out))


def _summary(obj) -> str:
    """The first paragraph of ``obj``'s docstring on one line (reStructuredText)."""
    import inspect

    doc = inspect.getdoc(getattr(obj, "fn", obj)) or ""
    return " ".join(doc.strip().split("\n\n")[0].split()) or "(no docstring)"


def _table(names: list[str], role: str, module: str) -> str:
    """A two-column table (link, summary); names are resolved from ``module``."""
    rows = []
    for name in names:
        mod, _, attr = name.rpartition(".")
        obj = (
            importlib.import_module(name)
            if role == "mod"
            else getattr(importlib.import_module(mod), attr)
        )
        link = f":py:{role}:`{name}`" if role == "mod" else f":py:obj:`~{name}`"
        summary = _summary(obj)
        if role == "mod":  # a module's roles are relative to itself: show them as code
            summary = re.sub(r":[\w:]+:`~?([^`<]+?)(\s*<[^>]*>)?`", r"``\1``", summary)
        rows.append(f"   * - {link}\n     - {summary}\n")
    return (
        f"```{{eval-rst}}\n.. currentmodule:: {module}\n\n"
        ".. list-table::\n   :widths: 30 70\n\n" + "".join(rows) + "```\n\n"
    )


def _package_contents(package: str, modules: list[str]) -> str:
    """The contents of a package page: its re-exported names, its modules, and the
    functions and classes of each direct submodule (subpackages list theirs on their page)."""
    children = [m for m in modules if m != package and m.rsplit(".", 1)[0] == package]
    text = ""
    if hasattr(importlib.import_module(package), "__all__"):
        exported = documented_members(package)
        if exported:
            links = ", ".join(f"{{py:obj}}`~{name}`" for name in exported)
            text += f"Names re-exported by `{package}`: {links}.\n\n"
    if children:
        text += "## Modules\n\n" + _table(children, "mod", "None")
    for child in children:
        if hasattr(importlib.import_module(child), "__path__"):
            continue
        members = documented_members(child)
        if members:
            text += f"## Functions and classes of `{child}`\n\n" + _table(members, "obj", child)
    return text


def _api_pages() -> None:
    """One page per public module; a package page lists what its modules offer.

    Nothing to edit when a module is added: every public module (no ``_`` in its dotted
    name) of ``plsh_ref`` and ``plsh_fast`` gets a page and a row on its package's page.
    """
    wanted = {}
    for package in ("plsh_ref", "plsh_fast"):
        modules = public_modules(package)
        for name in modules:
            # A package's __all__ re-exports names documented in their own modules: list
            # only what the package itself defines, so that every object has one target.
            is_package = hasattr(importlib.import_module(name), "__path__")
            option = "   :ignore-module-all:\n" if is_package else ""
            # autodoc does not list @triton.jit functions as members; add them explicitly
            jit = "".join(
                f"\n.. autofunction:: {name}.{member}\n" for member in _triton_kernels(name)
            )
            contents = _package_contents(name, modules) if is_package else ""
            wanted[f"{name}.md"] = (
                f"# `{name}`\n\n```{{eval-rst}}\n.. automodule:: {name}\n{option}{jit}```\n\n"
                + contents
            )
    _sync_dir(DOCS / "api", wanted, keep={"index.md"})


#: generating script -> a file it writes (under ``_generated/``)
_FIGURE_SCRIPTS = {
    "overview_figure.py": "overview.png",
    "reproduce_plots.py": "reproduce/log.txt",
    "kernels_plots.py": "kernels/reproduce/log.txt",
    "verify_examples.py": "verify/numpy_alibi.txt",
}


def _generate_sources(app) -> None:
    """Stubs and API pages (before Sphinx lists the source files), then the figures."""
    _theory_stubs()
    _benchmark_stubs()
    _api_pages()
    _figures(app)


def _figures(app) -> None:
    """Run the generating scripts (the doctest builder reuses outputs that exist)."""
    out = DOCS / "_generated"
    out.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    # The scripts are independent: they run at once (the build waits for all of them). Each
    # one's output goes to its own file, printed whole after it ends (not interleaved), and a
    # failing one fails the build with its name, after the others have finished.
    running = {}
    for script, product in _FIGURE_SCRIPTS.items():
        if app.builder.name == "doctest" and (out / product).exists():
            continue
        log = tempfile.TemporaryFile(mode="w+")
        command = [sys.executable, str(DOCS / "_scripts" / script), str(out)]
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        running[script] = (proc, log)
    failed = []
    for script, (proc, log) in running.items():
        code = proc.wait()
        log.seek(0)
        print(f"--- docs/_scripts/{script} (exit status {code}) ---\n{log.read()}", end="")
        log.close()
        if code != 0:
            failed.append(script)
    if failed:
        raise RuntimeError(f"docs/_scripts failed: {', '.join(failed)} (output above)")


# --- events: generated toctrees, re-exported names ---------------------------------------
#: reading order of the theory chapters; notes not listed follow in alphabetical order
THEORY_ORDER = [
    "softmax_bias_identity",
    "collision_probability",
    "expectation",
    "block_laws",
    "largest_pitch",
    "window_width",
    "halo_bound",
    "kms_spectrum",
    "max_norm_bound",
    "spectral_bound",
    "output_bound",
    "gradient_expectation",
    "general_kernels",
]
#: index pages whose marker line is replaced by a toctree of the stubs next to them
_GENERATED_TOCS = {"theory/index": "the proofs_notes", "benchmarks/index": "benchmarks/results"}
_TOC_MARKER = "% generated toctree"


def _insert_toctree(app, docname, source):
    if docname not in _GENERATED_TOCS or _TOC_MARKER not in source[0]:
        return
    folder = DOCS / docname.split("/")[0]
    entries = sorted(p.stem for p in folder.glob("*.md") if p.stem != "index")
    if docname == "theory/index":
        rank = {name: i for i, name in enumerate(THEORY_ORDER)}
        entries.sort(key=lambda name: (rank.get(name, len(rank)), name))
    toc = (
        "```{toctree}\n:maxdepth: 1\n\n" + "\n".join(entries) + "\n```\n"
        if entries
        else f"*(Nothing yet: no files in {_GENERATED_TOCS[docname]}.)*\n"
    )
    source[0] = source[0].replace(_TOC_MARKER, toc)


def _always_reread_indexes(app, env, added, changed, removed):
    return [name for name in _GENERATED_TOCS if name in env.found_docs]


def _canonical_name(target: str, module: str | None):
    """``plsh_ref.PartitionSample`` -> ``plsh_ref.partition.PartitionSample`` (or None)."""
    candidates = [target] + ([f"{module}.{target}"] if module and "." not in target else [])
    for name in candidates:
        parts = name.split(".")
        if parts[0] not in ("plsh_ref", "plsh_fast"):
            continue
        for i in range(len(parts) - 1, 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            try:
                for attr in parts[i:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                break
            home, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
            if home and qualname and f"{home}.{qualname}" != name:
                return f"{home}.{qualname}"
            break
    return None


def _resolve_reexports(app, env, node, contnode):
    """Resolve references to re-exported names (plsh_ref.X, plsh_ref.testing.X) to the
    page where the object is documented, under its defining module."""
    if node.get("refdomain") != "py":
        return None
    canonical = _canonical_name(node["reftarget"], node.get("py:module"))
    if canonical is None:
        return None
    domain = env.get_domain("py")
    return domain.resolve_xref(
        env, node["refdoc"], app.builder, node["reftype"], canonical, node, contnode
    )


def _triton_signature(app, what, name, obj, options, signature, return_annotation):
    """Show a @triton.jit function with the signature of the Python function it wraps."""
    if _is_triton_kernel(obj):
        import inspect

        return str(inspect.signature(obj.fn)), None
    return None


def setup(app):
    app.connect("autodoc-process-signature", _triton_signature)
    app.connect("builder-inited", _generate_sources)
    app.connect("source-read", _insert_toctree)
    app.connect("env-get-outdated", _always_reread_indexes)
    app.connect("missing-reference", _resolve_reexports)
