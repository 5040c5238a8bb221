"""Deterministic synthetic "voices" for tests and demo prompts (no recordings ship with the kit).

A voice is a glottal-like harmonic source at a speaker-specific pitch with vibrato, shaped by
speaker-specific formant resonances and modulated into syllable-like bursts with short pauses.
It is not speech; it only gives speaker encoders and ASR something voice-shaped and
reproducible (numpy's PCG64 stream is stable across versions).
"""

from __future__ import annotations

import numpy as np

SAMPLE_RATE = 16_000


def synthetic_voice(seed: int, seconds: float = 3.0, f0: float = 120.0,
                    formants: tuple[float, ...] = (700.0, 1200.0, 2600.0),
                    sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """A float32 mono waveform `[seconds * sample_rate]` in [-1, 1].

    Args:
        seed: randomness of the syllable rhythm, vibrato phase and noise.
        seconds: duration.
        f0: mean pitch in Hz (the main speaker trait, with `formants`).
        formants: resonance centres in Hz.
        sample_rate: samples per second.
    """
    rng = np.random.default_rng(seed)
    n = int(seconds * sample_rate)
    t = np.arange(n) / sample_rate
    pitch = f0 * (1 + 0.03 * np.sin(2 * np.pi * 5.0 * t + rng.uniform(0, 2 * np.pi)))
    phase = 2 * np.pi * np.cumsum(pitch) / sample_rate
    harmonics = np.arange(1, int(4000 / f0) + 1)
    freqs = pitch[:, None] * harmonics[None, :]  # [n, H]
    gain = np.zeros_like(freqs)
    for centre in formants:  # resonances: Lorentzian bumps over frequency, 1/h source tilt
        gain += 1.0 / (1.0 + ((freqs - centre) / 120.0) ** 2)
    source = (gain / harmonics) * np.sin(phase[:, None] * harmonics)
    wave = source.sum(1) + 0.01 * rng.standard_normal(n)
    # syllables of 120-300 ms separated by 40-150 ms pauses, with smooth on/off ramps
    envelope = np.zeros(n)
    pos = int(0.1 * sample_rate)
    while pos < n:
        length = int(rng.uniform(0.12, 0.30) * sample_rate)
        seg = np.sin(np.linspace(0, np.pi, min(length, n - pos))) ** 0.5
        envelope[pos:pos + len(seg)] = seg
        pos += length + int(rng.uniform(0.04, 0.15) * sample_rate)
    wave *= envelope
    return (0.5 * wave / (np.abs(wave).max() + 1e-9)).astype(np.float32)
