"""The snippet of docs/decoding.md runs as written."""

import re

import pytest

pytest.importorskip("torch")

import _paths  # noqa: E402


def test_the_decoding_page_snippet_runs(capsys):
    text = (_paths.ROOT / "docs" / "decoding.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], "docs/decoding.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "DecodingErrorBound(eps=" in printed and "1031" in printed
