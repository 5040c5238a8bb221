"""Light modules import without torch: records, settings and the storage layer are used by
drivers, manifests and tools that never decode."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["engine", "engine.records", "engine.config", "engine.io.storage",
                                    "engine.io.manifest", "engine.io.dataset"])
def test_module_imports_without_torch(module):
    code = f"import sys, {module}; assert 'torch' not in sys.modules, sorted(sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_public_names_load_on_first_use():
    code = ("import sys, engine; assert 'torch' not in sys.modules; "
            "from engine import DecodingSettings, RunSummary, SynthesisItem, SynthesisResult; "
            "assert 'torch' not in sys.modules; from engine import Synthesizer; "
            "assert 'torch' in sys.modules and Synthesizer.__module__ == 'engine.api'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


CLI_WITHOUT_TORCH = """
import argparse, contextlib, io, sys
from engine.cli import build_parser, main

def commands(parser, path=()):
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from commands(child, (*path, name))

seen = []
for path in commands(build_parser()):
    for flag in (["--help"], ["--version"])[: 2 if not path else 1]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main([*path, *flag])
        assert out.getvalue().strip(), (path, flag)
        seen.append(" ".join([*path, *flag]))
err = io.StringIO()
with contextlib.redirect_stderr(err):
    rc = main(["run", sys.argv[1]])
assert rc == 2 and "decoding.method" in err.getvalue(), (rc, err.getvalue())
with contextlib.redirect_stderr(err):
    rc = main(["generate", "--text", "Hello.", "--out", "codes.json"])
assert rc == 2 and "give --kit DIR or --target DIR" in err.getvalue(), (rc, err.getvalue())
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(["run", sys.argv[2], "--dry-run", "--quiet"])
assert rc == 0 and '"rows_ok": 2' in out.getvalue(), (rc, out.getvalue())
err = io.StringIO()
with contextlib.redirect_stderr(err):
    rc = main(["run", sys.argv[3]])
assert rc == 2 and "models.draft: no checkpoint at" in err.getvalue(), (rc, err.getvalue())
heavy = [m for m in ("torch", "ray", "transformers", "numpy") if m in sys.modules]
assert not heavy, heavy
print(*seen, sep=chr(10))
"""


def test_the_command_lines_help_and_a_spec_check_load_no_torch_or_ray(kit_dir, tmp_path):
    """`pcg-synth --help`, `--version`, every command's `--help`, the refusal of an invalid job
    spec, of a job whose model is missing and of a `generate` call without a model, and a job's
    dry run answer in well under a second: none of them imports torch, Ray, transformers or
    numpy."""
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\nmodels: {target: t, codec: c}\ndecoding: {method: nope}\n"
                    "input: {manifests: [m.jsonl]}\noutput: {uri: out}\n")
    (tmp_path / "m.jsonl").write_text('{"id": "a", "text": "Hello."}\n{"id": "b", "text": "Again."}\n')
    good = tmp_path / "good.yaml"
    good.write_text(f"name: x\nmodels: {{target: {kit_dir}/target, draft: {kit_dir}/draft, codec: {kit_dir}/codec}}\n"
                    "input: {manifests: [m.jsonl]}\noutput: {uri: out}\n")
    missing = tmp_path / "missing.yaml"
    missing.write_text(good.read_text().replace(f"{kit_dir}/draft", str(tmp_path / "no-draft")))
    done = subprocess.run([sys.executable, "-c", CLI_WITHOUT_TORCH, str(spec), str(good), str(missing)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    asked = set(done.stdout.splitlines())  # every command and subcommand was asked for its help
    assert {"--help", "--version", "run --help", "draft train --help", "groups build --help",
            "bench --help", "codec encode --help", "kit build --help"} <= asked, sorted(asked)
