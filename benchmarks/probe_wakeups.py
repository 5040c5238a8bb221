"""Which threads on the machine wake up, and fault pages in, while a job decodes (a probe, CPU).

Runs the `temps144` workload of bench_job_throughput.py (temps48's rows three times over) as a
job on a local Ray cluster and, once the job is in its steady state (`--after` seconds after its
worker took its first shard), counts every thread's voluntary and involuntary context switches, CPU time, minor page
faults and system CPU time over `--window` seconds from /proc (`--malloc`: the job's worker's C
allocator as the engine sets it, engine/models/malloc.py; `default`: glibc's own settings;
`mmap_threshold` or `trim_threshold`: only that one of the engine's settings, through glibc's
environment variable, which leaves the rest to glibc; `--renice N`: once the worker decodes, every
thread of the cluster's processes but the worker's two busiest, its decode threads, set to nice N,
which no later thread of theirs starts above; `--worker-niceness N`: the cluster's workers start
at nice N, `RAY_worker_niceness`, instead of Ray's 15). On a 2-core machine that a
worker's two decode threads keep busy, every other thread that wakes takes a core from one of
them for a moment (the job's figures say how often: `preempted_per_round`), and so does a page
fault in either of them.

    .venv/bin/python benchmarks/probe_wakeups.py --out benchmarks/results/wakeups_cpu_tiny_NAME
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_job_throughput as jobs  # noqa: E402

from machine import describe, write_result_pair  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def malloc_modes() -> dict:
    """`--malloc` -> (environment the local cluster, and so its workers, inherit; its label)."""
    from engine.models.malloc import SETTINGS

    one = {name: ({env: str(SETTINGS[name][1])}, f"{env}={SETTINGS[name][1]} only (glibc then adjusts nothing)")
           for name, env in (("mmap_threshold", "MALLOC_MMAP_THRESHOLD_"),
                             ("trim_threshold", "MALLOC_TRIM_THRESHOLD_"))}
    return {"engine": ({}, "the engine's"),
            "default": ({"PCG_SYNTH_MALLOC": "default"}, "glibc's defaults (PCG_SYNTH_MALLOC=default)"), **one}


def renice_ray(nice: int, sample_s: float = 1.0) -> dict:
    """Every thread of the processes on this machine whose command line names Ray, but the two
    that used the most CPU over `sample_s` in the worker's process (its decode thread and its
    OpenMP thread), and this script's own, set to `nice`; what was set and what was kept."""
    first = all_threads()
    time.sleep(sample_s)
    last = all_threads()
    me = str(os.getpid())
    worker = {k: last[k][4] - first[k][4] for k in last if k in first and "SynthesisWorker" in last[k][0]}
    kept = sorted(worker, key=lambda k: -worker[k])[:2]
    done = []
    for (pid, tid), v in last.items():
        if pid == me or (pid, tid) in kept or "ray" not in v[0].lower():
            continue
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)
            done.append(tid)
        except OSError:
            continue  # ended meanwhile
    return {"nice": nice, "threads_set": len(done),
            "kept": [{"pid": int(p), "tid": int(t), "thread": last[(p, t)][1]} for p, t in kept]}


def all_threads() -> dict:
    """(pid, tid) -> (process command line, thread name, voluntary, involuntary, CPU ticks,
    minor faults, system CPU ticks, nice)."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:60].strip()
            for tid in os.listdir(f"/proc/{pid}/task"):
                status = dict(line.split(":\t", 1) for line in
                              open(f"/proc/{pid}/task/{tid}/status").read().splitlines() if ":\t" in line)
                stat = open(f"/proc/{pid}/task/{tid}/stat").read()
                fields = stat[stat.rindex(")") + 2:].split()
                out[(pid, tid)] = (cmd, status["Name"].strip(), int(status["voluntary_ctxt_switches"]),
                                   int(status["nonvoluntary_ctxt_switches"]), int(fields[11]) + int(fields[12]),
                                   int(fields[7]), int(fields[12]), int(fields[16]))
        except (OSError, ValueError, KeyError):
            continue  # a process or thread that ended while read
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kit", default="kit")
    ap.add_argument("--after", type=float, default=8.0,
                    help="seconds from the worker's first shard to the window")
    ap.add_argument("--window", type=float, default=10.0, help="seconds counted")
    ap.add_argument("--top", type=int, default=25, help="threads listed")
    modes = malloc_modes()
    ap.add_argument("--malloc", choices=tuple(modes), default="engine",
                    help="the worker's C allocator: the engine's settings, glibc's defaults, or one setting only")
    ap.add_argument("--renice", type=int, default=None,
                    help="once the worker decodes, set every Ray thread but its decode threads to this nice value")
    ap.add_argument("--worker-niceness", type=int, default=None,
                    help="the cluster's workers start at this nice value (RAY_worker_niceness; Ray's default 15)")
    ap.add_argument("--out", required=True, help="result path without extension (.json and .md written)")
    args = ap.parse_args()

    env, malloc = modes[args.malloc]
    os.environ.update(env)  # the local cluster started below, and so its workers, inherit it
    if args.worker_niceness is not None:
        os.environ["RAY_worker_niceness"] = str(args.worker_niceness)
    work = Path(tempfile.mkdtemp(prefix="probe-wakeups-"))
    spec = dict(jobs.specs(jobs.kit_models(Path(args.kit).resolve()), work, 2, scale=3))["temps144"]
    snaps: list = []
    reniced: dict = {}

    def sample() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not any("SynthesisWorker.process" in v[0]
                                                      for v in all_threads().values()):
            time.sleep(0.2)  # Ray titles the worker's process so while it runs `process` (a shard)
        if args.renice is not None:
            reniced.update(renice_ray(args.renice))
        time.sleep(args.after)
        snaps.append((time.perf_counter(), all_threads()))
        time.sleep(args.window)
        snaps.append((time.perf_counter(), all_threads()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    job = jobs.run_job(spec, 0, "arrival")
    sampler.join()
    if len(snaps) < 2 or job["steady_s"] < args.after + args.window:
        sys.exit(f"the job's steady state ({job['steady_s']} s) did not cover the window: lower --after")
    (t0, first), (t1, last) = snaps
    seconds = t1 - t0
    rows = []
    for key, now in last.items():
        then = first.get(key)
        if then is not None:
            rows.append({"process": now[0], "thread": now[1], "pid": int(key[0]), "tid": int(key[1]),
                         "main_thread": key[0] == key[1],
                         "voluntary_per_s": round((now[2] - then[2]) / seconds, 1),
                         "involuntary_per_s": round((now[3] - then[3]) / seconds, 1),
                         "cpu_share": round((now[4] - then[4]) / TICK / seconds, 3),
                         "minor_faults": now[5] - then[5], "sys_s": round((now[6] - then[6]) / TICK, 2),
                         "nice": now[7]})
    rows.sort(key=lambda r: -r["voluntary_per_s"])
    result = {"probe": "wakeups", "machine": describe(), "malloc": args.malloc, "renice": reniced or None,
              "worker_niceness": args.worker_niceness,
              "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "window_s": round(seconds, 2),
              "job": {k: job.get(k) for k in ("steady_tokens_per_s", "steady_s", "preempted_per_round",
                                               "cpu_share", "slot_utilisation")},
              "voluntary_per_s": round(sum(r["voluntary_per_s"] for r in rows)),
              "involuntary_per_s": round(sum(r["involuntary_per_s"] for r in rows)),
              "minor_faults": sum(r["minor_faults"] for r in rows),
              "threads": rows}
    lines = [f"Context switches of every thread on the machine over {result['window_s']} s of a temps144 job's "
             f"steady state: {result['machine']['cpu']}, {result['machine']['cpu_cores_visible']} cores, "
             f"{result['when']}, the worker's C allocator settings {malloc}"
             + (f"; from the worker's first shard every Ray thread but its two decode threads set to nice "
                f"{reniced['nice']} ({reniced['threads_set']} threads)" if reniced else "")
             + (f"; workers started at nice {args.worker_niceness} (RAY_worker_niceness)"
                if args.worker_niceness is not None else "") + ". The job: "
             f"{job['steady_tokens_per_s']} tokens/s, its decode thread on the CPU {job['cpu_share']} of its "
             f"rounds and preempted {job['preempted_per_round']} times a round. Machine-wide: "
             f"{result['voluntary_per_s']} voluntary and {result['involuntary_per_s']} involuntary switches a "
             f"second, {result['minor_faults']} minor page faults. The {args.top} threads that woke most, "
             f"then the {args.top} that faulted most:", ""]
    header = ["| thread | process | nice | voluntary / s | involuntary / s | CPU share | minor faults | system CPU s |",
              "|---|---|---|---|---|---|---|---|"]
    for ranked in (rows, sorted(rows, key=lambda r: -r["minor_faults"])):
        lines += header + [
            f"| {r['thread']}{' (main thread)' if r['main_thread'] else ''} (tid {r['tid']}) | "
            f"{r['process'][:50].replace('|', '/')} (pid {r['pid']}) | {r['nice']} | {r['voluntary_per_s']} | "
            f"{r['involuntary_per_s']} | {r['cpu_share']} | {r['minor_faults']} | {r['sys_s']} |"
            for r in ranked[:args.top]] + [""]
    lines += [f"How: `{' '.join(['.venv/bin/python', *sys.argv])}`"]
    write_result_pair(Path(args.out), result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
