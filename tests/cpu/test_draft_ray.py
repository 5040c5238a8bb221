"""`draft train --workers 2`: Ray Train's TorchTrainer (gloo, two CPU workers) on a real local
cluster computes what one process computes, exports a loadable draft, and resumes from the
checkpoint Ray kept."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from engine import DecodingSettings
from engine.draft.distributed import train_draft_ray
from engine.draft.init import init_draft
from engine.draft.run import train_draft
from engine.draft.settings import TrainSettings
from engine.io.dataset import AudioRow, build_table, write_parquet
from engine.kit.draft import KIT_TRAIN_TEXTS
from engine.models.loading import load_model


@pytest.fixture(scope="module")
def setup(kit_dir, kit_synth, tmp_path_factory):
    root = tmp_path_factory.mktemp("ray-draft")
    settings = DecodingSettings(method="ar", max_new_tokens=16, seed=2)
    results, _ = kit_synth.synthesize(KIT_TRAIN_TEXTS[:8], settings, batch_size=8)
    write_parquet(build_table([AudioRow(result=r) for r in results], settings, 16000), root / "data.parquet")
    init_draft(kit_dir / "target", root / "init", layers=[0, 1, 3])
    return root


def make_settings(root, kit_dir, out: str, steps: int) -> TrainSettings:
    # batch 5 over 2 workers: unequal shares (3 + 2 sequences), micro-batches of 2: the
    # all-reduce must still meet once per step and the gradient equal the single-process one.
    # float32: bfloat16 autocast (dtype auto on CPUs with native bf16) rounds each worker's share
    # differently from the whole batch, which is not what this test measures.
    return TrainSettings(data=str(root / "data.parquet"), draft=str(root / "init"),
                         target=str(kit_dir / "target"), out=str(root / out), steps=steps,
                         batch_size=5, micro_batch_size=2, lr=2e-3, warmup_steps=0,
                         heldout_fraction=0.0, eval_every=0, checkpoint_every=2, device="cpu",
                         dtype="float32")


def test_two_ray_workers_match_one_process_and_resume(local_ray, setup, kit_dir):
    spread = train_draft_ray(make_settings(setup, kit_dir, "ray", 3), workers=2, use_gpu=False)
    alone = train_draft(make_settings(setup, kit_dir, "alone", 3), progress=False)
    assert spread["step"] == alone["step"] == 3
    assert spread["loss"] == pytest.approx(alone["loss"], rel=1e-4)
    a = load_file(str(setup / "ray" / "model.safetensors"))
    b = load_file(str(setup / "alone" / "model.safetensors"))
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=2e-5, rtol=1e-4, msg=name)
    init = load_file(str(setup / "init" / "model.safetensors"))
    assert not torch.equal(a["model.layers.1.mlp.gate_proj.weight"], init["model.layers.1.mlp.gate_proj.weight"])
    assert load_model(setup / "ray", dtype="float32").model.shape.num_layers == 3
    # the same command with more steps continues from Ray's newest checkpoint (step 3)
    more = train_draft_ray(make_settings(setup, kit_dir, "ray", 5), workers=2, use_gpu=False)
    steps = [json.loads(x)["step"] for x in (setup / "ray" / "train_log.jsonl").read_text().splitlines()]
    assert more["step"] == 5 and steps == [1, 2, 3, 4, 5]
