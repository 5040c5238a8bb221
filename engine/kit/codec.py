"""Test-kit support: tiny random codecs that encode varied audio to varied codes.

X-codec2: with small random weights the quantizer's input sits near zero, FSQ rounds every frame
to the middle level and every clip encodes to code 43690 only; a kit like that cannot catch a bug
in the encode path. Scaling the input projection's rows to a large norm spreads the encoder's
output over the whole codebook (decoding is unaffected: it starts after this projection).

SNAC (the Orpheus kit): the same problem, the same kind of cure (`spread_snac_codes`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.codec.snac import random_snac
from engine.hf import from_transformers

KIT_PROJECT_IN_ROW_NORM = 200.0


@torch.no_grad()
def spread_codes(model, row_norm: float = KIT_PROJECT_IN_ROW_NORM) -> None:
    """Rescale `model.quantizer.project_in` rows to norm `row_norm`, in place (idempotent).

    Args:
        model: an `Xcodec2Model` with random weights (never a trained checkpoint).
        row_norm: target L2 norm of each row of the `[8, quantization_dim]` projection.
    """
    weight = model.quantizer.project_in.weight  # [levels, quantization_dim]
    weight.mul_(row_norm / weight.norm(dim=1, keepdim=True).clamp_min(1e-12))


def write_spread_codec(src: str | Path, dst: str | Path) -> Path:
    """Copy the random codec at `src` to `dst` with `spread_codes` applied (for tests)."""
    model = from_transformers("Xcodec2Model").from_pretrained(str(src))
    spread_codes(model)
    model.save_pretrained(str(dst))
    return Path(dst)


# hubertsiuzdak/snac_24khz's config with tiny widths: decoding 100 frames takes tens of milliseconds on a CPU.
TINY_SNAC_CONFIG = {"sampling_rate": 24000, "encoder_dim": 8, "encoder_rates": [2, 4, 8, 8], "decoder_dim": 16,
                    "decoder_rates": [8, 8, 4, 2], "attn_window_size": None, "codebook_size": 4096,
                    "codebook_dim": 8, "vq_strides": [4, 2, 1], "noise": True, "depthwise": True}
SPREAD_GAIN = 30.0  # see spread_codes


@torch.no_grad()
def spread_snac_codes(model, seed: int, gain: float = SPREAD_GAIN) -> None:
    """Make a random-weight SNAC encode varied audio to varied codes, in place (kits only).

    A random encoder's output is dominated by a constant offset (from its biases), and the
    quantizer picks codes by direction: every clip encodes to a handful of codes per level, and
    levels 1 and 2 repeat each code (the residual is dominated by level 0's constant-per-step
    contribution). Scaling the encoder's last convolution by `gain` makes the input-dependent
    part dominate the residuals, and each quantizer's input bias is then set so its projected
    input has zero mean on seeded calibration noise. Decoding starts after both changes and is
    unaffected.
    """
    last = model.encoder.block[-1]  # the depthwise conv that outputs the latent
    last.parametrizations.weight.original0.mul_(gain)  # weight norm's magnitude g
    last.bias.mul_(gain)
    samples = 8 * int(model.hop_length) * model.vq_strides[0]  # 8 frames
    calib = torch.randn((4, 1, samples), generator=torch.Generator().manual_seed(seed)) * 0.3  # [4, 1, N]
    residual = model.encoder(model.preprocess(calib))  # [4, latent, T_latent]
    for q in model.quantizer.quantizers:
        pooled = torch.nn.functional.avg_pool1d(residual, q.stride, q.stride)
        q.in_proj.bias.sub_(q.in_proj(pooled).mean(dim=(0, 2)))
        residual = residual - q(residual)[0]


def write_random_snac(out_dir: str | Path, config: dict, seed: int) -> Path:
    """Write a random-weight SNAC checkpoint that `SNAC.from_pretrained` and `SnacCodec.load` read.

    The weights are `SnacCodec.from_config(config, seed=seed)`'s with `spread_snac_codes` applied to the
    encode path, so both decode the same audio.

    Args:
        out_dir: directory to write `config.json` and `pytorch_model.bin` into (created).
        config: SNAC constructor arguments in Orpheus's layout (e.g. `TINY_SNAC_CONFIG`).
        seed: decides the weights; the caller's RNG is untouched.

    Returns:
        `out_dir` as a Path.
    """
    model = random_snac(config, seed)
    spread_snac_codes(model, seed)  # its calibration noise has its own generator
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    torch.save(model.state_dict(), out / "pytorch_model.bin")
    return out
