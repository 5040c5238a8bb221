"""What a fresh process (a Ray worker, a replacement worker, a CLI call) pays before it can decode:
importing the engine, loading a target and its draft (`Synthesizer.load`), the first decode of two
short rows, then the X-codec2 decoder a job worker also loads. Each reading is its own Python
process, timed from inside (per stage) and from outside (the whole process, exit included).

With `--before DIR` (an older engine: `git archive COMMIT | tar -x -C DIR`) the same runs import
that code instead, alternating with this checkout's, `--reps` of each; medians reported.

    python benchmarks/bench_startup.py --kit kit --before /tmp/before --before-label cc15e71 \\
        --out benchmarks/results/startup_cpu_avx2.json

With `--cli`, the command line's answers that need no model instead: `pcg-synth --version`,
`run --help`, `draft train --help`, the refusal of an invalid job spec and of a job whose models
are missing, each a fresh process
running the CLI's `main` (what the `pcg-synth` script runs), timed from outside, recording
whether it imported torch or Ray:

    python benchmarks/bench_startup.py --cli --before /tmp/before --before-label 5bbec71 \\
        --out benchmarks/results/cli_start_cpu_avx2.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("import", "load", "first_decode", "codec")
HEAVY = ("sympy", "torch._dynamo", "scipy.optimize", "transformers.models.llama.modeling_llama",
         "transformers.modeling_utils")
ONE_START = """
import json, sys, time
start = time.perf_counter()
from engine import DecodingSettings, Synthesizer
t = {"import": time.perf_counter() - start}
kit = sys.argv[1]
synth = Synthesizer.load(kit + "/target", draft=kit + "/draft", device="cpu", dtype="float32", batch_size=2)
t["load"] = time.perf_counter() - start - sum(t.values())
results, _ = synth.synthesize(["Hello there.", "A second row."],
                              DecodingSettings(method="pcg", theta=0.4, max_new_tokens=16, seed=1))
t["first_decode"] = time.perf_counter() - start - sum(t.values())
heavy_before_codec = [m for m in sys.argv[2].split(",") if m in sys.modules]
from engine.codec.xcodec2 import Xcodec2Codec
Xcodec2Codec.load(kit + "/codec", device="cpu")
t["codec"] = time.perf_counter() - start - sum(t.values())
print(json.dumps({"seconds": t, "codes": [r.codes for r in results], "heavy_before_codec": heavy_before_codec}))
"""


def one_start(engine_dir: Path, kit: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(engine_dir)}
    began = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", ONE_START, str(kit.resolve()), ",".join(HEAVY)],
                         capture_output=True, text=True, env=env, cwd=str(engine_dir), check=True)
    doc = json.loads(run.stdout.strip().splitlines()[-1])
    doc["process_s"] = time.perf_counter() - began
    return doc


def starts(engines: dict[str, Path], args) -> tuple[str, str, dict]:
    runs: dict[str, list[dict]] = {name: [] for name in engines}
    for rep in range(args.reps):
        for name, where in engines.items():
            runs[name].append(one_start(where, Path(args.kit)))
            s = runs[name][-1]["seconds"]
            print(f"rep {rep} {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in s.items())
                  + f", process {runs[name][-1]['process_s']:.2f} s")
    codes = {json.dumps(r["codes"]) for rs in runs.values() for r in rs}
    assert len(codes) == 1, "the engines decoded different codes"
    results = {}
    for name, rs in runs.items():
        medians = {k: round(statistics.median(r["seconds"][k] for r in rs), 2) for k in STAGES}
        results[name] = {"median_s": medians,
                         "median_to_first_decode_s": round(statistics.median(
                             sum(r["seconds"][k] for k in STAGES[:3]) for r in rs), 2),
                         "median_process_s": round(statistics.median(r["process_s"] for r in rs), 2),
                         "heavy_modules_before_codec": sorted({m for r in rs for m in r["heavy_before_codec"]}),
                         "runs": [{**{k: round(v, 3) for k, v in r["seconds"].items()},
                                   "process": round(r["process_s"], 3)} for r in rs]}
    how = ("each reading a fresh Python process: import the engine, Synthesizer.load of the kit's "
           "target and draft (float32, CPU), a first pcg decode of 2 rows x 16 tokens, then "
           "Xcodec2Codec.load of the kit's codec; stages timed inside, the process from outside; "
           f"engines alternate, {args.reps} of each; medians; every run decoded the same codes")
    return "startup", how, results


BAD_SPEC = ("name: x\nmodels: {target: t, codec: c}\ndecoding: {method: nope}\n"
            "input: {manifests: [m.jsonl]}\noutput: {uri: out}\n")
MISSING_MODEL = ("name: x\nmodels: {target: no-target, draft: no-draft, codec: no-codec}\n"
                 "input: {manifests: [m.jsonl]}\noutput: {uri: out}\n")
ONE_CALL = """
import atexit, json, sys
from engine.cli import main
def report():
    print(json.dumps({"engine": sys.modules["engine"].__file__,
                      "heavy": [m for m in ("torch", "ray") if m in sys.modules]}), file=sys.stderr)
atexit.register(report)
sys.exit(main(sys.argv[1:]))
"""


def one_call(engine_dir: Path, argv: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(engine_dir)}
    began = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", ONE_CALL, *argv], capture_output=True, text=True,
                         env=env, cwd=str(engine_dir))
    seconds = time.perf_counter() - began
    doc = json.loads(run.stderr.strip().splitlines()[-1])
    assert Path(doc["engine"]).is_relative_to(engine_dir), (doc["engine"], engine_dir)
    return {"seconds": seconds, "rc": run.returncode, "heavy": doc["heavy"]}


def cli_starts(engines: dict[str, Path], reps: int) -> tuple[str, str, dict]:
    folder = Path(tempfile.mkdtemp())
    spec, missing = folder / "bad.yaml", folder / "missing-model.yaml"
    spec.write_text(BAD_SPEC)
    missing.write_text(MISSING_MODEL)
    commands = {"--version": ["--version"], "run --help": ["run", "--help"],
                "draft train --help": ["draft", "train", "--help"], "run INVALID.yaml": ["run", str(spec)],
                "run MISSING-MODEL.yaml": ["run", str(missing)]}
    runs = {name: {cmd: [] for cmd in commands} for name in engines}
    for rep in range(reps):
        for cmd, cmd_argv in commands.items():
            for name, where in engines.items():
                runs[name][cmd].append(one_call(where, cmd_argv))
                r = runs[name][cmd][-1]
                print(f"rep {rep} {name} {cmd}: {r['seconds']:.2f} s, rc {r['rc']}, imported {r['heavy']}")
    results = {name: {cmd: {"median_s": round(statistics.median(r["seconds"] for r in rs), 2),
                            "runs_s": [round(r["seconds"], 3) for r in rs],
                            "exit_codes": sorted({r["rc"] for r in rs}),
                            "imported": sorted({m for r in rs for m in r["heavy"]})}
                      for cmd, rs in by_cmd.items()}
               for name, by_cmd in runs.items()}
    how = ("each reading a fresh Python process running engine.cli.main with the command's "
           "arguments, timed from outside (exit included); engines alternate per command, "
           f"{reps} of each; medians; 'imported': which of torch and Ray the process loaded")
    return "cli start", how, results


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kit", default="kit", help="a tiny kit directory (`pcg-synth kit build DIR`)")
    ap.add_argument("--before", default=None, help="directory holding an older engine/ to compare")
    ap.add_argument("--before-label", default="before", help="what --before is (e.g. its commit)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None)
    ap.add_argument("--cli", action="store_true", help="the CLI's answers without a model instead")
    args = ap.parse_args(argv)
    engines = {"this checkout": ROOT}
    if args.before:
        engines = {args.before_label: Path(args.before).resolve(), **engines}
    benchmark, how, results = cli_starts(engines, args.reps) if args.cli else starts(engines, args)
    doc = {"benchmark": benchmark, "machine": describe("cpu"), "how": how,
           "before_label": args.before_label if args.before else None, "results": results}
    write_result(doc, args.out)
    return doc


if __name__ == "__main__":
    main()
