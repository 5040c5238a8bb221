"""Shared fixtures: the tiny kit is built once per test session, a local Ray cluster once per
module that asks for one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

# OpenMP's default busy-waiting makes 2-thread torch ops up to ~100x slower when the cores are
# shared (other processes, Ray workers): wait passively. Must be set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Caches (groups, fetched checkpoints, voice prompts) go to a fresh directory per session, never
# the user's ~/.cache; Ray workers inherit it.
os.environ["PCG_SYNTH_CACHE"] = tempfile.mkdtemp(prefix="pcg-synth-test-cache-")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def kit_dir(tmp_path_factory):
    """A freshly built tiny kit (target, draft, codec) shared by the whole session."""
    from engine.kit import build_kit

    return build_kit(tmp_path_factory.mktemp("kit") / "kit")


@pytest.fixture(scope="session")
def kit_synth(kit_dir):
    """A float32 CPU Synthesizer over the kit's target and draft."""
    from engine import Synthesizer

    return Synthesizer.load(kit_dir / "target", draft=kit_dir / "draft", device="cpu",
                            dtype="float32", batch_size=4)


@pytest.fixture(scope="session")
def orpheus_kit_dir(tmp_path_factory):
    """A freshly built tiny Orpheus kit (target and draft in Orpheus's token layout, a random SNAC
    24 kHz codec) shared by the whole session."""
    from engine.kit import build_kit

    return build_kit(tmp_path_factory.mktemp("orpheus-kit") / "kit", family="orpheus")


@pytest.fixture(scope="session")
def orpheus64(orpheus_kit_dir):
    """A float64 CPU Synthesizer over the Orpheus kit (batch 4), holding its groups at theta 0.4
    (built into the session's groups cache) and singleton groups (theta 1.0)."""
    from engine import Synthesizer
    from engine.groups.csr import SpeechGroups

    s = Synthesizer.load(orpheus_kit_dir / "target", draft=orpheus_kit_dir / "draft", device="cpu",
                         dtype="float64", batch_size=4)
    s.groups(0.4)
    s.set_groups(SpeechGroups.singletons(s.layout.num_codes))
    return s


@pytest.fixture(scope="session")
def synth64(kit_dir, kit_groups):
    """A float64 CPU Synthesizer over the kit (batch 4), holding the kit's groups (theta 0.4) and
    singleton groups (theta 1.0): float64 makes batch-invariance and per-row comparisons exact."""
    from engine import Synthesizer
    from engine.groups.csr import SpeechGroups

    s = Synthesizer.load(kit_dir / "target", draft=kit_dir / "draft", device="cpu", dtype="float64",
                         batch_size=4)
    s.set_groups(kit_groups)
    s.set_groups(SpeechGroups.singletons(65536))
    return s


@pytest.fixture(scope="session")
def groups_cache():
    """The session's groups cache (the default `Synthesizer.groups()` uses; jobs point
    models.groups_cache here)."""
    return Path(os.environ["PCG_SYNTH_CACHE"]) / "groups"


@pytest.fixture(scope="session")
def kit_groups(kit_synth, groups_cache):
    """Acoustic similarity groups of the kit target at theta 0.4, built once into the session's
    groups cache (jobs over the kit then find them there)."""
    from engine.groups.cache import get_groups
    from engine.groups.options import GroupsBuild

    build = GroupsBuild(0.4, ranges=kit_synth.layout.ranges, family=kit_synth.layout.family)
    return get_groups(kit_synth.speech_embeddings(), build, cache_dir=groups_cache)


@contextlib.contextmanager
def ray_address_file_kept():
    """Around a test that kills a `ray start` cluster: puts back the file where `ray start`
    records the latest cluster (`/tmp/ray/ray_current_cluster`) as it was. Left naming the dead
    cluster, Ray's own address discovery keeps trying it: `ray.init()` without an address waits
    for it, and so does Ray Train's placement-group cleaner (its State API calls), which would
    stall every later `draft train --workers` run and log a traceback."""
    from ray._private.utils import get_ray_address_file

    path = Path(get_ray_address_file(None))
    before = path.read_bytes() if path.is_file() else None
    try:
        yield
    finally:
        if before is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(before)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_endpoint():
    """A real S3 HTTP API on 127.0.0.1 (moto's ThreadedMotoServer) with throwaway credentials
    in the environment; yields the endpoint URL."""
    from moto.server import ThreadedMotoServer

    env = {"AWS_ACCESS_KEY_ID": "testing-key-id", "AWS_SECRET_ACCESS_KEY": "testing-secret-key",
           "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def s3_bucket(s3_endpoint, request):
    """A fresh bucket on the moto server; yields its name."""
    import re
    import uuid

    import boto3

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = f"{name}-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture
def cluster():
    """A multi-node Ray cluster on loopback (ray.cluster_utils.Cluster): a 1-CPU head, no GPUs;
    tests add and remove worker nodes."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def local_ray():
    """A fresh 2-CPU local Ray cluster for one test module (`address="local"`: never one another
    process started with `ray start`), the one every module's Ray tests share. A Ray left running
    by an earlier test is shut down first. Its workers inherit the environment as it is when the
    first test of the module starts: a module whose workers need more (S3 credentials) asks for
    that session fixture for all its tests (`pytestmark`), so it is set up first."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()
