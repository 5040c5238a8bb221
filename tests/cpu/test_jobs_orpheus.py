"""A job over the Orpheus kit, as a Llasa job runs: 24 kHz audio of whole frames, a voice prompt
given as a clip (SNAC-encoded), the family named by the dry run, groups built per code range by
the driver, a resume that redoes only the shards not committed, a killed worker replaced, and the
output converted to NeMo and Lhotse Shar at its own rate."""

from __future__ import annotations

import collections
import io
import json
import os
import signal

import numpy as np
import pytest
import ray
import soundfile as sf

from engine.families.orpheus import CODEBOOK, FRAME, FRAME_SAMPLES
from engine.runtime.convert import convert
from engine.runtime.job import JobRunner
from engine.runtime.preflight import dry_run, dry_run_text
from engine.runtime.summary import summary_table

from jobhelpers import NemoManifest, comparable, job_spec, read_output, texts, write_manifest

RATE = 24_000


def orpheus_audio_ok(row: dict) -> bool:
    """A row's clip: 24 kHz, one frame's samples for every seven codes, codes in range."""
    samples, rate = sf.read(io.BytesIO(row["audio"]["bytes"]))
    codes = row["codes"]
    return (rate == RATE == row["sampling_rate"] and len(codes) % FRAME == 0 and all(0 <= c < CODEBOOK for c in codes)
            and len(samples) == FRAME_SAMPLES * len(codes) // FRAME > 0
            and row["duration"] == pytest.approx(len(samples) / RATE))


@pytest.fixture
def two_cpus(cluster):
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)


def orpheus_job(kit_dir, tmp_path, rows: int, out: str = "out", **over):
    from engine.metrics.signals import synthetic_voice

    manifest_rows = texts(rows)
    if rows:
        manifest_rows[1]["voice"] = "tara"  # a named voice of the -ft checkpoints
        sf.write(tmp_path / "voice.wav", synthetic_voice(7, 1.0, 140.0, (700, 1200)), 16_000)
        manifest_rows.append({"id": "clone", "text": "Say it in this voice.", "prompt_text": "Reference words.",
                              "prompt_audio": "voice.wav"})
    manifest = write_manifest(tmp_path / "m.jsonl", manifest_rows)
    models = {"dtype": "float64", "groups_cache": str(tmp_path / "groups"), **over.pop("models", {})}
    return job_spec(kit_dir, [str(manifest)], str(tmp_path / out), decoding={"method": "pcg", "max_new_tokens": 35},
                    models=models, **over)


def test_an_orpheus_job_writes_24_khz_frames_resumes_and_converts(two_cpus, orpheus_kit_dir, kit_groups, tmp_path):
    spec = orpheus_job(orpheus_kit_dir, tmp_path, 8)
    report = dry_run(spec)
    assert report["family"]["name"] == "orpheus"
    assert "family     orpheus: Orpheus (Llama) + SNAC 24 kHz (detected" in dry_run_text(report)
    summary = JobRunner(spec, progress=False).run()
    rows = read_output(spec)
    want = collections.Counter([f"u{i:03d}" for i in range(8)] + ["clone"])
    assert collections.Counter(r["id"] for r in rows) == want
    assert all(r["error"] is None and orpheus_audio_ok(r) for r in rows)
    assert next(r for r in rows if r["id"] == "clone")["prompt_id"] is not None
    settings = json.loads(rows[0]["settings"])
    assert (settings["temperature"], settings["top_p"], settings["repetition_penalty"]) == (0.6, 0.8, 1.3)
    assert summary["audio_seconds"] == pytest.approx(sum(r["duration"] for r in rows), abs=0.01)
    assert summary["audio_seconds"] > 0
    assert summary["family"] == "orpheus" and "(orpheus model family)" in summary_table(summary)
    assert summary["shards"]["committed"] == summary["shards"]["total"] == 3

    # a resume redoes only what was not committed: two shards' commits and files taken away
    out = tmp_path / "out"
    for shard in ("shard-00000", "shard-00002"):
        (out / "_commits" / f"{shard}.json").unlink()
        (out / "data" / f"{shard}.parquet").unlink()
    (out / "summary.json").unlink()
    again = JobRunner(spec, progress=False).run()
    assert again["shards"]["committed_before"] == 1 and again["shards"]["run_now"] == 2
    assert comparable(read_output(spec)) == comparable(rows)

    # NeMo and Lhotse Shar at the output's own rate
    nemo = convert(str(out), "nemo", dest=str(tmp_path / "nemo"), progress=False)
    assert nemo["with_audio"] == len(rows)
    for entry, data in NemoManifest.read(tmp_path / "nemo" / "manifest.json"):
        clip, rate = sf.read(io.BytesIO(data))
        assert rate == RATE and entry["duration"] == len(clip) / RATE and len(clip) % FRAME_SAMPLES == 0
    from lhotse import CutSet

    convert(str(out), "lhotse-shar", dest=str(tmp_path / "shar"), progress=False)
    cuts = list(CutSet.from_shar(in_dir=tmp_path / "shar" / "shar"))
    assert len(cuts) == len(rows) and {c.sampling_rate for c in cuts} == {RATE}
    assert all(len(c.load_audio()[0]) == round(c.duration * RATE) for c in cuts)

    # a groups file of another family is refused before any work, naming both
    from engine.groups.store import to_bytes

    llasa_groups = tmp_path / "llasa-groups.safetensors"
    llasa_groups.write_bytes(to_bytes(kit_groups))
    other = orpheus_job(orpheus_kit_dir, tmp_path, 2, out="other", models={"groups": str(llasa_groups)})
    with pytest.raises(ValueError, match="built for a llasa target .*, not orpheus"):
        dry_run(other)
    with pytest.raises(ValueError, match="built for a llasa target .*, not orpheus"):
        JobRunner(other, progress=False).run()
    assert not (tmp_path / "other").exists()


def test_a_killed_orpheus_worker_is_replaced_and_its_shards_redone_identically(two_cpus, orpheus_kit_dir, tmp_path):
    killed = []

    def kill_once(record):
        if not killed and record.pipeline.held >= 3:
            killed.append(record)
            os.kill(record.pid, signal.SIGKILL)

    spec = orpheus_job(orpheus_kit_dir, tmp_path, 11, resources={"workers": 2, "rows_per_shard": 2})
    summary = JobRunner(spec, progress=False, on_commit=kill_once).run()
    assert killed and summary["shards"]["workers_replaced"] >= 1
    assert summary["shards"]["committed"] == summary["shards"]["total"] == 6
    rows = read_output(spec)
    assert sorted(r["id"] for r in rows) == sorted([f"u{i:03d}" for i in range(11)] + ["clone"])
    assert all(orpheus_audio_ok(r) for r in rows)
    fresh = spec.model_copy(update={"output": spec.output.model_copy(update={"uri": str(tmp_path / "fresh")})})
    JobRunner(fresh, progress=False).run()
    assert comparable(read_output(spec)) == comparable(rows)
    assert np.isfinite([r["duration"] for r in rows]).all()
