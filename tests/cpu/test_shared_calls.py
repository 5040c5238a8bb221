"""Calls on one Synthesizer at the same time (a notebook reading two streams in turns, a service's
threads): their rows share the batch and every item decodes as its call alone would (float64 on
the kit, as in test_row_settings.py); a stream left unread takes its rows out of the batch; a
call whose round fails takes the batch with it, and the calls that shared it are told so."""

from __future__ import annotations

import threading

import pytest

from engine import DecodingSettings, SynthesisItem
from engine.api import RowsDropped

from synthhelpers import by_id

A = [SynthesisItem(text="The quick brown fox jumps over the lazy dog.", id="a0"),
     SynthesisItem(text="Call Stella.", id="a1", temperature=1.2),
     SynthesisItem(text="Numbers like one, two, three.", id="a2", seed=5),
     SynthesisItem(text="Hi.", id="a3", temperature=0)]
B = [SynthesisItem(text="Hong Kong and Paris.", id="b0"),
     SynthesisItem(text="It was the best of times, it was the worst of times.", id="b1", top_p=0.9),
     SynthesisItem(text="Speculative decoding.", id="b2", max_new_tokens=9)]
SETTINGS = DecodingSettings(method="pcg", max_new_tokens=20, seed=3)


@pytest.fixture(scope="module")
def alone(synth64):
    return {name: by_id(synth64.synthesize(items, SETTINGS)[0]) for name, items in (("a", A), ("b", B))}


@pytest.fixture(scope="module")
def alone_rounds(synth64):
    return sum(synth64.synthesize(items, SETTINGS)[1].decode_rounds for items in (A, B))


def test_two_streams_read_in_turns_share_the_batch_and_decode_as_alone(synth64, alone, alone_rounds):
    before = {id(d): d.rounds_run for d in synth64._decoders.values()}  # the session's Synthesizer
    streams = {"a": synth64.stream(A, SETTINGS), "b": synth64.stream(B, SETTINGS)}
    got: dict[str, list] = {"a": [], "b": []}
    while streams:
        for name in list(streams):
            result = next(streams[name], None)
            if result is None:
                del streams[name]
            else:
                got[name].append(result)
    for name in ("a", "b"):
        assert sorted(r.id for r in got[name]) == sorted(alone[name])  # each item once, in its own call
        assert by_id(got[name]) == alone[name]
    # one decoder ran both calls' rows
    (decoder,) = [d for d in synth64._decoders.values() if d.rounds_run != before.get(id(d), 0)]
    assert decoder.idle
    # the 7 rows shared the 4 slots: fewer rounds than the two calls one after the other
    ran = decoder.rounds_run - before.get(id(decoder), 0)
    assert ran < alone_rounds, (ran, alone_rounds)


def test_calls_on_two_threads_at_once_decode_as_alone(synth64, alone):
    got, errors = {}, []

    def call(name, items):
        try:
            got[name] = by_id(synth64.synthesize(items, SETTINGS)[0])
        except Exception as exc:  # reported below: a thread's exception would be lost
            errors.append(repr(exc))

    for _ in range(2):
        threads = [threading.Thread(target=call, args=args) for args in (("a", A), ("b", B))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and got == alone


def test_a_stream_left_unread_leaves_the_batch(synth64, alone):
    fresh_summary = synth64.synthesize(B, SETTINGS)[1]
    stream = synth64.stream(A, SETTINGS)
    next(stream)
    stream.close()  # what dropping it does too: its rows still queued or decoding leave the batch
    assert all(d.idle for d in synth64._decoders.values())
    results, summary = synth64.synthesize(B, SETTINGS)
    assert by_id(results) == alone["b"]
    assert summary.decode_rounds == fresh_summary.decode_rounds  # no round spent on the left rows

    stream = synth64.stream(A, SETTINGS)
    next(stream)
    with synth64.lock:  # as if a round were running: a stream the garbage collector closes mid-round
        stream.close()
        assert not all(d.idle for d in synth64._decoders.values())  # its rows leave before the next round
    results, summary = synth64.synthesize(B, SETTINGS)
    assert by_id(results) == alone["b"] and summary.decode_rounds == fresh_summary.decode_rounds


def test_a_failed_round_fails_the_calls_sharing_its_batch_and_the_next_call_decodes(synth64, alone):
    first, second = synth64.stream(A, SETTINGS), synth64.stream(B, SETTINGS)
    next(first)
    (decoder,) = [d for d in synth64._decoders.values() if not d.idle]  # the one holding A's rows

    def broken_round(active):
        raise RuntimeError("device lost")

    decoder.step = broken_round  # the instance's next round fails: the second call's first
    with pytest.raises(RuntimeError, match="device lost"):
        next(second)
    del decoder.step
    with pytest.raises(RowsDropped, match="dropped from a batch shared with another session"):
        list(first)
    assert by_id(synth64.synthesize(A, SETTINGS)[0]) == alone["a"]
