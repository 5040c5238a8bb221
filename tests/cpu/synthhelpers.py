"""Helpers shared by the Synthesizer tests: eight texts of different lengths, results by id."""

from __future__ import annotations

TEXTS = [
    "Hi.",
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding lets a small draft model propose tokens.",
    "Call Stella.",
    "It was the best of times, it was the worst of times, it was the age of wisdom.",
    "Numbers like one, two, three.",
    "Hong Kong and Paris.",
    "How much wood would a woodchuck chuck if a woodchuck could chuck wood?",
]


def by_id(results) -> dict:
    """id -> (codes, finish reason, statistics) of each result."""
    return {r.id: (r.codes, r.finish_reason, r.stats.to_dict()) for r in results}
