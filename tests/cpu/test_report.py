"""`pcg-synth report`: the HTML page of a real kit job's output (the quality gate on, so rejects,
cut rows and an error record among its rows), read from every output format and from S3, and
opened in headless Chromium offline: its players load the rows' audio with the rows' durations,
its table sorts, its rejects and errors carry their reasons."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
from pathlib import Path

import boto3
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from engine.cli import main
from engine.config import StorageOptions
from engine.report import write_report
from engine.report.figures import choose_sample
from engine.report.read import ReportRow
from engine.runtime.convert import convert

from browser import chromium, page
from jobhelpers import job_spec, run_on_local_ray, texts, write_manifest

MARKUP = "Tags </script><!-- & <b>this</b> stay text."  # a row's text must not break the page


@pytest.fixture(scope="module")
def gated_output(kit_dir, tmp_path_factory):
    """A finished kit job, 2 shards of 9 rows: 4 rows may say 3 codes only and the gate wants
    0.1 s of speech (4 rejects for sure), 4 rows may say 40 codes (kept unless they end within 5,
    some cut at 40), and one error record (a malformed manifest line). The gate's ASR scores
    every row (CER/WER columns)."""
    folder = tmp_path_factory.mktemp("report")
    rows = [{**row, "max_new_tokens": 3 if i % 2 else 40} for i, row in enumerate(texts(8))]
    rows[0]["text"] = MARKUP
    manifest = write_manifest(folder / "m.jsonl", [*rows, "{broken json"])
    spec = job_spec(kit_dir, [str(manifest)], str(folder / "out"), decoding={"max_new_tokens": 40},
                    resources={"workers": 1, "rows_per_shard": 5},
                    quality={"asr": "pocketsphinx", "min_duration_s": 0.1})
    run_on_local_ray(spec)
    return folder / "out"


def parquet_rows(out: Path, folder: str) -> dict[str, dict]:
    return {r["id"]: r for p in sorted((out / folder).glob("*.parquet")) for r in pq.read_table(p).to_pylist()}


def page_rows(html: str) -> list[dict]:
    """The rows the page's table is built from, as {column: value}."""
    block = re.search(r'<script type="application/json" id="rows-data">(.*?)</script>', html, re.S).group(1)
    data = json.loads(block)
    keys = [c["key"] for c in data["columns"]]
    return [dict(zip(keys, r)) for r in data["rows"]]


def page_clips(html: str) -> dict[str, bytes]:
    """The clips the page embeds, by row id."""
    return {m.group(1): base64.b64decode(m.group(2))
            for m in re.finditer(r'data-id="([^"]+)"[^>]*src="data:audio/[a-z]+;base64,([^"]+)"', html)}


def samples(data: bytes):
    return sf.read(io.BytesIO(data), dtype="int16")[0]


def test_report_of_a_gated_job_plays_its_sample_offline_in_chromium(gated_output, tmp_path):
    data, rejects = parquet_rows(gated_output, "data"), parquet_rows(gated_output, "rejects")
    assert len(rejects) >= 4 and any(r["error"] is None for r in data.values())  # the job gives both
    done = write_report(str(gated_output), dest=str(tmp_path / "r.html"), sample=4, seed=3, progress=False)
    html = (tmp_path / "r.html").read_text()
    rows = {r["id"]: r for r in page_rows(html)}
    assert done["rows"] == len(rows) == 9 and done["rejected"] == len(rejects) and done["errors"] == 1
    for ident, r in rows.items():
        source = rejects.get(ident) or data[ident]
        assert r["status"] == ("rejected" if ident in rejects else "error" if source["error"] else "ok")
        assert (r["duration"], r["cer"], r["finish_reason"]) == \
            (source["duration"], source["cer"], source["finish_reason"])
        assert r["reason"] == (source["reject_reason"] or source["error"])
        if r["status"] != "error":
            assert r["speaking_rate"] == source["speaking_rate"] > 0
            stats = source["stats"]
            assert r["acceptance"] == round(sum(stats["accepted_per_position"]) / stats["drafted"], 4)
    clips = page_clips(html)
    assert len(clips) == done["sampled"] == 4 and any(rows[i]["status"] == "rejected" for i in clips)
    for ident, clip in clips.items():
        assert clip == (rejects.get(ident) or data[ident])["audio"]["bytes"]
    with chromium() as browser, page((tmp_path / "r.html").as_uri(), browser=browser) as p:
        p.wait_for_function("[...document.querySelectorAll('audio')].every(a => a.readyState >= 1)")
        played = p.evaluate("[...document.querySelectorAll('audio')].map(a => [a.dataset.id, a.duration, "
                            "a.error === null])")
        assert sorted(i for i, _, _ in played) == sorted(clips)
        for ident, seconds, ok in played:
            assert ok and seconds == pytest.approx(rows[ident]["duration"], abs=1e-3)
        assert p.blocked == [] and p.errors == []
        assert MARKUP in p.locator("#rows tbody tr td:nth-child(2)").all_inner_texts()
        assert p.locator(".hist").count() >= 5  # duration, speaking rate, acceptance, CER, WER
        p.click("#rows th[data-key=duration]")
        p.click("#rows th[data-key=duration]")  # descending, the error record (no duration) last
        shown = p.locator("#rows tbody tr td:nth-child(4)").all_inner_texts()
        durations = sorted((r["duration"] for r in rows.values() if r["duration"] is not None), reverse=True)
        assert shown == [f"{d:.2f}" for d in durations] + [""]
        problems = p.locator("#problems tbody tr").all_inner_texts()
        assert len(problems) == len(rejects) + 1
        assert any("not a JSON object" in line for line in problems)
        assert all("duration" in line for line in problems if "rejected" in line)  # why: below 0.1 s


def test_every_format_and_s3_give_the_same_rows_and_clips(gated_output, tmp_path, s3_endpoint, s3_bucket):
    local = write_report(str(gated_output), dest=str(tmp_path / "local.html"), sample=50, progress=False)
    base = {r["id"]: r for r in page_rows((tmp_path / "local.html").read_text()) if r["status"] != "rejected"}
    base_clips = page_clips((tmp_path / "local.html").read_text())
    for to, tarred in (("nemo", False), ("nemo", True), ("lhotse-shar", False)):
        dest = tmp_path / f"{to}-{tarred}"
        convert(str(gated_output), to, dest=str(dest), tarred=tarred, progress=False)
        done = write_report(str(dest), sample=50, progress=False)
        assert done["dest"] == str(dest / "report.html") and done["format"] == to
        html = (dest / "report.html").read_text()
        got = {r["id"]: r for r in page_rows(html)}  # rejects stay in the source: a conversion reads data/
        assert sorted(got) == sorted(base)
        for ident, r in got.items():
            assert r["status"] == base[ident]["status"] and r["reason"] == base[ident]["reason"]
            assert r["duration"] == (pytest.approx(base[ident]["duration"]) if r["duration"] else None)
        for ident, clip in page_clips(html).items():
            assert (samples(clip) == samples(base_clips[ident])).all()
        assert "The job's summary" in html  # the source job's, read through _convert.json
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    for path in gated_output.rglob("*"):
        if path.is_file() and path.name != "report.html":
            s3.upload_file(str(path), s3_bucket, f"out/{path.relative_to(gated_output)}")
    remote = write_report(f"s3://{s3_bucket}/out", dest=str(tmp_path / "s3.html"), sample=50, progress=False,
                          storage_options=StorageOptions(endpoint_url=s3_endpoint))
    assert page_rows((tmp_path / "s3.html").read_text()) == page_rows((tmp_path / "local.html").read_text())
    assert page_clips((tmp_path / "s3.html").read_text()) == base_clips
    assert {k: remote[k] for k in ("rows", "rejected", "errors", "cut", "sampled")} == \
        {k: local[k] for k in ("rows", "rejected", "errors", "cut", "sampled")}


def test_a_path_that_is_not_a_finished_output_gets_one_line_and_a_partial_one_says_so(gated_output, tmp_path,
                                                                                       capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.parquet").write_bytes(b"x")
    for path, message in ((tmp_path / "empty", "not a pcg-synth job output (no _job.json"),
                          (tmp_path / "nowhere", "no such folder"),
                          (tmp_path / "file.parquet", "is a file: give a job's output folder")):
        assert main(["report", str(path), "--quiet"]) == 2
        assert message in capsys.readouterr().err
    partial = tmp_path / "partial"
    shutil.copytree(gated_output, partial)
    (partial / "summary.json").unlink()
    (partial / "_commits" / "shard-00001.json").unlink()
    assert main(["report", str(partial), "--quiet", "--sample", "0"]) == 0
    done = json.loads(capsys.readouterr().out)
    html = (partial / "report.html").read_text()
    assert done["shards"] == 1 and done["rows"] == 5 and done["sampled"] == 0 and "<audio" not in html
    assert "1 of 2 shards are committed" in html and "No summary.json" in html
    for name in ("_commits/shard-00000.json",):
        (partial / name).unlink()
    assert main(["report", str(partial)]) == 2
    assert "nothing to report yet" in capsys.readouterr().err


def _row(i: int, status: str = "ok", finish: str = "eos") -> ReportRow:
    return ReportRow(id=f"r{i}", text="t", status=status, shard="s", duration=1.0, finish_reason=finish,
                     where=("file", f"r{i}", None))


def test_the_sample_holds_rejects_and_cut_rows_and_is_the_same_for_a_seed():
    rows = [_row(i) for i in range(40)] + [_row(40 + i, "rejected") for i in range(6)] + \
           [_row(50 + i, finish="length") for i in range(6)] + [ReportRow(id="e", text="t", status="error", shard="s")]
    chosen = choose_sample(rows, 8, seed=1)
    assert len(chosen) == 8 and chosen == choose_sample(rows, 8, seed=1) != choose_sample(rows, 8, seed=2)
    assert sum(r.status == "rejected" for r in chosen) == 2 and sum(r.cut for r in chosen) == 2
    assert [r.id for r in chosen] == [r.id for r in rows if r in chosen]  # in the output's order
    assert len(choose_sample(rows, 100, seed=0)) == 52  # every row with audio, the error record never
    assert choose_sample(rows[:3], 8, seed=0) == rows[:3]  # no reject, no cut row: the others fill it
