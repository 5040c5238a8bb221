"""`pcg-synth run --dry-run`: the job checked without models, Ray or writing. Its findings are
compared with what real jobs record in `test_jobs.py` (bad rows, augment, another job's output)."""

from __future__ import annotations

import json
import os

import pytest

from engine.cli import main

from jobhelpers import job_spec, write_manifest


def spec_file(tmp_path, spec) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(spec.model_dump(mode="json")))  # JSON is YAML
    return str(path)


def test_a_dry_run_reports_rows_errors_and_shards_and_writes_nothing(kit_dir, tmp_path, capsys):
    texts = ["Fine.", "A longer sentence that takes a while to say out loud."]
    write_manifest(tmp_path / "in" / "a.jsonl", [
        {"id": "a1", "text": texts[0], "temprature": 0.3}, "{broken",
        {"id": "a2", "text": texts[1], "max_new_tokens": 5},
        {"id": "a3", "text": "With a clip.", "prompt_text": "x", "prompt_audio": "missing.wav"},
        {"id": "a1", "text": "The same id again."}])
    (tmp_path / "in" / "b.csv").write_text("id,text\nb1,From a CSV file.\nb2,\n")
    out = tmp_path / "deep" / "out"
    spec = job_spec(kit_dir, [str(tmp_path / "in")], str(out), decoding={"max_new_tokens": 40},
                    resources={"rows_per_shard": 2})
    assert main(["run", spec_file(tmp_path, spec), "--dry-run", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] == 7 and report["rows_ok"] == 3 and report["rows_failing"] == 4
    # shards never span files: 5 JSONL rows in 3 shards, 2 CSV rows in 1
    assert report["shards"] == 4 and report["output_state"].startswith("new")
    failing = {e["source"].rsplit("/", 1)[-1]: e["error"] for e in report["failing_examples"]}
    assert set(failing) == {"a.jsonl:2", "a.jsonl:4", "a.jsonl:5", "b.csv:2"}
    assert failing["a.jsonl:2"] == "not a JSON object"
    assert failing["a.jsonl:4"] == f"prompt_audio: no clip at {tmp_path / 'in' / 'missing.wav'}"
    assert failing["a.jsonl:5"].startswith("duplicate id (first at ") and "text is empty" in failing["b.csv:2"]
    assert report["warnings"] == [f"{tmp_path / 'in' / 'a.jsonl'}: fields this pcg-synth ignores: "
                                  "'temprature' (1 row) (did you mean 'temperature'?)"]
    # speech: 50 codes a second at 15 characters a second, capped by each row's budget
    expected = sum(min(cap, round(len(t) / 15 * 50)) for t, cap in
                   [(texts[0], 40), (texts[1], 5), ("From a CSV file.", 40)])
    assert report["estimated_tokens"] == expected
    # rows whose text takes longer to say than their budget allows: the CSV row (53 codes > 40)
    # and a2 (177 > its own 5), not "Fine." (17)
    assert report["rows_too_long"] == 2
    assert not (tmp_path / "deep").exists()  # not even the output folder
    assert main(["run", spec_file(tmp_path, spec), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "rows       7: 3 to decode, 4 would become error records" in printed
    assert "shards     4 of up to 2 rows, 2 workers at batch 4" in printed
    assert "warning    " in printed and "nothing was decoded or written" in printed
    assert "length     2 rows to decode take longer to say than max_new_tokens allows" in printed


@pytest.mark.parametrize("change, message", [
    ({"models": {"target": "missing-model"}}, "models.target: no checkpoint at"),
    ({"input": {"manifests": ["nothing-here.jsonl"]}}, "input.manifests[0]: no manifest files"),
    ({"output": {"uri": "a-file/out"}}, "output.uri: cannot write under"),
])
def test_a_dry_run_refuses_what_the_job_would_refuse(change, message, kit_dir, tmp_path, capsys):
    manifest = write_manifest(tmp_path / "m.jsonl", [{"id": "x", "text": "Hello."}])
    (tmp_path / "a-file").write_text("a file, not a folder")
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"))
    raw = spec.model_dump(mode="json")
    for section, values in change.items():
        raw[section].update({k: [str(tmp_path / x) for x in v] if isinstance(v, list) else str(tmp_path / v)
                             for k, v in values.items()})
    (tmp_path / "job.yaml").write_text(json.dumps(raw))
    assert main(["run", str(tmp_path / "job.yaml"), "--dry-run"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {message}")


def test_a_dry_run_of_a_sweep_counts_its_runs_and_those_done(kit_dir, tmp_path, capsys):
    from engine.runtime.sweep_grid import points

    manifest = write_manifest(tmp_path / "m.jsonl", [{"id": f"r{i}", "text": "Hello there."} for i in range(5)])
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"), kind="sweep",
                    sweep={"workers": [1, 2], "batch_sizes": [2], "methods": ["ar", "pcg"], "thetas": [0.3, 0.4],
                           "repetitions": 2})
    grid = points(spec)
    assert len(grid) == 2 * (1 + 2)  # ar has no theta
    path = spec_file(tmp_path, spec)
    assert main(["run", path, "--dry-run", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sweep"] == {"points": 6, "repetitions": 2, "runs": 12, "runs_done": 0}
    done = tmp_path / "out" / "points" / "models-w1-b2-ar-r0" / "summary.json"
    done.parent.mkdir(parents=True)
    done.write_text("{}")
    assert main(["run", path, "--dry-run", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["sweep"]["runs_done"] == 1
    # a model pair's checkpoints are checked as its points' jobs check them
    pairs = [{"name": "kit", "target": str(kit_dir / "target"), "draft": str(kit_dir / "draft")},
             {"name": "other", "target": str(kit_dir / "target"), "draft": str(tmp_path / "no-draft")}]
    raw = spec.model_dump(mode="json")
    raw["sweep"]["model_pairs"] = pairs
    raw["output"]["uri"] = str(tmp_path / "pairs-out")
    (tmp_path / "pairs.yaml").write_text(json.dumps(raw))
    refusal = (f"sweep.model_pairs[1].draft: no checkpoint at {tmp_path / 'no-draft'} "
               "(config.json or pcg_streams.json missing)")
    assert main(["run", str(tmp_path / "pairs.yaml"), "--dry-run"]) == 2
    assert capsys.readouterr().err == f"error: {refusal}\n"
    # the sweep itself refuses it before its first point (the kit pair's), from the command line
    # or the API, and writes nothing
    assert main(["run", str(tmp_path / "pairs.yaml")]) == 2
    assert capsys.readouterr().err == f"error: {refusal}\n"
    from engine.config import JobSpec
    from engine.runtime.sweep import run_sweep

    with pytest.raises(ValueError) as refused:
        run_sweep(JobSpec.load(str(tmp_path / "pairs.yaml")), address="local", progress=False)
    assert str(refused.value) == refusal
    assert not (tmp_path / "pairs-out").exists()


def test_a_dry_run_says_when_another_driver_holds_the_output(kit_dir, tmp_path, capsys):
    """The output's lease held by a driver (this test, as a running job would hold it): the dry
    run names it, as a second `run` would be told; released, the dry run says nothing of it."""
    from engine.io.lease import OutputLease
    from engine.io.storage import Storage

    write_manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Hello there."}])
    out = tmp_path / "out"
    spec = job_spec(kit_dir, [str(tmp_path / "m.jsonl")], str(out))
    with OutputLease(Storage(), str(out), job="the-other-job"):
        assert main(["run", spec_file(tmp_path, spec), "--dry-run", "--quiet"]) == 0
        held = json.loads(capsys.readouterr().out)
        assert main(["run", spec_file(tmp_path, spec), "--dry-run"]) == 0
        printed = capsys.readouterr().out
    assert held["output_in_use"].startswith("job 'the-other-job' on host ") and f"(pid {os.getpid()}," in held[
        "output_in_use"]
    assert "in use now by job 'the-other-job'" in printed and "a run would refuse (or wait, with --wait)" in printed
    assert main(["run", spec_file(tmp_path, spec), "--dry-run", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["output_in_use"] is None
