"""X-codec2 encoder inputs from a 16 kHz waveform, without torchaudio.

transformers' `Xcodec2FeatureExtractor` needs torchaudio (for Kaldi fbank). The original
X-codec2 (`HKUSTAudio/xcodec2`, `encode_code`) computes the same semantic features with the
numpy `SeamlessM4TFeatureExtractor` (w2v-bert-2.0's extractor: Kaldi-compatible 80-bin log
fbank, per-bin mean/variance normalisation, two frames stacked into 160 features), which we
reuse here with the same padding as both implementations.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from engine.codec.base import CodecError
from engine.hf import from_transformers


@lru_cache(maxsize=1)
def semantic_extractor():
    # Its defaults are w2v-bert-2.0's preprocessor config (80 mel bins, stride 2, 16 kHz).
    return from_transformers("SeamlessM4TFeatureExtractor")()


def pad_clip(waveform: np.ndarray, hop: int) -> np.ndarray:
    """Zero-pad `[N]` to `(N // hop + 1) * hop` samples, as X-codec2 does before encoding.

    Both the original (`pad(wav, (0, hop - N % hop))`) and transformers (one zero, then up to
    a multiple of hop) give this length, so a clip of N samples encodes to `N // hop + 1` codes.
    """
    n_codes = len(waveform) // hop + 1
    out = np.zeros(n_codes * hop, dtype=np.float32)
    out[: len(waveform)] = waveform
    return out


def encoder_inputs(waveform: np.ndarray, hop: int, sample_rate: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs of `Xcodec2Model.encode` for one clip.

    Args:
        waveform: float mono audio `[N]` in [-1, 1] at `sample_rate` (16 kHz).
        hop: samples per code (320).
        sample_rate: the codec's rate; the extractor is fixed at 16 kHz.

    Returns:
        (`input_values` `[1, 1, T * hop]`, `input_features` `[1, T, 160]`), `T = N // hop + 1`.

    Raises:
        CodecError: not a non-empty one-dimensional finite float waveform.
    """
    wav = np.asarray(waveform)
    if wav.ndim != 1 or wav.size == 0:
        raise CodecError(f"expected a non-empty mono waveform [N], got shape {wav.shape}")
    if not np.all(np.isfinite(wav)):
        raise CodecError("waveform holds NaN or infinite samples")
    padded = pad_clip(wav.astype(np.float32), hop)
    # Half a hop on each side centres the 25 ms / 10 ms fbank frames: 2 T frames -> T rows.
    feats = semantic_extractor()(np.pad(padded, (hop // 2, hop // 2)), sampling_rate=sample_rate,
                                 return_tensors="pt")["input_features"]  # [1, T, 160]
    n_codes = len(padded) // hop
    if feats.shape[1] != n_codes:
        raise CodecError(f"semantic features have {feats.shape[1]} frames for {n_codes} codes "
                         f"(hop {hop} is not X-codec2's 320?)")
    return torch.from_numpy(padded)[None, None], feats.float()
