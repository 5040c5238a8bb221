"""How full a job keeps its batch, and how close its throughput comes to decoding alone.

Four workloads on the tiny kit (or other models: below), each run several ways side by side, in
one run of this script:
  * `temps48`: 48 rows (the quickstart texts, cycled) carrying 4 per-row temperatures, decoded
    as in jobs/quickstart.yaml (pcg, gamma 3, theta 0.4, max_new_tokens 200); job: one worker,
    batch_size 8, rows_per_shard 6;
  * `augment`: the rows jobs/augment.yaml expands to (voices x seeds x temperatures x methods
    pcg/exact), as that spec says but with one worker;
  * `lengths48`: temps48's texts, each row's `max_new_tokens` its text's estimated speech
    (`engine/decoding/admission.py`) at temperature 1.2, where the kit's rows mostly run to their
    budget: lengths that follow the text, as a real model's do (the kit's end-of-speech is a
    random per-step event, so in the other two workloads a row's length has nothing to do with
    its text);
  * `augment120`: augment's spec with 12 of its 24 variants per text and no audio budget (120
    rows): the same kind of rows, three times as many per batch slot, so the job's final drain
    (the last rounds, when rows finish and none is left to take their slots) weighs less;
  * the job: `pcg-synth run` on a local Ray cluster (models loaded and warmed up before the clock
    starts; `steady.tokens_per_s` runs from the first shard handed out to the last committed,
    codec, audio, Parquet and commit included);
  * decoding alone, the baseline: what `pcg-synth generate` runs, a `Synthesizer` decode session
    over the same rows with the same per-row settings at the same batch size, in this process,
    no Ray, no audio.
Each of them runs with both admission orders (`resources.admission`: `longest_first`, the
default, and `arrival`); ratios compare a job with decoding alone in the same order.
Both get the same CPU threads (`--threads`: torch threads here, `cpus_per_worker` there).
Decoding alone runs before and again after each repetition's jobs (`--no-bracket`: before only),
and a job's ratio is its tokens/s over the mean of the two runs around it: a host whose speed
drifts over minutes (a VM sharing its cores) then weighs on both sides of the ratio. The tables
give medians over repetitions with their [lowest, highest] beside them.
`--probe` also runs decoding alone (arrival order) where a job worker decodes: on a thread of its
own in this process, and twice in a fresh Ray actor process holding its own models (loaded and
warmed up as a worker's); and the job's worker without Ray, in this process; and the job twice
on one worker kept loaded between the runs (`IdleWorkers`), measuring the second; and, in the main
thread, with the attention the device does not use by default (torch's SDPA on CUDA,
`grouped_attention` on a CPU; uncompiled models only). Every run reports
its decoding thread's CPU share of the rounds and its context switches per round. Where a job's
rounds run slower than decoding alone's, these tell the thread, a fresh process, Ray and the
worker's own threads apart. `--admissions arrival` runs one order only. `--profile N` profiles N
decode rounds of every run alike (a job's worker through its spec's `profile`, decoding alone
around the same session steps) and tabulates where a round's time goes: inside torch ops or
between them, and on CUDA the device time, syncs, launches and allocations. `--compile` runs the
jobs and decoding alone with that `models.compile` (on CUDA, `cudagraphs` replays each decode
step as one CUDA graph: a round then launches a few graphs instead of thousands of kernels).
With `--before DIR` (an older engine, e.g. the one before the streaming worker: `mkdir
/tmp/before14 && git archive 22b6ad8 | tar -x -C /tmp/before14`; `--before-label` names it) the
jobs of temps48 and augment also run with that code, in a subprocess, for a before/after table
(in arrival order where that code has admission orders). Repetitions are interleaved (`--reps`);
the machine's load and OpenMP's wait policy (`OMP_WAIT_POLICY`, left as found) are recorded.

    .venv/bin/python benchmarks/bench_job_throughput.py [--before /tmp/before14] [--reps 1]

On a GPU, Llasa-1B's shape (random weights, its untrained 3-layer draft; `--target/--draft` for
others, e.g. the draft benchmarks/llasa_1b_shape.sh distils), a batch a GPU fills, rows to match:

    .venv/bin/python benchmarks/bench_job_throughput.py --preset llasa-1b-shape --device cuda \
        --batch 32 --scale 4 --workloads temps192,augment120
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# OpenMP's wait policy is left as found (unset: GNU OpenMP's default, threads spin briefly between
# ops), as a user's `pcg-synth generate` and job find it; the result file records it. Run the
# script with nothing else on the machine, or with OMP_WAIT_POLICY=PASSIVE where cores are shared.
OMP_WAIT_POLICY = os.environ.get("OMP_WAIT_POLICY")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

TEMPERATURES = [0.6, 0.8, 1.0, 1.2]
RESULT = ROOT / "benchmarks" / "results" / "job_throughput_cpu_tiny"


def quickstart_texts() -> list[dict]:
    rows = [json.loads(x) for x in (ROOT / "jobs/data/quickstart.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in rows if r["text"].strip()]


def temps48_rows(n: int = 48) -> list[dict]:
    base = quickstart_texts()
    rows = []
    for i in range(n):
        src = dict(base[i % len(base)])
        src.pop("seed", None)
        src.pop("temperature", None)
        rows.append({**src, "id": f"t48-{i:03d}", "temperature": TEMPERATURES[i % len(TEMPERATURES)]})
    return rows


def lengths48_rows(n: int = 48) -> list[dict]:
    from engine.decoding.admission import expected_tokens
    from engine.families.llasa import FAMILY as LLASA

    rows = []
    for r in temps48_rows(n):
        r = {**r, "id": r["id"].replace("t48", "l48"), "temperature": 1.2}
        rows.append({**r, "max_new_tokens": expected_tokens(r["text"], 10**6, LLASA.codes_per_second)})
    return rows


def kit_models(kit: Path) -> dict:
    return {"target": str(kit / "target"), "draft": str(kit / "draft"), "codec": str(kit / "codec")}


def specs(models: dict, work: Path, threads: int, before: bool = False, batch: int = 8, scale: int = 1,
          device: str = "cpu"):
    """(name, JobSpec) of the workloads, writing under `work` (`before`: the two the code before
    the streaming worker ran; `models`: target, draft and codec directories; `scale`: temps48's
    and lengths48's rows times this; `device`: cuda gives the worker one GPU)."""
    from engine.config import InputSpec, JobSpec

    quick = JobSpec.load(ROOT / "jobs/quickstart.yaml")
    models = quick.models.model_copy(update={**models, "groups_cache": str(work / "groups")})
    resources = {"workers": 1, "cpus_per_worker": threads}
    if device != "cpu":  # the default specs leave device and GPUs as the quickstart has them
        resources.update(device=device, gpus_per_worker=1)
    n = 48 * scale
    manifest = work / f"temps{n}.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in temps48_rows(n)))
    temps = quick.model_copy(update={
        "name": f"temps{n}", "models": models, "input": InputSpec(manifests=[str(manifest)]),
        "output": quick.output.model_copy(update={"uri": str(work / f"out-temps{n}")}),
        "resources": quick.resources.model_copy(update={**resources, "batch_size": batch, "rows_per_shard": 6})})
    aug = JobSpec.load(ROOT / "jobs/augment.yaml")
    aug = aug.model_copy(update={
        "models": aug.models.model_copy(update={"target": models.target, "draft": models.draft,
                                                "codec": models.codec, "groups_cache": models.groups_cache}),
        "output": aug.output.model_copy(update={"uri": str(work / "out-augment")}),
        "resources": aug.resources.model_copy(update={**resources, "batch_size": batch})})
    if before:
        return [("temps48", temps), ("augment", aug)]
    # the same augmentation spec at a scale where the job's final drain weighs less: 12 of the
    # 24 variants per text, no audio budget (120 rows, 15 per batch slot against augment's 5)
    aug120 = aug.model_copy(update={
        "name": "augment120",
        "augment": aug.augment.model_copy(update={"max_variants_per_text": 12, "max_audio_hours": None}),
        "output": aug.output.model_copy(update={"uri": str(work / "out-augment120")})})
    manifest = work / f"lengths{n}.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in lengths48_rows(n)))
    lengths = temps.model_copy(update={
        "name": f"lengths{n}", "input": InputSpec(manifests=[str(manifest)]),
        "output": quick.output.model_copy(update={"uri": str(work / f"out-lengths{n}")})})
    return [(f"temps{n}", temps), ("augment", aug), (f"lengths{n}", lengths), ("augment120", aug120)]


def job_manifest(spec, work: Path) -> str:
    """The manifest of the rows a spec decodes (augment: its variants file, written under `work`
    as the driver would)."""
    from engine.io.storage import Storage

    if spec.kind == "augment":
        from engine.runtime.augment import expand

        return expand(spec, Storage(spec.storage), str(work / f"rows-{spec.name}")).uri
    return spec.input.manifests[0]


def read_rows(manifest: str) -> list[dict]:
    return [json.loads(x) for x in Path(manifest).read_text().splitlines() if x.strip()]


def job_rows(spec, work: Path) -> list[dict]:
    """The rows a spec decodes (`job_manifest`)."""
    return read_rows(job_manifest(spec, work))


def run_job(spec, rep: int, admission: str | None = None, idle=None, tag: str = "") -> dict:
    """One job run into a fresh output; the figures that matter (`admission`: None for code
    that has no such setting). `idle`: workers kept loaded from a previous run (`IdleWorkers`),
    and Ray left running for the next."""
    import ray

    from engine.runtime.job import JobRunner

    out = spec.output.model_copy(update={"uri": f"{spec.output.uri}-r{rep}-{admission or 'before'}{tag}"})
    update = {"output": out}
    if admission is not None:
        update["resources"] = spec.resources.model_copy(update={"admission": admission})
    spec = spec.model_copy(update=update)
    start = time.perf_counter()
    kept = {"idle": idle} if idle is not None else {}  # an older engine (--before) may have no `idle`
    summary = JobRunner(spec, address="local", progress=False, warmup=True, **kept).run()
    if idle is None:
        ray.shutdown()
    u, steady = summary["utilisation"], summary["steady"]
    workers = summary["workers"].values()
    return {"rows_ok": summary["rows_ok"], "generated_tokens": summary["generated_tokens"],
            "shards": summary["shards"]["total"], "steady_s": steady["wall_s"],
            "steady_tokens_per_s": steady["tokens_per_s"], "slot_utilisation": u["slot_utilisation"],
            "worker_busy_fraction": u["worker_busy_fraction"], "io_wait_s": u.get("io_wait_s"),
            "overlap": u.get("overlap"), "shard_window": u.get("shard_window"), "empty_slots": u.get("empty_slots"),
            "decoders": max((w.get("decoders", 0) for w in workers), default=None),
            "worker_threads": [w.get("torch_threads") for w in workers],
            # the steady window apart: rounds (at what rate), writing (codec, audio, Parquet, upload)
            **decode_figures(workers), "finalise_s": round(sum(w.get("finalise_s", 0.0) for w in workers), 3),
            "codec_s": round(sum(w.get("codec_s", 0.0) for w in workers), 3),
            "wall_s": round(time.perf_counter() - start, 1), "workers_reused": summary["shards"].get("workers_reused"),
            **read_profile(summary.get("profiles"))}


def run_job_kept(spec, rep: int, admission: str) -> dict:
    """The job twice on one worker kept loaded between the runs (as a sweep's points share
    workers): the second run's figures, from a worker process that has decoded these rows before,
    as decoding alone's repeated runs in this process have."""
    import ray

    from engine.runtime.actors import worker_options
    from engine.runtime.pool import IdleWorkers

    idle = IdleWorkers(worker_options(spec)["max_concurrency"])
    try:
        run_job(spec, rep, admission, idle=idle, tag="-kept-first")
        return run_job(spec, rep, admission, idle=idle, tag="-kept")
    finally:
        idle.close()
        ray.shutdown()


def read_profile(uris: list[str] | None) -> dict:
    """`{"profile": ...}`: the first decode-loop profile a run wrote (`--profile`), else {}."""
    return {"profile": json.loads(Path(uris[0]).read_text())} if uris else {}


def utilisation(rounds: list[int], batch: int) -> float:
    """Slot utilisation of one continuously batched decoder over rows admitted in this order,
    each holding a slot for its number of decode rounds (a round advances every active row)."""
    import heapq

    free_at = [0] * batch  # the round at which each slot frees up
    for r in rounds:
        heapq.heappush(free_at, heapq.heappop(free_at) + r)
    return sum(rounds) / (max(free_at) * batch)


def order_bounds(rounds: list[int], estimates: list[int], batch: int, orders: int = 1000) -> dict:
    """What the admission order can do for a workload of rows with these decode rounds (in
    arrival order, the decoder's queue order: it reproduces the measured utilisation): longest
    first by the estimate (`resources.admission: longest_first`), longest first by the rounds
    themselves (an order that knows every row's length in advance), and random orders (ones
    that cannot predict lengths: median and 5-95 % range over `orders` shuffles, seeded)."""
    import random

    gen = random.Random(0)
    shuffled = []
    for _ in range(orders):
        order = list(rounds)
        gen.shuffle(order)
        shuffled.append(utilisation(order, batch))
    shuffled.sort()
    by_estimate = [r for _, _, r in sorted(zip([-e for e in estimates], range(len(rounds)), rounds))]
    return {"as_submitted": round(utilisation(rounds, batch), 4),
            "by_estimate": round(utilisation(by_estimate, batch), 4),
            "longest_first": round(utilisation(sorted(rounds, reverse=True), batch), 4),
            "random_median": round(shuffled[len(shuffled) // 2], 4),
            "random_p05": round(shuffled[len(shuffled) // 20], 4),
            "random_p95": round(shuffled[-len(shuffled) // 20], 4)}


def run_alone(synth, spec, rows: list[dict], admission: str) -> dict:
    """The same rows through a decode session at the job's batch size: decoding alone."""
    from engine.api import structure
    from engine.config import DecodingSettings
    from engine.records import SynthesisItem
    from engine.runtime.profiling import RoundProfiler
    from engine.runtime.threads import thread_clock

    batch = spec.resources.batch_size
    session = synth.session(batch, admission=admission)
    prof = spec.profile  # `--profile`: the same rounds a job's worker profiles
    profiler = RoundProfiler(prof.rounds, prof.skip, device=str(synth.device)) if prof.rounds else None
    pairs = []
    for i, r in enumerate(rows):
        if not r.get("text", "").strip():
            continue
        over = {k: r[k] for k in ("method", "temperature", "top_p", "top_k", "repetition_penalty",
                                  "max_new_tokens") if k in r}
        settings = DecodingSettings(**{**spec.decoding.model_dump(), **over})
        item = SynthesisItem(text=r["text"], id=r["id"], seed=r.get("seed"), prompt_text=r.get("prompt_text"),
                             prompt_codes=r.get("prompt_codes"))
        _, request = synth.prepare(i, item, settings)
        pairs.append((settings, request, request.priority))
    session.submit([(settings, request) for settings, request, _ in pairs])
    clock = thread_clock()
    tokens, start, rounds = 0, time.perf_counter(), {}
    s = session.scheduler
    undrained = None  # (slot rounds, slots) when the last row entered the batch
    profiling_s = profiling_cpu_s = 0.0  # reducing the profile, between rounds: not decoding (as in a worker)
    while not session.idle:
        with profiler.round() if profiler else contextlib.nullcontext():
            finished = session.step()
        if profiler and profiler.due:
            paused, paused_cpu = time.perf_counter(), thread_clock()[0]
            profiler.finish()
            profiling_s += time.perf_counter() - paused
            profiling_cpu_s += thread_clock()[0] - paused_cpu
        for request, row in finished:
            tokens += row.stats.generated_tokens
            rounds[request.key] = row.stats.rounds
        if undrained is None and not s.queued:
            undrained = (s.slot_rounds, s.slots)
    seconds = time.perf_counter() - start - profiling_s
    cpu_s, waits, preempted = (b - a for a, b in zip(clock, thread_clock()))
    cpu_s -= profiling_cpu_s
    if profiler:
        profiler.finish()
    queued: dict[tuple, list[tuple[int, int]]] = {}  # arrival order: `submit` groups rows by structure
    for settings, r, estimate in pairs:
        queued.setdefault(structure(settings), []).append((rounds[r.key], estimate))
    per_row = [x for group in queued.values() for x in group]
    one = len(s.used) == 1
    return {"admission": admission, "rows": len(pairs), "generated_tokens": tokens, "seconds": round(seconds, 3),
            "tokens_per_s": round(tokens / seconds, 2), "slot_utilisation": round(s.slot_rounds / s.slots, 4),
            # the batch until the queue ran dry (the final drain, when no row is left to admit, excluded)
            "slot_utilisation_before_drain": round(undrained[0] / undrained[1], 4) if undrained and undrained[1]
            else None,
            "drain_share_of_slots": round(1 - undrained[1] / s.slots, 4) if undrained else None,
            "decoders": len(s.used), **thread_figures(seconds, cpu_s, waits, preempted, s.rounds),
            "rounds_per_row": [r for r, _ in per_row],
            "estimated_tokens": [e for _, e in per_row],
            "order_bounds": order_bounds(*map(list, zip(*per_row)), batch) if one else None,
            **({"profile": profiler.take()} if profiler else {})}


PROBES = ("alone_arrival", "alone_thread_arrival", "alone_other_attention_arrival", "alone_actor_arrival",
          "alone_actor_again_arrival", "stream_in_process_arrival", "job_kept_arrival")
PROBE_NAMES = {"alone_arrival": "alone, main thread", "alone_thread_arrival": "alone, own thread",
               "alone_other_attention_arrival": "alone, main thread, the other attention (SDPA on CUDA, grouped "
                                                "on a CPU)",
               "alone_actor_arrival": "alone, Ray actor (its first run)",
               "alone_actor_again_arrival": "alone, Ray actor (its second run)",
               "stream_in_process_arrival": "job's worker, no Ray",
               "job_kept_arrival": "job, its worker's second run (kept loaded: IdleWorkers)",
               "job_arrival": "job"}
THREAD_FIGURES = ("cpu_share", "waits_per_round", "preempted_per_round")


def thread_figures(seconds: float, cpu_s: float, waits: int, preempted: int, rounds: int) -> dict:
    """The decoding thread over `seconds` of rounds: its CPU share, and its voluntary (waits)
    and involuntary (preempted) context switches per round (`stream.thread_clock`)."""
    return {"cpu_share": round(cpu_s / seconds, 4) if seconds else None,
            "waits_per_round": round(waits / rounds, 2) if rounds else None,
            "preempted_per_round": round(preempted / rounds, 3) if rounds else None}


HEADLINE = ("rounds", "round_ms_median", "round_ms_mean", "in_torch_ops_ms", "between_ops_ms", "torch_ops",
            "device_ms", "cuda_sync_ms", "cuda_launch_ms", "cuda_malloc_calls")


def headline(profile: dict) -> dict:
    """A decode-loop profile's figures per round (`engine/runtime/profiling.py`), CUDA runtime
    calls summed by kind: synchronisations (stream/device/event syncs, blocking copies),
    kernel launches, device allocations."""
    calls = profile.get("cuda_runtime_per_round")

    def kind(*words: str, field: str = "ms") -> float | None:
        if calls is None:
            return None
        return round(sum(c[field] for name, c in calls.items() if any(w in name for w in words)), 4)
    return {"rounds": profile["rounds"], "round_ms_median": profile["round_ms"]["median"],
            "round_ms_mean": profile["round_ms"]["mean"], "in_torch_ops_ms": profile["in_torch_ops_ms_per_round"],
            "between_ops_ms": profile["between_ops_ms_per_round"], "torch_ops": profile["torch_ops_per_round"],
            "device_ms": profile.get("device_ms_per_round"), "cuda_sync_ms": kind("Synchronize", "Memcpy"),
            "cuda_launch_ms": kind("Launch"), "cuda_malloc_calls": kind("Malloc", field="calls")}


def decode_figures(workers) -> dict:
    """A job's decode rounds over its workers (summary.json's per-worker figures, `per_worker`):
    seconds in them, tokens/s inside them and the decode threads' `thread_figures`."""
    workers = list(workers)
    total = {k: sum(w.get(k, 0) for w in workers) for k in ("generated_tokens", "decode_s", "decode_cpu_s",
                                                            "decode_waits", "decode_preempted", "decode_rounds")}
    seconds = total["decode_s"]
    return {"decode_s": round(seconds, 3),
            "decode_tokens_per_s": round(total["generated_tokens"] / seconds, 2) if seconds else None,
            **thread_figures(seconds, total["decode_cpu_s"], total["decode_waits"], total["decode_preempted"],
                             total["decode_rounds"])}


def rate(run: dict) -> float | None:
    """Tokens/s inside decode rounds: a job's (`decode_figures`), or decoding alone's."""
    return run.get("decode_tokens_per_s", run.get("tokens_per_s"))


def run_alone_in_thread(synth, spec, rows: list[dict], admission: str) -> dict:
    """`run_alone` on a thread of its own, as a job worker's decode loop runs."""
    from engine.runtime.threads import on_short_thread

    return on_short_thread(lambda: run_alone(synth, spec, rows, admission), name="decode")


def run_alone_other_attention(synth, spec, rows: list[dict], admission: str, batch: int) -> dict:
    """`run_alone` with the attention the device does not use by default (`LlamaLM.attention`:
    torch's SDPA on CUDA, `grouped_attention` on a CPU), after a warm-up with it, for a side-by-side
    reading of the two. Uncompiled models only: compiled graphs hold the default attention."""
    models = [m.model for m in (synth.target, synth.draft) if m is not None]
    other = "sdpa" if synth.device.type == "cuda" else "grouped"
    try:
        for m in models:
            m.attention = other
        synth.warmup(spec.decoding, batch)
        return run_alone(synth, spec, rows, admission)
    finally:
        for m in models:
            m.attention = "auto"


class AloneActor:
    """Decoding alone in a Ray actor process: a job worker's process without the job."""

    def __init__(self, models: dict, spec_json: str, device: str, threads: int) -> None:
        import torch

        from engine.api import Synthesizer
        from engine.config import JobSpec

        torch.set_num_threads(threads)
        self.spec = JobSpec.model_validate_json(spec_json)
        m = self.spec.models  # loaded as a job worker loads them (engine/runtime/worker.py)
        self.synth = Synthesizer.load(models["target"], draft=models["draft"], device=device, dtype=m.dtype,
                                      compile=m.compile, draft_weights=m.draft_weights,
                                      batch_size=self.spec.resources.batch_size)
        self.synth.warmup(self.spec.decoding, self.spec.resources.batch_size)

    def run(self, rows: list[dict], admission: str) -> dict:
        return run_alone(self.synth, self.spec, rows, admission)


def run_alone_in_actor(models: dict, spec, rows: list[dict], admission: str, device: str) -> list[dict]:
    """`run_alone` twice in a fresh Ray actor (local Ray, as the jobs here), with the job's
    resources: a job worker's process runs its rows once, after its warm-up; the second run
    shows what a process's first run costs beyond that."""
    import ray

    from engine.connect import init_ray

    init_ray("local", log_to_driver=False, configure_logging=False)
    try:
        res = spec.resources
        actor = ray.remote(num_cpus=res.cpus_per_worker, num_gpus=res.gpus_per_worker)(AloneActor).remote(
            models, spec.model_dump_json(), device, res.cpus_per_worker)
        return [ray.get(actor.run.remote(rows, admission)) for _ in range(2)]
    finally:
        ray.shutdown()


def run_stream_in_process(spec, rep: int, admission: str) -> dict:
    """The job's worker without Ray: a `ShardProcessor` in this process (its decode loop and IO
    thread), fed the job's shards by as many threads as the job's window (as the worker actor's
    threads are), into a fresh output. Decode-round figures only (no driver, no steady window)."""
    from concurrent.futures import ThreadPoolExecutor

    from engine.config import InputSpec
    from engine.io.storage import Storage
    from engine.runtime.augment import expand
    from engine.runtime.job import prepare_groups
    from engine.runtime.plan import make_plan
    from engine.runtime.summary import per_worker
    from engine.runtime.worker import ShardProcessor

    out = spec.output.model_copy(update={"uri": f"{spec.output.uri}-r{rep}-{admission}-in-process"})
    spec = spec.model_copy(update={"output": out,
                                   "resources": spec.resources.model_copy(update={"admission": admission})})
    storage = Storage(spec.storage)
    planned = spec
    if spec.kind == "augment":
        uri = expand(spec, storage, out.uri).uri
        planned = spec.model_copy(update={"input": InputSpec(manifests=[uri])})
    shards = make_plan(planned, storage).shards
    worker = ShardProcessor(spec, prepare_groups(spec, storage, progress=False), "in-process")
    worker.warmup()
    try:
        with ThreadPoolExecutor(max_workers=spec.resources.window) as pool:
            records = list(pool.map(worker.process, shards))
    finally:
        worker.close()
    return {"generated_tokens": sum(r.generated_tokens for r in records),
            **decode_figures(per_worker(records).values()),
            **read_profile([r.profile for r in records if r.profile])}


def run_before(before: Path, kit: Path, work: Path, threads: int, rep: int) -> dict:
    """The job phase with the engine at `before` (a subprocess importing that code)."""
    out = work / f"before-r{rep}.json"
    env = {**os.environ, "PYTHONPATH": str(before)}
    cmd = [sys.executable, __file__, "--job-only", "--kit", str(kit), "--work", str(work / f"before-r{rep}"),
           "--threads", str(threads), "--rep", str(rep), "--json", str(out)]
    subprocess.run(cmd, env=env, check=True, cwd=str(before))
    return json.loads(out.read_text())


def job_only(args) -> None:
    """Subprocess mode: only the jobs, with whatever engine this interpreter imports."""
    import engine
    from engine.config import ResourcesSpec

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    # arrival order, as the table's row says, where that engine has admission orders
    admission = "arrival" if "admission" in ResourcesSpec.model_fields else None
    doc = {"engine": str(Path(engine.__file__).parent)}
    for name, spec in specs(kit_models(Path(args.kit)), work, args.threads, before=True):
        doc[name] = run_job(spec, args.rep, admission)
    Path(args.json).write_text(json.dumps(doc))


def models_of(args, kit: Path) -> tuple[dict, str]:
    """(target, draft, codec directories; a label for the result file): the kit's, the preset's
    (written to --preset-dir on first use) or --target/--draft; the codec is always the kit's."""
    if args.preset:
        root = Path(args.preset_dir)
        if not (root / "target" / "config.json").is_file():
            import torch

            from engine.bench.presets import ModelBuild, llasa_1b_shape

            print(f"writing the {args.preset} checkpoints to {root} ...", flush=True)
            llasa_1b_shape(ModelBuild(torch.device(args.device), torch.float32), save_to=root)
        return {**kit_models(kit), "target": str(root / "target"), "draft": str(root / "draft")}, args.preset
    if args.target:
        if not args.draft:
            sys.exit("--target needs --draft (the job decodes with pcg)")
        target = Path(args.target).resolve()  # labelled by its directory (its parent's, for .../target)
        label = target.parent.name if target.name == "target" else target.name
        return {**kit_models(kit), "target": args.target, "draft": args.draft}, label
    return kit_models(kit), "tiny"


def interpreter() -> str:
    """The Python that ran this, as a reader would type it: relative to the repository when it
    is the project's venv, else its name (a GPU image's python3, say)."""
    exe = Path(sys.executable)
    return str(exe.relative_to(ROOT)) if exe.is_relative_to(ROOT) else exe.name


def ratio(job: dict, alone: dict, after: dict | None = None) -> float | None:
    """A job's steady tokens/s over decoding alone's (the mean of the runs before and after it
    where both are given)."""
    if not job.get("steady_tokens_per_s") or not alone.get("tokens_per_s"):
        return None
    around = [x["tokens_per_s"] for x in (alone, after) if x and x.get("tokens_per_s")]
    return round(job["steady_tokens_per_s"] / (sum(around) / len(around)), 3)


def ratios(jobs: list[dict], alone: list[dict], after: list[dict]) -> list[float | None]:
    """Each repetition's `ratio` (bracketed by the run after it where there is one)."""
    return [ratio(j, x, after[i] if i < len(after) else None) for i, (j, x) in enumerate(zip(jobs, alone))]


def spread(values: list[float | None]) -> list[float] | None:
    """[lowest, highest] of the values, None where fewer than two."""
    values = [v for v in values if v is not None]
    return [min(values), max(values)] if len(values) > 1 else None


def before_commit(doc: dict) -> str:
    """The commit `--before` held: the first word of its label (`2baeb1d (warm-up: codec only)`)."""
    return (doc.get("before_label") or "22b6ad8").split()[0]


def with_spread(value, lo_hi: list | None) -> str:
    """A median as the tables print it: `0.81 [0.74, 0.88]`, or the value alone."""
    return f"{value} [{lo_hi[0]}, {lo_hi[1]}]" if lo_hi else str(value)


def median(values: list[float]) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else round((values[mid - 1] + values[mid]) / 2, 4)


def table(intro: str, header: list[str], rows: list[list]) -> list[str]:
    """Markdown lines: a paragraph, then a table."""
    return (["", intro, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(str(v) for v in row) + " |" for row in rows])


def sections(doc: dict, key: str) -> list[tuple[str, dict]]:
    """(workload, its summary's `key` section) for the workloads that have one (`probe`, `profile`)."""
    return [(name, w["summary"][key]) for name, w in doc["workloads"].items() if key in w["summary"]]


def markdown(doc: dict) -> str:
    m = doc["machine"]
    label = doc.get("models", {}).get("label", "tiny")
    where = (f"{m['gpu']} (CUDA {m['cuda']}), host CPU {m['cpu']}" if m.get("gpu")
             else f"{m['cpu']}, {m['cpu_cores_visible']} cores, {doc['threads']} threads for decoding")
    compiled = f", models.compile {doc['compile']}" if doc.get("compile", "none") != "none" else ""
    policy = ("" if "omp_wait_policy" not in doc  # files written before the script recorded it
              else f"; OMP_WAIT_POLICY {doc['omp_wait_policy'] or 'unset (OpenMP default)'}")
    if "malloc" in doc:  # files written before the script recorded it have no such clause
        kept = doc["malloc"].get("left") is None
        policy += (f"; C allocator: {'freed memory kept (engine/models/malloc.py)' if kept else 'glibc defaults'}"
                   f" in this process{'' if kept else ' (' + doc['malloc']['left'] + ')'}")
    lines = [f"Job throughput on {'the tiny kit' if label == 'tiny' else label}: {where}, torch {m['torch']}, "
             f"models.dtype {doc['dtype']['models.dtype']} "
             f"({doc['dtype']['resolved']} here){compiled} for jobs and decoding alone, {m['date']}; "
             f"load average (1 min) "
             f"{doc['load_average']['start']} at the start, {doc['load_average']['end']} at the end "
             f"(other work shares these cores: compare figures within this file only){policy}.", "",
             "| workload | admission | run | slot utilisation | steady tokens/s | vs decoding alone "
             "| tokens/s inside decode rounds | io wait s | overlap | decoders |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, w in doc["workloads"].items():
        summary = w["summary"]
        if "before" in summary:
            b = summary["before"]
            lines.append(f"| {name} | arrival | job, before ({doc.get('before_label', '22b6ad8')}) | "
                         f"{b['slot_utilisation']} | "
                         f"{with_spread(b['tokens_per_s'], b.get('tokens_per_s_range'))} | "
                         f"{with_spread(b['ratio'], b.get('ratio_range'))} | - | - | - | - |")
        for a in [a for a in ("arrival", "longest_first") if a in summary]:
            x = summary[a]
            alone = with_spread(x["alone_tokens_per_s"], x.get("alone_tokens_per_s_range"))
            lines.append(f"| {name} | {a} | decoding alone (`generate`) | {x['alone_slot_utilisation']} | "
                         f"{alone} | 1 | {alone} | - | - | {x['alone_decoders']} |")
            lines.append(f"| {name} | {a} | job, streaming | {x['job_slot_utilisation']} | "
                         f"{with_spread(x['job_tokens_per_s'], x.get('job_tokens_per_s_range'))} | "
                         f"{with_spread(x['job_ratio'], x.get('job_ratio_range'))} | "
                         f"{x.get('job_decode_tokens_per_s') or '-'} | {x['job_io_wait_s']} | "
                         f"{x['job_overlap']} | {x['job_decoders']} |")
    bounds = [w["runs"]["alone_arrival"][0].get("order_bounds") if w["runs"]["alone_arrival"] else None
              for w in doc["workloads"].values()]
    lines += table("What the order rows are admitted in can do (decoding alone, one decoder; simulated on the "
                   "rounds each row took in the first repetition's arrival-order run, whose order reproduces the "
                   "measured utilisation):",
                   ["workload", "arrival", "longest first by the estimate (`longest_first`)",
                    "longest first by the rounds (lengths known in advance)", "random orders: median [5 %, 95 %]"],
                   [[name, b["as_submitted"], b["by_estimate"], b["longest_first"],
                     f"{b['random_median']} [{b['random_p05']}, {b['random_p95']}]"]
                    for name, b in zip(doc["workloads"], bounds) if b])
    drains = [(name, a, w["summary"][a]) for name, w in doc["workloads"].items() for a in ("arrival", "longest_first")
              if a in w["summary"]]
    lines += table("Where the empty slots are. Decoding alone: the batch until the last row entered it, and the "
                   "final drain after that, when rows finish and nothing is left to admit (its length is set by "
                   "the rows admitted last, so it weighs less the more rows per slot a job has). The job: "
                   "summary.json's `utilisation.empty_slots`, shares of all slots by cause:",
                   ["workload", "admission", "alone: slot utilisation", "alone: until the last row entered",
                    "alone: final drain's share of the slot-rounds", "job: slot utilisation",
                    "job: waiting for shards", "job: other decoders", "job: end of work"],
                   [[name, a, x["alone_slot_utilisation"], x["alone_before_drain"], x["alone_drain_share"],
                     x["job_slot_utilisation"], *x.get("job_empty_slots", {}).values()]
                    for name, a, x in drains if x.get("alone_before_drain") is not None])
    probes = sections(doc, "probe")
    lines += table("Where decoding runs (`--probe`; arrival order): decoding alone in this process's main thread, on"
                   " a thread of its own (as a job worker's decode loop), in a fresh Ray actor process (a worker's "
                   "process without the job; twice, since a worker decodes its rows once after its warm-up, and the "
                   "second run shows what a process's first run costs beyond that); the job's worker without Ray "
                   "(its decode loop and IO thread in this process, fed by as many threads as the job's window); "
                   "the job; and the job run twice on one worker kept loaded between the runs, its second run (a "
                   "worker process that has decoded before, as decoding alone's process has). Tokens/s inside "
                   "decode rounds, and the decoding thread over those rounds: its CPU time"
                   " as a share of their wall time, and its context switches per round, voluntary (it waited: for "
                   "the GIL, a lock, the device, OpenMP's threads) and involuntary (other work took its core). On a "
                   "CPU the two that decode on another thread of this process share it with the OpenMP threads of "
                   "its main thread (decoding alone ran there), which a job worker's process does not "
                   "(`engine/runtime/stream.py`, CPU threads): where the process then holds more OpenMP threads "
                   "than cores, they sleep between ops, so those two rows are slower than a worker would be:",
                   ["workload", "run", "tokens/s", "CPU share", "waits per round", "preempted per round"],
                   [[name, PROBE_NAMES[k], *p[k].values()] for name, p in probes for k in p]) if probes else []
    profiles = sections(doc, "profile")
    lines += table("Where a round's time goes (`--profile`: the same rounds of every run profiled with torch.profiler, "
                   "on the decoding thread; figures per round in ms, medians over repetitions): the round's wall "
                   "time, inside torch ops and between them (Python, waits for the GIL), torch ops per round, and on "
                   "CUDA the kernels' device time and the runtime calls that synchronise with the device (syncs, "
                   "copies), launch kernels and allocate device memory (calls). The profiler slows every op: "
                   "compare these rows with each other, not with the tokens/s above:",
                   ["workload", "run", *HEADLINE],
                   [[name, PROBE_NAMES.get(k, k.replace("_", " ")), *("-" if v is None else v for v in p[k].values())]
                    for name, p in profiles for k in p]) if profiles else []
    orders = doc.get("admissions", ["arrival", "longest_first"])
    bracketed = all(x.get("bracketed") for _, w in doc["workloads"].items() for a, x in w["summary"].items()
                    if a in orders)
    lines += ["", "Medians over repetitions, [lowest, highest] beside them where there are several; each "
              "repetition runs decoding alone and the jobs back to back"
              + (", then decoding alone again, and a job's ratio is over the mean of the decoding-alone runs "
                 "before and after it (decoding alone's figures: all of its runs)" if bracketed else "") + ", "
              + ("in both admission orders (the order alternates between repetitions)" if len(orders) > 1
                 else f"in {orders[0]} order only (`--admissions`)") + ". Workloads: "
              + "; ".join(f"`{k}`: {v['description']}" for k, v in doc["workloads"].items()) + ".",
              "", f"How: `{doc['how']}` ({doc['seconds']:.0f} s)" + (
                  f"; the before code: `git archive {before_commit(doc)} | tar -x -C DIR`."
                  if doc.get("before") else ".")]
    if not doc.get("complete", True):
        done = min((len(v) for w in doc["workloads"].values() for k, v in w["runs"].items() if k != "before"),
                   default=0)
        lines += ["", f"**Cut short**: written after the last workload that finished ({done} of {doc['reps']} "
                      "repetitions); the run stopped before the rest."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kit", default=str(ROOT / "kit"), help="the tiny kit (built if missing)")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--before", help="an older engine checkout (the jobs of temps48 and augment run with it too)")
    ap.add_argument("--before-label", default="22b6ad8",
                    help="the commit --before holds, then optionally a few words on it (for the tables)")
    ap.add_argument("--out", help=f"result-file stem (default {RESULT.relative_to(ROOT)} for the kit on a CPU, "
                                  "else job_throughput_<device>_<models>)")
    ap.add_argument("--preset", choices=["llasa-1b-shape"],
                    help="Llasa-1B-shaped random target and its untrained 3-layer draft, written once to "
                         "--preset-dir (the kit's codec decodes their codes)")
    ap.add_argument("--preset-dir", default=str(ROOT / "work" / "llasa-1b-shape-job"))
    ap.add_argument("--target", help="a target checkpoint directory instead of the kit's (with --draft)")
    ap.add_argument("--draft", help="its draft checkpoint directory (e.g. distilled by benchmarks/llasa_1b_shape.sh)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the job's worker then takes one GPU)")
    ap.add_argument("--batch", type=int, default=8, help="batch size of the jobs and of decoding alone")
    # engine.config.COMPILE_MODES, not imported before parsing: --job-only may run an older engine
    ap.add_argument("--compile", default="none", choices=["none", "inductor", "cudagraphs"],
                    help="models.compile of the jobs and of decoding alone (cudagraphs: CUDA graph replay of "
                         "the decode step, which takes the host's launches out of a round)")
    ap.add_argument("--scale", type=int, default=1, help="temps48's and lengths48's rows times this")
    ap.add_argument("--workloads", help="comma-separated subset (default: all; names as in the result file)")
    ap.add_argument("--probe", action="store_true",
                    help="also decode alone (arrival order) on a thread, with the other attention (SDPA on CUDA, "
                         "grouped on a CPU) and in a fresh Ray actor process (twice), and run the job's worker "
                         "without Ray")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="profile N decode rounds of every run (the job's worker: `profile.rounds`; decoding alone "
                         "alike) and report where a round's time goes")
    ap.add_argument("--profile-skip", type=int, default=0, metavar="S",
                    help="rounds each run lets pass before it profiles")
    ap.add_argument("--no-bracket", dest="bracket", action="store_false",
                    help="decode alone before each repetition's jobs only, not again after them")
    ap.add_argument("--admissions", default="arrival,longest_first",
                    help="admission orders to run, comma-separated (default both; --probe needs arrival)")
    ap.add_argument("--job-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--rep", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job_only:
        return job_only(args)
    import torch

    from engine.api import Synthesizer
    from engine.config import ADMISSIONS
    from engine.kit import build_kit

    admissions = admissions_of(args)
    if args.before and args.compile != "none":
        sys.exit("--before runs the older engine's jobs uncompiled: leave out --compile")
    torch.set_num_threads(args.threads)
    kit = Path(args.kit)
    if not (kit / "kit.json").exists():
        build_kit(kit)
    models, label = models_of(args, kit)
    out = args.out or (str(RESULT) if (label, args.device) == ("tiny", "cpu")
                       else str(RESULT.parent / f"job_throughput_{args.device}_{label.replace('-', '_')}"))
    t0 = time.perf_counter()
    load_start = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory(prefix="bench-job-") as tmp:
        work = Path(tmp)
        os.environ["PCG_SYNTH_CACHE"] = str(work / "cache")
        workloads = specs(models, work, args.threads, batch=args.batch, scale=args.scale, device=args.device)
        if args.profile:
            from engine.config import ProfileSpec

            profile = ProfileSpec(rounds=args.profile, skip=args.profile_skip)
            workloads = [(name, spec.model_copy(update={"profile": profile})) for name, spec in workloads]
        if args.compile != "none":
            workloads = [(name, spec.model_copy(update={"models": spec.models.model_copy(
                update={"compile": args.compile})})) for name, spec in workloads]
        if args.workloads:
            wanted = args.workloads.split(",")
            unknown = set(wanted) - {name for name, _ in workloads}
            if unknown:
                sys.exit(f"unknown workloads {sorted(unknown)}; choose from {[name for name, _ in workloads]}")
            workloads = [(name, spec) for name, spec in workloads if name in wanted]
        rows = {name: job_rows(spec, work) for name, spec in workloads}
        dtype = workloads[0][1].models.dtype  # as the jobs (and `generate`'s default): auto
        synth = Synthesizer.load(models["target"], draft=models["draft"], device=args.device, dtype=dtype,
                                 compile=args.compile)
        for _, spec in workloads:  # as each job's worker warms up (`Synthesizer.warmup`)
            synth.warmup(spec.decoding, args.batch)
        runs = {name: {f"{run}_{a}": [] for run in ("alone", "job", "alone_after") for a in ADMISSIONS}
                | {"before": []}
                | ({k: [] for k in PROBES[1:]} if args.probe else {})
                for name, _ in workloads}
        for rep in range(args.reps):
            for name, spec in workloads:
                order = admissions if rep % 2 == 0 else admissions[::-1]
                for a in order:
                    runs[name][f"alone_{a}"].append(run_alone(synth, spec, rows[name], a))
                    print(name, "alone", a, runs[name][f"alone_{a}"][-1], flush=True)
                for a in order:
                    runs[name][f"job_{a}"].append(run_job(spec, rep, a))
                    print(name, "job", a, runs[name][f"job_{a}"][-1], flush=True)
                # the result so far after every workload's jobs: a run cut short (a lent GPU's
                # time limit) still leaves the comparisons it finished; the bracket and the probe
                # come after them (a job without its run after is compared with the run before)
                report(args, runs, models, label, dtype, synth, load_start, t0, out)
                if args.bracket:  # decoding alone again, after the jobs
                    for a in order[::-1]:
                        runs[name][f"alone_after_{a}"].append(run_alone(synth, spec, rows[name], a))
                        print(name, "alone after", a, rate(runs[name][f"alone_after_{a}"][-1]), flush=True)
                    report(args, runs, models, label, dtype, synth, load_start, t0, out)
                if args.probe:  # the kept worker first: a short lease needs it most
                    runs[name]["job_kept_arrival"].append(run_job_kept(spec, rep, "arrival"))
                    report(args, runs, models, label, dtype, synth, load_start, t0, out)
                    runs[name]["alone_thread_arrival"].append(run_alone_in_thread(synth, spec, rows[name], "arrival"))
                    if args.compile == "none":
                        runs[name]["alone_other_attention_arrival"].append(
                            run_alone_other_attention(synth, spec, rows[name], "arrival", args.batch))
                    first, again = run_alone_in_actor(models, spec, rows[name], "arrival", args.device)
                    runs[name]["alone_actor_arrival"].append(first)
                    runs[name]["alone_actor_again_arrival"].append(again)
                    runs[name]["stream_in_process_arrival"].append(run_stream_in_process(spec, rep, "arrival"))
                    print(name, "alone on a thread / in an actor; the worker in this process",
                          [rate(runs[name][k][-1]) for k in PROBES[1:]], flush=True)
                    report(args, runs, models, label, dtype, synth, load_start, t0, out)
            if args.before:
                before = run_before(Path(args.before), kit, work, args.threads, rep)
                for name, _ in workloads:
                    if name not in before:  # lengths48: per-row budgets, which that code ignores
                        continue
                    runs[name]["before"].append(before[name])
                    print(name, "before", before[name], flush=True)
    report(args, runs, models, label, dtype, synth, load_start, t0, out, final=True)


def admissions_of(args) -> tuple[str, ...]:
    """The admission orders `--admissions` asks for, in the engine's order."""
    from engine.config import ADMISSIONS

    wanted = args.admissions.split(",")
    if set(wanted) - set(ADMISSIONS) or not wanted:
        sys.exit(f"--admissions {args.admissions}: choose from {', '.join(ADMISSIONS)}")
    if (args.probe or args.before) and "arrival" not in wanted:
        sys.exit("--probe and --before compare in arrival order: keep arrival in --admissions")
    return tuple(a for a in ADMISSIONS if a in wanted)


def report(args, runs: dict, models: dict, label: str, dtype: str, synth, load_start: float, t0: float,
           out: str, final: bool = False) -> None:
    """Write the result files (JSON and markdown) over the workloads that have runs so far."""
    from engine.models.malloc import described as malloc_described

    from machine import describe, write_result

    admissions = admissions_of(args)
    n, b = 48 * args.scale, args.batch
    descriptions = {f"temps{n}": f"{n} quickstart texts x 4 per-row temperatures, pcg gamma 3, max_new_tokens 200, "
                                 f"batch {b}, 6 rows per shard, 1 worker",
                    "augment": "jobs/augment.yaml's 40 variants + 1 bad row (pcg and exact rows, 2 temperatures, "
                               f"3 voices), batch {b}, 12 rows per shard, 1 worker",
                    f"lengths{n}": f"temps{n}'s texts at temperature 1.2, each row's max_new_tokens its text's "
                                   "estimated speech (127-257 tokens): on the kit most rows run to their budget, so "
                                   "lengths follow the text as a real model's do; pcg gamma 3, "
                                   f"batch {b}, 6 rows per shard, 1 worker",
                    "augment120": "jobs/augment.yaml's spec with 12 variants per text and no audio budget: 120 "
                                  f"variants + 1 bad row, batch {b}, 12 rows per shard, 1 worker"}
    doc = {"benchmark": "job throughput: slot utilisation and steady tokens/s vs decoding alone "
                        f"({label}, {args.device})",
           "how": f"{interpreter()} benchmarks/bench_job_throughput.py " + shlex.join(sys.argv[1:]),
           "machine": describe(args.device), "threads": args.threads, "reps": args.reps,
           "models": {"label": label, **models},
           "dtype": {"models.dtype": dtype, "resolved": str(synth.target.model.dtype).replace("torch.", "")},
           "compile": args.compile,
           "load_average": {"start": load_start, "end": round(os.getloadavg()[0], 2)},
           "seconds": round(time.perf_counter() - t0, 1), "before": args.before,
           "before_label": args.before_label if args.before else None, "omp_wait_policy": OMP_WAIT_POLICY,
           "malloc": malloc_described(), "complete": final, "admissions": list(admissions), "workloads": {}}
    for name, r in runs.items():
        if not all(r[f"job_{a}"] for a in admissions):
            continue
        summary = {}
        for a in admissions:
            alone, job, after = r[f"alone_{a}"], r[f"job_{a}"], r.get(f"alone_after_{a}", [])
            job_ratios = ratios(job, alone, after)
            summary[a] = {
                "alone_tokens_per_s": median([x["tokens_per_s"] for x in alone + after]),
                # every decoding-alone run of this order, before and after the jobs: the host's swing
                "alone_tokens_per_s_range": spread([x["tokens_per_s"] for x in alone + after]),
                "bracketed": len(after) == len(job),
                "alone_slot_utilisation": median([x["slot_utilisation"] for x in alone]),
                "alone_decoders": alone[0]["decoders"],
                "alone_before_drain": median([x.get("slot_utilisation_before_drain") for x in alone]),
                "alone_drain_share": median([x.get("drain_share_of_slots") for x in alone]),
                "job_tokens_per_s": median([x["steady_tokens_per_s"] for x in job]),
                "job_tokens_per_s_range": spread([x["steady_tokens_per_s"] for x in job]),
                "job_slot_utilisation": median([x["slot_utilisation"] for x in job]),
                "job_ratio": median(job_ratios),
                "job_ratio_range": spread(job_ratios),
                "job_decode_tokens_per_s": median([x.get("decode_tokens_per_s") for x in job]),
                "job_io_wait_s": median([x["io_wait_s"] for x in job]),
                "job_overlap": median([x["overlap"] for x in job]),
                "job_decoders": job[0]["decoders"],
                "job_empty_slots": {k: median([(x.get("empty_slots") or {}).get(k) for x in job])
                                    for k in ("waiting_for_shards", "other_decoders", "end_of_work")},
            }
        if r.get("alone_thread_arrival"):
            summary["probe"] = {k: {"tokens_per_s": median([rate(x) for x in r[k]]),
                                    **{f: median([x.get(f) for x in r[k]]) for f in THREAD_FIGURES}}
                                for k in (*PROBES, "job_arrival")}
        profiled = {k: [x["profile"] for x in r[k] if x.get("profile")] for k in r if k != "before"}
        if any(profiled.values()):
            summary["profile"] = {k: {f: median([headline(x)[f] for x in v]) for f in HEADLINE}
                                  for k, v in profiled.items() if v}
        if r["before"]:  # against decoding alone in arrival order, as the code before had no other
            alone = r["alone_arrival"]
            before_ratios = ratios(r["before"], alone, r.get("alone_after_arrival", []))
            summary["before"] = {
                "tokens_per_s": median([x["steady_tokens_per_s"] for x in r["before"]]),
                "tokens_per_s_range": spread([x["steady_tokens_per_s"] for x in r["before"]]),
                "slot_utilisation": median([x["slot_utilisation"] for x in r["before"]]),
                "ratio": median(before_ratios), "ratio_range": spread(before_ratios)}
        doc["workloads"][name] = {"description": descriptions[name], "summary": summary, "runs": r}
    write_result(doc, f"{out}.json")
    Path(f"{out}.md").write_text(markdown(doc))
    if final:
        print(markdown(doc))


if __name__ == "__main__":
    main()
