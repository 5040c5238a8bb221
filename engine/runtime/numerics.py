"""The numerics environment: what, besides the job's settings, decides a shard's codes bit for bit.

The same seeds give the same draws everywhere, but the logits they are drawn from are only
bit-identical under the same arithmetic: the same device type (and model), dtype, torch version
and CPU threads per worker (a reduction split over 2 threads rounds differently from one over 1).
The driver predicts the environment its workers will have (`expected`), records it in
`_job.json` and refuses a resume under another one unless told to allow it; each worker records
the environment it really had (`actual`, with the device model) in every commit record.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from engine.config import JobSpec

COMPARED = ("device", "torch", "threads", "compile", "numerics")  # what the driver can know before any work
# The engine's own arithmetic of a row; outputs written before the field existed are version 1.
# 1: the random draws of `engine.decoding.rng.VERSION` 1.
# 2: top-p's tokens of equal probability at the nucleus's edge: the lowest ids stay (a stable
#    sort's order; before, an unstable sort's), which changes rows with top_p < 1.
# 3: attention off CUDA folds each KV head's query heads into its query positions
#    (`models.attention.folded_attention`): torch's SDPA splits the work another way, bit for bit the
#    same in most shapes (every golden row of the kit) but a last bit off in others (llasa-1b-shape's
#    decode steps in bfloat16), which can move a row's draws.
NUMERICS_VERSION = 3


def worker_threads(spec: JobSpec) -> int:
    """Torch threads of every worker: its reserved CPUs (at least 1), set explicitly."""
    return max(1, int(spec.resources.cpus_per_worker))


def torch_version() -> str:
    try:
        return version("torch")
    except PackageNotFoundError:  # pragma: no cover - torch is a dependency
        return "unknown"


def planned_device(spec: JobSpec) -> str:
    """The device the job's workers decode on: `auto` is cuda for workers that reserve GPUs,
    else cpu (a worker that reserved none never takes a GPU, though Ray leaves it visible)."""
    res = spec.resources
    return res.device if res.device != "auto" else ("cuda" if res.gpus_per_worker > 0 else "cpu")


def worker_device(spec: JobSpec) -> str:
    """`planned_device` as a worker resolves it: `auto` falls back to cpu where torch sees no
    CUDA (a CPU build of torch, logical GPUs of a test cluster)."""
    import torch

    device = planned_device(spec)
    if spec.resources.device == "auto" and device == "cuda" and not torch.cuda.is_available():
        return "cpu"
    return device


def expected(spec: JobSpec) -> dict:
    """The environment the job's workers will decode in, as far as the driver can tell."""
    device = planned_device(spec)
    return {"device": device.split(":")[0], "dtype": spec.models.dtype, "torch": torch_version(),
            "threads": worker_threads(spec), "compile": spec.models.compile, "numerics": NUMERICS_VERSION}


def differences(before: dict, now: dict) -> list[str]:
    """`key before -> now` for every compared key that changed (keys `before` lacks are skipped:
    outputs written before this check existed)."""
    def value(env: dict, key: str):  # written before the setting existed: compile none, numerics 1
        if env.get(key) is None:
            return {"compile": "none", "numerics": 1}.get(key)
        return env[key]

    return [f"{k} {value(before, k)!r} -> {value(now, k)!r}" for k in COMPARED
            if (k in before or k == "numerics") and value(before, k) != value(now, k)]


def device_name(device: str) -> str:
    """The GPU's model, or the CPU's (from /proc/cpuinfo), for the records."""
    import torch

    from engine.models.device import cpu_name

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return cpu_name()


def actual(device: str, dtype, threads: int | None = None) -> dict:
    """The environment this process decodes in (a worker's, for its commit records; `threads`:
    its decoding thread's torch threads, default the calling thread's), but for `compile`: the
    worker adds its rounds' mode as run, which a failed compile can change."""
    import torch

    return {"device": device.split(":")[0], "device_name": device_name(device),
            "dtype": str(dtype).replace("torch.", ""), "torch": torch.__version__,
            "threads": threads or torch.get_num_threads(), "numerics": NUMERICS_VERSION}
