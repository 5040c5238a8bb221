"""benchmarks/gpu_check.sh, the one call a lent GPU runs: on a machine without CUDA its steps
still run in order within the budget, its logs are written, and a site-packages archive given
as SITE_TAR is unpacked and put on PYTHONPATH first."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_its_steps_in_budget_and_unpacks_the_site_archive(tmp_path):
    archive = tmp_path / "site.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        data = b"MARK = 1\n"
        info = tarfile.TarInfo("pcg_site_marker.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    out, site = tmp_path / "out", tmp_path / "site"
    env = {**os.environ, "PY": sys.executable, "OUT": str(out), "SITE_TAR": str(archive),
           "SITE_DIR": str(site), "BUDGET": "40"}  # too little for the benchmarks: steps 2 and 3 are skipped
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], env=env, capture_output=True,
                         text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (site / "pcg_site_marker.py").read_text() == "MARK = 1\n"

    versions = (out / "versions.txt").read_text()
    assert f"PYTHONPATH {site}:{ROOT}" in versions
    assert "available False" in versions and "pydantic 2." in versions
    tests = (out / "tests_gpu.log").read_text()
    gpu_tests = sum(line.startswith("def test_") for f in (ROOT / "tests" / "gpu").glob("test_*.py")
                    for line in f.read_text().splitlines())
    assert f"{gpu_tests} skipped" in tests and tests.rstrip().endswith("rc=0")  # every CUDA test, skipped
    stages = (out / "stages.log").read_text().splitlines()
    assert [line.split("] ", 1)[1].split(" (")[0].split(":")[0] for line in stages] == [
        f"unpacking {archive}", "1. CUDA tests", "2. skipped", "3. skipped", "done"]
    assert not (out / "bench.log").exists() and not (out / "round.log").exists()


def test_gpu_check_skips_the_tests_when_their_budget_is_zero(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PY": sys.executable, "OUT": str(out), "BUDGET": "40", "TEST_BUDGET": "0"}
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    stages = [line.split("] ", 1)[1] for line in (out / "stages.log").read_text().splitlines()]
    assert stages[0] == "1. CUDA tests skipped (TEST_BUDGET=0)" and stages[-1] == "done"
    assert not (out / "tests_gpu.log").exists()


def test_gpu_check_packs_its_logs_where_out_holds_more_than_a_lent_call_brings_back(tmp_path):
    """A lent machine's call returns at most 8 files: with more in OUT, the logs go into one archive
    and the result files stay as they are."""
    out = tmp_path / "out"
    out.mkdir()
    for i in range(7):  # result files, as the benchmarks leave them
        (out / f"result_{i}.json").write_text("{}")
    env = {**os.environ, "PY": sys.executable, "OUT": str(out), "BUDGET": "40", "TEST_BUDGET": "0"}
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["logs.tar.gz"] + [f"result_{i}.json" for i in range(7)]
    with tarfile.open(out / "logs.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["stages.log", "versions.txt"]
        versions = tar.extractfile("versions.txt").read().decode()
    assert "available False" in versions and "nvidia-smi" in versions  # nvidia-smi's report, or its absence
