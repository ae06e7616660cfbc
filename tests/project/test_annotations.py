"""Every public function and method of plsh_ref and plsh_fast has complete annotations.

Public module: no part of its dotted name starts with ``_`` (the rule of
``docs/conf.py:public_modules``). Public callable in it: a module-level function, or a
method of a module-level class, whose name (and whose class's name) does not start with a
single ``_``; dunder methods (``__init__``, ``__call__``, ...) are public. ``@triton.jit``
kernels are not Python callables (Triton reads their annotations: ``tl.constexpr`` makes a
compile-time constant) and are left out. Complete: every
parameter except a method's ``self`` / ``cls`` is annotated (``*args`` and ``**kwargs``
too) and so is the return. The walk is over the source (``ast``), so it needs neither torch
nor triton. The test prints the annotated fraction and requires all of it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import _paths
import pytest

ROOT = _paths.ROOT
PACKAGES = ("plsh_ref", "plsh_fast")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def public_module_files() -> dict[str, Path]:
    """Dotted name -> source file of every public module of the two packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if not any(part.startswith("_") for part in parts):
                found[".".join(parts)] = path
    return found


def _is_static(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(
        (isinstance(d, ast.Name) and d.id == "staticmethod")
        or (isinstance(d, ast.Attribute) and d.attr == "staticmethod")
        for d in node.decorator_list
    )


def _is_triton_kernel(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Attribute) and target.attr == "jit":
            return True
    return False


def missing_annotations(node: ast.FunctionDef | ast.AsyncFunctionDef, is_method: bool) -> list[str]:
    """Names of the unannotated parameters of ``node`` (``"return"`` for the return)."""
    args = node.args
    positional = args.posonlyargs + args.args
    if is_method and not _is_static(node) and positional:
        positional = positional[1:]  # self / cls
    params = positional + args.kwonlyargs
    params += [a for a in (args.vararg, args.kwarg) if a is not None]
    missing = [a.arg for a in params if a.annotation is None]
    if node.returns is None:
        missing.append("return")
    return missing


def public_callables(source: str) -> list[tuple[str, list[str]]]:
    """``(qualified name, missing annotations)`` for each public callable of a module."""
    out = []
    funcs = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.parse(source).body:
        if isinstance(node, funcs) and not _private(node.name) and not _is_triton_kernel(node):
            out.append((node.name, missing_annotations(node, is_method=False)))
        elif isinstance(node, ast.ClassDef) and not _private(node.name):
            for item in node.body:
                if isinstance(item, funcs) and not _private(item.name):
                    qualname = f"{node.name}.{item.name}"
                    out.append((qualname, missing_annotations(item, is_method=True)))
    return out


def annotation_report() -> tuple[int, list[str]]:
    """Number of public callables and ``module.name: missing`` for each incomplete one."""
    total, incomplete = 0, []
    for module, path in public_module_files().items():
        for name, missing in public_callables(path.read_text()):
            total += 1
            if missing:
                incomplete.append(f"{module}.{name}: {', '.join(missing)}")
    return total, incomplete


def test_every_public_callable_is_fully_annotated():
    total, incomplete = annotation_report()
    assert total > 300  # the walk found the packages (337 public callables when written)
    done = total - len(incomplete)
    print(f"annotated public callables: {done}/{total} ({done / total:.1%})")
    assert not incomplete, (
        f"{len(incomplete)} of {total} public callables lack annotations:\n" + "\n".join(incomplete)
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f(a: int, *, b: int = 1) -> int: ...", []),
        ("def f(a, b: int) -> int: ...", ["a"]),
        ("def f(a: int): ...", ["return"]),
        ("def f(*args, **kwargs: int) -> None: ...", ["args"]),
        ("class C:\n    def m(self, x) -> None: ...", ["x"]),
        ("class C:\n    @staticmethod\n    def m(x) -> None: ...", ["x"]),
        ("class C:\n    def __init__(self, x: int): ...", ["return"]),
        ("@triton.jit\ndef f(x, y: tl.constexpr): ...", None),
    ],
)
def test_walk_finds_what_is_missing(source, expected):
    # negative control: the walk reports exactly the unannotated pieces
    found = public_callables(source)
    if expected is None:  # a Triton kernel: not a public Python callable
        assert found == []
        return
    ((_name, missing),) = found
    assert missing == expected


def test_walk_skips_private_names():
    source = (
        "def _helper(x): ...\n"
        "class _Private:\n    def m(self, x): ...\n"
        "class Public:\n    def _m(self, x): ...\n"
    )
    assert public_callables(source) == []
