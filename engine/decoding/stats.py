"""Decoding statistics per row and their aggregate over many rows."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RowStats:
    """What one row's decoding did.

    Attributes:
        rounds: decode-phase target forwards (draft+verify rounds, or `ar` steps).
        emitted: tokens produced by those rounds before truncation (accepted + 1 per round).
        reached: `[gamma]` rounds in which draft position i was judged (all before it accepted).
        accepted: `[gamma]` rounds in which draft position i was accepted.
        thinning_trials: PCG thinning trials spent on recovered tokens.
        fallbacks: PCG recovered tokens that needed the exact dense residual.
        prompt_tokens: prompt length.
        generated_tokens: tokens committed after the prompt (end-of-speech included).
    """

    rounds: int = 0
    emitted: int = 0
    reached: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    thinning_trials: int = 0
    fallbacks: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0

    @property
    def drafted(self) -> int:
        return sum(self.reached)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per target call in the decode phase, bonus/recovered token included."""
        return self.emitted / self.rounds if self.rounds else 0.0

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / r if r else 0.0 for a, r in zip(self.accepted, self.reached)]

    def to_dict(self) -> dict:
        return {
            "rounds": self.rounds,
            "target_calls": self.rounds,
            "emitted": self.emitted,
            "drafted": self.drafted,
            "reached_per_position": list(self.reached),
            "accepted_per_position": list(self.accepted),
            "acceptance_per_position": [round(x, 6) for x in self.acceptance_per_position],
            "mean_accepted_length": round(self.mean_accepted_length, 6),
            "thinning_trials": self.thinning_trials,
            "fallbacks": self.fallbacks,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
        }


def aggregate(rows: list[RowStats]) -> RowStats:
    """Sum of several rows' statistics (per-position counts added position by position)."""
    total = RowStats()
    width = max((len(r.reached) for r in rows), default=0)
    total.reached, total.accepted = [0] * width, [0] * width
    for r in rows:
        total.rounds += r.rounds
        total.emitted += r.emitted
        total.thinning_trials += r.thinning_trials
        total.fallbacks += r.fallbacks
        total.prompt_tokens += r.prompt_tokens
        total.generated_tokens += r.generated_tokens
        for i, (reach, acc) in enumerate(zip(r.reached, r.accepted)):
            total.reached[i] += reach
            total.accepted[i] += acc
    return total
