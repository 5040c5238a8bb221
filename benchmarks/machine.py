"""Result-file helpers for the scripts in benchmarks/ (the machine description is the engine's,
shared with `pcg-synth bench`), and the start that the tiny kit's CPU benchmarks share."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from engine.bench.machine import describe

__all__ = ["describe", "kit_arguments", "kit_headline", "start_on_kit", "write_result", "write_result_pair"]

ROOT = Path(__file__).resolve().parents[1]


def kit_arguments(ap: argparse.ArgumentParser, reps: int) -> None:
    """`--kit`, `--threads` (torch's, default: up to 2) and `--reps`."""
    ap.add_argument("--kit", default=str(ROOT / "kit"))
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--reps", type=int, default=reps)


def start_on_kit(args) -> tuple[Path, float, float]:
    """Set torch's threads to `args.threads` and build the kit at `args.kit` where it is missing;
    returns (kit, start time, load average over the last minute), for the result file."""
    import torch

    from engine.kit import build_kit

    torch.set_num_threads(args.threads)
    kit = Path(args.kit)
    if not (kit / "kit.json").exists():
        build_kit(kit)
    return kit, time.perf_counter(), round(os.getloadavg()[0], 2)


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


def kit_headline(title: str, doc: dict, extra: str = "") -> str:
    """A result table's first line: `title`, then the machine, threads, torch, dtype (`extra`
    after it), the date and the load average at the start and the end (`doc` as the kit's CPU
    benchmarks write it)."""
    m, load = doc["machine"], doc["load_average"]
    return (f"{title}: {m['cpu']}, {m['cpu_cores_visible']} cores, {doc['threads']} threads, torch {m['torch']}, "
            f"{doc['dtype']}{extra}, {m['date']}; load average (1 min) {load['start']} at the start, "
            f"{load['end']} at the end.")
