"""Several decoders fed from one thread: rows whose structural settings differ (with or without
a draft, another gamma) decode in separate batches, and each `step` runs one round of one of
them.

Which one: the decoder holding the most rows (decoding plus queued), so rounds go to the fullest
batch; a decoder with work that was passed over `PATIENCE` times in a row goes next, so none
starves.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from engine.decoding.speculative import Request, RowResult, SpeculativeDecoder

PATIENCE = 8


class DecodeScheduler:
    """Rounds over decoders, with the slot counts of every round it ran.

    Attributes:
        rounds: decode rounds run.
        slot_rounds: rows active, summed over those rounds.
        slots: batch slots, summed over those rounds (`slot_rounds / slots` is the utilisation).
    """

    def __init__(self) -> None:
        self.decoders: dict[Hashable, SpeculativeDecoder] = {}  # those with work
        self.waited: dict[Hashable, int] = {}
        self.used: set[Hashable] = set()  # every decoder key that ever had work
        self.rounds = self.slot_rounds = self.slots = 0

    def submit(self, key: Hashable, decoder: SpeculativeDecoder, requests: Iterable[Request]) -> None:
        """Queue `requests` on `decoder` (known by `key` from now on)."""
        decoder.submit(requests)
        self.decoders[key] = decoder
        self.used.add(key)

    @property
    def idle(self) -> bool:
        return all(d.idle for d in self.decoders.values())

    @property
    def queued(self) -> int:
        """Rows waiting for a slot, over every decoder."""
        return sum(len(d.queue) for d in self.decoders.values())

    def step(self) -> list[tuple[Request, RowResult]]:
        """One round of one decoder with work; the rows that finished in it."""
        busy = [k for k, d in self.decoders.items() if not d.idle]
        if not busy:
            return []
        late = [k for k in busy if self.waited.get(k, 0) >= PATIENCE]
        key = late[0] if late else max(busy, key=lambda k: self.decoders[k].load)
        for k in busy:
            self.waited[k] = 0 if k == key else self.waited.get(k, 0) + 1
        decoder = self.decoders[key]
        rounds, filled = decoder.rounds_run, decoder.slot_rounds
        done = decoder.advance()
        ran = decoder.rounds_run - rounds
        self.rounds += ran
        self.slot_rounds += decoder.slot_rounds - filled
        self.slots += ran * decoder.batch
        if decoder.idle:
            del self.decoders[key], self.waited[key]  # the synthesizer keeps it for reuse
        return done

    def reset(self) -> None:
        """Drop every row (after an error)."""
        for d in self.decoders.values():
            d.reset()
        self.decoders.clear()
        self.waited.clear()
