"""`pcg-synth eval` on a produced dataset and `pcg-synth paper-table` end to end on the kit."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from engine.api import COMPARE_WARMUP_TOKENS
from engine.cli import main as pcg_synth


@pytest.fixture(scope="module")
def produced(kit_dir, kit_groups, tmp_path_factory):
    """A 3-row PCG dataset cloning synthetic voices, written by `pcg-synth generate`."""
    from engine.bench.demo import write_demo_manifest

    root = tmp_path_factory.mktemp("eval")
    manifest = write_demo_manifest(root / "m", rows=3)
    dataset = root / "ds.parquet"
    assert pcg_synth(["generate", "--kit", str(kit_dir), "--texts-file", str(manifest), "--method", "pcg",
                      "--max-new-tokens", "16", "--device", "cpu", "--out", str(dataset), "--quiet"]) == 0
    return manifest, dataset


def test_eval_writes_per_row_metrics_and_a_summary(produced, capsys):
    manifest, dataset = produced
    assert pcg_synth(["eval", str(dataset), "--prompts", str(manifest), "--quiet"]) == 0
    rows = pq.read_table(dataset.with_name("ds.eval.parquet")).to_pylist()
    assert [r["id"] for r in rows] == ["demo-0", "demo-1", "demo-2"]
    reasons = pq.read_table(dataset, columns=["finish_reason"]).column(0).to_pylist()
    assert [r["finish_reason"] for r in rows] == reasons and set(reasons) <= {"eos", "length"}
    for r in rows:
        assert r["method"] == "pcg" and r["error"] is None and isinstance(r["hypothesis"], str)
        assert r["ref_words"] > 0 and r["wer"] == pytest.approx(100 * r["word_errors"] / r["ref_words"])
        assert -1.0 <= r["similarity"] <= 1.0 and r["similarity_reference"] == "clip"
    summary = json.loads(dataset.with_name("ds.eval.summary.json").read_text())
    pcg = summary["methods"]["pcg"]
    assert pcg["rows"] == 3 and pcg["similarity_rows"] == 3 and pcg["cut"] == reasons.count("length")
    assert pcg["wer"] == pytest.approx(100 * sum(r["word_errors"] for r in rows) / sum(r["ref_words"] for r in rows))
    assert summary["backends"]["asr"].startswith("pocketsphinx")
    out = capsys.readouterr().out
    assert "WER %" in out and ("cut: clips whose speech reached their token limit" in out) == ("length" in reasons)


def test_eval_without_prompts_says_why_similarity_is_missing(produced, tmp_path, capsys):
    _, dataset = produced
    out = tmp_path / "m.parquet"
    assert pcg_synth(["eval", str(dataset), "--asr", "none", "--out", str(out), "--quiet"]) == 0
    assert "give the generation manifest with --prompts" in capsys.readouterr().out
    assert all(r.get("similarity") is None for r in pq.read_table(out).to_pylist())


def test_eval_of_a_missing_dataset_is_a_one_line_error(tmp_path, capsys):
    assert pcg_synth(["eval", str(tmp_path / "none.parquet")]) == 2
    assert "no .parquet dataset files" in capsys.readouterr().err


def test_paper_table_end_to_end_on_the_kit(kit_dir, kit_groups, tmp_path):
    out = tmp_path / "paper"
    assert pcg_synth(["paper-table", "--kit", str(kit_dir), "--device", "cpu", "--demo", "--limit", "2",
                    "--seeds", "0,1", "--max-new-tokens", "16", "--out", str(out), "--quiet"]) == 0
    doc = json.loads((out / "paper_table.json").read_text())
    assert list(doc["rows"]) == ["ar", "exact", "ssd", "pcg"] and doc["items"] == 2
    assert doc["warmup_tokens"] == COMPARE_WARMUP_TOKENS  # every method warmed up before any is timed
    assert doc["rows"]["ar"]["speedup"] == {"mean": 1.0, "std": 0.0, "n": 2}
    for method, row in doc["rows"].items():
        for key in ("speedup", "wer", "cer", "similarity"):
            assert row[key]["n"] == 2 and row[key]["mean"] is not None, (method, key)
        per_seed = [doc["per_seed"][s] for s in ("0", "1")]
        speeds = [runs[method]["speed"]["tokens_per_s"] / runs["ar"]["speed"]["tokens_per_s"] for runs in per_seed]
        assert row["speedup"]["mean"] == pytest.approx(sum(speeds) / 2)
        cut = [pq.read_table(out / "datasets" / f"{method}.seed{s}.parquet", columns=["finish_reason"])
               .column(0).to_pylist().count("length") for s in (0, 1)]
        assert [runs[method]["quality"]["cut"] for runs in per_seed] == cut and row["cut"]["mean"] == sum(cut) / 2
    assert len(list((out / "datasets").glob("*.parquet"))) == 8  # 4 methods x 2 seeds
    md = (out / "paper_table.md").read_text()
    assert "| mean accepted length | rows cut |" in md and "rows cut: of the 2 utterances per seed" in md
    assert "| PCG theta 0.4 |" in md and "| SSD beta 0.3 | 1.4x | 18.5 |" in md  # ours, then the paper's
    assert (out / "paper_table_quality_vs_speedup.png").stat().st_size > 0
