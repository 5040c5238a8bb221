"""The sampler and the counter-based random numbers."""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import chisquare, kstest
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from engine.config import Warp
from engine.decoding import rng
from engine.decoding.sampling import DRAW_BLOCK, nucleus, nucleus_sorted, sample_blocked, sample_from, warp_probs


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


def test_blocked_draws_are_the_sequential_ones_and_a_compiled_graph_takes_them():
    """`sample_blocked` (a compiled round's draws on a CPU) gives `sample_from`'s tokens on random
    rows of a vocabulary of many blocks, never a zero-mass token (zero blocks, zero tails, u at 0
    and at its largest), and follows the law; only the order of the float64 additions differs,
    which a compiled `sample_from` shows where rounding decides."""
    gen = torch.Generator().manual_seed(5)
    vocab = 3 * DRAW_BLOCK + 17
    probs = torch.softmax(torch.randn(64, vocab, generator=gen) * 4, -1)
    probs[:, torch.randint(0, vocab, (200,), generator=gen)] = 0
    probs[::3, DRAW_BLOCK:2 * DRAW_BLOCK] = 0  # a whole block without mass
    probs[1::3, -40:] = 0  # the last tokens and the partial last block without mass
    u = torch.rand(64, 8, dtype=torch.float64, generator=gen)
    u[:, 0], u[:, 1] = 0.0, 1 - 2**-53
    blocked = sample_blocked(probs, u)
    assert (probs.gather(1, blocked) > 0).all()
    assert torch.equal(blocked[:, 2:], sample_from(probs, u)[:, 2:])

    law = torch.softmax(torch.randn(vocab, generator=gen, dtype=torch.float64), -1).float()
    draws = sample_blocked(law.expand(200_000, -1), torch.rand(200_000, 1, dtype=torch.float64, generator=gen))
    counts = np.bincount(draws[:, 0].numpy(), minlength=vocab)
    assert chisquare(counts, law.double().numpy() / law.double().sum().item() * 200_000).pvalue > 1e-3

    # 2**-53 added to 1 rounds away one token at a time, not as a block's sum: the two orders differ
    tiny = torch.zeros(1, 2 * DRAW_BLOCK)
    tiny[0, 0], tiny[0, DRAW_BLOCK:] = 1.0, 2.0**-53
    top = torch.tensor([[1 - 2**-53]], dtype=torch.float64)
    assert int(sample_from(tiny, top)) == 0 and int(sample_blocked(tiny, top)) >= DRAW_BLOCK
    compiled = torch.compile(sample_from, fullgraph=True, dynamic=False)
    assert torch.equal(compiled(tiny, top), sample_blocked(tiny, top))
    assert torch.equal(compiled(probs, u), blocked)


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


def test_nucleus_keeps_the_tokens_a_sort_of_the_whole_vocabulary_keeps():
    # the CPU's head-first nucleus against the full (stable) sort, value for value: peaked rows
    # (edge in the first head), broader ones (the second head or a sort), equal probabilities
    # (bfloat16 logits make many), per-row top-p, rows skipped (returned as they are)
    gen = torch.Generator().manual_seed(1)
    for trial in range(45):
        vocab = (65537, 3000, 9000)[trial % 3]
        scale = (0.5, 1.0, 3.0, 8.0, 20.0)[trial % 5]
        logits = torch.randn(6, 3, vocab, generator=gen) * scale
        p = torch.softmax(logits.bfloat16().float() if trial % 4 == 1 else logits, -1)
        if trial % 4 == 0:  # many equal probabilities
            p = (p * 3e3).round() / 3e3 + 1e-9
            p = p / p.sum(-1, keepdim=True)
        top = torch.rand(6, 1, 1, generator=gen) * 0.98 + 0.01
        top[0] = 1.0
        skip = (torch.rand(6, 1, 1, generator=gen) < 0.3).expand(6, 3, 1)
        assert torch.equal(nucleus(p, top, skip=skip), torch.where(skip, p, nucleus_sorted(p, top))), trial
        assert torch.equal(nucleus(p, 0.9), nucleus_sorted(p, 0.9)), trial


class Sorts(TorchDispatchMode):
    """Counts the rows of every sort dispatched."""

    def __init__(self):
        super().__init__()
        self.rows = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.sort.default or func is torch.ops.aten.sort.stable:
            self.rows.append(args[0].shape[0])
        return func(*args, **(kwargs or {}))


def test_nucleus_sorts_only_rows_whose_edge_lies_past_the_heads_and_ties_keep_the_lowest_ids():
    vocab = 65537
    peaked = torch.softmax(torch.randn(3, vocab, generator=torch.Generator().manual_seed(0)) * 8, -1)
    flat = torch.full((1, vocab), 1.0 / vocab) + torch.arange(vocab) * 1e-12  # its edge is past 8,192 tokens
    tied = torch.zeros(1, vocab)
    tied[0, :4] = torch.tensor([0.3, 0.2, 0.2, 0.1])
    tied[0, 4:] = 0.2 / (vocab - 4)  # top-p 0.45 ends between the two tokens of 0.2
    probs = torch.cat([peaked, flat, tied])
    with Sorts() as sorts:
        out = nucleus(probs, 0.45)
    assert sorts.rows == [1]  # the flat row, sorted whole; the peaked and the tied rows not
    assert torch.equal(out, nucleus_sorted(probs, 0.45))
    assert torch.equal(out[4] > 0, torch.arange(vocab) < 2)  # of the two tokens at 0.2, the lower id stays
    reversed_ties = tied.clone()
    reversed_ties[0, 1:3] = torch.tensor([0.2, 0.2])
    reversed_ties[0, 0], reversed_ties[0, 3] = 0.1, 0.3  # now ids 1 and 2 tie, after 3
    assert torch.equal(nucleus(reversed_ties, 0.45)[0] > 0, torch.tensor([0, 1, 3]).new_zeros(vocab).index_fill(
        0, torch.tensor([1, 3]), 1).bool())
    with Sorts() as sorts:
        head_only = nucleus(peaked, 0.45)
    assert sorts.rows == []
    assert torch.equal(head_only, nucleus_sorted(peaked, 0.45))


def test_a_compiled_graph_calls_the_eager_nucleus_whole():
    """A compiled round reaches the CPU nucleus as one op (`pcg_synth::nucleus_keep`): the same
    kept tokens and the same per-row choices, seen from inside the graph by the profiler (which
    rows each head's top-k and the sort take)."""
    vocab, gen = 65537, torch.Generator().manual_seed(2)
    peaked = torch.softmax(torch.randn(2, vocab, generator=gen) * 8, -1)
    broad = torch.full((1, vocab), 0.1 / (vocab - 3000))
    broad[0, :3000] = 0.9 * torch.softmax(torch.randn(3000, generator=gen) * 0.1, -1)  # edge near token 1,500
    flat = torch.full((1, vocab), 1.0 / vocab) + torch.arange(vocab) * 1e-12  # edge past 8,192 tokens
    probs, limit = torch.cat([peaked, broad, flat]), torch.full((4, 1), 0.45)
    compiled = torch.compile(lambda p, t, s: nucleus(p, t, skip=s), fullgraph=True)
    for skip, topk_rows, sorted_rows in (([False] * 4, [4, 2], [1]), ([False] * 3 + [True], [3, 1], [])):
        skip = torch.tensor(skip)[:, None]
        compiled(probs, limit, skip)  # compiled at its first call
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            out = compiled(probs, limit, skip)
        rows = {name: [e.input_shapes[0][0] for e in prof.events() if e.name == name]
                for name in ("aten::topk", "aten::sort")}
        assert (rows["aten::topk"], rows["aten::sort"]) == (topk_rows, sorted_rows)
        expected = torch.where(skip, probs, nucleus_sorted(probs, limit))
        assert torch.equal(out > 0, expected > 0) and torch.equal(out[skip[:, 0]], probs[skip[:, 0]])
