"""What an idle local Ray cluster beside decoding costs it, with and without Ray's dashboard.

A job's worker decodes in a Ray worker process, next to the processes of the cluster it runs on
(on `address: local`, the one `pcg-synth run` starts: GCS, raylet, the node's agents and, if
started, the dashboard's head and modules). Decoding alone (`pcg-synth generate`, and this
project's job-throughput baseline) runs with no cluster at all. This script keeps one set of
models loaded in its own process (no Ray in it) and decodes the same rows (benchmarks/
bench_job_throughput.py's `temps48`, arrival order, batch 8) in turns:
  * `none`: no cluster on the machine;
  * `local`: a local cluster started as `pcg-synth run` starts one (`init_ray("local")` in a
    separate process that then waits; without the dashboard since 2026-12-02);
  * `local_dashboard`: the same with `PCG_SYNTH_RAY_DASHBOARD=1` (Ray's dashboard on, what a
    local cluster started before this change ran).
The order rotates between repetitions, so a host whose speed drifts weighs on every mode; each
decoding run reports tokens/s and its thread's involuntary context switches per round (how often
other work took its core). `--jobs N` then runs the temps48 job itself (`pcg-synth run`'s
`JobRunner` on a fresh local cluster, one worker) N times each way, with and without the
dashboard, in turns: its steady tokens/s and its decode thread's preemptions per round.

    .venv/bin/python benchmarks/bench_ray_beside_decoding.py --reps 4 --jobs 3 \\
        --out benchmarks/results/ray_beside_decoding_cpu_tiny_xeon
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_job_throughput as jt  # noqa: E402

from machine import describe, kit_arguments, kit_headline, start_on_kit, write_result_pair  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODES = ("none", "local", "local_dashboard")
SETTLE_S = 5.0  # after the cluster answers: its processes finish starting before the clock runs
CLUSTER = """
import sys
from engine.connect import init_ray
init_ray("local", log_to_driver=False, configure_logging=False)
print("ready", flush=True)
sys.stdin.read()  # until the benchmark closes it
import ray
ray.shutdown()
"""


def set_dashboard(env, mode: str) -> None:
    """`PCG_SYNTH_RAY_DASHBOARD` in `env` (a dict, or os.environ) as `mode` asks: 1 for
    `local_dashboard`, else unset (a local cluster's default, no dashboard)."""
    env.pop("PCG_SYNTH_RAY_DASHBOARD", None)
    if mode == "local_dashboard":
        env["PCG_SYNTH_RAY_DASHBOARD"] = "1"


class Cluster:
    """A local cluster in a process of its own, as `pcg-synth run` would start it (`mode`)."""

    def __init__(self, mode: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        set_dashboard(env, mode)
        self.proc = subprocess.Popen([sys.executable, "-c", CLUSTER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"the local cluster did not start ({mode}): {line!r}")
        time.sleep(SETTLE_S)

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def decode(synth, spec, rows: list[dict], mode: str) -> dict:
    cluster = Cluster(mode) if mode != "none" else None
    try:
        r = jt.run_alone(synth, spec, rows, "arrival")
    finally:
        if cluster:
            cluster.close()
    return {"mode": mode, "tokens_per_s": r["tokens_per_s"], "seconds": r["seconds"],
            "preempted_per_round": r["preempted_per_round"], "waits_per_round": r["waits_per_round"],
            "cpu_share": r["cpu_share"]}


def run_jobs(spec, n: int) -> list[dict]:
    """The job n times with the dashboard and n times without, in turns (ABBA)."""
    runs = []
    for rep in range(n):
        for mode in ("local", "local_dashboard") if rep % 2 == 0 else ("local_dashboard", "local"):
            set_dashboard(os.environ, mode)
            try:
                r = jt.run_job(spec, rep, "arrival", tag=f"-{mode}")
            finally:
                os.environ.pop("PCG_SYNTH_RAY_DASHBOARD", None)
            runs.append({"rep": rep, "mode": mode, "steady_tokens_per_s": r["steady_tokens_per_s"],
                         "decode_tokens_per_s": r.get("decode_tokens_per_s"),
                         "preempted_per_round": r.get("preempted_per_round"), "rows_ok": r["rows_ok"],
                         "slot_utilisation": r["slot_utilisation"]})
            print(runs[-1], flush=True)
    return runs


def summarise(runs: list[dict], modes: tuple[str, ...], key: str, base: str, vs: str,
              figures: tuple[str, ...]) -> dict:
    """Per mode: the median of `key` with its [lowest, highest], its ratio to the `base` mode's
    run of the same repetition (`vs`: median, lowest, highest) and the medians of `figures`."""
    by = {m: [r for r in runs if r["mode"] == m] for m in modes}
    ref = {r["rep"]: r[key] for r in by[base]}
    out = {}
    for mode, rs in by.items():
        values = [r[key] for r in rs]
        ratios = [round(r[key] / ref[r["rep"]], 3) for r in rs]
        out[mode] = {key: round(statistics.median(values), 2), "lowest": min(values), "highest": max(values),
                     vs: round(statistics.median(ratios), 3), f"{vs}_lowest": min(ratios),
                     f"{vs}_highest": max(ratios),
                     **{f: round(statistics.median(r[f] for r in rs), 2) for f in figures}}
    return out


def markdown(doc: dict) -> str:
    lines = [kit_headline("Decoding alone beside an idle local Ray cluster", doc, f", Ray {doc['ray']}"), "",
             "| cluster beside decoding | tokens/s: median [lowest, highest] | vs no cluster (each repetition's "
             "own) | preempted per round | waits per round |", "|---|---|---|---|---|"]
    for mode, s in doc["summary"].items():
        lines.append(f"| {doc['labels'][mode]} | {s['tokens_per_s']} [{s['lowest']}, {s['highest']}] | "
                     f"{s['vs_none']} [{s['vs_none_lowest']}, {s['vs_none_highest']}] | {s['preempted_per_round']} | "
                     f"{s['waits_per_round']} |")
    if doc.get("jobs_summary"):
        lines += ["", f"The temps48 job (one worker, batch 8, 6 rows per shard), {doc['jobs']} runs each way in turns:",
                  "", "| local cluster | steady tokens/s: median [lowest, highest] | vs with the dashboard (each "
                  "repetition's own) | decode thread preempted per round |", "|---|---|---|---|"]
        for mode, s in doc["jobs_summary"].items():
            lines.append(f"| {doc['labels'][mode]} | {s['steady_tokens_per_s']} [{s['lowest']}, {s['highest']}] | "
                         f"{s['vs_dashboard']} [{s['vs_dashboard_lowest']}, {s['vs_dashboard_highest']}] | "
                         f"{s['preempted_per_round']} |")
    lines += ["", f"Medians over {doc['reps']} repetitions; each runs every mode once, in an order that rotates "
              "between repetitions. Rows: `temps48` (48 quickstart texts x 4 per-row temperatures, pcg gamma 3), "
              "arrival order, batch 8, decoded in this script's process, which has no Ray in it.", "",
              f"How: `{doc['how']}` ({doc['seconds']:.0f} s)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kit_arguments(ap, reps=4)
    ap.add_argument("--jobs", type=int, default=0, help="also run the temps48 job N times each way")
    ap.add_argument("--out", required=True, help="result-file stem (.json and .md are written)")
    args = ap.parse_args()
    import ray

    from engine.api import Synthesizer

    kit, t0, load_start = start_on_kit(args)
    with tempfile.TemporaryDirectory(prefix="bench-ray-beside-") as tmp:
        models = jt.kit_models(kit)
        spec = dict(jt.specs(models, Path(tmp), args.threads))["temps48"]
        rows = jt.temps48_rows()
        synth = Synthesizer.load(models["target"], draft=models["draft"], device="cpu", dtype=spec.models.dtype)
        synth.warmup(spec.decoding, spec.resources.batch_size)
        runs = []
        for rep in range(args.reps):
            order = MODES[rep % len(MODES):] + MODES[:rep % len(MODES)]
            for mode in order:
                runs.append({"rep": rep, **decode(synth, spec, rows, mode)})
                print(runs[-1], flush=True)
        dtype = str(synth.target.model.dtype).replace("torch.", "")
        jobs = run_jobs(spec, args.jobs) if args.jobs else []
    summary = summarise(runs, MODES, "tokens_per_s", "none", "vs_none",
                        ("preempted_per_round", "waits_per_round"))
    doc = {"benchmark": "decoding alone beside an idle local Ray cluster", "machine": describe("cpu"),
           "how": f"{jt.interpreter()} benchmarks/bench_ray_beside_decoding.py " + " ".join(sys.argv[1:]),
           "threads": args.threads, "reps": args.reps, "dtype": dtype, "ray": ray.__version__,
           "load_average": {"start": load_start, "end": round(os.getloadavg()[0], 2)},
           "seconds": round(time.perf_counter() - t0, 1),
           "labels": {"none": "none", "local": "local, as `pcg-synth run` starts it (no dashboard)",
                      "local_dashboard": "local with Ray's dashboard (`PCG_SYNTH_RAY_DASHBOARD=1`)"},
           "summary": summary, "runs": runs, "jobs": args.jobs,
           "jobs_summary": summarise(jobs, ("local", "local_dashboard"), "steady_tokens_per_s", "local_dashboard",
                                     "vs_dashboard", ("preempted_per_round",)) if jobs else None, "job_runs": jobs}
    write_result_pair(Path(args.out), doc, markdown(doc))


if __name__ == "__main__":
    main()
