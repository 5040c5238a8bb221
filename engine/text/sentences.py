"""Where a text may be cut: sentence boundaries (pysbd), clause boundaries, word boundaries.

Sentences come from pysbd, a rule-based splitter that ships its rules (no data to download at
run time, unlike nltk's punkt) and knows abbreviations, decimals and initials ("Dr.", "$12.50",
"5 p.m." do not end a sentence). Clauses are cut after a comma, semicolon, colon or dash that
is followed by a space (and after their CJK forms); words at whitespace. Every function here
returns spans `(start, end)` into the text it was given, so a cut never changes a character.
"""

from __future__ import annotations

import re
from functools import lru_cache

from engine.config import SENTENCE_LANGUAGES

# a clause ends after , ; : or a dash standing between spaces, or after a CJK comma/semicolon/colon
_CLAUSE_END = re.compile(r"(?:[,;:](?=\s)|\s[\u2013\u2014-](?=\s)|[\uff0c\uff1b\uff1a\u3001])")
_WORD_END = re.compile(r"\S+\s*")

Span = tuple[int, int]


@lru_cache(maxsize=32)
def _segmenter(language: str):
    import pysbd

    return pysbd.Segmenter(language=language, clean=False, char_span=True)


def sentence_spans(text: str, language: str = "en") -> list[Span]:
    """The sentences of `text` as spans covering it from its first to its last non-space
    character (whitespace between sentences goes with the sentence before).

    Raises:
        ValueError: a language pysbd has no rules for.
    """
    if language not in SENTENCE_LANGUAGES:
        raise ValueError(f"no sentence rules for language {language!r}; known: {', '.join(SENTENCE_LANGUAGES)}")
    spans = [(s.start, s.end) for s in _segmenter(language).segment(text) if s.sent.strip()]
    return _covering(text, spans)


def clause_spans(text: str, start: int = 0, end: int | None = None) -> list[Span]:
    """`text[start:end]` cut after each clause boundary (spans cover the range)."""
    end = len(text) if end is None else end
    cuts = [m.end() for m in _CLAUSE_END.finditer(text, start, end) if m.end() < end]
    return _pieces(text, start, end, cuts)


def word_spans(text: str, start: int = 0, end: int | None = None) -> list[Span]:
    """`text[start:end]` cut after each word (whitespace goes with the word before); a text
    without spaces (Chinese, Japanese) is cut between characters."""
    end = len(text) if end is None else end
    words = [(m.start(), m.end()) for m in _WORD_END.finditer(text, start, end)]
    if len(words) <= 1:
        return [(i, i + 1) for i in range(start, end) if not text[i].isspace()] if end - start > 1 else [(start, end)]
    return _pieces(text, start, end, [w_end for _, w_end in words[:-1]])


def _pieces(text: str, start: int, end: int, cuts: list[int]) -> list[Span]:
    bounds = [start, *cuts, end]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if text[a:b].strip()]


def _covering(text: str, spans: list[Span]) -> list[Span]:
    """Spans stretched so they tile the text's stripped extent with no gap (pysbd leaves out
    the odd character between sentences, e.g. a newline)."""
    if not spans:
        return []
    stripped_start = len(text) - len(text.lstrip())
    out = []
    for i, (a, _) in enumerate(spans):
        b = spans[i + 1][0] if i + 1 < len(spans) else len(text.rstrip())
        out.append((stripped_start if i == 0 else a, b))
    return [(a, b) for a, b in out if b > a]
