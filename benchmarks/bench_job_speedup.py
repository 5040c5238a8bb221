"""A synthesis job against plain AR: the same rows through whole jobs with `ar`, `exact` and `pcg`.

`pcg-synth bench` measures decoding; this measures what a user's job gets: each point is a real
job (`kind: sweep`, `engine/runtime/sweep.py`) on a local Ray cluster, its worker loaded (or
kept loaded from the previous point: `sweep.reuse_workers`) and warmed up before the clock
starts, then the job's manifest decoded, codec-decoded, encoded as
FLAC and written as Parquet shards, its `steady.tokens_per_s` taken from the first shard handed
out to the last one committed. Methods and batch sizes run as one grid, repetitions interleaved
(every second one in reverse order), and each run is compared with the `ar` run of its own
repetition at the same batch size (`speedup_vs_ar`), so a machine that drifts between runs
touches the ratios little.

Models: by default the target and distilled draft `benchmarks/llasa_1b_shape.sh` leaves in its
work directory (Llasa-1B's shape, random weights; on a CPU with VNNI or AMX int8 instructions the
draft's weights in int8, as that script's bench uses them), the tiny kit's codec. Rows: the
quickstart texts, cycled, every row `max_new_tokens` long in practice (the random-weight target
rarely ends a row early).

    bash benchmarks/llasa_1b_shape.sh          # once: the target and its distilled draft (~45 min on 2 cores)
    .venv/bin/python benchmarks/bench_job_speedup.py [--reps 2] [--batch-sizes 1,2,4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "work" / "llasa-1b-shape"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_job_throughput import interpreter  # noqa: E402  (the Python that ran this, as a reader types it)

from engine.models.quant import cpu_vnni  # noqa: E402

from machine import write_result_pair  # noqa: E402


def manifest(path: Path, rows: int) -> Path:
    texts = (ROOT / "jobs" / "quickstart-texts.txt").read_text().splitlines()
    with path.open("w") as f:
        for i in range(rows):
            f.write(json.dumps({"id": f"row-{i:03d}", "text": texts[i % len(texts)]}) + "\n")
    return path


def job_spec(args, kit: Path, work: Path):
    from engine.config import JobSpec

    return JobSpec.model_validate({
        "name": "job-speedup",
        "kind": "sweep",
        "models": {"target": args.target, "draft": args.draft, "codec": str(kit / "codec"),
                   "draft_weights": args.draft_weights},
        "decoding": {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "seed": 0},
        "text": {"split": "none"},  # max_new_tokens cuts rows short: no text is cut into chunks instead
        "sweep": {"workers": [1], "batch_sizes": args.batch_sizes, "methods": args.methods,
                  "gammas": [args.gamma], "thetas": [args.theta], "repetitions": args.reps},
        "input": {"manifests": [str(manifest(work / "rows.jsonl", args.rows))]},
        "output": {"uri": str(work / "out"), "audio_format": "flac"},
        "resources": {"workers": 1, "cpus_per_worker": args.threads,  # batch size: each point's
                      "rows_per_shard": args.rows_per_shard, "device": args.device,
                      "gpus_per_worker": 1 if args.device.startswith("cuda") else 0},
    })


def summarise(runs: list[dict]) -> list[dict]:
    """Per point (batch size, method): medians over repetitions, and the spread of the ratio."""
    points: dict[str, list[dict]] = {}
    for r in runs:
        points.setdefault(r["point"], []).append(r)
    out = []
    for point, reps in points.items():
        speedups = [r["speedup_vs_ar"] for r in reps if r["speedup_vs_ar"] is not None]
        out.append({
            "point": point, "batch_size": reps[0]["batch_size"], "method": reps[0]["method"],
            "gamma": reps[0]["gamma"], "theta": reps[0]["theta"], "repetitions": len(reps),
            "tokens_per_s": round(statistics.median(r["tokens_per_s"] or 0.0 for r in reps), 2),
            "speedup_vs_ar": round(statistics.median(speedups), 3) if speedups else None,
            "speedup_min": min(speedups, default=None), "speedup_max": max(speedups, default=None),
            "mean_accepted_length": round(statistics.median(r["mean_accepted_length"] for r in reps), 3),
            "slot_utilisation": round(statistics.median(r["slot_utilisation"] or 0.0 for r in reps), 3),
            "generated_tokens": reps[0]["generated_tokens"], "rows": reps[0]["rows"],
        })
    return out


def markdown(doc: dict) -> str:
    m, a = doc["machine"], doc["settings"]
    lines = [
        f"Synthesis jobs against plain AR: {m['cpu'] if m['device'] == 'cpu' else m.get('gpu')}, "
        f"{m['cpu_cores_visible']} cores, {a['threads']} threads per worker, torch {m['torch']}, "
        f"{m['date']}; load average (1 min) {doc['load_average'][0]} at the start, "
        f"{doc['load_average'][1]} at the end. Target `{a['target']}`, draft `{a['draft']}` "
        f"(weights {a['draft_weights']}), dtype auto ({m['dtype_auto']}).",
        "",
        "| batch | method | job steady tokens/s | vs `ar` job [min, max] | mean accepted length | slot utilisation |",
        "|---|---|---|---|---|---|",
    ]
    for p in doc["points"]:
        label = p["method"] + (f" (gamma {p['gamma']}" + (f", theta {p['theta']}" if p["theta"] else "") + ")"
                               if p["gamma"] else "")
        if p["method"] == "ar" or p["speedup_vs_ar"] is None:
            ratio = "1" if p["method"] == "ar" else "-"
        else:
            ratio = f"**{p['speedup_vs_ar']:.2f}x** [{p['speedup_min']:.2f}, {p['speedup_max']:.2f}]"
        lines.append(f"| {p['batch_size']} | {label} | {p['tokens_per_s']} | {ratio} | "
                     f"{p['mean_accepted_length']} | {p['slot_utilisation']} |")
    lines += [
        "",
        f"Each row: the median of {a['reps']} repetitions; a ratio compares a run with the `ar` run of its own "
        f"repetition at the same batch size (runs interleaved, every second repetition in reverse order). "
        f"Jobs: {a['rows']} manifest rows (the quickstart texts, cycled), {a['rows_per_shard']} rows per shard, "
        f"one worker on a local Ray cluster, max_new_tokens {a['max_new_tokens']}, temperature "
        f"{a['temperature']}, FLAC into Parquet; the tiny kit's codec; steady tokens/s from the first shard "
        f"handed out to the last committed (model loading and warm-up excluded).",
        "",
        f"How: `{doc['how']}` ({doc['seconds']:.0f} s).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(WORK / "target"))
    ap.add_argument("--draft", default=str(WORK / "draft-kd"))
    ap.add_argument("--kit", default=str(ROOT / "kit"), help="the tiny kit, for its codec (built if missing)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--draft-weights", help="native or int8 (default: int8 on a CPU with VNNI/AMX int8, else native)")
    ap.add_argument("--batch-sizes", default="1,2,4")
    ap.add_argument("--methods", default="ar,exact,pcg")
    ap.add_argument("--gamma", default="3", help="draft length (or auto)")
    ap.add_argument("--theta", type=float, default=0.5, help="PCG's threshold")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--rows-per-shard", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="CPUs (torch threads) per worker")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", help="result-file stem (default: benchmarks/results/"
                                  "job_speedup_<device>_<the target's directory>)")
    args = ap.parse_args()
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    args.methods = args.methods.split(",")
    args.gamma = args.gamma if args.gamma == "auto" else int(args.gamma)
    args.draft_weights = args.draft_weights or ("int8" if args.device == "cpu" and cpu_vnni() else "native")
    for name in ("target", "draft"):
        if not (Path(getattr(args, name)) / "config.json").is_file():
            sys.exit(f"no checkpoint at --{name} {getattr(args, name)}: run `bash benchmarks/llasa_1b_shape.sh` "
                     "first, or name one")

    from engine.bench.machine import describe
    from engine.kit import build_kit
    from engine.runtime.sweep import run_sweep

    kit = Path(args.kit)
    if not (kit / "kit.json").exists():
        build_kit(kit)
    target = Path(args.target).resolve()
    label = (target.parent.name if target.name == "target" else target.name).replace("-", "_")
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"job_speedup_{args.device.split(':')[0]}_{label}")
    load_start = round(os.getloadavg()[0], 2)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-job-speedup-") as tmp:
        work = Path(tmp)
        os.environ["PCG_SYNTH_CACHE"] = str(work / "cache")
        doc = run_sweep(job_spec(args, kit, work), progress=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("kit", "out")}
    result = {
        "benchmark": "job_speedup", "machine": describe(args.device), "settings": settings,
        "how": " ".join([interpreter(), "benchmarks/bench_job_speedup.py", *sys.argv[1:]]),
        "seconds": round(time.perf_counter() - t0, 1),
        "load_average": [load_start, round(os.getloadavg()[0], 2)],
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),  # as found (None: OpenMP's default)
        "points": summarise(doc["runs"]),
        "runs": doc["runs"],
    }
    write_result_pair(out, result, markdown(result))


if __name__ == "__main__":
    main()
