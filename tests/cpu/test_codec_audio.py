"""Clip reading, resampling (scipy resample_poly) and WAV/FLAC bytes."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from engine.codec.audio import audio_bytes, read_audio_bytes, read_clip, resample, to_pcm16
from engine.codec.base import CodecError


def sine(freq: float, sr: int, seconds: float, amp: float = 0.5) -> np.ndarray:
    return (amp * np.sin(2 * np.pi * freq * np.arange(int(sr * seconds)) / sr)).astype(np.float32)


def test_resample_44k1_sine_to_16k():
    out = resample(sine(1000, 44100, 1.0), 44100, 16000)
    assert out.dtype == np.float32 and out.shape == (16000,)
    want = sine(1000, 16000, 1.0)
    core = slice(200, -200)  # the FIR filter's edges see zeros beyond the clip
    assert np.abs(out[core] - want[core]).max() < 2e-3


def test_resample_removes_content_above_new_nyquist():
    # 10 kHz is above 16 kHz's Nyquist (8 kHz): the anti-alias filter must suppress it.
    out = resample(sine(10000, 44100, 1.0), 44100, 16000)
    assert np.sqrt(np.mean(out[200:-200] ** 2)) < 0.01 * 0.5 / np.sqrt(2)


def test_resample_identity_and_bad_rates():
    x = sine(440, 16000, 0.1)
    np.testing.assert_array_equal(resample(x, 16000, 16000), x)
    assert resample(x, 16000, 8000).shape == (800,)
    with pytest.raises(ValueError, match="positive"):
        resample(x, 0, 16000)


def test_read_clip_mixes_stereo_and_resamples(tmp_path):
    left, right = sine(500, 44100, 0.5, 0.6), sine(500, 44100, 0.5, 0.2)
    path = tmp_path / "stereo.flac"
    sf.write(path, np.stack([left, right], axis=1), 44100, subtype="PCM_16")
    clip = read_clip(path, 16000)
    assert clip.shape == (8000,) and clip.dtype == np.float32
    want = sine(500, 16000, 0.5, 0.4)  # mean of the two channels
    assert np.abs(clip[200:-200] - want[200:-200]).max() < 2e-3


def test_read_clip_errors(tmp_path):
    with pytest.raises(CodecError, match="does not exist"):
        read_clip(tmp_path / "missing.wav", 16000)
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"this is not audio")
    with pytest.raises(CodecError, match="cannot read audio clip .*junk.wav"):
        read_clip(junk, 16000)
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros(0, np.float32), 16000)
    with pytest.raises(CodecError, match="no samples"):
        read_clip(empty, 16000)


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_audio_bytes_round_trip(fmt):
    wave = np.random.default_rng(0).uniform(-0.9, 0.9, 3200).astype(np.float32)
    data = audio_bytes(wave, 16000, fmt)
    assert data[:4] == (b"RIFF" if fmt == "wav" else b"fLaC")
    samples, sr = read_audio_bytes(data)
    assert sr == 16000
    np.testing.assert_array_equal(samples, to_pcm16(wave))
    assert np.abs(samples / 32767.0 - wave).max() <= 0.5 / 32767 + 1e-7


def test_pcm16_clips_instead_of_wrapping():
    pcm = to_pcm16(np.array([1.5, -2.0, 0.5, np.nan], np.float32))
    assert pcm.tolist() == [32767, -32767, 16384, 0]


def test_audio_bytes_rejects_unknown_format():
    with pytest.raises(ValueError, match="wav, flac"):
        audio_bytes(np.zeros(10, np.float32), 16000, "mp3")
