"""Where a decode loop's time goes: torch.profiler over a bounded run of its rounds.

A round of a decode loop on a GPU is bound by the host: Python code between torch ops, the ops'
own CPU work (dispatch, kernel launches) and waits on the device (a row's tokens come back to
the host every round). `RoundProfiler` profiles rounds `skip .. skip + rounds` of one loop, on
the thread that runs them (torch.profiler records the ops of the thread that starts it, so a
worker's writer thread stays out of it), and reduces them to figures per round that compare
across runs: the round's wall time, the time inside torch ops and between them (Python, and
waits for the GIL), the CUDA runtime calls (launches, synchronisations, allocations) and the
device time, plus the ops that cost most. The profiler's own overhead lengthens every op a
little, the same way in every run, so compare profiled runs with profiled runs.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import statistics
import tempfile
import threading
from collections.abc import Iterator

import torch
from torch.autograd import DeviceType

ROUND = "pcg_synth.round"  # the record_function label around each profiled round
TOP_OPS = 25


class RoundProfiler:
    """Profiles rounds `skip .. skip + rounds - 1` of a loop that wraps each round in `round()`.

    Args:
        rounds: rounds to profile (0: never profiles).
        skip: rounds to let pass first.
        trace: also keep a Chrome trace (`report()["trace_gz"]`: gzipped bytes).
        device: the loop's device; on CUDA the device's kernels are recorded too.
    """

    def __init__(self, rounds: int, skip: int = 0, trace: bool = False, device: str = "cpu") -> None:
        self.rounds, self.skip, self.trace = rounds, skip, trace
        self.cuda = str(device).startswith("cuda") and torch.cuda.is_available()
        self.seen = 0  # rounds run so far, profiled or not
        self.profiled = 0
        self.prof = None
        self.done: dict | None = None
        self.lock = threading.Lock()
        self.taken = False

    @contextlib.contextmanager
    def round(self) -> Iterator[None]:
        """Wrap one round of the loop. Once the rounds asked for are recorded the profile is
        `due`: the loop calls `finish()` then, outside the time it measures its rounds by (on a
        GPU, reducing a profile's events took longer than the rounds themselves)."""
        if self.prof is None and self.done is None and self.rounds and self.seen >= self.skip:
            self.start()
        if self.prof is None or self.due:
            self.seen += 1
            yield
            return
        with torch.profiler.record_function(ROUND):
            yield
        self.seen += 1
        self.profiled += 1

    @property
    def due(self) -> bool:
        """The rounds asked for are recorded and the profile waits for `finish()`."""
        return self.prof is not None and self.profiled >= self.rounds

    def start(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(activities=activities)
        self.prof.start()

    def finish(self) -> None:
        """Stop profiling now (after fewer rounds than asked when the loop runs out of work)."""
        if self.prof is None:
            return
        if self.cuda:
            torch.cuda.synchronize()
        prof, self.prof = self.prof, None
        prof.stop()
        report = summarise(prof.events(), self.rounds, self.skip, self.cuda)
        if self.trace:
            report["trace_gz"] = chrome_trace(prof)
        with self.lock:
            self.done = report

    def take(self) -> dict | None:
        """The finished profile, once (None before it finished, and after it was taken)."""
        with self.lock:
            if self.done is None or self.taken:
                return None
            self.taken = True
            return self.done


def chrome_trace(prof) -> bytes:
    """The profile as a gzipped Chrome trace (chrome://tracing, ui.perfetto.dev)."""
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, "rb") as f:
            return gzip.compress(f.read())
    finally:
        os.unlink(path)


def device_us(event) -> float:
    """Device (kernel) time an op launched, in microseconds; 0 without CUDA."""
    return float(getattr(event, "device_time_total", 0.0) or 0.0)


def summarise(events, asked: int, skip: int, cuda: bool) -> dict:
    """Figures per round from the profiled rounds' events (times in milliseconds)."""
    # the rounds' CPU-side marks (on CUDA each mark is also recorded on the device's timeline)
    marks = [e for e in events if e.name == ROUND and e.device_type == DeviceType.CPU]
    walls, in_ops, op_counts, device = [], [], [], 0.0
    by_name: dict[str, list[float]] = {}  # name -> [calls, self us, total us]
    runtime: dict[str, list[float]] = {}  # CUDA runtime/driver calls: [calls, us]
    for mark in marks:
        walls.append(mark.cpu_time_total / 1e3)
        tops = mark.cpu_children
        in_ops.append(sum(e.cpu_time_total for e in tops) / 1e3)
        op_counts.append(len(tops))
        device += sum(device_us(e) for e in tops)
        stack = list(tops)
        while stack:
            e = stack.pop()
            stack.extend(e.cpu_children)
            entry = by_name.setdefault(e.name, [0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += e.self_cpu_time_total
            entry[2] += e.cpu_time_total
            if e.name.startswith("cu"):  # CUDA runtime and driver calls (kernels are device events)
                call = runtime.setdefault(e.name, [0, 0.0])
                call[0] += 1
                call[1] += e.cpu_time_total
    n = max(len(marks), 1)
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:TOP_OPS]
    out = {
        "rounds": len(marks), "asked_rounds": asked, "skipped_rounds": skip,
        "round_ms": spread(walls),
        "in_torch_ops_ms_per_round": round(sum(in_ops) / n, 4),
        # the round's wall time outside torch ops: Python between them, and any wait for the GIL
        "between_ops_ms_per_round": round((sum(walls) - sum(in_ops)) / n, 4),
        "torch_ops_per_round": round(sum(op_counts) / n, 1),
        "top_ops": [{"name": name, "calls_per_round": round(c / n, 2), "self_ms_per_round": round(s / n / 1e3, 4),
                     "total_ms_per_round": round(t / n / 1e3, 4)} for name, (c, s, t) in top],
    }
    if cuda:
        out["device_ms_per_round"] = round(device / n / 1e3, 4)
        out["cuda_runtime_per_round"] = {name: {"calls": round(c / n, 2), "ms": round(us / n / 1e3, 4)}
                                         for name, (c, us) in sorted(runtime.items(), key=lambda kv: -kv[1][1])}
    return out


def spread(values: list[float]) -> dict:
    """Mean, median, 90th percentile and maximum of `values` (ms), rounded."""
    if not values:
        return {"mean": None, "median": None, "p90": None, "max": None}
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return {k: round(v, 4) for k, v in (("mean", statistics.fmean(values)), ("median", statistics.median(values)),
                                        ("p90", p90), ("max", ordered[-1]))}
