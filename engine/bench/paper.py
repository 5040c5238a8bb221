"""`pcg-synth paper-table`: the paper's protocol on the user's models and manifest.

Cross-sentence voice cloning over a manifest (LibriTTS test-clean in the paper), gamma 3,
temperature 0.8, several seeds; per seed every method decodes the same items (methods
interleaved, order rotated), its audio is written as a dataset and evaluated (WER, CER, speaker
similarity to the prompt clip, optionally DNSMOS). Speedup is tokens/s over `ar`'s in the same
seed. Table: mean +- std over seeds, as the paper's Table 1.
"""

from __future__ import annotations

import io
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.config import DecodingSettings, decoding_default
from engine.io.storage import Storage, relative_to
from engine.records import SynthesisItem

if TYPE_CHECKING:  # the protocol's settings import light (the CLI reads its defaults)
    from engine.api import Synthesizer
    from engine.codec.base import Codec
    from engine.metrics.quality import Backends

PAPER_ROWS = {  # docs/pcg.md section 10: Llasa-8B target, 3-layer draft, one H100, 500 utterances
    "exact": {"speedup": 0.98, "wer": 11.1, "cer": 5.5, "similarity": 43.7, "nmos": 4.38},
    "ssd": {"speedup": 1.4, "wer": 18.5, "cer": 11.6, "similarity": 42.5, "nmos": 3.78},
    "pcg": {"speedup": 1.4, "wer": 13.8, "cer": 7.8, "similarity": 43.7, "nmos": 4.09},
}
METRICS = ("speedup", "tokens_per_s", "mean_accepted_length", "wer", "cer", "similarity", "dnsmos_ovrl", "cut")


@dataclass
class PaperConfig:
    """The protocol's knobs (defaults: the paper's)."""

    methods: tuple[str, ...] = ("ar", "exact", "ssd", "pcg")  # the rows of the paper's Table 1
    gamma: int = decoding_default("gamma")
    theta: float = decoding_default("theta")
    beta: float = decoding_default("beta")
    temperature: float = decoding_default("temperature")
    seeds: tuple[int, ...] = (0, 1, 2)
    batch_size: int = 1
    max_new_tokens: int = decoding_default("max_new_tokens")
    limit: int | None = None

    def settings(self, method: str, seed: int) -> DecodingSettings:
        return DecodingSettings(method=method, gamma=self.gamma, theta=self.theta, beta=self.beta,
                                temperature=self.temperature, seed=seed, max_new_tokens=self.max_new_tokens)


def manifest_items(uri: str, codec, limit: int | None = None, storage: Storage | None = None
                   ) -> tuple[list[SynthesisItem], list]:
    """Items (voice prompts encoded once, cached by content) and their prompts, in manifest order.

    Raises:
        ValueError: a row is malformed (the protocol needs every row).
    """
    from engine.codec.audio import read_clip
    from engine.codec.prompts import PromptCache, load_voice_prompt
    from engine.io.manifest import RowError, parse_rows, validated

    storage = storage or Storage()
    rows = validated(parse_rows(uri, storage.read_bytes(uri)), uri, 0)[:limit]
    cache, items, prompts = PromptCache(), [], []
    for row in rows:
        if isinstance(row, RowError):
            raise ValueError(f"{row.source}: {row.error}")
        prompt = None
        if row.prompt_audio:
            wave = read_clip(io.BytesIO(storage.read_bytes(relative_to(uri, row.prompt_audio))), codec.sample_rate)
            prompt = load_voice_prompt(row.prompt_text or "", codes=cache.encode(codec, wave), id=row.prompt_id)
        elif row.prompt_codes:
            prompt = load_voice_prompt(row.prompt_text or "", codes=row.prompt_codes, id=row.prompt_id)
        items.append(SynthesisItem(text=row.text, id=row.id, prompt_text=prompt.text if prompt else None,
                                   prompt_codes=list(prompt.codes) if prompt else None))
        prompts.append(prompt)
    return items, prompts


HEADS = " heads"  # a table row's name suffix: the method drafted by stream heads, not the draft model


def arms(synth: Synthesizer, heads: Synthesizer | None, methods: tuple[str, ...]
         ) -> list[tuple[str, str, Synthesizer]]:
    """The table's rows as (name, method, synthesizer): every method with the draft model, then
    the speculative ones again with stream heads (`heads`, when given) under `<method> heads`."""
    out = [(m, m, synth) for m in methods]
    if heads is not None:
        out += [(m + HEADS, m, heads) for m in methods if m != "ar"]
    return out


@dataclass(frozen=True)
class PaperRun:
    """What every seed of one protocol run shares.

    Attributes:
        codec: the loaded codec that turns each row's codes into audio.
        cfg: the protocol's settings.
        out: the output directory (`datasets/` holds each row's audio per seed).
        backends: the quality backends (ASR, speaker, DNSMOS).
        progress: progress bars.
    """

    codec: Codec
    cfg: PaperConfig
    out: Path
    backends: Backends
    progress: bool = True


def run_seed(rows: list[tuple[str, str, Synthesizer]], items, prompts, run: PaperRun, seed: int) -> dict[str, dict]:
    """Every row (`arms`) on every item for one seed: speed, audio dataset, quality summary."""
    from engine.codec.export import AudioOutput, export_audio
    from engine.metrics.quality import evaluate_table, summarize
    from engine.metrics.references import read_dataset

    codec, cfg, out, backends, progress = run.codec, run.cfg, run.out, run.backends, run.progress
    k = seed % len(rows)
    out_rows = {}
    for name, method, synth in rows[k:] + rows[:k]:
        settings = cfg.settings(method, seed)
        results, summary = synth.synthesize(items, settings, batch_size=cfg.batch_size, progress=progress)
        path = out / "datasets" / f"{name.replace(' ', '-')}.seed{seed}.parquet"
        export_audio(results, settings, codec, AudioOutput(parquet_path=path), prompts=prompts)
        table = evaluate_table(read_dataset(str(path)), backends, progress=progress)
        quality = summarize(table, backends)["methods"].get(method, {})
        out_rows[name] = {"speed": summary.to_dict(), "quality": quality}
    return out_rows


def mean_std(values: list[float | None]) -> dict:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": statistics.fmean(vals), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            "n": len(vals)}


def table_rows(per_seed: dict[int, dict[str, dict]], names: list[str]) -> dict[str, dict]:
    """Mean +- std over seeds per row; speedup against `ar` of the same seed."""
    out = {}
    for method in names:
        values: dict[str, list] = {k: [] for k in METRICS}
        for runs in per_seed.values():
            run, ar = runs[method], runs.get("ar")
            tps = run["speed"]["tokens_per_s"]
            values["speedup"].append(tps / ar["speed"]["tokens_per_s"] if ar else None)
            values["tokens_per_s"].append(tps)
            values["mean_accepted_length"].append(run["speed"]["mean_accepted_length"])
            for key in ("wer", "cer", "similarity", "dnsmos_ovrl", "cut"):  # cut: rows at the token limit
                values[key].append(run["quality"].get(key))
        out[method] = {k: mean_std(v) for k, v in values.items()}
    return out


def run_protocol(synth: Synthesizer, manifest: str, run: PaperRun, models: dict, how: str,
                 heads: Synthesizer | None = None) -> dict:
    """The whole protocol; returns the table document (also the input of `render`). `heads`: a
    Synthesizer over the same target drafting with stream heads, whose speculative rows are
    measured in the same seeds beside the draft model's."""
    from engine.bench.machine import describe

    cfg, backends = run.cfg, run.backends
    items, prompts = manifest_items(manifest, run.codec, cfg.limit)
    if not items:
        raise ValueError(f"{manifest}: no rows")
    from engine.api import COMPARE_WARMUP_TOKENS

    rows = arms(synth, heads, cfg.methods)
    # every row warmed up first: the first one timed pays no more first-run costs than the rest
    for _, method, runner in rows:
        runner.warmup_each([cfg.settings(method, cfg.seeds[0])], cfg.batch_size)
    per_seed = {}
    for seed in cfg.seeds:
        per_seed[seed] = run_seed(rows, items, prompts, run, seed)
    return {"benchmark": "paper protocol (pcg-synth paper-table)", "how": how,
            "machine": describe(synth.device), "models": models, "manifest": manifest,
            "items": len(items), "settings": asdict(cfg), "warmup_tokens": COMPARE_WARMUP_TOKENS,
            "backends": backends.describe(),
            "rows": table_rows(per_seed, [name for name, _, _ in rows]),
            "per_seed": {str(k): v for k, v in per_seed.items()}, "paper": PAPER_ROWS}


def _pm(stat: dict, scale: float = 1.0, spec: str = ".1f", suffix: str = "") -> str:
    if stat["mean"] is None:
        return "-"
    return f"{format(stat['mean'] * scale, spec)}{suffix} +- {format(stat['std'] * scale, spec)}{suffix}"


def render(doc: dict) -> str:
    """The table as markdown, the paper's Table 1 beside it for reference."""
    s, m, mc = doc["settings"], doc["models"], doc["machine"]
    lines = [
        f"# Paper protocol: {m.get('preset') or m['target']}",
        "",
        f"- models: target {m['target']}, draft {m['draft']}, codec {m.get('codec')}, {m.get('dtype')}"
        + (f"; stream heads {m['streams']} (the rows named `heads` draft with them)" if m.get("streams") else ""),
        f"- machine: {mc.get('gpu') or mc['cpu']} ({mc['device']}), torch {mc['torch']}, {mc['date']}",
        f"- manifest: {doc['manifest']} ({doc['items']} utterances); gamma {s['gamma']}, temperature "
        f"{s['temperature']}, theta {s['theta']}, SSD beta {s['beta']}, batch size {s['batch_size']}, "
        f"up to {s['max_new_tokens']} tokens, seeds {', '.join(map(str, s['seeds']))}",
        f"- quality backends: ASR {doc['backends']['asr']}; speaker {doc['backends']['speaker']}; "
        f"DNSMOS {doc['backends']['dnsmos'] or '-'}",
        f"- command: `{doc['how']}`",
        "",
        "| method | speedup vs AR | WER % | CER % | SIM (x100) | DNSMOS | mean accepted length | rows cut |",
        "|---|---|---|---|---|---|---|---|",
    ]
    names = {"ar": "AR (target alone)", "exact": "exact SD", "ssd": f"SSD beta {s['beta']}",
             "pcg": f"PCG theta {s['theta']}", "topk": "top-k"}
    for method, row in doc["rows"].items():
        name = names.get(method.removesuffix(HEADS), method) + (" (stream heads)" if method.endswith(HEADS) else "")
        lines.append(f"| {name} | {_pm(row['speedup'], spec='.2f', suffix='x')} | "
                     f"{_pm(row['wer'])} | {_pm(row['cer'])} | {_pm(row['similarity'], 100)} | "
                     f"{_pm(row['dnsmos_ovrl'], spec='.2f')} | {_pm(row['mean_accepted_length'], spec='.2f')} | "
                     f"{_pm(row['cut'])} |")
    lines += ["", f"rows cut: of the {doc['items']} utterances per seed, those whose speech reached the "
              f"{s['max_new_tokens']}-token limit (their missing words count in WER and CER).",
              "", "The paper (Llasa-8B, 3-layer trained draft, one H100, 500 LibriTTS test-clean "
              "utterances, HuBERT-large CTC ASR, WavLM verifier; NMOS, not DNSMOS):", "",
              "| method | speedup vs AR | WER | CER | Sim-O | NMOS |", "|---|---|---|---|---|---|"]
    for method, row in doc["paper"].items():
        lines.append(f"| {names.get(method, method)} | {row['speedup']}x | {row['wer']} | {row['cer']} | "
                     f"{row['similarity']} | {row['nmos']} |")
    return "\n".join(lines) + "\n"
