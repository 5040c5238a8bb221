"""A shard's commit record (`engine/runtime/commits.py`): read back exactly as written, records of
older versions loaded with the summary's fallbacks, keys of newer ones kept, and a job's summary
over a fixed set of records pinned key for key."""

from __future__ import annotations

import json

import pytest

from engine.config import JobSpec
from engine.runtime.commits import CommitRecord, Counters
from engine.runtime.plan import Plan, Shard, make_plan
from engine.runtime.pool import PoolReport
from engine.runtime.summary import commit_span, summarize

from jobhelpers import job_spec, texts, write_manifest

# as the write stage writes it today, every part that applies only sometimes present
CURRENT = {
    "shard": "shard-00000", "manifest": "/in/m.jsonl", "rows": 4, "ok": 2, "failed": 1, "rejected": 1,
    "failed_rows": [{"id": "r002", "error": "text: text is empty"}], "cut": 1, "audio_seconds": 3.52,
    "generated_tokens": 120, "rounds": 50, "emitted": 110, "reached": [40, 30, 20], "accepted": [30, 20, 10],
    "thinning_trials": 7, "codec_s": 0.125, "wall_s": 2.5, "attempt": 1, "batch_size": 4,
    "decode_rounds": 30, "slot_rounds": 100, "slots": 120, "starved_slots": 8, "split_slots": 4,
    "decode_s": 1.5, "decode_cpu_s": 1.25, "decode_waits": 12, "decode_preempted": 3, "io_wait_s": 0.05,
    "verify_wait_s": 0.2, "finalise_s": 0.4, "overlap_s": 0.3, "busy_s": 2.25, "held": 2, "decoders": 1,
    "io_backlog_max": 1,
    "gamma_choices": [{"gamma": 3, "batch_size": 4, "acceptance": 0.6, "predicted_speedup": {"3": 1.8},
                       "step_times": {}, "host_s_per_round": 0.001, "drain": {}, "reason": "best predicted speedup"}],
    "quality": {"checked": 5, "passed": 4, "rejected": 1, "dropped": 0, "regenerated": 1, "decodes": 7,
                "verify_s": 0.75},
    "rejects": "/out/rejects/shard-00000.parquet",
    "split_rows": 1, "chunks": 3, "word_split_rows": 1, "word_cuts": 2, "chunk_retries": 1, "written_rows": 6,
    "data": "/out/data/shard-00000.parquet", "format": "hf-parquet", "files": ["/out/data/shard-00000.parquet"],
    "errors": None, "worker": "w0", "host": "node-a", "pid": 4242, "node": "n0", "gpu_ids": ["0"], "device": "cuda",
    "torch_threads": 4, "numerics": {"device": "cuda", "dtype": "float32", "threads": 4, "compile": "none"},
    "omp_wait_policy": "PASSIVE", "malloc": {"left": "not tuned in this process"},
    "round_stats": {"mode": "none", "rounds": 30, "graph_launches": 0, "host_s": 0.9, "device_s": 0.0,
                    "compiles": 0, "compile_s": 0.0, "cache_hits": 0, "ops_per_round": None, "plans": [],
                    "compile_failed": None, "host_ms_per_round": 30.0, "device_ms_per_round": None},
    "storage_retries": 1, "profile": "/out/_profiles/w0-4242.json", "committed_at": 1700000010.5,
    "lease_generation": 2,
}
# the gate off, no row split, no profile, written unfenced: the keys that apply only then left out
PLAIN = {
    "shard": "shard-00001", "manifest": "/in/m.jsonl", "rows": 3, "ok": 3, "failed": 0, "rejected": 0,
    "failed_rows": [], "cut": 0, "audio_seconds": 2.25, "generated_tokens": 90, "rounds": 40, "emitted": 85,
    "reached": [30, 25], "accepted": [25, 15], "thinning_trials": 3, "codec_s": 0.1, "wall_s": 1.75, "attempt": 2,
    "batch_size": 4, "decode_rounds": 20, "slot_rounds": 60, "slots": 80, "starved_slots": 0, "split_slots": 2,
    "decode_s": 1.0, "decode_cpu_s": 0.875, "decode_waits": 4, "decode_preempted": 0, "io_wait_s": 0.0,
    "verify_wait_s": 0.0, "finalise_s": 0.25, "overlap_s": 0.125, "busy_s": 1.5, "held": 1, "decoders": 1,
    "io_backlog_max": 1, "gamma_choices": [], "data": "/out/data/shard-00001.parquet", "format": "hf-parquet",
    "files": ["/out/data/shard-00001.parquet"], "errors": None, "worker": "w1", "host": "node-b", "pid": 77,
    "node": "n1", "gpu_ids": [], "device": "cpu", "torch_threads": 2,
    "numerics": {"device": "cpu", "dtype": "float32", "threads": 2, "compile": "none"}, "omp_wait_policy": None,
    "malloc": {"left": "not tuned in this process"}, "round_stats": None, "storage_retries": 0,
    "committed_at": 1700000011.25,
}
# as an early version wrote it: none of the pipeline's later figures, no gate, no commit time
OLD = {
    "shard": "shard-00002", "manifest": "/in/m.jsonl", "rows": 2, "ok": 1, "failed": 1,
    "failed_rows": [{"id": "r009", "error": "no audio"}], "audio_seconds": 1.5, "generated_tokens": 40,
    "rounds": 20, "emitted": 38, "reached": [15, 10, 5], "accepted": [10, 5, 2], "thinning_trials": 1,
    "codec_s": 0.05, "wall_s": 1.25, "attempt": 1, "batch_size": 4, "decode_rounds": 10, "slot_rounds": 20,
    "decode_s": 0.75, "io_wait_s": 0.01, "finalise_s": 0.2, "overlap_s": 0.1, "data": "/out/data/shard-00002.parquet",
    "worker": "w0", "host": "node-a", "pid": 4242, "node": "n0", "gpu_ids": ["0"], "device": "cuda",
}


def spec_and_plan() -> tuple[JobSpec, Plan]:
    spec = JobSpec.model_validate({
        "name": "fixed", "models": {"target": "/k/target", "draft": "/k/draft", "codec": "/k/codec"},
        "decoding": {"method": "pcg", "max_new_tokens": 16, "seed": 1}, "input": {"manifests": ["/in/m.jsonl"]},
        "output": {"uri": "/out"}, "quality": {"min_duration_s": 0.1},
        "resources": {"workers": 2, "batch_size": 4, "rows_per_shard": 4}})
    plan = Plan(shards=[Shard(f"shard-0000{i}", "/in/m.jsonl", 4 * i, 4 * i + 4) for i in range(4)], rows=13,
                manifests=["/in/m.jsonl"], fingerprint="f")
    return spec, plan


@pytest.mark.parametrize("written", [CURRENT, PLAIN], ids=["every-part", "plain"])
def test_a_record_reads_back_and_writes_again_key_for_key(written):
    record = CommitRecord.from_dict(written)
    assert record.to_dict() == written and list(record.to_dict()) == list(written)  # the same keys, in order
    assert json.dumps(record.to_dict(), indent=1) == json.dumps(written, indent=1)
    assert record.extra == {}


def test_the_parts_of_a_record_are_typed():
    record = CommitRecord.from_dict(CURRENT)
    counters = record.pipeline.counters
    assert (counters.slots, counters.starved_slots, counters.busy_s) == (120, 8, 2.25)
    assert record.quality.verify_s == 0.75 and record.rejects == "/out/rejects/shard-00000.parquet"
    assert record.split.word_cuts == 2 and record.written_rows == 6
    assert [(r.id, r.error) for r in record.failed_rows] == [("r002", "text: text is empty")]
    plain = CommitRecord.from_dict(PLAIN)
    assert plain.quality is None and plain.split is None and plain.written_rows is None and plain.profile is None
    assert plain.lease_generation is None and plain.pipeline.empty_slots_counted


def test_an_older_record_loads_with_the_summarys_fallbacks():
    record = CommitRecord.from_dict(OLD)
    counters = record.pipeline.counters
    assert counters.slots == OLD["decode_rounds"] * OLD["batch_size"]  # slots: every slot of every round
    assert counters.busy_s == OLD["wall_s"]  # a worker busy for the shard's wall time
    assert not record.pipeline.empty_slots_counted  # the summary gives no empty slots for it
    assert (counters.decode_cpu_s, counters.decode_waits, counters.verify_wait_s) == (0.0, 0, 0.0)
    assert (record.rejected, record.cut, record.storage_retries, record.pipeline.gamma_choices) == (0, 0, 0, [])
    assert record.committed_at is None and record.quality is None and record.split is None
    again = record.to_dict()
    assert {k: again[k] for k in OLD} == OLD  # nothing it had is lost
    # what it lacked where presence has a meaning stays absent: no empty slots, no commit time
    assert not {"starved_slots", "split_slots", "committed_at", "quality", "rejects", "split_rows",
                "written_rows", "profile", "lease_generation"} & set(again)
    spec, plan = spec_and_plan()
    rewritten = CommitRecord.from_dict(again)
    assert summarize(spec, plan, [rewritten], [rewritten], None, 0, 5.0) == \
        summarize(spec, plan, [record], [record], None, 0, 5.0)


def test_keys_of_a_newer_version_survive_a_rewrite():
    newer = {**CURRENT, "future_figure": {"kind": "new", "n": 3}, "future_flag": True}
    record = CommitRecord.from_dict(newer)
    assert record.extra == {"future_figure": {"kind": "new", "n": 3}, "future_flag": True}
    assert record.to_dict() == newer and list(record.to_dict()) == list(newer)


def test_a_record_without_a_key_every_record_has_is_refused():
    with pytest.raises((KeyError, TypeError)):
        CommitRecord.from_dict({k: v for k, v in PLAIN.items() if k != "wall_s"})
    with pytest.raises(TypeError):
        CommitRecord.from_dict({k: v for k, v in PLAIN.items() if k != "generated_tokens"})


def test_counters_take_differences_of_their_declared_types():
    later = Counters(decode_rounds=5, slots=20, decode_s=1.23456, decode_waits=7, busy_s=2.0)
    earlier = Counters(decode_rounds=2, slots=8, decode_s=0.5, decode_waits=3, busy_s=0.5)
    step = later.since(earlier)
    assert (step.decode_rounds, step.slots, step.decode_waits) == (3, 12, 4)
    assert all(isinstance(v, int) for v in (step.decode_rounds, step.slots, step.decode_waits, step.starved_slots))
    assert isinstance(step.io_wait_s, float) and step.busy_s == 1.5
    assert step.rounded(2).decode_s == 0.73 and step.rounded(2).decode_rounds == 3


SUMMARY = {'job': 'fixed',
 'output': '/out',
 'fingerprint': 'f',
 'method': 'pcg',
 'rows': 13,
 'rows_ok': 6,
 'rows_failed': 2,
 'rows_rejected': 1,
 'rows_cut': 1,
 'rows_committed': 9,
 'rows_split': 1,
 'chunks': 3,
 'chunk_rows': 6,
 'rows_split_at_words': 1,
 'word_cuts': 2,
 'chunk_retries': 1,
 'audio_seconds': 7.27,
 'audio_hours': 0.00202,
 'generated_tokens': 250,
 'target_calls': 110,
 'acceptance_per_position': [0.7647, 0.6154, 0.48],
 'mean_accepted_length': 2.1182,
 'thinning_trials': 11,
 'shards': {'total': 4,
            'committed': 3,
            'committed_before': 1,
            'run_now': 2,
            'retries': 2,
            'workers_replaced': 1,
            'workers_reused': 0,
            'failed': 1,
            'capacity_waits': [{'waited_s': 3.0, 'outcome': 'nodes joined'}]},
 'failed_shards': {'shard-00003': 'its process was killed'},
 'output_format': 'hf-parquet',
 'failed_examples': [{'id': 'r002', 'error': 'text: text is empty', 'shard': 'shard-00000'},
                     {'id': 'r009', 'error': 'no audio', 'shard': 'shard-00002'}],
 'wall_s': 10.0,
 'setup_s': 2.0,
 'throughput': {'tokens_per_s': 26.25, 'audio_s_per_s': 0.721, 'rows_per_s': 0.875},
 'workers': {'w0': {'shards': 1,
                    'rows': 4,
                    'generated_tokens': 120,
                    'audio_seconds': 3.52,
                    'decode_s': 1.5,
                    'decode_cpu_s': 1.25,
                    'codec_s': 0.125,
                    'busy_s': 2.25,
                    'io_wait_s': 0.05,
                    'finalise_s': 0.4,
                    'overlap_s': 0.3,
                    'decode_rounds': 30,
                    'decode_waits': 12,
                    'decode_preempted': 3,
                    'decoders': 1,
                    'node': 'n0',
                    'gpu_ids': ['0'],
                    'device': 'cuda',
                    'host': 'node-a',
                    'torch_threads': 4,
                    'omp_wait_policy': 'PASSIVE',
                    'malloc': {'left': 'not tuned in this process'},
                    'rounds': {'mode': 'none',
                               'rounds': 30,
                               'graph_launches': 0,
                               'host_s': 0.9,
                               'device_s': 0.0,
                               'compiles': 0,
                               'compile_s': 0.0,
                               'cache_hits': 0,
                               'ops_per_round': None,
                               'plans': [],
                               'compile_failed': None,
                               'host_ms_per_round': 30.0,
                               'device_ms_per_round': None},
                    'tokens_per_s': 80.0,
                    'slot_utilisation': 0.8333,
                    'overlap': 0.75,
                    'decode_cpu_share': 0.8333},
             'w1': {'shards': 1,
                    'rows': 3,
                    'generated_tokens': 90,
                    'audio_seconds': 2.25,
                    'decode_s': 1.0,
                    'decode_cpu_s': 0.875,
                    'codec_s': 0.1,
                    'busy_s': 1.5,
                    'io_wait_s': 0.0,
                    'finalise_s': 0.25,
                    'overlap_s': 0.125,
                    'decode_rounds': 20,
                    'decode_waits': 4,
                    'decode_preempted': 0,
                    'decoders': 1,
                    'node': 'n1',
                    'gpu_ids': [],
                    'device': 'cpu',
                    'host': 'node-b',
                    'torch_threads': 2,
                    'omp_wait_policy': None,
                    'malloc': {'left': 'not tuned in this process'},
                    'rounds': None,
                    'tokens_per_s': 90.0,
                    'slot_utilisation': 0.75,
                    'overlap': 0.5,
                    'decode_cpu_share': 0.875}},
 'placements': {'w0': {'node': 'n0', 'host': 'node-a', 'gpu_ids': ['0'], 'device': 'cuda'}},
 'utilisation': {'worker_busy_fraction': 0.2344,
                 'slot_utilisation': 0.8,
                 'empty_slots': {'waiting_for_shards': 0.04, 'other_decoders': 0.03, 'end_of_work': 0.13},
                 'io_wait_s': 0.05,
                 'overlap': 0.6538,
                 'finalise_s': 0.65,
                 'shard_window': 19,
                 'admission': 'longest_first'},
 'gamma_auto': [{'worker': 'w0',
                 'batch_size': 4,
                 'gamma': 3,
                 'acceptance': 0.6,
                 'reason': 'best predicted speedup'}],
 'numerics': [{'device': 'cuda', 'dtype': 'float32', 'threads': 4, 'compile': 'none', 'shards': 1},
              {'device': 'cpu', 'dtype': 'float32', 'threads': 2, 'compile': 'none', 'shards': 1}],
 'storage_retries': 1,
 'steady': {'wall_s': 4.0, 'tokens_per_s': 52.5, 'audio_s_per_s': 1.442},
 'profiles': ['/out/_profiles/w0-4242.json'],
 'quality': {'checked': 5,
             'passed': 4,
             'rejected': 1,
             'dropped': 0,
             'regenerated': 1,
             'decodes': 7,
             'verify_s': 0.75,
             'verify_s_per_row': 0.15,
             'verify_wait_s': 0.2,
             'checks': ['min_duration_s'],
             'asr': None,
             'speaker': None,
             'attempts': 1,
             'best_of': 1,
             'on_reject': 'rejects',
             'rejects': ['/out/rejects/shard-00000.parquet']},
 'rounds': {'modes': ['none'],
            'rounds': 30,
            'graph_launches': 0,
            'host_s': 0.9,
            'device_s': 0.0,
            'compiles': 0,
            'compile_s': 0.0,
            'cache_hits': 0,
            'compile_failed': [],
            'host_ms_per_round': 30.0,
            'device_ms_per_round': None}}


def test_a_summary_over_fixed_records_is_what_it_always_was():
    """The summary's record figures over a current record of every part, a plain one and an
    older one (committed before this run), pinned key for key and in order as summary.json
    writes them."""
    spec, plan = spec_and_plan()
    report = PoolReport(failed={"shard-00003": "its process was killed"}, retries=2, replaced=1,
                        capacity_waits=[{"waited_s": 3.0, "outcome": "nodes joined"}], first_dispatch=100.0,
                        last_commit=104.0,
                        placements={"w0": {"node": "n0", "host": "node-a", "gpu_ids": ["0"], "device": "cuda"}})
    records = [CommitRecord.from_dict(d) for d in (CURRENT, PLAIN, OLD)]
    summary = summarize(spec, plan, records, records[:2], report, 1, 10.0, 2.0)
    del summary["decoding"]  # the spec's settings, not the records'
    assert json.dumps(summary) == json.dumps(SUMMARY)
    # a driver that finds every shard committed: the span of the commit times, else the busiest worker's time
    assert commit_span(records[:2]) == pytest.approx(2.5 + 0.75)
    assert commit_span(records) == pytest.approx(2.25 + 1.25)


def test_a_written_record_reads_back_as_its_worker_made_it(kit_dir, tmp_path):
    """A shard through a worker's pipeline: its record on disk is `to_dict()` of the record the
    worker returns, and reading it back and writing it again gives the same bytes."""
    from engine.runtime.worker import ShardProcessor

    manifest = write_manifest(tmp_path / "m.jsonl", texts(2))
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"),
                    decoding={"method": "exact", "max_new_tokens": 4, "seed": 1},
                    resources={"workers": 1, "batch_size": 2, "rows_per_shard": 2})
    processor = ShardProcessor(spec)
    try:
        shard = make_plan(spec, processor.storage).shards[0]
        record = processor.process(shard)
    finally:
        processor.close()
    body = (tmp_path / "out" / "_commits" / f"{shard.id}.json").read_bytes()
    assert json.loads(body) == record.to_dict() and record.worker == "w0" and record.rows == 2
    assert json.dumps(CommitRecord.from_dict(json.loads(body)).to_dict(), indent=1).encode() == body
    counters = record.pipeline.counters
    assert counters.decode_rounds > 0 and isinstance(counters.decode_waits, int) and counters.busy_s > 0
