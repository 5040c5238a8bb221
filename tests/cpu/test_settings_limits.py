"""Settings no model can honour are refused, naming the field: a temperature above
`MAX_TEMPERATURE` (the spec's, an augment grid's, a row's), a repetition penalty that is not a
finite positive number, and a `max_new_tokens` above the model's context, which a job refuses
before any work once its target's family (and so its context) is known. A row's own values:
test_manifest_errors.py; an item's: test_row_settings.py."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from engine.cli import main
from engine.config import MAX_TEMPERATURE, DecodingSettings, Warp
from engine.families import FAMILIES, check_max_new_tokens
from engine.io.manifest import ManifestRow
from engine.runtime.job import JobRunner
from engine.runtime.preflight import dry_run

from jobhelpers import job_spec, write_manifest


@pytest.mark.parametrize("field, value", [
    ("temperature", 1e9), ("temperature", MAX_TEMPERATURE + 0.01), ("temperature", math.inf),
    ("temperature", math.nan), ("repetition_penalty", math.inf), ("repetition_penalty", math.nan),
    ("repetition_penalty", 0.0), ("top_p", 0.0), ("top_p", 1.01), ("top_k", -1), ("max_new_tokens", 0)])
def test_settings_out_of_bounds_are_refused_naming_the_field_in_a_spec_and_in_a_row(field, value):
    # a manifest row's override is bounded by the very field it overrides
    for model, given in ((DecodingSettings, {}), (ManifestRow, {"id": "a", "text": "Hello."})):
        with pytest.raises(ValidationError) as refused:
            model(**given, **{field: value})
        assert [e["loc"] for e in refused.value.errors()] == [(field,)]


def test_the_bounds_take_their_edges():
    edges = DecodingSettings(temperature=MAX_TEMPERATURE, top_p=1.0, top_k=0, repetition_penalty=1e-3)
    assert edges.warp == Warp(10.0, top_k=0, top_p=1.0, repetition_penalty=1e-3)
    row = ManifestRow(id="a", text="Hello.", temperature=MAX_TEMPERATURE, top_p=1.0, top_k=0, max_new_tokens=1)
    assert edges.with_overrides(row.overrides()).temperature == 10.0


def test_a_spec_or_an_augment_grid_temperature_above_the_bound_is_refused(tmp_path):
    manifest = [str(write_manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Hello."}]))]
    with pytest.raises(ValidationError, match=r"decoding.temperature\n.*less than or equal to 10"):
        job_spec(tmp_path, manifest, str(tmp_path / "out"), decoding={"temperature": 1e9})
    with pytest.raises(ValidationError, match=r"temperatures must lie in \[0, 10\]"):
        job_spec(tmp_path, manifest, str(tmp_path / "out"), kind="augment", augment={"temperatures": [0.7, 1e9]})
    with pytest.raises(ValidationError, match=r"temperatures must lie in \[0, 10\]"):
        job_spec(tmp_path, manifest, str(tmp_path / "out"), kind="augment", augment={"temperatures": [math.nan]})
    grid = job_spec(tmp_path, manifest, str(tmp_path / "out"), kind="augment", augment={"temperatures": [0, 10]})
    assert grid.augment.temperatures == [0, 10]


def test_the_budget_check_allows_the_context_and_refuses_above_it():
    for family in FAMILIES.values():
        check_max_new_tokens(family.context, family.context, family.name)
        with pytest.raises(ValueError) as refused:
            check_max_new_tokens(family.context + 1, family.context, family.name)
        assert str(refused.value) == (f"max_new_tokens: {family.context + 1} is above the {family.name} model's "
                                      f"context of {family.context} tokens (prompt included), which no row can "
                                      f"exceed: give {family.context} or less")


def test_a_job_budget_above_the_context_is_refused_before_any_work(kit_dir, tmp_path, capsys):
    manifest = [str(write_manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Hello."}]))]
    out = tmp_path / "out"
    spec = job_spec(kit_dir, manifest, str(out), decoding={"max_new_tokens": 10**12})
    refusal = ("decoding.max_new_tokens: 1000000000000 is above the llasa model's context of 2048 tokens "
               "(prompt included), which no row can exceed: give 2048 or less")
    with pytest.raises(ValueError) as refused:
        dry_run(spec)
    assert str(refused.value) == refusal
    with pytest.raises(ValueError) as refused:
        JobRunner(spec, progress=False).run()  # refused before Ray starts or the output is made
    assert str(refused.value) == refusal and not out.exists()
    (tmp_path / "job.yaml").write_text(spec.model_dump_json())  # JSON is YAML
    assert main(["run", str(tmp_path / "job.yaml")]) == 2
    assert capsys.readouterr().err == f"error: {refusal}\n"
    # a sweep refuses it before its first point
    from engine.runtime.sweep import run_sweep

    sweep = job_spec(kit_dir, manifest, str(out), kind="sweep", decoding={"max_new_tokens": 2049},
                     sweep={"methods": ["ar"]})
    with pytest.raises(ValueError, match=r"^decoding.max_new_tokens: 2049 is above the llasa model's context"):
        run_sweep(sweep, address="local", progress=False)
    assert not out.exists()
    # the context itself is a budget a job takes (the context then cuts a row, as it always may)
    assert dry_run(job_spec(kit_dir, manifest, str(out), decoding={"max_new_tokens": 2048}))["rows_ok"] == 1


def test_a_dry_run_names_a_row_budget_above_the_context_as_an_error_row(kit_dir, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [
        {"id": "ok", "text": "Hello."}, {"id": "over", "text": "Hello.", "max_new_tokens": 2049},
        {"id": "edge", "text": "Hello.", "max_new_tokens": 2048}])
    report = dry_run(job_spec(kit_dir, [str(manifest)], str(tmp_path / "out")))
    assert report["rows_ok"] == 2 and report["failing_examples"] == [
        {"source": f"{manifest}:2", "id": "over",
         "error": "max_new_tokens: 2049 is above the llasa model's context of 2048 tokens (prompt included), "
                  "which no row can exceed: give 2048 or less"}]
