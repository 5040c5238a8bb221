"""Jobs on a multi-node Ray cluster (ray.cluster_utils.Cluster, logical GPUs on CPU machines):
placement one worker per GPU, a worker process killed mid-job, a node removed mid-job."""

from __future__ import annotations

import collections
import json
import os
import signal

import pytest
import ray
from ray.cluster_utils import Cluster

from engine.runtime.actors import worker_options
from engine.runtime.job import JobRunner
from engine.runtime.pool import IdleWorkers
from engine.runtime.summary import summary_table

from jobhelpers import audio_ok, comparable, job_spec, read_output, texts, write_manifest


def gpu_nodes(cluster: Cluster, count: int, gpus: int) -> list:
    nodes = [cluster.add_node(num_cpus=gpus, num_gpus=gpus) for _ in range(count)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    return nodes


def gpu_spec(kit_dir, tmp_path, rows: int, workers: int, rows_per_shard: int = 2, dtype: str = "auto"):
    manifest = write_manifest(tmp_path / "m.jsonl", texts(rows))
    return job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"), models={"dtype": dtype},
                    resources={"workers": workers, "gpus_per_worker": 1, "cpus_per_worker": 1,
                               "rows_per_shard": rows_per_shard, "device": "cpu"})


def assert_each_row_once(spec, rows: int) -> None:
    out = read_output(spec)
    assert collections.Counter(r["id"] for r in out) == collections.Counter(f"u{i:03d}" for i in range(rows))
    assert all(audio_ok(r) for r in out)


def test_workers_are_placed_one_per_gpu(cluster, kit_dir, tmp_path):
    gpu_nodes(cluster, count=2, gpus=2)
    spec = gpu_spec(kit_dir, tmp_path, rows=16, workers=4)
    # warmup: no shard before every worker loaded, so each takes its fair share (2 of 8 shards)
    summary = JobRunner(spec, progress=False, warmup=True).run()
    placed = summary["placements"]  # every worker that loaded its models
    placements = {(w["node"], tuple(w["gpu_ids"])) for w in placed.values()}
    assert all(len(gpus) == 1 for _, gpus in placements)
    assert len(placements) == len(placed) == 4  # four distinct GPUs, no GPU shared
    assert len({node for node, _ in placements}) == 2
    assert {name: w["shards"] for name, w in summary["workers"].items()} == dict.fromkeys(placed, 2)
    for name, w in summary["workers"].items():  # each decoded where it loaded
        assert (w["node"], w["gpu_ids"]) == (placed[name]["node"], placed[name]["gpu_ids"])
    assert_each_row_once(spec, 16)
    # without warmup a worker that loads late may find every shard taken: the table names it
    late = {**summary, "placements": {**placed, "w4": placed["w0"]}}
    lines = [line for line in summary_table(late).splitlines() if line.startswith("worker ")]
    assert [line.split()[1] for line in lines] == ["w0", "w1", "w2", "w3", "w4"]
    assert ["no shard committed" in line for line in lines] == [False] * 4 + [True]


def test_a_worker_killed_holding_shards_is_replaced_and_they_are_redone_identically(cluster, kit_dir, tmp_path):
    gpu_nodes(cluster, count=1, gpus=2)
    killed = []

    def kill_once(record):
        # this shard and three uncommitted ones (8 shards: each worker holds its fair share, 4):
        # one more may commit before the kill lands, at least two are still held
        if not killed and record.pipeline.held >= 4:
            killed.append(record)
            os.kill(record.pid, signal.SIGKILL)  # a real crash of the worker process

    spec = gpu_spec(kit_dir, tmp_path, rows=16, workers=2, dtype="float64")
    summary = JobRunner(spec, progress=False, on_commit=kill_once).run()
    assert killed
    assert summary["shards"]["retries"] >= 2 and summary["shards"]["workers_replaced"] >= 1
    assert summary["shards"]["committed"] == summary["shards"]["total"] == 8
    assert_each_row_once(spec, 16)
    fresh = spec.model_copy(update={"output": spec.output.model_copy(update={"uri": str(tmp_path / "fresh")})})
    JobRunner(fresh, progress=False).run()
    assert comparable(read_output(spec)) == comparable(read_output(fresh))


def test_a_node_removed_mid_job_leaves_the_rest_to_finish(cluster, kit_dir, tmp_path):
    nodes = gpu_nodes(cluster, count=2, gpus=1)
    by_id = {n.node_id: n for n in nodes}
    removed = []

    def remove_node_once(record):
        if not removed:
            victim = next(n for nid, n in by_id.items() if nid != record.node)
            cluster.remove_node(victim)
            removed.append(victim.node_id)

    spec = gpu_spec(kit_dir, tmp_path, rows=12, workers=2)
    summary = JobRunner(spec, progress=False, on_commit=remove_node_once).run()
    assert removed
    assert summary["shards"]["committed"] == summary["shards"]["total"] == 6
    assert_each_row_once(spec, 12)


@ray.remote(num_cpus=0)
class Stub:
    """An actor that answers `configure` like a kept worker (only for IdleWorkers' bookkeeping)."""

    def configure(self, *args) -> dict:
        return {}


def test_idle_workers_keep_one_key_and_a_kept_worker_that_died_is_replaced(cluster, kit_dir, tmp_path):
    gpu_nodes(cluster, count=1, gpus=1)
    # the keeper's bookkeeping
    idle = IdleWorkers(concurrency=4)
    a, b, c = Stub.remote(), Stub.remote(), Stub.remote()
    assert idle.take("A", 4) is None  # nothing kept yet
    idle.give("A", a)
    idle.give("A", b)
    assert idle.take("A", 5) is None  # a job needing more threads than they were made with
    assert idle.take("A", 4) is b
    idle.give("B", c)  # another key than the kept ones': retired at once
    assert idle.take("B", 4) is None  # a job of key B: the kept worker of key A is retired
    for gone in (a, c):
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(gone.configure.remote(), timeout=30)
    assert ray.get(b.configure.remote(), timeout=30) == {}  # taken, so not retired by the keeper
    ray.kill(b)

    # a worker kept after one job and lost before the next
    spec = gpu_spec(kit_dir, tmp_path, rows=4, workers=1, dtype="float64")
    idle = IdleWorkers(worker_options(spec)["max_concurrency"])
    dead = Stub.remote()
    ray.kill(dead, no_restart=True)  # kept after a job, lost before the next (a node gone between points)
    assert idle.take(spec.worker_key, 0) is None
    idle.give(spec.worker_key, dead)
    try:
        summary = JobRunner(spec, progress=False, idle=idle).run()
        assert summary["shards"]["workers_reused"] == 0 and summary["shards"]["workers_replaced"] == 1
        assert summary["shards"]["committed"] == summary["shards"]["total"] == 2
        assert_each_row_once(spec, 4)
        assert len(idle.actors) == 1  # the replacement, kept for the next job
        other = spec.model_copy(update={
            "output": spec.output.model_copy(update={"uri": str(tmp_path / "again")}),
            "resources": spec.resources.model_copy(update={"batch_size": 2})})
        again = JobRunner(other, progress=False, idle=idle).run()
        assert again["shards"]["workers_reused"] == 1 and again["shards"]["workers_replaced"] == 0
        commits = [json.loads(f.read_text()) for f in (tmp_path / "again" / "_commits").glob("*.json")]
        assert len(commits) == 2 and {c["batch_size"] for c in commits} == {2}  # the new job's settings
        assert comparable(read_output(other)) == comparable(read_output(spec))  # as a fresh worker decodes
    finally:
        idle.close()


def test_sweep_over_worker_counts_produces_results_and_plots(cluster, kit_dir, tmp_path):
    import pyarrow.parquet as pq

    from engine.runtime.sweep import run_sweep, sweep_table

    gpu_nodes(cluster, count=2, gpus=1)
    manifest = write_manifest(tmp_path / "m.jsonl", texts(6))
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "sweep"), kind="sweep",
                    models={"dtype": "float64"},  # codes independent of the rows beside them: comparable across points
                    sweep={"workers": [1, 2], "batch_sizes": [2, 4], "methods": ["exact"], "gammas": [2]},
                    resources={"gpus_per_worker": 1, "cpus_per_worker": 1, "rows_per_shard": 1, "device": "cpu"})
    doc = run_sweep(spec, progress=False)
    table = pq.read_table(tmp_path / "sweep" / "sweep.parquet").to_pylist()
    assert len(table) == len(doc["runs"]) == 2 * 2  # workers x batch sizes
    assert {(r["workers"], r["batch_size"]) for r in table} == {(w, b) for w in (1, 2) for b in (2, 4)}
    for r in table:
        assert r["tokens_per_s"] > 0 and r["rows"] == 6 and r["steady_s"] > 0
        assert r["method"] == "exact" and r["gamma"] == "2" and r["mean_accepted_length"] >= 1
        assert r["speedup_vs_ar"] is None  # no `ar` point in this grid to compare with
        if r["workers"] == 1:
            assert r["scaling_efficiency"] == 1.0
        else:
            assert r["scaling_efficiency"] > 0
    assert {p.rsplit("/", 1)[-1] for p in doc["plots"]} == {"throughput_vs_workers.png", "throughput_vs_batch.png"}
    for p in doc["plots"]:
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # workers stay loaded between points (run order w1 b2, w1 b4, w2 b2, w2 b4): one worker
    # started for the first point, one more for the first with two; every other one was kept
    reused = {r["point"]: r["workers_reused"] for r in table}
    assert reused == {"models-w1-b2-exact-g2": 0, "models-w1-b4-exact-g2": 1,
                      "models-w2-b2-exact-g2": 1, "models-w2-b4-exact-g2": 2}
    outputs = {}  # and decode as fresh ones do: every point, whatever its workers, the same codes
    for r in table:
        rows = read_output(spec.model_copy(update={"output": spec.output.model_copy(
            update={"uri": str(tmp_path / "sweep" / "points" / f"{r['point']}-r0")})}))
        outputs[r["point"]] = sorted((x["id"], tuple(x["codes"]), x["finish_reason"]) for x in rows)
        assert r["rows_failed"] == 0 and r["rows_cut"] == sum(x["finish_reason"] == "length" for x in rows)
    assert len(next(iter(outputs.values()))) == 6 and len(set(map(tuple, outputs.values()))) == 1
    cut = table[0]["rows_cut"]
    assert 0 < cut < 6  # the kit's random end of speech: some rows reach the job's 16 tokens, some end before
    lines = sweep_table(table).splitlines()
    assert lines[0].split()[-2:] == ["cut", "failed"] and lines[2].split()[-2:] == [str(cut), "0"]
    assert lines[-1].startswith("cut: rows whose speech reached their token limit")
    again = run_sweep(spec, progress=False)  # every point done: nothing re-measured
    assert [r["tokens_per_s"] for r in again["runs"]] == [r["tokens_per_s"] for r in doc["runs"]]


def test_sweep_runs_repetitions_interleaved_and_compares_each_run_with_its_ar_run(kit_dir, tmp_path):
    from engine.runtime.sweep import add_speedup, point_id, points, schedule

    spec = job_spec(kit_dir, [str(tmp_path / "m.jsonl")], str(tmp_path / "sweep"), kind="sweep",
                    sweep={"batch_sizes": [1, 4], "methods": ["ar", "pcg"], "thetas": [0.4, 0.5],
                           "repetitions": 3})
    grid = points(spec)
    ids = [point_id(p) for p in grid]
    assert ids == ["models-w1-b1-ar", "models-w1-b1-pcg-g3-t0.4", "models-w1-b1-pcg-g3-t0.5",
                   "models-w1-b4-ar", "models-w1-b4-pcg-g3-t0.4", "models-w1-b4-pcg-g3-t0.5"]
    order = [(rep, point_id(p)) for rep, p in schedule(grid, 3)]
    assert order == [(0, i) for i in ids] + [(1, i) for i in reversed(ids)] + [(2, i) for i in ids]

    rows = [{"repetition": rep, "pair": "models", "workers": 1, "batch_size": p["batch_size"],
             "method": p["method"], "tokens_per_s": 10.0 * (rep + 1) * (1.5 if p["method"] == "pcg" else 1.0)}
            for rep, p in schedule(grid, 3)]
    rows.append({"repetition": 0, "pair": "other", "workers": 1, "batch_size": 1, "method": "pcg",
                 "tokens_per_s": 12.0})  # a pair without an `ar` run: nothing to compare with
    rows.append({"repetition": 1, "pair": "models", "workers": 1, "batch_size": 4, "method": "pcg",
                 "tokens_per_s": None})  # a run that measured no steady window
    add_speedup(rows)
    # each run against the `ar` run of its own repetition (whose rate differs: 10, 20, 30)
    assert [r["speedup_vs_ar"] for r in rows[:-2]] == [1.0 if r["method"] == "ar" else 1.5 for r in rows[:-2]]
    assert rows[-2]["speedup_vs_ar"] is None and rows[-1]["speedup_vs_ar"] == 0.0
