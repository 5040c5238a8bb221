"""Checks a job makes before any work: a resume under another numerics environment (threads per
worker) is refused naming the difference, or allowed with the flag and recorded; a groups file
built for another theta, or corrupt, is refused before `_job.json` is written, naming the file;
a setting added since an output was written leaves its plan as it was while the setting is off."""

from __future__ import annotations

import pytest

from engine.io.storage import Storage
from engine.runtime.job import JobRunner
from engine.runtime.plan import make_plan, settings_fingerprint

from jobhelpers import job_spec, texts, write_manifest


def test_a_resume_with_other_threads_is_refused_or_allowed_and_recorded(local_ray, kit_dir, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", texts(4))
    out = tmp_path / "out"
    one = job_spec(kit_dir, [str(manifest)], str(out),
                   resources={"workers": 1, "rows_per_shard": 2, "cpus_per_worker": 1})
    first = JobRunner(one, progress=False).run()
    assert [(e["threads"], e["shards"]) for e in first["numerics"]] == [(1, 2)]
    assert {"device", "device_name", "dtype", "torch", "threads", "compile"} <= set(first["numerics"][0])
    (out / "_commits" / "shard-00001.json").unlink()  # the job is unfinished
    job_file = (out / "_job.json").read_text()
    two = one.model_copy(update={"resources": one.resources.model_copy(update={"cpus_per_worker": 2})})
    with pytest.raises(ValueError, match=r"another numerics environment \(threads 1 -> 2\).*--allow-numerics-change"):
        JobRunner(two, progress=False).run()
    assert (out / "_job.json").read_text() == job_file  # refused before any work
    assert not (out / "_commits" / "shard-00001.json").exists()
    summary = JobRunner(two, progress=False, allow_numerics_change=True).run()
    assert summary["numerics_change_allowed"] == ["threads 1 -> 2"]
    assert sorted(e["threads"] for e in summary["numerics"]) == [1, 2]
    assert summary["shards"]["committed"] == 2 and summary["shards"]["run_now"] == 1


def test_the_run_command_has_the_flag():
    from engine.cli import build_parser

    args = build_parser().parse_args(["run", "job.yaml", "--allow-numerics-change"])
    assert args.allow_numerics_change


def test_a_groups_file_for_another_theta_or_corrupt_is_refused_before_any_work(kit_dir, kit_groups, tmp_path):
    from engine.groups.store import save_groups

    manifest = write_manifest(tmp_path / "m.jsonl", texts(2))
    path = save_groups(kit_groups, tmp_path / "groups-0.4.safetensors")  # built for theta 0.4
    out = tmp_path / "out"
    spec = job_spec(kit_dir, [str(manifest)], str(out), models={"groups": str(path)},
                    decoding={"method": "pcg", "theta": 0.5})
    with pytest.raises(ValueError, match=rf"models.groups: {path}: built for theta=0.4, but 0.5"):
        JobRunner(spec, progress=False).run()
    assert not (out / "_job.json").exists()
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(path.read_bytes()[:-100])
    spec = job_spec(kit_dir, [str(manifest)], str(out), models={"groups": str(broken)}, decoding={"method": "pcg"})
    with pytest.raises(ValueError, match=rf"models.groups: {broken}: corrupt"):
        JobRunner(spec, progress=False).run()
    assert not (out / "_job.json").exists()


def test_max_speech_ratio_off_leaves_the_plan_of_an_earlier_output_and_on_is_another_job(tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", texts(3))
    off = job_spec(tmp_path, [str(manifest)], str(tmp_path / "out"))
    on = off.model_copy(update={"decoding": off.decoding.model_copy(update={"max_speech_ratio": 2.0})})
    assert "max_speech_ratio" not in settings_fingerprint(off)["decoding"]  # as before the setting existed
    assert settings_fingerprint(on)["decoding"]["max_speech_ratio"] == 2.0
    assert make_plan(off, Storage()).fingerprint != make_plan(on, Storage()).fingerprint


def test_the_version_of_the_engines_arithmetic_is_part_of_the_numerics_environment():
    """The random draws and the sampler's rules are part of a row's arithmetic: an output
    recorded under another version of them differs from today's; one recorded before the field
    existed has version 1 (draws of rng version 1, top-p's ties by an unstable sort)."""
    from engine.decoding import rng
    from engine.runtime import numerics

    assert (numerics.NUMERICS_VERSION, rng.VERSION) == (3, 1)
    version = numerics.NUMERICS_VERSION
    now = {"device": "cpu", "torch": "2.13.0", "threads": 2, "compile": "none", "numerics": version}
    old = {k: v for k, v in now.items() if k != "numerics"}
    assert numerics.differences(old, now) == [f"numerics 1 -> {version}"]
    assert numerics.differences({**now, "numerics": version + 1}, now) == [f"numerics {version + 1} -> {version}"]
    assert numerics.differences({**now, "compile": None}, {**now, "compile": "none"}) == []
