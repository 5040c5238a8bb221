"""What a job worker's own machinery costs its decode rounds, with no Ray anywhere.

A job's worker (`engine/runtime/worker.py`: `ShardProcessor`) decodes its shards' rows in one
continuously batched loop on its models' decode thread, while an IO thread beside it turns each
finished shard into audio, a Parquet file and a commit record, and the threads that hand it
shards wait. This script loads one set of models as a worker loads them (`WorkerModels`) in its
own process (no Ray in it, no cluster on the machine) and decodes the same rows, on that same
decode thread, in turns:
  * `alone`: a decode session over the rows at the job's batch size (what `pcg-synth generate`
    runs; bench_job_throughput.py's baseline);
  * `worker`: the job's `ShardProcessor` fed the job's shards by as many threads as the job's
    window, writing FLAC, Parquet and commits to local files;
  * `worker_no_export`: the same worker whose IO thread writes only a small commit record (no
    codec, no audio encoding, no Parquet): the stream's own cost apart from the export's;
  * `worker_switch` (with `--switch-interval S`): the worker with Python's thread switch interval
    (`sys.setswitchinterval`, 5 ms by default) at S during its run: how long a thread that wants
    the GIL waits before the holder is asked to drop it, which bounds how long the decode thread
    waits whenever the IO thread's Python code holds it.
All of them decode on one thread, so they share its OpenMP team (bench_job_throughput.py's
`--probe` row "job's worker, no Ray" decodes beside the OpenMP team of a main thread that
decoded alone, which a worker's process does not have). Each repetition runs decoding alone
before every worker run, the worker runs in an order that rotates between repetitions, and a
last alone run ends the series; each worker run's ratio is its tokens/s inside decode rounds
over the mean of the two alone runs around it. Every run reports its decode thread's CPU share of the rounds and
its context switches per round, and a worker run the CPU time its IO thread used (writing the
shards) per second of rounds.

    .venv/bin/python benchmarks/bench_worker_machinery.py --reps 4 \\
        --out benchmarks/results/worker_machinery_cpu_tiny_xeon
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_job_throughput as jt  # noqa: E402

from machine import describe, kit_arguments, kit_headline, start_on_kit, write_result_pair  # noqa: E402

MODES = ("alone", "worker", "worker_no_export", "worker_switch")
LABELS = {"alone": "decoding alone, on the worker's decode thread",
          "worker": "the job's worker (`ShardProcessor`: shards in, FLAC + Parquet + commits out)",
          "worker_no_export": "the same worker, its IO thread writing only a commit record",
          "worker_switch": "the worker with Python's switch interval at `--switch-interval`"}


def run_alone(models, spec, rows: list[dict]) -> dict:
    """Decoding alone (arrival order) on the models' decode thread."""
    r = models.decode_thread.run(lambda: jt.run_alone(models.synth, spec, rows, "arrival")).result()
    return {"tokens_per_s": r["tokens_per_s"], "generated_tokens": r["generated_tokens"],
            "rows": r["rows"], "seconds": r["seconds"], "slot_utilisation": r["slot_utilisation"],
            "cpu_share": r["cpu_share"], "waits_per_round": r["waits_per_round"],
            "preempted_per_round": r["preempted_per_round"], "io_cpu_per_s": 0.0}


def counted_worker(export: bool, spec, groups, models):
    """A `ShardProcessor` whose write stage counts its IO thread's CPU time (`io_cpu_s`); without
    `export`, one whose write stage writes a commit record only (no codec, audio, Parquet)."""
    from engine.records import aggregate
    from engine.runtime.threads import thread_clock
    from engine.runtime.worker import ShardProcessor

    worker = ShardProcessor(spec, groups, "in-process", models=models)
    write, worker.io_cpu_s = worker.stages.write, 0.0

    def counted(task, figures) -> dict:
        cpu = thread_clock()[0]
        try:
            if export:
                return write(task, figures)
            stats = aggregate([s for row in task.rows for s in row.work()])
            record = {"shard": task.shard.id, "rows": task.shard.rows,
                      "generated_tokens": stats.generated_tokens, "audio_seconds": 0.0,
                      "wall_s": round(time.perf_counter() - task.received, 4), **figures(), **worker.info()}
            worker.storage.write_bytes(worker.layout.commit(task.shard), json.dumps(record).encode())
            return record
        finally:
            worker.io_cpu_s += thread_clock()[0] - cpu
    worker.stages.write = counted
    return worker


def run_worker(models, spec, groups, out: str, export: bool, manifest: str) -> dict:
    """The job's shards through a fresh `ShardProcessor` on `models` (warmed up first, as a
    job's worker is), into `out`; figures of its decode rounds. `manifest`: the rows, planned
    into shards as the driver plans them (an augment job's: its variants file)."""
    from engine.config import InputSpec
    from engine.io.storage import Storage
    from engine.runtime.plan import make_plan
    from engine.runtime.summary import per_worker

    spec = spec.model_copy(update={"output": spec.output.model_copy(update={"uri": out}),
                                   "resources": spec.resources.model_copy(update={"admission": "arrival"})})
    planned = spec.model_copy(update={"input": InputSpec(manifests=[manifest])})
    shards = make_plan(planned, Storage(spec.storage)).shards
    worker = counted_worker(export, spec, groups, models)
    try:
        worker.warmup()
        worker.io_cpu_s, start = 0.0, time.perf_counter()  # the warm-up's export not counted
        with ThreadPoolExecutor(max_workers=spec.resources.window) as pool:
            records = list(pool.map(worker.process, shards))
        wall = time.perf_counter() - start
    finally:
        worker.stream.close()  # the decode loop and IO thread; the models' decode thread stays
    w = per_worker(records)["in-process"]
    d = jt.decode_figures([w])
    return {"tokens_per_s": d["decode_tokens_per_s"], "generated_tokens": w["generated_tokens"],
            "seconds": d["decode_s"], "wall_s": round(wall, 3), "slot_utilisation": w["slot_utilisation"],
            "cpu_share": d["cpu_share"], "waits_per_round": d["waits_per_round"],
            "preempted_per_round": d["preempted_per_round"],
            "io_cpu_per_s": round(worker.io_cpu_s / d["decode_s"], 3), "finalise_s": w["finalise_s"],
            "io_wait_s": w["io_wait_s"], "rows": w["rows"], "shards": w["shards"]}


def bracketed(runs: list[dict]) -> list[dict]:
    """Each worker run with its ratio over the mean of the alone runs before and after it."""
    out = []
    for i, r in enumerate(runs):
        if r["mode"] == "alone":
            continue
        around = [runs[j]["tokens_per_s"] for j in (i - 1, i + 1) if 0 <= j < len(runs)
                  and runs[j]["mode"] == "alone"]
        out.append({**r, "vs_alone": round(r["tokens_per_s"] / statistics.mean(around), 3)})
    return out


def summarise(runs: list[dict], ratios: list[dict]) -> dict:
    figures = ("tokens_per_s", "slot_utilisation", "cpu_share", "waits_per_round", "preempted_per_round",
               "io_cpu_per_s")
    out = {}
    for mode in MODES:
        rs = [r for r in runs if r["mode"] == mode]
        if not rs:
            continue
        s = {f: round(statistics.median(r[f] for r in rs), 3) for f in figures}
        s.update(lowest=min(r["tokens_per_s"] for r in rs), highest=max(r["tokens_per_s"] for r in rs),
                 runs=len(rs), generated_tokens=sorted({r["generated_tokens"] for r in rs}))
        vs = [r["vs_alone"] for r in ratios if r["mode"] == mode]
        if vs:
            s.update(vs_alone=round(statistics.median(vs), 3), vs_alone_lowest=min(vs), vs_alone_highest=max(vs))
        out[mode] = s
    return out


def markdown(doc: dict) -> str:
    lines = [kit_headline("A job worker's machinery beside decoding, one process, no Ray", doc), ""]
    for name, w in doc["workloads"].items():
        lines += [f"`{name}`: {w['describe']}", "",
                  "| run | tokens/s inside decode rounds: median [lowest, highest] | vs decoding alone around it: "
                  "median [lowest, highest] | slot utilisation | decode thread's CPU share | waits per round | "
                  "preempted per round | IO thread's CPU per second of rounds | generated tokens |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for mode, s in w["summary"].items():
            vs = (f"{s['vs_alone']} [{s['vs_alone_lowest']}, {s['vs_alone_highest']}]" if "vs_alone" in s else "1")
            label = LABELS[mode].replace("`--switch-interval`", f"{doc.get('switch_interval')} s (default "
                                                                   f"{doc.get('default_switch_interval')} s)")
            lines.append(f"| {label} | {s['tokens_per_s']} [{s['lowest']}, {s['highest']}] | {vs} | "
                         f"{s['slot_utilisation']} | {s['cpu_share']} | {s['waits_per_round']} | "
                         f"{s['preempted_per_round']} | {s['io_cpu_per_s']} | "
                         f"{', '.join(map(str, s['generated_tokens']))} |")
        lines.append("")
    allocator = ("freed memory kept (engine/models/malloc.py)" if doc["malloc"].get("left") is None
                 else f"glibc defaults ({doc['malloc']['left']})")
    lines += [f"{doc['reps']} repetitions, each: decoding alone before every worker run (the worker runs in an "
              "order that rotates between repetitions), then a last alone run; all decode on the same thread of one "
              f"set of models, loaded as a job's worker loads them; C allocator: {allocator}.",
              "", f"How: `{doc['how']}` ({doc['seconds']:.0f} s)."]
    return "\n".join(lines) + "\n"


def run_workload(models, spec, rows: list[dict], groups, reps: int, work: Path, manifest: str,
                 switch: float | None) -> list[dict]:
    runs = []
    modes = ("worker", "worker_no_export") + (("worker_switch",) if switch else ())

    def alone(rep: int) -> None:
        runs.append({"rep": rep, "mode": "alone", **run_alone(models, spec, rows)})
        print(spec.name, runs[-1], flush=True)
    for rep in range(reps):
        order = modes[rep % len(modes):] + modes[:rep % len(modes)]
        for mode in order:
            alone(rep)
            out = str(work / f"out-{spec.name}-r{rep}-{mode}")
            default = sys.getswitchinterval()
            if mode == "worker_switch":
                sys.setswitchinterval(switch)
            try:
                run = run_worker(models, spec, groups, out, mode != "worker_no_export", manifest)
            finally:
                sys.setswitchinterval(default)
            runs.append({"rep": rep, "mode": mode, **run})
            print(spec.name, runs[-1], flush=True)
    alone(reps)
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kit_arguments(ap, reps=4)
    ap.add_argument("--workloads", default="temps48", help="comma-separated: temps48, augment")
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="also run the worker with sys.setswitchinterval at this many seconds")
    ap.add_argument("--out", required=True, help="result-file stem (.json and .md are written)")
    args = ap.parse_args()
    from engine.io.storage import Storage
    from engine.models.malloc import described as malloc_described
    from engine.runtime.job import prepare_groups
    from engine.runtime.threads import on_short_thread
    from engine.runtime.worker import WorkerModels

    kit, t0, load_start = start_on_kit(args)
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    workloads = {}
    with tempfile.TemporaryDirectory(prefix="bench-worker-machinery-") as tmp:
        work = Path(tmp)
        specs = dict(jt.specs(jt.kit_models(kit), work, args.threads))
        unknown = [n for n in names if n not in ("temps48", "augment")]
        if unknown:
            raise SystemExit(f"unknown workloads {unknown}: temps48, augment")
        first = specs[names[0]]
        storage = Storage(first.storage)
        models = WorkerModels.load(first, storage, "cpu")  # loaded on a short thread, as a worker's
        dtype = str(models.synth.target.model.dtype).replace("torch.", "")
        for name in names:
            spec = specs[name]
            # the worker's shards are planned over the rows decoding alone reads (an augment job's
            # variants file, written once, as the driver writes it)
            manifest = jt.job_manifest(spec, work)
            rows = jt.read_rows(manifest)
            groups = on_short_thread(lambda s=spec: prepare_groups(s, storage, progress=False))
            runs = run_workload(models, spec, rows, groups, args.reps, work, manifest, args.switch_interval)
            ratios = bracketed(runs)
            decoded = runs[0]["rows"]  # rows with text (a variant without any is an error record)
            workloads[name] = {"describe": f"{decoded} rows decoded, batch {spec.resources.batch_size}, "
                                           f"{spec.resources.rows_per_shard} rows per shard, a window of "
                                           f"{spec.resources.window} shards, method {spec.decoding.method}",
                               "summary": summarise(runs, ratios), "runs": runs, "ratios": ratios}
        models.decode_thread.close()
    doc = {"benchmark": "a job worker's machinery beside decoding, one process, no Ray", "machine": describe("cpu"),
           "how": f"{jt.interpreter()} benchmarks/bench_worker_machinery.py " + " ".join(sys.argv[1:]),
           "threads": args.threads, "reps": args.reps, "switch_interval": args.switch_interval,
           "default_switch_interval": sys.getswitchinterval(), "dtype": dtype, "malloc": malloc_described(),
           "load_average": {"start": load_start, "end": round(os.getloadavg()[0], 2)},
           "seconds": round(time.perf_counter() - t0, 1), "workloads": workloads}
    write_result_pair(Path(args.out), doc, markdown(doc))


if __name__ == "__main__":
    main()
