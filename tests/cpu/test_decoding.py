"""The batched loop on the tiny kit: greedy equivalence, continuous batching, stops, limits.

float64 models make the target's logits independent of batch shape to far below any gap that
could flip a greedy argmax or a sampled token, so batched results can be compared exactly.
"""

from __future__ import annotations

import logging

import pytest
import torch

from engine import DecodingSettings, SynthesisItem, Synthesizer
from engine.decoding import rng

from synthhelpers import TEXTS


def codes_of(results):
    return [r.codes for r in results]


@pytest.fixture(scope="module")
def greedy_reference(synth64):
    results, _ = synth64.synthesize(TEXTS, DecodingSettings(method="ar", temperature=0, max_new_tokens=24),
                                    batch_size=1)
    assert all(r.finish_reason in ("eos", "length") for r in results)
    assert len({tuple(c) for c in codes_of(results)}) == len(TEXTS), "outputs must differ by text"
    return codes_of(results)


@pytest.mark.parametrize("batch_size", range(1, 9))
def test_greedy_exact_equals_greedy_target_for_every_batch_size(synth64, greedy_reference, batch_size):
    settings = DecodingSettings(method="exact", temperature=0, gamma=3, max_new_tokens=24)
    results, summary = synth64.synthesize(TEXTS, settings, batch_size=batch_size)
    assert codes_of(results) == greedy_reference
    assert summary.stats.drafted > 0


@pytest.mark.parametrize("method", ["ssd", "topk", "ar"])
@pytest.mark.parametrize("batch_size", [3, 8])
def test_greedy_other_rules_equal_greedy_target(synth64, greedy_reference, method, batch_size):
    settings = DecodingSettings(method=method, temperature=0, gamma=4, max_new_tokens=24)
    results, _ = synth64.synthesize(TEXTS, settings, batch_size=batch_size)
    assert codes_of(results) == greedy_reference


def test_greedy_pcg_with_singleton_groups_equals_greedy_target(synth64, greedy_reference):
    settings = DecodingSettings(method="pcg", theta=1.0, temperature=0, max_new_tokens=24)
    results, _ = synth64.synthesize(TEXTS, settings, batch_size=5)
    assert codes_of(results) == greedy_reference


def test_greedy_pcg_emits_only_group_mates_of_the_target_argmax(synth64, kit_groups):
    settings = DecodingSettings(method="pcg", theta=kit_groups.theta, temperature=0, max_new_tokens=24)
    results, summary = synth64.synthesize(TEXTS[:4], settings, batch_size=4)
    model, layout = synth64.target.model, synth64.target.layout
    swapped = 0
    for text, res in zip(TEXTS, results):
        prompt = synth64.prompter.build(text)
        ids = prompt + [layout.first_code + c for c in res.codes]
        tokens, pos = torch.tensor([ids]), torch.arange(len(ids))[None]
        logits = model(tokens, pos, model.new_cache(1, len(ids) + 1), len(ids))[0]
        argmax = logits[len(prompt) - 1: len(ids) - 1].argmax(-1).tolist()
        for code, best in zip(res.codes, argmax):
            assert code in set(kit_groups.group_of(best).tolist())
            swapped += code != best
    assert swapped > 0, "PCG should accept some group-mates that are not the argmax"
    assert summary.stats.mean_accepted_length > 1.0


@pytest.mark.parametrize("method", ["exact", "pcg", "ssd", "topk", "ar"])
def test_sampling_is_independent_of_batch_composition(synth64, kit_groups, method):
    settings = DecodingSettings(method=method, theta=kit_groups.theta, max_new_tokens=40, seed=7)
    one, single = synth64.synthesize(TEXTS, settings, batch_size=1)
    many, summary = synth64.synthesize(TEXTS, settings, batch_size=3)  # 8 items through 3 slots
    assert codes_of(one) == codes_of(many)
    assert single.slot_utilisation == 1.0
    assert 0.5 < summary.slot_utilisation < 1.0  # refilled while the queue lasts, drains at the end
    assert [r.finish_reason for r in one] == [r.finish_reason for r in many]
    assert summary.ok == len(TEXTS)


def test_an_ar_decoders_draws_are_its_rows_keyed_uniforms(kit_synth):
    """An `ar` decoder makes a row's uniforms when it admits the row (`RoundState.ar_draws`, read
    by each round instead of evaluating the hash): at every position the row may draw at they are
    the keyed hash's, in whichever slot it lands and whatever row held the slot before."""
    settings = DecodingSettings(method="ar", max_new_tokens=24, seed=5)
    decoder = kit_synth.make_decoder(settings, 2)
    requests = [kit_synth.prepare(i, TEXTS[i], settings)[1] for i in range(4)]
    requests[0].max_new_tokens = 40  # a longer row first: its slot's next row reaches less far
    decoder.submit(requests)
    checked = set()
    while not decoder.idle:
        for slot, request in decoder.owner.items():
            if request.key in checked:
                continue
            start = len(request.prompt_ids)
            at = torch.arange(start, min(start + request.max_new_tokens, decoder.max_len))
            expected = rng.uniform(torch.tensor([request.seed]), at, rng.BONUS)
            assert torch.equal(decoder.state.ar_draws[slot, at], expected)
            checked.add(request.key)
        decoder.advance()
    assert checked == {r.key for r in requests}


def test_seeded_runs_are_bit_reproducible_and_seeds_matter(kit_synth, kit_groups):
    kit_synth.set_groups(kit_groups)
    settings = DecodingSettings(method="pcg", theta=kit_groups.theta, max_new_tokens=40, seed=3)
    a, sa = kit_synth.synthesize(TEXTS[:4], settings)
    b, sb = kit_synth.synthesize(TEXTS[:4], settings)
    assert codes_of(a) == codes_of(b)
    assert [r.stats.to_dict() for r in a] == [r.stats.to_dict() for r in b]
    c, _ = kit_synth.synthesize(TEXTS[:4], settings.model_copy(update={"seed": 4}))
    assert codes_of(c) != codes_of(a)
    # an explicit item seed overrides the derived one and reproduces alone
    item = SynthesisItem(text=TEXTS[1], id="x", seed=a[1].seed)
    alone, _ = kit_synth.synthesize([item], settings)
    assert alone[0].codes == a[1].codes


def test_stops_at_end_of_speech_or_length_and_counts_consistently(kit_synth):
    settings = DecodingSettings(method="exact", max_new_tokens=150, seed=1)
    results, summary = kit_synth.synthesize(TEXTS * 2, settings)
    reasons = {r.finish_reason for r in results}
    assert reasons == {"eos", "length"}, "the kit must produce both endings at this budget"
    for r in results:
        assert all(0 <= c < 65536 for c in r.codes)
        extra = 1 if r.finish_reason == "eos" else 0
        assert r.stats.generated_tokens == len(r.codes) + extra
        if r.finish_reason == "length":
            assert len(r.codes) == 150
        assert sum(r.stats.accepted) <= sum(r.stats.reached) == r.stats.drafted
        assert r.stats.emitted >= r.stats.generated_tokens
    assert summary.stats.generated_tokens == sum(r.stats.generated_tokens for r in results)
    assert summary.cut == summary.to_dict()["cut"] == sum(r.finish_reason == "length" for r in results)


def test_max_speech_ratio_cuts_a_row_at_its_texts_budget_and_leaves_its_codes(synth64):
    from engine.decoding.admission import speech_budget

    # which rows run past their budget depends on the processor: the kit built on another kind has
    # other bytes (README, the tiny kit), so its seeded rows draw other codes; eight rows (two texts,
    # four seeds each) are enough to hold rows of both kinds on either kind of processor
    items = [SynthesisItem(text=t, id=f"{t}-{k}") for t in ("Hi.", "Call Stella.") for k in range(4)]
    assert [speech_budget(it.text, 1.0, 50) for it in items] == [110] * 4 + [140] * 4  # (chars / 15 + 2 s) x 50
    assert speech_budget("Hi.", 2.5, 50) == 125
    settings = DecodingSettings(method="pcg", max_new_tokens=141, seed=1)  # past every budget here
    full, _ = synth64.synthesize(items, settings)
    capped, summary = synth64.synthesize(items, settings.model_copy(update={"max_speech_ratio": 1.0}))
    over = [len(f.codes) > speech_budget(it.text, 1.0, 50) for it, f in zip(items, full)]
    assert any(over) and not all(over)
    for it, f, c in zip(items, full, capped):
        budget = speech_budget(it.text, 1.0, 50)
        assert c.codes == f.codes[:budget]  # the same row, cut at its budget: the codes before it unchanged
        assert c.finish_reason == ("length" if len(f.codes) >= budget else f.finish_reason)
    assert summary.cut == sum(c.finish_reason == "length" for c in capped) >= sum(over)


def test_bad_items_become_error_results_and_the_rest_proceed(kit_dir):
    synth = Synthesizer.load(kit_dir / "target", draft=kit_dir / "draft", device="cpu",
                             batch_size=2, max_context=96)
    short = "Hello."
    prompt_len = len(synth.prompter.build(short))
    items = [short, "", "word " * 200, SynthesisItem(text=short, prompt_codes=[70000]),
             SynthesisItem(text="Second.", id="b"), "word " * 2500]
    notices = []
    handler = logging.Handler()
    handler.emit = lambda record: notices.append(record.getMessage())
    logging.getLogger("transformers").addHandler(handler)  # transformers' loggers do not propagate
    try:
        results, summary = synth.synthesize(items, DecodingSettings(method="ar", max_new_tokens=96))
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert [r.finish_reason for r in results] == ["length", "error", "error", "error", "length", "error"]
    assert "empty" in results[1].error
    assert "context" in results[2].error
    assert "outside" in results[3].error
    assert len(results[0].codes) == 96 - prompt_len  # cut by the context, not the budget
    assert summary.ok == 2 and summary.failed == 4
    assert results[4].id == "b"
    # longer than the tokenizer's model_max_length (2048): only the engine's error, not
    # transformers' notice that running it "will result in indexing errors"
    assert "context" in results[5].error
    assert not [n for n in notices if "indexing errors" in n]


def test_voice_prompt_codes_follow_speech_start(kit_synth):
    layout = kit_synth.target.layout
    ids = kit_synth.prompter.build("New words.", prompt_text="Old words.", prompt_codes=[5, 6, 7])
    assert ids[-4:] == [layout.control("speech_start")] + [layout.first_code + c for c in (5, 6, 7)]
    text = kit_synth.target.tokenizer.decode(ids)
    assert "Old words. New words." in text and "26 Jul 2024" in text
    item = SynthesisItem(text="New words.", prompt_text="Old words.", prompt_codes=[5, 6, 7])
    results, _ = kit_synth.synthesize([item], DecodingSettings(method="exact", max_new_tokens=20))
    assert results[0].stats.prompt_tokens == len(ids)
    assert 0 < len(results[0].codes) <= 20


def test_repetition_penalty_changes_output_identically_for_draft_and_target(synth64):
    base = DecodingSettings(method="ar", temperature=0, max_new_tokens=24)
    plain, _ = synth64.synthesize(TEXTS[:3], base)
    penalised, _ = synth64.synthesize(TEXTS[:3], base.model_copy(update={"repetition_penalty": 1.5}))
    assert codes_of(plain) != codes_of(penalised)
    spec, _ = synth64.synthesize(TEXTS[:3], base.model_copy(
        update={"repetition_penalty": 1.5, "method": "exact"}), batch_size=2)
    assert codes_of(spec) == codes_of(penalised)


def test_a_draft_keeps_the_targets_head_and_embeddings_once_and_decodes_the_same(kit_synth, kit_dir, kit_groups,
                                                                                   monkeypatch):
    """The kit's draft holds the target's head and input embeddings (the same values): the
    synthesizer keeps one copy of each, prepacked head included, and decodes the tokens a pair
    holding two copies decodes. A draft whose head differs keeps its own."""
    from engine.models.llama import LlamaLM

    target, draft = kit_synth.target.model, kit_synth.draft.model
    assert draft.head is target.head and draft.packed_head is target.packed_head is not None
    assert draft.model.embed_tokens is target.model.embed_tokens
    monkeypatch.setattr(LlamaLM, "share_tables", lambda self, source: [])
    apart = Synthesizer.load(kit_dir / "target", draft=kit_dir / "draft", device="cpu", dtype="float32",
                             batch_size=4)
    monkeypatch.undo()
    assert apart.draft.model.head is not apart.target.model.head
    kit_synth.set_groups(kit_groups)
    apart.set_groups(kit_groups)
    for method in ("pcg", "exact"):
        settings = DecodingSettings(method=method, theta=kit_groups.theta, max_new_tokens=40, seed=5)
        a, _ = kit_synth.synthesize(TEXTS[:4], settings)
        b, _ = apart.synthesize(TEXTS[:4], settings)
        assert codes_of(a) == codes_of(b) and sum(len(r.codes) for r in a) > 40
    # a head that differs in one value is not taken; the equal embeddings still are
    own = apart.draft.model
    with torch.no_grad():
        own.head[7, 3] += 1.0
    assert own.share_tables(apart.target.model) == ["embeddings"]
    assert own.head is not apart.target.model.head and own.model.embed_tokens is apart.target.model.model.embed_tokens
