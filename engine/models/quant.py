"""int8 weights for a draft model on CPU: half the bytes a decode step reads.

A draft only proposes; every acceptance rule corrects with the draft's probabilities as computed,
so a coarser draft changes acceptance, never the target's distribution. On a CPU the decode step
is bound by the bytes of weights it reads, and int8 weights halve them; ATen's weight-only
`_weight_int8pack_mm` is compute-bound instead and loses as rows grow.

Rows stay independent: each row of the input is mapped onto [-1, 1] by its own midpoint and
half-range before it is quantised to uint8 with a fixed scale, so a row's proposals do not
depend on which rows share its batch (integer products are exact, the rescaling is per row).
A per-tensor dynamic scale, as `torch.ao`'s dynamic quantisation uses, would couple them.

Weights use all of [-127, 127]. How many input levels depends on the CPU (`input_levels`). With
VNNI or AMX int8 instructions oneDNN accumulates every uint8 x int8 product in int32, so a row
takes uint8 128 +- 127. Without them (AVX2, AVX512 before VNNI) its kernel adds each pair of
adjacent products in int16 with saturation first (`vpmaddubsw`), and 2 x 255 x 127 overflows
int16, so a full-range layer's integer sums come back clipped. There a row takes 64 +- 63 (uint8
1..127; 2 x 127 x 127 = 32,258 fits), as fbgemm's `reduce_range` does for the same reason: the
sums are exact (tests/cpu/test_int8_draft.py checks them at the extremes).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.models.device import cpu_instructions

WEIGHT_LEVELS = 127  # weights: int8 in [-127, 127], one scale per output channel
VNNI = ("avx512_vnni", "avx_vnni", "amx_int8")  # int32 accumulation of uint8 x int8 products


def int8_supported(device: torch.device | str) -> bool:
    """oneDNN's int8 matmul: a CPU build with mkldnn and the onednn quantised-linear ops."""
    return (torch.device(device).type == "cpu" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.onednn, "qlinear_pointwise"))


def cpu_vnni() -> bool:
    """Whether this CPU has int8 dot-product instructions (VNNI, AMX int8), as torch detects them.
    Without them oneDNN's int8 matmul is slower than float32, so int8 draft weights pay only
    with them."""
    return bool(cpu_instructions(VNNI))


def input_levels() -> int:
    """How far a row's uint8 input reaches either side of its zero point (`levels + 1`): 127
    where the CPU sums uint8 x int8 products in int32 (`cpu_vnni`), else 63, so that the int16
    pair sums of AVX2's kernel cannot saturate (see the module's docstring)."""
    return 127 if cpu_vnni() else 63


class Int8Linear(nn.Module):
    """`y = x W^T + b` with W in int8 (per-output-channel scale) and x quantised per row to
    uint8 `levels + 1 +- levels` (`input_levels()`).

    With `c` and `r` a row's midpoint and half-range, `x = c + r z` where `z` lies in [-1, 1];
    `W x = c (W 1) + r (W z)`, and `W z` runs as a uint8 x int8 product in oneDNN.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        if not int8_supported(weight.device):
            raise ValueError(f"int8 weights run on CPU through oneDNN; this weight is on {weight.device}"
                             " (use bfloat16 weights there)")
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        self.levels = input_levels()
        scale = (w.abs().amax(1) / WEIGHT_LEVELS).clamp(min=torch.finfo(torch.float32).tiny)
        q = (w / scale[:, None]).round().clamp(-WEIGHT_LEVELS, WEIGHT_LEVELS).to(torch.int8)
        self.register_buffer("weight", torch.ops.onednn.qlinear_prepack(q, None), persistent=False)
        # The kernel is asked for the bare integer sums (unit scales): how oneDNN rescales them
        # differs in the last bit between its kernels for 1-2 rows and for more, so the scales
        # are applied here, elementwise, to keep a row's result independent of its batch.
        self.register_buffer("col_scale", scale / self.levels, persistent=False)
        self.register_buffer("unit", torch.ones(len(scale)), persistent=False)
        self.register_buffer("w_zero", torch.zeros(len(scale), dtype=torch.long), persistent=False)
        self.register_buffer("row_sum", (q.float() * scale[:, None]).sum(1), persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().float(), persistent=False)

    def weight_bytes(self) -> int:
        """Bytes one product reads: the int8 weight and its scales."""
        return self.out_features * self.in_features + self.col_scale.numel() * 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        xf = x.reshape(-1, self.in_features).float()
        hi, lo = xf.amax(-1, keepdim=True), xf.amin(-1, keepdim=True)
        mid, half = (hi + lo) / 2, ((hi - lo) / 2).clamp(min=torch.finfo(torch.float32).tiny)
        zero = self.levels + 1
        z = ((xf - mid) / half * self.levels).round_().add_(zero).to(torch.uint8)
        sums = torch.ops.onednn.qlinear_pointwise(z, 1.0, zero, self.weight, self.unit, self.w_zero, None,
                                                  1.0, 0, torch.float32, "none", [], "")
        y = sums * self.col_scale * half + mid * self.row_sum
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*lead, self.out_features)
