"""`pcg-synth submit` / `status` against a real Ray head with its Jobs API on 127.0.0.1, and
the cluster launcher config against the schema shipped inside the ray package."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml
from ray._private.utils import read_ray_address

from engine.cli import main

from conftest import free_port, ray_address_file_kept
from jobhelpers import job_spec, read_output, texts, write_manifest

ROOT = Path(__file__).resolve().parents[2]


def start_head(jobs_api: bool = True) -> tuple[subprocess.Popen, str]:
    """`ray start --head --block` from this environment's bin/ (ray and pcg-synth are found on
    PATH by the job server, as on a real cluster node, without an activated virtualenv); returns
    the process and, once it answers, the Jobs API address (`jobs_api`), else the GCS address
    once the head has recorded it as the latest cluster (no dashboard: starts sooner)."""
    from ray.job_submission import JobSubmissionClient

    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    # the job agent's port too: its default (52365) is taken by any other Ray on the machine, and a
    # head without its job agent refuses jobs ("No available agent")
    port, dash, agent = free_port(), free_port(), free_port()
    head = subprocess.Popen([str(Path(bindir) / "ray"), "start", "--head", f"--port={port}",
                             f"--dashboard-port={dash}", f"--dashboard-agent-listen-port={agent}", "--num-cpus=2",
                             f"--include-dashboard={str(jobs_api).lower()}", "--block"],
                            env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    jobs = f"http://127.0.0.1:{dash}"

    def answer() -> str | None:
        if jobs_api:
            JobSubmissionClient(jobs)
            return jobs
        recorded = read_ray_address(None) or ""
        return recorded if recorded.endswith(f":{port}") else None

    deadline = time.time() + 120
    while True:
        try:
            address = answer()
        except Exception:  # noqa: BLE001 - not up yet
            address = None
        if address:
            return head, address
        assert head.poll() is None and time.time() < deadline, "the Ray head did not start"
        time.sleep(1 if jobs_api else 0.2)


@pytest.fixture(scope="module")
def ray_head():
    if ray.is_initialized():
        ray.shutdown()
    with ray_address_file_kept():
        head, address = start_head()
        yield address
        os.killpg(head.pid, signal.SIGKILL)  # its whole session (gcs, raylet, dashboard): a SIGTERM
        head.wait(timeout=60)  # makes `ray start --block` shut down gracefully, ~30 s of nothing


def test_submit_runs_the_job_on_the_cluster_and_status_reports_it(ray_head, kit_dir, tmp_path, capsys):
    manifest = write_manifest(tmp_path / "m.jsonl", texts(4))
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"), resources={"workers": 1})
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    # cluster/runtime-env.yaml without its wheel: this head's Python has pcg-synth installed already
    # (tests/cpu/test_wheel.py submits the file as it is, to a head without pcg-synth)
    env = yaml.safe_load((ROOT / "cluster" / "runtime-env.yaml").read_text())
    env.pop("pip")
    env_file = tmp_path / "runtime-env.yaml"
    env_file.write_text(yaml.safe_dump(env))
    # first a dry run, on the cluster: its report in the job's log, nothing written
    assert main(["submit", str(spec_file), "--address", ray_head, "--runtime-env", str(env_file), "--dry-run"]) == 0
    dry_id = capsys.readouterr().out.split()[1]
    assert "-dry-run-" in dry_id
    assert main(["status", dry_id, "--address", ray_head, "--wait"]) == 0
    printed = capsys.readouterr().out
    assert f"{dry_id}: SUCCEEDED" in printed and "test-job (dry run, kind synthesize)" in printed
    assert "rows       4: 4 to decode, 0 would become error records" in printed
    assert f"{tmp_path / 'out'}: new: nothing of this job is there yet" in printed
    assert not (tmp_path / "out").exists()
    assert main(["submit", str(spec_file), "--address", ray_head, "--runtime-env", str(env_file)]) == 0
    out = capsys.readouterr()
    job_id = out.out.split()[1]
    assert "must exist on every cluster node" in out.err  # local paths are flagged
    assert "models.target=" in out.err and "models.compile" not in out.err  # settings are not paths
    assert main(["status", job_id, "--address", ray_head, "--wait"]) == 0
    printed = capsys.readouterr().out
    assert f"{job_id}: SUCCEEDED" in printed and "4 ok, 0 failed" in printed  # the job's own table
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["rows_ok"] == 4 and len(read_output(spec)) == 4


def test_status_of_an_unknown_job_fails_clearly(ray_head, capsys):
    assert main(["status", "no-such-job", "--address", ray_head]) == 2
    assert "no-such-job" in capsys.readouterr().err


def counting(monkeypatch, owner, name: str) -> list:
    """Calls of `owner.name` (still made), recorded as their arguments."""
    calls, real = [], getattr(owner, name)

    def call(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)
    monkeypatch.setattr(owner, name, call)
    return calls


def test_submit_and_status_where_no_cluster_answers_fail_clearly(tmp_path, capsys, monkeypatch):
    """Nothing listens at either address. The GCS form is refused by one plain connection before
    Ray's client is made (that client alone retries for a long while); the dashboard URL by the
    client's one HTTP request. Counted, not timed."""
    import ray.job_submission
    import requests

    from engine import connect

    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(job_spec(tmp_path, ["s3://b/m.jsonl"], "s3://b/out").model_dump(mode="json")))
    probes = counting(monkeypatch, connect, "refused")
    clients = counting(monkeypatch, ray.job_submission, "JobSubmissionClient")
    requested = counting(monkeypatch, requests, "request")
    for address, probed, made in ((f"http://127.0.0.1:{free_port()}", 0, 1), (f"127.0.0.1:{free_port()}", 1, 0)):
        for argv in (["submit", str(spec), "--address", address], ["status", "some-job", "--address", address]):
            probes.clear(), clients.clear(), requested.clear()
            assert main(argv) == 2
            assert (len(probes), len(clients), len(requested)) == (probed, made, made), argv  # no retries
            err = capsys.readouterr().err.strip().splitlines()
            assert err[-1].startswith(f"error: cannot reach the Ray Jobs API at {address}"), err  # no traceback


def test_run_with_an_address_where_no_cluster_answers_fails_at_once(kit_dir, tmp_path, capsys, monkeypatch):
    """Ray alone would wait for that GCS for many minutes, or end a ray:// client's retries in a
    traceback: one plain connection refuses the address before `ray.init` is called."""
    from engine import connect

    spec = tmp_path / "job.yaml"
    manifest = write_manifest(tmp_path / "m.jsonl", texts(2))
    spec.write_text(yaml.safe_dump(job_spec(kit_dir, [str(manifest)], str(tmp_path / "out")).model_dump(mode="json")))
    assert not ray.is_initialized()  # else the job would run on that cluster, not try the address
    probes = counting(monkeypatch, connect, "refused")
    inits = counting(monkeypatch, ray, "init")
    for address in (f"127.0.0.1:{free_port()}", f"ray://127.0.0.1:{free_port()}"):
        probes.clear()
        assert main(["run", str(spec), "--address", address]) == 2
        assert len(probes) == 1 and not inits, address  # Ray's own connecting is never entered
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith(f"error: cannot reach the Ray cluster at {address}: "), err
    assert not (tmp_path / "out" / "data").exists()


def test_cluster_launcher_config_matches_rays_schema():
    schema_file = Path(ray.__file__).parent / "autoscaler" / "ray-schema.json"
    schema = json.loads(schema_file.read_text())
    config = yaml.safe_load((ROOT / "ray-cluster.yaml").read_text())
    jsonschema.validate(config, schema)
    assert config["available_node_types"]["head"]["resources"] == {"CPU": 0}
    broken = {**config, "provider": {"type": "aws", "region": 7}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_example_job_specs_are_valid():
    from engine.config import JobSpec

    for name in ("quickstart.yaml", "synthesize-s3.yaml", "augment.yaml", "sweep.yaml"):
        spec = JobSpec.load(ROOT / "jobs" / name)
        assert spec.output.uri
    rayjob = yaml.safe_load((ROOT / "cluster" / "rayjob.yaml").read_text())
    assert rayjob["kind"] == "RayJob" and "pcg-synth run" in rayjob["spec"]["entrypoint"]


@pytest.fixture
def address_file_kept():
    with ray_address_file_kept():
        yield


def test_run_starts_a_fresh_local_cluster_after_a_ray_head_died(kit_dir, tmp_path, address_file_kept):
    """A `ray start` cluster that died leaves its address behind in Ray's session files; Ray's
    own default would try to join it and hang. `pcg-synth run` must start a fresh one."""
    if ray.is_initialized():
        ray.shutdown()
    head, gcs = start_head(jobs_api=False)
    os.killpg(head.pid, signal.SIGKILL)  # dies uncleanly: its records stay
    head.wait(timeout=60)
    assert read_ray_address(None) == gcs  # the dead head is still recorded as the latest cluster
    manifest = write_manifest(tmp_path / "m.jsonl", texts(2))
    spec = job_spec(kit_dir, [str(manifest)], str(tmp_path / "out"), resources={"workers": 1})
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-m", "engine.cli", "run", str(spec_file), "--quiet"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["rows_ok"] == 2
