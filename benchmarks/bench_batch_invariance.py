"""Do a row's codes depend on the rows decoded beside it? Per dtype, per rule.

The same 8 texts (same seeds) are decoded at batch sizes 1, 3 and 8 with the tiny kit on this
machine; rows whose codes differ from the batch-1 decode are counted. Draws never depend on the
batch (counter-based randomness); only the logits can, where a kernel's reduction order depends
on the number of rows. A reading of this machine's kernels, not a guarantee for others.

    python benchmarks/bench_batch_invariance.py --kit kit --out benchmarks/results/batch_invariance_cpu_tiny.json
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts OpenMP

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine.api import Synthesizer  # noqa: E402
from engine.bench.presets import tiny_kit  # noqa: E402
from engine.bench.texts import BENCH_TEXTS  # noqa: E402
from engine.config import DecodingSettings  # noqa: E402
from engine.records import SynthesisItem  # noqa: E402

from machine import describe, write_result  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kit")
    p.add_argument("--dtypes", default="bfloat16,float32,float64")
    p.add_argument("--methods", default="ar,exact,pcg")
    p.add_argument("--batch-sizes", default="1,3,8")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--out")
    a = p.parse_args()
    kit = tiny_kit(a.kit)
    items = [SynthesisItem(text=t, id=f"i{i}") for i, t in enumerate(BENCH_TEXTS)]
    batches = [int(b) for b in a.batch_sizes.split(",")]
    readings = []
    for dtype in a.dtypes.split(","):
        synth = Synthesizer.load(kit / "target", draft=kit / "draft", device="cpu", dtype=dtype)
        for method in a.methods.split(","):
            settings = DecodingSettings(method=method, max_new_tokens=a.max_new_tokens, seed=3)
            codes = {b: [r.codes for r in synth.synthesize(items, settings, batch_size=b)[0]] for b in batches}
            differing = {str(b): sum(c != r for c, r in zip(codes[b], codes[batches[0]])) for b in batches[1:]}
            readings.append({"dtype": dtype, "method": method, "prepacked": synth.target.model.prepacked,
                             "rows": len(items), f"rows_differing_from_batch_{batches[0]}": differing})
            print(readings[-1], flush=True)
    write_result({"benchmark": "batch invariance of decoded codes (tiny kit)",
                  "how": "python benchmarks/bench_batch_invariance.py " + " ".join(sys.argv[1:]),
                  "machine": describe(), "kit": str(kit), "max_new_tokens": a.max_new_tokens,
                  "readings": readings}, a.out)


if __name__ == "__main__":
    main()
