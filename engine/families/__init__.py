"""Model families: one module per family of speech LMs and its codec (`base.Family`).

    family = detect(tokenizer)                 # or family_named("orpheus"), checked with `resolve`
    layout = family.layout(tokenizer, vocab)   # token layout, read and checked
    prompter = family.prompter(tokenizer, layout)
    codec = family.load_codec(path)
"""

from __future__ import annotations

from engine.config import DecodingSettings
from engine.families.base import Family, OutputSpace, SpeechLayout
from engine.families.llasa import FAMILY as LLASA
from engine.families.orpheus import FAMILY as ORPHEUS
from engine.knobs import GREEDY_OFF  # sampling knobs a greedy setting must leave off

FAMILIES: dict[str, Family] = {f.name: f for f in (LLASA, ORPHEUS)}
FAMILY_NAMES: tuple[str, ...] = tuple(FAMILIES)

__all__ = ["FAMILIES", "FAMILY_NAMES", "Family", "OutputSpace", "SpeechLayout", "check_max_new_tokens", "detect",
           "family_named", "family_settings", "resolve"]


class UnknownFamily(ValueError):
    """A checkpoint of no family the engine knows, or not of the family a job names."""


def family_named(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise UnknownFamily(f"unknown model family {name!r}: choose one of {', '.join(FAMILY_NAMES)}") from None


def detect(tokenizer, where: str = "the checkpoint") -> Family:
    """The family whose marker tokens `tokenizer` holds.

    Raises:
        UnknownFamily: none or several do.
    """
    found = [f for f in FAMILIES.values() if f.detect(tokenizer)]
    if len(found) != 1:
        what = "no" if not found else "several"
        raise UnknownFamily(
            f"{where}: {what} known speech-LM family matches its tokenizer (Llasa: <|s_0|>..<|s_65535|> and "
            "<|SPEECH_GENERATION_END|>; Orpheus: <custom_token_10>..<custom_token_28681>); pcg-synth serves "
            + ", ".join(FAMILY_NAMES))
    return found[0]


def resolve(tokenizer, name: str = "auto", where: str = "the checkpoint") -> Family:
    """The family of a checkpoint: detected, and checked against `name` unless it is `auto`.

    Raises:
        UnknownFamily: no family detected, or another than `name`.
    """
    found = detect(tokenizer, where)
    if name != "auto" and found.name != name:
        raise UnknownFamily(f"{where} is a checkpoint of the {found.name} family ({found.title}), not {name}: "
                            f"set models.family to {found.name} or auto")
    return found


def family_settings(settings: DecodingSettings, family: Family) -> DecodingSettings:
    """`settings` with `family.sampling` (e.g. Orpheus's temperature 0.6, top_p 0.8, repetition
    penalty 1.3) in the fields they leave unset (pydantic's `model_fields_set`); what a job, a
    call or a row sets stays. A greedy setting (temperature 0) takes no top-p or top-k."""
    given = settings.model_dump(exclude_unset=True)
    defaults = {k: v for k, v in family.sampling.items() if k not in given}
    if not defaults:
        return settings
    if given.get("temperature", defaults.get("temperature")) == 0:
        defaults = {k: v for k, v in defaults.items() if k not in GREEDY_OFF}
    return DecodingSettings(**{**settings.model_dump(), **defaults, **given})


def check_max_new_tokens(max_new_tokens: int, context: int, family: str) -> None:
    """A token budget the model can honour: at most its `context` (prompt included), since no row
    can generate more tokens than its context holds. One check for a job's settings (before any
    work), a manifest row's or an item's own (that row's error record) and a call's. A larger
    value is refused, never capped: a cap would record settings (`_job.json`, each row's
    `settings`) that did not bound the rows, and a typo'd budget would pass unseen.

    Raises:
        ValueError: `max_new_tokens: N is above the <family> model's context of C tokens ...`.
    """
    if max_new_tokens > context:
        raise ValueError(f"max_new_tokens: {max_new_tokens} is above the {family} model's context of {context} "
                         f"tokens (prompt included), which no row can exceed: give {context} or less")
