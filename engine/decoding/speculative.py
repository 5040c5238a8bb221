"""The batched draft/verify loop with per-row lengths, per-row settings and continuous batching.

Invariants per active row (slot), with `L = seq_len`:
    tokens[slot, :L]   committed ids (prompt + generated);
    target cache       valid for positions < L - 1; the last token is fed next round;
    draft cache        valid for positions < L - 2 at least; each round feeds it the last two
                       committed tokens, which covers the case where the whole block was
                       accepted and the draft has not yet seen x_gamma (a one-token rewrite
                       of identical keys otherwise).
    stream heads       (instead of a draft) `stream_state` holds the heads' states made from the
                       target's hidden state at position L - 2 and the token at L - 1: the
                       next round's proposals come from them (`engine.models.streams`).
A round (`decoding/round.py`) runs over every slot with fixed shapes, eagerly or as a captured
graph (`decoding/graphs.py`), and returns one small tensor per round: the only read back to the
host (committed counts, finished rows). Rejected slots in the caches are overwritten by later
rounds. Rows that finish free their slot and queued requests (highest `priority` first) are
prefilled into it before the next round.

Each row brings its own sampling settings (temperature, top-k, top-p, repetition penalty;
greedy and sampled rows mix), seed, length budget and acceptance rule (rules of the same gamma
mix); all of them are per-row data, so a row's output never depends on the rows beside it.
The loop can be fed while it runs: `submit` queues requests, `advance` admits queued requests
into free slots, runs one round and returns the rows that finished; `run` does both until done.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.config import Warp, decoding_default
from engine.decoding import rng
from engine.decoding.admission import AdmissionQueue
from engine.decoding.graphs import RoundRunner
from engine.decoding.round import OUT_COUNT, OUT_FINISHED, OUT_FIX, RoundPlan, RoundState, draw_columns
from engine.decoding.sampling import columns_of, free_columns, write_rows
from engine.decoding.verify import Rule
from engine.families.base import OutputSpace
from engine.knobs import SamplingSteps
from engine.models.llama import LlamaLM
from engine.models.streams import Heads
from engine.records import RowStats


@dataclass
class Request:
    """One utterance to decode.

    Attributes:
        key: caller's handle, returned with the result.
        prompt_ids: vocabulary ids of the full prompt (at least two).
        seed: per-item seed; the item's randomness depends on nothing else.
        max_new_tokens: generation budget (the context limit may cut it shorter).
        history_out: output ids already "in the sequence" for the repetition penalty
            (the voice prompt's codes, `SpeechLayout.out_ids`).
        warp: the row's sampling settings (temperature 0: greedy).
        rule: the row's acceptance rule (None for a decoder without a draft, `ar`).
        priority, submission: admission order: a free slot takes a queued request of the
            earliest submission, of those the highest priority, the earliest queued among
            equals (see `decoding/admission.py`).
        owner: who submitted it, for callers that share a decoder (`api.DecodeSession`).
    """

    key: object
    prompt_ids: list[int]
    seed: int
    max_new_tokens: int
    history_out: list[int] = field(default_factory=list)
    warp: Warp = field(default_factory=lambda: Warp(decoding_default("temperature")))
    rule: Rule | None = None
    priority: int = 0
    submission: int = 0
    owner: object = None


@dataclass
class RowResult:
    """Codec codes (end-of-speech stripped; in a framed output space, whole frames only), why
    decoding stopped, and statistics."""

    codes: list[int]
    finish_reason: str  # "eos" | "length"
    stats: RowStats


def round_up(x: int, multiple: int = 32) -> int:
    return -(-x // multiple) * multiple


def kv_bucket(need: int, cache_len: int) -> int:
    """The keys a round reads: the smallest bucket of at least `need` positions (64, 128,
    256, 512, then every 256), at most the cache. Keys past a row's position are masked, so
    reading more changes nothing; a few buckets keep a compiled decoder to a few graphs."""
    bucket = 64
    while bucket < need:
        bucket = bucket * 2 if bucket < 512 else bucket + 256
    return min(bucket, cache_len)


class SpeculativeDecoder:
    """Decodes requests in a batch of `batch_size` slots.

    Args:
        target: the target model.
        draft: what drafts: a draft model, stream heads on the target (`engine.models.streams`;
            gamma at most their count), or None for `ar`.
        gamma: draft tokens per round (0 for `ar`).
        batch_size: slots decoded together.
        max_len: longest sequence (prompt + generated) a row may reach.
        space: the output space (`SpeechLayout.output_space`): the end-of-speech id and the
            frames whose positions restrict the ids a row may sample (`decoding/round.py`).
        runner: runs rounds eagerly or as compiled graphs (default: as the target's
            `compile_mode` says; see `decoding/graphs.py`).
    """

    def __init__(self, target: LlamaLM, draft: LlamaLM | Heads | None, gamma: int, batch_size: int,
                 max_len: int, space: OutputSpace, runner: RoundRunner | None = None) -> None:
        if (draft is None) != (gamma == 0):
            raise ValueError("a draft and gamma >= 1 go together (neither for 'ar')")
        streams = draft if isinstance(draft, Heads) else None
        if streams is not None:
            streams.fits(target)
            if gamma > streams.heads:
                raise ValueError(f"gamma {gamma} needs {gamma} stream heads; these have {streams.heads}")
            draft = None
        elif draft is not None and draft.vocab_out != target.vocab_out:
            raise ValueError(
                f"draft emits {draft.vocab_out} output ids but the target {target.vocab_out}")
        self.target, self.draft, self.streams = target, draft, streams
        self.gamma, self.batch, self.space, self.eos_out = gamma, batch_size, space, space.eos
        self.max_len = max_len
        self.device = target.device
        self.vocab = target.vocab_out
        self.cache_len = max_len + gamma + 2  # a round may write gamma + 1 positions past the limit
        dev, b, g = self.device, batch_size, max(gamma, 1)
        zeros = lambda *shape, dtype=torch.long: torch.zeros(*shape, dtype=dtype, device=dev)  # noqa: E731
        self.state = RoundState(
            target=target, draft=draft, tcache=target.new_cache(b, self.cache_len),
            dcache=draft.new_cache(b, self.cache_len) if draft is not None else None,
            out_to_token=target.output_token_ids, eos_out=space.eos,
            tokens=zeros(b, self.cache_len), seq_len=torch.full((b,), 2, dtype=torch.long, device=dev),
            limit=torch.full((b,), 2, dtype=torch.long, device=dev), active=zeros(b, dtype=torch.bool),
            keys=zeros(b), sampling=free_columns(b, dev), rule_index=zeros(b),
            stat_reached=zeros(b, g), stat_accepted=zeros(b, g), stat_counts=zeros(b, 4),
            same_rope=draft is not None and draft.same_rope(target),
            ar_draws=torch.zeros(b, self.cache_len, dtype=torch.float64, device=dev) if gamma == 0 else None,
            start=zeros(b), phases=space.phase_table(dev) if space.framed else None,
            frame_bias=space.bias_table(dev, target.dtype) if space.framed else None, cycle=space.cycle,
            streams=streams,
            stream_state=None if streams is None else torch.zeros(
                b, streams.heads, target.shape.hidden_size, dtype=streams.dtype, device=dev),
            stream_source=None if streams is None or not streams.token_input else torch.zeros(
                b, target.shape.hidden_size, dtype=target.dtype, device=dev),  # the fallback's redo reads it
            stream_cache=None if streams is None else streams.new_cache(target, b, self.cache_len))
        self.runner = runner or RoundRunner.for_model(target)
        # its first n entries' length is a round's key count (a compiled round's dynamic size)
        self.keys_read = torch.empty(self.cache_len, dtype=torch.int8, device=dev)
        self.rules: list[Rule | None] = [None] * b
        # what decides a round's plan, kept on the host (no device read needed to choose it): the
        # rules and sampling steps of the rows submitted since the decoder was last idle
        self.plan_rules: list[Rule] = []  # (rule_index points into it)
        self.steps = SamplingSteps()
        self.host_len = np.zeros(b, dtype=np.int64)
        self.host_prompt = np.zeros(b, dtype=np.int64)
        self.queue = AdmissionQueue()
        self.free = list(range(b))
        self.owner: dict[int, Request] = {}
        self.rounds_run = 0  # decode rounds (since the last `run` began)
        self.slot_rounds = 0  # active rows summed over those rounds
        self.fallbacks_fixed = 0  # rows whose PCG token was drawn by the exact fallback after a round

    @property
    def tokens(self) -> torch.Tensor:
        return self.state.tokens

    @property
    def seq_len(self) -> torch.Tensor:
        return self.state.seq_len

    # ---- feeding -----------------------------------------------------------------------------

    def submit(self, requests: Iterable[Request]) -> None:
        """Queue requests; they enter free slots at the next `advance`.

        Raises:
            ValueError: a prompt leaves no room under the length limit, or a request's rule
                does not fit this decoder (a rule per request with a draft, none without).
        """
        requests = list(requests)
        for r in requests:
            if len(r.prompt_ids) >= self.max_len:
                raise ValueError(f"prompt of {len(r.prompt_ids)} tokens leaves no room under the "
                                 f"{self.max_len}-token limit")
            if (r.rule is None) != (self.gamma == 0):
                raise ValueError("a speculative decoder needs an acceptance rule per request, "
                                 "an 'ar' decoder none")
        self.note(requests)
        self.queue.extend(requests)

    def note(self, requests: list[Request]) -> None:
        """Add what `requests` need to the decoder's plan (`plan`): their rules and sampling
        steps stay in it until the decoder is idle again, so the rows of a submission share one
        plan (one graph) from the first round."""
        for r in requests:
            self.steps = self.steps.merged(r.warp, self.vocab)
            if r.rule is not None and r.rule not in self.plan_rules:
                self.plan_rules.append(r.rule)
        if self.steps.penalty and self.state.seen is None:  # each row's output ids, from its admission
            self.state.seen = torch.zeros(self.batch, self.vocab, dtype=torch.bool, device=self.device)

    @property
    def idle(self) -> bool:
        """Nothing queued and no row decoding."""
        return not self.queue and not self.owner

    @property
    def load(self) -> int:
        """Rows decoding plus rows queued."""
        return len(self.owner) + len(self.queue)

    # ---- admission -------------------------------------------------------------------------

    def admit(self, slots: list[int], requests: list[Request]) -> None:
        """Prefill `requests` into free `slots` (positions 0..P-2; the last prompt token is fed
        by the first round), with their settings. Shorter prompts are right-padded; the
        padding's cache entries lie beyond each row's position and are overwritten before they
        are ever read."""
        st = self.state
        lengths = [len(r.prompt_ids) for r in requests]
        if min(lengths) < 2:
            raise ValueError("a prompt needs at least two tokens")
        width = max(lengths)
        ids = torch.zeros(len(requests), width, dtype=torch.long)
        for i, r in enumerate(requests):
            ids[i, : lengths[i]] = torch.tensor(r.prompt_ids)
        rows = torch.tensor(slots)
        host = {"budget": [r.max_new_tokens for r in requests], "seed": [r.seed for r in requests]}
        ids, rows, lens, budget, seeds = (x.to(self.device) for x in (
            ids, rows, torch.tensor(lengths), torch.tensor(host["budget"]), torch.tensor(host["seed"])))
        st.tokens[rows] = 0
        st.tokens[rows, :width] = ids
        st.seq_len[rows] = lens
        st.start[rows] = lens
        st.limit[rows] = torch.clamp(lens + budget, max=self.max_len)
        st.keys[rows] = rng.seed_key(seeds)
        if st.ar_draws is not None:  # the uniform of every position the rows may draw at
            reach = min(max(n + budget for n, budget in zip(lengths, host["budget"])), self.max_len)
            at = torch.arange(reach, device=self.device)
            st.ar_draws[rows, :reach] = rng.keyed_uniform(st.keys[rows][:, None], at, rng.BONUS)
        self.set_warps(slots, rows, requests)
        for slot, r in zip(slots, requests):
            self.rules[slot] = r.rule
        st.rule_index[rows] = torch.tensor([self.plan_rules.index(r.rule) if r.rule is not None else 0
                                            for r in requests], device=self.device)
        st.active[rows] = True
        st.stat_reached[rows] = 0
        st.stat_accepted[rows] = 0
        st.stat_counts[rows] = 0
        self.host_len[slots] = lengths
        self.host_prompt[slots] = lengths
        feed = ids[:, : width - 1]
        pos = torch.arange(width - 1, device=self.device).expand(len(requests), -1)
        kv_len = min(round_up(width), self.cache_len)
        if self.streams is None:
            self.target(feed, pos, st.tcache, kv_len, slots=rows, logits_at="none")
        else:  # the heads' first states: the hidden state of the last prompt token but one, and the last
            normed = self.target(feed, pos, st.tcache, kv_len, slots=rows, logits_at="normed")
            at = torch.arange(len(requests), device=self.device), lens - 2
            if self.streams.attends:  # their caches take every prompt position
                with torch.inference_mode():
                    states = self.streams.states(self.target, normed, pos, st.stream_cache, kv_len, slots=rows)
                    st.stream_state[rows] = states[at]
            else:
                self.follow(rows, normed[at], ids.gather(1, (lens - 1)[:, None])[:, 0])
        if self.draft is not None:
            self.draft(feed, pos, st.dcache, kv_len, slots=rows, logits_at="none")

    def follow(self, rows: torch.Tensor, source: torch.Tensor, tokens: torch.Tensor) -> None:
        """Set the stream heads' states of `rows` from the target's normed hidden states `source`
        `[n, H]` and the vocabulary ids `tokens` `[n]` that follow them."""
        st = self.state
        with torch.inference_mode():
            st.stream_source[rows] = source
            st.stream_state[rows] = self.streams.follow(self.target, source, tokens)

    def set_warps(self, slots: list[int], rows: torch.Tensor, requests: list[Request]) -> None:
        """Write the rows' sampling settings (and penalty histories) into their slots."""
        st = self.state
        write_rows(st.sampling, rows, columns_of([r.warp for r in requests], self.device, self.vocab))
        if st.seen is not None:
            st.seen[rows] = False
            for slot, r in zip(slots, requests):
                if r.history_out and r.warp.repetition_penalty != 1.0:
                    st.seen[slot, torch.tensor(r.history_out, device=self.device)] = True

    # ---- one round -------------------------------------------------------------------------

    def plan(self, active: list[int]) -> RoundPlan:
        """The round's plan, from host values only: the rules and sampling steps of every row
        submitted since the decoder was last idle (`note`), so a decoder meets few plans (few
        graphs; a row whose knob is off is left exactly as alone either way), and the key bucket
        of the `active` rows' lengths."""
        need = int(self.host_len[active].max()) + self.gamma + 1
        return RoundPlan(gamma=self.gamma, rules=tuple(self.plan_rules), steps=self.steps,
                         kv_len=kv_bucket(need, self.cache_len))

    def prepare(self, plan: RoundPlan) -> None:
        """Buffers a plan needs beyond the decoder's own: the layout of the round's draws, and
        the distributions kept for PCG's exact fallback."""
        st = self.state
        layout = plan.draw_purposes()
        if layout != getattr(self, "_layout", None):
            st.draw_offsets, st.draw_words = draw_columns(plan, self.device)
            self._layout = layout
        if plan.keeps_fallbacks and st.fallback_target is None:
            dtype = torch.float64 if self.target.dtype == torch.float64 else torch.float32  # the probabilities'
            st.fallback_target = torch.zeros(self.batch, self.vocab, dtype=dtype, device=self.device)
            st.fallback_draft = torch.zeros(self.batch, self.vocab, dtype=dtype, device=self.device)

    def step(self, active: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """One round (every slot computed; `active` are the occupied ones). Returns host arrays
        for the active slots: (committed counts, finished)."""
        plan = self.plan(active)
        if plan != getattr(self, "_plan", None):
            self.prepare(plan)
            self._plan = plan
        out = self.runner.run(self, plan)  # [B, 3] on the host: the round's one read-back
        due = np.flatnonzero(out[:, OUT_FIX])
        if len(due):
            self.fix_fallbacks(plan, due, out)
        return out[active, OUT_COUNT], out[active, OUT_FINISHED].astype(bool)

    def fix_fallbacks(self, plan: RoundPlan, due: np.ndarray, out: np.ndarray) -> None:
        """Draw the recovered token of PCG rows whose thinning found none, with the exact dense
        residual (`PCGRule.exact_residual`), append it and update `out` in place. Rare, eager,
        after the round."""
        st = self.state
        self.fallbacks_fixed += len(due)
        for rule in {self.rules[s] for s in due}:
            slots = [int(s) for s in due if self.rules[s] is rule]
            rows = torch.tensor(slots, device=self.device)
            lens = st.seq_len[rows]
            token, _ = rule.exact_residual(st.fallback_target[rows], st.fallback_draft[rows], st.keys[rows], lens)
            st.tokens[rows, lens] = st.out_to_token[token]
            if self.streams is not None and self.streams.token_input:  # their heads read the token drawn now
                self.follow(rows, st.stream_source[rows], st.out_to_token[token])
            if st.seen is not None:
                st.seen[rows, token] = True
            st.seq_len[rows] = lens + 1
            finished = ((token == self.eos_out) | (lens + 1 >= st.limit[rows])).cpu().numpy()
            out[slots, OUT_COUNT] += 1
            out[slots, OUT_FINISHED] = finished

    # ---- driver ----------------------------------------------------------------------------

    def harvest(self, slot: int) -> RowResult:
        st = self.state
        start, end = int(self.host_prompt[slot]), int(self.host_len[slot])
        ids = st.tokens[slot, start:end].cpu()
        eos = bool(end > start and int(ids[-1]) == int(st.out_to_token[self.eos_out]))
        if eos:
            ids = ids[:-1]
        else:  # a row cut at its limit keeps whole frames
            ids = ids[: self.space.whole_frames(len(ids))]
        # code tokens are one contiguous run (asserted at load): output id = id - first
        out = self.space.codes(ids - int(st.out_to_token[0]))
        counts = st.stat_counts[slot].tolist()
        stats = RowStats(
            rounds=counts[0], emitted=counts[1], thinning_trials=counts[2], fallbacks=counts[3],
            reached=st.stat_reached[slot].tolist() if self.gamma else [],
            accepted=st.stat_accepted[slot].tolist() if self.gamma else [],
            prompt_tokens=start, generated_tokens=end - start,
        )
        return RowResult(codes=out.tolist(), finish_reason="eos" if eos else "length", stats=stats)

    def release(self, slot: int) -> None:
        """Free a slot: its row leaves the batch (its state stays until a row is admitted)."""
        self.rules[slot] = None
        self.state.active[slot] = False
        self.free.append(slot)

    def advance(self) -> list[tuple[Request, RowResult]]:
        """Admit queued requests into free slots, run one round, and return the rows that
        finished in it as `(request, result)`."""
        if not self.owner:
            self.free = list(range(self.batch))  # an idle decoder fills slots from 0 again
        if self.free and self.queue:
            take = min(len(self.free), len(self.queue))
            slots, self.free = sorted(self.free[:take]), self.free[take:]
            batch = self.queue.pop(take)
            self.admit(slots, batch)
            self.owner.update(zip(slots, batch))
        if not self.owner:
            return []
        active = sorted(self.owner)
        self.rounds_run += 1
        self.slot_rounds += len(active)
        counts, finished = self.step(active)
        self.host_len[active] += counts
        done = []
        for slot, end in zip(active, finished):
            if end:
                done.append((self.owner.pop(slot), self.harvest(slot)))
                self.release(slot)
        self.forget_plan()
        return done

    def forget_plan(self) -> None:
        """An idle decoder starts its next plan afresh (from the rows submitted next)."""
        if self.idle:
            self.plan_rules, self.steps = [], SamplingSteps()

    def drop(self, which: Callable[[Request], bool]) -> int:
        """Drop the queued and decoding rows `which` picks (a caller that no longer wants them);
        the other rows decode on as before. Returns how many."""
        gone = self.queue.discard(which)
        for slot in [s for s, r in self.owner.items() if which(r)]:
            del self.owner[slot]
            self.release(slot)
        self.forget_plan()
        return gone

    def reset(self) -> None:
        """Drop every queued and decoding row (after an error left the batch in doubt)."""
        self.queue.clear()
        self.owner.clear()
        self.free = list(range(self.batch))
        self.rules = [None] * self.batch
        self.state.active.fill_(False)
        self.forget_plan()

    def run(self, requests: Iterable[Request]) -> Iterator[tuple[Request, RowResult]]:
        """Decode every request; yields `(request, result)` as rows finish."""
        self.submit(requests)
        self.rounds_run = self.slot_rounds = 0
        while not self.idle:
            yield from self.advance()
