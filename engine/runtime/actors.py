"""Ray actors: thin shells around the Ray-free worker logic."""

from __future__ import annotations

import ray

from engine.config import JobSpec
from engine.groups.csr import SpeechGroups
from engine.io.lease import Fence
from engine.runtime.plan import Shard


@ray.remote(max_restarts=0, max_task_retries=0)  # the driver decides about retries
class SynthesisWorker:
    """Holds target + draft + codec (+ groups) once and streams shards through them: a threaded
    actor (`max_concurrency` from `worker_options`), one call per held shard, each returning
    that shard's commit record when it is written (in any order)."""

    def __init__(self, spec_json: str, groups: SpeechGroups | None, worker_id: str,
                 warmup: bool = False) -> None:
        import torch

        from engine.runtime.numerics import worker_threads
        from engine.runtime.worker import ShardProcessor

        spec = JobSpec.model_validate_json(spec_json)
        torch.set_num_threads(worker_threads(spec))  # part of the numerics environment: explicit
        self.processor = ShardProcessor(spec, groups, worker_id)
        if warmup:
            self.processor.warmup()

    def info(self) -> dict:
        return self.processor.info()

    def configure(self, spec_json: str, groups: SpeechGroups | None, worker_id: str,
                  warmup: bool = False) -> dict:
        """Serve another job with the models already loaded (a sweep's next point: its decoding
        settings, batch size, shards and output); called only while the worker holds no shard.
        Returns `info()`, as a new worker's first call does."""
        spec = JobSpec.model_validate_json(spec_json)
        self.processor = self.processor.reuse(spec, groups, worker_id)
        if warmup:
            self.processor.warmup()
        return self.processor.info()

    def process(self, shard: Shard, attempt: int, fence: Fence | None = None) -> dict:
        return self.processor.process(shard, attempt, fence)


def worker_options(spec: JobSpec) -> dict:
    """Resources per actor (`num_gpus` pins each worker to its own GPU(s)), and threads for its
    held shards plus `info` calls."""
    res = spec.resources
    return {"num_cpus": res.cpus_per_worker, "num_gpus": res.gpus_per_worker,
            "max_concurrency": spec.shards_held + 2}


def cluster_capacity(spec: JobSpec) -> int:
    """How many workers the live nodes can hold at once."""
    res = spec.resources
    totals = {"CPU": 0.0, "GPU": 0.0}
    for node in ray.nodes():
        if node.get("Alive"):
            for key in totals:
                totals[key] += node.get("Resources", {}).get(key, 0.0)
    fits = [int(totals["CPU"] // res.cpus_per_worker)]
    if res.gpus_per_worker > 0:
        fits.append(int(totals["GPU"] // res.gpus_per_worker))
    return min(fits)
