"""Every public function and class of plsh_ref and plsh_fast names its source.

CONTRIBUTING.md: a public docstring gives, besides shapes, dtypes, units and errors, the
source of what it computes or follows: a theorem or equation, a SPEC section, a
``proofs_notes/`` note, the documentation page of the feature, a paper, or the upstream
API it mirrors. Here "names a source" is read off the docstring: a ``References``
section, or a citation of ``proofs_notes/``, ``SPEC``, ``docs/``, a theorem or lemma, an
arXiv number or an author-year reference. A class is covered by its own docstring or, if
that names none, by all of its public methods'. Public modules and callables as in
``test_annotations.py``. Every ``proofs_notes/*.md`` and ``docs/*.md`` file a docstring
of the two packages cites must exist.
"""

from __future__ import annotations

import ast
import re

import _paths
import pytest
from test_annotations import _is_triton_kernel, _private, public_module_files

ROOT = _paths.ROOT

#: what counts as naming a source (module docstring)
SOURCE = re.compile(r"References|proofs_notes|SPEC|Theorem|Lemma|docs/|arXiv|\(\d{4}\)")

#: a cited file of the repository
CITED_FILE = re.compile(r"\b((?:proofs_notes|docs)/[A-Za-z0-9_./-]+?\.md)\b")


def unsourced(source: str) -> list[str]:
    """Public module-level functions and classes of ``source`` whose docstrings name no source."""
    out = []
    funcs = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.parse(source).body:
        if isinstance(node, funcs) and not _private(node.name) and not _is_triton_kernel(node):
            if not SOURCE.search(ast.get_docstring(node) or ""):
                out.append(node.name)
        elif isinstance(node, ast.ClassDef) and not _private(node.name):
            if SOURCE.search(ast.get_docstring(node) or ""):
                continue
            methods = [f for f in node.body if isinstance(f, funcs) and not _private(f.name)]
            if not methods or not all(SOURCE.search(ast.get_docstring(f) or "") for f in methods):
                out.append(node.name)
    return out


def cited_files(source: str) -> set[str]:
    """``proofs_notes/*.md`` and ``docs/*.md`` paths cited in the docstrings of ``source``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        if isinstance(node, kinds):
            found.update(CITED_FILE.findall(ast.get_docstring(node) or ""))
    return found


def test_every_public_function_and_class_names_its_source():
    files = public_module_files()
    total = 0
    missing = []
    for module, path in files.items():
        text = path.read_text()
        tree = ast.parse(text)
        total += sum(
            isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and not _private(n.name)
            for n in tree.body
        )
        missing += [f"{module}.{name}" for name in unsourced(text)]
    assert total > 300  # the walk found the packages (337 when written)
    assert not missing, f"{len(missing)} of {total} name no source:\n" + "\n".join(missing)


def test_every_cited_note_and_page_exists():
    absent = sorted(
        f"{module}: {cited}"
        for module, path in public_module_files().items()
        for cited in cited_files(path.read_text())
        if not (ROOT / cited).is_file()
    )
    assert not absent, "docstrings cite files that do not exist:\n" + "\n".join(absent)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('def f() -> None:\n    """Does it."""', ["f"]),
        ('def f() -> None:\n    """Does it.\n\n    References\n    ----------\n    x."""', []),
        ('def f() -> None:\n    """As ``proofs_notes/backward.md``."""', []),
        ('def f() -> None:\n    """Press et al. (2022)."""', []),
        ("def f() -> None: ...", ["f"]),
        ('def _f() -> None:\n    """Private."""', []),
        (
            'class C:\n    """A class."""\n    def m(self) -> None:\n        """SPEC section 5."""',
            [],
        ),
        ('class C:\n    """A class."""\n    def m(self) -> None:\n        """No."""', ["C"]),
        ('class C:\n    """A class."""', ["C"]),
    ],
)
def test_walk_finds_what_names_no_source(source, expected):
    # negative control: the walk reports exactly the docstrings that name no source
    assert unsourced(source) == expected


def test_cited_files_are_read_off_every_docstring():
    source = (
        '"""Module: ``docs/kernels.md``."""\n'
        'def f() -> None:\n    """See proofs_notes/window_width.md section 2a."""\n'
        'class C:\n    def m(self) -> None:\n        """And docs/missing_page.md."""\n'
    )
    assert cited_files(source) == {
        "docs/kernels.md",
        "proofs_notes/window_width.md",
        "docs/missing_page.md",
    }
