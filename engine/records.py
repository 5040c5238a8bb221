"""The records every layer passes around: items in, results and statistics out.

Plain dataclasses with no dependencies beyond the standard library (no torch), so manifests,
datasets, voice prompts and job summaries can use them without loading the decoding stack.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field

from engine.knobs import KNOB_NAMES

FAILED_EXAMPLES = 5  # failed rows named (id and error) in a shard's commit record and in a job's summary


@dataclass
class RowStats:
    """What one row's decoding did.

    Attributes:
        rounds: decode-phase target forwards (draft+verify rounds, or `ar` steps).
        emitted: tokens produced by those rounds before truncation (accepted + 1 per round).
        reached: `[gamma]` rounds in which draft position i was judged (all before it accepted).
        accepted: `[gamma]` rounds in which draft position i was accepted.
        thinning_trials: PCG thinning trials spent on recovered tokens.
        fallbacks: PCG recovered tokens that needed the exact dense residual.
        prompt_tokens: prompt length.
        generated_tokens: tokens committed after the prompt (end-of-speech included).
    """

    rounds: int = 0
    emitted: int = 0
    reached: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    thinning_trials: int = 0
    fallbacks: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0

    @property
    def drafted(self) -> int:
        return sum(self.reached)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per target call in the decode phase, bonus/recovered token included."""
        return self.emitted / self.rounds if self.rounds else 0.0

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / r if r else 0.0 for a, r in zip(self.accepted, self.reached)]

    def to_dict(self) -> dict:
        return {
            "rounds": self.rounds,
            "target_calls": self.rounds,
            "emitted": self.emitted,
            "drafted": self.drafted,
            "reached_per_position": list(self.reached),
            "accepted_per_position": list(self.accepted),
            "acceptance_per_position": [round(x, 6) for x in self.acceptance_per_position],
            "mean_accepted_length": round(self.mean_accepted_length, 6),
            "thinning_trials": self.thinning_trials,
            "fallbacks": self.fallbacks,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
        }


def aggregate(rows: list[RowStats]) -> RowStats:
    """Sum of several rows' statistics (per-position counts added position by position)."""
    total = RowStats()
    width = max((len(r.reached) for r in rows), default=0)
    total.reached, total.accepted = [0] * width, [0] * width
    for r in rows:
        total.rounds += r.rounds
        total.emitted += r.emitted
        total.thinning_trials += r.thinning_trials
        total.fallbacks += r.fallbacks
        total.prompt_tokens += r.prompt_tokens
        total.generated_tokens += r.generated_tokens
        for i, (reach, acc) in enumerate(zip(r.reached, r.accepted)):
            total.reached[i] += reach
            total.accepted[i] += acc
    return total


# Per-item sampling settings (the knobs, `engine.knobs.KNOBS`): an item may set any of these; they
# override the call's settings.
ITEM_SAMPLING_FIELDS = KNOB_NAMES


@dataclass
class SynthesisItem:
    """One utterance: text, optional voice prompt (transcript + codec codes), optional named
    voice (a speaker the model was trained on, e.g. Orpheus's `tara`), optional seed, and
    optional sampling settings of its own (None: the call's `DecodingSettings`)."""

    text: str
    id: str | None = None
    prompt_text: str | None = None
    prompt_codes: list[int] | None = None
    voice: str | None = None
    seed: int | None = None
    # one field per sampling knob (`ITEM_SAMPLING_FIELDS`), written out for the callers that build
    # items (a test holds them to the knobs)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None

    def overrides(self) -> dict:
        """The sampling settings this item sets."""
        return {k: getattr(self, k) for k in ITEM_SAMPLING_FIELDS if getattr(self, k) is not None}


@dataclass
class AttemptScores:
    """What the quality gate measured on one decode of a row, and the checks it failed.

    Attributes:
        attempt: the attempt's number (1: the row's first decode).
        seed: the seed it was decoded with.
        finish_reason: `eos`, or `length` (its speech reached the token limit).
        duration: seconds of speech checked (a voice prompt's audio left out).
        speaking_rate: characters of the row's normalised text per second of that speech.
        hypothesis, cer, wer: the ASR's transcript and its character and word error rates
            against the row's text, as fractions, both normalised as `pcg-synth eval` does
            (None without ASR).
        speaker_similarity: cosine of the speaker embeddings of the audio and of the row's
            voice prompt (None without a speaker check or without a voice prompt).
        failed: the checks it failed, as `name value bound` (`cer 0.62 > 0.01`); empty: passed.
    """

    attempt: int
    seed: int
    finish_reason: str
    duration: float
    speaking_rate: float | None = None
    hypothesis: str | None = None
    cer: float | None = None
    wer: float | None = None
    speaker_similarity: float | None = None
    failed: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failed


@dataclass
class QualityVerdict:
    """The quality gate's decision on a row: every attempt's scores, the one kept (written to
    the data, or to the rejects when none passed) and whether it passed."""

    attempts: list[AttemptScores]
    chosen: int  # index into `attempts`
    passed: bool

    @property
    def kept(self) -> AttemptScores:
        return self.attempts[self.chosen]

    @property
    def reason(self) -> str | None:
        """Why the row was rejected (None: it passed)."""
        if self.passed:
            return None
        tried = len(self.attempts)
        return (f"failed {tried} attempt{'s' * (tried != 1)}; attempt {self.kept.attempt} kept: "
                + ", ".join(self.kept.failed))


@dataclass
class SynthesisResult:
    """Codec codes (end-of-speech stripped; Llasa: X-codec2 codes `0..65535`; Orpheus: SNAC codes
    `0..4095` in 7-code frames) and how they came about; `error` is set and
    `finish_reason == "error"` when the item could not be decoded. With texts prepared
    (`engine.text.items`): `normalized_text`, the text normalised (what the model read), and
    `chunks`, a long text's per-chunk records (its codes are theirs in order, `num_codes` each)."""

    id: str
    text: str
    seed: int
    codes: list[int] = field(default_factory=list)
    finish_reason: str = "error"
    error: str | None = None
    stats: RowStats | None = None
    quality: QualityVerdict | None = None  # the quality gate's decision (None: no gate)
    normalized_text: str | None = None  # the text normalised (None: normalisation off)
    chunks: list[dict] | None = None  # a split text's chunks (engine.text.join.chunk_records)

    @property
    def cut(self) -> bool:
        """Its speech reached the token limit (max_new_tokens or the context) before its end:
        the audio stops there."""
        return self.finish_reason == "length"

    def to_dict(self) -> dict:
        out = asdict(self)
        out["stats"] = self.stats.to_dict() if self.stats else None
        for name in ("normalized_text", "chunks"):  # only where texts were prepared
            if out[name] is None:
                del out[name]
        return out


@dataclass
class RunSummary:
    """Aggregate figures of one `synthesize` call."""

    method: str
    settings: dict
    items: int
    ok: int
    failed: int
    wall_s: float
    stats: RowStats
    gamma_choice: dict | None = None  # what `gamma: auto` decided, and why
    decode_rounds: int = 0  # decode rounds of the batch
    slot_rounds: int = 0  # rows active, summed over those rounds
    batch_size: int = 1
    cut: int = 0  # items that reached their token limit (max_new_tokens or the context) before end of speech
    quality: dict | None = None  # the quality gate's counts (passed, rejected, ...), None without one
    codes_per_second: float = 0.0  # the model family's (audio_seconds); 0: unknown
    drafter: str | None = None  # what proposed the drafts: "model", "streams"; None: no drafter ran (ar)

    @property
    def slot_utilisation(self) -> float:
        """Mean fraction of the batch's slots that held a row per decode round."""
        return self.slot_rounds / (self.decode_rounds * self.batch_size) if self.decode_rounds else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.stats.generated_tokens / self.wall_s if self.wall_s else 0.0

    def to_dict(self) -> dict:
        s = self.stats
        return {
            "method": self.method,
            "settings": self.settings,
            "items": self.items,
            "ok": self.ok,
            "failed": self.failed,
            "cut": self.cut,
            "wall_s": round(self.wall_s, 4),
            "generated_tokens": s.generated_tokens,
            "audio_seconds": round(s.generated_tokens / self.codes_per_second, 3) if self.codes_per_second else None,
            "codes_per_second": self.codes_per_second,
            "tokens_per_s": round(self.tokens_per_s, 3),
            "target_calls": s.rounds,
            "mean_accepted_length": round(s.mean_accepted_length, 4),
            "acceptance_per_position": [round(x, 4) for x in s.acceptance_per_position],
            "drafted": s.drafted,
            "thinning_trials": s.thinning_trials,
            "fallbacks": s.fallbacks,
            "slot_utilisation": round(self.slot_utilisation, 4),
            "gamma_choice": self.gamma_choice,
            "drafter": self.drafter,
            **({"quality": self.quality} if self.quality is not None else {}),
        }


def item_seed(job_seed: int, item_id: str) -> int:
    """A 63-bit seed from the job seed and the item's id: stable across batches and runs."""
    digest = hashlib.sha256(f"{job_seed}/{item_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def attempt_seed(seed: int, attempt: int) -> int:
    """The seed of a row's `attempt`-th decode (1, 2, ...: the quality gate's regenerations and
    best-of candidates): the row's own seed for the first, then a 63-bit seed derived from it and
    the attempt's number, the same in every run (a resumed job makes the same decisions)."""
    if attempt == 1:
        return seed
    digest = hashlib.sha256(f"{seed}/attempt/{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def retry_seed(seed: int, attempt: int, retry: int) -> int:
    """The seed of the `retry`-th decode again (1, 2, ...) of a row's `attempt`-th decode that
    ended without a speech code (`text.chunk_retries`): a 63-bit seed derived from the row's seed
    (a chunk's: derived from its row's and its index), the attempt's number and the retry's, apart
    from every `attempt_seed`, and the same in every run whatever the batch around it."""
    digest = hashlib.sha256(f"{seed}/attempt/{attempt}/retry/{retry}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
