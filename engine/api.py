"""The Python API: texts (+ optional voice prompts) and settings -> speech codes and statistics.

    from engine import Synthesizer, DecodingSettings
    synth = Synthesizer.load("kit/target", draft="kit/draft")
    results, summary = synth.synthesize(["Hello there."], DecodingSettings(method="pcg"))
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from engine.config import ADMISSIONS, Admission, DecodingSettings, TextSpec, decoding_default, resources_default
from engine.console import bar_disabled
from engine.decoding.adaptive import GammaChoice, GammaPilot
from engine.decoding.admission import expected_tokens, speech_budget
from engine.decoding.graphs import RoundRunner
from engine.decoding.scheduler import DecodeScheduler
from engine.decoding.speculative import Request, RowResult, SpeculativeDecoder
from engine.decoding.verify import Rule, make_rule, rule_key, structure_key
from engine.errors import field_errors
from engine.families import check_max_new_tokens, family_settings
from engine.groups.cache import get_groups
from engine.groups.csr import GroupIndex, SpeechGroups
from engine.groups.options import GroupsBuild
from engine.groups.source import stored_speech_rows
from engine.io.storage import model_dir
from engine.models.device import resolve_compile, resolve_device
from engine.models.loading import LoadedModel, check_same_vocabulary, load_model
from engine.models.malloc import keep_freed_memory
from engine.models.streams import Heads, is_streams_dir, load_streams
from engine.records import RunSummary, SynthesisItem, SynthesisResult, aggregate, attempt_seed, item_seed

if TYPE_CHECKING:  # the gate's verifiers load only for a call that brings one
    from engine.metrics.gate import QualityGate
    from engine.models.llama import LlamaLM
    from engine.text.items import SplitItems

log = logging.getLogger(__name__)

# `Synthesizer.warmup`'s texts: prompts of several lengths, so that admissions prefill several widths
WARMUP_TEXTS = ("Warm-up.", "A second warm-up sentence, a little longer than the first.",
                "Three: the third warm-up sentence is longer again, so that its prompt is wider than the others.",
                "Four.")

# `Synthesizer.warmup_each`: new tokens per warm-up row before settings are compared. A process's
# first decode pays one-time costs, which would otherwise land on whichever setting is timed first.
COMPARE_WARMUP_TOKENS = 8


class Synthesizer:
    """Holds a target (and optionally a drafter: a draft model or stream heads) and decodes
    batches of utterances.

    Args:
        target: the loaded target model.
        draft: the loaded draft model; it or `streams` is needed by every method except `ar`.
        batch_size: rows decoded together (continuous batching refills finished rows).
        max_context: longest sequence, prompt included (None: the family's context, e.g. the
            2,048 tokens Llasa was trained with).
        streams: stream heads on the target that draft instead of a draft model
            (`engine.models.streams`; gamma at most their count).
    """

    def __init__(self, target: LoadedModel, draft: LoadedModel | None = None,
                 batch_size: int = resources_default("batch_size"),
                 max_context: int | None = None, streams: Heads | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}")
        if draft is not None and streams is not None:
            raise ValueError("give a draft model or stream heads, not both: one drafter proposes a round's tokens")
        if streams is not None:
            streams.fits(target.model)
            if streams.device != target.model.device:
                raise ValueError("stream heads and target must live on the same device")
        if draft is not None:
            check_same_vocabulary(target, draft)
            if draft.model.device != target.model.device:
                raise ValueError("draft and target must live on the same device")
            shared = draft.model.share_tables(target.model)  # one copy where the draft's are the target's
            if shared:
                log.info("the draft uses the target's %s (the same values)", " and ".join(shared))
        self.target, self.draft, self.streams = target, draft, streams
        if self.device.type == "cpu":  # from now on this process's C allocator keeps what a round
            keep_freed_memory()  # frees (engine.models.malloc; PCG_SYNTH_MALLOC=default: as it is)
        self.family, self.layout = target.family, target.layout
        self.batch_size, self.max_context = batch_size, max_context or self.family.context
        self.prompter = self.family.prompter(target.tokenizer, target.layout)
        self._groups: dict[tuple, GroupIndex] = {}
        # `gamma: auto`'s pilots, and what they measured per structure and batch size
        self.pilot = GammaPilot(target.model, self.drafter, self.max_context, self.layout.output_space(),
                                self.max_gamma)
        self._rules: dict[tuple, Rule] = {}
        self._decoders: dict[tuple, SpeculativeDecoder] = {}
        self.runner = RoundRunner.for_model(target.model)  # every decoder's rounds: eager or graphs
        # calls and sessions share the decoders: their rows may share a batch, and every change to
        # a decoder (queueing rows, a round, dropping rows) holds this lock (`DecodeSession`)
        self.lock = threading.Lock()
        self.submissions = itertools.count(1)  # numbers every submission: earlier ones admitted first
        self.closed: list[DecodeSession] = []  # sessions whose rows leave the decoders (`DecodeSession.close`)

    @classmethod
    def load(cls, target: str | Path, draft: str | Path | None = None, device: str = "auto",
             dtype: str = "auto", compile: str = "auto", draft_weights: str = "native",
             family: str = "auto", **kwargs) -> Synthesizer:
        """Load target (and draft) from Hugging Face checkpoints (a directory, a Hub model or an
        object-store URI, as `load_model` takes them); `draft` may instead name a directory of
        stream heads (`pcg_streams.json`: `pcg-synth draft train --kind streams`), loaded onto the
        target in its dtype. `compile` as in `ModelsSpec.compile` (both models: `auto` resolved
        once, for the pair; under `auto` a round whose graph fails to compile runs eagerly, with a
        warning, and so do the rounds after it), `draft_weights` as `load_model`'s `weights` (a
        draft model's only), `family` as `ModelsSpec.family`."""
        device = resolve_device(device)
        auto = compile == "auto"
        if draft is not None:  # a Hub model or URI: its local copy, whose files say which drafter it is
            draft = model_dir(draft)
        heads = draft is not None and is_streams_dir(draft)
        if heads and draft_weights != "native":
            raise ValueError(f"draft_weights {draft_weights} applies to a draft model; the stream heads at {draft} "
                             "run in the target's dtype (use native)")
        compile = resolve_compile(compile, device, draft_weights if draft is not None else "native")
        tgt = load_model(target, device=device, dtype=dtype, compile=compile, family=family)
        drf = streams = None
        if heads:
            streams = load_streams(draft, tgt.model)
        elif draft is not None:
            drf = load_model(draft, device=device, dtype=dtype, compile=compile, weights=draft_weights,
                             family=tgt.family.name)
        synth = cls(tgt, drf, streams=streams, **kwargs)
        synth.runner.fallback = auto  # auto's graphs that fail to compile give way to eager rounds
        return synth

    @property
    def device(self) -> torch.device:
        return self.target.model.device

    @property
    def drafter(self) -> LlamaLM | Heads | None:
        """What proposes a round's tokens: the stream heads, else the draft model, else None."""
        if self.streams is not None:
            return self.streams
        return self.draft.model if self.draft is not None else None

    @property
    def drafter_kind(self) -> str | None:
        """`streams`, `model`, or None (no drafter: `ar` only)."""
        return "streams" if self.streams is not None else "model" if self.draft is not None else None

    @property
    def max_gamma(self) -> int | None:
        """The longest draft the drafter allows: the stream heads' count (None: any)."""
        return self.streams.heads if self.streams is not None else None

    def check_speculative(self, settings: DecodingSettings) -> None:
        """Raise unless this synthesizer can decode `settings`: a drafter for a speculative
        method, and a concrete gamma within what it proposes.

        Raises:
            ValueError: no drafter, or a gamma above the stream heads' count.
        """
        if not settings.speculative:
            return
        if self.drafter is None:
            raise ValueError(f"method {settings.method!r} needs a draft model or stream heads; load one or use 'ar'")
        limit = self.max_gamma
        if limit is not None and settings.gamma != "auto" and settings.gamma > limit:
            where = getattr(self.streams, "path", "these heads")
            raise ValueError(f"gamma {settings.gamma} needs {settings.gamma} stream heads; {where} has {limit} "
                             f"(use gamma {limit} or less, or auto)")

    def speech_embeddings(self) -> torch.Tensor:
        """`[codes, hidden]` input-embedding rows of the code tokens (the groups' source), as the
        checkpoint stores them: a model loaded in another dtype (float32 weights decoded in
        bfloat16) takes its groups from the stored values, so they are the groups a job's driver
        builds from the same checkpoint, whatever `dtype` this synthesizer runs in."""
        layout = self.target.layout
        table = self.target.model.model.embed_tokens.weight
        rows = table[layout.first_code: layout.first_code + layout.num_codes].detach()
        if (self.target.path / "config.json").is_file():
            stored = stored_speech_rows(self.target.path, self.target.config, layout)
            if stored.dtype != rows.dtype:
                return stored
        return rows

    def set_groups(self, groups: SpeechGroups) -> None:
        """Use prebuilt groups for their (theta, cap) instead of building them.

        Raises:
            ValueError: a group mixes the family's code ranges (another family's groups)."""
        if groups.num_tokens != self.layout.num_codes or groups.mixes_ranges(self.layout.ranges):
            raise ValueError(f"these groups were not built for this target's code ranges ({self.family.name}: "
                             f"{self.layout.cycle} x {self.layout.codebook} codes)")
        key = (groups.theta, groups.max_group_size)
        self._groups[key] = GroupIndex(groups, self.target.layout.vocab_out, self.device)
        for rule in [k for k in self._rules if k[0] == "pcg" and k[1:3] == key]:
            del self._rules[rule]  # rules built on the groups replaced

    def groups(self, theta: float, max_group_size: int | None = None) -> GroupIndex:
        """The group index for (theta, cap): from the content-addressed groups cache
        (`$PCG_SYNTH_CACHE/groups`, else `~/.cache/pcg-synth/groups`), built and stored there
        from the target's embeddings only when absent."""
        key = (theta, max_group_size)
        if key not in self._groups:
            build = GroupsBuild(theta, max_group_size, ranges=self.layout.ranges, family=self.layout.family)
            self.set_groups(get_groups(self.speech_embeddings(), build))
        return self._groups[key]

    def rule(self, settings: DecodingSettings) -> Rule | None:
        """The acceptance rule of `settings` (None for `ar`), one object per distinct rule."""
        if not settings.speculative:
            return None
        key = rule_key(settings)
        if key not in self._rules:
            groups = self.groups(settings.theta, settings.max_group_size) if settings.method == "pcg" else None
            self._rules[key] = make_rule(settings, groups)
        return self._rules[key]

    def make_decoder(self, settings: DecodingSettings, batch: int) -> SpeculativeDecoder:
        """A new decoder for `settings`' structure (draft or not, gamma) at `batch` slots.

        Raises:
            ValueError: as `check_speculative`.
        """
        if settings.speculative:
            self.check_speculative(settings)
            return SpeculativeDecoder(self.target.model, self.drafter, settings.gamma, batch,
                                      self.max_context, self.layout.output_space(), self.runner)
        return SpeculativeDecoder(self.target.model, None, 0, batch, self.max_context,
                                  self.layout.output_space(), self.runner)

    def decoder(self, settings: DecodingSettings, batch_size: int | None = None) -> SpeculativeDecoder:
        """The decoder for `settings` (concrete gamma): one per structure (draft or not, gamma)
        and batch size, whatever the sampling settings or the rule; kept for reuse (its caches),
        and idle ones are freed when another structure is needed."""
        batch = batch_size or self.batch_size
        key = decoder_key(settings, batch)
        if key not in self._decoders:
            for other in [k for k, d in self._decoders.items() if d.idle]:
                del self._decoders[other]  # free idle caches first
            self._decoders[key] = self.make_decoder(settings, batch)
        return self._decoders[key]

    def resolve_gamma(self, settings: DecodingSettings, requests: list[Request], batch: int,
                      stream: bool = False) -> tuple[DecodingSettings, GammaChoice | None]:
        """Settings with a concrete gamma. For `gamma: auto` the pilot (`GammaPilot.choose`: a
        few short rows at `pilot_gamma`, and the steps timed at `batch`, kept per structural
        settings and batch size) decides for these rows, weighing unless `stream` (more rows will
        follow: a job worker) the drain at the end of `requests`. Speculation off means `ar`."""
        if settings.gamma != "auto" or not settings.speculative:
            if settings.gamma == "auto":
                settings = settings.model_copy(update={"gamma": decoding_default("gamma")})
            return settings, None
        choice = self.pilot.choose(settings, requests, batch, rule_of=self.rule, compiled=self.runner.mode != "none",
                                   stream=stream)
        update = {"gamma": choice.gamma} if choice.gamma else {"method": "ar", "gamma": 1}
        return settings.model_copy(update=update), choice

    def drop_closed(self) -> None:
        """Take the rows of closed sessions out of every decoder (the caller holds `lock`)."""
        while self.closed:
            gone = self.closed.pop()
            for decoder in self._decoders.values():
                decoder.drop(lambda request, gone=gone: request.owner is gone)

    def forget_measurements(self) -> None:
        """Drop what `gamma: auto` measured (its pilots' acceptance and step times), so the next
        rows measure again, as in a freshly loaded synthesizer (a job worker kept for a sweep's
        next point: that point's choice is its own)."""
        self.pilot.forget()

    @property
    def pilot_gamma(self) -> int:
        """The draft length of `gamma: auto`'s pilot (`GammaPilot.gamma`)."""
        return self.pilot.gamma

    def warmup(self, settings: DecodingSettings | None = None,
               batch_size: int | None = None) -> list[SynthesisResult]:
        """Decode a batch and a half of warm-up rows with `settings` (their structure and token
        budget) at `batch_size`, and return their results. What a first run pays for at each
        new shape (the full batch at every key length up to the budget's, admissions while the
        batch runs, the final drain, a compiled round's graph) is then paid here, not inside what is
        timed next. Not every first-run cost goes.
        Results decoded afterwards are the same as without it."""
        settings = settings or DecodingSettings()
        batch = batch_size or self.batch_size
        rows = batch + (batch + 1) // 2
        items = [SynthesisItem(text=WARMUP_TEXTS[i % len(WARMUP_TEXTS)], id=f"warmup-{i}") for i in range(rows)]
        return self.synthesize(items, settings, batch_size=batch)[0]

    def warmup_each(self, settings: Sequence[DecodingSettings], batch_size: int | None = None,
                    tokens: int = COMPARE_WARMUP_TOKENS) -> None:
        """`warmup` for each of several settings, their rows cut to `tokens` new tokens: before
        the settings are timed one after another, so that the first pays no more of the
        process's first-run costs than the others."""
        for s in settings:
            self.warmup(s.model_copy(update={"max_new_tokens": tokens}), batch_size)

    def settings(self, settings: DecodingSettings | None = None) -> DecodingSettings:
        """`settings` (default: `DecodingSettings()`) with the model family's sampling defaults in
        the fields they leave unset (`families.family_settings`: Orpheus's temperature 0.6, top-p
        0.8, repetition penalty 1.3)."""
        return family_settings(settings or DecodingSettings(), self.family)

    def prepare(self, index: int, item: SynthesisItem | str, settings: DecodingSettings, key: object = None):
        """(result shell, request or None) for one item decoded with `settings` (the item's own
        sampling settings are applied by `item_settings` first): bad items become error results,
        never exceptions. The request's key is `key` (default: `index`)."""
        if isinstance(item, str):
            item = SynthesisItem(text=item)
        item_id = item.id if item.id is not None else str(index)
        seed = item.seed if item.seed is not None else item_seed(settings.seed, item_id)
        result = SynthesisResult(id=item_id, text=item.text or "", seed=seed)
        try:
            request = self.request(item.text, settings, seed, index if key is None else key,
                                   item.prompt_text, item.prompt_codes, item.voice)
        except ValueError as exc:
            result.error = str(exc)
            return result, None
        return result, request

    def request(self, text: str, settings: DecodingSettings, seed: int, key: object,
                prompt_text: str | None = None, prompt_codes: list[int] | None = None,
                voice: str | None = None) -> Request:
        """The decoder's request for one text (with a voice prompt's transcript and codes, or a
        named voice) decoded with `settings` and `seed`: its prompt ids, token budget and
        admission priority.

        Raises:
            ValueError: a text or voice prompt the prompter refuses, a prompt that fills the
                model's context, or a `max_new_tokens` above it (`check_max_new_tokens`).
        """
        # every decode passes here (a call's items, a job worker's rows): a row's own budget is
        # checked where it meets the context the decoder runs with
        check_max_new_tokens(settings.max_new_tokens, self.max_context, self.family.name)
        ids = self.prompter.build(text, prompt_text, prompt_codes, voice)
        if len(ids) >= self.max_context:
            raise ValueError(f"prompt is {len(ids)} tokens; the model's context is {self.max_context} "
                             "(shorten the text or the voice prompt)")
        budget = settings.max_new_tokens
        if settings.max_speech_ratio is not None:
            budget = min(budget, speech_budget(text or "", settings.max_speech_ratio, self.family.codes_per_second))
        return Request(key=key, prompt_ids=ids, seed=seed, max_new_tokens=budget,
                       history_out=self.layout.out_ids(prompt_codes or []), warp=settings.warp,
                       priority=expected_tokens(text or "", budget, self.family.codes_per_second))

    def session(self, batch_size: int | None = None, stream: bool = False,
                admission: Admission = "longest_first") -> DecodeSession:
        """A decode session: rows with their own settings in, finished rows out (see
        `DecodeSession`; `stream`: rows keep arriving, as in a job worker; `admission`: which
        queued row takes a free slot, see `decoding/admission.py`)."""
        return DecodeSession(self, batch_size or self.batch_size, stream, admission)

    def _start(self, items: Sequence[SynthesisItem | str], settings: DecodingSettings | None,
               batch_size: int | None, admission: Admission, quality: QualityGate | None = None) -> _Call:
        settings = self.settings(settings)
        self.check_speculative(settings)  # before any row is queued: the call fails as a whole
        check_max_new_tokens(settings.max_new_tokens, self.max_context, self.family.name)  # the call's, not an item's
        session = self.session(batch_size, admission=admission)
        call = _Call(settings, session) if quality is None else _GatedCall(settings, session, self, quality)
        rows = []
        for i, item in enumerate(items):
            try:
                mine = item_settings(item, settings)
            except ValueError as exc:  # pydantic's ValidationError is one
                result = self.prepare(i, item, settings)[0]
                result.error = f"item settings: {one_line(exc)}"
                call.results.append(result)
                continue
            result, request = self.prepare(i, item, mine)
            call.results.append(result)
            if request is not None:
                rows.extend(call.first(i, item, mine, request))
        try:
            call.session.submit(rows)
        except BaseException:  # rows of a structure queued before another's failed: take them out
            call.session.close()
            raise
        call.ok = len(rows) // call.candidates
        return call

    def split_items(self, items: Sequence[SynthesisItem | str], settings: DecodingSettings | None,
                    text: TextSpec | None) -> SplitItems | None:
        """`items` with their texts prepared under `text` (normalised, long ones cut into chunks
        that fit this model's context and their budget: `engine.text.items`); None without `text`."""
        if text is None:
            return None
        from engine.text.items import SplitItems
        from engine.text.prepare import TextPlanner

        planner = TextPlanner(text, self.prompter.build, self.max_context, self.family.codes_per_second)
        return SplitItems(items, settings or DecodingSettings(), planner)

    def stream(self, items: Sequence[SynthesisItem | str], settings: DecodingSettings | None = None,
               batch_size: int | None = None, admission: Admission = "longest_first",
               quality: QualityGate | None = None, text: TextSpec | None = None) -> Iterator[SynthesisResult]:
        """Decode `items` with `settings`, yielding each result as its row finishes (items that
        could not be decoded first). Every item's result is yielded exactly once; `result.id`
        says which item it is (the item's id, else its index as a string).

        Args:
            items: texts or `SynthesisItem`s (with their own sampling settings, if any).
            settings: decoding settings (defaults: `DecodingSettings()`).
            batch_size: override the synthesizer's batch size for this call.
            admission: which queued item takes a free slot: `longest_first` (longest expected
                speech first, so the batch drains late) or `arrival` (input order).
            quality: a quality gate (`engine.metrics.gate.QualityGate.load(QualitySpec(...),
                codec=...)`): each item's audio is checked before it is yielded, an item that
                fails is decoded again (`attempts`) or chosen among candidates (`best_of`);
                `result.quality` holds the verdict (`passed` False: the gate's best of its
                failed attempts), and `result.seed` the kept attempt's seed.
            text: prepare the texts first (`TextSpec`: normalisation, long texts cut into
                chunks decoded beside the other items, their codes joined into the item's
                result; see `engine.text.items`); an item is yielded once its last chunk
                finishes. None: the texts as they are.

        Raises:
            ValueError: settings this synthesizer cannot honour (a method that needs a drafter
                without one, a gamma above its stream heads' count, a `max_new_tokens` above its
                context); an item's own are its error.
        """
        split = self.split_items(items, settings, text)
        call = self._start(split.decoded if split else items, settings, batch_size, admission, quality)
        yield from split.stream(call) if split else (result for _, result in call)

    def synthesize(self, items: Sequence[SynthesisItem | str], settings: DecodingSettings | None = None,
                   progress: bool = False, batch_size: int | None = None,
                   admission: Admission = "longest_first", quality: QualityGate | None = None,
                   text: TextSpec | None = None) -> tuple[list[SynthesisResult], RunSummary]:
        """Decode `items` with `settings`; results come back in input order.

        Args:
            items: texts or `SynthesisItem`s (with their own sampling settings, if any); bad
                items become error results.
            settings: decoding settings (defaults: `DecodingSettings()`).
            progress: show a progress bar.
            batch_size: override the synthesizer's batch size for this call.
            admission: which queued item takes a free slot (see `stream`); results come back
                in input order either way, and are the same.
            quality: a quality gate, as in `stream` (the summary counts its decisions, per
                chunk where texts are split).
            text: prepare the texts first, as in `stream` (the progress bar counts chunks).

        Returns:
            (one result per item, the run's summary).

        Raises:
            ValueError: as `stream`.
        """
        split = self.split_items(items, settings, text)
        call = self._start(split.decoded if split else items, settings, batch_size, admission, quality)
        settings = call.settings
        start = time.perf_counter()
        bar = tqdm(total=call.ok, desc=f"decode [{settings.method}]", unit="utt",
                   disable=bar_disabled(progress))
        for _, result in call:
            if result.error is None:
                bar.update(1)
        bar.close()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
        results = split.join(call.results) if split else call.results
        ok = sum(r.error is None for r in results) if split else call.ok
        stats = aggregate([r.stats for r in results if r.stats is not None])
        session = call.session
        choice = session.gamma_choices[0] if session.gamma_choices else None
        summary = RunSummary(method=settings.method, settings=settings.model_dump(), items=len(results),
                             ok=ok, failed=len(results) - ok, wall_s=wall,
                             stats=stats, gamma_choice=choice.to_dict() if choice else None,
                             decode_rounds=session.scheduler.rounds,
                             slot_rounds=session.scheduler.slot_rounds, batch_size=session.batch,
                             cut=sum(r.cut for r in results), quality=call.counts(),
                             codes_per_second=self.family.codes_per_second,
                             drafter=self.drafter_kind if settings.speculative else None)
        return results, summary


def structure(settings: DecodingSettings) -> tuple:
    """The settings that need a decoder (and a rule) of their own; sampling settings do not."""
    return structure_key(settings)


def decoder_key(settings: DecodingSettings, batch: int) -> tuple:
    """Rows share a decoder when they agree on this: draft or not, gamma, batch size (rules
    and sampling settings are per row)."""
    return (settings.speculative, settings.gamma if settings.speculative else 0, batch)


def item_settings(item: SynthesisItem | str, settings: DecodingSettings) -> DecodingSettings:
    """`settings` with the item's own sampling settings applied.

    Raises:
        ValueError: an invalid value (pydantic's ValidationError, naming the field).
    """
    return settings.with_overrides(item.overrides() if isinstance(item, SynthesisItem) else {})


def one_line(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        return field_errors(errors(), "item")
    return str(exc)


class RowsDropped(RuntimeError):
    """A session's rows were dropped from a batch it shared with a session that failed."""


class DecodeSession:
    """Rows with their own settings in, finished rows out.

    Rows go to the decoder of their structure (`decoder_key`): rows differing only in sampling
    settings, seeds, budgets or acceptance rules share a batch. `submit` may be called while
    the session runs (continuous batching across calls: a job worker feeds it shard after
    shard); `step` runs one decode round and returns this session's rows that finished in it. A
    `stream` session expects more rows after each `submit` (`gamma: auto` then sees no drain at
    the end of a submission); otherwise one submission holds every row. `admission` orders the
    queued rows of each decoder: `longest_first` by the estimate `Synthesizer.prepare` gives every
    request, `arrival` as submitted; an earlier submission (of any session) goes first.

    Sessions of one synthesizer share its decoders, so the rows of calls running at the same
    time (threads of a service, streams read in turns) share a batch: a round run by one session
    may finish another's rows, which wait in that session's `inbox` for its next `step`.
    Submitting and stepping hold the synthesizer's lock, so sessions may run on several threads.
    """

    def __init__(self, synth: Synthesizer, batch: int, stream: bool = False,
                 admission: Admission = "longest_first") -> None:
        if admission not in ADMISSIONS:
            raise ValueError(f"admission {admission!r}: choose one of {', '.join(ADMISSIONS)}")
        self.synth, self.batch, self.stream, self.admission = synth, batch, stream, admission
        self.scheduler = DecodeScheduler()
        self.gamma_choices: list[GammaChoice] = []
        self.inbox: list[tuple[Request, RowResult]] = []  # own rows another session's round finished
        self.pending = 0  # own rows submitted and not yet returned by `step`

    def submit(self, rows: Sequence[tuple[DecodingSettings, Request]], ahead: bool = False) -> None:
        """Queue `(settings, request)` pairs (requests from `Synthesizer.prepare` with those
        settings). `gamma: auto` is resolved here, per structure, from these rows. `ahead`: they
        take free slots before every row queued so far (the quality gate's regenerations, whose
        rows hold back a shard or a call that is otherwise done)."""
        with self.synth.lock:
            self.synth.drop_closed()
            self._submit(rows, ahead)

    def _submit(self, rows: Sequence[tuple[DecodingSettings, Request]], ahead: bool = False) -> None:
        by_structure: dict[tuple, list[tuple[DecodingSettings, Request]]] = {}
        submission = 0 if ahead else next(self.synth.submissions)  # numbered from 1: 0 goes first
        for settings, request in rows:
            request.submission, request.owner = submission, self
            if self.admission == "arrival":
                request.priority = 0
            by_structure.setdefault(structure(settings), []).append((settings, request))
        for group in by_structure.values():
            first = group[0][0]
            effective, choice = self.synth.resolve_gamma(first, [r for _, r in group], self.batch, self.stream)
            if choice is not None and choice not in self.gamma_choices:
                self.gamma_choices.append(choice)
            concrete = {"method": effective.method, "gamma": effective.gamma}
            for settings, request in group:
                request.rule = self.synth.rule(settings.model_copy(update=concrete))
            self.scheduler.submit(decoder_key(effective, self.batch), self.synth.decoder(effective, self.batch),
                                  [r for _, r in group])
            self.pending += len(group)

    @property
    def idle(self) -> bool:
        """Every row submitted has been returned by `step`."""
        return self.pending == 0

    def step(self) -> list[tuple[Request, RowResult]]:
        """This session's rows that another session's rounds finished since the last call, if
        any; else one decode round, and this session's rows that finished in it (others' rows
        go to their sessions).

        Raises:
            RowsDropped: this session's rows are gone from the decoders (another session's
                error reset a batch they shared).
        """
        with self.synth.lock:
            self.synth.drop_closed()
            done, self.inbox = self.inbox, []
            if not done and self.pending:
                if self.scheduler.idle:
                    lost, self.pending = self.pending, 0
                    raise RowsDropped(f"{lost} row(s) of this session were dropped from a batch shared "
                                      "with another session that failed; submit them again")
                for request, row in self.scheduler.step():
                    owner = request.owner
                    if owner is self or owner is None:
                        done.append((request, row))
                    else:
                        owner.inbox.append((request, row))
            self.pending -= len(done)
            return done

    def reset(self) -> None:
        """Drop every row of this session's decoders (after an error left a batch in doubt),
        other sessions' rows in them too (their next `step` says so)."""
        with self.synth.lock:
            self.scheduler.reset()
            self.inbox, self.pending = [], 0

    def close(self) -> None:
        """Drop this session's rows that are queued or decoding (a stream left unread); other
        sessions' rows decode on. Now if no round is running, else before the next one: a stream
        dropped by the garbage collector may be closed on a thread in the middle of a round."""
        self.inbox, self.pending = [], 0
        self.synth.closed.append(self)
        if self.synth.lock.acquire(blocking=False):
            try:
                self.synth.drop_closed()
            finally:
                self.synth.lock.release()


class _Call:
    """One `synthesize`/`stream` call: the results in input order, filled as rows finish."""

    candidates = 1  # requests per item

    def __init__(self, settings: DecodingSettings, session: DecodeSession) -> None:
        self.settings, self.session = settings, session
        self.results: list[SynthesisResult] = []
        self.ok = 0

    def first(self, index: int, item: SynthesisItem | str, settings: DecodingSettings,
              request: Request) -> list[tuple[DecodingSettings, Request]]:
        """The rows an item starts with (its request from `Synthesizer.prepare`)."""
        return [(settings, request)]

    def finished(self, request: Request, row: RowResult) -> list[tuple[int, SynthesisResult]]:
        """The results a finished row completes (index, result)."""
        res = self.results[request.key]
        res.codes, res.finish_reason, res.stats = row.codes, row.finish_reason, row.stats
        return [(request.key, res)]

    def counts(self) -> dict | None:
        """The quality gate's figures (None without it)."""
        return None

    def __iter__(self) -> Iterator[tuple[int, SynthesisResult]]:
        try:
            for i, result in enumerate(self.results):
                if result.error is not None:
                    yield i, result
            while not self.session.idle:
                for request, row in self.session.step():
                    yield from self.finished(request, row)
        except GeneratorExit:  # the caller stopped reading: its rows leave the batch
            self.session.close()
            raise
        except RowsDropped:  # another call's failure reset the batch: nothing of this one is left in it
            raise
        except BaseException:  # a round failed: the batch is in doubt
            self.session.reset()
            raise


class _GatedCall(_Call):
    """A call through a quality gate: an item's attempts are decoded (keys `(index, attempt)`)
    and scored as they finish, one that failed with attempts left is decoded again ahead of the
    rows still queued, and the item's result is the attempt the gate keeps."""

    def __init__(self, settings: DecodingSettings, session: DecodeSession, synth: Synthesizer,
                 gate: QualityGate) -> None:
        super().__init__(settings, session)
        self.synth, self.gate, self.candidates = synth, gate, gate.candidates
        self.items: dict[int, tuple] = {}  # index -> (item, its settings, its voice prompt)
        self.tried: dict[int, dict[int, tuple]] = {}  # index -> attempt -> (scores, row)
        self.expected: dict[int, int] = {}  # index -> attempts decoded or decoding
        self.verify_s = 0.0

    def request(self, index: int, number: int) -> tuple[DecodingSettings, Request]:
        item, settings, _ = self.items[index]
        seed = attempt_seed(self.results[index].seed, number)
        return settings, self.synth.request(item.text, settings, seed, (index, number), item.prompt_text,
                                            item.prompt_codes, item.voice)

    def first(self, index, item, settings, request):
        from engine.codec.prompts import prompts_of

        item = SynthesisItem(text=item) if isinstance(item, str) else item
        self.items[index] = (item, settings, prompts_of([item])[0])
        self.tried[index], self.expected[index] = {}, self.candidates
        return [self.request(index, n) for n in range(1, self.candidates + 1)]

    def score(self, index: int, number: int, seed: int, row: RowResult):
        from engine.codec.base import CodecError
        from engine.codec.export import no_codes
        from engine.metrics.gate import AttemptInput

        prompt = self.items[index][2]
        wave, why = None, no_codes(row.finish_reason)
        if row.codes:
            try:
                wave = self.gate.audio(row.codes)
            except CodecError as exc:
                why = str(exc)
        hyp = self.gate.transcribe([wave])[0] if wave is not None else None
        if isinstance(hyp, Exception):
            raise hyp
        return self.gate.score(AttemptInput(self.results[index].text, wave, row.finish_reason, number, seed,
                                            prompt, hypothesis=hyp, no_audio=why))

    def finished(self, request, row):
        index, number = request.key
        res, tried = self.results[index], self.tried[index]
        if res.error is not None:
            return []  # its check raised on another candidate: already yielded as an error
        start = time.perf_counter()
        try:
            tried[number] = (self.score(index, number, request.seed, row), row)
        except Exception as exc:  # noqa: BLE001 - the item's error result, the call goes on
            res.error = f"quality check failed: {type(exc).__name__}: {exc}"
            return [(index, res)]
        finally:
            self.verify_s += time.perf_counter() - start
        if len(tried) < self.expected[index]:
            return []  # best_of: candidates still decoding
        verdict = self.gate.verdict([tried[n][0] for n in sorted(tried)])
        if verdict is None:
            self.expected[index] += 1
            self.session.submit([self.request(index, self.expected[index])], ahead=True)
            return []
        kept = tried[verdict.kept.attempt][1]
        res.codes, res.finish_reason, res.stats = kept.codes, kept.finish_reason, kept.stats
        res.seed, res.quality = verdict.kept.seed, verdict
        return [(index, res)]

    def counts(self) -> dict:
        verdicts = [r.quality for r in self.results if r.quality is not None]
        return {"passed": sum(v.passed for v in verdicts), "rejected": sum(not v.passed for v in verdicts),
                "regenerated": sum(len(v.attempts) > 1 for v in verdicts) if self.candidates == 1 else 0,
                "decodes": sum(self.expected.values()), "verify_s": round(self.verify_s, 4)}
