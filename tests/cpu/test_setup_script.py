"""scripts/setup.sh against a .venv that already holds a torch older than pyproject.toml's floor:
it stops before any download and says what to do (the rest of the script runs in CI itself)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_setup_stops_on_a_torch_older_than_the_floor_and_says_what_to_do(tmp_path):
    floor = re.search(r'"torch>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / ".venv")], check=True)
    venv_python = str(tmp_path / ".venv" / "bin" / "python")
    site = subprocess.run([venv_python, "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "torch").mkdir()
    (Path(site) / "torch" / "__init__.py").write_text('__version__ = "2.6.0+cpu"\n')
    env = {**os.environ, "PCG_SYNTH_APT": "0", "PCG_SYNTH_GPU": "0"}
    run = subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"torch 2.6.0+cpu; pcg-synth needs torch >= {floor}" in run.stderr
    assert not (tmp_path / ".venv" / "bin" / "pip").exists()  # stopped before pip was installed or upgraded
