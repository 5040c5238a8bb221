"""`draft train --kind streams --workers N`: stream heads distilled data-parallel by Ray Train's
`TorchTrainer` (DDP over NCCL on GPUs, gloo on CPUs), one worker per GPU, on one node or many.

Every worker sets up what a single-process run does (`setup_streams`: the target, the rows, the
split; local paths must exist on every node, s3:// works everywhere), builds the same initial
heads (same seed) and wraps them with `ray.train.torch.prepare_model`. Each step draws the anchors
one process draws; rank `r` trains on every `world`-th of them from the `r`-th, its KD sum over the
whole draw's valid count, times `world` (DDP averages the gradients): N workers compute the
single-process gradient (`StreamsTrainer.train_step`). Rank 0 measures held-out acceptance before
and after and reports the final heads and the record as a `ray.train.Checkpoint`; the driver
writes them (`save_streams`) and `training.json` to `--out`.

No checkpoint is taken mid-run and a run does not resume: heads train in minutes, so a failed
run is simply rerun (from the start).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict
from pathlib import Path

from engine.draft.streams import (
    StreamsSettings,
    StreamsTrainer,
    heads_record,
    init_heads,
    setup_streams,
    target_record,
    write_training,
)

RUN_NAME = "streams-train"
RECORD = "record.json"
WEIGHTS = "heads.safetensors"


def streams_worker_loop(config: dict) -> None:
    """The per-worker training function handed to `TorchTrainer`."""
    import ray.train
    import ray.train.torch
    from safetensors.torch import save_file

    settings = StreamsSettings.model_validate(config["settings"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    setup = setup_streams(settings, ray.train.torch.get_device())
    hyper = setup.hyper
    module = init_heads(setup.target, hyper.heads, hyper.intermediate_size, hyper.seed)
    trainer = StreamsTrainer(module, setup.target, setup.train, setup.heldout, hyper,
                             wrap=ray.train.torch.prepare_model)
    before = trainer.acceptance() if rank == 0 else None
    losses = [trainer.train_step(rank, world) for _ in range(hyper.steps)]
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = None
        metrics = {"step": hyper.steps, "loss": losses[-1]}
        if rank == 0:  # one copy of the (replicated) heads
            record = heads_record(trainer, hyper, losses, before)
            state = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
            save_file(state, str(Path(tmp) / WEIGHTS))
            (Path(tmp) / RECORD).write_text(json.dumps(
                {"record": record, "shape": asdict(module.shape), "skipped": setup.skipped,
                 "target": target_record(setup.target, settings.target), "describe": setup.describe(hyper.heads)}))
            checkpoint = ray.train.Checkpoint.from_directory(tmp)
        ray.train.report(metrics, checkpoint=checkpoint)


def train_streams_ray(settings: StreamsSettings, workers: int, use_gpu: bool | None = None,
                      address: str | None = None, storage_path: str | None = None) -> dict:
    """Distil stream heads with `workers` Ray Train workers and write them and `training.json`
    to `settings.out`, as `train_streams` does on one device.

    A run takes no checkpoint before its end and does not resume: heads train in minutes; a
    failed run is rerun.

    Args:
        settings: as for a single-device run (`device` is chosen by Ray: one GPU per worker
            with `use_gpu`, else the CPU).
        workers: Ray Train workers (>= 1; at most `settings.anchors`).
        use_gpu: one GPU per worker; None: when the cluster has a GPU for every worker.
        address: the Ray cluster (see `engine.connect.init_ray`).
        storage_path: where Ray keeps the run's final checkpoint (shared or s3:// for
            multi-node); default `OUT/ray`.

    Raises:
        ValueError: bad settings, or a worker's own ValueError (bad data or models), raised by
            the workers as they set up.

    Returns:
        The training record (held-out acceptance per head before and after, losses).
    """
    import ray
    import torch
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from safetensors.torch import load_file

    from engine.connect import init_ray
    from engine.draft.distributed import default_storage, failure_message
    from engine.models.streams import StreamHeads, StreamShape, save_streams

    if workers < 1:
        raise ValueError(f"--workers must be >= 1 for Ray Train; got {workers}")
    if workers > settings.anchors:
        raise ValueError(f"--workers {workers}: more workers than --anchors {settings.anchors} per step")
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    init_ray(address)
    if use_gpu is None:
        use_gpu = ray.cluster_resources().get("GPU", 0) >= workers
    trainer = TorchTrainer(streams_worker_loop, train_loop_config={"settings": settings.model_dump(mode="json")},
                           scaling_config=ScalingConfig(num_workers=workers, use_gpu=use_gpu),
                           run_config=RunConfig(name=RUN_NAME, storage_path=storage_path or default_storage(out)))
    try:
        result = trainer.fit()
    except Exception as exc:  # noqa: BLE001 - Ray's wrapper -> the worker's own message
        raise failure_message(exc) from None
    with result.checkpoint.as_directory() as d:
        state = load_file(str(Path(d) / WEIGHTS))
        saved = json.loads((Path(d) / RECORD).read_text())
    print(f"{saved['describe']}; {workers} Ray Train workers")
    heads = StreamHeads(StreamShape(**saved["shape"])).to(torch.float32)
    heads.load_state_dict(state)
    record = saved["record"]
    save_streams(out, heads, saved["target"], record)
    write_training(settings, saved["skipped"], record)
    return record
