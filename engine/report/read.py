"""A job's output as the report reads it: what it is, its summary, and its rows in one shape,
whatever format wrote them.

The committed shards are read (a shard is complete only once its commit record exists), each
from the files its format lays out under the output's root:

    hf-parquet   data/<shard>.parquet (error rows inside)
    nemo         audio/<shard>/manifest.json + clips, or sharded_manifests/manifest_<N>.json +
                 audio_<N>.tar (tarred)
    lhotse-shar  shar/cuts.<N>.jsonl.gz + shar/recording.<N>.tar
every format     errors/<shard>.jsonl (nemo, lhotse-shar) and rejects/<shard>.parquet (the
                 quality gate's rejects, in the dataset's schema)

Paths come from the layout, never from the URIs a commit record names (a conversion records
them as given on its command line, relative to wherever it ran). A row's audio is not read
with its other fields: `clips` fetches it for the few rows the report plays.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from engine.console import counted
from engine.io.formats.rows import shard_number
from engine.io.storage import Storage, StorageError, join, parse
from engine.metrics.text import normalize

# Parquet columns never read for the table: the audio (fetched for the sample only) and the
# bulky per-row JSON and codes
SKIPPED = frozenset({"audio", "codes", "provenance", "settings", "attempt_scores", "hypothesis"})
STATUSES = ("ok", "rejected", "error")


@dataclass
class ReportRow:
    """One row of the output as the report shows it.

    Attributes:
        status: ok (written with audio), rejected (by the quality gate: in rejects/) or error
            (an error record: no audio).
        acceptance: drafted tokens accepted over drafted tokens (None: nothing drafted, e.g. `ar`).
        speaking_rate: characters of normalised text per second of audio (the gate's own
            figure where it ran, computed as the gate does otherwise).
        where: how to fetch its clip: (kind, file URI, key), see `Output.clips`.
    """

    id: str
    text: str | None
    status: str
    shard: str
    duration: float | None = None
    speaking_rate: float | None = None
    method: str | None = None
    acceptance: float | None = None
    mean_accepted_length: float | None = None
    cer: float | None = None
    wer: float | None = None
    speaker_similarity: float | None = None
    finish_reason: str | None = None
    error: str | None = None
    reject_reason: str | None = None
    where: tuple | None = field(default=None, repr=False)

    @property
    def cut(self) -> bool:
        """Its speech reached the token limit: the audio stops there."""
        return self.finish_reason == "length"

    @property
    def reason(self) -> str | None:
        return self.error or self.reject_reason


def _acceptance(stats: dict | None) -> tuple[float | None, float | None]:
    if not stats:
        return None, None
    drafted = stats.get("drafted") or sum(stats.get("reached_per_position") or [])
    accepted = sum(stats.get("accepted_per_position") or [])
    mal = stats.get("mean_accepted_length") if stats.get("rounds") else None
    return (round(accepted / drafted, 4) if drafted else None), mal


def _speaking_rate(record: dict, duration: float | None) -> float | None:
    if record.get("speaking_rate") is not None:
        return record["speaking_rate"]
    text = record.get("normalized_text") or record.get("text")
    if not text or not duration:
        return None
    return round(len(normalize(text)) / duration, 4)


def make_row(record: dict, status: str, shard: str, where: tuple | None, duration: float | None) -> ReportRow:
    """A row from a record of any format (a Parquet row, a manifest line, a cut's fields, an
    error record): the fields it has, the derived ones computed."""
    acceptance, mal = _acceptance(record.get("stats"))
    has_clip = status != "error"
    return ReportRow(
        id=str(record.get("id")), text=record.get("text"), status=status, shard=shard,
        duration=duration if has_clip else None,
        speaking_rate=_speaking_rate(record, duration) if has_clip else None,
        method=record.get("method"), acceptance=acceptance, mean_accepted_length=mal,
        cer=record.get("cer"), wer=record.get("wer"), speaker_similarity=record.get("speaker_similarity"),
        finish_reason=record.get("finish_reason"), error=record.get("error"),
        reject_reason=record.get("reject_reason"), where=where if has_clip else None)


@dataclass
class Output:
    """A job's output (or a conversion's) at `root`, opened by `open_output`.

    Attributes:
        kind: "job" or "conversion".
        format: hf-parquet, nemo or lhotse-shar.
        tarred: nemo only: tarred shards.
        name: the job's name (a conversion: its source's, when readable).
        job: `_job.json` (a conversion: `_convert.json`).
        summary: `summary.json` (a conversion: its source's), None before the job has finished.
        planned: shard ids in plan order (a conversion: those committed).
        committed: the shard ids with a commit record, in plan order.
    """

    storage: Storage
    root: str
    kind: str
    format: str
    tarred: bool
    name: str
    job: dict
    summary: dict | None
    planned: list[str]
    committed: list[str]
    shar_files: dict[tuple[str, int], str] = field(default_factory=dict)
    listed: set[str] = field(default_factory=set)  # errors/ and rejects/ files (one listing each)

    def rows(self, shard: str) -> Iterator[ReportRow]:
        """The shard's rows: its data (and error records) in manifest order, then its rejects."""
        if self.format == "nemo":
            yield from self._nemo_rows(shard)
        elif self.format == "lhotse-shar":
            yield from self._shar_rows(shard)
        else:
            yield from self._parquet_rows(join(self.root, "data", f"{shard}.parquet"), shard, rejects=False)
        if self.format != "hf-parquet":
            yield from self._error_rows(shard)
        rejects = join(self.root, "rejects", f"{shard}.parquet")
        if rejects in self.listed:
            yield from self._parquet_rows(rejects, shard, rejects=True)

    def _parquet_rows(self, uri: str, shard: str, rejects: bool) -> Iterator[ReportRow]:
        fs, path = self.storage.arrow_filesystem(uri)
        with fs.open_input_file(path) as f:
            data = pq.ParquetFile(f)
            columns = [c for c in data.schema_arrow.names if c not in SKIPPED]
            table = data.read(columns=columns)
        for i, record in enumerate(table.to_pylist()):
            status = "rejected" if rejects else ("error" if record.get("error") or record.get("duration") is None
                                                 else "ok")
            yield make_row(record, status, shard, ("parquet", uri, i), record.get("duration"))

    def _error_rows(self, shard: str) -> Iterator[ReportRow]:
        uri = join(self.root, "errors", f"{shard}.jsonl")
        if uri not in self.listed:
            return
        for line in self.storage.read_bytes(uri).decode().splitlines():
            if line.strip():
                yield make_row(json.loads(line), "error", shard, None, None)

    def _nemo_rows(self, shard: str) -> Iterator[ReportRow]:
        number = shard_number(shard)
        if self.tarred:
            manifest = join(self.root, "sharded_manifests", f"manifest_{number}.json")
            tar = join(self.root, f"audio_{number}.tar")
        else:
            manifest = join(self.root, "audio", shard, "manifest.json")
        for line in self.storage.read_bytes(manifest).decode().splitlines():
            if not line.strip():
                continue
            entry = json.loads(line)
            where = (("tar", tar, entry["audio_filepath"]) if self.tarred
                     else ("file", join(self.root, "audio", shard, entry["audio_filepath"]), None))
            yield make_row(entry, "ok", shard, where, entry.get("duration"))

    def _shar_rows(self, shard: str) -> Iterator[ReportRow]:
        number = shard_number(shard)
        cuts, recordings = self.shar_files.get(("cuts", number)), self.shar_files.get(("recording", number))
        if cuts is None:  # a shard without a clip writes no Shar files
            return
        for line in gzip.decompress(self.storage.read_bytes(cuts)).decode().splitlines():
            if not line.strip():
                continue
            cut = json.loads(line)
            custom = cut.get("custom") or {}
            supervisions = cut.get("supervisions") or [{}]
            record = {**custom, "id": cut["id"], "text": supervisions[0].get("text")}
            yield make_row(record, "ok", shard, ("shar", recordings, cut["id"]), cut.get("duration"))

    def clips(self, rows: Sequence[ReportRow]) -> dict[str, tuple[bytes, str]]:
        """The audio of `rows` (row id -> (file bytes, file name)), each file read once."""
        by_file: dict[tuple[str, str], list[ReportRow]] = {}
        for row in rows:
            if row.where is not None:
                by_file.setdefault(row.where[:2], []).append(row)
        out = {}
        for (kind, uri), wanted in by_file.items():
            if kind == "parquet":
                fs, path = self.storage.arrow_filesystem(uri)
                with fs.open_input_file(path) as f:
                    audio = pq.ParquetFile(f).read(columns=["audio"]).column("audio")
                for row in wanted:
                    value = audio[row.where[2]].as_py()
                    if value and value.get("bytes"):
                        out[row.id] = (value["bytes"], value.get("path") or f"{row.id}.wav")
            elif kind == "file":
                for row in wanted:
                    out[row.id] = (self.storage.read_bytes(uri), uri.rsplit("/", 1)[-1])
            else:  # a tar: nemo's (member named in the manifest) or Shar's (member <cut id>.<ext>)
                with tarfile.open(fileobj=io.BytesIO(self.storage.read_bytes(uri))) as tar:
                    members = {m.name: m for m in tar.getmembers() if m.isfile()}
                    for row in wanted:
                        name = row.where[2] if kind == "tar" else _shar_member(members, row.where[2])
                        if name in members:
                            out[row.id] = (tar.extractfile(members[name]).read(), name)
        return out


def _shar_member(members: dict, cut_id: str) -> str | None:
    return next((n for n in members if n.startswith(cut_id + ".") and not n.endswith(".json")), None)


def _json(storage: Storage, uri: str) -> dict | None:
    return json.loads(storage.read_bytes(uri)) if storage.exists(uri) else None


def _committed(storage: Storage, root: str) -> set[str]:
    return {u.rsplit("/", 1)[-1][: -len(".json")] for u in storage.list(join(root, "_commits")) if u.endswith(".json")}


def _not_an_output(storage: Storage, root: str) -> ValueError:
    loc = parse(root)
    if storage.exists(root):
        return ValueError(f"{root} is a file: give a job's output folder (its output.uri, the folder holding "
                          "_job.json and summary.json)")
    if loc.scheme == "file" and not Path(loc.path).exists():
        return ValueError(f"{root}: no such folder (give a job's output folder: its output.uri)")
    return ValueError(f"{root}: not a pcg-synth job output (no _job.json or _convert.json there); give the folder "
                      "a job wrote (its output.uri), e.g. out/quickstart")


def open_output(storage: Storage, root: str) -> Output:
    """The output at `root`: a job's (`_job.json`) or a conversion's (`_convert.json`).

    Raises:
        ValueError: `root` is not an output, or no shard of it is committed yet.
        StorageError: it cannot be read.
    """
    root = root.rstrip("/")
    job = _json(storage, join(root, "_job.json"))
    converted = None if job else _json(storage, join(root, "_convert.json"))
    if job is None and converted is None:
        raise _not_an_output(storage, root)
    done = _committed(storage, root)
    if job is not None:
        spec_output = (job.get("spec") or {}).get("output") or {}
        planned = [s["id"] for s in job.get("shards", [])]
        summary = _json(storage, join(root, "summary.json"))
        kind, fmt, tarred, name = "job", spec_output.get("format", "hf-parquet"), bool(spec_output.get("tarred")), \
            job.get("name") or root.rsplit("/", 1)[-1]
    else:
        planned = sorted(done)
        try:
            summary = _json(storage, join(converted["source"], "summary.json"))
        except StorageError:  # the source may be gone or out of reach: the rows are all here
            summary = None
        kind, fmt, tarred = "conversion", converted["format"], bool(converted.get("tarred"))
        name = (summary or {}).get("job") or root.rsplit("/", 1)[-1]
    committed = [s for s in planned if s in done]
    if not committed:
        raise ValueError(f"{root}: nothing to report yet: none of its {counted(len(planned), 'shard')} is committed "
                         "(rerun its job; the report reads committed shards)")
    out = Output(storage, root, kind, fmt, tarred, name, job or converted, summary, planned, committed)
    for folder in ("errors", "rejects"):
        out.listed.update(join(root, folder, u.rsplit("/", 1)[-1]) for u in storage.list(join(root, folder)))
    if fmt == "lhotse-shar":
        for uri in storage.list(join(root, "shar")):
            m = re.fullmatch(r"(cuts|recording)\.(\d+)\..*", uri.rsplit("/", 1)[-1])
            if m:
                out.shar_files[(m.group(1), int(m.group(2)))] = uri
    return out
