"""The storage layer on local disk, on a real S3 HTTP API (moto server on 127.0.0.1) and on an
fsspec filesystem (fsspec's in-memory one, standing for gs:// and az://), and how model
references (paths, URIs, Hub ids) are told apart."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.config import StorageOptions
from engine.io.storage import HubRef, Storage, StorageError, hub_ref, join, parse, relative_to


def roundtrip(storage: Storage, base: str) -> None:
    a, b = join(base, "run", "a.bin"), join(base, "run", "sub", "b.bin")
    assert not storage.exists(a)
    storage.write_bytes(a, b"alpha")
    storage.write_bytes(b, b"beta")
    storage.write_bytes(join(base, "run2", "c.bin"), b"not under run")
    assert storage.exists(a) and storage.read_bytes(a) == b"alpha"
    assert storage.list(join(base, "run")) == sorted([a, b])
    storage.write_bytes(a, b"alpha2")  # overwrite in place
    assert storage.read_bytes(a) == b"alpha2"
    storage.delete(b)
    assert not storage.exists(b)
    fs, path = storage.arrow_filesystem(join(base, "t.parquet"))
    table = pa.table({"x": [1, 2, 3]})
    pq.write_table(table, path, filesystem=fs)
    assert pq.read_table(path, filesystem=fs).equals(table)


def test_local_paths_and_file_uris(tmp_path):
    storage = Storage()
    roundtrip(storage, str(tmp_path))
    roundtrip(storage, f"file://{tmp_path}/via-uri")
    assert parse(f"file://{tmp_path}/x").path == str(tmp_path / "x")


def test_local_writes_are_atomic_and_leave_no_temporaries(tmp_path):
    storage = Storage()
    target = tmp_path / "out" / "shard.parquet"
    storage.write_bytes(str(target), b"x" * 1000)
    assert [p.name for p in target.parent.iterdir()] == ["shard.parquet"]


def test_s3_on_a_real_http_endpoint(s3_endpoint, s3_bucket):
    storage = Storage(StorageOptions(endpoint_url=s3_endpoint, region="us-east-1"))
    roundtrip(storage, f"s3://{s3_bucket}")


def test_errors_name_the_uri_and_never_the_credentials(s3_endpoint, s3_bucket):
    storage = Storage(StorageOptions(endpoint_url=s3_endpoint))
    with pytest.raises(StorageError) as info:
        storage.read_bytes(f"s3://{s3_bucket}/missing/key")
    message = str(info.value)
    assert f"s3://{s3_bucket}/missing/key" in message and "NoSuchKey" in message
    assert "testing-secret-key" not in message and "testing-key-id" not in message
    with pytest.raises(StorageError, match="NoSuchBucket"):
        storage.write_bytes("s3://no-such-bucket-here/x", b"1")
    with pytest.raises(StorageError, match="unsupported scheme"):
        storage.read_bytes("nosuchscheme://bucket/x")
    with pytest.raises(StorageError, match=r"gs:// filesystem is not installed \(pip install 'pcg-synth\[gcs\]'\)"):
        storage.read_bytes("gs://bucket/x")
    with pytest.raises(StorageError, match="needs a bucket"):
        parse("s3:///key")
    with pytest.raises(StorageError, match="cannot read"):
        Storage().read_bytes("/nonexistent/file")


def test_local_dir_fetches_an_s3_checkpoint_once(s3_endpoint, s3_bucket, tmp_path):
    storage = Storage(StorageOptions(endpoint_url=s3_endpoint))
    storage.write_bytes(f"s3://{s3_bucket}/models/m/config.json", b"{}")
    storage.write_bytes(f"s3://{s3_bucket}/models/m/sub/w.bin", b"12345")
    storage.write_bytes(f"s3://{s3_bucket}/models/m2/other", b"not mine")
    local = storage.local_dir(f"s3://{s3_bucket}/models/m", cache_root=tmp_path)
    assert (local / "config.json").read_bytes() == b"{}"
    assert (local / "sub" / "w.bin").read_bytes() == b"12345"
    assert not (local / "other").exists()
    stamp = (local / "sub" / "w.bin").stat().st_mtime_ns
    assert storage.local_dir(f"s3://{s3_bucket}/models/m/", cache_root=tmp_path) == local
    assert (local / "sub" / "w.bin").stat().st_mtime_ns == stamp  # not fetched again
    assert storage.local_dir(str(tmp_path)) == tmp_path
    with pytest.raises(StorageError, match="nothing to fetch"):
        storage.local_dir(f"s3://{s3_bucket}/models/none", cache_root=tmp_path)


def test_fsspec_filesystems_read_write_list_and_parquet():
    """Any scheme fsspec knows goes through fsspec: its real in-memory filesystem here."""
    roundtrip(Storage(), "memory://bucket-a/base")
    storage = Storage()
    storage.write_bytes("memory://bucket-a/m/rows.jsonl", b"0123456789")
    assert storage.read_range("memory://bucket-a/m/rows.jsonl", 2, 5) == b"234"
    assert relative_to("memory://bucket-a/m/rows.jsonl", "clips/a.wav") == "memory://bucket-a/m/clips/a.wav"
    with pytest.raises(StorageError, match="cannot read memory://bucket-a/none: no such object"):
        storage.read_bytes("memory://bucket-a/none")


def test_local_dir_fetches_an_fsspec_model_directory_once(tmp_path):
    storage = Storage()
    storage.write_bytes("memory://models/m/config.json", b"{}")
    storage.write_bytes("memory://models/m/sub/w.bin", b"12345")
    storage.write_bytes("memory://models/m2/other", b"not mine")
    local = storage.local_dir("memory://models/m", cache_root=tmp_path)
    assert (local / "config.json").read_bytes() == b"{}" and (local / "sub" / "w.bin").read_bytes() == b"12345"
    assert not (local / "other").exists()
    stamp = (local / "sub" / "w.bin").stat().st_mtime_ns
    assert storage.local_dir("memory://models/m/", cache_root=tmp_path) == local
    assert (local / "sub" / "w.bin").stat().st_mtime_ns == stamp  # not fetched again
    assert storage.has_checkpoint("memory://models/m") and not storage.has_checkpoint("memory://models/m2")
    with pytest.raises(StorageError, match="nothing to fetch"):
        storage.local_dir("memory://models/none", cache_root=tmp_path)


def test_model_references_hub_ids_against_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub_ref("HKUSTAudio/Llasa-1B") == HubRef("HKUSTAudio/Llasa-1B", None)
    assert hub_ref("HKUSTAudio/xcodec2@v1.0") == HubRef("HKUSTAudio/xcodec2", "v1.0")
    assert hub_ref("hf://HKUSTAudio/Llasa-1B@refs/pr/1") == HubRef("HKUSTAudio/Llasa-1B", "refs/pr/1", explicit=True)
    for path in ("./org/name", "../org/name", "/abs/org", "name", "a/b/c", "s3://bucket/key", "memory://x/y"):
        assert hub_ref(path) is None, path
    (tmp_path / "kit" / "target").mkdir(parents=True)
    assert hub_ref("kit/target") is None  # an existing local path wins
    assert hub_ref("hf://kit/target") == HubRef("kit/target", None, explicit=True)  # unless hf:// says otherwise
    with pytest.raises(StorageError, match="hf://org/name"):
        hub_ref("hf://just-a-name")
