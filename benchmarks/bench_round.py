"""One decode round, eager against compiled, side by side in one run.

For each model set, method and batch size: a decoder of each compile mode decodes the same rows
(a full batch, refilled from a queue as rows end); their rounds are timed in turns, a block of
`--block` rounds of each mode per turn after one untimed round (as a job runs one mode, round after
round, on caches its own rounds filled), after a warm-up that compiles the graph. Per round: the
ops dispatched (counted on one round: `engine.decoding.graphs.count_ops`), the graph launches,
the host's milliseconds (the round's wall time, its one read-back included), the device's
milliseconds (CUDA events; none on a CPU), the tokens committed per round and tokens per second
(over the rounds' time), and the round's speed against the first mode's. Each setting runs at
least `--row-rounds` row-rounds: modes whose numbers differ in their last bits accept different
lengths by chance along a row, which only many rows' rounds average out. Compile seconds and
on-disk cache hits come with each compiled mode.

    python benchmarks/bench_round.py --models kit --batches 1,8,32 --row-rounds 1024 \\
        --out benchmarks/results/round_cpu_tiny
    python benchmarks/bench_round.py --models llasa-1b-shape --batches 1,8,32 --row-rounds 256 --warmup 3 \\
        --out benchmarks/results/round_cpu_llasa_1b_shape
    python benchmarks/bench_round.py --device cuda --models llasa-1b-shape,kit --modes none,cudagraphs \\
        --batches 32,1,8 --out work/gpu-check/round_cuda

OpenMP's wait policy is left as found and recorded: under `PASSIVE` (idle threads sleep at once)
each of a compiled round's kernels wakes the team again, which costs a compiled round more than an
eager one (`benchmarks/results/round_cpu_tiny.json`'s notes); unset is what `pcg-synth generate`
from a shell gets.

The result files are written again after every setting (marked `complete: false` until the last),
so a run stopped at a time limit keeps what it measured.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import ROOT, describe, how_line, write_or_print, write_result_pair  # noqa: E402


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--models", default="kit", help="comma-separated: kit, llasa-1b-shape")
    ap.add_argument("--kit", default=str(ROOT / "kit"), help="the tiny kit's directory (built where missing)")
    ap.add_argument("--methods", default="ar,pcg", help="comma-separated acceptance rules (gamma 3)")
    ap.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes")
    ap.add_argument("--modes", default="none,inductor", help="compile modes side by side (the first is the base)")
    ap.add_argument("--rounds", type=int, default=30,
                    help="timed rounds per mode and setting, at least (--row-rounds may ask for more)")
    ap.add_argument("--row-rounds", type=int, default=512,
                    help="at least this many row-rounds per setting: rounds are raised to ROW_ROUNDS / batch "
                         "(a speculative row's acceptance varies along its trajectory, so a few rounds of one "
                         "row say little about tokens/s)")
    ap.add_argument("--warmup", type=int, default=4, help="untimed rounds first (the compile lands there)")
    ap.add_argument("--block", type=int, default=8,
                    help="modes take turns in blocks of this many timed rounds, each block after one untimed "
                         "round (a round right after the other mode's runs on caches that mode filled)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--dtype", default="auto", help="the models' dtype (auto: as jobs choose)")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="torch's CPU threads")
    ap.add_argument("--out", default=None, help="result stem: writes STEM.json and STEM.md")
    ap.add_argument("--note", default="", help="a sentence for the result's notes (what else ran, what was tried)")
    return ap.parse_args()


def synthesizers(name: str, args, modes: list[str]) -> tuple[dict, dict]:
    """A Synthesizer per compile mode over the same models, and their description."""
    from engine.bench.presets import LoadOptions, load_synthesizer

    out, desc = {}, {}
    for mode in modes:
        preset = "tiny" if name == "kit" else name
        synth, desc = load_synthesizer(preset, kit=args.kit if name == "kit" else None,
                                       options=LoadOptions(args.device, args.dtype, mode))
        out[mode] = synth
    return out, desc


def decoder_for(synth, method: str, batch: int, rows: int, sampling: dict | None = None):
    """A decoder of `method` at `batch` slots with `rows` queued rows of long budgets, sampled as
    the model family's defaults say, or with `sampling` (DecodingSettings fields)."""
    from engine import DecodingSettings
    from engine.bench.runner import BENCH_TEXTS

    settings = synth.settings(DecodingSettings(method=method, gamma=3, max_new_tokens=400, seed=1, **(sampling or {})))
    if method == "pcg":
        synth.groups(settings.theta)
    decoder = synth.make_decoder(settings, batch)
    rule = synth.rule(settings)
    requests = []
    for i in range(rows):
        _, request = synth.prepare(i, BENCH_TEXTS[i % len(BENCH_TEXTS)], settings)
        request.rule = rule
        requests.append(request)
    decoder.submit(requests)
    return decoder


def timed(decoder) -> tuple[float, int]:
    """One `advance` with its round timed alone (admissions left out): (seconds, tokens)."""
    step, took = decoder.step, {}

    def timed_step(active):
        start = time.perf_counter()
        counts, finished = step(active)
        took["s"], took["tokens"] = time.perf_counter() - start, int(counts.sum())
        return counts, finished
    decoder.step = timed_step
    try:
        decoder.advance()
    finally:
        del decoder.step
    return took["s"], took["tokens"]


def measure(synths: dict, method: str, batch: int, args, make=None) -> list[dict]:
    """Each mode's figures per round for one setting, measured in turns. `make(mode, synth, method,
    batch, rows)` builds a mode's decoder (default: `decoder_for`)."""
    rounds = max(args.rounds, -(-args.row_rounds // batch))
    # rows enough that the queue never runs dry, however short they turn out
    extra = args.warmup + -(-rounds // args.block)  # the untimed rounds
    make = make or (lambda mode, *rest: decoder_for(*rest))
    decoders = {m: make(m, s, method, batch, batch * (8 + extra + rounds)) for m, s in synths.items()}
    before = {m: dict(s.runner.stats.to_dict()) for m, s in synths.items()}
    for _ in range(args.warmup):
        for d in decoders.values():
            timed(d)
    # a full collection now, not inside a timed round: compiling and queueing leave a few hundred
    # thousand new objects, whose first full collection takes a quarter of a second on a CPU
    gc.collect()
    seconds = {m: [] for m in decoders}
    tokens = dict.fromkeys(decoders, 0)
    launches = dict.fromkeys(decoders, 0)  # over the timed rounds only
    device = dict.fromkeys(decoders, 0.0)
    for s in synths.values():
        s.runner.time_device = args.device.startswith("cuda")
    done = 0
    while done < rounds:  # modes in turns, a block of rounds each
        n = min(args.block, rounds - done)
        for m, d in decoders.items():
            timed(d)  # untimed: the first round after the other mode's block runs on cold caches
            stats = synths[m].runner.stats
            for _ in range(n):
                before_launches, before_device = stats.graph_launches, stats.device_s
                took, committed = timed(d)
                seconds[m].append(took)
                tokens[m] += committed
                launches[m] += stats.graph_launches - before_launches
                device[m] += stats.device_s - before_device
        done += n
    ops = {m: s.runner.stats.ops_per_round for m, s in synths.items()}  # counted on a plan's 2nd round
    out = []
    for m, s in synths.items():
        stats = s.runner.stats
        out.append({
            "method": method, "batch": batch, "mode": m, "rounds": rounds,
            "ops_per_round": ops[m],
            "graph_launches_per_round": launches[m] / rounds,
            "host_ms_per_round": 1e3 * statistics.median(seconds[m]),
            "device_ms_per_round": 1e3 * device[m] / rounds if stats.device_s else None,
            "tokens_per_round": tokens[m] / rounds,
            "tokens_per_s": tokens[m] / sum(seconds[m]),
            "compiles": stats.compiles - before[m]["compiles"],
            "compile_s": round(stats.compile_s - before[m]["compile_s"], 1),
            "cache_hits": stats.cache_hits - before[m]["cache_hits"],
        })
    base, base_ms = out[0]["tokens_per_s"], out[0]["host_ms_per_round"]
    for row in out:
        row["vs_first_mode"] = round(row["tokens_per_s"] / base, 3)
        row["round_vs_first_mode"] = round(base_ms / row["host_ms_per_round"], 3)  # > 1: a shorter round
    return out


def table(doc: dict) -> str:
    m = doc["machine"]
    where = m.get("gpu") or f"{m['cpu']}, {m['cpu_cores_visible']} cores, {doc['threads']} threads"
    policy = doc.get("omp_wait_policy") or "unset (OpenMP's default)"
    lines = [f"# A decode round, eager against compiled ({where}; torch {m['torch']}, {m['date']}; load "
             f"average {doc['load_average']['start']} at the start, {doc['load_average']['end']} at the end; "
             f"OMP_WAIT_POLICY {policy})", "",
             f"`{doc['how']}`", "",
             "| models | method | batch | mode | ops / round | launches / round | host ms / round | device ms / round "
             "| rounds | tokens / round | tokens/s | tokens/s vs eager | round vs eager | compile s (cache hits) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["readings"]:
        dev = f"{r['device_ms_per_round']:.2f}" if r["device_ms_per_round"] is not None else "-"
        comp = f"{r['compile_s']} ({r['cache_hits']})" if r["compiles"] else "-"
        lines.append(f"| {r['models']} ({r['dtype']}) | {r['method']} | {r['batch']} | {r['mode']} "
                     f"| {r['ops_per_round']} | {r['graph_launches_per_round']:.0f} "
                     f"| {r['host_ms_per_round']:.1f} | {dev} | {r['rounds']} | {r['tokens_per_round']:.2f} "
                     f"| {r['tokens_per_s']:.0f} | {r['vs_first_mode']:.2f}x | {r['round_vs_first_mode']:.2f}x "
                     f"| {comp} |")
    return "\n".join(lines) + "\n\n" + doc["notes"] + "\n"


def main() -> None:
    args = parse()
    import torch

    torch.set_num_threads(args.threads)
    modes = args.modes.split(",")
    load_start = round(os.getloadavg()[0], 2)
    readings = []
    notes = (f"Rounds timed in turns ({args.block} of one mode, then {args.block} of the next, each block "
             "after one untimed round) after the warm-up, on decoders kept full from a queue; host ms is "
             "the median round, tokens/s the tokens committed over all timed rounds, tokens / round their "
             "mean per round, round vs eager the eager median round over this mode's. Each setting runs "
             "at least --row-rounds row-rounds (rounds = row-rounds / batch where that is more than "
             "--rounds): where the modes' numbers differ in their last bits, speculative rows accept "
             "different lengths by chance, and tokens/s converges on the round time's ratio only over "
             "many rows' rounds. Ops are counted on one round (engine.decoding.graphs.count_ops): "
             "eager, every op through torch's dispatcher; compiled, the ops the graph calls "
             "(matrix products, attention), its own fused kernels not being dispatched ops."
             + (" " + args.note if args.note else ""))
    # batch outermost, so that with `--batches 32,1,8` a run stopped at a time limit has both
    # methods at the first batches (the GPU goals compare them at 32 and 1)
    settings = [(name, method, batch) for name in args.models.split(",") for batch in map(int, args.batches.split(","))
                for method in args.methods.split(",")]

    def write(done: bool) -> None:
        """The result so far: written after every setting, so a run stopped at a time limit (a lent
        GPU's call) leaves what it measured."""
        left = "" if done else (f" This run was stopped after {len(readings) // len(modes)} of its "
                                f"{len(settings)} settings; the file holds those measured.")
        doc = {"benchmark": "a decode round, eager against compiled", "how": how_line(sys.argv),
               "machine": describe(args.device), "threads": args.threads,
               "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),  # left as found (see the docstring)
               "load_average": {"start": load_start, "end": round(os.getloadavg()[0], 2)},
               "readings": readings, "complete": done, "notes": notes + left}
        if done:
            write_or_print(args.out, doc, table(doc))
        elif args.out:  # quietly: each reading was printed as it came
            write_result_pair(Path(args.out), doc, table(doc), quiet=True)

    for name in args.models.split(","):
        synths, desc = synthesizers(name, args, modes)
        for _, method, batch in [s for s in settings if s[0] == name]:
            for row in measure(synths, method, batch, args):
                readings.append({"models": name, "dtype": desc["dtype"], **row})
                print(readings[-1], flush=True)
            write(done=False)
        del synths
    write(done=True)


if __name__ == "__main__":
    main()
