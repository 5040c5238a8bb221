"""Top-p on a CPU: the head-first nucleus against a sort of the whole vocabulary, side by side.

The distributions are the kit target's own: an `ar` decoder at batch 32 decodes from a queue
and each round's logits are kept; then, at temperature 0.8 (Llasa's usual), the warped
probabilities of `[batch, positions, 65537]` (positions 4: a target's verify at gamma 3; 1: a
draft step or an `ar` step) go through `engine.decoding.sampling.nucleus` and through
`nucleus_sorted`, in turns; per setting the median milliseconds of each, whether they agree
value for value, and how the rows were served (the 1,024 head, the 8,192 head, a sort). With
`--compiled` (the default) both also run as `torch.compile` graphs, as in a compiled round, where
the head-first nucleus is one opaque op (`pcg_synth::nucleus_keep`).

    python benchmarks/bench_nucleus.py --out benchmarks/results/nucleus_cpu_tiny
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import ROOT, cpu_headline, describe, how_line, median_in_turns, write_or_print  # noqa: E402


def kit_logits(kit: str, rounds: int):
    """`rounds` rounds of the kit target's logits `[32, V]`, from an `ar` decoder kept full."""
    from bench_round import decoder_for

    from engine.bench.presets import LoadOptions, load_synthesizer

    synth, _ = load_synthesizer("tiny", kit=kit, options=LoadOptions("cpu", "auto", "none"))
    decoder = decoder_for(synth, "ar", 32, 32 * 8)
    model, kept = synth.target.model, []
    step = model.step

    def keeping(*args, **kwargs):
        out = step(*args, **kwargs)
        if out is not None and out.shape[0] == 32 and out.shape[1] == 1:  # a round's step, not a prefill
            kept.append(out[:, -1].float())
        return out
    model.step = keeping
    for _ in range(rounds + 4):
        decoder.advance()
    del model.step  # the class's method again
    return kept[4:4 + rounds]


def served(probs, top_p) -> dict:
    """How many rows each head (or a sort) would serve."""
    import torch

    from engine.decoding.sampling import NUCLEUS_HEADS, nucleus_sorted

    edge = nucleus_sorted(probs.reshape(-1, probs.shape[-1]), top_p, mask=True).sum(-1)  # tokens kept
    out, left = {}, torch.ones(len(edge), dtype=torch.bool)
    for k in NUCLEUS_HEADS:
        here = left & (edge < k)
        out[str(k)] = int(here.sum())
        left &= ~here
    out["sort"] = int(left.sum())
    out["kept tokens (median)"] = int(edge.median())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--kit", default=str(ROOT / "kit"))
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--positions", default="1,4")
    ap.add_argument("--top-p", default="0.8,0.9,0.95")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--reps", type=int, default=5, help="timed calls of each, in turns")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--compiled", action=argparse.BooleanOptionalAction, default=True,
                    help="also time both as compiled graphs (one compile per shape and function)")
    ap.add_argument("--out", help="result stem: writes STEM.json and STEM.md")
    args = ap.parse_args()
    import torch

    from engine.decoding.sampling import nucleus, nucleus_sorted

    torch.set_num_threads(args.threads)
    load0 = round(os.getloadavg()[0], 2)
    rounds = kit_logits(args.kit, 4)
    readings = []
    for batch in map(int, args.batches.split(",")):
        for positions in map(int, args.positions.split(",")):
            logits = torch.stack([r[:batch] for r in rounds[:positions]], 1)  # [batch, positions, V]
            probs = torch.softmax(logits / args.temperature, -1)
            fns = {"sort": nucleus_sorted, "heads": nucleus}
            if args.compiled:  # top-p as a tensor: one graph per shape
                fns.update({f"compiled {name}": torch.compile(fn, fullgraph=True, dynamic=False)
                            for name, fn in (("sort", nucleus_sorted), ("heads", nucleus))})
            for top_p in map(float, args.top_p.split(",")):
                limit = torch.tensor([top_p])
                expected = nucleus_sorted(probs, top_p)
                same = {name: torch.equal(fn(probs, limit) > 0, expected > 0) for name, fn in fns.items()}
                seconds = median_in_turns({name: lambda fn=fn, probs=probs, limit=limit: fn(probs, limit)
                                           for name, fn in fns.items()},
                                          args.reps)
                ms = {name: 1e3 * t for name, t in seconds.items()}
                same["values"] = torch.equal(nucleus(probs, limit), expected)
                readings.append({"batch": batch, "positions": positions, "top_p": top_p, "ms": ms,
                                 "speedup": ms["sort"] / ms["heads"], "identical": same,
                                 "rows": served(probs, top_p)})
                if args.compiled:
                    readings[-1]["compiled_speedup"] = ms["compiled sort"] / ms["compiled heads"]
                print(readings[-1], flush=True)
    doc = {"benchmark": "top-p: head-first nucleus against a full sort", "how": how_line(sys.argv),
           "machine": describe("cpu"), "threads": args.threads, "temperature": args.temperature,
           "load_average": [load0, round(os.getloadavg()[0], 2)], "readings": readings}
    lines = [cpu_headline("Top-p on a CPU: the head-first nucleus against a full sort", doc["machine"], args.threads,
                          doc["load_average"]), "", f"`{doc['how']}`", "",
             "| batch | positions | top-p | full sort ms | head-first ms | speed-up | "
             + ("compiled: sort ms | compiled: heads ms | speed-up | " if args.compiled else "")
             + "identical | rows: 1,024 head / 8,192 head / sort | tokens kept (median) |",
             "|---|---|---|---|---|---|" + ("---|---|---|" if args.compiled else "") + "---|---|---|"]
    for r in readings:
        rows, ms = r["rows"], r["ms"]
        compiled = (f"{ms['compiled sort']:.2f} | {ms['compiled heads']:.2f} | {r['compiled_speedup']:.1f}x | "
                    if args.compiled else "")
        lines.append(f"| {r['batch']} | {r['positions']} | {r['top_p']} | {ms['sort']:.2f} | {ms['heads']:.2f} "
                     f"| {r['speedup']:.1f}x | {compiled}{'yes' if all(r['identical'].values()) else 'NO'} | "
                     f"{rows['1024']} / {rows['8192']} / {rows['sort']} | {rows['kept tokens (median)']} |")
    lines += ["", f"The kit target's logits from an `ar` decoder at batch 32 (4 rounds kept; a setting of batch b "
              f"and p positions takes the first b rows of the first p rounds), warped at temperature "
              f"{args.temperature}; median of {args.reps} calls of each, in turns. `identical`: the head-first "
              "nucleus gives the sort's probabilities value for value, and every variant keeps the sort's tokens. "
              "Compiled: each function as one `torch.compile` graph per shape, the head-first one calling the "
              "eager code as one op."]
    write_or_print(args.out, doc, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
