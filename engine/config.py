"""Typed settings. Field descriptions are the documentation.

This is the one place the acceptance rules (`METHODS`) and the decoding defaults (the
`DecodingSettings` field defaults, those of the per-row sampling knobs in their description,
`engine.knobs`; read elsewhere through `decoding_default`) are written; the command-line flags
are made from these fields (`engine.cli_options`). Imports no torch.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from engine.knobs import GREEDY_OFF, KNOB_NAMES, KNOBS, WARP_KNOBS, Knob
from engine.knobs import MAX_TEMPERATURE as MAX_TEMPERATURE  # read from here too
from engine.knobs import Warp as Warp

# The acceptance rules, spelled here only; everything else takes them from METHODS or Method.
METHODS = ("ar", "exact", "pcg", "ssd", "topk")
Method = Literal[METHODS]


class _Speculation(BaseModel):
    """The decoding settings' first part: acceptance rule and speculation depth."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Method = Field("pcg", description=(
        "Acceptance rule: 'ar' (target alone, exact), 'exact' (standard speculative sampling, "
        "token-level exact), 'pcg' (group-level exact), 'ssd' (relaxed by beta, no guarantee), "
        "'topk' (accept inside the target's top-k, no guarantee)."))
    gamma: int | Literal["auto"] = Field(3, description=(
        "Draft tokens per round (ignored by 'ar'), or 'auto': chosen per batch size from the "
        "measured cost of draft, verify and ar steps and a pilot's acceptance; speculation is "
        "switched off where it does not pay."))
    theta: float = Field(0.4, gt=0.0, le=1.0, description=(
        "PCG: cosine threshold of the acoustic similarity groups, in (0, 1]; 1 gives singleton "
        "groups (PCG = exact). The paper found 0.38-0.45 best on Llasa-8B."))
    max_group_size: int | None = Field(None, ge=1, description=(
        "PCG: cap on group size (kNN with k = cap, then threshold); truncated groups are counted."))
    max_thinning_trials: int = Field(8, ge=1, le=256, description=(
        "PCG: thinning trials for the recovered token before the exact dense fallback."))
    beta: float = Field(0.3, ge=0.0, description="SSD: added to the acceptance ratio.")
    topk: int = Field(50, ge=1, description="topk: accept a draft token inside the target's top-k.")

    @field_validator("gamma")
    @classmethod
    def _gamma(cls, v):
        if v != "auto" and not 1 <= v <= 32:
            raise ValueError("gamma must be an integer from 1 to 32, or 'auto'")
        return v


def knob_field(knob: Knob):
    """The settings field of a sampling knob: its default, bounds and description."""
    return Field(knob.default, description=knob.description, **knob.bounds)


# The per-row sampling knobs' fields, one per entry of `engine.knobs.KNOBS`, after the speculation's.
_Sampling = create_model("_Sampling", __base__=_Speculation, __module__=__name__,
                         **{k.name: (k.type, knob_field(k)) for k in KNOBS})


class DecodingSettings(_Sampling):
    """How to decode: acceptance rule, speculation depth and sampling."""

    seed: int = Field(0, ge=0, description=(
        "Job seed; each item's seed is derived from it and the item's id unless given."))
    max_speech_ratio: float | None = Field(None, ge=1.0, description=(
        "Cap each row's speech, below max_new_tokens, at this many times its text's estimated "
        "speaking time (15 characters a second) plus 2 s: a row whose model does not stop is cut "
        "there and counted as cut, instead of running to max_new_tokens (None: off)."))

    @model_validator(mode="after")
    def _check(self) -> DecodingSettings:
        if self.temperature == 0 and any(getattr(self, k.name) != k.off for k in KNOBS if k.greedy_off):
            raise ValueError(f"{'/'.join(GREEDY_OFF)} have no effect at temperature 0 (greedy): leave them off")
        return self

    @property
    def speculative(self) -> bool:
        return self.method != "ar"

    @property
    def warp(self) -> Warp:
        return Warp(**{k.name: getattr(self, k.name) for k in WARP_KNOBS})

    def with_overrides(self, over: dict) -> DecodingSettings:
        """These settings with a row's or an item's own values applied (itself when none).

        Raises:
            ValueError: an invalid value (pydantic's ValidationError, naming the field).
        """
        return DecodingSettings(**{**self.model_dump(), **over}) if over else self


def field_default(model: type[BaseModel], name: str):
    """The default of a settings field (the one place it is written)."""
    return model.model_fields[name].get_default()


def decoding_default(name: str):
    """The default of a `DecodingSettings` field: decoding defaults are written there only."""
    return field_default(DecodingSettings, name)


def resources_default(name: str):
    """The default of a `ResourcesSpec` field (a job's batch size is a `Synthesizer`'s too)."""
    return field_default(ResourcesSpec, name)


# ---- model references ---------------------------------------------------------------------------

# `org/name`, `org/name@revision`, `hf://org/name[@revision]` (revision: a branch, tag or commit)
_HUB_ID = re.compile(r"^(?:hf://)?([A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@([\w./-]+))?/?$")


def hub_model_id(text: str) -> tuple[str, str | None] | None:
    """(repo id, revision or None) when `text` is spelled like a Hugging Face Hub model, else
    None. Spelling only: whether an existing local path of that spelling wins is decided where
    paths are resolved (`engine.io.storage.hub_ref`, `resolve_paths`)."""
    if text.startswith(("./", "../", "/", "~")):
        return None
    found = _HUB_ID.match(text)
    return (found[1], found[2]) if found else None


# ---- jobs ----------------------------------------------------------------------------------------


class StorageOptions(BaseModel):
    """How to reach object storage (credentials always come from the AWS chain)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint_url: str | None = Field(None, description=(
        "S3-compatible endpoint, e.g. http://minio:9000; unset for AWS S3."))
    region: str | None = Field(None, description="AWS region of the bucket(s).")
    profile: str | None = Field(None, description="AWS profile name from ~/.aws (optional).")
    retries: int = Field(5, ge=0, description=(
        "Retries of a storage call that failed transiently (connection refused or reset, "
        "timeouts, HTTP 5xx, throttling), after botocore's own quick retries; 0: none."))
    retry_backoff_s: float = Field(0.5, gt=0, description=(
        "First wait before a storage retry; doubled per retry, with jitter (a random 50-100 %)."))
    retry_backoff_max_s: float = Field(20.0, gt=0, description="Cap of one storage retry's wait.")


# the model families (engine/families/, whose registry a test holds to this list)
FamilyName = Literal["auto", "llasa", "orpheus"]
CompileMode = Literal["auto", "none", "inductor", "cudagraphs"]
COMPILE_MODES: tuple[str, ...] = get_args(CompileMode)
DraftWeights = Literal["native", "int8"]
Admission = Literal["longest_first", "arrival"]  # see engine/decoding/admission.py
ADMISSIONS: tuple[str, ...] = get_args(Admission)
DRAFT_WEIGHTS: tuple[str, ...] = get_args(DraftWeights)


class ModelsSpec(BaseModel):
    """Which checkpoints to load: local directories, Hugging Face Hub models (`org/name`,
    `org/name@revision`, `hf://org/name`) or object-store URIs (s3://, gs://, az://, ...)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str = Field(description=(
        "Target checkpoint (Hugging Face Llama format) of a known model family, e.g. a Llasa-8B or "
        "an Orpheus-3B copy."))
    family: FamilyName = Field("auto", description=(
        "The model family (docs: models): auto detects it from the target's tokenizer (the dry "
        "run names it); llasa or orpheus is checked against it. It sets the prompt format, the "
        "output space (Orpheus: seven code ranges a frame), the codec and the sampling defaults."))
    draft: str | None = Field(None, description=(
        "The drafter, required unless decoding.method is 'ar': a draft checkpoint sharing the target's "
        "vocabulary, or a directory of stream heads made for the target (`pcg-synth draft train --kind "
        "streams`: small heads on the target's own hidden state, no draft model), which cap "
        "decoding.gamma at their count (auto chooses among the lengths they allow)."))
    codec: str = Field(description=(
        "The family's codec checkpoint: X-codec2 for Llasa (transformers format, e.g. "
        "HKUSTAudio/xcodec2-hf), SNAC 24 kHz for Orpheus (e.g. hubertsiuzdak/snac_24khz)."))
    groups: str | None = Field(None, description=(
        "A prebuilt groups file (`pcg-synth groups build`); by default groups for decoding.theta "
        "are fetched from the cache or built once by the driver."))
    groups_cache: str | None = Field(None, description=(
        "Where built groups are cached (a directory or s3:// prefix). The driver fetches or builds "
        "them and ships them to the workers, so the default is the driver's user cache "
        "($PCG_SYNTH_CACHE/groups or ~/.cache/pcg-synth/groups), shared by every job; an s3:// "
        "prefix shares them between drivers on different machines."))
    dtype: str = Field("auto", description=(
        "Precision of target and draft: auto (bfloat16 on GPU and on CPUs with native bfloat16 "
        "instructions, AVX512-BF16 or AMX; float32 on other CPUs), float32, bfloat16, float16. "
        "The codec's auto stays float32 on CPU."))
    compile: CompileMode = Field("auto", description=(
        "How decode rounds run: each round (draft steps, target verify, warp, judge, commit) as "
        "one torch.compile graph, inductor (CPU or CUDA) or cudagraphs (CUDA only: inductor plus "
        "CUDA graph replay, one launch per round); none (eager, op by op); or auto: cudagraphs on "
        "CUDA, none on a CPU (compiled rounds are shorter there, by a third to nearly half on "
        "small models and under a tenth at Llasa-1B's size, after a compile of 5-35 s per plan "
        "that short jobs do not win back: docs, performance; set inductor for long CPU jobs). "
        "Under auto a round whose graph fails to compile runs eagerly, warned (summary.json: "
        "rounds.compile_failed); an explicit mode makes it an error. "
        "Compiled code is cached on disk, so only the first worker of a "
        "machine compiles; prefills stay eager."))
    draft_weights: DraftWeights = Field("native", description=(
        "How the draft stores its projections and head: native (in dtype) or int8 (CPU only, "
        "oneDNN: about half the bytes a draft step reads; acceptance may move a little, the "
        "target's distribution does not, since every rule corrects with the draft's "
        "probabilities as computed). Runs eagerly (compile auto then means none). Pays only on CPUs "
        "with VNNI or AMX int8 instructions; on AVX2-only ones oneDNN's int8 kernel is slower than "
        "float32 (a warning says so)."))

    @model_validator(mode="after")
    def _int8_is_eager(self) -> ModelsSpec:
        if self.draft_weights == "int8" and self.compile not in ("none", "auto"):
            raise ValueError("models.draft_weights int8 runs eagerly: set models.compile to none")
        return self


class InputSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    manifests: list[str] = Field(min_length=1, description=(
        "Manifest files or directories/prefixes of them (.jsonl, .csv, .parquet, or .jsonl.gz, .csv.gz; "
        "local or s3://). "
        "Rows: id (a string, or an integer taken as its decimal string), text, optional prompt_text "
        f"with prompt_codes or prompt_audio (a clip URI), prompt_id, seed, {', '.join(KNOB_NAMES)} "
        "(bounded as the decoding fields; a row whose value is not is an error record)."))


OutputFormat = Literal["hf-parquet", "nemo", "lhotse-shar"]  # writers: engine/io/formats/
OUTPUT_FORMATS: tuple[str, ...] = get_args(OutputFormat)


class OutputSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    uri: str = Field(description="Output directory or s3:// prefix: data/*.parquet, _commits/, summary.json.")
    audio_format: Literal["wav", "flac"] = Field("flac", description="Audio bytes in the dataset.")
    prompt_audio: Literal["strip", "include", "context"] = Field("strip", description=(
        "Voice-prompt audio in the output: strip, include, or decode with it as context and cut it."))
    lease_stale_s: float = Field(60.0, ge=2.0, description=(
        "One driver writes an output at a time: it holds a lease there (`_lease/`), renewed every "
        "quarter of this time. A lease not renewed for this long (the driver was killed, its machine "
        "lost) is taken over by the next driver; one whose driver on the same machine is gone, at "
        "once. A driver that cannot renew its lease for three quarters of it stops."))
    format: OutputFormat = Field("hf-parquet", description=(
        "How shards are written: hf-parquet (data/<shard>.parquet, read by `datasets`; error rows "
        "are rows with `error` set), nemo (NeMo's JSON-lines manifests with audio files, "
        "audio/<shard>/manifest.json, or tarred shards with `tarred`), lhotse-shar (Lhotse Shar "
        "under shar/: cuts.<N>.jsonl.gz with codes and statistics as custom fields, "
        "recording.<N>.tar). nemo and lhotse-shar keep error rows in errors/<shard>.jsonl."))
    tarred: bool = Field(False, description=(
        "nemo only: write each shard as a tarred audio shard as NeMo's tarred datasets are laid "
        "out (audio_<N>.tar, sharded_manifests/manifest_<N>.json with shard_id fields, and "
        "tarred_audio_manifest.json once every shard is written)."))

    @model_validator(mode="after")
    def _tarred_is_nemo(self) -> OutputSpec:
        if self.tarred and self.format != "nemo":
            raise ValueError(f"output.tarred applies to output.format nemo, not {self.format}")
        return self


SplitMode = Literal["auto", "sentences", "none"]
SPLIT_MODES: tuple[str, ...] = get_args(SplitMode)
NormalizerName = Literal["rules", "nemo"]
NORMALIZERS: tuple[str, ...] = get_args(NormalizerName)
# the languages each normaliser has: rules (engine/text/english.py), nemo (nemo_text_processing's
# text_normalization/<lang> grammars)
NORMALIZE_LANGUAGES: dict[str, tuple[str, ...]] = {
    "rules": ("en",),
    "nemo": ("ar", "de", "en", "es", "fr", "hi", "hu", "hy", "it", "ja", "ko", "pt", "ru", "rw", "sv", "vi", "zh")}
NormalizeLanguage = Literal[("none", *sorted({lang for langs in NORMALIZE_LANGUAGES.values() for lang in langs}))]
# the languages pysbd has sentence rules for (tests/cpu/test_text.py holds this to pysbd's own list)
SENTENCE_LANGUAGES = ("am", "ar", "bg", "da", "de", "el", "en", "es", "fa", "fr", "hi", "hy", "it", "ja", "kk",
                      "mr", "my", "nl", "pl", "ru", "sk", "ur", "zh")
def check_normalizer(language: str, backend: str) -> None:
    """`language` is one the normaliser `backend` has.

    Raises:
        ValueError: an unknown normaliser, or a language it lacks.
    """
    if backend not in NORMALIZERS:
        raise ValueError(f"text.normalizer must be one of {', '.join(NORMALIZERS)}; got {backend!r}")
    have = NORMALIZE_LANGUAGES[backend]
    if language not in have:
        hint = " (text.normalizer nemo has it)" if language in NORMALIZE_LANGUAGES["nemo"] else ""
        raise ValueError(f"text.normalizer {backend} has no language {language!r}{hint}; it has {', '.join(have)}")


class TextSpec(BaseModel):
    """How texts are prepared before decoding: normalisation, and long texts cut into chunks
    that fit one decode (engine/text/)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    split: SplitMode = Field("auto", description=(
        "Long texts: auto (a text whose estimated speech, with headroom, does not fit the row's "
        "max_new_tokens and the model's context is cut at sentence boundaries into chunks that "
        "fit, a sentence still too long at clause boundaries; each chunk is decoded with the "
        "row's voice prompt and a seed derived from the row's; a text that fits is decoded as it "
        "is), sentences (every sentence its own chunk), none (one decode per row; a text too long "
        "is cut at the limit). With auto, max_new_tokens bounds each chunk, not the row: set none "
        "where it is meant to cut rows short."))
    split_output: Literal["joined", "rows"] = Field("joined", description=(
        "A split row's output: joined (one row: the chunks' codes in order, their audio joined "
        "with edge silence trimmed and a short crossfade, per-chunk statistics kept) or rows (one "
        "row per chunk, with the parent id and a segment index)."))
    chunk_retries: int = Field(3, ge=0, le=16, description=(
        "How many times a chunk of a split row whose decode ended without a speech code is decoded "
        "again, each time with a seed derived from the chunk's seed, its attempt and the retry's "
        "number, before the chunk (and with split_output joined its row) fails; the commit records "
        "and the summary count the retries (chunk_retries). A chunk the model cannot take (its "
        "prompt fills the context) is not retried: no seed changes that. 0: no retries."))
    normalize: NormalizeLanguage = Field("none", description=(
        "Write numbers, money, dates, times and abbreviations out as words before tokenising, in "
        "this language (none: off); the result is stored as normalized_text beside text."))
    normalizer: NormalizerName = Field("rules", description=(
        "Which normaliser: rules (built in, English) or nemo (NeMo's text normalisation, many "
        "languages; install nemo_text_processing, Linux x86-64 only: docs, the long-texts "
        "guide)."))
    language: str = Field("en", description=(
        "Language of the texts' sentence rules (pysbd's codes) used when splitting."))

    @model_validator(mode="after")
    def _languages(self) -> TextSpec:
        if self.language not in SENTENCE_LANGUAGES:
            raise ValueError(f"text.language {self.language!r} has no sentence rules; known: "
                             f"{', '.join(SENTENCE_LANGUAGES)}")
        if self.normalize != "none":
            check_normalizer(self.normalize, self.normalizer)
        return self


# Batches of decoded rows that may wait for the quality gate's checks: decoding runs that far ahead
# of a slower check while memory stays bounded (codes only), and a worker holds as many more shards
# (`JobSpec.shards_held`), so that shards waiting for checks do not keep the next ones from the batch.
VERIFY_QUEUE_BATCHES = 16


class ResourcesSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: int = Field(1, ge=1, description="Synthesis actors (one per GPU on GPU clusters).")
    gpus_per_worker: float = Field(0, ge=0, description="GPUs per actor: 1 on GPU clusters, 0 on CPU.")
    cpus_per_worker: float = Field(1, gt=0, description="CPUs reserved per actor.")
    batch_size: int = Field(8, ge=1, description="Rows decoded together per worker (continuous batching).")
    rows_per_shard: int = Field(256, ge=1, description="Manifest rows per output shard (one Parquet file).")
    max_retries: int = Field(3, ge=0, description="Retries of a shard whose worker died or failed.")
    retry_backoff_s: float = Field(2.0, ge=0, description=(
        "Wait before a shard's first retry; doubled per retry of that shard, with jitter (a "
        "random 50-100 %); other shards go on meanwhile."))
    retry_backoff_max_s: float = Field(60.0, ge=0, description="Cap of one shard retry's wait.")
    capacity_wait_s: float = Field(1800.0, ge=0, description=(
        "When no live node can host a worker (the only worker node was lost), how long the "
        "driver asks the autoscaler for capacity and waits for nodes before it fails the shards "
        "left (committed shards are kept; a rerun resumes)."))
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description=(
        "auto (cuda when the worker reserves GPUs, gpus_per_worker > 0, and torch sees CUDA; "
        "else cpu), cpu, or cuda (needs gpus_per_worker > 0). A worker sees the GPUs Ray gave "
        "it, as cuda:0 onwards."))
    shard_window: int = Field(2, ge=1, description=(
        "Shards a worker holds at once: their rows share its batch, so rows of the next shard "
        "take the slots rows of the current one leave. Raised to hold at least two batches of "
        "rows (ceil(2 * batch_size / rows_per_shard) + 1 shards), so the batch never drains "
        "between shards; with the quality gate on, also by the shards whose rows wait for checks "
        f"({VERIFY_QUEUE_BATCHES} batches of rows). 1: one shard at a time (a shard's rows are then always batched "
        "together, the same way in every run)."))
    admission: Admission = Field("longest_first", description=(
        "Which queued row takes a free batch slot: longest_first (shards in order, each shard's "
        "rows longest expected speech first, estimated from the text and capped by "
        "max_new_tokens, so a shard ends with its short rows and the batch drains late at the "
        "end of the job) or arrival (manifest order). A row's codes "
        "do not depend on it, as they do not depend on the rows beside it (see Guarantees)."))

    @model_validator(mode="after")
    def _gpus_for_cuda(self) -> ResourcesSpec:
        # Ray leaves every GPU of a node visible to an actor that reserves none: such workers
        # would all share cuda:0 without the scheduler knowing
        if self.device == "cuda" and self.gpus_per_worker == 0:
            raise ValueError("resources.device cuda needs resources.gpus_per_worker > 0 (1: a GPU "
                             "per worker; 0.5: two workers share one), or Ray reserves no GPU for "
                             "the workers")
        return self

    @property
    def window(self) -> int:
        """Shards a worker actually holds (`shard_window`, raised to keep the batch fed)."""
        if self.shard_window == 1:
            return 1
        return max(self.shard_window, -(-2 * self.batch_size // self.rows_per_shard) + 1)


class ProfileSpec(BaseModel):
    """Profiling of the workers' decode loops (throughput experiments: where a round's time goes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rounds: int = Field(0, ge=0, description=(
        "Decode rounds each worker profiles with torch.profiler (0: off): the decode thread's "
        "ops, and on CUDA its runtime calls and kernels, reduced to figures per round in "
        "<output>/_profiles/<worker>-<pid>.json. Fewer when the worker's batch runs empty first."))
    skip: int = Field(0, ge=0, description=(
        "Decode rounds a worker runs before it profiles (after its warm-up, if any); 0 profiles "
        "from a fresh worker's first round."))
    trace: bool = Field(False, description=(
        "Also write each profile as a gzipped Chrome trace (<worker>-<pid>.trace.json.gz; "
        "ui.perfetto.dev opens it); about 1 MB per 10 rounds on the tiny kit."))


class VoicePromptSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, description="Prompt id (goes into every row's provenance).")
    text: str = Field(min_length=1, description="Transcript of the prompt clip.")
    codes: list[int] | None = Field(None, description=(
        "Codec codes of the clip (Llasa: X-codec2; Orpheus: SNAC in 7-code frames), or give audio."))
    audio: str | None = Field(None, description="WAV/FLAC clip URI (encoded once, cached).")

    @model_validator(mode="after")
    def _one_source(self) -> VoicePromptSpec:
        if (self.codes is None) == (self.audio is None):
            raise ValueError(f"voice prompt {self.id!r}: give exactly one of codes or audio")
        return self


class AugmentSpec(BaseModel):
    """An augmentation corpus: every manifest text crossed with voices, seeds, sampling settings
    and methods, capped per text and by an audio budget (kind: augment)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompts: list[VoicePromptSpec] = Field(default_factory=list, description=(
        "Voices to clone; each variant uses one (none: the model's own voice)."))
    named_voices: list[str] = Field(default_factory=list, description=(
        "Named voices of the model (Orpheus's -ft checkpoints: tara, leah, jess, leo, dan, mia, zac, "
        "zoe), crossed like the voice prompts; each variant uses one voice, prompt or named."))
    include_no_prompt: bool = Field(False, description="Also make variants without a voice prompt or named voice.")
    seeds: list[int] = Field([0], min_length=1, description="Sampling seeds per combination.")
    temperatures: list[float] | None = Field(None, description=(
        f"Temperatures, each in [0, {MAX_TEMPERATURE:g}] (default: decoding.temperature)."))
    top_ps: list[float] | None = Field(None, description="top_p values (default: decoding.top_p).")
    methods: list[Method] | None = Field(None, description="Acceptance rules (default: decoding.method).")
    max_variants_per_text: int | None = Field(None, ge=1, description=(
        "Cap per text; combinations are then sampled, balanced across voices."))
    max_audio_hours: float | None = Field(None, gt=0, description=(
        "Budget of estimated audio (text length / chars_per_second); variants per text are "
        "reduced evenly until the corpus fits. The summary reports the real hours."))
    chars_per_second: float = Field(15.0, gt=0, description=(
        "Speaking rate used to estimate durations (a CJK character counts as 3)."))
    sample_seed: int = Field(0, ge=0, description="Seed of the combination sampling and the shuffle.")

    @model_validator(mode="after")
    def _values(self) -> AugmentSpec:
        if any(not 0.0 <= t <= MAX_TEMPERATURE for t in self.temperatures or []):
            raise ValueError(f"temperatures must lie in [0, {MAX_TEMPERATURE:g}]")
        if any(not 0.0 < p <= 1.0 for p in self.top_ps or []):
            raise ValueError("top_ps must lie in (0, 1]")
        ids = [p.id for p in self.prompts]
        if len(set(ids)) != len(ids):
            raise ValueError("prompt ids must be unique")
        if len(set(self.named_voices)) != len(self.named_voices) or not all(v.strip() for v in self.named_voices):
            raise ValueError("named_voices must be distinct, non-empty names")
        return self

    @property
    def voices(self) -> list[VoicePromptSpec | str | None]:
        """The voices to cross with: the prompts, the named voices, plus None (the model's own
        voice) when asked for or when neither is given."""
        own = [None] if self.include_no_prompt or not (self.prompts or self.named_voices) else []
        return [*self.prompts, *self.named_voices, *own]


OnReject = Literal["rejects", "drop"]


class QualitySpec(BaseModel):
    """The quality gate: every decoded row's audio is checked before it is written; a row that
    fails is decoded again (`attempts`) or chosen among candidates (`best_of`), and a row that
    never passes goes to `rejects/` or is dropped. Off unless a check or a verifier is set
    (docs/guides/quality.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    asr: str | None = Field(None, description=(
        "Speech recogniser whose transcript is scored against the row's text: 'pocketsphinx' "
        "(bundled, offline, weak: it catches gross failures) or a transformers Whisper or CTC "
        "checkpoint (a local directory, an s3:// URI or a Hub id), run on the worker's device. "
        "Default: pocketsphinx when max_cer or max_wer is set; set alone, it only records cer/wer."))
    max_cer: float | None = Field(None, ge=0, description=(
        "Highest character error rate of the ASR transcript against the row's text, as a fraction "
        "(0.01 = 1 %), both normalised as `pcg-synth eval` normalises them."))
    max_wer: float | None = Field(None, ge=0, description="Highest word error rate, as max_cer.")
    speaker: str | None = Field(None, description=(
        "Speaker encoder for the similarity to the row's voice prompt: 'resemblyzer' (bundled) or "
        "a transformers x-vector checkpoint (a local directory, an s3:// URI or a Hub id). "
        "Default: resemblyzer when min_speaker_similarity is set; set alone, it only records "
        "speaker_similarity."))
    min_speaker_similarity: float | None = Field(None, ge=-1, le=1, description=(
        "Lowest cosine similarity between speaker embeddings of the row's audio and of its voice "
        "prompt's clip (a prompt given as codes is decoded for it); rows without a voice prompt "
        "are not checked."))
    min_duration_s: float | None = Field(None, ge=0, description="Shortest speech a row may have, in seconds.")
    max_duration_s: float | None = Field(None, gt=0, description="Longest speech a row may have, in seconds.")
    min_chars_per_s: float | None = Field(None, ge=0, description=(
        "Slowest speaking rate: characters of the row's normalised text per second of its speech "
        "(a row that says its text too slowly, or adds speech of its own)."))
    max_chars_per_s: float | None = Field(None, gt=0, description=(
        "Fastest speaking rate, as min_chars_per_s (a row that skips part of its text)."))
    reject_truncated: bool = Field(False, description=(
        "Fail rows whose speech reached the token limit (finish reason `length`): their audio is cut."))
    attempts: int = Field(1, ge=1, le=16, description=(
        "Decodes a row may take: a row that fails is decoded again with a seed derived from its own "
        "(the same in every run), ahead of rows not yet started, until it passes or its attempts are "
        "spent. Exclusive with best_of."))
    best_of: int = Field(1, ge=1, le=16, description=(
        "Candidates decoded per row, in the same batch, with seeds derived from the row's; the one "
        "kept is the best by the gate's score: passing every check first, then the lowest CER "
        "(else WER), then the highest speaker similarity, then the earliest candidate. "
        "Exclusive with attempts."))
    on_reject: OnReject = Field("rejects", description=(
        "Rows that never pass: 'rejects' writes them to rejects/<shard>.parquet in the data's "
        "schema, with reject_reason and the kept attempt's audio; 'drop' writes them nowhere "
        "(both are counted in the summary)."))

    @model_validator(mode="after")
    def _consistent(self) -> QualitySpec:
        if self.attempts > 1 and self.best_of > 1:
            raise ValueError("quality: give attempts or best_of, not both")
        if (self.attempts > 1 or self.best_of > 1) and not self.checks:
            raise ValueError("quality: attempts and best_of need a check to pass (max_cer, max_wer, "
                             "min_speaker_similarity, a duration or speaking-rate bound, reject_truncated)")
        for low, high in (("min_duration_s", "max_duration_s"), ("min_chars_per_s", "max_chars_per_s")):
            lo, hi = getattr(self, low), getattr(self, high)
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(f"quality: {low} {lo} is above {high} {hi}")
        return self

    @property
    def checks(self) -> list[str]:
        """The checks set (the fields whose bound a row must meet)."""
        bounds = ("max_cer", "max_wer", "min_speaker_similarity", "min_duration_s", "max_duration_s",
                  "min_chars_per_s", "max_chars_per_s")
        return [b for b in bounds if getattr(self, b) is not None] + ["reject_truncated"] * self.reject_truncated

    @property
    def enabled(self) -> bool:
        """A check or a verifier is set: rows are scored (and gated) before they are written."""
        return bool(self.checks) or self.asr is not None or self.speaker is not None

    @property
    def asr_model(self) -> str | None:
        """The recogniser to load (None: no ASR)."""
        if self.asr is not None:
            return self.asr
        return "pocketsphinx" if self.max_cer is not None or self.max_wer is not None else None

    @property
    def speaker_model(self) -> str | None:
        """The speaker encoder to load (None: no speaker similarity)."""
        if self.speaker is not None:
            return self.speaker
        return "resemblyzer" if self.min_speaker_similarity is not None else None

    @property
    def candidates(self) -> int:
        """Attempts decoded at once when a row starts (best_of), else 1."""
        return self.best_of


class ModelPair(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9._-]+$", description="Label of the pair in results and plots.")
    target: str = Field(description="Target checkpoint.")
    draft: str | None = Field(None, description=(
        "Draft checkpoint or stream-heads directory (`pcg-synth draft train --kind streams`; gamma at "
        "most their count); None: only 'ar' points run."))


class SweepSpec(BaseModel):
    """A throughput experiment: every grid point is a measured synthesis run (kind: sweep)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: list[int] = Field([1], min_length=1, description="Worker counts (scaling).")
    batch_sizes: list[int] = Field([8], min_length=1, description="Batch sizes per worker.")
    gammas: list[int | Literal["auto"]] = Field([3], min_length=1, description="Draft lengths (or auto).")
    thetas: list[float] = Field([0.4], min_length=1, description="PCG thresholds (pcg points only).")
    methods: list[Method] = Field(["ar", "pcg"], min_length=1, description="Acceptance rules.")
    model_pairs: list[ModelPair] = Field(default_factory=list, description=(
        "Target/draft pairs to compare (default: models.target and models.draft); a pair's draft may be "
        "a draft checkpoint or stream heads."))
    repetitions: int = Field(1, ge=1, description="Runs per point (results keep each; plots use the median).")
    reuse_workers: bool = Field(True, description=(
        "Keep workers loaded from one point to the next of the same model pair: a point takes "
        "them, with its own decoding settings and batch size, and warms them up again, instead "
        "of loading the models anew (false: every point starts and loads its own workers, each "
        "measured in a fresh process). Results record `workers_reused` per run."))

    @model_validator(mode="after")
    def _values(self) -> SweepSpec:
        if any(w < 1 for w in self.workers) or any(b < 1 for b in self.batch_sizes):
            raise ValueError("workers and batch_sizes must be >= 1")
        if any(not 0.0 < t <= 1.0 for t in self.thetas):
            raise ValueError("thetas must lie in (0, 1]")
        return self


class JobSpec(BaseModel):
    """A synthesis job: models, decoding, manifests in, an Arrow audio dataset out."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("synthesis", pattern=r"^[A-Za-z0-9._-]+$", description="Job name (logs, summary).")
    kind: Literal["synthesize", "augment", "sweep"] = Field("synthesize", description=(
        "synthesize: one row per manifest row; augment: the `augment` cross product per row; "
        "sweep: a throughput experiment over the `sweep` grid."))
    augment: AugmentSpec | None = Field(None, description="The augmentation grid (kind: augment).")
    sweep: SweepSpec | None = Field(None, description="The throughput grid (kind: sweep).")
    models: ModelsSpec = Field(description="The checkpoints: target, draft, codec, and the groups.")
    decoding: DecodingSettings = Field(default_factory=DecodingSettings, description=(
        "How to decode: acceptance rule, draft length and sampling; a manifest row may override "
        "its sampling settings."))
    input: InputSpec = Field(description="The manifests to synthesize.")
    output: OutputSpec = Field(description="Where the audio dataset, commit records and summary go.")
    storage: StorageOptions = Field(default_factory=StorageOptions, description=(
        "Object-storage endpoint/region/profile; credentials come from the AWS chain."))
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description=(
        "Workers, their CPUs, GPUs and batch, shards, retries and waits."))
    profile: ProfileSpec = Field(default_factory=ProfileSpec, description=(
        "Profiling of the workers' decode loops (off by default)."))
    text: TextSpec = Field(default_factory=TextSpec, description=(
        "Normalisation and long-text splitting of the manifests' texts."))
    quality: QualitySpec = Field(default_factory=QualitySpec, description=(
        "The quality gate (off by default): checks on every row's audio, regeneration of the rows "
        "that fail, rejects/ for those that never pass."))

    @model_validator(mode="after")
    def _needs_draft(self) -> JobSpec:
        methods = set(self.augment.methods or []) if self.augment else set()
        if self.sweep is None or not self.sweep.model_pairs:
            methods |= set(self.sweep.methods) if self.sweep else set()
        methods.add(self.decoding.method)
        if methods - {"ar"} and self.models.draft is None:
            raise ValueError(f"models.draft is required for method(s) {sorted(methods - {'ar'})}")
        if (self.kind == "augment") != (self.augment is not None):
            raise ValueError("kind: augment goes with an `augment` section (and only then)")
        if (self.kind == "sweep") != (self.sweep is not None):
            raise ValueError("kind: sweep goes with a `sweep` section (and only then)")
        return self

    @property
    def shards_held(self) -> int:
        """Shards a worker holds at once: `resources.window`, and with the quality gate on as many
        more as the decoded rows of `VERIFY_QUEUE_BATCHES` batches fill. A shard whose rows are
        decoded waits for their checks (and regenerations) before it is written; held shards that
        wait so would otherwise keep the next shards from the batch (`resources.shard_window: 1`
        stays one shard at a time)."""
        res = self.resources
        if res.window == 1 or not self.quality.enabled:
            return res.window
        return res.window + -(-VERIFY_QUEUE_BATCHES * res.batch_size // res.rows_per_shard)

    @property
    def worker_key(self) -> str:
        """What a loaded synthesis worker depends on besides the job's decoding, batch size,
        shards and output: the models and how they load (groups aside: each job ships its own),
        the storage they come from, and where the worker runs (device, CPUs and so its torch
        threads, GPUs). Workers of equal keys serve each other's jobs (a sweep's points)."""
        import json

        return json.dumps({"models": self.models.model_dump(mode="json", exclude={"groups", "groups_cache"}),
                           "storage": self.storage.model_dump(mode="json"),
                           "resources": self.resources.model_dump(
                               mode="json", include={"device", "cpus_per_worker", "gpus_per_worker"})},
                          sort_keys=True)

    @classmethod
    def load(cls, path: str | Path) -> JobSpec:
        """Read and validate a YAML spec; relative local paths are taken from the spec's folder.

        Raises:
            ValueError: unreadable YAML (pydantic's ValidationError for bad fields).
        """
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"job spec {path} does not exist")
        try:
            raw = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML ({exc})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: a job spec is a YAML mapping")
        return cls.model_validate(resolve_paths(raw, path.parent.resolve()))


def _local(value: str, base: Path) -> str:
    if "://" in value or Path(value).is_absolute():
        return value
    return str((base / value).resolve())


def _model(value: str, base: Path) -> str:
    """A model reference from a spec: a path relative to the spec's folder when one exists there,
    else a Hub model id as written (`org/name[@revision]`), else a local path."""
    if hub_model_id(value) and not (base / value).exists():
        return value
    return _local(value, base)


def resolve_paths(raw: dict, base: Path) -> dict:
    """Make relative local paths in models/input/output and the quality gate's verifiers absolute
    against `base`."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    models = out.get("models") or {}
    for key in ("target", "draft", "codec", "groups", "groups_cache"):
        if isinstance(models.get(key), str):
            models[key] = (_model if key in ("target", "draft", "codec") else _local)(models[key], base)
    inp = out.get("input") or {}
    if isinstance(inp.get("manifests"), list):
        inp["manifests"] = [_local(m, base) if isinstance(m, str) else m for m in inp["manifests"]]
    for pair in (out.get("sweep") or {}).get("model_pairs") or []:
        for key in ("target", "draft"):
            if isinstance(pair, dict) and isinstance(pair.get(key), str):
                pair[key] = _model(pair[key], base)
    aug = out.get("augment") or {}
    for prompt in aug.get("prompts") or []:
        if isinstance(prompt, dict) and isinstance(prompt.get("audio"), str):
            prompt["audio"] = _local(prompt["audio"], base)
    quality = out.get("quality") or {}
    for key, bundled in (("asr", "pocketsphinx"), ("speaker", "resemblyzer")):
        if isinstance(quality.get(key), str) and quality[key] != bundled:
            quality[key] = _model(quality[key], base)
    outp = out.get("output") or {}
    if isinstance(outp.get("uri"), str):
        outp["uri"] = _local(outp["uri"], base)
    return out


def _models_in(annotation) -> list[type[BaseModel]]:
    """The settings models a field's annotation holds (`X | None`, `list[X]`, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def accepted_keys(model: str, loc: tuple) -> list[str]:
    """The keys the mapping at `loc` accepts, `loc` being a validation error's location below the
    settings model named `model` (`"JobSpec"`, `("decoding",)` -> the decoding settings' fields);
    [] where that is not one of these models."""
    current = {c.__name__: c for c in globals().values()
               if isinstance(c, type) and issubclass(c, BaseModel) and c.__module__ == __name__}.get(model)
    for part in loc:
        if current is None:
            return []
        if isinstance(part, int):
            continue  # an entry of a list of models
        field = current.model_fields.get(part)
        found = _models_in(field.annotation) if field is not None else []
        current = found[0] if found else None
    return list(current.model_fields) if current is not None else []
