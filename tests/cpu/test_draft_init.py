"""`draft init`: layer subsets of a target (tied and untied, sharded), whole same-vocabulary
models as drafts, and the errors (mismatched vocabularies, bad layers)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, LlamaForCausalLM

from engine.cli import main as draft_cli
from engine.draft.init import init_draft, vocabulary_view
from engine.models.loading import load_model, load_tokenizer, safetensors_files


def all_tensors(path) -> dict:
    out = {}
    for f in safetensors_files(path):
        out.update(load_file(str(f)))
    return out


def assert_loads_everywhere(path, source) -> None:
    """Our loader and transformers both load it, and agree on the speech logits."""
    ours = load_model(path, dtype="float32", tokenizer=vocabulary_view(path).tokenizer)
    assert ours.layout == vocabulary_view(source).layout
    ref = LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    ids = list(range(700, 712)) + [ours.layout.first_code + 5]
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0, :, ours.model.output_token_ids]
    got = ours.model(torch.tensor([ids]), torch.arange(len(ids))[None], ours.model.new_cache(1, 16), 16)
    torch.testing.assert_close(got[0], want, atol=1e-4, rtol=1e-4)


def test_subset_keeps_chosen_layers_in_order_and_loads_everywhere(kit_dir, tmp_path, capsys):
    out = tmp_path / "draft"
    assert draft_cli(["draft", "init", "--target", str(kit_dir / "target"), "--layers", "3,0",
                      "--out", str(out), "--quiet"]) == 0
    assert "layers [3, 0]" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["tie_word_embeddings"] is True
    target, draft = all_tensors(kit_dir / "target"), all_tensors(out)
    for new, old in enumerate((3, 0)):
        for key in ("self_attn.q_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight"):
            assert torch.equal(draft[f"model.layers.{new}.{key}"], target[f"model.layers.{old}.{key}"])
    assert torch.equal(draft["model.embed_tokens.weight"], target["model.embed_tokens.weight"])
    assert torch.equal(draft["model.norm.weight"], target["model.norm.weight"])
    assert not any(k.startswith("model.layers.2.") for k in draft) and "lm_head.weight" not in draft
    assert (out / "tokenizer.json").read_bytes() == (kit_dir / "target" / "tokenizer.json").read_bytes()
    assert_loads_everywhere(out, kit_dir / "target")


def untied_sharded_copy(kit_dir, dest):
    """The kit target with its own full-vocabulary lm_head (Llasa-8B style), in 3 shards."""
    shutil.copytree(kit_dir / "target", dest)
    tensors = load_file(str(dest / "model.safetensors"))
    (dest / "model.safetensors").unlink()
    gen = torch.Generator().manual_seed(1)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] + 0.1 * torch.randn(
        tensors["model.embed_tokens.weight"].shape, generator=gen)
    names = sorted(tensors)
    parts = [names[: len(names) // 3], names[len(names) // 3: 2 * len(names) // 3], names[2 * len(names) // 3:]]
    weight_map = {}
    for i, part in enumerate(parts, 1):
        file = f"model-{i:05d}-of-00003.safetensors"
        save_file({k: tensors[k] for k in part}, str(dest / file), metadata={"format": "pt"})
        weight_map.update({k: file for k in part})
    (dest / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config = json.loads((dest / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (dest / "config.json").write_text(json.dumps(config))
    return tensors


def test_untied_sharded_target_gives_a_full_head_in_bounded_shards(kit_dir, tmp_path):
    source = untied_sharded_copy(kit_dir, tmp_path / "untied")
    out = init_draft(tmp_path / "untied", tmp_path / "draft", layers=[0, 1, 3], max_shard_bytes=20_000_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 2  # 36 MB of embeddings + 34 MB of head
    draft = all_tensors(out)
    assert draft["lm_head.weight"].shape == source["lm_head.weight"].shape  # all 66k rows, not sliced
    assert torch.equal(draft["lm_head.weight"], source["lm_head.weight"])
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    assert_loads_everywhere(out, tmp_path / "untied")


def test_any_same_vocabulary_model_is_accepted_whole(kit_dir, tmp_path):
    out = init_draft(kit_dir / "target", tmp_path / "d", source=kit_dir / "draft")
    info = json.loads((out / "pcg_draft.json").read_text())
    assert info["layers"] == [0, 1, 2] and info["source"] == "draft"
    assert all(torch.equal(v, all_tensors(kit_dir / "draft")[k]) for k, v in all_tensors(out).items())


def test_mismatched_vocabulary_is_refused_with_a_clear_error(kit_dir, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(kit_dir / "draft", other)
    tok = AutoTokenizer.from_pretrained(str(other))
    tok.add_tokens(["<|not_in_the_target|>"])
    tok.save_pretrained(str(other))
    with pytest.raises(ValueError, match="different tokenizer vocabularies: a draft must share"):
        init_draft(kit_dir / "target", tmp_path / "d", source=other)
    assert not (tmp_path / "d").exists()  # refused before writing anything


def test_identical_tokenizer_files_load_once_and_changed_ones_anew(kit_dir, tmp_path):
    target = load_tokenizer(kit_dir / "target")
    assert load_tokenizer(kit_dir / "draft") is target  # the kit's draft carries the target's files
    other = tmp_path / "other"
    shutil.copytree(kit_dir / "draft", other)
    (other / "pcg_draft.json").write_text("{}")  # how a draft was made: no part of its tokenizer
    assert load_tokenizer(other) is target
    config = json.loads((other / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 4096}))
    changed = load_tokenizer(other)
    assert changed is not target and changed.model_max_length == 4096 != target.model_max_length
    assert load_tokenizer(kit_dir / "target") is target


@pytest.mark.parametrize("layers, message", [
    ("0,4", r"layers 0\.\.3; \[4\] do not exist"),
    ("1,1", "repeat"),
    ("0,x", "comma-separated"),
    (None, "give --layers"),
])
def test_bad_layer_choices_fail_before_writing(kit_dir, tmp_path, layers, message):
    with pytest.raises(ValueError, match=message):
        init_draft(kit_dir / "target", tmp_path / "d", layers=layers)
    assert not (tmp_path / "d").exists()


def test_refuses_to_overwrite_without_force(kit_dir, tmp_path):
    init_draft(kit_dir / "target", tmp_path / "d", layers=[0])
    with pytest.raises(FileExistsError, match="--force"):
        init_draft(kit_dir / "target", tmp_path / "d", layers=[1])
    init_draft(kit_dir / "target", tmp_path / "d", layers=[1], force=True)
    assert json.loads((tmp_path / "d" / "pcg_draft.json").read_text())["layers"] == [1]
