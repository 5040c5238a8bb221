"""Manifest rows that cannot be read: invalid UTF-8 becomes an error row naming its line (the
rest proceeds), fields of no meaning here are counted for a warning, and an unreadable voice
clip's error names the clip's URI. Gzipped JSONL and CSV manifests plan and read as the plain
files do; a corrupt one, or a gzipped Parquet file, is refused naming the file."""

from __future__ import annotations

import gzip
import io
import json

import pytest

from engine.codec.audio import read_clip
from engine.codec.base import CodecError
from engine.io.manifest import ManifestRow, RowError, parse_rows, unknown_fields, validated
from engine.io.storage import Storage
from engine.runtime.plan import make_plan

from jobhelpers import job_spec, read_output, write_manifest


def test_invalid_utf8_in_a_jsonl_row_is_an_error_row_naming_its_line():
    data = (b'{"id": "a", "text": "fine"}\n'
            b'{"id": "b", "text": "bad \xff\xfe bytes"}\n'
            b'{"id": "c", "text": "also fine"}\n')
    rows = validated(parse_rows("s3://b/m.jsonl", data), "s3://b/m.jsonl", 0)
    assert [type(r) for r in rows] == [ManifestRow, RowError, ManifestRow]
    assert rows[1].source == "s3://b/m.jsonl:2" and "not valid UTF-8" in rows[1].error
    assert "0xff" in rows[1].error


def test_invalid_utf8_in_a_csv_row_is_an_error_row():
    data = b"id,text\na,fine\nb,bad \xff here\nc,ok\n"
    rows = validated(parse_rows("m.csv", data), "m.csv", 0)
    assert [type(r) for r in rows] == [ManifestRow, RowError, ManifestRow]
    assert rows[1].source == "m.csv:2" and "not valid UTF-8 (field 'text')" in rows[1].error


def test_a_per_row_budget_is_an_override_and_a_bad_one_an_error_row():
    data = b"id,text,max_new_tokens\na,fine,120\nb,bad budget,0\nc,none given,\n"
    rows = validated(parse_rows("m.csv", data), "m.csv", 0)
    assert [type(r) for r in rows] == [ManifestRow, RowError, ManifestRow]
    assert rows[0].overrides() == {"max_new_tokens": 120} and rows[2].overrides() == {}
    assert "max_new_tokens" in rows[1].error


def test_unknown_fields_are_counted_and_the_plan_warns(tmp_path):
    rows = [{"id": "a", "text": "x", "speaker": "s1"}, {"id": "b", "text": "y", "speaker": "s2", "lang": "en"},
            {"id": "c", "text": "z"}]
    assert unknown_fields(rows) == {"lang": 1, "speaker": 2}
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = job_spec(tmp_path, [str(manifest)], str(tmp_path / "out"))
    plan = make_plan(spec, Storage())
    assert plan.unknown_fields == {str(manifest): {"lang": 1, "speaker": 2}}
    assert plan.warnings() == [f"{manifest}: fields this pcg-synth ignores: 'lang' (1 row), 'speaker' (2 rows)"]
    assert plan.to_dict()["unknown_fields"] == plan.unknown_fields


def test_a_mistyped_row_field_is_warned_with_the_field_it_most_likely_meant(tmp_path):
    # a typo would silently drop a row's override: the warning names the field it looks like
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"id": "a", "text": "x", "temprature": 0.3, "Seed": 4, "speaker": "s1"}\n')
    plan = make_plan(job_spec(tmp_path, [str(manifest)], str(tmp_path / "out")), Storage())
    assert plan.warnings() == [f"{manifest}: fields this pcg-synth ignores: 'Seed' (1 row) (did you mean 'seed'?), "
                               "'speaker' (1 row), 'temprature' (1 row) (did you mean 'temperature'?)"]


def test_an_unreadable_clip_read_from_storage_is_named_by_its_uri():
    with pytest.raises(CodecError) as info:
        read_clip(io.BytesIO(b"not audio at all"), 16000, name="s3://bucket/voices/clip.wav")
    message = str(info.value)
    assert "s3://bucket/voices/clip.wav" in message and "BytesIO" not in message


def test_gzipped_manifests_plan_and_read_as_the_plain_files(tmp_path):
    jsonl = b"".join(json.dumps({"id": f"j{i}", "text": f"Row {i}."}).encode() + b"\n" for i in range(5))
    jsonl += b'{"id": "bad", "text": "bad \xff bytes"}\n'
    csv_bytes = b"id,text,temperature\nc0,From a CSV file.,0.7\nc1,Another one.,\n"
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    for folder, write in ((plain, bytes), (packed, gzip.compress)):
        folder.mkdir()
        suffix = ".gz" if folder is packed else ""
        (folder / f"a.jsonl{suffix}").write_bytes(write(jsonl))
        (folder / f"b.csv{suffix}").write_bytes(write(csv_bytes))
    (packed / "notes.txt.gz").write_bytes(gzip.compress(b"not a manifest"))  # a folder lists manifests only
    plans = {d.name: make_plan(job_spec(tmp_path, [str(d)], str(tmp_path / "out"), resources={"rows_per_shard": 4}),
                               Storage()) for d in (plain, packed)}
    assert plans["packed"].manifests == [str(packed / "a.jsonl.gz"), str(packed / "b.csv.gz")]
    shape = {k: [(s.start, s.stop, s.duplicates) for s in p.shards] for k, p in plans.items()}
    assert shape["packed"] == shape["plain"] == [(0, 4, {}), (4, 6, {}), (0, 2, {})]
    # a JSONL shard's bytes (of the decompressed file when gzipped: a worker decompresses it once)
    ranges = {k: [s.byte_range for s in p.shards] for k, p in plans.items()}
    assert ranges["packed"] == ranges["plain"] and ranges["plain"][0] == (0, jsonl.index(b'{"id": "j4"'))
    assert ranges["plain"][2] is None  # a CSV file is read whole
    for name in ("a.jsonl", "b.csv"):  # the same rows, an error row included (its line named alike)
        rows = [validated(parse_rows(str(path), path.read_bytes()), name, 0)
                for path in (plain / name, packed / f"{name}.gz")]
        assert [repr(r) for r in rows[0]] == [repr(r) for r in rows[1]]
        if name == "a.jsonl":
            assert isinstance(rows[1][5], RowError) and rows[1][5].source == "a.jsonl:6"
        else:
            assert rows[1][0].overrides() == {"temperature": 0.7} and rows[1][1].overrides() == {}


def test_a_corrupt_gzip_manifest_or_a_gzipped_parquet_file_is_refused_naming_the_file(tmp_path):
    with pytest.raises(ValueError, match=r"s3://b/m.jsonl.gz: not a readable gzip file"):
        parse_rows("s3://b/m.jsonl.gz", b'{"id": "a", "text": "not compressed"}\n')
    with pytest.raises(ValueError, match=r"m.csv.gz: not a readable gzip file"):
        parse_rows("m.csv.gz", gzip.compress(b"id,text\na,cut short\n" * 50)[:40])
    with pytest.raises(ValueError, match=r"m.parquet.gz: unknown manifest format '.parquet.gz' \(use .jsonl"):
        parse_rows("m.parquet.gz", gzip.compress(b"x"))


def test_ids_are_strings_or_integers_and_any_other_id_is_an_error_row(tmp_path):
    # an integer id is its decimal string, the same id as that string (a duplicate of it); a
    # float, a boolean, a list, an object or null is that row's error, and the rest proceeds
    lines = [{"id": "a", "text": "x"}, {"id": 7, "text": "x"}, {"id": 7.0, "text": "x"}, {"id": True, "text": "x"},
             {"id": [1, 2], "text": "x"}, {"id": None, "text": "x"}, {"id": {"k": 1}, "text": "x"},
             {"id": "7", "text": "x"}, {"id": "b", "text": 5}, {"id": "c", "text": "x", "prompt_id": 3, "text_id": 4},
             {"id": "d", "text": "x", "text_id": False}, {"id": "True", "text": "x"}]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in lines))
    rows = validated(parse_rows(str(manifest), manifest.read_bytes()), "m.jsonl", 0)
    assert [r.id for r in rows] == ["a", "7", None, None, None, None, None, "7", "b", "c", "d", "True"]
    errors = {r.source: r.error for r in rows if isinstance(r, RowError)}
    assert errors == {"m.jsonl:3": "id: an id is a string or an integer, not a float (7.0)",
                      "m.jsonl:4": "id: an id is a string or an integer, not a boolean (True)",
                      "m.jsonl:5": "id: an id is a string or an integer, not a list ([1, 2])",
                      "m.jsonl:6": "id: an id is a string or an integer, not null",
                      "m.jsonl:7": "id: an id is a string or an integer, not an object ({'k': 1})",
                      "m.jsonl:9": "text: Input should be a valid string",
                      "m.jsonl:11": "text_id: an id is a string or an integer, not a boolean (False)"}
    assert (rows[9].prompt_id, rows[9].text_id) == ("3", "4")
    plan = make_plan(job_spec(tmp_path, [str(manifest)], str(tmp_path / "out"), resources={"rows_per_shard": 20}),
                     Storage())
    assert plan.shards[0].duplicates == {7: f"{manifest}:2"}  # "7" repeats 7; "True" repeats no bad id
    # a Parquet manifest's integer column reads as the same ids
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.table({"id": [7, -3], "text": ["x", "y"]}), buffer)
    assert [r.id for r in validated(parse_rows("m.parquet", buffer.getvalue()), "m.parquet", 0)] == ["7", "-3"]


@pytest.mark.parametrize("field, value, message", [
    ("temperature", 1e9, "temperature: Input should be less than or equal to 10"),
    ("temperature", 10.5, "temperature: Input should be less than or equal to 10"),
    ("repetition_penalty", float("inf"), "repetition_penalty: Input should be a finite number"),
    ("repetition_penalty", 0, "repetition_penalty: Input should be greater than 0"),
    ("top_p", 1.5, "top_p: Input should be less than or equal to 1"),
    ("top_k", -1, "top_k: Input should be greater than or equal to 0"),
])
def test_a_row_override_no_model_can_honour_is_an_error_row(field, value, message):
    data = (b'{"id": "a", "text": "fine", "temperature": 10}\n'
            + json.dumps({"id": "b", "text": "bad", field: value}).encode() + b"\n"
            + b'{"id": "c", "text": "also fine"}\n')
    rows = validated(parse_rows("m.jsonl", data), "m.jsonl", 0)
    assert [type(r) for r in rows] == [ManifestRow, RowError, ManifestRow]
    assert rows[1].error == message and rows[1].id == "b"
    assert rows[0].overrides() == {"temperature": 10}


def test_in_a_job_rows_no_model_can_honour_become_error_records_and_the_rest_proceed(local_ray, kit_dir, tmp_path):
    from engine.runtime.job import JobRunner
    from engine.runtime.preflight import dry_run

    manifest = write_manifest(tmp_path / "m.jsonl", [
        {"id": "ok", "text": "Fine."}, {"id": "over", "text": "Budget too long.", "max_new_tokens": 2049},
        {"id": 1.5, "text": "A float id."}, {"id": "hot", "text": "Too hot.", "temperature": 1e9},
        {"id": 7, "text": "An integer id."}])
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"),
                    resources={"workers": 1, "rows_per_shard": 5})
    report = dry_run(spec)
    summary = JobRunner(spec, progress=False).run()
    errors = {r["id"]: r["error"] for r in read_output(spec)}
    assert errors.keys() == {"ok", "over", f"!{manifest}:3", "hot", "7"}
    assert errors["ok"] is None and errors["7"] is None and summary["rows_ok"] == 2
    assert errors["over"].startswith("max_new_tokens: 2049 is above the llasa model's context of 2048 tokens")
    assert errors[f"!{manifest}:3"] == "id: an id is a string or an integer, not a float (1.5)"
    assert errors["hot"] == "temperature: Input should be less than or equal to 10"
    # the dry run finds the same rows, with the job's messages
    found = {e["id"] or f"!{e['source']}": e["error"] for e in report["failing_examples"]}
    assert found == {k: v for k, v in errors.items() if v is not None}
