"""A codec checkpoint of any kind the engine knows, loaded by what its `config.json` says: X-codec2
(transformers' `model_type: xcodec2`; Llasa's codec) or SNAC (`vq_strides`, `encoder_rates`:
Orpheus's codec)."""

from __future__ import annotations

from pathlib import Path

from engine.codec.base import Codec, CodecError, codec_config

KINDS = ("xcodec2", "snac")
HOW_TO_GET = ("Build the tiny kit with `pcg-synth kit build DIR` (its codec is DIR/codec), or pass an X-codec2 "
              "checkpoint in transformers' format (e.g. HKUSTAudio/xcodec2-hf) for Llasa, or a SNAC checkpoint "
              "(e.g. hubertsiuzdak/snac_24khz) for Orpheus: a Hugging Face model id or a local copy of one.")


def codec_kind(path: Path) -> str:
    """`xcodec2` or `snac`, from the checkpoint directory's `config.json`.

    Raises:
        CodecError: no directory, no config, or a config of neither kind.
    """
    config = codec_config(path, HOW_TO_GET)
    if config.get("model_type") == "xcodec2":
        return "xcodec2"
    if {"vq_strides", "encoder_rates", "codebook_size"} <= set(config):
        return "snac"
    raise CodecError(f"{path} holds no codec pcg-synth knows (model_type {config.get('model_type')!r}). {HOW_TO_GET}")


def load_codec(ref: str | Path, device="cpu", dtype="auto", encoder_device="cpu", storage=None) -> Codec:
    """The codec at `ref` (a local directory, Hugging Face Hub id or object-store URI).

    Args:
        device, dtype: where and how the decoder runs (`auto`: bfloat16 on CUDA, float32 elsewhere).
        encoder_device: where X-codec2 loads its encoder on the first `encode` (SNAC encodes
            with its own weights on `device`).
        storage: resolves `ref` (default: `Storage()`).

    Raises:
        CodecError: not a codec checkpoint (the message says how to get one); StorageError:
            `ref` cannot be fetched.
    """
    from engine.io.storage import model_dir

    path = model_dir(ref, storage)
    if codec_kind(path) == "snac":
        from engine.codec.snac import SnacCodec

        return SnacCodec.load(path, device=device, dtype=dtype)
    from engine.codec.xcodec2 import Xcodec2Codec

    return Xcodec2Codec.load(path, device=device, dtype=dtype, encoder_device=encoder_device)
