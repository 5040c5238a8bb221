"""A shard's commit record: what a worker writes to `_commits/<shard>.json` once the shard's files
are complete (`stages/write.py`), and what a job's summary is made of (`runtime/summary.py`).

`CommitRecord` is the record as the code reads it: typed fields, its parts dataclasses of their
own (the pipeline's figures, the quality gate's, the split counts, the failed rows). Its
`to_dict` and `from_dict` are where it meets JSON, and nowhere else. The JSON keeps the layout
records have always had: flat but for `quality` and `failed_rows` (the pipeline's figures, the
split counts and the worker's identity sit at its top level), its keys in the order of the
fields here. A record written by an older version loads with the values the summary has always
given what it lacks (`from_dict`); a key this version does not know is kept (`extra`) and
written back after the others, so a record read and written again loses nothing.

No torch here: the driver reads records without the decoding stack.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace

KINDS = {"int": int, "float": float}  # the types `Counters` declares (annotations are strings here)


@dataclass
class Counters:
    """The pipeline's counters and clocks: cumulative in a worker (`runtime/metrics.py`); in a
    commit record, what accrued since the worker's previous record. Declared once: the
    differences, the figures' types and the record's keys all follow these fields.

    Attributes:
        decode_rounds: decode rounds run.
        slot_rounds: batch slots filled, summed over the rounds.
        slots: batch slots, summed over the rounds.
        starved_slots: empty slots while the worker waited for its next shard.
        split_slots: empty slots while rows waited for another decoder (settings that cannot
            share a batch).
        decode_s: the decode loop's seconds in rounds.
        decode_cpu_s: the decode thread's CPU seconds in rounds.
        decode_waits: its voluntary context switches in rounds (it waited: the GIL, the device).
        decode_preempted: its involuntary ones (it lost its core to other work).
        io_wait_s: seconds decoding waited to hand settled shards to the IO thread.
        verify_wait_s: seconds decoding waited to hand decoded rows to the verify thread.
        finalise_s: seconds the IO thread spent on shards (codec, encoding, files, record).
        overlap_s: of those, seconds while decoding went on.
        busy_s: seconds the worker held at least one shard.
    """

    decode_rounds: int = 0
    slot_rounds: int = 0
    slots: int = 0
    starved_slots: int = 0
    split_slots: int = 0
    decode_s: float = 0.0
    decode_cpu_s: float = 0.0
    decode_waits: int = 0
    decode_preempted: int = 0
    io_wait_s: float = 0.0
    verify_wait_s: float = 0.0
    finalise_s: float = 0.0
    overlap_s: float = 0.0
    busy_s: float = 0.0

    def since(self, earlier: Counters) -> Counters:
        """What accrued from `earlier` to these, each figure of its declared type."""
        return Counters(**{f.name: KINDS[f.type](getattr(self, f.name) - getattr(earlier, f.name))
                           for f in fields(self)})

    def rounded(self, digits: int) -> Counters:
        """The clocks rounded to `digits` decimals (as a record keeps them), the counts as they are."""
        clocks = [f.name for f in fields(self) if f.type == "float"]
        return replace(self, **{name: round(getattr(self, name), digits) for name in clocks})


@dataclass
class PipelineFigures:
    """What a commit record reports of its worker's pipeline (`ShardStream.figures`).

    Attributes:
        counters: what accrued since the worker's previous record.
        held: shards the worker held when the record was made.
        decoders: decoders its scheduler made so far (row settings that cannot share a batch).
        io_backlog_max: most settled shards waiting for the IO thread at once, so far.
        gamma_choices: the `gamma: auto` decisions so far (`GammaChoice.to_dict()` each).
        empty_slots_counted: False for a record written before `starved_slots` and
            `split_slots` were counted (their counters are 0 then, and not written).
    """

    counters: Counters = field(default_factory=Counters)
    held: int = 0
    decoders: int = 0
    io_backlog_max: int = 0
    gamma_choices: list[dict] = field(default_factory=list)
    empty_slots_counted: bool = True


@dataclass
class QualityFigures:
    """The quality gate's figures of a shard, over what was decoded (rows, or the parts of split
    rows: each is checked on its own): checked, passed, rejected (and of those dropped),
    regenerated (decoded again after a failed attempt), attempts decoded, seconds checking."""

    checked: int = 0
    passed: int = 0
    rejected: int = 0
    dropped: int = 0
    regenerated: int = 0
    decodes: int = 0
    verify_s: float = 0.0


@dataclass
class SplitCounts:
    """A shard's split rows (`text.split`): how many, into how many chunks, how many of them
    were cut between words and at how many word boundaries, and how many decodes again their
    chunks took (`text.chunk_retries`)."""

    split_rows: int = 0
    chunks: int = 0
    word_split_rows: int = 0
    word_cuts: int = 0
    chunk_retries: int = 0


@dataclass
class FailedRow:
    """A manifest row written without audio, and why."""

    id: str
    error: str


# Keys a record has only where they apply (the gate on, rows split, `split_output: rows`, a
# profile finished, a fenced write): left out of the JSON where None. `rejects` goes with `quality`.
WHEN_SET = frozenset({"quality", "split", "written_rows", "profile", "committed_at", "lease_generation"})
FLAT = frozenset({"pipeline", "split"})  # parts whose keys sit at the JSON's top level
NOT_KEYS = ("counters", "empty_slots_counted")  # `PipelineFigures`' fields that are not keys of the JSON


@dataclass(kw_only=True)
class CommitRecord:
    """A committed shard: its rows' outcome, what decoding them took, where its files are, who
    wrote it. Fields without a default are in every record ever written; the others default to
    what a record written before them meant.

    Attributes:
        shard, manifest: the shard's id and the manifest its rows come from.
        rows, ok, failed, rejected: its manifest rows; those written with audio, failed, and
            rejected by the quality gate.
        failed_rows: the first failed rows (`FAILED_EXAMPLES`).
        cut: rows written whose audio stops at the token limit.
        audio_seconds: the audio written.
        generated_tokens, rounds, emitted, reached, accepted, thinning_trials: the decoding
            statistics of every attempt decoded (`RowStats`, summed).
        codec_s: seconds in the codec (and audio encoding).
        wall_s: seconds from the shard's arrival at the worker to its record.
        attempt: the driver's attempt at this shard (1: the first).
        batch_size: the job's.
        pipeline: the pipeline's figures since the worker's previous record.
        quality, rejects: the quality gate's figures and the shard's rejects file (None: none
            written); None, None without the gate.
        split: the split rows' counts (None: no row split).
        written_rows: rows written to the data (`split_output: rows` only).
        data, format, files, errors: the shard's Parquet file (hf-parquet), the output format,
            every file in the order written, the error records' file (None: in the data).
        worker, host, pid, node, gpu_ids, device, torch_threads, numerics, omp_wait_policy,
            malloc, round_stats: who wrote it (`ShardProcessor.info`).
        storage_retries: storage calls the worker retried so far (transient failures).
        profile: the decode-loop profile this shard's record names (`profile.rounds`).
        committed_at: unix time of the commit (the span of a job's commits).
        lease_generation: the driver's lease the record was written under (fenced writes).
        extra: keys of a newer version, kept as they were.
    """

    shard: str
    manifest: str = ""
    rows: int
    ok: int
    failed: int
    rejected: int = 0
    failed_rows: list[FailedRow] = field(default_factory=list)
    cut: int = 0
    audio_seconds: float
    generated_tokens: int
    rounds: int
    emitted: int
    reached: list[int]
    accepted: list[int]
    thinning_trials: int
    codec_s: float = 0.0
    wall_s: float
    attempt: int = 1
    batch_size: int = 1
    pipeline: PipelineFigures = field(default_factory=PipelineFigures)
    quality: QualityFigures | None = None
    rejects: str | None = None
    split: SplitCounts | None = None
    written_rows: int | None = None
    data: str | None = None
    format: str = "hf-parquet"
    files: list[str] = field(default_factory=list)
    errors: str | None = None
    worker: str = "?"
    host: str | None = None
    pid: int | None = None
    node: str | None = None
    gpu_ids: list[str] | None = None
    device: str | None = None
    torch_threads: int | None = None
    numerics: dict | None = None
    omp_wait_policy: str | None = None
    malloc: dict | None = None
    round_stats: dict | None = None
    storage_retries: int = 0
    profile: str | None = None
    committed_at: float | None = None
    lease_generation: int | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The record as its JSON holds it: the fields in order (the parts in `FLAT` spread at
        the top level, those in `WHEN_SET` left out where None), then `extra`."""
        out: dict = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or (value is None and f.name in WHEN_SET) or (
                    f.name == "rejects" and self.quality is None):
                continue
            if f.name == "pipeline":
                counters = asdict(value.counters)
                if not value.empty_slots_counted:
                    del counters["starved_slots"], counters["split_slots"]
                out.update(counters, **_present(PipelineFigures, vars(value), skip=NOT_KEYS))
            elif f.name in FLAT:
                out.update(asdict(value))
            elif is_dataclass(value):
                out[f.name] = asdict(value)
            elif f.name == "failed_rows":
                out[f.name] = [asdict(row) for row in value]
            else:
                out[f.name] = value
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls, d: dict) -> CommitRecord:
        """A record from its JSON, of this version or an older one: what an older record lacks
        takes the value the summary has always given it (`slots`: `decode_rounds * batch_size`;
        `busy_s`: `wall_s`; a count or clock: 0; `starved_slots` absent: the empty slots not
        counted); keys unknown here go to `extra`.

        Raises:
            KeyError, TypeError: a key every record has is missing.
        """
        counters = Counters(**{"slots": d.get("decode_rounds", 0) * d.get("batch_size", 1), "busy_s": d["wall_s"],
                               **_present(Counters, d)})
        pipeline = PipelineFigures(counters=counters, empty_slots_counted="starved_slots" in d,
                                   **_present(PipelineFigures, d, skip=NOT_KEYS))
        parts = {"pipeline": pipeline,
                 "quality": QualityFigures(**_present(QualityFigures, d["quality"])) if d.get("quality") else None,
                 "split": SplitCounts(**_present(SplitCounts, d)) if "split_rows" in d else None,
                 "failed_rows": [FailedRow(**_present(FailedRow, row)) for row in d.get("failed_rows", [])]}
        known = (_keys(cls) - FLAT - {"extra"}) | _keys(Counters) | (_keys(PipelineFigures) - set(NOT_KEYS)) | _keys(
            SplitCounts)
        return cls(**_present(cls, d, skip=(*parts, "extra")), **parts,
                   extra={k: v for k, v in d.items() if k not in known})


def _keys(cls) -> set[str]:
    return {f.name for f in fields(cls)}


def _present(cls, d: dict, skip: tuple[str, ...] = ()) -> dict:
    """The entries of `d` that name fields of the dataclass `cls` (less `skip`)."""
    return {f.name: d[f.name] for f in fields(cls) if f.name in d and f.name not in skip}
