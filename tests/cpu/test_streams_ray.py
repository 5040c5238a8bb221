"""`draft train --kind streams --workers 2`: Ray Train's TorchTrainer (gloo, two CPU workers) on a
real local cluster distils the same stream heads as one process (each step's anchor draw split
across the workers, the loss over the whole draw's count), and writes them as one process does."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from engine import DecodingSettings
from engine.cli import main as draft_cli
from engine.io.dataset import AudioRow, build_table, write_parquet
from engine.kit.draft import KIT_TRAIN_TEXTS


def test_two_ray_workers_distil_the_single_process_heads(local_ray, kit_dir, kit_synth, tmp_path, capsys):
    settings = DecodingSettings(method="ar", max_new_tokens=16, seed=2)
    results, _ = kit_synth.synthesize(KIT_TRAIN_TEXTS[:8], settings, batch_size=8)
    data = tmp_path / "samples.parquet"
    write_parquet(build_table([AudioRow(result=r) for r in results], settings, 16000), data)
    # float32: bfloat16 (dtype auto on CPUs with native bf16) rounds each worker's share of the
    # target's forwards differently from the whole batch, which is not what this test measures.
    # 7 anchors over 2 workers: unequal shares (4 + 3). A small lr: AdamW divides each gradient
    # by its own running scale, so a weight whose gradient is ~0 moves by up to lr on float noise.
    common = ["draft", "train", "--kind", "streams", "--data", str(data), "--target", str(kit_dir / "target"),
              "--heads", "2", "--steps", "4", "--anchors", "7", "--lr", "1e-3", "--warmup-steps", "2",
              "--heldout-fraction", "0.25", "--seed", "3", "--dtype", "float32", "--quiet"]
    assert draft_cli([*common, "--out", str(tmp_path / "alone"), "--device", "cpu"]) == 0
    assert draft_cli([*common, "--out", str(tmp_path / "ray"), "--workers", "2", "--no-use-gpu"]) == 0
    assert "stream heads written to" in capsys.readouterr().out

    alone = load_file(str(tmp_path / "alone" / "streams.safetensors"))
    spread = load_file(str(tmp_path / "ray" / "streams.safetensors"))
    assert sorted(alone) == sorted(spread)
    for name in alone:
        torch.testing.assert_close(spread[name], alone[name], atol=1e-5, rtol=1e-5, msg=name)

    a = json.loads((tmp_path / "alone" / "training.json").read_text())
    b = json.loads((tmp_path / "ray" / "training.json").read_text())
    assert b["settings"]["out"] == str(tmp_path / "ray") and b["skipped_rows"] == a["skipped_rows"]
    rec, ref = b["final"], a["final"]
    assert len(rec["acceptance_before"]) == len(rec["acceptance_after"]) == 2
    assert rec["acceptance_before"] == ref["acceptance_before"]
    for x, y in zip(rec["acceptance_after"], ref["acceptance_after"]):
        assert abs(x - y) <= 2e-4
    assert abs(rec["loss_last"] - ref["loss_last"]) <= 1e-4 * max(1.0, abs(ref["loss_last"]))
    assert rec["train_anchors"] == ref["train_anchors"] and rec["steps"] == 4
    info = json.loads((tmp_path / "ray" / "pcg_streams.json").read_text())
    assert info["shape"]["heads"] == 2 and info["trained"] == rec
