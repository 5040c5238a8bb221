"""`pcg-synth groups build | stats | sweep`, through `register` on a fresh parser (the same code the
main CLI calls), against the tiny kit's real checkpoint and small matrices."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import ray

from engine.cli import main
from engine.groups.build import build_groups, unit_rows
from engine.groups.cache import get_groups
from engine.groups.options import GroupsBuild
from engine.groups.source import load_speech_embeddings
from engine.groups.store import load_groups


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["groups", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def small_npy(tmp_path) -> str:
    path = tmp_path / "emb.npy"
    np.save(path, np.random.default_rng(0).standard_normal((800, 16)).astype(np.float32))
    return str(path)


@pytest.mark.slow  # one full 65,536^2 search plus a Ray cluster
def test_build_from_checkpoint_with_two_workers_fills_the_cache(kit_dir, kit_synth, tmp_path, capsys,
                                                                monkeypatch):
    """One 65,536-token build through Ray; the API's own embeddings then hit the same entry."""
    monkeypatch.setenv("RAY_ADDRESS", "local")  # a fresh local cluster, not another test's
    assert not ray.is_initialized()
    code, out, _ = run(capsys, "build", "--target", str(kit_dir / "target"), "--theta", "0.4",
                       "--workers", "2", "--cache-dir", str(tmp_path), "--quiet")
    assert code == 0, out
    assert "tokens 65536" in out and "truncated 0" in out and "written to" in out
    assert not ray.is_initialized(), "the CLI must shut down the cluster it started"
    layout = kit_synth.layout  # what the API passes: the checkpoint's family and code ranges
    hit = get_groups(kit_synth.speech_embeddings(), GroupsBuild(0.4, ranges=layout.ranges, family=layout.family),
                     cache_dir=tmp_path)
    assert hit.meta["cache"] == "hit" and hit.meta["family"] == "llasa" and hit.code_ranges == [(0, 65536)]
    assert hit.num_tokens == 65536 and hit.members.dtype == np.uint16
    # A few groups against brute force on the model's rows.
    x = unit_rows(kit_synth.speech_embeddings()).astype(np.float64)
    for t in (0, 4242, 65535):
        want = np.flatnonzero(x @ x[t] >= 0.4)
        np.testing.assert_array_equal(hit.group_of(t), np.union1d(want, [t]))
    code, out, _ = run(capsys, "stats", hit.meta["cache_path"])
    assert code == 0
    assert "theta 0.4" in out and "source input_embeddings" in out and "size histogram" in out
    assert "family llasa, 1 range of 65,536 codes" in out and "per code range" not in out
    assert f"singletons {int((hit.sizes == 1).sum())}" in out


def test_loader_reads_the_models_speech_rows(kit_dir, kit_synth):
    rows = load_speech_embeddings(kit_dir / "target")
    assert rows.shape == (65536, 128)
    assert np.array_equal(rows.numpy(), kit_synth.speech_embeddings().numpy())
    head = load_speech_embeddings(kit_dir / "target", source="lm_head")  # tied: same table
    assert np.array_equal(head.numpy(), rows.numpy())


def test_a_bfloat16_synthesizer_groups_the_stored_rows(kit_dir, kit_synth):
    """`generate` in bfloat16 (`dtype: auto` on a bfloat16 CPU or a GPU) builds its groups from
    the checkpoint's float32 rows, as a job's driver does, not from the rows rounded to bfloat16:
    both find the same entry of the groups cache (the same groups)."""
    import torch

    from engine import Synthesizer
    from engine.groups.source import embeddings_sha256

    synth = Synthesizer.load(kit_dir / "target", device="cpu", dtype="bfloat16")
    stored = load_speech_embeddings(kit_dir / "target")
    assert stored.dtype == torch.float32
    first = synth.target.layout.first_code
    rounded = synth.target.model.model.embed_tokens.weight[first: first + len(stored)]
    assert rounded.dtype == torch.bfloat16 and not torch.equal(rounded.float(), stored)  # rounded: not the source
    assert torch.equal(synth.speech_embeddings(), stored)
    assert embeddings_sha256(synth.speech_embeddings()) == embeddings_sha256(kit_synth.speech_embeddings())


def test_build_to_file_then_stats(small_npy, tmp_path, capsys):
    out_path = tmp_path / "g.safetensors"
    code, out, _ = run(capsys, "build", "--embeddings", small_npy, "--theta", "0.3",
                       "--max-group-size", "8", "--dedup", "--out", str(out_path), "--quiet")
    assert code == 0 and out_path.is_file()
    expected = build_groups(np.load(small_npy), 0.3, 8)
    assert f"truncated {expected.truncated}" in out and expected.truncated > 0
    code, out, _ = run(capsys, "stats", str(out_path), "--json")
    meta = json.loads(out)
    assert code == 0 and meta["dedup"] is True and meta["max_group_size"] == 8
    assert meta["stats"]["truncated"] == expected.truncated
    assert meta["file_bytes"] == out_path.stat().st_size


def test_sweep_prints_one_row_per_theta(small_npy, capsys):
    code, out, _ = run(capsys, "sweep", "--embeddings", small_npy, "--thetas", "0.35,0.40,0.45",
                       "--json", "--quiet")
    rows = json.loads(out)
    assert code == 0 and [r["theta"] for r in rows] == [0.35, 0.4, 0.45]
    for r in rows:
        assert r["mean_size"] == pytest.approx(build_groups(np.load(small_npy), r["theta"]).sizes.mean(),
                                               abs=1e-4)
    code, out, _ = run(capsys, "sweep", "--embeddings", small_npy, "--thetas", "0.35,0.40", "--quiet")
    assert "mean size" in out and "coverage" in out and len(out.strip().splitlines()) == 5


@pytest.mark.parametrize("argv,message", [
    (["build", "--embeddings", "x.npy", "--theta", "1.5"],
     r"theta must lie in \(0, 1\] \(a cosine threshold\); got 1.5"),
    (["build", "--embeddings", "missing.npy", "--theta", "0.4"], "--embeddings missing.npy does not exist"),
    (["build", "--theta", "0.4"], "give --target DIR"),
    (["build", "--embeddings", "x.npy", "--theta", "0.4", "--max-group-size", "0"],
     "max_group_size must be a positive integer"),
    (["build", "--target", "/nonexistent/ckpt", "--theta", "0.4"],
     "model directory /nonexistent/ckpt does not exist"),
    (["sweep", "--embeddings", "x.npy", "--thetas", "0.3,abc"], "thetas must be comma-separated"),
    (["stats", "/nonexistent/g.safetensors"], "groups file /nonexistent/g.safetensors does not exist"),
    (["build", "--target", "/nonexistent/ckpt", "--ranges", "7x4096", "--theta", "0.4"],
     "--ranges goes with --embeddings; a --target checkpoint's code ranges are read from its tokenizer"),
    (["sweep", "--embeddings", "x.npy", "--ranges", "7x", "--thetas", "0.4"],
     "ranges must be positive sizes in order, e.g. 7x4096"),
])
def test_user_errors_are_one_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")
    assert re.search(message, err), err


def test_stats_on_a_corrupt_file_is_one_line(small_npy, tmp_path, capsys):
    path = tmp_path / "g.safetensors"
    assert run(capsys, "build", "--embeddings", small_npy, "--theta", "0.4", "--out", str(path),
               "--quiet")[0] == 0
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))
    code, _, err = run(capsys, "stats", str(path))
    assert code == 2 and err == f"error: {path}: corrupt groups file (content hash mismatch)\n"


def test_build_within_ranges_then_stats_per_range(small_npy, tmp_path, capsys):
    out_path = tmp_path / "g.safetensors"
    code, out, _ = run(capsys, "build", "--embeddings", small_npy, "--ranges", "500,300", "--theta", "0.3",
                       "--out", str(out_path), "--quiet")
    assert code == 0 and "2 ranges of 500, 300 codes" in out
    expected = build_groups(np.load(small_npy), 0.3, ranges=[(0, 500), (500, 300)])
    assert load_groups(out_path).code_ranges == [(0, 500), (500, 300)]
    np.testing.assert_array_equal(load_groups(out_path).members, expected.members)
    code, out, _ = run(capsys, "stats", str(out_path))
    lines = out.splitlines()
    assert code == 0 and "family unknown, 2 ranges of 500, 300 codes" in lines[0]
    per_range = lines[lines.index("per code range:") + 2:]
    assert [line.split()[:2] for line in per_range] == [["0..499", "500"], ["500..799", "300"]]
    for line, (start, size) in zip(per_range, [(0, 500), (500, 300)]):
        assert float(line.split()[2]) == pytest.approx(expected.sizes[start:start + size].mean(), abs=0.005)
    code, out, err = run(capsys, "build", "--embeddings", small_npy, "--ranges", "500,200", "--theta", "0.3",
                         "--out", str(out_path), "--quiet")
    assert code == 2 and "code ranges must tile 0..799 contiguously, in order; they cover 700 rows" in err


def test_sweep_within_ranges(small_npy, capsys):
    code, out, _ = run(capsys, "sweep", "--embeddings", small_npy, "--ranges", "2x400", "--thetas", "0.3",
                       "--json", "--quiet")
    (row,) = json.loads(out)
    sizes = build_groups(np.load(small_npy), 0.3, ranges=[(0, 400), (400, 400)]).sizes
    assert code == 0 and row["nnz"] == int(sizes.sum()) < int(build_groups(np.load(small_npy), 0.3).sizes.sum())


@pytest.mark.slow  # builds the Orpheus kit (shared with test_orpheus.py)
def test_build_from_an_orpheus_checkpoint_groups_each_frame_position(orpheus_kit_dir, tmp_path, capsys):
    """`--target` takes the family and its seven code ranges from the checkpoint's tokenizer."""
    from engine.groups.store import GroupFileError, from_bytes

    out_path = tmp_path / "orpheus.safetensors"
    code, out, _ = run(capsys, "build", "--target", str(orpheus_kit_dir / "target"), "--theta", "0.4",
                       "--out", str(out_path), "--quiet")
    assert code == 0 and "(orpheus, input_embeddings)" in out and "7 ranges of 4,096 codes" in out
    groups = load_groups(out_path, expect={"family": "orpheus", "ranges": [(p * 4096, 4096) for p in range(7)]})
    assert groups.meta["family"] == "orpheus" and groups.num_tokens == 28672
    position = groups.members.astype(np.int64) // 4096
    rows = np.repeat(np.arange(28672) // 4096, groups.sizes)
    np.testing.assert_array_equal(position, rows)  # every member in its token's frame position
    assert groups.sizes.mean() > 1.0, "some groups should hold more than their token"
    code, out, _ = run(capsys, "stats", str(out_path))
    assert code == 0 and "family orpheus, 7 ranges of 4,096 codes" in out and "24576..28671" in out
    with pytest.raises(GroupFileError, match=r"built for an orpheus target \(7 ranges of 4,096 codes\), not llasa "
                                             r"\(1 range of 28,672 codes\)"):
        from_bytes(out_path.read_bytes(), str(out_path), {"family": "llasa", "ranges": [(0, 28672)]})
