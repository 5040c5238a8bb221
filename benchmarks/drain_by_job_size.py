"""How full a batch a job of N rows can keep when nothing tells a row's length in advance.

Reads the decode rounds each row took in a committed job-throughput result file (a run of
decoding alone, whose arrival order reproduces its measured utilisation), then builds jobs of N
rows by drawing rows from those (with replacement, seeded) and admits each in a random order to
one continuously batched decoder of `--batch` slots (`bench_job_throughput.utilisation`). With
the tiny kit's end of speech a random per-step event, a row's text says nothing of its length, so
any admission order is as good as a random one: the spread over samples is what a job of that
size gets, and the share at or above `--goal` is how often it meets the slot-utilisation goal.

    python benchmarks/drain_by_job_size.py \
        --source benchmarks/results/job_throughput_cpu_tiny_xeon_dec02_malloc.json --workload augment \
        --out benchmarks/results/drain_by_job_size_cpu_tiny_augment
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_job_throughput import utilisation  # noqa: E402


def job_sizes(rounds: list[int], batch: int, sizes: list[int], samples: int, goal: float, seed: int) -> list[dict]:
    """Per job size: median and 5-95 % slot utilisation of `samples` jobs drawn from `rounds`, and
    the share of them at or above `goal`."""
    gen = random.Random(seed)
    out = []
    for n in sizes:
        u = sorted(utilisation([gen.choice(rounds) for _ in range(n)], batch) for _ in range(samples))
        out.append({"rows": n, "rows_per_slot": round(n / batch, 2), "median": round(u[samples // 2], 4),
                    "p05": round(u[samples // 20], 4), "p95": round(u[-(samples // 20)], 4),
                    "share_at_goal": round(sum(x >= goal for x in u) / samples, 4)})
    return out


def markdown(doc: dict) -> str:
    lines = [f"# Slot utilisation by job size, lengths unknown in advance ({doc['workload']})", "",
             f"Source: `{doc['source']}`, workload `{doc['workload']}`, run `{doc['run']}` (its machine: "
             f"{doc['source_machine']}); {len(doc['rounds_per_row'])} rows, decode rounds per row "
             f"{min(doc['rounds_per_row'])}-{max(doc['rounds_per_row'])}; measured utilisation of that run "
             f"{doc['measured_utilisation']} (its admission order replayed: {doc['replayed_utilisation']}).",
             f"Jobs of N rows drawn from those rows with replacement, each admitted in a random order to one "
             f"decoder of {doc['batch']} slots; {doc['samples']} jobs per size, seed {doc['seed']} (a seeded "
             f"simulation on the measured rounds: it gives the same table on any machine).", "",
             f"How: `{doc['how']}`", "",
             f"| rows | rows per slot | median | 5-95 % | share of jobs >= {doc['goal']} |", "|---|---|---|---|---|"]
    lines += [f"| {s['rows']} | {s['rows_per_slot']} | {s['median']} | {s['p05']}-{s['p95']} | {s['share_at_goal']} |"
              for s in doc["sizes"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", required=True, help="a bench_job_throughput result JSON")
    ap.add_argument("--workload", default="augment")
    ap.add_argument("--run", default="alone_arrival", help="which runs' rounds_per_row (the first repetition)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--sizes", default="40,48,60,80,120,240,960")
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--goal", type=float, default=0.85)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="path without extension: writes .json and .md")
    args = ap.parse_args()
    source = json.loads(Path(args.source).read_text())
    run = source["workloads"][args.workload]["runs"][args.run][0]
    rounds = run["rounds_per_row"]
    doc = {"benchmark": "drain_by_job_size", "how": " ".join(["python", *sys.argv]),
           "source": args.source, "source_machine": source["machine"]["cpu"] + ", " + source["machine"]["date"],
           "workload": args.workload, "run": args.run, "batch": args.batch, "samples": args.samples,
           "goal": args.goal, "seed": args.seed, "rounds_per_row": rounds,
           "measured_utilisation": run["slot_utilisation"],
           "replayed_utilisation": round(utilisation(rounds, args.batch), 4),
           "sizes": job_sizes(rounds, args.batch, [int(s) for s in args.sizes.split(",")], args.samples, args.goal,
                              args.seed)}
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    text = markdown(doc)
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
