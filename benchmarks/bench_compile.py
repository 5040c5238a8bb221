"""Does torch.compile make the decode step faster? llasa-1b-shape target, eager vs compiled.

One target with Llasa-1B's shape (random weights, the preset's recipe) is timed for the step
shapes decoding uses (batch 1 and 8; 1 token per row as `ar` and a draft step, 4 as a gamma-3
verify; 128 cached positions) three ways: eager with plain weights, compiled
(`LlamaLM.compile_step`: inductor; on CPU with weight freezing, which packs the weights itself),
and eager with prepacked weights (the CPU default), each on a freshly built target. Each
compiled shape's first call (the compilation) is reported separately.

    python benchmarks/bench_compile.py --out benchmarks/results/compile_cpu.json
    python benchmarks/bench_compile.py --device cuda --modes inductor,cudagraphs \
        --out benchmarks/results/compile_<gpu>.json

Medians of 10 calls after 3 untimed ones. OMP_WAIT_POLICY=PASSIVE unless set.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts OpenMP

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine.bench.presets import llasa_1b_shape  # noqa: E402
from engine.decoding.cost import forward_timer, median_time  # noqa: E402
from engine.models.device import resolve_dtype  # noqa: E402
from engine.models.llama import prepack_supported  # noqa: E402

from machine import describe, write_result  # noqa: E402

SHAPES = ((1, 1), (1, 4), (8, 1), (8, 4))  # (batch, tokens per row)


def timings(model, device: torch.device, label: str, context: int) -> list[dict]:
    out = []
    for batch, width in SHAPES:
        step = forward_timer(model, batch, width, context, "all")
        start = time.perf_counter()
        step()  # a compiled model compiles this shape here
        first_s = time.perf_counter() - start
        ms = median_time(step, device, 10, warmup=3) * 1e3
        out.append({"way": label, "batch": batch, "width": width, "step_ms": ms, "first_call_s": first_s})
        print(out[-1], flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--modes", default="inductor", help="compile modes to time (inductor, cudagraphs)")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--out")
    a = p.parse_args()
    device = torch.device(a.device)
    dtype = resolve_dtype(a.dtype, device)
    rows = []
    if prepack_supported(device, dtype):  # each way on a freshly built target, in its own memory
        target, _ = llasa_1b_shape(device, dtype, prepack=True)
        rows += timings(target.model, device, "eager, prepacked", a.context)
        del target
    for mode in ["none"] + a.modes.split(","):
        target, _ = llasa_1b_shape(device, dtype, prepack=False)
        target.model.compile_step(mode)
        rows += timings(target.model, device, "eager" if mode == "none" else f"compiled ({mode})", a.context)
        del target
        torch._dynamo.reset()
    write_result({"benchmark": "decode step of the llasa-1b-shape target: eager vs torch.compile",
                  "how": "python benchmarks/bench_compile.py " + " ".join(sys.argv[1:]),
                  "machine": describe(), "dtype": str(dtype).removeprefix("torch."),
                  "context": a.context, "torch": torch.__version__, "readings": rows}, a.out)


if __name__ == "__main__":
    main()
