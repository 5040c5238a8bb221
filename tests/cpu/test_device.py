"""`dtype: auto` follows the hardware: bfloat16 on CUDA and on CPUs with native bfloat16
instructions, float32 on other CPUs (detected, not guessed)."""

from __future__ import annotations

import pytest
import torch

from engine.models import device as dev


@pytest.mark.parametrize("native, expected", [([], torch.float32), (["avx512_bf16"], torch.bfloat16),
                                              (["amx_bf16"], torch.bfloat16)])
def test_cpu_auto_dtype_follows_native_bf16(monkeypatch, native, expected):
    monkeypatch.setattr(dev, "cpu_bf16_instructions", lambda: list(native))
    dtype, why = dev.auto_dtype(torch.device("cpu"))
    assert dtype == expected
    assert dev.resolve_dtype("auto", torch.device("cpu")) == expected
    assert why.startswith("CPU with native") == bool(native)
    assert all(name in why for name in native)


def test_cuda_auto_is_bfloat16_and_names_win():
    assert dev.resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert dev.resolve_dtype("float32", torch.device("cuda")) == torch.float32
    with pytest.raises(ValueError, match="dtype must be one of"):
        dev.resolve_dtype("half-ish", torch.device("cpu"))


def test_detection_reads_torch_capabilities():
    caps = torch.cpu.get_capabilities()
    assert dev.cpu_bf16_instructions() == [n for n in ("avx512_bf16", "amx_bf16") if caps.get(n)]


def test_codec_auto_stays_float32_on_cpu_even_with_native_bf16(monkeypatch):
    from engine.codec.xcodec2 import codec_dtype

    monkeypatch.setattr(dev, "cpu_bf16_instructions", lambda: ["avx512_bf16"])
    assert codec_dtype("auto", torch.device("cpu")) == torch.float32
    assert codec_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
