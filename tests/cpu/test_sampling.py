"""The sampler and the counter-based random numbers."""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import chisquare, kstest
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from engine.config import Warp
from engine.decoding import rng
from engine.decoding.sampling import sample_from, warp_probs


def test_uniforms_are_uniform_and_streams_independent():
    seeds = torch.arange(50_000)[:, None]
    pos = torch.arange(4)[None]
    u = rng.uniform(seeds, pos, rng.DRAFT)
    v = rng.uniform(seeds, pos, rng.ACCEPT)
    assert u.dtype == torch.float64 and u.shape == (50_000, 4)
    assert kstest(u.flatten().numpy(), "uniform").pvalue > 1e-3
    assert abs(np.corrcoef(u.flatten().numpy(), v.flatten().numpy())[0, 1]) < 0.02
    assert abs(np.corrcoef(u[:, 0].numpy(), u[:, 1].numpy())[0, 1]) < 0.02
    assert torch.equal(u, rng.uniform(seeds, pos, rng.DRAFT))  # a pure function of its counter
    big = rng.uniform(torch.tensor([2**62 + 5]), torch.tensor([3]), rng.BONUS)
    assert 0.0 <= float(big) < 1.0


def test_draws_stay_what_they_were_and_a_seed_key_draws_the_same():
    """A row's codes are reproducible across versions only if its uniforms are: these values
    were drawn by the original one-function hash. A decoder draws from each row's `seed_key`
    (the seed's part of the hash, computed once), with host-side int lanes: the same numbers."""
    seeds, pos = torch.tensor([[0], [1], [2**62 + 5]]), torch.tensor([[3, 1000]])
    pinned = {(rng.BONUS, 0): ["0x1.fb79a65552d40p-1", "0x1.7155173e1f0cep-1", "0x1.e26c3fee94facp-3",
                               "0x1.6dd1521733e0ap-1", "0x1.212e913da6876p-1", "0x1.36b743bd23750p-3"],
              (rng.RECOVER, 5): ["0x1.17597129dc8d9p-1", "0x1.81b0623157d52p-2", "0x1.11214ae179400p-10",
                                 "0x1.7b0fac37ad128p-2", "0x1.86e3ba21d670cp-3", "0x1.f86adc70fb3bcp-1"]}
    for (purpose, lane), values in pinned.items():
        expect = torch.tensor([float.fromhex(v) for v in values], dtype=torch.float64).view(3, 2)
        assert torch.equal(rng.uniform(seeds, pos, purpose, lane), expect)
        key = rng.seed_key(seeds)
        assert torch.equal(rng.keyed_uniform(key, pos, purpose, lane), expect)
        assert torch.equal(rng.keyed_uniform(key, pos, purpose, torch.tensor(lane)), expect)
    lanes = torch.arange(4)
    assert torch.equal(rng.keyed_uniform(rng.seed_key(seeds)[..., None], pos[..., None], rng.RECOVER, lanes),
                       rng.uniform(seeds[..., None], pos[..., None], rng.RECOVER, lanes))
    # a round draws all its streams in one evaluation (`stream_word`, `draw`): the same numbers
    words = torch.tensor([rng.stream_word(rng.DRAFT), rng.stream_word(rng.RECOVER, 3)])
    both = rng.draw(rng.seed_key(seeds), pos[:, :1] + torch.tensor([0, 2]), words)
    assert torch.equal(both[:, 0], rng.uniform(seeds[:, 0], pos[0, :1], rng.DRAFT))
    assert torch.equal(both[:, 1], rng.uniform(seeds[:, 0], pos[0, :1] + 2, rng.RECOVER, 3))


def test_sample_from_follows_probs_and_never_picks_zero_mass():
    probs = torch.tensor([0.1, 0.0, 0.5, 0.0, 0.4])
    u = rng.uniform(torch.arange(100_000), torch.zeros(100_000, dtype=torch.long), rng.BONUS)
    draws = sample_from(probs.expand(100_000, -1), u[:, None])[:, 0]
    counts = np.bincount(draws.numpy(), minlength=5)
    assert counts[1] == 0 and counts[3] == 0
    assert chisquare(counts[[0, 2, 4]], np.array([0.1, 0.5, 0.4]) * 100_000).pvalue > 1e-3
    edge = sample_from(probs[None], torch.tensor([[1 - 2**-53]], dtype=torch.float64))
    assert int(edge) == 4


def test_temperature_top_k_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    seen = torch.zeros_like(logits, dtype=torch.bool)
    plain = warp_probs(logits, seen, Warp(temperature=1.0))
    assert torch.allclose(plain, torch.softmax(logits, -1))
    hot = warp_probs(logits, seen, Warp(temperature=2.0))
    assert torch.allclose(hot, torch.softmax(logits / 2, -1))
    top2 = warp_probs(logits, seen, Warp(temperature=1.0, top_k=2))
    assert (top2[0, 2:] == 0).all() and torch.isclose(top2.sum(), torch.tensor(1.0))
    nucleus = warp_probs(logits, seen, Warp(temperature=1.0, top_p=0.7))
    # sorted masses 0.52, 0.19, 0.12, ...: the smallest prefix reaching 0.7 has two tokens
    assert (nucleus[0, :2] > 0).all() and (nucleus[0, 2:] == 0).all()


def test_repetition_penalty_matches_transformers():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 50, generator=gen)
    history = torch.tensor([[3, 7, 7, 20], [0, 1, 2, 49]])
    seen = torch.zeros(2, 50, dtype=torch.bool).scatter(1, history, True)
    ours = warp_probs(logits, seen, Warp(temperature=1.0, repetition_penalty=1.3))
    ref = RepetitionPenaltyLogitsProcessor(1.3)(history, logits.clone())
    assert torch.allclose(ours, torch.softmax(ref, -1), atol=1e-6)
