"""Output formats (engine/io/formats) and `pcg-synth convert`, over the output of a real kit job:
each format read back with its toolkit's reader (Lhotse's `CutSet.from_shar`; NeMo's manifests
by `NemoManifest` below, which follows NeMo's documented fields), resume and idempotence, and a
writer killed with SIGKILL in the middle of a shard."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from engine.config import DecodingSettings, OutputSpec, StorageOptions
from engine.io.dataset import build_table
from engine.io.formats import write_shard
from engine.io.storage import Storage
from engine.runtime.convert import convert

from jobhelpers import NemoManifest, job_spec, run_on_local_ray, texts, write_manifest

ROOT = Path(__file__).resolve().parents[2]
RATE = 16_000


@pytest.fixture(scope="module")
def kit_output(kit_dir, tmp_path_factory):
    """A finished hf-parquet output of a real kit job: 3 shards, 8 rows, one an error record."""
    folder = tmp_path_factory.mktemp("job")
    manifest = write_manifest(folder / "m.jsonl", [*texts(7), "{broken json"])
    spec = job_spec(kit_dir, [str(manifest)], str(folder / "out"), resources={"workers": 1})
    run_on_local_ray(spec)
    return folder / "out"


def parquet_rows(out: Path) -> list[dict]:
    return [r for p in sorted((out / "data").glob("*.parquet")) for r in pq.read_table(p).to_pylist()]


def samples(data: bytes) -> np.ndarray:
    return sf.read(io.BytesIO(data), dtype="int16")[0]


def check_against_parquet(out: Path, got: list[tuple[str, str, float, bytes]]) -> None:
    """(id, text, duration, audio bytes) read from another format are the Parquet output's
    clips, each duration its audio's length."""
    rows = {r["id"]: r for r in parquet_rows(out) if r["audio"] is not None and r["error"] is None}
    assert sorted(g[0] for g in got) == sorted(rows)
    for ident, text, duration, data in got:
        clip = samples(data)
        assert duration == len(clip) / RATE > 0
        assert text == rows[ident]["text"]
        assert np.array_equal(clip, samples(rows[ident]["audio"]["bytes"]))


def error_ids(out: Path) -> list[str]:
    return sorted(r["id"] for r in parquet_rows(out) if r["error"])


def written_errors(dest: Path) -> list[str]:
    return sorted(json.loads(line)["id"] for p in (dest / "errors").glob("*.jsonl")
                  for line in p.read_text().splitlines())


def test_convert_to_nemo_manifests_read_as_nemo_reads_them(kit_output, tmp_path):
    dest = tmp_path / "nemo"
    done = convert(str(kit_output), "nemo", dest=str(dest), progress=False)
    assert done["shards"] == done["converted"] == 3 and done["with_audio"] == 7 and done["failed"] == 1
    got = NemoManifest.read(dest / "manifest.json")
    check_against_parquet(kit_output, [(e["id"], e["text"], e["duration"], data) for e, data in got])
    per_shard = [NemoManifest.read(dest / "audio" / f"shard-{n:05d}" / "manifest.json") for n in range(3)]
    assert [e for shard in per_shard for e, _ in shard] == [
        {**e, "audio_filepath": e["audio_filepath"].split("/")[-1]} for e, _ in got]
    assert written_errors(dest) == error_ids(kit_output) and len(error_ids(kit_output)) == 1
    assert all(e["method"] == "exact" and e["num_codes"] > 0 and isinstance(e["seed"], int) for e, _ in got)
    # a finished conversion run again changes nothing
    before = {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    again = convert(str(kit_output), "nemo", dest=str(dest), progress=False)
    assert again["converted"] == 0 and again["skipped"] == 3 and again["with_audio"] == 7
    assert {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()} == before


def test_convert_to_tarred_nemo_is_laid_out_as_nemos_tarred_datasets(kit_output, tmp_path):
    dest = tmp_path / "tarred"
    convert(str(kit_output), "nemo", dest=str(dest), tarred=True, progress=False)
    got = NemoManifest.read_tarred(f"{dest}/sharded_manifests/manifest__OP_0..2_CL_.json",
                                   f"{dest}/audio__OP_0..2_CL_.tar")
    check_against_parquet(kit_output, [(e["id"], e["text"], e["duration"], data) for e, data in got])
    whole = NemoManifest.lines(dest / "tarred_audio_manifest.json")
    assert whole == [e for e, _ in got] and {e["shard_id"] for e in whole} == {0, 1, 2}
    assert all("." not in Path(e["audio_filepath"]).stem for e in whole)  # WebDataset keys
    assert written_errors(dest) == error_ids(kit_output)


def test_convert_to_lhotse_shar_loads_with_cutset_from_shar(kit_output, tmp_path):
    from lhotse import CutSet

    dest = tmp_path / "shar"
    convert(str(kit_output), "lhotse-shar", dest=str(dest), progress=False)
    cuts = list(CutSet.from_shar(in_dir=dest / "shar"))
    rows = {r["id"]: r for r in parquet_rows(kit_output)}
    got = []
    for cut in cuts:
        audio = cut.load_audio()[0]
        assert len(audio) == round(cut.duration * RATE)
        assert cut.custom["codes"] == rows[cut.id]["codes"] and cut.custom["seed"] == rows[cut.id]["seed"]
        assert cut.custom["stats"] == rows[cut.id]["stats"] and cut.custom["settings"]["method"] == "exact"
        buffer = io.BytesIO()
        sf.write(buffer, audio, RATE, format="WAV", subtype="PCM_16")
        got.append((cut.id, cut.supervisions[0].text, cut.duration, buffer.getvalue()))
    check_against_parquet(kit_output, got)
    assert written_errors(dest) == error_ids(kit_output)


KILLER = """
import os, sys, time
from engine.runtime.convert import convert
real, stop_at = os.replace, sys.argv[5]

def pausing(src, dst, *args, **kwargs):  # the file is written in full under a hidden name: stop here
    if str(dst).endswith(stop_at):
        print("paused", flush=True)
        time.sleep(600)
    return real(src, dst, *args, **kwargs)

os.replace = pausing
convert(sys.argv[1], sys.argv[2], dest=sys.argv[3], tarred=sys.argv[4] == "tarred", progress=False)
"""


@pytest.mark.parametrize("fmt, tarred, stop_at, final", [
    ("nemo", True, "audio_1.tar", ["audio_1.tar", "sharded_manifests/manifest_1.json"]),
    ("nemo", False, "shard-00001/manifest.json", ["audio/shard-00001/manifest.json"]),
    ("lhotse-shar", False, "recording.000001.tar", ["shar/recording.000001.tar", "shar/cuts.000001.jsonl.gz"]),
])
def test_a_writer_killed_mid_shard_leaves_no_partial_file_and_a_rerun_completes(
        kit_output, tmp_path, fmt, tarred, stop_at, final):
    dest = tmp_path / "dest"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", KILLER, str(kit_output), fmt, str(dest),
                             "tarred" if tarred else "plain", stop_at], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "paused"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert (dest / "_commits" / "shard-00000.json").exists()  # the first shard was done
    assert not (dest / "_commits" / "shard-00001.json").exists()
    assert not any((dest / name).exists() for name in final)  # nothing of shard 1 under a final name
    leftovers = list(dest.rglob(f".{Path(stop_at).name}.*.tmp"))
    assert len(leftovers) == 1  # it was killed while writing shard 1
    done = convert(str(kit_output), fmt, dest=str(dest), tarred=tarred, progress=False)
    assert done["skipped"] == 1 and done["converted"] == 2 and done["with_audio"] == 7
    assert not leftovers[0].exists()
    if fmt == "lhotse-shar":
        from lhotse import CutSet

        assert sorted(c.id for c in CutSet.from_shar(in_dir=dest / "shar")) == sorted(
            r["id"] for r in parquet_rows(kit_output) if not r["error"])
    elif tarred:
        assert len(NemoManifest.read_tarred(f"{dest}/sharded_manifests/manifest__OP_0..2_CL_.json",
                                            f"{dest}/audio__OP_0..2_CL_.tar")) == 7
    else:
        assert len(NemoManifest.read(dest / "manifest.json")) == 7


def test_convert_refuses_unfinished_outputs_other_destinations_and_formats(kit_output, tmp_path, capsys):
    from engine.cli import main

    with pytest.raises(ValueError, match="not a pcg-synth job output"):
        convert(str(tmp_path / "nothing"), "nemo", progress=False)
    unfinished = tmp_path / "unfinished"
    shutil.copytree(kit_output, unfinished)
    (unfinished / "_commits" / "shard-00002.json").unlink()
    with pytest.raises(ValueError, match=r"not finished: 1 of 3 shards not committed \(first shard-00002\)"):
        convert(str(unfinished), "nemo", progress=False)
    assert not (tmp_path / "unfinished-nemo").exists()  # nothing written
    dest = tmp_path / "dest"
    convert(str(kit_output), "nemo", dest=str(dest), progress=False)
    with pytest.raises(ValueError, match="holds another conversion"):
        convert(str(kit_output), "lhotse-shar", dest=str(dest), progress=False)
    with pytest.raises(ValueError, match="holds a job's output"):
        convert(str(kit_output), "nemo", dest=str(unfinished), progress=False)
    with pytest.raises(ValueError, match="--tarred applies to --to nemo"):
        convert(str(kit_output), "lhotse-shar", tarred=True, progress=False)
    with pytest.raises(SystemExit) as exc:
        main(["convert", str(kit_output), "--to", "webdataset"])
    assert exc.value.code == 2 and "invalid choice: 'webdataset'" in capsys.readouterr().err
    assert main(["convert", str(unfinished), "--to", "nemo"]) == 2
    assert "is not finished" in capsys.readouterr().err
    assert main(["convert", str(kit_output), "--to", "nemo", "--dest", str(dest), "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["skipped"] == 3


def test_convert_reads_and_writes_s3(kit_output, s3_endpoint, s3_bucket):
    storage = Storage(StorageOptions(endpoint_url=s3_endpoint))
    source = f"s3://{s3_bucket}/job"
    for path in kit_output.rglob("*"):
        if path.is_file():
            storage.write_bytes(f"{source}/{path.relative_to(kit_output)}", path.read_bytes())
    done = convert(source, "nemo", tarred=True, storage_options=StorageOptions(endpoint_url=s3_endpoint),
                   progress=False)
    assert done["dest"] == f"{source}-nemo" and done["with_audio"] == 7
    lines = [json.loads(x) for x in storage.read_bytes(f"{source}-nemo/tarred_audio_manifest.json").splitlines()]
    for shard in range(3):
        with tarfile.open(fileobj=io.BytesIO(storage.read_bytes(f"{source}-nemo/audio_{shard}.tar"))) as tar:
            for entry in (e for e in lines if e["shard_id"] == shard):
                data = tar.extractfile(entry["audio_filepath"]).read()
                assert entry["duration"] == len(samples(data)) / RATE
    assert len(lines) == 7


def test_hf_parquet_writer_writes_the_bytes_export_audio_writes(kit_dir, tmp_path):
    from engine.codec.export import AudioOutput, export_audio, render_rows, windows
    from engine.codec.xcodec2 import Xcodec2Codec
    from engine.records import SynthesisResult

    codec = Xcodec2Codec.load(kit_dir / "codec", device="cpu")
    rng = np.random.default_rng(0)
    results = [SynthesisResult(id=f"r{i}", text=f"text {i}", seed=i, finish_reason="stop",
                               codes=rng.integers(0, codec.codebook_size, 10 + i).tolist()) for i in range(5)]
    results.append(SynthesisResult(id="bad", text="x", seed=9, error="boom"))
    settings = DecodingSettings()
    buffer = io.BytesIO()
    export_audio(results, settings, codec, AudioOutput(parquet_path=buffer, audio_format="flac", window=2))
    tables = [build_table(render_rows(codec, results[part], [None] * len(results[part]), audio_format="flac"),
                          settings, codec.sample_rate) for part in windows(len(results), 2)]
    written = write_shard(Storage(), OutputSpec(uri=str(tmp_path)), "shard-00000", tables)
    assert (tmp_path / "data" / "shard-00000.parquet").read_bytes() == buffer.getvalue()
    assert written.rows == 6 and written.with_audio == 5 and written.errors is None
