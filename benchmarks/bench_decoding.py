"""Throughput of the five acceptance rules on one machine, methods interleaved in one run.

For each batch size, every repetition runs every method once over the same items and seeds
(order rotated per repetition); speedup is each method's tokens/s over `ar`'s in the same
repetition, so drift of the machine cancels. A warm-up pass per method is excluded.

    python benchmarks/bench_decoding.py --kit kit --device cpu --out benchmarks/results/decoding_cpu_tiny.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe, write_result  # noqa: E402

from engine import DecodingSettings, SynthesisItem, Synthesizer  # noqa: E402

METHODS = ["ar", "exact", "pcg", "ssd", "topk"]
TEXTS = Path(__file__).resolve().parents[1] / "jobs" / "quickstart-texts.txt"


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run_batch(synth: Synthesizer, batch: int, reps: int, max_new: int, gamma: int, theta: float) -> dict:
    texts = [t for t in TEXTS.read_text().splitlines() if t.strip()]
    items = [SynthesisItem(text=texts[i % len(texts)], id=f"u{i}") for i in range(2 * batch)]
    settings = {m: DecodingSettings(method=m, gamma=gamma, theta=theta, max_new_tokens=max_new)
                for m in METHODS}
    for m in METHODS:  # warm-up, excluded
        synth.synthesize(items[:batch], settings[m].model_copy(update={"max_new_tokens": 8}), batch_size=batch)
    rows = {m: [] for m in METHODS}
    for rep in range(reps):
        order = METHODS[rep % len(METHODS):] + METHODS[:rep % len(METHODS)]
        for m in order:
            s = settings[m].model_copy(update={"seed": rep})
            _, summary = synth.synthesize(items, s, batch_size=batch)
            rows[m].append(summary.to_dict())
    out = {}
    for m in METHODS:
        tps = [r["tokens_per_s"] for r in rows[m]]
        ratios = [r["tokens_per_s"] / a["tokens_per_s"] for r, a in zip(rows[m], rows["ar"])]
        acc = [r["acceptance_per_position"] for r in rows[m]]
        out[m] = {
            "tokens_per_s": spread(tps),
            "audio_s_per_s": spread([t / 50 for t in tps]),
            "speedup_vs_ar": spread(ratios),
            "mean_accepted_length": spread([r["mean_accepted_length"] for r in rows[m]]),
            "acceptance_per_position": [statistics.mean(x) for x in zip(*acc)] if acc[0] else [],
            "thinning_trials_per_rep": statistics.mean(r["thinning_trials"] for r in rows[m]),
            "generated_tokens_per_rep": statistics.mean(r["generated_tokens"] for r in rows[m]),
        }
    return out


def markdown(result: dict) -> str:
    lines = [f"Decoding throughput, {result['models']['target']} ({result['machine']['device']}: "
             f"{result['machine'].get('gpu', result['machine']['cpu'])}), gamma {result['settings']['gamma']}, "
             f"theta {result['settings']['theta']}, temperature 0.8, {result['settings']['reps']} reps, medians.", "",
             "| batch | method | tokens/s | speedup vs ar | mean accepted length | acceptance by position |",
             "|---|---|---|---|---|---|"]
    for batch, methods in result["batches"].items():
        for m, r in methods.items():
            acc = " ".join(f"{a:.2f}" for a in r["acceptance_per_position"]) or "-"
            lines.append(f"| {batch} | {m} | {r['tokens_per_s']['median']:.1f} | "
                         f"{r['speedup_vs_ar']['median']:.2f}x | {r['mean_accepted_length']['median']:.2f} | {acc} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kit", default="kit", help="tiny kit dir (or use --target/--draft)")
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=3)
    ap.add_argument("--theta", type=float, default=0.4)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    target = args.target or f"{args.kit}/target"
    draft = args.draft or f"{args.kit}/draft"
    synth = Synthesizer.load(target, draft=draft, device=args.device, dtype=args.dtype)
    result = {
        "benchmark": "decoding throughput per acceptance rule",
        "how": "python " + " ".join(sys.argv),
        "machine": describe(args.device),
        "models": {"target": target, "draft": draft, "dtype": str(synth.target.model.dtype)},
        "settings": {"gamma": args.gamma, "theta": args.theta, "temperature": 0.8,
                     "max_new_tokens": args.max_new_tokens, "reps": args.reps,
                     "items_per_run": "2 x batch size (continuous batching refills slots)"},
        "batches": {},
    }
    for b in [int(x) for x in args.batch_sizes.split(",")]:
        result["batches"][str(b)] = run_batch(synth, b, args.reps, args.max_new_tokens, args.gamma, args.theta)
        print(f"batch {b} done", flush=True)
    write_result(result, args.out)
    Path(args.out).with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
