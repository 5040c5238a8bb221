"""`draft train --workers N`: data-parallel training with Ray Train's `TorchTrainer` (DDP over
NCCL on GPUs, gloo on CPUs), one worker per GPU, on one node or many.

Every worker runs the same `DraftTrainer` as a single-device run: it reads the dataset (local
paths must exist on every node; s3:// works everywhere), takes its share of each global batch,
and DDP averages the gradients (the loss is normalised by the global token count, so N workers
compute the single-process gradient). Rank 0 reports checkpoints through `ray.train.report`; Ray
keeps them under the run's storage (`OUT/ray` by default, or any shared / s3:// path) and
restores the newest one when the same command runs again or a worker group is restarted.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from engine.draft.checkpoint import (
    check_fingerprint,
    load_checkpoint,
    read_state,
    write_checkpoint,
)
from engine.draft.run import build_trainer, check_out, export_trained, plan_run
from engine.draft.settings import TrainSettings

RUN_NAME = "draft-train"
LOG = "train_log.jsonl"


def worker_loop(config: dict) -> None:
    """The per-worker training function handed to `TorchTrainer`."""
    import ray.train
    import ray.train.torch

    settings = TrainSettings.model_validate(config["settings"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    plan = plan_run(settings)
    trainer = build_trainer(plan, ray.train.torch.get_device(), rank, world,
                            wrap=ray.train.torch.prepare_model)
    history: list[dict] = []
    restored = ray.train.get_checkpoint()
    if restored is not None:
        with restored.as_directory() as d:
            check_fingerprint(d, plan.fingerprint)
            load_checkpoint(d, trainer)
            if (Path(d) / LOG).is_file():
                history = [json.loads(x) for x in (Path(d) / LOG).read_text().splitlines() if x.strip()]

    def on_log(record: dict) -> None:
        history.append(record)

    def on_checkpoint(t, record: dict) -> None:
        metrics = {k: v for k, v in record.items() if isinstance(v, (int, float))}
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if rank == 0:  # one copy of the (replicated) state
                write_checkpoint(tmp, t, plan.fingerprint, record)
                (Path(tmp) / LOG).write_text("".join(json.dumps(r) + "\n" for r in history))
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report(metrics, checkpoint=checkpoint)

    trainer.run(settings.steps, settings.eval_every, settings.checkpoint_every, on_log,
                on_checkpoint, progress=False)


def default_storage(out: Path) -> str:
    return str((out / "ray").resolve())


def failure_message(exc: Exception) -> Exception:
    """A worker's own error (a ValueError stays one), not Ray's wrapper."""
    failures = getattr(exc, "worker_failures", None) or {}
    for _, cause in sorted(failures.items()):
        inner = getattr(cause, "cause", None) or cause
        if isinstance(inner, ValueError):
            return ValueError(str(inner).splitlines()[0])
        return RuntimeError(f"draft training failed on a worker: {str(inner).splitlines()[-1]}")
    return RuntimeError(f"draft training failed: {str(exc).splitlines()[0]}")


def train_draft_ray(settings: TrainSettings, workers: int, use_gpu: bool | None = None,
                    address: str | None = None, storage_path: str | None = None,
                    max_failures: int = 0) -> dict:
    """Train with `workers` Ray Train workers and export the trained draft to `settings.out`.

    Args:
        settings: as for a single-device run (`device` is chosen by Ray: one GPU per worker
            with `use_gpu`, else the CPU).
        workers: Ray Train workers (>= 1).
        use_gpu: one GPU per worker; None: when the cluster has a GPU for every worker.
        address: the Ray cluster (see `engine.connect.init_ray`).
        storage_path: where Ray keeps the run's checkpoints (shared or s3:// for multi-node);
            default `OUT/ray`. The same path resumes the run.
        max_failures: worker-group restarts (from the newest checkpoint) before giving up.

    Returns:
        The last checkpoint's record (step, loss, held-out figures).
    """
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from safetensors.torch import load_file

    from engine.connect import init_ray

    if workers < 1:
        raise ValueError(f"--workers must be >= 1 for Ray Train; got {workers}")
    plan = plan_run(settings)  # fail here, before any worker starts, on bad data or models
    out = Path(settings.out)
    check_out(out, plan.draft_dir)
    print(plan.describe())
    out.mkdir(parents=True, exist_ok=True)
    init_ray(address)
    if use_gpu is None:
        use_gpu = ray.cluster_resources().get("GPU", 0) >= workers
    run_config = RunConfig(name=RUN_NAME, storage_path=storage_path or default_storage(out),
                           checkpoint_config=CheckpointConfig(num_to_keep=settings.keep_checkpoints),
                           failure_config=FailureConfig(max_failures=max_failures))
    trainer = TorchTrainer(worker_loop, train_loop_config={"settings": settings.model_dump(mode="json")},
                           scaling_config=ScalingConfig(num_workers=workers, use_gpu=use_gpu),
                           run_config=run_config)
    try:
        result = trainer.fit()
    except Exception as exc:  # noqa: BLE001 - Ray's wrapper -> the worker's own message
        raise failure_message(exc) from None
    with result.checkpoint.as_directory() as d:
        tensors = load_file(str(Path(d) / "trainable.safetensors"))
        record = read_state(d)["record"]
        if (Path(d) / LOG).is_file():
            (out / LOG).write_text((Path(d) / LOG).read_text())
    export_trained(plan, tensors, out, record)
    return record
