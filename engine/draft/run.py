"""`draft train` on one device: plan (data, loss, temperature), build the trainer, resume, train,
checkpoint, export the trained draft. Ray Train workers reuse `plan_run` and `build_trainer`."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from engine.config import DecodingSettings
from engine.draft.checkpoint import (
    check_fingerprint,
    checkpoint_dirs,
    load_checkpoint,
    save_local,
)
from engine.draft.data import (
    CodeSequence,
    produced_by_engine,
    read_rows,
    sampled_temperatures,
    sampling_temperature,
    training_split,
)
from engine.draft.init import DRAFT_INFO, save_draft, vocabulary_view
from engine.draft.objective import TEACHER_LOSSES, SpeechLM, set_trainable
from engine.draft.settings import TrainSettings
from engine.draft.train import DraftTrainer, Hyper, Placement
from engine.families import family_settings
from engine.families.base import Family, SpeechLayout
from engine.io.storage import Storage
from engine.models.device import resolve_device, resolve_dtype
from engine.models.loading import check_same_vocabulary, read_config


@dataclass
class Plan:
    """What a run trains on and how, resolved from the settings and the data."""

    settings: TrainSettings
    hyper: Hyper
    layout: SpeechLayout
    draft_dir: Path
    target_dir: Path | None
    train: list[CodeSequence]
    heldout: list[CodeSequence]
    skipped: Counter
    engine_data: bool
    temperature_source: str = "given"

    @property
    def fingerprint(self) -> dict:
        return self.settings.fingerprint(self.hyper.loss, self.hyper.temperature)

    def describe(self) -> str:
        """One line: the loss and temperature chosen and why, and what is trained on."""
        data = "engine output (target samples)" if self.engine_data else "user codes"
        tokens = sum(s.num_targets for s in self.train)
        line = (f"{self.hyper.loss} loss, temperature {self.hyper.temperature:g} ({self.temperature_source}); "
                f"{data}: {len(self.train)} training sequences ({tokens} speech tokens), "
                f"{len(self.heldout)} held out")
        if self.skipped:
            line += "; skipped rows: " + ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
        return line


def resolve_loss(settings: TrainSettings, engine_data: bool) -> str:
    if settings.loss == "auto":
        if engine_data and settings.target is None:
            raise ValueError("this dataset was produced by the engine (target samples): distilling it "
                             "needs the target's distributions; give --target DIR, or --loss ce")
        return "kd" if engine_data else "ce"
    if settings.loss in TEACHER_LOSSES and settings.target is None:
        raise ValueError(f"--loss {settings.loss} needs --target DIR (the teacher)")
    return settings.loss


def resolve_temperature(settings: TrainSettings, rows: list[dict], family: Family) -> tuple[float, str]:
    """The KD / acceptance temperature and where it came from (given, the data's, the family's default)."""
    if settings.temperature is not None:
        return settings.temperature, "given"
    if (t := sampling_temperature(rows)) is not None:
        return t, "the data's sampling temperature"
    temps = sampled_temperatures(rows)
    default = family_settings(DecodingSettings(), family).temperature
    if len(temps) > 1:
        return default, (f"{family.name}'s default: the rows were sampled at {', '.join(map(str, temps))}; "
                         "set --temperature to the one you will decode at")
    return default, f"{family.name}'s default"


def plan_run(settings: TrainSettings) -> Plan:
    """Check models and data and resolve the loss, temperature and train/held-out split.

    Raises:
        ValueError: vocabularies differ, no usable rows, kd without a target, ...
    """
    storage = Storage(settings.storage)
    draft_dir = storage.local_dir(settings.draft)
    target_dir = storage.local_dir(settings.target) if settings.target else None
    view = vocabulary_view(draft_dir)
    if target_dir is not None:  # the target's tokenizer builds prompts; the draft must share it
        target_view = vocabulary_view(target_dir)
        check_same_vocabulary(target_view, view)
        view = target_view
    rows = read_rows(settings.data, storage)
    engine_data = produced_by_engine(rows)
    loss = resolve_loss(settings, engine_data)
    temperature, source = resolve_temperature(settings, rows, view.family)
    train, heldout, skipped = training_split(rows, view, settings)
    hyper = Hyper(loss=loss, temperature=temperature, batch_size=settings.batch_size,
                  micro_batch_size=settings.micro_batch_size, lr=settings.lr,
                  warmup_steps=settings.warmup_steps, weight_decay=settings.weight_decay,
                  grad_clip=settings.grad_clip, seed=settings.seed, cache_target=settings.cache_target)
    return Plan(settings, hyper, view.layout, draft_dir, target_dir, train, heldout, skipped, engine_data,
                source)


def build_trainer(plan: Plan, device: torch.device, rank: int = 0, world: int = 1,
                  wrap=None) -> DraftTrainer:
    """Load the draft (float32 master weights) and the target, choose the trainable parts.
    With bfloat16 (`dtype` auto on CUDA and on CPUs with native bf16 instructions), the target
    runs in bfloat16 and the draft's forward under bfloat16 autocast.

    Args:
        wrap: turns the draft into the module called for training (Ray's `prepare_model`).
    """
    s = plan.settings
    low = resolve_dtype(s.dtype, device) == torch.bfloat16
    output_ids = plan.layout.output_token_ids()
    draft = SpeechLM.load(plan.draft_dir, output_ids, torch.float32, device)
    set_trainable(draft, s.trainable)
    target = None
    if plan.target_dir is not None:
        target = SpeechLM.load(plan.target_dir, output_ids, torch.bfloat16 if low else torch.float32, device)
        target.eval().requires_grad_(False)
    forward = wrap(draft) if wrap is not None else draft
    return DraftTrainer(plan.hyper, draft, target, plan.layout, plan.train, plan.heldout,
                        Placement(device, forward=forward, rank=rank, world=world, autocast=low))


def export_trained(plan: Plan, tensors: dict[str, torch.Tensor], out: Path, record: dict) -> Path:
    """The trained draft as a Hugging Face checkpoint in `out`: the initial draft with the
    trained tensors written back (cast to their stored dtype), plus `training.json`."""
    info_file = plan.draft_dir / DRAFT_INFO
    info = json.loads(info_file.read_text()) if info_file.is_file() else {"source": plan.draft_dir.name}
    info["trained"] = {"loss": plan.hyper.loss, "temperature": plan.hyper.temperature,
                       "steps": record.get("step"), "trainable": plan.settings.trainable,
                       "final": record}
    layers = list(range(read_config(plan.draft_dir)["num_hidden_layers"]))
    save_draft(plan.draft_dir, layers, out, info, overrides=tensors)
    summary = {"settings": plan.settings.model_dump(), "loss": plan.hyper.loss,
               "temperature": plan.hyper.temperature, "engine_data": plan.engine_data,
               "train_sequences": len(plan.train), "heldout_sequences": len(plan.heldout),
               "skipped_rows": dict(plan.skipped), "final": record}
    (out / "training.json").write_text(json.dumps(summary, indent=1))
    return out


def check_out(out: Path, draft_dir: Path) -> None:
    if out.resolve() == draft_dir.resolve():
        raise ValueError(f"--out {out} is the initial draft itself: write the trained draft elsewhere")


class JsonlLog:
    """`train_log.jsonl`: one record per step; on resume, records after the checkpoint are
    dropped so the log reads as one uninterrupted run."""

    def __init__(self, path: Path, resumed_step: int) -> None:
        self.path = path
        kept = []
        if path.is_file():
            kept = [line for line in path.read_text().splitlines()
                    if line.strip() and json.loads(line)["step"] <= resumed_step]
        path.write_text("".join(line + "\n" for line in kept))

    def __call__(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if "heldout_loss" in record:
            tqdm.write(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in record.items()}))


def train_draft(settings: TrainSettings, progress: bool = True) -> dict:
    """Train on this machine (one device), resuming from `OUT/checkpoints` when it holds a
    checkpoint of the same run; returns the last logged record."""
    plan = plan_run(settings)
    out = Path(settings.out)
    check_out(out, plan.draft_dir)
    latest = checkpoint_dirs(out)[-1] if checkpoint_dirs(out) else None
    if latest is not None:
        check_fingerprint(latest, plan.fingerprint)  # before loading any model
    print(plan.describe())
    out.mkdir(parents=True, exist_ok=True)
    trainer = build_trainer(plan, resolve_device(settings.device))
    if settings.cache_target and not trainer.caches_for(settings.steps):
        print(f"cache-target: {settings.steps} steps stay within one epoch ({trainer.steps_per_epoch} steps): "
              "no sequence comes back, so no target logits are kept")
    if latest is not None:
        load_checkpoint(latest, trainer)
        if progress:
            print(f"resuming from {latest} (step {trainer.step})")
    log = JsonlLog(out / "train_log.jsonl", trainer.step)

    def checkpoint(t: DraftTrainer, record: dict) -> None:
        save_local(out, t, plan.fingerprint, record, settings.keep_checkpoints)

    record = trainer.run(settings.steps, settings.eval_every, settings.checkpoint_every, log,
                         checkpoint, progress)
    if trainer.step == 0 or "loss" not in record:  # nothing left to do: report the checkpoint's
        record = json.loads((checkpoint_dirs(out)[-1] / "state.json").read_text())["record"]
    export_trained(plan, trainer.trainable_state(), out, record)
    return record
