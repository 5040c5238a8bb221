"""The README's examples run as written: its Python API block, against the tiny kit. The
documentation's Python API page shows the same block."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def python_block(doc: Path, section: str) -> str:
    """The first ```python block under the markdown heading `section` of `doc`."""
    text = "\n" + doc.read_text()
    start = text.index(f"\n{section}\n")
    return re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)


def test_the_python_api_example_runs_as_written(kit_dir, tmp_path, monkeypatch):
    (tmp_path / "kit").symlink_to(kit_dir)
    monkeypatch.chdir(tmp_path)  # the block names kit/target, kit/draft, kit/codec
    scope: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(python_block(README, "## Python API"), "README.md (Python API)", "exec"), scope)
    # one line per streamed item, each with its codes
    lines = [line.split() for line in printed.getvalue().splitlines()]
    assert sorted(line[0] for line in lines) == ["a", "b", "c"]
    assert all(reason in ("eos", "length") and int(n) > 0 for _, reason, n in lines), lines
    assert scope["summary"].to_dict()["generated_tokens"] > 0
    assert len(scope["wave"]) == 320 * len(scope["result"].codes) and scope["codec"].sample_rate == 16_000


def test_the_docs_python_api_page_shows_the_readmes_block():
    page = ROOT / "docs" / "guides" / "python-api.md"
    assert python_block(page, "# Python API") == python_block(README, "## Python API")


def test_the_readme_is_a_front_door():
    """Short, the two commands first, and CI runs exactly the README's test command."""
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    first_block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()]
    assert commands == ["./quickstart.sh", "bash scripts/setup.sh && .venv/bin/python -m pytest -q tests"]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci[-2:] == ["bash scripts/setup.sh", ".venv/bin/python -m pytest -q tests"]


def yaml_block(doc: Path, section: str) -> dict:
    """The first ```yaml block under the markdown heading `section` of `doc`, parsed."""
    text = "\n" + doc.read_text()
    start = text.index(f"\n{section}\n")
    return yaml.safe_load(re.search(r"```yaml\n(.*?)```", text[start:], re.S).group(1))


TITLES = {"augmentation.md": "# Augmentation corpora", "sweeps.md": "# Throughput sweeps"}


def test_the_documented_job_specs_are_valid():
    """The README's minimal spec and the guides' examples validate as job specs (the augment and
    sweep sections on top of the minimal one), and a typo in one is caught."""
    from engine.config import JobSpec

    guides = ROOT / "docs" / "guides"
    minimal = yaml_block(README, "## A minimal job spec")
    assert yaml_block(guides / "jobs.md", "## A minimal job spec")["models"] == minimal["models"]
    spec = JobSpec.model_validate(minimal)
    assert spec.decoding.gamma == "auto" and spec.resources.gpus_per_worker == 1
    for page, kind in (("augmentation.md", "augment"), ("sweeps.md", "sweep")):
        section = yaml_block(guides / page, TITLES[page])
        assert section["kind"] == kind
        assert JobSpec.model_validate({**minimal, **section}).kind == kind
    with pytest.raises(ValueError, match="temprature"):
        JobSpec.model_validate({**minimal, "decoding": {"temprature": 0.8}})
