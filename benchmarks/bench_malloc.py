"""What the C allocator's settings (`engine/models/malloc.py`) buy a CPU decode round.

Fresh processes take turns, one per allocator setting and repetition; each loads the tiny kit
(`dtype: auto`), and for each setting of `--settings` (method:batch:compile) fills a decoder
from a queue, warms it up and times `--rounds` rounds (`bench_round.timed`: the round alone).
Per round: the median wall time, tokens per second and minor page faults. The settings compared:

  * `engine`: the engine's, as every CPU decode runs (`keep_freed_memory`);
  * `mapped`: the engine's but glibc's own count of mapped blocks (`M_MMAP_MAX` 65536), i.e.
    blocks above glibc's 32 MiB mmap ceiling mapped afresh on each allocation, as before
    `mmap_max` was among the settings;
  * `default`: glibc's defaults (`PCG_SYNTH_MALLOC=default`).

    .venv/bin/python benchmarks/bench_malloc.py --reps 3 --out benchmarks/results/malloc_mmap_max_cpu_tiny
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import ROOT, cpu_headline, describe, how_line, write_or_print  # noqa: E402

MODES = {"default": "glibc's defaults (`PCG_SYNTH_MALLOC=default`)",
         "mapped": "the engine's, blocks over 32 MiB mapped (`M_MMAP_MAX` glibc's 65536)",
         "engine": "the engine's (`mmap_max` 0)"}
GLIBC_MMAP_MAX = 65536  # glibc's DEFAULT_MMAP_MAX


def child(args) -> None:
    import torch

    from engine.models.malloc import M_MMAP_MAX, described, keep_freed_memory, mallopt

    torch.set_num_threads(args.threads)
    keep_freed_memory()
    if args.child == "mapped":
        assert mallopt(M_MMAP_MAX, GLIBC_MMAP_MAX)
    from bench_round import decoder_for, timed

    from engine.bench.presets import LoadOptions, load_synthesizer

    synths, out = {}, {"malloc": described(), "readings": []}
    for setting in args.settings.split(","):
        method, batch, mode = setting.split(":")
        if mode not in synths:
            synths[mode], _ = load_synthesizer("tiny", kit=args.kit, options=LoadOptions("cpu", "auto", mode))
        decoder = decoder_for(synths[mode], method, int(batch), int(batch) * 8)
        for _ in range(args.warmup):
            timed(decoder)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        rounds = [timed(decoder) for _ in range(args.rounds)]
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        out["readings"].append({"setting": setting, "ms": 1e3 * statistics.median(s for s, _ in rounds),
                                "tokens_per_s": sum(n for _, n in rounds) / sum(s for s, _ in rounds),
                                "faults_per_round": faults / args.rounds})
    out["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
    print("RESULT " + json.dumps(out), flush=True)


def table(doc: dict) -> str:
    lines = [cpu_headline("A CPU decode round under the allocator's settings", doc["machine"], doc["threads"],
                          doc["load_average"]), "", f"`{doc['how']}`", "",
             "| method:batch:compile | malloc | ms / round: median of processes [lowest, highest] | tokens/s "
             "(median) | vs engine's | minor faults / round (median) |", "|---|---|---|---|---|---|"]
    for setting in doc["settings"]:
        rows = {mode: [r for p in doc["processes"] if p["mode"] == mode for r in p["readings"]
                       if r["setting"] == setting] for mode in doc["modes"]}
        base = statistics.median(r["tokens_per_s"] for r in rows["engine"])
        for mode, rs in rows.items():
            ms = [r["ms"] for r in rs]
            tps = statistics.median(r["tokens_per_s"] for r in rs)
            lines.append(f"| {setting} | {MODES[mode]} | {statistics.median(ms):.1f} [{min(ms):.1f}, {max(ms):.1f}] "
                         f"| {tps:.0f} | {tps / base:.2f}x | "
                         f"{statistics.median(r['faults_per_round'] for r in rs):.0f} |")
    rss = {mode: statistics.median(p["max_rss_mib"] for p in doc["processes"] if p["mode"] == mode)
           for mode in doc["modes"]}
    lines += ["", f"{doc['reps']} repetitions of one process per allocator setting in turn (the order reversed "
              f"every other repetition); each process "
              f"decodes every setting ({doc['rounds']} timed rounds after {doc['warmup']} warm-up rounds, decoders "
              f"kept full from a queue, pcg and ar at gamma 3). Peak resident memory per process (median, MiB): "
              + ", ".join(f"{mode} {v:.0f}" for mode, v in rss.items()) + "."
              + (" " + doc["note"] if doc["note"] else "")]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--kit", default=str(ROOT / "kit"))
    ap.add_argument("--settings", default="pcg:32:none,pcg:64:none,ar:32:none,pcg:8:none,pcg:32:inductor",
                    help="comma-separated method:batch:compile")
    ap.add_argument("--modes", default="default,mapped,engine", help="allocator settings in turn")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", help="result stem: writes STEM.json and STEM.md")
    ap.add_argument("--note", default="", help="a sentence for the result's notes")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if not (Path(args.kit) / "kit.json").is_file():
        sys.exit(f"no kit at {args.kit}: build it first (.venv/bin/pcg-synth kit build kit)")
    load0, processes = round(os.getloadavg()[0], 2), []
    modes = args.modes.split(",")
    for rep in range(args.reps):
        for mode in modes if rep % 2 == 0 else modes[::-1]:  # the order alternates
            env = {k: v for k, v in os.environ.items() if k != "PCG_SYNTH_MALLOC" and not k.startswith("MALLOC_")}
            env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
            if mode == "default":
                env["PCG_SYNTH_MALLOC"] = "default"
            cmd = [sys.executable, __file__, "--child", mode, "--kit", args.kit, "--settings", args.settings,
                   "--rounds", str(args.rounds), "--warmup", str(args.warmup), "--threads", str(args.threads)]
            run = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=str(ROOT))
            if run.returncode:
                sys.exit(f"{mode} process failed:\n{run.stderr[-3000:]}")
            doc = json.loads(next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))[7:])
            processes.append({"rep": rep, "mode": mode, **doc})
            print(rep, mode, [(r["setting"], round(r["ms"], 1), r["faults_per_round"]) for r in doc["readings"]],
                  flush=True)
    doc = {"benchmark": "malloc", "how": how_line(sys.argv), "machine": describe("cpu"), "threads": args.threads,
           "settings": args.settings.split(","), "modes": modes, "reps": args.reps, "rounds": args.rounds,
           "warmup": args.warmup, "load_average": [load0, round(os.getloadavg()[0], 2)], "note": args.note,
           "processes": processes}
    write_or_print(args.out, doc, table(doc))


if __name__ == "__main__":
    main()
