"""Synthesis jobs end to end on a real local Ray cluster: local files, S3 (moto), bad input,
bad specs, and resuming after a real interruption."""

from __future__ import annotations

import collections
import gzip
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from engine.config import JobSpec, StorageOptions
from engine.io.storage import Storage
from engine.runtime.job import JobRunner
from engine.runtime.preflight import dry_run
from engine.runtime.summary import summary_table

from jobhelpers import audio_ok, comparable, job_spec, read_output, texts, write_manifest

ROOT = Path(__file__).resolve().parents[2]
# sha256 of the quickstart's (id, codes) pairs: what `jobs/quickstart.yaml` emits on the test kit
QUICKSTART_CODES = "49125847772340ee7d99ee254018a5f0d72b1d87a5d2986b482b34253b03a000"


def decoding_available() -> bool:
    """Whether `datasets` can decode audio here (torchcodec with FFmpeg's shared libraries, which
    scripts/setup.sh installs where it can). CI must have it."""
    try:
        from torchcodec.decoders import AudioDecoder  # noqa: F401
    except (ImportError, OSError, RuntimeError):
        if os.environ.get("CI"):
            raise
        return False
    return True


# S3 credentials must be in the environment before `local_ray`'s workers start: the session's
# moto server is set up ahead of the module's Ray cluster, whichever test comes first.
pytestmark = pytest.mark.usefixtures("s3_endpoint")


def test_quickstart_job_end_to_end(local_ray, kit_dir, tmp_path, groups_cache, kit_groups):
    spec = JobSpec.load(ROOT / "jobs" / "quickstart.yaml")
    spec = spec.model_copy(update={
        "models": spec.models.model_copy(update={
            "target": str(kit_dir / "target"), "draft": str(kit_dir / "draft"),
            "codec": str(kit_dir / "codec"), "groups_cache": str(groups_cache)}),
        "output": spec.output.model_copy(update={"uri": str(tmp_path / "out")})})
    summary = JobRunner(spec, progress=False).run()
    manifest = [json.loads(line) for line in (ROOT / "jobs/data/quickstart.jsonl").read_text().splitlines()]
    rows = read_output(spec)
    assert sorted(r["id"] for r in rows) == sorted(m["id"] for m in manifest)  # each row once
    by_id = {r["id"]: r for r in rows}
    assert by_id["qs-empty"]["error"].endswith("text: text is empty") and by_id["qs-empty"]["audio"] is None
    assert by_id["qs-clone"]["prompt_id"] is not None
    assert json.loads(by_id["qs-warm"]["settings"])["temperature"] == 1.0
    assert by_id["qs-warm"]["seed"] == 42
    good = [r for r in rows if r["error"] is None]
    assert len(good) == len(manifest) - 1 and all(audio_ok(r) for r in good)
    assert all(r["method"] == "pcg" for r in rows)
    # the codes themselves are pinned: a refactor of the round, the settings or the job path that
    # changes what the quickstart emits fails here (the kit, the seeds and the counter RNG fix them)
    codes = hashlib.sha256(json.dumps(sorted((r["id"], r["codes"]) for r in good)).encode()).hexdigest()
    assert codes == QUICKSTART_CODES
    assert summary["rows_ok"] == len(good) and summary["rows_failed"] == 1
    # the failed row named in the summary, with where every error record is
    assert [(e["id"], e["error"]) for e in summary["failed_examples"]] == [("qs-empty", by_id["qs-empty"]["error"])]
    assert (f"qs-empty: {by_id['qs-empty']['error']} (every error record: the `error` column of "
            "`data/*.parquet`)") in summary_table(summary)
    # rows that ran to max_new_tokens (the kit ends some rows by then, not all): counted, and said
    assert summary["rows_cut"] == sum(r["finish_reason"] == "length" for r in rows) > 0
    assert f"{summary['rows_cut']} rows reached the token limit" in summary_table(summary)
    assert summary["shards"]["committed"] == summary["shards"]["total"] == 3
    assert len(summary["acceptance_per_position"]) == 3 and summary["mean_accepted_length"] >= 1
    assert set(summary["workers"]) <= {"w0", "w1"} and summary["throughput"]["tokens_per_s"] > 0
    assert 0 < summary["utilisation"]["worker_busy_fraction"] <= 1
    assert 0 < summary["utilisation"]["slot_utilisation"] <= 1
    assert summary["utilisation"]["io_wait_s"] >= 0 and 0 <= summary["utilisation"]["overlap"] <= 1
    assert summary["utilisation"]["shard_window"] == 3  # 2 raised to hold two batches of rows
    empty = summary["utilisation"]["empty_slots"]  # every empty slot has one cause
    assert empty["end_of_work"] > 0 and min(empty.values()) >= 0
    assert sum(empty.values()) == pytest.approx(1 - summary["utilisation"]["slot_utilisation"], abs=2e-4)
    assert all(0 < w["slot_utilisation"] <= 1 for w in summary["workers"].values())
    # what the workers' processes found (conftest sets it for the tests and Ray workers inherit it)
    assert {w["omp_wait_policy"] for w in summary["workers"].values()} == {os.environ["OMP_WAIT_POLICY"]}
    # and the allocator its models' loading kept freed memory with (engine/models/malloc.py)
    from engine.models.malloc import SETTINGS, is_glibc

    kept = ({name: value for name, (_, value) in SETTINGS.items()} if is_glibc()
            else {"left": "the C library is not glibc"})
    assert [w["malloc"] for w in summary["workers"].values()] == [kept] * len(summary["workers"])
    on_disk = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert on_disk["rows_ok"] == summary["rows_ok"]
    import datasets

    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "out/data/*.parquet"), split="train",
                               cache_dir=str(tmp_path / "hf-datasets"))
    assert isinstance(ds.features["audio"], datasets.Audio) and ds.num_rows == len(manifest)
    if decoding_available():  # the README's example: one row's audio, decoded by datasets itself
        row = next(r for r in ds if r["audio"] is not None)
        audio = row["audio"]
        samples = audio["array"]
        assert audio["sampling_rate"] == 16_000 and samples.shape == (320 * row["num_codes"],)
        assert 0 < abs(samples).max() <= 1.0


@pytest.fixture(scope="module")
def finished_job(local_ray, kit_dir, tmp_path_factory, groups_cache, kit_groups):
    """A finished job's spec and summary, for the tests that run something into its output
    (none of them writes rows there)."""
    root = tmp_path_factory.mktemp("finished")
    spec = job_spec(kit_dir, [str(write_manifest(root / "m.jsonl", texts(4)))], str(root / "out"),
                    decoding={"method": "pcg", "max_speech_ratio": 1.5}, models={"groups_cache": str(groups_cache)})
    return spec, JobRunner(spec).run()


def test_a_finished_job_rerun_prints_its_figures_again(finished_job, capsys):
    spec, first = finished_job
    again = JobRunner(spec).run()
    assert again == first == json.loads((Path(spec.output.uri) / "summary.json").read_text())
    out = capsys.readouterr().out
    assert "was committed before; nothing to run" in out
    # 16 tokens, below every row's speech budget (over 100 codes): the rows cut reached max_new_tokens
    cut = [len(r["codes"]) for r in read_output(spec) if r["finish_reason"] == "length"]
    assert first["rows_cut"] == len(cut) > 0 and set(cut) == {16}
    assert ("reached the token limit before the end of speech (audio cut there; decoding.max_new_tokens "
            "is 16, decoding.max_speech_ratio 1.5)") in out
    assert f"{first['throughput']['tokens_per_s']} tok/s" in out  # the first run's figures, not nulls


def test_a_finished_output_without_its_summary_gets_one_from_the_commit_records(finished_job, tmp_path, capsys):
    """A driver stopped after its last commit leaves no summary.json: the next run writes a whole
    one from the commit records (the figures of the runs that committed them), never nulls."""
    spec, first = finished_job
    shutil.copytree(spec.output.uri, tmp_path / "out")
    (tmp_path / "out" / "summary.json").unlink()
    moved = spec.model_copy(update={"output": spec.output.model_copy(update={"uri": str(tmp_path / "out")})})
    summary = JobRunner(moved).run()
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == summary
    assert summary["figures_from"].startswith("the commit records")
    assert summary["shards"]["run_now"] == 0 and summary["shards"]["committed_before"] == summary["shards"]["total"]
    assert summary["rows_ok"] == first["rows_ok"] and summary["generated_tokens"] == first["generated_tokens"]
    assert summary["throughput"]["tokens_per_s"] > 0 and summary["utilisation"]["worker_busy_fraction"] is not None
    assert set(summary["workers"]) == set(first["workers"])
    out = capsys.readouterr().out
    assert "no summary was written; writing it from the commit records" in out and "None" not in out


def test_eval_of_a_job_output_finds_its_manifests_and_codec(local_ray, kit_dir, tmp_path, groups_cache, kit_groups,
                                                            capsys):
    """The quickstart's voice prompt is given as codes: eval needs the job's codec, from _job.json."""
    from engine.cli import main

    rows = [json.loads(line) for line in (ROOT / "jobs/data/quickstart.jsonl").read_text().splitlines()]
    manifest = write_manifest(tmp_path / "m.jsonl", [r for r in rows if r["id"] in ("qs-000", "qs-clone")])
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"), models={"groups_cache": str(groups_cache)})
    JobRunner(spec, progress=False).run()
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "out"), "--asr", "none", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert f"{kit_dir / 'codec'} (from the job's _job.json)" in printed
    summary = json.loads((tmp_path / "out.eval.summary.json").read_text())
    assert summary["methods"]["exact"]["similarity_rows"] == 1  # qs-clone, against its decoded prompt codes
    assert "no speaker similarity for 1 row(s): they have no voice prompt" in printed


def test_job_reads_and_writes_s3(local_ray, kit_dir, s3_endpoint, s3_bucket, tmp_path):
    storage = Storage(StorageOptions(endpoint_url=s3_endpoint))
    body = "".join(json.dumps(r) + "\n" for r in texts(5))
    storage.write_bytes(f"s3://{s3_bucket}/manifests/part-0.jsonl", body.encode())
    storage.write_bytes(f"s3://{s3_bucket}/manifests/part-1.csv", b"id,text\ncsv1,From a CSV file.\n")
    storage.write_bytes(f"s3://{s3_bucket}/manifests/part-2.jsonl.gz",
                        gzip.compress(b"".join(json.dumps({"id": f"gz{i}", "text": f"Gzipped row {i}."}).encode()
                                               + b"\n" for i in range(4))))  # 2 shards of one file read once
    spec = job_spec(kit_dir, [f"s3://{s3_bucket}/manifests/"], f"s3://{s3_bucket}/runs/one",
                    storage={"endpoint_url": s3_endpoint, "region": "us-east-1"},
                    decoding={"gamma": "auto"}, profile={"rounds": 2})
    summary = JobRunner(spec, progress=False).run()
    assert summary["gamma_auto"] and all(d["reason"] for d in summary["gamma_auto"])
    # each worker that decoded profiled its first 2 rounds, written beside the data
    assert 1 <= len(summary["profiles"]) <= 2
    for uri in summary["profiles"]:
        assert uri.startswith(f"s3://{s3_bucket}/runs/one/_profiles/w")
        profile = json.loads(storage.read_bytes(uri))
        assert profile["rounds"] == 2 and profile["top_ops"] and profile["round_ms"]["mean"] > 0
    rows = read_output(spec)
    assert sorted(r["id"] for r in rows) == ["csv1"] + [f"gz{i}" for i in range(4)] + [f"u{i:03d}" for i in range(5)]
    assert all(audio_ok(r) for r in rows)
    assert summary["rows_ok"] == 10
    assert storage.exists(f"s3://{s3_bucket}/runs/one/summary.json")
    commits = storage.list(f"s3://{s3_bucket}/runs/one/_commits")
    assert len(commits) == summary["shards"]["total"] == 5  # 5 JSONL rows / 3 per shard, 1 CSV, 4 gzipped JSONL


def test_bad_rows_become_error_records(local_ray, kit_dir, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [
        {"id": "ok1", "text": "Fine."}, "{broken json", {"id": "ok1", "text": "Same id again."},
        {"text": "No id."}, {"id": "long", "text": "word " * 3000},
        {"id": "codes", "text": "Bad prompt.", "prompt_text": "x", "prompt_codes": [70000]},
        {"id": "clip", "text": "Missing clip.", "prompt_text": "x", "prompt_audio": "nope.wav"},
        {"id": "ok2", "text": "Also fine."}])
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"))
    report = dry_run(spec)  # before the job: finds every bad row but the one over the context
    assert not (tmp_path / "out").exists()
    summary = JobRunner(spec, progress=False).run()
    rows = read_output(spec)
    assert len(rows) == 8
    errors = {r["id"]: r["error"] for r in rows if r["error"]}
    assert {r["id"] for r in rows if r["error"] is None} == {"ok1", "ok2"}
    assert "duplicate id" in errors["ok1"] and "not a JSON object" in errors[f"!{manifest}:2"]
    assert "context" in errors["long"] and "65535" in errors["codes"] and "nope.wav" in errors["clip"]
    assert "id" in errors[f"!{manifest}:4"]
    assert summary["rows_ok"] == 2 and summary["rows_failed"] == 6
    named = summary["failed_examples"]  # the first five, as recorded, in shard order
    assert len(named) == 5 and all(errors[e["id"]] == e["error"] for e in named)
    assert len({e["id"] for e in named}) == 5 and "; and 1 more (every error record" in summary_table(summary)
    # the dry run's error rows are the job's, the text too long for the context aside (it needs
    # the tokenizer): same lines, the job's message containing the dry run's
    assert report["rows_failing"] == 5 and report["rows_ok"] == 3  # "long" counted as ok
    found = {e["id"] or f"!{e['source']}": e["error"] for e in report["failing_examples"]}
    recorded = {r["id"]: r["error"] for r in rows if r["error"] and r["id"] != "long"}
    assert found.keys() == recorded.keys()
    assert {k: v for k, v in found.items() if k != "clip"} == {k: v for k, v in recorded.items() if k != "clip"}
    assert found["clip"] == f"prompt_audio: no clip at {tmp_path / 'nope.wav'}"
    assert report["fingerprint"] == json.loads((tmp_path / "out" / "_job.json").read_text())["fingerprint"]
    assert dry_run(spec)["output_state"].startswith("finished")


def test_bad_specs_fail_before_any_work(kit_dir, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", texts(2))
    out = tmp_path / "out"
    with pytest.raises(ValidationError, match="decoding.gamma"):
        job_spec(kit_dir, [str(manifest)], str(out), decoding={"gamma": 0})
    with pytest.raises(ValidationError, match="models.draft is required"):
        JobSpec.model_validate({"models": {"target": "t", "codec": "c"}, "input": {"manifests": ["m"]},
                                "output": {"uri": "o"}})
    with pytest.raises(ValidationError, match="resources.workres|workres"):
        job_spec(kit_dir, [str(manifest)], str(out), resources={"workres": 2})
    bad_model = job_spec(kit_dir, [str(manifest)], str(out),
                         models={"target": str(tmp_path / "none")})
    with pytest.raises(ValueError, match="models.target"):
        JobRunner(bad_model, progress=False).run()
    with pytest.raises(ValueError, match=r"input.manifests\[0\]"):
        JobRunner(job_spec(kit_dir, [str(tmp_path / "missing.jsonl")], str(out)), progress=False).run()
    assert not out.exists() or not any(out.rglob("*.parquet"))
    (tmp_path / "spec.yaml").write_text("models: [1, 2\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        JobSpec.load(tmp_path / "spec.yaml")


def test_rerun_into_an_output_of_another_job_is_refused(finished_job):
    spec, first = finished_job
    other = spec.model_copy(update={"decoding": spec.decoding.model_copy(update={"seed": 2})})
    with pytest.raises(ValueError, match="holds another job"):
        dry_run(other)  # the dry run refuses it as the job does
    with pytest.raises(ValueError, match="holds another job"):
        JobRunner(other, progress=False).run()
    assert json.loads((Path(spec.output.uri) / "summary.json").read_text()) == first  # untouched


def test_interrupted_job_resumes_without_redoing_committed_shards(local_ray, kit_dir, tmp_path):
    # float64: rows batched with other shards' rows in other runs decode to the same bits (in
    # float32 a different batch can round differently, and a sampled row may then differ).
    # 15 shards: the worker holds 4 at a time (two batches of rows), so when the second commit
    # lands most of the job has not started (with 6 shards the rest could finish before the
    # signal arrives)
    rows, shards = 30, 15
    manifest = write_manifest(tmp_path / "m.jsonl", texts(rows))
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"), models={"dtype": "float64"},
                    resources={"workers": 1, "rows_per_shard": 2})
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(json.dumps(spec.model_dump(mode="json")))  # JSON is YAML
    commits = tmp_path / "out" / "_commits"
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "run", str(spec_file), "--quiet",
                             "--address", "local"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and (not commits.is_dir() or len(list(commits.glob("*.json"))) < 2):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in commits.glob("*.json")}
    assert 2 <= len(before) < shards, "the interruption must land mid-job"
    summary = JobRunner(spec, progress=False).run()
    assert summary["shards"]["committed_before"] == len(before)
    assert summary["shards"]["run_now"] == shards - len(before)
    for name, (mtime, body) in before.items():
        p = commits / name
        assert p.stat().st_mtime_ns == mtime and p.read_bytes() == body
    fresh = job_spec(kit_dir, [str(manifest)], str(tmp_path / "fresh"), models={"dtype": "float64"},
                     resources={"workers": 1, "rows_per_shard": 2})
    JobRunner(fresh, progress=False).run()
    resumed, uninterrupted = read_output(spec), read_output(fresh)
    assert comparable(resumed) == comparable(uninterrupted)
    assert collections.Counter(r["id"] for r in resumed) == collections.Counter(f"u{i:03d}" for i in range(rows))


def test_augment_job_crosses_texts_with_voices_seeds_and_methods_within_budget(local_ray, kit_dir, tmp_path):
    from engine.runtime.augment import fit_budget

    texts_in = [{"id": "t1", "text": "The first sentence of the corpus."},
                {"id": "t2", "text": "A second sentence, a little longer than the first."},
                {"id": "t3", "text": "Third."}, {"id": "bad", "text": ""}]
    manifest = write_manifest(tmp_path / "m.jsonl", texts_in)
    seconds = [len(t["text"]) / 15.0 for t in texts_in[:3]]
    budget_h = 3.5 * sum(seconds) / 3600  # room for 3 variants per text, not 4
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"), kind="augment",
                    augment={"prompts": [{"id": "v1", "text": "Voice one.", "codes": [11, 12, 13]},
                                         {"id": "v2", "text": "Voice two.", "codes": [21, 22, 23, 24]}],
                             "include_no_prompt": True, "seeds": [0, 1], "methods": ["exact", "ar"],
                             "max_variants_per_text": 4, "max_audio_hours": budget_h},
                    resources={"rows_per_shard": 4})
    report = dry_run(spec)
    assert not (tmp_path / "out").exists()
    summary = JobRunner(spec, progress=False).run()
    rows = read_output(spec)
    aug = summary["augment"]
    # the dry run expanded the same variants (in memory) and planned the same job
    assert report["augment"] == aug and report["rows"] == 10 and report["rows_failing"] == 1
    assert report["shards"] == summary["shards"]["total"]
    assert report["fingerprint"] == json.loads((tmp_path / "out" / "_job.json").read_text())["fingerprint"]
    assert aug["grid"] == 3 * 2 * 2 and aug["variants"] == 9 and aug["bad_rows"] == 1
    assert aug["over_budget"] == 3 and aug["capped"] == 3 * (12 - 4)
    assert aug["estimated_hours"] <= budget_h
    assert len(rows) == 10 and len({r["id"] for r in rows}) == 10  # no duplicates, bad row once
    variants = [r for r in rows if r["text_id"] is not None]
    assert collections.Counter(r["text_id"] for r in variants) == {"t1": 3, "t2": 3, "t3": 3}
    for r in variants:
        origin = json.loads(r["provenance"])
        assert origin["text_id"] == r["text_id"] and set(origin["models"]) == {"target", "draft", "codec"}
        assert r["method"] in ("exact", "ar") and json.loads(r["settings"])["method"] == r["method"]
        assert (r["prompt_id"] or None) == origin.get("prompt_id")
        assert r["error"] is None and audio_ok(r)
    for text_id in ("t1", "t2", "t3"):  # three distinct combinations per text, voices mixed
        mine = [r for r in variants if r["text_id"] == text_id]
        assert len({(r["prompt_id"], json.loads(r["provenance"])["augment_seed"], r["method"]) for r in mine}) == 3
        assert len({r["prompt_id"] for r in mine}) >= 2
    assert "text is empty" in next(r["error"] for r in rows if r["id"] == "bad")
    counts = collections.Counter(r["method"] for r in variants)
    assert aug["methods"] == dict(sorted(counts.items()))
    table = dict(line.split(None, 1) for line in summary_table(summary).splitlines()[:3])
    assert table["method"] == ", ".join(f"{m} ({n} variant{'' if n == 1 else 's'})" for m, n in sorted(counts.items()))
    cut = sum(r["finish_reason"] == "length" for r in variants)  # max_new_tokens 16: the kit ends few by then
    assert summary["rows_cut"] == cut
    assert table["rows"] == ("9 ok, 1 failed, of 10: 9 variants of 3 texts + 1 malformed manifest row (4 manifest rows)"
                             + (f"; {cut} row{'s' * (cut != 1)} reached the token limit before the end of speech "
                                "(audio cut there; decoding.max_new_tokens is 16)" if cut else ""))
    assert fit_budget([1.0, 2.0], [4, 4], 6.0) == 2 and fit_budget([1.0], [4], 0.5) == 0
