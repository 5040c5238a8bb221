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
