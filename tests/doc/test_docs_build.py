"""Fast checks of the documentation sources (the full Sphinx build runs in `make docs`).

They catch in seconds what would fail the nitpicky build later: a proofs note that is not
valid as a chapter (one `# Title`, no raw HTML, citations present in references.bib, a
named test), and the conf.py helpers that resolve re-exported names and list modules.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import _paths
import pytest

ROOT = _paths.ROOT
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
    named = re.findall(r"tests/(?:\w+/)*test_\w+\.py", text)
    assert named, f"{note.name}: name the test that checks it"
    missing = [path for path in named if not (ROOT / path).is_file()]
    assert not missing, f"{note.name}: names tests that do not exist: {missing}"


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


# ---------------------------------------------------------------- headings: no raw LaTeX
#: every Markdown source that becomes a page (titles, toc entries, prev/next links)
PAGES = sorted(
    [p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts]
    + NOTES
    + list((ROOT / "benchmarks" / "results").glob("*.md"))
)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_headings_have_no_raw_latex(page):
    # A heading's text becomes the HTML <title>, the toctree entry and the prev/next link,
    # where MathJax does not run: "$L^*$" would show as "\(L^*\)". Use Unicode instead.
    text = re.sub(r"^(```|~~~).*?^\1\s*$", "", page.read_text(), flags=re.S | re.M)
    bad = [h for h in re.findall(r"^#{1,6} .*$", text, flags=re.M) if re.search(r"[$\\]", h)]
    assert not bad, f"{page.name}: headings with LaTeX {bad}"


def test_heading_check_sees_latex():
    # negative control for the pattern above
    assert re.search(r"[$\\]", "# The spectrum of $L^*$")
    assert not re.search(r"[$\\]", "# The spectrum of L* and the 1/√s scale")


# ---------------------------------------------------------------- math without network
MATH_PAGE = r"""# Math page

Inline $a^2 + b^2 = c^2$ and a display:

$$
\sum_{k=1}^{n} k = \frac{n (n + 1)}{2}
$$

\begin{align}
f(\theta) &= \frac{1 - \rho^2}{1 - 2 \rho \cos\theta + \rho^2}
\end{align}
"""


@pytest.fixture(scope="module")
def math_site(tmp_path_factory):
    """A one-page site built with docs/conf.py's math configuration (extensions, MyST
    options, theme, mathjax_path if set): what the real build does to formulas."""
    import subprocess
    import sys

    conf = _load_conf()
    src = tmp_path_factory.mktemp("math_src")
    out = tmp_path_factory.mktemp("math_html")
    settings = {
        "extensions": [e for e in conf.extensions if e == "myst_parser" or "math" in e],
        "myst_enable_extensions": conf.myst_enable_extensions,
        "myst_dmath_double_inline": conf.myst_dmath_double_inline,
        "html_theme": conf.html_theme,
    }
    for name in ("mathjax_path", "mathjax3_config", "mathjax4_config", "mathjax_options"):
        if hasattr(conf, name):
            settings[name] = getattr(conf, name)
    (src / "conf.py").write_text("".join(f"{k} = {v!r}\n" for k, v in settings.items()))
    (src / "index.md").write_text(MATH_PAGE)
    subprocess.run(
        [sys.executable, "-m", "sphinx", "-q", "-W", "-b", "html", str(src), str(out)],
        check=True,
        timeout=300,
    )
    return out


def _mathjax_sources(html: str) -> list[str]:
    return [s for s in re.findall(r'<script[^>]*\ssrc="([^"]+)"', html) if "mathjax" in s.lower()]


def test_mathjax_is_a_bundled_local_file(math_site):
    html = (math_site / "index.html").read_text()
    sources = _mathjax_sources(html)
    assert sources, "no MathJax script on a page with math"
    for source in sources:
        assert not re.match(r"^(https?:)?//", source), f"MathJax loaded from the network: {source}"
        assert (math_site / source).is_file(), f"MathJax script {source} not in the build"
    assert len(re.findall(r'class="(amsmath )?math notranslate nohighlight"', html)) == 3


def _chromium():
    import shutil

    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def _rendered_formulas(site: Path, page: str, tmp_path: Path) -> int:
    """Number of MathJax-typeset formulas on ``page`` served from ``site`` on localhost,
    in headless Chromium that cannot resolve any other host."""
    import functools
    import http.server
    import subprocess
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        dom = subprocess.run(
            [
                _chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost",
                f"--user-data-dir={tmp_path / 'chromium-profile'}",
                "--virtual-time-budget=15000",
                "--dump-dom",
                f"http://localhost:{server.server_address[1]}/{page}",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
    finally:
        server.shutdown()
        server.server_close()
    assert "Math page" in dom, "the page did not load"
    return dom.count("<mjx-container")


@pytest.mark.skipif(_chromium() is None, reason="needs chromium (not installed in CI)")
def test_math_renders_in_a_browser_without_network(math_site, tmp_path):
    assert _rendered_formulas(math_site, "index.html", tmp_path) == 3
    # Negative control: the same page loading MathJax from its CDN typesets nothing, so the
    # browser really had no network and the count above came from the bundled copy.
    html = (math_site / "index.html").read_text()
    (math_site / "cdn.html").write_text(
        html.replace(
            _mathjax_sources(html)[0], "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js"
        )
    )
    assert _rendered_formulas(math_site, "cdn.html", tmp_path) == 0


def test_package_pages_list_the_functions_of_their_modules():
    # The API pages are generated (docs/conf.py, _api_pages): a package page holds a table
    # of its modules and one of the functions and classes of each direct submodule.
    conf = _load_conf()
    assert "plsh_ref.toeplitz.kms_secular" in conf.documented_members("plsh_ref.toeplitz")
    # re-exports resolve to the defining module
    assert "plsh_ref.attention.plsh_attention" in conf.documented_members("plsh_ref")
    modules = conf.public_modules("plsh_ref")
    text = conf._package_contents("plsh_ref.experiments", modules)
    for name in ("reproduce", "spectrum", "bounds_report"):
        assert f":py:mod:`plsh_ref.experiments.{name}`" in text
        assert f":py:obj:`~plsh_ref.experiments.{name}.run`" in text
    top = conf._package_contents("plsh_ref", modules)
    assert ":py:obj:`~plsh_ref.toeplitz.kms_secular`" in top
    assert "{py:obj}`~plsh_ref.partition.draw_partition`" in top  # re-exported names
    # subpackages list their own functions on their own page, not on the parent's
    assert "plsh_ref.testing.suite.check_case`" not in top
    assert ":py:mod:`plsh_ref.testing`" in top


SHARED_SPEC = ROOT.parent / "shared" / "SPEC.md"


@pytest.mark.skipif(not SHARED_SPEC.is_file(), reason="no ../shared/SPEC.md next to the clone")
def test_spec_page_is_the_shared_specification():
    # docs/spec.md ships SPEC.md (whose section numbers docstrings cite) under a docs title
    # and one introductory paragraph; the body must not drift from the source.
    spec_body = SHARED_SPEC.read_text().split("\n", 1)[1]
    page = (ROOT / "docs" / "spec.md").read_text()
    assert page.endswith(spec_body)
    assert page[: -len(spec_body)].count("\n\n") <= 2


def test_spec_page_states_the_corrected_frobenius_limit():
    text = (ROOT / "docs" / "spec.md").read_text()
    assert "whatever sigma" not in text.replace('"about 1/s whatever sigma"', "")
    assert "sech(1/sigma)" in text and "exp(-1/sigma)" in text
