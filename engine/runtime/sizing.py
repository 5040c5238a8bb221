"""The dry run's sizing of a job's workers (`pcg-synth run --dry-run`, docs/sizing.md): the
memory a worker takes, whether it fits the GPU named (`--gpu`) or cards of 24, 40 and 80 GB, the
memory-bound floor of its rounds and the hours a job takes at best, from the config.json of its
target and draft, or the record of its stream heads (`engine.decoding.sizing` holds the model and
says what it counts). Every figure is a projection. Imports no torch."""

from __future__ import annotations

import json

from engine.config import JobSpec, decoding_default
from engine.decoding.sizing import GB, GPU, LMSize, StreamsSize, Worker, gpu_named, job_hours, speed
from engine.families import Family
from engine.io.storage import STREAMS_INFO, Storage, StorageError, hub_ref, hub_snapshot, join

AUTO_GAMMA_MAX = 8  # the longest draft `gamma: auto` may choose (`adaptive.CANDIDATES`): what it is sized for
MEMORY_CLASSES = (24, 40, 80)  # GB: the cards a dry run without --gpu sizes for


def checkpoint_config(storage: Storage, ref: str) -> dict:
    """The config.json of the checkpoint `ref` (a path, an object-store URI or a Hub model).

    Raises:
        ValueError: it cannot be read.
    """
    try:
        hub = hub_ref(ref)
        if hub is not None:
            return json.loads((hub_snapshot(hub, config_only=True) / "config.json").read_text())
        return json.loads(storage.read_bytes(join(ref.rstrip("/"), "config.json")))
    except (OSError, ValueError, StorageError) as exc:
        raise ValueError(f"{ref}: cannot read its config.json ({exc})") from None


def drafter_config(storage: Storage, ref: str) -> tuple[dict | None, dict | None]:
    """(config.json, None) of a draft checkpoint, or (None, its `pcg_streams.json`) of a directory
    of stream heads, named by `ref` (a path, an object-store URI or a Hub model: a draft model's
    config only, as a Hub model is asked for nothing else here).

    Raises:
        ValueError: neither can be read.
    """
    record = join(ref.rstrip("/"), STREAMS_INFO)
    try:
        if hub_ref(ref) is None and storage.exists(record):
            return None, json.loads(storage.read_bytes(record))
    except (OSError, ValueError, StorageError) as exc:
        raise ValueError(f"{ref}: cannot read its {STREAMS_INFO} ({exc})") from None
    return checkpoint_config(storage, ref), None


# ---- in words --------------------------------------------------------------------------------------


def size(nbytes: float) -> str:
    """`16.1 GB`, or `353 MB` below a GB."""
    return f"{nbytes / GB:.1f} GB" if nbytes >= GB else f"{nbytes / 1e6:.0f} MB"


def span(hours: float) -> str:
    """`42 seconds`, `12.5 minutes` or `3.5 hours`."""
    if hours * 60 < 1:
        return f"{hours * 3600:.0f} seconds"
    return f"{hours * 60:.1f} minutes" if hours < 1 else f"{hours:.1f} hours"


def rate(x: float) -> str:
    """About three figures: `1,893`, `742`, `16.9`, `5.00`, `0.31`."""
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}" if x >= 1 else f"{x:.2g}"


def describe(worker: Worker, workers: int, share: float, gpu: GPU | None, speed_gamma: int,
             audio_hours: float | None = None) -> tuple[dict, list[str]]:
    """The dry run's sizing of a job: (report, warnings). `worker` sized for its gamma, the speed
    projected at `speed_gamma`; `share` of a GPU a worker holds; `gpu` None: the cards of
    `MEMORY_CLASSES`, the speed on an H100."""
    parts = {"target": worker.weights(worker.target), "codec": worker.codec(),
             "rows": worker.batch * worker.per_row(), "allowances": worker.allowances()}
    if worker.draft is not None:
        parts["draft"] = worker.weights(worker.draft)
    if worker.streams is not None:
        parts["streams"] = worker.streams_weights()
    report: dict = {"projection": True, "dtype": worker.dtype, "batch": worker.batch, "workers": workers,
                    "gpu_share": share, "gamma_sized": worker.gamma, "worker_bytes": worker.total(),
                    "per_row_bytes": worker.per_row(), "kv_per_row_bytes": worker.kv_per_row(), "parts_bytes": parts}
    cards = [(gpu.name, gpu.memory_gb)] if gpu else [(f"{gb} GB", gb) for gb in MEMORY_CLASSES]
    report["gpu"] = gpu.name if gpu else None
    report["fits"] = [{"gpu": name, "memory_gb": gb, "fits": worker.total() <= gb * GB * share,
                       "largest_batch": worker.largest_batch(gb * share)} for name, gb in cards]
    on = gpu or gpu_named("H100")
    fast, ar = speed(worker, on, speed_gamma, share=share), speed(worker, on, 0, share=share)
    report["speed"] = {"gpu": on.name, "bandwidth": on.bandwidth, "gamma": speed_gamma,
                       "round_bytes": worker.round_bytes(speed_gamma), "round_s": fast.round_s,
                       "tokens_per_round": fast.tokens_per_round,
                       "audio_hours_per_hour": fast.audio_per_hour * workers,
                       "ar_audio_hours_per_hour": ar.audio_per_hour * workers}
    if audio_hours is not None:
        report["hours"] = {"audio_hours": audio_hours, "projected_hours": job_hours(audio_hours, fast, workers),
                           "ar_projected_hours": job_hours(audio_hours, ar, workers)}
    return report, fit_warnings(report, worker, gpu, share)


def fit_warnings(report: dict, worker: Worker, gpu: GPU | None, share: float) -> list[str]:
    """What to say when a worker fits no card it is sized for."""
    if any(f["fits"] for f in report["fits"]):
        return []
    need = f"a worker needs about {size(worker.total())} (a projection)"
    if gpu is None:
        return [f"sizing: {need}, more than {MEMORY_CLASSES[-1]} GB: lower resources.batch_size, or name a "
                "larger GPU with --gpu"]
    most = report["fits"][0]["largest_batch"]
    return [f"sizing: {need} and does not fit {'its share of ' if share < 1 else ''}the {gpu.name}'s "
            f"{gpu.memory_gb:g} GB: " + (f"set resources.batch_size to {most} or less" if most else
                                           "the models and allowances leave no room for a row; use a GPU "
                                           "with more memory or smaller models")]


def sizing_lines(report: dict) -> list[str]:
    """The dry run's lines for a `describe` report."""
    parts = report["parts_bytes"]
    models = ", ".join(f"{k} {size(parts[k])}" for k in ("target", "draft", "streams", "codec") if k in parts)
    lines = [f"  memory     about {size(report['worker_bytes'])} a worker ({report['dtype']}; projected): {models}, "
             f"{report['batch']} rows x {size(report['per_row_bytes'])} (caches, state, buffers), "
             f"{size(parts['allowances'])} allowances"]
    fits = [f"{f['gpu']}: " + (f"yes, up to batch {f['largest_batch']}" if f["fits"] else
                               f"no (batch {f['largest_batch']} at most)" if f["largest_batch"] else "no")
            for f in report["fits"]]
    lines.append("  fits       " + "; ".join(fits) + ("" if report["gpu"] else " (--gpu NAME sizes for a named GPU)"))
    sp, share, workers = report["speed"], report["gpu_share"], report["workers"]
    said = (f"  speed      projected floor on {sp['gpu']} ({sp['bandwidth'] / 1e12:g} TB/s"
            + (f", {share:g} of it a worker" if share < 1 else "")
            + f"): {sp['round_s'] * 1e3:.1f} ms a round at batch {report['batch']} ({size(sp['round_bytes'])} read); ")
    on = f"{workers} worker{'s' * (workers != 1)}"
    if sp["gamma"]:
        said += (f"with gamma {sp['gamma']} and every draft accepted, at most {rate(sp['audio_hours_per_hour'])} hours "
                 f"of audio an hour on {on} (ar: {rate(sp['ar_audio_hours_per_hour'])})")
    else:
        said += f"at most {rate(sp['audio_hours_per_hour'])} hours of audio an hour on {on}"
    lines.append(said + ("" if report["gpu"] else " (--gpu NAME for yours)"))
    if hours := report.get("hours"):
        lines.append(f"  hours      the job's {span(hours['audio_hours'])} of audio: at least "
                     f"{span(hours['projected_hours'])} (ar: {span(hours['ar_projected_hours'])}), projected")
    return lines


def gpu_workers(spec: JobSpec) -> bool:
    """Whether the job's workers decode on GPUs: `resources.device` cuda, or auto with GPUs reserved."""
    res = spec.resources
    return res.device == "cuda" or (res.device == "auto" and res.gpus_per_worker > 0)


def job_sizing(spec: JobSpec, family: Family, target: dict, draft: dict | None, gpu: GPU | None = None,
               audio_hours: float | None = None, streams: dict | None = None) -> tuple[dict, list[str]]:
    """`describe` for a job's GPU workers, from the config.json of its target and draft (or the
    `pcg_streams.json` of its stream heads, `streams`): `dtype: auto` as bfloat16 (what it is on
    CUDA), `gamma: auto` sized for `AUTO_GAMMA_MAX` and projected at the default draft length,
    each at most the heads' count (they propose no more)."""
    res, decoding = spec.resources, spec.decoding
    dtype = "bfloat16" if spec.models.dtype == "auto" else spec.models.dtype
    heads = StreamsSize.from_info(streams) if streams else None
    limit = heads.heads if heads else AUTO_GAMMA_MAX
    said = []
    if not decoding.speculative:
        sized = projected = 0
    elif decoding.gamma == "auto":
        sized, projected = min(AUTO_GAMMA_MAX, limit), min(decoding_default("gamma"), limit)
    else:
        sized = projected = decoding.gamma
        if heads and decoding.gamma > heads.heads:
            said.append(f"decoding.gamma {decoding.gamma} needs {decoding.gamma} stream heads; models.draft "
                        f"{spec.models.draft} has {heads.heads}: the workers will refuse it (use {heads.heads} "
                        "or less, or auto)")
    worker = Worker(family, LMSize.from_config(target), LMSize.from_config(draft) if draft else None,
                    res.batch_size, sized, dtype, heads)
    report, warnings = describe(worker, res.workers, min(res.gpus_per_worker, 1.0), gpu, projected, audio_hours)
    return report, said + warnings


def dry_run_sizing(spec: JobSpec, storage: Storage, family: Family, gpu: GPU | None,
                   audio_hours: float) -> tuple[dict | None, list[str]]:
    """`job_sizing` with the configs read from the spec's checkpoints; (None, []) for CPU workers
    (their host memory is not sized), (None, why) where a config cannot be read or is no Llama
    config (the job itself then says what is wrong)."""
    if not gpu_workers(spec):
        return None, []
    try:
        target = checkpoint_config(storage, spec.models.target)
        draft, streams = drafter_config(storage, spec.models.draft) if spec.models.draft else (None, None)
        return job_sizing(spec, family, target, draft, gpu, audio_hours, streams)
    except (ValueError, KeyError, TypeError) as exc:
        return None, [f"sizing: skipped ({exc})"]
