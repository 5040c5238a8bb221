"""What the driver checks before any work, and `pcg-synth run --dry-run`: everything about a job
that can be known without models, Ray or writing to its output.

`preflight` (models present, output writable), `check_resume` (a rerun is the same job under
the same numerics) and the groups-file check run at the start of every job. `dry_run` runs the
same checks without writing anything (the output's writability probe aside, a file it deletes
at once), then reads and validates every manifest row as the workers would, and reports the
plan: rows, shards, the rows that would become error records and why, the fields the manifests
carry that the job ignores, an estimate of the speech to generate, and what the output already
holds (a new job, a resume, a finished job). Imports no torch or Ray (a given groups file is
checked against the target's embeddings, which loads torch).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.config import DecodingSettings, InputSpec, JobSpec, QualitySpec, TextSpec
from engine.console import counted
from engine.decoding.admission import CHARS_PER_SECOND, expected_tokens
from engine.families import Family, SpeechLayout, check_max_new_tokens
from engine.io.lease import OutputLease
from engine.io.manifest import ManifestRow, RowError, validate
from engine.io.storage import STREAMS_INFO, Storage, StorageError, join, parse, relative_to
from engine.runtime import numerics
from engine.runtime.family import with_family
from engine.runtime.plan import Layout, Plan, make_plan, plan_of
from engine.runtime.sizing import dry_run_sizing, gpu_named, sizing_lines
from engine.runtime.sweep_grid import points, run_uri, schedule
from engine.text.prepare import TextPlanner

EXAMPLES = 5  # error rows shown by a dry run


def check_checkpoint(storage: Storage, uri: str | None, name: str) -> None:
    """A checkpoint the spec names (at `name`) is there (None: none named); a drafter (`.draft`)
    may be a draft model or stream heads.

    Raises:
        ValueError: `<name>: why`.
    """
    if uri is None:
        return
    markers = ("config.json", STREAMS_INFO) if name.endswith(".draft") else ("config.json",)
    try:
        found = storage.has_checkpoint(uri.rstrip("/"), markers)
    except StorageError as exc:
        raise ValueError(f"{name}: {exc}") from None
    if not found:
        raise ValueError(f"{name}: no checkpoint at {uri} ({' or '.join(markers)} missing)")


# the quality gate's bundled verifiers: the Python package each needs (pcg-synth[quality])
BUNDLED_VERIFIERS = {"pocketsphinx": "pocketsphinx", "resemblyzer": "resemblyzer"}


def check_verifiers(quality: QualitySpec, storage: Storage) -> None:
    """The quality gate's verifiers are there: a bundled one's package installed, a checkpoint
    (local directory, object-store URI, Hub model in the cache) holding its config.json; WER/CER
    need jiwer.

    Raises:
        ValueError: `quality.asr: why` (or `quality.speaker`).
    """
    import importlib.util

    for name, ref in (("quality.asr", quality.asr_model), ("quality.speaker", quality.speaker_model)):
        if ref is None:
            continue
        if ref not in BUNDLED_VERIFIERS:
            check_checkpoint(storage, ref, name)
        modules = [BUNDLED_VERIFIERS[ref]] if ref in BUNDLED_VERIFIERS else []
        for module in modules + (["jiwer"] if name == "quality.asr" else []):  # jiwer: WER/CER
            if importlib.util.find_spec(module) is None:
                raise ValueError(f"{name}: the Python package {module} is not installed: "
                                 f"pip install 'pcg-synth[quality]' (or pip install {module})")


def check_normalizer_installed(text: TextSpec) -> None:
    """The normaliser `text` asks for is installed (NeMo's, for `text.normalizer: nemo`).

    Raises:
        ValueError: `text.normalizer: why`.
    """
    import importlib.util

    nemo = text.normalize != "none" and text.normalizer == "nemo"
    if nemo and importlib.util.find_spec("nemo_text_processing") is None:
        raise ValueError("text.normalizer: nemo needs NeMo's text normalisation: pip install nemo_text_processing "
                         "(Linux x86-64; docs/guides/long-texts-and-formats.md), or use text.normalizer rules")


def check_text_and_format(spec: JobSpec) -> None:
    """What `text.normalizer` and `output.format` need is installed (NeMo's normaliser, lhotse).

    Raises:
        ValueError: `text.normalizer: why` (or `output.format`).
    """
    import importlib.util

    check_normalizer_installed(spec.text)
    if spec.output.format == "lhotse-shar" and importlib.util.find_spec("lhotse") is None:
        raise ValueError("output.format: lhotse-shar needs lhotse: pip install 'pcg-synth[lhotse]'")


def preflight(spec: JobSpec, storage: Storage, create: bool = True) -> None:
    """Fail before any work on what can be checked cheaply: models present (a sweep's: every
    model pair's too, so a pair's missing draft stops the sweep before its first point, not
    hours later at that pair's), the quality gate's verifiers, the text normaliser and the
    output format's library installed, output writable (by writing and deleting a probe file there;
    `create=False`, a dry run: a local output that does not exist yet is checked through its
    nearest existing folder, so none is made).

    Raises:
        ValueError: naming the spec field at fault.
    """
    for part in ("target", "draft", "codec"):
        check_checkpoint(storage, getattr(spec.models, part), f"models.{part}")
    if spec.kind == "sweep":
        for i, pair in enumerate(spec.sweep.model_pairs):
            for part in ("target", "draft"):
                check_checkpoint(storage, getattr(pair, part), f"sweep.model_pairs[{i}].{part}")
    if spec.models.groups and not storage.exists(spec.models.groups):
        raise ValueError(f"models.groups: no groups file at {spec.models.groups}")
    check_verifiers(spec.quality, storage)
    check_text_and_format(spec)
    root = Layout(spec.output.uri).root.rstrip("/")
    if not create and parse(root).scheme == "file" and not Path(parse(root).path).exists():
        folder = next(p for p in Path(parse(root).path).absolute().parents if p.exists())
        if not (folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)):
            raise ValueError(f"output.uri: cannot write under {spec.output.uri} ({folder} is not a writable folder)")
        return
    check_writable(storage, root, f"output.uri: cannot write under {spec.output.uri}")


def check_writable(storage: Storage, root: str, refusal: str) -> None:
    """Write and delete a probe file under `root` (a folder or prefix, made where missing).

    Raises:
        ValueError: `refusal`, with the reason, where it cannot be written.
    """
    probe = root.rstrip("/") + "/_probe"
    try:
        storage.write_bytes(probe, b"")
        storage.delete(probe)
    except (StorageError, OSError) as exc:
        raise ValueError(f"{refusal} ({exc})") from None


def recorded_job(spec: JobSpec, plan: Plan, storage: Storage, layout: Layout, now: dict,
                 allow_numerics_change: bool = False) -> tuple[dict | None, list[str]]:
    """The job record (`_job.json`) the output already holds (None: a new output) and the
    numerics differences from `now` that were allowed.

    Raises:
        ValueError: the output holds a different job, or was written under another numerics
            environment (device type, torch version, threads per worker) and that was not
            allowed.
    """
    if not storage.exists(layout.job):
        return None, []
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
    return earlier, changes


def committed_shards(plan: Plan, storage: Storage, layout: Layout) -> set[str]:
    """The plan's shards the output holds a commit for."""
    ids = {s.id for s in plan.shards}
    return {u.rsplit("/", 1)[-1][: -len(".json")] for u in storage.list(layout.commit("x").rsplit("/", 1)[0])} & ids


def check_resume(spec: JobSpec, plan: Plan, storage: Storage, layout: Layout,
                 allow_numerics_change: bool = False) -> tuple[set[str], list[str]]:
    """Record the job in the output, or verify a rerun is the same job under the same numerics
    environment; returns the committed shard ids and the numerics differences allowed.

    Raises:
        ValueError: as `recorded_job`.
    """
    now = numerics.expected(spec)
    earlier, changes = recorded_job(spec, plan, storage, layout, now, allow_numerics_change)
    if earlier is None:
        record = {"name": spec.name, "spec": spec.model_dump(mode="json"), **plan.to_dict(), "numerics": now}
        storage.write_bytes(layout.job, json.dumps(record, indent=1).encode())
    elif changes:
        earlier.setdefault("numerics_changes", []).append({"changes": changes, "now": now})
        storage.write_bytes(layout.job, json.dumps(earlier, indent=1).encode())
    return committed_shards(plan, storage, layout), changes


def needs_groups(spec: JobSpec) -> bool:
    return "pcg" in {spec.decoding.method, *(spec.augment.methods or [] if spec.augment else [])}


def check_groups_file(spec: JobSpec, storage: Storage):
    """The groups file `models.groups`, verified before any work (before `_job.json` is
    written): intact, and built for this job's theta and group-size cap from this target's
    speech-token embeddings (their hash). Every error names the file.

    Raises:
        ValueError: `models.groups: <uri>: why`.
    """
    from engine.groups.source import embeddings_sha256, speech_rows_of
    from engine.groups.store import GroupFileError, from_bytes

    uri = spec.models.groups
    try:
        data = storage.read_bytes(uri)
        embeddings, layout = speech_rows_of(storage, spec.models.target)
        expect = {"embeddings_sha256": embeddings_sha256(embeddings), "theta": spec.decoding.theta,
                  "max_group_size": spec.decoding.max_group_size, "family": layout.family, "ranges": layout.ranges}
        return from_bytes(data, uri, expect)
    except (GroupFileError, StorageError) as exc:
        raise ValueError(f"models.groups: {exc}") from None


def finished_summary(storage: Storage, layout: Layout, plan: Plan) -> dict | None:
    """The summary a finished run of this very job wrote (every shard committed), else None."""
    if not storage.exists(layout.summary):
        return None
    summary = json.loads(storage.read_bytes(layout.summary))
    shards = summary.get("shards", {})
    done = shards.get("committed") == len(plan.shards) and not shards.get("failed")
    return summary if summary.get("fingerprint") == plan.fingerprint and done else None


# ---- dry run -----------------------------------------------------------------------------------


@dataclass
class RowCheck:
    """Every manifest row validated as a worker validates it (the plan's `inspect` hook), with
    what a worker finds besides: a duplicate id, per-row settings that are invalid together with
    the job's (a budget above the model's context among them), a voice-prompt clip that is not
    there; and each row's text normalised and planned as a worker plans it (`planner`; prompts
    estimated without the tokenizer, a voice prompt given as a clip counted without its codes)."""

    storage: Storage
    decoding: DecodingSettings
    planner: TextPlanner
    family: Family
    layout: SpeechLayout
    rows: int = 0
    errors: int = 0
    examples: list[dict] = field(default_factory=list)
    tokens: int = 0  # estimated speech codes of the rows to decode
    long: int = 0  # rows to decode whose text (or a chunk's) takes longer to say than their max_new_tokens allows
    split: int = 0  # rows whose text would be cut into chunks
    chunks: int = 0  # the chunks of those rows
    word_rows: int = 0  # split rows cut between words somewhere (a clause too long for the budget)
    word_cuts: int = 0  # the cuts between words
    uncuttable: int = 0  # long rows whose budget leaves no room for any piece of text: decoded whole
    _clips: dict = field(default_factory=dict)  # clip URI -> exists

    def error(self, source: str, ident: str | None, why: str) -> None:
        self.errors += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append({"source": source, "id": ident, "error": why})

    def why_not(self, uri: str, row: ManifestRow, first: str | None) -> str | None:
        """Why a valid row would still become an error record (None: it decodes)."""
        if first is not None:
            return f"duplicate id (first at {first})"
        try:
            own = self.decoding.with_overrides(row.overrides())
            check_max_new_tokens(own.max_new_tokens, self.family.context, self.family.name)
            self.family.check_voice(row.voice)  # what the family's prompter refuses of a row
            if row.prompt_codes is not None:
                self.family.check_voice_prompt(self.layout, row.prompt_text, row.prompt_codes)
        except ValueError as exc:  # pydantic's ValidationError is one
            return str(exc)
        if row.prompt_audio:
            clip = relative_to(uri, row.prompt_audio)
            if clip not in self._clips:
                self._clips[clip] = self.storage.exists(clip)
            if not self._clips[clip]:
                return f"prompt_audio: no clip at {clip}"
        return None

    def __call__(self, uri: str, raws: list, duplicates: dict[int, str]) -> None:
        for n, raw in enumerate(raws):
            self.rows += 1
            row = validate(raw, f"{uri}:{n + 1}")
            if isinstance(row, RowError):
                self.error(row.source, row.id, row.error)
            elif (why := self.why_not(uri, row, duplicates.get(n))) is not None:
                self.error(f"{uri}:{n + 1}", row.id, why)
            else:
                self.plan(row)

    def plan(self, row: ManifestRow) -> None:
        """Count what decoding the row would take: its text's (or its chunks') speech."""
        limit = row.max_new_tokens or self.decoding.max_new_tokens
        texts = [row.text]
        if row.text.strip():
            prepared = self.planner(row.text, limit, row.prompt_text, row.prompt_codes)
            texts = [chunk.text for chunk in prepared.plan.chunks]
            if prepared.split:
                self.split, self.chunks = self.split + 1, self.chunks + len(texts)
            words = prepared.plan.boundaries.count("word")
            self.word_rows, self.word_cuts = self.word_rows + (words > 0), self.word_cuts + words
        needed = [expected_tokens(text, None, self.planner.codes_per_second) for text in texts]
        self.tokens += sum(min(n, limit) for n in needed)
        long = any(n > limit for n in needed)
        self.long += long
        self.uncuttable += long and not self.planner.cuttable(limit)


def gate_cost(spec: JobSpec, tokens: int, codes_per_second: float) -> dict | None:
    """What the quality gate would cost a job whose rows take about `tokens` speech codes once
    (None without the gate): decodes per row (best_of: always that many; attempts: from one to
    that many), and so at most how many codes are decoded and how many hours of audio the
    verifiers hear."""
    q = spec.quality
    if not q.enabled:
        return None
    low, high = (q.best_of, q.best_of) if q.best_of > 1 else (1, q.attempts)
    return {"checks": q.checks, "asr": q.asr_model, "speaker": q.speaker_model, "decodes_per_row": [low, high],
            "estimated_tokens_max": tokens * high,
            "audio_hours_checked_max": round(tokens * high / codes_per_second / 3600, 4), "on_reject": q.on_reject}


def lease_holder(spec: JobSpec, storage: Storage, root: str) -> str | None:
    """Who holds the output's lease now, as a second driver would be told (None: nobody, or a
    holder that a run would take over: stale, or a process of this machine that is gone)."""
    holder = OutputLease(storage, root, spec.output.lease_stale_s).latest_readable()
    if holder is None or not holder.holds:
        return None
    return holder.describe(time.time())


def dry_run(spec: JobSpec, allow_numerics_change: bool = False, gpu: str | None = None) -> dict:
    """What `pcg-synth run` would do with `spec`, found without models, Ray or writing; with the
    projected sizing of its workers (on the GPU `gpu` names, else on cards of 24, 40 and 80 GB).

    Raises:
        ValueError: what would stop the job before any work (as `pcg-synth run` reports it), or
            a `gpu` the sizing does not know.
    """
    card = gpu_named(gpu) if gpu else None
    storage = Storage(spec.storage)
    layout = Layout(spec.output.uri)
    preflight(spec, storage, create=False)
    if spec.models.groups and needs_groups(spec):
        check_groups_file(spec, storage)
    spec, family, speech = with_family(spec, storage)
    rate = family.codes_per_second
    planner = TextPlanner(spec.text, None, family.context, rate)
    check = RowCheck(storage, spec.decoding, planner, family, speech)
    report: dict = {"job": spec.name, "kind": spec.kind, "output": spec.output.uri,
                    "family": {"name": family.name, "title": family.title, "given": spec.models.family,
                               "sample_rate": family.sample_rate, "codes_per_second": round(rate, 4)}}
    if spec.kind == "augment":
        from engine.runtime.augment import expanded

        expansion, data = expanded(spec, storage, layout.root)
        planned = spec.model_copy(update={"input": InputSpec(manifests=[expansion.uri])})
        plan = plan_of(planned, [expansion.uri], [(expansion.uri, data)], check)
        report["augment"] = expansion.to_dict()
    else:
        plan = make_plan(spec, storage, check)
    resources = spec.resources
    report.update({
        "manifests": plan.manifests if spec.kind != "augment" else spec.input.manifests,
        "rows": plan.rows, "rows_ok": plan.rows - check.errors, "rows_failing": check.errors,
        "failing_examples": check.examples, "warnings": plan.warnings(),
        "shards": len(plan.shards), "rows_per_shard": resources.rows_per_shard,
        "workers": resources.workers, "batch_size": resources.batch_size,
        "estimated_tokens": check.tokens, "rows_too_long": check.long,
        "text": {"split": spec.text.split, "rows_split": check.split, "chunks": check.chunks,
                 "rows_split_at_words": check.word_rows, "word_cuts": check.word_cuts,
                 "rows_uncuttable": check.uncuttable, "least_cuttable": planner.least_cuttable(),
                 "normalize": spec.text.normalize, "output_format": spec.output.format},
        "estimated_audio_hours": round(check.tokens / rate / 3600, 4),
        "quality": gate_cost(spec, check.tokens, rate), "fingerprint": plan.fingerprint})
    if spec.kind != "sweep":  # a sweep's workers and batches come from its grid
        report["sizing"], said = dry_run_sizing(spec, storage, family, card, report["estimated_audio_hours"])
        report["warnings"] += said
    if spec.kind == "sweep":
        del report["fingerprint"]  # the base spec's plan: no point runs it
        runs = schedule(points(spec), spec.sweep.repetitions)
        done = sum(storage.exists(join(run_uri(layout.root, p, rep), "summary.json")) for rep, p in runs)
        report["sweep"] = {"points": len(runs) // spec.sweep.repetitions, "repetitions": spec.sweep.repetitions,
                           "runs": len(runs), "runs_done": done}
        report["output_state"] = (f"{done} of {counted(len(runs), 'run')} done (kept; a run of the sweep "
                                  "does the others)" if done else "new: no run of this sweep is there yet")
        return report
    earlier, changes = recorded_job(spec, plan, storage, layout, numerics.expected(spec), allow_numerics_change)
    if earlier is None:
        report["output_state"] = "new: nothing of this job is there yet"
    else:
        done = committed_shards(plan, storage, layout)
        report["committed_shards"] = len(done)
        report["output_state"] = (
            "finished: every shard is committed; a run prints the summary of the run that finished it"
            if finished_summary(storage, layout, plan) is not None else
            f"a resume: {len(done)} of {counted(len(plan.shards), 'shard')} committed, those are kept")
        if changes:
            report["output_state"] += f"; numerics changes allowed: {'; '.join(changes)}"
    report["output_in_use"] = lease_holder(spec, storage, layout.root)
    if report["output_in_use"]:
        report["output_state"] += (f"; in use now by {report['output_in_use']}: a run would refuse "
                                   "(or wait, with --wait)")
    return report


def duration(hours: float) -> str:
    """`42.0 minutes` below an hour, `3.5 hours` above."""
    return f"{hours * 60:.1f} minutes" if hours < 1 else f"{hours:.1f} hours"


def dry_run_text(report: dict) -> str:
    """The dry run's report as `pcg-synth run --dry-run` prints it."""
    fam = report["family"]
    found = "detected" if fam["given"] == "auto" else "as models.family says, checked"
    lines = [f"{report['job']} (dry run, kind {report['kind']}): nothing was decoded or written",
             f"  family     {fam['name']}: {fam['title']} ({found} from the target's tokenizer; "
             f"{fam['sample_rate'] / 1000:g} kHz audio, {fam['codes_per_second']:g} codes a second)",
             f"  output     {report['output']}: {report['output_state']}"]
    if aug := report.get("augment"):
        lines.append(f"  augment    {counted(aug['texts'], 'text')} x up to {aug['grid']} combinations -> "
                     f"{counted(aug['variants'], 'variant')} (cut: {aug['capped']} by max_variants_per_text, "
                     f"{aug['over_budget']} by max_audio_hours)")
    if sweep := report.get("sweep"):
        lines.append(f"  sweep      {counted(sweep['points'], 'point')} x {sweep['repetitions']} "
                     f"= {counted(sweep['runs'], 'run')}, each decoding the rows below "
                     "(workers and batch size from the grid)")
    lines += [f"  manifests  {', '.join(report['manifests'])}",
              f"  rows       {report['rows']}: {report['rows_ok']} to decode, {report['rows_failing']} "
              f"would become error records",
              f"  shards     {report['shards']} of up to {report['rows_per_shard']} rows"
              + (f", {counted(report['workers'], 'worker')} at batch {report['batch_size']}" if not sweep else ""),
              f"  speech     about {report['estimated_tokens']} codes, {duration(report['estimated_audio_hours'])} "
              "of audio (estimated from the texts' length, capped by max_new_tokens)"]
    if report.get("sizing"):
        lines += sizing_lines(report["sizing"])
    text = report["text"]
    if text["rows_split"]:
        lines.append(f"  split      {counted(text['rows_split'], 'row')} would be split into "
                     f"{counted(text['chunks'], 'chunk')} (text.split {text['split']}; estimated: prompts "
                     "counted without the tokenizer, a voice-prompt clip without its codes)")
    if text.get("rows_split_at_words"):
        lines.append(f"  words      {counted(text['rows_split_at_words'], 'row')} would be cut between words "
                     f"({counted(text['word_cuts'], 'word cut')}): a clause takes longer to say than max_new_tokens "
                     "allows, so chunks would end mid-phrase; raise decoding.max_new_tokens (or the row's own) or "
                     "punctuate the texts")
    if report["rows_too_long"]:
        said = (f"  length     {counted(report['rows_too_long'], 'row')} to decode take longer to say than "
                f"max_new_tokens allows (at {CHARS_PER_SECOND:g} characters a second, {fam['codes_per_second']:g} "
                "codes a second)")
        if text["split"] == "none":
            said += (": their audio would likely be cut at the limit; raise decoding.max_new_tokens (or the row's "
                     "own) or split the texts (text.split)")
        else:
            said += " and cannot be cut into chunks that do"
            if whole := text.get("rows_uncuttable", 0):
                kept = "decodes them whole" if text["split"] == "auto" else "cuts them at sentences only"
                said += (f"; {whole} of them because a max_new_tokens below {text['least_cuttable']} leaves no "
                         f"room for any text beside the two seconds of headroom, so text.split {text['split']} {kept}")
            said += ": their audio would likely be cut at the limit; raise decoding.max_new_tokens (or the row's own)"
        lines.append(said)
    if q := report.get("quality"):
        low, high = q["decodes_per_row"]
        times = f"{low} time{'s' * (low != 1)}" if low == high else f"{low} to {high} times"
        verifiers = ", ".join(f"{k} {q[k]}" for k in ("asr", "speaker") if q[k]) or "no verifier"
        lines.append(f"  quality    checks {', '.join(q['checks']) or 'none (scores recorded)'} ({verifiers}); "
                     f"each row decoded {times}: up to about {q['estimated_tokens_max']} codes, the verifiers "
                     f"over up to {duration(q['audio_hours_checked_max'])} of audio; rows that never pass "
                     + ("are dropped" if q["on_reject"] == "drop" else "go to rejects/"))
    for ex in report["failing_examples"]:
        lines.append(f"  error row  {ex['source']}: {ex['error']}")
    if report["rows_failing"] > len(report["failing_examples"]):
        lines.append(f"  ... and {report['rows_failing'] - len(report['failing_examples'])} more error rows")
    lines += [f"  warning    {w}" for w in report["warnings"]]
    return "\n".join(lines)

