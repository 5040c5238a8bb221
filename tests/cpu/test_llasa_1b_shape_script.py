"""benchmarks/llasa_1b_shape.sh, the one command behind the llasa-1b-shape CPU result, run end to
end on the tiny kit's target (samples, draft init, distillation with cached bf16 target logits,
stream heads distilled on the same samples, draft eval before/after, bench with gamma auto, the
draft against the heads): the chain a 1-hour CPU run takes, in seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_distillation_script_chain_runs_on_the_kit(kit_dir, tmp_path):
    bin_dir = Path(sys.executable).parent
    out = tmp_path / "results" / "chain"
    texts = tmp_path / "texts.txt"
    texts.write_text("A held-out sentence.\nAnother one, a little longer.\n")
    env = {**os.environ, "PCG": str(bin_dir / "pcg-synth"), "PY": sys.executable,
           "TARGET": str(kit_dir / "target"), "WORK": str(tmp_path / "work"), "OUT": str(out),
           "DEVICE": "cpu", "DTYPE": "bfloat16", "LAYERS": "0,3", "SEEDS": "1", "MAX_NEW": "24",
           "STEPS": "3", "BATCH": "4", "BATCHES": "1", "GAMMAS": "2,auto", "THETAS": "0.4", "REPS": "1",
           "ITEMS": "1", "COST_REPS": "2", "EVAL_TOKENS": "16", "EVAL_TEXTS": str(texts),
           "HEADS": "2", "STREAM_STEPS": "2", "ANCHORS": "8"}
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "llasa_1b_shape.sh")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "done:" in run.stdout

    log = [json.loads(line) for line in Path(f"{out}_draft_train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == [1, 2, 3]
    assert any("heldout_acceptance" in r for r in log)
    training = json.loads((tmp_path / "work" / "draft-kd" / "training.json").read_text())
    assert training["settings"]["cache_target"] is True and training["settings"]["dtype"] == "bfloat16"

    evaluation = json.loads(Path(f"{out}_draft_eval.json").read_text())
    text = json.dumps(evaluation)
    assert "draft-init" in text and "draft-kd" in text  # before and after

    bench = json.loads(Path(f"{out}.json").read_text())
    runs = bench["batches"]["1"]["runs"]
    assert {"ar", "exact g2", "exact auto", "pcg g2 t0.4", "pcg auto t0.4"} <= set(runs)
    assert runs["pcg auto t0.4"]["chosen_gamma"] >= 0  # the choice is recorded (0: speculation off)
    assert bench["machine"]["dtype_auto"].split(":")[0] in ("bfloat16", "float32")

    heads = json.loads((tmp_path / "work" / "streams" / "pcg_streams.json").read_text())
    assert heads["shape"]["heads"] == 2 and heads["trained"]["steps"] == 2
    # beside OUT, named after it; a row per batch size asked for
    drafters = json.loads((out.parent / "drafters_chain.json").read_text())
    assert [r["batch"] for r in drafters["rows"]] == [1]
    assert {"ar", "pcg draft g2", "pcg draft auto", "pcg heads g2", "pcg heads auto"} == set(
        drafters["batches"]["1"]["runs"])
    assert drafters["models"]["streams"] == str(tmp_path / "work" / "streams")
