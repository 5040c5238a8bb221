"""A worker's pipeline: the threads that carry its rows through the stages, and the queues
between them (no Ray here; the stages are in `runtime/stages/`).

    shard --read, prepare--> inbox --decode--> [verify queue --codec, verify-->] IO queue --codec, write--> commit
                               ^                                 |
                               +------ regenerations ------------+

Threads, all in the worker's process:
    callers   `ShardProcessor.submit` reads and prepares a shard on the caller's thread (the Ray
              actor calls it from one thread per held shard), then `submit`s it here and waits on
              the returned future for its commit record;
    decode    ONE loop over the decode stage: every held shard's rows share its batches (a row of
              the next shard takes the slot a row of the current one just left); a worker runs
              it on its models' `KeptThread`, so every job they serve decodes on one thread. A
              chunk of a split row that ended without a speech code is decoded again at once,
              ahead of the queued rows (`text.chunk_retries`); any other finished row goes to
              the verify thread (the quality gate on), else it is settled;
    verify    with the quality gate on: the codec and verify stages on finished rows, a few at
              a time; a row that failed and has attempts left goes back to the decode thread,
              which queues it ahead of new rows; a passed or rejected row is settled;
    IO        the write stage on each shard whose rows have all settled, in that order: the codec
              for rows not yet decoded to audio, audio encoding, the shard's files, the upload
              and then the commit record.
Queues are bounded where memory is at stake: the IO queue by `io_queue` shards (the thread that
settles shards blocks on it, `io_wait_s`), so at most `io_queue + 1` settled shards wait for
their files; the verify queue by `VERIFY_QUEUE_BATCHES` batches of decoded rows, which hold only
their codes until the verify thread turns them into audio (the decode thread blocks on it,
`verify_wait_s`): decoding runs ahead of a slower check instead of waiting for each batch, and
the worker holds enough more shards to fill that queue (`JobSpec.shards_held`). A
shard counts as done only once its commit record is written, after its data file; a worker that
dies loses exactly the shards it held and had not committed. Anything else that runs the models
(the worker's warm-up) runs on these threads too (`on_decode_thread`, `on_io_thread`): part of a
thread's CUDA state is its own (CUDA-graph trees, BLAS handles), so a warm-up on another thread
would leave the decode loop to pay for its own inside the job.
How the threads use the CPU: `runtime/threads.py`.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.config import VERIFY_QUEUE_BATCHES
from engine.runtime.commits import PipelineFigures
from engine.runtime.metrics import Measured, StreamMetrics
from engine.runtime.profiling import RoundProfiler
from engine.runtime.stages.codec import CodecStage
from engine.runtime.stages.decode import DecodeStage
from engine.runtime.stages.prepare import PrepareStage
from engine.runtime.stages.read import ReadStage
from engine.runtime.stages.row import Attempt, ShardTask
from engine.runtime.stages.write import WriteStage
from engine.runtime.threads import STOP, Call, KeptThread, own_threads

if TYPE_CHECKING:  # the quality gate's stage loads its verifiers' modules only where a job has one
    from engine.runtime.stages.verify import VerifyStage


@dataclass
class Stages:
    """The stages a worker's rows pass, in order (each in its own module of `runtime/stages/`).
    Read and prepare run on the caller's thread, the others on the pipeline's threads."""

    read: ReadStage
    prepare: PrepareStage
    decode: DecodeStage
    codec: CodecStage
    verify: VerifyStage | None  # the quality gate; None: off
    write: WriteStage

    @property
    def candidates(self) -> int:
        """Attempts a row starts with (the gate's best_of), else 1."""
        return self.verify.candidates if self.verify is not None else 1


@dataclass(eq=False)
class Again:
    """The next attempts of rows the quality gate failed, for the decode thread."""

    attempts: list[Attempt]


class ShardStream:
    """The decode loop, the verify thread (the quality gate on) and the IO thread of one worker,
    and the stages they run.

    Args:
        stages: the worker's stages.
        io_queue: settled shards that may wait for the IO thread (>= 1).
        torch_threads: CPU threads of the decode thread's torch ops (default: as many as the
            constructing thread has); the IO thread's run on one (`runtime/threads.py`).
        profiler: profiles some of the decode rounds (`runtime/profiling.py`); it finishes
            early when the batch runs empty, before the shard that emptied it is handed to the
            IO thread, so that shard's commit record names the profile.
        decode_thread: where the decode loop runs (a worker's models' `KeptThread`, left
            running by `close`); None: a `KeptThread` of the stream's own, ended by `close`.
    """

    def __init__(self, stages: Stages, io_queue: int = 1, profiler: RoundProfiler | None = None,
                 torch_threads: int | None = None, decode_thread: KeptThread | None = None) -> None:
        import torch

        self.stages = stages
        self.decode = stages.decode
        self.own_decode_thread = decode_thread is None
        self.decode_thread = decode_thread or KeptThread("decode")
        # the decode thread's torch threads (default: the constructing thread's); the IO thread's is 1
        self.torch_threads = torch_threads or torch.get_num_threads()
        self.profiler = profiler
        self.inbox: queue.Queue = queue.Queue()
        self.io: queue.Queue = queue.Queue(maxsize=max(1, io_queue))
        self.verify = stages.verify
        # decoded attempts waiting for the verify thread (codes only), checked a batch at a time
        self.check_batch = max(1, self.decode.session.batch)
        self.verifying: queue.Queue = queue.Queue(maxsize=VERIFY_QUEUE_BATCHES * self.check_batch)
        self.verify_thread: threading.Thread | None = None
        self.decoding: list[ShardTask] = []  # shards with attempts in the decoder (decode thread only)
        self.lock = threading.Lock()
        self.held = 0  # shards submitted and not yet resolved
        self.metrics = StreamMetrics()  # the counters and clocks the commit records report
        self.io_thread: threading.Thread | None = None
        self.decode_done: Future | None = None  # the decode loop's run on `decode_thread`

    # ---- callers ------------------------------------------------------------------------------

    def hold(self) -> None:
        """Count a shard as held from now on (before it is prepared)."""
        with self.lock:
            if self.held == 0:
                self.metrics.busy_began(time.perf_counter())
            self.held += 1

    def release(self) -> None:
        with self.lock:
            self.held -= 1
            if self.held == 0:
                self.metrics.busy_ended(time.perf_counter())

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
                if self.verify is not None:
                    verify_ready = threading.Event()
                    self.verify_thread = threading.Thread(target=self.verify_loop, args=(verify_ready,),
                                                          name="verify", daemon=True)
                    self.verify_thread.start()
                    verify_ready.wait()
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

    def on_verify_thread(self, fn: Callable) -> Future:
        """Run `fn()` on the verify thread (the quality gate on), between its checks."""
        self.start_threads()
        call = Call(fn)
        self.verifying.put(call)
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
            if self.verify_thread is not None:
                self.verify_thread.join()
            self.io_thread.join()
            self.io_thread = self.verify_thread = self.decode_done = None
        if self.own_decode_thread:
            self.decode_thread.close()

    # ---- figures ------------------------------------------------------------------------------

    def figures(self) -> PipelineFigures:
        """The pipeline's figures: its counters accrued since the previous call (one call per
        commit record), the shards held, decoders made, the IO backlog's peak and the `gamma:
        auto` choices so far."""
        now = time.perf_counter()
        with self.lock:
            busy, held = self.metrics.busy_clock(now), self.held
        sched = self.decode.scheduler
        counters = self.metrics.take(now, busy, sched)
        return PipelineFigures(counters, held=held, decoders=len(sched.used),
                               io_backlog_max=self.metrics.io_backlog_max,
                               gamma_choices=[c.to_dict() for c in self.decode.session.gamma_choices])

    # ---- decode thread ------------------------------------------------------------------------

    def decode_loop(self) -> None:
        own_threads(self.torch_threads)
        while True:
            try:
                item = self.inbox.get(block=self.decode.idle)
            except queue.Empty:
                item = None
            while item is not None:
                if item is STOP:
                    (self.verifying if self.verify is not None else self.io).put(STOP)
                    return
                if isinstance(item, Call):
                    item.run()
                elif isinstance(item, Again):
                    self.again(item.attempts)
                else:
                    self.start(item)
                try:
                    item = self.inbox.get_nowait()
                except queue.Empty:
                    item = None
            if not self.decode.idle:
                self.round()

    def round(self) -> None:
        """One decode round; its finished rows settled, or on to the verify thread."""
        start, clock = self.metrics.round_began()
        sched = self.decode.scheduler
        slots, filled = sched.slots, sched.slot_rounds
        try:
            with self.profiler.round() if self.profiler else contextlib.nullcontext():
                done = self.decode.step()
        except Exception as exc:  # the batch is in doubt: every shard in it is redone
            self.fail_all(exc)
            return
        finally:
            self.metrics.round_ended(start, clock)
        self.metrics.empty((sched.slots - slots) - (sched.slot_rounds - filled), queued=bool(sched.queued))
        finished = self.decoded(done)
        if self.profiler and (self.profiler.due or self.decode.idle):
            self.profiler.finish()  # its rounds recorded, or the batch ran empty: the profile ends here
        for task in finished:
            self.hand_off(task)

    def start(self, task: ShardTask) -> None:
        """A shard's rows (a split row's parts) into the decoder (those it refuses settle as
        error rows)."""
        attempts = [unit.attempt(n) for unit in task.units() for n in range(1, self.stages.candidates + 1)]
        try:
            refused = self.decode.submit(attempts)
        except Exception as exc:
            self.fail_all(exc, task)
            return
        for attempt in refused:
            attempt.row.keep(attempt)  # an error row from now on
        task.in_decoder = len(attempts) - len(refused)
        task.remaining = len({id(a.row) for a in attempts} - {id(a.row) for a in refused})
        if task.in_decoder:
            self.decoding.append(task)
            self.metrics.fed()
        else:
            self.hand_off(task)

    def ahead(self, attempts: list[Attempt]) -> list[Attempt] | None:
        """Queue `attempts` ahead of every row waiting for a slot (their shards wait for them);
        returns those the decoder refused, or None if it failed (their shards failed with it)."""
        try:
            refused = self.decode.submit(attempts, ahead=True)
        except Exception as exc:
            for task in {id(a.row.task): a.row.task for a in attempts}.values():
                self.fail_all(exc, task)
            return None
        for attempt in attempts:
            if attempt not in refused:
                task = attempt.row.task
                task.in_decoder += 1
                if task not in self.decoding:
                    self.decoding.append(task)
        return refused

    def again(self, attempts: list[Attempt]) -> None:
        """The quality gate's next attempts of failed rows, queued ahead of every row waiting
        for a slot (their shards are otherwise done); an attempt refused goes back to be checked
        as one without audio."""
        attempts = [a for a in attempts if not a.row.task.resolved]
        refused = self.ahead(attempts)
        if refused is None:
            return
        if len(refused) < len(attempts):
            self.metrics.fed()
        for attempt in refused:
            self.to_verify(attempt)

    def to_verify(self, attempt: Attempt) -> None:
        """A decoded attempt to the verify thread; blocks while a batch of them waits (backpressure)."""
        start = time.perf_counter()
        self.verifying.put(attempt)
        self.metrics.total.verify_wait_s += time.perf_counter() - start

    def decoded(self, done: list[Attempt]) -> list[ShardTask]:
        """Attempts the last round finished: decoded again where they ended without a speech
        code and may (`Row.retry`), else on to the verify thread or settled; returns the shards
        they completed."""
        finished, retries = [], []
        for attempt in done:
            task = attempt.row.task
            task.in_decoder -= 1
            if task.in_decoder == 0 and task in self.decoding:
                self.decoding.remove(task)
            if task.resolved:
                continue
            retry = attempt.row.retry(attempt)
            if retry is not None:
                retries.append(retry)
            elif self.settle(attempt):
                finished.append(task)
        if retries:
            finished.extend(self.retry(retries))
        return finished

    def settle(self, attempt: Attempt) -> bool:
        """A decoded attempt to the verify thread (the gate on), else kept; whether that
        settled its shard's last unit."""
        if self.verify is not None:
            self.to_verify(attempt)
            return False
        attempt.row.keep(attempt)
        attempt.row.task.remaining -= 1
        return attempt.row.task.remaining == 0

    def retry(self, attempts: list[Attempt]) -> list[ShardTask]:
        """Decode again attempts that ended without a speech code, ahead of every row waiting
        for a slot; returns the shards completed by any the decoder refuses (settled as they are)."""
        refused = self.ahead(attempts)
        return [attempt.row.task for attempt in refused or [] if self.settle(attempt)]

    def fail_all(self, exc: Exception, extra: ShardTask | None = None) -> None:
        """Fail every shard being decoded (and `extra`), and empty the batches."""
        self.decode.reset()
        failed = self.decoding + ([extra] if extra is not None and extra not in self.decoding else [])
        self.decoding = []
        for task in failed:
            if not task.future.done():
                task.future.set_exception(exc)

    def hand_off(self, task: ShardTask) -> None:
        """A settled shard to the IO queue; blocks while the queue is full (backpressure)."""
        task.decoded = time.perf_counter()
        with self.lock:
            self.metrics.backlog_in()
        start = time.perf_counter()
        self.io.put(task)
        self.metrics.total.io_wait_s += time.perf_counter() - start

    # ---- verify thread ------------------------------------------------------------------------

    def verify_loop(self, ready: threading.Event) -> None:
        own_threads(1)  # one OpenMP team per process: the decode thread's (runtime/threads.py)
        ready.set()
        while True:
            items = [self.verifying.get()]
            while len(items) < self.check_batch:  # what else waits: checked together
                try:
                    items.append(self.verifying.get_nowait())
                except queue.Empty:
                    break
            attempts = [item for item in items if isinstance(item, Attempt)]
            if attempts:
                self.check(attempts)
            for item in items:
                if isinstance(item, Call):
                    item.run()
            if any(item is STOP for item in items):
                self.io.put(STOP)
                return

    def check(self, attempts: list[Attempt]) -> None:
        """The codec and verify stages on decoded attempts: settled rows counted (a shard whose
        rows are all settled goes to the IO queue), next attempts to the decode thread."""
        try:
            self.stages.codec(attempts)
            settled, again = self.verify(attempts)
        except Exception as exc:  # a fault beyond any one row's checks: their shards are redone
            for task in {id(a.row.task): a.row.task for a in attempts}.values():
                if not task.resolved:
                    task.future.set_exception(exc)
            return
        if again:
            self.inbox.put(Again(again))
        for row in settled:
            row.task.remaining -= 1
            if row.task.remaining == 0:
                self.hand_off(row.task)

    # ---- IO thread ----------------------------------------------------------------------------

    def io_loop(self, ready: threading.Event) -> None:
        own_threads(1)  # one OpenMP team per process: the decode thread's (runtime/threads.py)
        ready.set()
        while True:
            task = self.io.get()
            if task is STOP:
                return
            if isinstance(task, Call):
                task.run()
                continue
            try:
                record = self.stages.write(task, self.measured(time.perf_counter()))
            except Exception as exc:
                task.future.set_exception(exc)
            else:
                task.future.set_result(record)
            finally:
                with self.lock:
                    self.metrics.backlog_out()

    def measured(self, start: float) -> Callable[[], Measured]:
        """What a shard's commit record reports of the pipeline, taken when the write stage asks
        (after its files are written): the figures since the last record (`figures`), and a
        finished profile."""
        metrics = self.metrics
        decoding_at_start = metrics.decode_clock(start)

        def measure() -> Measured:
            now = time.perf_counter()
            metrics.total.finalise_s += now - start
            metrics.total.overlap_s += metrics.decode_clock(now) - decoding_at_start
            figures = self.figures()
            return Measured(figures, self.profiler.take() if self.profiler else None)
        return measure
