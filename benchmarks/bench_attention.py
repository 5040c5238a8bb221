"""Attention on a CPU: torch's SDPA as called for grouped-query attention, against the same SDPA
with each KV head's query heads folded into its query positions, and the plain-op attention CUDA
uses, side by side.

Shapes are the decode steps and prefills of the kit (4 query heads over 2 KV heads, head size 32)
and of llasa-1b-shape (Llasa-1B's 32 over 8, head size 64): a decode round's draft steps feed one
or two positions per row, its target verify gamma + 1, an `ar` step one; keys are a bucket's
length, each row masked to its own length. Per shape: the median milliseconds of each, in turns,
and how far each lands from `enable_gqa` SDPA (largest absolute difference; 0 is bit for bit).

    python benchmarks/bench_attention.py --out benchmarks/results/attention_cpu
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import cpu_headline, describe, how_line, median_in_turns, write_or_print  # noqa: E402

# (label, batch, query heads, KV heads, positions, keys, head size)
SHAPES = [
    ("kit decode", 1, 4, 2, 1, 256, 32), ("kit decode", 8, 4, 2, 1, 256, 32), ("kit decode", 32, 4, 2, 1, 256, 32),
    ("kit verify", 8, 4, 2, 4, 256, 32), ("kit verify", 32, 4, 2, 4, 256, 32),
    ("1b decode", 1, 32, 8, 1, 512, 64), ("1b decode", 8, 32, 8, 1, 512, 64), ("1b decode", 32, 32, 8, 1, 512, 64),
    ("1b draft", 8, 32, 8, 2, 512, 64),
    ("1b verify", 1, 32, 8, 4, 512, 64), ("1b verify", 8, 32, 8, 4, 512, 64), ("1b verify", 32, 32, 8, 4, 512, 64),
    ("1b prefill", 8, 32, 8, 100, 128, 64), ("1b prefill", 2, 32, 8, 400, 512, 64),
]


def timed(q, k, v, mask, reps: int) -> tuple[dict, dict]:
    """Median milliseconds of each attention, in turns after a warm-up call, and the largest
    absolute difference of the others from SDPA's output."""
    import torch
    import torch.nn.functional as F

    from engine.models.attention import folded_attention, grouped_attention

    fns = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True),
           "folded": lambda: folded_attention(q, k, v, mask),
           "grouped": lambda: grouped_attention(q, k, v, mask)}
    with torch.inference_mode():
        ref = fns["sdpa"]().double()
        diff = {name: float((fn().double() - ref).abs().max()) for name, fn in fns.items() if name != "sdpa"}
        seconds = median_in_turns(fns, reps)
    return {name: 1e3 * t for name, t in seconds.items()}, diff


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--reps", type=int, default=15, help="timed calls of each, in turns")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", help="result stem: writes STEM.json and STEM.md")
    args = ap.parse_args()
    import torch

    from engine.models.attention import fold_pays
    from engine.models.malloc import keep_freed_memory

    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as a decoding process has it
    load0 = round(os.getloadavg()[0], 2)
    gen = torch.Generator().manual_seed(0)
    readings = []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for label, b, heads, kv_heads, t, length, d in SHAPES:
            # queries as a layer makes them: [b, T, H, D] transposed to [b, H, T, D]
            q = torch.randn(b, t, heads, d, generator=gen).to(dtype).transpose(1, 2)
            k, v = (torch.randn(b, kv_heads, length, d, generator=gen).to(dtype) for _ in range(2))
            lo = min(length // 2, length - t)  # each row's first position fed
            pos = torch.randint(lo, length - t + 1, (b, 1), generator=gen) + torch.arange(t)
            mask = (torch.arange(length) <= pos[..., None])[:, None]  # [b, 1, T, L]
            ms, diff = timed(q, k, v, mask, args.reps)
            readings.append({"shape": label, "dtype": dtype_name, "batch": b, "heads": heads, "kv_heads": kv_heads,
                             "positions": t, "keys": length, "head_dim": d, "ms": ms,
                             "folded_speedup": ms["sdpa"] / ms["folded"], "max_abs_diff_vs_sdpa": diff,
                             "engine_folds": fold_pays(dtype, t)})
            print(readings[-1], flush=True)
    doc = {"benchmark": "CPU attention: SDPA, folded SDPA, plain ops", "how": how_line(sys.argv),
           "machine": describe("cpu"), "threads": args.threads,
           "load_average": [load0, round(os.getloadavg()[0], 2)], "readings": readings}
    lines = [cpu_headline("Attention on a CPU: SDPA, SDPA with the query heads folded, plain ops", doc["machine"],
                          args.threads, doc["load_average"]), "", f"`{doc['how']}`", "",
             "| shape | dtype | batch | heads / KV heads | positions | keys | SDPA ms | folded ms | plain ops ms "
             "| folded vs SDPA | the engine folds | largest difference from SDPA: folded / plain ops |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in readings:
        ms, diff = r["ms"], r["max_abs_diff_vs_sdpa"]
        lines.append(f"| {r['shape']} | {r['dtype']} | {r['batch']} | {r['heads']} / {r['kv_heads']} "
                     f"| {r['positions']} | {r['keys']} | {ms['sdpa']:.3f} | {ms['folded']:.3f} | {ms['grouped']:.3f} "
                     f"| {r['folded_speedup']:.1f}x | {'yes' if r['engine_folds'] else 'no'} "
                     f"| {diff['folded']:.2g} / {diff['grouped']:.2g} |")
    lines += ["", f"Median of {args.reps} calls of each, in turns, after one warm-up call (the first call's "
              "output is compared); random queries, keys and values, each row's keys masked at a random length (at "
              "least half the keys where the positions fed leave room). SDPA: "
              "`F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)`; folded: "
              "`engine.models.attention.folded_attention` (the engine's CPU attention folds where "
              "`fold_pays` says: the column 'the engine folds'); plain ops: `grouped_attention` "
              "(the engine's CUDA attention, scores and softmax in float32). Differences are the largest absolute "
              "difference from SDPA's output over the tensor (0: bit for bit)."]
    write_or_print(args.out, doc, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
