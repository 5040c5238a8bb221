"""The tiny kit's draft, produced by the path users take: `init_draft` (a layer subset of the
target), target samples from the engine's `ar` path, then a short knowledge distillation with
`DraftTrainer`. Deterministic: counter-based sampling, a seeded data order, CPU float32."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.draft.data import CodeSequence
from engine.draft.init import DRAFT_INFO, init_draft, save_draft
from engine.draft.objective import SpeechLM, set_trainable
from engine.draft.settings import DEFAULT_TRAINABLE
from engine.draft.train import DraftTrainer, Hyper, Placement
from engine.models.loading import read_config

# Disjoint from `engine.draft.evaluate.HELDOUT_TEXTS` and from the texts tests and the
# quickstart decode.
KIT_TRAIN_TEXTS = [
    "A gentle breeze moved through the tall grass by the river.",
    "She opened the window and listened to the rain.",
    "Seven small boats sailed past the lighthouse at dawn.",
    "Our train leaves the station at a quarter past nine.",
    "He wrote the letter slowly, choosing every word with care.",
    "The museum will be closed on Monday for repairs.",
    "Bright lanterns hung above the narrow street.",
    "Could you pass me the salt and the pepper, please?",
    "Thunder rolled across the valley late in the evening.",
    "The children built a castle of sand and shells.",
    "Fresh bread was cooling on the kitchen table.",
    "We counted forty stars before the clouds returned.",
    "An old clock ticked quietly in the empty hall.",
    "The committee approved the plan after a long debate.",
    "Snow covered the mountain road until April.",
    "My grandmother grew tomatoes, beans and sunflowers.",
    "The violinist tuned her instrument before the concert.",
    "Twelve geese flew south over the frozen lake.",
    "Please remember to lock the back door tonight.",
    "The library keeps its rarest maps in a locked room.",
    "A yellow taxi stopped at the corner of the square.",
    "They painted the fence white on a sunny afternoon.",
    "The soup needs a little more salt and some pepper.",
    "Every morning he walks the dog along the beach.",
    "Scientists measured the depth of the ocean trench.",
    "The baker sold out of croissants before eight.",
    "Heavy fog delayed all flights from the northern airport.",
    "Her laughter echoed through the quiet corridor.",
    "The farmer counted his sheep twice before sunset.",
    "We need three volunteers to help with the festival.",
    "A tiny spider spun its web across the doorway.",
    "The orchestra played the final movement with great energy.",
]


@dataclass(frozen=True)
class KitDraftRecipe:
    """How the kit's draft is distilled (the acceptance it reaches: docs/performance.md)."""

    steps: int = 24
    batch_size: int = 8
    lr: float = 3e-3
    warmup_steps: int = 5
    temperature: float = 0.8
    max_new_tokens: int = 64
    trainable: tuple[str, ...] = DEFAULT_TRAINABLE


def sample_sequences(target: Path, texts: Sequence[str], max_new_tokens: int, temperature: float,
                     seed: int) -> list[CodeSequence]:
    """Target samples from the engine's `ar` path (what `pcg-synth generate --method ar` makes),
    as training sequences (end-of-speech kept where the target emitted it)."""
    from engine.api import Synthesizer
    from engine.config import DecodingSettings

    synth = Synthesizer.load(target, device="cpu", dtype="float32", batch_size=len(texts))
    settings = DecodingSettings(method="ar", temperature=temperature, max_new_tokens=max_new_tokens,
                                seed=seed)
    results, _ = synth.synthesize(list(texts), settings)
    layout, seqs = synth.target.layout, []
    for text, res in zip(texts, results):
        prompt = synth.prompter.build(text)
        ids = prompt + layout.token_ids(res.codes)
        ids += [layout.eos_token] if res.finish_reason == "eos" else []
        seqs.append(CodeSequence(ids=tuple(ids), start=len(prompt), text=text))
    return seqs


def distil(init_dir: Path, target: Path, seqs: list[CodeSequence], recipe: KitDraftRecipe,
           seed: int) -> tuple[dict[str, torch.Tensor], list[float]]:
    """KD of the draft at `init_dir` on `seqs`; (trained tensors, loss per step)."""
    from engine.draft.init import vocabulary_view

    layout = vocabulary_view(target).layout
    draft = SpeechLM.load(init_dir, layout.output_token_ids())
    set_trainable(draft, recipe.trainable)
    teacher = SpeechLM.load(target, layout.output_token_ids()).eval().requires_grad_(False)
    hyper = Hyper(loss="kd", temperature=recipe.temperature, batch_size=recipe.batch_size,
                  lr=recipe.lr, warmup_steps=recipe.warmup_steps, seed=seed, cache_target=True)
    trainer = DraftTrainer(hyper, draft, teacher, layout, seqs, [], Placement(torch.device("cpu")))
    losses = [trainer.train_step()["loss"] for _ in range(recipe.steps)]
    return trainer.trainable_state(), losses


def kit_samples(target: Path, recipe: KitDraftRecipe, seed: int) -> list[CodeSequence]:
    """The target samples the kit's draft and stream heads are distilled on."""
    return sample_sequences(target, KIT_TRAIN_TEXTS, recipe.max_new_tokens, recipe.temperature, seed)


def build_kit_draft(target: Path, out: Path, layers: Sequence[int], recipe: KitDraftRecipe,
                    seed: int, seqs: list[CodeSequence]) -> dict:
    """Write the kit's draft, distilled on `seqs`, to `out` (created); returns what training did."""
    init_dir = out.parent / f".{out.name}-init"
    init_draft(target, init_dir, layers, force=True)
    try:
        tensors, losses = distil(init_dir, target, seqs, recipe, seed)
        info = json.loads((init_dir / DRAFT_INFO).read_text())
        info["trained"] = {"loss": "kd", "temperature": recipe.temperature, "steps": recipe.steps,
                           "sequences": len(seqs), "tokens": sum(s.num_targets for s in seqs),
                           "trainable": list(recipe.trainable),
                           "loss_first": round(losses[0], 6), "loss_last": round(losses[-1], 6)}
        out.mkdir(parents=True, exist_ok=True)
        layers_now = list(range(read_config(init_dir)["num_hidden_layers"]))
        save_draft(init_dir, layers_now, out, info, overrides=tensors)
        return info["trained"]
    finally:
        shutil.rmtree(init_dir, ignore_errors=True)


@dataclass(frozen=True)
class KitStreamsRecipe:
    """How the kit's stream heads are distilled (`engine.draft.streams`), on the draft's samples."""

    heads: int = 4
    steps: int = 60
    anchors: int = 16
    lr: float = 1e-2
    warmup_steps: int = 10


def build_kit_streams(target: Path, out: Path, recipe: KitStreamsRecipe, temperature: float, seed: int,
                      seqs: list[CodeSequence]) -> dict:
    """Write the kit's stream heads, distilled on `seqs`, to `out`; returns what training did."""
    from engine.draft.streams import HeadsHyper, train_heads
    from engine.models.loading import load_model

    model = load_model(target, device="cpu", dtype="float32", prepack=False).model
    hyper = HeadsHyper(heads=recipe.heads, temperature=temperature, steps=recipe.steps, anchors=recipe.anchors,
                       lr=recipe.lr, warmup_steps=recipe.warmup_steps, seed=seed)
    return train_heads(model, target.name, seqs, [], out, hyper)
