"""Draft acceptance before and after distillation, on the tiny kit, through the user's path:
target samples written by the engine (`ar`, Parquet) -> `draft init` (layers 0,1,3 of the
target) -> `draft train` (KD, embeddings and head frozen) -> `draft eval` on held-out texts
(disjoint from the training texts), compared with the untrained subset and the kit's own draft
(distilled for only a few steps inside `kit build`).

    python benchmarks/bench_draft.py --kit kit --out benchmarks/results/draft_cpu_tiny.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import DecodingSettings, Synthesizer  # noqa: E402
from engine.draft.evaluate import HELDOUT_TEXTS, ModelLoading, evaluate_drafts  # noqa: E402
from engine.draft.init import init_draft  # noqa: E402
from engine.draft.run import train_draft  # noqa: E402
from engine.draft.settings import TrainSettings  # noqa: E402
from engine.io.dataset import AudioRow, build_table, write_parquet  # noqa: E402
from engine.kit.draft import KIT_TRAIN_TEXTS  # noqa: E402

from machine import describe, write_result  # noqa: E402

LAYERS = [0, 1, 3]


def target_samples(target: Path, seeds: int, max_new: int, out: Path) -> dict:
    """`seeds` samples of every training text from the target (`ar`), as the engine writes them."""
    synth = Synthesizer.load(target, device="cpu", dtype="float32", batch_size=32)
    rows = []
    for seed in range(seeds):
        settings = DecodingSettings(method="ar", max_new_tokens=max_new, seed=100 + seed)
        results, _ = synth.synthesize(KIT_TRAIN_TEXTS, settings)
        rows += [AudioRow(result=r) for r in results]
    write_parquet(build_table(rows, settings), out)
    return {"rows": len(rows), "codes": sum(len(r.result.codes) for r in rows)}


def markdown(doc: dict) -> str:
    s = doc["settings"]
    lines = [f"Draft acceptance on the tiny kit ({doc['machine']['cpu']}, CPU float32): {len(LAYERS)}-layer "
             f"subset (target layers {LAYERS}), held-out texts {s['eval']['texts']}, gamma {s['eval']['gamma']}, "
             f"theta {s['eval']['theta']}, temperature {s['eval']['temperature']}.", "",
             "| draft | method | mean accepted length | acceptance | by position |", "|---|---|---|---|---|"]
    for name, figures in doc["drafts"].items():
        for method, f in figures.items():
            per = " ".join(f"{a:.2f}" for a in f["acceptance_per_position"])
            lines.append(f"| {name} | {method} | {f['mean_accepted_length']:.3f} | {f['acceptance']:.3f} | {per} |")
    t = doc["training"]
    lines += ["", f"Training: {t['steps']} steps of {t['batch_size']} sequences, KD loss {t['loss_first']:.3f} -> "
              f"{t['loss_last']:.3f}, held-out acceptance (1 - TV) {t['heldout_acceptance_first']:.3f} -> "
              f"{t['heldout_acceptance_last']:.3f}, {t['seconds']:.0f} s.", "", f"How: `{doc['how']}`"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kit", default="kit")
    ap.add_argument("--seeds", type=int, default=4, help="target samples per training text")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--eval-max-new-tokens", type=int, default=96)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    kit = Path(args.kit)
    target = kit / "target"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        start = time.perf_counter()
        data = target_samples(target, args.seeds, args.max_new_tokens, tmp / "samples.parquet")
        init = init_draft(target, tmp / "init", layers=LAYERS, progress=False)
        settings = TrainSettings(data=str(tmp / "samples.parquet"), draft=str(init), target=str(target),
                                 out=str(tmp / "trained"), steps=args.steps, batch_size=args.batch_size,
                                 lr=args.lr, warmup_steps=20, heldout_fraction=0.1, eval_every=args.steps // 3,
                                 checkpoint_every=0, cache_target=True, device="cpu", seed=0)
        t0 = time.perf_counter()
        train_draft(settings, progress=False)
        seconds = time.perf_counter() - t0
        log = [json.loads(x) for x in (tmp / "trained" / "train_log.jsonl").read_text().splitlines()]
        evals = [r for r in log if "heldout_acceptance" in r]
        losses = [r["loss"] for r in log if "loss" in r]
        result = evaluate_drafts(target, [init, kit / "draft", tmp / "trained"], HELDOUT_TEXTS,
                                 ("exact", "pcg"), DecodingSettings(max_new_tokens=args.eval_max_new_tokens),
                                 ModelLoading(device="cpu", dtype="float32"), progress=True)
    names = {str(init): "untrained subset", str(kit / "draft"): "kit draft (24 KD steps in kit build)",
             str(tmp / "trained"): f"distilled here ({args.steps} KD steps)"}
    kit_info = json.loads((kit / "kit.json").read_text())
    doc = {
        "benchmark": "draft acceptance before/after distillation (tiny kit)",
        "how": "python " + " ".join(sys.argv),
        "machine": describe("cpu"),
        "models": {"target": str(target), "kit_sha256": kit_info["sha256"], "draft_layers": LAYERS},
        "settings": {"data": {"texts": len(KIT_TRAIN_TEXTS), "seeds": args.seeds, **data,
                              "max_new_tokens": args.max_new_tokens},
                     "eval": result["settings"]},
        "training": {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
                     "loss_first": losses[0], "loss_last": losses[-1],
                     "heldout_acceptance_first": evals[0]["heldout_acceptance"],
                     "heldout_acceptance_last": evals[-1]["heldout_acceptance"],
                     "seconds": round(seconds, 1), "data_and_init_seconds": round(t0 - start, 1)},
        "drafts": {names[k]: v for k, v in result["drafts"].items()},
    }
    write_result(doc, args.out)
    Path(args.out).with_suffix(".md").write_text(markdown(doc))
    print(markdown(doc))


if __name__ == "__main__":
    main()
