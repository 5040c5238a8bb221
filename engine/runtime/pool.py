"""Scheduling shards over worker actors, with retries when workers or nodes die.

Each worker holds up to `resources.window` shards at once (it decodes their rows in one batch
and commits each when its last row is done, in any order), and no more than its fair share of
the shards left; a shard goes to whichever worker has room. A worker enters service only after
it answered `info()` (its models are loaded), so a replacement that the cluster cannot place
never receives a shard. When a worker dies, every shard it held is requeued (each up to
`max_retries` times) and a replacement is started if the live nodes have room for it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import ray
from ray.exceptions import RayActorError, RayTaskError

from engine.config import JobSpec
from engine.runtime.actors import SynthesisWorker, cluster_capacity, worker_options
from engine.runtime.plan import Shard

START_TIMEOUT_S = 900.0  # loading an 8B target from object storage takes minutes


class JobFailed(RuntimeError):
    """The job cannot go on (e.g. workers fail to start); committed shards are kept."""


@dataclass
class PoolReport:
    committed: list[dict] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # shard id -> last error
    retries: int = 0
    replaced: int = 0
    first_dispatch: float | None = None  # time.monotonic() of the first shard handed out
    last_commit: float | None = None

    @property
    def steady_s(self) -> float | None:
        """First dispatch to last commit: the synthesis itself, model loading excluded."""
        if self.first_dispatch is None or self.last_commit is None:
            return None
        return self.last_commit - self.first_dispatch


class WorkerPool:
    """Runs `shards` on up to `spec.resources.workers` actors.

    Args:
        spec: the job.
        groups_ref: object ref of the PCG groups (or None).
        on_commit: called with each commit record as it arrives.
        warmup: workers warm up after loading, and no shard is handed out before every first
            worker is ready (throughput measurements: nobody starts early).
    """

    def __init__(self, spec: JobSpec, groups_ref, on_commit: Callable[[dict], None],
                 warmup: bool = False) -> None:
        self.spec, self.groups_ref, self.on_commit = spec, groups_ref, on_commit
        self.warmup = warmup
        self.spec_json = spec.model_dump_json()
        self.free: deque[int] = deque()  # one entry per shard a worker can take now
        self.window = spec.resources.window
        self.actors: dict[int, object] = {}
        self.starting: dict[object, tuple[int, float]] = {}  # info ref -> (slot, started at)
        self.inflight: dict[object, tuple[int, Shard]] = {}
        self.next_id = 0
        self.pending: deque[Shard] = deque()
        self.attempts: dict[str, int] = {}
        self.report = PoolReport()

    def start_worker(self) -> None:
        slot = self.next_id
        self.next_id += 1
        actor = SynthesisWorker.options(**worker_options(self.spec)).remote(
            self.spec_json, self.groups_ref, f"w{slot}", self.warmup)
        self.actors[slot] = actor
        self.starting[actor.info.remote()] = (slot, time.monotonic())

    def retire(self, slot: int) -> None:
        actor = self.actors.pop(slot, None)
        if actor is not None:
            ray.kill(actor, no_restart=True)

    def live(self) -> int:
        return len(self.actors)

    def replace(self) -> bool:
        """Start a replacement if work remains and the live nodes have room."""
        if self.pending and self.live() < min(self.spec.resources.workers, cluster_capacity(self.spec)):
            self.start_worker()
            self.report.replaced += 1
            return True
        return False

    def run(self, shards: list[Shard]) -> PoolReport:
        self.pending = deque(shards)
        for _ in range(min(self.spec.resources.workers, len(self.pending))):
            self.start_worker()
        try:
            barrier = self.warmup
            while self.pending or self.inflight:
                barrier = barrier and bool(self.starting)
                over_share = []
                while self.free and self.pending and not barrier:
                    slot = self.free.popleft()
                    if self.holding(slot) >= self.fair_share():
                        over_share.append(slot)  # keep the rest for workers still starting
                        continue
                    shard = self.pending.popleft()
                    if self.report.first_dispatch is None:
                        self.report.first_dispatch = time.monotonic()
                    self.attempts[shard.id] = self.attempts.get(shard.id, 0) + 1
                    ref = self.actors[slot].process.remote(shard, self.attempts[shard.id])
                    self.inflight[ref] = (slot, shard)
                self.free.extend(over_share)
                if not self.inflight and not self.starting and not self.free and not self.replace():
                    for shard in self.pending:
                        self.report.failed[shard.id] = "no worker could be started on the cluster"
                    break
                done, _ = ray.wait(list(self.inflight) + list(self.starting), num_returns=1, timeout=5.0)
                if not done:
                    self.check_start_timeouts()
                    continue
                ref = done[0]
                if ref in self.starting:
                    self.on_started(ref)
                else:
                    self.on_finished(ref)
        finally:
            for slot in list(self.actors):
                self.retire(slot)
        return self.report

    def holding(self, slot: int) -> int:
        return sum(1 for s, _ in self.inflight.values() if s == slot)

    def fair_share(self) -> int:
        """Most shards one worker should hold now: the remaining work split over the workers
        (a worker that loads first must not take every shard of a small job)."""
        return max(1, -(-(len(self.pending) + len(self.inflight)) // max(self.live(), 1)))

    def on_started(self, ref) -> None:
        slot, _ = self.starting.pop(ref)
        try:
            ray.get(ref)
        except RayActorError as exc:
            self.actors.pop(slot, None)
            if exc.actor_init_failed:
                raise JobFailed(f"worker w{slot} failed to start: {first_line(exc)}") from None
            return  # died while starting (node lost): the next failure path replaces it
        self.free.extend([slot] * self.window)

    def on_finished(self, ref) -> None:
        slot, shard = self.inflight.pop(ref)
        try:
            record = ray.get(ref)
        except (RayActorError, RayTaskError) as exc:
            died = isinstance(exc, RayActorError)
            if died:
                self.actors.pop(slot, None)
                self.free = deque(s for s in self.free if s != slot)  # its other shards fail too
            else:
                self.free.append(slot)  # the worker lives; only this shard failed
            if self.attempts[shard.id] <= self.spec.resources.max_retries:
                self.pending.appendleft(shard)
                self.report.retries += 1
            else:
                self.report.failed[shard.id] = first_line(exc)
            if died:
                self.replace()
            return
        self.free.append(slot)
        self.report.committed.append(record)
        self.report.last_commit = time.monotonic()
        self.on_commit(record)

    def check_start_timeouts(self) -> None:
        now = time.monotonic()
        for ref, (slot, since) in list(self.starting.items()):
            if now - since > START_TIMEOUT_S:
                self.starting.pop(ref)
                self.retire(slot)


def first_line(exc: BaseException) -> str:
    """The most telling line of a (possibly Ray-wrapped) error."""
    text = str(getattr(exc, "cause", None) or exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line.split(":")[0]]
    return (errors[-1] if errors else lines[-1] if lines else type(exc).__name__)[:500]
