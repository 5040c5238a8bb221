"""What keeping a CPU round's freed memory (`engine/models/malloc.py`) buys decoding alone.

Decoding alone (`pcg-synth generate`'s path: one decode session at batch 8 over the temps48 rows
of `bench_job_throughput.py`, the tiny kit, `dtype: auto`) in fresh processes taking turns:
`PCG_SYNTH_MALLOC=default` (glibc's own malloc settings) and the engine's (unset). Each process
loads the models, warms up, and decodes the rows on its main thread and then on a thread of its
own (as a job worker's decode loop does; on a CPU that thread runs slower for another reason:
README, Streaming, CPU threads), `--runs` times each; per run: tokens/s, the process's minor page
faults and system CPU time.

    .venv/bin/python benchmarks/bench_malloc.py --reps 3 --out benchmarks/results/malloc_cpu_tiny_xeon

The job side (a worker process, its decode loop on its own thread) is in
`bench_job_throughput.py --before` with an engine before the change.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from bench_job_throughput import median

ROOT = Path(__file__).resolve().parent.parent
MODES = {"default": "glibc's defaults (`PCG_SYNTH_MALLOC=default`)", "kept": "the engine's (freed memory kept)"}


def child(args) -> None:
    import bench_job_throughput as jobs

    from engine import Synthesizer
    from engine.models.malloc import described

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    models = jobs.kit_models(Path(args.kit))
    spec = dict(jobs.specs(models, work, args.threads))["temps48"]
    rows = jobs.job_rows(spec, work)
    synth = Synthesizer.load(models["target"], draft=models["draft"], device="cpu", dtype="auto", batch_size=8)
    synth.warmup(spec.decoding, 8)
    out = {"malloc": described(), "runs": []}
    for where in ("main", "thread"):
        for _ in range(args.runs):
            before = resource.getrusage(resource.RUSAGE_SELF)
            alone = jobs.run_alone if where == "main" else jobs.run_alone_in_thread
            r = alone(synth, spec, rows, "arrival")
            after = resource.getrusage(resource.RUSAGE_SELF)
            out["runs"].append({"where": where, "tokens_per_s": r["tokens_per_s"],
                                "generated_tokens": r["generated_tokens"],
                                "minor_faults": after.ru_minflt - before.ru_minflt,
                                "sys_s": round(after.ru_stime - before.ru_stime, 3)})
    print("RESULT " + json.dumps(out), flush=True)


def med(values: list[float]) -> float:
    return round(median(values), 2)


def markdown(doc: dict) -> str:
    lines = [f"Decoding alone with glibc's malloc settings and with the engine's (`engine/models/malloc.py`): "
             f"{doc['machine']}, {doc['threads']} threads, torch {doc['torch']}, the tiny kit, `dtype: auto` "
             f"({doc['dtype_auto']}), "
             f"{doc['date']}; load average (1 min) {doc['load_average'][0]} at the start, "
             f"{doc['load_average'][1]} at the end; OMP_WAIT_POLICY {doc['omp_wait_policy'] or 'unset'}.", "",
             "| where it decodes | malloc | runs | tokens/s: median [lowest, highest] | vs glibc's defaults | "
             "minor faults per run (median) | system CPU s per run (median) |", "|---|---|---|---|---|---|---|"]
    for where in ("main", "thread"):
        base = None
        for mode in MODES:
            runs = [r for p in doc["processes"] if p["mode"] == mode for r in p["runs"] if r["where"] == where]
            tps = [r["tokens_per_s"] for r in runs]
            m = med(tps)
            base = m if mode == "default" else base
            lines.append(f"| {'main thread' if where == 'main' else 'a thread of its own'} | {MODES[mode]} | "
                         f"{len(runs)} | {m} [{min(tps)}, {max(tps)}] | {round(m / base, 3)} | "
                         f"{int(med([r['minor_faults'] for r in runs]))} | "
                         f"{med([r['sys_s'] for r in runs])} |")
    lines += ["", f"{doc['reps']} repetitions, each one process per setting in turn (default first), every process "
              f"loading the models, warming up and decoding the temps48 rows (48 texts x 4 per-row temperatures, "
              f"pcg gamma 3, max_new_tokens 200, batch 8) {doc['runs']} times on its main thread and then "
              f"{doc['runs']} times on a thread of its own. What the processes ran with: "
              + "; ".join(sorted({json.dumps(p['malloc']) for p in doc['processes']})) + ".", "",
              f"How: `{doc['how']}` ({doc['seconds']} s)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kit", default=str(ROOT / "kit"))
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--runs", type=int, default=2, help="runs per thread in each process")
    ap.add_argument("--out", help="result-file stem (writes .json and .md)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    import torch

    from machine import describe, write_result_pair

    if not (Path(args.kit) / "kit.json").is_file():
        sys.exit(f"no kit at {args.kit}: build it first (.venv/bin/pcg-synth kit build kit)")
    start, load0 = time.perf_counter(), os.getloadavg()[0]
    work = Path(f"/tmp/bench-malloc-{os.getpid()}")
    processes = []
    for rep in range(args.reps):
        for mode in MODES:
            env = {k: v for k, v in os.environ.items() if k != "PCG_SYNTH_MALLOC"}
            if mode == "default":
                env["PCG_SYNTH_MALLOC"] = "default"
            cmd = [sys.executable, __file__, "--child", "--kit", args.kit, "--threads", str(args.threads),
                   "--runs", str(args.runs), "--work", str(work / f"{mode}-{rep}")]
            run = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=str(ROOT))
            if run.returncode:
                sys.exit(f"{mode} process failed:\n{run.stderr[-3000:]}")
            doc = json.loads(next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))[7:])
            processes.append({"rep": rep, "mode": mode, **doc})
            print(rep, mode, [(r["where"], r["tokens_per_s"], r["minor_faults"]) for r in doc["runs"]], flush=True)
    machine = describe()
    doc = {"benchmark": "malloc", "how": ".venv/bin/python " + " ".join(sys.argv),
           "machine": f"{machine['cpu']}, {machine['cpu_cores_visible']} cores", "dtype_auto": machine["dtype_auto"],
           "threads": args.threads, "torch": torch.__version__, "reps": args.reps, "runs": args.runs,
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "load_average": [round(load0, 2), round(os.getloadavg()[0], 2)],
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
           "seconds": round(time.perf_counter() - start), "processes": processes}
    shutil.rmtree(work, ignore_errors=True)
    if args.out:
        write_result_pair(Path(args.out), doc, markdown(doc))
    else:
        print(markdown(doc))


if __name__ == "__main__":
    main()
