"""What a fresh process pays to build a Llasa-style tokenizer (65,549 added tokens):
transformers' own `AutoTokenizer.from_pretrained` against the engine's `load_tokenizer` (no
rebuild of the added tokens where tokenizer.json holds them all; `engine/models/loading.py`), for
the kit's files as this transformers saves them and in transformers 4's layout (the config lists
every added token; `engine/kit/tokenizer.py: write_transformers4_layout`).

Every reading is its own Python process (as a Ray worker or a CLI call is), which imports
transformers' tokenizer and Llama config modules first, untimed, then times the one load. Loads
alternate, `--reps` of each; medians reported.

    python benchmarks/bench_tokenizer_load.py --kit kit --out benchmarks/results/tokenizer_load_cpu_avx2.json
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine.kit.tokenizer import write_transformers4_layout  # noqa: E402

from machine import describe, write_result  # noqa: E402

ONE_LOAD = """
import sys, time
from pathlib import Path
from transformers import AutoTokenizer, LlamaConfig, PreTrainedTokenizerFast  # imported before timing
from engine.models.loading import load_tokenizer
path = Path(sys.argv[2])
start = time.perf_counter()
tok = AutoTokenizer.from_pretrained(str(path)) if sys.argv[1] == "transformers" else load_tokenizer(path)
print(time.perf_counter() - start, len(tok))
"""
LOADERS = ("transformers", "engine")


def one_load(loader: str, path: Path) -> tuple[float, int]:
    run = subprocess.run([sys.executable, "-c", ONE_LOAD, loader, str(path)], capture_output=True, text=True,
                         check=True)
    seconds, size = run.stdout.split()[-2:]
    return float(seconds), int(size)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kit", default="kit", help="a tiny kit directory (`pcg-synth kit build DIR`)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        kit_files = Path(args.kit) / "target"
        layouts = {"kit (this transformers)": kit_files,
                   "transformers 4 layout (the config lists every added token)":
                       write_transformers4_layout(kit_files, Path(tmp) / "t4")}
        results = {}
        for name, path in layouts.items():
            seconds = {loader: [] for loader in LOADERS}
            sizes = set()
            for _ in range(args.reps):
                for loader in LOADERS:
                    s, size = one_load(loader, path)
                    seconds[loader].append(round(s, 3))
                    sizes.add(size)
            assert len(sizes) == 1, f"the loads disagree on the vocabulary size: {sizes}"
            medians = {loader: statistics.median(v) for loader, v in seconds.items()}
            results[name] = {"vocabulary": sizes.pop(), "seconds": seconds, "median_s": medians,
                             "saved_s": round(medians["transformers"] - medians["engine"], 2)}
            print(f"{name}: transformers {medians['transformers']:.2f} s, engine {medians['engine']:.2f} s")
    doc = {"benchmark": "tokenizer_load", "machine": describe("cpu"),
           "how": "each load in a fresh Python process after importing transformers' tokenizer and Llama "
                  "config modules "
                  f"(untimed); loaders alternate, {args.reps} of each; medians",
           "results": results}
    write_result(doc, args.out)
    return doc


if __name__ == "__main__":
    main()
