"""A worker's shards streaming through one decode loop, with their output written beside it.

Threads, all in the worker's process (no Ray here):
    callers   `submit` a prepared shard (the Ray actor calls it from one thread per held shard)
              and wait on the returned future for its commit record;
    decode    ONE loop over one `DecodeSession`: every held shard's rows share the batches
              (a row of the next shard takes the slot a row of the current one just left);
              when a shard's last row finishes, the shard goes to the IO queue; a worker runs
              it on its models' `KeptThread`, so every job they serve decodes on one thread;
    IO        finalises shards in the order they finished decoding: codec decode, audio
              encoding, the Parquet file, the upload and then the commit record.
The IO queue is bounded: when writing falls behind, the decode loop blocks on it (the time is
reported as `io_wait_s`), so at most `io_queue + 1` decoded shards wait in memory for their
files. A shard counts as done only once its commit record is written, after its data file; a
worker that dies loses exactly the shards it held and had not committed. Anything else that
runs the models (the worker's warm-up) runs on these threads too (`on_decode_thread`,
`on_io_thread`): part of a thread's CUDA state is its own (CUDA-graph trees, BLAS handles), so
a warm-up on another thread would leave the decode loop to pay for its own inside the job.

CPU threads: the decode thread is the only one that runs torch ops on several threads (the
worker's `torch_threads`); the IO thread runs its own (the codec, on a CPU worker) on one, and the
models are loaded on a short-lived thread (`on_short_thread`). OpenMP gives every thread that
runs a parallel op a team of helper threads that lives as long as that thread; once a process
holds more such threads than it has cores, every team's threads stop spinning between ops and
sleep almost at once (GNU OpenMP's throttled spinning), and each op then pays to wake them. On the
2-core VM under OpenMP's default wait policy, decoding alone ran at 393.7 tokens/s on a process's
main thread and at 268.6 on another thread beside the main thread's team
(benchmarks/results/job_throughput_cpu_tiny_omp_default_probe.md; docs/benchmarks.md, Job throughput).
"""

from __future__ import annotations

import contextlib
import queue
import resource
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from engine.api import DecodeSession
from engine.records import SynthesisResult
from engine.runtime.profiling import RoundProfiler

STOP = object()


@dataclass(eq=False)
class Call:
    """A function for one of the stream's threads to run between its other work (warm-up: a
    thread's own CUDA state, such as CUDA-graph trees and BLAS handles, is per thread)."""

    fn: Callable
    future: Future = field(default_factory=Future)

    def run(self) -> None:
        try:
            self.future.set_result(self.fn())
        except BaseException as exc:  # noqa: BLE001 - the caller gets it from the future
            self.future.set_exception(exc)


@dataclass(eq=False)
class ShardTask:
    """A shard in the worker: its prepared rows, results as they finish, and its future."""

    shard: object  # runtime.plan.Shard
    attempt: int
    prepared: list  # runtime.worker.Prepared, one per manifest row
    received: float  # time.monotonic() when the worker got it
    results: list[SynthesisResult | None] = field(default_factory=list)
    remaining: int = 0
    decoded: float | None = None
    future: Future = field(default_factory=Future)


class Counters:
    """Cumulative figures of the pipeline; `take` returns what accrued since the last take."""

    FIELDS = ("decode_rounds", "slot_rounds", "slots", "starved_slots", "split_slots", "decode_s", "decode_cpu_s",
              "decode_waits", "decode_preempted", "io_wait_s", "finalise_s", "overlap_s", "busy_s")

    def __init__(self) -> None:
        self.total = dict.fromkeys(self.FIELDS, 0.0)
        self.taken = dict.fromkeys(self.FIELDS, 0.0)

    def take(self, now: dict) -> dict:
        out = {k: now[k] - self.taken[k] for k in self.FIELDS}
        self.taken = dict(now)
        return out


def own_threads(n: int) -> None:
    """Give the calling thread's torch ops `n` CPU threads, for good. torch keeps one count per
    thread (OpenMP's), set from a process-wide default on the thread's first parallel op; so the
    thread takes the default first and then sets its own, and a later change of the default (by
    another thread's `torch.set_num_threads`) no longer reaches it."""
    import torch

    torch.get_num_threads()  # the thread's count initialised from the default, now
    torch.set_num_threads(n)


class KeptThread:
    """One thread that runs the functions given to it (`run`), one after another, until
    `close`; `run` after `close` starts a new one. A worker's models own one for their decode
    loops (`WorkerModels.decode_thread`), so that the jobs they serve in turn (a sweep's points)
    all decode on the same thread and what a thread keeps for itself is made once: its CUDA-graph
    trees (torch keeps them per thread: with `models.compile: cudagraphs` a new thread captures
    every graph again, into a memory pool of its own), BLAS handles, its OpenMP team."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: queue.Queue = queue.Queue()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def run(self, fn: Callable) -> Future:
        """Queue `fn()` behind what the thread was given before; the future resolves to its result."""
        call = Call(fn)
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self.loop, name=self.name, daemon=True)
                self.thread.start()
            self.calls.put(call)
        return call.future

    def loop(self) -> None:
        while (call := self.calls.get()) is not STOP:
            call.run()

    def close(self) -> None:
        """Let the thread finish what it was given, then end it."""
        with self.lock:
            thread, self.thread = self.thread, None
            if thread is not None:
                self.calls.put(STOP)
        if thread is not None:
            thread.join()


def on_short_thread(fn: Callable, name: str = "load"):
    """`fn()` on a thread that ends when it returns (its result, or its exception raised here).
    Whatever OpenMP threads `fn`'s torch ops started end with it (model loading's, so that they do
    not outlive it beside the decode thread's: module docstring)."""
    call = Call(fn)
    thread = threading.Thread(target=call.run, name=name, daemon=True)
    thread.start()
    thread.join()
    return call.future.result()


THREAD_USAGE = getattr(resource, "RUSAGE_THREAD", None)  # Linux


def thread_clock() -> tuple[float, int, int]:
    """The calling thread's (CPU seconds, voluntary context switches, involuntary ones). Over a
    stretch of wall time: CPU seconds short of the wall are time the thread did not run, either
    waiting (for the GIL, a lock, the device: voluntary switches) or runnable but preempted by
    other work on its core (involuntary switches). Switch counts are 0 where the platform has
    no per-thread usage (macOS)."""
    if THREAD_USAGE is None:
        return time.thread_time(), 0, 0
    ru = resource.getrusage(THREAD_USAGE)  # one call per round: CPU time and switches together
    return ru.ru_utime + ru.ru_stime, ru.ru_nvcsw, ru.ru_nivcsw


class ShardStream:
    """The decode loop and the IO thread of one worker.

    Args:
        session: the decode session every shard's rows go through.
        start_rows: `(task) -> [(settings, request)]` called on the decode thread when a shard
            arrives: fills `task.results` with error results and result shells, returns the
            rows to decode (request keys `(task, row index)`).
        finalise: `(task, figures) -> record` on the IO thread: writes the data file and then the
            commit record; `figures()` gives the pipeline's counters accrued since the last
            record, taken when called.
        io_queue: decoded shards that may wait for the IO thread (>= 1).
        torch_threads: CPU threads of the decode thread's torch ops (default: as many as the
            constructing thread has); the IO thread's run on one (module docstring).
        profiler: profiles some of the decode rounds (`runtime/profiling.py`); it finishes
            early when the batch runs empty, before the shard that emptied it is handed to the
            IO thread, so that shard's `finalise` finds the profile (`profiler.take()`).
        decode_thread: where the decode loop runs (a worker's models' `KeptThread`, left
            running by `close`); None: a `KeptThread` of the stream's own, ended by `close`.
    """

    def __init__(self, session: DecodeSession, start_rows: Callable, finalise: Callable, io_queue: int = 1,
                 profiler: RoundProfiler | None = None, torch_threads: int | None = None,
                 decode_thread: KeptThread | None = None) -> None:
        import torch

        self.session, self.start_rows, self.finalise = session, start_rows, finalise
        self.own_decode_thread = decode_thread is None
        self.decode_thread = decode_thread or KeptThread("decode")
        # the decode thread's torch threads (default: the constructing thread's); the IO thread's is 1
        self.torch_threads = torch_threads or torch.get_num_threads()
        self.profiler = profiler
        self.inbox: queue.Queue = queue.Queue()
        self.io: queue.Queue = queue.Queue(maxsize=max(1, io_queue))
        self.io_bound = max(1, io_queue)
        self.decoding: list[ShardTask] = []
        self.lock = threading.Lock()
        self.held = 0  # shards submitted and not yet resolved
        self.waiting_io = 0  # decoded shards not yet finalised (queued or being written)
        self.waiting_io_max = 0
        self.counters = Counters()
        self.decode_s = 0.0
        # the decode thread inside rounds: CPU seconds, and context switches (see thread_clock)
        self.decode_cpu_s, self.decode_waits, self.decode_preempted = 0.0, 0, 0
        self.round_started: float | None = None
        self.io_wait_s = self.finalise_s = self.overlap_s = 0.0
        self.busy_s, self.busy_since = 0.0, None
        # Empty slots by cause (the decode thread counts them): `split_slots` while rows waited
        # for another decoder (settings that cannot share a batch); the rest ran with nothing
        # queued: a dry spell, `starved_slots` once a later shard ends it (the worker was waiting
        # for its next shard), else the end of the worker's work (its last rows finishing).
        self.starved_slots = self.split_slots = self.dry_spell = 0
        self.io_thread: threading.Thread | None = None
        self.decode_done: Future | None = None  # the decode loop's run on `decode_thread`

    # ---- callers ------------------------------------------------------------------------------

    def hold(self) -> None:
        """Count a shard as held from now on (before it is prepared)."""
        with self.lock:
            if self.held == 0:
                self.busy_since = time.perf_counter()
            self.held += 1

    def release(self) -> None:
        with self.lock:
            self.held -= 1
            if self.held == 0 and self.busy_since is not None:
                self.busy_s += time.perf_counter() - self.busy_since
                self.busy_since = None

    def start_threads(self) -> None:
        with self.lock:  # shards arrive on several threads: start one loop, once
            if self.io_thread is None:
                io_ready = threading.Event()
                io = threading.Thread(target=self.io_loop, args=(io_ready,), name="shard-io", daemon=True)
                io.start()
                # the decode thread starts once the IO thread took its one CPU thread (which set
                # torch's default to 1): its own count then sets the default back to the worker's
                io_ready.wait()
                self.io_thread = io
                self.decode_done = self.decode_thread.run(self.decode_loop)

    def submit(self, task: ShardTask) -> Future:
        """Queue a prepared shard (already `hold`); its future resolves to the commit record."""
        self.start_threads()
        task.future.add_done_callback(lambda _: self.release())
        self.inbox.put(task)
        return task.future

    def on_decode_thread(self, fn: Callable) -> Future:
        """Run `fn()` on the decode thread, between rounds; the future resolves to its result."""
        self.start_threads()
        call = Call(fn)
        self.inbox.put(call)
        return call.future

    def on_io_thread(self, fn: Callable) -> Future:
        """Run `fn()` on the IO thread, in turn with the shards it writes."""
        self.start_threads()
        call = Call(fn)
        self.io.put(call)
        return call.future

    def close(self) -> None:
        """Stop the decode loop and the IO thread after the work queued so far (a decode
        thread given to the stream stays, for the next one)."""
        if self.io_thread is not None:
            self.inbox.put(STOP)
            self.decode_done.exception()  # waits for the loop's end
            self.io_thread.join()
            self.io_thread = self.decode_done = None
        if self.own_decode_thread:
            self.decode_thread.close()

    # ---- figures ------------------------------------------------------------------------------

    def decode_clock(self, now: float) -> float:
        """Seconds the decode loop has spent in rounds up to `now`."""
        started = self.round_started
        return self.decode_s + (now - started if started is not None else 0.0)

    def figures(self) -> dict:
        """Counters accrued since the previous call (one call per commit record)."""
        now = time.perf_counter()
        with self.lock:
            busy = self.busy_s + (now - self.busy_since if self.busy_since is not None else 0.0)
            held = self.held
        sched = self.session.scheduler
        totals = {"decode_rounds": sched.rounds, "slot_rounds": sched.slot_rounds, "slots": sched.slots,
                  "starved_slots": self.starved_slots, "split_slots": self.split_slots,
                  "decode_s": self.decode_clock(now), "decode_cpu_s": self.decode_cpu_s,
                  "decode_waits": self.decode_waits, "decode_preempted": self.decode_preempted,
                  "io_wait_s": self.io_wait_s,
                  "finalise_s": self.finalise_s, "overlap_s": self.overlap_s, "busy_s": busy}
        out = self.counters.take(totals)
        for k in ("decode_rounds", "slot_rounds", "slots", "starved_slots", "split_slots", "decode_waits",
                  "decode_preempted"):
            out[k] = int(out[k])
        out.update(held=held, decoders=len(sched.used), io_backlog_max=self.waiting_io_max)
        return out

    # ---- decode thread ------------------------------------------------------------------------

    def decode_loop(self) -> None:
        own_threads(self.torch_threads)
        while True:
            try:
                task = self.inbox.get(block=self.session.idle)
            except queue.Empty:
                task = None
            while task is not None:
                if task is STOP:
                    self.io.put(STOP)
                    return
                if isinstance(task, Call):
                    task.run()
                else:
                    self.start(task)
                try:
                    task = self.inbox.get_nowait()
                except queue.Empty:
                    task = None
            if self.session.idle:
                continue
            cpu, waits, preempted = thread_clock()
            self.round_started = start = time.perf_counter()
            sched = self.session.scheduler
            slots, filled = sched.slots, sched.slot_rounds
            try:
                with self.profiler.round() if self.profiler else contextlib.nullcontext():
                    done = self.session.step()
            except Exception as exc:  # the batch is in doubt: every shard in it is redone
                self.fail_all(exc)
                continue
            finally:
                self.decode_s += time.perf_counter() - start
                self.round_started = None
                now_cpu, now_waits, now_preempted = thread_clock()
                self.decode_cpu_s += now_cpu - cpu
                self.decode_waits += now_waits - waits
                self.decode_preempted += now_preempted - preempted
            empty = (sched.slots - slots) - (sched.slot_rounds - filled)
            if sched.queued:
                self.split_slots += empty
            else:
                self.dry_spell += empty
            finished = []
            for request, row in done:
                task, i = request.key
                res = task.results[i]
                res.codes, res.finish_reason, res.stats = row.tokens, row.finish_reason, row.stats
                task.remaining -= 1
                if task.remaining == 0:
                    self.decoding.remove(task)
                    finished.append(task)
            if self.profiler and (self.profiler.due or self.session.idle):
                self.profiler.finish()  # its rounds recorded, or the batch ran empty: the profile ends here
            for task in finished:
                self.hand_off(task)

    def start(self, task: ShardTask) -> None:
        try:
            rows = self.start_rows(task)
            task.remaining = len(rows)
            if rows:
                self.decoding.append(task)
                self.session.submit(rows)
                self.starved_slots += self.dry_spell  # the spell waited for this shard
                self.dry_spell = 0
        except Exception as exc:
            self.fail_all(exc, task)
            return
        if not rows:
            self.hand_off(task)

    def fail_all(self, exc: Exception, extra: ShardTask | None = None) -> None:
        """Fail every shard being decoded (and `extra`), and empty the batches."""
        self.session.reset()
        failed = self.decoding + ([extra] if extra is not None and extra not in self.decoding else [])
        self.decoding = []
        for task in failed:
            if not task.future.done():
                task.future.set_exception(exc)

    def hand_off(self, task: ShardTask) -> None:
        """A decoded shard to the IO queue; blocks while the queue is full (backpressure)."""
        task.decoded = time.perf_counter()
        with self.lock:
            self.waiting_io += 1
            self.waiting_io_max = max(self.waiting_io_max, self.waiting_io)
        start = time.perf_counter()
        self.io.put(task)
        self.io_wait_s += time.perf_counter() - start

    # ---- IO thread ----------------------------------------------------------------------------

    def io_loop(self, ready: threading.Event) -> None:
        own_threads(1)  # one OpenMP team per process: the decode thread's (module docstring)
        ready.set()
        while True:
            task = self.io.get()
            if task is STOP:
                return
            if isinstance(task, Call):
                task.run()
                continue
            start = time.perf_counter()
            decoding_at_start = self.decode_clock(start)

            def figures(start=start, decoding_at_start=decoding_at_start):
                now = time.perf_counter()
                self.finalise_s += now - start
                self.overlap_s += self.decode_clock(now) - decoding_at_start
                return self.figures()
            try:
                record = self.finalise(task, figures)
            except Exception as exc:
                task.future.set_exception(exc)
            else:
                task.future.set_result(record)
            finally:
                with self.lock:
                    self.waiting_io -= 1
