"""Superseded by `pcg-synth bench` (engine/bench/); kept as a thin wrapper with the committed
CPU run's defaults. Any `pcg-synth bench` option may follow and overrides them:

    python benchmarks/bench_decoding.py                    # = the command below
    pcg-synth bench --preset tiny --kit kit --device cpu --batch-sizes 1,8,32 --gammas 3 \
        --thetas 0.4 --reps 3 --out benchmarks/results/decoding_cpu_tiny.json
"""

from __future__ import annotations

import argparse
import shlex
import sys

from engine.bench.cli import register

DEFAULTS = ["bench", "--preset", "tiny", "--kit", "kit", "--device", "cpu", "--batch-sizes", "1,8,32",
            "--gammas", "3", "--thetas", "0.4", "--reps", "3",
            "--out", "benchmarks/results/decoding_cpu_tiny.json"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pcg-synth")
    register(parser.add_subparsers(dest="command", required=True))
    argv = DEFAULTS + list(sys.argv[1:] if argv is None else argv)  # a later option wins
    args = parser.parse_args(argv)
    args.how = "pcg-synth " + " ".join(shlex.quote(a) for a in argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
