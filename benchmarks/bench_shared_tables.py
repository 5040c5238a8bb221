"""A draft holding the target's head and input embeddings: one copy in the synthesizer against
two, side by side.

A draft made of the target's layers (`pcg-synth draft init`, the kit's, the presets') keeps the
target's output head and input embeddings, the same values; `Synthesizer` then keeps one copy of
each (`LlamaLM.share_tables`). This script measures, each way:

1. the resident memory of a process that loaded the preset's pair (one process per preset and
   way, after a garbage collection);
2. on the kit, `pcg` rounds (gamma 3) of the two synthesizers in turns in one process, timed as
   `bench_round.py` times modes, eager and compiled: median round and tokens/s.

    python benchmarks/bench_shared_tables.py --out benchmarks/results/shared_tables_cpu
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import ROOT, cpu_headline, describe, how_line, write_or_print  # noqa: E402


def load(preset: str, kit: str, shared: bool, compile: str = "none"):
    """The preset's synthesizer, its draft sharing the target's tables or (not `shared`) not."""
    from engine.bench.presets import LoadOptions, load_synthesizer
    from engine.models.llama import LlamaLM

    keep = LlamaLM.share_tables
    if not shared:
        LlamaLM.share_tables = lambda self, source: []
    try:
        synth, _ = load_synthesizer(preset, kit=kit, options=LoadOptions("cpu", "auto", compile))
    finally:
        LlamaLM.share_tables = keep
    return synth


def resident_mb() -> int:
    """This process's resident memory (VmRSS), MB."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS"))
    return int(line.split()[1]) // 1024


def memory_child(preset: str, kit: str, shared: bool) -> None:
    synth = load(preset, kit, shared)
    gc.collect()
    target, draft = synth.target.model, synth.draft.model
    print(json.dumps({"rss_mb": resident_mb(), "head_shared": draft.head is target.head,
                      "embeddings_shared": draft.model.embed_tokens is target.model.embed_tokens}))


def rounds(kit: str, mode: str, batch: int, row_rounds: int) -> dict:
    """`pcg` rounds of the two synthesizers' decoders in turns (`bench_round.measure`: blocks of 8
    timed rounds, each after one untimed round, at least `row_rounds` row-rounds)."""
    from bench_round import measure

    synths = {way: load("tiny", kit, way == "one copy", mode) for way in ("one copy", "two copies")}
    timing = argparse.Namespace(rounds=30, row_rounds=row_rounds, warmup=4, block=8, device="cpu")
    return {r["mode"]: r for r in measure(synths, "pcg", batch, timing)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--kit", default=str(ROOT / "kit"))
    ap.add_argument("--presets", default="tiny,llasa-1b-shape", help="presets whose memory is measured")
    ap.add_argument("--batches", default="1,8,32", help="kit batches of the round comparison (empty: skip)")
    ap.add_argument("--modes", default="none,inductor")
    ap.add_argument("--row-rounds", type=int, default=512, help="row-rounds per way and setting, at least")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--memory-child", nargs=2, metavar=("PRESET", "WAY"), help=argparse.SUPPRESS)
    ap.add_argument("--out", help="result stem: writes STEM.json and STEM.md")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.memory_child:
        memory_child(args.memory_child[0], args.kit, args.memory_child[1] == "shared")
        return
    load0 = round(os.getloadavg()[0], 2)
    memory = []
    for preset in [p for p in args.presets.split(",") if p]:
        row = {"preset": preset}
        for way in ("shared", "apart"):
            run = subprocess.run([sys.executable, __file__, "--kit", args.kit, "--threads", str(args.threads),
                                  "--memory-child", preset, way], capture_output=True, text=True, check=True)
            row[way] = json.loads(run.stdout.strip().splitlines()[-1])
        memory.append(row)
        print(row, flush=True)
    speed = []
    for mode in [m for m in args.modes.split(",") if m]:
        for batch in [int(b) for b in args.batches.split(",") if b]:
            speed.append({"mode": mode, "batch": batch, "ways": rounds(args.kit, mode, batch, args.row_rounds)})
            print(speed[-1], flush=True)
    doc = {"benchmark": "a draft's head and embeddings kept once (the target's) against twice",
           "how": how_line(sys.argv), "machine": describe("cpu"), "threads": args.threads,
           "load_average": [load0, round(os.getloadavg()[0], 2)], "memory": memory, "rounds": speed}
    lines = [cpu_headline("A draft with the target's head and embeddings: one copy against two", doc["machine"],
                          args.threads, doc["load_average"]), "", f"`{doc['how']}`", "",
             "Resident memory of a process that loaded the preset's target and draft (`dtype: auto`), one process "
             "per preset and way:", "",
             "| preset | one copy (shared) MB | two copies MB | saved MB |", "|---|---|---|---|"]
    for m in memory:
        lines.append(f"| {m['preset']} | {m['shared']['rss_mb']} | {m['apart']['rss_mb']} | "
                     f"{m['apart']['rss_mb'] - m['shared']['rss_mb']} |")
    if speed:
        lines += ["", "`pcg` rounds (gamma 3) on the kit, the two synthesizers' decoders in turns in one process "
                  "(blocks of 8 timed rounds, each after one untimed round, at least "
                  f"{args.row_rounds} row-rounds a way):", "",
                  "| mode | batch | one copy: ms / round | two copies: ms / round | round, two / one | "
                  "one copy: tokens/s | two copies: tokens/s |", "|---|---|---|---|---|---|---|"]
        for s in speed:
            one, two = s["ways"]["one copy"], s["ways"]["two copies"]
            one_ms, two_ms = one["host_ms_per_round"], two["host_ms_per_round"]
            lines.append(f"| {s['mode']} | {s['batch']} | {one_ms:.2f} | {two_ms:.2f} | {two_ms / one_ms:.2f}x | "
                         f"{one['tokens_per_s']:.0f} | {two['tokens_per_s']:.0f} |")
    write_or_print(args.out, doc, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
