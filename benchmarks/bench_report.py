"""How long `pcg-synth report` takes on a large output, and how big its page is.

A synthetic output of `--rows` rows is made cheaply from a small real one (by default the
quickstart's, `out/quickstart`, which `./quickstart.sh` writes): its Parquet rows, error records
and rejects included, are repeated under new ids into shards of `--rows-per-shard`, with a job
record, commit records and the source's summary.json, as a job lays them out. Its Parquet files
are written uncompressed and without dictionaries: either would fold the repeated clips into
nearly nothing, which a real dataset's FLAC never allows. The report is then written from it (one
in-process `write_report`, the progress bar off) and timed; the page's size is split into its
embedded clips and the rest. Where Playwright and a Chromium are installed, the page is also
opened headless, offline: the seconds until it has loaded and drawn its table, and those of
sorting the table by duration. The goal: under a minute and under 50 MB at 10,000 rows.

    .venv/bin/python benchmarks/bench_report.py [--source out/quickstart] [--rows 10000] \
        [--out benchmarks/results/report_cpu]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import ROOT, describe, how_line, write_result_pair  # noqa: E402

RESULT = ROOT / "benchmarks" / "results" / "report_cpu"


def tiled(tables: list[pa.Table], rows: int, copy: int) -> pa.Table:
    """`rows` rows of the source's tables in turn, each id given the copy number it belongs to."""
    source = pa.concat_tables(tables)
    picks = [i % source.num_rows for i in range(copy, copy + rows)]
    table = source.take(pa.array(picks))
    ids = [f"{i}-{(copy + k) // source.num_rows:05d}" for k, i in enumerate(table.column("id").to_pylist())]
    return table.set_column(table.schema.get_field_index("id"), table.schema.field("id"), pa.array(ids, pa.string()))


def synthetic_output(source: Path, dest: Path, rows: int, per_shard: int) -> dict:
    """Write an output of `rows` rows to `dest`, its rows and rejects repeated from `source`'s."""
    data = [pq.read_table(p) for p in sorted((source / "data").glob("*.parquet"))]
    rejects = [pq.read_table(p) for p in sorted((source / "rejects").glob("*.parquet"))]
    source_rows = sum(t.num_rows for t in data + rejects)
    share = sum(t.num_rows for t in rejects) / source_rows if rejects else 0.0
    job = json.loads((source / "_job.json").read_text())
    shards, written = [], 0
    for n in range(-(-rows // per_shard)):
        shard, count = f"shard-{n:05d}", min(per_shard, rows - written)
        kept = count - round(count * share)
        (dest / "data").mkdir(parents=True, exist_ok=True)
        pq.write_table(tiled(data, kept, written), dest / "data" / f"{shard}.parquet", compression="none",
                       use_dictionary=False)
        if count > kept:
            (dest / "rejects").mkdir(exist_ok=True)
            pq.write_table(tiled(rejects, count - kept, written), dest / "rejects" / f"{shard}.parquet",
                           compression="none", use_dictionary=False)
        (dest / "_commits").mkdir(exist_ok=True)
        (dest / "_commits" / f"{shard}.json").write_text(json.dumps({"shard": shard, "rows": count}))
        shards.append({"id": shard, "manifest": "synthetic", "start": written, "stop": written + count})
        written += count
    (dest / "_job.json").write_text(json.dumps({**job, "rows": rows, "shards": shards}))
    if (source / "summary.json").is_file():
        shutil.copy(source / "summary.json", dest / "summary.json")
    return {"rows": rows, "shards": len(shards), "source_rows": source_rows,
            "bytes_on_disk": sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())}


def in_chromium(page_path: Path) -> dict | None:
    """Seconds to open the page (loaded, table drawn) and to sort its table, in headless Chromium
    offline; None without Playwright or a Chromium."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        return None
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=binary, headless=True)
        context = browser.new_context()
        context.route("**/*", lambda r: r.continue_() if r.request.url.startswith(("file:", "data:"))
                      else r.abort())
        page = context.new_page()
        start = time.perf_counter()
        page.goto(page_path.as_uri(), wait_until="load")
        page.wait_for_selector("#rows tbody tr")
        opened = time.perf_counter() - start
        start = time.perf_counter()
        page.click("#rows th[data-key=duration]")
        page.wait_for_selector("#rows th.asc")
        sorted_s = time.perf_counter() - start
        drawn = page.locator("#rows tbody tr").count()
        browser.close()
    return {"open_s": round(opened, 3), "sort_s": round(sorted_s, 3), "table_rows_drawn": drawn,
            "chromium": binary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default=str(ROOT / "out" / "quickstart"),
                        help="a finished hf-parquet job output to repeat (default: out/quickstart, as "
                             "./quickstart.sh writes it)")
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--rows-per-shard", type=int, default=256, help="the job spec's default")
    parser.add_argument("--sample", type=int, default=24, help="players embedded (the command's default)")
    parser.add_argument("--out", default=str(RESULT), help="result stem (writes .json and .md)")
    parser.add_argument("--notes", default="", help="what to record about this run (the machine, its load)")
    args = parser.parse_args()
    source = Path(args.source)
    if not (source / "_job.json").is_file():
        sys.exit(f"{source}: not a job output; run ./quickstart.sh first or give --source")
    from engine.report import write_report

    with tempfile.TemporaryDirectory(prefix="bench-report-") as folder:
        output = Path(folder) / "out"
        made = synthetic_output(source, output, args.rows, args.rows_per_shard)
        start = time.perf_counter()
        done = write_report(str(output), dest=str(Path(folder) / "report.html"), sample=args.sample, progress=False)
        seconds = time.perf_counter() - start
        html = (Path(folder) / "report.html").read_text()
        clip_bytes = sum(len(m) for m in re.findall(r'src="(data:audio/[^"]+)"', html))
        browser = in_chromium(Path(folder) / "report.html")
    doc = {
        "benchmark": "report", "command": how_line(sys.argv), "machine": describe("cpu"), "notes": args.notes,
        "source": str(source), "output": made, "sample": args.sample,
        "report": {"seconds": round(seconds, 3), "bytes": done["bytes"], "clip_bytes": clip_bytes,
                   "other_bytes": done["bytes"] - clip_bytes, "rows": done["rows"], "rejected": done["rejected"],
                   "errors": done["errors"], "cut": done["cut"], "sampled": done["sampled"]},
        "chromium": browser,
        "goal": {"seconds_under": 60, "megabytes_under": 50},
    }
    doc["goal"]["met"] = seconds < 60 and done["bytes"] < 50e6
    m, r = doc["machine"], doc["report"]
    lines = [f"# `pcg-synth report` on {made['rows']:,} rows\n",
             f"Machine: {m['cpu']}, {m['cpu_cores_visible']} cores, Python {m['python']}. "
             f"Source: {made['source_rows']} rows of `{source.name}` repeated into {made['shards']} shards "
             f"({made['bytes_on_disk'] / 1e6:.0f} MB on disk). Command: `{doc['command']}`.\n",
             "| rows | shards | players | seconds | page MB | of which clips MB | goal met |",
             "|---|---|---|---|---|---|---|",
             f"| {r['rows']:,} | {made['shards']} | {r['sampled']} | {r['seconds']:.1f} | {r['bytes'] / 1e6:.2f} | "
             f"{r['clip_bytes'] / 1e6:.2f} | {'yes' if doc['goal']['met'] else 'no'} |"]
    if browser:
        lines += ["", f"Headless Chromium, offline: opened with its table drawn in {browser['open_s']} s, "
                      f"sorted by duration in {browser['sort_s']} s ({browser['table_rows_drawn']} rows a page)."]
    if args.notes:
        lines += ["", f"Notes: {args.notes}"]
    write_result_pair(Path(args.out), doc, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
