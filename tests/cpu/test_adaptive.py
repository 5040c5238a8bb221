"""`gamma: auto` on real models with given step timings: on for a cheap, accurate draft at batch 1;
off where a huge batch makes the verify step cost as much as gamma + 1 target steps. The pilots'
acceptance is measured; step times are given, since times measured inside a test would make the
answer depend on the machine's load (`benchmarks/bench_round.py` measures round costs)."""

from __future__ import annotations

import shutil

import pytest

from engine import DecodingSettings, Synthesizer
from engine.decoding import adaptive
from engine.decoding.adaptive import decide, expected_length
from engine.families.llasa import FAMILY as LLASA
from engine.kit import build as tiny
from engine.kit.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def cheap_draft_pair(tmp_path_factory):
    """A 6-layer target with wide MLPs whose layers 1-5 barely touch the residual stream, and
    a draft of its layer 0: nearly the same distributions at a fraction of the compute."""
    root = tmp_path_factory.mktemp("pair")
    tok = build_tokenizer(root / "tok")
    layout = LLASA.layout(tok)
    spec = tiny.KitSpec(num_layers=6, intermediate_size=4096, draft_layers=(0,))
    gen = tiny.torch.Generator().manual_seed(0)
    cfg = tiny.llama_config(spec, len(tok), spec.num_layers, layout)
    tensors = tiny.random_llama(spec, cfg, gen, layout)
    for key in tensors:
        if key.startswith("model.layers.") and not key.startswith("model.layers.0.") and "norm" not in key:
            tensors[key] = tensors[key] * 1e-3
    tiny.save_checkpoint(root / "target", cfg, tensors, root / "tok")
    dcfg = tiny.llama_config(spec, len(tok), 1, layout)
    tiny.save_checkpoint(root / "draft", dcfg, tiny.layer_subset(tensors, spec.draft_layers), root / "tok")
    shutil.rmtree(root / "tok")
    return Synthesizer.load(root / "target", draft=root / "draft", device="cpu", dtype="float32", batch_size=1)


TEXTS = ["The quick brown fox.", "Call Stella and ask her.", "One, two, three."]


def cheap_draft_steps(target, draft, batch: int, gamma: int, context: int, reps: int = 10) -> dict:
    """Step times as a cheap draft at batch 1 has them (`cost.step_times`' keys): a verify of
    gamma + 1 tokens costs one `ar` step, a draft step a twentieth of one. Seconds long, so that
    the host time the pilot measures per round is small beside them whatever the machine's load."""
    ar_s = 1.0
    return {"ar_s": ar_s, "verify_s": ar_s, "draft_phase_s": 0.05 * ar_s * gamma, "draft_step_s": 0.05 * ar_s}


def test_auto_speculates_at_batch_one_with_a_cheap_accurate_draft(cheap_draft_pair, monkeypatch):
    """The whole path (pilot, choice, speculative decode) with the step times given
    (`cheap_draft_steps`) and the acceptance the pilot measures."""
    monkeypatch.setattr(adaptive, "step_times", cheap_draft_steps)
    cheap_draft_pair.forget_measurements()
    try:
        results, summary = cheap_draft_pair.synthesize(
            TEXTS, DecodingSettings(method="exact", gamma="auto", max_new_tokens=24), batch_size=1)
    finally:
        cheap_draft_pair.forget_measurements()  # the given times stay with this test
    choice = summary.gamma_choice
    assert choice["step_times"][choice["gamma"]]["ar_s"] == 1.0  # decided from the given times
    assert choice["gamma"] > 0, choice
    assert choice["acceptance"] > 0.8 and "predicts" in choice["reason"]
    assert choice["predicted_speedup"][choice["gamma"]] > 1.05
    assert summary.stats.drafted > 0 and all(r.codes for r in results)


def test_auto_turns_speculation_off_when_verification_is_expensive(cheap_draft_pair):
    """The decision from step times given here (at batch 1 a verify of gamma + 1 tokens costs
    about one `ar` step; at a huge batch about gamma + 1 of them), with the acceptance a real pilot
    measured: on at batch 1, off at the huge batch."""
    synth = cheap_draft_pair
    _, pilot = synth.synthesize(TEXTS, DecodingSettings(method="exact", gamma=4, max_new_tokens=24))
    acceptance = sum(pilot.stats.accepted) / pilot.stats.drafted  # measured, not assumed
    assert acceptance > 0.8

    def steps(ar_s: float, verify_per_token: float) -> dict:
        return {g: {"ar_s": ar_s, "verify_s": ar_s * max(1.0, verify_per_token * (g + 1)),
                    "draft_phase_s": 0.05 * ar_s * g, "draft_step_s": 0.05 * ar_s} for g in (3, 8)}
    at_one = decide(1, acceptance, steps(0.010, 0.28))
    huge = decide(384, acceptance, steps(0.100, 1.0))
    assert at_one.gamma > 0 and at_one.predicted_speedup[at_one.gamma] > 1.05, at_one.reason
    assert huge.gamma == 0 and huge.reason.startswith("speculation off"), huge.reason


def test_expected_length():
    assert expected_length(0.0, 3) == pytest.approx(1.0)
    assert expected_length(0.5, 1) == pytest.approx(1.5)
    assert expected_length(1.0, 3) == pytest.approx(4.0, rel=1e-3)


def test_gamma_setting_accepts_auto_and_rejects_nonsense():
    from pydantic import ValidationError

    assert DecodingSettings(gamma="auto").gamma == "auto"
    for bad in (0, 33, "fast"):
        with pytest.raises(ValidationError, match="gamma"):
            DecodingSettings(gamma=bad)


def test_round_tokens_moments():
    from engine.decoding.cost import round_tokens

    assert round_tokens(0.5, 1) == pytest.approx((1.5, 0.25))
    assert round_tokens(0.0, 4) == pytest.approx((1.0, 0.0))
    assert round_tokens(1.0, 4) == pytest.approx((5.0, 0.0))
    for a, g in ((0.3, 2), (0.6, 4)):
        assert round_tokens(a, g)[0] == pytest.approx(expected_length(a, g))


def simulated_drain(acceptance: float, gamma: int, tokens: int, batch: int, rows: int, trials: int, gen) -> float:
    """Monte Carlo of what `drain_factor` models: `rows` rows of `tokens` tokens over `batch`
    slots (continuous batching); speculative rounds emit 1 + accepted drafts (i.i.d. acceptance)
    per row, `ar` one token per row. Returns (tokens per round of the speculative batch / L) /
    (tokens per round of the `ar` batch)."""
    import torch

    ratios = []
    for _ in range(trials):
        left = [tokens] * min(rows, batch)  # tokens still to emit per busy slot
        queued, rounds, emitted = rows - len(left), 0, 0
        while left:
            rounds += 1
            draws = torch.rand(len(left), gamma, generator=gen) < acceptance
            got = (1 + draws.int().cumprod(1).sum(1)).tolist()
            nxt = []
            for rest, k in zip(left, got):
                emitted += min(k, rest)
                if rest > k:
                    nxt.append(rest - k)
                elif queued:
                    queued -= 1
                    nxt.append(tokens)
            left = nxt
        ar_rounds = tokens * rows / min(rows, batch)  # every ar row takes `tokens` rounds
        ratios.append(emitted / rounds / expected_length(acceptance, gamma) / (rows * tokens / ar_rounds))
    return sum(ratios) / len(ratios)


@pytest.mark.parametrize("acceptance,gamma,batch,rows", [(0.5, 1, 8, 8), (0.55, 3, 8, 8), (0.6, 4, 4, 4),
                                                          (0.55, 2, 8, 32)])
def test_drain_factor_matches_a_simulated_batch(acceptance, gamma, batch, rows):
    """The normal approximation of the slowest slot agrees with a simulation of the batch."""
    import torch

    from engine.decoding.cost import drain_factor

    model = drain_factor(acceptance, gamma, 64, batch, rows)
    simulated = simulated_drain(acceptance, gamma, 64, batch, rows, 300, torch.Generator().manual_seed(0))
    assert model < 1 and simulated < 1
    assert model == pytest.approx(simulated, abs=0.02), (model, simulated)


def test_drain_factor_vanishes_for_streams_and_long_jobs():
    from engine.decoding.cost import drain_factor

    assert drain_factor(0.5, 3, 64, 8, None) == 1.0  # a stream: no known end
    assert drain_factor(0.5, 3, 64, 1, 10) == 1.0  # one slot: nothing waits
    one_wave, many = drain_factor(0.5, 3, 64, 8, 8), drain_factor(0.5, 3, 64, 8, 8000)
    assert one_wave < 0.95 < many < 1.0
    assert drain_factor(0.5, 3, 64, 32, 32) < drain_factor(0.5, 3, 64, 2, 2)  # more slots, slower max


def test_decide_weighs_host_time_and_the_drain():
    """A draft that pays on forwards alone (1.09x) stops paying once the host's work per round
    or the wait for the slowest row at the end of a single batch is counted."""
    from engine.decoding.adaptive import decide, host_per_round

    steps = {1: {"ar_s": 0.100, "verify_s": 0.110, "draft_phase_s": 0.028, "draft_step_s": 0.028}}
    forwards = decide(8, 0.5, steps)  # L = 1.5: 1.5 x 100 / 138
    assert forwards.gamma == 1 and forwards.predicted_speedup[1] == pytest.approx(1.087, abs=1e-3)
    with_host = decide(8, 0.5, steps, host_s=0.014, pilot_gamma=4)
    assert host_per_round(0.014, 4, 1) == pytest.approx(0.007)
    assert with_host.gamma == 0 and with_host.reason.startswith("speculation off")
    drained = decide(8, 0.5, steps, tokens=64, rows=8)
    assert drained.gamma == 0 and drained.drain[1] < 1
    streamed = decide(8, 0.5, steps, tokens=64, rows=None)
    assert streamed.gamma == 1 and streamed.drain[1] == 1.0
