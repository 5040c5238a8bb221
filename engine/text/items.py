"""A `Synthesizer` call's items prepared as a job prepares its rows (`Synthesizer.synthesize`
and `stream` with `text=TextSpec(...)`): each item's text normalised and planned
(`engine.text.prepare.TextPlanner`), a long one decoded as chunk items beside the others, and
the chunks' results joined back into the item's.

An item's result keeps its own text, its normalised text (`normalized_text`) and, when it was
split, its chunks' records (`chunks`: text, where it lies in the spoken text, the boundary it
was cut at, seed, code count, finish reason, statistics); its codes are the chunks' codes in
order (each chunk's `num_codes` of them). An item that fits, with normalisation off, is decoded
exactly as it is without `text`: same id, seed and request.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace

from engine.config import DecodingSettings
from engine.records import SynthesisItem, SynthesisResult, item_seed
from engine.text.chunks import chunk_items
from engine.text.join import chunk_records, join_results
from engine.text.prepare import PreparedText, TextPlanner


class SplitItems:
    """The items one call decodes for `items`, and their results joined back.

    Args:
        items: the call's texts or items.
        settings: the call's decoding settings (its seed derives the items' seeds).
        planner: normalises and plans the texts.

    Attributes:
        decoded: what the call decodes (an item, or its chunk items), in item order.
        owner: for each decoded item, the index of the item it belongs to.
    """

    def __init__(self, items: Sequence[SynthesisItem | str], settings: DecodingSettings,
                 planner: TextPlanner) -> None:
        self.items = [SynthesisItem(text=i) if isinstance(i, str) else i for i in items]
        self.prepared: list[PreparedText | None] = []
        self.errors: dict[int, str] = {}  # item index -> why its text could not be prepared
        self.spans: list[range] = []  # item index -> its decoded items
        self.decoded: list[SynthesisItem] = []
        for index, item in enumerate(self.items):
            ident = item.id if item.id is not None else str(index)
            item = replace(item, id=ident, seed=item.seed if item.seed is not None else item_seed(settings.seed, ident))
            try:
                prepared = planner(item.text or "", item.max_new_tokens or settings.max_new_tokens,
                                   item.prompt_text, item.prompt_codes, item.voice)
            except ValueError as exc:  # the normaliser failed: nothing of it is decoded
                self.errors[index] = f"text: {exc}"
                prepared, pieces = None, [replace(item, text="")]
            else:
                pieces = chunk_items(replace(item, text=prepared.spoken), prepared.plan, settings.seed)
            self.items[index] = item
            self.prepared.append(prepared)
            self.spans.append(range(len(self.decoded), len(self.decoded) + len(pieces)))
            self.decoded.extend(pieces)
        self.owner = [index for index, span in enumerate(self.spans) for _ in span]

    def result(self, index: int, results: Sequence[SynthesisResult]) -> SynthesisResult:
        """Item `index`'s result from its decoded items' (in order)."""
        item, prepared = self.items[index], self.prepared[index]
        text = item.text or ""
        if prepared is None:
            return SynthesisResult(id=item.id, text=text, seed=item.seed, error=self.errors[index])
        if not prepared.split:
            return replace(results[0], text=text, normalized_text=prepared.normalized)
        joined = join_results(item.id, text, item.seed, results)
        return replace(joined, normalized_text=prepared.normalized,
                       chunks=chunk_records(prepared.plan.chunks, results))

    def join(self, results: Sequence[SynthesisResult]) -> list[SynthesisResult]:
        """Every item's result, in item order, from the decoded items' (in `decoded` order)."""
        return [self.result(i, [results[k] for k in span]) for i, span in enumerate(self.spans)]

    def stream(self, finished: Iterable[tuple[int, SynthesisResult]]) -> Iterator[SynthesisResult]:
        """Each item's result as soon as its last decoded item finishes, from (decoded index,
        result) pairs in any order."""
        waiting = [len(span) for span in self.spans]
        done: dict[int, SynthesisResult] = {}
        for k, res in finished:
            done[k] = res
            index = self.owner[k]
            waiting[index] -= 1
            if waiting[index] == 0:
                yield self.result(index, [done.pop(j) for j in self.spans[index]])
