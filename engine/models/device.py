"""Where models run and in which precision: `auto` is resolved here, and nowhere else."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}


DEVICE_FORMS = "auto, cpu, cuda or cuda:N"
# `compile: auto` on a CPU: eager. A compiled round is shorter there, but each plan and worker first
# pays a compile of seconds, which short jobs, the quickstart and the tests would not win back;
# `inductor` is the explicit choice for long CPU jobs.
CPU_AUTO_COMPILE = "none"


def resolve_compile(compile: str, device: str | torch.device, weights: str = "native") -> str:
    """`compile: auto` made concrete: cudagraphs on CUDA, `CPU_AUTO_COMPILE` on a CPU, none for
    int8 weights (they run eagerly); any other mode as given."""
    if compile != "auto":
        return compile
    if weights == "int8":
        return "none"
    return "cudagraphs" if torch.device(device).type == "cuda" else CPU_AUTO_COMPILE


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one), for records and result files."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


class DeviceError(ValueError):
    """A device that is not one of `DEVICE_FORMS`, or a CUDA device this process cannot use."""


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """`auto` (or None): CUDA where available, else CPU; `cpu`, `cuda`, `cuda:N` after checking
    that this process can use it.

    Raises:
        DeviceError: another name, CUDA asked where torch sees none, an index it does not see.
    """
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise DeviceError(f"device {str(device)!r}: use {DEVICE_FORMS}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device {dev}: {no_cuda_reason()}; use cpu (or auto)")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise DeviceError(f"device {dev}: this process sees {count} CUDA device(s), "
                              f"cuda:0 to cuda:{count - 1}")
    return dev


def no_cuda_reason() -> str:
    """Why torch sees no CUDA device here, in a few words."""
    import os

    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is a build without CUDA"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible.strip():
        return "CUDA_VISIBLE_DEVICES is empty, which hides every GPU"
    return f"torch (CUDA {torch.version.cuda}) finds no usable GPU (none here, or no driver)"


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
    (there a bf16 matmul of several rows costs less than a 1-row float32 one), else float32:
    without them bfloat16 takes a kernel whose cost grows with the rows, faster than float32 for
    one row but slower from a few, and batched decoding and verification run several rows a
    step.
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
