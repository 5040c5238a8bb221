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
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from engine.decoding.cost import drain_factor, predicted_speedup, round_tokens, step_times
from engine.models.llama import LlamaLM
from engine.models.streams import Heads

CANDIDATES = (1, 2, 3, 4, 6, 8)
MARGIN = 1.05  # speculation must beat `ar` by 5% to be worth its variance
HOST_OFFSET = 2  # an eager round's host time grows like (gamma + 2) (see `host_per_round`)


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
