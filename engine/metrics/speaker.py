"""Speaker similarity: cosine between speaker embeddings of a clip and its voice prompt.

Backends: Resemblyzer's GE2E encoder on its bundled weights (default; `resemblyzer.py`), or a
local transformers x-vector checkpoint (`*ForXVector`, e.g. a copy of
microsoft/wavlm-base-plus-sv). The paper's Sim-O used a WavLM-large + ECAPA-TDNN verifier
(UniSpeech), which is neither: absolute values are comparable only within one backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from engine.hf import from_transformers

SAMPLE_RATE = 16_000


class SpeakerEncoder(Protocol):
    name: str

    def embed(self, wave: np.ndarray) -> np.ndarray: ...


class ResemblyzerSpeaker:
    """The default backend (weights from the `resemblyzer` wheel)."""

    name = "resemblyzer (bundled GE2E d-vector)"

    def __init__(self, device: str = "cpu") -> None:
        from engine.metrics.resemblyzer import ResemblyzerEncoder

        self.encoder = ResemblyzerEncoder(device=device)

    def embed(self, wave: np.ndarray) -> np.ndarray:
        return self.encoder.embed(wave)


class XVectorSpeaker:
    """A local transformers audio x-vector model (WavLM/wav2vec2/UniSpeechSat `ForXVector`)."""

    def __init__(self, path: str | Path, device: str = "cpu") -> None:
        AutoFeatureExtractor = from_transformers("AutoFeatureExtractor")
        AutoModelForAudioXVector = from_transformers("AutoModelForAudioXVector")

        path = Path(path)
        if not (path / "config.json").is_file():
            raise ValueError(f"speaker checkpoint {path} has no config.json: give a local directory "
                             "(e.g. a copy of microsoft/wavlm-base-plus-sv)")
        self.name = f"{path.name} (x-vector)"
        self.extractor = AutoFeatureExtractor.from_pretrained(str(path))
        self.model = AutoModelForAudioXVector.from_pretrained(str(path)).to(device).eval()
        self.device = device

    @torch.inference_mode()
    def embed(self, wave: np.ndarray) -> np.ndarray:
        inputs = self.extractor(np.asarray(wave, dtype=np.float32), sampling_rate=SAMPLE_RATE,
                                return_tensors="pt").to(self.device)
        emb = self.model(**inputs).embeddings[0].float()
        return (emb / emb.norm()).cpu().numpy()


def load_speaker(spec: str | None, device: str = "cpu") -> SpeakerEncoder | None:
    """`resemblyzer` (default), `none`, or a local x-vector checkpoint directory."""
    if spec is None or spec == "resemblyzer":
        return ResemblyzerSpeaker(device)
    if spec == "none":
        return None
    if not Path(spec).is_dir():
        raise ValueError(f"--speaker {spec}: not 'resemblyzer', 'none' or a local checkpoint directory")
    return XVectorSpeaker(spec, device)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two embeddings."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12))
