"""Augmentation corpora: every manifest text crossed with voices, seeds, sampling settings and
methods, written once by the driver as a variants manifest that the normal pipeline shards.

Deterministic throughout (same spec and manifests, same variants file, byte for byte), so a
rerun resumes like any job. Variants are shuffled before sharding, so every shard mixes texts,
voices and methods and workers get even loads.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
from dataclasses import dataclass

from engine.config import AugmentSpec, JobSpec
from engine.decoding.admission import speech_seconds
from engine.io.manifest import ManifestRow, RowError, parse_rows, validate
from engine.io.storage import Storage, join, relative_to
from engine.records import item_seed
from engine.runtime.plan import manifest_files


@dataclass
class Expansion:
    """What the expansion produced (reported in the job summary)."""

    uri: str
    texts: int
    grid: int  # combinations per text before any cut
    variants: int
    capped: int  # cut by max_variants_per_text
    over_budget: int  # cut by max_audio_hours
    bad_rows: int  # malformed manifest rows, passed through once as error records
    estimated_hours: float
    methods: dict[str, int]  # variants per acceptance rule

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def rank(*parts) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def combinations(aug: AugmentSpec, spec: JobSpec) -> list[dict]:
    """The full grid, in a stable order (its index names a variant)."""
    temps = aug.temperatures or [spec.decoding.temperature]
    top_ps = aug.top_ps or [spec.decoding.top_p]
    methods = aug.methods or [spec.decoding.method]
    return [{"voice": v, "seed": s, "temperature": t, "top_p": p, "method": m, "index": i}
            for i, (v, s, t, p, m) in enumerate(itertools.product(aug.voices, aug.seeds, temps, top_ps, methods))]


def pick(grid: list[dict], text_id: str, k: int, sample_seed: int) -> list[dict]:
    """`k` combinations for one text, round-robin over voices (each voice's combinations in a
    seeded order), starting at a text-dependent voice so all voices are used evenly overall."""
    if k >= len(grid):
        return list(grid)
    voices: dict[str, list[dict]] = {}
    for combo in grid:
        voice = combo["voice"]
        key = f"voice:{voice}" if isinstance(voice, str) else voice.id if voice else ""
        voices.setdefault(key, []).append(combo)
    queues = [sorted(c, key=lambda x: rank(sample_seed, text_id, x["index"])) for c in voices.values()]
    start = int(rank(sample_seed, text_id)[:8], 16) % len(queues)
    queues = queues[start:] + queues[:start]
    chosen: list[dict] = []
    for round_ in itertools.count():
        for q in queues:
            if round_ < len(q) and len(chosen) < k:
                chosen.append(q[round_])
        if len(chosen) == k:
            return sorted(chosen, key=lambda x: x["index"])


def fit_budget(estimates: list[float], counts: list[int], budget_s: float) -> int:
    """Largest per-text variant count `k` with sum(min(k, n) * seconds) <= budget."""
    lo, hi = 0, max(counts, default=0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(mid, n) * e for n, e in zip(counts, estimates)) <= budget_s:
            lo = mid
        else:
            hi = mid - 1
    return lo


def variant_row(row: ManifestRow, combo: dict) -> dict:
    voice = combo["voice"]
    out = {"id": f"{row.id}~v{combo['index']}", "text": row.text, "text_id": row.id,
           "seed": item_seed(combo["seed"], row.id), "augment_seed": combo["seed"],
           "temperature": combo["temperature"], "top_p": combo["top_p"], "method": combo["method"]}
    if isinstance(voice, str):  # a named voice: the row's own prompt stays out
        out["voice"] = voice
    elif voice is not None:
        out.update(prompt_id=voice.id, prompt_text=voice.text)
        out.update(prompt_codes=voice.codes) if voice.codes is not None else out.update(prompt_audio=voice.audio)
    else:  # the row's own prompt, if it has one
        own = {"prompt_id": row.prompt_id, "prompt_text": row.prompt_text,
               "prompt_codes": row.prompt_codes, "prompt_audio": row.prompt_audio}
        out.update({k: v for k, v in own.items() if v is not None})
    return out


def variants_file(root: str) -> str:
    """Where an augment job keeps its expanded manifest: `<root>/_augment/variants.jsonl`."""
    return join(root, "_augment", "variants.jsonl")


def expand(spec: JobSpec, storage: Storage, root: str) -> Expansion:
    """Write `variants_file(root)` and say what it holds."""
    expansion, data = expanded(spec, storage, root)
    storage.write_bytes(expansion.uri, data)
    return expansion


def expanded(spec: JobSpec, storage: Storage, root: str) -> tuple[Expansion, bytes]:
    """The variants file for `root` (its bytes) and what it holds, written nowhere."""
    aug = spec.augment
    grid = combinations(aug, spec)
    cap = min(aug.max_variants_per_text or len(grid), len(grid))
    rows: list[ManifestRow] = []
    passthrough: list = []
    for uri in manifest_files(spec, storage):
        for n, raw in enumerate(parse_rows(uri, storage.read_bytes(uri)), 1):
            row = validate(raw, f"{uri}:{n}")
            if isinstance(row, RowError):
                passthrough.append(raw)
                continue
            if row.prompt_audio:  # the variants file lives elsewhere: make clip paths absolute
                row = row.model_copy(update={"prompt_audio": relative_to(uri, row.prompt_audio)})
            rows.append(row)
    seconds = [speech_seconds(r.text, aug.chars_per_second) for r in rows]
    per_text = cap
    if aug.max_audio_hours is not None:
        per_text = fit_budget(seconds, [cap] * len(rows), aug.max_audio_hours * 3600)
    variants = [variant_row(r, c) for r in rows for c in pick(grid, r.id, per_text, aug.sample_seed)]
    variants.sort(key=lambda v: rank(aug.sample_seed, v["id"]))
    lines = [json.dumps(v, sort_keys=True) for v in variants]
    lines += [json.dumps(r, sort_keys=True) if isinstance(r, dict) else str(r) if isinstance(r, str)
              else f"[{r.error}] {r.text}" for r in passthrough]  # a BadLine stays an error row
    expansion = Expansion(uri=variants_file(root), texts=len(rows), grid=len(grid), variants=len(variants),
                          capped=len(rows) * (len(grid) - cap), over_budget=len(rows) * (cap - per_text),
                          bad_rows=len(passthrough),
                          estimated_hours=round(sum(min(per_text, cap) * s for s in seconds) / 3600, 4),
                          methods=dict(sorted(collections.Counter(v["method"] for v in variants).items())))
    return expansion, ("\n".join(lines) + "\n").encode()
