"""Resemblyzer's speaker encoder (GE2E d-vectors), re-implemented on its bundled weights.

Why not `import resemblyzer`: its VAD dependency (`webrtcvad`) imports `pkg_resources`, which
setuptools >= 81 no longer ships, and it pulls librosa/numba for one mel spectrogram. The
`resemblyzer` wheel is installed only for `pretrained.pt`; this module reproduces its recipe:
volume normalised up to -30 dBFS, long silences trimmed by WebRTC VAD (mode 3, 30 ms windows,
moving average over 8, dilation by 6), 40-band power mel (25 ms / 10 ms), partial utterances of
160 frames at 1.3 per second, a 3-layer LSTM (256) + linear + ReLU, L2-normalised mean of the
partial embeddings. Tested against reference embeddings made by resemblyzer 0.1.4 itself.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch
from torch import nn

from engine.metrics.deps import MissingBackend
from engine.metrics.melspec import power_mel

SAMPLE_RATE = 16_000
HOP = 160  # 10 ms
PARTIAL_FRAMES = 160  # 1.6 s
VAD_WINDOW = 480  # 30 ms
INT16_MAX = 2 ** 15 - 1


def bundled_weights() -> Path:
    """Path of `pretrained.pt` inside the installed `resemblyzer` package (never imported)."""
    spec = importlib.util.find_spec("resemblyzer")
    if spec is None or not spec.submodule_search_locations:
        raise MissingBackend("speaker similarity (Resemblyzer encoder) needs the weights shipped in "
                             "the Python package 'resemblyzer': pip install 'pcg-synth[quality]' "
                             "(or pip install resemblyzer==0.1.4), or pass a WavLM x-vector "
                             "checkpoint directory")
    path = Path(next(iter(spec.submodule_search_locations))) / "pretrained.pt"
    if not path.is_file():
        raise MissingBackend(f"{path} is missing: reinstall resemblyzer==0.1.4")
    return path


def normalize_volume(wave: np.ndarray, target_dbfs: float = -30.0) -> np.ndarray:
    """Raise (never lower) the level to `target_dbfs` RMS."""
    rms = np.sqrt(np.mean((wave.astype(np.float64) * INT16_MAX) ** 2))
    if rms == 0:
        return wave
    change = target_dbfs - 20 * np.log10(rms / INT16_MAX)
    return wave if change < 0 else (wave * 10 ** (change / 20)).astype(np.float32)


def voice_flags(wave: np.ndarray) -> np.ndarray:
    """WebRTC VAD decision (aggressiveness 3) per 30 ms window of 16 kHz audio."""
    try:
        import _webrtcvad  # the C extension of webrtcvad / webrtcvad-wheels; its Python
    except ImportError as exc:  # wrapper is the part that needs pkg_resources
        raise MissingBackend("Resemblyzer's silence trimming needs WebRTC VAD: pip install "
                             "'pcg-synth[quality]' (or pip install webrtcvad-wheels)") from exc
    vad = _webrtcvad.create()
    _webrtcvad.init(vad)
    _webrtcvad.set_mode(vad, 3)
    pcm = np.round(wave * INT16_MAX).astype(np.int16).tobytes()
    step = VAD_WINDOW * 2
    return np.array([_webrtcvad.process(vad, SAMPLE_RATE, pcm[i:i + step], VAD_WINDOW)
                     for i in range(0, len(pcm), step)], dtype=bool)


def trim_long_silences(wave: np.ndarray, average: int = 8, max_silence: int = 6) -> np.ndarray:
    """Drop silent stretches longer than `max_silence` VAD windows (Resemblyzer's rule)."""
    from scipy.ndimage import binary_dilation

    wave = wave[: len(wave) - len(wave) % VAD_WINDOW]
    flags = voice_flags(wave).astype(np.float64)
    padded = np.concatenate([np.zeros((average - 1) // 2), flags, np.zeros(average // 2)])
    csum = np.cumsum(padded)
    csum[average:] = csum[average:] - csum[:-average]
    smoothed = np.round(csum[average - 1:] / average).astype(bool)
    dilated = binary_dilation(smoothed, np.ones(max_silence + 1, dtype=bool))
    return wave[np.repeat(dilated, VAD_WINDOW)]


def partial_slices(n_samples: int, rate: float = 1.3, min_coverage: float = 0.75) -> list[slice]:
    """Mel-frame windows of 160 frames every `16000 / rate` samples covering the utterance;
    the last is dropped when it covers less than `min_coverage` of itself (unless alone)."""
    n_frames = int(np.ceil((n_samples + 1) / HOP))
    step = int(np.round(SAMPLE_RATE / rate / HOP))
    starts = range(0, max(1, n_frames - PARTIAL_FRAMES + step + 1), step)
    slices = [slice(i, i + PARTIAL_FRAMES) for i in starts]
    last = slices[-1]
    coverage = (n_samples - last.start * HOP) / (PARTIAL_FRAMES * HOP)
    return slices[:-1] if coverage < min_coverage and len(slices) > 1 else slices


class ResemblyzerEncoder(nn.Module):
    """256-d speaker embeddings of 16 kHz mono audio.

    Args:
        weights: a Resemblyzer `pretrained.pt` (default: the installed package's).
        device: where the LSTM runs.
        preprocess: normalise volume and trim long silences first (Resemblyzer's
            `preprocess_wav`); off gives its `embed_utterance` on the raw waveform.
    """

    def __init__(self, weights: str | Path | None = None, device: str = "cpu", preprocess: bool = True) -> None:
        super().__init__()
        self.lstm = nn.LSTM(40, 256, 3, batch_first=True)
        self.linear = nn.Linear(256, 256)
        state = torch.load(str(weights or bundled_weights()), map_location="cpu")["model_state"]
        self.load_state_dict({k: v for k, v in state.items() if k.startswith(("lstm.", "linear."))})
        self.preprocess = preprocess
        self.to(device).eval()

    @torch.inference_mode()
    def embed(self, wave: np.ndarray) -> np.ndarray:
        """float32 `[256]`, unit norm, of one utterance `[N]` at 16 kHz."""
        wave = np.asarray(wave, dtype=np.float32)
        if self.preprocess:
            wave = normalize_volume(wave)
            voiced = trim_long_silences(wave)
            # Nothing voiced (e.g. a random codec's noise): embed the whole clip rather than
            # fail; Resemblyzer itself would crash on the empty array.
            wave = voiced if len(voiced) else wave
        if len(wave) == 0:
            raise ValueError("empty audio")
        slices = partial_slices(len(wave))
        wave = np.pad(wave, (0, max(0, slices[-1].stop * HOP - len(wave))))
        mel = power_mel(wave, SAMPLE_RATE, 400, HOP, 40)  # [frames, 40]
        mels = torch.from_numpy(np.stack([mel[s] for s in slices])).to(self.linear.weight.device)
        _, (hidden, _) = self.lstm(mels)
        partials = torch.relu(self.linear(hidden[-1]))
        partials = partials / partials.norm(dim=1, keepdim=True)
        mean = partials.mean(0)
        return (mean / mean.norm()).cpu().numpy()
