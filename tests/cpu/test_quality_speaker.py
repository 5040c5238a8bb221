"""Speaker similarity: Resemblyzer's encoder re-implemented on its bundled weights, x-vectors."""

from __future__ import annotations

import numpy as np
import pytest

from engine.metrics.signals import synthetic_voice
from engine.metrics.speaker import cosine, load_speaker

from asrhelpers import save_tiny_xvector

# Produced by resemblyzer 0.1.4 itself (librosa 0.11, webrtcvad 2.0.10, setuptools < 81):
# proj @ VoiceEncoder().embed_utterance(preprocess_wav(clip)) with
# proj = np.random.default_rng(0).standard_normal((4, 256)), for these clips. The "gap" clip has
# 1.2 s of silence that VAD trimming removes (67,200 -> 50,400 samples).
REFERENCE = {
    "low": [0.525382, 0.137774, 0.362584, -1.534243],
    "short": [0.397907, 0.036244, -0.037426, -1.262737],
    "gap": [-0.478502, -0.023347, -0.466782, -1.481297],
}


def reference_clips() -> dict[str, np.ndarray]:
    gap = np.concatenate([synthetic_voice(4, 1.5, 160.0), np.zeros(19200, np.float32),
                          synthetic_voice(5, 1.5, 160.0)])
    return {"low": synthetic_voice(1, 3.0, 110.0), "short": synthetic_voice(3, 1.2, 140.0), "gap": gap}


@pytest.fixture(scope="module")
def resemblyzer():
    return load_speaker("resemblyzer")


def test_embeddings_match_resemblyzer_itself(resemblyzer):
    proj = np.random.default_rng(0).standard_normal((4, 256))
    for name, clip in reference_clips().items():
        assert proj @ resemblyzer.embed(clip) == pytest.approx(REFERENCE[name], abs=1e-4), name


def test_silence_trimming_follows_webrtc_vad():
    from engine.metrics.resemblyzer import normalize_volume, trim_long_silences

    assert len(trim_long_silences(normalize_volume(reference_clips()["gap"]))) == 50_400


def test_a_clip_is_most_similar_to_itself_then_to_its_own_voice(resemblyzer):
    clip = synthetic_voice(21, 2.5, 120.0)
    same_voice = synthetic_voice(22, 2.5, 120.0)  # other rhythm and noise, same pitch/formants
    other_voice = synthetic_voice(23, 2.5, 230.0, (850.0, 1600.0, 2900.0))
    e = resemblyzer.embed(clip)
    assert np.linalg.norm(e) == pytest.approx(1.0, abs=1e-5)
    assert cosine(e, resemblyzer.embed(clip.copy())) == pytest.approx(1.0, abs=1e-6)
    same, other = cosine(e, resemblyzer.embed(same_voice)), cosine(e, resemblyzer.embed(other_voice))
    assert same > other + 0.1


def test_noise_without_voice_still_embeds(resemblyzer):
    noise = (0.01 * np.random.default_rng(0).standard_normal(16000)).astype(np.float32)
    e = resemblyzer.embed(noise)
    assert np.isfinite(e).all() and np.linalg.norm(e) == pytest.approx(1.0, abs=1e-5)


def test_local_xvector_checkpoint_embeds(tmp_path):
    save_tiny_xvector(tmp_path)
    speaker = load_speaker(str(tmp_path))
    clip = synthetic_voice(31, 1.0)
    e = speaker.embed(clip)
    assert e.shape == (16,)
    assert cosine(e, speaker.embed(clip)) == pytest.approx(1.0, abs=1e-5)
