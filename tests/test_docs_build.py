"""Fast checks of the documentation sources (the full Sphinx build runs in `make docs`).

They catch in seconds what would fail the nitpicky build later: a proofs note that is not
valid as a chapter (one `# Title`, no raw HTML, citations present in references.bib, a
named test), and the conf.py helpers that resolve re-exported names and list modules.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTES = sorted((ROOT / "proofs_notes").glob("*.md"))
BIB = (ROOT / "docs" / "references.bib").read_text()
BIB_KEYS = set(re.findall(r"@\w+\{([^,\s]+),", BIB))


def _load_conf():
    spec = importlib.util.spec_from_file_location("docs_conf", ROOT / "docs" / "conf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _outside_code(text: str) -> str:
    """The note without fenced code blocks and display math (where '#' and '<' are fine)."""
    text = re.sub(r"^(```|~~~).*?^\1\s*$", "", text, flags=re.S | re.M)
    return re.sub(r"\$\$.*?\$\$", "", text, flags=re.S)


def test_bibliography_has_the_required_references():
    assert {
        "wolfson2026plsh",
        "rahimi2007random",
        "press2022alibi",
        "kac1953eigenvalues",
        "dvoretzky1956asymptotic",
        "massart1990tight",
        "tropp2012user",
    } <= BIB_KEYS
    assert "2605.09472" in BIB


@pytest.mark.parametrize("note", NOTES, ids=[n.stem for n in NOTES])
def test_note_is_a_valid_chapter(note):
    text = note.read_text()
    body = _outside_code(text)
    first = next(line for line in text.splitlines() if line.strip())
    assert first.startswith("# "), f"{note.name}: must start with a single '# Title' line"
    assert len(re.findall(r"^# ", body, flags=re.M)) == 1, f"{note.name}: one '# ' heading only"
    raw_html = re.findall(r"</?(div|span|br|p|img|table|sup|sub|a)\b[^>]*>", body, flags=re.I)
    assert not raw_html, f"{note.name}: raw HTML {raw_html} (use MyST syntax)"
    for keys in re.findall(r"\{cite(?::\w+)?\}`([^`]*)`", text):
        for key in keys.split(","):
            assert key.strip() in BIB_KEYS, f"{note.name}: unknown citation {key!r}"
    assert re.search(r"tests/test_\w+\.py", text), f"{note.name}: name the test that checks it"


def test_conf_resolves_reexported_names():
    conf = _load_conf()
    assert (
        conf._canonical_name("plsh_ref.PartitionSample", None)
        == "plsh_ref.partition.PartitionSample"
    )
    assert (
        conf._canonical_name("check_case", "plsh_ref.testing")
        == "plsh_ref.testing.suite.check_case"
    )
    # a documented name is left to Sphinx; unknown names and other packages stay unresolved
    assert conf._canonical_name("plsh_ref.partition.PartitionSample", None) is None
    assert conf._canonical_name("plsh_ref.no_such_name", None) is None
    assert conf._canonical_name("numpy.ndarray", None) is None


def test_conf_lists_public_modules_only():
    conf = _load_conf()
    modules = conf.public_modules("plsh_ref")
    assert {
        "plsh_ref",
        "plsh_ref.alibi",
        "plsh_ref.testing",
        "plsh_ref.testing.verify",
        "plsh_ref.testing.strategies",
    } <= set(modules)
    assert not [m for m in modules if any(p.startswith("_") for p in m.split("."))]
