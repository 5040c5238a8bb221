"""`gamma: auto`: choose the draft length per batch size from measured costs, or switch
speculation off where it no longer pays.

With per-position acceptance `a` (measured by a short pilot) a round of `g` drafts yields on
average `L(g) = (1 - a**(g+1)) / (1 - a)` tokens, and costs one draft phase plus one verify
forward; an `ar` step costs one target forward. Both are timed at the batch size that will run
(`engine.decoding.cost.step_times`), because that is what decides: at batch 1 a GPU verifies
g+1 tokens for about the price of one, at a large batch the verify step costs g+1 steps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from engine.decoding.cost import predicted_speedup, step_times
from engine.models.llama import LlamaLM

CANDIDATES = (1, 2, 3, 4, 6, 8)
MARGIN = 1.05  # speculation must beat `ar` by 5% to be worth its variance


def expected_length(acceptance: float, gamma: int) -> float:
    """Tokens per round with `gamma` drafts and per-position acceptance `acceptance`."""
    a = min(max(acceptance, 0.0), 0.999999)
    return (1 - a ** (gamma + 1)) / (1 - a)


@dataclass
class GammaChoice:
    """What `gamma: auto` decided, and the figures it decided on."""

    gamma: int  # 0: speculation off (the job runs `ar`)
    batch_size: int
    acceptance: float
    predicted_speedup: dict[int, float] = field(default_factory=dict)
    step_times: dict[int, dict] = field(default_factory=dict)
    reason: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def choose_gamma(target: LlamaLM, draft: LlamaLM, batch: int, acceptance: float, context: int,
                 candidates: tuple[int, ...] = CANDIDATES, reps: int = 5) -> GammaChoice:
    """The draft length with the best predicted speedup at `batch`, or 0 if none pays.

    Args:
        target, draft: the models (their step times are measured here).
        batch: rows decoded together.
        acceptance: mean per-position acceptance from a pilot run.
        context: typical sequence length (prompt + half the output) for the timing.
        candidates: draft lengths to consider.
        reps: timing repetitions per measurement (median).
    """
    choice = GammaChoice(gamma=0, batch_size=batch, acceptance=round(acceptance, 4))
    best, best_gamma = MARGIN, 0
    for g in candidates:
        times = step_times(target, draft, batch, g, context, reps)
        speedup = predicted_speedup(expected_length(acceptance, g), g, times)
        choice.step_times[g] = {k: round(v, 6) for k, v in times.items()}
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
