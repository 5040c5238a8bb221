"""Waiting for capacity (ray.cluster_utils.Cluster on loopback, logical GPUs): the only worker
node is lost mid-job and a node joins seconds later; the job waits for it instead of failing,
a replacement killed while loading its models is replaced again, and the output is every row
once with the codes of an uninterrupted run (float64)."""

from __future__ import annotations

import collections
import glob
import os
import signal
import threading
import time

import pytest
import ray

from engine.io.storage import Storage
from engine.runtime.job import JobRunner
from engine.runtime.plan import make_plan
from engine.runtime.pool import JobFailed, WorkerPool, backoff_s

from jobhelpers import audio_ok, comparable, job_spec, read_output, texts, write_manifest

ROWS = 8
# The node comes back on the pool's third look for capacity: it looked, found none, and kept
# every shard left instead of failing it, twice, before any node joined.
RETURN_ON_LOOK = 3


def spec_for(kit_dir, tmp_path, out: str, **resources):
    manifest = write_manifest(tmp_path / "m.jsonl", texts(ROWS))
    return job_spec(kit_dir, [str(manifest)], str(tmp_path / out), models={"dtype": "float64"},
                    resources={"workers": 1, "gpus_per_worker": 1, "cpus_per_worker": 1, "rows_per_shard": 2,
                               "device": "cpu", "retry_backoff_s": 0.2, **resources})


def children_of(pid: int, marker: bytes) -> list[int]:
    """Processes whose parent is `pid` and whose command line (Ray's process title) has `marker`."""
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            ppid = int(open(stat).read().rsplit(")", 1)[1].split()[1])
            cmd = open(stat[:-4] + "cmdline", "rb").read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and marker in cmd:
            found.append(int(stat.split("/")[2]))
    return found


def raylet_pid(node) -> int:
    return node.all_processes["raylet"][0].process.pid


def test_backoff_doubles_with_jitter_up_to_the_cap():
    import random

    rng = random.Random(0)
    waits = [backoff_s(n, 1.0, 5.0, rng) for n in range(1, 7)]
    for n, w in enumerate(waits, 1):
        assert 0.5 * min(5.0, 2 ** (n - 1)) <= w <= min(5.0, 2 ** (n - 1))
    assert max(waits) <= 5.0 and backoff_s(3, 0.0, 5.0) == 0.0


def test_the_only_worker_node_lost_and_back_the_job_waits_and_completes_identically(
        cluster, kit_dir, tmp_path, monkeypatch):
    first = cluster.add_node(num_cpus=1, num_gpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    events: dict = {}

    def kill_the_replacement_while_it_loads(node):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pids = children_of(raylet_pid(node), b"SynthesisWorker.__init__")
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                events["killed_loading"] = pids[0]
                return
            time.sleep(0.02)

    waiting = WorkerPool.wait_for_capacity

    def wait_then_bring_a_node_back(pool):  # the pool's waiting loop, on the driver's thread
        events["looks"] = events.get("looks", 0) + 1
        if "returned" not in events and events["looks"] >= RETURN_ON_LOOK:
            node = cluster.add_node(num_cpus=1, num_gpus=1)  # Ray's node start needs the main thread
            events["returned"] = events["looks"]
            threading.Thread(target=kill_the_replacement_while_it_loads, args=(node,), daemon=True).start()
        return waiting(pool)

    monkeypatch.setattr(WorkerPool, "wait_for_capacity", wait_then_bring_a_node_back)

    def lose_the_node_once(record):
        if "lost" not in events:
            cluster.remove_node(first)  # the only node with a GPU: no worker fits anywhere now
            events["lost"] = True

    spec = spec_for(kit_dir, tmp_path, "out", capacity_wait_s=60)
    summary = JobRunner(spec, progress=False, on_commit=lose_the_node_once).run()
    assert "lost" in events and events.get("returned") == RETURN_ON_LOOK and "killed_loading" in events
    shards = summary["shards"]
    assert shards["committed"] == shards["total"] == ROWS // 2 and shards["failed"] == 0
    assert shards["workers_replaced"] >= 2  # after the node loss, and after the death while loading
    assert any(w["outcome"] == "nodes joined" for w in shards["capacity_waits"])  # it waited, then went on
    out = read_output(spec)
    assert collections.Counter(r["id"] for r in out) == collections.Counter(f"u{i:03d}" for i in range(ROWS))
    assert all(audio_ok(r) for r in out)
    fresh = spec_for(kit_dir, tmp_path, "fresh")
    JobRunner(fresh, progress=False).run()
    assert comparable(out) == comparable(read_output(fresh))


def test_no_node_returns_the_job_fails_after_capacity_wait_keeping_committed_shards(cluster, kit_dir, tmp_path):
    first = cluster.add_node(num_cpus=1, num_gpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    lost = []

    def lose_the_node_once(record):
        if not lost:
            cluster.remove_node(first)
            lost.append(time.monotonic())

    spec = spec_for(kit_dir, tmp_path, "out", capacity_wait_s=3, shard_window=1)  # one shard held
    with pytest.raises(JobFailed, match="capacity"):
        JobRunner(spec, progress=False, on_commit=lose_the_node_once).run()
    import json

    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["shards"]["committed"] == 1 < summary["shards"]["total"]
    assert summary["shards"]["capacity_waits"][-1]["outcome"] == "timed out"
    assert "capacity_wait_s" in next(iter(summary["failed_shards"].values()))
    assert len(read_output(spec)) == 2  # the committed shard's rows


@ray.remote(num_cpus=0)
class Crashing:
    def crash(self) -> None:
        os._exit(1)  # the process dies mid-call, as a worker killed while decoding does


def test_a_result_read_after_its_workers_death_hands_that_worker_no_more_shards(cluster, kit_dir, tmp_path):
    """A worker dies holding two shards, one of which it had committed just before: the driver may
    read the failure first, and must then hand the dead worker no shard."""
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    spec = spec_for(kit_dir, tmp_path, "out")
    plan_shards = make_plan(spec, Storage(spec.storage)).shards[:2]
    committed = []
    pool = WorkerPool(spec, None, committed.append)
    pool.target = 0  # no replacement: this test is about the bookkeeping, not the restart
    worker = Crashing.remote()
    done = ray.put({"shard": plan_shards[1].id})  # the result it returned before dying
    lost = worker.crash.remote()
    pool.actors[0] = worker
    pool.free.extend([0, 0])  # its spare room in the window
    pool.inflight = {lost: (0, plan_shards[0]), done: (0, plan_shards[1])}
    pool.attempts = {s.id: 1 for s in plan_shards}
    ray.wait([lost], timeout=30)
    pool.on_finished(lost)  # the failure first: the worker is gone, its shard waits for a retry
    pool.on_finished(done)  # then the result it had sent: committed, and no room handed back
    assert committed == [{"shard": plan_shards[1].id}]
    assert 0 not in pool.actors and list(pool.free) == []
    assert [s.id for _, s in pool.delayed] == [plan_shards[0].id] and pool.report.retries == 1


def test_a_workers_death_and_a_shards_failure_are_said_cause_first_in_under_200_characters():
    from ray.exceptions import RayActorError

    from engine.runtime.pool import cause_line, first_line

    oom = RayActorError(error_msg="Task was killed due to the node running low on memory. " + "Memory details. " * 60
                        + "ray.exceptions.OutOfMemoryError: consider provisioning more memory on this node")
    assert cause_line(oom).startswith("out of memory") and len(cause_line(oom)) < 200
    assert cause_line(RayActorError()) == "its process exited unexpectedly"
    long = ValueError("chunk long#0030: " + "no speech codes to decode and more words " * 30)
    line = cause_line(long)
    assert len(line) < 200 and line.endswith(" ...") and line.startswith("chunk long#0030: no speech codes")
    assert not line[:-4].endswith(("wor", "decod"))  # cut at a word, not inside one
    assert first_line(ValueError("short")) == "short"
