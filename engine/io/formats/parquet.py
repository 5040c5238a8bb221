"""hf-parquet: a shard as `data/<shard>.parquet`, one row group per table handed in, exactly the
bytes `engine.codec.export.export_audio` writes for the same windows. Error rows are rows of
the file with `error` set and no audio."""

from __future__ import annotations

import io
from collections.abc import Sequence

import pyarrow as pa

from engine.io.dataset import dataset_schema, parquet_writer
from engine.io.formats.rows import ShardFiles, audio_seconds, has_audio, put, rows_of
from engine.io.storage import Storage, join


def data_uri(root: str, shard_id: str) -> str:
    return join(root, "data", f"{shard_id}.parquet")


def write_parquet_shard(storage: Storage, root: str, shard_id: str, tables: Sequence[pa.Table]) -> ShardFiles:
    """Write the shard's tables as one Parquet file (one row group each) under `root`."""
    written = ShardFiles()
    buffer = io.BytesIO()
    with parquet_writer(buffer, tables[0].schema if tables else dataset_schema()) as writer:
        for table in tables:
            writer.write_table(table)
    for row in rows_of(tables):
        written.rows += 1
        if has_audio(row):
            written.with_audio += 1
            written.audio_seconds += audio_seconds(row["audio"]["bytes"])
    put(storage, data_uri(root, shard_id), buffer.getvalue(), written)
    return written
