"""Where the test suite's time goes: wall time and machine-wide CPU time per test.

As a pytest plugin it records, for every test (setup, call and teardown together), the wall
seconds and the busy CPU seconds of the whole machine over the same interval (from
/proc/stat, so Ray workers, subprocesses and helper processes count): a test whose CPU seconds
are far below 2x its wall seconds on a 2-core machine leaves cores idle (waits by design,
single-threaded subprocess chains); one near 2x is CPU-bound.

    PYTHONPATH=benchmarks SUITE_CPU_OUT=out/suite_cpu.jsonl \\
        .venv/bin/python -m pytest -q -p suite_cpu_share tests
    .venv/bin/python benchmarks/suite_cpu_share.py out/suite_cpu.jsonl RESULT.md "how and where"

Linux only (reads /proc/stat); nothing else on the machine should run meanwhile.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time

import pytest

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def busy_cpu_s() -> float:
    """Busy CPU seconds of the whole machine since boot (all but idle and iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / TICKS


_out = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _out
    if _out is None:
        _out = open(os.environ.get("SUITE_CPU_OUT", "suite_cpu.jsonl"), "w")
    cpu, wall = busy_cpu_s(), time.perf_counter()
    yield
    record = {"id": item.nodeid, "wall": round(time.perf_counter() - wall, 2),
              "cpu": round(busy_cpu_s() - cpu, 2)}
    _out.write(json.dumps(record) + "\n")
    _out.flush()


def summarize(path: str, cores: int = 2, top: int = 15) -> str:
    rows = [json.loads(line) for line in open(path)]
    wall, cpu = sum(r["wall"] for r in rows), sum(r["cpu"] for r in rows)
    files = collections.defaultdict(lambda: [0.0, 0.0])
    for r in rows:
        files[r["id"].split("::")[0]][0] += r["wall"]
        files[r["id"].split("::")[0]][1] += r["cpu"]
    lines = [f"{len(rows)} tests, {wall / 60:.1f} minutes of wall time inside tests, {cpu / 60:.1f} "
             f"CPU-minutes: the {cores} cores busy {cpu / (cores * wall):.2f} of the time.", "",
             "| file | wall s | CPU s | idle core-s |", "|---|---|---|---|"]
    for name, (w, c) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"| {name} | {w:.1f} | {c:.1f} | {cores * w - c:.1f} |")
    lines += ["", "Tests that leave the most core-seconds idle:", "",
              "| test | wall s | CPU s | idle core-s |", "|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: -(cores * r["wall"] - r["cpu"]))[:top]:
        lines.append(f"| {r['id']} | {r['wall']:.1f} | {r['cpu']:.1f} | {cores * r['wall'] - r['cpu']:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: suite_cpu_share.py RECORDS.jsonl OUT.md 'how and where it was measured'")
    body = summarize(sys.argv[1])
    with open(sys.argv[2], "w") as f:
        f.write(f"Test suite: wall and CPU time per test. {sys.argv[3]}\n\n{body}")
