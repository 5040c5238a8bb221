"""`pcg-synth eval`: per-row quality metrics of a produced audio dataset, and their summary.

Per row: the ASR hypothesis, WER/CER against the row's input text, speaker similarity to the
row's voice prompt, optionally DNSMOS. Summary per method: corpus WER/CER (percent), mean
per-utterance rates, similarity mean and std, DNSMOS means, backends used.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from tqdm.auto import tqdm

from engine.console import bar_disabled
from engine.metrics.asr import Recognizer
from engine.metrics.references import PromptClips, decode_audio
from engine.metrics.speaker import SpeakerEncoder, cosine
from engine.metrics.text import EditCounts, corpus_rates, edit_counts


@dataclass
class Backends:
    """What eval runs; None skips that metric."""

    asr: Recognizer | None = None
    speaker: SpeakerEncoder | None = None
    dnsmos: object | None = None
    prompts: PromptClips | None = None
    notes: list[str] = field(default_factory=list)

    def describe(self) -> dict:
        return {"asr": getattr(self.asr, "name", None), "speaker": getattr(self.speaker, "name", None),
                "dnsmos": getattr(self.dnsmos, "name", None)}


def base_row(row: dict) -> dict:
    settings = json.loads(row["settings"]) if row.get("settings") else {}
    return {"id": row["id"], "text": row.get("text"), "method": row.get("method"),
            "seed": row.get("seed"), "theta": settings.get("theta"), "gamma": settings.get("gamma"),
            "prompt_id": row.get("prompt_id"), "duration": row.get("duration"),
            "finish_reason": row.get("finish_reason"), "error": row.get("error")}


def score_row(row: dict, wave: np.ndarray, hyp: str | None, backends: Backends) -> dict:
    """Metric columns of one row with audio."""
    out: dict = {}
    if hyp is not None:
        counts = edit_counts(row.get("text") or "", hyp)
        out.update(hypothesis=hyp, wer=100 * counts.wer, cer=100 * counts.cer,
                   word_errors=counts.word_errors, ref_words=counts.ref_words,
                   char_errors=counts.char_errors, ref_chars=counts.ref_chars)
    if backends.speaker is not None and backends.prompts is not None:
        ref = backends.prompts.wave(row["id"], row.get("prompt_id"))
        if ref is not None:
            ref_wave, kind = ref
            out.update(similarity=cosine(backends.speaker.embed(wave), backends.speaker.embed(ref_wave)),
                       similarity_reference=kind)
    if backends.dnsmos is not None:
        out.update(backends.dnsmos.score(wave))
    return out


def evaluate_table(table: pa.Table, backends: Backends, batch: int = 16, progress: bool = True) -> list[dict]:
    """Per-row metrics (rows without audio keep their error and no metrics)."""
    rows = table.drop_columns([c for c in ("codes", "stats") if c in table.column_names]).to_pylist()
    out = []
    bar = tqdm(total=len(rows), desc="eval", unit="clip", disable=bar_disabled(progress))
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        waves = [decode_audio(r.get("audio")) for r in chunk]
        voiced = [w for w in waves if w is not None]
        hyps = iter(backends.asr.transcribe(voiced)) if backends.asr is not None and voiced else iter(())
        for row, wave in zip(chunk, waves):
            record = base_row(row)
            if wave is not None:
                hyp = next(hyps, None) if backends.asr is not None else None
                record.update(score_row(row, wave, hyp, backends))
            elif not record["error"]:
                record["error"] = "no audio"
            out.append(record)
        bar.update(len(chunk))
    bar.close()
    return out


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarize(rows: list[dict], backends: Backends) -> dict:
    """Summary per method (and over all rows when there are several methods)."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r.get("method") or "?", []).append(r)
    if len(groups) > 1:
        groups["all"] = rows
    per_method = {}
    for name, group in groups.items():
        scored = [r for r in group if "wer" in r]
        counts = [EditCounts(r["word_errors"], r["ref_words"], r["char_errors"], r["ref_chars"]) for r in scored]
        sims = [r["similarity"] for r in group if r.get("similarity") is not None]
        sim_mean, sim_std = _mean_std(sims)
        entry = {"rows": len(group), "with_audio": sum(1 for r in group if not r.get("error")),
                 # speech that reached the token limit: the words after it are missing (WER deletions)
                 "cut": sum(1 for r in group if r.get("finish_reason") == "length"),
                 **corpus_rates(counts), "similarity": sim_mean, "similarity_std": sim_std,
                 "similarity_rows": len(sims)}
        for key in ("dnsmos_ovrl", "dnsmos_sig", "dnsmos_bak", "dnsmos_p808"):
            vals = [r[key] for r in group if r.get(key) is not None]
            if vals:
                entry[key] = statistics.fmean(vals)
        per_method[name] = entry
    return {"backends": backends.describe(), "notes": backends.notes, "methods": per_method}


def summary_lines(summary: dict) -> str:
    """A readable table of the summary."""
    head = f"{'method':7s} {'rows':>5s} {'cut':>5s} {'WER %':>7s} {'CER %':>7s} {'SIM':>6s} {'DNSMOS':>6s}"
    lines = [head, "-" * len(head)]

    def fmt(x, spec):
        return format(x, spec) if x is not None else "-"
    for name, m in summary["methods"].items():
        lines.append(f"{name:7s} {m['rows']:5d} {m['cut']:5d} {fmt(m['wer'], '7.2f')} {fmt(m['cer'], '7.2f')} "
                     f"{fmt(m['similarity'], '6.3f')} {fmt(m.get('dnsmos_ovrl'), '6.2f')}")
    if any(m["cut"] for m in summary["methods"].values()):
        lines.append("cut: clips whose speech reached their token limit (max_new_tokens, or max_speech_ratio's "
                     "budget): their missing words count as deletions in WER and CER")
    b = summary["backends"]
    lines.append(f"ASR: {b['asr'] or '-'}; speaker: {b['speaker'] or '-'}; DNSMOS: {b['dnsmos'] or '-'}")
    lines.extend(summary["notes"])
    return "\n".join(lines)


def write_results(rows: list[dict], summary: dict, out: str, storage) -> str:
    """Per-row metrics as Parquet at `out` and the summary as JSON beside it; returns the
    summary's URI. Rows are aligned on the union of their columns (missing -> null)."""
    import io

    import pyarrow.parquet as pq

    columns: dict[str, None] = {}
    for r in rows:
        columns.update(dict.fromkeys(r))
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in rows]), buf)
    storage.write_bytes(out, buf.getvalue())
    summary_uri = (out.removesuffix(".parquet")) + ".summary.json"
    storage.write_bytes(summary_uri, (json.dumps(summary, indent=1) + "\n").encode())
    return summary_uri
