"""Throughput experiments: every point of the `sweep` grid is a measured synthesis run.

A point fixes workers, batch size, method, gamma, theta and a target/draft pair, and runs the
job's manifests through the normal pipeline into `<output>/points/<point>/`, with workers warmed
up and started together; its throughput is measured from the first shard handed out to the last
committed (model loading excluded). Workers stay loaded from one point to the next of the same
pair (`sweep.reuse_workers`): a point takes them with its own settings and warms them up again.
Results: `<output>/sweep.parquet` (one row per run), `sweep.json`, and plots in
`<output>/plots/`. Completed points are skipped on a rerun.
"""

from __future__ import annotations

import io
import json
import statistics
from collections import defaultdict

import pyarrow as pa
import pyarrow.parquet as pq

from engine.config import JobSpec
from engine.io.lease import FencedStorage, OutputLease
from engine.io.storage import Storage, join
from engine.runtime.actors import worker_options
from engine.runtime.family import with_family
from engine.runtime.job import JobRunner
from engine.runtime.pool import IdleWorkers
from engine.runtime.preflight import preflight
from engine.runtime.sweep_grid import point_id, point_spec, points, run_uri, schedule


def result_row(p: dict, rep: int, summary: dict) -> dict:
    steady = summary["steady"]
    return {"point": point_id(p), "repetition": rep, "pair": p["pair"].name, "workers": p["workers"],
            "batch_size": p["batch_size"], "method": p["method"],
            "gamma": None if p["gamma"] is None else str(p["gamma"]), "theta": p["theta"],
            "rows": summary["rows"], "rows_failed": summary["rows_failed"],
            # rows whose speech reached its token limit (a summary written before this was counted: None)
            "rows_cut": summary.get("rows_cut"), "generated_tokens": summary["generated_tokens"],
            "audio_seconds": summary["audio_seconds"], "steady_s": steady["wall_s"],
            "tokens_per_s": steady["tokens_per_s"], "audio_s_per_s": steady["audio_s_per_s"],
            "mean_accepted_length": summary["mean_accepted_length"],
            "acceptance_per_position": summary["acceptance_per_position"],
            "slot_utilisation": summary["utilisation"]["slot_utilisation"],
            "worker_busy_fraction": summary["utilisation"]["worker_busy_fraction"],
            "workers_reused": summary["shards"].get("workers_reused", 0),
            "gamma_auto": json.dumps(summary["gamma_auto"]) if summary["gamma_auto"] else None}


def add_scaling(rows: list[dict]) -> None:
    """Scaling efficiency: throughput over `workers / w0` times the median throughput at the
    fewest workers `w0` of the same configuration (1.0 = linear scaling)."""
    same: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        same[(r["pair"], r["batch_size"], r["method"], r["gamma"], r["theta"])].append(r)
    for group in same.values():
        w0 = min(r["workers"] for r in group)
        base = statistics.median([r["tokens_per_s"] or 0.0 for r in group if r["workers"] == w0])
        for r in group:
            ref = base * r["workers"] / w0
            r["scaling_efficiency"] = round((r["tokens_per_s"] or 0.0) / ref, 4) if ref else None


def add_speedup(rows: list[dict]) -> None:
    """Speedup over `ar`: a run's tokens/s over that of the `ar` run of the same repetition,
    pair, worker count and batch size (None where the grid has no such `ar` run)."""
    ar = {(r["repetition"], r["pair"], r["workers"], r["batch_size"]): r["tokens_per_s"]
          for r in rows if r["method"] == "ar"}
    for r in rows:
        base = ar.get((r["repetition"], r["pair"], r["workers"], r["batch_size"]))
        r["speedup_vs_ar"] = round((r["tokens_per_s"] or 0.0) / base, 4) if base else None


def run_sweep(spec: JobSpec, address: str | None = None, progress: bool = True, wait: bool = False) -> dict:
    """Run (or resume) every point, holding the sweep output's lease (each point's job holds its
    own too); returns the sweep document (also written as sweep.json).

    Args:
        wait: if another driver holds the sweep's output, wait for it instead of refusing.

    Raises:
        ValueError: a model (a pair's included) missing, of no known family or with a context
            below `decoding.max_new_tokens`, or the output not writable, before any point runs;
            LeaseHeld: another driver runs this sweep (and `wait` is off).
    """
    storage = Storage(spec.storage)
    made = storage.absent_folders(spec.output.uri)  # local folders the writability probe creates
    try:
        preflight(spec, storage)
        for target in dict.fromkeys(p["pair"].target for p in points(spec)):  # what each point's job checks first
            with_family(spec.model_copy(update={"models": spec.models.model_copy(update={"target": target})}), storage)
    except ValueError:
        for folder in made:  # refused before any work: no output folder left behind
            storage.remove_empty_folders(folder)
        raise
    with OutputLease(storage, spec.output.uri, spec.output.lease_stale_s, job=spec.name, wait=wait) as lease:
        return run_points(spec, FencedStorage(storage, lease.fence), address, progress)  # its writes fenced


def run_points(spec: JobSpec, storage: Storage, address: str | None, progress: bool) -> dict:
    """The body of `run_sweep`: every point not done yet run, the sweep's table and plots written."""
    root = spec.output.uri
    grid = points(spec)
    runs = schedule(grid, spec.sweep.repetitions)
    specs = {(rep, point_id(p)): point_spec(spec, p, run_uri(root, p, rep)) for rep, p in runs}
    concurrency = max(worker_options(s)["max_concurrency"] for s in specs.values())
    idle = IdleWorkers(concurrency) if spec.sweep.reuse_workers else None
    rows = []
    try:
        for n, (rep, p) in enumerate(runs, 1):
            point = specs[(rep, point_id(p))]
            done = join(point.output.uri, "summary.json")
            if storage.exists(done):
                summary = json.loads(storage.read_bytes(done))
            else:
                if progress:
                    print(f"[{n}/{len(runs)}] {point_id(p)} repetition {rep}", flush=True)
                summary = JobRunner(point, address, progress=False, warmup=True, idle=idle).run()
            rows.append(result_row(p, rep, summary))
    finally:
        if idle is not None:
            idle.close()
    position = {point_id(p): i for i, p in enumerate(grid)}
    rows.sort(key=lambda r: (position[r["point"]], r["repetition"]))  # grid order, as before
    add_scaling(rows)
    add_speedup(rows)
    table = pa.Table.from_pylist(rows)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    storage.write_bytes(join(root, "sweep.parquet"), buffer.getvalue())
    doc = {"job": spec.name, "output": root, "grid": spec.sweep.model_dump(mode="json"),
           "decoding": spec.decoding.model_dump(mode="json"), "runs": rows}
    from engine.runtime.sweep_plots import plot_sweep

    doc["plots"] = plot_sweep(rows, storage, join(root, "plots"))
    storage.write_bytes(join(root, "sweep.json"), json.dumps(doc, indent=1).encode())
    if progress:
        print(sweep_table(rows))
    return doc


def sweep_table(rows: list[dict]) -> str:
    head = (f"{'point':42s} {'tok/s':>9s} {'vs ar':>6s} {'scaling':>8s} {'acc.len':>7s} {'slots':>6s} "
            f"{'cut':>5s} {'failed':>6s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        speedup = "-" if r["speedup_vs_ar"] is None else f"{r['speedup_vs_ar']:.2f}x"
        lines.append(f"{r['point'] + '-r' + str(r['repetition']):42s} {r['tokens_per_s'] or 0:9.1f} "
                     f"{speedup:>6s} {r['scaling_efficiency'] or 0:8.2f} {r['mean_accepted_length']:7.2f} "
                     f"{r['slot_utilisation'] or 0:6.2f} {'-' if r['rows_cut'] is None else r['rows_cut']:>5} "
                     f"{r['rows_failed']:>6d}")
    if any(r["rows_cut"] for r in rows):
        lines.append("cut: rows whose speech reached their token limit (max_new_tokens, or max_speech_ratio's "
                     "budget): their audio ends there; tokens/s counts them up to the limit")
    return "\n".join(lines)
