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
    were drawn by the hash of `rng.VERSION` 2 (a change of the hash is a change of the numerics
    version, which resume checks). A decoder draws from each row's `seed_key`, with host-side
    int lanes or a whole round's streams at once (`stream_word`): the same numbers, which are
    also `reference_uniform`'s, computed in Python's integers."""
    assert rng.VERSION == 2
    seeds, pos = torch.tensor([[0], [1], [2**62 + 5]]), torch.tensor([[3, 1000]])
    pinned = {(rng.BONUS, 0): ["0x1.7bebc8dd975f6p-2", "0x1.ff3eabc9dc28bp-1", "0x1.993bbfa2a6b80p-5",
                               "0x1.ffc96cd82eedcp-1", "0x1.abfadcb516804p-3", "0x1.0c5521ad2e05ap-2"],
              (rng.RECOVER, 5): ["0x1.4535822e65499p-1", "0x1.f0308711ebdccp-3", "0x1.f0139a70ae740p-5",
                                 "0x1.a40074c606242p-1", "0x1.c4ce7f116ea18p-4", "0x1.5eb85544eac97p-1"]}
    for (purpose, lane), values in pinned.items():
        expect = torch.tensor([float.fromhex(v) for v in values], dtype=torch.float64).view(3, 2)
        assert torch.equal(rng.uniform(seeds, pos, purpose, lane), expect)
        key = rng.seed_key(seeds)
        assert torch.equal(rng.keyed_uniform(key, pos, purpose, lane), expect)
        assert torch.equal(rng.keyed_uniform(key, pos, purpose, torch.tensor(lane)), expect)
        assert torch.equal(rng.draw(key, pos, rng.stream_word(purpose, lane)), expect)
        assert expect.tolist() == [[rng.reference_uniform(int(s), int(p), purpose, lane) for p in pos[0]]
                                   for s in seeds[:, 0]]
    lanes = torch.arange(4)
    assert torch.equal(rng.keyed_uniform(rng.seed_key(seeds)[..., None], pos[..., None], rng.RECOVER, lanes),
                       rng.uniform(seeds[..., None], pos[..., None], rng.RECOVER, lanes))
    words = torch.tensor([rng.stream_word(rng.DRAFT), rng.stream_word(rng.RECOVER, 3)])
    both = rng.draw(rng.seed_key(seeds), pos[:, :1] + torch.tensor([0, 2]), words)  # one evaluation
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
