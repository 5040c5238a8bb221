"""`pcg-synth bench` on the tiny kit in a reduced setting, the presets and the cost model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.cli import main as run_cli
from engine.decoding.cost import drain_factor

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def bench_doc(kit_dir, kit_groups, tmp_path_factory):
    # kit_groups: the theta-0.4 groups built once per session
    out = tmp_path_factory.mktemp("bench") / "tiny.json"
    code = run_cli(["bench", "--kit", str(kit_dir), "--device", "cpu", "--methods", "ar,exact,pcg",
                    "--gammas", "3,auto", "--batch-sizes", "1,2", "--reps", "2", "--max-new-tokens", "8",
                    "--cost-reps", "2", "--out", str(out), "--quiet"])
    assert code == 0
    return out, json.loads(out.read_text())


def test_bench_writes_a_result_for_every_batch_and_setting(bench_doc):
    _, doc = bench_doc
    assert doc["machine"]["device"] == "cpu" and doc["models"]["preset"] == "tiny"
    assert set(doc["batches"]) == {"1", "2"}
    labels = {"ar", "exact g3", "pcg g3 t0.4", "exact auto", "pcg auto t0.4"}
    for entry in doc["batches"].values():
        assert set(entry["runs"]) == labels
        for label, run in entry["runs"].items():
            assert run["tokens_per_s"]["n"] == 2 and run["tokens_per_s"]["median"] > 0
            assert run["tokens_per_s"]["min"] <= run["tokens_per_s"]["median"] <= run["tokens_per_s"]["max"]
            assert run["audio_s_per_s"]["median"] == pytest.approx(run["tokens_per_s"]["median"] / 50)
            # where the time went: prefill and decode forwards, host work per round
            assert run["host_s_per_round"]["median"] >= 0 and run["forward_s_per_round"]["median"] > 0
            assert 0 < run["prefill_share"] < 1
            assert run["decode_speedup_vs_ar"]["median"] > 0
            length = run["mean_accepted_length"]["median"]
            if run["gamma"] == "auto":  # the choice is recorded; 0 means speculation was switched off
                assert run["chosen_gamma"] in (0, 1, 2, 3, 4, 6, 8) and run["gamma_choice_reason"]
                assert 1.0 <= length <= 9.0
                continue
            if label == "ar":
                assert run["speedup_vs_ar"]["median"] == 1.0 and length == 1.0
                assert run["acceptance_per_position"] == []
            else:
                assert 1.0 <= length <= 4.0 and len(run["acceptance_per_position"]) == 3
                assert all(0.0 <= a <= 1.0 for a in run["acceptance_per_position"])
                assert run["speedup_vs_ar"]["median"] > 0
            if run["method"] != "pcg":
                assert run["thinning_trials_per_rep"] == 0  # only PCG thins


def test_the_cost_model_reads_the_ar_step_beside_the_grids_first_gamma_whatever_auto_chose(kit_synth):
    from engine.bench.runner import BenchConfig, cost_model

    cfg = BenchConfig(gammas=(3, "auto"), cost_reps=2)
    # `auto` chose 1 and 3 on this run: 1 sorts first, yet the grid's 3 stays the reference
    doc = cost_model(kit_synth, 1, cfg, context=24, bandwidth=1e10, also=(1, 3, 0))
    assert list(doc["steps"]) == ["3", "1"]
    bound = doc["bound"]
    assert bound["ar_step_over_weights_bound"] == pytest.approx(doc["steps"]["3"]["ar_s"] / bound["weights_bound_s"])


def test_cost_model_and_its_readings_are_consistent(bench_doc):
    _, doc = bench_doc
    for batch, entry in doc["batches"].items():
        cost = entry["cost"]
        times = cost["steps"]["3"]
        assert min(times.values()) > 0
        host_ar = entry["runs"]["ar"]["host_s_per_round"]["median"]
        break_even = (times["draft_phase_s"] + times["verify_s"]) / times["ar_s"]
        bound = cost["bound"]
        bandwidth = doc["machine"]["copy_bandwidth_GBps"] * 1e9
        assert bound["weights_bound_s"] == pytest.approx(bound["weight_bytes"] / bandwidth)
        assert bound["ar_step_over_weights_bound"] == pytest.approx(times["ar_s"] / bound["weights_bound_s"])
        for run in entry["runs"].values():
            if run["method"] == "ar" or run["gamma"] == "auto":
                continue
            length, host = run["mean_accepted_length"]["median"], run["host_s_per_round"]["median"]
            assert run["break_even_length"] == pytest.approx(break_even)
            assert run["predicted_speedup_forwards"] == pytest.approx(length / break_even)
            acc = run["acceptance_per_position"]
            drain = drain_factor(sum(acc) / len(acc), 3, doc["settings"]["max_new_tokens"], int(batch),
                                 doc["settings"]["items_per_slot"] * int(batch))
            assert run["drain_factor"] == pytest.approx(drain) and drain <= 1 and (int(batch) > 1 or drain == 1)
            assert run["predicted_speedup"] == pytest.approx(
                drain * length * (times["ar_s"] + host_ar) / (times["draft_phase_s"] + times["verify_s"] + host))
            assert run["prediction_error"] == pytest.approx(
                run["predicted_speedup"] / run["decode_speedup_vs_ar"]["median"] - 1)
    readings = doc["readings"]
    assert set(readings["paying_off"]) == {"exact g3", "pcg g3 t0.4", "exact auto", "pcg auto t0.4"}
    targets = readings["targets"]
    assert targets["batch"] == 1
    assert targets["worst_prediction_error"] == max(
        abs(r["prediction_error"]) for e in doc["batches"].values() for r in e["runs"].values()
        if "prediction_error" in r)
    assert targets["verify_over_ar_step"] == pytest.approx(
        doc["batches"]["1"]["cost"]["steps"]["3"]["verify_s"] / doc["batches"]["1"]["cost"]["steps"]["3"]["ar_s"])


def test_bench_writes_markdown_and_plots(bench_doc):
    out, doc = bench_doc
    md = out.with_suffix(".md").read_text()
    assert "| 2 | pcg g3 t0.4 |" in md and "## Cost model" in md and "## Where speculation stops paying" in md
    assert doc["how"] in md
    for name in ("tiny_speedup_vs_batch.png", "tiny_acceptance_vs_theta.png"):
        assert (out.parent / name).read_bytes()[:8] == PNG_MAGIC


def test_bad_grid_fails_before_loading_models(tmp_path, capsys):
    code = run_cli(["bench", "--target", str(tmp_path / "missing"), "--methods", "ar,fast",
                    "--out", str(tmp_path / "x.json")])
    assert code == 2
    err = capsys.readouterr().err
    assert "unknown method(s) fast" in err and "missing" not in err


def test_llasa_1b_shape_preset_has_llasa_1b_dimensions():
    from engine.bench.presets import LLASA_1B_DRAFT_LAYERS, LLASA_1B_SPEC, LLASA_VOCAB

    spec = LLASA_1B_SPEC  # docs/families.md: Llama-3.2-1B body, 193,800-row vocabulary, tied
    assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads) == (2048, 16, 32, 8)
    assert (spec.intermediate_size, spec.hidden_size // spec.num_heads, LLASA_VOCAB) == (8192, 64, 193_800)
    assert len(LLASA_1B_DRAFT_LAYERS) == 3 and max(LLASA_1B_DRAFT_LAYERS) < spec.num_layers


def test_llasa_shape_builder_makes_a_working_target_and_draft(tmp_path):
    from dataclasses import replace

    from engine import DecodingSettings, Synthesizer
    from engine.bench.presets import LLASA_1B_SPEC, ModelBuild, llasa_1b_shape
    from engine.models.loading import load_model

    small = replace(LLASA_1B_SPEC, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
                    num_kv_heads=2)
    target, draft = llasa_1b_shape(ModelBuild(torch.device("cpu"), torch.float32), spec=small, draft_layers=(0, 1, 3),
                                   vocab_size=70_000, save_to=tmp_path)
    assert target.model.vocab_out == 65_537 and target.model.model.embed_tokens.weight.shape[0] == 70_000
    assert len(draft.model.model.layers) == 3
    # the draft's layers are the target's layers 0, 1 and 3
    assert torch.equal(draft.model.model.layers[2].mlp.gate_up_proj.weight.to_dense(),
                       target.model.model.layers[3].mlp.gate_up_proj.weight.to_dense())
    saved = load_model(tmp_path / "target", "cpu", "float32")  # --save-preset: the same weights on disk
    assert torch.equal(saved.model.head, target.model.head)
    results, summary = Synthesizer(target, draft).synthesize(
        ["Hello there."], DecodingSettings(method="exact", max_new_tokens=6))
    assert results[0].finish_reason in ("eos", "length") and summary.stats.generated_tokens > 0


def test_tiny_preset_uses_the_kit_in_the_working_directory(kit_dir, tmp_path, monkeypatch, capsys):
    from engine.bench.cli import build_default_out_args
    from engine.bench.presets import tiny_kit

    monkeypatch.chdir(tmp_path)
    (tmp_path / "kit").symlink_to(kit_dir)
    assert tiny_kit() == Path("kit") and "using the tiny kit in ./kit" in capsys.readouterr().out
    assert build_default_out_args("tiny") == "out/bench/tiny.json"  # out/ is ignored by git


def test_bench_and_paper_table_compare_the_draft_and_stream_heads_side_by_side(kit_dir, kit_groups, tmp_path):
    """`--streams`: every speculative setting measured again with the kit's stream heads in the same
    run (the target loaded once), each drafter with its own cost model, and the best `pcg` of each
    compared; paper-table gets a row per rule and drafter."""
    out = tmp_path / "drafters.json"
    assert run_cli(["bench", "--kit", str(kit_dir), "--streams", str(kit_dir / "streams"), "--device", "cpu",
                    "--methods", "ar,pcg", "--gammas", "2", "--batch-sizes", "1", "--reps", "2",
                    "--max-new-tokens", "8", "--cost-reps", "2", "--out", str(out), "--quiet", "--no-plots"]) == 0
    doc = json.loads(out.read_text())
    entry = doc["batches"]["1"]
    assert list(entry["runs"]) == ["ar", "pcg g2 t0.4", "pcg heads g2 t0.4"]
    draft, heads = entry["runs"]["pcg g2 t0.4"], entry["runs"]["pcg heads g2 t0.4"]
    assert not draft["heads"] and heads["heads"] and len(heads["acceptance_per_position"]) == 2
    assert doc["models"]["streams_count"] >= 2 and 0 < doc["models"]["streams_params"] < doc["models"]["draft_params"]
    assert list(entry["cost"]["steps"]) == list(entry["cost_heads"]["steps"]) == ["2"]
    assert entry["cost_heads"]["steps"]["2"]["draft_phase_s"] > 0
    ratio = doc["readings"]["targets"]["pcg_heads_over_pcg_draft"]
    assert ratio == pytest.approx(heads["speedup_vs_ar"]["median"] / draft["speedup_vs_ar"]["median"])
    md = out.with_suffix(".md").read_text()
    assert "| 1 | heads | 2 |" in md and "best `pcg` with stream heads over best `pcg` with the draft model" in md

    paper = tmp_path / "paper"
    assert run_cli(["paper-table", "--kit", str(kit_dir), "--streams", str(kit_dir / "streams"), "--device", "cpu",
                    "--demo", "--limit", "1", "--seeds", "0", "--methods", "ar,pcg", "--max-new-tokens", "8",
                    "--asr", "none", "--speaker", "none", "--out", str(paper), "--quiet", "--no-plots"]) == 0
    table = json.loads((paper / "paper_table.json").read_text())
    assert list(table["rows"]) == ["ar", "pcg", "pcg heads"]
    assert table["per_seed"]["0"]["pcg heads"]["speed"]["drafter"] == "streams"
    assert table["per_seed"]["0"]["pcg"]["speed"]["drafter"] == "model"
    assert sorted(p.name for p in (paper / "datasets").glob("*.parquet")) == [
        "ar.seed0.parquet", "pcg-heads.seed0.parquet", "pcg.seed0.parquet"]
    assert "| PCG theta 0.4 (stream heads) |" in (paper / "paper_table.md").read_text()
