"""The shard plan: which manifest rows go into which output shard, decided once by the driver.

Shards never span manifest files and are numbered in manifest order, so the same inputs and
`rows_per_shard` always give the same plan. Duplicate ids are found here, across the whole job:
every occurrence after the first is marked, and the worker turns it into an error record.
The plan's fingerprint covers the manifests' contents, the decoding settings, the models, the
text preparation and the output format: a rerun into the same output resumes only when nothing
of that changed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

from engine.config import JobSpec
from engine.console import counted
from engine.errors import did_you_mean
from engine.io.manifest import (
    KNOWN_FIELDS,
    SUFFIXES,
    jsonl_offsets,
    manifest_format,
    parse_unpacked,
    row_id,
    unknown_fields,
    unpacked,
)
from engine.io.storage import Storage, join

PLAN_VERSION = 1
Inspect = Callable[[str, list, dict[int, str]], None]


@dataclass(frozen=True)
class Shard:
    """Rows `[start, stop)` of one manifest file.

    Attributes:
        id: `shard-00000`, stable for a plan.
        manifest: the manifest's URI.
        duplicates: row index in the file -> where that id first appeared.
        byte_range: for JSONL, the bytes holding exactly these rows (the worker reads only
            them, with a ranged GET on S3; of a gzipped file, the decompressed bytes: the worker
            reads and decompresses the file once and takes them); None: the worker reads the
            whole file.
    """

    id: str
    manifest: str
    start: int
    stop: int
    duplicates: dict[int, str] = field(default_factory=dict)
    byte_range: tuple[int, int] | None = None

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass
class Plan:
    shards: list[Shard]
    rows: int
    manifests: list[str]
    fingerprint: str
    unknown_fields: dict[str, dict[str, int]] = field(default_factory=dict)  # manifest -> field -> rows

    def to_dict(self) -> dict:
        return {"plan_version": PLAN_VERSION, "fingerprint": self.fingerprint, "rows": self.rows,
                "manifests": self.manifests, "unknown_fields": self.unknown_fields,
                "shards": [asdict(s) for s in self.shards]}

    def warnings(self) -> list[str]:
        """What the job should say about its manifests: fields it ignores, per file."""
        return [f"{uri}: fields this pcg-synth ignores: "
                + ", ".join(f"{k!r} ({counted(n, 'row')}){did_you_mean(k, KNOWN_FIELDS)}" for k, n in found.items())
                for uri, found in self.unknown_fields.items()]


def manifest_files(spec: JobSpec, storage: Storage) -> list[str]:
    """Expand `input.manifests` (files, directories, prefixes) into manifest files.

    Raises:
        ValueError: an entry names nothing readable as a manifest.
    """
    files: list[str] = []
    for i, entry in enumerate(spec.input.manifests):
        if storage.exists(entry):
            found = [entry]
        else:
            found = [u for u in storage.list(entry) if u.lower().endswith(SUFFIXES)]
        if not found:
            raise ValueError(f"input.manifests[{i}]: no manifest files (.jsonl, .csv, .parquet; .jsonl.gz, "
                             f".csv.gz) at {entry}")
        files.extend(u for u in found if u not in files)
    return files


def settings_fingerprint(spec: JobSpec) -> dict:
    """What, besides the manifests, determines the output rows."""
    models = spec.models.model_dump()
    if models["draft_weights"] == "native":  # the default: outputs written before it existed match
        del models["draft_weights"]
    decoding = spec.decoding.model_dump()
    if decoding["max_speech_ratio"] is None:  # the same: off, the default
        del decoding["max_speech_ratio"]
    out = {"decoding": decoding, "models": models,
           "output": {"audio_format": spec.output.audio_format, "prompt_audio": spec.output.prompt_audio},
           "rows_per_shard": spec.resources.rows_per_shard, "batch_size": spec.resources.batch_size}
    if spec.quality.enabled:  # the gate decides which rows are written where (off: as before it existed)
        out["quality"] = spec.quality.model_dump()
    # how texts are prepared and shards written: only what differs from the defaults, so an output
    # written before these settings existed keeps its fingerprint
    text = spec.text.model_dump(exclude_defaults=True)
    if text:
        out["text"] = text
    written = spec.output.model_dump(include={"format", "tarred"}, exclude_defaults=True)
    out["output"].update(written)
    return out


def make_plan(spec: JobSpec, storage: Storage, inspect: Inspect | None = None) -> Plan:
    """Read every manifest once (ids and row counts) and cut it into shards; `inspect(uri, rows,
    duplicates)` sees each file's parsed rows and its duplicate ids (row index -> where the id
    first appeared): `pcg-synth run --dry-run` validates them there."""
    files = manifest_files(spec, storage)
    return plan_of(spec, files, ((uri, storage.read_bytes(uri)) for uri in files), inspect)


def plan_of(spec: JobSpec, files: list[str], contents: Iterable[tuple[str, bytes]],
            inspect: Inspect | None = None) -> Plan:
    """`make_plan` over manifests given as (URI, bytes), one at a time."""
    digest = hashlib.sha256(json.dumps(settings_fingerprint(spec), sort_keys=True).encode())
    digest.update(str(PLAN_VERSION).encode())
    shards: list[Shard] = []
    first_seen: dict[str, str] = {}
    ignored: dict[str, dict[str, int]] = {}
    total = 0
    per = spec.resources.rows_per_shard
    for uri, data in contents:
        digest.update(uri.encode())
        digest.update(hashlib.sha256(data).digest())
        content = unpacked(uri, data)
        rows = parse_unpacked(uri, content)
        if extra := unknown_fields(rows):
            ignored[uri] = extra
        offsets = jsonl_offsets(content) if manifest_format(uri) == "jsonl" else None
        dups: dict[int, str] = {}
        for n, row in enumerate(rows):
            key = row_id(row.get("id")) if isinstance(row, dict) else None  # 7 and "7" are one id
            if not key:  # no id, or none a row may have: that row's own error
                continue
            if key in first_seen:
                dups[n] = first_seen[key]
            else:
                first_seen[key] = f"{uri}:{n + 1}"
        if inspect is not None:
            inspect(uri, rows, dups)
        for start in range(0, len(rows), per):
            stop = min(start + per, len(rows))
            mine = {i: src for i, src in dups.items() if start <= i < stop}
            span = (offsets[start], offsets[stop]) if offsets else None
            shards.append(Shard(f"shard-{len(shards):05d}", uri, start, stop, mine, span))
        total += len(rows)
    if total == 0:
        shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
        raise ValueError(f"input.manifests: no rows in the {counted(len(files), 'manifest file')} read ({shown})")
    return Plan(shards, total, files, digest.hexdigest()[:32], ignored)


class Layout:
    """Where a job's files live under `output.uri`."""

    def __init__(self, root: str) -> None:
        self.root = root

    def data(self, shard: Shard | str) -> str:
        return join(self.root, "data", f"{getattr(shard, 'id', shard)}.parquet")

    def commit(self, shard: Shard | str) -> str:
        return join(self.root, "_commits", f"{getattr(shard, 'id', shard)}.json")

    def profile(self, name: str) -> str:
        """A worker's decode-loop profile (`profile.rounds`)."""
        return join(self.root, "_profiles", name)

    @property
    def job(self) -> str:
        return join(self.root, "_job.json")

    @property
    def summary(self) -> str:
        return join(self.root, "summary.json")
