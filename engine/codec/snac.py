"""SNAC 24 kHz as the Orpheus family uses it: 7-code frames <-> SNAC's three levels, batched
decoding, encoding for voice prompts (random-weight checkpoints for kits: `engine.kit.codec`).

An Orpheus frame of seven codes `[c0..c6]` holds one level-0 code, two level-1 codes and four
level-2 codes (canopyai/Orpheus-TTS `decoder.py`, `convert_to_audio`): level 0 <- c0,
level 1 <- c1, c4, level 2 <- c2, c3, c5, c6. One frame is one level-0 step of audio.

SNAC's decoder adds Gaussian noise (`NoiseBlock`, config `noise: true`) drawn from the global
RNG, so the package decodes the same codes to different audio on every call, and an item's noise
depends on the batch around it. Here each item's noise comes from generators keyed on its codes
(`noise_seed`): the same codes give the same audio, alone or in any batch, on a given device.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from snac import SNAC
from snac.layers import NoiseBlock
from torch.nn.utils import parametrize

from engine.codec.base import CodecBase, CodecError, CodesLike, as_code_array, codec_config
from engine.codec.xcodec2 import codec_dtype
from engine.models.device import resolve_device

HOW_TO_GET = ("Pass a SNAC checkpoint (config.json with pytorch_model.bin or model.safetensors): the Hugging "
              "Face model id hubertsiuzdak/snac_24khz or a local copy of it, or the codec directory of a "
              "tiny Orpheus kit (`pcg-synth kit build --family orpheus DIR`: DIR/codec).")
LEVEL_SLOTS = ((0,), (1, 4), (2, 3, 5, 6))  # frame positions of each level's codes, in time order
FRAME_CODES = 7
SNAC_KEYS = ("sampling_rate", "encoder_rates", "decoder_rates", "vq_strides", "codebook_size")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # the first one present is read



# ---- Orpheus frames <-> SNAC levels ---------------------------------------------------------

def frames_to_levels(codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Orpheus frames -> the codes of SNAC's three levels.

    Args:
        codes: `[B, 7T]` codes, frame after frame.

    Returns:
        `([B, T], [B, 2T], [B, 4T])`: levels 0, 1 and 2, as `SNAC.decode` takes them.
    """
    if codes.ndim != 2 or codes.shape[1] % FRAME_CODES:
        raise CodecError(f"expected [B, 7T] codes (whole frames of 7), got shape {tuple(codes.shape)}")
    frames = codes.reshape(codes.shape[0], -1, FRAME_CODES)  # [B, T, 7]
    l0, l1, l2 = (frames[:, :, list(slots)].flatten(1) for slots in LEVEL_SLOTS)
    return l0, l1, l2


def levels_to_frames(levels: Sequence[torch.Tensor]) -> torch.Tensor:
    """SNAC's three levels (as `SNAC.encode` gives them) -> Orpheus frames `[B, 7T]`.

    Raises:
        CodecError: not three levels of shapes `[B, T]`, `[B, 2T]`, `[B, 4T]`.
    """
    if len(levels) != len(LEVEL_SLOTS):
        raise CodecError(f"expected {len(LEVEL_SLOTS)} SNAC levels, got {len(levels)}")
    b, t = levels[0].shape
    frames = levels[0].new_empty((b, t, FRAME_CODES))  # [B, T, 7]
    for i, (level, slots) in enumerate(zip(levels, LEVEL_SLOTS)):
        if tuple(level.shape) != (b, t * len(slots)):
            raise CodecError(f"SNAC level {i} has shape {tuple(level.shape)}; with {t} level-0 codes it "
                             f"should be {(b, t * len(slots))}")
        frames[:, :, list(slots)] = level.reshape(b, t, len(slots))
    return frames.flatten(1)


def orpheus_layout(config: dict) -> tuple[int, int]:
    """`(frame_codes, frame_samples)` of a SNAC config, after checking it has Orpheus's layout.

    Raises:
        CodecError: not three levels at rates 1:2:4 (7 codes a frame), or windowed attention
            (whose window would have to divide every decoded length).
    """
    strides = list(config.get("vq_strides") or [])
    per_frame = [strides[0] / s if s else math.inf for s in strides]  # codes of each level a frame
    if per_frame != [1, 2, 4]:
        found = ", ".join(f"{n:g}" for n in per_frame) or "none"
        raise CodecError(f"SNAC vq_strides {strides} give {len(strides)} levels of ({found}) codes a frame; Orpheus "
                         f"needs three levels at rates 1:2:4 (e.g. vq_strides [4, 2, 1]: {FRAME_CODES} codes a frame)")
    if config.get("attn_window_size") is not None:
        raise CodecError(f"SNAC attn_window_size {config['attn_window_size']}: Orpheus's SNAC 24 kHz has none "
                         "(null); windowed attention is not supported")
    return FRAME_CODES, int(np.prod(config["encoder_rates"])) * strides[0]


# ---- checkpoints --------------------------------------------------------------------------

def read_snac_config(path: Path) -> dict:
    """The checkpoint's `config.json`, after checking the directory looks like a SNAC one."""
    config = codec_config(path, HOW_TO_GET)
    missing = [k for k in SNAC_KEYS if k not in config]
    if missing:
        raise CodecError(f"{path} is not a SNAC checkpoint: its config.json (model_type "
                         f"{config.get('model_type')!r}) lacks {', '.join(missing)}. {HOW_TO_GET}")
    return config


def build_snac(config: dict) -> SNAC:
    try:
        return SNAC(**config)
    except TypeError as exc:  # a key SNAC's constructor does not take
        raise CodecError(f"SNAC cannot be built from config {config}: {exc}") from exc


def weights_file(path: Path) -> Path:
    for name in WEIGHT_FILES:
        if (path / name).is_file():
            return path / name
    raise CodecError(f"{path} has no SNAC weights ({' or '.join(WEIGHT_FILES)}). {HOW_TO_GET}")


def load_weights(model: SNAC, file: Path) -> None:
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(file))
    else:
        state = torch.load(file, map_location="cpu", weights_only=True)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:  # missing, unexpected or misshapen tensors
        raise CodecError(f"{file} does not fit its config.json: {str(exc)[:500]}") from exc


def random_snac(config: dict, seed: int) -> SNAC:
    """A random-weight SNAC for `config`, the same for the same seed; the caller's RNG is untouched."""
    orpheus_layout(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_snac(config)


# ---- decoder noise keyed on the item --------------------------------------------------------

def noise_seed(codes: np.ndarray, block: int) -> int:
    """The seed of noise block `block`'s noise for an item with these codes (`int64 [7T]`)."""
    digest = hashlib.sha256(codes.astype("<i8").tobytes() + block.to_bytes(2, "little")).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def item_noise(seed: int, length: int, device: torch.device) -> torch.Tensor:
    """Standard normal noise `[1, 1, length]` (float32) from a generator seeded with `seed`."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn((1, 1, length), generator=gen, device=device)


class KeyedNoise(NoiseBlock):
    """SNAC's `NoiseBlock` (`x + noise * linear(x)`) with each item's noise from its own seed.

    `seeds` (one per item, set around each call by `SnacCodec.decode_batch`) replaces the global RNG.
    """

    seeds: list[int] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.seeds is None or len(self.seeds) != x.shape[0]:
            raise RuntimeError("KeyedNoise needs one seed per item; decode through SnacCodec.decode")
        noise = torch.cat([item_noise(s, x.shape[-1], x.device) for s in self.seeds])  # [B, 1, T]
        return x + noise.to(x.dtype) * self.linear(x)


def prepare(model: SNAC, device: torch.device, dtype: torch.dtype) -> SNAC:
    """Ready a SNAC with loaded weights for the engine, in place.

    Weight norm is folded into plain weights (computed once in float32, not on every call), the
    noise blocks become `KeyedNoise`, the decoder takes `dtype` while the encoder and quantizer
    stay float32 (the nearest-code search of encoding is exact), all on `device`.
    """
    for module in list(model.modules()):
        if parametrize.is_parametrized(module, "weight"):
            parametrize.remove_parametrizations(module, "weight")
        if type(module) is NoiseBlock:
            module.__class__ = KeyedNoise  # same parameters, so the state dict is unchanged
    model.to(device=device, dtype=torch.float32)
    model.decoder.to(dtype)
    return model.eval().requires_grad_(False)


# ---- the codec ----------------------------------------------------------------------------

class SnacCodec(CodecBase):
    """Orpheus's SNAC codes <-> mono audio at its rate (24 kHz; implements `engine.codec.base.Codec`).

    Codes are flat sequences of whole 7-code frames, each code in `[0, codebook_size)`. Calls on
    several threads decode one at a time (the noise seeds live on its modules during a call).

    Args:
        model: a SNAC readied by `prepare`.
        config: the checkpoint's config (SNAC constructor arguments).
        path: the checkpoint directory (for `fingerprint`; None for random-weight codecs).
        max_batch: items decoded together at most.
        max_batch_codes: codes decoded together at most (bounds activation memory).
    """

    def __init__(self, model: SNAC, config: dict, path: Path | None = None, max_batch: int = 32,
                 max_batch_codes: int = 14_000) -> None:
        self.model, self.config, self.path = model, config, path
        self.max_batch, self.max_batch_codes = max_batch, max_batch_codes
        self.sample_rate = int(config["sampling_rate"])
        self.frame_codes, self.frame_samples = orpheus_layout(config)
        self.codebook_size = int(config["codebook_size"])
        self.noise_blocks = [m for m in model.decoder.modules() if isinstance(m, KeyedNoise)]
        self._decoding = threading.Lock()  # the noise seeds live on the modules during a call

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype = "auto",
             **kwargs) -> SnacCodec:
        """Load a SNAC checkpoint in Orpheus's layout.

        Args:
            path: directory with `config.json` and `pytorch_model.bin` or `model.safetensors`,
                or a Hub model id or object-store URI of one (`engine.io.storage.model_dir`).
            device: where encoding and decoding run (`auto`: CUDA when available).
            dtype: the decoder's: `auto` (bfloat16 on CUDA, float32 on CPU), `float32`,
                `bfloat16`, `float16`.
            **kwargs: `max_batch`, `max_batch_codes` (see the class).

        Raises:
            CodecError: missing directory, not a SNAC checkpoint, not Orpheus's layout, weights
                that do not fit the config.
        """
        from engine.io.storage import model_dir

        path, device = model_dir(path), resolve_device(device)
        dtype = codec_dtype(dtype, device)  # a bad dtype fails before any loading
        config = read_snac_config(path)
        orpheus_layout(config)
        model = build_snac(config)
        load_weights(model, weights_file(path))
        return cls(prepare(model, device, dtype), config, path, **kwargs)

    @classmethod
    def from_config(cls, config: dict, device: str | torch.device = "cpu", dtype: str | torch.dtype = "auto",
                    seed: int = 0, **kwargs) -> SnacCodec:
        """A random-weight codec (kits, benchmarks); it has no `fingerprint`."""
        device = resolve_device(device)
        model = prepare(random_snac(config, seed), device, codec_dtype(dtype, device))
        return cls(model, config, None, **kwargs)

    @property
    def device(self) -> torch.device:
        return self.model.quantizer.quantizers[0].codebook.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The decoder's dtype (the encoder and quantizer are float32)."""
        return next(self.model.decoder.parameters()).dtype

    # ---- decoding --------------------------------------------------------------------------

    def check_codes(self, codes: CodesLike, name: str = "codes") -> np.ndarray:
        """`int64 [7T]` after checking (raises `CodecError` on empty, out-of-range or partial frames)."""
        arr = as_code_array(codes, self.codebook_size, name)
        if arr.size % self.frame_codes:
            raise CodecError(f"{name}: {arr.size} codes are not whole frames of {self.frame_codes} "
                             f"(the last frame has {arr.size % self.frame_codes})")
        return arr

    @contextmanager
    def keyed_noise(self, codes: np.ndarray) -> Iterator[None]:
        """Seed each noise block from each row of `codes` `[B, 7T]` for one decoder call."""
        for i, block in enumerate(self.noise_blocks):
            block.seeds = [noise_seed(row, i) for row in codes]
        try:
            yield
        finally:
            for block in self.noise_blocks:
                block.seeds = None

    @torch.inference_mode()
    def decode_batch(self, codes: np.ndarray) -> np.ndarray:
        """`[B, 7T]` int64 codes of equal length -> `[B, T * frame_samples]` float32 waveforms."""
        want = codes.shape[1] // self.frame_codes * self.frame_samples
        levels = frames_to_levels(torch.from_numpy(codes).to(self.device))  # [B, T], [B, 2T], [B, 4T]
        latents = self.model.quantizer.from_codes(list(levels))  # [B, latent, 4T] float32
        with self._decoding, self.keyed_noise(codes):
            audio = self.model.decoder(latents.to(self.dtype))[:, 0].float()  # [B, samples]
        if audio.shape[1] < want:
            raise CodecError(f"SNAC decoded {audio.shape[1]} samples for {want // self.frame_samples} frames, "
                             f"fewer than {want}: check encoder_rates/decoder_rates in its config")
        return audio[:, :want].cpu().numpy()

    # ---- encoding (voice prompts) -----------------------------------------------------------

    @torch.inference_mode()
    def encode_one(self, waveform: np.ndarray) -> list[int]:
        """Float mono audio `[N]` -> `7 * ceil(N / frame_samples)` codes (SNAC pads the clip)."""
        wav = np.asarray(waveform)
        if wav.ndim != 1 or wav.size == 0:
            raise CodecError(f"expected a non-empty mono waveform [N], got shape {wav.shape}")
        if not np.all(np.isfinite(wav)):
            raise CodecError("waveform holds NaN or infinite samples")
        audio = torch.from_numpy(wav.astype(np.float32)).to(self.device)[None, None]  # [1, 1, N]
        levels = self.model.encode(audio)  # [1, T], [1, 2T], [1, 4T]
        return levels_to_frames(levels)[0].tolist()

    def weight_paths(self) -> list[Path]:
        """The checkpoint's weight files (its fingerprint's)."""
        return [weights_file(self.path)]
