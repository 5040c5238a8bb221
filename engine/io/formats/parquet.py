"""hf-parquet: a shard as `data/<shard>.parquet`, one row group per table handed in, exactly the
bytes `engine.codec.export.export_audio` writes for the same windows. Error rows are rows of
the file with `error` set and no audio; a row's audio length is its `duration` column (the
samples over the sampling rate, as `build_table` writes it)."""

from __future__ import annotations

import io
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from engine.io.dataset import parquet_writer
from engine.io.formats.rows import ShardFiles, put
from engine.io.storage import Storage, join


def data_uri(root: str, shard_id: str) -> str:
    return join(root, "data", f"{shard_id}.parquet")


def write_parquet_shard(storage: Storage, root: str, shard_id: str, tables: Sequence[pa.Table],
                        schema: pa.Schema | None = None) -> ShardFiles:
    """Write the shard's tables as one Parquet file (one row group each) under `root`; a shard
    without rows gets `schema` (default: the first table's).

    Raises:
        ValueError: neither tables nor a schema."""
    if schema is None and not tables:
        raise ValueError(f"{shard_id}: a shard without rows needs its schema")
    written = ShardFiles()
    buffer = io.BytesIO()
    with parquet_writer(buffer, schema or tables[0].schema) as writer:
        for table in tables:
            writer.write_table(table)
    for table in tables:  # counted from the columns (a job's hot path: no row made a Python dict)
        voiced = pc.and_(pc.is_valid(table["audio"]), pc.is_null(table["error"]))
        written.rows += table.num_rows
        written.with_audio += pc.sum(voiced).as_py() or 0
        written.audio_seconds += pc.sum(pc.if_else(voiced, table["duration"], 0.0)).as_py() or 0.0
    put(storage, data_uri(root, shard_id), buffer.getvalue(), written)
    return written
