"""What a synthesis worker does, without Ray: hold the models once, turn shards into files.

A shard becomes one Parquet file (every manifest row exactly once: audio rows and error rows)
and then a commit record. The commit record is written last, so a shard counts as done only
when its data file is complete; a worker that dies in between leaves an uncommitted shard that
is redone (and its data file overwritten with the same rows).

Shards stream (`runtime/stream.py`): the worker may hold several at once; their rows share one
continuously batched decode loop, and each shard's file is written by a background thread as
soon as its last row is decoded, while decoding goes on.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import lru_cache

from pydantic import ValidationError

from engine.api import Synthesizer
from engine.config import DecodingSettings, JobSpec
from engine.groups.csr import SpeechGroups
from engine.io.manifest import ManifestRow, RowError, gzipped, parse_jsonl, parse_rows, unpacked, validated
from engine.io.storage import Storage, StorageError, relative_to
from engine.models.device import resolve_device
from engine.models.malloc import described as malloc_described
from engine.records import SynthesisItem, SynthesisResult, aggregate, item_seed
from engine.runtime.numerics import worker_device
from engine.runtime.plan import Layout, Shard
from engine.runtime.profiling import RoundProfiler
from engine.runtime.stream import KeptThread, ShardStream, ShardTask, on_short_thread


@dataclass
class Prepared:
    """One manifest row ready to decode (`item`), or already failed (`error`)."""

    item: SynthesisItem | None
    settings: DecodingSettings
    prompt: object | None  # VoicePrompt
    error: SynthesisResult | None
    origin: dict


@dataclass
class WorkerModels:
    """What a worker loads once and keeps: target + draft, codec, their revisions, the
    voice-prompt cache, and the thread their decode loops run on. A sweep hands them from one of
    its points to the next (`ShardProcessor.reuse`) when their `JobSpec.worker_key` is the same."""

    key: str
    synth: Synthesizer
    codec: object  # Xcodec2Codec
    revisions: dict
    prompt_cache: object  # PromptCache
    decode_thread: KeptThread = field(default_factory=lambda: KeptThread("decode"))

    @classmethod
    def load(cls, spec: JobSpec, storage: Storage, device: str) -> WorkerModels:
        from engine.codec.prompts import PromptCache
        from engine.codec.xcodec2 import Xcodec2Codec
        from engine.models.loading import checkpoint_revision

        local = storage.local_dir
        draft = local(spec.models.draft) if spec.models.draft else None
        loaded = {}

        def load() -> None:  # on a thread of its own, which ends here (runtime/stream.py: CPU threads)
            loaded["synth"] = Synthesizer.load(local(spec.models.target), draft=draft, device=device,
                                               dtype=spec.models.dtype, compile=spec.models.compile,
                                               draft_weights=spec.models.draft_weights,
                                               batch_size=spec.resources.batch_size)
            loaded["codec"] = Xcodec2Codec.load(local(spec.models.codec), device=device)
        on_short_thread(load)
        dirs = {"target": local(spec.models.target), "draft": draft, "codec": local(spec.models.codec)}
        revisions = {k: checkpoint_revision(v) for k, v in dirs.items() if v is not None}
        return cls(spec.worker_key, loaded["synth"], loaded["codec"], revisions, PromptCache())


def check_reusable(models: WorkerModels, spec: JobSpec) -> None:
    if models.key != spec.worker_key:
        raise ValueError(f"job {spec.name}: this worker loaded other models, or for other resources, than "
                         "the job's (JobSpec.worker_key); it needs a worker of its own")


class ShardProcessor:
    """Models, codec and groups of one worker, and the shard -> Parquet + commit pipeline.

    Args:
        spec: the job.
        groups: PCG groups prepared by the driver (None unless the method is `pcg`).
        worker_id: a label for the summary's per-worker figures.
        storage: where to read and write (default: `Storage(spec.storage)`).
        io_queue: decoded shards that may wait for the writer before decoding blocks.
        models: models loaded before (`reuse`); None loads them.
    """

    def __init__(self, spec: JobSpec, groups: SpeechGroups | None = None, worker_id: str = "w0",
                 storage: Storage | None = None, io_queue: int = 2, models: WorkerModels | None = None) -> None:
        self.spec, self.worker_id = spec, worker_id
        self.storage = storage or Storage(spec.storage)
        self.layout = Layout(spec.output.uri)
        self.device = str(resolve_device(worker_device(spec)))
        if models is None:
            models = WorkerModels.load(spec, self.storage, self.device)
        check_reusable(models, spec)
        self.models = models
        self.synth, self.codec, self.revisions = models.synth, models.codec, models.revisions
        self.prompt_cache = models.prompt_cache
        self.synth.batch_size = spec.resources.batch_size
        if groups is not None:  # torch ops (the group index): on a short thread, as the loading's
            on_short_thread(lambda: self.synth.set_groups(groups))
        self._read_whole = lru_cache(maxsize=2)(self._parse_file)
        self._unpacked = lru_cache(maxsize=2)(self._unpack_file)  # gzipped JSONL: read once, sliced per shard
        self._codec_stream = None
        self._numerics: dict | None = None
        self._prepare_lock = threading.Lock()  # shards arrive on several threads; prepare one at a time
        session = self.synth.session(spec.resources.batch_size, stream=True, admission=spec.resources.admission)
        prof = spec.profile
        profiler = RoundProfiler(prof.rounds, prof.skip, prof.trace, self.device) if prof.rounds else None
        self.stream = ShardStream(session, self.start_rows, self.finalise, io_queue=io_queue, profiler=profiler,
                                  decode_thread=models.decode_thread)

    def reuse(self, spec: JobSpec, groups: SpeechGroups | None = None, worker_id: str = "w0") -> ShardProcessor:
        """This worker's models for another job (a sweep's next point: other decoding settings,
        batch size, data): ends this processor's decode loop and IO thread and returns a new
        processor on the same models, whose decode loop runs on the same thread (the models'
        `decode_thread`: with `models.compile: cudagraphs` its graphs stay captured), with
        nothing measured for the last job kept (`gamma: auto`'s pilots).
        Raises ValueError if the job needs other models (`JobSpec.worker_key`), before anything
        changes."""
        check_reusable(self.models, spec)
        self.stream.close()  # the models' decode thread stays: the next job decodes on it
        self.synth.forget_measurements()  # a `gamma: auto` choice is the new job's own
        return ShardProcessor(spec, groups, worker_id, models=self.models)

    def warmup(self) -> None:
        """Decode a batch and a half with the job's settings at its batch size, and export two of
        its rows as a shard is (codec, audio encoding, a Parquet table, in memory: nothing is
        written), so that allocation, kernel selection, the decoder's caches and the first use
        of the export's libraries (pyarrow's Parquet writer, libsndfile: modules loaded, tables
        built) are paid for before anything is timed (`Synthesizer.warmup`). Each runs on the
        thread that will run it in the job (the decode loop's, the IO thread's on the codec's
        CUDA stream), since part of that cost is per thread: with `models.compile: cudagraphs`,
        a thread's graphs. (Before the export was warmed up, the first shard's export paid for
        those first uses inside the job's timed window, beside the decode loop:
        benchmarks/results/job_throughput_cpu_tiny_zen4_dec02_vs_2baeb1d.md.)"""
        results = self.stream.on_decode_thread(
            lambda: self.synth.warmup(self.spec.decoding, self.spec.resources.batch_size)).result()

        def export() -> None:
            from engine.codec.export import export_audio

            sample = [r for r in results if r.codes][:2]
            if not sample:
                return
            with self.codec_stream():
                export_audio(sample, self.spec.decoding, None, parquet_path=io.BytesIO(), codec=self.codec,
                             audio_format=self.spec.output.audio_format)
        self.stream.on_io_thread(export).result()

    def info(self) -> dict:
        import ray

        gpus = ray.get_gpu_ids() if ray.is_initialized() else []
        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        if self._numerics is None:
            from engine.runtime.numerics import actual

            self._numerics = actual(self.device, self.synth.target.model.dtype,
                                    self.synth.target.model.compile_mode, threads=self.stream.torch_threads)
        return {"worker": self.worker_id, "host": socket.gethostname(), "pid": os.getpid(),
                "node": node, "gpu_ids": [str(g) for g in gpus], "device": self.device,
                "torch_threads": self.stream.torch_threads, "numerics": self._numerics,
                # not part of the numerics (same results), but of the speed on a CPU: README, Streaming
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                "malloc": malloc_described()}

    # ---- reading ---------------------------------------------------------------------------

    def _parse_file(self, uri: str) -> list:
        return parse_rows(uri, self.storage.read_bytes(uri))

    def _unpack_file(self, uri: str) -> bytes:
        return unpacked(uri, self.storage.read_bytes(uri))

    def rows_of(self, shard: Shard) -> list[ManifestRow | RowError]:
        """The shard's rows in manifest order; duplicates (found by the plan) become errors."""
        if shard.byte_range is not None and gzipped(shard.manifest):
            raws = parse_jsonl(self._unpacked(shard.manifest)[slice(*shard.byte_range)])
        elif shard.byte_range is not None:
            raws = parse_jsonl(self.storage.read_range(shard.manifest, *shard.byte_range))
        else:
            raws = self._read_whole(shard.manifest)[shard.start:shard.stop]
        if len(raws) != shard.rows:
            raise RuntimeError(f"{shard.manifest} changed since the job was planned "
                               f"({len(raws)} rows where {shard.rows} were planned)")
        rows = validated(raws, shard.manifest, shard.start)
        for i, first in shard.duplicates.items():
            row = rows[i - shard.start]
            if isinstance(row, ManifestRow):
                rows[i - shard.start] = RowError(f"{shard.manifest}:{i + 1}", row.id,
                                                 f"duplicate id (first at {first})", row.text)
        return rows

    def voice_prompt(self, shard: Shard, row: ManifestRow):
        """The row's voice prompt (None without one); clips are read through storage, encoded
        once and cached by content."""
        from engine.codec.audio import read_clip
        from engine.codec.prompts import load_voice_prompt

        if row.prompt_codes is None and row.prompt_audio is None:
            return None
        if row.prompt_codes is not None:
            return load_voice_prompt(row.prompt_text or "", codes=row.prompt_codes, id=row.prompt_id)
        clip = relative_to(shard.manifest, row.prompt_audio)
        wave = read_clip(io.BytesIO(self.storage.read_bytes(clip)), name=clip)
        # encoded on the IO thread, whose torch ops run on one CPU thread (runtime/stream.py)
        codes = self.stream.on_io_thread(lambda: self.prompt_cache.encode(self.codec, wave)).result()
        return load_voice_prompt(row.prompt_text or "", codes=codes, id=row.prompt_id)

    # ---- processing ------------------------------------------------------------------------

    def origin(self, row: ManifestRow | RowError) -> dict:
        """Provenance of a row: where it came from and which models made it."""
        out = {"models": self.revisions}
        if isinstance(row, ManifestRow):
            out.update({k: v for k, v in (("text_id", row.text_id), ("prompt_id", row.prompt_id),
                                          ("augment_seed", row.augment_seed)) if v is not None})
        return out

    def prepare(self, shard: Shard) -> list[Prepared]:
        """The shard's rows, each ready to decode or already an error result."""
        base = self.spec.decoding
        out = []
        for row in self.rows_of(shard):
            if isinstance(row, RowError):
                ident = row.id or f"!{row.source}"
                out.append(Prepared(None, base, None, SynthesisResult(
                    id=ident, text=row.text, seed=item_seed(base.seed, ident), error=row.error),
                    self.origin(row)))
                continue
            try:
                settings = base.with_overrides(row.overrides())
                prompt = self.voice_prompt(shard, row)
            except (ValidationError, ValueError, StorageError) as exc:
                out.append(Prepared(None, base, None, SynthesisResult(
                    id=row.id, text=row.text, seed=item_seed(base.seed, row.id), error=str(exc)),
                    self.origin(row)))
                continue
            item = SynthesisItem(text=row.text, id=row.id, seed=row.seed,
                                 prompt_text=prompt.text if prompt else None,
                                 prompt_codes=list(prompt.codes) if prompt else None)
            out.append(Prepared(item, settings, prompt, None, self.origin(row)))
        return out

    def start_rows(self, task: ShardTask) -> list:
        """On the decode thread: the shard's rows to decode, as `(settings, request)` with keys
        `(task, row index)`; error rows get their results now."""
        rows = []
        task.results = [p.error for p in task.prepared]
        for i, p in enumerate(task.prepared):
            if p.item is None:
                continue
            result, request = self.synth.prepare(i, p.item, p.settings, key=(task, i))
            task.results[i] = result
            if request is not None:
                rows.append((p.settings, request))
        return rows

    def submit(self, shard: Shard, attempt: int = 1) -> Future:
        """Hand a shard to the decode loop; the future resolves to its commit record (or to the
        error that failed it). Reading and preparing its rows happen here, on the caller's
        thread, while the loop decodes other shards."""
        received = time.perf_counter()
        self.stream.hold()
        try:
            with self._prepare_lock:
                prepared = self.prepare(shard)
        except BaseException:
            self.stream.release()
            raise
        return self.stream.submit(ShardTask(shard, attempt, prepared, received))

    def process(self, shard: Shard, attempt: int = 1) -> dict:
        """Synthesize one shard, write its Parquet file, then its commit record."""
        return self.submit(shard, attempt).result()

    def finalise(self, task: ShardTask, figures) -> dict:
        """On the IO thread: codec, audio, Parquet file, upload; then the commit record."""
        from engine.codec.export import export_audio

        shard, prepared, results = task.shard, task.prepared, task.results
        buffer = io.BytesIO()
        with self.codec_stream():
            exported = export_audio(results, [p.settings for p in prepared], None, parquet_path=buffer,
                                    codec=self.codec, audio_format=self.spec.output.audio_format,
                                    prompts=[p.prompt for p in prepared],
                                    prompt_audio=self.spec.output.prompt_audio,
                                    provenance=[p.origin for p in prepared])
        self.storage.write_bytes(self.layout.data(shard), buffer.getvalue())
        stats = aggregate([r.stats for r in results if r.stats is not None])
        pipeline = figures()
        record = {
            "shard": shard.id, "manifest": shard.manifest, "rows": shard.rows,
            "ok": exported["with_audio"], "failed": shard.rows - exported["with_audio"],
            "cut": sum(r.cut for r in results),  # rows whose audio stops at the token limit
            "audio_seconds": exported["audio_seconds"], "generated_tokens": stats.generated_tokens,
            "rounds": stats.rounds, "emitted": stats.emitted, "reached": stats.reached,
            "accepted": stats.accepted, "thinning_trials": stats.thinning_trials,
            "codec_s": exported["codec_seconds"],
            "wall_s": round(time.perf_counter() - task.received, 4), "attempt": task.attempt,
            "batch_size": self.spec.resources.batch_size,
            **{k: round(v, 4) if isinstance(v, float) else v for k, v in pipeline.items()},
            "gamma_choices": [c.to_dict() for c in self.stream.session.gamma_choices],
            "data": self.layout.data(shard), **self.info(),
            "storage_retries": self.storage.retries,  # this worker's, so far (transient failures ridden out)
        }
        profile = self.stream.profiler.take() if self.stream.profiler else None
        if profile is not None:  # finished with this shard's rounds: written once, named in this record
            record["profile"] = self.write_profile(profile)
        self.storage.write_bytes(self.layout.commit(shard), json.dumps(record, indent=1).encode())
        return record

    def write_profile(self, profile: dict) -> str:
        """Write a finished decode-loop profile under `_profiles/` (and its Chrome trace, if
        kept); returns the profile's URI."""
        trace = profile.pop("trace_gz", None)
        name = f"{self.worker_id}-{os.getpid()}"
        profile = {"worker": self.worker_id, "pid": os.getpid(), "device": self.device,
                   "batch_size": self.spec.resources.batch_size, **profile}
        if trace is not None:
            profile["trace"] = self.layout.profile(f"{name}.trace.json.gz")
            self.storage.write_bytes(profile["trace"], trace)
        uri = self.layout.profile(f"{name}.json")
        self.storage.write_bytes(uri, json.dumps(profile, indent=1).encode())
        return uri

    def codec_stream(self):
        """On CUDA, the codec runs on a CUDA stream of its own, so its kernels interleave with
        the decode loop's instead of queueing behind them on the default stream."""
        import torch

        if not self.device.startswith("cuda"):
            return contextlib.nullcontext()
        if self._codec_stream is None:
            self._codec_stream = torch.cuda.Stream(device=self.device)
        return torch.cuda.stream(self._codec_stream)

    def close(self) -> None:
        """End this processor's threads, the models' decode thread included."""
        self.stream.close()
        self.models.decode_thread.close()
