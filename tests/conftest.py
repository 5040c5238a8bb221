"""Shared fixtures: the tiny kit is built once per test session (about 12 s on 2 cores)."""

from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def kit_dir(tmp_path_factory):
    """A freshly built tiny kit (target, draft, codec) shared by the whole session."""
    from engine.models.tiny import build_kit

    return build_kit(tmp_path_factory.mktemp("kit") / "kit")


@pytest.fixture(scope="session")
def kit_synth(kit_dir):
    """A float32 CPU Synthesizer over the kit's target and draft."""
    from engine import Synthesizer

    return Synthesizer.load(kit_dir / "target", draft=kit_dir / "draft", device="cpu",
                            dtype="float32", batch_size=4)


@pytest.fixture(scope="session")
def kit_groups(kit_synth):
    """Acoustic similarity groups of the kit target at theta 0.4, built once."""
    from engine.groups.build import build_groups

    return build_groups(kit_synth.speech_embeddings(), 0.4)
