"""The batched draft/verify loop with per-row lengths, per-row settings and continuous batching.

Invariants per active row (slot), with `L = seq_len`:
    tokens[slot, :L]   committed ids (prompt + generated);
    target cache       valid for positions < L - 1; the last token is fed next round;
    draft cache        valid for positions < L - 2 at least; each round feeds it the last two
                       committed tokens, which covers the case where the whole block was
                       accepted and the draft has not yet seen x_gamma (a one-token rewrite
                       of identical keys otherwise).
A round drafts `gamma` tokens, runs the target once over `[last, x_1..x_gamma]`, verifies every
row at once, and commits `accepted + 1` tokens per row. Rejected slots in the caches are
overwritten by later rounds. Rows that finish free their slot and queued requests (highest
`priority` first) are prefilled into it before the next round. One host sync per round (committed counts).

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
from engine.decoding.sampling import RowWarp, host_flags, penalised_logits, sample_one, warp_penalised
from engine.decoding.verify import Block, Rule, judge_rows
from engine.models.llama import LlamaLM
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
            (the voice prompt's codes).
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
    """Output ids (end-of-speech stripped), why decoding stopped, and statistics."""

    tokens: list[int]
    finish_reason: str  # "eos" | "length"
    stats: RowStats


def round_up(x: int, multiple: int = 32) -> int:
    return -(-x // multiple) * multiple


class SpeculativeDecoder:
    """Decodes requests in a batch of `batch_size` slots.

    Args:
        target: the target model.
        draft: the draft model (None for `ar`).
        gamma: draft tokens per round (0 for `ar`).
        batch_size: slots decoded together.
        max_len: longest sequence (prompt + generated) a row may reach.
        eos_out: output id of the end-of-speech token.
    """

    def __init__(self, target: LlamaLM, draft: LlamaLM | None, gamma: int, batch_size: int,
                 max_len: int, eos_out: int) -> None:
        if (draft is None) != (gamma == 0):
            raise ValueError("a draft and gamma >= 1 go together (neither for 'ar')")
        if draft is not None and draft.vocab_out != target.vocab_out:
            raise ValueError(
                f"draft emits {draft.vocab_out} output ids but the target {target.vocab_out}")
        self.target, self.draft = target, draft
        self.gamma, self.batch, self.eos_out = gamma, batch_size, eos_out
        self.max_len = max_len
        self.device = target.device
        self.vocab = target.vocab_out
        self.out_to_token = target.output_token_ids
        cache_len = max_len + gamma + 2  # a round may write gamma + 1 positions past the limit
        self.tcache = target.new_cache(batch_size, cache_len)
        self.dcache = draft.new_cache(batch_size, cache_len) if draft is not None else None
        dev, b = self.device, batch_size
        self.tokens = torch.zeros(b, cache_len, dtype=torch.long, device=dev)
        self.seq_len = torch.zeros(b, dtype=torch.long, device=dev)
        self.limit = torch.zeros(b, dtype=torch.long, device=dev)
        self.seeds = torch.zeros(b, dtype=torch.long, device=dev)
        self.keys = torch.zeros(b, dtype=torch.long, device=dev)  # rng.seed_key of each row's seed
        # per-row sampling settings: device copies for the maths, host copies for decisions
        self.temperature = torch.ones(b, dtype=torch.float32, device=dev)  # 1 for greedy rows
        self.top_k = torch.zeros(b, dtype=torch.long, device=dev)
        self.top_p = torch.ones(b, dtype=torch.float32, device=dev)
        self.penalty = torch.ones(b, dtype=torch.float32, device=dev)
        self.greedy = torch.zeros(b, dtype=torch.bool, device=dev)
        self.host_warp = {k: np.zeros(b, dtype=np.float64) for k in ("temperature", "top_p", "penalty")}
        self.host_warp["top_k"] = np.zeros(b, dtype=np.int64)
        self.rules: list[Rule | None] = [None] * b
        self.seen: torch.Tensor | None = None  # [B, V] tokens in each sequence, once a row needs it
        g = max(gamma, 1)
        self.stat_reached = torch.zeros(b, g, dtype=torch.long, device=dev)
        self.stat_accepted = torch.zeros(b, g, dtype=torch.long, device=dev)
        self.stat_counts = torch.zeros(b, 4, dtype=torch.long, device=dev)  # rounds, emitted, trials, fallbacks
        self.host_len = np.zeros(b, dtype=np.int64)
        self.host_prompt = np.zeros(b, dtype=np.int64)
        self.queue = AdmissionQueue()
        self.free = list(range(b))
        self.owner: dict[int, Request] = {}
        self.rounds_run = 0  # decode rounds (since the last `run` began)
        self.slot_rounds = 0  # active rows summed over those rounds

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
        self.queue.extend(requests)

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
        lengths = [len(r.prompt_ids) for r in requests]
        if min(lengths) < 2:
            raise ValueError("a prompt needs at least two tokens")
        width = max(lengths)
        ids = torch.zeros(len(requests), width, dtype=torch.long)
        for i, r in enumerate(requests):
            ids[i, : lengths[i]] = torch.tensor(r.prompt_ids)
        ids = ids.to(self.device)
        rows = torch.tensor(slots, device=self.device)
        self.tokens[rows] = 0
        self.tokens[rows, :width] = ids
        lens = torch.tensor(lengths, device=self.device)
        self.seq_len[rows] = lens
        budget = torch.tensor([r.max_new_tokens for r in requests], device=self.device)
        self.limit[rows] = torch.clamp(lens + budget, max=self.max_len)
        seeds = torch.tensor([r.seed for r in requests], device=self.device)
        self.seeds[rows] = seeds
        self.keys[rows] = rng.seed_key(seeds)
        self.set_warps(slots, rows, requests)
        for slot, r in zip(slots, requests):
            self.rules[slot] = r.rule
        self.stat_reached[rows] = 0
        self.stat_accepted[rows] = 0
        self.stat_counts[rows] = 0
        self.host_len[slots] = lengths
        self.host_prompt[slots] = lengths
        feed = ids[:, : width - 1]
        pos = torch.arange(width - 1, device=self.device).expand(len(requests), -1)
        kv_len = min(round_up(width), self.tcache.max_len)
        self.target(feed, pos, self.tcache, kv_len, slots=rows, logits_at="none")
        if self.draft is not None:
            self.draft(feed, pos, self.dcache, kv_len, slots=rows, logits_at="none")

    def set_warps(self, slots: list[int], rows: torch.Tensor, requests: list[Request]) -> None:
        """Write the rows' sampling settings (and penalty histories) into their slots."""
        warps = [r.warp for r in requests]
        temp = np.array([w.temperature for w in warps], dtype=np.float64)
        top_k = np.array([w.top_k if w.top_k < self.vocab else 0 for w in warps], dtype=np.int64)
        top_p = np.array([w.top_p for w in warps], dtype=np.float64)
        penalty = np.array([w.repetition_penalty for w in warps], dtype=np.float64)
        for name, values in (("temperature", temp), ("top_k", top_k), ("top_p", top_p), ("penalty", penalty)):
            self.host_warp[name][slots] = values
        written = RowWarp.from_host(temp, top_k, top_p, penalty, self.device)
        self.temperature[rows], self.top_k[rows] = written.temperature, written.top_k
        self.top_p[rows], self.penalty[rows], self.greedy[rows] = written.top_p, written.penalty, written.greedy
        if written.any_penalty and self.seen is None:
            self.seen = torch.zeros(self.batch, self.vocab, dtype=torch.bool, device=self.device)
        if self.seen is not None:
            self.seen[rows] = False
            for slot, r in zip(slots, requests):
                if r.history_out and r.warp.repetition_penalty != 1.0:
                    self.seen[slot, torch.tensor(r.history_out, device=self.device)] = True

    def row_warp(self, active: list[int], rows: torch.Tensor) -> RowWarp:
        """The active rows' settings; which steps run is decided from the host copies."""
        h = {k: v[active] for k, v in self.host_warp.items()}
        return RowWarp(self.temperature[rows], self.top_k[rows], self.top_p[rows], self.penalty[rows],
                       self.greedy[rows], **host_flags(h["temperature"], h["top_k"], h["top_p"], h["penalty"]))

    # ---- one round -------------------------------------------------------------------------

    def choose(self, logits: torch.Tensor, seen, warp: RowWarp, u: torch.Tensor):
        """One draft token per row from `logits` `[b, V]`: argmax for greedy rows, an
        inverse-CDF draw from the warped probabilities for the others (returned, else None)."""
        penalised = penalised_logits(logits, seen, warp)
        if warp.all_greedy:
            return penalised.argmax(-1), None
        probs = warp_penalised(penalised, warp)
        x = sample_one(probs, u)
        if warp.any_greedy:
            x = torch.where(warp.greedy, penalised.argmax(-1), x)
        return x, probs

    def propose(self, rows, slots, lens, kv_len, warp: RowWarp):
        """Draft `gamma` tokens per row. Returns tokens `[b, g]`, probs `[b, g, V]` (None when
        every row is greedy) and the penalty histories `[b, g+1, V]` the target must reuse (or
        None)."""
        g = self.gamma
        pos = torch.stack([lens - 2, lens - 1], dim=-1)  # [b, 2]
        logits = self.draft(self.tokens[rows[:, None], pos], pos, self.dcache, kv_len, slots=slots,
                            logits_at="last")[:, 0]  # [b, V]
        seen = self.seen[rows] if warp.any_penalty else None
        histories, tokens, probs = [seen], [], []
        keys = self.keys[rows]
        for i in range(g):
            x, pi = self.choose(logits, seen, warp, rng.keyed_uniform(keys, lens + i, rng.DRAFT))
            if pi is not None:
                probs.append(pi)
            tokens.append(x)
            if warp.any_penalty:
                seen = seen.scatter(-1, x[:, None], True)
                histories.append(seen)
            if i < g - 1:
                feed = self.out_to_token[x][:, None]
                logits = self.draft(feed, (lens + i)[:, None], self.dcache, kv_len, slots=slots,
                                    logits_at="last")[:, 0]
        stacked = torch.stack(probs, 1) if probs else None
        history = torch.stack(histories, 1) if warp.any_penalty else None
        return torch.stack(tokens, 1), stacked, history

    def step(self, active: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """One round for the `active` slots. Returns host arrays (committed counts, finished)."""
        g = self.gamma
        rows = torch.tensor(active, device=self.device)
        slots = None if len(active) == self.batch else rows
        warp = self.row_warp(active, rows)
        lens = self.seq_len[rows]  # [b]
        kv_len = min(round_up(int(self.host_len[active].max()) + g + 1), self.tcache.max_len)
        last = self.tokens[rows, lens - 1]
        if g:
            drafts, draft_probs, history = self.propose(rows, slots, lens, kv_len, warp)
            feed = torch.cat([last[:, None], self.out_to_token[drafts]], 1)  # [b, g+1]
        else:
            drafts, draft_probs = None, None
            history = self.seen[rows][:, None] if warp.any_penalty else None
            feed = last[:, None]
        pos = (lens - 1)[:, None] + torch.arange(g + 1, device=self.device)  # [b, g+1]
        logits = self.target(feed, pos, self.tcache, kv_len, slots=slots)  # [b, g+1, V]
        penalised = penalised_logits(logits, history, warp)
        target_probs = None if warp.all_greedy else warp_penalised(penalised, warp)
        argmax = penalised.argmax(-1) if warp.any_greedy else None
        mixed = warp.greedy if warp.any_greedy and not warp.all_greedy else None
        seeds, keys = self.seeds[rows], self.keys[rows]
        if g:
            block = Block(drafts, draft_probs, target_probs, argmax, seeds, lens, mixed, keys)
            verdict = judge_rows([self.rules[s] for s in active], block)
            accepted, next_token = verdict.num_accepted, verdict.next_token
            new = torch.cat([drafts, next_token[:, None]], 1)
            new.scatter_(1, accepted[:, None], next_token[:, None])  # [b, g+1]
            self.record(rows, verdict)
        else:
            if warp.all_greedy:
                next_token = argmax[:, 0]
            else:
                next_token = sample_one(target_probs[:, 0], rng.keyed_uniform(keys, lens, rng.BONUS))
                if mixed is not None:
                    next_token = torch.where(mixed, argmax[:, 0], next_token)
            accepted, new = torch.zeros_like(lens), next_token[:, None]
            self.stat_counts[rows, 0] += 1
            self.stat_counts[rows, 1] += 1
        return self.commit(rows, lens, new, accepted, warp.any_penalty)

    def record(self, rows, verdict) -> None:
        j = torch.arange(self.gamma, device=self.device)
        n = verdict.num_accepted[:, None]
        self.stat_reached[rows] += (j <= n).long()
        self.stat_accepted[rows] += (j < n).long()
        counts = torch.stack([torch.ones_like(verdict.num_accepted), verdict.num_accepted + 1,
                              verdict.trials, verdict.fallback.long()], 1)
        self.stat_counts[rows] += counts

    def commit(self, rows, lens, new, accepted, track_seen: bool) -> tuple[np.ndarray, np.ndarray]:
        """Append the first `accepted + 1` tokens of `new` `[b, g+1]`, cut after an
        end-of-speech token and at the row's limit."""
        width = new.shape[1]
        j = torch.arange(width, device=self.device)
        valid = j <= accepted[:, None]
        is_eos = (new == self.eos_out) & valid
        first_eos = torch.where(is_eos.any(-1), is_eos.long().argmax(-1), width)
        count = torch.minimum(torch.minimum(accepted + 1, first_eos + 1), self.limit[rows] - lens)
        keep = j < count[:, None]
        pos = lens[:, None] + j
        old = self.tokens[rows[:, None], pos]
        self.tokens[rows[:, None], pos] = torch.where(keep, self.out_to_token[new], old)
        if track_seen:
            # Unkept slots repeat the first token (always kept: count >= 1), so the scatter
            # writes only True and duplicate indices cannot race.
            kept = torch.where(keep, new, new[:, :1])
            self.seen[rows] = self.seen[rows].scatter(1, kept, True)
        self.seq_len[rows] = lens + count
        finished = (first_eos < count) | (lens + count >= self.limit[rows])
        host = torch.stack([count, finished.long()], 1).cpu().numpy()  # the round's one sync
        return host[:, 0], host[:, 1].astype(bool)

    # ---- driver ----------------------------------------------------------------------------

    def harvest(self, slot: int) -> RowResult:
        start, end = int(self.host_prompt[slot]), int(self.host_len[slot])
        ids = self.tokens[slot, start:end].cpu()
        eos = bool(end > start and int(ids[-1]) == int(self.out_to_token[self.eos_out]))
        if eos:
            ids = ids[:-1]
        # speech tokens are one contiguous run (asserted at load): output id = id - first
        tokens = (ids - int(self.out_to_token[0])).tolist()
        counts = self.stat_counts[slot].tolist()
        stats = RowStats(
            rounds=counts[0], emitted=counts[1], thinning_trials=counts[2], fallbacks=counts[3],
            reached=self.stat_reached[slot].tolist() if self.gamma else [],
            accepted=self.stat_accepted[slot].tolist() if self.gamma else [],
            prompt_tokens=start, generated_tokens=end - start,
        )
        return RowResult(tokens=tokens, finish_reason="eos" if eos else "length", stats=stats)

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
                self.rules[slot] = None
                self.free.append(slot)
        return done

    def drop(self, which: Callable[[Request], bool]) -> int:
        """Drop the queued and decoding rows `which` picks (a caller that no longer wants them);
        the other rows decode on as before. Returns how many."""
        gone = self.queue.discard(which)
        for slot in [s for s, r in self.owner.items() if which(r)]:
            del self.owner[slot]
            self.rules[slot] = None
            self.free.append(slot)
        return gone

    def reset(self) -> None:
        """Drop every queued and decoding row (after an error left the batch in doubt)."""
        self.queue.clear()
        self.owner.clear()
        self.free = list(range(self.batch))
        self.rules = [None] * self.batch

    def run(self, requests: Iterable[Request]) -> Iterator[tuple[Request, RowResult]]:
        """Decode every request; yields `(request, result)` as rows finish."""
        self.submit(requests)
        self.rounds_run = self.slot_rounds = 0
        while not self.idle:
            yield from self.advance()
