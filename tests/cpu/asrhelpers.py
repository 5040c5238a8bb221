"""Helpers shared by the ASR and speaker tests: checkpoints made in a test (a CTC processor,
Whisper, an x-vector model), random weights, nothing downloaded."""

from __future__ import annotations

import json
from pathlib import Path

CHARACTERS = "abcdefghijklmnopqrstuvwxyz'"


def save_char_processor(path: Path) -> dict[str, int]:
    """Write a character-vocabulary CTC tokenizer and a 16 kHz feature extractor to `path` (made
    here); returns the vocabulary."""
    from transformers import Wav2Vec2CTCTokenizer, Wav2Vec2FeatureExtractor, Wav2Vec2Processor

    path.mkdir(parents=True)
    vocab = {"<pad>": 0, "<unk>": 1, "|": 2, **{c: i + 3 for i, c in enumerate(CHARACTERS)}}
    (path / "vocab.json").write_text(json.dumps(vocab))
    tokenizer = Wav2Vec2CTCTokenizer(str(path / "vocab.json"), pad_token="<pad>", unk_token="<unk>",
                                     word_delimiter_token="|")
    extractor = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0,
                                         do_normalize=True, return_attention_mask=False)
    Wav2Vec2Processor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(str(path))
    return vocab


def save_tiny_whisper(path: Path) -> Path:
    """A randomly initialised Whisper checkpoint made here: a byte-level tokenizer with Whisper's
    special tokens (English only), the generation settings Whisper's `generate` reads for
    `language`/`task`, and the 80-bin feature extractor."""
    import torch
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizer,
    )

    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]  # byte-level BPE's map of the other bytes
    vocab = {chr(b): i for i, b in enumerate(printable)}
    vocab.update({chr(256 + n): len(vocab) + n for n in range(len(others))})
    specials = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|translate|>", "<|transcribe|>",
                "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>"]
    vocab.update({s: len(vocab) + n for n, s in enumerate(specials)})
    tokenizer = WhisperTokenizer(vocab=vocab, merges=[], pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": specials[1:]})
    ids = {s: tokenizer.convert_tokens_to_ids(s) for s in specials}
    end, start = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
    torch.manual_seed(0)
    config = WhisperConfig(vocab_size=len(vocab), num_mel_bins=80, encoder_layers=1, decoder_layers=1,
                           encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                           decoder_ffn_dim=32, d_model=16, max_target_positions=64, pad_token_id=end,
                           bos_token_id=end, eos_token_id=end, decoder_start_token_id=start,
                           begin_suppress_tokens=None, suppress_tokens=None)
    model = WhisperForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=start, eos_token_id=end, pad_token_id=end, bos_token_id=end, max_length=24,
        lang_to_id={"<|en|>": ids["<|en|>"]}, is_multilingual=True,
        task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
        no_timestamps_token_id=ids["<|notimestamps|>"], begin_suppress_tokens=None, suppress_tokens=None)
    model.save_pretrained(str(path))
    WhisperProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=80),
                     tokenizer=tokenizer).save_pretrained(str(path))
    return path


def save_tiny_xvector(path: Path) -> Path:
    """A randomly initialised WavLM x-vector checkpoint (16-dim embeddings) made here."""
    from transformers import Wav2Vec2FeatureExtractor, WavLMConfig, WavLMForXVector

    config = WavLMConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                         conv_dim=(32, 32), conv_stride=(5, 4), conv_kernel=(10, 4),
                         num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
                         tdnn_dim=(32, 32), tdnn_kernel=(3, 1), tdnn_dilation=(1, 1), xvector_output_dim=16)
    WavLMForXVector(config).save_pretrained(str(path))
    Wav2Vec2FeatureExtractor(sampling_rate=16000).save_pretrained(str(path))
    return path
