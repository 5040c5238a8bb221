"""What a worker's pipeline measures (`runtime/stream.py`): its counters and clocks, kept apart
from the threads and queues that carry the rows, and taken into each commit record as what
accrued since the previous one (`commits.Counters`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from engine.runtime.commits import Counters, PipelineFigures
from engine.runtime.threads import thread_clock


@dataclass
class Measured:
    """What the write stage takes for a shard's commit record once the shard's files are
    written: the pipeline's figures since the previous record, and a decode-loop profile that
    finished since (None: none), which the record names once it is written."""

    figures: PipelineFigures
    profile: dict | None = None


class StreamMetrics:
    """A pipeline's cumulative counters and clocks, and what the last commit record took of them.

    Each figure has one writer: the decode thread (its rounds, their clocks and empty slots, its
    waits to hand rows on), the IO thread (`finalise_s`, `overlap_s`), the callers under the
    stream's lock (the busy clock, the IO backlog). The scheduler keeps the rounds and slots
    itself: `take` reads them from it.

    Empty slots are counted by cause: `split_slots` while rows waited for another decoder
    (settings that cannot share a batch); the rest ran with nothing queued: a dry spell, counted
    as `starved_slots` once later rows end it (the worker was waiting for its next shard), else
    the end of the worker's work (its last rows finishing).
    """

    def __init__(self) -> None:
        self.total = Counters()  # the scheduler's rounds and slots aside (see `take`)
        self.taken = Counters()  # the totals the previous record was taken at
        self.round_started: float | None = None  # perf_counter() of the round running now
        self.busy_since: float | None = None  # perf_counter() since the worker holds a shard
        self.dry_spell = 0  # empty slots with nothing queued, their cause not known yet
        self.io_backlog = self.io_backlog_max = 0  # settled shards not yet written (queued or writing)

    # ---- decode thread ------------------------------------------------------------------------

    def round_began(self) -> tuple[float, tuple[float, int, int]]:
        """A decode round starts: its start (perf_counter) and the thread's clock (`thread_clock`)."""
        clock = thread_clock()
        self.round_started = start = time.perf_counter()
        return start, clock

    def round_ended(self, start: float, clock: tuple[float, int, int]) -> None:
        """The round `round_began` gave `start` and `clock` of has ended: its time counted."""
        total = self.total
        total.decode_s += time.perf_counter() - start
        self.round_started = None
        cpu, waits, preempted = thread_clock()
        total.decode_cpu_s += cpu - clock[0]
        total.decode_waits += waits - clock[1]
        total.decode_preempted += preempted - clock[2]

    def empty(self, slots: int, queued: bool) -> None:
        """A round left `slots` empty, with rows `queued` for another decoder or nothing queued."""
        if queued:
            self.total.split_slots += slots
        else:
            self.dry_spell += slots

    def fed(self) -> None:
        """Rows entered the decoder: the dry spell before them waited for these rows."""
        self.total.starved_slots += self.dry_spell
        self.dry_spell = 0

    def decode_clock(self, now: float) -> float:
        """Seconds the decode loop has spent in rounds up to `now`."""
        started = self.round_started
        return self.total.decode_s + (now - started if started is not None else 0.0)

    # ---- under the stream's lock --------------------------------------------------------------

    def busy_began(self, now: float) -> None:
        self.busy_since = now

    def busy_ended(self, now: float) -> None:
        if self.busy_since is not None:
            self.total.busy_s += now - self.busy_since
            self.busy_since = None

    def busy_clock(self, now: float) -> float:
        """Seconds the worker has held shards up to `now`."""
        return self.total.busy_s + (now - self.busy_since if self.busy_since is not None else 0.0)

    def backlog_in(self) -> None:
        """A settled shard waits for the IO thread."""
        self.io_backlog += 1
        self.io_backlog_max = max(self.io_backlog_max, self.io_backlog)

    def backlog_out(self) -> None:
        """A settled shard is written (or failed)."""
        self.io_backlog -= 1

    # ---- a commit record's share --------------------------------------------------------------

    def take(self, now: float, busy: float, scheduler) -> Counters:
        """What accrued since the previous take (one take per commit record), up to `now`: the
        worker busy `busy` seconds so far (`busy_clock`, read under the stream's lock), the
        rounds and slots as the decode stage's `scheduler` counts them."""
        totals = replace(self.total, decode_rounds=scheduler.rounds, slot_rounds=scheduler.slot_rounds,
                         slots=scheduler.slots, decode_s=self.decode_clock(now), busy_s=busy)
        out = totals.since(self.taken)
        self.taken = totals
        return out
