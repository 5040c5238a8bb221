"""The documentation's reference pages, generated from the code when the site is built.

mkdocs runs this file as a hook (`hooks:` in mkdocs.yml): a page holding a marker such as
`<!-- reference: job-spec -->` gets the marker replaced by markdown made from the code, so the
reference cannot drift from it:

- `job-spec`: every job-spec field, section by section, from `engine.config.JobSpec`'s pydantic
  models (type, default, allowed values, the field's `description=`);
- `cli`: every `pcg-synth` command and flag, from the argparse parser `engine.cli.build_parser`
  builds (with the commands the packages register), as `--help` prints them.

`expand(markdown)` is the same replacement outside mkdocs (tests/cpu/test_docs_links.py reads the
pages as the site shows them).

The site builds with the [docs] extra's packages alone: the generator reads the checkout's
`engine` (put first on the path, installed or not) and imports only its light modules (the
settings and the parser: pydantic and pyyaml, no torch or Ray); tests/cpu/test_docs_offline.py
holds the build to that.
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

# The code these pages document is the checkout's, installed or not. Imported here, while the
# checkout is on the path (mkdocs restores sys.path once a hook has loaded): its modules then
# resolve through the package.
ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
import engine  # noqa: E402, F401


def cell(text: object) -> str:
    """Text safe inside one markdown table cell."""
    return (str(text).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
            .replace("\n", " "))


# ---- job spec -----------------------------------------------------------------------------------


def models_in(annotation) -> list[type[BaseModel]]:
    """The settings models a field's annotation holds (`X | None`, `list[X]`, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in models_in(arg)]


def type_name(annotation) -> str:
    """A field's type as a reader writes it in YAML: `int`, `float or null`, `list of int`."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "string" if all(isinstance(v, str) for v in typing.get_args(annotation)) else "literal"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(type_name(a) for a in typing.get_args(annotation)))
    if origin is list:
        (inner,) = typing.get_args(annotation)
        return f"list of {type_name(inner)}"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    return {str: "string", int: "int", float: "float", bool: "bool"}.get(annotation, str(annotation))


def choices(annotation) -> list:
    """The values a Literal in the annotation allows (`gamma`: its integer or `auto`)."""
    if typing.get_origin(annotation) is Literal:
        return list(typing.get_args(annotation))
    return [v for arg in typing.get_args(annotation) for v in choices(arg)]


def bounds(info) -> str:
    """A field's numeric and length constraints: `>= 1`, `> 0, <= 1`, `at least 1 entry`."""
    words = []
    for meta in info.metadata:
        for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            if getattr(meta, attr, None) is not None:
                words.append(f"{sign} {getattr(meta, attr)}")
        if getattr(meta, "min_length", None):
            words.append(f"at least {meta.min_length}")
        if getattr(meta, "pattern", None):
            words.append(f"matches `{meta.pattern}`")
    return ", ".join(words)


def default_of(info) -> str:
    if info.is_required():
        return "required"
    if info.default is PydanticUndefined:  # a default_factory: a section or a list
        value = info.get_default(call_default_factory=True)
        return "(section)" if isinstance(value, BaseModel) else f"`{value!r}`"
    return f"`{info.default!r}`" if info.default is not None else "null"


def field_rows(model: type[BaseModel], prefix: str) -> Iterator[str]:
    for name, info in model.model_fields.items():
        allowed = ", ".join(f"`{v}`" for v in choices(info.annotation))
        limits = bounds(info)
        allowed = "; ".join(x for x in (allowed, limits) if x)
        yield (f"| `{prefix}{name}` | {cell(type_name(info.annotation))} | {cell(default_of(info))} "
               f"| {cell(allowed)} | {cell(info.description or '')} |")


HEADER = "| field | type | default | allowed | meaning |\n|---|---|---|---|---|"


def sections(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, type[BaseModel]]]:
    """(dotted name, model) of every section below `model`, depth first; lists of mappings as
    `name[]`."""
    for name, info in model.model_fields.items():
        for sub in models_in(info.annotation):
            many = typing.get_origin(info.annotation) is list
            path = f"{prefix}{name}{'[]' if many else ''}"
            yield path, sub
            yield from sections(sub, path + ".")


def job_spec_markdown() -> str:
    """Every job-spec field: the top-level keys, then one table per section."""
    from engine.config import JobSpec

    out = ["## Top level", "", (JobSpec.__doc__ or "").strip(), "", HEADER]
    out += field_rows(JobSpec, "")
    for path, model in sections(JobSpec):
        out += ["", f"## `{path}`", ""]
        if model.__doc__ and model.__doc__ != BaseModel.__doc__:
            out += [" ".join(model.__doc__.split()), ""]
        out += [HEADER, *field_rows(model, path + ".")]
    return "\n".join(out) + "\n"


# ---- command line -------------------------------------------------------------------------------


def commands(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(command path, one-line help, parser) of every command below `parser`, depth first."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help or "" for a in action._choices_actions}
        for name, sub in action.choices.items():
            yield f"{path} {name}", helps.get(name, ""), sub
            yield from commands(sub, f"{path} {name}")


def usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=100)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


COMMON_FLAGS = ("-h", "-v")  # on every command: listed once, under `pcg-synth`


def documented(parser: argparse.ArgumentParser, top: bool) -> list[tuple[str, list[argparse.Action]]]:
    """(group title, its flags) of `parser`, without subcommand lists and hidden flags, and without
    the flags every command shares unless `top`."""
    out = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions
                   if a.help is not argparse.SUPPRESS and not isinstance(a, argparse._SubParsersAction)
                   and (top or not set(a.option_strings) & set(COMMON_FLAGS))]
        if actions:
            out.append((group.title, actions))
    return out


def default_text(action: argparse.Action) -> str:
    """A flag's default as `--help` would matter to a reader; empty for switches and unset ones."""
    if action.nargs == 0 or action.default is None or action.default is argparse.SUPPRESS:
        return ""
    return f"`{action.default}`"


def flag_rows(parser: argparse.ArgumentParser, top: bool = False) -> Iterator[str]:
    """One table per argument group: flag, default, choices, help."""
    formatter = argparse.HelpFormatter(parser.prog)
    for title, actions in documented(parser, top):
        yield f"\n*{title}*\n\n| flag | default | choices | meaning |\n|---|---|---|---|"
        for a in actions:
            name = ", ".join(a.option_strings) or (a.metavar or a.dest)
            picks = ", ".join(f"`{c}`" for c in a.choices) if a.choices else ""
            text = formatter._expand_help(a) if a.help else ""
            yield f"| `{name}` | {cell(default_text(a))} | {cell(picks)} | {cell(text)} |"


def cli_markdown() -> str:
    """Every `pcg-synth` command with its usage and flags."""
    from engine.cli import build_parser

    top = build_parser()
    out = ["## `pcg-synth`", "", (top.description or "").strip(), "", "```", usage(top), "```",
           *flag_rows(top, top=True)]
    for path, help_text, parser in commands(top, "pcg-synth"):
        out += ["", f"## `{path}`", "", help_text.rstrip(".") + "." if help_text else ""]
        if parser.description and parser.description != help_text:
            out += ["", parser.description]
        if any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
            continue  # a group of commands: its commands follow
        out += ["", "```", usage(parser), "```", *flag_rows(parser)]
    return "\n".join(out) + "\n"


# ---- the hook -----------------------------------------------------------------------------------

MARKERS: dict[str, Callable[[], str]] = {
    "<!-- reference: job-spec -->": job_spec_markdown,
    "<!-- reference: cli -->": cli_markdown,
}


def expand(markdown: str) -> str:
    """`markdown` with every reference marker replaced by its generated text."""
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown


def on_page_markdown(markdown: str, **_) -> str:
    """mkdocs hook: runs on every page's markdown before it is rendered."""
    return expand(markdown)
