"""The row record: one manifest row on its way through a worker's stages, and its shard's task.

The prepare stage makes a `Row` once; every later stage fills in its own part of it, and no
stage copies a row into a container of its own:

    read     ManifestRow | RowError             what the manifest says (io/manifest.py)
    prepare  Row: result (id, text, seed), settings, voice prompt, provenance, its text
             normalised and planned; a long text's chunks as rows of their own (`parts`); a bad
             manifest row is a Row whose result carries the error
    decode   Attempt: codes, finish reason, statistics (one Attempt per decode of the row, or
             of each of its parts)
    codec    Attempt.wave: its audio as it will be written
    verify   Attempt.scores; the row (or part) keeps an attempt, is rejected, or is decoded again
    write    Row.kept (or the rejected row) into its shard's files; a split row's parts joined
             into one row, or written as rows of their own

What is decoded is a row's `units()`: the row itself, or its parts when its text was split. A
part is a `Row` whose `parent` is the manifest row; it shares the parent's settings and voice
prompt, has its own text (the chunk's), seed (`engine.text.chunks.chunk_seeds`) and attempts,
and settles on its own; the shard is written once every unit of every row has settled. A part's
attempt that ends without a speech code is decoded again (`Row.retry`, `text.chunk_retries`)
before anything looks at it: one chunk lost would lose the whole row.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from engine.config import DecodingSettings
from engine.records import AttemptScores, RowStats, SynthesisResult, attempt_seed, retry_seed
from engine.text.chunks import TextPlan


@dataclass(eq=False)
class Attempt:
    """One decode of a row: its seed, what the decoder made, its audio and its scores.

    Attributes:
        row: the row it decodes.
        number: 1 for a row's first decode; the quality gate's regenerations and best-of
            candidates count on (`attempt_seed(row.seed, number)` is its seed).
        seed: the seed it was decoded with.
        retry: 0 for the attempt's first decode; k for its k-th decode again after it ended
            without a speech code (`Row.retry`; seed `retry_seed(row.seed, number, k)`).
        codes, finish_reason, stats: the decoder's output (stats: the work it cost).
        wave: its audio as it will be written (codec stage), until the row is written.
        error: why it has no audio (the codec refused its codes) or could not be checked.
        scores: what the quality gate measured (None without the gate).
    """

    row: Row
    number: int
    seed: int
    retry: int = 0
    codes: list[int] = field(default_factory=list)
    finish_reason: str = "error"
    stats: RowStats | None = None
    wave: np.ndarray | None = None
    error: str | None = None
    scores: AttemptScores | None = None


@dataclass(eq=False)
class Row:
    """One manifest row in a worker, from its prepare stage to its write stage.

    Attributes:
        index: its position in the shard (rows are written in manifest order).
        result: id, text, the row's seed; once an attempt is kept, its codes, finish reason,
            statistics and seed (the chosen one); `error` for a row that cannot be decoded.
        settings: the job's decoding settings with the row's own applied.
        origin: provenance (text id, prompt id, augmentation seed, model revisions).
        prompt: its voice prompt (transcript + codes), None without one.
        voice: a named voice of the model (the manifest's `voice`), None without one.
        prompt_wave: the prompt's clip (at the codec's rate) when it was given as audio: the speaker check's
            reference (a prompt given as codes is decoded for it).
        task: the shard it belongs to in this worker.
        seed: its own seed (the first attempt's).
        attempts: its decodes, in the order they were made.
        kept: the attempt whose audio is written (None: an error row).
        settled: nothing more happens to it before it is written (kept, rejected or failed).
        normalized: its text normalised (`text.normalize`; None: not normalised).
        plan: how its text is decoded (None: as it is).
        parts: its chunks' rows, when its text was split (else empty).
        parent: the manifest row a part belongs to (None: a manifest row).
        segment: a part's index among its parent's.
        prompt_audio: how a voice prompt's audio enters this row's audio, where not as the
            job's `output.prompt_audio` (a joined row's later parts: as context, since only the
            joined clip's start includes it).
        chunk_retries: how many times an attempt that ends without a speech code is decoded
            again (`text.chunk_retries` for a part; 0 for a manifest row).
        retried: the attempts that ended without a speech code and were decoded again (each
            replaced in `attempts` by its next decode; their statistics still count as work).
    """

    index: int
    result: SynthesisResult
    settings: DecodingSettings
    origin: dict
    prompt: object | None = None  # codec.prompts.VoicePrompt
    voice: str | None = None
    prompt_wave: np.ndarray | None = None
    task: ShardTask | None = None
    seed: int = 0
    attempts: list[Attempt] = field(default_factory=list)
    kept: Attempt | None = None
    settled: bool = False
    normalized: str | None = None
    plan: TextPlan | None = None
    parts: list[Row] = field(default_factory=list)
    parent: Row | None = None
    segment: int | None = None
    prompt_audio: str | None = None
    chunk_retries: int = 0
    retried: list[Attempt] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.result.id

    @property
    def text(self) -> str:
        return self.result.text

    @property
    def spoken(self) -> str:
        """What the model reads (and the quality gate's ASR is compared with): the normalised
        text, else the text (a part's: its chunk of the parent's)."""
        return self.normalized if self.normalized is not None else self.text

    @property
    def to_decode(self) -> bool:
        """Not already an error row (a bad manifest row, settings or voice prompt)."""
        return self.result.error is None

    def units(self) -> list[Row]:
        """What is decoded for it: its parts, else itself."""
        return self.parts or [self]

    def attempt(self, number: int) -> Attempt:
        """A new attempt of this row (recorded in `attempts`)."""
        made = Attempt(self, number, attempt_seed(self.seed, number))
        self.attempts.append(made)
        return made

    def retry(self, attempt: Attempt) -> Attempt | None:
        """`attempt`'s next decode when it ended without a speech code and has retries left (it
        takes the attempt's place in `attempts`, so the quality gate numbers and chooses among
        attempts as before); None otherwise (an attempt the decoder refused has its `error`: no
        seed changes that)."""
        if attempt.codes or attempt.error is not None or attempt.retry >= self.chunk_retries:
            return None
        retry = attempt.retry + 1
        again = Attempt(self, attempt.number, retry_seed(self.seed, attempt.number, retry), retry)
        self.attempts[self.attempts.index(attempt)] = again
        self.retried.append(attempt)
        return again

    def keep(self, attempt: Attempt) -> None:
        """Make `attempt` the one written: its codes, finish reason, statistics and seed become
        the row's result (an attempt without codes leaves the row an error row)."""
        self.kept, self.settled = attempt, True
        res = self.result
        res.codes, res.finish_reason, res.stats, res.seed = (attempt.codes, attempt.finish_reason,
                                                            attempt.stats, attempt.seed)
        if not attempt.codes and attempt.finish_reason == "error":
            res.error = attempt.error
        for other in self.attempts:  # only the kept audio waits for the writer
            if other is not attempt:
                other.wave = None

    def fail(self, why: str) -> None:
        """Make it an error row (no audio is written; its attempts' statistics still count)."""
        self.result.error, self.kept, self.settled = why, None, True
        for attempt in self.attempts:
            attempt.wave = None

    @property
    def rejected(self) -> bool:
        """The quality gate kept none of its attempts (of a split row: of a part's)."""
        if self.parts:
            return any(p.rejected for p in self.parts)
        return self.result.quality is not None and not self.result.quality.passed

    def work(self) -> list[RowStats]:
        """Statistics of every attempt decoded, decoded again ones included (what decoding the
        row, or its parts, cost)."""
        return [a.stats for unit in self.units() for a in (*unit.retried, *unit.attempts) if a.stats is not None]

    def retries(self) -> int:
        """Decodes again of its attempts (of a split row: of its parts') that ended without a
        speech code."""
        return sum(len(unit.retried) for unit in self.units())


@dataclass(eq=False)
class ShardTask:
    """A shard in the worker: its rows, how many are still on their way, and its future.

    Attributes:
        shard: the plan's shard (runtime.plan.Shard).
        attempt: which try of the shard this is (the pool retries failed shards).
        rows: one Row per manifest row, in manifest order.
        received: `time.perf_counter()` when the worker got it.
        remaining: units (rows, or parts of split rows) not yet settled (decoded, and checked
            when the gate is on).
        in_decoder: its attempts queued or decoding.
        decoded: when its last row settled.
        future: resolves to the commit record (or the error that failed the shard).
        codec_s, verify_s: seconds the codec and the quality gate spent on its rows.
        fence: the lease holder's fencing token its writes are checked against
            (`engine.io.lease.Fence`; None: writes unchecked, a shard written outside a job).
    """

    shard: object
    attempt: int
    rows: list[Row]
    received: float = field(default_factory=time.perf_counter)
    remaining: int = 0
    in_decoder: int = 0
    decoded: float | None = None
    future: Future = field(default_factory=Future)
    codec_s: float = 0.0
    verify_s: float = 0.0
    fence: object = None

    def __post_init__(self) -> None:
        for row in self.rows:
            row.task = self
            for part in row.parts:
                part.task = self

    def units(self) -> list[Row]:
        """What its rows are decoded as, in order: each row to decode, or its parts."""
        return [unit for row in self.rows if row.to_decode for unit in row.units()]

    @property
    def resolved(self) -> bool:
        """Committed or failed: rows of a failed shard still on their way are dropped."""
        return self.future.done()
