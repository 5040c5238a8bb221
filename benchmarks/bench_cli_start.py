"""How long the command line takes to answer when it needs no model: `pcg-synth --version`,
`run --help`, `draft train --help`, and the refusal of an invalid job spec. Each reading is a
fresh Python process running the CLI's `main` (what the `pcg-synth` script runs), timed from
outside, exit included; it also records whether torch or Ray was imported.

With `--before DIR` (an older engine: `git archive COMMIT | tar -x -C DIR`) the same commands run
that code instead, alternating with this checkout's, `--reps` of each; medians reported.

    python benchmarks/bench_cli_start.py --before /tmp/before --before-label 5bbec71 \\
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
BAD_SPEC = ("name: x\nmodels: {target: t, codec: c}\ndecoding: {method: nope}\n"
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


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default=None, help="directory holding an older engine/ to compare")
    ap.add_argument("--before-label", default="before", help="what --before is (e.g. its commit)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    spec = Path(tempfile.mkdtemp()) / "bad.yaml"
    spec.write_text(BAD_SPEC)
    commands = {"--version": ["--version"], "run --help": ["run", "--help"],
                "draft train --help": ["draft", "train", "--help"], "run INVALID.yaml": ["run", str(spec)]}
    engines = {"this checkout": ROOT}
    if args.before:
        engines = {args.before_label: Path(args.before).resolve(), **engines}
    runs = {name: {cmd: [] for cmd in commands} for name in engines}
    for rep in range(args.reps):
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
    doc = {"benchmark": "cli start", "machine": describe("cpu"),
           "how": ("each reading a fresh Python process running engine.cli.main with the command's "
                   "arguments, timed from outside (exit included); engines alternate per command, "
                   f"{args.reps} of each; medians; 'imported': which of torch and Ray the process loaded"),
           "before_label": args.before_label if args.before else None,
           "results": results}
    write_result(doc, args.out)
    return doc


if __name__ == "__main__":
    main()
