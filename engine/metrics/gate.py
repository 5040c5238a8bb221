"""The quality gate's checks on one decoded row, and its decision among a row's attempts.

A row's audio is scored with the metrics `pcg-synth eval` reports (asr.py, text.py, speaker.py),
so the cer a row gets here is the cer eval would give it, then held against the bounds of the
job's `quality` section. Used by the job worker's verify stage (`runtime/stages/verify.py`) and
by `Synthesizer.synthesize(..., quality=...)`.

The decision: with `attempts`, a row that fails is decoded again until one attempt passes or its
attempts are spent; with `best_of`, its candidates are all decoded and scored first. The attempt
kept is the best by `rank` (passing first, then the lowest CER, else WER, then the highest
speaker similarity, then the earliest): the passing one, or, for a row that never passed, the
best of its failures (written to the rejects).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.codec.audio import resample
from engine.config import QualitySpec
from engine.metrics.asr import Recognizer, load_asr
from engine.metrics.speaker import SpeakerEncoder, cosine, load_speaker
from engine.metrics.text import edit_counts, normalize
from engine.records import AttemptScores, QualityVerdict

SAMPLE_RATE = 16_000  # what the verifiers hear (the ASR and speaker models take 16 kHz audio)
BUNDLED = {"asr": "pocketsphinx", "speaker": "resemblyzer"}


@dataclass(frozen=True)
class AttemptInput:
    """What `QualityGate.score` judges of one attempt at one row.

    Attributes:
        text: the row's text.
        wave: its speech at `SAMPLE_RATE` (`heard`; a voice prompt's audio left out); None: it
            has no audio (`no_audio` says why), which fails the attempt.
        finish_reason: `eos` or `length`.
        attempt, seed: which attempt it is.
        prompt, prompt_wave: the row's voice prompt and its clip (at the codec's rate), if any.
        hypothesis: the ASR's transcript of `wave` (`transcribe`).
        no_audio: why `wave` is None.
    """

    text: str
    wave: np.ndarray | None
    finish_reason: str
    attempt: int
    seed: int
    prompt: object = None
    prompt_wave: np.ndarray | None = None
    hypothesis: str | None = None
    no_audio: str | None = None


class VerifierLost(RuntimeError):
    """The verifiers stopped answering (their process died): the fault of no clip, so the rows
    being checked are not failed for it (their shards are redone)."""


def rank(scores: AttemptScores) -> tuple:
    """The gate's score of an attempt, lowest best: passing every check first, then the lowest
    CER (else WER), then the highest speaker similarity, then the earliest attempt."""
    errors = scores.cer if scores.cer is not None else scores.wer
    return (not scores.passed, errors if errors is not None else 0.0,
            -(scores.speaker_similarity if scores.speaker_similarity is not None else 0.0), scores.attempt)


def verifier_dir(ref: str, storage=None) -> Path:
    """A local directory holding the verifier checkpoint `ref` (a directory, an object-store URI
    fetched to the cache, or a Hub model from its cache).

    Raises:
        ValueError: nothing there (`engine.io.storage.StorageError` is a RuntimeError: converted).
    """
    from engine.io.storage import Storage, StorageError

    try:
        path = (storage or Storage()).local_dir(ref)
    except StorageError as exc:
        raise ValueError(str(exc)) from None
    if not (path / "config.json").is_file():
        raise ValueError(f"no checkpoint at {ref} (config.json missing)")
    return path


class QualityGate:
    """Scores decoded rows against their text and voice prompt, and decides what to keep.

    Args:
        spec: the checks and the regeneration policy.
        asr: the recogniser (None: no transcript, no cer/wer).
        speaker: the speaker encoder (None: no similarity).
        codec: decodes codes to audio (`audio`) and voice prompts given as codes (their reference).
    """

    def __init__(self, spec: QualitySpec, asr: Recognizer | None = None, speaker: SpeakerEncoder | None = None,
                 codec=None) -> None:
        self.spec, self.asr, self.speaker, self.codec = spec, asr, speaker, codec
        self._references: dict[str, np.ndarray] = {}  # voice prompt id -> its speaker embedding

    @classmethod
    def load(cls, spec: QualitySpec, codec=None, device: str = "cpu", storage=None) -> QualityGate:
        """The gate with the verifiers `spec` names: the bundled ones, or checkpoints given as a
        local directory, an object-store URI (fetched once to the cache) or a Hub model (from the
        Hugging Face cache), loaded on `device`.

        Raises:
            ValueError: a verifier that is not there, or a backend that is not installed.
        """
        asr_ref, speaker_ref = spec.asr_model, spec.speaker_model
        asr = speaker = None
        if asr_ref is not None:
            asr = load_asr(asr_ref if asr_ref == BUNDLED["asr"] else str(verifier_dir(asr_ref, storage)), device)
        if speaker_ref is not None:
            local = speaker_ref if speaker_ref == BUNDLED["speaker"] else str(verifier_dir(speaker_ref, storage))
            speaker = load_speaker(local, device)
        return cls(spec, asr, speaker, codec)

    @property
    def candidates(self) -> int:
        """Attempts a row starts with (best_of), else 1."""
        return self.spec.candidates

    def describe(self) -> dict:
        return {"asr": getattr(self.asr, "name", None), "speaker": getattr(self.speaker, "name", None),
                "checks": self.spec.checks}

    def heard(self, wave: np.ndarray) -> np.ndarray:
        """A waveform at the codec's rate as the verifiers hear it: at `SAMPLE_RATE` (a 24 kHz
        codec's audio is resampled; without a codec, waves are taken to be at that rate)."""
        rate = self.codec.sample_rate if self.codec is not None else SAMPLE_RATE
        return resample(wave, rate, SAMPLE_RATE)

    def audio(self, codes: Sequence[int]) -> np.ndarray:
        """The audio of `codes` alone (as `export_audio` writes a row by default: a voice
        prompt's audio stripped), as the verifiers hear it (`heard`).

        Raises:
            CodecError: codes the codec cannot take.
        """
        from engine.codec.export import decode_waves

        wave = decode_waves(self.codec, [codes], [None])[0]
        if isinstance(wave, Exception):
            raise wave
        return self.heard(wave)

    def transcribe(self, waves: Sequence[np.ndarray]) -> list[str | Exception]:
        """The ASR's transcripts (all at once; after a failure, one clip at a time, so a clip that
        makes the ASR raise fails alone: its exception in its place)."""
        if self.asr is None:
            return [""] * len(waves)
        try:
            return list(self.asr.transcribe(list(waves)))
        except VerifierLost:
            raise
        except Exception:  # noqa: BLE001 - retried clip by clip below, each failure kept
            pass
        out: list[str | Exception] = []
        for wave in waves:
            try:
                out.append(self.asr.transcribe([wave])[0])
            except VerifierLost:
                raise
            except Exception as exc:  # noqa: BLE001 - that clip's error record
                out.append(exc)
        return out

    def reference(self, prompt, prompt_wave: np.ndarray | None) -> np.ndarray | None:
        """The speaker embedding of a voice prompt (its clip, else its codes decoded), once per
        prompt; None without a speaker encoder or a prompt."""
        if self.speaker is None or prompt is None:
            return None
        if prompt.id not in self._references:
            wave = self.heard(prompt_wave) if prompt_wave is not None else self.audio(prompt.codes)
            self._references[prompt.id] = self.speaker.embed(wave)
        return self._references[prompt.id]

    def score(self, row: AttemptInput) -> AttemptScores:
        """One attempt's scores and the checks it failed (`row`: the attempt, its audio and
        transcript)."""
        text, wave, finish_reason, attempt, seed = row.text, row.wave, row.finish_reason, row.attempt, row.seed
        prompt, prompt_wave, hypothesis, no_audio = row.prompt, row.prompt_wave, row.hypothesis, row.no_audio
        if wave is None:
            return AttemptScores(attempt, seed, finish_reason, 0.0, failed=[f"no audio ({no_audio})"])
        duration = len(wave) / SAMPLE_RATE
        chars = len(normalize(text))
        out = AttemptScores(attempt, seed, finish_reason, round(duration, 4),
                            speaking_rate=round(chars / duration, 4) if duration > 0 else None)
        if self.asr is not None:
            counts = edit_counts(text, hypothesis or "")
            out.hypothesis, out.cer, out.wer = hypothesis or "", round(counts.cer, 6), round(counts.wer, 6)
        reference = self.reference(prompt, prompt_wave)
        if reference is not None:
            out.speaker_similarity = round(cosine(self.speaker.embed(wave), reference), 6)
        out.failed = self.failed(out)
        return out

    def failed(self, s: AttemptScores) -> list[str]:
        """The checks `s` fails, each as `name value bound`."""
        q, out = self.spec, []
        for name, value, bound, low in (("cer", s.cer, q.max_cer, False), ("wer", s.wer, q.max_wer, False),
                                        ("speaker_similarity", s.speaker_similarity, q.min_speaker_similarity, True),
                                        ("duration", s.duration, q.min_duration_s, True),
                                        ("duration", s.duration, q.max_duration_s, False),
                                        ("speaking_rate", s.speaking_rate, q.min_chars_per_s, True),
                                        ("speaking_rate", s.speaking_rate, q.max_chars_per_s, False)):
            if bound is None or (value is None and name == "speaker_similarity"):  # no prompt: not checked
                continue
            if value is None:
                if f"{name} unknown (no speech)" not in out:  # once, for both of its bounds
                    out.append(f"{name} unknown (no speech)")
            elif (value < bound) if low else (value > bound):
                out.append(f"{name} {value:g} {'<' if low else '>'} {bound:g}")
        if q.reject_truncated and s.finish_reason == "length":
            out.append("truncated (finish reason length)")
        return out

    def verdict(self, scored: list[AttemptScores]) -> QualityVerdict | None:
        """The decision on a row whose attempts so far are all `scored`: the attempt kept and
        whether it passed, or None when it is to be decoded again (it failed and has attempts
        left)."""
        if not scored[-1].passed and len(scored) < self.spec.attempts:
            return None
        best = min(range(len(scored)), key=lambda i: rank(scored[i]))
        return QualityVerdict(list(scored), best, scored[best].passed)
