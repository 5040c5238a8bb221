"""WER/CER, the ASR backends and the messages for missing optional backends."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from engine.metrics.deps import MissingBackend
from engine.metrics.signals import synthetic_voice
from engine.metrics.text import corpus_rates, edit_counts, normalize

from asrhelpers import save_char_processor, save_tiny_whisper


def test_normalize_keeps_words_and_contractions_only():
    assert normalize("Hello, World!  It\u2019s  a 'test'-case.") == "hello world it's a test case"


def test_identical_texts_have_zero_error_rates():
    counts = edit_counts("The birch canoe slid on the smooth planks.", "the birch canoe slid on the smooth planks")
    assert (counts.word_errors, counts.char_errors) == (0, 0)
    assert counts.wer == 0.0 and counts.cer == 0.0


def test_known_edits_give_exact_rates():
    # one substitution (sat -> sit) and one deletion (the): 2 of 6 words;
    # characters: a -> i and "the " deleted: 5 of 22
    counts = edit_counts("the cat sat on the mat", "the cat sit on mat")
    assert (counts.word_errors, counts.ref_words) == (2, 6)
    assert counts.wer == pytest.approx(2 / 6)
    assert (counts.char_errors, counts.ref_chars) == (5, 22)
    assert counts.cer == pytest.approx(5 / 22)


def test_empty_hypothesis_deletes_every_word_and_corpus_rates_pool_edits():
    a = edit_counts("one two three four", "")
    assert (a.word_errors, a.ref_words, a.wer) == (4, 4, 1.0)
    b = edit_counts("five six", "five six")
    rates = corpus_rates([a, b])
    assert rates["wer"] == pytest.approx(100 * 4 / 6)  # pooled, not the mean of 100 and 0
    assert rates["wer_utt_mean"] == pytest.approx(50.0)


def test_pocketsphinx_transcribes_clips_to_strings():
    from engine.metrics.asr import load_asr

    asr = load_asr("pocketsphinx")
    hyps = asr.transcribe([synthetic_voice(1, 1.0), np.zeros(8000, dtype=np.float32)])
    assert len(hyps) == 2 and all(isinstance(h, str) for h in hyps)
    assert hyps[1] == ""  # silence decodes to nothing


def tiny_ctc_checkpoint(path):
    """A random HuBERT CTC model with a character vocabulary, saved as a local checkpoint."""
    from transformers import HubertConfig, HubertForCTC

    vocab = save_char_processor(path)
    config = HubertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=64, conv_dim=(32, 32), conv_stride=(5, 4), conv_kernel=(10, 4),
                          num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, pad_token_id=0)
    HubertForCTC(config).save_pretrained(str(path))
    return path


def test_local_hf_ctc_checkpoint_transcribes_with_its_vocabulary(tmp_path):
    from engine.metrics.asr import HFASR, load_asr

    asr = load_asr(str(tiny_ctc_checkpoint(tmp_path / "ctc")))
    assert isinstance(asr, HFASR) and asr.model_type == "hubert"
    hyps = asr.transcribe([synthetic_voice(2, 1.0), synthetic_voice(3, 0.5)])
    assert len(hyps) == 2
    assert any(hyps)  # a random model emits something, drawn from its vocabulary only
    assert all(set(h.replace("<unk>", "")) <= set("abcdefghijklmnopqrstuvwxyz' ") for h in hyps)


def test_local_whisper_checkpoint_transcribes_long_clips_in_english(tmp_path, monkeypatch):
    """A Whisper checkpoint (random weights, made here) through the same recogniser: asked for
    English transcription (its generation settings know only English, so another language or a
    missing task table would raise), a clip over Whisper's 30 s window cut into windows (counted
    at the model's generate) rather than truncated."""
    from engine.metrics.asr import HFASR, load_asr

    asr = load_asr(str(save_tiny_whisper(tmp_path / "whisper")))
    assert isinstance(asr, HFASR) and asr.model_type == "whisper"
    assert asr.kwargs["generate_kwargs"] == {"language": "en", "task": "transcribe"}
    windows, generate = [], asr.pipe.model.generate

    def counted(*args, **kwargs):
        features = kwargs.get("input_features", args[0] if args else None)
        windows.append(features.shape[0])
        return generate(*args, **kwargs)

    monkeypatch.setattr(asr.pipe.model, "generate", counted)
    hyps = asr.transcribe([synthetic_voice(2, 1.0), synthetic_voice(3, 41.0)])
    assert len(hyps) == 2 and all(isinstance(h, str) and h for h in hyps)
    assert sum(windows) >= 3  # one window for the short clip, two or more for the 41 s one


def test_asr_and_speaker_specs_that_are_not_directories_are_refused(tmp_path):
    from engine.metrics.asr import load_asr
    from engine.metrics.speaker import load_speaker

    with pytest.raises(ValueError, match="not 'pocketsphinx', 'none' or a local checkpoint"):
        load_asr("openai/whisper-large-v3")  # a hub id: nothing is downloaded
    with pytest.raises(ValueError, match="no config.json"):
        load_speaker(str(tmp_path))


@pytest.mark.parametrize("module, build, package, extra", [
    ("jiwer", lambda: edit_counts("a", "b"), "jiwer", "quality"),
    ("pocketsphinx", lambda: __import__("engine.metrics.asr").metrics.asr.PocketSphinxASR(), "pocketsphinx", "quality"),
    ("resemblyzer", lambda: __import__("engine.metrics.speaker").metrics.speaker.ResemblyzerSpeaker(), "resemblyzer",
     "quality"),
    # DNSMOS needs three packages the dnsmos extra installs; the first missing one is named
    ("onnxruntime,librosa,speechmos.dnsmos", lambda: __import__("engine.metrics.dnsmos").metrics.dnsmos.DNSMOS(),
     "onnxruntime", "dnsmos"),
    ("matplotlib", lambda: __import__("engine.bench.plots").bench.plots._pyplot(), "matplotlib", "bench"),
])
def test_missing_optional_backend_names_the_package_and_extra(monkeypatch, module, build, package, extra):
    for name in module.split(","):
        monkeypatch.setitem(sys.modules, name, None)  # makes `import name` fail, as if not installed
    with pytest.raises(MissingBackend) as info:
        build()
    message = str(info.value)
    assert package in message and f"pip install 'pcg-synth[{extra}]'" in message
    assert isinstance(info.value, ValueError)  # the CLI prints it as one line, exit status 2
