"""The Parquet/Arrow output format: schema, table builder, writer, `datasets` compatibility."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from engine.codec.audio import audio_bytes, read_audio_bytes, to_pcm16
from engine.config import DecodingSettings
from engine.io.dataset import AudioRow, build_table, dataset_schema, parquet_writer, write_parquet
from engine.records import RowStats, SynthesisResult

SETTINGS = DecodingSettings(method="pcg", temperature=0.7, theta=0.42)


def make_rows() -> tuple[list[AudioRow], list[np.ndarray]]:
    rng = np.random.default_rng(0)
    waves = [rng.uniform(-0.5, 0.5, 320 * n).astype(np.float32) for n in (3, 5)]
    stats = RowStats(rounds=4, emitted=9, reached=[4, 3], accepted=[3, 2], prompt_tokens=20,
                     generated_tokens=9)
    ok = [SynthesisResult(id=f"u{i}", text=f"text {i}", seed=10 + i, codes=list(range(1, len(w) // 320 + 1)),
                          finish_reason="eos", stats=stats) for i, w in enumerate(waves)]
    rows = [AudioRow(result=r, audio=audio_bytes(w, 16000, fmt), audio_path=f"{r.id}.{fmt}",
                     num_samples=len(w), prompt_id="p-1" if i == 0 else None, prompt_audio="strip")
            for i, (r, w, fmt) in enumerate(zip(ok, waves, ("wav", "flac")))]
    failed = SynthesisResult(id="bad", text="too long", seed=3, error="prompt is 3000 tokens")
    rows.append(AudioRow(result=failed))
    codec_failed = SynthesisResult(id="oob", text="x", seed=4, codes=[70000], finish_reason="length")
    rows.append(AudioRow(result=codec_failed, error="item oob: code 70000 at position 0 is outside"))
    return rows, waves


def test_schema_marks_audio_for_datasets():
    import datasets

    schema = dataset_schema(16000)
    meta = json.loads(schema.metadata[b"huggingface"])
    assert meta == {"info": {"features": {"audio": {"_type": "Audio", "sampling_rate": 16000}}}}
    assert schema.field("audio").type == datasets.Audio().pa_type  # else datasets ignores it
    features = datasets.Features.from_arrow_schema(schema)
    assert isinstance(features["audio"], datasets.Audio) and features["audio"].sampling_rate == 16000


def test_stats_struct_follows_row_stats():
    fields = [f.name for f in dataset_schema(16000).field("stats").type]
    assert fields == list(RowStats().to_dict())


def test_build_table_values():
    rows, waves = make_rows()
    table = build_table(rows, SETTINGS, 16000)
    assert table.schema.equals(dataset_schema(16000), check_metadata=True)
    col = table.to_pydict()
    assert col["id"] == ["u0", "u1", "bad", "oob"]
    assert col["num_codes"] == [3, 5, 0, 1]
    assert col["duration"] == [len(waves[0]) / 16000, len(waves[1]) / 16000, None, None]
    assert col["sampling_rate"] == [16000] * 4
    assert col["prompt_id"] == ["p-1", None, None, None]
    assert col["prompt_audio"] == ["strip", None, None, None]  # no mode without a prompt
    assert col["method"] == ["pcg"] * 4
    assert json.loads(col["settings"][0]) == SETTINGS.model_dump()
    assert col["seed"] == [10, 11, 3, 4]
    assert col["finish_reason"] == ["eos", "eos", "error", "length"]
    assert col["stats"][0]["accepted_per_position"] == [3, 2]
    assert col["stats"][0]["mean_accepted_length"] == pytest.approx(9 / 4)
    assert col["stats"][2] is None
    assert col["audio"][2] is None and col["audio"][1]["path"] == "u1.flac"
    assert col["error"] == [None, None, "prompt is 3000 tokens", rows[3].error]


def test_written_file_reads_back_with_the_same_samples(tmp_path):
    rows, waves = make_rows()
    path = tmp_path / "shard-00000.parquet"
    assert write_parquet(build_table(rows, SETTINGS, 16000), path) == 4
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
    table = pq.read_table(path)
    assert table.schema.metadata[b"huggingface"] == dataset_schema(16000).metadata[b"huggingface"]
    for cell, wave in zip(table.column("audio").to_pylist()[:2], waves):
        samples, sr = read_audio_bytes(cell["bytes"])
        assert sr == 16000
        np.testing.assert_array_equal(samples, to_pcm16(wave))


def test_writes_to_a_file_like_object():
    rows, _ = make_rows()
    buf = io.BytesIO()
    write_parquet(build_table(rows, SETTINGS, 16000), buf)
    assert not buf.closed  # its owner (e.g. an S3 upload) closes it
    table = pq.read_table(io.BytesIO(buf.getvalue()))
    assert table.column("id").to_pylist() == ["u0", "u1", "bad", "oob"]


def test_failed_write_leaves_no_file(tmp_path):
    rows, _ = make_rows()
    path = tmp_path / "shard.parquet"
    with pytest.raises(RuntimeError, match="worker died"):
        with parquet_writer(path, dataset_schema(16000)) as writer:
            writer.write_table(build_table(rows, SETTINGS, 16000))
            raise RuntimeError("worker died")
    assert list(tmp_path.iterdir()) == []


def test_datasets_loads_an_audio_column(tmp_path):
    import datasets

    rows, waves = make_rows()
    path = tmp_path / "shard.parquet"
    write_parquet(build_table(rows, SETTINGS, 16000), path)
    ds = datasets.load_dataset("parquet", data_files=str(path), split="train",
                               cache_dir=str(tmp_path / "hf-cache"))
    assert isinstance(ds.features["audio"], datasets.Audio)
    assert ds.features["audio"].sampling_rate == 16000
    assert ds.num_rows == 4
    raw = ds.cast_column("audio", datasets.Audio(decode=False))  # decoding needs torchcodec
    samples, _ = read_audio_bytes(raw[0]["audio"]["bytes"])
    np.testing.assert_array_equal(samples, to_pcm16(waves[0]))
    assert raw[0]["stats"]["rounds"] == 4 and raw[2]["audio"] is None
