"""What int8 draft weights (`models.draft_weights: int8`, `Int8Linear`) buy on this CPU.

Readings, draft weights native (in `dtype: auto`'s precision on this CPU: bfloat16 where it has
native bf16 instructions, else float32; prepacked where oneDNN can) against int8, interleaved:

1. the weights of one llasa-1b-shape draft step (3 layers' projections + the 65,537-row head),
   each a distinct tensor so that none stays cached between calls, for 1, 2, 4, 8 rows: native
   (`PackedLinear`, or plain `F.linear` where prepacking is not supported), `Int8Linear`, and
   ATen's weight-only `_weight_int8pack_mm`;
2. a whole decode step (batch 1 and 8, 128 cached positions) of the llasa-1b-shape draft (layers
   0, 1, 15 of the preset's target) and of the tiny kit's draft (`--kit DIR`, default ./kit when
   it is one, else built into the cache), native and int8.

    python benchmarks/bench_int8_draft.py --out benchmarks/results/int8_draft_cpu.json

Medians of 20 calls after 3 untimed ones. OMP_WAIT_POLICY=PASSIVE unless set.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts OpenMP

import argparse  # noqa: E402
import sys  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine.bench.presets import llasa_1b_shape, tiny_kit  # noqa: E402
from engine.decoding.cost import forward_timer, interleaved_medians  # noqa: E402
from engine.models.device import auto_dtype  # noqa: E402
from engine.models.llama import PackedLinear, prepack_supported  # noqa: E402
from engine.models.loading import load_model  # noqa: E402
from engine.models.quant import Int8Linear  # noqa: E402

from machine import describe, write_result  # noqa: E402

CPU = torch.device("cpu")
NATIVE = auto_dtype(CPU)[0]
NATIVE_NAME = "bf16" if NATIVE == torch.bfloat16 else str(NATIVE).removeprefix("torch.")  # as in result keys
LAYER = [(2048, 2048), (512, 2048), (512, 2048), (2048, 2048), (8192, 2048), (8192, 2048), (2048, 8192)]


def matmuls(rows: list[int]) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(s, generator=gen).mul_(0.02).to(NATIVE) for s in LAYER * 3 + [(65537, 2048)]]
    packs = prepack_supported(CPU, NATIVE)
    native = [PackedLinear(w) for w in weights] if packs else [partial(F.linear, weight=w) for w in weights]
    label = f"{NATIVE_NAME}_{'prepacked' if packs else 'plain'}"  # bf16_prepacked, float32_prepacked, ...
    int8 = [Int8Linear(w) for w in weights]
    pack8 = []
    for w in weights:
        scale = w.float().abs().amax(1) / 127
        pack8.append(((w.float() / scale[:, None]).round().to(torch.int8), scale.to(NATIVE)))
    out = []
    for n in rows:
        x = torch.randn(n, 8192).to(NATIVE)
        xs = {k: x[:, :k].contiguous() for k in (2048, 8192)}
        fns = {label: lambda xs=xs: [m(xs[w.shape[1]]) for m, w in zip(native, weights)],
               "int8_linear": lambda xs=xs: [m(xs[m.in_features]) for m in int8],
               "aten_weight_int8pack_mm": lambda xs=xs: [torch.ops.aten._weight_int8pack_mm(xs[q.shape[1]], q, s)
                                                         for q, s in pack8]}
        with torch.inference_mode():
            t = interleaved_medians(fns, CPU, 20, warmup=3)
        out.append({"rows": n, **{k + "_ms": v * 1e3 for k, v in t.items()}})
        print(out[-1], flush=True)
    return out


def steps(name: str, native, int8) -> list[dict]:
    out = []
    for batch in (1, 8):
        fns = {"native": forward_timer(native, batch, 1, 128, "last"),
               "int8": forward_timer(int8, batch, 1, 128, "last")}
        t = interleaved_medians(fns, CPU, 20, warmup=3)
        out.append({"draft": name, "batch": batch, "native_ms": t["native"] * 1e3, "int8_ms": t["int8"] * 1e3,
                    "ratio": t["int8"] / t["native"], "native_weight_bytes": native.step_weight_bytes(),
                    "int8_weight_bytes": int8.step_weight_bytes(), "dtype": str(native.dtype).removeprefix("torch.")})
        print(out[-1], flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,2,4,8")
    p.add_argument("--kit", help="a tiny kit directory (default ./kit when it is one, else built)")
    p.add_argument("--out")
    a = p.parse_args()
    doc = {"benchmark": "int8 against native draft weights: matmuls and decode steps",
           "how": "python benchmarks/bench_int8_draft.py " + " ".join(sys.argv[1:]),
           "machine": {**describe(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")},
           "native_dtype": str(NATIVE).removeprefix("torch."),
           f"matmuls_one_draft_step_{NATIVE_NAME}": matmuls([int(r) for r in a.rows.split(",")])}
    native = llasa_1b_shape(CPU, NATIVE)[1]  # the target is dropped at once (float32: 6 GB)
    int8 = llasa_1b_shape(CPU, NATIVE, draft_weights="int8")[1]
    doc["steps"] = steps("llasa-1b-shape (layers 0, 1, 15)", native.model, int8.model)
    del native, int8
    kit = tiny_kit(a.kit)
    doc["steps"] += steps("tiny kit", load_model(kit / "draft", CPU, NATIVE).model,
                          load_model(kit / "draft", CPU, NATIVE, weights="int8").model)
    write_result(doc, a.out)


if __name__ == "__main__":
    main()
