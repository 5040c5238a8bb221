"""Stream heads as a drafter through the user-facing paths: `Synthesizer.load` of a heads
directory, greedy parity with `ar`, gamma capped at the heads' count (fixed and `auto`), the cost
model's step times and `ForwardClock`, `pcg-synth generate --drafter`, and the dry run's sizing.

The heads are random (`save_streams` into a temporary folder), never the kit's own `streams/`:
greedy parity holds whatever the drafter proposes, so random heads test the wiring, not the heads.
"""

from __future__ import annotations

import json

import pytest
import torch

from engine import DecodingSettings, Synthesizer
from engine.cli import main
from engine.decoding.adaptive import CANDIDATES, gamma_candidates
from engine.decoding.cost import ForwardClock, speculation_outlook, step_times
from engine.groups.csr import SpeechGroups
from engine.models.streams import StreamHeads, is_streams_dir, save_streams, stream_shape_for

from synthhelpers import TEXTS

HEADS = 4
PARITY = dict(temperature=0, max_new_tokens=16)


def write_heads(out, synth: Synthesizer, heads: int, seed: int = 0):
    """Random stream heads for `synth`'s target, saved as `pcg-synth draft train --kind streams` does."""
    torch.manual_seed(seed)
    model = synth.target.model
    made = StreamHeads(stream_shape_for(model.shape, heads))
    return save_streams(out, made, {"vocab_out": model.vocab_out, "hidden_size": model.shape.hidden_size})


@pytest.fixture(scope="module")
def streams_dir(kit_synth, tmp_path_factory):
    return write_heads(tmp_path_factory.mktemp("streams") / "streams", kit_synth, HEADS)


@pytest.fixture(scope="module")
def streams64(kit_dir, streams_dir):
    """A float64 CPU Synthesizer whose drafter is the random heads, with singleton groups (PCG at
    theta 1 is exact: its greedy codes are the target's)."""
    synth = Synthesizer.load(kit_dir / "target", draft=streams_dir, device="cpu", dtype="float64", batch_size=3)
    synth.set_groups(SpeechGroups.singletons(synth.layout.num_codes))
    return synth


@pytest.fixture(scope="module")
def greedy_codes(streams64):
    results, summary = streams64.synthesize(TEXTS[:3], DecodingSettings(method="ar", **PARITY), batch_size=1)
    assert summary.drafter is None  # `ar` drafts nothing
    return [r.codes for r in results]


def test_a_streams_directory_loads_as_the_drafter(streams64, streams_dir):
    assert is_streams_dir(streams_dir) and not is_streams_dir(streams_dir.parent)
    assert streams64.draft is None and streams64.drafter is streams64.streams
    assert streams64.drafter_kind == "streams" and streams64.max_gamma == HEADS
    assert streams64.streams.dtype == torch.float64  # loaded in the target's dtype


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("method, extra", [("exact", {}), ("pcg", {"theta": 1.0})])
def test_greedy_speculation_with_stream_heads_equals_greedy_target(streams64, greedy_codes, method, extra,
                                                                    batch_size):
    settings = DecodingSettings(method=method, gamma=HEADS, **PARITY, **extra)
    results, summary = streams64.synthesize(TEXTS[:3], settings, batch_size=batch_size)
    assert [r.codes for r in results] == greedy_codes
    assert summary.stats.drafted > 0 and summary.drafter == "streams"
    assert summary.to_dict()["drafter"] == "streams"


def test_a_gamma_above_the_heads_count_is_refused_before_decoding(streams64, streams_dir):
    with pytest.raises(ValueError, match=f"gamma 6 needs 6 stream heads; {streams_dir} has {HEADS}"):
        streams64.synthesize(["Hi."], DecodingSettings(method="exact", gamma=6, max_new_tokens=4))
    with pytest.raises(ValueError, match="stream heads"):  # a session's rows (a job worker's) too
        streams64.session(2).submit([(DecodingSettings(method="exact", gamma=HEADS + 1),
                                      streams64.request("Hi.", DecodingSettings(), 0, 0))])


def test_gamma_candidates_stop_at_the_heads_count():
    assert gamma_candidates(None) == CANDIDATES
    assert gamma_candidates(2) == (1, 2)
    assert gamma_candidates(5) == (1, 2, 3, 4, 5)  # the heads' own count is a candidate
    assert gamma_candidates(64) == CANDIDATES
    with pytest.raises(ValueError, match="at least one"):
        gamma_candidates(0)


def test_gamma_auto_chooses_within_the_heads(kit_dir, kit_synth, tmp_path):
    # two heads: fewer than the pilot's usual gamma (4) and than most candidates
    synth = Synthesizer.load(kit_dir / "target", draft=write_heads(tmp_path / "two", kit_synth, 2), device="cpu",
                             dtype="float32", batch_size=1)
    assert synth.pilot_gamma == 2
    settings = DecodingSettings(method="exact", gamma="auto", max_new_tokens=16)
    chosen, choice = synth.resolve_gamma(settings, [synth.request("Hello there.", settings, 0, 0)], 1)
    assert set(choice.step_times) == set(choice.predicted_speedup) == {1, 2}
    assert chosen.gamma <= 2 and choice.gamma in (0, 1, 2)
    assert (chosen.method == "ar") == (choice.gamma == 0)


def test_step_times_time_one_pass_of_the_heads(streams64):
    target, heads = streams64.target.model, streams64.streams
    times = step_times(target, heads, 2, 3, 16, reps=2)
    assert set(times) == {"ar_s", "verify_s", "draft_phase_s", "draft_step_s"}
    assert times["draft_phase_s"] > 0 and times["draft_step_s"] == pytest.approx(times["draft_phase_s"] / 3)
    with pytest.raises(ValueError, match=f"gamma {HEADS + 1} needs {HEADS + 1} stream heads"):
        step_times(target, heads, 1, HEADS + 1, 16, reps=1)
    said = speculation_outlook(target, heads, 3, 16, {"exact": 1.5}, reps=1)
    assert "a round costs the stream heads" in said and "exact: 1.50 tokens per round" in said


def test_the_forward_clock_times_the_heads_as_decode_forwards_and_lets_them_go(streams64):
    heads = streams64.streams
    with ForwardClock(streams64.target.model, heads) as clock:
        assert "follow" in vars(heads) and "logits" in vars(heads)
        streams64.synthesize(["Hi."], DecodingSettings(method="exact", gamma=2, max_new_tokens=6), batch_size=1)
    assert clock.decode_s > 0 and clock.prefill_s > 0
    assert "follow" not in vars(heads) and "logits" not in vars(heads)  # the class's methods again


@pytest.fixture
def tiny_kit_without_streams(kit_dir, tmp_path):
    """A kit folder of the session kit's target and draft (linked), with no `streams/`."""
    kit = tmp_path / "kit"
    kit.mkdir()
    for part in ("target", "draft"):
        (kit / part).symlink_to(kit_dir / part, target_is_directory=True)
    return kit


def test_generate_with_the_kits_stream_heads(tiny_kit_without_streams, kit_synth, tmp_path, capsys):
    kit = tiny_kit_without_streams
    write_heads(kit / "streams", kit_synth, 3)
    out = tmp_path / "codes.json"
    code = main(["generate", "--kit", str(kit), "--drafter", "streams", "--text", "Hello there.", "--method", "exact",
                 "--gamma", "3", "--max-new-tokens", "8", "--device", "cpu", "--dtype", "float32", "--out", str(out),
                 "--quiet"])
    assert code == 0, capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert doc["drafter"] == "streams" and doc["draft"] == str(kit / "streams")
    summary = doc["runs"][0]["summary"]
    assert summary["drafter"] == "streams" and summary["ok"] == 1 and summary["drafted"] > 0


def test_generate_says_when_the_drafter_asked_for_is_not_there(tiny_kit_without_streams, kit_dir, streams_dir,
                                                               capsys):
    base = ["generate", "--text", "Hi.", "--method", "exact", "--device", "cpu"]
    assert main([*base, "--kit", str(tiny_kit_without_streams), "--drafter", "streams"]) == 2
    err = capsys.readouterr().err
    assert "--drafter streams: the kit" in err and "has no stream heads" in err and "pcg_streams.json" in err
    # with --draft the path decides, and --drafter must agree
    assert main([*base, "--target", str(kit_dir / "target"), "--draft", str(kit_dir / "draft"),
                 "--drafter", "streams"]) == 2
    assert "--drafter streams but --draft" in capsys.readouterr().err
    assert main([*base, "--target", str(kit_dir / "target"), "--draft", str(streams_dir), "--drafter", "model"]) == 2
    assert "holds stream heads" in capsys.readouterr().err


def test_a_job_worker_drafts_with_stream_heads_and_gives_the_apis_codes(kit_dir, streams_dir, streams64, tmp_path):
    import pyarrow.parquet as pq

    from engine import SynthesisItem
    from engine.models.loading import checkpoint_revision
    from engine.runtime.plan import make_plan
    from engine.runtime.worker import ShardProcessor, revision

    from jobhelpers import job_spec, texts, write_manifest

    rows = texts(4)
    spec = job_spec(kit_dir, [str(write_manifest(tmp_path / "m.jsonl", rows))], str(tmp_path / "out"),
                    models={"draft": str(streams_dir), "dtype": "float64"},
                    decoding={"method": "exact", "gamma": HEADS, "max_new_tokens": 12, "seed": 3},
                    resources={"workers": 1, "batch_size": 4, "rows_per_shard": 2})
    processor = ShardProcessor(spec)
    try:
        assert processor.synth.drafter_kind == "streams"
        records = [processor.submit(s).result(timeout=600) for s in make_plan(spec, processor.storage).shards]
    finally:
        processor.close()
    out = {row["id"]: row["codes"] for r in records for row in pq.read_table(r.data).to_pylist()}
    results, _ = streams64.synthesize([SynthesisItem(text=r["text"], id=r["id"]) for r in rows], spec.decoding,
                                      batch_size=2)
    assert {r.id: r.codes for r in results} == out
    # the heads' provenance holds their record: heads of one shape trained apart differ
    assert processor.revisions["draft"] == revision(streams_dir) != checkpoint_revision(streams_dir)


def test_the_dry_runs_sizing_counts_stream_heads_as_a_small_extra(streams_dir, kit_dir):
    from engine.decoding.sizing import LMSize, StreamsSize, Worker
    from engine.families import FAMILIES
    from engine.io.storage import Storage
    from engine.runtime import sizing

    config, info = sizing.drafter_config(Storage(), str(streams_dir))
    assert config is None and info["parameters"] > 0
    config, info = sizing.drafter_config(Storage(), str(kit_dir / "draft"))
    assert info is None and config["num_hidden_layers"] >= 1
    target = LMSize.from_config(json.loads((kit_dir / "target" / "config.json").read_text()))
    heads = StreamsSize.from_info(sizing.drafter_config(Storage(), str(streams_dir))[1])
    llasa = FAMILIES["llasa"]
    alone, with_heads = Worker(llasa, target, None, 4, HEADS), Worker(llasa, target, None, 4, HEADS, streams=heads)
    assert with_heads.kv_per_row() == alone.kv_per_row()  # no cache of their own
    assert with_heads.base() - alone.base() == heads.parameters * 2  # bfloat16 weights
    assert with_heads.per_row() - alone.per_row() == (HEADS + 1) * heads.hidden * 2  # their states
    # one pass of the heads a round, and the target's head again over their states
    assert with_heads.round_bytes() - alone.round_bytes() == (heads.parameters + llasa.output_ids * target.hidden) * 2
    assert with_heads.round_bytes(0) == alone.round_bytes(0)  # `ar` runs no drafter


def test_a_jobs_preflight_takes_stream_heads_as_the_drafter_only(streams_dir):
    from engine.io.storage import Storage
    from engine.runtime.preflight import check_checkpoint

    check_checkpoint(Storage(), str(streams_dir), "models.draft")
    check_checkpoint(Storage(), str(streams_dir), "sweep.model_pairs[0].draft")
    with pytest.raises(ValueError, match="models.target: no checkpoint at .* \\(config.json missing\\)"):
        check_checkpoint(Storage(), str(streams_dir), "models.target")
