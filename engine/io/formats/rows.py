"""A shard's finished rows as every writer reads them, and the files all non-Parquet formats share.

The rows are `pyarrow.Table`s with the output dataset's columns (`engine.io.dataset.dataset_schema`:
one table per codec window, or a Parquet shard's row groups), optionally with the columns of
normalised texts and of chunks written as rows (`OPTIONAL_COLUMNS`); a split row's per-chunk
records are in its provenance (`chunks`). A row has audio when its `audio.bytes` is set
and it has no `error`; every other row is an error record. Formats other than hf-parquet keep a
shard's error records as JSON lines in `errors/<shard>.jsonl` (every column but the audio),
written on every attempt (empty when the shard has none), so a retried shard never leaves a
stale one behind.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import soundfile as sf

from engine.io.storage import Storage, join, parse

# columns a job writes when it normalises texts or writes chunks as rows (absent otherwise:
# engine.io.dataset.TEXT_FIELDS)
OPTIONAL_COLUMNS = ("normalized_text", "parent_id", "segment")
# what a manifest line or a cut keeps of a row besides its audio, text and duration (and a split
# row's `chunks`, from its provenance)
KEPT = ("id", "seed", "method", "prompt_id", "text_id", "finish_reason", "num_codes", *OPTIONAL_COLUMNS)


@dataclass
class ShardFiles:
    """What a writer wrote for one shard: its commit record names these.

    Attributes:
        files: URIs in the order written (the file that makes the shard readable last: its
            manifest, its cuts, its Parquet file).
        rows: rows in the shard.
        with_audio: rows written with audio.
        audio_seconds: their audio, measured from the audio bytes.
        errors: where the shard's error records are (None: inside its data file).
    """

    files: list[str] = field(default_factory=list)
    rows: int = 0
    with_audio: int = 0
    audio_seconds: float = 0.0
    errors: str | None = None

    @property
    def failed(self) -> int:
        return self.rows - self.with_audio

    def to_dict(self) -> dict:
        return {"files": self.files, "rows": self.rows, "with_audio": self.with_audio, "failed": self.failed,
                "audio_seconds": round(self.audio_seconds, 3), "errors": self.errors}


def rows_of(tables: Sequence[pa.Table]) -> Iterator[dict]:
    """Every row of the tables, in order, as a dict of its columns."""
    for table in tables:
        yield from table.to_pylist()


def has_audio(row: dict) -> bool:
    return bool(row.get("audio") and row["audio"].get("bytes") is not None and not row.get("error"))


def audio_seconds(data: bytes) -> float:
    """The length of an encoded clip, from its header (samples / sampling rate)."""
    info = sf.info(io.BytesIO(data))
    return info.frames / info.samplerate


def kept_fields(row: dict) -> dict:
    """The row's fields a manifest line or a cut keeps (`KEPT`, and a split row's `chunks`
    records from its provenance; absent and null ones left out)."""
    kept = {k: row[k] for k in KEPT if row.get(k) is not None}
    chunks = json.loads(row["provenance"]).get("chunks") if row.get("provenance") else None
    return {**kept, "chunks": chunks} if chunks else kept


def shard_number(shard_id: str) -> int:
    """`shard-00012` -> 12: the number NeMo's and Lhotse's shard files are named by.

    Raises:
        ValueError: an id that does not end in a number.
    """
    tail = shard_id.rsplit("-", 1)[-1]
    if not tail.isdigit():
        raise ValueError(f"shard id {shard_id!r} does not end in a shard number")
    return int(tail)


def error_record(row: dict) -> dict:
    """A row without audio as an error record: every column but the audio."""
    return {k: v for k, v in row.items() if k != "audio"}


def clear_leftovers(uri: str) -> None:
    """Remove what an interrupted atomic write of `uri` left on a local disk (a hidden
    `.<name>.*.tmp` sibling, see `engine.io.storage.write_atomic`): a reader that lists a folder
    (Lhotse's `CutSet.from_shar(in_dir=...)`) would take it for a file of the dataset."""
    loc = parse(uri)
    if loc.scheme != "file":
        return
    target = Path(loc.path)
    if target.parent.is_dir():
        for stale in target.parent.glob(f".{target.name}.*.tmp"):
            stale.unlink(missing_ok=True)


def put(storage: Storage, uri: str, data: bytes, written: ShardFiles) -> None:
    """Write one file of a shard atomically (after clearing an interrupted write's leftovers)."""
    clear_leftovers(uri)
    storage.write_bytes(uri, data)
    written.files.append(uri)


def write_errors(storage: Storage, root: str, shard_id: str, rows: Sequence[dict], written: ShardFiles) -> None:
    """The shard's error records as `errors/<shard>.jsonl` (empty when it has none)."""
    uri = join(root, "errors", f"{shard_id}.jsonl")
    lines = "".join(json.dumps(error_record(r), ensure_ascii=False) + "\n" for r in rows if not has_audio(r))
    put(storage, uri, lines.encode(), written)
    written.errors = uri


def jsonl(entries: Sequence[dict]) -> bytes:
    """Entries as JSON lines (UTF-8, one object a line)."""
    return "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in entries).encode()
