"""The job summary (`summary.json`), its printed table and the progress bar's figures."""

from __future__ import annotations

from dataclasses import asdict
from textwrap import shorten

from engine.config import JobSpec
from engine.console import counted
from engine.records import FAILED_EXAMPLES
from engine.runtime.commits import CommitRecord, SplitCounts
from engine.runtime.plan import Plan


def acceptance(records: list[CommitRecord]) -> tuple[list[float], float]:
    """Per-position acceptance and mean accepted length over commit records."""
    width = max((len(r.reached) for r in records), default=0)
    reached, accepted = [0] * width, [0] * width
    for r in records:
        for i, (a, b) in enumerate(zip(r.reached, r.accepted)):
            reached[i] += a
            accepted[i] += b
    rounds = sum(r.rounds for r in records)
    mal = sum(r.emitted for r in records) / rounds if rounds else 0.0
    return [a / b if b else 0.0 for a, b in zip(accepted, reached)], mal


def progress_postfix(records: list[CommitRecord], elapsed: float) -> str:
    """Audio hours, tokens/s and acceptance so far in this run."""
    tokens = sum(r.generated_tokens for r in records)
    hours = sum(r.audio_seconds for r in records) / 3600
    per_pos, mal = acceptance(records)
    acc = f" acc={sum(per_pos) / len(per_pos):.2f}" if per_pos else ""
    return f"audio={hours:.3f}h tok/s={tokens / max(elapsed, 1e-9):.0f}{acc} mal={mal:.2f}"


# a worker's figures in the summary that add up its records' (seconds summed to ms, then counts)
WORKER_SECONDS = ("decode_s", "decode_cpu_s", "codec_s", "busy_s", "io_wait_s", "finalise_s", "overlap_s")
WORKER_COUNTS = ("decode_rounds", "slot_rounds", "decode_waits", "decode_preempted")


def per_worker(records: list[CommitRecord]) -> dict:
    """Each worker's figures over its records (the summary's `workers`), by worker."""
    out: dict[str, dict] = {}
    for r in records:
        c = r.pipeline.counters
        w = out.setdefault(r.worker, {"shards": 0, "rows": 0, "generated_tokens": 0, "audio_seconds": 0.0,
                                      **dict.fromkeys(WORKER_SECONDS, 0.0), **dict.fromkeys(WORKER_COUNTS, 0),
                                      "slots": 0, "decoders": 0})
        w["shards"] += 1
        w["rows"] += r.rows
        w["generated_tokens"] += r.generated_tokens
        w["audio_seconds"] = round(w["audio_seconds"] + r.audio_seconds, 3)
        seconds = (c.decode_s, c.decode_cpu_s, r.codec_s, c.busy_s, c.io_wait_s, c.finalise_s, c.overlap_s)
        for k, v in zip(WORKER_SECONDS, seconds):
            w[k] = round(w[k] + v, 3)
        for k, v in zip(WORKER_COUNTS, (c.decode_rounds, c.slot_rounds, c.decode_waits, c.decode_preempted)):
            w[k] += v
        w["slots"] += c.slots
        w["decoders"] = max(w["decoders"], r.pipeline.decoders)
        w.update(node=r.node, gpu_ids=r.gpu_ids, device=r.device, host=r.host, torch_threads=r.torch_threads,
                 omp_wait_policy=r.omp_wait_policy, malloc=r.malloc, rounds=r.round_stats)
    for w in out.values():
        w["tokens_per_s"] = round(w["generated_tokens"] / w["decode_s"], 2) if w["decode_s"] else None
        # how full the batch was while decoding (continuous batching keeps it near 1)
        w["slot_utilisation"] = round(w.pop("slot_rounds") / w.pop("slots"), 4) if w["slots"] else None
        w["overlap"] = round(w["overlap_s"] / w["finalise_s"], 4) if w["finalise_s"] else None
        # the decode thread's CPU time over its time in rounds: short of 1 when it waited for
        # the GIL or the device, or lost its core to other work (decode_waits, decode_preempted)
        w["decode_cpu_share"] = round(w["decode_cpu_s"] / w["decode_s"], 4) if w["decode_s"] else None
    return out


def utilisation(records: list[CommitRecord], synth_s: float, workers: int, window: int | None = None) -> dict:
    """How busy the workers were: time holding shards over the synthesis phase (model loading
    and idle waits are the rest); batch slots filled per decode round; how long decoding waited
    for the writer (`io_wait_s`, ~0 when writing keeps up) and the share of writing time that
    ran while decoding went on (`overlap`); where the empty slots were (`empty_slots`)."""
    counters = [r.pipeline.counters for r in records]
    busy = sum(c.busy_s for c in counters)
    slots = sum(c.slots for c in counters)
    filled = sum(c.slot_rounds for c in counters)
    finalise = sum(c.finalise_s for c in counters)
    return {"worker_busy_fraction": round(busy / (synth_s * workers), 4) if records else None,
            "slot_utilisation": round(filled / slots, 4) if slots else None,
            "empty_slots": empty_slots(records, slots, filled),
            "io_wait_s": round(sum(c.io_wait_s for c in counters), 4) if records else None,
            "overlap": round(sum(c.overlap_s for c in counters) / finalise, 4) if finalise else None,
            "finalise_s": round(finalise, 4) if records else None,
            "shard_window": window}


def empty_slots(records: list[CommitRecord], slots: int, filled: int) -> dict | None:
    """The batch slots left empty, as shares of all slots, by cause: `waiting_for_shards` (a
    worker's queue ran dry and a later shard refilled it: a wider `shard_window` or smaller
    shards keep it fed), `other_decoders` (rows were queued, but for a decoder of other
    structural settings) and `end_of_work` (each worker's last rows finishing with nothing left
    to admit: a fixed cost per worker, so its share falls as a job grows). None for records
    written before these figures existed."""
    if not slots or not all(r.pipeline.empty_slots_counted for r in records):
        return None
    starved = sum(r.pipeline.counters.starved_slots for r in records)
    split = sum(r.pipeline.counters.split_slots for r in records)
    return {"waiting_for_shards": round(starved / slots, 4), "other_decoders": round(split / slots, 4),
            "end_of_work": round((slots - filled - starved - split) / slots, 4)}


def steady(records: list[CommitRecord], report) -> dict:
    """Throughput from the first shard handed out to the last committed (model loading and
    start-up excluded): what a sweep compares across points."""
    seconds = report.steady_s if report else None
    if not seconds:
        return {"wall_s": None, "tokens_per_s": None, "audio_s_per_s": None}
    return {"wall_s": round(seconds, 3),
            "tokens_per_s": round(sum(r.generated_tokens for r in records) / seconds, 2),
            "audio_s_per_s": round(sum(r.audio_seconds for r in records) / seconds, 3)}


def commit_span(records: list[CommitRecord]) -> float:
    """Seconds the workers spent on `records`' shards, from the records alone (a driver that
    finds every shard committed but no summary): the union of each shard's time in its worker
    (`committed_at - wall_s` to `committed_at`), gaps between runs left out; records without a
    commit time count their busiest worker's time."""
    if records and all(r.committed_at is not None for r in records):
        spans = sorted((r.committed_at - r.wall_s, r.committed_at) for r in records)
        total, end = 0.0, float("-inf")
        for start, stop in spans:
            total += max(0.0, stop - max(start, end))
            end = max(end, stop)
        return total
    busy: dict[str, float] = {}
    for r in records:
        busy[r.worker] = busy.get(r.worker, 0.0) + r.pipeline.counters.busy_s
    return max(busy.values(), default=0.0)


def gamma_decisions(records: list[CommitRecord]) -> list[dict]:
    """Distinct `gamma: auto` decisions of this run's workers (what was chosen and why)."""
    seen: dict[tuple, dict] = {}
    for r in records:
        for c in r.pipeline.gamma_choices:  # `GammaChoice.to_dict()`s
            key = (r.worker, c["batch_size"], c["gamma"])
            seen.setdefault(key, {"worker": r.worker, "batch_size": c["batch_size"], "gamma": c["gamma"],
                                  "acceptance": c["acceptance"], "reason": c["reason"]})
    return list(seen.values())


def storage_retries(records: list[CommitRecord]) -> int:
    """Storage calls this run's workers retried after transient failures (each record carries
    its worker's running count)."""
    last: dict[str, int] = {}
    for r in records:
        last[r.worker] = max(last.get(r.worker, 0), r.storage_retries)
    return sum(last.values())


def numerics_environments(records: list[CommitRecord]) -> list[dict]:
    """The distinct numerics environments the committed shards were decoded in, with their
    shard counts (more than one: codes are only reproducible per environment)."""
    seen: dict[str, dict] = {}
    for r in records:
        if r.numerics is None:
            continue
        key = repr(sorted(r.numerics.items()))
        seen.setdefault(key, {**r.numerics, "shards": 0})["shards"] += 1
    return list(seen.values())


def quality_counts(spec: JobSpec, all_records: list[CommitRecord], run_records: list[CommitRecord]) -> dict | None:
    """The quality gate's figures over every committed shard (None without the gate): rows
    checked, passed, rejected (and of those dropped), regenerated (decoded again after a failed
    attempt), attempts decoded, seconds spent checking (and per row checked), the seconds this
    run's decode loops waited for the verify thread, and the rejects files written."""
    if not spec.quality.enabled:
        return None
    gated = [r.quality for r in all_records if r.quality is not None]
    checked = sum(q.checked for q in gated)
    verify_s = sum(q.verify_s for q in gated)
    return {"checked": checked, "passed": sum(q.passed for q in gated), "rejected": sum(q.rejected for q in gated),
            "dropped": sum(q.dropped for q in gated), "regenerated": sum(q.regenerated for q in gated),
            "decodes": sum(q.decodes for q in gated), "verify_s": round(verify_s, 3),
            "verify_s_per_row": round(verify_s / checked, 4) if checked else None,
            "verify_wait_s": round(sum(r.pipeline.counters.verify_wait_s for r in run_records), 3),
            "checks": spec.quality.checks, "asr": spec.quality.asr_model, "speaker": spec.quality.speaker_model,
            "attempts": spec.quality.attempts, "best_of": spec.quality.best_of, "on_reject": spec.quality.on_reject,
            "rejects": [r.rejects for r in all_records if r.rejects]}


def split_of(r: CommitRecord) -> SplitCounts:
    """A record's split counts (zeros where no row was split)."""
    return r.split or SplitCounts()


def summarize(spec: JobSpec, plan: Plan, all_records: list[CommitRecord], run_records: list[CommitRecord], report,
              committed_before: int, wall_s: float, setup_s: float = 0.0) -> dict:
    """Totals over every committed shard; throughput and workers of this run only.

    Throughput is over the synthesis phase (`wall_s - setup_s`: workers loading models
    included, planning, group building and cluster start-up not)."""
    synth_s = max(wall_s - setup_s, 1e-9)
    per_pos, mal = acceptance(all_records)
    tokens = sum(r.generated_tokens for r in all_records)
    audio = sum(r.audio_seconds for r in all_records)
    run_tokens = sum(r.generated_tokens for r in run_records)
    run_audio = sum(r.audio_seconds for r in run_records)
    run_rows = sum(r.rows for r in run_records)
    failed = dict(report.failed) if report else {}
    return {
        "job": spec.name,
        "output": spec.output.uri,
        "fingerprint": plan.fingerprint,
        "method": spec.decoding.method,
        "decoding": spec.decoding.model_dump(),
        "rows": plan.rows,
        "rows_ok": sum(r.ok for r in all_records),
        "rows_failed": sum(r.failed for r in all_records),
        "rows_rejected": sum(r.rejected for r in all_records),  # by the quality gate
        # rows whose speech reached the token limit (max_new_tokens or the context): audio cut there
        "rows_cut": sum(r.cut for r in all_records),
        "rows_committed": sum(r.rows for r in all_records),
        # long texts cut into chunks (text.split), and the rows written where chunks are rows
        "rows_split": sum(split_of(r).split_rows for r in all_records),
        "chunks": sum(split_of(r).chunks for r in all_records),
        "chunk_rows": (sum(r.written_rows or 0 for r in all_records)  # split_output: rows
                       if any(r.written_rows is not None for r in all_records) else None),
        # split rows cut below clauses (a clause too long for its budget), and their word cuts
        "rows_split_at_words": sum(split_of(r).word_split_rows for r in all_records),
        "word_cuts": sum(split_of(r).word_cuts for r in all_records),
        # chunks decoded again after ending without a speech code (text.chunk_retries)
        "chunk_retries": sum(split_of(r).chunk_retries for r in all_records),
        "audio_seconds": round(audio, 3),
        "audio_hours": round(audio / 3600, 5),
        "generated_tokens": tokens,
        "target_calls": sum(r.rounds for r in all_records),
        "acceptance_per_position": [round(x, 4) for x in per_pos],
        "mean_accepted_length": round(mal, 4),
        "thinning_trials": sum(r.thinning_trials for r in all_records),
        "shards": {"total": len(plan.shards), "committed": len(all_records),
                   "committed_before": committed_before, "run_now": len(run_records),
                   "retries": report.retries if report else 0,
                   "workers_replaced": report.replaced if report else 0,
                   "workers_reused": report.reused if report else 0, "failed": len(failed),
                   "capacity_waits": list(report.capacity_waits) if report else []},
        "failed_shards": failed,
        "output_format": spec.output.format,
        # the first failed rows (id, error, shard) in shard order; every error record is in the output
        "failed_examples": [{**asdict(e), "shard": r.shard} for r in sorted(all_records, key=lambda r: r.shard)
                            for e in r.failed_rows][:FAILED_EXAMPLES],
        "wall_s": round(wall_s, 3),
        "setup_s": round(setup_s, 3),
        "throughput": {"tokens_per_s": round(run_tokens / synth_s, 2) if run_records else None,
                       "audio_s_per_s": round(run_audio / synth_s, 3) if run_records else None,
                       "rows_per_s": round(run_rows / synth_s, 3) if run_records else None},
        "workers": per_worker(run_records),
        "placements": dict(report.placements) if report else {},
        "utilisation": {**utilisation(run_records, synth_s, min(spec.resources.workers, len(run_records)),
                                      spec.shards_held), "admission": spec.resources.admission},
        "gamma_auto": gamma_decisions(run_records),
        "numerics": numerics_environments(all_records),
        "storage_retries": storage_retries(run_records),
        "steady": steady(run_records, report),
        # decode-loop profiles this run wrote (`profile.rounds`), one per worker process
        "profiles": [r.profile for r in run_records if r.profile],
        "quality": quality_counts(spec, all_records, run_records),
        "rounds": round_figures(run_records),
    }


def round_figures(records: list[CommitRecord]) -> dict | None:
    """How this run's workers ran their rounds (each record carries its worker's running figures,
    `RoundStats.to_dict()`; the last of each worker counts): the compile mode, rounds, graph
    launches, host and device milliseconds per round, graphs compiled, their seconds and how many
    the on-disk cache served."""
    last = {r.worker: r.round_stats for r in records if r.round_stats}
    if not last:
        return None
    total = {k: sum(w[k] for w in last.values())
             for k in ("rounds", "graph_launches", "host_s", "device_s", "compiles", "compile_s", "cache_hits")}
    rounds = max(total["rounds"], 1)
    failed = sorted({w["compile_failed"] for w in last.values() if w.get("compile_failed")})
    return {"modes": sorted({w["mode"] for w in last.values()}), **{k: round(v, 3) for k, v in total.items()},
            "compile_failed": failed,
            "host_ms_per_round": round(1e3 * total["host_s"] / rounds, 3),
            "device_ms_per_round": round(1e3 * total["device_s"] / rounds, 3) if total["device_s"] else None}


def summary_table(s: dict) -> str:
    acc = " ".join(f"{a:.2f}" for a in s["acceptance_per_position"]) or "-"
    sh = s["shards"]
    aug = s.get("augment")
    if aug and aug.get("methods"):  # an augment corpus mixes methods: say which, and how often
        method = ", ".join(f"{m} ({counted(n, 'variant')})" for m, n in aug["methods"].items())
        rows_line = (f"{s['rows_ok']} ok, {s['rows_failed']} failed, of {s['rows']}: "
                     f"{counted(aug['variants'], 'variant')} of {counted(aug['texts'], 'text')} + "
                     f"{counted(aug['bad_rows'], 'malformed manifest row')} "
                     f"({counted(aug['texts'] + aug['bad_rows'], 'manifest row')})")
    else:
        method, rows_line = s["method"], f"{s['rows_ok']} ok, {s['rows_failed']} failed, {s['rows']} in manifests"
    if s.get("rows_rejected"):
        rows_line += f"; {s['rows_rejected']} rejected by the quality gate"
    if s.get("rows_cut"):
        ratio = s["decoding"].get("max_speech_ratio")
        rows_line += (f"; {counted(s['rows_cut'], 'row')} reached the token limit before the end of speech "
                      f"(audio cut there; decoding.max_new_tokens is {s['decoding']['max_new_tokens']}"
                      + (f", decoding.max_speech_ratio {ratio}" if ratio else "") + ")")
    if s.get("rows_split"):
        rows_line += (f"; {counted(s['rows_split'], 'long text')} split into {counted(s['chunks'], 'chunk')}"
                      + (f" ({s['chunk_rows']} rows written)" if s.get("chunk_rows") is not None else ""))
    if s.get("chunk_retries"):
        rows_line += (f"; {counted(s['chunk_retries'], 'chunk retry', 'chunk retries')} (a chunk that ended "
                      "without speech decoded again, text.chunk_retries)")
    empty = s["utilisation"].get("empty_slots")
    rows = [
        ("job", f"{s['job']} -> {s['output']}" + (f" ({s['family']} model family)" if s.get("family") else "")),
        ("method", method),
        ("rows", rows_line),
        *([("failed rows", failed_rows_line(s))] if s.get("failed_examples") else []),
        ("shards", f"{sh['committed']}/{sh['total']} committed ({sh['committed_before']} before this run, "
                   f"{counted(sh['retries'], 'retry', 'retries')}, {sh['failed']} failed"
                   + (f", {sh['fenced']} refused: the output was taken over" if sh.get("fenced") else "") + ")"),
        ("audio", f"{s['audio_seconds']:.1f} s ({s['audio_hours']:.4f} h)"),
        ("tokens", f"{s['generated_tokens']} in {s['target_calls']} target calls"),
        ("acceptance", f"{acc} (mean accepted length {s['mean_accepted_length']:.2f})"),
        ("utilisation", f"workers busy {s['utilisation']['worker_busy_fraction']}, batch slots filled "
                        f"{s['utilisation']['slot_utilisation']}, decoding waited on IO "
                        f"{s['utilisation'].get('io_wait_s')} s, writing overlapped with decoding "
                        f"{s['utilisation'].get('overlap')}"),
        *([("empty slots", f"waiting for shards {empty['waiting_for_shards']}, other decoders "
                           f"{empty['other_decoders']}, end of work {empty['end_of_work']} (shares of all slots)")]
          if empty else []),
        ("throughput", f"{s['throughput']['tokens_per_s']} tok/s, {s['throughput']['audio_s_per_s']} "
                       + (f"audio s/s this run (wall {s['wall_s']:.1f} s, of which setup {s['setup_s']:.1f} s)"
                          if not s.get("figures_from") else
                          f"audio s/s over {s['wall_s']:.1f} s of decoding (from the commit records: no shard "
                          "ran in this run)")),
    ]
    if r := s.get("rounds"):
        device = f", device {r['device_ms_per_round']} ms" if r["device_ms_per_round"] else ""
        compiled = (f"; {counted(r['compiles'], 'graph')} compiled in {r['compile_s']} s "
                    f"({r['cache_hits']} from the compile cache)" if r["compiles"] else "")
        rows.append(("rounds", f"{'/'.join(r['modes'])}: {r['rounds']} rounds, host {r['host_ms_per_round']} ms"
                               f"{device} per round, {r['graph_launches']} graph launches{compiled}"))
        for reason in r.get("compile_failed", []):
            rows.append(("warning", f"rounds ran eagerly: a round's graph did not compile ({reason})"))
    if q := s.get("quality"):
        where = "dropped" if q["on_reject"] == "drop" else "in rejects/"
        rows.append(("quality", f"{q['passed']} passed, {q['rejected']} rejected ({where}), {q['regenerated']} "
                                f"regenerated; {q['decodes']} decodes for {counted(q['checked'], 'row')}; checking "
                                f"took {q['verify_s']} s ({q['verify_s_per_row']} s a row), decoding waited for it "
                                f"{q['verify_wait_s']} s"))
    for text in s.get("warnings", []):
        rows.append(("warning", text))
    if s.get("rows_split_at_words"):
        rows.append(("warning", words_warning(s["rows_split_at_words"], s["word_cuts"])))
    for w in sh.get("capacity_waits", []):
        rows.append(("capacity", f"waited {w['waited_s']} s for nodes: {w['outcome']}"))
    if s.get("numerics_change_allowed"):
        rows.append(("numerics", "resumed under another environment (allowed): "
                                 + "; ".join(s["numerics_change_allowed"])))
    if len(s.get("numerics", [])) > 1:
        rows.append(("numerics", f"{len(s['numerics'])} environments across the committed shards: codes "
                                 "are reproducible per environment only"))
    for d in s.get("gamma_auto", []):
        rows.append((f"gamma auto {d['worker']}", d["reason"]))
    for name, w in sorted(s["workers"].items()):
        rows.append((f"worker {name}", f"{counted(w['shards'], 'shard')}, {counted(w['rows'], 'row')}, "
                                       f"{w['tokens_per_s']} tok/s, "
                                       f"slots {w['slot_utilisation']}, io wait {w['io_wait_s']} s, "
                                       f"overlap {w['overlap']}, {w['device']} gpus={w['gpu_ids']}"))
    for uri in s.get("profiles", []):
        rows.append(("profile", uri))
    for name, where in sorted(s.get("placements", {}).items()):
        if name not in s["workers"]:  # e.g. it loaded after the others had taken every shard
            rows.append((f"worker {name}", "loaded, no shard committed (late to a small job, or its shards "
                                           "failed or went to a replacement), "
                                           f"{where['device']} gpus={where['gpu_ids']}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def words_warning(rows: int, cuts: int) -> str:
    """What a job's summary says once of its rows cut below clauses (the dry run says it beforehand)."""
    return (f"{counted(rows, 'long text')} cut between words ({counted(cuts, 'word cut')}): a clause takes "
            "longer to say than max_new_tokens allows, so chunks end mid-phrase; raise "
            "decoding.max_new_tokens (or the row's own) or punctuate the texts")


ERROR_WIDTH = 100  # characters of an error the summary table shows (summary.json keeps it whole)


def failed_rows_line(s: dict) -> str:
    """The summary's first failed rows, each `id: error` (cut to one line), and where all are."""
    examples = s["failed_examples"]
    named = "; ".join(f"{e['id']}: {shorten(e['error'], ERROR_WIDTH, placeholder=' ...')}" for e in examples)
    more = s["rows_failed"] - len(examples)
    where = ("`errors/*.jsonl`" if s.get("output_format") != "hf-parquet"
             else "the `error` column of `data/*.parquet`")
    return named + (f"; and {more} more" if more > 0 else "") + f" (every error record: {where})"


# ---- the line a job that did not end well ends with --------------------------------------------


def kept(summary: dict) -> str:
    sh = summary["shards"]
    return f"{sh['committed']} of {counted(sh['total'], 'shard')} committed (kept)"


def then_rerun(rerun: str | None, what: str = "") -> str:
    return f"rerun{what}: {rerun}" if rerun else f"rerun the job{what}"


def failure_line(summary: dict, stopped: str | None, remedy: str | None, unwritten: Exception | None,
                 rerun: str | None) -> str | None:
    """One line for a job that did not end well (None: it did): what failed (naming the path and
    the cause), what was kept, whether summary.json was written, and the command that resumes
    it (`rerun`; None: "rerun the job").

    Args:
        stopped: why the job stopped before its end (a write that failed for a lasting reason).
        remedy: what to do about it (`WriteFailed.remedy`).
        unwritten: why summary.json could not be written (then it was printed), or None.
    """
    sh = summary["shards"]
    note = f"; summary.json not written ({unwritten}): printed above" if unwritten else ""
    if stopped:
        return (f"{stopped}; the job stopped with {kept(summary)}{note}; {remedy or 'fix that'}, "
                f"then {then_rerun(rerun)}")
    if sh["failed"]:
        failed = ", ".join(f"{k}: {v}" for k, v in list(summary["failed_shards"].items())[:3])
        return (f"{counted(sh['failed'], 'shard')} failed ({failed}); {kept(summary)}{note}; "
                f"{then_rerun(rerun, ' to retry them')}")
    if unwritten:
        return (f"{unwritten}; every shard is committed, summary.json is not (printed above); "
                f"{getattr(unwritten, 'remedy', None) or 'fix that'}, then {then_rerun(rerun, ' to write it')}")
    return None


def lease_lost_line(summary: dict, lost: str, rerun: str | None) -> str:
    """The line of a driver that lost its output's lease (another driver took it over, or it could
    not renew it): it stopped so that two drivers never write one output at once."""
    fenced = summary["shards"].get("fenced", 0)
    refused = f"{counted(fenced, 'shard')} of its workers refused after the takeover; " if fenced else ""
    return (f"{lost}; {refused}stopped with {kept(summary)} by this driver so that two drivers never write "
            "one output at once; "
            f"{then_rerun(rerun, ' to resume (it waits for or refuses a driver still running)')}")
