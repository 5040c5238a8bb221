"""Synthesis results -> audio: a Parquet dataset and/or one audio file per item.

Results are processed in windows of `window` items (decoded with equal-length batching, turned
into WAV/FLAC bytes, written as one Parquet row group and/or files), so a long job never holds
more than one window of audio in memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from engine.codec.audio import AUDIO_FORMATS, audio_bytes
from engine.codec.base import Codec, CodecError, as_code_array, samples
from engine.codec.join import join_audio, placed
from engine.codec.prompts import PROMPT_AUDIO_MODES, VoicePrompt, codes_for_audio
from engine.config import DecodingSettings
from engine.io.dataset import AudioRow, build_table, dataset_schema, parquet_writer, quality_schema, with_quality
from engine.records import SynthesisResult


def file_name(item_id: str, fmt: str) -> str:
    """A safe file name for an item; ids that needed changes get a hash so they stay unique."""
    clean = re.sub(r"[^A-Za-z0-9._-]", "_", item_id)[:120].lstrip(".") or "_"
    if clean != item_id:
        clean += "-" + hashlib.sha256(item_id.encode()).hexdigest()[:8]
    return f"{clean}.{fmt}"


def no_codes(finish_reason: str) -> str:
    """Why a decoded item has no audio when it ended without speech codes."""
    return f"no speech codes to decode (finish_reason {finish_reason!r})"


def decode_waves(codec: Codec, codes: Sequence[Sequence[int]], prompts: Sequence[VoicePrompt | None],
                 prompt_audio: str = "strip", names: Sequence[str] | None = None) -> list[np.ndarray | CodecError]:
    """The audio of each code list as it is written (a voice prompt's audio per `prompt_audio`,
    see `codes_for_audio`), decoded together, equal lengths batched; a `CodecError` in place of
    a list the codec cannot take (empty, out of range). `names` name the items in those errors."""
    out: list[np.ndarray | CodecError | None] = [None] * len(codes)
    todo = []  # (index, codes to decode, leading codes to cut)
    for i, (own, prompt) in enumerate(zip(codes, prompts)):
        joined, cut = codes_for_audio(own, prompt, prompt_audio)
        try:
            todo.append((i, as_code_array(joined, codec.codebook_size, f"item {names[i] if names else i}"), cut))
        except CodecError as exc:
            out[i] = exc
    for (i, _, cut), wav in zip(todo, codec.decode([c for _, c, _ in todo])):
        out[i] = wav[samples(codec, cut):]
    return out


def result_waves(codec: Codec, results: Sequence[SynthesisResult], prompts: Sequence[VoicePrompt | None],
                 prompt_audio: str = "strip") -> list[np.ndarray | CodecError]:
    """Each result's audio as written (`decode_waves`); a long text's result (`result.chunks`)
    as its chunks' codes decoded apart (the first with the voice prompt's audio as
    `prompt_audio` says, the others with the prompt as context) and joined into one clip
    (`codec.join.join_audio`), each chunk's record then saying where its audio lies in it."""
    pieces = []  # (result index, codes, prompt, mode)
    for i, (res, prompt) in enumerate(zip(results, prompts)):
        start = 0
        for k, chunk in enumerate(res.chunks or [{"num_codes": len(res.codes)}]):
            mode = "context" if k > 0 and prompt_audio == "include" else prompt_audio
            pieces.append((i, res.codes[start:start + chunk["num_codes"]], prompt, mode))
            start += chunk["num_codes"]
    waves: list = [None] * len(pieces)
    for mode in sorted({p[3] for p in pieces}):
        mine = [n for n, p in enumerate(pieces) if p[3] == mode]
        decoded = decode_waves(codec, [pieces[n][1] for n in mine], [pieces[n][2] for n in mine], mode,
                               [results[pieces[n][0]].id for n in mine])
        for n, wave in zip(mine, decoded):
            waves[n] = wave
    by_result: list[list] = [[] for _ in results]
    for (owner, *_), wave in zip(pieces, waves):
        by_result[owner].append(wave)
    out = []
    for res, own in zip(results, by_result):
        failed = next((w for w in own if isinstance(w, CodecError)), None)
        if failed is not None or not res.chunks:
            out.append(failed if failed is not None else own[0])
            continue
        joined = join_audio(own, codec.sample_rate)
        for k, record in enumerate(res.chunks):
            record.update(placed(joined, k, codec.sample_rate))
        out.append(joined.wave)
    return out


def audio_row(result: SynthesisResult, prompt: VoicePrompt | None, prompt_audio: str, origin: dict | None,
              audio: np.ndarray | str | None, audio_format: str, sample_rate: int) -> AudioRow:
    """A dataset row of one result: `audio` is its waveform, the reason it has none, or None
    (a decoding error, already in the result). A long text's chunk records (`result.chunks`)
    join its provenance."""
    if result.chunks:
        origin = {**(origin or {}), "chunks": result.chunks}
    row = AudioRow(result=result, prompt_id=prompt.id if prompt else None,
                   prompt_audio=prompt_audio if prompt else None, provenance=origin,
                   normalized_text=result.normalized_text)
    if isinstance(audio, str):
        row.error = audio
    elif audio is not None:
        row.audio = audio_bytes(audio, sample_rate, audio_format)
        row.audio_path = file_name(result.id, audio_format)
        row.num_samples = len(audio)
    return row


def render_rows(codec: Codec, results: Sequence[SynthesisResult], prompts: Sequence[VoicePrompt | None],
                prompt_audio: str = "strip", audio_format: str = "wav",
                provenance: Sequence[dict | None] | None = None) -> list[AudioRow]:
    """Decode one window of results into dataset rows (input order kept).

    Items without codes, with a decoding error or with out-of-range codes become rows with an
    `error` and no audio; the others are decoded together, equal lengths batched.
    """
    provenance = provenance if provenance is not None else [None] * len(results)
    audio: list = [None if res.error else no_codes(res.finish_reason) for res in results]
    todo = [i for i, res in enumerate(results) if not res.error and res.codes]
    waves = result_waves(codec, [results[i] for i in todo], [prompts[i] for i in todo], prompt_audio)
    for i, wave in zip(todo, waves):
        audio[i] = str(wave) if isinstance(wave, CodecError) else wave
    return [audio_row(res, prompt, prompt_audio, origin, a, audio_format, codec.sample_rate)
            for res, prompt, origin, a in zip(results, prompts, provenance, audio)]


def windows(n: int, size: int) -> Iterator[slice]:
    return (slice(k, min(k + size, n)) for k in range(0, n, size))


def check_export_args(results: Sequence[SynthesisResult], prompts, parquet_path, wav_dir,
                      audio_format: str, prompt_audio: str) -> None:
    if parquet_path is None and wav_dir is None:
        raise ValueError("nothing to write: give a Parquet path and/or a WAV directory")
    if audio_format not in AUDIO_FORMATS:
        raise ValueError(f"audio format must be one of {', '.join(AUDIO_FORMATS)}; got {audio_format!r}")
    if prompt_audio not in PROMPT_AUDIO_MODES:
        raise ValueError(f"prompt audio mode must be one of {', '.join(PROMPT_AUDIO_MODES)}; "
                         f"got {prompt_audio!r}")
    if prompts is not None and len(prompts) != len(results):
        raise ValueError(f"{len(prompts)} prompts for {len(results)} results: align them (None = no prompt)")
    if wav_dir is not None and len({r.id for r in results}) != len(results):
        raise ValueError("item ids repeat: audio files are named by id, so ids must be unique")


@dataclass(frozen=True)
class AudioOutput:
    """Where and how `export_audio` writes (at least one of `parquet_path`, `wav_dir`).

    Attributes:
        parquet_path: a `.parquet` path (written atomically) or a binary file-like object.
        wav_dir: a directory for one `{id}.{audio_format}` file per item with audio.
        audio_format: `wav` (16-bit PCM) or `flac` (16-bit), for both outputs.
        prompt_audio: `strip` (default), `include` or `context`; see `codes_for_audio`.
        window: items decoded and written per step (bounds memory).
        quality: add the quality gate's columns (`engine.io.dataset.QUALITY_FIELDS`), from each
            result's `quality` verdict.
    """

    parquet_path: str | Path | BinaryIO | None = None
    wav_dir: str | Path | None = None
    audio_format: str = "wav"
    prompt_audio: str = "strip"
    window: int = 256
    quality: bool = False


def export_audio(results: Sequence[SynthesisResult], settings: DecodingSettings | Sequence[DecodingSettings],
                 codec: Codec | str | Path | None, output: AudioOutput, *,
                 prompts: Sequence[VoicePrompt | None] | None = None,
                 provenance: Sequence[dict | None] | None = None, device: str = "cpu",
                 dtype: str = "auto") -> dict:
    """Decode results with the codec and write a Parquet shard and/or audio files.

    Args:
        results: the core's results (any order of success and failure).
        settings: the settings they were decoded with (stored per row): one for all, or one
            per result.
        codec: an already loaded codec (workers reuse theirs), or its checkpoint directory.
        output: where and how to write.
        prompts: each result's voice prompt (None for none), aligned with `results`; see
            `engine.codec.prompts.prompts_of(items)`.
        provenance: per result, where it came from (text id, prompt, seeds, model revisions):
            the `text_id` and `provenance` columns.
        device: where a codec loaded from its directory decodes (`auto`, `cpu`, `cuda`, `cuda:N`).
        dtype: that codec's dtype (`auto`: bfloat16 on CUDA, float32 on CPU).

    Returns:
        {rows, with_audio, failed, audio_seconds, codec_seconds, audio_s_per_s, parquet,
        wav_dir, format}.

    Raises:
        ValueError: nothing to write, unknown format or mode, misaligned prompts, repeated ids
            with `wav_dir`; `CodecError` (a ValueError) for a missing or invalid codec.
    """
    parquet_path, wav_dir, audio_format = output.parquet_path, output.wav_dir, output.audio_format
    prompt_audio, window, quality = output.prompt_audio, output.window, output.quality
    results = list(results)
    check_export_args(results, prompts, parquet_path, wav_dir, audio_format, prompt_audio)
    if codec is None:
        raise ValueError("give the codec's checkpoint directory (or a loaded codec)")
    if isinstance(codec, (str, Path)):
        from engine.codec.load import load_codec

        codec = load_codec(codec, device=device, dtype=dtype)
    prompts = list(prompts) if prompts is not None else [None] * len(results)
    per_row = [settings] * len(results) if isinstance(settings, DecodingSettings) else list(settings)
    if len(per_row) != len(results):
        raise ValueError(f"{len(per_row)} settings for {len(results)} results: align them")
    out_dir = Path(wav_dir) if wav_dir is not None else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    with_audio, samples, codec_s = 0, 0, 0.0
    text = ("normalized_text",) if any(r.normalized_text is not None for r in results) else ()
    with contextlib.ExitStack() as stack:
        schema = (quality_schema if quality else dataset_schema)(codec.sample_rate, text)
        writer = stack.enter_context(parquet_writer(parquet_path, schema)) if parquet_path is not None else None
        for part in windows(len(results), window):
            start = time.perf_counter()
            origins = provenance[part] if provenance is not None else None
            rows = render_rows(codec, results[part], prompts[part], prompt_audio, audio_format, origins)
            codec_s += time.perf_counter() - start
            if writer is not None:
                table = build_table(rows, per_row[part], codec.sample_rate, text)
                writer.write_table(with_quality(table, results[part]) if quality else table)
            for row in rows:
                if row.audio is None:
                    continue
                with_audio, samples = with_audio + 1, samples + row.num_samples
                if out_dir is not None:
                    (out_dir / row.audio_path).write_bytes(row.audio)
    audio_s = samples / codec.sample_rate
    return {"rows": len(results), "with_audio": with_audio, "failed": len(results) - with_audio,
            "audio_seconds": round(audio_s, 3), "codec_seconds": round(codec_s, 3),
            "audio_s_per_s": round(audio_s / codec_s, 2) if codec_s > 0 else None,
            "parquet": str(parquet_path) if isinstance(parquet_path, (str, Path)) else None,
            "wav_dir": str(out_dir) if out_dir is not None else None, "format": audio_format}
