"""Test-kit support: make a tiny random X-codec2 encode to varied codes.

With small random weights the quantizer's input sits near zero, FSQ rounds every frame to the
middle level and every clip encodes to code 43690 only; a kit like that cannot catch a bug in
the encode path. Scaling the input projection's rows to a large norm spreads the encoder's
output over the whole codebook (decoding is unaffected: it starts after this projection).
"""

from __future__ import annotations

from pathlib import Path

import torch

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
