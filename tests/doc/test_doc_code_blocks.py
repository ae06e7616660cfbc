"""Every Python code block of the docs pages runs as written, or says why it is not run.

For each ``docs/*.md`` page, its fenced ``python`` blocks are executed in page order in one
namespace (a later block may use an earlier one's names), and its ``{doctest}`` blocks are
run by :mod:`doctest` after ``doctest_global_setup`` of ``docs/conf.py`` (the same blocks
``sphinx -b doctest`` runs in ``make docs``). A block is skipped only when the line just
before its fence is ``<!-- not run: REASON -->`` with a reason. README.md's blocks are run
by ``tests/doc/test_readme.py``.
"""

from __future__ import annotations

import doctest
import importlib.util
import re
from dataclasses import dataclass

import _paths
import pytest

DOCS = _paths.ROOT / "docs"
FENCE = re.compile(
    r"(?ms)^(?P<fence>```+)[ \t]*(?P<lang>\{doctest\}|python)[^\n]*\n(?P<body>.*?)^(?P=fence)[ \t]*$"
)
NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<reason>\S.*?)\s*-->")


@dataclass
class Block:
    page: str
    line: int
    lang: str
    body: str
    not_run: str | None  # the reason, when marked


def blocks(text: str, page: str) -> list[Block]:
    """The ``python`` and ``{doctest}`` blocks of one page, with their not-run marks."""
    found = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = NOT_RUN.fullmatch(before.strip())
        line = text[: m.start()].count("\n") + 1
        found.append(
            Block(page, line, m.group("lang"), m.group("body"), mark and mark.group("reason"))
        )
    return found


def _pages() -> list[str]:
    return sorted(p.name for p in DOCS.glob("*.md"))


def _doctest_setup() -> str:
    spec = importlib.util.spec_from_file_location("docs_conf_blocks", DOCS / "conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    return conf.doctest_global_setup


def _needs(body: str) -> None:
    for module in ("torch", "transformers"):
        if re.search(rf"^\s*(>>> )?(import|from) {module}\b", body, flags=re.M):
            pytest.importorskip(module)
    if re.search(r"^\s*(>>> )?(import|from) plsh_fast", body, flags=re.M):
        pytest.importorskip("torch")


@pytest.mark.parametrize("page", _pages())
def test_page_code_blocks_run(page):
    page_blocks = blocks((DOCS / page).read_text(), page)
    for block in page_blocks:
        if block.not_run is None:
            _needs(block.body)
    namespace: dict = {"__name__": f"docs_{page}"}
    if any(b.lang == "{doctest}" for b in page_blocks):
        exec(_doctest_setup(), namespace)  # noqa: S102
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for block in page_blocks:
        if block.not_run is not None:
            continue
        where = f"docs/{page}:{block.line}"
        if block.lang == "python":
            exec(compile(block.body, where, "exec"), namespace)  # noqa: S102
        else:
            test = doctest.DocTestParser().get_doctest(block.body, namespace, where, where, 0)
            report: list[str] = []
            result = runner.run(test, out=report.append, clear_globs=False)
            assert result.failed == 0, "".join(report)
            namespace.update(test.globs)  # DocTest ran on a copy: later blocks see its names


def test_not_run_marks_give_a_reason():
    text = (
        "<!-- not run: needs 2 processes -->\n```python\nx = 1\n```\n\n"
        "```python\ny = 2\n```\n<!-- not run: -->\n```python\nz = 3\n```\n"
        "```{doctest}\n>>> 1\n1\n```\n"
    )
    found = blocks(text, "t.md")
    assert [b.not_run for b in found] == ["needs 2 processes", None, None, None]
    assert [b.lang for b in found] == ["python", "python", "python", "{doctest}"]


def test_pages_have_blocks():
    # negative control for the fence pattern: the pages' examples are found
    total = sum(len(blocks((DOCS / p).read_text(), p)) for p in _pages())
    assert total >= 15, total
