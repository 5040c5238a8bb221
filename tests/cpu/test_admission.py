"""Admission order: which queued row takes a free slot. Longest expected speech first leaves
short rows for the end, so the batch drains later; a row's codes never depend on the order."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from engine import DecodingSettings, SynthesisItem
from engine.config import ResourcesSpec
from engine.decoding.admission import AdmissionQueue, expected_tokens, speech_seconds


def req(name: str, priority: int, submission: int = 0) -> SimpleNamespace:
    return SimpleNamespace(name=name, priority=priority, submission=submission)


def test_the_queue_keeps_submissions_in_order_and_pops_each_highest_priority_first():
    q = AdmissionQueue()
    q.extend([req("a", 5), req("b", 9), req("c", 5), req("d", 0)])
    q.extend([req("e", 99, 1), req("f", 1, 1)])
    q.extend([req("g", 7)])  # queued later, but of the first submission (another structure group)
    assert len(q) == 7
    assert [r.name for r in q.pop(3)] == ["b", "g", "a"]  # equal priorities in arrival order
    q.extend([req("h", 1000, 2)])  # a later submission waits its turn
    assert [r.name for r in q.pop(10)] == ["c", "d", "e", "f", "h"]
    assert not q
    q.extend(req(n, 0) for n in "xyz")  # all equal: first in, first out
    assert [r.name for r in q.pop(3)] == ["x", "y", "z"]


def test_expected_tokens_follow_the_text_up_to_the_budget():
    short, long_ = "Hi there.", "It was the best of times, it was the worst of times, it was the age."
    assert expected_tokens(short, 1000, 50) < expected_tokens(long_, 1000, 50)
    assert expected_tokens(long_, 1000, 50) == round(len(long_) / 15 * 50)  # 15 letters/s, 50 codes/s
    assert expected_tokens(long_, 1000, 82) == round(len(long_) / 15 * 82)  # a family's own rate
    assert expected_tokens(long_, 40, 50) == 40  # the row's budget caps it
    # a CJK character is a syllable: said about as long as three letters
    assert speech_seconds("你好世界") == pytest.approx(speech_seconds("x" * 12))
    assert speech_seconds("こんにちは") == pytest.approx(speech_seconds("x" * 15))
    assert speech_seconds("café") == pytest.approx(speech_seconds("cafe"))


def test_an_unknown_admission_order_is_refused(kit_synth):
    with pytest.raises(ValidationError, match="admission"):
        ResourcesSpec(admission="shortest_first")
    with pytest.raises(ValueError, match="longest_first, arrival"):
        kit_synth.session(4, admission="shortest_first")


TEXTS = ["One.", "Two more words.", "A somewhat longer sentence than these.", "Short.",
         "The longest text of all of them, said slowly and carefully, twice over if needed.", "Mid length text."]


def test_longest_first_admits_the_longest_texts_first_and_changes_no_codes(synth64, kit_groups):
    # 120 tokens: four rows meet end-of-speech (by 42 tokens) and two run to the budget, as at 300
    settings = DecodingSettings(method="pcg", theta=kit_groups.theta, max_new_tokens=120, seed=4)
    decoder = synth64.decoder(settings, 2)
    requests = [synth64.prepare(i, t, settings)[1] for i, t in enumerate(TEXTS)]
    for r in requests:
        r.rule = synth64.rule(settings)
    decoder.submit(requests)
    decoder.advance()  # admits two rows, runs one round
    assert sorted(r.key for r in decoder.owner.values()) == [2, 4]  # the two longest texts
    decoder.reset()

    items = [SynthesisItem(text=t, id=f"r{i}") for i, t in enumerate(TEXTS)]
    runs = {a: synth64.synthesize(items, settings, batch_size=2, admission=a)[0] for a in ("arrival", "longest_first")}
    codes = {a: {r.id: r.codes for r in results} for a, results in runs.items()}
    assert codes["arrival"] == codes["longest_first"]
    assert {r.finish_reason for r in runs["arrival"]} == {"eos", "length"}  # rows end both ways
    assert all(codes["arrival"].values())


def test_with_lengths_known_longest_first_keeps_the_batch_full_to_the_end(synth64):
    """Rows that run to their budgets (`ar`: one token a round; with this seed and temperature
    no row of the kit meets end-of-speech within 40 tokens): four short rows queued before a
    long one. In arrival order the long row starts last and decodes alone at the end; longest
    first it starts at once, beside the short rows in turn."""
    settings = DecodingSettings(method="ar", temperature=1.2, max_new_tokens=40, seed=2)
    budgets = [4, 4, 4, 4, 40]
    items = [SynthesisItem(text=TEXTS[4], id=f"r{i}", max_new_tokens=b) for i, b in enumerate(budgets)]
    runs = {a: synth64.synthesize(items, settings, batch_size=2, admission=a) for a in ("arrival", "longest_first")}
    for results, _ in runs.values():
        assert [len(r.codes) for r in results] == budgets  # every row ran to its budget
    arrival, longest = runs["arrival"][1], runs["longest_first"][1]
    assert arrival.slot_rounds == longest.slot_rounds == sum(budgets)
    assert arrival.decode_rounds == 8 + 40  # rows 0-1, rows 2-3, then row 4 alone
    assert longest.decode_rounds == 40  # row 4 from the start, the short rows beside it
    assert {r.id: r.codes for r in runs["arrival"][0]} == {r.id: r.codes for r in runs["longest_first"][0]}


def test_a_later_submission_waits_for_the_rows_of_an_earlier_one(synth64, kit_groups):
    """A job worker submits shard after shard: a newer shard's long rows must not overtake an
    older shard's short ones (its commit, and the next shard, would wait)."""
    settings = DecodingSettings(method="pcg", theta=kit_groups.theta, max_new_tokens=300, seed=4)
    session = synth64.session(2, stream=True)
    first = [(settings, synth64.prepare(i, TEXTS[i], settings, key=("old", i))[1]) for i in (0, 3, 5)]
    second = [(settings, synth64.prepare(i, TEXTS[i], settings, key=("new", i))[1]) for i in (2, 4)]
    session.submit(first)
    session.submit(second)
    session.step()
    (decoder,) = session.scheduler.decoders.values()
    assert sorted(r.key for r in decoder.owner.values()) == [("old", 3), ("old", 5)]  # the two longest
    session.reset()

