"""A long text's chunks, each decoded to audio on its own, joined into one clip.

Each chunk is decoded on its own, so each chunk's audio starts and ends with whatever silence
the model put there. Joining trims every chunk's edge silence down to `keep_s` (so two chunks
meet with a pause of about `2 * keep_s`, a sentence pause, instead of the sum of two chunks'
silences) and overlaps neighbours by a short linear crossfade (no click where they meet).
Silence is found per 10 ms frame: a frame is silent when its RMS is `silence_db` below the
chunk's loudest frame. The clip is not the codec's decode of the chunks' codes put together but
the chunks' decodes joined (the codec never saw the joins).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

CROSSFADE_S = 0.02
KEEP_S = 0.1
SILENCE_DB = -40.0
FRAME_S = 0.01


@dataclass
class JoinedAudio:
    """One clip made of a row's chunks.

    Attributes:
        wave: the joined samples (float32).
        offsets: where each chunk's kept audio starts in `wave` (samples).
        kept: samples of each chunk kept after trimming.
        trimmed: (head, tail) samples trimmed off each chunk.
        crossfade: samples each pair of neighbours overlaps by.
    """

    wave: np.ndarray
    offsets: list[int]
    kept: list[int]
    trimmed: list[tuple[int, int]]
    crossfade: int


def speech_extent(wave: np.ndarray, sample_rate: int, silence_db: float = SILENCE_DB) -> tuple[int, int]:
    """(first, end) sample of `wave`'s non-silent frames; (0, 0) when it is all silence."""
    frame = max(1, round(FRAME_S * sample_rate))
    n = len(wave) // frame
    if n == 0:
        return (0, len(wave)) if np.any(wave) else (0, 0)
    rms = np.sqrt(np.mean(np.square(wave[: n * frame].astype(np.float64)).reshape(n, frame), axis=1))
    peak = rms.max()
    if peak == 0:
        return 0, 0
    loud = np.flatnonzero(rms >= peak * 10 ** (silence_db / 20))
    return int(loud[0]) * frame, min(len(wave), (int(loud[-1]) + 1) * frame)


def trim_edges(wave: np.ndarray, sample_rate: int, keep_s: float = KEEP_S,
               silence_db: float = SILENCE_DB) -> tuple[np.ndarray, int, int]:
    """`wave` with its leading and trailing silence cut down to `keep_s`; returns the kept
    samples and how many were trimmed at the head and at the tail."""
    first, end = speech_extent(wave, sample_rate, silence_db)
    keep = round(keep_s * sample_rate)
    if end == 0:  # all silence: keep a pause's worth
        return wave[: 2 * keep], 0, max(0, len(wave) - 2 * keep)
    head, stop = max(0, first - keep), min(len(wave), end + keep)
    return wave[head:stop], head, len(wave) - stop


def join_audio(waves: Sequence[np.ndarray], sample_rate: int, crossfade_s: float = CROSSFADE_S,
               keep_s: float = KEEP_S, silence_db: float = SILENCE_DB) -> JoinedAudio:
    """The chunks' audio as one clip: edge silence trimmed to `keep_s`, neighbours crossfaded
    over `crossfade_s` (shortened where a piece is shorter), so the clip lasts the sum of the
    kept pieces minus one crossfade per join.

    Raises:
        ValueError: no chunk to join.
    """
    if not waves:
        raise ValueError("no chunk audio to join")
    pieces, trimmed = [], []
    for wave in waves:
        kept, head, tail = trim_edges(np.asarray(wave, dtype=np.float32), sample_rate, keep_s, silence_db)
        pieces.append(kept)
        trimmed.append((head, tail))
    fade = round(crossfade_s * sample_rate)
    if len(pieces) > 1:
        fade = min(fade, *(len(p) for p in pieces))
    out = pieces[0].copy()
    offsets = [0]
    ramp = np.linspace(0.0, 1.0, fade, endpoint=False, dtype=np.float32) if fade else None
    for piece in pieces[1:]:
        offsets.append(len(out) - fade)
        if fade:
            out[-fade:] = out[-fade:] * (1.0 - ramp) + piece[:fade] * ramp
        out = np.concatenate([out, piece[fade:]])
    return JoinedAudio(out, offsets, [len(p) for p in pieces], trimmed, fade)


def placed(joined: JoinedAudio, index: int, sample_rate: int) -> dict:
    """Where chunk `index`'s audio lies in the joined clip, in seconds: its start, its length,
    and the silence trimmed off its head and tail."""
    return {"audio_start": round(joined.offsets[index] / sample_rate, 6),
            "audio_seconds": round(joined.kept[index] / sample_rate, 6),
            "trimmed_seconds": [round(t / sample_rate, 6) for t in joined.trimmed[index]]}
