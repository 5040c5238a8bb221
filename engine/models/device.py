"""Where models run and in which precision: `auto` is resolved here, and nowhere else."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """`auto` (or None): CUDA where available, else CPU; any other name as torch reads it."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def cpu_instructions(names: tuple[str, ...]) -> list[str]:
    """Those of `names` (torch's names, e.g. `avx512_bf16`) this CPU has, as torch detects them;
    empty where torch cannot tell."""
    caps = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
    return [name for name in names if caps.get(name)]


def cpu_bf16_instructions() -> list[str]:
    """The native bfloat16 matrix instructions this CPU has (AVX512-BF16, AMX-BF16); empty where
    it has none (e.g. older x86, most ARM servers)."""
    return cpu_instructions(("avx512_bf16", "amx_bf16"))


def auto_dtype(device: torch.device) -> tuple[torch.dtype, str]:
    """What `dtype: auto` means on `device`, and why.

    bfloat16 on CUDA; on a CPU, bfloat16 where it has native bfloat16 matrix instructions
    (there a bf16 matmul of 4 rows costs less than a 1-row float32 one: measured on the
    project's Zen 4 VM, 2048 x 8192, packed weights), else float32: without them bfloat16 takes
    a kernel whose cost grows with the rows, faster than float32 for one row but slower from
    about four (the lab's AVX2-only EPYC, benchmarks/results/cpu_dtype_avx2.json), and batched
    decoding and verification run several rows a step.
    """
    if device.type == "cuda":
        return torch.bfloat16, "CUDA"
    if device.type == "cpu":
        native = cpu_bf16_instructions()
        if native:
            return torch.bfloat16, f"CPU with native bfloat16 ({', '.join(native)})"
        return torch.float32, "CPU without native bfloat16 instructions"
    return torch.float32, f"{device.type} device"


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """`auto` as `auto_dtype` decides; a name from `DTYPES`; or a torch dtype as is."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return auto_dtype(torch.device(device))[0]
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {dtype!r}")
    return DTYPES[dtype]
