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


def test_devices_are_checked_with_clear_errors():
    for name in ("tpu", "cuda:x", "mps", "gpu"):
        with pytest.raises(dev.DeviceError, match=r"use auto, cpu, cuda or cuda:N"):
            dev.resolve_device(name)
    assert dev.resolve_device("cpu") == torch.device("cpu")
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        assert dev.resolve_device("cuda:0") == torch.device("cuda:0")
        with pytest.raises(dev.DeviceError, match=f"sees {count} CUDA device"):
            dev.resolve_device(f"cuda:{count}")
    else:  # a CPU build, or no GPU: why, not torch's AssertionError from deep inside a load
        with pytest.raises(dev.DeviceError, match="use cpu"):
            dev.resolve_device("cuda")
        with pytest.raises(dev.DeviceError, match=r"device cuda:1: .*use cpu"):
            dev.resolve_device("cuda:1")


def test_the_reason_cuda_is_missing_is_named(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    assert "build without CUDA" in dev.no_cuda_reason()
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert "CUDA_VISIBLE_DEVICES is empty" in dev.no_cuda_reason()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert "finds no usable GPU" in dev.no_cuda_reason()


def test_a_job_worker_takes_a_gpu_only_when_it_reserved_one(monkeypatch):
    from pydantic import ValidationError

    from engine.config import ResourcesSpec
    from engine.runtime import numerics

    class Spec:  # what planned_device and worker_device read of a JobSpec
        def __init__(self, **resources):
            self.resources = ResourcesSpec(**resources)

    with pytest.raises(ValidationError, match="gpus_per_worker > 0"):
        ResourcesSpec(device="cuda")
    with pytest.raises(ValidationError, match="'auto', 'cpu' or 'cuda'"):
        ResourcesSpec(device="cuda:1", gpus_per_worker=1)  # a worker sees its GPUs as cuda:0..
    # Ray leaves a node's GPUs visible to an actor that reserved none: auto must not take them
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert numerics.worker_device(Spec()) == numerics.planned_device(Spec()) == "cpu"
    assert numerics.worker_device(Spec(gpus_per_worker=1)) == "cuda"
    assert numerics.worker_device(Spec(gpus_per_worker=0.5, device="cuda")) == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # logical GPUs, CPU torch
    assert numerics.worker_device(Spec(gpus_per_worker=1)) == "cpu"
    assert numerics.planned_device(Spec(gpus_per_worker=1)) == "cuda"  # what the driver expects
