"""Result-file helpers for the scripts in benchmarks/ (the machine description is the engine's,
shared with `pcg-synth bench`)."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from engine.bench.machine import describe

__all__ = ["ROOT", "cpu_headline", "describe", "kit_headline", "median_in_turns", "write_or_print", "write_result",
           "write_result_pair"]

ROOT = Path(__file__).resolve().parents[1]


def write_result(doc: dict, out: str | None) -> None:
    """Write a result file (JSON) where asked."""
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"written to {out}")


def write_result_pair(stem: Path, doc: dict, markdown: str, quiet: bool = False) -> None:
    """Write `<stem>.json` and its readable table `<stem>.md`, and print the table (not `quiet`)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown)
    if quiet:
        return
    print(markdown)
    print(f"written: {stem}.json, {stem}.md")


def write_or_print(out: str | None, doc: dict, markdown: str) -> None:
    """`write_result_pair` to the stem `out` where given, else print the table."""
    if out:
        write_result_pair(Path(out), doc, markdown)
    else:
        print(markdown)


def cpu_headline(title: str, machine: dict, threads: int, load: tuple) -> str:
    """A CPU result table's heading: `title`, then the machine, threads, torch, date and the load
    average at the start and the end (`load`)."""
    return (f"# {title} ({machine['cpu']}, {machine['cpu_cores_visible']} cores, {threads} threads; torch "
            f"{machine['torch']}, {machine['date']}; load average {load[0]} at the start, {load[1]} at the end)")


def kit_headline(title: str, doc: dict, extra: str = "") -> str:
    """A result table's first line: `title`, then the machine, threads, torch, dtype (`extra`
    after it), the date and the load average at the start and the end (`doc` as the kit's CPU
    benchmarks write it)."""
    m, load = doc["machine"], doc["load_average"]
    return (f"{title}: {m['cpu']}, {m['cpu_cores_visible']} cores, {doc['threads']} threads, torch {m['torch']}, "
            f"{doc['dtype']}{extra}, {m['date']}; load average (1 min) {load['start']} at the start, "
            f"{load['end']} at the end.")


def how_line(argv: list[str]) -> str:
    """The command that made a result, its --note/--notes left out (they are in the notes)."""
    words, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word in ("--note", "--notes"):
            skip = True
        elif not word.startswith(("--note=", "--notes=")):
            words.append(word)
    return ("" if words[0].startswith("python") else "python ") + " ".join(words)


def median_in_turns(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median seconds of each callable, the callables called in turns, `reps` times each."""
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}
