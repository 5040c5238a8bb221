"""A row's text as the decoder reads it: normalised (`text.normalize`), then planned
(`text.split`) as one decode or as chunks that each fit. A job's prepare stage, the Python API
and the dry run prepare texts here, so all three cut a text alike.

Whether a text fits depends on its prompt's length (`Budget`), which takes the tokenizer to
know. Most texts fit by far, so a `TextPlanner` first measures a text against a bound on its
prompt that needs no tokenizer (the template's tokens, measured once, plus one token per byte
of the texts, the most a byte-level BPE tokenizer makes, plus the voice prompt's codes): a text
that fits under the bound fits, and only the others are tokenised. Without a tokenizer (the dry
run) the prompt is estimated instead (`estimated_prompt`), so the dry run's counts are estimates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.config import TextSpec
from engine.decoding.admission import speech_budget
from engine.text.chunks import HEADROOM, Budget, TextPlan, plan_text, whole_plan
from engine.text.normalize import text_normalizer

# Prompt ids of (text, voice prompt's transcript, its codes, a named voice): a family's `Prompter.build`
PromptIds = Callable[[str, str | None, Sequence[int] | None, str | None], list[int]]
BOUND_SLACK = 8  # tokens a tokenizer may add beyond one per byte (a leading-space marker, a BOS)
ESTIMATED_TEMPLATE = 48  # the dry run's guess at a prompt's tokens besides the texts (a chat template's)
CHARS_PER_TOKEN = 4  # the dry run's guess at characters of English text per token


@dataclass(frozen=True)
class PreparedText:
    """A text ready to decode.

    Attributes:
        text: as given.
        normalized: the text normalised (None: normalisation is off).
        plan: how `spoken` is decoded: one chunk, or several (`plan.split`).
    """

    text: str
    normalized: str | None
    plan: TextPlan

    @property
    def spoken(self) -> str:
        """What the model reads: the normalised text, else the text."""
        return self.normalized if self.normalized is not None else self.text

    @property
    def split(self) -> bool:
        return self.plan.split


def estimated_prompt(text: str, prompt_text: str | None, prompt_codes: Sequence[int] | None) -> int:
    """A guess at a prompt's length without its tokenizer (the dry run's)."""
    chars = len(text) + len(prompt_text or "")
    return ESTIMATED_TEMPLATE + math.ceil(chars / CHARS_PER_TOKEN) + len(prompt_codes or ())


class TextPlanner:
    """Prepares texts under one set of text settings for one model's prompts.

    Args:
        spec: the text settings (`text:` in a job spec).
        prompt_ids: builds a text's prompt ids (None: no tokenizer; prompts are
            `estimated_prompt`s, as the dry run has them).
        context: the model's context in tokens, prompt included.
        codes_per_second: the model family's (how many codes a text's speech takes).
    """

    def __init__(self, spec: TextSpec, prompt_ids: PromptIds | None, context: int, codes_per_second: float) -> None:
        self.spec, self.prompt_ids, self.context = spec, prompt_ids, context
        self.codes_per_second = codes_per_second
        self.normalize = text_normalizer(spec.normalize, spec.normalizer) if spec.normalize != "none" else None
        self._template: int | None = None

    def template(self) -> int:
        """The prompt's tokens besides the texts (measured once, with a one-letter text)."""
        if self._template is None:
            self._template = len(self.prompt_ids("a", None, None, None))
        return self._template

    def bound(self, text: str, prompt_text: str | None, prompt_codes: Sequence[int] | None,
              voice: str | None = None) -> int:
        """At least the length of `text`'s prompt, found without tokenising (module docstring); a
        named voice is written before the text (`"{voice}: "`)."""
        said = len(text.encode()) + sum(len(extra.encode()) + 2 for extra in (prompt_text, voice) if extra)
        return self.template() + said + len(prompt_codes or ()) + BOUND_SLACK

    def budget(self, max_new_tokens: int, prompt_text: str | None, prompt_codes: Sequence[int] | None,
               exact: bool, voice: str | None = None) -> Budget:
        """A row's budget: prompts measured (`exact`, by the tokenizer when there is one) or bounded."""

        def length(text: str) -> int:
            if self.prompt_ids is None:
                return estimated_prompt(f"{voice}: {text}" if voice else text, prompt_text, prompt_codes)
            if exact:
                return len(self.prompt_ids(text, prompt_text, prompt_codes, voice))
            return self.bound(text, prompt_text, prompt_codes, voice)
        return Budget(max_new_tokens, self.context, length, codes_per_second=self.codes_per_second)

    def cuttable(self, max_new_tokens: int) -> bool:
        """Whether a budget of `max_new_tokens` leaves room for any piece of text (`Budget.cuttable`
        before its prompt is known: the prompt only takes room away)."""
        return Budget(max_new_tokens, codes_per_second=self.codes_per_second).cuttable()

    def least_cuttable(self) -> int:
        """The smallest `max_new_tokens` that `cuttable` allows (a one-letter text's budget)."""
        return speech_budget("a", HEADROOM, self.codes_per_second)

    def __call__(self, text: str, max_new_tokens: int, prompt_text: str | None = None,
                 prompt_codes: Sequence[int] | None = None, voice: str | None = None) -> PreparedText:
        """`text` normalised and planned for a row with this budget, voice prompt and named voice.

        Raises:
            ValueError: the normaliser failed on it (`NormalizerUnavailable`: not installed).
        """
        normalized = self.normalize(text) if self.normalize is not None and text.strip() else None
        spoken = normalized if normalized is not None else text
        if not spoken.strip():  # nothing to say: the decoder refuses it, with its own error
            return PreparedText(text, normalized, whole_plan(spoken, fits=True))
        quick = self.budget(max_new_tokens, prompt_text, prompt_codes, exact=False, voice=voice)
        mode = self.spec.split
        # auto: a text that fits under the bound fits; one no piece of which could fit stays whole
        if mode == "none" or (mode == "auto" and (quick.fits(spoken.strip()) or not self.cuttable(max_new_tokens))):
            return PreparedText(text, normalized, whole_plan(spoken, fits=quick.fits(spoken.strip())))
        exact = self.budget(max_new_tokens, prompt_text, prompt_codes, exact=True, voice=voice)
        return PreparedText(text, normalized, plan_text(spoken, exact, mode, self.spec.language))

