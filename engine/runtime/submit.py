"""Submitting jobs to a remote Ray cluster through the Ray Jobs API, and asking about them."""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

from engine.config import JobSpec
from engine.io.storage import is_remote

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
MODEL_LOCATIONS = ("target", "draft", "codec", "groups", "groups_cache")  # models.* naming places
# Ray sets this, on each node, to where the job's working directory was unpacked there, before it
# installs the runtime environment's `pip` entries; pip expands it in their text.
NODE_WORKING_DIR = "${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}"
LOCAL_WHEEL = re.compile(r"(?P<path>[^\[\]]+\.whl)(?P<extras>\[[^\]]*\])?")  # dist/x.whl, dist/x.whl[gpu]


def client(address: str):
    """A Jobs API client for `address`.

    Raises:
        ValueError: nothing answers there (said in one line, with where to look)."""
    from ray.exceptions import RpcError
    from ray.job_submission import JobSubmissionClient

    from engine.connect import endpoint, refused

    # A GCS address (HOST:PORT, auto) is tried with a plain connection first: where nothing listens
    # Ray's client waits a long while before it gives up. A dashboard URL is left
    # to the client's HTTP requests, which fail at once there and may go through a proxy.
    target = None if address.startswith(("http://", "https://")) else endpoint(address)
    why = refused(*target) if target else None
    if why is not None:
        raise ValueError(jobs_api_unreachable(address, why))
    try:
        return JobSubmissionClient(address)
    except (OSError, RpcError) as exc:  # ConnectionError and requests' errors (OSErrors too) for
        raise ValueError(jobs_api_unreachable(address, exc)) from None  # http://; RpcError for a GCS address


def jobs_api_unreachable(address: str, exc: Exception | str) -> str:
    return (f"cannot reach the Ray Jobs API at {address} ({str(exc).splitlines()[0]}): is the "
            "cluster up, and its dashboard port (8265 by default) reachable from here? (on KubeRay: "
            "port-forward the head service)")


def local_paths(spec: JobSpec) -> list[str]:
    """Spec fields that point at this machine's disk (the cluster may not have them)."""
    fields = {f"models.{k}": v for k, v in spec.models.model_dump().items()
              if k in MODEL_LOCATIONS and isinstance(v, str)}
    fields.update({f"input.manifests[{i}]": m for i, m in enumerate(spec.input.manifests)})
    fields["output.uri"] = spec.output.uri
    return [f"{name}={value}" for name, value in fields.items() if not is_remote(value)]


def ship_wheels(env: dict, work: Path) -> dict:
    """`env` with every `pip` entry that names a wheel on this machine (a path or glob relative to
    the current directory, e.g. `dist/pcg_synth-*.whl` or `dist/pcg_synth-*.whl[gpu]`) copied
    into the job's working directory `work` and named where each node unpacks it.

    Ray's pip runs on every node, in a directory of its own: a path of this machine names nothing
    there, while the working directory travels with the job. Each wheel goes into a folder named
    by its hash, because Ray keys a node's environments by the entries' text: a rebuilt wheel of
    the same version then gets a fresh environment instead of a cached one.

    Raises:
        ValueError: a wheel entry matches no file, or more than one.
    """
    pip = env.get("pip")
    packages = pip.get("packages") if isinstance(pip, dict) else pip
    if not isinstance(packages, list):  # none, or a requirements file Ray reads itself
        return env
    shipped = []
    for entry in packages:
        local = LOCAL_WHEEL.fullmatch(entry.strip()) if isinstance(entry, str) else None
        if local is None or "://" in entry or "$" in entry:  # a requirement, a URL, a node's path
            shipped.append(entry)
            continue
        found = sorted(glob.glob(os.path.expanduser(local["path"])))
        if len(found) != 1:
            where = f"{len(found)} files ({', '.join(found)}): name one" if found else (
                f"no file (from {os.getcwd()}): build the wheel with `python -m build --wheel`")
            raise ValueError(f"runtime environment pip entry {entry!r} matches {where}")
        wheel = Path(found[0])
        folder = Path("wheels") / hashlib.sha256(wheel.read_bytes()).hexdigest()[:16]
        (work / folder).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(wheel, work / folder / wheel.name)
        shipped.append(f"{NODE_WORKING_DIR}/{folder.as_posix()}/{wheel.name}{local['extras'] or ''}")
    return {**env, "pip": {**pip, "packages": shipped} if isinstance(pip, dict) else shipped}


def submit(spec_path: str | Path, address: str, runtime_env: str | Path | None = None,
           dry_run: bool = False) -> str:
    """Validate the spec here, upload it as the job's working directory and start
    `pcg-synth run job.yaml --address auto` on the cluster (`dry_run`: `pcg-synth run job.yaml
    --dry-run`, which checks the job where it will run: the cluster's paths and credentials).
    Local wheels the runtime environment's `pip` names travel in the working directory
    (`ship_wheels`). Returns the submission id.

    Raises:
        ValueError: a wheel entry matches no file or several; the Jobs API refused the job."""
    spec = JobSpec.load(spec_path)
    local = local_paths(spec)
    if local:
        print("warning: these paths must exist on every cluster node (use s3:// otherwise): "
              + ", ".join(local), file=sys.stderr)
    env = yaml.safe_load(Path(runtime_env).read_text()) if runtime_env else {}
    if not isinstance(env or {}, dict):
        raise ValueError(f"{runtime_env}: a runtime environment is a YAML mapping")
    with tempfile.TemporaryDirectory(prefix="pcg-synth-submit-") as work:
        (Path(work) / "job.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
        env = {**ship_wheels(env or {}, Path(work)), "working_dir": work}
        jobs = client(address)
        try:
            return jobs.submit_job(
                entrypoint="pcg-synth run job.yaml " + ("--dry-run" if dry_run else "--address auto"), runtime_env=env,
                submission_id=f"pcg-synth-{spec.name}{'-dry-run' if dry_run else ''}-{int(time.time())}",
                metadata={"pcg_synth_job": spec.name, "output": spec.output.uri})
        except RuntimeError as exc:  # the Jobs API's HTTP errors, e.g. "No available agent" on a head without one
            raise ValueError(f"the Ray Jobs API at {address} refused the job: {str(exc).splitlines()[0]}") from None


def status(job_id: str, address: str, wait: bool = False, poll_s: float = 2.0) -> tuple[str, str]:
    """(status, the end of the job's log); with `wait`, block until the job ends.

    Raises:
        ValueError: the cluster does not know the job (or cannot be asked)."""
    c = client(address)
    try:
        while True:
            state = str(c.get_job_status(job_id)).split(".")[-1]
            if not wait or state in TERMINAL:
                break
            time.sleep(poll_s)
        logs = c.get_job_logs(job_id)
    except RuntimeError as exc:  # the Jobs API reports HTTP errors as RuntimeError
        raise ValueError(f"job {job_id} at {address}: {str(exc).splitlines()[0]}") from None
    except OSError as exc:  # the cluster went away while we waited
        raise ValueError(jobs_api_unreachable(address, exc)) from None
    return state, "\n".join(logs.splitlines()[-25:])
