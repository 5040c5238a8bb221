"""Write: a shard's rows -> its Parquet file, then its commit record (the last stage).

Every manifest row is written exactly once: rows with audio and error rows to
`data/<shard>.parquet` in manifest order (rows the quality gate rejected to
`rejects/<shard>.parquet`, in the same schema with the reason, or nowhere when the job drops
them). The commit record is written last, so a shard counts as done only when its files are
complete; a worker that dies in between leaves an uncommitted shard that is redone (its files
overwritten with the same rows).
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Callable

from engine.codec.export import audio_row, windows
from engine.config import JobSpec
from engine.io.dataset import AudioRow, build_table, dataset_schema, parquet_writer, quality_schema, with_quality
from engine.io.storage import Storage, join
from engine.records import aggregate
from engine.runtime.plan import Layout
from engine.runtime.stages.codec import CodecStage
from engine.runtime.stages.row import Row, ShardTask

WINDOW = 256  # rows encoded and written per row group: a shard's audio is never all in memory


class WriteStage:
    """A shard's rows into its files and its commit record.

    Args:
        spec: the job (output format, prompt audio, batch size).
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

    def rejects(self, shard) -> str:
        """Where a shard's rejected rows go: `rejects/<shard>.parquet`."""
        return join(self.layout.root, "rejects", f"{shard.id}.parquet")

    def audio_row(self, row: Row) -> AudioRow:
        """A row as the dataset stores it (its kept attempt's audio encoded)."""
        kept, audio = row.kept, None
        if kept is not None and row.result.error is None:
            audio = kept.wave if kept.wave is not None else kept.error
        return audio_row(row.result, row.prompt, self.spec.output.prompt_audio, row.origin, audio,
                         self.spec.output.audio_format, self.sample_rate)

    def table_bytes(self, rows: list[Row]) -> tuple[bytes, int, int]:
        """(Parquet file bytes of `rows`, rows with audio, their samples), a window at a time:
        rows still without audio are decoded here, and every window's audio is freed once
        written."""
        buffer, with_audio, samples = io.BytesIO(), 0, 0
        schema = (quality_schema if self.quality else dataset_schema)(self.sample_rate)
        with parquet_writer(buffer, schema) as writer:
            for part in windows(len(rows), WINDOW):
                window = rows[part]
                self.codec([row.kept for row in window if row.kept is not None and row.result.error is None])
                start = time.perf_counter()
                audio = [self.audio_row(row) for row in window]
                if window and window[0].task is not None:
                    window[0].task.codec_s += time.perf_counter() - start  # encoding, with the codec's time
                table = build_table(audio, [row.settings for row in window], self.sample_rate)
                writer.write_table(with_quality(table, [row.result for row in window]) if self.quality else table)
                for row, written in zip(window, audio):
                    if row.kept is not None:
                        row.kept.wave = None
                    if written.audio is not None:
                        with_audio, samples = with_audio + 1, samples + written.num_samples
        return buffer.getvalue(), with_audio, samples

    def __call__(self, task: ShardTask, figures: Callable[[], dict]) -> dict:
        """Write the shard's file, then its commit record (returned). `figures()` gives what the
        pipeline measured since the last record (taken when called, after the file is written)."""
        shard = task.shard
        rows = [row for row in task.rows if not row.rejected]
        rejected = [row for row in task.rows if row.rejected]
        data, ok, samples = self.table_bytes(rows)
        self.storage.write_bytes(self.layout.data(shard), data)
        if rejected and self.spec.quality.on_reject == "rejects":
            self.storage.write_bytes(self.rejects(shard), self.table_bytes(rejected)[0])
        stats = aggregate([s for row in task.rows for s in row.work()])  # every attempt decoded
        measured = figures()
        profile = measured.pop("profile", None)
        record = {
            "shard": shard.id, "manifest": shard.manifest, "rows": shard.rows, "ok": ok,
            "failed": shard.rows - ok - len(rejected), "rejected": len(rejected),
            "cut": sum(row.result.cut for row in rows),  # rows written whose audio stops at the token limit
            "audio_seconds": round(samples / self.sample_rate, 3), "generated_tokens": stats.generated_tokens,
            "rounds": stats.rounds, "emitted": stats.emitted, "reached": stats.reached,
            "accepted": stats.accepted, "thinning_trials": stats.thinning_trials,
            "codec_s": round(task.codec_s, 3),
            "wall_s": round(time.perf_counter() - task.received, 4), "attempt": task.attempt,
            "batch_size": self.spec.resources.batch_size,
            **{k: round(v, 4) if isinstance(v, float) else v for k, v in measured.items()},
            **(self.verdicts(task) if self.quality else {}),
            "data": self.layout.data(shard), **self.worker_info(),
            "storage_retries": self.storage.retries,  # this worker's, so far (transient failures ridden out)
        }
        if profile is not None:  # finished with this shard's rounds: written once, named in this record
            record["profile"] = self.write_profile(profile, record)
        self.storage.write_bytes(self.layout.commit(shard), json.dumps(record, indent=1).encode())
        return record

    def verdicts(self, task: ShardTask) -> dict:
        """The quality gate's figures of a shard: rows it kept and rejected, rows decoded more
        than once, attempts decoded, seconds spent checking."""
        judged = [row.result.quality for row in task.rows if row.result.quality is not None]
        dropped = self.spec.quality.on_reject == "drop"
        return {"quality": {"checked": len(judged), "passed": sum(v.passed for v in judged),
                            "rejected": sum(not v.passed for v in judged),
                            "dropped": sum(not v.passed for v in judged) if dropped else 0,
                            "regenerated": sum(len(v.attempts) > 1 for v in judged) if self.spec.quality.best_of == 1
                            else 0,
                            "decodes": sum(len(row.attempts) for row in task.rows),
                            "verify_s": round(task.verify_s, 4)},
                "rejects": self.rejects(task.shard) if any(not v.passed for v in judged) and not dropped else None}

    def write_profile(self, profile: dict, record: dict) -> str:
        """Write a finished decode-loop profile under `_profiles/` (and its Chrome trace, if
        kept); returns the profile's URI."""
        trace = profile.pop("trace_gz", None)
        name = f"{record['worker']}-{os.getpid()}"
        profile = {"worker": record["worker"], "pid": os.getpid(), "device": record["device"],
                   "batch_size": self.spec.resources.batch_size, **profile}
        if trace is not None:
            profile["trace"] = self.layout.profile(f"{name}.trace.json.gz")
            self.storage.write_bytes(profile["trace"], trace)
        uri = self.layout.profile(f"{name}.json")
        self.storage.write_bytes(uri, json.dumps(profile, indent=1).encode())
        return uri
