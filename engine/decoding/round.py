"""One decode round over every slot of a batch, with fixed shapes: what a captured graph runs.

A round drafts `gamma` tokens for every slot, runs the target once over `[last, x_1..x_gamma]`,
judges every row by its own rule and commits `accepted + 1` tokens per row, cut after an
end-of-speech token and at the row's limit. Every slot is computed, free ones too (their
commits are masked out and their cache writes land in their own rows, overwritten when a row is
admitted there), keys are read up to a fixed length (`RoundPlan.kv_len`, a bucket), per-row
settings and rules are tensors, and nothing in it reads a value back to the host: a round is one
function of tensors whose shapes depend only on its `RoundPlan`, so `torch.compile` can take it
whole (`decoding/graphs.py`) and the eager path runs the very same code.

The host values a round depends on are fixed before it starts (`RoundPlan`): the draft length,
the rules present, which sampling steps any row needs, and the key bucket. A row whose knob is
off is left exactly as it would be alone, so a row's tokens never depend on the plan its
neighbours chose (nor on the rows beside it).

A framed output space (`OutputSpace.framed`: Orpheus's seven code ranges a frame) is a mask too:
each row's logits at every position it predicts keep only the ids of that position's range (and
end-of-speech where a frame ends), from the row's generated count, before any warp, in the
draft and the target alike; `RoundState.phases` holds each id's frame position, `frame_bias` the
same as a table to add to a position's logits (-inf where it may not sample an id, else 0).

PCG's thinning runs a fixed number of trials; the rows whose trials all failed (`OUT_FIX`)
keep their accepted tokens, and the caller draws their recovered token with the exact dense
residual after the round (`SpeculativeDecoder.fix_fallbacks`), from the distributions the round
left in `RoundState.fallback_target` / `fallback_draft`: the law stays exact, the graph static.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.decoding import rng
from engine.decoding.sampling import COLUMNS, RowWarp, WarpColumns, penalised_logits, sample_from, warp_penalised
from engine.decoding.verify import Block, PCGRule, Rule, judge_mixed
from engine.knobs import SamplingSteps
from engine.models.kv_cache import KVCache
from engine.models.llama import LlamaLM, StepTables
from engine.models.streams import Heads

OUT_COUNT, OUT_FINISHED, OUT_FIX = 0, 1, 2  # columns of a round's result `[B, 3]`


@dataclass(frozen=True)
class RoundPlan:
    """What a round's code is specialised on: host values known before the round starts.

    Attributes:
        gamma: draft tokens per round (0: `ar`).
        rules: the acceptance rules rows may use; a row's `rule_index` points into it.
        steps: the sampling steps some row needs (`SamplingSteps`).
        kv_len: keys read per row (a bucket; above every position the round writes).
    """

    gamma: int
    rules: tuple[Rule, ...]
    steps: SamplingSteps
    kv_len: int

    @property
    def trials(self) -> int:
        """Lanes of the recovered-token draws (PCG's thinning trials, else 1)."""
        return max([r.max_trials for r in self.rules if isinstance(r, PCGRule)], default=1)

    @property
    def keeps_fallbacks(self) -> bool:
        return self.steps.sampled and any(isinstance(r, PCGRule) for r in self.rules)

    def warp(self, state: RoundState) -> RowWarp:
        return RowWarp.over(state.sampling, self.steps)

    def draw_purposes(self) -> list[tuple[int, int, int]]:
        """(purpose, slots, lanes) of the uniforms a round draws ahead, at positions
        `seq_len + slot`; `draw_columns` lays them out."""
        g = self.gamma
        if not self.steps.sampled:
            return []
        if g == 0:
            return [(rng.BONUS, 1, 1)]
        purposes = [(rng.DRAFT, g, 1), (rng.ACCEPT, g, 1), (rng.BONUS, g + 1, 1), (rng.RECOVER, g, self.trials)]
        if any(isinstance(r, PCGRule) for r in self.rules):
            purposes += [(rng.LABEL, g, 1), (rng.RECOVER_LABEL, g, self.trials),
                         (rng.RECOVER_ACCEPT, g, self.trials)]
        return purposes


def draw_columns(plan: RoundPlan, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Position offsets and stream words `[K]` of every uniform a round draws (made once per
    plan by the caller)."""
    offsets, words = [], []
    for purpose, slots, lanes in plan.draw_purposes():
        for slot in range(slots):
            for lane in range(lanes):
                offsets.append(slot)
                words.append(rng.stream_word(purpose, lane))
    return (torch.tensor(offsets, dtype=torch.long, device=device),
            torch.tensor(words, dtype=torch.long, device=device))


@dataclass
class RoundState:
    """A decoder's tensors, one row per slot (`B` slots, `C` positions); a round reads and
    writes them in place.

    Attributes:
        tokens: `[B, C]` committed ids per slot (prompt + generated).
        seq_len: `[B]` committed length; `limit`: `[B]` the length a row stops at.
        active: `[B]` bool, the slot holds a row.
        keys: `[B]` each row's `rng.seed_key`.
        sampling: `[B]` sampling settings, a column per knob and `greedy` (`WarpColumns`).
        rule_index: `[B]` the row's rule in `RoundPlan.rules`.
        seen: `[B, V]` bool, output ids in each sequence (repetition penalty), or None.
        stat_reached, stat_accepted: `[B, max(gamma, 1)]` per draft position.
        stat_counts: `[B, 4]` rounds, emitted, thinning trials, fallbacks.
        fallback_target, fallback_draft: `[B, V]` the distributions at each row's rejected
            position (rounds with PCG rows), for the exact fallback after the round.
        draw_offsets, draw_words: `[K]` the round's uniforms (`draw_columns` of its plan).
        ar_draws: `[B, C]` float64, an `ar` decoder's uniforms at every position of each row
            (`rng.BONUS`), made when the row is admitted: an `ar` round reads one per row
            instead of evaluating the hash (the same numbers).
        same_rope: draft and target rotate positions alike (`LlamaLM.same_rope`): a round's
            rope tables serve both.
        start: `[B]` each row's prompt length (where its first generated code starts a frame).
        phases: `[V]` the frame position at which each output id may be sampled
            (`OutputSpace.phase_table`), or None: every id at every step.
        frame_bias: `[cycle, V]` in the models' dtype, -inf at the output ids each frame position
            may not sample, else 0 (`OutputSpace.bias_table`; None with `phases`).
        cycle: positions per frame.
        streams: the stream heads that draft instead of a draft model (`engine.models.streams`).
        stream_state: `[B, heads, H]` each row's heads' states, the next round's proposals'
            source (`follow_streams`); stream_source: `[B, H]` the target's normed hidden state
            they came from (the fallback redoes a row's states from it; heads with a token input only).
        stream_cache: the heads' own KV cache, for heads that attend (`Heads.attends`).
    """

    target: LlamaLM
    draft: LlamaLM | None  # a draft model, or None (stream heads or `ar`)
    tcache: KVCache
    dcache: KVCache | None
    out_to_token: torch.Tensor
    eos_out: int
    tokens: torch.Tensor
    seq_len: torch.Tensor
    limit: torch.Tensor
    active: torch.Tensor
    keys: torch.Tensor
    sampling: WarpColumns
    rule_index: torch.Tensor
    stat_reached: torch.Tensor
    stat_accepted: torch.Tensor
    stat_counts: torch.Tensor
    seen: torch.Tensor | None = None
    fallback_target: torch.Tensor | None = None
    fallback_draft: torch.Tensor | None = None
    draw_offsets: torch.Tensor | None = None
    draw_words: torch.Tensor | None = None
    ar_draws: torch.Tensor | None = None
    same_rope: bool = False
    start: torch.Tensor | None = None
    phases: torch.Tensor | None = None
    frame_bias: torch.Tensor | None = None
    cycle: int = 1
    streams: Heads | None = None
    stream_state: torch.Tensor | None = None
    stream_source: torch.Tensor | None = None
    stream_cache: KVCache | None = None

    def tensors(self) -> list[torch.Tensor]:
        """Every state tensor a round reads or writes (CUDA graphs replay into their addresses)."""
        names = ("tokens", "seq_len", "limit", "active", "keys", "rule_index", "stat_reached", "stat_accepted",
                 "stat_counts", "seen", "fallback_target", "fallback_draft", "draw_offsets", "draw_words", "ar_draws",
                 "out_to_token", "start", "phases", "frame_bias", "stream_state", "stream_source")
        sampling = [getattr(self.sampling, n) for n in COLUMNS]
        caches = [t for c in (self.tcache, self.dcache, self.stream_cache) if c is not None for t in c.tensors()]
        return [t for t in [getattr(self, n) for n in names] + sampling + caches if t is not None]


def draws(state: RoundState, plan: RoundPlan, lens: torch.Tensor) -> dict[int, torch.Tensor]:
    """Every uniform of the round in one hash evaluation (an `ar` round's read from the table
    made at admission): purpose -> `[B, slots, lanes]`."""
    if not plan.draw_purposes():
        return {}
    if plan.gamma == 0:  # `ar`: one draw per row, made at admission (`RoundState.ar_draws`)
        return {rng.BONUS: state.ar_draws.gather(1, lens[:, None])[:, :, None]}
    u = rng.draw(state.keys[:, None], lens[:, None] + state.draw_offsets, state.draw_words)  # [B, K]
    purposes = plan.draw_purposes()
    parts = u.split([slots * lanes for _, slots, lanes in purposes], dim=1)
    return {purpose: part.view(-1, slots, lanes) for (purpose, slots, lanes), part in zip(purposes, parts)}


def in_frame(logits: torch.Tensor, state: RoundState, first: torch.Tensor) -> torch.Tensor:
    """`logits` `[B, T, V]` of the positions `first + 0..T-1` (`first` `[B]`) with every id their
    frame positions do not allow set to -inf, in place (a model's fresh output; as they are
    without frames; the others are left exactly as they are). Eagerly, each position's row of
    the bias table added (a CPU fills a float mask faster than a boolean one); compiled, each id's
    position compared with the row's, which inductor fuses into the fill (a gather of table rows
    it does not fuse). The same logits either way."""
    if state.phases is None:
        return logits
    k = (first - state.start)[:, None] + torch.arange(logits.shape[1], device=first.device)  # [B, T] generated index
    phase = k % state.cycle
    if torch.compiler.is_compiling():
        return logits.masked_fill_(state.phases != phase[..., None], float("-inf"))  # [B, T, V]
    return logits.add_(state.frame_bias.index_select(0, phase.view(-1)).view(logits.shape))


def choose(logits: torch.Tensor, seen: torch.Tensor | None, warp: RowWarp, u: torch.Tensor | None):
    """One token per row from `logits` `[B, V]`: the argmax for greedy rows, an inverse-CDF draw
    from the warped probabilities for the others (`u` `[B, 1]`). Returns (tokens `[B]`, probs `[B, V]` or None
    when no row samples)."""
    penalised = penalised_logits(logits, seen, warp)  # [B, V]
    if not warp.steps.sampled:
        return penalised.argmax(-1), None
    probs = warp_penalised(penalised, warp)
    x = sample_from(probs, u)[:, 0]
    if warp.steps.greedy:
        x = torch.where(warp.greedy, penalised.argmax(-1), x)
    return x, probs


def sample_proposals(state: RoundState, plan: RoundPlan, warp: RowWarp, lens: torch.Tensor, u: dict,
                     logits: torch.Tensor, advance):
    """Sample `gamma` proposals per row at positions `lens + 0..g-1`: the first from `logits`
    `[B, 1, V]`, each next one from `advance(i, x)`, the logits after proposal `i` was `x` `[B]`.

    Returns:
        tokens `[B, g]`, probs `[B, g, V]` (None when no row samples), and the penalty histories
        `[B, g+1, V]` the target must reuse (None without a penalty).
    """
    g = plan.gamma
    seen = state.seen if plan.steps.penalty else None
    histories, tokens, probs = [seen], [], []
    drafted = u[rng.DRAFT] if plan.steps.sampled else None  # [B, g, 1]
    for i in range(g):
        x, pi = choose(in_frame(logits, state, lens + i)[:, 0], seen, warp, None if drafted is None else drafted[:, i])
        tokens.append(x)
        if pi is not None:
            probs.append(pi)
        if plan.steps.penalty:
            seen = seen.scatter(-1, x[:, None], True)
            histories.append(seen)
        if i < g - 1:
            logits = advance(i, x)
    stacked = torch.stack(probs, 1) if probs else None
    history = torch.stack(histories, 1) if plan.steps.penalty else None
    return torch.stack(tokens, 1), stacked, history


def propose(state: RoundState, plan: RoundPlan, warp: RowWarp, span: torch.Tensor, tables: StepTables,
            u: dict, kv_len):
    """Draft `gamma` tokens per row with the draft model. The draft is fed the last two committed
    tokens first (covering a fully accepted block whose last draft token it never saw). `span`
    `[B, g+2]`: the positions the round feeds (from the row's last but one); `tables`: the draft's
    `step_tables` of them. Returns what `sample_proposals` does."""
    pos = span[:, :2]  # [B, 2]
    logits = state.draft.step(state.tokens.gather(1, pos), pos, state.dcache, kv_len=kv_len, logits_at="last",
                              widen=False, tables=tables.columns(0, 2))  # [B, 1, V]

    def advance(i: int, x: torch.Tensor) -> torch.Tensor:
        feed = state.out_to_token[x][:, None]  # [B, 1]
        return state.draft.step(feed, span[:, i + 2:i + 3], state.dcache, kv_len=kv_len, logits_at="last",
                                widen=False, tables=tables.columns(i + 2, i + 3))
    return sample_proposals(state, plan, warp, span[:, 2], u, logits, advance)


def propose_streams(state: RoundState, plan: RoundPlan, warp: RowWarp, lens: torch.Tensor, u: dict):
    """`gamma` proposals per row from the stream heads' states the last round (or the admission)
    left (`RoundState.stream_state`): one pass of the target's head over them, then sampling.
    Returns what `sample_proposals` does."""
    logits = state.streams.logits(state.target, state.stream_state[:, :plan.gamma], widen=False)  # [B, g, V]
    return sample_proposals(state, plan, warp, lens, u, logits[:, :1],
                            lambda i, x: logits[:, i + 1:i + 2])


def follow_streams(state: RoundState, normed: torch.Tensor, accepted: torch.Tensor, token: torch.Tensor,
                   pos: torch.Tensor, kv_len) -> None:
    """The stream heads' states for the next round: from the target's normed hidden state at each
    row's last accepted position (`normed` `[B, g+1, H]` at `pos`, index `accepted` `[B]`) and the
    token emitted after it (`token` `[B]`, an output id). Rows whose token is drawn after the round
    (PCG's fallback) are redone then (`SpeculativeDecoder.fix_fallbacks`, from `stream_source`).
    Heads that attend run at every position of the round (their cache takes each; those past a
    row's accepted ones are overwritten by later rounds, as the target's are)."""
    rows = torch.arange(accepted.shape[0], device=accepted.device)
    if state.streams.attends:
        states = state.streams.states(state.target, normed, pos, state.stream_cache, kv_len)  # [B, g+1, heads, H]
        state.stream_state.copy_(states[rows, accepted])
        return
    source = normed[rows, accepted]  # [B, H]
    state.stream_source.copy_(source)
    state.stream_state.copy_(state.streams.follow(state.target, source, state.out_to_token[token]))


def decode_round(state: RoundState, plan: RoundPlan, keys_read: torch.Tensor | None = None) -> torch.Tensor:
    """Run one round over every slot. Returns `[B, 3]` int64: tokens committed, finished, and
    whether the row's recovered token is still to be drawn (`OUT_*`).

    `keys_read`: a tensor whose length is the keys to read, instead of `plan.kv_len` (a compiled
    round takes it so, as a dynamic size: one graph serves every bucket)."""
    g = plan.gamma
    kv_len = plan.kv_len if keys_read is None else keys_read.shape[0]
    warp = plan.warp(state)
    lens = state.seq_len  # [B]
    u = draws(state, plan, lens)
    target_tables, normed = None, None
    if g and state.streams is not None:
        drafts, draft_probs, history = propose_streams(state, plan, warp, lens, u)
        pos = (lens - 1)[:, None] + torch.arange(g + 1, device=lens.device)  # [B, g+1]
    elif g:
        # every position the round feeds, from the last committed but one: mask and rope tables once
        span = (lens - 2)[:, None] + torch.arange(g + 2, device=lens.device)  # [B, g+2]
        tables = state.draft.step_tables(span, kv_len)
        drafts, draft_probs, history = propose(state, plan, warp, span, tables, u, kv_len)
        pos = span[:, 1:]  # [B, g+1] the target's: the last committed one onwards
        target_tables = tables.columns(1, g + 2) if state.same_rope else None
    else:
        pos = (lens - 1)[:, None]  # [B, 1] the last committed position
        drafts, draft_probs = None, None
        history = state.seen[:, None] if plan.steps.penalty else None
    feed = state.tokens.gather(1, pos[:, :1])  # [B, 1] the last committed token
    if g:
        feed = torch.cat([feed, state.out_to_token[drafts]], 1)  # [B, g+1]
    if state.streams is not None and g:  # the heads read the hidden states the head's logits come from
        normed = state.target.step(feed, pos, state.tcache, kv_len=kv_len, logits_at="normed", widen=False)
        logits = state.target.project(normed, widen=False)  # [B, g+1, V]
    else:
        logits = state.target.step(feed, pos, state.tcache, kv_len=kv_len, logits_at="all", widen=False,
                                   tables=target_tables)  # [B, g+1, V]
    logits = in_frame(logits, state, lens)
    penalised = penalised_logits(logits, history, warp)
    target_probs = warp_penalised(penalised, warp) if plan.steps.sampled else None
    argmax = penalised.argmax(-1) if plan.steps.greedy else None  # [B, g+1]
    mixed = state.sampling.greedy if plan.steps.greedy and plan.steps.sampled else None
    if g:
        block = Block(drafts, draft_probs, target_probs, argmax, None, lens, mixed, state.keys, u)
        verdict = judge_mixed(plan.rules, state.rule_index, block, dense_fallback=False)
        accepted, next_token = verdict.num_accepted, verdict.next_token
        new = torch.cat([drafts, next_token[:, None]], 1)
        new = new.scatter(1, accepted[:, None], next_token[:, None])  # [B, g+1]
        fix = None
        if plan.keeps_fallbacks:
            slot = accepted.clamp(max=g - 1)
            keep_fallback_inputs(state, target_probs, draft_probs, slot)
            fix = verdict.fallback
        record(state, verdict, g)
        if normed is not None:
            follow_streams(state, normed, accepted, next_token, pos, kv_len)
        return commit(state, plan, lens, new, accepted, fix)
    if plan.steps.sampled:
        next_token = sample_from(target_probs[:, 0], u[rng.BONUS].view(-1, 1))[:, 0]
        if mixed is not None:
            next_token = torch.where(mixed, argmax[:, 0], next_token)
    else:
        next_token = argmax[:, 0]
    state.stat_counts[:, :2] += state.active[:, None]  # a round, a token
    return commit_one(state, plan, lens, next_token)


def keep_fallback_inputs(state: RoundState, target_probs, draft_probs, slot: torch.Tensor) -> None:
    """Keep each row's distributions at its rejected position `slot` `[B]` for the fallback."""
    rows = torch.arange(slot.shape[0], device=slot.device)
    state.fallback_target.copy_(target_probs[rows, slot])
    state.fallback_draft.copy_(draft_probs[rows, slot])


def record(state: RoundState, verdict, gamma: int) -> None:
    """Per-row statistics of the round's verdict (active rows only)."""
    active = state.active[:, None]
    j = torch.arange(gamma, device=active.device)
    n = verdict.num_accepted[:, None]
    state.stat_reached += (j <= n) & active
    state.stat_accepted += (j < n) & active
    counts = torch.stack([torch.ones_like(verdict.num_accepted), verdict.num_accepted + 1,
                          verdict.trials, verdict.fallback.long()], 1)
    state.stat_counts += counts * active


def commit(state: RoundState, plan: RoundPlan, lens, new, accepted, fix) -> torch.Tensor:
    """Append the first `accepted + 1` tokens of `new` `[B, g+1]` to every active row, cut after
    an end-of-speech token and at the row's limit; rows in `fix` `[B]` keep only their accepted
    tokens (their last one is drawn after the round)."""
    j = torch.arange(new.shape[1], device=lens.device)
    emitted = accepted + ~fix if fix is not None else accepted + 1  # [B]
    # tokens up to the first end-of-speech among the emitted ones, at most the room left
    ends = (new == state.eos_out) & (j < emitted[:, None])
    count = torch.minimum(torch.where(ends, j, new.shape[1]).amin(-1) + 1, emitted)
    count = torch.minimum(count, state.limit - lens) * state.active
    keep = j < count[:, None]  # [B, g+1]
    pos = lens[:, None] + j
    state.tokens.scatter_(1, pos, torch.where(keep, state.out_to_token[new], state.tokens.gather(1, pos)))
    if plan.steps.penalty:
        # Unkept slots repeat the first token when it is kept, so the scatter writes only True
        # where a token was committed (duplicate indices write the same value).
        kept = torch.where(keep, new, new[:, :1])
        state.seen.scatter_(1, kept, keep.any(-1, keepdim=True) | state.seen.gather(1, kept))
    grown = lens + count
    ended = (ends & keep).any(-1) | (grown >= state.limit)  # [B]
    finished = ended & state.active
    # the fallback's token is still due only where the row neither ended nor ran out of room
    due = fix & state.active & ~ended & (count == accepted) if fix is not None else torch.zeros_like(ended)
    state.seq_len.copy_(grown)  # `lens` is this very tensor: written last
    return torch.stack([count, finished.long(), due.long()], 1)


def commit_one(state: RoundState, plan: RoundPlan, lens, token) -> torch.Tensor:
    """`commit` of an `ar` round: `token` `[B]` appended to every active row with room left
    (the same result in fewer ops; the token is written past an unkept row's end, where nothing
    reads it)."""
    keep = state.active & (lens < state.limit)  # [B]
    at = lens[:, None]
    state.tokens.scatter_(1, at, state.out_to_token[token][:, None])
    if plan.steps.penalty:
        ids = token[:, None]
        state.seen.scatter_(1, ids, keep[:, None] | state.seen.gather(1, ids))
    count = keep.long()
    grown = lens + count
    # an active row without room ends too (it committed nothing)
    finished = state.active & ((token == state.eos_out) | (grown >= state.limit))
    state.seq_len.copy_(grown)
    return torch.stack([count, finished.long(), torch.zeros_like(count)], 1)
