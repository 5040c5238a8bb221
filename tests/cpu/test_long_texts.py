"""Long texts, normalised text and output formats in jobs, end to end on the kit: a long text
becomes one row whose codes are its chunks' codes in order (or, `split_output: rows`, one row per
chunk with its parent's id and segment), a sentence too long is cut at clauses and says so, one
that fits its budget is not cut into words, a chunk that ends at once is decoded again (a
bounded number of times, with derived seeds), normalised text is stored beside the text, each
format from a real job loads with its toolkit's reader and resumes, and a worker killed with
SIGKILL in the middle of a shard leaves no partial tar or manifest. A small `max_new_tokens`
forces splitting on short texts (the kit decodes slowly); the planning of a two-minute text
against Llasa's real context is tests/cpu/test_text.py's.
"""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import ray
import soundfile as sf

from engine.codec.join import CROSSFADE_S
from engine.config import JobSpec
from engine.records import item_seed, retry_seed
from engine.runtime.job import JobRunner
from engine.runtime.pool import JobFailed
from engine.runtime.preflight import dry_run, dry_run_text
from engine.runtime.summary import summary_table
from engine.text.chunks import Budget, chunk_seeds

from jobhelpers import PARAGRAPHS, NemoManifest, job_spec, read_output, write_manifest

RATE = 16_000
# three paragraphs of sentences of at most 21 characters: with max_new_tokens 200 (a chunk's
# speech budget: (200 / 50 - 2) / 1.25 s, 24 characters) each sentence is a chunk of its own
LONG = ("The boats came in. Twelve were in. Two were still out.\n\n"
        "The sea was grey. The wind had dropped. Nobody spoke.\n\n"
        "At noon a plane came. The crew was safe. We all went home.")
CLAUSES = "It rained, the wind blew, the boats rocked, and the gulls cried."  # one sentence, 64 characters
MONEY = "On 3/4/2025 it cost $12.50."
SAID = "On March fourth twenty twenty five it cost twelve dollars and fifty cents."
ROWS = [{"id": "long", "text": LONG}, {"id": "clauses", "text": CLAUSES}, {"id": "short", "text": "Hello there."},
        {"id": "money", "text": MONEY}]
# a worker process pauses, killable, just before it renames a shard's file into place
HOOK = '''
import os, time
_dir = os.environ.get("PCG_TEST_PAUSE_DIR")
if _dir:
    _replace = os.replace

    def _pausing(src, dst, *args, **kwargs):
        armed = os.path.join(_dir, "armed")
        if os.path.exists(armed) and str(dst).endswith(open(armed).read().strip()):
            os.remove(armed)
            with open(os.path.join(_dir, "paused.tmp"), "w") as f:
                f.write(str(os.getpid()))
            _replace(os.path.join(_dir, "paused.tmp"), os.path.join(_dir, "paused"))
            time.sleep(600)
        return _replace(src, dst, *args, **kwargs)

    os.replace = _pausing
'''


@pytest.fixture(scope="module")
def hook(tmp_path_factory):
    """A local Ray cluster whose worker processes load `HOOK` (a sitecustomize module), armed by
    writing a file name to `<hook>/armed`."""
    folder = tmp_path_factory.mktemp("hook")
    (folder / "sitecustomize.py").write_text(HOOK)
    before = {k: os.environ.get(k) for k in ("PYTHONPATH", "PCG_TEST_PAUSE_DIR")}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), before["PYTHONPATH"]]))
    os.environ["PCG_TEST_PAUSE_DIR"] = str(folder)
    try:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    yield folder
    ray.shutdown()


def spec_of(kit_dir, manifest: Path, out: Path, fmt: str = "hf-parquet", tarred: bool = False, **over) -> JobSpec:
    """A float64 job (a row decodes to the same bits whatever rows share its batch) that splits
    texts longer than about 24 characters and normalises them."""
    raw = job_spec(kit_dir, [str(manifest)], str(out), models={"dtype": "float64"},
                   decoding={"max_new_tokens": 200}, resources={"workers": 1, "rows_per_shard": 2, "batch_size": 8},
                   **over).model_dump()
    raw["output"].update(format=fmt, tarred=tarred)
    raw["text"] = {**raw["text"], "normalize": "en", **over.get("text", {})}
    return JobSpec.model_validate(raw)


def chunks_of(row: dict) -> list[dict]:
    return json.loads(row["provenance"]).get("chunks", [])


def seconds(data: bytes) -> float:
    info = sf.info(io.BytesIO(data))
    return info.frames / info.samplerate


def test_a_long_text_is_one_row_of_its_chunks_or_a_row_per_chunk(hook, kit_dir, kit_synth, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", ROWS)
    joined = spec_of(kit_dir, manifest, tmp_path / "joined")
    planned = dry_run(joined)
    assert "  split      3 rows would be split into" in dry_run_text(planned)
    summary = JobRunner(joined, progress=False).run()
    rows = {r["id"]: r for r in read_output(joined)}
    assert sorted(rows) == sorted(r["id"] for r in ROWS) and all(r["error"] is None for r in rows.values())
    # the long text: a chunk per sentence, cut only where a sentence ends, each within its budget
    budget = Budget(200, kit_synth.max_context, lambda t: len(kit_synth.prompter.build(t)),
                    codes_per_second=kit_synth.family.codes_per_second)
    long = chunks_of(rows["long"])
    sentences = [s + "." for p in LONG.split("\n\n") for s in p.rstrip(".").split(". ")]
    assert [c["text"] for c in long] == sentences
    assert [c["boundary"] for c in long] == ["sentence"] * 8 + ["end"]
    assert all(budget.fits(c["text"]) and LONG[c["start"]:c["end"]] == c["text"] for c in long)
    # one sentence too long: cut at its clauses, and the row says so
    assert [c["boundary"] for c in chunks_of(rows["clauses"])] == ["clause"] * 3 + ["end"]
    assert " ".join(c["text"] for c in chunks_of(rows["clauses"])) == CLAUSES
    # a text that fits is not split; normalised text is stored beside the text
    assert chunks_of(rows["short"]) == [] and rows["short"]["normalized_text"] == "Hello there."
    assert rows["money"]["text"] == MONEY and rows["money"]["normalized_text"] == SAID
    assert " ".join(c["text"] for c in chunks_of(rows["money"])) == SAID
    for row in (rows["long"], rows["clauses"], rows["money"]):  # the clip: the kept pieces, minus the crossfades
        chunks = chunks_of(row)
        assert sum(c["num_codes"] for c in chunks) == len(row["codes"]) == row["num_codes"]
        clip = seconds(row["audio"]["bytes"])
        assert clip == row["duration"]
        assert clip == pytest.approx(sum(c["audio_seconds"] for c in chunks) - CROSSFADE_S * (len(chunks) - 1),
                                     abs=len(chunks) / RATE)
        assert row["finish_reason"] == ("length" if any(c["finish_reason"] == "length" for c in chunks) else "eos")
    split = {"long": 9, "clauses": 4, "money": len(chunks_of(rows["money"]))}
    assert summary["rows_split"] == planned["text"]["rows_split"] == 3
    assert summary["chunks"] == planned["text"]["chunks"] == sum(split.values())
    assert f"3 long texts split into {sum(split.values())} chunks" in summary_table(summary)

    # split_output: rows: a row per chunk, its parent's id and its segment; the same codes
    per_chunk = spec_of(kit_dir, manifest, tmp_path / "rows", text={"split_output": "rows"})
    summary = JobRunner(per_chunk, progress=False).run()
    out = read_output(per_chunk)
    assert summary["chunk_rows"] == len(out) == sum(split.values()) + 1
    for parent, n in split.items():
        mine = sorted((r for r in out if r["parent_id"] == parent), key=lambda r: r["segment"])
        assert [r["id"] for r in mine] == [f"{parent}#{i:04d}" for i in range(n)]
        assert [r["segment"] for r in mine] == list(range(n))
        assert [r["text"] for r in mine] == [c["text"] for c in chunks_of(rows[parent])]
        assert [r["normalized_text"] for r in mine] == [r["text"] for r in mine]
        assert [c for r in mine for c in r["codes"]] == rows[parent]["codes"]  # joined: the chunks' codes in order
        assert [json.loads(r["provenance"])["chunk"]["boundary"] for r in mine] == [
            c["boundary"] for c in chunks_of(rows[parent])]
    short = next(r for r in out if r["id"] == "short")
    assert short["parent_id"] is None and short["segment"] is None and short["codes"] == rows["short"]["codes"]


def test_an_augment_jobs_variants_are_split_as_its_rows_are(kit_dir, tmp_path):
    """An augment job's variants are manifest rows of the same pipeline: each variant of a long
    text is cut as the text is, with its voice prompt counted (the dry run, which plans as the
    workers do)."""
    manifest = write_manifest(tmp_path / "m.jsonl", [{"id": "long", "text": LONG}, {"id": "short", "text": "Hi."}])
    spec = spec_of(kit_dir, manifest, tmp_path / "out", kind="augment",
                   augment={"prompts": [{"id": "v1", "text": "Voice one.", "codes": [11, 12, 13]}],
                            "include_no_prompt": True, "seeds": [0]})
    report = dry_run(spec)
    assert report["rows"] == 4 and report["text"]["rows_split"] == 2 and report["text"]["chunks"] == 18


# A text of about two minutes (1,812 characters) at 2.4 s of speech a chunk (`max_new_tokens` 120): some
# 80 chunks, each of which can end at its first step. `FORCED`'s first sentence makes that likely: the
# kit target's end of speech is the third most likely first code of "Wind still still.", so at top_k 3
# and temperature 10 about two decodes in five of that chunk end at once (row seed 0: the first, not
# the first retry; row seed 52: the first and all three retries).
TWO_MINUTES = "\n\n".join(PARAGRAPHS)
FORCED = {"text": "Wind still still. The boats came in.", "top_k": 3, "temperature": 10}
SHORT = "A short line of text."


def test_a_chunk_that_ends_at_once_is_decoded_again_and_sentences_that_fit_stay_whole(hook, kit_dir, kit_synth,
                                                                                        tmp_path):
    rows = [{"id": "long", "text": TWO_MINUTES}, {"id": "short", "text": SHORT},
            {"id": "saved", "seed": 0, **FORCED}, {"id": "lost", "seed": 52, **FORCED}]
    spec = job_spec(kit_dir, [str(write_manifest(tmp_path / "m.jsonl", rows))], str(tmp_path / "out"),
                    decoding={"method": "pcg", "max_new_tokens": 120, "seed": 1},
                    resources={"workers": 1, "rows_per_shard": 4, "batch_size": 8})
    planned = dry_run(spec)
    assert planned["text"]["rows_split_at_words"] == 1  # the two-minute text: some of its clauses are too long
    assert "  words      1 row would be cut between words (" in dry_run_text(planned)
    summary = JobRunner(spec, progress=False).run()
    out = {r["id"]: r for r in read_output(spec)}
    budget = Budget(120, kit_synth.max_context, lambda t: len(kit_synth.prompter.build(t)),
                    codes_per_second=kit_synth.family.codes_per_second)
    # the long row comes out whole: every chunk has speech, a lost one decoded again with a derived seed
    long = chunks_of(out["long"])
    assert out["long"]["error"] is None and sum(c["num_codes"] for c in long) == len(out["long"]["codes"])
    assert all(c["num_codes"] > 0 and budget.holds(c["text"]) for c in long)
    assert len(long) < len(TWO_MINUTES.split()) / 3  # no cut into single words: a chunk per clause or more
    seeds = chunk_seeds(item_seed(1, "long"), len(long))
    retried = [c for c in long if c["retries"]]
    assert retried and all(c["seed"] == retry_seed(seeds[c["index"]], 1, c["retries"]) for c in retried)
    assert all(c["seed"] == seeds[c["index"]] for c in long if not c["retries"])
    # a sentence whose speech fits its budget is not split
    assert out["short"]["error"] is None and chunks_of(out["short"]) == []
    saved, lost = chunks_of(out["saved"]), chunks_of(out["lost"])
    assert out["saved"]["error"] is None and [c["retries"] for c in saved] == [1, 0]
    assert saved[0]["seed"] == retry_seed(item_seed(0, "chunk/0"), 1, 1) and saved[0]["num_codes"] > 0
    # retries are bounded (text.chunk_retries, 3): the fourth decode that ends at once fails the row, naming it
    error = "chunk lost#0000: no speech codes to decode (finish_reason 'eos') after 4 attempts"
    assert out["lost"]["error"] == error and [c["retries"] for c in lost] == [3, 0]
    assert [e["error"] for e in summary["failed_examples"]] == [error]
    assert summary["rows_ok"] == 3 and summary["rows_failed"] == 1
    assert summary["chunk_retries"] == len(retried) + 1 + 3 == sum(c["retries"] for c in long + saved + lost)
    assert summary["rows_split_at_words"] == 1
    assert summary["word_cuts"] == sum(c["boundary"] == "word" for c in long) > 0
    table = summary_table(summary)
    assert f"{summary['chunk_retries']} chunk retries" in table
    assert table.count("cut between words") == 1 and "warning      1 long text cut between words" in table


def test_the_dry_run_counts_texts_cut_between_words_and_texts_no_cut_can_fit(kit_dir, tmp_path):
    """Under `split: auto` a budget below the headroom's two seconds leaves no room for any piece
    of text: such a text is decoded whole and stops at its limit, however long. The dry run counts
    those rows and says why, beside the rows it would cut between words."""
    rows = [{"id": "book", "text": ("The boats came in. " * 10_600)[:200_000]}, {"id": "ok", "text": "Hi."},
            {"id": "words", "text": "one two three four five six seven eight nine ten eleven twelve thirteen",
             "max_new_tokens": 120}]
    spec = job_spec(kit_dir, [str(write_manifest(tmp_path / "m.jsonl", rows))], str(tmp_path / "out"),
                    decoding={"max_new_tokens": 50})
    report = dry_run(spec)
    assert report["rows_too_long"] == 1 and report["text"]["rows_uncuttable"] == 1
    assert report["text"]["rows_split"] == 1 and report["text"]["rows_split_at_words"] == 1
    text = dry_run_text(report)
    assert ("  length     1 row to decode take longer to say than max_new_tokens allows (at 15 characters a "
            "second, 50 codes a second) and cannot be cut into chunks that do; 1 of them because a max_new_tokens "
            "below 105 leaves no room for any text beside the two seconds of headroom, so text.split auto decodes "
            "them whole: their audio would likely be cut at the limit") in text
    assert "  words      1 row would be cut between words (2 word cuts)" in text


FORMAT_ROWS = [{"id": "two", "text": "The boats came in. Twelve were in."}, {"id": "short", "text": "Hello there."},
               "{broken json", {"id": "night", "text": "Good night."}]
KEEPS = ("_commits", "_job.json", "_lease", "summary.json")  # the job's own records, not the dataset


def dataset_files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and not p.relative_to(out).parts[0].startswith(KEEPS)}


def read_back(out: Path, fmt: str, tarred: bool) -> list[tuple[dict, bytes]]:
    """(entry, audio bytes) of every clip, read as the format's toolkit reads it."""
    if fmt == "nemo" and tarred:
        return NemoManifest.read_tarred(f"{out}/sharded_manifests/manifest__OP_0..1_CL_.json",
                                        f"{out}/audio__OP_0..1_CL_.tar")
    if fmt == "nemo":
        return NemoManifest.read(out / "manifest.json")
    from lhotse import CutSet

    got = []
    for cut in CutSet.from_shar(in_dir=out / "shar"):
        buffer = io.BytesIO()
        sf.write(buffer, cut.load_audio()[0], RATE, format="WAV", subtype="PCM_16")
        got.append(({"id": cut.id, "text": cut.supervisions[0].text, "duration": cut.duration, **cut.custom},
                    buffer.getvalue()))
    return got


@pytest.mark.parametrize("fmt, tarred", [("nemo", False), ("nemo", True), ("lhotse-shar", False)])
def test_each_format_from_a_job_loads_with_its_reader_and_resumes(hook, kit_dir, tmp_path, fmt, tarred):
    manifest = write_manifest(tmp_path / "m.jsonl", FORMAT_ROWS)
    spec = spec_of(kit_dir, manifest, tmp_path / "out", fmt, tarred)
    summary = JobRunner(spec, progress=False).run()
    out = tmp_path / "out"
    assert summary["rows_ok"] == 3 and summary["rows_failed"] == 1 and summary["rows_split"] == 1
    got = {entry["id"]: (entry, data) for entry, data in read_back(out, fmt, tarred)}
    assert sorted(got) == ["night", "short", "two"]
    for entry, data in got.values():  # every duration is its audio's length
        assert entry["duration"] == pytest.approx(seconds(data), abs=1e-9) and seconds(data) > 0
    two = got["two"][0]
    assert two["text"] == FORMAT_ROWS[0]["text"] == two["normalized_text"]
    assert [c["boundary"] for c in two["chunks"]] == ["sentence", "end"]
    assert sum(c["num_codes"] for c in two["chunks"]) == two["num_codes"]
    if fmt == "lhotse-shar":
        assert two["codes"] and len(two["codes"]) == two["num_codes"]
    errors = [json.loads(line) for p in sorted((out / "errors").glob("*.jsonl")) for line in p.read_text().splitlines()]
    assert len(errors) == 1 and "audio" not in errors[0] and errors[0]["error"]
    # the summary names the failed row and where its record is
    assert [(e["id"], e["error"]) for e in summary["failed_examples"]] == [(errors[0]["id"], errors[0]["error"])]
    assert f"{errors[0]['id']}: " in summary_table(summary) and "every error record: `errors/*.jsonl`" in \
        summary_table(summary)
    records = {p.stem: json.loads(p.read_text()) for p in (out / "_commits").glob("*.json")}
    assert all(r["format"] == fmt and r["files"] for r in records.values())
    # resume: shard 1 as a worker that died before its commit left it (its files gone), and the
    # dataset's manifest not yet written; the rerun redoes shard 1 alone, to the same bytes
    before = dataset_files(out)
    (out / "_commits" / "shard-00001.json").unlink()
    (out / "summary.json").unlink()
    for uri in records["shard-00001"]["files"] + summary["output_files"]:
        Path(uri).unlink()
    again = JobRunner(spec, progress=False).run()
    assert again["shards"]["committed_before"] == 1 and again["shards"]["run_now"] == 1
    assert dataset_files(out) == before


def test_a_worker_killed_mid_shard_leaves_no_partial_tar_or_manifest(hook, kit_dir, tmp_path):
    spec = spec_of(kit_dir, write_manifest(tmp_path / "m.jsonl", FORMAT_ROWS), tmp_path / "out", "nemo", True)
    spec = spec.model_copy(update={"resources": spec.resources.model_copy(update={"max_retries": 0})})
    out, killed = tmp_path / "out", []

    def kill_when_paused() -> None:  # the worker wrote shard 1's tar in full, under a hidden name
        deadline = time.time() + 300
        while time.time() < deadline and not (hook / "paused").exists():
            time.sleep(0.05)
        killed.append(int((hook / "paused").read_text()))
        os.kill(killed[0], signal.SIGKILL)  # a real crash of the worker process, mid-shard

    (hook / "armed").write_text("audio_1.tar")
    watcher = threading.Thread(target=kill_when_paused, daemon=True)
    watcher.start()
    try:
        with pytest.raises(JobFailed, match="failed"):  # max_retries 0: the shard it held is not retried
            JobRunner(spec, progress=False).run()
    finally:
        watcher.join(timeout=310)
        (hook / "paused").unlink(missing_ok=True)
    assert killed and not (out / "_commits" / "shard-00001.json").exists()
    assert not (out / "audio_1.tar").exists() and not (out / "sharded_manifests" / "manifest_1.json").exists()
    assert not (out / "tarred_audio_manifest.json").exists()  # written once every shard is committed
    leftovers = list(out.glob(".audio_1.tar.*.tmp"))
    assert len(leftovers) == 1  # what the kill left: hidden, under no name a reader looks for
    if (out / "_commits" / "shard-00000.json").exists():  # committed before the kill: complete
        assert len(NemoManifest.read_tarred(f"{out}/sharded_manifests/manifest_0.json", f"{out}/audio_0.tar")) == 2
    done = JobRunner(spec, progress=False).run()  # the rerun resumes and completes
    assert done["shards"]["committed"] == 2 and done["rows_ok"] == 3 and not leftovers[0].exists()
    got = read_back(out, "nemo", tarred=True)
    assert sorted(e["id"] for e, _ in got) == ["night", "short", "two"]
    assert all(e["duration"] == pytest.approx(seconds(data), abs=1e-9) for e, data in got)
    assert [e for e, _ in got] == NemoManifest.lines(out / "tarred_audio_manifest.json")


def test_the_api_and_generate_prepare_texts_as_jobs_do(synth64, kit_dir, tmp_path):
    import pyarrow.parquet as pq

    from engine.cli import main
    from engine.codec.export import AudioOutput, export_audio
    from engine.codec.xcodec2 import Xcodec2Codec
    from engine.config import DecodingSettings, QualitySpec, TextSpec
    from engine.metrics.gate import QualityGate
    from engine.metrics.text import normalize
    from engine.records import SynthesisItem

    settings = DecodingSettings(method="exact", max_new_tokens=200, seed=1)
    texts = ["The boats came in. Twelve were in.", "Hello there.", MONEY]
    results, summary = synth64.synthesize(texts, settings, text=TextSpec(normalize="en"))
    assert [r.id for r in results] == ["0", "1", "2"] and [r.text for r in results] == texts
    assert [r.normalized_text for r in results] == [texts[0], texts[1], SAID]
    assert results[1].chunks is None and summary.items == summary.ok == 3
    # a split item's codes are its chunks' decoded on their own (float64: whatever shares the batch)
    for res in (results[0], results[2]):
        chunks = res.chunks
        alone, _ = synth64.synthesize([SynthesisItem(text=c["text"], id=f"{res.id}#{c['index']:04d}", seed=c["seed"])
                                       for c in chunks], settings)
        assert [r.codes for r in alone] == [
            res.codes[sum(c["num_codes"] for c in chunks[:i]):][:c["num_codes"]] for i, c in enumerate(chunks)]
        assert res.codes == [code for r in alone for code in r.codes]
    assert [c["boundary"] for c in results[0].chunks] == ["sentence", "end"]
    streamed = {r.id: r for r in synth64.stream(texts, settings, text=TextSpec(normalize="en"))}
    assert [streamed[r.id].codes for r in results] == [r.codes for r in results]
    # the joined clip: the chunks' audio, edges trimmed and crossfaded; the chunks in its provenance
    codec = Xcodec2Codec.load(kit_dir / "codec", device="cpu")
    export_audio(results, settings, codec, AudioOutput(parquet_path=tmp_path / "api.parquet"))
    rows = pq.read_table(tmp_path / "api.parquet").to_pylist()
    assert [r["normalized_text"] for r in rows] == [r.normalized_text for r in results]
    placed = json.loads(rows[0]["provenance"])["chunks"]
    assert rows[0]["duration"] == pytest.approx(sum(c["audio_seconds"] for c in placed) - CROSSFADE_S, abs=2 / RATE)
    # the quality gate measures what the model read: the normalised text
    gate = QualityGate(QualitySpec(min_chars_per_s=0.01), None, None, codec)
    said, _ = synth64.synthesize([MONEY], settings.model_copy(update={"max_new_tokens": 500}), quality=gate,
                                 text=TextSpec(normalize="en"))
    kept = said[0].quality.kept
    assert said[0].chunks is None and kept.speaking_rate == round(len(normalize(SAID)) / kept.duration, 4)
    # generate: --normalize and --split, the joined clip in the Parquet file
    out = tmp_path / "gen.parquet"
    assert main(["generate", "--kit", str(kit_dir), "--text", MONEY, "--normalize", "en", "--split", "sentences",
                 "--method", "ar", "--max-new-tokens", "200", "--device", "cpu", "--out", str(out), "--quiet"]) == 0
    row = pq.read_table(out).to_pylist()[0]
    assert row["text"] == MONEY and row["normalized_text"] == SAID and json.loads(row["provenance"])["chunks"]


def test_text_and_format_settings_at_their_defaults_keep_an_outputs_plan(kit_dir, tmp_path):
    """Outputs written before these settings existed resume (their plan's fingerprint is the
    same at the defaults); any other value is another job."""
    from engine.io.storage import Storage
    from engine.runtime.plan import make_plan, settings_fingerprint

    manifest = write_manifest(tmp_path / "m.jsonl", ROWS)
    default = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"))
    assert "text" not in settings_fingerprint(default) and set(settings_fingerprint(default)["output"]) == {
        "audio_format", "prompt_audio"}
    plans = {make_plan(default, Storage()).fingerprint}
    for section, value in (("text", {"split": "none"}), ("text", {"normalize": "en"}),
                           ("text", {"split_output": "rows"}), ("output", {"format": "nemo", "tarred": True}),
                           ("output", {"format": "lhotse-shar"})):
        raw = default.model_dump()
        raw[section].update(value)
        plans.add(make_plan(JobSpec.model_validate(raw), Storage()).fingerprint)
    assert len(plans) == 6
