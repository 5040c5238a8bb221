"""The documentation site as a reader gets it: built from a checkout with the [docs] extra alone,
and read offline.

The build runs with imports limited to the standard library, the checkout's `engine` (not
installed: the reference generator finds it) and the distributions the [docs] extra requires, with
their own requirements, as in a fresh environment that installed only those. The built site is
then opened in headless Chromium (tests/cpu/browser.py) with every request that would leave the
machine aborted: the architecture diagram renders as an SVG and search finds a word. No page or
stylesheet refers to a script, stylesheet, font or image elsewhere. (The theme's own script still
names a CDN for mermaid, as the fallback it takes when the page loaded none; the vendored copy is
loaded, and the browser check shows nothing is asked for.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from browser import chromium, page, serve

ROOT = Path(__file__).resolve().parents[2]

# Run by a fresh interpreter: refuse every import outside the allowed top-level names, drop the
# checkout from the path (an editable install puts it there), then build the site strictly.
BUILD = r"""
import importlib.abc, json, sys
from pathlib import Path

allowed, root, site = set(json.loads(sys.argv[1])), Path(sys.argv[2]), sys.argv[3]

class OnlyTheDocsExtra(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in allowed or top in sys.stdlib_module_names or top in sys.builtin_module_names:
            return None
        raise ModuleNotFoundError(f"No module named {name!r} (not in the [docs] extra)", name=name)

sys.meta_path.insert(0, OnlyTheDocsExtra())
sys.path[:] = [p for p in sys.path if p and Path(p).resolve() != root]
from mkdocs.__main__ import cli
cli(["build", "--strict", "-f", str(root / "mkdocs.yml"), "-d", site])
"""


def docs_extra() -> list[str]:
    """The [docs] extra's requirements, from pyproject.toml."""
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["docs"]


def docs_extra_modules() -> set[str]:
    """Top-level module names of the [docs] extra's distributions and everything they require."""
    todo, dists = [Requirement(r).name for r in docs_extra()], set()
    while todo:
        name = canonicalize_name(todo.pop())
        if name in dists:
            continue
        dists.add(name)
        for line in metadata.requires(name) or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return {top for top, owners in metadata.packages_distributions().items()
            if any(canonicalize_name(d) in dists for d in owners)} | {"engine"}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    site = tmp_path_factory.mktemp("docs") / "site"
    done = subprocess.run([sys.executable, "-c", BUILD, json.dumps(sorted(docs_extra_modules())), str(ROOT), str(site)],
                          cwd=site.parent, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True,
                          text=True, timeout=300)
    return site, done


@pytest.fixture(scope="module")
def site(built) -> Path:
    path, done = built
    if done.returncode != 0:
        pytest.fail(f"the site does not build with the [docs] extra alone:\n{done.stderr[-3000:]}")
    return path


def test_the_docs_extra_alone_builds_the_site_with_the_generated_reference(built):
    path, done = built
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pcg-synth draft train" in (path / "reference" / "cli" / "index.html").read_text()
    assert "decoding.max_speech_ratio" in (path / "reference" / "job-spec" / "index.html").read_text()
    # what the README tells a reader to install for the site alone is that list; the build is ignored
    named = re.search(r"`pip install (mkdocs [^`]*)`", (ROOT / "README.md").read_text()).group(1).split()
    assert sorted(named) == sorted(Requirement(r).name for r in docs_extra())
    assert subprocess.run(["git", "check-ignore", "-q", "site/index.html"], cwd=ROOT).returncode == 0


class Resources(HTMLParser):
    """The addresses a page loads: scripts, stylesheets, fonts, icons, images, media, frames."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "link" and attrs.get("href"):
            self.found.append(attrs["href"])
        elif tag in ("script", "img", "audio", "video", "source", "iframe", "embed") and attrs.get("src"):
            self.found.append(attrs["src"])


ELSEWHERE = re.compile(r"^(https?:)?//", re.I)
CDN = re.compile(r"https?://(unpkg\.com|cdn\.jsdelivr\.net|cdnjs\.cloudflare\.com|fonts\.googleapis\.com|"
                 r"fonts\.gstatic\.com)/", re.I)
CSS_URL = re.compile(r"""(?:url\(\s*['"]?|@import\s+['"])([^'")\s]+)""")


def test_no_page_or_stylesheet_loads_anything_from_elsewhere(site):
    loaded = {}
    for html in site.rglob("*.html"):
        parser = Resources()
        parser.feed(html.read_text())
        loaded[html] = parser.found
    for css in site.rglob("*.css"):
        loaded[css] = CSS_URL.findall(css.read_text())
    assert len(loaded) > 20 and sum(map(len, loaded.values())) > 100  # the parser saw the site's assets
    elsewhere = {str(f.relative_to(site)): [u for u in urls if ELSEWHERE.match(u)] for f, urls in loaded.items()}
    assert not {f: u for f, u in elsewhere.items() if u}
    diagram = loaded[site / "concepts" / "architecture" / "index.html"]
    assert any(u.endswith(".min.js") and "/vendor/mermaid-" in u for u in diagram), diagram
    # nor does any file name a CDN (the theme's never-taken fallbacks are emptied at build time)
    texts = [f for f in site.rglob("*") if f.suffix in (".html", ".js", ".css", ".map", ".json")]
    named = {str(f.relative_to(site)) for f in texts if CDN.search(f.read_text(errors="replace"))}
    assert len(texts) > 20 and not named, named


def nodes(node: dict):
    """A DOM tree from CDP's DOM.getDocument, closed shadow roots included, depth first."""
    yield node
    for child in (*node.get("children", ()), *node.get("shadowRoots", ())):
        yield from nodes(child)


def test_offline_the_diagram_renders_as_svg_and_search_finds_a_word(site):
    with chromium() as browser, serve(site) as base:
        with page(f"{base}/concepts/architecture/", browser=browser, wait_until="networkidle") as p:
            assert (p.blocked, p.errors) == ([], [])  # e.g. the theme's CDN fallback, were no mermaid loaded
            p.wait_for_selector("div.mermaid")  # the theme replaces the diagram's source once it rendered
            # The theme puts the SVG in a closed shadow root, which only the DevTools protocol sees.
            root = p.context.new_cdp_session(p).send("DOM.getDocument", {"depth": -1, "pierce": True})["root"]
            hosts = [n for n in nodes(root) if n.get("localName") == "div" and "mermaid" in n.get("attributes", [])]
            assert len(hosts) == 1
            svg = [n for n in nodes(hosts[0]) if n.get("localName") == "svg"]
            labels = {n.get("nodeValue", "") for n in nodes(hosts[0]) if n.get("nodeType") == 3}
            assert svg and {"job spec (YAML)", "codec", "driver (runtime/job.py)"} <= labels, labels
            assert "flowchart TD" not in p.inner_text("article")  # not left as its source text
            assert (p.blocked, p.errors) == ([], [])
        with page(f"{base}/", browser=browser, wait_until="networkidle") as p:
            p.click("input.md-search__input")
            p.keyboard.type("fencing")
            p.wait_for_function("/[0-9]+ matching/.test(document.querySelector('.md-search-result__meta').textContent)")
            hits = {re.split(r"[?#]", a.get_attribute("href"))[0] for a in p.locator(".md-search-result__link").all()}
            assert {f"{base}/glossary/", f"{base}/guides/outputs-and-commits/"} <= hits, hits
            assert (p.blocked, p.errors) == ([], [])
