"""The output dataset: one Parquet file per shard that `datasets.load_dataset("parquet")` reads
with an `Audio` column.

`build_table` is a pure function (rows -> `pyarrow.Table`) so Ray workers can build a shard's
table anywhere; `parquet_writer` / `write_parquet` write tables to a local path (atomically,
through a temporary file and a rename) or to any binary file-like object (the storage layer
hands in S3 streams).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from engine.config import DecodingSettings, TextSpec
from engine.io.files import publish, sync_file
from engine.records import RowStats, SynthesisResult


def huggingface_metadata(sampling_rate: int) -> dict[bytes, bytes]:
    """Schema metadata that makes `datasets` type the `audio` column as `Audio`; the other
    columns' features are inferred from their Arrow types."""
    features = {"audio": {"_type": "Audio", "sampling_rate": sampling_rate}}
    return {b"huggingface": json.dumps({"info": {"features": features}}).encode()}


def _arrow_type(value) -> pa.DataType:
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        return pa.int64()
    if isinstance(value, float):
        return pa.float64()
    if isinstance(value, list):
        return pa.list_(_arrow_type(value[0]))
    raise TypeError(f"no Arrow type for statistic value {value!r}")


def stats_type() -> pa.StructType:
    """Struct of `RowStats.to_dict()`, typed from a populated example so that statistics added
    to `RowStats` appear here without editing the schema."""
    example = RowStats(rounds=1, emitted=1, reached=[1], accepted=[1]).to_dict()
    return pa.struct([(k, _arrow_type(v)) for k, v in example.items()])


# Columns of prepared texts (`text:` in a job spec), after the dataset's own: written by a job
# that normalises texts (normalized_text: what the model read) or writes a split row's chunks as
# rows of their own (parent_id: the manifest row's id, segment: the chunk's index; null for rows
# not split). They follow the job's settings, not its data, so every shard of a job has the same
# columns (`datasets` reads a folder of shards only then); a job with neither has none of them.
TEXT_FIELDS = (
    pa.field("normalized_text", pa.string()),
    pa.field("parent_id", pa.string()),
    pa.field("segment", pa.int32()),
)


def text_columns(text: TextSpec) -> tuple[str, ...]:
    """The `TEXT_FIELDS` a job with these text settings writes."""
    names = ["normalized_text"] if text.normalize != "none" else []
    if text.split != "none" and text.split_output == "rows":
        names += ["parent_id", "segment"]
    return tuple(names)


def dataset_schema(sampling_rate: int, text: Sequence[str] = ()) -> pa.Schema:
    """Columns of a shard (nullable unless said; their meaning: docs/guides/audio.md), with the
    `TEXT_FIELDS` named in `text`."""
    fields = [
        pa.field("id", pa.string(), nullable=False),
        pa.field("text", pa.string()),
        # Exactly `datasets.Audio`'s storage type, so its metadata feature matches the field.
        pa.field("audio", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        pa.field("codes", pa.list_(pa.int32())),  # generated codec codes, prompt excluded
        pa.field("num_codes", pa.int32()),
        pa.field("duration", pa.float64()),  # seconds of audio in `audio`; null without audio
        pa.field("sampling_rate", pa.int32()),
        pa.field("prompt_id", pa.string()),
        pa.field("prompt_audio", pa.string()),  # strip | include | context; null without prompt
        pa.field("method", pa.string()),
        pa.field("settings", pa.string()),  # DecodingSettings as JSON (sorted keys)
        pa.field("seed", pa.int64()),
        pa.field("text_id", pa.string()),  # augmentation: the manifest row a variant came from
        pa.field("provenance", pa.string()),  # JSON: prompt, augmentation seed, model revisions
        pa.field("finish_reason", pa.string()),
        pa.field("stats", stats_type()),
        pa.field("error", pa.string()),
        *(f for f in TEXT_FIELDS if f.name in text),
    ]
    return pa.schema(fields, metadata=huggingface_metadata(sampling_rate))


@dataclass
class AudioRow:
    """One synthesized item and what the codec made of it.

    Attributes:
        result: the decoding core's result (codes, finish reason, stats, decoding error).
        audio: WAV/FLAC file bytes, or None when no audio was produced.
        audio_path: the file name kept in `audio.path` (its extension tells the format).
        num_samples: samples in `audio` (at the dataset's sampling rate).
        prompt_id: the voice prompt's id, if one was used.
        prompt_audio: how the prompt's codes entered the audio (strip | include | context).
        error: a codec-side error; a decoding error in `result.error` takes precedence.
        provenance: where it came from (text id, prompt, seeds, model revisions; a split row's
            chunks).
        normalized_text, parent_id, segment: the `TEXT_FIELDS` (None: not normalised, not a
            chunk written as a row).
    """

    result: SynthesisResult
    audio: bytes | None = None
    audio_path: str | None = None
    num_samples: int = 0
    prompt_id: str | None = None
    prompt_audio: str | None = None
    error: str | None = None
    provenance: dict | None = None
    normalized_text: str | None = None
    parent_id: str | None = None
    segment: int | None = None


def build_table(rows: Sequence[AudioRow], settings: DecodingSettings | Sequence[DecodingSettings],
                sampling_rate: int, text: Sequence[str] = ()) -> pa.Table:
    """A shard's rows as a table with `dataset_schema(sampling_rate, text)` (pure: no I/O).

    `settings` is one `DecodingSettings` for all rows, or one per row (per-row overrides)."""
    per_row = [settings] * len(rows) if isinstance(settings, DecodingSettings) else list(settings)
    if len(per_row) != len(rows):
        raise ValueError(f"{len(per_row)} settings for {len(rows)} rows")
    schema = dataset_schema(sampling_rate, text)
    columns: dict[str, list] = {name: [] for name in schema.names}
    for row, row_settings in zip(rows, per_row):
        res = row.result
        has_audio = row.audio is not None
        values = {
            "id": res.id,
            "text": res.text,
            "audio": {"bytes": row.audio, "path": row.audio_path} if has_audio else None,
            "codes": list(res.codes),
            "num_codes": len(res.codes),
            "duration": row.num_samples / sampling_rate if has_audio else None,
            "sampling_rate": sampling_rate,
            "prompt_id": row.prompt_id,
            "prompt_audio": row.prompt_audio if row.prompt_id is not None else None,
            "method": row_settings.method,
            "settings": json.dumps(row_settings.model_dump(), sort_keys=True),
            "seed": res.seed,
            "text_id": (row.provenance or {}).get("text_id"),
            "provenance": json.dumps(row.provenance, sort_keys=True) if row.provenance else None,
            "finish_reason": res.finish_reason,
            "stats": res.stats.to_dict() if res.stats is not None else None,
            "error": res.error or row.error,
            **{name: getattr(row, name) for name in text},
        }
        for name, value in values.items():
            columns[name].append(value)
    return pa.Table.from_pydict(columns, schema=schema)


# The quality gate's columns (`quality:` in a job spec), after the dataset's own: the kept
# attempt's scores, the attempts decoded, why a row was rejected, and every attempt's scores.
QUALITY_FIELDS = (
    pa.field("cer", pa.float64()),  # character error rate of the ASR transcript (a fraction)
    pa.field("wer", pa.float64()),  # word error rate (a fraction)
    pa.field("hypothesis", pa.string()),  # the ASR's transcript
    pa.field("speaker_similarity", pa.float64()),  # cosine to the voice prompt's speaker embedding
    pa.field("speaking_rate", pa.float64()),  # characters of normalised text per second of speech
    pa.field("attempts", pa.int32()),  # decodes of the row (the kept one's seed is `seed`)
    pa.field("reject_reason", pa.string()),  # why no attempt passed; null for rows kept
    pa.field("attempt_scores", pa.string()),  # JSON: every attempt's seed, scores, failed checks
)


def quality_schema(sampling_rate: int, text: Sequence[str] = ()) -> pa.Schema:
    """`dataset_schema` with the quality gate's columns."""
    base = dataset_schema(sampling_rate, text)
    return pa.schema([*base, *QUALITY_FIELDS], metadata=base.metadata)


def with_quality(table: pa.Table, results: Sequence[SynthesisResult]) -> pa.Table:
    """`table` (rows of `results`, in order) with the quality gate's columns (null for rows the
    gate did not decide: error rows)."""
    values: dict[str, list] = {f.name: [] for f in QUALITY_FIELDS}
    for res in results:
        verdict = res.quality
        kept = verdict.kept if verdict else None
        row = {"attempts": len(verdict.attempts) if verdict else None,
               "reject_reason": verdict.reason if verdict else None,
               "attempt_scores": json.dumps([asdict(a) for a in verdict.attempts]) if verdict else None}
        for name in ("cer", "wer", "hypothesis", "speaker_similarity", "speaking_rate"):
            row[name] = getattr(kept, name) if kept else None
        for name, column in values.items():
            column.append(row[name])
    for f in QUALITY_FIELDS:
        table = table.append_column(f, pa.array(values[f.name], f.type))
    return table


@contextlib.contextmanager
def parquet_writer(dest: str | Path | BinaryIO, schema: pa.Schema) -> Iterator[pq.ParquetWriter]:
    """A Parquet writer for `dest`; each `write_table` call adds row groups.

    A path is written to a temporary sibling, fsynced and renamed into place on success (readers
    never see half a file; a failure leaves no file; a crash after it returns keeps all of it).
    A file-like object is written as is and left open for its owner.
    """
    if not isinstance(dest, (str, Path)):
        with pq.ParquetWriter(dest, schema, compression="zstd") as writer:
            yield writer
        return
    path = Path(dest)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with pq.ParquetWriter(str(tmp), schema, compression="zstd") as writer:
            yield writer
        sync_file(tmp)  # on the disk before the rename publishes it (files.publish fsyncs the folder)
        publish(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_parquet(table: pa.Table, dest: str | Path | BinaryIO) -> int:
    """Write one table (one shard) to `dest`; returns its row count."""
    with parquet_writer(dest, table.schema) as writer:
        writer.write_table(table)
    return table.num_rows
