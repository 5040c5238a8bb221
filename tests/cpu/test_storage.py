"""The storage layer on local disk and on a real S3 HTTP API (moto server on 127.0.0.1)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.config import StorageOptions
from engine.io.storage import Storage, StorageError, join, parse


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
