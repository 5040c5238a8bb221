"""The job driver: validate, take the output's lease, plan, resume, prepare groups, run the worker
pool, summarize; a job that does not end well ends with one line saying what failed, what was
kept and how to resume."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import ray
from tqdm.auto import tqdm

from engine.config import JobSpec
from engine.connect import init_ray
from engine.console import bar_disabled, counted
from engine.errors import JobFailed
from engine.io.formats import finish_output
from engine.io.lease import Fenced, FencedStorage, LeaseHeld, OutputLease
from engine.io.storage import Storage, StorageError
from engine.runtime.commits import CommitRecord
from engine.runtime.family import with_family
from engine.runtime.plan import Layout, Plan, make_plan
from engine.runtime.pool import IdleWorkers, WorkerPool
from engine.runtime.preflight import check_groups_file, check_resume, finished_summary, needs_groups, preflight
from engine.runtime.summary import (
    commit_span,
    failure_line,
    lease_lost_line,
    progress_postfix,
    summarize,
    summary_table,
    then_rerun,
)

if TYPE_CHECKING:  # an augment job's module loads only where a job expands texts
    from engine.groups.csr import SpeechGroups
    from engine.runtime.augment import Expansion


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
    from engine.groups.options import GroupsBuild
    from engine.groups.source import speech_rows_of
    from engine.runtime.storage_blobs import StorageBlobStore

    embeddings, layout = speech_rows_of(storage, spec.models.target)
    store = StorageBlobStore(storage, spec.models.groups_cache or str(default_cache_dir()))
    build = GroupsBuild(spec.decoding.theta, spec.decoding.max_group_size, ranges=layout.ranges,
                        family=layout.family, progress=progress)
    return get_groups(embeddings, build, store=store)


@dataclass
class Started:
    """What a job settled before any work, holding the lease (`JobRunner.start`).

    Attributes:
        given_groups: the checked `models.groups` file (None: fetched or built later, or none needed).
        expansion: an augment job's variants (None: not an augment job).
        plan: the job's shards.
        committed: the ids of the shards committed before.
        numerics_changes: the numerics differences from the output's record a resume allowed.
    """

    given_groups: SpeechGroups | None
    expansion: Expansion | None
    plan: Plan
    committed: set[str]
    numerics_changes: list[str]


class JobRunner:
    """Runs a job spec on the Ray cluster this process is connected to (or a local one).

    The driver holds the output's lease (`engine.io.lease`) from before it writes anything
    there until it ends: a second driver on the same output refuses, or waits (`wait`). A job
    refused before any work (a bad groups file, an empty manifest, an output of another job)
    leaves no output folder it made behind.

    Args:
        spec: the job.
        address: Ray address (`auto`, `ray://HEAD:10001`, `local`); None: `RAY_ADDRESS` if set,
            else a fresh local cluster.
        progress: show the progress bar and the final table.
        on_commit: extra callback per committed shard, with its `CommitRecord` (tests use it to inject
            failures).
        warmup: workers warm up and start together (for throughput measurements).
        allow_numerics_change: resume an output written under another numerics environment
            (`runtime/numerics.py`); the difference is recorded in `_job.json` and the summary.
        idle: workers kept loaded between this driver's jobs (`pool.IdleWorkers`: a sweep's
            points); None: the job starts its own workers and retires them at its end.
        wait: if another driver holds the output's lease, wait for it to end (or to go stale)
            instead of refusing.
        rerun: the command that resumes this job, for the line a failed job ends with.
    """

    def __init__(self, spec: JobSpec, address: str | None = None, progress: bool = True,
                 on_commit: Callable[[CommitRecord], None] | None = None, warmup: bool = False,
                 allow_numerics_change: bool = False, idle: IdleWorkers | None = None, wait: bool = False,
                 rerun: str | None = None) -> None:
        self.spec, self.address, self.progress, self.on_commit = spec, address, progress, on_commit
        self.warmup, self.allow_numerics_change, self.idle = warmup, allow_numerics_change, idle
        self.wait, self.rerun = wait, rerun
        self.storage = Storage(spec.storage)
        self.layout = Layout(spec.output.uri)
        self.family = None  # the target's model family (`run` finds it before any work)

    def notify(self, text: str) -> None:  # always shown: the job is waiting, or something changed
        tqdm.write(f"{self.spec.name}: {text}", file=sys.stderr)

    def run(self) -> dict:
        """Run to completion; returns the summary (also written to `summary.json`).

        Raises:
            ValueError: bad spec or inputs (before any work); LeaseHeld: another driver holds the
            output (and `wait` is off); JobFailed: workers cannot start, shards failed, a write
            failed for a lasting reason (no space left...) or the lease was lost.
        """
        spec, storage, layout = self.spec, self.storage, self.layout
        if spec.kind == "sweep":
            raise ValueError("kind: sweep runs many jobs: use engine.runtime.sweep.run_sweep (pcg-synth run does)")
        made = storage.absent_folders(layout.root)  # local folders this run creates
        refused = True
        try:
            preflight(spec, storage)
            # the family named before any work (refused if unknown), its sampling defaults applied
            self.spec, self.family, _ = with_family(spec, storage)
            spec = self.spec
            with OutputLease(storage, layout.root, spec.output.lease_stale_s, job=spec.name, wait=self.wait,
                             notify=self.notify) as lease:
                # every write to the output from here on is refused once another driver holds it
                self.storage = FencedStorage(storage, lease.fence)
                try:
                    started = self.start()
                except BaseException:
                    lease.keep_record = not made  # refused on an output this run created: nothing left there
                    raise
                refused = False
                return self.execute(lease, started)
        except LeaseHeld:
            refused = False  # the output is another driver's: nothing of it is this run's to remove
            raise
        except Fenced as exc:  # a write of the driver's own (the job record, the summary) refused
            raise JobFailed(f"{exc}; stopped so that two drivers never write one output at once") from None
        finally:
            for folder in made if refused else []:  # refused before any work: no output folder left behind
                storage.remove_empty_folders(folder)

    def start(self) -> Started:
        """What happens before any work, holding the lease: the groups file checked, an augment
        job's variants written, the plan made, the output checked and recorded (`_job.json`)."""
        spec, storage, layout = self.spec, self.storage, self.layout
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
        return Started(given_groups, expansion, plan, committed, numerics_changes)

    def execute(self, lease: OutputLease, started: Started) -> dict:
        """Run the shards not committed yet, then summarize."""
        spec, storage, layout = self.spec, self.storage, self.layout
        plan, committed = started.plan, started.committed
        todo = [s for s in plan.shards if s.id not in committed]
        if not todo and (previous := finished_summary(storage, layout, plan)) is not None:
            if self.progress:  # a rerun of a finished job: its figures, not a run of nothing
                print(f"{spec.name}: every shard of {spec.output.uri} ({counted(len(plan.shards), 'shard')}) "
                      "was committed before; nothing to run. The summary of the run that finished the job:")
                print(summary_table(previous))
            return previous
        if not todo and self.progress:  # a driver stopped after its last commit: the summary from the records
            print(f"{spec.name}: every shard of {spec.output.uri} ({counted(len(plan.shards), 'shard')}) was "
                  "committed before, but no summary was written; writing it from the commit records:")
        began = time.perf_counter()
        records: list[CommitRecord] = []
        report = None
        setup_s = 0.0
        if todo:
            groups = prepare_groups(spec, storage, self.progress, started.given_groups)
            init_ray(self.address, log_to_driver=False, configure_logging=False)
            setup_s = time.perf_counter() - began
            done_rows = sum(s.rows for s in plan.shards if s.id in committed)
            bar = tqdm(total=plan.rows, initial=done_rows, unit="row", desc=spec.name,
                       disable=bar_disabled(self.progress))
            retried: dict[str, int] = {}

            def commit(record: CommitRecord) -> None:
                records.append(record)
                bar.update(record.rows)
                bar.set_postfix_str(progress_postfix(records, time.perf_counter() - began))
                if record.storage_retries > retried.get(record.worker, 0):
                    retried[record.worker] = record.storage_retries
                    self.notify(f"worker {record.worker}: {counted(record.storage_retries, 'storage call')} "
                                "retried so far after transient failures (each logged in the worker's log)")
                if self.on_commit:
                    self.on_commit(record)

            def halt() -> str | None:
                return lease.lost

            pool = WorkerPool(spec, ray.put(groups) if groups is not None else None, commit, self.warmup,
                              notify=self.notify, idle=self.idle, halt=halt, fence=lease.fence)
            try:
                report = pool.run(todo)
            finally:
                bar.close()
        all_records = [CommitRecord.from_dict(json.loads(storage.read_bytes(layout.commit(s))))
                       for s in plan.shards if storage.exists(layout.commit(s))]
        taken_over = lease.lost or (report is not None and report.fenced > 0)
        if taken_over:  # what this driver committed, not its successor's commits
            all_records = [r for r in all_records if r.shard in committed or r.lease_generation == lease.gen]
        wall_s = time.perf_counter() - began
        if not todo:  # nothing ran now: the figures of the runs that committed the shards
            records, wall_s = all_records, commit_span(all_records)
        summary = summarize(spec, plan, all_records, records, report, len(committed), wall_s, setup_s)
        if not todo:
            summary["shards"]["run_now"] = 0
            summary["figures_from"] = "the commit records of the runs that committed the shards"
        summary["family"] = self.family.name
        if started.expansion is not None:
            summary["augment"] = started.expansion.to_dict()
        if started.numerics_changes:
            summary["numerics_change_allowed"] = started.numerics_changes
        summary["warnings"] = plan.warnings()
        summary["driver_storage_retries"] = storage.retries
        if taken_over:  # another driver may hold the output now: the summary is its to write
            summary["shards"]["fenced"] = report.fenced if report is not None else 0
            if self.progress:
                print(summary_table(summary))
            raise JobFailed(lease_lost_line(summary, f"lost the lease on {spec.output.uri}: {lease.taken_over()}",
                                            self.rerun))
        if len(all_records) == len(plan.shards):
            summary["output_files"] = self.finish_output([s.id for s in plan.shards], summary)
        unwritten = self.write_summary(summary)
        if self.progress:
            print(summary_table(summary))
        line = failure_line(summary, report.stopped if report else None, report.remedy if report else None,
                            unwritten, self.rerun)
        if line is not None:
            raise JobFailed(line)
        return summary

    def finish_output(self, shard_ids: list[str], summary: dict) -> list[str]:
        """Write the files that span every shard (NeMo's one manifest), once every shard is
        committed and before summary.json; returns their URIs.

        Raises:
            JobFailed: they could not be written (every shard stays committed: a rerun writes them).
        """
        try:
            return finish_output(self.storage, self.spec.output, shard_ids)
        except StorageError as exc:
            if self.progress:
                print(summary_table(summary))
            raise JobFailed(f"{exc}; every shard is committed, the output's manifest is not; "
                            f"{getattr(exc, 'remedy', None) or 'fix that'}, then "
                            f"{then_rerun(self.rerun, ' to write it')}") from None

    def write_summary(self, summary: dict) -> StorageError | None:
        """Write summary.json; where it cannot be written (a full disk), print it (JSON) instead
        and return the error."""
        try:
            self.storage.write_bytes(self.layout.summary, json.dumps(summary, indent=1).encode())
        except StorageError as exc:
            print(json.dumps(summary, indent=1))
            return exc
        return None
