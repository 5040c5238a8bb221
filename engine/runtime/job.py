"""The job driver: validate, plan, resume, prepare groups, run the worker pool, summarize."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import ray
from tqdm.auto import tqdm

from engine.config import JobSpec
from engine.console import bar_disabled, counted
from engine.io.storage import Storage, StorageError
from engine.runtime.connect import init_ray
from engine.runtime.plan import Layout, Plan, make_plan
from engine.runtime.pool import IdleWorkers, JobFailed, WorkerPool
from engine.runtime.summary import progress_postfix, summarize, summary_table


def preflight(spec: JobSpec, storage: Storage) -> None:
    """Fail before any work on what can be checked cheaply: models present, output writable.

    Raises:
        ValueError: naming the spec field at fault.
    """
    for field in ("target", "draft", "codec"):
        uri = getattr(spec.models, field)
        if uri is None:
            continue
        try:
            found = storage.has_checkpoint(uri.rstrip("/"))
        except StorageError as exc:
            raise ValueError(f"models.{field}: {exc}") from None
        if not found:
            raise ValueError(f"models.{field}: no checkpoint at {uri} (config.json missing)")
    if spec.models.groups and not storage.exists(spec.models.groups):
        raise ValueError(f"models.groups: no groups file at {spec.models.groups}")
    probe = Layout(spec.output.uri).root.rstrip("/") + "/_probe"
    try:
        storage.write_bytes(probe, b"")
        storage.delete(probe)
    except (StorageError, OSError) as exc:
        raise ValueError(f"output.uri: cannot write under {spec.output.uri} ({exc})") from None


def check_resume(spec: JobSpec, plan: Plan, storage: Storage, layout: Layout,
                 allow_numerics_change: bool = False) -> tuple[set[str], list[str]]:
    """Record the job in the output, or verify a rerun is the same job under the same numerics
    environment; returns the committed shard ids and the numerics differences allowed.

    Raises:
        ValueError: the output holds a different job, or was written under another numerics
            environment (device type, torch version, threads per worker) and that was not
            allowed.
    """
    from engine.runtime import numerics

    now = numerics.expected(spec)
    changes: list[str] = []
    if storage.exists(layout.job):
        earlier = json.loads(storage.read_bytes(layout.job))
        if earlier.get("fingerprint") != plan.fingerprint:
            raise ValueError(
                f"output.uri {spec.output.uri} holds another job (plan {earlier.get('fingerprint')}, "
                f"this one {plan.fingerprint}: manifests, models or settings changed); choose a new "
                "output.uri or delete the old one")
        changes = numerics.differences(earlier.get("numerics") or {}, now)
        if changes and not allow_numerics_change:
            raise ValueError(
                f"output.uri {spec.output.uri} was written under another numerics environment "
                f"({'; '.join(changes)}): shards decoded now could differ in their codes from the "
                "committed ones; resume with the same settings and software, or pass "
                "--allow-numerics-change (recorded in the summary)")
        if changes:
            earlier.setdefault("numerics_changes", []).append({"changes": changes, "now": now})
            storage.write_bytes(layout.job, json.dumps(earlier, indent=1).encode())
    else:
        record = {"name": spec.name, "spec": spec.model_dump(mode="json"), **plan.to_dict(), "numerics": now}
        storage.write_bytes(layout.job, json.dumps(record, indent=1).encode())
    ids = {s.id for s in plan.shards}
    committed = {u.rsplit("/", 1)[-1][: -len(".json")] for u in storage.list(layout.commit("x").rsplit("/", 1)[0])}
    return committed & ids, changes


def needs_groups(spec: JobSpec) -> bool:
    return "pcg" in {spec.decoding.method, *(spec.augment.methods or [] if spec.augment else [])}


def check_groups_file(spec: JobSpec, storage: Storage):
    """The groups file `models.groups`, verified before any work (before `_job.json` is
    written): intact, and built for this job's theta and group-size cap from this target's
    speech-token embeddings (their hash). Every error names the file.

    Raises:
        ValueError: `models.groups: <uri>: why`.
    """
    from engine.groups.source import embeddings_sha256, speech_embeddings_of
    from engine.groups.store import GroupFileError, from_bytes

    uri = spec.models.groups
    try:
        data = storage.read_bytes(uri)
        embeddings = speech_embeddings_of(storage, spec.models.target)
        expect = {"embeddings_sha256": embeddings_sha256(embeddings), "theta": spec.decoding.theta,
                  "max_group_size": spec.decoding.max_group_size}
        return from_bytes(data, uri, expect)
    except (GroupFileError, StorageError) as exc:
        raise ValueError(f"models.groups: {exc}") from None


def prepare_groups(spec: JobSpec, storage: Storage, progress: bool = True, given=None):
    """PCG groups for the job: the checked `models.groups` file (`given`), or fetched from the
    groups cache (built there once) here, on the driver, which ships them to every worker
    through Ray's object store (workers never build them). So the default cache is this user's
    (`$PCG_SYNTH_CACHE/groups` or `~/.cache/pcg-synth/groups`), shared by every job;
    `models.groups_cache` names another (e.g. an s3:// prefix that several drivers share)."""
    if not needs_groups(spec):
        return None
    if given is not None:
        return given
    if spec.models.groups:
        return check_groups_file(spec, storage)
    from engine.groups.cache import default_cache_dir, get_groups
    from engine.groups.source import speech_embeddings_of
    from engine.runtime.storage_blobs import StorageBlobStore

    embeddings = speech_embeddings_of(storage, spec.models.target)
    store = StorageBlobStore(storage, spec.models.groups_cache or str(default_cache_dir()))
    return get_groups(embeddings, spec.decoding.theta, spec.decoding.max_group_size, store=store,
                      progress=progress)


def finished_summary(storage: Storage, layout: Layout, plan: Plan) -> dict | None:
    """The summary a finished run of this very job wrote (every shard committed), else None."""
    if not storage.exists(layout.summary):
        return None
    summary = json.loads(storage.read_bytes(layout.summary))
    shards = summary.get("shards", {})
    done = shards.get("committed") == len(plan.shards) and not shards.get("failed")
    return summary if summary.get("fingerprint") == plan.fingerprint and done else None


class JobRunner:
    """Runs a job spec on the Ray cluster this process is connected to (or a local one).

    Args:
        spec: the job.
        address: Ray address (`auto`, `ray://HEAD:10001`, `local`); None: `RAY_ADDRESS` if set,
            else a fresh local cluster.
        progress: show the progress bar and the final table.
        on_commit: extra callback per committed shard (tests use it to inject failures).
        warmup: workers warm up and start together (for throughput measurements).
        allow_numerics_change: resume an output written under another numerics environment
            (`runtime/numerics.py`); the difference is recorded in `_job.json` and the summary.
        idle: workers kept loaded between this driver's jobs (`pool.IdleWorkers`: a sweep's
            points); None: the job starts its own workers and retires them at its end.
    """

    def __init__(self, spec: JobSpec, address: str | None = None, progress: bool = True,
                 on_commit: Callable[[dict], None] | None = None, warmup: bool = False,
                 allow_numerics_change: bool = False, idle: IdleWorkers | None = None) -> None:
        self.spec, self.address, self.progress, self.on_commit = spec, address, progress, on_commit
        self.warmup, self.allow_numerics_change, self.idle = warmup, allow_numerics_change, idle
        self.storage = Storage(spec.storage)
        self.layout = Layout(spec.output.uri)

    def run(self) -> dict:
        """Run to completion; returns the summary (also written to `summary.json`).

        Raises:
            ValueError: bad spec or inputs (before any work); JobFailed: workers cannot start.
        """
        spec, storage, layout = self.spec, self.storage, self.layout
        if spec.kind == "sweep":
            raise ValueError("kind: sweep runs many jobs: use engine.runtime.sweep.run_sweep (pcg-synth run does)")
        preflight(spec, storage)
        # a given groups file is checked before anything is written to the output
        given_groups = check_groups_file(spec, storage) if needs_groups(spec) and spec.models.groups else None
        expansion = None
        if spec.kind == "augment":
            from engine.config import InputSpec
            from engine.runtime.augment import expand

            expansion = expand(spec, storage, layout.root)
            plan = make_plan(spec.model_copy(update={"input": InputSpec(manifests=[expansion.uri])}), storage)
        else:
            plan = make_plan(spec, storage)
        for warning in plan.warnings():
            print(f"{spec.name}: warning: {warning}", file=sys.stderr)
        committed, numerics_changes = check_resume(spec, plan, storage, layout, self.allow_numerics_change)
        todo = [s for s in plan.shards if s.id not in committed]
        if not todo and (previous := finished_summary(storage, layout, plan)) is not None:
            if self.progress:  # a rerun of a finished job: its figures, not a run of nothing
                print(f"{spec.name}: every shard of {spec.output.uri} ({counted(len(plan.shards), 'shard')}) "
                      "was committed before; nothing to run. The summary of the run that finished the job:")
                print(summary_table(previous))
            return previous
        started = time.perf_counter()
        records: list[dict] = []
        report = None
        setup_s = 0.0
        if todo:
            groups = prepare_groups(spec, storage, self.progress, given_groups)
            init_ray(self.address, log_to_driver=False, configure_logging=False)
            setup_s = time.perf_counter() - started
            done_rows = sum(s.rows for s in plan.shards if s.id in committed)
            bar = tqdm(total=plan.rows, initial=done_rows, unit="row", desc=spec.name,
                       disable=bar_disabled(self.progress))

            def commit(record: dict) -> None:
                records.append(record)
                bar.update(record["rows"])
                bar.set_postfix_str(progress_postfix(records, time.perf_counter() - started))
                if self.on_commit:
                    self.on_commit(record)

            def notify(text: str) -> None:  # always shown: the job is waiting, not stuck
                tqdm.write(f"{spec.name}: {text}", file=sys.stderr)

            pool = WorkerPool(spec, ray.put(groups) if groups is not None else None, commit, self.warmup,
                              notify=notify, idle=self.idle)
            try:
                report = pool.run(todo)
            finally:
                bar.close()
        all_records = [json.loads(storage.read_bytes(layout.commit(s))) for s in plan.shards
                       if storage.exists(layout.commit(s))]
        summary = summarize(spec, plan, all_records, records, report, len(committed),
                            time.perf_counter() - started, setup_s)
        if expansion is not None:
            summary["augment"] = expansion.to_dict()
        if numerics_changes:
            summary["numerics_change_allowed"] = numerics_changes
        summary["warnings"] = plan.warnings()
        storage.write_bytes(layout.summary, json.dumps(summary, indent=1).encode())
        if self.progress:
            print(summary_table(summary))
        if summary["shards"]["failed"]:
            failed = ", ".join(f"{k}: {v}" for k, v in list(summary["failed_shards"].items())[:3])
            raise JobFailed(f"{summary['shards']['failed']} shard(s) failed ({failed}); "
                            "rerun the job to retry them")
        return summary
