"""`pcg-synth generate` end to end on the kit, and its error handling."""

from __future__ import annotations

import json

import pytest

from engine.cli import main


def test_generate_all_methods_writes_codes_and_statistics(kit_dir, tmp_path, capsys):
    texts = tmp_path / "texts.jsonl"
    texts.write_text('{"id": "a", "text": "Hello there."}\n{"id": "b", "text": "A second one.", "seed": 9}\n')
    out = tmp_path / "codes.json"
    code = main(["generate", "--kit", str(kit_dir), "--texts-file", str(texts), "--method", "all",
                 "--max-new-tokens", "24", "--device", "cpu", "--out", str(out), "--quiet"])
    assert code == 0
    printed = capsys.readouterr().out
    for method in ("ar", "exact", "pcg", "ssd", "topk"):
        assert f"\n{method} " in printed
    doc = json.loads(out.read_text())
    assert [r["summary"]["method"] for r in doc["runs"]] == ["ar", "exact", "pcg", "ssd", "topk"]
    for run in doc["runs"]:
        summary = run["summary"]
        assert summary["ok"] == 2 and summary["generated_tokens"] > 0
        assert [i["id"] for i in run["items"]] == ["a", "b"]
        assert run["items"][1]["seed"] == 9
        for item in run["items"]:
            assert 0 < len(item["codes"]) <= 24
            assert item["finish_reason"] in ("eos", "length")
            assert item["stats"]["generated_tokens"] >= len(item["codes"])
        if summary["method"] != "ar":
            assert len(summary["acceptance_per_position"]) == 3
            assert summary["mean_accepted_length"] >= 1.0


@pytest.mark.parametrize("args, message", [
    (["--gamma", "0"], "gamma"),
    (["--theta", "1.5"], "theta"),
    (["--theta", "0"], "theta"),
    (["--temperature", "-1"], "temperature"),
])
def test_bad_settings_fail_before_loading_with_the_field_named(args, message, tmp_path, capsys):
    code = main(["generate", "--target", str(tmp_path / "missing"), "--text", "hi", *args])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "missing" not in err  # settings are checked before the models


def test_unknown_method_and_missing_model_are_reported(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--kit", "x", "--text", "hi", "--method", "fast"])
    assert "invalid choice" in capsys.readouterr().err
    code = main(["generate", "--target", str(tmp_path / "nope"), "--method", "ar", "--text", "hi"])
    assert code == 2
    assert "does not exist" in capsys.readouterr().err


def test_mismatched_draft_vocabulary_is_refused(kit_dir, tmp_path, capsys):
    import shutil

    from transformers import AutoTokenizer

    draft = tmp_path / "draft"
    shutil.copytree(kit_dir / "draft", draft)
    tok = AutoTokenizer.from_pretrained(str(draft))
    tok.add_tokens(["<|extra_token|>"])
    tok.save_pretrained(str(draft))
    code = main(["generate", "--target", str(kit_dir / "target"), "--draft", str(draft),
                 "--text", "hi", "--method", "exact", "--device", "cpu"])
    assert code == 2
    assert "vocabular" in capsys.readouterr().err
