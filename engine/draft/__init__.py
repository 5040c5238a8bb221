"""Draft models for speculative decoding: build one from any target (`init`), distil or
fine-tune it on speech codes (`train`, one device or Ray Train), measure its acceptance
(`evaluate`). The CLI is `pcg-synth draft init | train | eval` (`engine.draft.cli`)."""

from engine.draft.evaluate import evaluate_drafts
from engine.draft.init import check_vocabularies, init_draft
from engine.draft.run import train_draft
from engine.draft.settings import TrainSettings

__all__ = ["TrainSettings", "check_vocabularies", "evaluate_drafts", "init_draft", "train_draft"]
