"""Text manifests: JSONL, CSV or Parquet files of utterances to synthesize (JSONL and CSV also
gzipped: `.jsonl.gz`, `.csv.gz`).

Row fields: `id`, `text` (required); `prompt_id`, `prompt_text`, `prompt_codes`, `prompt_audio`
(voice prompt: transcript + codec codes, or a clip URI; a named `voice`); `seed`, `method` and
the sampling knobs (`engine.knobs.KNOBS`: temperature, top_p, top_k, repetition_penalty,
max_new_tokens), per-row overrides bounded as the `DecodingSettings` fields they override;
`text_id`, `augment_seed` (provenance of augmentation variants). Ids (`id`, `prompt_id`,
`text_id`) are strings, or integers taken as their decimal string (a Parquet int column, a bare
JSON number); texts are strings. A malformed row (not JSON, invalid UTF-8, bad fields, an id of
another type) becomes a `RowError` that travels with the shard into the output; it never stops
the other rows. Fields of no meaning here are ignored, and counted (`unknown_fields`) so the job
can warn.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import zlib
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from engine.config import DecodingSettings, Method
from engine.errors import field_errors
from engine.knobs import KNOB_NAMES

FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet"}
# file names a manifest may have: the formats, and the text ones gzipped (Parquet compresses itself)
SUFFIXES = (*FORMATS, *(f"{s}.gz" for s, kind in FORMATS.items() if kind != "parquet"))


def override(name: str):
    """A row's override of the `DecodingSettings` field `name`: its type and bounds (one
    description of each setting), or None when the row leaves it to the job."""
    info = DecodingSettings.model_fields[name]
    return Annotated[(info.annotation, *info.metadata)] | None


# what a manifest cell holding an id may not be, named for the error record
_NOT_AN_ID = {bool: "a boolean", float: "a float", list: "a list", dict: "an object", type(None): "null"}


def row_id(value) -> str | None:
    """An id as every row takes it: a string as it is, an integer as its decimal string (the same
    id whether a manifest stores it as a number or as text); None for any other value."""
    if isinstance(value, str):
        return value
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else None


class _RowFields(BaseModel):
    """A manifest row's fields but the sampling knobs'."""

    model_config = ConfigDict(extra="ignore")

    id: str = Field(min_length=1)
    text: str
    prompt_id: str | None = None
    prompt_text: str | None = None
    prompt_codes: list[int] | None = None
    prompt_audio: str | None = None
    voice: str | None = None  # a named voice of the model (Orpheus's tara, leah, ...)
    seed: int | None = Field(None, ge=0)
    method: Method | None = None
    text_id: str | None = None  # augmentation: the source row's id
    augment_seed: int | None = None  # augmentation: the grid's seed for this variant

    @field_validator("id", "prompt_id", "text_id", mode="before")
    @classmethod
    def _id(cls, v, info):
        if v is None and info.field_name != "id":
            return v  # an optional id not given
        ident = row_id(v)
        if ident is None:
            kind = _NOT_AN_ID.get(type(v), f"a {type(v).__name__}")
            shown = "" if v is None else f" ({str(v)[:40]})"
            raise ValueError(f"an id is a string or an integer, not {kind}{shown}")
        return ident

    @field_validator("text")
    @classmethod
    def _text_not_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("text is empty")
        return v

    @field_validator("prompt_codes", mode="before")
    @classmethod
    def _codes(cls, v):
        if isinstance(v, str):  # CSV cells: "1 2 3" or "[1, 2, 3]"
            v = json.loads(v) if v.strip().startswith("[") else [int(x) for x in v.split()]
        if v is not None and any(int(c) < 0 for c in v):  # the model family checks the range
            raise ValueError("prompt_codes must not be negative")
        return v


# A row's override of each sampling knob (`engine.knobs.KNOBS`), after the other fields.
_RowKnobs = create_model("_RowKnobs", __base__=_RowFields, __module__=__name__,
                         **{name: (override(name), None) for name in KNOB_NAMES})


class ManifestRow(_RowKnobs):
    """One utterance of a manifest."""

    def overrides(self) -> dict:
        """Per-row sampling overrides that are set."""
        keys = ("method", *KNOB_NAMES)
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


@dataclass(frozen=True)
class BadLine:
    """A manifest line that could not be read as a row (parse_rows' stand-in for it)."""

    error: str
    text: str


@dataclass
class RowError:
    """A row that could not be used: where it was and why."""

    source: str  # "<uri>:<row number>"
    id: str | None
    error: str
    text: str = ""


def gzipped(uri: str) -> bool:
    return PurePosixPath(uri.split("?")[0]).suffix.lower() == ".gz"


def manifest_format(uri: str) -> str:
    """`jsonl`, `csv` or `parquet`, from the file name (a gzipped file: the name under `.gz`)."""
    path, packed = PurePosixPath(uri.split("?")[0]), gzipped(uri)
    suffix = (path.with_suffix("") if packed else path).suffix.lower()
    if suffix not in FORMATS or (packed and FORMATS[suffix] == "parquet"):
        name = "".join(path.suffixes[-2:]).lower() if packed else suffix
        raise ValueError(f"{uri}: unknown manifest format {name!r} (use .jsonl, .csv or .parquet; "
                         ".jsonl.gz and .csv.gz are read too)")
    return FORMATS[suffix]


def gunzip(uri: str, data: bytes) -> bytes:
    """A gzipped manifest's bytes, or a one-line error naming the file."""
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as exc:  # not gzip, truncated, corrupt
        raise ValueError(f"{uri}: not a readable gzip file ({exc})") from None


def not_utf8(raw: bytes, exc: UnicodeDecodeError) -> BadLine:
    return BadLine(f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at byte {exc.start} of the line)",
                   raw.decode("utf-8", errors="replace")[:200])


def parse_jsonl(data: bytes) -> list[dict | str | BadLine]:
    """Rows of JSONL bytes; a line that is not a JSON object stays a string, one that is not
    UTF-8 becomes a `BadLine` (error rows, either)."""
    rows: list[dict | str | BadLine] = []
    for raw in data.splitlines():  # bytes rules, exactly as `jsonl_offsets` counts lines
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8").lstrip("\ufeff")  # a BOM on line 1
        except UnicodeDecodeError as exc:
            rows.append(not_utf8(raw, exc))
            continue
        try:
            value = json.loads(line)
            rows.append(value if isinstance(value, dict) else line)
        except json.JSONDecodeError:
            rows.append(line)
    return rows


def jsonl_offsets(data: bytes) -> list[int]:
    """Byte offset where each non-empty line starts, plus the end of the data."""
    offsets, pos = [], 0
    for line in data.splitlines(keepends=True):
        if line.strip():
            offsets.append(pos)
        pos += len(line)
    return offsets + [len(data)]


def unpacked(uri: str, data: bytes) -> bytes:
    """A manifest file's bytes as stored -> its content (a gzipped file's decompressed)."""
    return gunzip(uri, data) if gzipped(uri) else data


def parse_rows(uri: str, data: bytes) -> list[dict | str]:
    """Every row of a manifest file's bytes as stored."""
    return parse_unpacked(uri, unpacked(uri, data))


def parse_unpacked(uri: str, data: bytes) -> list[dict | str]:
    """Every row of a manifest file's content (`unpacked`)."""
    kind = manifest_format(uri)
    if kind == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(io.BytesIO(data)).to_pylist()
    if kind == "csv":
        text = data.decode("utf-8", errors="surrogateescape")  # bad bytes -> lone surrogates, found per row
        rows: list = []
        for r in csv.DictReader(io.StringIO(text)):
            bad = [k for k, v in r.items() if isinstance(v, str) and any("\udc80" <= c <= "\udcff" for c in v)]
            if bad:
                raw = ",".join(str(v) for v in r.values()).encode("utf-8", errors="surrogateescape")
                rows.append(BadLine(f"not valid UTF-8 (field {bad[0]!r})", raw.decode("utf-8", errors="replace")[:200]))
            else:
                rows.append(dict(r))
        return rows
    return parse_jsonl(data)


KNOWN_FIELDS = frozenset(ManifestRow.model_fields)


def unknown_fields(rows: list) -> dict[str, int]:
    """Fields rows carry that mean nothing here (ignored), with how many rows carry each."""
    counts: dict[str, int] = {}
    for row in rows:
        if isinstance(row, dict):
            for key in row.keys() - KNOWN_FIELDS:
                counts[str(key)] = counts.get(str(key), 0) + 1
    return dict(sorted(counts.items()))


def validate(raw: dict | str | BadLine, source: str) -> ManifestRow | RowError:
    if isinstance(raw, BadLine):
        return RowError(source, None, raw.error, raw.text)
    if isinstance(raw, str):
        return RowError(source, None, "not a JSON object", raw[:200])
    # empty CSV cells mean "not given" for optional fields; id and text keep theirs (clear errors),
    # and a null id is named as one
    clean = {k: v for k, v in raw.items() if k == "id" or (v is not None and (v != "" or k == "text"))}
    try:
        return ManifestRow(**clean)
    except ValidationError as exc:
        why = field_errors(exc.errors(), "row")
        return RowError(source, row_id(raw.get("id")), why, str(raw.get("text", ""))[:200])


def validated(raws: list[dict | str], uri: str, first_row: int) -> list[ManifestRow | RowError]:
    """Rows in manifest order, each a `ManifestRow` or a `RowError` (`first_row` is 0-based)."""
    return [validate(raw, f"{uri}:{n}") for n, raw in enumerate(raws, first_row + 1)]
