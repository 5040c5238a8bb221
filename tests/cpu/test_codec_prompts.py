"""Voice prompts: clip -> cached codes -> Llasa voice-clone prompt of the decoding core."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from engine.codec.audio import read_clip
from engine.codec.base import CodecError
from engine.codec.prompts import (
    PromptCache,
    VoicePrompt,
    codes_for_audio,
    load_voice_prompt,
    prompt_id,
    prompts_of,
    with_prompt,
)
from engine.codec.xcodec2 import Xcodec2Codec
from engine.config import DecodingSettings
from engine.records import SynthesisItem


@pytest.fixture(scope="module")
def codec(kit_dir, tmp_path_factory) -> Xcodec2Codec:
    from engine.kit.codec import write_spread_codec

    path = write_spread_codec(kit_dir / "codec", tmp_path_factory.mktemp("codec") / "spread")
    return Xcodec2Codec.load(path, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """Half a second of a 220 Hz tone with noise, at 44.1 kHz (-> 8000 samples at 16 kHz)."""
    sr = 44100
    t = np.arange(sr // 2) / sr
    wave = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * np.random.default_rng(1).standard_normal(len(t))
    path = tmp_path_factory.mktemp("clips") / "ref.wav"
    sf.write(path, wave.astype(np.float32), sr, subtype="PCM_16")
    return path


class CountingCodec:
    """The real codec, counting how often it is asked to encode."""

    def __init__(self, codec: Xcodec2Codec) -> None:
        self.codec, self.calls = codec, 0
        self.fingerprint = codec.fingerprint
        self.sample_rate, self.codebook_size = codec.sample_rate, codec.codebook_size

    def encode(self, waveforms):
        self.calls += 1
        return self.codec.encode(waveforms)


def test_clip_prompt_is_encoded_once_and_cached_on_disk(codec, clip, tmp_path):
    counting = CountingCodec(codec)
    first = load_voice_prompt("Reference words.", audio=clip, codec=counting, cache=PromptCache(tmp_path))
    assert counting.calls == 1
    assert first.codes == tuple(codec.encode([read_clip(clip, 16000)])[0])
    assert len(first.codes) == 8000 // 320 + 1
    assert first.text == "Reference words." and first.id == prompt_id("Reference words.", first.codes)
    # A new process (fresh cache object, same directory) finds the codes without encoding.
    again = load_voice_prompt("Reference words.", audio=clip, codec=counting, cache=PromptCache(tmp_path))
    assert counting.calls == 1 and again == first
    assert len(list(tmp_path.glob("*.json"))) == 1


def test_cache_key_depends_on_audio_and_codec(codec):
    wave = np.zeros(800, np.float32)
    other = wave.copy()
    other[10] = 1e-3
    key = PromptCache.key(codec, wave)
    assert key == PromptCache.key(codec, wave.copy())
    assert key != PromptCache.key(codec, other)

    class OtherWeights:
        fingerprint = "0" * 64

    assert key != PromptCache.key(OtherWeights(), wave)


def test_precomputed_codes_prompt():
    prompt = load_voice_prompt("  Hi there. ", codes=[1, 2, 65535], id="speaker-7")
    assert prompt == VoicePrompt(id="speaker-7", text="Hi there.", codes=(1, 2, 65535))
    assert load_voice_prompt("Hi there.", codes=[1, 2, 65535]).id == prompt_id("Hi there.", [1, 2, 65535])
    assert prompt_id("Hi there.", [1, 2]) != prompt_id("Hi there.", [1, 3])


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(text="", codes=[1]), ValueError, "transcript"),
    (dict(text="t"), ValueError, "either a clip"),
    (dict(text="t", codes=[1], audio="x.wav"), ValueError, "either a clip"),
    (dict(text="t", audio="x.wav"), ValueError, "needs a codec"),
    (dict(text="t", codes=[]), CodecError, "empty"),
    (dict(text="t", codes=[3, -1]), CodecError, "-1 at position 1 is negative"),
])
def test_prompt_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        load_voice_prompt(**kwargs)


def test_codes_outside_the_given_codecs_codebook_are_refused(codec):
    with pytest.raises(CodecError, match="65536 at position 1 is outside"):
        load_voice_prompt("t", codes=[3, 65536], codec=codec)


def test_unreadable_clip_is_a_clear_error(codec, tmp_path):
    bad = tmp_path / "bad.flac"
    bad.write_bytes(b"\x00" * 100)
    with pytest.raises(CodecError, match="cannot read audio clip .*bad.flac"):
        load_voice_prompt("t", audio=bad, codec=codec)


def test_prompt_reaches_the_core_as_a_voice_clone_prompt(kit_synth):
    prompt = VoicePrompt(id="p", text="Reference words.", codes=(5, 6, 7, 8))
    items = with_prompt(["Hello there.", SynthesisItem(text="Bye.", id="b", seed=3)], prompt)
    assert items[1].id == "b" and items[1].seed == 3
    assert all(i.prompt_text == prompt.text and i.prompt_codes == [5, 6, 7, 8] for i in items)
    ids = kit_synth.prompter.build(items[0].text, items[0].prompt_text, items[0].prompt_codes)
    first = kit_synth.target.layout.first_code
    assert ids[-4:] == [first + c for c in prompt.codes]  # the assistant turn starts with them
    results, _ = kit_synth.synthesize(items, DecodingSettings(method="ar", max_new_tokens=3))
    assert [r.error for r in results] == [None, None]
    assert results[0].stats.prompt_tokens == len(ids)
    assert prompts_of(items) == [VoicePrompt(prompt_id(prompt.text, prompt.codes), prompt.text,
                                             prompt.codes)] * 2
    assert prompts_of(["plain", SynthesisItem(text="x")]) == [None, None]


def test_codes_for_audio_modes():
    prompt = VoicePrompt(id="p", text="t", codes=(1, 2))
    assert codes_for_audio([7, 8, 9], prompt, "strip") == ([7, 8, 9], 0)
    assert codes_for_audio([7, 8, 9], prompt, "include") == ([1, 2, 7, 8, 9], 0)
    assert codes_for_audio([7, 8, 9], prompt, "context") == ([1, 2, 7, 8, 9], 2)
    assert codes_for_audio([7], None, "include") == ([7], 0)
    with pytest.raises(ValueError, match="strip, include, context"):
        codes_for_audio([7], prompt, "keep")
