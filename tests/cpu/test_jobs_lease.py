"""One output, one writer, end to end: real `pcg-synth run` processes (each on its own local Ray)
on the tiny kit. Two drivers started together on one output: one runs the job, the other
refuses in one line naming the holder, and a third started with `--wait` waits, then finds the
job finished and prints its summary; files and folders the job made follow the umask. A driver
killed holding the lease: the rerun takes the lease over and resumes to the codes of an
uninterrupted run (float64); one stopped by SIGTERM releases it. The output's filesystem full
mid-job (a real 8 MiB tmpfs, mounted by the test: it needs root, and is skipped without): one
line naming the file and the cause, the summary of what was committed, no traceback; after space
is freed the rerun completes with every row once, and a driver refused on the full disk leaves
no lease folder. A job refused before any work leaves no output folder. SIGTERM while Ray
starts and while the workers load: exit 143 in one line, lease released. A driver and its
worker frozen (SIGSTOP) and replaced by a second driver, locally and on S3 (moto): the worker's
writes after the takeover are refused and counted, the first driver names its successor in one
line, every row is there once with an uninterrupted run's codes."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.io.storage import Storage
from engine.runtime.job import JobRunner

from jobhelpers import (
    comparable,
    fill,
    job_spec,
    lease_released,
    read_output,
    small_filesystem,
    texts,
    write_manifest,
)

ROOT = Path(__file__).resolve().parents[2]
ROWS = 12
SHARDS = 6


def spec_file(kit_dir: Path, folder: Path, manifest: Path, output: Path) -> tuple[Path, object]:
    """A 12-row job of 6 shards on one worker holding one shard at a time, float64 (codes are
    batch-invariant), a 20 s stale time (a driver killed on this machine is taken over at once:
    its process is gone; test_lease.py takes over stale leases); a spec file for `pcg-synth run`."""
    spec = job_spec(kit_dir, [str(manifest)], str(output), models={"dtype": "float64"},
                    resources={"workers": 1, "rows_per_shard": 2, "shard_window": 1})
    spec = spec.model_copy(update={"output": spec.output.model_copy(update={"lease_stale_s": 20.0})})
    path = folder / f"{output.name}.yaml"
    path.write_text(json.dumps(spec.model_dump(mode="json")))  # JSON is YAML
    return path, spec


def driver(spec: Path, *flags: str) -> subprocess.Popen:
    """`pcg-synth run SPEC` in a process group of its own (a kill takes its Ray along), under
    umask 022."""
    return subprocess.Popen([sys.executable, "-m", "engine.cli", "run", str(spec), "--address", "local", *flags],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, umask=0o022,
                            start_new_session=True)


def stop(*procs: subprocess.Popen) -> None:
    """End drivers a failed test left running, with their Ray (their process groups)."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_for(check, proc: subprocess.Popen, timeout: float = 240.0) -> None:
    deadline = time.time() + timeout
    while not check():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "timed out"
        time.sleep(0.1)


def commits(output: Path) -> list[Path]:
    folder = output / "_commits"
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


@pytest.fixture
def launch():
    """Starts drivers (`driver`); any still running when the test ends are killed with their Ray."""
    started: list[subprocess.Popen] = []

    def start(spec: Path, *flags: str) -> subprocess.Popen:
        started.append(driver(spec, *flags))
        return started[-1]

    yield start
    stop(*started)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> Path:
    return write_manifest(tmp_path_factory.mktemp("manifest") / "m.jsonl", texts(ROWS))


@pytest.fixture(scope="module")
def raced(kit_dir, manifest, tmp_path_factory):
    """Two drivers started together on one output, then a third with --wait once the lease is
    taken; returns (spec, {name: (returncode, stdout, stderr, pid)})."""
    folder = tmp_path_factory.mktemp("raced")
    path, spec = spec_file(kit_dir, folder, manifest, folder / "out")
    procs = {"a": driver(path), "b": driver(path)}
    try:
        wait_for(lambda: (folder / "out" / "_lease").is_dir(), procs["a"])
        procs["wait"] = driver(path, "--wait")
        done = {}
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=300)
            done[name] = (proc.returncode, out, err, proc.pid)
    finally:
        stop(*procs.values())
    return spec, done


def test_two_drivers_on_one_output_one_runs_the_job_the_other_refuses_in_one_line(raced):
    spec, done = raced
    (winner,) = [done[n] for n in "ab" if done[n][0] == 0]
    (loser,) = [done[n] for n in "ab" if done[n][0] != 0]
    assert loser[0] == 75 and loser[1] == ""
    assert loser[2].count("\n") == 1 and "Traceback" not in loser[2]
    assert loser[2].startswith(f"error: {spec.output.uri} is in use by another driver: job 'test-job' on host "
                               f"{os.uname().nodename} (pid {winner[3]}, user ")
    assert ", started " in loser[2] and "lease renewed" in loser[2] and "rerun with --wait" in loser[2]
    rows = read_output(spec)
    assert collections.Counter(r["id"] for r in rows) == collections.Counter(t["id"] for t in texts(ROWS))
    summary = json.loads((Path(spec.output.uri) / "summary.json").read_text())
    assert summary["shards"]["run_now"] == summary["shards"]["total"] == SHARDS  # one driver decoded every shard


def test_a_driver_started_with_wait_waits_then_finds_the_job_finished(raced):
    spec, done = raced
    code, out, err, _ = done["wait"]
    assert code == 0 and "Traceback" not in err
    lines = err.splitlines()
    assert lines[0].startswith(f"test-job: waiting for {spec.output.uri}: in use by job 'test-job' on host ")
    assert lines[1].startswith(f"test-job: {spec.output.uri} is free after ")
    assert "was committed before; nothing to run. The summary of the run that finished the job:" in out
    assert f"shards       {SHARDS}/{SHARDS} committed (0 before this run, 0 retries, 0 failed)" in out


def test_files_and_folders_of_a_job_follow_the_umask(raced):
    spec, _ = raced
    output = Path(spec.output.uri)
    modes = {str(p.relative_to(output)): p.stat().st_mode & 0o777 for p in output.rglob("*")}
    assert {name for name in modes if "/" not in name} == {"_commits", "data", "_job.json", "_lease",
                                                                "summary.json"}
    assert {m for name, m in modes.items() if (output / name).is_file()} == {0o644}  # umask 022
    assert {m for name, m in modes.items() if (output / name).is_dir()} | {output.stat().st_mode & 0o777} == {0o755}


def test_a_killed_drivers_lease_is_taken_over_and_the_job_resumes_identically(raced, kit_dir, manifest, tmp_path,
                                                                               launch):
    reference, _ = raced
    path, spec = spec_file(kit_dir, tmp_path, manifest, tmp_path / "out")
    output = tmp_path / "out"
    proc = launch(path)
    wait_for(lambda: len(commits(output)) >= 2, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    left = sorted((output / "_lease").iterdir())
    assert len(left) == 1 and json.loads(left[0].read_text())["pid"] == proc.pid  # never released
    kept = len(commits(output))
    assert 2 <= kept < SHARDS, "the kill must land mid-job"
    rerun = launch(path)
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    notice = [line for line in err.splitlines() if "took over the lease" in line]
    assert len(notice) == 1 and f"(pid {proc.pid}, " in notice[0]
    assert notice[0].endswith(": its process is gone")
    summary = json.loads((output / "summary.json").read_text())
    assert summary["shards"]["committed_before"] >= kept and summary["shards"]["committed"] == SHARDS
    rows = read_output(spec)
    assert collections.Counter(r["id"] for r in rows) == collections.Counter(t["id"] for t in texts(ROWS))
    assert comparable(rows) == comparable(read_output(reference))
    assert lease_released(output)


def test_a_terminated_driver_stops_in_one_line_and_releases_its_lease(kit_dir, manifest, tmp_path, launch):
    """SIGTERM (a scheduler stopping the driver, `kill`): it stops as on Ctrl-C, exit 143, one
    line, no traceback, its committed shards kept and its lease released, so a rerun from any
    machine starts at once (test_jobs.py resumes an interrupted job)."""
    path, spec = spec_file(kit_dir, tmp_path, manifest, tmp_path / "out")
    output = tmp_path / "out"
    proc = launch(path)
    wait_for(lambda: len(commits(output)) >= 2, proc)
    proc.send_signal(signal.SIGTERM)  # the driver alone, as a scheduler's stop does
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("terminated")] == [
        "terminated (SIGTERM): committed shards are kept; rerun the same command to resume"]
    assert 2 <= len(commits(output)) < SHARDS, "the signal must land mid-job"
    assert lease_released(output)


@pytest.mark.parametrize("phase,sign", [("ray start-up", "gcs_server"), ("model loading", "ray::SynthesisWorker")])
def test_a_driver_terminated_before_its_first_commit_stops_in_one_line(phase, sign, kit_dir, manifest, tmp_path,
                                                                       launch):
    """SIGTERM while Ray starts (its GCS is up) and while the workers load their models: exit 143,
    the one line of a terminated driver (not Ray's silent exit, not Ctrl-C's), its lease released."""
    path, _ = spec_file(kit_dir, tmp_path, manifest, tmp_path / "out")
    proc = launch(path)
    wait_for(lambda: session_pids(proc.pid, sign), proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, (phase, err)
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith(("terminated", "interrupted"))] == [
        "terminated (SIGTERM): committed shards are kept; rerun the same command to resume"]
    assert not commits(tmp_path / "out"), f"the signal must land during {phase}"
    assert lease_released(tmp_path / "out")


def test_a_full_output_filesystem_ends_in_one_line_and_the_rerun_completes(raced, kit_dir, manifest, tmp_path,
                                                                           launch):
    """A real full disk: the output on a tmpfs that the test fills after the first commit."""
    reference, _ = raced
    with small_filesystem(tmp_path / "disk") as disk:
        output = disk / "out"
        path, spec = spec_file(kit_dir, tmp_path, manifest, output)
        proc = launch(path)
        wait_for(lambda: len(commits(output)) >= 1, proc)
        filler = fill(disk)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 1 and "Traceback" not in err
        line = err.strip().splitlines()[-1]
        kept = len(commits(output))
        assert 1 <= kept < SHARDS
        assert line.startswith(f"error: cannot write {output}/")
        assert (f": No space left on device; the job stopped with {kept} of {SHARDS} shards committed (kept); "
                "summary.json not written (cannot write " in line)
        assert line.endswith(f"free space on its filesystem, then rerun: pcg-synth run {path} --address local")
        summary = json.loads(out[: out.index("\njob ")])  # printed, as it could not be written
        assert summary["shards"]["committed"] == kept and summary["shards"]["failed"] == SHARDS - kept
        assert f"shards       {kept}/{SHARDS} committed" in out  # and the table
        assert not (output / "summary.json").exists() and not list(output.rglob(".*.tmp"))
        refused = launch(path)  # on the full disk: refused before any work, at the lease
        _, err = refused.communicate(timeout=120)
        assert refused.returncode == 1 and err.count("\n") == 1 and "No space left on device" in err
        assert not (output / "_lease").exists()  # no empty folder of its own left behind
        filler.unlink()
        rerun = launch(path)
        out, err = rerun.communicate(timeout=300)
        assert rerun.returncode == 0, err
        summary = json.loads((output / "summary.json").read_text())
        assert summary["shards"]["committed_before"] == kept and summary["shards"]["committed"] == SHARDS
        rows = read_output(spec)
        assert collections.Counter(r["id"] for r in rows) == collections.Counter(t["id"] for t in texts(ROWS))
        assert comparable(rows) == comparable(read_output(reference))


def test_a_job_refused_before_any_work_leaves_no_output_folder(kit_dir, tmp_path):
    empty = write_manifest(tmp_path / "empty.jsonl", [])
    out = tmp_path / "runs" / "out"
    with pytest.raises(ValueError, match=rf"^input.manifests: no rows in the 1 manifest file read \({empty}\)$"):
        JobRunner(job_spec(kit_dir, [str(empty)], str(out)), progress=False).run()
    with pytest.raises(ValueError, match=r"input.manifests\[0\]: no manifest files"):
        JobRunner(job_spec(kit_dir, [str(tmp_path / "missing.jsonl")], str(out)), progress=False).run()
    assert not (tmp_path / "runs").exists()  # nor the folder above it, made for it


# ---- fencing: a displaced driver's workers write nothing after the takeover --------------------


def session_pids(leader: int, title: str) -> list[int]:
    """Processes of `leader`'s session (its Ray: GCS, raylet, workers) whose command line holds
    `title` (a Ray actor's process title, e.g. `ray::SynthesisWorker`; `gcs_server`)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
        if stat[stat.rindex(")") + 2:].split()[3] == str(leader) and title in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_stopped_driver_replaced_by_another_commits_nothing_after_the_takeover(where, raced, kit_dir, manifest,
                                                                                 tmp_path, launch, request):
    """A driver and its worker frozen (SIGSTOP: a paused machine) while the worker holds shards;
    a second driver waits for the lease to go stale, takes it over and finishes the job; the
    worker then runs again and its writes are refused (fenced); the first driver, running again,
    says in one line who took the output over and how many of its shards were refused. Every
    row is in the output once, with the codes of an uninterrupted run."""
    reference, _ = raced
    storage_over = {}
    if where == "s3":
        endpoint, bucket = request.getfixturevalue("s3_endpoint"), request.getfixturevalue("s3_bucket")
        output, storage_over = f"s3://{bucket}/out", {"endpoint_url": endpoint, "region": "us-east-1"}
    else:
        output = str(tmp_path / "out")
    spec = job_spec(kit_dir, [str(manifest)], output, models={"dtype": "float64"}, storage=storage_over,
                    resources={"workers": 1, "rows_per_shard": 2, "shard_window": 2})
    spec = spec.model_copy(update={"output": spec.output.model_copy(update={"lease_stale_s": 6.0})})
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(spec.model_dump(mode="json")))
    storage = Storage(spec.storage)
    committed = lambda: storage.list(f"{output}/_commits")  # noqa: E731
    first = launch(path)
    wait_for(lambda: len(committed()) >= 1, first)
    frozen = session_pids(first.pid, "ray::SynthesisWorker")
    assert frozen, "the first driver's worker must be running"
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    first.send_signal(signal.SIGSTOP)
    try:
        second = launch(path, "--wait")
        out, err = second.communicate(timeout=300)
        assert second.returncode == 0, err
        assert any("took over the lease" in line and f"(pid {first.pid}, " in line for line in err.splitlines())
        for pid in frozen:  # the worker runs again, its shards' writes are refused
            os.kill(pid, signal.SIGCONT)
        time.sleep(8.0)  # time for it to reach the writes of the shards it held
    finally:
        first.send_signal(signal.SIGCONT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 1 and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"error: lost the lease on {output}: the lease was taken over by job 'test-job' on host ")
    assert f"(pid {second.pid}, " in line and "refused after the takeover; stopped with " in line
    refused = int(line.split("; ")[1].split(" ")[0])
    assert refused >= 1  # the frozen worker held shards: their writes were refused
    records = [json.loads(storage.read_bytes(uri)) for uri in committed()]
    takeover = json.loads(storage.read_bytes(f"{output}/_lease/0000000002.json"))["started"]
    assert len(records) == SHARDS
    assert all(r["committed_at"] < takeover for r in records if r["lease_generation"] == 1)
    rows = read_output(spec)
    assert collections.Counter(r["id"] for r in rows) == collections.Counter(t["id"] for t in texts(ROWS))
    assert comparable(rows) == comparable(read_output(reference))
