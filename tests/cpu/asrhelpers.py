"""Helpers shared by the ASR tests: the processor files of a CTC checkpoint made in a test."""

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
