"""`gamma: auto`: choose the draft length per batch size from measured costs, or switch
speculation off where it no longer pays.

With per-position acceptance `a` (measured by a short pilot) a round of `g` drafts yields on
average `L(g) = (1 - a**(g+1)) / (1 - a)` tokens, and costs one draft phase plus one verify
forward; an `ar` step costs one target forward. Both are timed at the batch size that will run
(`engine.decoding.cost.step_times`), because that is what decides: at batch 1 a GPU verifies
g+1 tokens for about the price of one, at a large batch the verify step costs g+1 steps.
Two costs beyond the forwards count too: the host's work per round (sampling, the rule,
bookkeeping), measured in the pilot, and, for a call whose rows are all known, the drain at its
end (`engine.decoding.cost.drain_factor`): a speculative batch waits for its slowest row.
`GammaPilot` runs the pilots and keeps what they measured; `decide` weighs it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from engine.config import DecodingSettings
from engine.decoding.cost import ForwardClock, drain_factor, predicted_speedup, round_tokens, step_times
from engine.decoding.graphs import RoundRunner
from engine.decoding.speculative import Request, SpeculativeDecoder
from engine.decoding.verify import Rule, structure_key
from engine.families.base import OutputSpace
from engine.models.llama import LlamaLM
from engine.models.streams import Heads
from engine.records import aggregate

CANDIDATES = (1, 2, 3, 4, 6, 8)
MARGIN = 1.05  # speculation must beat `ar` by 5% to be worth its variance
HOST_OFFSET = 2  # an eager round's host time grows like (gamma + 2) (see `host_per_round`)
PILOT_GAMMA, PILOT_TOKENS = 4, 48  # the pilot decode: draft length, tokens per row
PILOT_ROWS = 8  # rows a pilot decodes at most (fewer where the batch is smaller)


def host_per_round(host_s: float, pilot_gamma: int, gamma: int) -> float:
    """Host seconds per round at `gamma`, from `host_s` measured at `pilot_gamma`: it grows
    about linearly in the draft length with an offset of about two drafts' work (sampling of
    the bonus token, the sync, bookkeeping), as eager rounds of the llasa-1b-shape preset
    measure. A compiled round
    fuses that work with its forwards: there the pilot reports none."""
    return host_s * (gamma + HOST_OFFSET) / (pilot_gamma + HOST_OFFSET)


def expected_length(acceptance: float, gamma: int) -> float:
    """Tokens per round with `gamma` drafts and per-position acceptance `acceptance`:
    (1 - a^(g+1)) / (1 - a), the mean of `round_tokens`."""
    return round_tokens(acceptance, gamma)[0]


@dataclass
class GammaChoice:
    """What `gamma: auto` decided, and the figures it decided on."""

    gamma: int  # 0: speculation off (the job runs `ar`)
    batch_size: int
    acceptance: float
    predicted_speedup: dict[int, float] = field(default_factory=dict)
    step_times: dict[int, dict] = field(default_factory=dict)
    host_s_per_round: float = 0.0  # measured in the pilot (at its gamma)
    drain: dict[int, float] = field(default_factory=dict)  # drain_factor per gamma (1: none)
    reason: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def gamma_candidates(limit: int | None = None) -> tuple[int, ...]:
    """The draft lengths `gamma: auto` weighs: `CANDIDATES` up to `limit` (stream heads propose
    at most one token a head), and `limit` itself where it falls between two of them."""
    if limit is None:
        return CANDIDATES
    if limit < 1:
        raise ValueError(f"a drafter proposes at least one token a round; got a limit of {limit}")
    return tuple(sorted({g for g in CANDIDATES if g <= limit} | {min(limit, CANDIDATES[-1])}))


def measure_steps(target: LlamaLM, draft: LlamaLM | Heads, batch: int, context: int,
                  candidates: tuple[int, ...] = CANDIDATES, reps: int = 5) -> dict[int, dict[str, float]]:
    """Step times (`step_times`) per candidate draft length at `batch`: the costly part of a
    choice, measured once per (settings, batch size) and reused by `decide`."""
    return {g: step_times(target, draft, batch, g, context, reps) for g in candidates}


def decide(batch: int, acceptance: float, steps: dict[int, dict[str, float]], host_s: float = 0.0,
           pilot_gamma: int = 4, tokens: float = 0.0, rows: int | None = None) -> GammaChoice:
    """The draft length with the best predicted speedup, or 0 if none beats `ar` by `MARGIN`.

    Args:
        batch: rows decoded together.
        acceptance: mean per-position acceptance from a pilot run.
        steps: `measure_steps` at this batch size.
        host_s: host seconds per speculative round measured at `pilot_gamma` (0: forwards only).
        tokens, rows: tokens per row and the rows to decode, for the drain at the end
            (`rows=None`: a stream with no known end, no drain).
    """
    choice = GammaChoice(gamma=0, batch_size=batch, acceptance=round(acceptance, 4),
                         host_s_per_round=round(host_s, 6))
    best, best_gamma = MARGIN, 0
    for g, times in steps.items():
        drain = drain_factor(acceptance, g, tokens, batch, rows)
        speedup = drain * predicted_speedup(expected_length(acceptance, g), g, times,
                                            host_s=host_per_round(host_s, pilot_gamma, g))
        choice.step_times[g] = {k: round(v, 6) for k, v in times.items()}
        choice.drain[g] = round(drain, 4)
        choice.predicted_speedup[g] = round(speedup, 4)
        if speedup > best:
            best, best_gamma = speedup, g
    choice.gamma = best_gamma
    top = max(choice.predicted_speedup.items(), key=lambda kv: kv[1])
    if best_gamma:
        choice.reason = (f"gamma {best_gamma} predicts {best:.2f}x ar at batch {batch} "
                         f"(acceptance {acceptance:.2f})")
    else:
        choice.reason = (f"speculation off: the best draft length (gamma {top[0]}) predicts only "
                         f"{top[1]:.2f}x ar at batch {batch} (acceptance {acceptance:.2f}; needs "
                         f"> {MARGIN:.2f}x)")
    return choice


@dataclass(frozen=True)
class PilotMeasures:
    """What one pilot measured, for one structure and batch size: what `decide` weighs.

    Attributes:
        acceptance: mean acceptance per draft position.
        host_s: host seconds per round at the pilot's gamma (0: rounds run as compiled graphs).
        steps: `measure_steps` at the batch size.
    """

    acceptance: float
    host_s: float
    steps: dict[int, dict[str, float]]


class GammaPilot:
    """`gamma: auto` for one target and drafter: a short pilot decode per structure (the rule and
    gamma, `structure_key`) and batch size measures acceptance, host time and step times, kept
    for later calls until `forget`; `choose` weighs them for a call's rows.

    Args:
        target: the target model.
        drafter: the draft model or stream heads that propose the pilot's tokens.
        max_context: longest sequence of the pilot's decoder, prompt included.
        space: the decoders' output space (`SpeechLayout.output_space`).
        max_gamma: the longest draft the drafter allows (stream heads' count; None: any).
    """

    def __init__(self, target: LlamaLM, drafter: LlamaLM | Heads | None, max_context: int, space: OutputSpace,
                 max_gamma: int | None = None) -> None:
        self.target, self.drafter, self.max_context, self.space = target, drafter, max_context, space
        self.max_gamma = max_gamma
        self.measured: dict[tuple, PilotMeasures] = {}  # (structure, batch) -> what its pilot measured

    @property
    def gamma(self) -> int:
        """The pilot's draft length: `PILOT_GAMMA`, or fewer where the stream heads propose fewer."""
        return min(PILOT_GAMMA, self.max_gamma or PILOT_GAMMA)

    def forget(self) -> None:
        """Drop every measurement: the next call pilots again, as a fresh pilot would."""
        self.measured.clear()

    def choose(self, settings: DecodingSettings, requests: list[Request], batch: int, *,
               rule_of: Callable[[DecodingSettings], Rule | None], compiled: bool, stream: bool) -> GammaChoice:
        """The choice for `requests` decoded with `settings` (`gamma: auto`) at `batch`: the pilot's
        measurements for the structure and batch size (a pilot decode of a few of `requests`
        first, where there are none yet), weighed for these rows: their length, and unless
        `stream` (more rows will follow) the drain at the end of `requests`.

        Args:
            rule_of: the acceptance rule of settings (the caller's rules, shared with its decoders).
            compiled: rounds run as compiled graphs (their host work is fused with the forwards).
        """
        key = (structure_key(settings), batch)
        if key not in self.measured:
            rule = rule_of(settings.model_copy(update={"gamma": self.gamma, "max_new_tokens": PILOT_TOKENS}))
            self.measured[key] = self.measure(requests, batch, rule, compiled)
        measures = self.measured[key]
        tokens = sum(r.max_new_tokens for r in requests) / max(len(requests), 1)
        return decide(batch, measures.acceptance, measures.steps, host_s=measures.host_s, pilot_gamma=self.gamma,
                      tokens=tokens, rows=None if stream else len(requests))

    def measure(self, requests: list[Request], batch: int, rule: Rule | None, compiled: bool) -> PilotMeasures:
        """A pilot decode of the first rows of `requests` under `rule`, and the step times per
        candidate gamma at `batch`. The host time is what an eager round adds to its forwards;
        rounds run as compiled graphs fuse that work with the forwards, so for them it counts as
        none."""
        probe = [Request(key=i, prompt_ids=r.prompt_ids, seed=r.seed, max_new_tokens=PILOT_TOKENS, warp=r.warp,
                         rule=rule) for i, r in enumerate(requests[: min(PILOT_ROWS, batch)])]
        acceptance, host = self.decode(probe, min(PILOT_ROWS, batch))
        context = int(sum(len(r.prompt_ids) for r in probe) / max(len(probe), 1)) + 64
        steps = measure_steps(self.target, self.drafter, batch, context, candidates=gamma_candidates(self.max_gamma))
        return PilotMeasures(acceptance, 0.0 if compiled else host, steps)

    def decode(self, probe: list[Request], slots: int) -> tuple[float, float]:
        """(acceptance per draft position, host seconds per round) of an eager decode of `probe`
        on `slots` slots at the pilot's gamma. The host time is the median round's: a fresh
        process's first rounds pay one-time costs (first calls of torch's kernels, page faults)
        that no later round pays."""
        decoder = SpeculativeDecoder(self.target, self.drafter, self.gamma, slots, self.max_context, self.space,
                                     RoundRunner("none"))
        rows, hosts = [], []
        decoder.submit(probe)
        with ForwardClock(self.target, self.drafter) as clock:
            while not decoder.idle:  # host seconds of each round: its wall time less its forwards'
                start, forwards, rounds = time.perf_counter(), clock.prefill_s + clock.decode_s, decoder.rounds_run
                rows += [row for _, row in decoder.advance()]
                if decoder.rounds_run > rounds:
                    took = time.perf_counter() - start - (clock.prefill_s + clock.decode_s - forwards)
                    hosts.append(max(took, 0.0) / (decoder.rounds_run - rounds))
        stats = aggregate([row.stats for row in rows])
        return sum(stats.accepted) / max(sum(stats.reached), 1), statistics.median(hosts) if hosts else 0.0
