"""`draft train` / `draft eval` on the tiny kit: data handling, distillation that works (loss
down, held-out acceptance up, a better draft in real decoding), resume, cross-entropy on a
user's code dataset, and the kit's own draft coming out of this path."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from engine import DecodingSettings, Synthesizer
from engine.cli import main as draft_cli
from engine.draft.data import (
    make_batch,
    produced_by_engine,
    read_rows,
    sampling_temperature,
    split_heldout,
    to_sequences,
)
from engine.draft.evaluate import HELDOUT_TEXTS
from engine.draft.init import init_draft, vocabulary_view
from engine.draft.objective import kd_loss_sum, tv_loss_sum
from engine.draft.run import plan_run, train_draft
from engine.draft.settings import TrainSettings
from engine.families.llasa import LlasaPrompter
from engine.io.dataset import AudioRow, build_table, write_parquet
from engine.kit.draft import KIT_TRAIN_TEXTS


@pytest.fixture(scope="module")
def engine_data(kit_synth, tmp_path_factory):
    """Target samples in the engine's output schema (Parquet): 20 texts of up to 24 codes, plus
    a row the engine could not decode (an error record)."""
    settings = DecodingSettings(method="ar", max_new_tokens=24, seed=1)
    results, _ = kit_synth.synthesize(KIT_TRAIN_TEXTS[:20] + [" "], settings, batch_size=8)
    path = tmp_path_factory.mktemp("data") / "samples.parquet"
    write_parquet(build_table([AudioRow(result=r) for r in results], settings, 16000), path)
    return path


@pytest.fixture(scope="module")
def init_dir(kit_dir, tmp_path_factory):
    return init_draft(kit_dir / "target", tmp_path_factory.mktemp("init") / "draft", layers=[0, 1, 3])


def settings(engine_data, init_dir, kit_dir, out, **kw) -> TrainSettings:
    base = dict(data=str(engine_data), draft=str(init_dir), target=str(kit_dir / "target"), out=str(out),
                batch_size=2, lr=2e-3, warmup_steps=10, heldout_fraction=0.2, seed=3)
    return TrainSettings(**{**base, **kw})


def test_engine_dataset_becomes_prompt_plus_codes_with_speech_only_labels(engine_data, kit_dir):
    rows = read_rows(str(engine_data))
    view = vocabulary_view(kit_dir / "target")
    seqs, skipped = to_sequences(rows, LlasaPrompter(view.tokenizer, view.layout), view.layout, 2048)
    assert skipped == {"error record": 1} and len(seqs) == 20
    layout = view.layout
    for row, seq in zip(rows, seqs):
        assert seq.ids[seq.start - 1] == layout.control("speech_start")
        codes = [i - layout.first_code for i in seq.ids[seq.start:] if i != layout.eos_token]
        assert codes == row["codes"]
        assert (seq.ids[-1] == layout.eos_token) == (row["finish_reason"] == "eos")
    batch = make_batch(seqs[:3], layout)
    n = sum(s.num_targets for s in seqs[:3])
    assert batch.labels.shape == (n,) and int(batch.labels.max()) <= layout.eos_out
    # every trained position predicts the next token of its own row, from the speech part only
    for r, c, label in zip(batch.rows.tolist(), batch.cols.tolist(), batch.labels.tolist()):
        nxt = seqs[r].ids[c + 1]
        assert c + 1 >= seqs[r].start
        assert label == (layout.eos_out if nxt == layout.eos_token else nxt - layout.first_code)
    train, held = split_heldout(seqs, 0.2, 64)
    assert held and not {s.text for s in train} & {s.text for s in held}


def test_generate_json_output_is_training_data_with_its_settings_and_voice_prompts(kit_dir, tmp_path):
    """`generate --out x.json` needs no codec; `draft train --data x.json` reads it (settings ->
    engine data, kd at the sampling temperature; voice-prompt codes kept in the sequence)."""
    texts = tmp_path / "texts.jsonl"
    texts.write_text(json.dumps({"id": "a", "text": "Plain text here."}) + "\n"
                     + json.dumps({"id": "b", "text": "With a voice.", "prompt_text": "Hi.",
                                   "prompt_codes": [5, 6, 7]}) + "\n")
    out = tmp_path / "samples.json"
    assert draft_cli(["generate", "--target", str(kit_dir / "target"), "--texts-file", str(texts),
                      "--method", "ar", "--temperature", "0.7", "--max-new-tokens", "12",
                      "--device", "cpu", "--out", str(out), "--quiet"]) == 0
    rows = read_rows(str(out))
    assert [r["id"] for r in rows] == ["a", "b"] and rows[1]["prompt_codes"] == [5, 6, 7]
    assert produced_by_engine(rows) and sampling_temperature(rows) == 0.7
    view = vocabulary_view(kit_dir / "target")
    layout = view.layout
    seqs, skipped = to_sequences(rows, LlasaPrompter(view.tokenizer, view.layout), layout, 2048)
    assert not skipped and len(seqs) == 2
    for row, seq in zip(rows, seqs):
        codes = [i - layout.first_code for i in seq.ids[seq.start:] if i != layout.eos_token]
        assert codes == row["codes"]
    assert [i - layout.first_code for i in seqs[1].ids[seqs[1].start - 3:seqs[1].start]] == [5, 6, 7]
    # the plan says what it chose and why; rows sampled at several temperatures -> told to pick one
    def plan_of(data):
        return plan_run(TrainSettings(data=str(data), draft=str(kit_dir / "draft"), target=str(kit_dir / "target"),
                                      out=str(tmp_path / "never"), heldout_fraction=0.0))

    assert plan_of(out).describe().startswith("kd loss, temperature 0.7 (the data's sampling temperature)")
    doc = json.loads(out.read_text())
    doc["runs"].append(json.loads(json.dumps(doc["runs"][0])))
    doc["runs"][1]["summary"]["settings"]["temperature"] = 1.0
    (tmp_path / "mixed.json").write_text(json.dumps(doc))
    mixed = plan_of(tmp_path / "mixed.json")
    assert mixed.hyper.temperature == 0.8 and "sampled at 0.7, 1.0; set --temperature" in mixed.describe()
    assert "4 training sequences" in mixed.describe()
    # other JSON is refused with a clear message; a directory's JSON files are not data
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "summary.json").write_text(json.dumps({"job": "x"}))
    with pytest.raises(ValueError, match="not a `pcg-synth generate"):
        read_rows(str(job_dir / "summary.json"))
    with pytest.raises(ValueError, match="no .parquet or .jsonl files"):
        read_rows(str(job_dir))


def test_fused_kd_loss_matches_autograd_reference():
    gen = torch.Generator().manual_seed(0)
    draft = torch.randn(6, 50, generator=gen, dtype=torch.float64, requires_grad=True)
    target = torch.randn(6, 50, generator=gen, dtype=torch.float64)
    ref_target = F.log_softmax(target / 0.8, -1)
    ref = (ref_target.exp() * (ref_target - F.log_softmax(draft / 0.8, -1))).sum()
    (grad_ref,) = torch.autograd.grad(ref, draft)
    ours = kd_loss_sum(draft, target, 0.8)
    (grad,) = torch.autograd.grad(ours, draft)
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(grad, grad_ref)
    assert kd_loss_sum(target, target, 0.8).abs() < 1e-9  # KL(q || q) = 0


def test_fused_tv_loss_is_one_minus_acceptance_with_the_autograd_gradient():
    gen = torch.Generator().manual_seed(1)
    draft = torch.randn(6, 50, generator=gen, dtype=torch.float64, requires_grad=True)
    target = torch.randn(6, 50, generator=gen, dtype=torch.float64)
    ref = (1 - torch.minimum(torch.softmax(draft / 0.8, -1), torch.softmax(target / 0.8, -1)).sum(-1)).sum()
    (grad_ref,) = torch.autograd.grad(ref, draft)
    ours = tv_loss_sum(draft, target, 0.8)
    (grad,) = torch.autograd.grad(ours, draft)
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(grad, grad_ref)
    assert tv_loss_sum(target, target, 0.8).abs() < 1e-9  # identical distributions: always accepted


def test_tv_distillation_raises_heldout_acceptance(engine_data, init_dir, kit_dir, tmp_path):
    out = tmp_path / "tv"
    code = draft_cli(["draft", "train", "--data", str(engine_data), "--draft", str(init_dir),
                      "--target", str(kit_dir / "target"), "--out", str(out), "--steps", "60",
                      "--loss", "tv", "--batch-size", "2", "--lr", "2e-3", "--warmup-steps", "10",
                      "--heldout-fraction", "0.2", "--eval-every", "60", "--checkpoint-every", "0",
                      "--cache-target", "--seed", "3", "--quiet"])
    assert code == 0
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert json.loads((out / "training.json").read_text())["loss"] == "tv"
    assert log[-1]["heldout_acceptance"] > log[0]["heldout_acceptance"]
    # the tv loss is the held-out rejection rate: 1 - acceptance, to float precision
    assert abs(log[-1]["heldout_loss"] - (1 - log[-1]["heldout_acceptance"])) < 1e-4


def test_distillation_lowers_the_loss_and_raises_heldout_acceptance(engine_data, init_dir, kit_dir, tmp_path):
    out = tmp_path / "trained"
    code = draft_cli(["draft", "train", "--data", str(engine_data), "--draft", str(init_dir),
                      "--target", str(kit_dir / "target"), "--out", str(out), "--steps", "200",
                      "--batch-size", "2", "--lr", "2e-3", "--warmup-steps", "10",
                      "--heldout-fraction", "0.2", "--eval-every", "100", "--checkpoint-every", "0",
                      "--cache-target", "--seed", "3", "--quiet"])
    assert code == 0
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(201))
    first, last = log[1], log[-1]
    assert last["loss"] < 0.5 * first["loss"], (first, last)
    assert last["heldout_loss"] < log[0]["heldout_loss"]
    assert last["heldout_acceptance"] > log[0]["heldout_acceptance"] + 0.1, (log[0], last)
    training = json.loads((out / "training.json").read_text())
    assert training["loss"] == "kd" and training["temperature"] == 0.8 and training["engine_data"]
    assert training["skipped_rows"] == {"error record": 1}
    # frozen parts are the initial draft's, trained ones moved
    before, after = load_file(str(init_dir / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert torch.equal(before["model.embed_tokens.weight"], after["model.embed_tokens.weight"])
    assert not torch.equal(before["model.layers.0.mlp.up_proj.weight"], after["model.layers.0.mlp.up_proj.weight"])
    # the trained draft loads and decodes with the engine
    synth = Synthesizer.load(kit_dir / "target", draft=out, device="cpu", dtype="float32", batch_size=2)
    results, summary = synth.synthesize(["Hello there.", "Two texts."],
                                        DecodingSettings(method="exact", max_new_tokens=16))
    assert all(r.codes and r.finish_reason in ("eos", "length") for r in results)
    assert summary.stats.drafted > 0


def test_eval_trained_draft_accepts_more_than_the_untrained_subset(kit_dir, init_dir, tmp_path, capsys):
    """The kit's draft is the subset `init_dir` holds, distilled by this path (`build_kit`)."""
    out, texts = tmp_path / "eval.json", tmp_path / "texts.txt"
    texts.write_text("\n".join(HELDOUT_TEXTS[:8]))
    code = draft_cli(["draft", "eval", "--target", str(kit_dir / "target"), "--draft", str(init_dir),
                      "--draft", str(kit_dir / "draft"), "--texts-file", str(texts),
                      "--max-new-tokens", "40", "--device", "cpu", "--out", str(out), "--quiet"])
    assert code == 0 and "exact" in capsys.readouterr().out
    drafts = json.loads(out.read_text())["drafts"]
    before, after = drafts[str(init_dir)], drafts[str(kit_dir / "draft")]
    for method in ("exact", "pcg"):
        assert len(after[method]["acceptance_per_position"]) == 3
    assert after["exact"]["mean_accepted_length"] > before["exact"]["mean_accepted_length"] + 0.2, drafts
    assert after["pcg"]["mean_accepted_length"] > before["pcg"]["mean_accepted_length"], drafts


def test_kit_draft_comes_from_this_path(kit_dir):
    info = json.loads((kit_dir / "draft" / "pcg_draft.json").read_text())
    assert info["layers"] == [0, 1, 3] and info["trained"]["loss"] == "kd"
    assert info["trained"]["loss_last"] < 0.6 * info["trained"]["loss_first"]
    target, draft = load_file(str(kit_dir / "target" / "model.safetensors")), load_file(
        str(kit_dir / "draft" / "model.safetensors"))
    assert torch.equal(draft["model.embed_tokens.weight"], target["model.embed_tokens.weight"])  # frozen
    assert not torch.equal(draft["model.layers.2.self_attn.q_proj.weight"],
                           target["model.layers.3.self_attn.q_proj.weight"])  # trained from layer 3


def test_resume_continues_where_it_stopped(engine_data, init_dir, kit_dir, tmp_path):
    kw = dict(eval_every=0, checkpoint_every=2, heldout_fraction=0.0)
    straight = train_draft(settings(engine_data, init_dir, kit_dir, tmp_path / "a", steps=4, **kw), progress=False)
    train_draft(settings(engine_data, init_dir, kit_dir, tmp_path / "b", steps=2, **kw), progress=False)
    resumed = train_draft(settings(engine_data, init_dir, kit_dir, tmp_path / "b", steps=4, **kw), progress=False)
    assert resumed["loss"] == straight["loss"] and resumed["step"] == 4
    a, b = load_file(str(tmp_path / "a" / "model.safetensors")), load_file(str(tmp_path / "b" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    steps = [json.loads(x)["step"] for x in (tmp_path / "b" / "train_log.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="lr=0.002.*not 0.001"):
        train_draft(settings(engine_data, init_dir, kit_dir, tmp_path / "b", steps=6, lr=1e-3, **kw))


def test_user_code_dataset_trains_with_cross_entropy(init_dir, kit_dir, tmp_path):
    data = tmp_path / "codes.jsonl"
    rows = [{"text": t, "codes": [(7 * i + 13 * k) % 65536 for k in range(12)]}
            for i, t in enumerate(KIT_TRAIN_TEXTS[:6])]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = TrainSettings(data=str(data), draft=str(init_dir), out=str(tmp_path / "ce"), steps=8, batch_size=6,
                      lr=3e-3, warmup_steps=0, heldout_fraction=0.0, eval_every=0, checkpoint_every=0)
    record = train_draft(s, progress=False)
    log = [json.loads(x) for x in (tmp_path / "ce" / "train_log.jsonl").read_text().splitlines()]
    assert json.loads((tmp_path / "ce" / "training.json").read_text())["loss"] == "ce"
    assert record["loss"] < log[0]["loss"] - 0.5  # one fixed batch: cross-entropy must drop
    assert log[0]["tokens"] == 6 * 13  # 12 codes + end-of-speech per row


def test_errors_are_clear(engine_data, init_dir, kit_dir, tmp_path):
    with pytest.raises(ValueError, match="produced by the engine.*--target"):
        train_draft(settings(engine_data, init_dir, kit_dir, tmp_path / "x", target=None))
    with pytest.raises(ValueError, match="is the initial draft itself"):
        train_draft(settings(engine_data, init_dir, kit_dir, init_dir, steps=1))
    with pytest.raises(ValueError, match="no .parquet or .jsonl files"):
        train_draft(settings(tmp_path, init_dir, kit_dir, tmp_path / "y"))
    with pytest.raises(ValueError, match="ties its head"):
        train_draft(settings(engine_data, init_dir, kit_dir, tmp_path / "z", trainable=["layers", "head"], steps=1))


def test_cache_target_keeps_logits_only_for_runs_longer_than_an_epoch(engine_data, init_dir, kit_dir, tmp_path):
    """Within one epoch no sequence comes back, so `--cache-target` keeps nothing (a 1B-shape
    run of 992 sequences would otherwise hold 16 GB); past it the cache serves the same logits
    the target computes."""
    from engine.draft.run import build_trainer

    s = settings(engine_data, init_dir, kit_dir, tmp_path / "c", steps=2, eval_every=0, heldout_fraction=0.0,
                 cache_target=True)
    one = build_trainer(plan_run(s), torch.device("cpu"))
    epoch = one.steps_per_epoch
    assert epoch == len(one.train_seqs) // 2 >= 2
    one.run(epoch)
    assert not one.cache_train and one._target_cache == {}
    two = build_trainer(plan_run(s), torch.device("cpu"))
    two.run(epoch + 1)
    assert two.cache_train and len(two._target_cache) == 2 * epoch
    i = next(iter(two._target_cache))
    seq = make_batch([two.train_seqs[i]], two.layout)
    torch.testing.assert_close(two._target_cache[i].float(), two.target(seq.input_ids, seq.rows, seq.cols))


def test_stream_heads_train_from_the_cli_and_raise_heldout_acceptance(engine_data, kit_dir, tmp_path, capsys):
    """`draft train --kind streams`: the heads only are written (a few percent of the target's
    parameters), and their held-out acceptance rises; they load onto the target."""
    from engine.models.loading import load_model
    from engine.models.streams import load_streams

    out = tmp_path / "streams"
    code = draft_cli(["draft", "train", "--kind", "streams", "--data", str(engine_data), "--target",
                      str(kit_dir / "target"), "--out", str(out), "--heads", "2", "--steps", "40", "--anchors", "16",
                      "--lr", "1e-2", "--heldout-fraction", "0.3", "--seed", "3", "--device", "cpu", "--quiet"])
    assert code == 0 and "stream heads written to" in capsys.readouterr().out
    record = json.loads((out / "training.json").read_text())["final"]
    assert record["acceptance_after"][0] > record["acceptance_before"][0] + 0.02, record
    assert record["parameters"] < 0.1 * record["target_parameters"]
    assert sorted(p.name for p in out.iterdir()) == ["pcg_streams.json", "streams.safetensors", "training.json"]
    heads = load_streams(out, load_model(kit_dir / "target", device="cpu", dtype="float32").model)
    assert heads.heads == 2
    assert draft_cli(["draft", "train", "--kind", "streams", "--data", str(engine_data), "--target",
                      str(kit_dir / "target"), "--draft", str(kit_dir / "draft"), "--out", str(out)]) != 0
    assert "--kind streams trains new heads on the target: drop --draft" in capsys.readouterr().err
    assert draft_cli(["draft", "train", "--data", str(engine_data), "--out", str(out)]) != 0
    assert "draft train needs --draft DIR" in capsys.readouterr().err
