"""`gamma: auto` on real models with real timings: on for a cheap, accurate draft at batch 1;
off where a huge batch makes the verify step cost as much as gamma + 1 target steps."""

from __future__ import annotations

import shutil

import pytest

from engine import DecodingSettings, Synthesizer
from engine.decoding.adaptive import choose_gamma, expected_length
from engine.kit import build as tiny
from engine.kit.tokenizer import build_tokenizer
from engine.models.llasa import LlasaLayout


@pytest.fixture(scope="module")
def cheap_draft_pair(tmp_path_factory):
    """A 6-layer target with wide MLPs whose layers 1-5 barely touch the residual stream, and
    a draft of its layer 0: nearly the same distributions at a fraction of the compute."""
    root = tmp_path_factory.mktemp("pair")
    tok = build_tokenizer(root / "tok")
    layout = LlasaLayout.from_tokenizer(tok)
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


def test_auto_speculates_at_batch_one_with_a_cheap_accurate_draft(cheap_draft_pair):
    results, summary = cheap_draft_pair.synthesize(
        TEXTS, DecodingSettings(method="exact", gamma="auto", max_new_tokens=24), batch_size=1)
    choice = summary.gamma_choice
    assert choice["gamma"] > 0, choice
    assert choice["acceptance"] > 0.8 and "predicts" in choice["reason"]
    assert choice["predicted_speedup"][choice["gamma"]] > 1.05
    assert summary.stats.drafted > 0 and all(r.codes for r in results)


def test_auto_turns_speculation_off_when_verification_is_expensive(cheap_draft_pair):
    synth = cheap_draft_pair
    _, pilot = synth.synthesize(TEXTS, DecodingSettings(method="exact", gamma=4, max_new_tokens=24))
    acceptance = sum(pilot.stats.accepted) / pilot.stats.drafted  # measured, not assumed
    at_one = choose_gamma(synth.target.model, synth.draft.model, 1, acceptance, 64, candidates=(3, 8), reps=3)
    huge = choose_gamma(synth.target.model, synth.draft.model, 384, acceptance, 64, candidates=(3, 8), reps=3)
    assert at_one.gamma > 0, at_one.reason
    assert huge.gamma == 0 and huge.reason.startswith("speculation off"), huge.reason
    for g in (3, 8):  # the measured verify step grew relative to an ar step at the huge batch
        ratio_one = at_one.step_times[g]["verify_s"] / at_one.step_times[g]["ar_s"]
        ratio_huge = huge.step_times[g]["verify_s"] / huge.step_times[g]["ar_s"]
        assert ratio_huge > ratio_one


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
