"""The quality gate (`quality:`): rows checked with the bundled ASR and speaker encoder (real
components) and a transformers CTC model made here; failing rows decoded again or chosen among
candidates; rows that never pass in rejects/; exactly once and the same decisions through a
worker killed mid-job and a resume; what fails before any work; the API and `generate`."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf
from pydantic import ValidationError

from engine import SynthesisItem
from engine.config import VERIFY_QUEUE_BATCHES, DecodingSettings, QualitySpec
from engine.io.dataset import quality_schema
from engine.metrics.gate import AttemptInput, QualityGate
from engine.records import AttemptScores, SynthesisResult, attempt_seed
from engine.runtime.commits import CommitRecord
from engine.runtime.job import JobRunner
from engine.runtime.plan import make_plan
from engine.runtime.preflight import dry_run, dry_run_text
from engine.runtime.stages.row import Row, ShardTask
from engine.runtime.worker import ShardProcessor

from asrhelpers import save_char_processor, save_tiny_whisper, save_tiny_xvector
from hubhelpers import add_to_hub_cache
from jobhelpers import audio_ok, job_spec, texts, write_manifest

DECODING = {"method": "exact", "max_new_tokens": 16, "seed": 1}


def rows_of(root: Path, part: str) -> list[dict]:
    """Every row of a job's `data/` or `rejects/` files."""
    files = sorted((root / part).glob("*.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


def decisions(root: Path) -> list[tuple]:
    """What the gate decided for each row: where it went, its seed, attempts, scores, reason."""
    out = []
    for part in ("data", "rejects"):
        for r in rows_of(root, part):
            out.append((r["id"], part, r["seed"], r["attempts"], r["cer"], r["hypothesis"], r["duration"],
                        r["reject_reason"], r["attempt_scores"], tuple(r["codes"]), r["error"]))
    return sorted(out, key=lambda d: d[0])


def processor_run(spec, processor: ShardProcessor | None = None) -> tuple[ShardProcessor, list[CommitRecord]]:
    """Every shard of `spec` through a ShardProcessor (the worker without Ray; `processor`: one
    whose models are reused); returns it, left open, and the commit records."""
    processor = processor.reuse(spec) if processor is not None else ShardProcessor(spec)
    plan = make_plan(spec, processor.storage)
    return processor, [f.result(timeout=600) for f in [processor.submit(s) for s in plan.shards]]


def test_the_spec_refuses_what_cannot_work_and_is_off_by_default():
    assert not QualitySpec().enabled and QualitySpec().asr_model is None
    assert QualitySpec(max_cer=0.1).asr_model == "pocketsphinx" and QualitySpec(max_cer=0.1).speaker_model is None
    assert QualitySpec(asr="pocketsphinx").enabled and QualitySpec(asr="pocketsphinx").checks == []
    assert QualitySpec(min_speaker_similarity=0.5).speaker_model == "resemblyzer"
    gate = QualityGate(QualitySpec(min_chars_per_s=5, max_chars_per_s=30, reject_truncated=True,
                                   min_speaker_similarity=0.5))
    assert gate.failed(AttemptScores(1, 7, "eos", 2.0, speaking_rate=12.0)) == []  # no prompt: similarity unchecked
    assert gate.failed(AttemptScores(1, 7, "length", 2.0, speaking_rate=40.0, speaker_similarity=0.2)) == [
        "speaker_similarity 0.2 < 0.5", "speaking_rate 40 > 30", "truncated (finish reason length)"]
    assert gate.failed(AttemptScores(1, 7, "eos", 0.0)) == ["speaking_rate unknown (no speech)"]
    for bad, why in (({"max_cer": 0.1, "attempts": 2, "best_of": 2}, "not both"),
                     ({"attempts": 3}, "need a check"),
                     ({"min_duration_s": 2.0, "max_duration_s": 1.0}, "above max_duration_s"),
                     ({"max_cer": -1}, "greater than or equal")):
        with pytest.raises(ValidationError, match=why):
            QualitySpec(**bad)


def test_with_the_gate_on_a_worker_holds_the_shards_that_wait_for_checks_besides_its_window(kit_dir, tmp_path):
    """A decoded shard waits for its rows' checks before it is written; the worker holds as many
    more shards as the verify queue's rows fill, so that the next shards keep the batch full
    rather than slots waiting for shards while the window holds only shards being checked."""
    def held(quality: dict, **resources) -> tuple[int, int]:
        spec = job_spec(kit_dir, ["m.jsonl"], str(tmp_path), quality=quality,
                        resources={"batch_size": 8, "rows_per_shard": 8, **resources})
        return spec.resources.window, spec.shards_held
    assert held({}) == (3, 3)  # off: the window (two batches of rows and a shard)
    assert held({"asr": "pocketsphinx"}) == (3, 3 + VERIFY_QUEUE_BATCHES)  # 16 batches of 8 rows: 16 shards
    assert held({"max_cer": 0.5}, rows_per_shard=48) == (2, 2 + -(-VERIFY_QUEUE_BATCHES * 8 // 48))
    assert held({"max_cer": 0.5}, shard_window=1) == (1, 1)  # one shard at a time stays so


def test_strict_cer_rejects_every_kit_row_after_two_attempts(local_ray, kit_dir, tmp_path):
    """The kit's audio is noise: nothing it says has a CER of 0.01, so every row is decoded twice
    and goes to rejects/ with its scores, the summary counting it."""
    manifest = write_manifest(tmp_path / "m.jsonl", texts(4))
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"), decoding=DECODING,
                    resources={"workers": 1, "rows_per_shard": 2},
                    quality={"max_cer": 0.01, "attempts": 2})
    summary = JobRunner(spec, progress=False).run()
    root = tmp_path / "out"
    assert rows_of(root, "data") == []
    rejects = rows_of(root, "rejects")
    assert sorted(r["id"] for r in rejects) == [f"u{i:03d}" for i in range(4)]
    for r in rejects:
        tried = json.loads(r["attempt_scores"])
        first = tried[0]["seed"]
        assert [a["attempt"] for a in tried] == [1, 2] and r["attempts"] == 2
        assert [a["seed"] for a in tried] == [first, attempt_seed(first, 2)] and first != tried[1]["seed"]
        kept = next(a for a in tried if a["seed"] == r["seed"])  # `seed`: the kept attempt's
        assert r["cer"] == kept["cer"] > 0.01 and all(a["failed"] for a in tried)
        assert r["reject_reason"].startswith("failed 2 attempts") and "cer" in r["reject_reason"]
        assert r["error"] is None and audio_ok(r)  # the kept attempt's audio, for a look
    data_schema = pq.read_schema(next((root / "data").glob("*.parquet")))  # shards with no row kept: empty
    assert data_schema.names == quality_schema(16000).names
    for f in (root / "rejects").glob("*.parquet"):
        assert pq.read_schema(f).equals(data_schema, check_metadata=True)  # the data's schema
    q = summary["quality"]
    assert {k: q[k] for k in ("checked", "passed", "rejected", "dropped", "regenerated", "decodes")} == \
        {"checked": 4, "passed": 0, "rejected": 4, "dropped": 0, "regenerated": 4, "decodes": 8}
    assert q["verify_s"] > 0 and q["asr"] == "pocketsphinx" and len(q["rejects"]) == 2
    assert (summary["rows_ok"], summary["rows_failed"], summary["rows_rejected"]) == (0, 0, 4)
    assert summary["utilisation"]["shard_window"] == spec.shards_held > spec.resources.window


def test_a_loose_threshold_keeps_every_augment_variant_with_its_cer(local_ray, kit_dir, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", texts(2))
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"), kind="augment", decoding=DECODING,
                    augment={"seeds": [0, 1]}, resources={"workers": 1, "rows_per_shard": 2},
                    quality={"max_cer": 100.0})
    summary = JobRunner(spec, progress=False).run()
    rows = rows_of(tmp_path / "out", "data")
    assert len(rows) == 4 and not (tmp_path / "out" / "rejects").exists()
    for r in rows:
        assert r["cer"] is not None and r["cer"] >= 0 and isinstance(r["hypothesis"], str)
        assert r["attempts"] == 1 and r["reject_reason"] is None and audio_ok(r)
    assert summary["quality"]["passed"] == 4 and summary["quality"]["regenerated"] == 0


def test_best_of_three_keeps_the_candidate_the_gate_scores_best(kit_dir, synth64, tmp_path):
    """Three candidates per row with a voice prompt: CER (noise: no word right) ties, so speaker
    similarity decides; scoring the three seeds separately finds the same one."""
    prompt = {"prompt_text": "A voice.", "prompt_codes": [int(c) for c in np.arange(40) * 977 % 65536]}
    rows = [{**r, **prompt} for r in texts(3)]
    manifest = write_manifest(tmp_path / "m.jsonl", rows)
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"), decoding=DECODING, models={"dtype": "float64"},
                    resources={"workers": 1, "batch_size": 4, "rows_per_shard": 3},
                    quality={"asr": "pocketsphinx", "min_speaker_similarity": -1.0, "best_of": 3})
    processor, records = processor_run(spec)
    try:
        gate = QualityGate(spec.quality, processor.stages.verify.gate.asr, processor.stages.verify.gate.speaker,
                           processor.codec)
        assert records[0].quality.decodes == 9
        for row in rows_of(tmp_path / "out", "data"):
            base = json.loads(row["attempt_scores"])[0]["seed"]
            items = [SynthesisItem(text=row["text"], id=row["id"], seed=attempt_seed(base, n), **prompt)
                     for n in (1, 2, 3)]
            results, _ = synth64.synthesize(items, DecodingSettings(**DECODING), batch_size=4)
            from engine.codec.prompts import prompts_of

            voice = prompts_of(items)[0]
            scores = []
            for n, res in enumerate(results, 1):
                wave = gate.audio(res.codes)
                hyp = gate.transcribe([wave])[0]
                scores.append(gate.score(AttemptInput(row["text"], wave, res.finish_reason, n, res.seed, voice,
                                                      hypothesis=hyp)))
            best = gate.verdict(scores).kept
            sims = [s.speaker_similarity for s in scores]
            assert len(set(sims)) == 3  # the candidates differ
            assert row["seed"] == best.seed and row["speaker_similarity"] == pytest.approx(max(sims), abs=1e-5)
            assert [a["speaker_similarity"] for a in json.loads(row["attempt_scores"])] == pytest.approx(sims, abs=1e-5)
    finally:
        processor.close()


def test_duration_bounds_reject_exactly_the_rows_outside(kit_dir, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", texts(8))
    base = job_spec(kit_dir, [str(manifest)], str(tmp_path / "plain"), models={"dtype": "float64"},
                    decoding={**DECODING, "max_new_tokens": 40}, resources={"workers": 1, "rows_per_shard": 4})
    processor, _ = processor_run(base)
    try:
        plain = {r["id"]: r for r in rows_of(tmp_path / "plain", "data")}
        durations = sorted({r["duration"] for r in plain.values()})
        assert len(durations) >= 3, "the kit's rows should differ in length"
        low, high = durations[0] + 1e-6, durations[-1] - 1e-6  # the shortest and the longest are out
        runs = {}
        for on_reject in ("rejects", "drop"):
            gated = base.model_copy(update={
                "output": base.output.model_copy(update={"uri": str(tmp_path / on_reject)}),
                "quality": QualitySpec(min_duration_s=low, max_duration_s=high, on_reject=on_reject)})
            processor, runs[on_reject] = processor_run(gated, processor)
    finally:
        processor.close()
    kept, rejected = rows_of(tmp_path / "rejects", "data"), rows_of(tmp_path / "rejects", "rejects")
    assert {r["id"] for r in kept} == {i for i, r in plain.items() if low <= r["duration"] <= high}
    outside = {i for i, r in plain.items() if not low <= r["duration"] <= high}
    assert {r["id"] for r in rejected} == outside != set()
    assert all("duration" in r["reject_reason"] and r["cer"] is None for r in rejected)
    assert {r["id"]: r["codes"] for r in kept + rejected} == {i: r["codes"] for i, r in plain.items()}
    # dropped: the same rows kept, the others written nowhere but counted
    assert rows_of(tmp_path / "drop", "data") == kept and not (tmp_path / "drop" / "rejects").exists()
    dropped = runs["drop"]
    assert sum(r.quality.dropped for r in dropped) == sum(r.rejected for r in dropped) == len(outside)


def espeak() -> str:
    """espeak-ng's path: installed by scripts/setup.sh, or here with apt-get when this runs as root."""
    found = shutil.which("espeak-ng")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "espeak-ng"]
        if subprocess.run(install, env=env, capture_output=True, timeout=600).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=600)
            subprocess.run(install, env=env, capture_output=True, timeout=600)
        found = shutil.which("espeak-ng")
    if found is None:
        pytest.skip("espeak-ng is not installed, and could not be (apt-get as root): scripts/setup.sh installs it")
    return found


SPOKEN = ["Good morning everybody.", "I love you.", "See you tomorrow."]  # pocketsphinx hears these from espeak


def test_the_gate_tells_speech_from_the_kits_noise(kit_dir, kit_synth, tmp_path):
    """The same texts through the same verify stage: spoken by espeak-ng they pass a CER bound
    that the kit's audio (noise) fails."""
    from engine.codec.audio import resample
    from engine.codec.xcodec2 import Xcodec2Codec
    from engine.runtime.stages.codec import CodecStage
    from engine.runtime.stages.verify import VerifyStage

    quality = QualitySpec(max_cer=0.5)
    codec = Xcodec2Codec.load(kit_dir / "codec")
    stage = VerifyStage(QualityGate.load(quality, codec), "strip", codec)

    def rows(tag: str) -> tuple[ShardTask, list]:
        made = [Row(i, SynthesisResult(id=f"{tag}{i}", text=t, seed=i), DecodingSettings(), {}, seed=i)
                for i, t in enumerate(SPOKEN)]
        return ShardTask(None, 1, made), [row.attempt(1) for row in made]

    _, spoken = rows("espeak")
    for attempt in spoken:
        clip = subprocess.run([espeak(), "-v", "en", "-s", "130", "--stdout", attempt.row.text],
                              capture_output=True, check=True).stdout
        samples, rate = sf.read(io.BytesIO(clip), dtype="float32")
        attempt.wave, attempt.finish_reason = resample(samples, rate, 16_000), "eos"
    _, noise = rows("kit")
    results, _ = kit_synth.synthesize(SPOKEN, DecodingSettings(method="exact", max_new_tokens=60, seed=1))
    for attempt, res in zip(noise, results):
        attempt.codes, attempt.finish_reason = res.codes, res.finish_reason
    CodecStage(codec, "strip", "cpu")(noise)
    settled, again = stage(spoken + noise)
    assert again == [] and len(settled) == 6
    verdicts = {row.id: row.result.quality for row in settled}
    assert all(verdicts[f"espeak{i}"].passed for i in range(3)), {k: v.kept.hypothesis for k, v in verdicts.items()}
    assert not any(verdicts[f"kit{i}"].passed for i in range(3))
    assert max(verdicts[f"espeak{i}"].kept.cer for i in range(3)) < min(verdicts[f"kit{i}"].kept.cer for i in range(3))


def test_a_worker_killed_while_checking_rows_changes_nothing_and_a_resume_neither(local_ray, kit_dir, tmp_path):
    """Attempts and verification across a real crash of the worker process and across a resume:
    every row exactly once, with the decisions of an uninterrupted run (each attempt's seed is
    derived from the row's, so a redone shard decides the same)."""
    manifest = write_manifest(tmp_path / "m.jsonl", texts(8))
    quality = {"asr": "pocketsphinx", "reject_truncated": True, "attempts": 2}  # the kit often runs to 16
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "killed"), decoding=DECODING,
                    models={"dtype": "float64"}, resources={"workers": 1, "rows_per_shard": 2}, quality=quality)
    killed = []

    def kill_once(record):  # three held shards still decoding or being checked
        if not killed and record.pipeline.held >= 3:
            killed.append(record)
            os.kill(record.pid, signal.SIGKILL)

    summary = JobRunner(spec, progress=False, on_commit=kill_once).run()
    assert killed and summary["shards"]["retries"] >= 2 and summary["shards"]["committed"] == 4
    fresh = spec.model_copy(update={"output": spec.output.model_copy(update={"uri": str(tmp_path / "fresh")})})
    JobRunner(fresh, progress=False).run()
    once = decisions(tmp_path / "fresh")
    assert [d[0] for d in once] == [f"u{i:03d}" for i in range(8)]  # every row once, in data or rejects
    assert {d[1] for d in once} == {"data", "rejects"} and {d[3] for d in once} == {1, 2}  # decisions vary
    assert decisions(tmp_path / "killed") == once
    for shard in ("shard-00001", "shard-00003"):  # a resume redoes these two
        for part in ("_commits/{}.json", "data/{}.parquet", "rejects/{}.parquet"):
            (tmp_path / "fresh" / part.format(shard)).unlink(missing_ok=True)
    resumed = JobRunner(fresh, progress=False).run()
    assert resumed["shards"]["committed_before"] == 2 and resumed["shards"]["run_now"] == 2
    assert decisions(tmp_path / "fresh") == once
    assert resumed["quality"]["checked"] == 8 and resumed["rows_rejected"] == sum(d[1] == "rejects" for d in once)


def test_a_verifier_that_is_not_there_fails_before_any_work_in_one_line(kit_dir, tmp_path, capsys):
    from engine.cli import main

    manifest = write_manifest(tmp_path / "m.jsonl", texts(2))
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"), decoding=DECODING,
                    quality={"asr": str(tmp_path / "no-such-asr"), "max_cer": 0.5})
    message = f"quality.asr: no checkpoint at {tmp_path / 'no-such-asr'} (config.json missing)"
    with pytest.raises(ValueError, match="quality.asr: no checkpoint"):
        dry_run(spec)
    with pytest.raises(ValueError) as info:
        JobRunner(spec, progress=False).run()
    assert str(info.value) == message and not (tmp_path / "out").exists()
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(json.dumps(spec.model_dump(mode="json")))
    assert main(["run", str(spec_file), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    # with the gate there, the dry run says what it would cost
    ok = spec.model_copy(update={"quality": QualitySpec(max_cer=0.5, attempts=3)})
    report = dry_run(ok)
    assert report["quality"]["decodes_per_row"] == [1, 3]
    assert report["quality"]["estimated_tokens_max"] == 3 * report["estimated_tokens"] > 0
    assert "each row decoded 1 to 3 times" in dry_run_text(report)


def tiny_ctc(path: Path) -> Path:
    """A randomly initialised wav2vec2 CTC model with a character vocabulary and wav2vec2's own
    feature encoder (7 convolutions: a receptive field of 400 samples), saved as a checkpoint."""
    import torch
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    vocab = save_char_processor(path)
    torch.manual_seed(0)
    config = Wav2Vec2Config(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=32, conv_dim=(16,) * 7, num_conv_pos_embeddings=16,
                            num_conv_pos_embedding_groups=2, pad_token_id=0)
    Wav2Vec2ForCTC(config).save_pretrained(str(path))
    return path


def test_a_row_whose_audio_makes_the_asr_raise_is_an_error_record(kit_dir, tmp_path):
    """A transformers CTC checkpoint as the ASR: a one-code row (320 samples) is shorter than its
    feature encoder's receptive field, so the model raises on it; that row becomes an error
    record, the others are scored by the model, and the shard is committed."""
    rows = texts(4)
    rows[1]["max_new_tokens"] = 1
    manifest = write_manifest(tmp_path / "m.jsonl", rows)
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"), decoding=DECODING,
                    resources={"workers": 1, "rows_per_shard": 4},
                    quality={"asr": str(tiny_ctc(tmp_path / "ctc")), "max_cer": 100.0})
    processor, records = processor_run(spec)
    processor.close()
    out = {r["id"]: r for r in rows_of(tmp_path / "out", "data")}
    assert sorted(out) == [r["id"] for r in rows] and records[0].failed == 1
    broken = out["u001"]
    assert broken["error"].startswith("quality check failed: RuntimeError") and broken["audio"] is None
    for ident in ("u000", "u002", "u003"):
        r = out[ident]
        assert r["error"] is None and audio_ok(r) and r["cer"] is not None
        assert set(r["hypothesis"]) <= set("abcdefghijklmnopqrstuvwxyz' <>")  # the model's characters


def test_the_api_and_generate_take_the_same_gate(kit_dir, kit_synth, tmp_path, capsys):
    from engine.cli import main
    from engine.codec.xcodec2 import Xcodec2Codec

    gate = QualityGate.load(QualitySpec(max_cer=0.01, attempts=2), Xcodec2Codec.load(kit_dir / "codec"))
    items = [SynthesisItem(text=t["text"], id=t["id"]) for t in texts(3)] + [SynthesisItem(text="", id="empty")]
    results, summary = kit_synth.synthesize(items, DecodingSettings(**DECODING), quality=gate)
    for res in results[:3]:
        verdict = res.quality
        assert not verdict.passed and [a.attempt for a in verdict.attempts] == [1, 2]
        assert res.seed == verdict.kept.seed and verdict.kept.cer > 0.01 and res.codes
    assert results[3].error and results[3].quality is None  # not decoded: not checked
    assert summary.quality == {**summary.quality, "passed": 0, "rejected": 3, "regenerated": 3, "decodes": 6}
    out = tmp_path / "gen.parquet"
    code = main(["generate", "--kit", str(kit_dir), "--text", "Hello there.", "--method", "exact",
                 "--max-new-tokens", "16", "--device", "cpu", "--out", str(out), "--max-cer", "0.01",
                 "--attempts", "2", "--quiet"])
    assert code == 0, capsys.readouterr().err
    assert "1 text rejected" in capsys.readouterr().err and not out.exists()
    [row] = pq.read_table(tmp_path / "gen.rejects.parquet").to_pylist()
    assert row["attempts"] == 2 and row["cer"] > 0.01 and row["reject_reason"]


def test_verifiers_by_hub_id_from_an_offline_cache(kit_dir, tmp_path):
    """The gate's ASR (a Whisper checkpoint) and speaker encoder (an x-vector one) given as Hub
    ids, resolved by the real huggingface_hub from an offline cache (HF_HUB_OFFLINE=1), score
    every text in `generate`; an id the cache lacks is refused before any decoding, in one line."""
    hub = tmp_path / "hub"
    add_to_hub_cache(hub, "test-org/tiny-whisper", save_tiny_whisper(tmp_path / "whisper"))
    add_to_hub_cache(hub, "test-org/tiny-xvector", save_tiny_xvector(tmp_path / "xvector"))
    prompt = {"prompt_text": "A voice.", "prompt_codes": [int(c) for c in np.arange(40) * 977 % 65536]}
    items = tmp_path / "texts.jsonl"
    items.write_text("".join(json.dumps({"id": f"t{i}", "text": text, **prompt}) + "\n"
                             for i, text in enumerate(["Hello there.", "Good morning to you."])))
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}

    def generate(asr: str, out: Path) -> subprocess.CompletedProcess:
        args = ["generate", "--kit", str(kit_dir), "--texts-file", str(items), "--method", "exact",
                "--max-new-tokens", "16", "--device", "cpu", "--asr", asr, "--speaker", "test-org/tiny-xvector",
                "--out", str(out), "--quiet"]
        return subprocess.run([sys.executable, "-m", "engine.cli", *args], env=env, capture_output=True,
                              text=True, timeout=300)

    done = generate("test-org/tiny-whisper", tmp_path / "gen.parquet")
    assert done.returncode == 0, done.stderr
    rows = pq.read_table(tmp_path / "gen.parquet").to_pylist()
    assert [r["id"] for r in rows] == ["t0", "t1"]
    for r in rows:
        assert isinstance(r["hypothesis"], str) and r["cer"] is not None and r["wer"] is not None
        assert -1 <= r["speaker_similarity"] <= 1
    refused = generate("test-org/not-cached", tmp_path / "none.parquet")
    assert refused.returncode != 0 and not (tmp_path / "none.parquet").exists()
    said = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(said) == 1 and "test-org/not-cached" in said[0] and "Traceback" not in refused.stderr
