"""Models by Hugging Face Hub id, offline: a Hub cache laid out as huggingface_hub writes it
(models--org--name/{blobs, refs/main, snapshots/<commit>/...}) is built here from the tiny kit,
and `pcg-synth` runs with HF_HUB_CACHE pointing at it and HF_HUB_OFFLINE=1. Nothing is
downloaded: the real huggingface_hub resolves the ids from that cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hubhelpers import COMMIT, add_to_hub_cache


@pytest.fixture(scope="module")
def hub_cache(kit_dir, tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("hf") / "hub"
    for part in ("target", "draft", "codec"):
        add_to_hub_cache(cache, f"test-org/tiny-{part}", kit_dir / part)
    return cache


def pcg_synth(args: list[str], hub: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_generate_by_hub_ids_offline(hub_cache, kit_groups, tmp_path):
    """Target by `org/name`, draft by `hf://org/name@commit`, codec by `org/name@main`."""
    out = pcg_synth(["generate", "--target", "test-org/tiny-target", "--draft", f"hf://test-org/tiny-draft@{COMMIT}",
                     "--codec", "test-org/tiny-codec@main", "--text", "Hello from the hub.", "--method", "pcg",
                     "--max-new-tokens", "12", "--device", "cpu", "--wav-dir", "wav", "--out", "run.json", "--quiet"],
                    hub_cache, tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["target"] == "test-org/tiny-target" and doc["runs"][0]["summary"]["ok"] == 1
    assert [p.name for p in (tmp_path / "wav").iterdir()] == ["000-hello-from-the-hub.wav"]


def test_a_hub_id_missing_from_the_offline_cache_says_where_it_looked(hub_cache, tmp_path):
    out = pcg_synth(["generate", "--target", "test-org/not-there", "--text", "Hi.", "--method", "ar"],
                    hub_cache, tmp_path)
    assert out.returncode == 2
    err = out.stderr.strip().splitlines()[-1]
    assert err.startswith("error: no local directory test-org/not-there; as a Hugging Face model: ")
    assert f"not in the Hugging Face cache ({hub_cache})" in err and "HF_HUB_OFFLINE=1" in err
    assert "hf download test-org/not-there" in err


def test_an_orpheus_kit_by_the_hub_ids_orpheus_and_snac_are_published_under(orpheus_kit_dir, tmp_path):
    """The Orpheus kit in a cache laid out as canopylabs/orpheus-3b-0.1-ft and
    hubertsiuzdak/snac_24khz are (SNAC's config.json and pytorch_model.bin), read offline: the
    family detected from the target, 24 kHz audio from the SNAC codec."""
    cache = tmp_path / "hub"
    add_to_hub_cache(cache, "canopylabs/orpheus-3b-0.1-ft", orpheus_kit_dir / "target")
    add_to_hub_cache(cache, "test-org/orpheus-draft", orpheus_kit_dir / "draft")
    add_to_hub_cache(cache, "hubertsiuzdak/snac_24khz", orpheus_kit_dir / "codec")
    assert sorted(p.name for p in (orpheus_kit_dir / "codec").iterdir()) == ["config.json", "pytorch_model.bin"]
    out = pcg_synth(["generate", "--target", "canopylabs/orpheus-3b-0.1-ft", "--draft", "test-org/orpheus-draft",
                     "--codec", "hubertsiuzdak/snac_24khz", "--text", "Hello from the hub.", "--method", "exact",
                     "--max-new-tokens", "21", "--device", "cpu", "--wav-dir", "wav", "--out", "run.json", "--quiet"],
                    cache, tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "run.json").read_text())
    codes = doc["runs"][0]["items"][0]["codes"]
    assert doc["runs"][0]["summary"]["settings"]["temperature"] == 0.6 and len(codes) % 7 == 0
    import soundfile as sf

    (clip,) = (tmp_path / "wav").iterdir()
    info = sf.info(clip)
    assert info.samplerate == 24_000 and info.frames == len(codes) // 7 * 2048
