"""Write: a shard's rows -> its files in `output.format`, then its commit record (the last stage).

Every manifest row is written exactly once: rows with audio and error rows go to the shard's
files in manifest order (`engine.io.formats.write_shard`: `data/<shard>.parquet`, NeMo's
manifest and audio, or Lhotse Shar; nemo and lhotse-shar keep error rows in
`errors/<shard>.jsonl`), rows the quality gate rejected to `rejects/<shard>.parquet` (every
format; in the dataset's schema, with the reason) or nowhere when the job drops them. A row
whose text was split is written as one row, its parts joined (`split.join_row`), or with
`text.split_output: rows` as one row per part, with the parent's id and the part's segment.
The commit record is written last, so a shard counts as done only when its files are complete; a
worker that dies in between leaves an uncommitted shard that is redone (its files overwritten
with the same rows). In a job every write is fenced by the driver's lease (`engine.io.lease`):
refused once a newer driver holds the output, and the commit record names the lease generation
that wrote it (`lease_generation`).
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Callable
from dataclasses import replace

import pyarrow as pa

from engine.codec.export import audio_row, windows
from engine.config import JobSpec
from engine.io.dataset import (
    AudioRow,
    build_table,
    dataset_schema,
    parquet_writer,
    quality_schema,
    text_columns,
    with_quality,
)
from engine.io.formats import write_shard
from engine.io.lease import FencedStorage
from engine.io.storage import Storage, join
from engine.records import FAILED_EXAMPLES, aggregate
from engine.runtime.commits import CommitRecord, FailedRow, QualityFigures, SplitCounts
from engine.runtime.metrics import Measured
from engine.runtime.plan import Layout
from engine.runtime.stages.codec import CodecStage
from engine.runtime.stages.row import Row, ShardTask
from engine.runtime.stages.split import join_row, split_counts

WINDOW = 256  # rows encoded and built into a table at a time: a shard's waveforms are never all in memory


class WriteStage:
    """A shard's rows into its files and its commit record.

    Args:
        spec: the job (output format, prompt audio, text settings, batch size).
        storage: where the files go.
        codec: decodes rows that reach this stage without audio (no quality gate).
        sample_rate: the codec's.
        worker_info: the worker's identity and environment, for every commit record.
    """

    def __init__(self, spec: JobSpec, storage: Storage, codec: CodecStage, sample_rate: int,
                 worker_info: Callable[[], dict]) -> None:
        self.spec, self.storage, self.codec = spec, storage, codec
        self.sample_rate, self.worker_info = sample_rate, worker_info
        self.layout = Layout(spec.output.uri)
        self.quality = spec.quality.enabled
        self.text = text_columns(spec.text)
        self.as_rows = spec.text.split_output == "rows"
        self.schema = (quality_schema if self.quality else dataset_schema)(sample_rate, self.text)

    def rejects(self, shard) -> str:
        """Where a shard's rejected rows go: `rejects/<shard>.parquet`."""
        return join(self.layout.root, "rejects", f"{shard.id}.parquet")

    def outputs(self, row: Row) -> list[Row]:
        """The rows written for a manifest row: itself, or its parts (`split_output: rows`)."""
        return row.parts if row.parts and self.as_rows else [row]

    def audio_row(self, row: Row) -> AudioRow:
        """A row as the dataset stores it (its kept attempt's audio encoded; a split row's parts
        joined)."""
        if row.parts:
            audio = join_row(row, self.sample_rate)
        else:
            kept, audio = row.kept, None
            if kept is not None and row.result.error is None:
                audio = kept.wave if kept.wave is not None else kept.error
        made = audio_row(row.result, row.prompt, self.spec.output.prompt_audio, row.origin, audio,
                         self.spec.output.audio_format, self.sample_rate)
        parent = row.parent
        normalized = row.normalized if parent is None else (row.text if parent.normalized is not None else None)
        made.normalized_text, made.segment = normalized, row.segment
        made.parent_id = parent.id if parent is not None else None
        return made

    def tables(self, rows: list[Row]) -> tuple[list[pa.Table], set[int]]:
        """The tables of `rows` (written rows: manifest rows or parts), a window at a time, and
        the rows (by `id()`) written with audio. Rows still without audio are decoded here, and
        every window's waveforms are freed once encoded."""
        tables, voiced = [], set()
        for part in windows(len(rows), WINDOW):
            window = rows[part]
            units = [u for row in window for u in row.units()]
            self.codec([u.kept for u in units if u.kept is not None and u.result.error is None])
            start = time.perf_counter()
            audio = [self.audio_row(row) for row in window]
            if window and window[0].task is not None:
                window[0].task.codec_s += time.perf_counter() - start  # encoding, with the codec's time
            table = build_table(audio, [row.settings for row in window], self.sample_rate, self.text)
            tables.append(with_quality(table, [row.result for row in window]) if self.quality else table)
            for unit in units:
                if unit.kept is not None:
                    unit.kept.wave = None
            voiced.update(id(row) for row, made in zip(window, audio) if made.audio is not None)
        return tables, voiced

    def table_bytes(self, rows: list[Row]) -> bytes:
        """`rows` as the bytes of one Parquet file (the rejects', or a warm-up's)."""
        buffer = io.BytesIO()
        with parquet_writer(buffer, self.schema) as writer:
            for table in self.tables(rows)[0]:
                writer.write_table(table)
        return buffer.getvalue()

    def __call__(self, task: ShardTask, measure: Callable[[], Measured]) -> CommitRecord:
        """Write the shard's files, then its commit record (returned). `measure()` gives what the
        pipeline measured since the last record (taken when called, after the files are written)."""
        shard = task.shard
        storage = FencedStorage(self.storage, task.fence) if task.fence is not None else self.storage
        written = [out for row in task.rows for out in self.outputs(row)]
        kept = [out for out in written if not out.rejected]
        rejected = [out for out in written if out.rejected]
        tables, voiced = self.tables(kept)
        files = write_shard(storage, self.spec.output, shard.id, tables, self.schema)
        if rejected and self.spec.quality.on_reject == "rejects":
            storage.write_bytes(self.rejects(shard), self.table_bytes(rejected))
        silent = [row for row in task.rows if not all(id(out) in voiced for out in self.outputs(row))]
        ok = len(task.rows) - len(silent)
        rows_rejected = sum(row.rejected for row in task.rows)
        failed = [row for row in silent if not row.rejected]
        stats = aggregate([s for row in task.rows for s in row.work()])  # every attempt decoded
        measured = measure()
        figures = measured.figures
        quality, rejects = self.verdicts(task) if self.quality else (None, None)
        split = split_counts(task.rows, None)  # its split rows' counts (empty: none was split)
        record = CommitRecord(
            shard=shard.id, manifest=shard.manifest, rows=shard.rows, ok=ok,
            failed=shard.rows - ok - rows_rejected, rejected=rows_rejected,
            failed_rows=[FailedRow(row.result.id, row_error(row)) for row in failed[:FAILED_EXAMPLES]],
            cut=sum(out.result.cut for out in kept),  # rows written whose audio stops at the token limit
            audio_seconds=round(files.audio_seconds, 3), generated_tokens=stats.generated_tokens,
            rounds=stats.rounds, emitted=stats.emitted, reached=stats.reached,
            accepted=stats.accepted, thinning_trials=stats.thinning_trials,
            codec_s=round(task.codec_s, 3),
            wall_s=round(time.perf_counter() - task.received, 4), attempt=task.attempt,
            batch_size=self.spec.resources.batch_size,
            pipeline=replace(figures, counters=figures.counters.rounded(4)),
            quality=quality, rejects=rejects,
            split=SplitCounts(**split) if split else None,
            written_rows=len(kept) if self.as_rows else None,
            data=self.layout.data(shard) if self.spec.output.format == "hf-parquet" else None,
            format=self.spec.output.format, files=files.files, errors=files.errors,
            **self.worker_info(),
            storage_retries=self.storage.retries,  # this worker's, so far (transient failures ridden out)
        )
        if measured.profile is not None:  # finished with this shard's rounds: written once, named in this record
            record.profile = self.write_profile(measured.profile, record, storage)
        record.committed_at = round(time.time(), 3)  # unix time: the span of a job's commits
        if isinstance(storage, FencedStorage):
            storage.write_commit(self.layout.commit(shard), record.to_dict())
            record.lease_generation = task.fence.generation
        else:
            storage.write_bytes(self.layout.commit(shard), json.dumps(record.to_dict(), indent=1).encode())
        return record

    def verdicts(self, task: ShardTask) -> tuple[QualityFigures, str | None]:
        """The quality gate's part of a shard's commit record: its figures over what was decoded
        (rows, or the parts of split rows: each is checked on its own), and the shard's rejects
        file (None: none written)."""
        units = task.units()
        judged = [u.result.quality for u in units if u.result.quality is not None]
        failing = sum(not v.passed for v in judged)
        dropped = self.spec.quality.on_reject == "drop"
        figures = QualityFigures(
            checked=len(judged), passed=sum(v.passed for v in judged), rejected=failing,
            dropped=failing if dropped else 0,
            regenerated=sum(len(v.attempts) > 1 for v in judged) if self.spec.quality.best_of == 1 else 0,
            decodes=sum(len(u.attempts) for u in units), verify_s=round(task.verify_s, 4))
        return figures, self.rejects(task.shard) if failing and not dropped else None

    def write_profile(self, profile: dict, record: CommitRecord, storage: Storage) -> str:
        """Write a finished decode-loop profile under `_profiles/` (and its Chrome trace, if
        kept); returns the profile's URI."""
        trace = profile.pop("trace_gz", None)
        name = f"{record.worker}-{os.getpid()}"
        profile = {"worker": record.worker, "pid": os.getpid(), "device": record.device,
                   "batch_size": self.spec.resources.batch_size, **profile}
        if trace is not None:
            profile["trace"] = self.layout.profile(f"{name}.trace.json.gz")
            storage.write_bytes(profile["trace"], trace)
        uri = self.layout.profile(f"{name}.json")
        storage.write_bytes(uri, json.dumps(profile, indent=1).encode())
        return uri


def row_error(row: Row) -> str:
    """Why a manifest row has no audio: its own error, or its first failing part's, or why its
    kept attempt has none (no speech codes to decode, the codec refused them)."""
    for r in (row, *row.parts):
        why = r.result.error or (r.kept.error if r.kept is not None else None)
        if why:
            return why
    return "no audio"
