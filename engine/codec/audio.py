"""Audio in and out: reading clips (any rate -> the codec's rate, mono), WAV/FLAC bytes.

Resampling uses `scipy.signal.resample_poly` (polyphase FIR, Kaiser window, beta 5.0): exact
rational ratios such as 44100 -> 16000 = 160/441, linear phase, no wrap-around at the ends
as FFT resampling has.
"""

from __future__ import annotations

import io
from math import gcd
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np

from engine.codec.base import CodecError

AudioFormat = Literal["wav", "flac"]
AUDIO_FORMATS: tuple[str, ...] = ("wav", "flac")


def resample(waveform: np.ndarray, orig_sr: int, target_sr: int) -> np.ndarray:
    """Polyphase resampling of mono float audio `[N]` -> `[ceil(N * target_sr / orig_sr)]`.

    Raises:
        ValueError: a rate is not positive.
    """
    if orig_sr <= 0 or target_sr <= 0:
        raise ValueError(f"sample rates must be positive; got {orig_sr} -> {target_sr}")
    wav = np.asarray(waveform, dtype=np.float32)
    if orig_sr == target_sr:
        return wav
    from scipy.signal import resample_poly

    g = gcd(int(orig_sr), int(target_sr))
    return resample_poly(wav, target_sr // g, orig_sr // g).astype(np.float32)


def to_mono(data: np.ndarray) -> np.ndarray:
    """`[N]` or `[N, channels]` (soundfile's layout) -> `[N]`, channels averaged."""
    return data if data.ndim == 1 else data.mean(axis=1)


def read_clip(source: str | Path | BinaryIO, target_sr: int, name: str | None = None) -> np.ndarray:
    """Read a WAV/FLAC (anything libsndfile reads) as float32 mono `[N]` at `target_sr`.

    Args:
        name: what to call the clip in errors (its URI, when `source` holds its bytes).

    Raises:
        CodecError: missing, unreadable or empty file (the message names it).
    """
    data, sr = read_wave(source, name)
    return resample(data, sr, target_sr)


def read_wave(source: str | Path | BinaryIO, name: str | None = None) -> tuple[np.ndarray, int]:
    """`read_clip` at the clip's own rate: (float32 mono `[N]`, its rate)."""
    import soundfile as sf

    name = name or (str(source) if isinstance(source, (str, Path)) else "clip")
    if isinstance(source, (str, Path)) and not Path(source).is_file():
        raise CodecError(f"audio clip {name} does not exist")
    try:
        data, sr = sf.read(source, dtype="float32", always_2d=False)
    except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
        why = getattr(exc, "error_string", None) or str(exc).replace(repr(source), name).replace(str(source), name)
        raise CodecError(f"cannot read audio clip {name}: {why} (WAV or FLAC expected)") from exc
    if data.size == 0:
        raise CodecError(f"audio clip {name} holds no samples")
    return to_mono(data), int(sr)


def to_pcm16(waveform: np.ndarray) -> np.ndarray:
    """Float audio in [-1, 1] -> int16 `[N]`; values beyond full scale are clipped (a random or
    badly conditioned decoder can overshoot, and libsndfile would wrap them around)."""
    wav = np.nan_to_num(np.asarray(waveform, dtype=np.float32), nan=0.0)
    return np.round(np.clip(wav, -1.0, 1.0) * 32767.0).astype(np.int16)


def audio_bytes(waveform: np.ndarray, sample_rate: int, fmt: str = "wav") -> bytes:
    """16-bit PCM WAV or FLAC file bytes of mono float audio `[N]`.

    Raises:
        ValueError: unknown format.
    """
    import soundfile as sf

    if fmt not in AUDIO_FORMATS:
        raise ValueError(f"audio format must be one of {', '.join(AUDIO_FORMATS)}; got {fmt!r}")
    buf = io.BytesIO()
    sf.write(buf, to_pcm16(waveform), sample_rate, format=fmt.upper(), subtype="PCM_16")
    return buf.getvalue()


def read_audio_bytes(data: bytes) -> tuple[np.ndarray, int]:
    """(int16 samples `[N]`, sample rate) of WAV/FLAC bytes: the inverse of `audio_bytes`."""
    import soundfile as sf

    samples, sr = sf.read(io.BytesIO(data), dtype="int16", always_2d=False)
    return samples, int(sr)
