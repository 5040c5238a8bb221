"""benchmarks/drain_by_job_size.py: its replay of a committed run reproduces that run's measured
slot utilisation, and its job-size table behaves as a drain must (fuller with more rows per slot)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = "benchmarks/results/job_throughput_cpu_tiny_xeon_dec02_malloc.json"


def test_replays_the_measured_run_and_fills_up_with_job_size(tmp_path):
    out = tmp_path / "drain"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "drain_by_job_size.py"), "--source", SOURCE,
                    "--workload", "augment", "--sizes", "40,120,960", "--samples", "300", "--out", str(out)],
                   cwd=ROOT, check=True, capture_output=True)
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["replayed_utilisation"] == doc["measured_utilisation"] == 0.8342
    sizes = doc["sizes"]
    assert [s["rows"] for s in sizes] == [40, 120, 960]
    assert all(0 < s["p05"] <= s["median"] <= s["p95"] <= 1 and 0 <= s["share_at_goal"] <= 1 for s in sizes)
    assert sizes[0]["median"] < sizes[1]["median"] < sizes[2]["median"]
    assert sizes[0]["share_at_goal"] < 0.5 < sizes[2]["share_at_goal"] == 1.0
    assert "| 960 | 120.0 |" in out.with_suffix(".md").read_text()
