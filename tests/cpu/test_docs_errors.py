"""The troubleshooting page quotes the engine's own lines: each mistake below is made for real
(a missing spec, a misspelt key, a missing model, a Hub id on a machine that cannot download, ...)
and the one line the command prints is on docs/troubleshooting.md word for word, with the test's
folder written as the page's example home folder, /home/me."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOME = "/home/me"  # the page's example home folder: the test's folder stands in for it

# Each command's last line on standard error, and its exit status, from one interpreter.
RUN = """
import contextlib, io, json, sys
from engine.cli import main
found = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(argv)
    found.append([rc, err.getvalue().strip().splitlines()[-1]])
print(json.dumps(found))
"""

SPEC = """name: my-corpus
models: {target: %(target)s, %(draft)scodec: ../models/codec}
decoding: {%(decoding)s}
input: {manifests: [manifests/]}
output: {uri: ../runs/my-corpus}
"""


def write_spec(folder: Path, name: str, target="../models/target", draft=True, decoding="method: pcg") -> str:
    """A job spec in `folder` whose models are `../models/` (a config.json each, nothing else)."""
    fields = {"target": target, "draft": "draft: ../models/draft, " if draft else "", "decoding": decoding}
    (folder / name).write_text(SPEC % fields)
    return name


def test_the_troubleshooting_page_quotes_what_the_engine_prints(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "manifests").mkdir(parents=True)
    (corpus / "manifests" / "part-0.jsonl").write_text('{"id": "a", "text": "Hello."}\n')
    models = tmp_path / "models"
    for part in ("target", "draft", "codec"):
        (models / part).mkdir(parents=True)
        (models / part / "config.json").write_text("{}")
    cases = [
        ["run", "my-corpus.yaml"],
        ["run", write_spec(corpus, "typo.yaml", decoding="temprature: 0.8"), "--dry-run"],
        ["run", write_spec(corpus, "gamma.yaml", decoding="gamma: 0"), "--dry-run"],
        ["run", write_spec(corpus, "nodraft.yaml", draft=False), "--dry-run"],
        ["run", write_spec(corpus, "greedy.yaml", decoding="temperature: 0, top_p: 0.9"), "--dry-run"],
        ["run", write_spec(corpus, "nomodel.yaml", target="../models/no-model"), "--dry-run"],
        ["run", write_spec(corpus, "hub.yaml", target="HKUSTAudio/Llasa-1B"), "--dry-run"],
        ["run", write_spec(corpus, "notokenizer.yaml"), "--dry-run"],
        ["generate", "--text", "Hello."],
        ["generate", "--kit", "nokit", "--text", "Hello."],
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / ".cache" / "huggingface")}
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        env.pop(var, None)
    done = subprocess.run([sys.executable, "-c", RUN, json.dumps(cases)], cwd=corpus, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    page = (ROOT / "docs" / "troubleshooting.md").read_text()
    missing = []
    for argv, (rc, line) in zip(cases, json.loads(done.stdout)):
        assert rc == 2 and line.startswith("error: "), (argv, rc, line)
        shown = line.replace(str(tmp_path), HOME)
        quoted = f"`` {shown} ``" if "`" in shown else f"`{shown}`"  # a markdown code span
        if quoted not in page:
            missing.append(shown)
    assert not missing, "lines the engine prints that docs/troubleshooting.md does not quote:\n" + "\n".join(missing)
