"""Groups file format (round trips, dedup, corruption, versions) and the content-addressed cache."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from engine.groups import store
from engine.groups.cache import LocalDirStore, build_with_metadata, cache_key, default_cache_dir, get_groups
from engine.groups.csr import GroupIndex, SpeechGroups
from engine.groups.options import GroupsBuild
from engine.groups.source import embeddings_sha256
from engine.groups.stats import group_stats
from engine.groups.store import GroupFileError, deduplicate, from_bytes, load_groups, save_groups, to_bytes


def embeddings(n: int = 600, d: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32))


@pytest.fixture(scope="module")
def emb() -> torch.Tensor:
    return embeddings()


def same_arrays(x: np.ndarray | None, y: np.ndarray | None) -> bool:
    if x is None or y is None:
        return x is None and y is None
    return x.dtype == y.dtype and np.array_equal(x, y)


def same_groups(a: SpeechGroups, b: SpeechGroups) -> bool:
    arrays = ("indptr", "members", "home", "full_sizes")
    scalars = ("theta", "num_tokens", "max_group_size", "truncated")
    return all(same_arrays(getattr(a, f), getattr(b, f)) for f in arrays) and \
        all(getattr(a, f) == getattr(b, f) for f in scalars)


@pytest.mark.parametrize("cap,dedup", [(None, False), (8, False), (None, True), (8, True)])
def test_round_trip(emb, tmp_path, cap, dedup):
    built = build_with_metadata(emb, GroupsBuild(0.4, cap, dedup=dedup))
    path = save_groups(built, tmp_path / "g.safetensors")
    loaded = load_groups(path, expect={"embeddings_sha256": embeddings_sha256(emb), "theta": 0.4})
    assert same_groups(built, loaded)
    meta = loaded.meta
    assert meta["format_version"] == store.FORMAT_VERSION and meta["metric"] == "cosine"
    assert meta["source"] == "input_embeddings" and meta["embeddings_shape"] == [600, 16]
    assert meta["stats"]["truncated"] == built.truncated and meta["dedup"] is dedup
    assert meta["stats"]["mean_size"] == pytest.approx(built.sizes[built.home].mean() if dedup
                                                       else built.sizes.mean(), abs=1e-4)


def test_dedup_round_trip_keeps_every_group(tmp_path):
    # Each row appears 6 times, so each group 6 times: dedup must shrink and stay exact.
    base = embeddings(100, 16, seed=1)
    emb = base[torch.arange(600) % 100]
    plain = build_with_metadata(emb, GroupsBuild(0.5))
    deduped = deduplicate(plain)
    assert deduped.num_groups <= 100 and deduped.num_tokens == 600
    loaded = load_groups(save_groups(build_with_metadata(emb, GroupsBuild(0.5, dedup=True)), tmp_path / "d.st"))
    assert same_groups(deduped, loaded)
    for t in range(600):
        np.testing.assert_array_equal(loaded.group_of(t), plain.group(t))
    # The reverse index in the file is S(t), the distinct groups containing t.
    raw = load_file(str(tmp_path / "d.st"))
    for tok in (0, 137, 599):
        s = raw["contain"][raw["contain_indptr"][tok]:raw["contain_indptr"][tok + 1]]
        assert all(tok in loaded.group(int(k)) for k in s)
        containing = sum(tok in loaded.group(k) for k in range(loaded.num_groups))
        assert len(s) == raw["n_contain"][tok] == containing
    index = GroupIndex(loaded, 601)
    assert int(index.n_contain[137]) == raw["n_contain"][137]


def test_member_ids_use_uint16_and_group_index_accepts_loaded(emb, tmp_path):
    loaded = load_groups(save_groups(build_with_metadata(emb, GroupsBuild(0.35)), tmp_path / "g.st"))
    assert loaded.members.dtype == np.uint16
    index = GroupIndex(loaded, 601)
    assert index.symmetric and index.num_groups == 601


def flip_byte(data: bytes, offset: int) -> bytes:
    return data[:offset] + bytes([data[offset] ^ 0x40]) + data[offset + 1:]


def test_corrupt_files_fail_clearly(emb):
    data = to_bytes(build_with_metadata(emb, GroupsBuild(0.4)))
    with pytest.raises(GroupFileError, match="content hash mismatch"):
        from_bytes(flip_byte(data, len(data) - 5), "g.st")  # a member id deep in the data
    with pytest.raises(GroupFileError, match="g.st: not a pcg-synth groups file, or corrupt"):
        from_bytes(data[:100], "g.st")  # cut inside the header
    with pytest.raises(GroupFileError, match="corrupt groups file"):
        from_bytes(data[:-64], "g.st")  # cut inside the tensors
    with pytest.raises(GroupFileError, match="not a pcg-synth groups file"):
        from_bytes(b"\x00" * 7, "g.st")


def rewrite_meta(data: bytes, **changes) -> bytes:
    """The same tensors with edited metadata (a well-formed file from another writer)."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = json.loads(header["__metadata__"][store.META_KEY])
    meta.update(changes)
    header["__metadata__"][store.META_KEY] = json.dumps(meta)
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob + data[8 + n:]


def test_version_format_and_mismatch_fail_clearly(emb, tmp_path):
    data = to_bytes(build_with_metadata(emb, GroupsBuild(0.4)))
    assert same_groups(from_bytes(rewrite_meta(data)), from_bytes(data))  # the editor is faithful
    with pytest.raises(GroupFileError, match="content hash mismatch"):
        from_bytes(rewrite_meta(data, theta=0.6), "g.st")  # metadata is covered by the hash too
    with pytest.raises(GroupFileError, match="format version 99, this pcg-synth reads version 1"):
        from_bytes(rewrite_meta(data, format_version=99), "g.st")
    with pytest.raises(GroupFileError, match="format 'something-else'"):
        from_bytes(rewrite_meta(data, format="something-else"), "g.st")
    with pytest.raises(GroupFileError, match="built for embeddings_sha256="):
        from_bytes(data, "g.st", expect={"embeddings_sha256": embeddings_sha256(embeddings(seed=9))})
    with pytest.raises(GroupFileError, match="built for theta=0.4, but 0.45 was asked for"):
        from_bytes(data, "g.st", expect={"theta": 0.45})
    with pytest.raises(GroupFileError, match="does not exist"):
        load_groups(tmp_path / "missing.safetensors")


def test_provenance_is_required_to_save():
    with pytest.raises(ValueError, match="lack provenance"):
        to_bytes(SpeechGroups.singletons(4))


def test_cache_builds_once_then_hits(emb, tmp_path):
    first = get_groups(emb, GroupsBuild(0.4), cache_dir=tmp_path)
    assert first.meta["cache"] == "miss"
    files = list(tmp_path.iterdir())
    assert [f.name for f in files] == [cache_key(embeddings_sha256(emb), 0.4, None, False)]
    mtime = files[0].stat().st_mtime_ns
    second = get_groups(emb.clone(), GroupsBuild(0.4), cache_dir=tmp_path)
    assert second.meta["cache"] == "hit" and same_groups(first, second)
    assert files[0].stat().st_mtime_ns == mtime
    # Every input of the key gives its own entry.
    get_groups(emb, GroupsBuild(0.45), cache_dir=tmp_path)
    get_groups(emb, GroupsBuild(0.4, max_group_size=4), cache_dir=tmp_path)
    get_groups(emb, GroupsBuild(0.4, dedup=True), cache_dir=tmp_path)
    get_groups(embeddings(seed=5), GroupsBuild(0.4), cache_dir=tmp_path)
    assert len(list(tmp_path.iterdir())) == 5


def test_cache_replaces_a_corrupt_entry(emb, tmp_path):
    first = get_groups(emb, GroupsBuild(0.4), cache_dir=tmp_path)
    path = tmp_path / cache_key(embeddings_sha256(emb), 0.4, None, False)
    data = path.read_bytes()
    path.write_bytes(flip_byte(data, len(data) - 5))
    with pytest.warns(UserWarning, match=r"content hash mismatch\); rebuilding"):
        again = get_groups(emb, GroupsBuild(0.4), cache_dir=tmp_path)
    assert again.meta["cache"] == "miss" and same_groups(first, again)
    assert path.read_bytes() == data


class CountingStore(LocalDirStore):
    """A pluggable store: the cache must go through exists/get/put only."""

    def __init__(self, root):
        super().__init__(root)
        self.calls = []

    def exists(self, key):
        self.calls.append("exists")
        return super().exists(key)

    def get(self, key):
        self.calls.append("get")
        return super().get(key)

    def put(self, key, data):
        self.calls.append("put")
        super().put(key, data)


def test_cache_uses_a_plugged_store(emb, tmp_path):
    blobs = CountingStore(tmp_path / "bucket")
    get_groups(emb, GroupsBuild(0.4), store=blobs)
    get_groups(emb, GroupsBuild(0.4), store=blobs)
    assert blobs.calls == ["exists", "put", "exists", "get"]


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("PCG_SYNTH_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path / "groups"
    monkeypatch.delenv("PCG_SYNTH_CACHE")
    assert str(default_cache_dir()).endswith(".cache/pcg-synth/groups")


def test_embeddings_hash_is_dtype_independent_and_content_sensitive(emb):
    assert embeddings_sha256(emb) == embeddings_sha256(emb.double()) == embeddings_sha256(emb.numpy())
    changed = emb.clone()
    changed[3, 2] += 1e-3
    assert embeddings_sha256(changed) != embeddings_sha256(emb)
    assert embeddings_sha256(emb.reshape(300, 32)) != embeddings_sha256(emb)


# ---- family and code ranges ------------------------------------------------------------------

TWO = [(0, 250), (250, 350)]


def without_layout(data: bytes) -> bytes:
    """`data` as a writer from before families and code ranges wrote it: neither key in the
    metadata, a content hash over what is left (an intact old file)."""
    (n,) = struct.unpack("<Q", data[:8])
    meta = json.loads(json.loads(data[8:8 + n])["__metadata__"][store.META_KEY])
    del meta["family"], meta["ranges"]
    tensors = store.st_load(data)
    meta["content_sha256"] = store.content_sha256(tensors, meta)
    return store.st_save(tensors, metadata={store.META_KEY: json.dumps(meta, sort_keys=True)})


def resealed(data: bytes, **changes) -> bytes:
    """Metadata edited and the content hash recomputed: a file a faulty writer made."""
    (n,) = struct.unpack("<Q", data[:8])
    meta = json.loads(json.loads(data[8:8 + n])["__metadata__"][store.META_KEY])
    meta.update(changes)
    tensors = store.st_load(data)
    meta["content_sha256"] = store.content_sha256(tensors, meta)
    return store.st_save(tensors, metadata={store.META_KEY: json.dumps(meta, sort_keys=True)})


def test_round_trip_keeps_family_and_ranges(emb, tmp_path):
    built = build_with_metadata(emb, GroupsBuild(0.4, 8, ranges=TWO, family="orpheus"))
    loaded = load_groups(save_groups(built, tmp_path / "g.st"),
                         expect={"family": "orpheus", "ranges": TWO, "theta": 0.4})
    assert same_groups(built, loaded)
    assert loaded.meta["family"] == "orpheus" and loaded.meta["ranges"] == [[0, 250], [250, 350]]
    assert loaded.code_ranges == TWO
    plain = from_bytes(to_bytes(build_with_metadata(emb, GroupsBuild(0.4))))
    assert plain.meta["family"] is None and plain.meta["ranges"] == [[0, 600]]


def test_another_familys_file_is_refused_naming_both(emb):
    llasa = to_bytes(build_with_metadata(emb, GroupsBuild(0.4, family="llasa")))
    other_rows = embeddings_sha256(embeddings(seed=9))  # wrong as well: the family is what the user hears
    with pytest.raises(GroupFileError, match=r"^g\.st: built for a llasa target \(1 range of 600 codes\), not "
                                             r"orpheus \(2 ranges of 250, 350 codes\)"):
        from_bytes(llasa, "g.st", expect={"embeddings_sha256": other_rows, "family": "orpheus", "ranges": TWO})
    with pytest.raises(GroupFileError, match=r"built for a llasa target \(1 range of 600 codes\), not orpheus:"):
        from_bytes(llasa, "g.st", expect={"family": "orpheus"})
    orpheus = to_bytes(build_with_metadata(emb, GroupsBuild(0.4, ranges=[(0, 300), (300, 300)], family="orpheus")))
    with pytest.raises(GroupFileError, match=r"built for an orpheus target \(2 ranges of 300 codes\), not "
                                             r"this target \(1 range of 600 codes\)"):
        from_bytes(orpheus, "g.st", expect={"ranges": [(0, 600)]})
    assert from_bytes(llasa, "g.st", expect={"family": "llasa", "ranges": [(0, 600)]}).meta["family"] == "llasa"


def test_an_old_file_without_family_or_ranges_serves_one_range(emb):
    old = without_layout(to_bytes(build_with_metadata(emb, GroupsBuild(0.4))))
    expect = {"family": "llasa", "ranges": [(0, 600)], "embeddings_sha256": embeddings_sha256(emb), "theta": 0.4}
    loaded = from_bytes(old, "old.st", expect)
    assert loaded.meta["family"] is None and loaded.meta["ranges"] == [[0, 600]] and loaded.code_ranges == [(0, 600)]
    assert "family" not in json.loads(old[8:8 + struct.unpack("<Q", old[:8])[0]])["__metadata__"][store.META_KEY]
    with pytest.raises(GroupFileError, match=r"old\.st: built for a target of unknown family \(1 range of 600 "
                                             r"codes\), not orpheus \(2 ranges of 250, 350 codes\)"):
        from_bytes(old, "old.st", {**expect, "family": "orpheus", "ranges": TWO})


def test_ranges_that_groups_cross_or_that_do_not_tile_are_corrupt(emb):
    data = to_bytes(build_with_metadata(emb, GroupsBuild(0.4)))  # one range: its groups cross 250
    with pytest.raises(GroupFileError, match=r"g\.st: corrupt groups file \(a group mixes code ranges\)"):
        from_bytes(resealed(data, ranges=[[0, 250], [250, 350]]), "g.st")
    with pytest.raises(GroupFileError, match=r"corrupt groups file \(code ranges \[\[0, 250\]\] do not tile 0..599"):
        from_bytes(resealed(data, ranges=[[0, 250]]), "g.st")
    assert from_bytes(resealed(data, family="llasa")).meta["family"] == "llasa"  # the helper alone breaks nothing


def test_stats_per_code_range(emb):
    groups = build_with_metadata(emb, GroupsBuild(0.55, 6, ranges=TWO, family="orpheus"))
    stats = from_bytes(to_bytes(groups)).meta["stats"]
    sizes = groups.sizes
    assert [(r["start"], r["size"]) for r in stats["ranges"]] == TWO
    for r, (start, size) in zip(stats["ranges"], TWO):
        part = sizes[start:start + size]
        assert r["mean_size"] == pytest.approx(part.mean(), abs=1e-4) and r["max_size"] == part.max()
        assert r["singletons"] == int((part == 1).sum())
        assert r["truncated"] == int((groups.full_sizes[start:start + size] > 6).sum())
    assert sum(r["truncated"] for r in stats["ranges"]) == stats["truncated"] == groups.truncated > 0
    assert sum(r["singletons"] for r in stats["ranges"]) == stats["singletons"] > 0
    assert stats["ranges"][0]["mean_size"] != stats["ranges"][1]["mean_size"]
    assert "ranges" not in group_stats(build_with_metadata(emb, GroupsBuild(0.55)))


def test_cache_keys_differ_by_ranges_and_family(emb, tmp_path):
    h = embeddings_sha256(emb)
    keys = {cache_key(h, 0.4, None, False, ranges, family)
            for ranges in (None, TWO, [(0, 300), (300, 300)]) for family in (None, "llasa", "orpheus")}
    assert len(keys) == 9
    # one range is the default: the key (and the cached file) of a request without ranges
    assert cache_key(h, 0.4, None, False, [(0, 600)]) == cache_key(h, 0.4, None, False)
    first = get_groups(emb, GroupsBuild(0.4, ranges=TWO, family="orpheus"), cache_dir=tmp_path)
    again = get_groups(emb, GroupsBuild(0.4, ranges=TWO, family="orpheus"), cache_dir=tmp_path)
    assert (first.meta["cache"], again.meta["cache"]) == ("miss", "hit") and same_groups(first, again)
    assert again.meta["family"] == "orpheus" and again.code_ranges == TWO
    assert get_groups(emb, GroupsBuild(0.4), cache_dir=tmp_path).meta["cache"] == "miss"
    assert [f.name for f in sorted(tmp_path.iterdir(), key=lambda f: f.stat().st_mtime_ns)] == \
        [cache_key(h, 0.4, None, False, TWO, "orpheus"), cache_key(h, 0.4, None, False)]


def test_cache_rebuilds_an_entry_of_another_family(emb, tmp_path):
    key = cache_key(embeddings_sha256(emb), 0.4, None, False, TWO, "orpheus")
    (tmp_path / key).write_bytes(to_bytes(build_with_metadata(emb, GroupsBuild(0.4, ranges=TWO, family="llasa"))))
    with pytest.warns(UserWarning, match=r"built for a llasa target \(2 ranges of 250, 350 codes\), not orpheus "
                                         r"\(2 ranges of 250, 350 codes\).*; rebuilding"):
        groups = get_groups(emb, GroupsBuild(0.4, ranges=TWO, family="orpheus"), cache_dir=tmp_path)
    assert groups.meta["cache"] == "miss" and from_bytes((tmp_path / key).read_bytes()).meta["family"] == "orpheus"
