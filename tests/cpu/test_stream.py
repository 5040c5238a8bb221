"""The streaming worker without Ray: shards held together share one batch and one decoder, each
is written when its last row is done, and a slow store holds decoding back instead of piling up
decoded shards in memory."""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf
import torch

from engine import SynthesisItem
from engine.decoding.adaptive import PilotMeasures
from engine.io.manifest import ManifestRow
from engine.io.storage import Storage
from engine.runtime.commits import CommitRecord
from engine.runtime.plan import make_plan
from engine.runtime.stages.row import ShardTask
from engine.runtime.summary import per_worker
from engine.runtime.threads import on_short_thread, own_threads, thread_clock
from engine.runtime.worker import ShardProcessor

from jobhelpers import job_spec, texts, write_manifest

TEMPERATURES = [0.6, 0.8, 1.0, 1.2]


def manifest_with_temperatures(path: Path, n: int) -> tuple[Path, list[dict]]:
    rows = texts(n)
    for i, r in enumerate(rows):
        r["temperature"] = TEMPERATURES[i % len(TEMPERATURES)]
    return write_manifest(path, rows), rows


def run_shards(processor: ShardProcessor, spec, together: bool = False) -> list[CommitRecord]:
    """Submit every shard of the plan (all held at once, as an actor's window). `together`: the
    decode thread starts its first round only once all are prepared, so every shard is admitted
    before it and the rounds do not depend on how fast shards are read."""
    plan = make_plan(spec, processor.storage)
    gate = threading.Event()
    if together:
        processor.stream.on_decode_thread(gate.wait)
    try:
        futures = [processor.submit(s) for s in plan.shards]
    finally:
        gate.set()
    return [f.result(timeout=600) for f in futures]


def test_per_row_temperatures_share_one_decoder_and_match_the_api(kit_dir, kit_groups, synth64, tmp_path):
    manifest, rows = manifest_with_temperatures(tmp_path / "m.jsonl", 16)
    rows[5]["max_new_tokens"] = 3  # a per-row budget too, in the same batch
    write_manifest(manifest, rows)
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"),
                    models={"dtype": "float64"},
                    decoding={"method": "pcg", "max_new_tokens": 20, "seed": 3},
                    resources={"workers": 1, "batch_size": 8, "rows_per_shard": 4, "admission": "arrival"})
    processor = ShardProcessor(spec, kit_groups)
    try:
        records = run_shards(processor, spec, together=True)
    finally:
        processor.close()
    assert all(r.pipeline.decoders == 1 for r in records)  # 4 temperatures, one batch
    counters = [r.pipeline.counters for r in records]
    # no slot waited for another decoder's rows, nor for a shard (all admitted before round one)
    assert sum(c.split_slots + c.starved_slots for c in counters) == 0
    slot_rounds, slots = sum(c.slot_rounds for c in counters), sum(c.slots for c in counters)
    # 4 rows per temperature: a decoder per temperature would fill at most 4 slots of 8
    assert slot_rounds / slots > 0.5
    assert sum(c.decode_rounds for c in counters) < sum(r.rounds for r in records) / 4
    # the decode thread over its rounds: CPU time within their wall time, switches counted
    assert all(isinstance(c.decode_waits, int) and isinstance(c.decode_preempted, int) for c in counters)
    worker = per_worker([replace(r, worker="w0") for r in records])["w0"]
    assert 0 < worker["decode_cpu_s"] <= worker["decode_s"] * 1.05 + 0.05
    assert worker["decode_cpu_share"] == round(worker["decode_cpu_s"] / worker["decode_s"], 4)
    out = {}
    for r in records:
        for row in pq.read_table(r.data).to_pylist():
            out[row["id"]] = row["codes"]
    assert sorted(out) == [r["id"] for r in rows]
    assert 1 <= len(out[rows[5]["id"]]) <= 3
    synth = synth64  # the API's float64 Synthesizer, holding the same groups
    items = [SynthesisItem(text=r["text"], id=r["id"], temperature=r["temperature"],
                           max_new_tokens=r.get("max_new_tokens")) for r in rows]
    # the rest of the empty slots is the end of the work: exactly as many as one batch of these
    # rows leaves when they are all given at once (the shards' split costs nothing)
    together, one_batch = synth.synthesize(items, spec.decoding, batch_size=8, admission="arrival")
    assert (slot_rounds, slots) == (one_batch.slot_rounds, one_batch.decode_rounds * 8)
    assert {r.id: r.codes for r in together} == out
    results, _ = synth.synthesize(items, spec.decoding, batch_size=3, admission="arrival")
    assert {r.id: r.codes for r in results} == out  # seeds from ids, not from scheduling or order


SPIN_CPU_S = 0.05  # CPU seconds the running thread spends, by its own clock


def test_thread_clock_tells_waiting_from_running():
    """Decided by the thread's own clock and switch counts, not by wall time: a thread that spins
    until its clock has counted `SPIN_CPU_S` gets there (the clock counts running), and ten sleeps
    cost less CPU than that (it does not count waiting), each a voluntary switch."""
    def measure(work) -> tuple[float, int, int]:
        box = {}

        def target() -> None:  # on a thread of its own, as the decode loop
            before = thread_clock()
            box["work"] = work(before[0])
            after = thread_clock()
            box["out"] = (after[0] - before[0], after[1] - before[1], after[2] - before[2])
        t = threading.Thread(target=target)
        t.start()
        t.join()
        return (*box["out"], box["work"])

    def spin(start_cpu: float) -> int:
        turns = 0
        while thread_clock()[0] - start_cpu < SPIN_CPU_S:
            turns += 1
        return turns

    def nap(_: float) -> int:
        for _ in range(10):
            time.sleep(0.001)
        return 10

    sleeping, sleep_waits, _, naps = measure(nap)
    spinning, spin_waits, _, turns = measure(spin)
    assert turns > 0 and spinning >= SPIN_CPU_S  # the clock advanced while the thread ran
    assert sleeping < SPIN_CPU_S  # ten sleeps: far less CPU than the spin, whatever they lasted
    if hasattr(resource, "RUSAGE_THREAD"):  # Linux: per-thread switch counts
        assert sleep_waits >= naps > spin_waits  # every sleep is a voluntary switch; the spin has few


class HeldStorage(Storage):
    """A slow store without a clock: its first data-file upload is held until `until()` says
    so; records the order of writes, and whether the hold ended by `until` (not its timeout)."""

    def __init__(self) -> None:
        super().__init__()
        self.until: Callable[[], bool] = lambda: True
        self.held, self.ended_by_until, self.writes = False, False, []
        self.lock = threading.Lock()

    def write_bytes(self, uri: str, data: bytes) -> None:
        if uri.endswith(".parquet") and not self.held:
            self.held = True
            deadline = time.monotonic() + 120  # a bound on a broken run only: nothing is timed
            while not self.until() and time.monotonic() < deadline:
                time.sleep(0.01)
            self.ended_by_until = self.until()
        super().write_bytes(uri, data)
        with self.lock:
            self.writes.append(uri.rsplit("/", 1)[-1])


@pytest.mark.parametrize("io_queue", [1])
def test_slow_storage_holds_decoding_back_and_bounds_waiting_shards(kit_dir, tmp_path, io_queue):
    """The first upload is held until the decode thread hands a shard to a full IO queue, so it
    must wait for the writer: decided by what the queue holds, not by how long anything took."""
    manifest = write_manifest(tmp_path / "m.jsonl", texts(12))
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"),
                    decoding={"method": "exact", "max_new_tokens": 6, "seed": 1},
                    resources={"workers": 1, "batch_size": 4, "rows_per_shard": 2})
    storage = HeldStorage()
    processor = ShardProcessor(spec, storage=storage, io_queue=io_queue)
    io, queue_put = processor.stream.io, processor.stream.io.put
    handing = []  # shards the decode thread is handing to the IO queue right now

    def put(item, *args, **kwargs):
        if not isinstance(item, ShardTask):
            return queue_put(item, *args, **kwargs)
        handing.append(item)
        try:
            return queue_put(item, *args, **kwargs)
        finally:
            handing.remove(item)

    io.put = put
    storage.until = lambda: bool(handing) and io.full()  # decoding waits for the writer
    try:
        records = run_shards(processor, spec)
    finally:
        processor.close()
    assert len(records) == 6
    assert storage.ended_by_until  # decoding waited for the writer (the held upload)
    # decoded shards in memory: one being written, `io_queue` queued, one blocked handing off
    assert max(r.pipeline.io_backlog_max for r in records) == io_queue + 2
    for r in records:  # every commit record after its data file
        shard = r.shard
        assert storage.writes.index(f"{shard}.json") > storage.writes.index(f"{shard}.parquet")


def test_a_failing_write_fails_only_its_shard(kit_dir, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", texts(6))
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"),
                    decoding={"method": "exact", "max_new_tokens": 6, "seed": 1},
                    resources={"workers": 1, "batch_size": 4, "rows_per_shard": 2})

    class Flaky(Storage):
        def write_bytes(self, uri: str, data: bytes) -> None:
            if uri.endswith("shard-00001.parquet"):
                raise OSError("disk full")
            super().write_bytes(uri, data)

    processor = ShardProcessor(spec, storage=Flaky())
    try:
        plan = make_plan(spec, processor.storage)
        futures = [processor.submit(s) for s in plan.shards]
        with pytest.raises(OSError, match="disk full"):
            futures[1].result(timeout=600)
        assert [futures[i].result(timeout=600).shard for i in (0, 2)] == ["shard-00000", "shard-00002"]
        again = processor.process(plan.shards[0], attempt=2)  # the worker goes on
        assert again.rows == 2
    finally:
        processor.close()
    assert not (tmp_path / "out" / "_commits" / "shard-00001.json").exists()



def test_empty_slots_are_told_apart_by_cause(kit_dir, tmp_path):
    """A worker whose second shard arrives only after its first is done: the first shard's empty
    slots turn out to have been waiting for a shard (reported with the second), the second's,
    with nothing after it, are the end of the work; the summary gives both as shares."""
    from engine.runtime.summary import utilisation

    manifest = write_manifest(tmp_path / "m.jsonl", texts(8))
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"),
                    decoding={"method": "exact", "max_new_tokens": 8, "seed": 1},
                    resources={"workers": 1, "batch_size": 8, "rows_per_shard": 4})
    processor = ShardProcessor(spec)
    try:
        plan = make_plan(spec, processor.storage)
        first = processor.submit(plan.shards[0]).result(timeout=600)
        second = processor.submit(plan.shards[1]).result(timeout=600)
    finally:
        processor.close()
    one, two = first.pipeline.counters, second.pipeline.counters
    first_empty = one.slots - one.slot_rounds
    second_empty = two.slots - two.slot_rounds
    assert first_empty >= 4 * one.decode_rounds > 0  # 4 rows in 8 slots
    assert one.starved_slots == 0 and one.split_slots == 0  # not known yet at its commit
    assert two.starved_slots == first_empty and two.split_slots == 0
    empty = utilisation([first, second], synth_s=1.0, workers=1)["empty_slots"]
    slots = one.slots + two.slots
    assert empty == {"waiting_for_shards": round(first_empty / slots, 4), "other_decoders": 0.0,
                     "end_of_work": round(second_empty / slots, 4)}


def test_worker_warms_up_on_the_threads_that_decode_and_write(kit_dir, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", texts(4))
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"),
                    decoding={"method": "exact", "max_new_tokens": 4, "seed": 1},
                    resources={"workers": 1, "batch_size": 2, "rows_per_shard": 2})
    processor = ShardProcessor(spec)
    seen: dict[str, set] = {"warmup": set(), "step": set(), "codec": set(), "encode": set(), "export": set()}

    def on(key, fn):  # the real function, noting which thread ran it
        def run(*args, **kwargs):
            seen[key].add(threading.current_thread().name)
            return fn(*args, **kwargs)
        return run
    processor.synth.warmup = on("warmup", processor.synth.warmup)
    session = processor.stages.decode.session
    session.step = on("step", session.step)
    processor.codec.decode = on("codec", processor.codec.decode)
    processor.codec.encode = on("encode", processor.codec.encode)
    processor.stages.write.table_bytes = on("export", processor.stages.write.table_bytes)
    clip = tmp_path / "voice.wav"
    sf.write(clip, np.sin(np.arange(8000) / 7.0).astype(np.float32) * 0.3, 16000)
    shard = make_plan(spec, processor.storage).shards[0]
    row = ManifestRow(id="v", text="With a voice.", prompt_text="A voice.", prompt_audio=str(clip))
    try:
        processor.warmup()
        assert seen["warmup"] == {"decode"} and seen["codec"] == {"shard-io"}
        # a shard's export ran on the IO thread (its libraries' first use), writing nothing
        assert seen["export"] == {"shard-io"} and not (tmp_path / "out").exists()
        threads = {"decode": processor.stream.on_decode_thread(torch.get_num_threads).result(),
                   "io": processor.stream.on_io_thread(torch.get_num_threads).result()}
        with ThreadPoolExecutor(1) as fresh:  # torch's default for new threads is left as it was
            threads["new"] = fresh.submit(torch.get_num_threads).result()
        assert processor.stages.prepare.voice_prompt(shard.manifest, row)[0].codes  # a clip is encoded on the IO thread
        records = run_shards(processor, spec)
    finally:
        processor.close()
    assert len(records) == 2
    assert seen["step"] == {"decode"} and seen["codec"] == {"shard-io"}  # the job ran where it warmed up
    assert seen["encode"] == {"shard-io"}
    # only the decode thread runs torch ops on several CPU threads (the constructing thread's count)
    assert threads == {"decode": torch.get_num_threads(), "io": 1, "new": torch.get_num_threads()}
    assert records[0].torch_threads == records[0].numerics["threads"] == torch.get_num_threads()


def test_own_threads_outlast_a_later_change_of_the_default():
    """torch sets a thread's count from a process-wide default at its first parallel op; a thread
    that set its own before that would otherwise take whatever another thread set meanwhile."""
    before = torch.get_num_threads()
    set_here, changed, seen = threading.Event(), threading.Event(), []

    def worker():
        own_threads(2)
        set_here.set()
        changed.wait()
        seen.append(torch.get_num_threads())

    t = threading.Thread(target=worker, daemon=True)
    t.start()
    try:
        assert set_here.wait(60)
        torch.set_num_threads(1)  # the default, changed by another thread (as the IO thread does)
    finally:
        changed.set()
        t.join(60)
        torch.set_num_threads(before)
    assert seen == [2]


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="counts threads in /proc (Linux)")
def test_a_short_thread_takes_its_openmp_threads_with_it():
    """Model loading runs on a short thread so that its OpenMP helpers end with it (otherwise they
    outlive it beside the decode thread's, and on a small machine every team then sleeps between
    ops: runtime/stream.py)."""
    def tasks() -> set[str]:
        return {t.name for t in Path("/proc/self/task").iterdir()}

    before = tasks()
    inside = []

    def load():
        torch.set_num_threads(2)
        x = torch.ones(512, 512)
        for _ in range(3):
            (x @ x).sum()
        inside.append(tasks() - before)
        return 7

    default = torch.get_num_threads()
    try:
        assert on_short_thread(load) == 7
    finally:
        torch.set_num_threads(default)
    assert inside[0], "the parallel ops started no thread: nothing to check"
    deadline = time.time() + 10
    while tasks() - before and time.time() < deadline:
        time.sleep(0.05)
    assert not tasks() - before  # the short thread and its OpenMP helpers are gone


def test_a_worker_profiles_the_rounds_asked_and_writes_them_with_a_shard(kit_dir, tmp_path):
    """`profile`: rounds `skip ..` of the decode loop, its own ops only, reduced to figures per
    round and named by the commit record of the shard decoded when it finished; a profile
    asking for more rounds than the worker runs ends when the batch runs empty."""
    import gzip
    import json

    manifest = write_manifest(tmp_path / "m.jsonl", texts(8))
    figures = {}
    for name, profile in (("some", {"rounds": 3, "skip": 2, "trace": True}), ("all", {"rounds": 100_000})):
        spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / name),
                        decoding={"method": "exact", "max_new_tokens": 12, "seed": 1},
                        resources={"workers": 1, "batch_size": 4, "rows_per_shard": 4}, profile=profile)
        processor = ShardProcessor(spec)
        try:
            records = run_shards(processor, spec)
        finally:
            processor.close()
        named = [r.profile for r in records if r.profile is not None]
        assert len(named) == 1 and named[0] == str(tmp_path / name / "_profiles" / f"w0-{os.getpid()}.json")
        rounds = sum(r.pipeline.counters.decode_rounds for r in records)
        figures[name] = (json.loads(Path(named[0]).read_text()), rounds)
    some, _ = figures["some"]
    assert (some["rounds"], some["skipped_rounds"], some["worker"]) == (3, 2, "w0")
    spread = some["round_ms"]
    assert 0 < spread["median"] <= spread["max"] and spread["mean"] <= spread["max"]
    assert 0 < some["in_torch_ops_ms_per_round"] <= spread["mean"]
    assert some["between_ops_ms_per_round"] == pytest.approx(spread["mean"] - some["in_torch_ops_ms_per_round"],
                                                             abs=1e-3)
    names = [op["name"] for op in some["top_ops"]]
    assert any(n.startswith("aten::") for n in names) and some["torch_ops_per_round"] > 10
    assert "device_ms_per_round" not in some  # CPU: no device figures
    trace = json.loads(gzip.decompress(Path(some["trace"]).read_bytes()))
    assert sum(e.get("name") == "pcg_synth.round" for e in trace["traceEvents"]) == 3
    everything, rounds_run = figures["all"]
    assert everything["asked_rounds"] == 100_000 and everything["rounds"] == rounds_run > 3
    assert "trace" not in everything


def test_a_profile_is_reduced_between_rounds_not_inside_one():
    """The round that completes a profile's rounds does not reduce it (on a GPU that took longer
    than the rounds themselves, inside a round it would count as decoding time): the profile is
    `due`, the loop calls `finish()` outside its timed round, and later rounds are not recorded."""
    from engine.runtime.profiling import RoundProfiler

    profiler = RoundProfiler(2, skip=1)
    states = []
    for _ in range(5):
        with profiler.round():
            torch.ones(8) @ torch.ones(8)
        states.append((profiler.due, profiler.done is not None))
        if profiler.due:
            profiler.finish()
    assert states == [(False, False), (False, False), (True, False), (False, True), (False, True)]
    profile = profiler.take()
    assert profile["rounds"] == 2 and profile["skipped_rounds"] == 1 and profile["torch_ops_per_round"] >= 1


def test_loaded_models_serve_another_job_as_fresh_ones_and_other_models_are_refused(kit_dir, tmp_path):
    """A sweep's next point on the same worker (`ShardProcessor.reuse`): other batch size, other
    output, the same codes as before; a job needing the models in another precision is refused
    before the worker changes, which still serves its job."""
    from jobhelpers import read_output

    manifest = write_manifest(tmp_path / "m.jsonl", texts(6))
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "a"), models={"dtype": "float64"},
                    decoding={"method": "exact", "max_new_tokens": 8, "seed": 1},
                    resources={"workers": 1, "batch_size": 2, "rows_per_shard": 3})

    def job(output: str, **resources):
        return spec.model_copy(update={"output": spec.output.model_copy(update={"uri": str(tmp_path / output)}),
                                       "resources": spec.resources.model_copy(update=resources)})

    def codes(s) -> list:
        return sorted((r["id"], tuple(r["codes"])) for r in read_output(s))

    def decode_thread(p) -> int:
        return p.stream.on_decode_thread(threading.get_ident).result()

    processor = ShardProcessor(spec)
    try:
        run_shards(processor, spec)
        models, first_thread = processor.models, decode_thread(processor)
        processor.synth.pilot.measured[("measured", 2)] = PilotMeasures(0.5, 0.0, {})  # as a pilot leaves it
        processor = processor.reuse(job("b", batch_size=4), worker_id="w1")
        assert processor.models is models and processor.synth.batch_size == 4
        # the next job decodes on the same thread (a thread's CUDA-graph trees are its own)
        assert decode_thread(processor) == first_thread == models.decode_thread.thread.ident
        assert processor.synth.pilot.measured == {}  # the next job measures for itself
        records = run_shards(processor, processor.spec)
        assert {r.worker for r in records} == {"w1"} and {r.batch_size for r in records} == {4}
        assert codes(processor.spec) == codes(spec) and len(codes(spec)) == 6
        other = processor.spec.model_copy(update={"models": spec.models.model_copy(update={"dtype": "float32"})})
        with pytest.raises(ValueError, match="other models"):
            processor.reuse(other)
        again = run_shards(processor, processor.spec)  # still serving: threads not closed by the refusal
        assert [r.generated_tokens for r in again] == [r.generated_tokens for r in records]
    finally:
        processor.close()
    assert models.decode_thread.thread is None and not any(t.ident == first_thread for t in threading.enumerate())
