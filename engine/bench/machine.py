"""A description of the machine a benchmark ran on, for its result file."""

from __future__ import annotations

import datetime
import os
import platform

import torch

from engine.models.device import auto_dtype, cpu_name


def describe(device: str | torch.device = "cpu") -> dict:
    """Date, platform, CPU, threads, Python/torch versions and the GPU's name where used."""
    device = torch.device(device)
    out = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_cores_visible": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(device),
    }
    auto, why = auto_dtype(device)
    out["dtype_auto"] = f"{str(auto).removeprefix('torch.')}: {why}"  # what `dtype: auto` picks here, and why
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
        out["cuda"] = torch.version.cuda
    try:
        out["load_average_1m"] = round(os.getloadavg()[0], 2)  # a busy machine skews timings
    except OSError:
        pass
    return out
