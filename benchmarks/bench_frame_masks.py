"""What the per-position output space costs a decode round: the Orpheus kit's rounds with the
frame masks (each position restricted to its own 4,096 codes, end of speech where a frame ends)
against the same rounds with the masks off, side by side in one run, eager and compiled.

Each compile mode loads two synthesizers over the same kit; one's decoders keep the masks, the
other's have them taken out (`RoundState.phases` None: the round's code without the mask, its
output space otherwise the same). Their rounds are timed in turns by `bench_round.measure` (blocks
of rounds, each after one untimed round, over decoders kept full from a queue); the ratio is the
masked round's median host time over the unmasked one's.

    python benchmarks/bench_frame_masks.py --batches 8,32 --out benchmarks/results/frame_masks_cpu_orpheus_kit
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_round import decoder_for, measure  # noqa: E402

from machine import ROOT, describe, how_line, write_or_print  # noqa: E402

GOAL = 1.1  # a masked round takes at most this many times the unmasked one


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--kit", default=str(ROOT / "kit-orpheus"), help="the Orpheus kit (built where missing)")
    ap.add_argument("--methods", default="ar,pcg", help="comma-separated acceptance rules (gamma 3)")
    ap.add_argument("--batches", default="8,32", help="comma-separated batch sizes")
    ap.add_argument("--modes", default="none,inductor", help="compile modes (each: masks on against off)")
    ap.add_argument("--rounds", type=int, default=30, help="timed rounds per setting, at least")
    ap.add_argument("--row-rounds", type=int, default=1024, help="at least this many row-rounds per setting")
    ap.add_argument("--warmup", type=int, default=4, help="untimed rounds first (the compile lands there)")
    ap.add_argument("--block", type=int, default=8, help="rounds of one variant per turn")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="torch's CPU threads")
    ap.add_argument("--out", default=None, help="result stem: writes STEM.json and STEM.md")
    return ap.parse_args()


SAMPLINGS = {  # the family's defaults, and the same temperature with no nucleus and no penalty
    "family": {},
    "plain": {"temperature": 0.6, "top_p": 1.0, "repetition_penalty": 1.0},
}


def masked_or_not(variant: str, synth, method: str, batch: int, rows: int, sampling: dict):
    """`decoder_for`'s decoder, its frame masks taken out for the `off` variant."""
    from engine.families.base import OutputSpace

    decoder = decoder_for(synth, method, batch, rows, sampling)
    if variant == "masks off":
        decoder.state.phases = decoder.state.frame_bias = None  # the round skips the mask (round.py: in_frame)
        decoder.space = OutputSpace(decoder.space.eos)  # whole rows kept (no frame to trim to)
    return decoder


def table(doc: dict) -> str:
    m = doc["machine"]
    lines = [f"# The frame masks' cost in a decode round ({m['cpu']}, {m['cpu_cores_visible']} cores, "
             f"{doc['threads']} threads; torch {m['torch']}, {m['date']})", "",
             f"`{doc['how']}`", "",
             "| sampling | mode | method | batch | host ms / round, masks on | masks off | on / off "
             "| tokens / round on | off |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["readings"]:
        lines.append(f"| {r['sampling']} | {r['mode']} | {r['method']} | {r['batch']} | {r['on_ms']:.2f} "
                     f"| {r['off_ms']:.2f} | {r['ratio']:.3f} | {r['on_tokens']:.2f} | {r['off_tokens']:.2f} |")
    return "\n".join(lines) + "\n\n" + doc["notes"] + "\n"


def main() -> None:
    args = parse()
    import torch

    from engine import Synthesizer
    from engine.kit import build_kit

    torch.set_num_threads(args.threads)
    kit = Path(args.kit)
    if not (kit / "kit.json").is_file():
        build_kit(kit, family="orpheus")
    timing = SimpleNamespace(rounds=args.rounds, row_rounds=args.row_rounds, warmup=args.warmup, block=args.block,
                             device="cpu")
    readings = []
    for mode in args.modes.split(","):
        synths = {v: Synthesizer.load(kit / "target", draft=kit / "draft", device="cpu", dtype="float32",
                                      compile=mode) for v in ("masks on", "masks off")}
        for sampling, fields in SAMPLINGS.items():
            for batch in map(int, args.batches.split(",")):
                for method in args.methods.split(","):
                    make = lambda *a, fields=fields: masked_or_not(*a, fields)  # noqa: E731
                    on, off = measure(synths, method, batch, timing, make=make)
                    readings.append({"sampling": sampling, "mode": mode, "method": method, "batch": batch,
                                     "rounds": on["rounds"],
                                     "on_ms": on["host_ms_per_round"], "off_ms": off["host_ms_per_round"],
                                     "ratio": round(on["host_ms_per_round"] / off["host_ms_per_round"], 4),
                                     "on_tokens": on["tokens_per_round"], "off_tokens": off["tokens_per_round"]})
                    print(readings[-1], flush=True)
    worst = max(r["ratio"] for r in readings)
    notes = (f"Median host ms of a round (its one read-back included) over blocks of {args.block} rounds of "
             "each variant in turns, after one untimed round each, on decoders kept full from a queue; "
             f"float32, the kit's target and draft. Goal: a masked round at most {GOAL}x the unmasked one; "
             f"worst ratio here {worst:.3f} ({'met' if worst <= GOAL else 'not met'}). Sampling `family`: "
             "Orpheus's defaults (temperature 0.6, top-p 0.8, repetition penalty 1.3); `plain`: temperature 0.6 "
             "alone, so that no nucleus search, whose cost depends on how the mass is spread, enters the ratio. "
             "Tokens per round differ between the variants: without the masks the rows sample other ids, so "
             "they accept other lengths.")
    doc = {"benchmark": "frame masks in a decode round", "how": how_line(sys.argv), "machine": describe("cpu"),
           "threads": args.threads, "goal_ratio": GOAL, "worst_ratio": worst, "readings": readings, "notes": notes}
    write_or_print(args.out, doc, table(doc))


if __name__ == "__main__":
    main()
