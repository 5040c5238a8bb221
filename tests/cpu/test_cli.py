"""`pcg-synth generate` end to end on the kit, and its error handling."""

from __future__ import annotations

import json

import pytest

from engine.cli import main


def test_generate_max_speech_ratio_cuts_a_row_at_its_texts_budget_and_says_so(kit_dir, tmp_path, capsys):
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(f'{{"id": "h{i}", "text": "Hi."}}\n' for i in range(3)))
    out = tmp_path / "codes.json"
    assert main(["generate", "--kit", str(kit_dir), "--texts-file", str(texts), "--method", "ar",
                 "--max-new-tokens", "400", "--max-speech-ratio", "1", "--device", "cpu", "--out", str(out),
                 "--quiet"]) == 0
    items = json.loads(out.read_text())["runs"][0]["items"]
    # "Hi.": 3 characters, 0.2 s at 15 a second, + 2 s = 110 codes, far below max_new_tokens
    cut = [len(i["codes"]) for i in items if i["finish_reason"] == "length"]
    assert cut and set(cut) == {110}  # how many of the three depends on the kit's bytes (its processor)
    assert all(len(i["codes"]) < 110 for i in items if i["finish_reason"] == "eos")
    notices = capsys.readouterr().err
    assert (f"[ar] {len(cut)} of 3 texts reached the token limit before the end of speech (max_new_tokens 400 "
            "or an item's own, max_speech_ratio 1.0 times the text's estimated time + 2 s, or the model's "
            "context)") in notices
    assert "raise --max-new-tokens or --max-speech-ratio" in notices


def test_generate_all_methods_writes_codes_and_statistics(kit_dir, tmp_path, capsys, monkeypatch):
    from engine.api import COMPARE_WARMUP_TOKENS, Synthesizer

    calls = []  # (method, max_new_tokens, ids) of each real decode, in order
    synthesize = Synthesizer.synthesize

    def recorded(self, items, settings, *args, **kwargs):
        calls.append((settings.method, settings.max_new_tokens,
                      tuple(getattr(item, "id", None) for item in items)))
        return synthesize(self, items, settings, *args, **kwargs)
    monkeypatch.setattr(Synthesizer, "synthesize", recorded)
    texts = tmp_path / "texts.jsonl"
    texts.write_text('{"id": "a", "text": "Hello there."}\n{"id": "b", "text": "A second one.", "seed": 9}\n')
    out = tmp_path / "codes.json"
    code = main(["generate", "--kit", str(kit_dir), "--texts-file", str(texts), "--method", "all",
                 "--max-new-tokens", "24", "--device", "cpu", "--out", str(out), "--quiet"])
    assert code == 0
    printed, notices = capsys.readouterr()
    # every rule decodes warm-up rows before any rule is timed, so the first pays no first-run costs
    methods = ["ar", "exact", "pcg", "ssd", "topk"]
    assert [(m, n) for m, n, _ in calls] == [(m, COMPARE_WARMUP_TOKENS) for m in methods] + [(m, 24) for m in methods]
    assert all(ids[0].startswith("warmup-") for _, _, ids in calls[:5])
    for method in ("ar", "exact", "pcg", "ssd", "topk"):
        assert f"\n{method} " in printed
    doc = json.loads(out.read_text())
    assert [r["summary"]["method"] for r in doc["runs"]] == ["ar", "exact", "pcg", "ssd", "topk"]
    cut = {}
    for run in doc["runs"]:
        summary = run["summary"]
        assert summary["ok"] == 2 and summary["generated_tokens"] > 0
        assert [i["id"] for i in run["items"]] == ["a", "b"]
        assert run["items"][1]["seed"] == 9
        for item in run["items"]:
            assert 0 < len(item["codes"]) <= 24
            assert item["finish_reason"] in ("eos", "length")
            assert item["stats"]["generated_tokens"] >= len(item["codes"])
        cut[summary["method"]] = sum(item["finish_reason"] == "length" for item in run["items"])
        assert summary["cut"] == cut[summary["method"]]
        if summary["method"] != "ar":
            assert len(summary["acceptance_per_position"]) == 3
            assert summary["mean_accepted_length"] >= 1.0
    # comparing rules says what speed to expect: break-even from step times measured now, and the
    # kit's verdict (its 3-layer draft costs most of its 4-layer target's step)
    # rows cut at the limit are said once for all the rules, naming the limit, where there are any
    said = ("texts that reached the token limit before the end of speech, of 2: "
            + ", ".join(f"{m} {n}" for m, n in cut.items() if n) + " (max_new_tokens 24")
    assert notices.count("reached the token limit") == (1 if any(cut.values()) else 0), notices
    assert (said in notices) == any(cut.values()), notices
    assert doc["warmup_tokens"] == COMPARE_WARMUP_TOKENS
    outlook = doc["outlook"]
    assert outlook in printed and "pays only above" in outlook
    for method in ("exact", "pcg", "ssd", "topk"):
        assert f"  {method}: " in outlook and "x `ar`" in outlook
    assert "small fraction of the target" in outlook
    # the warm-ups change no codes: a rule run alone decodes what it decoded among the others
    alone = tmp_path / "pcg.json"
    assert main(["generate", "--kit", str(kit_dir), "--texts-file", str(texts), "--method", "pcg",
                 "--max-new-tokens", "24", "--device", "cpu", "--out", str(alone), "--quiet"]) == 0
    assert json.loads(alone.read_text())["warmup_tokens"] == 0
    assert [i["codes"] for i in json.loads(alone.read_text())["runs"][0]["items"]] == \
        [i["codes"] for i in doc["runs"][2]["items"]]


@pytest.mark.parametrize("args, message", [
    (["--gamma", "0"], "gamma"),
    (["--theta", "1.5"], "theta"),
    (["--theta", "0"], "theta"),
    (["--temperature", "-1"], "temperature"),
    (["--temperature", "1e9"], "temperature"),
])
def test_bad_settings_fail_before_loading_with_the_field_named(args, message, tmp_path, capsys):
    code = main(["generate", "--target", str(tmp_path / "missing"), "--text", "hi", *args])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "missing" not in err  # settings are checked before the models


def test_generate_refuses_a_budget_above_the_models_context_in_one_line(kit_dir, capsys):
    code = main(["generate", "--kit", str(kit_dir), "--text", "hi", "--method", "ar", "--max-new-tokens", "4096",
                 "--device", "cpu", "--quiet"])
    assert code == 2
    assert capsys.readouterr().err == ("error: max_new_tokens: 4096 is above the llasa model's context of 2048 tokens "
                                       "(prompt included), which no row can exceed: give 2048 or less\n")


def test_unknown_method_and_missing_model_are_reported(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--kit", "x", "--text", "hi", "--method", "fast"])
    assert "invalid choice" in capsys.readouterr().err
    code = main(["generate", "--target", str(tmp_path / "nope"), "--method", "ar", "--text", "hi"])
    assert code == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["generate", "--kit", str(tmp_path / "no-kit"), "--text", "hi"]) == 2
    assert capsys.readouterr().err == (f"error: --kit {tmp_path / 'no-kit'}: not a tiny kit (no target/ in it); "
                                       f"build one with `pcg-synth kit build {tmp_path / 'no-kit'}`\n")


def test_audio_output_without_a_working_codec_is_refused_before_the_models_load(tmp_path, capsys):
    target = tmp_path / "not-a-model"  # were it loaded first, its own error would be the one reported
    target.mkdir()
    base = ["generate", "--target", str(target), "--method", "ar", "--text", "hi"]
    assert main([*base, "--out", str(tmp_path / "x.parquet")]) == 2
    assert capsys.readouterr().err == ("error: writing audio needs the model's codec (X-codec2 for Llasa, SNAC for "
                                       "Orpheus): give --codec DIR (or --kit DIR)\n")
    assert main([*base, "--wav-dir", str(tmp_path / "wav"), "--codec", str(tmp_path / "no-codec")]) == 2
    assert f"codec directory {tmp_path / 'no-codec'} does not exist" in capsys.readouterr().err
    assert not (tmp_path / "wav").exists()


def test_an_output_that_cannot_be_written_is_refused_before_the_models_load(kit_dir, tmp_path, capsys):
    blocker = tmp_path / "a-file"  # a folder cannot be made under a file, whoever runs the test
    blocker.write_text("")
    target = tmp_path / "not-a-model"  # were it loaded first, its own error would be the one reported
    target.mkdir()
    for flag, path in (("--out", blocker / "codes.json"), ("--wav-dir", blocker / "clips")):
        assert main(["generate", "--target", str(target), "--codec", str(kit_dir / "codec"), "--method", "ar",
                     "--text", "hi", flag, str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {flag} {path}: cannot write under ") and err.count("\n") == 1, err


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


def test_generate_writes_an_audio_dataset_and_wav_files_with_a_clip_prompt(kit_dir, tmp_path, capsys):
    import io

    import numpy as np
    import pyarrow.parquet as pq
    import soundfile as sf

    clip = tmp_path / "ref.wav"
    t = np.arange(int(0.4 * 44_100)) / 44_100
    sf.write(clip, 0.3 * np.sin(2 * np.pi * 220 * t), 44_100)
    texts = tmp_path / "items.jsonl"
    texts.write_text(
        '{"id": "plain", "text": "Hello there."}\n'
        '{"id": "cloned", "text": "Say it again.", "prompt_text": "A reference.", "prompt_audio": "ref.wav"}\n')
    out = tmp_path / "ds.parquet"
    code = main(["generate", "--kit", str(kit_dir), "--texts-file", str(texts), "--method", "exact",
                 "--max-new-tokens", "20", "--device", "cpu", "--out", str(out), "--admission", "arrival",
                 "--wav-dir", str(tmp_path / "wav"), "--quiet"])
    assert code == 0, capsys.readouterr().err
    table = pq.read_table(out)
    assert table.column("id").to_pylist() == ["plain", "cloned"]
    rows = table.to_pylist()
    cloned = rows[1]
    assert cloned["prompt_id"] is not None and cloned["method"] == "exact"
    for row in rows:
        samples, rate = sf.read(io.BytesIO(row["audio"]["bytes"]))
        assert rate == 16_000 and len(samples) == 320 * len(row["codes"])
        wav, _ = sf.read(tmp_path / "wav" / f"{row['id']}.wav")
        assert np.array_equal(wav, samples)
    assert "2 clips" in capsys.readouterr().out


def test_generate_rejects_an_unknown_output_suffix(kit_dir, capsys):
    assert main(["generate", "--kit", str(kit_dir), "--text", "hi", "--out", "x.csv"]) == 2
    assert ".parquet" in capsys.readouterr().err


def test_generate_writes_one_texts_clip_to_an_audio_file(kit_dir, tmp_path, capsys):
    import numpy as np
    import soundfile as sf

    out = tmp_path / "sub" / "hello.flac"
    code = main(["generate", "--kit", str(kit_dir), "--text", "Hello there.", "--method", "exact",
                 "--max-new-tokens", "20", "--device", "cpu", "--out", str(out), "--wav-dir", str(tmp_path / "wav"),
                 "--quiet"])
    assert code == 0, capsys.readouterr().err
    assert f"written to {out}" in capsys.readouterr().out
    clip, rate = sf.read(out)
    assert sf.info(out).format == "FLAC" and rate == 16_000 and len(clip) > 0
    same, _ = sf.read(tmp_path / "wav" / "000-hello-there.wav")  # the --wav-dir file of the same text
    assert np.array_equal(clip, same)
    assert sorted(p.name for p in out.parent.iterdir()) == ["hello.flac"]  # no working folder left
    # a file holds one clip: several texts are refused before a model loads
    assert main(["generate", "--kit", str(kit_dir), "--text", "One.", "--text", "Two.", "--out", "x.wav"]) == 2
    assert "holds the clip of one text and 2 were given: use --wav-dir" in capsys.readouterr().err


def test_decoding_flags_are_made_from_the_settings_fields(capsys):
    from engine.config import DecodingSettings

    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name, field in DecodingSettings.model_fields.items():
        assert f"--{name.replace('_', '-')}" in text, name
        assert " ".join(field.description.split()) in text, name
    assert "--max-thinning-trials" in text and "(default: 0.4)" in text and "{ar,exact,pcg,ssd,topk,all}" in text


def test_settings_are_built_from_the_flags_given_only():
    import argparse

    from engine.cli_options import add_settings_arguments, settings_from_args
    from engine.config import DecodingSettings

    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, DecodingSettings, include=["gamma", "theta", "max_new_tokens"],
                           defaults={"max_new_tokens": 64})
    settings = settings_from_args(parser.parse_args(["--gamma", "auto"]), DecodingSettings, method="exact")
    assert settings == DecodingSettings(method="exact", gamma="auto", max_new_tokens=64)
    assert settings_from_args(parser.parse_args(["--gamma", "5", "--theta", "0.3"]), DecodingSettings).gamma == 5
    with pytest.raises(SystemExit):
        parser.parse_args(["--gamma", "many"])


def test_version_and_verbose(capsys):
    import engine
    from engine.cli import build_parser

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"pcg-synth {engine.__version__}"
    parser = build_parser()
    assert parser.parse_args(["groups", "stats", "x", "-v"]).verbose  # after the command too
    assert parser.parse_args(["-v", "run", "job.yaml"]).verbose
    assert not parser.parse_args(["run", "job.yaml"]).verbose


def test_generate_names_texts_without_an_id_by_their_words():
    from engine.cli import text_id

    assert text_id(3, "Hello there, how are you today?") == "003-hello-there-how-are-you"
    assert text_id(0, "¿?") == "000"


def write_spec(tmp_path, text: str):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: t\nmodels: {target: kit/target, draft: kit/draft}\ninput: {manifests: [m.jsonl]}\n"
                    "output: {uri: out}\n" + text)
    return spec


@pytest.mark.parametrize("extra, expected", [
    ("decoding: {temprature: 0.5}\n", "decoding.temprature: no such setting (did you mean 'temperature'?)"),
    ("decodng: {temperature: 0.5}\n", "decodng: no such setting (did you mean 'decoding'?)"),
    ("resources: {rows_per_shards: 4}\n",
     "resources.rows_per_shards: no such setting (did you mean 'rows_per_shard'?)"),
    # entries of a list of settings: the sweep's model pairs, the augmentation's voice prompts
    ("kind: sweep\nsweep: {model_pairs: [{name: a, target: x, drafts: y}]}\n",
     "sweep.model_pairs.0.drafts: no such setting (did you mean 'draft'?)"),
    ("kind: augment\naugment: {prompts: [{id: v, txt: hi, codes: [1]}]}\n",
     "augment.prompts.0.txt: no such setting (did you mean 'text'?)"),
    # nothing close: the keys accepted there
    ("resources: {gpu: 1}\n", "resources.gpu: no such setting (accepted here: workers, gpus_per_worker,"),
])
def test_a_mistyped_spec_key_names_the_key_it_most_likely_meant(extra, expected, tmp_path, capsys):
    code = main(["run", str(write_spec(tmp_path, extra))])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: invalid settings: ") and expected in err
    assert "Extra inputs" not in err


def test_a_mistyped_item_field_in_a_generate_texts_file_is_named(tmp_path, capsys):
    texts = tmp_path / "texts.jsonl"
    texts.write_text('{"id": "a", "text": "Hello."}\n{"id": "b", "text": "Again.", "temprature": 0.3}\n')
    code = main(["generate", "--target", str(tmp_path / "missing"), "--texts-file", str(texts)])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {texts}:2: 'temprature' is not an item field (did you mean 'temperature'?)")
    texts.write_text('{"text": "Hello.", "speaker": "s1"}\n')
    assert main(["generate", "--target", str(tmp_path / "missing"), "--texts-file", str(texts)]) == 2
    err = capsys.readouterr().err
    assert "'speaker' is not an item field (fields: id, max_new_tokens," in err and "missing" not in err
