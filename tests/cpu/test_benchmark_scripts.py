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


def test_the_drafters_benchmark_compares_a_draft_model_with_stream_heads(kit_dir, kit_groups, tmp_path):
    """`bench_drafters.py` on the kit (its draft and its four heads): a row per batch size, every
    setting's figures, speedups that are positive numbers, and gammas above the heads' count run
    with the draft model only. Timings are not compared: the kit on a shared CPU says nothing.
    (`kit_groups`: the script finds the kit's groups in the session's cache, built once.)"""
    import json
    import math

    stem = tmp_path / "drafters"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_drafters.py"), "--kit", str(kit_dir),
                          "--batch-sizes", "1,2", "--gammas", "2,5", "--reps", "1", "--max-new-tokens", "12",
                          "--items-per-slot", "1", "--device", "cpu", "--dtype", "float32", "--threads", "1",
                          "--out", str(stem), "--quiet"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(stem.with_suffix(".json").read_text())
    assert [r["batch"] for r in doc["rows"]] == [1, 2]
    assert doc["settings"]["gammas_skipped_for_heads"] == [5]
    for batch in ("1", "2"):
        runs = doc["batches"][batch]["runs"]
        assert set(runs) == {"ar", "pcg draft g2", "pcg draft g5", "pcg heads g2"}
        for label, f in runs.items():
            for key in ("tokens_per_s", "speedup_vs_ar"):
                assert math.isfinite(f[key]["median"]) and f[key]["median"] > 0, (label, key)
            assert all(0 <= a <= 1 for a in f["acceptance_per_position"])
            assert len(f["acceptance_per_position"]) == (0 if label == "ar" else f["gamma"])
        assert runs["ar"]["speedup_vs_ar"]["median"] == 1.0
    for row in doc["rows"]:
        assert row["draft"]["setting"].startswith("pcg draft") and row["heads"]["setting"] == "pcg heads g2"
        assert row["heads_over_draft"]["median"] > 0 and row["heads"]["speedup_vs_ar"] > 0
    p = doc["parameters"]
    assert 0 < p["heads"] and 0 < p["draft_own"] <= p["draft"] and 0 < p["heads_share_of_target"] < 1
    assert doc["models"]["heads"] == 4 and doc["how"] in doc["notes"]
    assert "| batch | ar tokens/s |" in stem.with_suffix(".md").read_text()
