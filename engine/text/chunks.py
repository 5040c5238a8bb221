"""Long texts: whether a text fits one decode, and the chunks it is cut into when it does not.

A row's speech must fit both its token budget (`max_new_tokens`) and the model's context
(the model family's, e.g. 2,048 tokens, prompt included). Its length is not known before
decoding, so it is estimated from the text the way the dry run and batch admission estimate it
(`engine.decoding.admission`: characters at 15 a second, the family's codes a second), with headroom
(`speech_budget`: `headroom` times the estimate, plus two seconds) for a voice that speaks more
slowly than the estimate. A text that does not fit is cut at sentence boundaries; a sentence
still too long at its clause boundaries; and a clause is cut between words only when its speech
does not fit even without the headroom's two seconds (`Budget.holds`), into the fewest pieces
that do, about equal in length. Cuts below clauses cost the most prosody (a chunk ends
mid-phrase), and where the two seconds take most of a small budget no piece of text fits with
them, so cutting into words would only make more chunks that still do not fit. Each chunk says
at which kind of boundary it ends.

Modes (`text.split`):
    auto       one chunk when the text fits; else sentences packed greedily into chunks
               that fit (a chunk may hold many sentences)
    sentences  every sentence its own chunk (a sentence too long still cut into clauses)
    none       one chunk, fitting or not (today's behaviour: the audio stops at the limit)
"""

from __future__ import annotations

import bisect
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from engine.config import SPLIT_MODES, SplitMode
from engine.decoding.admission import speech_budget, speech_seconds
from engine.records import SynthesisItem, item_seed
from engine.text.sentences import Span, clause_spans, sentence_spans, word_spans

Boundary = Literal["sentence", "clause", "word", "end"]
HEADROOM = 1.25  # a chunk's speech budget: this many times its estimated speaking time, plus 2 s


@dataclass(frozen=True)
class Budget:
    """How much speech one decode of a text may produce.

    Attributes:
        max_new_tokens: the row's token budget (speech codes).
        context: the model's context in tokens, prompt included (None: unbounded).
        prompt_tokens: the prompt's length for a chunk's text (its template, the text's
            tokens, the voice prompt's transcript and codes); None: 0. The prepare stage passes
            the length of the prompt the model will really see.
        headroom: the ratio `speech_budget` applies to the text's estimated speaking time.
        codes_per_second: the model family's.
    """

    max_new_tokens: int
    context: int | None = None
    prompt_tokens: Callable[[str], int] | None = None
    headroom: float = HEADROOM
    codes_per_second: float = field(kw_only=True)

    def room(self, text: str) -> int:
        """Speech codes a decode of `text` (outer whitespace stripped, as a chunk is) can produce at most."""
        if self.context is None:
            return self.max_new_tokens
        used = self.prompt_tokens(text.strip()) if self.prompt_tokens is not None else 0
        return min(self.max_new_tokens, self.context - used)

    def fits(self, text: str) -> bool:
        """`text`'s speech (outer whitespace stripped, as a chunk is), with headroom, fits one decode."""
        return speech_budget(text.strip(), self.headroom, self.codes_per_second) <= self.room(text)

    def holds(self, text: str) -> bool:
        """`text`'s estimated speech, `headroom` times over but without the two seconds
        (outer whitespace stripped), fits one decode: a clause that holds is not cut between
        words. The two seconds are a fixed allowance, most of a small budget (all but 20 codes
        of 120): kept for cutting between words, they cut a 21-character sentence into words
        that still do not fit."""
        return self.headroom * speech_seconds(text.strip()) * self.codes_per_second <= self.room(text)

    def cuttable(self) -> bool:
        """Whether cutting can make a piece fit: a one-letter text fits (a budget below the
        headroom's two seconds, e.g. a test's `max_new_tokens: 16`, leaves no room to cut into)."""
        return self.fits("a")


@dataclass(frozen=True)
class TextChunk:
    """A piece of a row's text, decoded on its own.

    Attributes:
        text: the piece, outer whitespace stripped.
        start, end: where it lies in the row's text (`text == row_text[start:end].strip()`).
        boundary: the kind of boundary it ends at: sentence, clause, word, or `end` (the text's).
    """

    text: str
    start: int
    end: int
    boundary: Boundary

    def to_dict(self) -> dict:
        return {"text": self.text, "start": self.start, "end": self.end, "boundary": self.boundary}


@dataclass(frozen=True)
class TextPlan:
    """How a row's text is decoded: `chunks` in order; `fits`: the whole text fits one decode."""

    chunks: tuple[TextChunk, ...]
    fits: bool

    @property
    def split(self) -> bool:
        return len(self.chunks) > 1

    @property
    def boundaries(self) -> list[str]:
        """The kinds of boundary the text was cut at, in order (empty when not split)."""
        return [c.boundary for c in self.chunks[:-1]]


def _pieces_of(text: str, span: Span, budget: Budget) -> list[tuple[Span, Boundary]]:
    """One sentence as pieces, with the boundary each ends at: the sentence itself where it fits,
    else its clauses (packed); a clause that does not even hold (`Budget.holds`) is cut between
    words (`_words`)."""
    start, end = span
    if budget.fits(text[start:end]):
        return [(span, "sentence")]
    out: list[tuple[Span, Boundary]] = []
    for clause in clause_spans(text, start, end):
        if budget.holds(text[slice(*clause)]):
            out.append((clause, "clause"))
        else:
            out.extend(_words(text, clause, budget))
            out[-1] = (out[-1][0], "clause")
    packed = _pack(text, out, budget.fits)
    packed[-1] = (packed[-1][0], "sentence")
    return packed


def _words(text: str, clause: Span, budget: Budget) -> list[tuple[Span, Boundary]]:
    """A clause cut between words into the fewest pieces that each hold (`Budget.holds`), cut
    where its running speaking time is nearest each equal share, so no piece is left at the edge
    of the budget while another is short (greedy pieces, where the equal cuts do not all hold)."""
    words = word_spans(text, *clause)
    fewest = _pack(text, [(w, "word") for w in words], budget.holds)
    if len(fewest) < 2:
        return fewest
    said, elapsed = [], 0.0  # speaking time up to each word's end
    for a, b in words:
        elapsed += speech_seconds(text[a:b])
        said.append(elapsed)
    cuts = set()  # after which word: the one whose end is nearest each share
    for k in range(1, len(fewest)):
        share = k * elapsed / len(fewest)
        i = min(bisect.bisect_left(said, share), len(words) - 2)
        cuts.add(i - 1 if i > 0 and share - said[i - 1] < said[i] - share else i)
    bounds = [0, *(i + 1 for i in sorted(cuts)), len(words)]
    even = [((words[i][0], words[j - 1][1]), "word") for i, j in zip(bounds, bounds[1:])]
    if len(even) == len(fewest) and all(budget.holds(text[slice(*piece)]) for piece, _ in even):
        return even
    return fewest


def _pack(text: str, pieces: Sequence[tuple[Span, Boundary]], fits: Callable[[str], bool]
          ) -> list[tuple[Span, Boundary]]:
    """Consecutive pieces joined greedily while the joined text `fits` (a piece that does not
    fit alone stays alone: nothing smaller is left to cut)."""
    out: list[tuple[Span, Boundary]] = []
    for span, kind in pieces:
        if out and fits(text[out[-1][0][0]:span[1]]):
            out[-1] = ((out[-1][0][0], span[1]), kind)
        else:
            out.append((span, kind))
    return out


def _chunk(text: str, span: Span, boundary: Boundary) -> TextChunk:
    start, end = span
    piece = text[start:end]
    lead = len(piece) - len(piece.lstrip())
    return TextChunk(piece.strip(), start + lead, start + len(piece.rstrip()), boundary)


def plan_text(text: str, budget: Budget, mode: SplitMode = "auto", language: str = "en") -> TextPlan:
    """The chunks `text` is decoded as under `mode` (see the module docstring).

    Args:
        text: the row's text (normalised, when normalisation is on: what the model reads).
        budget: the row's budget and the model's context.
        mode: auto, sentences or none.
        language: the language of the sentence rules (pysbd's codes).

    Raises:
        ValueError: an unknown mode or sentence language, or a text with nothing to say.
    """
    if mode not in SPLIT_MODES:
        raise ValueError(f"text.split must be one of {', '.join(SPLIT_MODES)}; got {mode!r}")
    if not text.strip():
        raise ValueError("text is empty")
    fits = budget.fits(text.strip())
    if not budget.cuttable():  # no piece would fit: auto keeps the text whole, sentences only cut sentences
        mode = "none" if mode == "auto" else mode
        budget = Budget(max_new_tokens=sys.maxsize, codes_per_second=budget.codes_per_second)
    if mode == "none" or (mode == "auto" and fits):
        return whole_plan(text, fits)
    pieces: list[tuple[Span, Boundary]] = []
    for sentence in sentence_spans(text, language):
        pieces.extend(_pieces_of(text, sentence, budget))
    if not pieces:  # nothing pysbd calls a sentence (symbols only): the text as it is
        return whole_plan(text, fits)
    if mode == "auto":
        pieces = _pack(text, pieces, budget.fits)
    chunks = [_chunk(text, span, kind) for span, kind in pieces]
    chunks[-1] = replace(chunks[-1], boundary="end")
    return TextPlan(tuple(chunks), fits)


def whole_plan(text: str, fits: bool) -> TextPlan:
    """`text` decoded as it is, in one chunk (`fits`: whether it fits one decode)."""
    return TextPlan((_chunk(text, (0, len(text)), "end"),), fits)


def chunk_seeds(row_seed: int, count: int) -> list[int]:
    """Each chunk's sampling seed, derived from the row's (`item_seed` of the row seed and the
    chunk's index): stable across batches and runs. A row of one chunk keeps its own seed, so a
    text that fits decodes exactly as it would unsplit."""
    return [row_seed] if count == 1 else [item_seed(row_seed, f"chunk/{i}") for i in range(count)]


def chunk_id(row_id: str, index: int) -> str:
    """The id of a row's chunk (`split_output: rows` writes it as the chunk row's id)."""
    return f"{row_id}#{index:04d}"


def chunk_items(item: SynthesisItem, plan: TextPlan, job_seed: int) -> list[SynthesisItem]:
    """The items a row is decoded as: one per chunk, each with the row's voice prompt and
    sampling settings, the chunk's text and seed, and id `chunk_id(row id, index)` (a row of
    one chunk is returned as it is).

    Args:
        item: the row (its `seed` None: derived from `job_seed` and its id, as the decoder does).
        plan: `plan_text` of the row's text.
        job_seed: `decoding.seed`.
    """
    if not plan.split:
        return [item]
    row_seed = item.seed if item.seed is not None else item_seed(job_seed, item.id)
    seeds = chunk_seeds(row_seed, len(plan.chunks))
    return [replace(item, text=c.text, id=chunk_id(item.id, i), seed=s)
            for i, (c, s) in enumerate(zip(plan.chunks, seeds))]
