"""Weights stored in oneDNN's blocked layout for a CPU's decode step (`PackedLinear`), and the
op that keeps them inside compiled rounds (`packed_linear`).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.models.ops import opaque_op


class PackedLinear(nn.Module):
    """A linear layer whose weight is stored in oneDNN's blocked layout (CPU only).

    Why: ATen's CPU matmul lays the weight out for its kernel on every call. For the decode
    step's one- to few-row products that relayout reads the whole weight once more, which about
    doubled a step at Llasa-1B's shape, with bit-identical logits (both run oneDNN's kernel; only
    the relayout moves to load time).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
        self.register_buffer("weight", packed, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach(), persistent=False)

    def weight_bytes(self) -> int:
        return self.out_features * self.in_features * self.weight.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # one opaque call in a compiled round (see `packed_linear`)
            return torch.ops.pcg_synth.packed_linear(x, self.weight, self.bias, self.out_features)
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


def packed_linear(x, weight, bias, out_features):
    """oneDNN's linear on a packed weight, as an op inductor calls as it is
    (`torch.ops.pcg_synth.packed_linear`, an `opaque_op`). Inductor lowers `mkldnn._linear_pointwise`
    only for weights it froze itself (and a frozen graph cannot be cached on disk); behind this op a
    compiled round keeps the model's own packed weights and stays cacheable."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


opaque_op("packed_linear", "(Tensor x, Tensor weight, Tensor? bias, SymInt out_features) -> Tensor", packed_linear,
          lambda x, weight, bias, out_features: x.new_empty(*x.shape[:-1], out_features))


def prepack_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Packed weights need oneDNN, i.e. a CPU build with mkldnn, in float32, or in bfloat16 where
    oneDNN has a bf16 path on this CPU (AVX512-BW/VL/DQ or AVX-NE-CONVERT; an AVX2-only CPU has
    none, and there a bfloat16 model keeps plain weights)."""
    if torch.device(device).type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return onednn_bf16()
    return dtype == torch.float32


def onednn_bf16() -> bool:
    """Whether oneDNN can run bfloat16 matmuls on this CPU (natively or by conversion)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
