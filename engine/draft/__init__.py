"""Draft models for speculative decoding: build one from any target (`init`), distil or
fine-tune it on speech codes (`train`, one device or Ray Train), measure its acceptance
(`evaluate`). The CLI is `pcg-synth draft init | train | eval` (`engine.draft.cli`). The names
below load on first use, so the CLI's argument parser imports this package without torch."""

from engine import lazy_names

__all__ = ["TrainSettings", "check_vocabularies", "evaluate_drafts", "init_draft", "train_draft"]
__getattr__, __dir__ = lazy_names(__name__, {
    "TrainSettings": "engine.draft.settings", "check_vocabularies": "engine.draft.init",
    "evaluate_drafts": "engine.draft.evaluate", "init_draft": "engine.draft.init",
    "train_draft": "engine.draft.run"})
