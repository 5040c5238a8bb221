"""Command-line options made from pydantic settings: one `--field-name` per field, with the
field's type, choices, description and default, so a flag's default and help are written once,
in the settings model (`DecodingSettings` for decoding).

Flags are parsed to None unless given (or given a command's own default), and
`settings_from_args` builds the validated settings from the flags given: what was not given
falls back to the model's defaults.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Literal

from pydantic import BaseModel


def flag(name: str) -> str:
    """`max_new_tokens` -> `--max-new-tokens`."""
    return "--" + name.replace("_", "-")


def _literals(annotation) -> tuple:
    return typing.get_args(annotation) if typing.get_origin(annotation) is Literal else ()


def value_parser(annotation) -> tuple[typing.Callable[[str], object], tuple | None]:
    """(parse a command-line string, choices or None) for a field's type annotation.

    Supported: str, int, float, a Literal, `X | None`, and `X | Literal[...]` (e.g. gamma:
    an integer or "auto").
    """
    if _literals(annotation):
        return str, _literals(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        words = tuple(v for a in members for v in _literals(a))
        plain = [a for a in members if not _literals(a)]
        if len(plain) == 1 and plain[0] in (str, int, float):
            kind = plain[0]
            if not words:
                return kind, None

            def parse(text: str):
                return text if text in words else kind(text)
            parse.__name__ = f"{kind.__name__} or {' or '.join(words)}"  # argparse names it in errors
            return parse, None
        if not plain and words:
            return str, words
    if annotation in (str, int, float):
        return annotation, None
    raise TypeError(f"no command-line type for {annotation!r}")


def add_settings_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                           model: type[BaseModel], include: Iterable[str] | None = None,
                           exclude: Iterable[str] = (), defaults: Mapping[str, object] | None = None,
                           extra_choices: Mapping[str, Iterable[str]] | None = None) -> None:
    """Add `--field-name` for the fields of `model` (all, or `include` in that order).

    Args:
        parser: a parser or an argument group.
        model: the settings model whose fields become flags.
        include: these fields only, in this order (default: every field, in model order).
        exclude: fields to leave out.
        defaults: a command's own defaults, e.g. `{"max_new_tokens": 64}`; other flags parse to
            None when not given (the model's default then applies) and show the model's default.
        extra_choices: values accepted besides a Literal field's own, e.g. `{"method": ["all"]}`
            (the command resolves them before building settings).
    """
    defaults, extra_choices = dict(defaults or {}), dict(extra_choices or {})
    names = list(include) if include is not None else list(model.model_fields)
    for name in names:
        if name in exclude:
            continue
        info = model.model_fields[name]
        kind, choices = value_parser(info.annotation)
        if choices is not None and name in extra_choices:
            choices = (*choices, *extra_choices[name])
        default = defaults.get(name, info.get_default())
        shown = "none" if default is None else default
        text = f"{info.description} " if info.description else ""
        parser.add_argument(flag(name), dest=name, type=kind, choices=choices, default=defaults.get(name),
                            help=f"{text}(default: {shown})".replace("%", "%%"))


def settings_from_args(args: argparse.Namespace, model: type[BaseModel], **overrides) -> BaseModel:
    """Validated `model` settings from the values of `args` named like its fields that were
    given (not None), then `overrides`.

    Raises:
        pydantic.ValidationError: a bad value, naming its field.
    """
    given = {name: getattr(args, name) for name in model.model_fields if getattr(args, name, None) is not None}
    return model(**{**given, **overrides})


def add_compile_arg(group) -> None:
    """`--compile`, from the job spec's `models.compile` (choices, default, help)."""
    from engine.config import COMPILE_MODES, ModelsSpec

    field = ModelsSpec.model_fields["compile"]
    group.add_argument("--compile", default=field.default, choices=COMPILE_MODES, help=field.description)


def add_family_arg(group) -> None:
    """`--family`, from the job spec's `models.family` (choices, default, help)."""
    from typing import get_args

    from engine.config import FamilyName, ModelsSpec

    field = ModelsSpec.model_fields["family"]
    group.add_argument("--family", default=field.default, choices=get_args(FamilyName), help=field.description)


def add_draft_weights_arg(group) -> None:
    """`--draft-weights`, from the job spec's `models.draft_weights` (choices, default, help)."""
    from engine.config import DRAFT_WEIGHTS, ModelsSpec

    field = ModelsSpec.model_fields["draft_weights"]
    group.add_argument("--draft-weights", default=field.default, choices=DRAFT_WEIGHTS, help=field.description)
