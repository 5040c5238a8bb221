"""Fused projections (`LlamaLM.fuse_projections`: one q/k/v product and one gate/up product per
layer, and one rotation for the query and key heads) against separate ones, side by side in one
process on the same weights.

What a host-bound decode step pays for is its ops (on a GPU each is at least one kernel launch;
the H100 profile in results/job_throughput_cuda_llasa_1b_shape_h100_probe.md found a round bound
by the host), so the file records torch ops per forward (a device-independent count) next to the
times measured here:

1. one decode forward (1 token per row, 128 cached positions, logits of the last position) of
   each model, fused and separate, timed in turns (`interleaved_medians`), at several batch sizes;
2. whole decoding of the tiny kit (`ar` and `pcg`, `BENCH_TEXTS`: the quickstart's texts, batch 8), fused and separate
   synthesizers in turns, with the codes each gives.

    python benchmarks/bench_fused_projections.py --out benchmarks/results/fused_projections_cpu.json

OpenMP's wait policy (`OMP_WAIT_POLICY`) is left as found and recorded: with `PASSIVE` every op
wakes sleeping threads, which makes each op dearer than with OpenMP's default.
`--llasa` adds the llasa-1b-shape target (random weights, the machine's `dtype: auto`): about
6 GB per copy in float32, two copies; the embedding table and head are shared between them.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import DecodingSettings, Synthesizer  # noqa: E402
from engine.bench.presets import llasa_1b_shape, tiny_kit  # noqa: E402
from engine.bench.texts import BENCH_TEXTS  # noqa: E402
from engine.decoding.cost import forward_timer, interleaved_medians  # noqa: E402
from engine.models.device import auto_dtype  # noqa: E402
from engine.models.llama import LlamaLM, prepack_supported  # noqa: E402
from engine.models.loading import load_model  # noqa: E402

from machine import describe, write_result  # noqa: E402

CPU = torch.device("cpu")
CONTEXT = 128


def twin(model: LlamaLM) -> LlamaLM:
    """A copy of `model` that shares its embedding table and head (which fusing leaves alone)."""
    shared = {id(model.model.embed_tokens.weight): model.model.embed_tokens.weight, id(model.head): model.head}
    return copy.deepcopy(model, memo=shared)


def ops_per_forward(run) -> dict:
    """Torch ops of one call: top-level (what Python dispatches) and all (with their children)."""
    run()
    with profile() as prof:
        run()
    events = prof.events()
    return {"top_level": sum(e.cpu_parent is None for e in events), "all": len(events)}


def forwards(models: dict[str, tuple[LlamaLM, LlamaLM]], batches: list[int], reps: int) -> list[dict]:
    out = []
    for name, (separate, fused) in models.items():
        for batch in batches:
            runs = {kind: forward_timer(m, batch, 1, CONTEXT, "last")
                    for kind, m in (("separate", separate), ("fused", fused))}
            times = interleaved_medians(runs, CPU, reps, warmup=3)
            row = {"model": name, "batch": batch, "separate_ms": times["separate"] * 1e3,
                   "fused_ms": times["fused"] * 1e3, "fused_vs_separate": times["fused"] / times["separate"],
                   "ops_separate": ops_per_forward(runs["separate"]), "ops_fused": ops_per_forward(runs["fused"])}
            out.append(row)
            print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    return out


def decoding(kit: Path, reps: int, batch: int) -> list[dict]:
    synths = {}
    for fuse in (False, True):
        target = load_model(kit / "target", fuse=fuse)
        draft = load_model(kit / "draft", tokenizer=target.tokenizer, fuse=fuse)
        synths["fused" if fuse else "separate"] = Synthesizer(target, draft)
    texts = (BENCH_TEXTS * 3)[:3 * batch]
    out = []
    for method in ("ar", "pcg"):
        settings = DecodingSettings(method=method, theta=0.4, max_new_tokens=100, temperature=0.8, seed=0)
        rates: dict[str, list[float]] = {k: [] for k in synths}
        codes = {}
        for kind in synths:  # warm-up
            synths[kind].synthesize(texts[:batch], settings, batch_size=batch)
        for rep in range(reps):
            for kind in (list(synths) if rep % 2 == 0 else list(synths)[::-1]):
                start = time.perf_counter()
                results, _ = synths[kind].synthesize(texts, settings, batch_size=batch)
                rates[kind].append(sum(len(r.codes) for r in results) / (time.perf_counter() - start))
                codes[kind] = [r.codes for r in results]
        med = {k: statistics.median(v) for k, v in rates.items()}
        row = {"method": method, "batch": batch, "rows": len(texts), "separate_tokens_per_s": med["separate"],
               "fused_tokens_per_s": med["fused"], "fused_vs_separate": med["fused"] / med["separate"],
               "same_codes": codes["fused"] == codes["separate"], "runs": rates}
        out.append(row)
        print({k: v for k, v in row.items() if k != "runs"}, flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kit", default=None, help="the tiny kit's directory (default: ./kit, built if absent)")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--reps", type=int, default=30, help="timed forwards per model, batch and kind")
    p.add_argument("--decode-reps", type=int, default=4)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--llasa", action="store_true", help="also the llasa-1b-shape target")
    p.add_argument("--out")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    kit = tiny_kit(a.kit)
    dtype, why = auto_dtype(CPU)
    models = {}
    for name in ("target", "draft"):
        separate = load_model(kit / name, fuse=False).model
        models[f"tiny kit {name}"] = (separate, load_model(kit / name).model)
    if a.llasa:  # separate and fused twins of one target, in the machine's auto dtype
        target = llasa_1b_shape(CPU, dtype, prepack=False, fuse=False)[0]  # the draft is dropped
        separate = target.model
        fused = twin(separate)
        fused.fuse_projections()
        for m in (separate, fused):
            if prepack_supported(CPU, dtype):  # as a decoding model is
                m.prepack()
        models["llasa-1b-shape target"] = (separate, fused)
    doc = {"benchmark": "fused q/k/v and gate/up projections against separate ones",
           "how": "python benchmarks/bench_fused_projections.py " + " ".join(sys.argv[1:]),
           "machine": {**describe(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY") or "unset (OpenMP default)"},
           "dtype_auto": f"{str(dtype).removeprefix('torch.')}: {why}",
           "forward": f"one decode forward: 1 token per row at position {CONTEXT}, logits of the last "
                      f"position, medians of {a.reps} timed calls per kind, kinds in turns",
           "forwards": forwards(models, [int(b) for b in a.batches.split(",")], a.reps),
           "decoding": decoding(kit, a.decode_reps, 8)}
    write_result(doc, a.out)


if __name__ == "__main__":
    main()
