"""The quality gate's cost to a job: the same kit job with the gate off and on, side by side.

Runs one kit job (on a local Ray cluster, one worker, warmed up) twice at the same batch size:
without `quality:` and with the bundled verifiers recording their scores on every row (pocketsphinx
transcripts -> cer/wer, Resemblyzer speaker similarity to each row's voice prompt; no bound, so
no row is decoded again and both runs decode the same rows). It reports the decode loop's tokens/s
(generated tokens over the seconds in decode rounds: with the gate on, verification runs on its
own thread beside the loop and must not slow it), the job's steady tokens/s, the seconds the
verify thread spent per row, how long the decode loop waited for it, and the share of its slots
left empty while it waited for shards (the worker holds extra shards while rows are checked,
`JobSpec.shards_held`). The verifiers run in a process of their own and the codec on the
worker's verify thread: both need a core beside the decode loop's (the default `--threads`
leaves one). On the tiny kit checking a row takes longer than decoding it, so the job ends
waiting for the checks; the decode loop itself waits only once 16 batches of rows are queued
for them (backpressure, `verify_wait_s`).

    .venv/bin/python benchmarks/bench_quality_gate.py [--rows 48] [--batch 8] [--max-new-tokens 48]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import ROOT, describe, how_line, kit_headline, write_result_pair  # noqa: E402

GATE = {"asr": "pocketsphinx", "speaker": "resemblyzer"}  # scores recorded, nothing rejected
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]


def manifest(path: Path, rows: int) -> Path:
    """`rows` texts of a few lengths, each with a voice prompt given as codes (the speaker check's
    reference)."""
    voice = {"prompt_text": "A voice.", "prompt_codes": [(i * 977) % 65536 for i in range(40)]}
    lines = [json.dumps({"id": f"r{i:04d}", "text": " ".join(WORDS[: 2 + i % 6]) + f" number {i}.", **voice})
             for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def run(kit: Path, source: Path, out: Path, args, quality: dict | None) -> dict:
    from engine.config import JobSpec
    from engine.runtime.job import JobRunner

    spec = JobSpec.model_validate({
        "name": "quality-gate-bench",
        "models": {"target": str(kit / "target"), "draft": str(kit / "draft"), "codec": str(kit / "codec")},
        "decoding": {"method": "exact", "max_new_tokens": args.max_new_tokens, "seed": 1},
        "text": {"split": "none"},  # max_new_tokens cuts rows short: no text is cut into chunks instead
        "input": {"manifests": [str(source)]}, "output": {"uri": str(out)},
        "resources": {"workers": 1, "batch_size": args.batch, "rows_per_shard": args.rows_per_shard,
                      "cpus_per_worker": args.threads},
        **({"quality": quality} if quality else {})})
    start = time.perf_counter()
    summary = JobRunner(spec, address="local", progress=False, warmup=True).run()
    [worker] = summary["workers"].values()
    q = summary.get("quality") or {}
    return {"gate": "on" if quality else "off", "wall_s": round(time.perf_counter() - start, 2),
            "rows": summary["rows"], "generated_tokens": summary["generated_tokens"],
            "decode_s": worker["decode_s"], "decode_tokens_per_s": worker["tokens_per_s"],
            "steady_tokens_per_s": summary["steady"]["tokens_per_s"], "slot_utilisation": worker["slot_utilisation"],
            "slots_waiting_for_shards": (summary["utilisation"].get("empty_slots") or {}).get("waiting_for_shards"),
            "shards_held": summary["utilisation"]["shard_window"],
            "decode_cpu_share": worker["decode_cpu_share"], "verify_s": q.get("verify_s"),
            "verify_s_per_row": q.get("verify_s_per_row"), "verify_wait_s": q.get("verify_wait_s"),
            "passed": q.get("passed"), "rejected": q.get("rejected")}


def dash(value) -> str:
    return "-" if value is None else str(value)


def markdown(doc: dict) -> str:
    off, on = doc["runs"]
    lines = [kit_headline("Quality gate on and off, one kit job each", doc), "",
             f"`{doc['how']}`: {doc['rows']} rows, batch {doc['batch']}, max_new_tokens {doc['max_new_tokens']}, "
             f"gate {json.dumps(GATE)} (scores recorded, nothing rejected).", "",
             "| gate | decode tokens/s | steady tokens/s | slots filled | slots waiting for shards | shards held "
             "| verify s / row | decode waited for verify s | job wall s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in (off, on):
        lines.append(f"| {r['gate']} | {r['decode_tokens_per_s']} | {r['steady_tokens_per_s']} | "
                     f"{r['slot_utilisation']} | {dash(r['slots_waiting_for_shards'])} | {r['shards_held']} | "
                     f"{dash(r['verify_s_per_row'])} | {dash(r['verify_wait_s'])} | "
                     f"{r['wall_s']} |")
    lines += ["", f"Decode tokens/s with the gate over without: {doc['decode_ratio_on_over_off']}; "
                  f"steady tokens/s: {doc['steady_ratio_on_over_off']}.", "", f"Notes: {doc['notes']}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kit", default=str(ROOT / "kit"), help="the tiny kit (built there when missing)")
    ap.add_argument("--rows", type=int, default=48, help="manifest rows of each job")
    ap.add_argument("--rows-per-shard", type=int, default=8, help="rows per shard")
    ap.add_argument("--batch", type=int, default=8, help="the worker's batch size (both jobs)")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="each row's token budget")
    ap.add_argument("--threads", type=int, default=max(1, min(2, (os.cpu_count() or 2) - 1)),
                    help="CPUs per worker (its decode thread's torch threads; default: a core is left to the "
                         "verifier process and the codec)")
    ap.add_argument("--notes", default="", help="what to say about the machine and the run")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "quality_gate_cpu_tiny"),
                    help="result-file stem: <stem>.json and <stem>.md")
    args = ap.parse_args()

    from engine.kit import build_kit

    kit = Path(args.kit)
    if not (kit / "kit.json").exists():
        build_kit(kit)
    load_start, t0 = round(os.getloadavg()[0], 2), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-quality-gate-") as tmp:
        os.environ["PCG_SYNTH_CACHE"] = str(Path(tmp) / "cache")
        source = manifest(Path(tmp) / "rows.jsonl", args.rows)
        runs = [run(kit, source, Path(tmp) / gate, args, GATE if gate == "on" else None) for gate in ("off", "on")]
    off, on = runs

    def ratio(key: str) -> float | None:
        return round(on[key] / off[key], 3) if on[key] and off[key] else None

    doc = {"benchmark": "quality_gate", "machine": describe("cpu"), "threads": args.threads, "dtype": "auto",
           "how": how_line(["benchmarks/bench_quality_gate.py", *sys.argv[1:]]),
           "seconds": round(time.perf_counter() - t0, 1),
           "load_average": {"start": load_start, "end": round(os.getloadavg()[0], 2)},
           "rows": args.rows, "batch": args.batch, "max_new_tokens": args.max_new_tokens, "gate": GATE,
           "decode_ratio_on_over_off": ratio("decode_tokens_per_s"),
           "steady_ratio_on_over_off": ratio("steady_tokens_per_s"),
           "notes": args.notes or "one run each, gate off first; see load_average for how busy the machine was",
           "runs": runs}
    write_result_pair(Path(args.out), doc, markdown(doc))


if __name__ == "__main__":
    main()
