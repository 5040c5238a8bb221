"""nemo: NeMo's JSON-lines manifests with the audio, plain or tarred.

A manifest line describes one clip: `audio_filepath` (relative paths are taken from the
manifest's folder), `duration` in seconds and `text`, the fields NeMo's speech datasets read;
pcg-synth adds `normalized_text` where texts are normalised (NeMo's TTS recipes read it), the
row's id, seed, method, voice prompt, finish reason and code count, and for a split row its
chunks (joined: the per-chunk records; written as rows: `parent_id` and `segment`). The codes themselves stay in
the Parquet output and in lhotse-shar (a manifest is read whole into memory: codes would grow it
by tens of kilobytes a line).

Plain (`output.tarred: false`):
    audio/<shard>/<id>.flac           the clips
    audio/<shard>/manifest.json       written after its clips
    manifest.json                     every shard's lines (audio_filepath audio/<shard>/<id>.flac),
                                      written once every shard is (`finish_nemo`)
Tarred (`output.tarred: true`), laid out as NeMo's convert_to_tarred_audio_dataset.py lays out
a tarred dataset:
    audio_<N>.tar                     the shard's clips, named <id>.flac (dots in the id become
                                      underscores: WebDataset splits a name at its first dot)
    sharded_manifests/manifest_<N>.json   written after its tar; audio_filepath is the member's
                                      name, shard_id is N
    tarred_audio_manifest.json        every shard's lines, written once every shard is
NeMo reads the tarred form with `is_tarred: true`,
`tarred_audio_filepaths: <out>/audio__OP_0..<last>_CL_.tar` and
`manifest_filepath: <out>/sharded_manifests/manifest__OP_0..<last>_CL_.json` (`shard_manifests`).
A shard's files are each written whole under their final name (a temporary file renamed, or one
object PUT), the manifest after the audio it names, so a manifest is never seen before its
clips, and a shard is done when its commit record is written after them.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Sequence
from pathlib import PurePosixPath

import pyarrow as pa

from engine.io.formats.rows import (
    ShardFiles,
    audio_seconds,
    has_audio,
    jsonl,
    kept_fields,
    put,
    rows_of,
    shard_number,
    write_errors,
)
from engine.io.storage import Storage, join

MANIFEST = "manifest.json"
TARRED_MANIFEST = "tarred_audio_manifest.json"


def member_name(audio_path: str) -> str:
    """A clip's name inside a tar: its file name with the dots of its stem made underscores."""
    path = PurePosixPath(audio_path)
    return path.stem.replace(".", "_") + path.suffix


def shard_manifest_uri(root: str, shard_id: str, tarred: bool) -> str:
    if tarred:
        return join(root, "sharded_manifests", f"manifest_{shard_number(shard_id)}.json")
    return join(root, "audio", shard_id, MANIFEST)


def _entry(row: dict, audio_filepath: str, seconds: float) -> dict:
    entry = {"audio_filepath": audio_filepath, "duration": seconds, "text": row["text"]}
    return {**entry, **kept_fields(row)}


def _tar(members: Sequence[tuple[str, bytes]]) -> bytes:
    """An uncompressed tar of (name, bytes), with fixed times and modes: the same rows always
    give the same bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def write_nemo_shard(storage: Storage, root: str, shard_id: str, tables: Sequence[pa.Table],
                     tarred: bool = False) -> ShardFiles:
    """Write one shard as NeMo's manifest and audio (module docstring) under `root`."""
    rows = list(rows_of(tables))
    written = ShardFiles(rows=len(rows))
    write_errors(storage, root, shard_id, rows, written)
    entries, members = [], []
    for row in (r for r in rows if has_audio(r)):
        data = row["audio"]["bytes"]
        seconds = audio_seconds(data)
        written.with_audio += 1
        written.audio_seconds += seconds
        if tarred:
            name = member_name(row["audio"]["path"])
            members.append((name, data))
            entries.append({**_entry(row, name, seconds), "shard_id": shard_number(shard_id)})
        else:
            name = PurePosixPath(row["audio"]["path"]).name
            put(storage, join(root, "audio", shard_id, name), data, written)
            entries.append(_entry(row, name, seconds))
    if tarred:
        put(storage, join(root, f"audio_{shard_number(shard_id)}.tar"), _tar(members), written)
    put(storage, shard_manifest_uri(root, shard_id, tarred), jsonl(entries), written)
    return written


def finish_nemo(storage: Storage, root: str, shard_ids: Sequence[str], tarred: bool = False) -> str:
    """Write the dataset's one manifest (every shard's lines, in shard order; plain: paths
    taken from the root); returns its URI."""
    lines = []
    for shard_id in shard_ids:
        for line in storage.read_bytes(shard_manifest_uri(root, shard_id, tarred)).decode().splitlines():
            entry = json.loads(line)
            if not tarred:
                entry["audio_filepath"] = f"audio/{shard_id}/{entry['audio_filepath']}"
            lines.append(entry)
    uri = join(root, TARRED_MANIFEST if tarred else MANIFEST)
    storage.write_bytes(uri, jsonl(lines))
    return uri
