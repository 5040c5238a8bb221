"""Power mel spectrograms as librosa computes them (`librosa.feature.melspectrogram` defaults:
periodic Hann window, centred frames with zero padding, |STFT|^2, Slaney-scale mel filters
with Slaney area normalisation), in numpy, so the speaker encoder needs no librosa/numba."""

from __future__ import annotations

import numpy as np

_F_SP = 200.0 / 3  # Slaney scale: linear below 1 kHz ...
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = np.log(6.4) / 27.0  # ... logarithmic above


def hz_to_mel(hz: np.ndarray) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    log_part = _MIN_LOG_MEL + np.log(np.maximum(hz, _MIN_LOG_HZ) / _MIN_LOG_HZ) / _LOGSTEP
    return np.where(hz >= _MIN_LOG_HZ, log_part, hz / _F_SP)


def mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    log_part = _MIN_LOG_HZ * np.exp(_LOGSTEP * (mel - _MIN_LOG_MEL))
    return np.where(mel >= _MIN_LOG_MEL, log_part, _F_SP * mel)


def mel_filters(sample_rate: int, n_fft: int, n_mels: int) -> np.ndarray:
    """`[n_mels, n_fft // 2 + 1]` triangular filters from 0 Hz to Nyquist, Slaney-normalised."""
    fft_freqs = np.linspace(0, sample_rate / 2, 1 + n_fft // 2)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(sample_rate / 2), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2:] - mel_f[:-2]))[:, None]  # equal area per filter
    return weights.astype(np.float32)


def power_mel(wave: np.ndarray, sample_rate: int, n_fft: int, hop: int, n_mels: int) -> np.ndarray:
    """`[frames, n_mels]` power mel spectrogram of float audio `[N]`; frames = 1 + N // hop."""
    wave = np.asarray(wave, dtype=np.float32)
    padded = np.pad(wave, n_fft // 2)  # centred frames, zeros outside
    count = 1 + (len(padded) - n_fft) // hop
    index = np.arange(n_fft)[None, :] + hop * np.arange(count)[:, None]
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)).astype(np.float32)
    spectrum = np.abs(np.fft.rfft(padded[index] * window, axis=1)) ** 2  # [frames, n_fft/2+1]
    return (spectrum.astype(np.float32) @ mel_filters(sample_rate, n_fft, n_mels).T).astype(np.float32)
