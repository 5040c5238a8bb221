"""Per-row settings in one batch: each row decodes exactly as it would alone with its own
settings (float64 on the kit, as the batch-independence tests in test_decoding.py), whatever
the batch size, the slot it lands in or the rows beside it; and the streaming API."""

from __future__ import annotations

import pytest

from engine import DecodingSettings, SynthesisItem
from engine.config import TextSpec

from synthhelpers import TEXTS, by_id

ITEMS = [
    SynthesisItem(text=TEXTS[0], id="hot", temperature=1.3),
    SynthesisItem(text=TEXTS[1], id="greedy", temperature=0),
    SynthesisItem(text=TEXTS[2], id="nucleus", top_p=0.85),
    SynthesisItem(text=TEXTS[3], id="topk", top_k=40, temperature=1.1),
    SynthesisItem(text=TEXTS[4], id="penalty", repetition_penalty=1.4, prompt_text="Before.",
                  prompt_codes=[7, 7, 9000, 31]),
    SynthesisItem(text=TEXTS[5], id="short", seed=11, max_new_tokens=7),
    SynthesisItem(text=TEXTS[6], id="greedy-penalty", temperature=0, repetition_penalty=1.3),
    SynthesisItem(text=TEXTS[7], id="plain"),  # the call's settings
]
ORDERS = {"as given": [0, 1, 2, 3, 4, 5, 6, 7], "reversed": [7, 6, 5, 4, 3, 2, 1, 0],
          "shuffled": [3, 6, 0, 5, 2, 7, 1, 4]}


@pytest.mark.parametrize("method", ["pcg", "ar"])
def test_rows_with_different_sampling_settings_in_one_batch_decode_as_alone(synth64, kit_groups, method):
    settings = DecodingSettings(method=method, theta=kit_groups.theta, max_new_tokens=20, seed=5)
    alone = {}
    for item in ITEMS:
        alone.update(by_id(synth64.synthesize([item], settings, batch_size=1)[0]))
    assert len({tuple(codes) for codes, _, _ in alone.values()}) == len(ITEMS)
    for (name, order), batch in zip(ORDERS.items(), (8, 3, 5)):
        results, summary = synth64.synthesize([ITEMS[i] for i in order], settings, batch_size=batch)
        assert by_id(results) == alone, f"order {name}, batch {batch}"
        if batch == len(ITEMS):  # one batch: every row decoded side by side from the first round
            assert summary.decode_rounds == max(r.stats.rounds for r in results)
    assert len(alone["short"][0]) <= 7


def test_rows_with_different_rules_share_one_decoder(synth64, kit_groups):
    base = DecodingSettings(theta=kit_groups.theta, max_new_tokens=24, seed=2, gamma=3)
    methods = ["pcg", "exact", "ssd", "topk", "pcg", "exact"]
    temps = [0.8, 0.8, 1.0, 0.9, 0, 0.7]
    rows = [(base.model_copy(update={"method": m, "temperature": t}), SynthesisItem(text=TEXTS[i], id=str(i)))
            for i, (m, t) in enumerate(zip(methods, temps))]
    alone = {}
    for settings, item in rows:
        alone.update(by_id(synth64.synthesize([item], settings, batch_size=1)[0]))
    session = synth64.session(4)
    prepared = [(settings, synth64.prepare(i, item, settings)) for i, (settings, item) in enumerate(rows)]
    session.submit([(settings, request) for settings, (_, request) in prepared])
    mixed = {}
    while not session.idle:
        for request, row in session.step():
            mixed[str(request.key)] = (row.codes, row.finish_reason, row.stats.to_dict())
    assert mixed == alone
    assert len(session.scheduler.used) == 1  # one decoder, rules per row


def test_stream_yields_each_item_once_as_rows_finish(kit_synth):
    settings = DecodingSettings(method="exact", max_new_tokens=30, seed=4)
    items = [SynthesisItem(text=t, id=f"i{n}", temperature=0.5 + 0.1 * n) for n, t in enumerate(TEXTS[:5])]
    items.insert(2, SynthesisItem(text="Bad setting.", id="bad", top_p=1.5))
    items.append(SynthesisItem(text="", id="empty"))
    streamed = list(kit_synth.stream(items, settings, batch_size=2))
    assert sorted(r.id for r in streamed) == sorted(i.id for i in items)
    assert [r.id for r in streamed[:2]] == ["bad", "empty"]  # errors come first
    assert "top_p" in streamed[0].error and streamed[0].finish_reason == "error"
    results, summary = kit_synth.synthesize(items, settings, batch_size=2)
    assert {r.id: r.codes for r in streamed} == {r.id: r.codes for r in results}
    assert summary.ok == 5 and summary.failed == 2


def test_warmup_runs_the_callers_decoder_and_changes_no_result(synth64, kit_groups):
    settings = DecodingSettings(method="pcg", theta=kit_groups.theta, max_new_tokens=20, seed=5)
    expected = by_id(synth64.synthesize(ITEMS[:4], settings, batch_size=3)[0])
    results = synth64.warmup(settings, batch_size=3)
    assert len(results) == 5 and all(r.error is None and r.codes for r in results)  # a batch and a half
    assert max(len(r.codes) for r in results) > 10  # long enough to reach the longer key lengths
    decoder = synth64.decoder(settings, 3)  # what a run at this batch size decodes with: the warmed one
    assert decoder.rounds_run > 0 and decoder.idle
    assert by_id(synth64.synthesize(ITEMS[:4], settings, batch_size=3)[0]) == expected


def test_a_budget_above_the_context_is_an_items_error_and_a_calls_refusal(kit_synth):
    context = kit_synth.max_context  # the kit's family's (Llasa's 2048)
    over = f"max_new_tokens: {context + 1} is above the llasa model's context of {context} tokens"
    items = [SynthesisItem(text=TEXTS[0], id="ok"),
             SynthesisItem(text=TEXTS[1], id="over", max_new_tokens=context + 1),
             SynthesisItem(text=TEXTS[2], id="hot", temperature=1e9),
             SynthesisItem(text=TEXTS[3], id="own", max_new_tokens=5)]
    settings = DecodingSettings(method="exact", max_new_tokens=12, seed=3)
    for text in (None, TextSpec()):  # as given, and planned first (as a job's worker prepares its rows)
        results, summary = kit_synth.synthesize(items, settings, text=text)
        assert [r.finish_reason == "error" for r in results] == [False, True, True, False]
        assert results[1].error.startswith(over) and "temperature" in results[2].error
        assert 0 < len(results[0].codes) <= 12 and 0 < len(results[3].codes) <= 5 and summary.failed == 2
    with pytest.raises(ValueError, match=f"^max_new_tokens: {10**12} is above the llasa model's context of {context}"):
        kit_synth.synthesize(items[:1], settings.model_copy(update={"max_new_tokens": 10**12}))
