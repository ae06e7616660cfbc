"""The ``Examples`` sections of the public docstrings run as doctests, and the entry points have one.

Every public module of plsh_ref and plsh_fast (no part of its dotted name starting with
``_``) is imported and its docstrings' ``>>>`` examples are run by :mod:`doctest`
(``ELLIPSIS``, ``NORMALIZE_WHITESPACE``); a module whose optional dependency is missing
(torch, transformers, triton) is skipped. ``ENTRY_POINTS`` lists the functions and classes a
user meets first: each must carry an example.
"""

from __future__ import annotations

import doctest
import importlib

import _paths
import pytest

ROOT = _paths.ROOT
PACKAGES = ("plsh_ref", "plsh_fast")
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

#: ``module:qualname`` of the entry points that must show an example
ENTRY_POINTS = [
    "plsh_fast.api:plsh_attention",
    "plsh_fast.nn:PLSHAttention",
    "plsh_fast.decoding:PLSHDecodingCache",
    "plsh_fast.hf:set_alibi_attention",
    "plsh_fast.distributed:plan_context_parallel",
    "plsh_ref.attention:plsh_attention",
    "plsh_ref.attention:alibi_attention",
    "plsh_ref.alibi:alibi_slopes",
    "plsh_ref.partition:draw_partition",
    "plsh_ref.partition:counts",
    "plsh_ref.testing.tolerance:assert_close_to_reference",
    "plsh_ref.testing.property_suite:make_property_suite",
]


def public_modules() -> list[str]:
    names = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if not any(part.startswith("_") for part in parts):
                names.append(".".join(parts))
    return names


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as exc:  # an optional dependency (torch, transformers, triton)
        missing = getattr(exc, "name", None) or ""
        if missing.split(".")[0] in {"torch", "transformers", "triton"}:
            pytest.skip(f"{name} needs {missing}")
        raise


def _examples(obj) -> list[doctest.Example]:
    parser = doctest.DocTestParser()
    return [part for part in parser.parse(obj.__doc__ or "") if isinstance(part, doctest.Example)]


@pytest.mark.parametrize("module_name", public_modules())
def test_docstring_examples_run(module_name):
    module = _import(module_name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report: list[str] = []
    for test in finder.find(module, module_name):  # globals: a copy of the module's
        runner.run(test, out=report.append)
    results = runner.summarize(verbose=False)
    assert results.failed == 0, "".join(report)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_entry_point_has_an_example(entry):
    module_name, qualname = entry.split(":")
    obj = _import(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    assert "Examples\n" in (obj.__doc__ or ""), f"{entry}: no Examples section"
    assert _examples(obj), f"{entry}: no >>> example"


def test_the_parser_finds_examples():
    # negative control: a docstring without ``>>>`` has no example
    def documented():
        """Examples
        --------
        >>> 1 + 1
        2
        """

    def undocumented():
        """Nothing to run."""

    assert len(_examples(documented)) == 1
    assert _examples(undocumented) == []
