"""`pcg-synth convert`: a finished hf-parquet output rewritten as nemo or lhotse-shar, without
decoding again: each shard's Parquet file is read (its row groups as tables) and handed to the
same shard writer a job's write stage calls (`engine.io.formats.write_shard`).

The destination is an output of its own: each converted shard gets a commit record under
`<dest>/_commits/` after its files, so a conversion that stops resumes at the first shard
without one, and a finished one run again only rewrites the files that span every shard (the
same bytes). `<dest>/_convert.json` records the source and the format; a destination that holds
another conversion, or a job's output, is refused.
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict, dataclass, field, fields

import pyarrow.parquet as pq
from tqdm.auto import tqdm

from engine.config import OUTPUT_FORMATS, OutputSpec, StorageOptions
from engine.console import bar_disabled, counted
from engine.io.formats import finish_output, write_shard
from engine.io.storage import Storage
from engine.runtime.plan import Layout

TARGETS = tuple(f for f in OUTPUT_FORMATS if f != "hf-parquet")
RECORD = "_convert.json"


@dataclass(kw_only=True)
class ConvertedShard:
    """A converted shard's commit record (`<dest>/_commits/<shard>.json`): the shard, the data
    file it was read from, the format written, and what the writer wrote (`ShardFiles`). Keys
    unknown here are kept (`extra`) and written back."""

    shard: str
    source: str
    format: str
    files: list[str] = field(default_factory=list)
    rows: int = 0
    with_audio: int = 0
    failed: int = 0
    audio_seconds: float = 0.0
    errors: str | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = asdict(self)
        return {**out, **out.pop("extra")}

    @classmethod
    def from_dict(cls, d: dict) -> ConvertedShard:
        names = {f.name for f in fields(cls)} - {"extra"}
        return cls(**{k: v for k, v in d.items() if k in names}, extra={k: v for k, v in d.items() if k not in names})


def committed(storage: Storage, layout: Layout) -> set[str]:
    """The shard ids `layout`'s output holds a commit record for."""
    folder = layout.commit("x").rsplit("/", 1)[0]
    return {uri.rsplit("/", 1)[-1][: -len(".json")] for uri in storage.list(folder) if uri.endswith(".json")}


def finished_shards(storage: Storage, source: str) -> list[str]:
    """The shard ids of a finished hf-parquet job output, in plan order.

    Raises:
        ValueError: not a pcg-synth output, not hf-parquet, or not finished.
    """
    layout = Layout(source)
    if not storage.exists(layout.job):
        raise ValueError(f"{source}: not a pcg-synth job output (no _job.json there)")
    job = json.loads(storage.read_bytes(layout.job))
    written_as = ((job.get("spec") or {}).get("output") or {}).get("format", "hf-parquet")
    if written_as != "hf-parquet":
        raise ValueError(f"{source} was written as {written_as}; convert reads hf-parquet outputs")
    shards = [s["id"] for s in job.get("shards", [])]
    missing = [s for s in shards if s not in committed(storage, layout)]
    if missing:
        raise ValueError(f"{source} is not finished: {len(missing)} of {counted(len(shards), 'shard')} not "
                         f"committed (first {missing[0]}); rerun its job (`pcg-synth run SPEC` resumes it)")
    return shards


def claim(storage: Storage, source: str, output: OutputSpec) -> None:
    """Record the conversion in its destination, or check that the destination holds this very
    conversion (a rerun).

    Raises:
        ValueError: the destination is the source, a job's output or another conversion.
    """
    dest = output.uri.rstrip("/")
    if dest == source.rstrip("/"):
        raise ValueError("--dest is the source output: give another destination")
    layout = Layout(dest)
    if storage.exists(layout.job):
        raise ValueError(f"{dest} holds a job's output: give another destination")
    mine = {"source": source.rstrip("/"), "format": output.format, "tarred": output.tarred}
    uri = f"{dest}/{RECORD}"
    if storage.exists(uri):
        earlier = json.loads(storage.read_bytes(uri))
        if {k: earlier.get(k) for k in mine} != mine:
            raise ValueError(f"{dest} holds another conversion ({earlier.get('source')} to "
                             f"{earlier.get('format')}); give another destination")
        return
    storage.write_bytes(uri, json.dumps(mine, indent=1).encode())


def convert(source: str, to: str, dest: str | None = None, tarred: bool = False,
            storage_options: StorageOptions | None = None, progress: bool = True) -> dict:
    """Convert the finished hf-parquet output at `source` to `to` under `dest`.

    Args:
        source: the job's output (a directory or s3:// prefix).
        to: nemo or lhotse-shar.
        dest: where to write (default: `<source>-<to>` beside it).
        tarred: nemo only: tarred audio shards.
        storage_options: how to reach object storage.
        progress: show a progress bar (shards).

    Returns:
        {source, dest, format, tarred, shards, converted, skipped, rows, with_audio, failed,
        audio_seconds, files}: `converted` shards written now, `skipped` already committed.

    Raises:
        ValueError: an unknown format, a source that is not a finished hf-parquet output, or
            a destination already used otherwise.
    """
    if to not in TARGETS:
        raise ValueError(f"--to must be one of {', '.join(TARGETS)}; got {to!r}")
    if tarred and to != "nemo":
        raise ValueError(f"--tarred applies to --to nemo, not {to}")
    storage = Storage(storage_options)
    output = OutputSpec(uri=dest or f"{source.rstrip('/')}-{to}", format=to, tarred=tarred)
    shards = finished_shards(storage, source)
    claim(storage, source, output)
    src, out = Layout(source), Layout(output.uri)
    done = committed(storage, out)
    records: list[ConvertedShard] = []
    bar = tqdm(total=len(shards), desc=f"convert to {to}", unit="shard", disable=bar_disabled(progress))
    for shard in shards:
        if shard in done:
            record = ConvertedShard.from_dict(json.loads(storage.read_bytes(out.commit(shard))))
        else:
            data = pq.ParquetFile(io.BytesIO(storage.read_bytes(src.data(shard))))
            tables = [data.read_row_group(i) for i in range(data.num_row_groups)]
            record = ConvertedShard.from_dict({"shard": shard, "source": src.data(shard), "format": to,
                                               **write_shard(storage, output, shard, tables).to_dict()})
            storage.write_bytes(out.commit(shard), json.dumps(record.to_dict(), indent=1).encode())
        records.append(record)
        bar.update()
    bar.close()
    files = finish_output(storage, output, shards)
    return {"source": source, "dest": output.uri, "format": to, "tarred": tarred, "shards": len(shards),
            "converted": len(set(shards) - done), "skipped": len(set(shards) & done),
            "rows": sum(r.rows for r in records), "with_audio": sum(r.with_audio for r in records),
            "failed": sum(r.failed for r in records),
            "audio_seconds": round(sum((r.audio_seconds for r in records), 0.0), 3), "files": files}
