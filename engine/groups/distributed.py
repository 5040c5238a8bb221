"""Distributed build: Ray actors, one per GPU (`num_gpus=1`) where the cluster has GPUs, else CPU
workers. Each actor holds the whole unit-row table (one object-store copy, shared) and searches
disjoint slices of query rows (none crossing a code range's end, each searched within its range);
the driver merges the slices with the same `assemble` as a single-process build, so the result is
identical. A slice whose actor dies is retried on a fresh actor, up to `max_attempts` times.
"""

from __future__ import annotations

import os
import warnings
from collections import deque
from collections.abc import Sequence

import numpy as np
import ray
import torch
from tqdm.auto import tqdm

from engine.connect import init_ray
from engine.console import bar_disabled
from engine.errors import GroupBuildError
from engine.groups.build import (
    SLICE_ROWS,
    Slice,
    assemble,
    check_cap,
    check_ranges,
    check_theta,
    search_slice,
    slice_bounds,
    unit_rows,
)
from engine.groups.csr import SpeechGroups
from engine.groups.options import GroupsBuild
from engine.groups.search import make_range_searcher


class SliceWorker:
    """Searches slices of query rows against the full table. Wrapped by `ray.remote` at run time
    (the resources it asks for depend on the cluster).

    Args:
        table: `[V, D]` float32 unit rows (read-only, from the object store).
        backend: `auto` | `faiss` | `torch`, resolved on the worker's own device.
        threads: CPU threads for torch and faiss (Ray's CPU allotment).
        ranges: the checked code ranges (None: one range); a slice is searched within its range.
    """

    def __init__(self, table: np.ndarray, backend: str, threads: int,
                 ranges: Sequence[tuple[int, int]] | None = None) -> None:
        torch.set_num_threads(threads)
        try:
            import faiss

            faiss.omp_set_num_threads(threads)
        except ImportError:
            pass
        device = "cuda" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"
        self.x = table
        with warnings.catch_warnings():  # object-store arrays are read-only; we never write them
            warnings.simplefilter("ignore", UserWarning)
            self.searcher = make_range_searcher(table, check_ranges(ranges, table.shape[0]), backend, device)

    def backend_name(self) -> str:
        return self.searcher.name

    def pid(self) -> int:
        return os.getpid()

    def search(self, lo: int, hi: int, theta: float, max_group_size: int | None) -> Slice:
        return search_slice(self.searcher, self.x, lo, hi, theta, max_group_size)


def ensure_ray() -> bool:
    """The cluster in `RAY_ADDRESS`, else a fresh local one (never a stale `ray start` cluster).
    Returns True if this call initialised Ray."""
    return init_ray(include_dashboard=False)


def worker_plan(workers: int | None, cpus_per_worker: int) -> tuple[int, dict]:
    """(number of actors, actor options): one per GPU if the cluster has GPUs, else CPU slots.

    More actors than the cluster can place would sit pending while holding a slice (the pool
    never takes work back from a live actor), so the count is capped at what fits.
    """
    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    slots, options = (gpus, {"num_gpus": 1, "num_cpus": cpus_per_worker}) if gpus else \
        (max(1, int(resources.get("CPU", 1)) // cpus_per_worker), {"num_cpus": cpus_per_worker})
    if workers is not None and workers > slots:
        warnings.warn(f"{workers} workers asked for, the cluster fits {slots}; using {slots}",
                      stacklevel=3)
    return min(workers or slots, slots), options


class SlicePool:
    """Runs `search` over slices on a pool of actors, replacing dead actors and retrying."""

    def __init__(self, make_actor, size: int, max_attempts: int) -> None:
        self.make_actor, self.max_attempts = make_actor, max_attempts
        self.actors = [make_actor() for _ in range(size)]
        self.retries = 0

    def replace(self, index: int) -> None:
        try:
            ray.kill(self.actors[index], no_restart=True)
        except Exception:  # already gone: nothing to release
            pass
        self.actors[index] = self.make_actor()

    def run(self, bounds: list[tuple[int, int]], theta: float, cap: int | None,
            progress: bool) -> list[Slice]:
        pending = deque((lo, hi, 1) for lo, hi in bounds)
        idle, inflight, done = list(range(len(self.actors))), {}, []
        bar = tqdm(total=len(bounds), desc=f"groups theta={theta:g}", unit="slice", disable=bar_disabled(progress))
        while pending or inflight:
            while idle and pending:
                index, job = idle.pop(), pending.popleft()
                inflight[self.actors[index].search.remote(job[0], job[1], theta, cap)] = (index, job)
            (ref,), _ = ray.wait(list(inflight), num_returns=1)
            index, (lo, hi, attempt) = inflight.pop(ref)
            try:
                done.append(ray.get(ref))
                bar.update(1)
            except ray.exceptions.RayActorError as exc:
                if attempt >= self.max_attempts:
                    bar.close()
                    raise GroupBuildError(f"groups slice {lo}..{hi} failed {attempt} times (worker "
                                       f"died each time); last error: {exc}") from exc
                self.retries += 1
                self.replace(index)
                pending.appendleft((lo, hi, attempt + 1))
            idle.append(index)
        bar.close()
        return done

    def close(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)


def build_groups_distributed(
    embeddings: torch.Tensor | np.ndarray,
    build: GroupsBuild,
    slice_rows: int = SLICE_ROWS,
    max_attempts: int = 3,
    cpus_per_worker: int = 1,
    worker_cls: type = SliceWorker,
) -> SpeechGroups:
    """Groups for every row of `embeddings` `[V, D]`, built by Ray actors.

    Args:
        build: the request: theta, cap, ranges and backend as `build.build_groups` (the same
            groups); `workers` the number of actors (0 or None: one per GPU, else one per
            `cpus_per_worker` CPUs); `progress` a bar. Dedup and provenance are the caller's
            (`cache.build_with_metadata`).
        slice_rows: query rows per task (smaller slices balance better and lose less on a crash).
        max_attempts: tries per slice before giving up.
        cpus_per_worker: CPU threads each actor asks for (and uses).
        worker_cls: the actor class (a `SliceWorker`); Ray initialises locally if needed.

    Raises:
        ValueError: bad theta, cap, ranges or backend. RuntimeError: a slice kept failing.
    """
    backend, progress = build.backend, build.progress
    theta, max_group_size = check_theta(build.theta), check_cap(build.max_group_size)
    x = unit_rows(embeddings)
    ranges = check_ranges(build.ranges, x.shape[0])  # before any worker starts
    started = ensure_ray()
    pool = None
    try:
        count, options = worker_plan(build.workers, cpus_per_worker)
        bounds = slice_bounds(x.shape[0], slice_rows, ranges)
        table = ray.put(x)
        actor_cls = ray.remote(worker_cls).options(**options)
        pool = SlicePool(lambda: actor_cls.remote(table, backend, cpus_per_worker, ranges),
                         min(count, len(bounds)), max_attempts)
        slices = pool.run(bounds, theta, max_group_size, progress)
        name = ray.get(pool.actors[0].backend_name.remote())
    finally:
        if pool is not None:
            pool.close()
        if started:
            ray.shutdown()
    groups = assemble(slices, x.shape[0], theta, max_group_size, ranges)
    groups.meta.update(backend=name, workers=len(pool.actors), retries=pool.retries)
    return groups
