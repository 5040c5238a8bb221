"""PCG's exact fallback on a CPU: every group's mass by a sparse product against gathering every
member and adding it into its group, side by side.

Where a row's thinning trials all fail, the decoder draws the recovered token after the round
from the exact group residual (`PCGRule.exact_residual`), which needs the mass of every group
under the target and the draft. The kit's groups (theta 0.9, as `pcg` uses them) have about a
million members; this script times, in turns, on the kit target's own distributions:

1. the masses of every group for `rows` distributions: `GroupIndex.all_masses` (the product of
   the weighted membership matrix, sparse CSR, with the probabilities) against the gather and
   `index_add_` the engine used before (`GroupIndex.gathered_masses`, still its way off CPUs),
   with the largest relative difference between the two;
2. in a `pcg` decoder kept full (gamma 3, eager rounds), the time a round spends drawing those
   fallbacks (`SpeculativeDecoder.fix_fallbacks`), with each way in blocks of `--block` rounds
   in turns, and how many rows a round sends to the fallback.

    python benchmarks/bench_group_masses.py --out benchmarks/results/group_masses_cpu
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import ROOT, cpu_headline, describe, how_line, median_in_turns, write_or_print  # noqa: E402


def decoder_fallbacks(synth, batch: int, blocks: int, block: int) -> dict:
    """Fallback time per round in a `pcg` decoder at `batch`, the two ways in turns."""
    from bench_round import decoder_for, timed

    decoder = decoder_for(synth, "pcg", batch, batch * (blocks * block * 2 + 8))
    groups = synth.rule(decoder_settings()).groups
    fix, spent = decoder.fix_fallbacks, {"s": 0.0}

    def fixing(*args):
        start = time.perf_counter()
        fix(*args)
        spent["s"] += time.perf_counter() - start
    decoder.fix_fallbacks = fixing
    ways = {"sparse product": None, "gather + index_add": groups.gathered_masses}
    for _ in range(4):
        timed(decoder)
    totals = {name: {"rounds": 0, "round_s": [], "fix_s": 0.0, "fallback_rows": 0} for name in ways}
    try:
        for _ in range(blocks):
            for name, way in ways.items():
                if way is None:
                    groups.__dict__.pop("all_masses", None)
                else:
                    groups.all_masses = way
                for _ in range(block):
                    spent["s"], before = 0.0, decoder.fallbacks_fixed
                    seconds, _ = timed(decoder)
                    t = totals[name]
                    t["rounds"] += 1
                    t["round_s"].append(seconds)
                    t["fix_s"] += spent["s"]
                    t["fallback_rows"] += decoder.fallbacks_fixed - before
    finally:
        groups.__dict__.pop("all_masses", None)
    return {name: {"rounds": t["rounds"], "round_ms_median": 1e3 * statistics.median(t["round_s"]),
                   "fix_ms_per_round": 1e3 * t["fix_s"] / t["rounds"],
                   "fix_ms_per_row": 1e3 * t["fix_s"] / max(t["fallback_rows"], 1),
                   "fallback_rows_per_round": t["fallback_rows"] / t["rounds"]} for name, t in totals.items()}


def decoder_settings():
    from engine import DecodingSettings

    return DecodingSettings(method="pcg", gamma=3, max_new_tokens=400, seed=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--kit", default=str(ROOT / "kit"))
    ap.add_argument("--rows", default="1,2,8", help="distributions per call of the masses")
    ap.add_argument("--reps", type=int, default=15, help="timed calls of each way, in turns")
    ap.add_argument("--batches", default="8,32", help="decoder batches of part 2 (empty: skip it)")
    ap.add_argument("--blocks", type=int, default=12, help="part 2: blocks of rounds per way, in turns")
    ap.add_argument("--block", type=int, default=8, help="part 2: rounds per block")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", help="result stem: writes STEM.json and STEM.md")
    args = ap.parse_args()
    import torch
    from bench_nucleus import kit_logits

    from engine.bench.presets import LoadOptions, load_synthesizer

    torch.set_num_threads(args.threads)
    load0 = round(os.getloadavg()[0], 2)
    synth, _ = load_synthesizer("tiny", kit=args.kit, options=LoadOptions("cpu", "auto", "none"))
    groups = synth.rule(decoder_settings()).groups
    logits = kit_logits(args.kit, 2)
    masses = []
    for rows in map(int, args.rows.split(",")):
        probs = torch.softmax(torch.cat(logits)[:rows] / 0.8, -1)
        expected = groups.gathered_masses(probs)
        got = groups.all_masses(probs)
        diff = float(((got - expected).abs() / expected.abs().clamp(min=1e-30)).max())
        sec = median_in_turns({"sparse product": lambda probs=probs: groups.all_masses(probs),
                           "gather + index_add": lambda probs=probs: groups.gathered_masses(probs)}, args.reps)
        masses.append({"rows": rows, "ms": {k: 1e3 * v for k, v in sec.items()},
                       "speedup": sec["gather + index_add"] / sec["sparse product"], "max_rel_diff": diff})
        print(masses[-1], flush=True)
    decoders = []
    for batch in [int(b) for b in args.batches.split(",") if b]:
        decoders.append({"batch": batch, "ways": decoder_fallbacks(synth, batch, args.blocks, args.block)})
        print(decoders[-1], flush=True)
    doc = {"benchmark": "PCG's exact fallback: every group's mass, sparse product against gather + index_add",
           "how": how_line(sys.argv), "machine": describe("cpu"), "threads": args.threads,
           "groups": {"groups": groups.num_groups, "members": int(groups.members.numel()),
                      "largest": groups.max_size},
           "load_average": [load0, round(os.getloadavg()[0], 2)], "masses": masses, "decoders": decoders}
    lines = [cpu_headline("PCG's exact fallback: group masses by a sparse product", doc["machine"], args.threads,
                          doc["load_average"]), "", f"`{doc['how']}`", "",
             f"Every group's mass ({groups.num_groups:,} groups, {int(groups.members.numel()):,} members, "
             f"the kit's groups at theta 0.9) for `rows` distributions of the kit target, median of {args.reps} "
             "calls of each way in turns:", "",
             "| rows | gather + index_add ms | sparse product ms | speed-up | largest relative difference |",
             "|---|---|---|---|---|"]
    for m in masses:
        lines.append(f"| {m['rows']} | {m['ms']['gather + index_add']:.2f} | {m['ms']['sparse product']:.2f} | "
                     f"{m['speedup']:.1f}x | {m['max_rel_diff']:.1e} |")
    if decoders:
        lines += ["", f"A `pcg` decoder (gamma 3, eager rounds) kept full, the two ways in turns ({args.blocks} "
                  f"blocks of {args.block} rounds each): the time a round spends on fallback draws, the median "
                  "round, the rows a round sends to the fallback and the time per row (rows fixed in one round "
                  "share one call):", "",
                  "| batch | way | rounds | fallback rows / round | fallback ms / row | fallback ms / round "
                  "| median round ms |", "|---|---|---|---|---|---|---|"]
        for d in decoders:
            for name, w in d["ways"].items():
                lines.append(f"| {d['batch']} | {name} | {w['rounds']} | {w['fallback_rows_per_round']:.2f} | "
                             f"{w['fix_ms_per_row']:.2f} | {w['fix_ms_per_round']:.2f} | {w['round_ms_median']:.1f} |")
    write_or_print(args.out, doc, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
