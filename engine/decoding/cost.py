"""The cost model of speculative decoding: measured step times and the memory-bandwidth bound.

One round costs a draft phase (one 2-token forward, then gamma - 1 one-token forwards, as
`SpeculativeDecoder.propose` does; with stream heads, one pass of the heads and of the target's
head over their gamma states, as `round.propose_streams` and `round.follow_streams` do) plus one
target forward over gamma + 1 tokens; an `ar` step is one target forward over one token. With L
tokens per round (mean accepted length, the bonus/recovered token included) the model predicts

    speedup = L * t_ar / (t_draft_phase + t_verify),

so speculation pays only when L exceeds the break-even length (t_draft_phase + t_verify) / t_ar.
A batch that drains (no rows left to refill its slots) ends with its slowest row: every row
needs a random number of rounds, so its last rounds run with empty slots, while `ar` rows of the
same length end together. `drain_factor` predicts that loss from the acceptance alone.
The host's work per round (sampling, the acceptance rule, bookkeeping, the round's sync) is not
a forward: `ForwardClock` measures it in real decodes as wall time minus forward time, and with
it the prediction becomes `L * (t_ar + h_ar) / (t_draft_phase + t_verify + h)`.
On a GPU one decode step must at least stream the weights once: weight bytes / bandwidth.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch

from engine.decoding.sizing import gpu_of_device
from engine.models.llama import LlamaLM
from engine.models.streams import Heads


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_time(fn: Callable[[], object], device: torch.device, reps: int, warmup: int = 3) -> float:
    """Median wall seconds of `fn()` over `reps` calls after `warmup` untimed ones."""
    return interleaved_medians({"fn": fn}, device, reps, warmup)["fn"]


def forward_timer(model: LlamaLM, batch: int, width: int, context: int, logits_at: str):
    """A closure running one forward of `width` tokens per row at positions `context..`."""
    cache = model.new_cache(batch, context + width + 1)
    ids = model.output_token_ids[torch.randint(0, model.vocab_out, (batch, width), device=model.device)]
    pos = (context + torch.arange(width, device=model.device)).expand(batch, -1)
    kv_len = context + width + 1

    def run():
        return model(ids, pos, cache, kv_len, logits_at=logits_at)
    return run


def interleaved_medians(fns: dict[str, Callable[[], object]], device: torch.device, reps: int,
                        warmup: int = 3) -> dict[str, float]:
    """Median wall seconds of each closure, timed in turns (one call of each per round) after
    `warmup` untimed rounds: a transient slowdown (page faults at a new shape, another process)
    then lands on every measurement of that round instead of skewing one of them, so ratios of
    the medians stay honest."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def streams_timer(target: LlamaLM, heads: Heads, batch: int, gamma: int):
    """A closure running one round's work of stream heads: their pass over a `[batch, H]` hidden
    state and the token after it (the states of the next round), then the target's head over
    `[batch, gamma, H]` of those states (its proposals' logits)."""
    if gamma > heads.heads:
        raise ValueError(f"gamma {gamma} needs {gamma} stream heads; these have {heads.heads}")
    hidden = torch.randn(batch, target.shape.hidden_size, dtype=target.dtype, device=target.device)
    tokens = target.output_token_ids[torch.randint(0, target.vocab_out, (batch,), device=target.device)]

    def run():
        with torch.inference_mode():
            states = heads.follow(target, hidden, tokens)  # [B, heads, H]
            return heads.logits(target, states[:, :gamma], widen=False)  # [B, gamma, V]
    return run


def step_times(target: LlamaLM, draft: LlamaLM | Heads | None, batch: int, gamma: int, context: int,
               reps: int = 10) -> dict[str, float]:
    """Median seconds of an `ar` step, a verify forward and a draft phase at this batch size,
    measured in turns (`interleaved_medians`). `draft_step_s` is a draft model's one-token step;
    stream heads have no step of their own, so theirs is the phase over gamma."""
    fns = {"ar_s": forward_timer(target, batch, 1, context, "all"),
           "verify_s": forward_timer(target, batch, gamma + 1, context, "all")}
    if isinstance(draft, Heads):
        fns["draft_phase_s"] = streams_timer(target, draft, batch, gamma)
        times = interleaved_medians(fns, target.device, reps)
        return {**times, "draft_step_s": times["draft_phase_s"] / gamma}
    if draft is not None:
        first = forward_timer(draft, batch, 2, context, "last")
        rest = forward_timer(draft, batch, 1, context + 2, "last")

        def phase():
            first()
            for _ in range(gamma - 1):
                rest()
        fns["draft_phase_s"] = phase
        fns["draft_step_s"] = rest
    return interleaved_medians(fns, target.device, reps)


def predicted_speedup(accepted_length: float, gamma: int, times: dict[str, float],
                      host_ar_s: float = 0.0, host_s: float = 0.0) -> float | None:
    """`L * (t_ar + h_ar) / (t_draft_phase + t_verify + h)`: forwards only when the host times
    per round (`h_ar` of an `ar` round, `h` of a speculative one) are left at 0."""
    if "draft_phase_s" not in times:
        return None
    return (accepted_length * (times["ar_s"] + host_ar_s)
            / (times["draft_phase_s"] + times["verify_s"] + host_s))


def round_tokens(acceptance: float, gamma: int) -> tuple[float, float]:
    """Mean and variance of the tokens one round emits when each of `gamma` drafts is accepted
    with probability `acceptance` until the first rejection (the bonus/recovered token counted):
    k tokens with probability a^(k-1) (1 - a) for k <= gamma, gamma + 1 with a^gamma."""
    a = min(max(acceptance, 0.0), 1.0)
    probs = [a ** (k - 1) * (1 - a) for k in range(1, gamma + 1)] + [a ** gamma]
    mean = sum(k * p for k, p in enumerate(probs, 1))
    return mean, max(sum(k * k * p for k, p in enumerate(probs, 1)) - mean * mean, 0.0)


def expected_max_normal(n: int) -> float:
    """E[max of n standard normals] (Blom's approximation; 0 for n = 1)."""
    return 0.0 if n < 2 else statistics.NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def drain_factor(acceptance: float, gamma: int, tokens: float, batch: int, rows: int | None) -> float:
    """The share of a speculative decode's throughput left after its batch drains, against `ar`.

    `rows` rows of `tokens` tokens share `batch` slots, one after another per slot (continuous
    batching), so a slot decodes rows / slots rows. Its rounds are a sum of independent rounds
    of `round_tokens`: about normal with mean m = tokens x waves / L and variance
    tokens x waves x var / L^3; the decode ends with the slowest slot, E[max] ~ m + e_slots sd,
    where `ar` rows of the same length end together. Returns m / (m + e_slots sd) (1: no drain
    to model, e.g. a stream of rows with no known end: `rows=None`)."""
    if rows is None or rows < 2 or batch < 2 or gamma < 1 or tokens <= 0:
        return 1.0
    slots = min(rows, batch)
    length, var = round_tokens(acceptance, gamma)
    work = tokens * rows / slots  # tokens per slot
    mean = work / length
    sd = math.sqrt(work * var / length ** 3)
    return mean / (mean + expected_max_normal(slots) * sd)


HEADS_PASSES = ("follow", "states", "logits")  # what a round calls of stream heads (`engine.models.streams`)


class ForwardClock:
    """Seconds spent inside the forwards of some models while active, split into prefill
    (forwards that fill chosen slots' caches: an admission) and decode forwards (a round's); the rest of a
    decode's wall time is host work. It times the models' `step`, which eager rounds and
    prefills call; a compiled round's forwards are inside its graph, out of its sight (use the
    round runner's figures there). Stream heads given beside the target are timed too, their
    passes (`follow`) and their proposals' logits (`logits`) counted as decode forwards (an
    admission's one pass of them as well), so that a pilot's host time does not hold them twice.
    On CUDA each forward is synchronised to be timed, which removes the overlap of host and
    device work: use it to profile, not for headline figures.

        with ForwardClock(target, synth.drafter) as clock:
            synth.synthesize(items, settings)
        clock.decode_s, clock.prefill_s
    """

    def __init__(self, *models: LlamaLM | Heads | None) -> None:
        lms = [m for m in models if isinstance(m, LlamaLM)]
        # a model whose rounds run compiled is left alone: its forwards are inside the graph
        self.models = [m for m in lms if m.compile_mode == "none"]
        # stream heads run inside the target's rounds: out of sight too where those are compiled
        eager = bool(lms) and len(self.models) == len(lms)
        self.heads = [m for m in models if isinstance(m, Heads)] if eager else []
        self.decode_s = self.prefill_s = 0.0

    def _timed(self, fn: Callable, device: torch.device, admission: Callable[[dict], bool]):
        """`fn` timed into `prefill_s` where `admission(its keyword arguments)`, else `decode_s`."""
        def timed(*args, **options):
            sync(device)
            start = time.perf_counter()
            out = fn(*args, **options)
            sync(device)
            elapsed = time.perf_counter() - start
            if admission(options):
                self.prefill_s += elapsed
            else:
                self.decode_s += elapsed
            return out
        return timed

    def __enter__(self) -> ForwardClock:
        def prefill(options: dict) -> bool:  # an admission's prefill writes chosen rows; a round all
            return options.get("slots") is not None

        # instance attributes shadow the classes' methods until `__exit__` deletes them
        for m in self.models:
            m.step = self._timed(m.step, m.device, prefill)
        for h in self.heads:  # every pass a round makes of them (`states`: heads that attend)
            for name in HEADS_PASSES:
                if hasattr(h, name):
                    setattr(h, name, self._timed(getattr(h, name), h.device, lambda options: False))
        return self

    def __exit__(self, *exc) -> None:
        for m in self.models:
            del m.step
        for h in self.heads:
            for name in HEADS_PASSES:
                if name in vars(h):
                    delattr(h, name)


def break_even_length(times: dict[str, float]) -> float | None:
    """Tokens per round a speculative method needs to match `ar`."""
    if "draft_phase_s" not in times:
        return None
    return (times["draft_phase_s"] + times["verify_s"]) / times["ar_s"]


def weight_bytes(model: LlamaLM) -> int:
    """Bytes one decode step must read: every weight except the embedding table (only the
    fed tokens' rows are gathered); the sliced head counts."""
    return model.step_weight_bytes()


def kv_bytes(model: LlamaLM, batch: int, context: int) -> int:
    """Bytes of keys and values one step reads at `context` positions per row."""
    s = model.shape
    return 2 * s.num_layers * batch * context * s.num_kv_heads * s.head_dim * model.head.element_size()


def measured_bandwidth(device: torch.device, mib: int = 512, reps: int = 10) -> float:
    """Copy bandwidth in bytes/s (read + write) of a `mib`-MiB device-to-device copy."""
    n = mib * 2 ** 20 // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    seconds = median_time(lambda: dst.copy_(src), device, reps)
    return 2 * n * 4 / seconds


def spec_bandwidth(device: torch.device) -> float | None:
    """Data-sheet bandwidth of a known GPU, else None."""
    if device.type != "cuda":
        return None
    gpu = gpu_of_device(torch.cuda.get_device_name(device))
    return gpu.bandwidth if gpu is not None else None


def bandwidth_bound(target: LlamaLM, batch: int, context: int, bandwidth: float) -> dict[str, float]:
    """Lower bounds on one target step: weights alone, and weights plus the KV cache."""
    w = weight_bytes(target)
    kv = kv_bytes(target, batch, context)
    return {"weight_bytes": w, "kv_bytes": kv, "weights_bound_s": w / bandwidth,
            "weights_kv_bound_s": (w + kv) / bandwidth}


def speculation_outlook(target: LlamaLM, draft: LlamaLM | Heads, gamma: int, context: int,
                        accepted: dict[str, float], reps: int = 10) -> str:
    """Why speculation does or does not pay for this target and drafter (a draft model or stream
    heads) at batch 1, in words: the step times measured now, the break-even accepted length,
    and the cost model's speedup for each method's measured mean accepted length (`accepted`:
    method -> tokens per round)."""
    heads = isinstance(draft, Heads)
    times = step_times(target, draft, 1, gamma, context, reps)
    even = break_even_length(times)
    ms = {k: v * 1e3 for k, v in times.items()}
    drafter = (f"the stream heads {ms['draft_phase_s']:.1f} ms (one pass for {gamma} proposals)" if heads
               else f"the draft {ms['draft_phase_s']:.1f} ms")
    step = ("" if heads else
            f" (the draft step is {times['draft_step_s'] / times['ar_s']:.2f}x the target's)")
    lines = [f"Speculation at batch 1, gamma {gamma} (step times measured now): a round costs {drafter} "
             f"+ verify {ms['verify_s']:.1f} ms against an `ar` step of "
             f"{ms['ar_s']:.1f} ms, so it pays only above {even:.2f} accepted tokens per round{step}."]
    for method, length in accepted.items():
        lines.append(f"  {method}: {length:.2f} tokens per round -> predicted "
                     f"{predicted_speedup(length, gamma, times):.2f}x `ar`")
    if even >= gamma + 1:
        lines.append(f"No draft can pay here: even accepting every token ({gamma + 1} per round) is below the "
                     "break-even.")
    if heads:  # one pass a round, whatever gamma: no per-step share to weigh
        return "\n".join(lines)
    share = weight_bytes(draft) / weight_bytes(target)  # what a decode step reads: the step's cost
    if share > 0.5:
        lines.append(f"The draft reads {share:.0%} of the target's weights per step. Speculation pays when it "
                     "costs a small fraction of the target (the paper's: 3 of 16 layers), as on the "
                     "llasa-1b-shape target on CPUs with native bf16, where pcg beats `ar` at batch 1 "
                     "(docs/performance.md).")
    return "\n".join(lines)
