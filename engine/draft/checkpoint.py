"""Training checkpoints: the trainable tensors, the optimizer state and where the run stood.

A checkpoint directory holds `trainable.safetensors` (float32, checkpoint names), `optimizer.pt`
and `state.json` (step, the run's fingerprint, the last logged record). Frozen tensors are never
copied: they are re-read from the initial draft, so checkpoints of a draft with frozen
embeddings stay small. The same format serves single-device runs (`OUT/checkpoints/step-N/`)
and Ray Train runs (reported through `ray.train.report`, kept in the run's storage).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from engine.draft.train import DraftTrainer

STATE = "state.json"


def write_checkpoint(directory: str | Path, trainer: DraftTrainer, fingerprint: dict, record: dict) -> Path:
    """Write `trainer`'s state into `directory` (created)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(trainer.trainable_state(), str(directory / "trainable.safetensors"))
    torch.save(trainer.optimizer.state_dict(), directory / "optimizer.pt")
    state = {"step": trainer.step, "fingerprint": fingerprint, "record": record}
    (directory / STATE).write_text(json.dumps(state, indent=1, sort_keys=True))
    return directory


def read_state(directory: str | Path) -> dict:
    return json.loads((Path(directory) / STATE).read_text())


def check_fingerprint(directory: str | Path, fingerprint: dict) -> None:
    """Refuse to resume a run whose settings differ.

    Raises:
        ValueError: names the first differing setting.
    """
    saved = read_state(directory)["fingerprint"]
    for key in sorted(set(saved) | set(fingerprint)):
        if saved.get(key) != fingerprint.get(key):
            raise ValueError(f"{directory} was written by a run with {key}={saved.get(key)!r}, not "
                             f"{fingerprint.get(key)!r}: use another --out, or the same settings to resume")


def load_checkpoint(directory: str | Path, trainer: DraftTrainer) -> dict:
    """Restore `trainer` (tensors, optimizer, step) from `directory`; returns its state."""
    directory = Path(directory)
    state = read_state(directory)
    trainer.load_trainable_state(load_file(str(directory / "trainable.safetensors")))
    optimizer_state = torch.load(directory / "optimizer.pt", map_location=trainer.device, weights_only=True)
    trainer.optimizer.load_state_dict(optimizer_state)
    trainer.step = int(state["step"])
    return state


def checkpoint_dirs(out: str | Path) -> list[Path]:
    """Complete checkpoints under `OUT/checkpoints/`, oldest first."""
    root = Path(out) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if (p / STATE).is_file())


def save_local(out: str | Path, trainer: DraftTrainer, fingerprint: dict, record: dict, keep: int) -> Path:
    """Write `OUT/checkpoints/step-N` atomically (a temporary sibling renamed into place) and
    keep only the newest `keep` checkpoints."""
    root = Path(out) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{trainer.step:08d}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    try:
        write_checkpoint(tmp, trainer, fingerprint, record)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    for old in checkpoint_dirs(out)[:-keep] if keep > 0 else []:
        shutil.rmtree(old)
    return final
