"""Decode: attempts of rows -> their speech codes, in ONE continuously batched decode session.

Every shard a worker holds feeds the same session (`api.DecodeSession`): a row of the next shard
takes the slot a row of the current one just left, rows with other sampling settings, seeds or
budgets share the batch, and rows of other structural settings (another gamma, no draft) decode
in a batch of their own beside it (`decoding/scheduler.py`). A regeneration (the quality
gate's next attempt of a row) is queued ahead of every row waiting for a slot. Runs on the
worker's decode thread only (`runtime/stream.py`).
"""

from __future__ import annotations

from engine.api import DecodeSession, Synthesizer
from engine.decoding.scheduler import DecodeScheduler
from engine.runtime.stages.row import Attempt


class DecodeStage:
    """Attempts in, the same attempts out with their codes, finish reason and statistics.

    Args:
        synth: the worker's synthesizer (its prompter builds each attempt's request).
        session: the decode session every held shard's rows share.
    """

    def __init__(self, synth: Synthesizer, session: DecodeSession) -> None:
        self.synth, self.session = synth, session

    @property
    def idle(self) -> bool:
        """Every attempt submitted has been returned by `step`."""
        return self.session.idle

    @property
    def scheduler(self) -> DecodeScheduler:
        return self.session.scheduler

    def submit(self, attempts: list[Attempt], ahead: bool = False) -> list[Attempt]:
        """Queue attempts (all of one submission: a shard's rows, or regenerations `ahead` of the
        rows queued before them); returns those that cannot be decoded, with their `error` (a
        text or voice prompt the prompter refuses, a prompt that fills the context)."""
        pairs, refused = [], []
        for attempt in attempts:
            row = attempt.row
            prompt = row.prompt
            try:
                request = self.synth.request(row.spoken, row.settings, attempt.seed, attempt,
                                             prompt.text if prompt else None,
                                             list(prompt.codes) if prompt else None, row.voice)
            except ValueError as exc:
                attempt.error = str(exc)
                refused.append(attempt)
                continue
            pairs.append((row.settings, request))
        if pairs:
            self.session.submit(pairs, ahead=ahead)
        return refused

    def step(self) -> list[Attempt]:
        """One decode round; the attempts that finished in it, their output filled in."""
        done = []
        for request, out in self.session.step():
            attempt: Attempt = request.key
            attempt.codes, attempt.finish_reason, attempt.stats = out.codes, out.finish_reason, out.stats
            done.append(attempt)
        return done

    def reset(self) -> None:
        """Drop every attempt queued or decoding (a failed round left the batch in doubt)."""
        self.session.reset()
