"""lhotse-shar: a shard as Lhotse Shar files under `shar/`, written through lhotse's `SharWriter`.

    shar/recording.<N>.tar      the shard's clips (lhotse's AudioTarWriter; FLAC or WAV as
                                output.audio_format: lossless, so the samples are the dataset's)
    shar/cuts.<N>.jsonl.gz      one MonoCut per clip, written after the tar: its supervision holds
                                the text; `custom` holds the codes, the decoding statistics, the
                                settings, the seed, the provenance and (when texts are normalised
                                or split) normalized_text, parent_id and segment, or a joined
                                row's chunks
`CutSet.from_shar(in_dir="<out>/shar")` reads it (a local folder; on object storage give the
files: `CutSet.from_shar(fields={"cuts": [...], "recording": [...]})`). N is the shard's number,
so shards written by different workers, in any order, form one Shar dataset. A shard without a
clip writes no Shar files (both fields then skip its number alike). Error rows go to
`errors/<shard>.jsonl`.
"""

from __future__ import annotations

import gzip
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

import pyarrow as pa

from engine.io.formats.rows import ShardFiles, audio_seconds, has_audio, kept_fields, put, rows_of, shard_number
from engine.io.formats.rows import write_errors as write_error_records
from engine.io.storage import Storage, join

SHAR_DIR = "shar"


def _cut(row: dict):
    """A MonoCut for a row with audio: the clip in memory, the text as its supervision."""
    from lhotse import MonoCut, Recording, SupervisionSegment

    recording = Recording.from_bytes(row["audio"]["bytes"], recording_id=row["id"])
    provenance = json.loads(row["provenance"]) if row.get("provenance") else None
    if provenance is not None:
        provenance.pop("chunks", None)  # kept_fields has them, as custom["chunks"]
    custom = {**kept_fields(row), "codes": list(row["codes"] or []), "stats": row.get("stats"),
              "settings": json.loads(row["settings"]) if row.get("settings") else None,
              "provenance": provenance}
    supervision = SupervisionSegment(id=row["id"], recording_id=row["id"], start=0.0,
                                     duration=recording.duration, channel=0, text=row["text"])
    return MonoCut(id=row["id"], start=0.0, duration=recording.duration, channel=0, recording=recording,
                   supervisions=[supervision], custom={k: v for k, v in custom.items() if v is not None})


def write_shar_shard(storage: Storage, root: str, shard_id: str, tables: Sequence[pa.Table]) -> ShardFiles:
    """Write one shard as Lhotse Shar files (module docstring) under `root`.

    Raises:
        ValueError: lhotse is not installed (`pip install 'pcg-synth[lhotse]'`).
    """
    try:
        from lhotse.shar import SharWriter
    except ImportError as exc:
        raise ValueError("output format lhotse-shar needs lhotse: pip install 'pcg-synth[lhotse]'") from exc

    rows = list(rows_of(tables))
    written = ShardFiles(rows=len(rows))
    write_error_records(storage, root, shard_id, rows, written)
    clips = [r for r in rows if has_audio(r)]
    if not clips:
        return written
    number = shard_number(shard_id)
    audio_format = PurePosixPath(clips[0]["audio"]["path"]).suffix.lstrip(".") or "flac"
    with tempfile.TemporaryDirectory(prefix="pcg-synth-shar-") as folder:
        # one Shar shard numbered as this shard: shard_size above the clip count
        with SharWriter(folder, fields={"recording": audio_format}, shard_size=len(clips) + 1,
                        shard_offset=number, warn_unused_fields=False) as writer:
            for row in clips:
                writer.write(_cut(row))
                written.with_audio += 1
                written.audio_seconds += audio_seconds(row["audio"]["bytes"])
        made = {p.name.split(".")[0]: p for p in Path(folder).iterdir()}
        for field in ("recording", "cuts"):  # the cuts last: they make the shard readable
            data = made[field].read_bytes()
            if field == "cuts":  # gzip stamps the time it wrote: without it, the same rows give the same bytes
                data = gzip.compress(gzip.decompress(data), mtime=0)
            put(storage, join(root, SHAR_DIR, made[field].name), data, written)
    return written
