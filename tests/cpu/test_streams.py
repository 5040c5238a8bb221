"""Stream heads as the drafter (`engine.models.streams`): the rules stay exact with proposals from
the target's own hidden states. Greedy parity with `ar` for every rule, the exact rule's law at
the first two generated positions (proposals made at admission and after a round), and the
invariant the round keeps: each row's heads' states are those a fresh forward over its committed
tokens gives, PCG's fallback rows included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from engine.config import Warp
from engine.decoding.speculative import Request, SpeculativeDecoder
from engine.decoding.verify import ExactRule, PCGRule, SSDRule, TopKRule
from engine.models.streams import StreamHeads, StreamShape, load_streams

from synthhelpers import TEXTS


@pytest.fixture(scope="module")
def heads64(synth64, kit_dir):
    """The kit's trained stream heads in float64."""
    return load_streams(kit_dir / "streams", synth64.target.model)


GREEDY = Warp(0.0)


def requests(synth, texts, rule, warp=GREEDY, max_new_tokens=40):
    return [Request(key=i, prompt_ids=synth.prompter.build(t), seed=i, max_new_tokens=max_new_tokens, warp=warp,
                    rule=rule) for i, t in enumerate(texts)]


def decode(synth, drafter, gamma, reqs, batch):
    decoder = SpeculativeDecoder(synth.target.model, drafter, gamma, batch, 512, synth.layout.output_space())
    return {r.key: res for r, res in decoder.run(reqs)}


@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_rules_with_stream_heads_equal_greedy_ar(synth64, heads64, batch):
    ar = decode(synth64, None, 0, requests(synth64, TEXTS, None), 4)
    groups = synth64.groups(1.0)  # singletons: greedy PCG with wider groups may emit the argmax's group mates
    for rule, gamma in ((ExactRule(), 3), (PCGRule(groups), 4), (SSDRule(0.5), 2), (TopKRule(5), 1)):
        got = decode(synth64, heads64, gamma, requests(synth64, TEXTS, rule), batch)
        assert {k: r.codes for k, r in got.items()} == {k: r.codes for k, r in ar.items()}, type(rule).__name__
        # the heads were trained: some proposal is accepted
        assert sum(sum(r.stats.accepted) for r in got.values()) > 0


def test_gamma_beyond_the_heads_is_refused(synth64, heads64):
    with pytest.raises(ValueError, match="gamma 5 needs 5 stream heads; these have 4"):
        SpeculativeDecoder(synth64.target.model, heads64, 5, 2, 256, synth64.layout.output_space())


@pytest.mark.parametrize("gamma", [1, 2])
def test_exact_rule_keeps_the_targets_law_at_the_first_two_positions(kit_synth, kit_dir, gamma):
    """1,000 rows of one prompt at temperature 1, top-4: the first generated token (proposed from
    the heads' states made at admission) follows the target's top-4 law at the prompt, the second
    (at gamma 1 proposed from the states a round left, at gamma 2 often by the second head in the
    same round) its law after the most frequent first token."""
    synth, target = kit_synth, kit_synth.target.model
    heads = load_streams(kit_dir / "streams", target)
    n, k = 1000, 4
    prompt = synth.prompter.build("Hello there.")
    rule, warp = ExactRule(), Warp(1.0, top_k=k)  # one rule object: the rows share one judge
    reqs = [Request(key=i, prompt_ids=prompt, seed=10_000 + i, max_new_tokens=2, warp=warp, rule=rule)
            for i in range(n)]
    rows = decode(synth, heads, gamma, reqs, 100)
    first = np.array([rows[i].codes[0] for i in range(n)])
    second = np.array([rows[i].codes[1] if len(rows[i].codes) > 1 else -1 for i in range(n)])

    def law(prefix_codes):
        ids = torch.tensor(prompt + synth.layout.token_ids(prefix_codes))[None]
        cache = target.new_cache(1, ids.shape[1])
        logits = target(ids, torch.arange(ids.shape[1])[None], cache, ids.shape[1], logits_at="last")[0, -1]
        top = logits.topk(k)
        probs = torch.softmax(top.values.double(), -1).numpy()
        return top.indices.numpy(), probs / probs.sum()

    def fit(observed_codes, prefix_codes):
        support, probs = law(prefix_codes)
        assert np.isin(observed_codes, support).all()  # top-k: nothing outside the target's top 4
        counts = np.array([(observed_codes == c).sum() for c in support])
        return chisquare(counts, probs * counts.sum()).pvalue

    assert fit(first, []) > 1e-3
    common = np.bincount(first).argmax()
    after = second[(first == common) & (second >= 0)]
    assert len(after) > 200
    assert fit(after, [int(common)]) > 1e-3


def test_heads_states_match_a_fresh_forward_after_every_round(synth64, heads64):
    """PCG with one thinning trial at temperature 1 leaves many rows to the exact fallback after
    the round: their heads' states are redone from the token drawn then. After every round each
    active row's states equal the heads over a fresh forward of its committed tokens."""
    synth, target = synth64, synth64.target.model
    rule = PCGRule(synth.groups(0.4), max_trials=1)
    decoder = SpeculativeDecoder(target, heads64, 3, 4, 512, synth.layout.output_space())
    decoder.submit(requests(synth, TEXTS[:6], rule, Warp(1.0), max_new_tokens=30))
    st, checked = decoder.state, 0
    while not decoder.idle:
        decoder.advance()
        for slot in decoder.owner:
            n = int(st.seq_len[slot])
            ids = st.tokens[slot, :n][None]
            cache = target.new_cache(1, n)
            h = target(ids[:, :-1], torch.arange(n - 1)[None], cache, n, logits_at="normed")[0, -1]
            fresh = heads64.follow(target, h, ids[0, -1])
            assert torch.allclose(st.stream_state[slot], fresh, atol=1e-9), (slot, n)
            checked += 1
    assert checked > 20 and decoder.fallbacks_fixed > 0


def test_heads_fit_only_their_target(synth64):
    wrong = StreamHeads(StreamShape(hidden_size=64, heads=2, intermediate_size=64))
    with pytest.raises(ValueError, match="hidden size 64 cannot run on a target of hidden size 128"):
        SpeculativeDecoder(synth64.target.model, wrong, 2, 2, 256, synth64.layout.output_space())


def test_a_compiled_round_with_stream_heads_gives_the_eager_codes(kit_dir):
    """The heads run inside the round's one graph (`compile: inductor`, fullgraph): sampled rows
    decode to the eager round's codes."""
    from engine import DecodingSettings, Synthesizer

    settings = DecodingSettings(method="exact", gamma=2, temperature=0.8, max_new_tokens=16, seed=3)
    codes = {}
    for mode in ("none", "inductor"):
        synth = Synthesizer.load(kit_dir / "target", draft=kit_dir / "streams", device="cpu", dtype="float32",
                                 batch_size=2, compile=mode)
        results, _ = synth.synthesize(TEXTS[:2], settings)
        codes[mode] = [r.codes for r in results]
        assert synth.runner.stats.graph_launches == (0 if mode == "none" else synth.runner.stats.rounds)
    assert codes["none"] == codes["inductor"] and all(codes["none"])


def test_orpheus_kit_streams_keep_greedy_parity_and_whole_frames(orpheus64, orpheus_kit_dir):
    """Orpheus's framed output space: proposals from the kit's heads are masked to their frame
    position like the target's, greedy `pcg` (singleton groups) and `exact` equal `ar`, and rows
    hold whole 7-code frames."""
    synth, target = orpheus64, orpheus64.target.model
    heads = load_streams(orpheus_kit_dir / "streams", target)
    texts = TEXTS[:4]
    ar = decode(synth, None, 0, requests(synth, texts, None, max_new_tokens=42), 4)
    for rule, gamma in ((ExactRule(), 4), (PCGRule(synth.groups(1.0)), 3)):
        got = decode(synth, heads, gamma, requests(synth, texts, rule, max_new_tokens=42), 2)
        assert {k: r.codes for k, r in got.items()} == {k: r.codes for k, r in ar.items()}
        assert all(len(r.codes) % 7 == 0 for r in got.values())
