"""The README's examples run as written: its Python API block, against the tiny kit."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def python_block(section: str) -> str:
    """The first ```python block under the README heading `section`."""
    text = README.read_text()
    start = text.index(f"\n## {section}\n")
    return re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)


def test_the_python_api_example_runs_as_written(kit_dir, tmp_path, monkeypatch):
    (tmp_path / "kit").symlink_to(kit_dir)
    monkeypatch.chdir(tmp_path)  # the block names kit/target, kit/draft, kit/codec
    scope: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(python_block("Python API"), "README.md (Python API)", "exec"), scope)
    # one line per streamed item, each with its codes
    lines = [line.split() for line in printed.getvalue().splitlines()]
    assert sorted(line[0] for line in lines) == ["a", "b", "c"]
    assert all(reason in ("eos", "length") and int(n) > 0 for _, reason, n in lines), lines
    assert scope["summary"].to_dict()["generated_tokens"] > 0
    assert len(scope["wave"]) == 320 * len(scope["result"].codes) and scope["codec"].sample_rate == 16_000
