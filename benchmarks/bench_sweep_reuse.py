"""A sweep with workers kept loaded between its points against one that starts them per point.

Runs one sweep spec (default `jobs/sweep.yaml`: the tiny kit on a local Ray cluster, workers
1 and 2 x batch 1 and 8 x `ar`, `exact`, `pcg` at two thetas, 16 points) twice in this process,
with `sweep.reuse_workers: false` (every point starts and loads its own workers, as every sweep
did before) and `true` (the default), the order alternating between repetitions. It reports each
whole sweep's wall time, the workers started, every point's steady tokens/s both ways, and
which rows of which points came out with other codes the other way. Only in float64 must there
be none: a job composes its batches as shards arrive, and in float32 a row's codes can depend on
the rows beside it (README, Guarantees), so there a difference says nothing about kept workers.

    .venv/bin/python benchmarks/bench_sweep_reuse.py [--spec jobs/sweep.yaml] [--reps 1] [--dtype float64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_job_throughput import interpreter  # noqa: E402  (the Python that ran this, as a reader types it)

from machine import write_result_pair  # noqa: E402

MODES = {"fresh": False, "reuse": True}


def point_codes(root: Path) -> dict[str, list]:
    """Per point directory: its rows' (id, codes), sorted."""
    import pyarrow.parquet as pq

    out = {}
    for point in sorted((root / "points").iterdir()):
        rows = []
        for f in sorted((point / "data").glob("*.parquet")):
            rows += [(r["id"], r["codes"]) for r in pq.read_table(f, columns=["id", "codes"]).to_pylist()]
        out[point.name] = sorted(rows)
    return out


def run(spec, mode: str, work: Path) -> dict:
    from engine.runtime.sweep import run_sweep

    out = work / mode
    sweep = spec.sweep.model_copy(update={"reuse_workers": MODES[mode]})
    point_spec = spec.model_copy(update={"sweep": sweep, "output": spec.output.model_copy(update={"uri": str(out)})})
    start = time.perf_counter()
    doc = run_sweep(point_spec, progress=True)
    wall = time.perf_counter() - start
    return {"mode": mode, "wall_s": round(wall, 1),
            "workers_started": sum(r["workers"] - r["workers_reused"] for r in doc["runs"]),
            "workers_reused": sum(r["workers_reused"] for r in doc["runs"]),
            "tokens_per_s": {r["point"]: r["tokens_per_s"] for r in doc["runs"]},
            "codes": point_codes(out)}


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"Sweep with kept workers vs a fresh start per point: {m['cpu']}, {m['cpu_cores_visible']} cores, "
             f"torch {m['torch']}, {m['dtype_auto']}, {m['date']}; load average (1 min) "
             f"{result['load_average'][0]} at the start, {result['load_average'][1]} at the end.", "",
             f"Spec: `{result['spec']}` ({result['points']} points); `{result['how']}` ({result['seconds']} s).", "",
             "| repetition | mode | sweep wall s | workers started | workers reused |", "|---|---|---|---|---|"]
    for r in result["sweeps"]:
        lines.append(f"| {r['repetition']} | {r['mode']} | {r['wall_s']} | {r['workers_started']} | "
                     f"{r['workers_reused']} |")
    s = result["summary"]
    lines += ["", f"Median sweep wall time: fresh {s['wall_s']['fresh']} s, reuse {s['wall_s']['reuse']} s "
                  f"(reuse / fresh {s['wall_ratio_reuse_over_fresh']}).",
              f"Steady tokens/s per point, reuse / fresh (same repetition): median "
              f"{s['point_ratio']['median']}, range [{s['point_ratio']['min']}, {s['point_ratio']['max']}] "
              f"over {s['point_ratio']['points']} points.",
              f"Rows whose codes differ between the two ways: {s['rows_differing']} of {s['rows_compared']}"
              + (f" (points: {', '.join(f'{k} {v}' for k, v in s['differing_by_point'].items())})"
                 if s['differing_by_point'] else "") + f"; models.dtype {result['dtype']}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(ROOT / "jobs" / "sweep.yaml"))
    ap.add_argument("--reps", type=int, default=1, help="pairs of sweeps (order alternates)")
    ap.add_argument("--dtype", help="models.dtype for every point (default: the spec's)")
    ap.add_argument("--out", help="result-file stem (default: benchmarks/results/sweep_reuse_cpu_tiny[_DTYPE])")
    args = ap.parse_args()

    from engine.bench.machine import describe
    from engine.config import JobSpec
    from engine.kit import build_kit
    from engine.runtime.sweep import points

    spec = JobSpec.load(args.spec)
    if args.dtype:
        spec = spec.model_copy(update={"models": spec.models.model_copy(update={"dtype": args.dtype})})
    kit = Path(spec.models.target).parent
    if spec.models.target.endswith("kit/target") and not (kit / "kit.json").exists():
        build_kit(kit)
    load_start = round(os.getloadavg()[0], 2)
    t0 = time.perf_counter()
    sweeps = []
    with tempfile.TemporaryDirectory(prefix="bench-sweep-reuse-") as tmp:
        os.environ["PCG_SYNTH_CACHE"] = str(Path(tmp) / "cache")
        for rep in range(args.reps):
            order = ["fresh", "reuse"] if rep % 2 == 0 else ["reuse", "fresh"]
            for mode in order:
                sweeps.append({"repetition": rep, **run(spec, mode, Path(tmp) / f"r{rep}")})
    ratios, compared, differing = [], 0, {}
    for rep in range(args.reps):
        fresh, reuse = (next(s for s in sweeps if s["repetition"] == rep and s["mode"] == m) for m in MODES)
        for point, rows in fresh["codes"].items():
            other = dict(reuse["codes"].get(point, []))
            compared += len(rows)
            changed = sum(other.get(row_id) != codes for row_id, codes in rows)
            if changed:
                differing[f"{point} (r{rep})"] = changed
        ratios += [reuse["tokens_per_s"][p] / fresh["tokens_per_s"][p] for p in fresh["tokens_per_s"]
                   if fresh["tokens_per_s"][p] and reuse["tokens_per_s"][p]]
    for s in sweeps:
        del s["codes"]
    walls = {m: statistics.median(s["wall_s"] for s in sweeps if s["mode"] == m) for m in MODES}
    result = {
        "benchmark": "sweep_reuse", "machine": describe("cpu"), "spec": os.path.relpath(args.spec, ROOT),
        "points": len(points(spec)),
        "how": " ".join([interpreter(), "benchmarks/bench_sweep_reuse.py", *sys.argv[1:]]),
        "seconds": round(time.perf_counter() - t0, 1),
        "load_average": [load_start, round(os.getloadavg()[0], 2)],
        "summary": {"wall_s": walls, "wall_ratio_reuse_over_fresh": round(walls["reuse"] / walls["fresh"], 3),
                    "point_ratio": {"median": round(statistics.median(ratios), 3), "min": round(min(ratios), 3),
                                    "max": round(max(ratios), 3), "points": len(ratios)},
                    "rows_compared": compared, "rows_differing": sum(differing.values()),
                    "differing_by_point": differing},
        "dtype": spec.models.dtype, "sweeps": sweeps,
    }
    stem = "sweep_reuse_cpu_tiny" + (f"_{args.dtype}" if args.dtype else "")
    out = Path(args.out or ROOT / "benchmarks" / "results" / stem)
    write_result_pair(out, result, markdown(result))


if __name__ == "__main__":
    main()
