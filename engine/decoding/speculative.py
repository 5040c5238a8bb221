"""The batched draft/verify loop with per-row lengths and continuous batching.

Invariants per active row (slot), with `L = seq_len`:
    tokens[slot, :L]   committed ids (prompt + generated);
    target cache       valid for positions < L - 1; the last token is fed next round;
    draft cache        valid for positions < L - 2 at least; each round feeds it the last two
                       committed tokens, which covers the case where the whole block was
                       accepted and the draft has not yet seen x_gamma (a one-token rewrite
                       of identical keys otherwise).
A round drafts `gamma` tokens, runs the target once over `[last, x_1..x_gamma]`, verifies every
row at once, and commits `accepted + 1` tokens per row. Rejected slots in the caches are
overwritten by later rounds. Rows that finish free their slot and queued requests are
prefilled into it before the next round. One host sync per round (committed counts).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.config import Warp
from engine.decoding import rng
from engine.decoding.sampling import penalised_logits, sample_one, warp_probs
from engine.decoding.verify import Block, Rule
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
    """

    key: object
    prompt_ids: list[int]
    seed: int
    max_new_tokens: int
    history_out: list[int] = field(default_factory=list)


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
        rule: the acceptance rule (None for `ar`).
        warp: sampling settings shared by draft and target.
        gamma: draft tokens per round (0 for `ar`).
        batch_size: slots decoded together.
        max_len: longest sequence (prompt + generated) a row may reach.
        eos_out: output id of the end-of-speech token.
    """

    def __init__(self, target: LlamaLM, draft: LlamaLM | None, rule: Rule | None, warp: Warp,
                 gamma: int, batch_size: int, max_len: int, eos_out: int) -> None:
        if (draft is None) != (rule is None) or (draft is None) != (gamma == 0):
            raise ValueError("a draft, a rule and gamma >= 1 go together (none of them for 'ar')")
        if draft is not None and draft.vocab_out != target.vocab_out:
            raise ValueError(
                f"draft emits {draft.vocab_out} output ids but the target {target.vocab_out}")
        self.target, self.draft, self.rule, self.warp = target, draft, rule, warp
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
        self.use_penalty = warp.repetition_penalty != 1.0
        self.seen = torch.zeros(b, self.vocab if self.use_penalty else 1, dtype=torch.bool, device=dev)
        g = max(gamma, 1)
        self.stat_reached = torch.zeros(b, g, dtype=torch.long, device=dev)
        self.stat_accepted = torch.zeros(b, g, dtype=torch.long, device=dev)
        self.stat_counts = torch.zeros(b, 4, dtype=torch.long, device=dev)  # rounds, emitted, trials, fallbacks
        self.host_len = np.zeros(b, dtype=np.int64)
        self.host_prompt = np.zeros(b, dtype=np.int64)
        self.rounds_run = 0  # decode rounds since the last `run` began
        self.slot_rounds = 0  # active rows summed over those rounds

    # ---- admission -------------------------------------------------------------------------

    def admit(self, slots: list[int], requests: list[Request]) -> None:
        """Prefill `requests` into free `slots` (positions 0..P-2; the last prompt token is fed
        by the first round). Shorter prompts are right-padded; the padding's cache entries lie
        beyond each row's position and are overwritten before they are ever read."""
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
        self.seeds[rows] = torch.tensor([r.seed for r in requests], device=self.device)
        self.seen[rows] = False
        if self.use_penalty:
            for slot, r in zip(slots, requests):
                if r.history_out:
                    self.seen[slot, torch.tensor(r.history_out, device=self.device)] = True
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

    # ---- one round -------------------------------------------------------------------------

    def propose(self, rows, slots, lens, kv_len):
        """Draft `gamma` tokens per row. Returns tokens `[b, g]`, probs `[b, g, V]` (None when
        greedy) and the penalty histories `[b, g+1, V]` the target must reuse (or None)."""
        g, warp = self.gamma, self.warp
        pos = torch.stack([lens - 2, lens - 1], dim=-1)  # [b, 2]
        logits = self.draft(self.tokens[rows[:, None], pos], pos, self.dcache, kv_len, slots=slots,
                            logits_at="last")[:, 0]  # [b, V]
        seen = self.seen[rows]
        histories, tokens, probs = [seen], [], []
        for i in range(g):
            if warp.greedy:
                x = penalised_logits(logits, seen, warp).argmax(-1)
            else:
                pi = warp_probs(logits, seen, warp)
                x = sample_one(pi, rng.uniform(self.seeds[rows], lens + i, rng.DRAFT))
                probs.append(pi)
            tokens.append(x)
            if self.use_penalty:
                seen = seen.scatter(-1, x[:, None], True)
                histories.append(seen)
            if i < g - 1:
                feed = self.out_to_token[x][:, None]
                logits = self.draft(feed, (lens + i)[:, None], self.dcache, kv_len, slots=slots,
                                    logits_at="last")[:, 0]
        stacked = torch.stack(probs, 1) if probs else None
        history = torch.stack(histories, 1) if self.use_penalty else None
        return torch.stack(tokens, 1), stacked, history

    def step(self, active: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """One round for the `active` slots. Returns host arrays (committed counts, finished)."""
        g, warp = self.gamma, self.warp
        rows = torch.tensor(active, device=self.device)
        slots = None if len(active) == self.batch else rows
        lens = self.seq_len[rows]  # [b]
        kv_len = min(round_up(int(self.host_len[active].max()) + g + 1), self.tcache.max_len)
        last = self.tokens[rows, lens - 1]
        if g:
            drafts, draft_probs, history = self.propose(rows, slots, lens, kv_len)
            feed = torch.cat([last[:, None], self.out_to_token[drafts]], 1)  # [b, g+1]
        else:
            drafts, draft_probs = None, None
            history = self.seen[rows][:, None] if self.use_penalty else None
            feed = last[:, None]
        pos = (lens - 1)[:, None] + torch.arange(g + 1, device=self.device)  # [b, g+1]
        logits = self.target(feed, pos, self.tcache, kv_len, slots=slots)  # [b, g+1, V]
        seen = history if history is not None else self.seen[rows][:, None]
        if warp.greedy:
            target_probs, argmax = None, penalised_logits(logits, seen, warp).argmax(-1)
        else:
            target_probs, argmax = warp_probs(logits, seen, warp), None
        seeds = self.seeds[rows]
        if g:
            verdict = self.rule(Block(drafts, draft_probs, target_probs, argmax, seeds, lens))
            accepted, next_token = verdict.num_accepted, verdict.next_token
            new = torch.cat([drafts, next_token[:, None]], 1)
            new.scatter_(1, accepted[:, None], next_token[:, None])  # [b, g+1]
            self.record(rows, verdict)
        else:
            next_token = argmax[:, 0] if warp.greedy else sample_one(
                target_probs[:, 0], rng.uniform(seeds, lens, rng.BONUS))
            accepted, new = torch.zeros_like(lens), next_token[:, None]
            self.stat_counts[rows, 0] += 1
            self.stat_counts[rows, 1] += 1
        return self.commit(rows, lens, new, accepted)

    def record(self, rows, verdict) -> None:
        j = torch.arange(self.gamma, device=self.device)
        n = verdict.num_accepted[:, None]
        self.stat_reached[rows] += (j <= n).long()
        self.stat_accepted[rows] += (j < n).long()
        counts = torch.stack([torch.ones_like(verdict.num_accepted), verdict.num_accepted + 1,
                              verdict.trials, verdict.fallback.long()], 1)
        self.stat_counts[rows] += counts

    def commit(self, rows, lens, new, accepted) -> tuple[np.ndarray, np.ndarray]:
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
        if self.use_penalty:
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

    def run(self, requests: Iterable[Request]) -> Iterator[tuple[Request, RowResult]]:
        """Decode every request; yields `(request, result)` as rows finish."""
        queue = deque(requests)
        for r in queue:
            if len(r.prompt_ids) >= self.max_len:
                raise ValueError(f"prompt of {len(r.prompt_ids)} tokens leaves no room under the "
                                 f"{self.max_len}-token limit")
        free = list(range(self.batch))
        owner: dict[int, Request] = {}
        self.rounds_run = self.slot_rounds = 0
        while queue or owner:
            if free and queue:
                take = min(len(free), len(queue))
                slots, free = sorted(free[:take]), free[take:]
                batch = [queue.popleft() for _ in range(take)]
                self.admit(slots, batch)
                owner.update(zip(slots, batch))
            active = sorted(owner)
            self.rounds_run += 1
            self.slot_rounds += len(active)
            counts, finished = self.step(active)
            self.host_len[active] += counts
            for slot, done in zip(active, finished):
                if done:
                    yield owner.pop(slot), self.harvest(slot)
                    free.append(slot)
