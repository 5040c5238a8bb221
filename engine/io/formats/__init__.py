"""Output formats: a shard's finished rows written as the files one toolkit reads.

    hf-parquet   data/<shard>.parquet (`datasets`); error rows inside, with `error` set
    nemo         NeMo manifests with FLAC/WAV clips, plain or tarred (`nemo.py`)
    lhotse-shar  Lhotse Shar cuts and recordings (`shar.py`)

One call per shard, `write_shard`, with the shard's rows as tables of the dataset's columns
(`engine.io.dataset.build_table`'s, a table per codec window; or a Parquet shard's row
groups, as `pcg-synth convert` hands them). It writes every file of the shard under its final
name, each whole (a temporary file renamed, or one object PUT), the file that makes the shard
readable last; the caller then writes the shard's commit record, which names the files. A
shard that dies before its commit record is written again in full by its retry (same names,
same rows), so a reader that goes by the commit records (or by the manifests, which only exist
complete) never sees a partial shard. `finish_output` writes what spans every shard (NeMo's one
manifest) once all are committed.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from engine.config import OUTPUT_FORMATS, OutputSpec
from engine.io.formats.nemo import finish_nemo, write_nemo_shard
from engine.io.formats.parquet import write_parquet_shard
from engine.io.formats.rows import ShardFiles
from engine.io.formats.shar import write_shar_shard
from engine.io.storage import Storage

__all__ = ["OUTPUT_FORMATS", "ShardFiles", "finish_output", "write_shard"]


def write_shard(storage: Storage, output: OutputSpec, shard_id: str, tables: Sequence[pa.Table],
                schema: pa.Schema | None = None) -> ShardFiles:
    """Write one shard's rows in `output.format` under `output.uri` (not its commit record).

    Args:
        storage: where `output.uri` lives.
        output: the output's settings (uri, format, tarred).
        shard_id: the shard's id, `shard-<N>`.
        tables: the shard's rows in order, with the dataset's columns.
        schema: the job's columns (hf-parquet: the schema of a shard without rows; default: the
            first table's).

    Returns:
        The files written and the shard's counts, for its commit record.

    Raises:
        StorageError: a write failed (nothing is committed; the shard is retried).
    """
    if output.format == "nemo":
        return write_nemo_shard(storage, output.uri, shard_id, tables, tarred=output.tarred)
    if output.format == "lhotse-shar":
        return write_shar_shard(storage, output.uri, shard_id, tables)
    return write_parquet_shard(storage, output.uri, shard_id, tables, schema)


def finish_output(storage: Storage, output: OutputSpec, shard_ids: Sequence[str]) -> list[str]:
    """Write the files that span every shard, once every shard in `shard_ids` is committed
    (nemo: the dataset's one manifest); returns their URIs."""
    if output.format == "nemo":
        return [finish_nemo(storage, output.uri, shard_ids, tarred=output.tarred)]
    return []
