"""The documentation site builds, strictly, and its reference pages cover the code.

`mkdocs build --strict` fails on a broken link or anchor, a page left out of the navigation and
a reference page whose generation fails (scripts/docs_reference.py, run as an mkdocs hook). The
reference is generated from the code, so what the tests check beside the build is the code's
own documentation: every job-spec field has a description, every CLI flag a help text, and the
generated pages name every field and command."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel

import engine.config as config
from engine.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import docs_reference  # noqa: E402


def build(site: Path, config_file: Path = ROOT / "mkdocs.yml") -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config_file),
                           "-d", str(site)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_the_site_builds_strictly_with_the_generated_reference(tmp_path):
    done = build(tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    job_spec = (tmp_path / "site" / "reference" / "job-spec" / "index.html").read_text()
    assert "decoding.max_speech_ratio" in job_spec and "resources.shard_window" in job_spec
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "pcg-synth draft train" in cli and "--allow-numerics-change" in cli


def test_the_strict_build_fails_on_a_broken_anchor_and_a_page_outside_the_nav(tmp_path):
    """The checks the build stands for are switched on: a copy of the site with a broken anchor
    and a page missing from the navigation does not build."""
    docs = tmp_path / "docs"
    subprocess.run(["cp", "-r", str(ROOT / "docs"), str(docs)], check=True)
    (docs / "stray.md").write_text("# Not in the nav\n\n[jobs](guides/jobs.md#no-such-heading)\n")
    cfg = (ROOT / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}")
    for hook in ("docs_reference.py", "docs_offline.py"):
        cfg = cfg.replace(f"scripts/{hook}", str(ROOT / "scripts" / hook))
    (tmp_path / "mkdocs.yml").write_text(cfg)
    done = build(tmp_path / "site", tmp_path / "mkdocs.yml")
    assert done.returncode != 0
    assert "no-such-heading" in done.stdout + done.stderr and "stray.md" in done.stdout + done.stderr


def settings_models() -> list[type[BaseModel]]:
    return [m for m in vars(config).values()
            if isinstance(m, type) and issubclass(m, BaseModel) and m.__module__ == config.__name__]


def test_every_settings_field_has_a_description():
    """The job-spec reference is made of these descriptions: a field without one fails here."""
    assert {"JobSpec", "DecodingSettings", "ResourcesSpec", "SweepSpec"} <= {m.__name__ for m in settings_models()}
    bare = [f"{m.__name__}.{name}" for m in settings_models() for name, info in m.model_fields.items()
            if not (info.description or "").strip()]
    assert not bare, f"fields without description=: {bare}"


def test_the_job_spec_reference_names_every_field_of_every_section():
    page = docs_reference.job_spec_markdown()
    sections = [("", config.JobSpec), *((path + ".", model) for path, model in docs_reference.sections(config.JobSpec))]
    assert {"models.", "decoding.", "augment.prompts[].", "sweep.model_pairs[]."} <= {p for p, _ in sections}
    for prefix, model in sections:
        for name, info in model.model_fields.items():
            row = next((line for line in page.splitlines() if line.startswith(f"| `{prefix}{name}` |")), None)
            assert row is not None, f"{prefix}{name} is not in the reference"
            assert info.description.split()[0].replace("|", "\\|") in row, row


def test_every_cli_command_and_flag_is_documented():
    page = docs_reference.cli_markdown()
    commands = list(docs_reference.commands(build_parser(), "pcg-synth"))
    assert {"pcg-synth run", "pcg-synth kit build", "pcg-synth groups build", "pcg-synth draft train",
            "pcg-synth bench", "pcg-synth codec encode"} <= {path for path, _, _ in commands}
    bare = []
    for path, _, parser in commands:
        assert f"## `{path}`" in page
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) or action.help is argparse.SUPPRESS:
                continue
            if not action.help:
                bare.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
            name = ", ".join(action.option_strings) or action.metavar or action.dest
            assert f"| `{name}` |" in page or set(action.option_strings) & {"-h", "-v"}, f"{path} {name}"
    assert not bare, f"flags without help=: {bare}"
