"""No import cycle among the modules of plsh_ref and plsh_fast.

Every module is parsed (``ast``), imports inside functions and ``if`` blocks included,
relative imports resolved against the importer's package. ``import a.b.c`` and
``from a.b import c`` give an edge to the deepest module named (``a.b.c`` when it is a
module, else ``a.b``); ``from package import name`` gives an edge to the package's
``__init__`` only when ``name`` is not a module. A cycle, even one hidden behind a
function-level import, means two modules that cannot be read, tested or moved apart
(CONTRIBUTING.md, "one idea per module"). The cycle finder itself is tested on small
synthetic graphs, so the test can fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

import _paths

ROOT = _paths.ROOT
PACKAGES = ("plsh_ref", "plsh_fast")


def _module_names(root: Path = ROOT) -> dict[str, tuple[bool, Path]]:
    """``{dotted name: (is_package, path)}`` of every module of :data:`PACKAGES`."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            found[".".join(parts)] = (is_package, path)
    return found


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module named by ``from <node.module> import ...`` inside ``module``."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, is_package: bool, source: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``source`` (the text of ``module``) imports, anywhere."""
    targets = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                prefixes = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
                targets.update(next(([p] for p in prefixes if p in known), []))
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in known else base)
    return {t for t in targets if t in known and t != module}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """``{module: modules it imports}`` over plsh_ref and plsh_fast."""
    modules = _module_names(root)
    known = set(modules)
    return {
        name: imports_of(name, is_package, path.read_text(encoding="utf-8"), known)
        for name, (is_package, path) in modules.items()
    }


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted.

    Every import cycle lies inside one of them, so an empty list means no cycle.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:  # recursion depth <= number of modules (~100)
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def _cycle_path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One concrete cycle through the component's first module (for the failure message)."""
    members, start = set(component), component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        node = frontier.pop(0)
        for target in sorted(graph[node] & members):
            if target == start:
                return paths[node] + [start]
            if target not in paths:
                paths[target] = paths[node] + [target]
                frontier.append(target)
    return component


def test_cycle_finder_finds_a_planted_cycle():
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a", "p.d"}, "p.d": set()}
    assert find_cycles(graph) == [["p.a", "p.b", "p.c"]]
    assert _cycle_path(graph, ["p.a", "p.b", "p.c"]) == ["p.a", "p.b", "p.c", "p.a"]
    graph["p.c"] = {"p.d"}  # cut the back edge: no cycle left
    assert find_cycles(graph) == []


def test_import_parser_sees_function_level_and_relative_imports():
    known = {"p", "p.a", "p.b", "p.sub", "p.sub.c", "q"}
    source = (
        "from . import b as B\n"
        "import q\n"
        "def f():\n"
        "    from .sub.c import thing\n"
        "    from .sub import c\n"
        "    from p import name_in_init\n"
    )
    assert imports_of("p.a", False, source, known) == {"p.b", "q", "p.sub.c", "p"}
    # inside a package's __init__, "." is the package itself
    assert imports_of("p.sub", True, "from . import c\nfrom .. import a\n", known) == {
        "p.sub.c",
        "p.a",
    }


def test_cycle_finder_on_a_planted_cycle_in_real_sources(tmp_path):
    pkg = tmp_path / "plsh_ref"
    pkg.mkdir()
    (tmp_path / "plsh_fast").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "validation.py").write_text("def f():\n    from .alibi import g\n")
    (pkg / "alibi.py").write_text("from .validation import f\n")
    (pkg / "leaf.py").write_text("from .alibi import g\n")
    assert find_cycles(import_graph(tmp_path)) == [["plsh_ref.alibi", "plsh_ref.validation"]]


def test_no_import_cycles():
    graph = import_graph()
    assert "plsh_fast.api" in graph and "plsh_ref.validation" in graph  # the walk found them
    cycles = [" -> ".join(_cycle_path(graph, c)) for c in find_cycles(graph)]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_validation_is_a_leaf():
    """plsh_ref.validation imports no other plsh_ref module (every module may use it)."""
    graph = import_graph()
    assert graph["plsh_ref.validation"] == set()
