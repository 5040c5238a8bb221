"""Why `dtype: auto` is bfloat16 on CPUs with native bf16, and why weights are prepacked there
(on a CPU without oneDNN's bfloat16 path, e.g. AVX2 only, the bfloat16 readings are plain only).

Two readings on this machine, both at Llasa-1B's shape (hidden 2048, MLP 8192):

1. one MLP-shaped matmul (rows x 2048 @ 2048 x 8192) for 1, 2, 4, 8 and 16 rows, in float32 and
   bfloat16, with the weight as a plain tensor (ATen re-lays it out for its kernel on every call)
   and prepacked in oneDNN's layout (`PackedLinear`);
2. one `ar` decode step of a 16-layer llasa-1b-shape target (batch 1, 128 cached positions), plain
   and prepacked, in bfloat16 and float32.

    python benchmarks/bench_cpu_dtype.py --out benchmarks/results/cpu_dtype.json

Medians of 30 calls (10 for whole steps) after 5 untimed ones. OMP_WAIT_POLICY=PASSIVE unless set.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts OpenMP

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine.bench.presets import llasa_1b_shape  # noqa: E402
from engine.decoding.cost import forward_timer, median_time  # noqa: E402
from engine.models.device import auto_dtype  # noqa: E402
from engine.models.llama import PackedLinear, prepack_supported  # noqa: E402

from machine import describe, write_result  # noqa: E402

CPU = torch.device("cpu")


def matmuls(rows: list[int]) -> list[dict]:
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        weight = torch.randn(8192, 2048, generator=torch.Generator().manual_seed(0)).to(dtype)
        packed = PackedLinear(weight) if prepack_supported(CPU, dtype) else None
        for n in rows:
            x = torch.randn(n, 2048).to(dtype)
            with torch.inference_mode():
                plain_s = median_time(lambda x=x, w=weight: F.linear(x, w), CPU, 30, warmup=5)
                packed_s = (median_time(lambda x=x, m=packed: m(x), CPU, 30, warmup=5)
                            if packed else None)
            out.append({"dtype": str(dtype).removeprefix("torch."), "rows": n, "plain_ms": plain_s * 1e3,
                        "prepacked_ms": packed_s * 1e3 if packed_s else None})
            print(out[-1], flush=True)
    return out


def steps() -> list[dict]:
    out = []
    for dtype in (torch.bfloat16, torch.float32):
        target, _ = llasa_1b_shape(CPU, dtype, prepack=False)
        model = target.model
        with torch.inference_mode():
            plain_s = median_time(forward_timer(model, 1, 1, 128, "all"), CPU, 10, warmup=3)
            packed_s = None
            if prepack_supported(CPU, dtype):  # oneDNN has no bf16 path on an AVX2-only CPU
                model.prepack()
                packed_s = median_time(forward_timer(model, 1, 1, 128, "all"), CPU, 10, warmup=3)
        out.append({"dtype": str(dtype).removeprefix("torch."), "plain_ms": plain_s * 1e3,
                    "prepacked_ms": packed_s * 1e3 if packed_s else None,
                    "step_weight_bytes": model.step_weight_bytes()})
        print(out[-1], flush=True)
        del target, model
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,2,4,8,16")
    p.add_argument("--no-steps", action="store_true", help="matmuls only (no 1B-shape model)")
    p.add_argument("--out")
    a = p.parse_args()
    auto, why = auto_dtype(CPU)
    doc = {"benchmark": "CPU matmul and decode-step cost by dtype, plain vs prepacked weights",
           "how": "python benchmarks/bench_cpu_dtype.py " + " ".join(sys.argv[1:]),
           "machine": {**describe(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")},
           "dtype_auto": f"{str(auto).removeprefix('torch.')}: {why}",
           "matmul_2048x8192": matmuls([int(r) for r in a.rows.split(",")])}
    if not a.no_steps:
        doc["llasa_1b_shape_ar_step_batch1_context128"] = steps()
    write_result(doc, a.out)


if __name__ == "__main__":
    main()
