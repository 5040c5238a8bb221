"""Scheduling shards over worker actors, with retries when workers or nodes die.

Each worker holds up to `JobSpec.shards_held` shards at once (it decodes their rows in one batch
and commits each when its last row is done, in any order), and no more than its fair share of
the shards left; a shard goes to whichever worker has room. A worker enters service only after
it answered `info()` (its models are loaded), so a replacement that the cluster cannot place
never receives a shard. When a worker dies (while decoding or while loading its models), every
shard it held is requeued (each up to `max_retries` times, after a per-shard exponential backoff
with jitter while the other shards go on) and a replacement is started as soon as the live nodes
have room for it. When no worker is left and no live node can host one (the only worker node
was lost), the pool asks the autoscaler for capacity and waits up to
`resources.capacity_wait_s` for nodes to join; committed shards are kept meanwhile. A write
that failed for a lasting reason (`WriteFailed`: no space left, a quota, a read-only output) is
not retried: the pool stops handing out shards and ends, as it does when its caller's `halt`
says so (the driver lost its lease on the output) and when a worker's write was refused because
another driver has taken the output over (`Fenced`: counted, never retried). A worker's death and
a shard's last failure are said in one line each, cause first (Ray's full text goes to the log).
"""

from __future__ import annotations

import logging
import random
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import ray
from ray.exceptions import RayActorError, RayTaskError

from engine.config import JobSpec
from engine.console import counted
from engine.errors import JobFailed
from engine.io.lease import Fence, Fenced
from engine.io.storage import WriteFailed, backoff_s
from engine.runtime.actors import SynthesisWorker, cluster_capacity, worker_options
from engine.runtime.commits import CommitRecord
from engine.runtime.plan import Shard

log = logging.getLogger(__name__)
START_TIMEOUT_S = 900.0  # loading an 8B target from object storage takes minutes
POLL_S = 5.0  # longest wait for an event before the pool looks at the cluster again


def request_capacity(bundles: list[dict]) -> bool:
    """Ask the autoscaler for room for `bundles` (harmless without one); False if Ray refused."""
    try:
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=bundles)
        return True
    except Exception:  # noqa: BLE001 - a cluster without an autoscaler, an old Ray: just wait
        return False


class IdleWorkers:
    """Loaded workers kept between the jobs one driver runs (a sweep's points). A job whose
    `JobSpec.worker_key` matches takes them instead of starting new ones and gives back, when
    it ends, those it leaves alive and idle; a job of another key first retires the kept ones
    (it needs their CPUs and GPUs). Every worker made while this exists is made with at least
    `concurrency` threads (`max_concurrency`), enough for the largest shard window of the jobs
    that will share it.

    Args:
        concurrency: the actors' `max_concurrency` (shard window + 2 of the most demanding job).
    """

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.key: str | None = None
        self.actors: list = []

    def take(self, key: str, concurrency: int):
        """A kept worker for a job of `key` needing `concurrency` threads, or None."""
        if key != self.key:
            self.close()
            self.key = key
        if concurrency > self.concurrency or not self.actors:
            return None
        return self.actors.pop()

    def give(self, key: str, actor) -> None:
        if key == self.key:
            self.actors.append(actor)
        else:
            ray.kill(actor, no_restart=True)

    def close(self) -> None:
        """Retire every kept worker (gone with Ray already if this process left it)."""
        for actor in self.actors if ray.is_initialized() else []:
            ray.kill(actor, no_restart=True)
        self.actors = []


@dataclass
class PoolReport:
    committed: list[CommitRecord] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # shard id -> last error
    retries: int = 0
    replaced: int = 0
    reused: int = 0  # workers that served this job with models loaded for a previous one (`IdleWorkers`)
    capacity_waits: list[dict] = field(default_factory=list)  # {"waited_s", "outcome"} per wait
    first_dispatch: float | None = None  # time.monotonic() of the first shard handed out
    last_commit: float | None = None
    placements: dict[str, dict] = field(default_factory=dict)  # worker -> where it loaded
    stopped: str | None = None  # why the pool stopped before its shards were done (a lasting write failure...)
    fenced: int = 0  # shards whose writes were refused: another driver holds the output now
    remedy: str | None = None  # what to do about it, where known (`WriteFailed.remedy`)

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
        on_commit: called with each `CommitRecord` as it arrives.
        warmup: workers warm up after loading, and no shard is handed out before every first
            worker is ready (throughput measurements: nobody starts early).
        idle: loaded workers to take before starting new ones, and to give the workers back to
            at the end (a sweep's points); None: every worker is started for this job and
            retired at its end.
        halt: asked between events: a reason to stop now (None: go on).
        fence: the driver's lease, sent with every shard: the workers' writes are refused once
            another driver holds the output (None: unchecked).
    """

    def __init__(self, spec: JobSpec, groups_ref, on_commit: Callable[[CommitRecord], None],
                 warmup: bool = False, notify: Callable[[str], None] | None = None,
                 idle: IdleWorkers | None = None, halt: Callable[[], str | None] | None = None,
                 fence: Fence | None = None) -> None:
        self.spec, self.groups_ref, self.on_commit, self.idle = spec, groups_ref, on_commit, idle
        self.fence = fence
        self.halt = halt or (lambda: None)
        self.notify = notify or (lambda text: print(text, file=sys.stderr, flush=True))
        self.warmup = warmup
        self.spec_json = spec.model_dump_json()
        self.free: deque[int] = deque()  # one entry per shard a worker can take now
        self.window = spec.shards_held
        self.actors: dict[int, object] = {}
        self.starting: dict[object, tuple[int, float]] = {}  # info ref -> (slot, started at)
        self.inflight: dict[object, tuple[int, Shard]] = {}
        self.next_id = 0
        self.pending: deque[Shard] = deque()
        self.attempts: dict[str, int] = {}
        self.delayed: list[tuple[float, Shard]] = []  # (monotonic time it may run again, shard)
        self.waiting_since: float | None = None  # no worker and no room: waiting for capacity
        self.rng = random.Random()
        self.target = spec.resources.workers
        self.report = PoolReport()
        self.kept: set[int] = set()  # slots of workers taken from `idle`

    def start_worker(self) -> None:
        slot = self.next_id
        self.next_id += 1
        options = worker_options(self.spec)
        kept = None
        if self.idle is not None:
            kept = self.idle.take(self.spec.worker_key, options["max_concurrency"])
            options["max_concurrency"] = max(options["max_concurrency"], self.idle.concurrency)
        if kept is not None:  # loaded already: it takes this job's settings (and warms up for them)
            self.kept.add(slot)
            self.actors[slot] = kept
            ready = kept.configure.remote(self.spec_json, self.groups_ref, f"w{slot}", self.warmup)
        else:
            self.actors[slot] = SynthesisWorker.options(**options).remote(
                self.spec_json, self.groups_ref, f"w{slot}", self.warmup)
            ready = self.actors[slot].info.remote()
        self.starting[ready] = (slot, time.monotonic())

    def retire(self, slot: int) -> None:
        actor = self.actors.pop(slot, None)
        if actor is not None:
            ray.kill(actor, no_restart=True)

    def live(self) -> int:
        return len(self.actors)

    def work_left(self) -> bool:
        return bool(self.pending or self.delayed)

    def replace(self) -> bool:
        """Start a replacement if work remains, fewer than the job's workers are live or
        starting, and the live nodes have room for one more."""
        if self.work_left() and self.live() < min(self.target, cluster_capacity(self.spec)):
            self.start_worker()
            self.report.replaced += 1
            return True
        return False

    def top_up(self) -> None:
        """Replace every worker missing from `resources.workers` that the live nodes can hold
        now (nodes may have joined since a worker died)."""
        while self.live() < self.target and self.replace():
            pass

    def wait_for_capacity(self) -> bool:
        """No worker is live or starting and none can be placed: ask the autoscaler for the
        job's workers and wait for nodes. False once `capacity_wait_s` is spent."""
        res = self.spec.resources
        now = time.monotonic()
        if self.waiting_since is None:
            self.waiting_since = now
            bundle = {"CPU": res.cpus_per_worker, **({"GPU": res.gpus_per_worker} if res.gpus_per_worker else {})}
            asked = request_capacity([bundle] * self.target)
            need = ", ".join(f"{v:g} {k}" for k, v in bundle.items())
            left = len(self.pending) + len(self.delayed)
            self.notify(f"no live node can host a worker ({need} each): "
                        + ("asked the autoscaler for capacity; " if asked else "")
                        + f"waiting up to {res.capacity_wait_s:g} s (resources.capacity_wait_s) for nodes "
                        f"to join. {counted(len(self.report.committed), 'shard')} committed in this run kept; "
                        f"{left} left.")
        waited = now - self.waiting_since
        if waited > res.capacity_wait_s:
            self.report.capacity_waits.append({"waited_s": round(waited, 1), "outcome": "timed out"})
            return False
        return True

    def capacity_found(self) -> None:
        if self.waiting_since is not None:
            waited = time.monotonic() - self.waiting_since
            self.report.capacity_waits.append({"waited_s": round(waited, 1), "outcome": "nodes joined"})
            self.notify(f"capacity found after {waited:.0f} s: starting workers again")
            self.waiting_since = None
            request_capacity([])  # withdraw the request: the autoscaler may scale down again

    def release_due(self) -> float:
        """Move shards whose backoff is over to the queue; seconds until the next is due."""
        now = time.monotonic()
        due = [item for item in self.delayed if item[0] <= now]
        for item in sorted(due, key=lambda x: x[1].id, reverse=True):
            self.delayed.remove(item)
            self.pending.appendleft(item[1])
        return min((t - now for t, _ in self.delayed), default=POLL_S)

    def retry_later(self, shard: Shard) -> None:
        res = self.spec.resources
        delay = backoff_s(self.attempts[shard.id], res.retry_backoff_s, res.retry_backoff_max_s, self.rng)
        self.delayed.append((time.monotonic() + delay, shard))
        self.report.retries += 1

    def run(self, shards: list[Shard]) -> PoolReport:
        """Run `shards` until each is committed or failed, or the pool stops; every worker is
        retired as it ends, or given back to `idle`."""
        self.begin(shards)
        finished = False
        try:
            finished = self.serve()
        finally:
            self.release_workers(finished)
        return self.report

    def begin(self, shards: list[Shard]) -> None:
        """Queue `shards` and start the job's workers (no more than it has shards)."""
        self.pending = deque(shards)
        self.target = min(self.spec.resources.workers, len(self.pending))  # workers the job runs on
        if self.target and cluster_capacity(self.spec) == 0:  # Ray would keep them pending, silently
            self.warn_no_room()
        for _ in range(self.target):
            self.start_worker()

    def warn_no_room(self) -> None:
        res = self.spec.resources
        need = f"{res.cpus_per_worker:g} CPU" + (f", {res.gpus_per_worker:g} GPU" if res.gpus_per_worker else "")
        self.notify(f"no live node can host a worker ({need} each) now: the workers wait for nodes to join "
                    "(an autoscaler); on a machine without what they need, change resources (e.g. "
                    "resources.gpus_per_worker: 0 on a machine without GPUs)")

    def serve(self) -> bool:
        """Hand out shards and handle what comes back until no work is left or the pool stops.
        Returns whether it ran to its end (False: stopped, and workers may still hold shards)."""
        barrier = self.warmup  # no shard before every first worker is ready
        while self.work_left() or self.inflight:
            if (reason := self.report.stopped or self.halt()) is not None:
                self.stop(reason)
                break
            next_due = self.release_due()
            barrier = barrier and bool(self.starting)
            if not barrier:
                self.dispatch()
            if not self.keep_workers():
                self.fail_unplaced()
                break
            self.handle_next(next_due)
        return self.report.stopped is None

    def dispatch(self) -> None:
        """Hand pending shards to the workers with room, none beyond its fair share (the rest of
        the shards is kept for workers still starting)."""
        over_share = []
        while self.free and self.pending:
            slot = self.free.popleft()
            if self.holding(slot) >= self.fair_share():
                over_share.append(slot)
                continue
            self.send(slot, self.pending.popleft())
        self.free.extend(over_share)

    def send(self, slot: int, shard: Shard) -> None:
        """Start `shard`'s next attempt on the worker of `slot`."""
        if self.report.first_dispatch is None:
            self.report.first_dispatch = time.monotonic()
        self.attempts[shard.id] = self.attempts.get(shard.id, 0) + 1
        ref = self.actors[slot].process.remote(shard, self.attempts[shard.id], self.fence)
        self.inflight[ref] = (slot, shard)

    def keep_workers(self) -> bool:
        """Start the workers missing where the live nodes have room; with none live and work
        left, wait for capacity. False once that wait is over with no worker placed."""
        if self.live() < self.target and self.work_left():
            self.top_up()
        if self.live():
            self.capacity_found()
            return True
        return not self.work_left() or self.wait_for_capacity()

    def fail_unplaced(self) -> None:
        """Fail every shard not yet run: no worker could be placed within `capacity_wait_s`."""
        waited = self.report.capacity_waits[-1]["waited_s"]
        for _, shard in self.delayed:
            self.pending.append(shard)
        for shard in self.pending:
            self.report.failed[shard.id] = (
                f"no worker could be started on the cluster (waited {waited:g} s for "
                "capacity, resources.capacity_wait_s)")
        self.pending.clear()
        self.delayed.clear()

    def handle_next(self, next_due: float) -> None:
        """Wait for the next event (a worker ready, a shard's result) and handle it; wait no
        longer than `POLL_S` or until the next shard's backoff is over (`next_due` seconds)."""
        waitables = list(self.inflight) + list(self.starting)
        timeout = max(0.05, min(POLL_S, next_due))
        if not waitables:
            time.sleep(min(timeout, 1.0))
            return
        done, _ = ray.wait(waitables, num_returns=1, timeout=timeout)
        if not done:
            self.check_start_timeouts()
        elif done[0] in self.starting:
            self.on_started(done[0])
        else:
            self.on_finished(done[0])

    def release_workers(self, finished: bool) -> None:
        """Give the workers back to `idle` where the job ran to its end (idle: no shard held),
        else retire them; withdraw a request for capacity still open."""
        starting = {slot for slot, _ in self.starting.values()}
        for slot in list(self.actors):
            if self.idle is not None and finished and slot not in starting:
                self.idle.give(self.spec.worker_key, self.actors.pop(slot))
            else:
                self.retire(slot)
        if self.waiting_since is not None:
            request_capacity([])

    def stop(self, reason: str) -> None:
        """End the job here: results already back count (commits made, writes refused), every
        other shard not committed yet fails with `reason` (the workers are retired as the pool
        ends; a rerun does those shards)."""
        self.report.stopped = reason
        unsent = [*self.pending, *(s for _, s in self.delayed)]
        self.pending.clear()
        self.delayed.clear()
        if self.inflight:
            done, _ = ray.wait(list(self.inflight), num_returns=len(self.inflight), timeout=0)
            for ref in done:
                self.on_finished(ref)
        for shard in [*unsent, *(s for _, s in self.delayed), *(s for _, s in self.inflight.values())]:
            self.report.failed.setdefault(shard.id, f"not run: {reason}")
        self.delayed.clear()
        self.inflight.clear()

    def holding(self, slot: int) -> int:
        return sum(1 for s, _ in self.inflight.values() if s == slot)

    def fair_share(self) -> int:
        """Most shards one worker should hold now: the remaining work split over the workers
        (a worker that loads first must not take every shard of a small job)."""
        return max(1, -(-(len(self.pending) + len(self.inflight)) // max(self.live(), 1)))

    def on_started(self, ref) -> None:
        slot, _ = self.starting.pop(ref)
        try:
            info = ray.get(ref)
        except RayActorError as exc:
            self.actors.pop(slot, None)
            if exc.actor_init_failed:
                raise JobFailed(f"worker w{slot} failed to start: {first_line(exc)}") from None
            self.replace()  # died while loading (process killed, node lost): replaced like any other
            return
        except RayTaskError as exc:  # a kept worker refused this job's settings
            raise JobFailed(f"worker w{slot} could not take this job: {first_line(exc)}") from None
        self.report.placements[info["worker"]] = {k: info[k] for k in ("node", "host", "gpu_ids", "device")}
        self.report.reused += slot in self.kept
        self.free.extend([slot] * self.window)

    def room_back(self, slot: int) -> None:
        """A shard of `slot` is resolved: the worker may take another, if it still lives (a
        result can be read after its worker's death was handled)."""
        if slot in self.actors:
            self.free.append(slot)

    def on_finished(self, ref) -> None:
        slot, shard = self.inflight.pop(ref)
        try:
            record: CommitRecord = ray.get(ref)
        except (RayActorError, RayTaskError) as exc:
            died = isinstance(exc, RayActorError)
            first_news = died and slot in self.actors  # its other shards' failures follow
            if died:
                self.actors.pop(slot, None)
                self.free = deque(s for s in self.free if s != slot)  # its other shards fail too
            else:
                self.room_back(slot)  # only this shard failed
            cause = getattr(exc, "cause", None)
            log.info("shard %s on worker w%s: %s", shard.id, slot, exc)  # Ray's whole text (--verbose)
            if isinstance(cause, Fenced):  # another driver holds the output: never retried here
                self.report.fenced += 1
                self.report.failed[shard.id] = "not committed: the output was taken over by another driver"
                if self.report.stopped is None:
                    self.report.stopped = str(cause)
            elif isinstance(cause, WriteFailed):  # no space, quota, read-only: retries would fail alike
                self.report.failed[shard.id] = str(cause)
                if self.report.stopped is None:
                    self.report.stopped, self.report.remedy = str(cause), cause.remedy
            elif self.attempts[shard.id] <= self.spec.resources.max_retries:
                self.retry_later(shard)
            else:
                self.report.failed[shard.id] = cause_line(exc)
                self.notify(f"shard {shard.id} failed after {counted(self.attempts[shard.id], 'attempt')}: "
                            f"{cause_line(exc)}")
            if first_news:
                held = 1 + sum(1 for s, _ in self.inflight.values() if s == slot)
                self.notify(f"worker w{slot} died ({cause_line(exc)}) holding {counted(held, 'shard')}, "
                            "retried up to resources.max_retries times (--verbose prints Ray's report)")
            if died:
                self.replace()
            return
        self.room_back(slot)
        self.report.committed.append(record)
        self.report.last_commit = time.monotonic()
        self.on_commit(record)

    def check_start_timeouts(self) -> None:
        now = time.monotonic()
        limit = START_TIMEOUT_S + self.spec.resources.capacity_wait_s  # placement, then loading
        for ref, (slot, since) in list(self.starting.items()):
            if now - since > limit:
                self.starting.pop(ref)
                self.retire(slot)


CAUSE_WIDTH = 160  # characters of a cause in the pool's own lines (Ray's whole text goes to the log)


def first_line(exc: BaseException, width: int = 500) -> str:
    """The most telling line of a (possibly Ray-wrapped) error, cut at a word within `width`."""
    text = str(getattr(exc, "cause", None) or exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line.split(":")[0]]
    line = errors[-1] if errors else lines[-1] if lines else type(exc).__name__
    return line if len(line) <= width else line[:width].rsplit(" ", 1)[0] + " ..."


def cause_line(exc: BaseException) -> str:
    """Why a worker died or a shard failed, in a few words first: the worker ran out of memory,
    was killed, exited; else the error's most telling line, cut at a word."""
    if isinstance(exc, RayActorError):
        text = str(exc)
        if "OutOfMemoryError" in text or "out of memory" in text.lower() or "memory monitor" in text:
            return ("out of memory, the node's memory monitor killed it: lower resources.batch_size or "
                    "resources.shard_window")
        if "SIGKILL" in text or "killed" in text.lower():
            return "its process was killed"
        if "node" in text.lower() and ("died" in text.lower() or "dead" in text.lower()):
            return "its node died"
        return "its process exited unexpectedly"
    return first_line(exc, CAUSE_WIDTH)
