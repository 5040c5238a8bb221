"""Text normalisation (`text.normalize`, `text.normalizer`): written forms such as numbers,
money and dates turned into the words a speaker says, before the text is tokenised.

Backends:
    rules  `engine.text.english`: regular expressions over the common written forms, the words
           from num2words (pure Python, installed with pcg-synth); English.
    nemo   NeMo's text normalisation (`nemo_text_processing`, the field's own tool: weighted
           finite-state grammars, many languages). Not installed by default: it needs pynini,
           whose wheels exist for Linux x86-64 only, about 650 MB of it, and a C compiler for
           one of its dependencies; its grammars are compiled on first use (cached under the
           pcg-synth cache).

A `TextNormalizer` caches its results per distinct text (least recently used, bounded), so a
corpus that repeats texts (an augmentation job crosses each text with many voices and seeds)
normalises each once per process.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from engine.config import check_normalizer

CACHE_SIZE = 65_536  # distinct texts kept per normaliser


class NormalizerUnavailable(ValueError):
    """The normaliser asked for cannot run here (a backend not installed, a language it lacks)."""


def _rules(language: str) -> Callable[[str], str]:
    from engine.text.english import normalize_english

    return normalize_english


def _nemo(language: str) -> Callable[[str], str]:
    try:
        from nemo_text_processing.text_normalization.normalize import Normalizer
    except ImportError:
        raise NormalizerUnavailable(
            "text.normalizer nemo needs NeMo's text normalisation: pip install nemo_text_processing "
            "(Linux x86-64; see docs/guides/long-texts-and-formats.md), or use text.normalizer rules"
        ) from None
    from engine.io.storage import cache_dir

    folder = cache_dir() / "nemo-text-normalization"
    folder.mkdir(parents=True, exist_ok=True)
    grammar = Normalizer(input_case="cased", lang=language, cache_dir=str(folder))
    return lambda text: grammar.normalize(text, verbose=False)


class TextNormalizer:
    """Normalises texts of one language with one backend; results cached per distinct text.

    Args:
        language: the texts' language (`text.normalize`).
        backend: rules or nemo (`text.normalizer`).
        cache_size: distinct texts whose results are kept.

    Raises:
        ValueError: an unknown backend or a language it lacks; `NormalizerUnavailable` when
            the backend is not installed.
    """

    def __init__(self, language: str, backend: str = "rules", cache_size: int = CACHE_SIZE) -> None:
        check_normalizer(language, backend)
        self.language, self.backend = language, backend
        self._normalize = lru_cache(maxsize=cache_size)((_rules if backend == "rules" else _nemo)(language))

    def __call__(self, text: str) -> str:
        """`text` normalised (an empty result keeps the text: nothing would be left to say)."""
        return self._normalize(text) or text

    def cache_info(self):
        """Hits, misses and size of the per-text cache (`functools.lru_cache`'s)."""
        return self._normalize.cache_info()


@lru_cache(maxsize=8)
def text_normalizer(language: str, backend: str = "rules") -> TextNormalizer:
    """The process's normaliser for (`language`, `backend`): a worker builds it (and NeMo
    compiles or loads its grammars) once and every shard shares its cache."""
    return TextNormalizer(language, backend)
