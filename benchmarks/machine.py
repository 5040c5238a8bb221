"""Result-file helpers for the scripts in benchmarks/ (the machine description is the engine's,
shared with `pcg-synth bench`)."""

from __future__ import annotations

import json
from pathlib import Path

from engine.bench.machine import describe

__all__ = ["describe", "write_result", "write_result_pair"]


def write_result(doc: dict, out: str | None) -> None:
    """Write a result file (JSON) where asked."""
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"written to {out}")


def write_result_pair(stem: Path, doc: dict, markdown: str) -> None:
    """Write `<stem>.json` and its readable table `<stem>.md`, and print the table."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown)
    print(markdown)
    print(f"written: {stem}.json, {stem}.md")
