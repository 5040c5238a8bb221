"""Which queued row takes a free slot: the order rows are admitted into a batch.

A batch decodes rows of different lengths; once the last rows of a job (or of a `synthesize`
call) are admitted it can only drain, and the drain lasts as long as the longest row admitted
last. Admitting the longest rows first leaves short rows for the end, so the batch stays full
until the last few rounds. How much that buys depends on how well the estimate below predicts
a row's length: where lengths follow the text it shortens the drain; where they do not, the
order is chance.

Lengths are not known before decoding; a speech LM's output length follows its text (a row's
audio lasts as long as its text takes to say), so the estimate is the text's speaking time at
the model family's codes per second, capped by the row's `max_new_tokens`. The order changes
which rows share a round, not a row's codes: a row is decoded independently of the rows beside
it (tested bit for bit in float64; in float32 a batch can move logits in the last bits).

Policies:
    longest_first  submissions (a job worker's shards, a call's items) in order; within one,
                   the highest estimate first, ties in arrival order (the default)
    arrival        first queued, first admitted
"""

from __future__ import annotations

import heapq
import itertools
import math
import unicodedata
from collections.abc import Callable, Iterable

CHARS_PER_SECOND = 15.0  # a typical speaking rate in letters (spaces and punctuation included)
SYLLABIC_WEIGHT = 3.0  # a CJK character is a syllable: said ~3x slower than a letter


def syllabic(ch: str) -> bool:
    """A character spoken as a whole syllable (CJK ideographs, kana, hangul)."""
    if ch.isascii():
        return False
    name = unicodedata.name(ch, "")
    return name.startswith(("CJK UNIFIED", "CJK COMPATIBILITY IDEOGRAPH", "HIRAGANA", "KATAKANA",
                            "HANGUL SYLLABLE"))


def speech_seconds(text: str, chars_per_second: float = CHARS_PER_SECOND) -> float:
    """Estimated speaking time of `text`: characters at `chars_per_second`, a CJK character
    counting `SYLLABIC_WEIGHT` characters."""
    weight = sum(SYLLABIC_WEIGHT if syllabic(ch) else 1.0 for ch in text)
    return weight / chars_per_second


SPEECH_MARGIN_S = 2.0  # `speech_budget`'s allowance beyond the scaled estimate (pauses, a slow voice)


def speech_budget(text: str, ratio: float, codes_per_second: float) -> int:
    """Codes a row may take under `decoding.max_speech_ratio`: `ratio` times its text's estimated
    speaking time, plus `SPEECH_MARGIN_S`, rounded up (at the model family's `codes_per_second`);
    a model that does not stop is cut there."""
    return math.ceil(round((ratio * speech_seconds(text) + SPEECH_MARGIN_S) * codes_per_second, 6))


def expected_tokens(text: str, max_new_tokens: int | None, codes_per_second: float) -> int:
    """Estimated speech codes a row generates: its text's speaking time at the model family's
    `codes_per_second`, at most its budget (None: uncapped, what saying the whole text takes)."""
    needed = round(speech_seconds(text) * codes_per_second)
    return needed if max_new_tokens is None else min(max_new_tokens, needed)


class AdmissionQueue:
    """Queued requests. Earlier submissions (`request.submission`, numbered by the synthesizer
    over all its decode sessions) first (a job worker submits a shard at a time, so
    shards keep their order and are committed as early as in arrival order); within one
    submission the highest `priority` first, in arrival order among equals (all equal: first
    in, first out).

    Longest first within a submission is what shortens it: the rows of one shard (or of one
    `synthesize` call) end soonest when the longest start first. Across submissions it would
    hold back the short rows of an older shard behind the long rows of newer ones, delaying
    that shard's commit and so the next shard's arrival.
    """

    def __init__(self) -> None:
        self.heap: list[tuple[int, int, int, object]] = []
        self.counter = itertools.count()

    def extend(self, requests: Iterable) -> None:
        """Queue requests (each knows its `submission` and `priority`)."""
        for r in requests:
            heapq.heappush(self.heap, (r.submission, -r.priority, next(self.counter), r))

    def pop(self, n: int) -> list:
        """The next `n` requests (fewer if fewer are queued)."""
        return [heapq.heappop(self.heap)[3] for _ in range(min(n, len(self.heap)))]

    def clear(self) -> None:
        self.heap.clear()

    def discard(self, drop: Callable[[object], bool]) -> int:
        """Remove the queued requests `drop` picks; returns how many."""
        kept = [entry for entry in self.heap if not drop(entry[3])]
        removed = len(self.heap) - len(kept)
        heapq.heapify(kept)
        self.heap = kept
        return removed

    def __len__(self) -> int:
        return len(self.heap)

    def __bool__(self) -> bool:
        return bool(self.heap)
