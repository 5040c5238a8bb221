"""Stream heads against a draft model: tokens/s of `ar`, and of speculation with each drafter,
side by side in one process.

The target is loaded once; a draft model (`--draft`) and a set of stream heads (`--streams`) are
loaded onto it, and every setting gets a Synthesizer of its own over those shared models (so each
keeps its decoder, and its caches, from one repetition to the next). For each batch size every
repetition runs every setting once over the same texts and seed, in an order rotated per
repetition, after an untimed warm-up of every setting; a setting's speedup is its tokens/s over
`ar`'s in the same repetition, and the headline, the best `pcg` setting with the heads over the
best with the draft model, is also a ratio within each repetition (medians over repetitions).
Gammas above the heads' count are skipped for the heads.

    python benchmarks/bench_drafters.py --kit kit --batch-sizes 1,2,4,8 --gammas 2,3,4 --reps 3 \\
        --out benchmarks/results/drafters_cpu_tiny
    bash benchmarks/llasa_1b_shape.sh   # its last stage: the distilled draft against distilled heads
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import ROOT, describe, how_line, write_result_pair  # noqa: E402

DTYPE_SHORT = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}  # as llasa_1b_shape.sh names results
WARMUP_TOKENS = 8


@dataclass(frozen=True)
class Setting:
    """One operating point: a rule, the drafter it runs with and its gamma (`ar`: neither)."""

    method: str
    drafter: str | None = None  # "model" or "streams"
    gamma: int | str = 0

    @property
    def label(self) -> str:
        if self.method == "ar":
            return "ar"
        return f"{self.method} {'heads' if self.drafter == 'streams' else 'draft'} " + (
            "auto" if self.gamma == "auto" else f"g{self.gamma}")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--kit", help="a tiny kit: DIR/target, DIR/draft and DIR/streams where not given below")
    ap.add_argument("--target", help="the target checkpoint directory")
    ap.add_argument("--draft", help="a draft model directory (e.g. `pcg-synth draft train`'s output)")
    ap.add_argument("--streams", help="a stream heads directory (`pcg-synth draft train --kind streams`)")
    ap.add_argument("--batch-sizes", default="1,2,4,8", help="comma-separated batch sizes")
    ap.add_argument("--methods", default="ar,pcg",
                    help="comma-separated: ar (always measured, the baseline), pcg, exact")
    ap.add_argument("--gammas", default="2,3,4",
                    help="comma-separated draft lengths (or auto) for each drafter; the heads skip those above "
                         "their count")
    ap.add_argument("--theta", type=float, default=0.4, help="pcg's group threshold")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--items-per-slot", type=int, default=2,
                    help="texts per run = this x the batch size (continuous batching refills slots)")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions of every setting, interleaved")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    ap.add_argument("--compile", default="auto", help="decode rounds: auto | none | inductor | cudagraphs")
    ap.add_argument("--draft-weights", default="native", help="the draft model's weights: native | int8")
    ap.add_argument("--max-context", type=int, help="the decoders' longest sequence (default: the family's)")
    ap.add_argument("--threads", type=int, default=0, help="torch's CPU threads (0: torch's default)")
    ap.add_argument("--out", help="result stem: writes STEM.json and STEM.md "
                                  "(default benchmarks/results/drafters_<device>_<dtype>)")
    ap.add_argument("--note", default="", help="a sentence for the result's notes (what else the machine ran)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    args = ap.parse_args()
    kit = Path(args.kit) if args.kit else None
    for name in ("target", "draft", "streams"):
        if getattr(args, name) is None:
            if kit is None:
                ap.error(f"--{name} DIR is needed (or --kit DIR)")
            setattr(args, name, str(kit / name))
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if set(methods) - {"ar", "pcg", "exact"}:
        ap.error(f"--methods: choose among ar, pcg, exact; got {args.methods}")
    args.methods = [m for m in ("pcg", "exact") if m in methods]  # the speculative ones, headline first
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    args.gammas = [g if g == "auto" else int(g) for g in (x.strip() for x in args.gammas.split(",")) if g]
    if args.reps < 1 or min(args.batch_sizes) < 1 or args.items_per_slot < 1:
        ap.error("--reps, --batch-sizes and --items-per-slot must be >= 1")
    return args


def load(args) -> tuple[dict, dict]:
    """The target loaded once, a draft model and stream heads on it: ({drafter kind: (draft, heads)},
    a description of the models)."""
    import torch

    from engine.models.device import resolve_compile, resolve_device, resolve_dtype
    from engine.models.loading import check_weights, load_model
    from engine.models.streams import is_streams_dir, load_streams

    if is_streams_dir(args.draft) or not is_streams_dir(args.streams):
        raise SystemExit(f"--draft {args.draft} must be a draft model and --streams {args.streams} stream heads "
                         "(a directory holding pcg_streams.json)")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    check_weights(args.draft_weights, args.compile)
    # one compile mode for every setting (int8 draft weights make it eager for the heads too)
    compile = resolve_compile(args.compile, device, args.draft_weights)
    target = load_model(args.target, device=device, dtype=dtype, compile=compile)
    draft = load_model(args.draft, device=device, dtype=dtype, compile=compile, weights=args.draft_weights,
                       tokenizer=target.tokenizer, family=target.family.name)
    heads = load_streams(args.streams, target.model)
    desc = {"target": args.target, "draft": args.draft, "streams": args.streams, "family": target.family.name,
            "device": str(device), "dtype": str(dtype).removeprefix("torch."), "compile": compile,
            "draft_weights": args.draft_weights, "heads": heads.heads,
            "streams_training": heads.info.get("trained", {})}  # how the heads were distilled
    return {"target": target, "model": draft, "streams": heads}, desc


def parameters(models: dict) -> dict:
    """Parameter counts: the target's, the draft model's (as loaded, and less the tables it shares
    with the target: the same tensors, one copy) and the heads', with their shares of the target's."""
    target, draft, heads = models["target"].model, models["model"].model, models["streams"]
    mine = {id(p) for p in target.parameters()}
    shared = sum(p.numel() for p in draft.parameters() if id(p) in mine)
    n_target, n_draft, n_heads = target.num_parameters(), draft.num_parameters(), heads.num_parameters()
    return {"target": n_target, "draft": n_draft, "draft_own": n_draft - shared, "heads": n_heads,
            "draft_share_of_target": round(n_draft / n_target, 5),
            "draft_own_share_of_target": round((n_draft - shared) / n_target, 5),
            "heads_share_of_target": round(n_heads / n_target, 5)}


def grid(args, heads: int) -> list[Setting]:
    out = [Setting("ar")]
    for method in args.methods:
        for drafter in ("model", "streams"):
            out += [Setting(method, drafter, g) for g in args.gammas
                    if drafter == "model" or g == "auto" or g <= heads]
    return out


def synthesizers(models: dict, settings: list[Setting], max_context: int | None) -> dict:
    """A Synthesizer per setting over the shared models; each keeps its own decoder."""
    from engine import Synthesizer

    out = {}
    for s in settings:
        draft = models["model"] if s.drafter == "model" else None
        streams = models["streams"] if s.drafter == "streams" else None
        synth = Synthesizer(models["target"], draft, max_context=max_context, streams=streams)
        synth.runner.fallback = True  # as `compile: auto` loads: a graph that fails runs eagerly, warned
        out[s.label] = synth
    return out


def decoding(s: Setting, args, seed: int, max_new: int):
    from engine import DecodingSettings

    fields = {"method": s.method, "temperature": args.temperature, "max_new_tokens": max_new, "seed": seed}
    if s.method != "ar":
        fields["gamma"] = s.gamma
    if s.method == "pcg":
        fields["theta"] = args.theta
    return DecodingSettings(**fields)


def measure(synths: dict, settings: list[Setting], batch: int, args, say) -> dict[str, list]:
    """RunSummaries per setting: every setting warmed up (untimed), then `reps` rounds of every
    setting, the order rotated per repetition."""
    from engine.draft.evaluate import HELDOUT_TEXTS
    from engine.records import SynthesisItem

    items = [SynthesisItem(text=HELDOUT_TEXTS[i % len(HELDOUT_TEXTS)], id=f"u{i}")
             for i in range(args.items_per_slot * batch)]
    for s in settings:
        synths[s.label].synthesize(items[:batch], decoding(s, args, 0, WARMUP_TOKENS), batch_size=batch)
    runs: dict[str, list] = {s.label: [] for s in settings}
    for rep in range(args.reps):
        k = rep % len(settings)
        for s in settings[k:] + settings[:k]:
            _, summary = synths[s.label].synthesize(items, decoding(s, args, rep, args.max_new_tokens),
                                                    batch_size=batch)
            runs[s.label].append(summary)
            say(f"batch {batch} rep {rep + 1}/{args.reps} {s.label}: {summary.tokens_per_s:.1f} tokens/s")
    return runs


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def figures(settings: list[Setting], runs: dict[str, list]) -> dict:
    """Per setting: tokens/s, speedup over `ar` in the same repetition, and acceptance over all
    repetitions (accepted length = tokens per target call, bonus included)."""
    base = runs["ar"]
    out = {}
    for s in settings:
        rows = runs[s.label]
        reached = [sum(x) for x in zip(*(r.stats.reached for r in rows))]
        accepted = [sum(x) for x in zip(*(r.stats.accepted for r in rows))]
        rounds = sum(r.stats.rounds for r in rows)
        out[s.label] = {
            "method": s.method, "drafter": s.drafter, "gamma": s.gamma,
            "tokens_per_s": spread([r.tokens_per_s for r in rows]),
            "speedup_vs_ar": spread([r.tokens_per_s / a.tokens_per_s for r, a in zip(rows, base)]),
            "mean_accepted_length": sum(r.stats.emitted for r in rows) / rounds if rounds else 0.0,
            "acceptance_per_position": [a / n if n else 0.0 for a, n in zip(accepted, reached)],
            "generated_tokens_per_rep": statistics.fmean(r.stats.generated_tokens for r in rows),
        }
        chosen = [r.gamma_choice["gamma"] for r in rows if r.gamma_choice]
        if chosen:  # gamma auto (0: speculation switched off, the rows decoded with `ar`)
            out[s.label]["chosen_gamma"] = statistics.mode(chosen)
    return out


def headline(settings: list[Setting], runs: dict[str, list], found: dict, batch: int) -> dict:
    """The row of the headline table: `ar`, each drafter's best setting of the first speculative
    method (by median tokens/s), and their ratio, heads over draft, within each repetition. A
    `gamma: auto` setting that switched speculation off decoded with `ar`: it is no drafter's."""
    row = {"batch": batch, "ar_tokens_per_s": found["ar"]["tokens_per_s"]["median"]}
    method = next((s.method for s in settings if s.method != "ar"), None)
    best = {}
    for drafter in ("model", "streams"):
        mine = [s.label for s in settings if s.method == method and s.drafter == drafter
                and found[s.label].get("chosen_gamma") != 0]
        if mine:
            best[drafter] = max(mine, key=lambda label: found[label]["tokens_per_s"]["median"])
            f = found[best[drafter]]
            row["draft" if drafter == "model" else "heads"] = {
                "setting": best[drafter], "tokens_per_s": f["tokens_per_s"]["median"],
                "speedup_vs_ar": f["speedup_vs_ar"]["median"], "mean_accepted_length": f["mean_accepted_length"]}
    if len(best) == 2:
        pairs = zip(runs[best["streams"]], runs[best["model"]])
        row["heads_over_draft"] = spread([h.tokens_per_s / d.tokens_per_s for h, d in pairs])
    return row


def markdown(doc: dict) -> str:
    m, p, s = doc["machine"], doc["parameters"], doc["settings"]
    where = m.get("gpu") or f"{m['cpu']}, {m['cpu_cores_visible']} cores, {m['torch_threads']} threads"
    lines = [f"# Stream heads against a draft model ({where}; {doc['models']['dtype']}, compile "
             f"{doc['models']['compile']}; torch {m['torch']}, {m['date']}; load average "
             f"{doc['load_average']['start']} at the start, {doc['load_average']['end']} at the end)", "",
             f"`{doc['how']}`", "",
             f"Parameters: target {p['target']:,}; draft model {p['draft']:,} as loaded, {p['draft_own']:,} of its own "
             f"({p['draft_own_share_of_target']:.1%} of the target's; the rest are the target's tables, shared); "
             f"{doc['models']['heads']} stream heads {p['heads']:,} ({p['heads_share_of_target']:.1%}).", "",
             "| batch | ar tokens/s | best with the draft model: tokens/s (vs ar) | best with the heads: tokens/s "
             "(vs ar) | heads / draft: median [min, max] |", "|---|---|---|---|---|"]
    for row in doc["rows"]:
        cells = []
        for key in ("draft", "heads"):
            b = row.get(key)
            cells.append(f"{b['setting']}: {b['tokens_per_s']:.1f} ({b['speedup_vs_ar']:.2f}x)" if b else "-")
        r = row.get("heads_over_draft")
        ratio = f"{r['median']:.2f}x [{r['min']:.2f}, {r['max']:.2f}]" if r else "-"
        lines.append(f"| {row['batch']} | {row['ar_tokens_per_s']:.1f} | {cells[0]} | {cells[1]} | {ratio} |")
    lines += ["", "| batch | setting | tokens/s: median [min, max] | vs ar | mean accepted length | "
              "acceptance by position |", "|---|---|---|---|---|---|"]
    for batch, entry in doc["batches"].items():
        for label, f in entry["runs"].items():
            t = f["tokens_per_s"]
            per = " ".join(f"{a:.2f}" for a in f["acceptance_per_position"]) or "-"
            chosen = f" (chose {f['chosen_gamma']})" if "chosen_gamma" in f else ""
            lines.append(f"| {batch} | {label}{chosen} | {t['median']:.1f} [{t['min']:.1f}, {t['max']:.1f}] | "
                         f"{f['speedup_vs_ar']['median']:.2f}x | {f['mean_accepted_length']:.3f} | {per} |")
    lines += ["", f"Settings: theta {s['theta']}, temperature {s['temperature']}, {s['max_new_tokens']} new tokens "
              f"at most, {s['items_per_slot']} held-out texts per batch slot, {s['reps']} repetition(s).", "",
              doc["notes"]]
    return "\n".join(lines) + "\n"


def default_stem(models: dict) -> Path:
    device = models["device"].split(":")[0]
    return ROOT / "benchmarks" / "results" / f"drafters_{device}_{DTYPE_SHORT.get(models['dtype'], models['dtype'])}"


def main() -> None:
    args = parse()
    say = (lambda msg: None) if args.quiet else (lambda msg: print(msg, flush=True))
    load_start = round(os.getloadavg()[0], 2)
    models, desc = load(args)
    settings = grid(args, models["streams"].heads)
    skipped = [g for g in args.gammas if g != "auto" and g > models["streams"].heads]
    synths = synthesizers(models, settings, args.max_context)
    doc = {"benchmark": "stream heads against a draft model (tokens/s per drafter)", "how": how_line(sys.argv),
           "machine": describe(desc["device"]), "models": desc, "parameters": parameters(models),
           "settings": {"methods": ["ar", *args.methods], "gammas": args.gammas, "gammas_skipped_for_heads": skipped,
                        "theta": args.theta, "temperature": args.temperature,
                        "max_new_tokens": args.max_new_tokens, "items_per_slot": args.items_per_slot,
                        "reps": args.reps, "warmup_tokens": WARMUP_TOKENS, "max_context": args.max_context,
                        "texts": "engine.draft.evaluate.HELDOUT_TEXTS"},
           "batches": {}, "rows": []}
    for batch in args.batch_sizes:
        runs = measure(synths, settings, batch, args, say)
        found = figures(settings, runs)
        doc["batches"][str(batch)] = {"runs": found}
        doc["rows"].append(headline(settings, runs, found, batch))
    doc["load_average"] = {"start": load_start, "end": round(os.getloadavg()[0], 2)}
    doc["notes"] = " ".join(filter(None, [
        f"Measured on {doc['machine'].get('gpu') or doc['machine']['cpu']} "
        f"({doc['machine']['platform']}) by `{doc['how']}`.",
        "One process: the target loaded once, the draft model and the heads on it, a Synthesizer per setting; "
        "settings interleaved, their order rotated per repetition, an untimed warm-up of each first. tokens/s "
        "is a run's generated tokens over its wall time (prefill included); vs ar and heads / draft are "
        "ratios within a repetition.",
        f"Gammas {skipped} exceed the heads' count and were not run with them." if skipped else "",
        args.note]))
    stem = Path(args.out) if args.out else default_stem(desc)
    write_result_pair(stem, doc, markdown(doc), quiet=args.quiet)
    if args.quiet:
        print(f"written: {stem}.json, {stem}.md")


if __name__ == "__main__":
    main()
