"""Every benchmark script a user or a release runs answers `--help` (its imports and arguments
still hold after the engine around it changed); the round benchmark keeps a partial result."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py") if p.name != "machine.py")


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_script_answers_help(script):
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--help"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "usage:" in run.stdout


def test_the_round_benchmark_keeps_what_it_measured_when_a_setting_fails(kit_dir, tmp_path):
    """`bench_round.py` writes its result after every setting: a run that stops part way (a lent
    GPU's time limit; here a method that does not exist) leaves the settings measured before,
    marked incomplete. A setting runs at least `--row-rounds` row-rounds, and a compiled round is one
    launch."""
    import json

    stem = tmp_path / "round"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_round.py"), "--kit", str(kit_dir),
                          "--methods", "ar,nonsense", "--batches", "2", "--modes", "none,inductor", "--rounds", "2",
                          "--row-rounds", "8", "--warmup", "1", "--out", str(stem)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode != 0 and "nonsense" in run.stderr
    doc = json.loads(stem.with_suffix(".json").read_text())
    assert doc["complete"] is False
    assert [(r["method"], r["batch"], r["mode"]) for r in doc["readings"]] == [("ar", 2, "none"), ("ar", 2, "inductor")]
    assert doc["readings"][0]["tokens_per_s"] > 0 and "stopped after 1 of its 2 settings" in doc["notes"]
    # 8 row-rounds at batch 2: 4 rounds, more than --rounds asked
    assert doc["readings"][0]["rounds"] == 4 and doc["readings"][0]["round_vs_first_mode"] == 1.0
    # launches over the timed rounds only (each block's untimed first round left out)
    assert [r["graph_launches_per_round"] for r in doc["readings"]] == [0, 1]
    assert "| kit (" in stem.with_suffix(".md").read_text()
