"""How long `pcg-synth run JOB.yaml --dry-run` takes, and the memory it holds, as a job's
manifests grow: each reading is a fresh process running the CLI's `main` (what the `pcg-synth`
script runs), timed from outside, its peak resident memory from the OS. The manifests are JSONL
files of made-up rows (a per-row temperature on every fourth, a duplicate id and an empty text
per 10,000 rows), split into files of at most 100,000 rows as a large job's manifests would be;
the models are the tiny kit's (a dry run reads only their config.json).

    python benchmarks/bench_dry_run.py --kit kit --rows 11,100000,1000000 \\
        --out benchmarks/results/dry_run_cpu_avx2.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PER_FILE = 100_000
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]


def write_manifests(folder: Path, rows: int) -> None:
    folder.mkdir(parents=True)
    for first in range(0, rows, PER_FILE):
        with open(folder / f"part-{first // PER_FILE:04d}.jsonl", "w") as f:
            for i in range(first, min(rows, first + PER_FILE)):
                row = {"id": f"u{i:08d}", "text": " ".join(WORDS[(i + k) % 10] for k in range(4 + i % 12)) + "."}
                if i % 4 == 3:
                    row["temperature"] = 0.6
                if i % 10_000 == 9_998:
                    row["id"] = f"u{i - 1:08d}"  # a duplicate
                if i % 10_000 == 9_999:
                    row["text"] = ""
                f.write(json.dumps(row) + "\n")


def one_run(spec: Path) -> dict:
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from engine.cli import main; sys.exit(main())",
                             "run", str(spec), "--dry-run", "--quiet"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err = proc.stdout.read(), proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak resident memory
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"dry run failed: {err[-2000:]}")
    return {"seconds": round(seconds, 3), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "report": json.loads(out)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kit", default="kit")
    ap.add_argument("--rows", default="11,100000,1000000")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    kit = Path(args.kit).resolve()
    sizes = [int(x) for x in args.rows.split(",")]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for rows in sizes:
            folder = Path(tmp) / f"m{rows}"
            write_manifests(folder, rows)
            spec = Path(tmp) / f"job{rows}.yaml"
            spec.write_text(json.dumps({
                "name": f"dry{rows}", "models": {"target": str(kit / "target"), "draft": str(kit / "draft"),
                                                 "codec": str(kit / "codec")},
                "input": {"manifests": [str(folder)]}, "output": {"uri": str(Path(tmp) / f"out{rows}")},
                "resources": {"rows_per_shard": 256}}))
            readings = [one_run(spec) for _ in range(args.reps)]
            report = readings[0]["report"]
            seconds = [r["seconds"] for r in readings]
            runs.append({"rows": rows, "files": len(report["manifests"]), "seconds": seconds,
                         "median_s": statistics.median(seconds),
                         "rows_per_s": round(rows / statistics.median(seconds)),
                         "peak_rss_mib": max(r["peak_rss_mib"] for r in readings),
                         "rows_failing": report["rows_failing"], "shards": report["shards"],
                         "warnings": report["warnings"]})
            print(json.dumps(runs[-1]), flush=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from machine import describe, write_result  # torch: imported after the runs, so that the forked
    # children (their peak memory counts what they inherit before exec) start small

    doc = {"benchmark": "dry_run", "machine": describe(), "command": " ".join(sys.argv),
           "how": __doc__.strip(), "runs": runs}
    write_result(doc, args.out)


if __name__ == "__main__":
    main()
