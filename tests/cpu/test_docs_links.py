"""The documentation's references hold: every relative link (and its #anchor) in README.md, the
site in docs/, cluster/README.md and the benchmarks index leads somewhere, every benchmark result
file they cite is committed, and the index names every result file. The site's pages are read as
mkdocs renders them (the generated reference pages included), their anchors as mkdocs makes them;
the rest as GitHub does."""

from __future__ import annotations

import re
import sys
from functools import cache
from pathlib import Path

from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
INDEX = ROOT / "benchmarks" / "README.md"
MOST_RESULT_FILES = 60  # one current result per question; earlier ones live in git history
SITE = ROOT / "docs"
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(SITE.rglob("*.md")), ROOT / "cluster" / "README.md", INDEX]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
sys.path.insert(0, str(ROOT / "scripts"))

import docs_reference  # noqa: E402


@cache
def text(doc: Path) -> str:
    """A document as its readers see it: a site page with its generated reference expanded."""
    raw = doc.read_text()
    return docs_reference.expand(raw) if SITE in doc.parents else raw


def github_slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


@cache
def anchors(doc: Path) -> set[str]:
    """The anchors of a Markdown file's headings (a repeated one gets _1/-1, ...), outside code
    blocks: mkdocs' for a site page, GitHub's for the others."""
    on_site = SITE in doc.parents
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in text(doc).splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not re.match(r"#{1,6} ", line):
            continue
        heading = line.lstrip("#").strip()
        slug = slugify(heading.replace("`", ""), "-") if on_site else github_slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else (f"{slug}_{n}" if on_site else f"{slug}-{n}"))
    return out


def expand(name: str) -> list[str]:
    """Shell brace expansion, as the docs write a family of files: `a{,_b}.{json,md}`."""
    m = re.search(r"\{([^{}]*)\}", name)
    if not m:
        return [name]
    return [x for alt in m.group(1).split(",") for x in expand(name[:m.start()] + alt + name[m.end():])]


def cited_results(doc: Path, results: Path = RESULTS) -> list[str]:
    """Result files a document names: `results/...` in code spans (not one cited at a commit,
    `abc1234:benchmarks/results/...`, which git history holds), and links into `results`."""
    body = text(doc)
    names = [tok.rstrip(".,") for span in re.findall(r"`([^`]+)`", body)
             if not re.search(r"\b[0-9a-f]{7,40}:(benchmarks/)?results/", span)
             for tok in re.findall(r"results/([\w{},*.\-]+)", span)]
    for target in LINK.findall(body):
        path = target.partition("#")[0]
        if path and not re.match(r"[a-z]+:", path) and results in (doc.parent / path).resolve().parents:
            names.append((doc.parent / path).resolve().relative_to(results).as_posix())
    return [n for name in names for n in expand(name)]


def broken_links(docs: list[Path]) -> list[str]:
    broken = []
    for doc in docs:
        for target in LINK.findall(text(doc)):
            if re.match(r"[a-z]+:", target):  # http(s), mailto: not ours to check here
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                broken.append(f"{doc}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{doc}: {target} (no such heading)")
    return broken


def unlisted(index: Path, results: Path = RESULTS) -> list[str]:
    """Files in `results` the index does not name."""
    listed = set(cited_results(index, results))
    return sorted(p.name for p in results.iterdir() if p.name not in listed)


def uncommitted(docs: list[Path]) -> list[str]:
    return [f"{doc}: {name}" for doc in docs for name in cited_results(doc)
            if not list(RESULTS.glob(name)) and not list(RESULTS.glob(name + ".*"))]


def test_every_relative_link_and_anchor_resolves():
    broken = broken_links(DOCS)
    assert not broken, "\n".join(broken)


def test_every_cited_result_file_is_committed():
    cited = {doc.relative_to(ROOT).as_posix(): cited_results(doc) for doc in DOCS}
    # the parser sees them: the README's at-a-glance links, the performance page
    assert len(cited["README.md"]) >= 6 and len(cited["docs/performance.md"]) > 10
    missing = uncommitted(DOCS)
    assert not missing, "\n".join(missing)


def test_the_results_are_few_and_each_is_in_the_benchmarks_index():
    """`benchmarks/results/` keeps the current result of each question, and the index
    (question -> script -> result file) names every one of them."""
    files = list(RESULTS.iterdir())
    assert 0 < len(files) <= MOST_RESULT_FILES, len(files)
    assert not unlisted(INDEX), unlisted(INDEX)


def test_the_checks_catch_what_they_are_for(tmp_path):
    """A broken anchor into a site page (one of the generated reference's too), a missing file and
    an uncommitted result file are each reported."""
    doc = tmp_path / "doc.md"
    site = SITE.relative_to(ROOT)
    doc.write_text(f"[a]({ROOT / site / 'guides' / 'jobs.md'}#no-such-heading) "
                   f"[b]({ROOT / site / 'reference' / 'job-spec.md'}#decoding) "
                   f"[c]({ROOT / site / 'reference' / 'job-spec.md'}#nor-this) [d](missing.md) "
                   "`benchmarks/results/no_such_result.json`\n")
    broken = broken_links([doc])
    assert len(broken) == 3 and "no-such-heading" in broken[0] and "nor-this" in broken[1], broken
    assert "missing.md (no such file)" in broken[2]
    assert uncommitted([doc]) == [f"{doc}: no_such_result.json"]
    # a result file the index does not name is reported; one cited at a commit is not required
    results = tmp_path / "results"
    results.mkdir()
    for name in ("a.md", "a.json", "b.md"):
        (results / name).write_text("{}")
    index = tmp_path / "README.md"
    index.write_text("[`a.md`](results/a.md), [`.json`](results/a.json); "
                     "`git show bb9e6c2:benchmarks/results/old.md`\n")
    assert unlisted(index, results) == ["b.md"]
    assert uncommitted([index]) == []
