"""int8 weights for a draft model on CPU: half the bytes a decode step reads.

A draft only proposes; every acceptance rule corrects with the draft's probabilities as computed,
so a coarser draft changes acceptance, never the target's distribution. On a CPU the decode step
is bound by the bytes of weights it reads, and int8 weights halve them. Measured on the lab's
2-core Xeon (AMX) at the llasa-1b-shape draft's projections (3 layers + the 65,537-row head, each
a distinct tensor; benchmarks/results/int8_draft_cpu.json): bfloat16 prepacked 31.5 ms, this
layer 21.9 ms for one row and 29.9 ms for eight; ATen's weight-only `_weight_int8pack_mm` 23.9 ms
for one row and 53 ms for eight (it is compute-bound).

Rows stay independent: each row of the input is mapped onto [-1, 1] by its own midpoint and
half-range before it is quantised to uint8 with a fixed scale, so a row's proposals do not
depend on which rows share its batch (integer products are exact, the rescaling is per row).
A per-tensor dynamic scale, as `torch.ao`'s dynamic quantisation uses, would couple them.

How many weight levels depends on the CPU (`weight_levels`). With VNNI or AMX int8 instructions
oneDNN accumulates every uint8 x int8 product in int32, so weights use all of [-127, 127]. Without
them (AVX2, AVX512 before VNNI) its kernel adds each pair of adjacent products in int16 with
saturation first (`vpmaddubsw`), and 2 x 255 x 127 overflows int16: on the lab's AVX2-only EPYC a
full-range layer's integer sums came back clipped (relative error 0.061 against the float product
on the test's layer, where 7-bit weights give 0.015 and the exact integer sums). There weights use
[-63, 63] (2 x 255 x 63 = 32,130 fits), as fbgemm's `reduce_range` does for the same reason.
"""

from __future__ import annotations

import torch
from torch import nn

INPUT_LEVELS = 127  # inputs: uint8 128 +- 127 over the row's range
VNNI = ("avx512_vnni", "avx_vnni", "amx_int8")  # int32 accumulation of uint8 x int8 products


def int8_supported(device: torch.device | str) -> bool:
    """oneDNN's int8 matmul: a CPU build with mkldnn and the onednn quantised-linear ops."""
    return (torch.device(device).type == "cpu" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.onednn, "qlinear_pointwise"))


def cpu_vnni() -> bool:
    """Whether this CPU has int8 dot-product instructions (VNNI, AMX int8), as torch detects them.
    Without them oneDNN's int8 matmul is slower than float32: on the lab's AVX2-only EPYC a
    llasa-1b-shape draft step took 1.28x float32's time at batch 1 and 1.50x at batch 8
    (benchmarks/results/int8_draft_cpu_avx2.json), so int8 draft weights pay only with them."""
    caps = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
    return any(caps.get(name) for name in VNNI)


def weight_levels() -> int:
    """The largest weight magnitude in int8: 127 where the CPU sums uint8 x int8 products in
    int32 (`cpu_vnni`), else 63, so that the int16 pair sums of AVX2's kernel cannot saturate
    (see the module's docstring)."""
    return 127 if cpu_vnni() else 63


class Int8Linear(nn.Module):
    """`y = x W^T + b` with W in int8 (per-output-channel scale, magnitudes up to
    `weight_levels()`) and x quantised per row.

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
        self.levels = weight_levels()
        scale = (w.abs().amax(1) / self.levels).clamp(min=torch.finfo(torch.float32).tiny)
        q = (w / scale[:, None]).round().clamp(-self.levels, self.levels).to(torch.int8)
        self.register_buffer("weight", torch.ops.onednn.qlinear_prepack(q, None), persistent=False)
        # The kernel is asked for the bare integer sums (unit scales): how oneDNN rescales them
        # differs in the last bit between its kernels for 1-2 rows and for more, so the scales
        # are applied here, elementwise, to keep a row's result independent of its batch.
        self.register_buffer("col_scale", scale / INPUT_LEVELS, persistent=False)
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
        z = ((xf - mid) / half * INPUT_LEVELS).round_().add_(128).to(torch.uint8)
        sums = torch.ops.onednn.qlinear_pointwise(z, 1.0, 128, self.weight, self.unit, self.w_zero, None,
                                                  1.0, 0, torch.float32, "none", [], "")
        y = sums * self.col_scale * half + mid * self.row_sum
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*lead, self.out_features)
