"""Running decode rounds: eagerly, or each round as one compiled graph.

`RoundRunner.run` runs `decode_round` for a decoder and returns its `[B, 3]` result on the host
(the round's only read-back). Modes:
    none        eager: the round's torch ops one by one (`inference_mode`).
    inductor    `torch.compile(fullgraph=True)` of the whole round, one graph per `RoundPlan`
                (draft steps, target verify, warp, judge, commit): on CPU inductor's C++ code,
                on CUDA its Triton kernels.
    cudagraphs  inductor plus CUDA graph replay (torch's "reduce-overhead"): a round is one
                graph launch; the state a round mutates is marked static, so replays write the
                decoder's own tensors.
`fullgraph=True` makes a graph break an error, so a round that would fall back to Python between
graphs fails loudly instead of running slowly.

Compiled code is cached on disk by inductor (its FX graph cache, and the AOT autograd cache) under
`<pcg-synth cache>/inductor` unless `TORCHINDUCTOR_CACHE_DIR` says otherwise: a second process
(a job's next worker, a rerun) traces the round again but does not compile it. `RoundStats`
counts compiles, cache hits and their seconds, and times rounds (host time; device time from
CUDA events on a GPU).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch

from engine.config import COMPILE_MODES
from engine.decoding.round import RoundPlan, decode_round
from engine.models.llama import LlamaLM

log = logging.getLogger(__name__)


def use_compile_cache() -> str:
    """Point inductor's on-disk caches at the pcg-synth cache (unless the user chose a place)
    and make sure they are on. Returns the directory."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        from engine.io.storage import cache_dir

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir() / "inductor")
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True
    if hasattr(functorch_config, "enable_autograd_cache"):
        functorch_config.enable_autograd_cache = True
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


@dataclass
class RoundStats:
    """What running rounds cost: counts and seconds since the runner was made (or `reset`)."""

    mode: str = "none"
    rounds: int = 0
    graph_launches: int = 0
    host_s: float = 0.0  # wall time of the round calls, read-back included
    device_s: float = 0.0  # CUDA event time of the rounds (0 on a CPU)
    compiles: int = 0  # graphs compiled (or loaded from the on-disk cache) by this runner
    compile_s: float = 0.0
    cache_hits: int = 0  # of those, inductor's on-disk cache served the compiled code
    ops_per_round: int | None = None  # ops dispatched by a round (`count_ops`), the last counted
    plans: list[str] = field(default_factory=list)
    compile_failed: str | None = None  # why rounds fell back to eager (`RoundRunner.fallback`)

    def to_dict(self) -> dict:
        out = asdict(self)
        if self.rounds:
            out["host_ms_per_round"] = round(1e3 * self.host_s / self.rounds, 4)
            out["device_ms_per_round"] = round(1e3 * self.device_s / self.rounds, 4) if self.device_s else None
        return out


class RoundRunner:
    """Runs a decoder's rounds in one of `COMPILE_MODES` (see the module docstring).

    Args:
        mode: `none`, `inductor` or `cudagraphs`.
    """

    def __init__(self, mode: str = "none") -> None:
        if mode not in ("none", "inductor", "cudagraphs"):
            raise ValueError(f"compile must be one of {', '.join(COMPILE_MODES)}, not {mode!r}")
        self.mode = mode
        self.graphs: dict[tuple, object] = {}
        self.seen: dict[tuple[int, RoundPlan], int] = {}  # rounds run per decoder and plan
        self.stats = RoundStats(mode=mode)
        self.time_device = False  # CUDA events around each round (set by the caller that reports them)
        self.sync_check = False  # CUDA: a host sync inside a compiled round raises (a test's check)
        # a round's graph that fails to compile: run eagerly, warned (`compile: auto`), or raise
        self.fallback = False

    @classmethod
    def for_model(cls, model: LlamaLM) -> RoundRunner:
        """A runner in the mode the model was loaded for (`LlamaLM.set_compile_mode`): the runner
        holds it from then on."""
        return cls(model.compile_mode)

    def run(self, decoder, plan: RoundPlan) -> np.ndarray:
        """One round of `decoder` under `plan`; its `[B, 3]` result as a host array. The second
        round of each plan (the first after a compile) also counts its dispatched ops."""
        key = (id(decoder), plan)
        self.seen[key] = self.seen.get(key, 0) + 1
        if self.seen[key] == 2 and not profiling():
            ops, host = count_ops(lambda: self.round(decoder, plan), compiled=self.mode != "none")
            self.stats.ops_per_round = ops
            return host
        return self.round(decoder, plan)

    def round(self, decoder, plan: RoundPlan) -> np.ndarray:
        state = decoder.state
        cuda = decoder.device.type == "cuda"
        events = None
        if cuda and self.time_device:
            events = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            events[0].record()
        start = time.perf_counter()
        out = self.graph_round(decoder, plan, cuda) if self.mode != "none" else None
        if out is None:
            with torch.inference_mode():
                out = decode_round(state, plan)
        if events is not None:
            events[1].record()
        host = out.cpu().numpy()  # the round's one read-back (copies out of a replayed graph)
        self.stats.rounds += 1
        self.stats.host_s += time.perf_counter() - start
        if events is not None:
            self.stats.device_s += events[0].elapsed_time(events[1]) / 1e3
        return host

    def graph_round(self, decoder, plan: RoundPlan, cuda: bool) -> torch.Tensor | None:
        """The round through its graph; None where the graph failed to compile and the runner
        falls back (`fallback`): this round and every later one then run eagerly. A failed
        compile has run nothing of the round, so the eager round starts from the same state."""
        try:
            graph = self.graph(decoder, plan)
            keys_read = decoder.keys_read[: plan.kv_len]  # the bucket, as a dynamic size
            torch._dynamo.mark_dynamic(keys_read, 0)
            if self.mode == "cudagraphs":
                torch.compiler.cudagraph_mark_step_begin()  # the last round's outputs are read already
            with torch.no_grad(), sync_checked(cuda and self.sync_check):  # a graph writing the
                out = graph(decoder.state, keys_read)  # caches cannot run in inference mode
        except torch._dynamo.exc.TorchDynamoException as exc:  # tracing or compiling, not running
            if not self.fallback:
                raise
            self.give_up(exc)
            return None
        self.stats.graph_launches += 1
        return out

    def give_up(self, exc: Exception) -> None:
        """Run eagerly from now on, after a graph that did not compile (warned once, recorded in
        `stats.compile_failed`)."""
        reason = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
        log.warning("decode rounds run eagerly: a round's graph did not compile (%s). models.compile auto "
                    "falls back so; set models.compile none to skip the attempt, or inductor/cudagraphs "
                    "to make it an error", reason)
        self.mode = self.stats.mode = "none"
        self.stats.compile_failed = reason
        self.graphs.clear()

    def graph(self, decoder, plan: RoundPlan):
        """The compiled round for `plan` at `decoder`'s shapes (compiled on first use). Decoders
        of the same shapes share it, except under CUDA graphs, which replay into one decoder's
        own tensors."""
        st = decoder.state
        shapes = (tuple(st.tokens.shape), st.tcache.shape, None if st.dcache is None else st.dcache.shape,
                  None if st.stream_state is None else tuple(st.stream_state.shape),
                  None if st.stream_cache is None else st.stream_cache.shape, st.seen is not None)
        key = (id(decoder) if self.mode == "cudagraphs" else shapes, replace(plan, kv_len=0))
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.compile(decoder, plan)
            self.graphs[key] = graph
        return graph

    def compile(self, decoder, plan: RoundPlan):
        """The round for `plan` through `torch.compile` (traced and compiled at its first call)."""
        use_compile_cache()
        if decoder.device.type == "cpu":
            warn_passive_openmp()
        if self.mode == "cudagraphs":
            for t in decoder.state.tensors():
                torch._dynamo.mark_static_address(t)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        plan = replace(plan, kv_len=0)  # read from `keys_read`'s length instead: one graph for every bucket
        compiled = torch.compile(lambda state, keys_read: decode_round(state, plan, keys_read), fullgraph=True,
                                 dynamic=False,  # static but for the key count (`run` marks it dynamic)
                                 mode="reduce-overhead" if self.mode == "cudagraphs" else None)
        self.stats.compiles += 1
        self.stats.plans.append(describe(plan))
        return Compiled(compiled, self, self.stats.plans[-1])


_warned_passive = False


def warn_passive_openmp() -> bool:
    """Warn once per process where a round compiles for a CPU under `OMP_WAIT_POLICY=PASSIVE`: its
    idle OpenMP threads sleep at once, so each of a compiled round's kernels wakes them again, and
    the compiled round loses most of its lead over the eager one (docs/performance.md). Returns
    whether it warned."""
    global _warned_passive
    if _warned_passive or os.environ.get("OMP_WAIT_POLICY", "").strip().upper() != "PASSIVE":
        return False
    _warned_passive = True
    log.warning("compiled decode rounds on a CPU under OMP_WAIT_POLICY=PASSIVE: each of a round's kernels "
                "wakes OpenMP's threads again and the compiled round loses most of its lead over the eager "
                "one; leave OMP_WAIT_POLICY unset where nothing else uses these cores (docs/performance.md)")
    return True


def profiling() -> bool:
    """Whether torch's profiler is recording on this thread (its counting would nest in it)."""
    return torch._C._autograd._profiler_enabled()


def count_ops(fn, compiled: bool) -> tuple[int, object]:
    """(ops dispatched by `fn()`, its result). Eager code: every op through torch's dispatcher (a
    dispatch mode, below composite ops). A compiled graph's own kernels are no dispatched ops and a
    dispatch mode would turn the graph off, so there the profiler counts the ops it calls (extern
    kernels such as matrix products and attention), each once with what runs inside it."""
    if not compiled:
        from torch.utils._python_dispatch import TorchDispatchMode

        class Count(TorchDispatchMode):
            n = 0

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                Count.n += 1
                return func(*args, **(kwargs or {}))
        with Count():
            out = fn()
        return Count.n, out
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fn()

    def is_op(e) -> bool:
        return "::" in e.name and not e.name.startswith("#")

    def outermost(e) -> bool:
        parent = e.cpu_parent
        while parent is not None:
            if is_op(parent):
                return False
            parent = parent.cpu_parent
        return True
    return sum(1 for e in prof.events() if is_op(e) and outermost(e)), out


@contextlib.contextmanager
def sync_checked(on: bool):
    """While active (and `on`), a CUDA host sync raises instead of waiting."""
    if not on:
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


class Compiled:
    """A compiled round; its first call (tracing and compiling, or loading from the cache) is
    timed into the runner's stats and logged once."""

    def __init__(self, fn, runner: RoundRunner, name: str) -> None:
        self.fn, self.runner, self.name, self.first = fn, runner, name, True

    def __call__(self, state, keys_read):
        if not self.first:
            return self.fn(state, keys_read)
        from torch._dynamo.utils import counters

        hits = counters["inductor"]["fxgraph_cache_hit"]
        start = time.perf_counter()
        out = self.fn(state, keys_read)
        seconds = time.perf_counter() - start
        stats = self.runner.stats
        stats.compile_s += seconds
        hit = counters["inductor"]["fxgraph_cache_hit"] > hits
        stats.cache_hits += int(hit)
        self.first = False
        log.info("round graph (%s): %s in %.1f s", self.name,
                 "loaded from the compile cache" if hit else "compiled", seconds)
        return out


def describe(plan: RoundPlan) -> str:
    """A short name for a plan (logs and summaries)."""
    rules = "+".join(type(r).__name__.replace("Rule", "").lower() for r in plan.rules) or "ar"
    return f"{rules} gamma {plan.gamma}, {'/'.join(plan.steps.labels())}, keys {plan.kv_len}"
