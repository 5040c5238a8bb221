"""`load_tokenizer`'s fast path (no rebuild of the added tokens from the config; the
tokenizers-backed class built directly, not through `AutoTokenizer`) gives the tokenizer
transformers' full load gives, for the kit's files and in transformers 4's layout (the config lists
all 65,549 added tokens, `special_tokens_map.json`); files it cannot vouch for take the full load."""

from __future__ import annotations

import json
import shutil

from transformers import AutoTokenizer

from engine.kit.tokenizer import write_transformers4_layout
from engine.models.loading import added_tokens_in_backend, backend_class_named, load_tokenizer

MESSAGES = [
    {"role": "user", "content": "Convert the text to speech:<|TEXT_UNDERSTANDING_START|>Hello there, Bob."
                                "<|TEXT_UNDERSTANDING_END|>"},
    {"role": "assistant", "content": "<|SPEECH_GENERATION_START|><|s_12|><|s_65535|>"},
]
TEXT = "hello <|s_5|> world<|eot_id|> <|begin_of_text|>x"


def observable(tok, saved_to) -> dict:
    """Everything of a tokenizer the engine or a user can see, its saved files included."""
    ids = tok(TEXT)["input_ids"]
    tok.save_pretrained(str(saved_to))
    return {
        "class": type(tok).__name__, "vocab": tok.get_vocab(), "len": len(tok),
        "added": {i: repr(t) for i, t in tok.added_tokens_decoder.items()},
        "special": tok.special_tokens_map, "special_ids": tok.all_special_ids,
        "bos_eos_unk_pad": (tok.bos_token_id, tok.eos_token_id, tok.unk_token_id, tok.pad_token_id),
        "chat": list(tok.apply_chat_template(MESSAGES, tokenize=True, continue_final_message=True)),
        "encoded": ids, "decoded": (tok.decode(ids), tok.decode(ids, skip_special_tokens=True)),
        "max_length": tok.model_max_length, "backend": tok.backend_tokenizer.to_str(),
        "files": {f.name: f.read_bytes() for f in sorted(saved_to.iterdir())},
    }


def test_the_fast_load_equals_transformers_full_load(kit_dir, tmp_path):
    t4 = write_transformers4_layout(kit_dir / "target", tmp_path / "t4")
    hub = write_transformers4_layout(kit_dir / "target", tmp_path / "hub")  # as Llasa on the Hub: with
    shutil.copy(kit_dir / "target" / "config.json", hub / "config.json")  # its Llama config beside
    for name, path in [("kit", kit_dir / "target"), ("transformers4", t4), ("hub", hub)]:
        assert added_tokens_in_backend(path) and backend_class_named(path), name
        fast = observable(load_tokenizer(path), tmp_path / f"{name}-fast")
        full = observable(AutoTokenizer.from_pretrained(str(path)), tmp_path / f"{name}-full")
        assert [k for k in full if fast[k] != full[k]] == [], name
        assert fast["len"] == 66234 and len(fast["added"]) == 65549


def test_a_config_naming_tokens_the_backend_lacks_takes_the_full_load(kit_dir, tmp_path):
    path = write_transformers4_layout(kit_dir / "target", tmp_path / "extra")
    config = json.loads((path / "tokenizer_config.json").read_text())
    extra = {"content": "<|only_in_the_config|>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
    config["added_tokens_decoder"]["66234"] = extra
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    assert not added_tokens_in_backend(path)
    assert load_tokenizer(path).convert_tokens_to_ids("<|only_in_the_config|>") == 66234

    flags = write_transformers4_layout(kit_dir / "target", tmp_path / "flags")  # same tokens, one flag differs
    config = json.loads((flags / "tokenizer_config.json").read_text())
    first = next(iter(config["added_tokens_decoder"]))
    config["added_tokens_decoder"][first] = {**config["added_tokens_decoder"][first], "lstrip": True}
    (flags / "tokenizer_config.json").write_text(json.dumps(config))
    assert not added_tokens_in_backend(flags)

    legacy = tmp_path / "legacy"  # a config without the list beside special_tokens_map.json
    shutil.copytree(kit_dir / "target", legacy, ignore=shutil.ignore_patterns("*.safetensors"))
    (legacy / "special_tokens_map.json").write_text(json.dumps({"pad_token": "<|end_of_text|>"}))
    assert not added_tokens_in_backend(legacy)  # (the first case shows where a "no" leads)


def test_other_tokenizer_classes_custom_code_or_model_types_go_through_autotokenizer(kit_dir, tmp_path):
    t4 = write_transformers4_layout(kit_dir / "target", tmp_path / "t4")  # no config.json: tokenizer files alone
    assert backend_class_named(t4) and backend_class_named(kit_dir / "target")
    for name, change in [("class", {"tokenizer_class": "LlamaTokenizerFast"}),
                         ("code", {"auto_map": {"AutoTokenizer": [None, "tok.MyTokenizer"]}})]:
        path = tmp_path / name
        shutil.copytree(t4, path)
        config = json.loads((path / "tokenizer_config.json").read_text())
        (path / "tokenizer_config.json").write_text(json.dumps({**config, **change}))
        assert not backend_class_named(path), name
    other = tmp_path / "mistral"
    shutil.copytree(t4, other)
    (other / "config.json").write_text(json.dumps({"model_type": "mistral"}))
    assert not backend_class_named(other)
