"""X-codec2 through transformers' `Xcodec2Model`: batched decoding, encoding for voice prompts.

Decoding loads only the quantizer and the acoustic decoder (~187 M parameters at full size)
from the checkpoint; the encoder (Wav2Vec2-BERT semantic model + acoustic encoder, ~430 M) is
loaded lazily on the first `encode` call, on `encoder_device` (CPU by default), so GPU workers
that only decode never hold its weights on the GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from engine.codec.base import CodecBase, CodecError, CodesLike, as_code_array, codec_config
from engine.codec.features import encoder_inputs
from engine.hf import from_transformers
from engine.models.device import resolve_device, resolve_dtype

HOW_TO_GET = ("Build the tiny kit with `pcg-synth kit build DIR` (its codec is DIR/codec), or pass a "
              "transformers-format X-codec2 checkpoint: a Hugging Face model id (e.g. "
              "HKUSTAudio/xcodec2-hf) or a local copy of one (config.json, *.safetensors).")
DECODER_PREFIXES = ("quantizer.", "acoustic_decoder.")


def read_codec_config(path: Path):
    """The checkpoint's `Xcodec2Config`, after checking the directory looks like one."""
    Xcodec2Config = from_transformers("Xcodec2Config")

    model_type = codec_config(path, HOW_TO_GET).get("model_type")
    if model_type != "xcodec2":
        raise CodecError(f"{path} holds model_type {model_type!r}, not 'xcodec2'. {HOW_TO_GET}")
    return Xcodec2Config.from_pretrained(str(path))


def weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return [path / n for n in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CodecError(f"{path} has no *.safetensors weights. {HOW_TO_GET}")
    return files


def codec_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """The codec's precision: `auto` is bfloat16 on CUDA and float32 elsewhere. Unlike the
    language models, the codec stays float32 on CPUs with native bfloat16: its decoder's output in
    CPU bfloat16 is unchecked (neither measured nor listened to)."""
    if dtype == "auto" and device.type != "cuda":
        return torch.float32
    return resolve_dtype(dtype, device)


class DecoderParts(nn.Module):
    """The decode path of `Xcodec2Model`, with the checkpoint's parameter names."""

    def __init__(self, config) -> None:
        super().__init__()
        modeling = "transformers.models.xcodec2.modeling_xcodec2"
        Xcodec2Decoder = from_transformers("Xcodec2Decoder", modeling)
        Xcodec2Quantizer = from_transformers("Xcodec2Quantizer", modeling)

        config._attn_implementation = "sdpa"  # modules built outside from_pretrained default to eager
        self.quantizer = Xcodec2Quantizer(config)
        self.acoustic_decoder = Xcodec2Decoder(config)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """`[B, T]` int64 codes -> `[B, T * hop]` float32 audio (as `Xcodec2Model.decode`)."""
        latents = self.quantizer.from_codes(codes[..., None])  # [B, T, quantization_dim]
        return self.acoustic_decoder(latents)[:, 0].float()  # [B, T * hop]

    def place(self, device: torch.device, dtype: torch.dtype) -> DecoderParts:
        """Move to `device`; parameters and the FSQ codebook (exact in any float type) take
        `dtype`, while the ISTFT window and rotary frequencies stay float32 for precision."""
        self.to(device)
        for p in self.parameters():
            p.data = p.data.to(dtype)
        fsq = self.quantizer.quantizer
        fsq.codebook = fsq.codebook.to(dtype)
        return self.eval().requires_grad_(False)


def load_decoder_weights(parts: DecoderParts, path: Path) -> None:
    """Copy only the decode path's tensors from the checkpoint (the encoder's are not read)."""
    from safetensors import safe_open

    wanted = parts.state_dict()
    seen = set()
    for file in weight_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():
                if key in wanted:
                    wanted[key].copy_(f.get_tensor(key))
                    seen.add(key)
    missing = sorted(set(wanted) - seen)
    if missing:
        raise CodecError(f"{path}: checkpoint lacks {len(missing)} decoder tensors, e.g. {missing[:3]}")


class Xcodec2Codec(CodecBase):
    """X-codec2 speech codes <-> mono audio at its rate (16 kHz; implements `engine.codec.base.Codec`).

    Args:
        parts: the decode path, already placed on its device.
        config: the `Xcodec2Config`.
        path: the checkpoint directory (needed by `encode`; None for random-weight codecs).
        encoder_device: where `encode` loads the encoder (float32) on first use.
        max_batch: items decoded together at most.
        max_batch_codes: codes decoded together at most (bounds activation memory).
    """

    def __init__(self, parts: DecoderParts, config, path: Path | None = None,
                 encoder_device: str | torch.device = "cpu", max_batch: int = 32,
                 max_batch_codes: int = 48_000) -> None:
        self.parts, self.config, self.path = parts, config, path
        self.encoder_device = resolve_device(encoder_device)
        self.max_batch, self.max_batch_codes = max_batch, max_batch_codes
        self.sample_rate = int(config.sampling_rate)
        self.hop_length = int(config.hop_length)
        self.frame_codes, self.frame_samples = 1, self.hop_length  # one code a frame
        self.codebook_size = int(np.prod(config.quantization_levels))
        self._encoder = None

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype = "auto",
             **kwargs) -> Xcodec2Codec:
        """Load the decode path from a transformers-format checkpoint.

        Args:
            path: directory with `config.json` (model_type xcodec2) and safetensors weights, or
                a Hub model id or object-store URI of one (`engine.io.storage.model_dir`).
            device: where decoding runs (`auto`: CUDA when available).
            dtype: `auto` (bfloat16 on CUDA, float32 on CPU), `float32`, `bfloat16`, `float16`.
            **kwargs: `encoder_device`, `max_batch`, `max_batch_codes` (see the class).

        Raises:
            CodecError: missing directory, not an X-codec2 checkpoint, missing tensors.
        """
        from engine.io.storage import model_dir

        path, device = model_dir(path), resolve_device(device)
        dtype = codec_dtype(dtype, device)  # a bad dtype fails before any loading
        config = read_codec_config(path)
        parts = DecoderParts(config)
        load_decoder_weights(parts, path)
        return cls(parts.place(device, dtype), config, path, **kwargs)

    @classmethod
    def from_config(cls, config, device: str | torch.device = "cpu", dtype: str | torch.dtype = "auto",
                    seed: int = 0, **kwargs) -> Xcodec2Codec:
        """A random-weight decoder of any size (benchmarks); it cannot `encode`."""
        device = resolve_device(device)
        with torch.random.fork_rng(devices=[]):  # leave the caller's random state alone
            torch.manual_seed(seed)
            parts = DecoderParts(config)
        return cls(parts.place(device, codec_dtype(dtype, device)), config, None, **kwargs)

    @property
    def device(self) -> torch.device:
        return self.parts.quantizer.project_out.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.parts.quantizer.project_out.weight.dtype

    # ---- decoding --------------------------------------------------------------------------

    def check_codes(self, codes: CodesLike, name: str = "codes") -> np.ndarray:
        """`int64 [T]` after checking (raises `CodecError` on empty or out-of-range codes)."""
        return as_code_array(codes, self.codebook_size, name)

    @torch.inference_mode()
    def decode_batch(self, codes: np.ndarray) -> np.ndarray:
        """`[B, T]` int64 codes of equal length -> `[B, T * hop]` float32 waveforms."""
        n = codes.shape[1]
        audio = self.parts(torch.from_numpy(codes).to(self.device))  # [B, T * hop]
        return audio[:, : n * self.hop_length].cpu().numpy()

    # ---- encoding (voice prompts) -----------------------------------------------------------

    def encoder(self):
        """The full `Xcodec2Model` (decoder dropped) on `encoder_device`, loaded on first use."""
        if self._encoder is None:
            if self.path is None:
                raise CodecError("this codec has random weights and no checkpoint: it cannot encode")
            model = from_transformers("Xcodec2Model").from_pretrained(str(self.path), dtype=torch.float32)
            model.acoustic_decoder = None  # the decode path lives in self.parts
            self._encoder = model.to(self.encoder_device).eval().requires_grad_(False)
        return self._encoder

    @torch.inference_mode()
    def encode_one(self, waveform: np.ndarray) -> list[int]:
        """Float 16 kHz mono audio `[N]` -> `N // hop + 1` codes (X-codec2 pads the clip)."""
        values, features = encoder_inputs(waveform, self.hop_length, self.sample_rate)
        model = self.encoder()
        out = model.encode(values.to(self.encoder_device), features.to(self.encoder_device))
        return out.audio_codes[0, 0].tolist()  # [1, 1, T] -> T codes

    def weight_paths(self) -> list[Path]:
        """The checkpoint's weight files (its fingerprint's)."""
        return weight_files(self.path)
