"""Word and character error rates (jiwer) after a light English normalisation."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from engine.metrics.deps import require


def normalize(text: str) -> str:
    """Lower case, NFKC, apostrophes kept inside words, other punctuation and hyphens -> spaces,
    single spaces. Numbers are not spelled out: references should be normalised text (LibriTTS
    test-clean's are)."""
    text = unicodedata.normalize("NFKC", text).lower().replace("\u2019", "'")
    text = re.sub(r"[^\w\s']|_", " ", text)
    text = re.sub(r"(?<!\w)'|'(?!\w)", " ", text)  # quotes, not contractions
    return " ".join(text.split())


@dataclass
class EditCounts:
    """Edits of one hypothesis against one reference, words and characters."""

    word_errors: int
    ref_words: int
    char_errors: int
    ref_chars: int

    @property
    def wer(self) -> float:
        return self.word_errors / self.ref_words if self.ref_words else float(self.word_errors > 0)

    @property
    def cer(self) -> float:
        return self.char_errors / self.ref_chars if self.ref_chars else float(self.char_errors > 0)


def _edits(output) -> int:
    return output.substitutions + output.deletions + output.insertions


def edit_counts(reference: str, hypothesis: str) -> EditCounts:
    """Word/character edits of `hypothesis` against `reference`, both normalised first.

    An empty hypothesis counts every reference word as deleted.
    """
    jiwer = require("jiwer", "jiwer", "quality", "WER/CER")
    ref, hyp = normalize(reference), normalize(hypothesis)
    if not ref:
        return EditCounts(len(hyp.split()), 0, len(hyp), 0)
    if not hyp:
        return EditCounts(len(ref.split()), len(ref.split()), len(ref), len(ref))
    words = jiwer.process_words(ref, hyp)
    chars = jiwer.process_characters(ref, hyp)
    return EditCounts(_edits(words), len(ref.split()), _edits(chars), len(ref))


def corpus_rates(counts: list[EditCounts]) -> dict[str, float | None]:
    """Corpus WER/CER (all edits over all reference units, in percent, as TTS papers report)
    and the mean of per-utterance rates."""
    if not counts:
        return {"wer": None, "cer": None, "wer_utt_mean": None, "cer_utt_mean": None}
    words = sum(c.ref_words for c in counts)
    chars = sum(c.ref_chars for c in counts)
    return {
        "wer": 100.0 * sum(c.word_errors for c in counts) / max(words, 1),
        "cer": 100.0 * sum(c.char_errors for c in counts) / max(chars, 1),
        "wer_utt_mean": 100.0 * sum(c.wer for c in counts) / len(counts),
        "cer_utt_mean": 100.0 * sum(c.cer for c in counts) / len(counts),
    }
