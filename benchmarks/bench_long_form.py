"""What splitting long texts costs a job: a long-form job against the same chunks as rows.

Two jobs on the tiny kit, one run each, same worker, batch size and decoding settings:
  * long-form: a few texts of one to two minutes of speech each, `text.split: auto` with
    `split_output: joined` (each row is cut into chunks that fit its budget, the chunks decoded
    as rows of the batch, their audio joined back into one row);
  * chunks as rows: the very chunks the long-form job decodes (planned here by the planner the
    worker's prepare stage runs, `engine.text.prepare.TextPlanner`, with the kit's prompter and
    the model's context), each a manifest row with the seed the long-form job gives it
    (`chunk_seeds`), `text.split: none`.
The two decode the same tokens (checked: the long-form job's codes are the chunk rows' codes
in order); the long-form job adds the planning, the joins and fewer, longer rows per shard. It
should take at most 1.05x the time of the chunks as rows (steady window: first shard handed out
to last committed; models loaded and warmed up before). Run it on a quiet machine:

    .venv/bin/python benchmarks/bench_long_form.py [--out benchmarks/results/long_form_cpu_tiny]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import describe, write_result_pair  # noqa: E402

RESULT = ROOT / "benchmarks" / "results" / "long_form_cpu_tiny"
SENTENCES = [
    "The harbour was quiet before dawn.", "Fishing boats rocked at their moorings, and the gulls had not yet begun.",
    "Doctor Ellis walked along the pier with a thermos of coffee.", "Twelve boats were in; two were still out.",
    "She checked her watch and frowned, because the sea had not agreed with the forecast.",
    "By six the first of the missing boats came around the point.", "Its engine coughed, but it held its course.",
    "The second boat was another matter.", "Nobody had heard from it since midnight.",
    "At half past seven the coast guard launched a search, and volunteers gathered with charts.",
    "Shortly before noon a plane found the boat drifting south, its crew cold but safe.",
    "That evening the whole village came down to the pier to watch it towed home.",
]


def long_texts(n: int, sentences_per_text: int) -> list[dict]:
    """`n` rows of about a minute or two of speech each, sentences taken in turn."""
    rows = []
    for i in range(n):
        picked = [SENTENCES[(i + k) % len(SENTENCES)] for k in range(sentences_per_text)]
        rows.append({"id": f"long-{i:02d}", "text": " ".join(picked), "seed": 1000 + i})
    return rows


def chunk_rows(rows: list[dict], kit: Path, max_new_tokens: int) -> list[dict]:
    """The chunks the long-form job decodes, as rows of their own with the chunks' seeds."""
    from engine.config import TextSpec
    from engine.families.llasa import CONTEXT as LLASA_CONTEXT
    from engine.families.llasa import FAMILY, LlasaPrompter
    from engine.models.loading import load_tokenizer
    from engine.text.chunks import chunk_id, chunk_seeds
    from engine.text.prepare import TextPlanner

    tokenizer = load_tokenizer(kit / "target")
    prompter = LlasaPrompter(tokenizer, FAMILY.layout(tokenizer))
    planner = TextPlanner(TextSpec(split="auto"), prompter.build, LLASA_CONTEXT, FAMILY.codes_per_second)
    out = []
    for row in rows:
        plan = planner(row["text"], max_new_tokens).plan
        for k, (chunk, seed) in enumerate(zip(plan.chunks, chunk_seeds(row["seed"], len(plan.chunks)))):
            out.append({"id": chunk_id(row["id"], k), "text": chunk.text, "seed": seed})
    return out


def spec_for(kit: Path, manifest: Path, out: Path, text: dict, args):
    from engine.config import JobSpec

    return JobSpec.model_validate({
        "name": out.name, "models": {"target": str(kit / "target"), "draft": str(kit / "draft"),
                                     "codec": str(kit / "codec"), "groups_cache": str(out.parent / "groups")},
        "decoding": {"method": "pcg", "gamma": 3, "max_new_tokens": args.max_new_tokens, "seed": 1},
        "input": {"manifests": [str(manifest)]}, "output": {"uri": str(out)},
        "resources": {"workers": 1, "batch_size": args.batch, "rows_per_shard": args.rows_per_shard,
                      "cpus_per_worker": args.threads},
        "text": text})


def run(spec) -> dict:
    import ray

    from engine.runtime.job import JobRunner

    start = time.perf_counter()
    summary = JobRunner(spec, address="local", progress=False, warmup=True).run()
    ray.shutdown()
    steady = summary["steady"]
    return {"rows_ok": summary["rows_ok"], "rows_split": summary["rows_split"], "chunks": summary["chunks"],
            "generated_tokens": summary["generated_tokens"],
            "steady_s": steady["wall_s"], "steady_tokens_per_s": steady["tokens_per_s"],
            "slot_utilisation": summary["utilisation"]["slot_utilisation"],
            "dtype": summary["numerics"][0]["dtype"] if summary.get("numerics") else None,
            "wall_s": round(time.perf_counter() - start, 1)}


def same_codes(long_out: Path, chunks_out: Path) -> bool:
    """Whether every long row's codes are its chunk rows' codes in order."""
    import pyarrow.parquet as pq

    def rows(out: Path) -> list[dict]:
        return [r for p in sorted((out / "data").glob("*.parquet")) for r in pq.read_table(p).to_pylist()]

    chunks: dict[str, list[tuple[str, list[int]]]] = {}
    for r in rows(chunks_out):
        chunks.setdefault(r["id"].rsplit("#", 1)[0], []).append((r["id"], r["codes"]))
    return all(r["codes"] == [c for _, codes in sorted(chunks[r["id"]]) for c in codes] for r in rows(long_out))


def markdown(doc: dict) -> str:
    lines = [f"# Long-form job against its chunks as rows (tiny kit, {doc['machine'].get('cpu', 'CPU')})", "",
             f"{doc['long_rows']} long rows -> {doc['chunks']} chunks; batch {doc['batch']}, max_new_tokens "
             f"{doc['max_new_tokens']}; load average (1 min) {doc['load_average']['start']} at the start, "
             f"{doc['load_average']['end']} at the end.", "",
             "| job | rows ok | rows split -> chunks | tokens | steady s | tokens/s | slot utilisation |",
             "|---|---|---|---|---|---|---|"]
    for name in ("chunks_as_rows", "long_form"):
        r = doc["runs"][name]
        lines.append(f"| {name} | {r['rows_ok']} | {r['rows_split']} -> {r['chunks']} | {r['generated_tokens']} | "
                     f"{r['steady_s']} | {r['steady_tokens_per_s']} | {r['slot_utilisation']} |")
    empty = doc["chunks"] - doc["runs"]["chunks_as_rows"]["rows_ok"]
    lines += ["", f"long-form / chunks as rows (steady time): **{doc['ratio']}** (target: at most 1.05).",
              f"Rows ok are the rows without an error record: {empty} of the chunks ended before any speech "
              "(the kit's random end of speech), an error record as a row of their own, and, in the long-form "
              "job, the error record of their long row (without a quality gate to decode them again).",
              f"The long rows' codes are the chunk rows' codes in order: {doc['same_codes']} "
              f"({doc.get('dtype', 'float32')}: the two "
              "jobs batch other rows beside a chunk, which can move a logit's last bits and so a sampled code; "
              "tests/cpu/test_long_texts.py checks it bit for bit in float64)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kit", default=str(ROOT / "kit"))
    ap.add_argument("--texts", type=int, default=6, help="long rows")
    ap.add_argument("--sentences", type=int, default=24, help="sentences per long row")
    ap.add_argument("--max-new-tokens", type=int, default=400, help="the rows' budget: what makes them split")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rows-per-shard", type=int, default=16)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", default=str(RESULT), help="result files' path without suffix")
    args = ap.parse_args()
    from engine.kit import build_kit

    kit = Path(args.kit)
    if not (kit / "kit.json").exists():
        build_kit(kit)
    load = round(os.getloadavg()[0], 2)
    work = Path(tempfile.mkdtemp(prefix="bench-long-form-"))
    rows = long_texts(args.texts, args.sentences)
    chunks = chunk_rows(rows, kit, args.max_new_tokens)
    (work / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (work / "chunks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chunks))
    runs: dict = {}
    runs["chunks_as_rows"] = run(spec_for(kit, work / "chunks.jsonl", work / "out-chunks", {"split": "none"}, args))
    runs["long_form"] = run(spec_for(kit, work / "long.jsonl", work / "out-long", {"split": "auto"}, args))
    ratio = round(runs["long_form"]["steady_s"] / runs["chunks_as_rows"]["steady_s"], 4)
    load = {"start": load, "end": round(os.getloadavg()[0], 2)}
    doc = {"benchmark": "long_form", "machine": describe(), "load_average": load, "long_rows": len(rows),
           "chunks": len(chunks), "batch": args.batch, "max_new_tokens": args.max_new_tokens, "runs": runs,
           "ratio": ratio, "dtype": runs["long_form"]["dtype"],
           "same_codes": same_codes(work / "out-long", work / "out-chunks")}
    write_result_pair(Path(args.out), doc, markdown(doc))


if __name__ == "__main__":
    main()
