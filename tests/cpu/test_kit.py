"""The tiny model kit: formats, layout, determinism and a target that is not near-uniform."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, Xcodec2Model

from engine import DecodingSettings
from engine.families.llasa import FAMILY as LLASA
from engine.kit import KitSpec, build_kit


def test_kit_has_real_formats_and_llasa_layout(kit_dir):
    for part in ("target", "draft"):
        for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            assert (kit_dir / part / name).is_file(), (part, name)
    tok = AutoTokenizer.from_pretrained(str(kit_dir / "target"))
    layout = LLASA.layout(tok)
    assert layout.num_codes == 65536
    assert tok.convert_tokens_to_ids("<|s_65535|>") == layout.first_code + 65535
    codec = Xcodec2Model.from_pretrained(str(kit_dir / "codec"))
    audio = codec.decode(torch.randint(0, 65536, (1, 1, 5))).audio_values
    assert audio.shape[-1] == 5 * 320
    manifest = json.loads((kit_dir / "kit.json").read_text())
    assert manifest["layout"]["first_code"] == layout.first_code


def test_draft_has_the_chosen_layers_and_the_targets_embeddings(kit_dir):
    """Built by `engine.draft` (init, then distillation: see test_draft_train.py)."""
    target = load_file(str(kit_dir / "target" / "model.safetensors"))
    draft = load_file(str(kit_dir / "draft" / "model.safetensors"))
    chosen = KitSpec().draft_layers
    assert json.loads((kit_dir / "draft" / "config.json").read_text())["num_hidden_layers"] == len(chosen)
    assert torch.equal(draft["model.embed_tokens.weight"], target["model.embed_tokens.weight"])
    assert not any(k.startswith(f"model.layers.{len(chosen)}.") for k in draft)


def test_kit_build_is_deterministic_and_refuses_to_overwrite(kit_dir, tmp_path):
    again = build_kit(tmp_path / "kit")
    first = json.loads((kit_dir / "kit.json").read_text())["sha256"]
    assert json.loads((again / "kit.json").read_text())["sha256"] == first
    with pytest.raises(FileExistsError, match="force"):
        build_kit(again)


def test_target_is_peaked_and_standard_sd_acceptance_is_intermediate(kit_synth):
    texts = ["The quick brown fox.", "Call Stella and ask her.", "One, two, three.", "Hong Kong."]
    results, summary = kit_synth.synthesize(
        texts, DecodingSettings(method="exact", max_new_tokens=64, seed=5))
    acceptance = sum(summary.stats.accepted) / summary.stats.drafted
    assert 0.1 < acceptance < 0.9, acceptance
    # entropy of the target's next-token distribution on its own samples, in nats
    model, layout = kit_synth.target.model, kit_synth.target.layout
    ids = kit_synth.prompter.build(texts[0]) + [layout.first_code + c for c in results[0].codes]
    logits = model(torch.tensor([ids]), torch.arange(len(ids))[None],
                   model.new_cache(1, len(ids) + 1), len(ids))[0, -32:]
    probs = torch.softmax(logits / 0.8, -1)
    entropy = -(probs * probs.clamp_min(1e-30).log()).sum(-1).mean().item()
    assert entropy < 0.8 * math.log(65537), entropy
