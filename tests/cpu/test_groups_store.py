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
from engine.groups.source import embeddings_sha256
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
    built = build_with_metadata(emb, 0.4, cap, dedup=dedup)
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
    plain = build_with_metadata(emb, 0.5)
    deduped = deduplicate(plain)
    assert deduped.num_groups <= 100 and deduped.num_tokens == 600
    loaded = load_groups(save_groups(build_with_metadata(emb, 0.5, dedup=True), tmp_path / "d.st"))
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
    loaded = load_groups(save_groups(build_with_metadata(emb, 0.35), tmp_path / "g.st"))
    assert loaded.members.dtype == np.uint16
    index = GroupIndex(loaded, 601)
    assert index.symmetric and index.num_groups == 601


def flip_byte(data: bytes, offset: int) -> bytes:
    return data[:offset] + bytes([data[offset] ^ 0x40]) + data[offset + 1:]


def test_corrupt_files_fail_clearly(emb):
    data = to_bytes(build_with_metadata(emb, 0.4))
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
    data = to_bytes(build_with_metadata(emb, 0.4))
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
    first = get_groups(emb, 0.4, cache_dir=tmp_path)
    assert first.meta["cache"] == "miss"
    files = list(tmp_path.iterdir())
    assert [f.name for f in files] == [cache_key(embeddings_sha256(emb), 0.4, None, False)]
    mtime = files[0].stat().st_mtime_ns
    second = get_groups(emb.clone(), 0.4, cache_dir=tmp_path)
    assert second.meta["cache"] == "hit" and same_groups(first, second)
    assert files[0].stat().st_mtime_ns == mtime
    # Every input of the key gives its own entry.
    get_groups(emb, 0.45, cache_dir=tmp_path)
    get_groups(emb, 0.4, max_group_size=4, cache_dir=tmp_path)
    get_groups(emb, 0.4, dedup=True, cache_dir=tmp_path)
    get_groups(embeddings(seed=5), 0.4, cache_dir=tmp_path)
    assert len(list(tmp_path.iterdir())) == 5


def test_cache_replaces_a_corrupt_entry(emb, tmp_path):
    first = get_groups(emb, 0.4, cache_dir=tmp_path)
    path = tmp_path / cache_key(embeddings_sha256(emb), 0.4, None, False)
    data = path.read_bytes()
    path.write_bytes(flip_byte(data, len(data) - 5))
    with pytest.warns(UserWarning, match=r"content hash mismatch\); rebuilding"):
        again = get_groups(emb, 0.4, cache_dir=tmp_path)
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
    get_groups(emb, 0.4, store=blobs)
    get_groups(emb, 0.4, store=blobs)
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
