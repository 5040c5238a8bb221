"""The maths of the acceptance rules (docs/pcg.md section 9), by Monte-Carlo on one step.

Every trial is a row of one batched call; rows differ only in their seed, so each row's draw is
an independent sample of the same one-step experiment.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from engine.decoding import rng
from engine.decoding.sampling import sample_one
from engine.decoding.verify import Block, ExactRule, PCGRule, SSDRule, TopKRule
from engine.groups.build import build_groups
from engine.groups.csr import GroupIndex, SpeechGroups

TRIALS = 200_000
V_SPEECH = 12  # speech tokens; output space adds one end-of-speech id (a singleton group)
V = V_SPEECH + 1


def instance(seed: int, theta: float = 0.75):
    """Random draft/target distributions and overlapping symmetric groups from real range search
    over random 3-d embeddings."""
    gen = torch.Generator().manual_seed(seed)
    emb = torch.randn(V_SPEECH, 3, generator=gen)
    groups = build_groups(emb, theta)
    draft = torch.softmax(1.5 * torch.randn(V, generator=gen, dtype=torch.float64), -1).float()
    target = torch.softmax(1.5 * torch.randn(V, generator=gen, dtype=torch.float64), -1).float()
    return draft, target, GroupIndex(groups, V)


def one_step(draft, target, rule, trials=TRIALS, gamma=1, seed_offset=0):
    """`trials` independent one-block experiments with the same distributions at every position."""
    seeds = torch.arange(trials, dtype=torch.long) + 1_000_003 * seed_offset
    pos = torch.zeros(trials, dtype=torch.long)
    draft_probs = draft.expand(trials, gamma, V).contiguous()
    target_probs = target.expand(trials, gamma + 1, V).contiguous()
    slots = torch.arange(gamma)[None]
    tokens = sample_one(draft_probs, rng.uniform(seeds[:, None], pos[:, None] + slots, rng.DRAFT))
    block = Block(tokens, draft_probs, target_probs, None, seeds, pos)
    return tokens, rule(block)


def coarse(groups: GroupIndex, probs: torch.Tensor) -> np.ndarray:
    return groups.all_masses(probs[None].double())[0].numpy()


def emitted_first(tokens, verdict):
    """Token emitted at the first position of each block."""
    return torch.where(verdict.num_accepted > 0, tokens[:, 0], verdict.next_token)


def histogram(values: torch.Tensor, size: int) -> np.ndarray:
    return np.bincount(values.numpy(), minlength=size)


def fit(observed: np.ndarray, law) -> float:
    """Chi-square p-value of `observed` counts against the law (renormalised in float64)."""
    law = np.asarray(law, dtype=np.float64)
    return chisquare(observed, law / law.sum() * observed.sum()).pvalue


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("max_trials", [8, 1])
def test_pcg_emitted_group_label_follows_target_coarse_law(seed, max_trials):
    draft, target, groups = instance(seed)
    assert groups.max_size > 1, "instance must have overlapping groups"
    tokens, verdict = one_step(draft, target, PCGRule(groups, max_trials=max_trials))
    labels = verdict.labels[:, 0]
    observed = histogram(labels, groups.num_groups)
    target_c = coarse(groups, target)
    assert abs(target_c.sum() - 1) < 1e-6  # float32 inputs
    assert fit(observed, target_c) > 1e-3
    # the test has power: the draft's coarse law is rejected
    assert fit(observed, coarse(groups, draft)) < 1e-6
    # every emitted token lies in its label's group
    first = emitted_first(tokens, verdict)
    assert bool(groups.contains(labels, first).all())
    if max_trials == 1:
        assert int(verdict.fallback.sum()) > 0, "the exact dense fallback must have been exercised"


def test_pcg_label_law_holds_at_first_position_of_longer_blocks():
    draft, target, groups = instance(3)
    tokens, verdict = one_step(draft, target, PCGRule(groups), trials=100_000, gamma=3)
    observed = histogram(verdict.labels[:, 0], groups.num_groups)
    assert fit(observed, coarse(groups, target)) > 1e-3


@pytest.mark.parametrize("seed", [0, 1])
def test_exact_emitted_token_follows_target(seed):
    draft, target, _ = instance(seed)
    tokens, verdict = one_step(draft, target, ExactRule())
    observed = histogram(emitted_first(tokens, verdict), V)
    assert fit(observed, target.double().numpy()) > 1e-3
    assert fit(observed, draft.double().numpy()) < 1e-6


def test_acceptance_rates_match_total_variation_and_pcg_dominates():
    for seed in range(4):
        draft, target, groups = instance(seed)
        tv = 0.5 * (draft.double() - target.double()).abs().sum().item()
        tv_c = 0.5 * np.abs(coarse(groups, draft) - coarse(groups, target)).sum()
        assert 1 - tv_c >= 1 - tv - 1e-12  # coarse acceptance never below token-level
        _, exact = one_step(draft, target, ExactRule(), seed_offset=seed)
        _, pcg = one_step(draft, target, PCGRule(groups), seed_offset=seed)
        sigma = 0.5 / np.sqrt(TRIALS)
        assert abs(exact.accepted[:, 0].double().mean().item() - (1 - tv)) < 4 * sigma
        assert abs(pcg.accepted[:, 0].double().mean().item() - (1 - tv_c)) < 4 * sigma


def test_singleton_groups_make_pcg_decide_like_exact():
    draft, target, _ = instance(5)
    singletons = GroupIndex(SpeechGroups.singletons(V_SPEECH), V)
    tokens, exact = one_step(draft, target, ExactRule(), trials=50_000, gamma=3)
    tokens2, pcg = one_step(draft, target, PCGRule(singletons), trials=50_000, gamma=3)
    assert torch.equal(tokens, tokens2)
    assert torch.equal(exact.accepted, pcg.accepted)
    assert torch.equal(exact.num_accepted, pcg.num_accepted)
    # recovered tokens are drawn by different samplers, from the same law
    rejected = pcg.num_accepted == 0
    obs_pcg = histogram(pcg.next_token[rejected], V)
    obs_exact = histogram(exact.next_token[exact.num_accepted == 0], V)
    residual = (target.double() - draft.double()).clamp(min=0)
    residual = (residual / residual.sum()).numpy()
    keep = residual > 0
    assert obs_pcg[~keep].sum() == 0 and obs_exact[~keep].sum() == 0
    assert fit(obs_pcg[keep], residual[keep]) > 1e-3
    assert fit(obs_exact[keep], residual[keep]) > 1e-3


def test_ssd_accepts_with_relaxed_ratio_and_recovers_like_exact():
    draft, target, _ = instance(6)
    beta = 0.3
    tokens, verdict = one_step(draft, target, SSDRule(beta))
    d, t = draft.double(), target.double()
    expected = (d * torch.clamp(t / d + beta, max=1.0)).sum().item()
    sigma = 0.5 / np.sqrt(TRIALS)
    assert abs(verdict.accepted[:, 0].double().mean().item() - expected) < 4 * sigma
    assert expected > 1 - 0.5 * (d - t).abs().sum().item()  # more permissive than exact
    rejected = verdict.num_accepted == 0
    residual = (t - d).clamp(min=0)
    residual = (residual / residual.sum()).numpy()
    obs = histogram(verdict.next_token[rejected], V)
    keep = residual > 0
    assert obs[~keep].sum() == 0
    assert fit(obs[keep], residual[keep]) > 1e-3


def test_topk_accepts_exactly_inside_target_top_k_and_recovers_from_target():
    draft, target, _ = instance(7)
    k = 4
    tokens, verdict = one_step(draft, target, TopKRule(k), trials=100_000)
    top = set(torch.topk(target, k).indices.tolist())
    inside = torch.tensor([int(x) in top for x in tokens[:, 0].tolist()])
    assert torch.equal(verdict.accepted[:, 0], inside)
    obs = histogram(verdict.next_token[verdict.num_accepted == 0], V)
    assert fit(obs, target.double().numpy()) > 1e-3


def test_greedy_accepts_while_draft_matches_argmax():
    argmax = torch.tensor([[3, 5, 7, 9], [3, 5, 7, 9], [3, 5, 7, 9]])
    drafts = torch.tensor([[3, 5, 7], [3, 4, 7], [1, 5, 7]])
    block = Block(drafts, None, None, argmax, torch.zeros(3, dtype=torch.long),
                  torch.zeros(3, dtype=torch.long))
    verdict = ExactRule()(block)
    assert verdict.num_accepted.tolist() == [3, 1, 0]
    assert verdict.next_token.tolist() == [9, 5, 3]


def test_pcg_greedy_accepts_group_mates_of_argmax():
    groups = GroupIndex(SpeechGroups.from_lists([[0, 1], [0, 1], [2], [3, 4], [3, 4]], 0.5), 6)
    argmax = torch.tensor([[0, 3, 2], [0, 3, 2]])
    drafts = torch.tensor([[1, 4], [1, 2]])
    block = Block(drafts, None, None, argmax, torch.zeros(2, dtype=torch.long),
                  torch.zeros(2, dtype=torch.long))
    verdict = PCGRule(groups)(block)
    assert verdict.num_accepted.tolist() == [2, 1]
    assert verdict.next_token.tolist() == [2, 3]


def test_row_results_do_not_depend_on_batch_composition():
    draft, target, groups = instance(8)
    seeds = torch.tensor([11, 22, 33, 44])
    pos = torch.tensor([5, 9, 2, 40])
    gamma = 3
    slots = torch.arange(gamma)[None]
    dp = draft.expand(4, gamma, V).contiguous()
    tp = target.expand(4, gamma + 1, V).contiguous()
    tokens = sample_one(dp, rng.uniform(seeds[:, None], pos[:, None] + slots, rng.DRAFT))
    full = PCGRule(groups)(Block(tokens, dp, tp, None, seeds, pos))
    order = torch.tensor([2, 0])
    part = PCGRule(groups)(Block(tokens[order], dp[order], tp[order], None, seeds[order], pos[order]))
    assert torch.equal(full.num_accepted[order], part.num_accepted)
    assert torch.equal(full.next_token[order], part.next_token)
    assert torch.equal(full.labels[order], part.labels)
