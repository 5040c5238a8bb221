"""Ray's token authentication (RAY_AUTH_MODE=token) on a 2-node cluster started with `ray start`
on loopback, as docs/guides/clusters.md describes it: a node joins with the cluster's token, the Jobs
API that `pcg-synth submit`/`status` use answers a client holding the token and refuses one
with another token. Clients run in subprocesses (Ray's auth mode is process-wide)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import free_port, ray_address_file_kept

BIN = Path(sys.executable).parent

CLIENT = """
import sys
from ray.job_submission import JobSubmissionClient
try:
    JobSubmissionClient(sys.argv[1]).list_jobs()
    print("ok")
except Exception as exc:
    print("refused:", type(exc).__name__, str(exc).splitlines()[0][:200])
"""

NODES = """
import ray
ray.init(address=__import__("sys").argv[1], log_to_driver=False)
print(sum(1 for n in ray.nodes() if n["Alive"]))
"""


def env_with(token: str, home: Path) -> dict:
    # HOME points elsewhere so nothing reads or writes the user's ~/.ray/auth_token
    return {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "HOME": str(home),
            "PATH": str(BIN) + os.pathsep + os.environ.get("PATH", "")}


def python(code: str, arg: str, env: dict) -> str:
    done = subprocess.run([sys.executable, "-c", code, arg], env=env, capture_output=True, text=True, timeout=120)
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]


def started_with(token: str) -> list[int]:
    """Processes whose environment holds this test's token: the cluster's own, nobody else's."""
    mark = f"RAY_AUTH_TOKEN={token}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if mark in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return [pid for pid in found if pid != os.getpid()]


@pytest.fixture
def token_cluster(tmp_path):
    with ray_address_file_kept():
        yield from started_token_cluster(tmp_path)


def started_token_cluster(tmp_path):
    token = uuid.uuid4().hex + uuid.uuid4().hex
    env = env_with(token, tmp_path)
    port, dash = free_port(), free_port()
    procs = [subprocess.Popen([str(BIN / "ray"), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                               f"--dashboard-port={dash}", "--dashboard-host=127.0.0.1", "--num-cpus=1",
                               "--include-dashboard=true", "--block"],
                              env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        address = f"http://127.0.0.1:{dash}"
        deadline = time.time() + 120
        while python(CLIENT, address, env) != "ok":
            assert procs[0].poll() is None and time.time() < deadline, "the Ray head did not start"
            time.sleep(1)
        procs.append(subprocess.Popen([str(BIN / "ray"), "start", f"--address=127.0.0.1:{port}",
                                       "--node-ip-address=127.0.0.1", "--num-cpus=1", "--block"],
                                      env=env, start_new_session=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        yield {"token": token, "env": env, "jobs": address, "gcs": f"127.0.0.1:{port}", "home": tmp_path}
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)  # a graceful `ray stop` costs half a minute
                p.wait(timeout=60)
        for pid in started_with(token):  # anything of this cluster outside those process groups
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_node_joins_and_the_jobs_api_answers_only_the_token(token_cluster):
    env = token_cluster["env"]
    deadline = time.time() + 60
    while (nodes := python(NODES, token_cluster["gcs"], env)) != "2":
        assert time.time() < deadline, f"the second node did not join: {nodes}"
        time.sleep(1)
    assert python(CLIENT, token_cluster["jobs"], env) == "ok"
    wrong = env_with("not-" + token_cluster["token"], token_cluster["home"])
    refused = python(CLIENT, token_cluster["jobs"], wrong)
    assert refused.startswith("refused") and "uthenticat" in refused, refused
