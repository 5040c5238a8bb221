"""Transient storage failures: the storage layer retries them with exponential backoff and
jitter (and nothing else), logging each backoff (rate-limited), and a job whose S3 endpoint goes
away for seconds mid-job (moto's server stopped and started again on the same port) completes
with every row once and the codes of an uninterrupted run (float64), its driver saying that
storage calls were retried."""

from __future__ import annotations

import collections
import logging
import re
import threading
import time

import pytest
import ray
from botocore.exceptions import ClientError, EndpointConnectionError

from engine.config import StorageOptions
from engine.io import storage as storage_module
from engine.io.storage import RetryLog, Storage, StorageError, transient
from engine.runtime.job import JobRunner

from conftest import free_port
from jobhelpers import comparable, job_spec, read_output, texts, write_manifest


class Clock:
    """Virtual seconds that pass only while the storage layer backs off (its sleeps), so an
    outage lasts as many backoffs as its length allows, whatever the machine's load."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FlakyS3:
    """An S3 client double that refuses connections for the first `down_s` seconds of its
    `clock` (the storage's backoffs advance it: `storage_with`)."""

    def __init__(self, down_s: float, objects: dict, endpoint: str = "http://127.0.0.1:1") -> None:
        self.clock, self.up_at = Clock(), down_s
        self.objects, self.calls, self.endpoint = objects, 0, endpoint

    def get_object(self, Bucket, Key, **_):
        self.calls += 1
        if self.clock() < self.up_at:
            raise EndpointConnectionError(endpoint_url=self.endpoint)
        import io

        return {"Body": io.BytesIO(self.objects[Key])}


def storage_with(client: FlakyS3, **options) -> tuple[Storage, list[float]]:
    """A storage layer on `client` whose backoffs advance the client's clock instead of sleeping;
    returns it and the waits it asked for."""
    storage = Storage(StorageOptions(**options))
    storage._s3 = client
    waits: list[float] = []

    def sleep(s: float) -> None:
        waits.append(s)
        client.clock.sleep(s)

    storage._sleep = sleep
    return storage, waits


def test_an_outage_shorter_than_the_retries_is_ridden_out_with_growing_waits():
    client = FlakyS3(0.5, {"k": b"data"})
    storage, waits = storage_with(client, retries=8, retry_backoff_s=0.05, retry_backoff_max_s=0.4)
    assert storage.read_bytes("s3://b/k") == b"data"
    assert len(waits) >= 3 and storage.retries == len(waits) == client.calls - 1
    for n, w in enumerate(waits, 1):  # doubling, jittered 50-100 %, capped
        assert 0.5 * min(0.4, 0.05 * 2 ** (n - 1)) <= w <= min(0.4, 0.05 * 2 ** (n - 1))


def test_a_longer_outage_fails_naming_the_uri_the_endpoint_and_the_retries():
    storage, waits = storage_with(FlakyS3(60, {}), retries=2, retry_backoff_s=0.01, endpoint_url="http://127.0.0.1:1")
    with pytest.raises(StorageError) as failed:
        storage.read_bytes("s3://b/k")
    reason = "cannot read s3://b/k: cannot reach the S3 endpoint"
    assert str(failed.value) == f"{reason} http://127.0.0.1:1 (after 2 retries)"
    assert len(waits) == 2
    # no endpoint given: AWS's, named by its host (botocore's URL carries the object's path)
    storage, _ = storage_with(FlakyS3(60, {}, "https://s3.us-east-1.amazonaws.com/b/k"), retries=0)
    with pytest.raises(StorageError) as failed:
        storage.read_bytes("s3://b/k")
    assert str(failed.value) == (f"{reason} https://s3.us-east-1.amazonaws.com (AWS, the default: "
                                 "storage.endpoint_url names another S3 service)")


def test_a_real_client_names_the_endpoint_nothing_answers_at(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    storage = Storage(StorageOptions(endpoint_url=endpoint, region="us-east-1", retries=0))
    with pytest.raises(StorageError) as failed:
        storage.read_bytes("s3://b/k")
    assert str(failed.value) == f"cannot read s3://b/k: cannot reach the S3 endpoint {endpoint}"


def retry_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "engine.io.storage"]


def test_each_backoff_is_logged_naming_the_operation_the_uri_the_retry_and_the_wait(caplog, monkeypatch):
    monkeypatch.setattr(storage_module, "retry_log", RetryLog(every_s=0.0))  # no line held back
    storage, waits = storage_with(FlakyS3(0.3, {"k": b"data"}), retries=8, retry_backoff_s=0.05,
                                  retry_backoff_max_s=0.1, endpoint_url="http://127.0.0.1:1")
    with caplog.at_level(logging.WARNING, logger="engine.io.storage"):
        assert storage.read_bytes("s3://b/k") == b"data"
    lines = retry_lines(caplog)
    assert len(lines) == len(waits) == storage.retries >= 2
    for n, (line, wait) in enumerate(zip(lines, waits), 1):
        assert line == (f"storage: cannot read s3://b/k: cannot reach the S3 endpoint http://127.0.0.1:1; "
                        f"retry {n} of 8 in {wait:.1f} s")


def test_retry_lines_are_rate_limited_and_count_the_retries_they_held_back(caplog, monkeypatch):
    client = FlakyS3(0.8, {"k": b"data"})
    limiter = RetryLog(every_s=0.25, clock=client.clock)  # the backoffs' seconds, not the machine's
    monkeypatch.setattr(storage_module, "retry_log", limiter)
    storage, _ = storage_with(client, retries=100, retry_backoff_s=0.01, retry_backoff_max_s=0.02)
    with caplog.at_level(logging.WARNING, logger="engine.io.storage"):
        storage.read_bytes("s3://b/k")
    lines = retry_lines(caplog)
    held = [int(m.group(1)) for line in lines if (m := re.search(r"\((\d+) more retr(?:y|ies) since the last", line))]
    assert 2 <= len(lines) <= 5 < storage.retries  # one line per 0.25 s, not one per retry
    assert held and len(lines) + sum(held) + limiter.held == storage.retries  # none lost from the count


def test_a_real_s3_outage_logs_its_retries(s3_endpoint, own_s3, caplog, monkeypatch):
    endpoint, server = own_s3
    import boto3

    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="logged")
    monkeypatch.setattr(storage_module, "retry_log", RetryLog())
    storage = Storage(StorageOptions(endpoint_url=endpoint, region="us-east-1", retries=10, retry_backoff_s=0.3,
                                     retry_backoff_max_s=1.0))
    server.stop()
    restart = threading.Timer(2.0, server.start)
    restart.start()
    with caplog.at_level(logging.WARNING, logger="engine.io.storage"):
        storage.write_bytes("s3://logged/k", b"data")
    restart.join()
    lines = retry_lines(caplog)
    assert storage.retries >= 1 and 1 <= len(lines) <= storage.retries
    assert lines[0].startswith(f"storage: cannot write s3://logged/k: cannot reach the S3 endpoint {endpoint}; "
                               "retry 1 of 10 in ")
    assert storage.read_bytes("s3://logged/k") == b"data"


def test_only_transient_errors_are_retried():
    def client_error(code: str, status: int) -> ClientError:
        return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")

    assert transient(ConnectionRefusedError()) and transient(TimeoutError())
    assert transient(client_error("SlowDown", 503)) and transient(client_error("InternalError", 500))
    assert transient(client_error("Throttling", 400))
    assert not transient(client_error("NoSuchKey", 404)) and not transient(client_error("AccessDenied", 403))
    assert not transient(FileNotFoundError()) and not transient(ValueError())


@pytest.fixture
def own_s3():
    """A moto S3 server of this test's own, to stop and start; yields (endpoint, server)."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.stop()


def test_a_job_rides_out_an_s3_outage(s3_endpoint, own_s3, kit_dir, tmp_path, capsys):
    import boto3

    endpoint, server = own_s3
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="outage")
    manifest = write_manifest(tmp_path / "m.jsonl", texts(6))
    storage = {"endpoint_url": endpoint, "region": "us-east-1", "retries": 2, "retry_backoff_s": 0.2,
               "retry_backoff_max_s": 0.5}
    resources = {"workers": 1, "rows_per_shard": 2, "shard_window": 1, "max_retries": 6,
                 "retry_backoff_s": 0.5, "retry_backoff_max_s": 2.0}
    spec = job_spec(kit_dir, [str(manifest)], "s3://outage/out", models={"dtype": "float64"},
                    storage=storage, resources=resources)
    outage: dict = {}

    def restart_later():
        time.sleep(4.0)  # longer than the storage layer's own retries: shards fail and come back
        server.start()
        outage["up"] = time.monotonic()

    def stop_once(record):
        if not outage:
            server.stop()
            outage["down"] = time.monotonic()
            threading.Thread(target=restart_later, daemon=True).start()

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        summary = JobRunner(spec, progress=False, on_commit=stop_once).run()
        fresh = job_spec(kit_dir, [str(manifest)], str(tmp_path / "fresh"), models={"dtype": "float64"},
                         resources=resources)
        JobRunner(fresh, progress=False).run()
    finally:
        ray.shutdown()
    assert "up" in outage
    assert summary["storage_retries"] >= 1  # the storage layer backed off first
    said = [line for line in capsys.readouterr().err.splitlines() if "storage call" in line]
    assert said and said[0].startswith("test-job: worker w") and "retried so far after transient failures" in said[0]
    assert summary["shards"]["committed"] == summary["shards"]["total"] == 3 and not summary["shards"]["failed"]
    out = read_output(spec)
    assert collections.Counter(r["id"] for r in out) == collections.Counter(f"u{i:03d}" for i in range(6))
    assert comparable(out) == comparable(read_output(fresh))


def test_concurrent_model_fetches_share_one_download_and_are_verified(s3_endpoint, s3_bucket, tmp_path):
    """Workers of one node fetch an s3:// checkpoint at once: one downloads (a file lock), the
    others find it done; every file is checked against the listing's size (and MD5 ETag), a
    damaged cached file is fetched again, and no `.part` file is left behind."""
    from concurrent.futures import ThreadPoolExecutor

    seed = Storage(StorageOptions(endpoint_url=s3_endpoint))
    files = {"config.json": b"{}", "model.safetensors": bytes(range(256)) * 4000}
    for name, data in files.items():
        seed.write_bytes(f"s3://{s3_bucket}/m/{name}", data)
    storages = [Storage(StorageOptions(endpoint_url=s3_endpoint)) for _ in range(3)]
    downloads = []
    for s in storages:
        fetch = s._fetch_one
        s._fetch_one = lambda src, target, size, fetch=fetch: (downloads.append(src.path), fetch(src, target, size))[1]
    with ThreadPoolExecutor(3) as pool:
        dirs = list(pool.map(lambda s: s.local_dir(f"s3://{s3_bucket}/m", cache_root=tmp_path), storages))
    assert len(set(dirs)) == 1 and sorted(downloads) == ["m/config.json", "m/model.safetensors"]
    local = dirs[0]
    assert {p.name: p.read_bytes() for p in local.iterdir()} == files
    (local / "model.safetensors").write_bytes(b"truncated")  # damaged: the size differs from the listing
    assert storages[0].local_dir(f"s3://{s3_bucket}/m", cache_root=tmp_path) == local
    assert (local / "model.safetensors").read_bytes() == files["model.safetensors"]
    assert not [p for p in tmp_path.rglob("*.part")]


def test_the_driver_reads_only_the_speech_rows_of_a_remote_target(kit_dir):
    """For groups the driver needs the target's speech-token embedding rows only: from object
    storage (fsspec's memory:// standing for s3://) it reads the small files and exactly those
    rows of the weights (safetensors header + one ranged read), never the whole weights file."""
    import fsspec
    import torch

    from engine.groups.source import load_speech_embeddings, speech_embeddings_of

    fs = fsspec.filesystem("memory")
    for f in (kit_dir / "target").iterdir():
        fs.pipe_file(f"/faults-kit/target/{f.name}", f.read_bytes())
    storage = Storage()
    ranges: list[int] = []
    read_range = storage.read_range
    storage.read_range = lambda uri, start, stop: (ranges.append(stop - start), read_range(uri, start, stop))[1]
    reads: list[str] = []
    read_bytes = storage.read_bytes
    storage.read_bytes = lambda uri: (reads.append(uri), read_bytes(uri))[1]
    rows = speech_embeddings_of(storage, "memory://faults-kit/target")
    assert torch.equal(rows, load_speech_embeddings(kit_dir / "target"))
    weights = (kit_dir / "target" / "model.safetensors").stat().st_size
    assert not [u for u in reads if u.endswith(".safetensors")]
    assert len(ranges) == 3 and ranges[0] == 8  # header length, header, the rows
    assert max(ranges) == rows.numel() * rows.element_size() < weights
