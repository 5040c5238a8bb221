"""Reading what eval compares against: the produced dataset and the voice-prompt clips."""

from __future__ import annotations

import io
from pathlib import PurePosixPath

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from engine.io.storage import Storage, relative_to

SAMPLE_RATE = 16_000


def dataset_files(uri: str, storage: Storage) -> list[str]:
    """The Parquet files of a dataset: `uri` itself, or every `*.parquet` under it (a job's
    output directory has them in `data/`)."""
    files = [u for u in storage.list(uri) if u.endswith(".parquet")]
    if not files:
        raise ValueError(f"{uri}: no .parquet dataset files there (give a file written by "
                         "`pcg-synth generate --out X.parquet` or a job's output directory)")
    return files


def read_dataset(uri: str, storage: Storage | None = None) -> pa.Table:
    """All rows of the dataset at `uri` (one Parquet file, or a directory/prefix of them)."""
    storage = storage or Storage()
    tables = [pq.read_table(io.BytesIO(storage.read_bytes(f))) for f in dataset_files(uri, storage)]
    missing = {"id", "text", "audio"} - set(tables[0].column_names)
    if missing:
        raise ValueError(f"{uri}: not a pcg-synth audio dataset (no {', '.join(sorted(missing))} column)")
    return pa.concat_tables(tables, promote_options="default")


def decode_audio(audio: dict | None) -> np.ndarray | None:
    """float32 mono 16 kHz samples of a dataset `audio` cell (None when it has none)."""
    from engine.codec.audio import read_audio_bytes, resample

    if not audio or not audio.get("bytes"):
        return None
    samples, sr = read_audio_bytes(audio["bytes"])
    wave = samples.astype(np.float32) / 32768.0
    return resample(wave if wave.ndim == 1 else wave.mean(1), sr, SAMPLE_RATE)


class PromptClips:
    """Voice-prompt audio for dataset rows, from the manifest the dataset was made from.

    A row's reference is found by its `id` (else its `prompt_id`) in the manifest: the row's
    `prompt_audio` clip (relative paths from the manifest's folder), or, with a codec, its
    `prompt_codes` decoded to audio (a resynthesised reference, recorded as such).

    Args:
        manifests: manifest URIs (.jsonl/.csv/.parquet).
        codec: decodes code-only prompts; None skips them.
        storage: reads the manifests and clips.
    """

    def __init__(self, manifests: list[str], codec=None, storage: Storage | None = None) -> None:
        from engine.io.manifest import parse_rows

        self.storage, self.codec = storage or Storage(), codec
        self.by_key: dict[str, tuple[str, object]] = {}  # id / prompt_id -> ("clip"|"codes", ref)
        for uri in manifests:
            for row in parse_rows(uri, self.storage.read_bytes(uri)):
                ref = self._reference(uri, row) if isinstance(row, dict) else None
                if ref is None:
                    continue
                for key in (row.get("id"), row.get("prompt_id")):
                    if key is not None:
                        self.by_key.setdefault(str(key), ref)
        self._waves: dict[str, np.ndarray] = {}
        # rows without a reference, by reason: "no_prompt", "not_found" (a prompt_id the
        # manifests do not hold), "codes_without_codec"
        self.missing: dict[str, int] = {}

    @property
    def has_codes(self) -> bool:
        """Some prompt is given only as codes (decoding it needs a codec)."""
        return any(kind == "codes" for kind, _ in self.by_key.values())

    def notes(self) -> list[str]:
        """Why rows have no speaker similarity, one line per reason."""
        why = {"codes_without_codec": "their voice prompts are codec codes and no codec was given "
                                      "(--codec DIR; a job's output names it in _job.json)",
               "not_found": "their prompt ids are not in the --prompts manifests",
               "no_prompt": "they have no voice prompt (the model's own voice: nothing to compare with)"}
        return [f"no speaker similarity for {n} row(s): {why[k]}" for k, n in self.missing.items() if n]

    @staticmethod
    def _reference(uri: str, row: dict) -> tuple[str, object] | None:
        if row.get("prompt_audio"):
            return "clip", relative_to(uri, str(row["prompt_audio"]))
        if row.get("prompt_codes"):
            codes = row["prompt_codes"]
            return "codes", [int(c) for c in (codes.split() if isinstance(codes, str) else codes)]
        return None

    def wave(self, row_id: str, prompt_id: str | None) -> tuple[np.ndarray, str] | None:
        """(reference audio, "clip" | "codes") for a row, or None when it has no prompt."""
        from engine.codec.audio import read_clip, resample

        key = row_id if row_id in self.by_key else prompt_id
        if key is None or key not in self.by_key:
            reason = "no_prompt" if prompt_id is None else "not_found"
            self.missing[reason] = self.missing.get(reason, 0) + 1
            return None
        kind, ref = self.by_key[key]
        if kind == "codes" and self.codec is None:
            self.missing["codes_without_codec"] = self.missing.get("codes_without_codec", 0) + 1
            return None
        cache_key = f"{kind}:{ref}" if kind == "clip" else f"codes:{hash(tuple(ref))}"
        if cache_key not in self._waves:
            if kind == "clip":
                self._waves[cache_key] = read_clip(io.BytesIO(self.storage.read_bytes(ref)), SAMPLE_RATE, name=ref)
            else:
                wave = self.codec.decode([np.asarray(ref)])[0]
                self._waves[cache_key] = resample(wave, self.codec.sample_rate, SAMPLE_RATE)
        return self._waves[cache_key], kind


def sibling(uri: str, suffix: str) -> str:
    """`out/x.parquet` -> `out/x{suffix}`; a directory `out/job` -> `out/job{suffix}`."""
    path = PurePosixPath(uri.rstrip("/"))
    stem = path.name.removesuffix(".parquet")
    if "://" not in uri:
        return str(path.with_name(stem + suffix))
    return uri.rstrip("/").rsplit("/", 1)[0] + "/" + stem + suffix
