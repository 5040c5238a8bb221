"""Verify: attempts with their audio -> scores; each row kept, rejected, or decoded again (the
quality gate, `quality:` in the job spec; the checks themselves are `metrics/gate.py`).

Runs on the worker's verify thread, beside the decode loop, on a few finished attempts at a
time (the ASR transcribes them together). The ASR's transcript is compared with what the model
read: the normalised text where texts are normalised, a chunk's text for a part of a split row
(each part is checked, and decoded again, on its own). A row is decided once every attempt it has decoded is
scored: kept (it passed), rejected (it never passed: the best of its attempts goes to the
rejects), or given its next attempt, which the decode thread queues ahead of new rows. An
attempt the codec could not turn into audio fails its checks; an exception while checking one
makes its row an error record (the shard goes on).
"""

from __future__ import annotations

import time

import numpy as np

from engine.codec.base import Codec, samples
from engine.metrics.gate import AttemptInput, QualityGate, VerifierLost
from engine.runtime.stages.row import Attempt, Row


class VerifyStage:
    """Scores attempts and decides their rows.

    Args:
        gate: the checks and the verifiers.
        prompt_audio: `output.prompt_audio` (with `include`, the written audio starts with the
            voice prompt's, which is left out of the checks).
        codec: the worker's codec (how much audio a voice prompt's codes make).
    """

    def __init__(self, gate: QualityGate, prompt_audio: str, codec: Codec) -> None:
        self.gate, self.prompt_audio, self.codec = gate, prompt_audio, codec

    @property
    def candidates(self) -> int:
        """Attempts a row starts with (best_of), else 1."""
        return self.gate.candidates

    def speech(self, attempt: Attempt) -> np.ndarray:
        """The attempt's audio without a voice prompt's (the part its text is checked against), at
        the verifiers' rate (`QualityGate.heard`)."""
        prompt, wave = attempt.row.prompt, attempt.wave
        if (attempt.row.prompt_audio or self.prompt_audio) == "include" and prompt is not None:
            wave = wave[samples(self.codec, len(prompt.codes)):]
        return self.gate.heard(wave)

    def score(self, attempts: list[Attempt]) -> dict[Row, str]:
        """Fill in each attempt's scores; returns the rows whose check raised, with the error."""
        voiced = [a for a in attempts if a.wave is not None]
        hyps = dict(zip(map(id, voiced), self.gate.transcribe([self.speech(a) for a in voiced])))
        broken = {}
        for a in attempts:
            row = a.row
            try:
                hyp = hyps.get(id(a))
                if isinstance(hyp, Exception):
                    raise hyp
                a.scores = self.gate.score(AttemptInput(
                    row.spoken, self.speech(a) if a.wave is not None else None, a.finish_reason, a.number,
                    a.seed, row.prompt, row.prompt_wave, hypothesis=hyp, no_audio=a.error))
            except VerifierLost:  # no row's fault: the shards being checked are redone
                raise
            except Exception as exc:  # noqa: BLE001 - the row's error record, never the shard's failure
                broken[row] = f"quality check failed: {type(exc).__name__}: {exc}"
        return broken

    def __call__(self, attempts: list[Attempt]) -> tuple[list[Row], list[Attempt]]:
        """Score `attempts` (rows of resolved shards left out) and decide their rows: (rows now
        settled, next attempts to decode)."""
        attempts = [a for a in attempts if not a.row.settled and not a.row.task.resolved]
        start = time.perf_counter()
        broken = self.score(attempts)
        share = (time.perf_counter() - start) / max(len(attempts), 1)
        settled, again = [], []
        for row in dict.fromkeys(a.row for a in attempts):  # each row once, in order
            row.task.verify_s += share * sum(a.row is row for a in attempts)
            if row in broken:
                row.fail(broken[row])
                settled.append(row)
                continue
            if any(a.scores is None for a in row.attempts):
                continue  # best_of: candidates still decoding
            verdict = self.gate.verdict([a.scores for a in row.attempts])
            if verdict is None:
                again.append(row.attempt(len(row.attempts) + 1))
                continue
            row.result.quality = verdict
            row.keep(row.attempts[verdict.chosen])
            settled.append(row)
        return settled, again
