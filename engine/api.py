"""The Python API: texts (+ optional voice prompts) and settings -> speech codes and statistics.

    from engine import Synthesizer, DecodingSettings
    synth = Synthesizer.load("kit/target", draft="kit/draft")
    results, summary = synth.synthesize(["Hello there."], DecodingSettings(method="pcg"))
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from engine.config import DecodingSettings
from engine.console import bar_disabled
from engine.decoding.adaptive import GammaChoice, choose_gamma
from engine.decoding.speculative import Request, SpeculativeDecoder
from engine.decoding.verify import make_rule
from engine.groups.cache import get_groups
from engine.groups.csr import GroupIndex, SpeechGroups
from engine.models.device import resolve_device
from engine.models.llasa import DEFAULT_DATE_STRING, LLASA_CONTEXT, LlasaPrompter
from engine.models.loading import LoadedModel, check_same_vocabulary, load_model
from engine.records import RunSummary, SynthesisItem, SynthesisResult, aggregate, item_seed


class Synthesizer:
    """Holds a target (and optionally a draft) and decodes batches of utterances.

    Args:
        target: the loaded target model.
        draft: the loaded draft model; needed by every method except `ar`.
        batch_size: rows decoded together (continuous batching refills finished rows).
        max_context: longest sequence, prompt included (Llasa was trained with 2048).
        date_string: the date pinned into the chat template.
    """

    def __init__(self, target: LoadedModel, draft: LoadedModel | None = None, batch_size: int = 8,
                 max_context: int = LLASA_CONTEXT, date_string: str = DEFAULT_DATE_STRING) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}")
        if draft is not None:
            check_same_vocabulary(target, draft)
            if draft.model.device != target.model.device:
                raise ValueError("draft and target must live on the same device")
        self.target, self.draft = target, draft
        self.batch_size, self.max_context = batch_size, max_context
        self.prompter = LlasaPrompter(target.tokenizer, target.layout, date_string)
        self._groups: dict[tuple, GroupIndex] = {}
        self._gamma: dict[tuple, GammaChoice] = {}
        self._decoder: tuple[tuple, SpeculativeDecoder] | None = None

    @classmethod
    def load(cls, target: str | Path, draft: str | Path | None = None, device: str = "auto",
             dtype: str = "auto", **kwargs) -> Synthesizer:
        """Load target (and draft) from local Hugging Face directories."""
        device = resolve_device(device)
        tgt = load_model(target, device=device, dtype=dtype)
        drf = load_model(draft, device=device, dtype=dtype) if draft is not None else None
        return cls(tgt, drf, **kwargs)

    @property
    def device(self) -> torch.device:
        return self.target.model.device

    def speech_embeddings(self) -> torch.Tensor:
        """`[65536, hidden]` input-embedding rows of the speech tokens (the groups' source)."""
        layout = self.target.layout
        table = self.target.model.model.embed_tokens.weight
        return table[layout.first_speech: layout.first_speech + layout.num_speech].detach()

    def set_groups(self, groups: SpeechGroups) -> None:
        """Use prebuilt groups for their (theta, cap) instead of building them."""
        key = (groups.theta, groups.max_group_size)
        self._groups[key] = GroupIndex(groups, self.target.layout.vocab_out, self.device)

    def groups(self, theta: float, max_group_size: int | None = None) -> GroupIndex:
        """The group index for (theta, cap): from the content-addressed groups cache
        (`$PCG_SYNTH_CACHE/groups`, else `~/.cache/pcg-synth/groups`), built and stored there
        from the target's embeddings only when absent."""
        key = (theta, max_group_size)
        if key not in self._groups:
            self.set_groups(get_groups(self.speech_embeddings(), theta, max_group_size))
        return self._groups[key]

    def decoder(self, settings: DecodingSettings, batch_size: int | None = None) -> SpeculativeDecoder:
        """A decoder for these settings; the last one is kept (its caches are reused)."""
        batch = batch_size or self.batch_size
        key = (settings.method, settings.gamma, settings.warp, settings.theta,
               settings.max_group_size, settings.max_thinning_trials, settings.beta, settings.topk,
               batch)
        if self._decoder is not None and self._decoder[0] == key:
            return self._decoder[1]
        self._decoder = None  # free the old caches first
        if settings.speculative:
            if self.draft is None:
                raise ValueError(f"method {settings.method!r} needs a draft model; load one or use 'ar'")
            groups = self.groups(settings.theta, settings.max_group_size) if settings.method == "pcg" else None
            rule = make_rule(settings, groups)
            decoder = SpeculativeDecoder(self.target.model, self.draft.model, rule, settings.warp,
                                         settings.gamma, batch, self.max_context,
                                         self.target.layout.eos_out)
        else:
            decoder = SpeculativeDecoder(self.target.model, None, None, settings.warp, 0,
                                         batch, self.max_context, self.target.layout.eos_out)
        self._decoder = (key, decoder)
        return decoder

    def resolve_gamma(self, settings: DecodingSettings, requests: list[Request], batch: int,
                      ) -> tuple[DecodingSettings, GammaChoice | None]:
        """Settings with a concrete gamma. For `gamma: auto` a pilot (gamma 4, a few short rows)
        measures acceptance, then `choose_gamma` times the steps at `batch`; the choice is kept
        per (settings, batch). Speculation off means `ar`."""
        if settings.gamma != "auto" or not settings.speculative:
            return (settings.model_copy(update={"gamma": 3}) if settings.gamma == "auto" else settings), None
        key = (settings.model_dump_json(), batch)
        if key not in self._gamma:
            pilot = settings.model_copy(update={"gamma": 4, "max_new_tokens": 48})
            probe = [Request(key=i, prompt_ids=r.prompt_ids, seed=r.seed, max_new_tokens=48)
                     for i, r in enumerate(requests[: min(8, batch)])]
            stats = aggregate([row.stats for _, row in self.decoder(pilot, min(8, batch)).run(probe)])
            acceptance = sum(stats.accepted) / max(sum(stats.reached), 1)
            context = int(sum(len(r.prompt_ids) for r in probe) / max(len(probe), 1)) + 64
            self._gamma[key] = choose_gamma(self.target.model, self.draft.model, batch, acceptance, context)
        choice = self._gamma[key]
        update = {"gamma": choice.gamma} if choice.gamma else {"method": "ar", "gamma": 1}
        return settings.model_copy(update=update), choice

    def prepare(self, index: int, item: SynthesisItem | str, settings: DecodingSettings):
        """(result shell, request or None): bad items become error results, never exceptions."""
        if isinstance(item, str):
            item = SynthesisItem(text=item)
        item_id = item.id if item.id is not None else str(index)
        seed = item.seed if item.seed is not None else item_seed(settings.seed, item_id)
        result = SynthesisResult(id=item_id, text=item.text or "", seed=seed)
        try:
            ids = self.prompter.build(item.text, item.prompt_text, item.prompt_codes)
        except ValueError as exc:
            result.error = str(exc)
            return result, None
        if len(ids) >= self.max_context:
            result.error = (f"prompt is {len(ids)} tokens; the model's context is {self.max_context} "
                            "(shorten the text or the voice prompt)")
            return result, None
        request = Request(key=index, prompt_ids=ids, seed=seed,
                          max_new_tokens=settings.max_new_tokens,
                          history_out=list(item.prompt_codes or []))
        return result, request

    def synthesize(self, items: Sequence[SynthesisItem | str], settings: DecodingSettings | None = None,
                   progress: bool = False, batch_size: int | None = None,
                   ) -> tuple[list[SynthesisResult], RunSummary]:
        """Decode `items` with `settings`; results come back in input order.

        Args:
            items: texts or `SynthesisItem`s; bad items become error results.
            settings: decoding settings (defaults: `DecodingSettings()`).
            progress: show a progress bar.
            batch_size: override the synthesizer's batch size for this call.

        Returns:
            (one result per item, the run's summary).
        """
        settings = settings or DecodingSettings()
        prepared = [self.prepare(i, item, settings) for i, item in enumerate(items)]
        results = [r for r, _ in prepared]
        requests = [q for _, q in prepared if q is not None]
        if settings.speculative and self.draft is None:
            raise ValueError(f"method {settings.method!r} needs a draft model; load one or use 'ar'")
        effective, choice = self.resolve_gamma(settings, requests, batch_size or self.batch_size)
        decoder = self.decoder(effective, batch_size)
        start = time.perf_counter()
        bar = tqdm(total=len(requests), desc=f"decode [{settings.method}]", unit="utt",
                   disable=bar_disabled(progress))
        for request, row in decoder.run(requests):
            res = results[request.key]
            res.codes, res.finish_reason, res.stats = row.tokens, row.finish_reason, row.stats
            bar.update(1)
        bar.close()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
        stats = aggregate([r.stats for r in results if r.stats is not None])
        summary = RunSummary(method=settings.method, settings=settings.model_dump(), items=len(results),
                             ok=len(requests), failed=len(results) - len(requests), wall_s=wall,
                             stats=stats, gamma_choice=choice.to_dict() if choice else None,
                             decode_rounds=decoder.rounds_run,
                             slot_rounds=decoder.slot_rounds, batch_size=decoder.batch)
        return results, summary
