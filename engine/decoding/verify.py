"""Acceptance rules as batched tensor functions (docs/pcg.md sections 4-7).

Terms, used the same way everywhere:
    accepted   draft tokens kept, a prefix of the block of `gamma`;
    recovered  the token emitted at the first rejected position, drawn from the rule's residual;
    bonus      the token emitted after a fully accepted block, drawn from the target.

Every row emits `num_accepted` draft tokens plus one recovered-or-bonus token. Decisions at all
positions are drawn at once (their uniforms are independent), and `num_accepted` is the length
of the leading run of accepts, so the result equals the sequential procedure.

Letters: no bare p/q. `draft_probs` is the paper's p, `target_probs` its q.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.config import METHODS, DecodingSettings, decoding_default
from engine.decoding import rng
from engine.decoding.sampling import sample_from, sample_one
from engine.groups.csr import GroupIndex


@dataclass
class Block:
    """One verification step for `B` rows and `gamma` draft tokens.

    Attributes:
        draft_tokens: `[B, gamma]` output ids.
        draft_probs: `[B, gamma, V]` float32 warped draft distributions (None when greedy).
        target_probs: `[B, gamma+1, V]` float32 warped target distributions (None when greedy).
        target_argmax: `[B, gamma+1]` greedy target choices (None when no row is greedy).
        seeds: `[B]` int64 per-row seeds (None when `keys` are given).
        base_pos: `[B]` sequence position of the first draft token.
        greedy_rows: `[B]` bool, which rows are greedy when the block mixes greedy and sampled
            rows (then both probabilities and argmaxes are given); None otherwise.
        keys: `[B]` the seeds' `rng.seed_key` (computed from `seeds` when not given; a decoder
            keeps them per row).
        draws: uniforms drawn ahead for the whole block (a decoder draws a round's at once):
            purpose -> `[B, slots, lanes]` float64 at positions `base_pos + slot`; purposes not
            in it are drawn when asked. The same numbers either way.
    """

    draft_tokens: torch.Tensor
    draft_probs: torch.Tensor | None
    target_probs: torch.Tensor | None
    target_argmax: torch.Tensor | None
    seeds: torch.Tensor | None
    base_pos: torch.Tensor
    greedy_rows: torch.Tensor | None = None
    keys: torch.Tensor | None = None
    draws: dict[int, torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if self.keys is None:
            self.keys = rng.seed_key(self.seeds)

    @property
    def gamma(self) -> int:
        return self.draft_tokens.shape[1]

    @property
    def greedy(self) -> bool:
        """Every row is greedy."""
        return self.target_probs is None

    def take(self, index: torch.Tensor) -> Block:
        """The block of rows `index` (rows are independent, so a sub-block decides exactly
        as the whole block would for them)."""
        pick = lambda x: None if x is None else x.index_select(0, index)  # noqa: E731
        return Block(pick(self.draft_tokens), pick(self.draft_probs), pick(self.target_probs),
                     pick(self.target_argmax), pick(self.seeds), pick(self.base_pos),
                     pick(self.greedy_rows), pick(self.keys),
                     None if self.draws is None else {k: pick(v) for k, v in self.draws.items()})

    def uniform(self, purpose: int, slot: torch.Tensor | int, lanes: int = 0) -> torch.Tensor:
        """Uniforms for the decisions at draft slot `slot`: an int, `[B]` or `[1 or B, k]`.
        Returns the broadcast shape (`[B]` or `[B, k]`), plus `[lanes]` when `lanes > 0`."""
        table = self.draws.get(purpose) if self.draws is not None else None
        if table is not None:
            return drawn(table, slot, lanes)
        dims = slot.dim() if torch.is_tensor(slot) else 0  # an int slot stays on the host
        lead = (-1,) + (1,) * max(dims - 1, 0)
        pos = self.base_pos.view(lead) + slot
        key = self.keys.view(lead)
        if lanes:
            lane = torch.arange(lanes, device=pos.device)
            return rng.keyed_uniform(key[..., None], pos[..., None], purpose, lane)
        return rng.keyed_uniform(key, pos, purpose)


def drawn(table: torch.Tensor, slot: torch.Tensor | int, lanes: int) -> torch.Tensor:
    """`Block.uniform` from a table `[B, S, L]`: slot an int, `[B]` or `[1 or B, k]`."""
    if isinstance(slot, int):
        picked = table[:, slot]  # [B, L]
    elif slot.dim() == 1:
        picked = table.gather(1, slot[:, None, None].expand(-1, 1, table.shape[2]))[:, 0]  # [B, L]
    else:
        index = slot.expand(table.shape[0], -1)  # [B, k]
        picked = table.gather(1, index[..., None].expand(-1, -1, table.shape[2]))  # [B, k, L]
    return picked[..., :lanes] if lanes else picked[..., 0]


@dataclass
class Verdict:
    """Outcome of a block.

    Attributes:
        num_accepted: `[B]` accepted draft tokens (0..gamma).
        next_token: `[B]` recovered (num_accepted < gamma) or bonus token.
        accepted: `[B, gamma]` per-position accept decision (counted only inside the prefix).
        trials: `[B]` PCG thinning trials spent on the recovered token (0 otherwise).
        fallback: `[B]` the thinning found no token, so the exact dense residual decided (or,
            in a round that leaves it to its caller, must still decide: `next_token` is then
            not valid for these rows; see `PCGRule.exact_residual`).
        labels: PCG only, `[B, gamma+1]` group label of each position's decision: the draw
            K_i at judged draft positions, the residual's group at the recovered position,
            -1 for a bonus token (token-level exact, no label drawn).
    """

    num_accepted: torch.Tensor
    next_token: torch.Tensor
    accepted: torch.Tensor
    trials: torch.Tensor
    fallback: torch.Tensor
    labels: torch.Tensor | None = None


def at_slot(x: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """`x[b, slot[b]]` for `x` `[B, S, ...]`."""
    return x[torch.arange(x.shape[0], device=x.device), slot]


def prob_of(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """`probs[b, i, tokens[b, i]]` as float64."""
    return probs.gather(-1, tokens[..., None])[..., 0].double()


@dataclass
class Judgement:
    """Per-position decisions `[B, gamma]`, with PCG's group labels `[B, gamma]` when drawn."""

    accepted: torch.Tensor
    labels: torch.Tensor | None = None


@dataclass
class Recovery:
    """Token `[B]` emitted at a rejected position, with PCG's bookkeeping."""

    token: torch.Tensor
    trials: torch.Tensor | None = None
    fallback: torch.Tensor | None = None
    label: torch.Tensor | None = None


class Rule:
    """An acceptance rule: which draft tokens to accept, and what to emit on rejection."""

    name = "rule"

    def accept(self, block: Block) -> Judgement:
        """Each position judged on its own."""
        raise NotImplementedError

    def recover(self, block: Block, slot: torch.Tensor, rejected: torch.Tensor,
                dense_fallback: bool = True) -> Recovery:
        """The token for a rejection at `slot` `[B]`; only rows with `rejected` set use it
        (`dense_fallback`: see `judge`)."""
        raise NotImplementedError

    def accept_greedy(self, block: Block) -> torch.Tensor:
        return block.draft_tokens == block.target_argmax[:, :-1]

    def __call__(self, block: Block) -> Verdict:
        return self.judge(block)

    def judge(self, block: Block, dense_fallback: bool = True) -> Verdict:
        """The block's verdict. `dense_fallback` False: no host sync and no data-dependent
        work, for a captured round; a rule with an exact fallback (PCG) then marks the rows that
        need it in `Verdict.fallback` instead of computing it."""
        if block.greedy:
            return self.greedy_verdict(block)
        sampled = self.sampled_verdict(block, dense_fallback)
        if block.greedy_rows is None:
            return sampled
        return select_rows(block.greedy_rows, self.greedy_verdict(block), sampled)

    def greedy_verdict(self, block: Block) -> Verdict:
        """Accept while the draft agrees with the target's argmax; then the argmax."""
        accepted = self.accept_greedy(block)
        num_accepted = accepted.long().cumprod(-1).sum(-1)  # [B]
        zeros = torch.zeros_like(num_accepted)
        next_token = at_slot(block.target_argmax, num_accepted)
        return Verdict(num_accepted, next_token, accepted, zeros, zeros.bool())

    def sampled_verdict(self, block: Block, dense_fallback: bool = True) -> Verdict:
        gamma = block.gamma
        judged = self.accept(block)
        accepted = judged.accepted  # [B, gamma]
        num_accepted = accepted.long().cumprod(-1).sum(-1)  # [B]
        zeros = torch.zeros_like(num_accepted)
        bonus = sample_one(block.target_probs[:, gamma], block.uniform(rng.BONUS, gamma))
        slot = num_accepted.clamp(max=gamma - 1)
        full = num_accepted == gamma
        rejected = ~full if block.greedy_rows is None else ~full & ~block.greedy_rows
        rec = self.recover(block, slot, rejected, dense_fallback)
        trials = zeros if rec.trials is None else torch.where(full, zeros, rec.trials)
        fallback = zeros.bool() if rec.fallback is None else rec.fallback & rejected
        labels = judged.labels
        if labels is not None:
            label = torch.where(full, torch.full_like(rec.label, -1), rec.label)
            labels = torch.cat([labels, label[:, None]], 1)
            labels = labels.scatter(1, num_accepted[:, None], label[:, None])
        return Verdict(num_accepted, torch.where(full, bonus, rec.token), accepted, trials,
                       fallback, labels)


def select_rows(rows: torch.Tensor, chosen: Verdict, other: Verdict, keep_labels: bool = False) -> Verdict:
    """Per row: `chosen` where `rows` `[B]` is set, else `other`. Labels: `other`'s, -1 on the
    chosen rows (a greedy verdict draws none), or with `keep_labels` each side's own (-1 where a
    side draws none)."""
    def pick(a, b):
        return torch.where(rows.view((-1,) + (1,) * (a.dim() - 1)), a, b)
    labels = other.labels
    if keep_labels and chosen.labels is not None:
        labels = pick(chosen.labels, labels if labels is not None else torch.full_like(chosen.labels, -1))
    elif labels is not None:
        labels = pick(torch.full_like(labels, -1), labels)
    return Verdict(pick(chosen.num_accepted, other.num_accepted), pick(chosen.next_token, other.next_token),
                   pick(chosen.accepted, other.accepted), pick(chosen.trials, other.trials),
                   pick(chosen.fallback, other.fallback), labels)


def judge_mixed(rules: tuple[Rule, ...], rule_index: torch.Tensor | None, block: Block,
                dense_fallback: bool = True) -> Verdict:
    """Rows judged by their own rules: row `b` by `rules[rule_index[b]]` (rules of the same
    gamma mix in a block). Each rule judges every row and each row keeps its own rule's verdict:
    shapes stay fixed, and rows are independent, so a row's verdict is the one its rule gives
    it alone (each rule present adds its own verification to the block)."""
    verdicts = [rule.judge(block, dense_fallback) for rule in rules]
    verdict = verdicts[0]
    for i, other in enumerate(verdicts[1:], 1):
        verdict = select_rows(rule_index == i, other, verdict, keep_labels=True)
    return verdict


class ExactRule(Rule):
    """Standard speculative sampling: token-level exact."""

    name = "exact"

    def accept(self, block: Block) -> Judgement:
        target = prob_of(block.target_probs[:, :-1], block.draft_tokens)
        draft = prob_of(block.draft_probs, block.draft_tokens)
        u = block.uniform(rng.ACCEPT, torch.arange(block.gamma, device=target.device)[None])
        return Judgement(u * draft < target)  # u < min(1, target / draft) without dividing

    def recover(self, block, slot, rejected, dense_fallback=True):
        target = at_slot(block.target_probs, slot)  # [B, V]
        residual = (target - at_slot(block.draft_probs, slot)).clamp_(min=0)
        # All-zero residual only arises from rounding when the two agree: draw from the target.
        empty = residual.sum(-1, keepdim=True) <= 0
        residual = torch.where(empty, target, residual)
        return Recovery(sample_one(residual, block.uniform(rng.RECOVER, slot)))


class SSDRule(ExactRule):
    """Lin et al.'s relaxed acceptance: `u < target/draft + beta`. No guarantee."""

    name = "ssd"

    def __init__(self, beta: float) -> None:
        self.beta = beta

    def accept(self, block: Block) -> Judgement:
        target = prob_of(block.target_probs[:, :-1], block.draft_tokens)
        draft = prob_of(block.draft_probs, block.draft_tokens)
        u = block.uniform(rng.ACCEPT, torch.arange(block.gamma, device=target.device)[None])
        return Judgement(u * draft < target + self.beta * draft)


class TopKRule(Rule):
    """Accept a draft token inside the target's top-k; on rejection draw from the target."""

    name = "topk"

    def __init__(self, k: int) -> None:
        self.k = k

    def accept(self, block: Block) -> Judgement:
        target = block.target_probs[:, :-1]
        kth = torch.topk(target, min(self.k, target.shape[-1]), dim=-1).values[..., -1]
        mine = target.gather(-1, block.draft_tokens[..., None])[..., 0]
        return Judgement((mine >= kth) & (mine > 0))

    def recover(self, block, slot, rejected, dense_fallback=True):
        return Recovery(sample_one(at_slot(block.target_probs, slot), block.uniform(rng.RECOVER, slot)))


class PCGRule(Rule):
    """Principled Coarse-Grained acceptance: exact at the level of group labels.

    Args:
        groups: device-side group index over the output space.
        max_trials: thinning trials before the exact dense fallback.
    """

    name = "pcg"

    def __init__(self, groups: GroupIndex, max_trials: int = decoding_default("max_thinning_trials")) -> None:
        self.groups = groups
        self.max_trials = max_trials

    def accept_greedy(self, block: Block) -> torch.Tensor:
        home = self.groups.home[block.target_argmax[:, :-1]]
        return self.groups.contains(home, block.draft_tokens)

    def accept(self, block: Block) -> Judgement:
        slots = torch.arange(block.gamma, device=block.draft_tokens.device)[None]
        label = self.groups.pick_label(block.draft_tokens, block.uniform(rng.LABEL, slots))
        draft_mass = self.groups.mass(block.draft_probs, label[..., None])[..., 0].double()
        target_mass = self.groups.mass(block.target_probs[:, :-1], label[..., None])[..., 0].double()
        u = block.uniform(rng.ACCEPT, slots)
        return Judgement(u * draft_mass < target_mass, label)  # u < min(1, Q_c / P_c)

    def recover(self, block, slot, rejected, dense_fallback=True):
        target = at_slot(block.target_probs, slot)  # [B, V]
        draft = at_slot(block.draft_probs, slot)
        t = self.max_trials
        # Thinning: y ~ target, K ~ w[., y], keep (y, K) with prob max(0, 1 - P_c(K) / Q_c(K)).
        tokens = sample_from(target, block.uniform(rng.RECOVER, slot, lanes=t))  # [B, t]
        labels = self.groups.pick_label(tokens, block.uniform(rng.RECOVER_LABEL, slot, lanes=t))
        target_mass = self.groups.mass(target, labels).double()  # [B, t]
        draft_mass = self.groups.mass(draft, labels).double()
        u = block.uniform(rng.RECOVER_ACCEPT, slot, lanes=t)
        keep = u * target_mass < target_mass - draft_mass
        found = keep.any(-1)
        first = keep.long().argmax(-1)  # first kept trial
        token = tokens.gather(-1, first[:, None])[:, 0]
        label = labels.gather(-1, first[:, None])[:, 0]
        trials = torch.where(found, first + 1, torch.full_like(first, t))
        if dense_fallback and bool((rejected & ~found).any()):  # rare: one host sync, only then
            pos = block.base_pos + slot
            dense_token, dense_label = self.exact_residual(target, draft, block.keys, pos)
            token = torch.where(found, token, dense_token)
            label = torch.where(found, label, dense_label)
        return Recovery(token, trials, ~found, label)

    def exact_residual(self, target: torch.Tensor, draft: torch.Tensor, keys: torch.Tensor,
                       pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact draw from the group residual with all group masses (one sparse sum per row):
        K ~ max(0, Q_c - P_c), then y in G_K with prob w[K, y] target(y) / Q_c(G_K).

        Args:
            target, draft: `[b, V]` warped distributions at the rejected position.
            keys: `[b]` the rows' `rng.seed_key`.
            pos: `[b]` sequence position of the rejected draft token.

        Returns:
            (token `[b]`, group label `[b]`).
        """
        # both models' masses in one product: [2b, M]
        target_mass, draft_mass = self.groups.all_masses(torch.cat([target, draft])).split(len(target))
        residual = (target_mass - draft_mass).clamp_(min=0)
        empty = residual.sum(-1, keepdim=True) <= 0
        residual = torch.where(empty, target_mass, residual)
        label = sample_one(residual, rng.keyed_uniform(keys, pos, rng.FALLBACK_GROUP))  # [b]
        ids, valid = self.groups.padded_members(label)  # [b, m]
        inside = self.groups.weighted(target, ids) * valid
        pick = sample_one(inside, rng.keyed_uniform(keys, pos, rng.FALLBACK_TOKEN))
        return ids.gather(-1, pick[:, None])[:, 0], label


@dataclass(frozen=True)
class RuleSpec:
    """An acceptance rule as the rest of the engine sees it: its knobs are declared here once,
    and `rule_key`, `make_rule` and the decoder's structure key derive from them.

    Attributes:
        name: the method's name in `DecodingSettings.method`.
        knobs: the `DecodingSettings` fields the rule reads (two settings with equal knobs
            share one rule object).
        build: settings (and groups, for a rule that needs them) -> the rule.
        needs_groups: the rule reads acoustic similarity groups (`decoding.theta`).
    """

    name: str
    knobs: tuple[str, ...]
    build: Callable[[DecodingSettings, GroupIndex | None], Rule]
    needs_groups: bool = False


def _pcg(settings: DecodingSettings, groups: GroupIndex | None) -> Rule:
    if groups is None:
        raise ValueError("method 'pcg' needs acoustic similarity groups")
    return PCGRule(groups, settings.max_thinning_trials)


RULES: dict[str, RuleSpec] = {spec.name: spec for spec in (
    RuleSpec("exact", (), lambda settings, groups: ExactRule()),
    RuleSpec("pcg", ("theta", "max_group_size", "max_thinning_trials"), _pcg, needs_groups=True),
    RuleSpec("ssd", ("beta",), lambda settings, groups: SSDRule(settings.beta)),
    RuleSpec("topk", ("topk",), lambda settings, groups: TopKRule(settings.topk)),
)}
assert set(RULES) == set(METHODS) - {"ar"}, "every speculative method of config.METHODS has a RuleSpec"


def rule_key(settings: DecodingSettings) -> tuple:
    """What makes two settings' rules differ: the method and its own knobs only."""
    spec = RULES.get(settings.method)
    return (settings.method,) + (tuple(getattr(settings, k) for k in spec.knobs) if spec else ())


def structure_key(settings: DecodingSettings) -> tuple:
    """The settings that need a decoder and a rule of their own (sampling settings do not):
    the rule's key and the draft length."""
    return rule_key(settings) + (settings.gamma,)


def make_rule(settings: DecodingSettings, groups: GroupIndex | None = None) -> Rule:
    """The acceptance rule of `settings.method` with its knobs (beta, topk, thinning trials);
    `ar` drafts nothing and has none. `groups` are needed by `pcg` only."""
    spec = RULES.get(settings.method)
    if spec is None:
        speculative = ", ".join(RULES)
        raise ValueError(f"unknown speculative method {settings.method!r}; choose from {speculative}")
    return spec.build(settings, groups)
