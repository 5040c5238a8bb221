"""The fault table: what each kind of failure costs a job, in rows lost, rows duplicated and codes.

Small trials on the tiny kit (built into a temporary directory unless `--kit`), each a real job
of 12 manifest rows in 6 shards (`exact`, float64 so codes are batch-invariant, 16 tokens per
row, one CPU thread per worker), compared with an uninterrupted run of the same spec:

  * `worker kill`: one of 2 workers SIGKILLed after the first commit (ray.cluster_utils.Cluster,
    one node with 2 logical GPUs);
  * `driver kill + resume`: `pcg-synth run` in a subprocess on its own local Ray, its process
    group SIGKILLed as soon as a commit record exists, then the same spec run again;
  * `node loss with return`: the only worker node removed after the first commit, a new node
    added `--return-after` seconds later (the driver waits for capacity);
  * `node loss without return`: the same with no node coming back and `capacity_wait_s` 5: the
    job must fail cleanly keeping its committed shards; then a node is added and the job rerun;
  * `storage outage`: output on a moto S3 server on 127.0.0.1 that is stopped for
    `--outage` seconds after the first commit and started again on the same port.

For each: rows lost (manifest ids missing from the final output), rows duplicated (ids present
more than once), whether every row's codes equal the uninterrupted run's, and what the run
reported (retries, replacements, waits, storage retries). Writes
benchmarks/results/faults_cpu_tiny.{json,md} with the machine's description and load.

    .venv/bin/python benchmarks/bench_faults.py [--kit DIR] [--return-after 6] [--outage 4]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # shared cores: wait passively (tests do too)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
RESULT = ROOT / "benchmarks" / "results" / "faults_cpu_tiny"
ROWS, PER_SHARD = 12, 2
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spec_for(kit: Path, manifest: Path, output: str, **over):
    from engine.config import JobSpec

    raw = {"name": "faults", "models": {"target": str(kit / "target"), "draft": str(kit / "draft"),
                                        "codec": str(kit / "codec"), "dtype": "float64"},
           "decoding": {"method": "exact", "max_new_tokens": 16, "seed": 1},
           "input": {"manifests": [str(manifest)]}, "output": {"uri": output},
           "resources": {"workers": 1, "batch_size": 4, "rows_per_shard": PER_SHARD, "cpus_per_worker": 1,
                         "device": "cpu", "retry_backoff_s": 0.5, "retry_backoff_max_s": 4.0}}
    for key, value in over.items():
        raw[key] = {**raw.get(key, {}), **value}
    return JobSpec.model_validate(raw)


def read_rows(spec) -> list[dict]:
    import pyarrow.parquet as pq

    from engine.io.storage import Storage

    storage = Storage(spec.storage)
    rows = []
    for uri in storage.list(spec.output.uri.rstrip("/") + "/data"):
        fs, path = storage.arrow_filesystem(uri)
        rows.extend(pq.read_table(path, filesystem=fs, columns=["id", "codes", "error"]).to_pylist())
    return rows


def score(spec, baseline: dict[str, list[int]]) -> dict:
    rows = read_rows(spec)
    counts = collections.Counter(r["id"] for r in rows)
    codes = {r["id"]: list(r["codes"] or []) for r in rows}
    return {"rows_lost": sum(1 for i in baseline if i not in counts),
            "rows_duplicated": sum(n - 1 for n in counts.values() if n > 1),
            "codes_identical": codes == baseline}


def figures(summary: dict | None) -> dict:
    if not summary:
        return {}
    sh = summary["shards"]
    return {"retries": sh["retries"], "workers_replaced": sh["workers_replaced"],
            "capacity_waits": sh.get("capacity_waits", []), "storage_retries": summary.get("storage_retries", 0),
            "wall_s": summary["wall_s"]}


def new_cluster():
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    return Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})


def connect(cluster) -> None:
    import ray

    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)


def end_cluster(cluster) -> None:
    import ray

    ray.shutdown()
    cluster.shutdown()


def local_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)


def trial_worker_kill(kit, manifest, work, baseline) -> dict:
    from engine.runtime.job import JobRunner

    cluster = new_cluster()
    try:
        cluster.add_node(num_cpus=2, num_gpus=2)
        connect(cluster)
        killed = []

        def kill_once(record):
            if not killed:
                os.kill(record.pid, signal.SIGKILL)
                killed.append(record.worker)

        spec = spec_for(kit, manifest, str(work / "worker_kill"), resources={"workers": 2, "gpus_per_worker": 1})
        summary = JobRunner(spec, progress=False, on_commit=kill_once).run()
        return {"outcome": f"completed; worker {killed[0]} killed after its first commit", **score(spec, baseline),
                **figures(summary)}
    finally:
        end_cluster(cluster)


def trial_driver_kill(kit, manifest, work, baseline) -> dict:
    import yaml

    from engine.runtime.job import JobRunner

    spec = spec_for(kit, manifest, str(work / "driver_kill"), resources={"shard_window": 1})  # one shard at a time
    spec_file = work / "driver_kill.yaml"
    spec_file.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "run", str(spec_file), "--quiet"], env=env,
                            cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    commits = work / "driver_kill" / "_commits"
    deadline = time.time() + 300
    while not (commits.is_dir() and any(commits.iterdir())):
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError("the driver ended or stalled before its first commit")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = len(list(commits.iterdir()))
    time.sleep(5)  # the dead driver's worker may still finish the shard it held before Ray reaps it
    orphaned = len(list(commits.iterdir())) - kept
    local_ray()
    try:
        summary = JobRunner(spec, progress=False).run()
    finally:
        import ray

        ray.shutdown()
    return {"outcome": f"driver SIGKILLed with {kept} shard(s) committed ({orphaned} more committed by its "
                       f"worker after the kill); the rerun resumed ({summary['shards']['committed_before']} "
                       f"committed before it, {summary['shards']['run_now']} run)",
            **score(spec, baseline), **figures(summary)}


def node_loss(kit, manifest, work, baseline, return_after: float | None) -> dict:
    from engine.runtime.job import JobRunner
    from engine.runtime.pool import JobFailed, WorkerPool

    name = "node_loss_return" if return_after is not None else "node_loss_no_return"
    cluster = new_cluster()
    waiting = WorkerPool.wait_for_capacity
    events: dict = {}
    try:
        first = cluster.add_node(num_cpus=1, num_gpus=1)
        connect(cluster)

        def wait_then_return(pool):
            if (return_after is not None and "returned" not in events
                    and time.monotonic() - events["lost"] >= return_after):
                cluster.add_node(num_cpus=1, num_gpus=1)
                events["returned"] = time.monotonic()
            return waiting(pool)

        WorkerPool.wait_for_capacity = wait_then_return

        def lose_once(record):
            if "lost" not in events:
                cluster.remove_node(first)
                events["lost"] = time.monotonic()

        wait = 120 if return_after is not None else 5
        spec = spec_for(kit, manifest, str(work / name),
                        resources={"gpus_per_worker": 1, "capacity_wait_s": wait})
        if return_after is not None:
            summary = JobRunner(spec, progress=False, on_commit=lose_once).run()
            return {"outcome": f"completed; node back after {return_after:g} s", **score(spec, baseline),
                    **figures(summary)}
        started = time.monotonic()
        try:
            JobRunner(spec, progress=False, on_commit=lose_once).run()
            failed = "not failed (unexpected)"
        except JobFailed:
            failed = f"failed cleanly {time.monotonic() - events['lost']:.1f} s after the loss"
        first_summary = json.loads(Path(spec.output.uri, "summary.json").read_text())
        kept = first_summary["shards"]["committed"]
        kept_rows = len(read_rows(spec))
        cluster.add_node(num_cpus=1, num_gpus=1)
        cluster.wait_for_nodes()
        WorkerPool.wait_for_capacity = waiting
        summary = JobRunner(spec, progress=False).run()
        out = {"outcome": f"{failed} (capacity_wait_s {wait}); {kept} committed shard(s) ({kept_rows} rows) kept; "
                          "rerun after a node was added resumed", **score(spec, baseline), **figures(summary),
               "first_run": figures(first_summary), "first_run_s": round(time.monotonic() - started, 1)}
        return out
    finally:
        WorkerPool.wait_for_capacity = waiting
        end_cluster(cluster)


def trial_storage_outage(kit, manifest, work, baseline, outage: float) -> dict:
    import boto3
    from moto.server import ThreadedMotoServer

    from engine.runtime.job import JobRunner

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="faults")
        spec = spec_for(kit, manifest, "s3://faults/out", resources={"max_retries": 6, "shard_window": 1},
                        storage={"endpoint_url": endpoint, "region": "us-east-1", "retries": 2,
                                 "retry_backoff_s": 0.2, "retry_backoff_max_s": 0.5})
        events: dict = {}

        def restart():
            time.sleep(outage)
            server.start()
            events["up"] = time.monotonic()

        def stop_once(record):
            if not events:
                server.stop()
                events["down"] = time.monotonic()
                threading.Thread(target=restart, daemon=True).start()

        local_ray()
        try:
            summary = JobRunner(spec, progress=False, on_commit=stop_once).run()
        finally:
            import ray

            ray.shutdown()
        return {"outcome": f"completed; S3 endpoint down {outage:g} s after the first commit",
                **score(spec, baseline), **figures(summary)}
    finally:
        server.stop()


def markdown(doc: dict) -> str:
    m = doc["machine"]
    lines = ["# Fault table, tiny kit, CPU", "",
             f"Command: `{doc['command'].strip()}`. Machine: {m.get('cpu')}, {m.get('cpu_cores_visible')} cores "
             f"visible, {m.get('platform')}, Python {m.get('python')}, torch {m.get('torch')}, {m.get('date')}; "
             f"load average at start {doc['load_start']}, at end {doc['load_end']} (other engineers' work "
             f"shared the cores); {doc['seconds']:.0f} s in all.", "",
             doc["how"], "",
             "| fault | rows lost | rows duplicated | codes identical | retries | workers replaced | "
             "capacity waits | storage retries | outcome |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, t in doc["trials"].items():
        waits = "; ".join(f"{w['waited_s']} s ({w['outcome']})" for w in t.get("capacity_waits", [])
                          + t.get("first_run", {}).get("capacity_waits", [])) or "-"
        same = "yes" if t["codes_identical"] else "NO"
        lines.append(f"| {name} | {t['rows_lost']} | {t['rows_duplicated']} | {same} "
                     f"| {t.get('retries', '-')} | {t.get('workers_replaced', '-')} | {waits} "
                     f"| {t.get('storage_retries', '-')} | {t['outcome']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kit", type=Path, default=None, help="a built tiny kit (default: build one)")
    parser.add_argument("--return-after", type=float, default=6.0)
    parser.add_argument("--outage", type=float, default=4.0)
    parser.add_argument("--out", default=str(RESULT))
    args = parser.parse_args()
    os.environ.setdefault("PCG_SYNTH_CACHE", tempfile.mkdtemp(prefix="pcg-synth-faults-cache-"))
    # moto's throwaway credentials, in the environment before any Ray worker starts
    os.environ.update({"AWS_ACCESS_KEY_ID": "faults-key-id", "AWS_SECRET_ACCESS_KEY": "faults-secret",
                       "AWS_DEFAULT_REGION": "us-east-1"})
    from engine.runtime.job import JobRunner

    from machine import describe

    started, load_start = time.monotonic(), os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="pcg-synth-faults-"))
    kit = args.kit
    if kit is None:
        from engine.kit import build_kit

        kit = build_kit(work / "kit")
    manifest = work / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"u{i:03d}", "text": f"Sentence {WORDS[i % 8]} number {i}."}) + "\n"
                                for i in range(ROWS)))
    local_ray()
    try:
        base_spec = spec_for(kit, manifest, str(work / "baseline"))
        JobRunner(base_spec, progress=False).run()
    finally:
        import ray

        ray.shutdown()
    baseline = {r["id"]: list(r["codes"] or []) for r in read_rows(base_spec)}
    trials = {}
    for name, run in [("worker kill", lambda: trial_worker_kill(kit, manifest, work, baseline)),
                      ("driver kill + resume", lambda: trial_driver_kill(kit, manifest, work, baseline)),
                      ("node loss with return", lambda: node_loss(kit, manifest, work, baseline, args.return_after)),
                      ("node loss without return", lambda: node_loss(kit, manifest, work, baseline, None)),
                      ("storage outage", lambda: trial_storage_outage(kit, manifest, work, baseline, args.outage))]:
        t0 = time.monotonic()
        trials[name] = {**run(), "trial_s": round(time.monotonic() - t0, 1)}
        print(f"{name}: {trials[name]}", flush=True)
    doc = {"command": "benchmarks/bench_faults.py " + " ".join(sys.argv[1:]), "machine": describe("cpu"),
           "load_start": round(load_start, 2), "load_end": round(os.getloadavg()[0], 2),
           "seconds": round(time.monotonic() - started, 1),
           "how": (f"Each trial is a real job over the same {ROWS}-row manifest ({ROWS // PER_SHARD} shards of "
                   f"{PER_SHARD} rows; exact, float64, 16 tokens per row, batch 4, one thread per worker), "
                   "scored against an uninterrupted run of the same spec on local Ray: rows lost = ids "
                   "missing from the final output, rows duplicated = extra copies of an id, codes identical = "
                   "every row's codes equal the uninterrupted run's. Cluster trials use ray.cluster_utils."
                   "Cluster on loopback with logical GPUs (a head with no GPU, worker nodes with 1-2); "
                   "retries and replacements are the final run's. One repetition."),
           "trials": trials}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(doc, indent=1) + "\n")
    Path(args.out + ".md").write_text(markdown(doc))
    print(markdown(doc))


if __name__ == "__main__":
    main()
