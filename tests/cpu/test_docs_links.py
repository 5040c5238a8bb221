"""The documentation's references hold: every relative link (and its #anchor) in README.md, docs/
and cluster/README.md leads somewhere, and every benchmark result file they cite is committed."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "cluster" / "README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@cache
def anchors(doc: Path) -> set[str]:
    """The anchors GitHub makes of a Markdown file's headings (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in doc.read_text().splitlines():
        if not re.match(r"#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def expand(name: str) -> list[str]:
    """Shell brace expansion, as the docs write a family of files: `a{,_b}.{json,md}`."""
    m = re.search(r"\{([^{}]*)\}", name)
    if not m:
        return [name]
    return [x for alt in m.group(1).split(",") for x in expand(name[:m.start()] + alt + name[m.end():])]


def cited_results(doc: Path) -> list[str]:
    """Result files a document names: `results/...` in code spans, and in the README the at-a-glance
    table's last column."""
    text = doc.read_text()
    names = [tok.rstrip(".,") for span in re.findall(r"`([^`]+)`", text)
             for tok in re.findall(r"results/([\w{},*.\-]+)", span)]
    if doc.name == "README.md" and doc.parent == ROOT:
        bench = text[text.index("\n## Benchmarks\n"):text.index("\n## Setup\n")]
        for row in re.findall(r"^\|.*\|$", bench, re.M):
            names += [s for s in re.findall(r"`([^`]+)`", row.rsplit("|", 2)[1]) if re.search(r"\.(md|json)$", s)]
    return [n for name in names for n in expand(name)]


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target):  # http(s), mailto: not ours to check here
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_cited_result_file_is_committed():
    cited = {doc.relative_to(ROOT).as_posix(): cited_results(doc) for doc in DOCS}
    assert len(cited["README.md"]) > 20 and len(cited["docs/benchmarks.md"]) > 100  # the parser sees them
    missing = [f"{doc}: {name}" for doc, names in cited.items() for name in names
               if not list(RESULTS.glob(name)) and not list(RESULTS.glob(name + ".*"))]
    assert not missing, "\n".join(missing)
