"""Model sets for `pcg-synth bench` that need no download.

- `tiny`: the tiny kit (`./kit` when there is one, else built once into the cache), for CPUs and tests.
- `llasa-1b-shape`: Llasa-1B's dimensions (Llama-3.2-1B body, 193,800-row vocabulary, tied
  embeddings) with random weights made by the kit's recipe (clustered speech embeddings,
  tied head), built in memory on the device; the draft is 3 of its 16 layers. Its middle
  layers write to the residual stream at `LLASA_1B_MIDDLE_SCALE` of the outer layers' size
  (see `middle_scale`): how far a layer-subset draft starts from the target is a parameter of a
  synthetic target, set there.
- any checkpoint directories (`--target`/`--draft`), e.g. real Llasa copies.

`--draft` may also name stream heads (`engine.models.streams`), which then draft instead of the
preset's draft model.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from engine.api import Synthesizer
from engine.families import detect
from engine.families.llasa import FAMILY as LLASA
from engine.io.storage import cache_dir, model_dir
from engine.kit.build import KIT_VERSION, KitSpec, build_kit, layer_subset, llama_config, random_llama, save_checkpoint
from engine.kit.tokenizer import build_tokenizer
from engine.models.device import resolve_compile, resolve_device, resolve_dtype
from engine.models.loading import LoadedModel, check_weights, empty_model, load_model, ready_for_decoding
from engine.models.streams import Heads, is_streams_dir, load_streams

PRESETS = ("tiny", "llasa-1b-shape")
LLASA_VOCAB = 193_800
# Llasa-1B = Llama-3.2-1B: hidden 2048, 16 layers, 32 heads / 8 KV heads (head_dim 64), MLP 8192.
# layer_std keeps the kit's per-layer update size (0.08 at hidden 128) relative to the width.
LLASA_1B_SPEC = KitSpec(hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
                        num_kv_heads=8, layer_std=0.08 * math.sqrt(128 / 2048))
# The paper's draft is 3 layers of the target: the first two and the last, as the kit does. Built
# in memory it is the untrained subset; a distilled one is passed with --draft (see load_synthesizer).
LLASA_1B_DRAFT_LAYERS = (0, 1, 15)
# Trained LLMs change the residual stream little in their middle layers; random weights do not.
# The preset scales what layers 2..14 write (attention output and MLP down projections) by this
# factor, chosen so that the untrained 0,1,15 subset starts clearly below 0.5 exact acceptance
# and reaching it is the distillation's work.
LLASA_1B_MIDDLE_SCALE = 0.2
PRESET_VERSION = 2  # 1: no middle scaling (no 3-layer draft could follow that target)


def middle_scale(tensors: dict[str, torch.Tensor], num_layers: int, scale: float) -> None:
    """Scale, in place, the residual writes (o_proj, down_proj) of layers 2 .. num_layers - 2."""
    for i in range(2, num_layers - 1):
        for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
            tensors[f"model.layers.{i}.{name}"].mul_(scale)


def is_kit(path: Path) -> bool:
    """A tiny kit of this version (its kit.json says so)."""
    try:
        return json.loads((Path(path) / "kit.json").read_text()).get("kit_version") == KIT_VERSION
    except (OSError, ValueError):
        return False


def tiny_kit(kit_dir: str | Path | None = None) -> Path:
    """The kit at `kit_dir`; else `./kit` when it is one (what the quickstart builds); else the
    cached seed-0 kit of this version (built on first use)."""
    if kit_dir is not None:
        if not (Path(kit_dir) / "target").is_dir():
            raise ValueError(f"{kit_dir} is not a tiny kit (no target/): `pcg-synth kit build {kit_dir}`")
        return Path(kit_dir)
    if is_kit(Path("kit")):
        print("using the tiny kit in ./kit (--kit DIR for another)", flush=True)
        return Path("kit")
    path = cache_dir() / f"kit-v{KIT_VERSION}-seed0"
    if not (path / "kit.json").is_file():
        print(f"building the tiny kit into {path} ...", flush=True)
        build_kit(path, force=True)
    return path


def kit_description(root: Path) -> dict:
    """What a kit is (its kit.json): version, content hash, how its draft was made."""
    try:
        manifest = json.loads((root / "kit.json").read_text())
    except (OSError, ValueError):
        return {}
    trained = manifest.get("draft_training")
    return {"kit_version": manifest.get("kit_version"), "kit_sha256": str(manifest.get("sha256", ""))[:16],
            "draft_made_by": (f"layer subset {manifest['spec']['draft_layers']} + distillation "
                              f"({trained.get('steps')} steps)" if trained else
                              f"layer subset {manifest.get('spec', {}).get('draft_layers')} (untrained)")}


@dataclass(frozen=True)
class ModelBuild:
    """Where a preset's in-memory models live and how they are readied for decoding.

    Attributes:
        device, dtype: where and how the models live.
        prepack: as in `ready_for_decoding` (None: where supported).
        weights: `ready_for_decoding`'s `weights` for the model built (`llasa_1b_shape`: the
            draft's; its target is always native).
        fuse: as in `ready_for_decoding`.
    """

    device: torch.device
    dtype: torch.dtype
    prepack: bool | None = None
    weights: str = "native"
    fuse: bool = True


@dataclass(frozen=True)
class LoadOptions:
    """How `load_synthesizer` loads and runs its models (the command line's names).

    Attributes:
        device: auto | cpu | cuda | cuda:N.
        dtype: auto | float32 | bfloat16 | float16.
        compile: how decode rounds run, as `ModelsSpec.compile`.
        draft_weights: the draft's weights, as `load_model`'s `weights`.
    """

    device: str = "auto"
    dtype: str = "auto"
    compile: str = "auto"
    draft_weights: str = "native"


def model_from_tensors(config: dict, tensors: dict, tokenizer, label: str, build: ModelBuild) -> LoadedModel:
    """A `LoadedModel` from in-memory HF-named tensors (what `load_model` does from disk;
    `build` places it and readies it as `ready_for_decoding`)."""
    family = detect(tokenizer, label)
    layout = family.layout(tokenizer, model_vocab_size=config["vocab_size"])
    model = empty_model(config, layout, build.device, build.dtype)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in tensors.items():
            params[name].copy_(value)
        model.head.copy_(tensors["model.embed_tokens.weight"][layout.output_token_ids()])  # tied
    ready_for_decoding(model, build.prepack, weights=build.weights, fuse=build.fuse)
    return LoadedModel(path=Path(label), model=model, tokenizer=tokenizer, layout=layout, config=config,
                       family=family)


def llasa_1b_shape(build: ModelBuild, spec: KitSpec = LLASA_1B_SPEC,
                   draft_layers: tuple[int, ...] = LLASA_1B_DRAFT_LAYERS,
                   vocab_size: int = LLASA_VOCAB, save_to: Path | None = None,
                   middle: float = LLASA_1B_MIDDLE_SCALE) -> tuple[LoadedModel, LoadedModel]:
    """(target, draft) with Llasa-1B's shape and random weights (deterministic from spec.seed).

    Args:
        build: where and how both models live; its `weights` are the draft's.
        spec: dimensions and the kit's weight recipe (tests pass a smaller one).
        draft_layers: target layers the draft keeps.
        vocab_size: rows of the embedding table (Llasa's 193,800; the head keeps 65,537).
        save_to: also write `target/` and `draft/` checkpoints there (for draft distillation).
        middle: scale of the middle layers' residual writes (`middle_scale`).
    """
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = build_tokenizer(Path(tmp) / "tok", spec.text_vocab_size)
        layout = LLASA.layout(tokenizer, model_vocab_size=vocab_size)
        gen = torch.Generator().manual_seed(spec.seed)
        spec = replace(spec, draft_layers=draft_layers)
        t_cfg = llama_config(spec, vocab_size, spec.num_layers, layout)
        d_cfg = llama_config(spec, vocab_size, len(draft_layers), layout)
        tensors = random_llama(spec, t_cfg, gen, layout)
        middle_scale(tensors, spec.num_layers, middle)
        draft_tensors = layer_subset(tensors, draft_layers)
        if save_to is not None:
            save_checkpoint(Path(save_to) / "target", t_cfg, tensors, Path(tmp) / "tok")
            save_checkpoint(Path(save_to) / "draft", d_cfg, draft_tensors, Path(tmp) / "tok")
        target = model_from_tensors(t_cfg, tensors, tokenizer, "llasa-1b-shape/target",
                                    replace(build, weights="native"))
        draft = model_from_tensors(d_cfg, draft_tensors, tokenizer,
                                   f"llasa-1b-shape/draft(layers {','.join(map(str, draft_layers))})", build)
    return target, draft


def load_synthesizer(preset: str | None, target: str | None = None, draft: str | None = None,
                     kit: str | None = None, options: LoadOptions = LoadOptions(),
                     save_preset: str | None = None) -> tuple[Synthesizer, dict]:
    """A Synthesizer for a preset or checkpoint directories, and a description of the models
    (`options`: device, dtype, how decode rounds run, the draft's weights).

    `draft` overrides a preset's draft: this is where a distilled draft (`pcg-synth draft`)
    for the `llasa-1b-shape` target goes, after `--save-preset DIR` wrote that target to disk
    for the distillation; stream heads made for the target go there too.
    """
    dev = resolve_device(options.device)
    dt = resolve_dtype(options.dtype, dev)
    compile, draft_weights = options.compile, options.draft_weights
    check_weights(draft_weights, compile)  # before the target loads
    compile = resolve_compile(compile, dev, draft_weights)
    pack = None
    dw = {"weights": draft_weights}
    if draft is not None:  # a Hub model or URI: its local copy, whose files say which drafter it is
        draft = model_dir(draft)
    heads = draft is not None and is_streams_dir(draft)
    if preset == "tiny" or (preset is None and kit is not None):
        root = tiny_kit(kit)
        tgt = load_model(root / "target", dev, dt, prepack=pack)
        drf = None if heads else load_model(draft or root / "draft", dev, dt, tokenizer=tgt.tokenizer,
                                            prepack=pack, **dw)
        desc = {"preset": "tiny", "target": str(root / "target"), "draft": str(draft or root / "draft"),
                **kit_description(root)}
    elif preset == "llasa-1b-shape":
        tgt, drf = llasa_1b_shape(ModelBuild(dev, dt, prepack=pack, weights=draft_weights),
                                  save_to=Path(save_preset) if save_preset else None)
        # The target is deterministic (seed 0), so a draft distilled against the saved copy
        # (`--save-preset DIR`, then `pcg-synth draft init --target DIR/target --layers 0,1,15`
        # and `pcg-synth draft train`) fits this target.
        if heads:
            drf = None
        elif draft is not None:
            drf = load_model(draft, dev, dt, tokenizer=tgt.tokenizer, prepack=pack, **dw)
        desc = {"preset": preset, "target": str(tgt.path), "draft": str(draft or drf.path),
                "weights": f"random (kit recipe), seed 0, middle layers x{LLASA_1B_MIDDLE_SCALE} "
                           f"(preset v{PRESET_VERSION})",
                "draft_made_by": "--draft" if draft else f"layer subset {list(LLASA_1B_DRAFT_LAYERS)} (untrained)"}
    elif preset is None:
        if target is None:
            raise ValueError("give --preset tiny|llasa-1b-shape, --kit DIR, or --target DIR --draft DIR")
        tgt = load_model(target, dev, dt, prepack=pack)
        drf = load_model(draft, dev, dt, prepack=pack, **dw) if draft and not heads else None
        desc = {"preset": None, "target": str(target), "draft": str(draft) if draft else None}
    else:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    streams: Heads | None = load_streams(draft, tgt.model) if heads else None
    if heads:
        desc["draft_made_by"] = "--draft (stream heads)"
    drafter = streams if streams is not None else drf.model if drf else None
    desc.update(dtype=str(dt).removeprefix("torch."), device=str(dev),
                target_params=tgt.model.num_parameters(),
                draft_params=drafter.num_parameters() if drafter is not None else None,
                drafter="streams" if heads else "model" if drf else None,
                prepacked=tgt.model.prepacked, compile=compile, draft_weights=draft_weights)
    for model in (tgt, drf):
        if model is not None:
            model.model.set_compile_mode(compile)
    return Synthesizer(tgt, drf, batch_size=1, streams=streams), desc


def heads_synthesizer(synth: Synthesizer, streams: str, desc: dict) -> Synthesizer:
    """A Synthesizer over `synth`'s target with the stream heads at `streams` as its drafter (the
    target shared, one copy), so a run can measure both drafters side by side; `desc` gains the
    heads' path and parameter count.

    Raises:
        ValueError: `streams` holds no stream heads, or `synth` already drafts with heads.
    """
    if synth.drafter_kind == "streams":
        raise ValueError("--streams compares stream heads with a draft model: --draft already names stream heads")
    local = model_dir(streams)
    if not is_streams_dir(local):
        raise ValueError(f"--streams {streams}: no stream heads there ({local} holds no pcg_streams.json)")
    heads = load_streams(local, synth.target.model)
    desc.update(streams=str(streams), streams_params=heads.num_parameters(), streams_count=heads.heads)
    return Synthesizer(synth.target, None, batch_size=1, streams=heads)
