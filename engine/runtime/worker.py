"""What a synthesis worker does, without Ray: hold the models once, turn shards into files.

A shard's rows flow through the worker's stages (`runtime/stages/`, one module each):

    read -> prepare -> decode -> codec -> verify -> write

and become the shard's files in the output's format (every manifest row exactly once: audio
rows and error rows, a long text's chunks joined back into its row or written as rows of their
own; rows the quality gate rejected go to `rejects/`) and then a commit record, written last, so
a shard counts as done only when its files are complete. The worker may hold several shards at once:
their rows share one continuously batched decode loop, and each shard is written by a
background thread as soon as its rows are done, while decoding goes on (the pipeline's threads
and queues: `runtime/stream.py`). `ShardProcessor` builds the stages and the pipeline.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from engine.api import Synthesizer
from engine.config import JobSpec, QualitySpec
from engine.families import family_settings
from engine.groups.csr import SpeechGroups
from engine.io.lease import Fence
from engine.io.storage import Storage
from engine.models.device import resolve_device
from engine.models.malloc import described as malloc_described
from engine.runtime.commits import CommitRecord
from engine.runtime.numerics import worker_device
from engine.runtime.plan import Layout, Shard
from engine.runtime.profiling import RoundProfiler
from engine.runtime.stages.codec import CodecStage
from engine.runtime.stages.decode import DecodeStage
from engine.runtime.stages.prepare import PrepareStage
from engine.runtime.stages.read import ReadStage
from engine.runtime.stages.row import ShardTask
from engine.runtime.stages.write import WriteStage
from engine.runtime.stream import ShardStream, Stages
from engine.runtime.threads import KeptThread, on_short_thread
from engine.text.prepare import TextPlanner


@dataclass
class WorkerModels:
    """What a worker loads once and keeps: target + draft, codec, their revisions, the
    voice-prompt cache, and the thread their decode loops run on. A sweep hands them from one of
    its points to the next (`ShardProcessor.reuse`) when their `JobSpec.worker_key` is the same."""

    key: str
    synth: Synthesizer
    codec: object  # a Codec (engine.codec.base)
    revisions: dict
    prompt_cache: object  # PromptCache
    decode_thread: KeptThread = field(default_factory=lambda: KeptThread("decode"))
    verifiers: dict = field(default_factory=dict)  # the quality gates' verifier processes, by what they hold

    def gate(self, quality: QualitySpec, storage: Storage, device: str):
        """The quality gate of `quality`: its verifiers (ASR, speaker encoder) run in a process of
        their own (`runtime/verifiers.py`), started once per worker and kept for the jobs that
        follow (a sweep's points)."""
        from engine.metrics.gate import QualityGate
        from engine.runtime.verifiers import RemoteASR, RemoteSpeaker, VerifierProcess

        key = (quality.asr_model, quality.speaker_model)
        if key not in self.verifiers:
            self.verifiers[key] = VerifierProcess(quality, device, storage.options)
        process = self.verifiers[key]
        return QualityGate(quality, RemoteASR(process) if key[0] else None, RemoteSpeaker(process) if key[1] else None,
                           self.codec)

    def close(self) -> None:
        """End the decode thread and the verifier processes."""
        self.decode_thread.close()
        for process in self.verifiers.values():
            process.close()
        self.verifiers.clear()

    @classmethod
    def load(cls, spec: JobSpec, storage: Storage, device: str) -> WorkerModels:
        from engine.codec.load import load_codec
        from engine.codec.prompts import PromptCache

        local = storage.local_dir
        draft = local(spec.models.draft) if spec.models.draft else None
        loaded = {}

        def load() -> None:  # on a thread of its own, which ends here (runtime/stream.py: CPU threads)
            loaded["synth"] = Synthesizer.load(local(spec.models.target), draft=draft, device=device,
                                               dtype=spec.models.dtype, compile=spec.models.compile,
                                               draft_weights=spec.models.draft_weights, family=spec.models.family,
                                               batch_size=spec.resources.batch_size)
            loaded["codec"] = load_codec(local(spec.models.codec), device=device)
            loaded["synth"].family.check_codec(loaded["codec"], f"models.codec {spec.models.codec}")
        on_short_thread(load)
        dirs = {"target": local(spec.models.target), "draft": draft, "codec": local(spec.models.codec)}
        revisions = {k: revision(v) for k, v in dirs.items() if v is not None}
        return cls(spec.worker_key, loaded["synth"], loaded["codec"], revisions, PromptCache())


def revision(path: Path) -> str:
    """A model's fingerprint for provenance: its `checkpoint_revision`; for stream heads, whose
    directory holds no config or tokenizer, their record too (`pcg_streams.json`: shape, target
    and training), so that heads of one shape trained apart differ."""
    from engine.models.loading import checkpoint_revision
    from engine.models.streams import STREAMS_INFO, is_streams_dir

    if not is_streams_dir(path):
        return checkpoint_revision(path)
    digest = hashlib.sha256((path / STREAMS_INFO).read_bytes() + checkpoint_revision(path).encode())
    return digest.hexdigest()[:16]


def check_reusable(models: WorkerModels, spec: JobSpec) -> None:
    if models.key != spec.worker_key:
        raise ValueError(f"job {spec.name}: this worker loaded other models, or for other resources, than "
                         "the job's (JobSpec.worker_key); it needs a worker of its own")


class ShardProcessor:
    """A worker's models and groups, its stages, and the pipeline that runs them: shards in,
    their files and commit records out.

    Args:
        spec: the job.
        groups: PCG groups prepared by the driver (None unless the method is `pcg`).
        worker_id: a label for the summary's per-worker figures.
        storage: where to read and write (default: `Storage(spec.storage)`).
        io_queue: settled shards that may wait for the writer before decoding blocks.
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
        self.synth.batch_size = spec.resources.batch_size
        if groups is not None:  # torch ops (the group index): on a short thread, as the loading's
            on_short_thread(lambda: self.synth.set_groups(groups))
        self._numerics: dict | None = None
        self._prepare_lock = threading.Lock()  # shards arrive on several threads; prepare one at a time
        session = self.synth.session(spec.resources.batch_size, stream=True, admission=spec.resources.admission)
        codec = CodecStage(self.codec, spec.output.prompt_audio, self.device)
        quality = spec.quality
        verify = None
        if quality.enabled:
            from engine.runtime.stages.verify import VerifyStage

            gate = models.gate(quality, self.storage, self.device)
            verify = VerifyStage(gate, spec.output.prompt_audio, self.codec)
        text = spec.text
        planner = TextPlanner(text, self.synth.prompter.build, self.synth.max_context,
                              self.synth.family.codes_per_second)
        joined_include = (text.split != "none" and text.split_output == "joined"
                          and spec.output.prompt_audio == "include")
        self.stages = Stages(
            read=ReadStage(self.storage),
            prepare=PrepareStage(family_settings(spec.decoding, self.synth.family), self.storage, self.revisions,
                                 self.encode_clip, self.codec.sample_rate, keep_clips=quality.speaker_model is not None,
                                 planner=planner,
                                 joined_include=joined_include),
            decode=DecodeStage(self.synth, session),
            codec=codec,
            verify=verify,
            write=WriteStage(spec, self.storage, codec, self.codec.sample_rate, self.info))
        prof = spec.profile
        profiler = RoundProfiler(prof.rounds, prof.skip, prof.trace, self.device) if prof.rounds else None
        self.stream = ShardStream(self.stages, io_queue=io_queue, profiler=profiler,
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
        """Decode a batch and a half with the job's settings at its batch size, and write two of
        its rows as a shard is (codec, audio encoding, a Parquet table, in memory: nothing is
        written), so that allocation, kernel selection, the decoder's caches and the first use
        of the writer's libraries (pyarrow's Parquet writer, libsndfile: modules loaded, tables
        built) are paid for before anything is timed (`Synthesizer.warmup`). Each runs on the
        thread that will run it in the job (the decode loop's, the IO thread's on the codec's
        CUDA stream), since part of that cost is per thread: with `models.compile: cudagraphs`,
        a thread's graphs. Unwarmed, the first shard's write would pay for those first uses
        inside the job's timed window, beside the decode loop."""
        results = self.stream.on_decode_thread(
            lambda: self.synth.warmup(self.spec.decoding, self.spec.resources.batch_size)).result()

        def write() -> None:
            from engine.runtime.stages.row import Row

            sample = [r for r in results if r.codes][:2]
            rows = [Row(i, r, self.spec.decoding, {}, seed=r.seed) for i, r in enumerate(sample)]
            for row in rows:
                attempt = row.attempt(1)
                attempt.codes, attempt.finish_reason = row.result.codes, row.result.finish_reason
                row.keep(attempt)
            self.stages.write.table_bytes(rows)
        self.stream.on_io_thread(write).result()
        if self.stages.verify is not None:  # the verifiers' first use, on the thread that checks
            self.stream.on_verify_thread(self.warm_verifiers).result()

    def warm_verifiers(self) -> None:
        from engine.metrics.gate import AttemptInput

        gate = self.stages.verify.gate
        wave = self.codec.decode([[0] * 50])[0]  # a second of the codec's audio
        hyp = gate.transcribe([wave])[0]
        gate.score(AttemptInput("Warm-up.", wave, "eos", 1, 0, hypothesis=hyp if isinstance(hyp, str) else ""))

    def info(self) -> dict:
        import ray

        gpus = ray.get_gpu_ids() if ray.is_initialized() else []
        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        if self._numerics is None:
            from engine.runtime.numerics import actual

            self._numerics = actual(self.device, self.synth.target.model.dtype, threads=self.stream.torch_threads)
        return {"worker": self.worker_id, "host": socket.gethostname(), "pid": os.getpid(),
                "node": node, "gpu_ids": [str(g) for g in gpus], "device": self.device,
                "torch_threads": self.stream.torch_threads,
                # the rounds' mode as run: eager where `compile: auto`'s graphs failed to compile
                "numerics": {**self._numerics, "compile": self.synth.runner.mode},
                # not part of the numerics (same results), but of the speed on a CPU: README, Streaming
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                "malloc": malloc_described(),
                # how its rounds ran so far (eager or graphs; compiles, host and device time)
                "round_stats": self.synth.runner.stats.to_dict()}

    def encode_clip(self, wave) -> list[int]:
        """A voice-prompt clip's codes: encoded on the IO thread, whose torch ops run on one CPU
        thread (runtime/threads.py), once per clip content (the models' prompt cache)."""
        return self.stream.on_io_thread(lambda: self.models.prompt_cache.encode(self.codec, wave)).result()

    def submit(self, shard: Shard, attempt: int = 1, fence: Fence | None = None) -> Future:
        """Hand a shard to the pipeline; the future resolves to its `CommitRecord` (or to the
        error that failed it). Its read and prepare stages run here, on the caller's thread,
        while the decode loop decodes other shards. With a `fence` (the driver's lease), the
        shard is refused at once if a newer driver holds the output, and every write it makes is
        checked (`WriteStage`).

        Raises:
            Fenced: a newer driver holds the output.
        """
        received = time.perf_counter()
        if fence is not None:
            fence.check(self.storage)  # nothing decoded for a driver that lost its lease
        self.stream.hold()
        try:
            with self._prepare_lock:
                rows = self.stages.prepare(shard.manifest, self.stages.read(shard))
        except BaseException:
            self.stream.release()
            raise
        return self.stream.submit(ShardTask(shard, attempt, rows, received, fence=fence))

    def process(self, shard: Shard, attempt: int = 1, fence: Fence | None = None) -> CommitRecord:
        """Synthesize one shard, write its files, then its commit record."""
        return self.submit(shard, attempt, fence).result()

    def close(self) -> None:
        """End this processor's threads, the models' decode thread and verifier processes included."""
        self.stream.close()
        self.models.close()
