"""The threads a worker runs besides Ray's, and how they use the CPU.

A worker's pipeline (`runtime/stream.py`) runs its stages on threads of its own: the decode
loop on a `KeptThread` its models keep (so every job they serve decodes on one thread), the
verify and IO threads beside it, model loading on a short-lived thread (`on_short_thread`).

CPU threads: the decode thread is the only one that runs torch ops on several threads (the
worker's `torch_threads`); the verify and IO threads run theirs on one (`own_threads(1)`), and
the models are loaded on a short-lived thread. OpenMP gives every thread that runs a parallel op
a team of helper threads that lives as long as that thread; once a process holds more such
threads than it has cores, every team's threads stop spinning between ops and sleep almost at
once (GNU OpenMP's throttled spinning), and each op then pays to wake them: decoding on a
thread beside another thread's team runs markedly slower than alone.
"""

from __future__ import annotations

import queue
import resource
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

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
