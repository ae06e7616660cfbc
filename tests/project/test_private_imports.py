"""No module of plsh_ref / plsh_fast imports another module's underscore names.

A helper that two modules need is public in one obvious module (CONTRIBUTING.md, "one
idea per module"); importing ``_name`` from another module couples the two through a
name that carries no promise. Allowed: a package's own package-private *modules*
(``from . import _validation as V`` inside plsh_fast). Not allowed: ``from X import _name``
where ``_name`` is not a module of the importer's own package, and any import of another
top-level package's private module (plsh_fast importing ``plsh_ref._something``) or of the
deprecated alias ``plsh_ref._validation``.
"""

from __future__ import annotations

import ast

import _paths
import pytest

ROOT = _paths.ROOT
PACKAGES = ("plsh_ref", "plsh_fast")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            yield ".".join(parts), is_package, path


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def private_imports(module: str, is_package: bool, source: str) -> list[tuple[str, str, str]]:
    """``(importer, source module, name)`` for every forbidden import in ``source``."""
    found = []
    package = module if is_package else module.rpartition(".")[0]
    top = module.split(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            target = _absolute(module, is_package, node)
            if target == "__future__":
                continue
            for alias in node.names:
                if _private(alias.name):
                    own_private_module = target == package and _is_module(f"{target}.{alias.name}")
                    if not own_private_module:
                        found.append((module, target, alias.name))
            found += _private_module_use(module, top, target)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found += _private_module_use(module, top, alias.name)
    return found


def _private_module_use(module: str, top: str, target: str) -> list[tuple[str, str, str]]:
    parts = target.split(".")
    if target == "plsh_ref._validation":
        return [(module, target, "(deprecated alias: import plsh_ref.validation)")]
    if parts[0] in PACKAGES and parts[0] != top and any(_private(p) for p in parts[1:]):
        return [(module, target, "(another package's private module)")]
    return []


def test_no_module_imports_another_modules_private_names():
    found = []
    for module, is_package, path in _modules():
        found += private_imports(module, is_package, path.read_text(encoding="utf-8"))
    assert not found, "\n".join(f"{m}: from {t} import {n}" for m, t, n in sorted(set(found)))


@pytest.mark.parametrize(
    "module,is_package,source,expected",
    [
        ("plsh_ref.bounds", False, "from .attention import _scale", 1),
        ("plsh_ref.bounds", False, "from plsh_ref.attention import _scale", 1),
        ("plsh_ref.experiments.reproduce", False, "from ..attention import _log", 1),
        ("plsh_ref.testing", True, "from .suite import _cases", 1),
        ("plsh_fast.api", False, "from plsh_ref._validation import check_int", 1),
        ("plsh_fast.api", False, "import plsh_ref._validation", 1),
        ("plsh_fast.api", False, "from plsh_ref.testing._x import f", 1),
        # negative controls: public names, own package-private modules, dunders
        ("plsh_fast.api", False, "from . import _validation as V", 0),
        ("plsh_fast.api", False, "from .autograd import PLSHAttentionFunction", 0),
        ("plsh_ref.attention", False, "from .validation import check_scale", 0),
        ("plsh_ref.cli", False, "from . import __version__", 0),
        ("plsh_ref.cli", False, "from __future__ import annotations", 0),
    ],
)
def test_the_scanner_sees_private_imports(module, is_package, source, expected):
    assert len(private_imports(module, is_package, source)) == expected
