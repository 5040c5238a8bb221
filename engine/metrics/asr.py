"""Speech recognisers for WER/CER: pocketsphinx's bundled English model by default, or a local
Hugging Face CTC (wav2vec2/HuBERT) or Whisper checkpoint directory. Nothing is downloaded."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from engine.hf import from_transformers
from engine.metrics.deps import require

SAMPLE_RATE = 16_000


class Recognizer(Protocol):
    """16 kHz mono float waveforms -> transcripts."""

    name: str

    def transcribe(self, waves: Sequence[np.ndarray]) -> list[str]: ...


class PocketSphinxASR:
    """CMU PocketSphinx 5 with its bundled US-English acoustic model, dictionary and 3-gram LM.

    A 2000s-era HMM recogniser: its error rates on clean read speech are several times those
    of a modern model; use it to see that eval works, not for numbers to publish.
    """

    name = "pocketsphinx (bundled en-us)"

    def __init__(self) -> None:
        pocketsphinx = require("pocketsphinx", "pocketsphinx", "quality", "the default ASR")
        self.decoder = pocketsphinx.Decoder(samprate=SAMPLE_RATE, loglevel="FATAL")

    def transcribe(self, waves: Sequence[np.ndarray]) -> list[str]:
        out = []
        for wave in waves:
            pcm = np.round(np.clip(wave, -1, 1) * 32767).astype(np.int16).tobytes()
            self.decoder.start_utt()
            self.decoder.process_raw(pcm, full_utt=True)
            self.decoder.end_utt()
            hyp = self.decoder.hyp()
            out.append(hyp.hypstr if hyp is not None else "")
        return out


class HFASR:
    """A local transformers checkpoint (CTC such as HuBERT-large/wav2vec2, or Whisper) through
    the `automatic-speech-recognition` pipeline.

    Args:
        path: directory with config, weights, tokenizer/processor files.
        device: `cpu`, `cuda`, `cuda:N`.
        batch_size: clips per forward.
    """

    def __init__(self, path: str | Path, device: str = "cpu", batch_size: int = 8) -> None:
        pipeline = from_transformers("pipeline")

        path = Path(path)
        if not (path / "config.json").is_file():
            raise ValueError(f"ASR checkpoint {path} has no config.json: give a local directory "
                             "(e.g. a copy of facebook/hubert-large-ls960-ft or openai/whisper-large-v3)")
        self.model_type = json.loads((path / "config.json").read_text()).get("model_type", "?")
        self.name = f"{path.name} ({self.model_type})"
        self.batch_size = batch_size
        whisper = self.model_type == "whisper"
        # Whisper: 30 s windows (a row may be longer), transcribed as English, not translated
        self.pipe = pipeline("automatic-speech-recognition", model=str(path), device=device,
                             **({"chunk_length_s": 30, "ignore_warning": True} if whisper else {}))
        self.kwargs = {"generate_kwargs": {"language": "en", "task": "transcribe"}} if whisper else {}

    def transcribe(self, waves: Sequence[np.ndarray]) -> list[str]:
        inputs = [{"raw": np.asarray(w, dtype=np.float32), "sampling_rate": SAMPLE_RATE} for w in waves]
        outputs = self.pipe(inputs, batch_size=self.batch_size, **self.kwargs)
        return [o["text"].strip() for o in outputs]


def load_asr(spec: str | None, device: str = "cpu") -> Recognizer | None:
    """`pocketsphinx` (default), `none`, or a local checkpoint directory."""
    if spec is None or spec == "pocketsphinx":
        return PocketSphinxASR()
    if spec == "none":
        return None
    if not Path(spec).is_dir():
        raise ValueError(f"--asr {spec}: not 'pocketsphinx', 'none' or a local checkpoint directory")
    return HFASR(spec, device=device)
